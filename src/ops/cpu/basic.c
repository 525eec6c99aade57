/* add (with trailing-shape broadcast), relu, sum, mean. */
#include "ops/op_table.h"
#include "ctrain/ops.h"

#include "ops/kmath.h"

#define ADD_CHUNK 1024

/* The elementwise add of both paths below, never inlined: one machine code, so the bf16 path
 * gives the f32 op's bits, down to which NaN an add of two NaNs returns (operand order). */
__attribute__((noinline)) static void add_span(const float *restrict A, const float *restrict B, float *restrict Y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) Y[i] = A[i] + B[i];
}

/* a + b of the same shape, one bf16 and the other f32 (the residual stream under autocast):
 * promoted, an f32 result. The bf16 one is widened chunk by chunk on the stack (exact) and
 * add_span adds — the bits of autocast's run on an f32 copy (autocast.c), without the copy
 * and without moving the result out of the temporaries; the output lands in the arena, where
 * that move put it. The node is a low-precision one (ct_bw_lowp), as ct_ac_leave makes. */
static bool add_mixed_bf16(const ct_ctx *ctx, const ct_tensor *a, const ct_tensor *b) {
    bool ab = a->dtype == CT_BF16 && b->dtype == CT_F32, ba = a->dtype == CT_F32 && b->dtype == CT_BF16;
    return (ab || ba) && ct_ctx_temp_depth_(ctx) == 0 && ct_same_shape(a, b) && ct_is_contiguous(a) && ct_is_contiguous(b);
}
static ct_tensor *add_bf16_f32(ct_ctx *ctx, ct_tensor *a, ct_tensor *b) {
    ct_tensor *y = ct_new(ctx, CT_F32, a->ndim, a->shape);
    int64_t n = ct_numel(a);
    bool a_lp = a->dtype == CT_BF16;
    const uint16_t *L = a_lp ? a->data : b->data;
    const float *F = a_lp ? b->data : a->data;
    float *Y = y->data;
#pragma omp parallel for if (n >= (1 << 16))
    for (int64_t c = 0; c < n; c += ADD_CHUNK) {
        float w[ADD_CHUNK];
        int64_t m = n - c < ADD_CHUNK ? n - c : ADD_CHUNK;
        for (int64_t i = 0; i < m; i++) w[i] = ct_k_bf16_to_f32(L[c + i]);
        if (a_lp) add_span(w, F + c, Y + c, m);
        else add_span(F + c, w, Y + c, m);
    }
    ct_node *nd = ct_record(ctx, CT_OP_ADD, y, 2, (ct_tensor *[]){a, b});
    if (nd) nd->op = &ct_op_table_lp[CT_OP_ADD];
    return y;
}

ct_tensor *ct_add(ct_ctx *ctx, ct_tensor *a, ct_tensor *b) {
    CT_DEV_DISPATCH(ctx, CT_OP_ADD, .in = {a, b});
    if (add_mixed_bf16(ctx, a, b)) return add_bf16_f32(ctx, a, b);
    CT_AUTOCAST(ctx, CT_OP_ADD, 2, ((ct_tensor **[]){&a, &b}), ct_add(ctx, a, b));
    ct_check_add(a, b);
    ct_tensor *y = ct_new_like(ctx, a);
    int64_t n = ct_numel(a), m = ct_numel(b);
    const float *A = a->data, *B = b->data;
    float *Y = y->data;
    if (m == n) {
#pragma omp parallel for if (n >= (1 << 16))
        for (int64_t c = 0; c < n; c += 4 * ADD_CHUNK)
            add_span(A + c, B + c, Y + c, n - c < 4 * ADD_CHUNK ? n - c : 4 * ADD_CHUNK);
    } else if (m > 0) {
#pragma omp parallel for if (n >= (1 << 16))
        for (int64_t r = 0; r < n / m; r++)
            for (int64_t j = 0; j < m; j++) Y[r * m + j] = A[r * m + j] + B[j];
    }
    ct_record(ctx, CT_OP_ADD, y, 2, (ct_tensor *[]){a, b});
    return y;
}
void ct_bw_add(ct_ctx *ctx, ct_node *n) {
    const float *g = n->out->grad->data;
    int64_t N = ct_numel(n->out), m = ct_numel(n->in[1]);
    bool fresh; /* ga unzeroed: written as +0 + g, the bits of adding to zeros */
    float *ga = ct_grad_acc_fresh(ctx, n->in[0], &fresh), *gb = ct_grad_acc(ctx, n->in[1]);
    if (ga)
#pragma omp parallel for if (N >= (1 << 16))
        for (int64_t i = 0; i < N; i++) ga[i] = (fresh ? 0.0f : ga[i]) + g[i];
    if (gb && m > 0)
        for (int64_t r = 0; r < N / m; r++)
            for (int64_t j = 0; j < m; j++) gb[j] += g[r * m + j];
}

