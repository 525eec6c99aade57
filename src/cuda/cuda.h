/* src/cuda/cuda.h — ctrain's CUDA layer for the rest of the library (C linkage; built only
 * with CUDA, CT_HAVE_CUDA). Devices, a caching allocator, kernels and cuBLASLt GEMMs.
 *
 *   int n;
 *   if (ct_cuda_device_count(&n) != CT_OK) ...     // no driver / no GPU: a clean error
 *   float *x, *y;
 *   if (ct_cuda_alloc(0, bytes, (void **)&x) != CT_OK) ...   // cached: no cudaMalloc per step
 *   ct_status st = ct_cuda_gelu(stream, x, y, n, true);       // error names call, device, op
 *   ct_cuda_free(x);
 *
 * Every function returns ct_status; on failure the message (ct_last_error) names the failed
 * CUDA / cuBLAS call, the device and the op. Kernels are launched on `stream` (NULL: the
 * legacy default stream) and return without waiting. Pointers are device memory unless
 * said otherwise; sizes are element counts. Backward kernels write input gradients (dx =)
 * and accumulate parameter gradients (dw +=), as parameters accumulate over micro-batches. */
#ifndef CT_CUDA_CUDA_H
#define CT_CUDA_CUDA_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctrain/core.h"
#include "ops/kmath.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- devices ---- */
/* Number of visible GPUs. No driver or no device: CT_ERR_UNSUPPORTED with the runtime's
 * reason ("CUDA driver version is insufficient..." / "no CUDA-capable device"). */
ct_status ct_cuda_device_count(int *n);
/* the device hooks behind tensor.h's ct_device_info_get (runtime.c), ct_device_versions and
 * ct_device_check (report.c; cuDNN's version is the loaded library's, "cuDNN: cannot load
 * libcudnn.so.9: <why> (headers 9.19.0)" without it) */
struct ct_device_info;
ct_status ct_cuda_device_info_get(int dev, struct ct_device_info *out);
void ct_cuda_versions(char *buf, size_t n);
/* The device current on this thread (tensor.h: ct_device_current). */
ct_status ct_cuda_current_device(int *dev);
/* Makes dev current on this thread. */
ct_status ct_cuda_set_device(int dev, const char *op);

/* ---- caching allocator ----
 * Freed blocks stay cached per device and are reused for requests of up to twice their
 * size or less; cudaMalloc is called only when no cached block fits, and on out-of-memory
 * the cache is released and the allocation tried once more. Blocks are for use on one
 * stream (the compute stream): a block freed while kernels on another stream still use it
 * must be synchronised by the caller first. Thread-safe. */
ct_status ct_cuda_alloc(int dev, size_t bytes, void **out);
void ct_cuda_free(void *p); /* NULL is fine */
typedef struct {
    size_t current;  /* bytes handed out and not freed (rounded sizes), and mapped (vmm.c) */
    size_t peak;     /* maximum of current since start or ct_cuda_mem_reset_peak */
    size_t reserved; /* bytes held from the driver: current + cached */
    int64_t mallocs; /* cudaMalloc calls so far */
} ct_cuda_mem_stats;
void ct_cuda_mem_stats_get(int dev, ct_cuda_mem_stats *s);
/* Memory of dev's reserved address ranges mapped (delta > 0) or unmapped (< 0) by vmm.c: in
 * use and held from the driver, as the allocator's blocks are, so the figures above (and the
 * progress line's GPU memory) count a sharded model's mapped units. */
void ct_cuda_mem_mapped_(int dev, int64_t delta);
/* How many times the host has waited for a device so far (stream synchronizations: copies to
 * the host, ct_device_sync, clipping's norm, the grad scaler's check). A training step that
 * reads nothing back waits for none: the host runs ahead and the device never idles on it. */
int64_t ct_cuda_host_waits(void);
/* How many host-to-device copies the device hooks have queued so far (ct_tensor_to and
 * ct_device_copy to a device). A model's step uploads its batch and nothing else. */
int64_t ct_cuda_uploads(void);
void ct_cuda_mem_reset_peak(int dev);
/* Returns every cached (free) block of dev to the driver. */
void ct_cuda_empty_cache(int dev);

