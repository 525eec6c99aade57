/* ctrain quantize — dynamic int8 quantization of a trained model (torch.ao.quantization.
 * quantize_dynamic): f32 weights in (a checkpoint directory or a model.safetensors), a
 * quantized safetensors out, which is then loaded back through the library; with
 * --eval-data, f32 vs int8 accuracy, speed and size on the Fashion-MNIST test set. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/train_opts.h"
#include "ctrain/ctrain.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain quantize --checkpoint DIR|model.safetensors --model KIND --output FILE [options]\n"
            "Replaces every Linear by a dynamically quantized int8 one, as PyTorch's\n"
            "quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8) with fbgemm, and writes it.\n\n"
            "  --checkpoint PATH    a checkpoint directory (step-*/, holding model.safetensors) or a weights file\n"
            "  --model KIND         the model's kind, with the model flags it was trained with (below)\n"
            "  --output FILE        the quantized model (safetensors: I8 weights, F32 scales, I64 zero points, F32 biases)\n"
            "  --per-channel        one weight scale per output row (default: one per tensor)\n"
            "  --eval-data DIR      image models: Fashion-MNIST test set (t10k-*): f32 vs int8 accuracy, samples/s, size\n"
            "  --eval-max N         evaluate on the first N test samples (default all)\n"
            "  --batch-size B       evaluation batch (default 256)\n"
            "  --threads N          (default OMP_NUM_THREADS or all cores)\n");
    cli_model_flags_help(f);
}

static int bad(const char *flag, const char *v, const char *want) { return cli_bad_value("quantize", flag, v, want); }

/* cli_to_i64 into the int fields of the model config */
static bool to_int(const char *s, long lo, long hi, int *out) {
    int64_t v;
    if (!cli_to_i64(s, lo, hi, &v)) return false;
    *out = (int)v;
    return true;
}

typedef struct { double acc, per_s; int64_t n; } eval_result;

/* accuracy and forward throughput over the first n samples of d, in batches of bs */
static eval_result evaluate(ct_model *m, const ct_dataset *d, int64_t n, int bs) {
    ct_ctx *ctx;
    eval_result r = {0, 0, 0};
    if (ct_ctx_create(NULL, &ctx) != CT_OK) return r;
    ct_ctx_set_training(ctx, false);
    ct_set_grad_enabled(ctx, false); /* inference: no tape */
    int64_t dims[4], xn = ct_dataset_x_numel(d);
    int nd = ct_dataset_x_shape(d, dims + 1);
    float *x = malloc((size_t)(bs * xn) * sizeof *x);
    int32_t *y = malloc((size_t)bs * sizeof *y);
    int64_t correct = 0;
    double secs = 0;
    for (int64_t i = 0; x && y && i < n; i += bs) {
        int64_t b = n - i < bs ? n - i : bs;
        for (int64_t k = 0; k < b; k++) ct_dataset_get(d, i + k, x + k * xn, y + k);
        dims[0] = b;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ct_tensor *logits = ct_model_forward(ctx, m, ct_wrap(ctx, CT_F32, x, nd + 1, dims));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        secs += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        int64_t C = logits->shape[1];
        for (int64_t k = 0; k < b; k++) {
            const float *l = ct_f32(logits) + k * C;
            int64_t best = 0;
            for (int64_t c = 1; c < C; c++) best = l[c] > l[best] ? c : best;
            correct += best == y[k];
        }
        ct_ctx_reset(ctx);
    }
    r.n = n;
    r.acc = n ? 100.0 * (double)correct / (double)n : 0;
    r.per_s = secs > 0 ? (double)n / secs : 0;
    free(x);
    free(y);
    ct_ctx_free(ctx);
    return r;
}

