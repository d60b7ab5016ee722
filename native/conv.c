/* Convolution helpers for inferd's CPU backend: im2col/col2im, depthwise conv, Winograd transforms, epilogue.
 *
 * Plain C99 loops written so that GCC/Clang auto-vectorise the innermost loop (contiguous, no branches).
 * The package build compiles for the baseline ISA (SSE2 on x86-64, NEON on aarch64). On x86-64 Linux with
 * glibc, the hot functions are also cloned for AVX2+FMA (and AVX-512) via target_clones; the loader picks
 * the best clone for the CPU at run time, so the extension still runs on any x86-64.
 */
#define _POSIX_C_SOURCE 200112L /* posix_memalign under -std=c99 */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_native.h"

#include "inferd_internal.h"

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

/* floor(a / b) for b > 0 and any sign of a (C division truncates toward zero). */
static int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static int ceil_div(int a, int b) { return -floor_div(-a, b); }

/* Output positions o in [0, n) with 0 <= o*s + off < limit: returned as [*lo, *hi). */
static void valid_range(int off, int s, int limit, int n, int* lo, int* hi)
{
    int a = imax(0, ceil_div(-off, s));
    int b = imin(n, floor_div(limit - 1 - off, s) + 1);
    if (b < a) b = a;
    if (a > n) a = b = n;
    *lo = a;
    *hi = b;
}

INFERD_CLONES
static void im2col_range(const float* x, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw,
                   int pt, int pl, int OH, int OW, float* col, int r0, int r1)
{
    /* rows r0..r1 of the column matrix: row (c*kh + i)*kw + j */
    const size_t ohw = (size_t)OH * OW;
    (void)C;
    for (int r = r0; r < r1; ++r) {
        const int c = r / (kh * kw), i = (r / kw) % kh, j = r % kw;
        const float* plane = x + (size_t)c * H * W;
        {
            {
                float* dst = col + (size_t)r * ohw;
                const int off = j * dw - pl;
                int lo, hi;
                valid_range(off, sw, W, OW, &lo, &hi);
                for (int oh = 0; oh < OH; ++oh) {
                    float* d = dst + (size_t)oh * OW;
                    const int ih = oh * sh - pt + i * dh;
                    if (ih < 0 || ih >= H || lo >= hi) {
                        memset(d, 0, sizeof(float) * (size_t)OW);
                        continue;
                    }
                    const float* row = plane + (size_t)ih * W;
                    if (lo > 0) memset(d, 0, sizeof(float) * (size_t)lo);
                    if (sw == 1) {
                        memcpy(d + lo, row + lo + off, sizeof(float) * (size_t)(hi - lo));
                    } else if (sw == 2) {
                        const float* restrict r2 = row + off;
                        for (ptrdiff_t ow = lo; ow < hi; ++ow) d[ow] = r2[2 * ow];
                    } else {
                        const float* restrict rs = row + off;
                        for (ptrdiff_t ow = lo; ow < hi; ++ow) d[ow] = rs[ow * sw];
                    }
                    if (hi < OW) memset(d + hi, 0, sizeof(float) * (size_t)(OW - hi));
                }
            }
        }
    }
}

INFERD_CLONES
static void col2im_range(const float* col, int c0, int c1, int H, int W, int kh, int kw, int sh, int sw, int dh,
                         int dw, int pt, int pl, int OH, int OW, float* y)
{
    const size_t ohw = (size_t)OH * OW;
    for (int c = c0; c < c1; ++c) {
        float* plane = y + (size_t)c * H * W;
        for (int i = 0; i < kh; ++i) {
            for (int j = 0; j < kw; ++j) {
                const float* src = col + ((size_t)(c * kh + i) * kw + j) * ohw;
                const int off = j * dw - pl;
                int lo, hi;
                valid_range(off, sw, W, OW, &lo, &hi);
                if (lo >= hi) continue;
                for (int oh = 0; oh < OH; ++oh) {
                    const int ih = oh * sh - pt + i * dh;
                    if (ih < 0 || ih >= H) continue;
                    float* restrict row = plane + (size_t)ih * W;
                    const float* restrict s = src + (size_t)oh * OW;
                    if (sw == 1) {
                        for (int ow = lo; ow < hi; ++ow) row[ow + off] += s[ow];
                    } else {
                        for (int ow = lo; ow < hi; ++ow) row[ow * sw + off] += s[ow];
                    }
                }
            }
        }
    }
}

typedef struct {
    const float* col;
    float* y;
    const float* bias;
    int C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, n, init;
} col2im_job;

static void col2im_task(void* p, long long t)
{
    const col2im_job* j = (const col2im_job*)p;
    const int c0 = (int)((long long)j->C * t / j->n), c1 = (int)((long long)j->C * (t + 1) / j->n);
    if (c1 <= c0) return;
    if (j->init) {
        const size_t hw = (size_t)j->H * j->W;
        for (int c = c0; c < c1; ++c) {
            float* restrict plane = j->y + (size_t)c * hw;
            const float v = j->bias ? j->bias[c] : 0.0f;
            for (size_t i = 0; i < hw; ++i) plane[i] = v;
        }
    }
    col2im_range(j->col, c0, c1, j->H, j->W, j->kh, j->kw, j->sh, j->sw, j->dh, j->dw, j->pt, j->pl, j->OH, j->OW,
                 j->y);
}

/* Channels are independent (plane c takes column rows of channel c only): split over the pool. With init, each
   task first sets its planes to the bias (or zero): a ConvTranspose's numpy fill of its output had run on one
   thread before the scatter (0.1-0.18 ms of unet_small's two 2x2/2 up-convolutions). */
void inferd_col2im_ex(const float* col, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw,
                      int pt, int pl, int OH, int OW, float* y, const float* bias, int init)
{
    col2im_job j = {col, y, bias, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, 1, init};
    j.n = inferd_pool_chunks(C, (double)C * kh * kw * OH * OW + (init ? (double)C * H * W : 0.0));
    inferd_parallel(col2im_task, &j, j.n, 0);
}

void inferd_col2im(const float* col, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw,
                   int pt, int pl, int OH, int OW, float* y)
{
    inferd_col2im_ex(col, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, y, NULL, 0);
}

/* ---------------------------------------------------------------- depthwise */

/* Any kernel size: y[ow] = b + sum over taps, tap-outer so each pass is a contiguous (or strided) axpy. */
INFERD_INLINE void dw_row_taps(float* restrict y, const float* restrict plane, const float* restrict w, float b, int oh,
                        int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                        int ow_lo, int ow_hi)
{
    for (int ow = ow_lo; ow < ow_hi; ++ow) y[ow] = b;
    for (int i = 0; i < kh; ++i) {
        const int ih = oh * sh - pt + i * dh;
        if (ih < 0 || ih >= H) continue;
        const float* restrict row = plane + (size_t)ih * W;
        for (int j = 0; j < kw; ++j) {
            const int off = j * dw - pl;
            int lo, hi;
            valid_range(off, sw, W, ow_hi, &lo, &hi);
            lo = imax(lo, ow_lo);
            const float wv = w[i * kw + j];
            if (sw == 1) {
                for (int ow = lo; ow < hi; ++ow) y[ow] += wv * row[ow + off];
            } else if (sw == 2) {
                for (int ow = lo; ow < hi; ++ow) y[ow] += wv * row[2 * ow + off];
            } else {
                for (int ow = lo; ow < hi; ++ow) y[ow] += wv * row[ow * sw + off];
            }
        }
    }
}

