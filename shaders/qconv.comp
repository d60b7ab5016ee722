#version 450
// QLinearConv on the integers, the plain int32 path (no integer dot product instructions): every output is
// the exact int32 sum of (x - x_zp) * (w - w_zp[oc]) over its window, plus the int32 bias, requantised as
// onnxruntime does (q8.glsl). Any groups, strides, dilations and pads (a padded tap is the zero point, so it
// adds nothing). Four consecutive outputs per invocation, stored as one word.
#include "common.glsl"
#include "q8.glsl"
#ifndef XS
#define XS 1  // x is int8 (1) or uint8 (0)
#endif
#ifndef WS
#define WS 1  // w likewise
#endif
#ifndef YS
#define YS 1  // y likewise
#endif
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) readonly buffer Wt { uint w[]; };      // [Cout, Cin/G, KH, KW] bytes
layout(std430, binding = 2) readonly buffer Wz { int wz[]; };      // [Cout] weight zero points
layout(std430, binding = 3) readonly buffer Bias { int bias[]; };  // [Cout]
layout(std430, binding = 4) readonly buffer Mul { float mult[]; }; // [Cout] x_scale * w_scale / y_scale
layout(std430, binding = 5) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform P {
    uint total; int C; int H; int W; int K; int OH; int OW; int KH; int KW;
    int SH; int SW; int DH; int DW; int PT; int PL; int G; int zx; int zy; int lo; int hi;
} p;

int conv_at(uint i) {
    int ow = int(i % uint(p.OW));
    int t = int(i / uint(p.OW));
    int oh = t % p.OH; t /= p.OH;
    int oc = t % p.K;
    int n = t / p.K;
    int cg = p.C / p.G, kg = p.K / p.G;
    int g = oc / kg;
    int z = wz[oc];
    int acc = 0;
    for (int c = 0; c < cg; ++c) {
        int ci = g * cg + c;
        for (int kh = 0; kh < p.KH; ++kh) {
            int ih = oh * p.SH - p.PT + kh * p.DH;
            if (ih < 0 || ih >= p.H) continue;
            for (int kw = 0; kw < p.KW; ++kw) {
                int iw = ow * p.SW - p.PL + kw * p.DW;
                if (iw < 0 || iw >= p.W) continue;
                uint xi = uint(((n * p.C + ci) * p.H + ih) * p.W + iw);
                uint wi = uint(((oc * cg + c) * p.KH + kh) * p.KW + kw);
                acc += (Q8LD(XS, x, xi) - p.zx) * (Q8LD(WS, w, wi) - z);
            }
        }
    }
    return q8requant(acc + bias[oc], mult[oc], p.zy, p.lo, p.hi);
}

void main() {
    uint wd = gid();
    if (4u * wd >= p.total) return;
    uint word = 0u;
    for (uint j = 0u; j < 4u; ++j) {
        uint i = 4u * wd + j;
        if (i >= p.total) break;
        word = Q8PACK(word, j, conv_at(i));
    }
    y[wd] = word;
}
