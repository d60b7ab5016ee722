/* Direct convolution, group 1: the GEMM's micro-kernel reading the input planes in place.
 *
 * Why: a convolution is a GEMM whose column matrix row (c, i, j) holds input plane c shifted by the tap. At
 * stride 1, with the input copied into planes whose rows share their padding (row pitch
 * P = W + max(pl, pr): the right padding of one row is the left padding of the next), output position (oh, ow)
 * is flat index q = oh * P + ow and row (c, i, j) of column q sits at plane c + i*dh*P + j*dw + (D - pl) + q for
 * every q: each row of a column block is a contiguous run of the padded input (each task copies the rows of
 * its band of output rows, so copies stay on the core that reads them). At stride s the input is split
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

/* The layout, per band of output rows: nph phase planes per channel (1 at stride 1), each rows x P floats, rows the
   band's output rows and the ext more its windows reach; shared: stride 1 with the rows sharing their padding
   (offset D = max(pl, pr) of the data in a row). After a band's last plane, the junk positions of its last tile
   read up to a row and two tiles further (tail). */
typedef struct {
    int shared, nph, ext, band, rows;
    long long P, D, plane, slot;
} cd_layout;

static long long cd_tail(long long P, int ekw) { return P + ekw + 2 * DNR_MAX + 16; }

static cd_layout cd_layout_of(int C, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pl, int OH, int OW)
{
    cd_layout L;
    const int ekh = (kh - 1) * dh, ekw = (kw - 1) * dw;
    const int pr = (OW - 1) * sw + ekw + 1 - W - pl;
    L.shared = sh == 1 && sw == 1 && pr >= 0 && cd_imin(pl, pr) <= ekw;
    if (L.shared) {
        L.nph = 1;
        L.D = cd_imax(pl, pr);
        L.P = (long long)W + L.D;
        L.ext = ekh;
    } else {
        L.nph = sh * sw;
        L.D = 0;
        L.P = (long long)OW + ekw / sw;
        L.ext = ekh / sh;
    }
    /* ~96k floats (384 KB) of input planes per band: they stay in L2 while every 8-row weight panel of the task
       sweeps them. Each task copies its own band (so the planes never travel between cores: copied by one pool
       thread and read by the other, they cost 0.03-0.16 ms a layer on the 2-core EPYC) */
    const long long per_row = (long long)C * L.nph * L.P;
    long long band = 98304 / (per_row > 0 ? per_row : 1) - L.ext;
    /* and four bands where the map is large enough for each to hold 256 positions (8 tiles: the ragged last tile
       of a band is junk): tasks split by bands copy nothing twice but the ext rows, tasks split by weight panels
       copy their whole band again (13x13 maps in 4 bands ran 25% slower than in one). Then evened out. Not
       from the thread count: the workspace sized at bind must fit the call */
    const long long quarter = (OH + 3) / 4, least = (256 + L.P - 1) / L.P;
    const long long want = quarter > least ? quarter : least;
    if (band > want) band = want;
    if (band < 1) band = 1;
    if (band > OH) band = OH;
    const long long nbands = (OH + band - 1) / band;
    band = (OH + nbands - 1) / nbands;
    L.band = (int)band;
    L.rows = L.band + L.ext;
    L.plane = (long long)L.rows * L.P;
    L.slot = (long long)C * L.nph * L.plane + cd_tail(L.P, ekw);
    return L;
}

long long inferd_conv_direct_workspace(int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt,
                                       int pl, int OH, int OW, int slots)
{
    (void)H, (void)pt;
    const cd_layout L = cd_layout_of(C, W, kh, kw, sh, sw, dh, dw, pl, OH, OW);
    return 2LL * C * kh * kw + (long long)cd_imax(slots, 0) * L.slot;
}

typedef struct {
    const float* x;
    int C, H, W, kh, kw, sh, sw, pt, pl, OH, OW;
    cd_layout L;
    const float* ap;
    int M, K;
    const float *bias, *res;
    float* y;
    int act;
    float p0, p1;
    const long long* boff;
    float* slots_buf; /* slots band buffers */
    int slots;
    unsigned long long busy;
    int failed;
    inferd_ukoff_fn uk;
    int mrk, nr;
    inferd_ukoff_fn ukw; /* taller tiles (mrw rows x vl positions), or NULL */
    int mrw, vl;
    int ngroups, group; /* weight panels per task */
    int store16;        /* tiles go through cd_store16 */
} cd_job;

/* Output rows r0..r0+nb's input planes (band rows 0..nb+ext) of every channel into buf: zero where the window
   leaves the input. */
