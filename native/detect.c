/* Detection post-processing: non-maximum suppression, RoiAlign, TopK rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

typedef struct { float s; int i; } scored;

/* descending score, ascending index on ties */
static int cmp_scored(const void* a, const void* b)
{
    const scored* p = (const scored*)a;
    const scored* q = (const scored*)b;
    if (p->s > q->s) return -1;
    if (p->s < q->s) return 1;
    return (p->i > q->i) - (p->i < q->i);
}

long long inferd_nms(const float* boxes, const float* scores, int B, int C, int N, int center, long long max_out,
                     float iou_thr, float score_thr, int has_score_thr, long long* out, long long cap)
{
    if (max_out <= 0 || N <= 0) return 0;
    /* per batch: each box as (xmin, ymin, xmax, ymax, area), shared by every class */
    float* geo = (float*)malloc(sizeof(float) * 5 * (size_t)N);
    scored* cand = (scored*)malloc(sizeof(scored) * (size_t)N);
    int* kept = (int*)malloc(sizeof(int) * (size_t)N);
    if (!geo || !cand || !kept) { free(geo); free(cand); free(kept); return -2; }
    long long n_out = 0;
    for (int b = 0; b < B; ++b) {
        const float* bx = boxes + (size_t)b * N * 4;
        for (int i = 0; i < N; ++i) {
            const float* p = bx + (size_t)i * 4;
            float x0, x1, y0, y1;
            if (center) {
                float hw = p[2] / 2, hh = p[3] / 2;
                x0 = p[0] - hw; x1 = p[0] + hw; y0 = p[1] - hh; y1 = p[1] + hh;
            } else {
                y0 = p[0] < p[2] ? p[0] : p[2]; y1 = p[0] < p[2] ? p[2] : p[0];
                x0 = p[1] < p[3] ? p[1] : p[3]; x1 = p[1] < p[3] ? p[3] : p[1];
            }
            float* g = geo + (size_t)i * 5;
            g[0] = x0; g[1] = y0; g[2] = x1; g[3] = y1; g[4] = (x1 - x0) * (y1 - y0);
        }
        for (int c = 0; c < C; ++c) {
            const float* sc = scores + ((size_t)b * C + c) * N;
            int m = 0;
            for (int i = 0; i < N; ++i)
                if (!has_score_thr || sc[i] > score_thr) { cand[m].s = sc[i]; cand[m].i = i; ++m; }
            qsort(cand, (size_t)m, sizeof(scored), cmp_scored);
            long long nk = 0;
            for (int t = 0; t < m && nk < max_out; ++t) {
                const float* g = geo + (size_t)cand[t].i * 5;
                int suppressed = 0;
                for (long long s = 0; s < nk; ++s) {
                    const float* h = geo + (size_t)kept[s] * 5;
                    float ix0 = g[0] > h[0] ? g[0] : h[0], ix1 = g[2] < h[2] ? g[2] : h[2];
                    if (ix1 <= ix0) continue;
                    float iy0 = g[1] > h[1] ? g[1] : h[1], iy1 = g[3] < h[3] ? g[3] : h[3];
                    if (iy1 <= iy0) continue;
                    float inter = (ix1 - ix0) * (iy1 - iy0);
                    float uni = g[4] + h[4] - inter;
                    if (inter <= 0.0f || g[4] <= 0.0f || h[4] <= 0.0f || uni <= 0.0f) continue;
                    if (inter / uni > iou_thr) { suppressed = 1; break; }
                }
                if (suppressed) continue;
                if (n_out >= cap) { free(geo); free(cand); free(kept); return -1; }
                kept[nk++] = cand[t].i;
                out[n_out * 3] = b; out[n_out * 3 + 1] = c; out[n_out * 3 + 2] = cand[t].i;
                ++n_out;
            }
        }
    }
    free(geo); free(cand); free(kept);
    return n_out;
}

typedef struct { int p1, p2, p3, p4; float w1, w2, w3, w4; } bilin;

typedef struct {
    const float* x; int N, C, H, W; const float* rois; const long long* batch; int R, OH, OW, sampling;
    float scale; int half_pixel, mode_max; float* y; int failed;
} roi_job;

