/* ct_fsdp: fully sharded data parallel (ctrain/fsdp.h).
 *
 * P's flat parameter and gradient buffers move into address ranges of their own
 * (ct_device_reserve): a unit that is not needed has the whole granules inside its range
 * unmapped (on the CPU its pages dropped with madvise; on a GPU its memory given back to the
 * driver), while every pointer into the buffers (the parameter tensors, views recorded in
 * forward) stays valid; the granules are mapped again, zeroed, before a gather writes the
 * unit's parameters or its backward its gradients. The granules at a unit's ends, shared
 * with its neighbours, stay mapped. Each rank keeps its shard of every unit in a
 * parameter store of its own (S: one tensor per piece of a parameter), which the optimizer
 * steps; a gather packs this rank's pieces and all-gathers them, a reduce-scatter unpacks the
 * averaged shard into S's gradients.
 * On a device (a backend that reduces device buffers: nccl) S, the optimizer's state and the
 * staging live on the device too, and the copies, conversions and sums below are the
 * device's (tensor.h's ct_device_* calls, queued on its compute stream, which the backend's
 * collectives wait for). There CT_SHARD_OPTIM keeps P's own buffers (ZeRO-1: nothing is
 * released); the other modes take the device's ranges (CUDA's virtual memory API). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "train/fsdp_internal.h"

static void fail(ct_fsdp *f, ct_status st) {
    if (f->status == CT_OK) f->status = st;
}

/* ---- memory on the host or on P's device ---- */
static bool on_dev(const ct_fsdp *f) { return f->dev.type != CT_DEV_CPU; }
static void *buf_alloc(ct_fsdp *f, size_t bytes) {
    void *p = NULL;
    if (!on_dev(f)) return posix_memalign(&p, 64, bytes ? bytes : 64) ? NULL : p;
    return ct_device_alloc(f->dev, bytes ? bytes : 64, &p) == CT_OK ? p : NULL;
}
static void buf_free(ct_fsdp *f, void *p) {
    if (!p) return;
    if (on_dev(f)) ct_device_free(f->dev, p);
    else free(p);
}
static void xcopy(ct_fsdp *f, void *dst, const void *src, size_t bytes) {
    fail(f, ct_device_copy_within(f->dev, dst, src, bytes));
}
static void xzero(ct_fsdp *f, void *p, size_t bytes) { fail(f, ct_device_zero(f->dev, p, bytes)); }
static void xconvert(ct_fsdp *f, void *y, ct_dtype to, const void *x, ct_dtype from, size_t n) {
    if (on_dev(f) && to == from) xcopy(f, y, x, n * ct_dtype_size(to));
    else if (n) fail(f, ct_device_convert(f->dev, y, to, x, from, (int64_t)n));
}
static void xadd(ct_fsdp *f, float *y, const float *x, size_t n) { fail(f, ct_device_add(f->dev, y, x, (int64_t)n)); }

const char *ct_shard_mode_name(ct_shard_mode m) {
    switch (m) {
    case CT_SHARD_OPTIM: return "optim";
    case CT_SHARD_GRAD_OPTIM: return "grad-optim";
    case CT_SHARD_FULL: return "full";
    default: return "none";
    }
}

ct_status ct_shard_mode_parse(const char *s, ct_shard_mode *out) {
    for (int m = CT_SHARD_NONE; m <= CT_SHARD_FULL; m++)
        if (s && !strcmp(s, ct_shard_mode_name((ct_shard_mode)m))) { *out = (ct_shard_mode)m; return CT_OK; }
    return ct_error(CT_ERR_INVALID, "shard mode '%s': full, grad-optim, optim or none", s ? s : "(null)");
}

ct_optim *ct_fsdp_optim(ct_fsdp *f) { return f->opt; }
void ct_fsdp_set_prefetch(ct_fsdp *f, bool on) {
    f->prefetch = on;
    /* the overlapped reduce-scatter's own staging, on first use (without it: synchronous) */
    if (on && !f->rs_in) {
        f->rs_in = buf_alloc(f, f->maxs * (size_t)f->n * sizeof(float));
        if (f->rs_in && !(f->rs_out = buf_alloc(f, f->maxs * sizeof(float)))) { buf_free(f, f->rs_in); f->rs_in = NULL; }
        if (f->rs_in) f->mem.staging_bytes += f->maxs * (size_t)(f->n + 1) * sizeof(float);
        else CT_LOG_WARN_("fsdp", "no memory for an overlapped reduce-scatter's staging: reduce-scatters wait");
    }
}
ct_shard_mode ct_fsdp_mode(const ct_fsdp *f) { return f->mode; }

/* length of a name's unit key: up to the end of its first all-digit component, 0 for none */
static size_t unit_key(const char *name) {
    const char *c = name;
    while (*c) {
        const char *e = strchr(c, '.');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        bool digits = n > 0;
        for (size_t i = 0; i < n; i++) digits = digits && c[i] >= '0' && c[i] <= '9';
        if (digits && e) return (size_t)(e - name); /* a trailing number is a name, not a unit */
        if (!e) break;
        c = e + 1;
    }
    return 0;
}

static bool same_key(const char *a, const char *b) {
    size_t ka = unit_key(a), kb = unit_key(b);
    return ka == kb && !strncmp(a, b, ka);
}

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* the whole granules inside [off, off + len) floats of a range: [*lo, *hi), false for none */
static bool inner(const ct_fsdp *f, const float *base, size_t off, size_t len, uintptr_t *lo, uintptr_t *hi) {
    size_t g = f->granule;
    CT_CHECK(f->ranges && g > 0, "fsdp: a unit's granules asked for while P keeps its own buffers");
    uintptr_t b = (uintptr_t)(base + off), e = (uintptr_t)(base + off + len);
    *lo = (b + g - 1) / g * g;
    *hi = e / g * g;
    return *hi > *lo;
}

