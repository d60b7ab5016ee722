/* A run of bound kernel calls in one C call: the CPU executor's consecutive native layers.
 *
 * Why: a warm run of a small model is mostly short kernels, and each one called from Python costs the calling
 * thread the interpreter's loop and cffi's conversion of 15-28 arguments (keras' MobileNetV2 at 64x64, 55 layers
 * in 0.5 ms on the 2-core VM: 9% of the calling thread's samples were Python and cffi, while the pool's worker
 * spun). Here a step is an entry point (a kind, looked up by name) and its arguments as 64-bit slots, filled once
 * when the layer is bound; the runner unpacks them with that entry point's own prototype, so no function is
 * called through a pointer of another type, and the layers run back to back with the GIL released.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c99 */
#include <string.h>
#include <time.h>

#include "inferd_internal.h"
#include "inferd_native.h"

#define A_P(k) (a[k].p)
#define A_I(k) ((int)a[k].i)
#define A_L(k) (a[k].i)
#define A_F(k) ((float)a[k].f)

/* the blocked convs' common tail: the geometry (8 ints), then bias, res, y, act, p0, p1 */
#define GEO(k) A_I(k), A_I(k + 1), A_I(k + 2), A_I(k + 3), A_I(k + 4), A_I(k + 5), A_I(k + 6), A_I(k + 7)
#define TAIL(k) A_P(k), A_P(k + 1), A_P(k + 2), A_I(k + 3), A_F(k + 4), A_F(k + 5)

static int s_nchwc_conv(const inferd_arg* a)
{
    return inferd_nchwc_conv(A_P(0), A_I(1), A_I(2), A_I(3), A_P(4), A_I(5), GEO(6), TAIL(14));
}

static int s_nchwc_conv_ch(const inferd_arg* a)
{
    return inferd_nchwc_conv_ch(A_P(0), A_I(1), A_I(2), A_I(3), A_P(4), A_I(5), GEO(6), TAIL(14));
}

static int s_nchwc_conv_nchw(const inferd_arg* a)
{
    return inferd_nchwc_conv_nchw(A_P(0), A_I(1), A_I(2), A_I(3), A_P(4), A_I(5), GEO(6), TAIL(14));
}

static int s_nchwc_conv_dilated(const inferd_arg* a)
{
    return inferd_nchwc_conv_dilated(A_P(0), A_I(1), A_I(2), A_I(3), A_P(4), A_I(5), GEO(6), TAIL(14));
}

static int s_nchwc_conv_grouped(const inferd_arg* a)
{
    return inferd_nchwc_conv_grouped(A_P(0), A_I(1), A_I(2), A_I(3), A_P(4), A_I(5), GEO(6), A_I(14), A_I(15),
                                     TAIL(16));
}

static int s_nchwc_dwconv(const inferd_arg* a)
{
    return inferd_nchwc_dwconv(A_P(0), A_I(1), A_I(2), A_I(3), A_P(4), GEO(5), TAIL(13));
}

static int s_nchwc_maxpool(const inferd_arg* a)
{
    return inferd_nchwc_maxpool(A_P(0), A_I(1), A_I(2), A_I(3), GEO(4), A_P(12));
}

static int s_nchwc_reorder(const inferd_arg* a)
{
    return inferd_nchwc_reorder(A_P(0), A_L(1), A_L(2), A_L(3), A_P(4), A_I(5));
}

static int s_nchwc_gap(const inferd_arg* a) { return inferd_nchwc_gap(A_P(0), A_L(1), A_L(2), A_L(3), A_P(4)); }

static int s_nchwc_scale(const inferd_arg* a)
{
    return inferd_nchwc_scale(A_P(0), A_L(1), A_L(2), A_L(3), A_P(4), A_L(5), A_P(6));
}

static int s_nchwc_scale_act(const inferd_arg* a)
{
    return inferd_nchwc_scale_act(A_P(0), A_L(1), A_L(2), A_L(3), A_P(4), A_L(5), A_F(6), A_I(7), A_F(8), A_F(9),
                                  A_P(10));
}

static int s_gemm_ex(const inferd_arg* a)
{
    return inferd_gemm_ex(A_I(0), A_I(1), A_I(2), A_I(3), A_P(4), A_L(5), A_L(6), A_L(7), A_I(8), A_P(9), A_L(10),
                          A_L(11), A_L(12), A_I(13), A_P(14), A_L(15), A_L(16), A_L(17), A_P(18), A_L(19), A_I(20),
                          A_P(21), A_L(22), A_I(23), A_F(24), A_F(25), A_I(26));
}

