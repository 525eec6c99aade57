/* The tape. Ops append nodes during forward; ct_backward walks them newest first and
 * calls each node's backward (its op-table row, recorded with it). Gradients of intermediates are created
 * on first use in the arena; parameters accumulate into their store's flat buffer. */
#include <stdlib.h>
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

static void ckpt_count_uses(ct_ctx *ctx, int nin, ct_tensor *const *in);

ct_node *ct_record_op(ct_ctx *ctx, const ct_op_def *op, ct_tensor *out, int nin, ct_tensor *const *in) {
    if (!ctx->grad_enabled) {
        if (ctx->ckpt_counting) ckpt_count_uses(ctx, nin, in);
        return NULL;
    }
    CT_CHECK(nin <= CT_NODE_MAX_IN, "op %s with %d inputs", op->name, nin);
    bool any = false;
    for (int i = 0; i < nin; i++)
        if (in[i] && (in[i]->flags & CT_TF_REQUIRES_GRAD)) any = true;
    if (!any) return NULL;
    ct_node *n = ct_ctx_alloc_keep(ctx, sizeof *n);
    memset(n, 0, sizeof *n);
    n->op = op;
    n->out = out;
    n->nin = nin;
    for (int i = 0; i < nin; i++) {
        n->in[i] = in[i];
        /* a recomputed segment's uses were counted when it first ran */
        if (in[i] && (in[i]->flags & CT_TF_PARAM) && !ctx->ckpt_recompute) in[i]->uses++;
    }
    n->prev = ctx->tape;
    ctx->tape = n;
    ctx->tape_len++;
    out->node = n;
    out->flags |= CT_TF_REQUIRES_GRAD;
    return n;
}

/* A gradient on a device, f32 or (ct_grad_fresh_as_) t's low precision: device memory of the
 * step, zeroed on the device's stream when asked (NULL data when the context has failed: the
 * backward functions then do nothing). */
static void *device_grad(ct_ctx *ctx, ct_tensor *t, ct_dtype dt, bool zero, bool *fresh) {
    bool prev = ctx->grad_alloc;
    ctx->grad_alloc = true;
    t->grad = ct_new_on(ctx, t->device, dt, t->ndim, t->shape, "backward");
    ctx->grad_alloc = prev;
    size_t bytes = ct_nbytes(t->grad);
    if (t->grad->data && zero && bytes) {
        const ct_device_hooks *h = ct_device_hooks_get(t->device, "backward");
        ct_ctx_fail(ctx, h ? h->zero(t->device.index, t->grad->data, bytes) : CT_ERR_UNSUPPORTED);
    }
    *fresh = !zero;
    return t->grad->data;
}

void *ct_grad_fresh_as_(ct_ctx *ctx, ct_tensor *t, ct_dtype dt) {
    bool fresh;
    if (!t || !(t->flags & CT_TF_REQUIRES_GRAD) || t->grad || t->device.type == CT_DEV_CPU) return NULL;
    return device_grad(ctx, t, dt, false, &fresh);
}

/* A low-precision gradient becomes f32 (exactly: every bf16/f16 value is one) when an op that
 * adds in f32 comes to it: its buffer goes back, an f32 one holds its values. */
void ct_grad_widen_(ct_ctx *ctx, ct_tensor *t) {
    ct_tensor *lp = t->grad;
    if (!lp || lp->dtype == CT_F32) return;
    bool fresh;
    t->grad = NULL;
    float *g = device_grad(ctx, t, CT_F32, false, &fresh);
    const ct_device_hooks *h = ct_device_hooks_get(t->device, "backward");
    if (g && lp->data && ct_numel(t) > 0)
        ct_ctx_fail(ctx, h && h->convert ? h->convert(t->device.index, g, CT_F32, lp->data, lp->dtype, ct_numel(t))
                                         : CT_ERR_UNSUPPORTED);
    if (lp->data) ct_ctx_dev_free_(ctx, lp->data);
}

