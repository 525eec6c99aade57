/* The trainer: the tutorial's §3.2 program as a library call. sampler → loader →
 * ct_train_step (buckets all-reduce during backward) → periodic evaluation and atomic
 * checkpoints → model.safetensors, metrics and a chart. Rank 0 prints and writes; every
 * rank trains, evaluates its share and checkpoints nothing but what rank 0 saves. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ctrain/metrics.h"
#include "ctrain/train.h"
#include "train/host_trip.h"
#include "train/output_lock.h"
#include "train/resume.h"

struct ct_trainer {
    ct_trainer_opts o;
    const ct_train_model *model;
    ct_optim *opt;
    const ct_dataset *train, *eval;
    int rank, world;
    ct_pg *pg;                 /* NULL alone */
    ct_ddp *ddp;
    ct_zero *zero;             /* the sharded optimizer step, where it applies */
    ct_fsdp *fsdp;             /* instead of ddp with o.shard */
    ct_sampler *sampler;
    ct_loader *loader;
    ct_metrics *metrics;
    ct_ctx *ctx;
    ct_lr_schedule sched;
    int64_t steps_per_epoch, total_steps, step, epoch;
    ct_device dev;             /* the model's: batches go there */
    /* staging of one step's micro-batches, copied out of the loader's ring: with gradient
     * accumulation, and on a GPU (pinned memory there: the copies to the device are
     * asynchronous on its compute stream) */
    void *xbuf;
    int32_t *ybuf;
    ct_train_batch *micro;     /* grad_accum entries (staged) */
    ct_train_batch one;        /* on the CPU with grad_accum == 1: a view of the loader's batch */
    ct_grad_scaler *scaler;    /* loss scaling, or NULL */
    int64_t skipped;           /* steps skipped for overflowing gradients */
    int lock_fd;               /* rank 0: output_dir/.lock, -1 elsewhere */
    int preempted;             /* the signal that stopped the run for preemption, else 0 */
    int64_t saved_step;        /* step of the last checkpoint this run wrote, -1 before */
};

ct_trainer_opts ct_trainer_default_opts(void) {
    return (ct_trainer_opts){.ddp = ct_ddp_default_opts(), .epochs = 1, .batch_size = 64, .grad_accum = 1, .lr = 0.05,
                             .schedule = CT_LR_COSINE, .min_lr = -1, .seed = 1337, .workers = 1, .eval_each_epoch = true,
                             .keep = 3, .log_every = 50, .output_dir = "output", .metrics = true,
                             .scaler = ct_grad_scaler_default_opts()};
}

/* VmPeak: the most address space the process had (what RLIMIT_AS limits), 0 when unknown */
static double peak_vm_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmPeak: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb / 1024.0;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

/* The model's GPU memory from the caching allocator, in MB (what the process holds there
 * for tensors, as torch.cuda.memory_allocated / max_memory_allocated): false on the CPU. */
static bool gpu_mem_mb(const ct_trainer *t, double *cur, double *peak) {
    ct_device_mem m;
    if (t->dev.type == CT_DEV_CPU || ct_device_mem_get(t->dev, &m) != CT_OK) return false;
    *cur = (double)m.current / 1048576.0;
    *peak = (double)m.peak / 1048576.0;
    return true;
}

static void fmt_eta(double s, char *b, size_t n) {
    if (!isfinite(s) || s < 0) { snprintf(b, n, "?"); return; }
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(b, n, "%dh%02dm", t / 3600, t / 60 % 60);
    else snprintf(b, n, "%dm%02ds", t / 60, t % 60);
}

/* A few doubles over ranks (logging and evaluation only). */
static ct_status allreduce_d(ct_trainer *t, double *v, int n, ct_reduce_op op) {
    if (!t->pg) return CT_OK;
    return ct_all_reduce_sync(t->pg, v, (size_t)n, CT_F64, op);
}

static ct_train_batch batch_of(const ct_dataset *d, void *x, int32_t *y, int64_t n) {
    int64_t xd[CT_MAX_DIMS] = {n}, yd[2] = {n, ct_dataset_y_numel(d)};
    int xnd = ct_dataset_x_shape(d, xd + 1) + 1;
    return ct_train_batch_of(ct_dataset_x_dtype(d), x, xnd, xd, y, yd[1] == 1 ? 1 : 2, yd);
}

