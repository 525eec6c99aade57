/* ctrain bench: collective benchmarks in the style of nccl-tests, and a copy-bandwidth probe.
 *
 *   ctrain bench allreduce -b 8 -e 256M -f 2 -c          # spawns 2 ranks on the shm backend
 *   ctrain run --nproc-per-node 4 -- ctrain bench allreduce -b 1M -e 64M
 *   mpirun -np 2 ctrain bench allreduce --backend mpi
 *   ctrain bench allreduce --backend gloo -b 16M -e 64M     # 2 ranks, Gloo over TCP
 *   ctrain bench allreduce --backend nccl -c                # one rank per GPU, device buffers
 *   ctrain bench copy                                      # single-core memcpy bandwidth
 *
 *   ctrain run --nproc-per-node 4 -- ctrain bench allgather -b 1M -e 64M   # also reducescatter
 *
 * busbw = algbw * 2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter (the
 * nccl-tests convention: the bandwidth each link would need for a ring algorithm; comparable
 * across rank counts). For the latter two the size is the whole gathered buffer (n chunks),
 * as in nccl-tests; they have no -c. time(us) is the mean call; median(us) the median call,
 * each call timed on every rank from the end of the one before, the slowest rank's median taken. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ctrain/dist.h"
#include "ctrain/tensor.h"

typedef struct {
    size_t b, e;
    double f;
    int iters, warmup, check, np, fingerprint, async_mode;
    ct_reduce_op op;
    ct_dtype dt;
    const char *backend;
    int coll; /* BENCH_ALLREDUCE, BENCH_ALLGATHER or BENCH_REDUCE_SCATTER */
} bench_opts;
enum { BENCH_ALLREDUCE, BENCH_ALLGATHER, BENCH_REDUCE_SCATTER };
static const char *const coll_names[] = {"allreduce", "allgather", "reducescatter"};

/* Sizes up to 1 TiB: beyond that the buffer size (size + 4095) wrapped around, a tiny buffer
 * was allocated and filled (a segfault with -e 18446744073709549568), and a double over
 * SIZE_MAX (-e 1e30) cast to size_t is undefined. */
#define MAX_BENCH_BYTES 1099511627776.0
static int parse_size(const char *s, size_t *out) {
    char *e;
    double v = strtod(s, &e);
    if (e == s || !(v >= 0) || !isfinite(v)) return -1;
    switch (*e) {
    case 0: break;
    case 'k': case 'K': v *= 1024; e++; break;
    case 'm': case 'M': v *= 1024 * 1024; e++; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; e++; break;
    default: return -1;
    }
    if (*e == 'B' || *e == 'b') e++;
    if (*e || v > MAX_BENCH_BYTES) return -1;
    *out = (size_t)v;
    return 0;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrain bench allreduce [options]    all-reduce time and bandwidth per size\n"
            "       ctrain bench allgather|reducescatter [options]   the same for those collectives\n"
            "                                           (size: the gathered buffer of all ranks)\n"
            "       ctrain bench copy                   memcpy bandwidth of one core (the ceiling)\n\n"
            "  -b SIZE         smallest size in bytes (default 8; K, M, G suffixes)\n"
            "  -e SIZE         largest size (default 64M)\n"
            "  -f FACTOR       size multiplier (default 2)\n"
            "  -n N            timed iterations per size (default: scaled by size, 20 at least)\n"
            "  -w N            warm-up iterations (default 5)\n"
            "  -c              check results (#wrong column)\n"
            "  --op OP         sum, avg, min, max, prod (default sum)\n"
            "  --dtype DT      f32, f16, bf16, f64, i32, i64 (default f32)\n"
            "  --backend B     shm, mpi, gloo, hier or nccl (default: automatic)\n"
            "  --np N          ranks to spawn when not started by a launcher (default 2; nccl: one per GPU)\n"
            "  --no-fingerprint  turn the desync check off (to measure its cost)\n"
            "  --async         issue through the comm thread (ct_all_reduce + ct_work_wait)\n");
}

static double pattern(int rank, size_t i) { return (double)((long)((i * 5 + (size_t)rank * 3) % 11) - 5); }

static void fill(ct_dtype dt, void *b, size_t n, int rank) {
    for (size_t i = 0; i < n; i++) ct_elem_set(b, dt, i, pattern(rank, i));
}

