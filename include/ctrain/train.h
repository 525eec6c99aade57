/* ctrain/train.h — the trainer: what `ctrain train` does, for any model.
 *
 *   ct_pg *pg = NULL;                                      // under `ctrain run`: ct_dist_init(NULL, &pg)
 *   ct_train_model tm = ct_train_model_module(net, P, "resmlp");   // or ct_train_model_builtin(model)
 *   ct_trainer_opts o = ct_trainer_default_opts();
 *   o.pg = pg;                                             // world > 1: DDP over it
 *   o.epochs = 2; o.batch_size = 64; o.lr = 0.05;
 *   o.save_every = 200; o.resume = "auto";                 // checkpoints under output/checkpoints
 *   ct_trainer *t;
 *   if (ct_trainer_create(&o, &tm, opt, train_set, test_set, &t) != CT_OK ||
 *       ct_trainer_fit(t) != CT_OK)
 *       fprintf(stderr, "%s\n", ct_last_error());
 *   ct_trainer_free(t);
 *
 * One optimizer step is ct_train_step: forward and backward of each micro-batch (DDP's
 * buckets all-reduce during the last backward), clipping, the optimizer, zeroing the
 * gradients. The trainer calls it in its loop of sampler → loader → step, with periodic
 * evaluation, atomic checkpoints (resumed bit for bit), metrics (JSONL, TensorBoard, SVG)
 * and a progress line; a loop of your own can call it too.
 *
 * Checkpoints: a directory `step-00001234/` holding model.safetensors (PyTorch state_dict
 * names), train_state.safetensors (optimizer state as "optim.<state>.<param>" tensors, step,
 * epoch, sampler position, seeds) and manifest.json (size and CRC-32 of each file), written
 * under a temporary name, fsynced and renamed, so a crash or a full disk never leaves a
 * checkpoint that looks complete; the last `keep` are kept.
 */
#ifndef CTRAIN_TRAIN_H
#define CTRAIN_TRAIN_H

#include "ctrain/ddp.h"
#include "ctrain/dist.h"
#include "ctrain/fsdp.h"
#include "ctrain/io.h"
#include "ctrain/loader.h"
#include "ctrain/models.h"
#include "ctrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- the model ---- */

/* What a model takes, stated so that data it cannot take is refused when the trainer is
 * created (naming the file, the index and the value) instead of stopping an op at some
 * step hours in. Zero fields are not checked. */
typedef struct ct_train_expect {
    int64_t classes;       /* targets (y) in [0, classes), or ignore_index */
    int64_t ignore_index;  /* a target the loss skips (cross-entropy: -100; the GPT: -1) */
    int64_t vocab;         /* > 0: inputs are token ids (i32) in [0, vocab); else inputs are f32 */
    int64_t x_numel;       /* values in one sample's input (an MLP flattens it) */
    int x_ndim;            /* > 0: one sample's input has these dims (the batch dim excluded)... */
    int64_t x_shape[CT_MAX_DIMS]; /* ...of these sizes (0: any) */
    int64_t x_max_len;     /* > 0: the input's first dim is at most this (a GPT's block_size) */
} ct_train_expect;

/* What is trained: a parameter store and how to run it. */
typedef struct ct_train_model {
    ct_params *params;
    /* Outputs [..., classes] for inputs x (evaluation takes the argmax of the last dim). */
    ct_tensor *(*forward)(ct_ctx *ctx, void *self, ct_tensor *x);
    /* Scalar mean loss of a batch. NULL: cross-entropy of forward's outputs (rows of the last
     * dim) against the targets y (class indices; -100 ignored). */
    ct_tensor *(*loss)(ct_ctx *ctx, void *self, ct_tensor *x, ct_tensor *y);
    /* Write / read the weights as safetensors. NULL: ct_params_save / ct_params_load. */
    ct_status (*save)(void *self, const char *path);
    ct_status (*load)(void *self, const char *path);
    /* save, calling fetch before each tensor's bytes are written (ct_model_save_fetch). NULL:
     * under FSDP the whole model is gathered on every rank to write model.safetensors;
     * with it, one unit at a time (ct_fsdp_stream). */
    ct_status (*save_fetch)(void *self, const char *path, ct_st_fetch_fn fetch, void *user);
    /* The config as metadata (ct_model_write_config), written into a sharded checkpoint so
     * that it exports whole without the run's flags. NULL: none (such a checkpoint resumes,
     * but `ctrain export` cannot build its model). */
    ct_status (*save_config)(void *self, ct_st_writer *w);
    const char *kind;      /* written into checkpoints: resuming another kind is refused */
    const char *describe;  /* first word of the log's header line */
    void *self;
    ct_train_expect expect; /* the built-in models fill it; set expect.classes for a module */
} ct_train_model;

