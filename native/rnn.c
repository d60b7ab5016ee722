/* Recurrent steps of LSTM / GRU / RNN (ONNX semantics), one direction at a time. The input projections of
   every step come precomputed from one packed GEMM (daemon/ops/recurrent.py); what is left per step is the
   recurrence h @ R^T and the gate maths, which this walks in C: a step of a small recurrent layer is a few
   microseconds of arithmetic, far less than the interpreter would spend on a dozen numpy calls per step. */
#include <math.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

INFERD_INLINE float tanh_ps(float v)
{
    /* tanh |v| = (1 - e) / (1 + e), e = exp(-2|v|): vectorisable, ~1e-7 absolute error */
    const float a = v < 0.0f ? -v : v;
    const float e = exp_ps(-2.0f * a);
    const float t = (1.0f - e) / (1.0f + e);
    return v < 0.0f ? -t : t;
}

/* Activation codes (daemon/ops/recurrent.py ACTS): 0 Sigmoid, 1 Tanh, 2 Relu, 3 Affine, 4 LeakyRelu,
   5 ThresholdedRelu, 6 ScaledTanh, 7 HardSigmoid, 8 Elu, 9 Softsign, 10 Softplus. */
INFERD_INLINE void rnn_act(float* restrict v, int n, int code, float a, float b)
{
    int k;
    switch (code) {
    case 0: for (k = 0; k < n; ++k) v[k] = sigmoid_ps(v[k]); break;
    case 1: for (k = 0; k < n; ++k) v[k] = tanh_ps(v[k]); break;
    case 2: for (k = 0; k < n; ++k) v[k] = v[k] < 0.0f ? 0.0f : v[k]; break;
    case 3: for (k = 0; k < n; ++k) v[k] = a * v[k] + b; break;
    case 4: for (k = 0; k < n; ++k) v[k] = v[k] >= 0.0f ? v[k] : a * v[k]; break;
    case 5: for (k = 0; k < n; ++k) v[k] = v[k] > a ? v[k] : 0.0f; break;
    case 6: for (k = 0; k < n; ++k) v[k] = a * tanh_ps(b * v[k]); break;
    case 7:
        for (k = 0; k < n; ++k) {
            const float t = a * v[k] + b;
            v[k] = t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t);
        }
        break;
    case 8: for (k = 0; k < n; ++k) v[k] = v[k] >= 0.0f ? v[k] : a * (expf(v[k]) - 1.0f); break;
    case 9: for (k = 0; k < n; ++k) v[k] = v[k] / (1.0f + fabsf(v[k])); break;
    case 10: for (k = 0; k < n; ++k) v[k] = log1pf(expf(v[k])); break;
    default: break;
    }
}

INFERD_INLINE void clip_into(float* restrict v, int n, float clip)
{
    if (clip <= 0.0f)
        return;
    for (int k = 0; k < n; ++k)
        v[k] = v[k] < -clip ? -clip : (v[k] > clip ? clip : v[k]);
}

/* 8 floats as one GCC vector (AVX: one register; SSE: two), loadable at any float alignment */
/* 8 floats (a ymm register; two xmm in the baseline clone), 4 on aarch64 (a q register: 8-float vectors there were
   lowered in pieces) */
typedef float rnn_v __attribute__((vector_size(4 * INFERD_GV), aligned(4), may_alias)); /* read in place */
#define RV INFERD_GV

/* acc[j] += sum_k h[k] * rt[k*ldr + j] for j < n (each acc[j] summed in k order, as before). Blocks of 64
   columns keep their sums in vector registers over all k (eight on x86-64, sixteen on aarch64): per k one
   broadcast, 64 / RV loads and as many FMAs, where a k-outer loop over the whole row reloads and stores every sum
   at each k (the store port was the limit: a 64-wide GRU step took ~1 us). The last n % 64 columns go a vector at
   a time, then one by one. */
