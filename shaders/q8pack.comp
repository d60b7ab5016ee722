#version 450
// 8-bit values held one per int32 (already in the output type's range) packed four to a word: the store of
// kernels whose threads do not own four consecutive output bytes (qconv_gemm.comp).
#include "common.glsl"
#include "q8.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Q { int q[]; };
layout(std430, binding = 1) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform P { uint n; } p;

void main() {
    uint wd = gid();
    if (4u * wd >= p.n) return;
    uint word = 0u;
    for (uint j = 0u; j < 4u; ++j) {
        uint i = 4u * wd + j;
        if (i >= p.n) break;
        word = Q8PACK(word, j, q[i]);
    }
    y[wd] = word;
}
