/* The op table's device column for CUDA: forwards and backwards of the ops that have
 * kernels here (linear, matmul, add, mul, relu, gelu, tanh, sigmoid, dropout, scale, sum, mean,
 * cross-entropy, layer norm, embedding, contiguous, silu, split/merge heads, and
 * the backwards of the views reshape, transpose and slice), through ops_more.c, bias_add,
 * softmax, log_softmax, mse_loss, plain attention and cast (those six built and compiled but
 * not yet run on a GPU), through ops_llama.c rms_norm, rope and repeat_kv, and through
 * ops_attention.c the fused attentions. Most read bf16/f16 inputs themselves under autocast (the lowp[]
 * table at the end; docs/gpu.md "Autocast on a GPU"). Shared helpers: ops_util.h. Each checks shapes like its CPU op,
 * launches on the device's compute stream and records the same node fields; a failed call
 * fails the context (ct_ctx_status) and the op returns a placeholder. The autograd walk is
 * core's: these are rows of the same table, not a second engine.
 *
 * Gradients: GEMMs accumulate into an existing gradient with beta = 1; kernels that write
 * their result (dx =) write a fresh gradient directly, otherwise a scratch buffer that is
 * then added. Scratch lives until ct_ctx_reset (like the step's activations). */
#include <string.h>

#include "core/kernel.h"
#include "ctrain/config.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"
#include "cuda/ops_util.h"
#include "ops/op_table.h"

/* Linear and matmul take f32 operands, or all bf16 or all f16 ones: autocast's low-precision
 * run hands them its rounded tensors directly (src/ops/autocast.c) instead of f32 copies.
 * Then the GEMMs read bf16/f16 with an f32 result (exact products, f32 sums), which autocast
 * rounds to the low-precision output; backward gets the output's gradient already rounded to
 * the output's precision and reads a copy of it in that precision. */
static ct_cuda_dtype gemm_operands(const char *op, const ct_tensor *a, const ct_tensor *b, const ct_tensor *c) {
    check_float(op, a);
    CT_CHECK(b->dtype == a->dtype && (!c || c->dtype == a->dtype), "%s on cuda:%d: %s and %s operands", op, a->device.index,
             ct_dtype_name(a->dtype), ct_dtype_name(b->dtype == a->dtype && c ? c->dtype : b->dtype));
    return gemm_dt(a);
}

/* ---- linear: y = x W^T + b ---- */
/* whether a GEMM op on x's bf16/f16 runs under autocast in that dtype, which takes its result
 * in that dtype (elsewhere such an op gives f32) */
static bool lowp_result(ct_ctx *ctx, const ct_tensor *x) {
    return (x->dtype == CT_BF16 || x->dtype == CT_F16) && ct_ctx_lowp_run_(ctx) == x->dtype;
}
static ct_tensor *fwd_linear(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0], *w = a->in[1], *b = a->in[2];
    int64_t rows, in, out, shape[CT_MAX_DIMS];
    ct_cuda_dtype dt = gemm_operands("linear", x, w, b);
    bool lp = dt != CT_CUDA_F32;
    ct_check_linear(x, w, b, &rows, &in, &out);
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = out;
    run r;
    bool go = begin(ctx, x->device, "linear", &r);
    /* under autocast the result in its bf16/f16 straight from the GEMM: the bias added to the f32
     * sums by the epilogue, then rounded once as stored (the values autocast's rounding of an f32
     * result gives, without that result, its bias pass and its rounding pass) */
    const bool y_lowp = lp && lowp_result(ctx, x) && (!b || b->dtype == x->dtype);
    ct_tensor *y = y_lowp ? out_same(&r, x, x->ndim, shape, "linear") : out_like(&r, x, x->ndim, shape, "linear");
    if (go && y->data && y_lowp)
        gemm_to(&r, dt, true, false, true, rows, out, in, 1, 1.0f, x->data, w->data, y->data, 0.0f, b ? b->data : NULL);
    else if (go && y->data && !lp) gemm(&r, false, true, rows, out, in, 1, x->data, w->data, y->data, 0.0f, b ? b->data : NULL);
    else if (go && y->data && lp && gemm_any(&r, dt, false, true, rows, out, in, 1, 1.0f, x->data, w->data, y->data, 0.0f, NULL) && b) {
        /* the bias added to the f32 sums, as the CPU op does (its low-precision values widened exactly) */
        float *b32 = scratch(&r, out, "linear");
        if (b32 && ok(&r, ct_cuda_cast(r.s, b->data, ty(b), b32, CT_CUDA_CAST_F32, out)))
            ok(&r, ct_cuda_bias_add(r.s, y->data, b32, y->data, rows * out, out, 1));
    }
    ct_node *n = ct_record(ctx, CT_OP_LINEAR, y, b ? 3 : 2, (ct_tensor *[]){x, w, b});
    if (n) { n->i[0] = rows; n->i[1] = in; n->i[2] = out; }
    return y;
}
static void bw_linear(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "linear backward", &r)) return;
    int64_t rows = n->i[0], in = n->i[1], out = n->i[2];
    ct_cuda_dtype dt = gemm_dt(n->in[0]);
    const void *g = gemm_dy(&r, dt, n->out, rows * out, "linear backward");
    if (!g) return;
    /* dX and dW in the inputs' bf16/f16 where they take it (a cast's or GELU's output), else f32
     * (each written before the next is asked for: a tensor that is both adds to the first) */
    grad_out dX = grad_for_gemm(&r, n->in[0]);
    if (dX.p) gemm_grad(&r, dt, &dX, false, false, rows, in, out, 1, g, n->in[1]->data);
    grad_out dW = grad_for_gemm(&r, n->in[1]);
    if (dW.p) gemm_grad(&r, dt, &dW, true, false, out, in, rows, 1, g, n->in[0]->data);
    if (n->nin > 2) acc_colsum_t(&r, dt, n->in[2], g, rows, out);
}

