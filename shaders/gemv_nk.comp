#version 450
// Skinny GEMM for few rows with B stored [N, K] (PyTorch Linear weights as Gemm transB=1 keeps
// them): one 64-invocation workgroup per output column n splits K (coalesced reads of B's row n),
// then a shared-memory sum. The weights are used as exported: no transpose at load.
// Same push layout/semantics as gemv.comp (sb_k = 1, sb_n = K for [N, K]).
// VEC4 (K % 4 == 0, A rows contiguous and 16-byte aligned): A and B are read as 4-wide vectors and each
// invocation keeps UNROLL of them in flight. A lone scalar load per lane per iteration left the H100 at
// ~200 GB/s on vgg16's fc6 (411 MB): the loop was latency-bound, not bandwidth-bound.
#include "common.glsl"
#include "act.glsl"
#ifndef BIAS_MODE
#define BIAS_MODE 0
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
#ifndef MAXM
#define MAXM 4
#endif
#define WG 64
layout(local_size_x = WG) in;
#ifndef VEC4
#define VEC4 0
#endif
#define UNROLL 4
#if VEC4
layout(std430, binding = 0) readonly buffer Am4 { vec4 a4[]; };
#if BFP == 0
layout(std430, binding = 1) readonly buffer Bm4 { vec4 b4[]; };
#define BLD4(i) (b4[i])
#elif BFP == 1
layout(std430, binding = 1) readonly buffer Bm4 { f16vec4 b4[]; };
#define BLD4(i) vec4(b4[i])
#else
layout(std430, binding = 1) readonly buffer Bm4 { uvec2 b4[]; };
#define BLD4(i) vec4(unpackHalf2x16(b4[i].x), unpackHalf2x16(b4[i].y))
#endif
#else
WBUF(AFP, 0, Am, a);
WBUF(BFP, 1, Bm, b);
#endif
#if BIAS_MODE > 0
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
#define NEXT 3
#else
#define NEXT 2
#endif
#if RESIDUAL
layout(std430, binding = NEXT) readonly buffer R { float r[]; };
layout(std430, binding = NEXT + 1) writeonly buffer Y { float y[]; };
#else
layout(std430, binding = NEXT) writeonly buffer Y { float y[]; };
#endif
layout(push_constant) uniform P {
    int M; int N; int K; int sa_m; int sa_k; int sb_k; int sb_n; int ldc; int c_off;
    float alpha; float act_a; float act_b;
} p;

shared float red[MAXM][WG];

void main() {
    int n = int(gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x);
    if (n >= p.N) return;  // uniform per workgroup
    int l = int(gl_LocalInvocationID.x);
    float acc[MAXM];
    for (int m = 0; m < MAXM; ++m) acc[m] = 0.0;
#if VEC4
    int k4 = p.K >> 2, bi4 = (n * p.sb_n) >> 2, sam4 = p.sa_m >> 2;
    int k = l;
    for (; k + (UNROLL - 1) * WG < k4; k += UNROLL * WG) {
        vec4 bv[UNROLL];
        for (int u = 0; u < UNROLL; ++u) bv[u] = BLD4(bi4 + k + u * WG);
        for (int m = 0; m < MAXM; ++m)
            if (m < p.M)
                for (int u = 0; u < UNROLL; ++u) acc[m] += dot(a4[m * sam4 + k + u * WG], bv[u]);
    }
    for (; k < k4; k += WG) {
        vec4 bv = BLD4(bi4 + k);
        for (int m = 0; m < MAXM; ++m)
            if (m < p.M) acc[m] += dot(a4[m * sam4 + k], bv);
    }
#else
    int bi = n * p.sb_n;
    for (int k = l; k < p.K; k += WG) {
        float bv = WLD(BFP, b, bi + k * p.sb_k);
        for (int m = 0; m < MAXM; ++m)
            if (m < p.M) acc[m] += WLD(AFP, a, m * p.sa_m + k * p.sa_k) * bv;
    }
#endif
    for (int m = 0; m < MAXM; ++m) red[m][l] = acc[m];
    barrier();
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s)
            for (int m = 0; m < MAXM; ++m) red[m][l] += red[m][l + s];
        barrier();
    }
    if (l != 0) return;
    for (int m = 0; m < MAXM; ++m) {
        if (m >= p.M) break;
        int oi = m * p.ldc + p.c_off + n;
        float v = p.alpha * red[m][0];
#if BIAS_MODE == 1
        v += bias[p.c_off + n];
#elif BIAS_MODE == 2
        v += bias[m];
#elif BIAS_MODE == 3
        v += bias[m * p.ldc + p.c_off + n];
#endif
#if RESIDUAL
        v += r[oi];
#endif
        y[oi] = act(v, p.act_a, p.act_b);
    }
}
