/* Multi-process collective tests on the shm backend (ct_spawn forks the ranks).
 * Expected values come from small integer patterns, so every dtype is exact. */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "ct_test.h"
#include "ctrain/config.h"
#include "ctrain/dist.h"
#include "dist_pattern.h"

static const ct_dtype DTS[] = {CT_F32, CT_F16, CT_BF16, CT_F64, CT_I32, CT_I64};
static const size_t SIZES[] = {0, 1, 7, 4096, 1000003};
#define NDT 6
#define NSZ 5

static int spawn_ok(ct_spawn_fn fn, int n, void *arg) {
    ct_status st = ct_spawn(fn, n, arg);
    if (st) fprintf(stderr, "  ct_spawn: %s\n", ct_last_error());
    return st == CT_OK;
}

/* ------------------------------------------------------------------ all-reduce and reduce */
static int w_allreduce(int rank, int n, void *arg) {
    (void)arg;
    ct_pg *pg;
    WOK(ct_dist_init(NULL, &pg));
    if (ct_pg_rank(pg) != rank || ct_pg_size(pg) != n) WFAIL("rank/size %d/%d", ct_pg_rank(pg), ct_pg_size(pg));
    void *b = malloc(1000003 * 8);
    for (int d = 0; d < NDT; d++)
        for (int op = 0; op < CT_RED_COUNT_; op++)
            for (int s = 0; s < NSZ; s++) {
                ct_dtype dt = DTS[d];
                size_t cnt = SIZES[s];
                /* the big size for a subset of ops keeps the test fast */
                if (cnt > 5000 && op != CT_RED_SUM && op != CT_RED_MAX && dt != CT_F32) continue;
                for (size_t i = 0; i < cnt; i++) setv(dt, b, i, pat((ct_reduce_op)op, rank, i));
                WOK(ct_all_reduce_sync(pg, b, cnt, dt, (ct_reduce_op)op));
                if (check_reduce(rank, n, dt, (ct_reduce_op)op, b, cnt, "all_reduce")) return 1;
                /* reduce to the last rank: others' buffers stay unchanged */
                int root = n - 1;
                for (size_t i = 0; i < cnt; i++) setv(dt, b, i, pat((ct_reduce_op)op, rank, i));
                WOK(ct_reduce_sync(pg, b, cnt, dt, (ct_reduce_op)op, root));
                if (rank == root) {
                    if (check_reduce(rank, n, dt, (ct_reduce_op)op, b, cnt, "reduce")) return 1;
                } else {
                    for (size_t i = 0; i < cnt; i++)
                        if (getv(dt, b, i) != pat((ct_reduce_op)op, rank, i)) WFAIL("reduce changed a non-root buffer at %zu", i);
                }
            }
    free(b);
    ct_pg_free(pg);
    return 0;
}

CT_TEST(allreduce_2_ranks) { CT_EXPECT(spawn_ok(w_allreduce, 2, NULL)); }
CT_TEST(allreduce_3_ranks) { CT_EXPECT(spawn_ok(w_allreduce, 3, NULL)); }
CT_TEST(allreduce_4_ranks) { CT_EXPECT(spawn_ok(w_allreduce, 4, NULL)); }

/* CTRAIN_SHM_CHUNK=4096 with more than 64 ranks gave rounds of zero elements: the large
 * path never advanced and ended in a false timeout. */
static int w_many_small_chunk(int rank, int n, void *arg) {
    (void)arg;
    ct_pg *pg;
    WOK(ct_dist_init(NULL, &pg));
    enum { CNT = 3000 }; /* 12 KB of f32: over CTRAIN_SHM_SMALL, the chunked path */
    float *b = malloc(CNT * sizeof *b);
    for (int i = 0; i < CNT; i++) b[i] = (float)(rank + i % 7);
    WOK(ct_all_reduce_sync(pg, b, CNT, CT_F32, CT_RED_SUM));
    for (int i = 0; i < CNT; i++)
        if (b[i] != (float)(n * (n - 1) / 2 + n * (i % 7))) WFAIL("element %d: %g", i, (double)b[i]);
    free(b);
    ct_pg_free(pg);
    return 0;
}

CT_TEST(allreduce_65_ranks_4k_chunk) {
    CT_EXPECT_OK(ct_config_set("CTRAIN_SHM_CHUNK", "4096"));
    CT_EXPECT_OK(ct_config_set("CTRAIN_SHM_SMALL", "4096"));
    CT_EXPECT_OK(ct_config_set("CTRAIN_TIMEOUT", "60"));
    CT_EXPECT_OK(ct_config_set("CTRAIN_BIND", "0"));
    double t0 = ct_time_now();
    CT_EXPECT(spawn_ok(w_many_small_chunk, 65, NULL));
    printf("  65 ranks, 4 KiB chunk: %.1f s\n", ct_time_now() - t0);
    ct_config_unset("CTRAIN_SHM_CHUNK");
    ct_config_unset("CTRAIN_SHM_SMALL");
    ct_config_unset("CTRAIN_TIMEOUT");
    ct_config_unset("CTRAIN_BIND");
}