/* ---- matmul: two 2-d, or two 3-d with the same batch (as the CPU op) ---- */
static ct_tensor *fwd_matmul(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *A = a->in[0], *B = a->in[1];
    bool ta = a->i[0], tb = a->i[1];
    int64_t M, N, K, batch;
    ct_cuda_dtype dt = gemm_operands("matmul", A, B, NULL);
    ct_check_matmul(A, B, ta, tb, &M, &N, &K, &batch);
    int64_t shape[3] = {batch, M, N};
    run r;
    bool go = begin(ctx, A->device, "matmul", &r);
    const bool c_lowp = dt != CT_CUDA_F32 && lowp_result(ctx, A); /* as linear's */
    const int64_t *cs = A->ndim == 3 ? shape : shape + 1;
    ct_tensor *c = c_lowp ? out_same(&r, A, A->ndim, cs, "matmul") : out_like(&r, A, A->ndim, cs, "matmul");
    if (go && c->data) gemm_to(&r, dt, c_lowp, ta, tb, M, N, K, batch, 1.0f, A->data, B->data, c->data, 0.0f, NULL);
    ct_node *n = ct_record(ctx, CT_OP_MATMUL, c, 2, (ct_tensor *[]){A, B});
    if (n) { n->i[0] = ta; n->i[1] = tb; n->i[2] = M; n->i[3] = N; n->i[4] = K; n->i[5] = batch; }
    return c;
}
static void bw_matmul(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "matmul backward", &r)) return;
    bool ta = n->i[0], tb = n->i[1];
    int64_t M = n->i[2], N = n->i[3], K = n->i[4], batch = n->i[5];
    ct_cuda_dtype lp = gemm_dt(n->in[0]);
    const void *A = n->in[0]->data, *B = n->in[1]->data, *dC = gemm_dy(&r, lp, n->out, M * N * batch, "matmul backward");
    if (!dC) return;
    grad_out dA = grad_for_gemm(&r, n->in[0]);
    if (dA.p) { /* the CPU op's formulas (src/ops/cpu/gemm.c), batched */
        if (!ta) gemm_grad(&r, lp, &dA, false, !tb, M, K, N, batch, dC, B);
        else gemm_grad(&r, lp, &dA, tb, true, K, M, N, batch, B, dC);
    }
    grad_out dB = grad_for_gemm(&r, n->in[1]);
    if (dB.p) {
        if (!tb) gemm_grad(&r, lp, &dB, !ta, false, K, N, M, batch, A, dC);
        else gemm_grad(&r, lp, &dB, true, ta, N, K, M, batch, dC, A);
    }
}

/* y = x + b (b repeating over x's leading dims) or x * b (same shapes), recorded as op; x and b
 * f32, bf16 or f16, y of their dtype where they share one, else f32 (autocast's promotion) */
static ct_tensor *binary(ct_ctx *ctx, ct_tensor *x, ct_tensor *b, int op, const char *name) {
    check_float(name, x);
    check_float(name, b);
    run r;
    bool go = begin(ctx, x->device, name, &r);
    ct_tensor *y = x->dtype == b->dtype ? out_same(&r, x, x->ndim, NULL, name) : out_like(&r, x, x->ndim, NULL, name);
    int64_t n = ct_numel(x);
    if (go && y->data && n > 0)
        ok(&r, ct_cuda_binary(r.s, op == CT_OP_MUL, x->data, ty(x), b->data, ty(b), y->data, n, ct_numel(b)));
    ct_record(ctx, op, y, 2, (ct_tensor *[]){x, b});
    return y;
}

/* ---- add with trailing broadcast ---- */
static ct_tensor *fwd_add(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0], *b = a->in[1];
    ct_check_add_shapes(x, b);
    return binary(ctx, x, b, CT_OP_ADD, "add");
}
static void bw_add(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "add backward", &r)) return;
    const float *g = n->out->grad->data;
    int64_t N = ct_numel(n->out), m = ct_numel(n->in[1]);
    if (m == N) acc_add_t(&r, n->in[1], g);
    else if (m > 0) acc_colsum(&r, n->in[1], g, N / m, m);
    /* an f32 a without a gradient yet (a residual stream's) takes the output's gradient buffer
     * itself, after b has read it: no copy, the same values */
    if (n->in[0]->dtype == CT_F32 && n->out->grad->dtype == CT_F32 && ct_grad_handoff_(ctx, n->out, n->in[0])) return;
    acc_add_t(&r, n->in[0], g);
}