/* ---- elementwise (f32) ---- */
ct_status ct_cuda_relu(cudaStream_t s, const float *x, float *y, int64_t n);
ct_status ct_cuda_relu_bwd(cudaStream_t s, const float *y, const float *g, float *dx, int64_t n);
ct_status ct_cuda_gelu(cudaStream_t s, const float *x, float *y, int64_t n, bool tanh_approx);
ct_status ct_cuda_gelu_bwd(cudaStream_t s, const float *x, const float *g, float *dx, int64_t n, bool tanh_approx);
/* y = a + b, b of length m broadcast over a's leading dims (n a multiple of m) */
ct_status ct_cuda_add(cudaStream_t s, const float *a, const float *b, float *y, int64_t n, int64_t m);
/* y = a * alpha (y may be a) */
ct_status ct_cuda_scale(cudaStream_t s, const float *a, float alpha, float *y, int64_t n);
/* y[i] = v */
ct_status ct_cuda_fill(cudaStream_t s, float *y, float v, int64_t n);
/* y = a * b elementwise (y may be a or b) */
ct_status ct_cuda_mul(cudaStream_t s, const float *a, const float *b, float *y, int64_t n);
/* y = x * ct_k_dropout(key, i, p, scale): the CPU op's mask (forward on x, backward on the
 * gradient with the same key) */
ct_status ct_cuda_dropout(cudaStream_t s, const float *x, float *y, int64_t n, uint64_t key, float p, float scale);
/* tanh, or with `sigmoid` the logistic function; backward from the output y: dx written */
ct_status ct_cuda_tanh(cudaStream_t s, const float *x, float *y, int64_t n, bool sigmoid);
ct_status ct_cuda_tanh_bwd(cudaStream_t s, const float *y, const float *g, float *dx, int64_t n, bool sigmoid);
/* Views: a shape and strides (in elements), up to 5 dims, of 4-byte elements (f32, i32).
 * strided_copy: dst (contiguous in l's shape) = src viewed through l; strided_add: dst viewed
 * through l += src (contiguous); the view must not map two elements to one. */
typedef struct { int ndim; int64_t shape[5], stride[5]; } ct_cuda_layout;
ct_status ct_cuda_strided_copy(cudaStream_t s, float *dst, const float *src, const ct_cuda_layout *l);
/* the same copy for 2-byte elements (bf16, f16) */
ct_status ct_cuda_strided_copy16(cudaStream_t s, void *dst, const void *src, const ct_cuda_layout *l);
ct_status ct_cuda_strided_add(cudaStream_t s, float *dst, const ct_cuda_layout *l, const float *src);

/* ---- streams: one compute and one communication stream per device, created on first use
 * (non-blocking: the legacy default stream would serialise them). Kernels of the op table's
 * device column and the host<->device copies run on the compute stream; NCCL on the
 * communication stream, ordered after the compute stream by events. ---- */
typedef enum { CT_CUDA_COMPUTE = 0, CT_CUDA_COMM = 1 } ct_cuda_stream_kind;
ct_status ct_cuda_stream(int dev, ct_cuda_stream_kind kind, cudaStream_t *out);
/* One NCCL all-reduce (sum, 64 MiB f32) across every visible GPU from this process,
 * checked; report: a line with the result and its bus bandwidth (report.c). */
ct_status ct_cuda_nccl_check(char *report, size_t len);
/* Address ranges whose memory comes and goes (vmm.c: CUDA's virtual memory management; the
 * device hooks vm_*, tensor.h's ct_device_reserve): one allocation per granule, mapped zeroed
 * on the compute stream, unmapped after a device synchronisation. */
ct_status ct_cuda_vm_reserve(int dev, size_t bytes, void **base, size_t *granule);
ct_status ct_cuda_vm_map(int dev, void *p, size_t bytes);
ct_status ct_cuda_vm_unmap(int dev, void *p, size_t bytes);
void ct_cuda_vm_release(int dev, void *base, size_t bytes);
/* Registers the CUDA backend with core (device hooks) and the op table's device column;
 * done once when the program starts (device.c), exposed for programs linking statically. */