INFERD_INLINE void matvec_acc(const float* restrict h, const float* restrict rt, long long ldr, int hk, int n,
                       float* restrict acc)
{
    int j0 = 0;
    for (; j0 + 64 <= n; j0 += 64) {
        rnn_v a[64 / RV];
        _Pragma("GCC unroll 16") for (int v = 0; v < 64 / RV; ++v) a[v] = *(const rnn_v*)(acc + j0 + v * RV);
        for (int k = 0; k < hk; ++k) {
            const float* restrict row = rt + (long long)k * ldr + j0;
            const rnn_v hv = (rnn_v){0} + h[k];
            _Pragma("GCC unroll 16") for (int v = 0; v < 64 / RV; ++v) a[v] += hv * *(const rnn_v*)(row + v * RV);
        }
        _Pragma("GCC unroll 16") for (int v = 0; v < 64 / RV; ++v) *(rnn_v*)(acc + j0 + v * RV) = a[v];
    }
    for (; j0 + RV <= n; j0 += RV) {
        rnn_v a = *(const rnn_v*)(acc + j0);
        for (int k = 0; k < hk; ++k)
            a += ((rnn_v){0} + h[k]) * *(const rnn_v*)(rt + (long long)k * ldr + j0);
        *(rnn_v*)(acc + j0) = a;
    }
    for (int k = 0; k < hk; ++k) {
        const float hv = h[k];
        const float* restrict row = rt + (long long)k * ldr;
        for (int j = j0; j < n; ++j)
            acc[j] += hv * row[j];
    }
}

/* cloned whole (AVX2 / AVX-512 / baseline): the helpers above inline into each clone, gate maths included */
INFERD_CLONES
int inferd_rnn_dir(int kind, int seq, int batch, int H, const float* xw, long long xw_ts, long long xw_bs,
                   const float* rt, const float* rb, const float* peep, const int* lens, int reverse, float* h,
                   float* c, float* y, long long y_ts, long long y_bs, const int* acts, const float* alphas,
                   const float* betas, float clip, int input_forget, int lbr, float* ws)
{
    const int G = kind == 2 ? 4 : (kind == 1 ? 3 : 1);
    const int GH = G * H;
    float* restrict g = ws;          /* G*H gate pre-activations */
    float* restrict t1 = ws + GH;    /* H scratch (GRU: r*h or R_h h) */
    float* restrict t2 = t1 + H;     /* H scratch */
    for (int t = 0; t < seq; ++t) {
        for (int b = 0; b < batch; ++b) {
            const int len = lens ? lens[b] : seq;
            if (t >= len)
                continue;
            const int tt = reverse ? len - 1 - t : t;
            const float* restrict xr = xw + tt * xw_ts + b * xw_bs;
            float* restrict hb = h + (long long)b * H;
            if (kind == 0) {
                memcpy(g, xr, sizeof(float) * H);
                matvec_acc(hb, rt, GH, H, GH, g);
                clip_into(g, H, clip);
                rnn_act(g, H, acts[0], alphas[0], betas[0]);
                memcpy(hb, g, sizeof(float) * H);
            } else if (kind == 1) {
                /* z, r: x + h R^T (R's z/r bias is in x); h gate as linear_before_reset says */
                memcpy(g, xr, sizeof(float) * 2 * H);
                matvec_acc(hb, rt, GH, H, 2 * H, g);
                clip_into(g, 2 * H, clip);
                rnn_act(g, 2 * H, acts[0], alphas[0], betas[0]);
                const float* z = g;
                const float* r = g + H;
                float* hc = g + 2 * H;
                if (lbr) {
                    for (int j = 0; j < H; ++j) t1[j] = rb[2 * H + j];
                    matvec_acc(hb, rt + 2 * H, GH, H, H, t1);
                    for (int j = 0; j < H; ++j) hc[j] = xr[2 * H + j] + r[j] * t1[j];
                } else {
                    for (int j = 0; j < H; ++j) t2[j] = r[j] * hb[j];
                    for (int j = 0; j < H; ++j) hc[j] = xr[2 * H + j] + rb[2 * H + j];
                    matvec_acc(t2, rt + 2 * H, GH, H, H, hc);
                }
                clip_into(hc, H, clip);
                rnn_act(hc, H, acts[1], alphas[1], betas[1]);
                for (int j = 0; j < H; ++j) hb[j] = (1.0f - z[j]) * hc[j] + z[j] * hb[j];
            } else {
                float* restrict cb = c + (long long)b * H;
                memcpy(g, xr, sizeof(float) * GH);
                matvec_acc(hb, rt, GH, H, GH, g);
                float* gi = g;
                float* go = g + H;
                float* gf = g + 2 * H;
                float* gc = g + 3 * H;
                if (peep) {
                    for (int j = 0; j < H; ++j) gi[j] += peep[j] * cb[j];
                    for (int j = 0; j < H; ++j) gf[j] += peep[2 * H + j] * cb[j];
                }
                clip_into(gi, H, clip);
                rnn_act(gi, H, acts[0], alphas[0], betas[0]);
                if (input_forget) {
                    for (int j = 0; j < H; ++j) gf[j] = 1.0f - gi[j];
                } else {
                    clip_into(gf, H, clip);
                    rnn_act(gf, H, acts[0], alphas[0], betas[0]);
                }
                clip_into(gc, H, clip);
                rnn_act(gc, H, acts[1], alphas[1], betas[1]);
                for (int j = 0; j < H; ++j) cb[j] = gf[j] * cb[j] + gi[j] * gc[j];
                if (peep)
                    for (int j = 0; j < H; ++j) go[j] += peep[H + j] * cb[j];
                clip_into(go, H, clip);
                rnn_act(go, H, acts[0], alphas[0], betas[0]);
                memcpy(t1, cb, sizeof(float) * H);
                rnn_act(t1, H, acts[2], alphas[2], betas[2]);
                for (int j = 0; j < H; ++j) hb[j] = go[j] * t1[j];
            }
            if (y) {
                float* restrict yr = y + tt * y_ts + b * y_bs;
                memcpy(yr, hb, sizeof(float) * H);
            }
        }
    }
    return 0;
}

