/* The op table's CUDA rows of Llama's ops (ops.c has the rest, silu among them): rms_norm,
 * rope and repeat_kv, with the kernels of llama.cu. Same checks, shapes, saved values and node
 * fields as the CPU ops (src/ops/cpu/norm.c, rope.c). Under autocast they read bf16/f16 inputs
 * themselves: rms_norm (an f32 op) gives an f32 result (or, from ct_rms_norm_lowp, autocast's
 * 16-bit one), rope and repeat_kv one of the input's type; their gradients are f32. */
#include <string.h>

#include "cuda/cuda_internal.h"
#include "cuda/ops_util.h"

/* ---- rms_norm over the last dim; w optional (f32) ----
 * y f32, or (i[0]: ct_rms_norm_lowp under autocast) of autocast's bf16/f16, rounded as stored,
 * its gradient then read in that dtype; dx added to x's gradient in the kernel where it has one
 * (as layer norm in ops.c) */
static ct_tensor *fwd_rms_norm(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0], *w = a->in[1];
    ct_dtype yd = (ct_dtype)a->i[0];
    check_float("rms_norm", x); CT_CHECK_CONTIG("rms_norm", x);
    CT_CHECK(!w || w->dtype == CT_F32, "rms_norm on cuda:%d: the weight must be f32", x->device.index);
    CT_CHECK(yd == CT_F32 || yd == CT_BF16 || yd == CT_F16, "rms_norm on cuda:%d: a %s output (f32, bf16 or f16)", x->device.index,
             ct_dtype_name(yd));
    CT_CHECK(x->ndim >= 1, "rms_norm: input must have at least one dim");
    int64_t D = x->shape[x->ndim - 1], R = D ? ct_numel(x) / D : 0;
    if (w) {
        CT_CHECK_CONTIG("rms_norm", w);
        if (w->ndim != 1 || w->shape[0] != D) {
            char sw[96], sx[96];
            CT_FATAL("rms_norm: weight %s does not match the last dim of %s", ct_shape_str(w, sw, sizeof sw), ct_shape_str(x, sx, sizeof sx));
        }
    }
    run r;
    bool go = begin(ctx, x->device, "rms_norm", &r);
    ct_tensor *y = ct_new_on(ctx, x->device, yd, x->ndim, x->shape, "rms_norm");
    float *rstd = scratch(&r, R, "rms_norm");
    if (go && y->data && rstd)
        ok(&r, ct_cuda_rms_norm_t(r.s, x->data, ty(x), w ? w->data : NULL, y->data, ty(y), rstd, R, D, (float)a->f[0]));
    ct_node *nd = ct_record(ctx, CT_OP_RMS_NORM, y, 2, (ct_tensor *[]){x, w});
    if (nd) { nd->saved = rstd; nd->i[0] = R; nd->i[1] = D; }
    return y;
}
static void bw_rms_norm(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "rms_norm backward", &r)) return;
    int64_t R = n->i[0], D = n->i[1];
    ct_tensor *x = n->in[0], *w = n->in[1], *o = n->out;
    if (R == 0) return;
    const void *g = o->dtype == CT_F32 ? o->grad->data : gemm_dy(&r, gemm_dt(o), o, R * D, "rms_norm backward");
    bool fresh = false;
    float *dx = x->flags & CT_TF_REQUIRES_GRAD ? ct_grad_acc_fresh(ctx, x, &fresh) : NULL, *dw = w ? ct_grad_acc(ctx, w) : NULL;
    if (!g || (!dx && !dw) || ct_ctx_status(ctx) != CT_OK) return;
    ok(&r, ct_cuda_rms_norm_bwd_t(r.s, x->data, ty(x), g, ty(o), w ? w->data : NULL, n->saved, dx, !fresh, dw, R, D));
}

/* ---- rope: x [..., T, D] (D even), positions [T] i32/i64 on the device or NULL (0..T-1);
 * f: theta, then llama3 scaling's factor (0: none), low and high frequency factors; i[0] its
 * original_max_position_embeddings ---- */