/* ---- relu, gelu, tanh, sigmoid, scale: f32, bf16 or f16 in and out (f32 arithmetic) ---- */
static ct_cuda_map map_of(int op, int64_t i0, double f0) {
    ct_cuda_map m = {CT_CUDA_MAP_SCALE, (float)f0, 0, 0};
    if (op == CT_OP_RELU) m.op = CT_CUDA_MAP_RELU;
    else if (op == CT_OP_GELU) m.op = i0 ? CT_CUDA_MAP_GELU_TANH : CT_CUDA_MAP_GELU;
    else if (op == CT_OP_TANH) m.op = CT_CUDA_MAP_TANH;
    else if (op == CT_OP_SIGMOID) m.op = CT_CUDA_MAP_SIGMOID;
    else if (op == CT_OP_SILU) m.op = CT_CUDA_MAP_SILU;
    return m;
}
/* the op of a node recorded by this column */
static int op_of(const ct_node *n) {
    for (int i = 0; i < CT_OP_COUNT; i++)
        if (n->op == &ct_op_table_dev[i].row) return i;
    return -1;
}
static ct_tensor *unary(ct_ctx *ctx, const ct_op_args *a, int op, const char *name) {
    ct_tensor *x = a->in[0];
    check_float(name, x); CT_CHECK_CONTIG(name, x);
    run r;
    bool go = begin(ctx, x->device, name, &r);
    ct_tensor *y = out_same(&r, x, x->ndim, NULL, name);
    ct_cuda_map m = map_of(op, a->i[0], a->f[0]);
    if (go && y->data) ok(&r, ct_cuda_map_fwd(r.s, &m, x->data, y->data, ty(x), ct_numel(x)));
    ct_node *nd = ct_record(ctx, op, y, 1, &x);
    if (nd) { nd->i[0] = a->i[0]; nd->f[0] = a->f[0]; }
    return y;
}
static ct_tensor *fwd_relu(ct_ctx *ctx, const ct_op_args *a) { return unary(ctx, a, CT_OP_RELU, "relu"); }
static ct_tensor *fwd_gelu(ct_ctx *ctx, const ct_op_args *a) { return unary(ctx, a, CT_OP_GELU, "gelu"); }
static ct_tensor *fwd_scale(ct_ctx *ctx, const ct_op_args *a) { return unary(ctx, a, CT_OP_SCALE, "scale"); }
static ct_tensor *fwd_tanh(ct_ctx *ctx, const ct_op_args *a) { return unary(ctx, a, CT_OP_TANH, "tanh"); }
static ct_tensor *fwd_sigmoid(ct_ctx *ctx, const ct_op_args *a) { return unary(ctx, a, CT_OP_SIGMOID, "sigmoid"); }
static ct_tensor *fwd_silu(ct_ctx *ctx, const ct_op_args *a) { return unary(ctx, a, CT_OP_SILU, "silu"); }
static void bw_unary(ct_ctx *ctx, ct_node *n) {
    run r;
    bool direct = true;
    ct_tensor *x = n->in[0];
    if (!begin(ctx, n->out->device, n->op->name, &r)) return;
    /* the gradients in x's bf16/f16 where they come so and x takes one (GELU between two bf16
     * linears), else f32 */
    void *lw = ct_ac_grad_lowp(ctx, x);
    float *w = lw ? NULL : acc_begin(&r, x, &direct);
    if (!lw && !w) return;
    int op = op_of(n);
    ct_cuda_map m = map_of(op, n->i[0], n->f[0]);
    /* gelu's and silu's derivatives read their input, the others' their output (scale reads neither) */
    const ct_tensor *v = op == CT_OP_GELU || op == CT_OP_SILU ? x : n->out;
    ok(&r, ct_cuda_map_bwd_t(r.s, &m, v->data, ty(v), n->out->grad->data, grad_lowp(n->out), lw ? lw : (void *)w, lw != NULL,
                             ct_numel(n->out)));
    if (w) acc_end(&r, x, w, direct);
}

/* ---- dropout (training, p > 0: the CPU entry returns x otherwise): the CPU op's mask ---- */
static ct_tensor *fwd_dropout(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0];
    check_float("dropout", x); CT_CHECK_CONTIG("dropout", x);
    float p = (float)a->f[0], scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; /* as the CPU op */
    uint64_t key = ct_ctx_dropout_key(ctx);
    run r;
    bool go = begin(ctx, x->device, "dropout", &r);
    ct_tensor *y = out_same(&r, x, x->ndim, NULL, "dropout");
    ct_cuda_map m = {CT_CUDA_MAP_DROPOUT, scale, key, p};
    if (go && y->data) ok(&r, ct_cuda_map_fwd(r.s, &m, x->data, y->data, ty(x), ct_numel(x)));
    ct_node *nd = ct_record(ctx, CT_OP_DROPOUT, y, 1, &x);
    if (nd) { nd->i[0] = (int64_t)key; nd->f[0] = p; nd->f[1] = scale; }
    return y;
}
static void bw_dropout(ct_ctx *ctx, ct_node *n) {
    run r;
    bool direct;
    float *w = acc_begin_in0(ctx, n, "dropout backward", &r, &direct);
    if (!w) return;
    ok(&r, ct_cuda_dropout(r.s, n->out->grad->data, w, ct_numel(n->out), (uint64_t)n->i[0], (float)n->f[0], (float)n->f[1]));
    acc_end(&r, n->in[0], w, direct);
}

