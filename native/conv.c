/* Convolution helpers for inferd's CPU backend: im2col/col2im, depthwise conv, Winograd transforms, epilogue.
 *
 * Plain C99 loops written so that GCC/Clang auto-vectorise the innermost loop (contiguous, no branches).
 * The package build compiles for the baseline ISA (SSE2 on x86-64, NEON on aarch64). On x86-64 Linux with
 * glibc, the hot functions are also cloned for AVX2+FMA (and AVX-512) via target_clones; the loader picks
 * the best clone for the CPU at run time, so the extension still runs on any x86-64.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_native.h"

#if defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && defined(__GNUC__) && \
    !defined(__clang__) && __GNUC__ >= 8
#define INFERD_CLONES __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#else
#define INFERD_CLONES
#endif

#if defined(__GNUC__)
#define INFERD_INLINE static inline __attribute__((always_inline))
#else
#define INFERD_INLINE static inline
#endif

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

void inferd_im2col(const float* x, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw,
                   int pt, int pl, int OH, int OW, float* col)
{
    const size_t ohw = (size_t)OH * OW;
    for (int c = 0; c < C; ++c) {
        const float* plane = x + (size_t)c * H * W;
        for (int i = 0; i < kh; ++i) {
            for (int j = 0; j < kw; ++j) {
                float* dst = col + ((size_t)(c * kh + i) * kw + j) * ohw;
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
                    } else {
                        for (int ow = lo; ow < hi; ++ow) d[ow] = row[ow * sw + off];
                    }
                    if (hi < OW) memset(d + hi, 0, sizeof(float) * (size_t)(OW - hi));
                }
            }
        }
    }
}

INFERD_CLONES
void inferd_col2im(const float* col, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw,
                   int pt, int pl, int OH, int OW, float* y)
{
    const size_t ohw = (size_t)OH * OW;
    for (int c = 0; c < C; ++c) {
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

/* ---------------------------------------------------------------- depthwise */

/* Any kernel size: y[ow] = b + sum over taps, tap-outer so each pass is a contiguous (or strided) axpy. */
static void dw_row_taps(float* restrict y, const float* restrict plane, const float* restrict w, float b, int oh,
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

/* 3x3 interior: all nine taps accumulated in registers, one store per output. SW is a literal at each call
   site so the strided loads vectorise; r0..r2 are the three input rows, base = ow*SW - pl. */
INFERD_INLINE void dw3x3_row(float* restrict y, const float* restrict r0, const float* restrict r1,
                             const float* restrict r2, const float* restrict w, float b, int o0, int o1, int SW,
                             int dw, int pl)
{
    const float w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4], w5 = w[5], w6 = w[6], w7 = w[7], w8 = w[8];
    const int d2 = 2 * dw;
    for (int ow = o0; ow < o1; ++ow) {
        const int x = ow * SW - pl;
        y[ow] = b + w0 * r0[x] + w1 * r0[x + dw] + w2 * r0[x + d2]
                  + w3 * r1[x] + w4 * r1[x + dw] + w5 * r1[x + d2]
                  + w6 * r2[x] + w7 * r2[x + dw] + w8 * r2[x + d2];
    }
}

