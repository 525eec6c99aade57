/* ctrain/ops.h — differentiable ops. Each computes eagerly into the context's arena and,
 * when grad mode is on and an input requires grad, records a node for backward.
 *
 *   ct_tensor *h = ct_relu(ctx, ct_linear(ctx, x, W1, b1));     // x [B,784], W1 [512,784]
 *   ct_tensor *loss = ct_cross_entropy(ctx, ct_linear(ctx, h, W2, b2), y, -100);
 *
 * Inputs must be contiguous unless an op says otherwise (ct_contiguous makes a copy).
 * Float ops compute in f32; bf16/f16 tensors (ct_cast, or autocast regions: autograd.h)
 * are accepted by the differentiable ops and computed on in f32 per element, the result
 * rounded to nearest even. Shape errors abort with the op, file:line and both shapes.
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
/* x [R, ...] followed by `rows` rows of zeros: [R + rows, ...] (F.pad on the first dim); its
 * gradient is the first R rows of the output's. A GPU's LM head pads its vocabulary with it. */
ct_tensor *ct_pad_rows(ct_ctx *ctx, ct_tensor *x, int64_t rows);
/* x converted to dt (f32, bf16, f16; x itself when already dt), rounding to nearest even;
 * the gradient flows back converted to x's precision (f32 buffers, see autograd.h). */
ct_tensor *ct_cast(ct_ctx *ctx, ct_tensor *x, ct_dtype dt);

/* ---- linear algebra (transposes are GEMM flags, never copies) ----
 * Every GEMM goes through ctrain's own AVX-512 sgemm (bit-identical for any thread count);
 * OpenBLAS's sgemm is the fallback on CPUs without AVX-512, for tiny products where packing
 * does not pay, and with CTRAIN_GEMM=openblas. */
/* a [M,K] (or [K,M] if ta), b [K,N] (or [N,K] if tb) → [M,N]; 3-D inputs are batched
 * over dim 0 (same batch size). */
ct_tensor *ct_matmul(ct_ctx *ctx, ct_tensor *a, ct_tensor *b, bool ta, bool tb);
/* x [..., in] @ w[out,in]^T + b[out] (b may be NULL) → [..., out] — nn.Linear. */
ct_tensor *ct_linear(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b);
/* The same node (gradients alike) with the output left at 0 instead of computed: for values
 * nobody reads, e.g. the last projection of a segment being recomputed
 * (ct_checkpoint_recomputing) that reaches the result only through dropout and adds. */
ct_tensor *ct_linear_unevaluated(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b);

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
ct_tensor *ct_silu(ct_ctx *ctx, ct_tensor *x); /* x * sigmoid(x) (nn.SiLU) */
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
/* The same for an input of an op that autocast runs in low precision (a linear): under
 * autocast on a device, an f32 x gives y in autocast's bf16/f16, rounded to nearest even as
 * stored: the bits of the cast autocast would make of ct_layer_norm's f32 y, without that f32
 * tensor (its memory and passes), and y's gradient comes back in that dtype. Elsewhere (the
 * CPU, no autocast) it is ct_layer_norm. */
ct_tensor *ct_layer_norm_lowp(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b, float eps);
/* x [..., D], w [D] or NULL: x * rsqrt(mean(x^2) + eps) * w over the last dim, in f32
 * (Hugging Face's LlamaRMSNorm). */
ct_tensor *ct_rms_norm(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, float eps);
/* The same for an input of low-precision ops, as ct_layer_norm_lowp (a Llama's norms) */
ct_tensor *ct_rms_norm_lowp(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, float eps);

/* ---- embeddings, convolution, pooling ---- */
/* w [V, D], idx [...] of i32/i64 → [..., D]. Out-of-range index aborts with its value. */
ct_tensor *ct_embedding(ct_ctx *ctx, ct_tensor *w, ct_tensor *idx);
/* x [N,C,H,W], w [O,C,kh,kw], b [O] or NULL; im2col + GEMM. */
ct_tensor *ct_conv2d(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b, int stride, int padding);
ct_tensor *ct_max_pool2d(ct_ctx *ctx, ct_tensor *x, int kernel, int stride, int padding);
/* max_pool2d(relu(x)) in one pass, the same bits as the two ops (conv -> ReLU -> pool blocks) */
ct_tensor *ct_relu_max_pool2d(ct_ctx *ctx, ct_tensor *x, int kernel, int stride, int padding);
/* relu_max_pool2d(conv2d(x, w, b)) with the same bits and gradients as the two ops; on the
 * CPU's direct conv path (AVX-512, stride 1) the conv output is pooled while in cache and
 * never stored (it stays unmaterialised: a tensor without data). Elsewhere (a device,
 * autocast, other shapes) it is the two ops. */