/* One output with bounds checks on every tap: for the few border columns of interior rows. */
INFERD_INLINE float dw_point(const float* plane, const float* w, float b, int oh, int ow, int H, int W, int kh, int kw,
                      int sh, int sw, int dh, int dw, int pt, int pl)
{
    float acc = b;
    for (int i = 0; i < kh; ++i) {
        const int ih = oh * sh - pt + i * dh;
        if (ih < 0 || ih >= H) continue;
        const float* row = plane + (size_t)ih * W;
        for (int j = 0; j < kw; ++j) {
            const int iw = ow * sw - pl + j * dw;
            if (iw >= 0 && iw < W) acc += w[i * kw + j] * row[iw];
        }
    }
    return acc;
}

/* Interior of a row for a K x K kernel (K a literal at each call site, so the tap loops unroll fully and the
   output loop vectorises): all taps accumulated in registers, one store per output; SW is a literal too where
   the stride is 1 or 2, so strided loads vectorise. Indices are ptrdiff_t from shifted base pointers: with
   -fwrapv (in Python's CFLAGS) int index arithmetic must wrap, which keeps GCC from treating loads as affine. */
INFERD_INLINE void dw_row_k(float* restrict y, const float* const* rows, const float* restrict w, float b, int o0,
                            int o1, ptrdiff_t SW, ptrdiff_t dw, int pl, const int K)
{
    const float* r[7];
    float wk[49];
    const ptrdiff_t base = (ptrdiff_t)o0 * SW - pl, n = (ptrdiff_t)o1 - o0;
    for (int i = 0; i < K; ++i) r[i] = rows[i] + base;
    for (int t = 0; t < K * K; ++t) wk[t] = w[t];
    float* restrict yo = y + o0;
    for (ptrdiff_t k = 0; k < n; ++k) {
        const ptrdiff_t q = k * SW;
        float acc = b;
        for (int i = 0; i < K; ++i)
            for (int j = 0; j < K; ++j) acc += wk[i * K + j] * r[i][q + j * dw];
        yo[k] = acc;
    }
}

INFERD_INLINE void dw_row_k_strides(float* y, const float* const* rows, const float* w, float b, int o0, int o1,
                                    int sw, int dw, int pl, const int K)
{
    if (sw == 1)
        dw_row_k(y, rows, w, b, o0, o1, 1, dw, pl, K);
    else if (sw == 2)
        dw_row_k(y, rows, w, b, o0, o1, 2, dw, pl, K);
    else
        dw_row_k(y, rows, w, b, o0, o1, sw, dw, pl, K);
}

INFERD_INLINE void dw_rows(const float* x, const float* w, const float* bias, float* y, int C, int mult,
                    int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW,
                    int act, float p0, float p1)
{
    /* Output columns whose taps all fall inside the row, and output rows whose taps all fall inside the plane. */
    int c_lo, c_hi, r_lo, r_hi;
    valid_range(-pl, sw, W - (kw - 1) * dw, OW, &c_lo, &c_hi);
    valid_range(-pt, sh, H - (kh - 1) * dh, OH, &r_lo, &r_hi);
    if (W - (kw - 1) * dw <= 0) c_lo = c_hi = 0;
    if (H - (kh - 1) * dh <= 0) r_lo = r_hi = 0;
    /* kernels with a register-blocked interior path; others go tap by tap */
    const int fast = kh == kw && (kh == 3 || kh == 5 || kh == 7) && c_hi > c_lo;
    for (int co = 0; co < C * mult; ++co) {
        const float* plane = x + (size_t)(co / mult) * H * W;
        const float* wc = w + (size_t)co * kh * kw;
        const float b = bias ? bias[co] : 0.0f;
        float* yc = y + (size_t)co * OH * OW;
        for (int oh = 0; oh < OH; ++oh) {
            float* yr = yc + (size_t)oh * OW;
            if (!fast || oh < r_lo || oh >= r_hi) {
                dw_row_taps(yr, plane, wc, b, oh, H, W, kh, kw, sh, sw, dh, dw, pt, pl, 0, OW);
                continue;
            }
            const float* rows[7];
            for (int i = 0; i < kh; ++i) rows[i] = plane + (size_t)(oh * sh - pt + i * dh) * W;
            if (kh == 3)
                dw_row_k_strides(yr, rows, wc, b, c_lo, c_hi, sw, dw, pl, 3);
            else if (kh == 5)
                dw_row_k_strides(yr, rows, wc, b, c_lo, c_hi, sw, dw, pl, 5);
            else
                dw_row_k_strides(yr, rows, wc, b, c_lo, c_hi, sw, dw, pl, 7);
            for (int ow = 0; ow < c_lo; ++ow) yr[ow] = dw_point(plane, wc, b, oh, ow, H, W, kh, kw, sh, sw, dh, dw, pt, pl);
            for (int ow = c_hi; ow < OW; ++ow) yr[ow] = dw_point(plane, wc, b, oh, ow, H, W, kh, kw, sh, sw, dh, dw, pt, pl);
        }
        /* once per plane: per row, a costly code's loop runs mostly in its scalar tail */
        act_inplace(yc, (ptrdiff_t)OH * OW, act, p0, p1);
    }
}

/* Flat-plane form for sh == sw == S. The zero-padded input plane is split into its S*S stride phases
   (phase (a, b) holds padded rows a, a+S, ... and columns b, b+S, ..., each of pitch Wh), and the output is
   computed on pitch Wh too: output q = oh*Wh + ow reads phase[(i*dh) % S][(j*dw) % S] at
   q + ((i*dh) / S)*Wh + (j*dw) / S for tap (i, j). So every tap is a unit-stride load at a fixed offset from
   one base pointer: one long branch-free, vectorisable loop per channel even for 7x7 planes or stride 2, at the
   price of the few junk columns per row (Wh - OW) that are dropped when rows are copied out. */
INFERD_INLINE void dw_flat_k(float* restrict yq, const float* restrict xb, const float* w, float b, ptrdiff_t n,
                             ptrdiff_t Wh, ptrdiff_t psz, const int K, const int S)
{
    /* K and S are literals here: the tap loops unroll, and each tap's address is a phase base + a row offset
       (a multiple of Wh) + a constant, so GCC keeps one pointer per (phase, tap row) and vectorises over q. */
    float wk[49];
    for (int t = 0; t < K * K; ++t) wk[t] = w[t];
    for (ptrdiff_t q = 0; q < n; ++q) {
        float acc = b;
        for (int i = 0; i < K; ++i)
            for (int j = 0; j < K; ++j)
                acc += wk[i * K + j] * xb[((i % S) * S + (j % S)) * psz + (i / S) * Wh + (j / S) + q];
        yq[q] = acc;
    }
}

INFERD_INLINE void dw_flat_taps(float* restrict yq, const float* restrict xb, const float* w, float b, ptrdiff_t n,
                         ptrdiff_t Wh, ptrdiff_t psz, int kh, int kw, int S)
{
    for (ptrdiff_t q = 0; q < n; ++q) yq[q] = b;
    for (int i = 0; i < kh; ++i) {
        for (int j = 0; j < kw; ++j) {
            const float wv = w[i * kw + j];
            const float* restrict p = xb + ((i % S) * S + (j % S)) * psz + (i / S) * Wh + (j / S);
            for (ptrdiff_t q = 0; q < n; ++q) yq[q] += wv * p[q];
        }
    }
}