INFERD_CLONES
void inferd_dwconv2d(const float* x, const float* w, const float* bias, float* y, int C, int mult,
                     int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW)
{
    /* Output columns whose taps all fall inside the row, and output rows whose taps all fall inside the plane. */
    int c_lo, c_hi, r_lo, r_hi;
    valid_range(-pl, sw, W - (kw - 1) * dw, OW, &c_lo, &c_hi);
    valid_range(-pt, sh, H - (kh - 1) * dh, OH, &r_lo, &r_hi);
    if (W - (kw - 1) * dw <= 0) c_lo = c_hi = 0;
    if (H - (kh - 1) * dh <= 0) r_lo = r_hi = 0;
    const int fast3 = kh == 3 && kw == 3 && c_hi > c_lo;
    for (int co = 0; co < C * mult; ++co) {
        const float* plane = x + (size_t)(co / mult) * H * W;
        const float* wc = w + (size_t)co * kh * kw;
        const float b = bias ? bias[co] : 0.0f;
        float* yc = y + (size_t)co * OH * OW;
        for (int oh = 0; oh < OH; ++oh) {
            float* yr = yc + (size_t)oh * OW;
            if (!fast3 || oh < r_lo || oh >= r_hi) {
                dw_row_taps(yr, plane, wc, b, oh, H, W, kh, kw, sh, sw, dh, dw, pt, pl, 0, OW);
                continue;
            }
            const int ih = oh * sh - pt;
            const float* r0 = plane + (size_t)ih * W;
            const float* r1 = r0 + (size_t)dh * W;
            const float* r2 = r1 + (size_t)dh * W;
            if (sw == 1)
                dw3x3_row(yr, r0, r1, r2, wc, b, c_lo, c_hi, 1, dw, pl);
            else if (sw == 2)
                dw3x3_row(yr, r0, r1, r2, wc, b, c_lo, c_hi, 2, dw, pl);
            else
                dw3x3_row(yr, r0, r1, r2, wc, b, c_lo, c_hi, sw, dw, pl);
            if (c_lo > 0) dw_row_taps(yr, plane, wc, b, oh, H, W, kh, kw, sh, sw, dh, dw, pt, pl, 0, c_lo);
            if (c_hi < OW) dw_row_taps(yr, plane, wc, b, oh, H, W, kh, kw, sh, sw, dh, dw, pt, pl, c_hi, OW);
        }
    }
}

/* ---------------------------------------------------------------- winograd */

INFERD_CLONES
int inferd_winograd_input(const float* x, int C, int H, int W, int pt, int pl, int tH, int tW, int m, int alpha,
                           const float* BT, float* V, long long ldpos, long long ldc, long long p0)
{
    /* Row pass first (BT along H, contiguous over the padded width), then the column pass per tile
       (BT along W; reads stride m, writes contiguous over tiles of a tile row). */
    const int Wp = tW * m + alpha - m;
    float* rows = (float*)malloc(sizeof(float) * (size_t)alpha * Wp * 2);
    if (!rows) return -1;
    float* T = rows + (size_t)alpha * Wp;
    int lo = imax(0, pl), hi = imin(Wp, W + pl); /* padded-row columns that map inside the image */
    if (hi < lo) hi = lo;
    for (int c = 0; c < C; ++c) {
        const float* plane = x + (size_t)c * H * W;
        for (int ti = 0; ti < tH; ++ti) {
            for (int r = 0; r < alpha; ++r) {
                float* d = rows + (size_t)r * Wp;
                const int ih = ti * m - pt + r;
                if (ih < 0 || ih >= H || hi == lo) {
                    memset(d, 0, sizeof(float) * (size_t)Wp);
                    continue;
                }
                if (lo > 0) memset(d, 0, sizeof(float) * (size_t)lo);
                memcpy(d + lo, plane + (size_t)ih * W + (lo - pl), sizeof(float) * (size_t)(hi - lo));
                if (hi < Wp) memset(d + hi, 0, sizeof(float) * (size_t)(Wp - hi));
            }
            for (int a = 0; a < alpha; ++a) {
                float* restrict t = T + (size_t)a * Wp;
                memset(t, 0, sizeof(float) * (size_t)Wp);
                for (int r = 0; r < alpha; ++r) {
                    const float k = BT[a * alpha + r];
                    if (k == 0.0f) continue;
                    const float* restrict s = rows + (size_t)r * Wp;
                    for (int q = 0; q < Wp; ++q) t[q] += k * s[q];
                }
            }
            for (int a = 0; a < alpha; ++a) {
                const float* restrict t = T + (size_t)a * Wp;
                for (int b = 0; b < alpha; ++b) {
                    float* restrict d = V + (a * alpha + b) * ldpos + c * ldc + p0 + (long long)ti * tW;
                    for (int tj = 0; tj < tW; ++tj) d[tj] = 0.0f;
                    for (int q = 0; q < alpha; ++q) {
                        const float k = BT[b * alpha + q];
                        if (k == 0.0f) continue;
                        for (int tj = 0; tj < tW; ++tj) d[tj] += k * t[tj * m + q];
                    }
                }
            }
        }
    }
    free(rows);
    return 0;
}

