#version 450
// Gather along one axis with constant indices (normalised to [0, L) on the host):
// x [outer, L, inner], idx [nidx] -> y [outer, nidx, inner].
// ELEMENTS=1: GatherElements: y has the indices' shape (dims, at most 6); y[c] = x[c with c[axis] = idx[c]], x read
// through its strides xs; an index is read every istride words (int64 as (low, high) words, int32 constants) and
// may be negative (counted from the end of x's axis, L long).
#include "common.glsl"
#ifndef ELEMENTS
#define ELEMENTS 0
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer I { int idx[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
#if ELEMENTS
layout(push_constant) uniform P { uint n; uint rank; uint axis; uint L; uint istride; uint dims[6]; uint xs[6]; } p;

void main() {
    uint i = gid();
    if (i >= p.n) return;
    int k = idx[i * p.istride];
    // clamped: an index out of range (which the CPU kernel refuses) reads an edge element, never past the binding
    uint src = uint(clamp(k < 0 ? k + int(p.L) : k, 0, int(p.L) - 1)) * p.xs[p.axis];
    uint rem = i;
    for (int d = int(p.rank) - 1; d >= 0; --d) {
        uint c = rem % p.dims[d];
        rem /= p.dims[d];
        if (uint(d) != p.axis) src += c * p.xs[d];
    }
    y[i] = x[src];
}
#else
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
#endif
