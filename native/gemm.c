/* Packed single-precision GEMM for the CPU kernels: C = act(A B + bias + R), A the constant operand (weights),
 * packed once at load; B the activations, packed per call into the micro-kernel's panels.
 *
 * Why our own: OpenBLAS (numpy's) is fast on big square GEMMs but mobile nets are small-K, small-N layers
 * (1x1 convs on 7x7..112x112 maps), where its per-call packing and threading cost dominates, and its
 * workers spin on the cores our other kernels need. This one packs the weights at load, fuses bias,
 * residual and activation into the store, and runs on inferd's own pool (pool.c).
 *
 * Layout: A is packed in panels of 8 rows, k-major (ap[(i/8)*K*8 + k*8 + i%8], rows past M zero), the same
 * for every ISA so a compiled package is portable. The micro-kernels (GNU vector extensions, so the same
 * source is AVX-512, AVX2, SSE2 or NEON) compute an MRK x NR tile from MRK rows of an A panel and a
 * k-major B panel of NR columns. B and C take any (row, column) strides, which covers NCHW convolutions
 * (C = W X) and row-major linear layers (C^T = W^T X^T, stored transposed) with one packed A format.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

#define MRP 8 /* rows per packed A panel */
#define NC_MAX 512 /* columns per task block: kc x 512 floats of packed B stay in L2 */
#ifndef KC_DEFAULT
#define KC_DEFAULT 256 /* K block */
#endif
#define KC_MAX 1024 /* longest K block (few columns) */

/* Where a full tile goes when the micro-kernel stores it itself (C rows contiguous): bias on the first K block,
   accumulate on later ones, residual and activation on the last. */
typedef struct {
    float* c;
    long long ldc;
    const float* bias; /* the tile's first row's bias, or NULL */
    const float* bias_c; /* or the tile's first column's bias (one per column), or NULL */
    const float* r;    /* residual at the tile's origin, or NULL (row pitch ldr) */
    long long ldr;
    int first, last, act;
    float p0, p1;
    /* A line of memory to bring into L2 while the kernel computes (INFERD_PFE): at k step k the line
       pf + 16 * ((k * pf_num) >> 8), while that index is below pf_lines; pf_pair: the pair of lines from
       pf + 32 * ((k * pf_num) >> 8) instead (two a step). NULL: none. */
    const float* pf;
    int pf_num, pf_lines, pf_pair;
} epi_t;

/* t != NULL: store the raw tile there (rows x nr); otherwise finish it into e->c. */
typedef void (*ukernel_fn)(long kc, const float* restrict a, long lda, const float* restrict b, long ldb,
                           float* restrict t, const epi_t* e);

/* The ragged last column panel's leftover columns (fewer than one vector): rows of a whole 8-row A panel in
   one vector, each column a broadcast; the raw MRP x nc tile goes to t (pitch nc). */
typedef void (*coltail_fn)(long kc, const float* restrict a, const float* restrict b, long ldb, int nc,
                           float* restrict t);

typedef struct {
    int level; /* 0 baseline, 1 AVX2+FMA, 2 AVX-512 */
    int mrk;   /* rows per micro-kernel call (a divisor of MRP) */
    int nr;    /* columns per B panel */
    int kc;    /* K block */
    ukernel_fn uk;
    /* The ragged last panel: whole vectors of it through uk1 (mrk x vl), the rest through tail, so a 49-pixel map
       costs 49 columns of work instead of the 64 of two full 32-column panels */
    int vl;    /* columns per uk1 call (one vector) */
    ukernel_fn uk1;
    coltail_fn tail;
    /* uk and uk1 reading A in place, row-major (element (i, k) at a[i * lda + k]): a plain activation matrix
       times prepacked weights (a linear layer) then needs no A packing at all. With B's columns split over
       tasks, each task packed all of A again (vit_tiny's fc1, 197x192 by 192x768 in 8 tasks: a quarter of the
       layer). Whole MRK-row groups only; the packed forms take the ragged last rows. */
    ukernel_fn ukr, uk1r;
    inferd_ukoff_fn uko; /* B rows at offsets (mrk x nr raw tiles) */
    /* Taller tiles where the registers allow, for packed weights: mrw rows (mrw / MRP consecutive packed panels,
       lda floats apart) x one vector. Each B vector then feeds mrw FMAs instead of mrk; with mrk = 8 the B block
       streamed from L2 bounded the 8 x 32 kernel (Xeon, one thread, kc 922 x 48 columns of a 7x7 map's B:
       83 GFLOP/s for 8 x 32 + 8 x 16, 110 for 24 x 16; kc 256 x 480: 105 and 132). Not for activations as A
       (a linear layer's rows): 24 rows read in place made vit_tiny 1.5x slower. 0: none. */
    int mrw;
    ukernel_fn ukw;
    inferd_ukoff_fn ukow; /* mrw x vl through B's row offsets */
    ukernel_fn ukp, ukwp; /* uk and ukw prefetching along B's rows, for B read in place (see gemm_block); or NULL */
    /* Two vectors of the ragged panel at once (mrk x 2 vl), and its row-major twin, where uk1's mrk accumulators
       are too few to keep the FMA units busy (AVX2: 4 chains of ~4-cycle FMAs at two a cycle, half the rate); the
       16 leftover columns of a 16-, 64- or 112-column B (Winograd F(2,3) on a 7x7 map: 16 tiles; resnet18's
       512-channel convs spent ~17% of the model's time in uk1). NULL: uk1 only. */
    ukernel_fn uk2, uk2r;
    /* A linear layer's many rows read in place against prepacked weights (gemm_slices): mrs rows x sw columns,
       sw a divisor of NBP and whole cache lines, so a slice of B never straddles a panel and is a line per k.
       NULL: such products take gemm_block. */
    int mrs, sw;
    ukernel_fn uks;
    ukernel_fn uksp; /* uks bringing the epilogue's line stream into L2 as it computes (epi_t.pf), or NULL */
    /* The ragged last group of rows (fewer than mrs) in calls of 8, 4, 2 and 1 rows, read in place. Copied into a
       zeroed block of mrs rows instead, it cost a whole group: a 49-token linear layer took the time of 60 rows
       (768x2304, Zen 4: 1.24x onnxruntime's time against 1.03 for 48 tokens). NULL where the ISA lacks one; an ISA
       with uks has the 1-row one at least, so any short group decomposes (use_slices asks for it). */
    ukernel_fn uks_rows[4];
} isa_t;

/* The tile loop: everything has literal bounds, so GCC unrolls it and keeps acc[][] in registers. AEL(k, i) is
   A's element (row i, k), BROW(k) where B's row k starts. */
#define INFERD_A_PACKED(k, i) a[(k) * MRP + (i)]
#define INFERD_A_ROWS(k, i) a[(i) * lda + (k)]
#define INFERD_A_PANELS(k, i) a[((i) / MRP) * lda + (k) * MRP + (i) % MRP]
/* the same from weights packed over the whole K (kc = K): panels kc * MRP floats apart */
#define INFERD_A_PANELS_K(k, i) a[((i) / MRP) * (kc * MRP) + (k) * MRP + (i) % MRP]
#define INFERD_B_PITCH(k) (b + (k) * ldb)
#define INFERD_B_OFFSETS(k) (b + boff[k])
#define INFERD_NOPF(bk)
/* the epilogue's prefetch stream (epi_t.pf): the kernel's own B is read from L2 or L1 */
#define INFERD_PFE(bk)                                                                                        \
    if (e) {                                                                                                  \
        const int l_ = (int)((k * e->pf_num) >> 8) << e->pf_pair;                                             \
        if (l_ < e->pf_lines) __builtin_prefetch(e->pf + 16 * (ptrdiff_t)l_, 0, 2);                           \
        if (e->pf_pair && l_ + 1 < e->pf_lines) __builtin_prefetch(e->pf + 16 * (ptrdiff_t)l_ + 16, 0, 2);    \
    }
#define INFERD_UK_LOOP(VT, VL, MRK, NV, AEL, BROW) INFERD_UK_LOOP_PF(VT, VL, MRK, NV, AEL, BROW, INFERD_NOPF)
#define INFERD_NOUNROLL
#define INFERD_UNROLL2 _Pragma("GCC unroll 2")
#define INFERD_UK_LOOP_PF(VT, VL, MRK, NV, AEL, BROW, PF) INFERD_UK_LOOP_PFU(VT, VL, MRK, NV, AEL, BROW, PF, INFERD_NOUNROLL)
/* PF(bk): a statement after B's row k is loaded (a prefetch further along it, for B read in place) */
#define INFERD_UK_LOOP_PFU(VT, VL, MRK, NV, AEL, BROW, PF, UNR)                                              \
        VT acc[MRK][NV];                                                                                     \
        _Pragma("GCC unroll 32") for (int i = 0; i < MRK; ++i) _Pragma("GCC unroll 4") for (int v = 0; v < NV; \
                                                                                            ++v)             \
            acc[i][v] = (VT){0};                                                                             \
        UNR for (long k = 0; k < kc; ++k) {                                                                  \
            VT bv[NV];                                                                                       \
            const float* restrict bk = BROW(k);                                                              \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) memcpy(&bv[v], bk + v * VL, sizeof(VT));   \
            PF(bk);                                                                                          \
            _Pragma("GCC unroll 32") for (int i = 0; i < MRK; ++i)                                           \
            {                                                                                                \
                const VT ai = AEL(k, i) - (VT){0}; /* x - 0 folds away; 0 + x does not (-0) */               \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) acc[i][v] += ai * bv[v];                \
            }                                                                                                \
        }
/* acc[][] += the MRK x NV*VL tile at P (rows LD floats apart): C's partial sums, or the residual */
#define INFERD_TILE_ADD(VT, VL, MRK, NV, P, LD)                                                              \
    _Pragma("GCC unroll 32") for (int i = 0; i < MRK; ++i) _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) \
    {                                                                                                        \
        VT t_;                                                                                               \
        memcpy(&t_, (P) + i * (LD) + v * VL, sizeof(VT));                                                    \
        acc[i][v] += t_;                                                                                     \
    }
/* B's row k at b + boff[k] (a convolution's input planes shifted by the taps, read in place by
   inferd_conv_direct): packed A, the raw MRK x NV*VL tile to t (pitch NV*VL) */
#define INFERD_UKOFF(NAME, ATTR, VT, VL, MRK, NV) INFERD_UKOFF_A(NAME, ATTR, VT, VL, MRK, NV, INFERD_A_PACKED)
#define INFERD_UKOFF_A(NAME, ATTR, VT, VL, MRK, NV, AEL)                                                      \
    ATTR static void NAME(long kc, const float* restrict a, const float* restrict b,                         \
                          const long long* restrict boff, float* restrict t)                                 \
    {                                                                                                        \
        INFERD_UK_LOOP(VT, VL, MRK, NV, AEL, INFERD_B_OFFSETS)                                               \
        _Pragma("GCC unroll 32") for (int i = 0; i < MRK; ++i) _Pragma("GCC unroll 4") for (int v = 0; v < NV; \
                                                                                             ++v)            \
            memcpy(t + i * (NV * VL) + v * VL, &acc[i][v], sizeof(VT));                                      \
    }
#define INFERD_UKERNEL(NAME, ATTR, VT, VI, VL, MRK, NV) INFERD_UKERNEL_A(NAME, ATTR, VT, VI, VL, MRK, NV, INFERD_A_PACKED)
#define INFERD_UKERNEL_A(NAME, ATTR, VT, VI, VL, MRK, NV, AEL) \
    INFERD_UKERNEL_AP(NAME, ATTR, VT, VI, VL, MRK, NV, AEL, INFERD_NOPF)
#define INFERD_UKERNEL_AP(NAME, ATTR, VT, VI, VL, MRK, NV, AEL, PF)                                           \
    INFERD_UKERNEL_APU(NAME, ATTR, VT, VI, VL, MRK, NV, AEL, PF, INFERD_NOUNROLL)