/* ---- mul: same shapes ---- */
static ct_tensor *fwd_mul(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0], *b = a->in[1];
    CT_CHECK_CONTIG("mul", x); CT_CHECK_CONTIG("mul", b);
    CT_CHECK_SAME_SHAPE("mul", x, b);
    return binary(ctx, x, b, CT_OP_MUL, "mul");
}
static void bw_mul(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "mul backward", &r)) return;
    const float *g = n->out->grad->data;
    int64_t N = ct_numel(n->out);
    /* one input at a time: mul(x, x) gives both contributions to one gradient */
    for (int k = 0; k < 2; k++) {
        bool direct;
        float *w = acc_begin(&r, n->in[k], &direct);
        if (!w) continue;
        const ct_tensor *o = n->in[1 - k];
        ok(&r, ct_cuda_binary(r.s, true, g, CT_CUDA_CAST_F32, o->data, ty(o), w, N, N));
        acc_end(&r, n->in[k], w, direct);
    }
}

/* ---- sum and mean of all elements: a GEMM with a row of ones (f32 accumulation, where the
 * CPU op sums in double), then the scale; backward adds the scaled scalar everywhere. x f32,
 * bf16 or f16 (f32 ops under autocast: a low-precision x is read with ones of its type, exact
 * products, and gives an f32 result); backward reads no input data. ---- */
static ct_tensor *reduce_all(ct_ctx *ctx, ct_tensor *x, int op, double scale) {
    const char *name = ct_op_table_dev[op].row.name;
    check_float(name, x); CT_CHECK_CONTIG(name, x);
    int64_t n = ct_numel(x);
    ct_cuda_dtype dt = gemm_dt(x);
    run r;
    bool go = begin(ctx, x->device, name, &r);
    ct_tensor *y = out_like(&r, x, 0, NULL, name);
    if (go && y->data) {
        const void *ones = n ? ones_of(&r, dt, n, name) : NULL;
        if (n == 0) ok(&r, ct_cuda_fill(r.s, y->data, 0.0f, 1));
        else if (ones && gemm_any(&r, dt, false, false, 1, 1, n, 1, 1.0f, ones, x->data, y->data, 0.0f, NULL) && scale != 1.0)
            ok(&r, ct_cuda_scale(r.s, y->data, (float)scale, y->data, 1));
    }
    ct_node *nd = ct_record(ctx, op, y, 1, &x);
    if (nd) nd->f[0] = scale;
    return y;
}
static ct_tensor *fwd_sum(ct_ctx *ctx, const ct_op_args *a) { return reduce_all(ctx, a->in[0], CT_OP_SUM, 1.0); }
static ct_tensor *fwd_mean(ct_ctx *ctx, const ct_op_args *a) {
    int64_t n = ct_numel(a->in[0]);
    return reduce_all(ctx, a->in[0], CT_OP_MEAN, n ? 1.0 / (double)n : 0.0);
}
static void bw_reduce(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, n->op->name, &r)) return;
    int64_t N = ct_numel(n->in[0]);
    float *gx = ct_grad_acc(ctx, n->in[0]), *g = scratch(&r, 1, n->op->name);
    if (!gx || !g || N == 0) return;
    if (ok(&r, ct_cuda_scale(r.s, n->out->grad->data, (float)n->f[0], g, 1))) ok(&r, ct_cuda_add(r.s, gx, g, gx, N, 1));
}

/* ---- reshape: the CPU forward re-describes; the gradient is added back ---- */
/* The gradient of a reshape (or of a contiguous copy) is its input's, element for element: the
 * buffer is handed over when the input has none yet (no copy of, say, the [N, V] logits'
 * gradient), in bf16 where the input takes that; else added in f32. */
static void bw_reshape(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "reshape backward", &r)) return;
    ct_tensor *x = n->in[0];
    if (grad_lowp(n->out) && !ct_ac_takes_grad_lowp(x)) ct_grad_widen_(ctx, n->out);
    if (ct_grad_handoff_(ctx, n->out, x)) return;
    if (grad_lowp(n->out)) ct_grad_widen_(ctx, n->out);
    acc_add(&r, x, n->out->grad->data);
}

/* ---- views and copies: contiguous, transpose and slice (backward), split/merge heads ----
 * Gradients are contiguous in their tensor's shape (as on the CPU), so a view's backward adds
 * its gradient through the view's strides; the kernels move 4-byte elements. */
/* contiguous strides of a shape */
static void dense(int ndim, const int64_t *shape, int64_t *st) {
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) { st[d] = s; s *= shape[d]; }
}
/* the gradient of x (zeroed when new) += g seen through l */
static void acc_strided(run *r, ct_tensor *x, ct_cuda_layout l, int64_t offset, const float *g) {
    float *gx = ct_grad_acc(r->ctx, x);
    if (gx) ok(r, ct_cuda_strided_add(r->s, gx + offset, &l, g));
}

