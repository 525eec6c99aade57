/* int8 GEMM for dynamic quantization (src/ops/cpu/qgemm.c, qgemm_simd.c): activations u8,
 * weights s8, exact int32 accumulation. Private to src/ops (tests and bench include it to
 * pick a kernel).
 *
 * Packed weight layout, shared by every kernel: panels of QG_NP = 16 output columns; in a
 * panel, K in groups of 4: panel[k/4][col][k%4] (64 bytes per group) — the operand layout of
 * vpdpbusd, which AVX2 reads as two vpmaddubsw halves. K is padded to a multiple of 4 and N
 * to a multiple of QG_NB = 32 with zeros. Activation rows have stride kp (K rounded up to
 * 4), padding bytes 0, and the row count is padded to a multiple of QG_MR with zero rows. */
#ifndef CT_OPS_CPU_QGEMM_H
#define CT_OPS_CPU_QGEMM_H
#include <stdbool.h>
#include <stdint.h>

#include "ctrain/ops.h"

#define QG_NP 16 /* columns per panel */
#define QG_NB 32 /* columns per micro-tile (two panels) */
#define QG_MR 6  /* rows per micro-tile */

typedef enum { CT_QK_SCALAR = 0, CT_QK_AVX2, CT_QK_VNNI, CT_QK_COUNT } ct_qkernel;

struct ct_qweight {
    int64_t out, in, kp, np; /* N, K, K rounded up to 4, N rounded up to QG_NB */
    int8_t *q;               /* [out][in], as PyTorch's int_repr() */
    int8_t *packed;          /* np / QG_NP panels of [kp / 4][QG_NP][4] */
    int32_t *colsum;         /* [np]: sum over k of q[n][k] (zero-point correction) */
    float *scales;           /* [nscales] */
    int64_t nscales;         /* 1 (per tensor) or out (per channel) */
};

bool ct_qkernel_available(ct_qkernel k);
ct_qkernel ct_qkernel_best(void);
const char *ct_qkernel_name(ct_qkernel k);

/* C[i][j] (row stride ldc, i < mr, j < QG_NB) = sum_k A[i][k] B[k][j] for mr <= QG_MR rows
 * of A (stride lda, kp columns; rows up to QG_MR must be readable) and the two panels at b
 * (kp * QG_NB bytes). Rows past mr of C may be written or not. Exact for A <= 128 (the AVX2
 * kernel's vpmaddubsw saturates pairs past int16; reduce_range keeps A <= 128). */
typedef void (*ct_qtile_fn)(int64_t kp, const uint8_t *a, int64_t lda, const int8_t *b, int32_t *c, int64_t ldc, int mr);
void ct_qtile_scalar(int64_t kp, const uint8_t *a, int64_t lda, const int8_t *b, int32_t *c, int64_t ldc, int mr);
void ct_qtile_avx2(int64_t kp, const uint8_t *a, int64_t lda, const int8_t *b, int32_t *c, int64_t ldc, int mr);
void ct_qtile_vnni(int64_t kp, const uint8_t *a, int64_t lda, const int8_t *b, int32_t *c, int64_t ldc, int mr);

/* Activation quantization with AVX2 (qgemm_simd.c): min(x, 0), max(x, 0) of n floats; one
 * row quantized as fbgemm's QuantizeAvx2. qgemm.c has the plain C of both. */
void ct_qminmax_avx2(const float *x, int64_t n, float *lo, float *hi);
void ct_qrow_avx2(const float *x, int64_t n, float inv, int32_t zp, uint8_t *q);

/* C [M][w->out] int32 = A (u8, M rows padded as above, stride w->kp) . q^T with kernel k. */
void ct_qgemm_s32(ct_qkernel k, int64_t M, const uint8_t *A, const ct_qweight *w, int32_t *C);

/* The whole dynamic-quantized linear on raw buffers with kernel k: y [M][out] from x [M][in];
 * abuf: ct_qlinear_abuf_bytes(M, w) bytes, 64-byte aligned. */
size_t ct_qlinear_abuf_bytes(int64_t M, const ct_qweight *w);
void ct_qlinear_raw(ct_qkernel k, const float *x, int64_t M, const ct_qweight *w, const float *bias, float *y, uint8_t *abuf);
#endif
