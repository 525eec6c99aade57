/* Shared helpers of the libFuzzer targets (fuzz/fuzz_<target>.c, built by `make fuzz`).
 * The readers under test take file names, so each input is written to a file in a private
 * temporary directory first; writing a small file costs microseconds, far less than
 * giving every reader an in-memory twin that would then be what is fuzzed instead. */
#ifndef CTRAIN_FUZZ_H
#define CTRAIN_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <unistd.h>

#include "ctrain/ctrain.h"

static char fz_dir_[256];

static int fz_rm_(const char *p, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb, (void)type, (void)ftw;
    return remove(p), 0;
}
static void fz_cleanup_(void) { nftw(fz_dir_, fz_rm_, 16, FTW_DEPTH | FTW_PHYS); }

/* One directory per fuzzing process (libFuzzer's -jobs run several), made on first use and
 * removed at a normal exit (after a crash it stays, with the input that caused it). */
static inline const char *fz_dir(void) {
    if (!fz_dir_[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(fz_dir_, sizeof fz_dir_, "%s/ctrain-fuzz-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(fz_dir_)) { perror("mkdtemp"); abort(); }
        atexit(fz_cleanup_);
    }
    return fz_dir_;
}

/* Writes data to <fz_dir>/<name>; returns the path (static storage, one per name slot). */
static inline const char *fz_write(const char *name, const uint8_t *data, size_t n) {
    static char paths[4][512];
    static int k;
    char *p = paths[k++ & 3];
    snprintf(p, 512, "%s/%s", fz_dir(), name);
    FILE *f = fopen(p, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f)) { perror(p); abort(); }
    return p;
}

/* Splits data at the separator "\n====\n" into at most max parts (the last takes the rest);
 * returns how many. Seeds stay readable text files while one input can hold several files. */
static inline int fz_split(const uint8_t *data, size_t n, const uint8_t **part, size_t *len, int max) {
    static const char sep[] = "\n====\n";
    const size_t sl = sizeof sep - 1;
    int k = 0;
    size_t start = 0;
    for (size_t i = 0; k < max - 1 && i + sl <= n; i++) {
        if (memcmp(data + i, sep, sl)) continue;
        part[k] = data + start;
        len[k++] = i - start;
        start = i + sl;
        i += sl - 1;
    }
    part[k] = data + start;
    len[k++] = n - start;
    return k;
}

/* Reads every byte of a buffer a reader handed out, so that a wrong length or pointer shows
 * up as an ASan report here rather than going unnoticed. */
static inline unsigned fz_touch(const void *p, size_t n) {
    const volatile uint8_t *b = p;
    unsigned s = 0;
    for (size_t i = 0; i < n; i++) s += b[i];
    return s;
}

#endif