void ct_cuda_register(void);

/* ---- layer norm over rows of D: mean and rstd per row saved for backward ---- */
ct_status ct_cuda_layer_norm(cudaStream_t s, const float *x, const float *w, const float *b, float *y, float *mean,
                             float *rstd, int64_t R, int64_t D, float eps);
/* dx written; dw, db (either may be NULL, as w) accumulated */
ct_status ct_cuda_layer_norm_bwd(cudaStream_t s, const float *x, const float *g, const float *w, const float *mean,
                                 const float *rstd, float *dx, float *dw, float *db, int64_t R, int64_t D);

/* ---- softmax + cross-entropy, fused: logits [N, C], targets i32 or i64 ----
 * out[0] = mean loss over targets != ignore (NaN when all are ignored), out[1] = that count;
 * lse [N] saved for backward. A target outside [0, C) counts as ignored (the CPU op aborts;
 * a kernel cannot, and the caller checks targets on the host when it has them there). */
ct_status ct_cuda_cross_entropy(cudaStream_t s, const float *logits, const void *target, bool target_i64, int64_t N,
                                 int64_t C, int64_t ignore, float *lse, float *out);
/* dlogits written: dloss (device scalar) * (softmax - onehot) / count, 0 on ignored rows */
ct_status ct_cuda_cross_entropy_bwd(cudaStream_t s, const float *logits, const void *target, bool target_i64, int64_t N,
                                    int64_t C, int64_t ignore, const float *lse, const float *out, const float *dloss,
                                    float *dlogits);

/* ---- softmax rows (softmax.cu): one warp per row of D; causal_T > 0 makes row r see only
 * keys j <= r % causal_T (attention's causal mask), the rest of the row written 0. x may be y. */
ct_status ct_cuda_softmax(cudaStream_t s, const float *x, float *y, int64_t R, int64_t D, bool log_out, int64_t causal_T);
/* dx written from the output y and its gradient g (softmax: y (g - sum g y), the sum in
 * double; log-softmax: g - exp(y) sum g) */
ct_status ct_cuda_softmax_bwd(cudaStream_t s, const float *y, const float *g, float *dx, int64_t R, int64_t D,
                              bool log_out);
/* attention's dS = P (dP - rowsum(dP P)) scale in place of dP [R, Tk], rows of Tq queries
 * per head; masked entries 0 */
ct_status ct_cuda_attention_ds(cudaStream_t s, const float *P, float *dS, int64_t R, int64_t Tk, int64_t Tq, bool causal,
                               float scale);

/* ---- bias_add, mean squared error, casts (pointwise.cu) ---- */
/* y = x + b[channel], x [n / (C inner)] x [C] x [inner] */
ct_status ct_cuda_bias_add(cudaStream_t s, const float *x, const float *b, float *y, int64_t n, int64_t C, int64_t inner);
/* out[0] = mean((a - b)^2) over n (NaN for n = 0), summed in double in a fixed order */
ct_status ct_cuda_mse(cudaStream_t s, const float *a, const float *b, int64_t n, float *out);
/* da = 2 dloss / n (a - b) and db = -that, written (either may be NULL); dloss a device scalar */
ct_status ct_cuda_mse_bwd(cudaStream_t s, const float *a, const float *b, int64_t n, const float *dloss, float *da,
                          float *db);
/* y (dtype to) = x (dtype from), n elements, f32/bf16/f16 each way (round to nearest even) */
typedef enum { CT_CUDA_CAST_F32 = 0, CT_CUDA_CAST_BF16, CT_CUDA_CAST_F16 } ct_cuda_cast_type;
static inline ct_cuda_cast_type ct_cuda_cast_type_of(ct_dtype dt) {
    return dt == CT_BF16 ? CT_CUDA_CAST_BF16 : dt == CT_F16 ? CT_CUDA_CAST_F16 : CT_CUDA_CAST_F32;
}
ct_status ct_cuda_cast(cudaStream_t s, const void *x, ct_cuda_cast_type from, void *y, ct_cuda_cast_type to, int64_t n);
/* cast backward: dx (f32) = g (f32) rounded to `to`'s precision (the low-precision
 * gradient's value, as the CPU op) */