ct_tensor *ct_conv2d_relu_max_pool2d(ct_ctx *ctx, ct_tensor *x, ct_tensor *w, ct_tensor *b, int stride, int padding, int kernel,
                                     int pool_stride, int pool_padding);
ct_tensor *ct_avg_pool2d(ct_ctx *ctx, ct_tensor *x, int kernel, int stride, int padding); /* count_include_pad=True */

/* ---- attention ---- */
/* x [B, T, H*D] → [B, H, T, D] (contiguous copy) and back. */
ct_tensor *ct_split_heads(ct_ctx *ctx, ct_tensor *x, int heads);
ct_tensor *ct_merge_heads(ct_ctx *ctx, ct_tensor *x);
/* Rotary position embedding on x [..., T, D] (D even; [B, H, T, D] as split_heads gives),
 * Hugging Face's rotate_half convention: with h = D/2, f_i = pos * theta^(-2i/D) and
 * angle a_j = f_(j mod h), y = x * cos(a) + rotate_half(x) * sin(a), rotate_half(x) =
 * cat(-x[h:], x[:h]). pos [T] of i32/i64 (NULL: 0 .. T-1). Backward: the inverse rotation. */
ct_tensor *ct_rope(ct_ctx *ctx, ct_tensor *x, ct_tensor *pos, float theta);
/* Llama 3.1's frequency scaling (transformers' rope_scaling {"rope_type": "llama3"}): each
 * inverse frequency f with wavelength w = 2 pi / f above original_max_position_embeddings /
 * low_freq_factor is divided by factor, one below original / high_freq_factor kept, those
 * between blended ((1 - s) f / factor + s f, s = (original / w - low) / (high - low)), in f32
 * as transformers computes inv_freq. factor 0: none (ct_rope). */
typedef struct {
    float factor, low_freq_factor, high_freq_factor;
    int original_max_position_embeddings;
} ct_rope_scaling;
ct_tensor *ct_rope_scaled(ct_ctx *ctx, ct_tensor *x, ct_tensor *pos, float theta, const ct_rope_scaling *s);
/* x [B, Hkv, T, D] → [B, Hkv * n_rep, T, D], each head repeated n_rep times in a row
 * (Hugging Face's repeat_kv, for grouped-query attention; a copy). Backward sums each
 * group's gradients into its head. */
ct_tensor *ct_repeat_kv(ct_ctx *ctx, ct_tensor *x, int n_rep);
/* q, k, v [B, H, T, D] → softmax(q k^T / sqrt(D) (+ causal mask)) v, [B, H, T, D].
 * Plain version: materialises the [T, T] scores per head. */
ct_tensor *ct_attention(ct_ctx *ctx, ct_tensor *q, ct_tensor *k, ct_tensor *v, bool causal);
/* The same on a packed qkv [B, T, 3C] (a c_attn projection's output: q, k, v side by side,
 * each C = n_head * D wide) → y [B, T, C], the heads side by side as merge_heads lays them:
 * the bits of splitting qkv into heads, ct_attention and ct_merge_heads (forward and qkv's
 * gradient), without the copies. f32 on the CPU (under autocast: on autocast's f32 copy, as
 * ct_attention); on a device: a status saying there is no kernel. */
ct_tensor *ct_attention_qkv(ct_ctx *ctx, ct_tensor *qkv, int n_head, bool causal);
/* The same result computed by tiles with an online softmax (flash attention), forward and
 * backward: O(T) extra memory (one log-sum-exp per row) instead of the [T, T] matrix; equal
 * to ct_attention within f32 rounding. Grouped-query attention on the CPU: k, v may be
 * [B, KV, Tk, D] with KV dividing H, query head j reading key/value head j / (H / KV) where
 * it lies (SDPA's enable_gqa; no repeat_kv copy), their gradients the sums over each group;
 * the same y and dq bits as on repeat_kv's copies. On a device q, k, v have one shape. */
