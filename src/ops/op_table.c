/* The rows of the op table (op_table.h): name, backward function, autocast class; the
 * device column and its dispatch. */
#include <string.h>

#include "ops/op_table.h"

#define CT_OP_ROW_(N, n, ac) [CT_OP_##N] = {#n, ct_bw_##n, ac},
const ct_op_def ct_op_table[CT_OP_COUNT] = {CT_OP_LIST(CT_OP_ROW_)};
#undef CT_OP_ROW_

#define CT_OP_ROW_LP_(N, n, ac) [CT_OP_##N] = {#n, ct_bw_lowp, ac},
const ct_op_def ct_op_table_lp[CT_OP_COUNT] = {CT_OP_LIST(CT_OP_ROW_LP_)};
#undef CT_OP_ROW_LP_

/* A device backward the backend did not provide: the context fails (no host access to
 * device memory), naming the op and the device. */
static void bw_no_kernel(ct_ctx *ctx, ct_node *n) {
    char b[32];
    ct_ctx_fail(ctx, ct_error(CT_ERR_UNSUPPORTED, "%s backward on %s: no kernel for this op on the device yet", n->op->name,
                              ct_device_str(n->out->device, b, sizeof b)));
}

#define CT_OP_ROW_DEV_(N, n, ac) [CT_OP_##N] = {NULL, {#n, bw_no_kernel, ac}, 0, 0, 0},
ct_op_dev_entry ct_op_table_dev[CT_OP_COUNT] = {CT_OP_LIST(CT_OP_ROW_DEV_)};
#undef CT_OP_ROW_DEV_

#define CT_OP_ROW_DEV_LP_(N, n, ac) [CT_OP_##N] = {#n, ct_bw_lowp, ac},
const ct_op_def ct_op_table_dev_lp[CT_OP_COUNT] = {CT_OP_LIST(CT_OP_ROW_DEV_LP_)};
#undef CT_OP_ROW_DEV_LP_

void ct_op_register_device(ct_device_type type, int op, ct_op_dev_fwd fwd, ct_backward_fn bwd) {
    CT_CHECK(type == CT_DEV_CUDA && op >= 0 && op < CT_OP_COUNT, "ct_op_register_device: device type %d, op %d", (int)type, op);
    ct_op_table_dev[op].forward = fwd;
    if (bwd) ct_op_table_dev[op].row.backward = bwd;
}

void ct_op_device_reads_lowp(int op, unsigned in_mask, unsigned dtypes) {
    CT_CHECK(op >= 0 && op < CT_OP_COUNT && !(dtypes & ~((1u << CT_BF16) | (1u << CT_F16) | (1u << CT_F32))),
             "ct_op_device_reads_lowp: op %d, dtypes 0x%x", op, dtypes);
    ct_op_table_dev[op].lowp_in = in_mask;
    ct_op_table_dev[op].lowp_dt = dtypes;
}

void ct_op_device_grad_lowp(int op, unsigned dtypes) {
    CT_CHECK(op >= 0 && op < CT_OP_COUNT && !(dtypes & ~((1u << CT_BF16) | (1u << CT_F16))),
             "ct_op_device_grad_lowp: op %d, dtypes 0x%x", op, dtypes);
    ct_op_table_dev[op].lowp_grad_dt = dtypes;
}

static ct_tensor *dev_forward(ct_ctx *ctx, int op, const ct_op_args *a, ct_device d) {
    double t0;
    if (!ct_devprof_begin(d, &t0)) return ct_op_table_dev[op].forward(ctx, a);
    ct_tensor *y = ct_op_table_dev[op].forward(ctx, a);
    ct_devprof_end(d, ct_op_table_dev[op].row.name, false, t0);
    return y;
}

