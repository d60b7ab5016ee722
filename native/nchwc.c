/* Convolution on channel-blocked tensors (NCHW16c: x[C/16][H][W][16], 16 channels of a pixel side by side).
 *
 * Why a second layout: a GEMM over NCHW planes packs its B operand (the input) per call, a quarter of a 1x1
 * conv's time on 56x56 planes (one thread, Emerald Rapids), and a direct conv over NCHW reads each tap's rows
 * through strided loads. In the blocked layout the input is already in the order the micro-kernel wants: per
 * input channel, one broadcast of a pixel's value times NB vectors of 16 output channels' weights, accumulated
 * for PT pixels of one output row in PT x NB registers. Nothing is packed at run time. A task is a band of
 * output rows (a pointwise conv: of pixels) for every output group, so the band's input is read from L2 by
 * each group in turn, or where the weights outweigh the input, a share of the groups over the whole map.
 * Standalone, one thread, 2026-11-30, against this build's NCHW kernels: 1x1 convs on 56x56 0.85-0.97x the
 * time, 3x3 convs of 16-64 input channels 0.78-1.0x; onnxruntime's NCHWc kernels (the same idea) 0.76-0.95x
 * ours, without their layout conversions.
 *
 * Weights (packed by the caller once, ops/conv_nchwc.py): groups of as many output blocks as the ISA's tiles take
 * (inferd_nchwc_group_blocks: 4 on AVX-512, 1 elsewhere), w[group][cin_block][kh][kw][16 input channels][nbg * 16
 * output channels], nbg the group's block count (the last group may hold fewer): a tile reads its weights as one
 * run of memory. (Groups of 4 on AVX2 too, until 2026-12-02: a one-block tile read every fourth 64-byte line, and
 * on Zen 3, two threads, its 3x3 convs ran 1.03-1.05x the time, SqueezeNet's 512->1008 classifier 1.05x.) Any
 * kernel size, stride and padding; dilation 1, or at stride 1 with pads that are whole multiples of it
 * (inferd_nchwc_conv_dilated: a phase-split copy of the input, dilated_copy); one group, or groups that fill whole
 * blocks (inferd_nchwc_conv_grouped). The bias, a residual of the output's shape (blocked too) and the activation are
 * applied as the tile is stored. A pointwise conv's full tiles have their own form (NCHWC_PW: no tap loops).
 * A stem reads an NCHW input (an image's few channels) as blocks of one channel (inferd_nchwc_conv_nchw: the
 * same tiles with CPB 1, w[group][cin][kh][kw][nbg * 16]) and writes blocked. */
#define _POSIX_C_SOURCE 200112L
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#define NB_MAX 4

typedef struct {
    const float* x;
    const float* w;
    const float* bias;
    const float* res;
    float* y;
    int cib, H, W, cob, KH, KW, SH, SW, PT_, PL, OH, OW, act;
    float p0, p1;
    int rows_per_task, cols_per_task, nbands;
    int gpt, ub; /* a task's output blocks: gpt units of ub blocks (the tiles' block count, which divides NB_MAX) */
    int cpb;                                      /* input channels per input block: 16, or 1 for an NCHW input */
    const int* off; /* a padded short-row map run as one row of pixels: each output pixel's input offset, or NULL */
    int cil;        /* the input channels of the last input block, where fewer than 16 (the others padding); 0: 16 */
    int col;        /* the same of the last output block */
    /* a grouped conv as groups of whole blocks (0: dense): output block b reads input blocks [b / go * gi, + gi),
       its weights [gi blocks][kh][kw][16][..] (see inferd_nchwc_conv_grouped) */
    int gi, go;
    /* a tile's read-ahead of the weights (see wpf_t): pfl lines at pfb for each input block it takes */
    const char* pfb;
    int pfl;
} cjob_t;

/* Line l of input block ci's share of the tile's read-ahead (into L2) */
#define NCHWC_PF_LINE(ci, l) __builtin_prefetch(J->pfb + ((long long)((ci) - ci0) * J->pfl + (l)) * 64, 0, 2)
/* Input block ci's lines of the tile's read-ahead */
#define NCHWC_PF(ci) for (int l_ = 0; l_ < J->pfl; ++l_) NCHWC_PF_LINE(ci, l_)
/* The same lines spread over the block's taps, tap t issuing its share (PFQ of them): the run tiles (NCHWC_TILEO),
   where a small map makes one or two tiles a chunk, whose read-ahead is then the whole next chunk (a 3x3's 576 lines
   an input block) and had gone out in one burst at the block's start, more than the core keeps in flight. Xeon
   (Emerald Rapids class), in-process A/B, the same bits: 512->512 3x3 on 2x2 and 4x4 0.84-0.92x the time (one and
   two threads), 256->256 on 4x4 0.89-1.0x, 512->512 on 7x7 0.95x, 14x14 and 28x28 maps 1.0x; whole models (30
   alternating rounds) keras resnet50 at 64x64 0.887x, torchvision resnet18 at 64x64 0.936x, resnet18 0.953x,
   resnet50 0.975x, googlenet 0.983x, squeezenet1_1 and convnext_tiny 1.0x. The row tiles keep the burst: a row of
   many tiles splits a chunk's read-ahead into a few lines a tile. */
#define NCHWC_PF_TAP(ci, t, PFQ)                                                                                   \
    for (int l_ = (t) * (PFQ); l_ < J->pfl && l_ < ((t) + 1) * (PFQ); ++l_) NCHWC_PF_LINE(ci, l_)

/* A tile's accumulators: the output's partial sums after the first pass over the input channels, else the bias.
   VT is the ISA's vector of VW floats (16 on AVX-512, 8 on AVX2, 4 on NEON / SSE), a 16-channel block V = 16 / VW
   of them; acc[p][v] holds vector v % V of block v / V for pixel p. (A 64-byte vector on an ISA without 512-bit
   registers is lowered by GCC through the stack: the AVX2 tiles had been ~1,500 stack moves a tile.) */
#define NCHWC_ACC_INIT(VT, VW, PT, NB)                                                                              \
    VT acc[PT][NB * (16 / VW)];                                                                                     \
    _Pragma("GCC unroll 16") for (int v = 0; v < NB * (16 / VW); ++v)                                               \
    {                                                                                                              \
        VT bv = {0};                                                                                               \
        if (ci0 > 0) {                                                                                             \
            _Pragma("GCC unroll 16") for (int p = 0; p < PT; ++p)                                                  \
                memcpy(&acc[p][v], yb + (v / (16 / VW)) * ys + p * 16 + (v % (16 / VW)) * VW, sizeof(VT));           \
            continue;                                                                                              \
        }                                                                                                          \
        if (bias) memcpy(&bv, bias + v * VW, sizeof(VT));                                                           \
        _Pragma("GCC unroll 16") for (int p = 0; p < PT; ++p) acc[p][v] = bv;                                      \
    }

/* A tile's store: the residual on the last pass, the activation in registers for RACT (a compile-time code: 0
   none, 1 relu, 2 clip) and, where RACT is 0, for a job's relu or clip too (a copy of the loop each); any other
   over the stored tile (in L1): one loop, not one copy of its branches per register. Relu over the stored tile (a
   load, a compare and a store more per vector) had been ~14% of a 3x3 stem's time (27 taps a tile; perf, Zen 4). */
#define NCHWC_STORE_LOOP(VT, VI, VW, PT, NB, A)                                                                    \
    _Pragma("GCC unroll 16") for (int v = 0; v < NB * (16 / VW); ++v)                                              \
        _Pragma("GCC unroll 16") for (int p = 0; p < PT; ++p)                                                     \
        {                                                                                                          \
            const long long o = (v / (16 / VW)) * ys + p * 16 + (v % (16 / VW)) * VW;                                \
            VT x = acc[p][v];                                                                                      \
            if (res) {                                                                                             \
                VT r;                                                                                              \
                memcpy(&r, res + o, sizeof(VT));                                                                   \
                x += r;                                                                                            \
            }                                                                                                      \
            if ((A) && last) INFERD_VACT(VT, VI, x, (A), p0, p1);                                                  \
            memcpy(yb + o, &x, sizeof(VT));                                                                        \
        }
#define NCHWC_STORE(VT, VI, VW, PT, NB, RACT)                                                                       \
    const int last = ci1 == J->cib;                                                                                \
    if (!last) res = NULL;                                                                                         \
    const float p0 = J->p0, p1 = J->p1;                                                                            \
    (void)p0;                                                                                                      \
    (void)p1;                                                                                                      \
    const int jact = last && !(RACT) ? J->act : 0;                                                                 \
    if ((RACT) || (jact != 1 && jact != 2)) {                                                                      \
        NCHWC_STORE_LOOP(VT, VI, VW, PT, NB, RACT)                                                                 \
    } else if (jact == 1) {                                                                                        \
        NCHWC_STORE_LOOP(VT, VI, VW, PT, NB, 1)                                                                    \
    } else {                                                                                                       \
        NCHWC_STORE_LOOP(VT, VI, VW, PT, NB, 2)                                                                    \
    }                                                                                                              \
    const int act = jact == 1 || jact == 2 ? 0 : jact;                                                             \
    if (act && !INFERD_ACT_COSTLY(act)) {                                                                          \
        /* (a block's PT pixels are PT * 16 floats in a row) */                                                   \
        _Pragma("GCC unroll 1") for (int i = 0; i < NB * PT * (16 / VW); ++i)                                      \
        {                                                                                                          \
            float* q = yb + (i / (PT * (16 / VW))) * ys + (i % (PT * (16 / VW))) * VW;                                \
            VT x;                                                                                                  \
            memcpy(&x, q, sizeof(VT));                                                                             \
            INFERD_VACT(VT, VI, x, act, p0, p1);                                                                   \
            memcpy(q, &x, sizeof(VT));                                                                             \
        }                                                                                                          \
    } else if (INFERD_ACT_COSTLY(act)) {                                                                           \
        for (int b = 0; b < NB; ++b) act_inplace(yb + b * ys, PT * 16, act, p0, p1);                              \
    }

/* One tap of a tile: CPB input channels at xc (pixel p's at xc + OFF, an expression of p), their weights at wc
   (rows wst apart), into acc[PT][NB * 16 / VW] */
#define NCHWC_TAP(VT, VW, PT, NB, CPB, OFF)                                                                        \
    _Pragma("GCC unroll 4") for (int c = 0; c < CPB; ++c)                                                         \
    {                                                                                                              \
        VT wv[NB * (16 / VW)];                                                                                      \
        _Pragma("GCC unroll 16") for (int v = 0; v < NB * (16 / VW); ++v)                                          \
            memcpy(&wv[v], wc + c * wst + v * VW, sizeof(VT));                                                      \
        _Pragma("GCC unroll 16") for (int p = 0; p < PT; ++p)                                                     \
        {                                                                                                          \
            const VT xv = xc[(OFF) + c] - (VT){0};                                                                 \
            _Pragma("GCC unroll 16") for (int v = 0; v < NB * (16 / VW); ++v) acc[p][v] += xv * wv[v];             \
        }                                                                                                          \
    }

/* One output row segment: np pixels (np <= PT, compile-time PT for the register tile) x nb blocks, taps
   kh in [kh0, kh1), kw in [kw0, kw1) (the caller clips both to the image), input pixel step ps floats. */
#define NCHWC_TILE(NAME, ATTR, VT, VI, VW, PT, NB, CPB) NCHWC_TILE_K(NAME, ATTR, VT, VI, VW, PT, NB, CPB, 0)
/* KWC > 0: every tap of a kernel row KWC wide known when compiled (kw0 = 0, kw1 = KWC), which GCC unrolls: see
   NCHWC_STEM. KWC 0 compiles to the same instructions as before KWC existed. */
#define NCHWC_TILE_K(NAME, ATTR, VT, VI, VW, PT, NB, CPB, KWC)                                                      \
    ATTR static void NAME(const cjob_t* J, const float* xb, int ps, const float* wg, int wst, float* yb,          \
                          long long ys, const float* bias, const float* res, int kh0, int kh1, int kw0, int kw1,  \
                          int ci0, int ci1)                                                                        \
    {                                                                                                              \
        NCHWC_ACC_INIT(VT, VW, PT, NB)                                                                              \
        const long long xs = (long long)J->H * J->W * CPB, rs = (long long)J->W * CPB;                             \
        const int KH = J->KH, KW = (KWC) ? (KWC) : J->KW;                                                          \
        /* a last input block of fewer channels: only its own (as NCHWC_PW) */                                     \
        const int part = CPB == 16 && J->cil && ci1 == J->cib, cfull = ci1 - part;                                 \
        for (int ci = ci0; ci < cfull; ++ci) {                                                                     \
            NCHWC_PF(ci);                                                                                          \
            NCHWC_TAPS_KK(VT, VW, PT, NB, CPB, KWC, CPB);                                                          \
        }                                                                                                          \
        if (part) {                                                                                                \
            const int ci = cfull, cn = J->cil;                                                                     \
            NCHWC_TAPS_KK(VT, VW, PT, NB, CPB, KWC, cn);                                                           \
        }                                                                                                          \
        NCHWC_STORE(VT, VI, VW, PT, NB, 0)                                                                           \
    }
/* Every tap of input block ci (CN of its channels) for NCHWC_TILE_K */
#define NCHWC_TAPS_KK(VT, VW, PT, NB, CPB, KWC, CN)                                                                \
    for (int kh = kh0; kh < kh1; ++kh)                                                                             \
        for (int kw = (KWC) ? 0 : kw0; kw < ((KWC) ? (KWC) : kw1); ++kw) {                                         \
            const float* xc = xb + ci * xs + kh * rs + kw * CPB;                                                   \
            const float* wc = wg + (((long long)ci * KH + kh) * KW + kw) * CPB * wst;                              \
            NCHWC_TAP(VT, VW, PT, NB, CN, p * ps);                                                                 \
        }
/* A 3x3 stem's widest tile inside a row (NCHW input: a tap is one channel, and NCHWC_TILE's tap loops and pointers
   took about as many instructions as its loads and FMAs): 3 -> 16..64 channels on 224x224, AVX2, one thread,
   0.87-0.89x the time. The pixel step stays a variable: as a constant (stride 2) GCC loaded each column once for
   the pixels and taps that share it and ran 1.1-1.2x the time; rows unrolled too 1.2x; 7x7 stems (resnets,
   googlenet) 1.05x, so they keep NCHWC_TILE. The same sums in the same order: the same bits. On AVX-512 for one
   and two output blocks (see tiles_avx512_c1); a table's NULL entry: NCHWC_TILE. */
#define NCHWC_STEM(NAME, ATTR, VT, VI, VW, PT, NB) NCHWC_TILE_K(NAME, ATTR, VT, VI, VW, PT, NB, 1, 3)

/* A pointwise conv's full tile (1x1, stride 1: a flat row's pixels 16 floats apart, known here): no tap loops and
   their pointer arithmetic, and the activation in registers for the codes ACT names (0: none, or applied over the
   stored tile as NCHWC_TILE does; 1: relu; 2: clip). With few input channels the tile's fixed costs weighed on
   its FMAs: 64 -> 64 channels on 56x56 ran at ~75% of the 3x3 convs' rate through NCHWC_TILE. */
