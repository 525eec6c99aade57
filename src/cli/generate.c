/* ctrain generate --checkpoint DIR|FILE --prompt TEXT | --prompt-tokens 1,2,3 — text (or
 * token ids) from a trained GPT: greedy at temperature 0, else sampled (top-k), seeded, with
 * a KV cache. The tokens stream to stdout as they come; the speed goes to stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/train_opts.h"
#include "ctrain/ctrain.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain generate --checkpoint DIR|FILE (--prompt TEXT | --prompt-tokens IDS) [options]\n"
            "Continues a prompt with a trained GPT: text through the model's tokenizer (the tokenizer.json kept\n"
            "next to its weights, or --tokenizer), or bytes as tokens for a byte-level model.\n\n"
            "  --checkpoint DIR|FILE  model.safetensors, an output or checkpoint directory, or a GPT-2 checkpoint\n"
            "  --prompt TEXT          text: prints the prompt and its continuation, decoded token by token\n"
            "  --tokenizer DIR|FILE   the tokenizer for --prompt, over the one next to the weights (without\n"
            "                         either, only a model of vocabulary 256 takes --prompt: bytes as tokens)\n"
            "  --prompt-tokens IDS    token ids, comma-separated (1,2,3): prints the new ids, comma-separated\n"
            "  --max-new-tokens N     (default 100)\n"
            "  --temperature T        (default 1.0; 0 = greedy: always the most likely token)\n"
            "  --top-k K              sample among the K most likely tokens (default 0: all)\n"
            "  --seed S               same seed, same output (default 1337)\n"
            "  --no-kv-cache          a full forward over the context for every token (slower; for comparison)\n"
            "  --logits FILE          also write the prompt's logits (one full forward) to FILE as safetensors:\n"
            "                         input_ids [1, T] I64 and logits [1, T, vocab] F32, to compare with another\n"
            "                         implementation (e.g. transformers on an --export hf copy)\n"
            "  --threads N            (default OMP_NUM_THREADS or the cores)\n");
}

/* the prompt's logits from one full forward, as safetensors (input_ids I64, logits F32) */
static ct_status dump_logits(ct_model *m, const int32_t *ids, int n, const char *path) {
    int B = (int)ct_model_batch_of(ct_model_config_of(m)).x_max_len;
    if (n > B) return ct_error(CT_ERR_INVALID, "--logits: the prompt has %d tokens, more than the model's context (%d)", n, B);
    /* the forward's embedding would abort on it; ct_model_generate's message */
    int V = (int)ct_model_batch_of(ct_model_config_of(m)).vocab;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) return ct_error(CT_ERR_INVALID, "prompt token %d at position %d is outside the vocabulary [0, %d)", ids[i], i, V);
    ct_ctx *ctx;
    ct_status st = ct_ctx_create(NULL, &ctx);
    if (st != CT_OK) return st;
    ct_set_grad_enabled(ctx, false);
    ct_ctx_set_training(ctx, false);
    int32_t *x = (int32_t *)ids;
    ct_tensor *logits = ct_model_forward(ctx, m, ct_wrap(ctx, CT_I32, x, 2, (int64_t[]){1, n}));
    int64_t *ids64 = malloc(sizeof *ids64 * (size_t)n);
    ct_st_writer *w = NULL;
    if (!ids64 || ct_st_writer_create(&w) != CT_OK) st = ct_error(CT_ERR_NOMEM, "out of memory");
    for (int i = 0; st == CT_OK && i < n; i++) ids64[i] = ids[i];
    if (st == CT_OK) st = ct_st_writer_add(w, "input_ids", CT_I64, 2, (int64_t[]){1, n}, ids64);
    if (st == CT_OK) st = ct_st_writer_add(w, "logits", CT_F32, 3, logits->shape, logits->data);
    if (st == CT_OK) st = ct_st_writer_set_metadata(w, "format", "pt");
    if (st == CT_OK) st = ct_st_writer_save(w, path);
    ct_st_writer_free(w);
    free(ids64);
    ct_ctx_free(ctx);
    return st;
}

static int badv(const char *flag, const char *v, const char *want) { return cli_bad_value("generate", flag, v, want); }

