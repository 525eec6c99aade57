/* Shared by the kernel tests (tests/unit/test_kmath.c on the CPU, tests/gpu/test_gpu_kernels.c
 * on a GPU): seeded random tensors and the norm-wise error they are judged by. Include after
 * ct_test.h and ctrain/tensor.h; each test file seeds its own stream. */
#ifndef CT_KERNEL_CHECK_H
#define CT_KERNEL_CHECK_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static uint64_t kc_rng = 88172645463325252ull;
/* uniform in [-scale, scale) (xorshift64: the same stream on every machine) */
static inline float urand(float scale) {
    kc_rng ^= kc_rng << 13; kc_rng ^= kc_rng >> 7; kc_rng ^= kc_rng << 17;
    return ((float)((kc_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f) * scale;
}
static inline ct_tensor *rnd(ct_ctx *c, int nd, const int64_t *shape, float scale) {
    ct_tensor *t = ct_new(c, CT_F32, nd, shape);
    for (int64_t i = 0; i < ct_numel(t); i++) ct_f32(t)[i] = urand(scale);
    return t;
}
/* max |a - b| / max |b| (a NaN in a makes it NaN) */
static inline double normwise(const float *a, const float *b, int64_t n) {
    double d = 0, m = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        d = e > d || e != e ? e : d;
        m = fabs(b[i]) > m ? fabs(b[i]) : m;
    }
    return d / m;
}

#ifdef CT_OPS_CPU_SGEMM_H
/* one and two: the same f32 results computed on 1 and 2 threads. The same bits where the own
 * GEMM runs (AVX-512); elsewhere every GEMM is OpenBLAS's, whose threaded sgemm blocks K
 * differently from its one-thread path (Debian's 0.3.21 on AMD Zen 3): there within tol,
 * norm-wise. Include after ops/cpu/sgemm.h. */
static inline void expect_threads_agree(const void *one, const void *two, size_t nbytes, double tol, const char *what) {
    if (ct_sgemm_own_available()) {
        CT_EXPECTF(!memcmp(one, two, nbytes), "%s: 1 and 2 threads differ", what);
        return;
    }
    double e = normwise((const float *)two, (const float *)one, (int64_t)(nbytes / sizeof(float)));
    printf("  no AVX-512: %s on OpenBLAS's threaded GEMM, 1 vs 2 threads normwise %.2e\n", what, e);
    CT_EXPECTF(e <= tol, "%s: 1 and 2 threads normwise %.2e (bound %.0e)", what, e, tol);
}
#endif
#endif
