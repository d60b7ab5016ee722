#version 450
// The input projection of every step of an LSTM/GRU/RNN, both directions at once (the first dispatch of
// daemon/ops/recurrent_vulkan.py): xw[(t*batch + b)*N + n] = bias[n] + sum_k x[t*sx_t + b*sx_b + k] * w[k*N + n],
// w the transposed weights (in, dirs*G*H). One invocation per output element; rows are time-major whatever
// the input layout, so the step shader reads one step's rows contiguously.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer XW { float xw[]; };
layout(push_constant) uniform P { int rows; int K; int N; int batch; int sx_t; int sx_b; } p;

void main() {
    int i = int(gid());
    if (i >= p.rows * p.N) return;
    int r = i / p.N, n = i - r * p.N;
    int t = r / p.batch, b = r - t * p.batch;
    int xi = t * p.sx_t + b * p.sx_b;
    float acc = bias[n];
    for (int k = 0; k < p.K; ++k)
        acc += x[xi + k] * w[k * p.N + n];
    xw[i] = acc;
}