/* Requires dilation 1; S is 1 or 2. */
INFERD_INLINE int dw_flat(const float* x, const float* w, const float* bias, float* y, int C, int mult, int H, int W,
                   int kh, int kw, int S, int pt, int pl, int OH, int OW, int act, float p0, float p1)
{
    const int Hh = OH + (kh - 1) / S, Wh = OW + (kw - 1) / S;
    const size_t psz = (size_t)Hh * Wh;
    /* n rounded up to whole 16-float vectors: the tail outputs are junk (dropped when rows are copied out), but
       the loops then have no scalar remainder, which on a 7x7 map (n = 61) was most of the work. The reads
       past the last phase plane land in DW_SLACK zeroed floats. */
    enum { DW_SLACK = 16 };
    const ptrdiff_t n = (((ptrdiff_t)(OH - 1) * Wh + OW) + 15) & ~(ptrdiff_t)15;
    const int T = kh * kw;
    float* xb = (float*)malloc(sizeof(float) * ((size_t)S * S * psz + DW_SLACK + (size_t)n));
    if (!xb) return -1;
    float* yq = xb + (size_t)S * S * psz + DW_SLACK;
    const int k = kh == kw && (kh == 3 || kh == 5 || kh == 7) ? kh : 0;
    /* The padding is the same for every channel: zero the phase planes once, then copy only image pixels. */
    memset(xb, 0, sizeof(float) * ((size_t)S * S * psz + DW_SLACK));
    for (int c = 0; c < C; ++c) {
        const float* plane = x + (size_t)c * H * W;
        for (int a = 0; a < S; ++a) {
            for (int bph = 0; bph < S; ++bph) {
                float* ph = xb + (size_t)(a * S + bph) * psz;
                /* phase column cc holds image column bph + S*cc - pl */
                int lo, hi;
                valid_range(bph - pl, S, W, Wh, &lo, &hi);
                if (hi <= lo) continue;
                const ptrdiff_t c0 = bph - pl;
                for (int rr = 0; rr < Hh; ++rr) {
                    const int ih = a + S * rr - pt;
                    if (ih < 0 || ih >= H) continue;
                    float* restrict d = ph + (size_t)rr * Wh;
                    const float* restrict src = plane + (size_t)ih * W;
                    if (S == 1) {
                        copy_row(d + lo, src + lo + c0, hi - lo);
                    } else {
                        for (ptrdiff_t cc = lo; cc < hi; ++cc) d[cc] = src[2 * cc + c0];
                    }
                }
            }
        }
        for (int mi = 0; mi < mult; ++mi) {
            const int co = c * mult + mi;
            const float* wc = w + (size_t)co * T;
            const float b = bias ? bias[co] : 0.0f;
            if (S == 1 && k == 3)
                dw_flat_k(yq, xb, wc, b, n, Wh, (ptrdiff_t)psz, 3, 1);
            else if (S == 1 && k == 5)
                dw_flat_k(yq, xb, wc, b, n, Wh, (ptrdiff_t)psz, 5, 1);
            else if (S == 1 && k == 7)
                dw_flat_k(yq, xb, wc, b, n, Wh, (ptrdiff_t)psz, 7, 1);
            else if (S == 2 && k == 3)
                dw_flat_k(yq, xb, wc, b, n, Wh, (ptrdiff_t)psz, 3, 2);
            else if (S == 2 && k == 5)
                dw_flat_k(yq, xb, wc, b, n, Wh, (ptrdiff_t)psz, 5, 2);
            else if (S == 2 && k == 7)
                dw_flat_k(yq, xb, wc, b, n, Wh, (ptrdiff_t)psz, 7, 2);
            else
                dw_flat_taps(yq, xb, wc, b, n, Wh, (ptrdiff_t)psz, kh, kw, S);
            act_inplace(yq, n, act, p0, p1);
            float* yc = y + (size_t)co * OH * OW;
            if (Wh == OW) {
                memcpy(yc, yq, sizeof(float) * (size_t)OH * OW);
            } else {
                for (int oh = 0; oh < OH; ++oh) copy_row(yc + (size_t)oh * OW, yq + (size_t)oh * Wh, OW);
            }
        }
    }
    free(xb);
    return 0;
}

/* Channel-blocked form for small maps (mult 1, any kernel, stride, dilation): 16 channels at a time are
   transposed into a zero-padded (Hp, Wp, 16) tile, so each tap is one 16-wide multiply-add over channels, the
   way MLAS (NCHWc) and ncnn (pack4/8) compute depthwise. The per-channel loops above spend most of a 7x7 or
   14x14 plane on setup and short rows; here the transposes cost ~2 moves per value and the arithmetic runs
   at full width. Several outputs along a row are accumulated together to hide the multiply-add latency. */
#define DWB 16

/* dw_blocked's arithmetic over one block's padded tile: OH x OW outputs of 16 lanes, NP pixels of a row at a time
   (NP x 16 / VW accumulators), in the ISA's own vector width (VW floats; a 16-lane pixel is 16 / VW vectors). Not in
   the clones of the callers: a 64-byte vector in a clone without AVX-512 is lowered through the stack (this loop
   ran at 5-13x the layer's roofline on Zen 3). wv: [T][16] weights, bv: [16] bias. */
typedef void (*dwb_rows_fn)(const float* tile, int Wp, float* out, int OH, int OW, int sh, int sw,
                            const ptrdiff_t* off, int T, const float* wv, const float* bv);
#define DWB_ROWS(NAME, ATTR, VT, VTU, VW, NP)                                                                      \
    ATTR static void NAME(const float* tile, int Wp, float* out, int OH, int OW, int sh, int sw,                \
                          const ptrdiff_t* off, int T, const float* wv, const float* bv)                        \
    {                                                                                                            \
        enum { V = DWB / VW };                                                                                   \
        VT b[V];                                                                                                 \
        _Pragma("GCC unroll 4") for (int k = 0; k < V; ++k)                                                      \
        {                                                                                                        \
            VT t;                                                                                                \
            memcpy(&t, bv + k * VW, sizeof(VT));                                                                 \
            b[k] = t;                                                                                            \
        }                                                                                                        \
        const ptrdiff_t s1 = (ptrdiff_t)sw * DWB;                                                                \
        for (int oh = 0; oh < OH; ++oh) {                                                                        \
            const float* rowb = tile + (size_t)oh * sh * Wp * DWB;                                               \
            float* orow = out + (size_t)oh * OW * DWB;                                                           \
            int ow = 0;                                                                                          \
            for (; ow + NP <= OW; ow += NP) {                                                                      \
                const float* b0 = rowb + (size_t)ow * s1;                                                        \
                VT a[NP][V];                                                                                      \
                _Pragma("GCC unroll 4") for (int p = 0; p < NP; ++p)                                              \
                    _Pragma("GCC unroll 4") for (int k = 0; k < V; ++k) a[p][k] = b[k];                          \
                for (int t = 0; t < T; ++t) {                                                                    \
                    const float* q = b0 + off[t];                                                                \
                    _Pragma("GCC unroll 4") for (int k = 0; k < V; ++k)                                          \
                    {                                                                                            \
                        VT wk;                                                                                   \
                        memcpy(&wk, wv + t * DWB + k * VW, sizeof(VT));                                          \
                        _Pragma("GCC unroll 4") for (int p = 0; p < NP; ++p)                                      \
                        {                                                                                        \
                            VT i;                                                                                \
                            memcpy(&i, q + p * s1 + k * VW, sizeof(VT));                                         \
                            a[p][k] += wk * i;                                                                   \
                        }                                                                                        \
                    }                                                                                            \
                }                                                                                                \
                _Pragma("GCC unroll 4") for (int p = 0; p < NP; ++p)                                              \
                    _Pragma("GCC unroll 4") for (int k = 0; k < V; ++k)                                          \
                        *(VTU*)(orow + (size_t)(ow + p) * DWB + k * VW) = a[p][k];                               \
            }                                                                                                    \
            for (; ow < OW; ++ow) {                                                                              \
                const float* b0 = rowb + (size_t)ow * s1;                                                        \
                VT a[V];                                                                                         \
                _Pragma("GCC unroll 4") for (int k = 0; k < V; ++k) a[k] = b[k];                                 \
                for (int t = 0; t < T; ++t)                                                                      \
                    _Pragma("GCC unroll 4") for (int k = 0; k < V; ++k)                                          \
                    {                                                                                            \
                        VT wk, i;                                                                                \
                        memcpy(&wk, wv + t * DWB + k * VW, sizeof(VT));                                          \
                        memcpy(&i, b0 + off[t] + k * VW, sizeof(VT));                                            \
                        a[k] += wk * i;                                                                          \
                    }                                                                                            \
                _Pragma("GCC unroll 4") for (int k = 0; k < V; ++k)                                              \
                    *(VTU*)(orow + (size_t)ow * DWB + k * VW) = a[k];                                            \
            }                                                                                                    \
        }                                                                                                        \
    }

