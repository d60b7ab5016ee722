/* Data movement on hot paths of exported models: CumSum (sinusoidal position encodings), DepthToSpace (pixel
 * shuffle), GatherND / ScatterND (detectors' post-processing, Swin's window masks).
 *
 * Why native: each is one pass over memory, but numpy spends it in temporaries, fancy-index set-up or a
 * strided scan (np.cumsum along a middle axis walks the inner axis one element at a time); these loops keep
 * the inner axis contiguous and split the outer work over the pool.
 */
#include <stddef.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

/* ---------------------------------------------------------------- CumSum */

typedef struct {
    const float* x;
    float* y;
    long long outer, n, inner, chunk;
    int exclusive, reverse;
} cumsum_job;

#define CS_W 256

/* the scan of w columns (row stride `in`) of one outer slice: running sums in a local block of at most CS_W
   columns (registers or L1), the row loop free of branches so that the column loop vectorises */
INFERD_CLONES
static void cumsum_cols(const float* x, float* y, long long n, long long in, long long w, int exclusive, int reverse)
{
    float acc[CS_W];
    const long long step = reverse ? -in : in, first = reverse ? (n - 1) * in : 0;
    for (long long q0 = 0; q0 < w; q0 += CS_W) {
        const long long ww = w - q0 < CS_W ? w - q0 : CS_W;
        for (long long q = 0; q < ww; ++q) acc[q] = 0.0f;
        const float* xr = x + first + q0;
        float* yr = y + first + q0;
        if (exclusive)
            for (long long s = 0; s < n; ++s, xr += step, yr += step)
                for (long long q = 0; q < ww; ++q) { const float v = xr[q]; yr[q] = acc[q]; acc[q] += v; }
        else
            for (long long s = 0; s < n; ++s, xr += step, yr += step)
                for (long long q = 0; q < ww; ++q) { acc[q] += xr[q]; yr[q] = acc[q]; }
    }
}

/* task = a range of inner columns of one outer slice */
static void cumsum_task(void* p, long long t)
{
    const cumsum_job* j = (const cumsum_job*)p;
    const long long per = (j->inner + j->chunk - 1) / j->chunk;
    const long long o = t / per, i0 = (t % per) * j->chunk;
    const long long w = i0 + j->chunk < j->inner ? j->chunk : j->inner - i0;
    const long long off = o * j->n * j->inner + i0;
    cumsum_cols(j->x + off, j->y + off, j->n, j->inner, w, j->exclusive, j->reverse);
}

void inferd_cumsum(const float* x, float* y, long long outer, long long n, long long inner, int exclusive,
                   int reverse)
{
    if (outer <= 0 || n <= 0 || inner <= 0) return;
    /* column ranges of at least 128 floats (narrower ones spend more on the row loop than on the sums), enough
       of them for the pool */
    long long chunk = inner;
    const int threads = inferd_pool_threads();
    while (chunk >= 256 && outer * ((inner + chunk - 1) / chunk) < 4LL * threads) chunk = (chunk + 1) / 2;
    cumsum_job j = {x, y, outer, n, inner, chunk, exclusive, reverse};
    const long long tasks = outer * ((inner + chunk - 1) / chunk);
    if (inferd_pool_chunks(tasks, (double)outer * n * inner) <= 1)
        for (long long t = 0; t < tasks; ++t) cumsum_task(&j, t);
    else
        inferd_parallel(cumsum_task, &j, tasks, 0);
}

/* ---------------------------------------------------------------- DepthToSpace */

typedef struct {
    const char* x;
    char* y;
    long long C, H, W, bs, es;
    int crd;
} d2s_job;

/* task = one (image, output channel): each output row gathers bs input rows, interleaved */
static void d2s_task(void* p, long long t)
{
    const d2s_job* j = (const d2s_job*)p;
    const long long bs = j->bs, C = j->C, H = j->H, W = j->W, es = j->es;
    const long long c = t % C, n = t / C;
    const long long OW = W * bs;
    char* yc = j->y + (size_t)t * H * bs * OW * es;
    for (long long h = 0; h < H; ++h)
        for (long long i = 0; i < bs; ++i) {
            char* yr = yc + (size_t)((h * bs + i) * OW) * es;
            for (long long q = 0; q < bs; ++q) {
                /* DCR: input channel (i * bs + q) * C + c; CRD: c * bs * bs + i * bs + q */
                const long long ic = j->crd ? c * bs * bs + i * bs + q : (i * bs + q) * C + c;
                const char* xr = j->x + (size_t)(((n * C * bs * bs + ic) * H + h) * W) * es;
                if (es == 4) {
                    const float* restrict xf = (const float*)xr;
                    float* restrict yf = (float*)yr + q;
                    for (long long w = 0; w < W; ++w) yf[w * bs] = xf[w];
                } else {
                    for (long long w = 0; w < W; ++w) memcpy(yr + (size_t)(w * bs + q) * es, xr + (size_t)w * es, (size_t)es);
                }
            }
        }
}