static ct_tensor *fwd_contiguous(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0];
    size_t es = ct_dtype_size(x->dtype);
    CT_CHECK(es == 4 || es == 2, "contiguous on cuda:%d: %s elements (the copy kernels move 4- and 2-byte ones)",
             x->device.index, ct_dtype_name(x->dtype));
    run r;
    bool go = begin(ctx, x->device, "contiguous", &r);
    ct_tensor *y = ct_new_on(ctx, x->device, x->dtype, x->ndim, x->shape, "contiguous");
    ct_cuda_layout l = layout(x->ndim, x->shape, x->stride);
    if (go && y->data)
        copy_view(&r, es, y->data, x->data, l);
    ct_record(ctx, CT_OP_CONTIGUOUS, y, 1, &x);
    return y;
}
static void bw_contiguous(ct_ctx *ctx, ct_node *n) { bw_reshape(ctx, n); } /* same: add back */

static void bw_transpose(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "transpose backward", &r)) return;
    ct_tensor *x = n->in[0];
    int64_t st[CT_MAX_DIMS], t;
    dense(x->ndim, x->shape, st);
    int d0 = (int)n->i[0], d1 = (int)n->i[1];
    t = st[d0]; st[d0] = st[d1]; st[d1] = t;
    acc_strided(&r, x, layout(n->out->ndim, n->out->shape, st), 0, n->out->grad->data);
}

static void bw_slice(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "slice backward", &r)) return;
    ct_tensor *x = n->in[0];
    int64_t st[CT_MAX_DIMS];
    dense(x->ndim, x->shape, st);
    acc_strided(&r, x, layout(n->out->ndim, n->out->shape, st), n->i[1] * st[n->i[0]], n->out->grad->data);
}

/* ---- pad_rows: x [R, ...] followed by rows of zeros (a GPT's LM head over a vocabulary
 * padded to a multiple of 64, whose logits' rows then start 16-byte aligned) ---- */
static ct_tensor *fwd_pad_rows(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0];
    int64_t shape[CT_MAX_DIMS];
    ct_check_pad_rows(x, a->i[0], shape);
    run r;
    bool go = begin(ctx, x->device, "pad_rows", &r);
    ct_tensor *y = out_same(&r, x, x->ndim, shape, "pad_rows");
    const size_t es = ct_dtype_size(x->dtype), xb = (size_t)ct_numel(x) * es, yb = (size_t)ct_numel(y) * es;
    if (go && y->data && yb > 0 &&
        (xb == 0 || ok(&r, CT_GPU_CHECK(cuda, "pad_rows", cudaMemcpyAsync(y->data, x->data, xb, cudaMemcpyDeviceToDevice, r.s)))))
        ok(&r, CT_GPU_CHECK(cuda, "pad_rows", cudaMemsetAsync((char *)y->data + xb, 0, yb - xb, r.s)));
    ct_record(ctx, CT_OP_PAD_ROWS, y, 1, &x);
    return y;
}
/* x's rows come first in y's gradient. Under autocast that gradient is the LM head's dW in
 * bf16/f16 (its GEMM writes it so: half the bytes of an f32 [Vp, C]); its rows go to x, the
 * weight's cast, in that type where the cast takes it so, else widened (exact) */
static void bw_pad_rows(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "pad_rows backward", &r)) return;
    ct_tensor *x = n->in[0], *g = n->out->grad;
    const int64_t nx = ct_numel(x);
    if (!grad_lowp(n->out)) {
        acc_add(&r, x, g->data);
        return;
    }
    void *lw = ct_ac_grad_lowp(ctx, x);
    if (lw) {
        if (nx > 0)
            ok(&r, CT_GPU_CHECK(cuda, "pad_rows backward",
                                cudaMemcpyAsync(lw, g->data, (size_t)nx * ct_dtype_size(g->dtype), cudaMemcpyDeviceToDevice, r.s)));
        return;
    }
    bool direct;
    float *w = acc_begin(&r, x, &direct);
    if (w && ok(&r, ct_cuda_cast(r.s, g->data, ty(g), w, CT_CUDA_CAST_F32, nx))) acc_end(&r, x, w, direct);
}

/* split_heads: x [B, T, H*D] -> [B, H, T, D]; merge_heads the inverse (heads_view and
 * tokens_view of ops_util.h) */
