/* Private to src/cuda's op entries (ops.c, ops_more.c, ops_attention.c, ...): the state of one op's run on a
 * device, output and scratch buffers, the row-major GEMM and gradient accumulation. Static
 * inline so that each entry file stays one translation unit of its own. */
#ifndef CT_CUDA_OPS_UTIL_H
#define CT_CUDA_OPS_UTIL_H
#include "core/kernel.h"
#include "cuda/cuda.h"
#include "ops/op_table.h"

typedef struct {
    ct_ctx *ctx;
    ct_device dev;
    cudaStream_t s;
} run;

/* false when the context has failed already or the device cannot be used */
static inline bool begin(ct_ctx *ctx, ct_device d, const char *op, run *r) {
    r->ctx = ctx;
    r->dev = d;
    r->s = NULL;
    if (ct_ctx_status(ctx) != CT_OK) return false;
    ct_status st = ct_cuda_set_device(d.index, op);
    if (st == CT_OK) st = ct_cuda_stream(d.index, CT_CUDA_COMPUTE, &r->s);
    return ct_ctx_fail(ctx, st) == CT_OK;
}
static inline bool ok(run *r, ct_status st) { return ct_ctx_fail(r->ctx, st) == CT_OK; }

static inline ct_tensor *out_like(run *r, const ct_tensor *x, int ndim, const int64_t *shape, const char *op) {
    return ct_new_on(r->ctx, r->dev, CT_F32, ndim, shape ? shape : x->shape, op);
}
/* the same in x's own dtype (f32, bf16 or f16: the low-precision kernels' outputs) */
static inline ct_tensor *out_same(run *r, const ct_tensor *x, int ndim, const int64_t *shape, const char *op) {
    return ct_new_on(r->ctx, r->dev, x->dtype, ndim, shape ? shape : x->shape, op);
}
static inline ct_cuda_cast_type ty(const ct_tensor *t) { return ct_cuda_cast_type_of(t->dtype); }
/* f32, bf16 or f16: the dtypes the low-precision kernels read (abort otherwise: a programmer error) */
static inline void check_float(const char *op, const ct_tensor *t) {
    CT_CHECK(t->dtype == CT_F32 || t->dtype == CT_BF16 || t->dtype == CT_F16, "%s on cuda:%d: a %s tensor (f32, bf16 or f16)",
             op, t->device.index, ct_dtype_name(t->dtype));
}
static inline float *scratch(run *r, int64_t n, const char *op) {
    return ct_ctx_dev_alloc(r->ctx, r->dev, (size_t)(n > 0 ? n : 1) * sizeof(float), op);
}

/* row-major GEMM on cuBLASLt: C = alpha op(A) op(B) + beta C; A and B f32 (no TF32) or both of
 * dt, bf16 or f16 (autocast's rounded operands: exact products, f32 sums); C f32, or with
 * c_lowp of dt itself, rounded as stored (then beta 0). The bias [N] is of C's type, added to
 * the f32 sums before any rounding (the epilogue) */
static inline bool gemm_to(run *r, ct_cuda_dtype dt, bool c_lowp, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t batch,
                           float alpha, const void *A, const void *B, void *C, float beta, const void *bias) {
    if (M == 0 || N == 0) return true;
    if (K == 0 && !bias) { /* an empty sum: C = beta C, without asking cuBLASLt for a K of 0 */
        if (c_lowp) {
            const ct_device_hooks *h = ct_device_hooks_get(r->dev, "gemm");
            return ok(r, h ? h->zero(r->dev.index, C, (size_t)(M * N * batch) * 2) : CT_ERR_UNSUPPORTED);
        }
        return ok(r, beta == 0.0f ? ct_cuda_fill(r->s, C, 0.0f, M * N * batch) : ct_cuda_scale(r->s, C, beta, C, M * N * batch));
    }
    ct_cuda_gemm_desc d = {.dt = dt, .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .batch = batch,
                           .alpha = alpha, .beta = beta, .epi = bias ? CT_GEMM_EPI_BIAS : CT_GEMM_EPI_NONE, .bias = bias,
                           .c_f32 = dt != CT_CUDA_F32 && !c_lowp};
    return ok(r, ct_cuda_gemm(r->s, r->dev.index, &d, A, B, C));
}
/* the same into an f32 C */
static inline bool gemm_any(run *r, ct_cuda_dtype dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t batch, float alpha,
                            const void *A, const void *B, float *C, float beta, const float *bias) {
    return gemm_to(r, dt, false, ta, tb, M, N, K, batch, alpha, A, B, C, beta, bias);
}
/* Where a backward GEMM writes t's gradient: a fresh one in t's bf16/f16 (ct_ac_grad_lowp: C
 * of the GEMM's type, rounded as stored, beta 0), else t's f32 one (beta 0 when fresh, else
 * added to). p NULL: t needs none (or the context failed). */
