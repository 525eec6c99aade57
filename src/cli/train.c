/* ctrain train mlp|cnn|gpt — the main job. Alone it trains in one process; under
 * `ctrain run` (WORLD_SIZE > 1) every rank trains its share of each global batch with DDP.
 * The loop is the tutorial's §3.2 program: sampler → loader → forward → backward (buckets
 * all-reduce during it) → optimizer → periodic evaluation and atomic checkpoints. */
#include <glob.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/train_opts.h"
#include "ctrain/checkpoint.h"
#include "ctrain/ctrain.h"
#include "ctrain/ddp.h"
#include "ctrain/dist.h"
#include "ctrain/loader.h"
#include "ctrain/metrics.h"
#include "ctrain/models.h"
#include "ctrain/optim.h"

typedef struct {
    train_opts o;
    int rank, world;
    ct_pg *pg;
    ct_model *model;
    ct_optim *opt;
    ct_ddp *ddp;
    ct_dataset *train, *test;
    int64_t train_n;          /* samples the sampler draws from (gpt: the first 95% of windows) */
    ct_sampler *sampler;
    ct_loader *loader;
    ct_metrics *metrics;
    ct_ctx *ctx;
    ct_lr_schedule sched;
    int64_t steps_per_epoch, total_steps;
} run;

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

/* Average a few doubles over ranks (logging and evaluation only). */
static ct_status allreduce_d(run *r, double *v, int n, ct_reduce_op op) {
    if (!r->pg) return CT_OK;
    return ct_all_reduce_sync(r->pg, v, (size_t)n, CT_F64, op);
}

static ct_tensor *input_tensor(run *r, const ct_dataset *d, void *x, int64_t n) {
    int64_t dims[6] = {n};
    int nd = ct_dataset_x_shape(d, dims + 1);
    return ct_wrap(r->ctx, ct_dataset_x_dtype(d), x, nd + 1, dims);
}
static ct_tensor *target_tensor(run *r, const ct_dataset *d, int32_t *y, int64_t n) {
    int64_t yn = ct_dataset_y_numel(d);
    if (yn == 1) return ct_wrap(r->ctx, CT_I32, y, 1, (int64_t[]){n});
    return ct_wrap(r->ctx, CT_I32, y, 2, (int64_t[]){n, yn});
}

/* Test loss and accuracy; each rank takes every world-th sample (no padding, so every
 * sample counts once) and the sums are all-reduced. */
static ct_status evaluate(run *r, double *loss, double *acc) {
    const ct_dataset *d = r->test ? r->test : r->train;
    int64_t first = r->test ? 0 : r->train_n, last = ct_dataset_len(d);
    if (r->o.eval_max > 0 && last - first > r->o.eval_max) last = first + r->o.eval_max;
    int B = r->o.batch_size;
    int64_t xn = ct_dataset_x_numel(d), yn = ct_dataset_y_numel(d);
    size_t xs = ct_dtype_size(ct_dataset_x_dtype(d));
    void *x = malloc(xs * (size_t)(B * xn));
    int32_t *y = malloc(sizeof(int32_t) * (size_t)(B * yn));
    if (!x || !y) { free(x); free(y); return ct_error(CT_ERR_NOMEM, "out of memory for evaluation"); }
    double sums[3] = {0, 0, 0}; /* loss * count, correct, count */
    bool was = ct_set_grad_enabled(r->ctx, false);
    ct_ctx_set_training(r->ctx, false);
    int64_t i = first + r->rank;
    while (i < last) {
        int64_t n = 0;
        for (; n < B && i < last; n++, i += r->world) ct_dataset_get(d, i, (char *)x + (size_t)(n * xn) * xs, y + n * yn);
        ct_tensor *logits = ct_model_forward(r->ctx, r->model, input_tensor(r, d, x, n));
        int64_t V = logits->shape[logits->ndim - 1], rows = ct_numel(logits) / V;
        ct_tensor *l2 = ct_reshape(r->ctx, logits, 2, (int64_t[]){rows, V});
        ct_tensor *t = ct_wrap(r->ctx, CT_I32, y, 1, (int64_t[]){rows});
        sums[0] += ct_item(ct_cross_entropy(r->ctx, l2, t, -100)) * (double)rows;
        const float *L = l2->data;
        for (int64_t k = 0; k < rows; k++) {
            int64_t best = 0;
            for (int64_t c = 1; c < V; c++)
                if (L[k * V + c] > L[k * V + best]) best = c;
            sums[1] += best == y[k];
        }
        sums[2] += (double)rows;
        ct_ctx_reset(r->ctx);
    }
    ct_set_grad_enabled(r->ctx, was);
    ct_ctx_set_training(r->ctx, true);
    free(x);
    free(y);
    ct_status st = allreduce_d(r, sums, 3, CT_RED_SUM);
    *loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    *acc = sums[2] > 0 ? sums[1] / sums[2] : NAN;
    return st;
}