ct_tensor *ct_relu(ct_ctx *ctx, ct_tensor *x) {
    CT_DEV_DISPATCH(ctx, CT_OP_RELU, .in = {x});
    CT_AUTOCAST(ctx, CT_OP_RELU, 1, ((ct_tensor **[]){&x}), ct_relu(ctx, x));
    CT_CHECK_F32("relu", x); CT_CHECK_CONTIG("relu", x);
    ct_tensor *y = ct_new_like(ctx, x);
    int64_t n = ct_numel(x);
    const float *X = x->data;
    float *Y = y->data;
#pragma omp parallel for if (n >= (1 << 16))
    for (int64_t i = 0; i < n; i++) Y[i] = X[i] > 0 ? X[i] : 0.0f;
    ct_record(ctx, CT_OP_RELU, y, 1, &x);
    return y;
}
void ct_bw_relu(ct_ctx *ctx, ct_node *n) {
    bool fresh;
    float *gx = ct_grad_acc_fresh(ctx, n->in[0], &fresh);
    if (!gx) return;
    const float *g = n->out->grad->data, *Y = n->out->data;
    int64_t N = ct_numel(n->out);
#pragma omp parallel for if (N >= (1 << 16))
    for (int64_t i = 0; i < N; i++) gx[i] = (fresh ? 0.0f : gx[i]) + (Y[i] > 0 ? g[i] : 0.0f);
}

/* Summation in double so long reductions match PyTorch's pairwise sums to f32 rounding;
 * fixed 4096-element blocks added in order, so the result is the same for any thread
 * count (an OpenMP reduction would add per-thread partials in a thread-dependent split). */
static ct_tensor *reduce_all(ct_ctx *ctx, ct_tensor *x, int op, double scale) {
    CT_CHECK_F32(ct_op_table[op].name, x); CT_CHECK_CONTIG(ct_op_table[op].name, x);
    int64_t n = ct_numel(x), nb = (n + 4095) / 4096;
    const float *X = x->data;
    double s = 0, *part = ct_ctx_alloc(ctx, (size_t)(nb ? nb : 1) * sizeof(double));
#pragma omp parallel for if (n >= (1 << 16))
    for (int64_t k = 0; k < nb; k++) {
        int64_t e = (k + 1) * 4096 < n ? (k + 1) * 4096 : n;
        double p = 0;
#pragma omp simd reduction(+ : p)
        for (int64_t i = k * 4096; i < e; i++) p += X[i];
        part[k] = p;
    }
    for (int64_t k = 0; k < nb; k++) s += part[k];
    ct_tensor *y = ct_new(ctx, CT_F32, 0, NULL);
    ct_f32(y)[0] = (float)(s * scale);
    ct_node *nd = ct_record(ctx, op, y, 1, &x);
    if (nd) nd->f[0] = scale;
    return y;
}
ct_tensor *ct_sum(ct_ctx *ctx, ct_tensor *x) {
    CT_DEV_DISPATCH(ctx, CT_OP_SUM, .in = {x});
    CT_AUTOCAST(ctx, CT_OP_SUM, 1, ((ct_tensor **[]){&x}), ct_sum(ctx, x));
    return reduce_all(ctx, x, CT_OP_SUM, 1.0);
}
ct_tensor *ct_mean(ct_ctx *ctx, ct_tensor *x) {
    CT_DEV_DISPATCH(ctx, CT_OP_MEAN, .in = {x});
    CT_AUTOCAST(ctx, CT_OP_MEAN, 1, ((ct_tensor **[]){&x}), ct_mean(ctx, x));
    int64_t n = ct_numel(x);
    return reduce_all(ctx, x, CT_OP_MEAN, n ? 1.0 / (double)n : 0.0);
}
static void bw_reduce(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    float g = (float)(ct_f32(n->out->grad)[0] * n->f[0]);
    int64_t N = ct_numel(n->in[0]);
    for (int64_t i = 0; i < N; i++) gx[i] += g;
}
void ct_bw_sum(ct_ctx *ctx, ct_node *n) { bw_reduce(ctx, n); }
void ct_bw_mean(ct_ctx *ctx, ct_node *n) { bw_reduce(ctx, n); }
