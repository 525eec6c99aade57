/* Options of `ctrain train`, parsed and checked in one place (train_opts.c). */
#ifndef CT_TRAIN_OPTS_H
#define CT_TRAIN_OPTS_H
#include "ctrain/config.h" /* CTRAIN_DATA_DIR, CTRAIN_OUTPUT_DIR */
#include "ctrain/models.h"

typedef struct {
    ct_model_kind kind;
    const char *data_dir, *text, *shards, *output_dir, *resume;
    const char *init_from;  /* --init-from FILE: start from these weights (their shape decides) */
    bool export_hf;         /* --export hf: also write OUTPUT/hf/ as a Hugging Face GPT-2 */
    int epochs;
    int64_t steps;
    int batch_size, grad_accum;
    double lr, momentum, weight_decay, clip, dropout;
    bool adamw, nesterov, keep_going_on_save_error;
    int schedule; /* 0 constant, 1 cosine, 2 linear */
    int64_t warmup;
    uint64_t seed;
    int64_t save_every, eval_every, eval_max;
    int keep, log_every, threads, workers;
    int n_layer, n_embd, n_head, vocab_size;
    int block_size;         /* 0 until --block-size: 64, or the --init-from model's context */
    int n_hidden, hidden[CT_MLP_MAX_HIDDEN];
    ct_dtype comm_dtype;
    bool flash, ckpt, loss_scaling;
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
#endif
