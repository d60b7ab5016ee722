#version 450
// conv_dw.comp for CPU-type devices (lavapipe): one invocation per 4 consecutive outputs of a row.
// Each input row segment the 4 outputs need is read once through an RGBA32F storage texel view (a
// gather there, where storage-buffer loads are per-lane loops); weights as a texel view too.
// The residual is a run-time choice (fewer pipelines to compile).
#include "common.glsl"
#include "texel.glsl"
#include "act.glsl"
layout(local_size_x = 64) in;
layout(constant_id = 0) const int KH = 3;
layout(constant_id = 1) const int KW = 3;
layout(constant_id = 2) const int SH = 1;
layout(constant_id = 3) const int SW = 1;
layout(constant_id = 4) const int DH = 1;
layout(constant_id = 5) const int DW = 1;
TBUF(0, X);
TBUFW(WFP, 1, Wt);     // [Cout, KH * KW] flat
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
TBUF(3, R);   // the residual (bound to anything when has_res is 0)
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
    uint total; int C; int H; int W; int K; int OH; int OW; int OW4; int PT; int PL; int MULT; int has_res; float act_a; float act_b;
} p;

#define SEG (3 * SW + (KW - 1) * DW + 1)

float ld(int i) { return TFETCH(X, i >> 2)[i & 3]; }

void main() {
    uint i = gid();
    if (i >= p.total) return;
    int q = int(i % uint(p.OW4));
    int t = int(i / uint(p.OW4));
    int oh = t % p.OH; t /= p.OH;
    int oc = t % p.K;
    int n = t / p.K;
    int ci = oc / p.MULT;
    int ow0 = q * 4;
    int xb = (n * p.C + ci) * p.H * p.W;
    int ih0 = oh * SH - p.PT, iw0 = ow0 * SW - p.PL;
    float wk[KH * KW];
    int wb = oc * KH * KW;
    for (int k = 0; k < KH * KW; ++k) {
        int wi = wb + k;
        wk[k] = TFETCHW(WFP, Wt, wi >> 2)[wi & 3];
    }
    vec4 acc = vec4(0.0);
    for (int kh = 0; kh < KH; ++kh) {
        int ih = ih0 + kh * DH;
        if (ih < 0 || ih >= p.H) continue;
        float seg[SEG];
        int rb = xb + ih * p.W;
        for (int s = 0; s < SEG; ++s) {
            int iw = iw0 + s;
            bool ok = iw >= 0 && iw < p.W;
            float u = ld(ok ? rb + iw : rb);
            seg[s] = ok ? u : 0.0;
        }
        for (int kw = 0; kw < KW; ++kw) {
            float wv = wk[kh * KW + kw];
            acc.x += wv * seg[kw * DW];
            acc.y += wv * seg[kw * DW + SW];
            acc.z += wv * seg[kw * DW + 2 * SW];
            acc.w += wv * seg[kw * DW + 3 * SW];
        }
    }
    float bv = bias[oc];
    int yb = ((n * p.K + oc) * p.OH + oh) * p.OW + ow0;
    for (int j = 0; j < 4; ++j) {
        if (ow0 + j >= p.OW) break;
        float v = acc[j] + bv;
        if (p.has_res != 0) {
            int ri = yb + j;
            v += TFETCH(R, ri >> 2)[ri & 3];
        }
        y[yb + j] = act(v, p.act_a, p.act_b);
    }
}