void inferd_depth_to_space(const void* x, void* y, long long N, long long C, long long H, long long W, long long bs,
                           int crd, long long elem_size)
{
    d2s_job j = {(const char*)x, (char*)y, C, H, W, bs, elem_size, crd};
    const long long tasks = N * C;
    if (inferd_pool_chunks(tasks, (double)N * C * H * W * bs * bs) <= 1)
        for (long long t = 0; t < tasks; ++t) d2s_task(&j, t);
    else
        inferd_parallel(d2s_task, &j, tasks, 0);
}

/* ---------------------------------------------------------------- GatherND / ScatterND */

/* the slice offset (in slices) of index tuple idx[0..q) into dims[0..q), negative indices from the end;
   -1 when an index is out of range */
static inline long long nd_offset(const long long* idx, const long long* dims, int q)
{
    long long off = 0;
    for (int k = 0; k < q; ++k) {
        long long v = idx[k];
        if (v < 0) v += dims[k];
        if (v < 0 || v >= dims[k]) return -1;
        off = off * dims[k] + v;
    }
    return off;
}

long long inferd_gather_nd(const void* data, const long long* dims, int q, long long batch, long long batch_bytes,
                           const long long* idx, long long tuples, long long slice_bytes, void* out)
{
    const char* d = (const char*)data;
    char* o = (char*)out;
    for (long long b = 0; b < batch; ++b)
        for (long long t = 0; t < tuples; ++t) {
            const long long off = nd_offset(idx + (b * tuples + t) * q, dims, q);
            if (off < 0) return b * tuples + t;
            memcpy(o, d + b * batch_bytes + off * slice_bytes, (size_t)slice_bytes);
            o += slice_bytes;
        }
    return -1;
}

typedef struct { const char* src; char* dst; long long bytes, chunk; } copy_job;

static void copy_task(void* p, long long t)
{
    const copy_job* j = (const copy_job*)p;
    const long long o = t * j->chunk, n = o + j->chunk < j->bytes ? j->chunk : j->bytes - o;
    memcpy(j->dst + o, j->src + o, (size_t)n);
}

long long inferd_scatter_nd(float* out, const float* data, long long total, const long long* dims, int q,
                            const long long* idx, long long tuples, const float* updates, long long slice,
                            int reduction)
{
    if (data && data != out) {
        /* the copy of the data dominates a scatter of a few rows: split it over the pool in 256 KB pieces */
        copy_job c = {(const char*)data, (char*)out, total * (long long)sizeof(float), 256 * 1024};
        const long long pieces = (c.bytes + c.chunk - 1) / c.chunk;
        if (pieces > 1 && inferd_pool_chunks(pieces, (double)total) > 1)
            inferd_parallel(copy_task, &c, pieces, 0);
        else
            memcpy(out, data, (size_t)c.bytes);
    }
    for (long long t = 0; t < tuples; ++t) {
        const long long off = nd_offset(idx + t * q, dims, q);
        if (off < 0) return t;
        float* restrict dst = out + off * slice;
        const float* restrict src = updates + t * slice;
        switch (reduction) {
        case 0: memcpy(dst, src, sizeof(float) * (size_t)slice); break;
        case 1: for (long long k = 0; k < slice; ++k) dst[k] += src[k]; break;
        case 2: for (long long k = 0; k < slice; ++k) dst[k] *= src[k]; break;
        case 3: for (long long k = 0; k < slice; ++k) dst[k] = dst[k] < src[k] ? src[k] : dst[k]; break;
        default: for (long long k = 0; k < slice; ++k) dst[k] = dst[k] > src[k] ? src[k] : dst[k]; break;
        }
    }
    return -1;
}
