/* int8 GEMM and convolution with int32 accumulation and requantisation in the store, for quantised models
 * (QLinearConv / QLinearMatMul and the QDQ patterns import fuses into them).
 *
 * y[m][n] = clamp(rint(float(acc) * mult[n]) + zy, lo, hi), acc = sum_k (x[m][k] - zx) * w[n][k] + bias[n]
 *
 * Weights are signed 8-bit with zero point 0 (what quantisers write: symmetric, per tensor or per channel).
 * They are packed once at load in panels of 16 output channels by groups of 4 k (wp[panel][k/4][16][4], K
 * padded to a multiple of 4 with zeros) with their row sums, so the zero point of x is one bias term:
 * sum_k (x - zx) w = sum_k x' w - zx' * wsum, x' being x in the domain the micro-kernel multiplies in.
 *
 * Micro-kernels (runtime-dispatched, forced by inferd_q8_set_isa for tests):
 *   x86-64 AVX-512 VNNI: vpdpbusd multiplies unsigned 8-bit x by signed 8-bit w and adds groups of 4 straight
 *     into int32: no int16 intermediate, so nothing saturates (AVX2's vpmaddubsw would sum two u8*s8 products
 *     into int16, which overflows at 255*127*2; we never use it). x is taken as unsigned: int8 x is shifted by
 *     128 (x ^ 0x80) while the activation block is gathered.
 *   aarch64 sdot (ARMv8.2 dotprod): signed x signed groups of 4 into int32; uint8 x is shifted by -128.
 *   portable C: int32 products and sums (auto-vectorised, with the AVX2/AVX-512 clones on x86 where the
 *     compiler widens to vpmaddwd/vpmulld, which do not saturate).
 * Rows (output pixels, or matrix rows) are processed in blocks gathered into a per-task buffer (im2col for
 * convolutions), 6 rows per micro-kernel call; blocks are the pool's tasks.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define Q8_NP 16 /* output channels per weight panel */
#define Q8_MR 6  /* rows per micro-kernel call */
#define Q8_MB 96 /* rows per task block (a multiple of Q8_MR) */

static inline int q8_kp(int k) { return (k + 3) & ~3; }

long long inferd_q8_packed_size(int N, int K) { return (long long)((N + Q8_NP - 1) / Q8_NP) * Q8_NP * q8_kp(K); }

void inferd_q8_pack(const int8_t* w, int N, int K, int8_t* wp, int32_t* wsum)
{
    const int kp = q8_kp(K), panels = (N + Q8_NP - 1) / Q8_NP;
    memset(wp, 0, (size_t)panels * Q8_NP * kp);
    for (int n = 0; n < N; ++n) {
        int32_t s = 0;
        int8_t* dst = wp + (size_t)(n / Q8_NP) * Q8_NP * kp + (n % Q8_NP) * 4;
        for (int k = 0; k < K; ++k) {
            dst[(size_t)(k / 4) * Q8_NP * 4 + (k % 4)] = w[(size_t)n * K + k];
            s += w[(size_t)n * K + k];
        }
        wsum[n] = s;
    }
}

/* ---------------------------------------------------------------- micro-kernels: out[r][j] (Q8_MR x 16 int32)
   = sum over kp/4 groups of x[r][4g..4g+3] . panel[g][j][0..3]; x rows Q8_MR, row pitch kp bytes */
typedef void (*q8_uk)(const uint8_t* x, int kp, const int8_t* panel, int32_t* out);

