/* Flag parsing for `ctrain train`: every value is checked, and a bad one gets one line
 * naming the flag, the value and what was expected. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/train_opts.h"

static void usage(FILE *f) {
    fprintf(f, "usage: ctrain train ");
    for (int k = 0; k < ct_model_kind_count(); k++) fprintf(f, "%s%s", k ? "|" : "", ct_model_kind_name((ct_model_kind)k));
    fprintf(f, " [options]\n");
    fprintf(f,
            "Trains a built-in model; under `ctrain run` with DDP across the ranks.\n\n"
            "data:\n"
            "  --data-dir DIR       IDX files for image models (default $CTRAIN_DATA_DIR or /usr/share/datasets/fashion-mnist)\n"
            "  --text FILE|GLOB     token models: text; without --tokenizer its bytes are the tokens (a model of\n"
            "                       vocabulary 256, the default); with it, the files the glob matches, each a\n"
            "                       document opened by the tokenizer's BOS (else EOS, else <|endoftext|>)\n"
            "  --tokenizer DIR|FILE tokenizer.json (or a directory with it, or vocab.json + merges.txt) for\n"
            "                       --text; it must fit the model's vocabulary; OUTPUT/ keeps a copy\n"
            "  --shards GLOB        token models: llm.c token shards (.bin)\n"
            "training:\n"
            "  --epochs N           passes over the data (default 1)\n"
            "  --steps N            stop after N optimizer steps (overrides --epochs)\n"
            "  --batch-size B       per rank (default 64; the global batch is B x ranks x K)\n"
            "  --grad-accum K       K micro-batches of B per optimizer step (default 1): a K times larger\n"
            "                       batch in the memory of one; DDP reduces once per step\n"
            "  --optimizer sgd|adamw  (default: the model's, below)\n"
            "  --lr LR              (default 0.05 sgd, 1e-3 adamw)\n"
            "  --momentum M         sgd momentum (default 0.9)   --nesterov\n"
            "  --weight-decay WD    (default 0 sgd, 0.1 adamw on weights of >= 2 dims)\n"
            "  --schedule constant|cosine|linear  (default cosine)  --warmup N  (default 0)\n"
            "  --clip NORM          clip the global gradient norm (default off)\n"
            "  --loss-scaling       dynamic loss scaling (GradScaler: 2^16, x2 per 2000 clean steps, x0.5 and\n"
            "                       the step skipped on inf/NaN gradients, floor 1)\n"
            "  --amp [bf16|fp16]    mixed precision: forward and loss under autocast (matmul, linear, conv,\n"
            "                       attention in the low precision; master weights, optimizer f32); fp16\n"
            "                       turns --loss-scaling on (default off; --amp alone: bf16)\n"
            "  --loss-scale-init S  with loss scaling: the first scale (GradScaler's init_scale; default 65536)\n"
            "  --seed S             initialisation, shuffling and dropout (default 1337)\n"
            "  --device D           cpu (default), cuda, cuda:N or auto: where the model trains; cuda under\n"
            "                       `ctrain run` is cuda:LOCAL_RANK (one GPU per rank, DDP over NCCL); auto:\n"
            "                       cuda if a GPU is usable, else cpu (--amp on a GPU: built, not yet run\n"
            "                       on one)\n"
            "  --grad-compression none|bf16|fp16  DDP traffic dtype (default none)\n"
            "  --shard full|grad-optim|optim|none  with several ranks: shard parameters, gradients and\n"
            "                       optimizer state (FULL_SHARD), gradients and state (SHARD_GRAD_OP), the\n"
            "                       state (ZeRO-1), or nothing (DDP, the default); see docs/fsdp.md\n"
            "  --shard-prefetch     with --shard: the next unit's all-gather and the previous unit's\n"
            "                       reduce-scatter overlap the running unit\n"
            "  --shard-param-dtype f32|bf16  with --shard: what the parameter all-gathers carry (default f32;\n"
            "                       bf16: half the bytes, the units hold the f32 shards rounded to bf16, as\n"
            "                       FSDP's MixedPrecision(param_dtype=torch.bfloat16))\n"
            "  --init-from PATH     start from these weights: a model ctrain saved or a Hugging Face checkpoint\n"
            "                       (its directory, or model.safetensors with config.json beside it); the file's shape replaces the\n"
            "                       model flags but those marked (run)\n");
    cli_model_flags_help(f);
    fprintf(f,
            "output:\n"
            "  --output-dir DIR     (default $CTRAIN_OUTPUT_DIR or ./output)\n"
            "  --export hf          models with a Hugging Face layout: also write OUTPUT/hf/ for transformers\n"
            "  --save-every N       checkpoint every N steps (and at the end)   --keep K (default 3)\n"
            "  --keep-going-on-save-error  a checkpoint that cannot be written is a warning, not the\n"
            "                       end of the job (the final weights must still be written)\n"
            "  --resume PATH|auto   continue from a checkpoint directory, or the newest valid one\n"
            "                       (auto when TORCHELASTIC_RESTART_COUNT > 0: a launcher's restart)\n"
            "  --eval-every N       evaluate every N steps (default: image models after each epoch, token models\n"
            "                       at the end)\n"
            "  --eval-max N         evaluate on at most N samples (default all)\n"
            "  --log-every N        progress line every N steps (default 50)\n"
            "  --threads N          per rank, at most the CPU count (default OMP_NUM_THREADS or cores / local ranks)\n"
            "  --workers N          data loader threads (default 1)\n");
}

void cli_model_flags_help(FILE *f) {
    for (int k = 0; k < ct_model_kind_count(); k++) {
        const ct_model_kind_info *ki = ct_model_kind_info_of((ct_model_kind)k);
        ct_model_config c = ct_model_cli_config((ct_model_kind)k);
        fprintf(f, "model %s (%s; optimizer %s):\n", ki->name,
                ki->data == CT_MODEL_DATA_TOKENS ? "token data: --text or --shards" : "images: --data-dir", ki->optimizer);
        for (int i = 0; i < ki->noptions; i++) {
            const ct_model_option *o = &ki->options[i];
            if (!(o->flags & CT_OPT_FLAG)) continue;
            char flag[64], val[128], left[200];
            ct_model_option_flag(o, flag, sizeof flag);
            const char *arg = o->type == 'i' ? " N" : o->type == 'f' ? " X" : o->type == 'l' ? " N,N" : "";
            if (o->type == 'b' && o->words) snprintf(val, sizeof val, " %s", o->words);
            snprintf(left, sizeof left, "%s%s", flag, o->type == 'b' && o->words ? val : arg);
            ct_model_config_get(&c, o, val, sizeof val);
            if (o->type == 'b' && o->words) { /* the default as its word */
                const char *bar = strchr(o->words, '|');
                if (!strcmp(val, "true")) snprintf(val, sizeof val, "%s", bar + 1);
                else snprintf(val, sizeof val, "%.*s", (int)(bar - o->words), o->words);
            }
            fprintf(f, "  %-20s %s%s (default %s)\n", left, o->help ? o->help : o->key, o->flags & CT_OPT_RUN ? " (run)" : "",
                    o->type == 'b' && !o->words ? (strcmp(val, "true") ? "off" : "on") : val);
        }
    }
}

