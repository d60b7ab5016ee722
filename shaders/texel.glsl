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
// A texel operand that may hold fp16 weights (mode as in common.glsl's WBUF): read through an RGBA16F
// storage texel view, converted to float by the texel unit (no 16-bit storage feature needed).
#define TBUFW(m, b, name) TBUFW_(m, b, name)
#define TBUFW_(m, b, name) TBUFW_##m(b, name)
#define TBUFW_0(b, name) TBUF(b, name)
#define TBUFW_1(b, name) layout(rgba16f, binding = b) readonly uniform imageBuffer name
#define TBUFW_2(b, name) layout(rgba16f, binding = b) readonly uniform imageBuffer name
#define TFETCHW(m, name, i) TFETCHW_(m, name, i)
#define TFETCHW_(m, name, i) TFETCHW_##m(name, i)
#define TFETCHW_0(name, i) TFETCH(name, i)
#define TFETCHW_1(name, i) imageLoad(name, i)
#define TFETCHW_2(name, i) imageLoad(name, i)
