/* Direct convolution, group 1: the GEMM's micro-kernel reading the input planes in place.
 *
 * Why: a convolution is a GEMM whose column matrix row (c, i, j) holds input plane c shifted by the tap. At
 * stride 1, with the input copied once into planes whose rows share their padding (row pitch
 * P = W + max(pl, pr): the right padding of one row is the left padding of the next), output position (oh, ow)
 * is flat index q = oh * P + ow and row (c, i, j) of column q sits at plane c + i*dh*P + j*dw + (D - pl) + q for
 * every q: each row of a column block is a contiguous run of the padded input. At stride s the input is split
 * into s x s phase planes (phase (a, b) holds padded pixels (s*r + a, s*t + b)), where tap (i, j) reads phase
 * (i*dh % sh, j*dw % sw) shifted by (i*dh / sh, j*dw / sw): a stride-1 problem again, with the same offsets
 * table. gemm.c's micro-kernel reads those runs in place through the table (inferd_gemm_ukoff), so neither
 * im2col's column matrix nor the implicit GEMM's gathered panels nor Winograd's transforms sit between the
 * input and the FMAs. A tile of nr positions runs across row ends; the columns per row past OW are computed
 * and dropped (1/14 of the work on a 13x13 map at stride 1, 1/29 on 3x3/2 from 56x56).
 *
 * Weights: the GEMM's packed A (inferd_gemm_pack_a of the (M, C*kh*kw) filter matrix), the same as im2col's.
 */
#define _POSIX_C_SOURCE 200112L
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

#define DMAXT 49 /* taps: up to 7x7 */
#define DMRP 8   /* rows per packed A panel (gemm.c's MRP) */
#define DNR_MAX 64

static int cd_imin(int a, int b) { return a < b ? a : b; }
static int cd_imax(int a, int b) { return a > b ? a : b; }

int inferd_conv_direct_applies(int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int pb, int pr)
{
    if (kh < 1 || kw < 1 || kh * kw > DMAXT || sh < 1 || sw < 1 || dh < 1 || dw < 1 || sh > 4 || sw > 4) return 0;
    return pt >= 0 && pl >= 0 && pb >= 0 && pr >= 0;
}

/* The layout: nph phase planes per channel (1 at stride 1), each rows x P floats; shared: stride 1 with the rows
   sharing their padding (offset D = max(pl, pr) of the data in a row). After the last plane, the junk positions
   of the last tile read up to a row and two tiles further. Before the planes, the K row offsets (int64, as 2K
   floats). pr_eff: the columns the output reaches past the input's right edge (negative where a stride leaves
   the last ones unread), likewise pb_eff. */
typedef struct {
    int shared, nph, rows;
    long long P, D, plane;
} cd_layout;

static cd_layout cd_layout_of(int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int OH,
                              int OW)
{
    cd_layout L;
    const int ekh = (kh - 1) * dh, ekw = (kw - 1) * dw;
    const int pr = (OW - 1) * sw + ekw + 1 - W - pl;
    (void)H, (void)pt;
    L.shared = sh == 1 && sw == 1 && pr >= 0 && cd_imin(pl, pr) <= ekw;
    if (L.shared) {
        L.nph = 1;
        L.D = cd_imax(pl, pr);
        L.P = (long long)W + L.D;
        L.rows = OH + ekh;
    } else {
        L.nph = sh * sw;
        L.D = 0;
        L.P = (long long)OW + ekw / sw;
        L.rows = OH + ekh / sh;
    }
    L.plane = (long long)L.rows * L.P;
    return L;
}

static long long cd_tail(long long P, int ekw) { return P + ekw + 2 * DNR_MAX + 16; }

long long inferd_conv_direct_workspace(int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt,
                                       int pl, int OH, int OW)
{
    const cd_layout L = cd_layout_of(H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW);
    return 2LL * C * kh * kw + (long long)C * L.nph * L.plane + cd_tail(L.P, (kw - 1) * dw);
}

typedef struct {
    const float* x;
    int C, H, W, kh, kw, sh, sw, pt, pl, OH, OW, ekw;
    cd_layout L;
    const float* ap;
    int M, K;
    const float *bias, *res;
    float* y;
    int act;
    float p0, p1;
    const long long* boff;
    float* xp;
    inferd_ukoff_fn uk;
    int mrk, nr;
    int tiles, chunk, nchunks;
} cd_job;

