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

/* Per output row, two passes over L1-resident data:
   1. vertical: the (up to kh) input rows of the window are combined element-wise into a row buffer tp, at
      offset pl, with init values (-inf / 0) in the left and right padding, so that
   2. horizontal: y[ow] = combine over j of tp[ow*sw + j*dw] needs no bounds checks. For the common windows
      (3x3/2, 2x2/2, 3x3/1, 5x5/1 ...) K and S are literals, so the taps unroll and the stride-2 loads become
      vector permutes; other windows go tap by tap.
   Measured on Zen 4, one thread, squeezenet's 3x3/2 max pool on 64x111x111: 0.71 ms before (a separate pass
   per tap over the output row with a runtime stride, and the row buffer re-initialised per row) and ~0.1 ms
   after (see the commit message for the figures). */

#define POOL_MAX(acc, v) acc = max_nan(acc, (v))
#define POOL_ADD(acc, v) acc += (v)

INFERD_INLINE void hmax_k(float* restrict yr, const float* restrict tp, ptrdiff_t OW, const int K, const int S)
{
    for (ptrdiff_t ow = 0; ow < OW; ++ow) {
        float a = tp[ow * S];
        for (int j = 1; j < K; ++j) a = max_nan(a, tp[ow * S + j]);
        yr[ow] = a;
    }
}

INFERD_INLINE void hsum_k(float* restrict yr, const float* restrict tp, const float* restrict ic, ptrdiff_t OW,
                          const int K, const int S)
{
    for (ptrdiff_t ow = 0; ow < OW; ++ow) {
        float a = tp[ow * S];
        for (int j = 1; j < K; ++j) a += tp[ow * S + j];
        yr[ow] = a * ic[ow];
    }
}

/* Any window along the row: tap by tap (the first tap writes, the others combine). */
INFERD_INLINE void hpass_any(float* restrict yr, const float* restrict tp, const float* restrict ic, ptrdiff_t OW,
                             int kw, ptrdiff_t sw, ptrdiff_t dw, int is_max)
{
    for (ptrdiff_t ow = 0; ow < OW; ++ow) yr[ow] = tp[ow * sw];
    for (int j = 1; j < kw; ++j) {
        const float* restrict t = tp + (ptrdiff_t)j * dw;
        if (is_max)
            for (ptrdiff_t ow = 0; ow < OW; ++ow) POOL_MAX(yr[ow], t[ow * sw]);
        else
            for (ptrdiff_t ow = 0; ow < OW; ++ow) POOL_ADD(yr[ow], t[ow * sw]);
    }
    if (!is_max)
        for (ptrdiff_t ow = 0; ow < OW; ++ow) yr[ow] *= ic[ow];
}

/* d[w] = combine of the n rows r[0..n) (n >= 1), in passes of up to three rows. */
INFERD_INLINE void vpass(float* restrict d, const float* const* r, int n, ptrdiff_t W, int is_max)
{
    const float* restrict a = r[0];
    if (n == 1) {
        memcpy(d, a, sizeof(float) * (size_t)W);
        return;
    }
    const float* restrict b = r[1];
    int k = 2;
    if (n >= 3) {
        const float* restrict c = r[2];
        if (is_max)
            for (ptrdiff_t w = 0; w < W; ++w) d[w] = max_nan(max_nan(a[w], b[w]), c[w]);
        else
            for (ptrdiff_t w = 0; w < W; ++w) d[w] = (a[w] + b[w]) + c[w];
        k = 3;
    } else if (is_max) {
        for (ptrdiff_t w = 0; w < W; ++w) d[w] = max_nan(a[w], b[w]);
    } else {
        for (ptrdiff_t w = 0; w < W; ++w) d[w] = a[w] + b[w];
    }
    for (; k + 2 <= n; k += 2) {
        const float* restrict p = r[k];
        const float* restrict q = r[k + 1];
        if (is_max)
            for (ptrdiff_t w = 0; w < W; ++w) d[w] = max_nan(max_nan(d[w], p[w]), q[w]);
        else
            for (ptrdiff_t w = 0; w < W; ++w) d[w] = (d[w] + p[w]) + q[w];
    }
    if (k < n) {
        const float* restrict p = r[k];
        if (is_max)
            for (ptrdiff_t w = 0; w < W; ++w) d[w] = max_nan(d[w], p[w]);
        else
            for (ptrdiff_t w = 0; w < W; ++w) d[w] += p[w];
    }
}

/* d[w] = combine(d[w], rows r[0..n)): the fold for windows of more than 64 rows (d is none of the rows). */
static void vacc(float* restrict d, const float* const* r, int n, ptrdiff_t W, int is_max)
{
    for (int k = 0; k < n; ++k) {
        const float* restrict p = r[k];
        if (is_max)
            for (ptrdiff_t w = 0; w < W; ++w) d[w] = max_nan(d[w], p[w]);
        else
            for (ptrdiff_t w = 0; w < W; ++w) d[w] += p[w];
    }
}

