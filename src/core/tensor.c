/* Tensors and the per-step context. The context's arena hands out activation memory
 * in 64-byte aligned pieces from large blocks; ct_ctx_reset rewinds it in O(blocks), so the
 * training loop does no malloc after the first step and the peak is exact. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx_internal.h"
#include "core/kernel.h"
#include "ctrain/tensor.h"

#define ARENA_ALIGN 64

ct_ctx_opts ct_ctx_default_opts(void) { return (ct_ctx_opts){.arena_block = 64u << 20, .seed = 0}; }

ct_status ct_ctx_create(const ct_ctx_opts *opts, ct_ctx **out) {
    *out = NULL;
    ct_ctx_opts o = opts ? *opts : ct_ctx_default_opts();
    /* the GEMM workspace of this thread count, so that no op has to allocate it */
    ct_status st = ct_kernel_reserve(ct_get_num_threads());
    if (st != CT_OK) return st;
    ct_ctx *c = calloc(1, sizeof *c);
    if (!c) return ct_error(CT_ERR_NOMEM, "out of memory creating a context");
    c->block_size = o.arena_block ? o.arena_block : (64u << 20);
    c->grad_enabled = true;
    c->training = true;
    c->seed = o.seed;
    *out = c;
    return CT_OK;
}

void ct_ctx_free(ct_ctx *c) {
    if (!c) return;
    for (ct_block *b = c->head, *n; b; b = n) { n = b->next; free(b->mem); free(b); }
    for (ct_block *b = c->shead, *n; b; b = n) { n = b->next; free(b->mem); free(b); }
    for (ct_block *b = c->thead, *n; b; b = n) { n = b->next; free(b->mem); free(b); }
    ct_ctx_dev_release_(c);
    free(c->dev_bufs);
    free(c->gfree);
    free(c->ckpt_params);
    free(c);
}

void ct_ctx_reset(ct_ctx *c) {
    /* parameters count their uses per step; a forward without backward leaves counts behind */
    for (ct_node *n = c->tape; n; n = n->prev) {
        for (int i = 0; i < n->nin; i++)
            if (n->in[i] && (n->in[i]->flags & CT_TF_PARAM)) n->in[i]->uses = 0;
        if (n->op == &ct_checkpoint_def_) {
            const ct_ckpt_saved *s = n->saved;
            for (int i = 0; i < s->nparams; i++) s->params[i]->uses = 0;
        }
    }
    for (ct_block *b = c->head; b; b = b->next) b->used = 0;
    c->cur = c->head;
    c->used = 0;
    ct_ctx_scratch_rewind_(c);
    c->gfree_n = 0;
    c->bw_depth = 0;
    c->ac_ncache = 0;
    c->tape = NULL;
    c->tape_len = 0;
    ct_ctx_dev_release_(c);
}

size_t ct_ctx_peak_bytes(const ct_ctx *c) { return c->peak; }
size_t ct_ctx_used_bytes(const ct_ctx *c) { return c->used; }
size_t ct_ctx_reserved_bytes(const ct_ctx *c) { return c->reserved; }
void ct_ctx_set_training(ct_ctx *c, bool t) { c->training = t; }
bool ct_ctx_training(const ct_ctx *c) { return c->training; }
void ct_ctx_set_step(ct_ctx *c, uint64_t step) { c->step = step; }

/* Bump allocation from one block list (the main arena or the backward scratch). */
static void *arena_alloc(ct_ctx *c, ct_block **head, ct_block **cur, size_t *used, size_t need) {
    for (;;) {
        ct_block *b = *cur;
        if (b && b->size - b->used >= need) {
            void *p = b->mem + b->used;
            b->used += need;
            *used += need;
            if (c->used + c->sused + c->tused > c->peak) c->peak = c->used + c->sused + c->tused;
            return p;
        }
        if (b && b->next) { /* move to the next kept block; the rest of this one is waste */
            *used += b->size - b->used;
            b->used = b->size;
            *cur = b->next;
            continue;
        }
        size_t sz = need > c->block_size ? need : c->block_size;
        ct_block *nb = calloc(1, sizeof *nb);
        if (!nb || posix_memalign((void **)&nb->mem, ARENA_ALIGN, sz)) {
            ct_fatal(__FILE__, __LINE__, "out of memory: activation arena needs %zu more bytes (%zu in use, peak %zu)",
                     sz, c->used + c->sused + c->tused, c->peak);
        }
        nb->size = sz;
        c->reserved += sz;
        if (b) {
            *used += b->size - b->used;
            b->used = b->size;
            nb->next = b->next;
            b->next = nb;
        } else {
            nb->next = *head;
            *head = nb;
        }
        *cur = nb;
    }
}