/* Channel c of x into its plane(s): zero where the window leaves the input. */
static void cd_pad_task(void* p, long long c)
{
    cd_job* j = (cd_job*)p;
    const cd_layout* L = &j->L;
    const long long P = L->P;
    const float* restrict s = j->x + (size_t)c * j->H * j->W;
    float* restrict d0 = j->xp + (size_t)c * L->nph * L->plane;
    if (L->shared) {
        for (int r = 0; r < L->rows; ++r) {
            float* restrict dr = d0 + (size_t)r * P;
            const int ih = r - j->pt;
            if (ih < 0 || ih >= j->H) {
                memset(dr, 0, sizeof(float) * (size_t)P);
                continue;
            }
            memset(dr, 0, sizeof(float) * (size_t)L->D);
            memcpy(dr + L->D, s + (size_t)ih * j->W, sizeof(float) * (size_t)j->W);
        }
    } else {
        for (int a = 0; a < j->sh; ++a)
            for (int b = 0; b < j->sw; ++b) {
                float* restrict d = d0 + (size_t)(a * j->sw + b) * L->plane;
                /* phase columns t with 0 <= sw*t + b - pl < W */
                const int off = b - j->pl;
                int t0 = off >= 0 ? 0 : (-off + j->sw - 1) / j->sw;
                int t1 = j->W - 1 - off >= 0 ? (j->W - 1 - off) / j->sw + 1 : 0;
                if (t0 > P) t0 = (int)P;
                if (t1 > P) t1 = (int)P;
                if (t1 < t0) t1 = t0;
                for (int r = 0; r < L->rows; ++r) {
                    float* restrict dr = d + (size_t)r * P;
                    const int ih = j->sh * r + a - j->pt;
                    if (ih < 0 || ih >= j->H || t0 == t1) {
                        memset(dr, 0, sizeof(float) * (size_t)P);
                        continue;
                    }
                    const float* restrict sr = s + (size_t)ih * j->W + off;
                    for (int t = 0; t < t0; ++t) dr[t] = 0.0f;
                    if (j->sw == 2)
                        for (int t = t0; t < t1; ++t) dr[t] = sr[2 * t];
                    else
                        for (int t = t0; t < t1; ++t) dr[t] = sr[(ptrdiff_t)t * j->sw];
                    for (int t = t1; t < P; ++t) dr[t] = 0.0f;
                }
            }
    }
    if (c == j->C - 1)
        memset(d0 + (size_t)L->nph * L->plane, 0, sizeof(float) * (size_t)cd_tail(P, j->ekw));
}

/* A tile's runs of valid positions (ow < OW): position p of the tile, length n, offset o in each output plane. */
typedef struct {
    int p, n;
    long long o;
} cd_run;

/* Rows m0..m0+rows of a tile's raw sums t (pitch nr) to y through the runs: + bias (+ res), activation. The bias
   and the activation go over whole tile rows (nr values, the junk positions too: whole vectors, where the
   costly activations' vector loops have no scalar tail), the residual over the runs. */
INFERD_INLINE void cd_store(const cd_job* j, float* t, const cd_run* run, int nrun, int m0, int rows)
{
    const long long ohw = (long long)j->OH * j->OW;
    const int nr = j->nr;
    for (int i = 0; i < rows; ++i) {
        const int m = m0 + i;
        float* restrict tr = t + (size_t)i * nr;
        float* restrict ym = j->y + (size_t)m * ohw;
        const float b = j->bias ? j->bias[m] : 0.0f;
        for (int k = 0; k < nr; ++k) tr[k] += b;
        if (j->res) {
            const float* restrict rm = j->res + (size_t)m * ohw;
            for (int r = 0; r < nrun; ++r)
                for (int k = 0; k < run[r].n; ++k) tr[run[r].p + k] += rm[run[r].o + k];
        }
        if (j->act) act_inplace(tr, nr, j->act, j->p0, j->p1);
        for (int r = 0; r < nrun; ++r) memcpy(ym + run[r].o, tr + run[r].p, sizeof(float) * (size_t)run[r].n);
    }
}

