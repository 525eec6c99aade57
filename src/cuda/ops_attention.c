/* The op table's CUDA rows for the fused (flash) attentions: flash_attention on q, k, v in
 * head layout, and flash_attention_qkv on the packed [B, T, 3C] output of a GPT's c_attn.
 * Both run the kernels of attention*.cu (f32, or bf16/f16 in and out with f32 arithmetic
 * under autocast); the packed one moves its data into and out of head layout around them,
 * except on the register-tile kernels (CTRAIN_CUDA_ATTENTION=mma), which read and write it
 * where it lies. */
#include "ctrain/ops.h"
#include "cuda/cuda_internal.h"
#include "cuda/ops_util.h"

/* ---- flash attention: q [B, H, T, D], k and v [B, KV, T, D] (KV dividing H: grouped-query,
 * query head j reading key/value head j / (H/KV)), D <= 128 ----
 * f32, or bf16 under autocast (the bf16 kernels: bf16 in and out, f32 arithmetic; autocast
 * keeps the bf16 output as it is). Backward in bf16 reads the output's gradient in bf16 (as
 * it came, or a copy of an f32 one, rounded already) and adds the kernel's bf16 dq, dk, dv to
 * the f32 gradients.
 * With KV < H the kernels read query head j's k, v at head j / (H/KV) and write each query
 * head's dK, dV into scratch [B, H, T, D]; each key/value head's gradient is then the sum of
 * its group's in head order (ct_cuda_repeat_kv_bwd), as the CPU op adds them. */

static int64_t attn_group(const ct_tensor *q, const ct_tensor *k) { return q->shape[1] / k->shape[1]; }

static ct_tensor *fwd_flash_attention(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *q = a->in[0], *k = a->in[1], *v = a->in[2];
    check_float("flash_attention", q);
    for (int i = 0; i < 3; i++) {
        CT_CHECK(a->in[i]->dtype == q->dtype, "flash_attention on cuda:%d: %s and %s inputs", q->device.index,
                 ct_dtype_name(q->dtype), ct_dtype_name(a->in[i]->dtype));
        CT_CHECK_CONTIG("flash_attention", a->in[i]);
    }
    run r;
    bool go = begin(ctx, q->device, "flash_attention", &r);
    ct_tensor *y = ct_new_on(ctx, q->device, q->dtype, q->ndim, q->shape, "flash_attention");
    bool fits = q->ndim == 4 && k->ndim == 4 && ct_same_shape(k, v) && k->shape[0] == q->shape[0] && k->shape[1] > 0 &&
                q->shape[1] % k->shape[1] == 0 && k->shape[2] == q->shape[2] && k->shape[3] == q->shape[3];
    if (!fits) {
        char s1[96], s2[96];
        ct_ctx_fail(ctx, ct_error(CT_ERR_UNSUPPORTED,
                                  "flash_attention on cuda:%d: q %s, k %s: the kernel takes q [B, H, T, D] and k, v [B, KV, T, D], KV dividing H",
                                  q->device.index, ct_shape_str(q, s1, sizeof s1), ct_shape_str(k, s2, sizeof s2)));
        return y;
    }
    int64_t BH = q->shape[0] * q->shape[1], T = q->shape[2], G = attn_group(q, k);
    int D = (int)q->shape[3];
    float *lse = scratch(&r, BH * T, "flash_attention");
    if (go && y->data && lse)
        ok(&r, ct_cuda_attention_gqa(r.s, gemm_dt(q), q->data, k->data, v->data, y->data, lse, BH, T, D, a->i[0] != 0, G));
    ct_node *nd = ct_record(ctx, CT_OP_FLASH_ATTENTION, y, 3, (ct_tensor *[]){q, k, v});
    if (nd) { nd->saved = lse; nd->i[0] = a->i[0]; }
    return y;
}
/* The kernel's gradient d of all H query heads (N values of dt) added to x's gradient: as f32
 * (a 16-bit d, G = 1), or summed over each group of G heads in head order (G > 1) */
