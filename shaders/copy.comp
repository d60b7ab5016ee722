#version 450
// Strided copy: y[dbase + sum c_d * ds_d] = x[sbase + sum c_d * ss_d] over an index space of at most
// 8 dims. Expresses Transpose, Slice (negative steps too), Split, the parts of a Concat, Expand
// (stride 0), Tile (each tiled dim split into (repeat, size) with a 0 stride), and plain copies.
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint n; uint rank; int dims[8]; int ss[8]; int ds[8]; int sbase; int dbase; } p;

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