ct_status ct_cuda_cast_bwd(cudaStream_t s, const float *g, ct_cuda_cast_type to, float *dx, int64_t n);

/* ---- elementwise ops on f32, bf16 or f16 (elementwise.cu): f32 arithmetic, each result rounded
 * to the output's type as it is stored, so autocast needs no f32 copies of their inputs. The
 * f32 functions above are these with f32 operands. ---- */
typedef enum {
    CT_CUDA_MAP_RELU, CT_CUDA_MAP_GELU, CT_CUDA_MAP_GELU_TANH, CT_CUDA_MAP_TANH, CT_CUDA_MAP_SIGMOID,
    CT_CUDA_MAP_SCALE,   /* x * alpha */
    CT_CUDA_MAP_DROPOUT, /* x * ct_k_dropout(key, i, p, alpha): alpha the kept values' scale */
    CT_CUDA_MAP_SILU     /* x * sigmoid(x) */
} ct_cuda_map_op;
typedef struct {
    ct_cuda_map_op op;
    float alpha;
    uint64_t key;
    float p;
} ct_cuda_map;
/* y = f(x), x and y of type t (y may be x) */
ct_status ct_cuda_map_fwd(cudaStream_t s, const ct_cuda_map *m, const void *x, void *y, ct_cuda_cast_type t, int64_t n);
/* dx (f32) = f'(v) g: v (type t) the input for gelu and silu, the output for relu, tanh and sigmoid,
 * not read for scale and dropout */
ct_status ct_cuda_map_bwd(cudaStream_t s, const ct_cuda_map *m, const void *v, ct_cuda_cast_type t, const float *g, float *dx,
                          int64_t n);
/* the same with g (g_as_v) and dx (dx_as_v) of v's type t instead of f32: low-precision
 * activation gradients, read widened and written rounded to nearest even */
ct_status ct_cuda_map_bwd_t(cudaStream_t s, const ct_cuda_map *m, const void *v, ct_cuda_cast_type t, const void *g, bool g_as_v,
                            void *dx, bool dx_as_v, int64_t n);
/* y = a + b with b of m elements repeating over a (n a multiple of m), or with mul a * b (m = n).
 * y is of a's type where a and b have one type, else f32 (autocast's promotion of mixed inputs). */
ct_status ct_cuda_binary(cudaStream_t s, bool mul, const void *a, ct_cuda_cast_type ta, const void *b, ct_cuda_cast_type tb,
                         void *y, int64_t n, int64_t m);
/* layer norm and cross-entropy with x / logits of type xt (f32, bf16 or f16) read as they are;
 * the rest as ct_cuda_layer_norm(_bwd) and ct_cuda_cross_entropy(_bwd), but: layer norm's y of
 * type yt and its gradient g of type gt (16-bit y rounded to nearest even as stored: the bits of
 * the f32 y cast), dx added to (accumulate) or written; dlogits of the logits' type when
 * dlogits_as_x (rounded likewise), else f32 */
ct_status ct_cuda_layer_norm_t(cudaStream_t s, const void *x, ct_cuda_cast_type xt, const float *w, const float *b, void *y,
                               ct_cuda_cast_type yt, float *mean, float *rstd, int64_t R, int64_t D, float eps);
ct_status ct_cuda_layer_norm_bwd_t(cudaStream_t s, const void *x, ct_cuda_cast_type xt, const void *g, ct_cuda_cast_type gt,
                                   const float *w, const float *mean, const float *rstd, float *dx, bool accumulate, float *dw,
                                   float *db, int64_t R, int64_t D);
ct_status ct_cuda_cross_entropy_t(cudaStream_t s, const void *logits, ct_cuda_cast_type xt, const void *target, bool target_i64,
                                  int64_t N, int64_t C, int64_t ignore, float *lse, float *out);
