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
 *   x86-64 AMX (Linux): convolutions packed in mode 2 (their channel groups split into tile blocks of 6-16
 *     groups a tap) and GEMMs whose K splits likewise run on the tile unit (tdpbsud / tdpbusd: 16 x 16 int32
 *     sums of dot products of up to 64 bytes per instruction, ~8x the products per cycle of vpdpbusd);
 *     everything else keeps the VNNI kernels.
 * Rows (output pixels, or matrix rows) are processed in blocks gathered into a per-task buffer (im2col for
 * convolutions), 6 rows per micro-kernel call; blocks are the pool's tasks.
 */
#define _GNU_SOURCE
#include <pthread.h>
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
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* The x86 features the kernels below dispatch on, probed once (0 elsewhere). */
enum { Q8_F_AVX2 = 1, Q8_F_FMA = 2, Q8_F_AVX512BW = 4, Q8_F_VBMI = 8 }; /* AVX512BW: with F and VL */
static int q8_cpu(void)
{
    static int f = -1;
    int v = __atomic_load_n(&f, __ATOMIC_RELAXED);
    if (v < 0) {
        v = 0;
#if defined(__x86_64__) && defined(__GNUC__)
        __builtin_cpu_init();
        const int bw = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl");
        v = (__builtin_cpu_supports("avx2") ? Q8_F_AVX2 : 0) | (__builtin_cpu_supports("fma") ? Q8_F_FMA : 0) |
            (bw ? Q8_F_AVX512BW : 0) | (bw && __builtin_cpu_supports("avx512vbmi") ? Q8_F_VBMI : 0);
#endif
        __atomic_store_n(&f, v, __ATOMIC_RELAXED);
    }
    return v;
}

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

/* Per-thread scratch, two slots: 0 for an entry point's own buffers (the padded input, the staged output), 1
   for a task's (the gathered block; the calling thread runs tasks too while slot 0 is in use). Grown on demand
   and kept, so a layer's buffers are not mapped and faulted in again at every run; a key's destructor frees them
   when the thread exits. */
static __thread uint8_t* q8_tl[2] = {NULL, NULL};
static __thread size_t q8_tl_cap[2] = {0, 0};
static pthread_key_t q8_key[2];
static pthread_once_t q8_once = PTHREAD_ONCE_INIT;
static void q8_tl_free(void* p) { free(p); }
static void q8_tl_init(void)
{
    pthread_key_create(&q8_key[0], q8_tl_free);
    pthread_key_create(&q8_key[1], q8_tl_free);
}

static uint8_t* q8_scratch(int slot, size_t n)
{
    if (n > q8_tl_cap[slot]) {
        void* p = NULL;
        if (posix_memalign(&p, 64, n + 64) != 0) return NULL;
        free(q8_tl[slot]);
        q8_tl[slot] = (uint8_t*)p;
        q8_tl_cap[slot] = n;
        pthread_once(&q8_once, q8_tl_init);
        pthread_setspecific(q8_key[slot], p);
    }
    return q8_tl[slot];
}

/* ---------------------------------------------------------------- micro-kernels: out[r][j] (Q8_MR x 16 int32)
   = sum over kp/4 groups of x[r][4g..4g+3] . panel[g][j][0..3]; x rows Q8_MR, row pitch kp bytes */
typedef void (*q8_uk)(const uint8_t* x, int kp, const int8_t* panel, int32_t* out);

/* A group's 4 bytes as ints, read as one 32-bit word: GCC 12 at -O3 with AVX-512 (the x86-64-v4 clone) vectorised
   the byte-wise reads of uk_portable's 6 rows into loads that ran past the 6th (a SIGSEGV where a row block ended at
   a page, M = 49 x K = 2048); the word's reads stay in bounds. */
INFERD_INLINE void q8_group4u(const uint8_t* p, int32_t* b0, int32_t* b1, int32_t* b2, int32_t* b3)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    *b0 = (int32_t)(v & 255u);
    *b1 = (int32_t)((v >> 8) & 255u);
    *b2 = (int32_t)((v >> 16) & 255u);
    *b3 = (int32_t)(v >> 24);
}

INFERD_INLINE void q8_group4s(const int8_t* p, int32_t* b0, int32_t* b1, int32_t* b2, int32_t* b3)
{
    q8_group4u((const uint8_t*)p, b0, b1, b2, b3);
    *b0 = (int8_t)*b0;
    *b1 = (int8_t)*b1;
    *b2 = (int8_t)*b2;
    *b3 = (int8_t)*b3;
}

INFERD_CLONES static void uk_portable(const uint8_t* x, int kp, const int8_t* panel, int32_t* out)
{
    int32_t acc[Q8_MR][Q8_NP];
    memset(acc, 0, sizeof acc);
    for (int g = 0; g < kp / 4; ++g) {
        const int8_t* p = panel + (size_t)g * Q8_NP * 4;
        for (int r = 0; r < Q8_MR; ++r) {
            int32_t x0, x1, x2, x3;
            q8_group4u(x + (size_t)r * kp + 4 * g, &x0, &x1, &x2, &x3);
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

#if defined(__x86_64__) && defined(__GNUC__)
/* x86 without AVX-512 VNNI (AVX2: Haswell to Alder Lake, Zen 1-3): exact int8 products on vpmaddwd. The 4 bytes
   of a group split into int16 pairs of the same dword, (b0, b2) and (b1, b3) (x & 0xff and x >> 8 per word,
   zero-extended; w << 8 >> 8 and w >> 8 per word, sign-extended): two vpmaddwd give x0 w0 + x2 w2 and x1 w1 +
   x3 w3 in the lane of their output, no pairwise adds after. (vpmaddubsw would take a group in one instruction,
   but its int16 pair sums saturate for uint8 x int8: onnxruntime's AVX2 U8S8 has that error, this has none.)
   One thread of the Zen 4 VM: GEMMs 39-65 and convs 40-63 GMAC/s, where the portable C ran 6-13. */
#define Q8_HAVE_AVX2I 1
#define Q8_AVX2I_TARGET __attribute__((target("avx2")))
Q8_AVX2I_TARGET static inline __m256i q8_lo_pairs(__m256i v) { return _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8); }
Q8_AVX2I_TARGET static inline __m256i q8_hi_pairs(__m256i v) { return _mm256_srai_epi16(v, 8); }

/* uk on AVX2: the rows in two passes of 3 (6 rows x 16 channels of sums would take every register) */
Q8_AVX2I_TARGET static void uk_avx2(const uint8_t* x, int kp, const int8_t* panel, int32_t* out)
{
    const __m256i lo8 = _mm256_set1_epi16(0x00ff);
    for (int h = 0; h < Q8_MR; h += 3) {
        __m256i a[3][2];
        for (int r = 0; r < 3; ++r) a[r][0] = a[r][1] = _mm256_setzero_si256();
        for (int g = 0; g < kp / 4; ++g) {
            const __m256i v0 = _mm256_loadu_si256((const __m256i*)(panel + (size_t)g * 64));
            const __m256i v1 = _mm256_loadu_si256((const __m256i*)(panel + (size_t)g * 64 + 32));
            const __m256i w0l = q8_lo_pairs(v0), w0h = q8_hi_pairs(v0), w1l = q8_lo_pairs(v1), w1h = q8_hi_pairs(v1);
            for (int r = 0; r < 3; ++r) {
                int32_t xv;
                memcpy(&xv, x + (size_t)(h + r) * kp + 4 * (size_t)g, 4);
                const __m256i xb = _mm256_set1_epi32(xv);
                const __m256i xl = _mm256_and_si256(xb, lo8), xh = _mm256_srli_epi16(xb, 8);
                a[r][0] = _mm256_add_epi32(a[r][0], _mm256_madd_epi16(xl, w0l));
                a[r][0] = _mm256_add_epi32(a[r][0], _mm256_madd_epi16(xh, w0h));
                a[r][1] = _mm256_add_epi32(a[r][1], _mm256_madd_epi16(xl, w1l));
                a[r][1] = _mm256_add_epi32(a[r][1], _mm256_madd_epi16(xh, w1h));
            }
        }
        for (int r = 0; r < 3; ++r) {
            _mm256_storeu_si256((__m256i*)(out + (h + r) * Q8_NP), a[r][0]);
            _mm256_storeu_si256((__m256i*)(out + (h + r) * Q8_NP + 8), a[r][1]);
        }
    }
}
#endif

#if defined(__aarch64__) && defined(__GNUC__)
#define Q8_HAVE_SDOT 1
__attribute__((target("arch=armv8.2-a+dotprod"))) static void uk_sdot(const uint8_t* xu, int kp, const int8_t* panel, int32_t* out)
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
    int amx;     /* VNNI plus the AMX tile unit for convolutions (mode 2) and GEMMs */
} q8_isa_t;

static const q8_isa_t Q8_PORTABLE = {0, 0, uk_portable, 0};
#if defined(Q8_HAVE_AVX2I)
/* level 0 too: the portable paths (conv mode 0, no VNNI-only kernels) with AVX2 micro-kernels */
static const q8_isa_t Q8_AVX2 = {0, 0, uk_avx2, 0};
#endif
#if defined(Q8_HAVE_VNNI)
static const q8_isa_t Q8_VNNI = {1, 0, uk_vnni, 0};
#endif
#if defined(Q8_HAVE_SDOT)
static const q8_isa_t Q8_SDOT = {1, 1, uk_sdot, 0};
#endif
#if defined(Q8_HAVE_VNNI) && defined(__linux__)
#define Q8_HAVE_AMX 1
static const q8_isa_t Q8_AMX = {1, 0, uk_vnni, 1};

/* AMX-TILE and AMX-INT8 (CPUID 7.0 EDX bits 24, 25), and the kernel's leave to use them: Linux hands out the 8 KB
   of tile state per process on request (5.16+), and a tile instruction without it faults. The request fails
   where the kernel is older or a thread's alternate signal stack is too small for the larger signal frame;
   the VNNI kernels then run. */
static int q8_amx_usable(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 25) & 1)) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}
#endif

/* set by inferd_q8_cap_avx512: 1 makes inferd_q8_set_isa pick the AVX2 kernels where the best are AVX-512's */
static int Q8_CAP_AVX512 = -1;

/* the best without VNNI, sdot or tiles */
static const q8_isa_t* q8_portable(void)
{
#if defined(Q8_HAVE_AVX2I)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) return &Q8_AVX2;
#endif
    return &Q8_PORTABLE;
}

static const q8_isa_t* q8_best(void)
{
#if defined(Q8_HAVE_VNNI)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512vnni")) {
#if defined(Q8_HAVE_AMX)
        static int amx = -1; /* asked once: the answer is the process's */
        int v = __atomic_load_n(&amx, __ATOMIC_ACQUIRE);
        if (v < 0) {
            v = q8_amx_usable();
            __atomic_store_n(&amx, v, __ATOMIC_RELEASE);
        }
        if (v) return &Q8_AMX;
#endif
        return &Q8_VNNI;
    }
#endif
#if defined(Q8_HAVE_SDOT) && defined(__linux__)
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) return &Q8_SDOT;
#endif
    return q8_portable();
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

/* what inferd_q8_isa reports: the level, with the tile unit; 3 for the AVX2 kernels (level 0's paths, the same
   packing as the portable C's, but other costs) */
static int q8_isa_code(const q8_isa_t* p)
{
#if defined(Q8_HAVE_AVX2I)
    if (p == &Q8_AVX2) return 3;
#endif
    return p->level + p->amx;
}

/* 0 portable; 1 VNNI or sdot without the tile unit; 2 or -1 the best there is. Returns what is set, as
   inferd_q8_isa reports it. */
int inferd_q8_set_isa(int level)
{
    const q8_isa_t* p = q8_best();
    if (level == 0) p = &Q8_PORTABLE;
    if (level != 0 && p->level == 1 && !p->xsigned && __atomic_load_n(&Q8_CAP_AVX512, __ATOMIC_RELAXED) == 1)
        p = q8_portable(); /* (x86: the VNNI and tile kernels are AVX-512's) */
#if defined(Q8_HAVE_AMX)
    if (level == 1 && p == &Q8_AMX) p = &Q8_VNNI;
#endif
    __atomic_store_n(&Q8_ISA, p, __ATOMIC_RELEASE);
    return q8_isa_code(p);
}

int inferd_q8_isa(void) { return q8_isa_code(q8_isa()); }

/* Whether a 1x1 conv's tasks may stage their own blocks of pixels (q8_stage_block): tests and A/B runs turn it
   off to compare with the whole input staged first */
static int Q8_SELF_STAGE = 1;
/* what blocks of pixels alone save over chunks of channels when tasks stage their own blocks, in the partition's
   span units (micro-kernel calls per thread): about one call per pixel tile a thread computes (a second copy of
   its block, and where the whole input was staged first, the words it read from the other core's cache: fitted
   on 1x1 convs of 24 to 1152 channels, 7x7 to 56x56 maps, Zen 4 EPYC, 2 threads) and three for a join */
#define Q8_SELF_PER_TILE 1.0
#define Q8_SELF_JOIN 3.0

int inferd_q8_set_self_stage(int on)
{
    return __atomic_exchange_n(&Q8_SELF_STAGE, on ? 1 : 0, __ATOMIC_RELAXED);
}

/* Copy of a short row (the padded planes' rows: 7 to ~100 bytes, thousands per layer) without a libc call: two
   overlapping moves of the largest power of two <= n (up to 32 bytes), libc past 64 bytes. A memcpy call per
   row cost more than the copy at these sizes. */
INFERD_INLINE void q8_cpy(uint8_t* d, const uint8_t* s, int n)
{
    if (n > 64) {
        memcpy(d, s, (size_t)n);
    } else if (n >= 32) {
        __builtin_memcpy(d, s, 32);
        __builtin_memcpy(d + n - 32, s + n - 32, 32);
    } else if (n >= 16) {
        __builtin_memcpy(d, s, 16);
        __builtin_memcpy(d + n - 16, s + n - 16, 16);
    } else if (n >= 8) {
        __builtin_memcpy(d, s, 8);
        __builtin_memcpy(d + n - 8, s + n - 8, 8);
    } else if (n >= 4) {
        __builtin_memcpy(d, s, 4);
        __builtin_memcpy(d + n - 4, s + n - 4, 4);
    } else {
        for (int u = 0; u < n; ++u) d[u] = s[u];
    }
}

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

INFERD_CLONES static void q8_block(const q8_isa_t* isa, const uint8_t* xb, int rows, long long m0, const q8_out_t* o,
                                   int n_lo, int n_hi)
{
    int32_t tile[Q8_MR * Q8_NP];
    const float flo = (float)(o->lo - o->zy), fhi = (float)(o->hi - o->zy);
    for (int n0 = n_lo; n0 < n_hi; n0 += Q8_NP) {
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

/* The groups of 4 channels an AMX tile block takes (its K / 4): the largest divisor of the groups per tap up to 16,
   so that blocks never cross a tap (a tile's K may be short of its 64 bytes; q8_c4m pads the groups where the
   divisors are short) */
#define Q8_AMX_KB_MIN 6
static inline int q8_amx_kb(int C4)
{
    int kb = C4 < 16 ? C4 : 16;
    while (kb > 1 && C4 % kb) --kb;
    return kb;
}

/* ---------------------------------------------------------------- GEMM: rows of x (M x K, row pitch ldx) */

typedef struct {
    const q8_isa_t* isa;
    const uint8_t* x;
    long long ldx;
    int M, K;
    uint8_t flip;
    q8_out_t o;
    int nsplit; /* the panels split this many ways per block of rows (a Linear on one row: one block) */
    int failed;
    int amx, kb; /* on the tile unit, kb groups of 4 k a tile block */
} q8_gemm_ctx;

#if defined(Q8_HAVE_AMX)
static void q8_amx_gemm_block(const uint8_t* xb, int rows, long long m0, const q8_out_t* o, int n_lo, int n_hi, int kb);
#endif

static void q8_gemm_task(void* vctx, long long t)
{
    q8_gemm_ctx* c = (q8_gemm_ctx*)vctx;
    const int panels = (c->o.N + Q8_NP - 1) / Q8_NP, ni = (int)(t % c->nsplit);
    const int n_lo = (int)((long long)panels * ni / c->nsplit) * Q8_NP;
    int n_hi = (int)((long long)panels * (ni + 1) / c->nsplit) * Q8_NP;
    n_hi = n_hi > c->o.N ? c->o.N : n_hi;
    t /= c->nsplit;
    const long long m0 = t * Q8_MB;
    const int rows = (int)(c->M - m0 < Q8_MB ? c->M - m0 : Q8_MB);
    const int kp = c->o.kp;
    /* whole micro-kernel calls of rows (zeros past the last), or whole pairs of 16-row tiles */
    const int unit = c->amx ? 32 : Q8_MR, rows_pad = (rows + unit - 1) / unit * unit;
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
#if defined(Q8_HAVE_AMX)
    if (c->amx)
        q8_amx_gemm_block(xb, rows, m0, &c->o, n_lo, n_hi, c->kb);
    else
#endif
        q8_block(c->isa, xb, rows, m0, &c->o, n_lo, n_hi);
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
                     {wp, be, mult, N, q8_kp(K), zy, lo, hi, y_signed, y, ysm, ysn}, 1, 0, 0, 0};
    c.kb = q8_amx_kb(q8_kp(K) / 4);
    c.amx = isa->amx && c.kb >= Q8_AMX_KB_MIN;
    const long long mblocks = (M + Q8_MB - 1) / Q8_MB, panels = (N + Q8_NP - 1) / Q8_NP;
    const int threads = inferd_pool_threads();
    if (mblocks < 2LL * threads) {
        const long long want = (2LL * threads + mblocks - 1) / mblocks;
        c.nsplit = (int)(want < panels ? want : panels);
    }
    const long long tasks = mblocks * c.nsplit;
    inferd_parallel(q8_gemm_task, &c, tasks, (long long)M * N * K < 200000 ? 1 : max_threads);
    free(be);
    return c.failed ? -1 : 0;
}

/* ---------------------------------------------------------------- conv: one image (C, H, W), output (N, OH, OW)
   Pixels in the vector lanes. The input is staged once per call as NC4 phase planes: channels in groups of 4,
   each group's padded image split into sh x sw phase planes (padded row r, column c at phase (r % sh, c % sw),
   position (r / sh, c / sw)) of Hq x Wv words, one word holding the group's 4 bytes of one position. The output
   is computed at pitch Wv too (OH x Wv "virtual" pixels, the last Wv - OW of each row garbage), so for reduction
   group g = (channel group, tap) the 4 bytes of virtual pixel p sit at stage + goff[g] + 4p, whatever the stride:
   a micro-kernel's 32 pixels are 128 contiguous bytes, read in place. (An im2col gather before it interleaved
   every input byte kh*kw times per call, and again per channel chunk: ~20% of a 3x3 layer.) Weights are packed
   to match: row n, group g = (c4, tap) holds w[n][4 c4 + i][tap] for i < 4, zeros past C; Q8_CR channels x Q8_PX
   pixels per micro-kernel call, each channel's pixels stored contiguously into the NCHW output. */
#define Q8_CR 6
#define Q8_PX 32
#define Q8_PB_MAX 256 /* pixels per task block: a multiple of Q8_PX */

static inline int q8_c4(int C) { return (C + 3) / 4; }

/* Channel groups per tap in a packing: mode 2 pads them (by at most 15%, zero weights) to a count with blocks of
   8-16 groups where the count's own blocks are shorter: 116 channels (29 groups, prime: blocks of 1) to 30, 232
   (58: blocks of 2) to 60. The padding groups' staged planes are allocated and not written: whatever they hold
   is multiplied by 0. */
static inline int q8_c4m(int C, int mode)
{
    const int c4 = q8_c4(C);
    if (mode != 2 || q8_amx_kb(c4) >= 8) return c4;
    for (int m = c4 + 1; 20 * m <= 23 * c4; ++m)
        if (q8_amx_kb(m) >= 8) return m;
    return c4;
}

/* Mode 1 (channels in the vector lanes, for small maps and long reductions): Q8_NR output channels per weight
   panel, group g of a panel = 128 bytes (4 bytes per channel), Q8_MP output pixels per micro-kernel call, each
   pixel's 4 bytes of group g broadcast from its own address in the staged planes (so only real output pixels are
   computed: no virtual columns, no 32-pixel tiles over 49- or 196-pixel maps); each weight panel passes over a
   whole block of pixels, where mode 0 streams all weights once per 32 pixels. Its store transposes the 7 x 32
   result into the NCHW output. */
#define Q8_NR 32
#define Q8_MP 7

/* Mode 2 (AMX): mode 0's rows of channels with the reduction ordered (tap, channel group), so that for one tap
   up to 16 consecutive groups (64 channels) sit at one stride in the staged planes and in a weight row: one tile
   load each (q8_amx_kb groups a block). Rows are padded to whole tiles of 16 channels (the kernel takes
   32 a call, the last call 16 where that is all there is), and to Q8_CR for mode 0's kernels, which run this
   packing where the CPU has no AMX (their offsets per group follow the order). */
#define Q8_AR 32

static long long q8_conv_rows(int N, int mode)
{
    if (mode == 2) {
        const long long a = (long long)(N + 15) / 16 * 16, b = (long long)(N + Q8_CR - 1) / Q8_CR * Q8_CR;
        return a > b ? a : b;
    }
    const int r = mode == 1 ? Q8_NR : Q8_CR;
    return (long long)(N + r - 1) / r * r;
}

long long inferd_q8_conv_packed_size(int N, int C, int taps, int mode)
{
    return q8_conv_rows(N, mode) * 4LL * q8_c4m(C, mode) * taps;
}

void inferd_q8_conv_pack(const int8_t* w, int N, int C, int taps, int mode, int8_t* wp, int32_t* wsum)
{
    const int c4 = q8_c4m(C, mode);
    const size_t kp = 4 * (size_t)c4 * taps;
    memset(wp, 0, (size_t)q8_conv_rows(N, mode) * kp);
    for (int n = 0; n < N; ++n) {
        int32_t s = 0;
        for (int c = 0; c < C; ++c)
            for (int t = 0; t < taps; ++t) {
                const int8_t v = w[((size_t)n * C + c) * taps + t];
                const size_t g = mode == 2 ? (size_t)t * c4 + c / 4 : (size_t)(c / 4) * taps + t;
                if (mode == 1)
                    wp[(size_t)(n / Q8_NR) * Q8_NR * kp + g * 4 * Q8_NR + (size_t)(n % Q8_NR) * 4 + c % 4] = v;
                else
                    wp[(size_t)n * kp + g * 4 + c % 4] = v;
                s += v;
            }
        wsum[n] = s;
    }
}

/* Which layout a conv's weights are packed in (and so which kernel runs it): a cycle estimate of each on VNNI
   (mode 1 has no other fast kernel). Mode 0 computes ceil(OH Wv / 32) tiles of 32 pixels x 6 channels (12 dot
   products a group plus ~57 cycles of requantisation a tile), mode 1 ceil(OH OW / 7) tiles of 7 pixels x 32
   channels (14 a group, ~3% faster each, plus ~172 cycles of requantisation and transposition): constants fitted
   to 26 layers of the zoo's models on an AVX-512 VNNI EPYC (2 threads), which it picks right but for two (at most
   16% off). Mode 0 wins on 1x1 convs with short K (its store is cheap), mode 1 on small maps and long K. */
int inferd_q8_conv_mode(int C, int N, int kh, int kw, int sw, int dw, int OH, int OW)
{
    if (q8_isa()->level != 1 || q8_isa()->xsigned) return 0;
    /* the tile unit where its blocks hold at least Q8_AMX_KB_MIN groups and the rows it pads (to 16) add at most
       half: 256 -> 256 channels 3x3 at 14x14 ran in 127 us against 279 (VNNI, mode 1) on 2 threads of an AMX Xeon
       VM, 24 -> 144 1x1 at 56x56 (blocks of 6 groups) in 72 against 77 (mode 0); 16 channels (4 groups) lost 5% */
    if (q8_isa()->amx && q8_amx_kb(q8_c4m(C, 2)) >= Q8_AMX_KB_MIN && 2 * q8_conv_rows(N, 2) <= 3 * q8_conv_rows(N, 0))
        return 2;
    const long long kq = (long long)q8_c4(C) * kh * kw;
    const int Wv = ((OW - 1) * sw + (kw - 1) * dw + 1 + sw - 1) / sw;
    const double m0 = (double)(((long long)OH * Wv + 31) / 32) * ((N + Q8_CR - 1) / Q8_CR) * (12.0 * kq + 57.0);
    const double m1 =
        (double)(((long long)OH * OW + Q8_MP - 1) / Q8_MP) * ((N + Q8_NR - 1) / Q8_NR) * (13.6 * kq + 172.0);
    return m1 < m0 ? 1 : 0;
}

/* out[r][p] (Q8_CR x Q8_PX) = sum_g x[goff[g] + 4p .. +3] . w[r][4g..4g+3] for the tile's cnt pixels that count
   (a kernel may skip whole vectors past them: their sums are left undefined) */
typedef void (*q8_ukc)(const uint8_t* xt, const long long* goff, int kq, const int8_t* w, int kp, int32_t* out,
                       int cnt);

INFERD_CLONES static void ukc_portable(const uint8_t* xt, const long long* goff, int kq, const int8_t* w, int kp,
                                       int32_t* out, int cnt)
{
    (void)cnt; /* every pixel: a loop of constant length vectorises */
    int32_t acc[Q8_CR][Q8_PX];
    memset(acc, 0, sizeof acc);
    for (int g = 0; g < kq; ++g) {
        const uint8_t* xp = xt + goff[g];
        for (int r = 0; r < Q8_CR; ++r) {
            int32_t w0, w1, w2, w3;
            q8_group4s(w + (size_t)r * kp + 4 * g, &w0, &w1, &w2, &w3);
            for (int p = 0; p < Q8_PX; ++p)
                acc[r][p] += xp[4 * p] * w0 + xp[4 * p + 1] * w1 + xp[4 * p + 2] * w2 + xp[4 * p + 3] * w3;
        }
    }
    memcpy(out, acc, sizeof acc);
}

#if defined(Q8_HAVE_AVX2I)
/* ukc on AVX2 (uk_avx2's split of a group into int16 pairs): 8 pixels a pass, the 6 channels' sums in 6 registers;
   each row's weights split once per call into its pairs' dwords (128 groups at a time, on the stack), which every
   pass broadcasts */
Q8_AVX2I_TARGET static void ukc_avx2(const uint8_t* xt, const long long* goff, int kq, const int8_t* w, int kp,
                                     int32_t* out, int cnt)
{
    enum { GC = 128 };
    /* passes of 8 pixels up to cnt: a 7x7 map's 49 pixels are tiles of 32 and 17, the second 3 passes, not 4 */
    const int passes = (cnt + 7) / 8;
    int32_t wl[Q8_CR][GC], wh[Q8_CR][GC];
    const __m256i lo8 = _mm256_set1_epi16(0x00ff);
    for (int g0 = 0; g0 < kq; g0 += GC) {
        const int gn = kq - g0 < GC ? kq - g0 : GC;
        for (int r = 0; r < Q8_CR; ++r) {
            const int8_t* wr = w + (size_t)r * kp + 4 * (size_t)g0;
            int g = 0;
            for (; g + 8 <= gn; g += 8) {
                const __m256i v = _mm256_loadu_si256((const __m256i*)(wr + 4 * g));
                _mm256_storeu_si256((__m256i*)&wl[r][g], q8_lo_pairs(v));
                _mm256_storeu_si256((__m256i*)&wh[r][g], q8_hi_pairs(v));
            }
            for (; g < gn; ++g) {
                const int8_t* q = wr + 4 * g;
                wl[r][g] = (int32_t)((uint32_t)(uint16_t)q[0] | (uint32_t)(uint16_t)q[2] << 16);
                wh[r][g] = (int32_t)((uint32_t)(uint16_t)q[1] | (uint32_t)(uint16_t)q[3] << 16);
            }
        }
        for (int q = 0; q < passes; ++q) {
            __m256i a[Q8_CR];
            for (int r = 0; r < Q8_CR; ++r)
                a[r] = g0 ? _mm256_loadu_si256((const __m256i*)(out + r * Q8_PX + 8 * q)) : _mm256_setzero_si256();
            for (int g = 0; g < gn; ++g) {
                const __m256i x = _mm256_loadu_si256((const __m256i*)(xt + goff[g0 + g] + 32 * q));
                const __m256i xl = _mm256_and_si256(x, lo8), xh = _mm256_srli_epi16(x, 8);
                for (int r = 0; r < Q8_CR; ++r) {
                    a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(xl, _mm256_set1_epi32(wl[r][g])));
                    a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(xh, _mm256_set1_epi32(wh[r][g])));
                }
            }
            for (int r = 0; r < Q8_CR; ++r) _mm256_storeu_si256((__m256i*)(out + r * Q8_PX + 8 * q), a[r]);
        }
    }
}
#endif