int cli_quantize(int argc, char **argv) {
    const char *ckpt = NULL, *kind_s = NULL, *out = NULL, *eval_dir = NULL;
    int threads = 0, eval_max = 0, bs = 256;
    bool per_channel = false;
    /* the kind first: its option table says which flags are model flags */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--model")) kind_s = argv[i + 1];
    ct_model_kind kind = (ct_model_kind)0; /* until --model says */
    char kinds[128];
    if (kind_s && ct_model_kind_parse(kind_s, &kind) != CT_OK) return bad("--model", kind_s, ct_model_kind_list(kinds, sizeof kinds));
    /* ctrain train's defaults (the shape flags mean the same here) */
    ct_model_config cfg = ct_model_cli_config(kind);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); return 0; }
        if (!strcmp(f, "--per-channel")) { per_channel = true; continue; }
        int mrc = kind_s ? cli_model_flag("quantize", kind, argc, argv, &i, &cfg, NULL) : 0;
        if (mrc > 0) return mrc;
        if (mrc < 0) continue;
        if (!v) return bad(f, NULL, "a value");
        i++;
        if (!strcmp(f, "--checkpoint")) ckpt = v;
        else if (!strcmp(f, "--model")) kind_s = v;
        else if (!strcmp(f, "--output")) out = v;
        else if (!strcmp(f, "--eval-data")) eval_dir = v;
        else if (!strcmp(f, "--threads")) { if (!to_int(v, 1, 1024, &threads)) return bad(f, v, "an integer in [1, 1024]"); }
        else if (!strcmp(f, "--eval-max")) { if (!to_int(v, 1, 1 << 30, &eval_max)) return bad(f, v, "a positive integer"); }
        else if (!strcmp(f, "--batch-size")) { if (!to_int(v, 1, 1 << 16, &bs)) return bad(f, v, "an integer in [1, 65536]"); }
        else {
            fprintf(stderr, "ctrain quantize: unknown option '%s' (see ctrain quantize --help)\n", f);
            return 2;
        }
    }
    if (!ckpt || !kind_s || !out) {
        usage(stderr);
        fprintf(stderr, "ctrain quantize: --checkpoint, --model and --output are required\n");
        return 2;
    }
    if (eval_dir && ct_model_kind_info_of(kind)->data != CT_MODEL_DATA_IMAGES) {
        fprintf(stderr, "ctrain quantize: --eval-data evaluates image models on Fashion-MNIST, not a %s\n", kind_s);
        return 2;
    }
    ct_set_num_threads(threads > 0 ? threads : ct_default_num_threads());

    char wpath[4096];
    struct stat sb;
    if (stat(ckpt, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(wpath, sizeof wpath, "%s/model.safetensors", ckpt);
    else snprintf(wpath, sizeof wpath, "%s", ckpt);

    int rc = 1;
    ct_model *f32 = NULL, *q = NULL;
    ct_dataset *test = NULL;
    /* the flags' model against the file's tensors before it is allocated */
    ct_status st = ct_model_config_fits_file(&cfg, wpath, "the flags describe");
    if (st == CT_OK) st = ct_model_create(&cfg, 0, &f32);
    if (st == CT_OK) st = ct_model_load(f32, wpath);
    if (st != CT_OK) goto fail;
    size_t f32_bytes = ct_model_weight_bytes(f32);
    /* quantize a second copy, so that the f32 model stays for the comparison */
    ct_quantize_opts qo = ct_quantize_default_opts();
    qo.per_channel = per_channel;
    if ((st = ct_model_create(&cfg, 0, &q)) != CT_OK || (st = ct_model_load(q, wpath)) != CT_OK ||
        (st = ct_model_quantize_dynamic(q, &qo)) != CT_OK || (st = ct_model_save_quantized(q, out)) != CT_OK)
        goto fail;
    size_t q_bytes = ct_model_weight_bytes(q);
    /* what gets evaluated is the file, loaded back the way a user would */
    ct_model_free(q);
    q = NULL;
    if ((st = ct_model_create(&cfg, 0, &q)) != CT_OK || (st = ct_model_load_quantized(q, out)) != CT_OK) goto fail;
    printf("%s\n", ct_model_describe(f32));
    printf("quantized every Linear to int8 (%s weights, activations per call, kernel %s)\n",
           per_channel ? "per-channel" : "per-tensor", ct_qgemm_kernel_name());
    printf("wrote %s: weights %.2f MB (f32 %.2f MB, %.2fx smaller)\n", out, (double)q_bytes / 1e6, (double)f32_bytes / 1e6,
           (double)f32_bytes / (double)q_bytes);
    if (eval_dir) {
        st = ct_dataset_idx_open_dir(eval_dir, false, &test);
        if (st == CT_ERR_NOT_FOUND)
            st = ct_error(st, "no t10k-images-idx3-ubyte(.gz) in --eval-data %s (Fashion-MNIST: apt-get install dataset-fashion-mnist)", eval_dir);
        if (st != CT_OK) goto fail;
        int64_t n = ct_dataset_len(test);
        if (eval_max > 0 && eval_max < n) n = eval_max;
        evaluate(q, test, n < bs ? n : bs, bs); /* warm-up: first-touch pages and thread start */
        eval_result a = evaluate(f32, test, n, bs), b = evaluate(q, test, n, bs);
        printf("\n%lld test samples, batch %d, %d thread%s:\n", (long long)n, bs, ct_get_num_threads(), ct_get_num_threads() > 1 ? "s" : "");
        printf("  %-6s %9s %12s %12s\n", "model", "accuracy", "samples/s", "weights");
        printf("  %-6s %8.2f%% %12.0f %9.2f MB\n", "f32", a.acc, a.per_s, (double)f32_bytes / 1e6);
        printf("  %-6s %8.2f%% %12.0f %9.2f MB\n", "int8", b.acc, b.per_s, (double)q_bytes / 1e6);
        printf("  int8 - f32: %+.2f points, %.2fx samples/s, %.2fx smaller\n", b.acc - a.acc, a.per_s > 0 ? b.per_s / a.per_s : 0,
               (double)f32_bytes / (double)q_bytes);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "ctrain quantize: %s\n", ct_last_error());
done:
    ct_dataset_free(test);
    ct_model_free(q);
    ct_model_free(f32);
    return rc;
}