ct_status ct_cuda_cross_entropy_bwd_t(cudaStream_t s, const void *logits, ct_cuda_cast_type xt, const void *target,
                                      bool target_i64, int64_t N, int64_t C, int64_t ignore, const float *lse, const float *out,
                                      const float *dloss, void *dlogits, bool dlogits_as_x);
/* softmax and log-softmax rows of x of type xt with an f32 y (f32 ops under autocast); the
 * rest as ct_cuda_softmax (x may be y when f32). Backward reads only y: ct_cuda_softmax_bwd. */
ct_status ct_cuda_softmax_t(cudaStream_t s, const void *x, ct_cuda_cast_type xt, float *y, int64_t R, int64_t D, bool log_out,
                            int64_t causal_T);
/* bias_add with x of type xt and b of type bt; y of their type where they have one, else f32
 * (autocast's promotion of mixed inputs) */
ct_status ct_cuda_bias_add_t(cudaStream_t s, const void *x, ct_cuda_cast_type xt, const void *b, ct_cuda_cast_type bt, void *y,
                             int64_t n, int64_t C, int64_t inner);
/* mean squared error with a of type at and b of type bt; the loss and da, db f32 */
ct_status ct_cuda_mse_t(cudaStream_t s, const void *a, ct_cuda_cast_type at, const void *b, ct_cuda_cast_type bt, int64_t n,
                        float *out);
ct_status ct_cuda_mse_bwd_t(cudaStream_t s, const void *a, ct_cuda_cast_type at, const void *b, ct_cuda_cast_type bt, int64_t n,
                            const float *dloss, float *da, float *db);

/* ---- Llama's ops (llama.cu) ----
 * RMSNorm over rows of D: y = x rstd w (w may be NULL), x of type xt read as it is, y of type yt
 * (a 16-bit y rounded to nearest even as stored); rstd [R] saved. Backward: the gradient g of
 * type gt; dx (may be NULL) f32, written or added to (accumulate); dw accumulated (may be NULL). */
ct_status ct_cuda_rms_norm_t(cudaStream_t s, const void *x, ct_cuda_cast_type xt, const float *w, void *y, ct_cuda_cast_type yt,
                             float *rstd, int64_t R, int64_t D, float eps);
ct_status ct_cuda_rms_norm_bwd_t(cudaStream_t s, const void *x, ct_cuda_cast_type xt, const void *g, ct_cuda_cast_type gt,
                                 const float *w, const float *rstd, float *dx, bool accumulate, float *dw, int64_t R, int64_t D);
/* rotary embedding (Hugging Face's rotate_half) of rows [R][T][D], D even: cs [2 T D/2] the
 * cosines then the sines of pos[t] theta^(-2j/D) (pos i32/i64 [T] on the device, or NULL for
 * 0..T-1); x and y of type t (y may not be x); backward dx (f32) written, or added to */
ct_status ct_cuda_rope_table(cudaStream_t s, const void *pos, bool pos_i64, int64_t T, int64_t D, float theta, float *cs);
/* the same with Llama 3.1's frequency scaling (ct_rope_scaling's fields; factor 0: none) */
ct_status ct_cuda_rope_table_scaled(cudaStream_t s, const void *pos, bool pos_i64, int64_t T, int64_t D, float theta,
                                    float factor, float low_freq_factor, float high_freq_factor, int original_max_pos, float *cs);
ct_status ct_cuda_rope(cudaStream_t s, const void *x, ct_cuda_cast_type t, void *y, const float *cs, int64_t R, int64_t T,
                       int64_t D);
ct_status ct_cuda_rope_bwd(cudaStream_t s, const float *g, const float *cs, float *dx, int64_t R, int64_t T, int64_t D,
                           bool accumulate);
/* repeat_kv's backward: dx [BH][TD] = (accumulate ? dx : 0) + the rep gradients g [BH rep][TD]
 * of each head added in order (its forward is ct_cuda_strided_copy with a stride of 0) */
ct_status ct_cuda_repeat_kv_bwd(cudaStream_t s, const float *g, float *dx, int64_t BH, int64_t TD, int64_t rep, bool accumulate);

