#version 450
// y = act(uop(x)) element-wise. UOP selects the unary op (ids in inferd.ops.eltwise_vulkan.UOPS).
#include "common.glsl"
#include "act.glsl"
#ifndef UOP
#define UOP 0
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint n; float alpha; float beta; float act_a; float act_b; } p;

float uop(float v) {
#if UOP == 1
    return erf_f(v);
#elif UOP == 2
    return sqrt(v);
#elif UOP == 3
    return exp(v);
#elif UOP == 4
    return log(v);
#elif UOP == 5
    return -v;
#elif UOP == 6
    return abs(v);
#elif UOP == 7
    return 1.0 / v;
#elif UOP == 8
    return floor(v);
#elif UOP == 9
    return ceil(v);
#elif UOP == 10
    return sin(v);
#elif UOP == 11
    return cos(v);
#elif UOP == 12
    return sign(v);
#elif UOP == 13
    return roundEven(v);
#elif UOP == 14  // Elu
    return v < 0.0 ? p.alpha * (exp(v) - 1.0) : v;
#elif UOP == 15  // Selu
    return v <= 0.0 ? p.beta * (p.alpha * exp(v) - p.alpha) : p.beta * v;
#elif UOP == 16  // Mish
    return v * tanh_f(max(v, 0.0) + log(1.0 + exp(-abs(v))));
#elif UOP == 17  // Softsign
    return v / (1.0 + abs(v));
#elif UOP == 18  // ThresholdedRelu
    return v > p.alpha ? v : 0.0;
#elif UOP == 19
    return tan(v);
#elif UOP == 20
    return atan(v);
#elif UOP == 21  // Celu
    return max(0.0, v) + min(0.0, p.alpha * (exp(v / p.alpha) - 1.0));
#elif UOP == 22
    return sinh(v);
#elif UOP == 23
    return cosh(v);
#elif UOP == 24
    return asin(v);
#elif UOP == 25
    return acos(v);
#elif UOP == 26  // scale (Mean's final division)
    return v * p.alpha;
#else
    return v;
#endif
}

void main() {
    uint i = gid();
    if (i >= p.n) return;
    y[i] = act(uop(x[i]), p.act_a, p.act_b);
}
