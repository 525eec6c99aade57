/* AVX-512 exact GELU (gelu_simd.c): the bits of ct_k_gelu / ct_k_gelu_bwd, faster. Call only
 * where ct_sgemm_own_available() (AVX-512 F and BW):
 *
 *   if (ct_sgemm_own_available()) ct_gelu_simd(x, y, n);            y = x Phi(x)
 *   ct_gelu_bwd_simd(x, g, gx, n, fresh);     gx (+)= g GELU'(x); fresh: gx = +0 + ...
 *
 * and 8-lane loops for CPUs with AVX2 and FMA but no AVX-512, each where
 * ct_gelu_avx2_available(): GELU, SiLU, and softmax's exponentials (through vmath.h):
 *
 *   ct_silu_avx2(x, y, n);                      y = x sigmoid(x), ct_silu's bits
 *   float s = ct_vexp_sub_sum_avx2(p, p, m, n); p = exp(p - m), s their sum */
#ifndef CT_OPS_CPU_GELU_SIMD_H
#define CT_OPS_CPU_GELU_SIMD_H
#include <stdbool.h>
#include <stdint.h>

void ct_gelu_simd(const float *restrict X, float *restrict Y, int64_t n);
void ct_gelu_bwd_simd(const float *restrict X, const float *restrict g, float *restrict gx, int64_t n, bool fresh);
/* The same on 8 lanes, the same bits, where ct_gelu_avx2_available() (AVX2 and FMA): the path
 * of CPUs without AVX-512 */
bool ct_gelu_avx2_available(void);
void ct_gelu_avx2(const float *restrict X, float *restrict Y, int64_t n);
void ct_gelu_bwd_avx2(const float *restrict X, const float *restrict g, float *restrict gx, int64_t n, bool fresh);
/* SiLU on 8 lanes, the bits of ct_silu's loops (x ct_k_sigmoid(x); gx += its gradient), where
 * ct_gelu_avx2_available() */
void ct_silu_avx2(const float *restrict X, float *restrict Y, int64_t n);
void ct_silu_bwd_avx2(const float *restrict X, const float *restrict g, float *restrict gx, int64_t n);
/* ct_vexp_sub_sum's loop on 8 lanes (vmath.h takes it on CPUs without AVX-512): the same
 * exponentials, the sum made of 8 partial sums; y may be x */
float ct_vexp_sub_sum_avx2(float *y, const float *x, float m, int64_t n);
void ct_vexp_sub_avx2(float *y, const float *x, float m, int64_t n); /* the same without the sum */
/* the sum alone, nothing stored (ct_vexp_sum's loop: cross-entropy's log-sum-exp) */
float ct_vexp_sum_avx2(const float *x, float m, int64_t n);
#endif
