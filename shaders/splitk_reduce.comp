#version 450
// Second half of a split-K GEMM: y[i] = act(sum_s part[s][i] + bias[(i / DIV) % MOD] + r[i]).
// (DIV, MOD) address the bias: conv channel (P, Cout), GEMM column (1, N), row (N, M), full (1, M*N).
#include "common.glsl"
#include "act.glsl"
#ifndef HAS_BIAS
#define HAS_BIAS 1
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Part { float part[]; };
#if HAS_BIAS
layout(std430, binding = 1) readonly buffer Bias { float bias[]; };
#define NEXT 2
#else
#define NEXT 1
#endif
#if RESIDUAL
layout(std430, binding = NEXT) readonly buffer R { float r[]; };
layout(std430, binding = NEXT + 1) writeonly buffer Y { float y[]; };
#else
layout(std430, binding = NEXT) writeonly buffer Y { float y[]; };
#endif
layout(push_constant) uniform P { uint total; uint S; uint DIV; uint MOD; float act_a; float act_b; } p;

void main() {
    uint i = gid();
    if (i >= p.total) return;
    float v = 0.0;
    for (uint s = 0u; s < p.S; ++s) v += part[s * p.total + i];
#if HAS_BIAS
    v += bias[(i / p.DIV) % p.MOD];
#endif
#if RESIDUAL
    v += r[i];
#endif
    y[i] = act(v, p.act_a, p.act_b);
}