/* Large all-reduces go through cross-memory attach (process_vm_readv) unless CTRAIN_SHM_CMA=0:
 * both paths must sum in rank order, bit for bit, on values where the order shows. A rank on
 * the other path is a named mismatch. arg: the CTRAIN_SHM_CMA value, "auto" (unset: chosen
 * by measurement; the first two large calls go through cross-memory attach, the third through
 * the staged rounds, later ones whichever measured faster), or NULL: rank 1 differs. */
static float rough(int rank, size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 40503 + 17);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return (float)((int)(h % 20001) - 10000) * ldexpf(1.0f, (int)(h >> 27) - 20); /* 2^-20 .. 2^11 */
}
static int w_cma_bits(int rank, int n, void *arg) {
    const char *cma = arg;
    int calls = 2;
    if (cma && !strcmp(cma, "auto")) { ct_config_unset("CTRAIN_SHM_CMA"); calls = 8; }
    else if (cma) ct_config_set("CTRAIN_SHM_CMA", cma);
    else ct_config_set("CTRAIN_SHM_CMA", rank == 1 ? "0" : "1");
    ct_pg *pg;
    WOK(ct_dist_init(NULL, &pg));
    size_t cnt = 1000003; /* 4 MB: many pieces, an odd tail */
    float *b = malloc(cnt * sizeof *b);
    if (!cma) {
        for (size_t i = 0; i < cnt; i++) b[i] = rough(rank, i);
        ct_status st = ct_all_reduce_sync(pg, b, cnt, CT_F32, CT_RED_SUM);
        if (st != CT_ERR_MISMATCH || !strstr(ct_last_error(), "cross-memory attach"))
            WFAIL("expected a mismatch naming the path, got %s: %s", ct_status_str(st), ct_last_error());
        if (rank == 0) fprintf(stderr, "  rank 0: %s\n", ct_last_error());
        free(b);
        ct_pg_free(pg);
        return 0;
    }
    for (int op = 0; op < calls; op++) {
        ct_reduce_op rop = op & 1 ? CT_RED_AVG : CT_RED_SUM;
        for (size_t i = 0; i < cnt; i++) b[i] = rough(rank, i);
        WOK(ct_all_reduce_sync(pg, b, cnt, CT_F32, rop));
        for (size_t i = 0; i < cnt; i++) {
            float e = rough(0, i);
            for (int r = 1; r < n; r++) e += rough(r, i);
            if (rop == CT_RED_AVG) e /= (float)n;
            if (memcmp(&e, &b[i], 4)) WFAIL("CTRAIN_SHM_CMA=%s %s [%zu] = %a, rank order gives %a", cma, ct_reduce_op_name(rop), i, (double)b[i], (double)e);
        }
    }
    free(b);
    ct_pg_free(pg);
    return 0;
}
CT_TEST(allreduce_cma_bits_3_ranks) { CT_EXPECT(spawn_ok(w_cma_bits, 3, "1")); }
CT_TEST(allreduce_staged_bits_3_ranks) { CT_EXPECT(spawn_ok(w_cma_bits, 3, "0")); }
CT_TEST(allreduce_cma_bits_2_ranks) { CT_EXPECT(spawn_ok(w_cma_bits, 2, "1")); }
CT_TEST(allreduce_auto_path_bits_2_ranks) { CT_EXPECT(spawn_ok(w_cma_bits, 2, "auto")); }
CT_TEST(allreduce_cma_mismatch) { CT_EXPECT(spawn_ok(w_cma_bits, 2, NULL)); }

