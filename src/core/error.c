/* Statuses, the per-thread last-error message, and fatal programmer errors. */

#include "ctrain/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Thread_local char last_error[1024];

const char *ct_status_str(ct_status st) {
    static const char *names[CT_ERR_COUNT_] = {
        [CT_OK] = "ok",
        [CT_ERR_INVALID] = "invalid argument",
        [CT_ERR_IO] = "i/o error",
        [CT_ERR_FORMAT] = "malformed data",
        [CT_ERR_NOMEM] = "out of memory",
        [CT_ERR_TIMEOUT] = "timeout",
        [CT_ERR_PEER] = "peer failure",
        [CT_ERR_MISMATCH] = "ranks disagree",
        [CT_ERR_UNSUPPORTED] = "unsupported",
        [CT_ERR_SYSTEM] = "system error",
        [CT_ERR_NOT_FOUND] = "not found",
    };
    if ((int)st < 0 || st >= CT_ERR_COUNT_) return "unknown status";
    return names[st];
}

const char *ct_last_error(void) { return last_error; }
void ct_clear_error(void) { last_error[0] = 0; }

ct_status ct_error(ct_status st, const char *fmt, ...) {
    /* formatted aside first: callers may pass ct_last_error() itself as an argument */
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    CT_LOG_INFO("error", "%s: %s", ct_status_str(st), last_error);
    return st;
}

void ct_fatal(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ctrain: fatal: %s:%d: %s\n", file, line, msg);
    fflush(stderr);
    abort();
}

double ct_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
