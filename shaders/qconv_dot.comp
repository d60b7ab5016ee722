#version 450
// QLinearConv as an implicit GEMM with the packed 4x8-bit integer dot product (VK_KHR_shader_integer_dot_product,
// the DP4A-style instruction a GPU may accelerate): qconv_gemm.comp's tiling, but the shared tiles hold the raw
// bytes four K steps to a word, and each OpSDot/OpUDot/OpSUDot (PackedVectorFormat4x8Bit) does four multiply-adds.
// The instructions are declared through GL_EXT_spirv_intrinsics: the glslang of Debian 12 and Ubuntu 22.04 (JetPack
// 6) predates GL_EXT_integer_dot_product. Zero points come out after:
//   sum_k (x - zx)(w - zw) = sum_k x w - zw sum_k x - zx sum_k w + K zx zw,
// with a padded tap read as the zero point zx (so it adds nothing), taps past K read as 0 (their weights are 0),
// sum_k x summed by the same instruction against 0x01010101 and sum_k w (per channel) from the host. Every sum
// is exact in int32 (K * 255 * 255 < 2^31 for K < 33,000). Split-K and the store as in qconv_gemm.comp.
#extension GL_EXT_spirv_intrinsics : require
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
#define BK4 (BK / 4)
layout(local_size_x = 16, local_size_y = 16) in;
layout(constant_id = 0) const int KH = 1;
layout(constant_id = 1) const int KW = 1;
layout(constant_id = 2) const int SH = 1;
layout(constant_id = 3) const int SW = 1;
layout(constant_id = 4) const int DH = 1;
layout(constant_id = 5) const int DW = 1;
layout(std430, binding = 0) readonly buffer X { uint x[]; };
layout(std430, binding = 1) readonly buffer Wt { uint w[]; };       // [G, K4, M] words: 4 K steps of one channel
layout(std430, binding = 2) readonly buffer Wc { int wc[]; };       // [G*M]: K zx zw - zx sum_k w, per channel
layout(std430, binding = 3) readonly buffer Wz { int wz[]; };       // [G*M]
layout(std430, binding = 4) writeonly buffer Part { int part[]; };  // [S, N*G*M*P] int32 sums
layout(push_constant) uniform P {
    int C; int H; int W; int Cg; int M; int OH; int OW; int PT; int PL; int G; int K; int zx; int S; int Kc; int total;
} p;

shared uint As[BK4][BM];
shared uint Bs[BK4][BN];

// SPIR-V opcodes 4450-4452 with capabilities DotProduct (6019) and DotProductInput4x8BitPacked (6018); the last
// operand 0 is PackedVectorFormat4x8Bit: each 32-bit operand holds four 8-bit lanes
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4(uint a, uint b, spirv_literal int fmt);  // both signed
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4451)
uint udot4(uint a, uint b, spirv_literal int fmt);  // both unsigned
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot4(uint a, uint b, spirv_literal int fmt);  // a signed, b unsigned

// w . x by the lanes' signedness, and the sum of x's four lanes (x . 1)
#if WS && XS
#define DOT_WX(w_, x_) sdot4(w_, x_, 0)
#elif WS
#define DOT_WX(w_, x_) sudot4(w_, x_, 0)
#elif XS
#define DOT_WX(w_, x_) sudot4(x_, w_, 0)
#else
#define DOT_WX(w_, x_) int(udot4(w_, x_, 0))
#endif
#if XS
#define SUM_X(x_) sudot4(x_, 0x01010101u, 0)
#else
#define SUM_X(x_) int(udot4(x_, 0x01010101u, 0))
#endif

uint xbyte(int xbase, int k, int pix) {
    if (k >= p.K) return 0u;
    int ci = k / (KH * KW);
    int rr = k - ci * (KH * KW);
    int kh = rr / KW, kw = rr - kh * KW;
    int oh = pix / p.OW, ow = pix - oh * p.OW;
    int ih = oh * SH - p.PT + kh * DH;
    int iw = ow * SW - p.PL + kw * DW;
    if (ih < 0 || ih >= p.H || iw < 0 || iw >= p.W) return uint(p.zx) & 0xFFu;
    uint i = uint(xbase + (ci * p.H + ih) * p.W + iw);
    return (x[i >> 2u] >> ((i & 3u) << 3u)) & 0xFFu;
}

void main() {
    int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
    int tid = ty * 16 + tx;
    int P = p.OH * p.OW;
    int n0 = int(gl_WorkGroupID.x) * BN;
    int m0 = int(gl_WorkGroupID.y) * BM;
    int z = int(gl_WorkGroupID.z);
    int split = z % p.S;
    z /= p.S;
    int kbeg = split * p.Kc, kend = min(p.K, kbeg + p.Kc);  // Kc is a multiple of BK
    int g = z % p.G, img = z / p.G;
    int xbase = (img * p.C + g * p.Cg) * p.H * p.W;
    int k4n = (p.K + 3) / 4;
    int acc[4][4];
    int sx[4];
    for (int i = 0; i < 4; ++i) {
        sx[i] = 0;
        for (int j = 0; j < 4; ++j) acc[i][j] = 0;
    }
    for (int k0 = kbeg; k0 < kend; k0 += BK) {
        {   // A: 4 x 64 words, one per thread
            int kk4 = tid / BM, mm = tid % BM;
            int k4 = k0 / 4 + kk4, m = m0 + mm;
            As[kk4][mm] = (4 * k4 < kend && m < p.M) ? w[(g * k4n + k4) * p.M + m] : 0u;
        }
        {   // B: 4 x 64 words, one per thread, each gathering four taps
            int kk4 = tid / BN, nn = tid % BN;
            int k = k0 + 4 * kk4, pix = n0 + nn;
            uint v = 0u;
            if (k < kend && pix < P) {
                int kl = kend;  // taps of the next split are not this one's
                v = (k < kl ? xbyte(xbase, k, pix) : 0u) | ((k + 1 < kl ? xbyte(xbase, k + 1, pix) : 0u) << 8u)
                  | ((k + 2 < kl ? xbyte(xbase, k + 2, pix) : 0u) << 16u) | ((k + 3 < kl ? xbyte(xbase, k + 3, pix) : 0u) << 24u);
            }
            Bs[kk4][nn] = v;
        }
        barrier();
        for (int kk4 = 0; kk4 < BK4; ++kk4) {
            uint a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = As[kk4][ty + 16 * i];
            for (int j = 0; j < 4; ++j) b[j] = Bs[kk4][tx + 16 * j];
            for (int j = 0; j < 4; ++j) sx[j] += SUM_X(b[j]);
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] += DOT_WX(a[i], b[j]);
        }
        barrier();
    }
    int cout = p.G * p.M;
    for (int i = 0; i < 4; ++i) {
        int m = m0 + ty + 16 * i;
        if (m >= p.M) continue;
        int oc = g * p.M + m;
        // the constant term belongs to one split only (the first), the x-sum term to every split
        int c = split == 0 ? wc[oc] : 0;
        int zw = wz[oc];
        for (int j = 0; j < 4; ++j) {
            int pix = n0 + tx + 16 * j;
            if (pix >= P) continue;
            part[split * p.total + (img * cout + oc) * P + pix] = acc[i][j] - zw * sx[j] + c;
        }
    }
}
