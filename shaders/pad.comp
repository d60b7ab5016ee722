#version 450
// Pad (constant / reflect / edge / wrap, MODE 0..3) of the (already cropped, for negative pads)
// input: output coordinate o maps to q = o - pb in the cropped input of size cd; outside [0, cd) the
// mode decides (numpy's np.pad semantics, reflection periodic with period 2*(cd-1)).
#include "common.glsl"
#ifndef MODE
#define MODE 0
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint n; uint rank; int od[6]; int cd[6]; int st[6]; int pb[6]; int base; float value; } p;

void main() {
    uint i = gid();
    if (i >= p.n) return;
    int rem = int(i), si = p.base;
    bool inside = true;
    for (int d = int(p.rank) - 1; d >= 0; --d) {
        int o = rem % p.od[d];
        rem /= p.od[d];
        int q = o - p.pb[d];
        int c = p.cd[d];
        if (q < 0 || q >= c) {
#if MODE == 0
            inside = false;
#elif MODE == 1
            // GLSL leaves % with a negative operand undefined (NVIDIA and lavapipe differ): reflection is
            // symmetric about 0, so fold q to |q| first
            if (c == 1) q = 0;
            else {
                int per = 2 * (c - 1);
                int m = abs(q) % per;
                q = m >= c ? per - m : m;
            }
#elif MODE == 2
            q = clamp(q, 0, c - 1);
#else
            q = q >= 0 ? q % c : c - 1 - (-q - 1) % c;
#endif
        }
        si += q * p.st[d];
    }
    y[i] = inside ? x[si] : p.value;
}
