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
// kernel/stride/dilation as specialization constants: the tap loops unroll and the divisibility
// tests become multiply-shifts (runtime integer division dominated this kernel)
layout(constant_id = 0) const int KH = 3;
layout(constant_id = 1) const int KW = 3;
layout(constant_id = 2) const int SH = 1;
layout(constant_id = 3) const int SW = 1;
layout(constant_id = 4) const int DH = 1;
layout(constant_id = 5) const int DW = 1;
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
    uint total; int C; int H; int W; int K; int OH; int OW; int PT; int PL; int G; float act_a; float act_b;
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
    int HW = p.H * p.W;
    for (int kh = 0; kh < KH; ++kh) {
        int th = oh + p.PT - kh * DH;
        if (th < 0 || th % SH != 0) continue;
        int ih = th / SH;
        if (ih >= p.H) continue;
        for (int kw = 0; kw < KW; ++kw) {
            int tw = ow + p.PL - kw * DW;
            if (tw < 0 || tw % SW != 0) continue;
            int iw = tw / SW;
            if (iw >= p.W) continue;
            int xi = (n * p.C + g * cg) * HW + ih * p.W + iw;
            int wi = ((g * cg * kg + ocg) * KH + kh) * KW + kw;
            for (int c = 0; c < cg; ++c) {
                acc += x[xi] * w[wi];
                xi += HW;
                wi += kg * KH * KW;
            }
        }
    }
    acc += bias[oc];
#if RESIDUAL
    acc += r[i];
#endif
    y[i] = act(acc, p.act_a, p.act_b);
}
