#version 450
// The recurrent steps of an LSTM (KIND 2: gates i, o, f, c), GRU (1: z, r, h) or RNN (0), one workgroup per
// direction walking every step: the states live in shared memory, each step is h @ R^T (invocations over the
// G*H gate columns of every batch item, R^T rows read contiguously) then the gate maths per hidden unit, with
// workgroup barriers between. Input projections come from rnn_proj.comp (W's bias and R's bias folded in,
// except GRU's h-gate R bias: rb). Steps past an item's length leave its state alone and Y zero; a reverse
// direction walks each item from its own last step. BH = batch*H, BGH = batch*G*H size the shared arrays.
#include "common.glsl"
layout(local_size_x = 128) in;
layout(std430, binding = 0) readonly buffer XW { float xw[]; };
layout(std430, binding = 1) readonly buffer RT { float rt[]; };     // (dirs, H, G*H)
layout(std430, binding = 2) readonly buffer RB { float rb[]; };     // (dirs, G*H)
layout(std430, binding = 3) readonly buffer PE { float peep[]; };   // (dirs, 3H) when HAS_PEEP
layout(std430, binding = 4) readonly buffer LE { int lens[]; };     // (batch) when HAS_LENS
layout(std430, binding = 5) readonly buffer H0 { float h0[]; };
layout(std430, binding = 6) readonly buffer C0 { float c0[]; };
layout(std430, binding = 7) buffer Y { float y[]; };
layout(std430, binding = 8) writeonly buffer YH { float yh[]; };
layout(std430, binding = 9) writeonly buffer YC { float yc[]; };
layout(push_constant) uniform P {
    int seq; int batch; int H; int dirs; int rev; int layout_; int flags; float clip;
    int act[6]; float alpha[6]; float beta[6];
} p;

shared float hs[BH];
shared float cs[BH];
shared float gs[BGH];

const int F_H0 = 1, F_C0 = 2, F_PEEP = 4, F_LENS = 8, F_IFORGET = 16, F_LBR = 32;

float actf(int slot, float v) {
    int code = p.act[slot];
    float a = p.alpha[slot], b = p.beta[slot];
    if (code == 0) return 1.0 / (1.0 + exp(-clamp(v, -80.0, 80.0)));
    if (code == 1) return tanh(clamp(v, -15.0, 15.0));
    if (code == 2) return max(v, 0.0);
    if (code == 3) return a * v + b;
    if (code == 4) return v >= 0.0 ? v : a * v;
    if (code == 5) return v > a ? v : 0.0;
    if (code == 6) return a * tanh(clamp(b * v, -15.0, 15.0));
    if (code == 7) return clamp(a * v + b, 0.0, 1.0);
    if (code == 8) return v >= 0.0 ? v : a * (exp(min(v, 80.0)) - 1.0);
    if (code == 9) return v / (1.0 + abs(v));
    return v > 20.0 ? v : log(1.0 + exp(v));  // 10: Softplus
}

float cl(float v) { return p.clip > 0.0 ? clamp(v, -p.clip, p.clip) : v; }

int state_index(int d, int b, int j) {
    return (p.layout_ == 0 ? (d * p.batch + b) : (b * p.dirs + d)) * p.H + j;
}

int y_index(int t, int d, int b, int j) {
    return (p.layout_ == 0 ? ((t * p.dirs + d) * p.batch + b) : ((b * p.seq + t) * p.dirs + d)) * p.H + j;
}

int len_of(int b) { return (p.flags & F_LENS) != 0 ? lens[b] : p.seq; }