/* the whole granules inside [off, off + len) floats of a range unmapped (on the CPU they read
 * as zeros when touched again); the partial ones at the ends are zeroed when `zero`. Returns
 * the bytes unmapped. */
static size_t drop_range(ct_fsdp *f, float *base, size_t off, size_t len, bool zero) {
    uintptr_t lo, hi, b = (uintptr_t)(base + off), e = (uintptr_t)(base + off + len);
    if (!inner(f, base, off, len, &lo, &hi)) {
        if (zero) xzero(f, base + off, len * sizeof(float));
        return 0;
    }
    fail(f, ct_device_unmap(f->dev, (void *)lo, hi - lo));
    if (zero) {
        xzero(f, (void *)b, lo - b);
        xzero(f, (void *)hi, e - hi);
    }
    return hi - lo;
}

static void measure(ct_fsdp *f);

/* u's granules of the data or gradient range given back (and counted), unless they are already */
static void unit_unmap(ct_fsdp *f, unit *u, bool grad, bool zero) {
    bool *off = grad ? &u->grad_off : &u->data_off;
    if (*off) return;
    f->mapped_bytes -= drop_range(f, grad ? f->grad : f->data, u->off, u->len, zero);
    *off = true;
}
/* ... and mapped again, zeroed: before a gather writes u's parameters, or backward its gradients */
static void unit_map(ct_fsdp *f, unit *u, bool grad) {
    bool *off = grad ? &u->grad_off : &u->data_off;
    if (!*off) return;
    uintptr_t lo, hi;
    if (inner(f, grad ? f->grad : f->data, u->off, u->len, &lo, &hi)) {
        /* the CPU's dropped pages read as zeros already: only a device maps */
        ct_status st = on_dev(f) ? ct_device_map(f->dev, (void *)lo, hi - lo) : CT_OK;
        if (st != CT_OK) { fail(f, st); return; }
        f->mapped_bytes += hi - lo;
    }
    *off = false;
    measure(f);
}

/* resident bytes of the two ranges: measured on the CPU (mincore), counted on a device */
static void measure(ct_fsdp *f) {
    if (!f->in_step) return; /* training's peak: an evaluation gathers the whole model */
    if (on_dev(f)) { /* the mapped granules, counted as they come and go */
        if (f->mapped_bytes > f->mem.peak_resident_bytes) f->mem.peak_resident_bytes = f->mapped_bytes;
        return;
    }
    size_t ps = page_size(), pages = f->map_bytes / ps, res = 0;
    float *maps[2] = {f->data, f->grad};
    for (int m = 0; m < 2; m++) {
        if (mincore(maps[m], f->map_bytes, f->mc) != 0) return;
        for (size_t i = 0; i < pages; i++) res += f->mc[i] & 1;
    }
    res *= ps;
    if (res > f->mem.peak_resident_bytes) f->mem.peak_resident_bytes = res;
}


static float *sdata(ct_fsdp *f, int j) { return ct_f32(ct_params_get(f->S, j)); }
static float *sgrad(ct_fsdp *f, int j) { return ct_params_grad(f->S) + ct_params_offset(f->S, j); }

/* This rank's pieces of u into `send` (u->s elements of dt; zeros past the unit's end) */
static void pack(ct_fsdp *f, const unit *u, void *send, ct_dtype dt) {
    size_t esz = ct_dtype_size(dt);
    xzero(f, send, u->s * esz);
    for (int k = 0; k < u->npieces; k++)
        xconvert(f, (uint8_t *)send + u->pieces[k].loc * esz, dt, sdata(f, u->pieces[k].sidx), CT_F32, u->pieces[k].len);
}

static void gathered(ct_fsdp *f, unit *u, const void *stage, ct_dtype dt) {
    unit_map(f, u, false);
    if (f->status != CT_OK) return;
    xconvert(f, f->data + u->off, CT_F32, stage, dt, u->len);
    u->gathered = true;
    f->mem.gathers++;
    f->mem.gathered_bytes += (uint64_t)u->s * (uint64_t)f->n * ct_dtype_size(dt);
    if (!u->root) {
        f->gathered_now += u->len * sizeof(float);
        if (f->in_step && f->gathered_now > f->mem.peak_gathered_bytes) f->mem.peak_gathered_bytes = f->gathered_now;
    }
    measure(f);
}

/* An asynchronous collective of ours (*w, or none) waited for and freed; true when its
 * result may be used (it succeeded and nothing failed before it). */
static bool await_work(ct_fsdp *f, ct_work **w) {
    if (!*w) return false;
    ct_status st = ct_work_wait(*w);
    ct_work_free(*w);
    *w = NULL;
    if (st != CT_OK) fail(f, st);
    return st == CT_OK && f->status == CT_OK;
}

/* the prefetch in flight, waited for and copied into place (it carries f->gdt: changing
 * that finishes the prefetch first) */
static void finish_prefetch(ct_fsdp *f) {
    if (await_work(f, &f->pend)) gathered(f, &f->u[f->pend_unit], f->stage2, f->gdt);
}

/* this rank's pieces of u, all-gathered into u's range of P (after the prefetch in flight:
 * collectives keep their order), carried as dt */
