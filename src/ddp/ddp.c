/* DDP reducer. Buckets are contiguous slices of the flat gradient buffer holding
 * parameters in reverse registration order — the order backward finishes them — so a
 * bucket is complete early and its all-reduce overlaps the rest of backward. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ctrain/config.h"
#include "ctrain/ddp.h"

typedef struct {
    int first, last;      /* parameter indices, first > last (reverse order) */
    size_t off, numel;    /* slice of the flat gradient buffer, in floats */
    int pending;          /* gradients still to arrive this step */
    int nparams;
    bool launched;
    ct_work *work;
    double t_launch, t_done;
    void *scratch;        /* compressed copy when comm_dtype != f32, where the gradients are */
    ct_status cst;        /* of its compression at launch (the all-reduce goes out anyway) */
} bucket;

struct ct_ddp {
    ct_pg *pg;
    ct_params *P;
    ct_ddp_opts o;
    bucket *b;
    int nb;
    int *bucket_of;       /* parameter index → bucket, -1 for buffers */
    bool *ready;          /* parameter marked ready this step */
    int next_launch;
    bool no_sync;
    bool step_active;
    double t_last_finish; /* end of the previous ct_ddp_finish (0 before the first) */
    double wait_since;    /* ct_ddp_add_wait's seconds since then: waiting, not computing */
    void *shared;         /* zero-copy: this rank's region of the shared gradient segment */
    ct_ddp_stats st;
    bool deferred;        /* ct_ddp_set_deferred: no bucket is reduced; the reader averages */
    ct_ddp_progress_fn progress; /* deferred: told how far backward's final gradients reach */
    int next_final;       /* deferred, with progress: the highest parameter not yet final */
    void *progress_user;
    ct_device dev;        /* where the gradients are */
};

/* CTRAIN_DDP_BUCKET_MB / CTRAIN_DDP_FIRST_BUCKET_MB override the bucket sizes (PyTorch's
 * bucket_cap_mb); ctrain rejects a bad value at start-up (ctrain/config.h). The switches
 * are three-way: set on, set off, or unset (the options decide). */
static bool env_off(ct_config_var v) { return ct_config_is_set(v) && !ct_config_bool(v); }

static size_t env_mb(ct_config_var v, size_t dflt) {
    return ct_config_is_set(v) ? (size_t)(ct_config_float(v) * 1048576.0) : dflt;
}

ct_ddp_opts ct_ddp_default_opts(void) {
    return (ct_ddp_opts){.bucket_cap_bytes = env_mb(CT_CFG_DDP_BUCKET_MB, 25u << 20),
                         .first_bucket_bytes = env_mb(CT_CFG_DDP_FIRST_BUCKET_MB, 1u << 20),
                         .find_unused_parameters = false, .comm_dtype = CT_F32, .broadcast_buffers = true, .zero_copy = true};
}

/* FNV-1a over name, dtype and shape: ranks compare these to find the first differing parameter. */
static int64_t param_sig(const ct_tensor *t) {
    uint64_t h = 1469598103934665603ull;
    for (const char *c = t->name; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
    h = (h ^ (uint64_t)t->dtype) * 1099511628211ull;
    h = (h ^ (uint64_t)t->ndim) * 1099511628211ull;
    for (int i = 0; i < t->ndim; i++) h = (h ^ (uint64_t)t->shape[i]) * 1099511628211ull;
    return (int64_t)(h & 0x7fffffffffffffffull);
}

static ct_status check_same_params(ct_pg *pg, ct_params *P) {
    int n = ct_params_count(P);
    int64_t cnt[2] = {n, -(int64_t)n};
    ct_status st = ct_all_reduce_sync(pg, cnt, 2, CT_I64, CT_RED_MAX);
    if (st != CT_OK) return st;
    if (cnt[0] != n || -cnt[1] != n)
        return ct_error(CT_ERR_MISMATCH, "DDP: ranks have different parameter counts (this rank %d, others between %lld and %lld)",
                        n, (long long)-cnt[1], (long long)cnt[0]);
    int64_t *mine = malloc(sizeof(int64_t) * (size_t)(n + 1)), *root = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!mine || !root) { free(mine); free(root); return ct_error(CT_ERR_NOMEM, "DDP: out of memory"); }
    for (int i = 0; i < n; i++) mine[i] = root[i] = param_sig(ct_params_get(P, i));
    st = ct_broadcast_sync(pg, root, (size_t)n, CT_I64, 0);
    int64_t first = n;
    for (int i = 0; st == CT_OK && i < n; i++)
        if (mine[i] != root[i]) { first = i; break; }
    int64_t worst = first;
    if (st == CT_OK) st = ct_all_reduce_sync(pg, &worst, 1, CT_I64, CT_RED_MIN);
    free(mine);
    free(root);
    if (st != CT_OK) return st;
    if (worst < n) {
        ct_tensor *t = ct_params_get(P, (int)worst);
        char sh[96];
        return ct_error(CT_ERR_MISMATCH, "DDP: parameter %lld ('%s' %s on rank %d) differs between ranks%s", (long long)worst,
                        t->name, ct_shape_str(t, sh, sizeof sh), ct_pg_rank(pg), first == worst ? " (differs from rank 0 here)" : "");
    }
    return CT_OK;
}

