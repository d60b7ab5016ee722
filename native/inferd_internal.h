/* Internal to native/: the clone/inline macros and the fused activations shared by the kernels
   (not parsed by cffi; inferd_native.h is the public contract). */
#ifndef INFERD_INTERNAL_H
#define INFERD_INTERNAL_H
#include <stddef.h>
#include <string.h>

/* Feature-level clones ("arch=x86-64-v3" is tested with __builtin_cpu_supports, unlike a CPU name such as
   "arch=haswell", which GCC's resolver matches by model and so never picks on other vendors' CPUs). */
#if defined(INFERD_NO_CLONES)
#define INFERD_CLONES
#elif defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 12
#define INFERD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#elif defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 8
#define INFERD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define INFERD_CLONES
#endif

#if defined(__GNUC__)
#define INFERD_INLINE static inline __attribute__((always_inline))
#else
#define INFERD_INLINE static inline
#endif

#if defined(__x86_64__) && defined(__GNUC__)
/* Which of a file's per-ISA x86 kernels to run: 2 AVX-512F, 1 AVX2 + FMA, 0 neither (SSE2) */
INFERD_INLINE int inferd_x86_level(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 2;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
}
#endif

/* ---------------------------------------------------------------- activations
   Codes shared by inferd_bias_act and inferd_dwconv2d: 0 none, 1 Relu, 2 Clip(p0, p1), 3 LeakyRelu(p0),
   4 Sigmoid, 5 SiLU, 6 HardSwish, 7 HardSigmoid(alpha p0, beta p1), 8 Gelu, 9 Gelu (tanh approximation). Each
   is a branch-free expression so the loops that apply it vectorise; Sigmoid/SiLU/Gelu use exp_ps below instead
   of libm's expf, which does not. */

/* cond ? a : b through the bits: a plain ?: between computed values lets GCC sink the arithmetic into branches
   that it then refuses to if-convert (-ftrapping-math), so the loop would not vectorise. */
INFERD_INLINE float select_ps(int cond, float a, float b)
{
    unsigned ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    const unsigned m = 0u - (unsigned)(cond != 0);
    const unsigned r = (ia & m) | (ib & ~m);
    float f;
    memcpy(&f, &r, sizeof f);
    return f;
}

/* exp(x) for float32 in vectorisable plain C (Cephes expf): x = n ln2 + r with |r| <= ln2/2 (Cody-Waite split
   of ln2), a degree-6 polynomial for e^r, and 2^n built in the exponent bits. Relative error ~2 ulp; inputs
   are clamped to [-87.3, 88.7], so results stay finite and normal (through select_ps: with ?: there GCC 12
   threaded the clamp into branches, and every Sigmoid / SiLU loop ran scalar, ~3 ns a value on Zen 3). */
INFERD_INLINE float exp_core_ps(float x);
INFERD_INLINE float exp_ps(float x)
{
    return exp_core_ps(select_ps(x < -87.33f, -87.33f, select_ps(x > 88.72f, 88.72f, x)));
}

/* exp_ps without the clamp: x must lie in [-87.33, 88.72] (or be NaN, giving NaN). */
INFERD_INLINE float exp_core_ps(float x)
{
    /* round(x / ln2) with the 1.5 * 2^23 trick: no floorf/roundf call (SSE2 has no vector rounding) */
    const float t = x * 1.44269504088896341f + 12582912.0f;
    const float n = t - 12582912.0f;
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* 2^n straight from t's bits: t = 1.5 * 2^23 + n holds n in its low mantissa bits, and 1.5 * 2^23's own
       bits shift out of the word (<< 23 drops them), so (bits << 23) + (127 << 23) is 2^n's pattern: no float to
       int conversion (which NaN would make undefined) and no NaN select; a NaN still comes out NaN through p. */
    unsigned tb;
    memcpy(&tb, &t, sizeof tb);
    const unsigned e = (tb << 23) + (127u << 23);
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return p * scale;
}

