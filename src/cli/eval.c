/* ctrain eval --checkpoint DIR|FILE — a trained model on its test data: loss and accuracy
 * for image models, loss, perplexity and next-token accuracy for token models (the kind says
 * which, models.h). The model's shape comes from the file (ctrain's metadata, or a Hugging
 * Face checkpoint's layout and config.json). */
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/train_opts.h"
#include "ctrain/ctrain.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain eval --checkpoint DIR|FILE [options]\n"
            "Evaluates a trained model: test loss and accuracy (image models: mlp, cnn); loss, perplexity\n"
            "and next-token accuracy (token models: gpt).\n\n"
            "  --checkpoint DIR|FILE  model.safetensors, an output directory (its model.safetensors or newest\n"
            "                         checkpoint) or a checkpoint directory; a Hugging Face checkpoint works too\n"
            "  --data-dir DIR         image models: IDX files (default $CTRAIN_DATA_DIR or /usr/share/datasets/fashion-mnist)\n"
            "  --text FILE|GLOB       token models: text, tokenized with the model's tokenizer (the tokenizer.json\n"
            "                         kept next to its weights, or --tokenizer); a model of vocabulary 256\n"
            "                         without one reads bytes as tokens\n"
            "  --tokenizer DIR|FILE   the tokenizer for --text, over the one next to the weights\n"
            "  --shards GLOB          token models: llm.c token shards (.bin)\n"
            "  --split test|train|all which part: test (default: the IDX test files, or the held-out last 5%%\n"
            "                         of a text as `ctrain train` evaluates), train, or all (token models)\n"
            "  --block-size T         token models: sequence length (default the model's)\n"
            "  --batch-size B         (default 64)   --eval-max N  at most N samples (default all)\n"
            "  --threads N            (default OMP_NUM_THREADS or the cores)\n"
            "  --device D             cpu (default), cuda, cuda:N or auto: where the model runs (cuda: the\n"
            "                         GPU of LOCAL_RANK, as in ctrain train; auto: a GPU if there is one)\n");
}

static int fail(const char *msg) {
    fprintf(stderr, "ctrain eval: %s\n", msg);
    return 1;
}

static int badv(const char *flag, const char *v, const char *want) { return cli_bad_value("eval", flag, v, want); }

static ct_status open_tokens(const char *text, const ct_tokenizer *tok, const char *shards, int T, ct_dataset **out) {
    if (text && tok) return cli_text_dataset(tok, text, T, out);
    if (text) return ct_dataset_text_open(text, T, out);
    glob_t g;
    if (glob(shards, 0, NULL, &g) != 0 || g.gl_pathc == 0) return ct_error(CT_ERR_NOT_FOUND, "--shards %s matches no file", shards);
    ct_status st = ct_dataset_tokens_open((const char *const *)g.gl_pathv, (int)g.gl_pathc, T, out);
    globfree(&g);
    return st;
}

