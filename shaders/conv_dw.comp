#version 450
// Depthwise convolution (group == Cin, Cout = MULT * Cin): one invocation per output element;
// kernel/stride/dilation as specialization constants so the tap loops unroll.
#include "common.glsl"
#include "act.glsl"
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
layout(local_size_x = 256) in;
layout(constant_id = 0) const int KH = 3;
layout(constant_id = 1) const int KW = 3;
layout(constant_id = 2) const int SH = 1;
layout(constant_id = 3) const int SW = 1;
layout(constant_id = 4) const int DH = 1;
layout(constant_id = 5) const int DW = 1;
layout(std430, binding = 0) readonly buffer X { float x[]; };
WBUF(WFP, 1, Wt, w);     // [Cout, 1, KH, KW]
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
#if RESIDUAL
layout(std430, binding = 3) readonly buffer R { float r[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
#else
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
#endif
layout(push_constant) uniform P {
    uint total; int C; int H; int W; int K; int OH; int OW; int PT; int PL; int MULT; float act_a; float act_b;
} p;

void main() {
    uint i = gid();
    if (i >= p.total) return;
    int ow = int(i % uint(p.OW));
    int t = int(i / uint(p.OW));
    int oh = t % p.OH; t /= p.OH;
    int oc = t % p.K;
    int n = t / p.K;
    int ci = oc / p.MULT;
    int xb = (n * p.C + ci) * p.H * p.W;
    int wb = oc * KH * KW;
    int ih0 = oh * SH - p.PT, iw0 = ow * SW - p.PL;
    float acc = 0.0;
    for (int kh = 0; kh < KH; ++kh) {
        int ih = ih0 + kh * DH;
        if (ih < 0 || ih >= p.H) continue;
        for (int kw = 0; kw < KW; ++kw) {
            int iw = iw0 + kw * DW;
            if (iw < 0 || iw >= p.W) continue;
            acc += x[xb + ih * p.W + iw] * WLD(WFP, w, wb + kh * KW + kw);
        }
    }
    acc += bias[oc];
#if RESIDUAL
    acc += r[i];
#endif
    y[i] = act(acc, p.act_a, p.act_b);
}
