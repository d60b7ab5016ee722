#version 450
// Implicit-GEMM convolution without shared memory: each invocation accumulates a 4 (out channels)
// x 4 (pixels) register block straight from global memory. For CPU-type devices (lavapipe), where
// workgroup barriers are coroutine switches and caches stand in for shared memory.
#include "common.glsl"
#include "act.glsl"
#ifndef IS1X1
#define IS1X1 0
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
layout(local_size_x = 64) in;
layout(constant_id = 0) const int KH = 1;
layout(constant_id = 1) const int KW = 1;
layout(constant_id = 2) const int SH = 1;
layout(constant_id = 3) const int SW = 1;
layout(constant_id = 4) const int DH = 1;
layout(constant_id = 5) const int DW = 1;
layout(std430, binding = 0) readonly buffer X { float x[]; };
WBUF(WFP, 1, Wt, w);     // [G, K, M]
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
#if RESIDUAL
layout(std430, binding = 3) readonly buffer R { float r[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
#else
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
#endif
layout(push_constant) uniform P {
    int C; int H; int W; int Cg; int M; int OH; int OW; int PT; int PL; int G; int K; float act_a; float act_b;
} p;

void main() {
    int P = p.OH * p.OW;
    int pq = (P + 3) / 4;
    // blocks of 4 channels x 4 pixels, linearised so that small maps still fill every lane
    int id = int(gl_GlobalInvocationID.x);
    if (id >= pq * ((p.M + 3) / 4)) return;
    int p0 = (id % pq) * 4;
    int m0 = (id / pq) * 4;
    int z = int(gl_WorkGroupID.z);
    int g = z % p.G, img = z / p.G;
    int xbase = (img * p.C + g * p.Cg) * p.H * p.W;
    int wbase = g * p.K * p.M;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
    int oh[4], ow[4];
    bool pv[4];
    for (int j = 0; j < 4; ++j) {
        int pix = p0 + j;
        pv[j] = pix < P;
        oh[j] = pix / p.OW;
        ow[j] = pix - oh[j] * p.OW;
    }
    for (int k = 0; k < p.K; ++k) {
        float a[4];
        for (int i = 0; i < 4; ++i) a[i] = (m0 + i < p.M) ? WLD(WFP, w, wbase + k * p.M + m0 + i) : 0.0;
        float b[4];
#if IS1X1
        for (int j = 0; j < 4; ++j) b[j] = pv[j] ? x[xbase + k * P + p0 + j] : 0.0;
#else
        int ci = k / (KH * KW);
        int rr = k - ci * (KH * KW);
        int kh = rr / KW, kw = rr - kh * KW;
        for (int j = 0; j < 4; ++j) {
            int ih = oh[j] * SH - p.PT + kh * DH;
            int iw = ow[j] * SW - p.PL + kw * DW;
            b[j] = (pv[j] && ih >= 0 && ih < p.H && iw >= 0 && iw < p.W) ? x[xbase + (ci * p.H + ih) * p.W + iw] : 0.0;
        }
#endif
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    int cout = p.G * p.M;
    for (int i = 0; i < 4; ++i) {
        int m = m0 + i;
        if (m >= p.M) break;
        int oc = g * p.M + m;
        float bv = bias[oc];
        for (int j = 0; j < 4; ++j) {
            if (!pv[j]) break;
            int oi = (img * cout + oc) * P + p0 + j;
            float v = acc[i][j] + bv;
#if RESIDUAL
            v += r[oi];
#endif
            y[oi] = act(v, p.act_a, p.act_b);
        }
    }
}
