#version 450
// Softmax / LogSoftmax (LOG=1) of x viewed as [outer, L, inner] along L.
// ROWS=1 (inner == 1): one 256-invocation workgroup per row with shared-memory max and sum;
// ROWS=0: one invocation per (outer, inner) column.
// MASKED=1 (attention's softmax): a row whose every logit is -inf (fully masked) gives 0s, as ONNX Attention
// specifies, where plain Softmax gives NaN (0 * 1/0).
#include "common.glsl"
#ifndef LOG
#define LOG 0
#endif
#ifndef MASKED
#define MASKED 0
#endif
#if MASKED
#define INV(s) ((s) > 0.0 ? 1.0 / (s) : 0.0)
#else
#define INV(s) (1.0 / (s))
#endif
#ifndef ROWS
#define ROWS 1
#endif
#define WG 256
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint outer; uint L; uint inner; } p;

#if ROWS
shared float red[WG];

float wg_reduce(float v, bool use_max) {
    uint l = gl_LocalInvocationID.x;
    red[l] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (l < s) red[l] = use_max ? max(red[l], red[l + s]) : red[l] + red[l + s];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.outer) return;
    uint l = gl_LocalInvocationID.x;
    uint base = row * p.L;
    float m = -3.402823466e+38;
    for (uint k = l; k < p.L; k += WG) m = max(m, x[base + k]);
    m = wg_reduce(m, true);
    float s = 0.0;
    for (uint k = l; k < p.L; k += WG) s += exp(x[base + k] - m);
    s = wg_reduce(s, false);
#if LOG
    float ls = log(s);
    for (uint k = l; k < p.L; k += WG) y[base + k] = x[base + k] - m - ls;
#else
    float inv = INV(s);
    for (uint k = l; k < p.L; k += WG) y[base + k] = exp(x[base + k] - m) * inv;
#endif
}
#else
void main() {
    uint i = gid();
    if (i >= p.outer * p.inner) return;
    uint o = i / p.inner, in_ = i - o * p.inner;
    uint base = o * p.L * p.inner + in_;
    float m = -3.402823466e+38;
    for (uint k = 0u; k < p.L; ++k) m = max(m, x[base + k * p.inner]);
    float s = 0.0;
    for (uint k = 0u; k < p.L; ++k) s += exp(x[base + k * p.inner] - m);
#if LOG
    float ls = log(s);
    for (uint k = 0u; k < p.L; ++k) y[base + k * p.inner] = x[base + k * p.inner] - m - ls;
#else
    float inv = INV(s);
    for (uint k = 0u; k < p.L; ++k) y[base + k * p.inner] = exp(x[base + k * p.inner] - m) * inv;
#endif
}
#endif