INFERD_INLINE float sigmoid_ps(float v) { return 1.0f / (1.0f + exp_ps(-v)); }

/* erf and GELU (activation codes 8 and 9 below; the Erf and Gelu ops in conv.c) */

/* erf_ps (the Erf op) in two parts: erf_small (erf itself, selected for |z| <= 0.921875) and erfc_big (1 - erf(|z|),
   selected above).
   Polynomials are N. Juffa's faithfully-rounded erff (also used by onnxruntime's MLAS): odd polynomial
   below the split, 1 - exp(-p(|z|)) above it, e = 0 past |z| = 3.925 where erf rounds to 1 in float32.
   Both branches are computed and selected, so the loops stay branch-free and vectorise. NaN falls
   through to the small branch (every comparison is false) and propagates. */
#define INFERD_ERF_SPLIT 0.921875f
#define INFERD_ERF_UPPER 3.925f

INFERD_INLINE float erf_small(float z)
{
    const float s = z * z;
    float p = -5.99104969e-4f;
    p = p * s + 4.99339588e-3f;
    p = p * s - 2.67667342e-2f;
    p = p * s + 1.12818025e-1f;
    p = p * s - 3.76124859e-1f;
    p = p * s + 1.28379151e-1f;
    return p * z + z; /* keeps -0.0 and NaN */
}

/* 1 - erf(t) for t >= 0.921875 (any t: the caller only selects it there); 0 beyond 3.925. */
INFERD_INLINE float erfc_big(float t)
{
    const float u = select_ps(t > INFERD_ERF_UPPER, INFERD_ERF_UPPER, t);
    float p = 1.72948930e-5f;
    p = p * u - 3.83208680e-4f;
    p = p * u + 3.88393435e-3f;
    p = p * u - 2.42545605e-2f;
    p = p * u + 1.06777847e-1f;
    p = p * u + 6.34846687e-1f;
    p = p * u + 1.28717512e-1f;
    p = p * u + u;
    const float e = exp_core_ps(-p); /* -p in [-18, -0.9] */
    return select_ps(t > INFERD_ERF_UPPER, 0.0f, e);
}

INFERD_INLINE float erf_ps(float z)
{
    const float t = select_ps(z < 0.0f, -z, z);
    const float big = 1.0f - erfc_big(t);
    const float small = erf_small(z);
    return select_ps(t > INFERD_ERF_SPLIT, select_ps(z < 0.0f, -big, big), small);
}

/* 0.5 x (1 + erf(x / sqrt 2)), erf(z) as z P(z^2) / Q(z^2) (degrees 6 and 4 in z^2: the rational form of Eigen and
   XLA, within 7e-8 of erf on [-4, 4]; z is clamped there, where erf rounds to +-1 in float32). About 20 vector
   operations and one division where erf_ps's two branches and its exp took about 50: on Zen 3 0.55 ns an
   element against 1.4 (GCC's vectors, one thread), and vit_tiny's fc1 (197 x 192 x 768 with its GELU fused) spent
   a quarter of its time there. 1 + erf(z) cancels for z < 0, so the error stays absolute (a few 1e-7 times
   |x|), as in onnxruntime's Gelu, rather than relative to a tiny result. Below z = -4 the result is -0 (also
   for x = -inf, where the formula gives -inf * 0 = NaN); NaN passes through the clamp (every comparison false). */
INFERD_INLINE float gelu_erf_ps(float x)
{
    const float z0 = x * 0.70710678118654752f;
    const float z = select_ps(z0 > 4.0f, 4.0f, select_ps(z0 < -4.0f, -4.0f, z0));
    const float s = z * z;
    float p = -2.72614225801306e-10f;
    p = p * s + 2.77068142495902e-08f;
    p = p * s - 2.10102402082508e-06f;
    p = p * s - 5.69250639462346e-05f;
    p = p * s - 7.34990630326855e-04f;
    p = p * s - 2.95459980854025e-03f;
    p = p * s - 1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * s - 2.13374055278905e-04f;
    q = q * s - 1.68282697438203e-03f;
    q = q * s - 7.37332916720468e-03f;
    q = q * s - 1.42647390514189e-02f;
    return select_ps(z0 < -4.0f, -0.0f, (0.5f * x) * (1.0f + z * p / q));
}

