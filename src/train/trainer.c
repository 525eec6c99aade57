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
#include "train/output_lock.h"

struct ct_trainer {
    ct_trainer_opts o;
    const ct_train_model *model;
    ct_optim *opt;
    const ct_dataset *train, *eval;
    int rank, world;
    ct_pg *pg;                 /* NULL alone */
    ct_ddp *ddp;
    ct_sampler *sampler;
    ct_loader *loader;
    ct_metrics *metrics;
    ct_ctx *ctx;
    ct_lr_schedule sched;
    int64_t steps_per_epoch, total_steps, step, epoch;
    /* gradient accumulation: the micro-batches of one step, copied out of the loader's ring */
    void *xbuf;
    int32_t *ybuf;
    ct_train_batch *micro;     /* grad_accum entries (grad_accum > 1) */
    ct_train_batch one;        /* grad_accum == 1: a view of the loader's batch */
    int lock_fd;               /* rank 0: output_dir/.lock, -1 elsewhere */
};

ct_trainer_opts ct_trainer_default_opts(void) {
    return (ct_trainer_opts){.ddp = ct_ddp_default_opts(), .epochs = 1, .batch_size = 64, .grad_accum = 1, .lr = 0.05,
                             .schedule = CT_LR_COSINE, .min_lr = -1, .seed = 1337, .workers = 1, .eval_each_epoch = true,
                             .keep = 3, .log_every = 50, .output_dir = "output", .metrics = true};
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
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
    if (o.batch_size < 1 || o.grad_accum < 1 || o.epochs < 1 || o.max_steps < 0 || o.log_every < 0 || o.keep < 0 ||
        o.eval_every < 0 || o.save_every < 0 || o.eval_max < 0 || o.workers < 0 || !(o.lr > 0) || !o.output_dir)
        return ct_error(CT_ERR_INVALID, "ct_trainer_create: batch_size %d, grad_accum %d, epochs %" PRId64 " must be >= 1, lr %g > 0, "
                        "the other counts >= 0 and output_dir set", o.batch_size, o.grad_accum, o.epochs, o.lr);
    ct_trainer *t = calloc(1, sizeof *t);
    if (!t) return ct_error(CT_ERR_NOMEM, "out of memory");
    t->o = o;
    t->model = model;
    t->opt = opt;
    t->train = train_data;
    t->eval = eval_data;
    t->world = 1;
    t->lock_fd = -1;
    if (o.pg && ct_pg_size(o.pg) > 1) {
        t->pg = o.pg;
        t->rank = ct_pg_rank(o.pg);
        t->world = ct_pg_size(o.pg);
    }
    ct_status st = CT_OK;
    /* before any collective: a refused rank 0 exits at once and the launcher stops the rest */
    if (t->rank == 0) st = ct_output_lock(o.output_dir, &t->lock_fd);
    if (st == CT_OK && t->pg) st = ct_ddp_create(t->pg, model->params, &o.ddp, &t->ddp);
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
    if (st == CT_OK && o.grad_accum > 1) {
        size_t xs = ct_dtype_size(ct_dataset_x_dtype(train_data)) * (size_t)ct_dataset_x_numel(train_data);
        size_t ys = sizeof(int32_t) * (size_t)ct_dataset_y_numel(train_data), n = (size_t)o.batch_size * (size_t)o.grad_accum;
        t->xbuf = malloc(xs * n);
        t->ybuf = malloc(ys * n);
        t->micro = malloc(sizeof *t->micro * (size_t)o.grad_accum);
        if (!t->xbuf || !t->ybuf || !t->micro) st = ct_error(CT_ERR_NOMEM, "out of memory for %d micro-batches", o.grad_accum);
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
    ct_ddp_free(t->ddp);
    ct_ctx_free(t->ctx);
    free(t->xbuf);
    free(t->ybuf);
    free(t->micro);
    ct_output_unlock(t->lock_fd);
    free(t);
}

int64_t ct_trainer_step(const ct_trainer *t) { return t->step; }
int64_t ct_trainer_total_steps(const ct_trainer *t) { return t->total_steps; }
int64_t ct_trainer_steps_per_epoch(const ct_trainer *t) { return t->steps_per_epoch; }
ct_ddp *ct_trainer_ddp(ct_trainer *t) { return t->ddp; }
ct_ctx *ct_trainer_ctx(ct_trainer *t) { return t->ctx; }

/* Loss and accuracy; each rank takes every world-th sample (no padding, so every sample
 * counts once) and the sums are all-reduced. */
ct_status ct_trainer_evaluate(ct_trainer *t, ct_eval_report *r) {
    const ct_dataset *d = t->eval ? t->eval : t->train;
    int64_t last = ct_dataset_len(d);
    if (t->o.eval_max > 0 && last > t->o.eval_max) last = t->o.eval_max;
    int B = t->o.batch_size;
    int64_t xn = ct_dataset_x_numel(d), yn = ct_dataset_y_numel(d);
    size_t xs = ct_dtype_size(ct_dataset_x_dtype(d));
    void *x = malloc(xs * (size_t)(B * xn));
    int32_t *y = malloc(sizeof(int32_t) * (size_t)(B * yn));
    if (!x || !y) { free(x); free(y); return ct_error(CT_ERR_NOMEM, "out of memory for evaluation"); }
    double sums[3] = {0, 0, 0}; /* loss * count, correct, count */
    ct_ctx *ctx = t->ctx;
    bool was = ct_set_grad_enabled(ctx, false);
    ct_ctx_set_training(ctx, false);
    int64_t i = t->rank;
    while (i < last) {
        int64_t n = 0;
        for (; n < B && i < last; n++, i += t->world) ct_dataset_get(d, i, (char *)x + (size_t)(n * xn) * xs, y + n * yn);
        ct_train_batch b = batch_of(d, x, y, n);
        ct_tensor *logits = t->model->forward(ctx, t->model->self, ct_wrap(ctx, b.x.dtype, x, b.x.ndim, b.x.shape));
        int64_t V = logits->shape[logits->ndim - 1], rows = ct_numel(logits) / V;
        ct_tensor *l2 = ct_reshape(ctx, logits, 2, (int64_t[]){rows, V});
        ct_tensor *tg = ct_wrap(ctx, CT_I32, y, 1, (int64_t[]){rows});
        sums[0] += ct_item(ct_cross_entropy(ctx, l2, tg, -100)) * (double)rows;
        const float *L = l2->data;
        for (int64_t k = 0; k < rows; k++) {
            int64_t best = 0;
            for (int64_t c = 1; c < V; c++)
                if (L[k * V + c] > L[k * V + best]) best = c;
            sums[1] += best == y[k];
        }
        sums[2] += (double)rows;
        ct_ctx_reset(ctx);
    }
    ct_set_grad_enabled(ctx, was);
    ct_ctx_set_training(ctx, true);
    free(x);
    free(y);
    ct_status st = allreduce_d(t, sums, 3, CT_RED_SUM);
    r->step = t->step;
    r->epoch = t->epoch;
    r->loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    r->accuracy = sums[2] > 0 ? sums[1] / sums[2] : NAN;
    return st;
}

static ct_status save_ckpt(ct_trainer *t) {
    if (t->rank != 0) return CT_OK;
    char root[4200];
    snprintf(root, sizeof root, "%s/checkpoints", t->o.output_dir);
    ct_train_state ts = {.step = t->step, .epoch = t->epoch, .sampler = ct_loader_state(t->loader), .seed = t->o.seed,
                         .world_size = t->world};
    ct_status st = ct_checkpoint_save(root, t->model, t->opt, &ts, t->o.keep);
    if (st != CT_OK) CT_LOG_WARN_("train", "checkpoint at step %" PRId64 " not written: %s", t->step, ct_last_error());
    return st;
}

static ct_status resume(ct_trainer *t) {
    char dir[4200], root[4200];
    snprintf(root, sizeof root, "%s/checkpoints", t->o.output_dir);
    ct_status st = CT_OK;
    if (!strcmp(t->o.resume, "auto")) {
        st = ct_checkpoint_find_latest(root, dir, sizeof dir);
        if (st == CT_ERR_NOT_FOUND) return CT_OK; /* nothing to resume: start fresh */
        if (st != CT_OK) return st;
    } else {
        snprintf(dir, sizeof dir, "%s", t->o.resume);
    }
    ct_train_state ts;
    if ((st = ct_checkpoint_load(dir, t->model, t->opt, &ts)) != CT_OK) return st;
    if ((st = ct_sampler_set_state(t->sampler, &ts.sampler)) != CT_OK) return st;
    t->step = ts.step;
    t->epoch = ts.sampler.epoch;
    if (t->rank == 0 && t->o.log_every > 0)
        printf("resumed from %s at step %" PRId64 " (epoch %" PRId64 ", sample %" PRId64 ")\n", dir, t->step, t->epoch, ts.sampler.position);
    return CT_OK;
}

/* The micro-batches of the next step, or 0 at the end of the epoch (a partial group of
 * micro-batches is dropped, as the loader drops a partial batch). With one micro-batch the
 * loader's own buffers are used; with several they are copied out of its ring. */
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
        if (K == 1) {
            t->one = batch_of(t->train, b.x, b.y, b.n);
        } else {
            char *x = (char *)t->xbuf + xs * (size_t)(k * t->o.batch_size);
            int32_t *y = (int32_t *)((char *)t->ybuf + ys * (size_t)(k * t->o.batch_size));
            memcpy(x, b.x, xs * (size_t)b.n);
            memcpy(y, b.y, ys * (size_t)b.n);
            t->micro[k] = batch_of(t->train, x, y, b.n);
        }
    }
    *micro = K == 1 ? &t->one : t->micro;
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

