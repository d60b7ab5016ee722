#version 450
// Row normalizations over rows [rows, D]: one 256-invocation workgroup per row, mean then variance of
// (x - mean) (two passes, as the float64 reference does), then y = act((x - mean) / sqrt(var + eps) * scale + bias).
//   MODE 0: LayerNormalization family: scale/bias per element of the normalized row;
//   MODE 1: InstanceNormalization: scale/bias per channel, channel = row % C;
//   MODE 2: GroupNormalization: a row is one group of C / G channels of `inner` elements each (C holds G), scale/bias
//           per channel, channel = (row % G) * (D / inner) + k / inner.
//   RMS 1: no mean (RMSNormalization, onnxruntime's Simplified variants): y = x / sqrt(mean(x^2) + eps) * scale.
//   SKIP 1: the row normalized is x + skip (skip rows repeat every skip_rows rows: a 2-D skip broadcast over the
//           batch) [+ SKIP_BIAS, per element of the row]; SUM_OUT writes that sum (SkipLayerNormalization's 4th output).
//   STATS bit 0 / bit 1: write each row's mean / 1 / sqrt(var + eps) (LayerNormalization's extra outputs).
// Bindings in this order, each present only when its define says so: x, skip, skip_bias, scale, bias, y, mean,
// inv_std, sum.
#include "common.glsl"
#include "act.glsl"
#ifndef MODE
#define MODE 0
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 1
#endif
#ifndef RMS
#define RMS 0
#endif
#ifndef SKIP
#define SKIP 0
#endif
#ifndef SKIP_BIAS
#define SKIP_BIAS 0
#endif
#ifndef SUM_OUT
#define SUM_OUT 0
#endif
#ifndef STATS
#define STATS 0
#endif
#define B_SKIP 1
#define B_SKIPB (B_SKIP + SKIP)
#define B_SCALE (B_SKIPB + SKIP_BIAS)
#define B_BIAS (B_SCALE + 1)
#define B_Y (B_BIAS + HAS_BIAS)
#define B_MEAN (B_Y + 1)
#define B_INV (B_MEAN + (STATS & 1))
#define B_SUM (B_INV + ((STATS >> 1) & 1))
#define WG 256
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
#if SKIP
layout(std430, binding = B_SKIP) readonly buffer K { float sk[]; };
#endif
#if SKIP_BIAS
layout(std430, binding = B_SKIPB) readonly buffer KB { float skb[]; };
#endif
layout(std430, binding = B_SCALE) readonly buffer S { float sc[]; };
#if HAS_BIAS
layout(std430, binding = B_BIAS) readonly buffer B { float bi[]; };
#endif
layout(std430, binding = B_Y) writeonly buffer Y { float y[]; };
#if (STATS & 1) != 0
layout(std430, binding = B_MEAN) writeonly buffer M { float mean_out[]; };
#endif
#if (STATS & 2) != 0
layout(std430, binding = B_INV) writeonly buffer I { float inv_out[]; };
#endif
#if SUM_OUT
layout(std430, binding = B_SUM) writeonly buffer SO { float sum_out[]; };
#endif
layout(push_constant) uniform P { uint rows; uint D; uint C; float eps; float act_a; float act_b; uint inner;
                                  uint skip_rows; } p;

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

// the value normalized: x, or x + skip (+ bias); a pure function of (row, k), so every pass recomputes it
// rather than holding a row that may not fit in shared memory
float xin(uint base, uint row, uint k) {
#if SKIP
    float v = x[base + k] + sk[(row % p.skip_rows) * p.D + k];
#if SKIP_BIAS
    v += skb[k];
#endif
    return v;
#else
    return x[base + k];
#endif
}

void main() {
    uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.rows) return;
    uint l = gl_LocalInvocationID.x;
    uint base = row * p.D;
#if RMS
    float mean = 0.0;
#else
    float s = 0.0;
    for (uint k = l; k < p.D; k += WG) s += xin(base, row, k);
    float mean = wg_sum(s) / float(p.D);
#endif
    float q = 0.0;
    for (uint k = l; k < p.D; k += WG) { float d = xin(base, row, k) - mean; q += d * d; }
    float inv = inversesqrt(wg_sum(q) / float(p.D) + p.eps);
#if STATS != 0
    if (l == 0u) {
#if (STATS & 1) != 0
        mean_out[row] = mean;
#endif
#if (STATS & 2) != 0
        inv_out[row] = inv;
#endif
    }
#endif
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
        float xv = xin(base, row, k);
#if SUM_OUT
        sum_out[base + k] = xv;
#endif
#if MODE == 2
        uint c = (row % p.C) * (p.D / p.inner) + k / p.inner;
#else
        uint c = k;
#endif
        float v = (xv - mean) * inv * sc[c];
#if HAS_BIAS
        v += bi[c];
#endif
        y[base + k] = act(v, p.act_a, p.act_b);
    }
#endif
}