/* N values d of x's dtype widened into x's f32 gradient (written fresh, or added) */
static void add_widened(run *r, ct_tensor *x, const void *d, int64_t N) {
    bool direct;
    float *w = acc_begin(r, x, &direct);
    if (w && ok(r, ct_cuda_cast(r->s, d, ty(x), w, CT_CUDA_CAST_F32, N))) acc_end(r, x, w, direct);
}
static void attn_grad_end(run *r, ct_tensor *x, ct_cuda_dtype dt, const void *d, int64_t G, int64_t N) {
    if (!(x->flags & CT_TF_REQUIRES_GRAD)) return;
    if (G == 1) {
        add_widened(r, x, d, N);
        return;
    }
    const float *w = d;
    if (dt != CT_CUDA_F32) {
        float *c = scratch(r, N, "flash_attention backward");
        if (!c || !ok(r, ct_cuda_cast(r->s, d, ty(x), c, CT_CUDA_CAST_F32, N))) return;
        w = c;
    }
    bool fresh;
    float *gx = ct_grad_acc_fresh(r->ctx, x, &fresh);
    int64_t TD = x->shape[2] * x->shape[3];
    if (gx && N > 0) ok(r, ct_cuda_repeat_kv_bwd(r->s, w, gx, x->shape[0] * x->shape[1], TD, G, !fresh));
}
static void bw_flash_attention(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "flash_attention backward", &r)) return;
    ct_tensor *q = n->in[0], *k = n->in[1], *v = n->in[2];
    int64_t BH = q->shape[0] * q->shape[1], T = q->shape[2], N = ct_numel(q), G = attn_group(q, k);
    ct_cuda_dtype dt = gemm_dt(q);
    bool lp = dt != CT_CUDA_F32, direct[3] = {false, false, false};
    void *d[3];
    for (int i = 0; i < 3; i++) {
        /* f32 with one head per group: straight into the gradients; else the kernel's own buffers */
        d[i] = lp || (i > 0 && G > 1) ? NULL : acc_begin(&r, n->in[i], &direct[i]);
        if (!d[i]) d[i] = lp ? ct_ctx_dev_alloc(ctx, r.dev, (size_t)(N > 0 ? N : 1) * 2, "flash_attention backward")
                             : scratch(&r, N, "flash_attention backward");
    }
    float *dr = scratch(&r, BH * T, "flash_attention backward");
    const void *dO = lp ? gemm_dy(&r, dt, n->out, N, "flash_attention backward") : n->out->grad->data;
    if (!d[0] || !d[1] || !d[2] || !dr || !dO) return;
    if (!ok(&r, ct_cuda_attention_gqa_bwd(r.s, dt, q->data, k->data, v->data, n->out->data, dO, n->saved, dr, d[0], d[1], d[2], BH,
                                          T, (int)q->shape[3], n->i[0] != 0, G)))
        return;
    for (int i = 0; i < 3; i++) {
        if (!lp && (i == 0 || G == 1)) { if (n->in[i]->grad) acc_end(&r, n->in[i], d[i], direct[i]); continue; }
        attn_grad_end(&r, n->in[i], dt, d[i], i == 0 ? 1 : G, N);
    }
}

