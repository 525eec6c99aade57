/* ctrain train KIND — the main job: flags in, a built-in model, its data and the
 * library's trainer out. Alone it trains in one process; under a launcher (ctrain run, mpirun,
 * srun: ct_dist_detect) every rank trains its share of each global batch with DDP (src/train/trainer.c). */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/train_opts.h"
#include "ctrain/ctrain.h"

typedef struct {
    train_opts o;
    ct_model_config cfg;      /* the model: the flags', or --init-from's file's */
    ct_weights_layout init_layout;
    ct_pg *pg;
    ct_device dev;            /* --device, resolved */
    const ct_model_kind_info *ki;
    int context;              /* token models: the training context (--block-size, or the model's) */
    ct_model *model;
    ct_optim *opt;
    ct_dataset *all, *train, *test; /* token models: all = the whole text, train/test = views of it */
    cli_tokenizer tok;        /* --tokenizer: what --text is encoded with; OUTPUT/ keeps a copy */
    int preempted;            /* the signal that stopped training early (checkpoint saved), else 0 */
} job;

static ct_status open_data(job *j) {
    const train_opts *o = &j->o;
    ct_status st;
    if (j->ki->data == CT_MODEL_DATA_TOKENS) {
        int T = j->context;
        if (o->text && o->tokenizer) {
            char model[128];
            snprintf(model, sizeof model, "the %s (%s)", j->ki->name, o->init_from ? o->init_from : "--vocab-size");
            st = cli_tokenizer_open(o->tokenizer, &j->tok);
            if (st == CT_OK) st = cli_tokenizer_fits(&j->tok, ct_model_batch_of(&j->cfg).vocab, model);
            if (st == CT_OK) st = cli_text_dataset(j->tok.tok, o->text, T, &j->all);
            if (st == CT_OK && (!j->pg || ct_pg_rank(j->pg) == 0) && o->log_every > 0)
                printf("text: %s tokenized with %s (vocabulary %d): %lld windows of %d tokens\n", o->text, j->tok.files[0],
                       ct_tokenizer_vocab_size(j->tok.tok), (long long)ct_dataset_len(j->all), T);
        } else if (o->text) {
            /* bytes are tokens only for a model of 256 of them: anything else would learn noise */
            int64_t V = ct_model_batch_of(&j->cfg).vocab;
            if (V != 256)
                return ct_error(CT_ERR_INVALID, "--text without --tokenizer trains on bytes (vocabulary 256), but the %s's vocabulary is %lld: "
                                "give --tokenizer DIR", j->ki->name, (long long)V);
            st = ct_dataset_text_open(o->text, T, &j->all);
        } else {
            glob_t g;
            if (glob(o->shards, 0, NULL, &g) != 0 || g.gl_pathc == 0)
                return ct_error(CT_ERR_NOT_FOUND, "--shards %s matches no file", o->shards);
            st = ct_dataset_tokens_open((const char *const *)g.gl_pathv, (int)g.gl_pathc, T, &j->all);
            globfree(&g);
        }
        if (st != CT_OK) return st;
        /* token ids against the vocabulary: checked with the model's other expectations by ct_trainer_create */
        return ct_dataset_split_holdout(j->all, &j->train, &j->test);
    }
    st = ct_dataset_idx_open_dir(o->data_dir, true, &j->train);
    if (st == CT_ERR_NOT_FOUND)
        return ct_error(st, "no train-images-idx3-ubyte(.gz) in --data-dir %s (Fashion-MNIST: apt-get install dataset-fashion-mnist)",
                        o->data_dir);
    if (st != CT_OK) return st;
    st = ct_dataset_idx_open_dir(o->data_dir, false, &j->test);
    if (st == CT_ERR_NOT_FOUND) {
        CT_LOG_WARN_("train", "no test set in %s: evaluating on training data", o->data_dir);
        return CT_OK;
    }
    return st;
}

/* the kind's context-length option (CT_OPT_CONTEXT), or NULL */
static const ct_model_option *context_option(const ct_model_kind_info *ki) {
    for (int i = 0; i < ki->noptions; i++)
        if (ki->options[i].flags & CT_OPT_CONTEXT) return &ki->options[i];
    return NULL;
}
static int int_at(const ct_model_config *c, const ct_model_option *o) { return *(const int *)((const char *)c + o->off); }

/* The model's config: the flags', or with --init-from the file's with the flags that say
 * how it runs (CT_OPT_RUN) on top; a token model's training context: the context flag,
 * or the model's own (with --init-from the flag may only shorten it). */