/* K x K max pool (K = 2r + 1), stride 1, padding r on every side, on one small plane (inception's 3x3 branch pools on
   14x14 and 7x7, YOLO's SPPF 5x5 on 20x20): per output row the passes below cost more in set-up than in work
   (832x14x14: 0.23 ms on one Zen 4 core), so the plane goes as two flat passes: horizontal maxima over the plane
   between r guard values (a column mask keeps taps in their row), then vertical maxima over those between r
   guard rows. Plain max where the plane holds no NaN (checked in the copy: max_nan's extra compare and blend
   doubled the time), max_nan where it does. One core, 832x14x14: 0.23 ms -> 0.05 ms. */
#define MP_FLAT_PASSES(MAXF)                                                        \
    do {                                                                            \
        for (ptrdiff_t i = 0; i < n; ++i) {                                         \
            const float* restrict c = xb + r + i;                                   \
            float a = c[0];                                                         \
            for (int d = 1; d <= r; ++d) {                                          \
                const float lv = c[-d], rv = c[d];                                  \
                const float l = col[i] >= d ? lv : -INFINITY;                       \
                const float rr = col[i] < W - d ? rv : -INFINITY;                   \
                a = MAXF(MAXF(a, l), rr);                                           \
            }                                                                       \
            h[i] = a;                                                               \
        }                                                                           \
        for (ptrdiff_t i = 0; i < n; ++i) {                                         \
            float a = h[i];                                                         \
            for (int d = 1; d <= r; ++d) a = MAXF(MAXF(a, h[i - d * W]), h[i + d * W]); \
            yp[i] = a;                                                              \
        }                                                                           \
    } while (0)
#define MP_PLAIN_MAX(a, b) ((b) > (a) ? (b) : (a))

/* xb: n + 2r floats, hb: n + 2rW floats, both -inf outside the parts written here; col[i] = i % W */
INFERD_INLINE void mp_same_flat(const float* restrict plane, float* restrict yp, float* restrict xb,
                                float* restrict hb, const int* restrict col, ptrdiff_t H, ptrdiff_t W, const int r)
{
    const ptrdiff_t n = H * W;
    int nan_ = 0;
    for (ptrdiff_t i = 0; i < n; ++i) {
        const float v = plane[i];
        xb[r + i] = v;
        nan_ |= v != v;
    }
    float* restrict h = hb + (ptrdiff_t)r * W;
    if (nan_)
        MP_FLAT_PASSES(max_nan);
    else
        MP_FLAT_PASSES(MP_PLAIN_MAX);
}

/* whether a pool takes mp_same_flat: its window, stride, padding and plane (at most 4096 values, rows up to 64) */
static int mp_flat_applies(int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int OH,
                           int OW, int is_max)
{
    return is_max && kh == kw && (kh == 3 || kh == 5) && sh == 1 && sw == 1 && dh == 1 && dw == 1 && pt == kh / 2 &&
           pl == kw / 2 && OH == H && OW == W && W <= 64 && (long long)H * W <= 4096;
}

INFERD_CLONES
static int mp_flat_planes(const float* x, float* y, int p0, int p1, int H, int W, int K)
{
    const int r = K / 2;
    const ptrdiff_t n = (ptrdiff_t)H * W;
    float* xb = (float*)malloc(sizeof(float) * (size_t)(n + 2 * r + n + 2 * (ptrdiff_t)r * W) + sizeof(int) * (size_t)n);
    if (!xb) return -1;
    float* hb = xb + n + 2 * r;
    int* col = (int*)(hb + n + 2 * (ptrdiff_t)r * W);
    for (int i = 0; i < r; ++i) xb[i] = xb[r + n + i] = -INFINITY;
    for (ptrdiff_t i = 0; i < (ptrdiff_t)r * W; ++i) hb[i] = hb[(ptrdiff_t)r * W + n + i] = -INFINITY;
    for (ptrdiff_t i = 0; i < n; ++i) col[i] = (int)(i % W);
    for (int p = p0; p < p1; ++p) {
        if (K == 3)
            mp_same_flat(x + (size_t)p * n, y + (size_t)p * n, xb, hb, col, H, W, 1);
        else
            mp_same_flat(x + (size_t)p * n, y + (size_t)p * n, xb, hb, col, H, W, 2);
    }
    free(xb);
    return 0;
}

#define POOL_HK(K, S)                                                  \
    do {                                                               \
        if (is_max)                                                    \
            hmax_k(yr, tp, OWi, K, S);                                 \
        else                                                           \
            hsum_k(yr, tp, inv_count + (size_t)oh * OW, OWi, K, S);    \
    } while (0)

