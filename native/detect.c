/* Detection post-processing: non-maximum suppression, RoiAlign, TopK rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

#define NMS_BLOCK 16

/* A candidate as one integer that orders like onnxruntime's queue: score (its bits mapped to an unsigned order,
   -0 as +0) in the high word, the complement of the box index in the low word, so that the larger key is the
   higher score and, on a tie, the lower index. A NaN score (only without a score threshold, which drops it)
   orders by its bits: a positive NaN before every number; onnxruntime's queue has no defined order for it. */
static inline unsigned long long cand_key(float s, int i)
{
    union { float f; unsigned u; } v;
    v.f = s == 0.0f ? 0.0f : s;
    unsigned o = (v.u >> 31) ? ~v.u : v.u | 0x80000000u;
    return ((unsigned long long)o << 32) | (0xffffffffu - (unsigned)i);
}

static inline int cand_index(unsigned long long k) { return (int)(0xffffffffu - (unsigned)(k & 0xffffffffu)); }

static inline void key_swap(unsigned long long* a, unsigned long long* b) { unsigned long long t = *a; *a = *b; *b = t; }

/* Hoare-style partition of a[0..n) (n >= 2) around a median of three, larger keys first; returns p with
   a[0..p) >= pivot >= a[p..n) */
static long long key_partition(unsigned long long* a, long long n)
{
    long long mid = n / 2, hi = n - 1;
    if (a[mid] > a[0]) key_swap(a + mid, a);
    if (a[hi] > a[0]) key_swap(a + hi, a);
    if (a[hi] > a[mid]) key_swap(a + hi, a + mid);
    const unsigned long long piv = a[mid];
    long long i = -1, j = n;
    for (;;) {
        do ++i; while (a[i] > piv);
        do --j; while (a[j] < piv);
        if (i >= j) return j + 1;
        key_swap(a + i, a + j);
    }
}

/* the k largest keys of a[0..n) moved to a[0..k), in no order */
static void key_select(unsigned long long* a, long long n, long long k)
{
    while (n > 16 && k > 0 && k < n) {
        long long p = key_partition(a, n);
        if (p <= k) { a += p; n -= p; k -= p; } else n = p;
    }
    if (k > 0 && k < n)  /* a short run: selection by insertion */
        for (long long q = 1; q < n; ++q) {
            unsigned long long t = a[q];
            long long r = q;
            while (r > 0 && a[r - 1] < t) { a[r] = a[r - 1]; --r; }
            a[r] = t;
        }
}

/* a[0..n) in descending order */
static void key_sort(unsigned long long* a, long long n)
{
    while (n > 16) {
        long long p = key_partition(a, n);
        if (p < n - p) { key_sort(a, p); a += p; n -= p; }
        else { key_sort(a + p, n - p); n = p; }
    }
    for (long long q = 1; q < n; ++q) {
        unsigned long long t = a[q];
        long long r = q;
        while (r > 0 && a[r - 1] < t) { a[r] = a[r - 1]; --r; }
        a[r] = t;
    }
}

/* Branch-free comparisons only vectorise when GCC may assume they do not trap; the exact IoU must round as
   onnxruntime's does, so no fused multiply-add there. (clang neither traps nor contracts by default here.) */
#if defined(__GNUC__) && !defined(__clang__)
#define NMS_OPT __attribute__((optimize("no-trapping-math", "fp-contract=off")))
#else
#define NMS_OPT
#endif

/* onnxruntime's SuppressByIOU, exactly (its division and its order of tests) */
NMS_OPT static int nms_iou_above(float gx0, float gy0, float gx1, float gy1, float ga, float kx0, float ky0, float kx1,
                                 float ky1, float ka, float thr)
{
    float ix0 = gx0 < kx0 ? kx0 : gx0, ix1 = kx1 < gx1 ? kx1 : gx1;
    float iy0 = gy0 < ky0 ? ky0 : gy0, iy1 = ky1 < gy1 ? ky1 : gy1;
    if (ix1 <= ix0 || iy1 <= iy0) return 0;
    float inter = (ix1 - ix0) * (iy1 - iy0);
    if (inter <= 0.0f) return 0;
    float uni = ga + ka - inter;
    if (ga <= 0.0f || ka <= 0.0f || uni <= 0.0f) return 0;
    return inter / uni > thr;
}