#if defined(Q8_HAVE_VNNI)
#define Q8_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
/* 16 sums requantised to bytes: biased, scaled, clamped in float, rounded to nearest even, offset by zy */
Q8_VNNI_TARGET static inline __m128i q8_req16(__m512i a, __m512i b, __m512 m, __m512 lo, __m512 hi, __m512i zv)
{
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a, b)), m);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    return _mm512_cvtepi32_epi8(
        _mm512_add_epi32(_mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zv));
}

/* The masks of a 32-pixel tile's first and second 16 pixels when it holds cnt */
static inline void q8_px_masks(int cnt, __mmask16* m0, __mmask16* m1)
{
    *m0 = cnt >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cnt) - 1);
    *m1 = cnt >= 32 ? (__mmask16)0xffff : (cnt <= 16 ? (__mmask16)0 : (__mmask16)((1u << (cnt - 16)) - 1));
}

/* One channel's 32 sums (a0, a1) requantised (q8_req16) and stored as the bytes the masks keep, at y */
Q8_VNNI_TARGET static inline void q8_store_px32(__m512i a0, __m512i a1, int32_t bias, float mult, __m512 lo, __m512 hi,
                                                __m512i zv, __mmask16 m0, __mmask16 m1, uint8_t* y)
{
    const __m512i b = _mm512_set1_epi32(bias);
    const __m512 m = _mm512_set1_ps(mult);
    _mm_mask_storeu_epi8((void*)y, m0, q8_req16(a0, b, m, lo, hi, zv));
    _mm_mask_storeu_epi8((void*)(y + 16), m1, q8_req16(a1, b, m, lo, hi, zv));
}

/* The VNNI conv micro-kernel (Q8_CR channels x Q8_PX pixels, vpdpbusd of unsigned x by signed w), with the
   requantisation in its registers: each 16 sums of a channel are biased, scaled, clamped,
   rounded to nearest even (embedded rounding, whatever MXCSR says), offset by zy and stored as 16 bytes. The
   separate pass over an int32 tile (q8_store_rows) cost more than the dot products where K is small. Same
   arithmetic as q8_store_rows: float product, clamp in float, then round. */
Q8_VNNI_TARGET static void ukc_vnni_q(
    const uint8_t* xt, const long long* goff, int kq, const int8_t* w, int kp, int nn, int cnt, const int32_t* bias,
    const float* mult, float flo, float fhi, int zy, uint8_t* y, long long pitch)
{
    /* twelve named accumulators: GCC copies vectors around (vmovdqa per vpdpbusd) when they are an array */
    __m512i a00 = _mm512_setzero_si512(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
            a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
    const int8_t *w0 = w, *w1 = w + kp, *w2 = w + 2 * (size_t)kp, *w3 = w + 3 * (size_t)kp, *w4 = w + 4 * (size_t)kp,
                 *w5 = w + 5 * (size_t)kp;
    for (int g = 0; g < kq; ++g) {
        const uint8_t* xp = xt + goff[g];
        const __m512i x0 = _mm512_loadu_si512((const void*)xp), x1 = _mm512_loadu_si512((const void*)(xp + 64));
        int32_t v;
        __m512i wb;
#define Q8_STEP(A0, A1, WR)                                                                                        \
    memcpy(&v, WR + 4 * (size_t)g, 4);                                                                             \
    wb = _mm512_set1_epi32(v);                                                                                     \
    A0 = _mm512_dpbusd_epi32(A0, x0, wb);                                                                          \
    A1 = _mm512_dpbusd_epi32(A1, x1, wb);
        Q8_STEP(a00, a01, w0)
        Q8_STEP(a10, a11, w1)
        Q8_STEP(a20, a21, w2)
        Q8_STEP(a30, a31, w3)
        Q8_STEP(a40, a41, w4)
        Q8_STEP(a50, a51, w5)
#undef Q8_STEP
    }
    const __m512i a[Q8_CR][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}, {a40, a41}, {a50, a51}};
    const __m512 lo = _mm512_set1_ps(flo), hi = _mm512_set1_ps(fhi);
    const __m512i zv = _mm512_set1_epi32(zy);
    __mmask16 m0, m1;
    q8_px_masks(cnt, &m0, &m1);
    for (int r = 0; r < Q8_CR && r < nn; ++r)
        q8_store_px32(a[r][0], a[r][1], bias[r], mult[r], lo, hi, zv, m0, m1, y + r * pitch);
}
#endif

#if defined(Q8_HAVE_SDOT)
__attribute__((target("arch=armv8.2-a+dotprod"))) static void ukc_sdot(const uint8_t* xt, const long long* goff,
                                                                       int kq, const int8_t* w, int kp, int32_t* out,
                                                                       int cnt)
{
    for (int half = 0; half < (cnt > 16 ? 2 : 1); ++half) {
        int32x4_t a[Q8_CR][4];
        for (int r = 0; r < Q8_CR; ++r)
            for (int q = 0; q < 4; ++q) a[r][q] = vdupq_n_s32(0);
        for (int g = 0; g < kq; ++g) {
            const int8_t* xp = (const int8_t*)(xt + goff[g]) + half * 64;
            const int8x16_t x0 = vld1q_s8(xp), x1 = vld1q_s8(xp + 16), x2 = vld1q_s8(xp + 32), x3 = vld1q_s8(xp + 48);
            for (int r = 0; r < Q8_CR; ++r) {
                int32_t v;
                memcpy(&v, w + (size_t)r * kp + 4 * g, 4);
                const int8x16_t wb = vreinterpretq_s8_s32(vdupq_n_s32(v));
                a[r][0] = vdotq_s32(a[r][0], x0, wb);
                a[r][1] = vdotq_s32(a[r][1], x1, wb);
                a[r][2] = vdotq_s32(a[r][2], x2, wb);
                a[r][3] = vdotq_s32(a[r][3], x3, wb);
            }
        }
        for (int r = 0; r < Q8_CR; ++r)
            for (int q = 0; q < 4; ++q) vst1q_s32(out + r * Q8_PX + half * 16 + 4 * q, a[r][q]);
    }
}
#endif

/* the conv micro-kernel whose int32 tile q8_store_rows requantises; NULL for VNNI, whose kernel requantises in
   its own registers (ukc_vnni_q) */
static q8_ukc q8_conv_uk(const q8_isa_t* isa)
{
#if defined(Q8_HAVE_VNNI)
    if (isa->level == 1) return NULL;
#endif
#if defined(Q8_HAVE_SDOT)
    if (isa->level == 1) return ukc_sdot;
#endif
#if defined(Q8_HAVE_AVX2I)
    if (isa == &Q8_AVX2) return ukc_avx2;
#endif
    (void)isa;
    return ukc_portable;
}

/* mode 1, portable: out[r][j] (Q8_MP x Q8_NR) = sum_g x[voff[r] + goff[g] .. +3] . panel[g][j][0..3] */
INFERD_CLONES static void ukn_portable(const uint8_t* st, const long long* goff, int kq, const long long* voff,
                                       const int8_t* panel, int32_t* out)
{
    int32_t acc[Q8_MP][Q8_NR];
    memset(acc, 0, sizeof acc);
    for (int g = 0; g < kq; ++g) {
        const int8_t* p = panel + (size_t)g * 4 * Q8_NR;
        for (int r = 0; r < Q8_MP; ++r) {
            int32_t x0, x1, x2, x3;
            q8_group4u(st + voff[r] + goff[g], &x0, &x1, &x2, &x3);
            for (int j = 0; j < Q8_NR; ++j)
                acc[r][j] += x0 * p[4 * j] + x1 * p[4 * j + 1] + x2 * p[4 * j + 2] + x3 * p[4 * j + 3];
        }
    }
    memcpy(out, acc, sizeof acc);
}

/* the int32 tile of ukn_portable requantised into y (channel j of the tile at y + j * plane, its pixels r < mcnt
   contiguous) */
INFERD_CLONES static void q8_store_cols(const int32_t* tile, int nn, int mcnt, const int32_t* bias, const float* mult,
                                        float flo, float fhi, int zy, uint8_t* y, long long plane)
{
    for (int j = 0; j < nn; ++j)
        for (int r = 0; r < mcnt; ++r) {
            float v = (float)(tile[r * Q8_NR + j] + bias[j]) * mult[j];
            v = v < flo ? flo : (v > fhi ? fhi : v);
            y[(size_t)j * plane + r] = (uint8_t)((int)q8_rint(v) + zy);
        }
}

#if defined(Q8_HAVE_VNNI)
/* Mode 1 on VNNI: 7 pixels x 32 channels (fourteen named accumulators), requantised, transposed by byte, word
   and dword unpacks (rows 8 x 32 -> 32 channels of 8 bytes) and stored as mcnt bytes per channel. bias and mult
   hold 32 entries (padded past N). */
Q8_VNNI_TARGET static void ukn_vnni_q(const uint8_t* st, const long long* goff, int kq, const long long* voff,
                                      const int8_t* panel, int nn, int mcnt, const int32_t* bias, const float* mult,
                                      float flo, float fhi, int zy, uint8_t* y, long long plane)
{
    __m512i a00 = _mm512_setzero_si512(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
            a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00, a60 = a00, a61 = a00;
    const uint8_t *x0 = st + voff[0], *x1 = st + voff[1], *x2 = st + voff[2], *x3 = st + voff[3],
                  *x4 = st + voff[4], *x5 = st + voff[5], *x6 = st + voff[6];
    for (int g = 0; g < kq; ++g) {
        const long long o = goff[g];
        const __m512i w0 = _mm512_loadu_si512((const void*)(panel + (size_t)g * 128));
        const __m512i w1 = _mm512_loadu_si512((const void*)(panel + (size_t)g * 128 + 64));
        int32_t v;
        __m512i xb;
#define Q8_NSTEP(A0, A1, XR)                                                                                       \
    memcpy(&v, XR + o, 4);                                                                                         \
    xb = _mm512_set1_epi32(v);                                                                                     \
    A0 = _mm512_dpbusd_epi32(A0, xb, w0);                                                                          \
    A1 = _mm512_dpbusd_epi32(A1, xb, w1);
        Q8_NSTEP(a00, a01, x0)
        Q8_NSTEP(a10, a11, x1)
        Q8_NSTEP(a20, a21, x2)
        Q8_NSTEP(a30, a31, x3)
        Q8_NSTEP(a40, a41, x4)
        Q8_NSTEP(a50, a51, x5)
        Q8_NSTEP(a60, a61, x6)
#undef Q8_NSTEP
    }
    /* through memory: with the accumulators flowing straight into the transposition, GCC 12 kept them in
       zmm16-29 and copied each one twice around every dot product of the loop (~40% slower) */
    __m512i acc[14] __attribute__((aligned(64)));
    acc[0] = a00, acc[1] = a01, acc[2] = a10, acc[3] = a11, acc[4] = a20, acc[5] = a21, acc[6] = a30;
    acc[7] = a31, acc[8] = a40, acc[9] = a41, acc[10] = a50, acc[11] = a51, acc[12] = a60, acc[13] = a61;
    __asm__ volatile("" : : "r"(acc) : "memory");
    const __m512 lo = _mm512_set1_ps(flo), hi = _mm512_set1_ps(fhi);
    const __m512i zv = _mm512_set1_epi32(zy);
    const __m512i b0 = _mm512_loadu_si512((const void*)bias), b1 = _mm512_loadu_si512((const void*)(bias + 16));
    const __m512 m0 = _mm512_loadu_ps(mult), m1 = _mm512_loadu_ps(mult + 16);
#define Q8_ROW(R)                                                                                                  \
    _mm256_inserti128_si256(_mm256_castsi128_si256(q8_req16(acc[2 * R], b0, m0, lo, hi, zv)),                      \
                            q8_req16(acc[2 * R + 1], b1, m1, lo, hi, zv), 1)
    const __m256i r0 = Q8_ROW(0), r1 = Q8_ROW(1), r2 = Q8_ROW(2), r3 = Q8_ROW(3);
    const __m256i r4 = Q8_ROW(4), r5 = Q8_ROW(5), r6 = Q8_ROW(6), r7 = _mm256_setzero_si256();
#undef Q8_ROW
    /* per 128-bit lane (channels j and 16 + j): bytes, then words, then dwords of row pairs interleaved */
    const __m256i p01l = _mm256_unpacklo_epi8(r0, r1), p01h = _mm256_unpackhi_epi8(r0, r1);
    const __m256i p23l = _mm256_unpacklo_epi8(r2, r3), p23h = _mm256_unpackhi_epi8(r2, r3);
    const __m256i p45l = _mm256_unpacklo_epi8(r4, r5), p45h = _mm256_unpackhi_epi8(r4, r5);
    const __m256i p67l = _mm256_unpacklo_epi8(r6, r7), p67h = _mm256_unpackhi_epi8(r6, r7);
    const __m256i q0 = _mm256_unpacklo_epi16(p01l, p23l), q1 = _mm256_unpackhi_epi16(p01l, p23l);
    const __m256i q2 = _mm256_unpacklo_epi16(p01h, p23h), q3 = _mm256_unpackhi_epi16(p01h, p23h);
    const __m256i q4 = _mm256_unpacklo_epi16(p45l, p67l), q5 = _mm256_unpackhi_epi16(p45l, p67l);
    const __m256i q6 = _mm256_unpacklo_epi16(p45h, p67h), q7 = _mm256_unpackhi_epi16(p45h, p67h);
    /* d[k]: lane 0 channels 2k, 2k + 1 (8 bytes each), lane 1 channels 16 + 2k, 17 + 2k */
    const __m256i d[8] = {_mm256_unpacklo_epi32(q0, q4), _mm256_unpackhi_epi32(q0, q4), _mm256_unpacklo_epi32(q1, q5),
                          _mm256_unpackhi_epi32(q1, q5), _mm256_unpacklo_epi32(q2, q6), _mm256_unpackhi_epi32(q2, q6),
                          _mm256_unpacklo_epi32(q3, q7), _mm256_unpackhi_epi32(q3, q7)};
    const __mmask16 ml = (__mmask16)((1u << mcnt) - 1), mh = (__mmask16)(ml << 8);
    for (int k = 0; k < 8; ++k) {
        const __m128i l0 = _mm256_castsi256_si128(d[k]), l1 = _mm256_extracti128_si256(d[k], 1);
        const int c = 2 * k;
        /* the second channel's bytes sit at 8..15: stored from 8 bytes before its row (masked bytes never fault) */
        if (c < nn) _mm_mask_storeu_epi8((void*)(y + (size_t)c * plane), ml, l0);
        if (c + 1 < nn) _mm_mask_storeu_epi8((void*)(y + (size_t)(c + 1) * plane - 8), mh, l0);
        if (c + 16 < nn) _mm_mask_storeu_epi8((void*)(y + (size_t)(c + 16) * plane), ml, l1);
        if (c + 17 < nn) _mm_mask_storeu_epi8((void*)(y + (size_t)(c + 17) * plane - 8), mh, l1);
    }
}
#endif

typedef struct {
    const q8_isa_t* isa;
    const uint8_t* st;     /* the staged input (NC4 phase planes) */
    const long long* goff; /* per reduction group: its source's byte offset in st */
    const int8_t* wp;
    const int32_t* bias_eff;
    const float* mult;
    int N, kp, zy, lo, hi;
    int OH, OW, Wv;
    long long npix;            /* pixels computed: OH * Wv (mode 0), OH * OW (mode 1) */
    uint8_t* y;                /* the output (N, OH, OW) */
    int pb;                    /* pixels per block */
    long long pblocks, nchunk; /* tasks: pixel blocks x channel chunks of nchunk channels */
    int mode, failed;
    int amx, c4, taps;         /* mode 2 on the tile unit: groups per tap, taps */
    long long cstride;         /* bytes from one channel group's staged planes to the next's */
    int kb;                    /* groups per tile block (q8_amx_kb) */
    /* self-staged (q8_stage_block): each task stages its own block of pixels from x, in NCHW */
    const uint8_t* x;
    int self_stage, C, pad, flip;
} q8_conv_ctx;

#if defined(Q8_HAVE_AMX)
#define Q8_AMX_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni")))

/* palette 1: C tiles 0-3 (16 channels x 16 pixels of int32), A tiles 4-5 (16 channels x kb groups of 4 bytes of
   the reduction), B tiles 6-7 (kb channel groups x 16 pixels x 4 bytes) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} q8_tilecfg;

Q8_AMX_TARGET static void q8_amx_begin(int kb)
{
    q8_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; ++i) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    cfg.colsb[4] = cfg.colsb[5] = (uint16_t)(4 * kb);
    cfg.rows[6] = cfg.rows[7] = (uint8_t)kb;
    /* not _tile_loadconfig: GCC 12's tells the compiler it reads 8 bytes, and the stores of the rest were dropped */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

Q8_AMX_TARGET static void q8_amx_end(void) { _tile_release(); }

/* Q8_AR channels (nn <= 16: 16) x 32 pixels: out[r][p] (int32, row pitch 32) = sum over taps t and blocks of kb
   groups of w[r][(t c4 + g) 4 ..] . x[goff[t c4] + g cstride + 4p ..], by 2 x 2 tiles (each A and B tile read for
   two products); then requantised into y (channel r at y + r pitch, cnt pixels) as ukc_vnni_q does. */
Q8_AMX_TARGET static void q8_amx_tile(const q8_conv_ctx* c, const uint8_t* xt, int n0, int nn, int cnt, float flo,
                                      float fhi, uint8_t* y, long long pitch)
{
    const int c4 = c->c4, kp = c->kp, kb = c->kb;
    const long long cs = c->cstride;
    const int8_t* w = c->wp + (size_t)n0 * kp;
    const int two = nn > 16; /* else the weight rows past 16 may not exist (rows are padded to 16) */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int t = 0; t < c->taps; ++t) {
        const uint8_t* xb = xt + c->goff[(size_t)t * c4];
        const int8_t* wt = w + 4 * (size_t)t * c4;
        for (int g = 0; g < c4; g += kb) {
            _tile_loadd(4, wt + 4 * (size_t)g, kp);
            _tile_loadd(6, xb + (size_t)g * cs, cs);
            _tile_loadd(7, xb + (size_t)g * cs + 64, cs);
            _tile_dpbsud(0, 4, 6);
            _tile_dpbsud(1, 4, 7);
            if (two) {
                _tile_loadd(5, wt + 4 * (size_t)g + 16 * (size_t)kp, kp);
                _tile_dpbsud(2, 5, 6);
                _tile_dpbsud(3, 5, 7);
            }
        }
    }
    int32_t out[Q8_AR * 32] __attribute__((aligned(64)));
    _tile_stored(0, out, 128);
    _tile_stored(1, out + 16, 128);
    _tile_stored(2, out + 16 * 32, 128);
    _tile_stored(3, out + 16 * 32 + 16, 128);
    const __m512 lo = _mm512_set1_ps(flo), hi = _mm512_set1_ps(fhi);
    const __m512i zv = _mm512_set1_epi32(c->zy);
    __mmask16 m0, m1;
    q8_px_masks(cnt, &m0, &m1);
    for (int r = 0; r < nn; ++r) {
        const __m512i a0 = _mm512_load_si512((const void*)(out + 32 * r));
        const __m512i a1 = _mm512_load_si512((const void*)(out + 32 * r + 16));
        q8_store_px32(a0, a1, c->bias_eff[n0 + r], c->mult[n0 + r], lo, hi, zv, m0, m1, y + r * pitch);
    }
}