static void launch(ct_ddp *d, bucket *b) {
    /* during backward: ct_params_grad would also zero the stale gradients of later buckets */
    float *g = ct_params_grad_range(d->P, b->last, b->first);
    b->t_launch = ct_time_now();
    b->launched = true;
    /* zero-copy too runs on the comm thread: inline in the hook, each bucket would stall
     * backward until the peer reached it (measured slower, docs/bench/engine.md) */
    if (d->o.comm_dtype == CT_F32) {
        b->work = ct_all_reduce(d->pg, g, b->numel, CT_F32, CT_RED_AVG);
    } else {
        /* on a GPU the conversion is queued on the compute stream, which NCCL's stream waits for;
         * a failed one still sends, so that every rank issues the same collectives */
        b->cst = ct_device_convert(d->dev, b->scratch, d->o.comm_dtype, g, CT_F32, (int64_t)b->numel);
        b->work = ct_all_reduce(d->pg, b->scratch, b->numel, d->o.comm_dtype, CT_RED_SUM);
    }
}

/* Launch every ready bucket in index order; a ready bucket behind an unready one waits,
 * so all ranks issue collectives in the same order. */
static void launch_ready(ct_ddp *d) {
    while (d->next_launch < d->nb && d->b[d->next_launch].pending == 0) launch(d, &d->b[d->next_launch++]);
}

/* Deferred: parameters, not buckets (one bucket may hold most of a model, and nothing is
 * reduced here), final from the last down: each settled (zeros where backward wrote none,
 * as ct_ddp_finish would make them) before the reader is told where the final gradients
 * begin now */
static void progress_ready(ct_ddp *d) {
    size_t lo = SIZE_MAX;
    for (; d->next_final >= 0 && (d->ready[d->next_final] || d->bucket_of[d->next_final] < 0); d->next_final--) {
        if (d->bucket_of[d->next_final] < 0) continue; /* a buffer: no gradient */
        (void)ct_params_grad_range(d->P, d->next_final, d->next_final);
        lo = ct_params_offset(d->P, d->next_final);
    }
    if (lo != SIZE_MAX) d->progress(d->progress_user, lo);
}

static void on_grad_ready(void *user, ct_params *P, int i) {
    (void)P;
    ct_ddp *d = user;
    if (d->no_sync || d->bucket_of[i] < 0 || d->ready[i]) return;
    d->ready[i] = true;
    d->step_active = true;
    if (d->deferred) { /* averaged by whoever reads them (the sharded step, ct_zero) */
        if (d->progress) progress_ready(d);
        return;
    }
    if (--d->b[d->bucket_of[i]].pending == 0) launch_ready(d);
    /* cheap progress poll to timestamp completions while backward runs */
    for (int k = 0; k < d->next_launch; k++)
        if (d->b[k].work && d->b[k].t_done == 0 && ct_work_test(d->b[k].work)) d->b[k].t_done = ct_time_now();
}

/* Zero-copy: moves the gradient buffer into a segment shared by the ranks, so that the shm
 * backend reduces each bucket in place across the ranks' buffers. Every rank takes the same
 * decision (all-reduce of the wish); a segment that cannot be created (/dev/shm full) falls
 * back to the staged path everywhere. */
