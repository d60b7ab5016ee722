#version 450
// Convolution as an implicit GEMM with shared-memory tiles: per (image, group),
//   Y[m, pix] = sum_k Wt[k, m] * col[k, pix],  k = (ci, kh, kw), pix = (oh, ow),
// where col is never materialised: the B tile is gathered from the input (zero outside the pads).
// 64x64 output tile per 256-thread workgroup, 4x4 per thread, K step 16.
// Structural geometry (kernel, stride, dilation) are specialization constants so the index math
// folds; IS1X1 (1x1, stride 1, no pad) reads the input as the col matrix directly.
// SPLITK: the K range is split over S workgroups along z (few output tiles, e.g. 7x7 maps with 512
// channels, would leave most of a big GPU idle); each writes raw partial sums to P[s][out index] and
// splitk_reduce.comp adds them with the epilogue.
#include "common.glsl"
#include "act.glsl"
#ifndef IS1X1
#define IS1X1 0
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
#ifndef SPLITK
#define SPLITK 0
#endif
#define BM 64
#define BN 64
#define BK 16
layout(local_size_x = 16, local_size_y = 16) in;
layout(constant_id = 0) const int KH = 1;
layout(constant_id = 1) const int KW = 1;
layout(constant_id = 2) const int SH = 1;
layout(constant_id = 3) const int SW = 1;
layout(constant_id = 4) const int DH = 1;
layout(constant_id = 5) const int DW = 1;
layout(std430, binding = 0) readonly buffer X { float x[]; };
WBUF(WFP, 1, Wt, w);     // [G, K, M]: k-major for coalesced tile loads
#if SPLITK
layout(std430, binding = 2) writeonly buffer Part { float part[]; };  // [S, N*G*M*P]
#else
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };  // [G*M]
#endif
#if SPLITK
#elif RESIDUAL
layout(std430, binding = 3) readonly buffer R { float r[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
#else
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
#endif
layout(push_constant) uniform P {
    int C; int H; int W; int Cg; int M; int OH; int OW; int PT; int PL; int G; int K; float act_a; float act_b;
    int S; int Kc; int total;
} p;

shared TILE_T As[BK][BM];
shared TILE_T Bs[BK][BN];

void main() {
    int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
    int tid = ty * 16 + tx;
    int P = p.OH * p.OW;
    int n0 = int(gl_WorkGroupID.x) * BN;
    int m0 = int(gl_WorkGroupID.y) * BM;
    int z = int(gl_WorkGroupID.z);
#if SPLITK
    int split = z % p.S;
    z /= p.S;
    int kbeg = split * p.Kc, kend = min(p.K, kbeg + p.Kc);
#else
    int kbeg = 0, kend = p.K;
#endif
    int g = z % p.G, img = z / p.G;
    int xbase = (img * p.C + g * p.Cg) * p.H * p.W;
    int wbase = g * p.K * p.M;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;

    for (int k0 = kbeg; k0 < kend; k0 += BK) {
        for (int r = 0; r < 4; ++r) {
            int e = tid + r * 256;
            int kk = e / BM, mm = e % BM;
            int k = k0 + kk, m = m0 + mm;
            As[kk][mm] = TILE_T((k < kend && m < p.M) ? WLD(WFP, w, wbase + k * p.M + m) : 0.0);
        }
        for (int r = 0; r < 4; ++r) {
            int e = tid + r * 256;
            int kk = e / BN, nn = e % BN;
            int k = k0 + kk, pix = n0 + nn;
            float v = 0.0;
            if (k < kend && pix < P) {
#if IS1X1
                v = x[xbase + k * P + pix];
#else
                int ci = k / (KH * KW);
                int rr = k - ci * (KH * KW);
                int kh = rr / KW, kw = rr - kh * KW;
                int oh = pix / p.OW, ow = pix - oh * p.OW;
                int ih = oh * SH - p.PT + kh * DH;
                int iw = ow * SW - p.PL + kw * DW;
                if (ih >= 0 && ih < p.H && iw >= 0 && iw < p.W) v = x[xbase + (ci * p.H + ih) * p.W + iw];
#endif
            }
            Bs[kk][nn] = TILE_T(v);
        }
        barrier();
#if HARITH
        f16vec4 h[4];
        for (int i = 0; i < 4; ++i) h[i] = f16vec4(0);
        for (int kk = 0; kk < BK; ++kk) {
            f16vec4 bq = f16vec4(Bs[kk][tx], Bs[kk][tx + 16], Bs[kk][tx + 32], Bs[kk][tx + 48]);
            for (int i = 0; i < 4; ++i) h[i] = fma(f16vec4(As[kk][ty + 16 * i]), bq, h[i]);
        }
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) acc[i][j] += float(h[i][j]);
#else
        for (int kk = 0; kk < BK; ++kk) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
            for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16 * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
#endif
        barrier();
    }
    int cout = p.G * p.M;
    for (int i = 0; i < 4; ++i) {
        int m = m0 + ty + 16 * i;
        if (m >= p.M) continue;
        int oc = g * p.M + m;
#if SPLITK
        for (int j = 0; j < 4; ++j) {
            int pix = n0 + tx + 16 * j;
            if (pix >= P) continue;
            part[split * p.total + (img * cout + oc) * P + pix] = acc[i][j];
        }
#else
        float bv = bias[oc];
        for (int j = 0; j < 4; ++j) {
            int pix = n0 + tx + 16 * j;
            if (pix >= P) continue;
            int oi = (img * cout + oc) * P + pix;
            float v = acc[i][j] + bv;
#if RESIDUAL
            v += r[oi];
#endif
            y[oi] = act(v, p.act_a, p.act_b);
        }
#endif
    }
}
