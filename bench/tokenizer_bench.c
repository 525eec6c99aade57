/* One-thread encode throughput of ctrain's tokenizers.
 * Usage: build/bench/tokenizer_bench [tokenizer.json [text] [repeats]]
 * (defaults: the test fixtures, 20 repeats). Prints the best of the timed encodes of the
 * whole text; bench/tokenizers.sh runs it beside the `tokenizers` package on the same text
 * (bench/tokenizers_ref.py), as `make bench` does. */
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
    size_t n = 0;
    double best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < reps; r++) {
        struct timespec a, b, ca, cb;
        int32_t *ids;
        clock_gettime(CLOCK_MONOTONIC, &a);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ca);
        if (ct_tokenizer_encode_alloc(tok, text, len, &ids, &n) != CT_OK) { fprintf(stderr, "%s\n", ct_last_error()); return 1; }
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cb);
        clock_gettime(CLOCK_MONOTONIC, &b);
        free(ids);
        double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
        double c = (double)(cb.tv_sec - ca.tv_sec) + 1e-9 * (double)(cb.tv_nsec - ca.tv_nsec);
        if (s < best) best = s;
        if (c < best_cpu) best_cpu = c;
    }
    /* CPU time too: on a loaded machine it shows the work, wall time also the waiting */
    printf("%s: %zu bytes -> %zu ids, %.2f MB/s, %.2f M ids/s, %.2f MB/s of CPU time (ctrain, one thread, best of %d)\n",
           json, len, n, (double)len / best / 1e6, (double)n / best / 1e6, (double)len / best_cpu / 1e6, reps);
    free(text);
    ct_tokenizer_free(tok);
    return 0;
}
