/* More of the op table's CUDA column (ops.c has the rest): bias_add, softmax, log_softmax,
 * mse_loss (these four on f32, bf16 or f16 inputs: autocast hands them its low-precision
 * tensors), plain (materialised) attention and cast. Same checks, shapes, saved values and
 * node fields as the CPU ops, so that a node's backward reads what its forward kept.
 *
 * attention materialises the scores P [B*H, Tq, Tk] as the CPU op does: one batched cuBLASLt
 * GEMM per product over all heads, the masked row softmax of softmax.cu in place, P saved for
 * backward. The GEMMs compute the full square also for causal heads (the masked entries are
 * then written 0): the CPU op's skipping of the upper triangle is a cost saving, not a
 * different result. */
#include <math.h>
#include <string.h>

#include "ctrain/ops.h"
#include "cuda/cuda_internal.h"
#include "cuda/ops_util.h"

/* ---- bias_add: x [N, C, ...] + b [C]; f32, bf16 or f16 each, y of their dtype when they
 * have one, else f32 (autocast's promotion). Backward reads only the f32 gradient. ---- */
static ct_tensor *fwd_bias_add(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0], *b = a->in[1];
    int64_t N, C, inner;
    check_float("bias_add", x);
    check_float("bias_add", b);
    ct_check_bias_add_shapes(x, b, &N, &C, &inner);
    run r;
    bool go = begin(ctx, x->device, "bias_add", &r);
    ct_tensor *y = x->dtype == b->dtype ? out_same(&r, x, x->ndim, NULL, "bias_add") : out_like(&r, x, x->ndim, NULL, "bias_add");
    if (go && y->data) ok(&r, ct_cuda_bias_add_t(r.s, x->data, ty(x), b->data, ty(b), y->data, ct_numel(x), C, inner));
    ct_node *nd = ct_record(ctx, CT_OP_BIAS_ADD, y, 2, (ct_tensor *[]){x, b});
    if (nd) { nd->i[0] = N; nd->i[1] = C; nd->i[2] = inner; }
    return y;
}
static void bw_bias_add(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "bias_add backward", &r)) return;
    int64_t N = n->i[0], C = n->i[1], inner = n->i[2];
    const float *g = n->out->grad->data;
    acc_add(&r, n->in[0], g);
    if (!(n->in[1]->flags & CT_TF_REQUIRES_GRAD) || N * C * inner == 0) return;
    if (inner == 1) { acc_colsum(&r, n->in[1], g, N, C); return; }
    /* sums over inner first (a GEMM with a column of ones), then over N */
    float *ones = scratch(&r, inner, "bias_add backward"), *part = scratch(&r, N * C, "bias_add backward");
    if (ones && part && ok(&r, ct_cuda_fill(r.s, ones, 1.0f, inner)) &&
        gemm(&r, false, false, N * C, 1, inner, 1, g, ones, part, 0.0f, NULL))
        acc_colsum(&r, n->in[1], part, N, C);
}

/* ---- softmax, log_softmax over the last dim: x f32, bf16 or f16, y f32 (f32 ops under
 * autocast); backward reads y and its gradient, not x ---- */
static ct_tensor *softmax_fwd(ct_ctx *ctx, ct_tensor *x, int op) {
    const char *name = ct_op_table_dev[op].row.name;
    check_float(name, x); CT_CHECK_CONTIG(name, x);
    int64_t D = x->ndim ? x->shape[x->ndim - 1] : 1, R = D ? ct_numel(x) / D : 0;
    run r;
    bool go = begin(ctx, x->device, name, &r);
    ct_tensor *y = out_like(&r, x, x->ndim, NULL, name);
    if (go && y->data) ok(&r, ct_cuda_softmax_t(r.s, x->data, ty(x), y->data, R, D, op == CT_OP_LOG_SOFTMAX, 0));
    ct_node *nd = ct_record(ctx, op, y, 1, &x);
    if (nd) nd->i[0] = D;
    return y;
}
static ct_tensor *fwd_softmax(ct_ctx *ctx, const ct_op_args *a) { return softmax_fwd(ctx, a->in[0], CT_OP_SOFTMAX); }
static ct_tensor *fwd_log_softmax(ct_ctx *ctx, const ct_op_args *a) { return softmax_fwd(ctx, a->in[0], CT_OP_LOG_SOFTMAX); }
static void bw_softmax(ct_ctx *ctx, ct_node *n) {
    run r;
    bool direct;
    float *w = acc_begin_in0(ctx, n, n->op->name, &r, &direct);
    if (!w) return;
    int64_t D = n->i[0], R = D ? ct_numel(n->out) / D : 0;
    bool log_out = n->op == &ct_op_table_dev[CT_OP_LOG_SOFTMAX].row;
    ok(&r, ct_cuda_softmax_bwd(r.s, n->out->data, n->out->grad->data, w, R, D, log_out));
    acc_end(&r, n->in[0], w, direct);
}