/* Whether any box of a block of kept boxes (SoA) suppresses box g. A vectorised screen without the division
   (inter >= lo * union, lo a hair under the threshold, so it passes every pair that the exact test passes),
   then the exact test on the lanes of a block that passed. */
NMS_OPT INFERD_CLONES static int nms_screen(const float* kx0, const float* ky0, const float* kx1, const float* ky1,
                                            const float* ka, float gx0, float gy0, float gx1, float gy1, float ga,
                                            float lo)
{
    int f = 0;
    for (int s = 0; s < NMS_BLOCK; ++s) {
        float ix0 = gx0 < kx0[s] ? kx0[s] : gx0, ix1 = kx1[s] < gx1 ? kx1[s] : gx1;
        float iy0 = gy0 < ky0[s] ? ky0[s] : gy0, iy1 = ky1[s] < gy1 ? ky1[s] : gy1;
        float inter = (ix1 - ix0) * (iy1 - iy0);
        float uni = ga + ka[s] - inter;
        f |= (ix1 > ix0) & (iy1 > iy0) & (inter > 0.0f) & (ka[s] > 0.0f) & (uni > 0.0f) & (inter >= lo * uni);
    }
    return f;
}

static int nms_block(const float* kx0, const float* ky0, const float* kx1, const float* ky1, const float* ka,
                     float gx0, float gy0, float gx1, float gy1, float ga, float thr, float lo)
{
    if (!nms_screen(kx0, ky0, kx1, ky1, ka, gx0, gy0, gx1, gy1, ga, lo)) return 0;
    for (int s = 0; s < NMS_BLOCK; ++s)
        if (nms_iou_above(gx0, gy0, gx1, gy1, ga, kx0[s], ky0[s], kx1[s], ky1[s], ka[s], thr)) return 1;
    return 0;
}

/* a box's corners as onnxruntime reads them (its area is computed from these, as there) */
static inline void nms_corners(const float* p, int center, float* x0, float* y0, float* x1, float* y1)
{
    if (center) {
        float hw = p[2] / 2, hh = p[3] / 2;
        *x0 = p[0] - hw; *x1 = p[0] + hw; *y0 = p[1] - hh; *y1 = p[1] + hh;
    } else {
        *y0 = p[0] < p[2] ? p[0] : p[2]; *y1 = p[0] < p[2] ? p[2] : p[0];
        *x0 = p[1] < p[3] ? p[1] : p[3]; *x1 = p[1] < p[3] ? p[3] : p[1];
    }
}

typedef struct {
    const float* boxes; const float* scores; int B, C, N, center; long long max_out; float iou_thr, score_thr;
    int has_score_thr, per; int* sel; int* counts; int failed;
} nms_job;

/* one (batch, class): candidates in a heap popped lazily (only as many as it takes to keep max_out, as
   onnxruntime's priority queue does), each checked against the kept boxes, held in SoA for the scan */