/* 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3). Below x = -10 the value is under
   1e-36 in magnitude and the result is -0 (x = -inf would otherwise give -inf). */
INFERD_INLINE float gelu_tanh_ps(float x)
{
    const float u2 = x * (1.5957691216057308f + 0.0713548162726f * x * x);
    const float a = select_ps(u2 > 87.33f, -87.33f, select_ps(u2 < -88.72f, 88.72f, -u2));
    const float y = x / (1.0f + exp_core_ps(a));
    return select_ps(x < -10.0f, -0.0f, y);
}

/* v < 0 ? 0 : v (not fmaxf) keeps NaN as NaN, like np.maximum */
#define INFERD_ACT_RELU(v) ((v) < 0.0f ? 0.0f : (v))
#define INFERD_ACT_CLIP(v) ((v) < p0 ? p0 : ((v) > p1 ? p1 : (v)))
#define INFERD_ACT_LEAKY(v) (select_ps((v) < 0.0f, (v) * p0, (v)))
#define INFERD_ACT_SIGMOID(v) (sigmoid_ps(v))
/* v / (1 + e^-v): one division, where v * sigmoid(v) divides and then multiplies (0.53 against 0.59 ns a value,
   AVX2, Zen 3; the same value within an ulp) */
#define INFERD_ACT_SILU(v) ((v) / (1.0f + exp_ps(-(v))))
#define INFERD_ACT_HSWISH(v) ((v) * INFERD_CLAMP01((v) * (1.0f / 6.0f) + 0.5f))
#define INFERD_ACT_HSIGMOID(v) (INFERD_CLAMP01((v) * p0 + p1))
#define INFERD_ACT_GELU(v) (gelu_erf_ps(v))
#define INFERD_ACT_GELU_TANH(v) (gelu_tanh_ps(v))
/* codes applied after a store rather than in vector registers (a polynomial and a division or two each) */
#define INFERD_ACT_COSTLY(act) ((act) == 4 || (act) == 5 || (act) == 8 || (act) == 9)
#define INFERD_CLAMP01(t) (select_ps((t) < 0.0f, 0.0f, select_ps((t) > 1.0f, 1.0f, (t))))

/* Expands LOOP(EXPR) once per activation code (the switch stays outside the loops). */
#define INFERD_ACT_SWITCH(act, LOOP)                \
    switch (act) {                                  \
    case 1: LOOP(INFERD_ACT_RELU); break;           \
    case 2: LOOP(INFERD_ACT_CLIP); break;           \
    case 3: LOOP(INFERD_ACT_LEAKY); break;          \
    case 4: LOOP(INFERD_ACT_SIGMOID); break;        \
    case 5: LOOP(INFERD_ACT_SILU); break;           \
    case 6: LOOP(INFERD_ACT_HSWISH); break;         \
    case 7: LOOP(INFERD_ACT_HSIGMOID); break;       \
    case 8: LOOP(INFERD_ACT_GELU); break;           \
    case 9: LOOP(INFERD_ACT_GELU_TANH); break;      \
    default: break;                                 \
    }

/* Copy of a short row without a libc call per row (a plain loop would be turned back into memcpy by GCC's
   loop distribution, one call per row): 8- and 4-float chunks become vector moves, the last three floats are
   spelled out (as a loop they became the call again). Long rows go to memcpy. */
