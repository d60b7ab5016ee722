#version 450
// ConvTranspose as a gather: each output element sums the input taps that scatter onto it
// (oh + PT - kh*DH must be a multiple of SH). Groups, dilation, output padding (via the output
// size), bias, residual and activation.
#include "common.glsl"
#include "act.glsl"
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };     // [Cin, Cout/G, KH, KW]
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
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
    int g = oc / kg, ocg = oc - g * kg;
    float acc = 0.0;
    for (int kh = 0; kh < p.KH; ++kh) {
        int th = oh + p.PT - kh * p.DH;
        if (th < 0 || th % p.SH != 0) continue;
        int ih = th / p.SH;
        if (ih >= p.H) continue;
        for (int kw = 0; kw < p.KW; ++kw) {
            int tw = ow + p.PL - kw * p.DW;
            if (tw < 0 || tw % p.SW != 0) continue;
            int iw = tw / p.SW;
            if (iw >= p.W) continue;
            for (int c = 0; c < cg; ++c) {
                int ci = g * cg + c;
                acc += x[((n * p.C + ci) * p.H + ih) * p.W + iw] * w[((ci * kg + ocg) * p.KH + kh) * p.KW + kw];
            }
        }
    }
    acc += bias[oc];
#if RESIDUAL
    acc += r[i];
#endif
    y[i] = act(acc, p.act_a, p.act_b);
}
