#version 450
// Reductions of x viewed as [outer, R, inner] to [outer, inner].
// ROWS=1 (inner == 1): one 256-invocation workgroup per output with a shared-memory tree (rows of any
// length, e.g. global pooling); ROWS=0: one invocation per output walking R.
// OP: 0 sum, 1 mean, 2 max, 3 min, 4 prod, 5 L1, 6 L2, 7 sum of squares, 8 log-sum, 9 log-sum-exp.
// GAP=1: two runs of reduced axes with kept ones between: x viewed as [outer, R / rb, mid, rb, inner], reduced
// over its second and fourth dims to [outer, mid, inner] (a group norm over NHWC reshaped to [N, H*W, G, C/G]
// reduces axes 1 and 3); the loops then run over outer * mid rows.
#include "common.glsl"
#include "act.glsl"
#ifndef OP
#define OP 0
#endif
#ifndef ROWS
#define ROWS 1
#endif
#ifndef GAP
#define GAP 0
#endif
#define WG 256
layout(local_size_x = WG) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint outer; uint R; uint inner; float act_a; float act_b;
#if GAP
    uint mid; uint rb;
#endif
} p;

#if GAP
#define NROWS (p.outer * p.mid)
#else
#define NROWS p.outer
#endif

// element k (< R) of row ``row`` (< NROWS), in units of ``inner``
uint at(uint row, uint k) {
#if GAP
    uint o = row / p.mid, m = row - o * p.mid;
    uint ra = k / p.rb, rb = k - ra * p.rb;
    return ((o * (p.R / p.rb) + ra) * p.mid + m) * p.rb + rb;
#else
    return row * p.R + k;
#endif
}

// max/min start from -inf/+inf, not the largest finite float: a row that is all -inf (a fully masked
// attention row) must reduce to -inf, as ONNX and numpy give
#if OP == 2
#define INIT uintBitsToFloat(0xff800000u)
#elif OP == 9
#define INIT -3.402823466e+38
#elif OP == 3
#define INIT uintBitsToFloat(0x7f800000u)
#elif OP == 4
#define INIT 1.0
#else
#define INIT 0.0
#endif

float mapv(float v, float m) {
#if OP == 5
    return abs(v);
#elif OP == 6 || OP == 7
    return v * v;
#elif OP == 9
    return exp(v - m);
#else
    return v;
#endif
}

float comb(float a, float b) {
#if OP == 2
    return max(a, b);
#elif OP == 3
    return min(a, b);
#elif OP == 4
    return a * b;
#else
    return a + b;
#endif
}

float finish(float s, float m) {
#if OP == 1
    return s / float(p.R);
#elif OP == 6
    return sqrt(s);
#elif OP == 8
    return log(s);
#elif OP == 9
    return log(s) + m;
#else
    return s;
#endif
}

#if ROWS
shared float red[WG];

// tree reduction of one value per invocation; MAXRED selects max instead of the op's combiner
float wg_reduce(float v, bool use_max) {
    uint l = gl_LocalInvocationID.x;
    red[l] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (l < s) red[l] = use_max ? max(red[l], red[l + s]) : comb(red[l], red[l + s]);
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= NROWS) return;  // uniform per workgroup
    uint l = gl_LocalInvocationID.x;
    float m = 0.0;
#if OP == 9
    float mm = -3.402823466e+38;
    for (uint k = l; k < p.R; k += WG) mm = max(mm, x[at(row, k)]);
    m = wg_reduce(mm, true);
    if (m < -3.0e38) m = 0.0;
#endif
    float acc = INIT;
#if OP == 9
    acc = 0.0;
#endif
    for (uint k = l; k < p.R; k += WG) acc = comb(acc, mapv(x[at(row, k)], m));
    float s = wg_reduce(acc, false);
    if (l == 0u) y[row] = act(finish(s, m), p.act_a, p.act_b);
}
#else
void main() {
    uint i = gid();
    if (i >= NROWS * p.inner) return;
    uint o = i / p.inner, in_ = i - o * p.inner;
    float m = 0.0;
#if OP == 9
    m = -3.402823466e+38;
    for (uint k = 0u; k < p.R; ++k) m = max(m, x[at(o, k) * p.inner + in_]);
    if (m < -3.0e38) m = 0.0;
    float acc = 0.0;
#else
    float acc = INIT;
#endif
    for (uint k = 0u; k < p.R; ++k) acc = comb(acc, mapv(x[at(o, k) * p.inner + in_], m));
    y[i] = act(finish(acc, m), p.act_a, p.act_b);
}
#endif