static void gather_as(ct_fsdp *f, unit *u, ct_dtype dt) {
    finish_prefetch(f);
    if (u->gathered || f->status != CT_OK) return;
    pack(f, u, f->send, dt);
    ct_status st = ct_all_gather_sync(f->pg, f->send, f->stage, u->s, dt);
    if (st != CT_OK) { fail(f, st); return; }
    gathered(f, u, f->stage, dt);
}
static void gather(ct_fsdp *f, unit *u) { gather_as(f, u, f->gdt); }

/* u's all-gather started now, to overlap the compute of the unit running before it; every
 * rank prefetches the same units in the same order (from the same forward order) */
static void prefetch(ct_fsdp *f, int k) {
    unit *u = &f->u[k];
    if (!f->prefetch || u->gathered || u->root || f->pend || f->status != CT_OK) return;
    pack(f, u, f->send2, f->gdt);
    f->pend = ct_all_gather(f->pg, f->send2, f->stage2, u->s, f->gdt);
    f->pend_unit = k;
}

/* With bf16 gathers, the units that stay gathered hold what a gather would give them: the
 * f32 values rounded to bf16 (every rank holds the same values, so this needs no collective) */
static void round_kept(ct_fsdp *f) {
    if (f->gdt == CT_F32) return;
    uint16_t *t = (uint16_t *)f->send; /* u->s floats: room for 2 u->s bf16 */
    for (int k = 0; k < f->nu; k++) {
        unit *u = &f->u[k];
        if (!u->gathered) continue;
        for (size_t i = 0; i < u->len; i += u->s) {
            size_t m = u->len - i < u->s ? u->len - i : u->s;
            xconvert(f, t, CT_BF16, f->data + u->off + i, CT_F32, m);
            xconvert(f, f->data + u->off + i, CT_F32, t, CT_BF16, m);
        }
    }
}

ct_status ct_fsdp_set_param_dtype(ct_fsdp *f, ct_dtype dt) {
    if (dt != CT_F32 && dt != CT_BF16)
        return ct_error(CT_ERR_INVALID, "fsdp: parameters are gathered in f32 or bf16, not %s", ct_dtype_name(dt));
    finish_prefetch(f);
    f->gdt = dt;
    round_kept(f);
    return f->status;
}

/* u counted as not gathered (its values are about to be written again) */
static void forget(ct_fsdp *f, unit *u) {
    if (u->gathered && !u->root) f->gathered_now -= u->len * sizeof(float);
    u->gathered = false;
}

static void release(ct_fsdp *f, unit *u) {
    if (!u->gathered || u->root) return;
    unit_unmap(f, u, false, false);
    forget(f, u);
}

/* u's averaged shard (out) added to S's gradients */
static void add_shard(ct_fsdp *f, const unit *u, const float *out) {
    f->mem.reduce_scatters++;
    for (int k = 0; k < u->npieces; k++) xadd(f, sgrad(f, u->pieces[k].sidx), out + u->pieces[k].loc, u->pieces[k].len);
}

/* the reduce-scatter in flight, waited for and its shard added */
static void finish_reduce(ct_fsdp *f) {
    if (await_work(f, &f->rs_pend)) add_shard(f, &f->u[f->rs_unit], f->rs_out);
}

/* u's gradients (all its parameters delivered theirs): averaged across the ranks, this
 * rank's shard added to S's gradients, then u's gradients cleared for the next backward.
 * With prefetch the reduce-scatter runs on the comm thread while backward goes on (one in
 * flight: the previous one is finished first), as FSDP's reduce-scatter on its own stream;
 * the gradients are copied out first, so their pages go back at once either way. */
static void reduce(ct_fsdp *f, unit *u) {
    u->reduced = true;
    finish_reduce(f);
    if (f->status != CT_OK) return;
    const float *g = ct_params_grad_range(f->P, u->first, u->last);
    size_t all = u->s * (size_t)f->n;
    bool async = f->prefetch && f->rs_in;
    float *in = async ? f->rs_in : f->stage, *out = async ? f->rs_out : f->send;
    xcopy(f, in, g, u->len * sizeof(float));
    xzero(f, in + u->len, (all - u->len) * sizeof(float));
    measure(f);
    if (async) {
        f->rs_pend = ct_reduce_scatter(f->pg, in, out, u->s, CT_F32, CT_RED_AVG);
        f->rs_unit = (int)(u - f->u);
    } else {
        ct_status st = ct_reduce_scatter_sync(f->pg, in, out, u->s, CT_F32, CT_RED_AVG);
        if (st != CT_OK) { fail(f, st); return; }
        add_shard(f, u, out);
    }
    /* ZeRO-1 keeps whole gradients (zeroed in place); the others give the pages back */
    if (f->mode == CT_SHARD_OPTIM) xzero(f, f->grad + u->off, u->len * sizeof(float));
    else unit_unmap(f, u, true, true);
    if (f->mode == CT_SHARD_FULL || f->mode == CT_SHARD_GRAD_OPTIM) release(f, u);
}

/* u's backward runs next: its parameters gathered, its gradients' memory mapped (zeroed) */
static void backward_next(ct_fsdp *f, unit *u) {
    gather(f, u);
    unit_map(f, u, true);
}

static void on_grad(void *user, ct_params *p, int i) {
    (void)p;
    ct_fsdp *f = user;
    int k = f->unit_of[i];
    if (k < 0) return;
    unit *u = &f->u[k];
    if (++u->ready < u->nparams) return;
    if (!u->gathered && !u->root) /* its backward read freed parameters: a model that used them outside its unit */
        fail(f, ct_error(CT_ERR_INVALID, "fsdp: '%s' was used outside its unit's ct_unit_enter/leave",
                         ct_params_get(f->P, u->first)->name));
    reduce(f, u);
    /* the unit before it in forward order runs its backward next: gather it now */
    for (int j = f->norder - 1; j > 0; j--)
        if (f->order[j] == k) {
            backward_next(f, &f->u[f->order[j - 1]]);
            if (j > 1) prefetch(f, f->order[j - 2]);
            break;
        }
}

