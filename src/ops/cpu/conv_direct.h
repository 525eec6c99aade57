/* Direct stride-1 conv2d forward on AVX-512 (conv_direct.c): the forward GEMM of conv.c
 * (Y[o][q] = sum_k W[o][k] col[k][q], K = C*kh*kw) with the register tile turned round —
 * 14 output pixels of one row x 32 output channels — so that the 14 values the kernel
 * broadcasts per k are consecutive input pixels, read in place from a zero-padded copy of
 * the sample: nothing is packed but the weights (once). Every output gets the products of
 * the implicit GEMM in the same order, in the same K blocks (CT_SGEMM_KC), hence the same
 * bits; conv.c uses it exactly where that GEMM would run (needs ct_sgemm_own_available()).
 *
 *   ct_conv_direct_geom g = {C, H, W, O, kh, kw, p, OH, OW};
 *   float *s = ct_ctx_alloc(ctx, ct_conv_direct_scratch(&g, nt, false) * sizeof(float));
 *   ct_conv_direct_prep(&g, w, s);
 *   ct_conv_direct_fw(&g, s, nt, x, b, N, chunk, y);                                  */
#ifndef CT_OPS_CPU_CONV_DIRECT_H
#define CT_OPS_CPU_CONV_DIRECT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int64_t C, H, W, O, kh, kw, p, OH, OW;
} ct_conv_direct_geom;

/* floats of scratch for nthreads threads (packed weights, offsets, padded samples; with
 * epi, room for the planes ct_conv_direct_fw_epi hands its epilogue) */
size_t ct_conv_direct_scratch(const ct_conv_direct_geom *g, int nthreads, bool epi);
/* packs w [O, C, kh, kw] into scratch */
void ct_conv_direct_prep(const ct_conv_direct_geom *g, const float *w, float *scratch);
/* y [nb, O, OH, OW] = conv(x [nb, C, H, W]) + b, on up to nthreads threads. Without a
 * bias, chunk says how conv.c's GEMM path would have grouped the samples: its copy-out
 * adds +0.0f (turning -0 into +0) in groups of more than one sample, and so does this. */
void ct_conv_direct_fw(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *x, const float *b, int64_t nb,
                       int64_t chunk, float *y);
/* The same values, but each (sample j, output channels [c0, c0 + no)) block of planes
 * [no, OH*OW] goes to epi (on the thread that computed it, while in its cache) instead of
 * y (unused): a consumer such as pooling reads the conv output without it ever reaching
 * memory. Scratch from ct_conv_direct_scratch(g, nthreads, true). */
typedef void (*ct_conv_direct_epi)(void *arg, int64_t j, int64_t c0, int no, const float *planes);
void ct_conv_direct_fw_epi(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *x, const float *b, int64_t nb,
                           int64_t chunk, float *y, ct_conv_direct_epi epi, void *epi_arg);

/* The weight gradient, as conv.c's GEMM dW += dY col^T sums it (over the chunk's nb*OH*OW
 * pixels in K blocks of CT_SGEMM_KC, each block's sum added to dW): the same bits. It reads
 * the input channels-last (a padded [nb, Hp, Wp, C] copy), so 32 channels at one kernel
 * offset are one vector, and accumulates into dW laid out [O, kh*kw, C] at the start of
 * scratch (ct_conv_direct_dw_layout converts, before the first and after the last chunk).
 * For C >= 16: fewer channels leave the vectors mostly empty.
 *
 *   float *s = ct_ctx_alloc(ctx, ct_conv_direct_dw_scratch(&g, nbmax) * sizeof(float));
 *   ct_conv_direct_dw_layout(&g, dw, s, true);
 *   for each chunk: ct_conv_direct_dw(&g, s, nt, x + n0 * C*H*W, dy + n0 * O*P, nb);
 *   ct_conv_direct_dw_layout(&g, dw, s, false);                                        */
size_t ct_conv_direct_dw_scratch(const ct_conv_direct_geom *g, int64_t nbmax); /* floats */
void ct_conv_direct_dw_layout(const ct_conv_direct_geom *g, float *dw, float *scratch, bool to_scratch);
void ct_conv_direct_dw(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *x, const float *dy, int64_t nb);

/* The weight gradient for C < 16 (a first layer), with the same bits as the GEMM above: the
 * vectors are 32 output channels of dY (copied channels-last), the broadcast values 14 of
 * the K = C*kh*kw columns of col^T per pixel (packed from a padded sample); dW accumulates
 * as dW^T [O/32][K][32] at the start of scratch. Used as ct_conv_direct_dw is:
 *
 *   float *s = ct_ctx_alloc(ctx, ct_conv_direct_dws_scratch(&g, nbmax, nt) * sizeof(float));
 *   ct_conv_direct_dws_layout(&g, dw, s, true);
 *   for each chunk: ct_conv_direct_dws(&g, s, nt, x + n0 * C*H*W, dy + n0 * O*P, nb);
 *   ct_conv_direct_dws_layout(&g, dw, s, false);                                       */
size_t ct_conv_direct_dws_scratch(const ct_conv_direct_geom *g, int64_t nbmax, int nthreads); /* floats */
void ct_conv_direct_dws_layout(const ct_conv_direct_geom *g, float *dw, float *scratch, bool to_scratch);
void ct_conv_direct_dws(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *x, const float *dy, int64_t nb);
/* The same, with sample j's dY written by fill (dy unused): channel o of pixel p to
 * dst[poff[p] + o], every o in [o0, o1) and p < OH*OW (o0 a multiple of 16; the records
 * hold O rounded up to 32, so whole vectors of 16 may be stored); sums: this call is the
 * one to take any per-sample side results of those channels (once per sample and channel). A producer such as the pooling backward
 * scatters it there without the NCHW gradient ever existing. */
typedef void (*ct_conv_direct_dy_fn)(void *arg, int64_t j, float *dst, const int32_t *poff, int64_t o0, int64_t o1, bool sums);
void ct_conv_direct_dws_fill(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *x, const float *dy, int64_t nb,
                             ct_conv_direct_dy_fn fill, void *fill_arg);

/* The input gradient as conv.c's dcol = W^T dY (one K block: O <= CT_SGEMM_KC) and col2im
 * sum it: each kernel offset's sum over output channels, in order, added to dx offset by
 * offset (only where the offset lands inside the output, as col2im adds), from dx (or +0
 * where fresh): the same bits, without dcol. Per sample, so any chunking is the same.
 *
 *   float *s = ct_ctx_alloc(ctx, ct_conv_direct_dx_scratch(&g, nt) * sizeof(float));
 *   ct_conv_direct_dx_prep(&g, w, s);
 *   ct_conv_direct_dx(&g, s, nt, dy, N, dx, fresh);                                     */
size_t ct_conv_direct_dx_scratch(const ct_conv_direct_geom *g, int nthreads);
void ct_conv_direct_dx_prep(const ct_conv_direct_geom *g, const float *w, float *scratch);
void ct_conv_direct_dx(const ct_conv_direct_geom *g, float *scratch, int nthreads, const float *dy, int64_t nb, float *dx, bool fresh);
#endif