typedef struct {
    void *p;
    bool lowp;
    float beta;
} grad_out;
static inline grad_out grad_for_gemm(run *r, ct_tensor *t) {
    grad_out g = {ct_ac_grad_lowp(r->ctx, t), true, 0.0f};
    if (g.p) return g;
    bool fresh;
    g.p = ct_grad_acc_fresh(r->ctx, t, &fresh);
    g.lowp = false;
    g.beta = fresh ? 0.0f : 1.0f;
    return g;
}
/* gemm_any into a grad_for_gemm destination */
static inline bool gemm_grad(run *r, ct_cuda_dtype dt, const grad_out *g, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                             int64_t batch, const void *A, const void *B) {
    return gemm_to(r, dt, g->lowp, ta, tb, M, N, K, batch, 1.0f, A, B, g->p, g->beta, NULL);
}
static inline bool gemm_scaled(run *r, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t batch, float alpha,
                               const float *A, const float *B, float *C, float beta, const float *bias) {
    return gemm_any(r, CT_CUDA_F32, ta, tb, M, N, K, batch, alpha, A, B, C, beta, bias);
}
/* the GEMM / attention element type of a tensor's dtype (f32, bf16, f16) */
static inline ct_cuda_dtype gemm_dt(const ct_tensor *t) {
    return t->dtype == CT_BF16 ? CT_CUDA_BF16 : t->dtype == CT_F16 ? CT_CUDA_F16 : CT_CUDA_F32;
}
/* a bf16 or f16 (dt) copy of n f32 values (exact when they hold such values: a rounded
 * gradient), in scratch */
static inline const void *lowp_copy(run *r, ct_cuda_dtype dt, const float *x, int64_t n, const char *op) {
    void *y = ct_ctx_dev_alloc(r->ctx, r->dev, (size_t)(n > 0 ? n : 1) * 2, op);
    ct_cuda_cast_type to = dt == CT_CUDA_F16 ? CT_CUDA_CAST_F16 : CT_CUDA_CAST_BF16;
    if (y && n > 0 && !ok(r, ct_cuda_cast(r->s, x, CT_CUDA_CAST_F32, y, to, n))) return NULL;
    return y;
}
/* n ones of dt (exact in bf16 and f16), in scratch: the row of a sum's GEMM */
static inline const void *ones_of(run *r, ct_cuda_dtype dt, int64_t n, const char *op) {
    float *ones = scratch(r, n, op);
    if (!ones || !ok(r, ct_cuda_fill(r->s, ones, 1.0f, n))) return NULL;
    return dt == CT_CUDA_F32 ? ones : lowp_copy(r, dt, ones, n, op);
}
static inline bool gemm(run *r, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t batch, const float *A,
                        const float *B, float *C, float beta, const float *bias) {
    return gemm_scaled(r, ta, tb, M, N, K, batch, 1.0f, A, B, C, beta, bias);
}

/* ---- gradient accumulation ---- */
/* Where a kernel that writes (dx =) puts t's gradient: t's fresh buffer, or scratch added
 * by acc_end. NULL: t needs none (or the context failed). */
static inline float *acc_begin(run *r, ct_tensor *t, bool *direct) {
    bool fresh;
    *direct = false;
    float *g = ct_grad_acc_fresh(r->ctx, t, &fresh);
    if (!g) return NULL;
    if (fresh) { *direct = true; return g; }
    return scratch(r, ct_numel(t), "backward");
}
/* The start of a backward that writes the gradient of its input 0: the run on the output's
 * device, then acc_begin for that input. NULL: nothing to do (or the context failed). */
static inline float *acc_begin_in0(ct_ctx *ctx, ct_node *n, const char *op, run *r, bool *direct) {
    *direct = false;
    if (!begin(ctx, n->out->device, op, r)) return NULL;
    return acc_begin(r, n->in[0], direct);
}
static inline void acc_end(run *r, ct_tensor *t, float *w, bool direct) {
    int64_t n = ct_numel(t);
    if (w && !direct && n > 0) ok(r, ct_cuda_add(r->s, t->grad->data, w, t->grad->data, n, n));
}
/* t.grad += g (same number of elements) */
static inline void acc_add(run *r, ct_tensor *t, const float *g) {
    bool fresh;
    float *gt = ct_grad_acc_fresh(r->ctx, t, &fresh);
    int64_t n = ct_numel(t);
    if (!gt || n == 0) return;
    ok(r, fresh ? ct_cuda_scale(r->s, g, 1.0f, gt, n) : ct_cuda_add(r->s, gt, g, gt, n, n));
}
/* the gradient of t's output as the backward finds it: f32, or in the output's bf16/f16 where the
 * op declared it reads it so (ct_op_device_grad_lowp; ct_ac_grad_lowp then wrote it) */