/* The built-in MLP, CNN and GPT (model's loss, save and load: GPT's tied lm_head), with
 * their expectations (classes or vocabulary, input shape) from their config. */
ct_train_model ct_train_model_builtin(ct_model *m);
/* Any module whose parameters live in P, trained with cross-entropy; expect is zero (the
 * trainer cannot know the classes: set m.expect.classes = C and ignore_index = -100). */
ct_train_model ct_train_model_module(ct_module *mod, ct_params *P, const char *kind);
/* Whether the model can take d, by m->expect: the sample shape and dtype, then one pass
 * over the stored labels or tokens (ct_dataset_check_values). CT_ERR_FORMAT naming the
 * file, the first bad index and its value, or the shapes; ct_trainer_create calls it on
 * the training and evaluation data, a loop of your own can too. */
ct_status ct_train_check_data(const ct_train_model *m, const ct_dataset *d);

/* ---------------------------------------------------------------- one step ---- */

/* One micro-batch: x [n, ...] (f32 or i32) and y [n] or [n, T] (i32). Descriptors only: the
 * data stays in the caller's memory; ct_train_step wraps them into its context. */
typedef struct ct_train_batch {
    ct_tensor x, y;
} ct_train_batch;
/* A batch from contiguous buffers (shapes are copied). */
ct_train_batch ct_train_batch_of(ct_dtype x_dtype, void *x, int x_ndim, const int64_t *x_shape, int32_t *y, int y_ndim,
                                 const int64_t *y_shape);

typedef struct ct_step_args {
    ct_ctx *ctx;
    const ct_train_model *model;
    ct_optim *opt;
    ct_ddp *ddp;         /* NULL: one process */
    double lr;
    double clip_norm;    /* > 0: clip the global gradient norm (after the DDP average) */
    int64_t step;        /* optimizer step index: dropout masks differ per step (ct_ctx_set_step) */
    ct_grad_scaler *scaler; /* NULL, or dynamic loss scaling (torch.amp.GradScaler): the loss is
                               multiplied by the scale, gradients unscaled before clipping, the
                               optimizer step skipped when any gradient is inf/NaN */
    ct_dtype amp;        /* CT_F32 (zero: off), CT_BF16 or CT_F16: forward and loss run in an
                            autocast region (ct_autocast_begin); backward and the step in f32 */
    struct ct_zero *zero;/* NULL, or the DDP's sharded optimizer step (ct_zero_create) */
    struct ct_fsdp *fsdp;/* NULL, or fully sharded data parallel (fsdp.h; instead of ddp): units
                            gathered in forward and backward, gradients reduce-scattered, the
                            optimizer steps the shards (opt is then not used) */
} ct_step_args;

typedef struct ct_step_result {
    double loss;         /* mean of the micro-batches' losses on this rank */
    double grad_norm;    /* global norm before clipping (clip_norm > 0), else NAN */
    bool skipped;        /* with a scaler: gradients overflowed, the optimizer step was skipped */
    float scale;         /* with a scaler: the loss scale after this step's update */
} ct_step_result;

/* One optimizer step over n_micro micro-batches (gradient accumulation: each loss is
 * scaled by 1/n_micro, so the update is that of one n_micro times larger batch within f32
 * rounding; DDP reduces only during the last backward, as `with ddp.no_sync()` on the
 * others). Ends with zeroed gradients and a reset context. Errors: DDP's (a peer died,
 * timed out, a parameter got no gradient); the step is then not applied. With a scaler under
 * DDP every rank skips alike: the overflow check reads the averaged gradients, which the
 * all-reduce leaves identical on every rank. */
