/* Private to src/distributed: what every backend shares about an operation (pg_common.c),
 * a leaf under the backends: the work item, its name and one-line description, and the
 * fingerprint check of the backends that exchange fingerprints as messages. Needs nothing
 * from the process group but the work item (ct_random_hex, public in ctrain/launch.h, is
 * here too). */
#ifndef CT_DIST_PG_COMMON_H
#define CT_DIST_PG_COMMON_H

#include <stdatomic.h>
#include <stdbool.h>

#include "ctrain/dist.h"
#include "ctrain/launch.h" /* ct_random_hex */

typedef enum {
    CT_OP_ALLREDUCE = 1, CT_OP_BROADCAST, CT_OP_REDUCE, CT_OP_ALLGATHER, CT_OP_REDUCE_SCATTER,
    CT_OP_ALLTOALL, CT_OP_BARRIER, CT_OP_SEND, CT_OP_RECV
} ct_opkind;

struct ct_work {
    ct_pg *pg;
    ct_work *next;
    int kind;
    const void *sbuf;
    void *rbuf;
    size_t count;
    ct_dtype dt;
    ct_reduce_op rop;
    int peer; /* root, dst or src */
    int tag;
    uint32_t seq; /* collective sequence number in the group (send/recv are not numbered) */
    _Atomic uint32_t state; /* 0 pending, 1 done, 2 pending with a sleeping waiter */
    ct_status st;
    int heap;
    char msg[640];
};

/* "all_reduce", "send"... ("?" for an unknown kind). */
const char *ct_op_name(int kind);
/* Point to point (send, recv): matched per pair, no sequence number, no fingerprint. */
static inline bool ct_op_is_p2p(int kind) { return kind == CT_OP_SEND || kind == CT_OP_RECV; }

/* Room for a ct_work_describe line. */
#define CT_WORK_DESC 200
/* One line describing an operation: "all_reduce #5 (f32 x 1000, sum)". */
void ct_work_describe(const ct_work *w, char *out, size_t n);

/* What a rank is about to run, exchanged before a collective by the backends that send it
 * as a message; fields a kind does not use are zero. */
typedef struct {
    uint32_t seq;
    uint8_t kind, dt, rop, pad;
    int32_t root;
    uint32_t pad2;
    uint64_t count;
} ct_op_fp;
ct_op_fp ct_op_fp_of(const ct_work *w);
/* CT_ERR_MISMATCH naming both sides when any of all[0, n) differs from w's own fingerprint;
 * ranks are named through granks (world ranks), or as group ranks when it is NULL. */
ct_status ct_op_fp_compare(const ct_work *w, const ct_op_fp *all, int n, int rank, const int *granks);

/* A backend's all-gather for fingerprints: `bytes` from mine to every rank, rank r's at
 * all + r * bytes, by deadline (the message goes to ct_error). */
typedef ct_status (*ct_fp_allgather_fn)(void *ctx, const ct_work *w, const void *mine, void *all, size_t bytes,
                                        double deadline);
/* The check a backend that sends fingerprints as messages (mpi, gloo) runs before it starts
 * w: every rank's fingerprint through `allgather`, compared with w's (ct_op_fp_compare).
 * Nothing when `on` is 0, w is point to point or the group has one rank. */
ct_status ct_op_fp_check(const ct_work *w, int on, int n, int rank, const int *granks, ct_fp_allgather_fn allgather,
                         void *ctx, double deadline);
#endif
