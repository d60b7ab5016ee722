/* Row-wise kernels over the last axis: Softmax/LogSoftmax and LayerNormalization, split by rows over the pool.
 *
 * Why native: a transformer block runs a softmax over every attention row and two layer norms over every
 * token; numpy does each in 4-6 passes with temporaries (~100-200 us per call on vit_tiny, 5 ms a run).
 * Reductions are kept in 16 partial lanes so they vectorise without -ffast-math (whose reassociation we do
 * not want elsewhere); exp is inferd_internal.h's exp_ps.
 */
#define _POSIX_C_SOURCE 200112L
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

#define LANES 16

/* GCC/clang generic vectors (8 lanes on x86-64: two 128-bit halves on SSE2; 4 on aarch64, a NEON register): the
   max and the any-NaN flag are kept apart, a compare-and-select for the max and an unordered compare OR'd in for
   NaN. The lane-array form with max_nan did not vectorise (GCC left it scalar: 94 us for vit_tiny's 3x197 rows of
   197 on Zen 4, this form 11 us; the max was the softmax's largest pass). */
typedef inferd_gvf rows_v;
typedef inferd_gvi rows_vi;
#define RWV INFERD_GV

/* a = max(a, v) lane by lane (a macro: vectors passed by value draw GCC's psABI note on SSE2) */
#define ROWS_VMAX(a, v) ((a) = INFERD_VSEL(rows_v, rows_vi, (v) > (a), (v), (a)))

/* The row's maximum, NaN if any element is NaN (np.max's answer): 16 floats a step in 16 / RWV vectors (a max
   is exact, so the lanes' order does not matter). */
INFERD_INLINE float row_max_nan(const float* restrict x, long long n)
{
    rows_v a[16 / RWV];
    rows_vi na[16 / RWV];
    for (int v = 0; v < 16 / RWV; ++v) a[v] = (rows_v){0} - INFINITY, na[v] = (rows_vi){0};
    long long k = 0;
    for (; k + 16 <= n; k += 16)
        for (int v = 0; v < 16 / RWV; ++v) {
            rows_v u;
            memcpy(&u, x + k + v * RWV, sizeof u);
            ROWS_VMAX(a[v], u);
            na[v] |= u != u;
        }
    float r = -INFINITY;
    int nan_ = 0;
    for (int v = 0; v < 16 / RWV; ++v)
        for (int l = 0; l < RWV; ++l) {
            r = a[v][l] > r ? a[v][l] : r;
            nan_ |= na[v][l];
        }
    for (; k < n; ++k) {
        r = x[k] > r ? x[k] : r;
        nan_ |= x[k] != x[k];
    }
    return nan_ ? NAN : r;
}

INFERD_INLINE float row_sum(const float* restrict x, long long n)
{
    float s[LANES] = {0};
    long long k = 0;
    for (; k + LANES <= n; k += LANES)
        for (int l = 0; l < LANES; ++l) s[l] += x[k + l];
    float r = 0.0f;
    for (int l = 0; l < LANES; ++l) r += s[l];
    for (; k < n; ++k) r += x[k];
    return r;
}

INFERD_INLINE float row_sqdev(const float* restrict x, long long n, float mean)
{
    float s[LANES] = {0};
    long long k = 0;
    for (; k + LANES <= n; k += LANES)
        for (int l = 0; l < LANES; ++l) {
            const float d = x[k + l] - mean;
            s[l] += d * d;
        }
    float r = 0.0f;
    for (int l = 0; l < LANES; ++l) r += s[l];
    for (; k < n; ++k) r += (x[k] - mean) * (x[k] - mean);
    return r;
}

