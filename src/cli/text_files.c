/* Tokenizers for the commands: --tokenizer DIR|FILE, the one an output directory keeps next
 * to its weights, and text files turned into token ids (one document per file). */
#include <errno.h>
#include <glob.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "ctrain/data.h"

static bool is_file(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISREG(s.st_mode);
}

/* dir/tokenizer.json, else dir/vocab.json + dir/merges.txt; CT_ERR_NOT_FOUND when neither */
static ct_status open_dir(const char *dir, cli_tokenizer *t) {
    snprintf(t->files[0], sizeof t->files[0], "%s/tokenizer.json", dir);
    if (is_file(t->files[0])) {
        t->nfiles = 1;
        return ct_tokenizer_load(t->files[0], &t->tok);
    }
    snprintf(t->files[0], sizeof t->files[0], "%s/vocab.json", dir);
    snprintf(t->files[1], sizeof t->files[1], "%s/merges.txt", dir);
    if (is_file(t->files[0]) && is_file(t->files[1])) {
        t->nfiles = 2;
        return ct_tokenizer_load_gpt2(t->files[0], t->files[1], &t->tok);
    }
    return ct_error(CT_ERR_NOT_FOUND, "%s: no tokenizer.json (nor vocab.json + merges.txt) in it", dir);
}

ct_status cli_tokenizer_open(const char *arg, cli_tokenizer *t) {
    memset(t, 0, sizeof *t);
    struct stat s;
    if (stat(arg, &s) != 0) return ct_error(CT_ERR_NOT_FOUND, "--tokenizer %s: %s", arg, strerror(errno));
    if (S_ISDIR(s.st_mode)) return open_dir(arg, t);
    snprintf(t->files[0], sizeof t->files[0], "%s", arg);
    t->nfiles = 1;
    return ct_tokenizer_load(arg, &t->tok);
}

ct_status cli_tokenizer_near(const char *weights, cli_tokenizer *t) {
    memset(t, 0, sizeof *t);
    /* the weights' directory, then the output directory above a checkpoint's
     * (OUTPUT/checkpoints/step_N/model.safetensors): nowhere else, so that an unrelated
     * tokenizer.json higher up is never taken */
    char buf[4400];
    snprintf(buf, sizeof buf, "%s", weights);
    char *dir = dirname(buf);
    ct_status st = open_dir(dir, t);
    if (st != CT_ERR_NOT_FOUND) return st;
    dir = dirname(dir);
    const char *slash = strrchr(dir, '/');
    if (!strcmp(slash ? slash + 1 : dir, "checkpoints")) {
        st = open_dir(dirname(dir), t);
        if (st != CT_ERR_NOT_FOUND) return st;
    }
    memset(t, 0, sizeof *t);
    return CT_OK;
}

void cli_tokenizer_close(cli_tokenizer *t) {
    ct_tokenizer_free(t->tok);
    t->tok = NULL;
}

static ct_status copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb");
    if (!in) return ct_error(CT_ERR_IO, "%s: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        int e = errno;
        fclose(in);
        return ct_error(CT_ERR_IO, "%s: %s", to, strerror(e));
    }
    char buf[65536];
    size_t n;
    bool ok = true;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    int e = errno;
    fclose(in);
    if (fclose(out) != 0 && ok) { ok = false; e = errno; }
    return ok ? CT_OK : ct_error(CT_ERR_IO, "%s: %s", to, strerror(e));
}

