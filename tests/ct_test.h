/* Minimal test harness. Each file in tests/unit is one binary:
 *
 *   #include "ct_test.h"
 *   CT_TEST(adds) { CT_EXPECT(1 + 1 == 2); CT_EXPECT_NEAR(x, 0.5, 1e-6); }
 *   CT_TEST(named) { CT_EXPECTF(err <= tol, "%s: error %g > %g", name, err, tol); }
 *   CT_TEST(needs_gpu) { CT_SKIP("no CUDA device"); }
 *   CT_TEST_MAIN()
 *
 * A binary prints one line per test ("ok", "FAIL" or "skip" + name) and a final
 * "RESULT passed failed skipped" line that tests/run.sh adds up. A test that evaluates no
 * CT_EXPECT* / CT_ASSERT and does not skip fails ("made no check"): it could not have failed. Run one binary with a
 * test name as argument to run just that test. */
#ifndef CT_TEST_H
#define CT_TEST_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef void (*ct_test_fn)(void);
typedef struct { const char *name; ct_test_fn fn; } ct_test_case;
static ct_test_case ct_tests_[512];
static int ct_ntests_;
static int ct_failed_;       /* failures in the current test */
static const char *ct_skip_; /* reason if current test skipped */
static int ct_checks_;       /* checks evaluated in the current test (atomic: tests may check from threads) */
#define CT_COUNT_CHECK_() __atomic_fetch_add(&ct_checks_, 1, __ATOMIC_RELAXED)

#define CT_TEST(tn)                                                                \
    static void ct_test_##tn(void);                                                \
    __attribute__((constructor)) static void ct_reg_##tn(void) {                   \
        ct_tests_[ct_ntests_].name = #tn;                                          \
        ct_tests_[ct_ntests_++].fn = ct_test_##tn;                                 \
    }                                                                              \
    static void ct_test_##tn(void)

#define CT_FAILF(...) do { fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); \
                           fprintf(stderr, "\n"); ct_failed_++; } while (0)
/* CT_EXPECT with a printf-style message instead of the condition's text */
#define CT_EXPECTF(c, ...) do { CT_COUNT_CHECK_(); if (!(c)) CT_FAILF(__VA_ARGS__); } while (0)
#define CT_EXPECT(c) do { CT_COUNT_CHECK_(); if (!(c)) CT_FAILF("expected %s", #c); } while (0)
#define CT_ASSERT(c) do { CT_COUNT_CHECK_(); if (!(c)) { CT_FAILF("assertion %s", #c); return; } } while (0)
#define CT_EXPECT_EQ(a, b) do { CT_COUNT_CHECK_(); long long a_ = (long long)(a), b_ = (long long)(b); \
    if (a_ != b_) CT_FAILF("%s == %s: %lld != %lld", #a, #b, a_, b_); } while (0)
#define CT_EXPECT_NEAR(a, b, tol) do { CT_COUNT_CHECK_(); double a_ = (a), b_ = (b); \
    if (!(fabs(a_ - b_) <= (tol))) CT_FAILF("%s ~ %s: %.9g vs %.9g (tol %g)", #a, #b, a_, b_, (double)(tol)); } while (0)
#define CT_EXPECT_OK(st) do { CT_COUNT_CHECK_(); int s_ = (int)(st); \
    if (s_ != 0) CT_FAILF("%s returned status %d: %s", #st, s_, ct_last_error()); } while (0)
#define CT_SKIP(reason) do { ct_skip_ = (reason); return; } while (0)

/* Max relative error of two float arrays: |a-b| / max(|b|, floor), floor avoids 0/0. */
static inline double ct_max_rel_err(const float *a, const float *b, long n, double floor_) {
    double m = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        double s = fabs((double)b[i]);
        if (s < floor_) s = floor_;
        if (d / s > m || d != d) m = (d != d) ? INFINITY : d / s;
    }
    return m;
}

/* Normwise relative error ||a - b|| / ||b|| (infinite when a has a NaN) */
static inline double ct_norm_rel_err(const float *a, const float *b, long n) {
    double d = 0, s = 0;
    for (long i = 0; i < n; i++) {
        double e = (double)a[i] - b[i];
        d += e * e;
        s += (double)b[i] * b[i];
    }
    return d != d ? INFINITY : sqrt(d) / (s > 0 ? sqrt(s) : 1);
}

/* Path of `name` inside a per-process temporary directory (created on first use, removed
 * at exit when the tests have removed their files; the returned string stays valid for the
 * next 3 calls). */
static char ct_test_dir_[64];
static inline void ct_test_rm_tmp_dir_(void) { rmdir(ct_test_dir_); }
static inline const char *ct_test_tmp_dir(void) {
    if (!ct_test_dir_[0]) {
        strcpy(ct_test_dir_, "/tmp/ct_test_XXXXXX");
        if (!mkdtemp(ct_test_dir_)) abort();
        atexit(ct_test_rm_tmp_dir_);
    }
    return ct_test_dir_;
}
static inline const char *ct_test_tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", ct_test_tmp_dir(), name);
    return b;
}
/* Write n bytes to path (aborts if the file cannot be created). */
static inline void ct_test_write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

/* Whole file, malloc'd (one spare byte), or NULL if it cannot be read. */
static inline unsigned char *ct_test_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    if (b && fread(b, 1, *n, f) != *n) { free(b); b = NULL; }
    fclose(f);
    return b;
}

#define CT_TEST_MAIN()                                                             \
    int main(int argc, char **argv) {                                              \
        int pass = 0, fail = 0, skip = 0;                                          \
        for (int i = 0; i < ct_ntests_; i++) {                                     \
            if (argc > 1 && strcmp(argv[1], ct_tests_[i].name)) continue;          \
            ct_failed_ = 0; ct_skip_ = NULL; ct_checks_ = 0;                       \
            ct_tests_[i].fn();                                                     \
            if (!ct_failed_ && !ct_skip_ && !__atomic_load_n(&ct_checks_, __ATOMIC_RELAXED)) { \
                fprintf(stderr, "  %s: made no check\n", ct_tests_[i].name);     \
                ct_failed_++;                                                      \
            }                                                                      \
            if (ct_failed_) { printf("FAIL %s\n", ct_tests_[i].name); fail++; }    \
            else if (ct_skip_) { printf("skip %s: %s\n", ct_tests_[i].name, ct_skip_); skip++; } \
            else { printf("ok   %s\n", ct_tests_[i].name); pass++; }               \
            fflush(stdout);                                                        \
        }                                                                          \
        printf("RESULT %d %d %d\n", pass, fail, skip);                             \
        return fail ? 1 : 0;                                                       \
    }
#endif