static ct_status setup_zero_copy(ct_ddp *d) {
    /* compressed traffic on one machine gains nothing from it. Across machines (hier) it is
     * for the sharded step (ct_zero), which compresses only what crosses the network, and
     * only when asked for: by default the buckets' all-reduce overlaps backward there */
    unsigned caps = ct_pg_caps(d->pg);
    bool multi = caps & CT_PG_CAP_MULTI_MACHINE;
    if (!d->o.zero_copy || (multi && !ct_config_bool(CT_CFG_DDP_SHARD_HIER)) || (d->o.comm_dtype != CT_F32 && !multi) ||
        ct_pg_size(d->pg) < 2 || !(caps & CT_PG_CAP_SHARED_MEMORY))
        return CT_OK;
    int32_t want = !env_off(CT_CFG_DDP_ZERO_COPY);
    ct_status st = ct_all_reduce_sync(d->pg, &want, 1, CT_I32, CT_RED_MIN);
    if (st != CT_OK || !want) return st;
    size_t bytes = ct_params_numel(d->P) * sizeof(float);
    st = ct_pg_alloc_shared(d->pg, bytes ? bytes : 64, &d->shared);
    if (st == CT_ERR_UNSUPPORTED) { /* hier under mpirun: every rank alike */
        CT_LOG_INFO("ddp", "zero-copy off: %s", ct_last_error());
        d->shared = NULL;
        return CT_OK;
    }
    if (st == CT_ERR_SYSTEM || st == CT_ERR_NOMEM) {
        CT_LOG_WARN_("ddp", "zero-copy off, gradients reduced through staging buffers: %s", ct_last_error());
        d->shared = NULL;
        return CT_OK;
    }
    if (st != CT_OK) return st;
    st = ct_params_set_grad_storage(d->P, d->shared);
    if (st != CT_OK) { ct_pg_free_shared(d->pg, d->shared); d->shared = NULL; return st; }
    return CT_OK;
}

ct_status ct_ddp_create(ct_pg *pg, ct_params *P, const ct_ddp_opts *opts, ct_ddp **out) {
    *out = NULL;
    ct_ddp_opts o = opts ? *opts : ct_ddp_default_opts();
    if (o.comm_dtype != CT_F32 && o.comm_dtype != CT_BF16 && o.comm_dtype != CT_F16)
        return ct_error(CT_ERR_INVALID, "DDP: gradient compression dtype must be f32, bf16 or f16, not %s", ct_dtype_name(o.comm_dtype));
    if (o.bucket_cap_bytes < 4) o.bucket_cap_bytes = 4;
    if (o.first_bucket_bytes < 4) o.first_bucket_bytes = 4;
    if (ct_params_is_deferred(P))
        return ct_error(CT_ERR_INVALID, "DDP: the parameters' values are deferred (ct_params_finalize_deferred): "
                        "ct_params_materialize first, or shard them (ct_fsdp_create)");
    if (ct_params_device(P).type != CT_DEV_CPU) {
        /* gradients on a GPU: NCCL reduces them in place, on its stream ordered after the
         * compute stream (src/distributed/nccl.c); compression converts on the device */
        char dv[32];
        ct_device_str(ct_params_device(P), dv, sizeof dv);
        if (!(ct_pg_caps(pg) & CT_PG_CAP_DEVICE_BUFFERS))
            return ct_error(CT_ERR_INVALID, "DDP: parameters on %s need the nccl backend (CTRAIN_BACKEND=nccl), not %s", dv,
                            ct_pg_backend(pg));
    }
    ct_status st = check_same_params(pg, P);
    if (st != CT_OK) return st;
    /* same starting point everywhere: rank 0's weights */
    st = ct_broadcast_sync(pg, ct_params_data(P), ct_params_numel(P), CT_F32, 0);
    if (st == CT_OK && o.broadcast_buffers && ct_params_buffer_numel(P))
        st = ct_broadcast_sync(pg, ct_params_buffer_data(P), ct_params_buffer_numel(P), CT_F32, 0);
    if (st != CT_OK) return st;

    ct_ddp *d = calloc(1, sizeof *d);
    if (!d) return ct_error(CT_ERR_NOMEM, "DDP: out of memory");
    int n = ct_params_count(P);
    d->bucket_of = malloc(sizeof(int) * (size_t)(n ? n : 1));
    d->ready = calloc((size_t)(n ? n : 1), sizeof(bool));
    d->b = calloc((size_t)(n ? n : 1), sizeof(bucket));
    if (!d->bucket_of || !d->ready || !d->b) { ct_ddp_free(d); return ct_error(CT_ERR_NOMEM, "DDP: out of memory"); }
    d->pg = pg;
    d->P = P;
    d->o = o;
    d->dev = ct_params_device(P);
    /* walk parameters from last to first, closing a bucket when it reaches its cap */
    bucket *cur = NULL;
    size_t cap = o.first_bucket_bytes;
    for (int i = n - 1; i >= 0; i--) {
        d->bucket_of[i] = -1;
        if (ct_params_is_buffer(P, i)) continue;
        size_t off = ct_params_offset(P, i), len = (size_t)ct_numel(ct_params_get(P, i));
        if (!cur || (cur->numel + len) * sizeof(float) > cap) {
            if (cur) cap = o.bucket_cap_bytes;
            cur = &d->b[d->nb++];
            cur->first = i;
            cur->off = off;
            cur->numel = 0;
        }
        /* the slice runs from this parameter's offset to the end of the bucket's first one,
         * padding included (padding gradients are zero on every rank) */
        size_t end = cur->off + cur->numel;
        if (cur->numel == 0) end = off + ((len + 15) & ~(size_t)15);
        cur->off = off;
        cur->numel = end - off;
        cur->last = i;
        cur->nparams++;
        d->bucket_of[i] = (int)(cur - d->b);
    }
    for (int k = 0; k < d->nb; k++) {
        d->b[k].pending = d->b[k].nparams;
        if (o.comm_dtype != CT_F32 && ct_device_alloc(d->dev, d->b[k].numel * ct_dtype_size(o.comm_dtype), &d->b[k].scratch) != CT_OK) {
            ct_ddp_free(d);
            return ct_error(CT_ERR_NOMEM, "DDP: no memory for compression buffers: %s", ct_last_error());
        }
    }
    d->st.buckets = d->nb;
    d->next_final = n - 1;
    st = setup_zero_copy(d);
    if (st != CT_OK) { ct_ddp_free(d); return st; }
    ct_params_set_grad_hook(P, on_grad_ready, d);
    CT_LOG_INFO("ddp", "%d parameters in %d buckets (first %zu B, cap %zu B), comm dtype %s%s", n, d->nb, o.first_bucket_bytes,
                o.bucket_cap_bytes, ct_dtype_name(o.comm_dtype),
                d->shared ? ", zero-copy in shared memory" : "");
    *out = d;
    return CT_OK;
}