typedef struct {
    bool text;
    const ct_tokenizer *tok; /* text: each token's bytes through it, else the token is a byte */
    int n;
} out_state;

static bool print_token(int32_t tok, void *user) {
    out_state *o = user;
    const char *bytes;
    size_t len;
    /* the text is the concatenation of each token's bytes, so a token can be printed as it
     * comes (a character split across tokens completes with the next); token by token, not
     * ct_tokenizer_decode, which drops a SentencePiece text's first space */
    if (o->text && o->tok && ct_tokenizer_token_bytes(o->tok, tok, &bytes, &len) == CT_OK)
        fwrite(bytes, 1, len, stdout);
    else if (o->text) putchar(tok);
    else printf("%s%d", o->n ? "," : "", tok);
    o->n++;
    fflush(stdout);
    return true;
}

/* "1,2,3" → ids (malloc'd); false for anything else */
static bool parse_ids(const char *s, int32_t **ids, int *n) {
    size_t cap = strlen(s) / 2 + 1;
    *ids = malloc(cap * sizeof **ids);
    *n = 0;
    if (!*ids || !*s) return false;
    char *buf = strdup(s);
    if (!buf) return false;
    bool ok = true;
    for (char *t = buf, *e; ok; t = e + 1) {
        e = strchr(t, ',');
        if (e) *e = 0;
        int64_t v;
        ok = (size_t)*n < cap && cli_to_i64(t, 0, 2147483647, &v);
        if (ok) (*ids)[(*n)++] = (int32_t)v;
        if (!e) break;
    }
    free(buf);
    return ok;
}

/* --prompt TEXT as ids: through the tokenizer (--tokenizer, else the weights' own), or its
 * bytes for a byte-level model without one */
static ct_status encode_prompt(const char *prompt, const char *tok_arg, const char *weights, int64_t vocab, cli_tokenizer *tk, int32_t **ids,
                               int *nids) {
    ct_status st = cli_text_tokenizer(tok_arg, weights, vocab, tk);
    if (st != CT_OK) return st;
    size_t len = strlen(prompt), n = len;
    if (tk->tok) st = ct_tokenizer_encode_alloc(tk->tok, prompt, len, ids, &n);
    else if (!(*ids = malloc(sizeof **ids * len))) st = ct_error(CT_ERR_NOMEM, "out of memory");
    else
        for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)prompt[i];
    if (st == CT_OK && n > (size_t)INT32_MAX) st = ct_error(CT_ERR_INVALID, "--prompt: %zu tokens is too long", n);
    if (st == CT_OK && n == 0) st = ct_error(CT_ERR_INVALID, "--prompt '%s' encodes to no tokens", prompt);
    *nids = (int)n;
    return st;
}

