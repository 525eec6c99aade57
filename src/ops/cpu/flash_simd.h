/* Kernels of the fused attention (src/ops/cpu/flash_simd.c: AVX-512, flash_avx2.c: AVX2 + FMA),
 * one whole head per call, written for its shapes instead of going through the general sgemm:
 *
 *   float *w = ...ct_flash_simd_work(&a, false) floats...;
 *   ct_flash_simd_fwd_head(&a, h, Y, lse, w);
 *
 * Callers check ct_sgemm_kernel_isa() != CT_SGEMM_ISA_NONE (AVX-512, or AVX2 and FMA) first:
 * the kernels of that family run. flash_attention.c keeps the BLAS path for other CPUs. */
#ifndef CT_OPS_CPU_FLASH_SIMD_H
#define CT_OPS_CPU_FLASH_SIMD_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where one tensor's heads lie: row t of head h = b H + j starts at b bs + j hs + t ld floats
 * from its base. [BH, T, D] contiguous is {D, H T D, T D}; q of a packed qkv [B, T, 3C]
 * (ct_flash_attention_qkv) is {3C, T 3C, D}, k and v the same from base + C, + 2C. */
typedef struct {
    int64_t ld, bs, hs;
} ct_flash_layout;

/* one attention call: BH heads of Tq queries [D], Tk keys [D] and values [Dv]; H heads per
 * batch entry. Grouped-query attention: G query heads share one key/value head (query head j
 * of a batch entry reads key/value head j / G of the H / G there; G = 1: one each). The gradients dQ, dK, dV have the layouts of Q, K, V; dO (and Y) has o's;
 * lse and Dr are [BH, Tq] contiguous. */
typedef struct {
    const float *Q, *K, *V;
    int64_t Tq, Tk, D, Dv;
    float scale;
    bool causal, own;
    int64_t H;
    ct_flash_layout q, k, v, o;
    /* bf16 inputs instead (Q, K, V unused; needs `own`): the kernels widen each head's rows
     * into their scratch. y16: Y is bf16, written as ct_k_f32_to_bf16 rounds (forward), and
     * dO is rounded to bf16 (ct_k_round_bf16) as it is read (backward). The bits of the f32
     * kernels on autocast's f32 copies and of its conversions. */
    const uint16_t *Qb, *Kb, *Vb;
    bool y16;
    /* with Qb: the tile products in bf16 on AMX (flash_amx.c), not in f32 on widened values */
    bool amx;
    int64_t G;
} ct_flash_args;

/* offset of query head h's first row in a tensor of layout l (a->k, a->v: the key/value head
 * it reads) */
static inline int64_t ct_flash_head(const ct_flash_args *a, const ct_flash_layout *l, int64_t h) {
    const int64_t j = h % a->H;
    return h / a->H * l->bs + (l == &a->k || l == &a->v ? j / a->G : j) * l->hs;
}

/* floats of per-thread scratch a head needs (forward or backward) */
size_t ct_flash_simd_work(const ct_flash_args *a, bool backward);
/* Head h: its rows of Y (layout a->o; f32, or bf16 where y16) and of lse ([BH, Tq]). */
void ct_flash_simd_fwd_head(const ct_flash_args *a, int64_t h, void *Y, float *lse, float *work);
/* Head h's gradients, added to dq / dk / dv (each may be NULL), or written over them where
 * fresh (their previous contents ignored: no zeroing pass; G = 1 only); Dr = rowsum(dO * O).
 * With G > 1 the heads of one group add to the same dk, dv: one thread runs them in order. */
void ct_flash_simd_bwd_head(const ct_flash_args *a, int64_t h, const float *dO, const float *lse, const float *Dr, float *dq,
                            float *dk, float *dv, bool fresh, float *work);

/* The tile kernels a head's forward and backward run (flash_simd.c drives them), one set per
 * vector width: AVX-512 (flash_simd.c) and AVX2 + FMA (flash_avx2.c). Both sum every element
 * in the same order with the same operations, so both give the same bits. Tiles are
 * BR = 64 query rows by 64 keys; the score tile is kept transposed (St[key][query]).
 *   gemm_s: C[M][N] = sum_k At[k lda + i] B[k ldb + j], C's row stride 64 (a score tile);
 *           causal (lim0, as gemm_t's): a block of rows [i, i + MR) may leave whole vectors of
 *           columns left of lim0 + i as they were (no row of the block sees them; the tile
 *           steps read them only under their masks)
 *   gemm_t: C (+)= P B with P(i, k) = At[k 64 + i] (a transposed tile), rows i seeing k < i + 1 - lim0
 *   gemm_n: C (+)= A B with A(i, k) = At[i 64 + k], k from lim0 + i (a tile's rows as A)
 *   transpose: dst[c ldd + r] = scale src[r lds + c], zeros up to ldd
 *   softmax, grad: ct_flash_softmax_tile_ and ct_flash_grad_tile_ below */
typedef struct {
    void (*gemm_s)(int64_t M, int64_t N, int64_t K, const float *At, int64_t lda, const float *B, int64_t ldb, float *C, int64_t lim0);
    void (*gemm_t)(int64_t M, int64_t N, int64_t K, const float *At, const float *B, int64_t ldb, float *C, int64_t ldc,
                   int64_t lim0, bool acc);
    void (*gemm_n)(int64_t M, int64_t N, int64_t K, const float *A, const float *B, int64_t ldb, float *C, int64_t ldc,
                   int64_t lim0, bool acc);
    void (*transpose)(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t cols, float scale);
    bool (*softmax)(float *St, int64_t cols, int64_t lim0, float *m, float *l, float *al, float ssc);
    void (*grad)(float *St, float *dSt, int64_t cols, int64_t lim0, const float *L, const float *R, float sc, float ssc);
} ct_flash_kernels;
extern const ct_flash_kernels ct_flash_kernels_avx2_;
/* what a tile needs past its last row (A read by whole register blocks of rows) */
enum { CT_FLASH_PAD = 16 * 64 };

/* The AVX-512 tile steps (flash_simd.c), which the AMX kernels (flash_amx.c) share, on a
 * transposed 64 x 64 score tile St[key][query]; ssc: a scale applied to S first (1: none, the
 * bits unchanged). flash_avx2.c has them on 8 lanes. */
bool ct_flash_softmax_tile_(float *St, int64_t cols, int64_t lim0, float *m, float *l, float *al, float ssc);
void ct_flash_grad_tile_(float *St, float *dSt, int64_t cols, int64_t lim0, const float *L, const float *R, float sc, float ssc);

/* The AMX-BF16 kernels (flash_amx.c) for bf16 inputs (Qb) where ct_sgemm_amx_available():
 * the same contract as the two above, tile products in bf16 with f32 sums. */
size_t ct_flash_amx_work(const ct_flash_args *a, bool backward);
void ct_flash_amx_fwd_head(const ct_flash_args *a, int64_t h, void *Y, float *lse, float *work);
/* set: head h's rows of dq, dk, dv are written, not added to (each is written once) */
void ct_flash_amx_bwd_head(const ct_flash_args *a, int64_t h, const float *dO, const float *lse, const float *Dr, float *dq,
                           float *dk, float *dv, bool set, float *work);
#endif