bool ct_grad_handoff_(ct_ctx *ctx, ct_tensor *from, ct_tensor *to) {
    ct_tensor *g = from->grad;
    if (!g || !g->data || !to || to->grad || !(to->flags & CT_TF_REQUIRES_GRAD) || (to->flags & CT_TF_PARAM) ||
        to->device.type == CT_DEV_CPU || ct_numel(to) != ct_numel(from))
        return false;
    bool prev = ctx->grad_alloc;
    ctx->grad_alloc = true;
    to->grad = ct_wrap(ctx, g->dtype, g->data, to->ndim, to->shape);
    ctx->grad_alloc = prev;
    to->grad->device = to->device;
    from->grad = NULL; /* the buffer is to's now: freed once, when to's gradient is consumed */
    return true;
}

static float *grad_buffer(ct_ctx *ctx, ct_tensor *t, bool zero, bool *fresh) {
    *fresh = false;
    if (!t || !(t->flags & CT_TF_REQUIRES_GRAD)) return NULL;
    if (t->grad && t->grad->dtype != CT_F32) ct_grad_widen_(ctx, t);
    if (t->flags & CT_TF_GRAD_STALE) {
        /* a parameter's first gradient since ct_params_zero_grad: written like an
         * intermediate's new one, so a GEMM runs with beta = 0 and nothing clears 7 MB first */
        t->flags &= ~(uint32_t)CT_TF_GRAD_STALE;
        if (zero) memset(t->grad->data, 0, (size_t)ct_numel(t) * sizeof(float));
        *fresh = !zero;
        return t->grad->data;
    }
    if (!t->grad && t->device.type != CT_DEV_CPU) return device_grad(ctx, t, CT_F32, zero, fresh);
    if (!t->grad) {
        /* header and buffer in the main arena (they outlive the backward that asks); the
         * buffer may be one released by an already-processed node */
        bool prev = ctx->grad_alloc;
        ctx->grad_alloc = true;
        size_t bytes = (size_t)ct_numel(t) * sizeof(float);
        void *buf = zero ? ct_ctx_grad_buffer_(ctx, bytes) : ct_ctx_grad_buffer_raw_(ctx, bytes);
        t->grad = ct_wrap(ctx, CT_F32, buf, t->ndim, t->shape);
        ctx->grad_alloc = prev;
        *fresh = !zero;
    }
    return t->grad->data;
}

float *ct_grad_acc(ct_ctx *ctx, ct_tensor *t) {
    bool fresh;
    return grad_buffer(ctx, t, true, &fresh);
}

float *ct_grad_acc_fresh(ct_ctx *ctx, ct_tensor *t, bool *fresh) { return grad_buffer(ctx, t, false, fresh); }

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
        /* after a device failure nothing more is computed; the uses are still counted down */
        if (o->grad && ctx->dev_status == CT_OK) {
            ctx->bw_depth++; /* what the backward allocates besides gradients is scratch */
            double t0;
            bool prof = o->device.type != CT_DEV_CPU && ct_devprof_begin(o->device, &t0);
            n->op->backward(ctx, n);
            if (prof) ct_devprof_end(o->device, n->op->name, true, t0);
            if (--ctx->bw_depth == 0) {
                ct_ctx_scratch_rewind_(ctx);
                if (o->device.type != CT_DEV_CPU) ct_ctx_dev_scratch_free_(ctx);
            }
        }
        for (int i = 0; i < n->nin; i++) {
            ct_tensor *p = n->in[i];
            if (p && (p->flags & CT_TF_PARAM) && p->uses > 0 && --p->uses == 0) ct_params_fire_hook_(p->params, p->param_id);
        }
        /* o's gradient is consumed (only nodes after n on the tape feed it, and they have
         * run): recycle its buffer. Like PyTorch, intermediates keep no .grad afterwards. */
        if (o->grad && o->node == n && !(o->flags & CT_TF_PARAM) && o->device.type != CT_DEV_CPU) {
            if (o->grad->data) ct_ctx_dev_free_(ctx, o->grad->data);
            o->grad = NULL;
        }
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