INFERD_INLINE void copy_row(float* restrict d, const float* restrict s, ptrdiff_t n)
{
    if (n >= 64) {
        memcpy(d, s, sizeof(float) * (size_t)n);
        return;
    }
    ptrdiff_t k = 0;
    for (; k + 8 <= n; k += 8) memcpy(d + k, s + k, 8 * sizeof(float));
    if (k + 4 <= n) {
        memcpy(d + k, s + k, 4 * sizeof(float));
        k += 4;
    }
    if (k < n) d[k] = s[k];
    if (k + 1 < n) d[k + 1] = s[k + 1];
    if (k + 2 < n) d[k + 2] = s[k + 2];
}

INFERD_INLINE void act_inplace(float* restrict d, ptrdiff_t n, int act, float p0, float p1)
{
#define INFERD_INPLACE_LOOP(F)                                  \
    for (ptrdiff_t k = 0; k < n; ++k) {                         \
        const float v = d[k];                                   \
        d[k] = F(v);                                            \
    }
    INFERD_ACT_SWITCH(act, INFERD_INPLACE_LOOP)
#undef INFERD_INPLACE_LOOP
}

/* act_inplace at the machine's vector width, for code built for the baseline ISA (SSE2 on x86-64), where the
   inlined loop runs a costly activation (a vector exp or erf: INFERD_ACT_COSTLY) four lanes wide. gemm.c's
   store_tile: a 16-row linear layer's GELU cost 22 us of 172 there, 10.6 as a separate (cloned) pass. */
INFERD_CLONES __attribute__((unused)) static void act_vec(float* d, ptrdiff_t n, int act, float p0, float p1)
{
    act_inplace(d, n, act, p0, p1);
}

/* M ? A : B lane by lane on GNU generic vectors of type VT (integer twin VI, M a comparison's lane mask): bitwise,
   so it compiles to a blend on every target (the vector ?: is C++ only). */
#define INFERD_VSEL(VT, VI, M, A, B) ((VT)(((VI)(A) & (M)) | ((VI)(B) & ~(M))))

/* The generic vector of the loops written on explicit vectors without a per-ISA dispatch of their own (dwconv.c's
   rows, gemm.c's GEMVs and column tail, rnn.c's recurrence, rows.c's max): INFERD_GV floats, 8 on x86-64 (a ymm
   register in the AVX2 / AVX-512 clones, two xmm in the baseline one), 4 on aarch64 (a NEON q register: wider
   vectors are lowered there in pieces and through the stack, which tests/test_native_codegen.py looks for). */
#if defined(__aarch64__)
#define INFERD_GV 4
#else
#define INFERD_GV 8
#endif
typedef float inferd_gvf __attribute__((vector_size(4 * INFERD_GV)));
typedef int inferd_gvi __attribute__((vector_size(4 * INFERD_GV)));

/* Per-thread workspace slots of a parallel job (convtile.c's column bands, convdirect.c's input bands): a task
   claims a free one of `slots` (bits of *busy) while it runs; -1 when none is free (more threads than when the
   workspace was sized: the task allocates its own). */
