/* Hierarchical all-reduce of B bytes, L ranks on this machine, N machines, W = N*L ranks.
 *
 * ordered (default when every machine holds a contiguous block of world ranks, as mpirun's
 * default mapping and ctrain run --nnodes give): the sum in world rank order, so the same
 * bits as a one-machine run of W ranks (shm folds ranks 0..W-1 left to right):
 *   1. leader k > 0 receives the running sum S of machines 0..k-1 and sets buf = S + buf
 *                                                         network: B in per machine
 *   2. shm reduce to local rank 0, folding local ranks in order onto it   memory, ~2B/rank
 *   3. leader k < N-1 sends the running sum on            network: B out per machine
 *   4. the last leader divides (AVG) and broadcasts among the leaders     network: ~B
 *   5. shm broadcast from local rank 0                                   memory, B/rank
 *   Steps 1-3 go in 4 MiB chunks, so machine k reduces chunk c+1 while machine k+1 works on
 *   chunk c (time ~ one shm reduction + N chunk latencies); a flat ring all-reduce of all W
 *   ranks would move ~2B(W-1)/W per rank, L times that per machine, through the network.
 *
 * tree (CTRAIN_HIER_ALLREDUCE=tree, or ranks interleaved across machines): every machine
 * reduces at once (shm), the leaders all-reduce (flat backend, ~2B(N-1)/N each), shm
 * broadcast. Faster with many machines; sums in another order than one machine would.
 *
 * rail (CTRAIN_HIER_ALLREDUCE=rail, every machine with the same L): the buffer in L slices
 * (zero-padded to a multiple of L), as NCCL's rings per NIC:
 *   1. shm reduce-scatter: local rank i gets its machine's sum of slice i   memory, ~2B/rank
 *   2. local rank i of every machine all-reduces slice i on rail i (flat backend)
 *                                               network: L connections of ~2B(N-1)/(NL) each
 *   3. shm all-gather of the slices                                       memory, ~B/rank
 *   Every local rank drives its own connection (and core) instead of one leader moving all
 *   B; sums in another order than one machine would (as tree), so not the default.
 *
 * AVG is SUM, then one division by W on a leader (rail: on each slice's ranks). Both orders are fixed, so the result is
 * the same bits run to run (for f16/bf16 with AVG it may differ from a one-machine run by
 * one rounding: that run divides before its last rounding). */
#include "distributed/hier.h"

#include <stdint.h>
#include <string.h>

static ct_status tree(hier_pg *h, ct_work *w, ct_reduce_op op, double deadline) {
    void *buf = w->rbuf;
    ct_status st = CT_OK;
    if (h->lsize > 1)
        st = hier_step(h, &h->local, "intra-node reduce", CT_OP_REDUCE, buf, buf, w->count, w->dt, op, 0, deadline);
    if (!st && h->lrank == 0) {
        if (h->nnodes > 1 && (st = hier_step(h, &h->leaders, "inter-node all_reduce", CT_OP_ALLREDUCE, buf, buf,
                                             w->count, w->dt, op, 0, deadline)))
            return hier_fail_local(h, st);
        if (w->rop == CT_RED_AVG) ct_reduce_scale(w->dt, buf, w->count, h->world->size);
    }
    return st;
}

/* Steps 1-3 in chunks: machine k reduces chunk c+1 while machine k+1 works on chunk c. */
#define ORDERED_CHUNK_BYTES (4u << 20)

