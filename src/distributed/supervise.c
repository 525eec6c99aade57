/* Worker supervision for `ctrain run` and ct_spawn (see ctrain/launch.h). One poll() loop over
 * the workers' output pipes and a signalfd; each worker runs in its own process group so a
 * stop signal reaches its children too.
 *
 * Dying with the supervisor: PR_SET_PDEATHSIG only reaches the direct child, so when the
 * program is a wrapper script, a SIGKILLed supervisor used to leave the script's children
 * training. Each worker is therefore a small keeper process (the direct child, with the
 * parent-death signal) that runs the program as its own child in the same process group:
 * when the supervisor dies, the keeper kills the whole group; when the program ends, the
 * keeper ends the same way, so the supervisor sees the program's exit code or signal. */
#include "ctrain/launch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TAIL 4096

typedef struct {
    pid_t pid;          /* the keeper's: the process group, and what waitpid reaps */
    pid_t prog;         /* the program's, which the user knows from its logs (0 until the keeper says) */
    int out, err;       /* pipe read ends, -1 when closed or inherited */
    int logo, loge;     /* log files, -1 if none */
    int alive, status, stopped_by_us;
    char state_at_fail;  /* the program's /proc state when the first failure was seen ('T' stopped...) */
    double t_exit;
    char tail[TAIL];    /* ring of the last stderr bytes */
    size_t tail_n, tail_pos;
} worker_t;

/* The signals the supervisor reads from its signalfd (SIGUSR1: Slurm's --signal warning) */
static void stop_signals(sigset_t *s) {
    sigemptyset(s);
    sigaddset(s, SIGINT);
    sigaddset(s, SIGTERM);
    sigaddset(s, SIGHUP);
    sigaddset(s, SIGUSR1);
    sigaddset(s, SIGCHLD);
}

static void block_signals(sigset_t *old) {
    sigset_t s;
    stop_signals(&s);
    pthread_sigmask(SIG_BLOCK, &s, old);
}

static void restore_signals(const sigset_t *old) {
    /* drop pending SIGCHLDs so they do not fire after unblocking */
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGCHLD);
    struct timespec z = {0, 0};
    while (sigtimedwait(&s, NULL, &z) > 0) {}
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

_Static_assert(sizeof(sigset_t) <= sizeof(ct_sup_sigmask), "ct_sup_sigmask cannot hold a sigset_t");

void ct_sup_block_signals(ct_sup_sigmask *old) {
    sigset_t o;
    block_signals(&o);
    memcpy(old, &o, sizeof o);
}

void ct_sup_restore_signals(const ct_sup_sigmask *old) {
    sigset_t o;
    memcpy(&o, old, sizeof o);
    restore_signals(&o);
}

static void write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static int mkdirs(const char *path) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) { errno = ENAMETOOLONG; return -1; }
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') { *p = 0; mkdir(tmp, 0755); *p = '/'; }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

static void tail_add(worker_t *w, const char *d, size_t n) {
    for (size_t i = 0; i < n; i++) {
        w->tail[w->tail_pos] = d[i];
        w->tail_pos = (w->tail_pos + 1) % TAIL;
        if (w->tail_n < TAIL) w->tail_n++;
    }
}

/* Last `lines` lines of the stderr tail, each indented. */
static void tail_lines(const worker_t *w, char *out, size_t n, int lines) {
    char buf[TAIL + 1];
    size_t start = (w->tail_pos + TAIL - w->tail_n) % TAIL;
    for (size_t i = 0; i < w->tail_n; i++) buf[i] = w->tail[(start + i) % TAIL];
    buf[w->tail_n] = 0;
    size_t len = w->tail_n;
    while (len && buf[len - 1] == '\n') buf[--len] = 0;
    size_t p = len;
    int seen = 0;
    while (p > 0) {
        if (buf[p - 1] == '\n' && ++seen == lines) break;
        p--;
    }
    size_t o = 0;
    out[0] = 0;
    char *line = buf + p;
    while (line && *line && o + 8 < n) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        o += (size_t)snprintf(out + o, n - o, "    | %s\n", line);
        line = nl ? nl + 1 : NULL;
    }
    if (!w->tail_n) snprintf(out, n, "    (no output on stderr)\n");
}

