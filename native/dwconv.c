/* Depthwise convolution straight from NCHW rows, for K x K kernels (K = 3 or 5), stride 1 or 2, dilation 1,
 * channel multiplier 1, any padding.
 *
 * Why another form beside conv.c's (blocked / flat / rows): those copy each plane into a zero-padded plane (or a
 * channel-blocked tile) and copy the output out again, or pay bounds-checked scalar code for the border columns
 * of every row. Here each input row is copied once into a small ring of zero-padded row buffers (L1-resident:
 * K + S rows of ~OW*S floats), so every output row is one branch-free loop over the padded rows (K and S
 * literals: the taps unroll, stride-2 loads become vector permutes) written straight into the output, with the
 * bias and the activation applied in the same loop. Rows are copied one output row ahead of their first use,
 * so the copy's stores have drained before the vector loads that read them (shifted by the padding, such loads
 * would stall store forwarding).
 */
#define _POSIX_C_SOURCE 200112L
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

/* One output row: y[ow] = act(b + sum over taps of w[i][j] * rp[i][ow*S + j]). */
#define DWD_ROW_LOOP(F)                                                  \
    for (ptrdiff_t ow = 0; ow < OW; ++ow) {                              \
        float acc = b;                                                   \
        for (int i = 0; i < K; ++i)                                      \
            for (int j = 0; j < K; ++j) acc += wk[i * K + j] * r[i][ow * S + j]; \
        yr[ow] = F(acc);                                                 \
    }
#define DWD_ID(v) (v)

/* Stride 2 on deinterleaved rows: padded column 2*ow + j is phase j % 2 at ow + j / 2 (unit-stride loads). */
#define DWD_ROW_LOOP2(F)                                                 \
    for (ptrdiff_t ow = 0; ow < OW; ++ow) {                              \
        float acc = b;                                                   \
        for (int i = 0; i < K; ++i)                                      \
            for (int j = 0; j < K; ++j) acc += wk[i * K + j] * r[i][(j & 1) * Wh + ow + (j >> 1)]; \
        yr[ow] = F(acc);                                                 \
    }

/* Stride 1, two output rows from K + 1 padded rows: the K - 1 rows both read are loaded once for both (K = 3: 12
   vector loads per 32 outputs instead of 18; the loads, not the multiply-adds, bound this loop on Zen 4). */
#define DWD_ROW2_LOOP(F)                                                 \
    for (ptrdiff_t ow = 0; ow < OW; ++ow) {                              \
        float a0 = b, a1 = b;                                            \
        for (int i = 0; i <= K; ++i)                                     \
            for (int j = 0; j < K; ++j) {                                \
                const float v = r[i][ow + j];                            \
                if (i < K) a0 += wk[i * K + j] * v;                      \
                if (i > 0) a1 += wk[(i - 1) * K + j] * v;                \
            }                                                            \
        y0[ow] = F(a0);                                                  \
        y1[ow] = F(a1);                                                  \
    }

INFERD_INLINE void dwd_row2(float* restrict y0, float* restrict y1, const float* const* rp, const float* w, float b,
                            ptrdiff_t OW, int act, float p0, float p1, const int K)
{
    const float* r[6];
    float wk[25];
    for (int i = 0; i <= K; ++i) r[i] = rp[i];
    for (int t = 0; t < K * K; ++t) wk[t] = w[t];
    if (act == 0) {
        DWD_ROW2_LOOP(DWD_ID)
    } else {
        INFERD_ACT_SWITCH(act, DWD_ROW2_LOOP)
    }
}