ct_tensor *ct_op_dispatch(ct_ctx *ctx, int op, const ct_op_args *a) {
    const char *name = ct_op_table_dev[op].row.name;
    ct_device d = CT_CPU;
    char b1[32], b2[32];
    ct_status st = ct_ctx_status(ctx);
    for (int i = 0; i < 4 && st == CT_OK; i++) {
        const ct_tensor *t = a->in[i];
        if (!t) continue;
        if (t->device.type != CT_DEV_CPU && d.type == CT_DEV_CPU) d = t->device;
        else if (!ct_device_eq(t->device, d) && t->device.type != CT_DEV_CPU)
            st = ct_error(CT_ERR_INVALID, "%s: inputs on %s and %s", name, ct_device_str(d, b1, sizeof b1),
                          ct_device_str(t->device, b2, sizeof b2));
    }
    for (int i = 0; i < 4 && st == CT_OK; i++)
        if (a->in[i] && a->in[i]->device.type == CT_DEV_CPU)
            st = ct_error(CT_ERR_INVALID, "%s: input %d is on cpu, another on %s (move it with ct_tensor_to)", name, i,
                          ct_device_str(d, b1, sizeof b1));
    if (st == CT_OK && !ct_op_table_dev[op].forward)
        st = ct_error(CT_ERR_UNSUPPORTED, "%s on %s: no kernel for this op on the device yet", name, ct_device_str(d, b1, sizeof b1));
    if (st == CT_OK) {
        /* cast and contiguous take no autocast on the CPU either (they are its tools) */
        if (op == CT_OP_CAST || op == CT_OP_CONTIGUOUS) return dev_forward(ctx, op, a, d);
        ct_op_args b = *a;
        ct_tensor **args[4];
        int n = 0;
        for (int i = 0; i < 4; i++)
            if (b.in[i]) args[n++] = &b.in[i];
        ct_ac_frame f;
        if (ct_ac_enter(ctx, op, &f, n, args)) return ct_ac_leave(ctx, &f, dev_forward(ctx, op, &b, d));
        return dev_forward(ctx, op, &b, d);
    }
    ct_ctx_fail(ctx, st);
    /* the placeholder: the first device input's shape, no data; the step is lost anyway */
    const ct_tensor *x = NULL;
    for (int i = 0; i < 4 && !x; i++)
        if (a->in[i] && a->in[i]->device.type != CT_DEV_CPU) x = a->in[i];
    ct_tensor *y = ct_wrap(ctx, x->dtype, NULL, x->ndim, x->shape);
    y->device = x->device;
    return y;
}

void ct_check_matmul(const ct_tensor *a, const ct_tensor *b, bool ta, bool tb, int64_t *M, int64_t *N, int64_t *K,
                     int64_t *batch) {
    CT_CHECK_CONTIG("matmul", a);
    CT_CHECK_CONTIG("matmul", b);
    char sa[96], sb[96];
    if (!((a->ndim == 2 && b->ndim == 2) || (a->ndim == 3 && b->ndim == 3 && a->shape[0] == b->shape[0])))
        CT_FATAL("matmul: need two 2-d or two 3-d (same batch) tensors, got %s and %s", ct_shape_str(a, sa, sizeof sa), ct_shape_str(b, sb, sizeof sb));
    int r = a->ndim - 2;
    *batch = a->ndim == 3 ? a->shape[0] : 1;
    *M = ta ? a->shape[r + 1] : a->shape[r];
    *K = ta ? a->shape[r] : a->shape[r + 1];
    int64_t Kb = tb ? b->shape[r + 1] : b->shape[r];
    *N = tb ? b->shape[r] : b->shape[r + 1];
    if (*K != Kb)
        CT_FATAL("matmul: inner dimensions differ (%lld vs %lld): %s%s @ %s%s", (long long)*K, (long long)Kb,
                 ct_shape_str(a, sa, sizeof sa), ta ? "^T" : "", ct_shape_str(b, sb, sizeof sb), tb ? "^T" : "");
}

void ct_check_add(const ct_tensor *a, const ct_tensor *b) {
    CT_CHECK_F32("add", a); CT_CHECK_F32("add", b);
    ct_check_add_shapes(a, b);
}
void ct_check_add_shapes(const ct_tensor *a, const ct_tensor *b) {
    CT_CHECK_CONTIG("add", a); CT_CHECK_CONTIG("add", b);
    bool ok = b->ndim <= a->ndim;
    for (int i = 0; ok && i < b->ndim; i++) ok = b->shape[b->ndim - 1 - i] == a->shape[a->ndim - 1 - i];
    if (!ok) {
        char sa[96], sb[96];
        CT_FATAL("add: shape %s cannot broadcast to %s", ct_shape_str(b, sb, sizeof sb), ct_shape_str(a, sa, sizeof sa));
    }
}

