#version 450
// QLinearAdd (QOP 0) and QLinearMul (QOP 1) of 8-bit tensors with numpy broadcasting over at most 6 collapsed
// dims (strides per input, as binary.comp), in MLAS' form: the scale ratios to the output and the output zero
// point added before rounding, in float32 without fused multiply-adds. Four outputs per invocation.
#include "common.glsl"
#include "q8.glsl"
#ifndef QOP
#define QOP 0
#endif
#ifndef AS
#define AS 1
#endif
#ifndef BS
#define BS 1
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { uint a[]; };
layout(std430, binding = 1) readonly buffer B { uint b[]; };
layout(std430, binding = 2) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform P {
    uint n; uint rank; uint dims[6]; uint sa[6]; uint sb[6];
    int za; int zb; int zc; int lo; int hi; float ra; float rb;
} p;

int at(uint i) {
    uint rem = i, ia = 0u, ib = 0u;
    for (int d = int(p.rank) - 1; d >= 0; --d) {
        uint c = rem % p.dims[d];
        rem /= p.dims[d];
        ia += c * p.sa[d];
        ib += c * p.sb[d];
    }
    precise float fa = float(Q8LD(AS, a, ia) - p.za);
    precise float fb = float(Q8LD(BS, b, ib) - p.zb);
#if QOP == 0
    precise float v = fa * p.ra + fb * p.rb + float(p.zc);
#else
    precise float v = fa * fb * p.ra + float(p.zc);
#endif
    return int(clamp(roundEven(v), float(p.lo), float(p.hi)));
}

void main() {
    uint wd = gid();
    if (4u * wd >= p.n) return;
    uint word = 0u;
    for (uint j = 0u; j < 4u; ++j) {
        uint i = 4u * wd + j;
        if (i >= p.n) break;
        word = Q8PACK(word, j, at(i));
    }
    y[wd] = word;
}