ct_status ct_trainer_fit(ct_trainer *t) {
    const ct_trainer_opts *o = &t->o;
    ct_status st = o->resume ? resume(t) : CT_OK;
    if (st != CT_OK) return st;
    bool tty = isatty(1), talk = t->rank == 0 && o->log_every > 0;
    int64_t global_batch = (int64_t)o->batch_size * t->world * o->grad_accum;
    int64_t T = ct_dataset_y_numel(t->train); /* items per sample: tokens for a language model */
    if (talk) {
        char acc[48] = "";
        if (o->grad_accum > 1) snprintf(acc, sizeof acc, " × %d micro-batches", o->grad_accum);
        printf("%s | %d rank%s × batch %d%s = global batch %" PRId64 " | %" PRId64 " steps/epoch, %" PRId64 " steps | %s lr %g | %d threads/rank\n",
               t->model->describe ? t->model->describe : "model", t->world, t->world > 1 ? "s" : "", o->batch_size, acc,
               global_batch, t->steps_per_epoch, t->total_steps, ct_optim_kind(t->opt), o->lr, ct_get_num_threads());
        fflush(stdout);
    }
    double t_start = ct_time_now(), t_log = t_start, loss_acc = 0;
    int64_t steps_since_log = 0, step0 = t->step;
    ct_eval_report ev = {.loss = NAN, .accuracy = NAN};
    bool stop = false;
    ct_step_args sa = {.ctx = t->ctx, .model = t->model, .opt = t->opt, .ddp = t->ddp, .clip_norm = o->clip_norm};
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
            loss_acc += res.loss;
            steps_since_log++;
            if (!isfinite(res.loss)) {
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
                double act = (double)ct_ctx_peak_bytes(t->ctx) / 1048576.0;
                if (talk) {
                    printf("%sstep %6" PRId64 "/%" PRId64 " | epoch %" PRId64 " | loss %.4f | lr %.3g | %.0f %s/s | ETA %s | peak %.0f MB (activations %.0f MB)%s",
                           tty ? "\r" : "", t->step, t->total_steps, t->epoch + 1, v[0], sa.lr, sps, T > 1 ? "tokens" : "samples", etas,
                           peak_rss_mb(), act, tty ? "\033[K" : "\n");
                    fflush(stdout);
                }
                if (t->metrics) {
                    ct_metrics_scalar(t->metrics, "train/loss", t->step, v[0]);
                    ct_metrics_scalar(t->metrics, "train/lr", t->step, sa.lr);
                    ct_metrics_scalar(t->metrics, T > 1 ? "train/tokens_per_s" : "train/samples_per_s", t->step, sps);
                    ct_metrics_scalar(t->metrics, "train/peak_rss_mb", t->step, peak_rss_mb());
                    ct_metrics_scalar(t->metrics, "train/activations_peak_mb", t->step, act);
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
            if ((o->eval_every > 0 && t->step % o->eval_every == 0) || last) {
                if ((st = ct_trainer_evaluate(t, &ev)) != CT_OK) break;
                print_eval(t, &ev, tty, false);
                if (o->on_eval && !o->on_eval(t, &ev, o->user)) stop = true;
            }
            if (o->save_every > 0 && t->step % o->save_every == 0 && !last) save_ckpt(t);
        }
        if (st != CT_OK || stop) break;
        if (t->step < t->total_steps) {
            /* end of an epoch: evaluate unless --eval-every picks its own steps */
            if (o->eval_every == 0 && o->eval_each_epoch) {
                if ((st = ct_trainer_evaluate(t, &ev)) != CT_OK) break;
                print_eval(t, &ev, tty, true);
                if (o->on_eval && !o->on_eval(t, &ev, o->user)) stop = true;
            }
            t->epoch++;
        }
    }
    if (st != CT_OK) return st;
    save_ckpt(t);
    if (t->rank == 0) {
        char p[4200];
        snprintf(p, sizeof p, "%s/model.safetensors", o->output_dir);
        ct_status s2 = t->model->save ? t->model->save(t->model->self, p) : ct_params_save(t->model->params, p);
        if (s2 != CT_OK) CT_LOG_WARN_("train", "%s", ct_last_error());
        snprintf(p, sizeof p, "%s/training.svg", o->output_dir);
        if (t->metrics && ct_metrics_write_svg(t->metrics, p, t->model->describe) != CT_OK)
            CT_LOG_WARN_("train", "%s", ct_last_error());
        if (o->log_every > 0) {
            printf("done: %" PRId64 " steps in %.1f s | test accuracy %.4f | test loss %.4f | weights %s/model.safetensors\n",
                   t->step - step0, ct_time_now() - t_start, ev.accuracy, ev.loss, o->output_dir);
            if (t->ddp) {
                ct_ddp_stats ds = ct_ddp_get_stats(t->ddp);
                printf("ddp: %d buckets | per step: compute %.1f ms, all-reduce %.1f ms, %.0f%% of it hidden behind backward\n",
                       ds.buckets, ds.steps > 1 ? 1e3 * ds.total_compute_s / (double)(ds.steps - 1) : 0,
                       ds.steps ? 1e3 * ds.total_comm_s / (double)ds.steps : 0,
                       ds.total_comm_s > 0 ? 100 * fmax(0, 1 - ds.total_exposed_s / ds.total_comm_s) : 0);
            }
        }
    }
    return CT_OK;
}