void ct_check_linear(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, int64_t *rows, int64_t *in, int64_t *out) {
    CT_CHECK_CONTIG("linear", x);
    char sx[96], sw[96];
    *in = x->shape[x->ndim - 1];
    if (w->ndim != 2 || w->shape[1] != *in || x->ndim < 1)
        CT_FATAL("linear: input %s does not match weight %s", ct_shape_str(x, sx, sizeof sx), ct_shape_str(w, sw, sizeof sw));
    *out = w->shape[0];
    *rows = *in ? ct_numel(x) / *in : 0;
    if (b && (b->ndim != 1 || b->shape[0] != *out))
        CT_FATAL("linear: bias %s does not match weight %s", ct_shape_str(b, sx, sizeof sx), ct_shape_str(w, sw, sizeof sw));
}

void ct_check_conv2d(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, int stride, int padding, int64_t *OH,
                     int64_t *OW) {
    CT_CHECK_F32("conv2d", x); CT_CHECK_F32("conv2d", w);
    if (b) CT_CHECK_F32("conv2d", b);
    ct_check_conv2d_shapes(x, w, b, stride, padding, OH, OW);
}
void ct_check_conv2d_shapes(const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, int stride, int padding, int64_t *OH,
                            int64_t *OW) {
    CT_CHECK_CONTIG("conv2d", x); CT_CHECK_CONTIG("conv2d", w);
    char sx[96], sw[96];
    if (x->ndim != 4 || w->ndim != 4 || x->shape[1] != w->shape[1])
        CT_FATAL("conv2d: input %s and weight %s: need [N, C, H, W] and [O, C, kh, kw]", ct_shape_str(x, sx, sizeof sx),
                 ct_shape_str(w, sw, sizeof sw));
    CT_CHECK(stride >= 1 && padding >= 0, "conv2d: stride %d, padding %d", stride, padding);
    if (x->shape[2] + 2 * padding < w->shape[2] || x->shape[3] + 2 * padding < w->shape[3])
        CT_FATAL("conv2d: kernel of %s larger than padded input %s", ct_shape_str(w, sw, sizeof sw), ct_shape_str(x, sx, sizeof sx));
    if (b) {
        CT_CHECK_CONTIG("conv2d", b);
        if (b->ndim != 1 || b->shape[0] != w->shape[0])
            CT_FATAL("conv2d: bias %s does not match weight %s", ct_shape_str(b, sx, sizeof sx), ct_shape_str(w, sw, sizeof sw));
    }
    *OH = (x->shape[2] + 2 * padding - w->shape[2]) / stride + 1;
    *OW = (x->shape[3] + 2 * padding - w->shape[3]) / stride + 1;
}

void ct_check_pool2d(const char *op, const ct_tensor *x, int kernel, int *stride, int padding, int64_t *OH, int64_t *OW) {
    CT_CHECK_F32(op, x);
    ct_check_pool2d_shapes(op, x, kernel, stride, padding, OH, OW);
}
void ct_check_pool2d_shapes(const char *op, const ct_tensor *x, int kernel, int *stride, int padding, int64_t *OH,
                            int64_t *OW) {
    char sx[96];
    CT_CHECK_CONTIG(op, x);
    if (x->ndim != 4) CT_FATAL("%s: input must be [N, C, H, W], got %s", op, ct_shape_str(x, sx, sizeof sx));
    if (*stride <= 0) *stride = kernel; /* PyTorch: stride defaults to kernel_size */
    CT_CHECK(kernel >= 1 && padding >= 0 && 2 * padding <= kernel,
             "%s: kernel %d, padding %d (padding must be at most half the kernel)", op, kernel, padding);
    if (x->shape[2] + 2 * padding < kernel || x->shape[3] + 2 * padding < kernel)
        CT_FATAL("%s: kernel %d larger than padded input %s", op, kernel, ct_shape_str(x, sx, sizeof sx));
    *OH = (x->shape[2] + 2 * padding - kernel) / *stride + 1;
    *OW = (x->shape[3] + 2 * padding - kernel) / *stride + 1;
}

