#version 450
// CumSum of a float tensor viewed as [outer, L, inner] along L: one invocation per (outer, inner) line walks it
// in order (REVERSE: from the end), writing the running sum after (EXCLUSIVE: before) adding each element.
#include "common.glsl"
#ifndef EXCLUSIVE
#define EXCLUSIVE 0
#endif
#ifndef REVERSE
#define REVERSE 0
#endif
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint lines; uint L; uint inner; } p;

void main() {
    uint i = gid();
    if (i >= p.lines) return;
    uint o = i / p.inner;
    uint base = o * p.L * p.inner + (i - o * p.inner);
    float acc = 0.0;
    for (uint t = 0u; t < p.L; ++t) {
#if REVERSE
        uint idx = base + (p.L - 1u - t) * p.inner;
#else
        uint idx = base + t * p.inner;
#endif
        float v = x[idx];
#if EXCLUSIVE
        y[idx] = acc;
        acc += v;
#else
        acc += v;
        y[idx] = acc;
#endif
    }
}
