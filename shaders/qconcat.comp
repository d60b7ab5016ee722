#version 450
// QLinearConcat of up to four 8-bit inputs along one axis: each output byte is its input's byte mapped
// through that input's 256-entry table (requantisation to the output's scale and zero point, computed on the
// host as onnxruntime does it; the identity where an input already has the output's parameters). One
// dispatch writes the whole output, four bytes per invocation, so parts never share a word between dispatches.
#include "common.glsl"
#include "q8.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X0 { uint x0[]; };
layout(std430, binding = 1) readonly buffer X1 { uint x1[]; };
layout(std430, binding = 2) readonly buffer X2 { uint x2[]; };
layout(std430, binding = 3) readonly buffer X3 { uint x3[]; };
layout(std430, binding = 4) readonly buffer T { uint tab[]; };  // [4][256] output byte per input byte
layout(std430, binding = 5) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform P { uint n; uint inner; uint axis; int off[4]; int len[4]; } p;

int byte_at(uint i) {
    uint span = p.axis * p.inner;
    uint o = i / span, r = i % span;
    int a = int(r / p.inner);
    uint q = r % p.inner;
    int k = a < p.off[1] ? 0 : a < p.off[2] ? 1 : a < p.off[3] ? 2 : 3;
    uint src = (o * uint(p.len[k]) + uint(a - p.off[k])) * p.inner + q;
    int b = k == 0 ? q8u(x0[src >> 2u], src) : k == 1 ? q8u(x1[src >> 2u], src)
          : k == 2 ? q8u(x2[src >> 2u], src) : q8u(x3[src >> 2u], src);
    return int(tab[k * 256 + b]);
}

void main() {
    uint wd = gid();
    if (4u * wd >= p.n) return;
    uint word = 0u;
    for (uint j = 0u; j < 4u; ++j) {
        uint i = 4u * wd + j;
        if (i >= p.n) break;
        word = Q8PACK(word, j, byte_at(i));
    }
    y[wd] = word;
}