static void nms_task(void* p, long long t)
{
    nms_job* j = (nms_job*)p;
    const int N = j->N, b = (int)(t / j->C);
    const float* sc = j->scores + (size_t)t * N;
    const float* bx = j->boxes + (size_t)b * N * 4;
    unsigned long long* h = (unsigned long long*)malloc(sizeof(*h) * (size_t)N);
    /* the kept boxes in SoA, padded to whole blocks with empty boxes (area 0 never suppresses) */
    const int cap = (j->per + NMS_BLOCK - 1) / NMS_BLOCK * NMS_BLOCK;
    float* k = (float*)calloc(5 * (size_t)cap, sizeof(float));
    if (!h || !k) { free(h); free(k); j->failed = 1; j->counts[t] = 0; return; }
    int m = 0;
    if (j->has_score_thr) {
        const float st = j->score_thr;
        for (int i = 0; i < N; ++i) { h[m] = cand_key(sc[i], i); m += sc[i] > st; }
    } else {
        for (int i = 0; i < N; ++i) h[m++] = cand_key(sc[i], i);
    }
    float *kx0 = k, *ky0 = k + cap, *kx1 = k + 2 * cap, *ky1 = k + 3 * cap, *ka = k + 4 * cap;
    int* out = j->sel + (size_t)t * j->per;
    int nk = 0;
    const float thr = j->iou_thr;
    /* a negative threshold: every overlapping pair suppresses, the screen passes them all */
    const float lo = thr > 0.0f ? thr * (1.0f - 1e-6f) : (thr == 0.0f ? 0.0f : -INFINITY);
    /* candidates in score order, sorted a chunk at a time: the best few (twice the boxes still wanted) are
       selected from the rest and sorted, so a class that keeps max_out boxes early never sorts the others */
    int next = 0, sorted = 0;
    while (nk < j->max_out) {
        if (next == sorted) {
            if (sorted == m) break;
            long long want = 2 * (j->max_out - nk) > 32 ? 2 * (j->max_out - nk) : 32;
            int take = want < m - sorted ? (int)want : m - sorted;
            key_select(h + sorted, m - sorted, take);
            key_sort(h + sorted, take);
            sorted += take;
        }
        int i = cand_index(h[next++]);
        float gx0, gy0, gx1, gy1;
        nms_corners(bx + (size_t)i * 4, j->center, &gx0, &gy0, &gx1, &gy1);
        const float ga = (gx1 - gx0) * (gy1 - gy0);
        int suppressed = 0;
        if (ga > 0.0f)  /* a box with no area suppresses nothing and is suppressed by nothing */
            for (int s0 = 0; s0 < nk && !suppressed; s0 += NMS_BLOCK)
                suppressed = nms_block(kx0 + s0, ky0 + s0, kx1 + s0, ky1 + s0, ka + s0, gx0, gy0, gx1, gy1, ga, thr, lo);
        if (suppressed) continue;
        kx0[nk] = gx0; ky0[nk] = gy0; kx1[nk] = gx1; ky1[nk] = gy1; ka[nk] = ga;
        out[nk++] = i;
    }
    j->counts[t] = nk;
    free(h); free(k);
}

long long inferd_nms(const float* boxes, const float* scores, int B, int C, int N, int center, long long max_out,
                     float iou_thr, float score_thr, int has_score_thr, long long* out, long long cap)
{
    if (max_out <= 0 || N <= 0 || B <= 0 || C <= 0) return 0;
    int per = max_out < N ? (int)max_out : N;
    long long tasks = (long long)B * C;
    int* sel = (int*)malloc(sizeof(int) * (size_t)tasks * per);
    int* counts = (int*)malloc(sizeof(int) * (size_t)tasks);
    if (!sel || !counts) { free(sel); free(counts); return -2; }
    nms_job j = {boxes, scores, B, C, N, center, max_out, iou_thr, score_thr, has_score_thr, per, sel, counts, 0};
    /* classes are independent: split them over the pool, then write the triples in (batch, class) order */
    if (tasks > 1 && (double)tasks * N > 20000.0)
        inferd_parallel(nms_task, &j, tasks, 0);
    else
        for (long long t = 0; t < tasks; ++t) nms_task(&j, t);
    long long n_out = 0;
    for (long long t = 0; t < tasks; ++t) n_out += counts[t];
    if (j.failed) n_out = -2;
    else if (n_out > cap) n_out = -1;
    else {
        long long w = 0;
        for (long long t = 0; t < tasks; ++t)
            for (int s = 0; s < counts[t]; ++s, ++w) {
                out[w * 3] = t / C; out[w * 3 + 1] = t % C; out[w * 3 + 2] = sel[(size_t)t * per + s];
            }
    }
    free(sel); free(counts);
    return n_out;
}

typedef struct { int p1, p2, p3, p4; float w1, w2, w3, w4; } bilin;

typedef struct {
    const float* x; int N, C, H, W; const float* rois; const long long* batch; int R, OH, OW, sampling;
    float scale; int half_pixel, mode_max; float* y; int cblock, nblocks; int failed;
} roi_job;