ct_status ct_trainer_create(const ct_trainer_opts *opts, const ct_train_model *model, ct_optim *opt,
                            const ct_dataset *train_data, const ct_dataset *eval_data, ct_trainer **out) {
    *out = NULL;
    ct_trainer_opts o = opts ? *opts : ct_trainer_default_opts();
    if (!model || !model->params || !model->forward || !opt || !train_data)
        return ct_error(CT_ERR_INVALID, "ct_trainer_create: a model with parameters and forward, an optimizer and training data are needed");
    if (ct_optim_params(opt) != model->params)
        return ct_error(CT_ERR_INVALID, "ct_trainer_create: the optimizer updates another parameter store than the model's");
    ct_device dev = ct_params_device(model->params);
    char db[32], ob[32];
    if (!ct_device_eq(ct_optim_device(opt), dev))
        return ct_error(CT_ERR_INVALID, "ct_trainer_create: the parameters are on %s, the optimizer's state on %s (create the "
                        "optimizer after moving the model)", ct_device_str(dev, db, sizeof db),
                        ct_device_str(ct_optim_device(opt), ob, sizeof ob));
    if (o.batch_size < 1 || o.grad_accum < 1 || o.epochs < 1 || o.max_steps < 0 || o.log_every < 0 || o.keep < 0 ||
        o.eval_every < 0 || o.save_every < 0 || o.eval_max < 0 || o.workers < 0 || !(o.lr > 0) || !o.output_dir)
        return ct_error(CT_ERR_INVALID, "ct_trainer_create: batch_size %d, grad_accum %d, epochs %" PRId64 " must be >= 1, lr %g > 0, "
                        "the other counts >= 0 and output_dir set", o.batch_size, o.grad_accum, o.epochs, o.lr);
    /* bad data fails here, once, naming the file and index, not inside an op mid-run */
    ct_status cs = ct_train_check_data(model, train_data);
    if (cs == CT_OK && eval_data && eval_data != train_data) cs = ct_train_check_data(model, eval_data);
    if (cs != CT_OK) return cs;
    ct_trainer *t = calloc(1, sizeof *t);
    if (!t) return ct_error(CT_ERR_NOMEM, "out of memory");
    t->o = o;
    t->model = model;
    t->opt = opt;
    t->train = train_data;
    t->eval = eval_data;
    t->world = 1;
    t->lock_fd = -1;
    t->saved_step = -1;
    t->dev = dev;
    if (o.pg && ct_pg_size(o.pg) > 1) {
        t->pg = o.pg;
        t->rank = ct_pg_rank(o.pg);
        t->world = ct_pg_size(o.pg);
    }
    ct_status st = CT_OK;
    /* before any collective: a refused rank 0 exits at once and the launcher stops the rest */
    if (t->rank == 0) st = ct_output_lock(o.output_dir, &t->lock_fd);
    bool sharded = t->pg && o.shard != CT_SHARD_NONE;
    /* on a device model.safetensors is streamed from the shards through host staging; a model
     * without save_fetch would be gathered whole and moved to the host, which the shards'
     * address ranges do not allow */
    if (st == CT_OK && sharded && dev.type != CT_DEV_CPU && !model->save_fetch)
        st = ct_error(CT_ERR_UNSUPPORTED, "--shard %s on a device needs a model with save_fetch (model.safetensors is written "
                      "a unit at a time from the device shards)", ct_shard_mode_name(o.shard));
    /* a deferred model (ct_model_create_deferred) that nothing shards is made whole here */
    if (st == CT_OK && !sharded) st = ct_params_materialize(model->params);
    if (st == CT_OK && sharded) st = ct_fsdp_create(t->pg, model->params, opt, o.shard, &t->fsdp);
    else if (st == CT_OK && t->pg) st = ct_ddp_create(t->pg, model->params, &o.ddp, &t->ddp);
    if (st == CT_OK && t->fsdp) ct_optim_release_state(opt); /* the shards' optimizer steps instead */
    if (st == CT_OK && t->fsdp) ct_fsdp_set_prefetch(t->fsdp, o.shard_prefetch);
    if (st == CT_OK && t->fsdp) st = ct_fsdp_set_param_dtype(t->fsdp, o.shard_param_dtype);
    if (st == CT_OK && !t->fsdp && ct_optim_is_template(opt))
        st = ct_error(CT_ERR_INVALID, "ct_trainer_create: the optimizer is a template (no state) and nothing is sharded");
    if (st == CT_OK) {
        ct_sampler_opts so = ct_sampler_default_opts();
        so.n = ct_dataset_len(train_data);
        so.num_replicas = t->world;
        so.rank = t->rank;
        so.seed = o.seed;
        so.shuffle = true;
        st = ct_sampler_create(&so, &t->sampler);
    }
    if (st == CT_OK) {
        ct_loader_opts lo = ct_loader_default_opts();
        lo.batch_size = o.batch_size;
        lo.workers = o.workers;
        lo.drop_last = true; /* equal batch sizes on every rank keep the DDP average exact */
        st = ct_loader_create(train_data, t->sampler, &lo, &t->loader);
    }
    if (st == CT_OK) {
        t->steps_per_epoch = ct_loader_len(t->loader) / o.grad_accum;
        if (t->steps_per_epoch == 0)
            st = ct_error(CT_ERR_INVALID, "--batch-size %d%s is larger than this rank's %lld samples per epoch", o.batch_size,
                          o.grad_accum > 1 ? " x --grad-accum" : "", (long long)ct_sampler_len(t->sampler));
    }
    if (st == CT_OK && (o.grad_accum > 1 || dev.type != CT_DEV_CPU)) {
        size_t xs = ct_dtype_size(ct_dataset_x_dtype(train_data)) * (size_t)ct_dataset_x_numel(train_data);
        size_t ys = sizeof(int32_t) * (size_t)ct_dataset_y_numel(train_data), n = (size_t)o.batch_size * (size_t)o.grad_accum;
        st = ct_host_alloc(dev, xs * n, &t->xbuf);
        if (st == CT_OK) st = ct_host_alloc(dev, ys * n, (void **)&t->ybuf);
        if (st == CT_OK && !(t->micro = malloc(sizeof *t->micro * (size_t)o.grad_accum)))
            st = ct_error(CT_ERR_NOMEM, "out of memory for %d micro-batches", o.grad_accum);
    }
    if (st == CT_OK) {
        t->total_steps = o.max_steps > 0 ? o.max_steps : t->steps_per_epoch * o.epochs;
        double lr = o.lr;
        switch (o.schedule) {
        case CT_LR_COSINE: t->sched = ct_lr_cosine(lr, o.min_lr >= 0 ? o.min_lr : lr * 0.1, o.warmup_steps, t->total_steps); break;
        case CT_LR_LINEAR: t->sched = ct_lr_linear(lr, o.min_lr >= 0 ? o.min_lr : 0, o.warmup_steps, t->total_steps); break;
        default: t->sched = ct_lr_constant(lr, o.warmup_steps);
        }
        ct_ctx_opts co = ct_ctx_default_opts();
        co.seed = o.seed;
        st = ct_ctx_create(&co, &t->ctx);
    }
    if (o.amp == CT_F16) o.loss_scaling = true; /* f16's range needs it; bf16's does not */
    if (st == CT_OK && o.amp != CT_F32 && o.amp != CT_BF16 && o.amp != CT_F16)
        st = ct_error(CT_ERR_INVALID, "trainer: amp must be f32 (off), bf16 or f16, not %s", ct_dtype_name(o.amp));
    if (st == CT_OK && o.loss_scaling) st = ct_grad_scaler_create(&o.scaler, &t->scaler);
    if (st == CT_OK && t->rank == 0 && o.metrics) st = ct_metrics_open(o.output_dir, &t->metrics);
    if (st != CT_OK) {
        ct_trainer_free(t);
        return st;
    }
    *out = t;
    return CT_OK;
}