#define INFERD_UKERNEL_APU(NAME, ATTR, VT, VI, VL, MRK, NV, AEL, PF, UNR)                                     \
    ATTR static void NAME(long kc, const float* restrict a, long lda, const float* restrict b, long ldb,     \
                          float* restrict t, const epi_t* e)                                                 \
    {                                                                                                        \
        INFERD_UK_LOOP_PFU(VT, VL, MRK, NV, AEL, INFERD_B_PITCH, PF, UNR)                                    \
        if (t) {                                                                                             \
            _Pragma("GCC unroll 32") for (int i = 0; i < MRK; ++i) _Pragma("GCC unroll 4") for (int v = 0;     \
                                                                                             v < NV; ++v)    \
                memcpy(t + i * (NV * VL) + v * VL, &acc[i][v], sizeof(VT));                                  \
            return;                                                                                          \
        }                                                                                                    \
        /* The epilogue in passes over the whole tile, each under one test per call: written per vector with every \
           test inside, GCC kept a chain of branches per vector (ukr_avx2 was 3,200 instructions) and a K = 16     \
           GEMM spent as long there as in its FMAs. The same additions in the same order: the same bits. */       \
        const int act = e->act, first = e->first, last = e->last;                                             \
        const int vact = last && !INFERD_ACT_COSTLY(act) ? act : 0;                                          \
        const float p0 = e->p0, p1 = e->p1;                                                                  \
        float* const c0 = e->c;                                                                              \
        const long ldc = (long)e->ldc, ldr = (long)e->ldr;                                                   \
        const float* const biasr = first ? e->bias : NULL;                                                   \
        const float* const biasc = first ? e->bias_c : NULL;                                                 \
        const float* const res = last ? e->r : NULL;                                                         \
        if (biasr)                                                                                           \
            _Pragma("GCC unroll 32") for (int i = 0; i < MRK; ++i)                                            \
            {                                                                                                \
                const VT bi = biasr[i] - (VT){0};                                                            \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) acc[i][v] += bi;                         \
            }                                                                                                \
        if (biasc)                                                                                           \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v)                                              \
            {                                                                                                \
                VT bc;                                                                                       \
                memcpy(&bc, biasc + v * VL, sizeof(VT));                                                     \
                _Pragma("GCC unroll 32") for (int i = 0; i < MRK; ++i) acc[i][v] += bc;                       \
            }                                                                                                \
        if (!first) INFERD_TILE_ADD(VT, VL, MRK, NV, c0, ldc);                                                \
        if (res) INFERD_TILE_ADD(VT, VL, MRK, NV, res, ldr);                                                  \
        if (vact)                                                                                            \
            _Pragma("GCC unroll 32") for (int i = 0; i < MRK; ++i) _Pragma("GCC unroll 4") for (int v = 0;     \
                                                                                             v < NV; ++v)    \
                INFERD_VACT(VT, VI, acc[i][v], vact, p0, p1);                                                \
        _Pragma("GCC unroll 32") for (int i = 0; i < MRK; ++i) _Pragma("GCC unroll 4") for (int v = 0; v < NV; \
                                                                                             ++v)            \
            memcpy(c0 + i * ldc + v * VL, &acc[i][v], sizeof(VT));                                           \
        if (last && INFERD_ACT_COSTLY(act))                                                                  \
            for (int i = 0; i < MRK; ++i) act_inplace(c0 + i * ldc, NV * VL, act, p0, p1);                   \
    }

typedef float v4f __attribute__((vector_size(16)));
typedef int v4i __attribute__((vector_size(16)));
/* The column tail's and the GEMVs' vectors: 8 floats (a ymm register; two xmm in the SSE2 builds), 4 on aarch64
   (a q register: 8-float vectors there were lowered in pieces, 332 operations GCC split). An 8-row A panel is
   MRP / VG of them. */
typedef inferd_gvf vg_t;
#define VG INFERD_GV
#define VGH (MRP / VG)
/* an 8-row A panel's column into av[] vector by vector (one memcpy into the whole array went through the stack) */
#define VG_LOAD(av, p)                                                                                    \
    for (int h_ = 0; h_ < VGH; ++h_) memcpy(&(av)[h_], (p) + h_ * VG, sizeof(vg_t))

/* NC columns (a literal, so acc[] stays in registers): per k one A load and NC broadcast FMAs, over U
   interleaved runs of k with their own accumulators, summed at the end. NC x U = 8 chains: an FMA waits ~4 cycles
   for its accumulator and the x86 cores we run on (Zen 4, recent Xeons) issue two a cycle, so one chain per column
   (the form before) ran a 1-column tail at ~1/8 of the FMA rate (a 7x7 map's 49 = 32 + 16 + 1 columns ends in
   one). A VAD's 5-column STFT conv spent 63% of its 35 us in this tail (it now takes the few-column path). */
#define INFERD_COLTAIL_N(NC, U)                                                                       \
    for (; j + NC <= nc; j += NC) {                                                                  \
        vg_t acc[U][NC][VGH];                                                                        \
        for (int u = 0; u < U; ++u)                                                                  \
            for (int q = 0; q < NC; ++q)                                                             \
                for (int h = 0; h < VGH; ++h) acc[u][q][h] = (vg_t){0};                              \
        long k = 0;                                                                                  \
        for (; k + U <= kc; k += U)                                                                  \
            for (int u = 0; u < U; ++u) {                                                            \
                vg_t av[VGH];                                                                        \
                VG_LOAD(av, a + (k + u) * MRP);                                                      \
                const float* restrict bk = b + (k + u) * ldb + j;                                    \
                for (int q = 0; q < NC; ++q)                                                         \
                    for (int h = 0; h < VGH; ++h) acc[u][q][h] += av[h] * (bk[q] - (vg_t){0});       \
            }                                                                                        \
        for (; k < kc; ++k) {                                                                        \
            vg_t av[VGH];                                                                            \
            VG_LOAD(av, a + k * MRP);                                                                \
            const float* restrict bk = b + k * ldb + j;                                              \
            for (int q = 0; q < NC; ++q)                                                             \
                for (int h = 0; h < VGH; ++h) acc[0][q][h] += av[h] * (bk[q] - (vg_t){0});           \
        }                                                                                            \
        for (int u = 1; u < U; ++u)                                                                  \
            for (int q = 0; q < NC; ++q)                                                             \
                for (int h = 0; h < VGH; ++h) acc[0][q][h] += acc[u][q][h];                          \
        for (int i = 0; i < MRP; ++i)                                                                \
            for (int q = 0; q < NC; ++q) t[i * nc + j + q] = acc[0][q][i / VG][i % VG];              \
    }
#define INFERD_COLTAIL(NAME, ATTR)                                                                    \
    ATTR static void NAME(long kc, const float* restrict a, const float* restrict b, long ldb, int nc, \
                          float* restrict t)                                                         \
    {                                                                                                \
        int j = 0;                                                                                   \
        INFERD_COLTAIL_N(8, 1)                                                                       \
        INFERD_COLTAIL_N(4, 2)                                                                       \
        INFERD_COLTAIL_N(2, 4)                                                                       \
        INFERD_COLTAIL_N(1, 8)                                                                       \
    }

INFERD_COLTAIL(tail_base, )
#if defined(__aarch64__)
/* NEON: 32 q-registers, 24 accumulators */
INFERD_UKERNEL(uk_base, , v4f, v4i, 4, 8, 3)
INFERD_UKERNEL(uk1_base, , v4f, v4i, 4, 8, 1)
INFERD_UKERNEL_A(ukr_base, , v4f, v4i, 4, 8, 3, INFERD_A_ROWS)
INFERD_UKERNEL_A(uk1r_base, , v4f, v4i, 4, 8, 1, INFERD_A_ROWS)
INFERD_UKOFF(uko_base, , v4f, 4, 8, 3)
static const isa_t ISA_BASE = {0, 8, 12, KC_DEFAULT, uk_base, 4, uk1_base, tail_base, ukr_base, uk1r_base, uko_base,
                               0, NULL, NULL, NULL, NULL};
#else
/* SSE2 (and any other target): 16 registers, 8 accumulators */
INFERD_UKERNEL(uk_base, , v4f, v4i, 4, 4, 2)
INFERD_UKERNEL(uk1_base, , v4f, v4i, 4, 4, 1)
INFERD_UKERNEL_A(ukr_base, , v4f, v4i, 4, 4, 2, INFERD_A_ROWS)
INFERD_UKERNEL_A(uk1r_base, , v4f, v4i, 4, 4, 1, INFERD_A_ROWS)
INFERD_UKOFF(uko_base, , v4f, 4, 4, 2)
static const isa_t ISA_BASE = {0, 4, 8, KC_DEFAULT, uk_base, 4, uk1_base, tail_base, ukr_base, uk1r_base, uko_base,
                               0, NULL, NULL, NULL, NULL};
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(INFERD_NO_CLONES)
#define INFERD_GEMM_X86 1
typedef float v8f __attribute__((vector_size(32)));
typedef float v16f __attribute__((vector_size(64)));
typedef int v8i __attribute__((vector_size(32)));
typedef int v16i __attribute__((vector_size(64)));
/* AVX2: 16 ymm registers, 12 accumulators of 4 rows x 24 columns */
INFERD_UKERNEL(uk_avx2, __attribute__((target("avx2,fma"))), v8f, v8i, 8, 4, 3)
INFERD_UKERNEL(uk1_avx2, __attribute__((target("avx2,fma"))), v8f, v8i, 8, 4, 1)
INFERD_UKERNEL_A(ukr_avx2, __attribute__((target("avx2,fma"))), v8f, v8i, 8, 4, 3, INFERD_A_ROWS)
INFERD_UKERNEL_A(uk1r_avx2, __attribute__((target("avx2,fma"))), v8f, v8i, 8, 4, 1, INFERD_A_ROWS)
INFERD_UKERNEL(uk2_avx2, __attribute__((target("avx2,fma"))), v8f, v8i, 8, 4, 2)
INFERD_UKERNEL_A(uk2r_avx2, __attribute__((target("avx2,fma"))), v8f, v8i, 8, 4, 2, INFERD_A_ROWS)
INFERD_UKOFF(uko_avx2, __attribute__((target("avx2,fma"))), v8f, 8, 4, 3)
INFERD_COLTAIL(tail_avx2, __attribute__((target("avx2,fma"))))
/* 12 accumulators of 6 rows x 16 columns: A broadcast from six rows in place, B a 64-byte line per k */
INFERD_UKERNEL_APU(uks_avx2, __attribute__((target("avx2,fma"))), v8f, v8i, 8, 6, 2, INFERD_A_ROWS, INFERD_NOPF,
                   INFERD_UNROLL2)
INFERD_UKERNEL_APU(uksp_avx2, __attribute__((target("avx2,fma"))), v8f, v8i, 8, 6, 2, INFERD_A_ROWS, INFERD_PFE,
                   INFERD_UNROLL2)
/* AVX-512: 32 zmm registers, 16 accumulators of 8 rows x 32 columns */
INFERD_UKERNEL(uk_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 8, 2)
INFERD_UKERNEL(uk1_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 8, 1)
INFERD_UKERNEL_A(ukr_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 8, 2, INFERD_A_ROWS)
INFERD_UKERNEL_A(uk1r_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 8, 1, INFERD_A_ROWS)
INFERD_UKOFF(uko_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, 16, 8, 2)
/* 24 accumulators of 24 rows x 16 columns, B one register, A broadcast from memory */
INFERD_UKERNEL_A(ukw_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 24, 1, INFERD_A_PANELS)
INFERD_UKOFF_A(ukow_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, 16, 24, 1, INFERD_A_PANELS_K)
/* 64 floats on: the line four 16-column vectors ahead on the same row, one prefetch per line the later calls read */
#define INFERD_PF1(bk) __builtin_prefetch((bk) + 64, 0, 3)
#define INFERD_PF2(bk) (__builtin_prefetch((bk) + 64, 0, 3), __builtin_prefetch((bk) + 80, 0, 3))
INFERD_UKERNEL_AP(ukp_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 8, 2, INFERD_A_PACKED,
                  INFERD_PF2)