/* The pid a report names: the program's (in its logs, ps, a core file), not its keeper's. */
static int shown_pid(const worker_t *w) { return (int)(w->prog > 0 ? w->prog : w->pid); }

static void describe_status(int status, char *out, size_t n) {
    if (WIFEXITED(status)) snprintf(out, n, "exited with code %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, n, "was killed by signal %d (%s)%s", WTERMSIG(status), strsignal(WTERMSIG(status)),
                 WCOREDUMP(status) ? ", core dumped" : "");
    else snprintf(out, n, "ended with status 0x%x", status);
}

static void cleanup_shm(const char *runid) {
    if (!runid || !*runid) return;
    char prefix[96];
    snprintf(prefix, sizeof prefix, "ctrain-%s-", runid);
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strncmp(e->d_name, prefix, strlen(prefix))) {
            char path[512];
            snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
            if (!unlink(path)) CT_LOG_INFO("launcher", "removed leftover segment %s", path);
        }
    }
    closedir(d);
}

static void pump(worker_t *w, int *fdp, int console_fd, int logfd, int to_console, int is_err) {
    char buf[65536];
    ssize_t r = read(*fdp, buf, sizeof buf);
    if (r <= 0) {
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
        close(*fdp);
        *fdp = -1;
        return;
    }
    if (is_err) tail_add(w, buf, (size_t)r);
    if (logfd >= 0) write_all(logfd, buf, (size_t)r);
    if (to_console) write_all(console_fd, buf, (size_t)r);
}

static void signal_all(worker_t *ws, int n, int sig) {
    for (int i = 0; i < n; i++)
        if (ws[i].alive) {
            kill(-ws[i].pid, sig); /* its process group: the worker and anything it started */
            kill(ws[i].pid, sig);
        }
}


/* State letter of the program a keeper runs (its only child), '?' when unknown. */
static char program_state(pid_t keeper) {
    char path[96], buf[512];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)keeper, (int)keeper);
    FILE *f = fopen(path, "r");
    int child = 0;
    if (f) {
        if (fscanf(f, "%d", &child) != 1) child = 0;
        fclose(f);
    }
    if (child <= 0) return '?';
    snprintf(path, sizeof path, "/proc/%d/stat", child);
    f = fopen(path, "r");
    if (!f) return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] ? p[2] : '?';
}

static const char *state_name(char c) {
    switch (c) {
    case 'T': case 't': return "stopped (SIGSTOP or a debugger)";
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "in uninterruptible I/O";
    case 'Z': return "already dead";
    default: return NULL;
    }
}

/* A collective timeout names the ranks that never arrived ("... rank(s) 1, 3 never reached
 * it", shm.c, gloo.cc): the rank that timed out is healthy, the first of those on this node
 * is the root cause, else (a rank of another node, named by the gloo backend) the first
 * one. Returns that global rank, or -1. */
static int stalled_rank(const worker_t *w, int rank_base, int n, char *what, size_t wn) {
    char buf[TAIL + 1];
    size_t start = (w->tail_pos + TAIL - w->tail_n) % TAIL;
    for (size_t i = 0; i < w->tail_n; i++) buf[i] = w->tail[(start + i) % TAIL];
    buf[w->tail_n] = 0;
    char *end = NULL;
    for (char *p = strstr(buf, " never reached it"); p; p = strstr(p + 1, " never reached it")) end = p;
    if (!end) return -1;
    *end = 0;
    char *list = NULL;
    for (char *p = strstr(buf, "rank(s) "); p && p < end; p = strstr(p + 1, "rank(s) ")) list = p + 8;
    if (!list) return -1;
    /* the operation: the text before " timed out on rank" on that line */
    char *line = list;
    while (line > buf && line[-1] != '\n') line--;
    char *to = strstr(line, " timed out on rank");
    what[0] = 0;
    if (to) {
        char *op = to;
        while (op > line && !(op[-1] == ' ' && op[-2] == ':')) op--; /* after the last ": " before it */
        snprintf(what, wn, "%.*s", (int)(to - op), op);
    }
    long first = -1;
    for (char *p = list; *p;) {
        char *e;
        long r = strtol(p, &e, 10);
        if (e == p || r < 0 || r > INT_MAX) break;
        if (r >= rank_base && r < rank_base + n) return (int)r;
        if (first < 0) first = r;
        p = e;
        while (*p == ',' || *p == ' ') p++;
    }
    return (int)first;
}

