/* 2-D MaxPool / AveragePool over NCHW planes (any kernel, stride, dilation, padding; ceil_mode comes in
 * through OH/OW), planes split over the native pool.
 *
 * Why native: the numpy separable passes cost ~0.9 ms for resnet18's 3x3/2 max pool on 64x112x112 (onnxruntime
 * takes 0.1 ms). Here each output row is built from whole input rows: for every tap, one contiguous (or
 * stride-2) run of the row combined into the output row, which vectorises.
 */
#define _POSIX_C_SOURCE 200112L
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

static int lo_out(int off, int s) { return off >= 0 ? 0 : (-off + s - 1) / s; } /* first ow with ow*s + off >= 0 */

/* Horizontal pass of one output row from the combined input row t (W floats). */
#define POOL_HPASS(COMBINE)                                                            \
    for (int j = 0; j < kw; ++j) {                                                     \
        const int off = j * dw - pl;                                                   \
        if (W - 1 - off < 0) continue;                                                 \
        const int lo = lo_out(off, sw);                                                \
        int hi = (W - 1 - off) / sw + 1;                                               \
        if (hi > OW) hi = OW;                                                          \
        if (sw == 1) {                                                                 \
            for (int ow = lo; ow < hi; ++ow) COMBINE(yr[ow], t[ow + off]);             \
        } else if (sw == 2) {                                                          \
            for (int ow = lo; ow < hi; ++ow) COMBINE(yr[ow], t[2 * ow + off]);         \
        } else {                                                                       \
            for (int ow = lo; ow < hi; ++ow) COMBINE(yr[ow], t[ow * sw + off]);        \
        }                                                                              \
    }

#define POOL_MAX(acc, v) acc = max_nan(acc, (v))
#define POOL_ADD(acc, v) acc += (v)

/* The window is a box, so each output row is separable: first the kh input rows are combined element-wise
   (contiguous, full-width vectors), then the kw taps along that one row. */
INFERD_CLONES
static int pool_planes(const float* x, float* y, int p0, int p1, int H, int W, int kh, int kw, int sh, int sw, int dh,
                       int dw, int pt, int pl, int OH, int OW, int is_max, const float* inv_count)
{
    float* t = (float*)malloc(sizeof(float) * (size_t)(W > 0 ? W : 1));
    if (!t) return -1;
    const float init = is_max ? -INFINITY : 0.0f;
    for (int p = p0; p < p1; ++p) {
        const float* plane = x + (size_t)p * H * W;
        for (int oh = 0; oh < OH; ++oh) {
            float* restrict yr = y + ((size_t)p * OH + oh) * OW;
            for (int w = 0; w < W; ++w) t[w] = init;
            for (int i = 0; i < kh; ++i) {
                const int ih = oh * sh - pt + i * dh;
                if (ih < 0 || ih >= H) continue;
                const float* restrict row = plane + (size_t)ih * W;
                if (is_max)
                    for (int w = 0; w < W; ++w) POOL_MAX(t[w], row[w]);
                else
                    for (int w = 0; w < W; ++w) t[w] += row[w];
            }
            for (int ow = 0; ow < OW; ++ow) yr[ow] = init;
            if (is_max) {
                POOL_HPASS(POOL_MAX)
            } else {
                POOL_HPASS(POOL_ADD)
                const float* restrict ic = inv_count + (size_t)oh * OW;
                for (int ow = 0; ow < OW; ++ow) yr[ow] *= ic[ow];
            }
        }
    }
    free(t);
    return 0;
}

typedef struct {
    const float* x;
    float* y;
    int planes, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, is_max;
    const float* inv_count;
    int n, failed;
} pool_job;

static void pool_task(void* p, long long t)
{
    pool_job* j = (pool_job*)p;
    const int lo = (int)((long long)j->planes * t / j->n), hi = (int)((long long)j->planes * (t + 1) / j->n);
    if (hi > lo && pool_planes(j->x, j->y, lo, hi, j->H, j->W, j->kh, j->kw, j->sh, j->sw, j->dh, j->dw, j->pt, j->pl,
                               j->OH, j->OW, j->is_max, j->inv_count) != 0)
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
}

int inferd_pool2d(const float* x, float* y, int planes, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw,
                  int pt, int pl, int OH, int OW, int is_max, const float* inv_count)
{
    pool_job j = {x, y, planes, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, is_max, inv_count, 1, 0};
    j.n = inferd_pool_chunks(planes, (double)planes * OH * OW * kh * kw);
    inferd_parallel(pool_task, &j, j.n, 0);
    return j.failed ? -1 : 0;
}