static ct_status ordered(hier_pg *h, ct_work *w, ct_reduce_op op, double deadline) {
    size_t esz = ct_dtype_size(w->dt), step = ORDERED_CHUNK_BYTES / esz;
    int last = h->nnodes - 1;
    void *prev = NULL;
    if (h->lrank == 0 && h->node > 0 && !(prev = hier_scratch(h, 0, (w->count < step ? w->count : step) * esz)))
        return hier_fail_local(h, ct_error(CT_ERR_NOMEM, "hier all_reduce staging"));
    ct_status st = CT_OK;
    size_t off = 0;
    do {
        size_t n = w->count - off < step ? w->count - off : step;
        uint8_t *buf = (uint8_t *)w->rbuf + off * esz;
        if (h->lrank == 0 && h->node > 0) {
            if ((st = hier_step(h, &h->leaders, "running sum from the previous node", CT_OP_RECV, NULL, prev, n, w->dt,
                                CT_RED_SUM, h->node - 1, deadline)))
                return hier_fail_local(h, st);
            ct_reduce2(w->dt, op, buf, NULL, prev, buf, n, 0);
        }
        if (h->lsize > 1 &&
            (st = hier_step(h, &h->local, "intra-node reduce", CT_OP_REDUCE, buf, buf, n, w->dt, op, 0, deadline)))
            return st;
        if (h->lrank == 0 && h->node < last &&
            (st = hier_step(h, &h->leaders, "running sum to the next node", CT_OP_SEND, buf, NULL, n, w->dt,
                            CT_RED_SUM, h->node + 1, deadline)))
            return hier_fail_local(h, st);
        off += n;
    } while (off < w->count);
    if (h->lrank == 0) {
        if (h->node == last && w->rop == CT_RED_AVG) ct_reduce_scale(w->dt, w->rbuf, w->count, h->world->size);
        if (h->nnodes > 1 && (st = hier_step(h, &h->leaders, "inter-node broadcast of the sum", CT_OP_BROADCAST,
                                             w->rbuf, w->rbuf, w->count, w->dt, CT_RED_SUM, last, deadline)))
            return hier_fail_local(h, st);
    }
    return st;
}

static ct_status rail(hier_pg *h, ct_work *w, ct_reduce_op op, double deadline) {
    size_t esz = ct_dtype_size(w->dt), L = (size_t)h->lsize, blk = (w->count + L - 1) / L, bytes = w->count * esz;
    uint8_t *full = w->rbuf, *slice = hier_scratch(h, 1, blk * esz);
    if (blk * L != w->count && (full = hier_scratch(h, 0, blk * L * esz))) {
        memcpy(full, w->rbuf, bytes);
        memset(full + bytes, 0, blk * L * esz - bytes); /* padding: reduced, never returned */
    }
    if (!slice || !full) return hier_fail_local(h, ct_error(CT_ERR_NOMEM, "hier rail all_reduce staging"));
    ct_status st = hier_step(h, &h->local, "intra-node reduce_scatter", CT_OP_REDUCE_SCATTER, full, slice, blk, w->dt,
                             op, 0, deadline);
    if (st) return st;
    hier_sub *g = h->lrank ? &h->rail_own : &h->leaders;
    if (h->nnodes > 1 && (st = hier_step(h, g, "inter-node all_reduce of this rank's slice", CT_OP_ALLREDUCE, slice,
                                         slice, blk, w->dt, op, 0, deadline)))
        return hier_fail_local(h, st);
    if (w->rop == CT_RED_AVG) ct_reduce_scale(w->dt, slice, blk, h->world->size);
    if ((st = hier_step(h, &h->local, "intra-node all_gather", CT_OP_ALLGATHER, slice, full, blk, w->dt, CT_RED_SUM, 0,
                        deadline)))
        return st;
    if (full != w->rbuf) memcpy(w->rbuf, full, bytes);
    return CT_OK;
}

ct_status hier_allreduce(hier_pg *h, ct_work *w, double deadline) {
    ct_reduce_op op = w->rop == CT_RED_AVG ? CT_RED_SUM : w->rop;
    if (h->rail) return rail(h, w, op, deadline);
    ct_status st = h->ordered ? ordered(h, w, op, deadline) : tree(h, w, op, deadline);
    if (!st && h->lsize > 1)
        st = hier_step(h, &h->local, "intra-node broadcast", CT_OP_BROADCAST, w->rbuf, w->rbuf, w->count, w->dt,
                       CT_RED_SUM, 0, deadline);
    return st;
}