void ct_trainer_free(ct_trainer *t) {
    if (!t) return;
    ct_metrics_close(t->metrics);
    ct_loader_free(t->loader);
    ct_sampler_free(t->sampler);
    ct_zero_free(t->zero);
    ct_ddp_free(t->ddp);
    if (t->o.release_model) ct_fsdp_discard(t->fsdp);
    else ct_fsdp_free(t->fsdp);
    ct_ctx_free(t->ctx);
    ct_grad_scaler_free(t->scaler);
    ct_host_free(t->dev, t->xbuf);
    ct_host_free(t->dev, t->ybuf);
    free(t->micro);
    ct_output_unlock(t->lock_fd);
    free(t);
}

int64_t ct_trainer_step(const ct_trainer *t) { return t->step; }
int64_t ct_trainer_total_steps(const ct_trainer *t) { return t->total_steps; }
int64_t ct_trainer_steps_per_epoch(const ct_trainer *t) { return t->steps_per_epoch; }
ct_ddp *ct_trainer_ddp(ct_trainer *t) { return t->ddp; }
ct_fsdp *ct_trainer_fsdp(ct_trainer *t) { return t->fsdp; }
ct_ctx *ct_trainer_ctx(ct_trainer *t) { return t->ctx; }
float ct_trainer_loss_scale(const ct_trainer *t) { return t->scaler ? ct_grad_scaler_scale(t->scaler) : 1.0f; }
int64_t ct_trainer_skipped_steps(const ct_trainer *t) { return t->skipped; }
int ct_trainer_preempted(const ct_trainer *t) { return t->preempted; }

/* The data evaluated: the evaluation set, else the training data. */
static const ct_dataset *eval_set(const ct_trainer *t) { return t->eval ? t->eval : t->train; }

