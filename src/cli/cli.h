/* Subcommands of the `ctrain` command. Each returns the process exit code.
 * main.c owns the dispatch table; each subcommand lives in its own file. */
#ifndef CT_CLI_H
#define CT_CLI_H
#include "ctrain/config.h" /* every subcommand reads its environment through it */
int cli_env(int argc, char **argv);    /* ctrain env [--check|--vars]  (env.c)   */
int cli_run(int argc, char **argv);    /* ctrain run [torchrun flags] ... (run.c) */
int cli_train(int argc, char **argv);  /* ctrain train mlp|cnn|gpt ... (train.c) */
int cli_quantize(int argc, char **argv); /* ctrain quantize --checkpoint ... (quantize.c) */
int cli_export(int argc, char **argv);   /* ctrain export --checkpoint ... (export.c) */
int cli_bench(int argc, char **argv);  /* ctrain bench allreduce|...   (bench.c) */
int cli_worker(int argc, char **argv); /* ctrain worker MODE: launcher test programs (worker.c) */
int cli_eval(int argc, char **argv);   /* ctrain eval --checkpoint ...  (eval.c)     */
int cli_tokenize(int argc, char **argv); /* ctrain tokenize --tokenizer ... --output ... FILES (tokenize.c) */
int cli_generate(int argc, char **argv); /* ctrain generate --checkpoint ... --prompt ... (generate.c) */
/* The visible CUDA GPUs, or -1 after one line on stderr: "<who>: no CUDA GPU usable here (why)" (run.c) */
int cli_gpu_count(const char *who);
/* --device SPEC (cpu, cuda, cuda:N, auto; NULL: cpu) resolved for a process of local rank
 * local_rank: -1 with *dev set, or the exit code after one line on stderr naming cmd (run.c) */
#include "ctrain/tensor.h"
int cli_resolve_device(const char *spec, int local_rank, const char *cmd, ct_device *dev);

/* --checkpoint DIR|FILE: the weights file it names (path, n bytes) opened as a model
 * (model_file.c); a status with one line in ct_last_error() otherwise */
#include "ctrain/models.h"
ct_status cli_open_model(const char *arg, ct_model **out, char *path, size_t n);

/* Tokenizers and text (text_files.c). A tokenizer with the files it came from: what an
 * output directory keeps (tokenizer.json, or GPT-2's vocab.json + merges.txt). */
#include "ctrain/text.h"
typedef struct {
    ct_tokenizer *tok;      /* NULL: none */
    char files[2][4300];
    int nfiles;
} cli_tokenizer;
/* --tokenizer DIR|FILE: a tokenizer.json, or a directory holding one (or vocab.json + merges.txt) */
ct_status cli_tokenizer_open(const char *arg, cli_tokenizer *t);
/* The tokenizer kept next to a weights file (its directory, or the output directory of a
 * checkpoint's); t->tok NULL and CT_OK when there is none. */
ct_status cli_tokenizer_near(const char *weights, cli_tokenizer *t);
void cli_tokenizer_close(cli_tokenizer *t);
/* Copies the tokenizer's files into dir (which exists). */
ct_status cli_tokenizer_save(const cli_tokenizer *t, const char *dir);
/* CT_ERR_INVALID, one line, when the tokenizer has ids the model (named by `model`) has not. */
ct_status cli_tokenizer_fits(const cli_tokenizer *t, int64_t vocab, const char *model);
/* The tokenizer text is read with for a model of that vocabulary: --tokenizer arg (NULL:
 * none given), else the one kept next to the weights; t->tok NULL (bytes are tokens) only
 * for a vocabulary of 256, CT_ERR_INVALID otherwise or when the tokenizer does not fit. */
ct_status cli_text_tokenizer(const char *arg, const char *weights, int64_t vocab, cli_tokenizer *t);
/* The token put before each document: BOS, else EOS, else <|endoftext|>; -1 for none. */
int32_t cli_document_start(const ct_tokenizer *tok);
/* One text file as one document: the document start, then its tokens (malloc'd); *bytes
 * (when not NULL) its size. */
ct_status cli_tokenize_file(const ct_tokenizer *tok, const char *path, int32_t **ids, size_t *n, size_t *bytes);
/* The text files a glob matches (a plain name is read as it is), tokenized in order, as
 * one token dataset. */
#include "ctrain/data.h"
ct_status cli_text_dataset(const ct_tokenizer *tok, const char *pattern, int block_size, ct_dataset **out);
#endif