static void roi_task(void* p, long long r)
{
    roi_job* j = (roi_job*)p;
    const float* roi = j->rois + (size_t)r * 4;
    const int H = j->H, W = j->W, OH = j->OH, OW = j->OW;
    float off = j->half_pixel ? 0.5f : 0.0f;
    float sw = roi[0] * j->scale - off, sh = roi[1] * j->scale - off;
    float ew = roi[2] * j->scale - off, eh = roi[3] * j->scale - off;
    float rw = ew - sw, rh = eh - sh;
    if (!j->half_pixel) { rw = rw > 1.0f ? rw : 1.0f; rh = rh > 1.0f ? rh : 1.0f; }
    float bh = rh / (float)OH, bw = rw / (float)OW;
    int gh = j->sampling > 0 ? j->sampling : (int)ceilf(rh / (float)OH);
    int gw = j->sampling > 0 ? j->sampling : (int)ceilf(rw / (float)OW);
    if (gh < 0) gh = 0;
    if (gw < 0) gw = 0;
    int count = gh * gw > 1 ? gh * gw : 1;
    size_t npc = (size_t)OH * OW * gh * gw;
    bilin* pc = (bilin*)malloc(sizeof(bilin) * (npc ? npc : 1));
    if (!pc) { j->failed = 1; return; }
    size_t q = 0;
    for (int ph = 0; ph < OH; ++ph) for (int pw = 0; pw < OW; ++pw)
        for (int iy = 0; iy < gh; ++iy) {
            float yy = sh + ph * bh + ((float)iy + 0.5f) * bh / (float)gh;
            for (int ix = 0; ix < gw; ++ix, ++q) {
                float xx = sw + pw * bw + ((float)ix + 0.5f) * bw / (float)gw;
                float yv = yy, xv = xx;
                bilin* b = pc + q;
                if (yv < -1.0f || yv > (float)H || xv < -1.0f || xv > (float)W) {
                    memset(b, 0, sizeof(*b));
                    continue;
                }
                if (yv <= 0) yv = 0;
                if (xv <= 0) xv = 0;
                int yl = (int)yv, xl = (int)xv, yh, xh;
                if (yl >= H - 1) { yh = yl = H - 1; yv = (float)yl; } else yh = yl + 1;
                if (xl >= W - 1) { xh = xl = W - 1; xv = (float)xl; } else xh = xl + 1;
                float ly = yv - yl, lx = xv - xl, hy = 1.0f - ly, hx = 1.0f - lx;
                b->p1 = yl * W + xl; b->p2 = yl * W + xh; b->p3 = yh * W + xl; b->p4 = yh * W + xh;
                b->w1 = hy * hx; b->w2 = hy * lx; b->w3 = ly * hx; b->w4 = ly * lx;
            }
        }
    const int per = gh * gw;
    for (int c = 0; c < j->C; ++c) {
        const float* xp = j->x + ((size_t)j->batch[r] * j->C + c) * (size_t)H * W;
        float* yp = j->y + ((size_t)r * j->C + c) * (size_t)OH * OW;
        for (int o = 0; o < OH * OW; ++o) {
            const bilin* b = pc + (size_t)o * per;
            if (j->mode_max) {
                float m = 0.0f;
                for (int s = 0; s < per; ++s) {
                    float v = b[s].w1 * xp[b[s].p1], v2 = b[s].w2 * xp[b[s].p2];
                    float v3 = b[s].w3 * xp[b[s].p3], v4 = b[s].w4 * xp[b[s].p4];
                    v = v > v2 ? v : v2; v = v > v3 ? v : v3; v = v > v4 ? v : v4;
                    m = (s == 0 || v > m) ? v : m;
                }
                yp[o] = m;
            } else {
                float acc = 0.0f;
                for (int s = 0; s < per; ++s)
                    acc += b[s].w1 * xp[b[s].p1] + b[s].w2 * xp[b[s].p2] + b[s].w3 * xp[b[s].p3] + b[s].w4 * xp[b[s].p4];
                yp[o] = acc / (float)count;
            }
        }
    }
    free(pc);
}

int inferd_roi_align(const float* x, int N, int C, int H, int W, const float* rois, const long long* batch, int R,
                     int OH, int OW, int sampling, float scale, int half_pixel, int mode_max, float* y)
{
    roi_job j = {x, N, C, H, W, rois, batch, R, OH, OW, sampling, scale, half_pixel, mode_max, y, 0};
    double work = (double)R * C * OH * OW * 4.0 * (sampling > 0 ? sampling * sampling : 4);
    if (inferd_pool_chunks(R, work) <= 1) {
        for (long long r = 0; r < R; ++r) roi_task(&j, r);
    } else {
        inferd_parallel(roi_task, &j, R, 0);
    }
    return j.failed ? -1 : 0;
}

/* a ranks before b: larger (largest) or smaller value first, NaN first for largest and last otherwise,
   the lower column on ties */
static int ranks_before(float a, long long ia, float b, long long ib, int largest)
{
    int an = a != a, bn = b != b;
    if (an || bn) {
        if (an && bn) return ia < ib;
        return largest ? an : bn;
    }
    if (a != b) return largest ? a > b : a < b;
    return ia < ib;
}

/* sift-down in a heap whose root is the candidate ranking *last* among the kept k */
static void heap_down(float* hv, long long* hi, long long n, long long i, int largest)
{
    for (;;) {
        long long l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && ranks_before(hv[w], hi[w], hv[l], hi[l], largest)) w = l;
        if (r < n && ranks_before(hv[w], hi[w], hv[r], hi[r], largest)) w = r;
        if (w == i) return;
        float tv = hv[i]; hv[i] = hv[w]; hv[w] = tv;
        long long ti = hi[i]; hi[i] = hi[w]; hi[w] = ti;
        i = w;
    }
}

int inferd_topk(const float* x, long long rows, long long n, long long k, int largest, float* vals, long long* idx)
{
    if (k <= 0) return 0;
    for (long long r = 0; r < rows; ++r) {
        const float* xr = x + r * n;
        float* hv = vals + r * k;
        long long* hi = idx + r * k;
        /* a heap of the best k so far, rooted at the worst of them: each later element either loses to the
           root (one comparison, the common case once the heap holds good values) or replaces it */
        for (long long i = 0; i < k; ++i) { hv[i] = xr[i]; hi[i] = i; }
        for (long long i = k / 2; i-- > 0;) heap_down(hv, hi, k, i, largest);
        for (long long i = k; i < n; ++i) {
            float v = xr[i];
            if (ranks_before(v, i, hv[0], hi[0], largest)) {
                hv[0] = v; hi[0] = i;
                heap_down(hv, hi, k, 0, largest);
            }
        }
        /* heap sort in place: the worst goes to the end, giving best-first order */
        for (long long e = k - 1; e > 0; --e) {
            float tv = hv[0]; hv[0] = hv[e]; hv[e] = tv;
            long long ti = hi[0]; hi[0] = hi[e]; hi[e] = ti;
            heap_down(hv, hi, e, 0, largest);
        }
    }
    return 0;
}