/* the stores through unaligned, aliasing vector pointers (the *u types), not memcpy from the accumulator: on
   aarch64 GCC 12 keeps a variable whose address memcpy takes in memory, reloading and storing every accumulator
   at every tap */
typedef float dwb_v4 __attribute__((vector_size(16)));
typedef float dwb_v4u __attribute__((vector_size(16), aligned(4), may_alias));
#if defined(__x86_64__)
DWB_ROWS(dwb_rows_gen, , dwb_v4, dwb_v4u, 4, 2) /* SSE: 16 xmm */
#else
DWB_ROWS(dwb_rows_gen, , dwb_v4, dwb_v4u, 4, 4) /* NEON: 16 accumulators of 32 q */
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(INFERD_NO_CLONES)
typedef float dwb_v8 __attribute__((vector_size(32)));
typedef float dwb_v8u __attribute__((vector_size(32), aligned(4), may_alias));
typedef float dwb_v16 __attribute__((vector_size(64)));
typedef float dwb_v16u __attribute__((vector_size(64), aligned(4), may_alias));
DWB_ROWS(dwb_rows_avx2, __attribute__((target("avx2,fma"))), dwb_v8, dwb_v8u, 8, 4)
DWB_ROWS(dwb_rows_avx512, __attribute__((target("avx512f,avx2,fma"))), dwb_v16, dwb_v16u, 16, 4)
#endif

static dwb_rows_fn dwb_rows(void)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(INFERD_NO_CLONES)
    const int l = inferd_x86_level();
    if (l == 2) return dwb_rows_avx512;
    if (l == 1) return dwb_rows_avx2;
#endif
    return dwb_rows_gen;
}

/* 4x4 transposes on 4-float vectors (unpack/shuffle on SSE, AVX and NEON alike) move the channel-blocked
   tiles in and out at about half the cost of element-wise copies. */
typedef float v4t __attribute__((vector_size(16)));
typedef int v4ti __attribute__((vector_size(16)));
#if defined(__clang__)
#define SHUF4(a, b, i0, i1, i2, i3) __builtin_shufflevector(a, b, i0, i1, i2, i3)
#else
#define SHUF4(a, b, i0, i1, i2, i3) __builtin_shuffle(a, b, (v4ti){i0, i1, i2, i3})
#endif

INFERD_INLINE void tr4(v4t* r0, v4t* r1, v4t* r2, v4t* r3)
{
    const v4t t0 = SHUF4(*r0, *r1, 0, 4, 1, 5), t1 = SHUF4(*r0, *r1, 2, 6, 3, 7);
    const v4t t2 = SHUF4(*r2, *r3, 0, 4, 1, 5), t3 = SHUF4(*r2, *r3, 2, 6, 3, 7);
    *r0 = SHUF4(t0, t2, 0, 1, 4, 5);
    *r1 = SHUF4(t0, t2, 2, 3, 6, 7);
    *r2 = SHUF4(t1, t3, 0, 1, 4, 5);
    *r3 = SHUF4(t1, t3, 2, 3, 6, 7);
}

/* dst[p*DWB + c] = r[c][p] for c < 16 and the 4 columns p0..p0+3 (r: one source row per channel lane). */
INFERD_INLINE void to_blocked4(float* restrict dst, const float* const* r, int p0)
{
    for (int c = 0; c < DWB; c += 4) {
        v4t r0, r1, r2, r3;
        memcpy(&r0, r[c + 0] + p0, 16);
        memcpy(&r1, r[c + 1] + p0, 16);
        memcpy(&r2, r[c + 2] + p0, 16);
        memcpy(&r3, r[c + 3] + p0, 16);
        tr4(&r0, &r1, &r2, &r3);
        memcpy(dst + (size_t)(p0 + 0) * DWB + c, &r0, 16);
        memcpy(dst + (size_t)(p0 + 1) * DWB + c, &r1, 16);
        memcpy(dst + (size_t)(p0 + 2) * DWB + c, &r2, 16);
        memcpy(dst + (size_t)(p0 + 3) * DWB + c, &r3, 16);
    }
}

/* dst[p*DWB + c] = r[c][p] for c < 16, p < n. A ragged end (n >= 4) is one more 4-column transpose overlapping the
   last whole one: it rewrites equal values instead of a scalar tail. */
INFERD_INLINE void to_blocked_rows(float* dst, const float* const* r, int n)
{
    int p = 0;
    for (; p + 4 <= n; p += 4) to_blocked4(dst, r, p);
    if (p < n && n >= 4) {
        to_blocked4(dst, r, n - 4);
        return;
    }
    for (; p < n; ++p)
        for (int c = 0; c < DWB; ++c) dst[(size_t)p * DWB + c] = r[c][p];
}

/* dst[p*DWB + c] = src[c*lds + p] for c < 16, p < n (all 16 channel rows must exist). */
INFERD_INLINE void to_blocked(float* dst, const float* src, ptrdiff_t lds, int n)
{
    const float* r[DWB];
    for (int c = 0; c < DWB; ++c) r[c] = src + c * lds;
    to_blocked_rows(dst, r, n);
}

/* dst[c*ldd + p] = src[p*DWB + c] for c < 16, p < n. */
INFERD_INLINE void from_blocked(float* restrict dst, ptrdiff_t ldd, const float* restrict src, int n)
{
    int p = 0;
    for (; p + 4 <= n; p += 4)
        for (int c = 0; c < DWB; c += 4) {
            v4t r0, r1, r2, r3;
            memcpy(&r0, src + (size_t)(p + 0) * DWB + c, 16);
            memcpy(&r1, src + (size_t)(p + 1) * DWB + c, 16);
            memcpy(&r2, src + (size_t)(p + 2) * DWB + c, 16);
            memcpy(&r3, src + (size_t)(p + 3) * DWB + c, 16);
            tr4(&r0, &r1, &r2, &r3);
            memcpy(dst + (c + 0) * ldd + p, &r0, 16);
            memcpy(dst + (c + 1) * ldd + p, &r1, 16);
            memcpy(dst + (c + 2) * ldd + p, &r2, 16);
            memcpy(dst + (c + 3) * ldd + p, &r3, 16);
        }
    for (; p < n; ++p)
        for (int c = 0; c < DWB; ++c) dst[c * ldd + p] = src[(size_t)p * DWB + c];
}