int cli_generate(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = NULL, *tokens = NULL, *logits_path = NULL, *tok_arg = NULL;
    ct_generate_opts go = ct_generate_default_opts();
    int64_t n, threads = 0;
    double d;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); return 0; }
        if (!strcmp(f, "--no-kv-cache")) { go.kv_cache = false; continue; }
        bool takes = !strcmp(f, "--checkpoint") || !strcmp(f, "--prompt") || !strcmp(f, "--prompt-tokens") || !strcmp(f, "--max-new-tokens") ||
                     !strcmp(f, "--temperature") || !strcmp(f, "--top-k") || !strcmp(f, "--seed") || !strcmp(f, "--threads") || !strcmp(f, "--logits") ||
                     !strcmp(f, "--tokenizer");
        if (!takes) {
            fprintf(stderr, "ctrain generate: unknown option '%s' (see ctrain generate --help)\n", f);
            return 2;
        }
        if (!v) return badv(f, NULL, "a value");
        i++;
        if (!strcmp(f, "--checkpoint")) ckpt = v;
        else if (!strcmp(f, "--prompt")) prompt = v;
        else if (!strcmp(f, "--prompt-tokens")) tokens = v;
        else if (!strcmp(f, "--logits")) logits_path = v;
        else if (!strcmp(f, "--tokenizer")) tok_arg = v;
        else if (!strcmp(f, "--max-new-tokens")) { if (!cli_to_i64(v, 0, 1000000, &n)) return badv(f, v, "an integer in [0, 1000000]"); go.max_new_tokens = (int)n; }
        else if (!strcmp(f, "--temperature")) { if (!cli_to_f(v, 0, 100, &d)) return badv(f, v, "a number in [0, 100]"); go.temperature = d; }
        else if (!strcmp(f, "--top-k")) { if (!cli_to_i64(v, 0, 1000000000, &n)) return badv(f, v, "an integer >= 0"); go.top_k = (int)n; }
        else if (!strcmp(f, "--seed")) { if (!cli_to_i64(v, 0, 4294967295LL, &n)) return badv(f, v, "an integer in [0, 4294967295]"); go.seed = (uint64_t)n; }
        else if (!cli_to_i64(v, 1, 1024, &threads)) return badv(f, v, "an integer in [1, 1024]");
    }
    if (!ckpt || (!prompt && !tokens)) {
        usage(stderr);
        return 2;
    }
    if (prompt && tokens) return badv("--prompt", prompt, "either --prompt or --prompt-tokens, not both");
    if (prompt && !*prompt) return badv("--prompt", prompt, "at least one character");
    int32_t *ids = NULL;
    int nids = 0;
    if (tokens && !parse_ids(tokens, &ids, &nids)) {
        free(ids);
        return badv("--prompt-tokens", tokens, "comma-separated token ids, e.g. 1,2,3");
    }
    ct_set_num_threads(threads > 0 ? (int)threads : ct_default_num_threads());
    char path[4400];
    ct_model *m = NULL;
    ct_status st = cli_open_model(ckpt, &m, path, sizeof path);
    if (st == CT_OK && !ct_model_kind_info_of(ct_model_config_of(m)->kind)->generates) {
        char kinds[256] = ""; /* "a gpt or a llama": the kinds that generate */
        for (int k = 0, n = 0; k < ct_model_kind_count(); k++)
            if (ct_model_kind_info_of((ct_model_kind)k)->generates) {
                size_t o = strlen(kinds);
                snprintf(kinds + o, sizeof kinds - o, "%sa %s", n++ ? " or " : "", ct_model_kind_name((ct_model_kind)k));
            }
        st = ct_error(CT_ERR_INVALID, "%s holds a %s: generate needs %s", path, ct_model_kind_name(ct_model_config_of(m)->kind), kinds);
    }
    cli_tokenizer tk = {0};
    if (st == CT_OK && prompt) st = encode_prompt(prompt, tok_arg, path, ct_model_batch_of(ct_model_config_of(m)).vocab, &tk, &ids, &nids);
    int32_t *out = st == CT_OK ? malloc(sizeof *out * (size_t)(go.max_new_tokens + 1)) : NULL;
    if (st == CT_OK && !out) st = ct_error(CT_ERR_NOMEM, "out of memory");
    if (st == CT_OK && logits_path) st = dump_logits(m, ids, nids, logits_path);
    out_state os = {.text = prompt != NULL, .tok = tk.tok};
    ct_generate_stats gs = {0};
    if (st == CT_OK) {
        go.on_token = print_token;
        go.user = &os;
        if (prompt) fputs(prompt, stdout);
        st = ct_model_generate(m, ids, nids, &go, out, &gs);
        if (st == CT_OK || os.n) putchar('\n');
        fflush(stdout); /* before the speed line on stderr */
    }
    if (st == CT_OK)
        fprintf(stderr, "%lld tokens in %.3f s: %.0f tokens/s (%s, %d thread%s)\n", (long long)gs.new_tokens, gs.seconds,
                gs.seconds > 0 ? (double)gs.new_tokens / gs.seconds : 0.0, go.kv_cache ? "KV cache" : "no KV cache", ct_get_num_threads(),
                ct_get_num_threads() > 1 ? "s" : "");
    else
        fprintf(stderr, "ctrain generate: %s\n", ct_last_error());
    free(ids);
    free(out);
    cli_tokenizer_close(&tk);
    ct_model_free(m);
    return st == CT_OK ? 0 : 1;
}
