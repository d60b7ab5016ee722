/* GridSample, 2-D, bilinear and nearest, zeros / border / reflection padding, as onnxruntime samples.
 *
 * Why native: optical flow (RAFT) and spatial transformers warp whole feature maps every iteration; numpy
 * gathers every tap in float64. Here each output pixel's four taps (clamped or reflected index, weight, zero
 * for a tap outside the image in zeros mode) are computed once per image and applied to every channel.
 */
#include <math.h>
#include <stdlib.h>

#include "inferd_internal.h"
#include "inferd_native.h"

/* the taps of P pixels, structure of arrays (p[k][q], w[k][q]) so that the channel loop vectorises (gathers) */
typedef struct { int* p[4]; float* w[4]; } gs_taps;

/* onnxruntime's GsReflect: fold x into [lo, hi] by reflecting at the nearer border, repeatedly */
static float gs_reflect(float x, float lo, float hi)
{
    const float range = hi - lo;
    if (x < lo) {
        const float dx = lo - x;
        const int n = (int)(dx / range);
        const float r = dx - n * range;
        return n % 2 == 0 ? lo + r : hi - r;
    }
    if (x > hi) {
        const float dx = x - hi;
        const int n = (int)(dx / range);
        const float r = dx - n * range;
        return n % 2 == 0 ? hi - r : lo + r;
    }
    return x;
}

/* a tap index along one axis of length L; -1 for a tap outside in zeros mode */
static inline long long gs_index(long long i, long long L, int pad, float lo, float hi)
{
    if (pad == 0) return i >= 0 && i < L ? i : -1;
    if (pad == 2) {
        if (L <= 1) return 0;
        i = (long long)gs_reflect((float)i, lo, hi);
    }
    return i < 0 ? 0 : (i >= L ? L - 1 : i);
}

typedef struct {
    const float* x; const float* grid; float* y; gs_taps taps;
    long long C, H, W, P, cblock, nblocks;
    int nearest, pad, align;
} gs_job;

/* task = one image's output pixels [row range): their taps */
static void gs_taps_task(void* p, long long t)
{
    const gs_job* j = (const gs_job*)p;
    const long long H = j->H, W = j->W;
    const float xlo = j->align ? 0.0f : -0.5f, xhi = j->align ? (float)(W - 1) : (float)W - 0.5f;
    const float ylo = j->align ? 0.0f : -0.5f, yhi = j->align ? (float)(H - 1) : (float)H - 0.5f;
    const long long per = (j->P + 255) / 256;
    const long long img = t / per, q0 = (t % per) * 256, q1 = q0 + 256 < j->P ? q0 + 256 : j->P;
    for (long long q = q0; q < q1; ++q) {
        const float* g = j->grid + (img * j->P + q) * 2;
        float x, y;
        if (j->align) { x = (g[0] + 1.0f) / 2.0f * (float)(W - 1); y = (g[1] + 1.0f) / 2.0f * (float)(H - 1); }
        else { x = ((g[0] + 1.0f) * (float)W - 1.0f) / 2.0f; y = ((g[1] + 1.0f) * (float)H - 1.0f) / 2.0f; }
        if (j->nearest) { x = nearbyintf(x); y = nearbyintf(y); }
        if (x < xlo || x > xhi || y < ylo || y > yhi) {
            if (j->pad == 1) {
                x = x < 0.0f ? 0.0f : (x > (float)(W - 1) ? (float)(W - 1) : x);
                y = y < 0.0f ? 0.0f : (y > (float)(H - 1) ? (float)(H - 1) : y);
            } else if (j->pad == 2) {
                x = gs_reflect(x, xlo, xhi);
                y = gs_reflect(y, ylo, yhi);
            }
        }
        const long long at = img * j->P + q;
        int* const* tpp = j->taps.p;
        float* const* tpw = j->taps.w;
        if (j->nearest) {
            /* x == x: a NaN coordinate samples nothing */
            long long cx = x == x ? gs_index((long long)x, W, j->pad, xlo, xhi) : -1;
            long long cy = y == y ? gs_index((long long)y, H, j->pad, ylo, yhi) : -1;
            int ok = cx >= 0 && cy >= 0;
            tpp[0][at] = ok ? (int)(cy * W + cx) : 0; tpw[0][at] = ok ? 1.0f : 0.0f;
            for (int k = 1; k < 4; ++k) { tpp[k][at] = 0; tpw[k][at] = 0.0f; }
            continue;
        }
        if (x != x || y != y) { for (int k = 0; k < 4; ++k) { tpp[k][at] = 0; tpw[k][at] = 0.0f; } continue; }
        const float fx = floorf(x), fy = floorf(y);
        const long long x1 = (long long)fx, y1 = (long long)fy;
        const float dx1 = x - fx, dx2 = (fx + 1.0f) - x, dy1 = y - fy, dy2 = (fy + 1.0f) - y;
        const long long cx[2] = {gs_index(x1, W, j->pad, xlo, xhi), gs_index(x1 + 1, W, j->pad, xlo, xhi)};
        const long long cy[2] = {gs_index(y1, H, j->pad, ylo, yhi), gs_index(y1 + 1, H, j->pad, ylo, yhi)};
        const float wx[2] = {dx2, dx1}, wy[2] = {dy2, dy1};
        for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b) {
                const int k = a * 2 + b, ok = cy[a] >= 0 && cx[b] >= 0;
                tpp[k][at] = ok ? (int)(cy[a] * W + cx[b]) : 0;
                tpw[k][at] = ok ? wy[a] * wx[b] : 0.0f;
            }
    }
}

