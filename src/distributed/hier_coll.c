/* Hierarchical broadcast, all-gather and barrier (B bytes per rank, L ranks on this
 * machine, N machines, W ranks; "net" is what leaves each machine):
 *
 *   broadcast   shm broadcast on the root's machine, flat broadcast among the leaders
 *               from the root's machine, shm broadcast from local rank 0 elsewhere.
 *               net: B per machine (a flat tree would send it to each of the L ranks).
 *   all_gather  shm all-gather of the L blocks, flat all-gather of padded L_max*B blocks
 *               among the leaders, reorder by world rank, shm broadcast of W*B.
 *               net: ~N*L_max*B per machine instead of L times W*B.
 *   barrier     shm barrier, leaders' barrier, shm barrier.
 */
#include "distributed/hier.h"

#include <string.h>

ct_status hier_broadcast(hier_pg *h, ct_work *w, double deadline) {
    int rn = h->node_of[w->peer], rl = h->lrank_of[w->peer];
    ct_status st = CT_OK;
    if (h->node == rn && h->lsize > 1)
        st = hier_step(h, &h->local, "intra-node broadcast", CT_OP_BROADCAST, w->rbuf, w->rbuf, w->count, w->dt,
                       CT_RED_SUM, rl, deadline);
    if (!st && h->lrank == 0 && h->nnodes > 1 &&
        (st = hier_step(h, &h->leaders, "inter-node broadcast", CT_OP_BROADCAST, w->rbuf, w->rbuf, w->count, w->dt,
                        CT_RED_SUM, rn, deadline)))
        return hier_fail_local(h, st);
    if (!st && h->node != rn && h->lsize > 1)
        st = hier_step(h, &h->local, "intra-node broadcast", CT_OP_BROADCAST, w->rbuf, w->rbuf, w->count, w->dt,
                       CT_RED_SUM, 0, deadline);
    return st;
}

ct_status hier_allgather(hier_pg *h, ct_work *w, double deadline) {
    size_t blk = w->count * ct_dtype_size(w->dt), lcount = w->count * (size_t)h->maxlocal;
    int W = h->world->size;
    uint8_t *lbuf = hier_scratch(h, 0, blk * (size_t)h->maxlocal);
    uint8_t *gbuf = h->lrank == 0 ? hier_scratch(h, 1, blk * (size_t)h->maxlocal * (size_t)h->nnodes) : NULL;
    if (!lbuf || (h->lrank == 0 && !gbuf)) return ct_error(CT_ERR_NOMEM, "hier all_gather staging");
    memset(lbuf + blk * (size_t)h->lsize, 0, blk * (size_t)(h->maxlocal - h->lsize)); /* padding */
    ct_status st = CT_OK;
    if (h->lsize > 1)
        st = hier_step(h, &h->local, "intra-node all_gather", CT_OP_ALLGATHER, w->sbuf, lbuf, w->count, w->dt,
                       CT_RED_SUM, 0, deadline);
    else
        memcpy(lbuf, w->sbuf, blk);
    if (!st && h->lrank == 0) {
        if (h->nnodes > 1) {
            st = hier_step(h, &h->leaders, "inter-node all_gather", CT_OP_ALLGATHER, lbuf, gbuf, lcount, w->dt,
                           CT_RED_SUM, 0, deadline);
            if (st) return hier_fail_local(h, st);
        } else {
            memcpy(gbuf, lbuf, blk * (size_t)h->maxlocal);
        }
        for (int r = 0; r < W; r++)
            memcpy((uint8_t *)w->rbuf + (size_t)r * blk,
                   gbuf + ((size_t)h->node_of[r] * (size_t)h->maxlocal + (size_t)h->lrank_of[r]) * blk, blk);
    }
    if (!st && h->lsize > 1)
        st = hier_step(h, &h->local, "intra-node broadcast", CT_OP_BROADCAST, w->rbuf, w->rbuf, w->count * (size_t)W,
                       w->dt, CT_RED_SUM, 0, deadline);
    return st;
}

ct_status hier_barrier(hier_pg *h, ct_work *w, double deadline) {
    ct_status st = CT_OK;
    if (w->tag == CT_BARRIER_SHARED_TAG) /* this machine's ranks only */
        return h->lsize > 1 ? hier_step(h, &h->local, "intra-node barrier", CT_OP_BARRIER, NULL, NULL, 0, CT_I32,
                                        CT_RED_SUM, 0, deadline)
                            : CT_OK;
    if (h->lsize > 1) st = hier_step(h, &h->local, "intra-node barrier", CT_OP_BARRIER, NULL, NULL, 0, CT_I32, CT_RED_SUM, 0, deadline);
    if (!st && h->lrank == 0 && h->nnodes > 1 &&
        (st = hier_step(h, &h->leaders, "inter-node barrier", CT_OP_BARRIER, NULL, NULL, 0, CT_I32, CT_RED_SUM, 0, deadline)))
        return hier_fail_local(h, st);
    if (!st && h->lsize > 1) st = hier_step(h, &h->local, "intra-node barrier", CT_OP_BARRIER, NULL, NULL, 0, CT_I32, CT_RED_SUM, 0, deadline);
    return st;
}