INFERD_UKERNEL_AP(ukwp_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 24, 1, INFERD_A_PANELS,
                  INFERD_PF1)
/* 24 accumulators of 12 rows x 32 columns (two zmm of a 96-column panel's row: two whole lines a k) */
INFERD_UKERNEL_APU(uks_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 12, 2, INFERD_A_ROWS,
                   INFERD_NOPF, INFERD_UNROLL2)
INFERD_UKERNEL_APU(uksp_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 12, 2, INFERD_A_ROWS,
                   INFERD_PFE, INFERD_UNROLL2)
INFERD_UKERNEL_APU(uks8_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 8, 2, INFERD_A_ROWS,
                   INFERD_NOPF, INFERD_UNROLL2)
INFERD_UKERNEL_APU(uks4_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 4, 2, INFERD_A_ROWS,
                   INFERD_NOPF, INFERD_UNROLL2)
INFERD_UKERNEL_APU(uks2_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 2, 2, INFERD_A_ROWS,
                   INFERD_NOPF, INFERD_UNROLL2)
INFERD_UKERNEL_APU(uks1_avx512, __attribute__((target("avx512f,avx2,fma"))), v16f, v16i, 16, 1, 2, INFERD_A_ROWS,
                   INFERD_NOPF, INFERD_UNROLL2)
INFERD_UKERNEL_APU(uks4_avx2, __attribute__((target("avx2,fma"))), v8f, v8i, 8, 4, 2, INFERD_A_ROWS, INFERD_NOPF,
                   INFERD_UNROLL2)
INFERD_UKERNEL_APU(uks2_avx2, __attribute__((target("avx2,fma"))), v8f, v8i, 8, 2, 2, INFERD_A_ROWS, INFERD_NOPF,
                   INFERD_UNROLL2)
INFERD_UKERNEL_APU(uks1_avx2, __attribute__((target("avx2,fma"))), v8f, v8i, 8, 1, 2, INFERD_A_ROWS, INFERD_NOPF,
                   INFERD_UNROLL2)
static const isa_t ISA_AVX2 = {1, 4, 24, KC_DEFAULT, uk_avx2, 8, uk1_avx2, tail_avx2, ukr_avx2, uk1r_avx2, uko_avx2,
                               0, NULL, NULL, NULL, NULL, uk2_avx2, uk2r_avx2, 6, 16, uks_avx2, uksp_avx2,
                               {NULL, uks4_avx2, uks2_avx2, uks1_avx2}};
/* the column tail in ymm: Zen 4 issues two 256-bit FMAs a cycle, as many FLOPs as one zmm FMA */
static const isa_t ISA_AVX512 = {2, 8, 32, KC_DEFAULT, uk_avx512, 16, uk1_avx512, tail_avx2, ukr_avx512,
                                 uk1r_avx512, uko_avx512, 24, ukw_avx512, ukow_avx512, ukp_avx512, ukwp_avx512,
                                 NULL, NULL, 12, 32, uks_avx512, uksp_avx512,
                                 {uks8_avx512, uks4_avx512, uks2_avx512, uks1_avx512}};
#endif

static const isa_t* ISA = NULL;

static const isa_t* best_isa(void)
{
#ifdef INFERD_GEMM_X86
    const int l = inferd_x86_level();
    if (l == 2) return &ISA_AVX512;
    if (l == 1) return &ISA_AVX2;
#endif
    return &ISA_BASE;
}

static const isa_t* isa(void)
{
    const isa_t* p = __atomic_load_n(&ISA, __ATOMIC_ACQUIRE);
    if (!p) {
        p = best_isa();
        __atomic_store_n(&ISA, p, __ATOMIC_RELEASE);
    }
    return p;
}

int inferd_gemm_set_isa(int level)
{
    const isa_t* best = best_isa();
    const isa_t* p = best;
#ifdef INFERD_GEMM_X86
    if (level == 0) p = &ISA_BASE;
    if (level == 1 && best->level >= 1) p = &ISA_AVX2;
#else
    if (level == 0) p = &ISA_BASE;
#endif
    __atomic_store_n(&ISA, p, __ATOMIC_RELEASE);
    return p->level;
}

int inferd_gemm_isa(void) { return isa()->level; }

inferd_ukoff_fn inferd_gemm_ukoff(int* mrk, int* nr)
{
    const isa_t* p = isa();
    *mrk = p->mrk;
    *nr = p->nr;
    return p->uko;
}

inferd_ukoff_fn inferd_gemm_ukoff_wide(int* mrw, int* vl)
{
    const isa_t* p = isa();
    *mrw = p->mrw;
    *vl = p->vl;
    return p->ukow;
}

long long inferd_gemm_packed_size(int M, int K) { return (long long)((M + MRP - 1) / MRP) * MRP * K; }

void inferd_gemm_pack_a(const float* a, long long lda_m, long long lda_k, int M, int K, float* ap)
{
    const int np = (M + MRP - 1) / MRP;
    for (int p = 0; p < np; ++p) {
        float* restrict d = ap + (size_t)p * K * MRP;
        for (int k = 0; k < K; ++k)
            for (int i = 0; i < MRP; ++i) {
                const int m = p * MRP + i;
                d[(size_t)k * MRP + i] = m < M ? a[(ptrdiff_t)m * lda_m + (ptrdiff_t)k * lda_k] : 0.0f;
            }
    }
}

#define NBP 96 /* columns per prepacked B panel: a multiple of every micro-kernel's nr (32, 24, 12, 8) */

long long inferd_gemm_packed_b_size(int K, int N) { return (long long)((N + NBP - 1) / NBP) * NBP * K; }

void inferd_gemm_pack_b(const float* b, long long bsk, long long bsn, int K, int N, float* bp)
{
    /* in 64-row tiles: a tile of a panel (64 x 96 floats) stays in L1 whichever way B is stored. For a weight
       stored transposed (bsk == 1, vgg16's 25088 x 4096 fc6) the untiled loops walked 100 KB rows one float
       at a time and packing took 1.6 s; each tile now reads 64 contiguous floats per column */
    enum { KT = 64 };
    const int np = (N + NBP - 1) / NBP;
    for (int p = 0; p < np; ++p) {
        float* restrict d = bp + (size_t)p * K * NBP;
        const int nv = imin(NBP, N - p * NBP);
        for (int k0 = 0; k0 < K; k0 += KT) {
            const int k1 = imin(K, k0 + KT);
            if (bsn == 1) {
                for (int k = k0; k < k1; ++k) {
                    const float* restrict s = b + (ptrdiff_t)k * bsk + (ptrdiff_t)p * NBP;
                    for (int j = 0; j < nv; ++j) d[(size_t)k * NBP + j] = s[j];
                }
            } else {
                for (int j = 0; j < nv; ++j) {
                    const float* restrict s = b + (ptrdiff_t)(p * NBP + j) * bsn;
                    for (int k = k0; k < k1; ++k) d[(size_t)k * NBP + j] = s[(ptrdiff_t)k * bsk];
                }
            }
            for (int k = k0; k < k1; ++k)
                for (int j = nv; j < NBP; ++j) d[(size_t)k * NBP + j] = 0.0f;
        }
    }
}

/* Rows m0..m1 (m0 a multiple of MRP), columns k0..k0+kc of a strided A into MRP-row panels of pitch kc*MRP. */
static void pack_a_dyn(float* restrict dst, const float* restrict a, long long asm_, long long ask, int M, int m0,
                       int m1, int k0, int kc)
{
    for (int i0 = m0; i0 < m1; i0 += MRP) {
        float* restrict d = dst + (size_t)((i0 - m0) / MRP) * kc * MRP;
        if (asm_ == 1 && i0 + MRP <= M) {
            /* rows are adjacent elements (a transposed view: Winograd's V^T in the B form): 8 contiguous floats
               per k, instead of 8 strided walks */
            for (int k = 0; k < kc; ++k) {
                const float* restrict s = a + (ptrdiff_t)(k0 + k) * ask + i0;
                for (int i = 0; i < MRP; ++i) d[(size_t)k * MRP + i] = s[i];
            }
            continue;
        }
        for (int i = 0; i < MRP; ++i) {
            const int m = i0 + i;
            if (m >= M) {
                for (int k = 0; k < kc; ++k) d[(size_t)k * MRP + i] = 0.0f;
            } else if (ask == 1) {
                const float* restrict s = a + (ptrdiff_t)m * asm_ + k0;
                for (int k = 0; k < kc; ++k) d[(size_t)k * MRP + i] = s[k];
            } else {
                const float* restrict s = a + (ptrdiff_t)m * asm_ + (ptrdiff_t)k0 * ask;
                for (int k = 0; k < kc; ++k) d[(size_t)k * MRP + i] = s[(ptrdiff_t)k * ask];
            }
        }
    }
}

/* ------------------------------------------------------------------ the job */

typedef struct {
    const float* ap;
    long long ap_bs;
    const float* b;
    long long bsk, bsn, b_bs;
    float* c;
    long long csm, csn, c_bs;
    const float* r;
    long long r_bs;
    const float* bias;
    long long bias_bs;
    int bias_cols; /* bias is per column (N) rather than per row (M) */
    /* A given as a plain strided matrix (element (m, k) at a[m*asm + k*ask]) instead of packed panels */
    int a_dyn;
    long long asm_, ask;
    /* B prepacked by inferd_gemm_pack_b (96-column panels) instead of a strided matrix */
    int b_pre;
    /* or B's element (k, n) at b + boff[k] + coff[n] (an implicit im2col: row (c, i, j) of a convolution's column
       matrix is input plane c shifted by the tap, column (oh, ow) the output pixel's window origin) */
    const long long *boff, *coff;
    int M, K, N, batch;
    int act;
    float p0, p1;
    int mu, um; /* rows per unit of the M split (whole panels) and the units; task mi takes an even share */
    int nu, np; /* columns per unit of the N split (one column panel) and the panels; likewise */
    int tm, tn; /* tasks along M and N per batch item */
    const isa_t* isa;
    int failed;
    int path;               /* which kernel every task runs: decided once per call (gemm_run) */
    unsigned long long seq; /* this call's number (never 0): the key of the packed B a thread keeps */
} job_t;

/* Per-thread scratch for packed B: grown on demand, kept for the thread's life (at most kc * NC_MAX floats). */
static __thread float* tl_buf = NULL;
static __thread size_t tl_cap = 0;

/* The key's destructor frees a thread's buffer when the thread exits (pool workers on a resize, a caller's
   threads), so nothing leaks; the key only carries the pointer for that. */
static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
static void tl_free(void* p) { free(p); }
static void tl_init(void) { pthread_key_create(&tl_key, tl_free); }

static float* scratch(size_t n)
{
    if (n > tl_cap) {
        void* p = NULL;
        if (posix_memalign(&p, 64, n * sizeof(float)) != 0) return NULL;
        free(tl_buf);
        tl_buf = (float*)p;
        tl_cap = n;
        pthread_once(&tl_once, tl_init);
        pthread_setspecific(tl_key, p);
    }
    return tl_buf;
}

/* B read in place through the prefetching micro-kernels (isa_t.ukp, ukwp) for up to this many rows, on at least
   this many columns (see gemm_block) */
#define PF_MAX_M 32
#define PF_MIN_N 784

