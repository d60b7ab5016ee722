/* Convolution (group 1, any kernel, stride, dilation, padding) as im2col + GEMM done band by band of output rows.
 *
 * Why: the plain im2col kernel writes the whole column matrix (K x OH*OW floats: 1.35 MB for mobilenetv2's 3x3/2
 * stem, 7.4 MB for resnet18's 7x7/2 one) and the GEMM then reads it back from memory, its long rows costing a TLB
 * miss per k. Here each task builds the columns of a few output rows (~256 KB, so they stay in L2) and multiplies
 * them at once on one thread (inferd_gemm inline); the tasks run on the pool. The GEMM is gemm.c's, so its
 * micro-kernels serve both forms.
 */
#define _POSIX_C_SOURCE 200112L
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

static int tl_imin(int a, int b) { return a < b ? a : b; }
static int tl_imax(int a, int b) { return a > b ? a : b; }
static int tl_floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static int tl_ceil_div(int a, int b) { return -tl_floor_div(-a, b); }

/* Columns ow in [lo, hi) of OW with 0 <= ow*s + off < limit. */
static void tl_range(int off, int s, int limit, int n, int* lo, int* hi)
{
    int a = tl_imax(0, tl_ceil_div(-off, s));
    int b = tl_imin(n, tl_floor_div(limit - 1 - off, s) + 1);
    if (b < a) b = a;
    if (a > n) a = b = n;
    *lo = a;
    *hi = b;
}

/* col[r][(oh - oh0)*OW + ow] for rows r = (c*kh + i)*kw + j of the column matrix, output rows oh0..oh1. */
INFERD_CLONES
static void im2col_band(const float* x, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt,
                        int pl, int OW, int oh0, int oh1, float* col)
{
    const ptrdiff_t nb = (ptrdiff_t)(oh1 - oh0) * OW;
    for (int c = 0; c < C; ++c) {
        const float* plane = x + (size_t)c * H * W;
        for (int i = 0; i < kh; ++i) {
            for (int j = 0; j < kw; ++j) {
                float* dst = col + (ptrdiff_t)((c * kh + i) * kw + j) * nb;
                const int off = j * dw - pl;
                int lo, hi;
                tl_range(off, sw, W, OW, &lo, &hi);
                for (int oh = oh0; oh < oh1; ++oh) {
                    float* restrict d = dst + (ptrdiff_t)(oh - oh0) * OW;
                    const int ih = oh * sh - pt + i * dh;
                    if (ih < 0 || ih >= H || lo >= hi) {
                        memset(d, 0, sizeof(float) * (size_t)OW);
                        continue;
                    }
                    const float* restrict row = plane + (size_t)ih * W + off;
                    if (lo > 0) memset(d, 0, sizeof(float) * (size_t)lo);
                    if (sw == 1) {
                        memcpy(d + lo, row + lo, sizeof(float) * (size_t)(hi - lo));
                    } else if (sw == 2) {
                        for (ptrdiff_t ow = lo; ow < hi; ++ow) d[ow] = row[2 * ow];
                    } else {
                        for (ptrdiff_t ow = lo; ow < hi; ++ow) d[ow] = row[ow * sw];
                    }
                    if (hi < OW) memset(d + hi, 0, sizeof(float) * (size_t)(OW - hi));
                }
            }
        }
    }
}

typedef struct {
    const float* x;
    int C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW;
    const float* ap;
    int M;
    const float *bias, *res;
    float* y;
    int act;
    float p0, p1;
    float* col;
    int band;  /* output rows per task */
    int slots; /* column slices in col: at most one task per pool thread runs at a time */
    unsigned long long busy;
    int failed;
} tile_job;

static void tile_task(void* p, long long t)
{
    tile_job* j = (tile_job*)p;
    const int oh0 = (int)t * j->band, oh1 = tl_imin(j->OH, oh0 + j->band);
    if (oh0 >= oh1) return;
    const int K = j->C * j->kh * j->kw, N = (oh1 - oh0) * j->OW;
    const size_t slice = (size_t)K * j->band * j->OW;
    /* a free slice of the workspace; none free: a private one */
    const int slot = inferd_slot_claim(&j->busy, j->slots);
    float* col = slot >= 0 ? j->col + (size_t)slot * slice : (float*)malloc(sizeof(float) * slice);
    if (!col) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    im2col_band(j->x, j->C, j->H, j->W, j->kh, j->kw, j->sh, j->sw, j->dh, j->dw, j->pt, j->pl, j->OW, oh0, oh1, col);
    const long long plane = (long long)j->OH * j->OW, first = (long long)oh0 * j->OW;
    if (inferd_gemm(j->ap, 0, j->M, K, N, 1, col, N, 1, 0, j->y + first, plane, 1, 0, j->bias, 0,
                    j->res ? j->res + first : NULL, 0, j->act, j->p0, j->p1, 1) != 0)
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    if (slot >= 0)
        inferd_slot_release(&j->busy, slot);
    else
        free(col);
}

int inferd_conv_tiled_band(int C, int kh, int kw, int OH, int OW)
{
    /* ~64k floats (256 KB) of columns per task, in L2 (1 MB on Zen 4). Measured one thread, resnet18's 7x7/2 stem:
       2.57 ms at 256 KB, 3.10 at 64 KB (a GEMM of 112 columns per call), 2.83 at 2 MB, 3.41 unbanded */
    const long long per_row = (long long)C * kh * kw * OW;
    int band = per_row > 0 ? (int)(65536 / per_row) : 1;
    if (band < 1) band = 1;
    /* at least a few tasks per pool thread, so an idle thread can take over a slow one's share */
    const int t = inferd_pool_threads();
    const int most = (OH + 4 * t - 1) / (4 * t);
    if (t > 1 && band > most) band = most > 0 ? most : 1;
    if (band > OH) band = OH > 0 ? OH : 1;
    return band;
}

long long inferd_conv_tiled_workspace(int C, int kh, int kw, int OW, int band, int slots)
{
    return (long long)slots * band * C * kh * kw * OW;
}

int inferd_conv_tiled(const float* x, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt,
                      int pl, int OH, int OW, const float* ap, int M, const float* bias, const float* res, float* y,
                      int act, float p0, float p1, float* col, int band, int slots)
{
    if (OH <= 0 || OW <= 0 || M <= 0) return 0;
    if (band < 1) band = 1;
    if (slots > 64) slots = 64;
    if (slots < 0) slots = 0;
    tile_job j = {x, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, ap, M, bias, res, y, act, p0, p1, col, band,
                  slots, 0, 0};
    inferd_parallel(tile_task, &j, (OH + band - 1) / band, 0);
    return j.failed ? -1 : 0;
}