/* ---- mse_loss (mean): x and t f32, bf16 or f16 each, read as they are forward and
 * backward; the loss and the gradients f32 ---- */
static ct_tensor *fwd_mse_loss(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0], *t = a->in[1];
    check_float("mse_loss", x); check_float("mse_loss", t);
    CT_CHECK_CONTIG("mse_loss", x); CT_CHECK_CONTIG("mse_loss", t);
    CT_CHECK_SAME_SHAPE("mse_loss", x, t);
    int64_t n = ct_numel(x);
    run r;
    bool go = begin(ctx, x->device, "mse_loss", &r);
    ct_tensor *y = out_like(&r, x, 0, NULL, "mse_loss");
    if (go && y->data) ok(&r, ct_cuda_mse_t(r.s, x->data, ty(x), t->data, ty(t), n, y->data));
    ct_node *nd = ct_record(ctx, CT_OP_MSE_LOSS, y, 2, (ct_tensor *[]){x, t});
    if (nd) nd->i[0] = n;
    return y;
}
static void bw_mse_loss(ct_ctx *ctx, ct_node *n) {
    run r;
    int64_t N = n->i[0];
    if (N == 0 || !begin(ctx, n->out->device, "mse_loss backward", &r)) return;
    /* one input at a time: mse_loss(x, x) gives both contributions to one gradient */
    for (int k = 0; k < 2; k++) {
        bool direct;
        float *w = acc_begin(&r, n->in[k], &direct);
        if (!w) continue;
        const ct_tensor *a = n->in[0], *b = n->in[1];
        ok(&r, ct_cuda_mse_bwd_t(r.s, a->data, ty(a), b->data, ty(b), N, n->out->grad->data, k == 0 ? w : NULL, k == 1 ? w : NULL));
        acc_end(&r, n->in[k], w, direct);
    }
}

/* ---- attention: q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv] ---- */
static ct_tensor *fwd_attention(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *q = a->in[0], *k = a->in[1], *v = a->in[2];
    ct_check_attention("attention", q, k, v);
    bool causal = a->i[0] != 0;
    int64_t BH = q->shape[0] * q->shape[1], Tq = q->shape[2], Tk = k->shape[2], D = q->shape[3], Dv = v->shape[3];
    float scale = D ? 1.0f / sqrtf((float)D) : 1.0f; /* as the CPU op */
    run r;
    bool go = begin(ctx, q->device, "attention", &r);
    ct_tensor *y = out_like(&r, q, 4, (int64_t[]){q->shape[0], q->shape[1], Tq, Dv}, "attention");
    float *P = scratch(&r, BH * Tq * Tk, "attention");
    if (go && y->data && P && gemm_scaled(&r, false, true, Tq, Tk, D, BH, scale, q->data, k->data, P, 0.0f, NULL) &&
        ok(&r, ct_cuda_softmax(r.s, P, P, BH * Tq, Tk, false, causal ? Tq : 0)))
        gemm(&r, false, false, Tq, Dv, Tk, BH, P, v->data, y->data, 0.0f, NULL);
    ct_node *nd = ct_record(ctx, CT_OP_ATTENTION, y, 3, (ct_tensor *[]){q, k, v});
    if (nd) { nd->saved = P; nd->i[0] = causal; nd->f[0] = scale; }
    return y;
}
/* the beta of a GEMM into t's gradient: 0 when fresh. Asked just before each GEMM, so that
 * attention(x, x, x) accumulates its three products into one gradient in order. */
static float *grad_for(run *r, ct_tensor *t, float *beta) {
    bool fresh;
    float *g = ct_grad_acc_fresh(r->ctx, t, &fresh);
    *beta = fresh ? 0.0f : 1.0f;
    return g;
}
static void bw_attention(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "attention backward", &r)) return;
    ct_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    int64_t BH = q->shape[0] * q->shape[1], Tq = q->shape[2], Tk = k->shape[2], D = q->shape[3], Dv = v->shape[3];
    const float *P = n->saved, *dO = n->out->grad->data;
    float beta, *d;
    if ((d = grad_for(&r, v, &beta))) /* dV = P^T dO */
        gemm(&r, true, false, Tk, Dv, Tq, BH, P, dO, d, beta, NULL);
    if (!((q->flags | k->flags) & CT_TF_REQUIRES_GRAD)) return;
    float *dS = scratch(&r, BH * Tq * Tk, "attention backward");
    if (!dS || !gemm(&r, false, true, Tq, Tk, Dv, BH, dO, v->data, dS, 0.0f, NULL) || /* dP = dO V^T */
        !ok(&r, ct_cuda_attention_ds(r.s, P, dS, BH * Tq, Tk, Tq, n->i[0] != 0, (float)n->f[0])))
        return;
    if ((d = grad_for(&r, q, &beta))) /* dQ = dS K */
        gemm(&r, false, false, Tq, D, Tk, BH, dS, k->data, d, beta, NULL);
    if ((d = grad_for(&r, k, &beta))) /* dK = dS^T Q */
        gemm(&r, true, false, Tk, D, Tq, BH, dS, q->data, d, beta, NULL);
}

