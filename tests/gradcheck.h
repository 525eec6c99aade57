/* Finite-difference gradient check for ops (central differences in f32).
 *
 *   static ct_tensor *f(ct_ctx *c, ct_tensor **in, void *arg) { return ct_relu(c, in[0]); }
 *   double err = ct_gradcheck(f, NULL, 1, (ct_tensor_spec[]){{2, {3, 5}}}, 1);
 *   CT_EXPECT(err < 1e-2);
 *
 * Inputs are filled with values from a fixed seed (spread away from 0 for kinks like
 * relu when `avoid_zero`), the output is contracted with a fixed random R, and the
 * analytic gradient of sum(R * f(x)) is compared with (L(x+h) - L(x-h)) / 2h per element.
 * Returns the max over elements of |num - ana| / max(1, |num|). */
#ifndef CT_GRADCHECK_H
#define CT_GRADCHECK_H
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ct_test.h" /* CT_EXPECT_OK */
#include "ctrain/ops.h"

typedef struct { int ndim; int64_t shape[CT_MAX_DIMS]; } ct_tensor_spec;
typedef ct_tensor *(*ct_gc_fn)(ct_ctx *c, ct_tensor **in, void *arg);

static inline float ct_gc_rand(uint64_t *s) { /* xorshift, uniform in [-1, 1) */
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static double ct_gc_loss(ct_gc_fn f, void *arg, int nin, float **vals, const ct_tensor_spec *spec, const float *R, int64_t *nout) {
    ct_ctx *c; CT_EXPECT_OK(ct_ctx_create(NULL, &c));
    ct_set_grad_enabled(c, false);
    ct_tensor *in[8];
    for (int i = 0; i < nin; i++) in[i] = ct_from_f32(c, vals[i], spec[i].ndim, spec[i].shape);
    ct_tensor *y = ct_contiguous(c, f(c, in, arg));
    int64_t n = ct_numel(y);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)R[i] * ct_f32(y)[i];
    if (nout) *nout = n;
    ct_ctx_free(c);
    return s;
}

/* h: step; avoid_zero: push inputs away from 0 by 0.1 (for relu/abs-like kinks). */
static double ct_gradcheck_h(ct_gc_fn f, void *arg, int nin, const ct_tensor_spec *spec, bool avoid_zero, double h, uint64_t seed) {
    uint64_t s = seed * 2654435761u + 88172645463325252ull;
    float *vals[8];
    for (int i = 0; i < nin; i++) {
        int64_t n = 1;
        for (int d = 0; d < spec[i].ndim; d++) n *= spec[i].shape[d];
        vals[i] = malloc((size_t)(n ? n : 1) * sizeof(float));
        for (int64_t j = 0; j < n; j++) {
            float v = ct_gc_rand(&s);
            if (avoid_zero) v = v >= 0 ? v + 0.1f : v - 0.1f;
            vals[i][j] = v;
        }
    }
    /* output size from one dry run */
    int64_t nout = 0;
    float dummy_R[1] = {0};
    {
        ct_ctx *c; CT_EXPECT_OK(ct_ctx_create(NULL, &c));
        ct_set_grad_enabled(c, false);
        ct_tensor *in[8];
        for (int i = 0; i < nin; i++) in[i] = ct_from_f32(c, vals[i], spec[i].ndim, spec[i].shape);
        nout = ct_numel(f(c, in, arg));
        ct_ctx_free(c);
    }
    (void)dummy_R;
    float *R = malloc((size_t)(nout ? nout : 1) * sizeof(float));
    for (int64_t j = 0; j < nout; j++) R[j] = ct_gc_rand(&s);
    /* analytic */
    ct_ctx *c; CT_EXPECT_OK(ct_ctx_create(NULL, &c));
    ct_tensor *in[8];
    for (int i = 0; i < nin; i++) {
        in[i] = ct_from_f32(c, vals[i], spec[i].ndim, spec[i].shape);
        ct_requires_grad(in[i]);
    }
    ct_tensor *y = f(c, in, arg);
    ct_tensor *Rt = ct_from_f32(c, R, y->ndim, y->shape);
    ct_backward_seed(c, y, Rt);
    double worst = 0;
    for (int i = 0; i < nin; i++) {
        int64_t n = ct_numel(in[i]);
        for (int64_t j = 0; j < n; j++) {
            float keep = vals[i][j];
            vals[i][j] = keep + (float)h;
            double lp = ct_gc_loss(f, arg, nin, vals, spec, R, NULL);
            vals[i][j] = keep - (float)h;
            double lm = ct_gc_loss(f, arg, nin, vals, spec, R, NULL);
            vals[i][j] = keep;
            double num = (lp - lm) / (2 * h);
            double ana = in[i]->grad ? ct_f32(in[i]->grad)[j] : 0.0;
            double e = fabs(num - ana) / fmax(1.0, fabs(num));
            if (e > worst || e != e) worst = e != e ? INFINITY : e;
        }
    }
    ct_ctx_free(c);
    for (int i = 0; i < nin; i++) free(vals[i]);
    free(R);
    return worst;
}
static inline double ct_gradcheck(ct_gc_fn f, void *arg, int nin, const ct_tensor_spec *spec, bool avoid_zero) {
    return ct_gradcheck_h(f, arg, nin, spec, avoid_zero, 1e-2, 1);
}
#endif