INFERD_CLONES static void uk_portable(const uint8_t* x, int kp, const int8_t* panel, int32_t* out)
{
    int32_t acc[Q8_MR][Q8_NP];
    memset(acc, 0, sizeof acc);
    for (int g = 0; g < kp / 4; ++g) {
        const int8_t* p = panel + (size_t)g * Q8_NP * 4;
        for (int r = 0; r < Q8_MR; ++r) {
            const uint8_t* xr = x + (size_t)r * kp + 4 * g;
            const int32_t x0 = xr[0], x1 = xr[1], x2 = xr[2], x3 = xr[3];
            for (int j = 0; j < Q8_NP; ++j)
                acc[r][j] += x0 * p[4 * j] + x1 * p[4 * j + 1] + x2 * p[4 * j + 2] + x3 * p[4 * j + 3];
        }
    }
    memcpy(out, acc, sizeof acc);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define Q8_HAVE_VNNI 1
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void uk_vnni(const uint8_t* x, int kp,
                                                                            const int8_t* panel, int32_t* out)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    const size_t p0 = 0, p1 = (size_t)kp, p2 = 2 * (size_t)kp, p3 = 3 * (size_t)kp, p4 = 4 * (size_t)kp,
                 p5 = 5 * (size_t)kp;
    for (int g = 0; g < kp / 4; ++g) {
        const __m512i w = _mm512_loadu_si512((const void*)(panel + (size_t)g * 64));
        int32_t v;
        const uint8_t* xg = x + 4 * (size_t)g;
        memcpy(&v, xg + p0, 4); a0 = _mm512_dpbusd_epi32(a0, _mm512_set1_epi32(v), w);
        memcpy(&v, xg + p1, 4); a1 = _mm512_dpbusd_epi32(a1, _mm512_set1_epi32(v), w);
        memcpy(&v, xg + p2, 4); a2 = _mm512_dpbusd_epi32(a2, _mm512_set1_epi32(v), w);
        memcpy(&v, xg + p3, 4); a3 = _mm512_dpbusd_epi32(a3, _mm512_set1_epi32(v), w);
        memcpy(&v, xg + p4, 4); a4 = _mm512_dpbusd_epi32(a4, _mm512_set1_epi32(v), w);
        memcpy(&v, xg + p5, 4); a5 = _mm512_dpbusd_epi32(a5, _mm512_set1_epi32(v), w);
    }
    _mm512_storeu_si512((void*)(out + 0 * Q8_NP), a0);
    _mm512_storeu_si512((void*)(out + 1 * Q8_NP), a1);
    _mm512_storeu_si512((void*)(out + 2 * Q8_NP), a2);
    _mm512_storeu_si512((void*)(out + 3 * Q8_NP), a3);
    _mm512_storeu_si512((void*)(out + 4 * Q8_NP), a4);
    _mm512_storeu_si512((void*)(out + 5 * Q8_NP), a5);
}
#endif

#if defined(__aarch64__) && defined(__GNUC__)
#define Q8_HAVE_SDOT 1
__attribute__((target("+dotprod"))) static void uk_sdot(const uint8_t* xu, int kp, const int8_t* panel, int32_t* out)
{
    const int8_t* x = (const int8_t*)xu; /* already shifted to signed by the gather */
    int32x4_t acc[Q8_MR][4];
    for (int r = 0; r < Q8_MR; ++r)
        for (int q = 0; q < 4; ++q) acc[r][q] = vdupq_n_s32(0);
    for (int g = 0; g < kp / 4; ++g) {
        const int8_t* p = panel + (size_t)g * 64;
        const int8x16_t w0 = vld1q_s8(p), w1 = vld1q_s8(p + 16), w2 = vld1q_s8(p + 32), w3 = vld1q_s8(p + 48);
        for (int r = 0; r < Q8_MR; ++r) {
            int32_t v;
            memcpy(&v, x + (size_t)r * kp + 4 * (size_t)g, 4);
            const int8x16_t xb = vreinterpretq_s8_s32(vdupq_n_s32(v));
            acc[r][0] = vdotq_s32(acc[r][0], w0, xb);
            acc[r][1] = vdotq_s32(acc[r][1], w1, xb);
            acc[r][2] = vdotq_s32(acc[r][2], w2, xb);
            acc[r][3] = vdotq_s32(acc[r][3], w3, xb);
        }
    }
    for (int r = 0; r < Q8_MR; ++r)
        for (int q = 0; q < 4; ++q) vst1q_s32(out + r * Q8_NP + 4 * q, acc[r][q]);
}
#endif

typedef struct {
    int level;   /* 0 portable, 1 VNNI (x86) or sdot (aarch64) */
    int xsigned; /* the domain the micro-kernel reads x in: 0 unsigned (x86), 1 signed (sdot) */
    q8_uk uk;
} q8_isa_t;

static const q8_isa_t Q8_PORTABLE = {0, 0, uk_portable};
#if defined(Q8_HAVE_VNNI)
static const q8_isa_t Q8_VNNI = {1, 0, uk_vnni};
#endif
#if defined(Q8_HAVE_SDOT)
static const q8_isa_t Q8_SDOT = {1, 1, uk_sdot};
#endif

static const q8_isa_t* q8_best(void)
{
#if defined(Q8_HAVE_VNNI)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vnni"))
        return &Q8_VNNI;
#endif
#if defined(Q8_HAVE_SDOT) && defined(__linux__)
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) return &Q8_SDOT;
#endif
    return &Q8_PORTABLE;
}

static const q8_isa_t* Q8_ISA = NULL;