/* The GEMM's rows [0, rows) of xb (row pitch kp, whole 32-row pairs readable) by the packed panels [n_lo, n_hi) on
   the tile unit: 32 rows x 32 columns a step (x rows the A tiles as they lie, two 16-column panels the B tiles:
   the panel layout is the tiles' B layout), requantised per row with the columns' bias and multiplier as
   q8_block does, into y (m0 + r, n). */
Q8_AMX_TARGET static void q8_amx_gemm_block(const uint8_t* xb, int rows, long long m0, const q8_out_t* o, int n_lo,
                                           int n_hi, int kb)
{
    const int kp = o->kp, kq = kp / 4;
    const __m512 lo = _mm512_set1_ps((float)(o->lo - o->zy)), hi = _mm512_set1_ps((float)(o->hi - o->zy));
    const __m512i zv = _mm512_set1_epi32(o->zy);
    int32_t out[32 * 32] __attribute__((aligned(64)));
    q8_amx_begin(kb);
    for (int n0 = n_lo; n0 < n_hi; n0 += 32) {
        const int two_n = n_hi - n0 > 16;
        const int8_t* p0 = o->wp + (size_t)(n0 / Q8_NP) * Q8_NP * kp;
        const int8_t* p1 = p0 + (size_t)Q8_NP * kp;
        for (int r0 = 0; r0 < rows; r0 += 32) {
            const int two_m = rows - r0 > 16;
            const uint8_t* a = xb + (size_t)r0 * kp;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int g = 0; g < kq; g += kb) {
                _tile_loadd(4, a + 4 * (size_t)g, kp);
                _tile_loadd(6, p0 + 64 * (size_t)g, 64);
                _tile_dpbusd(0, 4, 6);
                if (two_n) {
                    _tile_loadd(7, p1 + 64 * (size_t)g, 64);
                    _tile_dpbusd(1, 4, 7);
                }
                if (two_m) {
                    _tile_loadd(5, a + 16 * (size_t)kp + 4 * (size_t)g, kp);
                    _tile_dpbusd(2, 5, 6);
                    if (two_n) _tile_dpbusd(3, 5, 7);
                }
            }
            _tile_stored(0, out, 128);
            _tile_stored(1, out + 16, 128);
            _tile_stored(2, out + 16 * 32, 128);
            _tile_stored(3, out + 16 * 32 + 16, 128);
            const int rr = rows - r0 < 32 ? rows - r0 : 32;
            for (int h = 0; h < 2; ++h) {
                const int n = n0 + 16 * h, nn = n_hi - n < 16 ? n_hi - n : 16;
                if (nn <= 0) break;
                const __mmask16 mk = nn >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nn) - 1);
                const __m512i b = _mm512_maskz_loadu_epi32(mk, o->bias_eff + n);
                const __m512 m = _mm512_maskz_loadu_ps(mk, o->mult + n);
                for (int r = 0; r < rr; ++r) {
                    const __m512i acc = _mm512_load_si512((const void*)(out + 32 * r + 16 * h));
                    const __m128i q = q8_req16(acc, b, m, lo, hi, zv);
                    const long long at = (m0 + r0 + r) * o->ysm + (long long)n * o->ysn;
                    if (o->ysn == 1) {
                        _mm_mask_storeu_epi8((void*)((uint8_t*)o->y + at), mk, q);
                    } else {
                        uint8_t v[16];
                        _mm_storeu_si128((__m128i*)(void*)v, q);
                        for (int j = 0; j < nn; ++j) ((uint8_t*)o->y)[at + (long long)j * o->ysn] = v[j];
                    }
                }
            }
        }
    }
    q8_amx_end();
}
#endif

INFERD_CLONES static void q8_store_rows(const int32_t* tile, int nn, int cnt, const int32_t* bias, const float* mult,
                                        float flo, float fhi, int zy, uint8_t* y, long long pitch)
{
    for (int r = 0; r < nn; ++r) {
        const int32_t b = bias[r];
        const float m = mult[r];
        const int32_t* tr = tile + r * Q8_PX;
        uint8_t* yo = y + r * pitch;
        /* an int8 result has the bit pattern of its uint8 cast: one loop serves both types */
        for (int p = 0; p < cnt; ++p) {
            float v = (float)(tr[p] + b) * m;
            v = v < flo ? flo : (v > fhi ? fhi : v);
            yo[p] = (uint8_t)((int)q8_rint(v) + zy);
        }
    }
}

INFERD_CLONES static void q8_interleave(const uint8_t* const r[4], int n, uint32_t fx, uint8_t* d);

/* A 1x1, stride-1, unpadded conv's block of pixels [p0, p0 + np) staged by the task that computes it: channel group
   g's words into a private plane of ``pitch`` words (np rounded up to whole 32-pixel tiles: the words past np, which
   a last partial tile reads and never stores, hold the pad) at the task's own scratch; ``*goff`` gets the groups'
   offsets there. The whole input staged first (q8_stage_task) was a parallel region and a join per conv, and each
   core then read half its input from the other's cache (672 -> 112 channels at 14x14 on two threads: 1.3x one
   thread's speed). NULL, the conv marked failed, where the scratch cannot grow. */
static uint8_t* q8_stage_block(q8_conv_ctx* c, long long p0, int np, const long long** goff)
{
    const int C4 = q8_c4(c->C), kq = c->kp / 4, pitch = (np + Q8_PX - 1) / Q8_PX * Q8_PX;
    const size_t planes = 4 * (size_t)C4 * pitch;
    uint8_t* b = q8_scratch(0, planes + sizeof(long long) * (size_t)kq + (size_t)np + 64);
    if (!b) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    long long* go = (long long*)(void*)(b + planes);
    uint8_t* zero = (uint8_t*)(go + kq); /* the rows of channels past C (their weights are 0) */
    memset(zero, 0, (size_t)np);
    const uint32_t padw = (uint32_t)c->pad * 0x01010101u, fx = (uint32_t)c->flip * 0x01010101u;
    const long long plane = (long long)c->OH * c->OW;
    for (int g = 0; g < C4; ++g) {
        const uint8_t* rows[4];
        for (int i = 0; i < 4; ++i)
            rows[i] = 4 * g + i < c->C ? c->x + (size_t)(4 * g + i) * plane + p0 : zero;
        uint8_t* d = b + 4 * (size_t)g * pitch;
        q8_interleave(rows, np, fx, d);
        for (int u = np; u < pitch; ++u) memcpy(d + 4 * (size_t)u, &padw, 4);
    }
    for (int g = 0; g < kq; ++g) go[g] = 4 * (long long)g * pitch;
    *goff = go;
    return b;
}

static void q8_conv_task(void* vctx, long long t)
{
    q8_conv_ctx* c = (q8_conv_ctx*)vctx;
    const long long pb = t % c->pblocks, nc = t / c->pblocks;
    const long long npix = c->npix, p0 = pb * c->pb;
    const int np = (int)(npix - p0 < c->pb ? npix - p0 : c->pb);
    const int kp = c->kp, kq = kp / 4;
    const q8_ukc uk = q8_conv_uk(c->isa);
    int32_t tile[Q8_CR * Q8_PX];
    const float flo = (float)(c->lo - c->zy), fhi = (float)(c->hi - c->zy);
    const int n_begin = (int)(nc * c->nchunk), n_end = (int)((nc + 1) * c->nchunk < c->N ? (nc + 1) * c->nchunk : c->N);
    /* Wv != OW: the block's rows computed at pitch pb here, its OW-wide rows copied out while in cache (a pass
       over a whole staged output after the GEMM cost a parallel region and a cold read) */
    const int staged = c->Wv != c->OW;
    uint8_t* yb = staged ? q8_scratch(1, (size_t)(n_end - n_begin) * c->pb) : NULL;
    if (staged && !yb) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const long long pitch = staged ? c->pb : npix;
    /* the tile unit's rows (32 channels; chunks are whole tiles) or the micro-kernel's */
    const int step = c->amx ? Q8_AR : Q8_CR;
    /* the block's first pixel's words: in the whole staged input, or in the block's own planes */
    const long long* goff = c->goff;
    const uint8_t* st = c->self_stage ? q8_stage_block(c, p0, np, &goff) : c->st + 4 * (size_t)p0;
    if (!st) return;
#if defined(Q8_HAVE_AMX)
    if (c->amx) q8_amx_begin(c->kb);
#endif
    for (int px = 0; px < np; px += Q8_PX) {
        const uint8_t* xt = st + 4 * (size_t)px;
        const int cnt = np - px < Q8_PX ? np - px : Q8_PX;
        for (int n0 = n_begin; n0 < n_end; n0 += step) {
            const int nn = n_end - n0 < step ? n_end - n0 : step;
            uint8_t* y = staged ? yb + (size_t)(n0 - n_begin) * pitch + px : c->y + (size_t)n0 * npix + p0 + px;
#if defined(Q8_HAVE_AMX)
            if (c->amx) {
                q8_amx_tile(c, xt, n0, nn, cnt, flo, fhi, y, pitch);
                continue;
            }
#endif
#if defined(Q8_HAVE_VNNI)
            if (!uk) {
                ukc_vnni_q(xt, goff, kq, c->wp + (size_t)n0 * kp, kp, nn, cnt, c->bias_eff + n0, c->mult + n0,
                           flo, fhi, c->zy, y, pitch);
                continue;
            }
#endif
            uk(xt, goff, kq, c->wp + (size_t)n0 * kp, kp, tile, cnt);
            q8_store_rows(tile, nn, cnt, c->bias_eff + n0, c->mult + n0, flo, fhi, c->zy, y, pitch);
        }
    }
#if defined(Q8_HAVE_AMX)
    if (c->amx) q8_amx_end();
#endif
    if (!staged) return;
    /* virtual pixel p = row * Wv + col holds output (row, col) for col < OW */
    const long long plane = (long long)c->OH * c->OW;
    for (int n = n_begin; n < n_end; ++n) {
        const uint8_t* src = yb + (size_t)(n - n_begin) * pitch;
        uint8_t* dst = c->y + (size_t)n * plane;
        for (long long p = p0; p < p0 + np;) {
            const long long row = p / c->Wv, col = p % c->Wv;
            long long end = row * c->Wv + c->OW;
            if (end > p0 + np) end = p0 + np;
            if (col < c->OW) q8_cpy(dst + row * c->OW + col, src + (p - p0), (int)(end - p));
            p = (row + 1) * c->Wv;
        }
    }
}

/* mode 1: a block of output pixels [p0, p0 + pb) x the panels of a chunk of channels */
static void q8_convn_task(void* vctx, long long t)
{
    q8_conv_ctx* c = (q8_conv_ctx*)vctx;
    const long long M = c->npix, p0 = (t % c->pblocks) * c->pb, nc = t / c->pblocks;
    const int np = (int)(M - p0 < c->pb ? M - p0 : c->pb), kq = c->kp / 4;
    const int n_begin = (int)(nc * c->nchunk), n_end = (int)((nc + 1) * c->nchunk < c->N ? (nc + 1) * c->nchunk : c->N);
    const float flo = (float)(c->lo - c->zy), fhi = (float)(c->hi - c->zy);
    long long* voff = (long long*)(void*)q8_scratch(1, sizeof(long long) * ((size_t)np + Q8_MP));
    if (!voff) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    const long long* goff = c->goff;
    const uint8_t* st = c->self_stage ? q8_stage_block(c, p0, np, &goff) : c->st;
    if (!st) return;
    /* output pixel p reads its words at 4 (row Wv + col) of each group's plane (at 4 (p - p0) of the block's own);
       a partial tile repeats the last */
    for (int i = 0; i < np + Q8_MP; ++i) {
        const long long p = p0 + (i < np ? i : np - 1);
        voff[i] = c->self_stage ? 4 * (p - p0) : 4 * ((p / c->OW) * c->Wv + p % c->OW);
    }
#if defined(Q8_HAVE_VNNI)
    const int vnni = c->isa->level == 1;
#endif
    int32_t tile[Q8_MP * Q8_NR];
    for (int n0 = n_begin; n0 < n_end; n0 += Q8_NR) {
        const int nn = n_end - n0 < Q8_NR ? n_end - n0 : Q8_NR;
        const int8_t* panel = c->wp + (size_t)n0 * c->kp;
        for (int i = 0; i < np; i += Q8_MP) {
            const int mcnt = np - i < Q8_MP ? np - i : Q8_MP;
            uint8_t* y = c->y + (size_t)n0 * M + p0 + i;
#if defined(Q8_HAVE_VNNI)
            if (vnni) {
                ukn_vnni_q(st, goff, kq, voff + i, panel, nn, mcnt, c->bias_eff + n0, c->mult + n0, flo, fhi,
                           c->zy, y, M);
                continue;
            }
#endif
            ukn_portable(st, goff, kq, voff + i, panel, tile);
            q8_store_cols(tile, nn, mcnt, c->bias_eff + n0, c->mult + n0, flo, fhi, c->zy, y, M);
        }
    }
}

/* ---- staging: the input padded (with the zero point), shifted into the kernel's domain, in NC4 phase planes */
typedef struct {
    const uint8_t* x;
    uint8_t* st;
    int C, H, W, sh, sw, pt, pl, Hq, Wv;
    long long vplane;    /* words per phase plane */
    const uint8_t* used;   /* per phase (ph * sw + pw): whether a tap reads it */
    const int* urange;     /* per column phase pw: the words [u0, u1) of a row that hold input columns */
    uint8_t pad, flip;
    int ntasks, rsplit, failed;
} q8_stage_ctx;

#if defined(__x86_64__) && defined(__GNUC__)
/* One 32-word run of 4 byte rows by byte and word unpacks (24 instructions; the compiler's widen-shift-or took
   ~3x): word p = r0[p] | r1[p] << 8 | r2[p] << 16 | r3[p] << 24, xor fx. */
__attribute__((target("avx2"))) static void q8_interleave32_avx2(const uint8_t* r0, const uint8_t* r1,
                                                                const uint8_t* r2, const uint8_t* r3, uint32_t fx,
                                                                uint8_t* d)
{
    const __m256i a = _mm256_loadu_si256((const __m256i*)r0), b = _mm256_loadu_si256((const __m256i*)r1);
    const __m256i c = _mm256_loadu_si256((const __m256i*)r2), e = _mm256_loadu_si256((const __m256i*)r3);
    const __m256i ab0 = _mm256_unpacklo_epi8(a, b), ab1 = _mm256_unpackhi_epi8(a, b);
    const __m256i ce0 = _mm256_unpacklo_epi8(c, e), ce1 = _mm256_unpackhi_epi8(c, e);
    const __m256i q0 = _mm256_unpacklo_epi16(ab0, ce0), q1 = _mm256_unpackhi_epi16(ab0, ce0);
    const __m256i q2 = _mm256_unpacklo_epi16(ab1, ce1), q3 = _mm256_unpackhi_epi16(ab1, ce1);
    const __m256i f = _mm256_set1_epi32((int)fx);
    _mm256_storeu_si256((__m256i*)d, _mm256_xor_si256(_mm256_permute2x128_si256(q0, q1, 0x20), f));
    _mm256_storeu_si256((__m256i*)(d + 32), _mm256_xor_si256(_mm256_permute2x128_si256(q2, q3, 0x20), f));
    _mm256_storeu_si256((__m256i*)(d + 64), _mm256_xor_si256(_mm256_permute2x128_si256(q0, q1, 0x31), f));
    _mm256_storeu_si256((__m256i*)(d + 96), _mm256_xor_si256(_mm256_permute2x128_si256(q2, q3, 0x31), f));
}

/* e[t] = s[2t], o[t] = s[2t + 1] for t < 16, from the 32 bytes at s */
__attribute__((target("avx2"))) static void q8_split32_avx2(const uint8_t* s, uint8_t* e, uint8_t* o)
{
    const __m128i m = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m128i a = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)s), m);
    const __m128i b = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(s + 16)), m);
    _mm_storeu_si128((__m128i*)e, _mm_unpacklo_epi64(a, b));
    _mm_storeu_si128((__m128i*)o, _mm_unpackhi_epi64(a, b));
}
#endif

/* n words from the 4 byte rows r[0..3] (each n bytes readable) into d. Staged rows are short (7 to ~60 words, one
   per channel group, row and phase): 8 words at a time with a last, overlapping step below 32, not bytewise. */
INFERD_CLONES static void q8_interleave(const uint8_t* const r[4], int n, uint32_t fx, uint8_t* d)
{
    int p = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (q8_cpu() & Q8_F_AVX2)
        for (; p + 32 <= n; p += 32) q8_interleave32_avx2(r[0] + p, r[1] + p, r[2] + p, r[3] + p, fx, d + 4 * (size_t)p);
    if (n >= 8) {
        const __m128i f = _mm_set1_epi32((int)fx);
        for (; p < n; p += 8) {
            const int q = p + 8 <= n ? p : n - 8;
            const __m128i a = _mm_loadl_epi64((const __m128i*)(r[0] + q)), b = _mm_loadl_epi64((const __m128i*)(r[1] + q));
            const __m128i c = _mm_loadl_epi64((const __m128i*)(r[2] + q)), e = _mm_loadl_epi64((const __m128i*)(r[3] + q));
            const __m128i ab = _mm_unpacklo_epi8(a, b), ce = _mm_unpacklo_epi8(c, e);
            _mm_storeu_si128((__m128i*)(d + 4 * (size_t)q), _mm_xor_si128(_mm_unpacklo_epi16(ab, ce), f));
            _mm_storeu_si128((__m128i*)(d + 4 * (size_t)q + 16), _mm_xor_si128(_mm_unpackhi_epi16(ab, ce), f));
        }
        return;
    }
#elif defined(__aarch64__)
    if (n >= 8) {
        const uint8x8_t f = vdup_n_u8((uint8_t)fx);
        for (; p < n; p += 8) {
            const int q = p + 8 <= n ? p : n - 8;
            uint8x8x4_t v;
            v.val[0] = veor_u8(vld1_u8(r[0] + q), f);
            v.val[1] = veor_u8(vld1_u8(r[1] + q), f);
            v.val[2] = veor_u8(vld1_u8(r[2] + q), f);
            v.val[3] = veor_u8(vld1_u8(r[3] + q), f);
            vst4_u8(d + 4 * (size_t)q, v);
        }
        return;
    }
#endif
    uint32_t* restrict dw = (uint32_t*)(void*)d;
    for (; p < n; ++p)
        dw[p] = ((uint32_t)r[0][p] | ((uint32_t)r[1][p] << 8) | ((uint32_t)r[2][p] << 16) | ((uint32_t)r[3][p] << 24)) ^ fx;
}

/* e[t] = s[2t], o[t] = s[2t + 1] for t < 8, from the 16 bytes at s */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static void q8_split16_avx2(const uint8_t* s, uint8_t* e, uint8_t* o)
{
    const __m128i m = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m128i a = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)s), m);
    _mm_storel_epi64((__m128i*)e, a);
    _mm_storel_epi64((__m128i*)o, _mm_unpackhi_epi64(a, a));
}
#endif

/* A row of W bytes split by column parity: e[t] = s[2t] for t < (W + 1) / 2, o[t] = s[2t + 1] for t < W / 2.
   32 bytes a step, then 16, the last one overlapping (at an even offset, so parities hold): rows are ~14 to 112
   bytes, thousands per layer, and a byte loop over them cost a tenth of a stride-2 3x3 layer. */
INFERD_CLONES static void q8_split2(const uint8_t* restrict s, int W, uint8_t* restrict e, uint8_t* restrict o)
{
    int p = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (W >= 16 && (q8_cpu() & Q8_F_AVX2)) {
        for (; p + 32 <= W; p += 32) q8_split32_avx2(s + p, e + p / 2, o + p / 2);
        for (; p + 16 <= W; p += 16) q8_split16_avx2(s + p, e + p / 2, o + p / 2);
        if (p < W - 1) {
            const int q = (W - 16) & ~1;
            q8_split16_avx2(s + q, e + q / 2, o + q / 2);
            p = q + 16;
        }
    }
#elif defined(__aarch64__)
    if (W >= 16) {
        for (; p + 32 <= W; p += 32) {
            const uint8x16x2_t v = vld2q_u8(s + p);
            vst1q_u8(e + p / 2, v.val[0]);
            vst1q_u8(o + p / 2, v.val[1]);
        }
        for (; p + 16 <= W; p += 16) {
            const uint8x8x2_t v = vld2_u8(s + p);
            vst1_u8(e + p / 2, v.val[0]);
            vst1_u8(o + p / 2, v.val[1]);
        }
        if (p < W - 1) {
            const int q = (W - 16) & ~1;
            const uint8x8x2_t v = vld2_u8(s + q);
            vst1_u8(e + q / 2, v.val[0]);
            vst1_u8(o + q / 2, v.val[1]);
            p = q + 16;
        }
    }
#endif
    for (; p + 1 < W; p += 2) {
        e[p / 2] = s[p];
        o[p / 2] = s[p + 1];
    }
    if (p < W) e[p / 2] = s[p];
}

static void q8_stage_task(void* vctx, long long t)
{
    q8_stage_ctx* c = (q8_stage_ctx*)vctx;
    const int C4 = q8_c4(c->C);
    /* tasks: channel groups split ntasks / rsplit ways, rows of the planes rsplit ways (a 3-channel stem is one
       group: staged by one thread, it scaled 1.14x on two) */
    const int gt = c->ntasks / c->rsplit, gi = (int)(t / c->rsplit), ri = (int)(t % c->rsplit);
    const int g0 = (int)((long long)C4 * gi / gt), g1 = (int)((long long)C4 * (gi + 1) / gt);
    const int sh = c->sh, sw = c->sw, H = c->H, W = c->W, pl = c->pl, pt = c->pt, Wv = c->Wv, Hq = c->Hq;
    const int rq0 = (int)((long long)Hq * ri / c->rsplit), rq1 = (int)((long long)Hq * (ri + 1) / c->rsplit);
    const uint32_t padw = c->pad * 0x01010101u, fx = c->flip * 0x01010101u;
    /* 4 rows of one column phase (strides > 1), and a row of zeros for the channels past C (their weights are 0):
       rows of W bytes, or of the whole plane where its data rows are one run (no column padding) */
    const int one_run = sh == 1 && sw == 1 && pl == 0 && Wv == W;
    const size_t rb = (size_t)W * (one_run ? H : 1) + 64, rh = (size_t)W / 2 + 32; /* stride 2: odd columns at + rh */
    const int need_tmp = sw > 1 || 4 * g1 > c->C;
    uint8_t* tmp = need_tmp ? q8_scratch(1, 5 * rb) : NULL;
    if (need_tmp && !tmp) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    if (4 * g1 > c->C) memset(tmp + 4 * rb, 0, rb);
    for (int g = g0; g < g1; ++g) {
        const uint8_t* src[4];
        for (int i = 0; i < 4; ++i) src[i] = 4 * g + i < c->C ? c->x + (size_t)(4 * g + i) * H * W : NULL;
        if (one_run) {
            /* no column padding: the data rows are one run in x and in the plane */
            uint32_t* d = (uint32_t*)(void*)c->st + (size_t)g * c->vplane;
            const int a = pt < rq0 ? rq0 : pt, b = pt + H < rq1 ? pt + H : rq1;
            const int r0 = a < b ? a : rq0, r1 = a < b ? b : rq0;
            for (size_t u = (size_t)rq0 * Wv; u < (size_t)r0 * Wv; ++u) d[u] = padw;
            for (size_t u = (size_t)r1 * Wv; u < (size_t)rq1 * Wv; ++u) d[u] = padw;
            if (r1 > r0) {
                const uint8_t* rows[4];
                for (int i = 0; i < 4; ++i) rows[i] = src[i] ? src[i] + (size_t)(r0 - pt) * W : tmp + 4 * rb;
                q8_interleave(rows, (r1 - r0) * W, fx, (uint8_t*)(d + (size_t)r0 * Wv));
            }
            continue;
        }
        int split_row = -1; /* the padded row whose parities tmp holds (stride 2) */
        for (int rq = rq0; rq < rq1; ++rq)
            for (int ph = 0; ph < sh; ++ph) {
            const int r = rq * sh + ph, ih = r - pt;
            for (int pw = 0; pw < sw; ++pw) {
                if (!c->used[ph * sw + pw]) continue; /* a phase no tap reads (1x1 stride 2: 3 of 4) */
                uint32_t* d = (uint32_t*)(void*)(c->st) + (((size_t)g * sh + ph) * sw + pw) * c->vplane + (size_t)rq * Wv;
                int u0 = c->urange[2 * pw], u1 = c->urange[2 * pw + 1];
                if (ih < 0 || ih >= H) u0 = u1 = 0;
                for (int u = 0; u < u0; ++u) d[u] = padw;
                for (int u = u1; u < Wv; ++u) d[u] = padw;
                if (u1 == u0) continue;
                const int n = u1 - u0, iw0 = pw + u0 * sw - pl;
                const uint8_t* rows[4];
                for (int i = 0; i < 4; ++i) {
                    if (!src[i]) {
                        rows[i] = tmp + 4 * rb;
                    } else if (sw == 1) {
                        rows[i] = src[i] + (size_t)ih * W + iw0;
                    } else if (sw == 2) {
                        /* both parities of the row split once, on the first phase that reads it */
                        if (split_row != r) q8_split2(src[i] + (size_t)ih * W, W, tmp + i * rb, tmp + i * rb + rh);
                        rows[i] = tmp + i * rb + (iw0 & 1) * rh + iw0 / 2;
                    } else {
                        const uint8_t* si = src[i] + (size_t)ih * W + iw0;
                        for (int u = 0; u < n; ++u) tmp[i * rb + u] = si[(size_t)u * sw];
                        rows[i] = tmp + i * rb;
                    }
                }
                if (sw == 2) split_row = r;
                q8_interleave(rows, n, fx, (uint8_t*)(d + u0));
            }
            }
    }
}