/* Loss and accuracy over the evaluation set (evaluate.c), in the trainer's context */
ct_status ct_trainer_evaluate(ct_trainer *t, ct_eval_report *r) {
    const ct_dataset *d = eval_set(t);
    /* a mean over no sample is 0/0: say so rather than report "accuracy nan" */
    if (ct_dataset_len(d) == 0)
        return ct_error(CT_ERR_INVALID, "nothing to evaluate: the evaluation data (%s) has no samples", ct_dataset_source(d));
    ct_eval_opts eo = ct_eval_default_opts();
    eo.batch_size = t->o.batch_size;
    eo.max_samples = t->o.eval_max;
    eo.pg = t->pg;
    /* FSDP gathers each unit as its forward enters it and frees it after, as in training,
     * so every rank runs as many forwards: the whole model is never gathered */
    eo.lockstep = t->fsdp != NULL;
    ct_status st = ct_evaluate(t->model, d, &eo, t->ctx, r);
    r->step = t->step;
    r->epoch = t->epoch;
    return st;
}

static ct_train_state train_state(ct_trainer *t) {
    ct_train_state ts = {.step = t->step, .epoch = t->epoch, .sampler = ct_loader_state(t->loader), .seed = t->o.seed,
                         .world_size = t->world};
    if (t->scaler) {
        ct_grad_scaler_state ss = ct_grad_scaler_get_state(t->scaler);
        ts.loss_scale = ss.scale;
        ts.scaler_growth_tracker = ss.growth_tracker;
    }
    return ts;
}

static ct_status save_ckpt(ct_trainer *t) {
    if (t->rank != 0) return CT_OK;
    char root[4200];
    snprintf(root, sizeof root, "%s/checkpoints", t->o.output_dir);
    ct_train_state ts = train_state(t);
    return ct_checkpoint_save(root, t->model, t->opt, &ts, t->o.keep);
}

/* Rank 0's outcome of something only it does (saving, cleaning), made every rank's: a
 * failure stops all ranks at the same point instead of leaving the others to time out in
 * their next collective. Also a barrier. */
static ct_status agree(ct_trainer *t, ct_status st, const char *what) {
    if (!t->pg) return st;
    double v[1] = {st != CT_OK};
    ct_status cs = allreduce_d(t, v, 1, CT_RED_MAX);
    if (cs != CT_OK) return st != CT_OK ? st : cs;
    if (v[0] == 0) return st;
    /* rank 0's message to every rank: whichever rank the launcher reports first names the
     * path and the cause (a message in i32 words: the collectives have no byte type) */
    int32_t msg[256];
    memset(msg, 0, sizeof msg);
    if (t->rank == 0) snprintf((char *)msg, sizeof msg, "%s", ct_last_error());
    if (ct_broadcast_sync(t->pg, msg, 256, CT_I32, 0) != CT_OK || t->rank == 0) return st != CT_OK ? st : CT_ERR_IO;
    ((char *)msg)[sizeof msg - 1] = 0;
    return ct_error(CT_ERR_IO, "%s on rank 0: %s", what, (const char *)msg);
}

/* A periodic or final checkpoint: an error stops training unless the user chose to go on. */
static ct_status checkpoint(ct_trainer *t) {
    if (t->saved_step == t->step) return CT_OK; /* a stop right after a periodic save */
    ct_status st;
    if (t->fsdp) { /* every rank writes its shards (collective, the same outcome everywhere) */
        char root[4200];
        snprintf(root, sizeof root, "%s/checkpoints", t->o.output_dir);
        ct_train_state ts = train_state(t);
        st = ct_checkpoint_save_sharded(t->pg, t->fsdp, root, t->model, &ts, t->o.keep);
    } else {
        st = agree(t, save_ckpt(t), "writing the checkpoint");
    }
    if (st == CT_OK) t->saved_step = t->step;
    if (st == CT_OK || !t->o.keep_going_on_save_error) return st;
    CT_LOG_WARN_("train", "checkpoint at step %" PRId64 " not written (going on: keep_going_on_save_error): %s", t->step,
                 ct_last_error());
    return CT_OK;
}

static ct_status save_weights(ct_trainer *t) {
    if (t->rank != 0) return CT_OK;
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", t->o.output_dir);
    ct_status st = ct_checkpoint_free_space(t->o.output_dir, (uint64_t)ct_params_numel(t->model->params) * sizeof(float),
                                            "model.safetensors");
    ct_device was;
    if (st == CT_OK) st = ct_train_to_host_(t->model, NULL, &was);
    if (st != CT_OK) return st;
    st = t->model->save ? t->model->save(t->model->self, p) : ct_params_save(t->model->params, p);
    return ct_train_from_host_(t->model, NULL, was, st);
}

