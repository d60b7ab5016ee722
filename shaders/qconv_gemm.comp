#version 450
// QLinearConv as an implicit GEMM on the integers (the shape of conv_gemm.comp): per (image, group),
//   acc[m, pix] = sum_k (w[k, m] - w_zp[m]) * (col[k, pix] - x_zp),  k = (ci, kh, kw), pix = (oh, ow),
// col gathered from the 8-bit input (a padded tap is the zero point: it adds nothing). 64x64 output tile per
// 256-thread workgroup, 4x4 per thread, K step 16. The centred operands go to shared memory as floats and each
// K step's 16 products are summed with float FMAs, as conv_gemm.comp does: |(x - zx)(w - zw)| <= 255 * 255, so
// every partial sum of 16 of them is an integer below 2^24, exact in float32; it is added to the int32 sums
// once per K step (the GPU's float FMA rate, not its slower integer multiply-add).
// The K range is split over S workgroups along z where the output has few tiles (split-K, as conv_gemm.comp: a
// 7x7 map with 512 channels is 8 tiles, a few of a big GPU's multiprocessors): each writes its raw int32 sums to
// Part[s][output index], and qsplitk.comp adds the S parts and the bias, requantises and packs four outputs to a
// word (a thread's 4x4 block is not four consecutive bytes of the output, so it cannot store bytes itself).
#include "common.glsl"
#include "q8.glsl"
#ifndef XS
#define XS 1
#endif
#ifndef WS
#define WS 1
#endif
#define BM 64
#define BN 64
#define BK 16
layout(local_size_x = 16, local_size_y = 16) in;
layout(constant_id = 0) const int KH = 1;
layout(constant_id = 1) const int KW = 1;
layout(constant_id = 2) const int SH = 1;
layout(constant_id = 3) const int SW = 1;
layout(constant_id = 4) const int DH = 1;
layout(constant_id = 5) const int DW = 1;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) readonly buffer Wt { uint w[]; };       // [G, K, M] bytes: k-major
layout(std430, binding = 2) readonly buffer Wz { int wz[]; };       // [G*M]
layout(std430, binding = 3) writeonly buffer Part { int part[]; };  // [S, N*G*M*P] int32 sums
layout(push_constant) uniform P {
    int C; int H; int W; int Cg; int M; int OH; int OW; int PT; int PL; int G; int K; int zx; int S; int Kc; int total;
} p;

shared float As[BK][BM];
shared float Bs[BK][BN];

void main() {
    int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
    int tid = ty * 16 + tx;
    int P = p.OH * p.OW;
    int n0 = int(gl_WorkGroupID.x) * BN;
    int m0 = int(gl_WorkGroupID.y) * BM;
    int z = int(gl_WorkGroupID.z);
    int split = z % p.S;
    z /= p.S;
    int kbeg = split * p.Kc, kend = min(p.K, kbeg + p.Kc);
    int g = z % p.G, img = z / p.G;
    int xbase = (img * p.C + g * p.Cg) * p.H * p.W;
    int wbase = g * p.K * p.M;
    int acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0;

    for (int k0 = kbeg; k0 < kend; k0 += BK) {
        for (int r = 0; r < 4; ++r) {
            int e = tid + r * 256;
            int kk = e / BM, mm = e % BM;
            int k = k0 + kk, m = m0 + mm;
            As[kk][mm] = float((k < kend && m < p.M) ? Q8LD(WS, w, uint(wbase + k * p.M + m)) - wz[g * p.M + m] : 0);
        }
        for (int r = 0; r < 4; ++r) {
            int e = tid + r * 256;
            int kk = e / BN, nn = e % BN;
            int k = k0 + kk, pix = n0 + nn;
            int v = 0;
            if (k < kend && pix < P) {
                int ci = k / (KH * KW);
                int rr = k - ci * (KH * KW);
                int kh = rr / KW, kw = rr - kh * KW;
                int oh = pix / p.OW, ow = pix - oh * p.OW;
                int ih = oh * SH - p.PT + kh * DH;
                int iw = ow * SW - p.PL + kw * DW;
                if (ih >= 0 && ih < p.H && iw >= 0 && iw < p.W)
                    v = Q8LD(XS, x, uint(xbase + (ci * p.H + ih) * p.W + iw)) - p.zx;
            }
            Bs[kk][nn] = float(v);
        }
        barrier();
        float sum[4][4];
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) sum[i][j] = 0.0;
        for (int kk = 0; kk < BK; ++kk) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
            for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16 * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) sum[i][j] += a[i] * b[j];
        }
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) acc[i][j] += int(sum[i][j]);
        barrier();
    }
    int cout = p.G * p.M;
    for (int i = 0; i < 4; ++i) {
        int m = m0 + ty + 16 * i;
        if (m >= p.M) continue;
        int oc = g * p.M + m;
        for (int j = 0; j < 4; ++j) {
            int pix = n0 + tx + 16 * j;
            if (pix >= P) continue;
            part[split * p.total + (img * cout + oc) * P + pix] = acc[i][j];
        }
    }
}