/* ------------------------------------------------------------------ the other collectives */
static int w_collectives(int rank, int n, void *arg) {
    (void)arg;
    ct_pg *pg;
    WOK(ct_dist_init(NULL, &pg));
    size_t maxc = 1000003;
    uint8_t *a = malloc(maxc * 8 * (size_t)n), *b = malloc(maxc * 8 * (size_t)n);
    for (int d = 0; d < NDT; d++)
        for (int s = 0; s < NSZ; s++) {
            ct_dtype dt = DTS[d];
            size_t cnt = SIZES[s], esz = ct_dtype_size(dt);
            if (cnt > 5000 && dt != CT_F32 && dt != CT_BF16) continue;
            /* broadcast from each root */
            for (int root = 0; root < n; root++) {
                for (size_t i = 0; i < cnt; i++) setv(dt, a, i, rank == root ? (double)((i * 3 + (size_t)root) % 17) : -1);
                WOK(ct_broadcast_sync(pg, a, cnt, dt, root));
                for (size_t i = 0; i < cnt; i++)
                    if (getv(dt, a, i) != (double)((i * 3 + (size_t)root) % 17)) WFAIL("broadcast root %d [%zu]", root, i);
            }
            /* all_gather */
            for (size_t i = 0; i < cnt; i++) setv(dt, a, i, (double)((i + (size_t)rank * 11) % 29));
            WOK(ct_all_gather_sync(pg, a, b, cnt, dt));
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < cnt; i++)
                    if (getv(dt, b + (size_t)r * cnt * esz, i) != (double)((i + (size_t)r * 11) % 29))
                        WFAIL("all_gather %s n=%zu block %d [%zu]", ct_dtype_name(dt), cnt, r, i);
            /* all_gather in place (send = own block of recv) */
            for (size_t i = 0; i < cnt; i++) setv(dt, b + (size_t)rank * cnt * esz, i, (double)((i + (size_t)rank) % 5));
            WOK(ct_all_gather_sync(pg, b + (size_t)rank * cnt * esz, b, cnt, dt));
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < cnt; i++)
                    if (getv(dt, b + (size_t)r * cnt * esz, i) != (double)((i + (size_t)r) % 5)) WFAIL("all_gather in place");
            /* reduce_scatter with every op: block j of rank r holds pat(op, r, j*cnt + i) */
            for (int op = 0; op < CT_RED_COUNT_; op++) {
                if (cnt > 5000 && op != CT_RED_SUM) continue;
                for (int j = 0; j < n; j++)
                    for (size_t i = 0; i < cnt; i++) setv(dt, a + (size_t)j * cnt * esz, i, pat((ct_reduce_op)op, rank, (size_t)j * cnt + i));
                WOK(ct_reduce_scatter_sync(pg, a, b, cnt, dt, (ct_reduce_op)op));
                for (size_t i = 0; i < cnt; i++) {
                    double e = expect(dt, (ct_reduce_op)op, n, (size_t)rank * cnt + i);
                    if (getv(dt, b, i) != e) WFAIL("reduce_scatter %s %s n=%zu [%zu] = %g, expected %g", ct_dtype_name(dt),
                                                   ct_reduce_op_name((ct_reduce_op)op), cnt, i, getv(dt, b, i), e);
                }
            }
            /* all_to_all: rank r sends value 1000*r + 10*j + i%7 to rank j */
            for (int j = 0; j < n; j++)
                for (size_t i = 0; i < cnt; i++) setv(dt, a + (size_t)j * cnt * esz, i, (double)(50 * rank + 7 * j + (int)(i % 7)));
            WOK(ct_all_to_all_sync(pg, a, b, cnt, dt));
            for (int j = 0; j < n; j++)
                for (size_t i = 0; i < cnt; i++)
                    if (getv(dt, b + (size_t)j * cnt * esz, i) != (double)(50 * j + 7 * rank + (int)(i % 7)))
                        WFAIL("all_to_all %s n=%zu from %d [%zu] = %g", ct_dtype_name(dt), cnt, j, i, getv(dt, b + (size_t)j * cnt * esz, i));
            WOK(ct_barrier_sync(pg));
            /* send/recv around the ring, in both orders to avoid a cycle of blocked sends */
            int next = (rank + 1) % n, prev = (rank + n - 1) % n;
            for (size_t i = 0; i < cnt; i++) setv(dt, a, i, (double)((i + (size_t)rank * 3) % 23));
            if (rank % 2 == 0) {
                WOK(ct_send_sync(pg, a, cnt, dt, next, 7));
                WOK(ct_recv_sync(pg, b, cnt, dt, prev, 7));
            } else {
                ct_work *rw = ct_recv(pg, b, cnt, dt, prev, 7);
                WOK(ct_send_sync(pg, a, cnt, dt, next, 7));
                WOK(ct_work_wait(rw));
                ct_work_free(rw);
            }
            for (size_t i = 0; i < cnt; i++)
                if (getv(dt, b, i) != (double)((i + (size_t)prev * 3) % 23)) WFAIL("recv %s n=%zu [%zu]", ct_dtype_name(dt), cnt, i);
        }
    free(a);
    free(b);
    ct_pg_free(pg);
    return 0;
}

CT_TEST(collectives_2_ranks) { CT_EXPECT(spawn_ok(w_collectives, 2, NULL)); }
CT_TEST(collectives_3_ranks) { CT_EXPECT(spawn_ok(w_collectives, 3, NULL)); }
CT_TEST(collectives_4_ranks) { CT_EXPECT(spawn_ok(w_collectives, 4, NULL)); }

