#version 450
// ArgMax / ArgMin (MINIMUM=1) of x viewed as [outer, R, inner] along R, to int64 indices written as
// (low word, 0) pairs (indices are non-negative; no shaderInt64 needed). LAST=1: select_last_index.
#include "common.glsl"
#ifndef MINIMUM
#define MINIMUM 0
#endif
#ifndef LAST
#define LAST 0
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform P { uint outer; uint R; uint inner; } p;

void main() {
    uint i = gid();
    if (i >= p.outer * p.inner) return;
    uint o = i / p.inner, in_ = i - o * p.inner;
    uint base = o * p.R * p.inner + in_;
    float best = x[base];
    uint bi = 0u;
    for (uint k = 1u; k < p.R; ++k) {
        float v = x[base + k * p.inner];
#if MINIMUM
        bool better = LAST == 1 ? v <= best : v < best;
#else
        bool better = LAST == 1 ? v >= best : v > best;
#endif
        if (better) { best = v; bi = k; }
    }
    y[2u * i] = bi;
    y[2u * i + 1u] = 0u;
}
