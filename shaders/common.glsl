// Shared helpers for every compute shader (included textually by inferd.vulkan.shaders).

// Weights in reduced precision (inferd.planner.precision): a weights buffer declared with WBUF(mode, ...)
// holds fp32 (mode 0), fp16 in 16-bit storage (1: float16_t, needs storageBuffer16BitAccess) or fp16
// pairs packed in a uint (2: unpackHalf2x16, core GLSL, any device); WLD(mode, name, i) reads element i
// as a float, so the arithmetic and the sums stay fp32. WFP selects a conv's weights, AFP/BFP a GEMM's
// A/B operand; texel.glsl's TBUFW does the same for texel operands (an RGBA16F view for modes 1 and 2).
#ifndef WFP
#define WFP 0
#endif
#ifndef AFP
#define AFP 0
#endif
#ifndef BFP
#define BFP 0
#endif
#if WFP == 1 || AFP == 1 || BFP == 1
#extension GL_EXT_shader_16bit_storage : require
#endif
// HARITH 1 (shaderFloat16): the shared-memory GEMM tiles hold fp16 and each K tile's products are summed in
// fp16 (f16vec4 FMAs: two per instruction where the GPU packs them), then added to fp32 accumulators.
#ifndef HARITH
#define HARITH 0
#endif
#if HARITH
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define TILE_T float16_t
#else
#define TILE_T float
#endif
#define WBUF(m, b, B, n) WBUF_(m, b, B, n)
#define WBUF_(m, b, B, n) WBUF_##m(b, B, n)
#define WBUF_0(b, B, n) layout(std430, binding = b) readonly buffer B { float n[]; }
#define WBUF_1(b, B, n) layout(std430, binding = b) readonly buffer B { float16_t n[]; }
#define WBUF_2(b, B, n) layout(std430, binding = b) readonly buffer B { uint n[]; }
#define WLD(m, n, i) WLD_(m, n, i)
#define WLD_(m, n, i) WLD_##m(n, i)
#define WLD_0(n, i) (n[i])
#define WLD_1(n, i) float(n[i])
#define WLD_2(n, i) (unpackHalf2x16(n[(i) >> 1])[(i) & 1])

// Linear invocation id over a grid that may be 2-D when the element count exceeds
// maxComputeWorkGroupCount[0] * local size (see inferd.vulkan.kernel.grid).
//
// GID_BASE offsets a dispatch that covers a slice of a larger grid: inferd.vulkan.kernel.split_rows cuts a
// 2-D grid into 1-D dispatches, because Mesa 22.3's lavapipe runs only part of every workgroup row y >= 1
// (a 640,000-element Relu as 100 x 25 groups left 612,000 outputs unwritten).
layout(constant_id = 1000) const uint GID_BASE = 0u;
uint gid() {
    return GID_BASE + gl_GlobalInvocationID.y * (gl_NumWorkGroups.x * gl_WorkGroupSize.x) + gl_GlobalInvocationID.x;
}