/* This thread's blocked-depthwise workspace (64-byte aligned, grown as needed, freed at thread exit). */
static __thread float* dw_tl_buf = NULL;
static __thread size_t dw_tl_cap = 0;
static pthread_key_t dw_tl_key;
static pthread_once_t dw_tl_once = PTHREAD_ONCE_INIT;
static void dw_tl_free(void* p) { free(p); }
static void dw_tl_init(void) { pthread_key_create(&dw_tl_key, dw_tl_free); }

static float* dw_scratch(size_t n)
{
    if (n > dw_tl_cap) {
        void* p = NULL;
        if (posix_memalign(&p, 64, n * sizeof(float)) != 0) return NULL;
        free(dw_tl_buf);
        dw_tl_buf = (float*)p;
        dw_tl_cap = n;
        pthread_once(&dw_tl_once, dw_tl_init);
        pthread_setspecific(dw_tl_key, p);
    }
    return dw_tl_buf;
}

INFERD_INLINE int dw_blocked(const float* x, const float* w, const float* bias, float* y, int C, int H, int W, int kh,
                             int kw, int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW, int act, float p0,
                             float p1)
{
    const int Hp = imax(H + pt, (OH - 1) * sh + (kh - 1) * dh + 1);
    const int Wp = imax(W + pl, (OW - 1) * sw + (kw - 1) * dw + 1);
    const int T = kh * kw, P = OH * OW, HW = H * W;
    if (T > 49) return 1; /* keep the weight vectors bounded; the caller falls back */
    const size_t tsz = (size_t)Hp * Wp * DWB, osz = (size_t)P * DWB, ssz = (size_t)HW * DWB;
    /* a per-thread buffer kept between calls, and only the padding zeroed: a fresh 460 KB allocation and a
       memset of the whole tile per task cost as much as the convolution on 144 x 56 x 56 / 2 (8 tasks) */
    float* buf = dw_scratch(tsz + osz + ssz);
    if (!buf) return -1;
    float* tile = buf;
    float* out = buf + tsz;
    float* stage = out + osz;
    /* padding: never written below, so it stays zero for every block (the interior of lanes past a partial
       block's channels holds an earlier block's values: their outputs are computed and dropped) */
    memset(tile, 0, sizeof(float) * (size_t)pt * Wp * DWB);
    for (int h = pt; h < pt + H; ++h) {
        memset(tile + (size_t)h * Wp * DWB, 0, sizeof(float) * (size_t)pl * DWB);
        memset(tile + ((size_t)h * Wp + pl + W) * DWB, 0, sizeof(float) * (size_t)(Wp - pl - W) * DWB);
    }
    if (Hp > pt + H) memset(tile + (size_t)(pt + H) * Wp * DWB, 0, sizeof(float) * (size_t)(Hp - pt - H) * Wp * DWB);
    if (C % DWB) memset(tile + (size_t)pt * Wp * DWB, 0, sizeof(float) * (size_t)H * Wp * DWB); /* partial block: no junk lanes */
    ptrdiff_t off[49];
    for (int i = 0; i < kh; ++i)
        for (int j = 0; j < kw; ++j) off[i * kw + j] = ((ptrdiff_t)i * dh * Wp + (ptrdiff_t)j * dw) * DWB;
    float wv[49 * DWB], bv[DWB];
    const dwb_rows_fn rows = dwb_rows();
    for (int c0 = 0; c0 < C; c0 += DWB) {
        const int cb = imin(DWB, C - c0);
        memset(wv, 0, sizeof(float) * (size_t)T * DWB);
        memset(bv, 0, sizeof bv);
        for (int t = 0; t < T; ++t)
            for (int c = 0; c < cb; ++c) wv[t * DWB + c] = w[(size_t)(c0 + c) * T + t];
        if (bias)
            for (int c = 0; c < cb; ++c) bv[c] = bias[c0 + c];
        if (W >= 4) {
            /* row by row straight into the padded tile, in whole 4x4 transposes (the last one overlapping): a
               pass over the block fewer than the staged copy below (one thread, 144x56x56 stride 2: 127 -> 92 us;
               192x28x28 stride 1: 82 -> 72 us). A partial block's spare lanes read its last channel again (their
               outputs are dropped), so shufflenet's 58/116/232 channels need no element-by-element copy. */
            const float* r[DWB];
            for (int c = 0; c < DWB; ++c) r[c] = x + (size_t)(c0 + imin(c, cb - 1)) * HW;
            for (int h = 0; h < H; ++h) {
                to_blocked_rows(tile + ((size_t)(h + pt) * Wp + pl) * DWB, r, W);
                for (int c = 0; c < DWB; ++c) r[c] += W;
            }
        } else if (cb == DWB) {
            /* whole rows of the blocked image, then row by row into the padded tile (a short row's scalar tail
               would cost more than the copy) */
            to_blocked(stage, x + (size_t)c0 * HW, HW, HW);
            for (int h = 0; h < H; ++h)
                memcpy(tile + ((size_t)(h + pt) * Wp + pl) * DWB, stage + (size_t)h * W * DWB,
                       sizeof(float) * (size_t)W * DWB);
        } else {
            for (int c = 0; c < cb; ++c) {
                const float* restrict src = x + (size_t)(c0 + c) * HW;
                for (int h = 0; h < H; ++h) {
                    float* restrict d = tile + ((size_t)(h + pt) * Wp + pl) * DWB + c;
                    for (int q = 0; q < W; ++q) d[(size_t)q * DWB] = src[(size_t)h * W + q];
                }
            }
        }
        rows(tile, Wp, out, OH, OW, sh, sw, off, T, wv, bv);
        act_inplace(out, (ptrdiff_t)P * DWB, act, p0, p1);
        if (cb == DWB) {
            from_blocked(y + (size_t)c0 * P, P, out, P);
        } else {
            for (int c = 0; c < cb; ++c) {
                float* restrict d = y + (size_t)(c0 + c) * P;
                const float* restrict o = out + c;
                for (int p = 0; p < P; ++p) d[p] = o[(size_t)p * DWB];
            }
        }
    }
    return 0;
}

/* measured on Zen 4 (one thread): blocked/per-channel 0.50x at 7x7 and 14x14, 0.56x for 144@56 stride 2,
   0.96x at 28x28, 1.17x at 56x56 and 1.1-1.3x at 112x112 */
static int dw_blocked_max_pixels = 1024;
void inferd_dw_blocked_max_pixels(int n) { dw_blocked_max_pixels = n; }

INFERD_CLONES
static int dwconv2d_range(const float* x, const float* w, const float* bias, float* y, int C, int mult,
                    int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW,
                    int act, float p0, float p1)
{
    /* measured: the flat form wins for stride 1, and for stride 2 with 5x5/7x7 kernels or small maps; rows win
       for 3x3 stride 2 on wide maps (96@112: 0.33 vs 0.35 ms; 576@14: 0.117 vs 0.090 ms) */
    if (mult == 1 && OH * OW <= dw_blocked_max_pixels) {
        const int r = dw_blocked(x, w, bias, y, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, act, p0, p1);
        if (r <= 0) return r;
    }
    if (sh == sw && dh == 1 && dw == 1 && (sh == 1 || (sh == 2 && (kh * kw > 9 || OW <= 32))))
        return dw_flat(x, w, bias, y, C, mult, H, W, kh, kw, sh, pt, pl, OH, OW, act, p0, p1);
    dw_rows(x, w, bias, y, C, mult, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, act, p0, p1);
    return 0;
}