/* ---- embedding: w [V, D], idx [n] → y [n, D]; an index outside [0, V) gives a zero row
 * and sets *bad (device int, may be NULL) to 1 ---- */
ct_status ct_cuda_embedding(cudaStream_t s, const float *w, const void *idx, bool idx_i64, int64_t n, int64_t V,
                            int64_t D, float *y, int *bad);
/* dw += scatter of g rows, each element summed in index order (deterministic) */
ct_status ct_cuda_embedding_bwd(cudaStream_t s, const float *g, const void *idx, bool idx_i64, int64_t n, int64_t V,
                                int64_t D, float *dw);

/* ---- optimizers: one pass over the flat buffers (ops/kmath.h gives the constants) ---- */
ct_status ct_cuda_adamw(cudaStream_t s, const ct_k_adamw *k, float *p, const float *g, float *m, float *v, float *vmax,
                        int64_t n);
ct_status ct_cuda_sgd(cudaStream_t s, const ct_k_sgd *k, float *p, const float *g, float *buf, int64_t n);
/* gradient clipping and loss scaling: *out (device double) = sum of squares of g[0, n) by
 * ct_k_sumsq's chunks in order, part: scratch of ceil(n / CT_K_SUMSQ_CHUNK) doubles; g *= coef,
 * *nonfinite (device int, may be NULL) set to 1 when a value was inf/NaN before scaling */
ct_status ct_cuda_sumsq(cudaStream_t s, const float *g, int64_t n, double *part, double *out);
ct_status ct_cuda_scale_check(cudaStream_t s, float *g, float coef, int64_t n, int *nonfinite);

/* ---- flash attention, causal or not: q, k, v, o [BH, T, D] (D <= CT_K_ATTN_MAX_D),
 * f32, bf16 or f16 (__nv_bfloat16 / __half elements, f32 arithmetic); lse [BH, T] f32 saved ----
 * Memory: O(T) per head beyond inputs and outputs (lse, and Dr in backward). */
typedef enum { CT_CUDA_F32 = 0, CT_CUDA_BF16 = 1, CT_CUDA_F16 = 2 } ct_cuda_dtype;
ct_status ct_cuda_attention(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, void *o,
                            float *lse, int64_t BH, int64_t T, int D, bool causal);
/* dq, dk, dv written; dr: scratch of BH * T floats */
ct_status ct_cuda_attention_bwd(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v,
                                const void *o, const void *dO, const float *lse, float *dr, void *dq, void *dk, void *dv,
                                int64_t BH, int64_t T, int D, bool causal);
/* grouped-query: k, v [BH / G, T, D], query head h reading key/value head h / G (G dividing
 * BH, which holds whole groups since G divides H); dk, dv still [BH, T, D], each query head's
 * own gradient (the caller sums each group) */
ct_status ct_cuda_attention_gqa(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, void *o,
                                float *lse, int64_t BH, int64_t T, int D, bool causal, int64_t G);
ct_status ct_cuda_attention_gqa_bwd(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v,
                                    const void *o, const void *dO, const float *lse, float *dr, void *dq, void *dk, void *dv,
                                    int64_t BH, int64_t T, int D, bool causal, int64_t G);

/* Attention on heads that lie with strides (element offsets): row t, column d of query head
 * bh (of B * H) of a query-side tensor (q, o, dO, dq) at (bh / H) * batch + (bh % H) * head +
 * t * row + d; the key-side inputs k, v by their head bh / G of H / G each batch; dk, dv per
 * query head, as in ct_cuda_attention_gqa_bwd. A GPT's packed qkv [B, T, 3, H, D] is then read,
 * and its y [B, T, H, D] and dqkv written, where they lie, without head-layout copies. Only the
 * register-tile kernels (CTRAIN_CUDA_ATTENTION=mma) take views: ct_cuda_attention_views_fit
 * says whether they run for dt and D under the current setting. Backward computes dr itself
 * (scratch of B * H * T floats). */
