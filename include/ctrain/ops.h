/* ctrain/ops.h — differentiable ops. Each computes eagerly into the context's arena and,
 * when grad mode is on and an input requires grad, records a node for backward.
 *
 *   ct_tensor *h = ct_relu(ctx, ct_linear(ctx, x, W1, b1));     // x [B,784], W1 [512,784]
 *   ct_tensor *loss = ct_cross_entropy(ctx, ct_linear(ctx, h, W2, b2), y, -100);
 *
 * Inputs must be contiguous unless an op says otherwise (ct_contiguous makes a copy).
 * Float ops compute in f32. Shape errors abort with the op, file:line and both shapes.
 * All reductions over "the last dim" treat the tensor as [rows, last].
 */
#ifndef CTRAIN_OPS_H
#define CTRAIN_OPS_H

#include "ctrain/autograd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- views (share storage; gradients flow through) ---- */
ct_tensor *ct_reshape(ct_ctx *ctx, ct_tensor *x, int ndim, const int64_t *shape); /* one dim may be -1 */
ct_tensor *ct_flatten(ct_ctx *ctx, ct_tensor *x, int start_dim);                  /* like torch.flatten(x, start_dim) */
ct_tensor *ct_transpose(ct_ctx *ctx, ct_tensor *x, int d0, int d1);               /* non-contiguous view */
ct_tensor *ct_slice(ct_ctx *ctx, ct_tensor *x, int dim, int64_t start, int64_t len); /* view */
ct_tensor *ct_contiguous(ct_ctx *ctx, ct_tensor *x);                              /* x itself if contiguous */

/* ---- linear algebra (transposes are GEMM flags, never copies) ----
 * Every GEMM goes through ctrain's own AVX-512 sgemm (bit-identical for any thread count);
 * OpenBLAS's sgemm is the fallback on CPUs without AVX-512, for tiny products where packing
 * does not pay, and with CTRAIN_GEMM=openblas. */
/* a [M,K] (or [K,M] if ta), b [K,N] (or [N,K] if tb) → [M,N]; 3-D inputs are batched
 * over dim 0 (same batch size). */
ct_tensor *ct_matmul(ct_ctx *ctx, ct_tensor *a, ct_tensor *b, bool ta, bool tb);
/* x [..., in] @ w[out,in]^T + b[out] (b may be NULL) → [..., out] — nn.Linear. */
ct_tensor *ct_linear(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b);

/* ---- elementwise ---- */
/* a + b; b's shape must equal a's or a suffix of it (broadcast over leading dims). */
ct_tensor *ct_add(ct_ctx *ctx, ct_tensor *a, ct_tensor *b);
ct_tensor *ct_mul(ct_ctx *ctx, ct_tensor *a, ct_tensor *b);    /* same shape */
ct_tensor *ct_scale(ct_ctx *ctx, ct_tensor *a, float s);
/* x [N, C, ...] + b[C] broadcast along dim 1 (conv bias). */
ct_tensor *ct_bias_add(ct_ctx *ctx, ct_tensor *x, ct_tensor *b);
ct_tensor *ct_relu(ct_ctx *ctx, ct_tensor *x);
ct_tensor *ct_gelu(ct_ctx *ctx, ct_tensor *x, bool tanh_approx); /* approximate='none' | 'tanh' */
ct_tensor *ct_tanh(ct_ctx *ctx, ct_tensor *x);
ct_tensor *ct_sigmoid(ct_ctx *ctx, ct_tensor *x);
/* Inverted dropout with probability p; identity when not training or p == 0. The mask
 * comes from a counter-based RNG (seed, step, element index): thread-count independent. */
ct_tensor *ct_dropout(ct_ctx *ctx, ct_tensor *x, float p);

/* ---- reductions, normalisation, losses ---- */
ct_tensor *ct_sum(ct_ctx *ctx, ct_tensor *x);   /* all elements → scalar [] */
ct_tensor *ct_mean(ct_ctx *ctx, ct_tensor *x);  /* all elements → scalar [] */
ct_tensor *ct_softmax(ct_ctx *ctx, ct_tensor *x);      /* last dim */
ct_tensor *ct_log_softmax(ct_ctx *ctx, ct_tensor *x);  /* last dim */
/* logits [N, C], target [N] of i32 or i64 class indices; mean over targets != ignore_index
 * (PyTorch: ignore_index=-100). */
ct_tensor *ct_cross_entropy(ct_ctx *ctx, ct_tensor *logits, ct_tensor *target, int64_t ignore_index);
ct_tensor *ct_mse_loss(ct_ctx *ctx, ct_tensor *a, ct_tensor *b); /* mean */
/* x [..., D], w[D], b[D] (either may be NULL) — nn.LayerNorm over the last dim. */
ct_tensor *ct_layer_norm(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b, float eps);

/* ---- embeddings, convolution, pooling ---- */
/* w [V, D], idx [...] of i32/i64 → [..., D]. Out-of-range index aborts with its value. */
ct_tensor *ct_embedding(ct_ctx *ctx, ct_tensor *w, ct_tensor *idx);
/* x [N,C,H,W], w [O,C,kh,kw], b [O] or NULL; im2col + GEMM. */
ct_tensor *ct_conv2d(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b, int stride, int padding);
ct_tensor *ct_max_pool2d(ct_ctx *ctx, ct_tensor *x, int kernel, int stride, int padding);
ct_tensor *ct_avg_pool2d(ct_ctx *ctx, ct_tensor *x, int kernel, int stride, int padding); /* count_include_pad=True */

/* ---- attention ---- */
/* x [B, T, H*D] → [B, H, T, D] (contiguous copy) and back. */
ct_tensor *ct_split_heads(ct_ctx *ctx, ct_tensor *x, int heads);
ct_tensor *ct_merge_heads(ct_ctx *ctx, ct_tensor *x);
/* q, k, v [B, H, T, D] → softmax(q k^T / sqrt(D) (+ causal mask)) v, [B, H, T, D].
 * Plain version: materialises the [T, T] scores per head. */
ct_tensor *ct_attention(ct_ctx *ctx, ct_tensor *q, ct_tensor *k, ct_tensor *v, bool causal);
/* The same result computed by tiles with an online softmax (flash attention), forward and
 * backward: O(T) extra memory (one log-sum-exp per row) instead of the [T, T] matrix; equal
 * to ct_attention within f32 rounding. */
ct_tensor *ct_flash_attention(ct_ctx *ctx, ct_tensor *q, ct_tensor *k, ct_tensor *v, bool causal);

#ifdef __cplusplus
}
#endif
#endif
