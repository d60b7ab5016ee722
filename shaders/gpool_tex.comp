#version 450
// GlobalAveragePool / GlobalMaxPool for CPU-type devices (lavapipe): one invocation per (n, c) row,
// the row read through an RGBA32F texel view (a gather there; reduce.comp's shared-memory tree costs a
// coroutine switch per barrier and storage-buffer loads are per-lane loops).
#include "common.glsl"
#include "texel.glsl"
#include "act.glsl"
#ifndef OP
#define OP 1
#endif
layout(local_size_x = 64) in;
TBUF(0, X);
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint rows; int R; float act_a; float act_b; } p;

void main() {
    uint i = gid();
    if (i >= p.rows) return;
    int b = int(i) * p.R;
    int e = b + p.R;
#if OP == 1
    float acc = 0.0;
#else
    float acc = -3.402823466e+38;
#endif
    // head up to a texel boundary, whole texels, tail
    int h = min((b + 3) & ~3, e);
    for (int k = b; k < h; ++k) {
        float v = TFETCH(X, k >> 2)[k & 3];
#if OP == 1
        acc += v;
#else
        acc = max(acc, v);
#endif
    }
    int t = max(h, e & ~3);
    for (int k = h; k < t; k += 4) {
        vec4 v = TFETCH(X, k >> 2);
#if OP == 1
        acc += (v.x + v.y) + (v.z + v.w);
#else
        acc = max(acc, max(max(v.x, v.y), max(v.z, v.w)));
#endif
    }
    for (int k = t; k < e; ++k) {
        float v = TFETCH(X, k >> 2)[k & 3];
#if OP == 1
        acc += v;
#else
        acc = max(acc, v);
#endif
    }
#if OP == 1
    acc /= float(p.R);
#endif
    y[i] = act(acc, p.act_a, p.act_b);
}
