#version 450
// Gather along one axis with constant indices (normalised to [0, L) on the host):
// x [outer, L, inner], idx [nidx] -> y [outer, nidx, inner].
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer I { int idx[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint n; uint L; uint inner; uint nidx; } p;

void main() {
    uint i = gid();
    if (i >= p.n) return;
    uint in_ = i % p.inner;
    uint t = i / p.inner;
    uint k = t % p.nidx;
    uint o = t / p.nidx;
    y[i] = x[(o * p.L + uint(idx[k])) * p.inner + in_];
}