#if defined(Q8_HAVE_VNNI)
/* A 1x1 conv of a 1x1 map (a squeeze-and-excitation block's two convs) is a matrix-vector product: mode 1's panels
   of 32 channels, one broadcast dword of the input and two dot products a group, in two interleaved chains. The
   conv path staged a block of 32 pixels for the one, computed tiles of 7 pixels and set up the offsets of every
   group, per call: 1152 -> 48 channels took 8.9 us, now ~1. xs: the input in the unsigned domain, padded to whole
   groups (bytes of 64-byte stores: dword loads forward from them). */
Q8_VNNI_TARGET static void q8_gemv1_vnni(const uint8_t* xs, int kq, const int8_t* wp, int N, const int32_t* bias,
                                         const int32_t* wsum, int zxd, const float* mult, float flo, float fhi, int zy,
                                         uint8_t* y)
{
    const __m512 lo = _mm512_set1_ps(flo), hi = _mm512_set1_ps(fhi);
    const __m512i zv = _mm512_set1_epi32(zy), zxv = _mm512_set1_epi32(zxd);
    const long long kp = 4LL * kq;
    for (int n0 = 0; n0 < N; n0 += Q8_NR) {
        const int8_t* panel = wp + (size_t)n0 * kp;
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, c0 = a0, c1 = a0;
        int g = 0;
        for (; g + 1 < kq; g += 2) {
            int32_t u, v;
            memcpy(&u, xs + 4 * g, 4);
            memcpy(&v, xs + 4 * g + 4, 4);
            const __m512i xu = _mm512_set1_epi32(u), xv = _mm512_set1_epi32(v);
            const int8_t* pg = panel + (size_t)g * 128;
            a0 = _mm512_dpbusd_epi32(a0, xu, _mm512_loadu_si512((const void*)pg));
            a1 = _mm512_dpbusd_epi32(a1, xu, _mm512_loadu_si512((const void*)(pg + 64)));
            c0 = _mm512_dpbusd_epi32(c0, xv, _mm512_loadu_si512((const void*)(pg + 128)));
            c1 = _mm512_dpbusd_epi32(c1, xv, _mm512_loadu_si512((const void*)(pg + 192)));
        }
        if (g < kq) {
            int32_t u;
            memcpy(&u, xs + 4 * g, 4);
            const __m512i xu = _mm512_set1_epi32(u);
            a0 = _mm512_dpbusd_epi32(a0, xu, _mm512_loadu_si512((const void*)(panel + (size_t)g * 128)));
            a1 = _mm512_dpbusd_epi32(a1, xu, _mm512_loadu_si512((const void*)(panel + (size_t)g * 128 + 64)));
        }
        a0 = _mm512_add_epi32(a0, c0);
        a1 = _mm512_add_epi32(a1, c1);
        const int nn = N - n0 < Q8_NR ? N - n0 : Q8_NR;
        const __mmask16 m0 = nn >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nn) - 1);
        const __mmask16 m1 = nn >= 32 ? (__mmask16)0xffff : (nn > 16 ? (__mmask16)((1u << (nn - 16)) - 1) : 0);
        /* bias - zx' sum(w), as q8_bias_eff */
        const __m512i z = _mm512_setzero_si512();
        const __m512i b0 = _mm512_sub_epi32(bias ? _mm512_maskz_loadu_epi32(m0, bias + n0) : z,
                                            _mm512_mullo_epi32(zxv, _mm512_maskz_loadu_epi32(m0, wsum + n0)));
        const __m512i b1 = _mm512_sub_epi32(bias ? _mm512_maskz_loadu_epi32(m1, bias + n0 + 16) : z,
                                            _mm512_mullo_epi32(zxv, _mm512_maskz_loadu_epi32(m1, wsum + n0 + 16)));
        const __m512 f0 = _mm512_maskz_loadu_ps(m0, mult + n0), f1 = _mm512_maskz_loadu_ps(m1, mult + n0 + 16);
        _mm_mask_storeu_epi8((void*)(y + n0), m0, q8_req16(a0, b0, f0, lo, hi, zv));
        if (m1) _mm_mask_storeu_epi8((void*)(y + n0 + 16), m1, q8_req16(a1, b1, f1, lo, hi, zv));
    }
}

/* panels over the pool where the weights are large (a classifier's 1x1 conv): the products read each weight once,
   so their time is the weights' read from memory, which two cores do faster than one */
typedef struct {
    const uint8_t* xs;
    int kq;
    const int8_t* wp;
    int N;
    const int32_t *bias, *wsum;
    int zxd;
    const float* mult;
    float flo, fhi;
    int zy;
    uint8_t* y;
    int panels_per_task;
} q8_gemv1_ctx;

static void q8_gemv1_task(void* vctx, long long t)
{
    const q8_gemv1_ctx* c = (const q8_gemv1_ctx*)vctx;
    const long long span = (long long)c->panels_per_task * Q8_NR, n0 = t * span;
    if (n0 >= c->N) return;
    const long long n1 = n0 + span < c->N ? n0 + span : c->N;
    q8_gemv1_vnni(c->xs, c->kq, c->wp + (size_t)n0 * 4 * c->kq, (int)(n1 - n0), c->bias ? c->bias + n0 : NULL,
                  c->wsum + n0, c->zxd, c->mult + n0, c->flo, c->fhi, c->zy, c->y + n0);
}

/* the input of a 1x1 map in the unsigned domain, padded to 4 kq bytes with the zero point, in 64-byte stores */
Q8_VNNI_TARGET static void q8_gemv1_stage(const uint8_t* x, int C, int x_signed, int zxd, uint8_t* xs, int kq)
{
    const __m512i flip = _mm512_set1_epi8((char)(x_signed ? 0x80 : 0)), zp = _mm512_set1_epi8((char)zxd);
    for (int i = 0; i < 4 * kq; i += 64) {
        const int n = C - i;
        const __mmask64 m = n >= 64 ? ~(__mmask64)0 : (n > 0 ? (((__mmask64)1 << n) - 1) : 0);
        const __m512i v = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, x + i), flip);
        _mm512_storeu_si512((void*)(xs + i), _mm512_mask_blend_epi8(m, zp, v));
    }
}
#endif

int inferd_q8_conv2d(const void* x, int x_signed, int zx, int C, int H, int W, const int8_t* wp, const int32_t* wsum,
                     int N, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW,
                     const int32_t* bias, const float* mult, int zy, int lo, int hi, void* y, int y_signed, int mode,
                     int max_threads)
{
#if defined(Q8_HAVE_VNNI)
    if (mode == 1 && q8_isa()->level == 1 && kh == 1 && kw == 1 && H == 1 && W == 1 && OH == 1 && OW == 1 &&
        pt == 0 && pl == 0 && C > 0) {
        const int kq1 = q8_c4m(C, 1);
        uint8_t* xs = q8_scratch(0, 4 * (size_t)kq1 + 64);
        if (!xs) return -1;
        const int zx1 = q8_zx_domain(zx, x_signed, 0);
        q8_gemv1_stage((const uint8_t*)x, C, x_signed, zx1, xs, kq1);
        const long long panels = (N + Q8_NR - 1) / Q8_NR, wbytes = panels * Q8_NR * 4LL * kq1;
        const long long tasks = wbytes < 262144 ? 1 : inferd_pool_chunks(panels, (double)wbytes);
        q8_gemv1_ctx g = {xs, kq1, wp, N, bias, wsum, zx1, mult, (float)(lo - zy), (float)(hi - zy), zy, (uint8_t*)y,
                          (int)((panels + tasks - 1) / tasks)};
        inferd_parallel(q8_gemv1_task, &g, (panels + g.panels_per_task - 1) / g.panels_per_task,
                        tasks < 2 ? 1 : max_threads);
        return 0;
    }
#endif
    (void)y_signed; /* an int8 result has the bit pattern of its uint8 cast */
    const q8_isa_t* isa = q8_isa();
    /* mode 1's kernels (VNNI, portable) read x unsigned; mode 2's are mode 0's or the tile unit's (unsigned) */
    const int dom_signed = isa->level == 1 && mode != 1 ? isa->xsigned : 0;
    /* mode 2 with short blocks (the planner does not pick it so) runs mode 0's kernels, as without AMX */
    const int amx = isa->amx && mode == 2 && q8_amx_kb(q8_c4m(C, 2)) >= Q8_AMX_KB_MIN;
    const int zxd = q8_zx_domain(zx, x_signed, dom_signed);
    /* C4m: groups per tap in the packing (mode 2 may pad them, q8_c4m) */
    const int C4 = q8_c4(C), C4m = q8_c4m(C, mode), taps = kh * kw, kq = C4m * taps, kp = 4 * kq;
    const int Hpad = (OH - 1) * sh + (kh - 1) * dh + 1, Wpad = (OW - 1) * sw + (kw - 1) * dw + 1;
    const int Hq = (Hpad + sh - 1) / sh + 1, Wv = (Wpad + sw - 1) / sw;
    const long long vplane = (long long)Hq * Wv, npix = (long long)OH * Wv;
    /* a 1x1, stride-1, unpadded conv's tasks stage each the block of pixels they compute (q8_stage_block): no
       pass over the whole input before them */
    const int self_stage = kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && mode != 2 &&
                         OH == H && OW == W && __atomic_load_n(&Q8_SELF_STAGE, __ATOMIC_RELAXED) != 0;
    /* a tile reads up to Q8_PX words past its last pixel: slack past the last plane */
    const size_t sbytes = self_stage ? 64 : 4 * (size_t)C4m * sh * sw * vplane + 4 * Q8_PX + 64;
    uint8_t* st = q8_scratch(0, sbytes);
    /* bias and multipliers padded to whole panels (mode 1's store reads 32 of each) */
    const long long Nr = q8_conv_rows(N, mode);
    int32_t* be = st ? (int32_t*)calloc((size_t)Nr * 2, sizeof(int32_t)) : NULL;
    float* mp = be ? (float*)(void*)(be + Nr) : NULL;
    if (be)
        for (int n = 0; n < N; ++n) {
            be[n] = (bias ? bias[n] : 0) - zxd * wsum[n];
            mp[n] = mult[n];
        }
    long long* goff =
        be ? (long long*)malloc(sizeof(long long) * (size_t)(kq > 0 ? kq : 1) + sizeof(int) * 2 * sw + (size_t)sh * sw)
           : NULL;
    if (!goff) {
        free(be);
        return -1;
    }
    int* urange = (int*)(goff + (kq > 0 ? kq : 1));
    for (int pw = 0; pw < sw; ++pw) {
        /* word u of a row of column phase pw holds padded column pw + u sw = input column pw + u sw - pl */
        const int u0 = pl > pw ? (pl - pw + sw - 1) / sw : 0;
        int u1 = W + pl - pw > 0 ? (W + pl - pw + sw - 1) / sw : 0;
        u1 = u1 > Wv ? Wv : u1;
        urange[2 * pw] = u1 > u0 ? u0 : 0;
        urange[2 * pw + 1] = u1 > u0 ? u1 : 0;
    }
    uint8_t* used = (uint8_t*)(urange + 2 * sw);
    memset(used, 0, (size_t)sh * sw);
    for (int tap = 0; tap < taps; ++tap) used[((tap / kw) * dh % sh) * sw + (tap % kw) * dw % sw] = 1;
    for (int g = 0; g < kq; ++g) {
        /* group g of the packing: (channel group, tap), or (tap, channel group) in mode 2 */
        const int tap = mode == 2 ? g / C4m : g % taps, cg = mode == 2 ? g % C4m : g / taps;
        const int ri = (tap / kw) * dh, cj = (tap % kw) * dw;
        const long long plane = ((long long)cg * sh + ri % sh) * sw + cj % sw;
        goff[g] = 4 * (plane * vplane + (long long)(ri / sh) * Wv + cj / sw);
    }
    /* tasks: blocks of pixels (whole tiles of unit pixels, ~256 KB of the staged input per block) x chunks of
       channels (whole micro-kernel rows) */
    const int unit = mode == 1 ? Q8_MP : Q8_PX, rows = mode == 1 ? Q8_NR : (amx ? Q8_AR : Q8_CR);
    const long long npx = mode == 1 ? (long long)OH * OW : npix;
    const int pb_max = mode == 1 ? 64 * Q8_MP : Q8_PB_MAX;
    int pbs = (int)(262144 / kp) / unit * unit;
    pbs = pbs < unit ? unit : (pbs > pb_max ? pb_max : pbs);
    /* blocks x chunks by the smallest makespan (whole tasks per thread, a task's tiles x its rows of channels),
       then the fewest tasks: 196 pixels x 3 panels of mode 1 made 3 tasks for 2 threads before (1.13x of one
       thread); at least the blocks the L2 bound asks for */
    const int threads = inferd_pool_threads() < max_threads ? inferd_pool_threads() : (max_threads > 0 ? max_threads : 1);
    const long long tiles = (npx + unit - 1) / unit, nrows = (N + rows - 1) / rows;
    long long nb_min = (npx + pbs - 1) / pbs, best_nb = nb_min, best_ch = 1;
    double best = -1.0;
    if (nb_min >= 4LL * threads) /* enough blocks: a whole number per thread where few (56x56: 13 made 7 and 6) */
        best_nb = nb_min < 16LL * threads ? (nb_min + threads - 1) / threads * threads : nb_min;
    else
    for (long long nb = nb_min; nb <= nb_min * 8 && nb <= tiles; ++nb)
        for (long long ch = 1; ch <= nrows && ch <= 16LL * threads; ++ch) {
            const long long tasks = nb * ch, tt = (tiles + nb - 1) / nb, tr = (nrows + ch - 1) / ch;
            /* a task's set-up: about half a micro-kernel call */
            const double span = (double)((tasks + threads - 1) / threads) * ((double)(tt * tr) + 0.5);
            if (best < 0 || span < best * 0.999) best = span, best_nb = nb, best_ch = ch;
        }
    /* self-staged: every task stages the block of pixels it computes, the tasks of one block (chunks of channels)
       each its own copy (an expanding conv's 64 -> 384 channels at 14x14 split in two chunks: 23.4 -> 20.5 us on two
       threads; 112 -> 672: 59.7 -> 52.3; 2048 -> 512 at 7x7, whose two chunks each stage all 2048: 143 -> 133).
       Blocks of pixels alone are taken where their best span is at most what they save beyond the best split with
       chunks: the second copy of each block, the join and the cross-core reads (672 -> 112 at 14x14, one split
       either way: 61 -> 47 us; 1152 -> 192 at 7x7, whose 7 tiles split 4 + 3 against 6 panels in halves: 50 ->
       37; 192 -> 1152 at 7x7 against 36 panels keeps the channel split) */
    if (self_stage && threads > 1 && best_ch != 1) {
        long long nb1 = 0;
        double b1 = -1.0;
        for (long long nb = nb_min; nb <= nb_min * 8 && nb <= tiles; ++nb) {
            const double span = (double)((nb + threads - 1) / threads) * ((double)((tiles + nb - 1) / nb * nrows) + 0.5);
            if (b1 < 0 || span < b1 * 0.999) b1 = span, nb1 = nb;
        }
        const double saved = Q8_SELF_PER_TILE * (double)tiles / threads + Q8_SELF_JOIN;
        if (nb1 > 0 && b1 <= best + saved) best_nb = nb1, best_ch = 1;
    }
    q8_stage_ctx sc = {(const uint8_t*)x, st, C, H, W, sh, sw, pt, pl, Hq, Wv, vplane, used, urange, (uint8_t)zxd,
                       (uint8_t)(x_signed != dom_signed ? 0x80 : 0), 1, 1, 0};
    if (!self_stage) {
        const double swork = (double)C4 * sh * sw * vplane * 4;
        if (swork >= 65536) {
            const int tw = inferd_pool_chunks((long long)C4 * Hq, swork); /* tasks wanted */
            sc.rsplit = C4 >= tw ? 1 : (tw + C4 - 1) / C4;
            sc.rsplit = sc.rsplit > Hq ? Hq : sc.rsplit;
            sc.ntasks = (C4 >= tw ? tw : C4) * sc.rsplit;
        }
        inferd_parallel(q8_stage_task, &sc, sc.ntasks, swork < 65536 ? 1 : max_threads);
    }
    pbs = (int)((tiles + best_nb - 1) / best_nb * unit);
    const long long pblocks = (npx + pbs - 1) / pbs;
    const long long nchunk = (nrows + best_ch - 1) / best_ch * rows, chunks = (N + nchunk - 1) / nchunk;
    q8_conv_ctx c = {isa, st, goff, wp, be, mp, N, kp, zy, lo, hi, OH, OW, Wv, npx, (uint8_t*)y, pbs, pblocks,
                     nchunk, mode, 0, amx, C4m, taps, 4LL * sh * sw * vplane, q8_amx_kb(C4m),
                     (const uint8_t*)x, self_stage, C, zxd, x_signed != dom_signed ? 0x80 : 0};
    if (!sc.failed)
        inferd_parallel(mode == 1 ? q8_convn_task : q8_conv_task, &c, pblocks * chunks,
                        npx * (long long)N * kp < 200000 ? 1 : max_threads);
    free(goff);
    free(be);
    return sc.failed || c.failed ? -1 : 0;
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
    int ntasks;
    const void* dww; /* the window kernel's tables (q8_dww_t), or NULL */
} q8_dw_ctx;

/* Small loops kept out of line, so the compiler vectorises each as written instead of fusing neighbours
   (unroll-and-jam of the tap loop gave a scalar loop). */
INFERD_CLONES __attribute__((noinline)) static void q8_axpy(float* restrict y, const float* restrict x, float a,
                                                             long long n)
{
    for (long long q = 0; q < n; ++q) y[q] += x[q] * a;
}

INFERD_CLONES __attribute__((noinline)) static void q8_centre(float* restrict d, const uint8_t* restrict s, int step,
                                                               int n, int x_signed, int zx)
{
    if (step == 1) {
        if (x_signed)
            for (int u = 0; u < n; ++u) d[u] = (float)((int32_t)(int8_t)s[u] - zx);
        else
            for (int u = 0; u < n; ++u) d[u] = (float)((int32_t)s[u] - zx);
    } else {
        if (x_signed)
            for (int u = 0; u < n; ++u) d[u] = (float)((int32_t)(int8_t)s[(long)u * step] - zx);
        else
            for (int u = 0; u < n; ++u) d[u] = (float)((int32_t)s[(long)u * step] - zx);
    }
}

/* 3x3 depthwise in one pass: the nine taps summed in registers, then requantised and stored as bytes (instead
   of nine passes over a float accumulator and a tenth to requantise). */
INFERD_CLONES __attribute__((noinline)) static void q8_dw9(const float* restrict p0, const float* restrict p1,
                                                            const float* restrict p2, const float* restrict p3,
                                                            const float* restrict p4, const float* restrict p5,
                                                            const float* restrict p6, const float* restrict p7,
                                                            const float* restrict p8, const float* w, long long n,
                                                            int32_t b, float m, float flo, float fhi, int zy,
                                                            uint8_t* restrict qb)
{
    const float w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4], w5 = w[5], w6 = w[6], w7 = w[7], w8 = w[8];
    for (long long q = 0; q < n; ++q) {
        const float a = p0[q] * w0 + p1[q] * w1 + p2[q] * w2 + p3[q] * w3 + p4[q] * w4 + p5[q] * w5 + p6[q] * w6 +
                        p7[q] * w7 + p8[q] * w8;
        float v = (float)((int32_t)a + b) * m;
        v = v < flo ? flo : (v > fhi ? fhi : v);
        qb[q] = (uint8_t)((int)q8_rint(v) + zy);
    }
}

/* Fields are copied to locals: stores through the int32/int8 buffers could alias the context's ints, which
   would keep the compiler from vectorising the loops. */
/* Scratch of one channel: the phase planes and the pitch-Wq accumulator (kh*kw < 512), or the int32 rows. */
typedef struct {
    float* xp;
    float* ap;
    size_t xp_floats;
    int32_t* acc;
    int32_t* xr;
} q8_dw_scratch;

static void q8_dw_geom(const q8_dw_ctx* c, int* Hq, int* Wq)
{
    const int Hpad = (c->OH - 1) * c->sh + (c->kh - 1) * c->dh + 1, Wpad = (c->OW - 1) * c->sw + (c->kw - 1) * c->dw + 1;
    *Hq = (Hpad + c->sh - 1) / c->sh + 1;
    *Wq = (Wpad + c->sw - 1) / c->sw;
}