/* y (ndim, shape) = x seen through l: a permuting copy recorded as op */
static ct_tensor *permute(ct_ctx *ctx, ct_tensor *x, int op, const char *name, int ndim, const int64_t *shape,
                          ct_cuda_layout l) {
    check_float(name, x);
    run r;
    bool go = begin(ctx, x->device, name, &r);
    ct_tensor *y = out_same(&r, x, ndim, shape, name); /* bf16/f16 moved as 2-byte elements */
    if (go && y->data) copy_view(&r, ct_dtype_size(x->dtype), y->data, x->data, l);
    ct_record(ctx, op, y, 1, &x);
    return y;
}
static ct_tensor *fwd_split_heads(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0];
    CT_CHECK_CONTIG("split_heads", x);
    int64_t H = a->i[0];
    CT_CHECK(x->ndim == 3 && H >= 1 && x->shape[2] % H == 0, "split_heads: input must be [B, T, H*D] with H = %lld dividing the last dim", (long long)H);
    int64_t B = x->shape[0], T = x->shape[1], D = x->shape[2] / H;
    return permute(ctx, x, CT_OP_SPLIT_HEADS, "split_heads", 4, (int64_t[]){B, H, T, D}, heads_view(B, H, T, D));
}
static ct_tensor *fwd_merge_heads(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0];
    CT_CHECK_CONTIG("merge_heads", x);
    CT_CHECK(x->ndim == 4, "merge_heads: input must be [B, H, T, D]");
    int64_t B = x->shape[0], H = x->shape[1], T = x->shape[2], D = x->shape[3];
    return permute(ctx, x, CT_OP_MERGE_HEADS, "merge_heads", 3, (int64_t[]){B, T, H * D}, tokens_view(B, H, T, D));
}
/* The backwards: a new gradient of the input is the inverse permuting copy (bf16/f16 moved as
 * 2-byte elements where the gradient came so and the input takes one), an existing one gets
 * the gradient added through the forward's view. The [B, H, T, D] side gives the sizes. */
static void bw_heads(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, n->op->name, &r)) return;
    bool split = n->op == &ct_op_table_dev[CT_OP_SPLIT_HEADS].row;
    const int64_t *s = split ? n->out->shape : n->in[0]->shape;
    ct_cuda_layout fwd = split ? heads_view(s[0], s[1], s[2], s[3]) : tokens_view(s[0], s[1], s[2], s[3]);
    ct_cuda_layout inv = split ? tokens_view(s[0], s[1], s[2], s[3]) : heads_view(s[0], s[1], s[2], s[3]);
    ct_tensor *x = n->in[0], *o = n->out;
    void *lw = grad_lowp(o) ? ct_ac_grad_lowp(ctx, x) : NULL;
    if (lw) {
        ok(&r, ct_cuda_strided_copy16(r.s, lw, o->grad->data, &inv));
        return;
    }
    if (grad_lowp(o)) ct_grad_widen_(ctx, o);
    bool fresh;
    float *gx = ct_grad_acc_fresh(ctx, x, &fresh);
    if (gx && o->grad->data)
        ok(&r, fresh ? ct_cuda_strided_copy(r.s, gx, o->grad->data, &inv) : ct_cuda_strided_add(r.s, gx, &fwd, o->grad->data));
}

/* ---- softmax + cross-entropy: logits [N, C], target [N] i32/i64, both on the device ---- */
static ct_tensor *fwd_cross_entropy(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0], *t = a->in[1];
    check_float("cross_entropy", x); CT_CHECK_CONTIG("cross_entropy", x); CT_CHECK_CONTIG("cross_entropy", t);
    char sl[96], st[96];
    if ((t->dtype != CT_I32 && t->dtype != CT_I64) || x->ndim != 2 || t->ndim != 1 || t->shape[0] != x->shape[0])
        CT_FATAL("cross_entropy: logits %s and target %s: need [N, C] and [N] i32/i64", ct_shape_str(x, sl, sizeof sl),
                 ct_shape_str(t, st, sizeof st));
    int64_t N = x->shape[0], C = x->shape[1], ign = a->i[0];
    run r;
    bool go = begin(ctx, x->device, "cross_entropy", &r);
    /* out[0] the loss, out[1] the count of targets that are not ignored */
    ct_tensor *y = ct_new_on(ctx, x->device, CT_F32, 1, (int64_t[]){2}, "cross_entropy");
    y->ndim = 0;
    float *lse = scratch(&r, N, "cross_entropy");
    if (go && y->data && lse)
        ok(&r, ct_cuda_cross_entropy_t(r.s, x->data, ty(x), t->data, t->dtype == CT_I64, N, C, ign, lse, y->data));
    ct_node *nd = ct_record(ctx, CT_OP_CROSS_ENTROPY, y, 1, &x);
    if (nd) {
        nd->saved = lse;
        nd->saved_t[0] = t;
        nd->i[0] = N; nd->i[1] = C; nd->i[3] = ign;
    }
    return y;
}
static void bw_cross_entropy(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "cross_entropy backward", &r)) return;
    bool direct = true;
    ct_tensor *x = n->in[0];
    const ct_tensor *t = n->saved_t[0];
    /* bf16 logits (autocast's LM head) get a bf16 gradient where they take one: the fused
     * classifier, whose gradient the head's GEMMs read as it is */
    void *lw = ct_ac_grad_lowp(ctx, x);
    float *w = lw ? NULL : acc_begin(&r, x, &direct);
    if (!lw && !w) return;
    ok(&r, ct_cuda_cross_entropy_bwd_t(r.s, x->data, ty(x), t->data, t->dtype == CT_I64, n->i[0], n->i[1], n->i[3], n->saved,
                                       n->out->data, n->out->grad->data, lw ? lw : (void *)w, lw != NULL));
    if (w) acc_end(&r, x, w, direct);
}

/* ---- layer norm over the last dim; w, b optional ----
 * y f32, or (i[0]: ct_layer_norm_lowp under autocast) of autocast's bf16/f16, rounded as stored:
 * the bits of the cast autocast would make of the f32 y for the linear after it, without that
 * f32 tensor and its pass; backward then reads y's gradient in that dtype. dx is added to x's
 * gradient in the kernel where it has one (the residual stream's, from the add after it). */
