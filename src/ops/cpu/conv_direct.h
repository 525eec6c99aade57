/* Direct stride-1 conv2d forward on AVX-512 (conv_direct.c): the forward GEMM of conv.c
 * (Y[o][q] = sum_k W[o][k] col[k][q], K = C*kh*kw) with the register tile turned round —
 * 14 output pixels of one row x 32 output channels — so that the 14 values the kernel
 * broadcasts per k are consecutive input pixels, read in place from a zero-padded copy of
 * the sample: nothing is packed but the weights (once). Every output gets the products of
 * the implicit GEMM in the same order, in the same K blocks (CT_SGEMM_KC), hence the same
 * bits; conv.c uses it exactly where that GEMM would run (needs ct_sgemm_own_available()).
 *
 *   ct_conv_direct_geom g = {C, H, W, O, kh, kw, p, OH, OW};
 *   float *s = ct_ctx_alloc(ctx, ct_conv_direct_scratch(&g, nt) * sizeof(float));
 *   ct_conv_direct_prep(&g, w, s);
 *   ct_conv_direct_fw(&g, s, nt, x, b, N, chunk, y);                                  */
#ifndef CT_OPS_CPU_CONV_DIRECT_H
#define CT_OPS_CPU_CONV_DIRECT_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t C, H, W, O, kh, kw, p, OH, OW;
} ct_conv_direct_geom;

/* floats of scratch for nthreads threads (packed weights, offsets, padded samples) */
size_t ct_conv_direct_scratch(const ct_conv_direct_geom *g, int nthreads);
/* packs w [O, C, kh, kw] into scratch */
void ct_conv_direct_prep(const ct_conv_direct_geom *g, const float *w, float *scratch);
/* y [nb, O, OH, OW] = conv(x [nb, C, H, W]) + b, on up to nthreads threads. Without a
 * bias, chunk says how conv.c's GEMM path would have grouped the samples: its copy-out
 * adds +0.0f (turning -0 into +0) in groups of more than one sample, and so does this. */
void ct_conv_direct_fw(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *x, const float *b, int64_t nb,
                       int64_t chunk, float *y);
#endif
