#version 450
// Strided copy: y[dbase + sum c_d * ds_d] = x[sbase + sum c_d * ss_d] over an index space of at most
// 8 dims. Expresses Transpose, Slice (negative steps too), Split, the parts of a Concat, Expand
// (stride 0), Tile (each tiled dim split into (repeat, size) with a 0 stride), and plain copies.
// Q8: 8-bit elements (a quantised model's activations) read out of 32-bit words, each invocation writing four
// consecutive output bytes as one word; the destination is then the whole output in index order (dbase 0,
// contiguous strides: the host checks), so no two invocations write one word.
#include "common.glsl"
#ifndef Q8
#define Q8 0
#endif
layout(local_size_x = 256) in;
#if Q8
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) writeonly buffer Y { uint y[]; };
#else
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
#endif
layout(push_constant) uniform P { uint n; uint rank; int dims[8]; int ss[8]; int ds[8]; int sbase; int dbase; } p;

#if Q8
void main() {
    uint wd = gid();
    if (4u * wd >= p.n) return;
    uint word = 0u;
    for (uint j = 0u; j < 4u; ++j) {
        uint i = 4u * wd + j;
        if (i >= p.n) break;
        int rem = int(i), si = p.sbase;
        for (int d = int(p.rank) - 1; d >= 0; --d) {
            int c = rem % p.dims[d];
            rem /= p.dims[d];
            si += c * p.ss[d];
        }
        uint s = uint(si);
        word |= ((x[s >> 2u] >> ((s & 3u) << 3u)) & 0xFFu) << (8u * j);
    }
    y[wd] = word;
}
#else
void main() {
    uint i = gid();
    if (i >= p.n) return;
    int rem = int(i), si = p.sbase, di = p.dbase;
    for (int d = int(p.rank) - 1; d >= 0; --d) {
        int c = rem % p.dims[d];
        rem /= p.dims[d];
        si += c * p.ss[d];
        di += c * p.ds[d];
    }
    y[di] = x[si];
}
#endif
