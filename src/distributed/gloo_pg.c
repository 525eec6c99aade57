/* gloo backend: Gloo's CPU collectives over TCP (the engine PyTorch's CPU jobs use), for a job
 * across machines started without mpirun (`ctrain run --nnodes N`). The Gloo calls are in
 * gloo.cc (C++); this file adapts ct_pg and ct_work to them.
 * Rendezvous: Gloo's address exchange goes through the job's store, under pg->prefix + "gloo/"
 * (a subgroup adds its number). Connections start from this host's address on the interface
 * that reaches MASTER_ADDR, or CTRAIN_GLOO_IFADDR.
 * Reductions run ctrain's own kernels (ct_reduce2) inside Gloo's ring, so every dtype and op is
 * supported; AVG is SUM then a division. Reduce-scatter is an all-reduce of the whole buffer
 * keeping this rank's block (Gloo's own reduce-scatter is only in its older algorithm API):
 * twice the traffic of a ring reduce-scatter. Fingerprints are one extra 24-byte all-gather
 * per operation, as in the mpi backend. */
#if CT_HAVE_GLOO
#include "distributed/dist_internal.h"
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
    void *tmp;
    size_t cap;
} gloo_pg;

typedef struct {
    uint32_t seq;
    uint8_t kind, dt, rop, pad;
    int32_t root;
    uint32_t pad2;
    uint64_t count;
} gloo_fp;

static void reduce_cb(void *o, const void *a, const void *b, size_t n, const void *arg) {
    const ct_work *w = arg;
    ct_reduce2(w->dt, w->rop == CT_RED_AVG ? CT_RED_SUM : w->rop, o, NULL, a, b, n, 0);
}

static ct_status check_fp(gloo_pg *g, ct_work *w, double timeout, const char *what) {
    gloo_fp mine = {w->seq, (uint8_t)w->kind, (uint8_t)w->dt, (uint8_t)w->rop, 0, w->peer, 0, w->count};
    if (w->kind != CT_OP_ALLREDUCE && w->kind != CT_OP_REDUCE && w->kind != CT_OP_REDUCE_SCATTER) mine.rop = 0;
    if (w->kind != CT_OP_BROADCAST && w->kind != CT_OP_REDUCE) mine.root = 0;
    gloo_fp *all = malloc(sizeof(gloo_fp) * (size_t)g->n);
    if (!all) return ct_error(CT_ERR_NOMEM, "fingerprint exchange");
    ct_gloo_op op = {.kind = CT_GLOO_ALLGATHER, .sbuf = &mine, .rbuf = all, .count = sizeof mine, .esize = 1,
                     .tag = w->seq, .timeout_s = timeout, .what = what};
    ct_status st = ct_gloo_comm_run(g->comm, &op);
    for (int p = 0; p < g->n && st == CT_OK; p++) {
        gloo_fp *f = &all[p];
        if (memcmp(f, &mine, sizeof mine)) {
            char b[200];
            ct_work x = {.kind = f->kind, .seq = f->seq, .dt = (ct_dtype)f->dt, .rop = (ct_reduce_op)f->rop,
                         .count = f->count, .peer = f->root};
            ct_work_describe(&x, b, sizeof b);
            st = ct_error(CT_ERR_MISMATCH, "collective mismatch: group rank %d called %s but group rank %d called %s",
                          g->rank, what, p, b);
        }
    }
    free(all);
    return st;
}

static ct_status gloo_run(void *impl, ct_work *w, double deadline) {
    gloo_pg *g = impl;
    char what[200];
    ct_work_describe(w, what, sizeof what);
    double left = deadline - ct_time_now();
    if (left < 0.001) left = 0.001;
    int collective = w->kind != CT_OP_SEND && w->kind != CT_OP_RECV;
    if (g->fingerprint && collective && g->n > 1) {
        ct_status st = check_fp(g, w, left, what);
        if (st) return st;
        left = deadline - ct_time_now();
        if (left < 0.001) left = 0.001;
    }
    size_t esz = ct_dtype_size(w->dt);
    ct_gloo_op op = {.sbuf = w->sbuf, .rbuf = w->rbuf, .count = w->count, .esize = esz, .peer = w->peer,
                     .tag = collective ? w->seq : (uint32_t)w->tag, .reduce = reduce_cb, .reduce_arg = w,
                     .timeout_s = left, .what = what};
    void *out = w->rbuf; /* where a reduction's result is, for AVG's division */
    switch (w->kind) {
    case CT_OP_ALLREDUCE: op.kind = CT_GLOO_ALLREDUCE; break;
    case CT_OP_BROADCAST: op.kind = CT_GLOO_BROADCAST; break;
    case CT_OP_REDUCE: op.kind = CT_GLOO_REDUCE; break;
    case CT_OP_ALLGATHER: op.kind = CT_GLOO_ALLGATHER; break;
    case CT_OP_ALLTOALL: op.kind = CT_GLOO_ALLTOALL; break;
    case CT_OP_BARRIER: op.kind = CT_GLOO_BARRIER; break;
    case CT_OP_SEND: op.kind = CT_GLOO_SEND; break;
    case CT_OP_RECV: op.kind = CT_GLOO_RECV; break;
    case CT_OP_REDUCE_SCATTER: {
        size_t bytes = w->count * esz * (size_t)g->n;
        if (g->cap < bytes) {
            void *p = realloc(g->tmp, bytes);
            if (!p) return ct_error(CT_ERR_NOMEM, "%s: gloo backend: %zu bytes of staging", what, bytes);
            g->tmp = p;
            g->cap = bytes;
        }
        memcpy(g->tmp, w->sbuf, bytes);
        op.kind = CT_GLOO_ALLREDUCE;
        op.rbuf = g->tmp;
        op.count = w->count * (size_t)g->n;
        out = (uint8_t *)g->tmp + (size_t)g->rank * w->count * esz;
        break;
    }
    default: return ct_error(CT_ERR_UNSUPPORTED, "gloo backend: %s is not supported", what);
    }
    ct_status st = ct_gloo_comm_run(g->comm, &op);
    if (st) return st;
    int reduced = w->kind == CT_OP_ALLREDUCE || w->kind == CT_OP_REDUCE_SCATTER ||
                  (w->kind == CT_OP_REDUCE && g->rank == w->peer);
    if (reduced && w->rop == CT_RED_AVG) ct_reduce_scale(w->dt, out, w->count, g->n);
    if (w->kind == CT_OP_REDUCE_SCATTER) memcpy(w->rbuf, out, w->count * esz);
    return CT_OK;
}

static void gloo_destroy(void *impl) {
    gloo_pg *g = impl;
    if (!g) return;
    ct_gloo_comm_free(g->comm);
    free(g->tmp);
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

ct_status ct_gloo_create(ct_pg *pg, void **impl_out) {
    *impl_out = NULL;
    if (pg->size > 1 && !pg->store) return ct_error(CT_ERR_INVALID, "gloo backend: the group has no store to meet through");
    char addr[INET6_ADDRSTRLEN], ns[160];
    ct_status st = local_addr(addr, sizeof addr);
    if (st) return st;
    snprintf(ns, sizeof ns, "%sgloo/", pg->prefix);
    st = make(pg->store, ns, pg->rank, pg->size, pg->timeout, addr, pg->fingerprint, impl_out);
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
    return make(p->store, ns, my_rank, n, child->timeout, p->ifaddr, child->fingerprint, impl_out);
}

const ct_backend ct_gloo_backend = {"gloo", gloo_run, gloo_new_group, gloo_destroy, NULL, NULL, NULL};
#else
typedef int ct_gloo_backend_not_built;
#endif