/* B block (rows k0..k0+kc, columns n0..n1) into panels of nr columns, k-major, zero-padded past n1. */
static void pack_b(float* restrict dst, const float* restrict b, long long bsk, long long bsn, int k0, int kc, int n0,
                   int n1, int nr, const long long* boff, const long long* coff)
{
    if (boff) { /* element (k, n) at b + boff[k] + coff[n] */
        for (int j0 = n0; j0 < n1; j0 += nr, dst += (size_t)kc * nr) {
            const int nv = imin(nr, n1 - j0);
            const long long* restrict co = coff + j0;
            /* a panel within one output row has evenly spaced columns (the stride): a strided copy that
               vectorises instead of a gather; checked on every column, the tables being arbitrary */
            const long long st = nv > 1 ? co[1] - co[0] : 1;
            int even = 1;
            for (int j = 2; j < nv; ++j) even &= co[j] - co[j - 1] == st;
            for (int k = 0; k < kc; ++k) {
                const float* restrict row = b + boff[k0 + k];
                float* restrict d = dst + (size_t)k * nr;
                int j = 0;
                if (even && st == 1) {
                    const float* restrict s = row + co[0];
                    for (; j < nv; ++j) d[j] = s[j];
                } else if (even && st == 2) {
                    const float* restrict s = row + co[0];
                    for (; j < nv; ++j) d[j] = s[2 * j];
                } else if (even) {
                    const float* restrict s = row + co[0];
                    for (; j < nv; ++j) d[j] = s[(ptrdiff_t)j * st];
                } else {
                    for (; j < nv; ++j) d[j] = row[co[j]];
                }
                for (; j < nr; ++j) d[j] = 0.0f;
            }
        }
        return;
    }
    for (int j0 = n0; j0 < n1; j0 += nr) {
        const int nv = imin(nr, n1 - j0);
        float* restrict d = dst;
        if (bsn == 1) {
            for (int k = 0; k < kc; ++k) {
                const float* restrict s = b + (ptrdiff_t)(k0 + k) * bsk + j0;
                int j = 0;
                for (; j < nv; ++j) d[(size_t)k * nr + j] = s[j];
                for (; j < nr; ++j) d[(size_t)k * nr + j] = 0.0f;
            }
        } else {
            for (int j = 0; j < nv; ++j) {
                const float* restrict s = b + (ptrdiff_t)(j0 + j) * bsn + (ptrdiff_t)k0 * bsk;
                if (bsk == 1)
                    for (int k = 0; k < kc; ++k) d[(size_t)k * nr + j] = s[k];
                else
                    for (int k = 0; k < kc; ++k) d[(size_t)k * nr + j] = s[(ptrdiff_t)k * bsk];
            }
            for (int k = 0; k < kc; ++k)
                for (int j = nv; j < nr; ++j) d[(size_t)k * nr + j] = 0.0f;
        }
        dst += (size_t)kc * nr;
    }
}

/* Batch item bi's operands: B, C, the residual and the bias (NULL where absent). */
typedef struct {
    const float* b;
    float* c;
    const float *r, *bias;
} item_t;
static inline item_t item_of(const job_t* J, int bi)
{
    item_t it = {J->b + (ptrdiff_t)bi * J->b_bs, J->c + (ptrdiff_t)bi * J->c_bs,
                 J->r ? J->r + (ptrdiff_t)bi * J->r_bs : NULL, J->bias ? J->bias + (ptrdiff_t)bi * J->bias_bs : NULL};
    return it;
}

/* The costly activations through act_vec (store_tile is built for the baseline ISA); the others inlined. */
static inline void act_store(float* d, ptrdiff_t n, int act, float p0, float p1)
{
    if (INFERD_ACT_COSTLY(act))
        act_vec(d, n, act, p0, p1);
    else
        act_inplace(d, n, act, p0, p1);
}

/* Tile t (rows x nr, only nv columns valid) into C. first: the first K block (store, add bias); last: the last
   (add the residual, apply the activation); in between: accumulate. */
static void store_tile(const job_t* J, int bi, int m0, int rows, int n0, int nv, int nr, const float* t, int first,
                       int last)
{
    const item_t it = item_of(J, bi);
    float* c = it.c;
    const float *r = it.r, *bias = it.bias;
    const int act = J->act;
    const float p0 = J->p0, p1 = J->p1;
    /* The tile's rows one contiguous range of C (the whole width, rows packed: a 1x1 conv on a 1-pixel map, N = 1):
       the activation goes over all of it at once. Per row, a squeeze-excitation's 48 -> 1152 conv with its Sigmoid
       spent 20 us in act_inplace calls on one value each, 8.9 us without the activation. */
    const int whole = last && act && J->csn == 1 && n0 == 0 && nv == J->N && J->csm == nv;
    float row[NBP];
    for (int i = 0; i < rows; ++i) {
        const int m = m0 + i;
        const float* restrict ti = t + (size_t)i * nr;
        const float bv = first && bias && !J->bias_cols ? bias[m] : 0.0f;
        const float* bcol = first && bias && J->bias_cols ? bias + n0 : NULL;
        if (J->csn == 1) {
            float* restrict d = c + (ptrdiff_t)m * J->csm + n0;
            if (first) {
                for (int j = 0; j < nv; ++j) d[j] = ti[j] + bv;
                if (bcol)
                    for (int j = 0; j < nv; ++j) d[j] += bcol[j];
            } else {
                for (int j = 0; j < nv; ++j) d[j] += ti[j];
            }
            if (last) {
                if (r) {
                    const float* restrict rr = r + (ptrdiff_t)m * J->csm + n0;
                    for (int j = 0; j < nv; ++j) d[j] += rr[j];
                }
                if (!whole)
                    act_store(d, nv, act, p0, p1);
            }
        } else {
            /* strided columns (a transposed store): gather the row, finish it, scatter it */
            float* d = c + (ptrdiff_t)m * J->csm + (ptrdiff_t)n0 * J->csn;
            for (int j = 0; j < nv; ++j) row[j] = ti[j] + (first ? bv + (bcol ? bcol[j] : 0.0f) : d[(ptrdiff_t)j * J->csn]);
            if (last) {
                if (r) {
                    const float* rr = r + (ptrdiff_t)m * J->csm + (ptrdiff_t)n0 * J->csn;
                    for (int j = 0; j < nv; ++j) row[j] += rr[(ptrdiff_t)j * J->csn];
                }
                act_store(row, nv, act, p0, p1);
            }
            for (int j = 0; j < nv; ++j) d[(ptrdiff_t)j * J->csn] = row[j];
        }
    }
    if (whole)
        act_store(c + (ptrdiff_t)m0 * J->csm, (ptrdiff_t)rows * nv, act, p0, p1);
}

/* micro-kernel UK (uk or uk1: the local chosen for the packed A panel) on rows m.. of A, in place (its row-major
   twin I->ukr or I->uk1r) or from the packed panel */
#define UK_CALL(UK, BP, T, E)                                                         \
    do {                                                                              \
        if (arow)                                                                     \
            I->UK##r(kc, arp + (ptrdiff_t)sub * lda, lda, (BP), ldb, (T), (E));       \
        else                                                                          \
            UK(kc, apan + sub, 0, (BP), ldb, (T), (E));                               \
    } while (0)

/* Where column panel jp (its first column j0, nv columns) of the K block at k0 is read from: B prepacked at load,
   this task's packed block, or B in place (whole panels of contiguous rows); its row pitch to *ldb. */
static const float* b_panel(const job_t* J, const float* b, const float* buf, int inplace, int kc, int k0, int jp,
                            int j0, int nv, long* ldb)
{
    const int nr = J->isa->nr;
    if (J->b_pre) {
        *ldb = NBP;
        return b + (size_t)(j0 / NBP) * J->K * NBP + (size_t)k0 * NBP + (j0 % NBP);
    }
    if (!inplace || nv < nr) {
        *ldb = nr;
        return buf + (size_t)jp * kc * nr;
    }
    *ldb = (long)J->bsk;
    return b + (ptrdiff_t)k0 * J->bsk + j0;
}

/* Leftover columns of the ragged panel from this many on go through one more vector of the micro-kernel, over
   the packed panel's zero columns (room for a whole vector past them: the scratch panel is nr wide, a prepacked
   one NBP), instead of the column tail. The tail's broadcast FMAs ran at about a third of the FMA rate:
   squeezenet1_1's classifier (1000x512x169: 9 columns after 160) spent 14.5% of its time there on 5.3% of the
   columns (Xeon, one thread). Alternating in one process: that GEMM 0.89x the time on one thread, 0.93x on two;
   192x48x169 and 256x64x169 0.95-0.98x; squeezenet1_1 0.975x; 1-4 leftover columns no faster this way. The
   8-row path does the same, so a row's sums (sequential over k, in both kernels) do not depend on whether a
   split put it in a taller tile: the bits stay the same across pool sizes. */
#define COLTAIL_VEC_MIN 6

/* Whether the ragged panel's nc leftover columns (after nvec whole vectors, the panel starting at column jl) go
   through one more vector: enough of them, and room for it in the panel they are read from. */
static int coltail_as_vector(const job_t* J, int jl, int nvec, int nc)
{
    const int room = J->b_pre ? NBP - jl % NBP : J->isa->nr;
    return nc >= COLTAIL_VEC_MIN && nvec + J->isa->vl <= room;
}

/* One group of isa_t.mrw rows (G whole packed panels) against every column panel of the task's K block: the
   taller tile of one vector per call (two per 32-column panel), the ragged panel's whole vectors the same way,
   and its leftover columns through one more such vector or the column tail one 8-row panel at a time (see
   COLTAIL_VEC_MIN). Each output element sums the same products in the same order as through the 8-row kernels:
   the results do not change, bit for bit. */
static void gemm_rows_wide(const job_t* J, int bi, int i0, int n0, int n1, int kc, int k0, int kb, int nk,
                           int inplace, float* buf, epi_t* epi, float* tile, int nvec, int coltail, int pf)
{
    const isa_t* I = J->isa;
    const ukernel_fn ukw = pf ? I->ukwp : I->ukw;
    const int K = J->K, nr = I->nr, mrw = I->mrw, G = mrw / MRP;
    const int npan = (n1 - n0 + nr - 1) / nr;
    const item_t it = item_of(J, bi);
    const float *b = it.b, *r = it.r, *bias = it.bias;
    float* c = it.c;
    const int direct = J->csn == 1;
    const float* aw = J->ap + (ptrdiff_t)bi * J->ap_bs + (size_t)(i0 / MRP) * K * MRP + (size_t)k0 * MRP;
    const long ldaw = (long)K * MRP;
    epi->bias = bias && !J->bias_cols ? bias + i0 : NULL;
    epi->first = kb == 0, epi->last = kb == nk - 1;
    const float* bpl = NULL;
    long ldbl = 0;
    for (int jp = 0; jp < npan; ++jp) {
        const int j0 = n0 + jp * nr, nv = imin(nr, n1 - j0);
        long ldb;
        const float* bp = b_panel(J, b, buf, inplace, kc, k0, jp, j0, nv, &ldb);
        if (nv < nr) bpl = bp, ldbl = ldb;
        const int nfull = nv < nr ? nvec : nr;
        for (int v0 = 0; v0 < nfull; v0 += I->vl) {
            if (direct) {
                epi->c = c + (ptrdiff_t)i0 * J->csm + j0 + v0;
                epi->bias_c = bias && J->bias_cols ? bias + j0 + v0 : NULL;
                epi->r = r ? r + (ptrdiff_t)i0 * J->csm + j0 + v0 : NULL;
                ukw(kc, aw, ldaw, bp + v0, ldb, NULL, epi);
            } else {
                ukw(kc, aw, ldaw, bp + v0, ldb, tile, NULL);
                store_tile(J, bi, i0, mrw, j0 + v0, I->vl, I->vl, tile, kb == 0, kb == nk - 1);
            }
        }
    }
    if (coltail) {
        const int jl = n0 + (npan - 1) * nr, nc = n1 - jl - nvec;
        if (coltail_as_vector(J, jl, nvec, nc)) {
            I->ukw(kc, aw, ldaw, bpl + nvec, ldbl, tile, NULL);
            store_tile(J, bi, i0, mrw, jl + nvec, nc, I->vl, tile, kb == 0, kb == nk - 1);
            return;
        }
        for (int g = 0; g < G; ++g) {
            I->tail(kc, aw + (size_t)g * ldaw, bpl + nvec, ldbl, nc, tile);
            store_tile(J, bi, i0 + g * MRP, MRP, jl + nvec, nc, nc, tile, kb == 0, kb == nk - 1);
        }
    }
}