INFERD_CLONES static void q8_dw_channel(const q8_dw_ctx* c, long long ch, const q8_dw_scratch* sc)
{
    const int H = c->H, W = c->W, OH = c->OH, OW = c->OW, kh = c->kh, kw = c->kw, sh = c->sh, sw = c->sw;
    const int dh = c->dh, dw = c->dw, pt = c->pt, pl = c->pl, zx = c->zx, zy = c->zy, x_signed = c->x_signed;
    int32_t* acc = sc->acc;
    int32_t* xr = sc->xr;
    const size_t plane = (size_t)H * W;
    const int8_t* wc = c->w + (size_t)ch * kh * kw;
    const float m = c->mult[ch], flo = (float)(c->lo - zy), fhi = (float)(c->hi - zy);
    const int32_t b = c->bias ? c->bias[ch] : 0;
    const uint8_t* xc = c->x + ch * plane;
    int8_t* ys = (int8_t*)c->y + ch * (size_t)OH * OW;
    uint8_t* yu = (uint8_t*)c->y + ch * (size_t)OH * OW;
    const int y_signed = c->y_signed;
    if (kh * kw < 512) {
        /* The centred input, padded, split into sh x sw phase planes (row r, column c of the padded input goes to
           phase (r % sh, c % sw) at (r / sh, c / sw)), each Hq x Wq. The output is computed at pitch Wq (the
           extra columns are dropped at the store): tap (i, j) then reads phase ((i dh) % sh, (j dw) % sw) at a
           fixed offset, so every tap is one long contiguous loop, strided convolutions included. In float:
           products of 8-bit values and their sums over kh*kw < 512 taps stay below 2^24, so every float here is
           an exact integer, and float FMAs are faster than int32 multiplies (vpmulld) on x86. */
        const int Hpad = (OH - 1) * sh + (kh - 1) * dh + 1, Wpad = (OW - 1) * sw + (kw - 1) * dw + 1;
        int Hq, Wq;
        q8_dw_geom(c, &Hq, &Wq);
        const size_t qplane = (size_t)Hq * Wq;
        float* xp = sc->xp;
        float* ap = sc->ap;
        memset(xp, 0, sizeof(float) * sc->xp_floats); /* the pads read zero (the centred zero point) */
        for (int r = 0; r < Hpad; ++r) {
            const int ih = r - pt;
            if (ih < 0 || ih >= H) continue;
            const uint8_t* src = xc + (size_t)ih * W;
            const int c0 = pl > 0 ? pl : 0, iw0 = c0 - pl;
            const int n = (W - iw0) < (Wpad - c0) ? (W - iw0) : (Wpad - c0);
            float* row0 = xp + (size_t)(r % sh) * sw * qplane + (size_t)(r / sh) * Wq;
            /* phase cp of this row: padded columns cp, cp + sw, ... -> positions 0, 1, ... of its plane row */
            for (int cp = 0; cp < sw; ++cp) {
                float* restrict d = row0 + (size_t)cp * qplane;
                const uint8_t* restrict sp = src;
                /* padded column col = cp + u*sw holds input column col - pl, inside [iw0, iw0 + n) */
                int u0 = c0 - cp > 0 ? (c0 - cp + sw - 1) / sw : 0;
                int u1 = (c0 + n - cp) > 0 ? (c0 + n - cp + sw - 1) / sw : 0;
                const int off = cp - pl;
                if (u1 > u0) q8_centre(d + u0, sp + (long)u0 * sw + off, sw, u1 - u0, x_signed, zx);
            }
        }
        const long long total = (long long)OH * Wq;
        if (kh == 3 && kw == 3) {
            const float* tp[9];
            float wf[9];
            for (int i = 0; i < 3; ++i)
                for (int j = 0; j < 3; ++j) {
                    const int ri = i * dh, cj = j * dw;
                    tp[i * 3 + j] = xp + ((size_t)(ri % sh) * sw + (size_t)(cj % sw)) * qplane + (size_t)(ri / sh) * Wq + cj / sw;
                    wf[i * 3 + j] = (float)wc[i * 3 + j];
                }
            uint8_t* qb = (uint8_t*)ap; /* OH * Wq floats: room for as many bytes */
            q8_dw9(tp[0], tp[1], tp[2], tp[3], tp[4], tp[5], tp[6], tp[7], tp[8], wf, total, b, m, flo, fhi, zy, qb);
            for (int oh = 0; oh < OH; ++oh) memcpy(yu + (size_t)oh * OW, qb + (size_t)oh * Wq, (size_t)OW);
            (void)ys;
            (void)y_signed;
            return;
        }
        for (long long q = 0; q < total; ++q) ap[q] = 0.0f;
        for (int i = 0; i < kh; ++i)
            for (int j = 0; j < kw; ++j) {
                const float wv = (float)wc[i * kw + j];
                const int ri = i * dh, cj = j * dw;
                const float* restrict xs =
                    xp + ((size_t)(ri % sh) * sw + (size_t)(cj % sw)) * qplane + (size_t)(ri / sh) * Wq + cj / sw;
                q8_axpy(ap, xs, wv, total);
            }
        /* requantise the whole pitch-Wq plane in one long loop (an int8 result has the bit pattern of its
           uint8 cast, so one loop serves both), then copy the OW valid bytes of each row */
        uint8_t* qb = (uint8_t*)xp; /* the phases are no longer needed; they hold more than OH * Wq bytes */
        for (long long q = 0; q < total; ++q) {
            float v = (float)((int32_t)ap[q] + b) * m;
            v = v < flo ? flo : (v > fhi ? fhi : v);
            qb[q] = (uint8_t)((int)q8_rint(v) + zy);
        }
        for (int oh = 0; oh < OH; ++oh) memcpy(yu + (size_t)oh * OW, qb + (size_t)oh * Wq, (size_t)OW);
        (void)ys;
        (void)y_signed;
        return;
    }
    for (int oh = 0; oh < OH; ++oh) {
        for (int ow = 0; ow < OW; ++ow) acc[ow] = b;
        for (int i = 0; i < kh; ++i) {
            const int ih = oh * sh - pt + i * dh;
            if (ih < 0 || ih >= H) continue; /* padding reads the zero point: (zx - zx) * w = 0 */
            const uint8_t* src = xc + (size_t)ih * W;
            if (x_signed)
                for (int iw = 0; iw < W; ++iw) xr[iw] = (int32_t)(int8_t)src[iw] - zx;
            else
                for (int iw = 0; iw < W; ++iw) xr[iw] = (int32_t)src[iw] - zx;
            for (int j = 0; j < kw; ++j) {
                const int32_t wv = wc[i * kw + j];
                const int off = j * dw - pl;
                /* ow range whose input column ow*sw + off lies in [0, W) */
                const int lo_ow = off >= 0 ? 0 : (-off + sw - 1) / sw;
                int hi_ow = (W - 1 - off) >= 0 ? (W - 1 - off) / sw + 1 : 0;
                if (hi_ow > OW) hi_ow = OW;
                if (sw == 1) {
                    const int32_t* xs = xr + off;
                    for (int ow = lo_ow; ow < hi_ow; ++ow) acc[ow] += xs[ow] * wv;
                } else {
                    for (int ow = lo_ow; ow < hi_ow; ++ow) acc[ow] += xr[ow * sw + off] * wv;
                }
            }
        }
        const size_t at = (size_t)oh * OW;
        if (y_signed) {
            for (int ow = 0; ow < OW; ++ow) {
                float v = (float)acc[ow] * m;
                v = v < flo ? flo : (v > fhi ? fhi : v);
                ys[at + ow] = (int8_t)((int)q8_rint(v) + zy);
            }
        } else {
            for (int ow = 0; ow < OW; ++ow) {
                float v = (float)acc[ow] * m;
                v = v < flo ? flo : (v > fhi ? fhi : v);
                yu[at + ow] = (uint8_t)((int)q8_rint(v) + zy);
            }
        }
    }
}

/* ---------------------------------------------------------------- depthwise fast path: kxk (k 3 or 5), stride 1 or
   2, dilation 1, on x86-64 with AVX2+FMA (aarch64: q8_dwf_sdot below). 8 output pixels of a row per step in vector
   registers: no per-row scalar tails and no float planes in memory. The channel is copied once into a padded
   byte plane (pads hold the zero point) in the unsigned domain, so every tap of an 8-pixel step is one unaligned
   load of that plane: 8 bytes at stride 1; 16 bytes at stride 2, split into the even and the odd columns. Sums
   are of raw x' * w in float (exact: k*k*255*128 < 2^24), one accumulator per kernel row (short dependency
   chains), and the zero point comes off as - zx' * sum(w) with the bias. Requantised as q8_block does: float
   product, clamp, round half to even by the 1.5*2^23 trick, plus zy. (GCC's generic vector types were tried
   first: it lowers their 8-to-32-bit conversions to scalar code.) */
typedef void (*q8_dwf_fn)(const uint8_t* P, int Wb, const int8_t* wc, int K, int S, int OH, int OW, int32_t beff,
                          float m, float flo, float fhi, int zy, uint8_t* y);

/* a row kernel's body instantiated for the (k, stride) pairs of the fast path, so each loop nest is compiled
   with constant trip counts */
#define Q8_DWF_DISPATCH(BODY)                                                                                      \
    do {                                                                                                           \
        if (K == 3 && S == 1)                                                                                      \
            BODY(P, Wb, wc, 3, 1, OH, OW, beff, m, flo, fhi, zy, y);                                               \
        else if (K == 3)                                                                                           \
            BODY(P, Wb, wc, 3, 2, OH, OW, beff, m, flo, fhi, zy, y);                                               \
        else if (S == 1)                                                                                           \
            BODY(P, Wb, wc, 5, 1, OH, OW, beff, m, flo, fhi, zy, y);                                               \
        else                                                                                                       \
            BODY(P, Wb, wc, 5, 2, OH, OW, beff, m, flo, fhi, zy, y);                                               \
    } while (0)

/* an 8-byte step result: a whole 8-byte store spills into the next row, which is written after it; never past
   the channel's plane */
INFERD_INLINE void q8_dwf_put(uint8_t* y, long long at, long long plane, int room, const uint8_t* out8)
{
    if (at + 8 <= plane)
        memcpy(y + at, out8, 8);
    else
        memcpy(y + at, out8, (size_t)(room < 8 ? room : 8));
}

#if defined(__x86_64__) && defined(__GNUC__)
#define Q8_DWF_AVX2 1
#define Q8_AVX2 __attribute__((target("avx2,fma")))
Q8_AVX2 static inline __attribute__((always_inline)) __m256 q8_ld8_avx2(const uint8_t* p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}

Q8_AVX2 static inline __attribute__((always_inline)) void q8_dwf_body_avx2(
    const uint8_t* P, int Wb, const int8_t* wc, const int K, const int S, int OH, int OW, int32_t beff, float m,
    float flo, float fhi, int zy, uint8_t* y)
{
    __m256 wv[25];
    for (int t = 0; t < K * K; ++t) wv[t] = _mm256_set1_ps((float)wc[t]);
    const __m256i bv = _mm256_set1_epi32(beff), zv = _mm256_set1_epi32(zy), lowbyte = _mm256_set1_epi32(0xff);
    const __m128i lowb16 = _mm_set1_epi16(0xff);
    const __m256 lo = _mm256_set1_ps(flo), hi = _mm256_set1_ps(fhi), mv = _mm256_set1_ps(m);
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    const long long plane = (long long)OH * OW;
    for (int oh = 0; oh < OH; ++oh) {
        for (int ow0 = 0; ow0 < OW; ow0 += 8) {
            __m256 acc[5];
            for (int i = 0; i < K; ++i) {
                const uint8_t* r = P + (long long)(oh * S + i) * Wb + (long long)ow0 * S;
                __m256 a = _mm256_setzero_ps();
                if (S == 1) {
                    for (int j = 0; j < K; ++j) a = _mm256_fmadd_ps(q8_ld8_avx2(r + j), wv[i * K + j], a);
                } else {
                    for (int j = 0; j < K; j += 2) {
                        const __m128i h = _mm_loadu_si128((const __m128i*)(r + j));
                        const __m256 ev = _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(_mm_and_si128(h, lowb16)));
                        a = _mm256_fmadd_ps(ev, wv[i * K + j], a);
                        if (j + 1 < K) {
                            const __m256 od = _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(_mm_srli_epi16(h, 8)));
                            a = _mm256_fmadd_ps(od, wv[i * K + j + 1], a);
                        }
                    }
                }
                acc[i] = a;
            }
            __m256 s = acc[0];
            for (int i = 1; i < K; ++i) s = _mm256_add_ps(s, acc[i]);
            __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_cvttps_epi32(s), bv)), mv);
            v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
            v = _mm256_sub_ps(_mm256_add_ps(v, magic), magic);
            const __m256i q = _mm256_and_si256(_mm256_add_epi32(_mm256_cvttps_epi32(v), zv), lowbyte);
            const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
            uint8_t out8[16];
            _mm_storeu_si128((__m128i*)out8, _mm_packus_epi16(w16, w16));
            q8_dwf_put(y, (long long)oh * OW + ow0, plane, OW - ow0, out8);
        }
    }
}

Q8_AVX2 static void q8_dwf_avx2(const uint8_t* P, int Wb, const int8_t* wc, int K, int S, int OH, int OW, int32_t beff,
                                float m, float flo, float fhi, int zy, uint8_t* y)
{
    Q8_DWF_DISPATCH(q8_dwf_body_avx2);
}
/* The same step at 16 pixels on AVX-512 (one zmm per load, masked stores for a row's tail): half the
   instructions per pixel on rows of 14 and more. */
#define Q8_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
Q8_AVX512 static inline __attribute__((always_inline)) void q8_dwf_body_avx512(
    const uint8_t* P, int Wb, const int8_t* wc, const int K, const int S, int OH, int OW, int32_t beff, float m,
    float flo, float fhi, int zy, uint8_t* y)
{
    __m512 wv[25];
    for (int t = 0; t < K * K; ++t) wv[t] = _mm512_set1_ps((float)wc[t]);
    const __m512i bv = _mm512_set1_epi32(beff), zv = _mm512_set1_epi32(zy);
    const __m256i lowb16 = _mm256_set1_epi16(0xff);
    const __m512 lo = _mm512_set1_ps(flo), hi = _mm512_set1_ps(fhi), mv = _mm512_set1_ps(m);
    for (int oh = 0; oh < OH; ++oh) {
        for (int ow0 = 0; ow0 < OW; ow0 += 16) {
            __m512 acc[5];
            for (int i = 0; i < K; ++i) {
                const uint8_t* r = P + (long long)(oh * S + i) * Wb + (long long)ow0 * S;
                __m512 a = _mm512_setzero_ps();
                if (S == 1) {
                    for (int j = 0; j < K; ++j)
                        a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(r + j)))),
                                            wv[i * K + j], a);
                } else {
                    for (int j = 0; j < K; j += 2) {
                        const __m256i h = _mm256_loadu_si256((const __m256i*)(r + j));
                        a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm256_and_si256(h, lowb16))),
                                            wv[i * K + j], a);
                        if (j + 1 < K)
                            a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(_mm256_srli_epi16(h, 8))),
                                                wv[i * K + j + 1], a);
                    }
                }
                acc[i] = a;
            }
            __m512 s = acc[0];
            for (int i = 1; i < K; ++i) s = _mm512_add_ps(s, acc[i]);
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_cvttps_epi32(s), bv)), mv);
            v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
            const __m512i q =
                _mm512_add_epi32(_mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zv);
            const int n = OW - ow0 < 16 ? OW - ow0 : 16;
            _mm_mask_storeu_epi8((void*)(y + (long long)oh * OW + ow0), (__mmask16)((1u << n) - 1),
                                 _mm512_cvtepi32_epi8(q));
        }
    }
}

Q8_AVX512 static void q8_dwf_avx512(const uint8_t* P, int Wb, const int8_t* wc, int K, int S, int OH, int OW,
                                    int32_t beff, float m, float flo, float fhi, int zy, uint8_t* y)
{
    Q8_DWF_DISPATCH(q8_dwf_body_avx512);
}
#endif


#if defined(Q8_HAVE_SDOT)
#define Q8_DWF_SDOT 1
/* aarch64 with dotprod: the plane is staged in the signed domain (as the sdot GEMM reads x), and each group of 4
   output pixels of a kernel row takes its taps from one 16-byte load, gathered into 4 lanes of 4 bytes by a table
   lookup (taps x[ow*S + j], j < 4; a 3-tap row padded with a zero weight, a 5-tap row as two groups of 4, the second
   padded with three), then one sdot with the row's weights in every lane: 3 instructions per 4 pixels and row where
   the float rows took ~8 per pixel pair. G groups of 4 pixels a step (16; 8 on maps at most 8 wide), G independent
   sums; exact int32 sums with the bias (beff) added first; requantised as the float rows are. */