INFERD_CLONES
static void gs_apply(const float* x, const int* restrict p0, const int* restrict p1, const int* restrict p2,
                     const int* restrict p3, const float* restrict w0, const float* restrict w1,
                     const float* restrict w2, const float* restrict w3, float* y, long long c0, long long c1,
                     long long plane, long long P)
{
    for (long long c = c0; c < c1; ++c) {
        const float* restrict xc = x + c * plane;
        float* restrict yc = y + c * P;
        for (long long q = 0; q < P; ++q)
            yc[q] = w0[q] * xc[p0[q]] + w1[q] * xc[p1[q]] + w2[q] * xc[p2[q]] + w3[q] * xc[p3[q]];
    }
}

/* task = (image, channel block) */
static void gs_apply_task(void* p, long long t)
{
    const gs_job* j = (const gs_job*)p;
    const long long img = t / j->nblocks, c0 = (t % j->nblocks) * j->cblock;
    const long long c1 = c0 + j->cblock < j->C ? c0 + j->cblock : j->C;
    const long long o = img * j->P;
    gs_apply(j->x + img * j->C * j->H * j->W, j->taps.p[0] + o, j->taps.p[1] + o, j->taps.p[2] + o, j->taps.p[3] + o,
             j->taps.w[0] + o, j->taps.w[1] + o, j->taps.w[2] + o, j->taps.w[3] + o, j->y + img * j->C * j->P, c0, c1,
             j->H * j->W, j->P);
}

int inferd_grid_sample(const float* x, long long N, long long C, long long H, long long W, const float* grid,
                       long long P, float* y, int nearest, int pad, int align)
{
    if (N <= 0 || C <= 0 || P <= 0) return 0;
    if (H <= 0 || W <= 0 || H * W > 0x7fffffffLL) return -2;
    /* one block: 4 index arrays then 4 weight arrays of N * P */
    void* block = malloc((sizeof(int) + sizeof(float)) * 4 * (size_t)(N * P));
    if (!block) return -1;
    gs_taps taps;
    for (int k = 0; k < 4; ++k) {
        taps.p[k] = (int*)block + (size_t)k * N * P;
        taps.w[k] = (float*)((int*)block + (size_t)4 * N * P) + (size_t)k * N * P;
    }
    const int threads = inferd_pool_threads();
    long long nblocks = 1;
    while (N * nblocks < 4LL * threads && nblocks * 2 <= C) nblocks *= 2;
    const long long cblock = (C + nblocks - 1) / nblocks;
    nblocks = (C + cblock - 1) / cblock;
    gs_job j = {x, grid, y, taps, C, H, W, P, cblock, nblocks, nearest, pad, align};
    const long long ttasks = N * ((P + 255) / 256);
    if (inferd_pool_chunks(ttasks, (double)N * P * 40.0) <= 1)
        for (long long t = 0; t < ttasks; ++t) gs_taps_task(&j, t);
    else
        inferd_parallel(gs_taps_task, &j, ttasks, 0);
    const long long tasks = N * nblocks;
    if (inferd_pool_chunks(tasks, (double)N * C * P * 4.0) <= 1)
        for (long long t = 0; t < tasks; ++t) gs_apply_task(&j, t);
    else
        inferd_parallel(gs_apply_task, &j, tasks, 0);
    free(block);
    return 0;
}
