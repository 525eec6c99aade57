/* Hierarchical all-reduce of B bytes, L ranks on this machine, N machines, W = N*L ranks:
 *
 *   1. reduce to local rank 0 over shm                  memory only, ~2B per rank
 *   2. all-reduce among the N leaders (flat backend)    network ~2B(N-1)/N per machine (ring)
 *   3. broadcast from local rank 0 over shm             memory only, B per rank
 *
 * A flat ring all-reduce of all W ranks moves ~2B(W-1)/W per rank, L times that per machine,
 * through the network: the leaders' step moves 1/L of it. AVG is SUM in steps 1-2 and one
 * division by W on the leader before step 3. f16/bf16 travel as f32 (converted on every
 * rank first), so the only rounding to the half type is the last one.
 * Same bits run to run: shm reduces in local rank order, and the leaders' backend picks
 * the same algorithm for the same N and size every time. */
#include "distributed/hier.h"

ct_status hier_allreduce(hier_pg *h, ct_work *w, double deadline) {
    ct_dtype dt = w->dt;
    void *buf = w->rbuf;
    int half = dt == CT_F16 || dt == CT_BF16;
    if (half) {
        if (!(buf = hier_scratch(h, 0, w->count * 4))) return ct_error(CT_ERR_NOMEM, "hier all_reduce staging");
        ct_convert(buf, CT_F32, w->rbuf, dt, w->count);
        dt = CT_F32;
    }
    ct_reduce_op op = w->rop == CT_RED_AVG ? CT_RED_SUM : w->rop;
    ct_status st = CT_OK;
    if (h->lsize > 1)
        st = hier_step(h, &h->local, "intra-node reduce", CT_OP_REDUCE, buf, buf, w->count, dt, op, 0, deadline);
    if (!st && h->lrank == 0) {
        if (h->nnodes > 1 &&
            (st = hier_step(h, &h->leaders, "inter-node all_reduce", CT_OP_ALLREDUCE, buf, buf, w->count, dt, op, 0,
                            deadline)))
            return hier_fail_local(h, st);
        if (w->rop == CT_RED_AVG) ct_reduce_scale(dt, buf, w->count, h->world->size);
    }
    if (!st && h->lsize > 1)
        st = hier_step(h, &h->local, "intra-node broadcast", CT_OP_BROADCAST, buf, buf, w->count, dt, CT_RED_SUM, 0,
                       deadline);
    if (!st && half) ct_convert(w->rbuf, w->dt, buf, CT_F32, w->count);
    return st;
}