static void on_unit(void *user, ct_ctx *ctx, ct_params *p, int i, bool enter) {
    (void)ctx, (void)p;
    ct_fsdp *f = user;
    int k = f->unit_of[i];
    if (k < 0 || f->u[k].root) return;
    unit *u = &f->u[k];
    if (enter) {
        if (u->depth++ > 0) return;
        gather(f, u);
        if (f->in_step && !f->backward && !u->in_order) {
            u->in_order = true;
            f->order[f->norder++] = k;
            /* the unit after it in the last training forward */
            for (int j = 0; j + 1 < f->nprev && f->mode != CT_SHARD_OPTIM; j++)
                if (f->prev_order[j] == k) { prefetch(f, f->prev_order[j + 1]); break; }
        }
        return;
    }
    if (--u->depth > 0 || f->backward) return;
    /* after its forward: FULL_SHARD frees it; SHARD_GRAD_OP keeps it for the backward of a
     * training step; outside a step (evaluation) nothing comes back for it */
    if (f->mode == CT_SHARD_FULL || (f->mode == CT_SHARD_GRAD_OPTIM && !f->in_step)) release(f, u);
}

/* ---- creation ---- */

static ct_status build_units(ct_fsdp *f) {
    ct_params *P = f->P;
    int np = ct_params_count(P);
    f->unit_of = malloc(sizeof(int) * (size_t)(np ? np : 1));
    f->u = calloc((size_t)(np ? np : 1), sizeof(unit));
    f->order = malloc(sizeof(int) * (size_t)(np ? np : 1));
    f->prev_order = malloc(sizeof(int) * (size_t)(np ? np : 1));
    if (!f->unit_of || !f->u || !f->order || !f->prev_order) return ct_error(CT_ERR_NOMEM, "fsdp: out of memory");
    int prev = -1;
    for (int i = 0; i < np; i++) {
        f->unit_of[i] = -1;
        if (ct_params_is_buffer(P, i) || ct_numel(ct_params_get(P, i)) == 0) continue;
        const char *name = ct_params_get(P, i)->name;
        if (prev >= 0 && same_key(ct_params_get(P, prev)->name, name)) {
            f->unit_of[i] = f->nu - 1;
        } else {
            /* a numbered unit seen before, now again after another: not consecutive */
            for (int k = 0; k < f->nu; k++)
                if (!f->u[k].root && same_key(ct_params_get(P, f->u[k].first)->name, name))
                    return ct_error(CT_ERR_UNSUPPORTED, "fsdp: the parameters of unit '%.*s' are not consecutive in the store "
                                    "('%s' comes after another unit's)", (int)unit_key(name), name, name);
            f->u[f->nu] = (unit){.first = i, .root = unit_key(name) == 0};
            f->unit_of[i] = f->nu++;
        }
        unit *u = &f->u[f->nu - 1];
        u->last = i;
        u->nparams++;
        prev = i;
    }
    size_t maxs = 16;
    for (int k = 0; k < f->nu; k++) {
        unit *u = &f->u[k];
        u->off = ct_params_offset(P, u->first);
        u->len = ct_params_offset(P, u->last) + (size_t)ct_numel(ct_params_get(P, u->last)) - u->off;
        u->s = ((u->len + (size_t)f->n - 1) / (size_t)f->n + 15) & ~(size_t)15; /* whole 64-byte lines */
        if (u->s > maxs) maxs = u->s;
        size_t b = u->len * sizeof(float);
        if (b > f->mem.largest_unit_bytes && !u->root) f->mem.largest_unit_bytes = b;
        if (u->root) f->mem.root_bytes += b;
    }
    f->mem.units = f->nu;
    f->maxs = maxs;
    f->mem.staging_bytes = 2 * maxs * (size_t)(f->n + 1) * sizeof(float);
    if (!(f->stage = buf_alloc(f, maxs * (size_t)f->n * sizeof(float))) || !(f->send = buf_alloc(f, maxs * sizeof(float))) ||
        !(f->stage2 = buf_alloc(f, maxs * (size_t)f->n * sizeof(float))) || !(f->send2 = buf_alloc(f, maxs * sizeof(float))))
        return ct_error(CT_ERR_NOMEM, "fsdp: out of memory for the staging buffers (%zu floats)", maxs * (size_t)(f->n + 1));
    return CT_OK;
}

