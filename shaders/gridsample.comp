#version 450
// GridSample of a 4-D input X (N, C, H, W) at grid (N, Ho, Wo, 2) (x then y, normalized to [-1, 1]) into
// Y (N, C, Ho, Wo): one invocation per output pixel computes its taps once and loops over the channels.
// MODE 0 nearest (coordinates rounded half to even, as np.rint), 1 bilinear; PAD 0 zeros, 1 border, 2 reflection;
// ALIGN align_corners. The coordinate handling follows inferd.ops.sampling.sample, the oracle.
#include "common.glsl"
#ifndef MODE
#define MODE 1
#endif
#ifndef PAD
#define PAD 0
#endif
#ifndef ALIGN
#define ALIGN 0
#endif
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint n; uint C; uint H; uint W; uint HWo; } p;

float reflect_c(float v, float lo, float hi) {
    float rng = hi - lo;
    if (rng <= 0.0) return lo;
    if (v >= lo && v <= hi) return v;
    float dx = v < lo ? lo - v : v - hi;
    float k = floor(dx / rng);
    float r = dx - k * rng;
    bool even = mod(k, 2.0) == 0.0;
    if (v < lo) return even ? lo + r : hi - r;
    return even ? hi - r : lo + r;
}

// the pixel coordinate along a dimension of d pixels, padded as PAD says
float coord(float gv, uint du) {
    float d = float(du);
#if ALIGN
    float c = (gv + 1.0) * 0.5 * (d - 1.0);
    float lo = 0.0, hi = d - 1.0;
#else
    float c = ((gv + 1.0) * d - 1.0) * 0.5;
    float lo = -0.5, hi = d - 0.5;
#endif
#if MODE == 0
    c = roundEven(c);
#endif
    if (c < lo || c > hi) {
#if PAD == 1
        c = clamp(c, 0.0, d - 1.0);
#elif PAD == 2
        c = reflect_c(c, lo, hi);
#endif
    }
    return c;
}

// a tap's index along a dimension of d pixels; ok false where zeros padding reads 0
int tap(float t, uint du, inout bool ok) {
    float d = float(du);
#if PAD == 0
    ok = ok && t >= 0.0 && t < d;
#elif PAD == 2
#if ALIGN
    t = trunc(reflect_c(t, 0.0, d - 1.0));
#else
    t = trunc(reflect_c(t, -0.5, d - 0.5));
#endif
#endif
    return int(clamp(t, 0.0, d - 1.0));
}

void main() {
    uint i = gid();
    if (i >= p.n) return;
    uint b = i / p.HWo, o = i - b * p.HWo;
    float cx = coord(g[2u * i], p.W), cy = coord(g[2u * i + 1u], p.H);
#if MODE == 0
    bool ok = true;
    int ix = tap(cx, p.W, ok), iy = tap(cy, p.H, ok);
    uint src = uint(iy) * p.W + uint(ix);
    for (uint c = 0u; c < p.C; ++c) {
        uint plane = b * p.C + c;
        y[plane * p.HWo + o] = ok ? x[plane * p.H * p.W + src] : 0.0;
    }
#else
    float fx = floor(cx), fy = floor(cy);
    float tx = cx - fx, ty = cy - fy;
    // each tap is valid where both its column and its row are (zeros padding)
    bool vx0 = true, vx1 = true, vy0 = true, vy1 = true;
    int x0 = tap(fx, p.W, vx0), x1 = tap(fx + 1.0, p.W, vx1);
    int y0 = tap(fy, p.H, vy0), y1 = tap(fy + 1.0, p.H, vy1);
    float w00 = (vx0 && vy0) ? (1.0 - tx) * (1.0 - ty) : 0.0;
    float w01 = (vx1 && vy0) ? tx * (1.0 - ty) : 0.0;
    float w10 = (vx0 && vy1) ? (1.0 - tx) * ty : 0.0;
    float w11 = (vx1 && vy1) ? tx * ty : 0.0;
    uint s00 = uint(y0) * p.W + uint(x0), s01 = uint(y0) * p.W + uint(x1);
    uint s10 = uint(y1) * p.W + uint(x0), s11 = uint(y1) * p.W + uint(x1);
    for (uint c = 0u; c < p.C; ++c) {
        uint plane = b * p.C + c;
        uint base = plane * p.H * p.W;
        y[plane * p.HWo + o] = w00 * x[base + s00] + w01 * x[base + s01] + w10 * x[base + s10] + w11 * x[base + s11];
    }
#endif
}
