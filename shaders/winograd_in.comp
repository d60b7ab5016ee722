#version 450
// Winograd F(MO x MO, 3x3) input transform: V[e][c][t] = (BT d BT^T)[e], d the A x A input patch of
// tile t (zero outside the pads), A = MO + 2. One invocation per (channel, tile).
#include "common.glsl"
#ifndef MO
#define MO 2
#endif
#define A (MO + 2)
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer BTm { float bt[]; };  // [A, A] row-major
layout(std430, binding = 2) writeonly buffer V { float v[]; };    // [A*A, C, T]
layout(push_constant) uniform P { uint total; int C; int H; int W; int PT; int PL; int TH; int TW; int T; } p;

void main() {
    uint i = gid();
    if (i >= p.total) return;
    int t = int(i % uint(p.T));
    int c = int(i / uint(p.T));
    int img = t / (p.TH * p.TW);
    int tt = t - img * p.TH * p.TW;
    int th = tt / p.TW, tw = tt - th * p.TW;
    int ih0 = th * MO - p.PT, iw0 = tw * MO - p.PL;
    int xb = (img * p.C + c) * p.H * p.W;
    float d[A][A];
    for (int a = 0; a < A; ++a) {
        int ih = ih0 + a;
        for (int b = 0; b < A; ++b) {
            int iw = iw0 + b;
            d[a][b] = (ih >= 0 && ih < p.H && iw >= 0 && iw < p.W) ? x[xb + ih * p.W + iw] : 0.0;
        }
    }
    float tmp[A][A];
    for (int a = 0; a < A; ++a)
        for (int b = 0; b < A; ++b) {
            float s = 0.0;
            for (int k = 0; k < A; ++k) s += bt[a * A + k] * d[k][b];
            tmp[a][b] = s;
        }
    int CT = p.C * p.T;
    for (int a = 0; a < A; ++a)
        for (int b = 0; b < A; ++b) {
            float s = 0.0;
            for (int k = 0; k < A; ++k) s += tmp[a][k] * bt[b * A + k];
            v[(a * A + b) * CT + c * p.T + t] = s;
        }
}
