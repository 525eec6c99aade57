/* One GEMM job as sgemm.c's driver hands it to a kernel family's serial algorithm: the AVX-512
 * one (sgemm.c's run) or the AVX2 one (sgemm_avx2.c). Private to those two files.
 *
 *   ct_sgemm_job_ j = {...};          a range of C's rows or columns, with its packing buffers
 *   ct_sgemm_avx2_run_(&j);           C (and Cb / asum) for that range */
#ifndef CT_OPS_CPU_SGEMM_JOB_H
#define CT_OPS_CPU_SGEMM_JOB_H
#include <stdbool.h>
#include <stdint.h>

#include "ops/cpu/sgemm.h"

typedef struct {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const void *A, *B; /* f32, or bf16 where ah / bh (bf16 GEMM only) */
    bool ah, bh;
    float *C;
    uint16_t *Cb; /* ct_sgemm_bf16_out: the last K block stores C rounded to bf16 here (row stride ldcb) */
    int64_t ldcb;
    const float *Ci; /* ct_sgemm_bias: the first K block reads C from here (row stride ldci), not from C */
    int64_t ldci;
    float *pa, *pb;
    int bf16;   /* 0 (f32) or the bf16 path: a ct_gemm_bf16_path */
    ct_sgemm_pack_b_fn packb; /* B from a packer (implicit B), not from memory */
    const void *packb_arg;
    int64_t noff;             /* the packer's column of this job's column 0 */
    int64_t aseg, aseg_stride; /* aseg > 0: A(i, k) = A[(k / aseg) * aseg_stride + i * lda + k % aseg] */
    float *asum; /* ct_sgemm_own_rowsum: asum[i] += op(A)(i, k) for k in order, while A is packed */
} ct_sgemm_job_;

/* The AVX2 + FMA family (sgemm_avx2.c): f32 and bf16-rounded products, Ci, Cb and asum; not
 * implicit B, AMX or vdpbf16ps (their callers need AVX-512). Same bits as sgemm.c's run. */
void ct_sgemm_avx2_run_(const ct_sgemm_job_ *j);
#define CT_SGEMM_AVX2_MR 6
/* the rounded bf16 path's packed values: each of p[0, n) rounded to bf16 in place (nearest
 * even; a NaN stays NaN), as ct_convert rounds (sgemm.c) */
void ct_sgemm_round_bf16_(float *p, int64_t n); /* its micro-tile's rows: the driver splits M in multiples of it */
#endif