static size_t count_wrong(const bench_opts *o, const void *b, size_t n, int ranks) {
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        double acc = pattern(0, i);
        for (int r = 1; r < ranks; r++) {
            double v = pattern(r, i);
            switch (o->op) {
            case CT_RED_SUM: case CT_RED_AVG: acc += v; break;
            case CT_RED_PROD: acc *= v; break;
            case CT_RED_MIN: acc = v < acc ? v : acc; break;
            case CT_RED_MAX: acc = v > acc ? v : acc; break;
            default: break;
            }
        }
        if (o->op == CT_RED_AVG) acc = (o->dt == CT_I32 || o->dt == CT_I64) ? (double)((long long)acc / ranks) : acc / ranks;
        double g = ct_elem_get(b, o->dt, i), tol = ct_dtype_is_float(o->dt) ? 1e-2 * (1 + (acc < 0 ? -acc : acc)) : 0;
        if (o->op == CT_RED_PROD && ct_dtype_is_float(o->dt)) tol = 1e-2 * (acc < 0 ? -acc : acc) + 1e-3;
        if (!(g - acc <= tol && acc - g <= tol)) wrong++;
    }
    return wrong;
}

/* The buffer the collectives reduce: the host one, or with the nccl backend device memory on
 * the rank's GPU (the backend's current device), with copies for the correctness check. */
static ct_device coll_dev = {CT_DEV_CPU, 0};
static ct_status coll_buf(ct_pg *pg, void *host, size_t bytes, void **out) {
    *out = host;
    if (ct_pg_caps(pg) & CT_PG_CAP_DEVICE_BUFFERS) {
        ct_status st = ct_device_current(CT_DEV_CUDA, &coll_dev);
        if (st == CT_OK) st = ct_device_alloc(coll_dev, bytes, out);
        if (st != CT_OK) return st;
        return ct_device_copy(coll_dev, *out, host, bytes, true); /* zeros, as the host buffer holds */
    }
    return CT_OK;
}
/* to_dev: host -> collective buffer, else back; nothing when they are the same */
static ct_status coll_copy(void *host, void *coll, size_t bytes, bool to_dev) {
    if (host == coll) return CT_OK;
    return to_dev ? ct_device_copy(coll_dev, coll, host, bytes, true) : ct_device_copy(coll_dev, host, coll, bytes, false);
}
static void coll_free(void *host, void *coll) {
    if (coll != host) ct_device_free(coll_dev, coll);
}

/* One collective of cnt elements (all-gather/reduce-scatter: cnt / n per rank, from and into
 * the two halves of the buffer). */