/* One axis of a roi's sampling grid: sample (o, i) of bin o sits at start + o * bin + (i + 0.5) * bin / g,
   as onnxruntime computes it. A sample outside [-1, L] contributes nothing (its whole bilinear term is 0 in
   onnxruntime, and that test splits into one per axis); else it is clamped at 0 and at L - 1 and its two taps
   are (lo, 1 - frac) and (hi, frac). When want_w, the taps of bin o are summed into w[o * stride + (idx - lo[o])]
   over [lo[o], lo[o] + n[o]); the spans are written either way (n[o] = 0 for a bin with no valid sample). */
static void roi_axis(float start, float bin, int g, int O, int L, int* lo, int* n, float* w, int stride, int want_w)
{
    for (int o = 0; o < O; ++o) {
        int mn = 1 << 30, mx = -1;
        for (int i = 0; i < g; ++i) {
            float v = start + o * bin + ((float)i + 0.5f) * bin / (float)g;
            if (v < -1.0f || v > (float)L) continue;
            if (v <= 0) v = 0;
            int l = (int)v, h;
            if (l >= L - 1) { h = l = L - 1; v = (float)l; } else h = l + 1;
            if (want_w) {
                float f = v - l;
                w[o * stride + (l - lo[o])] += 1.0f - f;
                w[o * stride + (h - lo[o])] += f;
            } else {
                mn = l < mn ? l : mn;
                mx = h > mx ? h : mx;
            }
        }
        if (!want_w) { lo[o] = mx < 0 ? 0 : mn; n[o] = mx < 0 ? 0 : mx - mn + 1; }
    }
}

/* The per-sample taps of the roi (OH * OW * gh * gw of them), for max mode and for sparse grids. */
static void roi_taps(bilin* pc, float sh, float sw, float bh, float bw, int gh, int gw, int OH, int OW, int H, int W)
{
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
}

/* Separable average: the mean of the bilinear samples of a bin is Ay X Ax^T (Ay: OH x H, the summed row taps
   of each bin's samples, Ax likewise), so per channel one pass of contiguous row axpys (T = Ay X over the
   roi's column span, vectorised) and a short dot per output. Same sum as onnxruntime's, in another order
   (float rounding differs in the last bits). */
INFERD_CLONES
static void roi_avg_sep(const float* x, size_t plane, int c0, int c1, int W, int OH, int OW, const int* ylo,
                        const int* yn, const float* wy, int sy, const int* xlo, const int* xn, const float* wx, int sx,
                        int X0, int nc, float* t, float* y)
{
    for (int c = c0; c < c1; ++c) {
        const float* xp = x + (size_t)c * plane + X0;
        float* yp = y + (size_t)c * OH * OW;
        for (int ph = 0; ph < OH; ++ph) {
            float* tp = t + (size_t)ph * nc;
            for (int q = 0; q < nc; ++q) tp[q] = 0.0f;
            for (int k = 0; k < yn[ph]; ++k) {
                const float a = wy[ph * sy + k];
                const float* row = xp + (size_t)(ylo[ph] + k) * W;
                for (int q = 0; q < nc; ++q) tp[q] += a * row[q];
            }
            for (int pw = 0; pw < OW; ++pw) {
                if (!xn[pw]) { yp[ph * OW + pw] = 0.0f; continue; }
                const float* tq = tp + (xlo[pw] - X0);
                const float* b = wx + pw * sx;
                float acc = 0.0f;
                for (int k = 0; k < xn[pw]; ++k) acc += b[k] * tq[k];
                yp[ph * OW + pw] = acc;
            }
        }
    }
}