static ct_tensor *fwd_layer_norm(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0], *w = a->in[1], *b = a->in[2];
    ct_dtype yd = (ct_dtype)a->i[0];
    check_float("layer_norm", x); CT_CHECK_CONTIG("layer_norm", x);
    CT_CHECK((!w || w->dtype == CT_F32) && (!b || b->dtype == CT_F32), "layer_norm on cuda:%d: weight and bias must be f32",
             x->device.index);
    CT_CHECK(yd == CT_F32 || yd == CT_BF16 || yd == CT_F16, "layer_norm on cuda:%d: a %s output (f32, bf16 or f16)", x->device.index,
             ct_dtype_name(yd));
    CT_CHECK(x->ndim >= 1, "layer_norm: input must have at least one dim");
    int64_t D = x->shape[x->ndim - 1], R = D ? ct_numel(x) / D : 0;
    CT_CHECK(!w || ct_numel(w) == D, "layer_norm: weight of %lld elements for rows of %lld", (long long)ct_numel(w), (long long)D);
    CT_CHECK(!b || ct_numel(b) == D, "layer_norm: bias of %lld elements for rows of %lld", (long long)ct_numel(b), (long long)D);
    run r;
    bool go = begin(ctx, x->device, "layer_norm", &r);
    ct_tensor *y = ct_new_on(ctx, x->device, yd, x->ndim, x->shape, "layer_norm");
    float *stats = scratch(&r, 2 * R, "layer_norm"); /* mean [R], then rstd [R] */
    if (go && y->data && stats && R > 0)
        ok(&r, ct_cuda_layer_norm_t(r.s, x->data, ty(x), w ? w->data : NULL, b ? b->data : NULL, y->data, ty(y), stats, stats + R,
                                    R, D, (float)a->f[0]));
    ct_node *nd = ct_record(ctx, CT_OP_LAYER_NORM, y, 3, (ct_tensor *[]){x, w, b});
    if (nd) { nd->saved = stats; nd->i[0] = R; nd->i[1] = D; }
    return y;
}
static void bw_layer_norm(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "layer_norm backward", &r)) return;
    int64_t R = n->i[0], D = n->i[1];
    ct_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2], *o = n->out;
    if (R == 0) return;
    /* a 16-bit y's gradient in its dtype: as it came, or the f32 one rounded (the values the
     * cast's backward would have widened) */
    const void *g = o->dtype == CT_F32 ? o->grad->data : gemm_dy(&r, gemm_dt(o), o, R * D, "layer_norm backward");
    bool fresh = false;
    float *dx = x->flags & CT_TF_REQUIRES_GRAD ? ct_grad_acc_fresh(ctx, x, &fresh) : NULL;
    float *dw = w ? ct_grad_acc(ctx, w) : NULL, *db = b ? ct_grad_acc(ctx, b) : NULL;
    if (g && ct_ctx_status(ctx) == CT_OK)
        ok(&r, ct_cuda_layer_norm_bwd_t(r.s, x->data, ty(x), g, ty(o), w ? w->data : NULL, n->saved, (const float *)n->saved + R, dx,
                                        !fresh, dw, db, R, D));
}

/* ---- embedding: w [V, D] (on the device), idx i32/i64 (on the device) ---- */
static ct_tensor *fwd_embedding(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *w = a->in[0], *idx = a->in[1];
    char sw[96], si[96];
    CT_CHECK_F32("embedding", w); CT_CHECK_CONTIG("embedding", w); CT_CHECK_CONTIG("embedding", idx);
    if (w->ndim != 2 || (idx->dtype != CT_I32 && idx->dtype != CT_I64) || idx->ndim >= CT_MAX_DIMS)
        CT_FATAL("embedding: weight %s, indices %s: need [V, D] and i32/i64", ct_shape_str(w, sw, sizeof sw), ct_shape_str(idx, si, sizeof si));
    int64_t V = w->shape[0], D = w->shape[1], n = ct_numel(idx), shape[CT_MAX_DIMS];
    memcpy(shape, idx->shape, (size_t)idx->ndim * sizeof *shape);
    shape[idx->ndim] = D;
    run r;
    bool go = begin(ctx, w->device, "embedding", &r);
    ct_tensor *y = out_like(&r, w, idx->ndim + 1, shape, "embedding");
    /* an index out of range gives a zero row (the CPU op aborts; checking here would wait
     * for the device every step) */
    if (go && y->data) ok(&r, ct_cuda_embedding(r.s, w->data, idx->data, idx->dtype == CT_I64, n, V, D, y->data, NULL));
    ct_node *nd = ct_record(ctx, CT_OP_EMBEDDING, y, 1, &w);
    if (nd) { nd->saved_t[0] = idx; nd->i[0] = n; nd->i[1] = D; nd->i[2] = V; }
    return y;
}
static void bw_embedding(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "embedding backward", &r)) return;
    float *gw = ct_grad_acc(ctx, n->in[0]);
    const ct_tensor *idx = n->saved_t[0];
    if (gw)
        ok(&r, ct_cuda_embedding_bwd(r.s, n->out->grad->data, idx->data, idx->dtype == CT_I64, n->i[0], n->i[2], n->i[1], gw));
}