/* ---- flash_attention_qkv: qkv [B, T, 3C] (q, k, v side by side in each token's row, H heads
 * of D = C/H) -> y [B, T, C], the CPU op's (flash_attention.c) shapes and node ----
 * One op for what the graph otherwise spells as reshape, three transposes, a contiguous copy,
 * three slices, flash_attention and merge_heads: the same kernels on the same values, so the
 * same bits forward and backward, without the views' gradients. Those were f32 and added
 * slice by slice into the copy's gradient; here the kernel's dq, dk, dv (bf16 under autocast)
 * are moved into qkv's gradient by one permuting copy, in bf16 where c_attn takes it so
 * (ct_ac_grad_lowp), which its GEMMs then read as it is.
 *
 * Memory: the head-layout copies live only inside the op. The forward keeps lse [B*H, T] (as
 * flash_attention does) and reads qkv and y again in backward, so it saves neither the copy of
 * qkv in head layout nor the output in head layout that the spelled-out graph keeps (4 C
 * values per token); backward re-makes them (two copies, the cost of ~1% of its kernels'
 * time), plus dO in head layout, then writes dqkv. Each copy is one pass over 2-byte (bf16)
 * or 4-byte elements. */

typedef struct {
    int64_t B, T, C, H, D, BH, N; /* N = B*T*C: the elements of each of q, k, v, y */
    size_t es;                    /* element size: 4 (f32) or 2 (bf16, f16) */
} qkv_dims;

static qkv_dims qkv_dims_of(const ct_tensor *qkv, int64_t H) {
    qkv_dims d = {.B = qkv->shape[0], .T = qkv->shape[1], .C = qkv->shape[2] / 3, .H = H, .es = ct_dtype_size(qkv->dtype)};
    d.D = d.C / H;
    d.BH = d.B * H;
    d.N = d.B * d.T * d.C;
    return d;
}
/* qkv [B, T, 3, H, D] seen as [3, B, H, T, D]: q, k, v each one contiguous [B, H, T, D] */
static ct_cuda_layout qkv_to_heads(const qkv_dims *d) {
    return layout(5, (int64_t[]){3, d->B, d->H, d->T, d->D}, (int64_t[]){d->C, d->T * 3 * d->C, d->D, 3 * d->C, 1});
}
/* the inverse: [3, B, H, T, D] seen as [B, T, 3, H, D] */
static ct_cuda_layout heads_to_qkv(const qkv_dims *d) {
    return layout(5, (int64_t[]){d->B, d->T, 3, d->H, d->D}, (int64_t[]){d->H * d->T * d->D, d->D, d->N, d->T * d->D, 1});
}
/* The register-tile kernels read q, k, v where they lie in qkv [B, T, 3, H, D] and write y
 * [B, T, H, D] and dqkv in place: no head-layout copies (ct_cuda_attention_views) */
static ct_cuda_attn_views qkv_views(const qkv_dims *d) {
    const ct_cuda_attn_view in = {d->T * 3 * d->C, d->D, 3 * d->C}, out = {d->T * d->C, d->D, d->C};
    return (ct_cuda_attn_views){.q = in, .k = in, .v = in, .o = out, .dO = out, .dq = in, .dk = in, .dv = in, .H = d->H, .G = 1};
}
static void *buf(run *r, int64_t n, size_t es, const char *op) {
    return ct_ctx_dev_alloc(r->ctx, r->dev, (size_t)(n > 0 ? n : 1) * es, op);
}
static void free_bufs(run *r, void **p, int n) {
    for (int i = 0; i < n; i++)
        if (p[i]) ct_ctx_dev_free_(r->ctx, p[i]);
}

