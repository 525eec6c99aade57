/* Private to src/distributed: the C interface of the gloo backend's C++ half (gloo.cc, Gloo's
 * API is C++). gloo_pg.c turns ct_pg and ct_work into these calls. Every function catches
 * all of Gloo's C++ exceptions and returns a ct_status with the message set (ct_error).
 *
 *   ct_gloo_comm *c;
 *   if (ct_gloo_comm_create(store, "ctrain/0/gloo/", rank, size, 300, "10.0.0.2", &c)) ...
 *   ct_gloo_op op = {.kind = CT_GLOO_BROADCAST, .rbuf = buf, .count = n, .esize = 4, .peer = 0,
 *                    .timeout_s = 300, .what = "broadcast #1"};
 *   ct_gloo_comm_run(c, &op);
 *   ct_gloo_comm_free(c);
 */
#ifndef CT_DIST_GLOO_H
#define CT_DIST_GLOO_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_gloo_comm ct_gloo_comm;

/* The data movements the backend is built from; reductions happen on the C side, in rank
 * order (see gloo_pg.c). */
typedef enum {
    CT_GLOO_BROADCAST, CT_GLOO_ALLGATHER, CT_GLOO_ALLTOALL, CT_GLOO_BARRIER, CT_GLOO_SEND, CT_GLOO_RECV,
    CT_GLOO_ALLREDUCE_ORDERED /* rbuf: count = n * part elements, part p reduced on rank p (below) */
} ct_gloo_kind;

/* dst = a op b for n elements (dst may alias a or b at the same index); `last`: the final
 * pass of a reduction (AVG divides there). */
typedef void (*ct_gloo_combine_fn)(void *dst, const void *a, const void *b, size_t n, int last, const void *arg);

typedef struct ct_gloo_op {
    ct_gloo_kind kind;
    const void *sbuf;  /* all-gather, all-to-all, send: the input */
    void *rbuf;        /* in place for broadcast; the output otherwise */
    size_t count;      /* elements (per rank for all-gather and all-to-all) */
    size_t esize;      /* bytes per element: 1, 2, 4 or 8 */
    int peer;          /* root, destination or source (group rank) */
    uint32_t tag;      /* send/recv: matched with the same tag; collectives: the sequence number */
    double timeout_s;  /* time left until the group's deadline */
    const char *what;  /* "all_reduce #5 (f32 x 1000, sum)": starts every error message */
    ct_gloo_combine_fn combine; /* CT_GLOO_ALLREDUCE_ORDERED: folds rank 0's part, then 1's... */
    const void *combine_arg;
} ct_gloo_op;

/* Connects `size` ranks into a full mesh of TCP connections from `ifaddr` (this host's
 * address), exchanging addresses through `store` under the key prefix `ns` (which no other
 * group may use). Collective over the ranks; waits up to timeout_s for all of them. */
ct_status ct_gloo_comm_create(ct_store *store, const char *ns, int rank, int size, double timeout_s,
                              const char *ifaddr, ct_gloo_comm **out);
/* Error messages name a lost peer r as world rank granks[r] of world_size (a group that
 * holds some of the world's ranks, e.g. one leader per machine) instead of its group rank. */
ct_status ct_gloo_comm_name_world_ranks(ct_gloo_comm *c, const int *granks, int world_size);
/* Runs one operation to completion; a dead peer or the timeout is an error naming op->what,
 * the peer's rank and host where Gloo reports them. */
ct_status ct_gloo_comm_run(ct_gloo_comm *c, const ct_gloo_op *op);
void ct_gloo_comm_free(ct_gloo_comm *c);

#ifdef __cplusplus
}
#endif
#endif
