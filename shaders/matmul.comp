#version 450
// Batched GEMM with shared-memory tiles: Y[z] = alpha * A[z] @ B[z] (+ bias) (+ residual), then act.
// Operands are read through element strides (sa_m, sa_k, sb_k, sb_n), so transposed operands
// (Gemm transA/transB, MatMul views) need no copy; the batch index z is split into up to 3
// broadcast dims (bd0 = grid z / (bd1*bd2)) with per-operand batch strides (0 = broadcast).
// Y rows have stride ldc and start at column c_off (column-chunked weights write their slice).
// BIAS_MODE: 0 none, 1 per column bias[c_off+n], 2 per row bias[m], 3 full bias[m*ldc + c_off + n].
// 64x64 tile per 256-thread workgroup, 4x4 per thread, K step 16.
// SPLITK: the K range is split over S workgroups (grid z = batch * S); each writes alpha * its partial
// sum to P[s][z][m][n] (ldc == N, c_off == 0) and splitk_reduce.comp adds them with the epilogue.
#include "common.glsl"
#include "act.glsl"
#ifndef BIAS_MODE
#define BIAS_MODE 0
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
WBUF(AFP, 0, Am, a);
WBUF(BFP, 1, Bm, b);
#if SPLITK
layout(std430, binding = 2) writeonly buffer Part { float part[]; };
#else
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
#endif
layout(push_constant) uniform P {
    int M; int N; int K; int sa_m; int sa_k; int sb_k; int sb_n; int bd1; int bd2;
    int sa0; int sa1; int sa2; int sb0; int sb1; int sb2; int ldc; int c_off;
    float alpha; float act_a; float act_b;
    int S; int Kc; int total;
} p;

shared TILE_T As[BK][BM];
shared TILE_T Bs[BK][BN];

void main() {
    int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
    int tid = ty * 16 + tx;
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
    int b2 = z % p.bd2;
    int b1 = (z / p.bd2) % p.bd1;
    int b0 = z / (p.bd1 * p.bd2);
    int abase = b0 * p.sa0 + b1 * p.sa1 + b2 * p.sa2;
    int bbase = b0 * p.sb0 + b1 * p.sb1 + b2 * p.sb2;
    bool a_rowmajor = p.sa_k == 1;
    bool b_rowmajor = p.sb_n == 1;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;

    for (int k0 = kbeg; k0 < kend; k0 += BK) {
        for (int r = 0; r < 4; ++r) {
            int e = tid + r * 256;
            // consecutive invocations walk the operand's contiguous axis
            int kk = a_rowmajor ? e % BK : e / BM;
            int mm = a_rowmajor ? e / BK : e % BM;
            int k = k0 + kk, m = m0 + mm;
            As[kk][mm] = TILE_T((k < kend && m < p.M) ? WLD(AFP, a, abase + m * p.sa_m + k * p.sa_k) : 0.0);
        }
        for (int r = 0; r < 4; ++r) {
            int e = tid + r * 256;
            int nn = b_rowmajor ? e % BN : e / BK;
            int kk = b_rowmajor ? e / BN : e % BK;
            int k = k0 + kk, n = n0 + nn;
            Bs[kk][nn] = TILE_T((k < kend && n < p.N) ? WLD(BFP, b, bbase + k * p.sb_k + n * p.sb_n) : 0.0);
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
            float av[4], bv[4];
            for (int i = 0; i < 4; ++i) av[i] = As[kk][ty + 16 * i];
            for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx + 16 * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
#endif
        barrier();
    }
    for (int i = 0; i < 4; ++i) {
        int m = m0 + ty + 16 * i;
        if (m >= p.M) continue;
        for (int j = 0; j < 4; ++j) {
            int n = n0 + tx + 16 * j;
            if (n >= p.N) continue;
            int oi = (z * p.M + m) * p.ldc + p.c_off + n;
            float v = p.alpha * acc[i][j];
#if SPLITK
            part[split * p.total + oi] = v;
#else
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
#endif
        }
    }
}