static const q8_isa_t* q8_isa(void)
{
    const q8_isa_t* p = __atomic_load_n(&Q8_ISA, __ATOMIC_ACQUIRE);
    if (!p) {
        p = q8_best();
        __atomic_store_n(&Q8_ISA, p, __ATOMIC_RELEASE);
    }
    return p;
}

int inferd_q8_set_isa(int level)
{
    const q8_isa_t* p = q8_best();
    if (level == 0) p = &Q8_PORTABLE;
    __atomic_store_n(&Q8_ISA, p, __ATOMIC_RELEASE);
    return p->level;
}

int inferd_q8_isa(void) { return q8_isa()->level; }

/* ---------------------------------------------------------------- store */

typedef struct {
    const int8_t* wp;
    const int32_t* bias_eff; /* bias - zx' * wsum, per output channel */
    const float* mult;
    int N, kp, zy, lo, hi, y_signed;
    void* y;
    long long ysm, ysn; /* element (m, n) at y + m*ysm + n*ysn */
} q8_out_t;

/* Round half to even without a libm call: exact for |v| < 2^22, and v is clamped far inside that first. */
static inline float q8_rint(float v) { return (v + 12582912.0f) - 12582912.0f; }

INFERD_CLONES static void q8_block(const q8_isa_t* isa, const uint8_t* xb, int rows, long long m0, const q8_out_t* o)
{
    int32_t tile[Q8_MR * Q8_NP];
    const float flo = (float)(o->lo - o->zy), fhi = (float)(o->hi - o->zy);
    for (int n0 = 0; n0 < o->N; n0 += Q8_NP) {
        const int8_t* panel = o->wp + (size_t)(n0 / Q8_NP) * Q8_NP * o->kp;
        const int nn = o->N - n0 < Q8_NP ? o->N - n0 : Q8_NP;
        for (int r0 = 0; r0 < rows; r0 += Q8_MR) {
            isa->uk(xb + (size_t)r0 * o->kp, o->kp, panel, tile);
            const int rr = rows - r0 < Q8_MR ? rows - r0 : Q8_MR;
            for (int r = 0; r < rr; ++r) {
                const long long m = m0 + r0 + r;
                for (int j = 0; j < nn; ++j) {
                    float v = (float)(tile[r * Q8_NP + j] + o->bias_eff[n0 + j]) * o->mult[n0 + j];
                    v = v < flo ? flo : (v > fhi ? fhi : v);
                    const int q = (int)q8_rint(v) + o->zy;
                    const long long at = m * o->ysm + (long long)(n0 + j) * o->ysn;
                    if (o->y_signed)
                        ((int8_t*)o->y)[at] = (int8_t)q;
                    else
                        ((uint8_t*)o->y)[at] = (uint8_t)q;
                }
            }
        }
    }
}

/* x' = x shifted into the micro-kernel's domain (xor 0x80 flips between int8 and uint8 offset by 128) */
static inline uint8_t q8_shift(uint8_t v, uint8_t flip) { return v ^ flip; }

static int32_t* q8_bias_eff(const int32_t* bias, const int32_t* wsum, int N, int zx_dom)
{
    int32_t* b = (int32_t*)malloc(sizeof(int32_t) * (size_t)(N > 0 ? N : 1));
    if (!b) return NULL;
    for (int n = 0; n < N; ++n) b[n] = (bias ? bias[n] : 0) - zx_dom * wsum[n];
    return b;
}

/* zero point of x in the micro-kernel's domain */
static int q8_zx_domain(int zx, int x_signed, int dom_signed)
{
    if (x_signed == dom_signed) return zx;
    return dom_signed ? zx - 128 : zx + 128;
}

/* ---------------------------------------------------------------- GEMM: rows of x (M x K, row pitch ldx) */

typedef struct {
    const q8_isa_t* isa;
    const uint8_t* x;
    long long ldx;
    int M, K;
    uint8_t flip;
    q8_out_t o;
    int failed;
} q8_gemm_ctx;

static void q8_gemm_task(void* vctx, long long t)
{
    q8_gemm_ctx* c = (q8_gemm_ctx*)vctx;
    const long long m0 = t * Q8_MB;
    const int rows = (int)(c->M - m0 < Q8_MB ? c->M - m0 : Q8_MB);
    const int kp = c->o.kp;
    const int rows_pad = (rows + Q8_MR - 1) / Q8_MR * Q8_MR;
    uint8_t* xb = (uint8_t*)malloc((size_t)rows_pad * kp);
    if (!xb) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    memset(xb, 0, (size_t)rows_pad * kp);
    for (int r = 0; r < rows; ++r) {
        const uint8_t* src = c->x + (m0 + r) * c->ldx;
        uint8_t* dst = xb + (size_t)r * kp;
        for (int k = 0; k < c->K; ++k) dst[k] = q8_shift(src[k], c->flip);
    }
    q8_block(c->isa, xb, rows, m0, &c->o);
    free(xb);
}