/* A backward consumes the whole tape, other losses' graphs recorded on it too: a loss
 * whose node is gone from the tape would get no gradients at all, silently. PyTorch refuses
 * the same ("Trying to backward through the graph a second time"). */
static void check_on_tape(ct_ctx *ctx, const ct_tensor *loss) {
    if (!loss->node) return; /* a leaf: its own gradient only */
    for (const ct_node *n = ctx->tape; n; n = n->prev)
        if (n == loss->node) return;
    CT_FATAL("ct_backward: this loss's graph was consumed by an earlier ct_backward on the same context (each "
             "backward walks the whole tape); run backward after each forward, or add the losses and run it once");
}

/* The stores of the parameters on the tape (and in its checkpointed segments), so that
 * those whose gradient backward never wrote (used by no op of this graph) read as zeros
 * afterwards through the tensors too, not only through ct_params_grad. */
#define MAX_STORES 8
typedef struct { ct_params *p[MAX_STORES]; int n; } store_set;

static void store_add(store_set *s, ct_tensor *t) {
    if (!t || !(t->flags & CT_TF_PARAM) || !t->params) return;
    for (int i = 0; i < s->n; i++)
        if (s->p[i] == t->params) return;
    if (s->n < MAX_STORES) s->p[s->n++] = t->params; /* more: ct_params_grad still settles them */
}

static void tape_stores(const ct_ctx *ctx, store_set *s) {
    s->n = 0;
    for (const ct_node *n = ctx->tape; n; n = n->prev) {
        for (int i = 0; i < n->nin; i++) store_add(s, n->in[i]);
        if (n->op == &ct_checkpoint_def_) {
            const ct_ckpt_saved *c = n->saved;
            for (int i = 0; i < c->nparams; i++) store_add(s, c->params[i]);
        }
    }
}

static void backward_top(ct_ctx *ctx) {
    store_set s;
    tape_stores(ctx, &s);
    run_backward(ctx);
    for (int i = 0; i < s.n; i++) (void)ct_params_grad(s.p[i]); /* settles the store */
}

void ct_backward(ct_ctx *ctx, ct_tensor *loss) {
    /* after a device failure the loss may be a placeholder: nothing to compute (reset clears) */
    if (ctx->dev_status != CT_OK) return;
    if (ct_numel(loss) != 1) {
        char b[96];
        CT_FATAL("ct_backward: loss must have one element, got %s (use ct_backward_seed)", ct_shape_str(loss, b, sizeof b));
    }
    CT_CHECK(loss->flags & CT_TF_REQUIRES_GRAD, "ct_backward: loss does not require grad (no parameter reached it, or grad mode was off)");
    check_on_tape(ctx, loss);
    if (loss->device.type != CT_DEV_CPU) {
        /* dloss = 1 written into a fresh device gradient (a loss has none before backward), by
         * the device where it can: the step then uploads nothing but its batch */
        CT_CHECK(!loss->grad, "ct_backward: the device loss already has a gradient");
        bool fresh;
        float *g = ct_grad_acc_fresh(ctx, loss, &fresh), one = 1.0f;
        const ct_device_hooks *h = ct_device_hooks_get(loss->device, "backward");
        if (g && h && h->fill) ct_ctx_fail(ctx, h->fill(loss->device.index, g, one, 1));
        else if (g && h) ct_ctx_fail(ctx, h->copy(loss->device.index, g, &one, sizeof one, CT_COPY_H2D));
        run_backward(ctx);
        return;
    }
    float *g = ct_grad_acc(ctx, loss);
    g[0] += 1.0f;
    backward_top(ctx);
}

void ct_backward_seed(ct_ctx *ctx, ct_tensor *out, const ct_tensor *seed) {
    CT_CHECK_SAME_SHAPE("ct_backward_seed", out, seed);
    CT_CHECK(seed->dtype == CT_F32 && ct_is_contiguous(seed), "ct_backward_seed: seed must be contiguous f32");
    CT_CHECK(out->flags & CT_TF_REQUIRES_GRAD, "ct_backward_seed: output does not require grad");
    CT_CHECK(out->device.type == CT_DEV_CPU, "ct_backward_seed: not supported for device tensors yet");
    float *g = ct_grad_acc(ctx, out);
    const float *s = seed->data;
    int64_t n = ct_numel(out);
    for (int64_t i = 0; i < n; i++) g[i] += s[i];
    backward_top(ctx);
}

