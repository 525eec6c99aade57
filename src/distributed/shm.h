/* Private to the shm backend: segment layout and the synchronisation primitives shared by
 * the collective files (shm_allreduce.c, shm_coll.c, shm_p2p.c).
 *
 * Segment layout (one per group, created by group rank 0, unlinked once all ranks mapped it):
 *   [hdr 4 KiB][ctl: n x 64 B][chan: n*n x 256 B][slots: n x 2 x H][p2p: n*n x 2 x P]
 * Each rank owns ctl[r] (its post counter and fingerprints) and slot[r][0..1] (staging halves,
 * alternated per round so that a rank can fill one while peers still read the other).
 *
 * Synchronisation: every rank performs the same sequence of posts (one per phase); a post
 * increments the rank's counter; wait_all(k) waits until every peer's counter >= k.
 * Waits spin (yielding the core when another task wants it), then sleep on a futex; the spin
 * budget follows the measured cost of a futex wake-up (docs/bench/collectives.md). */
#ifndef CT_DIST_SHM_H
#define CT_DIST_SHM_H

#include "distributed/dist_internal.h"
#include "distributed/pg_common.h"

typedef struct {
    _Atomic uint32_t v;
    _Atomic uint32_t waiters;
    _Atomic uint64_t woke_ns; /* when the last FUTEX_WAKE on v was issued: the woken measure the wake-up */
} shm_word;

typedef struct {
    uint32_t seq;
    uint8_t kind, dt, rop, valid;
    int32_t root;
    uint32_t pad;
    uint64_t count;
    uint64_t zc; /* in-place all-reduce: (allocation id + 1) << 40 | byte offset; 0 = staged */
} shm_fp; /* 32 bytes */
#define SHM_ZC_CMA UINT64_MAX /* fp.zc of an all-reduce through cross-memory attach */

/* A tiny all-reduce's input with its description in one cache line (by tiny-op parity): a
 * peer reads it with one line transfer, where the post, the fingerprint and the staging slot
 * took three (shm_allreduce.c). */
#define SHM_TINY_BYTES 48
typedef struct __attribute__((aligned(64))) {
    _Atomic uint32_t seq; /* the op's sequence number, stored last (release) */
    uint8_t kind, dt, rop, pad;
    uint32_t count;
    uint32_t pad2;
    uint8_t data[SHM_TINY_BYTES];
} shm_tiny;

typedef struct __attribute__((aligned(64))) {
    shm_word seq;
    int32_t pid;
    uint32_t pad;
    shm_fp fp[2]; /* by op sequence parity: a fast peer may already describe the next op */
    uint64_t cma_addr[2]; /* by op parity: the buffer a cross-memory all-reduce reads and writes */
    int32_t cma_ok;       /* set up: this rank could read every peer's memory (process_vm_readv) */
    uint64_t cma_plan[2]; /* rank 0's only, by large all-reduce parity: size classes to run through it */
    shm_tiny tiny[2];
} shm_ctl;

typedef struct {
    uint32_t tag, dt;
    uint64_t count;
} shm_msghdr;

typedef struct __attribute__((aligned(64))) {
    shm_word sent; /* chunks written by the sender */
    uint8_t pad0[48];
    shm_word acked; /* chunks consumed by the receiver */
    uint8_t pad1[48];
    shm_msghdr hdr[2];
    uint8_t pad2[96];
} shm_chan;

typedef struct __attribute__((aligned(4096))) {
    uint32_t magic, nranks;
    uint64_t H, P, total;
    _Atomic uint32_t abort; /* set by the first rank that fails; others fail at once */
    int32_t abort_rank;
    char abort_msg[640];
} shm_hdr;

/* A ct_pg_alloc_shared mapping: n regions of `stride` bytes, rank r's at base + r * stride. */
typedef struct shm_shared {
    struct shm_shared *next;
    uint8_t *base;
    size_t stride, map_bytes;
    uint32_t id; /* allocation number in the group, the same on every rank */
} shm_shared;

