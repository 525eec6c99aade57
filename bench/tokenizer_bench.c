/* One-thread encode throughput of the byte-level BPE tokenizer.
 * Usage: build/bench/tokenizer_bench [tokenizer.json [text] [repeats]]
 * (defaults: the test fixtures, 20 repeats). Compare: tests/torch/gen_tokenizer.py's
 * fixtures with `tokenizers` (docs/tokenizer.md gives both figures). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ctrain/text.h"

int main(int argc, char **argv) {
    const char *json = argc > 1 ? argv[1] : "tests/fixtures/tokenizer/gpt2.json";
    const char *path = argc > 2 ? argv[2] : "tests/fixtures/tokenizer/text.txt";
    int reps = argc > 3 ? atoi(argv[3]) : 20;
    ct_tokenizer *tok;
    if (ct_tokenizer_load(json, &tok) != CT_OK) { fprintf(stderr, "%s\n", ct_last_error()); return 1; }
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return 1; }
    fseek(f, 0, SEEK_END);
    size_t len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc(len);
    if (!text || fread(text, 1, len, f) != len) { fprintf(stderr, "%s: short read\n", path); return 1; }
    fclose(f);
    struct timespec a, b;
    size_t n = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int r = 0; r < reps; r++) {
        int32_t *ids;
        if (ct_tokenizer_encode_alloc(tok, text, len, &ids, &n) != CT_OK) { fprintf(stderr, "%s\n", ct_last_error()); return 1; }
        free(ids);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    printf("%s: %zu bytes -> %zu ids, %.2f MB/s, %.2f M ids/s (one thread)\n", json, len, n,
           (double)len * reps / s / 1e6, (double)n * reps / s / 1e6);
    free(text);
    ct_tokenizer_free(tok);
    return 0;
}
