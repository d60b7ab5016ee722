/* Depthwise convolution straight from NCHW rows, for K x K kernels (K = 3 or 5), stride 1 or 2, dilation 1,
 * channel multiplier 1, any padding.
 *
 * Why another form beside conv.c's (blocked / flat / rows): those copy each plane into a zero-padded plane (or a
 * channel-blocked tile) and copy the output out again, or pay bounds-checked scalar code for the border columns
 * of every row. Two ways here, both with the bias and the activation in the same pass, written straight into
 * the output:
 * - in place (stride 1, "same" columns, the common case): output rows in pairs, read from the input rows
 *   themselves with whole vectors; the taps that fall left or right of the image are the edge vectors' loads
 *   shifted with zeros coming in (no copy at all: 2x faster than the row copies below on Zen 4).
 * - through a ring of zero-padded row copies (L1-resident: K + S rows of ~OW*S floats), stride 2 rows
 *   deinterleaved into even and odd phases so that every load is unit-stride. Rows are copied one output row
 *   ahead of their first use, so the copy's stores have drained before the vector loads that read them
 *   (shifted by the padding, such loads would stall store forwarding).
 */
#define _POSIX_C_SOURCE 200112L
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

/* The rows are computed on explicit generic vectors of the target's width: 8 floats on x86-64 (a ymm register;
   the SSE2 default clone takes them as pairs), 4 on aarch64 (a NEON q register: 8-float vectors there were
   lowered lane by lane and through the stack, 8,688 operations GCC split). Left to the auto-vectoriser, the
   scalar form of these loops ran at ~30% of the FMA peak on Zen 4 (runtime alias checks, a 16-wide main loop with
   8- and 1-wide epilogues on every 56-wide row). */
#if defined(__GNUC__) && !defined(__clang__)
/* 32-byte vectors passed to and returned from the helpers below: all always_inline, so no call crosses the ABI
   that GCC warns about for builds without AVX */
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef inferd_gvf dwv;
typedef inferd_gvi dwvi;
#define DWV INFERD_GV
/* a lane permutation of two vectors (lanes DWV.. are b's): the same on GCC and clang, like conv.c's SHUF4 */
#if DWV == 4
#if defined(__clang__)
#define DWV_SHUF4(a, b, i0, i1, i2, i3) __builtin_shufflevector(a, b, i0, i1, i2, i3)
#else
#define DWV_SHUF4(a, b, i0, i1, i2, i3) __builtin_shuffle(a, b, (dwvi){i0, i1, i2, i3})
#endif
/* even and odd lanes of lo:hi; u shifted right by 1 or 2 lanes (or left: -1, -2) with z's lanes coming in */
#define DWV_EVEN(lo, hi) DWV_SHUF4(lo, hi, 0, 2, 4, 6)
#define DWV_ODD(lo, hi) DWV_SHUF4(lo, hi, 1, 3, 5, 7)
#define DWV_SHR1(u, z) DWV_SHUF4(u, z, 4, 0, 1, 2)
#define DWV_SHR2(u, z) DWV_SHUF4(u, z, 4, 4, 0, 1)
#define DWV_SHL1(u, z) DWV_SHUF4(u, z, 1, 2, 3, 4)
#define DWV_SHL2(u, z) DWV_SHUF4(u, z, 2, 3, 4, 4)
#else
#if defined(__clang__)
#define DWV_SHUF(a, b, i0, i1, i2, i3, i4, i5, i6, i7) __builtin_shufflevector(a, b, i0, i1, i2, i3, i4, i5, i6, i7)
#else
#define DWV_SHUF(a, b, i0, i1, i2, i3, i4, i5, i6, i7) \
    __builtin_shuffle(a, b, (dwvi){i0, i1, i2, i3, i4, i5, i6, i7})