/* rank 0's part of ct_fsdp_stream: model.safetensors with the units fetched as written */
static ct_status save_streamed(void *arg, ct_st_fetch_fn fetch, void *user) {
    ct_trainer *t = arg;
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors", t->o.output_dir);
    ct_status st = ct_checkpoint_free_space(t->o.output_dir, (uint64_t)ct_params_numel(t->model->params) * sizeof(float),
                                            "model.safetensors");
    return st != CT_OK ? st : t->model->save_fetch(t->model->self, p, fetch, user);
}

static ct_status resume(ct_trainer *t) {
    char dir[4200];
    ct_train_state ts;
    bool resumed;
    ct_status st = ct_train_resume_(t->pg, t->fsdp, t->o.resume, t->o.output_dir, t->model, t->opt, &ts, &resumed, dir, sizeof dir);
    if (st != CT_OK || !resumed) return st; /* nothing to resume: start fresh */
    if ((st = ct_sampler_set_state(t->sampler, &ts.sampler)) != CT_OK) return st;
    t->step = ts.step;
    t->epoch = ts.sampler.epoch;
    if (t->scaler && ts.loss_scale > 0) /* a checkpoint written without loss scaling starts afresh */
        ct_grad_scaler_set_state(t->scaler, (ct_grad_scaler_state){(float)ts.loss_scale, (int32_t)ts.scaler_growth_tracker});
    if (t->rank == 0 && t->o.log_every > 0)
        printf("resumed from %s at step %" PRId64 " (epoch %" PRId64 ", sample %" PRId64 ")\n", dir, t->step, t->epoch, ts.sampler.position);
    return CT_OK;
}

/* Whether a preemption signal reached any rank: the same answer on every rank, so that all
 * stop after the same step (a signal may reach them at different steps). One int, MAX. */
static ct_status preempt_agreed(ct_trainer *t, int *sig) {
    int32_t v = ct_preempt_signal();
    ct_status st = t->pg ? ct_all_reduce_sync(t->pg, &v, 1, CT_I32, CT_RED_MAX) : CT_OK;
    *sig = v;
    return st;
}

/* The micro-batches of the next step, or 0 at the end of the epoch (a partial group of
 * micro-batches is dropped, as the loader drops a partial batch). With one micro-batch on
 * the CPU the loader's own buffers are used; else they are copied out of its ring into the
 * staging buffers. On a GPU those are pinned and ct_train_step's copies from them run
 * asynchronously on the compute stream; rewriting them here for the next step is safe
 * because the step waited for that stream (its ct_item of the loss) after queueing them. */
static ct_status next_step_batches(ct_trainer *t, ct_train_batch **micro, int *n) {
    *n = 0;
    int K = t->o.grad_accum;
    size_t xs = ct_dtype_size(ct_dataset_x_dtype(t->train)) * (size_t)ct_dataset_x_numel(t->train);
    size_t ys = sizeof(int32_t) * (size_t)ct_dataset_y_numel(t->train);
    for (int k = 0; k < K; k++) {
        ct_batch b;
        ct_status st = ct_loader_next(t->loader, &b);
        if (st != CT_OK) return st;
        if (b.n == 0) return CT_OK;
        if (!t->xbuf) {
            t->one = batch_of(t->train, b.x, b.y, b.n);
        } else {
            char *x = (char *)t->xbuf + xs * (size_t)(k * t->o.batch_size);
            int32_t *y = (int32_t *)((char *)t->ybuf + ys * (size_t)(k * t->o.batch_size));
            memcpy(x, b.x, xs * (size_t)b.n);
            memcpy(y, b.y, ys * (size_t)b.n);
            t->micro[k] = batch_of(t->train, x, y, b.n);
        }
    }
    *micro = t->xbuf ? t->micro : &t->one;
    *n = K;
    return CT_OK;
}

static void print_eval(ct_trainer *t, const ct_eval_report *e, bool tty, bool at_epoch_end) {
    if (t->rank != 0) return;
    if (t->o.log_every > 0) {
        if (at_epoch_end)
            printf("%seval  epoch %" PRId64 " (step %" PRId64 "): test loss %.4f, accuracy %.4f\n", tty ? "\n" : "", e->epoch + 1,
                   e->step, e->loss, e->accuracy);
        else
            printf("%seval  step %" PRId64 ": test loss %.4f, accuracy %.4f\n", tty ? "\n" : "", e->step, e->loss, e->accuracy);
    }
    if (!t->metrics) return;
    ct_metrics_scalar(t->metrics, "eval/loss", e->step, e->loss);
    ct_metrics_scalar(t->metrics, "eval/accuracy", e->step, e->accuracy);
    ct_metrics_flush(t->metrics);
}

/* FSDP's memory per rank, the largest over ranks, against the unsharded (DDP) sizes; then
 * the units go back to their shards */