INFERD_CLONES
static void softmax_rows(const float* x, float* y, long long r0, long long r1, long long n, int log_)
{
    for (long long r = r0; r < r1; ++r) {
        const float* restrict xr = x + r * n;
        float* restrict yr = y + r * n;
        const float m = row_max_nan(xr, n);
        if (m == INFINITY || m != m) { /* +inf or NaN in the row: the plain formula, as numpy gives it */
            for (long long k = 0; k < n; ++k) yr[k] = expf(xr[k] - m);
        } else {
            for (long long k = 0; k < n; ++k) yr[k] = exp_ps(xr[k] - m);
        }
        const float s = row_sum(yr, n);
        if (log_) {
            const float ls = logf(s);
            for (long long k = 0; k < n; ++k) yr[k] = (xr[k] - m) - ls;
        } else {
            const float inv = 1.0f / s;
            for (long long k = 0; k < n; ++k) yr[k] *= inv;
        }
    }
}

INFERD_CLONES
static void layernorm_rows(const float* x, float* y, long long r0, long long r1, long long n, const float* g,
                           const float* b, float eps)
{
    for (long long r = r0; r < r1; ++r) {
        const float* restrict xr = x + r * n;
        float* restrict yr = y + r * n;
        const float mean = row_sum(xr, n) / (float)n;
        const float var = row_sqdev(xr, n, mean) / (float)n;
        const float inv = 1.0f / sqrtf(var + eps);
        if (g && b)
            for (long long k = 0; k < n; ++k) yr[k] = (xr[k] - mean) * inv * g[k] + b[k];
        else if (g)
            for (long long k = 0; k < n; ++k) yr[k] = (xr[k] - mean) * inv * g[k];
        else
            for (long long k = 0; k < n; ++k) yr[k] = (xr[k] - mean) * inv;
    }
}

INFERD_INLINE float row_sumsq(const float* restrict x, long long n)
{
    float s[LANES] = {0};
    long long k = 0;
    for (; k + LANES <= n; k += LANES)
        for (int l = 0; l < LANES; ++l) s[l] += x[k + l] * x[k + l];
    float r = 0.0f;
    for (int l = 0; l < LANES; ++l) r += s[l];
    for (; k < n; ++k) r += x[k] * x[k];
    return r;
}

INFERD_CLONES
static void rmsnorm_rows(const float* x, float* y, long long r0, long long r1, long long n, const float* g, float eps)
{
    for (long long r = r0; r < r1; ++r) {
        const float* restrict xr = x + r * n;
        float* restrict yr = y + r * n;
        const float inv = 1.0f / sqrtf(row_sumsq(xr, n) / (float)n + eps);
        if (g)
            for (long long k = 0; k < n; ++k) yr[k] = xr[k] * inv * g[k];
        else
            for (long long k = 0; k < n; ++k) yr[k] = xr[k] * inv;
    }
}

/* x / max(||x||, eps) per row, divided (not multiplied by the reciprocal) as ReduceL2, Clip and Div compute it */
INFERD_CLONES
static void l2norm_rows(const float* x, float* y, long long r0, long long r1, long long n, float eps)
{
    for (long long r = r0; r < r1; ++r) {
        const float* restrict xr = x + r * n;
        float* restrict yr = y + r * n;
        float nrm = sqrtf(row_sumsq(xr, n));
        nrm = nrm < eps ? eps : nrm; /* (a NaN norm stays NaN, as Clip leaves it) */
        for (long long k = 0; k < n; ++k) yr[k] = xr[k] / nrm;
    }
}

typedef struct {
    const float* x;
    float* y;
    long long rows, n;
    const float *g, *b;
    float eps;
    int kind, log_, chunks;
} rows_job;

static void rows_task(void* p, long long t)
{
    const rows_job* j = (const rows_job*)p;
    const long long r0 = j->rows * t / j->chunks, r1 = j->rows * (t + 1) / j->chunks;
    if (j->kind == 0)
        softmax_rows(j->x, j->y, r0, r1, j->n, j->log_);
    else if (j->kind == 2)
        rmsnorm_rows(j->x, j->y, r0, r1, j->n, j->g, j->eps);
    else if (j->kind == 3)
        l2norm_rows(j->x, j->y, r0, r1, j->n, j->eps);
    else
        layernorm_rows(j->x, j->y, r0, r1, j->n, j->g, j->b, j->eps);
}