/* S: one 1-D parameter per piece of a parameter of P that lies in this rank's shard */
static ct_status build_shards(ct_fsdp *f, const ct_optim *like, bool deferred, uint64_t seed) {
    ct_status st = ct_params_create(&f->S);
    if (st != CT_OK) return st;
    int count = 0;
    for (int k = 0; k < f->nu; k++) {
        unit *u = &f->u[k];
        if (!(u->pieces = calloc((size_t)u->nparams, sizeof(piece)))) return ct_error(CT_ERR_NOMEM, "fsdp: out of memory");
        size_t a, b;
        ct_fsdp_rank_range_(u, f->me, &a, &b);
        for (int i = u->first; i <= u->last; i++) {
            const ct_tensor *t = ct_params_get(f->P, i);
            size_t lo = ct_params_offset(f->P, i), hi = lo + (size_t)ct_numel(t);
            if (lo < a) lo = a;
            if (hi > b) hi = b;
            if (lo >= hi) continue;
            int64_t len = (int64_t)(hi - lo);
            if (!ct_param(f->S, t->name, 1, &len, CT_INIT_ZEROS, 0)) return ct_params_status(f->S);
            u->pieces[u->npieces++] = (piece){.sidx = count++, .pidx = i, .goff = lo, .len = hi - lo, .loc = lo - (u->off + (size_t)f->me * u->s)};
        }
    }
    if (count == 0 && !ct_param(f->S, "fsdp.empty", 1, (int64_t[]){1}, CT_INIT_ZEROS, 0)) return ct_params_status(f->S);
    if ((st = ct_params_finalize(f->S, 0)) != CT_OK) return st;
    if (on_dev(f) && (st = ct_params_to(f->S, f->dev)) != CT_OK) return st;
    for (int k = 0; k < f->nu; k++)
        for (int j = 0; j < f->u[k].npieces; j++) {
            piece *pc = &f->u[k].pieces[j];
            if (deferred) ct_params_init_range(f->P, seed, pc->goff, pc->goff + pc->len, sdata(f, pc->sidx));
            else xcopy(f, sdata(f, pc->sidx), ct_params_data(f->P) + pc->goff, pc->len * sizeof(float));
        }
    xzero(f, ct_params_grad(f->S), ct_params_numel(f->S) * sizeof(float));
    if (f->status != CT_OK) return f->status;
    if ((st = ct_optim_create_like(like, f->S, &f->opt)) != CT_OK) return st;
    for (int k = 0; k < f->nu; k++) /* each piece decays as its parameter */
        for (int j = 0; j < f->u[k].npieces; j++) {
            int pi = f->u[k].first;
            while (pi < f->u[k].last && ct_params_offset(f->P, pi + 1) <= f->u[k].pieces[j].goff) pi++;
            ct_optim_set_weight_decay(f->opt, f->u[k].pieces[j].sidx, ct_optim_weight_decay(like, pi));
        }
    if (count == 0) ct_optim_set_weight_decay(f->opt, 0, 0);
    size_t sb = ct_params_numel(f->S) * sizeof(float);
    f->mem.shard_param_bytes = f->mem.shard_grad_bytes = sb;
    f->mem.optim_state_bytes = sb * (size_t)ct_optim_state_count(f->opt);
    return CT_OK;
}

static void free_impl(ct_fsdp *f, bool discard);

ct_status ct_fsdp_create(ct_pg *pg, ct_params *P, const ct_optim *like, ct_shard_mode mode, ct_fsdp **out) {
    *out = NULL;
    CT_CHECK(pg && P && like && ct_optim_params(like) == P, "ct_fsdp_create: a group, a store and an optimizer over it");
    if (mode == CT_SHARD_NONE) return ct_error(CT_ERR_INVALID, "fsdp: shard mode none is DDP (ct_ddp_create)");
    const ct_device dev = ct_params_device(P);
    if (dev.type != CT_DEV_CPU) {
        if (!(ct_pg_caps(pg) & CT_PG_CAP_DEVICE_BUFFERS))
            return ct_error(CT_ERR_INVALID, "fsdp: the parameters are on a device, which the %s backend does not reduce "
                            "(CTRAIN_BACKEND=nccl)", ct_pg_backend(pg));
        if (ct_params_is_deferred(P))
            return ct_error(CT_ERR_UNSUPPORTED, "fsdp: sharded initialisation of device parameters (make them first)");
    }
    ct_fsdp *f = calloc(1, sizeof *f);
    if (!f) return ct_error(CT_ERR_NOMEM, "fsdp: out of memory");
    f->pg = pg;
    f->P = P;
    f->dev = dev;
    f->mode = mode;
    f->gdt = CT_F32;
    f->n = ct_pg_size(pg);
    f->me = ct_pg_rank(pg);
    f->numel = ct_params_numel(P);
    f->map_bytes = ((f->numel ? f->numel : 1) * sizeof(float) + page_size() - 1) & ~(page_size() - 1);
    f->mem.full_param_bytes = f->numel * sizeof(float);
    ct_status st = build_units(f);
    /* rank 0's values everywhere, as DDP starts; deferred (sharded initialisation): rank 0's
     * seed, from which each rank makes its own pieces and what it keeps, nothing else */
    bool deferred = ct_params_is_deferred(P);
    uint64_t seed = ct_params_seed(P);
    if (st == CT_OK && deferred) st = ct_broadcast_sync(pg, &seed, 2, CT_I32, 0);
    else if (st == CT_OK) st = ct_broadcast_sync(pg, ct_params_data(P), f->numel, CT_F32, 0);
    if (st == CT_OK && ct_params_buffer_numel(P) > 0)
        st = ct_broadcast_sync(pg, ct_params_buffer_data(P), ct_params_buffer_numel(P), CT_F32, 0);
    const bool own = on_dev(f) && mode == CT_SHARD_OPTIM; /* P keeps its buffers */
    f->mc = st == CT_OK && !on_dev(f) ? malloc(f->map_bytes / page_size() + 1) : NULL; /* mincore's vector */
    if (st == CT_OK && !on_dev(f) && !f->mc) st = ct_error(CT_ERR_NOMEM, "fsdp: out of memory");
    if (st == CT_OK && own) { /* every unit stays gathered (ZeRO-1) */
        f->data = ct_params_data(P);
        f->grad = ct_params_grad(P);
        st = build_shards(f, like, false, 0);
        for (int k = 0; k < f->nu && st == CT_OK; k++) {
            f->u[k].gathered = true;
            if (!f->u[k].root) f->gathered_now += f->u[k].len * sizeof(float);
        }
    }
    /* one buffer at a time, what the mode does not keep dropped at once: the gradients (all
     * of them go), the shards, then the parameters; the process grows by one copy of the
     * parameters while a buffer moves, not more (deferred: nothing moves, nothing is made
     * but the shards and the kept units) */
    float **maps[2] = {&f->grad, &f->data};
    for (int m = 0; m < 2 && st == CT_OK && !own; m++) {
        if (m == 1 && (st = build_shards(f, like, deferred, seed)) != CT_OK) break;
        void *b = NULL;
        if ((st = ct_device_reserve(dev, f->map_bytes, &b, &f->granule)) != CT_OK) {
            st = ct_error(st, "fsdp: cannot reserve %zu bytes for the %s: %s", f->map_bytes, m ? "parameters" : "gradients",
                          ct_last_error());
            break;
        }
        *maps[m] = b;
        f->ranges = true;
        f->mapped_bytes += (f->map_bytes + f->granule - 1) / f->granule * f->granule;
        st = m ? ct_params_set_data_storage(P, b, !deferred) : ct_params_set_grad_storage(P, b);
        if (st != CT_OK) break;
        if (m == 0) { /* every unit's gradients go (deferred: never touched, so nothing to give back) */
            for (int k = 0; k < f->nu; k++) {
                if (!deferred) unit_unmap(f, &f->u[k], true, true);
                f->u[k].grad_off = true;
            }
            continue;
        }
        for (int k = 0; k < f->nu; k++) {
            unit *u = &f->u[k];
            bool keep = u->root || mode == CT_SHARD_OPTIM;
            if (deferred && !keep) { /* never made here: its pages were never touched */
                u->data_off = true;
                continue;
            }
            if (deferred) ct_params_init_range(P, seed, u->off, u->off + u->len, f->data + u->off);
            u->gathered = true;
            if (!u->root) f->gathered_now += u->len * sizeof(float);
            if (!keep) release(f, u);
        }
    }
    if (st != CT_OK) {
        f->status = st; /* no collective on the way out: the other ranks may have failed elsewhere */
        free_impl(f, deferred); /* a deferred store goes back to deferred, not to half-made values */
        return st;
    }
    ct_params_set_grad_hook(P, on_grad, f);
    ct_params_set_unit_hook(P, on_unit, f);
    int roots = 0;
    for (int k = 0; k < f->nu; k++) roots += f->u[k].root;
    CT_LOG_INFO("fsdp", "%s sharding: %d units (%d root), %zu of %zu parameters here, %s", ct_shard_mode_name(mode), f->nu,
                roots, ct_params_numel(f->S), f->numel, ct_optim_kind(f->opt));
    *out = f;
    return CT_OK;
}

