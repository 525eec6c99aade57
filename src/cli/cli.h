/* Subcommands of the `ctrain` command. Each returns the process exit code.
 * main.c owns the dispatch table; each subcommand lives in its own file. */
#ifndef CT_CLI_H
#define CT_CLI_H
#include "ctrain/config.h" /* every subcommand reads its environment through it */
int cli_env(int argc, char **argv);    /* ctrain env [--check|--vars]  (env.c)   */
int cli_run(int argc, char **argv);    /* ctrain run [torchrun flags] ... (run.c) */
int cli_train(int argc, char **argv);  /* ctrain train mlp|cnn|gpt ... (train.c) */
int cli_quantize(int argc, char **argv); /* ctrain quantize --checkpoint ... (quantize.c) */
int cli_bench(int argc, char **argv);  /* ctrain bench allreduce|...   (bench.c) */
int cli_worker(int argc, char **argv); /* ctrain worker MODE: launcher test programs (worker.c) */
int cli_eval(int argc, char **argv);   /* ctrain eval --checkpoint ...  (eval.c)     */
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
#endif
