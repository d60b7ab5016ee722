#version 450
// conv_gemm.comp on the GPU's matrix units (VK_NV_cooperative_matrix: fp16 x fp16 products summed in
// fp32), for layers whose precision plan allows fp16 arithmetic. Same bindings, push constants, output
// tile (64x64 per workgroup) and split-K contract as conv_gemm.comp, so the host swaps the shader only.
//   Y[m, pix] = sum_k Wt[k, m] * col[k, pix]
// 256 invocations = 8 subgroups of 32; each subgroup owns a 32x16 part of the tile as 2 16x16
// accumulators. Operand tiles are staged in shared memory as fp16 (BK = 32 per step), the next step's
// fetched into registers while the current one multiplies (the loads, not the products, set the time
// of these small batch-1 GEMMs); the accumulators
// go through shared memory once at the end so the epilogue (bias, residual, activation or the split-K
// partial sums) is written coalesced along pixels.
// Why not conv_gemm's HARITH: packed fp16 FMAs only double the FMA rate; the matrix units on an H100
// run fp16 at ~15x the fp32 FMA rate, and the sums stay fp32 (more accurate than HARITH's fp16 tile sums).
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
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
#define BK 32
#define NT 256
layout(local_size_x = NT) in;
layout(constant_id = 0) const int KH = 1;
layout(constant_id = 1) const int KW = 1;
layout(constant_id = 2) const int SH = 1;
layout(constant_id = 3) const int SW = 1;
layout(constant_id = 4) const int DH = 1;
layout(constant_id = 5) const int DW = 1;
layout(std430, binding = 0) readonly buffer X { float x[]; };
WBUF(WFP, 1, Wt, w);     // [G, K, M]
#if SPLITK
layout(std430, binding = 2) writeonly buffer Part { float part[]; };
#else
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
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

shared float16_t As[BK * BM];   // [k][m]: A(m, k) column-major
shared float16_t Bs[BK * BN];   // [k][pix]: B(k, pix) row-major
shared float Cs[BM * BN];       // [m][pix]

float load_a(int k, int m, int kend, int wbase) {
    return (k < kend && m < p.M) ? WLD(WFP, w, wbase + k * p.M + m) : 0.0;
}

float load_b(int k, int pix, int kend, int P, int xbase) {
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
    return v;
}

#define LA ((BK * BM) / NT)
#define LB ((BK * BN) / NT)

void main() {
    int tid = int(gl_LocalInvocationID.x);
    int sg = tid >> 5;  // subgroup of 32 (NVIDIA's fixed size; the host uses this shader only there)
    int wm = (sg >> 2) * 32, wn = (sg & 3) * 16;
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
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[2];
    for (int i = 0; i < 2; ++i) acc[i] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
    // the next K step's operands are fetched into registers while this step's products run
    float ra[LA], rb[LB];
    for (int t = 0; t < LA; ++t) { int e = tid + t * NT; ra[t] = load_a(kbeg + e / BM, m0 + e % BM, kend, wbase); }
    for (int t = 0; t < LB; ++t) { int e = tid + t * NT; rb[t] = load_b(kbeg + e / BN, n0 + e % BN, kend, P, xbase); }
    for (int k0 = kbeg; k0 < kend; k0 += BK) {
        for (int t = 0; t < LA; ++t) As[tid + t * NT] = float16_t(ra[t]);
        for (int t = 0; t < LB; ++t) Bs[tid + t * NT] = float16_t(rb[t]);
        barrier();
        int k1 = k0 + BK;
        if (k1 < kend) {
            for (int t = 0; t < LA; ++t) { int e = tid + t * NT; ra[t] = load_a(k1 + e / BM, m0 + e % BM, kend, wbase); }
            for (int t = 0; t < LB; ++t) { int e = tid + t * NT; rb[t] = load_b(k1 + e / BN, n0 + e % BN, kend, P, xbase); }
        }
        for (int ks = 0; ks < BK; ks += 16) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a[2];
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> b;
            for (int i = 0; i < 2; ++i) coopMatLoadNV(a[i], As, uint(ks * BM + wm + 16 * i), uint(BM), true);
            coopMatLoadNV(b, Bs, uint(ks * BN + wn), uint(BN), false);
            for (int i = 0; i < 2; ++i) acc[i] = coopMatMulAddNV(a[i], b, acc[i]);
        }
        barrier();
    }
    for (int i = 0; i < 2; ++i) coopMatStoreNV(acc[i], Cs, uint((wm + 16 * i) * BN + wn), uint(BN), false);
    barrier();
    int cout = p.G * p.M;
    for (int t = 0; t < (BM * BN) / NT; ++t) {
        int e = tid + t * NT;
        int mm = e / BN, nn = e % BN;
        int m = m0 + mm, pix = n0 + nn;
        if (m >= p.M || pix >= P) continue;
        int oc = g * p.M + m;
#if SPLITK
        part[split * p.total + (img * cout + oc) * P + pix] = Cs[e];
#else
        int oi = (img * cout + oc) * P + pix;
        float v = Cs[e] + bias[oc];
#if RESIDUAL
        v += r[oi];
#endif
        y[oi] = act(v, p.act_a, p.act_b);
#endif
    }
}