int cli_eval(int argc, char **argv) {
    const char *ckpt = NULL, *text = NULL, *shards = NULL, *split = "test", *device = NULL, *tok_arg = NULL;
    const char *env_data = ct_config_str(CT_CFG_DATA_DIR);
    const char *data_dir = env_data && *env_data ? env_data : "/usr/share/datasets/fashion-mnist";
    int64_t batch = 64, eval_max = 0, threads = 0, block = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); return 0; }
        bool takes = !strcmp(f, "--checkpoint") || !strcmp(f, "--data-dir") || !strcmp(f, "--text") || !strcmp(f, "--shards") ||
                     !strcmp(f, "--split") || !strcmp(f, "--batch-size") || !strcmp(f, "--eval-max") || !strcmp(f, "--threads") ||
                     !strcmp(f, "--block-size") || !strcmp(f, "--device") || !strcmp(f, "--tokenizer");
        if (!takes) {
            fprintf(stderr, "ctrain eval: unknown option '%s' (see ctrain eval --help)\n", f);
            return 2;
        }
        if (!v) return badv(f, NULL, "a value");
        i++;
        if (!strcmp(f, "--checkpoint")) ckpt = v;
        else if (!strcmp(f, "--data-dir")) data_dir = v;
        else if (!strcmp(f, "--text")) text = v;
        else if (!strcmp(f, "--tokenizer")) tok_arg = v;
        else if (!strcmp(f, "--shards")) shards = v;
        else if (!strcmp(f, "--device")) {
            ct_device dv;
            if (strcmp(v, "auto") && ct_device_parse(v, &dv) != CT_OK) return badv(f, v, "cpu, cuda, cuda:N or auto");
            device = v;
        }
        else if (!strcmp(f, "--split")) {
            if (strcmp(v, "test") && strcmp(v, "train") && strcmp(v, "all")) return badv(f, v, "test, train or all");
            split = v;
        } else if (!strcmp(f, "--batch-size")) { if (!cli_to_i64(v, 1, 1048576, &batch)) return badv(f, v, "an integer in [1, 1048576]"); }
        else if (!strcmp(f, "--eval-max")) { if (!cli_to_i64(v, 0, 1000000000, &eval_max)) return badv(f, v, "an integer in [0, 1000000000]"); }
        else if (!strcmp(f, "--threads")) { if (!cli_to_i64(v, 1, 1024, &threads)) return badv(f, v, "an integer in [1, 1024]"); }
        else if (!cli_to_i64(v, 1, 65536, &block)) return badv(f, v, "an integer in [1, 65536]");
    }
    if (!ckpt) { usage(stderr); return 2; }
    if (text && shards) return badv("--text", text, "either --text or --shards, not both");
    ct_set_num_threads(threads > 0 ? (int)threads : ct_default_num_threads());
    /* the local rank picks the GPU of `--device cuda`, as for ctrain train (0 when alone) */
    ct_dist_world dw = {0};
    if (device && ct_dist_detect(&dw) != CT_OK) dw.local_rank = 0;
    ct_device dev;
    int rc = cli_resolve_device(device, dw.local_rank, "ctrain eval", &dev);
    if (rc >= 0) return rc;

    char path[4400];
    ct_model *m = NULL;
    ct_dataset *all = NULL, *train = NULL, *test = NULL;
    const ct_dataset *d = NULL;
    ct_status st = cli_open_model(ckpt, &m, path, sizeof path);
    if (st != CT_OK) return fail(ct_last_error());
    const ct_model_config *c = ct_model_config_of(m);
    const ct_model_kind_info *ki = ct_model_kind_info_of(c->kind);
    ct_model_batch mb = ct_model_batch_of(c); /* what the model takes */
    bool tokens = ki->data == CT_MODEL_DATA_TOKENS;
    if (tokens) {
        if (!text && !shards) {
            char msg[128];
            snprintf(msg, sizeof msg, "a %s needs --text FILE or --shards GLOB", ki->name);
            ct_model_free(m);
            return fail(msg);
        }
        if (mb.x_max_len > 0 && block > mb.x_max_len) {
            fprintf(stderr, "ctrain eval: --block-size %lld is longer than the model's context (%lld)\n", (long long)block, (long long)mb.x_max_len);
            ct_model_free(m);
            return 2;
        }
        cli_tokenizer tk = {0};
        if (text) st = cli_text_tokenizer(tok_arg, path, mb.vocab, &tk);
        if (st == CT_OK) st = open_tokens(text, tk.tok, shards, (int)(block > 0 ? block : mb.x_max_len), &all);
        cli_tokenizer_close(&tk);
        if (st == CT_OK && ct_dataset_num_classes(all) > mb.vocab)
            st = ct_error(CT_ERR_INVALID, "the data has token ids up to %d but the model's vocabulary is %lld", ct_dataset_num_classes(all) - 1,
                          (long long)mb.vocab);
        if (st == CT_OK && strcmp(split, "all")) st = ct_dataset_split_holdout(all, &train, &test);
        d = !strcmp(split, "all") ? all : !strcmp(split, "train") ? train : test;
    } else {
        if (text || shards) {
            char msg[256] = "--text and --shards are for a";
            for (int k = 0, n = 0; k < ct_model_kind_count(); k++)
                if (ct_model_kind_info_of((ct_model_kind)k)->data == CT_MODEL_DATA_TOKENS)
                    snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "%s %s", n++ ? " or" : "", ct_model_kind_name((ct_model_kind)k));
            snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "; this model takes --data-dir");
            ct_model_free(m);
            return fail(msg);
        }
        if (!strcmp(split, "all")) { ct_model_free(m); return badv("--split", split, "test or train for an image model"); }
        st = ct_dataset_idx_open_dir(data_dir, !strcmp(split, "train"), &test);
        d = test; /* its shape against the model's: ct_train_check_data below, as the trainer does */
    }
    /* the weights to the device; ct_evaluate moves each batch there and its loss back */
    if (st == CT_OK && dev.type != CT_DEV_CPU) st = ct_params_to(ct_model_params(m), dev);
    ct_eval_report r;
    ct_train_model tm = ct_train_model_builtin(m);
    /* what the trainer checks before its first step: a label beyond the model's classes
     * (or a token beyond its vocabulary) would abort the forward */
    if (st == CT_OK) st = ct_train_check_data(&tm, d);
    /* an empty set has no mean loss: NaN and exit 0 would read as a result */
    if (st == CT_OK && ct_dataset_len(d) == 0)
        st = ct_error(CT_ERR_INVALID, "%s: no samples to evaluate in the %s split%s", ct_dataset_source(d), split,
                      tokens ? " (each part of a text needs more tokens than the model's context)" : "");
    if (st == CT_OK) {
        ct_eval_opts eo = ct_eval_default_opts();
        eo.batch_size = (int)batch;
        eo.max_samples = eval_max;
        double t0 = ct_time_now();
        st = ct_evaluate(&tm, d, &eo, NULL, &r);
        double s = ct_time_now() - t0;
        if (st == CT_OK) {
            printf("%s\n%s%s\n", path, ct_model_describe(m), ct_model_is_quantized(m) ? " | int8 Linears (dynamic quantization)" : "");
            if (dev.type != CT_DEV_CPU) printf("device: %s\n", device);
            if (tokens)
                printf("%s split: %lld tokens | loss %.4f | perplexity %.3f | next-token accuracy %.4f | %.1f s\n", split, (long long)r.count, r.loss,
                       exp(r.loss), r.accuracy, s);
            else
                printf("%s split: %lld samples | loss %.4f | accuracy %.4f | %.1f s\n", split, (long long)r.count, r.loss, r.accuracy, s);
        }
    }
    rc = st == CT_OK ? 0 : fail(ct_last_error());
    ct_dataset_free(train);
    ct_dataset_free(test);
    ct_dataset_free(all);
    ct_model_free(m);
    return rc;
}