#endif
#define DWV_EVEN(lo, hi) DWV_SHUF(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14)
#define DWV_ODD(lo, hi) DWV_SHUF(lo, hi, 1, 3, 5, 7, 9, 11, 13, 15)
#define DWV_SHR1(u, z) DWV_SHUF(u, z, 8, 0, 1, 2, 3, 4, 5, 6)
#define DWV_SHR2(u, z) DWV_SHUF(u, z, 8, 8, 0, 1, 2, 3, 4, 5)
#define DWV_SHL1(u, z) DWV_SHUF(u, z, 1, 2, 3, 4, 5, 6, 7, 8)
#define DWV_SHL2(u, z) DWV_SHUF(u, z, 2, 3, 4, 5, 6, 7, 8, 8)
#endif

/* The tap loops fully unrolled (K, i and j literals: the weights stay in registers, the edge shifts are constant
   permutes); GCC leaves the 6 x 5 loops of K = 5 rolled otherwise, which ran 3x slower than K = 3 per tap. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 8
#define DWD_UNROLL _Pragma("GCC unroll 8")
#else
#define DWD_UNROLL
#endif

INFERD_INLINE dwv dwv_ld(const float* p)
{
    dwv v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The vector's first n lanes to y (n = DWV but at a row's ragged end), with the activation va (a literal: a code
   with a vector form, or 0). The costly codes (a polynomial each) go through act_inplace once a whole plane is
   stored: per row, on 7-56 values, its loop ran mostly in its scalar tail (SiLU took 6x the convolution's time
   on 480x14x14). */
INFERD_INLINE void dwv_st(float* y, const dwv* s, ptrdiff_t n, const int va, float p0, float p1)
{
    dwv v = *s;
    INFERD_VACT(dwv, dwvi, v, va, p0, p1);
    if (n == DWV)
        memcpy(y, &v, sizeof v);
    else
        memcpy(y, &v, sizeof(float) * (size_t)n);
}

/* A row's vectors: whole ones, then the ragged end as one more whole vector ending at the row's end (it
   recomputes a few outputs, storing the same values), or a partial one where the row is under a vector. */
#define DWD_ROW_VECS(VEC)                        \
    do {                                         \
        ptrdiff_t ow = 0;                        \
        for (; ow + DWV <= OW; ow += DWV)        \
            VEC(ow, DWV);                        \
        if (ow < OW) {                           \
            if (OW >= DWV)                       \
                VEC(OW - DWV, DWV);              \
            else                                 \
                VEC(ow, OW - ow);                \
        }                                        \
    } while (0)

/* Row pairs: tap (i, j)'s vector v feeds output row 0 through kernel row i (i < K) and output row 1 through kernel
   row i - 1 (i > 0), each into two partial sums by the kernel row's parity (short multiply-add chains). */
#define DWD_PAIR_FMA(v, i, j)                                \
    do {                                                     \
        if ((i) < K) {                                       \
            if ((i) & 1)                                     \
                a1 += wk[(i) * K + (j)] * (v);               \
            else                                             \
                a0 += wk[(i) * K + (j)] * (v);               \
        }                                                    \
        if ((i) > 0) {                                       \
            if (((i) - 1) & 1)                               \
                c1 += wk[((i) - 1) * K + (j)] * (v);         \
            else                                             \
                c0 += wk[((i) - 1) * K + (j)] * (v);         \
        }                                                    \
    } while (0)

/* Columns [ow, ow + n) of output rows y0 and y1 (stride 1) from K + 1 padded rows: the K - 1 rows both read are
   loaded once for both. Two partial sums per output row keep the multiply-add chains short. */
INFERD_INLINE void dwd_vec2(float* restrict y0, float* restrict y1, const float* const* r, const dwv* wk, float b,
                            ptrdiff_t ow, ptrdiff_t n, const int va, float p0, float p1, const int K)
{
    dwv a0 = (dwv){0} + b, a1 = (dwv){0}, c0 = (dwv){0} + b, c1 = (dwv){0};
    DWD_UNROLL
    for (int i = 0; i <= K; ++i)
        DWD_UNROLL
        for (int j = 0; j < K; ++j) {
            const dwv v = dwv_ld(r[i] + ow + j);
            DWD_PAIR_FMA(v, i, j);
        }
    const dwv s0 = a0 + a1, s1 = c0 + c1;
    dwv_st(y0 + ow, &s0, n, va, p0, p1);
    dwv_st(y1 + ow, &s1, n, va, p0, p1);
}