ct_status ct_train_step(const ct_step_args *a, const ct_train_batch *micro, int n_micro, ct_step_result *r);

/* ---- ct_zero: the sharded optimizer step (ZeroRedundancyOptimizer, over shared memory) ----
 *
 *   ct_ddp_create(pg, P, NULL, &ddp);  ct_optim_create_sgd(P, &so, &opt);
 *   ct_zero *zero;
 *   ct_zero_create(ddp, opt, &zero);       // collective; NULL where it does not apply
 *   ct_step_args sa = {..., .opt = opt, .ddp = ddp, .zero = zero};
 *   for (step...) ct_train_step(&sa, &batch, 1, &r);
 *   ct_zero_free(zero);                    // before the DDP; parameters and state move back
 *
 * The parameters and the optimizer's state move into one segment every rank of the machine
 * maps (one copy; rank 0's values: re-read ct_params_data), and each ct_optim_step updates
 * only this rank's 1/n of the flat buffers, then waits until every rank has updated its
 * share. Unless something reads the gradients before the step (clipping, a loss scaler: the
 * buckets are then all-reduced as usual), DDP defers the averaging and the step averages
 * each element from the ranks' gradient buffers as it reads it: no all-reduce, and the
 * step's traffic divided by n. The bits are those of the unsharded step.
 * It applies on the shm backend with zero-copy gradients and the optimizer on the CPU,
 * unless CTRAIN_DDP_SHARD_OPTIM=0. On the hier backend (several machines, not under mpirun:
 * the segment's name goes through the job's store; CTRAIN_DDP_SHARD_HIER=0 turns it off, for
 * DDP's all-reduce overlapped with backward) each machine holds one copy,
 * shared by its ranks, and each share's sum crosses the machines on local rank i's own
 * connection (src/train/zero.c): in chunks during backward, each as soon as every local
 * rank's backward has finished it (CTRAIN_HIER_CHAIN_EARLY=0: all in
 * ct_zero_gradients_final, after backward); with the ordered sum
 * (CTRAIN_HIER_ALLREDUCE=ordered, or the default on 2 machines) in world rank order, so again
 * the bits of one machine. Elsewhere, or when /dev/shm has no room (a warning), *out
 * stays NULL and CT_OK is returned. The trainer creates one after resuming. Freeing the
 * optimizer first moves the parameters back to private memory (the state goes with it). */
typedef struct ct_zero ct_zero;
ct_status ct_zero_create(ct_ddp *ddp, ct_optim *opt, ct_zero **out);
void ct_zero_free(ct_zero *z);
/* ct_train_step's side, for a loop of your own: before the backward (average: no one reads
 * the gradients before the step), after ct_ddp_finish succeeded, and instead of a step that
 * is not taken on this rank alone (so that ranks stay matched). */
ct_status ct_zero_begin_step(ct_zero *z, bool average);
ct_status ct_zero_gradients_final(ct_zero *z); /* across machines: the rest of the share's sum crosses the network here */
ct_status ct_zero_skip_step(ct_zero *z);

/* ---------------------------------------------------------------- checkpoints ---- */

typedef struct ct_train_state {
    int64_t step;              /* optimizer steps done */
    int64_t epoch;
    ct_sampler_state sampler;  /* global position of the next unseen sample */
    uint64_t seed;             /* run seed (initialisation, shuffling, dropout) */
    int world_size;            /* ranks that wrote it (informational: resume may use another) */
    double loss_scale;         /* mixed precision scaler state (0 = none) */
    int64_t scaler_growth_tracker;
} ct_train_state;

/* o may be NULL (weights and state only). Errors name the path and errno (CT_ERR_IO; a
 * filesystem known to be too small fails before anything is written); the checkpoints
 * already there are untouched by a failed save, and pruning happens only after success. */