/* ---------------------------------------------------------------- winograd */

/* dst[k] = sum over r of coef[r] * src[r][k] for k < n (zero coefficients skipped; n contiguous floats). */
INFERD_INLINE void lincomb(float* restrict dst, const float* const* src, const float* coef, int nterms, ptrdiff_t n)
{
    int first = 1;
    for (int r = 0; r < nterms; ++r) {
        const float k = coef[r];
        if (k == 0.0f) continue;
        const float* restrict s = src[r];
        if (first) {
            if (k == 1.0f)
                for (ptrdiff_t q = 0; q < n; ++q) dst[q] = s[q];
            else
                for (ptrdiff_t q = 0; q < n; ++q) dst[q] = k * s[q];
            first = 0;
        } else if (k == 1.0f) {
            for (ptrdiff_t q = 0; q < n; ++q) dst[q] += s[q];
        } else if (k == -1.0f) {
            for (ptrdiff_t q = 0; q < n; ++q) dst[q] -= s[q];
        } else {
            for (ptrdiff_t q = 0; q < n; ++q) dst[q] += k * s[q];
        }
    }
    if (first)
        for (ptrdiff_t q = 0; q < n; ++q) dst[q] = 0.0f;
}

/* The input is split into its m x m stride phases (phase (rp, cp) holds padded rows rp, rp+m, ... and
   columns cp, cp+m, ..., pitch Wh = tW + (alpha-1)/m). Then element (r, q) of tile (ti, tj) is
   phase[r % m][q % m] at row ti + r/m, column tj + q/m, so both passes of BT d B are linear combinations
   of whole shifted planes: long unit-stride loops that vectorise regardless of the tile count. */
INFERD_CLONES
static int winograd_input_range(const float* x, int C, int H, int W, int pt, int pl, int tH, int tW, int m, int alpha,
                          const float* BT, float* V, long long ldpos, long long ldc, long long p0)
{
    const int ex = (alpha - 1) / m;
    const int Hh = tH + ex, Wh = tW + ex;
    const size_t psz = (size_t)Hh * Wh;
    const ptrdiff_t nT = (ptrdiff_t)tH * Wh;        /* stage-1 planes: tH rows of pitch Wh */
    const ptrdiff_t nV = (ptrdiff_t)(tH - 1) * Wh + tW; /* stage-2 span on pitch Wh */
    const size_t nfloat = (size_t)m * m * psz + (size_t)alpha * m * nT + (size_t)nT;
    float* ph = (float*)malloc(sizeof(float) * nfloat);
    const float** src = (const float**)malloc(sizeof(float*) * (size_t)alpha);
    if (!ph || !src) {
        free(ph);
        free((void*)src);
        return -1;
    }
    float* T = ph + (size_t)m * m * psz;           /* T[a][cp] : alpha * m planes of nT */
    float* tmp = T + (size_t)alpha * m * nT;
    memset(ph, 0, sizeof(float) * (size_t)m * m * psz); /* padding is the same for every channel */
    for (int c = 0; c < C; ++c) {
        const float* plane = x + (size_t)c * H * W;
        for (int rp = 0; rp < m; ++rp) {
            for (int cp = 0; cp < m; ++cp) {
                float* P = ph + (size_t)(rp * m + cp) * psz;
                int lo, hi;
                valid_range(cp - pl, m, W, Wh, &lo, &hi); /* phase column cc = image column cp + m*cc - pl */
                if (hi <= lo) continue;
                const ptrdiff_t c0 = cp - pl;
                for (int rr = 0; rr < Hh; ++rr) {
                    const int ih = rp + m * rr - pt;
                    if (ih < 0 || ih >= H) continue;
                    float* restrict d = P + (size_t)rr * Wh;
                    const float* restrict s = plane + (size_t)ih * W + c0;
                    if (m == 2)
                        for (ptrdiff_t cc = lo; cc < hi; ++cc) d[cc] = s[2 * cc];
                    else if (m == 4)
                        for (ptrdiff_t cc = lo; cc < hi; ++cc) d[cc] = s[4 * cc];
                    else
                        for (ptrdiff_t cc = lo; cc < hi; ++cc) d[cc] = s[(ptrdiff_t)m * cc];
                }
            }
        }
        /* rows: T[a][cp] = sum_r BT[a][r] * phase[r % m][cp] shifted down by r/m rows */
        for (int a = 0; a < alpha; ++a) {
            for (int cp = 0; cp < m; ++cp) {
                for (int r = 0; r < alpha; ++r)
                    src[r] = ph + (size_t)((r % m) * m + cp) * psz + (size_t)(r / m) * Wh;
                lincomb(T + ((size_t)a * m + cp) * nT, src, BT + (size_t)a * alpha, alpha, nT);
            }
        }
        /* columns: V[a][b] = sum_q BT[b][q] * T[a][q % m] shifted right by q/m, then compacted to pitch tW */
        for (int a = 0; a < alpha; ++a) {
            for (int b = 0; b < alpha; ++b) {
                for (int q = 0; q < alpha; ++q) src[q] = T + ((size_t)a * m + q % m) * nT + q / m;
                float* d = V + (a * alpha + b) * ldpos + c * ldc + p0;
                if (Wh == tW) {
                    lincomb(d, src, BT + (size_t)b * alpha, alpha, nV);
                } else {
                    lincomb(tmp, src, BT + (size_t)b * alpha, alpha, nV);
                    for (int ti = 0; ti < tH; ++ti) copy_row(d + (ptrdiff_t)ti * tW, tmp + (ptrdiff_t)ti * Wh, tW);
                }
            }
        }
    }
    free(ph);
    free((void*)src);
    return 0;
}

/* Output tiles: S[i][b] = sum_a AT[i][a] M[a][b], Y[i][j] = bias + sum_b AT[j][b] S[i][b], each a linear
   combination of whole planes over all tiles (no shifts: output tiles do not overlap); then the m x m output
   phases are interleaved into the image rows, cropped to (OH, OW). */