/* Output rows y0 and y1 (stride 1) from K + 1 padded rows (each readable to ceil(OW / DWV) * DWV + K - 1). */
INFERD_INLINE void dwd_row2(float* restrict y0, float* restrict y1, const float* const* r, const float* w, float b,
                            ptrdiff_t OW, const int va, float p0, float p1, const int K)
{
    dwv wk[25];
    for (int t = 0; t < K * K; ++t) wk[t] = (dwv){0} + w[t];
#define DWD_VEC2(o, n) dwd_vec2(y0, y1, r, wk, b, o, n, va, p0, p1, K)
    DWD_ROW_VECS(DWD_VEC2);
#undef DWD_VEC2
}

/* Columns [ow, ow + n) of one output row from K padded rows; at stride 2 the rows are deinterleaved (padded
   column 2 * ow + j is phase j % 2 at ow + j / 2, Wh floats after the even phase for the odd one), so every
   load is unit-stride. */
INFERD_INLINE void dwd_vec(float* restrict yr, const float* const* r, const dwv* wk, float b, ptrdiff_t ow,
                           ptrdiff_t n, ptrdiff_t Wh, const int va, float p0, float p1, const int K, const int S)
{
    dwv a0 = (dwv){0} + b, a1 = (dwv){0};
    DWD_UNROLL
    for (int i = 0; i < K; ++i)
        DWD_UNROLL
        for (int j = 0; j < K; ++j) {
            const dwv v = dwv_ld(S == 1 ? r[i] + ow + j : r[i] + (j & 1) * Wh + ow + (j >> 1));
            if (i & 1)
                a1 += wk[i * K + j] * v;
            else
                a0 += wk[i * K + j] * v;
        }
    const dwv s0 = a0 + a1;
    dwv_st(yr + ow, &s0, n, va, p0, p1);
}

INFERD_INLINE void dwd_row(float* restrict yr, const float* const* r, const float* w, float b, ptrdiff_t OW,
                           ptrdiff_t Wh, const int va, float p0, float p1, const int K, const int S)
{
    dwv wk[25];
    for (int t = 0; t < K * K; ++t) wk[t] = (dwv){0} + w[t];
#define DWD_VEC(o, n) dwd_vec(yr, r, wk, b, o, n, Wh, va, p0, p1, K, S)
    DWD_ROW_VECS(DWD_VEC);
#undef DWD_VEC
}

/* CALL(va) with the vector activation code a literal (its branches fold away): act itself where it has a
   vector form, else 0 (the costly codes, applied by act_inplace). */
#define DWD_ACT_CASES(CALL)  \
    switch (act) {           \
    case 1: CALL(1); break;  \
    case 2: CALL(2); break;  \
    case 3: CALL(3); break;  \
    case 6: CALL(6); break;  \
    case 7: CALL(7); break;  \
    default: CALL(0); break; \
    }

typedef struct {
    float* ring;  /* R rows of Wp floats, zero outside [pl, pl + W) */
    int tag[8];   /* the input row each slot holds, INT_MIN for none */
    int R, S;
    ptrdiff_t Wp; /* floats per slot */
    ptrdiff_t Wh; /* stride 2: floats per phase (the odd phase starts Wh after the even one) */
} dwd_ring;

