/* Vectorisable float exp, tanh and normal CDF for the CPU kernels. libm's expf/tanhf/erff
 * are calls gcc cannot vectorise without -ffast-math; these are branch-free (selects only)
 * Cephes-style polynomials, accurate to ~2 ulp, so loops over them vectorise under
 * `omp simd` and stay within f32 rounding of PyTorch (which uses Sleef's vector versions).
 * Horner steps are explicit fmaf: -std=c11 turns off FMA contraction, and a chain of
 * separate mul/add doubles both the work and the latency. */
#ifndef CT_OPS_CPU_VMATH_H
#define CT_OPS_CPU_VMATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float ct_vexpf(float x) {
    float xc = x < -87.33654f ? -87.33654f : x; /* 2^-126: keep the exponent field normal */
    xc = xc > 88.72283f ? 88.72283f : xc;
    /* round to nearest by the 1.5 * 2^23 trick: floorf would be a libm call, not a vector op */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = fmaf(n, -0.693359375f, xc);
    r = fmaf(n, 2.12194440e-4f, r); /* ln2 split in two: n * ln2_hi is exact */
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    float y = p * s;
    y = x < -87.33654f ? 0.0f : y;   /* underflow: 0 (PyTorch gives a denormal below 1e-38) */
    return x > 88.72283f ? INFINITY : y; /* a NaN stays NaN through p without a select */
}

static inline float ct_vtanhf(float x) {
    float a = fabsf(x);
    /* small |x|: odd polynomial (no cancellation); large: 1 - 2/(e^{2|x|} + 1) */
    float z = x * x;
    float q = fmaf(-5.70498872745e-3f, z, 2.06390887954e-2f);
    q = fmaf(q, z, -5.37397155531e-2f);
    q = fmaf(q, z, 1.33314422036e-1f);
    q = fmaf(q, z, -3.33332819422e-1f);
    float small = fmaf(q * z, x, x);
    float big = 1.0f - 2.0f / (ct_vexpf(2.0f * a) + 1.0f);
    big = x < 0 ? -big : big;
    return a < 0.625f ? small : big;
}

/* Standard normal CDF Phi(x) = 0.5 erfc(-x / sqrt 2), via the Numerical Recipes erfc
 * (fractional error < 1.2e-7 everywhere): the left tail keeps its relative accuracy, which
 * 1 + erf(x) computed from an erf would lose. Exact gelu is x * Phi(x). */
static inline float ct_vnormcdf(float x) {
    float z = fabsf(x) * 0.70710678118654752f;
    float t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = fmaf(p, t, -0.82215223f);
    p = fmaf(p, t, 1.48851587f);
    p = fmaf(p, t, -1.13520398f);
    p = fmaf(p, t, 0.27886807f);
    p = fmaf(p, t, -0.18628806f);
    p = fmaf(p, t, 0.09678418f);
    p = fmaf(p, t, 0.37409196f);
    p = fmaf(p, t, 1.00002368f);
    p = fmaf(p, t, -1.26551223f);
    float e = 0.5f * t * ct_vexpf(fmaf(-z, z, p)); /* 0.5 erfc(|x| / sqrt 2) */
    return x >= 0.0f ? 1.0f - e : e;
}

/* y[j] = exp(x[j] - m); returns the sum of y. y may be x (in place). */
static inline float ct_vexp_sub_sum(float *y, const float *x, float m, int64_t n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) {
        y[j] = ct_vexpf(x[j] - m);
        s += y[j];
    }
    return s;
}
/* sum_j exp(x[j] - m) without storing. */
static inline float ct_vexp_sum(const float *restrict x, float m, int64_t n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) s += ct_vexpf(x[j] - m);
    return s;
}
#endif
