#version 450
// Resize over the last two dims with per-axis tap tables computed on the host (nearest: 1 tap,
// linear: 2, cubic: 4): for each output row oh, TAPS source rows and weights, likewise for columns;
// y = sum_a sum_b wh[a] * ww[b] * x[h[a], w[b]]. Table layout (floats): h indices [OH*TAPS],
// h weights [OH*TAPS], w indices [OW*TAPS], w weights [OW*TAPS].
#include "common.glsl"
#ifndef TAPS
#define TAPS 2
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Tab { float tab[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint n; int IH; int IW; int OH; int OW; } p;

void main() {
    uint i = gid();
    if (i >= p.n) return;
    int ow = int(i % uint(p.OW));
    int t = int(i / uint(p.OW));
    int oh = t % p.OH;
    int o = t / p.OH;
    int xb = o * p.IH * p.IW;
    int hw0 = p.OH * TAPS, wi0 = 2 * p.OH * TAPS, ww0 = wi0 + p.OW * TAPS;
    float acc = 0.0;
    for (int a = 0; a < TAPS; ++a) {
        int ih = int(tab[oh * TAPS + a]);
        float wh = tab[hw0 + oh * TAPS + a];
        float row = 0.0;
        for (int b = 0; b < TAPS; ++b) {
            int iw = int(tab[wi0 + ow * TAPS + b]);
            row += tab[ww0 + ow * TAPS + b] * x[xb + ih * p.IW + iw];
        }
        acc += wh * row;
    }
    y[i] = acc;
}
