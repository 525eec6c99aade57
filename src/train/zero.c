/* ct_zero: the sharded optimizer step — ZeroRedundancyOptimizer's idea over the memory the
 * ranks of one machine share.
 *
 * Without it every rank all-reduces the whole gradient (reads B, writes B on the shm
 * backend) and then runs the whole optimizer step on its own copy of the parameters (for
 * SGD with momentum: reads g, p, m, writes p, m). With it the parameters and the
 * optimizer's state are one copy in a shared segment; DDP defers the averaging
 * (ct_ddp_set_deferred), and each rank updates only its 1/n of the flat buffers, averaging
 * each gradient element from the n ranks' buffers as the update reads it:
 *   per rank: reads (n + 2)/n B, writes 2/n B for SGD with momentum, against 5B read and
 *   3B written before (B = the gradient's bytes); 2 synchronisations per step (every
 *   backward done; every share updated).
 * The averaging is the all-reduce's ((g0 + g1) + ...) / n and the update is elementwise, so
 * the bits are those of the unsharded step on any number of ranks.
 *
 * Across machines (the hier backend) the segment is shared by the L ranks of each machine and
 * every machine keeps its own copy of the parameters and state. Local rank i owns share i on
 * every machine and, once backward is done, makes the whole job's sum of it:
 *   1. its machine's sum of the share, from the L local gradient buffers in rank order;
 *   2. across machines on rail i (local rank i of every machine, the flat backend), one
 *      connection per local rank as the rail all-reduce:
 *        ordered (CTRAIN_HIER_ALLREDUCE=ordered, or auto on 2 machines; machines holding consecutive ranks): the
 *        running sum goes machine 0 → 1 → ... → N-1, each adding its ranks' gradients in
 *        order, and the last broadcasts it: ((g0 + g1) + g2) + ... — one machine's bits;
 *                                        network: the share twice per machine, once each way.
 *        In chunks (CTRAIN_HIER_CHAIN_CHUNK), the broadcast on a second group of the same ranks
 *        (its own connections and comm thread): chunk c's sum comes back while chunk c+1
 *        goes on, so a link's two directions overlap (~share/bw, not 2 x share/bw), and
 *        machine 0 sums chunk c+1 while chunk c is on the wire; from 3 machines a third
 *        group lets a machine in the middle pass chunk c on while chunk c+1 comes in;
 *        otherwise: an all-reduce of the machines' sums (the rail all-reduce's order);
 *                                        network: ~2 x share (N-1)/N per machine and rail
 *      in the DDP's compression dtype if it has one (only this crosses the network: the
 *      machine's sum is made in f32);
 *      during backward (CTRAIN_HIER_CHAIN_EARLY, the default; 0: after it, and on the rails
 *      the share whole): the share goes in chunks from its top down (the order backward
 *      finishes the gradients), each as soon as every local rank's backward has finished it
 *      (ct_ddp_set_progress), passed on in the chain or all-reduced on the rail on its own
 *      (on the rails of 3 or more machines the chunks' sums may differ in the last bit from
 *      the whole share's: each all-reduce splits its buffer over the ring anew): the network
 *      works while backward runs, and after it only the chunks it finished last are left;
 *   3. divides by the world size into its own gradient buffer, which its step then reads.
 *   per rank: reads its share of all L buffers (B/L x L = B), against the hier all-reduce's
 *   shm reduce and broadcast of B and a whole optimizer step per rank. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ctrain/config.h"
#include "ctrain/train.h"
#include "ctrain/tensor.h"

struct ct_zero {
    ct_ddp *ddp;
    ct_pg *pg;
    ct_params *P;
    ct_optim *opt;        /* NULL once the optimizer was freed first */
    void *seg;            /* this rank's region of the segment of parameters and state */
    bool params_in;       /* the parameters are in the segment (until the optimizer is freed first) */
    const float **grads;  /* every rank's gradient buffer (DDP's zero-copy segment) */
    bool averaging;       /* this step: DDP deferred, the step averages */
    int L, li;            /* ranks sharing the segment (this machine's), this rank's index among them */
    /* across machines (hier); nm = 1 on one machine */
    int nm, mi;           /* machines, this machine's index */
    ct_pg *rail;          /* local rank li of every machine, by machine index */
    bool chain;           /* ordered: the running sum goes from machine to machine */
    ct_pg *back;          /* chain: the rail again, for the finished chunks' broadcasts */
    ct_pg *fwd;           /* chain of 3+ machines: the rail a third time, see chain_send_group */
    size_t chunk;         /* chain: elements per chunk */
    int nchunks;
    ct_work **fw, **bw;   /* chain: each chunk's receive or send (chain_send_group), broadcast on back */
    ct_dtype wdt;         /* what crosses the network: f32 or the DDP's compression dtype */
    size_t lo, hi;        /* this rank's share */
    float *part;          /* the share's sum, hi - lo floats */
    void *wire;           /* its compressed copy (wdt != f32) */
    /* the chain during backward (see chain_advance) */
    bool early;           /* on: CTRAIN_HIER_CHAIN_EARLY across machines (chain or rails) */
    void *progmem;        /* this rank's published reach: one cache line in memory the machine shares */
    _Atomic uint64_t **progs; /* every local rank's, in local order */
    uint64_t gen;         /* averaging steps so far: a reach of an earlier step never counts */
    int next;             /* the next chunk to go on: from the top, K-1 down to 0; -1 when all went */
    bool inflight;        /* this step's chain is posted */
    ct_status est;        /* its first failure */
    long sent_early, sent_all; /* chunks that went on during backward, of all (the log at the end) */
};