INFERD_CLONES
static void cd_task(void* p, long long task)
{
    cd_job* j = (cd_job*)p;
    const int panel = (int)(task / j->nchunks), ch = (int)(task % j->nchunks);
    const int nr = j->nr, m0 = panel * DMRP, rows = cd_imin(DMRP, j->M - m0);
    const int t0 = ch * j->chunk, t1 = cd_imin(j->tiles, t0 + j->chunk);
    const float* a = j->ap + (size_t)panel * j->K * DMRP;
    const long long P = j->L.P, nq = (long long)j->OH * P;
    float t[DMRP * DNR_MAX] __attribute__((aligned(64)));
    cd_run run[DNR_MAX];
    for (int ti = t0; ti < t1; ++ti) {
        const long long q = (long long)ti * nr;
        for (int sub = 0; sub < rows; sub += j->mrk) j->uk(j->K, a + sub, j->xp + q, j->boff, t + (size_t)sub * nr);
        /* runs of valid positions (ow < OW): each row's run is contiguous in y */
        int nrun = 0;
        for (int k = 0; k < nr && q + k < nq;) {
            const long long qq = q + k;
            const int oh = (int)(qq / P), ow = (int)(qq % P);
            if (ow >= j->OW) {
                k += (int)(P - ow);
                continue;
            }
            const int n = cd_imin(cd_imin(nr - k, j->OW - ow), (int)(nq - qq));
            run[nrun].p = k, run[nrun].n = n, run[nrun].o = (long long)oh * j->OW + ow;
            ++nrun;
            k += n;
        }
        cd_store(j, t, run, nrun, m0, rows);
    }
}

int inferd_conv_direct(const float* x, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt,
                       int pl, int OH, int OW, const float* ap, int M, const float* bias, const float* res, float* y,
                       int act, float p0, float p1, float* ws)
{
    if (OH <= 0 || OW <= 0 || M <= 0) return 0;
    if (!inferd_conv_direct_applies(kh, kw, sh, sw, dh, dw, pt, pl, 0, 0) || C <= 0) return -2;
    cd_job j;
    memset(&j, 0, sizeof j);
    j.x = x;
    j.C = C, j.H = H, j.W = W, j.kh = kh, j.kw = kw, j.sh = sh, j.sw = sw, j.pt = pt, j.pl = pl, j.OH = OH, j.OW = OW;
    j.L = cd_layout_of(H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW);
    j.ekw = (kw - 1) * dw;
    j.ap = ap, j.M = M, j.K = C * kh * kw;
    j.bias = bias, j.res = res, j.y = y, j.act = act, j.p0 = p0, j.p1 = p1;
    long long* boff = (long long*)ws; /* the workspace starts 64-byte aligned (numpy), 8 is enough */
    j.boff = boff;
    j.xp = ws + 2LL * j.K;
    const cd_layout* L = &j.L;
    for (int c = 0; c < C; ++c)
        for (int i = 0; i < kh; ++i)
            for (int k = 0; k < kw; ++k) {
                long long o;
                if (L->shared) {
                    o = (long long)c * L->plane + (long long)i * dh * L->P + (long long)k * dw + L->D - pl;
                } else {
                    const int ph = (i * dh) % sh, pw = (k * dw) % sw;
                    o = ((long long)c * L->nph + ph * sw + pw) * L->plane + (long long)(i * dh / sh) * L->P +
                        k * dw / sw;
                }
                boff[(c * kh + i) * kw + k] = o;
            }
    j.uk = inferd_gemm_ukoff(&j.mrk, &j.nr);
    const long long nq = (long long)OH * L->P;
    j.tiles = (int)((nq + j.nr - 1) / j.nr);
    const int panels = (M + DMRP - 1) / DMRP, th = inferd_pool_threads();
    /* a few tasks per thread so a thread slowed by a neighbour hands its share over */
    const int want = cd_imax(1, (4 * th + panels - 1) / panels);
    j.chunk = cd_imax(1, (j.tiles + want - 1) / want);
    j.nchunks = (j.tiles + j.chunk - 1) / j.chunk;
    inferd_parallel(cd_pad_task, &j, C, 0);
    inferd_parallel(cd_task, &j, (long long)panels * j.nchunks, 0);
    return 0;
}