void ct_check_bias_add(const ct_tensor *x, const ct_tensor *b, int64_t *N, int64_t *C, int64_t *inner) {
    CT_CHECK_F32("bias_add", x); CT_CHECK_F32("bias_add", b);
    ct_check_bias_add_shapes(x, b, N, C, inner);
}
void ct_check_pad_rows(const ct_tensor *x, int64_t rows, int64_t *shape) {
    char b[96];
    if (x->ndim < 1 || rows < 0) CT_FATAL("pad_rows: %lld rows after %s", (long long)rows, ct_shape_str(x, b, sizeof b));
    CT_CHECK_CONTIG("pad_rows", x);
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    shape[0] += rows;
}
void ct_check_bias_add_shapes(const ct_tensor *x, const ct_tensor *b, int64_t *N, int64_t *C, int64_t *inner) {
    CT_CHECK_CONTIG("bias_add", x); CT_CHECK_CONTIG("bias_add", b);
    if (x->ndim < 2 || b->ndim != 1 || b->shape[0] != x->shape[1]) {
        char sx[96], sb[96];
        CT_FATAL("bias_add: bias %s does not match dim 1 of %s", ct_shape_str(b, sb, sizeof sb), ct_shape_str(x, sx, sizeof sx));
    }
    *N = x->shape[0];
    *C = x->shape[1];
    *inner = *N * *C > 0 ? ct_numel(x) / (*N * *C) : 0;
}

void ct_check_rope_shapes(const ct_tensor *x, const ct_tensor *pos, float theta, int64_t *R, int64_t *T, int64_t *D) {
    char sx[96], sp[96];
    CT_CHECK_CONTIG("rope", x);
    if (x->ndim < 2 || x->shape[x->ndim - 1] % 2)
        CT_FATAL("rope: input %s must be [..., T, D] with D even", ct_shape_str(x, sx, sizeof sx));
    *T = x->shape[x->ndim - 2];
    *D = x->shape[x->ndim - 1];
    *R = *T > 0 && *D > 0 ? ct_numel(x) / (*T * *D) : 0;
    if (pos) {
        CT_CHECK_CONTIG("rope", pos);
        if ((pos->dtype != CT_I32 && pos->dtype != CT_I64) || pos->ndim != 1 || pos->shape[0] != *T)
            CT_FATAL("rope: positions %s must be [T] i32/i64 for input %s", ct_shape_str(pos, sp, sizeof sp),
                     ct_shape_str(x, sx, sizeof sx));
    }
    CT_CHECK(theta > 0, "rope: theta %g must be positive", (double)theta);
}

/* gqa: k and v may have KV heads, KV dividing q's H */
static void check_attention(const char *op, const ct_tensor *q, const ct_tensor *k, const ct_tensor *v, bool gqa) {
    const ct_tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++) { CT_CHECK_F32(op, in[i]); CT_CHECK_CONTIG(op, in[i]); }
    char s1[96], s2[96], s3[96];
    bool heads = q->ndim == 4 && k->ndim == 4 &&
                 (gqa ? k->shape[1] >= 1 && q->shape[1] % k->shape[1] == 0 : q->shape[1] == k->shape[1]);
    if (!heads || v->ndim != 4 || q->shape[0] != k->shape[0] || q->shape[3] != k->shape[3] || v->shape[0] != k->shape[0] ||
        v->shape[1] != k->shape[1] || v->shape[2] != k->shape[2])
        CT_FATAL("%s: q %s, k %s, v %s: need [B, H, Tq, D], [B, %s, Tk, D], [B, %s, Tk, Dv]", op, ct_shape_str(q, s1, sizeof s1),
                 ct_shape_str(k, s2, sizeof s2), ct_shape_str(v, s3, sizeof s3), gqa ? "KV | H" : "H", gqa ? "KV" : "H");
}
void ct_check_attention(const char *op, const ct_tensor *q, const ct_tensor *k, const ct_tensor *v) {
    check_attention(op, q, k, v, false);
}
void ct_check_attention_gqa(const char *op, const ct_tensor *q, const ct_tensor *k, const ct_tensor *v) {
    check_attention(op, q, k, v, true);
}