/* The padded copy of input row ih of plane (a zero row outside the image). */
INFERD_INLINE const float* dwd_get(dwd_ring* g, const float* plane, const float* zero, int ih, int H, int W, int pl)
{
    if (ih < 0 || ih >= H) return zero;
    const int s = ih % g->R;
    float* d = g->ring + (size_t)s * g->Wp;
    if (g->tag[s] != ih) {
        const float* restrict src = plane + (size_t)ih * W;
        if (g->S == 1) {
            memcpy(d + pl, src, sizeof(float) * (size_t)W);
        } else {
            /* even phase: padded column 2q = image column 2q - pl; odd phase: 2q + 1 - pl (zeros stay outside).
               So image column 2m goes to the phase of pl's parity at m + pl / 2, column 2m + 1 to the other at
               m + (pl + 1) / 2: 16 columns at a time through two shuffles (a scalar loop over the two phases
               cost ~60% of a stride-2 layer on Zen 4), the last 16 (from an even column) overlapping the rest */
            float* ph[2] = {d, d + g->Wh};
            float* restrict de = ph[pl & 1] + pl / 2;
            float* restrict dod = ph[!(pl & 1)] + (pl + 1) / 2;
            ptrdiff_t c = 0;
            if (W >= 2 * DWV) {
                const ptrdiff_t last = (W - 2 * DWV) & ~(ptrdiff_t)1;
                for (;; c += 2 * DWV) {
                    const ptrdiff_t cc = c < last ? c : last;
                    const dwv lo = dwv_ld(src + cc), hi = dwv_ld(src + cc + DWV);
                    const dwv ev = DWV_EVEN(lo, hi);
                    const dwv od = DWV_ODD(lo, hi);
                    memcpy(de + cc / 2, &ev, sizeof ev);
                    memcpy(dod + cc / 2, &od, sizeof od);
                    if (cc == last) break;
                }
                c = last + 2 * DWV;
            }
            for (ptrdiff_t m = c / 2; 2 * m < W; ++m) de[m] = src[2 * m];
            for (ptrdiff_t m = c / 2; 2 * m + 1 < W; ++m) dod[m] = src[2 * m + 1];
        }
        g->tag[s] = ih;
    }
    return d;
}

/* Stride 1, "same" columns (pl = (K - 1) / 2, OW = W >= DWV + pl): rows read in place, no copies. Whole vectors
   from column 0; the first one's taps left of the image are its loads shifted right with zeros coming in, the
   last vector ends at column W - 1 (it may recompute a few columns, storing the same values) and its taps right
   of the image are loads shifted left likewise. Rows outside the image are the zero row. */
INFERD_INLINE dwv dwv_shift_ld(const float* p, const int s) /* lane l = p[l - s], zeros shifting in */
{
    const dwv z = {0}, u = dwv_ld(p);
    switch (s) {
    case 1: return DWV_SHR1(u, z);
    case 2: return DWV_SHR2(u, z);
    case -1: return DWV_SHL1(u, z);
    default: return DWV_SHL2(u, z);
    }
}

/* Columns [ow, ow + DWV) of output rows y0 and y1 (y1 NULL: the plane's last, odd row) from rows r[0..K];
   edge 1: ow = 0, edge 2: ow = W - DWV. The ring's dwd_vec2 above with the loads shifted by -pl and the edge
   taps (the sums shared through DWD_PAIR_FMA): one function for both (a column offset and the edge as literals)
   ran 3-10% slower on the in-place layers (0.041 vs 0.037 ms for 576x14x14 on one thread). */
INFERD_INLINE void dwd_same_vec(float* restrict y0, float* restrict y1, const float* const* r, const dwv* wk,
                                float b, ptrdiff_t ow, const int edge, const int va, float p0, float p1, const int K)
{
    const int pl = (K - 1) / 2;
    dwv a0 = (dwv){0} + b, a1 = (dwv){0}, c0 = (dwv){0} + b, c1 = (dwv){0};
    DWD_UNROLL
    for (int i = 0; i <= K; ++i)
        DWD_UNROLL
        for (int j = 0; j < K; ++j) {
            dwv v;
            if (edge == 1 && j < pl)
                v = dwv_shift_ld(r[i], pl - j);
            else if (edge == 2 && j > pl)
                v = dwv_shift_ld(r[i] + ow, pl - j);
            else
                v = dwv_ld(r[i] + ow - pl + j);
            DWD_PAIR_FMA(v, i, j);
        }
    const dwv s0 = a0 + a1, s1 = c0 + c1;
    dwv_st(y0 + ow, &s0, DWV, va, p0, p1);
    if (y1) dwv_st(y1 + ow, &s1, DWV, va, p0, p1);
}

