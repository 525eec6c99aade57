/* What the backends share about an operation (pg_common.h): names and descriptions of work
 * items, random hex names, and the fingerprints of the backends that exchange them as
 * messages (mpi, gloo): each rank sends what it is about to run, and every rank compares
 * all of them before running it, so ranks that called different collectives fail with both
 * sides named instead of hanging. (The shm backend keeps its fingerprints in the shared
 * segment: shm.c.) */
#include "distributed/pg_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

const char *ct_op_name(int kind) {
    switch (kind) {
    case CT_OP_ALLREDUCE: return "all_reduce";
    case CT_OP_BROADCAST: return "broadcast";
    case CT_OP_REDUCE: return "reduce";
    case CT_OP_ALLGATHER: return "all_gather";
    case CT_OP_REDUCE_SCATTER: return "reduce_scatter";
    case CT_OP_ALLTOALL: return "all_to_all";
    case CT_OP_BARRIER: return "barrier";
    case CT_OP_SEND: return "send";
    case CT_OP_RECV: return "recv";
    default: return "?";
    }
}

void ct_work_describe(const ct_work *w, char *out, size_t n) {
    switch (w->kind) {
    case CT_OP_ALLREDUCE: case CT_OP_REDUCE_SCATTER:
        snprintf(out, n, "%s #%u (%s x %zu, %s)", ct_op_name(w->kind), w->seq, ct_dtype_name(w->dt), w->count,
                 ct_reduce_op_name(w->rop));
        break;
    case CT_OP_REDUCE:
        snprintf(out, n, "%s #%u (%s x %zu, %s, root %d)", ct_op_name(w->kind), w->seq, ct_dtype_name(w->dt),
                 w->count, ct_reduce_op_name(w->rop), w->peer);
        break;
    case CT_OP_BROADCAST:
        snprintf(out, n, "%s #%u (%s x %zu, root %d)", ct_op_name(w->kind), w->seq, ct_dtype_name(w->dt), w->count,
                 w->peer);
        break;
    case CT_OP_BARRIER: snprintf(out, n, "barrier #%u", w->seq); break;
    case CT_OP_SEND: case CT_OP_RECV:
        snprintf(out, n, "%s %s rank %d (%s x %zu, tag %d)", ct_op_name(w->kind), w->kind == CT_OP_SEND ? "to" : "from",
                 w->peer, ct_dtype_name(w->dt), w->count, w->tag);
        break;
    default:
        snprintf(out, n, "%s #%u (%s x %zu)", ct_op_name(w->kind), w->seq, ct_dtype_name(w->dt), w->count);
    }
}

void ct_random_hex(char *out, size_t nbytes) {
    uint8_t b[64];
    if (nbytes > sizeof b) nbytes = sizeof b;
    if (getrandom(b, nbytes, 0) != (ssize_t)nbytes) {
        /* no entropy source: fall back to time and pid, still unique per run */
        uint64_t x = (uint64_t)(ct_time_now() * 1e9) ^ ((uint64_t)getpid() << 32);
        for (size_t i = 0; i < nbytes; i++) { x = x * 6364136223846793005ull + 1442695040888963407ull; b[i] = (uint8_t)(x >> 56); }
    }
    for (size_t i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", b[i]);
    out[2 * nbytes] = 0;
}

/* ------------------------------------------------------------------ fingerprints */
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
        char a[CT_WORK_DESC], b[CT_WORK_DESC];
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

ct_status ct_op_fp_check(const ct_work *w, int on, int n, int rank, const int *granks, ct_fp_allgather_fn allgather,
                         void *ctx, double deadline) {
    if (!on || n < 2 || ct_op_is_p2p(w->kind)) return CT_OK;
    ct_op_fp mine = ct_op_fp_of(w);
    ct_op_fp *all = malloc(sizeof(ct_op_fp) * (size_t)n);
    if (!all) return ct_error(CT_ERR_NOMEM, "fingerprint exchange");
    ct_status st = allgather(ctx, w, &mine, all, sizeof mine, deadline);
    if (st == CT_OK) st = ct_op_fp_compare(w, all, n, rank, granks);
    free(all);
    return st;
}
