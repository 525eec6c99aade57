/* Process supervision shared by `ctrain run` and ct_spawn: fork n workers, forward their
 * output (and keep the tail of each stderr), stop the rest on the first failure (SIGTERM,
 * SIGKILL after a grace period), forward SIGINT/SIGTERM, and write a root-cause-first report.
 * Not a public header: the launcher includes it through -Isrc. */
#ifndef CT_DIST_SUPERVISE_H
#define CT_DIST_SUPERVISE_H

#include <signal.h>

#include "ctrain/core.h"

/* Runs in the child after fork (output already redirected); its return value is the exit
 * code. For exec-style workers it calls execvpe and returns 127 on failure. */
typedef int (*ct_sup_child_fn)(int idx, void *ctx);

typedef struct ct_sup_opts {
    int n;
    ct_sup_child_fn fn;
    void *ctx;
    int rank_base;        /* global rank of worker 0 (node_rank * nproc_per_node) */
    double grace_s;       /* SIGTERM -> SIGKILL */
    const char *log_dir;  /* NULL: no files; else <log_dir>/attempt_<k>/<rank>/{stdout,stderr}.log */
    int redirects;        /* bits: 1 stdout, 2 stderr go to the files only */
    int tee;              /* bits: 1 stdout, 2 stderr go to the files and the console */
    int attempt;
    const char *runid;    /* /dev/shm/ctrain-<runid>-* are removed when all workers are gone */
    const char *who;      /* "ctrain run" or "ct_spawn": report prefix */
    /* Called in the parent once every worker is forked, with SIGINT/SIGTERM/SIGHUP/SIGCHLD
     * blocked: start threads here (the store server) so that fork() runs single-threaded.
     * A failure stops the workers and is returned by ct_sup_run. NULL = none. */
    ct_status (*after_fork)(void *ctx);
    void *after_fork_ctx;
} ct_sup_opts;

typedef struct ct_sup_result {
    int failed;        /* a worker failed (root cause below) */
    int interrupted;   /* signal number that stopped the launcher (SIGINT/SIGTERM), else 0 */
    int root;          /* worker index of the root cause */
    int exit_code;     /* root cause exit code, or -1 */
    int signal;        /* root cause signal, or 0 */
    char summary[256]; /* one line: "rank 1 (pid 42) exited with code 3" */
    char report[8192];
} ct_sup_result;

/* Blocks SIGINT/SIGTERM/SIGHUP/SIGCHLD on the calling thread (call before creating any
 * thread that must not receive them) and returns the old mask. */
void ct_sup_block_signals(sigset_t *old);
void ct_sup_restore_signals(const sigset_t *old);
/* Runs the workers to completion. Returns CT_OK unless supervision itself failed. */
ct_status ct_sup_run(const ct_sup_opts *o, ct_sup_result *res);
#endif