static void cd_pad_band(const cd_job* j, float* buf, int r0, int nb)
{
    const cd_layout* L = &j->L;
    const long long P = L->P;
    const int rows = nb + L->ext;
    for (int c = 0; c < j->C; ++c) {
        const float* restrict s = j->x + (size_t)c * j->H * j->W;
        float* restrict d0 = buf + (size_t)c * L->nph * L->plane;
        if (L->shared) {
            for (int r = 0; r < rows; ++r) {
                float* restrict dr = d0 + (size_t)r * P;
                const int ih = r0 + r - j->pt;
                if (ih < 0 || ih >= j->H) {
                    memset(dr, 0, sizeof(float) * (size_t)P);
                    continue;
                }
                memset(dr, 0, sizeof(float) * (size_t)L->D);
                memcpy(dr + L->D, s + (size_t)ih * j->W, sizeof(float) * (size_t)j->W);
            }
            continue;
        }
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
                for (int r = 0; r < rows; ++r) {
                    float* restrict dr = d + (size_t)r * P;
                    const int ih = j->sh * (r0 + r) + a - j->pt;
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
    /* In the shared layout the row after a plane's last row holds that row's right padding: a short last band's
       rows past nb + ext are zeroed, and the tail after the last plane is zeros */
    if (rows < L->rows)
        for (int q = 0; q < j->C * L->nph; ++q)
            memset(buf + (size_t)q * L->plane + (size_t)rows * P, 0, sizeof(float) * (size_t)((L->rows - rows) * P));
    const long long used = (long long)j->C * L->nph * L->plane;
    memset(buf + used, 0, sizeof(float) * (size_t)(L->slot - used));
}

/* A tile's runs of valid positions (ow < OW): position p of the tile, length n, offset o in each output plane. */
typedef struct {
    int p, n;
    long long o;
} cd_run;

/* The runs of valid positions (ow < OW) of the nr-position tile at q of band r0 (nq positions, rows of P): each
   row's run is contiguous in y. Returns how many. */
static int cd_runs(const cd_job* j, cd_run* run, int r0, long long q, long long nq, long long P, int nr)
{
    int nrun = 0;
    for (int k = 0; k < nr && q + k < nq;) {
        const long long qq = q + k;
        const int oh = r0 + (int)(qq / P), ow = (int)(qq % P);
        if (ow >= j->OW) {
            k += (int)(P - ow);
            continue;
        }
        const int n = cd_imin(cd_imin(nr - k, j->OW - ow), (int)(nq - qq));
        run[nrun].p = k, run[nrun].n = n, run[nrun].o = (long long)oh * j->OW + ow;
        ++nrun;
        k += n;
    }
    return nrun;
}

/* Rows m0..m0+rows of a tile's raw sums t (pitch nr) to y through the runs: + bias (+ res), activation. The bias
   and the activation go over the whole tile (rows x nr values, the junk positions too: whole vectors, where the
   costly activations' vector loops have no scalar tail), the residual over the runs. The activation once per
   tile and the runs copied inline, not a call of each per row: a 16-channel 3x3 conv is 144 multiply-adds a
   value, against which a memcpy call per row of 16 values showed (squeezenet1_1, alternating in one process:
   0.98x the time on two threads, 0.99x on one). */
INFERD_INLINE void cd_store(const cd_job* j, float* t, int nr, const cd_run* run, int nrun, int m0, int rows)
{
    const long long ohw = (long long)j->OH * j->OW;
    for (int i = 0; i < rows; ++i) {
        const int m = m0 + i;
        float* restrict tr = t + (size_t)i * nr;
        const float b = j->bias ? j->bias[m] : 0.0f;
        for (int k = 0; k < nr; ++k) tr[k] += b;
        if (j->res) {
            const float* restrict rm = j->res + (size_t)m * ohw;
            for (int r = 0; r < nrun; ++r)
                for (int k = 0; k < run[r].n; ++k) tr[run[r].p + k] += rm[run[r].o + k];
        }
    }
    if (j->act) act_inplace(t, (ptrdiff_t)rows * nr, j->act, j->p0, j->p1);
    for (int i = 0; i < rows; ++i) {
        float* restrict ym = j->y + (size_t)(m0 + i) * ohw;
        const float* restrict tr = t + (size_t)i * nr;
        for (int r = 0; r < nrun; ++r) copy_row(ym + run[r].o, tr + run[r].p, run[r].n);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CD_STORE16 1
typedef float cd_v16f __attribute__((vector_size(64)));
typedef int cd_v16i __attribute__((vector_size(64)));

/* cd_store for AVX-512 tiles (nr a multiple of 16) with a cheap activation, in registers. The valid positions of
   a 16-position chunk (ow < OW, inside the band) are consecutive in y whatever rows the chunk spans (the junk
   positions are exactly the ones y has no place for), so a row of a chunk is one compress of its valid lanes
   and one masked store: no runs to find and walk. cd_store's bookkeeping was a fifth of a 16-channel 3x3 conv's
   time on 55x55 (Xeon, one thread; the micro-kernels ran at ~95% of the FMA peak). Same sums as cd_store,
   (t + bias) + res then the activation (bit for bit the same on the Relu models). Alternating in one process:
   squeezenet1_1 0.95x the time on one thread, 0.96x on two. */
__attribute__((target("avx512f,avx2,fma"), noinline)) static void
cd_store16(const cd_job* j, const float* t, int nr, long long q, int r0, long long nq, long long P, int m0, int rows)
{
    enum { CH = DNR_MAX / 16 };
    const long long ohw = (long long)j->OH * j->OW;
    const int nch = nr / 16, OW = j->OW;
    __mmask16 valid[CH], head[CH];
    long long o[CH];
    for (int c = 0; c < nch; ++c) {
        /* the valid lanes row by row: a run of up to OW - ow, then the row's junk (P - OW) */
        const long long q0 = q + 16LL * c;
        unsigned m = 0;
        long long ow = q0 % P, oh = q0 / P;
        if (ow >= OW) ow -= P, ++oh; /* in a row's junk: the next row starts at lane -ow */
        o[c] = (r0 + oh) * OW + (ow > 0 ? ow : 0);
        for (long long l = -ow; l < 16; l += P) {
            long long n = l < 0 ? OW + l : OW; /* l < 0: the run began before this chunk */
            if (n > 16 - (l > 0 ? l : 0)) n = 16 - (l > 0 ? l : 0);
            if (n > 0) m |= ((1u << (unsigned)n) - 1u) << (l < 0 ? 0 : (unsigned)l);
        }
        if (nq - q0 < 16) m &= nq > q0 ? (1u << (unsigned)(nq - q0)) - 1u : 0u;
        m &= 0xffffu;
        valid[c] = (__mmask16)m;
        head[c] = (__mmask16)((1u << __builtin_popcount(m)) - 1u);
    }
    /* None and Relu expanded with a literal code: with the code a variable, INFERD_VACT's tests ran per vector
       (the first form of this store, with the masks found lane by lane, was 13% of that conv's time, this one
       10%, mostly the stores themselves). A chunk with no valid lane (past the band) has an empty mask: its
       loads and stores touch nothing, whatever o says. */
    const int act = j->act;
    const float p0 = j->p0, p1 = j->p1;
#define CD_STORE16_ROWS(ACT)                                                                     \
    for (int i = 0; i < rows; ++i) {                                                             \
        const int mm = m0 + i;                                                                   \
        const cd_v16f b = (j->bias ? j->bias[mm] : 0.0f) - (cd_v16f){0};                         \
        float* ym = j->y + (size_t)mm * ohw;                                                     \
        const float* rm = j->res ? j->res + (size_t)mm * ohw : NULL;                             \
        for (int c = 0; c < nch; ++c) {                                                          \
            cd_v16f x = (cd_v16f)_mm512_loadu_ps(t + (size_t)i * nr + 16 * c) + b;               \
            x = (cd_v16f)_mm512_maskz_compress_ps(valid[c], (__m512)x);                          \
            if (rm) x += (cd_v16f)_mm512_maskz_loadu_ps(head[c], rm + o[c]);                      \
            INFERD_VACT(cd_v16f, cd_v16i, x, ACT, p0, p1);                                       \
            _mm512_mask_storeu_ps(ym + o[c], head[c], (__m512)x);                                \
        }                                                                                        \
    }
    if (act == 0) {
        CD_STORE16_ROWS(0)
    } else if (act == 1) {
        CD_STORE16_ROWS(1)
    } else {
        CD_STORE16_ROWS(act)
    }
#undef CD_STORE16_ROWS
}
#endif

INFERD_CLONES
static void cd_task(void* p, long long task)
{
    cd_job* j = (cd_job*)p;
    const cd_layout* L = &j->L;
    const int band = (int)(task / j->ngroups), grp = (int)(task % j->ngroups);
    const int r0 = band * L->band, nb = cd_imin(L->band, j->OH - r0);
    const int panels = (j->M + DMRP - 1) / DMRP;
    const int g0 = grp * j->group, g1 = cd_imin(panels, g0 + j->group);
    if (nb <= 0 || g0 >= g1) return;
    /* a free band buffer (one per pool thread); none free: a private one */
    const int slot = inferd_slot_claim(&j->busy, j->slots);
    float* buf = slot >= 0 ? j->slots_buf + (size_t)slot * L->slot : (float*)calloc((size_t)L->slot, sizeof(float));
    if (!buf) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    cd_pad_band(j, buf, r0, nb);
    const int nr = j->nr;
    const long long P = L->P, nq = (long long)nb * P;
    float t[DMRP * DNR_MAX] __attribute__((aligned(64))); /* the taller tiles' too: mrw x vl <= 512 */
    cd_run run[DNR_MAX];
    int pn = g0;
    /* whole groups of mrw rows in the taller tiles: each input run read once per mrw weight rows, not per 8
       (gemm.c's isa_t.mrw); the same sums in the same order, so the same bits */
    if (j->ukw) {
        const int G = j->mrw / DMRP;
        for (; pn + G <= g1 && (pn + G) * DMRP <= j->M; pn += G) {
            const float* a = j->ap + (size_t)pn * j->K * DMRP;
            for (long long q = 0; q < nq; q += j->vl) {
                j->ukw(j->K, a, buf + q, j->boff, t);
#ifdef CD_STORE16
                if (j->store16) {
                    cd_store16(j, t, j->vl, q, r0, nq, P, pn * DMRP, j->mrw);
                    continue;
                }
#endif
                cd_store(j, t, j->vl, run, cd_runs(j, run, r0, q, nq, P, j->vl), pn * DMRP, j->mrw);
            }
        }
    }
    for (; pn < g1; ++pn) {
        const int m0 = pn * DMRP, rows = cd_imin(DMRP, j->M - m0);
        const float* a = j->ap + (size_t)pn * j->K * DMRP;
        for (long long q = 0; q < nq; q += nr) {
            for (int sub = 0; sub < rows; sub += j->mrk) j->uk(j->K, a + sub, buf + q, j->boff, t + (size_t)sub * nr);
#ifdef CD_STORE16
            if (j->store16) {
                cd_store16(j, t, nr, q, r0, nq, P, m0, rows);
                continue;
            }
#endif
            cd_store(j, t, nr, run, cd_runs(j, run, r0, q, nq, P, nr), m0, rows);
        }
    }
    if (slot >= 0)
        inferd_slot_release(&j->busy, slot);
    else
        free(buf);
}

int inferd_conv_direct(const float* x, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt,
                       int pl, int OH, int OW, const float* ap, int M, const float* bias, const float* res, float* y,
                       int act, float p0, float p1, float* ws, int slots)
{
    if (OH <= 0 || OW <= 0 || M <= 0) return 0;
    if (!inferd_conv_direct_applies(kh, kw, sh, sw, dh, dw, pt, pl, 0, 0) || C <= 0) return -2;
    cd_job j;
    memset(&j, 0, sizeof j);
    j.x = x;
    j.C = C, j.H = H, j.W = W, j.kh = kh, j.kw = kw, j.sh = sh, j.sw = sw, j.pt = pt, j.pl = pl, j.OH = OH, j.OW = OW;
    j.L = cd_layout_of(C, W, kh, kw, sh, sw, dh, dw, pl, OH, OW);
    j.ap = ap, j.M = M, j.K = C * kh * kw;
    j.bias = bias, j.res = res, j.y = y, j.act = act, j.p0 = p0, j.p1 = p1;
    long long* boff = (long long*)ws; /* the workspace starts 64-byte aligned (numpy), 8 is enough */
    j.boff = boff;
    j.slots = cd_imin(cd_imax(slots, 0), 64);
    j.slots_buf = ws + 2LL * j.K;
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
    j.ukw = inferd_gemm_ukoff_wide(&j.mrw, &j.vl);
#ifdef CD_STORE16
    j.store16 = inferd_gemm_isa() == 2 && j.nr % 16 == 0 && (!j.ukw || j.vl % 16 == 0) && !INFERD_ACT_COSTLY(act);
#endif
    const int nbands = (OH + L->band - 1) / L->band, panels = (M + DMRP - 1) / DMRP, th = inferd_pool_threads();
    /* a few tasks per thread so a thread slowed by a neighbour hands its share over: bands first, then the
       weight panels split among tasks (each copying its band again) */
    const int want = 4 * th;
    int ng = nbands >= want ? 1 : (want + nbands - 1) / nbands;
    if (ng > panels) ng = panels;
    j.group = (panels + ng - 1) / ng;
    if (j.ukw && j.group > 1) j.group = (j.group + j.mrw / DMRP - 1) / (j.mrw / DMRP) * (j.mrw / DMRP);
    j.ngroups = (panels + j.group - 1) / j.group;
    inferd_parallel(cd_task, &j, (long long)nbands * j.ngroups, 0);
    return j.failed ? -1 : 0;
}