int inferd_q8_gemm(const void* x, int x_signed, int zx, long long ldx, int M, int K, const int8_t* wp,
                   const int32_t* wsum, int N, const int32_t* bias, const float* mult, int zy, int lo, int hi, void* y,
                   int y_signed, long long ysm, long long ysn, int max_threads)
{
    const q8_isa_t* isa = q8_isa();
    int32_t* be = q8_bias_eff(bias, wsum, N, q8_zx_domain(zx, x_signed, isa->xsigned));
    if (!be) return -1;
    q8_gemm_ctx c = {isa, (const uint8_t*)x, ldx, M, K, (uint8_t)(x_signed != isa->xsigned ? 0x80 : 0),
                     {wp, be, mult, N, q8_kp(K), zy, lo, hi, y_signed, y, ysm, ysn}, 0};
    const long long tasks = (M + Q8_MB - 1) / Q8_MB;
    inferd_parallel(q8_gemm_task, &c, tasks, tasks * (long long)N * K < 200000 ? 1 : max_threads);
    free(be);
    return c.failed ? -1 : 0;
}

/* ---------------------------------------------------------------- conv: one image (C, H, W), output (N, OH, OW) */

typedef struct {
    const q8_isa_t* isa;
    const uint8_t* x;
    int C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW;
    uint8_t flip, pad; /* pad: the zero point in the micro-kernel's domain, as a byte */
    q8_out_t o;
    int failed;
} q8_conv_ctx;

static void q8_conv_task(void* vctx, long long t)
{
    q8_conv_ctx* c = (q8_conv_ctx*)vctx;
    const long long npix = (long long)c->OH * c->OW;
    const long long p0 = t * Q8_MB;
    const int rows = (int)(npix - p0 < Q8_MB ? npix - p0 : Q8_MB);
    const int kp = c->o.kp, K = c->C * c->kh * c->kw;
    const int rows_pad = (rows + Q8_MR - 1) / Q8_MR * Q8_MR;
    uint8_t* xb = (uint8_t*)malloc((size_t)rows_pad * kp);
    if (!xb) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    memset(xb, 0, (size_t)rows_pad * kp);
    const size_t plane = (size_t)c->H * c->W;
    for (int r = 0; r < rows; ++r) {
        const long long p = p0 + r;
        const int oh = (int)(p / c->OW), ow = (int)(p % c->OW);
        uint8_t* dst = xb + (size_t)r * kp;
        const int ih0 = oh * c->sh - c->pt, iw0 = ow * c->sw - c->pl;
        if (c->kh == 1 && c->kw == 1 && ih0 >= 0 && ih0 < c->H && iw0 >= 0 && iw0 < c->W) {
            const uint8_t* src = c->x + (size_t)ih0 * c->W + iw0;
            for (int ch = 0; ch < c->C; ++ch) dst[ch] = q8_shift(src[ch * plane], c->flip);
            continue;
        }
        int k = 0;
        for (int ch = 0; ch < c->C; ++ch) {
            const uint8_t* xc = c->x + ch * plane;
            for (int i = 0; i < c->kh; ++i) {
                const int ih = ih0 + i * c->dh;
                const int rin = ih >= 0 && ih < c->H;
                for (int j = 0; j < c->kw; ++j, ++k) {
                    const int iw = iw0 + j * c->dw;
                    dst[k] = rin && iw >= 0 && iw < c->W ? q8_shift(xc[(size_t)ih * c->W + iw], c->flip) : c->pad;
                }
            }
        }
        (void)K;
    }
    q8_block(c->isa, xb, rows, p0, &c->o);
    free(xb);
}