/* Both directions of a bidirectional layer, one pool task each (the two recurrences are independent: on two
   cores each walks its own R from its own L2, where one after the other they take twice as long). Direction d
   (d = 1 reversed) reads and writes its slice of each array: xw + d*xw_ds, rt + d*H*G*H, rb + d*G*H, peep +
   d*3H, h and c + d*batch*H, y + d*y_ds, acts/alphas/betas + 3d, ws + d*(G+2)*H. */
typedef struct {
    int kind, seq, batch, H;
    const float* xw;
    long long xw_ts, xw_bs, xw_ds;
    const float *rt, *rb, *peep;
    const int* lens;
    float *h, *c, *y;
    long long y_ts, y_bs, y_ds;
    const int* acts;
    const float *alphas, *betas;
    float clip;
    int input_forget, lbr;
    float* ws;
} rnn_bidir_job;

static void rnn_bidir_task(void* ctx, long long d)
{
    const rnn_bidir_job* j = (const rnn_bidir_job*)ctx;
    const int G = j->kind == 2 ? 4 : (j->kind == 1 ? 3 : 1);
    const long long GH = (long long)G * j->H, bh = (long long)j->batch * j->H;
    inferd_rnn_dir(j->kind, j->seq, j->batch, j->H, j->xw + d * j->xw_ds, j->xw_ts, j->xw_bs, j->rt + d * j->H * GH,
                   j->rb + d * GH, j->peep ? j->peep + d * 3 * j->H : NULL, j->lens, (int)d, j->h + d * bh,
                   j->c + d * bh, j->y ? j->y + d * j->y_ds : NULL, j->y_ts, j->y_bs, j->acts + 3 * d,
                   j->alphas + 3 * d, j->betas + 3 * d, j->clip, j->input_forget, j->lbr,
                   j->ws + d * (GH + 2LL * j->H));
}

int inferd_rnn_bidir(int kind, int seq, int batch, int H, const float* xw, long long xw_ts, long long xw_bs,
                     long long xw_ds, const float* rt, const float* rb, const float* peep, const int* lens, float* h,
                     float* c, float* y, long long y_ts, long long y_bs, long long y_ds, const int* acts,
                     const float* alphas, const float* betas, float clip, int input_forget, int lbr, float* ws,
                     int max_threads)
{
    rnn_bidir_job j = {kind, seq, batch, H, xw, xw_ts, xw_bs, xw_ds, rt, rb, peep, lens, h, c, y, y_ts, y_bs, y_ds,
                       acts, alphas, betas, clip, input_forget, lbr, ws};
    inferd_parallel(rnn_bidir_task, &j, 2, max_threads);
    return 0;
}