INFERD_INLINE void dwd_row(float* restrict yr, const float* const* rp, const float* w, float b, ptrdiff_t OW,
                           ptrdiff_t Wh, int act, float p0, float p1, const int K, const int S)
{
    const float* r[5];
    float wk[25];
    for (int i = 0; i < K; ++i) r[i] = rp[i];
    for (int t = 0; t < K * K; ++t) wk[t] = w[t];
    if (S == 2) {
        if (act == 0) {
            DWD_ROW_LOOP2(DWD_ID)
        } else {
            INFERD_ACT_SWITCH(act, DWD_ROW_LOOP2)
        }
    } else if (act == 0) {
        DWD_ROW_LOOP(DWD_ID)
    } else {
        INFERD_ACT_SWITCH(act, DWD_ROW_LOOP)
    }
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
            /* even phase: padded column 2q = image column 2q - pl; odd phase: 2q + 1 - pl (zeros stay outside) */
            float* restrict e = d;
            float* restrict o = d + g->Wh;
            const ptrdiff_t e0 = (pl + 1) / 2, e1 = (W - 1 + pl) / 2 + 1;
            const ptrdiff_t o0 = pl / 2, o1 = (W + pl - 2 >= 0 ? (W + pl - 2) / 2 + 1 : 0);
            for (ptrdiff_t q = e0; q < e1; ++q) e[q] = src[2 * q - pl];
            for (ptrdiff_t q = o0; q < o1; ++q) o[q] = src[2 * q + 1 - pl];
        }
        g->tag[s] = ih;
    }
    return d;
}

INFERD_CLONES
static int dwd_range(const float* x, const float* w, const float* bias, float* y, int C, int H, int W, int K, int S,
                     int pt, int pl, int OH, int OW, int act, float p0, float p1)
{
    const ptrdiff_t need = (ptrdiff_t)(OW - 1) * S + K;
    ptrdiff_t Wp = need > (ptrdiff_t)pl + W ? need : (ptrdiff_t)pl + W;
    Wp = (Wp + 15) & ~(ptrdiff_t)15;
    dwd_ring g;
    g.R = S == 1 ? K + 3 : K + S; /* the rows of this output row (pair, at stride 1) and the next */
    g.S = S;
    g.Wh = 0;
    if (S == 2) {
        ptrdiff_t wh = (ptrdiff_t)OW + (K - 1) / 2;
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
    for (int c = 0; c < C; ++c) {
        const float* plane = x + (size_t)c * H * W;
        const float* wc = w + (size_t)c * K * K;
        const float b = bias ? bias[c] : 0.0f;
        float* yc = y + (size_t)c * OH * OW;
        for (int s = 0; s < g.R; ++s) g.tag[s] = INT_MIN;
        const float* rp[6];
        for (int i = 0; i < K + (S == 1); ++i) dwd_get(&g, plane, zero, -pt + i, H, W, pl);
        int oh = 0;
        if (S == 1) /* pairs of output rows, then a last odd one below */
            for (; oh + 1 < OH; oh += 2) {
                const int ih0 = oh - pt;
                for (int i = 0; i <= K; ++i) rp[i] = dwd_get(&g, plane, zero, ih0 + i, H, W, pl); /* already there */
                float* yr = yc + (size_t)oh * OW;
                if (K == 3)
                    dwd_row2(yr, yr + OW, rp, wc, b, OW, act, p0, p1, 3);
                else
                    dwd_row2(yr, yr + OW, rp, wc, b, OW, act, p0, p1, 5);
                /* the next pair's new rows, now (see the top) */
                if (oh + 2 < OH)
                    for (int i = K + 1; i < K + 3; ++i) dwd_get(&g, plane, zero, ih0 + i, H, W, pl);
            }
        for (; oh < OH; ++oh) {
            const int ih0 = oh * S - pt;
            for (int i = 0; i < K; ++i) rp[i] = dwd_get(&g, plane, zero, ih0 + i, H, W, pl); /* already there */
            float* yr = yc + (size_t)oh * OW;
            if (K == 3 && S == 1)
                dwd_row(yr, rp, wc, b, OW, g.Wh, act, p0, p1, 3, 1);
            else if (K == 3)
                dwd_row(yr, rp, wc, b, OW, g.Wh, act, p0, p1, 3, 2);
            else if (S == 1)
                dwd_row(yr, rp, wc, b, OW, g.Wh, act, p0, p1, 5, 1);
            else
                dwd_row(yr, rp, wc, b, OW, g.Wh, act, p0, p1, 5, 2);
            /* the next output row's new rows, now (see the top) */
            if (oh + 1 < OH)
                for (int i = K - S; i < K; ++i) dwd_get(&g, plane, zero, ih0 + S + i, H, W, pl);
        }
    }
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
