/* The cores' peak FMA throughput, the roofline's ceiling for `inferd bench --layers`: independent FMA
   chains on registers only (no loads, no stores inside the loop), in the widest vectors the CPU has, on
   every pool thread at once. 12 chains hide the FMA latency (4-5 cycles) at 2 FMAs per cycle; without
   -ffast-math the compiler may not reassociate them, so the loop runs as written. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c99 */
#include <time.h>

#include "inferd_internal.h"
#include "inferd_native.h"

typedef float pk4 __attribute__((vector_size(16)));

#define PEAK_LOOP(V, LANES)                                                                          \
    /* distinct seeds: equal chains would be merged into one by common-subexpression elimination */     \
    V z = {0};                                                                                       \
    V a0 = z + 0.1f, a1 = z + 0.2f, a2 = z + 0.3f, a3 = z + 0.4f, a4 = z + 0.5f, a5 = z + 0.6f,       \
      a6 = z + 0.7f, a7 = z + 0.8f, a8 = z + 0.9f, a9 = z + 1.1f, a10 = z + 1.2f, a11 = z + 1.3f;    \
    V m = z + 0.999999f, c = z + 1e-7f;                                                              \
    for (long long i = 0; i < iters; i++) {                                                          \
        a0 = a0 * m + c; a1 = a1 * m + c; a2 = a2 * m + c; a3 = a3 * m + c;                          \
        a4 = a4 * m + c; a5 = a5 * m + c; a6 = a6 * m + c; a7 = a7 * m + c;                          \
        a8 = a8 * m + c; a9 = a9 * m + c; a10 = a10 * m + c; a11 = a11 * m + c;                      \
    }                                                                                                \
    V s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;                               \
    float r = 0;                                                                                     \
    for (int k = 0; k < LANES; k++) r += s[k];                                                       \
    return r;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(INFERD_NO_CLONES)
typedef float pk8 __attribute__((vector_size(32)));
typedef float pk16 __attribute__((vector_size(64)));
__attribute__((target("avx512f,avx2,fma"))) static float peak16(long long iters) { PEAK_LOOP(pk16, 16) }
__attribute__((target("avx2,fma"))) static float peak8(long long iters) { PEAK_LOOP(pk8, 8) }
#define PEAK_X86 1
#endif
static float peak4(long long iters) { PEAK_LOOP(pk4, 4) }

typedef struct {
    long long iters;
    int lanes;
    volatile float sink;
} peak_ctx;

static void peak_task(void* p, long long task)
{
    peak_ctx* c = (peak_ctx*)p;
    (void)task;
    float r;
#ifdef PEAK_X86
    if (c->lanes == 16) r = peak16(c->iters);
    else if (c->lanes == 8) r = peak8(c->iters);
    else
#endif
        r = peak4(c->iters);
    c->sink += r;
}

double inferd_fma_peak(long long iters, int threads)
{
    peak_ctx c = {iters > 0 ? iters : 1, 4, 0.0f};
#ifdef PEAK_X86
    const int l = inferd_x86_level();
    c.lanes = l == 2 ? 16 : l == 1 ? 8 : 4;
#endif
    if (threads < 1) threads = 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    inferd_parallel(peak_task, &c, threads, threads);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    /* 12 chains x lanes x 2 FLOPs (multiply + add) per iteration, per thread */
    return s > 0 ? 24.0 * c.lanes * (double)c.iters * threads / s : 0.0;
}