void ct_ddp_free(ct_ddp *d) {
    if (!d) return;
    if (d->P) ct_params_set_grad_hook(d->P, NULL, NULL);
    for (int k = 0; k < d->nb; k++) {
        if (d->b[k].work) ct_work_free(d->b[k].work);
        ct_device_free(d->dev, d->b[k].scratch);
    }
    if (d->shared) {
        /* gradients move back to private memory before the segment goes */
        if (ct_params_set_grad_storage(d->P, NULL) != CT_OK) CT_LOG_WARN_("ddp", "%s", ct_last_error());
        else ct_pg_free_shared(d->pg, d->shared);
    }
    free(d->b);
    free(d->bucket_of);
    free(d->ready);
    free(d);
}

void ct_ddp_set_no_sync(ct_ddp *d, bool no_sync) { d->no_sync = no_sync; }

static void reset_step(ct_ddp *d) {
    for (int k = 0; k < d->nb; k++) {
        d->b[k].pending = d->b[k].nparams;
        d->b[k].launched = false;
        d->b[k].t_launch = d->b[k].t_done = 0;
    }
    memset(d->ready, 0, sizeof(bool) * (size_t)ct_params_count(d->P));
    d->next_launch = 0;
    d->next_final = ct_params_count(d->P) - 1;
    d->step_active = false;
}

/* Parameters that never reported this step: an error naming the first (after waiting for
 * launched works), or, with find_unused_parameters, marked ready to be reduced as they are
 * (zeros). */
static ct_status check_unused(ct_ddp *d) {
    int n = ct_params_count(d->P);
    for (int i = n - 1; i >= 0; i--) {
        if (d->bucket_of[i] < 0 || d->ready[i]) continue;
        if (!d->o.find_unused_parameters) {
            for (int k = 0; k < d->nb; k++)
                if (d->b[k].work) { ct_work_wait(d->b[k].work); ct_work_free(d->b[k].work); d->b[k].work = NULL; }
            reset_step(d);
            return ct_error(CT_ERR_INVALID,
                            "DDP: parameter '%s' received no gradient this step; it was not used in the forward pass "
                            "(set find_unused_parameters, or remove it from the model)", ct_params_get(d->P, i)->name);
        }
        d->ready[i] = true;
        d->b[d->bucket_of[i]].pending--;
    }
    return CT_OK;
}

/* deferred: no bucket was reduced; once every rank's gradients are final, the sharded step
 * averages its share from all of them (ct_zero, train.h) */