/* ------------------------------------------------------------------ pid file */
/* Start time of a process (clock ticks since boot, field 22 of /proc/<pid>/stat), 0 if gone. */
static unsigned long long proc_start(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p) return 0;
    unsigned long long v = 0;
    int field = 2;
    for (char *tok = strtok(p + 1, " "); tok; tok = strtok(NULL, " "))
        if (++field == 22) { v = strtoull(tok, NULL, 10); break; }
    return v;
}

/* Takes the pid file (*fdp) and kills what a dead supervisor left. */
static ct_status pid_file_take(const char *path, const char *who, int *fdp) {
    *fdp = -1;
    char buf[8192];
    ssize_t n;
    int fd;
    /* The holder unlinks the file when it is done: a lock taken on a file that was unlinked
     * meanwhile is on the wrong inode, so take it again on the file the path names now. */
    for (int tries = 0;; tries++) {
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) return ct_error(CT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        n = pread(fd, buf, sizeof buf - 1, 0);
        buf[n > 0 ? n : 0] = 0;
        if (flock(fd, LOCK_EX | LOCK_NB)) {
            int e = errno;
            close(fd);
            int other = 0;
            sscanf(buf, "supervisor %d", &other);
            if (e == EWOULDBLOCK)
                return ct_error(CT_ERR_INVALID, "another %s (pid %d) is running with the same %s: wait for it or stop it",
                                who, other, path);
            return ct_error(CT_ERR_IO, "cannot lock %s: %s", path, strerror(e));
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) break;
        close(fd);
        if (tries == 10) return ct_error(CT_ERR_IO, "%s keeps being replaced", path);
    }
    n = pread(fd, buf, sizeof buf - 1, 0); /* again: the previous holder may have just finished */
    buf[n > 0 ? n : 0] = 0;
    int prev = 0, killed = 0;
    sscanf(buf, "supervisor %d", &prev);
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        int pg;
        unsigned long long start;
        if (sscanf(line, "worker %d %llu", &pg, &start) != 2 || pg <= 1) continue;
        if (proc_start(pg) == start && start && !kill(-pg, SIGKILL)) killed++;
    }
    if (killed)
        CT_LOG_WARN_("launcher", "killed %d leftover worker process group(s) of a previous %s (pid %d) listed in %s",
                    killed, who, prev, path);
    *fdp = fd;
    return CT_OK;
}

static void pid_file_write(int fd, const worker_t *ws, int n) {
    char buf[8192];
    size_t o = (size_t)snprintf(buf, sizeof buf, "supervisor %d\n", (int)getpid());
    for (int i = 0; i < n && o < sizeof buf - 64; i++)
        if (ws[i].pid > 0)
            o += (size_t)snprintf(buf + o, sizeof buf - o, "worker %d %llu\n", (int)ws[i].pid, proc_start(ws[i].pid));
    if (ftruncate(fd, 0) || pwrite(fd, buf, o, 0) != (ssize_t)o)
        CT_LOG_WARN_("launcher", "cannot write the pid file: %s", strerror(errno));
}

/* The keeper (see the top of the file). Runs in the direct child, already in its own process
 * group with its output redirected; never returns. */