/* Which block of B this thread's scratch holds packed: call, batch item, columns (with one K block only). Row
   tasks of one call all need the same columns of B; a thread running several of them (four tasks a thread, for
   the balance under load) packed them again for each. 1000x512x169 (squeezenet1_1's classifier) on two threads:
   eight packs of 346 KB, a tenth of its time; now two. Alternating in one process, two threads: that GEMM 0.91x
   the time, 1152x192x49 0.90x, 160x960x49 0.94x, others 0.95-1.0x; resnet50, mobilenetv2, squeezenet1_1,
   unet_small 0.97x, shufflenetv2 0.95x, vit_tiny 0.955x, the others 0.99x; one thread unchanged. */
static __thread struct {
    unsigned long long seq;
    const float* buf;
    int bi, n0, n1;
} tl_bkey;
static unsigned long long g_gemm_seq = 0;
static void gemm_block(job_t* J, int bi, int m0, int m1, int n0, int n1)
{
    const isa_t* I = J->isa;
    const int K = J->K, nr = I->nr, mrk = I->mrk;
    const int npan = (n1 - n0 + nr - 1) / nr;
    /* K block: the ISA's, or longer while all of B's columns in one block stay within the kc x NC_MAX scratch
       (few columns: a 7x7 map's 49). Each K block after the first reads and rewrites C; on Zen 4 one block for
       320x960x49 ran 4% faster than five of 192. Decided from N, not this task's columns, so the summation order
       (and the result, bitwise) does not depend on how the work was split over threads. */
    const int kcI = imax(I->kc, imin(KC_MAX, I->kc * NC_MAX / ((J->N + nr - 1) / nr * nr)));
    const int nk = (K + kcI - 1) / kcI;
    const int kcmax = (K + nk - 1) / nk;
    const size_t bsz = J->b_pre ? 0 : (size_t)kcmax * npan * nr;
    const int wide = I->mrw && !J->a_dyn; /* isa_t.mrw */
    /* a row operand given as a plain matrix is packed one 8-row panel at a time, just before its sweep over
       the column panels: the scratch stays kc x (NC_MAX + 8) floats per thread whatever the row count */
    const size_t asz = J->a_dyn ? (size_t)MRP * kcmax : 0;
    float* buf = scratch(bsz + asz + 1);
    float* abuf = buf + bsz;
    if (!buf) {
        __atomic_store_n(&J->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float tile[MRP * 64] __attribute__((aligned(64))); /* the taller tiles' too: mrw x vl <= 512 */
    const float* ap = J->ap + (ptrdiff_t)bi * J->ap_bs;
    const item_t it = item_of(J, bi);
    const float *b = it.b, *r = it.r, *bias = it.bias;
    float* c = it.c;
    const int direct = J->csn == 1;
    epi_t epi;
    memset(&epi, 0, sizeof epi);
    epi.ldc = J->csm, epi.ldr = J->csm, epi.act = J->act, epi.p0 = J->p0, epi.p1 = J->p1;
    for (int kb = 0; kb < nk; ++kb) {
        const int k0 = (int)((long long)K * kb / nk), k1 = (int)((long long)K * (kb + 1) / nk), kc = k1 - k0;
        /* Rows of B that are contiguous along n are read in place, full panels at least (kc rows of nr floats
           at pitch bsk; a 7x7 map's B was packed once per task, up to 4x over when M is split); panels that
           are not contiguous, and the ragged last one, are packed (reading past it could leave the array). */
        /* In place only for up to 16 rows, where packing is not amortised. From 17 rows on B is packed, short
           rows too: in a model B was just written by the layer before (an im2col, a depthwise conv; half of it
           by the other core), and read in place it misses with nothing to prefetch it, where packing reads its
           rows front to back (24x144 on 56x56 right after the depthwise conv that writes it: 258 -> 213 us;
           24x96 on 112x112 807 -> 547). Hot in cache, as a bench loop leaves it, in place had won (24x144 on
           56x56 0.21 vs 0.26 ms) and long rows had already been packed (64x147 on 112x112: 3.7 vs 2.8 ms).
           Whole models, alternating in one process: resnet50 0.94-0.99x the time, googlenet 0.95x,
           squeezenet1_1 0.96x, mobilenetv2 0.95-0.96x, shufflenetv2 0.95x, the others 0.98-0.99x.
           With AVX-512, 17-32 rows on a map of 28x28 or more are read in place again, by micro-kernels that
           prefetch each row four vectors ahead: the misses that packing hid are then in flight while the FMAs run
           (1x1 convs alone, one thread, alternating in one process: 144->24 on 56x56 0.81x the time, 192->32 on
           28x28 0.86x; 64 rows and more gained 5% or lost up to 14%, 14x14 maps nothing). Whole models: the same
           bits; mobilenetv2 0.97-0.99x, shufflenetv2 0.98-0.99x, efficientnet_b0 0.99x, the others 0.99-1.005x. */
        const int pf = I->ukwp && J->bsn == 1 && !J->b_pre && !J->boff && J->M > 16 && J->M <= PF_MAX_M &&
                       J->N >= PF_MIN_N;
        const int inplace = (J->bsn == 1 && !J->b_pre && !J->boff && J->M <= 16) || pf;
        const ukernel_fn uk = pf ? I->ukp : I->uk, uk1 = I->uk1, uk2 = I->uk2; /* for UK_CALL */
        if (J->b_pre) {
            /* nothing to pack: panels were laid out at load */
        } else if (inplace) {
            tl_bkey.seq = 0;
            if ((n1 - n0) % nr)
                pack_b(buf + (size_t)(npan - 1) * kc * nr, b, J->bsk, 1, k0, kc, n0 + (npan - 1) * nr, n1, nr, NULL,
                       NULL);
        } else if (nk == 1 && tl_bkey.seq == J->seq && tl_bkey.buf == buf && tl_bkey.bi == bi &&
                   tl_bkey.n0 == n0 && tl_bkey.n1 == n1) {
            /* this thread packed the same block of B for an earlier task of this call */
        } else {
            pack_b(buf, b, J->bsk, J->bsn, k0, kc, n0, n1, nr, J->boff, J->coff);
            tl_bkey.seq = nk == 1 ? J->seq : 0;
            tl_bkey.buf = buf, tl_bkey.bi = bi, tl_bkey.n0 = n0, tl_bkey.n1 = n1;
        }
        /* rows outer, column panels inner: each row of C is written front to back (the hardware prefetcher
           follows; a cold output written tile by tile down the rows was 2-5x slower), the A micro-panel
           stays in L1 and the packed B block streams from L2 */
        for (int i0 = m0, step = MRP; i0 < m1; i0 += step) {
            /* the ragged last panel: its whole vectors through uk1, the leftover columns after the row loop */
            const int jl = n0 + (npan - 1) * nr, nvl = n1 - jl;
            const int ragged = nvl < nr, nvec = ragged ? nvl / I->vl * I->vl : nr;
            const int coltail = ragged && nvec < nvl;
            step = MRP;
            if (wide && i0 + I->mrw <= m1) {
                step = I->mrw;
                gemm_rows_wide(J, bi, i0, n0, n1, kc, k0, kb, nk, inplace, buf, &epi, tile, nvec, coltail, pf);
                continue;
            }
            /* a row-major A with a whole panel of rows here is read in place (see isa_t.ukr); the column tail
               still wants the packed panel */
            const int arow = J->a_dyn && J->ask == 1 && i0 + MRP <= m1;
            const float* arp = arow ? J->ap + (ptrdiff_t)bi * J->ap_bs + (ptrdiff_t)i0 * J->asm_ + k0 : NULL;
            const long lda = (long)J->asm_;
            if (J->a_dyn && (!arow || coltail))
                pack_a_dyn(abuf, J->ap + (ptrdiff_t)bi * J->ap_bs, J->asm_, J->ask, J->M, i0, imin(i0 + MRP, m1), k0,
                           kc);
            const float* apan = J->a_dyn ? abuf
                                         : ap + (size_t)(i0 / MRP) * K * MRP + (size_t)k0 * MRP;
            const float* bpl = NULL;
            long ldbl = 0;
            for (int sub = 0; sub < MRP && i0 + sub < m1; sub += mrk) {
                const int rows = imin(mrk, m1 - i0 - sub), m = i0 + sub;
                epi.bias = bias && !J->bias_cols ? bias + m : NULL;
                epi.first = kb == 0, epi.last = kb == nk - 1;
                for (int jp = 0; jp < npan; ++jp) {
                    const int j0 = n0 + jp * nr, nv = imin(nr, n1 - j0);
                    long ldb;
                    const float* bp = b_panel(J, b, buf, inplace, kc, k0, jp, j0, nv, &ldb);
                    if (nv < nr) {
                        bpl = bp, ldbl = ldb;
                        for (int v0 = 0, w; v0 < nvec; v0 += w) {
                            w = uk2 && v0 + 2 * I->vl <= nvec ? 2 * I->vl : I->vl;
                            if (direct && rows == mrk) {
                                epi.c = c + (ptrdiff_t)m * J->csm + j0 + v0;
                                epi.bias_c = bias && J->bias_cols ? bias + j0 + v0 : NULL;
                                epi.r = r ? r + (ptrdiff_t)m * J->csm + j0 + v0 : NULL;
                                if (w > I->vl)
                                    UK_CALL(uk2, bp + v0, NULL, &epi);
                                else
                                    UK_CALL(uk1, bp + v0, NULL, &epi);
                            } else {
                                if (w > I->vl)
                                    UK_CALL(uk2, bp + v0, tile, NULL);
                                else
                                    UK_CALL(uk1, bp + v0, tile, NULL);
                                store_tile(J, bi, m, rows, j0 + v0, w, w, tile, kb == 0, kb == nk - 1);
                            }
                        }
                    } else if (direct && rows == mrk) {
                        epi.c = c + (ptrdiff_t)m * J->csm + j0;
                        epi.bias_c = bias && J->bias_cols ? bias + j0 : NULL;
                        epi.r = r ? r + (ptrdiff_t)m * J->csm + j0 : NULL;
                        UK_CALL(uk, bp, NULL, &epi);
                    } else {
                        UK_CALL(uk, bp, tile, NULL);
                        store_tile(J, bi, m, rows, j0, nv, nr, tile, kb == 0, kb == nk - 1);
                    }
                }
            }
            if (coltail) {
                const int nc = nvl - nvec;
                if (coltail_as_vector(J, jl, nvec, nc)) {
                    const long ldb = ldbl;
                    for (int sub = 0; sub < MRP && i0 + sub < m1; sub += mrk) {
                        UK_CALL(uk1, bpl + nvec, tile, NULL);
                        store_tile(J, bi, i0 + sub, imin(mrk, m1 - i0 - sub), jl + nvec, nc, I->vl, tile, kb == 0,
                                   kb == nk - 1);
                    }
                } else {
                    I->tail(kc, apan, bpl + nvec, ldbl, nc, tile);
                    store_tile(J, bi, i0, imin(MRP, m1 - i0), jl + nvec, nc, nc, tile, kb == 0, kb == nk - 1);
                }
            }
        }
    }
}

/* Few columns (a batch-1 linear layer; a 1-D conv over a few frames): stream each A panel once, 8 rows x up to 8
   columns read from B in place. Through the tiled path, 5-8 columns went to the column tail reading them from a
   32-column packed panel (a cache line per k): a VAD's 258x256x5 STFT conv took 36 us there. */
#define GEMV_MAX_N 8
#define INFERD_GEMV_COLS(NCOLS)                                                                        \
    for (int i0 = m0; i0 < m1; i0 += MRP) {                                                             \
        const float* restrict a = ap + (size_t)(i0 / MRP) * K * MRP;                                    \
        vg_t acc[NCOLS][VGH];                                                                           \
        for (int n = 0; n < NCOLS; ++n)                                                                 \
            for (int h = 0; h < VGH; ++h) acc[n][h] = (vg_t){0};                                        \
        for (int k = 0; k < K; ++k) {                                                                   \
            vg_t av[VGH];                                                                               \
            VG_LOAD(av, a + (size_t)k * MRP);                                                 \
            for (int n = 0; n < NCOLS; ++n) {                                                           \
                const vg_t bn = b[(ptrdiff_t)k * bsk + (ptrdiff_t)n * bsn] - (vg_t){0};                 \
                for (int h = 0; h < VGH; ++h) acc[n][h] += av[h] * bn;                                  \
            }                                                                                           \
        }                                                                                               \
        for (int i = 0; i < MRP; ++i)                                                                   \
            for (int n = 0; n < NCOLS; ++n) tile[i * NCOLS + n] = acc[n][i / VG][i % VG];               \
        store_tile(J, bi, i0, imin(MRP, m1 - i0), 0, NCOLS, NCOLS, tile, 1, 1);                          \
    }

/* One column (batch-1 linear layers): memory-bound, so four independent accumulators over k hide the add
   latency and the loop streams each A panel once. */
INFERD_CLONES
static void gemv1_block(job_t* J, int bi, int m0, int m1)
{
    const int K = J->K;
    const long long bsk = J->bsk;
    const float* ap = J->ap + (ptrdiff_t)bi * J->ap_bs;
    const float* restrict b = J->b + (ptrdiff_t)bi * J->b_bs;
    float tile[MRP];
    for (int i0 = m0; i0 < m1; i0 += MRP) {
        const float* restrict a = ap + (size_t)(i0 / MRP) * K * MRP;
        vg_t acc0[VGH] = {{0}}, acc1[VGH] = {{0}}, acc2[VGH] = {{0}}, acc3[VGH] = {{0}}, av[VGH];
        int k = 0;
        for (; k + 4 <= K; k += 4) {
            VG_LOAD(av, a + (size_t)k * MRP);
            for (int h = 0; h < VGH; ++h) acc0[h] += av[h] * (b[(ptrdiff_t)k * bsk] - (vg_t){0});
            VG_LOAD(av, a + (size_t)(k + 1) * MRP);
            for (int h = 0; h < VGH; ++h) acc1[h] += av[h] * (b[(ptrdiff_t)(k + 1) * bsk] - (vg_t){0});
            VG_LOAD(av, a + (size_t)(k + 2) * MRP);
            for (int h = 0; h < VGH; ++h) acc2[h] += av[h] * (b[(ptrdiff_t)(k + 2) * bsk] - (vg_t){0});
            VG_LOAD(av, a + (size_t)(k + 3) * MRP);
            for (int h = 0; h < VGH; ++h) acc3[h] += av[h] * (b[(ptrdiff_t)(k + 3) * bsk] - (vg_t){0});
        }
        for (; k < K; ++k) {
            VG_LOAD(av, a + (size_t)k * MRP);
            for (int h = 0; h < VGH; ++h) acc0[h] += av[h] * (b[(ptrdiff_t)k * bsk] - (vg_t){0});
        }
        for (int h = 0; h < VGH; ++h) acc0[h] = (acc0[h] + acc1[h]) + (acc2[h] + acc3[h]);
        for (int h = 0; h < VGH; ++h) memcpy(tile + h * VG, &acc0[h], sizeof(vg_t));
        store_tile(J, bi, i0, imin(MRP, m1 - i0), 0, 1, 1, tile, 1, 1);
    }
}

INFERD_CLONES
static void gemv_block(job_t* J, int bi, int m0, int m1)
{
    const int K = J->K;
    const long long bsk = J->bsk, bsn = J->bsn;
    const float* ap = J->ap + (ptrdiff_t)bi * J->ap_bs;
    const float* restrict b = J->b + (ptrdiff_t)bi * J->b_bs;
    float tile[MRP * GEMV_MAX_N];
    switch (J->N) {
    case 1: gemv1_block(J, bi, m0, m1); break;
    case 2: INFERD_GEMV_COLS(2) break;
    case 3: INFERD_GEMV_COLS(3) break;
    case 4: INFERD_GEMV_COLS(4) break;
    case 5: INFERD_GEMV_COLS(5) break;
    case 6: INFERD_GEMV_COLS(6) break;
    case 7: INFERD_GEMV_COLS(7) break;
    default: INFERD_GEMV_COLS(8) break;
    }
}

/* Few rows against a prepacked B (a batch-1 linear layer; a transformer's last stages at a small input, a box
   head's proposals): stream each 96-column panel once, by blocks of GEMV_KB rows of k (~96 KB, in L2). The first
   row goes over the block's rows whole, front to back: the one pass that reads it from memory, as the hardware
   prefetcher follows. The other rows then compute out of L2: by groups of the slices kernel's rows where the ISA
   has one and A's rows are read in place (AVX2: 6 rows x 16 columns, 12 accumulators), the rest four at a time
   over a slice of the columns (one row x 96 columns, two x 48, three x 24, four x 16), each weight vector
   feeding every row's FMA. The slices kernel's groups, against four rows at a time, Zen 3, two threads: weights
   in cache 7 rows x 384 x 1536 0.67x the time, 8 rows 0.82x, 16 rows 0.91x; streamed from DRAM 7 x 768 x 3072
   0.78x, 13 rows 0.91x, 16 rows 0.94-1.0x (a burst of prefetches of the next block before each of its calls
   cost 1.05-1.15x). All rows in slices from the start, each slice's pass read every sixth line of memory and missed:
   4 x 768 x 3072 with the weights cold, one thread, Zen 3, 1.37 ms, now 0.66 (one row alone: 0.47); a chain of
   twelve such layers (113 MB of weights) at 4 and 16 rows, two threads, 1.13x and 1.05x onnxruntime's time,
   1.68x and 1.69x before. Row by row over all 96 columns, hot: 240 us, now 155. Up to 32 rows: vit_tiny's 17
   tokens at a 64x64 input, 17 x 192 x 768 hot, 32 us where the micro-kernels' 8-row panels took 43; 24 and 32 rows
   as fast either way (where the ISA has a slices kernel, more than SLICES_MIN_M rows take gemm_slices). Each
   output sums in order of k within a K block; the slices kernel's rows add each block's sum to the tile, the
   others each product: equal to rounding. */
#define GEMV_KB 256
#define GEMV_MAX_M 32
#define GEMV_ROWS(R, C, E, PF)                                                                                      \
    for (int h = 0; h < NBP; h += (C)) {                                                                     \
        vg_t acc[R][(C) / VG];                                                                               \
        _Pragma("GCC unroll 16") for (int r = 0; r < (R); ++r)                                                    \
            _Pragma("GCC unroll 16") for (int v = 0; v < (C) / VG; ++v) {                                   \
                if (k0 == 0)                                                                                       \
                    acc[r][v] = (vg_t){0};                                                                         \
                else                                                                                               \
                    memcpy(&acc[r][v], tile + (size_t)(m0 + r) * NBP + h + v * VG, sizeof(vg_t));                  \
            }                                                                                                      \
        const float* restrict bk = bp + (size_t)k0 * NBP + h;                                                      \
        for (int kc = k0; kc < k1; kc += (E)) {                                                                    \
          PF;                                                                                                      \
          const int ke = imin(k1, kc + (E));                                                                       \
          for (int k = kc; k < ke; ++k, bk += NBP) {                                                               \
            float x[R];                                                                                            \
            _Pragma("GCC unroll 16") for (int r = 0; r < (R); ++r)                                                \
                x[r] = a[(ptrdiff_t)(m0 + r) * J->asm_ + (ptrdiff_t)k * J->ask];                                   \
            _Pragma("GCC unroll 16") for (int v = 0; v < (C) / VG; ++v) {                                   \
                vg_t bv;                                                                                           \
                memcpy(&bv, bk + v * VG, sizeof bv);                                                               \
                _Pragma("GCC unroll 16") for (int r = 0; r < (R); ++r) acc[r][v] += x[r] * bv;                                              \
            }                                                                                                      \
          }                                                                                                        \
        }                                                                                                          \
        _Pragma("GCC unroll 16") for (int r = 0; r < (R); ++r)                                                    \
            _Pragma("GCC unroll 16") for (int v = 0; v < (C) / VG; ++v)                                     \
                memcpy(tile + (size_t)(m0 + r) * NBP + h + v * VG, &acc[r][v], sizeof(vg_t));                      \
    }
INFERD_CLONES
static void gemv_bpre_block(job_t* J, int bi, int n0, int n1)
{
    const int K = J->K, M = J->M;
    const float* restrict a = J->ap + (ptrdiff_t)bi * J->ap_bs;
    const float* restrict b = J->b + (ptrdiff_t)bi * J->b_bs;
    float tile[GEMV_MAX_M * NBP];
    /* Groups of the slices kernel's rows (AVX2: 6 rows x 16 columns, 12 accumulators) after the first row, where
       A's rows are read in place; the rest go four at a time. */
    const isa_t* I = J->isa;
    const int mrs = I->uks && J->ask == 1 && NBP % I->sw == 0 ? I->mrs : 0;
    const int m_uks = mrs ? 1 + (M - 1) / mrs * mrs : 1;
    epi_t epi;
    memset(&epi, 0, sizeof epi);
    epi.ldc = NBP;
    /* k steps of the other rows' passes over one K block, per row of k (each group of rows goes over the panel's
       96 columns in NBP / C slices): against the lines of the next block, how often they prefetch one */
    int steps = 0;
    for (int m0 = m_uks; m0 < M; m0 += 4) {
        const int r = imin(4, M - m0);
        steps += NBP / (r == 1 ? 96 : r == 2 ? 48 : r == 3 ? 24 : 16);
    }
    /* K in blocks of equal size (at most GEMV_KB) where the slices kernel's calls carry the stream (below): a short
       last block had the next one, a full block, to bring in over its few k steps (384 as 256 + 128). Only the
       block sizes depend on K: any split of the work gives the same bits. */
    const int nkb = (K + GEMV_KB - 1) / GEMV_KB;
    const int kb = m_uks > 1 && I->uksp ? (K + nkb - 1) / nkb : GEMV_KB;
    for (int j0 = n0; j0 < n1; j0 += NBP) {
        const float* restrict bp = b + (size_t)(j0 / NBP) * K * NBP;
        for (int k0 = 0; k0 < K; k0 += kb) {
            const int k1 = imin(K, k0 + kb);
            {
                const int m0 = 0;
                GEMV_ROWS(1, 96, GEMV_KB, (void)0)
            }
            /* The first row's pass read this block from memory, with nothing to overlap it; the other rows compute
               out of L2. They bring the next block (the rest of K, or the next panel's first) into L2 meanwhile, one
               line every `every` k steps (a chunk of k per prefetch: a test in every k step cost the 4-row
               kernel more than the prefetch gained), spread over their passes rather than in a burst the miss
               buffers would queue: its first-row pass then reads L2. Zen 3, two threads, 24 packed copies of the
               weights cycled (DRAM-bound), against the build before: 4 x 768 x 3072 0.88-0.89x, 2 x 768 x 3072
               0.94x, 8 x 384 x 1536 0.89-0.98x, 16 rows 0.99-1.02x (their stream now goes with uksp, below). */
            const float* pf = NULL;
            int pf_lines = 0;
            if (k1 < K) {
                pf = bp + (size_t)k1 * NBP;
                pf_lines = imin(kb, K - k1) * NBP / 16;
            } else if (j0 + NBP < n1) {
                pf = bp + (size_t)K * NBP;
                pf_lines = imin(kb, K) * NBP / 16;
            }
            int pf_i = 0;
#define GEMV_PF                                                                                                    \
    if (pf_i < pf_lines)                                                                                           \
        __builtin_prefetch(pf + (size_t)16 * pf_i++, 0, 2);
            epi.first = k0 == 0;
            /* The slices kernel's calls take the stream first (uksp), an equal share each, at most a line per k
               step; the four-row passes after them take what is left. Before, only those passes prefetched, and
               a 16-row product's 3-row pass took 2/3 of the next block in a burst at the block's end (7 or 8 rows:
               1/6). Zen 3, two threads, in-process A/B, weights cycled over 24 copies: 16 x 384 x 1536 0.87x the
               time, 16 x 1536 x 384 0.83x, 16 x 768 x 3072 0.81x, 17 x 768 x 192 0.80x, 8 x 384 x 1536 0.91x;
               hot: 0.79-1.0x; convnext_tiny, vit_tiny and deit_tiny at 64 x 64 0.95x, swin_t 0.98x. Not timed on
               AVX-512 (uksp_avx512: the same stream over three 32-column calls a group). */
            const int ncalls = mrs && I->uksp ? (m_uks - 1) / mrs * (NBP / I->sw) : 0;
            /* Two lines a k step where a call covers 32 columns (AVX-512: 12 rows x 32 columns, three calls per
               group of rows, which at one line a step took half the block and left the other half to the 3-row
               passes after them, a burst). Two threads, Zen 4, weights cycled over 24 copies, in-process A/B of
               both changes: 16 x 384 x 1536 0.92x the time, 16 x 1536 x 384 0.84x, 13 x 384 x 1536 0.94x; 8, 24
               and 4 rows 0.99-1.0x; convnext_tiny at 64 x 64 0.96x, deit_tiny 0.99x, vit_tiny and swin_t 1.0x. */
            const int two = I->sw >= 32;
            int per_call = ncalls ? imin((k1 - k0) << two, (pf_lines + ncalls - 1) / ncalls) : 0;
            epi.pf_pair = two && per_call > k1 - k0;
            if (epi.pf_pair) per_call += per_call & 1;
            epi.pf_num = per_call ? ((per_call >> epi.pf_pair) * 256 + (k1 - k0) - 1) / (k1 - k0) : 0;
            int call = 0;
            for (int m0 = 1; m0 < m_uks; m0 += mrs)
                for (int h = 0; h < NBP; h += I->sw, ++call) {
                    epi.c = tile + (size_t)m0 * NBP + h;
                    const int l0 = imin(pf_lines, call * per_call);
                    epi.pf = per_call ? pf + (size_t)16 * l0 : NULL;
                    epi.pf_lines = imin(pf_lines - l0, per_call);
                    (per_call ? I->uksp : I->uks)(k1 - k0, a + (ptrdiff_t)m0 * J->asm_ + k0, J->asm_,
                                                  bp + (size_t)k0 * NBP + h, NBP, NULL, &epi);
                }
            pf_i = imin(pf_lines, ncalls * per_call);
            const int left = pf_lines - pf_i;
            const int every = left ? imax(1, imin(8, steps * (k1 - k0) / left)) : GEMV_KB;
            for (int m0 = m_uks; m0 < M; m0 += 4) {
                switch (imin(4, M - m0)) {
                case 1: GEMV_ROWS(1, 96, every, GEMV_PF) break;
                case 2: GEMV_ROWS(2, 48, every, GEMV_PF) break;
                case 3: GEMV_ROWS(3, 24, every, GEMV_PF) break;
                default: GEMV_ROWS(4, 16, every, GEMV_PF) break;
                }
            }
#undef GEMV_PF
        }
        store_tile(J, bi, 0, M, j0, imin(NBP, n1 - j0), NBP, tile, 1, 1);
    }
}

/* Bytes of a K block's slice of B in gemm_slices: it stays in L1 beside the rows' lines (kc = 384 for 16-column
   slices, 192 for 32). Against 256 rows of 16 columns, one block for K = 384 ran 1.04x faster, 768 and 1536 the
   same within the noise (Zen 3). */
#define SLICE_BYTES (384 * 16 * 4)

/* Rows from which a linear layer takes gemm_slices rather than the few-rows path (gemv_bpre_block, up to
   GEMV_MAX_M). Zen 3, two threads, 384x1536, 1536x384 and 768x3072 weights: at 24 and 32 rows the slices ran
   1.1-1.3x faster with the weights in cache and as fast with them streamed from DRAM (a chain of 48 MB); at 16
   rows 1.15x faster in cache but 0.85x streamed, where the few-rows path reads each weight line once. */
#define SLICES_MIN_M 20
/* ... and from this many up to one group of the slices kernel's rows (isa_t.mrs: 12 on AVX-512), which also reads
   each weight line once. Zen 4, two threads, 768x3072 (us, few-rows path / slices): one layer, weights in L3,
   5 rows 310-318 / 164-166, 8 rows 436-439 / 221-232, 12 rows 462-530 / 286-299, 16 rows 411-422 / 378-400; a
   chain of twelve (113 MB, from DRAM) 5 rows 4186-4282 / 5503-5587, 6 rows 4615-4714 / 5419-5922, 8 rows
   5632-5999 / 4661-4998, 12 rows 6516-6850 / 4752-5062, 16 rows (two groups) 5684-5967 / 6163-6177. Below 8
   rows the streamed case (a board's) keeps the few-rows path; two groups lose it there too. */
#define SLICES_ONE_GROUP_MIN_M 8

/* Whether a product runs through gemm_slices: rows of a plain row-major A (a linear layer's activations, read in
   place) against prepacked B, more than SLICES_MIN_M of them or one group of at least SLICES_ONE_GROUP_MIN_M.
   Decided from the call alone, so the K blocks (and the bits) never depend on how the work is split. */
static int use_slices(const job_t* J)
{
    return J->isa->uks && J->isa->uks_rows[3] && J->a_dyn && J->b_pre && J->ask == 1 && !J->boff &&
           (J->M > SLICES_MIN_M || (J->M >= SLICES_ONE_GROUP_MIN_M && J->M <= J->isa->mrs));
}

/* One call of a slices kernel ``k``: ``rows`` rows of A from row ``i`` (read in place at ``a``) against the sw columns
   of B's slice at ``bp``, finished into C by the kernel's epilogue where the slice is whole and C's rows contiguous,
   else through a raw tile and store_tile. */
static void slices_call(job_t* J, const item_t* it, int bi, ukernel_fn k, int rows, int i, int j0, int nv, int kc,
                        const float* a, long lda, const float* bp, float* tile, epi_t* epi)
{
    if (J->csn == 1 && nv == J->isa->sw) {
        epi->c = it->c + (ptrdiff_t)i * J->csm + j0;
        epi->bias = it->bias && !J->bias_cols ? it->bias + i : NULL;
        epi->bias_c = it->bias && J->bias_cols ? it->bias + j0 : NULL;
        epi->r = it->r ? it->r + (ptrdiff_t)i * J->csm + j0 : NULL;
        k(kc, a, lda, bp, NBP, NULL, epi);
    } else {
        k(kc, a, lda, bp, NBP, tile, NULL);
        store_tile(J, bi, i, rows, j0, nv, J->isa->sw, tile, epi->first, epi->last);
    }
}

/* A linear layer's rows against its prepacked weights, one sw-column slice of B at a time: every row of the task
   runs against the slice while it sits in L1 (kc lines of 64 bytes), mrs rows a call. gemm_block's order (each
   row group against the whole block of B, streamed from L2) and its 24-column slices of the 96-column panels
   (1.5 lines a k, shared between slices) left the 4 x 24 kernel at 78-82% of the FMA peak on vit_tiny's
   197-row products; onnxruntime's 6 x 16 kernel over 16-column panels reaches 91-96%. A short last group runs in
   calls of 8, 4, 2 and 1 rows (isa_t.uks_rows). Each output sums its products in k order within K blocks of at
   most SLICE_BYTES of B's slice, the blocks added in order: the same bits whatever the split. */
static void gemm_slices(job_t* J, int bi, int m0, int m1, int n0, int n1)
{
    static const int RS[4] = {8, 4, 2, 1};
    const isa_t* I = J->isa;
    const int K = J->K, sw = I->sw, mrs = I->mrs;
    const int kcs = SLICE_BYTES / (int)(sizeof(float) * sw), nk = (K + kcs - 1) / kcs;
    const float* a = J->ap + (ptrdiff_t)bi * J->ap_bs;
    const item_t it = item_of(J, bi);
    const long lda = (long)J->asm_;
    float tile[MRP * 64] __attribute__((aligned(64)));
    epi_t epi;
    memset(&epi, 0, sizeof epi);
    epi.ldc = J->csm, epi.ldr = J->csm, epi.act = J->act, epi.p0 = J->p0, epi.p1 = J->p1;
    for (int kb = 0; kb < nk; ++kb) {
        const int k0 = (int)((long long)K * kb / nk), k1 = (int)((long long)K * (kb + 1) / nk), kc = k1 - k0;
        epi.first = kb == 0, epi.last = kb == nk - 1;
        for (int j0 = n0; j0 < n1; j0 += sw) {
            const int nv = imin(sw, n1 - j0);
            const float* bp = it.b + (size_t)(j0 / NBP) * K * NBP + (size_t)k0 * NBP + (j0 % NBP);
            int i = m0;
            for (; i + mrs <= m1; i += mrs)
                slices_call(J, &it, bi, I->uks, mrs, i, j0, nv, kc, a + (ptrdiff_t)i * lda + k0, lda, bp, tile, &epi);
            for (int q = 0; q < 4; ++q)
                for (; I->uks_rows[q] && i + RS[q] <= m1; i += RS[q])
                    slices_call(J, &it, bi, I->uks_rows[q], RS[q], i, j0, nv, kc, a + (ptrdiff_t)i * lda + k0, lda,
                                bp, tile, &epi);
        }
    }
}

/* Tiny products of two activations: attention's per-head q k^T and P v (vit_tiny at 64x64: 3 heads of 18 x 64 x
   18; swin_t's windows 49 x 32 x 49). Packing both operands for the micro-kernels cost more than the product:
   q k^T through k's transposed view 7.6 us, numpy's matmul 4.8. Here B (any strides) is copied into a zero-padded
   row-major scratch of SMALL_CW-column rows, and groups of up to four rows of A run against each SMALL_CW columns
   of it with the accumulators in registers, summing in k order. Decided from the call alone. */
#define SMALL_MAX_N NBP
#define SMALL_MAX_K 1024
#define SMALL_MAX_WORK (128 * 1024)
#define SMALL_CW 16

static int use_small(const job_t* J)
{
    return J->a_dyn && !J->b_pre && !J->boff && J->N <= SMALL_MAX_N && J->K <= SMALL_MAX_K &&
           (double)J->M * J->N * J->K <= SMALL_MAX_WORK;
}

#define SMALL_ROWS(R)                                                                                               \
    for (int h = 0; h < ldp; h += SMALL_CW) {                                                                       \
        vg_t acc[R][SMALL_CW / VG];                                                                                 \
        _Pragma("GCC unroll 4") for (int rr = 0; rr < (R); ++rr)                                                    \
            _Pragma("GCC unroll 4") for (int v = 0; v < SMALL_CW / VG; ++v) acc[rr][v] = (vg_t){0};               \
        const float* restrict bk = bt + h;                                                                          \
        for (int k = 0; k < K; ++k, bk += ldp) {                                                                    \
            vg_t bv[SMALL_CW / VG];                                                                                 \
            _Pragma("GCC unroll 4") for (int v = 0; v < SMALL_CW / VG; ++v) memcpy(&bv[v], bk + v * VG, sizeof(vg_t)); \
            _Pragma("GCC unroll 4") for (int rr = 0; rr < (R); ++rr) {                                              \
                const float x = a[(ptrdiff_t)(m0 + rr) * J->asm_ + (ptrdiff_t)k * J->ask];                         \
                _Pragma("GCC unroll 4") for (int v = 0; v < SMALL_CW / VG; ++v) acc[rr][v] += x * bv[v];          \
            }                                                                                                       \
        }                                                                                                           \
        _Pragma("GCC unroll 4") for (int rr = 0; rr < (R); ++rr)                                                    \
            _Pragma("GCC unroll 4") for (int v = 0; v < SMALL_CW / VG; ++v)                                         \
                memcpy(tile + (size_t)rr * ldp + h + v * VG, &acc[rr][v], sizeof(vg_t));                           \
    }
INFERD_CLONES
static void gemm_small(job_t* J, int bi)
{
    const int M = J->M, K = J->K, N = J->N, ldp = (N + SMALL_CW - 1) / SMALL_CW * SMALL_CW;
    const float* restrict a = J->ap + (ptrdiff_t)bi * J->ap_bs;
    const float* b = J->b + (ptrdiff_t)bi * J->b_bs;
    float* bt = scratch((size_t)K * ldp);
    if (!bt) {
        __atomic_store_n(&J->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int k = 0; k < K; ++k) {
        float* restrict d = bt + (size_t)k * ldp;
        const float* src = b + (ptrdiff_t)k * J->bsk;
        if (J->bsn == 1)
            memcpy(d, src, sizeof(float) * N);
        else
            for (int n = 0; n < N; ++n) d[n] = src[(ptrdiff_t)n * J->bsn];
        for (int n = N; n < ldp; ++n) d[n] = 0.0f;
    }
    float tile[4 * SMALL_MAX_N] __attribute__((aligned(64)));
    for (int m0 = 0; m0 < M; m0 += 4) {
        const int rows = imin(4, M - m0);
        switch (rows) {
        case 1: SMALL_ROWS(1) break;
        case 2: SMALL_ROWS(2) break;
        case 3: SMALL_ROWS(3) break;
        default: SMALL_ROWS(4) break;
        }
        store_tile(J, bi, m0, rows, 0, N, ldp, tile, 1, 1);
    }
}

/* job_t.path: the kernel of a call's tasks */
enum { PATH_BLOCK, PATH_GEMV, PATH_SLICES, PATH_GEMV_B, PATH_SMALL };

static void gemm_task(void* ctx, long long t)
{
    job_t* J = (job_t*)ctx;
    const int per = J->tm * J->tn;
    const int bi = (int)(t / per), rem = (int)(t % per), mi = rem / J->tn, ni = rem % J->tn;
    const int m0 = (int)((long long)J->um * mi / J->tm) * J->mu;
    const int m1 = imin(J->M, (int)((long long)J->um * (mi + 1) / J->tm) * J->mu);
    const int n0 = (int)((long long)J->np * ni / J->tn) * J->nu;
    const int n1 = imin(J->N, (int)((long long)J->np * (ni + 1) / J->tn) * J->nu);
    if (m0 >= m1 || n0 >= n1) return;
    switch (J->path) {
    case PATH_GEMV: gemv_block(J, bi, m0, m1); break;
    case PATH_SLICES: gemm_slices(J, bi, m0, m1, n0, n1); break;
    case PATH_GEMV_B: gemv_bpre_block(J, bi, n0, n1); break;
    case PATH_SMALL: gemm_small(J, bi); break;
    default: gemm_block(J, bi, m0, m1, n0, n1); break;
    }
}

static int gemm_run(int M, int K, int N, int batch, const float* a, long long asm_, long long ask, long long a_bs,
                    int a_packed, const float* b, long long bsk, long long bsn, long long b_bs, int b_packed,
                    const long long* boff, const long long* coff, float* c, long long csm, long long csn, long long c_bs, const float* bias,
                    long long bias_bs, int bias_cols, const float* r, long long r_bs, int act, float p0, float p1,
                    int max_threads);

int inferd_gemm_ex(int M, int K, int N, int batch, const float* a, long long asm_, long long ask, long long a_bs,
                   int a_packed, const float* b, long long bsk, long long bsn, long long b_bs, int b_packed, float* c,
                   long long csm, long long csn, long long c_bs, const float* bias, long long bias_bs, int bias_cols,
                   const float* r, long long r_bs, int act, float p0, float p1, int max_threads)
{
    return gemm_run(M, K, N, batch, a, asm_, ask, a_bs, a_packed, b, bsk, bsn, b_bs, b_packed, NULL, NULL, c, csm, csn, c_bs,
                    bias, bias_bs, bias_cols, r, r_bs, act, p0, p1, max_threads);
}

int inferd_gemm_koff(const float* ap, int M, int K, int N, const float* b, const long long* boff,
                     const long long* coff, float* c, long long csm, const float* bias, const float* r, int act,
                     float p0, float p1, int max_threads)
{
    if (!boff || !coff) return -1;
    return gemm_run(M, K, N, 1, ap, 0, 0, 0, 1, b, 0, 1, 0, 0, boff, coff, c, csm, 1, 0, bias, 0, 0, r, 0, act, p0,
                    p1, max_threads);
}

static int gemm_run(int M, int K, int N, int batch, const float* a, long long asm_, long long ask, long long a_bs,
                    int a_packed, const float* b, long long bsk, long long bsn, long long b_bs, int b_packed,
                    const long long* boff, const long long* coff, float* c, long long csm, long long csn, long long c_bs, const float* bias,
                    long long bias_bs, int bias_cols, const float* r, long long r_bs, int act, float p0, float p1,
                    int max_threads)
{
    if (M <= 0 || N <= 0 || batch <= 0) return 0;
    job_t J;
    memset(&J, 0, sizeof J);
    J.boff = boff, J.coff = coff;
    J.ap = a, J.ap_bs = a_bs, J.a_dyn = !a_packed, J.asm_ = asm_, J.ask = ask;
    J.b = b, J.bsk = bsk, J.bsn = bsn, J.b_bs = b_bs, J.b_pre = b_packed;
    J.c = c, J.csm = csm, J.csn = csn, J.c_bs = c_bs, J.r = r, J.r_bs = r_bs, J.bias = bias, J.bias_bs = bias_bs;
    J.bias_cols = bias_cols;
    J.M = M, J.K = K, J.N = N, J.batch = batch, J.act = act, J.p0 = p0, J.p1 = p1;
    J.seq = __atomic_add_fetch(&g_gemm_seq, 1, __ATOMIC_RELAXED);
    J.isa = isa();
    if (K <= 0) { /* C = act(bias + R): a zero-width product */
        float zeros[MRP * 64] = {0};
        for (int bi = 0; bi < batch; ++bi)
            for (int i0 = 0; i0 < M; i0 += MRP)
                for (int j0 = 0; j0 < N; j0 += 64)
                    store_tile(&J, bi, i0, imin(MRP, M - i0), j0, imin(64, N - j0), 64, zeros, 1, 1);
        return 0;
    }
    const int gemv = N <= GEMV_MAX_N && !J.a_dyn && !J.b_pre && !J.boff;
    const int slices = !gemv && use_slices(&J);
    const int gemv_b = !slices && M <= GEMV_MAX_M && J.a_dyn && J.b_pre;
    const int small = !gemv && use_small(&J);
    J.path = gemv ? PATH_GEMV : small ? PATH_SMALL : slices ? PATH_SLICES : gemv_b ? PATH_GEMV_B : PATH_BLOCK;
    const int nr = gemv ? N : (gemv_b ? NBP : (slices ? J.isa->sw : J.isa->nr));
    const int threads = inferd_pool_threads();
    const double work = (double)M * K * N * batch;
    int want = (max_threads > 0 && max_threads < threads) ? max_threads : threads;
    if (work < 65536.0) want = 1;
    /* at least ~128k multiply-adds a thread (a few microseconds): more threads than that only wake workers */
    else want = imin(want, inferd_pool_useful_threads(work, 131072.0));
    if (small) { /* one task per batch item (a head) */
        J.mu = M, J.um = 1, J.nu = N, J.np = 1, J.tm = 1, J.tn = 1;
        inferd_parallel(gemm_task, &J, batch, want);
        return J.failed ? -1 : 0;
    }
    const long long target = want > 1 ? 4LL * want : 1; /* a few tasks per thread: idle threads steal */
    const int mrow = slices ? J.isa->mrs : MRP; /* rows per unit of the M split */
    const int mp = (M + mrow - 1) / mrow, np = (N + nr - 1) / nr;
    int nb_p = gemv ? 1 : imin(np, imax(1, NC_MAX / nr));
    int tn = (np + nb_p - 1) / nb_p;
    const int tn_l2 = tn; /* the fewest column tasks the L2 blocking allows */
    /* More tasks than the L2 blocking gives: split the bigger operand's dimension. Splitting N makes every
       task read all of A (the weights: 1.6 MB for a 1280x320 layer on a 7x7 map, from DRAM); splitting M
       makes every task read all of B's columns, which is cheap when B is the smaller one. */
    /* Gathered B (an implicit im2col, boff) is always split by columns: a task splitting M would gather all of
       B again (8 tasks on 256x2304x196 gathered it 8 times: 2.2 ms against im2col's 1.1) */
    const int split_n_first = (double)N * batch > (double)M || J.boff;
    if (split_n_first && (long long)tn * batch < target && np > tn) {
        const int want_tn = (int)((target + batch - 1) / batch);
        nb_p = imax(1, (np + want_tn - 1) / want_tn);
        tn = (np + nb_p - 1) / nb_p;
    }
    long long want_tm = 1;
    if (!gemv_b && (long long)tn * batch < target) want_tm = (target + (long long)tn * batch - 1) / ((long long)tn * batch);
    /* Rows are dealt in units of whole taller tiles (isa_t.mrw: a task of 4 panels ran one 24-row group and one
       8-row panel), as evenly as the units allow: rounding the rows per task up to whole units left the last task
       a sliver (1024 rows: seven tasks of 144 and one of 16, so on two threads one idled for most of a task;
       256x528 on a 14x14 map: five of 48 and one of 16, 0.60x the time now). Single panels only where there
       are fewer units than threads. */
    int g = J.isa->mrw && !J.a_dyn && !gemv && !gemv_b ? J.isa->mrw / MRP : 1;
    if (g > 1 && (mp + g - 1) / g < want) g = 1;
    const int um = (mp + g - 1) / g;
    int tm = (int)(want_tm < um ? want_tm : um);
    if (!J.boff && !gemv && !gemv_b && target > 1) {
        /* Of the splits into at least target tasks (or the most there can be), the one that streams the fewest
           operand bytes: each of the tm row tasks reads all of its columns of B, each of the tn column tasks all
           of its rows of A. Splitting the larger dimension first (above) gave 256x2304x196 eight row tasks, each
           packing all of B: 4.2M floats streamed where four by two stream 3.0M. On the 2-core Xeon VM (alternating
           in one process): 256x2304x196 and 256x1152x196 0.82-0.83x the time, 256x528x196 0.91x, 24x144x3136
           0.90x, 128x1152x784 0.91x, the others 0.99-1.04x; whole models resnet50 0.96-0.98x, mobilenetv2,
           efficientnet_b0, googlenet and shufflenetv2 0.96-0.99x, resnet18 and squeezenet1_1 0.99-1.0x, vit_tiny
           0.99-1.01x, unet_small 1.01x. The K blocks do not depend on the split: the same bits either way. */
        double best = -1.0;
        long long best_tasks = 0;
        for (int cm = 1; cm <= um; ++cm) {
            const long long per_row_task = (long long)cm * batch;
            const int cn = imax(tn_l2, imin(np, (int)((target + per_row_task - 1) / per_row_task)));
            const long long tasks = (long long)cm * cn * batch;
            const double cost = (double)cm * K * N + (double)cn * K * M;
            const int enough = tasks >= target, best_enough = best_tasks >= target;
            if (best < 0 || (enough && !best_enough) ||
                (enough == best_enough && (enough ? cost < best : tasks > best_tasks)))
                best = cost, best_tasks = tasks, tm = cm, tn = cn;
        }
    }
    J.mu = g * mrow, J.um = um, J.nu = nr, J.np = np, J.tm = tm, J.tn = tn;
    inferd_parallel(gemm_task, &J, (long long)batch * tm * tn, want);
    return J.failed ? -1 : 0;
}

int inferd_gemm(const float* ap, long long ap_bs, int M, int K, int N, int batch, const float* b, long long bsk,
                long long bsn, long long b_bs, float* c, long long csm, long long csn, long long c_bs,
                const float* bias, long long bias_bs, const float* r, long long r_bs, int act, float p0, float p1,
                int max_threads)
{
    return inferd_gemm_ex(M, K, N, batch, ap, 0, 0, ap_bs, 1, b, bsk, bsn, b_bs, 0, c, csm, csn, c_bs, bias, bias_bs,
                          0, r, r_bs, act, p0, p1, max_threads);
}