__attribute__((target("arch=armv8.2-a+dotprod"))) static inline __attribute__((always_inline)) void
q8_dwf_body_sdot(const uint8_t* P, int Wb, const int8_t* wc, const int K, const int S, int OH, int OW, int32_t beff,
                 float m, float flo, float fhi, int zy, uint8_t* y, const int G)
{
    static const uint8_t TAPS[2][16] = {{0, 1, 2, 3, 1, 2, 3, 4, 2, 3, 4, 5, 3, 4, 5, 6},
                                        {0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7, 8, 9}};
    int8x16_t wa[5], wb[5];
    for (int i = 0; i < K; ++i) {
        int8_t a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
        for (int j = 0; j < K; ++j) (j < 4 ? a : b)[j & 3] = wc[i * K + j];
        int32_t pa, pb;
        memcpy(&pa, a, 4);
        memcpy(&pb, b, 4);
        wa[i] = vreinterpretq_s8_s32(vdupq_n_s32(pa));
        wb[i] = vreinterpretq_s8_s32(vdupq_n_s32(pb));
    }
    const uint8x16_t ia = vld1q_u8(TAPS[S - 1]), ib = vaddq_u8(ia, vdupq_n_u8(4));
    const int32x4_t zv = vdupq_n_s32(zy);
    const float32x4_t lo = vdupq_n_f32(flo), hi = vdupq_n_f32(fhi), magic = vdupq_n_f32(12582912.0f);
    const long long plane = (long long)OH * OW;
    for (int oh = 0; oh < OH; ++oh) {
        for (int ow0 = 0; ow0 < OW; ow0 += 4 * G) {
            int32x4_t a[4];
            for (int g = 0; g < G; ++g) a[g] = vdupq_n_s32(beff);
            const int8_t* r = (const int8_t*)P + (long long)oh * S * Wb + (long long)ow0 * S;
            for (int i = 0; i < K; ++i, r += Wb) {
                for (int g = 0; g < G; ++g) {
                    const int8x16_t v = vld1q_s8(r + 4 * g * S);
                    a[g] = vdotq_s32(a[g], vqtbl1q_s8(v, ia), wa[i]);
                    if (K == 5) a[g] = vdotq_s32(a[g], vqtbl1q_s8(v, ib), wb[i]);
                }
            }
            uint16x4_t q[4];
            for (int g = 0; g < G; ++g) {
                float32x4_t v = vmulq_n_f32(vcvtq_f32_s32(a[g]), m);
                v = vminq_f32(vmaxq_f32(v, lo), hi);
                v = vsubq_f32(vaddq_f32(v, magic), magic);
                q[g] = vmovn_u32(vreinterpretq_u32_s32(vaddq_s32(vcvtq_s32_f32(v), zv)));
            }
            uint8_t out[16];
            const long long at = (long long)oh * OW + ow0;
            vst1_u8(out, vmovn_u16(vcombine_u16(q[0], q[1])));
            q8_dwf_put(y, at, plane, OW - ow0, out);
            if (G == 4 && ow0 + 8 < OW) {
                vst1_u8(out + 8, vmovn_u16(vcombine_u16(q[2], q[3])));
                q8_dwf_put(y, at + 8, plane, OW - ow0 - 8, out + 8);
            }
        }
    }
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static inline __attribute__((always_inline)) void
q8_dwf_body_sdot8(const uint8_t* P, int Wb, const int8_t* wc, const int K, const int S, int OH, int OW, int32_t beff,
                  float m, float flo, float fhi, int zy, uint8_t* y)
{
    q8_dwf_body_sdot(P, Wb, wc, K, S, OH, OW, beff, m, flo, fhi, zy, y, 2);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static inline __attribute__((always_inline)) void
q8_dwf_body_sdot16(const uint8_t* P, int Wb, const int8_t* wc, const int K, const int S, int OH, int OW, int32_t beff,
                   float m, float flo, float fhi, int zy, uint8_t* y)
{
    q8_dwf_body_sdot(P, Wb, wc, K, S, OH, OW, beff, m, flo, fhi, zy, y, 4);
}

__attribute__((target("arch=armv8.2-a+dotprod"))) static void q8_dwf_sdot(const uint8_t* P, int Wb, const int8_t* wc,
                                                                             int K, int S, int OH, int OW, int32_t beff,
                                                                             float m, float flo, float fhi, int zy,
                                                                             uint8_t* y)
{
    if (OW <= 8)
        Q8_DWF_DISPATCH(q8_dwf_body_sdot8);
    else
        Q8_DWF_DISPATCH(q8_dwf_body_sdot16);
}
#endif

/* tests (Q8_CAP_AVX512): 1 keeps depthwise rows, MaxPool, QLinearAdd and table lookups off AVX-512, and the next
   inferd_q8_set_isa(1 or -1) on the AVX2 kernels */
int inferd_q8_cap_avx512(int cap)
{
    __atomic_store_n(&Q8_CAP_AVX512, cap, __ATOMIC_RELAXED);
    return cap;
}

static int Q8_DWR_OFF; /* tests and A/B: 1 keeps the depthwise rows-of-4 kernel off */

int inferd_q8_set_dw_rows(int on)
{
    return !__atomic_exchange_n(&Q8_DWR_OFF, on ? 0 : 1, __ATOMIC_RELAXED);
}

/* the fast path's row kernel on this CPU, or NULL (other CPUs, or the portable kernels forced for tests) */
#if defined(__x86_64__) && defined(__GNUC__)
#define Q8_DWV 1
#define Q8_DWV_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")))
/* Depthwise on VNNI: lane k of a vector is one output pixel, its 4 bytes the input bytes under 4 consecutive taps
   of one kernel row (a window of the padded row, gathered from one 64-byte load by vpermb), the weights those
   taps' (zero past K) broadcast: one vpdpbusd per kernel row (two for 5 taps), int32 sums exact, where the float
   row kernels converted and multiplied each tap. On maps of OW <= 16 a vector holds R whole output rows (R OW
   lanes: 7x7 maps fill 14 of 16, not 7), else 16 columns of one row. idx: 64 byte indices per dword q (q = 1:
   taps 4..7). Four vectors at a time, each with its own accumulator (one chain of dependent dot products per
   vector stalled on their latency). */
typedef struct {
    int R;   /* output rows per vector (0: 16 columns of one row per vector) */
    int nv;  /* vectors per channel */
    uint8_t idx[128] __attribute__((aligned(64)));
} q8_dwv_t;

/* Kernel row i's taps broadcast as dwords, w0[i] taps 0-3 and w1[i] taps 4-7 (zero past K), built in registers:
   bytes stored to the stack and read back as a dword (a call to memcpy, K not being a constant) stalled store
   forwarding (7x7 maps ran 0.82x as long without) */
Q8_DWV_TARGET static inline __attribute__((always_inline)) void q8_dw_row_weights(const int8_t* wc, int K, __m512i* w0,
                                                                                 __m512i* w1)
{
    for (int i = 0; i < K; ++i) {
        uint32_t a = 0, b = 0;
        for (int j = 0; j < K && j < 4; ++j) a |= (uint32_t)(uint8_t)wc[i * K + j] << (8 * j);
        for (int j = 4; j < K; ++j) b |= (uint32_t)(uint8_t)wc[i * K + j] << (8 * (j - 4));
        w0[i] = _mm512_set1_epi32((int32_t)a);
        w1[i] = _mm512_set1_epi32((int32_t)b);
    }
}

Q8_DWV_TARGET static void q8_dwv_vnni(const uint8_t* P, int Wb, const int8_t* wc, int K, int S, int OH, int OW,
                                      const q8_dwv_t* g, int32_t beff, float m, float flo, float fhi, int zy,
                                      uint8_t* y)
{
    const __m512i i0 = _mm512_load_si512((const void*)g->idx), i1 = _mm512_load_si512((const void*)(g->idx + 64));
    __m512i w0[5], w1[5];
    q8_dw_row_weights(wc, K, w0, w1);
    const __m512i bv = _mm512_set1_epi32(beff), zv = _mm512_set1_epi32(zy);
    const __m512i z = _mm512_setzero_si512(); /* q8_req16 adds nothing: the sums start from bv */
    const __m512 lo = _mm512_set1_ps(flo), hi = _mm512_set1_ps(fhi), mv = _mm512_set1_ps(m);
    const int steps = (OW + 15) / 16;
    int oh = 0, cs = 0; /* the next vector's first output row, and its 16-column step (R == 0) */
    for (int v0 = 0; v0 < g->nv; v0 += 4) {
        long long base[4], out[4];
        int cnt[4];
        const int nb = g->nv - v0 < 4 ? g->nv - v0 : 4;
        for (int u = 0; u < 4; ++u) {
            if (u >= nb) {
                base[u] = base[0], out[u] = out[0], cnt[u] = 0;
                continue;
            }
            base[u] = (long long)oh * S * Wb + 16LL * cs * S;
            out[u] = (long long)oh * OW + 16 * cs;
            if (g->R) {
                cnt[u] = (OH - oh < g->R ? OH - oh : g->R) * OW;
                oh += g->R;
            } else {
                cnt[u] = OW - 16 * cs < 16 ? OW - 16 * cs : 16;
                if (++cs == steps) cs = 0, ++oh;
            }
        }
        __m512i a0 = bv, a1 = bv, a2 = bv, a3 = bv;
        for (int i = 0; i < K; ++i) {
            const uint8_t* r = P + (long long)i * Wb;
            const __m512i x0 = _mm512_loadu_si512((const void*)(r + base[0])),
                          x1 = _mm512_loadu_si512((const void*)(r + base[1])),
                          x2 = _mm512_loadu_si512((const void*)(r + base[2])),
                          x3 = _mm512_loadu_si512((const void*)(r + base[3]));
            a0 = _mm512_dpbusd_epi32(a0, _mm512_permutexvar_epi8(i0, x0), w0[i]);
            a1 = _mm512_dpbusd_epi32(a1, _mm512_permutexvar_epi8(i0, x1), w0[i]);
            a2 = _mm512_dpbusd_epi32(a2, _mm512_permutexvar_epi8(i0, x2), w0[i]);
            a3 = _mm512_dpbusd_epi32(a3, _mm512_permutexvar_epi8(i0, x3), w0[i]);
            if (K > 4) {
                a0 = _mm512_dpbusd_epi32(a0, _mm512_permutexvar_epi8(i1, x0), w1[i]);
                a1 = _mm512_dpbusd_epi32(a1, _mm512_permutexvar_epi8(i1, x1), w1[i]);
                a2 = _mm512_dpbusd_epi32(a2, _mm512_permutexvar_epi8(i1, x2), w1[i]);
                a3 = _mm512_dpbusd_epi32(a3, _mm512_permutexvar_epi8(i1, x3), w1[i]);
            }
        }
        const __m512i acc[4] = {a0, a1, a2, a3};
        for (int u = 0; u < nb; ++u)
            _mm_mask_storeu_epi8((void*)(y + out[u]), (__mmask16)((1u << cnt[u]) - 1),
                                 q8_req16(acc[u], z, mv, lo, hi, zv));
    }
}
/* The same lanes (16 columns of one output row, R == 0) with 4 output rows at a time: each input row is loaded and
   gathered once and its dwords go to every output row that reads it (3 of 4 rows share a 3x3 kernel's rows at
   stride 1), where the one-row kernel gathered each input row K times: 14 instructions a vector against 17 at
   3x3 stride 1. Rows past OH are not computed: the last block starts at OH - 4 (rows computed twice, the same
   bytes written). */
Q8_DWV_TARGET static inline __attribute__((always_inline)) void q8_dwr_body(
    const uint8_t* P, int Wb, const int8_t* wc, const int K, const int S, int OH, int OW, const q8_dwv_t* g,
    int32_t beff, float m, float flo, float fhi, int zy, uint8_t* y)
{
    enum { RB = 4 };
    const __m512i i0 = _mm512_load_si512((const void*)g->idx), i1 = _mm512_load_si512((const void*)(g->idx + 64));
    __m512i w0[5], w1[5];
    q8_dw_row_weights(wc, K, w0, w1);
    const __m512i bv = _mm512_set1_epi32(beff), zv = _mm512_set1_epi32(zy);
    const __m512i z = _mm512_setzero_si512(); /* q8_req16 adds nothing: the sums start from bv */
    const __m512 lo = _mm512_set1_ps(flo), hi = _mm512_set1_ps(fhi), mv = _mm512_set1_ps(m);
    for (int c0 = 0; c0 < OW; c0 += 16) {
        const int cnt = OW - c0 < 16 ? OW - c0 : 16;
        const __mmask16 mk = (__mmask16)((1u << cnt) - 1);
        for (int o0 = 0; o0 < OH; o0 += RB) {
            const int ob = o0 + RB <= OH ? o0 : OH - RB;
            __m512i acc[RB];
            for (int r = 0; r < RB; ++r) acc[r] = bv;
            const uint8_t* base = P + (long long)ob * S * Wb + (long long)c0 * S;
            for (int ir = 0; ir < (RB - 1) * S + K; ++ir) {
                const __m512i x = _mm512_loadu_si512((const void*)(base + (long long)ir * Wb));
                const __m512i p0 = _mm512_permutexvar_epi8(i0, x);
                const __m512i p1 = K > 4 ? _mm512_permutexvar_epi8(i1, x) : p0;
                for (int r = 0; r < RB; ++r) {
                    const int i = ir - r * S;
                    if (i < 0 || i >= K) continue;
                    acc[r] = _mm512_dpbusd_epi32(acc[r], p0, w0[i]);
                    if (K > 4) acc[r] = _mm512_dpbusd_epi32(acc[r], p1, w1[i]);
                }
            }
            for (int r = 0; r < RB; ++r)
                _mm_mask_storeu_epi8((void*)(y + (long long)(ob + r) * OW + c0), mk,
                                     q8_req16(acc[r], z, mv, lo, hi, zv));
        }
    }
}

Q8_DWV_TARGET static void q8_dwr_vnni(const uint8_t* P, int Wb, const int8_t* wc, int K, int S, int OH, int OW,
                                      const q8_dwv_t* g, int32_t beff, float m, float flo, float fhi, int zy,
                                      uint8_t* y)
{
    if (K == 3 && S == 1)
        q8_dwr_body(P, Wb, wc, 3, 1, OH, OW, g, beff, m, flo, fhi, zy, y);
    else if (K == 3)
        q8_dwr_body(P, Wb, wc, 3, 2, OH, OW, g, beff, m, flo, fhi, zy, y);
    else if (S == 1)
        q8_dwr_body(P, Wb, wc, 5, 1, OH, OW, g, beff, m, flo, fhi, zy, y);
    else
        q8_dwr_body(P, Wb, wc, 5, 2, OH, OW, g, beff, m, flo, fhi, zy, y);
}
#endif


static q8_dwf_fn q8_dwf_kernel(void)
{
    if (q8_isa() == &Q8_PORTABLE) return NULL;
#if defined(Q8_DWF_AVX2)
    const int f = q8_cpu();
    if ((f & Q8_F_AVX512BW) && (f & Q8_F_FMA) && __atomic_load_n(&Q8_CAP_AVX512, __ATOMIC_RELAXED) != 1)
        return q8_dwf_avx512;
    if ((f & Q8_F_AVX2) && (f & Q8_F_FMA)) return q8_dwf_avx2;
#endif
#if defined(Q8_DWF_SDOT)
    if (q8_isa()->xsigned) return q8_dwf_sdot;
#endif
    return NULL;
}

static int q8_dwf_applies(const q8_dw_ctx* c)
{
    return c->kh == c->kw && (c->kh == 3 || c->kh == 5) && c->sh == c->sw && (c->sh == 1 || c->sh == 2) &&
           c->dh == 1 && c->dw == 1 && c->pt >= 0 && c->pl >= 0 && q8_dwf_kernel() != NULL;
}

/* plane geometry: rows read, row pitch (room for the last step's whole-vector reads) */
static void q8_dwf_geom(const q8_dw_ctx* c, int* Hp, int* Wb)
{
    const int S = c->sh, K = c->kh, Wv = (c->OW + 15) / 16 * 16; /* whole 16-pixel steps (8 on AVX2) */
    *Hp = (c->OH - 1) * S + K;
    *Wb = (Wv * S + K + 32 + 15) & ~15;
}

static void q8_dwf_channel(const q8_dw_ctx* c, q8_dwf_fn fn, long long ch, uint8_t* P, int Hp, int Wb, int zxd,
                           uint8_t flip, const void* dwv)
{
    const int H = c->H, W = c->W, K = c->kh;
    const int8_t* wc = c->w + (size_t)ch * K * K;
    int32_t wsum = 0;
    for (int t = 0; t < K * K; ++t) wsum += wc[t];
    const int32_t beff = (c->bias ? c->bias[ch] : 0) - zxd * wsum;
    const uint8_t* xc = c->x + (size_t)ch * H * W;
    const int n = W < Wb - c->pl ? W : Wb - c->pl;
    for (int ih = 0; ih < H && ih + c->pt < Hp; ++ih) {
        uint8_t* d = P + (size_t)(ih + c->pt) * Wb + c->pl;
        const uint8_t* s = xc + (size_t)ih * W;
        if (flip)
            for (int u = 0; u < n; ++u) d[u] = s[u] ^ flip;
        else
            q8_cpy(d, s, n);
    }
#if defined(Q8_DWV)
    if (dwv && ((const q8_dwv_t*)dwv)->R == 0 && c->OH >= 4 && !__atomic_load_n(&Q8_DWR_OFF, __ATOMIC_RELAXED)) {
        q8_dwr_vnni(P, Wb, wc, K, c->sh, c->OH, c->OW, (const q8_dwv_t*)dwv, beff, c->mult[ch], (float)(c->lo - c->zy),
                    (float)(c->hi - c->zy), c->zy, (uint8_t*)c->y + (size_t)ch * c->OH * c->OW);
        return;
    }
    if (dwv) {
        q8_dwv_vnni(P, Wb, wc, K, c->sh, c->OH, c->OW, (const q8_dwv_t*)dwv, beff, c->mult[ch], (float)(c->lo - c->zy),
                    (float)(c->hi - c->zy), c->zy, (uint8_t*)c->y + (size_t)ch * c->OH * c->OW);
        return;
    }
#endif
    (void)dwv;
    fn(P, Wb, wc, K, c->sh, c->OH, c->OW, beff, c->mult[ch], (float)(c->lo - c->zy), (float)(c->hi - c->zy), c->zy,
       (uint8_t*)c->y + (size_t)ch * c->OH * c->OW);
}

/* channels [c0, c1) on the fast path; the plane's pads are written once (the rows copied in never touch them) */
#if defined(Q8_DWV)
/* The VNNI depthwise kernel's lane layout for this geometry over a plane of pitch Wb; 0 where the CPU lacks it
   or a window does not fit one 64-byte load. */
static int q8_dwv_plan(const q8_dw_ctx* c, int Wb, q8_dwv_t* g)
{
    const int f = q8_cpu(), K = c->kh, S = c->sh, OW = c->OW, OH = c->OH, span = K > 4 ? 8 : 4;
    if (q8_isa()->level != 1 || !(f & Q8_F_VBMI) || __atomic_load_n(&Q8_CAP_AVX512, __ATOMIC_RELAXED) == 1) return 0;
    int R = OW <= 16 ? 16 / OW : 0;
    while (R > 1 && (long long)(R - 1) * S * Wb + (OW - 1) * S + span > 64) --R;
    if (R == 1 && OW < 16 && (OW - 1) * S + span > 64) return 0;
    if (R == 0 && 15 * S + span > 64) return 0;
    g->R = R;
    g->nv = R ? (OH + R - 1) / R : OH * ((OW + 15) / 16);
    for (int k = 0; k < 16; ++k) {
        const int valid = R ? k < R * OW : 1, off = !valid ? 0 : (R ? (k / OW) * S * Wb + (k % OW) * S : k * S);
        for (int j = 0; j < 4; ++j) {
            g->idx[4 * k + j] = (uint8_t)(off + j);
            g->idx[64 + 4 * k + j] = (uint8_t)(valid && off + 4 + j < 64 ? off + 4 + j : 0);
        }
    }
    return 1;
}
#endif

static int Q8_DWW_OFF; /* tests and A/B: 1 keeps the window kernel off */

int inferd_q8_set_dw_window(int on)
{
    return !__atomic_exchange_n(&Q8_DWW_OFF, on ? 0 : 1, __ATOMIC_RELAXED);
}

#if defined(Q8_DWV)
/* Depthwise over windows of the plane, for maps whose every 16 output pixels read within 127 bytes of the input
   plane (7x7 and 14x14 maps at stride 1 or 2, 28x28 at stride 2; wider maps take the 4-row kernel): lane k of vector
   v is output pixel 16 v + k of the flat output plane, each dword of a lane 4 taps of the kernel in row-major order
   (5x5: 7 dwords, not 2 a row), gathered by vpermt2b from the 128 bytes [base_v, base_v + 127) of the channel's
   plane and a last byte holding the zero point, which every tap in the padding reads. No padded copy of the plane,
   no rows of 16 lanes with 14 or 7 in use, stores of whole 16-byte runs of the output: the padded-plane kernel spent
   most of a 7x7 or a strided map's time per channel, not per pixel. The tables (per vector its window's base and
   load masks, per vector and dword 64 byte indices) depend on the geometry only: built once and kept (Q8_DWW_CACHE
   geometries), as is a geometry's finding that some vector spans more than 127 bytes (ok 0: no tables), which is not
   searched for again. */
#define Q8_DWW_MAXV 64
#define Q8_DWW_CACHE 32
typedef struct {
    int H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW; /* the key */
    int nv, G, shared;                                /* shared: one window (base 0) for every vector */
    int ok;                                           /* 0: a vector spans too much; no tables */
    int32_t* base;
    uint64_t* lmask; /* per vector: bytes of [base, base + 64) and [base + 64, base + 127) inside the plane */
    uint8_t* idx;    /* [nv][G][64] */
} q8_dww_t;

static q8_dww_t* Q8_DWW[Q8_DWW_CACHE];
static int Q8_DWW_N;
static pthread_mutex_t Q8_DWW_LOCK = PTHREAD_MUTEX_INITIALIZER;

static int q8_dww_key(const q8_dww_t* g, const q8_dw_ctx* c)
{
    return g->H == c->H && g->W == c->W && g->kh == c->kh && g->kw == c->kw && g->sh == c->sh && g->sw == c->sw &&
           g->dh == c->dh && g->dw == c->dw && g->pt == c->pt && g->pl == c->pl && g->OH == c->OH && g->OW == c->OW;
}

static void q8_dww_free(q8_dww_t* g)
{
    if (!g) return;
    free(g->base);
    free(g->lmask);
    free(g->idx);
    free(g);
}

/* the tables for this geometry (ok 0, none, where a vector's taps span more than 127 bytes), or NULL (too many
   vectors, out of memory) */
static q8_dww_t* q8_dww_build(const q8_dw_ctx* c)
{
    const int H = c->H, W = c->W, OH = c->OH, OW = c->OW, T = c->kh * c->kw;
    const long long HW = (long long)H * W, nout = (long long)OH * OW;
    if (T > 28 || nout <= 0 || HW <= 0 || (nout + 15) / 16 > Q8_DWW_MAXV) return NULL;
    const int nv = (int)((nout + 15) / 16), G = (T + 3) / 4;
    q8_dww_t* g = (q8_dww_t*)calloc(1, sizeof(q8_dww_t));
    if (!g) return NULL;
    g->H = H, g->W = W, g->kh = c->kh, g->kw = c->kw, g->sh = c->sh, g->sw = c->sw, g->dh = c->dh, g->dw = c->dw;
    g->pt = c->pt, g->pl = c->pl, g->OH = OH, g->OW = OW, g->nv = nv, g->G = G, g->shared = HW <= 127;
    g->base = (int32_t*)malloc(sizeof(int32_t) * nv);
    g->lmask = (uint64_t*)malloc(sizeof(uint64_t) * 2 * nv);
    g->idx = (uint8_t*)aligned_alloc(64, (size_t)nv * G * 64);
    if (!g->base || !g->lmask || !g->idx) {
        q8_dww_free(g);
        return NULL;
    }
    for (int v = 0; v < nv; ++v) {
        long long lo = HW, hi = -1; /* the plane positions the vector's taps read */
        for (int k = 0; k < 16; ++k) {
            const long long p = 16LL * v + k;
            if (p >= nout) break;
            const int oh = (int)(p / OW), ow = (int)(p % OW);
            for (int t = 0; t < T; ++t) {
                const int ih = oh * c->sh - c->pt + (t / c->kw) * c->dh, iw = ow * c->sw - c->pl + (t % c->kw) * c->dw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const long long pos = (long long)ih * W + iw;
                lo = pos < lo ? pos : lo;
                hi = pos > hi ? pos : hi;
            }
        }
        if (g->shared || hi < 0) lo = 0;
        if (hi - lo > 126) {
            free(g->base), free(g->lmask), free(g->idx);
            g->base = NULL, g->lmask = NULL, g->idx = NULL;
            return g;
        }
        g->base[v] = (int32_t)lo;
        uint64_t m0 = 0, m1 = 0;
        for (int j = 0; j < 127; ++j)
            if (lo + j < HW) {
                if (j < 64)
                    m0 |= (uint64_t)1 << j;
                else
                    m1 |= (uint64_t)1 << (j - 64);
            }
        g->lmask[2 * v] = m0, g->lmask[2 * v + 1] = m1;
        for (int q = 0; q < G; ++q)
            for (int k = 0; k < 16; ++k)
                for (int b = 0; b < 4; ++b) {
                    const long long p = 16LL * v + k;
                    const int t = 4 * q + b;
                    uint8_t at = 127; /* the zero point: the padding, taps past the kernel, lanes past the plane */
                    if (p < nout && t < T) {
                        const int oh = (int)(p / OW), ow = (int)(p % OW);
                        const int ih = oh * c->sh - c->pt + (t / c->kw) * c->dh;
                        const int iw = ow * c->sw - c->pl + (t % c->kw) * c->dw;
                        if (ih >= 0 && ih < H && iw >= 0 && iw < W) at = (uint8_t)((long long)ih * W + iw - lo);
                    }
                    g->idx[((size_t)v * G + q) * 64 + 4 * k + b] = at;
                }
    }
    g->ok = 1;
    return g;
}

/* the cached tables for c's geometry (built on first use), or NULL where it has none; where the cache is full,
   tables built for this call only, also left in *owned for the caller to free */
static const q8_dww_t* q8_dww_find(const q8_dw_ctx* c, q8_dww_t** owned)
{
    *owned = NULL;
    pthread_mutex_lock(&Q8_DWW_LOCK);
    for (int i = 0; i < Q8_DWW_N; ++i)
        if (q8_dww_key(Q8_DWW[i], c)) {
            const q8_dww_t* g = Q8_DWW[i];
            pthread_mutex_unlock(&Q8_DWW_LOCK);
            return g;
        }
    pthread_mutex_unlock(&Q8_DWW_LOCK);
    q8_dww_t* g = q8_dww_build(c);
    if (!g) return NULL;
    pthread_mutex_lock(&Q8_DWW_LOCK);
    for (int i = 0; i < Q8_DWW_N; ++i) /* another thread built it meanwhile */
        if (q8_dww_key(Q8_DWW[i], c)) {
            const q8_dww_t* had = Q8_DWW[i];
            pthread_mutex_unlock(&Q8_DWW_LOCK);
            q8_dww_free(g);
            return had;
        }
    if (Q8_DWW_N < Q8_DWW_CACHE)
        Q8_DWW[Q8_DWW_N++] = g; /* kept for the process's life: read by any later call, never changed */
    else
        *owned = g;
    pthread_mutex_unlock(&Q8_DWW_LOCK);
    return g;
}

static const q8_dww_t* q8_dww_get(const q8_dw_ctx* c, q8_dww_t** owned)
{
    const q8_dww_t* g = q8_dww_find(c, owned);
    return g && g->ok ? g : NULL;
}

/* whether the window kernel runs c: VNNI and VBMI, not capped, up to 28 taps (any stride, dilation, pads), and not
   a map that the kernel of 4 rows at a time takes (wider than 16, 3x3 or 5x5 at stride 1 or 2: 192 x 28x28 30.6 us
   there against 42.8 in windows, one thread) */
static int q8_dww_applies(const q8_dw_ctx* c)
{
    const int f = q8_cpu();
    const int rows = q8_dwf_applies(c) && c->OW > 16 && c->OH >= 4 && !__atomic_load_n(&Q8_DWR_OFF, __ATOMIC_RELAXED);
    return !__atomic_load_n(&Q8_DWW_OFF, __ATOMIC_RELAXED) && q8_isa()->level == 1 && (f & Q8_F_VBMI) &&
           __atomic_load_n(&Q8_CAP_AVX512, __ATOMIC_RELAXED) != 1 && c->kh * c->kw <= 28 && !rows;
}

Q8_DWV_TARGET static inline __attribute__((always_inline)) void q8_dww_body(const q8_dw_ctx* c, const q8_dww_t* g,
                                                                            long long c0, long long c1, const int G)
{
    const long long HW = (long long)c->H * c->W, nout = (long long)c->OH * c->OW;
    const int T = c->kh * c->kw, zxd = q8_zx_domain(c->zx, c->x_signed, 0);
    const uint8_t flip = (uint8_t)(c->x_signed ? 0x80 : 0);
    const __m512i flipv = _mm512_set1_epi8((char)flip), zraw = _mm512_set1_epi8((char)(zxd ^ flip));
    const __m256i ones = _mm256_set1_epi8(1);
    const __m512i zv = _mm512_set1_epi32(c->zy), z = _mm512_setzero_si512(); /* the sums start from bv */
    const __m512 lo = _mm512_set1_ps((float)(c->lo - c->zy)), hi = _mm512_set1_ps((float)(c->hi - c->zy));
    const int nv = g->nv;
    for (long long ch = c0; ch < c1; ++ch) {
        const uint8_t* xc = c->x + ch * HW;
        uint8_t* y = (uint8_t*)c->y + ch * nout;
        /* the channel's taps as dwords: one masked load, each dword broadcast from the register (no bytes through
           the stack) */
        const __m256i wb = _mm256_maskz_loadu_epi8((__mmask32)(((uint64_t)1 << T) - 1), c->w + ch * T);
        const __m512i wz = _mm512_zextsi256_si512(wb);
        __m512i w[7];
        for (int q = 0; q < G; ++q) w[q] = _mm512_permutexvar_epi32(_mm512_set1_epi32(q), wz);
        const __m256i ws8 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, wb);
        const int32_t wsum = _mm512_reduce_add_epi32(_mm512_zextsi256_si512(ws8));
        const __m512i bv = _mm512_set1_epi32((c->bias ? c->bias[ch] : 0) - zxd * wsum);
        const __m512 mv = _mm512_set1_ps(c->mult[ch]);
        __m512i a = zraw, b = zraw;
        if (g->shared) {
            a = _mm512_xor_si512(_mm512_mask_loadu_epi8(zraw, g->lmask[0], xc), flipv);
            b = _mm512_xor_si512(_mm512_mask_loadu_epi8(zraw, g->lmask[1], xc + 64), flipv);
        }
        for (int v = 0; v < nv; ++v) {
            if (!g->shared) {
                const uint8_t* xb = xc + g->base[v];
                a = _mm512_xor_si512(_mm512_mask_loadu_epi8(zraw, g->lmask[2 * v], xb), flipv);
                b = _mm512_xor_si512(_mm512_mask_loadu_epi8(zraw, g->lmask[2 * v + 1], xb + 64), flipv);
            }
            const uint8_t* ix = g->idx + (size_t)v * G * 64;
            __m512i acc = bv;
            for (int q = 0; q < G; ++q) {
                const __m512i iq = _mm512_load_si512((const void*)(ix + 64 * q));
                acc = _mm512_dpbusd_epi32(acc, _mm512_permutex2var_epi8(a, iq, b), w[q]);
            }
            const long long left = nout - 16LL * v;
            _mm_mask_storeu_epi8((void*)(y + 16LL * v), left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1),
                                 q8_req16(acc, z, mv, lo, hi, zv));
        }
    }
}

Q8_DWV_TARGET static void q8_dww_run(const q8_dw_ctx* c, const q8_dww_t* g, long long c0, long long c1)
{
    /* G a constant in each instance: the tap loop unrolled, the weights in registers */
    switch (g->G) {
    case 1: q8_dww_body(c, g, c0, c1, 1); break;
    case 2: q8_dww_body(c, g, c0, c1, 2); break;
    case 3: q8_dww_body(c, g, c0, c1, 3); break;
    case 4: q8_dww_body(c, g, c0, c1, 4); break;
    case 5: q8_dww_body(c, g, c0, c1, 5); break;
    case 6: q8_dww_body(c, g, c0, c1, 6); break;
    default: q8_dww_body(c, g, c0, c1, 7); break;
    }
}
#endif

