/* ctrain train mlp|cnn|gpt — the main job: flags in, a built-in model, its data and the
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
    ct_model_config init_cfg; /* --init-from: the file's model */
    ct_weights_layout init_layout;
    ct_pg *pg;
    ct_device dev;            /* --device, resolved */
    ct_model *model;
    ct_optim *opt;
    ct_dataset *all, *train, *test; /* gpt: all = the whole text, train/test = views of it */
} job;

static ct_status open_data(job *j) {
    const train_opts *o = &j->o;
    ct_status st;
    if (o->kind == CT_MODEL_GPT) {
        int T = o->block_size;
        if (o->text) {
            st = ct_dataset_text_open(o->text, T, &j->all);
        } else {
            glob_t g;
            if (glob(o->shards, 0, NULL, &g) != 0 || g.gl_pathc == 0)
                return ct_error(CT_ERR_NOT_FOUND, "--shards %s matches no file", o->shards);
            st = ct_dataset_tokens_open((const char *const *)g.gl_pathv, (int)g.gl_pathc, T, &j->all);
            globfree(&g);
        }
        if (st != CT_OK) return st;
        /* token ids against --vocab-size: checked with the model's other expectations by ct_trainer_create */
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

/* --init-from: the file decides the model; a GPT's training context defaults to its own */
static ct_status read_init(job *j) {
    train_opts *o = &j->o;
    ct_status st = ct_model_config_from_file(o->init_from, &j->init_cfg, &j->init_layout);
    if (st != CT_OK) return st;
    if (j->init_cfg.kind != o->kind)
        return ct_error(CT_ERR_INVALID, "--init-from %s holds a %s, not a %s", o->init_from, ct_model_kind_name(j->init_cfg.kind),
                        ct_model_kind_name(o->kind));
    if (o->kind != CT_MODEL_GPT) return CT_OK;
    int B = j->init_cfg.gpt.block_size;
    if (o->block_size > B)
        return ct_error(CT_ERR_INVALID, "--block-size %d is longer than the context of the model in %s (%d)", o->block_size, o->init_from, B);
    if (!o->block_size) o->block_size = B;
    o->vocab_size = j->init_cfg.gpt.vocab_size;
    return CT_OK;
}

static ct_status build(job *j) {
    const train_opts *o = &j->o;
    ct_model_config cfg = ct_model_default_config(o->kind);
    if (o->init_from) {
        cfg = j->init_cfg;
        cfg.gpt.dropout = cfg.cnn.dropout = (float)o->dropout; /* training's choice; MLP's dropout is in its names */
        cfg.gpt.flash_attention = o->flash;
        cfg.gpt.checkpoint_activations = o->ckpt;
    } else if (o->kind == CT_MODEL_GPT) {
        cfg.gpt.n_layer = o->n_layer;
        cfg.gpt.n_embd = o->n_embd;
        cfg.gpt.n_head = o->n_head;
        cfg.gpt.block_size = o->block_size;
        cfg.gpt.vocab_size = o->vocab_size;
        cfg.gpt.dropout = o->dropout;
        cfg.gpt.flash_attention = o->flash;
        cfg.gpt.checkpoint_activations = o->ckpt;
    } else if (o->kind == CT_MODEL_MLP) {
        cfg.mlp.dropout = o->dropout;
        if (o->n_hidden >= 0) {
            cfg.mlp.n_hidden = o->n_hidden;
            for (int i = 0; i < o->n_hidden; i++) cfg.mlp.hidden[i] = o->hidden[i];
        }
    } else {
        cfg.cnn.dropout = o->dropout;
    }
    ct_status st = ct_model_create(&cfg, o->seed, &j->model);
    if (st != CT_OK) return st;
    if (o->init_from) {
        st = j->init_layout == CT_LAYOUT_HF_GPT2 ? ct_gpt_load_hf(j->model, o->init_from) : ct_model_load(j->model, o->init_from);
        if (st != CT_OK) return st;
        if (!j->pg || ct_pg_rank(j->pg) == 0) printf("initialised from %s: %s\n", o->init_from, ct_model_describe(j->model));
    }
    ct_params *P = ct_model_params(j->model);
    /* before the optimizer: its state is made where the parameters are */
    if (j->dev.type != CT_DEV_CPU && (st = ct_params_to(P, j->dev)) != CT_OK) return st;
    if (o->adamw) {
        ct_adamw_opts ao = ct_adamw_default_opts();
        ao.weight_decay = o->weight_decay >= 0 ? o->weight_decay : 0.1;
        ao.beta2 = o->kind == CT_MODEL_GPT ? 0.95 : 0.999;
        ao.decay_only_ndim_ge2 = true;
        st = ct_optim_create_adamw(P, &ao, &j->opt);
    } else {
        ct_sgd_opts so = ct_sgd_default_opts();
        so.momentum = o->momentum;
        so.weight_decay = o->weight_decay >= 0 ? o->weight_decay : 0;
        so.nesterov = o->nesterov;
        st = ct_optim_create_sgd(P, &so, &j->opt);
    }
    return st;
}

static ct_status fit(job *j) {
    const train_opts *o = &j->o;
    ct_trainer_opts to = ct_trainer_default_opts();
    to.pg = j->pg;
    to.ddp.comm_dtype = o->comm_dtype;
    to.epochs = o->epochs;
    to.max_steps = o->steps;
    to.batch_size = o->batch_size;
    to.grad_accum = o->grad_accum;
    to.lr = o->lr;
    to.schedule = o->schedule == 0 ? CT_LR_CONSTANT : o->schedule == 2 ? CT_LR_LINEAR : CT_LR_COSINE;
    to.warmup_steps = o->warmup;
    to.clip_norm = o->clip;
    to.loss_scaling = o->loss_scaling;
    to.amp = o->amp;
    to.seed = o->seed;
    to.workers = o->workers;
    to.eval_every = o->eval_every;
    /* gpt epochs over a small text can be a handful of steps: it evaluates at the end */
    to.eval_each_epoch = o->kind != CT_MODEL_GPT;
    to.eval_max = o->eval_max;
    to.save_every = o->save_every;
    to.keep = o->keep;
    to.keep_going_on_save_error = o->keep_going_on_save_error;
    to.resume = o->resume;
    /* a launcher's restart (torchrun --max-restarts, ctrain run) continues the run */
    if (!to.resume && ct_config_int(CT_CFG_TORCHELASTIC_RESTART_COUNT) > 0) to.resume = "auto";
    to.log_every = o->log_every;
    to.output_dir = o->output_dir;
    ct_train_model tm = ct_train_model_builtin(j->model);
    ct_trainer *t;
    ct_status st = ct_trainer_create(&to, &tm, j->opt, j->train, j->test, &t);
    if (st == CT_OK) st = ct_trainer_fit(t);
    if (st == CT_OK && o->export_hf && (!j->pg || ct_pg_rank(j->pg) == 0)) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/hf", o->output_dir);
        /* the exporter reads the weights on the host; training is over */
        st = ct_params_to(ct_model_params(j->model), CT_CPU);
        if (st == CT_OK) st = ct_gpt_save_hf(j->model, dir);
        if (st == CT_OK && o->log_every > 0) printf("exported for transformers: %s/ (model.safetensors, config.json)\n", dir);
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
    ct_status st = CT_OK;
    ct_dist_world dw; /* the same rule as ct_dist_init: mpirun/srun alone make a job distributed */
    st = ct_dist_detect(&dw);
    if (st == CT_OK && (rc = cli_resolve_device(j.o.device, dw.local_rank, "ctrain train", &j.dev)) >= 0) return rc;
    if (st == CT_OK && dw.world_size > 1) {
        /* GPUs all-reduce on NCCL unless CTRAIN_BACKEND says otherwise (torch: backend="nccl") */
        ct_dist_opts dopts = ct_dist_default_opts();
        if (j.dev.type == CT_DEV_CUDA && !ct_config_is_set(CT_CFG_BACKEND)) dopts.backend = "nccl";
        st = ct_dist_init(&dopts, &j.pg);
    }
    if (st == CT_OK && j.o.init_from) st = read_init(&j);
    if (st == CT_OK) st = open_data(&j);
    if (st == CT_OK) st = build(&j);
    if (st == CT_OK) st = fit(&j);
    if (st != CT_OK) fprintf(stderr, "ctrain train: error%s: %s\n", j.pg ? " on this rank" : "", ct_last_error());
    ct_optim_free(j.opt);
    ct_model_free(j.model);
    ct_dataset_free(j.train);
    ct_dataset_free(j.test);
    ct_dataset_free(j.all);
    if (j.pg) ct_pg_free(j.pg);
    return st == CT_OK ? 0 : 1;
}