static ct_status open_data(run *r) {
    const train_opts *o = &r->o;
    ct_status st;
    if (o->kind == CT_MODEL_GPT) {
        int T = o->block_size;
        if (o->text) {
            st = ct_dataset_text_open(o->text, T, &r->train);
        } else {
            glob_t g;
            if (glob(o->shards, 0, NULL, &g) != 0 || g.gl_pathc == 0)
                return ct_error(CT_ERR_NOT_FOUND, "--shards %s matches no file", o->shards);
            st = ct_dataset_tokens_open((const char *const *)g.gl_pathv, (int)g.gl_pathc, T, &r->train);
            globfree(&g);
        }
        if (st != CT_OK) return st;
        int64_t n = ct_dataset_len(r->train);
        r->train_n = n >= 20 ? n - n / 20 : n; /* last 5% of windows held out for evaluation */
        if (ct_dataset_num_classes(r->train) > o->vocab_size)
            return ct_error(CT_ERR_INVALID, "the data has token ids up to %d but --vocab-size is %d",
                            ct_dataset_num_classes(r->train) - 1, o->vocab_size);
        return CT_OK;
    }
    char ip[4096], lp[4096];
    snprintf(ip, sizeof ip, "%s/train-images-idx3-ubyte.gz", o->data_dir);
    snprintf(lp, sizeof lp, "%s/train-labels-idx1-ubyte.gz", o->data_dir);
    if (access(ip, R_OK) != 0) { /* also accept uncompressed files */
        snprintf(ip, sizeof ip, "%s/train-images-idx3-ubyte", o->data_dir);
        snprintf(lp, sizeof lp, "%s/train-labels-idx1-ubyte", o->data_dir);
    }
    if (access(ip, R_OK) != 0)
        return ct_error(CT_ERR_NOT_FOUND, "no train-images-idx3-ubyte(.gz) in --data-dir %s (Fashion-MNIST: apt-get install dataset-fashion-mnist)", o->data_dir);
    st = ct_dataset_idx_open(ip, lp, &r->train);
    if (st != CT_OK) return st;
    r->train_n = ct_dataset_len(r->train);
    char tip[4096], tlp[4096];
    const char *gz = strstr(ip, ".gz") ? ".gz" : "";
    snprintf(tip, sizeof tip, "%s/t10k-images-idx3-ubyte%s", o->data_dir, gz);
    snprintf(tlp, sizeof tlp, "%s/t10k-labels-idx1-ubyte%s", o->data_dir, gz);
    if (access(tip, R_OK) == 0) return ct_dataset_idx_open(tip, tlp, &r->test);
    CT_LOG_WARN_("train", "no test set in %s: evaluating on training data", o->data_dir);
    return CT_OK;
}

