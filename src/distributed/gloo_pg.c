/* gloo backend: Gloo's CPU collectives over TCP (the engine PyTorch's CPU jobs use), for a job
 * across machines started without mpirun (`ctrain run --nnodes N`). The Gloo calls are in
 * gloo.cc (C++); this file adapts ct_pg and ct_work to them.
 * Rendezvous: Gloo's address exchange goes through the job's store, under pg->prefix + "gloo/"
 * (a subgroup adds its number). Connections start from this host's address on the interface
 * that reaches MASTER_ADDR, or CTRAIN_GLOO_IFADDR.
 * Reductions fold ranks 0..n-1 in that order for every element, as the shm backend does, so
 * a job gets the same bits on one machine (shm) as across several (Gloo's own ring adds in a
 * rotating order: last-bit differences that 200 SGD steps of the CNN grew to 35% relative in
 * the weights). All-reduce: rank p reduces part p of the buffer, peer to peer over Gloo's TCP
 * pairs, then sends it to all, in 1 MiB segments two in flight (gloo.cc): the ring's traffic,
 * (n-1)/n of the buffer out and in, twice. Every dtype and op (ct_reduce2), AVG dividing in the
 * last pass as shm does. Reduce is an all-reduce whose result only the root keeps;
 * reduce-scatter is an all-to-all (every block straight to its rank, gloo.cc) and the ordered
 * sum. Fingerprints are one extra 24-byte all-gather per operation, as in the mpi backend. */
#if CT_HAVE_GLOO
#include "distributed/dist_internal.h"
#include "distributed/pg_common.h"
#include "distributed/gloo.h"
#include "ctrain/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    ct_gloo_comm *comm;
    ct_store *store;
    int rank, n, fingerprint;
    unsigned ngroups; /* subgroups made from this one: names their keys */
    double timeout;
    char ns[160], ifaddr[INET6_ADDRSTRLEN];
    void *stage, *pad; /* all-to-all output; a padded or private copy of the buffer */
    size_t stage_cap, pad_cap;
} gloo_pg;

static void *grow(void **p, size_t *cap, size_t bytes) {
    if (*cap < bytes) {
        void *q = realloc(*p, bytes);
        if (!q) return NULL;
        *p = q;
        *cap = bytes;
    }
    return *p;
}

/* Gloo's tag for step `phase` (0-3) of collective w: no two messages in flight share a slot. */
static uint32_t tag_of(const ct_work *w, uint32_t phase) { return w->seq * 4u + phase; }

/* root: broadcast's; the rest ignore it */
static ct_status run_op(gloo_pg *g, ct_gloo_kind kind, const void *s, void *r, size_t count, size_t esz, int root,
                        uint32_t tag, double deadline, const char *what) {
    double left = deadline - ct_time_now();
    ct_gloo_op op = {.kind = kind, .sbuf = s, .rbuf = r, .count = count, .esize = esz, .peer = root, .tag = tag,
                     .timeout_s = left > 0.001 ? left : 0.001, .what = what};
    return ct_gloo_comm_run(g->comm, &op);
}

/* in: n blocks of `part` elements, block p for rank p. out (may alias in): the reduction of
 * this rank's block over every rank, in rank order, AVG dividing in the last pass. */
static ct_status reduce_scatter_ordered(gloo_pg *g, const ct_work *w, const void *in, void *out, size_t part,
                                        double deadline, const char *what) {
    size_t esz = ct_dtype_size(w->dt), blk = part * esz;
    uint8_t *st = grow(&g->stage, &g->stage_cap, blk * (size_t)g->n);
    if (!st) return ct_error(CT_ERR_NOMEM, "%s: gloo backend: %zu bytes of staging", what, blk * (size_t)g->n);
    ct_status rc = run_op(g, CT_GLOO_ALLTOALL, in, st, part, esz, 0, tag_of(w, 1), deadline, what);
    if (rc) return rc;
    const void *prev = st;
    for (int r = 1; r < g->n; r++) { /* out is the accumulator: no source aliases it */
        ct_reduce2(w->dt, w->rop, out, NULL, prev, st + (size_t)r * blk, part, r == g->n - 1 ? g->n : 0);
        prev = out;
    }
    return CT_OK;
}

typedef struct {
    const ct_work *w;
    int n;
} combine_ctx;

static void combine_cb(void *dst, const void *a, const void *b, size_t n, int last, const void *arg) {
    const combine_ctx *c = arg;
    ct_reduce2(c->w->dt, c->w->rop, dst, NULL, a, b, n, last ? c->n : 0);
}

/* buf gets the all-reduce of every rank's buf, or (keep: reduce on a rank other than the
 * root) stays as it was. */
