#version 450
// matmul.comp without shared memory: each invocation accumulates a 4x4 register block straight
// from global memory (for CPU-type devices such as lavapipe, where workgroup barriers are
// coroutine switches). Same bindings, push constants and semantics as matmul.comp.
#include "common.glsl"
#include "act.glsl"
#ifndef BIAS_MODE
#define BIAS_MODE 0
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
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
    int M; int N; int K; int sa_m; int sa_k; int sb_k; int sb_n; int bd1; int bd2;
    int sa0; int sa1; int sa2; int sb0; int sb1; int sb2; int ldc; int c_off;
    float alpha; float act_a; float act_b;
} p;

void main() {
    // blocks of 4 rows x 4 columns, linearised so that skinny products still fill every lane
    int nq = (p.N + 3) / 4;
    int id = int(gl_GlobalInvocationID.x);
    if (id >= nq * ((p.M + 3) / 4)) return;
    int n0 = (id % nq) * 4;
    int m0 = (id / nq) * 4;
    int z = int(gl_WorkGroupID.z);
    int b2 = z % p.bd2;
    int b1 = (z / p.bd2) % p.bd1;
    int b0 = z / (p.bd1 * p.bd2);
    int abase = b0 * p.sa0 + b1 * p.sa1 + b2 * p.sa2;
    int bbase = b0 * p.sb0 + b1 * p.sb1 + b2 * p.sb2;
    int mv = min(4, p.M - m0), nv = min(4, p.N - n0);
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
    for (int k = 0; k < p.K; ++k) {
        float av[4], bv[4];
        for (int i = 0; i < 4; ++i) av[i] = i < mv ? WLD(AFP, a, abase + (m0 + i) * p.sa_m + k * p.sa_k) : 0.0;
        for (int j = 0; j < 4; ++j) bv[j] = j < nv ? WLD(BFP, b, bbase + k * p.sb_k + (n0 + j) * p.sb_n) : 0.0;
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    for (int i = 0; i < mv; ++i) {
        int m = m0 + i;
        for (int j = 0; j < nv; ++j) {
            int n = n0 + j;
            int oi = (z * p.M + m) * p.ldc + p.c_off + n;
            float v = p.alpha * acc[i][j];
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
}