static void free_impl(ct_fsdp *f, bool discard) {
    if (!f) return;
    if (!discard && f->data && f->S && f->status == CT_OK && ct_fsdp_gather_all(f) != CT_OK)
        CT_LOG_WARN_("fsdp", "the parameters could not be gathered back: %s", ct_last_error());
    if (f->pend) ct_work_free(f->pend); /* after a failure: waits for it before its buffers go */
    if (f->rs_pend) ct_work_free(f->rs_pend);
    if (f->P && on_dev(f) && !f->ranges) { /* P's own buffers, never moved */
        ct_params_set_grad_hook(f->P, NULL, NULL);
        ct_params_set_unit_hook(f->P, NULL, NULL);
        f->data = f->grad = NULL;
    }
    /* on a device every granule is mapped before P's buffers are copied out of the ranges (the
     * CPU reads zeros from a dropped page; a GPU faults): a unit not gathered back keeps zeros.
     * A discarded store copies nothing out. */
    for (int k = 0; k < f->nu && on_dev(f) && f->ranges && !discard; k++) {
        if (f->data) unit_map(f, &f->u[k], false);
        if (f->grad) unit_map(f, &f->u[k], true);
    }
    if (f->P && (f->data || f->grad)) {
        ct_params_set_grad_hook(f->P, NULL, NULL);
        ct_params_set_unit_hook(f->P, NULL, NULL);
        /* by the data alone: ct_params_grad would first zero every stale gradient, all pages */
        if (discard && ct_params_data(f->P) == f->data) ct_params_defer(f->P);
        if (ct_params_data(f->P) == f->data && ct_params_set_data_storage(f->P, NULL, true) != CT_OK)
            CT_LOG_WARN_("fsdp", "%s", ct_last_error());
        if (ct_params_grad(f->P) == f->grad && ct_params_set_grad_storage(f->P, NULL) != CT_OK)
            CT_LOG_WARN_("fsdp", "%s", ct_last_error());
    }
    /* a mapping P still points at (no memory to move out) stays mapped */
    if (f->data && (!f->P || ct_params_data(f->P) != f->data)) ct_device_unreserve(f->dev, f->data, f->map_bytes);
    if (f->grad && (!f->P || ct_params_grad(f->P) != f->grad)) ct_device_unreserve(f->dev, f->grad, f->map_bytes);
    ct_optim_free(f->opt);
    ct_params_free(f->S);
    for (int k = 0; k < f->nu; k++) free(f->u[k].pieces);
    free(f->u);
    free(f->unit_of);
    free(f->order);
    buf_free(f, f->stage);
    buf_free(f, f->send);
    buf_free(f, f->stage2);
    buf_free(f, f->send2);
    buf_free(f, f->rs_in);
    buf_free(f, f->rs_out);
    free(f->prev_order);
    free(f->mc);
    free(f);
}

void ct_fsdp_free(ct_fsdp *f) { free_impl(f, false); }
void ct_fsdp_discard(ct_fsdp *f) { free_impl(f, true); }

/* ---- the step ---- */