static ct_tensor *fwd_rope(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0], *pos = a->in[1];
    float theta = (float)a->f[0];
    int64_t R, T, D;
    check_float("rope", x);
    ct_check_rope_shapes(x, pos, theta, &R, &T, &D);
    int64_t h = D / 2;
    run r;
    bool go = begin(ctx, x->device, "rope", &r);
    ct_tensor *y = out_same(&r, x, x->ndim, NULL, "rope");
    float *cs = scratch(&r, 2 * T * h, "rope"); /* kept for backward, as the CPU op's table */
    if (go && y->data && cs && R * T * h > 0 &&
        ok(&r, ct_cuda_rope_table_scaled(r.s, pos ? pos->data : NULL, pos && pos->dtype == CT_I64, T, D, theta, (float)a->f[1],
                                         (float)a->f[2], (float)a->f[3], (int)a->i[0], cs)))
        ok(&r, ct_cuda_rope(r.s, x->data, ty(x), y->data, cs, R, T, D));
    ct_node *nd = ct_record(ctx, CT_OP_ROPE, y, 1, &x);
    if (nd) { nd->saved = cs; nd->i[0] = R; nd->i[1] = T; nd->i[2] = D; }
    return y;
}
static void bw_rope(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "rope backward", &r)) return;
    bool fresh;
    float *gx = ct_grad_acc_fresh(ctx, n->in[0], &fresh);
    int64_t R = n->i[0], T = n->i[1], D = n->i[2];
    if (gx && R * T * D > 0) ok(&r, ct_cuda_rope_bwd(r.s, n->out->grad->data, n->saved, gx, R, T, D, !fresh));
}

/* ---- repeat_kv: x [B, H, T, D] -> [B, H n_rep, T, D] (n_rep > 1: the CPU entry returns x for 1) ---- */
static ct_tensor *fwd_repeat_kv(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *x = a->in[0];
    int64_t rep = a->i[0];
    char sx[96];
    check_float("repeat_kv", x); CT_CHECK_CONTIG("repeat_kv", x);
    if (x->ndim != 4) CT_FATAL("repeat_kv: input %s must be [B, H, T, D]", ct_shape_str(x, sx, sizeof sx));
    int64_t BH = x->shape[0] * x->shape[1], TD = x->shape[2] * x->shape[3];
    run r;
    bool go = begin(ctx, x->device, "repeat_kv", &r);
    ct_tensor *y = out_same(&r, x, 4, (int64_t[]){x->shape[0], x->shape[1] * rep, x->shape[2], x->shape[3]}, "repeat_kv");
    /* each head read rep times: a view with a stride of 0 over the repeats */
    ct_cuda_layout l = {.ndim = 3, .shape = {BH, rep, TD}, .stride = {TD, 0, 1}};
    if (go && y->data && BH * TD > 0)
        ok(&r, x->dtype == CT_F32 ? ct_cuda_strided_copy(r.s, y->data, x->data, &l) : ct_cuda_strided_copy16(r.s, y->data, x->data, &l));
    ct_node *nd = ct_record(ctx, CT_OP_REPEAT_KV, y, 1, &x);
    if (nd) { nd->i[0] = BH; nd->i[1] = TD; nd->i[2] = rep; }
    return y;
}
static void bw_repeat_kv(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "repeat_kv backward", &r)) return;
    bool fresh;
    float *gx = ct_grad_acc_fresh(ctx, n->in[0], &fresh);
    int64_t BH = n->i[0], TD = n->i[1], rep = n->i[2];
    if (gx && BH * TD > 0) ok(&r, ct_cuda_repeat_kv_bwd(r.s, n->out->grad->data, gx, BH, TD, rep, !fresh));
}

void ct_cuda_register_ops_llama_(void) {
    ct_op_register_device(CT_DEV_CUDA, CT_OP_RMS_NORM, fwd_rms_norm, bw_rms_norm);
    ct_op_register_device(CT_DEV_CUDA, CT_OP_ROPE, fwd_rope, bw_rope);
    ct_op_register_device(CT_DEV_CUDA, CT_OP_REPEAT_KV, fwd_repeat_kv, bw_repeat_kv);
    /* inputs read in bf16/f16 as they are (see ops.c's table): rms_norm's x with an f32 result
     * (an f32 op), rope's and repeat_kv's x with a result of their type */
    const unsigned lp = (1u << CT_BF16) | (1u << CT_F16), f32 = 1u << CT_F32;
    ct_op_device_reads_lowp(CT_OP_RMS_NORM, 1u, lp | f32);
    ct_op_device_reads_lowp(CT_OP_ROPE, 1u, lp);
    ct_op_device_reads_lowp(CT_OP_REPEAT_KV, 1u, lp);
    /* a 16-bit rms_norm output's gradient (ct_rms_norm_lowp) read in its dtype */
    if (ct_cuda_lowp_grads_()) ct_op_device_grad_lowp(CT_OP_RMS_NORM, lp);
}