static ct_status finish_deferred(ct_ddp *d, double t0) {
    (void)ct_params_grad(d->P); /* gradients no backward wrote become zeros before peers read them */
    ct_status st = ct_barrier_shared_sync(d->pg); /* the peers that read them: those sharing the memory */
    d->t_last_finish = ct_time_now();
    d->st.comm_s = d->st.exposed_s = d->t_last_finish - t0;
    d->st.hidden_frac = 0;
    d->st.total_comm_s += d->st.comm_s;
    d->st.total_exposed_s += d->st.exposed_s;
    d->st.steps++;
    reset_step(d);
    return st;
}

static ct_status finish(ct_ddp *d) {
    if (d->no_sync) return CT_OK;
    ct_status ust = check_unused(d);
    if (ust != CT_OK) return ust;
    double t0 = ct_time_now();
    d->st.compute_s = d->t_last_finish > 0 ? t0 - d->t_last_finish - d->wait_since : 0;
    d->wait_since = 0;
    d->st.total_compute_s += d->st.compute_s;
    d->st.deferred = d->deferred;
    if (d->deferred) return finish_deferred(d, t0);
    /* buckets whose unused parameters were just marked ready */
    launch_ready(d);
    ct_status st = CT_OK;
    float inv = 1.0f / (float)ct_pg_size(d->pg);
    double comm = 0, prev_done = 0;
    for (int k = 0; k < d->nb; k++) {
        bucket *b = &d->b[k];
        ct_status s = ct_work_wait(b->work);
        if (b->t_done == 0) b->t_done = ct_time_now();
        if (s != CT_OK && st == CT_OK) st = s;
        ct_work_free(b->work);
        b->work = NULL;
        if (s == CT_OK && d->o.comm_dtype != CT_F32) {
            float *g = ct_params_grad(d->P) + b->off;
            s = b->cst;
            if (s == CT_OK) s = ct_device_convert(d->dev, g, CT_F32, b->scratch, d->o.comm_dtype, (int64_t)b->numel);
            if (s == CT_OK) s = ct_device_scale(d->dev, g, inv, (int64_t)b->numel);
            if (s != CT_OK && st == CT_OK) st = s;
        }
        double start = b->t_launch > prev_done ? b->t_launch : prev_done;
        if (b->t_done > start) comm += b->t_done - start;
        prev_done = b->t_done;
    }
    d->t_last_finish = ct_time_now();
    double exposed = d->t_last_finish - t0;
    d->st.comm_s = comm;
    d->st.exposed_s = exposed;
    d->st.hidden_frac = comm > 0 ? (exposed >= comm ? 0 : 1 - exposed / comm) : 0;
    d->st.total_comm_s += comm;
    d->st.total_exposed_s += exposed;
    d->st.steps++;
    reset_step(d);
    return st;
}

ct_status ct_ddp_finish(ct_ddp *d) { return finish(d); }

/* ------------------------------------------------------------------ deferred averaging */

ct_status ct_ddp_set_deferred(ct_ddp *d, bool on) {
    CT_CHECK(!d->step_active, "ct_ddp_set_deferred during a backward");
    if (on && !d->shared)
        return ct_error(CT_ERR_INVALID, "DDP: deferred averaging needs the gradients in shared memory (zero-copy on the shm backend)");
    d->deferred = on;
    return CT_OK;
}

void ct_ddp_set_progress(ct_ddp *d, ct_ddp_progress_fn fn, void *user) {
    CT_CHECK(!d->step_active, "ct_ddp_set_progress during a backward");
    d->progress = fn;
    d->progress_user = user;
}

bool ct_ddp_zero_copy(const ct_ddp *d) { return d->shared != NULL; }
ct_dtype ct_ddp_comm_dtype(const ct_ddp *d) { return d->o.comm_dtype; }
ct_pg *ct_ddp_pg(const ct_ddp *d) { return d->pg; }
ct_params *ct_ddp_params(const ct_ddp *d) { return d->P; }

/* the wait a deferred step's reader does after it: see ct_zero (train.h) */
void ct_ddp_add_wait(ct_ddp *d, double seconds) {
    d->wait_since += seconds;
    d->st.comm_s += seconds;
    d->st.exposed_s += seconds;
    d->st.total_comm_s += seconds;
    d->st.total_exposed_s += seconds;
}

ct_ddp_stats ct_ddp_get_stats(const ct_ddp *d) { return d->st; }
int ct_ddp_num_buckets(const ct_ddp *d) { return d->nb; }
void ct_ddp_bucket_range(const ct_ddp *d, int b, int *first, int *last) {
    CT_CHECK(b >= 0 && b < d->nb, "bucket %d out of range [0, %d)", b, d->nb);
    *first = d->b[b].first;
    *last = d->b[b].last;
}