/* ------------------------------------------------------------------ async */
static int w_async(int rank, int n, void *arg) {
    (void)arg;
    ct_pg *pg;
    WOK(ct_dist_init(NULL, &pg));
    /* a long all-reduce runs on the comm thread while this thread computes */
    size_t cnt = 8u << 20;
    float *g = malloc(cnt * sizeof *g);
    for (size_t i = 0; i < cnt; i++) g[i] = (float)((i + (size_t)rank) % 8);
    ct_work *w = ct_all_reduce(pg, g, cnt, CT_F32, CT_RED_SUM);
    double x = 0;
    int polls = 0;
    while (!ct_work_test(w)) {
        for (int i = 0; i < 10000; i++) x += 1.0 / (i + 1.0);
        polls++;
    }
    WOK(ct_work_wait(w));
    WOK(ct_work_wait(w)); /* repeatable */
    ct_work_free(w);
    if (x <= 0) WFAIL("compute");
    for (size_t i = 0; i < cnt; i += 997) {
        float e = 0;
        for (int r = 0; r < n; r++) e += (float)((i + (size_t)r) % 8);
        if (g[i] != e) WFAIL("async result [%zu] %g != %g", i, g[i], e);
    }
    if (rank == 0) fprintf(stderr, "  overlap: %d compute slices ran during the all-reduce\n", polls);
    /* DDP pattern: many async slices of one flat buffer, then wait all */
    size_t nb = 37, sl = cnt / nb;
    ct_work *ws[64];
    for (size_t i = 0; i < cnt; i++) g[i] = (float)(rank + 1);
    for (size_t k = 0; k < nb; k++)
        ws[k] = ct_all_reduce(pg, g + k * sl, k == nb - 1 ? cnt - k * sl : sl, CT_F32, CT_RED_AVG);
    for (size_t k = 0; k < nb; k++) { WOK(ct_work_wait(ws[k])); ct_work_free(ws[k]); }
    float e = (float)(n * (n + 1) / 2) / (float)n;
    for (size_t i = 0; i < cnt; i += 101)
        if (g[i] != e) WFAIL("bucketed avg [%zu] %g != %g", i, g[i], e);
    /* a sync call after queued async ones runs in order */
    ct_work *a1 = ct_all_reduce(pg, g, 100, CT_F32, CT_RED_SUM);
    WOK(ct_barrier_sync(pg));
    if (!ct_work_test(a1)) WFAIL("queued op not done after a later sync op");
    ct_work_free(a1);
    free(g);
    ct_pg_free(pg);
    return 0;
}
CT_TEST(async_overlap_and_buckets) { CT_EXPECT(spawn_ok(w_async, 2, NULL)); }

/* ------------------------------------------------------------------ subgroups */
static int w_groups(int rank, int n, void *arg) {
    (void)arg;
    (void)n;
    ct_pg *pg;
    WOK(ct_dist_init(NULL, &pg));
    int odd[] = {3, 1}, even[] = {0, 2}, three[] = {2, 0, 3};
    ct_pg *go, *ge, *g3;
    WOK(ct_dist_new_group(pg, odd, 2, &go));
    WOK(ct_dist_new_group(pg, even, 2, &ge));
    WOK(ct_dist_new_group(pg, three, 3, &g3));
    if ((go != NULL) != (rank % 2 == 1) || (ge != NULL) != (rank % 2 == 0) || (g3 != NULL) != (rank != 1))
        WFAIL("membership");
    if (go && ct_pg_rank(go) != (rank == 3 ? 0 : 1)) WFAIL("group rank order");
    int64_t v = rank + 1;
    ct_pg *mine = go ? go : ge;
    WOK(ct_all_reduce_sync(mine, &v, 1, CT_I64, CT_RED_SUM));
    if (v != (rank % 2 ? 2 + 4 : 1 + 3)) WFAIL("subgroup sum %lld", (long long)v);
    if (g3) {
        int64_t x[3] = {0}, me = 100 + rank;
        WOK(ct_all_gather_sync(g3, &me, x, 1, CT_I64));
        if (x[0] != 102 || x[1] != 100 || x[2] != 103) WFAIL("subgroup gather order %lld %lld %lld", (long long)x[0], (long long)x[1], (long long)x[2]);
        /* large message inside a subgroup */
        size_t cnt = 300000;
        float *f = malloc(cnt * 4);
        for (size_t i = 0; i < cnt; i++) f[i] = (float)(i % 10 + (size_t)rank);
        WOK(ct_all_reduce_sync(g3, f, cnt, CT_F32, CT_RED_MAX));
        for (size_t i = 0; i < cnt; i++) if (f[i] != (float)(i % 10 + 3)) WFAIL("subgroup max");
        free(f);
    }
    WOK(ct_barrier_sync(pg)); /* the world still works */
    ct_pg_free(go);
    ct_pg_free(ge);
    ct_pg_free(g3);
    ct_pg_free(pg);
    return 0;
}
CT_TEST(subgroups) { CT_EXPECT(spawn_ok(w_groups, 4, NULL)); }

