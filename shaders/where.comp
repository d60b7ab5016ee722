#version 450
// Where(cond, a, b) with numpy broadcasting over at most 6 collapsed dims; cond is a bool tensor
// read byte-wise out of 32-bit words.
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer C { uint c[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer B { float b[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint n; uint rank; uint dims[6]; uint sc[6]; uint sa[6]; uint sb[6]; } p;

void main() {
    uint i = gid();
    if (i >= p.n) return;
    uint rem = i, ic = 0u, ia = 0u, ib = 0u;
    for (int d = int(p.rank) - 1; d >= 0; --d) {
        uint k = rem % p.dims[d];
        rem /= p.dims[d];
        ic += k * p.sc[d];
        ia += k * p.sa[d];
        ib += k * p.sb[d];
    }
    bool t = ((c[ic >> 2u] >> (8u * (ic & 3u))) & 0xFFu) != 0u;
    y[i] = t ? a[ia] : b[ib];
}