ct_status ct_checkpoint_save(const char *root, const ct_train_model *m, ct_optim *o, const ct_train_state *ts, int keep);
/* Removes what interrupted saves and prunes of dead processes left under root (hidden
 * .step-N.tmp.<pid> and .step-N.del.<pid> directories), and puts back a .step-N.old.<pid>
 * copy whose re-save was cut between its renames when no step-N exists. Directories of
 * live processes other than this one are left alone. Call it before training starts (the
 * trainer does, on rank 0); a missing root is CT_OK. Each removal is logged. */
ct_status ct_checkpoint_cleanup(const char *root);
/* CT_ERR_IO naming dir, the bytes needed and free, and ENOSPC when the filesystem of dir
 * (statvfs) has less than `need` bytes available to the user; CT_OK when enough or unknown.
 * ct_checkpoint_save checks the checkpoint's minimum size with it before writing. */
ct_status ct_checkpoint_free_space(const char *dir, uint64_t need, const char *what);
/* Newest checkpoint under root whose manifest verifies; CT_ERR_NOT_FOUND if none. */
ct_status ct_checkpoint_find_latest(const char *root, char *dir, size_t n);
/* Checks every file of the manifest (size and CRC-32). */
ct_status ct_checkpoint_verify(const char *dir);
/* Verifies, then loads weights, optimizer state and ts. A checkpoint of another model
 * (names, shapes, kind) or optimizer is CT_ERR_MISMATCH naming the difference; on any error
 * model and optimizer are unchanged. */
ct_status ct_checkpoint_load(const char *dir, const ct_train_model *m, ct_optim *o, ct_train_state *ts);
/* Collective, for a run under --shard (ctrain/fsdp.h): a checkpoint directory as
 * ct_checkpoint_save's, atomic the same way, holding every rank's shard file, the index and
 * the train state. The ranks write into one directory that rank 0 renames into place, so
 * every rank must see the same root (one output directory on a filesystem all nodes share);
 * a shard rank 0 cannot see is CT_ERR_IO saying so. The same outcome on every rank. */
ct_status ct_checkpoint_save_sharded(ct_pg *pg, ct_fsdp *f, const char *root, const ct_train_model *m, const ct_train_state *ts,
                                     int keep);
/* Collective: a sharded checkpoint, written at any world size, into f's shards (resharded
 * as f splits them) and ts; a checkpoint written without --shard is read whole on every rank
 * (the whole model in memory for a moment), each rank keeping its pieces.
 * ct_checkpoint_load reads a sharded checkpoint whole (an unsharded run, an export). */
ct_status ct_checkpoint_load_sharded(ct_pg *pg, ct_fsdp *f, const char *dir, const ct_train_model *m, ct_train_state *ts);
/* The optimizer's state tensors into a safetensors writer as "<prefix><state>.<param>" and
 * "<prefix>step" (the writer points into the optimizer: save before its next step), and
 * back: a missing tensor is CT_ERR_NOT_FOUND, a wrong dtype or shape CT_ERR_FORMAT, both
 * naming it; on error the optimizer is unchanged. */
ct_status ct_checkpoint_add_optim(ct_st_writer *w, ct_optim *o, const char *prefix);
ct_status ct_checkpoint_read_optim(const ct_st_file *f, ct_optim *o, const char *prefix);

/* ---------------------------------------------------------------- the trainer ---- */

typedef struct ct_trainer ct_trainer;

typedef struct ct_step_report {
    int64_t step, total_steps, epoch; /* step: optimizer steps done (1 after the first) */
    double loss;                      /* this step, this rank */
    double lr, grad_norm;             /* grad_norm: NAN unless clipping */
} ct_step_report;

typedef struct ct_eval_report {
    int64_t step, epoch;
    double loss, accuracy;            /* over every evaluated sample of every rank */
    int64_t count;                    /* predictions evaluated (samples, or tokens of a language model) */
} ct_eval_report;

/* ---------------------------------------------------------------- evaluation ---- */

