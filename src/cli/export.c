/* ctrain export — a trained model whole, from any checkpoint: a sharded one (--shard) is
 * assembled from its ranks' shards into one model.safetensors (ctrain's names, which
 * PyTorch loads with load_state_dict(strict=True)), and --hf also writes the Hugging Face
 * directory transformers loads. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "ctrain/ctrain.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain export --checkpoint DIR|FILE (--output FILE | --hf DIR)\n"
            "Writes a model whole from a checkpoint, sharded (--shard) or not.\n\n"
            "  --checkpoint PATH    an output directory (its newest checkpoint when it has no model.safetensors),\n"
            "                       a checkpoint directory (step-*/) or a weights file\n"
            "  --output FILE        the consolidated weights (safetensors, with the model's config)\n"
            "  --hf DIR             also (or instead) a Hugging Face directory (GPT, Llama)\n");
}

int cli_export(int argc, char **argv) {
    const char *ckpt = NULL, *output = NULL, *hf = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        const char **dst = !strcmp(a, "--checkpoint") ? &ckpt : !strcmp(a, "--output") ? &output : !strcmp(a, "--hf") ? &hf : NULL;
        if (!dst) {
            fprintf(stderr, "ctrain export: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) { fprintf(stderr, "ctrain export: %s needs a value\n", a); return 2; }
        *dst = argv[++i];
    }
    if (!ckpt || (!output && !hf)) {
        fprintf(stderr, "ctrain export: --checkpoint and --output (or --hf) are required\n");
        usage(stderr);
        return 2;
    }
    ct_model *m;
    char path[4300];
    ct_status st = cli_open_model(ckpt, &m, path, sizeof path);
    if (st != CT_OK) { fprintf(stderr, "ctrain export: %s\n", ct_last_error()); return 1; }
    if (output && (st = ct_model_save(m, output)) == CT_OK) printf("wrote %s (from %s)\n", output, path);
    if (st == CT_OK && hf && (st = ct_model_save_hf(m, hf)) == CT_OK) printf("wrote %s/ (Hugging Face layout, from %s)\n", hf, path);
    if (st != CT_OK) fprintf(stderr, "ctrain export: %s\n", ct_last_error());
    ct_model_free(m);
    return st == CT_OK ? 0 : 1;
}