INFERD_INLINE int inferd_slot_claim(unsigned long long* busy, int slots)
{
    unsigned long long b = __atomic_load_n(busy, __ATOMIC_ACQUIRE);
    for (;;) {
        const int f = ~b ? __builtin_ctzll(~b) : 64;
        if (f >= slots) return -1;
        if (__atomic_compare_exchange_n(busy, &b, b | (1ULL << f), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return f;
    }
}

INFERD_INLINE void inferd_slot_release(unsigned long long* busy, int slot)
{
    if (slot >= 0) __atomic_fetch_and(busy, ~(1ULL << slot), __ATOMIC_RELEASE);
}

/* gemm.c's micro-kernel for the current ISA with B's row k at b + boff[k]: an mrk x nr tile of raw sums to t
   (pitch nr) from rows 0..mrk-1 of an 8-row A panel packed by inferd_gemm_pack_a (a at the panel + row offset). */
typedef void (*inferd_ukoff_fn)(long kc, const float* a, const float* b, const long long* boff, float* t);
inferd_ukoff_fn inferd_gemm_ukoff(int* mrk, int* nr);
/* Its taller form where the ISA has one (else NULL): mrw rows (mrw / 8 consecutive panels of weights packed over
   the whole K, so kc is K) x vl columns, the raw tile to t (pitch vl). */
inferd_ukoff_fn inferd_gemm_ukoff_wide(int* mrw, int* vl);

/* Activations on a whole vector X of type VT (integer twin VI): comparisons give lane masks, selects are
   bitwise, so these compile to blends/min/max on every target. NaN compares false and passes through, like
   the scalar INFERD_ACT_* forms above. Codes without a vector form here (INFERD_ACT_COSTLY) are applied after
   the store by act_inplace. */
#define INFERD_VCLAMP(VT, VI, X, LO, HI)                   \
    do {                                                   \
        const VT lo_ = (LO) - (VT){0}, hi_ = (HI) - (VT){0}; \
        X = INFERD_VSEL(VT, VI, X < lo_, lo_, X);          \
        X = INFERD_VSEL(VT, VI, X > hi_, hi_, X);          \
    } while (0)
#define INFERD_VACT(VT, VI, X, ACT, P0, P1)                                        \
    do {                                                                           \
        if ((ACT) == 1) {                                                          \
            X = INFERD_VSEL(VT, VI, X < (VT){0}, (VT){0}, X);                      \
        } else if ((ACT) == 2) {                                                   \
            INFERD_VCLAMP(VT, VI, X, P0, P1);                                      \
        } else if ((ACT) == 3) {                                                   \
            X = INFERD_VSEL(VT, VI, X < (VT){0}, X * (P0), X);                     \
        } else if ((ACT) == 6) {                                                   \
            VT t_ = X * (1.0f / 6.0f) + 0.5f;                                      \
            INFERD_VCLAMP(VT, VI, t_, 0.0f, 1.0f);                                 \
            X = X * t_;                                                            \
        } else if ((ACT) == 7) {                                                   \
            VT t_ = X * (P0) + (P1);                                               \
            INFERD_VCLAMP(VT, VI, t_, 0.0f, 1.0f);                                 \
            X = t_;                                                                \
        }                                                                          \
    } while (0)

/* max(acc, v) where a NaN on either side wins, like np.maximum (a NaN acc stays: v > acc is false). Written as
   a plain max then a NaN select so it vectorises to max + unordered compare + blend (3 ops on AVX-512); the
   former ((v > acc) | (v != v)) ? v : acc took compare, compare, mask or, blend, and was ~40% of the 3x3/2 max
   pools' time on Zen 4 (this form: 10-15% less time there, same results bit for bit). */
INFERD_INLINE float max_nan(float acc, float v)
{
    const float m = v > acc ? v : acc;
    return v != v ? v : m;
}

/* How many tasks to split `items` independent pieces (channels, rows, planes) into, for about `work` element
   operations in all: one below ~32k (a hand-off costs more than it saves), else a few per pool thread so idle
   threads can take over a slow one's share. Defined in pool.c. */
int inferd_pool_chunks(long long items, double work);
/* Threads that `work` keeps busy at `per_thread` of it each: between 2 and the pool's size (the pool's size
   when it has at most 2); callers decide first whether to split at all. */
int inferd_pool_useful_threads(double work, double per_thread);


/* Work for the pool's idle workers (pool.c): a worker spinning between jobs calls fn(ctx) now and then; fn does a
   bounded piece of work (the streaming loaders: one read of at most 64 KiB) and returns 1, or 0 when it has
   nothing ready. One slot: set returns 0 when another owner holds it. Clearing it returns once no worker is
   inside fn any more, so that ctx may be freed (or its arena reused) right after. */
typedef struct {
    int (*fn)(void* ctx);
    void* ctx;
} inferd_idle_work;
int inferd_pool_set_idle_work(inferd_idle_work* w);
void inferd_pool_clear_idle_work(inferd_idle_work* w);

#endif
