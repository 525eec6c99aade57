/* AVX-512 kernels of the fused attention (src/ops/cpu/flash_simd.c), one whole head per
 * call, written for its shapes instead of going through the general sgemm:
 *
 *   float *w = ...ct_flash_simd_work(&a, false) floats...;
 *   ct_flash_simd_fwd_head(&a, h, Y, lse, w);
 *
 * Callers check ct_sgemm_own_available() (AVX-512F) first; flash_attention.c keeps the
 * BLAS path for CPUs without it. */
#ifndef CT_OPS_CPU_FLASH_SIMD_H
#define CT_OPS_CPU_FLASH_SIMD_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* one attention call: [BH, Tq, D] queries, [BH, Tk, D] keys, [BH, Tk, Dv] values */
typedef struct {
    const float *Q, *K, *V;
    int64_t Tq, Tk, D, Dv;
    float scale;
    bool causal, own;
} ct_flash_args;

/* floats of per-thread scratch a head needs (forward or backward) */
size_t ct_flash_simd_work(const ct_flash_args *a, bool backward);
/* Head h: its rows of Y ([BH, Tq, Dv]) and of lse ([BH, Tq]). */
void ct_flash_simd_fwd_head(const ct_flash_args *a, int64_t h, float *Y, float *lse, float *work);
/* Head h's gradients, added to dq / dk / dv (each may be NULL); Dr = rowsum(dO * O). */
void ct_flash_simd_bwd_head(const ct_flash_args *a, int64_t h, const float *dO, const float *lse, const float *Dr, float *dq,
                            float *dk, float *dv, float *work);
#endif