static ct_status allreduce_ordered(gloo_pg *g, const ct_work *w, void *buf, int keep, double deadline,
                                   const char *what) {
    size_t esz = ct_dtype_size(w->dt), n = (size_t)g->n, part = (w->count + n - 1) / n;
    uint8_t *all = buf;
    if (keep || part * n != w->count) { /* equal parts: pad */
        all = grow(&g->pad, &g->pad_cap, part * n * esz);
        if (!all) return ct_error(CT_ERR_NOMEM, "%s: gloo backend: %zu bytes of staging", what, part * n * esz);
        memcpy(all, buf, w->count * esz);
        memset(all + w->count * esz, 0, (part * n - w->count) * esz);
    }
    double left = deadline - ct_time_now();
    combine_ctx cc = {w, g->n};
    ct_gloo_op op = {.kind = CT_GLOO_ALLREDUCE_ORDERED, .rbuf = all, .count = part * n, .esize = esz,
                     .tag = tag_of(w, 1), .timeout_s = left > 0.001 ? left : 0.001, .what = what,
                     .combine = combine_cb, .combine_arg = &cc};
    ct_status rc = ct_gloo_comm_run(g->comm, &op);
    if (!rc && all != buf && !keep) memcpy(buf, all, w->count * esz);
    return rc;
}

/* The fingerprint exchange: a 24-byte all-gather in the collective's first tag slot */
typedef struct {
    gloo_pg *g;
    const char *what;
} fp_ctx;

static ct_status fp_allgather(void *ctx, const ct_work *w, const void *mine, void *all, size_t bytes, double deadline) {
    const fp_ctx *c = ctx;
    return run_op(c->g, CT_GLOO_ALLGATHER, mine, all, bytes, 1, 0, tag_of(w, 0), deadline, c->what);
}

static ct_status gloo_run(void *impl, ct_work *w, double deadline) {
    gloo_pg *g = impl;
    char what[CT_WORK_DESC];
    ct_work_describe(w, what, sizeof what);
    fp_ctx fc = {g, what};
    ct_status fst = ct_op_fp_check(w, g->fingerprint, g->n, g->rank, NULL, fp_allgather, &fc, deadline);
    if (fst) return fst;
    size_t esz = ct_dtype_size(w->dt);
    if (g->n == 1 || (w->count == 0 && w->kind != CT_OP_BARRIER)) {
        if (w->kind == CT_OP_REDUCE_SCATTER || w->kind == CT_OP_ALLGATHER || w->kind == CT_OP_ALLTOALL) {
            if (w->rbuf != w->sbuf) memmove(w->rbuf, w->sbuf, w->count * esz);
        }
        if (g->n == 1 && w->rop == CT_RED_AVG &&
            (w->kind == CT_OP_ALLREDUCE || w->kind == CT_OP_REDUCE || w->kind == CT_OP_REDUCE_SCATTER))
            ct_reduce_scale(w->dt, w->rbuf, w->count, 1);
        if (g->n == 1 && ct_op_is_p2p(w->kind))
            return ct_error(CT_ERR_INVALID, "%s: no other rank in a group of 1", what);
        return CT_OK;
    }
    uint32_t t = tag_of(w, 1);
    switch (w->kind) {
    case CT_OP_ALLREDUCE: return allreduce_ordered(g, w, w->rbuf, 0, deadline, what);
    /* the root's rank-order sum; the others' buffers stay as they were */
    case CT_OP_REDUCE: return allreduce_ordered(g, w, w->rbuf, g->rank != w->peer, deadline, what);
    case CT_OP_REDUCE_SCATTER: return reduce_scatter_ordered(g, w, w->sbuf, w->rbuf, w->count, deadline, what);
    case CT_OP_BROADCAST: return run_op(g, CT_GLOO_BROADCAST, NULL, w->rbuf, w->count, esz, w->peer, t, deadline, what);
    case CT_OP_ALLGATHER: return run_op(g, CT_GLOO_ALLGATHER, w->sbuf, w->rbuf, w->count, esz, 0, t, deadline, what);
    case CT_OP_ALLTOALL: return run_op(g, CT_GLOO_ALLTOALL, w->sbuf, w->rbuf, w->count, esz, 0, t, deadline, what);
    case CT_OP_BARRIER: return run_op(g, CT_GLOO_BARRIER, NULL, NULL, 0, 1, 0, t, deadline, what);
    case CT_OP_SEND: case CT_OP_RECV: {
        double left = deadline - ct_time_now();
        ct_gloo_op op = {.kind = w->kind == CT_OP_SEND ? CT_GLOO_SEND : CT_GLOO_RECV, .sbuf = w->sbuf, .rbuf = w->rbuf,
                         .count = w->count, .esize = esz, .peer = w->peer, .tag = (uint32_t)w->tag,
                         .timeout_s = left > 0.001 ? left : 0.001, .what = what};
        return ct_gloo_comm_run(g->comm, &op);
    }
    default: return ct_error(CT_ERR_UNSUPPORTED, "gloo backend: %s is not supported", what);
    }
}

static void gloo_destroy(void *impl) {
    gloo_pg *g = impl;
    if (!g) return;
    ct_gloo_comm_free(g->comm);
    free(g->stage);
    free(g->pad);
    free(g);
}

