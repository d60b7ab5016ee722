#version 450
// Direct convolution, the reference kernel: one invocation per output element, any groups, strides,
// dilations and pads; bias, fused residual and activation in the epilogue.
#include "common.glsl"
#include "act.glsl"
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
WBUF(WFP, 1, Wt, w);     // [Cout, Cin/G, KH, KW]
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };  // [Cout]
#if RESIDUAL
layout(std430, binding = 3) readonly buffer R { float r[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
#else
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
#endif
layout(push_constant) uniform P {
    uint total; int C; int H; int W; int K; int OH; int OW; int KH; int KW;
    int SH; int SW; int DH; int DW; int PT; int PL; int G; float act_a; float act_b;
} p;

void main() {
    uint i = gid();
    if (i >= p.total) return;
    int ow = int(i % uint(p.OW));
    int t = int(i / uint(p.OW));
    int oh = t % p.OH; t /= p.OH;
    int oc = t % p.K;
    int n = t / p.K;
    int cg = p.C / p.G, kg = p.K / p.G;
    int g = oc / kg;
    float acc = 0.0;
    for (int c = 0; c < cg; ++c) {
        int ci = g * cg + c;
        for (int kh = 0; kh < p.KH; ++kh) {
            int ih = oh * p.SH - p.PT + kh * p.DH;
            if (ih < 0 || ih >= p.H) continue;
            for (int kw = 0; kw < p.KW; ++kw) {
                int iw = ow * p.SW - p.PL + kw * p.DW;
                if (iw < 0 || iw >= p.W) continue;
                acc += x[((n * p.C + ci) * p.H + ih) * p.W + iw] * WLD(WFP, w, ((oc * cg + c) * p.KH + kh) * p.KW + kw);
            }
        }
    }
    acc += bias[oc];
#if RESIDUAL
    acc += r[i];
#endif
    y[i] = act(acc, p.act_a, p.act_b);
}
