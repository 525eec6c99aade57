/* ctrain's own SGEMM (src/ops/cpu/sgemm.c; AVX2 family in sgemm_avx2.c): row-major
 *   C = alpha op(A) op(B) + beta C,   op(A) M x K, op(B) K x N, C M x N,
 * lda/ldb/ldc the row strides of A, B, C as stored (cblas_sgemm row-major contract).
 * beta == 0 ignores C's old contents (NaN garbage included). The result does not depend on
 * the thread count: K is never split, each element is summed by one thread in a fixed order. */
#ifndef CT_OPS_CPU_SGEMM_H
#define CT_OPS_CPU_SGEMM_H
#include <stdbool.h>
#include <stdint.h>

#include "ctrain/core.h"

/* true when the CPU (and OS) support AVX-512 F and BW: the AVX-512 family can run (the other
 * AVX-512 kernels of ops/cpu check this too) */
bool ct_sgemm_own_available(void);

/* Which family runs the own GEMMs (ct_sgemm_own, ct_sgemm_bias, ct_sgemm_own_rowsum, the bf16
 * GEMM on its rounded path, and ct_sgemm_dispatch's products): AVX-512 (14 x 32 tiles) where
 * the CPU has it, else AVX2 and FMA (6 x 16 tiles, sgemm_avx2.c), else none (OpenBLAS alone).
 * CTRAIN_GEMM=avx2 takes AVX2 on an AVX-512 CPU. Both families give the same bits.
 * Implicit B and the AMX and vdpbf16ps paths exist in the AVX-512 family only. */
typedef enum { CT_SGEMM_ISA_NONE = 0, CT_SGEMM_ISA_AVX2 = 1, CT_SGEMM_ISA_AVX512 = 2 } ct_sgemm_isa;
ct_sgemm_isa ct_sgemm_kernel_isa(void);
/* tests: the family to use from now on, whatever CTRAIN_GEMM says (it must run on this CPU);
 * CT_SGEMM_ISA_NONE goes back to the CPU's and CTRAIN_GEMM's choice */
void ct_sgemm_set_isa_(ct_sgemm_isa isa);

/* Packing buffers for up to nthreads GEMM threads (registered with core, which calls it from
 * ct_ctx_create and ct_set_num_threads): CT_ERR_NOMEM when they cannot be allocated. */
ct_status ct_kernels_reserve(int nthreads);

/* Always an own kernel (requires ct_sgemm_kernel_isa() != CT_SGEMM_ISA_NONE and a reserved
 * pool, see ct_kernels_reserve); all sizes, K == 0 included. */