/* ------------------------------------------------------------------ shared memory, in-place all-reduce */
static int w_shared(int rank, int n, void *arg) {
    (void)arg;
    ct_pg *pg;
    WOK(ct_dist_init(NULL, &pg));
    size_t bytes = 1000003 * 8 + 256;
    uint8_t *mine;
    WOK(ct_pg_alloc_shared(pg, bytes, (void **)&mine));
    if ((uintptr_t)mine % 4096) WFAIL("region not page-aligned");
    for (size_t i = 0; i < bytes; i++) if (mine[i]) WFAIL("region not zeroed at %zu", i);
    const size_t OFF = 64; /* not at the region start: the offset is part of the operation */
    for (int d = 0; d < NDT; d++)
        for (int op = 0; op < CT_RED_COUNT_; op++)
            for (int s = 0; s < NSZ; s++) {
                ct_dtype dt = DTS[d];
                size_t cnt = SIZES[s], esz = ct_dtype_size(dt);
                if (cnt > 5000 && op != CT_RED_SUM && op != CT_RED_AVG && dt != CT_F32) continue;
                memset(mine, 0x5a, OFF);
                void *b = mine + OFF;
                for (size_t i = 0; i < cnt; i++) setv(dt, b, i, pat((ct_reduce_op)op, rank, i));
                memset(mine + OFF + cnt * esz, 0x5a, 64);
                WOK(ct_all_reduce_sync(pg, b, cnt, dt, (ct_reduce_op)op));
                if (check_reduce(rank, n, dt, (ct_reduce_op)op, b, cnt, "in-place all_reduce")) return 1;
                for (size_t i = 0; i < OFF; i++) if (mine[i] != 0x5a) WFAIL("wrote before the buffer");
                for (size_t i = 0; i < 64; i++) if (mine[OFF + cnt * esz + i] != 0x5a) WFAIL("wrote past the buffer");
            }
    /* asynchronous, several slices in flight (DDP's buckets) */
    float *f = (float *)mine;
    size_t seg = 100000;
    for (size_t i = 0; i < 4 * seg; i++) f[i] = (float)(rank + 1) * (float)(i % 97);
    ct_work *w[4];
    for (int k = 0; k < 4; k++) w[k] = ct_all_reduce(pg, f + k * seg, seg, CT_F32, CT_RED_AVG);
    for (int k = 3; k >= 0; k--) { WOK(ct_work_wait(w[k])); ct_work_free(w[k]); }
    float tot = 0;
    for (int r = 0; r < n; r++) tot += (float)(r + 1);
    for (size_t i = 0; i < 4 * seg; i++)
        if (f[i] != tot * (float)(i % 97) / (float)n) WFAIL("async in-place [%zu] = %g", i, f[i]);
    /* ct_barrier_shared_sync: what a peer wrote before it is visible after it */
    for (int round = 0; round < 3; round++) {
        *(int32_t *)mine = rank * 10 + round;
        WOK(ct_barrier_shared_sync(pg));
        for (int r = 0; r < n; r++) {
            const int32_t *p = ct_pg_shared_peer(pg, mine, r);
            if (!p || *p != r * 10 + round) WFAIL("rank %d's value after the shared barrier: %d", r, p ? *p : -1);
        }
        WOK(ct_barrier_shared_sync(pg)); /* nobody writes the next value before every rank read this one */
    }
    /* one rank on the staged path, the others in place: a named mismatch, not garbage */
    float priv[256] = {0};
    ct_status st = ct_all_reduce_sync(pg, rank == 1 ? priv : f, 256, CT_F32, CT_RED_SUM);
    if (st != CT_ERR_MISMATCH || !strstr(ct_last_error(), "in place")) WFAIL("expected a mismatch, got %s: %s", ct_status_str(st), ct_last_error());
    if (rank == 0) fprintf(stderr, "  rank 0: %s\n", ct_last_error());
    ct_pg_free_shared(pg, mine);
    ct_pg_free(pg);
    return 0;
}
CT_TEST(shared_inplace_allreduce_2_ranks) { CT_EXPECT(spawn_ok(w_shared, 2, NULL)); }
CT_TEST(shared_inplace_allreduce_3_ranks) { CT_EXPECT(spawn_ok(w_shared, 3, NULL)); }