typedef struct ct_eval_opts {
    int batch_size;          /* 64 */
    int64_t max_samples;     /* 0: all */
    ct_pg *pg;               /* NULL or a world of 1: one process; else each rank evaluates its share */
    /* every rank runs as many forwards as the rank with the most batches, the extra ones on
     * one repeated sample and not counted: for a forward that calls collectives (FSDP's units
     * gathered one at a time). false */
    bool lockstep;
} ct_eval_opts;
ct_eval_opts ct_eval_default_opts(void);
/* Mean cross-entropy and accuracy (argmax of the last dim against the targets) of model's
 * forward over the samples of d (every position for a language model; step and epoch are
 * left 0). ctx may be NULL (one is made); gradients and dropout are off during the call.
 * Under a group every rank calls it and gets the totals. */
ct_status ct_evaluate(const ct_train_model *model, const ct_dataset *d, const ct_eval_opts *opts, ct_ctx *ctx, ct_eval_report *r);

typedef struct ct_trainer_opts {
    ct_pg *pg;               /* NULL or a world of 1: one process; else DDP over this group */
    ct_ddp_opts ddp;         /* ct_ddp_default_opts() */
    int64_t epochs;          /* 1 */
    int64_t max_steps;       /* 0: epochs decide; else stop after this many optimizer steps */
    int batch_size;          /* per rank and micro-batch: 64 (global batch = batch x ranks x grad_accum) */
    int grad_accum;          /* micro-batches per optimizer step: 1 */
    double lr;               /* 0.05 */
    ct_lr_kind schedule;     /* CT_LR_COSINE */
    double min_lr;           /* < 0 (default): cosine lr x 0.1, linear 0 */
    int64_t warmup_steps;    /* 0 */
    double clip_norm;        /* 0: off */
    uint64_t seed;           /* shuffling and dropout: 1337 */
    int workers;             /* loader threads: 1 */
    int64_t eval_every;      /* 0: after each epoch (eval_each_epoch) and at the end */
    bool eval_each_epoch;    /* true */
    int64_t eval_max;        /* evaluate on at most this many samples (0: all) */
    int64_t save_every;      /* 0: at the end only */
    int keep;                /* checkpoints kept: 3 (0: all); the oldest goes only after the
                              * new one is complete, so the disk needs room for keep + 1 */
    /* false (default): a checkpoint that cannot be written (full disk, I/O error) ends
     * ct_trainer_fit with its error on every rank; true: a warning, and training goes on.
     * The final weights (model.safetensors) not written is an error either way. */
    bool keep_going_on_save_error;
    const char *resume;      /* NULL, "auto" (newest valid under output_dir/checkpoints) or a directory */
    int64_t log_every;       /* progress line every N steps: 50 (0: no printing) */
    const char *output_dir;  /* "output": checkpoints/, model.safetensors, metrics */
    bool metrics;            /* true: metrics.jsonl, TensorBoard events and training.svg (rank 0) */
    bool loss_scaling;       /* false; true: dynamic loss scaling with `scaler` (fp16 training) */
    ct_grad_scaler_opts scaler; /* ct_grad_scaler_default_opts(); state saved in checkpoints */
    ct_dtype amp;            /* CT_F32 (default): off; CT_BF16 / CT_F16: mixed precision, the
                              * forward and loss under ct_autocast_begin (see ct_step_args);
                              * CT_F16 turns loss_scaling on. Evaluation stays f32. */
    bool shard_prefetch;     /* with shard: ct_fsdp_set_prefetch (false) */
    /* with shard: false (default): ct_trainer_free gathers the model whole into its store
     * (ct_fsdp_free); true: it gives the parameters up instead (ct_fsdp_discard: the store is
     * deferred, without values), for a caller done with them once model.safetensors is
     * written, so that no rank ever holds the whole model (the CLI) */
    bool release_model;
    ct_dtype shard_param_dtype; /* with shard: ct_fsdp_set_param_dtype (CT_F32; CT_BF16) */
    ct_shard_mode shard;     /* CT_SHARD_NONE (default): DDP over pg; else FSDP (fsdp.h) in that
                              * mode: the optimizer's kind and options step each rank's shards
                              * (its own state is released: ct_optim_release_state),
                              * the final model.safetensors is written a unit at a time
                              * (ct_fsdp_stream; gathered whole for a model without
                              * save_fetch); evaluation gathers each unit as it runs (ranks in
                              * lockstep); checkpoints are sharded (ct_checkpoint_save_sharded). */
    /* Called on every rank after each optimizer step / evaluation; return false to stop
     * (the trainer then saves and returns CT_OK). Under DDP every rank must decide alike
     * (decide from the report, which is the same on every rank except the step's loss). */
    bool (*on_step)(ct_trainer *t, const ct_step_report *r, void *user);
    /* false (default); true: after each step the trainer reads ct_preempt_signal() and, when
     * a signal was caught on any rank (under DDP an all-reduce MAX of it, one int per step,
     * so the ranks stop at the same step whichever got the signal), it saves a checkpoint at
     * that step and returns CT_OK without evaluating or writing model.safetensors;
     * ct_trainer_preempted then says which signal. Every rank must set it alike. */
    bool preemptible;
    bool (*on_eval)(ct_trainer *t, const ct_eval_report *r, void *user);
    void *user;
} ct_trainer_opts;