static ct_tensor *fwd_flash_attention_qkv(ct_ctx *ctx, const ct_op_args *a) {
    ct_tensor *qkv = a->in[0];
    const int64_t H = a->i[0];
    const bool causal = a->i[1] != 0;
    check_float("flash_attention_qkv", qkv);
    CT_CHECK_CONTIG("flash_attention_qkv", qkv);
    char sx[96];
    if (qkv->ndim != 3 || H < 1 || qkv->shape[2] % (3 * H))
        CT_FATAL("flash_attention_qkv: input %s must be [B, T, 3 C] with n_head = %lld dividing C", ct_shape_str(qkv, sx, sizeof sx),
                 (long long)H);
    qkv_dims d = qkv_dims_of(qkv, H);
    run r;
    bool go = begin(ctx, qkv->device, "flash_attention_qkv", &r);
    ct_tensor *y = ct_new_on(ctx, qkv->device, qkv->dtype, 3, (int64_t[]){d.B, d.T, d.C}, "flash_attention_qkv");
    const bool copies = go && !ct_cuda_attention_views_fit(gemm_dt(qkv), (int)d.D);
    void *heads = copies ? buf(&r, 3 * d.N, d.es, "flash_attention_qkv") : NULL; /* q, k, v [3, B, H, T, D] */
    void *yh = heads ? buf(&r, d.N, d.es, "flash_attention_qkv") : NULL;          /* y [B, H, T, D] */
    float *lse = go && (!copies || yh) ? scratch(&r, d.BH * d.T, "flash_attention_qkv") : NULL; /* [B*H, T], saved */
    if (go && !copies) { /* straight from qkv into y */
        const ct_cuda_attn_views V = qkv_views(&d);
        const char *x = qkv->data;
        if (y->data && lse && d.N > 0)
            ok(&r, ct_cuda_attention_views(r.s, gemm_dt(qkv), x, x + d.C * d.es, x + 2 * d.C * d.es, y->data, lse, d.BH, d.T,
                                           (int)d.D, causal, &V));
    } else if (y->data && lse && d.N > 0) {
        char *h = heads;
        (void)(copy_view(&r, d.es, heads, qkv->data, qkv_to_heads(&d)) &&
               ok(&r, ct_cuda_attention_gqa(r.s, gemm_dt(qkv), h, h + d.N * d.es, h + 2 * d.N * d.es, yh, lse, d.BH, d.T,
                                            (int)d.D, causal, 1)) &&
               copy_view(&r, d.es, y->data, yh, tokens_view(d.B, d.H, d.T, d.D)));
    }
    free_bufs(&r, (void *[]){heads, yh}, 2);
    ct_node *nd = ct_record(ctx, CT_OP_FLASH_ATTENTION_QKV, y, 1, &qkv);
    if (nd) { nd->saved = lse; nd->i[0] = causal; nd->i[1] = H; }
    return y;
}

/* Backward on strided heads: dq, dk, dv written straight into qkv's gradient where c_attn's
 * GEMMs take it in bf16/f16, else into a 16-bit dqkv widened into the f32 one */
