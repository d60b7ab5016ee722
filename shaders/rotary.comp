#version 450
// RotaryEmbedding (ONNX 23 and com.microsoft): one invocation per element of X, stored 3-D (B, S, N * H) (THREE=1)
// or 4-D (B, N, S, H). Element d < rdim of a head is rotated with its partner (INTERLEAVED: d ^ 1, else d +- rdim/2)
// by the cos/sin row of its position: POS 0, row b * cos_rows_b + s (caches given per position, shared over the batch
// when cos_rows_b is 0); POS 1, row position_ids[b, s] (read every pos_stride words: int64 as (low, high) words, or
// int32); POS 2, row position_ids[0] + s (com.microsoft's one offset). Elements d >= rdim pass through.
#include "common.glsl"
#ifndef INTERLEAVED
#define INTERLEAVED 0
#endif
#ifndef POS
#define POS 0
#endif
#ifndef THREE
#define THREE 0
#endif
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer C { float cs[]; };
layout(std430, binding = 2) readonly buffer Sn { float sn[]; };
#if POS != 0
layout(std430, binding = 3) readonly buffer Pi { int pos[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
#else
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
#endif
layout(push_constant) uniform P { uint n; uint S; uint N; uint H; uint rdim; uint cw; uint cos_rows_b; uint pos_stride; } p;

void main() {
    uint i = gid();
    if (i >= p.n) return;
    uint d = i % p.H;
    uint t = i / p.H;
#if THREE
    uint s = (t / p.N) % p.S, b = t / (p.N * p.S);
#else
    uint s = t % p.S, b = t / (p.S * p.N);
#endif
    if (d >= p.rdim) { y[i] = x[i]; return; }
    uint half_ = p.rdim / 2u;
#if INTERLEAVED
    uint pair = d / 2u;
    bool first = (d & 1u) == 0u;
    uint dp = d ^ 1u;
#else
    bool first = d < half_;
    uint pair = first ? d : d - half_;
    uint dp = first ? d + half_ : d - half_;
#endif
#if POS == 1
    uint row = uint(pos[(b * p.S + s) * p.pos_stride]);
#elif POS == 2
    uint row = uint(pos[0]) + s;
#else
    uint row = b * p.cos_rows_b + s;
#endif
    float c = cs[row * p.cw + pair], sv = sn[row * p.cw + pair];
    float xv = x[i], xp = x[i - d + dp];
    y[i] = first ? c * xv - sv * xp : sv * xp + c * xv;
}
