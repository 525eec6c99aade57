/* Hierarchical backend: shm inside each machine, a flat backend (MPI; Gloo plugs in through
 * the same creator) between one leader per machine, so only 1/local-world of the traffic
 * crosses the network. Setup, dispatch and teardown; the algorithms are in hier_allreduce.c
 * and hier_coll.c.
 *
 * Bootstrap: the flat backend's world group comes first (under mpirun that is MPI_COMM_WORLD,
 * and there is no store). Its all_gather carries every rank's node key, from which every
 * rank computes the same node numbering; then local rank 0 creates the shm segment and a
 * second all_gather carries its name (or its reason for failing) to the other local ranks,
 * a third one their attach status, after which the segment is unlinked. Going through the
 * flat group rather than the store keeps one path for mpirun (no store) and store-based
 * launches alike.
 *
 * Node key: host name + the inode of /proc/self/ns/net, so two network namespaces on one
 * machine (how the tests emulate hosts) count as two machines. */
#include "distributed/hier.h"
#include "distributed/shm.h"
#include "ctrain/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define BOOT_BYTES 256 /* one rank's record in a bootstrap all_gather */

typedef struct {
    char key[128];
    char host[64];
    int32_t ok;
    char msg[BOOT_BYTES - 128 - 64 - 4];
} boot_rec;
_Static_assert(sizeof(boot_rec) == BOOT_BYTES, "boot record size");

void *hier_scratch(hier_pg *h, int which, size_t bytes) {
    void **p = which ? &h->tmp2 : &h->tmp;
    size_t *cap = which ? &h->cap2 : &h->cap;
    if (!*p || *cap < bytes) {
        free(*p);
        *p = malloc(bytes ? bytes : 64);
        *cap = *p ? bytes : 0;
    }
    return *p;
}

ct_status hier_step(hier_pg *h, hier_sub *g, const char *what, int kind, const void *s, void *r, size_t count,
                    ct_dtype dt, ct_reduce_op op, int peer, double deadline) {
    ct_work w;
    memset(&w, 0, sizeof w);
    w.pg = g->pg;
    w.kind = kind;
    w.sbuf = s;
    w.rbuf = r;
    w.count = count;
    w.dt = dt;
    w.rop = op;
    w.peer = peer;
    if (!ct_op_is_p2p(kind)) w.seq = ++g->seq; /* as pg.c: p2p is not numbered */
    ct_status st = g->be->run(g->impl, &w, deadline);
    if (!st) return CT_OK;
    if (g != &h->leaders || !h->keys)
        return ct_error(st, "%s step failed on rank %d (host %s, node %d of %d): %s", what, h->world->rank, h->host,
                        h->node, h->nnodes, ct_last_error());
    /* between machines: name the other machines' leaders (host names alone may repeat) */
    char others[400] = "";
    size_t o = 0;
    for (int k = 0; k < h->nnodes && o < sizeof others - 1; k++)
        if (k != h->node)
            o += (size_t)snprintf(others + o, sizeof others - o, "%snode %d: rank %d on %s", o ? "; " : "", k,
                                  h->leader_of[k], h->keys[k]);
    return ct_error(st, "%s step failed on rank %d (host %s, node %d of %d; other machines' leaders: %s): %s", what,
                    h->world->rank, h->host, h->node, h->nnodes, others, ct_last_error());
}

ct_status hier_fail_local(hier_pg *h, ct_status st) {
    char msg[640];
    snprintf(msg, sizeof msg, "%s", ct_last_error());
    if (h->lsize > 1) ct_shm_abort(h->local.impl, st, msg);
    return ct_error(st, "%s", msg);
}

/* Every rank's record, through the flat world group. */
static ct_status boot_allgather(hier_pg *h, const boot_rec *mine, boot_rec *all) {
    return hier_step(h, &h->flat, "bootstrap", CT_OP_ALLGATHER, mine, all, BOOT_BYTES / 4, CT_I32, CT_RED_SUM, 0,
                     ct_time_now() + h->world->timeout);
}

static void node_key(char *key, size_t n, char *host, size_t hn) {
    if (gethostname(host, hn)) snprintf(host, hn, "?");
    host[hn - 1] = 0;
    struct stat sb;
    unsigned long long ns = stat("/proc/self/ns/net", &sb) ? 0 : (unsigned long long)sb.st_ino;
    snprintf(key, n, "%s/netns:%llu", host, ns);
}

