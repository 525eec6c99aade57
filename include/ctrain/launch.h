/* ctrain/launch.h — what a launcher needs: a process supervisor and a store to host.
 * `ctrain run` and ct_spawn are built on it.
 *
 *   static int child(int idx, void *ctx) {          // runs in the fork()ed worker
 *       ct_config_set("RANK", idx ? "1" : "0");       // (ctrain/config.h)
 *       execvp(argv[0], argv);
 *       return 127;
 *   }
 *   static ct_status serve(void *srv) { return ct_store_server_run(srv); }
 *   char token[40];
 *   ct_random_hex(token, 16);
 *   ct_sup_sigmask old;
 *   ct_sup_block_signals(&old);                      // before any thread exists
 *   ct_store_server *srv;
 *   ct_store_server_listen("127.0.0.1", 0, token, &srv);   // served from after_fork
 *   ct_sup_opts o = {.n = 2, .fn = child, .grace_s = 5, .runid = "job1", .who = "mylauncher",
 *                    .after_fork = serve, .after_fork_ctx = srv};
 *   ct_sup_result *res = calloc(1, sizeof *res);
 *   if (ct_sup_run(&o, res) == CT_OK && res->failed) fputs(res->report, stderr);
 *   ct_store_server_stop(srv);
 *   ct_sup_restore_signals(&old);
 *
 * The store server functions (ct_store_server_listen/run/pause/port/stop) are declared in
 * ctrain/dist.h, which this header includes.
 */
#ifndef CTRAIN_LAUNCH_H
#define CTRAIN_LAUNCH_H

#include "ctrain/core.h"
#include "ctrain/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Runs in the child after fork (output already redirected); its return value is the exit
 * code. For exec-style workers it calls execvp and returns 127 on failure. */
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
    /* NULL = none. A file held (flock) while the workers run, with the supervisor's pid and
     * each worker's process group: a second supervisor with the same file is refused while
     * this one lives, and one that finds the file left by a dead supervisor first kills the
     * process groups listed there (checked against their start time, never a reused pid). */
    const char *pid_file;
    /* Preemption (Slurm, Kubernetes: SIGTERM, then SIGKILL after a grace period). Bit s set:
     * signal s sent to the supervisor is forwarded to the workers, which save and exit, and
     * SIGKILL follows only after max(grace_s, preempt_grace_s) (torchrun's convention: it
     * forwards SIGTERM and waits); another such signal meanwhile is forwarded too instead of
     * killing. 0: SIGINT/SIGTERM/SIGHUP/SIGUSR1 are all forwarded with grace_s. */
    uint64_t preempt_signals;
    double preempt_grace_s;
    /* Nonzero: a worker exiting with this code saved its state after a preemption signal and
     * is not a failure (no stopping of the others, no restart): res->preempted counts them. */
    int preempted_exit_code;
} ct_sup_opts;

typedef struct ct_sup_result {
    int failed;        /* a worker failed (root cause below) */
    int interrupted;   /* signal number that stopped the launcher (SIGINT/SIGTERM/SIGHUP/SIGUSR1), else 0 */
    int preempted;     /* workers that exited with preempted_exit_code */
    int root;          /* worker index of the root cause */
    int exit_code;     /* root cause exit code, or -1 */
    int signal;        /* root cause signal, or 0 */
    char summary[256]; /* one line: "rank 1 (pid 42) exited with code 3" */
    char report[8192];
} ct_sup_result;

/* A saved signal mask (a sigset_t inside: opaque, so that this header needs no POSIX types). */
typedef struct ct_sup_sigmask { unsigned long opaque[16]; } ct_sup_sigmask;
/* Blocks SIGINT/SIGTERM/SIGHUP/SIGUSR1/SIGCHLD on the calling thread (call before creating any
 * thread that must not receive them) and returns the old mask. */
void ct_sup_block_signals(ct_sup_sigmask *old);
void ct_sup_restore_signals(const ct_sup_sigmask *old);
/* Runs the workers to completion: forwards their output, stops the rest on the first
 * failure (SIGTERM, SIGKILL after grace_s), forwards SIGINT/SIGTERM/SIGHUP (as SIGTERM) and
 * SIGUSR1, and writes a
 * root-cause-first report. Returns CT_OK unless supervision itself failed. */
ct_status ct_sup_run(const ct_sup_opts *o, ct_sup_result *res);

/* A directory private to this user for small run files (store tokens, launcher pid files):
 * $CTRAIN_RUNTIME_DIR, else $XDG_RUNTIME_DIR/ctrain, else /tmp/ctrain-<uid>; created 0700,
 * refused when it is not a directory of this user closed to others. When /tmp/ctrain-<uid>
 * is refused (another user made it), $HOME/.cache/ctrain instead, with one warning. */
ct_status ct_private_dir(char *out, size_t n);

/* The store secret of a multi-node job, kept off command lines (which any local user can
 * read in /proc). ct_store_secret_read_file: from `path`, which must be a regular file owned
 * by this user with no access for group or others (else CT_ERR_INVALID saying so); one line
 * of 16 to 255 bytes, its newline dropped. ct_store_secret_publish: a new random secret (32
 * hex characters) in <ct_private_dir>/rdzv-<port>.secret, mode 0600; its path in `path`. */
ct_status ct_store_secret_read_file(const char *path, char *token, size_t n);
ct_status ct_store_secret_publish(int port, char *token, size_t n, char *path, size_t pn);

/* 2*nbytes random hex characters and a NUL (getrandom; time and pid without entropy):
 * store tokens, run ids, segment names. */
void ct_random_hex(char *out, size_t nbytes);

#ifdef __cplusplus
}
#endif
#endif
