#version 450
// QuantizeLinear (QOP 0: float32 -> 8-bit, saturate(rint(x / scale) + zp), as onnxruntime) and
// DequantizeLinear (QOP 1: 8-bit -> float32, (q - zp) * scale), per tensor or per axis: the parameter of
// element i is at (i / inner) % channels (channels 1 for one scale). Quantisation writes four outputs per
// invocation as one word.
#include "common.glsl"
#include "q8.glsl"
#ifndef QOP
#define QOP 0
#endif
#ifndef QS
#define QS 1  // the 8-bit side is int8 (1) or uint8 (0)
#endif
layout(local_size_x = 256) in;
#if QOP == 0
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 3) writeonly buffer Y { uint y[]; };
#else
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
#endif
layout(std430, binding = 1) readonly buffer S { float scale[]; };
layout(std430, binding = 2) readonly buffer Z { int zp[]; };
layout(push_constant) uniform P { uint n; uint inner; uint channels; int lo; int hi; } p;

void main() {
    uint g = gid();
#if QOP == 0
    if (4u * g >= p.n) return;
    uint word = 0u;
    for (uint j = 0u; j < 4u; ++j) {
        uint i = 4u * g + j;
        if (i >= p.n) break;
        uint c = (i / p.inner) % p.channels;
        precise float v = x[i] / scale[c];
        v = roundEven(v) + float(zp[c]);
        word = Q8PACK(word, j, int(clamp(v, float(p.lo), float(p.hi))));
    }
    y[g] = word;
#else
    if (g >= p.n) return;
    uint c = (g / p.inner) % p.channels;
    precise float v = float(Q8LD(QS, x, g) - zp[c]) * scale[c];
    y[g] = v;
#endif
}
