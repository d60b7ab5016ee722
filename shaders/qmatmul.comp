#version 450
// QLinearMatMul of A (rows x K, 8-bit, one zero point) by a 2-D B (K x N, 8-bit, zero points per column or
// one), plus an int32 bias per column (QDQ Gemm fused by import), requantised per column as onnxruntime does:
// the plain int32 path, one exact sum per output, four outputs per invocation.
#include "common.glsl"
#include "q8.glsl"
#ifndef AS
#define AS 1
#endif
#ifndef BS
#define BS 1
#endif
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer A { uint a[]; };
layout(std430, binding = 1) readonly buffer B { uint b[]; };
layout(std430, binding = 2) readonly buffer Bz { int bz[]; };     // [N]
layout(std430, binding = 3) readonly buffer Bias { int bias[]; }; // [N]
layout(std430, binding = 4) readonly buffer Mul { float mult[]; }; // [N]
layout(std430, binding = 5) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform P { uint total; uint K; uint N; int za; int zy; int lo; int hi; } p;

int at(uint i) {
    uint row = i / p.N, col = i % p.N;
    int z = bz[col];
    int acc = 0;
    for (uint k = 0u; k < p.K; ++k)
        acc += (Q8LD(AS, a, row * p.K + k) - p.za) * (Q8LD(BS, b, k * p.N + col) - z);
    return q8requant(acc + bias[col], mult[col], p.zy, p.lo, p.hi);
}

void main() {
    uint wd = gid();
    if (4u * wd >= p.total) return;
    uint word = 0u;
    for (uint j = 0u; j < 4u; ++j) {
        uint i = 4u * wd + j;
        if (i >= p.total) break;
        word = Q8PACK(word, j, at(i));
    }
    y[wd] = word;
}