static void keeper_run(const ct_sup_opts *o, int idx, pid_t supervisor, volatile pid_t *prog_pids) {
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    /* SIGUSR2 as the parent-death signal: blocked, so it is read below like SIGCHLD */
    prctl(PR_SET_PDEATHSIG, SIGUSR2);
    if (getppid() != supervisor) _exit(1); /* the supervisor died before prctl */
    pid_t prog = fork();
    if (prog < 0) _exit(127);
    if (prog == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        int rc = o->fn(idx, o->ctx);
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    if (prog_pids) prog_pids[idx] = prog; /* the supervisor reports this pid, not the keeper's */
    /* SIGINT/SIGTERM/SIGHUP were sent to the whole group: the program has them too, and
     * the keeper waits for its answer. */
    for (;;) {
        siginfo_t si;
        int sig = sigwaitinfo(&all, &si);
        if (sig == SIGUSR2 || getppid() != supervisor) {
            kill(-getpgrp(), SIGKILL); /* the program and everything it started, this keeper too */
            _exit(137);
        }
        int status;
        pid_t r = waitpid(prog, &status, WNOHANG);
        if (r != prog) continue;
        if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
        int ts = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
        /* end by the same signal; the core, if any, was the program's */
        struct rlimit nocore = {0, 0};
        setrlimit(RLIMIT_CORE, &nocore);
        signal(ts, SIG_DFL);
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, ts);
        sigprocmask(SIG_UNBLOCK, &one, NULL);
        raise(ts);
        _exit(128 + ts);
    }
}