ct_tensor *ct_flash_attention(ct_ctx *ctx, ct_tensor *q, ct_tensor *k, ct_tensor *v, bool causal);
/* The same on a packed qkv [B, T, 3C] (a c_attn projection's output: q, k, v side by side,
 * each C = n_head * D wide) → y [B, T, C] with the heads side by side, the layout
 * merge_heads gives: the bits of splitting qkv into heads, ct_flash_attention and
 * ct_merge_heads (forward and qkv's gradient), without the copies. CPU only for now (on a
 * device: a status saying there is no kernel; ct_nn_causal_self_attention keeps the
 * unfused ops there). */
ct_tensor *ct_flash_attention_qkv(ct_ctx *ctx, ct_tensor *qkv, int n_head, bool causal);

/* ---- dynamic int8 quantization (inference: nothing is recorded for backward) ----
 * As torch.ao.quantization.quantize_dynamic's Linear with fbgemm (x86): weights s8,
 * symmetric (scale = max|w| / 127.5, zero point 0), per tensor or per output channel;
 * activations quantized per call over the whole input to u8 with reduce_range (0..127,
 * scale and zero point from min(x, 0) and max(x, 0)); u8 x s8 GEMM with exact int32
 * accumulation (AVX-512 VNNI, AVX2 or scalar, picked at run time); then
 * y = float(acc - zp * colsum) * (sa * sw) + bias, in f32. See docs/quantization.md.
 *
 *   ct_qweight *qw;
 *   if (ct_qweight_quantize(ct_f32(W), 512, 784, false, &qw) != CT_OK) ...   // CT_ERR_NOMEM
 *   ct_tensor *y = ct_linear_dynamic_int8(ctx, x, qw, b);                   // x [..., 784] f32
 *   ct_qweight_free(qw);
 */
typedef struct { float scale; int32_t zero_point; } ct_qparams;
/* PyTorch's ChooseQuantizationParams (preserve_sparsity off): [min(min, 0), max(max, 0)]
 * onto [qmin, qmax] (halved when reduce_range), scales under 6.1e-5 raised to it. */
ct_qparams ct_choose_qparams(float min, float max, int32_t qmin, int32_t qmax, bool reduce_range);
typedef struct ct_qweight ct_qweight;
/* Quantize an f32 weight [out, in] (row-major). CT_ERR_INVALID for a bad shape, CT_ERR_NOMEM. */
ct_status ct_qweight_quantize(const float *w, int64_t out, int64_t in, bool per_channel, ct_qweight **res);
/* From stored int8 values [out, in] and nscales (1 or out) scales; zero points are 0. */
ct_status ct_qweight_from_int8(const int8_t *q, int64_t out, int64_t in, const float *scales, int64_t nscales, ct_qweight **res);
void ct_qweight_free(ct_qweight *w);
const int8_t *ct_qweight_int8(const ct_qweight *w);                   /* [out, in] */
const float *ct_qweight_scales(const ct_qweight *w, int64_t *nscales); /* nscales may be NULL */
int64_t ct_qweight_out(const ct_qweight *w);
int64_t ct_qweight_in(const ct_qweight *w);
size_t ct_qweight_bytes(const ct_qweight *w); /* as stored: int8 values + f32 scales + i64 zero points */
/* x [..., in] f32 contiguous, b [out] f32 or NULL → [..., out] f32. */
ct_tensor *ct_linear_dynamic_int8(ct_ctx *ctx, ct_tensor *x, const ct_qweight *w, const ct_tensor *b);
/* "avx512-vnni", "avx2" or "scalar": the int8 kernel this CPU runs */
const char *ct_qgemm_kernel_name(void);
/* "avx512", "avx2" or "openblas": the kernels f32 GEMMs run here (the CPU and CTRAIN_GEMM) */
const char *ct_gemm_kernel_name(void);

#ifdef __cplusplus
}
#endif
#endif