void ct_sgemm_own(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* C = A^T B + beta C (A stored K x M, row stride lda) and sum[i] += A(k, i) over k ascending
 * (one chain per i: the bits of a row-order loop, whatever the thread count), summed while A
 * is packed for the product: linear's weight and bias gradients from one read of dY. Same
 * requirements as ct_sgemm_own. */
void ct_sgemm_own_rowsum(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                         float *C, int64_t ldc, float *sum);

/* C = op(A) op(B) + bias (one row of N, added to every row): the bits of ct_sgemm_own with
 * beta 1 on C filled with copies of the bias row, without that fill (the first K block reads
 * the bias row itself). Linear's forward. Same requirements as ct_sgemm_own. */
void ct_sgemm_bias(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                   const float *bias, float *C, int64_t ldc);

/* The same product with A and B rounded to bf16 (to nearest even): products exact, sums in
 * f32 — torch.autocast(bfloat16)'s GEMM. Three paths, each summing in its own fixed order
 * (other bits from one another, the same bits for any thread count):
 *   CT_GEMM_BF16_ROUNDED  operands rounded while packed, the f32 kernel (any AVX-512 CPU)
 *   CT_GEMM_BF16_NATIVE   AVX-512 BF16 vdpbf16ps (ct_sgemm_bf16_native) — measured slower
 *                         than rounded on Intel, faster on AMD Zen 4
 *   CT_GEMM_BF16_AMX      AMX-BF16 tiles (ct_sgemm_amx_available: Intel Sapphire Rapids on)
 * ct_sgemm_bf16 takes ct_sgemm_bf16_path(): CTRAIN_GEMM_BF16=auto (AMX where present, else
 * native where ct_sgemm_bf16_native_preferred(), else rounded), rounded, native or amx,
 * falling back to rounded where the CPU lacks the path.
 * Needs an own family (ct_sgemm_kernel_isa()); on AVX2 only the rounded path exists. */
typedef enum { CT_GEMM_BF16_ROUNDED = 1, CT_GEMM_BF16_NATIVE = 2, CT_GEMM_BF16_AMX = 3 } ct_gemm_bf16_path;
bool ct_sgemm_bf16_native(void);
/* auto's choice without AMX: vdpbf16ps on an AMD CPU that has it (Zen 4 on) */
bool ct_sgemm_bf16_native_preferred(void);
ct_gemm_bf16_path ct_sgemm_bf16_path(void);
bool ct_sgemm_bf16_path_available(ct_gemm_bf16_path path);
/* a given path (ct_sgemm_bf16_path_available), whatever CTRAIN_GEMM_BF16 says */
void ct_sgemm_bf16_on(ct_gemm_bf16_path path, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                      int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
void ct_sgemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                   const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* The same with A and/or B stored as bf16 (uint16_t, a_bf16 / b_bf16; lda, ldb in elements):
 * read as they are, no f32 copy — the same bits as ct_sgemm_bf16 on f32 copies */
void ct_sgemm_bf16_ex(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, bool a_bf16, int64_t lda,
                      const void *B, bool b_bf16, int64_t ldb, float beta, float *C, int64_t ldc);
/* The same product with a bf16 result: C (f32) = alpha op(A) op(B) + beta C as above, but the
 * last K block stores it to Cb (bf16, row stride ldcb) rounded as ct_convert rounds (nearest
 * even, NaN kept) instead of to C — the bits of ct_sgemm_bf16_ex then ct_convert, without
 * the f32 result's pass. C is read for beta != 0 and holds the earlier K blocks' partial sums:
 * its contents afterwards are unspecified. With K <= CT_SGEMM_KC (one block) C is only read,
 * so ldc may be 0 (every row of C one row: linear's bias). */
void ct_sgemm_bf16_out(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, bool a_bf16, int64_t lda,
                       const void *B, bool b_bf16, int64_t ldb, float beta, float *C, int64_t ldc, uint16_t *Cb, int64_t ldcb);

/* Implicit B (convolution without an im2col matrix): C = op(A) B + beta C where B exists
 * only as a packer: pack(arg, dst, n0, n, k0, kc) writes B(k0 + k, n0 + c) to
 * dst[k * CT_SGEMM_NR + c] for k < kc, c < n, and zeros for n <= c < CT_SGEMM_NR. It is
 * called from several threads at once (distinct dst). Same bits as ct_sgemm_own on the
 * explicit B. Needs ct_sgemm_own_available() and the pool; callers ask ct_sgemm_own_takes. */
#define CT_SGEMM_NR 32
#define CT_SGEMM_KC 256 /* kc never exceeds it */
typedef void (*ct_sgemm_pack_b_fn)(const void *arg, float *dst, int64_t n0, int n, int64_t k0, int64_t kc);
void ct_sgemm_implicit_b(bool ta, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, ct_sgemm_pack_b_fn pack,
                         const void *arg, float beta, float *C, int64_t ldc);
/* The same with A (not transposed) stored in segments of seg columns, seg_stride floats
 * apart: A(i, k) = A[(k / seg) * seg_stride + i * lda + k % seg] — a chunk of NCHW samples
 * read as one [O, nb*P] matrix without gathering it. Same bits as on the gathered A. */
void ct_sgemm_implicit_b_seg(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, int64_t seg, int64_t seg_stride,
                             ct_sgemm_pack_b_fn pack, const void *arg, float beta, float *C, int64_t ldc);

/* For packers whose B rows are contiguous in k: dst[k * CT_SGEMM_NR + c] = x[c * rs + k] for
 * c < n (zeros up to CT_SGEMM_NR), k < kc — through in-register transposes. */
void ct_sgemm_pack_rows(float *dst, const float *x, int64_t rs, int n, int64_t kc);

/* true when ct_sgemm_dispatch runs an own kernel (either family) for an M x N x K product (a
 * shape-only rule; false under CTRAIN_GEMM=openblas) */
bool ct_sgemm_kernel_takes(int64_t M, int64_t N, int64_t K);
/* the same, for the AVX-512 family: callers that go on to AVX-512-only entries (implicit B) */
bool ct_sgemm_own_takes(int64_t M, int64_t N, int64_t K);

/* The dispatch policy used by ct_sgemm / ct_sgemm_ld (blas.h): runs an own kernel and
 * returns true, or returns false (caller uses OpenBLAS) when the CPU has neither AVX-512 nor
 * AVX2 and FMA, when CTRAIN_GEMM=openblas is set, or when the product is too small for
 * packing to pay. */
bool ct_sgemm_dispatch(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                       const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
#endif
