/* Parameter stores. All trainable parameters of a model share one flat f32 buffer, and
 * their gradients another with the same layout: the optimizer is one loop, and DDP buckets
 * are plain slices of the gradient buffer. Buffers (state without gradient) live apart. */
#include <stdlib.h>
#include <string.h>

#include "core/kernel.h"
#include "ctrain/tensor.h"

typedef struct {
    ct_tensor *t;
    ct_init init;
    double arg;
    size_t offset; /* floats into data/grad (or into bufdata for buffers) */
    bool is_buffer;
} param_rec;

struct ct_params {
    param_rec *recs;
    int n, cap;
    float *data, *grad, *bufdata;
    bool grad_external; /* grad points at caller-owned storage (ct_params_set_grad_storage) */
    bool data_external; /* data likewise (ct_params_set_data_storage) */
    ct_device device;   /* where data, grad and bufdata are (ct_params_to) */
    size_t numel, bufnumel;
    bool finalized;
    ct_grad_hook hook;
    void *hook_user;
    ct_unit_hook unit_hook; /* ct_unit_enter / ct_unit_leave (FSDP gathers and frees units) */
    void *unit_user;
    ct_status failed; /* sticky: a registration or a module construction ran out of memory */
    bool stale;       /* some gradient may still be CT_TF_GRAD_STALE (ct_params_zero_grad) */
    uint64_t seed;    /* what the values are made from (finalize's seed) */
};

ct_status ct_params_create(ct_params **out) {
    *out = calloc(1, sizeof(ct_params));
    return *out ? CT_OK : ct_error(CT_ERR_NOMEM, "out of memory creating a parameter store");
}

void ct_params_free(ct_params *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) {
        free((char *)p->recs[i].t->name);
        free(p->recs[i].t->grad);
        free(p->recs[i].t);
    }
    free(p->recs);
    if (p->device.type != CT_DEV_CPU) {
        const ct_device_hooks *h = ct_device_hooks_get(p->device, "ct_params_free");
        h->free(p->data);
        h->free(p->grad);
        h->free(p->bufdata);
        free(p);
        return;
    }
    if (!p->data_external) free(p->data);
    if (!p->grad_external) free(p->grad);
    free(p->bufdata);
    free(p);
}

void ct_params_fail(ct_params *p, ct_status st) {
    if (p && !p->failed) p->failed = st;
}
ct_status ct_params_status(const ct_params *p) { return p->failed; }

/* Out of memory returns NULL and marks the store failed (finalize then refuses it), so a
 * builder checks once at the end (nn.h); a failed store registers nothing more. */
static ct_tensor *add_rec(ct_params *p, const char *name, int ndim, const int64_t *shape, ct_init init, double arg, bool buf) {
    CT_CHECK(!p->finalized, "ct_param('%s') after ct_params_finalize", name);
    if (p->failed) return NULL;
    CT_CHECK(ndim >= 0 && ndim <= CT_MAX_DIMS, "parameter '%s' with %d dims", name, ndim);
    CT_CHECK(!ct_params_find(p, name), "duplicate parameter name '%s'", name);
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 32;
        param_rec *r = realloc(p->recs, (size_t)cap * sizeof *r);
        if (!r) goto oom;
        p->recs = r;
        p->cap = cap;
    }
    ct_tensor *t = calloc(1, sizeof *t);
    char *nm = strdup(name);
    if (!t || !nm) { free(t); free(nm); goto oom; }
    t->dtype = CT_F32;
    t->device = CT_CPU;
    t->ndim = ndim;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) { t->shape[i] = shape[i]; t->stride[i] = s; s *= shape[i]; }
    t->flags = buf ? 0 : (CT_TF_PARAM | CT_TF_REQUIRES_GRAD);
    t->param_id = p->n;
    t->params = p;
    t->name = nm;
    p->recs[p->n++] = (param_rec){.t = t, .init = init, .arg = arg, .is_buffer = buf};
    return t;
oom:
    ct_params_fail(p, CT_ERR_NOMEM);
    ct_error(CT_ERR_NOMEM, "out of memory registering parameter '%s'", name);
    return NULL;
}

ct_tensor *ct_param(ct_params *p, const char *name, int ndim, const int64_t *shape, ct_init init, double arg) {
    return add_rec(p, name, ndim, shape, init, arg, false);
}
ct_tensor *ct_param_buffer(ct_params *p, const char *name, int ndim, const int64_t *shape, ct_init init, double arg) {
    return add_rec(p, name, ndim, shape, init, arg, true);
}