static int q8_dwf_task(const q8_dw_ctx* c, long long c0, long long c1)
{
    int Hp, Wb;
    q8_dwf_geom(c, &Hp, &Wb);
#if defined(Q8_DWV)
    q8_dwv_t dv;
    /* the VNNI kernel reads rows at the padded width's pitch (its vectors may span rows) */
    const int Wc = (c->OW - 1) * c->sw + c->kw;
    const int vnni = q8_dwv_plan(c, Wc, &dv);
    if (vnni) Wb = Wc;
#endif
    /* the plane in the domain the row kernels read: unsigned on x86, signed for aarch64's sdot (as the GEMMs) */
    const int dom = q8_isa()->xsigned;
    const int zxd = q8_zx_domain(c->zx, c->x_signed, dom);
    const uint8_t flip = (uint8_t)(c->x_signed != dom ? 0x80 : 0);
    const size_t bytes = (size_t)Hp * Wb + 64;
    uint8_t* P = q8_scratch(1, bytes);
    if (!P) return -1;
    memset(P, (uint8_t)zxd, bytes);
    const q8_dwf_fn fn = q8_dwf_kernel();
    for (long long ch = c0; ch < c1; ++ch) {
#if defined(Q8_DWV)
        if (vnni) {
            q8_dwf_channel(c, NULL, ch, P, Hp, Wb, zxd, flip, &dv);
            continue;
        }
#endif
        q8_dwf_channel(c, fn, ch, P, Hp, Wb, zxd, flip, NULL);
    }
    return 0;
}

/* One task per block of channels with its scratch allocated once: small maps with many channels (960 x 7x7)
   spent most of their time in four allocations per channel and one task per channel. */
static void q8_dw_task(void* vctx, long long t)
{
    q8_dw_ctx* c = (q8_dw_ctx*)vctx;
    const long long c0 = (long long)c->C * t / c->ntasks, c1 = (long long)c->C * (t + 1) / c->ntasks;
    if (c1 <= c0) return;
#if defined(Q8_DWV)
    if (c->dww) {
        q8_dww_run(c, (const q8_dww_t*)c->dww, c0, c1);
        return;
    }
#endif
    if (q8_dwf_applies(c)) {
        if (q8_dwf_task(c, c0, c1)) __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    q8_dw_scratch sc = {0};
    int Hq, Wq;
    q8_dw_geom(c, &Hq, &Wq);
    sc.xp_floats = (size_t)c->sh * c->sw * Hq * Wq;
    /* the requantised bytes of a plane are written over the phase planes: they hold more than OH * Wq bytes */
    sc.xp = (float*)malloc(sizeof(float) * (sc.xp_floats > 0 ? sc.xp_floats : 1));
    sc.ap = (float*)malloc(sizeof(float) * ((size_t)c->OH * Wq + 1));
    sc.acc = (int32_t*)malloc(sizeof(int32_t) * ((size_t)c->OW + 1));
    sc.xr = (int32_t*)malloc(sizeof(int32_t) * ((size_t)c->W + 1));
    if (!sc.xp || !sc.ap || !sc.acc || !sc.xr) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
    } else {
        for (long long ch = c0; ch < c1; ++ch) q8_dw_channel(c, ch, &sc);
    }
    free(sc.xp);
    free(sc.ap);
    free(sc.acc);
    free(sc.xr);
}

int inferd_q8_dwconv2d(const void* x, int x_signed, int zx, int C, int H, int W, const int8_t* w, int kh, int kw,
                       int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW, const int32_t* bias,
                       const float* mult, int zy, int lo, int hi, void* y, int y_signed, int max_threads)
{
    q8_dw_ctx c = {(const uint8_t*)x, x_signed, zx, w, C, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW,
                   bias, mult, zy, lo, hi, y_signed, y, 0, 1, NULL};
    const double work = (double)C * OH * OW * kh * kw;
    c.ntasks = work < 100000 ? 1 : inferd_pool_chunks(C, work);
#if defined(Q8_DWV)
    q8_dww_t* owned = NULL;
    if (q8_dww_applies(&c)) c.dww = q8_dww_get(&c, &owned);
#endif
    inferd_parallel(q8_dw_task, &c, c.ntasks, work < 100000 ? 1 : max_threads);
#if defined(Q8_DWV)
    q8_dww_free(owned);
#endif
    return c.failed ? -1 : 0;
}

/* Elementwise work of n bytes in equal chunks (64-byte multiples), a whole number per thread: the pool deals each
   thread a contiguous share of the tasks (pool.c), and 64 KB chunks had left one thread 65% of a 100 KB add (two
   tasks, the second half empty) or of a 200 KB one (three full chunks and a sliver). Returns the task count. */
static long long q8_even_chunks(long long n, long long* chunk)
{
    const long long T = inferd_pool_threads();
    if (T <= 1 || n < 32768) {
        *chunk = n > 0 ? n : 1;
        return 1;
    }
    long long tasks = (n + 16383) / 16384; /* at least 16 KB each */
    tasks = tasks < 4 * T ? (tasks + T - 1) / T * T : 4 * T;
    *chunk = ((n + tasks - 1) / tasks + 63) & ~63LL;
    return (n + *chunk - 1) / *chunk;
}

/* ---------------------------------------------------------------- elementwise add of two quantised tensors
   y = clamp(rint((a - za) * ra + (b - zb) * rb + zc)), as onnxruntime's QLinearAdd: separate float roundings,
   no fused multiply-add (an FMA rounds differently and would move values that sit on a rounding boundary). */
__attribute__((optimize("fp-contract=off"))) INFERD_CLONES static void q8_add_range(
    const uint8_t* restrict a, int a_signed, int za, float ra, const uint8_t* restrict b, int b_signed, int zb,
    float rb, float zc, float lo, float hi, uint8_t* restrict y, long long n0, long long n1)
{
    for (long long i = n0; i < n1; ++i) {
        const int32_t av = a_signed ? (int32_t)(int8_t)a[i] : (int32_t)a[i];
        const int32_t bv = b_signed ? (int32_t)(int8_t)b[i] : (int32_t)b[i];
        const float p = (float)(av - za) * ra;
        const float q = (float)(bv - zb) * rb;
        float v = (p + q) + zc;
        v = q8_rint(v);
        v = v < lo ? lo : (v > hi ? hi : v);
        y[i] = (uint8_t)(int)v;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* q8_add_range on AVX-512, 16 elements a step: one widening per operand, the zero points taken out in float (the
   integers are small: exact), the clamp before a round-to-nearest-even conversion (the bounds are integers: the same
   result as rounding first), no fused multiply-adds (fp-contract off: GCC would fuse these intrinsics too), so bit
   for bit q8_add_range's. The compiler's form of that loop took ~16 instructions per 16 elements: this one 2.0-2.2x
   faster on Zen 4 (one thread, 800 KB). */
__attribute__((optimize("fp-contract=off"), target("avx512f,avx512bw,avx512vl"))) static void q8_add_avx512(
    const uint8_t* a, int a_signed, int za, float ra, const uint8_t* b, int b_signed, int zb, float rb, float zc,
    float lo, float hi, uint8_t* y, long long n0, long long n1)
{
    const __m512 vra = _mm512_set1_ps(ra), vrb = _mm512_set1_ps(rb), vzc = _mm512_set1_ps(zc);
    const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
    const __m512 vza = _mm512_set1_ps((float)za), vzb = _mm512_set1_ps((float)zb);
    long long i = n0;
    for (; i + 16 <= n1; i += 16) {
        const __m128i xa = _mm_loadu_si128((const __m128i*)(const void*)(a + i));
        const __m128i xb = _mm_loadu_si128((const __m128i*)(const void*)(b + i));
        const __m512i ia = a_signed ? _mm512_cvtepi8_epi32(xa) : _mm512_cvtepu8_epi32(xa);
        const __m512i ib = b_signed ? _mm512_cvtepi8_epi32(xb) : _mm512_cvtepu8_epi32(xb);
        const __m512 p = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(ia), vza), vra);
        const __m512 q = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(ib), vzb), vrb);
        const __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(_mm512_add_ps(p, q), vzc), vlo), vhi);
        const __m512i r = _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i*)(void*)(y + i), _mm512_cvtepi32_epi8(r));
    }
    q8_add_range(a, a_signed, za, ra, b, b_signed, zb, rb, zc, lo, hi, y, i, n1);
}
#endif

typedef struct {
    const uint8_t *a, *b;
    int a_signed, za, b_signed, zb;
    float ra, rb, zc, lo, hi;
    uint8_t* y;
    long long n, chunk;
    int avx512;
} q8_add_ctx;

static void q8_add_task(void* vctx, long long t)
{
    const q8_add_ctx* c = (const q8_add_ctx*)vctx;
    const long long n0 = t * c->chunk, n1 = n0 + c->chunk < c->n ? n0 + c->chunk : c->n;
#if defined(__x86_64__) && defined(__GNUC__)
    if (c->avx512) {
        q8_add_avx512(c->a, c->a_signed, c->za, c->ra, c->b, c->b_signed, c->zb, c->rb, c->zc, c->lo, c->hi, c->y, n0,
                      n1);
        return;
    }
#endif
    q8_add_range(c->a, c->a_signed, c->za, c->ra, c->b, c->b_signed, c->zb, c->rb, c->zc, c->lo, c->hi, c->y, n0, n1);
}

void inferd_q8_add(const void* a, int a_signed, int za, float ra, const void* b, int b_signed, int zb, float rb, float zc,
                   int lo, int hi, void* y, long long n, int max_threads)
{
    long long chunk;
    const long long tasks = q8_even_chunks(n, &chunk);
    q8_add_ctx c = {(const uint8_t*)a, (const uint8_t*)b, a_signed, za, b_signed, zb, ra, rb, zc, (float)lo, (float)hi,
                    (uint8_t*)y, n, chunk,
                    (q8_cpu() & Q8_F_AVX512BW) && __atomic_load_n(&Q8_CAP_AVX512, __ATOMIC_RELAXED) != 1};
    inferd_parallel(q8_add_task, &c, tasks, tasks < 2 ? 1 : max_threads);
}

/* ---------------------------------------------------------------- QuantizeLinear, per tensor
   y = saturate(rint(x / scale) + zp), the division in float32 as onnxruntime's and the oracle's. The clamp comes
   before the rounding (its bounds lo - zp, hi - zp are integers, so the result is the same) and a NaN goes to
   lo. The numpy oracle took 7x onnxruntime's time on a 224x224 image. */
INFERD_CLONES static void q8_quant_range(const float* restrict x, float s, int zp, float flo, float fhi,
                                         uint8_t* restrict y, long long n0, long long n1)
{
    for (long long i = n0; i < n1; ++i) {
        float v = x[i] / s;
        v = v >= flo ? (v > fhi ? fhi : v) : flo;
        y[i] = (uint8_t)((int)q8_rint(v) + zp);
    }
}

typedef struct {
    const float* x;
    float s, flo, fhi;
    int zp;
    uint8_t* y;
    long long n, chunk;
} q8_quant_ctx;

static void q8_quant_task(void* vctx, long long t)
{
    const q8_quant_ctx* c = (const q8_quant_ctx*)vctx;
    const long long n0 = t * c->chunk, n1 = n0 + c->chunk < c->n ? n0 + c->chunk : c->n;
    q8_quant_range(c->x, c->s, c->zp, c->flo, c->fhi, c->y, n0, n1);
}

void inferd_q8_quantize(const float* x, float scale, int zp, int lo, int hi, void* y, long long n, int max_threads)
{
    long long chunk;
    const long long tasks = q8_even_chunks(n, &chunk);
    q8_quant_ctx c = {x, scale, (float)(lo - zp), (float)(hi - zp), zp, (uint8_t*)y, n, chunk};
    inferd_parallel(q8_quant_task, &c, tasks, tasks < 2 ? 1 : max_threads);
}

/* ---------------------------------------------------------------- QLinearGlobalAveragePool, channels first
   As onnxruntime's and the oracle's: the integer sum of each row of hw values minus the zero point's share,
   times m = x_scale / (y_scale * hw) in float32, rounded, plus y_zp. Rows are batch x channels; hw < 2^23, so
   an int32 sum cannot overflow. */
INFERD_CLONES static int32_t q8_row_sum(const uint8_t* restrict x, int x_signed, long long hw)
{
    int32_t s = 0;
    if (x_signed)
        for (long long i = 0; i < hw; ++i) s += (int8_t)x[i];
    else
        for (long long i = 0; i < hw; ++i) s += x[i];
    return s;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define Q8_ROWSUM_AVX512 1
/* 64 bytes a step summed by vpsadbw, the row's end masked (signed bytes flipped to unsigned, 128 a byte taken off
   after): the compiled loop spent most of a 7x7 map's 49-byte row in its scalar tail (efficientnet_b0's pools of
   1152 x 7x7: 16 us) */
__attribute__((target("avx512f,avx512bw"))) static int32_t q8_row_sum_avx512(const uint8_t* x, int x_signed,
                                                                           long long hw)
{
    const __m512i flip = _mm512_set1_epi8(x_signed ? (char)0x80 : 0), zero = _mm512_setzero_si512();
    __m512i acc = zero;
    for (long long i = 0; i < hw; i += 64) {
        const __mmask64 mk = hw - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (hw - i)) - 1);
        const __m512i v = _mm512_maskz_mov_epi8(mk, _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, x + i), flip));
        acc = _mm512_add_epi64(acc, _mm512_sad_epu8(v, zero));
    }
    long long s = _mm512_reduce_add_epi64(acc);
    if (x_signed) s -= 128LL * hw;
    return (int32_t)s;
}
#endif

typedef struct {
    const uint8_t* x;
    uint8_t* y;
    long long rows, hw, per;
    int x_signed, zx, zy;
    float m, flo, fhi;
    int avx512;
} q8_gap_ctx;

static void q8_gap_task(void* vctx, long long t)
{
    const q8_gap_ctx* c = (const q8_gap_ctx*)vctx;
    const long long r1 = (t + 1) * c->per < c->rows ? (t + 1) * c->per : c->rows;
    for (long long r = t * c->per; r < r1; ++r) {
#if defined(Q8_ROWSUM_AVX512)
        const int32_t sum = c->avx512 ? q8_row_sum_avx512(c->x + r * c->hw, c->x_signed, c->hw)
                                      : q8_row_sum(c->x + r * c->hw, c->x_signed, c->hw);
#else
        const int32_t sum = q8_row_sum(c->x + r * c->hw, c->x_signed, c->hw);
#endif
        const long long acc = (long long)sum - (long long)c->zx * c->hw;
        float v = (float)acc * c->m;
        v = v < c->flo ? c->flo : (v > c->fhi ? c->fhi : v);
        c->y[r] = (uint8_t)((int)q8_rint(v) + c->zy);
    }
}

void inferd_q8_gap(const void* x, int x_signed, int zx, long long rows, long long hw, float m, int zy, int lo, int hi,
                   void* y, int max_threads)
{
    if (rows <= 0) return;
    /* rows split over the pool where there are enough bytes: a squeeze-and-excitation block's pool reads its whole
       expanded map (efficientnet_b0's 17 pools: 0.21 ms a run, on one thread) */
    const long long tasks = inferd_pool_chunks(rows, (double)rows * (double)hw);
    q8_gap_ctx c = {(const uint8_t*)x, (uint8_t*)y, rows, hw, (rows + tasks - 1) / tasks, x_signed, zx, zy, m,
                    (float)(lo - zy), (float)(hi - zy),
                    (q8_cpu() & Q8_F_AVX512BW) && __atomic_load_n(&Q8_CAP_AVX512, __ATOMIC_RELAXED) != 1};
    inferd_parallel(q8_gap_task, &c, (rows + c.per - 1) / c.per, (double)rows * hw < 65536 ? 1 : max_threads);
}

/* ---------------------------------------------------------------- byte table map: y[i] = table[x[i]] (QLinearConcat's
   requantisation of an input on another scale; numpy's take widened every byte to an int64 index) */
#if defined(__x86_64__) && defined(__GNUC__)
/* y[i] = table[x[i]] 64 bytes at a time with AVX-512 VBMI: two 128-entry permutes (the index's low 7 bits) and
   a blend on its top bit; the tail masked. The scalar lookup ran at ~1 byte per cycle. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void q8_lookup_vbmi(const uint8_t* x, const uint8_t* table,
                                                                                 uint8_t* y, long long n)
{
    const __m512i t0 = _mm512_loadu_si512((const void*)table), t1 = _mm512_loadu_si512((const void*)(table + 64));
    const __m512i t2 = _mm512_loadu_si512((const void*)(table + 128)), t3 = _mm512_loadu_si512((const void*)(table + 192));
    for (long long i = 0; i < n; i += 64) {
        const __mmask64 mk = n - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (n - i)) - 1);
        const __m512i idx = _mm512_maskz_loadu_epi8(mk, x + i);
        const __m512i lo = _mm512_permutex2var_epi8(t0, idx, t1), hi = _mm512_permutex2var_epi8(t2, idx, t3);
        _mm512_mask_storeu_epi8(y + i, mk, _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi));
    }
}

#endif

/* whether q8_lookup runs vector code here (else a byte at a time) */
static int q8_lookup_vectorised(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    return (q8_cpu() & Q8_F_VBMI) && __atomic_load_n(&Q8_CAP_AVX512, __ATOMIC_RELAXED) != 1;
#else
    return 0;
#endif
}

/* y[i] = table[x[i]] over [0, n) */
static void q8_lookup(const uint8_t* x, const uint8_t* table, uint8_t* y, long long n)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if ((q8_cpu() & Q8_F_VBMI) && __atomic_load_n(&Q8_CAP_AVX512, __ATOMIC_RELAXED) != 1) {
        q8_lookup_vbmi(x, table, y, n);
        return;
    }
#endif
    uint8_t tb[256];
    memcpy(tb, table, 256);
    for (long long i = 0; i < n; ++i) y[i] = tb[x[i]];
}

typedef struct {
    const uint8_t* x;
    const uint8_t* table;
    uint8_t* y;
    long long n, chunk;
} q8_map_ctx;

static void q8_map_task(void* vctx, long long t)
{
    const q8_map_ctx* c = (const q8_map_ctx*)vctx;
    const long long n0 = t * c->chunk, n1 = n0 + c->chunk < c->n ? n0 + c->chunk : c->n;
    const uint8_t* restrict x = c->x;
    uint8_t* restrict y = c->y;
    if (!c->table) {
        memcpy(y + n0, x + n0, (size_t)(n1 - n0));
        return;
    }
    q8_lookup(x + n0, c->table, y + n0, n1 - n0);
}

void inferd_q8_map(const void* x, const unsigned char* table, void* y, long long n, int max_threads)
{
    long long chunk;
    const long long tasks = q8_even_chunks(n, &chunk);
    q8_map_ctx c = {(const uint8_t*)x, table, (uint8_t*)y, n, chunk};
    inferd_parallel(q8_map_task, &c, tasks, tasks < 2 ? 1 : max_threads);
}

/* ---------------------------------------------------------------- 8-bit MaxPool, 2-D, NCHW planes
   Separable, per output row: the vertical maximum of its kh input rows, then that row's horizontal maxima. Pads
   hold the lowest value, which no maximum picks over a value inside (the padding is -inf); an output with no tap
   inside gets the type's lowest value, as the numpy kernel's fill. int8 is compared as unsigned after an xor with
   0x80 (order-preserving), so one loop serves both types. */
typedef struct {
    const uint8_t* x;
    uint8_t* y;
    long long planes;
    int H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, ntasks;
    uint8_t flip;
    int failed;
    const uint8_t* masks; /* the flat form's tap masks (q8_maxpool_flat), built once per call */
} q8_maxpool_ctx;

/* one padded row's horizontal maxima: y[ow] = max_j v[ow*sw + j*dw] (v already holds the pl leading pads) */
INFERD_CLONES static void q8_hmax(const uint8_t* restrict v, uint8_t* restrict y, int OW, int kw, int sw, int dw)
{
    if (sw == 1 && dw == 1) {
        for (int ow = 0; ow < OW; ++ow) y[ow] = v[ow];
        for (int j = 1; j < kw; ++j)
            for (int ow = 0; ow < OW; ++ow) y[ow] = v[ow + j] > y[ow] ? v[ow + j] : y[ow];
    } else if (sw == 2 && dw == 1) {
        /* v read as little-endian byte pairs p[u] = v[2u] | v[2u+1] << 8 (v is 64-byte aligned): tap j of output
           ow is the low (j even) or high (j odd) byte of p[ow + j/2], so every tap is a contiguous 16-bit load;
           one loop per tap, as for stride 1 (a tap loop inside the output loop was not vectorised) */
        const uint16_t* restrict p = (const uint16_t*)(const void*)v;
        for (int ow = 0; ow < OW; ++ow) y[ow] = (uint8_t)(p[ow] & 0xff);
        for (int j = 1; j < kw; ++j) {
            const uint16_t* restrict pj = p + j / 2;
            if (j & 1)
                for (int ow = 0; ow < OW; ++ow) {
                    const uint8_t b = (uint8_t)(pj[ow] >> 8);
                    y[ow] = b > y[ow] ? b : y[ow];
                }
            else
                for (int ow = 0; ow < OW; ++ow) {
                    const uint8_t b = (uint8_t)(pj[ow] & 0xff);
                    y[ow] = b > y[ow] ? b : y[ow];
                }
        }
    } else {
        for (int ow = 0; ow < OW; ++ow) {
            uint8_t m = 0;
            for (int j = 0; j < kw; ++j) m = v[ow * sw + j * dw] > m ? v[ow * sw + j * dw] : m;
            y[ow] = m;
        }
    }
}

/* per output row: the vertical maximum of its kh input rows into a padded row (pads and flipped values in the
   unsigned order), then the horizontal maxima of that row: both contiguous loops the compiler vectorises */
