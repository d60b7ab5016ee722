#version 450
// y = act(x * s[c] + t[c]) with c = (i / inner) % C: standalone BatchNormalization (scale and
// shift precomputed on the host in float64).
#include "common.glsl"
#include "act.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer S { float s[]; };
layout(std430, binding = 2) readonly buffer T { float t[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint n; uint C; uint inner; float act_a; float act_b; } p;

void main() {
    uint i = gid();
    if (i >= p.n) return;
    uint c = (i / p.inner) % p.C;
    y[i] = act(x[i] * s[c] + t[c], p.act_a, p.act_b);
}