ct_status ct_sup_run(const ct_sup_opts *o, ct_sup_result *res) {
    memset(res, 0, sizeof *res);
    res->root = -1;
    res->exit_code = -1;
    int n = o->n;
    worker_t *ws = calloc((size_t)n, sizeof *ws);
    if (!ws) return ct_error(CT_ERR_NOMEM, "workers");
    int pidfd = -1;
    if (o->pid_file && o->log_dir) { /* the pid file lives in the log directory: create it first */
        char dir[PATH_MAX];
        if (snprintf(dir, sizeof dir, "%s/attempt_%d/%d", o->log_dir, o->attempt, o->rank_base) < (int)sizeof dir &&
            mkdirs(dir)) {
            free(ws);
            return ct_error(CT_ERR_IO, "cannot create log directory %s: %s", dir, strerror(errno));
        }
    }
    if (o->pid_file) {
        ct_status pst = pid_file_take(o->pid_file, o->who ? o->who : "launcher", &pidfd);
        if (pst) { free(ws); return pst; }
    }
    /* the programs' pids, written by their keepers (a page shared across the fork) */
    size_t pp_bytes = (size_t)n * sizeof(pid_t);
    volatile pid_t *prog_pids = mmap(NULL, pp_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (prog_pids == MAP_FAILED) prog_pids = NULL;
    sigset_t old;
    block_signals(&old);
    sigset_t sset;
    stop_signals(&sset);
    int sfd = signalfd(-1, &sset, SFD_CLOEXEC | SFD_NONBLOCK);
    int want_out_pipe = o->log_dir && ((o->redirects | o->tee) & 1);
    double t0 = ct_time_now();
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    ct_status st = CT_OK;
    int started = 0;
    for (int i = 0; i < n; i++) {
        worker_t *w = &ws[i];
        w->out = w->err = w->logo = w->loge = -1;
        int po[2] = {-1, -1}, pe[2] = {-1, -1};
        if (o->log_dir) {
            /* a name that does not fit is an error: a truncated one would put the logs elsewhere */
            char dir[PATH_MAX], path[PATH_MAX + 16];
            if (snprintf(dir, sizeof dir, "%s/attempt_%d/%d", o->log_dir, o->attempt, o->rank_base + i) >= (int)sizeof dir - 16) {
                st = ct_error(CT_ERR_INVALID, "log directory name of %zu characters is too long (at most %d)",
                              strlen(o->log_dir), PATH_MAX - 64);
                break;
            }
            if (mkdirs(dir)) { st = ct_error(CT_ERR_IO, "cannot create log directory %s: %s", dir, strerror(errno)); break; }
            snprintf(path, sizeof path, "%s/stdout.log", dir);
            w->logo = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            snprintf(path, sizeof path, "%s/stderr.log", dir);
            w->loge = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        }
        if ((want_out_pipe && pipe2(po, O_CLOEXEC)) || pipe2(pe, O_CLOEXEC)) {
            st = ct_error(CT_ERR_SYSTEM, "pipe: %s", strerror(errno));
            break;
        }
        pid_t pid = fork();
        if (pid < 0) { st = ct_error(CT_ERR_SYSTEM, "fork: %s", strerror(errno)); close(pe[0]); close(pe[1]); break; }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* until the keeper takes over */
            if (getppid() != parent) _exit(1); /* the supervisor died before prctl */
            if (pidfd >= 0) close(pidfd); /* the lock is the supervisor's alone */
            setpgid(0, 0);
            if (po[1] >= 0) dup2(po[1], 1);
            dup2(pe[1], 2);
            signal(SIGPIPE, SIG_DFL);
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            signal(SIGUSR1, SIG_DFL);
            keeper_run(o, i, parent, prog_pids);
        }
        setpgid(pid, pid); /* also here, so signal_all cannot race the child */
        started++;
        w->pid = pid;
        w->alive = 1;
        if (po[1] >= 0) close(po[1]);
        close(pe[1]);
        w->out = po[0];
        w->err = pe[0];
    }
    if (pidfd >= 0) pid_file_write(pidfd, ws, started);
    if (st == CT_OK && o->after_fork) st = o->after_fork(o->after_fork_ctx);
    if (st != CT_OK) {
        signal_all(ws, started, SIGKILL);
        for (int i = 0; i < started; i++) waitpid(ws[i].pid, NULL, 0);
        n = started;
    }
    double stop_deadline = 0; /* when stopping: SIGKILL at this time */
    int stopping = st != CT_OK;
    int nalive = st == CT_OK ? n : 0;
    for (;;) {
        int open_fds = 0;
        for (int i = 0; i < n; i++) open_fds += (ws[i].out >= 0) + (ws[i].err >= 0);
        if (nalive == 0 && open_fds == 0) break;
        struct pollfd *pf = calloc((size_t)(2 * n + 1), sizeof *pf);
        int *who = calloc((size_t)(2 * n + 1), sizeof *who);
        int np = 0;
        pf[np++] = (struct pollfd){sfd, POLLIN, 0};
        for (int i = 0; i < n; i++) {
            if (ws[i].out >= 0) { who[np] = i; pf[np++] = (struct pollfd){ws[i].out, POLLIN, 0}; }
            if (ws[i].err >= 0) { who[np] = -1 - i; pf[np++] = (struct pollfd){ws[i].err, POLLIN, 0}; }
        }
        int timeout_ms = 50;
        if (nalive == 0) timeout_ms = 200; /* grandchildren may hold a pipe: give up soon */
        int pr = poll(pf, (nfds_t)np, timeout_ms);
        if (pr == 0 && nalive == 0) { /* drained enough */
            for (int i = 0; i < n; i++) {
                if (ws[i].out >= 0) { close(ws[i].out); ws[i].out = -1; }
                if (ws[i].err >= 0) { close(ws[i].err); ws[i].err = -1; }
            }
        }
        for (int k = 1; k < np && pr > 0; k++) {
            if (!pf[k].revents) continue;
            if (who[k] >= 0) {
                worker_t *w = &ws[who[k]];
                pump(w, &w->out, 1, w->logo, !(o->redirects & 1) || (o->tee & 1), 0);
            } else {
                worker_t *w = &ws[-1 - who[k]];
                pump(w, &w->err, 2, w->loge, !(o->redirects & 2) || (o->tee & 2), 1);
            }
        }
        free(pf);
        free(who);
        if (sfd >= 0) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                int sig = (int)si.ssi_signo;
                if (sig == SIGCHLD) continue;
                bool preempt = sig < 64 && (o->preempt_signals >> sig & 1);
                if (preempt && res->interrupted && (o->preempt_signals >> res->interrupted & 1)) {
                    signal_all(ws, n, sig); /* SIGUSR1 then SIGTERM: the workers are saving already */
                    continue;
                }
                if (res->interrupted) { signal_all(ws, n, SIGKILL); continue; } /* second Ctrl-C */
                res->interrupted = sig;
                signal_all(ws, n, sig == SIGHUP && !preempt ? SIGTERM : sig);
                stopping = 1;
                /* a preempted worker finishes its step and saves: give it the longer grace */
                stop_deadline = ct_time_now() + (preempt && o->preempt_grace_s > o->grace_s ? o->preempt_grace_s : o->grace_s);
            }
        }
        /* reap (our workers only: the caller may have other children) */
        for (int i = 0; i < n; i++) {
            worker_t *w = &ws[i];
            int status;
            if (!w->alive || waitpid(w->pid, &status, WNOHANG) != w->pid) continue;
            w->alive = 0;
            w->status = status;
            w->t_exit = ct_time_now();
            nalive--;
            int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (o->preempted_exit_code && WIFEXITED(status) && WEXITSTATUS(status) == o->preempted_exit_code) {
                res->preempted++; /* saved and stopped for preemption: the others stop at the same step */
                ok = 1;
            }
            if (!ok && !res->failed && !(res->interrupted || (stopping && w->stopped_by_us))) {
                res->failed = 1;
                res->root = i;
                res->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
                res->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
                for (int j = 0; j < n; j++) ws[j].state_at_fail = ws[j].alive ? program_state(ws[j].pid) : 0;
                if (!stopping) {
                    stopping = 1;
                    stop_deadline = ct_time_now() + o->grace_s;
                    for (int j = 0; j < n; j++) if (ws[j].alive) ws[j].stopped_by_us = 1;
                    signal_all(ws, n, SIGTERM);
                }
            }
        }
        if (stopping && nalive > 0 && ct_time_now() >= stop_deadline && stop_deadline > 0) {
            signal_all(ws, n, SIGKILL);
            stop_deadline = ct_time_now() + 3600;
        }
    }
    if (sfd >= 0) close(sfd);
    for (int i = 0; i < n; i++) {
        if (ws[i].logo >= 0) close(ws[i].logo);
        if (ws[i].loge >= 0) close(ws[i].loge);
    }
    cleanup_shm(o->runid);
    if (pidfd >= 0) { /* every worker is reaped: nothing left to kill next time */
        unlink(o->pid_file); /* while locked: see pid_file_take */
        close(pidfd);
    }
    restore_signals(&old);
    if (prog_pids) {
        for (int i = 0; i < n; i++) ws[i].prog = prog_pids[i];
        munmap((void *)prog_pids, pp_bytes);
    }

    /* report: root cause first */
    if (res->failed || res->interrupted) {
        size_t off = 0;
        char *r = res->report;
        size_t cap = sizeof res->report;
        char what[200];
        int srank = res->failed ? stalled_rank(&ws[res->root], o->rank_base, n, what, sizeof what) : -1;
        /* A rank of this node named as missing may itself have timed out waiting for another
         * (rank 0 on rank 1, which waits on a stopped rank of another node, all within one
         * timeout): follow such reports to the rank whose own names nobody, and let the rank
         * that named it be the one that timed out waiting for it. */
        for (int hops = 0; srank >= o->rank_base && srank < o->rank_base + n && hops < n; hops++) {
            char w2[sizeof what];
            int next = stalled_rank(&ws[srank - o->rank_base], o->rank_base, n, w2, sizeof w2);
            if (next < 0 || next == srank) break;
            res->root = srank - o->rank_base;
            if (w2[0]) snprintf(what, sizeof what, "%s", w2);
            srank = next;
        }
        int stalled = srank >= o->rank_base && srank < o->rank_base + n ? srank - o->rank_base : -1;
        if (srank >= 0 && stalled < 0) {
            /* on another node (every node runs n workers): that node's report has its state */
            worker_t *w = &ws[res->root];
            char how[160], tl[3000];
            describe_status(w->status, how, sizeof how);
            /* the summary is one short line: the operation's description cut to fit it */
            snprintf(res->summary, sizeof res->summary, "rank %d on node %d never reached %.160s (rank %d timed out)",
                     srank, srank / n, what[0] ? what : "a collective", o->rank_base + res->root);
            tail_lines(w, tl, sizeof tl, 12);
            off += (size_t)snprintf(r + off, cap - off,
                                    "%s: worker failure (attempt %d)\n  root cause: rank %d (node %d, local rank %d) "
                                    "never reached %s: rank %d (pid %d) timed out waiting for it and %s, %.2f s after "
                                    "start; node %d's report says what became of rank %d\n  last lines of rank %d's "
                                    "stderr:\n%s",
                                    o->who, o->attempt + 1, srank, srank / n, srank % n, what[0] ? what : "a collective",
                                    o->rank_base + res->root, shown_pid(w), how, w->t_exit - t0, srank / n, srank,
                                    o->rank_base + res->root, tl);
        } else if (stalled >= 0 && stalled != res->root) {
            /* the first to fail timed out waiting for `stalled`: name that one first */
            worker_t *w = &ws[res->root], *sw = &ws[stalled];
            char how[160], tl[3000], tbuf[32], st_txt[96] = "";
            describe_status(w->status, how, sizeof how);
            time_t now = time(NULL) - (time_t)(ct_time_now() - w->t_exit);
            struct tm tm;
            localtime_r(&now, &tm);
            strftime(tbuf, sizeof tbuf, "%H:%M:%S", &tm);
            const char *sn = state_name(sw->state_at_fail);
            if (sn) snprintf(st_txt, sizeof st_txt, "; it was %s at that time", sn);
            snprintf(res->summary, sizeof res->summary, "rank %d (pid %d) never reached %s (rank %d timed out)",
                     o->rank_base + stalled, shown_pid(sw), what[0] ? what : "a collective", o->rank_base + res->root);
            tail_lines(w, tl, sizeof tl, 12);
            off += (size_t)snprintf(r + off, cap - off,
                                    "%s: worker failure (attempt %d)\n  root cause: rank %d (local rank %d, pid %d) never "
                                    "reached %s: rank %d (pid %d) timed out waiting for it and %s at %s, %.2f s after "
                                    "start%s\n  last lines of rank %d's stderr:\n%s",
                                    o->who, o->attempt + 1, o->rank_base + stalled, stalled, shown_pid(sw),
                                    what[0] ? what : "a collective", o->rank_base + res->root, shown_pid(w), how, tbuf,
                                    w->t_exit - t0, st_txt, o->rank_base + res->root, tl);
            describe_status(sw->status, how, sizeof how);
            off += (size_t)snprintf(r + off, cap - off, "  rank %d itself: %s%s\n", o->rank_base + stalled, how,
                                    sw->stopped_by_us ? " (stopped by the launcher)" : "");
            /* the rank that timed out is listed with the others below */
            res->root = stalled;
            res->exit_code = WIFEXITED(sw->status) ? WEXITSTATUS(sw->status) : -1;
            res->signal = WIFSIGNALED(sw->status) ? WTERMSIG(sw->status) : 0;
        } else if (res->failed) {
            worker_t *w = &ws[res->root];
            char how[160], tl[3000], tbuf[32];
            describe_status(w->status, how, sizeof how);
            time_t now = time(NULL) - (time_t)(ct_time_now() - w->t_exit);
            struct tm tm;
            localtime_r(&now, &tm);
            strftime(tbuf, sizeof tbuf, "%H:%M:%S", &tm);
            snprintf(res->summary, sizeof res->summary, "rank %d (pid %d) %s", o->rank_base + res->root, shown_pid(w), how);
            tail_lines(w, tl, sizeof tl, 12);
            off += (size_t)snprintf(r + off, cap - off,
                                    "%s: worker failure (attempt %d)\n  root cause: rank %d (local rank %d, pid %d) %s "
                                    "at %s, %.2f s after start\n  last lines of its stderr:\n%s",
                                    o->who, o->attempt + 1, o->rank_base + res->root, res->root, shown_pid(w), how,
                                    tbuf, w->t_exit - t0, tl);
        } else {
            snprintf(res->summary, sizeof res->summary, "interrupted by %s", strsignal(res->interrupted));
            off += (size_t)snprintf(r + off, cap - off, "%s: interrupted by signal %d (%s); workers stopped\n", o->who,
                                    res->interrupted, strsignal(res->interrupted));
        }
        int skip = srank >= 0 && stalled < 0 ? -1 : res->root; /* a rank timed out for another node's: listed too */
        for (int i = 0; i < n && off < cap - 200; i++) {
            if (i == skip) continue;
            char how[160];
            describe_status(ws[i].status, how, sizeof how);
            off += (size_t)snprintf(r + off, cap - off, "  rank %d (pid %d): %s%s\n", o->rank_base + i, shown_pid(&ws[i]),
                                    how, ws[i].stopped_by_us ? " (stopped by the launcher)" : "");
        }
    }
    free(ws);
    return st;
}