static ct_status fsdp_report(ct_trainer *t) {
    ct_fsdp_mem m = ct_fsdp_memory(t->fsdp);
    double v[6] = {(double)m.shard_param_bytes, (double)m.optim_state_bytes, (double)m.peak_gathered_bytes,
                   (double)m.peak_resident_bytes, (double)m.peak_total_bytes, (double)m.staging_bytes};
    ct_status st = allreduce_d(t, v, 6, CT_RED_MAX);
    if (st != CT_OK) return st;
    if (t->rank == 0 && t->o.log_every > 0) {
        const double MB = 1048576.0, full = (double)m.full_param_bytes;
        double state = (double)ct_optim_state_count(ct_fsdp_optim(t->fsdp)) * full;
        printf("fsdp: --shard %s, %d units (largest %.2f MB, root %.2f MB) | per rank, max over ranks: shard params %.2f MB, "
               "shard grads %.2f MB, optimizer state %.2f MB, peak gathered units %.2f MB, peak resident full-size buffers "
               "(params + grads, measured) %.2f MB, collective staging %.2f MB; total %.2f MB | unsharded (DDP): params %.2f MB, grads %.2f MB, state %.2f MB, "
               "total %.2f MB | all-gathers %s, %.2f MB received by rank 0\n",
               ct_shard_mode_name(ct_fsdp_mode(t->fsdp)), m.units, (double)m.largest_unit_bytes / MB, (double)m.root_bytes / MB,
               v[0] / MB, v[0] / MB, v[1] / MB, v[2] / MB, v[3] / MB, v[5] / MB, v[4] / MB, full / MB, full / MB, state / MB,
               (2 * full + state) / MB, ct_dtype_name(t->o.shard_param_dtype), (double)m.gathered_bytes / MB);
        fflush(stdout);
    }
    return ct_fsdp_reshard(t->fsdp);
}