INFERD_INLINE void dwd_same_rows(float* restrict y0, float* restrict y1, const float* const* r, const float* w,
                                 float b, int W, const int va, float p0, float p1, const int K)
{
    dwv wk[25];
    for (int t = 0; t < K * K; ++t) wk[t] = (dwv){0} + w[t];
    dwd_same_vec(y0, y1, r, wk, b, 0, 1, va, p0, p1, K);
    /* the middle's last vector shifted back to end where the last one starts (its right taps stay inside), but
       no further left than pl, where its left taps would leave the row (K = 5 on 17 columns had read column -1
       for output column 1: 2 * DWV < W < 2 * DWV + pl) */
    const ptrdiff_t back = W - 2 * DWV > (K - 1) / 2 ? W - 2 * DWV : (K - 1) / 2;
    for (ptrdiff_t ow = DWV; ow < W - DWV; ow += DWV)
        dwd_same_vec(y0, y1, r, wk, b, ow + DWV > W - DWV ? back : ow, 0, va, p0, p1, K);
    dwd_same_vec(y0, y1, r, wk, b, W - DWV, 2, va, p0, p1, K);
}

INFERD_INLINE void dwd_same_planes(const float* zero, const float* x, const float* w, const float* bias, float* y,
                                   int C, int H, int W, int pt, int OH, const int va, int act, float p0, float p1,
                                   const int K)
{
    for (int c = 0; c < C; ++c) {
        const float* plane = x + (size_t)c * H * W;
        const float* wc = w + (size_t)c * K * K;
        const float b = bias ? bias[c] : 0.0f;
        float* yc = y + (size_t)c * OH * W;
        for (int oh = 0; oh < OH; oh += 2) {
            const float* r[6];
            for (int i = 0; i <= K; ++i) {
                const int ih = oh - pt + i;
                r[i] = ih >= 0 && ih < H ? plane + (size_t)ih * W : zero;
            }
            float* y0 = yc + (size_t)oh * W;
            dwd_same_rows(y0, oh + 1 < OH ? y0 + W : NULL, r, wc, b, W, va, p0, p1, K);
        }
        if (INFERD_ACT_COSTLY(act)) act_inplace(yc, (ptrdiff_t)OH * W, act, p0, p1);
    }
}

/* Channels [0, C) with K, S and the vector activation va literals. */
INFERD_INLINE void dwd_planes(dwd_ring* g, const float* zero, const float* x, const float* w, const float* bias,
                              float* y, int C, int H, int W, int pt, int pl, int OH, int OW, const int va, int act,
                              float p0, float p1, const int K, const int S)
{
    for (int c = 0; c < C; ++c) {
        const float* plane = x + (size_t)c * H * W;
        const float* wc = w + (size_t)c * K * K;
        const float b = bias ? bias[c] : 0.0f;
        float* yc = y + (size_t)c * OH * OW;
        for (int s = 0; s < g->R; ++s) g->tag[s] = INT_MIN;
        const float* rp[6];
        for (int i = 0; i < K + (S == 1); ++i) dwd_get(g, plane, zero, -pt + i, H, W, pl);
        int oh = 0;
        if (S == 1) /* pairs of output rows, then a last odd one below */
            for (; oh + 1 < OH; oh += 2) {
                const int ih0 = oh - pt;
                for (int i = 0; i <= K; ++i) rp[i] = dwd_get(g, plane, zero, ih0 + i, H, W, pl); /* already there */
                float* yr = yc + (size_t)oh * OW;
                dwd_row2(yr, yr + OW, rp, wc, b, OW, va, p0, p1, K);
                /* the next pair's new rows, now (see the top) */
                if (oh + 2 < OH)
                    for (int i = K + 1; i < K + 3; ++i) dwd_get(g, plane, zero, ih0 + i, H, W, pl);
            }
        for (; oh < OH; ++oh) {
            const int ih0 = oh * S - pt;
            for (int i = 0; i < K; ++i) rp[i] = dwd_get(g, plane, zero, ih0 + i, H, W, pl); /* already there */
            dwd_row(yc + (size_t)oh * OW, rp, wc, b, OW, g->Wh, va, p0, p1, K, S);
            /* the next output row's new rows, now (see the top) */
            if (oh + 1 < OH)
                for (int i = K - S; i < K; ++i) dwd_get(g, plane, zero, ih0 + S + i, H, W, pl);
        }
        if (INFERD_ACT_COSTLY(act)) act_inplace(yc, (ptrdiff_t)OH * OW, act, p0, p1);
    }
}