#define NCHWC_PW(NAME, ATTR, VT, VI, VW, PT, NB, ACT)                                                              \
    ATTR static void NAME(const cjob_t* J, const float* xb, const float* wg, int wst, float* yb, long long ys,   \
                          const float* bias, const float* res, int ci0, int ci1)                                 \
    {                                                                                                              \
        NCHWC_ACC_INIT(VT, VW, PT, NB)                                                                              \
        const long long xs = (long long)J->H * J->W * 16;                                                          \
        const float* xc = xb + ci0 * xs;                                                                           \
        const float* wc = wg + (long long)ci0 * 16 * wst;                                                          \
        /* a last block of fewer channels (24 or 40 of them: 8 padding lanes) runs only its own */                 \
        const int part = J->cil && ci1 == J->cib, cfull = ci1 - part;                                              \
        for (int ci = ci0; ci < cfull; ++ci, xc += xs, wc += 16 * wst) {                                           \
            NCHWC_PF(ci);                                                                                          \
            NCHWC_TAP(VT, VW, PT, NB, 16, p * 16);                                                                 \
        }                                                                                                          \
        if (part) {                                                                                                \
            const int cn = J->cil;                                                                                 \
            NCHWC_TAP(VT, VW, PT, NB, cn, p * 16);                                                                 \
        }                                                                                                          \
        NCHWC_STORE(VT, VI, VW, PT, NB, ACT)                                                                         \
    }

/* A pointwise tile of the first VW channels of one block (its other lanes, padding, stored as zeros): the last
   output block of a conv whose channels are not a multiple of 16 (MobileNetV2's 24: 8 real of 16) where a vector
   is 8 wide (AVX2). PT pixels of one vector each; a full block's tile spent half its FMAs on the padding. Zen 3,
   two threads: 144->24 on 56x56 0.82x the time, 96->24 0.80x, 240->40 on 28x28 ~0.9x. */
#define NCHWC_PWH(NAME, ATTR, VT, VI, VW, PT, ACT)                                                                \
    ATTR static void NAME(const cjob_t* J, const float* xb, const float* wg, int wst, float* yb, long long ys,   \
                          const float* bias, const float* res, int ci0, int ci1)                                 \
    {                                                                                                              \
        (void)ys;                                                                                                  \
        VT acc[PT];                                                                                                \
        VT bv = {0};                                                                                               \
        if (ci0 == 0 && bias) memcpy(&bv, bias, sizeof(VT));                                                       \
        _Pragma("GCC unroll 16") for (int p = 0; p < PT; ++p)                                                      \
        {                                                                                                          \
            if (ci0 > 0)                                                                                           \
                memcpy(&acc[p], yb + p * 16, sizeof(VT));                                                          \
            else                                                                                                   \
                acc[p] = bv;                                                                                       \
        }                                                                                                          \
        const long long xs = (long long)J->H * J->W * 16;                                                          \
        const float* xc = xb + ci0 * xs;                                                                           \
        const float* wc = wg + (long long)ci0 * 16 * wst;                                                          \
        const int part = J->cil && ci1 == J->cib, cfull = ci1 - part;                                              \
        for (int ci = ci0; ci < cfull; ++ci, xc += xs, wc += 16 * wst) {                                           \
            NCHWC_PF(ci);                                                                                          \
            NCHWC_TAPH(VT, PT, 16);                                                                                \
        }                                                                                                          \
        if (part) {                                                                                                \
            const int cn = J->cil;                                                                                 \
            NCHWC_TAPH(VT, PT, cn);                                                                                \
        }                                                                                                          \
        const int last = ci1 == J->cib;                                                                            \
        const int act = last && !(ACT) ? J->act : 0;                                                               \
        const float p0 = J->p0, p1 = J->p1;                                                                        \
        (void)p0;                                                                                                  \
        (void)p1;                                                                                                  \
        _Pragma("GCC unroll 16") for (int p = 0; p < PT; ++p)                                                      \
        {                                                                                                          \
            VT x = acc[p];                                                                                         \
            if (last && res) {                                                                                     \
                VT r;                                                                                              \
                memcpy(&r, res + p * 16, sizeof(VT));                                                              \
                x += r;                                                                                            \
            }                                                                                                      \
            if ((ACT) && last) INFERD_VACT(VT, VI, x, ACT, p0, p1);                                                \
            if (act && !INFERD_ACT_COSTLY(act)) INFERD_VACT(VT, VI, x, act, p0, p1);                               \
            memcpy(yb + p * 16, &x, sizeof(VT));                                                                   \
            if (last) memset(yb + p * 16 + VW, 0, sizeof(float) * (16 - VW));                                      \
        }                                                                                                          \
        if (INFERD_ACT_COSTLY(act))                                                                                \
            for (int p = 0; p < PT; ++p) act_inplace(yb + p * 16, VW, act, p0, p1);                                \
    }
/* One input block's channels (CN of them) for NCHWC_PWH: a weight vector, PT broadcasts */
#define NCHWC_TAPH(VT, PT, CN)                                                                                     \
    _Pragma("GCC unroll 4") for (int c = 0; c < (CN); ++c)                                                        \
    {                                                                                                              \
        VT wv;                                                                                                     \
        memcpy(&wv, wc + c * wst, sizeof(VT));                                                                     \
        _Pragma("GCC unroll 16") for (int p = 0; p < PT; ++p) acc[p] += (xc[p * 16 + c] - (VT){0}) * wv;           \
    }

/* A tile of PT output pixels that may span rows, over a padded input (every tap inside): pixel p's input at
   off[p] floats, every tap, no clipping. For maps whose rows are too short for the row tiles' widths (7 columns:
   4 + 3 a row, where 49 pixels in a run are 6 x 8 + 1). */
#define NCHWC_TILEO(NAME, ATTR, VT, VI, VW, PT, NB)                                                                 \
    ATTR static void NAME(const cjob_t* J, const int* off, const float* wg, int wst, float* yb, long long ys,     \
                          const float* bias, const float* res, int ci0, int ci1)                                 \
    {                                                                                                              \
        NCHWC_ACC_INIT(VT, VW, PT, NB)                                                                              \
        const long long xs = (long long)J->H * J->W * 16, rs = (long long)J->W * 16;                               \
        const int KH = J->KH, KW = J->KW;                                                                          \
        long long o[PT];                                                                                           \
        _Pragma("GCC unroll 16") for (int p = 0; p < PT; ++p) o[p] = off[p];                                       \
        const int pfq = (J->pfl + KH * KW - 1) / (KH * KW);                                                        \
        for (int ci = ci0; ci < ci1; ++ci) {                                                                       \
            for (int kh = 0; kh < KH; ++kh)                                                                        \
                for (int kw = 0; kw < KW; ++kw) {                                                                  \
                    const float* xc = J->x + ci * xs + kh * rs + kw * 16;                                          \
                    const float* wc = wg + (((long long)ci * KH + kh) * KW + kw) * 16 * wst;                       \
                    NCHWC_PF_TAP(ci, kh * KW + kw, pfq);                                                           \
                    NCHWC_TAP(VT, VW, PT, NB, 16, o[p]);                                                           \
                }                                                                                                  \
        }                                                                                                          \
        NCHWC_STORE(VT, VI, VW, PT, NB, 0)                                                                           \
    }

typedef float v16f __attribute__((vector_size(64)));
typedef int v16i __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef int v8i __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef int v4i __attribute__((vector_size(16)));

typedef void (*pw_fn)(const cjob_t*, const float*, const float*, int, float*, long long, const float*, const float*,
                      int, int);

typedef void (*tile_fn)(const cjob_t*, const float*, int, const float*, int, float*, long long, const float*,
                        const float*, int, int, int, int, int, int);

typedef void (*tileo_fn)(const cjob_t*, const int*, const float*, int, float*, long long, const float*,
                         const float*, int, int);

#define PT_MAX 12
#define PTO_MAX 6 /* the run tiles' widest: 6 offsets stay in registers beside the tile's pointers */
#define PAD_MAX_BYTES (4LL << 20) /* the largest padded copy of a wide map (see conv_run) */

/* Per ISA: tiles of pt pixels x nb blocks (1 to the ISA's nb) at [pt - 1][nb - 1], pt up to the ISA's widest
   for that nb (wide[nb - 1], filling its vector registers): the widest for a row's inside, narrower ones for what
   is left of it and one-pixel tiles for the columns whose taps leave the image. With one or two output blocks a
   tile of 6 pixels would load a weight vector per 6 or 12 FMAs; 12 pixels keep the FMAs ahead of the loads
   (unet_small's 16- and 32-channel convs). */
typedef struct {
    int wide[NB_MAX];
    int nb;
    tile_fn t[PT_MAX][NB_MAX];
    /* a pointwise conv's full tiles (wide[nb - 1] pixels) by activation (none or after the store, relu, clip) and
       nb - 1; NULL where the general tiles do them */
    pw_fn pw[3][NB_MAX];
    /* tiles over a run of pixels (NCHWC_TILEO), [pt - 1][nb - 1] up to min(wide[nb - 1], PTO_MAX) pixels; NULL
       for an NCHW input's tables */
    tileo_fn o[PTO_MAX][NB_MAX];
    /* an NCHW input's widest tiles for 3-wide kernels (NCHWC_STEM), by nb - 1; NULL where the general tiles do them */
    tile_fn s3[NB_MAX];
    /* a half block's pointwise tiles (NCHWC_PWH) of wideh pixels, by activation as pw; NULL where a vector is a
       whole block (AVX-512) or not timed */
    pw_fn pwh[3];
    int wideh;
} tiles_t;