/* A shell ct_pg describing a group (rank, size, world ranks...), never queued on. */
static ct_pg *shell(ct_pg *world, int rank, int size, const int *granks, const char *prefix_tail) {
    ct_pg *g = calloc(1, sizeof *g);
    if (!g || !(g->granks = malloc(sizeof(int) * (size_t)size))) { free(g); return NULL; }
    memcpy(g->granks, granks, sizeof(int) * (size_t)size);
    g->rank = rank;
    g->size = size;
    g->world = world;
    g->store = world->store;
    g->timeout = world->timeout;
    g->fingerprint = world->fingerprint;
    g->local_size = world->local_size;
    snprintf(g->prefix, sizeof g->prefix, "%s%s", world->prefix, prefix_tail);
    memcpy(g->runid, world->runid, sizeof g->runid);
    return g;
}

static void shell_free(ct_pg *g) {
    if (!g) return;
    free(g->granks);
    free(g);
}

static void hier_destroy(void *impl) {
    hier_pg *h = impl;
    if (!h) return;
    if (h->local.impl) h->local.be->destroy(h->local.impl);
    /* after a failure a flat backend's teardown may wait for the lost ranks (MPI_Finalize
     * does): left to the process exit, which tells the launcher to end the job */
    if (h->leaders.impl && !h->failed) h->leaders.be->destroy(h->leaders.impl);
    if (h->rail_own.impl && !h->failed) h->rail_own.be->destroy(h->rail_own.impl);
    if (h->flat.impl && !h->failed) h->flat.be->destroy(h->flat.impl); /* last: MPI_Finalize when it initialised MPI */
    free(h->keys);
    shell_free(h->local_pg);
    shell_free(h->leaders_pg);
    shell_free(h->rail_pg);
    free(h->node_of);
    free(h->lrank_of);
    free(h->leader_of);
    free(h->tmp);
    free(h->tmp2);
    free(h);
}

/* Node numbering from every rank's key: nodes in order of their lowest rank. */
static ct_status map_nodes(hier_pg *h, const boot_rec *all) {
    int n = h->world->size, me = h->world->rank;
    h->node_of = malloc(sizeof(int) * (size_t)n);
    h->lrank_of = malloc(sizeof(int) * (size_t)n);
    h->leader_of = malloc(sizeof(int) * (size_t)n);
    h->keys = malloc(sizeof *h->keys * (size_t)n);
    int *count = calloc((size_t)n, sizeof(int));
    if (!h->node_of || !h->lrank_of || !h->leader_of || !h->keys || !count) {
        free(count);
        return ct_error(CT_ERR_NOMEM, "hier node map");
    }
    h->nnodes = 0;
    for (int r = 0; r < n; r++) {
        int k = -1;
        for (int q = 0; q < r && k < 0; q++)
            if (!strcmp(all[q].key, all[r].key)) k = h->node_of[q];
        if (k < 0) {
            k = h->nnodes++;
            h->leader_of[k] = r;
            memcpy(h->keys[k], all[r].key, sizeof h->keys[k]);
        }
        h->node_of[r] = k;
        h->lrank_of[r] = count[k]++;
    }
    h->node = h->node_of[me];
    h->lrank = h->lrank_of[me];
    h->lsize = count[h->node];
    h->maxlocal = 0;
    for (int k = 0; k < h->nnodes; k++) h->maxlocal = count[k] > h->maxlocal ? count[k] : h->maxlocal;
    /* the ordered all-reduce needs each machine's ranks to be one block (nodes are numbered
     * by first appearance, so that is a non-decreasing node_of) */
    int contiguous = 1, even = 1;
    for (int r = 1; r < n; r++) contiguous &= h->node_of[r] >= h->node_of[r - 1];
    for (int k = 0; k < h->nnodes; k++) even &= count[k] == h->maxlocal;
    ct_hier_allreduce mode = ct_config_hier_allreduce(h->nnodes);
    h->ordered = contiguous && mode == CT_HIER_ORDERED;
    /* rail pairs local rank i of every machine: every machine needs the same local size
     * (else the tree) */
    h->rail = even && mode == CT_HIER_RAIL;
    free(count);
    return CT_OK;
}

