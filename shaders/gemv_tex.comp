#version 450
// gemv_nk.comp for CPU-type devices (lavapipe): one invocation per output column n, reading B's row n
// ([N, K], K a multiple of 4) and the few rows of A (contiguous, row stride a multiple of 4) as
// RGBA32F texels (gathers there; storage-buffer loads are per-lane loops and barriers coroutine
// switches). Same bindings (A and B as texel views), push layout and semantics as gemv_nk.comp.
#include "common.glsl"
#include "texel.glsl"
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
layout(local_size_x = 16) in;
TBUF(0, Am);
TBUFW(BFP, 1, Bm);
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
    vec4 acc[MAXM];
    for (int m = 0; m < MAXM; ++m) acc[m] = vec4(0.0);
    int k4 = p.K / 4;
    int bi = n * (p.sb_n / 4);
    for (int k = 0; k < k4; ++k) {
        vec4 bv = TFETCHW(BFP, Bm, bi + k);
        for (int m = 0; m < MAXM; ++m)
            if (m < p.M) acc[m] += TFETCH(Am, m * (p.sa_m / 4) + k) * bv;
    }
    for (int m = 0; m < MAXM; ++m) {
        if (m >= p.M) break;
        int oi = m * p.ldc + p.c_off + n;
        float v = p.alpha * ((acc[m].x + acc[m].y) + (acc[m].z + acc[m].w));
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