/* elements [first, first + n) of a parameter of `init`: element i is a function of the
 * parameter's key and i alone, so any part of a parameter can be made without the rest */
static void init_values(float *d, int64_t first, int64_t n, ct_init init, double arg, uint64_t key) {
    switch (init) {
    case CT_INIT_ZEROS: memset(d, 0, (size_t)n * sizeof *d); break;
    case CT_INIT_ONES: for (int64_t i = 0; i < n; i++) d[i] = 1.0f; break;
    case CT_INIT_KAIMING_UNIFORM: {
        /* PyTorch: kaiming_uniform_(a=sqrt(5)) on weights and U(±1/sqrt(fan_in)) on biases
         * both reduce to U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
        double b = arg > 0 ? 1.0 / sqrt(arg) : 0;
        for (int64_t i = 0; i < n; i++) d[i] = (float)((2.0 * ct_rand_uniform_d(key, (uint64_t)(first + i)) - 1.0) * b);
        break;
    }
    case CT_INIT_NORMAL:
        for (int64_t i = 0; i < n; i++) d[i] = (float)(arg * ct_rand_normal(key, (uint64_t)(first + i)));
        break;
    case CT_INIT_UNIFORM:
        for (int64_t i = 0; i < n; i++) d[i] = (float)((2.0 * ct_rand_uniform_d(key, (uint64_t)(first + i)) - 1.0) * arg);
        break;
    }
}

static uint64_t param_key(uint64_t seed, int i) { return ct_mix64(seed * 1315423911ull + (uint64_t)i + 1); }

/* the views of the flat buffers (parameters and their gradients; NULL while deferred) */
static void point_views(ct_params *p) {
    for (int i = 0; i < p->n; i++) {
        param_rec *r = &p->recs[i];
        if (r->is_buffer) continue;
        r->t->data = p->data ? p->data + r->offset : NULL;
        r->t->grad->data = p->grad ? p->grad + r->offset : NULL;
    }
}

/* Offsets (16-float, 64-byte alignment per tensor keeps every parameter SIMD- and
 * cache-aligned), the buffers with their values, the gradient views; no flat parameters or
 * gradients yet (ct_params_materialize) */
static ct_status lay_out(ct_params *p, uint64_t seed) {
    CT_CHECK(!p->finalized, "ct_params_finalize called twice");
    if (p->failed) return ct_error(p->failed, "parameter store incomplete: out of memory while registering parameters or building modules");
    size_t off = 0, boff = 0;
    for (int i = 0; i < p->n; i++) {
        size_t n = (size_t)ct_numel(p->recs[i].t);
        size_t *o = p->recs[i].is_buffer ? &boff : &off;
        p->recs[i].offset = *o;
        *o += (n + 15) & ~(size_t)15;
    }
    p->numel = off;
    p->bufnumel = boff;
    p->seed = seed;
    if (posix_memalign((void **)&p->bufdata, 64, (boff ? boff : 16) * sizeof(float)))
        return ct_error(CT_ERR_NOMEM, "cannot allocate %zu buffer values", boff);
    memset(p->bufdata, 0, boff * sizeof(float));
    for (int i = 0; i < p->n; i++) {
        param_rec *r = &p->recs[i];
        if (r->is_buffer) {
            r->t->data = p->bufdata + r->offset;
            init_values(r->t->data, 0, ct_numel(r->t), r->init, r->arg, param_key(seed, i));
            continue;
        }
        /* the grad descriptor is a view of the flat gradient buffer */
        ct_tensor *g = calloc(1, sizeof *g);
        if (!g) return ct_error(CT_ERR_NOMEM, "out of memory");
        *g = *r->t;
        g->flags = 0;
        g->name = NULL;
        g->grad = NULL;
        r->t->grad = g;
    }
    p->finalized = true;
    point_views(p);
    return CT_OK;
}

ct_status ct_params_finalize(ct_params *p, uint64_t seed) {
    ct_status st = lay_out(p, seed);
    return st == CT_OK ? ct_params_materialize(p) : st;
}
ct_status ct_params_finalize_deferred(ct_params *p, uint64_t seed) { return lay_out(p, seed); }
/* deferred: finalized, and the flat parameters or gradients have no storage yet */
bool ct_params_is_deferred(const ct_params *p) { return p->finalized && (!p->data || !p->grad); }
uint64_t ct_params_seed(const ct_params *p) { return p->seed; }

void ct_params_init_range(const ct_params *p, uint64_t seed, size_t lo, size_t hi, float *dst) {
    CT_CHECK(p->finalized && lo <= hi && hi <= p->numel, "ct_params_init_range [%zu, %zu) of %zu parameters%s", lo, hi,
             p->numel, p->finalized ? "" : " before finalize");
    memset(dst, 0, (hi - lo) * sizeof(float)); /* the padding between parameters */
    for (int i = 0; i < p->n; i++) {
        const param_rec *r = &p->recs[i];
        if (r->is_buffer) continue;
        size_t a = r->offset, b = a + (size_t)ct_numel(r->t);
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        if (a < b) init_values(dst + (a - lo), (int64_t)(a - r->offset), (int64_t)(b - a), r->init, r->arg, param_key(seed, i));
    }
}

void ct_params_defer(ct_params *p) {
    CT_CHECK(p->finalized, "ct_params_defer: a store not finalized");
    /* a device store deferred is only freed (materialize refuses it) */
    void (*release)(void *) = p->device.type != CT_DEV_CPU ? ct_device_hooks_get(p->device, "ct_params_defer")->free : free;
    if (!p->data_external) release(p->data);
    if (!p->grad_external) release(p->grad);
    p->data = p->grad = NULL;
    p->data_external = p->grad_external = false;
    p->stale = false;
    for (int i = 0; i < p->n; i++)
        if (!p->recs[i].is_buffer) p->recs[i].t->flags &= ~(uint32_t)CT_TF_GRAD_STALE;
    point_views(p);
}

ct_status ct_params_materialize(ct_params *p) {
    CT_CHECK(p->finalized, "ct_params_materialize before ct_params_finalize_deferred");
    if (!ct_params_is_deferred(p)) return CT_OK;
    CT_CHECK(!p->data && !p->grad, "ct_params_materialize: one flat buffer has storage, the other not");
    CT_CHECK(p->device.type == CT_DEV_CPU, "ct_params_materialize: a device store given up by ct_params_defer (free it)");
    size_t n = p->numel ? p->numel : 16;
    if (posix_memalign((void **)&p->data, 64, n * sizeof(float))) p->data = NULL;
    if (p->data && posix_memalign((void **)&p->grad, 64, n * sizeof(float))) p->grad = NULL;
    if (!p->grad) {
        free(p->data);
        p->data = NULL;
        return ct_error(CT_ERR_NOMEM, "cannot allocate %zu parameters", p->numel);
    }
    ct_params_init_range(p, p->seed, 0, p->numel, p->data);
    memset(p->grad, 0, p->numel * sizeof(float));
    point_views(p);
    return CT_OK;
}

int ct_params_count(const ct_params *p) { return p->n; }
ct_tensor *ct_params_get(const ct_params *p, int i) {
    CT_CHECK(i >= 0 && i < p->n, "parameter index %d out of range [0, %d)", i, p->n);
    return p->recs[i].t;
}
ct_tensor *ct_params_find(const ct_params *p, const char *name) {
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->recs[i].t->name, name)) return p->recs[i].t;
    return NULL;
}
float *ct_params_data(const ct_params *p) { return p->data; }
/* Gives a stale gradient its zeros. Stale means "reads as zeros": ct_params_zero_grad only
 * flags the parameters (PyTorch's set_to_none, without the None), backward's first write of
 * each stores instead of adding (autograd.c), and whatever reads a gradient that backward left
 * untouched gets the zeros here. Takes a const store because readers do: only the tensors and
 * the gradient memory, which the store points to, change. */
static void settle(const param_rec *r) {
    ct_tensor *t = r->t;
    if (!(t->flags & CT_TF_GRAD_STALE)) return;
    t->flags &= ~(uint32_t)CT_TF_GRAD_STALE;
    memset(t->grad->data, 0, (size_t)ct_numel(t) * sizeof(float));
}

static void settle_all(ct_params *p) {
    if (!p->stale) return;
    for (int i = 0; i < p->n; i++) settle(&p->recs[i]);
    p->stale = false;
}

/* the flat buffer is read or written through the pointer: no gradient may stay stale */
float *ct_params_grad(const ct_params *p) {
    settle_all((ct_params *)p); /* the store is never const itself: callers hold it from ct_params_create */
    return p->grad;
}
float *ct_params_grad_range(const ct_params *p, int lo, int hi) {
    CT_CHECK(0 <= lo && lo <= hi && hi < p->n, "ct_params_grad_range(%d, %d) with %d parameters", lo, hi, p->n);
    for (int i = lo; i <= hi; i++) settle(&p->recs[i]);
    return p->grad + p->recs[lo].offset;
}
size_t ct_params_numel(const ct_params *p) { return p->numel; }
size_t ct_params_offset(const ct_params *p, int i) {
    CT_CHECK(i >= 0 && i < p->n, "parameter index %d out of range", i);
    return p->recs[i].offset;
}
float *ct_params_buffer_data(const ct_params *p) { return p->bufdata; }
size_t ct_params_buffer_numel(const ct_params *p) { return p->bufnumel; }
bool ct_params_is_buffer(const ct_params *p, int i) {
    CT_CHECK(i >= 0 && i < p->n, "parameter index %d out of range", i);
    return p->recs[i].is_buffer;
}
/* Moves one flat buffer (*cur, owned by the store unless *external) to buf, or with buf NULL
 * back to storage the store owns (always with the values); the caller re-points the views.
 * On a device buf is the device's memory too, and the copy is queued on its compute stream. */
static ct_status move_flat(ct_params *p, float **cur, bool *external, float *buf, bool copy, const char *what) {
    const bool dev = p->device.type != CT_DEV_CPU;
    const size_t bytes = (p->numel ? p->numel : 16) * sizeof(float);
    float *own = NULL;
    if (!buf) {
        if (!*external) return CT_OK;
        if (dev) {
            ct_status st = ct_device_alloc(p->device, bytes, (void **)&own);
            if (st != CT_OK) return st;
        } else if (posix_memalign((void **)&own, 64, bytes)) {
            return ct_error(CT_ERR_NOMEM, "cannot allocate %zu %s", p->numel, what);
        }
        buf = own;
        copy = true;
    }
    if (buf == *cur) return CT_OK;
    if ((uintptr_t)buf % 64) return ct_error(CT_ERR_INVALID, "storage for the %s at %p is not 64-byte aligned", what, (void *)buf);
    if (copy && *cur && p->numel) {
        ct_status st = ct_device_copy_within(p->device, buf, *cur, p->numel * sizeof(float));
        if (st != CT_OK) {
            if (own) ct_device_free(p->device, own);
            return st;
        }
    }
    if (!*external) ct_device_free(p->device, *cur); /* the private buffer would only cost memory */
    *cur = buf;
    *external = own == NULL;
    return CT_OK;
}

ct_status ct_params_set_grad_storage(ct_params *p, float *buf) {
    CT_CHECK(p->finalized, "ct_params_set_grad_storage before ct_params_finalize");
    settle_all(p); /* the copy carries values, not stale flags */
    ct_status st = move_flat(p, &p->grad, &p->grad_external, buf, true, "gradients");
    if (st == CT_OK) point_views(p);
    return st;
}

ct_status ct_params_set_data_storage(ct_params *p, float *buf, bool copy) {
    CT_CHECK(p->finalized, "ct_params_set_data_storage before ct_params_finalize");
    ct_status st = move_flat(p, &p->data, &p->data_external, buf, copy, "parameters");
    if (st == CT_OK) point_views(p); /* a deferred store's caller makes the values */
    return st;
}

void ct_params_zero_grad(ct_params *p) {
    if (!p->grad) return; /* deferred: no gradients yet */
    if (p->device.type == CT_DEV_CPU) {
        /* flags, not a memset: the memset of the MLP's 7 MB was 2.7% of its step, and
         * backward rewrites nearly every gradient anyway (see settle) */
        for (int i = 0; i < p->n; i++) {
            param_rec *r = &p->recs[i];
            if (r->is_buffer) continue;
            r->t->flags |= CT_TF_GRAD_STALE;
            /* the padding up to the next parameter: whole-buffer passes may have written it
             * (clipping by a NaN norm), and the norm and DDP read it */
            size_t n = (size_t)ct_numel(r->t), pad = ((n + 15) & ~(size_t)15) - n;
            if (pad) memset(p->grad + r->offset + n, 0, pad * sizeof(float));
        }
        p->stale = p->n > 0;
        return;
    }
    /* on a device the gradients stay plain memory, zeroed on its stream; a failure here is
     * the device's sticky error: the next op or copy reports it */
    (void)ct_device_hooks_get(p->device, "zero_grad")->zero(p->device.index, p->grad, p->numel * sizeof(float));
}

ct_device ct_params_device(const ct_params *p) { return p->device; }

/* n floats of src (on `from`) copied into new storage on `to` (host: 64-byte aligned) */
static ct_status move_buf(ct_device from, ct_device to, const float *src, size_t n, float **out) {
    size_t bytes = (n ? n : 16) * sizeof(float);
    *out = NULL;
    if (to.type == CT_DEV_CPU) {
        if (posix_memalign((void **)out, 64, bytes)) { *out = NULL; return ct_error(CT_ERR_NOMEM, "ct_params_to: cannot allocate %zu floats", n); }
        ct_status st = ct_device_hooks_get(from, "ct_params_to")->copy(from.index, *out, src, n * sizeof(float), CT_COPY_D2H);
        if (st != CT_OK) { free(*out); *out = NULL; }
        return st;
    }
    const ct_device_hooks *h = ct_device_hooks_get(to, "ct_params_to");
    ct_status st = h->alloc(to.index, bytes, (void **)out);
    if (st == CT_OK && n) st = h->copy(to.index, *out, src, n * sizeof(float), CT_COPY_H2D);
    if (st != CT_OK && *out) { h->free(*out); *out = NULL; }
    return st;
}

static void free_buf(ct_device d, float *b) {
    if (d.type == CT_DEV_CPU) free(b);
    else ct_device_hooks_get(d, "ct_params_to")->free(b);
}

ct_status ct_params_to(ct_params *p, ct_device dev) {
    char b1[32], b2[32];
    CT_CHECK(p->finalized, "ct_params_to before ct_params_finalize");
    if (ct_device_eq(p->device, dev)) return CT_OK;
    if (ct_params_is_deferred(p))
        return ct_error(CT_ERR_INVALID, "ct_params_to %s: the values are deferred (ct_params_materialize first)",
                        ct_device_str(dev, b2, sizeof b2));
    if (p->device.type != CT_DEV_CPU && dev.type != CT_DEV_CPU)
        return ct_error(CT_ERR_UNSUPPORTED, "ct_params_to: %s to %s: move through the CPU", ct_device_str(p->device, b1, sizeof b1),
                        ct_device_str(dev, b2, sizeof b2));
    if (p->grad_external || p->data_external)
        return ct_error(CT_ERR_INVALID, "ct_params_to %s: the %s in external storage (ct_params_set_%s_storage)",
                        ct_device_str(dev, b2, sizeof b2), p->grad_external ? "gradients are" : "parameters are",
                        p->grad_external ? "grad" : "data");
    ct_device gpu = dev.type == CT_DEV_CPU ? p->device : dev;
    if (!ct_device_hooks_get(gpu, "ct_params_to")) return CT_ERR_UNSUPPORTED;
    settle_all(p); /* device gradients are never stale */
    float *nd = NULL, *ng = NULL, *nb = NULL;
    ct_status st = move_buf(p->device, dev, p->data, p->numel, &nd);
    if (st == CT_OK) st = move_buf(p->device, dev, p->grad, p->numel, &ng);
    if (st == CT_OK) st = move_buf(p->device, dev, p->bufdata, p->bufnumel, &nb);
    if (st != CT_OK) { /* the store stays where it was */
        free_buf(dev, nd); free_buf(dev, ng); free_buf(dev, nb);
        return st;
    }
    free_buf(p->device, p->data); free_buf(p->device, p->grad); free_buf(p->device, p->bufdata);
    p->data = nd; p->grad = ng; p->bufdata = nb;
    p->device = dev;
    for (int i = 0; i < p->n; i++) {
        param_rec *r = &p->recs[i];
        r->t->device = dev;
        r->t->data = (r->is_buffer ? p->bufdata : p->data) + r->offset;
        if (r->t->grad) { r->t->grad->device = dev; r->t->grad->data = p->grad + r->offset; }
    }
    return CT_OK;
}
size_t ct_params_bytes(const ct_params *p) { return (2 * p->numel + p->bufnumel) * sizeof(float); }
void ct_params_set_grad_hook(ct_params *p, ct_grad_hook fn, void *user) { p->hook = fn; p->hook_user = user; }

void ct_params_set_unit_hook(ct_params *p, ct_unit_hook fn, void *user) { p->unit_hook = fn; p->unit_user = user; }

static void unit_call(ct_ctx *ctx, const ct_tensor *param, bool enter) {
    ct_params *p = param ? param->params : NULL;
    if (p && p->unit_hook && param->param_id >= 0) p->unit_hook(p->unit_user, ctx, p, param->param_id, enter);
}
void ct_unit_enter(ct_ctx *ctx, const ct_tensor *param) { unit_call(ctx, param, true); }
void ct_unit_leave(ct_ctx *ctx, const ct_tensor *param) { unit_call(ctx, param, false); }

/* called by autograd when a parameter's last gradient of the step has arrived */
void ct_params_fire_hook_(ct_params *p, int i) {
    settle(&p->recs[i]); /* a gradient no op wrote (no path from the loss): the hook reads zeros */
    if (p->hook) p->hook(p->hook_user, p, i);
}
