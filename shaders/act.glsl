// Fused activations. ACT selects one at compile time (ids as inferd.vulkan.kernel.ACT_IDS);
// its parameters (alpha/min, beta/max) come as push constants act_a/act_b.
#ifndef ACT
#define ACT 0
#endif

// erf with |error| < 2e-7: Taylor series near 0 (avoids cancellation), Abramowitz-Stegun 7.1.26 elsewhere.
float erf_f(float x) {
    float ax = abs(x);
    if (ax < 0.5) {
        float x2 = x * x;
        return x * (1.1283791671 + x2 * (-0.3761263890 + x2 * (0.1128379167 + x2 * (-0.0268661706 + x2 * 0.0052239776))));
    }
    float t = 1.0 / (1.0 + 0.3275911 * ax);
    float y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * exp(-ax * ax);
    return x < 0.0 ? -y : y;
}

// tanh that cannot produce inf/inf on drivers that expand it through exp
float tanh_f(float x) { return tanh(clamp(x, -15.0, 15.0)); }

float sigmoid_f(float x) { return 1.0 / (1.0 + exp(-x)); }

float act(float x, float a, float b) {
#if ACT == 1
    return max(x, 0.0);
#elif ACT == 2
    return x < 0.0 ? x * a : x;
#elif ACT == 3
    return min(max(x, a), b);
#elif ACT == 4
    return sigmoid_f(x);
#elif ACT == 5
    return clamp(a * x + b, 0.0, 1.0);
#elif ACT == 6
    return x * clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0);
#elif ACT == 7
    return tanh_f(x);
#elif ACT == 8
    return x * sigmoid_f(x);
#elif ACT == 9
    return 0.5 * x * (1.0 + erf_f(x * 0.70710678118654752));
#elif ACT == 10
    return 0.5 * x * (1.0 + tanh_f(0.7978845608028654 * (x + 0.044715 * x * x * x)));
#elif ACT == 11
    return max(x, 0.0) + log(1.0 + exp(-abs(x)));
#elif ACT == 12  // onnxruntime's QuickGelu: x * sigmoid(alpha * x)
    return x * sigmoid_f(a * x);
#else
    return x;
#endif
}