/* ------------------------------------------------------------------ failures */
static int w_timeout(int rank, int n, void *arg) {
    (void)arg;
    (void)n;
    ct_dist_opts o = ct_dist_default_opts();
    o.timeout_s = 1.0;
    ct_pg *pg;
    WOK(ct_dist_init(&o, &pg));
    WOK(ct_barrier_sync(pg));
    float x = 1;
    if (rank == 2) {
        sleep(3); /* never shows up in time */
        ct_status st = ct_all_reduce_sync(pg, &x, 1, CT_F32, CT_RED_SUM);
        if (st == CT_OK) WFAIL("sleeper succeeded");
        ct_pg_free(pg);
        return 0;
    }
    double t0 = ct_time_now();
    ct_status st = ct_all_reduce_sync(pg, &x, 1, CT_F32, CT_RED_SUM);
    double t = ct_time_now() - t0;
    if (st != CT_ERR_TIMEOUT) WFAIL("expected a timeout, got %s: %s", ct_status_str(st), ct_last_error());
    if (t > 1.0 + 2.0) WFAIL("took %.2f s", t);
    const char *m = ct_last_error();
    if (!strstr(m, "all_reduce #2") || !strstr(m, "rank(s) 2 never reached")) WFAIL("message: %s", m);
    if (rank == 0) fprintf(stderr, "  rank 0 after %.2f s: %s\n", t, m);
    /* the group is now unusable, and says why */
    if (ct_barrier_sync(pg) == CT_OK || !strstr(ct_last_error(), "earlier failure")) WFAIL("group still usable");
    ct_pg_free(pg);
    return 0;
}
CT_TEST(timeout_names_missing_rank) { CT_EXPECT(spawn_ok(w_timeout, 3, NULL)); }

static int w_desync(int rank, int n, void *arg) {
    int variant = *(int *)arg;
    (void)n;
    ct_pg *pg;
    WOK(ct_dist_init(NULL, &pg));
    float buf[16] = {0};
    ct_status st;
    double t0 = ct_time_now();
    if (variant == 0) /* different op */
        st = rank == 1 ? ct_broadcast_sync(pg, buf, 16, CT_F32, 0) : ct_all_reduce_sync(pg, buf, 16, CT_F32, CT_RED_SUM);
    else if (variant == 2) /* different op, the all-reduce on the tiny path (<= 48 B) */
        st = rank == 1 ? ct_broadcast_sync(pg, buf, 2, CT_F32, 0) : ct_all_reduce_sync(pg, buf, 2, CT_F32, CT_RED_SUM);
    else if (variant == 3) /* different sizes, both tiny */
        st = ct_all_reduce_sync(pg, buf, rank == 1 ? 2 : 3, CT_F32, CT_RED_SUM);
    else /* different size, large on one side */
        st = ct_all_reduce_sync(pg, rank == 1 ? buf : (float *)calloc(1 << 20, 4), rank == 1 ? 16 : 1 << 20, CT_F32, CT_RED_SUM);
    if (st != CT_ERR_MISMATCH) WFAIL("expected a mismatch, got %s: %s", ct_status_str(st), ct_last_error());
    const char *m = ct_last_error();
    if ((variant == 0 || variant == 2) && !(strstr(m, "broadcast") && strstr(m, "all_reduce")))
        WFAIL("message does not name both: %s", m);
    if (variant == 3 && !(strstr(m, "x 2,") && strstr(m, "x 3,"))) WFAIL("message does not name both: %s", m);
    if (variant == 1 && !(strstr(m, "x 16,") && strstr(m, "x 1048576"))) WFAIL("message does not name both: %s", m);
    if (ct_time_now() - t0 > 2) WFAIL("slow detection");
    if (rank == 0) fprintf(stderr, "  rank 0: %s\n", m);
    ct_pg_free(pg);
    return 0;
}
CT_TEST(desync_different_op) { int v = 0; CT_EXPECT(spawn_ok(w_desync, 3, &v)); }
CT_TEST(desync_different_size) { int v = 1; CT_EXPECT(spawn_ok(w_desync, 2, &v)); }
CT_TEST(desync_tiny_different_op) { int v = 2; CT_EXPECT(spawn_ok(w_desync, 3, &v)); }
CT_TEST(desync_tiny_different_size) { int v = 3; CT_EXPECT(spawn_ok(w_desync, 2, &v)); }

static int count_segments(void) {
    DIR *d = opendir("/dev/shm");
    int c = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) c += !strncmp(e->d_name, "ctrain-", 7);
    if (d) closedir(d);
    return c;
}

static int w_killed(int rank, int n, void *arg) {
    (void)arg;
    (void)n;
    ct_pg *pg;
    WOK(ct_dist_init(NULL, &pg));
    WOK(ct_barrier_sync(pg));
    if (rank == 1) raise(SIGKILL);
    float x[1000] = {0};
    double t0 = ct_time_now();
    ct_status st = ct_all_reduce_sync(pg, x, 1000, CT_F32, CT_RED_SUM);
    if (st == CT_OK) WFAIL("all-reduce with a dead peer succeeded");
    fprintf(stderr, "  rank %d after %.2f s: %s\n", rank, ct_time_now() - t0, ct_last_error());
    return 5; /* the parent sees the SIGKILL first anyway */
}