typedef struct shm_pg {
    int rank, n, gid;
    const int *granks;
    int subgroup;
    uint8_t *base;
    size_t map_bytes;
    shm_hdr *hdr;
    shm_ctl *ctl;
    shm_chan *chan;
    uint8_t *slots, *p2p;
    size_t H, P;
    uint32_t posts;  /* my post count (= ctl[rank].seq) */
    uint64_t round;  /* staging half parity */
    uint64_t tiny_round; /* ctl[].tiny parity */
    uint32_t *p2p_sent, *p2p_recv;
    int fingerprint;
    double spin_s;    /* current spin budget before sleeping */
    int spin_fixed;   /* CTRAIN_SHM_SPIN_US given: no adaptation */
    int oversub;      /* more local ranks than CPUs: yield at once */
    int in_op;        /* past the first wait of a multi-round op: spin longer */
    double wake_s;    /* running mean of the measured futex wake-up latency */
    size_t small_max;
    int cma;          /* every rank can read and write the peers' memory: large all-reduce in 2 steps */
    size_t cma_chunk; /* bytes per read from a peer: a share of the L2 cache */
    uint8_t *cma_tmp; /* n x cma_chunk: peers' data, then the partial sums */
    /* which large all-reduces use cross-memory attach: per size class (floor(log2 bytes)),
     * whichever of it and the staged rounds rank 0 measured faster (shm_cma.c) */
    int cma_adapt;          /* CTRAIN_SHM_CMA unset: choose by measurement */
    uint64_t cma_mask;      /* classes that use it now: the same on every rank */
    uint32_t nlarge;        /* large all-reduces so far (parity of ctl[0].cma_plan) */
    double wait1_s;         /* the current op's first wait: a late peer, not the path's cost */
    float cma_cost[2][64];  /* rank 0: s per byte, running mean, [0] staged, [1] cross-memory; 0 unmeasured */
    uint16_t cma_since[64], cma_every[64]; /* rank 0: calls since the slower path was last tried; interval */
    /* wait statistics (CTRAIN_DEBUG=INFO CTRAIN_DEBUG_SUBSYS=shm prints them at exit) */
    uint64_t st_waits, st_ready, st_spun, st_slept, st_contended, st_wakes, st_wakeups, st_large[2];
    double st_wait_s, st_wake_s;
    const ct_work *cur; /* for messages */
    shm_shared *shared; /* ct_pg_alloc_shared mappings (list changed only with the queue drained) */
    uint32_t nshared;
    char name[96];
} shm_pg;

static inline uint8_t *shm_slot(shm_pg *s, int r, int b) { return s->slots + ((size_t)r * 2 + (size_t)b) * s->H; }
static inline shm_chan *shm_ch(shm_pg *s, int src, int dst) { return &s->chan[src * s->n + dst]; }
static inline uint8_t *shm_pbuf(shm_pg *s, int src, int dst, int b) {
    return s->p2p + (((size_t)src * (size_t)s->n + (size_t)dst) * 2 + (size_t)b) * s->P;
}

/* shm.c */
void shm_post(shm_pg *s);
/* Waits until all peers have posted as often as this rank; checks fingerprints when `check`. */
ct_status shm_wait_all(shm_pg *s, double deadline, int check);
/* One round of a chunked collective: post this rank's slot, wait for every rank's. `*first`
 * checks fingerprints on the first round only, then is cleared. */
static inline ct_status shm_round(shm_pg *s, double deadline, int *first) {
    shm_post(s);
    double t0 = ct_time_now();
    ct_status st = shm_wait_all(s, deadline, *first);
    if (*first) s->wait1_s = ct_time_now() - t0;
    *first = 0;
    s->in_op = 1; /* the peers are in this op: later rounds spin longer instead of sleeping */
    return st;
}
/* Writes this rank's fingerprint for the current op (before its first post). */
void shm_fp_begin(shm_pg *s, const ct_work *w);
ct_status shm_wait_word(shm_pg *s, shm_word *w, uint32_t target, int peer, double deadline);
void shm_word_add(shm_pg *s, shm_word *w);
ct_status shm_fail(shm_pg *s, ct_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Elements per part when `ce` elements are split in n parts aligned to 64 bytes. */
size_t shm_part(size_t ce, int n, size_t esz);

/* shm_cma.c: all-reduce of large private buffers through cross-memory attach or the staged
 * rounds, whichever is faster here (measured) */
ct_status shm_allreduce_large(shm_pg *s, ct_work *w, double deadline);

/* shm_shared.c: shared allocations and the in-place all-reduce over them. */
shm_shared *shm_find_shared(shm_pg *s, const void *buf, size_t bytes);
ct_status shm_allreduce_shared(shm_pg *s, shm_shared *a, ct_work *w, double deadline);
ct_status shm_alloc_shared(ct_pg *pg, void *impl, size_t bytes, void **mine);
void *shm_shared_peer(void *impl, void *p, int rank);
void shm_free_shared(void *impl, void *mine);
void shm_free_all_shared(shm_pg *s);

/* Collectives (one algorithm per file). */
ct_status shm_allreduce(shm_pg *s, ct_work *w, double deadline);
ct_status shm_allreduce_staged(shm_pg *s, ct_work *w, double deadline);
void shm_reduce_sources(ct_dtype dt, ct_reduce_op op, int n, const void *const *src, void *acc, void *out, void *out2,
                        size_t cnt);
ct_status shm_broadcast(shm_pg *s, ct_work *w, double deadline);
ct_status shm_allgather(shm_pg *s, ct_work *w, double deadline);
ct_status shm_reduce_scatter(shm_pg *s, ct_work *w, double deadline);
ct_status shm_alltoall(shm_pg *s, ct_work *w, double deadline);
ct_status shm_barrier(shm_pg *s, ct_work *w, double deadline);
ct_status shm_send(shm_pg *s, ct_work *w, double deadline);
ct_status shm_recv(shm_pg *s, ct_work *w, double deadline);
#endif
