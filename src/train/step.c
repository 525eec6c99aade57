/* The one training step, and the adapters that make a model trainable. Every loop in ctrain
 * (the trainer, `ctrain train`, the benchmark, the examples, the DDP tests) steps through
 * ct_train_step, so there is one place where the order of the step is written. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctrain/train.h"
#include "train/fsdp_internal.h"

/* ---- built-in models ---- */

static ct_tensor *builtin_forward(ct_ctx *ctx, void *self, ct_tensor *x) { return ct_model_forward(ctx, self, x); }
static ct_tensor *builtin_loss(ct_ctx *ctx, void *self, ct_tensor *x, ct_tensor *y) { return ct_model_loss(ctx, self, x, y); }
static ct_status builtin_save(void *self, const char *path) { return ct_model_save(self, path); }
static ct_status builtin_save_fetch(void *self, const char *path, ct_st_fetch_fn fetch, void *user) {
    return ct_model_save_fetch(self, path, fetch, user);
}
static ct_status builtin_load(void *self, const char *path) { return ct_model_load(self, path); }
static ct_status builtin_config(void *self, ct_st_writer *w) { return ct_model_write_config(self, w); }

/* What the model takes, as its kind states it (ct_model_batch_of) */
static ct_train_expect builtin_expect(const ct_model_config *c) {
    ct_model_batch b = ct_model_batch_of(c);
    ct_train_expect e = {.classes = b.classes, .ignore_index = b.ignore_index, .vocab = b.vocab, .x_numel = b.x_numel,
                         .x_ndim = b.x_ndim, .x_max_len = b.x_max_len};
    memcpy(e.x_shape, b.x_shape, sizeof e.x_shape);
    return e;
}

ct_train_model ct_train_model_builtin(ct_model *m) {
    return (ct_train_model){.params = ct_model_params(m), .forward = builtin_forward, .loss = builtin_loss,
                            .save = builtin_save, .save_fetch = builtin_save_fetch, .load = builtin_load, .save_config = builtin_config,
                            .kind = ct_model_kind_name(ct_model_config_of(m)->kind), .describe = ct_model_describe(m),
                            .self = m, .expect = builtin_expect(ct_model_config_of(m))};
}

/* ---- any module ---- */

static ct_tensor *module_forward(ct_ctx *ctx, void *self, ct_tensor *x) { return ct_module_forward(ctx, self, x); }

ct_train_model ct_train_model_module(ct_module *mod, ct_params *P, const char *kind) {
    return (ct_train_model){.params = P, .forward = module_forward, .kind = kind, .describe = kind, .self = mod};
}

static void dims_str(const int64_t *d, int n, char *b, size_t cap) {
    size_t o = (size_t)snprintf(b, cap, "[");
    for (int i = 0; i < n && o < cap; i++) o += (size_t)snprintf(b + o, cap - o, i ? ", %lld" : "%lld", (long long)d[i]);
    if (o < cap) snprintf(b + o, cap - o, "]");
}

ct_status ct_train_check_data(const ct_train_model *m, const ct_dataset *d) {
    const ct_train_expect *e = &m->expect;
    const char *src = ct_dataset_source(d), *kind = m->kind ? m->kind : "model";
    int64_t dims[CT_MAX_DIMS];
    int nd = ct_dataset_x_shape(d, dims);
    char have[96], want[96];
    dims_str(dims, nd, have, sizeof have);
    bool tokens = ct_dataset_x_dtype(d) != CT_F32;
    bool stated = e->vocab > 0 || e->x_numel > 0 || e->x_ndim > 0;
    if (stated && tokens != (e->vocab > 0))
        return ct_error(CT_ERR_FORMAT, "%s: samples are %s but the model '%s' takes %s", src, tokens ? "token ids" : "f32 values",
                        kind, e->vocab > 0 ? "token ids" : "f32 values");
    if (e->x_numel > 0 && ct_dataset_x_numel(d) != e->x_numel)
        return ct_error(CT_ERR_FORMAT, "%s: samples are %s (%lld values) but the model '%s' takes %lld values", src, have,
                        (long long)ct_dataset_x_numel(d), kind, (long long)e->x_numel);
    if (e->x_ndim > 0) {
        bool same = nd == e->x_ndim;
        for (int i = 0; same && i < nd; i++) same = e->x_shape[i] <= 0 || e->x_shape[i] == dims[i];
        if (!same) {
            dims_str(e->x_shape, e->x_ndim, want, sizeof want);
            return ct_error(CT_ERR_FORMAT, "%s: samples are %s but the model '%s' takes %s", src, have, kind, want);
        }
    }
    if (e->x_max_len > 0 && nd >= 1 && dims[0] > e->x_max_len)
        return ct_error(CT_ERR_FORMAT, "%s: samples are %lld long but the model '%s' takes at most %lld (its block size)", src,
                        (long long)dims[0], kind, (long long)e->x_max_len);
    ct_status st = ct_dataset_check_values(d, e->vocab, e->classes, e->ignore_index);
    if (st != CT_OK) {
        /* ct_error formats into the buffer ct_last_error() returns: copy the message out first */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ct_last_error());
        if (e->vocab > 0)
            return ct_error(st, "%s: the model '%s' has a vocabulary of %lld", msg, kind, (long long)e->vocab);
        return ct_error(st, "%s: the model '%s' has %lld classes", msg, kind, (long long)e->classes);
    }
    return CT_OK;
}