/* A reach: gen << REACH_SHIFT | the floats from the top of the flat buffer whose gradients
 * are final on that rank this step (below 2^40) */
#define REACH_SHIFT 40

/* after each rank updated its share: the next forward reads the others' */
static ct_status zero_sync(void *user) {
    ct_zero *z = user;
    double t0 = ct_time_now();
    ct_status st = ct_barrier_shared_sync(z->pg); /* across machines each holds its own copy */
    ct_ddp_add_wait(z->ddp, ct_time_now() - t0);
    return st;
}

/* The optimizer is freed first (its state goes with it): the parameters go back to private
 * memory, so that a later optimizer steps them alone. */
static void zero_detach(void *user) {
    ct_zero *z = user;
    z->opt = NULL;
    if (ct_params_set_data_storage(z->P, NULL, true) != CT_OK) CT_LOG_WARN_("zero", "%s", ct_last_error());
    else z->params_in = false;
}

/* Parameters and state into the segment (cannot fail: it is page-aligned and on the CPU, as
 * are the store and the state), and back out: false when memory ran out (a warning). */
static void move_in(ct_params *P, ct_optim *opt, float *base, size_t N16, bool copy) {
    ct_status st = ct_params_set_data_storage(P, base, copy);
    for (int k = 0; st == CT_OK && k < ct_optim_state_count(opt); k++)
        st = ct_optim_set_state_storage(opt, k, base + (size_t)(k + 1) * N16, copy);
    CT_CHECK(st == CT_OK, "ct_zero_create: moving the parameters and state: %s", ct_last_error());
}

/* Drops this process's mapping of the pages inside [p, p + n floats) (the segment keeps
 * them): moving out one buffer at a time, the process's memory grows by one buffer, not by
 * all of them while the shared copies still count. */
