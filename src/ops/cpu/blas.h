/* Row-major sgemm wrapper for the CPU kernels: C = alpha op(A) op(B) + beta C, with the
 * degenerate sizes BLAS rejects or mishandles (K == 0) taken care of. The one place every
 * GEMM goes through: ctrain's own sgemm (ops/cpu/sgemm.c: AVX-512, or AVX2 and FMA) where it
 * applies (not tiny, CTRAIN_GEMM != openblas), OpenBLAS otherwise. */
#ifndef CT_OPS_CPU_BLAS_H
#define CT_OPS_CPU_BLAS_H
#include <cblas.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ops/cpu/sgemm.h"

static inline void ct_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                            const float *B, float beta, float *C) {
    if (M == 0 || N == 0) return;
    if (K == 0 || alpha == 0.0f) {
        if (beta == 0.0f) memset(C, 0, (size_t)(M * N) * sizeof(float));
        else if (beta != 1.0f)
            for (int64_t i = 0; i < M * N; i++) C[i] *= beta;
        return;
    }
    if (ct_sgemm_dispatch(ta, tb, M, N, K, alpha, A, ta ? M : K, B, tb ? K : N, beta, C, N)) return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
                (blasint)K, alpha, A, ta ? (blasint)M : (blasint)K, B, tb ? (blasint)K : (blasint)N, beta, C, (blasint)N);
}

/* Same with explicit leading dimensions (sub-blocks of larger row-major matrices). */
static inline void ct_sgemm_ld(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                               const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0 || alpha == 0.0f) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : C[i * ldc + j] * beta;
        return;
    }
    if (ct_sgemm_dispatch(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
                (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}
#endif