INFERD_CLONES static void q8_maxpool_plane(const q8_maxpool_ctx* c, const uint8_t* x, uint8_t* y, uint8_t* vb)
{
    const int H = c->H, W = c->W, kh = c->kh, sh = c->sh, dh = c->dh, pt = c->pt, pl = c->pl, OH = c->OH;
    const int OW = c->OW;
    const uint8_t flip = c->flip;
    const int need = (OW - 1) * c->sw + (c->kw - 1) * c->dw + 2; /* bytes of the padded row any tap reads */
    uint8_t* restrict v = vb;
    memset(v, 0, (size_t)need + 64);
    uint8_t* restrict vc = v + pl;
    const int wn = W < need - pl ? W : need - pl; /* input columns some tap reads */
    for (int oh = 0; oh < OH; ++oh) {
        int first = 1;
        for (int i = 0; i < kh; ++i) {
            const int ih = oh * sh - pt + i * dh;
            if (ih < 0 || ih >= H) continue;
            const uint8_t* restrict r = x + (size_t)ih * W;
            if (first)
                for (int u = 0; u < wn; ++u) vc[u] = r[u] ^ flip;
            else
                for (int u = 0; u < wn; ++u) {
                    const uint8_t t = r[u] ^ flip;
                    vc[u] = t > vc[u] ? t : vc[u];
                }
            first = 0;
        }
        if (first) memset(vc, 0, (size_t)(wn > 0 ? wn : 0)); /* no row inside: the lowest value */
        uint8_t* restrict yo = y + (size_t)oh * OW;
        q8_hmax(v, yo, OW, c->kw, c->sw, c->dw);
        if (flip)
            for (int ow = 0; ow < OW; ++ow) yo[ow] ^= flip;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define Q8_MAXPOOL_AVX512 1
/* q8_maxpool_plane with AVX-512 byte masks (stride 1 or 2, dilation 1 across): a row of up to 64 bytes is one
   masked load per tap row, the horizontal taps of 32 (stride 2) or 64 (stride 1) outputs a few loads, and no
   loop has a scalar tail. Short rows (13-28 bytes) spent most of their time in loop set-up and tails before. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void q8_maxpool_plane_avx512(
    const q8_maxpool_ctx* c, const uint8_t* x, uint8_t* y, uint8_t* vb)
{
    const int H = c->H, W = c->W, kh = c->kh, kw = c->kw, sh = c->sh, sw = c->sw, dh = c->dh, pt = c->pt, pl = c->pl;
    const int OH = c->OH, OW = c->OW;
    const int need = (OW - 1) * sw + (kw - 1) + 2;
    memset(vb, 0, (size_t)need + 192);
    uint8_t* vc = vb + pl;
    const int wn = W < need - pl ? W : need - pl;
    const __m512i fv = _mm512_set1_epi8((char)c->flip), low16 = _mm512_set1_epi16(0xff);
    const __m256i fv32 = _mm256_set1_epi8((char)c->flip);
    for (int oh = 0; oh < OH; ++oh) {
        for (int u0 = 0; u0 < wn; u0 += 64) {
            const __mmask64 mk = wn - u0 >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (wn - u0)) - 1);
            __m512i acc = _mm512_setzero_si512();
            for (int i = 0; i < kh; ++i) {
                const int ih = oh * sh - pt + i * dh;
                if (ih < 0 || ih >= H) continue;
                const __m512i r = _mm512_maskz_loadu_epi8(mk, x + (size_t)ih * W + u0);
                acc = _mm512_max_epu8(acc, _mm512_xor_si512(r, fv));
            }
            _mm512_mask_storeu_epi8(vc + u0, mk, acc); /* no row inside: zeros, the lowest value */
        }
        uint8_t* yo = y + (size_t)oh * OW;
        if (sw == 1) {
            for (int o0 = 0; o0 < OW; o0 += 64) {
                __m512i m = _mm512_loadu_si512((const void*)(vb + o0));
                for (int j = 1; j < kw; ++j) m = _mm512_max_epu8(m, _mm512_loadu_si512((const void*)(vb + o0 + j)));
                const __mmask64 mk = OW - o0 >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (OW - o0)) - 1);
                _mm512_mask_storeu_epi8(yo + o0, mk, _mm512_xor_si512(m, fv));
            }
        } else {
            for (int o0 = 0; o0 < OW; o0 += 32) {
                __m512i m = _mm512_setzero_si512();
                for (int j = 0; j < kw; j += 2) {
                    const __m512i pj = _mm512_loadu_si512((const void*)(vb + 2 * (size_t)o0 + j));
                    m = _mm512_max_epu16(m, _mm512_and_si512(pj, low16));
                    if (j + 1 < kw) m = _mm512_max_epu16(m, _mm512_srli_epi16(pj, 8));
                }
                const __mmask32 mk = OW - o0 >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << (OW - o0)) - 1);
                _mm256_mask_storeu_epi8(yo + o0, mk, _mm256_xor_si256(_mm512_cvtepi16_epi8(m), fv32));
            }
        }
    }
}

#endif

/* Same-size pooling at stride 1 (the 3x3 pad-1 pools of inception branches): planes [p0, p1) as one flat array,
   so each pass is one long loop over all of them instead of a loop per short row (googlenet's 7x7 and 14x14
   maps). A tap that would cross a row (or a plane) edge is masked out: its byte is ANDed with a mask that is
   zero there, zero being the lowest value in the flipped order, which a maximum never picks over a tap inside.
   The masks repeat every row (every plane), so one block of whole rows (planes) of them serves every block of
   the array. Only the array's first and last few bytes, where a tap would read outside it, go tap by tap. */
enum { Q8_MP_BLOCK = 256 }; /* bytes of a mask block, at least (whole rows, whole planes) */

/* One pass over [a, b) (every tap's read inside src): dst[q] = (max_t (src[q + (t - pad) step] ^ fin) & m_t) ^ fout,
   the horizontal one (step 1, pad pl) or the vertical one (step W, pad pt); m is k blocks of `period` bytes, block
   t's byte (q - c0) the mask of tap t at q, c0 a multiple of period. K: k as a literal (3), or 0. */
INFERD_INLINE void q8_mp_pass(const uint8_t* restrict src, uint8_t* restrict dst, const uint8_t* restrict m, long long a,
                              long long b, long long period, long long step, uint8_t fin, uint8_t fout, int kk, int pad,
                              const int K)
{
    const int k = K ? K : kk;
    for (long long c0 = a / period * period; c0 < b; c0 += period) {
        const long long s = a > c0 ? a : c0, e = b < c0 + period ? b : c0 + period;
        const uint8_t* restrict sp = src + c0 - pad * step;
        for (long long q = s - c0; q < e - c0; ++q) {
            uint8_t v = 0;
            for (int t = 0; t < k; ++t) {
                const uint8_t u = (uint8_t)((sp[q + t * step] ^ fin) & m[t * period + q]);
                v = u > v ? u : v;
            }
            dst[c0 + q] = (uint8_t)(v ^ fout);
        }
    }
}

INFERD_CLONES static void q8_mp_pass_any(const uint8_t* src, uint8_t* dst, const uint8_t* m, long long a, long long b,
                                         long long period, long long step, uint8_t fin, uint8_t fout, int k, int pad)
{
    if (k == 3 && step == 1) /* the horizontal pass with its step a literal: ~5% faster on 28x28 inception pools */
        q8_mp_pass(src, dst, m, a, b, period, 1, fin, fout, k, pad, 3);
    else if (k == 3)
        q8_mp_pass(src, dst, m, a, b, period, step, fin, fout, k, pad, 3);
    else
        q8_mp_pass(src, dst, m, a, b, period, step, fin, fout, k, pad, 0);
}

/* Outputs [q0, q1) of a pass tap by tap, skipping reads outside [0, n): dst[q] = (max_t (src[q + (t - pad) step]
   ^ fin) & m_t) ^ fout, m blocks of `period` bytes as in q8_mp_pass. */
static void q8_mp_ends(const uint8_t* src, uint8_t* dst, const uint8_t* m, long long q0, long long q1, long long n,
                       long long period, long long step, uint8_t fin, uint8_t fout, int k, int pad)
{
    for (long long q = q0; q < q1; ++q) {
        uint8_t a = 0;
        for (int t = 0; t < k; ++t) {
            const long long r = q + (t - pad) * step;
            if (r < 0 || r >= n) continue;
            const uint8_t v = (uint8_t)((src[r] ^ fin) & m[t * period + q % period]);
            a = v > a ? v : a;
        }
        dst[q] = (uint8_t)(a ^ fout);
    }
}

/* The mask blocks: kw of ph bytes (whole rows), then kh of pv bytes (whole planes); NULL if out of memory. */
static uint8_t* q8_maxpool_masks(int H, int W, int kh, int kw, int pt, int pl, long long* ph, long long* pv)
{
    const long long HW = (long long)H * W;
    *ph = (Q8_MP_BLOCK + W - 1) / W * W;
    *pv = (Q8_MP_BLOCK + HW - 1) / HW * HW;
    uint8_t* mh = (uint8_t*)malloc((size_t)(kw * *ph + kh * *pv));
    if (!mh) return NULL;
    uint8_t* mv = mh + kw * *ph;
    for (int j = 0; j < kw; ++j)
        for (long long r0 = 0; r0 < *ph; r0 += W)
            for (int col = 0; col < W; ++col) mh[j * *ph + r0 + col] = col + j - pl >= 0 && col + j - pl < W ? 0xff : 0;
    for (int i = 0; i < kh; ++i)
        for (long long p = 0; p < *pv; p += HW)
            for (int row = 0; row < H; ++row)
                memset(mv + i * *pv + p + (long long)row * W, row + i - pt >= 0 && row + i - pt < H ? 0xff : 0,
                       (size_t)W);
    return mh;
}

static void q8_maxpool_flat(const q8_maxpool_ctx* c, long long p0, long long p1, uint8_t* hm)
{
    const int H = c->H, W = c->W, kh = c->kh, kw = c->kw, pt = c->pt, pl = c->pl;
    const int pr = kw - 1 - pl, pb = kh - 1 - pt;
    const uint8_t flip = c->flip;
    const long long HW = (long long)H * W, n = (p1 - p0) * HW;
    const long long ph = (Q8_MP_BLOCK + W - 1) / W * W, pv = (Q8_MP_BLOCK + HW - 1) / HW * HW;
    const uint8_t* x = c->x + p0 * HW;
    uint8_t* y = c->y + p0 * HW;
    const uint8_t* mh = c->masks;
    const uint8_t* mv = mh + (long long)kw * ph;
    /* each pass: the flat interior, then the array's ends tap by tap (reads inside the array only) */
    const long long ha = pl < n ? pl : n, hb = n - pr > ha ? n - pr : ha;
    q8_mp_pass_any(x, hm, mh, ha, hb, ph, 1, flip, 0, kw, pl);
    q8_mp_ends(x, hm, mh, 0, ha, n, ph, 1, flip, 0, kw, pl);
    q8_mp_ends(x, hm, mh, hb, n, n, ph, 1, flip, 0, kw, pl);
    const long long va = (long long)pt * W < n ? (long long)pt * W : n;
    const long long vb = n - (long long)pb * W > va ? n - (long long)pb * W : va;
    q8_mp_pass_any(hm, y, mv, va, vb, pv, W, 0, flip, kh, pt);
    q8_mp_ends(hm, y, mv, 0, va, n, pv, W, 0, flip, kh, pt);
    q8_mp_ends(hm, y, mv, vb, n, n, pv, W, 0, flip, kh, pt);
}

static int q8_maxpool_flat_applies(const q8_maxpool_ctx* c)
{
    return c->sh == 1 && c->sw == 1 && c->dh == 1 && c->dw == 1 && c->OH == c->H && c->OW == c->W && c->pt < c->kh &&
           c->pl < c->kw;
}

static void q8_maxpool_task(void* vctx, long long t)
{
    q8_maxpool_ctx* c = (q8_maxpool_ctx*)vctx;
    const long long p0 = c->planes * t / c->ntasks, p1 = c->planes * (t + 1) / c->ntasks;
    if (p1 <= p0) return;
#if defined(Q8_MAXPOOL_AVX512)
    const int avx512 = (c->sw == 1 || c->sw == 2) && c->dw == 1 && (q8_cpu() & Q8_F_AVX512BW) &&
                       __atomic_load_n(&Q8_CAP_AVX512, __ATOMIC_RELAXED) != 1;
#else
    const int avx512 = 0;
#endif
    if (c->masks) { /* the flat form: ahead of the AVX-512 rows too (1.3-2x faster on 7x7 to 28x28) */
        uint8_t* hm = q8_scratch(1, (size_t)((p1 - p0) * c->H * c->W + 64));
        if (!hm)
            __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        else
            q8_maxpool_flat(c, p0, p1, hm);
        return;
    }
    uint8_t* hb = q8_scratch(1, (size_t)(c->OW - 1) * c->sw + (size_t)(c->kw - 1) * c->dw + (size_t)c->pl + 256);
    if (!hb) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
#if defined(Q8_MAXPOOL_AVX512)
    if (avx512) {
        for (long long p = p0; p < p1; ++p)
            q8_maxpool_plane_avx512(c, c->x + p * (long long)c->H * c->W, c->y + p * (long long)c->OH * c->OW, hb);
        return;
    }
#endif
    for (long long p = p0; p < p1; ++p)
        q8_maxpool_plane(c, c->x + p * (long long)c->H * c->W, c->y + p * (long long)c->OH * c->OW, hb);
}

int inferd_q8_maxpool2d(const void* x, int x_signed, long long planes, int H, int W, int kh, int kw, int sh, int sw,
                        int dh, int dw, int pt, int pl, int OH, int OW, void* y, int max_threads)
{
    q8_maxpool_ctx c = {(const uint8_t*)x, (uint8_t*)y, planes, H, W, kh, kw, sh, sw, dh, dw, pt, pl, OH, OW, 1,
                        (uint8_t)(x_signed ? 0x80 : 0), 0, NULL};
    uint8_t* masks = NULL;
    if (q8_maxpool_flat_applies(&c)) {
        long long ph, pv;
        if (!(masks = q8_maxpool_masks(H, W, kh, kw, pt, pl, &ph, &pv))) return -1;
        c.masks = masks;
    }
    const double work = (double)planes * ((double)H * OW * kw + (double)OH * OW * kh);
    c.ntasks = work < 100000 ? 1 : inferd_pool_chunks(planes, work);
    inferd_parallel(q8_maxpool_task, &c, c.ntasks, work < 100000 ? 1 : max_threads);
    free(masks);
    return c.failed ? -1 : 0;
}

/* ---------------------------------------------------------------- DequantizeLinear, per tensor, 8-bit to float32:
   y = float(x - zp) * scale, the oracle's (and onnxruntime's) arithmetic */
typedef struct {
    const uint8_t* x;
    int x_signed, zp;
    float s;
    float* y;
    long long n, chunk;
} q8_dq_ctx;

INFERD_CLONES static void q8_dq_range(const uint8_t* restrict x, int x_signed, int zp, float s, float* restrict y,
                                      long long n0, long long n1)
{
    if (x_signed)
        for (long long i = n0; i < n1; ++i) y[i] = (float)((int32_t)(int8_t)x[i] - zp) * s;
    else
        for (long long i = n0; i < n1; ++i) y[i] = (float)((int32_t)x[i] - zp) * s;
}

static void q8_dq_task(void* vctx, long long t)
{
    const q8_dq_ctx* c = (const q8_dq_ctx*)vctx;
    const long long n0 = t * c->chunk, n1 = n0 + c->chunk < c->n ? n0 + c->chunk : c->n;
    q8_dq_range(c->x, c->x_signed, c->zp, c->s, c->y, n0, n1);
}

void inferd_q8_dequantize(const void* x, int x_signed, int zp, float scale, float* y, long long n, int max_threads)
{
    long long chunk;
    const long long tasks = q8_even_chunks(n, &chunk);
    q8_dq_ctx c = {(const uint8_t*)x, x_signed, zp, scale, y, n, chunk};
    inferd_parallel(q8_dq_task, &c, tasks, tasks < 2 ? 1 : max_threads);
}

/* ---------------------------------------------------------------- QLinearConcat of n parts laid one after another in y
   (batch 1, or the concatenation axis outermost): each copied or mapped through its byte table, the whole output
   in chunks over the threads in one parallel region (a call and a region per part cost more than the bytes on
   inception's four-branch concats). */
typedef struct {
    int n;
    const uint8_t* const* xs;
    const uint8_t* const* tables;
    const long long* at; /* part j fills y[at[j], at[j+1]) */
    uint8_t* y;
    long long chunk;
} q8_concat_ctx;

static void q8_concat_task(void* vctx, long long t)
{
    const q8_concat_ctx* c = (const q8_concat_ctx*)vctx;
    const long long a = t * c->chunk, b = a + c->chunk < c->at[c->n] ? a + c->chunk : c->at[c->n];
    for (int j = 0; j < c->n; ++j) {
        const long long lo = a > c->at[j] ? a : c->at[j], hi = b < c->at[j + 1] ? b : c->at[j + 1];
        if (lo >= hi) continue;
        const uint8_t* x = c->xs[j] + (lo - c->at[j]);
        uint8_t* y = c->y + lo;
        const uint8_t* tb = c->tables[j];
        if (!tb)
            memcpy(y, x, (size_t)(hi - lo));
        else
            q8_lookup(x, tb, y, hi - lo);
    }
}

void inferd_q8_concat(int n, const void* const* xs, const unsigned char* const* tables, const long long* at, void* y,
                      int max_threads)
{
    long long chunk;
    const long long tasks = q8_even_chunks(at[n], &chunk);
    q8_concat_ctx c = {n, (const uint8_t* const*)xs, (const uint8_t* const*)tables, at, (uint8_t*)y, chunk};
    inferd_parallel(q8_concat_task, &c, tasks, tasks < 2 ? 1 : max_threads);
}

/* ---------------------------------------------------------------- QLinearMul: y = clamp(rint((a - za)(b - zb) m + zc))
   with m = sa sb / sc, as onnxruntime's and the oracle's float32 expression, evaluated in its order without fused
   multiply-adds; the clamp (integer bounds) comes before the rounding, which gives the same value and keeps the
   rounding trick's range. b is either a's shape or one value per row of inner elements of a (efficientnet's
   squeeze-excitation scale, [1, C, 1, 1] against [1, C, H, W]). */
__attribute__((optimize("fp-contract=off"))) INFERD_CLONES static void q8_mul_range(
    const uint8_t* restrict a, int a_signed, int za, const uint8_t* restrict b, int b_signed, int zb, int b_row,
    float m, float zc, float lo, float hi, uint8_t* restrict y, long long inner, long long n0, long long n1)
{
    if (b_row) {
        for (long long r = n0; r < n1; ++r) {
            const float bi = (float)((b_signed ? (int32_t)(int8_t)b[r] : (int32_t)b[r]) - zb);
            const uint8_t* ar = a + r * inner;
            uint8_t* yr = y + r * inner;
            for (long long i = 0; i < inner; ++i) {
                const float ai = (float)((a_signed ? (int32_t)(int8_t)ar[i] : (int32_t)ar[i]) - za);
                float v = ai * bi * m + zc;
                v = v < lo ? lo : (v > hi ? hi : v);
                yr[i] = (uint8_t)(int)q8_rint(v);
            }
        }
        return;
    }
    for (long long i = n0; i < n1; ++i) {
        const float ai = (float)((a_signed ? (int32_t)(int8_t)a[i] : (int32_t)a[i]) - za);
        const float bi = (float)((b_signed ? (int32_t)(int8_t)b[i] : (int32_t)b[i]) - zb);
        float v = ai * bi * m + zc;
        v = v < lo ? lo : (v > hi ? hi : v);
        y[i] = (uint8_t)(int)q8_rint(v);
    }
}

/* A row scaled by one value is a function of its bytes: its 256-entry table, the same expression per entry, then
   looked up (a row of 56x56 costs 3136 evaluations as it is, 256 and a table lookup this way) */
__attribute__((optimize("fp-contract=off"))) INFERD_CLONES static void q8_mul_table(int a_signed, int za, float bi,
                                                                                   float m, float zc, float lo,
                                                                                   float hi, uint8_t* restrict t)
{
    for (int u = 0; u < 256; ++u) {
        const float ai = (float)((a_signed ? (int32_t)(int8_t)u : u) - za);
        float v = ai * bi * m + zc;
        v = v < lo ? lo : (v > hi ? hi : v);
        t[u] = (uint8_t)(int)q8_rint(v);
    }
}

/* rows at least this long go through their table where the lookup is vectorised */
#define Q8_MUL_TABLE_ROW 256

#if defined(__x86_64__) && defined(__GNUC__)
#define Q8_MUL_AVX512 1
/* 16 bytes a step with the row's (or the stretch's) end masked: the compiled loop spent most of a 7x7 map's
   49-byte row in its scalar tail (1152 rows: 24 us). b NULL: every element times bi. The same float32 expression,
   its order kept (no fused multiply-adds: intrinsics are plain vector arithmetic to GCC, which would contract
   them); rounding half to even as q8_rint, after the clamp. */
__attribute__((optimize("fp-contract=off"), target("avx512f,avx512bw,avx512vl"))) static void q8_mul_avx512(
    const uint8_t* a, int a_signed, int za, const uint8_t* b, int b_signed, int zb, float bi, float m, float zc,
    float lo, float hi, uint8_t* y, long long n)
{
    const __m512 mv = _mm512_set1_ps(m), zcv = _mm512_set1_ps(zc), lov = _mm512_set1_ps(lo), hiv = _mm512_set1_ps(hi);
    const __m512 biv = _mm512_set1_ps(bi);
    const __m512i zav = _mm512_set1_epi32(za), zbv = _mm512_set1_epi32(zb);
    for (long long i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m128i ra = _mm_maskz_loadu_epi8(mk, a + i);
        const __m512i ia = a_signed ? _mm512_cvtepi8_epi32(ra) : _mm512_cvtepu8_epi32(ra);
        const __m512 fa = _mm512_cvtepi32_ps(_mm512_sub_epi32(ia, zav));
        __m512 f;
        if (b) {
            const __m128i rb = _mm_maskz_loadu_epi8(mk, b + i);
            const __m512i ib = b_signed ? _mm512_cvtepi8_epi32(rb) : _mm512_cvtepu8_epi32(rb);
            f = _mm512_mul_ps(fa, _mm512_cvtepi32_ps(_mm512_sub_epi32(ib, zbv)));
        } else {
            f = _mm512_mul_ps(fa, biv);
        }
        f = _mm512_add_ps(_mm512_mul_ps(f, mv), zcv);
        f = _mm512_min_ps(_mm512_max_ps(f, lov), hiv);
        const __m512i q = _mm512_cvt_roundps_epi32(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_mask_storeu_epi8((void*)(y + i), mk, _mm512_cvtepi32_epi8(q));
    }
}
#endif

typedef struct {
    const uint8_t *a, *b;
    int a_signed, za, b_signed, zb, b_row;
    float m, zc, lo, hi;
    uint8_t* y;
    long long inner, n, chunk; /* n rows (b_row) or elements, chunk of them per task */
    int avx512, table;
} q8_mul_ctx;

static void q8_mul_task(void* vctx, long long t)
{
    const q8_mul_ctx* c = (const q8_mul_ctx*)vctx;
    const long long n0 = t * c->chunk, n1 = n0 + c->chunk < c->n ? n0 + c->chunk : c->n;
    if (c->b_row && (c->table || c->avx512)) {
        for (long long r = n0; r < n1; ++r) {
            const float bi = (float)((c->b_signed ? (int32_t)(int8_t)c->b[r] : (int32_t)c->b[r]) - c->zb);
            const uint8_t* ar = c->a + r * c->inner;
            uint8_t* yr = c->y + r * c->inner;
            if (c->table) {
                uint8_t tb[256] __attribute__((aligned(64)));
                q8_mul_table(c->a_signed, c->za, bi, c->m, c->zc, c->lo, c->hi, tb);
                q8_lookup(ar, tb, yr, c->inner);
            }
#if defined(Q8_MUL_AVX512)
            else {
                q8_mul_avx512(ar, c->a_signed, c->za, NULL, 0, 0, bi, c->m, c->zc, c->lo, c->hi, yr, c->inner);
            }
#endif
        }
        return;
    }
#if defined(Q8_MUL_AVX512)
    if (c->avx512 && !c->b_row) {
        q8_mul_avx512(c->a + n0, c->a_signed, c->za, c->b + n0, c->b_signed, c->zb, 0.0f, c->m, c->zc, c->lo, c->hi,
                      c->y + n0, n1 - n0);
        return;
    }
#endif
    q8_mul_range(c->a, c->a_signed, c->za, c->b, c->b_signed, c->zb, c->b_row, c->m, c->zc, c->lo, c->hi, c->y, c->inner,
                 n0, n1);
}

void inferd_q8_mul(const void* a, int a_signed, int za, const void* b, int b_signed, int zb, long long rows,
                   long long inner, int b_row, float m, float zc, int lo, int hi, void* y, int max_threads)
{
    const long long n = b_row ? rows : rows * inner;
    long long chunk;
    q8_even_chunks(rows * inner, &chunk);
    if (b_row) chunk = (chunk + inner - 1) / (inner > 0 ? inner : 1); /* whole rows */
    const long long tasks = (n + chunk - 1) / (chunk > 0 ? chunk : 1);
    const int avx512 = (q8_cpu() & Q8_F_AVX512BW) && __atomic_load_n(&Q8_CAP_AVX512, __ATOMIC_RELAXED) != 1;
    q8_mul_ctx c = {(const uint8_t*)a, (const uint8_t*)b, a_signed, za, b_signed, zb, b_row, m, zc, (float)lo,
                    (float)hi, (uint8_t*)y, inner, n, chunk > 0 ? chunk : 1,
#if defined(Q8_MUL_AVX512)
                    avx512,
#else
                    0,
#endif
                    b_row && inner >= Q8_MUL_TABLE_ROW && q8_lookup_vectorised()};
    (void)avx512;
    inferd_parallel(q8_mul_task, &c, tasks, tasks < 2 ? 1 : max_threads);
}
