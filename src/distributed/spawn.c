/* ct_spawn (torch.multiprocessing.spawn for C) and the `ctrain env --check` self-test. */
#include "distributed/dist_internal.h"
#include "ctrain/config.h"
#include "ctrain/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    ct_spawn_fn fn;
    void *arg;
    int n, port;
    const char *token, *runid;
} spawn_ctx;

static int spawn_child(int idx, void *p) {
    spawn_ctx *c = p;
    char r[32], n[32], port[32];
    snprintf(r, sizeof r, "%d", idx);
    snprintf(n, sizeof n, "%d", c->n);
    snprintf(port, sizeof port, "%d", c->port);
    const char *vars[][2] = {{"RANK", r}, {"LOCAL_RANK", r}, {"WORLD_SIZE", n}, {"LOCAL_WORLD_SIZE", n},
                             {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}, {"CTRAIN_STORE_TOKEN", c->token},
                             {"CTRAIN_STORE_HOSTED", "1"}, {"CTRAIN_RUN_ID", c->runid}, {"CTRAIN_RESTART_COUNT", "0"}};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        if (ct_config_set(vars[i][0], vars[i][1]) != CT_OK) {
            fprintf(stderr, "ct_spawn: rank %d: %s\n", idx, ct_last_error());
            return 1;
        }
    }
    ct_config_unset("OMPI_COMM_WORLD_SIZE"); /* a spawned job is not an MPI job */
    ct_log_set_rank(idx);
    return c->fn(idx, c->n, c->arg);
}

static ct_status start_store(void *srv) { return ct_store_server_run(srv); }

ct_status ct_spawn(ct_spawn_fn fn, int nprocs, void *arg) {
    if (!fn || nprocs < 1) return ct_error(CT_ERR_INVALID, "ct_spawn: need a function and nprocs >= 1");
    char token[40], runid[24];
    ct_random_hex(token, 16);
    ct_random_hex(runid, 6);
    /* The store thread starts only after the fork()s (ct_sup_run's after_fork, with the
     * signals blocked so that it never receives them): a child of a multithreaded parent
     * can inherit locks held by the other threads (malloc's, ASan's allocator) and hang.
     * Until then the children's connections wait in the listen backlog. */
    ct_store_server *srv = NULL;
    ct_status st = ct_store_server_listen("127.0.0.1", 0, token, &srv);
    if (st) return st;
    spawn_ctx c = {fn, arg, nprocs, ct_store_server_port(srv), token, runid};
    ct_sup_opts o = {.n = nprocs, .fn = spawn_child, .ctx = &c, .runid = runid, .who = "ct_spawn",
                     .after_fork = start_store, .after_fork_ctx = srv};
    o.grace_s = ct_config_float(CT_CFG_GRACE);
    ct_sup_result *res = calloc(1, sizeof *res);
    if (!res) { ct_store_server_stop(srv); return ct_error(CT_ERR_NOMEM, "spawn"); }
    st = ct_sup_run(&o, res);
    ct_store_server_stop(srv);
    if (st == CT_OK && (res->failed || res->interrupted)) {
        fputs(res->report, stderr);
        st = ct_error(CT_ERR_PEER, "%s", res->summary);
    }
    free(res);
    return st;
}

/* ------------------------------------------------------------------ self-check */
typedef struct {
    int ok;
    double busbw;
    char msg[256];
} check_out;

static int selfcheck_worker(int rank, int n, void *arg) {
    check_out *out = arg; /* shared mapping: rank 0 writes it */
    ct_pg *pg;
    ct_dist_opts o = ct_dist_default_opts();
    o.backend = "shm"; /* whatever CTRAIN_BACKEND says: this checks the shm backend */
    if (ct_dist_init(&o, &pg)) {
        if (rank == 0) snprintf(out->msg, sizeof out->msg, "init failed: %s", ct_last_error());
        return 1;
    }
    static const size_t sizes[] = {1, 7, 4096, 1000003};
    int ok = 1;
    for (size_t s = 0; s < 4 && ok; s++) {
        size_t cnt = sizes[s];
        float *b = malloc(cnt * sizeof *b);
        for (size_t i = 0; i < cnt; i++) b[i] = (float)((i * 7 + (size_t)rank) % 1000);
        if (ct_all_reduce_sync(pg, b, cnt, CT_F32, CT_RED_SUM)) {
            if (rank == 0) snprintf(out->msg, sizeof out->msg, "all-reduce failed: %s", ct_last_error());
            ok = 0;
        }
        for (size_t i = 0; i < cnt && ok; i++) {
            float want = 0;
            for (int r = 0; r < n; r++) want += (float)((i * 7 + (size_t)r) % 1000);
            if (b[i] != want) {
                if (rank == 0) snprintf(out->msg, sizeof out->msg, "wrong result at %zu of %zu: %g != %g", i, cnt, b[i], want);
                ok = 0;
            }
        }
        free(b);
    }
    if (ok) {
        size_t cnt = (16u << 20) / 4;
        float *b = calloc(cnt, sizeof *b);
        ct_all_reduce_sync(pg, b, cnt, CT_F32, CT_RED_SUM);
        ct_barrier_sync(pg);
        double t0 = ct_time_now();
        int it = 10;
        for (int i = 0; i < it; i++) ct_all_reduce_sync(pg, b, cnt, CT_F32, CT_RED_SUM);
        double t = (ct_time_now() - t0) / it;
        if (rank == 0) out->busbw = 2.0 * (n - 1) / n * (double)(cnt * 4) / t / 1e9;
        free(b);
    }
    if (rank == 0) out->ok = ok;
    ct_pg_free(pg);
    return ok ? 0 : 1;
}

ct_status ct_dist_selfcheck(int nranks, double *busbw_gbps, char *report, size_t n) {
    if (nranks < 2) nranks = 2;
    check_out *out = mmap(NULL, sizeof *out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (out == MAP_FAILED) return ct_error(CT_ERR_SYSTEM, "mmap");
    memset(out, 0, sizeof *out);
    double t0 = ct_time_now();
    ct_status st = ct_spawn(selfcheck_worker, nranks, out);
    double t = ct_time_now() - t0;
    if (busbw_gbps) *busbw_gbps = out->busbw;
    if (st == CT_OK && out->ok) {
        if (report)
            snprintf(report, n, "all-reduce on %d ranks (shm): correct for 1..1000003 floats; bus bandwidth %.2f GB/s at "
                     "16 MiB; %.2f s in all", nranks, out->busbw, t);
    } else {
        if (report)
            snprintf(report, n, "all-reduce on %d ranks (shm) FAILED: %s", nranks, out->msg[0] ? out->msg : ct_last_error());
        if (st == CT_OK) st = ct_error(CT_ERR_PEER, "%s", out->msg);
    }
    munmap(out, sizeof *out);
    return st;
}