bool ct_cuda_lowp_grads_(void) { return ct_config_bool(CT_CFG_CUDA_LOWP_GRADS); }

void ct_cuda_register_ops_(void) {
    static const struct { int op; ct_op_dev_fwd fwd; ct_backward_fn bwd; } rows[] = {
        {CT_OP_LINEAR, fwd_linear, bw_linear},
        {CT_OP_MATMUL, fwd_matmul, bw_matmul},
        {CT_OP_ADD, fwd_add, bw_add},
        {CT_OP_RELU, fwd_relu, bw_unary},
        {CT_OP_GELU, fwd_gelu, bw_unary},
        {CT_OP_SCALE, fwd_scale, bw_unary},
        {CT_OP_SUM, fwd_sum, bw_reduce},
        {CT_OP_TANH, fwd_tanh, bw_unary},
        {CT_OP_SIGMOID, fwd_sigmoid, bw_unary},
        {CT_OP_SILU, fwd_silu, bw_unary},
        {CT_OP_MUL, fwd_mul, bw_mul},
        {CT_OP_DROPOUT, fwd_dropout, bw_dropout},
        {CT_OP_MEAN, fwd_mean, bw_reduce},
        {CT_OP_RESHAPE, NULL, bw_reshape},
        {CT_OP_CONTIGUOUS, fwd_contiguous, bw_contiguous},
        {CT_OP_TRANSPOSE, NULL, bw_transpose},
        {CT_OP_SLICE, NULL, bw_slice},
        {CT_OP_PAD_ROWS, fwd_pad_rows, bw_pad_rows},
        {CT_OP_SPLIT_HEADS, fwd_split_heads, bw_heads},
        {CT_OP_MERGE_HEADS, fwd_merge_heads, bw_heads},
        {CT_OP_CROSS_ENTROPY, fwd_cross_entropy, bw_cross_entropy},
        {CT_OP_LAYER_NORM, fwd_layer_norm, bw_layer_norm},
        {CT_OP_EMBEDDING, fwd_embedding, bw_embedding},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) ct_op_register_device(CT_DEV_CUDA, rows[i].op, rows[i].fwd, rows[i].bwd);
    /* which inputs these kernels read in bf16 and f16 as they are (autocast copies the rest);
     * MIXED: also with an f32 result (mixed inputs, or an f32 op on low-precision ones). The
     * GEMMs and the attention take operands of one dtype, so they are not MIXED. */
    enum { LP = (1u << CT_BF16) | (1u << CT_F16), MIXED = LP | (1u << CT_F32) };
    static const struct { int op; unsigned in, dt; } lowp[] = {
        {CT_OP_LINEAR, 7u, LP},         {CT_OP_MATMUL, 3u, LP},
        {CT_OP_ADD, 3u, MIXED},         {CT_OP_MUL, 3u, MIXED},       {CT_OP_LAYER_NORM, 1u, MIXED},
        {CT_OP_CROSS_ENTROPY, 1u, MIXED}, {CT_OP_RELU, 1u, LP},       {CT_OP_GELU, 1u, LP},
        {CT_OP_TANH, 1u, LP},           {CT_OP_SIGMOID, 1u, LP},      {CT_OP_SCALE, 1u, LP},
        {CT_OP_DROPOUT, 1u, LP},        {CT_OP_SPLIT_HEADS, 1u, LP},  {CT_OP_MERGE_HEADS, 1u, LP},
        {CT_OP_SUM, 1u, MIXED},         {CT_OP_MEAN, 1u, MIXED},      {CT_OP_SILU, 1u, LP},
        {CT_OP_PAD_ROWS, 1u, LP},
    };
    for (size_t i = 0; i < sizeof lowp / sizeof lowp[0]; i++) ct_op_device_reads_lowp(lowp[i].op, lowp[i].in, lowp[i].dt);
    /* whose backward reads a bf16/f16 output's gradient in that type (the ops that write it
     * fresh then write it so: ct_ac_grad_lowp): the GEMMs, the elementwise maps, the views and
     * copies that reshape or permute, layer norm with a 16-bit output (ct_layer_norm_lowp), the
     * LM head's row padding; the fused attentions in ops_attention.c */
    static const int grad_lowp_ops[] = {CT_OP_LINEAR,  CT_OP_MATMUL,      CT_OP_RELU,        CT_OP_GELU,
                                        CT_OP_TANH,    CT_OP_SIGMOID,     CT_OP_SCALE,       CT_OP_SILU,
                                        CT_OP_RESHAPE, CT_OP_CONTIGUOUS,  CT_OP_SPLIT_HEADS, CT_OP_MERGE_HEADS,
                                        CT_OP_LAYER_NORM, CT_OP_PAD_ROWS};
    if (ct_cuda_lowp_grads_())
        for (size_t i = 0; i < sizeof grad_lowp_ops / sizeof grad_lowp_ops[0]; i++) ct_op_device_grad_lowp(grad_lowp_ops[i], LP);
    ct_cuda_register_conv_ops_();
    ct_cuda_register_ops_more_();
    ct_cuda_register_ops_llama_();
    ct_cuda_register_ops_attention_();
}