CT_TEST(killed_rank_leaves_no_segment) {
    int before = count_segments();
    setenv("CTRAIN_GRACE", "2", 1);
    double t0 = ct_time_now();
    ct_status st = ct_spawn(w_killed, 3, NULL);
    double t = ct_time_now() - t0;
    CT_EXPECT_EQ(st, CT_ERR_PEER);
    CT_EXPECT(strstr(ct_last_error(), "rank 1") && strstr(ct_last_error(), "signal 9"));
    CT_EXPECT(t < 5);
    CT_EXPECT_EQ(count_segments(), before);
}

static int w_exit3(int rank, int n, void *arg) {
    (void)n;
    (void)arg;
    if (rank == 2) { fprintf(stderr, "rank 2 giving up\n"); return 3; }
    sleep(30); /* must be stopped by ct_spawn */
    return 0;
}
CT_TEST(spawn_reports_root_cause) {
    setenv("CTRAIN_GRACE", "1", 1);
    double t0 = ct_time_now();
    ct_status st = ct_spawn(w_exit3, 3, NULL);
    CT_EXPECT_EQ(st, CT_ERR_PEER);
    CT_EXPECT(strstr(ct_last_error(), "rank 2") && strstr(ct_last_error(), "code 3"));
    CT_EXPECT(ct_time_now() - t0 < 3);
}

/* ------------------------------------------------------------------ fork safety */
/* ct_spawn must fork with no other thread alive (the store thread starts afterwards): a
 * child inherits only the forking thread, and locks the others held stay held. The
 * pthread_atfork prepare handler runs in the parent right before each fork. */
static int atfork_armed, atfork_forks, atfork_max_threads;
static void count_threads_at_fork(void) {
    if (!atfork_armed) return;
    DIR *d = opendir("/proc/self/task");
    int c = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) c += e->d_name[0] != '.';
    if (d) closedir(d);
    atfork_forks++;
    if (c > atfork_max_threads) atfork_max_threads = c;
}
static int w_store_works(int rank, int n, void *arg) {
    (void)arg;
    ct_pg *pg;
    WOK(ct_dist_init(NULL, &pg));
    int64_t v = rank + 1;
    WOK(ct_all_reduce_sync(pg, &v, 1, CT_I64, CT_RED_SUM));
    if (v != (int64_t)n * (n + 1) / 2) WFAIL("sum %lld", (long long)v);
    ct_pg_free(pg);
    return 0;
}
CT_TEST(spawn_forks_single_threaded) {
    static int registered;
    if (!registered) registered = !pthread_atfork(count_threads_at_fork, NULL, NULL);
    CT_EXPECT(registered);
    atfork_forks = atfork_max_threads = 0;
    atfork_armed = 1;
    CT_EXPECT(spawn_ok(w_store_works, 3, NULL));
    atfork_armed = 0;
    CT_EXPECT_EQ(atfork_forks, 3);
    CT_EXPECT_EQ(atfork_max_threads, 1);
}

/* ------------------------------------------------------------------ misc */
static int w_single(int rank, int n, void *arg) {
    (void)arg;
    (void)n;
    ct_pg *pg;
    WOK(ct_dist_init(NULL, &pg));
    double v[5] = {1, 2, 3, 4, 5}, g[5];
    WOK(ct_all_reduce_sync(pg, v, 5, CT_F64, CT_RED_AVG));
    if (v[4] != 5) WFAIL("1-rank avg");
    WOK(ct_all_gather_sync(pg, v, g, 5, CT_F64));
    if (g[2] != 3) WFAIL("1-rank gather");
    WOK(ct_reduce_scatter_sync(pg, v, g, 5, CT_F64, CT_RED_SUM));
    if (g[3] != 4) WFAIL("1-rank reduce_scatter");
    WOK(ct_barrier_sync(pg));
    if (ct_send_sync(pg, v, 1, CT_F64, 0, 0) != CT_ERR_INVALID) WFAIL("send to self accepted");
    if (ct_broadcast_sync(pg, v, 1, CT_F64, 3) != CT_ERR_INVALID) WFAIL("bad root accepted");
    if (ct_all_reduce_sync(pg, v, 1, CT_U8, CT_RED_SUM) != CT_ERR_INVALID) WFAIL("u8 accepted");
    unsigned caps = ct_pg_caps(pg); /* shm: shared allocations, host buffers */
    if (!(caps & CT_PG_CAP_SHARED_MEMORY) || (caps & (CT_PG_CAP_DEVICE_BUFFERS | CT_PG_CAP_MULTI_MACHINE)))
        WFAIL("caps of %s: %#x", ct_pg_backend(pg), caps);
    ct_pg_free(pg);
    return rank;
}
CT_TEST(single_rank_world_and_bad_args) { CT_EXPECT(spawn_ok(w_single, 1, NULL)); }

