/* ctrain run: torchrun for C programs. Hosts the store, starts the workers with torchrun's
 * variables, watches them, stops the rest on the first failure and prints a root-cause-first
 * report, restarts the group up to --max-restarts times, forwards SIGINT/SIGTERM.
 *
 *   ctrain run --standalone --nproc-per-node 4 ./train --epochs 3
 *   ctrain run --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 -- ./train  # writes a secret file, prints its path
 *   ctrain run --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --rdzv-token-file <copy of it> -- ./train
 * (or CTRAIN_STORE_TOKEN / CTRAIN_STORE_TOKEN_FILE on every node). The secret never goes on a
 * command line, where every local user reads it. Across machines without mpirun the workers
 * pick the gloo backend.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ctrain/config.h"
#include "ctrain/dist.h"
#include "ctrain/launch.h"
#include "ctrain/train.h"

int cli_gpu_count(const char *who) {
    int n = 0;
    ct_status st = ct_device_count(CT_DEV_CUDA, &n);
    if (st == CT_OK && n >= 1) return n;
    fprintf(stderr, "%s: no CUDA GPU usable here (%s)\n", who, st != CT_OK ? ct_last_error() : "the runtime sees 0 devices");
    return -1;
}

/* --device to a device, before anything is loaded: cuda is cuda:LOCAL_RANK (mod the GPUs
 * seen) as torchrun scripts pick theirs, so that under `ctrain run --nproc-per-node gpu`
 * each rank trains on its own GPU, the one its NCCL communicator uses; auto falls back to
 * the CPU. A GPU that is not there is a flag error: -1 to go on, else the exit code. */
int cli_resolve_device(const char *spec, int local_rank, const char *cmd, ct_device *dev) {
    *dev = CT_CPU;
    if (!spec || !strcmp(spec, "cpu")) return -1;
    bool automatic = !strcmp(spec, "auto");
    int n = 0;
    if (automatic && (ct_device_count(CT_DEV_CUDA, &n) != CT_OK || n < 1)) return -1;
    char who[96];
    snprintf(who, sizeof who, "%s: --device %s", cmd, spec);
    if ((n = cli_gpu_count(who)) < 1) return 2;
    if (automatic || !strcmp(spec, "cuda")) {
        *dev = CT_CUDA((local_rank > 0 ? local_rank : 0) % n);
        return -1;
    }
    if (ct_device_parse(spec, dev) != CT_OK) {
        fprintf(stderr, "%s: expected cpu, cuda, cuda:N or auto\n", who);
        return 2;
    }
    if (dev->index >= n) {
        if (n == 1) fprintf(stderr, "%s: 1 GPU visible here (cuda:0)\n", who);
        else fprintf(stderr, "%s: %d GPUs visible here (cuda:0 to cuda:%d)\n", who, n, n - 1);
        return 2;
    }
    return -1;
}

typedef struct {
    int nproc, nnodes, node_rank, master_port, standalone, max_restarts, redirects, tee;
    double timeout, grace, preempt_grace;
    const char *master_addr, *log_dir, *run_id, *token_file;
    char **argv; /* the worker's command */
    /* filled in */
    int port, attempt;
    char token[256], runid[40];
    char pid_file[PATH_MAX + 32]; /* empty: none */
} run_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain run [options] [--] PROGRAM [ARGS...]\n\n"
            "  --nproc-per-node N|auto|gpu  workers on this machine (auto: one per core; gpu: one per visible\n"
            "                           GPU, LOCAL_RANK picks the device; default 1)\n"
            "  --nnodes N               machines in the job (default 1)\n"
            "  --node-rank K            this machine's index (default 0)\n"
            "  --master-addr HOST       where node 0's store listens (default 127.0.0.1)\n"
            "  --master-port PORT       its port (default 29500)\n"
            "  --standalone             single machine, pick a free port\n"
            "  --max-restarts K         restart the whole group up to K times after a failure (default 0)\n"
            "  --log-dir DIR            write DIR/attempt_<k>/<rank>/{stdout,stderr}.log\n"
            "  --redirects N, -r N      with --log-dir: 1 stdout, 2 stderr, 3 both go only to the files\n"
            "  --tee N, -t N            with --log-dir: 1 stdout, 2 stderr, 3 both go to files and console\n"
            "  --timeout S              collective timeout for the workers (CTRAIN_TIMEOUT)\n"
            "  --grace-period S         SIGTERM -> SIGKILL delay when stopping workers (default 5)\n"
            "  --preempt-grace S        after a preemption signal (CTRAIN_PREEMPT_SIGNALS, default SIGTERM and\n"
            "                           SIGUSR1): forward it and wait this long for the workers to save (default 30)\n"
            "  --run-id ID, --rdzv-id ID  job id (TORCHELASTIC_RUN_ID; default random); not a secret\n"
            "  --rdzv-token-file PATH   with --nnodes > 1: the store's secret, read from PATH (a file of this user,\n"
            "                           mode 0600, 16-255 bytes; or set CTRAIN_STORE_TOKEN_FILE or CTRAIN_STORE_TOKEN).\n"
            "                           Every node needs the same one; node 0 started without one and without\n"
            "                           --rdzv-id writes a new one to a 0600 file and prints that file's path\n\n"
            "Workers get RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, MASTER_ADDR,\n"
            "MASTER_PORT, TORCHELASTIC_RESTART_COUNT, CTRAIN_RESTART_COUNT and OMP_NUM_THREADS (cores / workers\n"
            "when unset). Exit code: 0 when every worker succeeds, 1 after a failure, 75 when the workers saved\n"
            "and stopped for preemption (ctrain train's exit code then; resume with --resume auto), 128+N after\n"
            "signal N otherwise.\n");
}