ct_status ct_fsdp_begin_step(ct_fsdp *f) {
    xzero(f, ct_params_grad(f->S), ct_params_numel(f->S) * sizeof(float));
    f->in_step = true;
    f->backward = false;
    return f->status;
}

ct_status ct_fsdp_pre_backward(ct_fsdp *f) {
    f->backward = true;
    for (int k = 0; k < f->nu; k++) /* the root takes gradients all through backward */
        if (f->u[k].root) unit_map(f, &f->u[k], true);
    if (f->norder > 0) backward_next(f, &f->u[f->order[f->norder - 1]]); /* the first unit backward reaches */
    if (f->norder > 1) prefetch(f, f->order[f->norder - 2]);
    return f->status;
}

ct_status ct_fsdp_post_backward(ct_fsdp *f) {
    f->backward = false;
    finish_prefetch(f);
    finish_reduce(f);
    ct_status st = f->status;
    for (int k = 0; k < f->nu; k++) {
        unit *u = &f->u[k];
        if (st == CT_OK && !u->reduced) {
            int i = u->first; /* the first parameter that got no gradient: its unit never reduced */
            st = ct_error(CT_ERR_INVALID, "fsdp: parameter '%s' (unit of %d) got no gradient in this backward; every "
                          "parameter must take part in the loss", ct_params_get(f->P, i)->name, u->nparams);
        }
        u->reduced = u->in_order = false;
        u->ready = 0;
        u->depth = 0;
    }
    memcpy(f->prev_order, f->order, sizeof(int) * (size_t)f->norder);
    f->nprev = f->norder;
    f->norder = 0;
    return st;
}

double ct_fsdp_clip_grad_norm(ct_fsdp *f, double max_norm) {
    float *G = ct_params_grad(f->S);
    const int64_t n = (int64_t)ct_params_numel(f->S);
    double ss = 0;
    /* the whole store: the padding between pieces holds zeros */
    if (ct_device_sumsq(f->dev, G, n, &ss) != CT_OK) {
        fail(f, CT_ERR_SYSTEM);
        return NAN;
    }
    if (ct_all_reduce_sync(f->pg, &ss, 1, CT_F64, CT_RED_SUM) != CT_OK) {
        fail(f, CT_ERR_PEER);
        return NAN;
    }
    float total = (float)sqrt(ss);
    float coef = (1.0f / (total + 1e-6f)) * (float)max_norm; /* PyTorch's clip_coef, as ct_clip_grad_norm */
    if (coef > 1.0f) coef = 1.0f;
    if (coef != 1.0f) fail(f, ct_device_scale(f->dev, G, coef, n));
    return total;
}

ct_status ct_fsdp_step(ct_fsdp *f, double lr) {
    f->in_step = false;
    if (f->status != CT_OK) return f->status;
    ct_optim_step(f->opt, lr);
    ct_status st = ct_optim_status(f->opt);
    if (st != CT_OK) return st;
    /* what stays gathered takes the new values now; the rest is gathered when next used */
    return ct_fsdp_regather_(f);
}

ct_status ct_fsdp_unscale(ct_fsdp *f, ct_grad_scaler *s, bool *found_inf) {
    *found_inf = true;
    if (f->status != CT_OK) return f->status;
    float bad = ct_grad_scaler_unscale_and_check(s, f->S) ? 0.0f : 1.0f;
    ct_status st = ct_all_reduce_sync(f->pg, &bad, 1, CT_F32, CT_RED_MAX);
    if (st != CT_OK) return st;
    *found_inf = bad > 0;
    return CT_OK;
}

/* a skipped step (an overflow under loss scaling): the gathered units keep their values */
ct_status ct_fsdp_skip_step(ct_fsdp *f) {
    f->in_step = false;
    return f->status;
}

ct_status ct_fsdp_regather_(ct_fsdp *f) {
    for (int k = 0; k < f->nu; k++) {
        unit *u = &f->u[k];
        if (!u->root && f->mode != CT_SHARD_OPTIM) continue;
        forget(f, u);
        gather(f, u);
    }
    return f->status;
}

/* always in f32: what is saved or exported is the master weights, whatever the gathers carry */
ct_status ct_fsdp_gather_all(ct_fsdp *f) {
    finish_prefetch(f);
    for (int k = 0; k < f->nu; k++) {
        unit *u = &f->u[k];
        if (f->gdt != CT_F32) forget(f, u); /* it holds bf16-rounded values */
        gather_as(f, u, CT_F32);
    }
    return f->status;
}

/* ---- a whole-model file, a unit at a time ---- */

/* On a device the writer reads host memory: rank 0 copies each unit as it is gathered into
 * host staging the size of the largest unit (and P's buffers once), and points the writer there,
 * so no rank ever holds the whole model on the host or the device. */
typedef struct {
    ct_fsdp *f;
    int cur;       /* the unit the stream gathered last, -1: none */
    float *host;   /* on a device, rank 0: the values of unit host_unit (largest unit's size) */
    int host_unit; /* -1: none */
    const float *bufs; /* on a device, rank 0: P's buffers on the host (bufs_own), copied at the first one written */
    float *bufs_own;
} stream;

/* the unit whose parameters hold p, -1 for memory outside them (buffers, the config) */
static int unit_at(const ct_fsdp *f, const void *p) {
    const float *x = p;
    if (!x || x < f->data || x >= f->data + f->numel) return -1;
    size_t off = (size_t)(x - f->data);
    for (int k = 0; k < f->nu; k++)
        if (off >= f->u[k].off && off < f->u[k].off + f->u[k].len) return k;
    return -1;
}