uint64_t ct_ctx_dropout_key(ct_ctx *ctx) { return ct_ctx_dropout_key_(ctx); }

/* ---- activation checkpointing ----
 * Forward runs the segment without grad, keeping only its input and output; its
 * intermediates go back to the arena at once. The parameters it uses still count their uses
 * (so a grad-ready hook fires only after the recompute has delivered their gradients) and are
 * remembered, so that ct_ctx_reset can clear the counts of a step that never ran backward.
 * Backward runs the segment again with grad, from a leaf standing for the input, with the
 * dropout stream where it was, and walks that segment's own tape with the output's
 * gradient; the input's gradient is the leaf's. Everything the recompute allocates besides
 * gradients is backward scratch, freed when the node's backward returns. */

static void ckpt_count_uses(ct_ctx *ctx, int nin, ct_tensor *const *in) {
    for (int i = 0; i < nin; i++) {
        ct_tensor *p = in[i];
        if (!p || !(p->flags & CT_TF_PARAM) || !(p->flags & CT_TF_REQUIRES_GRAD)) continue;
        if (p->uses++ > 0) continue; /* listed at its first use */
        if (ctx->ckpt_nparams == ctx->ckpt_cap) {
            int cap = ctx->ckpt_cap ? 2 * ctx->ckpt_cap : 64;
            ct_tensor **np = realloc(ctx->ckpt_params, sizeof *np * (size_t)cap);
            if (!np) ct_fatal(__FILE__, __LINE__, "out of memory listing a checkpointed segment's parameters");
            ctx->ckpt_params = np;
            ctx->ckpt_cap = cap;
        }
        ctx->ckpt_params[ctx->ckpt_nparams++] = p;
    }
}

/* On a device: the recomputed output's gradient (new, so written, not added to) is the
 * checkpoint node's, copied on the device. A segment whose output already has a gradient
 * (it returns its input, or a parameter) would need an add, which core has no kernel for. */
static void dev_grad_copy(ct_ctx *ctx, ct_tensor *y, const ct_tensor *out) {
    bool fresh;
    char b[32];
    float *g = ct_grad_acc_fresh(ctx, y, &fresh);
    const ct_device_hooks *h = g ? ct_device_hooks_get(y->device, "checkpoint backward") : NULL;
    if (!h) return; /* the context has failed */
    if (!fresh) {
        ct_ctx_fail(ctx, ct_error(CT_ERR_UNSUPPORTED, "checkpoint on %s: a segment whose output is its input or a parameter",
                                  ct_device_str(y->device, b, sizeof b)));
        return;
    }
    ct_ctx_fail(ctx, h->copy(y->device.index, g, out->grad->data, (size_t)ct_numel(y) * sizeof(float), CT_COPY_D2D));
}