static int fail(const char *fmt, const char *a) {
    fprintf(stderr, "ctrain run: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, " (see ctrain run --help)\n");
    return 2;
}

static int parse_int(const char *s, int lo, int hi, int *out) {
    char *e;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (e == s || *e || errno || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int parse_secs(const char *s, double *out) { /* 0 when all of s is a number >= 0 ("5x" is not) */
    char *e;
    errno = 0;
    double v = strtod(s, &e);
    if (e == s || *e || errno || !(v >= 0)) return -1;
    *out = v;
    return 0;
}

/* Accepts --flag value, --flag=value and torchrun's underscore spellings. */
static int parse(int argc, char **argv, run_opts *o) {
    *o = (run_opts){.nproc = 1, .nnodes = 1, .master_port = 29500, .grace = 5, .preempt_grace = 30, .timeout = 0};
    int i = 1;
    for (; i < argc; i++) {
        char *a = argv[i];
        if (!strcmp(a, "--")) { i++; break; }
        if (a[0] != '-') break;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        char name[64], *val = NULL;
        snprintf(name, sizeof name, "%s", a);
        char *eq = strchr(name, '=');
        if (eq) { *eq = 0; val = a + (eq - name) + 1; }
        for (char *p = name + 2; *p; p++) if (*p == '_') *p = '-';
        if (!strcmp(name, "--standalone")) { o->standalone = 1; continue; }
        static const char *with_value[] = {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                                           "--max-restarts", "--log-dir", "--redirects", "-r", "--tee", "-t", "--timeout",
                                           "--grace-period", "--preempt-grace", "--run-id", "--rdzv-id", "--monitor-interval",
                                           "--rdzv-token-file", NULL};
        int known = 0;
        for (int k = 0; with_value[k]; k++) known |= !strcmp(name, with_value[k]);
        if (!known) return fail("unknown option '%s'", a);
        if (!val) {
            if (i + 1 >= argc) return fail("%s needs a value", a);
            val = argv[++i];
        }
        int bad = 0;
        if (!strcmp(name, "--nproc-per-node")) {
            if (!strcmp(val, "auto") || !strcmp(val, "cpu")) o->nproc = (int)sysconf(_SC_NPROCESSORS_ONLN);
            else if (!strcmp(val, "gpu")) {
                /* torchrun's "gpu": one worker per visible GPU; none is an error, not one CPU worker */
                if ((o->nproc = cli_gpu_count("ctrain run: --nproc-per-node gpu")) < 1) return 2;
            } else bad = parse_int(val, 1, 4096, &o->nproc);
        } else if (!strcmp(name, "--nnodes")) {
            char *colon = strchr(val, ':'); /* torchrun's MIN:MAX: elastic ranges are not supported, use MAX */
            bad = parse_int(colon ? colon + 1 : val, 1, 65536, &o->nnodes);
        } else if (!strcmp(name, "--node-rank")) bad = parse_int(val, 0, 65535, &o->node_rank);
        else if (!strcmp(name, "--master-addr")) o->master_addr = val;
        else if (!strcmp(name, "--master-port")) bad = parse_int(val, 1, 65535, &o->master_port);
        else if (!strcmp(name, "--max-restarts")) bad = parse_int(val, 0, 1000, &o->max_restarts);
        else if (!strcmp(name, "--log-dir")) {
            o->log_dir = val;
            /* room for /attempt_<k>/<rank>/stderr.log: a longer name would be cut, not used */
            if (strlen(val) > PATH_MAX - 64) {
                fprintf(stderr, "ctrain run: --log-dir of %zu characters is too long (at most %d)\n", strlen(val),
                        PATH_MAX - 64);
                return 2;
            }
        }
        else if (!strcmp(name, "--redirects") || !strcmp(name, "-r")) bad = parse_int(val, 0, 3, &o->redirects);
        else if (!strcmp(name, "--tee") || !strcmp(name, "-t")) bad = parse_int(val, 0, 3, &o->tee);
        else if (!strcmp(name, "--timeout")) bad = parse_secs(val, &o->timeout) || !(o->timeout > 0);
        else if (!strcmp(name, "--grace-period")) bad = parse_secs(val, &o->grace);
        else if (!strcmp(name, "--preempt-grace")) bad = parse_secs(val, &o->preempt_grace);
        else if (!strcmp(name, "--run-id") || !strcmp(name, "--rdzv-id")) o->run_id = val;
        else if (!strcmp(name, "--rdzv-token-file")) o->token_file = val;
        if (bad) {
            fprintf(stderr, "ctrain run: bad value '%s' for %s (see ctrain run --help)\n", val, a);
            return 2;
        }
    }
    if (i >= argc) return fail("%s", "no program to run");
    o->argv = argv + i;
    if (o->node_rank >= o->nnodes) {
        fprintf(stderr, "ctrain run: --node-rank %d is not below --nnodes %d\n", o->node_rank, o->nnodes);
        return 2;
    }
    if (o->standalone && o->nnodes > 1) return fail("%s", "--standalone runs on one machine; drop --nnodes");
    if (o->nnodes > 1 && !o->master_addr) /* 127.0.0.1 would be unreachable from the other machines */
        return fail("%s", "--nnodes > 1 needs --master-addr: node 0's address that every node can reach");
    if (o->redirects && !o->log_dir) o->redirects = 0; /* nowhere else to put the output */
    return 0;
}

/* The program must exist before anything starts: one clear line instead of N failures. */
static int is_exec_file(const char *p) {
    struct stat sb;
    return access(p, X_OK) == 0 && stat(p, &sb) == 0 && S_ISREG(sb.st_mode); /* a directory passes access(X_OK) */
}
static int find_program(const char *prog) {
    if (strchr(prog, '/')) return is_exec_file(prog);
    const char *path = ct_config_str(CT_CFG_PATH); /* default /usr/bin:/bin */
    char buf[PATH_MAX];
    const char *p = path;
    while (*p) {
        const char *e = strchr(p, ':');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)len, p, prog);
        if (is_exec_file(buf)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

static int put(const char *k, const char *v) {
    if (ct_config_set(k, v) == CT_OK) return 0;
    fprintf(stderr, "ctrain run: %s\n", ct_last_error());
    return -1;
}

static int put_int(const char *k, long v) {
    char b[32];
    snprintf(b, sizeof b, "%ld", v);
    return put(k, b);
}

static int child_main(int idx, void *ctx) {
    run_opts *o = ctx;
    int world = o->nproc * o->nnodes, rank = o->node_rank * o->nproc + idx;
    int bad = put_int("RANK", rank) || put_int("LOCAL_RANK", idx) || put_int("WORLD_SIZE", world) ||
              put_int("LOCAL_WORLD_SIZE", o->nproc) || put_int("GROUP_RANK", o->node_rank) ||
              put_int("GROUP_WORLD_SIZE", o->nnodes) || put_int("ROLE_RANK", rank) ||
              put_int("ROLE_WORLD_SIZE", world) || put("ROLE_NAME", "default") ||
              put("MASTER_ADDR", o->master_addr ? o->master_addr : "127.0.0.1") || put_int("MASTER_PORT", o->port) ||
              put_int("TORCHELASTIC_RESTART_COUNT", o->attempt) || put_int("TORCHELASTIC_MAX_RESTARTS", o->max_restarts) ||
              put("TORCHELASTIC_RUN_ID", o->runid) || put_int("CTRAIN_RESTART_COUNT", o->attempt) ||
              put("CTRAIN_STORE_TOKEN", o->token) || put("CTRAIN_STORE_HOSTED", "1") || put("CTRAIN_RUN_ID", o->runid);
    if (!bad && o->timeout > 0) {
        char b[32];
        snprintf(b, sizeof b, "%g", o->timeout);
        bad = put("CTRAIN_TIMEOUT", b);
    }
    if (!bad && !ct_config_is_set(CT_CFG_OMP_NUM_THREADS)) {
        long c = sysconf(_SC_NPROCESSORS_ONLN) / o->nproc;
        bad = put_int("OMP_NUM_THREADS", c < 1 ? 1 : c);
    }
    if (bad) return 127;
    execvp(o->argv[0], o->argv);
    fprintf(stderr, "ctrain run: cannot execute %s: %s\n", o->argv[0], strerror(errno));
    return 127;
}

/* ct_sup_run's after_fork: serve the store again (no store on nodes other than 0). */
static ct_status store_resume(void *srv) { return srv ? ct_store_server_run(srv) : CT_OK; }

int cli_run(int argc, char **argv) {
    run_opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    uint64_t preempt;
    if (ct_preempt_parse(ct_config_str(CT_CFG_PREEMPT_SIGNALS), &preempt) != CT_OK) {
        fprintf(stderr, "ctrain run: %s\n", ct_last_error());
        return 2;
    }
    if (!find_program(o.argv[0])) {
        fprintf(stderr, "ctrain run: cannot find program '%s'\n", o.argv[0]);
        return 2;
    }
    /* The store's token. One machine: made up here. Several: every node must know it, from a
     * private file or the environment, never from the command line (/proc/PID/cmdline is
     * world-readable); it never crosses the network either (challenge-response). */
    const char *tok = ct_config_str(CT_CFG_STORE_TOKEN);
    const char *tfile = o.token_file ? o.token_file : tok ? NULL : ct_config_str(CT_CFG_STORE_TOKEN_FILE);
    char made_path[600] = "";
    if (tfile) {
        if (ct_store_secret_read_file(tfile, o.token, sizeof o.token) != CT_OK) {
            fprintf(stderr, "ctrain run: %s\n", ct_last_error());
            return 2;
        }
    } else if (tok) snprintf(o.token, sizeof o.token, "%.255s", tok);
    else if (o.nnodes == 1) ct_random_hex(o.token, 16);
    else if (o.node_rank == 0 && !o.run_id) {
        /* node 0 makes the secret up; the user copies the file to the other nodes */
        if (ct_store_secret_publish(o.master_port, o.token, sizeof o.token, made_path, sizeof made_path) != CT_OK) {
            fprintf(stderr, "ctrain run: %s\n", ct_last_error());
            return 1;
        }
        fprintf(stderr, "ctrain run: this job's store secret is in %s (mode 0600): copy that file to the other nodes "
                        "and start them with --rdzv-token-file FILE (or CTRAIN_STORE_TOKEN_FILE=FILE, or "
                        "CTRAIN_STORE_TOKEN set to its content in their environment)\n", made_path);
    } else {
        fprintf(stderr, "ctrain run: a multi-node job needs a shared secret for its store: give every node the same "
                        "one with --rdzv-token-file FILE (a 0600 file of 16+ bytes), CTRAIN_STORE_TOKEN_FILE or "
                        "CTRAIN_STORE_TOKEN (node 0 writes one when started with none of them and no --rdzv-id)%s\n",
                o.run_id && strlen(o.run_id) >= 16 ? "; --rdzv-id is the job's name, not a secret: any local user "
                                                     "reads a command line" : "");
        return 2;
    }
    if (o.run_id) snprintf(o.runid, sizeof o.runid, "%.32s", o.run_id);
    else ct_random_hex(o.runid, 6);

    /* signals are blocked before the store thread starts so that only the supervisor sees them */
    ct_sup_sigmask old;
    ct_sup_block_signals(&old);
    ct_store_server *srv = NULL;
    o.port = o.master_port;
    if (o.node_rank == 0) {
        /* listening only: the thread starts after each attempt's fork()s (store_resume) */
        /* several nodes: the address the others were given, never all interfaces by default */
        const char *bind = o.nnodes > 1 && o.master_addr ? o.master_addr : "127.0.0.1";
        ct_status st = ct_store_server_listen(bind, o.standalone ? 0 : o.master_port, o.token, &srv);
        if (st) {
            ct_sup_restore_signals(&old);
            if (made_path[0]) unlink(made_path);
            if (strstr(ct_last_error(), "in use"))
                fprintf(stderr, "ctrain run: port %d is already in use (choose another --master-port, or --standalone)\n",
                        o.master_port);
            else fprintf(stderr, "ctrain run: %s\n", ct_last_error());
            return 1;
        }
        o.port = ct_store_server_port(srv);
    }
    CT_LOG_INFO("launcher", "%d worker(s) on node %d of %d, store port %d, run id %s", o.nproc, o.node_rank, o.nnodes,
                o.port, o.runid);
    /* The pid file identifies "the same run" for cleanup after a killed launcher: the log
     * directory, else a run id the user chose (not the secret one), else a fixed port. */
    char pdir[600], node[32] = "";
    if (o.nnodes > 1) /* one launcher per node, each with its own file: a log directory or /tmp may be shared */
        snprintf(node, sizeof node, "-node%d", o.node_rank);
    if (o.log_dir) snprintf(o.pid_file, sizeof o.pid_file, "%s/.ctrain-run%s.pid", o.log_dir, node);
    else if (o.run_id || !o.standalone) {
        int ok = ct_private_dir(pdir, sizeof pdir) == CT_OK;
        for (const char *c = o.run_id; ok && c && *c; c++)
            ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || strchr("._-", *c);
        if (ok && o.run_id)
            snprintf(o.pid_file, sizeof o.pid_file, "%s/run-id-%s%s.pid", pdir, o.runid, node);
        else if (ok) snprintf(o.pid_file, sizeof o.pid_file, "%s/run-port-%d%s.pid", pdir, o.port, node);
    }
    int exit_code = 1;
    ct_sup_result *res = calloc(1, sizeof *res);
    for (o.attempt = 0; o.attempt <= o.max_restarts; o.attempt++) {
        ct_sup_opts so = {.n = o.nproc, .fn = child_main, .ctx = &o, .rank_base = o.node_rank * o.nproc,
                          .grace_s = o.grace, .log_dir = o.log_dir, .redirects = o.redirects, .tee = o.tee,
                          .attempt = o.attempt, .runid = o.runid, .who = "ctrain run",
                          .after_fork = store_resume, .after_fork_ctx = srv,
                          .pid_file = o.pid_file[0] ? o.pid_file : NULL, .preempt_signals = preempt,
                          .preempt_grace_s = o.preempt_grace, .preempted_exit_code = CT_EXIT_PREEMPTED};
        /* workers are fork()ed with no other thread alive; keys and connections survive */
        ct_store_server_pause(srv);
        ct_status st = ct_sup_run(&so, res);
        if (st) {
            fprintf(stderr, "ctrain run: %s\n", ct_last_error());
            break;
        }
        if (!res->failed && res->preempted) { /* saved: the job goes on elsewhere, never restarted here */
            fprintf(stderr, "ctrain run: preempted%s%s: %d worker(s) saved and exited %d; rerun the job with --resume auto\n",
                    res->interrupted ? " by " : "", res->interrupted ? strsignal(res->interrupted) : "", res->preempted,
                    CT_EXIT_PREEMPTED);
            exit_code = CT_EXIT_PREEMPTED;
            break;
        }
        if (!res->failed && !res->interrupted) { exit_code = 0; break; }
        fputs(res->report, stderr);
        if (res->interrupted) { exit_code = 128 + res->interrupted; break; }
        if (o.attempt < o.max_restarts)
            fprintf(stderr, "ctrain run: restarting all workers (restart %d of %d)\n", o.attempt + 1, o.max_restarts);
        else if (o.max_restarts) fprintf(stderr, "ctrain run: giving up after %d restart(s)\n", o.max_restarts);
    }
    free(res);
    ct_store_server_stop(srv);
    if (made_path[0]) unlink(made_path); /* the job is over: its secret is of no more use */
    ct_sup_restore_signals(&old);
    return exit_code;
}