ct_status ct_trainer_fit(ct_trainer *t) {
    const ct_trainer_opts *o = &t->o;
    ct_status st = CT_OK;
    if (t->rank == 0) {
        char root[4200];
        snprintf(root, sizeof root, "%s/checkpoints", o->output_dir);
        /* leftovers of a killed save are removed (and a cut re-save restored) before any rank
         * looks for a checkpoint to resume from, hence the barrier */
        if (ct_checkpoint_cleanup(root) != CT_OK) CT_LOG_WARN_("train", "%s", ct_last_error());
        snprintf(root, sizeof root, "%s/model.safetensors", o->output_dir);
        ct_st_remove_stale_tmp(root);
    }
    if ((st = agree(t, CT_OK, "cleaning up checkpoints")) != CT_OK) return st;
    st = o->resume ? resume(t) : CT_OK;
    /* after resuming: the shared copy starts from rank 0's loaded values */
    if (st == CT_OK && t->ddp && !t->zero) st = ct_zero_create(t->ddp, t->opt, &t->zero);
    if (st != CT_OK) return st;
    bool tty = isatty(1), talk = t->rank == 0 && o->log_every > 0;
    int64_t global_batch = (int64_t)o->batch_size * t->world * o->grad_accum;
    int64_t T = ct_dataset_y_numel(t->train); /* items per sample: tokens for a language model */
    if (talk) {
        char acc[48] = "";
        if (o->grad_accum > 1) snprintf(acc, sizeof acc, " × %d micro-batches", o->grad_accum);
        char amp[48] = "", where[48] = "", dn[32];
        if (o->amp != CT_F32) snprintf(amp, sizeof amp, " | autocast %s%s", ct_dtype_name(o->amp), t->scaler ? " + loss scaling" : "");
        if (t->dev.type != CT_DEV_CPU) snprintf(where, sizeof where, " | on %s", ct_device_str(t->dev, dn, sizeof dn));
        printf("%s | %d rank%s × batch %d%s = global batch %" PRId64 " | %" PRId64 " steps/epoch, %" PRId64 " steps | %s lr %g | %d threads/rank%s%s\n",
               t->model->describe ? t->model->describe : "model", t->world, t->world > 1 ? "s" : "", o->batch_size, acc,
               global_batch, t->steps_per_epoch, t->total_steps, ct_optim_kind(t->opt), o->lr, ct_get_num_threads(), amp, where);
        fflush(stdout);
    }
    bool can_eval = ct_dataset_len(eval_set(t)) > 0;
    if (!can_eval && talk) printf("no evaluation: the evaluation data (%s) has no samples\n", ct_dataset_source(eval_set(t)));
    double t_start = ct_time_now(), t_log = t_start, loss_acc = 0;
    int64_t steps_since_log = 0, step0 = t->step;
    ct_eval_report ev = {.loss = NAN, .accuracy = NAN};
    bool stop = false;
    ct_step_args sa = {.ctx = t->ctx, .model = t->model, .opt = t->opt, .ddp = t->ddp, .zero = t->zero, .clip_norm = o->clip_norm,
                       .scaler = t->scaler, .amp = o->amp, .fsdp = t->fsdp};
    while (t->step < t->total_steps && st == CT_OK && !stop) {
        ct_loader_start_epoch(t->loader, t->epoch);
        while (t->step < t->total_steps && !stop) {
            int n;
            ct_train_batch *micro;
            st = next_step_batches(t, &micro, &n);
            if (st != CT_OK || n == 0) break;
            sa.lr = ct_lr_at(&t->sched, t->step);
            sa.step = t->step;
            ct_step_result res;
            if ((st = ct_train_step(&sa, micro, n, &res)) != CT_OK) break;
            t->step++;
            if (res.skipped) {
                /* every skipped step is said, with the scale it left (PyTorch stays silent) */
                t->skipped++;
                if (t->rank == 0)
                    CT_LOG_WARN_("train", "step %" PRId64 ": gradients overflowed (inf/NaN), optimizer step skipped; loss scale now %g%s",
                                 t->step, (double)res.scale,
                                 ct_grad_scaler_at_floor(t->scaler) ? " (its floor: the model has likely diverged)" : "");
                if (t->metrics) ct_metrics_scalar(t->metrics, "train/loss_scale", t->step, res.scale);
            }
            loss_acc += res.loss;
            steps_since_log++;
            if (!isfinite(res.loss) && !res.skipped) { /* with loss scaling an overflow is a skipped step */
                st = ct_error(CT_ERR_INVALID, "loss became %g at step %" PRId64 " (lower --lr?)", res.loss, t->step);
                break;
            }
            bool last = t->step == t->total_steps;
            if ((o->log_every > 0 && t->step % o->log_every == 0) || last) {
                double v[1] = {loss_acc / (double)steps_since_log};
                if ((st = allreduce_d(t, v, 1, CT_RED_AVG)) != CT_OK) break;
                double now = ct_time_now(), sps = (double)(steps_since_log * global_batch * T) / (now - t_log);
                double eta = (double)(t->total_steps - t->step) * (now - t_start) / (double)(t->step - step0);
                char etas[32];
                fmt_eta(eta, etas, sizeof etas);
                double act = (double)ct_ctx_peak_bytes(t->ctx) / 1048576.0, gcur = 0, gpeak = 0;
                bool gpu = gpu_mem_mb(t, &gcur, &gpeak);
                if (talk) {
                    char gm[64] = "";
                    if (gpu) snprintf(gm, sizeof gm, " | gpu %.0f MB (peak %.0f MB)", gcur, gpeak);
                    printf("%sstep %6" PRId64 "/%" PRId64 " | epoch %" PRId64 " | loss %.4f | lr %.3g | %.0f %s/s | ETA %s | peak %.0f MB (activations %.0f MB)%s%s",
                           tty ? "\r" : "", t->step, t->total_steps, t->epoch + 1, v[0], sa.lr, sps, T > 1 ? "tokens" : "samples", etas,
                           peak_rss_mb(), act, gm, tty ? "\033[K" : "\n");
                    fflush(stdout);
                }
                if (t->metrics) {
                    ct_metrics_scalar(t->metrics, "train/loss", t->step, v[0]);
                    ct_metrics_scalar(t->metrics, "train/lr", t->step, sa.lr);
                    ct_metrics_scalar(t->metrics, T > 1 ? "train/tokens_per_s" : "train/samples_per_s", t->step, sps);
                    ct_metrics_scalar(t->metrics, "train/peak_rss_mb", t->step, peak_rss_mb());
                    ct_metrics_scalar(t->metrics, "train/activations_peak_mb", t->step, act);
                    if (gpu) {
                        ct_metrics_scalar(t->metrics, "train/gpu_mem_mb", t->step, gcur);
                        ct_metrics_scalar(t->metrics, "train/gpu_peak_mb", t->step, gpeak);
                    }
                }
                loss_acc = 0;
                steps_since_log = 0;
                t_log = ct_time_now();
            }
            if (o->on_step) {
                ct_step_report rep = {.step = t->step, .total_steps = t->total_steps, .epoch = t->epoch, .loss = res.loss,
                                      .lr = sa.lr, .grad_norm = res.grad_norm};
                stop = !o->on_step(t, &rep, o->user);
            }
            if (can_eval && ((o->eval_every > 0 && t->step % o->eval_every == 0) || last)) {
                if ((st = ct_trainer_evaluate(t, &ev)) != CT_OK) break;
                print_eval(t, &ev, tty, false);
                if (o->on_eval && !o->on_eval(t, &ev, o->user)) stop = true;
            }
            if (o->save_every > 0 && t->step % o->save_every == 0 && !last && (st = checkpoint(t)) != CT_OK) break;
            if (o->preemptible && !last && ((st = preempt_agreed(t, &t->preempted)) != CT_OK || t->preempted)) break;
        }
        if (st != CT_OK || stop || t->preempted) break;
        if (t->step < t->total_steps) {
            /* end of an epoch: evaluate unless --eval-every picks its own steps */
            if (can_eval && o->eval_every == 0 && o->eval_each_epoch) {
                if ((st = ct_trainer_evaluate(t, &ev)) != CT_OK) break;
                print_eval(t, &ev, tty, true);
                if (o->on_eval && !o->on_eval(t, &ev, o->user)) stop = true;
            }
            t->epoch++;
        }
    }
    if (st != CT_OK) return st;
    if ((st = checkpoint(t)) != CT_OK) return st;
    if (t->preempted) { /* the checkpoint is the result: the weights are not final */
        if (talk)
            printf("%spreempted by %s at step %" PRId64 ": checkpoint saved under %s/checkpoints; --resume auto continues\n",
                   tty ? "\n" : "", strsignal(t->preempted), t->step, o->output_dir);
        return CT_OK;
    }
    /* the result itself: never only a warning */
    /* under FSDP a unit at a time (no rank holds the whole model), or gathered whole for a
     * model without save_fetch */
    if (t->fsdp && t->model->save_fetch) {
        st = agree(t, ct_fsdp_stream(t->fsdp, save_streamed, t), "writing model.safetensors");
    } else {
        if (t->fsdp && (st = ct_fsdp_gather_all(t->fsdp)) != CT_OK) return st;
        st = agree(t, save_weights(t), "writing model.safetensors");
    }
    if (st != CT_OK) return st;
    if (t->fsdp && (st = fsdp_report(t)) != CT_OK) return st;
    double mem[2] = {peak_rss_mb(), peak_vm_mb()}; /* the largest rank's */
    if ((st = allreduce_d(t, mem, 2, CT_RED_MAX)) != CT_OK) return st;
    if (t->rank == 0) {
        char p[4200];
        snprintf(p, sizeof p, "%s/training.svg", o->output_dir);
        if (t->metrics && ct_metrics_write_svg(t->metrics, p, t->model->describe) != CT_OK)
            CT_LOG_WARN_("train", "%s", ct_last_error());
        if (o->log_every > 0) {
            char evs[160] = "nothing evaluated";
            if (ev.count > 0) snprintf(evs, sizeof evs, "test accuracy %.4f | test loss %.4f", ev.accuracy, ev.loss);
            if (t->scaler) snprintf(evs + strlen(evs), sizeof evs - strlen(evs), " | %" PRId64 " steps skipped (overflow), loss scale %g",
                                    t->skipped, (double)ct_grad_scaler_scale(t->scaler));
            double gcur, gpeak;
            if (gpu_mem_mb(t, &gcur, &gpeak)) snprintf(evs + strlen(evs), sizeof evs - strlen(evs), " | gpu peak %.0f MB", gpeak);
            printf("done: %" PRId64 " steps in %.1f s | %s | weights %s/model.safetensors\n", t->step - step0,
                   ct_time_now() - t_start, evs, o->output_dir);
            if (t->ddp && ct_ddp_get_stats(t->ddp).deferred) {
                ct_ddp_stats ds = ct_ddp_get_stats(t->ddp);
                printf("ddp: sharded optimizer step, gradients averaged in it | per step: compute %.1f ms, waiting for peers %.1f ms\n",
                       ds.steps > 1 ? 1e3 * ds.total_compute_s / (double)(ds.steps - 1) : 0,
                       ds.steps ? 1e3 * ds.total_exposed_s / (double)ds.steps : 0);
            } else if (t->ddp) {
                ct_ddp_stats ds = ct_ddp_get_stats(t->ddp);
                printf("ddp: %d buckets | per step: compute %.1f ms, all-reduce %.1f ms, %.0f%% of it hidden behind backward\n",
                       ds.buckets, ds.steps > 1 ? 1e3 * ds.total_compute_s / (double)(ds.steps - 1) : 0,
                       ds.steps ? 1e3 * ds.total_comm_s / (double)ds.steps : 0,
                       ds.total_comm_s > 0 ? 100 * fmax(0, 1 - ds.total_exposed_s / ds.total_comm_s) : 0);
            }
            if (t->pg) printf("memory per rank, max over ranks: peak RSS %.1f MB, peak address space (VmPeak) %.1f MB\n", mem[0], mem[1]);
        }
    }
    return CT_OK;
}