static inline bool grad_lowp(const ct_tensor *out) { return out->grad->dtype != CT_F32; }
/* acc_add, or g rounded into a fresh gradient of t's bf16/f16 where t takes one (a residual
 * add's gradient of a bf16 linear output) */
static inline void acc_add_t(run *r, ct_tensor *t, const float *g) {
    void *lw = ct_ac_grad_lowp(r->ctx, t);
    if (!lw) { acc_add(r, t, g); return; }
    int64_t n = ct_numel(t);
    if (n > 0) ok(r, ct_cuda_cast(r->s, g, CT_CUDA_CAST_F32, lw, ty(t), n));
}
/* t.grad [cols] += column sums of g [rows, cols]: a GEMM with a row of ones */
static inline void acc_colsum(run *r, ct_tensor *t, const float *g, int64_t rows, int64_t cols) {
    bool fresh;
    float *gt = ct_grad_acc_fresh(r->ctx, t, &fresh);
    if (!gt || cols == 0) return;
    float *ones = scratch(r, rows, "backward");
    if (!ones || !ok(r, ct_cuda_fill(r->s, ones, 1.0f, rows))) return;
    gemm(r, false, false, 1, cols, rows, 1, ones, g, gt, fresh ? 0.0f : 1.0f, NULL);
}

/* the same with g of the GEMM type dt (bf16/f16: a row of ones in dt, exact products, f32
 * sums), into a fresh low-precision gradient where t takes one */
static inline void acc_colsum_t(run *r, ct_cuda_dtype dt, ct_tensor *t, const void *g, int64_t rows, int64_t cols) {
    if (dt == CT_CUDA_F32) { acc_colsum(r, t, g, rows, cols); return; }
    grad_out o = grad_for_gemm(r, t);
    const void *ones = o.p && cols > 0 ? ones_of(r, dt, rows, "backward") : NULL;
    if (ones) gemm_grad(r, dt, &o, false, false, 1, cols, rows, 1, ones, g);
}

/* the output's gradient as a low-precision GEMM (dt) reads it: as it came (in dt itself: ct_ac_grad_lowp),
 * or a dt copy of the f32 one (rounded to those values already); the f32 one in an f32 run */
static inline const void *gemm_dy(run *r, ct_cuda_dtype dt, const ct_tensor *out, int64_t n, const char *op) {
    if (grad_lowp(out)) {
        CT_CHECK(gemm_dt(out->grad) == dt, "%s: a %s gradient of a %s GEMM", op, ct_dtype_name(out->grad->dtype),
                 ct_dtype_name(out->dtype));
        return out->grad->data;
    }
    return dt != CT_CUDA_F32 ? lowp_copy(r, dt, out->grad->data, n, op) : out->grad->data;
}
/* a view for the strided copies: shape and strides (elements) of ndim <= 5 dims */
static inline ct_cuda_layout layout(int ndim, const int64_t *shape, const int64_t *stride) {
    ct_cuda_layout l = {.ndim = ndim};
    for (int d = 0; d < ndim; d++) { l.shape[d] = shape[d]; l.stride[d] = stride[d]; }
    return l;
}
/* dst (contiguous in l's shape) = src seen through l, elements of es bytes (4, or 2: bf16/f16) */
static inline bool copy_view(run *r, size_t es, void *dst, const void *src, ct_cuda_layout l) {
    return ok(r, es == 4 ? ct_cuda_strided_copy(r->s, dst, src, &l) : ct_cuda_strided_copy16(r->s, dst, src, &l));
}
/* heads and tokens: [B, T, H*D] seen as [B, H, T, D] (split_heads), and [B, H, T, D] seen as
 * [B, T, H, D], i.e. [B, T, H*D] (merge_heads) */
static inline ct_cuda_layout heads_view(int64_t B, int64_t H, int64_t T, int64_t D) {
    return layout(4, (int64_t[]){B, H, T, D}, (int64_t[]){T * H * D, D, H * D, 1});
}
static inline ct_cuda_layout tokens_view(int64_t B, int64_t H, int64_t T, int64_t D) {
    return layout(4, (int64_t[]){B, T, H, D}, (int64_t[]){H * T * D, D, T * D, 1});
}

#endif
