#version 450
// winograd_out.comp for CPU-type devices (lavapipe): M (rows padded to TP columns, from gemm_tex.comp)
// and the residual are read through RGBA32F texel views (gathers there, unlike storage-buffer loads).
// Y tile = AT m AT^T for each (out channel, tile), plus bias, fused residual and activation; tiles
// overhanging the output edge are clipped. One invocation per (out channel, 4 consecutive tiles), M read
// as whole texels. The residual is a run-time choice.
#include "common.glsl"
#include "texel.glsl"
#include "act.glsl"
#ifndef MO
#define MO 2
#endif
#define A (MO + 2)
layout(local_size_x = 256) in;
TBUF(0, Mw);   // [A*A, K, TP]
layout(std430, binding = 1) readonly buffer ATm { float at[]; };  // [MO, A] row-major
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
TBUF(3, R);   // the residual (bound to anything when has_res is 0)
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) writeonly buffer Y4 { vec4 y4[]; };
// VOUT: OW a multiple of 4 (so every tile row is one aligned vec4 when MO = 4): vec4 stores
#ifndef VOUT
#define VOUT 0
#endif
layout(push_constant) uniform P { uint total; int K; int OH; int OW; int TH; int TW; int T; int TP; int has_res; float act_a; float act_b; } p;

void main() {
    uint i = gid();
    if (i >= p.total) return;             // total = K * TP / 4
    int tq = p.TP / 4;
    int q = int(i % uint(tq));
    int k = int(i / uint(tq));
    int KT4 = p.K * tq;
    // the transform matrix in registers (a storage-buffer load per multiply-add is a per-lane loop on lavapipe)
    float atl[MO * A];
    for (int e = 0; e < MO * A; ++e) atl[e] = at[e];
    vec4 m4[A * A];
    for (int e = 0; e < A * A; ++e) m4[e] = TFETCH(Mw, e * KT4 + k * tq + q);
    float bv = bias[k];
    for (int j = 0; j < 4; ++j) {
        int t = q * 4 + j;
        if (t >= p.T) break;
        int img = t / (p.TH * p.TW);
        int tt = t - img * p.TH * p.TW;
        int th = tt / p.TW, tw = tt - th * p.TW;
        float tmp[MO][A];
        for (int a = 0; a < MO; ++a)
            for (int b = 0; b < A; ++b) {
                float s = 0.0;
                for (int r = 0; r < A; ++r) s += atl[a * A + r] * m4[r * A + b][j];
                tmp[a][b] = s;
            }
        int ybase = (img * p.K + k) * p.OH * p.OW;
#if VOUT && MO == 4
        for (int a = 0; a < MO; ++a) {
            int oh = th * MO + a;
            if (oh >= p.OH) break;
            int oi = ybase + oh * p.OW + tw * MO;
            vec4 s4 = vec4(bv);
            for (int b = 0; b < MO; ++b)
                for (int r = 0; r < A; ++r) s4[b] += tmp[a][r] * atl[b * A + r];
            if (p.has_res != 0) s4 += TFETCH(R, oi >> 2);
            s4.x = act(s4.x, p.act_a, p.act_b); s4.y = act(s4.y, p.act_a, p.act_b);
            s4.z = act(s4.z, p.act_a, p.act_b); s4.w = act(s4.w, p.act_a, p.act_b);
            y4[oi >> 2] = s4;
        }
        continue;
#endif
        for (int a = 0; a < MO; ++a) {
            int oh = th * MO + a;
            if (oh >= p.OH) break;
            for (int b = 0; b < MO; ++b) {
                int ow = tw * MO + b;
                if (ow >= p.OW) break;
                float s = bv;
                for (int r = 0; r < A; ++r) s += tmp[a][r] * atl[b * A + r];
                int oi = ybase + oh * p.OW + ow;
                if (p.has_res != 0) s += TFETCH(R, oi >> 2)[oi & 3];
                y[oi] = act(s, p.act_a, p.act_b);
            }
        }
    }
}
