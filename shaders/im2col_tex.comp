#version 450
// im2col for the CPU-type GEMM (gemm_tex.comp): B[z][k][n], z = img * G + g, k = (ci, kh, kw) within
// the group, n = output pixel; rows padded to ldb4 texels. One invocation writes 4 columns (a vec4).
// The input is read through an RGBA32F texel view (a gather on lavapipe, unlike storage-buffer loads).
#include "common.glsl"
#include "texel.glsl"
layout(local_size_x = 64) in;
layout(constant_id = 0) const int KH = 1;
layout(constant_id = 1) const int KW = 1;
layout(constant_id = 2) const int SH = 1;
layout(constant_id = 3) const int SW = 1;
layout(constant_id = 4) const int DH = 1;
layout(constant_id = 5) const int DW = 1;
TBUF(0, X);
layout(std430, binding = 1) writeonly buffer Bm { vec4 b4[]; };
layout(push_constant) uniform P {
    int total; int C; int H; int W; int Cg; int OH; int OW; int PT; int PL; int G; int K; int ldb4;
} p;

void main() {
    int id = int(gid());
    if (id >= p.total) return;
    int c4 = id % p.ldb4;
    int row = id / p.ldb4;          // z * K + k
    int k = row % p.K;
    int z = row / p.K;
    int g = z % p.G, img = z / p.G;
    int ci = k / (KH * KW);
    int rr = k - ci * (KH * KW);
    int kh = rr / KW, kw = rr - kh * KW;
    int xbase = (img * p.C + g * p.Cg + ci) * p.H * p.W;
    int P = p.OH * p.OW;
    vec4 v = vec4(0.0);
    for (int c = 0; c < 4; ++c) {
        int n = c4 * 4 + c;
        int oh = n / p.OW, ow = n - (n / p.OW) * p.OW;
        int ih = oh * SH - p.PT + kh * DH;
        int iw = ow * SW - p.PL + kw * DW;
        bool ok = n < P && ih >= 0 && ih < p.H && iw >= 0 && iw < p.W;
        int xi = ok ? xbase + ih * p.W + iw : 0;
        float u = TFETCH(X, xi >> 2)[xi & 3];
        v[c] = ok ? u : 0.0;
    }
    b4[id] = v;
}