INFERD_CLONES
static int winograd_output_range(const float* Mw, int Cout, int OH, int OW, int tH, int tW, int m, int alpha,
                           const float* AT, const float* bias, float* y, long long ldpos, long long ldc, long long p0,
                           const float* res, int act, float ap0, float ap1)
{
    const ptrdiff_t P = (ptrdiff_t)tH * tW;
    float* S = (float*)malloc(sizeof(float) * ((size_t)m * alpha * P + (size_t)m * m * P));
    const float** src = (const float**)malloc(sizeof(float*) * (size_t)alpha);
    if (!S || !src) {
        free(S);
        free((void*)src);
        return -1;
    }
    float* Y = S + (size_t)m * alpha * P;
    for (int co = 0; co < Cout; ++co) {
        const float bv = bias ? bias[co] : 0.0f;
        for (int i = 0; i < m; ++i) {
            for (int b = 0; b < alpha; ++b) {
                for (int a = 0; a < alpha; ++a) src[a] = Mw + (a * alpha + b) * ldpos + co * ldc + p0;
                lincomb(S + ((size_t)i * alpha + b) * P, src, AT + (size_t)i * alpha, alpha, P);
            }
        }
        for (int i = 0; i < m; ++i) {
            for (int j = 0; j < m; ++j) {
                for (int b = 0; b < alpha; ++b) src[b] = S + ((size_t)i * alpha + b) * P;
                float* restrict d = Y + ((size_t)i * m + j) * P;
                lincomb(d, src, AT + (size_t)j * alpha, alpha, P);
                if (bv != 0.0f)
                    for (ptrdiff_t q = 0; q < P; ++q) d[q] += bv;
            }
        }
        float* yc = y + (size_t)co * OH * OW;
        const int full = OW / m; /* tiles whose m columns all lie inside the row */
        for (int ti = 0; ti < tH; ++ti) {
            for (int i = 0; i < m; ++i) {
                const int oh = ti * m + i;
                if (oh >= OH) break;
                float* restrict row = yc + (size_t)oh * OW;
                const float* Yi = Y + (size_t)i * m * P + (size_t)ti * tW;
                if (m == 2) {
                    const float* restrict y0 = Yi;
                    const float* restrict y1 = Yi + P;
                    for (ptrdiff_t tj = 0; tj < full; ++tj) {
                        row[2 * tj] = y0[tj];
                        row[2 * tj + 1] = y1[tj];
                    }
                } else if (m == 4) {
                    const float* restrict y0 = Yi;
                    const float* restrict y1 = Yi + P;
                    const float* restrict y2 = Yi + 2 * P;
                    const float* restrict y3 = Yi + 3 * P;
                    for (ptrdiff_t tj = 0; tj < full; ++tj) {
                        row[4 * tj] = y0[tj];
                        row[4 * tj + 1] = y1[tj];
                        row[4 * tj + 2] = y2[tj];
                        row[4 * tj + 3] = y3[tj];
                    }
                } else {
                    for (int j = 0; j < m; ++j)
                        for (ptrdiff_t tj = 0; tj < full; ++tj) row[(ptrdiff_t)m * tj + j] = Yi[(size_t)j * P + tj];
                }
                for (int ow = full * m; ow < OW; ++ow) row[ow] = Yi[(size_t)(ow % m) * P + ow / m];
            }
        }
        /* the fused epilogue while the channel's plane is still in L1/L2 (a separate pass read it back from
           memory): residual, then the activation */
        if (res || act) {
            const size_t n = (size_t)OH * OW;
            if (res) {
                const float* restrict rc = res + (size_t)co * n;
                for (size_t q = 0; q < n; ++q) yc[q] += rc[q];
            }
            act_inplace(yc, (ptrdiff_t)n, act, ap0, ap1);
        }
    }
    free(S);
    free((void*)src);
    return 0;
}

/* ---------------------------------------------------------------- epilogue */

/* One pass per channel: load, add bias and residual, activate, store. */
#define INFERD_EPI_LOOP(F)                                                                        \
    if (r) {                                                                                      \
        for (long long k = 0; k < HW; ++k) {                                                      \
            const float v = d[k] + b + r[k];                                                      \
            d[k] = F(v);                                                                          \
        }                                                                                         \
    } else {                                                                                      \
        for (long long k = 0; k < HW; ++k) {                                                      \
            const float v = d[k] + b;                                                             \
            d[k] = F(v);                                                                          \
        }                                                                                         \
    }
#define INFERD_ACT_NONE(v) (v)

INFERD_CLONES
static void bias_act_range(float* y, long long ldy, const float* bias, const float* res, long long ldr, int C, long long HW,
                     int act, float p0, float p1)
{
    for (int c = 0; c < C; ++c) {
        float* restrict d = y + (ptrdiff_t)c * ldy;
        const float* restrict r = res ? res + (ptrdiff_t)c * ldr : NULL;
        const float b = bias ? bias[c] : 0.0f;
        if (act == 0) {
            if (r || b != 0.0f) {
                INFERD_EPI_LOOP(INFERD_ACT_NONE)
            }
            continue;
        }
        INFERD_ACT_SWITCH(act, INFERD_EPI_LOOP)
    }
}

/* ---------------------------------------------------------------- erf / GELU (the functions: inferd_internal.h) */

INFERD_CLONES
static void erf_range(const float* x, float* y, long long n)
{
    if (x == y) {
        for (long long k = 0; k < n; ++k) {
            const float v = y[k];
            y[k] = erf_ps(v);
        }
        return;
    }
    const float* restrict s = x;
    float* restrict d = y;
    for (long long k = 0; k < n; ++k) d[k] = erf_ps(s[k]);
}

INFERD_CLONES
static void gelu_range(float* y, long long n, int approx)
{
    if (approx) {
        for (long long k = 0; k < n; ++k) {
            const float v = y[k];
            y[k] = gelu_tanh_ps(v);
        }
    } else {
        for (long long k = 0; k < n; ++k) {
            const float v = y[k];
            y[k] = gelu_erf_ps(v);
        }
    }
}

/* ---------------------------------------------------------------- channel-parallel entry points
   Each splits its channel axis over inferd's pool (pool.c) into a few chunks per thread; small jobs stay
   on the calling thread. A chunk reports failure (out of memory) through the shared flag. */

#define CH_LO(C, n, t) ((int)((long long)(C) * (t) / (n)))

typedef struct {
    const float* x;
    int C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW;
    float* col;
    int n;
} im2col_job;

static void im2col_task(void* p, long long t)
{
    const im2col_job* j = (const im2col_job*)p;
    const int rows = j->C * j->kh * j->kw;
    const int lo = CH_LO(rows, j->n, t), hi = CH_LO(rows, j->n, t + 1);
    if (hi > lo)
        im2col_range(j->x, j->C, j->H, j->W, j->kh, j->kw, j->sh, j->sw, j->dh, j->dw, j->pt, j->pl, j->OH, j->OW,
                     j->col, lo, hi);
}

void inferd_im2col(const float* x, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl,
                   int OH, int OW, float* col)
{
    /* split by rows of the column matrix, not by channels: a 3-channel stem has 27 or 147 rows but 3 channels */
    im2col_job j = {x, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, col, 0};
    j.n = inferd_pool_chunks((long long)C * kh * kw, (double)C * kh * kw * OH * OW);
    inferd_parallel(im2col_task, &j, j.n, 0);
}

typedef struct {
    const float *x, *w, *bias;
    float* y;
    int C, mult, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, act;
    float p0, p1;
    int n, failed;
    int unit; /* channels per unit of work: a task takes whole units */
} dw_job;

static void dw_task(void* p, long long t)
{
    dw_job* j = (dw_job*)p;
    const int units = (j->C + j->unit - 1) / j->unit;
    const int lo = CH_LO(units, j->n, t) * j->unit, hi = imin(j->C, CH_LO(units, j->n, t + 1) * j->unit);
    if (hi <= lo) return;
    const size_t co = (size_t)lo * j->mult;
    if (dwconv2d_range(j->x + (size_t)lo * j->H * j->W, j->w + co * j->kh * j->kw, j->bias ? j->bias + co : NULL,
                       j->y + co * j->OH * j->OW, hi - lo, j->mult, j->H, j->W, j->kh, j->kw, j->sh, j->sw, j->dh,
                       j->dw, j->pt, j->pl, j->OH, j->OW, j->act, j->p0, j->p1) != 0)
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
}

int inferd_dwconv2d(const float* x, const float* w, const float* bias, float* y, int C, int mult, int H, int W, int kh,
                    int kw, int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW, int act, float p0, float p1)
{
    dw_job j = {x, w, bias, y, C, mult, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, act, p0, p1, 0, 0, 1};
    /* The blocked form computes 16 channels at a time: tasks of whole blocks. Split by channels, 144 channels
       in 8 tasks were 8 blocks of 16 plus 8 of 2, each of those as costly as a full one (1.7x the work). */
    if (mult == 1 && OH * OW <= dw_blocked_max_pixels && kh * kw <= 49) j.unit = DWB;
    j.n = inferd_pool_chunks((C + j.unit - 1) / j.unit, (double)C * mult * OH * OW * kh * kw);
    inferd_parallel(dw_task, &j, j.n, 0);
    return j.failed ? -1 : 0;
}

