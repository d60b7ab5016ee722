#version 450
// pool.comp for CPU-type devices (lavapipe): the input is read through an RGBA32F texel view (a gather
// there, where storage-buffer loads are per-lane loops).
// MaxPool / AveragePool (2-D; 1-D as H = 1): one invocation per output element. Taps outside the
// input are skipped; the average divides by the taps inside [LO, HI) per axis: the input
// (count_include_pad=0) or the input plus explicit pads (=1), never the ceil_mode overhang.
#include "common.glsl"
#include "texel.glsl"
#include "act.glsl"
#ifndef MAXPOOL
#define MAXPOOL 1
#endif
layout(local_size_x = 256) in;
TBUF(0, X);
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P {
    uint total; int H; int W; int OH; int OW; int KH; int KW; int SH; int SW; int DH; int DW;
    int PT; int PL; int LOH; int HIH; int LOW; int HIW; float act_a; float act_b;
} p;

void main() {
    uint i = gid();
    if (i >= p.total) return;
    int ow = int(i % uint(p.OW));
    int t = int(i / uint(p.OW));
    int oh = t % p.OH;
    int nc = t / p.OH;
    int xb = nc * p.H * p.W;
    int ih0 = oh * p.SH - p.PT, iw0 = ow * p.SW - p.PL;
#if MAXPOOL
    float acc = -3.402823466e+38;
#else
    float acc = 0.0;
    int ch = 0, cw = 0;
    for (int kh = 0; kh < p.KH; ++kh) { int ih = ih0 + kh * p.DH; if (ih >= p.LOH && ih < p.HIH) ch++; }
    for (int kw = 0; kw < p.KW; ++kw) { int iw = iw0 + kw * p.DW; if (iw >= p.LOW && iw < p.HIW) cw++; }
#endif
    for (int kh = 0; kh < p.KH; ++kh) {
        int ih = ih0 + kh * p.DH;
        if (ih < 0 || ih >= p.H) continue;
        for (int kw = 0; kw < p.KW; ++kw) {
            int iw = iw0 + kw * p.DW;
            if (iw < 0 || iw >= p.W) continue;
            int xi = xb + ih * p.W + iw;
            float v = TFETCH(X, xi >> 2)[xi & 3];
#if MAXPOOL
            acc = max(acc, v);
#else
            acc += v;
#endif
        }
    }
#if !MAXPOOL
    acc /= float(max(ch * cw, 1));
#endif
    y[i] = act(acc, p.act_a, p.act_b);
}