INFERD_CLONES
int inferd_winograd_output(const float* Mw, int Cout, int OH, int OW, int tH, int tW, int m, int alpha,
                            const float* AT, const float* bias, float* y, long long ldpos, long long ldc, long long p0)
{
    /* S[i][b][tj] = sum_a AT[i][a] M[a][b] (contiguous over tiles), then Y[i][j] = sum_b S[i][b] AT[j][b]
       into a full-width row buffer that is cropped to OW on copy-out. */
    float* S = (float*)malloc(sizeof(float) * ((size_t)m * alpha * tW + (size_t)tW * m));
    if (!S) return -1;
    float* rowbuf = S + (size_t)m * alpha * tW;
    for (int co = 0; co < Cout; ++co) {
        const float bv = bias ? bias[co] : 0.0f;
        float* yc = y + (size_t)co * OH * OW;
        for (int ti = 0; ti < tH; ++ti) {
            const long long base = co * ldc + p0 + (long long)ti * tW;
            for (int i = 0; i < m; ++i) {
                for (int b = 0; b < alpha; ++b) {
                    float* restrict s = S + ((size_t)i * alpha + b) * tW;
                    for (int tj = 0; tj < tW; ++tj) s[tj] = 0.0f;
                    for (int a = 0; a < alpha; ++a) {
                        const float k = AT[i * alpha + a];
                        if (k == 0.0f) continue;
                        const float* restrict src = Mw + (a * alpha + b) * ldpos + base;
                        for (int tj = 0; tj < tW; ++tj) s[tj] += k * src[tj];
                    }
                }
            }
            for (int i = 0; i < m; ++i) {
                const int oh = ti * m + i;
                if (oh >= OH) break;
                for (int j = 0; j < m; ++j) {
                    float* restrict d = rowbuf + j;
                    for (int tj = 0; tj < tW; ++tj) d[tj * m] = bv;
                    for (int b = 0; b < alpha; ++b) {
                        const float k = AT[j * alpha + b];
                        if (k == 0.0f) continue;
                        const float* restrict s = S + ((size_t)i * alpha + b) * tW;
                        for (int tj = 0; tj < tW; ++tj) d[tj * m] += k * s[tj];
                    }
                }
                memcpy(yc + (size_t)oh * OW, rowbuf, sizeof(float) * (size_t)OW);
            }
        }
    }
    free(S);
    return 0;
}

/* ---------------------------------------------------------------- epilogue */

/* One pass per channel: load, add bias and residual, activate, store. */
#define INFERD_EPI_LOOP(EXPR)                                                        \
    do {                                                                             \
        if (r) {                                                                     \
            for (long long k = 0; k < HW; ++k) { float v = d[k] + b + r[k]; d[k] = (EXPR); } \
        } else {                                                                     \
            for (long long k = 0; k < HW; ++k) { float v = d[k] + b; d[k] = (EXPR); }        \
        }                                                                            \
    } while (0)

INFERD_CLONES
void inferd_bias_act(float* y, const float* bias, const float* res, int C, long long HW, int act, float p0, float p1)
{
    for (int c = 0; c < C; ++c) {
        float* restrict d = y + (size_t)c * HW;
        const float* restrict r = res ? res + (size_t)c * HW : NULL;
        const float b = bias ? bias[c] : 0.0f;
        switch (act) {
        case 1: /* v < 0 ? 0 : v keeps NaN as NaN, like np.maximum */
            INFERD_EPI_LOOP(v < 0.0f ? 0.0f : v);
            break;
        case 2:
            INFERD_EPI_LOOP(v < p0 ? p0 : (v > p1 ? p1 : v));
            break;
        case 3:
            INFERD_EPI_LOOP(v < 0.0f ? v * p0 : v);
            break;
        default:
            if (r || b != 0.0f) INFERD_EPI_LOOP(v);
            break;
        }
    }
}