int cli_model_flag(const char *cmd, ct_model_kind k, int argc, char **argv, int *i, ct_model_config *cfg, bool *set) {
    const ct_model_option *o = ct_model_option_find(k, argv[*i]);
    if (!o || !(o->flags & CT_OPT_FLAG) || strncmp(argv[*i], "--", 2)) return 0;
    const char *f = argv[*i], *v = NULL;
    if (o->type != 'b' || o->words) { /* a bare switch takes no value */
        if (*i + 1 >= argc) return cli_bad_value(cmd, f, NULL, "a value");
        v = argv[++*i];
    }
    if (ct_model_config_set(cfg, o, v) != CT_OK) {
        char want[128];
        return cli_bad_value(cmd, f, v, ct_model_option_want(o, want, sizeof want));
    }
    const ct_model_kind_info *ki = ct_model_kind_info_of(k);
    if (set) set[o - ki->options] = true;
    return -1;
}

int cli_bad_value(const char *cmd, const char *flag, const char *val, const char *want) {
    fprintf(stderr, "ctrain %s: %s expects %s, got '%s'\n", cmd, flag, want, val ? val : "(nothing)");
    return 2;
}

static int bad(const char *flag, const char *val, const char *want) { return cli_bad_value("train", flag, val, want); }

bool cli_to_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!s || !*s) return false;
    char *e;
    errno = 0;
    long long v = strtoll(s, &e, 10);
    if (*e || errno || v < lo || v > hi) return false;
    *out = v;
    return true;
}
bool cli_to_f(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return false;
    char *e;
    errno = 0;
    double v = strtod(s, &e);
    if (*e || errno || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

int train_opts_parse(int argc, char **argv, train_opts *o) {
    memset(o, 0, sizeof *o);
    const char *env_data = ct_config_str(CT_CFG_DATA_DIR), *env_out = ct_config_str(CT_CFG_OUTPUT_DIR);
    o->data_dir = env_data && *env_data ? env_data : "/usr/share/datasets/fashion-mnist";
    o->output_dir = env_out && *env_out ? env_out : "output";
    o->epochs = 1;
    o->batch_size = 64;
    o->grad_accum = 1;
    o->lr = -1;
    o->momentum = 0.9;
    o->weight_decay = -1;
    o->schedule = 1;
    o->seed = 1337;
    o->keep = 3;
    o->log_every = 50;
    o->workers = 1;
    o->comm_dtype = CT_F32;
    const char *optimizer = NULL;
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    char kinds[128];
    if (ct_model_kind_parse(argv[1], &o->kind) != CT_OK) return bad("the model", argv[1], ct_model_kind_list(kinds, sizeof kinds));
    const ct_model_kind_info *ki = ct_model_kind_info_of(o->kind);
    CT_CHECK(ki->noptions <= CLI_MAX_MODEL_OPTS, "model %s has %d options, at most %d", ki->name, ki->noptions, CLI_MAX_MODEL_OPTS);
    o->cfg = ct_model_cli_config(o->kind);
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        double d;
#define NEEDV() do { if (!v) return bad(f, NULL, "a value"); i++; } while (0)
#define INT(flag, lo, hi, dst) else if (!strcmp(f, flag)) { NEEDV(); if (!cli_to_i64(v, lo, hi, &n)) return bad(f, v, "an integer in [" #lo ", " #hi "]"); dst = n; }
#define FLT(flag, lo, hi, dst) else if (!strcmp(f, flag)) { NEEDV(); if (!cli_to_f(v, lo, hi, &d)) return bad(f, v, "a number in [" #lo ", " #hi "]"); dst = d; }
#define STR(flag, dst) else if (!strcmp(f, flag)) { NEEDV(); dst = v; }
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); return 0; }
        /* the kind's own flags (its option table), then the rest */
        int mrc = cli_model_flag("train", o->kind, argc, argv, &i, &o->cfg, o->cfg_set);
        if (mrc > 0) return mrc;
        if (mrc < 0) continue;
        STR("--data-dir", o->data_dir) STR("--text", o->text) STR("--tokenizer", o->tokenizer) STR("--shards", o->shards) STR("--output-dir", o->output_dir)
        STR("--resume", o->resume) STR("--optimizer", optimizer) STR("--init-from", o->init_from)
        INT("--epochs", 1, 100000, o->epochs) INT("--steps", 1, 1000000000, o->steps) INT("--batch-size", 1, 1048576, o->batch_size)
        INT("--grad-accum", 1, 65536, o->grad_accum)
        FLT("--lr", 1e-12, 100, o->lr) FLT("--momentum", 0, 0.9999, o->momentum) FLT("--weight-decay", 0, 10, o->weight_decay)
        FLT("--clip", 0, 1e9, o->clip) FLT("--loss-scale-init", 1, 1e38, o->loss_scale_init)
        INT("--warmup", 0, 1000000000, o->warmup) INT("--seed", 0, 4294967295LL, o->seed)
        INT("--save-every", 0, 1000000000, o->save_every) INT("--eval-every", 0, 1000000000, o->eval_every)
        INT("--eval-max", 0, 1000000000, o->eval_max) INT("--keep", 0, 1000000, o->keep) INT("--log-every", 1, 1000000000, o->log_every)
        INT("--threads", 1, 1024, o->threads) INT("--workers", 0, 64, o->workers)
        else if (!strcmp(f, "--nesterov")) o->nesterov = true;
        else if (!strcmp(f, "--export")) {
            NEEDV();
            if (strcmp(v, "hf")) return bad(f, v, "hf (a Hugging Face directory)");
            o->export_hf = true;
        }
        else if (!strcmp(f, "--device")) {
            NEEDV();
            ct_device dv;
            if (strcmp(v, "auto") && ct_device_parse(v, &dv) != CT_OK) return bad(f, v, "cpu, cuda, cuda:N or auto");
            o->device = v;
        }
        else if (!strcmp(f, "--loss-scaling")) o->loss_scaling = true;
        else if (!strcmp(f, "--amp")) {
            /* the type is optional: bf16 when the next word is another option or missing */
            o->amp = CT_BF16;
            if (v && strncmp(v, "--", 2)) {
                i++;
                if (!strcmp(v, "fp16") || !strcmp(v, "f16")) o->amp = CT_F16;
                else if (strcmp(v, "bf16")) return bad(f, v, "bf16 or fp16 (or nothing: bf16)");
            }
        }
        else if (!strcmp(f, "--keep-going-on-save-error")) o->keep_going_on_save_error = true;
        else if (!strcmp(f, "--schedule")) {
            NEEDV();
            if (!strcmp(v, "constant")) o->schedule = 0;
            else if (!strcmp(v, "cosine")) o->schedule = 1;
            else if (!strcmp(v, "linear")) o->schedule = 2;
            else return bad(f, v, "constant, cosine or linear");
        } else if (!strcmp(f, "--shard-prefetch")) {
            o->shard_prefetch = true;
        } else if (!strcmp(f, "--shard-param-dtype")) {
            NEEDV();
            if (!strcmp(v, "f32")) o->shard_param_dtype = CT_F32;
            else if (!strcmp(v, "bf16")) o->shard_param_dtype = CT_BF16;
            else return bad(f, v, "f32 or bf16");
        } else if (!strcmp(f, "--shard")) {
            NEEDV();
            if (ct_shard_mode_parse(v, &o->shard) != CT_OK) return bad(f, v, "full, grad-optim, optim or none");
        } else if (!strcmp(f, "--grad-compression")) {
            NEEDV();
            if (!strcmp(v, "none")) o->comm_dtype = CT_F32;
            else if (!strcmp(v, "bf16")) o->comm_dtype = CT_BF16;
            else if (!strcmp(v, "fp16")) o->comm_dtype = CT_F16;
            else return bad(f, v, "none, bf16 or fp16");
        } else {
            /* another kind's flag: say whose, rather than that it does not exist */
            for (int k = 0; k < ct_model_kind_count(); k++) {
                const ct_model_option *other = ct_model_option_find((ct_model_kind)k, f);
                if (other && (other->flags & CT_OPT_FLAG) && !strncmp(f, "--", 2)) {
                    fprintf(stderr, "ctrain train: %s is a flag of %s, not of %s\n", f, ct_model_kind_name((ct_model_kind)k), ki->name);
                    return 2;
                }
            }
            fprintf(stderr, "ctrain train: unknown option '%s' (see ctrain train --help)\n", f);
            return 2;
        }
#undef NEEDV
#undef INT
#undef FLT
#undef STR
    }
    if (!optimizer) optimizer = ki->optimizer;
    if (!strcmp(optimizer, "adamw")) o->adamw = true;
    else if (strcmp(optimizer, "sgd")) return bad("--optimizer", optimizer, "sgd or adamw");
    if (o->lr < 0) o->lr = o->adamw ? 1e-3 : 0.05;
    if (o->shard_param_dtype != CT_F32 && o->shard == CT_SHARD_NONE)
        return bad("--shard-param-dtype", "bf16", "--shard full, grad-optim or optim beside it (DDP gathers no parameters)");
    if (ki->data == CT_MODEL_DATA_TOKENS && !o->text && !o->shards) {
        fprintf(stderr, "ctrain train: %s needs --text FILE or --shards GLOB\n", ki->name);
        return 2;
    }
    if (o->tokenizer && !o->text) return bad("--tokenizer", o->tokenizer, "--text FILE to tokenize (shards are tokens already)");
    if (o->export_hf && !ki->hf) {
        char want[160] = "a model with a Hugging Face layout:";
        for (int k = 0; k < ct_model_kind_count(); k++)
            if (ct_model_kind_info_of((ct_model_kind)k)->hf)
                snprintf(want + strlen(want), sizeof want - strlen(want), " %s", ct_model_kind_name((ct_model_kind)k));
        return bad("--export", "hf", want);
    }
    /* the flags' model must be one (with --init-from the file's shape replaces them) */
    if (!o->init_from && ct_model_config_check(&o->cfg) != CT_OK) {
        fprintf(stderr, "ctrain train: %s\n", ct_last_error());
        return 2;
    }
    return -1;
}
