/* ctrain tokenize --tokenizer DIR|FILE --output PREFIX FILES... — text files to llm.c token
 * shards (PREFIX_000000.bin, ...), one document per file, each opened by the tokenizer's
 * document start (cli_document_start: GPT-2's <|endoftext|>, as llm.c's scripts put it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/train_opts.h"
#include "ctrain/ctrain.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain tokenize --tokenizer DIR|FILE --output PREFIX [options] FILES...\n"
            "Tokenizes text files into llm.c token shards for `ctrain train --shards 'PREFIX_*.bin'`.\n"
            "Each file is a document: the tokenizer's BOS (else its EOS, else <|endoftext|>) goes\n"
            "before each, as llm.c's scripts put <|endoftext|> before every document.\n\n"
            "  --tokenizer DIR|FILE   tokenizer.json, or a directory holding it (or vocab.json + merges.txt)\n"
            "  --output PREFIX        writes PREFIX_000000.bin, PREFIX_000001.bin, ...: version 1 shards\n"
            "                         (uint16 tokens), or version 2 (uint32) when the vocabulary passes 65,536\n"
            "  --shard-tokens N       tokens per shard (default 100000000, as llm.c); a document may span two\n"
            "  --quiet                no progress line on stderr\n");
}

static int badv(const char *flag, const char *v, const char *want) { return cli_bad_value("tokenize", flag, v, want); }

typedef struct {
    const char *prefix;
    int version;
    int32_t *buf;
    int64_t n, cap;
    int shards;
    int64_t written;
} sink;

static ct_status flush(sink *s) {
    if (s->n == 0) return CT_OK;
    char path[4400];
    snprintf(path, sizeof path, "%s_%06d.bin", s->prefix, s->shards);
    ct_status st = ct_token_shard_write(path, s->buf, s->n, s->version);
    if (st != CT_OK) return st;
    s->shards++;
    s->written += s->n;
    s->n = 0;
    return CT_OK;
}

/* ids into the shard being filled; full shards are written */
static ct_status put(sink *s, const int32_t *ids, size_t n) {
    while (n > 0) {
        size_t k = (size_t)(s->cap - s->n) < n ? (size_t)(s->cap - s->n) : n;
        memcpy(s->buf + s->n, ids, k * sizeof *ids);
        s->n += (int64_t)k;
        ids += k;
        n -= k;
        if (s->n == s->cap) {
            ct_status st = flush(s);
            if (st != CT_OK) return st;
        }
    }
    return CT_OK;
}

int cli_tokenize(int argc, char **argv) {
    const char *tok_arg = NULL, *prefix = NULL;
    int64_t shard_tokens = 100000000;
    bool quiet = false;
    int first_file = argc;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) { usage(stdout); return 0; }
        if (!strcmp(f, "--quiet")) { quiet = true; continue; }
        if (!strcmp(f, "--")) { first_file = i + 1; break; }
        if (strncmp(f, "--", 2)) { first_file = i; break; }
        if (strcmp(f, "--tokenizer") && strcmp(f, "--output") && strcmp(f, "--shard-tokens")) {
            fprintf(stderr, "ctrain tokenize: unknown option '%s' (see ctrain tokenize --help)\n", f);
            return 2;
        }
        if (!v) return badv(f, NULL, "a value");
        i++;
        if (!strcmp(f, "--tokenizer")) tok_arg = v;
        else if (!strcmp(f, "--output")) prefix = v;
        else if (!cli_to_i64(v, 1, 2147483647, &shard_tokens)) return badv(f, v, "an integer in [1, 2147483647]");
    }
    if (!tok_arg || !prefix || first_file >= argc) {
        usage(stderr);
        return 2;
    }
    cli_tokenizer t;
    ct_status st = cli_tokenizer_open(tok_arg, &t);
    if (st != CT_OK) {
        fprintf(stderr, "ctrain tokenize: %s\n", ct_last_error());
        return 1;
    }
    int32_t vocab = ct_tokenizer_vocab_size(t.tok);
    sink s = {.prefix = prefix, .version = vocab > 65536 ? CT_SHARD_VERSION_U32 : CT_SHARD_VERSION_U16, .cap = shard_tokens};
    s.buf = malloc((size_t)shard_tokens * sizeof *s.buf);
    if (!s.buf) st = ct_error(CT_ERR_NOMEM, "out of memory for a shard of %lld tokens", (long long)shard_tokens);
    int nfiles = argc - first_file;
    double t0 = ct_time_now(), bytes = 0;
    int64_t tokens = 0;
    for (int i = 0; st == CT_OK && i < nfiles; i++) {
        int32_t *ids;
        size_t n, nb;
        st = cli_tokenize_file(t.tok, argv[first_file + i], &ids, &n, &nb);
        if (st != CT_OK) break;
        st = put(&s, ids, n);
        free(ids);
        tokens += (int64_t)n;
        bytes += (double)nb;
        double dt = ct_time_now() - t0;
        if (!quiet)
            fprintf(stderr, "\rtokenize: %d/%d files, %lld tokens, %.1f MB/s", i + 1, nfiles, (long long)tokens,
                    dt > 0 ? bytes / dt / 1e6 : 0.0);
    }
    if (st == CT_OK) st = flush(&s);
    if (!quiet && nfiles > 0) fputc('\n', stderr);
    if (st == CT_OK)
        printf("%lld tokens from %d file%s in %d shard%s %s_*.bin (version %d, vocabulary %d)\n", (long long)s.written, nfiles,
               nfiles == 1 ? "" : "s", s.shards, s.shards == 1 ? "" : "s", prefix, s.version, vocab);
    else
        fprintf(stderr, "ctrain tokenize: %s\n", ct_last_error());
    free(s.buf);
    cli_tokenizer_close(&t);
    return st == CT_OK ? 0 : 1;
}