/* Cross-entropy of outputs [..., C] against targets [...] (rows of the last dim). */
static ct_tensor *default_loss(ct_ctx *ctx, const ct_train_model *m, ct_tensor *x, ct_tensor *y) {
    ct_tensor *out = m->forward(ctx, m->self, x);
    int64_t C = out->shape[out->ndim - 1], rows = ct_numel(out) / C;
    return ct_cross_entropy(ctx, ct_reshape(ctx, out, 2, (int64_t[]){rows, C}), ct_reshape(ctx, y, 1, (int64_t[]){rows}), -100);
}

ct_train_batch ct_train_batch_of(ct_dtype x_dtype, void *x, int x_ndim, const int64_t *x_shape, int32_t *y, int y_ndim,
                                 const int64_t *y_shape) {
    CT_CHECK(x_ndim >= 1 && x_ndim <= CT_MAX_DIMS && y_ndim >= 1 && y_ndim <= CT_MAX_DIMS,
             "ct_train_batch_of: x has %d dims, y %d (1..%d)", x_ndim, y_ndim, CT_MAX_DIMS);
    ct_train_batch b;
    memset(&b, 0, sizeof b);
    b.x.dtype = x_dtype;
    b.x.ndim = x_ndim;
    b.x.data = x;
    memcpy(b.x.shape, x_shape, sizeof(int64_t) * (size_t)x_ndim);
    b.y.dtype = CT_I32;
    b.y.ndim = y_ndim;
    b.y.data = y;
    memcpy(b.y.shape, y_shape, sizeof(int64_t) * (size_t)y_ndim);
    return b;
}

/* the step's gradients cleared (FSDP: where they have memory) */
static void zero_grads(const ct_step_args *a) {
    if (a->fsdp) ct_fsdp_zero_grad_(a->fsdp);
    else ct_params_zero_grad(a->model->params);
}

/* FSDP's end of a step, in PyTorch's order: the shards unscaled (loss scaling; an overflow on
 * any rank skips the step everywhere), clipping by the norm of every rank's shards, the
 * shards' step */
static ct_status fsdp_finish(const ct_step_args *a, double loss, ct_step_result *r) {
    bool skip = false;
    ct_status st = a->scaler ? ct_fsdp_unscale(a->fsdp, a->scaler, &skip) : CT_OK;
    double norm = NAN;
    if (st == CT_OK && !skip && a->clip_norm > 0) norm = ct_fsdp_clip_grad_norm(a->fsdp, a->clip_norm);
    if (st == CT_OK) st = skip ? ct_fsdp_skip_step(a->fsdp) : ct_fsdp_step(a->fsdp, a->lr);
    if (st == CT_OK && a->scaler) ct_grad_scaler_update(a->scaler, skip);
    zero_grads(a);
    ct_ctx_reset(a->ctx);
    if (r)
        *r = (ct_step_result){.loss = loss, .grad_norm = norm, .skipped = skip,
                              .scale = a->scaler ? ct_grad_scaler_scale(a->scaler) : 1.0f};
    return st;
}