/* task = (roi, channel block): the roi's geometry is recomputed per block (it is small next to a block) */
static void roi_task(void* p, long long task)
{
    roi_job* j = (roi_job*)p;
    const long long r = task / j->nblocks;
    const int c0 = (int)(task % j->nblocks) * j->cblock;
    const int c1 = c0 + j->cblock < j->C ? c0 + j->cblock : j->C;
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
    const size_t plane = (size_t)H * W;
    const float* xb = j->x + (size_t)j->batch[r] * j->C * plane;
    float* yr = j->y + (size_t)r * j->C * OH * OW;
    if (!j->mode_max) {
        int* sp = (int*)malloc(sizeof(int) * 2 * (size_t)(OH + OW));
        if (!sp) { j->failed = 1; return; }
        int *ylo = sp, *yn = sp + OH, *xlo = sp + 2 * OH, *xn = sp + 2 * OH + OW;
        roi_axis(sh, bh, gh, OH, H, ylo, yn, NULL, 0, 0);
        roi_axis(sw, bw, gw, OW, W, xlo, xn, NULL, 0, 0);
        int sy = 1, sx = 1, X0 = 1 << 30, X1 = -1;
        long long ytaps = 0, xtaps = 0;
        for (int o = 0; o < OH; ++o) { sy = yn[o] > sy ? yn[o] : sy; ytaps += yn[o]; }
        for (int o = 0; o < OW; ++o) {
            sx = xn[o] > sx ? xn[o] : sx; xtaps += xn[o];
            if (xn[o]) { X0 = xlo[o] < X0 ? xlo[o] : X0; X1 = xlo[o] + xn[o] - 1 > X1 ? xlo[o] + xn[o] - 1 : X1; }
        }
        int nc = X1 >= X0 ? X1 - X0 + 1 : 0;
        /* separable unless the grid is so sparse that the row pass would mostly touch columns no sample reads
           (a direct tap costs a gather, a row-pass element a vectorised multiply-add) */
        double sep = (double)ytaps * nc + (double)OH * xtaps, direct = 4.0 * OH * OW * gh * gw;
        if (nc == 0 || ytaps == 0) {
            for (int c = c0; c < c1; ++c) memset(yr + (size_t)c * OH * OW, 0, sizeof(float) * OH * OW);
            free(sp);
            return;
        }
        if (sep <= 3.0 * direct) {
            float* wb = (float*)calloc((size_t)OH * sy + (size_t)OW * sx + (size_t)OH * nc, sizeof(float));
            if (!wb) { free(sp); j->failed = 1; return; }
            float *wy = wb, *wx = wb + (size_t)OH * sy, *t = wx + (size_t)OW * sx;
            roi_axis(sh, bh, gh, OH, H, ylo, yn, wy, sy, 1);
            roi_axis(sw, bw, gw, OW, W, xlo, xn, wx, sx, 1);
            const float inv = 1.0f / (float)count;
            for (size_t q = 0; q < (size_t)OH * sy; ++q) wy[q] *= inv;
            roi_avg_sep(xb, plane, c0, c1, W, OH, OW, ylo, yn, wy, sy, xlo, xn, wx, sx, X0, nc, t, yr);
            free(wb); free(sp);
            return;
        }
        free(sp);
    }
    size_t npc = (size_t)OH * OW * gh * gw;
    bilin* pc = (bilin*)malloc(sizeof(bilin) * (npc ? npc : 1));
    if (!pc) { j->failed = 1; return; }
    roi_taps(pc, sh, sw, bh, bw, gh, gw, OH, OW, H, W);
    const int per = gh * gw;
    for (int c = c0; c < c1; ++c) {
        const float* xp = xb + (size_t)c * plane;
        float* yp = yr + (size_t)c * OH * OW;
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
    (void)N;
    if (R <= 0 || C <= 0) return 0;
    /* channel blocks so that a few rois still give every thread work; many rois keep one block per roi */
    int threads = inferd_pool_threads();
    int nblocks = 1;
    while ((long long)R * nblocks < 4LL * threads && nblocks * 2 <= C && C / (nblocks * 2) >= 8) nblocks *= 2;
    int cblock = (C + nblocks - 1) / nblocks;
    nblocks = (C + cblock - 1) / cblock;
    roi_job j = {x, N, C, H, W, rois, batch, R, OH, OW, sampling, scale, half_pixel, mode_max, y, cblock, nblocks, 0};
    long long tasks = (long long)R * nblocks;
    double work = (double)R * C * OH * OW * 4.0 * (sampling > 0 ? sampling * sampling : 4);
    if (inferd_pool_chunks(tasks, work) <= 1) {
        for (long long t = 0; t < tasks; ++t) roi_task(&j, t);
    } else {
        inferd_parallel(roi_task, &j, tasks, 0);
    }
    return j.failed ? -1 : 0;
}

/* a ranks before b: larger (largest) or smaller value first, NaN first for largest and last otherwise,
   the lower column on ties */
static inline int ranks_before(float a, long long ia, float b, long long ib, int largest)
{
    int an = a != a, bn = b != b;
    if (an || bn) {
        if (an && bn) return ia < ib;
        return largest ? an : bn;
    }
    if (a != b) return largest ? a > b : a < b;
    return ia < ib;
}

typedef struct { float v; long long i; } vi;

static inline int vi_before(const vi* a, const vi* b, int largest) { return ranks_before(a->v, a->i, b->v, b->i, largest); }

static inline void vi_swap(vi* a, vi* b) { vi t = *a; *a = *b; *b = t; }

/* Lomuto partition of a[lo..hi] around a median of three; the pivot's final position */
static inline long long vi_partition(vi* a, long long lo, long long hi, int largest)
{
    long long mid = lo + (hi - lo) / 2;
    if (vi_before(a + mid, a + lo, largest)) vi_swap(a + mid, a + lo);
    if (vi_before(a + hi, a + lo, largest)) vi_swap(a + hi, a + lo);
    if (vi_before(a + mid, a + hi, largest)) vi_swap(a + mid, a + hi);
    vi piv = a[hi];
    long long st = lo;
    for (long long q = lo; q < hi; ++q)
        if (vi_before(a + q, &piv, largest)) { vi_swap(a + q, a + st); ++st; }
    a[hi] = a[st]; a[st] = piv;
    return st;
}

/* reorder a[0..n) so that a[0..k) are the k that rank first (unordered), a[k-1] the last of them */
static void vi_select(vi* a, long long n, long long k, int largest)
{
    long long lo = 0, hi = n - 1, want = k - 1;
    while (hi > lo) {
        long long st = vi_partition(a, lo, hi, largest);
        if (st == want) return;
        if (st < want) lo = st + 1; else hi = st - 1;
    }
}

/* sort a[lo..hi] best first: quicksort down to short runs, insertion sort for those */
static void vi_sort(vi* a, long long lo, long long hi, int largest)
{
    while (hi - lo > 16) {
        long long st = vi_partition(a, lo, hi, largest);
        if (st - lo < hi - st) { vi_sort(a, lo, st - 1, largest); lo = st + 1; }
        else { vi_sort(a, st + 1, hi, largest); hi = st - 1; }
    }
    for (long long q = lo + 1; q <= hi; ++q) {
        vi t = a[q];
        long long p = q;
        while (p > lo && vi_before(&t, a + p - 1, largest)) { a[p] = a[p - 1]; --p; }
        a[p] = t;
    }
}

/* A TopK candidate as one integer: its value mapped so that the larger key ranks first (NaN first for largest and
   last for smallest, -0 as +0), the complement of its column in the low word (the lower column first on ties). */
static inline unsigned long long topk_key(float v, unsigned i, int largest)
{
    union { float f; unsigned u; } c;
    c.f = v == 0.0f ? 0.0f : v;
    unsigned o = v != v ? 0xffffffffu : ((c.u >> 31) ? ~c.u : c.u | 0x80000000u);
    return ((unsigned long long)(largest ? o : ~o) << 32) | (0xffffffffu - i);
}

#define TOPK_BLOCK 16

/* the value of a key (the canonical NaN for a NaN) */
static inline float topk_value(unsigned long long key, int largest)
{
    unsigned o = (unsigned)(key >> 32);
    if (!largest) o = ~o;
    union { float f; unsigned u; } c;
    c.u = o == 0xffffffffu ? 0x7fc00000u : ((o >> 31) ? o & 0x7fffffffu : ~o);
    return c.f;
}

/* whether any of TOPK_BLOCK values could rank before a numeric bar value */
NMS_OPT static int topk_any(const float* x, float bv, int largest)
{
    int f = 0;
    if (largest)
        for (int q = 0; q < TOPK_BLOCK; ++q) f |= (x[q] > bv) | (x[q] != x[q]);
    else
        for (int q = 0; q < TOPK_BLOCK; ++q) f |= x[q] < bv;
    return f;
}

/* rows of fewer than 2^32 columns, as keys: a buffer of up to 2k candidates; when full, a selection keeps its
   best k, and the k-th becomes the bar a later element must pass (one integer compare per element) */
static int topk_keys(const float* x, long long rows, long long n, long long k, int largest, float* vals,
                     long long* idx)
{
    long long cap = 2 * k < n ? 2 * k : n;
    unsigned long long* buf = (unsigned long long*)malloc(sizeof(*buf) * (size_t)(cap + 1));
    if (!buf) return -1;
    for (long long r = 0; r < rows; ++r) {
        const float* xr = x + r * n;
        long long m = 0, i = 0;
        for (; i < n && m < cap; ++i) buf[m++] = topk_key(xr[i], (unsigned)i, largest);
        unsigned long long bar = 0;
        if (i < n) { key_select(buf, m, k); m = k; bar = buf[0]; for (long long q = 1; q < k; ++q) bar = buf[q] < bar ? buf[q] : bar; }
        while (i < n) {
            /* a block none of whose values could pass the bar is skipped after one vectorised test (the bar's
               value: an equal value comes later, so it does not pass; a NaN bar lets any number pass) */
            if (i + TOPK_BLOCK <= n) {
                float bv = topk_value(bar, largest);
                if (bv == bv && !topk_any(xr + i, bv, largest)) { i += TOPK_BLOCK; continue; }
            }
            long long e = i + TOPK_BLOCK < n ? i + TOPK_BLOCK : n;
            for (; i < e; ++i) {
                unsigned long long key = topk_key(xr[i], (unsigned)i, largest);
                if (key <= bar) continue;
                buf[m++] = key;
                if (m == cap) {
                    key_select(buf, m, k); m = k;
                    bar = buf[0];
                    for (long long q = 1; q < k; ++q) bar = buf[q] < bar ? buf[q] : bar;
                }
            }
        }
        if (m > k) key_select(buf, m, k);
        key_sort(buf, k);
        for (long long q = 0; q < k; ++q) {
            long long c = (long long)(0xffffffffu - (unsigned)(buf[q] & 0xffffffffu));
            vals[r * k + q] = xr[c]; idx[r * k + q] = c;
        }
    }
    free(buf);
    return 0;
}

int inferd_topk(const float* x, long long rows, long long n, long long k, int largest, float* vals, long long* idx)
{
    if (k <= 0) return 0;
    if (n < 0xffffffffLL) return topk_keys(x, rows, n, k, largest, vals, idx);
    long long cap = 2 * k < n ? 2 * k : n;
    vi* buf = (vi*)malloc(sizeof(vi) * (size_t)(cap + 1));
    if (!buf) return -1;
    for (long long r = 0; r < rows; ++r) {
        const float* xr = x + r * n;
        /* a buffer of up to 2k candidates: when full, a selection keeps its best k and the k-th becomes the bar a
           later element must pass (later means a higher index, so only a strictly better value, or NaN over a
           number for largest, passes); one compare per element once the bar is good */
        long long m = 0, i = 0;
        for (; i < n && m < cap; ++i) { buf[m].v = xr[i]; buf[m].i = i; ++m; }
        float bar = 0.0f;
        if (i < n) { vi_select(buf, m, k, largest); m = k; bar = buf[k - 1].v; }
        for (; i < n; ++i) {
            float v = xr[i];
            int wins = largest ? (v > bar || (v != v && bar == bar)) : (v < bar || (v == v && bar != bar));
            if (!wins) continue;
            buf[m].v = v; buf[m].i = i; ++m;
            if (m == cap) { vi_select(buf, m, k, largest); m = k; bar = buf[k - 1].v; }
        }
        if (m > k) vi_select(buf, m, k, largest);
        vi_sort(buf, 0, k - 1, largest);
        for (long long q = 0; q < k; ++q) { vals[r * k + q] = buf[q].v; idx[r * k + q] = buf[q].i; }
    }
    free(buf);
    return 0;
}
