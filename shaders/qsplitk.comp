#version 450
// The store of qconv_gemm.comp: each output's S int32 partial sums (split-K; S may be 1) plus the bias,
// requantised as onnxruntime does (q8.glsl), four consecutive outputs packed into one word of the 8-bit output.
#include "common.glsl"
#include "q8.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Part { int part[]; };   // [S, total]
layout(std430, binding = 1) readonly buffer Bias { int bias[]; };   // [channels]
layout(std430, binding = 2) readonly buffer Mul { float mult[]; };  // [channels]
layout(std430, binding = 3) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform P { uint total; uint S; uint inner; uint channels; int zy; int lo; int hi; } p;

void main() {
    uint wd = gid();
    if (4u * wd >= p.total) return;
    uint word = 0u;
    for (uint j = 0u; j < 4u; ++j) {
        uint i = 4u * wd + j;
        if (i >= p.total) break;
        uint c = (i / p.inner) % p.channels;
        int acc = bias[c];
        for (uint s = 0u; s < p.S; ++s) acc += part[s * p.total + i];
        word = Q8PACK(word, j, q8requant(acc, mult[c], p.zy, p.lo, p.hi));
    }
    y[wd] = word;
}
