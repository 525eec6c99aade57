/* ctrain worker MODE ...: small distributed programs for testing and timing the launcher.
 *
 *   ctrain run --standalone --nproc-per-node 2 ctrain worker init         # init + finalize
 *   ctrain worker allreduce     all-reduce a rank pattern and check it
 *   ctrain worker env           print the launcher's variables
 *   ctrain worker exit R CODE   rank R writes to stderr and exits with CODE; others wait
 *   ctrain worker signal R SIG  rank R kills itself with SIG; others wait
 *   ctrain worker fail-once R   rank R fails on the first attempt (CTRAIN_RESTART_COUNT=0)
 *   ctrain worker sleep SECS    every rank sleeps (writes its pid to stdout first)
 *   ctrain worker stall R       rank R stops itself (SIGSTOP) after init; the others all-reduce */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ctrain/dist.h"

static int env_rank(void) { return (int)ct_config_int(CT_CFG_RANK); }

static int do_allreduce(void) {
    ct_pg *pg;
    if (ct_dist_init(NULL, &pg)) { fprintf(stderr, "ctrain worker: %s\n", ct_last_error()); return 1; }
    int r = ct_pg_rank(pg), n = ct_pg_size(pg);
    int64_t v[1000];
    for (int i = 0; i < 1000; i++) v[i] = r + i;
    ct_status st = ct_all_reduce_sync(pg, v, 1000, CT_I64, CT_RED_SUM);
    int ok = st == CT_OK;
    for (int i = 0; i < 1000 && ok; i++) ok = v[i] == (int64_t)n * (n - 1) / 2 + (int64_t)n * i;
    printf("rank %d of %d: all-reduce %s\n", r, n, ok ? "ok" : "WRONG");
    if (st) fprintf(stderr, "rank %d: %s\n", r, ct_last_error());
    ct_pg_free(pg);
    return ok ? 0 : 1;
}

int cli_worker(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ctrain worker init|allreduce|env|exit R CODE|signal R SIG|fail-once R|sleep SECS|stall R|timeout-chain\n");
        return 2;
    }
    const char *m = argv[1];
    int rank = env_rank();
    if (!strcmp(m, "init")) {
        ct_pg *pg;
        if (ct_dist_init(NULL, &pg)) { fprintf(stderr, "ctrain worker: %s\n", ct_last_error()); return 1; }
        ct_status st = ct_barrier_sync(pg);
        ct_pg_free(pg);
        return st ? 1 : 0;
    }
    if (!strcmp(m, "allreduce")) return do_allreduce();
    if (!strcmp(m, "env")) {
        static const char *vars[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                                     "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "CTRAIN_RESTART_COUNT",
                                     "OMP_NUM_THREADS", "CTRAIN_TIMEOUT", NULL};
        char line[1024];
        size_t o = 0;
        for (int i = 0; vars[i]; i++) {
            ct_config_var k = (ct_config_var)ct_config_find(vars[i]);
            const char *v = ct_config_is_set(k) ? ct_config_str(k) : ""; /* as set, not the default */
            o += (size_t)snprintf(line + o, sizeof line - o, "%s=%s ", vars[i], v ? v : "");
        }
        printf("%s\n", line);
        return 0;
    }
    if (!strcmp(m, "exit") && argc >= 4) {
        if (rank == atoi(argv[2])) {
            fprintf(stderr, "worker %d: something went wrong, exiting with %s\n", rank, argv[3]);
            return atoi(argv[3]);
        }
        sleep(60);
        return 0;
    }
    if (!strcmp(m, "signal") && argc >= 4) {
        if (rank == atoi(argv[2])) {
            fprintf(stderr, "worker %d: raising signal %s\n", rank, argv[3]);
            fflush(stderr);
            signal(atoi(argv[3]), SIG_DFL);
            raise(atoi(argv[3]));
        }
        sleep(60);
        return 0;
    }
    if (!strcmp(m, "fail-once") && argc >= 3) {
        if (rank == atoi(argv[2]) && ct_config_int(CT_CFG_RESTART_COUNT) == 0) {
            fprintf(stderr, "worker %d: failing on the first attempt\n", rank);
            return 1;
        }
        return do_allreduce();
    }
    if (!strcmp(m, "stall") && argc >= 3) {
        ct_pg *pg;
        if (ct_dist_init(NULL, &pg)) { fprintf(stderr, "ctrain worker: %s\n", ct_last_error()); return 1; }
        if (rank == atoi(argv[2])) raise(SIGSTOP); /* a hung rank: alive, never arriving */
        float v[256] = {0};
        ct_status st = ct_all_reduce_sync(pg, v, 256, CT_F32, CT_RED_SUM);
        if (st) fprintf(stderr, "rank %d: %s\n", rank, ct_last_error());
        ct_pg_free(pg);
        return st ? 1 : 0;
    }
    if (!strcmp(m, "timeout-chain")) {
        /* the reports of a chain of waits, without the collective: rank r < n - 1 says it timed
         * out waiting for rank r + 1, rank 0 last and failing first; the last rank hangs */
        int n = (int)ct_config_int(CT_CFG_WORLD_SIZE);
        if (rank == n - 1) raise(SIGSTOP);
        if (rank == 0) usleep(500000);
        fprintf(stderr, "rank %d: all_reduce #1 (f32 x 256, sum) timed out on rank %d: rank(s) %d never reached it\n", rank, rank, rank + 1);
        if (rank == 0) return 1;
        sleep(60);
        return 0;
    }
    if (!strcmp(m, "sleep") && argc >= 3) {
        printf("pid %d\n", (int)getpid());
        fflush(stdout);
        sleep((unsigned)atoi(argv[2]));
        return 0;
    }
    fprintf(stderr, "ctrain worker: unknown mode '%s'\n", m);
    return 2;
}