static void release(const float *p, size_t n) {
    uintptr_t lo = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, hi = ((uintptr_t)(p + n)) & ~(uintptr_t)4095;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Moves what is still in the segment back out: the state buffers of opt (NULL once freed) and,
 * where params_in, the parameters. Parameters already moved out (the optimizer freed first)
 * are private memory: releasing their pages would zero them. */
static bool move_out(ct_params *P, ct_optim *opt, bool params_in) {
    ct_status st = CT_OK;
    size_t N = ct_params_numel(P);
    for (int k = 0; opt && st == CT_OK && k < ct_optim_state_count(opt); k++) {
        float *shared;
        ct_optim_state_buffer(opt, k, NULL, &shared, NULL);
        if ((st = ct_optim_set_state_storage(opt, k, NULL, true)) == CT_OK) release(shared, N);
    }
    const float *shared = ct_params_data(P);
    if (params_in && st == CT_OK && (st = ct_params_set_data_storage(P, NULL, true)) == CT_OK) release(shared, N);
    if (st != CT_OK) CT_LOG_WARN_("zero", "%s", ct_last_error());
    return st == CT_OK;
}

static void zero_release(ct_zero *z) {
    if (z->progmem) {
        ct_ddp_set_progress(z->ddp, NULL, NULL);
        ct_pg_free_shared(z->pg, z->progmem);
    }
    free(z->progs);
    if (z->rail) ct_pg_free(z->rail);
    if (z->back) ct_pg_free(z->back);
    if (z->fwd) ct_pg_free(z->fwd);
    free(z->fw);
    free(z->bw);
    free(z->part);
    free(z->wire);
    free(z->grads);
    free(z);
}

static ct_status chain_finish(ct_zero *z);

void ct_zero_free(ct_zero *z) {
    if (!z) return;
    /* a step that ended in an error after its chain was posted (ct_ddp_finish's): the chain
     * ends as on the other machines, whose step ended alike */
    if (z->inflight) (void)chain_finish(z);
    if (z->early && z->sent_all)
        CT_LOG_INFO("zero", "%ld of %ld chunks crossed the network during backward", z->sent_early, z->sent_all);
    (void)ct_ddp_set_deferred(z->ddp, false);
    if (z->opt) ct_optim_set_shard(z->opt, NULL);
    /* everything leaves the segment before it goes; without memory for it, it stays mapped */
    if (move_out(z->P, z->opt, z->params_in)) ct_pg_free_shared(z->pg, z->seg);
    zero_release(z);
}

/* The ranks that share this rank's segment (those whose counterpart of the DDP's gradient
 * buffer exists here: all of them on shm, this machine's on hier), in rank order into
 * z->grads; then every rank's (first local rank, local index, local count) to number the
 * machines, and the rails. *ok = false (on every rank alike) where the machines hold
 * different numbers of ranks. */
static ct_status topology(ct_zero *z, const float *g, bool *ok) {
    ct_pg *pg = z->pg;
    int n = ct_pg_size(pg), me = ct_pg_rank(pg);
    int32_t mine[3] = {-1, 0, 0}, *all = malloc(sizeof(int32_t) * 3 * (size_t)n);
    int *ranks = malloc(sizeof(int) * (size_t)n);
    if (!all || !ranks) { free(all); free(ranks); return ct_error(CT_ERR_NOMEM, "sharded optimizer: out of memory"); }
    for (int r = 0; r < n; r++) {
        const float *p = ct_pg_shared_peer(pg, (void *)g, r);
        if (!p) continue;
        if (mine[0] < 0) mine[0] = r;
        if (r < me) mine[1]++;
        z->grads[mine[2]++] = p;
    }
    z->L = mine[2];
    z->li = mine[1];
    ct_status st = ct_all_gather_sync(pg, mine, all, 3, CT_I32);
    *ok = st == CT_OK;
    z->nm = 0;
    bool consecutive = true;
    for (int r = 0; st == CT_OK && r < n; r++) {
        if (all[3 * r + 2] != z->L) *ok = false;
        if (all[3 * r] + all[3 * r + 1] != r) consecutive = false;
        if (all[3 * r] == r) { /* a machine's first rank: machines numbered in the order of their first ranks */
            if (r == mine[0]) z->mi = z->nm;
            z->nm++;
        }
    }
    z->chain = consecutive && ct_config_hier_allreduce(z->nm) == CT_HIER_ORDERED;
    /* rail i: local rank i of every machine, by machine (ct_dist_new_group is collective) */
    for (int i = 0; st == CT_OK && *ok && z->nm > 1 && i < z->L; i++) {
        int k = 0;
        for (int r = 0; r < n; r++)
            if (all[3 * r + 1] == i) ranks[k++] = r;
        int ways = !z->chain ? 1 : z->nm > 2 ? 3 : 2;
        for (int way = 0; st == CT_OK && way < ways; way++) {
            ct_pg *rail = NULL;
            st = ct_dist_new_group(pg, ranks, k, &rail);
            if (rail && i == z->li) *(way == 0 ? &z->rail : way == 1 ? &z->back : &z->fwd) = rail;
            else if (rail) ct_pg_free(rail);
        }
    }
    free(all);
    free(ranks);
    return st;
}

/* The chain's chunk on the wire, the same on every machine of this rail: small enough that
 * the way back starts early, large enough that its messages cost little against its
 * transfer. Each costs two comm-thread hand-offs per rank: with 4 ranks on 2 cores, 512 KiB
 * chunks gained 12 ms a step at 1 Gbit/s for the MLP (1.9 MB shares in bf16) and lost 4-7 ms
 * at 10 Gbit/s, where a whole share goes in 2 ms. So CTRAIN_HIER_CHAIN_CHUNK, or what the link
 * carries in CHAIN_CHUNK_S: machine 0 times two 1 MiB round trips to machine 1 (the faster
 * counts) and tells the rail; 256 KiB to 8 MiB. */
#define CHAIN_CHUNK_S 4e-3
static ct_status chain_chunk_bytes(ct_zero *z, size_t *out) {
    if (ct_config_is_set(CT_CFG_HIER_CHAIN_CHUNK)) {
        *out = (size_t)ct_config_int(CT_CFG_HIER_CHAIN_CHUNK);
        return CT_OK;
    }
    enum { PROBE = 1 << 20 };
    int64_t bytes = 0;
    ct_status st = CT_OK;
    if (z->mi <= 1) {
        char *buf = calloc(1, PROBE);
        if (!buf) return ct_error(CT_ERR_NOMEM, "sharded optimizer: out of memory"); /* the peer times out */
        double best = 1e30;
        for (int k = 0; st == CT_OK && k < 2; k++) {
            double t0 = ct_time_now();
            if (z->mi == 0) {
                st = ct_send_sync(z->rail, buf, PROBE / 4, CT_F32, 1, 0);
                if (st == CT_OK) st = ct_recv_sync(z->rail, buf, PROBE / 4, CT_F32, 1, 0);
            } else {
                st = ct_recv_sync(z->rail, buf, PROBE / 4, CT_F32, 0, 0);
                if (st == CT_OK) st = ct_send_sync(z->rail, buf, PROBE / 4, CT_F32, 0, 0);
            }
            double t = ct_time_now() - t0;
            if (t < best) best = t;
        }
        free(buf);
        double b = 2.0 * PROBE / best * CHAIN_CHUNK_S; /* bytes per second of one way, times the time */
        bytes = b < 256 << 10 ? 256 << 10 : b > 8 << 20 ? 8 << 20 : ((int64_t)b + 65535) & ~(int64_t)65535;
    }
    if (st == CT_OK) st = ct_broadcast_sync(z->rail, &bytes, 1, CT_I64, 0);
    *out = (size_t)bytes;
    CT_LOG_INFO("zero", "the chain's chunks: %lld KiB (%s)", (long long)(bytes >> 10),
                ct_config_is_set(CT_CFG_HIER_CHAIN_CHUNK) ? "CTRAIN_HIER_CHAIN_CHUNK" : "what the link carried in 4 ms");
    return st;
}

/* The machines' sums of the share (z->part) all-reduced on the rail, through the wire dtype */
static ct_status rail_all_reduce(ct_zero *z) {
    size_t m = z->hi - z->lo;
    if (z->wdt == CT_F32) return ct_all_reduce_sync(z->rail, z->part, m, CT_F32, CT_RED_SUM);
    ct_convert(z->wire, z->wdt, z->part, CT_F32, m);
    ct_status st = ct_all_reduce_sync(z->rail, z->wire, m, z->wdt, CT_RED_SUM);
    if (st == CT_OK) ct_convert(z->part, CT_F32, z->wire, z->wdt, m);
    return st;
}

/* chunk c of the share: its first element (from lo) and its length */
static size_t chunk_at(const ct_zero *z, int c, size_t *n) {
    size_t a = (size_t)c * z->chunk, m = z->hi - z->lo;
    *n = a + z->chunk < m ? z->chunk : m - a;
    return a;
}

/* The group machine mi sends its running sums on. A group's comm thread runs its works in
 * the order they were posted, so a machine in the middle that received and sent on one group
 * would send nothing before its last receive (the receives are posted first): store and
 * forward, the share's time twice. Even machines send on the rail, odd ones on z->fwd, so a
 * middle machine receives on one and sends on the other, each with its own thread: chunk c
 * goes on while chunk c+1 comes in. */
static ct_pg *chain_send_group(const ct_zero *z, int mi) { return mi % 2 && z->fwd ? z->fwd : z->rail; }

/* The chain in chunks: the running sum of chunk c goes on to the next machine while the
 * finished chunks come back (broadcast on z->back). Each chunk's arithmetic is that of the
 * whole share, so the bits are those of one pass; only the order in time changes. The chunks
 * go from the top of the share down, on every machine alike: chain_post posts the works that
 * wait for the peers in that order (each group's comm thread runs its works in the order they
 * were posted), chain_step passes one chunk on, chain_advance those whose turn it is, during
 * backward or after it, and chain_finish the rest, then waits for every one. */
static char *wire_of(const ct_zero *z) { return z->wdt != CT_F32 ? z->wire : (char *)z->part; }

/* z->part[a, a + n): this machine's ranks' gradients of the share added in rank order, onto
 * the running sum already there (onto: a machine past the chain's first) or from rank 0's */
static void machine_sum(ct_zero *z, size_t a, size_t n, bool onto) {
    float *s = z->part + a;
    int r = 0;
    if (!onto) memcpy(s, z->grads[r++] + z->lo + a, n * sizeof(float));
    for (; r < z->L; r++) {
        const float *g = z->grads[r] + z->lo + a;
        for (size_t j = 0; j < n; j++) s[j] = s[j] + g[j];
    }
}

/* the job's sum of [a, a + n) of the share, divided by the world size into this rank's own
 * gradient buffer, which its step reads: the averaging's true division */
static void average_into_own(ct_zero *z, size_t a, size_t n) {
    float *own = (float *)z->grads[z->li] + z->lo + a, *s = z->part + a, d = (float)ct_pg_size(z->pg);
    for (size_t j = 0; j < n; j++) own[j] = s[j] / d;
}

static void chain_post(ct_zero *z) {
    z->next = z->nchunks - 1;
    z->est = CT_OK;
    z->inflight = true;
    if (!z->chain) return; /* the rails: each chunk's all-reduce is posted when it is ready */
    size_t es = ct_dtype_size(z->wdt);
    char *wire = wire_of(z);
    bool last = z->mi == z->nm - 1;
    ct_pg *in = z->mi > 0 ? chain_send_group(z, z->mi - 1) : NULL;
    for (int c = z->nchunks - 1; c >= 0; c--) {
        size_t n, a = chunk_at(z, c, &n);
        if (!last) z->bw[c] = ct_broadcast(z->back, wire + a * es, n, z->wdt, z->nm - 1);
        if (z->mi > 0) z->fw[c] = ct_recv(in, wire + a * es, n, z->wdt, z->mi - 1, c);
    }
}

/* Chunk c: the running sum in (block false: only if it has arrived; false if not), this
 * machine's ranks added in rank order, and on to the next machine, or back from the last;
 * on the rails (no chain) the machine's sum of the chunk all-reduced. */
static bool chain_step(ct_zero *z, int c, bool block) {
    size_t es = ct_dtype_size(z->wdt), n, a = chunk_at(z, c, &n);
    bool cvt = z->wdt != CT_F32, onto = z->chain && z->mi > 0;
    char *w = wire_of(z) + a * es;
    float *s = z->part + a;
    if (onto) {
        if (!block && !ct_work_test(z->fw[c])) return false;
        ct_status st = ct_work_wait(z->fw[c]);
        ct_work_free(z->fw[c]);
        z->fw[c] = NULL;
        if (st != CT_OK) { z->est = st; return true; }
        if (cvt) ct_convert(s, CT_F32, w, z->wdt, n);
    }
    machine_sum(z, a, n, onto);
    if (cvt) ct_convert(w, z->wdt, s, CT_F32, n);
    if (!z->chain) { /* the rails: this chunk of the machines' sums all-reduced on its own */
        z->fw[c] = ct_all_reduce(z->rail, w, n, z->wdt, CT_RED_SUM);
    } else if (z->mi == z->nm - 1) {
        if (cvt) ct_convert(s, CT_F32, w, z->wdt, n); /* what the others will receive */
        z->bw[c] = ct_broadcast(z->back, w, n, z->wdt, z->nm - 1);
    } else {
        z->fw[c] = ct_send(chain_send_group(z, z->mi), w, n, z->wdt, z->mi + 1, c);
    }
    return true;
}

/* this rank's reach published: its gradients of the top `done` floats are final this step */
static void publish(ct_zero *z, size_t done) {
    atomic_store_explicit(z->progs[z->li], z->gen << REACH_SHIFT | done, memory_order_release);
}

/* every local rank's gradients from element x on are final this step */
static bool final_from(const ct_zero *z, size_t x) {
    uint64_t need = z->gen << REACH_SHIFT | (ct_params_numel(z->P) - x);
    for (int r = 0; r < z->L; r++)
        if (atomic_load_explicit(z->progs[r], memory_order_acquire) < need) return false;
    return true;
}

/* The chunks whose turn it is, in the chain's order: during backward (block false) while
 * every local rank has finished the next one and its running sum has arrived; after backward
 * (every rank's gradients final) all that are left. */
static void chain_advance(ct_zero *z, bool block) {
    while (z->next >= 0 && z->est == CT_OK) {
        size_t n, a = chunk_at(z, z->next, &n);
        if (!block && !final_from(z, z->lo + a)) return;
        if (!chain_step(z, z->next, block)) return;
        z->sent_early += !block;
        z->sent_all++;
        z->next--;
    }
}

/* DDP's progress during backward (ct_ddp_set_progress): the gradients of [lo, N) are final here */
static void on_progress(void *user, size_t lo) {
    ct_zero *z = user;
    if (!z->averaging) return;
    publish(z, ct_params_numel(z->P) - lo);
    if (z->inflight) chain_advance(z, false);
}

static ct_status chain_finish(ct_zero *z) {
    size_t es = ct_dtype_size(z->wdt);
    bool cvt = z->wdt != CT_F32, last = z->mi == z->nm - 1;
    char *wire = wire_of(z);
    if (!z->inflight) chain_post(z);
    chain_advance(z, true);
    ct_status st = z->est;
    /* every posted work is waited for, also after an error (a peer's timeout ends them) */
    for (int c = z->nchunks - 1; c >= 0; c--) {
        size_t n, a = chunk_at(z, c, &n);
        ct_status sf = z->fw[c] ? ct_work_wait(z->fw[c]) : CT_OK, sb = z->bw[c] ? ct_work_wait(z->bw[c]) : CT_OK;
        if (st == CT_OK) st = sf != CT_OK ? sf : sb;
        ct_work_free(z->fw[c]);
        ct_work_free(z->bw[c]);
        z->fw[c] = z->bw[c] = NULL;
        if (st != CT_OK) continue;
        if (cvt && (!last || !z->chain)) ct_convert(z->part + a, CT_F32, wire + a * es, z->wdt, n);
        average_into_own(z, a, n);
    }
    z->inflight = false;
    return st;
}

/* The exchange during backward: one cache line per rank for its reach, in memory the
 * machine's ranks share, and DDP's progress to publish it. Every rank takes the same
 * decision: on the rails the chunks are all-reduces of their own, which every machine must
 * post alike. Without the memory (a warning) the share goes after backward, whole. */
static ct_status early_setup(ct_zero *z, int n) {
    ct_status st = CT_ERR_NOMEM;
    if (ct_params_numel(z->P) < (size_t)1 << REACH_SHIFT && (z->progs = malloc(sizeof(*z->progs) * (size_t)n)))
        st = ct_pg_alloc_shared(z->pg, 64, &z->progmem);
    int32_t ok = st == CT_OK;
    if (st != CT_OK) {
        CT_LOG_WARN_("zero", "the exchange across machines waits for backward's end: %s",
                     z->progs ? ct_last_error() : "out of memory");
        z->progmem = NULL;
    }
    if ((st = ct_all_reduce_sync(z->pg, &ok, 1, CT_I32, CT_RED_MIN)) != CT_OK || !ok) return st;
    int k = 0;
    for (int r = 0; r < n; r++) {
        void *p = ct_pg_shared_peer(z->pg, z->progmem, r);
        if (p) z->progs[k++] = p;
    }
    CT_CHECK(k == z->L, "ct_zero: %d ranks share the reach's memory, %d the gradients'", k, z->L);
    atomic_init(z->progs[z->li], 0);
    ct_ddp_set_progress(z->ddp, on_progress, z);
    z->early = true;
    return CT_OK;
}

/* Layout of the segment: the parameters, then each state buffer, each rounded up to 16
 * floats. Rank r's region follows rank r-1's, so region 0's address starts one buffer that
 * spans them all. */
ct_status ct_zero_create(ct_ddp *ddp, ct_optim *opt, ct_zero **out) {
    *out = NULL;
    CT_CHECK(ddp && opt && ct_optim_params(opt) == ct_ddp_params(ddp), "ct_zero_create: the optimizer must be over the DDP's parameters");
    ct_pg *pg = ct_ddp_pg(ddp);
    int32_t want = ct_ddp_zero_copy(ddp) && ct_optim_device(opt).type == CT_DEV_CPU && ct_config_bool(CT_CFG_DDP_SHARD_OPTIM);
    ct_status st = ct_all_reduce_sync(pg, &want, 1, CT_I32, CT_RED_MIN);
    if (st != CT_OK || !want) return st;
    ct_params *P = ct_ddp_params(ddp);
    int n = ct_pg_size(pg), nst = ct_optim_state_count(opt);
    size_t N = ct_params_numel(P), N16 = (N + 15) & ~(size_t)15, total = (size_t)(1 + nst) * N16 * sizeof(float);
    ct_zero *z = calloc(1, sizeof *z);
    if (z) z->grads = malloc(sizeof(float *) * (size_t)n);
    if (!z || !z->grads) { free(z); return ct_error(CT_ERR_NOMEM, "sharded optimizer: out of memory"); }
    z->ddp = ddp;
    z->pg = pg;
    z->P = P;
    z->wdt = ct_ddp_comm_dtype(ddp);
    bool even = false;
    const float *g = ct_params_grad(P);
    if ((st = topology(z, g, &even)) != CT_OK || !even) {
        if (st == CT_OK) CT_LOG_INFO("zero", "optimizer not sharded: the machines hold different numbers of ranks");
        zero_release(z);
        return st;
    }
    int L = z->L, li = z->li;
    /* shares of whole 64-byte lines, so that no two ranks write one */
    size_t per = ((N + (size_t)L - 1) / (size_t)L + 15) & ~(size_t)15;
    z->lo = (size_t)li * per < N ? (size_t)li * per : N;
    z->hi = z->lo + per < N ? z->lo + per : N;
    size_t m = z->hi - z->lo;
    /* the chain, and the rails' exchange during backward, go in chunks */
    int32_t early_want = z->nm > 1 && ct_config_bool(CT_CFG_HIER_CHAIN_EARLY); /* every rank alike: 0 on one is 0 */
    if (z->nm > 1 && (st = ct_all_reduce_sync(pg, &early_want, 1, CT_I32, CT_RED_MIN)) != CT_OK) { zero_release(z); return st; }
    bool early = early_want;
    if ((z->chain || early) && z->nm > 1) {
        size_t bytes = 0;
        if ((st = chain_chunk_bytes(z, &bytes)) != CT_OK) { zero_release(z); return st; }
        z->chunk = bytes / ct_dtype_size(z->wdt);
        z->nchunks = (int)((m + z->chunk - 1) / z->chunk);
        z->fw = calloc((size_t)z->nchunks + 1, sizeof(ct_work *));
        z->bw = calloc((size_t)z->nchunks + 1, sizeof(ct_work *));
    }
    if (z->nm > 1 && (!(z->part = malloc(sizeof(float) * (m ? m : 1))) || (z->nchunks && (!z->fw || !z->bw)) ||
                      (z->wdt != CT_F32 && !(z->wire = malloc(ct_dtype_size(z->wdt) * (m ? m : 1)))))) {
        zero_release(z); /* collectives follow: a rank short of memory fails its job's next one */
        return ct_error(CT_ERR_NOMEM, "sharded optimizer: out of memory");
    }
    st = ct_pg_alloc_shared(pg, (total + (size_t)L - 1) / (size_t)L, &z->seg);
    if (st == CT_ERR_SYSTEM || st == CT_ERR_NOMEM) { /* /dev/shm full: the same decision on every rank */
        CT_LOG_WARN_("zero", "optimizer not sharded, every rank steps its own copy: %s", ct_last_error());
        zero_release(z);
        return CT_OK;
    }
    if (st != CT_OK) { zero_release(z); return st; }
    float *base = NULL; /* the first local rank's region */
    for (int r = 0; !base && r < n; r++) base = ct_pg_shared_peer(pg, z->seg, r);
    /* The first local rank's values, as DDP's start broadcasts its parameters: it moves its
     * buffers in (one at a time: its peak memory grows by one buffer, not all), the others
     * switch once it is done */
    if (li == 0) move_in(P, opt, base, N16, true);
    if ((st = ct_barrier_sync(pg)) != CT_OK) {
        if (li == 0) move_out(P, opt, true); /* back to private memory before the segment goes */
        ct_pg_free_shared(pg, z->seg);
        zero_release(z);
        return st;
    }
    if (li != 0) move_in(P, opt, base, N16, false);
    z->params_in = true;
    /* one machine: the step averages the ranks' buffers itself; across machines it reads its
     * own, where ct_zero_gradients_final put the average */
    ct_optim_shard sh = {.lo = z->lo, .hi = z->hi, .grads = z->nm > 1 ? NULL : z->grads, .ngrads = z->nm > 1 ? 0 : L,
                         .sync = zero_sync, .detach = zero_detach, .user = z};
    ct_optim_set_shard(opt, &sh);
    z->opt = opt;
    if (early && (st = early_setup(z, n)) != CT_OK) {
        ct_zero_free(z); /* a collective failed: the group is unusable */
        return st;
    }
    if (z->nm > 1)
        CT_LOG_INFO("zero", "sharded %s step: elements [%zu, %zu) of %zu here; parameters and %d state buffer%s in memory "
                    "shared by the %d ranks of this machine (%d of %d); the share's sum %s across machines in %s",
                    ct_optim_kind(opt), z->lo, z->hi, N, nst, nst == 1 ? "" : "s", L, z->mi, z->nm,
                    z->chain ? "passed on in rank order" : "all-reduced", ct_dtype_name(z->wdt));
    else
        CT_LOG_INFO("zero", "sharded %s step: elements [%zu, %zu) of %zu here; parameters and %d state buffer%s in memory "
                    "shared by the %d ranks", ct_optim_kind(opt), z->lo, z->hi, N, nst, nst == 1 ? "" : "s", L);
    *out = z;
    return CT_OK;
}

ct_status ct_zero_begin_step(ct_zero *z, bool average) {
    if (z->inflight) (void)chain_finish(z); /* a step that ended in an error after posting it */
    z->averaging = average && z->opt;
    if (z->opt) ct_optim_set_average(z->opt, false);
    ct_status st = ct_ddp_set_deferred(z->ddp, z->averaging);
    if (st == CT_OK && z->averaging && z->early) {
        /* the reach of every local rank counts (an empty share's too); the chain waits for the
         * first chunks' running sums before backward sends any */
        z->gen++;
        publish(z, 0);
        if (z->hi > z->lo) chain_post(z);
    }
    return st;
}

/* Across machines: this rank's share of the job's averaged gradient into its own buffer
 * (see the top of this file). */
static ct_status cross_machines(ct_zero *z) {
    double t0 = ct_time_now();
    size_t m = z->hi - z->lo;
    ct_status st = CT_OK;
    if (m == 0) return CT_OK; /* the same on every machine: this rail has nothing */
    if (z->chain || z->early) {
        st = chain_finish(z);
    } else {
        machine_sum(z, 0, m, false);
        st = rail_all_reduce(z);
        if (st == CT_OK) average_into_own(z, 0, m);
    }
    ct_ddp_add_wait(z->ddp, ct_time_now() - t0);
    return st;
}

ct_status ct_zero_gradients_final(ct_zero *z) {
    if (!z->averaging) return CT_OK;
    if (z->nm > 1) return cross_machines(z);
    ct_optim_set_average(z->opt, true);
    return CT_OK;
}

ct_status ct_zero_skip_step(ct_zero *z) {
    /* what the others do in their step: across machines the rails' exchange (this rank's
     * share still needs every machine's sum), then the barrier of zero_sync */
    ct_status st = z->averaging && z->nm > 1 ? cross_machines(z) : CT_OK;
    if (z->opt) ct_optim_set_average(z->opt, false);
    ct_status bs = ct_barrier_shared_sync(z->pg);
    return st != CT_OK ? st : bs;
}
