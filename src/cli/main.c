/* ctrain: one command, several subcommands (git style). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "ctrain/config.h"
#include "ctrain/core.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} cmds[] = {
    {"env", cli_env, "show version, build options, CPU, BLAS and backends (--check: test a 2-rank all-reduce)"},
    {"run", cli_run, "launch a multi-process job (torchrun's flags)"},
    {"train", cli_train, "train a built-in model (ctrain train --help lists the kinds and their flags)"},
    {"tokenize", cli_tokenize, "text files to llm.c token shards with a tokenizer (tokenizer.json)"},
    {"eval", cli_eval, "evaluate a trained model: test loss and accuracy (token models: loss and perplexity)"},
    {"generate", cli_generate, "generate text or tokens from a trained GPT (KV cache, temperature, top-k)"},
    {"quantize", cli_quantize, "dynamic int8 quantization of a trained model (--eval-data: f32 vs int8)"},
    {"export", cli_export, "a model whole from a checkpoint, sharded or not (--output FILE, --hf DIR)"},
    {"bench", cli_bench, "benchmarks: allreduce (nccl-tests style)"},
    {"worker", cli_worker, "tiny distributed programs for testing the launcher"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: ctrain <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) fprintf(f, "  %-9s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "\n'ctrain <command> --help' shows a command's options. ctrain %s\n", CT_VERSION_STRING);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) { printf("ctrain %s\n", CT_VERSION_STRING); return 0; }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        if (strcmp(argv[1], cmds[i].name)) continue;
        /* every variable is checked before any command starts: one line, instead of a
         * warning per rank or a failure report from every worker */
        if (ct_config_load() != CT_OK) {
            fprintf(stderr, "ctrain: %s\n", ct_last_error());
            return 2;
        }
        return cmds[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "ctrain: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