INFERD_CLONES
static int pool_planes(const float* x, float* y, int planes, int p0, int p1, int H, int W, int kh, int kw, int sh, int sw, int dh,
                       int dw, int pt, int pl, int OH, int OW, int is_max, const float* inv_count)
{
    if (mp_flat_applies(H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, is_max))
        return mp_flat_planes(x, y, p0, p1, H, W, kh);
    /* the padded row: pl init values, the W combined input values, init values up to the last tap's column */
    const ptrdiff_t need = (ptrdiff_t)(OW - 1) * sw + (ptrdiff_t)(kw - 1) * dw + 1;
    const ptrdiff_t len = need > (ptrdiff_t)pl + W ? need : (ptrdiff_t)pl + W;
    const ptrdiff_t Wv = ((ptrdiff_t)W + 15) & ~(ptrdiff_t)15;
    const float* x_end = x + (size_t)planes * H * W;
    const ptrdiff_t blen = len + 16; /* the last vertical block may run 15 floats past the row */
    float stackbuf[2048 + 16] __attribute__((aligned(64)));
    float* tp = blen <= 2048 + 16 ? stackbuf : (float*)malloc(sizeof(float) * (size_t)blen);
    if (!tp) return -1;
    const float init = is_max ? -INFINITY : 0.0f;
    for (ptrdiff_t w = 0; w < blen; ++w) tp[w] = init; /* the padding columns are written only as said below */
    const int lit = dw == 1 ? (kw * 10 + sw) : 0;     /* a (K, S) with a literal path */
    /* outputs whose whole window lies left of column pl + W of the row buffer */
    int OWi = (pl + W - 1 - (kw - 1) * dw) < 0 ? 0 : (pl + W - 1 - (kw - 1) * dw) / sw + 1;
    if (OWi > OW) OWi = OW;
    const float* rows[64];
    const int maxr = kh < 64 ? kh : 64;
    for (int p = p0; p < p1; ++p) {
        const float* plane = x + (size_t)p * H * W;
        for (int oh = 0; oh < OH; ++oh) {
            float* restrict yr = y + ((size_t)p * OH + oh) * OW;
            int n = 0;
            for (int i = 0; i < kh; ++i) {
                const int ih = oh * sh - pt + i * dh;
                if (ih < 0 || ih >= H) continue;
                if (n == maxr) { /* more than 64 rows in a window: fold what is gathered, keep it as row 0 */
                    if (rows[0] == tp + pl)
                        vacc(tp + pl, rows + 1, n - 1, W, is_max);
                    else
                        vpass(tp + pl, rows, n, W, is_max);
                    rows[0] = tp + pl;
                    n = 1;
                }
                rows[n++] = plane + (size_t)ih * W;
            }
            if (n == 0) {
                for (int w = 0; w < W; ++w) tp[pl + w] = init;
            } else if (rows[0] == tp + pl) {
                vacc(tp + pl, rows + 1, n - 1, W, is_max);
            } else {
                /* Whole 16-float blocks where the rows may be read that far (all but the tensor's last row or
                   so): a scalar tail of up to 15 stores per row, read right back by the horizontal pass's
                   vector loads, stalls store forwarding (W = 110 or 111: 0.40 ms where W = 112 took 0.14 ms
                   for squeezenet's first max pool). Columns from pl + W on are junk: the
                   windows that reach them are the last few, done apart below. */
                ptrdiff_t wv = W;
                if (rows[n - 1] + Wv <= x_end) wv = Wv;
                vpass(tp + pl, rows, n, wv, is_max);
            }
            switch (lit) {
            case 32: POOL_HK(3, 2); break;
            case 22: POOL_HK(2, 2); break;
            case 31: POOL_HK(3, 1); break;
            case 21: POOL_HK(2, 1); break;
            case 51: POOL_HK(5, 1); break;
            case 33: POOL_HK(3, 3); break;
            case 11: POOL_HK(1, 1); break;
            default: hpass_any(yr, tp, is_max ? NULL : inv_count + (size_t)oh * OW, OWi, kw, sw, dw, is_max); break;
            }
            /* the windows that reach the right padding: taps there are skipped (the identity of the combine) */
            for (int ow = OWi; ow < OW; ++ow) {
                float a = init;
                for (int j = 0; j < kw; ++j) {
                    const ptrdiff_t q = (ptrdiff_t)ow * sw + (ptrdiff_t)j * dw;
                    if (q >= (ptrdiff_t)pl + W) break;
                    if (is_max)
                        POOL_MAX(a, tp[q]);
                    else
                        POOL_ADD(a, tp[q]);
                }
                yr[ow] = is_max ? a : a * inv_count[(size_t)oh * OW + ow];
            }
        }
    }
    if (tp != stackbuf) free(tp);
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
    if (hi > lo && pool_planes(j->x, j->y, j->planes, lo, hi, j->H, j->W, j->kh, j->kw, j->sh, j->sw, j->dh, j->dw, j->pt, j->pl,
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