static void bw_attention_qkv_views(ct_ctx *ctx, run *r, ct_node *n, const qkv_dims *d, const void *dO) {
    const char *op = "flash_attention_qkv backward";
    ct_tensor *qkv = n->in[0];
    const ct_cuda_attn_views V = qkv_views(d);
    float *dr = scratch(r, d->BH * d->T, op);
    void *lw = dr ? ct_ac_grad_lowp(ctx, qkv) : NULL;
    void *t = dr && !lw ? buf(r, 3 * d->N, d->es, op) : NULL;
    char *dst = lw ? lw : t;
    const char *x = qkv->data;
    const size_t C = (size_t)d->C * d->es;
    if (dst && ok(r, ct_cuda_attention_views_bwd(r->s, gemm_dt(qkv), x, x + C, x + 2 * C, n->out->data, dO, n->saved, dr, dst,
                                                 dst + C, dst + 2 * C, d->BH, d->T, (int)d->D, n->i[0] != 0, &V)) && t)
        add_widened(r, qkv, t, 3 * d->N);
    free_bufs(r, (void *[]){t, dr}, 2);
}
static void bw_flash_attention_qkv(ct_ctx *ctx, ct_node *n) {
    run r;
    if (!begin(ctx, n->out->device, "flash_attention_qkv backward", &r)) return;
    ct_tensor *qkv = n->in[0], *o = n->out;
    const char *op = "flash_attention_qkv backward";
    qkv_dims d = qkv_dims_of(qkv, n->i[1]);
    ct_cuda_dtype dt = gemm_dt(qkv);
    if (!(qkv->flags & CT_TF_REQUIRES_GRAD) || d.N == 0) return;
    const void *dO = gemm_dy(&r, dt, o, d.N, op); /* dY as the kernels read it: in qkv's dtype */
    if (dO && ct_cuda_attention_views_fit(dt, (int)d.D)) {
        bw_attention_qkv_views(ctx, &r, n, &d, dO);
        return;
    }
    void *p[5] = {NULL, NULL, NULL, NULL, NULL};  /* heads, oh, dOh, dheads, dr */
    if (dO) p[0] = buf(&r, 3 * d.N, d.es, op);
    if (p[0]) p[1] = buf(&r, d.N, d.es, op);
    if (p[1]) p[2] = buf(&r, d.N, d.es, op);
    if (p[2]) p[3] = buf(&r, 3 * d.N, d.es, op);
    if (p[3]) p[4] = scratch(&r, d.BH * d.T, op);
    char *h = p[0], *dh = p[3];
    const size_t third = (size_t)d.N * d.es;
    bool done = p[4] && copy_view(&r, d.es, h, qkv->data, qkv_to_heads(&d)) &&
                copy_view(&r, d.es, p[1], o->data, heads_view(d.B, d.H, d.T, d.D)) &&
                copy_view(&r, d.es, p[2], dO, heads_view(d.B, d.H, d.T, d.D)) &&
                ok(&r, ct_cuda_attention_gqa_bwd(r.s, dt, h, h + third, h + 2 * third, p[1], p[2], n->saved, p[4], dh, dh + third,
                                                 dh + 2 * third, d.BH, d.T, (int)d.D, n->i[0] != 0, 1));
    /* dq, dk, dv into qkv's gradient: a fresh bf16/f16 one where c_attn's GEMMs take it so,
     * else f32 (written fresh, or added) */
    void *lw = done ? ct_ac_grad_lowp(ctx, qkv) : NULL;
    if (lw) {
        copy_view(&r, d.es, lw, dh, heads_to_qkv(&d));
    } else if (done) {
        bool direct;
        float *w = acc_begin(&r, qkv, &direct);
        void *t = w && dt != CT_CUDA_F32 ? buf(&r, 3 * d.N, d.es, op) : NULL; /* dqkv in 16 bits, then widened */
        if (w && (dt == CT_CUDA_F32 ? copy_view(&r, 4, w, dh, heads_to_qkv(&d))
                                    : t && copy_view(&r, 2, t, dh, heads_to_qkv(&d)) &&
                                          ok(&r, ct_cuda_cast(r.s, t, ty(qkv), w, CT_CUDA_CAST_F32, 3 * d.N))))
            acc_end(&r, qkv, w, direct);
        if (t) ct_ctx_dev_free_(ctx, t);
    }
    free_bufs(&r, p, 5);
}

void ct_cuda_register_ops_attention_(void) {
    ct_op_register_device(CT_DEV_CUDA, CT_OP_FLASH_ATTENTION, fwd_flash_attention, bw_flash_attention);
    ct_op_register_device(CT_DEV_CUDA, CT_OP_FLASH_ATTENTION_QKV, fwd_flash_attention_qkv, bw_flash_attention_qkv);
    /* the kernels read bf16/f16 q, k, v (qkv) themselves, and write y in that type */
    enum { LP = (1u << CT_BF16) | (1u << CT_F16) };
    ct_op_device_reads_lowp(CT_OP_FLASH_ATTENTION, 7u, LP);
    ct_op_device_reads_lowp(CT_OP_FLASH_ATTENTION_QKV, 1u, LP);
    /* and read y's gradient in that type */
    if (ct_cuda_lowp_grads_()) {
        ct_op_device_grad_lowp(CT_OP_FLASH_ATTENTION, LP);
        ct_op_device_grad_lowp(CT_OP_FLASH_ATTENTION_QKV, LP);
    }
}
