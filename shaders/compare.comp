#version 450
// Equal / Less / Greater / LessOrEqual / GreaterOrEqual (CMP 0..4) with numpy broadcasting (as
// binary.comp) to a bool tensor: each invocation computes four consecutive outputs and stores them
// as the four bytes of one word (no 8-bit storage needed). CMP 5..8 are the logical And / Or / Xor / Not of bool
// tensors (read a byte at a time out of 32-bit words, as where.comp reads its condition; Not binds its input twice).
#include "common.glsl"
#ifndef CMP
#define CMP 0
#endif
#define LOGIC (CMP >= 5)
layout(local_size_x = 256) in;
#if LOGIC
layout(std430, binding = 0) readonly buffer A { uint a[]; };
layout(std430, binding = 1) readonly buffer B { uint b[]; };
bool ld(uint w, uint i) { return ((w >> (8u * (i & 3u))) & 0xFFu) != 0u; }
#define LDA(i) ld(a[(i) >> 2u], (i))
#define LDB(i) ld(b[(i) >> 2u], (i))
#else
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
#define LDA(i) a[i]
#define LDB(i) b[i]
#endif
layout(std430, binding = 2) writeonly buffer Y { uint y[]; };
layout(push_constant) uniform P { uint n; uint rank; uint dims[6]; uint sa[6]; uint sb[6]; } p;

#if LOGIC
bool cmp(bool u, bool v) {
#if CMP == 5
    return u && v;
#elif CMP == 6
    return u || v;
#elif CMP == 7
    return u != v;
#else
    return !u;
#endif
}
#else
bool cmp(float u, float v) {
#if CMP == 0
    return u == v;
#elif CMP == 1
    return u < v;
#elif CMP == 2
    return u > v;
#elif CMP == 3
    return u <= v;
#else
    return u >= v;
#endif
}
#endif

void main() {
    uint w = gid();
    if (4u * w >= p.n) return;
    uint word = 0u;
    for (uint j = 0u; j < 4u; ++j) {
        uint i = 4u * w + j;
        if (i >= p.n) break;
        uint rem = i, ia = 0u, ib = 0u;
        for (int d = int(p.rank) - 1; d >= 0; --d) {
            uint c = rem % p.dims[d];
            rem /= p.dims[d];
            ia += c * p.sa[d];
            ib += c * p.sb[d];
        }
        if (cmp(LDA(ia), LDB(ib))) word |= 1u << (8u * j);
    }
    y[w] = word;
}