void *ct_ctx_alloc(ct_ctx *c, size_t bytes) {
    size_t need = (bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (need == 0) need = ARENA_ALIGN;
    if (c->temp_depth > 0 && !c->no_temp && !c->grad_alloc) return arena_alloc(c, &c->thead, &c->tcur, &c->tused, need);
    if (c->bw_depth > 0 && !c->grad_alloc) return arena_alloc(c, &c->shead, &c->scur, &c->sused, need);
    return arena_alloc(c, &c->head, &c->cur, &c->used, need);
}

void *ct_ctx_alloc_keep(ct_ctx *c, size_t bytes) {
    bool prev = c->no_temp;
    c->no_temp = true;
    void *p = ct_ctx_alloc(c, bytes);
    c->no_temp = prev;
    return p;
}

/* Temporaries: what the op allocates until ct_ctx_temp_end_ goes to the temp block list;
 * regions nest (the mark is the list's position). */
ct_temp_mark ct_ctx_temp_begin_(ct_ctx *c) {
    ct_temp_mark m = {c->tcur, c->tcur ? c->tcur->used : 0, c->tused};
    c->temp_depth++;
    return m;
}
void ct_ctx_temp_end_(ct_ctx *c, ct_temp_mark m) {
    ct_block *mc = m.cur;
    for (ct_block *b = mc ? mc->next : c->thead; b; b = b->next) {
        b->used = 0;
        if (b == c->tcur) break;
    }
    if (mc) mc->used = m.cur_used;
    c->tcur = mc ? mc : c->thead;
    c->tused = m.used;
    c->temp_depth--;
}
int ct_ctx_temp_depth_(const ct_ctx *c) { return c->temp_depth; }
ct_dtype ct_ctx_lowp_run_(const ct_ctx *c) { return c->lowp_run; }
ct_dtype ct_ctx_set_lowp_run_(ct_ctx *c, ct_dtype dt) {
    ct_dtype prev = c->lowp_run;
    c->lowp_run = dt;
    return prev;
}

bool ct_ctx_values_unread_(const ct_ctx *c) { return c->values_unread; }
bool ct_ctx_set_values_unread_(ct_ctx *c, bool on) {
    bool prev = c->values_unread;
    c->values_unread = on;
    return prev;
}

ct_arena_mark ct_ctx_mark_(ct_ctx *c) {
    return (ct_arena_mark){c->cur, c->cur ? c->cur->used : 0, c->used};
}
void ct_ctx_rewind_(ct_ctx *c, ct_arena_mark m) {
    /* blocks after the marked one were empty at the mark (allocation only moves forward) */
    for (ct_block *b = m.cur ? m.cur->next : c->head; b; b = b->next) {
        b->used = 0;
        if (b == c->cur) break;
    }
    if (m.cur) m.cur->used = m.cur_used;
    c->cur = m.cur ? m.cur : c->head;
    c->used = m.used;
}

void ct_ctx_scratch_rewind_(ct_ctx *c) {
    for (ct_block *b = c->shead; b; b = b->next) b->used = 0;
    c->scur = c->shead;
    c->sused = 0;
}

void *ct_ctx_grad_buffer_raw_(ct_ctx *c, size_t bytes) {
    /* best fit among the released buffers: in a network the same shapes recur layer after
     * layer, so this is nearly always an exact fit */
    int best = -1;
    for (int i = 0; i < c->gfree_n; i++)
        if (c->gfree[i].bytes >= bytes && (best < 0 || c->gfree[i].bytes < c->gfree[best].bytes)) best = i;
    void *p;
    if (best >= 0 && c->gfree[best].bytes <= 2 * bytes + 4096) {
        p = c->gfree[best].p;
        c->gfree[best] = c->gfree[--c->gfree_n];
    } else {
        bool prev = c->grad_alloc;
        c->grad_alloc = true;
        p = ct_ctx_alloc(c, bytes);
        c->grad_alloc = prev;
    }
    return p;
}

void *ct_ctx_grad_buffer_(ct_ctx *c, size_t bytes) {
    void *p = ct_ctx_grad_buffer_raw_(c, bytes);
    memset(p, 0, bytes);
    return p;
}

void ct_ctx_grad_release_(ct_ctx *c, void *p, size_t bytes) {
    if (c->gfree_n == c->gfree_cap) {
        int cap = c->gfree_cap ? 2 * c->gfree_cap : 64;
        ct_free_buf *g = realloc(c->gfree, (size_t)cap * sizeof *g);
        if (!g) return; /* not reused: only costs memory */
        c->gfree = g;
        c->gfree_cap = cap;
    }
    c->gfree[c->gfree_n++] = (ct_free_buf){p, bytes};
}

/* ---- shapes ---- */
int64_t ct_numel(const ct_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
size_t ct_nbytes(const ct_tensor *t) { return (size_t)ct_numel(t) * ct_dtype_size(t->dtype); }

bool ct_is_contiguous(const ct_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

bool ct_same_shape(const ct_tensor *a, const ct_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

const char *ct_shape_str(const ct_tensor *t, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < t->ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (o < n) snprintf(buf + o, n - o, "] %s", ct_dtype_name(t->dtype));
    return buf;
}

/* ---- creation ---- */
static ct_tensor *desc(ct_ctx *c, ct_dtype dt, int ndim, const int64_t *shape) {
    CT_CHECK(ndim >= 0 && ndim <= CT_MAX_DIMS, "tensor with %d dims (max %d)", ndim, CT_MAX_DIMS);
    ct_tensor *t = ct_ctx_alloc(c, sizeof *t);
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->device = CT_CPU;
    t->ndim = ndim;
    t->param_id = -1;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        CT_CHECK(shape[i] >= 0, "negative dimension %lld at dim %d", (long long)shape[i], i);
        t->shape[i] = shape[i];
        t->stride[i] = s;
        s *= shape[i];
    }
    return t;
}

ct_tensor *ct_new(ct_ctx *c, ct_dtype dt, int ndim, const int64_t *shape) {
    ct_tensor *t = desc(c, dt, ndim, shape);
    t->data = ct_ctx_alloc(c, ct_nbytes(t));
    return t;
}
ct_tensor *ct_zeros(ct_ctx *c, ct_dtype dt, int ndim, const int64_t *shape) {
    ct_tensor *t = ct_new(c, dt, ndim, shape);
    memset(t->data, 0, ct_nbytes(t));
    return t;
}
ct_tensor *ct_new_like(ct_ctx *c, const ct_tensor *x) { return ct_new(c, x->dtype, x->ndim, x->shape); }
ct_tensor *ct_from_data(ct_ctx *c, ct_dtype dt, const void *src, int ndim, const int64_t *shape) {
    ct_tensor *t = ct_new(c, dt, ndim, shape);
    memcpy(t->data, src, ct_nbytes(t));
    return t;
}
ct_tensor *ct_from_f32(ct_ctx *c, const float *src, int ndim, const int64_t *shape) {
    return ct_from_data(c, CT_F32, src, ndim, shape);
}
ct_tensor *ct_wrap(ct_ctx *c, ct_dtype dt, void *data, int ndim, const int64_t *shape) {
    ct_tensor *t = desc(c, dt, ndim, shape);
    t->data = data;
    return t;
}

void ct_fill(ct_tensor *t, float v) {
    CT_CHECK(ct_is_contiguous(t), "ct_fill needs a contiguous tensor");
    int64_t n = ct_numel(t);
    if (t->dtype == CT_F32) {
        float *d = t->data;
        for (int64_t i = 0; i < n; i++) d[i] = v;
    } else {
        for (int64_t i = 0; i < n; i++) ct_convert((char *)t->data + i * (int64_t)ct_dtype_size(t->dtype), t->dtype, &v, CT_F32, 1);
    }
}

double ct_item(const ct_tensor *t) {
    double v;
    if (t->device.type != CT_DEV_CPU && !t->data) return NAN; /* a failed device op's placeholder */
    CT_CHECK(ct_numel(t) == 1, "ct_item on a tensor with %lld elements", (long long)ct_numel(t));
    if (ct_device_item_(t, &v)) return v;
    ct_convert(&v, CT_F64, t->data, t->dtype, 1);
    return v;
}
