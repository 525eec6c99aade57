/* Options of `ctrain train`, parsed and checked in one place (train_opts.c). */
#ifndef CT_TRAIN_OPTS_H
#define CT_TRAIN_OPTS_H
#include "ctrain/config.h" /* CTRAIN_DATA_DIR, CTRAIN_OUTPUT_DIR */
#include <stdio.h>

#include "ctrain/fsdp.h"
#include "ctrain/models.h"

/* the most options a model kind has (checked where they are parsed) */
#define CLI_MAX_MODEL_OPTS 64

typedef struct {
    ct_model_kind kind;
    ct_model_config cfg;    /* the model flags over the kind's `ctrain train` defaults (ct_model_cli_config) */
    bool cfg_set[CLI_MAX_MODEL_OPTS]; /* which of the kind's options were given */
    const char *data_dir, *text, *shards, *output_dir, *resume;
    const char *tokenizer;  /* --tokenizer DIR|FILE: --text is tokenized with it (else bytes) */
    const char *init_from;  /* --init-from FILE: start from these weights (their shape decides) */
    bool export_hf;         /* --export hf: also write OUTPUT/hf/ as a Hugging Face GPT-2 */
    int epochs;
    int64_t steps;
    int batch_size, grad_accum;
    double lr, momentum, weight_decay, clip;
    bool adamw, nesterov, keep_going_on_save_error;
    int schedule; /* 0 constant, 1 cosine, 2 linear */
    int64_t warmup;
    uint64_t seed;
    int64_t save_every, eval_every, eval_max;
    int keep, log_every, threads, workers;
    ct_dtype comm_dtype;
    ct_shard_mode shard;   /* --shard: CT_SHARD_NONE (DDP) unless given */
    bool shard_prefetch;   /* --shard-prefetch */
    ct_dtype shard_param_dtype; /* --shard-param-dtype (CT_F32) */
    bool loss_scaling;
    double loss_scale_init; /* --loss-scale-init (0: the scaler's default, 65536) */
    ct_dtype amp;          /* --amp: CT_F32 (off), CT_BF16, CT_F16 */
    const char *device;    /* --device: NULL (cpu), "cpu", "cuda", "cuda:N" or "auto" (syntax checked) */
} train_opts;

/* s is a whole number (integer / finite float) in [lo, hi]: for every subcommand's flags */
/* One line "ctrain CMD: FLAG expects WANT, got 'VAL'" on stderr; returns exit code 2. */
int cli_bad_value(const char *cmd, const char *flag, const char *val, const char *want);
bool cli_to_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
bool cli_to_f(const char *s, double lo, double hi, double *out);

/* Returns -1 to go on training, else the exit code (0 for --help, 2 for bad flags). */
int train_opts_parse(int argc, char **argv, train_opts *o);

/* Model flags, read from the kind's option table (models.h) for every subcommand that
 * builds a model. argv[*i] a flag of kind k: its value parsed into cfg (and *i past it,
 * set[] marked when not NULL): -1; not one of k's flags: 0; a bad value: 2 after one line
 * on stderr naming cmd. */
int cli_model_flag(const char *cmd, ct_model_kind k, int argc, char **argv, int *i, ct_model_config *cfg, bool *set);
/* "model (gpt): ..." lines for --help: every kind's flags with ctrain train's defaults */
void cli_model_flags_help(FILE *f);
#endif
