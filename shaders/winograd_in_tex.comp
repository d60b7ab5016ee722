#version 450
// winograd_in.comp for CPU-type devices (lavapipe): the input is read through an RGBA32F texel view
// (a gather there, where storage-buffer loads are per-lane loops) and V's rows are padded to TP
// columns (a multiple of 4) so that gemm_tex.comp reads them as whole texels. One invocation transforms
// 4 consecutive tiles of a channel and writes each V row segment as one vec4 (a storage-buffer store
// is a per-lane loop on lavapipe, so 4x fewer of them); pad tiles are written as zeros.
// V[e][c][t] = (BT d BT^T)[e], d the A x A input patch of tile t (zero outside the pads), A = MO + 2.
#include "common.glsl"
#include "texel.glsl"
#ifndef MO
#define MO 2
#endif
#define A (MO + 2)
layout(local_size_x = 256) in;
TBUF(0, X);
layout(std430, binding = 1) readonly buffer BTm { float bt[]; };  // [A, A] row-major
layout(std430, binding = 2) writeonly buffer V { vec4 v4[]; };    // [A*A, C, TP / 4]
layout(push_constant) uniform P { uint total; int C; int H; int W; int PT; int PL; int TH; int TW; int T; int TP; } p;

void main() {
    uint i = gid();
    if (i >= p.total) return;             // total = C * TP / 4
    int tq = p.TP / 4;
    int q = int(i % uint(tq));
    int c = int(i / uint(tq));
    // the transform matrix in registers: read from its buffer inside the loops it costs a storage-buffer
    // load per multiply-add, a per-lane loop on lavapipe
    float btl[A * A];
    for (int e = 0; e < A * A; ++e) btl[e] = bt[e];
    vec4 o[A * A];
    for (int e = 0; e < A * A; ++e) o[e] = vec4(0.0);
    for (int j = 0; j < 4; ++j) {
        int t = q * 4 + j;
        if (t >= p.T) break;
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
                bool ok = ih >= 0 && ih < p.H && iw >= 0 && iw < p.W;
                int xi = ok ? xb + ih * p.W + iw : 0;
                float u = TFETCH(X, xi >> 2)[xi & 3];
                d[a][b] = ok ? u : 0.0;
            }
        }
        float tmp[A][A];
        for (int a = 0; a < A; ++a)
            for (int b = 0; b < A; ++b) {
                float s = 0.0;
                for (int k = 0; k < A; ++k) s += btl[a * A + k] * d[k][b];
                tmp[a][b] = s;
            }
        for (int a = 0; a < A; ++a)
            for (int b = 0; b < A; ++b) {
                float s = 0.0;
                for (int k = 0; k < A; ++k) s += tmp[a][k] * btl[b * A + k];
                o[a * A + b][j] = s;
            }
    }
    for (int e = 0; e < A * A; ++e) v4[(e * p.C + c) * tq + q] = o[e];
}