void inferd_softmax(const float* x, float* y, long long rows, long long n, int log_)
{
    rows_job j = {x, y, rows, n, NULL, NULL, 0.0f, 0, log_, inferd_pool_chunks(rows, (double)rows * n)};
    inferd_parallel(rows_task, &j, j.chunks, 0);
}

void inferd_layernorm(const float* x, float* y, long long rows, long long n, const float* g, const float* b, float eps)
{
    rows_job j = {x, y, rows, n, g, b, eps, 1, 0, inferd_pool_chunks(rows, (double)rows * n)};
    inferd_parallel(rows_task, &j, j.chunks, 0);
}

void inferd_rmsnorm(const float* x, float* y, long long rows, long long n, const float* g, float eps)
{
    rows_job j = {x, y, rows, n, g, NULL, eps, 2, 0, inferd_pool_chunks(rows, (double)rows * n)};
    inferd_parallel(rows_task, &j, j.chunks, 0);
}

void inferd_l2norm(const float* x, float* y, long long rows, long long n, float eps)
{
    rows_job j = {x, y, rows, n, NULL, NULL, eps, 3, 0, inferd_pool_chunks(rows, (double)rows * n)};
    inferd_parallel(rows_task, &j, j.chunks, 0);
}

/* ---------------------------------------------------------------- GroupNormalization */

typedef struct {
    const float* x;
    float* y;
    long long cg, hw; /* channels per group, pixels per channel */
    int G;
    const float *s, *b;
    float eps;
} gn_job;

/* task = (image, group): its statistics over cg * hw values, then every channel's scale and shift folded in */
INFERD_CLONES
static void gn_group(const gn_job* j, long long t)
{
    const long long len = j->cg * j->hw;
    const float* restrict xg = j->x + t * len;
    float* restrict yg = j->y + t * len;
    const float mean = row_sum(xg, len) / (float)len;
    const float var = row_sqdev(xg, len, mean) / (float)len;
    const float inv = 1.0f / sqrtf(var + j->eps);
    const long long c0 = (t % j->G) * j->cg;
    for (long long c = 0; c < j->cg; ++c) {
        const float a = inv * j->s[c0 + c], sh = j->b[c0 + c] - mean * a;
        const float* restrict xc = xg + c * j->hw;
        float* restrict yc = yg + c * j->hw;
        for (long long k = 0; k < j->hw; ++k) yc[k] = xc[k] * a + sh;
    }
}

static void gn_task(void* p, long long t) { gn_group((const gn_job*)p, t); }

void inferd_groupnorm(const float* x, float* y, long long N, long long C, long long hw, int G, const float* s,
                      const float* b, float eps)
{
    gn_job j = {x, y, C / G, hw, G, s, b, eps};
    const long long tasks = N * G;
    if (inferd_pool_chunks(tasks, (double)N * C * hw) <= 1)
        for (long long t = 0; t < tasks; ++t) gn_task(&j, t);
    else
        inferd_parallel(gn_task, &j, tasks, 0);
}

/* ---------------------------------------------------------------- row means / maxima (global pooling) */


INFERD_CLONES
static void reduce_rows_range(const float* x, float* y, long long r0, long long r1, long long n, int is_max)
{
    for (long long r = r0; r < r1; ++r)
        y[r] = is_max ? row_max_nan(x + r * n, n) : row_sum(x + r * n, n) / (float)n;
}

typedef struct {
    const float* x;
    float* y;
    long long rows, n;
    int is_max, chunks;
} red_job;

static void red_task(void* p, long long t)
{
    const red_job* j = (const red_job*)p;
    reduce_rows_range(j->x, j->y, j->rows * t / j->chunks, j->rows * (t + 1) / j->chunks, j->n, j->is_max);
}

void inferd_reduce_rows(const float* x, float* y, long long rows, long long n, int is_max)
{
    red_job j = {x, y, rows, n, is_max, inferd_pool_chunks(rows, (double)rows * n)};
    inferd_parallel(red_task, &j, j.chunks, 0);
}