/* Each (activation literal, K, S) variant is a function of its own. Inlined into dwd_range, the 36 of them made
   one function of ~470 KB of code, whose RTL passes (PRE, load CSE after reload, register liveness) GCC runs
   in time superlinear in a function's size: 35 s of -O3 for this file, most of the native build and of the
   test suite's three harness builds. Apart they compile the same code (same literals) in a fraction of that;
   a call per channel range costs nothing. */
#define DWD_SAME_FN(va, k)                                                                                       \
    INFERD_CLONES __attribute__((noinline)) static void dwd_same_##va##_##k(                                    \
        const float* zero, const float* x, const float* w, const float* bias, float* y, int C, int H, int W,     \
        int pt, int OH, int act, float p0, float p1)                                                            \
    {                                                                                                            \
        dwd_same_planes(zero, x, w, bias, y, C, H, W, pt, OH, va, act, p0, p1, k);                              \
    }
#define DWD_PLANES_FN(va, k, s)                                                                                  \
    INFERD_CLONES __attribute__((noinline)) static void dwd_planes_##va##_##k##_##s(                            \
        dwd_ring* g, const float* zero, const float* x, const float* w, const float* bias, float* y, int C,     \
        int H, int W, int pt, int pl, int OH, int OW, int act, float p0, float p1)                              \
    {                                                                                                            \
        dwd_planes(g, zero, x, w, bias, y, C, H, W, pt, pl, OH, OW, va, act, p0, p1, k, s);                     \
    }
#define DWD_FNS(va)                                                                            \
    DWD_SAME_FN(va, 3) DWD_SAME_FN(va, 5) DWD_PLANES_FN(va, 3, 1) DWD_PLANES_FN(va, 3, 2) \
    DWD_PLANES_FN(va, 5, 1) DWD_PLANES_FN(va, 5, 2)
DWD_FNS(0)
DWD_FNS(1)
DWD_FNS(2)
DWD_FNS(3)
DWD_FNS(6)
DWD_FNS(7)
#undef DWD_FNS
#undef DWD_PLANES_FN
#undef DWD_SAME_FN

int inferd_dwconv2d_direct_inplace(int k, int s, int pl, int W, int OW)
{
    return s == 1 && pl == (k - 1) / 2 && OW == W && W >= DWV + pl;
}