ct_status cli_tokenizer_save(const cli_tokenizer *t, const char *dir) {
    /* tokenizer.json by its usual name whatever it was called, so the directory finds it */
    static const char *names[2][2] = {{"tokenizer.json"}, {"vocab.json", "merges.txt"}};
    for (int i = 0; i < t->nfiles; i++) {
        char to[4400];
        snprintf(to, sizeof to, "%s/%s", dir, names[t->nfiles - 1][i]);
        ct_status st = copy_file(t->files[i], to);
        if (st != CT_OK) return st;
    }
    /* transformers' AutoTokenizer reads these beside tokenizer.json (the tokenizer's class,
     * its special tokens): kept where the tokenizer's directory has them */
    static const char *extra[] = {"tokenizer_config.json", "special_tokens_map.json"};
    const char *slash = t->nfiles ? strrchr(t->files[0], '/') : NULL;
    int dl = slash ? (int)(slash - t->files[0]) + 1 : 0;
    for (int i = 0; t->nfiles && i < 2; i++) {
        char from[4400], to[4400];
        snprintf(from, sizeof from, "%.*s%s", dl, t->files[0], extra[i]);
        snprintf(to, sizeof to, "%s/%s", dir, extra[i]);
        struct stat sb;
        if (stat(from, &sb) != 0 || !S_ISREG(sb.st_mode) || !strcmp(from, to)) continue;
        ct_status st = copy_file(from, to);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

ct_status cli_tokenizer_fits(const cli_tokenizer *t, int64_t vocab, const char *model) {
    int32_t tv = ct_tokenizer_vocab_size(t->tok);
    if (tv <= vocab) return CT_OK;
    return ct_error(CT_ERR_INVALID, "the tokenizer %s has %d tokens, more than the vocabulary of %s (%lld)", t->files[0], tv, model,
                    (long long)vocab);
}

int32_t cli_document_start(const ct_tokenizer *tok) {
    int32_t id = ct_tokenizer_bos(tok);
    if (id < 0) id = ct_tokenizer_eos(tok);
    if (id < 0) id = ct_tokenizer_token_id(tok, "<|endoftext|>");
    return id;
}

ct_status cli_tokenize_file(const ct_tokenizer *tok, const char *path, int32_t **ids, size_t *n, size_t *bytes) {
    *ids = NULL;
    *n = 0;
    struct stat s;
    if (stat(path, &s) != 0) return ct_error(errno == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISREG(s.st_mode)) return ct_error(CT_ERR_INVALID, "%s: not a regular file", path);
    FILE *f = fopen(path, "rb");
    if (!f) return ct_error(CT_ERR_IO, "%s: %s", path, strerror(errno));
    size_t len = (size_t)s.st_size;
    char *text = malloc(len ? len : 1);
    if (!text) { fclose(f); return ct_error(CT_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, len); }
    bool ok = fread(text, 1, len, f) == len;
    fclose(f);
    if (!ok) { free(text); return ct_error(CT_ERR_IO, "%s: short read", path); }
    int32_t start = cli_document_start(tok);
    int32_t *body = NULL;
    size_t nb = 0;
    ct_status st = ct_tokenizer_encode_alloc(tok, text, len, &body, &nb);
    free(text);
    if (st != CT_OK) return st;
    size_t k = start >= 0 ? 1 : 0;
    *ids = malloc((nb + k) * sizeof **ids + 1);
    if (!*ids) { free(body); return ct_error(CT_ERR_NOMEM, "%s: out of memory for %zu tokens", path, nb); }
    if (k) (*ids)[0] = start;
    if (nb) memcpy(*ids + k, body, nb * sizeof *body);
    free(body);
    *n = nb + k;
    if (bytes) *bytes = len;
    return CT_OK;
}

ct_status cli_text_dataset(const ct_tokenizer *tok, const char *pattern, int block_size, ct_dataset **out) {
    *out = NULL;
    glob_t g;
    /* a name that is no pattern (or matches nothing) is read as it is: its error names it */
    const char *one[1] = {pattern};
    bool globbed = glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0;
    const char *const *files = globbed ? (const char *const *)g.gl_pathv : one;
    size_t nfiles = globbed ? g.gl_pathc : 1;
    int32_t *all = NULL;
    int64_t nall = 0;
    ct_status st = CT_OK;
    for (size_t i = 0; st == CT_OK && i < nfiles; i++) {
        int32_t *ids;
        size_t n;
        st = cli_tokenize_file(tok, files[i], &ids, &n, NULL);
        if (st != CT_OK) break;
        int32_t *grown = realloc(all, (size_t)(nall + (int64_t)n) * sizeof *all + 1);
        if (!grown) st = ct_error(CT_ERR_NOMEM, "out of memory for the tokens of %s", files[i]);
        else {
            all = grown;
            memcpy(all + nall, ids, n * sizeof *ids);
            nall += (int64_t)n;
        }
        free(ids);
    }
    if (st == CT_OK) st = ct_dataset_tokens_from_ids(all, nall, files[0], block_size, out);
    free(all);
    if (globbed) globfree(&g);
    return st;
}

ct_status cli_text_tokenizer(const char *arg, const char *weights, int64_t vocab, cli_tokenizer *t) {
    ct_status st = arg ? cli_tokenizer_open(arg, t) : cli_tokenizer_near(weights, t);
    if (st != CT_OK) return st;
    if (t->tok) {
        st = cli_tokenizer_fits(t, vocab, weights);
        if (st != CT_OK) cli_tokenizer_close(t);
        return st;
    }
    /* bytes are tokens only for a model of 256 of them */
    if (vocab != 256)
        return ct_error(CT_ERR_INVALID, "%s: the model's vocabulary has %lld tokens, not 256 bytes, and no tokenizer is kept next to it: "
                        "give --tokenizer DIR|FILE", weights, (long long)vocab);
    return CT_OK;
}