int inferd_q8_conv2d(const void* x, int x_signed, int zx, int C, int H, int W, const int8_t* wp, const int32_t* wsum,
                     int N, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW,
                     const int32_t* bias, const float* mult, int zy, int lo, int hi, void* y, int y_signed,
                     int max_threads)
{
    const q8_isa_t* isa = q8_isa();
    const int zxd = q8_zx_domain(zx, x_signed, isa->xsigned);
    int32_t* be = q8_bias_eff(bias, wsum, N, zxd);
    if (!be) return -1;
    const int K = C * kh * kw;
    q8_conv_ctx c = {isa, (const uint8_t*)x, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW,
                     (uint8_t)(x_signed != isa->xsigned ? 0x80 : 0), (uint8_t)zxd,
                     {wp, be, mult, N, q8_kp(K), zy, lo, hi, y_signed, y, 1, (long long)OH * OW}, 0};
    const long long npix = (long long)OH * OW, tasks = (npix + Q8_MB - 1) / Q8_MB;
    inferd_parallel(q8_conv_task, &c, tasks, npix * (long long)N * K < 200000 ? 1 : max_threads);
    free(be);
    return c.failed ? -1 : 0;
}

/* ---------------------------------------------------------------- depthwise: channel c of x with w[c] (kh x kw) */

typedef struct {
    const uint8_t* x;
    int x_signed, zx;
    const int8_t* w;
    int C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW;
    const int32_t* bias;
    const float* mult;
    int zy, lo, hi, y_signed;
    void* y;
    int failed;
} q8_dw_ctx;

INFERD_CLONES static void q8_dw_task(void* vctx, long long ch)
{
    q8_dw_ctx* c = (q8_dw_ctx*)vctx;
    int32_t* acc = (int32_t*)malloc(sizeof(int32_t) * (size_t)c->OW);
    int32_t* xr = (int32_t*)malloc(sizeof(int32_t) * (size_t)c->W);
    if (!acc || !xr) {
        free(acc);
        free(xr);
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const size_t plane = (size_t)c->H * c->W;
    const int8_t* wc = c->w + (size_t)ch * c->kh * c->kw;
    const float m = c->mult[ch], flo = (float)(c->lo - c->zy), fhi = (float)(c->hi - c->zy);
    const int32_t b = c->bias ? c->bias[ch] : 0;
    for (int oh = 0; oh < c->OH; ++oh) {
        for (int ow = 0; ow < c->OW; ++ow) acc[ow] = b;
        for (int i = 0; i < c->kh; ++i) {
            const int ih = oh * c->sh - c->pt + i * c->dh;
            if (ih < 0 || ih >= c->H) continue; /* padding reads the zero point: (zx - zx) * w = 0 */
            const uint8_t* src = c->x + ch * plane + (size_t)ih * c->W;
            if (c->x_signed)
                for (int iw = 0; iw < c->W; ++iw) xr[iw] = (int32_t)(int8_t)src[iw] - c->zx;
            else
                for (int iw = 0; iw < c->W; ++iw) xr[iw] = (int32_t)src[iw] - c->zx;
            for (int j = 0; j < c->kw; ++j) {
                const int32_t wv = wc[i * c->kw + j];
                const int off = j * c->dw - c->pl;
                /* ow range whose input column ow*sw + off lies in [0, W) */
                int lo_ow = off >= 0 ? 0 : (-off + c->sw - 1) / c->sw;
                int hi_ow = (c->W - 1 - off) >= 0 ? (c->W - 1 - off) / c->sw + 1 : 0;
                if (hi_ow > c->OW) hi_ow = c->OW;
                if (c->sw == 1)
                    for (int ow = lo_ow; ow < hi_ow; ++ow) acc[ow] += xr[ow + off] * wv;
                else
                    for (int ow = lo_ow; ow < hi_ow; ++ow) acc[ow] += xr[ow * c->sw + off] * wv;
            }
        }
        const size_t at = ch * (size_t)c->OH * c->OW + (size_t)oh * c->OW;
        for (int ow = 0; ow < c->OW; ++ow) {
            float v = (float)acc[ow] * m;
            v = v < flo ? flo : (v > fhi ? fhi : v);
            const int q = (int)q8_rint(v) + c->zy;
            if (c->y_signed)
                ((int8_t*)c->y)[at + ow] = (int8_t)q;
            else
                ((uint8_t*)c->y)[at + ow] = (uint8_t)q;
        }
    }
    free(acc);
    free(xr);
}

int inferd_q8_dwconv2d(const void* x, int x_signed, int zx, int C, int H, int W, const int8_t* w, int kh, int kw,
                       int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW, const int32_t* bias,
                       const float* mult, int zy, int lo, int hi, void* y, int y_signed, int max_threads)
{
    q8_dw_ctx c = {(const uint8_t*)x, x_signed, zx, w, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW,
                   bias, mult, zy, lo, hi, y_signed, y, 0};
    inferd_parallel(q8_dw_task, &c, C, (long long)C * OH * OW * kh * kw < 100000 ? 1 : max_threads);
    return c.failed ? -1 : 0;
}
