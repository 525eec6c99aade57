/* Where a device step's time goes, op by op (CTRAIN_DEVICE_PROFILE=1). Device ops return
 * before their kernels finish, so a host clock around a call measures the launch only; here
 * the device is drained before and after each op, which serialises the step (slower, but
 * every op's time is its own). Rows are keyed by the op's name pointer (the op table's
 * static strings). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/kernel.h"
#include "ctrain/config.h"

#define ROWS 128
typedef struct {
    const char *op;
    long long calls[2];
    double s[2];
} row;
static row rows[ROWS];
static int nrows;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int on = -1; /* unread */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

bool ct_devprof_begin(ct_device d, double *t0) {
    if (on < 0) on = ct_config_bool(CT_CFG_DEVICE_PROFILE);
    if (!on || d.type == CT_DEV_CPU) return false;
    (void)ct_device_sync(d);
    *t0 = now();
    return true;
}

void ct_devprof_end(ct_device d, const char *op, bool backward, double t0) {
    (void)ct_device_sync(d);
    double dt = now() - t0;
    pthread_mutex_lock(&mu);
    int i = 0;
    while (i < nrows && rows[i].op != op) i++;
    if (i == nrows && nrows < ROWS) rows[nrows++] = (row){.op = op};
    if (i < nrows) {
        rows[i].calls[backward]++;
        rows[i].s[backward] += dt;
    }
    pthread_mutex_unlock(&mu);
}

static int by_total(const void *a, const void *b) {
    const row *x = a, *y = b;
    double tx = x->s[0] + x->s[1], ty = y->s[0] + y->s[1];
    return (tx < ty) - (tx > ty);
}

void ct_devprof_reset(void) {
    pthread_mutex_lock(&mu);
    nrows = 0;
    pthread_mutex_unlock(&mu);
}

void ct_devprof_report(FILE *f) {
    pthread_mutex_lock(&mu);
    qsort(rows, (size_t)nrows, sizeof(row), by_total);
    double all = 0;
    for (int i = 0; i < nrows; i++) all += rows[i].s[0] + rows[i].s[1];
    fprintf(f, "%-22s %8s %12s %8s %12s %6s\n", "device op", "fwd n", "fwd ms", "bwd n", "bwd ms", "share");
    for (int i = 0; i < nrows; i++)
        fprintf(f, "%-22s %8lld %12.2f %8lld %12.2f %5.1f%%\n", rows[i].op, rows[i].calls[0], 1e3 * rows[i].s[0],
                rows[i].calls[1], 1e3 * rows[i].s[1], all > 0 ? 100 * (rows[i].s[0] + rows[i].s[1]) / all : 0.0);
    nrows = 0;
    pthread_mutex_unlock(&mu);
}