ct_status ct_train_step(const ct_step_args *a, const ct_train_batch *micro, int n_micro, ct_step_result *r) {
    CT_CHECK(a->ctx && a->model && a->opt && micro && n_micro >= 1, "ct_train_step: ctx, model, optimizer and %d micro-batches",
             n_micro);
    const ct_train_model *m = a->model;
    ct_device dev = ct_params_device(m->params);
    double loss_sum = 0;
    ct_status ds0 = CT_OK; /* FSDP: a collective failed (the group is unusable) */
    CT_CHECK(!a->zero || a->ddp, "ct_train_step: a sharded step (zero) without its DDP");
    CT_CHECK(!a->fsdp || (!a->ddp && !a->zero), "ct_train_step: FSDP and DDP together");
    if (a->fsdp) {
        ct_status fs = ct_fsdp_begin_step(a->fsdp);
        if (fs != CT_OK) return fs;
    }
    /* a sharded step averages the gradients itself unless something reads them first */
    if (a->zero) {
        ct_status zs = ct_zero_begin_step(a->zero, !a->scaler && !(a->clip_norm > 0));
        if (zs != CT_OK) return zs;
    }
    for (int k = 0; k < n_micro; k++) {
        /* DDP all-reduces only during the last backward; the others accumulate locally */
        if (a->ddp && n_micro > 1) ct_ddp_set_no_sync(a->ddp, k < n_micro - 1);
        ct_ctx_set_step(a->ctx, (uint64_t)(a->step * n_micro + k));
        const ct_train_batch *b = &micro[k];
        ct_tensor *x = ct_wrap(a->ctx, b->x.dtype, b->x.data, b->x.ndim, b->x.shape);
        ct_tensor *y = ct_wrap(a->ctx, CT_I32, b->y.data, b->y.ndim, b->y.shape);
        if (dev.type != CT_DEV_CPU) { /* the batch goes where the parameters are */
            ct_status cs = ct_tensor_to(a->ctx, x, dev, &x);
            if (cs == CT_OK) cs = ct_tensor_to(a->ctx, y, dev, &y);
            if (cs != CT_OK) { ct_ctx_reset(a->ctx); return cs; }
        }
        /* like `with torch.autocast(...)`: forward and loss only */
        if (a->amp != CT_F32) {
            ct_status as = ct_autocast_begin(a->ctx, a->amp);
            if (as != CT_OK) return as;
        }
        ct_tensor *loss = m->loss ? m->loss(a->ctx, m->self, x, y) : default_loss(a->ctx, m, x, y);
        if (a->amp != CT_F32) ct_autocast_end(a->ctx);
        loss_sum += ct_item(loss);
        /* the mean over the micro-batches: d(sum_k loss_k / K) */
        if (n_micro > 1) loss = ct_scale(a->ctx, loss, 1.0f / (float)n_micro);
        if (a->scaler) loss = ct_scale(a->ctx, loss, ct_grad_scaler_scale(a->scaler));
        if (a->fsdp && (ds0 = ct_fsdp_pre_backward(a->fsdp)) != CT_OK) break;
        ct_backward(a->ctx, loss);
        /* every unit's gradients reduce-scattered during it */
        if (a->fsdp && (ds0 = ct_fsdp_post_backward(a->fsdp)) != CT_OK) break;
        ct_status ds = ct_ctx_status(a->ctx); /* a device op without a kernel, out of memory */
        if (ds != CT_OK) { /* the step is lost; DDP's collectives still end, so that ranks stay matched */
            if (a->ddp) {
                ct_ddp_set_no_sync(a->ddp, false);
                (void)ct_ddp_finish(a->ddp);
                if (a->zero) (void)ct_zero_skip_step(a->zero);
            }
            zero_grads(a);
            ct_ctx_reset(a->ctx);
            return ds;
        }
        /* activations of one micro-batch at a time: that is what accumulation saves */
        if (k < n_micro - 1) ct_ctx_reset(a->ctx);
    }
    if (ds0 != CT_OK) {
        zero_grads(a);
        ct_ctx_reset(a->ctx);
        return ds0;
    }
    if (a->fsdp) return fsdp_finish(a, loss_sum / n_micro, r);
    ct_status st = a->ddp ? ct_ddp_finish(a->ddp) : CT_OK;
    if (st == CT_OK && a->zero) st = ct_zero_gradients_final(a->zero);
    double norm = NAN;
    bool skip = false;
    if (st == CT_OK) {
        /* PyTorch's order: unscale, then clip the true gradients, then step unless inf/NaN */
        if (a->scaler) skip = !ct_grad_scaler_unscale_and_check(a->scaler, m->params);
        if (a->clip_norm > 0 && !skip) norm = ct_clip_grad_norm(m->params, (float)a->clip_norm);
        if (!skip) ct_optim_step(a->opt, a->lr);
        if (a->scaler) ct_grad_scaler_update(a->scaler, skip);
        st = ct_optim_status(a->opt);
    }
    ct_params_zero_grad(m->params);
    ct_ctx_reset(a->ctx);
    if (r) {
        r->loss = loss_sum / n_micro;
        r->grad_norm = norm;
        r->skipped = skip;
        r->scale = a->scaler ? ct_grad_scaler_scale(a->scaler) : 1.0f;
    }
    return st;
}
