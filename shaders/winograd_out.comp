#version 450
// Winograd F(MO x MO, 3x3) output transform: Y tile = AT m AT^T for each (out channel, tile), plus
// bias, fused residual and activation; tiles overhanging the output edge are clipped.
#include "common.glsl"
#include "act.glsl"
#ifndef MO
#define MO 2
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
#define A (MO + 2)
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Mw { float mw[]; };   // [A*A, K, T]
layout(std430, binding = 1) readonly buffer ATm { float at[]; };  // [MO, A] row-major
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
#if RESIDUAL
layout(std430, binding = 3) readonly buffer R { float r[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
#else
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
#endif
layout(push_constant) uniform P { uint total; int K; int OH; int OW; int TH; int TW; int T; float act_a; float act_b; } p;

void main() {
    uint i = gid();
    if (i >= p.total) return;
    int t = int(i % uint(p.T));
    int k = int(i / uint(p.T));
    int img = t / (p.TH * p.TW);
    int tt = t - img * p.TH * p.TW;
    int th = tt / p.TW, tw = tt - th * p.TW;
    int KT = p.K * p.T;
    float m[A][A];
    for (int a = 0; a < A; ++a)
        for (int b = 0; b < A; ++b) m[a][b] = mw[(a * A + b) * KT + k * p.T + t];
    float tmp[MO][A];
    for (int a = 0; a < MO; ++a)
        for (int b = 0; b < A; ++b) {
            float s = 0.0;
            for (int q = 0; q < A; ++q) s += at[a * A + q] * m[q][b];
            tmp[a][b] = s;
        }
    float bv = bias[k];
    int ybase = (img * p.K + k) * p.OH * p.OW;
    for (int a = 0; a < MO; ++a) {
        int oh = th * MO + a;
        if (oh >= p.OH) break;
        for (int b = 0; b < MO; ++b) {
            int ow = tw * MO + b;
            if (ow >= p.OW) break;
            float s = bv;
            for (int q = 0; q < A; ++q) s += tmp[a][q] * at[b * A + q];
            int oi = ybase + oh * p.OW + ow;
#if RESIDUAL
            s += r[oi];
#endif
            y[oi] = act(s, p.act_a, p.act_b);
        }
    }
}