/* The shm group of this machine's ranks, bootstrapped through the flat group. */
static ct_status make_local(hier_pg *h) {
    ct_pg *w = h->world;
    int *ranks = malloc(sizeof(int) * (size_t)h->lsize);
    if (!ranks) return ct_error(CT_ERR_NOMEM, "hier local group");
    for (int r = 0, i = 0; r < w->size; r++)
        if (h->node_of[r] == h->node) ranks[i++] = r;
    h->local_pg = shell(w, h->lrank, h->lsize, ranks, "hs/");
    free(ranks);
    if (!h->local_pg) return ct_error(CT_ERR_NOMEM, "hier local group");
    h->local_pg->gid = 0;
    h->local_pg->local_size = h->lsize;
    h->local.be = &ct_shm_backend;
    h->local.pg = h->local_pg;

    boot_rec mine, *all = malloc(sizeof(boot_rec) * (size_t)w->size);
    if (!all) return ct_error(CT_ERR_NOMEM, "hier bootstrap");
    memset(&mine, 0, sizeof mine);
    snprintf(mine.host, sizeof mine.host, "%s", h->host);
    char name[96] = "";
    ct_status st = CT_OK;
    if (h->lrank == 0) { /* 1. the leader creates the segment */
        char hex[32];
        ct_random_hex(hex, 12);
        snprintf(name, sizeof name, "/ctrain-%s-h%d-%s", w->runid, h->node, hex);
        st = ct_shm_create_named(h->local_pg, name, &h->local.impl);
        snprintf(mine.key, sizeof mine.key, "%s", name);
        mine.ok = st == CT_OK;
        if (st) snprintf(mine.msg, sizeof mine.msg, "%s", ct_last_error());
    }
    /* 2. its name (or failure) to the others */
    ct_status bst = boot_allgather(h, &mine, all);
    if (bst) {
        if (h->lrank == 0) shm_unlink(name);
        free(all);
        return bst;
    }
    const boot_rec *lead = &all[h->leader_of[h->node]];
    if (h->lrank > 0) {
        if (!lead->ok) st = ct_error(CT_ERR_PEER, "rank %d could not create the shared segment: %s", h->leader_of[h->node], lead->msg);
        else st = ct_shm_create_named(h->local_pg, lead->key, &h->local.impl);
        mine.ok = st == CT_OK;
        if (st) snprintf(mine.msg, sizeof mine.msg, "%s", ct_last_error());
    }
    /* 3. every rank's attach status; then the name goes (nothing stays in /dev/shm even if a rank is killed) */
    bst = boot_allgather(h, &mine, all);
    if (h->lrank == 0) shm_unlink(name); /* also after a failed creation (ENOENT ignored) */
    for (int r = 0; r < w->size && !bst && !st; r++)
        if (!all[r].ok)
            st = ct_error(CT_ERR_PEER, "rank %d (host %s) could not set up shared memory: %s", r, all[r].host, all[r].msg);
    free(all);
    return bst ? bst : st;
}

static ct_status make_leaders(hier_pg *h, ct_flat_create_fn create) {
    h->leaders_pg = shell(h->world, h->node, h->nnodes, h->leader_of, "hl/");
    if (!h->leaders_pg) return ct_error(CT_ERR_NOMEM, "hier leader group");
    h->leaders.be = h->flat.be;
    h->leaders.pg = h->leaders_pg;
    if (h->lrank != 0) return CT_OK;
    return create(h->leaders_pg, &h->leaders.impl);
}

/* Rail i (rail all-reduce): local rank i of every machine, group rank = node, on the flat
 * backend. Rail 0 is the leaders group; every other local rank makes its own, all at once
 * (disjoint groups, each with its own store prefix). */
static ct_status make_rail(hier_pg *h, ct_flat_create_fn create) {
    if (!h->rail || h->lrank == 0) return CT_OK;
    int *ranks = malloc(sizeof(int) * (size_t)h->nnodes);
    if (!ranks) return ct_error(CT_ERR_NOMEM, "hier rail group");
    for (int r = 0; r < h->world->size; r++)
        if (h->lrank_of[r] == h->lrank) ranks[h->node_of[r]] = r;
    char tail[32];
    snprintf(tail, sizeof tail, "hr%d/", h->lrank);
    h->rail_pg = shell(h->world, h->node, h->nnodes, ranks, tail);
    free(ranks);
    if (!h->rail_pg) return ct_error(CT_ERR_NOMEM, "hier rail group");
    h->rail_own.be = h->flat.be;
    h->rail_own.pg = h->rail_pg;
    return create(h->rail_pg, &h->rail_own.impl);
}

static ct_status hier_run(void *impl, ct_work *w, double deadline) {
    hier_pg *h = impl;
    ct_status st;
    switch (w->kind) {
    case CT_OP_ALLREDUCE: st = hier_allreduce(h, w, deadline); break;
    case CT_OP_BROADCAST: st = hier_broadcast(h, w, deadline); break;
    case CT_OP_ALLGATHER: st = hier_allgather(h, w, deadline); break;
    case CT_OP_BARRIER: st = hier_barrier(h, w, deadline); break;
    default: /* reduce, reduce_scatter, all_to_all, send, recv: the flat group as they are */
        st = h->flat.be->run(h->flat.impl, w, deadline);
    }
    if (st == CT_ERR_TIMEOUT || st == CT_ERR_PEER || st == CT_ERR_MISMATCH) h->failed = 1;
    return st;
}

