/* Nearest-neighbour upsampling by integer factors of the last two axes (Resize/Upsample, mode nearest, where the
 * index table is exactly i // f: the YOLO/FPN/U-Net 2x case). Each input row becomes one output row with every
 * element repeated fw times, then that row is copied fh - 1 times; split by rows over the pool.
 *
 * Why native: numpy did it as fh * fw strided assignments whose inner loop steps over fw (= 2) elements at a time
 * (with the kernel's per-run plan: 0.21 ms for unet_small's 128@16x16 -> 32x32, onnxruntime 0.03 ms).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

typedef struct {
    const uint8_t* x;
    uint8_t* y;
    long long rows; /* input rows: planes x H */
    int W, fh, fw, esize;
    long long chunk;
} up_job;

/* one input row repeated along it: out[i * fw + j] = in[i] (elements of esize bytes) */
INFERD_CLONES static void up_row(const uint8_t* restrict in, uint8_t* restrict out, int W, int fw, int esize)
{
    if (esize == 4 && fw == 2) {
        const uint32_t* restrict s = (const uint32_t*)(const void*)in;
        uint64_t* restrict d = (uint64_t*)(void*)out;
        for (int i = 0; i < W; ++i) d[i] = (uint64_t)s[i] * 0x100000001ULL;
    } else if (esize == 4) {
        const uint32_t* restrict s = (const uint32_t*)(const void*)in;
        uint32_t* restrict d = (uint32_t*)(void*)out;
        for (int i = 0; i < W; ++i)
            for (int j = 0; j < fw; ++j) d[(size_t)i * fw + j] = s[i];
    } else if (esize == 1 && fw == 2) {
        uint16_t* restrict d = (uint16_t*)(void*)out;
        for (int i = 0; i < W; ++i) d[i] = (uint16_t)(in[i] * 0x101u);
    } else {
        for (int i = 0; i < W; ++i)
            for (int j = 0; j < fw; ++j) memcpy(out + ((size_t)i * fw + j) * esize, in + (size_t)i * esize, (size_t)esize);
    }
}

static void up_task(void* p, long long t)
{
    const up_job* j = (const up_job*)p;
    const long long r0 = t * j->chunk, r1 = r0 + j->chunk < j->rows ? r0 + j->chunk : j->rows;
    const size_t in_row = (size_t)j->W * j->esize, out_row = in_row * j->fw;
    for (long long r = r0; r < r1; ++r) {
        uint8_t* o = j->y + (size_t)r * j->fh * out_row;
        up_row(j->x + (size_t)r * in_row, o, j->W, j->fw, j->esize);
        for (int k = 1; k < j->fh; ++k) memcpy(o + (size_t)k * out_row, o, out_row);
    }
}

int inferd_upsample_nearest(const void* x, void* y, long long planes, int H, int W, int fh, int fw, int esize)
{
    if (planes <= 0 || H <= 0 || W <= 0) return 0;
    if (fh < 1 || fw < 1 || (esize != 1 && esize != 2 && esize != 4 && esize != 8)) return -2;
    up_job j = {(const uint8_t*)x, (uint8_t*)y, planes * H, W, fh, fw, esize, 0};
    const double bytes = (double)planes * H * W * esize * fh * fw;
    const long long tasks = bytes < 65536.0 ? 1 : inferd_pool_chunks(j.rows, bytes);
    j.chunk = (j.rows + tasks - 1) / tasks;
    inferd_parallel(up_task, &j, (j.rows + j.chunk - 1) / j.chunk, 0);
    return 0;
}

/* Linear resize of the last two axes (Resize mode linear, any coordinate transformation: the caller's tables say
 * where each output row and column reads and with what weights). Per output row, the two input rows are blended
 * into one row of W, then each output column blends two of it: H first, then W, as the numpy kernel sums (the
 * FMA may round differently). numpy ran it as per-axis gathers and a per-call plan: DeepLabV3's 21@4x4 -> 64x64
 * 0.32 ms, its 256@1x1 -> 4x4 0.21 ms (onnxruntime 0.035 and 0.009). */
typedef struct {
    const float* x;
    float* y;
    long long planes;
    int H, W, OH, OW;
    const int *ylo, *yhi, *xlo, *xhi;
    const float *wylo, *wyhi, *wxlo, *wxhi;
    long long chunk; /* output rows (of all planes) per task */
} lin_job;

INFERD_CLONES static void lin_task(void* p, long long t)
{
    const lin_job* j = (const lin_job*)p;
    const long long rows = j->planes * j->OH, r0 = t * j->chunk, r1 = r0 + j->chunk < rows ? r0 + j->chunk : rows;
    float stack[1024];
    float* tmp = j->W <= 1024 ? stack : (float*)malloc(sizeof(float) * (size_t)j->W);
    if (!tmp) return; /* (the caller checked W against its own scratch) */
    for (long long r = r0; r < r1; ++r) {
        const long long plane = r / j->OH;
        const int oy = (int)(r % j->OH);
        const float* a = j->x + (plane * j->H + j->ylo[oy]) * j->W;
        const float* b = j->x + (plane * j->H + j->yhi[oy]) * j->W;
        const float wa = j->wylo[oy], wb = j->wyhi[oy];
        for (int i = 0; i < j->W; ++i) tmp[i] = a[i] * wa + b[i] * wb;
        float* o = j->y + r * j->OW;
        for (int i = 0; i < j->OW; ++i) o[i] = tmp[j->xlo[i]] * j->wxlo[i] + tmp[j->xhi[i]] * j->wxhi[i];
    }
    if (tmp != stack) free(tmp);
}

int inferd_resize_linear2d(const float* x, float* y, long long planes, int H, int W, int OH, int OW, const int* ylo,
                           const int* yhi, const float* wylo, const float* wyhi, const int* xlo, const int* xhi,
                           const float* wxlo, const float* wxhi)
{
    if (planes <= 0 || OH <= 0 || OW <= 0) return 0;
    if (H < 1 || W < 1) return -2;
    for (int i = 0; i < OH; ++i)
        if (ylo[i] < 0 || ylo[i] >= H || yhi[i] < 0 || yhi[i] >= H) return -2;
    for (int i = 0; i < OW; ++i)
        if (xlo[i] < 0 || xlo[i] >= W || xhi[i] < 0 || xhi[i] >= W) return -2;
    lin_job j = {x, y, planes, H, W, OH, OW, ylo, yhi, xlo, xhi, wylo, wyhi, wxlo, wxhi, 0};
    const long long rows = planes * OH;
    const double work = (double)rows * (2.0 * W + 4.0 * OW);
    const long long tasks = work < 32768.0 ? 1 : inferd_pool_chunks(rows, work);
    j.chunk = (rows + tasks - 1) / tasks;
    inferd_parallel(lin_task, &j, (rows + j.chunk - 1) / j.chunk, 0);
    return 0;
}
