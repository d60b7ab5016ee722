#version 450
// Register-blocked GEMM for CPU-type Vulkan devices (lavapipe): every operand is read through
// texel buffers (RGBA32F views, texel.glsl), which llvmpipe compiles to straight-line gathers, where a
// storage-buffer load is a per-lane loop several times slower. No shared memory, no barriers.
//
//   Y[z][m][n] = act(sum_k A[g][mb][k][m % RM] * B[z][k][n] + bias[g*M + m] (+ R[z][m][n]))
//
// A: weights packed on the host as (G, ceil(M/RM), K, RM), zero-padded past M (RM/4 texels per k).
// B: (Z, K, ldb4 texels) rows of 4-float texels; columns past N are never stored.
// Each invocation owns RM rows x RN columns; z = img * G + g (the workgroup's z).
#include "common.glsl"
#include "texel.glsl"
#include "act.glsl"
#ifndef RM
#define RM 16
#endif
#ifndef RN
#define RN 4
#endif
#ifndef LX
#define LX 64
#endif
// Epilogue variants are compile-time: run-time flags doubled lavapipe's first-use compile of this
// shader (~0.4 s per pipeline), since every store path gets unrolled over the whole register block.
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
// VOUT: N and ldc are multiples of 4, so rows are written (and the residual read) as vec4
#ifndef VOUT
#define VOUT 0
#endif
#ifndef BIAS
#define BIAS 1
#endif
#define RM4 (RM / 4)
#define RN4 (RN / 4)
layout(local_size_x = LX) in;
TBUFW(AFP, 0, A);
TBUF(1, B);
TBUF(2, Bias);   // G*M padded to whole RM blocks per group (bound to anything when BIAS is 0)
TBUF(3, R);      // the residual (bound to anything when RESIDUAL is 0)
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) writeonly buffer Y4 { vec4 y4[]; };
layout(push_constant) uniform P {
    int M; int N; int K; int G; int ldb4; int b_z4; int ldc; int c_z; float act_a; float act_b;
} p;

void main() {
    // invocations over (row block, column block), columns fastest: narrow products still fill the lanes
    int nt = (p.N + 3) / 4;                       // texels per B row holding data
    int lanes = (nt + RN4 - 1) / RN4;
    int mbs = (p.M + RM - 1) / RM;
    int id = int(gl_GlobalInvocationID.x);
    if (id >= lanes * mbs) return;
    int n0 = (id % lanes) * RN;
    int mb = id / lanes;
    int z = int(gl_WorkGroupID.z);
    int g = z % p.G;
    // columns past the data read the last texel again (their sums are never stored)
    int col[RN4];
    for (int j = 0; j < RN4; ++j) col[j] = min(n0 / 4 + j, nt - 1);
    int bi = z * p.b_z4;
    int ai = (g * mbs + mb) * p.K * RM4;
    vec4 acc[RM][RN4];
    for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN4; ++j) acc[i][j] = vec4(0.0);
    for (int k = 0; k < p.K; ++k) {
        vec4 bv[RN4];
        for (int j = 0; j < RN4; ++j) bv[j] = TFETCH(B, bi + col[j]);
        for (int i4 = 0; i4 < RM4; ++i4) {
            vec4 av = TFETCHW(AFP, A, ai + i4);
            for (int j = 0; j < RN4; ++j) {
                acc[4 * i4 + 0][j] += av.x * bv[j];
                acc[4 * i4 + 1][j] += av.y * bv[j];
                acc[4 * i4 + 2][j] += av.z * bv[j];
                acc[4 * i4 + 3][j] += av.w * bv[j];
            }
        }
        bi += p.ldb4;
        ai += RM4;
    }
    int m0 = mb * RM;
    vec4 bias4[RM4];
    for (int i4 = 0; i4 < RM4; ++i4)
#if BIAS
        bias4[i4] = TFETCH(Bias, (g * mbs + mb) * RM4 + i4);
#else
        bias4[i4] = vec4(0.0);
#endif
    int cbase = z * p.c_z + n0;
    for (int i = 0; i < RM; ++i) {
        int m = m0 + i;
        if (m >= p.M) break;
        int ci = cbase + m * p.ldc;
        for (int j = 0; j < RN4; ++j) {
            vec4 v = acc[i][j] + bias4[i / 4][i % 4];
#if VOUT
            if (n0 + 4 * j >= p.N) break;
#if RESIDUAL
            v += TFETCH(R, ci / 4 + j);
#endif
            v.x = act(v.x, p.act_a, p.act_b); v.y = act(v.y, p.act_a, p.act_b);
            v.z = act(v.z, p.act_a, p.act_b); v.w = act(v.w, p.act_a, p.act_b);
            y4[ci / 4 + j] = v;
#else
            for (int c = 0; c < 4; ++c) {
                int oi = ci + 4 * j + c;
                if (n0 + 4 * j + c >= p.N) break;
                float u = v[c];
#if RESIDUAL
                u += TFETCH(R, oi >> 2)[oi & 3];
#endif
                y[oi] = act(u, p.act_a, p.act_b);
            }
#endif
        }
    }
}
