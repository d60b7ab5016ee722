#version 450
// LayerNormalization (MODE 0: scale/bias per element of the normalized row) and
// InstanceNormalization (MODE 1: scale/bias per channel, channel = row % C) over rows [rows, D]:
// one 256-invocation workgroup per row, mean then variance of (x - mean) (two passes, as the
// float64 reference does), then y = act((x - mean) / sqrt(var + eps) * scale + bias).
#include "common.glsl"
#include "act.glsl"
#ifndef MODE
#define MODE 0
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 1
#endif
#define WG 256
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer S { float sc[]; };
#if HAS_BIAS
layout(std430, binding = 2) readonly buffer B { float bi[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
#else
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
#endif
layout(push_constant) uniform P { uint rows; uint D; uint C; float eps; float act_a; float act_b; } p;

shared float red[WG];

float wg_sum(float v) {
    uint l = gl_LocalInvocationID.x;
    red[l] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (l < s) red[l] += red[l + s];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.rows) return;
    uint l = gl_LocalInvocationID.x;
    uint base = row * p.D;
    float s = 0.0;
    for (uint k = l; k < p.D; k += WG) s += x[base + k];
    float mean = wg_sum(s) / float(p.D);
    float q = 0.0;
    for (uint k = l; k < p.D; k += WG) { float d = x[base + k] - mean; q += d * d; }
    float inv = inversesqrt(wg_sum(q) / float(p.D) + p.eps);
#if MODE == 1
    uint c = row % p.C;
    float g = sc[c] * inv;
#if HAS_BIAS
    float b = bi[c];
#else
    float b = 0.0;
#endif
    for (uint k = l; k < p.D; k += WG) y[base + k] = act((x[base + k] - mean) * g + b, p.act_a, p.act_b);
#else
    for (uint k = l; k < p.D; k += WG) {
        float v = (x[base + k] - mean) * inv * sc[k];
#if HAS_BIAS
        v += bi[k];
#endif
        y[base + k] = act(v, p.act_a, p.act_b);
    }
#endif
}