static ct_status model_config(job *j, ct_model_config *cfg) {
    const train_opts *o = &j->o;
    const ct_model_kind_info *ki = j->ki;
    const ct_model_option *ctx = context_option(ki);
    *cfg = o->cfg;
    if (o->init_from) {
        ct_weights_layout lay;
        ct_status st = ct_model_config_from_file(o->init_from, cfg, &lay);
        if (st != CT_OK) return st;
        if (cfg->kind != o->kind)
            return ct_error(CT_ERR_INVALID, "--init-from %s holds a %s, not a %s", o->init_from, ct_model_kind_name(cfg->kind), ki->name);
        for (int i = 0; i < ki->noptions; i++) {
            const ct_model_option *op = &ki->options[i];
            if (!(op->flags & CT_OPT_RUN)) continue;
            size_t n = op->type == 'b' ? sizeof(bool) : op->type == 'f' ? sizeof(float) : sizeof(int);
            memcpy((char *)cfg + op->off, (const char *)&o->cfg + op->off, n);
        }
        j->init_layout = lay;
        if (ctx && o->cfg_set[ctx - ki->options] && int_at(&o->cfg, ctx) > int_at(cfg, ctx)) {
            char flag[64];
            return ct_error(CT_ERR_INVALID, "%s %d is longer than the context of the model in %s (%d)", ct_model_option_flag(ctx, flag, sizeof flag),
                            int_at(&o->cfg, ctx), o->init_from, int_at(cfg, ctx));
        }
    }
    j->context = ctx ? int_at(o->cfg_set[ctx - ki->options] ? &o->cfg : cfg, ctx) : 0;
    return CT_OK;
}

static ct_status build(job *j) {
    const train_opts *o = &j->o;
    /* FSDP steps the shards with an optimizer like this one: no whole-model state here */
    bool sharded = o->shard != CT_SHARD_NONE && j->pg && ct_pg_size(j->pg) > 1;
    /* sharded initialisation: each rank makes only its shards (ct_fsdp_create), the whole
     * model never in one rank's memory; weights read from a file come whole */
    bool deferred = sharded && !o->init_from && j->dev.type == CT_DEV_CPU;
    ct_status st = (deferred ? ct_model_create_deferred : ct_model_create)(&j->cfg, o->seed, &j->model);
    if (st != CT_OK) return st;
    if (o->init_from) {
        st = ct_model_load_layout(j->model, o->init_from, j->init_layout);
        if (st != CT_OK) return st;
        if (!j->pg || ct_pg_rank(j->pg) == 0) printf("initialised from %s: %s\n", o->init_from, ct_model_describe(j->model));
    }
    ct_params *P = ct_model_params(j->model);
    /* before the optimizer: its state is made where the parameters are */
    if (j->dev.type != CT_DEV_CPU && (st = ct_params_to(P, j->dev)) != CT_OK) return st;
    if (o->adamw) {
        ct_adamw_opts ao = ct_adamw_default_opts();
        ao.weight_decay = o->weight_decay >= 0 ? o->weight_decay : 0.1;
        ao.beta2 = j->ki->adam_beta2;
        ao.decay_only_ndim_ge2 = true;
        ao.template_only = sharded;
        st = ct_optim_create_adamw(P, &ao, &j->opt);
    } else {
        ct_sgd_opts so = ct_sgd_default_opts();
        so.momentum = o->momentum;
        so.weight_decay = o->weight_decay >= 0 ? o->weight_decay : 0;
        so.nesterov = o->nesterov;
        so.template_only = sharded;
        st = ct_optim_create_sgd(P, &so, &j->opt);
    }
    return st;
}