static void ckpt_backward(ct_ctx *ctx, ct_node *n) {
    ct_ckpt_saved *s = n->saved;
    ct_tensor *x = n->in[0];
    /* the input's stand-in: same data, no history; its gradient is x's (accumulated into) */
    ct_tensor *xd = ct_wrap(ctx, x->dtype, x->data, x->ndim, x->shape);
    xd->device = x->device;
    if (x->flags & CT_TF_REQUIRES_GRAD) {
        ct_grad_acc(ctx, x);
        xd->flags |= CT_TF_REQUIRES_GRAD;
        xd->grad = x->grad;
    }
    ct_node *tape = ctx->tape;
    int tape_len = ctx->tape_len;
    uint64_t step = ctx->step, calls = ct_ctx_dropout_calls_(ctx);
    ctx->tape = NULL;
    ctx->tape_len = 0;
    ctx->step = s->step;
    ct_ctx_set_dropout_calls_(ctx, s->calls);
    ctx->grad_enabled = true;
    ctx->ckpt_recompute++;
    /* the recompute runs in the autocast region the segment ran in, like PyTorch's */
    int ac_depth = ctx->ac_depth;
    ct_dtype ac_top = ac_depth ? ctx->ac_stack[ac_depth - 1] : CT_F32;
    if (s->autocast != CT_F32) ctx->ac_stack[ctx->ac_depth++] = s->autocast;
    else if (ac_depth) ctx->ac_stack[ac_depth - 1] = CT_F32;
    ct_tensor *y = s->fn(ctx, xd, s->arg);
    ctx->ac_depth = ac_depth;
    if (ac_depth) ctx->ac_stack[ac_depth - 1] = ac_top;
    ctx->ckpt_recompute--;
    ctx->grad_enabled = false;
    ctx->step = step;
    ct_ctx_set_dropout_calls_(ctx, calls);
    if (y->flags & CT_TF_REQUIRES_GRAD) {
        CT_CHECK(ct_same_shape(y, n->out), "checkpoint: the segment's output changed shape on recompute");
        if (y->device.type == CT_DEV_CPU) {
            float *g = ct_grad_acc(ctx, y);
            const float *gy = n->out->grad->data;
            int64_t m = ct_numel(y);
            for (int64_t i = 0; i < m; i++) g[i] += gy[i];
        } else {
            dev_grad_copy(ctx, y, n->out);
        }
        run_backward(ctx);
    }
    if (!(x->flags & CT_TF_REQUIRES_GRAD)) xd->grad = NULL;
    ctx->tape = tape;
    ctx->tape_len = tape_len;
}

const ct_op_def ct_checkpoint_def_ = {"checkpoint", ckpt_backward, CT_AC_PROMOTE};

ct_tensor *ct_checkpoint(ct_ctx *ctx, ct_checkpoint_fn fn, void *arg, ct_tensor *x) {
    if (!ctx->grad_enabled || ctx->ckpt_counting) return fn(ctx, x, arg); /* nothing to save, or nested */
    uint64_t step = ctx->step, calls = ct_ctx_dropout_calls_(ctx);
    int first = ctx->ckpt_nparams, dmark = ct_ctx_dev_mark_(ctx);
    ct_arena_mark mark = ct_ctx_mark_(ctx);
    ctx->grad_enabled = false;
    ctx->ckpt_counting++;
    ct_tensor *y = fn(ctx, x, arg);
    ctx->ckpt_counting--;
    CT_CHECK(ct_is_contiguous(y), "ct_checkpoint: the segment must return a contiguous tensor (end it with ct_contiguous)");
    ctx->grad_enabled = true;
    int np = ctx->ckpt_nparams - first;
    /* keep the output, drop the intermediates: on a device the output's buffer stays and the
     * segment's others go back to the allocator; on the CPU the output goes out through a heap
     * copy and back into the arena */
    size_t bytes = ct_nbytes(y);
    void *tmp = y->device.type == CT_DEV_CPU ? malloc(bytes ? bytes : 1) : NULL;
    ct_tensor *out = y;
    ct_ctx_dev_rewind_(ctx, dmark, y->device.type == CT_DEV_CPU ? NULL : y->data);
    if (y->device.type != CT_DEV_CPU) {
        ct_device d = y->device;
        void *data = y->data;
        int64_t shape[CT_MAX_DIMS];
        int nd = y->ndim;
        ct_dtype dt = y->dtype;
        memcpy(shape, y->shape, sizeof shape);
        ct_ctx_rewind_(ctx, mark);
        out = ct_wrap(ctx, dt, data, nd, shape);
        out->device = d;
    } else if (tmp) {
        memcpy(tmp, y->data, bytes);
        int64_t shape[CT_MAX_DIMS];
        int nd = y->ndim;
        ct_dtype dt = y->dtype;
        memcpy(shape, y->shape, sizeof shape);
        ct_ctx_rewind_(ctx, mark);
        out = ct_new(ctx, dt, nd, shape);
        memcpy(out->data, tmp, bytes);
        free(tmp);
    }
    if (np == 0 && !(x->flags & CT_TF_REQUIRES_GRAD)) {
        ctx->ckpt_nparams = first;
        return out; /* nothing below needs a gradient */
    }
    ct_ckpt_saved *s = ct_ctx_alloc(ctx, sizeof *s);
    s->fn = fn;
    s->arg = arg;
    s->step = step;
    s->calls = calls;
    s->autocast = ct_autocast_dtype(ctx);
    s->nparams = np;
    s->params = ct_ctx_alloc(ctx, sizeof *s->params * (size_t)(np ? np : 1));
    memcpy(s->params, ctx->ckpt_params + first, sizeof *s->params * (size_t)np);
    ctx->ckpt_nparams = first;
    /* recorded even when x needs no gradient: the parameters inside do (PyTorch's reentrant
     * checkpoint drops them there) */
    ct_node *n = ct_ctx_alloc(ctx, sizeof *n);
    memset(n, 0, sizeof *n);
    n->op = &ct_checkpoint_def_;
    n->out = out;
    n->nin = 1;
    n->in[0] = x;
    if (x->flags & CT_TF_PARAM) x->uses++;
    n->saved = s;
    n->prev = ctx->tape;
    ctx->tape = n;
    ctx->tape_len++;
    out->node = n;
    out->flags |= CT_TF_REQUIRES_GRAD;
    return out;
}

