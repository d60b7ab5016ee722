#version 450
// Pooling on 8-bit integers, four outputs per invocation stored as one word (q8.glsl).
// POOL 0: MaxPool over a window (the integers' max is the max of the dequantised values: the scale is
// positive), pads skipped. POOL 1: QLinearGlobalAveragePool over each (n, c) plane (NCHW), onnxruntime's form:
// the integer sum less the zero point's share, times x_scale / (y_scale * count), requantised.
#include "common.glsl"
#include "q8.glsl"
#ifndef POOL
#define POOL 0
#endif
#ifndef XS
#define XS 1
#endif
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform P {
    uint total; int H; int W; int OH; int OW; int KH; int KW; int SH; int SW; int DH; int DW; int PT; int PL;
    int zx; int zy; int lo; int hi; float m;
} p;

int pool_at(uint i) {
#if POOL == 0
    int ow = int(i % uint(p.OW));
    int t = int(i / uint(p.OW));
    int oh = t % p.OH;
    int plane = t / p.OH;
    int best = -2147483647;
    for (int kh = 0; kh < p.KH; ++kh) {
        int ih = oh * p.SH - p.PT + kh * p.DH;
        if (ih < 0 || ih >= p.H) continue;
        for (int kw = 0; kw < p.KW; ++kw) {
            int iw = ow * p.SW - p.PL + kw * p.DW;
            if (iw < 0 || iw >= p.W) continue;
            best = max(best, Q8LD(XS, x, uint((plane * p.H + ih) * p.W + iw)));
        }
    }
    return best;
#else
    uint n = uint(p.H * p.W);
    int acc = 0;
    for (uint k = 0u; k < n; ++k) acc += Q8LD(XS, x, i * n + k);
    return q8requant(acc - p.zx * int(n), p.m, p.zy, p.lo, p.hi);
#endif
}

void main() {
    uint wd = gid();
    if (4u * wd >= p.total) return;
    uint word = 0u;
    for (uint j = 0u; j < 4u; ++j) {
        uint i = 4u * wd + j;
        if (i >= p.total) break;
        word = Q8PACK(word, j, pool_at(i));
    }
    y[wd] = word;
}