static ct_status one_coll(const bench_opts *o, ct_pg *pg, void *cb, size_t cnt, int n) {
    size_t part = cnt / (size_t)n, esz = ct_dtype_size(o->dt);
    char *b = cb;
    if (o->coll == BENCH_ALLGATHER) return ct_all_gather_sync(pg, b + cnt * esz, b, part, o->dt);
    if (o->coll == BENCH_REDUCE_SCATTER) return ct_reduce_scatter_sync(pg, b, b + cnt * esz, part, o->dt, o->op);
    if (!o->async_mode) return ct_all_reduce_sync(pg, cb, cnt, o->dt, o->op);
    ct_work *w = ct_all_reduce(pg, cb, cnt, o->dt, o->op);
    ct_status st = ct_work_wait(w);
    ct_work_free(w);
    return st;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int bench_body(bench_opts *o) {
    ct_dist_opts d = ct_dist_default_opts();
    d.backend = o->backend;
    d.fingerprint = o->fingerprint;
    ct_pg *pg;
    if (ct_dist_init(&d, &pg)) {
        fprintf(stderr, "ctrain bench: %s\n", ct_last_error());
        return 1;
    }
    int rank = ct_pg_rank(pg), n = ct_pg_size(pg);
    size_t esz = ct_dtype_size(o->dt);
    size_t room = o->coll == BENCH_ALLREDUCE ? o->e : 2 * o->e; /* input and output apart */
    void *buf = aligned_alloc(4096, (room + 4095) / 4096 * 4096 + 4096);
    if (!buf) { fprintf(stderr, "ctrain bench: out of memory\n"); return 1; }
    memset(buf, 0, room);
    void *cb;
    if (coll_buf(pg, buf, room ? room : 1, &cb) != CT_OK) {
        fprintf(stderr, "ctrain bench: rank %d: %s\n", rank, ct_last_error());
        free(buf);
        ct_pg_free(pg);
        return 1;
    }
    if (rank == 0) {
        printf("# ctrain bench %s: %d ranks, backend %s, %s %s, fingerprints %s, %s calls\n", coll_names[o->coll], n, ct_pg_backend(pg),
               ct_dtype_name(o->dt), ct_reduce_op_name(o->op), o->fingerprint ? "on" : "off",
               o->async_mode ? "async" : "blocking");
        printf("#%14s %12s %6s %6s %12s %12s %12s %8s %12s\n", "size(B)", "count", "type", "redop", "time(us)",
               "algbw(GB/s)", "busbw(GB/s)", "#wrong", "median(us)");
        fflush(stdout);
    }
    int rc = 0;
    for (size_t bytes = o->b; bytes <= o->e; bytes = (size_t)((double)bytes * o->f) > bytes ? (size_t)((double)bytes * o->f) : bytes + 1) {
        size_t cnt = bytes / esz;
        if (o->coll != BENCH_ALLREDUCE) cnt -= cnt % (size_t)n; /* n equal chunks */
        if (!cnt) continue;
        int iters = o->iters > 0 ? o->iters : (int)(((64u << 20) / (cnt * esz)) < 20 ? 20 : ((64u << 20) / (cnt * esz)));
        if (o->iters <= 0 && iters > 20000) iters = 20000;
        ct_status st = CT_OK;
        /* each call's time as well (from the end of the one before): their median leaves out
         * the calls a scheduler time slice fell into, which on cores shared by more processes
         * than they have move a few-ms call's mean by tens of percent */
        double *calls = calloc((size_t)iters, sizeof *calls);
        if (!calls) { fprintf(stderr, "ctrain bench: out of memory\n"); rc = 1; break; }
        for (int i = 0; i < o->warmup && !st; i++) st = one_coll(o, pg, cb, cnt, n);
        if (!st) st = ct_barrier_sync(pg);
        double t0 = ct_time_now(), prev = t0;
        for (int i = 0; i < iters && !st; i++) {
            st = one_coll(o, pg, cb, cnt, n);
            double now = ct_time_now();
            calls[i] = now - prev;
            prev = now;
        }
        double t = (prev - t0) / iters;
        /* each rank's median call, the slowest rank's taken (the slowest rank per call would
         * count every rank's slow calls: back to back, ranks fall behind in turn) */
        qsort(calls, (size_t)iters, sizeof *calls, cmp_double);
        double tm[2] = {t, iters % 2 ? calls[iters / 2] : 0.5 * (calls[iters / 2 - 1] + calls[iters / 2])};
        free(calls);
        if (!st) st = ct_all_reduce_sync(pg, tm, 2, CT_F64, CT_RED_MAX);
        t = tm[0];
        double med = tm[1];
        size_t wrong = 0;
        if (!st && o->check) {
            fill(o->dt, buf, cnt, rank);
            st = coll_copy(buf, cb, cnt * esz, true);
            if (!st) st = ct_all_reduce_sync(pg, cb, cnt, o->dt, o->op);
            if (!st) st = coll_copy(buf, cb, cnt * esz, false);
            if (!st) wrong = count_wrong(o, buf, cnt, n);
            double wf = (double)wrong;
            if (!st) st = ct_all_reduce_sync(pg, &wf, 1, CT_F64, CT_RED_SUM);
            wrong = (size_t)wf;
            memset(buf, 0, cnt * esz); /* keep values small for prod/sum in the next size */
            if (!st) st = coll_copy(buf, cb, cnt * esz, true);
        }
        if (st) {
            fprintf(stderr, "ctrain bench: rank %d: %s\n", rank, ct_last_error());
            rc = 1;
            break;
        }
        if (wrong) rc = 1;
        if (rank == 0) {
            double algbw = (double)(cnt * esz) / t / 1e9;
            double busbw = algbw * (o->coll == BENCH_ALLREDUCE ? 2.0 : 1.0) * (n - 1) / n;
            if (o->check) printf(" %14zu %12zu %6s %6s %12.2f %12.3f %12.3f %8zu %12.2f\n", cnt * esz, cnt, ct_dtype_name(o->dt),
                                 ct_reduce_op_name(o->op), t * 1e6, algbw, busbw, wrong, med * 1e6);
            else printf(" %14zu %12zu %6s %6s %12.2f %12.3f %12.3f %8s %12.2f\n", cnt * esz, cnt, ct_dtype_name(o->dt),
                        ct_reduce_op_name(o->op), t * 1e6, algbw, busbw, "N/A", med * 1e6);
            fflush(stdout);
        }
    }
    coll_free(buf, cb);
    free(buf);
    ct_pg_free(pg);
    return rc;
}

static int bench_child(int rank, int n, void *arg) {
    (void)rank;
    (void)n;
    return bench_body(arg);
}

static int bench_copy(void) {
    size_t sz = 64u << 20;
    char *a = aligned_alloc(4096, sz), *b = aligned_alloc(4096, sz);
    if (!a || !b) return 1;
    memset(a, 1, sz);
    memset(b, 2, sz);
    printf("#%14s %12s %12s\n", "size(B)", "time(us)", "copy(GB/s)");
    for (size_t s = 1u << 20; s <= sz; s *= 4) {
        int it = (int)((1u << 30) / s);
        memcpy(b, a, s);
        double t0 = ct_time_now();
        for (int i = 0; i < it; i++) { memcpy(b, a, s); __asm__ volatile("" ::: "memory"); }
        double t = (ct_time_now() - t0) / it;
        printf(" %14zu %12.2f %12.2f\n", s, t * 1e6, (double)s / t / 1e9);
    }
    free(a);
    free(b);
    return 0;
}

int cli_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "copy")) return bench_copy();
    int coll = -1;
    for (int c = 0; c <= BENCH_REDUCE_SCATTER; c++)
        if (!strcmp(argv[1], coll_names[c])) coll = c;
    if (!strcmp(argv[1], "all_reduce")) coll = BENCH_ALLREDUCE;
    if (coll < 0) {
        fprintf(stderr, "ctrain bench: unknown benchmark '%s' (expected allreduce, allgather, reducescatter or copy)\n",
                argv[1]);
        return 2;
    }
    bench_opts o = {.b = 8, .e = 64u << 20, .f = 2, .iters = 0, .warmup = 5, .np = 2, .fingerprint = 1,
                    .op = CT_RED_SUM, .dt = CT_F32, .coll = coll};
    int np_set = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int need = 1;
        if (!strcmp(a, "-c") || !strcmp(a, "--check")) { o.check = 1; need = 0; }
        else if (!strcmp(a, "--no-fingerprint")) { o.fingerprint = 0; need = 0; }
        else if (!strcmp(a, "--async")) { o.async_mode = 1; need = 0; }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!need) continue;
        if (!v) { fprintf(stderr, "ctrain bench: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "-b") || !strcmp(a, "--minbytes")) { if (parse_size(v, &o.b)) goto bad; }
        else if (!strcmp(a, "-e") || !strcmp(a, "--maxbytes")) { if (parse_size(v, &o.e)) goto bad; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--stepfactor")) {
            char *end;
            o.f = strtod(v, &end);
            if (end == v || *end || !(o.f > 1) || o.f > 1e6) goto bad; /* NaN and inf too */
        }
        else if (!strcmp(a, "-n") || !strcmp(a, "--iters")) { o.iters = atoi(v); if (o.iters < 1) goto bad; }
        else if (!strcmp(a, "-w") || !strcmp(a, "--warmup_iters")) { o.warmup = atoi(v); if (o.warmup < 0) goto bad; }
        else if (!strcmp(a, "--np")) { o.np = atoi(v); np_set = 1; if (o.np < 1) goto bad; }
        else if (!strcmp(a, "--op") || !strcmp(a, "-o")) { if (ct_reduce_op_parse(v, &o.op)) goto bad; }
        else if (!strcmp(a, "--dtype") || !strcmp(a, "-d")) {
            if (ct_dtype_parse(v, &o.dt) || (unsigned)o.dt > CT_I64) goto bad;
        } else if (!strcmp(a, "--backend")) o.backend = v;
        else { fprintf(stderr, "ctrain bench: unknown option '%s' (see ctrain bench --help)\n", a); return 2; }
        continue;
    bad:
        fprintf(stderr, "ctrain bench: bad value '%s' for %s%s\n", v, a,
                !strcmp(a, "-b") || !strcmp(a, "-e") || !strcmp(a, "--minbytes") || !strcmp(a, "--maxbytes")
                    ? " (a size from 0 to 1T, k/M/G suffixes allowed)" : "");
        return 2;
    }
    if (o.b > o.e) { fprintf(stderr, "ctrain bench: -b is larger than -e\n"); return 2; }
    if (coll != BENCH_ALLREDUCE && (o.check || o.async_mode)) {
        fprintf(stderr, "ctrain bench %s: -c and --async are for allreduce only\n", argv[1]);
        return 2;
    }
    /* started by a launcher: be one rank; otherwise spawn the ranks */
    ct_dist_world dw;
    if (ct_dist_detect(&dw)) { fprintf(stderr, "ctrain bench: %s\n", ct_last_error()); return 2; }
    if (strcmp(dw.launcher, "none")) return bench_body(&o);
    const ct_dist_backend *be = o.backend ? ct_dist_backend_find(o.backend) : NULL;
    if (be && (be->caps & CT_PG_CAP_DEVICE_BUFFERS) && !np_set) {
        /* one rank per GPU (NCCL takes one GPU per rank), as nccl-tests' -g */
        char who[96];
        snprintf(who, sizeof who, "ctrain bench: --backend %s", be->name);
        if ((o.np = cli_gpu_count(who)) < 1) return 1;
    }
    ct_status st = ct_spawn(bench_child, o.np, &o);
    if (st) { fprintf(stderr, "ctrain bench: %s\n", ct_last_error()); return 1; }
    return 0;
}