/* the tiles of PT pixels for 1 to 4 (PT4), 1 to 2 (PT2) or 1 (PT1) blocks */
#define NCHWC_PT4(SFX, ATTR, VT, VI, VW, PT, CPB)                                                                   \
    NCHWC_PT2(SFX, ATTR, VT, VI, VW, PT, CPB)                                                                       \
    NCHWC_TILE(t##PT##_3_##SFX, ATTR, VT, VI, VW, PT, 3, CPB)                                                       \
    NCHWC_TILE(t##PT##_4_##SFX, ATTR, VT, VI, VW, PT, 4, CPB)
#define NCHWC_PT2(SFX, ATTR, VT, VI, VW, PT, CPB)                                                                   \
    NCHWC_PT1(SFX, ATTR, VT, VI, VW, PT, CPB)                                                                       \
    NCHWC_TILE(t##PT##_2_##SFX, ATTR, VT, VI, VW, PT, 2, CPB)
#define NCHWC_PT1(SFX, ATTR, VT, VI, VW, PT, CPB) NCHWC_TILE(t##PT##_1_##SFX, ATTR, VT, VI, VW, PT, 1, CPB)
#define NCHWC_ROW(SFX, PT) {t##PT##_1_##SFX, t##PT##_2_##SFX, t##PT##_3_##SFX, t##PT##_4_##SFX}
#define NCHWC_ROW2(SFX, PT) {t##PT##_1_##SFX, t##PT##_2_##SFX, NULL, NULL}
#define NCHWC_ROW1(SFX, PT) {t##PT##_1_##SFX, NULL, NULL, NULL}
#define NCHWC_PWROW(SFX, ACT) {pw##ACT##_1_##SFX, pw##ACT##_2_##SFX, pw##ACT##_3_##SFX, pw##ACT##_4_##SFX}
#define NCHWC_PWROW2(SFX, ACT) {pw##ACT##_1_##SFX, pw##ACT##_2_##SFX, NULL, NULL}
#define NCHWC_PWROW1(SFX, ACT) {pw##ACT##_1_##SFX, NULL, NULL, NULL}
/* the run tiles of PT pixels for 1 to 4 (O4) or 1 (O1) blocks, and their table rows */
#define NCHWC_O4(SFX, ATTR, VT, VI, VW, PT)                                                                        \
    NCHWC_O1(SFX, ATTR, VT, VI, VW, PT)                                                                            \
    NCHWC_TILEO(o##PT##_2_##SFX, ATTR, VT, VI, VW, PT, 2)                                                          \
    NCHWC_TILEO(o##PT##_3_##SFX, ATTR, VT, VI, VW, PT, 3)                                                          \
    NCHWC_TILEO(o##PT##_4_##SFX, ATTR, VT, VI, VW, PT, 4)
#define NCHWC_O1(SFX, ATTR, VT, VI, VW, PT) NCHWC_TILEO(o##PT##_1_##SFX, ATTR, VT, VI, VW, PT, 1)
#define NCHWC_OROW(SFX, PT) {o##PT##_1_##SFX, o##PT##_2_##SFX, o##PT##_3_##SFX, o##PT##_4_##SFX}
#define NCHWC_OROW1(SFX, PT) {o##PT##_1_##SFX, NULL, NULL, NULL}

/* Tile shapes by register file. AVX-512 (32 zmm, a block one register): 6 pixels x 4 blocks = 24 accumulators
   + 4 weights + 1 broadcast, 12 x 2 and 12 x 1 for the narrow groups. AVX2 (16 ymm, a block two): 6 pixels x 1
   block = 12 accumulators + 2 weights + 1 broadcast (3 x 2 blocks would need 17 registers). NEON (32 q, a block
   four): 5 x 1 = 20 + 4 weights + 5 input scalars (GCC's fmla by element; 6 pixels spilled two accumulators).
   SSE (16 xmm, x86-64 without AVX2, rare): 3 x 1. */

/* NEON / SSE: the general tiles, one block wide */
NCHWC_PT1(gen, , v4f, v4i, 4, 1, 16)
NCHWC_PT1(gen, , v4f, v4i, 4, 2, 16)
NCHWC_PT1(gen, , v4f, v4i, 4, 3, 16)
#if defined(__x86_64__)
NCHWC_O1(gen, , v4f, v4i, 4, 1)
NCHWC_O1(gen, , v4f, v4i, 4, 2)
NCHWC_O1(gen, , v4f, v4i, 4, 3)
static const tiles_t tiles_gen = {{3, 3, 3, 3},
                                  1,
                                  {NCHWC_ROW1(gen, 1), NCHWC_ROW1(gen, 2), NCHWC_ROW1(gen, 3)},
                                  {{NULL}},
                                  {NCHWC_OROW1(gen, 1), NCHWC_OROW1(gen, 2), NCHWC_OROW1(gen, 3)}};
/* An NCHW input (a stem: 3 channels of an image) read as blocks of one channel: the same tiles with CPB 1, only
   the widest and one-pixel ones (a stem is one layer: what is left of a row goes a pixel at a time) */
NCHWC_PT1(gen_c1, , v4f, v4i, 4, 1, 1)
NCHWC_PT1(gen_c1, , v4f, v4i, 4, 2, 1)
NCHWC_PT1(gen_c1, , v4f, v4i, 4, 3, 1)
static const tiles_t tiles_gen_c1 = {
    {3, 3, 3, 3}, 1, {NCHWC_ROW1(gen_c1, 1), NCHWC_ROW1(gen_c1, 2), NCHWC_ROW1(gen_c1, 3)}, {{NULL}}, {{NULL}}};
#else
NCHWC_PT1(gen, , v4f, v4i, 4, 4, 16)
NCHWC_PT1(gen, , v4f, v4i, 4, 5, 16)
NCHWC_PW(pw0_1_gen, , v4f, v4i, 4, 5, 1, 0)
NCHWC_PW(pw1_1_gen, , v4f, v4i, 4, 5, 1, 1)
NCHWC_PW(pw2_1_gen, , v4f, v4i, 4, 5, 1, 2)
NCHWC_O1(gen, , v4f, v4i, 4, 1)
NCHWC_O1(gen, , v4f, v4i, 4, 2)
NCHWC_O1(gen, , v4f, v4i, 4, 3)
NCHWC_O1(gen, , v4f, v4i, 4, 4)
NCHWC_O1(gen, , v4f, v4i, 4, 5)
static const tiles_t tiles_gen = {{5, 5, 5, 5},
                                  1,
                                  {NCHWC_ROW1(gen, 1), NCHWC_ROW1(gen, 2), NCHWC_ROW1(gen, 3), NCHWC_ROW1(gen, 4),
                                   NCHWC_ROW1(gen, 5)},
                                  {NCHWC_PWROW1(gen, 0), NCHWC_PWROW1(gen, 1), NCHWC_PWROW1(gen, 2)},
                                  {NCHWC_OROW1(gen, 1), NCHWC_OROW1(gen, 2), NCHWC_OROW1(gen, 3), NCHWC_OROW1(gen, 4),
                                   NCHWC_OROW1(gen, 5)}};
NCHWC_PT1(gen_c1, , v4f, v4i, 4, 1, 1)
NCHWC_PT1(gen_c1, , v4f, v4i, 4, 2, 1)
NCHWC_PT1(gen_c1, , v4f, v4i, 4, 3, 1)
NCHWC_PT1(gen_c1, , v4f, v4i, 4, 4, 1)
NCHWC_PT1(gen_c1, , v4f, v4i, 4, 5, 1)
static const tiles_t tiles_gen_c1 = {{5, 5, 5, 5},
                                     1,
                                     {NCHWC_ROW1(gen_c1, 1), NCHWC_ROW1(gen_c1, 2), NCHWC_ROW1(gen_c1, 3),
                                      NCHWC_ROW1(gen_c1, 4), NCHWC_ROW1(gen_c1, 5)},
                                     {{NULL}},
                                     {{NULL}}};
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(INFERD_NO_CLONES)
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx2,fma")))
NCHWC_PT1(avx2, AVX2, v8f, v8i, 8, 1, 16)
NCHWC_PT1(avx2, AVX2, v8f, v8i, 8, 2, 16)
NCHWC_PT1(avx2, AVX2, v8f, v8i, 8, 3, 16)
NCHWC_PT1(avx2, AVX2, v8f, v8i, 8, 4, 16)
NCHWC_PT1(avx2, AVX2, v8f, v8i, 8, 5, 16)
NCHWC_PT1(avx2, AVX2, v8f, v8i, 8, 6, 16)
NCHWC_PW(pw0_1_avx2, AVX2, v8f, v8i, 8, 6, 1, 0)
NCHWC_PW(pw1_1_avx2, AVX2, v8f, v8i, 8, 6, 1, 1)
NCHWC_PW(pw2_1_avx2, AVX2, v8f, v8i, 8, 6, 1, 2)
NCHWC_PWH(pwh0_avx2, AVX2, v8f, v8i, 8, 12, 0)
NCHWC_PWH(pwh1_avx2, AVX2, v8f, v8i, 8, 12, 1)
NCHWC_PWH(pwh2_avx2, AVX2, v8f, v8i, 8, 12, 2)
NCHWC_O1(avx2, AVX2, v8f, v8i, 8, 1)
NCHWC_O1(avx2, AVX2, v8f, v8i, 8, 2)
NCHWC_O1(avx2, AVX2, v8f, v8i, 8, 3)
NCHWC_O1(avx2, AVX2, v8f, v8i, 8, 4)
NCHWC_O1(avx2, AVX2, v8f, v8i, 8, 5)
NCHWC_O1(avx2, AVX2, v8f, v8i, 8, 6)
static const tiles_t tiles_avx2 = {{6, 6, 6, 6},
                                   1,
                                   {NCHWC_ROW1(avx2, 1), NCHWC_ROW1(avx2, 2), NCHWC_ROW1(avx2, 3), NCHWC_ROW1(avx2, 4),
                                    NCHWC_ROW1(avx2, 5), NCHWC_ROW1(avx2, 6)},
                                   {NCHWC_PWROW1(avx2, 0), NCHWC_PWROW1(avx2, 1), NCHWC_PWROW1(avx2, 2)},
                                   {NCHWC_OROW1(avx2, 1), NCHWC_OROW1(avx2, 2), NCHWC_OROW1(avx2, 3),
                                    NCHWC_OROW1(avx2, 4), NCHWC_OROW1(avx2, 5), NCHWC_OROW1(avx2, 6)},
                                   {NULL},
                                   {pwh0_avx2, pwh1_avx2, pwh2_avx2},
                                   12};
NCHWC_PT1(avx2_c1, AVX2, v8f, v8i, 8, 1, 1)
NCHWC_PT1(avx2_c1, AVX2, v8f, v8i, 8, 2, 1)
NCHWC_PT1(avx2_c1, AVX2, v8f, v8i, 8, 3, 1)
NCHWC_PT1(avx2_c1, AVX2, v8f, v8i, 8, 4, 1)
NCHWC_PT1(avx2_c1, AVX2, v8f, v8i, 8, 5, 1)
NCHWC_PT1(avx2_c1, AVX2, v8f, v8i, 8, 6, 1)
NCHWC_STEM(s3_1_avx2, AVX2, v8f, v8i, 8, 6, 1)
static const tiles_t tiles_avx2_c1 = {{6, 6, 6, 6},
                                      1,
                                      {NCHWC_ROW1(avx2_c1, 1), NCHWC_ROW1(avx2_c1, 2), NCHWC_ROW1(avx2_c1, 3),
                                       NCHWC_ROW1(avx2_c1, 4), NCHWC_ROW1(avx2_c1, 5), NCHWC_ROW1(avx2_c1, 6)},
                                      {{NULL}},
                                      {{NULL}},
                                      {s3_1_avx2, NULL, NULL, NULL}};
NCHWC_PT4(avx512, AVX512, v16f, v16i, 16, 1, 16)
NCHWC_PT4(avx512, AVX512, v16f, v16i, 16, 2, 16)
NCHWC_PT4(avx512, AVX512, v16f, v16i, 16, 3, 16)
NCHWC_PT4(avx512, AVX512, v16f, v16i, 16, 4, 16)
NCHWC_PT4(avx512, AVX512, v16f, v16i, 16, 5, 16)
NCHWC_PT4(avx512, AVX512, v16f, v16i, 16, 6, 16)
NCHWC_PT2(avx512, AVX512, v16f, v16i, 16, 7, 16)
NCHWC_PT2(avx512, AVX512, v16f, v16i, 16, 8, 16)
NCHWC_PT2(avx512, AVX512, v16f, v16i, 16, 9, 16)
NCHWC_PT2(avx512, AVX512, v16f, v16i, 16, 10, 16)
NCHWC_PT2(avx512, AVX512, v16f, v16i, 16, 11, 16)
NCHWC_PT2(avx512, AVX512, v16f, v16i, 16, 12, 16)
#define NCHWC_PW4(SFX, ATTR, ACT)                                                                                  \
    NCHWC_PW(pw##ACT##_1_##SFX, ATTR, v16f, v16i, 16, 12, 1, ACT)                                                 \
    NCHWC_PW(pw##ACT##_2_##SFX, ATTR, v16f, v16i, 16, 12, 2, ACT)                                                 \
    NCHWC_PW(pw##ACT##_3_##SFX, ATTR, v16f, v16i, 16, 6, 3, ACT)                                                  \
    NCHWC_PW(pw##ACT##_4_##SFX, ATTR, v16f, v16i, 16, 6, 4, ACT)
NCHWC_PW4(avx512, AVX512, 0)
NCHWC_PW4(avx512, AVX512, 1)
NCHWC_PW4(avx512, AVX512, 2)
NCHWC_O4(avx512, AVX512, v16f, v16i, 16, 1)
NCHWC_O4(avx512, AVX512, v16f, v16i, 16, 2)
NCHWC_O4(avx512, AVX512, v16f, v16i, 16, 3)
NCHWC_O4(avx512, AVX512, v16f, v16i, 16, 4)
NCHWC_O4(avx512, AVX512, v16f, v16i, 16, 5)
NCHWC_O4(avx512, AVX512, v16f, v16i, 16, 6)
static const tiles_t tiles_avx512 = {{12, 12, 6, 6}, 4,
                                     {NCHWC_ROW(avx512, 1), NCHWC_ROW(avx512, 2), NCHWC_ROW(avx512, 3),
                                      NCHWC_ROW(avx512, 4), NCHWC_ROW(avx512, 5), NCHWC_ROW(avx512, 6),
                                      NCHWC_ROW2(avx512, 7), NCHWC_ROW2(avx512, 8), NCHWC_ROW2(avx512, 9),
                                      NCHWC_ROW2(avx512, 10), NCHWC_ROW2(avx512, 11), NCHWC_ROW2(avx512, 12)},
                                     {NCHWC_PWROW(avx512, 0), NCHWC_PWROW(avx512, 1), NCHWC_PWROW(avx512, 2)},
                                     {NCHWC_OROW(avx512, 1), NCHWC_OROW(avx512, 2), NCHWC_OROW(avx512, 3),
                                      NCHWC_OROW(avx512, 4), NCHWC_OROW(avx512, 5), NCHWC_OROW(avx512, 6)}};
NCHWC_PT4(avx512_c1, AVX512, v16f, v16i, 16, 1, 1)
NCHWC_PT4(avx512_c1, AVX512, v16f, v16i, 16, 2, 1)
NCHWC_PT4(avx512_c1, AVX512, v16f, v16i, 16, 3, 1)
NCHWC_PT4(avx512_c1, AVX512, v16f, v16i, 16, 4, 1)
NCHWC_PT4(avx512_c1, AVX512, v16f, v16i, 16, 5, 1)
NCHWC_PT4(avx512_c1, AVX512, v16f, v16i, 16, 6, 1)
NCHWC_PT2(avx512_c1, AVX512, v16f, v16i, 16, 7, 1)
NCHWC_PT2(avx512_c1, AVX512, v16f, v16i, 16, 8, 1)
NCHWC_PT2(avx512_c1, AVX512, v16f, v16i, 16, 9, 1)
NCHWC_PT2(avx512_c1, AVX512, v16f, v16i, 16, 10, 1)
NCHWC_PT2(avx512_c1, AVX512, v16f, v16i, 16, 11, 1)
NCHWC_PT2(avx512_c1, AVX512, v16f, v16i, 16, 12, 1)
NCHWC_STEM(s3_1_avx512, AVX512, v16f, v16i, 16, 12, 1)
NCHWC_STEM(s3_2_avx512, AVX512, v16f, v16i, 16, 12, 2)
/* As the blocked input's: 12 pixels for one or two output blocks (MobileNetV2's 32-channel stem: 24 accumulators
   where 6 pixels left 12, a weight vector loaded per 6 FMAs), and the 3-wide stem tiles at that width. Zen 4, one
   thread, in one process against the 6-pixel tiles: 3 -> 32 channels 3x3 s2 on 224x224 0.94x the time, 3 -> 24
   0.93x, 3 -> 32 s1 on 112x112 0.94x; the stem tiles for three and four blocks (6 pixels) 1.01-1.03x, left out. */
static const tiles_t tiles_avx512_c1 = {
    {12, 12, 6, 6},
    4,
    {NCHWC_ROW(avx512_c1, 1), NCHWC_ROW(avx512_c1, 2), NCHWC_ROW(avx512_c1, 3), NCHWC_ROW(avx512_c1, 4),
     NCHWC_ROW(avx512_c1, 5), NCHWC_ROW(avx512_c1, 6), NCHWC_ROW2(avx512_c1, 7), NCHWC_ROW2(avx512_c1, 8),
     NCHWC_ROW2(avx512_c1, 9), NCHWC_ROW2(avx512_c1, 10), NCHWC_ROW2(avx512_c1, 11), NCHWC_ROW2(avx512_c1, 12)},
    {{NULL}},
    {{NULL}},
    {s3_1_avx512, s3_2_avx512, NULL, NULL}};
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(INFERD_NO_CLONES)
/* 2: AVX-512, 1: AVX2 + FMA, 0: the generic vectors (SSE2). */
static int isa_level(void)
{
    int l = inferd_x86_level();
#ifdef INFERD_NCHWC_ISA_CAP /* the tests' C harness: the AVX2 tiles checked on an AVX-512 machine too */
    if (l > INFERD_NCHWC_ISA_CAP) l = INFERD_NCHWC_ISA_CAP;
#endif
    return l;
}
#endif

/* The ISA's tiles for blocked inputs (cpb 16) or NCHW ones (cpb 1) */
static const tiles_t* tiles_for(int cpb)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(INFERD_NO_CLONES)
    const int l = isa_level();
    if (l == 2) return cpb == 1 ? &tiles_avx512_c1 : &tiles_avx512;
    if (l == 1) return cpb == 1 ? &tiles_avx2_c1 : &tiles_avx2;
#endif
    return cpb == 1 ? &tiles_gen_c1 : &tiles_gen;
}

static const tiles_t* tiles(void) { return tiles_for(16); }



/* Input blocks per pass over a row: the group's weights for them stay in L1 (~32 KB) while every tile of the
   row reads them; the tiles' partial sums go through the output row (L1 too) between passes. A 1x1's weights
   per block are few (4 KB for 4 output blocks) and each is read once per tile: there fewer passes over the
   partial sums paid more than L1 (~160 KB, in L2; one core, against 32 KB: 256->64 on 56x56 0.97x the time,
   1024->256 on 14x14 0.97x, 1024->512 0.96x; k x k convs lost 2-3.5% with more than 32 KB). */
static int ci_chunk(const cjob_t* J, int nbg)
{
    const int per = J->KH * J->KW * J->cpb * nbg * 16 * 4;
    const int c = (J->KH * J->KW == 1 ? 160 << 10 : 32 << 10) / per;
    return c < 1 ? 1 : c;
}

/* A task's weights read ahead into L2, one input-channel chunk ahead of its tiles. A tile's first pass over a
   chunk reads its weights faster than memory delivers them (AVX-512, 4 blocks: 256 bytes a channel per 24 FMAs),
   and the later tiles of the chunk find them in cache: ResNet-50's last stage (4-9 MB of weights a layer, read once
   an inference) ran at ~50% of the FMA peak with its weights out of cache against ~70% in it. Spread over the
   chunk's tiles, the next chunk's lines come in while the FMAs run. A task's blocks are whole weight groups
   (units of the tiles' block count, the groups' width), so its weights are one run of memory: [cur, end).
   Xeon (Emerald Rapids class), two threads, in-process A/B over weights copies out of cache: 2048->512 1x1 on 7x7
   0.76-0.81x the time, 512->512 3x3 on 7x7 0.84-0.87x, the same at stride 2 on 14x14 0.83-0.85x, 1024->256 1x1 on
   14x14 0.93-1.0x, layers of small weights 0.96-1.0x; in the models (30 alternating rounds) resnet50 0.95x,
   resnet18 0.96x, squeezenet1_1 1.0x. Nothing but loads: the same bits. */
typedef struct {
    const char *cur, *lim, *end;
    long long step;
} wpf_t;

/* Set up for a task reading the weights [beg, end) in chunks of chunk bytes, calls tiles a chunk */
static inline void wpf_init(wpf_t* P, const float* beg, const float* end, long long chunk, long long calls)
{
    P->end = (const char*)end;
    P->cur = P->lim = (const char*)beg; /* (the first chunk's wpf_chunk moves both) */
    P->step = (chunk / (calls > 0 ? calls : 1) + 63) / 64 * 64;
}

/* The block up to which a task whose blocks end at k1 reads ahead: where tasks split the blocks and nothing else
   (one band), its thread's next task is the next run of blocks (the pool deals each thread a contiguous range of
   tasks), whose first chunk the task's last one then reads ahead; with bands the next task is another band of
   the same blocks. Two threads, weights out of cache: 2048->512 1x1 on 7x7 0.86x the time of a read-ahead that
   stopped at the task's end (0.73x none), 1024->256 and 256->1024 1x1 on 14x14 0.96x, 3x3s 0.99-1.0x; the
   models within the VM's noise (resnet50 0.98, mobilenetv2 1.01, 20 rounds). */
static inline int wpf_end(const cjob_t* J, int k1) { return J->nbands == 1 ? J->cob : k1; }

/* At the start of a chunk of n bytes at c (a group's last chunk may be short): read ahead from its end up to the
   next chunk's (chunk bytes; the next group's first where this one ends its group) */
static inline void wpf_chunk(wpf_t* P, const float* c, long long n, long long chunk)
{
    const char* b = (const char*)c + n;
    P->lim = b + chunk < P->end ? b + chunk : P->end;
    if (P->cur < b) P->cur = b < P->lim ? b : P->lim;
}

/* Before a tile over nblk input blocks: the next step's lines, read by the tile a few lines an input block
   (NCHWC_PF; the run tiles a share at each tap, NCHWC_PF_TAP) between its FMAs (issued at once before the tile, a
   1x1's 280 lines had stalled it on the fill buffers and gained nothing) */
static inline void wpf_tile(wpf_t* P, cjob_t* Jl, int nblk)
{
    Jl->pfb = P->cur;
    Jl->pfl = 0;
    if (P->cur >= P->lim || nblk < 1) return;
    long long lines = ((P->step < P->lim - P->cur ? P->step : P->lim - P->cur) + 63) / 64;
    int pfl = (int)((lines + nblk - 1) / nblk);
    if (P->cur + (long long)pfl * 64 * nblk > P->end) pfl = (int)((P->end - P->cur) / 64 / nblk);
    Jl->pfl = pfl;
    P->cur += (long long)pfl * 64 * nblk;
}

/* The output blocks [k0, k1) of a task: its units (task / nbands) of ub blocks each */
static void task_blocks(const cjob_t* J, long long task, int* k0, int* k1)
{
    const int u = (int)(task / J->nbands) * J->gpt * J->ub;
    *k0 = u;
    *k1 = u + J->gpt * J->ub < J->cob ? u + J->gpt * J->ub : J->cob;
}

/* The blocks a tile takes at a block of its group: the tiles' count, or fewer where the group or the task ends */
static inline int group_step(const tiles_t* T, int left_in_group, int left_in_task)
{
    const int n = left_in_group < left_in_task ? left_in_group : left_in_task;
    return n < T->nb ? n : T->nb;
}

/* The job output block b's tiles see: J itself, or for a grouped conv (J->go) a copy in *local whose input is
   b's group's gi blocks (the last group's last block partial where the input's is) */
static inline const cjob_t* group_job(const cjob_t* J, int b, cjob_t* local)
{
    if (!J->go) return J;
    const int g = b / J->go;
    *local = *J;
    local->x = J->x + (long long)g * J->gi * J->H * J->W * J->cpb;
    local->cib = J->gi;
    local->cil = g == (J->cob - 1) / J->go ? J->cil : 0;
    return local;
}

/* The blocks a tile may take at block b without leaving its conv group (a grouped conv's tiles read one group's
   input): the group's blocks left, or any number for a dense conv */
static inline int conv_group_left(const cjob_t* J, int b) { return J->go ? J->go - b % J->go : 1 << 30; }

/* One band of output rows (or of columns in a one-row job) for a task's output blocks. Where the input outweighs the
   weights, a task is a band for every group (the band's input read from L2 by each group in turn, not from
   memory once per group); otherwise a task is some of the blocks over the whole map (their weights read once). */
/* The run form (J->off set): a band of the map's pixels in runs of up to PTO_MAX, rows and all, for a task's blocks */
static void conv_task_runs(const cjob_t* J, long long task)
{
    const long long band = task % J->nbands;
    const tiles_t* T = tiles_for(16);
    const long long ys = (long long)J->OH * J->OW * 16;
    const int npx = J->OH * J->OW, q0 = (int)band * J->cols_per_task;
    const int q1 = q0 + J->cols_per_task < npx ? q0 + J->cols_per_task : npx;
    int k0, k1;
    task_blocks(J, task, &k0, &k1);
    const int G = T->nb;
    wpf_t P;
    int pf = 0;
    for (int b = k0; b < k1;) {
        cjob_t Jg, Jl = *group_job(J, b, &Jg);
        const cjob_t* const Jb = &Jl;
        const int b0 = b - b % G, sub = b - b0; /* the block's group and its place in it */
        const int nbg = J->cob - b0 < G ? J->cob - b0 : G, wst = nbg * 16, chunk = ci_chunk(J, nbg);
        const long long pblk = 16LL * Jb->cib * J->KH * J->KW * 16, cst = (long long)J->KH * J->KW * 16 * wst;
        const float* wg = J->w + b0 * pblk;
        int nb = group_step(T, nbg - sub, k1 - b);
        if (nb > conv_group_left(J, b)) nb = conv_group_left(J, b);
        b += nb;
        {
            const float* ws = wg + sub * 16;
            const float* bias = J->bias ? J->bias + (b0 + sub) * 16 : NULL;
            float* yb = J->y + (b0 + sub) * ys;
            const float* rb = J->res ? J->res + (b0 + sub) * ys : NULL;
            /* the band in even runs, as a row's inside is split (see conv_task) */
            const int wide = T->wide[nb - 1] < PTO_MAX ? T->wide[nb - 1] : PTO_MAX;
            const int ntiles = (q1 - q0 + wide - 1) / wide, base = (q1 - q0) / ntiles, rem = (q1 - q0) % ntiles;
            if (!pf++) wpf_init(&P, J->w + k0 * pblk, J->w + wpf_end(J, k1) * pblk, chunk * cst * 4, ntiles);
            for (int c0 = 0; c0 < Jb->cib; c0 += chunk) {
                const int c1 = c0 + chunk < Jb->cib ? c0 + chunk : Jb->cib;
                int tile = 0;
                wpf_chunk(&P, wg + c0 * cst, (c1 - c0) * cst * 4, chunk * cst * 4);
                for (int q = q0; q < q1;) {
                    const int pt = base + (tile++ < rem);
                    wpf_tile(&P, &Jl, c1 - c0);
                    T->o[pt - 1][nb - 1](Jb, J->off + q, ws, wst, yb + (long long)q * 16, ys, bias,
                                         rb ? rb + (long long)q * 16 : NULL, c0, c1);
                    q += pt;
                }
            }
        }
    }
}

static void conv_task(void* ctx, long long task)
{
    const cjob_t* J = ctx;
    if (J->off) {
        conv_task_runs(J, task);
        return;
    }
    const long long band = task % J->nbands;
    int k0, k1;
    task_blocks(J, task, &k0, &k1);
    const int cpb = J->cpb;
    const tiles_t* T = tiles_for(cpb);
    const long long ys = (long long)J->OH * J->OW * 16, rs = (long long)J->W * cpb;
    /* a band is rows_per_task rows, or in a one-row job (a pointwise conv seen as one row of all its pixels)
       cols_per_task columns */
    const int oh0 = J->OH == 1 ? 0 : (int)band * J->rows_per_task;
    const int oh1 = J->OH == 1 ? 1 : (oh0 + J->rows_per_task < J->OH ? oh0 + J->rows_per_task : J->OH);
    const int owa = J->OH == 1 ? (int)band * J->cols_per_task : 0;
    const int owb = J->OH == 1 && owa + J->cols_per_task < J->OW ? owa + J->cols_per_task : J->OW;
    const int ps = J->SW * cpb;
    /* a flat pointwise row (see inferd_nchwc_conv) takes the ISA's pointwise tiles where it has them */
    const int pwa = J->act == 1 || J->act == 2 ? J->act : 0;
    pw_fn const* pw = J->OH == 1 && J->H == 1 && J->KH == 1 && J->KW == 1 && J->SW == 1 && T->pw[pwa][0] ? T->pw[pwa]
                                                                                                     : NULL;
    /* a 3-wide stem's widest tiles inside a row: NCHWC_STEM */
    tile_fn const* st = cpb == 1 && J->KW == 3 && T->s3[0] ? T->s3 : NULL;
    /* (the c1 tables have none: an NCHW input's pixels are 1 float apart, not 16) */
    /* output columns whose every tap lies inside the row: [ow_lo, ow_hi) */
    int ow_lo = (J->PL + J->SW - 1) / J->SW, ow_hi = (J->W + J->PL - J->KW) / J->SW + 1;
    if (ow_hi > J->OW) ow_hi = J->OW;
    if (ow_lo > ow_hi) ow_lo = ow_hi = J->OW;
    const int G = T->nb; /* the weights' groups (inferd_nchwc_group_blocks) */
    wpf_t P;
    int pf = 0;
    for (int b = k0; b < k1;) {
        cjob_t Jg, Jl = *group_job(J, b, &Jg);
        const cjob_t* const Jb = &Jl;
        const int b0 = b - b % G, sub = b - b0; /* the block's group and its place in it */
        const int nbg = J->cob - b0 < G ? J->cob - b0 : G, wst = nbg * 16, chunk = ci_chunk(J, nbg);
        const long long pblk = 16LL * Jb->cib * J->KH * J->KW * cpb, cst = (long long)J->KH * J->KW * cpb * wst;
        const float* wg = J->w + b0 * pblk;
        int nb = group_step(T, nbg - sub, k1 - b);
        if (nb > conv_group_left(J, b)) nb = conv_group_left(J, b);
        b += nb;
        {
            const float* ws = wg + sub * 16;
            const float* bias = J->bias ? J->bias + (b0 + sub) * 16 : NULL;
            /* Away from the pointwise tiles, a row's inside runs in tiles of even widths (27 columns: 6 + 6 + 5
               + 5 + 5 inside the edges, not 6 + 6 + 6 + 6 + 3): a narrow tile's few accumulators leave the FMAs
               waiting on each other. The same split for every row, worked out here (two divisions a tile were ~3%
               of a stem's time); every tile sums in the same order, so the bits do not change. */
            const int wide = T->wide[nb - 1], in0 = owa > ow_lo ? owa : ow_lo, in1 = owb < ow_hi ? owb : ow_hi;
            int base = wide, rem = 0, ntiles = in1 > in0 ? (in1 - in0 + wide - 1) / wide : 0;
            if (!pw && in1 > in0) {
                base = (in1 - in0) / ntiles;
                rem = (in1 - in0) % ntiles; /* the first rem tiles one column wider */
            }
            if (!pf++) {
                /* a row's tiles of a chunk (its inside and its edge columns): a band's rows each sweep every chunk,
                   and the first row brings them in */
                const int el = (ow_lo < owb ? ow_lo : owb) - owa, er = owb - (ow_hi > owa ? ow_hi : owa);
                const long long calls = ntiles + (el > 0 ? el : 0) + (er > 0 ? er : 0);
                wpf_init(&P, J->w + k0 * pblk, J->w + wpf_end(J, k1) * pblk, chunk * cst * 4, calls);
            }
            for (int oh = oh0; oh < oh1; ++oh) {
                const int ih0 = oh * J->SH - J->PT_;
                const int kh0 = ih0 < 0 ? -ih0 : 0, kh1 = J->H - ih0 < J->KH ? J->H - ih0 : J->KH;
                float* yr = J->y + (b0 + sub) * ys + (long long)oh * J->OW * 16;
                const float* rr = J->res ? J->res + (b0 + sub) * ys + (long long)oh * J->OW * 16 : NULL;
                const float* xr = Jb->x + (long long)ih0 * rs; /* row ih0 (above the image: only kh >= kh0 read) */
                /* the last output block of a conv whose channels end in a half block (24, 40 of them): its
                   real half only, in tiles of wideh pixels (a flat pointwise row: every column inside) */
                pw_fn const pwh = pw && nb == 1 && b0 + sub == J->cob - 1 && J->col > 0 && J->col <= 16 / 2 &&
                                          T->pwh[pwa] ? T->pwh[pwa] : NULL;
                for (int c0 = 0; c0 < Jb->cib; c0 += chunk) {
                    const int c1 = c0 + chunk < Jb->cib ? c0 + chunk : Jb->cib;
                    int tile = 0;
                    if (oh == oh0) wpf_chunk(&P, wg + c0 * cst, (c1 - c0) * cst * 4, chunk * cst * 4);
                    for (int ow = owa; pwh && ow < owb;) {
                        const int n = owb - ow, pt = n >= T->wideh ? T->wideh : n < wide ? n : wide;
                        wpf_tile(&P, &Jl, c1 - c0);
                        if (pt == T->wideh)
                            pwh(Jb, xr + (long long)ow * 16, ws, wst, yr + ow * 16, ys, bias, rr ? rr + ow * 16 : NULL,
                                c0, c1);
                        else if (pt == wide)
                            pw[0](Jb, xr + (long long)ow * 16, ws, wst, yr + ow * 16, ys, bias, rr ? rr + ow * 16 : NULL,
                                  c0, c1);
                        else
                            T->t[pt - 1][0](Jb, xr + (long long)ow * 16, 16, ws, wst, yr + ow * 16, ys, bias,
                                            rr ? rr + ow * 16 : NULL, 0, 1, 0, 1, c0, c1);
                        ow += pt;
                    }
                    for (int ow = owa; !pwh && ow < owb;) {
                        const int iw0 = ow * J->SW - J->PL;
                        int pt = 1, kw0 = 0, kw1 = J->KW;
                        wpf_tile(&P, &Jl, c1 - c0);
                        if (ow >= ow_lo && ow < ow_hi) {
                            const int n = in1 - ow;
                            pt = base + (tile++ < rem);
                            if (pt > n) pt = n;
                        } else {
                            kw0 = iw0 < 0 ? -iw0 : 0;
                            kw1 = J->W - iw0 < J->KW ? J->W - iw0 : J->KW;
                        }
                        if (pw && pt == wide)
                            pw[nb - 1](Jb, xr + (long long)iw0 * 16, ws, wst, yr + ow * 16, ys, bias,
                                       rr ? rr + ow * 16 : NULL, c0, c1);
                        else if (st && st[nb - 1] && pt == wide && kw1 - kw0 == J->KW)
                            st[nb - 1](Jb, xr + iw0, ps, ws, wst, yr + ow * 16, ys, bias, rr ? rr + ow * 16 : NULL, kh0,
                                       kh1, kw0, kw1, c0, c1);
                        else
                            T->t[pt - 1][nb - 1](Jb, xr + (long long)iw0 * cpb, ps, ws, wst, yr + ow * 16, ys, bias,
                                                 rr ? rr + ow * 16 : NULL, kh0, kh1, kw0, kw1, c0, c1);
                        ow += pt;
                    }
                }
            }
        }
    }
}

typedef struct {
    const float* x;
    float* xp;
    int H, W, Hp, Wp, PT, PL;
} padjob_t;

/* one padded row of Wp pixels: PL zeros, the row s of W pixels, zeros (NULL s: a row of the top or bottom
   padding, zeros) */
static void pad_row(float* d, const float* s, int W, int PL, int Wp)
{
    if (!s) {
        memset(d, 0, sizeof(float) * 16 * Wp);
        return;
    }
    memset(d, 0, sizeof(float) * 16 * PL);
    memcpy(d + 16 * PL, s, sizeof(float) * 16 * W);
    memset(d + 16 * (PL + W), 0, sizeof(float) * 16 * (Wp - W - PL));
}

/* A padded copy's size (Hp x Wp: every output pixel's taps inside it); returns the output columns whose taps
   leave the row (run one pixel at a time with clipped taps in place). */
static int pad_geometry(int H, int W, int KH, int KW, int SH, int SW, int pad_top, int pad_left, int OH, int OW,
                        int* Hp, int* Wp)
{
    const int lo = (pad_left + SW - 1) / SW, hi = (W + pad_left - KW) / SW + 1;
    const int edge = lo + (hi < OW ? OW - hi : 0);
    *Wp = (OW - 1) * SW + KW;
    *Hp = (OH - 1) * SH + KH;
    if (*Wp < W + pad_left) *Wp = W + pad_left;
    if (*Hp < H + pad_top) *Hp = H + pad_top;
    return edge;
}

/* one row of one input block into the padded copy */
static void pad_task(void* ctx, long long task)
{
    const padjob_t* P = ctx;
    const long long b = task / P->Hp;
    const int ih = (int)(task % P->Hp) - P->PT;
    pad_row(P->xp + task * P->Wp * 16, ih < 0 || ih >= P->H ? NULL : P->x + (b * P->H + ih) * P->W * 16, P->W,
            P->PL, P->Wp);
}

typedef struct {
    const float* x;
    float* xs;
    int H, W, OH, OW, SH, SW;
} subjob_t;

/* one output row of one block's strided pixels (a strided 1x1's input), zeros where they fall past the map */
static void sub_task(void* ctx, long long task)
{
    const subjob_t* S = ctx;
    const int b = (int)(task / S->OH), oh = (int)(task % S->OH), ih = oh * S->SH;
    float* d = S->xs + task * S->OW * 16;
    if (ih >= S->H) { /* a row of the end padding */
        memset(d, 0, sizeof(float) * 16 * S->OW);
        return;
    }
    const float* r = S->x + ((long long)b * S->H + ih) * S->W * 16;
    for (int ow = 0; ow < S->OW; ++ow) {
        const int iw = ow * S->SW;
        if (iw < S->W)
            memcpy(d + ow * 16, r + (long long)iw * 16, sizeof(float) * 16);
        else
            memset(d + ow * 16, 0, sizeof(float) * 16);
    }
}

static long long L2_HALF;

/* Half the L2 cache of one core in bytes (sysconf, else the first level-2 cache sysfs lists, else 512 KB: read once;
   a race writes the same value) */
static long long l2_half(void)
{
    long long v = __atomic_load_n(&L2_HALF, __ATOMIC_RELAXED);
    if (v > 0) return v;
    long long b = 0;
#ifdef _SC_LEVEL2_CACHE_SIZE
    b = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    for (int i = 0; b <= 0 && i < 8; ++i) {
        char path[96], buf[32];
        int level = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE* f = fopen(path, "r");
        if (!f) break;
        if (fscanf(f, "%d", &level) != 1) level = 0;
        fclose(f);
        if (level != 2) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        f = fopen(path, "r");
        if (!f) break;
        if (fgets(buf, sizeof buf, f)) {
            char* end = NULL;
            b = strtoll(buf, &end, 10);
            if (end && (*end == 'K' || *end == 'k')) b <<= 10;
            else if (end && (*end == 'M' || *end == 'm')) b <<= 20;
        }
        fclose(f);
    }
    if (b <= 0) b = 512 << 10;
    __atomic_store_n(&L2_HALF, b / 2, __ATOMIC_RELAXED);
    return b / 2;
}

/* cib input blocks of cpb channels each: the blocked layout (cpb 16) or NCHW planes (cpb 1, cib the channels) */
/* A pointwise job (one row of all its pixels) in about ``bands`` column bands of whole pointwise tiles. */
static void flat_bands(cjob_t* J, int bands)
{
    const tiles_t* T = tiles_for(J->cpb);
    const int pt = T->wide[T->nb - 1];
    J->cols_per_task = ((J->OW + bands - 1) / bands + pt - 1) / pt * pt;
    J->nbands = (J->OW + J->cols_per_task - 1) / J->cols_per_task;
}

/* Units per task for `units` units of ub blocks (cob blocks in all) over t threads: the fewest blocks on the
   busiest thread (tasks dealt whole: the one thread with an extra task may get the short last one), then the task
   count nearest `chunks` (inferd_pool_chunks: enough tasks to steal from under load). */
static int even_units(int units, int ub, int cob, int chunks, int t)
{
    int best = units;
    long long best_span = -1, best_dist = 0;
    for (int g = 1; g <= units; ++g) {
        const int n = (units + g - 1) / g;
        if (g > 1 && (units + g - 2) / (g - 1) == n) continue; /* the same task count as g - 1, larger tasks */
        const long long full = (long long)g * ub, last = cob - (long long)(n - 1) * full;
        const long long span = (long long)(n / t) * full + (n % t == 0 ? 0 : n % t == 1 ? last : full);
        const long long dist = n > chunks ? n - chunks : chunks - n;
        if (best_span < 0 || span < best_span || (span == best_span && dist < best_dist)) {
            best = g;
            best_span = span;
            best_dist = dist;
        }
    }
    return best;
}

/* The phase-split copy's rows and columns (dilated_copy); rows, where not NULL, gets the first row of each phase */
static void dilated_dims(int KH, int KW, int DH, int DW, int OH, int OW, int* rows, int* Hp_out, int* Wp_out)
{
    int Wp = 0, Hp = 0;
    for (int b = 0; b < DW; ++b) {
        const int ow = (OW - b + DW - 1) / DW;
        if (ow + KW - 1 > Wp) Wp = ow + KW - 1;
    }
    for (int a = 0; a < DH; ++a)
        for (int b = 0; b < DW; ++b) {
            if (rows) rows[a * DW + b] = Hp;
            Hp += (OH - a + DH - 1) / DH + KH - 1;
        }
    *Hp_out = Hp, *Wp_out = Wp;
}

/* A dilated conv (stride 1, dense, its pads whole multiples of the dilation) in the padded-run form: the input
   split by phase (the rows and columns of each residue modulo the dilation), each phase's sub-image padded by
   pad / dilation and stacked one under another at one row pitch, so every output pixel reads a dilation-1
   window at its own offset (off[]) and the run tiles (NCHWC_TILEO) apply unchanged. xp: 16 * cib * (*Hp) * (*Wp)
   floats, zeros where nothing is copied. Returns 0, or -1 when out of memory. */
static int dilated_copy(const float* x, int cib, int H, int W, int KH, int KW, int DH, int DW, int pt, int pl, int OH,
                        int OW, float** xp_out, int** off_out, int* Hp_out, int* Wp_out)
{
    int* rows = (int*)malloc(sizeof(int) * (size_t)DH * DW); /* the first row of phase (a, b)'s block */
    if (!rows) return -1;
    int Wp, Hp;
    dilated_dims(KH, KW, DH, DW, OH, OW, rows, &Hp, &Wp);
    if ((long long)Hp * Wp * 16 >= (1LL << 30)) { /* (the offsets are ints) */
        free(rows);
        return -1;
    }
    float* xp = (float*)calloc((size_t)16 * cib * Hp * Wp, sizeof(float));
    int* off = (int*)malloc(sizeof(int) * (size_t)OH * OW);
    if (!xp || !off) {
        free(rows);
        free(xp);
        free(off);
        return -1;
    }
    for (int cb = 0; cb < cib; ++cb)
        for (int a = 0; a < DH; ++a)
            for (int b = 0; b < DW; ++b) {
                const int hp = (OH - a + DH - 1) / DH + KH - 1, wp = (OW - b + DW - 1) / DW + KW - 1;
                float* d = xp + ((size_t)cb * Hp + rows[a * DW + b]) * Wp * 16;
                /* sub-image pixel (r, c) = input (a + r * DH, b + c * DW) at padded (pt + r, pl + c); rows and
                   columns past the padded block are never read */
                for (int r = 0; pt + r < hp && a + r * DH < H; ++r)
                    for (int c = 0; pl + c < wp && b + c * DW < W; ++c)
                        memcpy(d + ((size_t)(pt + r) * Wp + pl + c) * 16,
                               x + (((size_t)cb * H + a + (size_t)r * DH) * W + b + (size_t)c * DW) * 16,
                               16 * sizeof(float));
            }
    for (int q = 0; q < OH * OW; ++q) {
        const int r = q / OW, c = q % OW;
        off[q] = ((rows[(r % DH) * DW + c % DW] + r / DH) * Wp + c / DW) * 16;
    }
    free(rows);
    *xp_out = xp, *off_out = off, *Hp_out = Hp, *Wp_out = Wp;
    return 0;
}

/* Whether conv_run runs a k x k conv (blocked input, not flat) from a padded copy of its input (Hp x Wp pixels a
   block): see conv_run */
static int pad_copy(int cib, int H, int W, int cout_blocks, int KH, int KW, int SH, int SW, int pad_top, int pad_left,
                    int OH, int OW, int* Hp, int* Wp)
{
    const int edge = pad_geometry(H, W, KH, KW, SH, SW, pad_top, pad_left, OH, OW, Hp, Wp);
    const long long pbytes = 64LL * cib * *Hp * *Wp;
    const int strided = SH * SW > 1 && (long long)cout_blocks * 16 * KH * KW >= 1024;
    return edge > 0 && (32 * edge >= OW || (strided && pbytes <= PAD_MAX_BYTES));
}

static int conv_run(const float* x, int cib, int cpb, int H, int W, const float* w, int cout_blocks, int KH, int KW,
                    int SH, int SW, int pad_top, int pad_left, int OH, int OW, const float* bias, const float* res,
                    float* y, int act, float p0, float p1, int cil, int col, int gi, int go, int DH, int DW)
{
    if (cib < 1 || cout_blocks < 1 || H < 1 || W < 1 || KH < 1 || KW < 1 || SH < 1 || SW < 1 || OH < 1 || OW < 1 ||
        DH < 1 || DW < 1 || pad_top < 0 || pad_left < 0 || pad_top % DH || pad_left % DW || pad_top / DH >= KH ||
        pad_left / DW >= KW)
        return -1;
    const int dilated = DH > 1 || DW > 1;
    if (dilated && (SH != 1 || SW != 1 || cpb != 16 || go))
        return -1;
    if (go && (gi < 1 || go < 1 || cpb != 16 || cout_blocks % go || (long long)cout_blocks / go * gi != cib))
        return -1;
    /* A strided 1x1 (ResNet's downsampling) through the general tiles, row by row, every SW-th pixel in place:
       ~1.5x the time of a copy of those pixels (a quarter of the input at stride 2) and the pointwise tiles over
       it (two threads, Zen 3: 512->1024 on 28x28 2.15 ms in place, 1.38 + ~0.05 for the copy; 256->512 on 56x56
       1.88 against 1.22 + ~0.06). */
    float* xs = NULL;
    if (cpb == 16 && KH == 1 && KW == 1 && (SH > 1 || SW > 1)) {
        xs = (float*)malloc(sizeof(float) * 16 * (size_t)cib * OH * OW);
        if (xs) { /* (else in place) */
            subjob_t S = {x, xs, H, W, OH, OW, SH, SW};
            inferd_parallel(sub_task, &S, (long long)cib * OH, 0);
            x = xs;
            H = OH;
            W = OW;
            SH = SW = 1;
        }
    }
    /* a pointwise conv (1x1, stride 1, no padding) is one row of all its pixels: no row ends to fall short at */
    const int flat = !dilated && KH == 1 && KW == 1 && SH == 1 && SW == 1 && OH == H && OW == W;
    if (flat) {
        W = OW = H * W;
        H = OH = 1;
    }
    /* The columns whose taps leave the row run as one-pixel tiles with their taps clipped: two accumulators on
       AVX2, a weight load per FMA, ~4x a column's time inside; and a short row's inside runs in narrow tiles (7
       columns: 4 + 3). On narrow maps (those columns 1/32 of the row or more) the input is first copied with its
       padding as zeros on every side, and the map runs as one row of pixels in runs of up to PTO_MAX across the
       rows (NCHWC_TILEO: 49 pixels are 6 x 8 + 1); on wide ones the copy cost more than it saved. Two threads,
       Zen 3, in-process A/B, the runs against row tiles over the same padded copy: 512->512 3x3 s2 on 14x14 0.57x
       the time, 512->512 on 7x7 0.68x, 256->256 s2 on 28x28 0.77x, 64->256 on 13x13 0.91x, 32->128 on 27x27
       0.92x, 5x5s on 28 to 56 columns 0.99-1.0x; the padded rows against the clipped ones had been 0.91-0.95x on
       narrow maps, 0.97-1.08x on 56 to 224 columns. With the runs the copy pays on wide maps too for strided
       convs of 1024 or more output channels x taps (128->128 s2 on 56x56 0.90-0.93x, 64->128 s2 0.88-0.92x;
       32->32 s2 on 112x112 1.04-1.11x), up to a copy of PAD_MAX_BYTES; not for stride 1 (64->64 on 56x56
       0.98-1.06x, 64->64 on 224x224 0.98x, 16->16 on 112x112 1.09x). Narrow was 1/16 of the row until
       2026-12-02: at 1/32, SqueezeNet's 16->64 3x3 on 55x55 0.95x the time, 96->192 on 56x56 0.94-0.98x, 64->64
       on 56x56 0.97-1.0x, 32->32 on 64x64 1.0x. The zeros add the same partial sums: the same bits. */
    float* xp = NULL;
    int* off = NULL;
    if (dilated) {
        int Hp, Wp;
        if (dilated_copy(x, cib, H, W, KH, KW, DH, DW, pad_top / DH, pad_left / DW, OH, OW, &xp, &off, &Hp, &Wp))
            return -2;
        x = xp;
        H = Hp;
        W = Wp;
        pad_top = pad_left = 0;
    } else if (cpb == 16 && !flat && KW > 1) {
        int Hp, Wp;
        if (pad_copy(cib, H, W, cout_blocks, KH, KW, SH, SW, pad_top, pad_left, OH, OW, &Hp, &Wp)) {
            if ((long long)Hp * Wp * 16 < (1LL << 30)) { /* (the offsets are ints) */
                xp = (float*)malloc(sizeof(float) * 16 * (size_t)cib * Hp * Wp);
                off = (int*)malloc(sizeof(int) * (size_t)OH * OW);
            }
            if (xp && off) {
                padjob_t P = {x, xp, H, W, Hp, Wp, pad_top, pad_left};
                inferd_parallel(pad_task, &P, (long long)cib * Hp, 0);
                for (int q = 0; q < OH * OW; ++q) off[q] = ((q / OW) * SH * Wp + (q % OW) * SW) * 16;
                x = xp;
                H = Hp;
                W = Wp;
                pad_top = pad_left = 0;
            } else { /* the clipped row tiles */
                free(xp);
                free(off);
                xp = NULL;
                off = NULL;
            }
        }
    }
    const int ub = tiles_for(cpb)->nb, units = (cout_blocks + ub - 1) / ub, cin = cib * cpb;
    cjob_t J = {x, w, bias, res, y, cib, H, W, cout_blocks, KH, KW, SH, SW, pad_top, pad_left, OH, OW,
                act, p0, p1, OH, OW, 1, units, ub, cpb, off, cpb == 16 && cil > 0 && cil < 16 ? cil : 0,
                col > 0 && col < 16 ? col : 0, go ? gi : 0, go};
    const int cin_read = go ? gi * 16 : cin; /* the input channels each output channel reads */
    const double work = 2.0 * cin_read * KH * KW * cout_blocks * 16 * (double)OH * OW;
    const double wbytes = 4.0 * cin_read * KH * KW * cout_blocks * 16, xbytes = 4.0 * cin * H * W;
    if (wbytes > xbytes && units > 1) {
        /* the weights outweigh the input (small maps, many channels): tasks split the output blocks, in units
           of the tiles' block count (not of the weights' groups of NB_MAX: on AVX2 a tile takes one block, and
           MobileNetV2's 960->160 on 7x7, 3 groups, ran as 2 + 1 groups, or as 2 x 3 tasks of column bands each
           reading its group's weights again), as evenly over the threads as the units allow; a pointwise map
           in column bands where they cannot be even (fewer units than threads). Two threads, Zen 3, against the
           group split: 960->160 on 7x7 0.82x the time, 960->320 0.96x, SqueezeNet's 48->192 3x3 on 13x13 0.75x
           (3 groups), the same on 27x27 0.75x; 512->1008 on 13x13 0.98-1.0x, resnets' 3x3s unchanged */
        const int tasks = inferd_pool_chunks(units, work), t = inferd_pool_threads();
        J.gpt = even_units(units, ub, cout_blocks, tasks, t);
        const int ntasks = (units + J.gpt - 1) / J.gpt;
        int bands = 1; /* where the units do not split evenly over the threads: the fewest bands that do */
        if (t > 1 && ntasks % t != 0 && ntasks < 4 * t) {
            bands = 2;
            while (bands < t && (ntasks * bands) % t != 0) ++bands;
        }
        if (flat) {
            /* each band's input (all channels) within half a core's L2: a task re-reads its band for each of its
               output blocks, and the whole map's input of a wide layer on a small one (ResNet-50's 1024->256 on
               14x14: 800 KB) came from L3 every time. The same sums in the same order: the same bits. Zen 3 (512
               KB L2), two threads, alternating processes: 1024->256 on 14x14 0.86x the time, 528->256 on 14x14
               0.92x, 832->256 and 2048->512 on 7x7 ~1.0x; resnet50 and googlenet within their noise */
            const long long l2px = l2_half() / ((long long)cin * 4);
            if (l2px > 0 && OW > l2px && (OW + l2px - 1) / l2px > bands) bands = (int)((OW + l2px - 1) / l2px);
        }
        if (flat && bands > 1) flat_bands(&J, bands);
        if (off) {
            /* the run form: the whole map as one band, or those bands of its pixels (SqueezeNet's 48->192 3x3 on
               13x13: three units on two threads), every band reading its unit's weights. Two threads, Zen 4,
               in-process A/B: 48->192 3x3 on 13x13 0.79x the time, s2 on 14x14 0.78x, the same bits;
               squeezenet1_1 0.98x (0.97-0.99) */
            J.cols_per_task = (OH * OW + bands - 1) / bands;
            J.nbands = (OH * OW + J.cols_per_task - 1) / J.cols_per_task;
        }
    } else if (off) {
        /* pixel bands, whole runs */
        const int npx = OH * OW, bands = inferd_pool_chunks(npx / PTO_MAX > 0 ? npx / PTO_MAX : 1, work);
        J.cols_per_task = ((npx + bands - 1) / bands + PTO_MAX - 1) / PTO_MAX * PTO_MAX;
        J.nbands = (npx + J.cols_per_task - 1) / J.cols_per_task;
    } else if (flat) {
        /* column bands: enough for the pool, and each band's input (all channels) within ~1 MB of L2 */
        const long long l2 = (1 << 20) / ((long long)cin * 4);
        int bands = inferd_pool_chunks(OW / 16 > 0 ? OW / 16 : 1, work);
        if (l2 > 0 && (OW + l2 - 1) / l2 > bands) bands = (int)((OW + l2 - 1) / l2);
        flat_bands(&J, bands);
    } else {
        const int bands = inferd_pool_chunks(OH, work);
        J.rows_per_task = (OH + bands - 1) / bands;
        J.nbands = (OH + J.rows_per_task - 1) / J.rows_per_task;
    }
    inferd_parallel(conv_task, &J, (long long)J.nbands * ((units + J.gpt - 1) / J.gpt), 0);
    free(xp);
    free(xs);
    free(off);
    return 0;
}

int inferd_nchwc_conv(const float* x, int cin_blocks, int H, int W, const float* w, int cout_blocks, int KH, int KW,
                      int SH, int SW, int pad_top, int pad_left, int OH, int OW, const float* bias, const float* res,
                      float* y, int act, float p0, float p1)
{
    return conv_run(x, cin_blocks, 16, H, W, w, cout_blocks, KH, KW, SH, SW, pad_top, pad_left, OH, OW, bias, res, y,
                    act, p0, p1, 0, 0, 0, 0, 1, 1);
}

/* Where the input's channels are not a multiple of 16 (MobileNetV2's 24, EfficientNet's 40), the pointwise tiles
   skip the last block's padding lanes: a quarter of the FMAs over a 24-channel input. Zen 3, two threads: 24->144 on
   56x56 (MobileNetV2's expansions) 0.77x the time of the same conv over 32, 40->240 on 28x28 0.84x. */
int inferd_nchwc_conv_ch(const float* x, int cin, int H, int W, const float* w, int cout, int KH, int KW, int SH,
                         int SW, int pad_top, int pad_left, int OH, int OW, const float* bias, const float* res,
                         float* y, int act, float p0, float p1)
{
    if (cin < 1 || cout < 1) return -1;
    return conv_run(x, (cin + 15) / 16, 16, H, W, w, (cout + 15) / 16, KH, KW, SH, SW, pad_top, pad_left, OH, OW, bias,
                    res, y, act, p0, p1, cin % 16, cout % 16, 0, 0, 1, 1);
}

/* A grouped conv whose groups, taken `per` at a time, fill whole blocks each way (RegNet's and ResNeXt's groups of
   8 channels two to a block; of 32 or 64, one to two or four blocks): it runs as a conv of cout_blocks / go
   groups of gi input and go output blocks, with weights zero between the groups inside one (per x the
   multiply-adds, in the tiles of a dense conv). The im2col path ran one small GEMM per group: RegNetY-400MF's
   3x3s of 8-channel groups at 6-9x their roofline. */
int inferd_nchwc_conv_grouped(const float* x, int cin, int H, int W, const float* w, int cout, int KH, int KW,
                              int SH, int SW, int pad_top, int pad_left, int OH, int OW, int gi, int go,
                              const float* bias, const float* res, float* y, int act, float p0, float p1)
{
    if (cin < 1 || cout < 1 || gi < 1 || go < 1) return -1;
    return conv_run(x, (cin + 15) / 16, 16, H, W, w, (cout + 15) / 16, KH, KW, SH, SW, pad_top, pad_left, OH, OW, bias,
                    res, y, act, p0, p1, cin % 16, cout % 16, gi, go, 1, 1);
}

int inferd_nchwc_conv_nchw(const float* x, int cin, int H, int W, const float* w, int cout_blocks, int KH, int KW,
                           int SH, int SW, int pad_top, int pad_left, int OH, int OW, const float* bias,
                           const float* res, float* y, int act, float p0, float p1)
{
    return conv_run(x, cin, 1, H, W, w, cout_blocks, KH, KW, SH, SW, pad_top, pad_left, OH, OW, bias, res, y, act, p0,
                    p1, 0, 0, 0, 0, 1, 1);
}

/* A dilated conv (DeepLab's and FCN's atrous 3x3s at stride 1; pads whole multiples of the dilation), dense,
   through a phase-split padded copy of the input (dilated_copy) and the run tiles; the channel counts as in
   inferd_nchwc_conv_ch. Returns 0, -1 for arguments it does not take, -2 when out of memory. */
int inferd_nchwc_conv_dilated(const float* x, int cin, int H, int W, const float* w, int cout, int KH, int KW, int DH,
                              int DW, int pad_top, int pad_left, int OH, int OW, const float* bias, const float* res,
                              float* y, int act, float p0, float p1)
{
    if (cin < 1 || cout < 1) return -1;
    return conv_run(x, (cin + 15) / 16, 16, H, W, w, (cout + 15) / 16, KH, KW, 1, 1, pad_top, pad_left, OH, OW, bias,
                    res, y, act, p0, p1, cin % 16, cout % 16, 0, 0, DH, DW);
}

/* The bytes conv_run allocates beside its arguments for this conv (cin, cout: channels; NCHW input: cpb 1), the
   most it holds at once: the strided 1x1's copy of the pixels it reads, the padded or phase-split copy of the input
   and its offsets. Transient (freed before the call returns), but a memory budget must leave room for it: the
   streaming runtime counts its layers' largest. */
long long inferd_nchwc_scratch_bytes(int cin, int cpb, int H, int W, int cout, int KH, int KW, int SH, int SW,
                                     int pad_top, int pad_left, int OH, int OW, int DH, int DW)
{
    const int cib = cpb == 16 ? (cin + 15) / 16 : cin, cob = (cout + 15) / 16;
    if (cpb == 16 && KH == 1 && KW == 1 && (SH > 1 || SW > 1)) return 4LL * 16 * cib * OH * OW;
    int Hp, Wp;
    if (DH > 1 || DW > 1) {
        dilated_dims(KH, KW, DH, DW, OH, OW, NULL, &Hp, &Wp);
        return 4LL * 16 * cib * Hp * Wp + 4LL * OH * OW + 4LL * DH * DW;
    }
    const int flat = KH == 1 && KW == 1 && SH == 1 && SW == 1 && OH == H && OW == W;
    if (cpb == 16 && !flat && KW > 1 && pad_copy(cib, H, W, cob, KH, KW, SH, SW, pad_top, pad_left, OH, OW, &Hp, &Wp))
        return 4LL * 16 * cib * Hp * Wp + 4LL * OH * OW;
    return 0;
}

int inferd_nchwc_tile_pixels(void) { return tiles()->wide[tiles()->nb - 1]; }

/* The output blocks of a packed weights group: the tiles' block count, for blocked and NCHW inputs alike */
int inferd_nchwc_group_blocks(void) { return tiles()->nb; }

/* ------------------------------------------------------------------ depthwise conv and max pool, blocked
   One 16-channel block per task row band: a pixel's 16 channels are one vector, each tap one FMA (or max)
   per pixel, several pixels of a row at a time for independent chains. Taps outside the image are skipped
   (zero padding for the conv, -inf for the pool), per pixel at a row's edges. */

typedef struct {
    const float* x;
    const float* w; /* dw: [cb][kh][kw][16]; NULL for the pool */
    const float* bias;
    const float* res;
    float* y;
    int cb, H, W, KH, KW, SH, SW, PT_, PL, OH, OW, act;
    float p0, p1;
    int rows_per_task, nbands;
    /* narrow maps (a conv's): each task copies its block's map with the padding as zeros (Hp x Wp, on its stack)
       and runs it unpadded, so no pixel has clipped taps; 0: in place */
    int Hp, Wp;
    const float* xblk; /* the block's map when the row reads one block's copy (x then not offset by the block) */
    int band_major;    /* tasks ordered band by band (each thread a band of rows of every block), else block by block */
} djob_t;

/* One tap for NPV pixels of a row (PS floats apart: the stride), each pixel 16 / VW vectors: an FMA; for a max
   pool (POOL 1) a max where a NaN wins, or (POOL 2) the ISA's max instruction, with each value read also added to
   the pixel's sum (NCHWC_POOL_SUMS), where a NaN stays: the row is run again with POOL 1 if a sum is NaN. */
#define NCHWC_DW_TAPS(VT, VI, VW, POOL, NPV, PS, FMAX)                                                          \
    do {                                                                                                         \
        _Pragma("GCC unroll 16") for (int p = 0; p < (NPV); ++p)                                                 \
            _Pragma("GCC unroll 4") for (int k = 0; k < 16 / VW; ++k)                                            \
        {                                                                                                        \
            VT v;                                                                                                \
            memcpy(&v, xt + p * (PS) + k * VW, sizeof(VT));                                                      \
            if (POOL == 2) {                                                                                     \
                acc[p][k] = FMAX(v, acc[p][k]);                                                                  \
                if (NCHWC_POOL_SUMS) sum[p] += v;                                                                \
            } else if (POOL) {                                                                                   \
                acc[p][k] = INFERD_VSEL(VT, VI, v > acc[p][k], v, acc[p][k]);                                    \
                acc[p][k] = INFERD_VSEL(VT, VI, v != v, v, acc[p][k]);                                           \
            } else {                                                                                             \
                acc[p][k] += v * wv[k];                                                                          \
            }                                                                                                    \
        }                                                                                                        \
    } while (0)

/* Every tap of a group of NPV pixels PS floats apart; KWC the kernel's width where known when compiled (3 or 5:
   unrolled), else 0. With stride 1 as a constant (PS 16) neighbouring pixels' taps read the same columns, which
   GCC then loads once per row for all of them: 5x5 0.75-0.89x the time, but 3x3 1.09-1.17x (AVX2, one thread;
   presumably the shared columns crowd the accumulators out of 16 registers), so 3x3 keeps the stride a variable;
   a 3x3 pool, which holds no weights, takes strides 1 and 2 as constants (0.95-0.97x the time, Zen 4). */
#define NCHWC_DW_GROUP(VT, VI, VW, POOL, NPV, KWC, PS, FMAX)                                                    \
    for (int kh = kh0; kh < kh1; ++kh) {                                                                         \
        const float* xr = xb + (long long)(ih0 + kh) * rs + (long long)iw0 * 16;                                 \
        const float* wr = POOL ? NULL : wb + kh * KW * 16;                                                       \
        _Pragma("GCC unroll 8") for (int kw = (KWC) ? 0 : kw0; kw < ((KWC) ? (KWC) : kw1); ++kw)                 \
        {                                                                                                        \
            VT wv[16 / VW];                                                                                      \
            _Pragma("GCC unroll 4") for (int k = 0; k < 16 / VW; ++k)                                            \
            {                                                                                                    \
                wv[k] = (VT){0};                                                                                 \
                if (!POOL) memcpy(&wv[k], wr + kw * 16 + k * VW, sizeof(VT));                                    \
            }                                                                                                    \
            const float* xt = xr + (long long)kw * 16;                                                           \
            NCHWC_DW_TAPS(VT, VI, VW, POOL, NPV, PS, FMAX);                                                      \
        }                                                                                                        \
    }

/* NPW pixels of a row at a time inside it (NPW / 2 for what is left, then NPW / 4 where NPW is 8, then 1): NPW x
   16 / VW independent chains. The groups of 2 on AVX-512 (one thread, 2026-12-04, Zen 4): 576 channels 3x3 on
   4x4 0.81-0.85x the time, 3x3 s2 576 on 14x14 0.82x, 5x5 672 on 14x14 0.85x, 1152 on 7x7 0.87x; the others
   0.92-1.02x, the same bits.
   The job's fields are read into locals once: in the tap loops they had been reloaded and their offsets
   recomputed per tap (a third of the loop's instructions, 2026-12-01, Zen 3). */
#define NCHWC_DW_ROW(NAME, ATTR, VT, VI, VW, NPW, POOL, FMAX)                                                    \
    ATTR static int NAME(const djob_t* J, int cb, int oh)                                                        \
    {                                                                                                            \
        const int H = J->H, W = J->W, KH = J->KH, KW = J->KW, SW = J->SW, PL = J->PL, OW = J->OW;                \
        const long long rs = (long long)W * 16, xs = (long long)H * rs, ps = (long long)SW * 16;                 \
        const long long ys = (long long)J->OH * OW * 16;                                                          \
        const float* xb = J->xblk ? J->xblk : J->x + cb * xs;                                                    \
        const float* wb = POOL ? NULL : J->w + (long long)cb * KH * KW * 16;                                      \
        float* yr = J->y + cb * ys + (long long)oh * OW * 16;                                                    \
        const float* rr = J->res ? J->res + cb * ys + (long long)oh * OW * 16 : NULL;                            \
        const int ih0 = oh * J->SH - J->PT_;                                                                     \
        const int kh0 = ih0 < 0 ? -ih0 : 0, kh1 = H - ih0 < KH ? H - ih0 : KH;                                   \
        int ow_lo = (PL + SW - 1) / SW, ow_hi = (W + PL - KW) / SW + 1;                                          \
        if (ow_hi > OW) ow_hi = OW;                                                                              \
        if (ow_lo > ow_hi) ow_lo = ow_hi = OW;                                                                   \
        VT init[16 / VW];                                                                                        \
        _Pragma("GCC unroll 4") for (int k = 0; k < 16 / VW; ++k)                                                \
        {                                                                                                        \
            init[k] = (VT){0};                                                                                   \
            if (POOL)                                                                                            \
                init[k] = -__builtin_inff() - (VT){0};                                                           \
            else if (J->bias)                                                                                    \
                memcpy(&init[k], J->bias + cb * 16 + k * VW, sizeof(VT));                                        \
        }                                                                                                        \
        const int act = J->act;                                                                                  \
        const float p0 = J->p0, p1 = J->p1;                                                                      \
        VT sum[NPW]; /* POOL 2: per pixel of a group, the sum of the values its taps read, over the row */      \
        _Pragma("GCC unroll 16") for (int p = 0; p < NPW; ++p) sum[p] = (VT){0};                                 \
        for (int ow = 0; ow < OW;) {                                                                             \
            const int iw0 = ow * SW - PL;                                                                        \
            const int in_ = ow >= ow_lo;                                                                         \
            const int np = in_ && ow + NPW <= ow_hi ? NPW                                                        \
                           : in_ && ow + NPW / 2 <= ow_hi ? NPW / 2                                              \
                           : in_ && NPW >= 8 && ow + NPW / 4 <= ow_hi ? NPW / 4 : 1;                             \
            const int kw0 = np > 1 || iw0 >= 0 ? 0 : -iw0;                                                       \
            const int kw1 = np > 1 || W - iw0 >= KW ? KW : W - iw0;                                              \
            VT acc[NPW][16 / VW];                                                                                \
            _Pragma("GCC unroll 16") for (int p = 0; p < NPW; ++p)                                               \
                _Pragma("GCC unroll 4") for (int k = 0; k < 16 / VW; ++k) acc[p][k] = init[k];                   \
            if (np == NPW && KW == 5 && SW == 1)                                                                 \
                NCHWC_DW_GROUP(VT, VI, VW, POOL, NPW, 5, 16, FMAX)                                               \
            else if (POOL && np == NPW && KW == 3 && SW == 2)                                                    \
                NCHWC_DW_GROUP(VT, VI, VW, POOL, NPW, 3, 32, FMAX)                                               \
            else if (POOL && np == NPW && KW == 3 && SW == 1)                                                    \
                NCHWC_DW_GROUP(VT, VI, VW, POOL, NPW, 3, 16, FMAX)                                               \
            else if (np == NPW && KW == 3)                                                                       \
                NCHWC_DW_GROUP(VT, VI, VW, POOL, NPW, 3, ps, FMAX)                                               \
            else if (np == NPW)                                                                                  \
                NCHWC_DW_GROUP(VT, VI, VW, POOL, NPW, 0, ps, FMAX)                                               \
            else if (np == NPW / 2)                                                                              \
                NCHWC_DW_GROUP(VT, VI, VW, POOL, NPW / 2, 0, ps, FMAX)                                           \
            else if (NPW >= 8 && np == NPW / 4)                                                                  \
                NCHWC_DW_GROUP(VT, VI, VW, POOL, (NPW >= 8 ? NPW / 4 : 1), 0, ps, FMAX)                          \
            else                                                                                                 \
                NCHWC_DW_GROUP(VT, VI, VW, POOL, 1, 0, ps, FMAX)                                                 \
            for (int p = 0; p < np; ++p)                                                                         \
                _Pragma("GCC unroll 4") for (int k = 0; k < 16 / VW; ++k)                                        \
                {                                                                                                \
                    VT v = acc[p][k];                                                                            \
                    const long long o = (long long)(ow + p) * 16 + k * VW;                                       \
                    if (rr) {                                                                                    \
                        VT r;                                                                                    \
                        memcpy(&r, rr + o, sizeof(VT));                                                          \
                        v += r;                                                                                  \
                    }                                                                                            \
                    if (act && !INFERD_ACT_COSTLY(act)) INFERD_VACT(VT, VI, v, act, p0, p1);                     \
                    memcpy(yr + o, &v, sizeof(VT));                                                              \
                }                                                                                                \
            if (INFERD_ACT_COSTLY(act)) act_inplace(yr + (long long)ow * 16, np * 16, act, p0, p1);             \
            ow += np;                                                                                            \
        }                                                                                                        \
        int nan = 0;                                                                                             \
        if (POOL == 2 && NCHWC_POOL_SUMS)                                                                        \
            for (int p = 0; p < NPW; ++p)                                                                        \
                for (int l = 0; l < VW; ++l) nan |= sum[p][l] != sum[p][l];                                      \
        return nan;                                                                                              \
    }

typedef int (*drow_fn)(const djob_t*, int, int);

/* The max instructions of the pools' POOL 2. x86's maxps(a, b) is a > b ? a : b, POOL 1's select without its NaN
   test: with the sum, two instructions a tap where POOL 1 takes four (two compares, a mask OR, a blend); a NaN that
   maxps drops shows in the sums (as does an inf beside a -inf: a false alarm, the row then run again). NEON's fmax
   returns a NaN from either operand: there POOL 2 keeps NaN as it is, and sums nothing. */
#if defined(__x86_64__)
#define NCHWC_POOL_SUMS 1
static inline v4f fmax_gen(v4f a, v4f b) { return (v4f)_mm_max_ps((__m128)a, (__m128)b); }
#elif defined(__aarch64__)
#define NCHWC_POOL_SUMS 0
static inline v4f fmax_gen(v4f a, v4f b) { return (v4f)vmaxq_f32((float32x4_t)a, (float32x4_t)b); }
#else
#define NCHWC_POOL_SUMS 1
static inline v4f fmax_gen(v4f a, v4f b) { return INFERD_VSEL(v4f, v4i, a > b, a, b); }
#endif

/* 8 pixels a vector each on AVX-512; 4 of two vectors on AVX2 and of four on NEON; 2 of four on SSE */
#if defined(__x86_64__)
NCHWC_DW_ROW(dw_gen, , v4f, v4i, 4, 2, 0, fmax_gen)
NCHWC_DW_ROW(mp_gen, , v4f, v4i, 4, 2, 1, fmax_gen)
NCHWC_DW_ROW(mpf_gen, , v4f, v4i, 4, 2, 2, fmax_gen)
#else
NCHWC_DW_ROW(dw_gen, , v4f, v4i, 4, 4, 0, fmax_gen)
NCHWC_DW_ROW(mp_gen, , v4f, v4i, 4, 4, 1, fmax_gen)
NCHWC_DW_ROW(mpf_gen, , v4f, v4i, 4, 4, 2, fmax_gen)
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(INFERD_NO_CLONES)
AVX2 static inline v8f fmax_avx2(v8f a, v8f b) { return (v8f)_mm256_max_ps((__m256)a, (__m256)b); }
AVX512 static inline v16f fmax_avx512(v16f a, v16f b) { return (v16f)_mm512_max_ps((__m512)a, (__m512)b); }
NCHWC_DW_ROW(dw_avx2, AVX2, v8f, v8i, 8, 4, 0, fmax_avx2)
NCHWC_DW_ROW(mp_avx2, AVX2, v8f, v8i, 8, 4, 1, fmax_avx2)
NCHWC_DW_ROW(mpf_avx2, AVX2, v8f, v8i, 8, 4, 2, fmax_avx2)
NCHWC_DW_ROW(dw_avx512, AVX512, v16f, v16i, 16, 8, 0, fmax_avx512)
NCHWC_DW_ROW(mp_avx512, AVX512, v16f, v16i, 16, 8, 1, fmax_avx512)
NCHWC_DW_ROW(mpf_avx512, AVX512, v16f, v16i, 16, 8, 2, fmax_avx512)
#endif

/* pool: 0 a depthwise conv, 1 a max pool where a NaN wins, 2 a max pool on the max instruction with its sums
   (a row whose sums are NaN runs again with 1: pool_rows) */
static drow_fn drow(int pool)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(INFERD_NO_CLONES)
    const int l = isa_level();
    if (l == 2) return pool == 2 ? mpf_avx512 : pool ? mp_avx512 : dw_avx512;
    if (l == 1) return pool == 2 ? mpf_avx2 : pool ? mp_avx2 : dw_avx2;
#endif
    return pool == 2 ? mpf_gen : pool ? mp_gen : dw_gen;
}

/* A max pool task's rows [oh0, oh1) of block cb: each with POOL 2, and again with POOL 1 where its sums saw a NaN.
   Zen 4, best of 2000 calls, against POOL 1 alone: 3x3 s2 over 64 channels on 111x111 (squeezenet1_1's first
   pool) 0.70x the time on one thread and two, 128 on 55x55 0.78x, 256 on 27x27 0.95x; 3x3 s1, 64 on 56x56 0.78x.
   (A pass over the rows for NaN before the taps, instead of the sums, measured slower: it read them from L3 alone.) */
static void pool_rows(const djob_t* J, int cb, int oh0, int oh1)
{
    const drow_fn fast = drow(2), keep = drow(1);
    for (int oh = oh0; oh < oh1; ++oh)
        if (fast(J, cb, oh)) keep(J, cb, oh);
}

/* the most floats of a narrow map's padded copy on a task's stack (32 KB: an 18 x 18 map with its padding, as a 5x5
   on a 14x14 map reads) */
#define DW_PAD_FLOATS 8192

static void dw_task(void* ctx, long long task)
{
    const djob_t* J = ctx;
    const int cb = J->band_major ? (int)(task % J->cb) : (int)(task / J->nbands);
    const int band = J->band_major ? (int)(task / J->cb) : (int)(task % J->nbands);
    const int oh0 = band * J->rows_per_task;
    const int oh1 = oh0 + J->rows_per_task < J->OH ? oh0 + J->rows_per_task : J->OH;
    if (!J->w) {
        pool_rows(J, cb, oh0, oh1);
        return;
    }
    const drow_fn f = drow(0);
    if (J->Hp) {
        /* the rows this band reads, padded, into a copy the rows then read from cache */
        float xp[DW_PAD_FLOATS] __attribute__((aligned(64)));
        const int r0 = oh0 * J->SH, r1 = (oh1 - 1) * J->SH + J->KH; /* padded rows [r0, r1) */
        const float* xb = J->x + (long long)cb * J->H * J->W * 16;
        for (int r = r0; r < r1; ++r) {
            const int ih = r - J->PT_;
            pad_row(xp + (long long)r * J->Wp * 16, ih < 0 || ih >= J->H ? NULL : xb + (long long)ih * J->W * 16,
                    J->W, J->PL, J->Wp);
        }
        djob_t L = *J;
        L.xblk = xp;
        L.H = J->Hp;
        L.W = J->Wp;
        L.PT_ = L.PL = 0;
        for (int oh = oh0; oh < oh1; ++oh) f(&L, cb, oh);
        return;
    }
    for (int oh = oh0; oh < oh1; ++oh) f(J, cb, oh);
}

static int dw_run(djob_t* J)
{
    if (J->cb < 1 || J->H < 1 || J->W < 1 || J->KH < 1 || J->KW < 1 || J->SH < 1 || J->SW < 1 || J->OH < 1 ||
        J->OW < 1 || J->PT_ < 0 || J->PL < 0 || J->PT_ >= J->KH || J->PL >= J->KW)
        return -1;
    const double work = 2.0 * J->cb * 16 * J->KH * J->KW * (double)J->OH * J->OW;
    const int chunks = inferd_pool_chunks((long long)J->cb * J->OH, work), t = inferd_pool_threads();
    /* Which thread reads which rows: a pointwise conv before or after a depthwise one on a map of more pixels
       than channels (an inverted residual's expansion and projection) splits its pixels over the threads, where
       the depthwise conv's tasks were blocks: each thread then read half of every block from the other core's
       cache. There the tasks go band by band, so (the pool dealing each thread a contiguous range) each thread
       takes the same rows of every block as its neighbours' pixels. Two threads, Zen 4, in-process A/B over 12
       rounds (a weak effect on this noisy VM): keras' MobileNetV2 at 64x64 0.97x the time (0.92-1.03), the zoo's
       MobileNetV2 0.98x (0.93-1.36), EfficientNet-B0 1.01x (0.71-1.09). */
    if (t > 1 && chunks > 1 && J->OH >= t && (long long)J->H * J->W >= 16LL * J->cb) {
        int bands = chunks < J->OH ? chunks : J->OH;
        bands = bands < t ? t : bands - bands % t;
        J->rows_per_task = (J->OH + bands - 1) / bands;
        J->nbands = (J->OH + J->rows_per_task - 1) / J->rows_per_task;
        J->band_major = 1;
        inferd_parallel(dw_task, J, (long long)J->cb * J->nbands, 0);
        return 0;
    }
    const int bands = chunks > J->cb ? (chunks + J->cb - 1) / J->cb : 1;
    J->rows_per_task = (J->OH + bands - 1) / bands;
    J->nbands = (J->OH + J->rows_per_task - 1) / J->rows_per_task;
    inferd_parallel(dw_task, J, (long long)J->cb * J->nbands, 0);
    return 0;
}

int inferd_nchwc_dwconv(const float* x, int blocks, int H, int W, const float* w, int KH, int KW, int SH, int SW,
                        int pad_top, int pad_left, int OH, int OW, const float* bias, const float* res, float* y,
                        int act, float p0, float p1)
{
    if (!w) return -1;
    djob_t J = {x, w, bias, res, y, blocks, H, W, KH, KW, SH, SW, pad_top, pad_left, OH, OW, act, p0, p1, 0, 0, 0, 0,
                NULL};
    /* The columns whose taps leave the row run one pixel at a time with their taps clipped (4 of 7 columns of a
       5x5 on a 7x7 map): on narrow maps (those columns 1/16 of the row or more, as for the dense convs) of kernels
       5 wide and more, each task copies its block's map with the padding as zeros and runs every row in full
       groups of pixels. AVX2, one thread: 1152 channels 5x5 on 7x7 0.83x the time, 672 on 14x14 0.89x; 3x3s
       keep the clipped columns (960 on 7x7: 1.06x padded), and so do strided 5x5s
       (672 on 14x14 at stride 2: 1.15x). The zeros add the same partial sums: the same bits. */
    if (KW >= 5 && SW == 1 && OW >= 1 && OH >= 1) {
        int Hp, Wp;
        const int edge = pad_geometry(H, W, KH, KW, SH, SW, pad_top, pad_left, OH, OW, &Hp, &Wp);
        if (edge > 0 && 16 * edge >= OW && (long long)Hp * Wp * 16 <= DW_PAD_FLOATS) {
            J.Hp = Hp;
            J.Wp = Wp;
        }
    }
    return dw_run(&J);
}

int inferd_nchwc_maxpool(const float* x, int blocks, int H, int W, int KH, int KW, int SH, int SW, int pad_top,
                         int pad_left, int OH, int OW, float* y)
{
    djob_t J = {x, NULL, NULL, NULL, y, blocks, H, W, KH, KW, SH, SW, pad_top, pad_left, OH, OW, 0, 0, 0, 0, 0, 0, 0,
                NULL};
    return dw_run(&J);
}

/* ------------------------------------------------------------------ layout conversions
   NCHW <-> blocked, 16 channels x 16 pixels at a time, as VW x VW squares of the ISA's vector width: VW vector
   loads, a transpose in registers (rounds of two-input shuffles swapping the off-diagonal d x d blocks, d = VW / 2
   down to 1: vpermt2ps on AVX-512), VW vector stores; the strided copy this replaces moved ~20 GB/s. */

#define NCHWC_T16(NAME, ATTR, VT, VI, VW)                                                                        \
    ATTR static void NAME(const float* src, long long sstride, float* dst, long long dstride)                   \
    {                                                                                                            \
        _Pragma("GCC unroll 1") for (int t = 0; t < (16 / VW) * (16 / VW); ++t)                                 \
        {                                                                                                        \
            /* the VW x VW sub-square (t / (16 / VW), t % (16 / VW)) of the 16 x 16 goes to its mirror */        \
            const int ti = t / (16 / VW) * VW, tj = t % (16 / VW) * VW;                                          \
            const float* s = src + ti * sstride + tj;                                                            \
            float* d = dst + tj * dstride + ti;                                                                  \
            VT r[VW];                                                                                            \
            _Pragma("GCC unroll 16") for (int i = 0; i < VW; ++i) memcpy(&r[i], s + i * sstride, sizeof(VT));    \
            _Pragma("GCC unroll 4") for (int dd = VW / 2; dd >= 1; dd >>= 1)                                     \
            {                                                                                                    \
                VI lo, hi;                                                                                       \
                _Pragma("GCC unroll 16") for (int j = 0; j < VW; ++j)                                            \
                {                                                                                                \
                    lo[j] = (j & dd) ? VW + j - dd : j;                                                          \
                    hi[j] = (j & dd) ? VW + j : j + dd;                                                          \
                }                                                                                                \
                _Pragma("GCC unroll 16") for (int i = 0; i < VW; ++i)                                            \
                {                                                                                                \
                    if (i & dd) continue;                                                                        \
                    const VT a = r[i], b = r[i + dd];                                                            \
                    r[i] = __builtin_shuffle(a, b, lo);                                                          \
                    r[i + dd] = __builtin_shuffle(a, b, hi);                                                     \
                }                                                                                                \
            }                                                                                                    \
            _Pragma("GCC unroll 16") for (int i = 0; i < VW; ++i) memcpy(d + i * dstride, &r[i], sizeof(VT));    \
        }                                                                                                        \
    }

typedef void (*t16_fn)(const float*, long long, float*, long long);
/* NEON / SSE: the 4 x 4 squares with literal lane patterns (zip/trn, unpck/shufps): NCHWC_T16's patterns, computed
   in a loop, reach GCC's vector lowering before they are constants, and on aarch64 it split every shuffle into
   lanes */
#if defined(__clang__)
#define NCHWC_SHUF4(a, b, i0, i1, i2, i3) __builtin_shufflevector(a, b, i0, i1, i2, i3)
#else
#define NCHWC_SHUF4(a, b, i0, i1, i2, i3) __builtin_shuffle(a, b, (v4i){i0, i1, i2, i3})
#endif
static void t16_gen(const float* src, long long sstride, float* dst, long long dstride)
{
    for (int t = 0; t < 16; ++t) {
        const int ti = t / 4 * 4, tj = t % 4 * 4;
        const float* s = src + ti * sstride + tj;
        float* d = dst + tj * dstride + ti;
        v4f r0, r1, r2, r3;
        memcpy(&r0, s, sizeof r0);
        memcpy(&r1, s + sstride, sizeof r1);
        memcpy(&r2, s + 2 * sstride, sizeof r2);
        memcpy(&r3, s + 3 * sstride, sizeof r3);
        const v4f t0 = NCHWC_SHUF4(r0, r1, 0, 4, 1, 5), t1 = NCHWC_SHUF4(r0, r1, 2, 6, 3, 7);
        const v4f t2 = NCHWC_SHUF4(r2, r3, 0, 4, 1, 5), t3 = NCHWC_SHUF4(r2, r3, 2, 6, 3, 7);
        const v4f o0 = NCHWC_SHUF4(t0, t2, 0, 1, 4, 5), o1 = NCHWC_SHUF4(t0, t2, 2, 3, 6, 7);
        const v4f o2 = NCHWC_SHUF4(t1, t3, 0, 1, 4, 5), o3 = NCHWC_SHUF4(t1, t3, 2, 3, 6, 7);
        memcpy(d, &o0, sizeof o0);
        memcpy(d + dstride, &o1, sizeof o1);
        memcpy(d + 2 * dstride, &o2, sizeof o2);
        memcpy(d + 3 * dstride, &o3, sizeof o3);
    }
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(INFERD_NO_CLONES)
NCHWC_T16(t16_avx2, AVX2, v8f, v8i, 8)
NCHWC_T16(t16_avx512, AVX512, v16f, v16i, 16)
#endif

static t16_fn t16(void)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(INFERD_NO_CLONES)
    const int l = isa_level();
    if (l == 2) return t16_avx512;
    if (l == 1) return t16_avx2;
#endif
    return t16_gen;
}

/* A pass over blocked planes (a reorder, a scale) as tasks of one block's pixels: whole blocks where there are
   enough of them for the pool, else each block cut into spans of whole 16-pixel groups (*span pixels, *nspan of
   them per block). */
static void pixel_spans(long long blocks, long long hw, long long* span, long long* nspan)
{
    *span = hw, *nspan = 1;
    const int chunks = inferd_pool_chunks(blocks * ((hw + 255) / 256), (double)blocks * 16 * hw);
    if (chunks > blocks) {
        const long long per = (chunks + blocks - 1) / blocks;
        *span = ((hw + per - 1) / per + 15) / 16 * 16;
        *nspan = (hw + *span - 1) / *span;
    }
}

typedef struct {
    const float* x;
    float* y;
    long long hw;
    int to;
    long long span; /* pixels per task */
    long long nspan;
    long long c, cb; /* channels of an image, its blocks (the last one padded where c % 16) */
} rjob_t;

static void reorder_task(void* ctx, long long task)
{
    const rjob_t* J = ctx;
    const t16_fn f = t16();
    const long long b = task / J->nspan, p0 = (task % J->nspan) * J->span;
    const long long p1 = p0 + J->span < J->hw ? p0 + J->span : J->hw;
    const long long img = b / J->cb, cbi = b % J->cb;
    const int cn = J->c - cbi * 16 < 16 ? (int)(J->c - cbi * 16) : 16; /* channels in this block */
    /* x[c][p] in NCHW is x[c * hw + p], blocked x[p * 16 + c] */
    const float* x = J->x + (J->to ? (img * J->c + cbi * 16) * J->hw : b * 16 * J->hw);
    float* y = J->y + (J->to ? b * 16 * J->hw : (img * J->c + cbi * 16) * J->hw);
    long long p = p0;
    if (cn == 16) {
        if (J->to) {
            for (; p + 16 <= p1; p += 16) f(x + p, J->hw, y + p * 16, 16);
            for (; p < p1; ++p)
                for (int c = 0; c < 16; ++c) y[p * 16 + c] = x[c * J->hw + p];
        } else {
            for (; p + 16 <= p1; p += 16) f(x + p * 16, 16, y + p, J->hw);
            for (; p < p1; ++p)
                for (int c = 0; c < 16; ++c) y[c * J->hw + p] = x[p * 16 + c];
        }
        return;
    }
    /* a padded block: its cn planes through a 16 x 16 square whose missing rows are zero (the padding lanes) */
    float sq[16 * 16];
    if (J->to) {
        memset(sq + cn * 16, 0, sizeof(float) * 16 * (16 - cn));
        for (; p + 16 <= p1; p += 16) {
            for (int c = 0; c < cn; ++c) memcpy(sq + c * 16, x + c * J->hw + p, sizeof(float) * 16);
            f(sq, 16, y + p * 16, 16);
        }
        for (; p < p1; ++p)
            for (int c = 0; c < 16; ++c) y[p * 16 + c] = c < cn ? x[c * J->hw + p] : 0.0f;
    } else {
        for (; p + 16 <= p1; p += 16) {
            f(x + p * 16, 16, sq, 16);
            for (int c = 0; c < cn; ++c) memcpy(y + c * J->hw + p, sq + c * 16, sizeof(float) * 16);
        }
        for (; p < p1; ++p)
            for (int c = 0; c < cn; ++c) y[c * J->hw + p] = x[p * 16 + c];
    }
}

int inferd_nchwc_reorder(const float* x, long long n, long long c, long long hw, float* y, int to_blocked)
{
    if (n < 1 || c < 1 || hw < 1) return -1;
    const long long cb = (c + 15) / 16, blocks = n * cb;
    rjob_t J = {x, y, hw, to_blocked, hw, 1, c, cb};
    pixel_spans(blocks, hw, &J.span, &J.nspan);
    inferd_parallel(reorder_task, &J, blocks * J.nspan, 0);
    return 0;
}

/* A squeeze-excitation on blocked tensors: the global average pool of each channel (to NCHW (N, C, 1, 1)), and
   the product of every pixel with its channel's scale (N or 1, C, 1, 1). Both are a pass over memory; blocked,
   they spare efficientnet's depthwise convs a conversion each way. */
typedef struct {
    const float* x;
    const float* s;
    float* y;
    long long hw, c, cb, s_stride;
    long long span, nspan; /* pixels per task, tasks per block (scale; pixel_spans) */
    float mult, p0, p1;    /* scale: a gain on every scale, then the activation (act 0: none) */
    int act;
} sjob_t;

static void gap_task(void* ctx, long long task)
{
    const sjob_t* J = ctx;
    const long long img = task / J->cb, b = task % J->cb;
    const float* x = J->x + task * 16 * J->hw;
    /* four partial sums per lane: a long map's float sum keeps its error near the pairwise sum's */
    float acc[4][16] = {{0}};
    long long p = 0;
    for (; p + 4 <= J->hw; p += 4)
        for (int k = 0; k < 4; ++k)
            for (int l = 0; l < 16; ++l) acc[k][l] += x[(p + k) * 16 + l];
    for (; p < J->hw; ++p)
        for (int l = 0; l < 16; ++l) acc[0][l] += x[p * 16 + l];
    const int cn = J->c - b * 16 < 16 ? (int)(J->c - b * 16) : 16;
    const float inv = 1.0f / (float)J->hw;
    for (int l = 0; l < cn; ++l)
        J->y[img * J->c + b * 16 + l] = ((acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l])) * inv;
}

int inferd_nchwc_gap(const float* x, long long n, long long c, long long hw, float* y)
{
    if (n < 1 || c < 1 || hw < 1) return -1;
    sjob_t J = {x, NULL, y, hw, c, (c + 15) / 16, 0, hw, 1, 1.0f, 0.0f, 0.0f, 0};
    inferd_parallel(gap_task, &J, n * J.cb, 0);
    return 0;
}

static void scale_task(void* ctx, long long task)
{
    const sjob_t* J = ctx;
    const long long blk = task / J->nspan, p0 = (task % J->nspan) * J->span;
    const long long p1 = p0 + J->span < J->hw ? p0 + J->span : J->hw;
    const long long img = blk / J->cb, b = blk % J->cb;
    const int cn = J->c - b * 16 < 16 ? (int)(J->c - b * 16) : 16;
    float sv[16];
    for (int l = 0; l < 16; ++l) sv[l] = l < cn ? J->s[img * J->s_stride + b * 16 + l] * J->mult : 0.0f;
    const float* x = J->x + blk * 16 * J->hw;
    float* y = J->y + blk * 16 * J->hw;
    for (long long p = p0; p < p1; ++p)
        for (int l = 0; l < 16; ++l) y[p * 16 + l] = x[p * 16 + l] * sv[l];
    if (J->act) /* the span just written, still in L1: no second pass over memory */
        act_vec(y + p0 * 16, (ptrdiff_t)(p1 - p0) * 16, J->act, J->p0, J->p1);
}

int inferd_nchwc_scale(const float* x, long long n, long long c, long long hw, const float* s, long long s_stride,
                       float* y)
{
    return inferd_nchwc_scale_act(x, n, c, hw, s, s_stride, 1.0f, 0, 0.0f, 0.0f, y);
}

int inferd_nchwc_scale_act(const float* x, long long n, long long c, long long hw, const float* s, long long s_stride,
                           float mult, int act, float p0, float p1, float* y)
{
    if (n < 1 || c < 1 || hw < 1 || s_stride < 0) return -1;
    const long long cb = (c + 15) / 16, blocks = n * cb;
    sjob_t J = {x, s, y, hw, c, cb, s_stride, hw, 1, mult, p0, p1, act};
    pixel_spans(blocks, hw, &J.span, &J.nspan);
    inferd_parallel(scale_task, &J, blocks * J.nspan, 0);
    return 0;
}