CT_TEST(init_rejects_bad_env) {
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "2", 1);
    ct_pg *pg = NULL;
    CT_EXPECT_EQ(ct_dist_init(NULL, &pg), CT_ERR_INVALID);
    CT_EXPECT(strstr(ct_last_error(), "RANK=2 is not below WORLD_SIZE=2") != NULL);
    setenv("RANK", "x", 1);
    CT_EXPECT_EQ(ct_dist_init(NULL, &pg), CT_ERR_INVALID);
    setenv("RANK", "0", 1);
    setenv("CTRAIN_BACKEND", "bogus", 1);
    CT_EXPECT_EQ(ct_dist_init(NULL, &pg), CT_ERR_INVALID);
    unsetenv("CTRAIN_BACKEND");
    ct_dist_opts o = ct_dist_default_opts();
    o.backend = "bogus"; /* the environment's is checked against the config table first */
    CT_EXPECT_EQ(ct_dist_init(&o, &pg), CT_ERR_INVALID);
    CT_EXPECTF(strstr(ct_last_error(), "unknown backend 'bogus' (expected shm, mpi, gloo, hier or nccl)") != NULL,
               "message: %s", ct_last_error());
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    CT_EXPECT(pg == NULL);
}

/* The backend table: every name once, found by name, what each can do; one that is not in
 * this build fails ct_dist_init at once with its reason, before any store */
CT_TEST(backend_table) {
    int n = 0;
    const ct_dist_backend *b;
    for (; (b = ct_dist_backend_at(n)); n++) {
        CT_EXPECT(ct_dist_backend_find(b->name) == b);
        CT_EXPECT(b->about && *b->about && b->missing);
        if (b->built) continue;
        ct_dist_opts o = ct_dist_default_opts();
        o.rank = 0;
        o.world_size = 1;
        o.backend = b->name;
        ct_pg *pg = NULL;
        CT_EXPECT_EQ(ct_dist_init(&o, &pg), CT_ERR_UNSUPPORTED);
        CT_EXPECTF(!strncmp(ct_last_error(), "this build has no ", 18), "%s: %s", b->name, ct_last_error());
        CT_EXPECT(pg == NULL);
    }
    CT_EXPECT_EQ(n, 5);
    /* CTRAIN_BACKEND takes the same names (core's config table cannot ask this one) */
    char names[128] = "";
    for (int i = 0; (b = ct_dist_backend_at(i)); i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? "|" : "", b->name);
    CT_EXPECTF(!strcmp(ct_config_info_of(CT_CFG_BACKEND)->choices, names), "config %s, table %s",
               ct_config_info_of(CT_CFG_BACKEND)->choices, names);
    CT_EXPECT(ct_dist_backend_at(-1) == NULL);
    CT_EXPECT(ct_dist_backend_find("bogus") == NULL && ct_dist_backend_find(NULL) == NULL);
    b = ct_dist_backend_find("shm");
    CT_EXPECT(b && b->built && (b->caps & CT_PG_CAP_SHARED_MEMORY) && !(b->caps & CT_PG_CAP_MULTI_MACHINE));
    b = ct_dist_backend_find("nccl");
    CT_EXPECT(b && (b->caps & CT_PG_CAP_DEVICE_BUFFERS) && !(b->caps & CT_PG_CAP_SHARED_MEMORY));
    CT_EXPECT_EQ(ct_pg_caps(NULL), 0u);
}

/* srun's variables (no PMIx): the layout from SLURM_STEP_TASKS_PER_NODE when
 * --ntasks-per-node was not given; a step over several machines with no MASTER_ADDR is
 * refused before anything waits on a store that only rank 0's machine could reach */
CT_TEST(srun_layout_and_no_meeting_place) {
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_NTASKS", "4", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2)", 1);
    ct_dist_world w;
    CT_EXPECT_OK(ct_dist_detect(&w));
    CT_EXPECT_EQ(w.rank, 3);
    CT_EXPECT_EQ(w.world_size, 4);
    CT_EXPECT_EQ(w.local_rank, 1);
    CT_EXPECT_EQ(w.local_world_size, 2);
    CT_EXPECT(!strcmp(w.launcher, "slurm"));
    setenv("SLURM_STEP_NUM_NODES", "2", 1);
    ct_pg *pg = NULL;
    CT_EXPECT_EQ(ct_dist_init(NULL, &pg), CT_ERR_INVALID);
    CT_EXPECT(strstr(ct_last_error(), "srun started 2 machines without PMIx and MASTER_ADDR is unset") != NULL);
    CT_EXPECT(pg == NULL);
    const char *vars[] = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE",
                          "SLURM_STEP_NUM_NODES"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

CT_TEST_MAIN()
