#version 450
// QLinearMatMul of A (rows x K, 8-bit, one zero point) by a 2-D B (K x N, 8-bit, zero points per column or
// one), plus an int32 bias per column (QDQ Gemm fused by import), requantised per column as onnxruntime does.
// A workgroup per four consecutive outputs (one word of the output) at a time: its 64 threads split K, their int32
// partial sums meet in shared memory, and the first thread requantises and stores the word. A batch-1 linear
// layer (1 x 1280 by 1280 x 1000) is 250 workgroups instead of 250 threads walking K alone.
#include "common.glsl"
#include "q8.glsl"
#ifndef AS
#define AS 1
#endif
#ifndef BS
#define BS 1
#endif
#define T 64
layout(local_size_x = T) in;
layout(std430, binding = 0) readonly buffer A { uint a[]; };
layout(std430, binding = 1) readonly buffer B { uint b[]; };      // B^T: [N, K] bytes, so threads read along K
layout(std430, binding = 2) readonly buffer Bz { int bz[]; };     // [N]
layout(std430, binding = 3) readonly buffer Bias { int bias[]; }; // [N]
layout(std430, binding = 4) readonly buffer Mul { float mult[]; }; // [N]
layout(std430, binding = 5) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform P { uint total; uint K; uint N; int za; int zy; int lo; int hi; } p;

shared int part[4][T];

void main() {
    uint t = gl_LocalInvocationID.x;
    // grid-stride over output words (at most maxComputeWorkGroupCount[0] workgroups, so 1-D on every device)
    for (uint wd = gl_WorkGroupID.x; 4u * wd < p.total; wd += gl_NumWorkGroups.x) {
        for (uint j = 0u; j < 4u; ++j) {
            uint i = 4u * wd + j;
            int s = 0;
            if (i < p.total) {
                uint row = i / p.N, col = i % p.N;
                int z = bz[col];
                for (uint k = t; k < p.K; k += T)
                    s += (Q8LD(AS, a, row * p.K + k) - p.za) * (Q8LD(BS, b, col * p.K + k) - z);
            }
            part[j][t] = s;
        }
        barrier();
        for (uint h = T / 2u; h > 0u; h >>= 1u) {
            if (t < h)
                for (uint j = 0u; j < 4u; ++j) part[j][t] += part[j][t + h];
            barrier();
        }
        if (t == 0u) {
            uint word = 0u;
            for (uint j = 0u; j < 4u; ++j) {
                uint i = 4u * wd + j;
                if (i >= p.total) break;
                uint col = i % p.N;
                word = Q8PACK(word, j, q8requant(part[j][0] + bias[col], mult[col], p.zy, p.lo, p.hi));
            }
            y[wd] = word;
        }
        barrier();  // part is written again by the next word
    }
}