static ct_status fit(job *j) {
    const train_opts *o = &j->o;
    ct_trainer_opts to = ct_trainer_default_opts();
    to.pg = j->pg;
    to.ddp.comm_dtype = o->comm_dtype;
    to.shard = o->shard;
    to.shard_prefetch = o->shard_prefetch;
    to.shard_param_dtype = o->shard_param_dtype;
    to.epochs = o->epochs;
    to.max_steps = o->steps;
    to.batch_size = o->batch_size;
    to.grad_accum = o->grad_accum;
    to.lr = o->lr;
    to.schedule = o->schedule == 0 ? CT_LR_CONSTANT : o->schedule == 2 ? CT_LR_LINEAR : CT_LR_COSINE;
    to.warmup_steps = o->warmup;
    to.clip_norm = o->clip;
    to.loss_scaling = o->loss_scaling;
    if (o->loss_scale_init > 0) to.scaler.init_scale = (float)o->loss_scale_init;
    to.amp = o->amp;
    to.seed = o->seed;
    to.workers = o->workers;
    to.eval_every = o->eval_every;
    to.eval_each_epoch = j->ki->eval_each_epoch;
    to.eval_max = o->eval_max;
    to.save_every = o->save_every;
    to.keep = o->keep;
    to.keep_going_on_save_error = o->keep_going_on_save_error;
    to.resume = o->resume;
    /* a launcher's restart (torchrun --max-restarts, ctrain run) continues the run */
    if (!to.resume && ct_config_int(CT_CFG_TORCHELASTIC_RESTART_COUNT) > 0) to.resume = "auto";
    to.log_every = o->log_every;
    to.output_dir = o->output_dir;
    to.preemptible = true; /* every rank alike, whatever CTRAIN_PREEMPT_SIGNALS says on its node */
    to.release_model = true; /* the weights are in model.safetensors: never gathered back whole */
    ct_train_model tm = ct_train_model_builtin(j->model);
    ct_trainer *t;
    ct_status st = ct_trainer_create(&to, &tm, j->opt, j->train, j->test, &t);
    bool rank0 = !j->pg || ct_pg_rank(j->pg) == 0;
    /* the output directory exists now: its tokenizer beside the weights, for generate and eval */
    if (st == CT_OK && j->tok.tok && rank0) st = cli_tokenizer_save(&j->tok, o->output_dir);
    if (st == CT_OK) st = ct_trainer_fit(t);
    if (st == CT_OK && (j->preempted = ct_trainer_preempted(t))) {
        ct_trainer_free(t);
        return CT_OK;
    }
    /* under --shard the units are released after training: every rank gathers them for rank
     * 0's export (the whole model, once, at the end) */
    if (st == CT_OK && o->export_hf && ct_trainer_fsdp(t)) st = ct_fsdp_gather_all(ct_trainer_fsdp(t));
    if (st == CT_OK && o->export_hf && rank0) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/hf", o->output_dir);
        /* the exporter reads the weights on the host; training is over */
        st = ct_params_to(ct_model_params(j->model), CT_CPU);
        if (st == CT_OK) st = ct_model_save_hf(j->model, dir);
        if (st == CT_OK && j->tok.tok) st = cli_tokenizer_save(&j->tok, dir);
        if (st == CT_OK && o->log_every > 0) printf("exported for transformers: %s/ (model.safetensors, config.json%s)\n", dir,
                   j->tok.tok ? ", the tokenizer" : "");
    }
    ct_trainer_free(t);
    return st;
}

int cli_train(int argc, char **argv) {
    job j = {0};
    int rc = train_opts_parse(argc, argv, &j.o);
    if (rc >= 0) return rc;
    if (j.o.threads > 0) {
        /* more threads than CPUs only slow the kernels down, and past what the address-space
         * limit allows OpenBLAS would spin forever reserving buffers: refuse both up front */
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        char why[256];
        int max = ct_max_num_threads(why, sizeof why);
        if (cpus >= 1 && j.o.threads > cpus) {
            fprintf(stderr, "ctrain train: --threads %d is more than this machine's %ld CPUs\n", j.o.threads, cpus);
            return 2;
        }
        if (j.o.threads > max) {
            fprintf(stderr, "ctrain train: --threads %d: at most %d here: %s\n", j.o.threads, max, why);
            return 2;
        }
    }
    ct_set_num_threads(j.o.threads > 0 ? j.o.threads : ct_default_num_threads());
    /* before anything long (loading data, the rendezvous): a signal then stops after step 1 */
    uint64_t preempt;
    ct_status st = ct_preempt_parse(ct_config_str(CT_CFG_PREEMPT_SIGNALS), &preempt);
    if (st == CT_OK) st = ct_preempt_catch(preempt);
    if (st != CT_OK) {
        fprintf(stderr, "ctrain train: %s\n", ct_last_error());
        return 2;
    }
    ct_dist_world dw; /* the same rule as ct_dist_init: mpirun/srun alone make a job distributed */
    st = ct_dist_detect(&dw);
    if (st == CT_OK && (rc = cli_resolve_device(j.o.device, dw.local_rank, "ctrain train", &j.dev)) >= 0) return rc;
    if (st == CT_OK && dw.world_size > 1) {
        /* GPUs all-reduce on NCCL unless CTRAIN_BACKEND says otherwise (torch: backend="nccl") */
        ct_dist_opts dopts = ct_dist_default_opts();
        if (j.dev.type == CT_DEV_CUDA && !ct_config_is_set(CT_CFG_BACKEND)) dopts.backend = "nccl";
        st = ct_dist_init(&dopts, &j.pg);
    }
    j.ki = ct_model_kind_info_of(j.o.kind);
    if (st == CT_OK) st = model_config(&j, &j.cfg);
    if (st == CT_OK) st = open_data(&j);
    if (st == CT_OK) st = build(&j);
    if (st == CT_OK) st = fit(&j);
    if (st != CT_OK) fprintf(stderr, "ctrain train: error%s: %s\n", j.pg ? " on this rank" : "", ct_last_error());
    ct_optim_free(j.opt);
    ct_model_free(j.model);
    ct_dataset_free(j.train);
    ct_dataset_free(j.test);
    ct_dataset_free(j.all);
    cli_tokenizer_close(&j.tok);
    if (j.pg) ct_pg_free(j.pg);
    return st != CT_OK ? 1 : j.preempted ? CT_EXIT_PREEMPTED : 0;
}