typedef struct {
    const float* x;
    int C, H, W, pt, pl, tH, tW, m, alpha;
    const float* BT;
    float* V;
    long long ldpos, ldc, p0;
    int n, failed;
} wi_job;

static void wi_task(void* p, long long t)
{
    wi_job* j = (wi_job*)p;
    const int lo = CH_LO(j->C, j->n, t), hi = CH_LO(j->C, j->n, t + 1);
    if (hi > lo && winograd_input_range(j->x + (size_t)lo * j->H * j->W, hi - lo, j->H, j->W, j->pt, j->pl, j->tH,
                                        j->tW, j->m, j->alpha, j->BT, j->V + (ptrdiff_t)lo * j->ldc, j->ldpos, j->ldc,
                                        j->p0) != 0)
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
}

int inferd_winograd_input(const float* x, int C, int H, int W, int pt, int pl, int tH, int tW, int m, int alpha,
                          const float* BT, float* V, long long ldpos, long long ldc, long long p0)
{
    wi_job j = {x, C, H, W, pt, pl, tH, tW, m, alpha, BT, V, ldpos, ldc, p0, 0, 0};
    j.n = inferd_pool_chunks(C, (double)C * tH * tW * alpha * alpha);
    inferd_parallel(wi_task, &j, j.n, 0);
    return j.failed ? -1 : 0;
}

typedef struct {
    const float* Mw;
    int Cout, OH, OW, tH, tW, m, alpha;
    const float *AT, *bias;
    float* y;
    long long ldpos, ldc, p0;
    int n, failed;
    const float* res;
    int act;
    float ap0, ap1;
} wo_job;

static void wo_task(void* p, long long t)
{
    wo_job* j = (wo_job*)p;
    const int lo = CH_LO(j->Cout, j->n, t), hi = CH_LO(j->Cout, j->n, t + 1);
    if (hi > lo && winograd_output_range(j->Mw + (ptrdiff_t)lo * j->ldc, hi - lo, j->OH, j->OW, j->tH, j->tW, j->m,
                                         j->alpha, j->AT, j->bias ? j->bias + lo : NULL,
                                         j->y + (size_t)lo * j->OH * j->OW, j->ldpos, j->ldc, j->p0,
                                         j->res ? j->res + (size_t)lo * j->OH * j->OW : NULL, j->act, j->ap0,
                                         j->ap1) != 0)
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
}

int inferd_winograd_output(const float* Mw, int Cout, int OH, int OW, int tH, int tW, int m, int alpha,
                           const float* AT, const float* bias, float* y, long long ldpos, long long ldc, long long p0)
{
    return inferd_winograd_output_ex(Mw, Cout, OH, OW, tH, tW, m, alpha, AT, bias, y, ldpos, ldc, p0, NULL, 0, 0.0f,
                                     0.0f);
}

int inferd_winograd_output_ex(const float* Mw, int Cout, int OH, int OW, int tH, int tW, int m, int alpha,
                              const float* AT, const float* bias, float* y, long long ldpos, long long ldc,
                              long long p0, const float* res, int act, float ap0, float ap1)
{
    wo_job j = {Mw, Cout, OH, OW, tH, tW, m, alpha, AT, bias, y, ldpos, ldc, p0, 0, 0, res, act, ap0, ap1};
    j.n = inferd_pool_chunks(Cout, (double)Cout * OH * OW * alpha);
    inferd_parallel(wo_task, &j, j.n, 0);
    return j.failed ? -1 : 0;
}

typedef struct {
    float* y;
    long long ldy;
    const float *bias, *res;
    long long ldr;
    int C;
    long long HW;
    int act;
    float p0, p1;
    int n;
} ba_job;

static void ba_task(void* p, long long t)
{
    const ba_job* j = (const ba_job*)p;
    const int lo = CH_LO(j->C, j->n, t), hi = CH_LO(j->C, j->n, t + 1);
    if (hi > lo)
        bias_act_range(j->y + (ptrdiff_t)lo * j->ldy, j->ldy, j->bias ? j->bias + lo : NULL,
                       j->res ? j->res + (ptrdiff_t)lo * j->ldr : NULL, j->ldr, hi - lo, j->HW, j->act, j->p0, j->p1);
}

void inferd_bias_act(float* y, long long ldy, const float* bias, const float* res, long long ldr, int C, long long HW,
                     int act, float p0, float p1)
{
    ba_job j = {y, ldy, bias, res, ldr, C, HW, act, p0, p1, 0};
    j.n = inferd_pool_chunks(C, (double)C * HW * (INFERD_ACT_COSTLY(act) ? 8 : 1));
    inferd_parallel(ba_task, &j, j.n, 0);
}

/* y[r, :] = x[r, :] * s[r] over rows of `inner` floats (a Mul by a per-channel scale: squeeze-and-excitation), split
   by rows over the pool; y may be x. */
typedef struct {
    const float* x;
    const float* s;
    float* y;
    long long rows, inner;
    int n;
} sr_job;

INFERD_CLONES static void scale_rows_range(const float* x, const float* s, float* y, long long r0, long long r1,
                                           long long inner)
{
    for (long long r = r0; r < r1; ++r) {
        const float k = s[r];
        const float* xr = x + r * inner;
        float* yr = y + r * inner;
        for (long long i = 0; i < inner; ++i) yr[i] = xr[i] * k;
    }
}

static void sr_task(void* p, long long t)
{
    const sr_job* j = (const sr_job*)p;
    const long long r0 = j->rows * t / j->n, r1 = j->rows * (t + 1) / j->n;
    if (r1 > r0) scale_rows_range(j->x, j->s, j->y, r0, r1, j->inner);
}

void inferd_scale_rows(const float* x, const float* s, float* y, long long rows, long long inner)
{
    if (rows <= 0 || inner <= 0) return;
    sr_job j = {x, s, y, rows, inner, 1};
    j.n = inferd_pool_chunks(rows, (double)rows * inner);
    inferd_parallel(sr_task, &j, j.n, 0);
}

/* Element-wise erf/GELU over the pool in 4096-float chunks (whole cache lines; in-place erf stays in place). */
typedef struct {
    const float* x;
    float* y;
    long long n;
    int approx, gelu;
} ew_job;

#define EW_CHUNK 4096LL

static void ew_task(void* p, long long t)
{
    const ew_job* j = (const ew_job*)p;
    const long long lo = t * EW_CHUNK, hi = lo + EW_CHUNK < j->n ? lo + EW_CHUNK : j->n;
    if (j->gelu)
        gelu_range(j->y + lo, hi - lo, j->approx);
    else
        erf_range(j->x + lo, j->y + lo, hi - lo);
}

void inferd_erf(const float* x, float* y, long long n)
{
    ew_job j = {x, y, n, 0, 0};
    inferd_parallel(ew_task, &j, (n + EW_CHUNK - 1) / EW_CHUNK, n < 4 * EW_CHUNK ? 1 : 0);
}

void inferd_gelu(float* y, long long n, int approx)
{
    ew_job j = {y, y, n, approx, 1};
    inferd_parallel(ew_task, &j, (n + EW_CHUNK - 1) / EW_CHUNK, n < 4 * EW_CHUNK ? 1 : 0);
}