/* on every rank alike: the unit streamed before freed, then unit k (-1: none) gathered in f32 */
static ct_status stream_to(ct_fsdp *f, stream *s, int k) {
    if (s->cur >= 0) release(f, &f->u[s->cur]);
    s->cur = k;
    if (k >= 0) gather_as(f, &f->u[k], CT_F32);
    return f->status;
}

/* on a device: bytes outside the units that lie in P's buffers, read from a host copy of them */
static ct_status stream_buffers(stream *s, const void *data, const void **src) {
    ct_fsdp *f = s->f;
    const float *b = ct_params_buffer_data(f->P), *x = data;
    size_t nb = ct_params_buffer_numel(f->P);
    if (!nb || !x || x < b || x >= b + nb) return CT_OK; /* host memory already (the config) */
    if (!s->bufs) {
        ct_status st = ct_fsdp_host_buffers_(f, &s->bufs, &s->bufs_own);
        if (st != CT_OK) {
            s->bufs = NULL;
            return st;
        }
    }
    *src = s->bufs + (x - b);
    return CT_OK;
}

/* rank 0's writer, before a tensor's bytes: its unit requested from every rank and gathered
 * (on a device, then copied to the host for the writer) */
static ct_status stream_fetch(void *user, const void *data, size_t nbytes, const void **src) {
    (void)nbytes;
    stream *s = user;
    ct_fsdp *f = s->f;
    int k = unit_at(f, data);
    if (k < 0) return f->status != CT_OK ? f->status : on_dev(f) ? stream_buffers(s, data, src) : CT_OK;
    unit *u = &f->u[k];
    if (!u->gathered) {
        int32_t req = k;
        ct_status st = ct_broadcast_sync(f->pg, &req, 1, CT_I32, 0);
        if (st != CT_OK) {
            fail(f, st);
            return st;
        }
        if (stream_to(f, s, k) != CT_OK) return f->status;
    }
    if (!on_dev(f) || f->status != CT_OK) return f->status;
    if (s->host_unit != k) {
        s->host_unit = -1;
        ct_status st = ct_device_copy(f->dev, s->host, f->data + u->off, u->len * sizeof(float), false);
        if (st != CT_OK) return st;
        s->host_unit = k;
    }
    *src = s->host + ((const float *)data - (f->data + u->off));
    return CT_OK;
}

ct_status ct_fsdp_stream(ct_fsdp *f, ct_status (*write)(void *arg, ct_st_fetch_fn fetch, void *user), void *arg) {
    finish_prefetch(f);
    if (f->status != CT_OK) return f->status;
    /* with bf16 gathers the units kept gathered hold rounded values: the file takes the masters */
    if (f->gdt != CT_F32)
        for (int k = 0; k < f->nu; k++)
            if (f->u[k].gathered) {
                forget(f, &f->u[k]);
                gather_as(f, &f->u[k], CT_F32);
            }
    stream s = {.f = f, .cur = -1, .host_unit = -1};
    ct_status st = f->status;
    if (st == CT_OK && f->me == 0) {
        size_t most = 0;
        for (int k = 0; k < f->nu; k++) most = f->u[k].len > most ? f->u[k].len : most;
        if (on_dev(f) && !(s.host = malloc((most ? most : 1) * sizeof(float))))
            st = ct_error(CT_ERR_NOMEM, "fsdp: out of host memory to stage a unit of %zu values for the file", most);
        if (st == CT_OK) st = write(arg, stream_fetch, &s);
        int32_t done = -1; /* the others stop following, whatever became of the write */
        if (f->status == CT_OK) {
            ct_status bs = ct_broadcast_sync(f->pg, &done, 1, CT_I32, 0);
            if (bs != CT_OK) fail(f, bs);
        }
    } else if (st == CT_OK) {
        for (;;) {
            int32_t req;
            ct_status bs = ct_broadcast_sync(f->pg, &req, 1, CT_I32, 0);
            if (bs != CT_OK) { fail(f, bs); break; }
            if (req < 0) break;
            if (req >= f->nu) { /* a corrupted request: every rank is lost at this point */
                fail(f, ct_error(CT_ERR_PEER, "fsdp: rank 0 asked to stream unit %d of %d", (int)req, f->nu));
                break;
            }
            if (stream_to(f, &s, req) != CT_OK) break;
        }
    }
    free(s.host);
    free(s.bufs_own);
    stream_to(f, &s, -1);
    round_kept(f);
    if (f->status != CT_OK) return f->status;
    return st;
}

ct_status ct_fsdp_reshard(ct_fsdp *f) {
    if (f->mode != CT_SHARD_OPTIM)
        for (int k = 0; k < f->nu; k++) release(f, &f->u[k]);
    round_kept(f);
    return f->status;
}

void ct_fsdp_drop_released_(ct_fsdp *f) {
    for (int k = 0; k < f->nu; k++)
        if (!f->u[k].gathered) drop_range(f, f->data, f->u[k].off, f->u[k].len, false);
}

void ct_fsdp_zero_grad_(ct_fsdp *f) {
    if (!on_dev(f) || !f->ranges) {
        ct_params_zero_grad(f->P);
        return;
    }
    for (int k = 0; k < f->nu; k++)
        if (!f->u[k].grad_off) xzero(f, f->grad + f->u[k].off, f->u[k].len * sizeof(float));
}

ct_fsdp_mem ct_fsdp_memory(const ct_fsdp *f) {
    ct_fsdp_mem m = f->mem;
    m.peak_total_bytes = m.peak_resident_bytes + m.shard_param_bytes + m.shard_grad_bytes + m.optim_state_bytes + m.staging_bytes;
    return m;
}
