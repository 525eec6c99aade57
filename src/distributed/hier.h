/* Private to the hierarchical backend (hier.c, hier_allreduce.c, hier_coll.c).
 *
 * A job over several machines with several ranks on some of them runs three groups:
 *   flat     every rank, on the flat backend (MPI today, Gloo later): bootstrap (node keys,
 *            the shm segment's name), and the operations hier does not split (reduce,
 *            reduce_scatter, all_to_all, send/recv, subgroups);
 *   local    the ranks of this machine, on the shm backend;
 *   leaders  local rank 0 of every machine, on the flat backend (NULL on other ranks);
 *   rail     local rank i of every machine, on the flat backend (rail all-reduce only; local
 *            rank 0's rail is the leaders group).
 * Every operation is a fixed sequence of steps on these groups, each group's steps numbered
 * by its own counter (the same on every member), so fingerprints keep working per group and
 * results are the same bits run to run. */
#ifndef CT_DIST_HIER_H
#define CT_DIST_HIER_H

#include "distributed/dist_internal.h"
#include "distributed/pg_common.h"

typedef struct {
    const ct_backend *be;
    void *impl;
    ct_pg *pg; /* rank, size, granks of the group */
    uint32_t seq;
} hier_sub;

typedef struct {
    ct_pg *world;
    int nnodes, node, lrank, lsize, maxlocal;
    int ordered;             /* all-reduce in world rank order (hier_allreduce.c) */
    int rail;                /* all-reduce by slices, one per local rank (hier_allreduce.c) */
    int failed;              /* an operation timed out or lost a peer: no collective teardown */
    char (*keys)[128];       /* by node: its key (host/netns), for messages */
    int *node_of, *lrank_of; /* by world rank */
    int *leader_of;          /* by node: the world rank of its local rank 0 */
    char host[64];           /* this machine's name, for messages */
    hier_sub flat, local, leaders, rail_own; /* rail_own: this rank's rail when lrank > 0 */
    ct_pg *local_pg, *leaders_pg, *rail_pg; /* shells describing the groups (granks...) */
    void *tmp, *tmp2;
    size_t cap, cap2;
} hier_pg;

/* Runs one step of `kind` on group g (seq numbered by g), or fails with a message naming the
 * step, this rank and this machine. */
ct_status hier_step(hier_pg *h, hier_sub *g, const char *what, int kind, const void *s, void *r, size_t count,
                    ct_dtype dt, ct_reduce_op op, int peer, double deadline);
/* After a failed leaders' step: fails this machine's other ranks at once with the same
 * message (they wait in shm for the leader otherwise), and returns st. */
ct_status hier_fail_local(hier_pg *h, ct_status st);
/* Scratch of at least `bytes` (which: 0 or 1), NULL when out of memory. */
void *hier_scratch(hier_pg *h, int which, size_t bytes);

ct_status hier_allreduce(hier_pg *h, ct_work *w, double deadline);
ct_status hier_broadcast(hier_pg *h, ct_work *w, double deadline);
ct_status hier_allgather(hier_pg *h, ct_work *w, double deadline);
ct_status hier_barrier(hier_pg *h, ct_work *w, double deadline);
#endif
