// Read-only RGBA32F texel-buffer operands of the CPU-type kernels (*_tex.comp). On lavapipe a texel
// fetch or image load compiles to a straight-line gather, where a storage-buffer load is a per-lane loop.
// TEXEL_IMAGE 1: storage texel buffers (imageBuffer + imageLoad); 0: uniform texel buffers (samplerBuffer).
#ifndef TEXEL_IMAGE
#define TEXEL_IMAGE 1
#endif
#if TEXEL_IMAGE
#define TBUF(b, name) layout(rgba32f, binding = b) readonly uniform imageBuffer name
#define TFETCH(name, i) imageLoad(name, i)
#else
#define TBUF(b, name) layout(binding = b) uniform samplerBuffer name
#define TFETCH(name, i) texelFetch(name, i)
#endif
