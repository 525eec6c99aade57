/* The tape. Ops append nodes during forward; ct_backward walks them newest first and
 * calls each node's backward (its op-table row, recorded with it). Gradients of intermediates are created
 * on first use in the arena; parameters accumulate into their store's flat buffer. */
#include <string.h>

#include "core/ctx_internal.h"
#include "core/kernel.h"

bool ct_set_grad_enabled(ct_ctx *ctx, bool enabled) {
    bool prev = ctx->grad_enabled;
    ctx->grad_enabled = enabled;
    return prev;
}
bool ct_grad_enabled(const ct_ctx *ctx) { return ctx->grad_enabled; }
void ct_requires_grad(ct_tensor *t) { t->flags |= CT_TF_REQUIRES_GRAD; }
int ct_tape_len(const ct_ctx *ctx) { return ctx->tape_len; }

ct_node *ct_record_op(ct_ctx *ctx, const ct_op_def *op, ct_tensor *out, int nin, ct_tensor *const *in) {
    if (!ctx->grad_enabled) return NULL;
    CT_CHECK(nin <= CT_NODE_MAX_IN, "op %s with %d inputs", op->name, nin);
    bool any = false;
    for (int i = 0; i < nin; i++)
        if (in[i] && (in[i]->flags & CT_TF_REQUIRES_GRAD)) any = true;
    if (!any) return NULL;
    ct_node *n = ct_ctx_alloc(ctx, sizeof *n);
    memset(n, 0, sizeof *n);
    n->op = op;
    n->out = out;
    n->nin = nin;
    for (int i = 0; i < nin; i++) {
        n->in[i] = in[i];
        if (in[i] && (in[i]->flags & CT_TF_PARAM)) in[i]->uses++;
    }
    n->prev = ctx->tape;
    ctx->tape = n;
    ctx->tape_len++;
    out->node = n;
    out->flags |= CT_TF_REQUIRES_GRAD;
    return n;
}

float *ct_grad_acc(ct_ctx *ctx, ct_tensor *t) {
    if (!t || !(t->flags & CT_TF_REQUIRES_GRAD)) return NULL;
    if (!t->grad) {
        /* header and buffer in the main arena (they outlive the backward that asks); the
         * buffer may be one released by an already-processed node */
        bool prev = ctx->grad_alloc;
        ctx->grad_alloc = true;
        void *buf = ct_ctx_grad_buffer_(ctx, (size_t)ct_numel(t) * sizeof(float));
        t->grad = ct_wrap(ctx, CT_F32, buf, t->ndim, t->shape);
        ctx->grad_alloc = prev;
    }
    return t->grad->data;
}

void ct_check_same_shape(const char *op, const char *file, int line, const ct_tensor *a, const ct_tensor *b) {
    if (ct_same_shape(a, b)) return;
    char sa[96], sb[96];
    ct_fatal(file, line, "%s: shape mismatch: %s vs %s", op, ct_shape_str(a, sa, sizeof sa), ct_shape_str(b, sb, sizeof sb));
}

static void run_backward(ct_ctx *ctx) {
    bool prev = ctx->grad_enabled;
    ctx->grad_enabled = false; /* backward itself records nothing */
    for (ct_node *n = ctx->tape; n; n = n->prev) {
        ct_tensor *o = n->out;
        if (o->grad) {
            ctx->bw_depth++; /* what the backward allocates besides gradients is scratch */
            n->op->backward(ctx, n);
            if (--ctx->bw_depth == 0) ct_ctx_scratch_rewind_(ctx);
        }
        for (int i = 0; i < n->nin; i++) {
            ct_tensor *p = n->in[i];
            if (p && (p->flags & CT_TF_PARAM) && p->uses > 0 && --p->uses == 0) ct_params_fire_hook_(p->params, p->param_id);
        }
        /* o's gradient is consumed (only nodes after n on the tape feed it, and they have
         * run): recycle its buffer. Like PyTorch, intermediates keep no .grad afterwards. */
        if (o->grad && o->node == n && !(o->flags & CT_TF_PARAM)) {
            ct_ctx_grad_release_(ctx, o->grad->data, (size_t)ct_numel(o) * sizeof(float));
            o->grad = NULL;
        }
    }
    ctx->grad_enabled = prev;
    /* the tape is consumed: a second backward over it would double-count */
    ctx->tape = NULL;
    ctx->tape_len = 0;
}

void ct_backward(ct_ctx *ctx, ct_tensor *loss) {
    if (ct_numel(loss) != 1) {
        char b[96];
        CT_FATAL("ct_backward: loss must have one element, got %s (use ct_backward_seed)", ct_shape_str(loss, b, sizeof b));
    }
    CT_CHECK(loss->flags & CT_TF_REQUIRES_GRAD, "ct_backward: loss does not require grad (no parameter reached it, or grad mode was off)");
    float *g = ct_grad_acc(ctx, loss);
    g[0] += 1.0f;
    run_backward(ctx);
}

void ct_backward_seed(ct_ctx *ctx, ct_tensor *out, const ct_tensor *seed) {
    CT_CHECK_SAME_SHAPE("ct_backward_seed", out, seed);
    CT_CHECK(seed->dtype == CT_F32 && ct_is_contiguous(seed), "ct_backward_seed: seed must be contiguous f32");
    CT_CHECK(out->flags & CT_TF_REQUIRES_GRAD, "ct_backward_seed: output does not require grad");
    float *g = ct_grad_acc(ctx, out);
    const float *s = seed->data;
    int64_t n = ct_numel(out);
    for (int64_t i = 0; i < n; i++) g[i] += s[i];
    run_backward(ctx);
}

uint64_t ct_ctx_dropout_key(ct_ctx *ctx) { return ct_ctx_dropout_key_(ctx); }