/* Subgroups live on the flat backend alone. */
static ct_status hier_new_group(ct_pg *parent, ct_pg *child, const int *ranks, int n, int my_rank, void **impl_out) {
    hier_pg *h = parent->impl;
    ct_pg flat = *parent; /* read-only view of the world with the flat backend */
    flat.be = h->flat.be;
    flat.impl = h->flat.impl;
    if (child) child->be = h->flat.be;
    return h->flat.be->new_group(&flat, child, ranks, n, my_rank, impl_out);
}

/* Memory shared by the ranks of one machine (DDP's zero-copy gradients, ct_zero's segment):
 * an allocation of the local shm group, its name passed through the job's store under keys
 * of this machine's own. A rank on another machine has no counterpart (NULL). Under mpirun
 * there is no store: unsupported, and DDP keeps its staged path. */
static ct_status hier_alloc_shared(ct_pg *pg, void *impl, size_t bytes, void **mine) {
    (void)pg;
    hier_pg *h = impl;
    if (!h->world->store)
        return ct_error(CT_ERR_UNSUPPORTED, "shared allocations on the hier backend need the job's store (none under mpirun)");
    ct_pg keys = *h->local_pg;
    char tail[16];
    snprintf(tail, sizeof tail, "n%d/", h->node);
    if (strlen(keys.prefix) + strlen(tail) >= sizeof keys.prefix)
        return ct_error(CT_ERR_UNSUPPORTED, "hier shared allocation: store key prefix too long");
    strcat(keys.prefix, tail);
    return shm_alloc_shared(&keys, h->local.impl, bytes, mine);
}

static void hier_free_shared(void *impl, void *mine) { shm_free_shared(((hier_pg *)impl)->local.impl, mine); }

static void *hier_shared_peer(void *impl, void *p, int rank) {
    hier_pg *h = impl;
    if (rank < 0 || rank >= h->world->size || h->node_of[rank] != h->node) return NULL;
    return shm_shared_peer(h->local.impl, p, h->lrank_of[rank]);
}

const ct_backend ct_hier_backend = {"hier", hier_run, hier_new_group, hier_destroy, hier_alloc_shared, hier_free_shared,
                                    hier_shared_peer, NULL};

ct_status ct_hier_init(ct_pg *pg, const ct_backend *flat_be, ct_flat_create_fn create, int force) {
    pg->be = flat_be;
    pg->impl = NULL;
    void *flat_impl = NULL;
    ct_status st = create(pg, &flat_impl);
    if (st) return st;
    hier_pg *h = calloc(1, sizeof *h);
    boot_rec mine, *all = malloc(sizeof(boot_rec) * (size_t)pg->size);
    if (!h || !all) {
        free(h);
        free(all);
        flat_be->destroy(flat_impl);
        return ct_error(CT_ERR_NOMEM, "hier backend");
    }
    h->world = pg;
    h->flat = (hier_sub){flat_be, flat_impl, pg, 0};
    memset(&mine, 0, sizeof mine);
    node_key(mine.key, sizeof mine.key, h->host, sizeof h->host);
    snprintf(mine.host, sizeof mine.host, "%s", h->host);
    mine.ok = 1;
    st = boot_allgather(h, &mine, all);
    if (!st) st = map_nodes(h, all);
    free(all);
    if (!st && !force && (h->nnodes == 1 || h->maxlocal == 1)) {
        /* one machine, or one rank per machine: nothing to split; the same decision everywhere */
        CT_LOG_INFO("pg", "%d rank(s) on %d machine(s): flat %s backend", pg->size, h->nnodes, flat_be->name);
        h->flat.impl = NULL;
        hier_destroy(h);
        pg->impl = flat_impl;
        return CT_OK;
    }
    if (!st) st = make_local(h);
    if (!st) st = make_leaders(h, create);
    if (!st) st = make_rail(h, create);
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ct_last_error());
        hier_destroy(h);
        return ct_error(st, "%s", msg);
    }
    pg->be = &ct_hier_backend;
    pg->impl = h;
    CT_LOG_INFO("pg", "hier: rank %d is local rank %d of %d on node %d of %d (%s); shm inside, %s between %d leaders, "
                "%s all-reduce", pg->rank, h->lrank, h->lsize, h->node, h->nnodes, h->host, flat_be->name, h->nnodes,
                h->ordered ? "ordered" : h->rail ? "rail" : "tree");
    return CT_OK;
}