void main() {
    int d = int(gl_WorkGroupID.x);
    int lid = int(gl_LocalInvocationID.x);
    int LS = int(gl_WorkGroupSize.x);
    int H = p.H, G = KIND == 2 ? 4 : (KIND == 1 ? 3 : 1);
    int GH = G * H, bh = p.batch * H, N = p.dirs * GH;
    bool reverse = ((p.rev >> d) & 1) != 0;
    int a0 = 3 * d;  // this direction's activations f, g, h
    for (int i = lid; i < bh; i += LS) {
        int b = i / H, j = i - b * H;
        hs[i] = (p.flags & F_H0) != 0 ? h0[state_index(d, b, j)] : 0.0;
        cs[i] = (KIND == 2 && (p.flags & F_C0) != 0) ? c0[state_index(d, b, j)] : 0.0;
    }
    for (int i = lid; i < p.seq * bh; i += LS) {
        int t = i / bh, r = i - t * bh, b = r / H;
        y[y_index(t, d, b, r - b * H)] = 0.0;
    }
    memoryBarrierBuffer();
    barrier();
    for (int t = 0; t < p.seq; ++t) {
        // gates: x W^T (precomputed) + h R^T
        for (int i = lid; i < p.batch * GH; i += LS) {
            int b = i / GH, n = i - b * GH;
            int len = len_of(b);
            if (t >= len) continue;
            int tt = reverse ? len - 1 - t : t;
            float acc = 0.0;
            bool hgate = KIND == 1 && n >= 2 * H;
            if (!hgate || (p.flags & F_LBR) != 0) {
                for (int k = 0; k < H; ++k)
                    acc += hs[b * H + k] * rt[(d * H + k) * GH + n];
            }
            if (hgate)
                gs[i] = acc + rb[d * GH + n];   // linear_before_reset: R_h h + Rb_h (0 + Rb_h otherwise, completed below)
            else
                gs[i] = acc + xw[(tt * p.batch + b) * N + d * GH + n];
        }
        barrier();
        if (KIND == 1 && (p.flags & F_LBR) == 0) {
            // (r * h) @ R_h^T: r first (into cs, which a GRU has no other use for), then the product
            for (int i = lid; i < bh; i += LS) {
                int b = i / H, j = i - b * H;
                cs[i] = actf(a0, cl(gs[b * GH + H + j])) * hs[i];
            }
            barrier();
            for (int i = lid; i < bh; i += LS) {
                int b = i / H, j = i - b * H;
                if (t >= len_of(b)) continue;
                float acc = 0.0;
                for (int k = 0; k < H; ++k)
                    acc += cs[b * H + k] * rt[(d * H + k) * GH + 2 * H + j];
                gs[b * GH + 2 * H + j] += acc;
            }
            barrier();
        }
        // the gate maths: each invocation reads and writes its own hidden units only
        for (int i = lid; i < bh; i += LS) {
            int b = i / H, j = i - b * H;
            int len = len_of(b);
            if (t >= len) continue;
            int tt = reverse ? len - 1 - t : t;
            int g0 = b * GH;
            float hn;
            if (KIND == 0) {
                hn = actf(a0, cl(gs[g0 + j]));
            } else if (KIND == 1) {
                float z = actf(a0, cl(gs[g0 + j]));
                float r = actf(a0, cl(gs[g0 + H + j]));
                float xh = xw[(tt * p.batch + b) * N + d * GH + 2 * H + j];
                float pre = (p.flags & F_LBR) != 0 ? xh + r * gs[g0 + 2 * H + j] : xh + gs[g0 + 2 * H + j];
                float hc = actf(a0 + 1, cl(pre));
                hn = (1.0 - z) * hc + z * hs[i];
            } else {
                float c = cs[i];
                bool pp = (p.flags & F_PEEP) != 0;
                float ig = actf(a0, cl(gs[g0 + j] + (pp ? peep[d * 3 * H + j] * c : 0.0)));
                float fg = (p.flags & F_IFORGET) != 0 ? 1.0 - ig
                         : actf(a0, cl(gs[g0 + 2 * H + j] + (pp ? peep[d * 3 * H + 2 * H + j] * c : 0.0)));
                float cc = actf(a0 + 1, cl(gs[g0 + 3 * H + j]));
                c = fg * c + ig * cc;
                float og = actf(a0, cl(gs[g0 + H + j] + (pp ? peep[d * 3 * H + H + j] * c : 0.0)));
                cs[i] = c;
                hn = og * actf(a0 + 2, c);
            }
            hs[i] = hn;
            y[y_index(tt, d, b, j)] = hn;
        }
        barrier();
    }
    for (int i = lid; i < bh; i += LS) {
        int b = i / H, j = i - b * H;
        yh[state_index(d, b, j)] = hs[i];
        yc[state_index(d, b, j)] = KIND == 2 ? cs[i] : 0.0;
    }
}
