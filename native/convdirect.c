/* Direct convolution, stride 1, group 1: the GEMM's micro-kernel reading the input planes in place.
 *
 * Why: a stride-1 convolution is a GEMM whose column matrix row (c, i, j) is input plane c shifted by the tap.
 * With the input copied once into planes whose rows share their padding (row pitch P = W + max(pl, pr): the
 * right padding of one row is the left padding of the next), output position (oh, ow) is flat index
 * q = oh * P + ow and row (c, i, j) of column q sits at plane c + i * P + j + (D - pl) + q for every q: each
 * row of a column block is a contiguous run of the padded input. gemm.c's micro-kernel then reads those runs
 * in place through a table of row offsets (inferd_gemm_ukoff), so neither im2col's column matrix nor the
 * implicit GEMM's gathered panels nor Winograd's transforms sit between the input and the FMAs. A tile of
 * nr positions runs across row ends; the max(pl, pr) columns per row past OW are computed and dropped (1/14
 * of the work on 13x13 maps, against 3/16 lanes idle for a per-row tiling of 13 columns).
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
    if (sh != 1 || sw != 1 || dh != 1 || dw != 1) return 0;
    if (kh < 1 || kw < 1 || kh * kw > DMAXT) return 0;
    if (pt < 0 || pl < 0 || pb < 0 || pr < 0 || pt >= kh || pb >= kh || pl >= kw || pr >= kw) return 0;
    return 1;
}

/* The padded planes: pitch P, OH + kh - 1 rows each; after the last, a spare row and a tile's reach (the junk
   positions of the last tile read there). Before them, the K row offsets (int64, as 2K floats). */
static long long cd_pitch(int W, int pl, int pr) { return (long long)W + cd_imax(pl, pr); }
static long long cd_tail(int kw) { return DNR_MAX + kw + 16; }

long long inferd_conv_direct_workspace(int C, int W, int kh, int kw, int pl, int pr, int OH)
{
    const long long P = cd_pitch(W, pl, pr);
    return 2LL * C * kh * kw + (long long)C * (OH + kh - 1) * P + P + cd_tail(kw);
}

typedef struct {
    const float* x;
    int C, H, W, kh, kw, pt, OH, OW;
    long long P, plane;
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

/* Channel c of x into its padded plane: zero rows above and below, each row's data after D zeros. */
static void cd_pad_task(void* p, long long c)
{
    cd_job* j = (cd_job*)p;
    const long long P = j->P, D = P - j->W;
    float* restrict d = j->xp + (size_t)c * j->plane;
    const float* restrict s = j->x + (size_t)c * j->H * j->W;
    const int rows = j->OH + j->kh - 1;
    for (int r = 0; r < rows; ++r) {
        float* restrict dr = d + (size_t)r * P;
        const int ih = r - j->pt;
        if (ih < 0 || ih >= j->H) {
            memset(dr, 0, sizeof(float) * (size_t)P);
            continue;
        }
        memset(dr, 0, sizeof(float) * (size_t)D);
        memcpy(dr + D, s + (size_t)ih * j->W, sizeof(float) * (size_t)j->W);
    }
    if (c == j->C - 1)
        memset(d + (size_t)rows * P, 0, sizeof(float) * (size_t)(P + cd_tail(j->kw)));
}

/* Rows m0..m0+rows of a tile's raw sums t (pitch nr), positions p..p+n, to y at offset o of each plane:
   + bias (+ res), activation. */
static void cd_store(const cd_job* j, const float* t, int p, int n, int m0, int rows, long long o)
{
    const long long ohw = (long long)j->OH * j->OW;
    for (int i = 0; i < rows; ++i) {
        const int m = m0 + i;
        float* restrict yr = j->y + (size_t)m * ohw + o;
        const float* restrict tr = t + (size_t)i * j->nr + p;
        const float b = j->bias ? j->bias[m] : 0.0f;
        if (j->res) {
            const float* restrict rr = j->res + (size_t)m * ohw + o;
            for (int k = 0; k < n; ++k) yr[k] = tr[k] + b + rr[k];
        } else {
            for (int k = 0; k < n; ++k) yr[k] = tr[k] + b;
        }
        if (j->act) act_inplace(yr, n, j->act, j->p0, j->p1);
    }
}

static void cd_task(void* p, long long task)
{
    cd_job* j = (cd_job*)p;
    const int panel = (int)(task / j->nchunks), ch = (int)(task % j->nchunks);
    const int nr = j->nr, m0 = panel * DMRP, rows = cd_imin(DMRP, j->M - m0);
    const int t0 = ch * j->chunk, t1 = cd_imin(j->tiles, t0 + j->chunk);
    const float* a = j->ap + (size_t)panel * j->K * DMRP;
    const long long nq = (long long)j->OH * j->P;
    float t[DMRP * DNR_MAX] __attribute__((aligned(64)));
    for (int ti = t0; ti < t1; ++ti) {
        const long long q = (long long)ti * nr;
        for (int sub = 0; sub < rows; sub += j->mrk) j->uk(j->K, a + sub, j->xp + q, j->boff, t + (size_t)sub * nr);
        /* runs of valid positions (ow < OW): each row's run is contiguous in y */
        for (int k = 0; k < nr && q + k < nq;) {
            const long long qq = q + k;
            const int oh = (int)(qq / j->P), ow = (int)(qq % j->P);
            if (ow >= j->OW) {
                k += (int)(j->P - ow);
                continue;
            }
            const int n = cd_imin(cd_imin(nr - k, j->OW - ow), (int)(nq - qq));
            cd_store(j, t, k, n, m0, rows, (long long)oh * j->OW + ow);
            k += n;
        }
    }
}

int inferd_conv_direct(const float* x, int C, int H, int W, int kh, int kw, int pt, int pl, int OH, int OW,
                       const float* ap, int M, const float* bias, const float* res, float* y, int act, float p0,
                       float p1, float* ws)
{
    if (OH <= 0 || OW <= 0 || M <= 0) return 0;
    const int pb = OH + kh - 1 - H - pt, pr = OW + kw - 1 - W - pl;
    if (!inferd_conv_direct_applies(kh, kw, 1, 1, 1, 1, pt, pl, pb, pr) || C <= 0) return -2;
    cd_job j;
    memset(&j, 0, sizeof j);
    j.x = x;
    j.C = C, j.H = H, j.W = W, j.kh = kh, j.kw = kw, j.pt = pt, j.OH = OH, j.OW = OW;
    j.P = cd_pitch(W, pl, pr);
    j.plane = (long long)(OH + kh - 1) * j.P;
    j.ap = ap, j.M = M, j.K = C * kh * kw;
    j.bias = bias, j.res = res, j.y = y, j.act = act, j.p0 = p0, j.p1 = p1;
    long long* boff = (long long*)ws; /* the workspace starts 64-byte aligned (numpy), 8 is enough */
    j.boff = boff;
    j.xp = ws + 2LL * j.K;
    const long long D = j.P - W;
    for (int c = 0; c < C; ++c)
        for (int i = 0; i < kh; ++i)
            for (int k = 0; k < kw; ++k) boff[(c * kh + i) * kw + k] = c * j.plane + i * j.P + k + D - pl;
    j.uk = inferd_gemm_ukoff(&j.mrk, &j.nr);
    const long long nq = (long long)OH * j.P;
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
