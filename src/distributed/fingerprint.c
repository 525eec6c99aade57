/* Fingerprints of the backends that exchange them as messages (mpi, gloo): each rank sends
 * what it is about to run, and every rank compares all of them before running it, so ranks
 * that called different collectives fail with both sides named instead of hanging. (The
 * shm backend keeps its fingerprints in the shared segment: shm.c.) */
#include <string.h>

#include "dist_internal.h"

ct_op_fp ct_op_fp_of(const ct_work *w) {
    ct_op_fp f = {w->seq, (uint8_t)w->kind, (uint8_t)w->dt, (uint8_t)w->rop, 0, w->peer, 0, w->count};
    /* only what the operation uses must agree */
    if (w->kind != CT_OP_ALLREDUCE && w->kind != CT_OP_REDUCE && w->kind != CT_OP_REDUCE_SCATTER) f.rop = 0;
    if (w->kind != CT_OP_BROADCAST && w->kind != CT_OP_REDUCE) f.root = 0;
    return f;
}

ct_status ct_op_fp_compare(const ct_work *w, const ct_op_fp *all, int n, int rank, const int *granks) {
    const ct_op_fp mine = ct_op_fp_of(w);
    for (int p = 0; p < n; p++) {
        const ct_op_fp *f = &all[p];
        if (!memcmp(f, &mine, sizeof mine)) continue;
        char a[200], b[200];
        ct_work x = {.kind = f->kind, .seq = f->seq, .dt = (ct_dtype)f->dt, .rop = (ct_reduce_op)f->rop,
                     .count = f->count, .peer = f->root};
        ct_work_describe(w, a, sizeof a);
        ct_work_describe(&x, b, sizeof b);
        const char *who = granks ? "rank" : "group rank";
        return ct_error(CT_ERR_MISMATCH, "collective mismatch: %s %d called %s but %s %d called %s", who,
                        granks ? granks[rank] : rank, a, who, granks ? granks[p] : p, b);
    }
    return CT_OK;
}