/* ---- autocast regions (the policy itself is in src/ops/autocast.c) ---- */

ct_status ct_autocast_begin(ct_ctx *ctx, ct_dtype dt) {
    if (dt != CT_BF16 && dt != CT_F16)
        return ct_error(CT_ERR_INVALID, "autocast: dtype %s is not a low-precision float (expected bf16 or f16)", ct_dtype_name(dt));
    int cap = (int)(sizeof ctx->ac_stack / sizeof ctx->ac_stack[0]);
    if (ctx->ac_depth >= cap) return ct_error(CT_ERR_INVALID, "autocast: more than %d nested regions", cap);
    ctx->ac_stack[ctx->ac_depth++] = dt;
    return CT_OK;
}

void ct_autocast_end(ct_ctx *ctx) {
    CT_CHECK(ctx->ac_depth > 0, "ct_autocast_end without ct_autocast_begin");
    ctx->ac_depth--;
    /* like PyTorch, the weight casts live as long as the outermost region */
    if (ctx->ac_depth == 0) ctx->ac_ncache = 0;
}

ct_dtype ct_autocast_dtype(const ct_ctx *ctx) { return ctx->ac_depth ? ctx->ac_stack[ctx->ac_depth - 1] : CT_F32; }

bool ct_checkpoint_recomputing(const ct_ctx *ctx) { return ctx->ckpt_recompute > 0 && ctx->ckpt_counting == 0; }

bool ct_ckpt_active_(const ct_ctx *ctx) { return ctx->ckpt_counting > 0 || ctx->ckpt_recompute > 0; }

ct_tensor *ct_autocast_cache_get_(ct_ctx *ctx, const ct_tensor *param, ct_dtype dt, bool grad) {
    for (int i = 0; i < ctx->ac_ncache; i++)
        if (ctx->ac_cache[i].param == param && ctx->ac_cache[i].dt == dt && ctx->ac_cache[i].grad == grad) return ctx->ac_cache[i].cast;
    return NULL;
}

void ct_autocast_cache_put_(ct_ctx *ctx, ct_tensor *param, ct_tensor *cast, ct_dtype dt, bool grad) {
    int cap = (int)(sizeof ctx->ac_cache / sizeof ctx->ac_cache[0]);
    if (ctx->ac_ncache == cap) return; /* more parameters than slots: cast again (correct, slower) */
    ctx->ac_cache[ctx->ac_ncache].param = param;
    ctx->ac_cache[ctx->ac_ncache].cast = cast;
    ctx->ac_cache[ctx->ac_ncache].dt = dt;
    ctx->ac_cache[ctx->ac_ncache].grad = grad;
    ctx->ac_ncache++;
}
