#version 450
// Skinny GEMM for few rows (fully connected layers at batch 1-4): one invocation per output column
// computes every row, walking K; B is [K, N]-major so a workgroup reads B rows contiguously.
// Same push layout/semantics as matmul.comp for the 2-D case (no batch).
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
layout(local_size_x = 64) in;
WBUF(AFP, 0, Am, a);
WBUF(BFP, 1, Bm, b);
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

void main() {
    int n = int(gid());
    if (n >= p.N) return;
    float acc[MAXM];
    for (int m = 0; m < MAXM; ++m) acc[m] = 0.0;
    int bi = n * p.sb_n;
    for (int k = 0; k < p.K; ++k) {
        float bv = WLD(BFP, b, bi + k * p.sb_k);
        for (int m = 0; m < MAXM; ++m)
            if (m < p.M) acc[m] += WLD(AFP, a, m * p.sa_m + k * p.sa_k) * bv;
    }
    for (int m = 0; m < MAXM; ++m) {
        if (m >= p.M) break;
        int oi = m * p.ldc + p.c_off + n;
        float v = p.alpha * acc[m];
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