typedef struct { int64_t batch, head, row; } ct_cuda_attn_view;
typedef struct {
    ct_cuda_attn_view q, k, v, o, dO, dq, dk, dv;
    int64_t H, G;
} ct_cuda_attn_views;
bool ct_cuda_attention_views_fit(ct_cuda_dtype dt, int D);
ct_status ct_cuda_attention_views(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v, void *o,
                                  float *lse, int64_t BH, int64_t T, int D, bool causal, const ct_cuda_attn_views *V);
ct_status ct_cuda_attention_views_bwd(cudaStream_t s, ct_cuda_dtype dt, const void *q, const void *k, const void *v,
                                      const void *o, const void *dO, const float *lse, float *dr, void *dq, void *dk, void *dv,
                                      int64_t BH, int64_t T, int D, bool causal, const ct_cuda_attn_views *V);

/* ---- max pooling of NCHW planes (ops/kmath.h ct_k_max_pool_at): window k, stride s,
 * padding p (p <= k/2); relu: of max(x, 0). arg [planes, OH, OW]: each output's winner, as
 * an offset in its input plane. Backward: dx = (accumulate ? dx : 0) + the gradients routed
 * to each input, in output order (the CPU op's sums). ---- */
typedef struct { int64_t planes, H, W, OH, OW, k, s, p; } ct_cuda_pool_geom;
ct_status ct_cuda_max_pool(cudaStream_t s, const float *x, float *y, int32_t *arg, const ct_cuda_pool_geom *g, bool relu);
ct_status ct_cuda_max_pool_bwd(cudaStream_t s, const float *gy, const float *y, const int32_t *arg, float *dx,
                               const ct_cuda_pool_geom *g, bool relu, bool accumulate);
/* the same with x and y (the saved output, read by relu's backward) of type t: f32, bf16 or
 * f16 (y in x's type; the max of rounded values is exact) */
ct_status ct_cuda_max_pool_t(cudaStream_t s, const void *x, ct_cuda_cast_type t, void *y, int32_t *arg, const ct_cuda_pool_geom *g,
                             bool relu);
ct_status ct_cuda_max_pool_bwd_t(cudaStream_t s, const float *gy, const void *y, ct_cuda_cast_type t, const int32_t *arg, float *dx,
                                 const ct_cuda_pool_geom *g, bool relu, bool accumulate);

/* ---- convolution and average pooling on cuDNN (cudnn.c, loaded with dlopen on first use;
 * NCHW f32; src/cuda/conv.c holds the op entries) ---- */
/* cudnnGetVersion() of the loaded library, or 0 when it cannot be loaded */
size_t ct_cuda_cudnn_version(void);

/* ---- GEMM on cuBLASLt, row-major like ct_matmul: C [M, N] = alpha op(A) op(B) + beta C,
 * A [M, K] (or [K, M] if ta), B [K, N] (or [N, K] if tb), `batch` products at strides of
 * one matrix each. f32: f32 compute, or TF32 / bf16 tensor cores with CTRAIN_CUDA_MATMUL=
 * high / medium; bf16 or f16: that type in and out, f32 accumulation (tensor cores).
 * Epilogues: bias [N] added per column, GELU (tanh form) after it. ---- */
typedef enum { CT_GEMM_EPI_NONE = 0, CT_GEMM_EPI_BIAS, CT_GEMM_EPI_GELU, CT_GEMM_EPI_BIAS_GELU } ct_gemm_epilogue;
typedef struct {
    ct_cuda_dtype dt;
    bool ta, tb;
    int64_t M, N, K, batch;
    float alpha, beta;
    ct_gemm_epilogue epi;
    const void *bias; /* dtype of C; with BIAS epilogues */
    bool c_f32;       /* bf16 or f16 A and B with an f32 C (and bias): autocast's products, f32 results */
} ct_cuda_gemm_desc;
/* dev: the current device, whose stream s is (its cuBLASLt handle and workspace are used) */
ct_status ct_cuda_gemm(cudaStream_t s, int dev, const ct_cuda_gemm_desc *d, const void *A, const void *B, void *C);
/* Releases the cuBLASLt handles and workspaces (at exit; the allocator keeps the memory). */
void ct_cuda_gemm_shutdown(void);

#ifdef __cplusplus
}
#endif
#endif