static ct_status build(run *r) {
    const train_opts *o = &r->o;
    ct_model_config cfg = ct_model_default_config(o->kind);
    if (o->kind == CT_MODEL_GPT) {
        cfg.gpt.n_layer = o->n_layer;
        cfg.gpt.n_embd = o->n_embd;
        cfg.gpt.n_head = o->n_head;
        cfg.gpt.block_size = o->block_size;
        cfg.gpt.vocab_size = o->vocab_size;
        cfg.gpt.dropout = o->dropout;
    } else if (o->kind == CT_MODEL_MLP) {
        cfg.mlp.dropout = o->dropout;
        if (o->n_hidden >= 0) {
            cfg.mlp.n_hidden = o->n_hidden;
            for (int i = 0; i < o->n_hidden; i++) cfg.mlp.hidden[i] = o->hidden[i];
        }
    } else {
        cfg.cnn.dropout = o->dropout;
    }
    ct_model_create(&cfg, o->seed, &r->model);
    if (!r->model) return CT_ERR_INVALID;
    ct_params *P = ct_model_params(r->model);
    if (o->adamw) {
        ct_adamw_opts ao = ct_adamw_default_opts();
        ao.weight_decay = o->weight_decay >= 0 ? o->weight_decay : 0.1;
        ao.beta2 = o->kind == CT_MODEL_GPT ? 0.95 : 0.999;
        ao.decay_only_ndim_ge2 = true;
        ct_optim_create_adamw(P, &ao, &r->opt);
    } else {
        ct_sgd_opts so = ct_sgd_default_opts();
        so.momentum = o->momentum;
        so.weight_decay = o->weight_decay >= 0 ? o->weight_decay : 0;
        so.nesterov = o->nesterov;
        ct_optim_create_sgd(P, &so, &r->opt);
    }
    if (!r->opt) return CT_ERR_INVALID;
    if (r->pg) {
        ct_ddp_opts dd = ct_ddp_default_opts();
        dd.comm_dtype = o->comm_dtype;
        ct_status st = ct_ddp_create(r->pg, P, &dd, &r->ddp);
        if (st != CT_OK) return st;
    }
    ct_sampler_opts so = ct_sampler_default_opts();
    so.n = r->train_n;
    so.num_replicas = r->world;
    so.rank = r->rank;
    so.seed = o->seed;
    so.shuffle = true;
    ct_status st = ct_sampler_create(&so, &r->sampler);
    if (st != CT_OK) return st;
    ct_loader_opts lo = ct_loader_default_opts();
    lo.batch_size = o->batch_size;
    lo.workers = o->workers;
    lo.drop_last = true; /* equal batch sizes on every rank keep the DDP average exact */
    st = ct_loader_create(r->train, r->sampler, &lo, &r->loader);
    if (st != CT_OK) return st;
    r->steps_per_epoch = ct_loader_len(r->loader);
    if (r->steps_per_epoch == 0)
        return ct_error(CT_ERR_INVALID, "--batch-size %d is larger than this rank's %lld samples per epoch", o->batch_size,
                        (long long)ct_sampler_len(r->sampler));
    r->total_steps = o->steps > 0 ? o->steps : r->steps_per_epoch * o->epochs;
    double lr = o->lr;
    int64_t warm = o->warmup;
    switch (o->schedule) {
    case 1: r->sched = ct_lr_cosine(lr, lr * 0.1, warm, r->total_steps); break;
    case 2: r->sched = ct_lr_linear(lr, 0, warm, r->total_steps); break;
    default: r->sched = ct_lr_constant(lr, warm);
    }
    ct_ctx_opts co = ct_ctx_default_opts();
    co.seed = o->seed;
    ct_ctx_create(&co, &r->ctx);
    if (!r->ctx) return ct_error(CT_ERR_NOMEM, "out of memory");
    if (r->rank == 0) {
        st = ct_metrics_open(o->output_dir, &r->metrics);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

static void teardown(run *r) {
    ct_metrics_close(r->metrics);
    ct_loader_free(r->loader);
    ct_sampler_free(r->sampler);
    ct_ddp_free(r->ddp);
    ct_optim_free(r->opt);
    ct_model_free(r->model);
    ct_dataset_free(r->train);
    ct_dataset_free(r->test);
    ct_ctx_free(r->ctx);
    if (r->pg) ct_pg_free(r->pg);
}

static ct_status save_ckpt(run *r, int64_t step, int64_t epoch) {
    if (r->rank != 0) return CT_OK;
    char root[4200];
    snprintf(root, sizeof root, "%s/checkpoints", r->o.output_dir);
    ct_train_state ts = {.step = step, .epoch = epoch, .sampler = ct_loader_state(r->loader), .seed = r->o.seed, .world_size = r->world};
    ct_status st = ct_checkpoint_save(root, r->model, r->opt, &ts, r->o.keep);
    if (st != CT_OK) fprintf(stderr, "ctrain train: warning: checkpoint at step %" PRId64 " not written: %s\n", step, ct_last_error());
    return st;
}

static ct_status train_loop(run *r) {
    const train_opts *o = &r->o;
    int64_t step = 0, epoch = 0;
    if (o->resume) {
        char dir[4200], root[4200];
        snprintf(root, sizeof root, "%s/checkpoints", o->output_dir);
        ct_status st = CT_OK;
        if (!strcmp(o->resume, "auto")) {
            st = ct_checkpoint_find_latest(root, dir, sizeof dir);
            if (st == CT_ERR_NOT_FOUND) { st = CT_OK; dir[0] = 0; } /* nothing to resume: start fresh */
        } else {
            snprintf(dir, sizeof dir, "%s", o->resume);
        }
        if (st != CT_OK) return st;
        if (dir[0]) {
            ct_train_state ts;
            st = ct_checkpoint_load(dir, r->model, r->opt, &ts);
            if (st != CT_OK) return st;
            step = ts.step;
            epoch = ts.sampler.epoch;
            st = ct_sampler_set_state(r->sampler, &ts.sampler);
            if (st != CT_OK) return st;
            if (r->rank == 0) printf("resumed from %s at step %" PRId64 " (epoch %" PRId64 ", sample %" PRId64 ")\n", dir, step, epoch, ts.sampler.position);
        }
    }
    bool tty = isatty(1);
    int64_t global_batch = (int64_t)o->batch_size * r->world;
    int64_t T = o->kind == CT_MODEL_GPT ? o->block_size : 1;
    if (r->rank == 0) {
        printf("%s | %d rank%s × batch %d = global batch %" PRId64 " | %" PRId64 " steps/epoch, %" PRId64 " steps | %s lr %g | %d threads/rank\n",
               ct_model_describe(r->model), r->world, r->world > 1 ? "s" : "", o->batch_size, global_batch, r->steps_per_epoch,
               r->total_steps, o->adamw ? "adamw" : "sgd", o->lr, ct_get_num_threads());
        fflush(stdout);
    }
    double t_start = ct_time_now(), t_log = t_start, loss_acc = 0;
    int64_t steps_since_log = 0, step0 = step;
    ct_status st = CT_OK;
    double last_acc = NAN, last_eval_loss = NAN;
    while (step < r->total_steps && st == CT_OK) {
        ct_loader_start_epoch(r->loader, epoch);
        ct_batch b;
        while (step < r->total_steps) {
            st = ct_loader_next(r->loader, &b);
            if (st != CT_OK || b.n == 0) break;
            ct_ctx_set_step(r->ctx, (uint64_t)step);
            ct_tensor *loss = ct_model_loss(r->ctx, r->model, input_tensor(r, r->train, b.x, b.n), target_tensor(r, r->train, b.y, b.n));
            double lv = ct_item(loss);
            ct_backward(r->ctx, loss);
            double lr = ct_lr_at(&r->sched, step);
            if (r->ddp && o->clip <= 0) {
                /* nothing here needs the averaged gradients: DDP may fuse averaging into the step */
                if ((st = ct_ddp_step(r->ddp, r->opt, lr)) != CT_OK) break;
            } else {
                if (r->ddp && (st = ct_ddp_finish(r->ddp)) != CT_OK) break;
                if (o->clip > 0) ct_clip_grad_norm(ct_model_params(r->model), (float)o->clip);
                ct_optim_step(r->opt, lr);
            }
            ct_params_zero_grad(ct_model_params(r->model));
            ct_ctx_reset(r->ctx);
            step++;
            loss_acc += lv;
            steps_since_log++;
            if (!isfinite(lv)) {
                st = ct_error(CT_ERR_INVALID, "loss became %g at step %" PRId64 " (lower --lr?)", lv, step);
                break;
            }
            bool last = step == r->total_steps;
            if (step % o->log_every == 0 || last) {
                double v[1] = {loss_acc / (double)steps_since_log};
                if ((st = allreduce_d(r, v, 1, CT_RED_AVG)) != CT_OK) break;
                double now = ct_time_now(), sps = (double)(steps_since_log * global_batch * T) / (now - t_log);
                double eta = (double)(r->total_steps - step) * (now - t_start) / (double)(step - step0);
                char etas[32];
                fmt_eta(eta, etas, sizeof etas);
                if (r->rank == 0) {
                    printf("%sstep %6" PRId64 "/%" PRId64 " | epoch %" PRId64 " | loss %.4f | lr %.3g | %.0f %s/s | ETA %s | peak %.0f MB (activations %.0f MB)%s",
                           tty ? "\r" : "", step, r->total_steps, epoch + 1, v[0], lr, sps, T > 1 ? "tokens" : "samples", etas,
                           peak_rss_mb(), (double)ct_ctx_peak_bytes(r->ctx) / 1048576.0, tty ? "\033[K" : "\n");
                    fflush(stdout);
                    ct_metrics_scalar(r->metrics, "train/loss", step, v[0]);
                    ct_metrics_scalar(r->metrics, "train/lr", step, lr);
                    ct_metrics_scalar(r->metrics, T > 1 ? "train/tokens_per_s" : "train/samples_per_s", step, sps);
                    ct_metrics_scalar(r->metrics, "train/peak_rss_mb", step, peak_rss_mb());
                    ct_metrics_scalar(r->metrics, "train/activations_peak_mb", step, (double)ct_ctx_peak_bytes(r->ctx) / 1048576.0);
                }
                loss_acc = 0;
                steps_since_log = 0;
                t_log = ct_time_now();
            }
            if ((o->eval_every > 0 && step % o->eval_every == 0) || last) {
                if ((st = evaluate(r, &last_eval_loss, &last_acc)) != CT_OK) break;
                if (r->rank == 0) {
                    printf("%seval  step %" PRId64 ": test loss %.4f, accuracy %.4f\n", tty ? "\n" : "", step, last_eval_loss, last_acc);
                    ct_metrics_scalar(r->metrics, "eval/loss", step, last_eval_loss);
                    ct_metrics_scalar(r->metrics, "eval/accuracy", step, last_acc);
                    ct_metrics_flush(r->metrics);
                }
            }
            if (o->save_every > 0 && step % o->save_every == 0 && !last) save_ckpt(r, step, epoch);
        }
        if (st != CT_OK) break;
        if (step < r->total_steps) {
            /* end of an epoch: mlp/cnn evaluate unless --eval-every picks its own steps (gpt
             * epochs over a small text can be a handful of steps: it evaluates at the end) */
            if (o->eval_every == 0 && o->kind != CT_MODEL_GPT) {
                if ((st = evaluate(r, &last_eval_loss, &last_acc)) != CT_OK) break;
                if (r->rank == 0) {
                    printf("%seval  epoch %" PRId64 " (step %" PRId64 "): test loss %.4f, accuracy %.4f\n", tty ? "\n" : "",
                           epoch + 1, step, last_eval_loss, last_acc);
                    ct_metrics_scalar(r->metrics, "eval/loss", step, last_eval_loss);
                    ct_metrics_scalar(r->metrics, "eval/accuracy", step, last_acc);
                    ct_metrics_flush(r->metrics);
                }
            }
            epoch++;
        }
    }
    if (st != CT_OK) return st;
    save_ckpt(r, step, epoch);
    if (r->rank == 0) {
        char p[4200];
        snprintf(p, sizeof p, "%s/model.safetensors", o->output_dir);
        if (ct_model_save(r->model, p) != CT_OK) fprintf(stderr, "ctrain train: warning: %s\n", ct_last_error());
        snprintf(p, sizeof p, "%s/training.svg", o->output_dir);
        if (ct_metrics_write_svg(r->metrics, p, ct_model_describe(r->model)) != CT_OK) fprintf(stderr, "ctrain train: warning: %s\n", ct_last_error());
        double wall = ct_time_now() - t_start;
        printf("done: %" PRId64 " steps in %.1f s | test accuracy %.4f | test loss %.4f | weights %s/model.safetensors\n",
               step - step0, wall, last_acc, last_eval_loss, o->output_dir);
        if (r->ddp) {
            ct_ddp_stats ds = ct_ddp_get_stats(r->ddp);
            printf("ddp: %d buckets | per step: compute %.1f ms, all-reduce %.1f ms, %.0f%% of it hidden behind backward\n",
                   ds.buckets, ds.steps > 1 ? 1e3 * ds.total_compute_s / (double)(ds.steps - 1) : 0,
                   ds.steps ? 1e3 * ds.total_comm_s / (double)ds.steps : 0,
                   ds.total_comm_s > 0 ? 100 * fmax(0, 1 - ds.total_exposed_s / ds.total_comm_s) : 0);
        }
    }
    return CT_OK;
}

int cli_train(int argc, char **argv) {
    run r = {0};
    int rc = train_opts_parse(argc, argv, &r.o);
    if (rc >= 0) return rc;
    ct_set_num_threads(r.o.threads > 0 ? r.o.threads : ct_default_num_threads());
    const char *ws = getenv("WORLD_SIZE");
    ct_status st = CT_OK;
    r.world = 1;
    if (ws && atoi(ws) > 1) {
        st = ct_dist_init(NULL, &r.pg);
        if (st == CT_OK) { r.rank = ct_pg_rank(r.pg); r.world = ct_pg_size(r.pg); }
    }
    if (st == CT_OK) st = open_data(&r);
    if (st == CT_OK) st = build(&r);
    if (st == CT_OK) st = train_loop(&r);
    if (st != CT_OK) fprintf(stderr, "ctrain train: error%s: %s\n", r.world > 1 ? " on this rank" : "", ct_last_error());
    teardown(&r);
    return st == CT_OK ? 0 : 1;
}
