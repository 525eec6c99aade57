/* Integer test patterns for the collective tests (test_dist.c on shm, tests/mpi on mpi):
 * every value and every reduction of them is a small integer, so every dtype is exact and
 * results can be compared with ==. Header-only (static) so each test program gets a copy. */
#ifndef CT_TEST_DIST_PATTERN_H
#define CT_TEST_DIST_PATTERN_H

#include <stdint.h>
#include <stdio.h>

#include "ctrain/dist.h"

/* ---- usable in ranks (no CT_EXPECT there: report on stderr and return 1); need `rank` in scope ---- */
#define WFAIL(...) do { fprintf(stderr, "rank %d: ", rank); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); return 1; } while (0)
#define WOK(st) do { ct_status s_ = (st); if (s_) WFAIL("%s: %s: %s", #st, ct_status_str(s_), ct_last_error()); } while (0)

static inline void setv(ct_dtype dt, void *b, size_t i, double v) { ct_elem_set(b, dt, i, v); }
static inline double getv(ct_dtype dt, const void *b, size_t i) { return ct_elem_get(b, dt, i); }
/* value of rank r at index i: small integers; PROD uses 1..2 so products stay exact */
static double pat(ct_reduce_op op, int r, size_t i) {
    if (op == CT_RED_PROD) return (double)(1 + (i + (size_t)r) % 2);
    return (double)((long)((i * 7 + (size_t)r * 5) % 13) - 4);
}
/* expected reduction, rounded like the library: AVG divides in the dtype's arithmetic */
static double expect(ct_dtype dt, ct_reduce_op op, int n, size_t i) {
    double acc = pat(op, 0, i);
    for (int r = 1; r < n; r++) {
        double v = pat(op, r, i);
        switch (op) {
        case CT_RED_SUM: case CT_RED_AVG: acc += v; break;
        case CT_RED_PROD: acc *= v; break;
        case CT_RED_MIN: acc = v < acc ? v : acc; break;
        case CT_RED_MAX: acc = v > acc ? v : acc; break;
        default: break;
        }
    }
    if (op == CT_RED_AVG) {
        if (dt == CT_I32 || dt == CT_I64) acc = (double)((long long)acc / n);
        else if (dt == CT_F64) acc = acc / n;
        else acc = (double)((float)acc / (float)n);
    }
    /* round into the dtype */
    uint8_t tmp[8];
    setv(dt, tmp, 0, acc);
    return getv(dt, tmp, 0);
}

static int check_reduce(int rank, int n, ct_dtype dt, ct_reduce_op op, const void *b, size_t cnt, const char *what) {
    for (size_t i = 0; i < cnt; i++) {
        double g = getv(dt, b, i), e = expect(dt, op, n, i);
        if (g != e)
            WFAIL("%s %s %s n=%zu: [%zu] = %g, expected %g", what, ct_dtype_name(dt), ct_reduce_op_name(op), cnt, i, g, e);
    }
    return 0;
}
#endif