ct_trainer_opts ct_trainer_default_opts(void);
/* model and opt are used, not owned; eval_data may be NULL (the training data is then
 * evaluated). Creates DDP (world > 1), sampler, loader, context and metrics sinks. */
ct_status ct_trainer_create(const ct_trainer_opts *opts, const ct_train_model *model, ct_optim *opt,
                            const ct_dataset *train_data, const ct_dataset *eval_data, ct_trainer **out);
/* Trains from step 0 or from the resumed checkpoint to the end; saves a checkpoint at the
 * end and model.safetensors. First (rank 0) removes the leftovers of interrupted saves
 * under output_dir/checkpoints (ct_checkpoint_cleanup) and of model.safetensors. A save that fails is an error
 * (see keep_going_on_save_error) that names the path and errno on rank 0; the other ranks
 * get CT_ERR_IO saying rank 0 could not save. */
ct_status ct_trainer_fit(ct_trainer *t);
/* Evaluation alone (every rank calls it). Evaluation data without samples (a text too short
 * to hold any out) is CT_ERR_INVALID saying there is nothing to evaluate; ct_trainer_fit
 * then evaluates nothing, says so once, and its callbacks get no ct_eval_report. */
ct_status ct_trainer_evaluate(ct_trainer *t, ct_eval_report *r);
int64_t ct_trainer_step(const ct_trainer *t);
int64_t ct_trainer_total_steps(const ct_trainer *t);
int64_t ct_trainer_steps_per_epoch(const ct_trainer *t);
ct_ddp *ct_trainer_ddp(ct_trainer *t);          /* NULL alone */
ct_fsdp *ct_trainer_fsdp(ct_trainer *t);        /* NULL without sharding */
ct_ctx *ct_trainer_ctx(ct_trainer *t);
float ct_trainer_loss_scale(const ct_trainer *t);        /* 1 without loss scaling */
int64_t ct_trainer_skipped_steps(const ct_trainer *t);   /* skipped for overflowing gradients */
/* The signal that stopped ct_trainer_fit early for preemption (the same on every rank), else 0. */
int ct_trainer_preempted(const ct_trainer *t);
/* Exit code of a job that stopped for preemption after saving its checkpoint (EX_TEMPFAIL of
 * sysexits.h: try again later); `ctrain train` exits with it and `ctrain run` passes it on. */
#define CT_EXIT_PREEMPTED 75

/* ---- preemption signals ----
 *   uint64_t mask;
 *   ct_preempt_parse(ct_config_str(CT_CFG_PREEMPT_SIGNALS), &mask);   // "TERM,USR1"
 *   ct_preempt_catch(mask);            // before training; o.preemptible = true
 * The handlers only record the first signal (SA_RESTART: the step in progress goes on).
 * Bit s of a mask is signal s. */
ct_status ct_preempt_parse(const char *spec, uint64_t *mask); /* "TERM,USR1", "SIGTERM", "none" or "" */
ct_status ct_preempt_catch(uint64_t mask);
int ct_preempt_signal(void);         /* the first signal caught, 0 if none */
void ct_preempt_request(int sig);    /* as if sig had been caught (a loop of your own, tests) */
void ct_trainer_free(ct_trainer *t);

#ifdef __cplusplus
}
#endif
#endif