/* ---- cast between f32, bf16 and f16 ---- */
static ct_tensor *fwd_cast(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0];
    ct_dtype dt = (ct_dtype)a->i[0];
    if (x->dtype == dt) return x;
    bool fl = x->dtype == CT_F32 || x->dtype == CT_BF16 || x->dtype == CT_F16;
    CT_CHECK(fl && (dt == CT_F32 || dt == CT_BF16 || dt == CT_F16),
             "cast on cuda:%d: %s -> %s is not a float conversion ctrain supports (f32, bf16, f16)", x->device.index,
             ct_dtype_name(x->dtype), ct_dtype_name(dt));
    if (!ct_is_contiguous(x)) x = ct_contiguous(ctx, x); /* as the CPU op (f32 views only on the device) */
    run r;
    bool go = begin(ctx, x->device, "cast", &r);
    ct_tensor *y = ct_new_on(ctx, x->device, dt, x->ndim, x->shape, "cast");
    if (go && y->data) ok(&r, ct_cuda_cast(r.s, x->data, ct_cuda_cast_type_of(x->dtype), y->data, ct_cuda_cast_type_of(dt), ct_numel(x)));
    ct_record(ctx, CT_OP_CAST, y, 1, &x);
    return y;
}
static void bw_cast(ct_ctx *ctx, ct_node *n) {
    run r;
    bool direct;
    float *w = acc_begin_in0(ctx, n, "cast backward", &r, &direct);
    if (!w) return;
    /* a gradient that came in the low precision holds those values already: widened (exact) */
    if (grad_lowp(n->out)) ok(&r, ct_cuda_cast(r.s, n->out->grad->data, ty(n->out->grad), w, CT_CUDA_CAST_F32, ct_numel(n->out)));
    else ok(&r, ct_cuda_cast_bwd(r.s, n->out->grad->data, ct_cuda_cast_type_of(n->out->dtype), w, ct_numel(n->out)));
    acc_end(&r, n->in[0], w, direct);
}

void ct_cuda_register_ops_more_(void) {
    static const struct { int op; ct_op_dev_fwd fwd; ct_backward_fn bwd; } rows[] = {
        {CT_OP_BIAS_ADD, fwd_bias_add, bw_bias_add},
        {CT_OP_SOFTMAX, fwd_softmax, bw_softmax},
        {CT_OP_LOG_SOFTMAX, fwd_log_softmax, bw_softmax},
        {CT_OP_MSE_LOSS, fwd_mse_loss, bw_mse_loss},
        {CT_OP_ATTENTION, fwd_attention, bw_attention},
        {CT_OP_CAST, fwd_cast, bw_cast},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) ct_op_register_device(CT_DEV_CUDA, rows[i].op, rows[i].fwd, rows[i].bwd);
    /* inputs read in bf16/f16 as they are (see ops.c's table). The f32 bit is the run of the f32
     * ops (softmax, log_softmax, mse_loss) and of bias_add's mixed inputs; the bf16/f16 bits
     * are both bias_add's one-type runs and the input dtypes autocast hands over uncopied. */
    const unsigned lp = (1u << CT_BF16) | (1u << CT_F16), f32 = 1u << CT_F32;
    ct_op_device_reads_lowp(CT_OP_BIAS_ADD, 3u, lp | f32);
    ct_op_device_reads_lowp(CT_OP_SOFTMAX, 1u, lp | f32);
    ct_op_device_reads_lowp(CT_OP_LOG_SOFTMAX, 1u, lp | f32);
    ct_op_device_reads_lowp(CT_OP_MSE_LOSS, 3u, lp | f32);
    /* a cast to bf16/f16 takes its output's gradient in that type (the weights' and the layer
     * norms' casts under autocast, whose gradients the linears then write in it) */
    if (ct_cuda_lowp_grads_()) ct_op_device_grad_lowp(CT_OP_CAST, lp);
}