/* This host's address as the others will see it: CTRAIN_GLOO_IFADDR, else the source address
 * the kernel picks for MASTER_ADDR (a connected UDP socket sends nothing). */
static ct_status local_addr(char *out, size_t n) {
    const char *ov = ct_config_str(CT_CFG_GLOO_IFADDR);
    if (ov && *ov) {
        snprintf(out, n, "%s", ov);
        return CT_OK;
    }
    const char *master = ct_config_str(CT_CFG_MASTER_ADDR);
    if (!master || !*master) master = "127.0.0.1";
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *ai = NULL;
    int rc = getaddrinfo(master, "9", &hints, &ai);
    if (rc) return ct_error(CT_ERR_INVALID, "gloo backend: cannot resolve MASTER_ADDR=%s: %s", master, gai_strerror(rc));
    struct sockaddr_storage me;
    socklen_t len = sizeof me;
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0), e = 0;
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) || getsockname(fd, (struct sockaddr *)&me, &len)) e = errno;
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    if (e)
        return ct_error(CT_ERR_SYSTEM, "gloo backend: no route to MASTER_ADDR=%s (%s); set CTRAIN_GLOO_IFADDR to this "
                        "host's address", master, strerror(e));
    rc = getnameinfo((struct sockaddr *)&me, len, out, (socklen_t)n, NULL, 0, NI_NUMERICHOST);
    if (rc) return ct_error(CT_ERR_SYSTEM, "gloo backend: local address: %s", gai_strerror(rc));
    return CT_OK;
}

static ct_status make(ct_store *store, const char *ns, int rank, int size, double timeout, const char *ifaddr,
                      int fingerprint, void **impl_out) {
    gloo_pg *g = calloc(1, sizeof *g);
    if (!g) return ct_error(CT_ERR_NOMEM, "gloo group");
    g->store = store;
    g->rank = rank;
    g->n = size;
    g->timeout = timeout;
    g->fingerprint = fingerprint;
    snprintf(g->ns, sizeof g->ns, "%s", ns);
    snprintf(g->ifaddr, sizeof g->ifaddr, "%s", ifaddr);
    ct_status st = ct_gloo_comm_create(store, g->ns, rank, size, timeout, g->ifaddr, &g->comm);
    if (st) {
        free(g);
        return st;
    }
    *impl_out = g;
    return CT_OK;
}

/* A group of some of the world's ranks (hier's leaders, a subgroup such as the sharded
 * step's rails): its messages name world ranks, "lost rank 3 of 4", not the group's "rank 1
 * of 2". st: how making the group went; on failure here the group goes. */
static ct_status name_world_ranks(const ct_pg *pg, ct_status st, void **impl_out) {
    if (st == CT_OK && pg->world && pg->world != pg && pg->granks &&
        (st = ct_gloo_comm_name_world_ranks(((gloo_pg *)*impl_out)->comm, pg->granks, pg->world->size))) {
        gloo_destroy(*impl_out);
        *impl_out = NULL;
    }
    return st;
}

ct_status ct_gloo_create(ct_pg *pg, void **impl_out) {
    *impl_out = NULL;
    if (pg->size > 1 && !pg->store) return ct_error(CT_ERR_INVALID, "gloo backend: the group has no store to meet through");
    char addr[INET6_ADDRSTRLEN], ns[160];
    ct_status st = local_addr(addr, sizeof addr);
    if (st) return st;
    snprintf(ns, sizeof ns, "%sgloo/", pg->prefix);
    st = name_world_ranks(pg, make(pg->store, ns, pg->rank, pg->size, pg->timeout, addr, pg->fingerprint, impl_out),
                          impl_out);
    if (st == CT_OK)
        CT_LOG_INFO("gloo", "rank %d of %d connected from %s (keys %s)", pg->rank, pg->size, addr, ns);
    return st;
}

static ct_status gloo_new_group(ct_pg *parent, ct_pg *child, const int *ranks, int n, int my_rank, void **impl_out) {
    (void)ranks;
    gloo_pg *p = parent->impl;
    unsigned k = ++p->ngroups; /* every rank of the parent calls this, in the same order */
    if (my_rank < 0) return CT_OK;
    char ns[sizeof p->ns];
    if (snprintf(ns, sizeof ns, "%s%u/", p->ns, k) >= (int)sizeof ns)
        return ct_error(CT_ERR_INVALID, "gloo backend: store prefix too long for a subgroup: %s", p->ns);
    return name_world_ranks(child, make(p->store, ns, my_rank, n, child->timeout, p->ifaddr, child->fingerprint, impl_out),
                            impl_out);
}

const ct_backend ct_gloo_backend = {"gloo", gloo_run, gloo_new_group, gloo_destroy, NULL, NULL, NULL, NULL};
#else
typedef int ct_gloo_backend_not_built;
#endif