INFERD_CLONES
static int dwd_range(const float* x, const float* w, const float* bias, float* y, int C, int H, int W, int K, int S,
                     int pt, int pl, int OH, int OW, int act, float p0, float p1)
{
    /* the row functions read whole vectors: up to ceil(OW / DWV) * DWV + K - 1 floats of a row (of a phase at
       stride 2, from its start + (K - 1) / 2); what lies past the image is zero or feeds only unstored lanes */
    if (inferd_dwconv2d_direct_inplace(K, S, pl, W, OW)) {
        float* zero = (float*)calloc((size_t)W + DWV, sizeof(float));
        if (!zero) return -1;
#define DWD_SAME(va)                                                            \
    do {                                                                        \
        if (K == 3)                                                             \
            dwd_same_##va##_3(zero, x, w, bias, y, C, H, W, pt, OH, act, p0, p1); \
        else                                                                    \
            dwd_same_##va##_5(zero, x, w, bias, y, C, H, W, pt, OH, act, p0, p1); \
    } while (0)
        DWD_ACT_CASES(DWD_SAME)
#undef DWD_SAME
        free(zero);
        return 0;
    }
    const ptrdiff_t OWv = ((ptrdiff_t)OW + DWV - 1) / DWV * DWV;
    ptrdiff_t Wp = OWv + K - 1 > (ptrdiff_t)pl + W ? OWv + K - 1 : (ptrdiff_t)pl + W;
    Wp = (Wp + 15) & ~(ptrdiff_t)15;
    dwd_ring g;
    g.R = S == 1 ? K + 3 : K + S; /* the rows of this output row (pair, at stride 1) and the next */
    g.S = S;
    g.Wh = 0;
    if (S == 2) {
        ptrdiff_t wh = OWv + (K - 1) / 2;
        if (wh < ((ptrdiff_t)pl + W + 1) / 2) wh = ((ptrdiff_t)pl + W + 1) / 2;
        g.Wh = (wh + 15) & ~(ptrdiff_t)15;
        Wp = 2 * g.Wh;
    }
    g.Wp = Wp;
    float* buf = (float*)malloc(sizeof(float) * (size_t)(g.R + 1) * Wp);
    if (!buf) return -1;
    memset(buf, 0, sizeof(float) * (size_t)(g.R + 1) * Wp);
    g.ring = buf;
    const float* zero = buf + (size_t)g.R * Wp;
#define DWD_PLANES(va, k, s) \
    dwd_planes_##va##_##k##_##s(&g, zero, x, w, bias, y, C, H, W, pt, pl, OH, OW, act, p0, p1)
#define DWD_KS(va)               \
    do {                         \
        if (K == 3 && S == 1)    \
            DWD_PLANES(va, 3, 1); \
        else if (K == 3)         \
            DWD_PLANES(va, 3, 2); \
        else if (S == 1)         \
            DWD_PLANES(va, 5, 1); \
        else                     \
            DWD_PLANES(va, 5, 2); \
    } while (0)
    DWD_ACT_CASES(DWD_KS)
#undef DWD_KS
#undef DWD_PLANES
    free(buf);
    return 0;
}

int inferd_dwconv2d_direct_applies(int mult, int kh, int kw, int sh, int sw, int dh, int dw)
{
    return mult == 1 && kh == kw && (kh == 3 || kh == 5) && sh == sw && (sh == 1 || sh == 2) && dh == 1 && dw == 1;
}

typedef struct {
    const float *x, *w, *bias;
    float* y;
    int C, H, W, K, S, pt, pl, OH, OW, act;
    float p0, p1;
    int n, failed;
} dwd_job;

static void dwd_task(void* p, long long t)
{
    dwd_job* j = (dwd_job*)p;
    const int lo = (int)((long long)j->C * t / j->n), hi = (int)((long long)j->C * (t + 1) / j->n);
    if (hi <= lo) return;
    if (dwd_range(j->x + (size_t)lo * j->H * j->W, j->w + (size_t)lo * j->K * j->K, j->bias ? j->bias + lo : NULL,
                  j->y + (size_t)lo * j->OH * j->OW, hi - lo, j->H, j->W, j->K, j->S, j->pt, j->pl, j->OH, j->OW,
                  j->act, j->p0, j->p1) != 0)
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
}

int inferd_dwconv2d_direct(const float* x, const float* w, const float* bias, float* y, int C, int H, int W, int k, int s,
                           int pt, int pl, int OH, int OW, int act, float p0, float p1)
{
    if (!inferd_dwconv2d_direct_applies(1, k, k, s, s, 1, 1)) return -2;
    if (C <= 0 || OH <= 0 || OW <= 0) return 0;
    dwd_job j = {x, w, bias, y, C, H, W, k, s, pt, pl, OH, OW, act, p0, p1, 0, 0};
    j.n = inferd_pool_chunks(C, (double)C * OH * OW * k * k);
    inferd_parallel(dwd_task, &j, j.n, 0);
    return j.failed ? -1 : 0;
}