static int s_strided_copy(const inferd_arg* a)
{
    return inferd_strided_copy(A_P(0), A_P(1), A_I(2), A_P(3), A_P(4), A_I(5));
}

static int s_dwconv2d(const inferd_arg* a)
{
    return inferd_dwconv2d(A_P(0), A_P(1), A_P(2), A_P(3), A_I(4), A_I(5), A_I(6), A_I(7), A_I(8), A_I(9), A_I(10),
                           A_I(11), A_I(12), A_I(13), A_I(14), A_I(15), A_I(16), A_I(17), A_I(18), A_F(19), A_F(20));
}

static int s_dwconv2d_direct(const inferd_arg* a)
{
    return inferd_dwconv2d_direct(A_P(0), A_P(1), A_P(2), A_P(3), A_I(4), A_I(5), A_I(6), A_I(7), A_I(8), A_I(9),
                                  A_I(10), A_I(11), A_I(12), A_I(13), A_F(14), A_F(15));
}

static int s_layernorm(const inferd_arg* a)
{
    inferd_layernorm(A_P(0), A_P(1), A_L(2), A_L(3), A_P(4), A_P(5), A_F(6));
    return 0;
}

static int s_softmax(const inferd_arg* a)
{
    inferd_softmax(A_P(0), A_P(1), A_L(2), A_L(3), A_I(4));
    return 0;
}

static int s_bias_act(const inferd_arg* a)
{
    inferd_bias_act(A_P(0), A_L(1), A_P(2), A_P(3), A_L(4), A_I(5), A_L(6), A_I(7), A_F(8), A_F(9));
    return 0;
}

/* The argument letters spell each prototype: p a pointer, i an int, l a long long, f a float (held as a double).
   Python fills the slots by them (native.py), so a slot of the wrong kind cannot be written. */
static const struct {
    const char* name;
    const char* sig;
    int (*fn)(const inferd_arg*);
} KINDS[] = {
    {"inferd_nchwc_conv", "piiipiiiiiiiiipppiff", s_nchwc_conv},
    {"inferd_nchwc_conv_ch", "piiipiiiiiiiiipppiff", s_nchwc_conv_ch},
    {"inferd_nchwc_conv_nchw", "piiipiiiiiiiiipppiff", s_nchwc_conv_nchw},
    {"inferd_nchwc_conv_dilated", "piiipiiiiiiiiipppiff", s_nchwc_conv_dilated},
    {"inferd_nchwc_conv_grouped", "piiipiiiiiiiiiiipppiff", s_nchwc_conv_grouped},
    {"inferd_nchwc_dwconv", "piiipiiiiiiiipppiff", s_nchwc_dwconv},
    {"inferd_nchwc_maxpool", "piiiiiiiiiiip", s_nchwc_maxpool},
    {"inferd_nchwc_reorder", "plllpi", s_nchwc_reorder},
    {"inferd_nchwc_gap", "plllp", s_nchwc_gap},
    {"inferd_nchwc_scale", "plllplp", s_nchwc_scale},
    {"inferd_nchwc_scale_act", "plllplfiffp", s_nchwc_scale_act},
    {"inferd_gemm_ex", "iiiiplllipllliplllplipliffi", s_gemm_ex},
    {"inferd_strided_copy", "ppippi", s_strided_copy},
    {"inferd_dwconv2d", "ppppiiiiiiiiiiiiiiiff", s_dwconv2d},
    {"inferd_bias_act", "plppliliff", s_bias_act},
    {"inferd_dwconv2d_direct", "ppppiiiiiiiiiiff", s_dwconv2d_direct},
    {"inferd_layernorm", "ppllppf", s_layernorm},
    {"inferd_softmax", "pplli", s_softmax},
};

#define NKINDS ((int)(sizeof KINDS / sizeof KINDS[0]))

int inferd_steps_kind(const char* name, const char** sig)
{
    for (int k = 0; k < NKINDS; ++k)
        if (strcmp(KINDS[k].name, name) == 0) {
            if (sig) *sig = KINDS[k].sig;
            return k;
        }
    return -1;
}

int inferd_steps_run_timed(const inferd_step* s, int n, double* t)
{
    for (int i = 0; i < n; ++i) {
        const int k = s[i].kind;
        /* a step built for another table, or short of its arguments: stop there (the caller runs it itself) */
        if (k < 0 || k >= NKINDS || s[i].nargs != (int)strlen(KINDS[k].sig) || !s[i].a) return i;
        if (KINDS[k].fn(s[i].a) != 0) return i;
        if (t) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            t[i] = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
        }
    }
    return n;
}

int inferd_steps_run(const inferd_step* s, int n) { return inferd_steps_run_timed(s, n, NULL); }
