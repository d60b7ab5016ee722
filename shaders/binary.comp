#version 450
// y = act(a (op) b [+ r]) with numpy broadcasting: the host collapses the output shape to at most
// 6 dims and gives each input's element strides (0 on broadcast dims). RESIDUAL adds a tensor of
// the output's shape after the op (fused residual Add), before the activation.
#include "common.glsl"
#include "act.glsl"
#ifndef BOP
#define BOP 0
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
#if RESIDUAL
layout(std430, binding = 2) readonly buffer R { float r[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
#else
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
#endif
layout(push_constant) uniform P { uint n; uint rank; uint dims[6]; uint sa[6]; uint sb[6]; float act_a; float act_b; } p;

float signed_zero(float s) {  // 0.0 carrying the sign bit of s (a -0.0 literal may be folded to 0.0)
    return uintBitsToFloat(floatBitsToUint(s) & 0x80000000u);
}

float pow_f(float x, float e) {
    if (e == 2.0) return x * x;
    if (e == 1.0) return x;
    if (e == 0.5) return sqrt(x);
    if (e == round(e)) {  // integer exponent: defined for negative bases
        float m = pow(abs(x), e);
        return (x < 0.0 && mod(e, 2.0) == 1.0) ? -m : m;
    }
    return pow(x, e);
}

float bop(float u, float v) {
#if BOP == 0
    return u + v;
#elif BOP == 1
    return u - v;
#elif BOP == 2
    return u * v;
#elif BOP == 3
    return u / v;
#elif BOP == 4
    return pow_f(u, v);
#elif BOP == 5
    return min(u, v);
#elif BOP == 6
    return max(u, v);
#elif BOP == 7  // PRelu: v is the slope
    return u < 0.0 ? u * v : u;
#elif BOP == 8  // Mod with fmod=1 semantics (sign of the dividend)
    return u - v * trunc(u / v);
#elif BOP == 9  // Mod with fmod=0: Python's float % (ONNX 28 spells out its special cases), sign of the divisor
    // a finite dividend over an infinite divisor: itself when the signs agree, else the divisor (u - v * q is NaN)
    if (isinf(v) && !isinf(u) && !isnan(u))
        return u == 0.0 ? signed_zero(v) : ((u < 0.0) == (v < 0.0) ? u : v);
    float r = u - v * trunc(u / v);  // fmod's remainder, then moved into the divisor's sign
    if (r != 0.0 && ((r < 0.0) != (v < 0.0)))
        r += v;
    return r == 0.0 ? signed_zero(v) : r;  // a zero result takes the divisor's sign; inf or 0 divisors give NaN
#else
    return u;
#endif
}

void main() {
    uint i = gid();
    if (i >= p.n) return;
    uint rem = i, ia = 0u, ib = 0u;
    for (int d = int(p.rank) - 1; d >= 0; --d) {
        uint c = rem % p.dims[d];
        rem /= p.dims[d];
        ia += c * p.sa[d];
        ib += c * p.sb[d];
    }
    float v = bop(a[ia], b[ib]);
#if RESIDUAL
    v += r[i];
#endif
    y[i] = act(v, p.act_a, p.act_b);
}
