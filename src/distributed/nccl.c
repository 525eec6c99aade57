/* nccl backend (CTRAIN_BACKEND=nccl; built only with CUDA): NCCL collectives on device
 * buffers behind the ct_pg API. One communicator per process group, created from a
 * unique id that the group's rank 0 publishes in the store; each rank drives the GPU
 * LOCAL_RANK % (visible GPUs). Communicators are non-blocking (config.blocking = 0): every
 * call returns at once and the comm thread polls ncclCommGetAsyncError and the stream until
 * the operation is done, an error is reported, or the group's deadline passes — then the
 * communicator is aborted (ncclCommAbort), so a dead or stuck peer fails this rank within
 * CTRAIN_TIMEOUT with the operation and the ranks named, and later operations fail at once.
 * Collectives run on the backend's own communication stream, a blocking stream: it waits
 * for work queued earlier on the legacy default stream, and, through an event recorded
 * before each collective, for the device's compute stream (src/cuda: where the op table's
 * kernels and so backward's gradients are computed). The event is recorded, and the
 * communication stream made to wait for it, on the caller's thread when the collective is
 * issued (the backend's `issued` hook), so DDP's bucket all-reduces, launched from the
 * grad-ready hooks while backward is still queuing kernels, wait for the kernels queued so
 * far (the bucket's gradients) and overlap the rest of backward. A wait is captured when it
 * is enqueued, so one event serves every collective.
 * Host buffers of in-place all-reduce, broadcast and reduce (metadata: DDP's parameter check,
 * timings) are staged through device memory; other collectives need device buffers.
 * AVG is ncclAvg. Fingerprints (CTRAIN_FINGERPRINT) are not checked on this backend, and
 * send/recv ignore tags (NCCL has none: matching is by order). The comm thread runs one
 * operation at a time, to its end: a send completes once NCCL has buffered it (up to
 * NCCL_BUFFSIZE, 4 MiB by default), so ranks that each send a larger message before
 * receiving wait for each other until the timeout; all_to_all groups its sends and receives.
 * tests/gpu/test_gpu_dist.c runs this file between ranks, on GPUs or on the emulated device's
 * NCCL (tests/tools/cuda_emu/emu_nccl.cc). */
#include "distributed/dist_internal.h"
#include "distributed/pg_common.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/check.h"
#include "cuda/cuda.h"

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t after_compute; /* recorded on the compute stream, waited for by `stream` */
    ct_status issue_st;        /* a failure of that at issue, reported by the run */
    char issue_msg[512];
    int dev, rank, n, aborted;
    int *one; /* device int for barriers */
    const int *granks;
} nccl_pg;

static ncclDataType_t ntype(ct_dtype dt) {
    switch (dt) {
    case CT_F16: return ncclFloat16;
    case CT_BF16: return ncclBfloat16;
    case CT_F64: return ncclFloat64;
    case CT_I32: return ncclInt32;
    case CT_I64: return ncclInt64;
    default: return ncclFloat32;
    }
}
static ncclRedOp_t nop(ct_reduce_op op) {
    switch (op) {
    case CT_RED_AVG: return ncclAvg;
    case CT_RED_MIN: return ncclMin;
    case CT_RED_MAX: return ncclMax;
    case CT_RED_PROD: return ncclProd;
    default: return ncclSum;
    }
}

/* Waits until the communicator's pending calls are enqueued (flush) or, with the stream,
 * also finished on the GPU. On error or at the deadline the communicator is aborted. */
static ct_status poll_done(nccl_pg *m, bool stream, double deadline, const char *what) {
    double t0 = ct_time_now();
    for (unsigned i = 0;; i++) {
        ncclResult_t ae = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(m->comm, &ae);
        if (r != ncclSuccess) ae = r;
        if (ae != ncclSuccess && ae != ncclInProgress) {
            const char *last = ncclGetLastError(m->comm);
            (void)ncclCommAbort(m->comm);
            m->aborted = 1;
            return ct_error(ae == ncclRemoteError ? CT_ERR_PEER : CT_ERR_SYSTEM,
                            "nccl %s failed on rank %d (cuda:%d): %s%s%s; communicator aborted", what, m->granks[m->rank],
                            m->dev, ncclGetErrorString(ae), last && *last ? ": " : "", last ? last : "");
        }
        if (ae == ncclSuccess) {
            if (!stream) return CT_OK;
            cudaError_t q = cudaStreamQuery(m->stream);
            if (q == cudaSuccess) return CT_OK;
            if (q != cudaErrorNotReady) {
                (void)ncclCommAbort(m->comm);
                m->aborted = 1;
                char op[256];
                snprintf(op, sizeof op, "nccl %s on rank %d", what, m->granks[m->rank]);
                return CT_GPU_CHECK(cuda, op, q);
            }
        }
        double now = ct_time_now();
        if (now > deadline) {
            (void)ncclCommAbort(m->comm);
            m->aborted = 1;
            return ct_error(CT_ERR_TIMEOUT,
                            "nccl %s timed out after %.0f s on rank %d (cuda:%d): some rank of the %d never reached it; "
                            "communicator aborted", what, now - t0, m->granks[m->rank], m->dev, m->n);
        }
        if (now - t0 > 200e-6) usleep(i < 1000 ? 10 : 100);
    }
}

static ct_status nccl_run(void *impl, ct_work *w, double deadline);

/* At issue, on the caller's thread: the communication stream waits for what the compute
 * stream has queued now (see the top of the file) */
static void nccl_issued(void *impl, ct_work *w) {
    (void)w;
    nccl_pg *m = impl;
    if (!m || m->aborted) return;
    cudaStream_t cs;
    ct_status st = ct_cuda_set_device(m->dev, "nccl issue");
    if (st == CT_OK) st = ct_cuda_stream(m->dev, CT_CUDA_COMPUTE, &cs);
    if (st == CT_OK) st = CT_GPU_CHECK(cuda, "nccl issue", cudaEventRecord(m->after_compute, cs));
    if (st == CT_OK) st = CT_GPU_CHECK(cuda, "nccl issue", cudaStreamWaitEvent(m->stream, m->after_compute, 0));
    if (st != CT_OK && m->issue_st == CT_OK) {
        m->issue_st = st;
        snprintf(m->issue_msg, sizeof m->issue_msg, "%s", ct_last_error());
    }
}

/* An in-place collective on host memory: copied to a device buffer, run there, copied back
 * (synchronous copies on the legacy stream, which the backend's stream waits for). */
static ct_status staged(nccl_pg *m, ct_work *w, double deadline, const char *op) {
    size_t bytes = w->count * ct_dtype_size(w->dt);
    const void *sb = w->sbuf;
    void *d = NULL, *rb = w->rbuf;
    ct_status st = ct_cuda_alloc(m->dev, bytes, &d);
    if (st != CT_OK) return st;
    st = CT_GPU_CHECK(cuda, op, cudaMemcpy(d, sb ? sb : rb, bytes, cudaMemcpyHostToDevice));
    if (st == CT_OK) {
        w->sbuf = sb ? d : NULL;
        w->rbuf = d;
        st = nccl_run(m, w, deadline);
        w->sbuf = sb;
        w->rbuf = rb;
    }
    if (st == CT_OK) st = CT_GPU_CHECK(cuda, op, cudaMemcpy(rb, d, bytes, cudaMemcpyDeviceToHost));
    ct_cuda_free(d);
    return st;
}

static ct_status nccl_run(void *impl, ct_work *w, double deadline) {
    nccl_pg *m = impl;
    char what[CT_WORK_DESC];
    ct_work_describe(w, what, sizeof what);
    if (m->aborted)
        return ct_error(CT_ERR_PEER, "nccl %s on rank %d: the communicator was aborted by an earlier failure", what,
                        m->granks[m->rank]);
    char op[256];
    snprintf(op, sizeof op, "nccl %s on rank %d", what, m->granks[m->rank]);
    CT_GPU_TRY(cuda, op, cudaSetDevice(m->dev));
    /* host memory would make NCCL fail late and obscurely: the in-place collectives that
     * callers use for host-side metadata (DDP's parameter check, a benchmark's timings) are
     * staged through device memory; anything else names the mistake */
    const void *bufs[2] = {w->sbuf, w->rbuf};
    for (int i = 0; i < 2 && w->kind != CT_OP_BARRIER && w->count; i++) {
        struct cudaPointerAttributes pa;
        if (!bufs[i]) continue;
        if (cudaPointerGetAttributes(&pa, bufs[i]) != cudaSuccess) (void)cudaGetLastError();
        else if (pa.type == cudaMemoryTypeDevice || pa.type == cudaMemoryTypeManaged) continue;
        if (w->kind == CT_OP_ALLREDUCE || w->kind == CT_OP_BROADCAST || w->kind == CT_OP_REDUCE)
            return staged(m, w, deadline, op);
        return ct_error(CT_ERR_INVALID, "%s: buffer %p is not device memory (the nccl backend reduces GPU buffers)", op,
                        bufs[i]);
    }
    if (m->issue_st != CT_OK) { /* ordering after the compute stream failed when issued */
        ct_status st = m->issue_st;
        m->issue_st = CT_OK;
        return ct_error(st, "%s: %s", op, m->issue_msg);
    }
    size_t esz = ct_dtype_size(w->dt);
    ncclDataType_t t = ntype(w->dt);
    ncclResult_t r = ncclSuccess;
    switch (w->kind) {
    case CT_OP_ALLREDUCE: r = ncclAllReduce(w->sbuf, w->rbuf, w->count, t, nop(w->rop), m->comm, m->stream); break;
    case CT_OP_BROADCAST: r = ncclBroadcast(w->rbuf, w->rbuf, w->count, t, w->peer, m->comm, m->stream); break;
    case CT_OP_REDUCE: r = ncclReduce(w->rbuf, w->rbuf, w->count, t, nop(w->rop), w->peer, m->comm, m->stream); break;
    case CT_OP_ALLGATHER: r = ncclAllGather(w->sbuf, w->rbuf, w->count, t, m->comm, m->stream); break;
    case CT_OP_REDUCE_SCATTER:
        r = ncclReduceScatter(w->sbuf, w->rbuf, w->count, t, nop(w->rop), m->comm, m->stream);
        break;
    case CT_OP_ALLTOALL:
        if (w->sbuf == w->rbuf)
            return ct_error(CT_ERR_UNSUPPORTED, "nccl %s: in-place all_to_all is not supported (give a separate receive buffer)",
                            what);
        r = ncclGroupStart();
        for (int p = 0; p < m->n && (r == ncclSuccess || r == ncclInProgress); p++) {
            r = ncclSend((const char *)w->sbuf + (size_t)p * w->count * esz, w->count, t, p, m->comm, m->stream);
            if (r == ncclSuccess || r == ncclInProgress)
                r = ncclRecv((char *)w->rbuf + (size_t)p * w->count * esz, w->count, t, p, m->comm, m->stream);
        }
        {
            ncclResult_t e = ncclGroupEnd();
            if (r == ncclSuccess || r == ncclInProgress) r = e;
        }
        break;
    case CT_OP_BARRIER: r = ncclAllReduce(m->one, m->one, 1, ncclInt32, ncclSum, m->comm, m->stream); break;
    case CT_OP_SEND: r = ncclSend(w->sbuf, w->count, t, w->peer, m->comm, m->stream); break;
    case CT_OP_RECV: r = ncclRecv(w->rbuf, w->count, t, w->peer, m->comm, m->stream); break;
    default: return ct_error(CT_ERR_INVALID, "nccl: unknown op %d", w->kind);
    }
    ct_status st = CT_GPU_CHECK(nccl, op, r);
    if (st != CT_OK) {
        (void)ncclCommAbort(m->comm);
        m->aborted = 1;
        return st;
    }
    return poll_done(m, true, deadline, what);
}

static void nccl_destroy(void *impl) {
    nccl_pg *m = impl;
    if (!m) return;
    (void)cudaSetDevice(m->dev);
    if (m->comm && !m->aborted) { /* an aborted communicator is released already */
        ncclResult_t r = ncclCommFinalize(m->comm);
        if (r != ncclSuccess && r != ncclInProgress) (void)ncclCommAbort(m->comm);
        else if (poll_done(m, false, ct_time_now() + 10, "finalize") == CT_OK) (void)ncclCommDestroy(m->comm);
    }
    if (m->one) (void)cudaFree(m->one);
    if (m->stream) (void)cudaStreamDestroy(m->stream);
    if (m->after_compute) (void)cudaEventDestroy(m->after_compute);
    free(m);
}

/* A communicator for group `pg` (rank me of n): the id through the world's store under
 * the group's id, then a non-blocking init polled until the deadline. */
static ct_status make_comm(ct_pg *pg, int me, int n, int dev, nccl_pg **out) {
    *out = NULL;
    nccl_pg *m = calloc(1, sizeof *m);
    if (!m) return ct_error(CT_ERR_NOMEM, "nccl group");
    m->dev = dev;
    m->rank = me;
    m->n = n;
    m->granks = pg->granks;
    char op[96];
    snprintf(op, sizeof op, "nccl setup of group %d on rank %d", pg->gid, pg->world->rank);
    ct_status st = CT_GPU_CHECK(cuda, op, cudaSetDevice(dev));
    if (st == CT_OK) st = CT_GPU_CHECK(cuda, op, cudaStreamCreate(&m->stream));
    if (st == CT_OK) st = CT_GPU_CHECK(cuda, op, cudaEventCreateWithFlags(&m->after_compute, cudaEventDisableTiming));
    if (st == CT_OK) st = CT_GPU_CHECK(cuda, op, cudaMalloc((void **)&m->one, sizeof(int)));
    if (st == CT_OK) st = CT_GPU_CHECK(cuda, op, cudaMemset(m->one, 0, sizeof(int)));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (st == CT_OK && me == 0) st = CT_GPU_CHECK(nccl, op, ncclGetUniqueId(&id));
    if (st == CT_OK && n > 1) {
        ct_store *store = pg->world->store;
        char key[160];
        snprintf(key, sizeof key, "%snccl/%s/group%d/id", pg->prefix, pg->runid, pg->gid);
        if (!store) st = ct_error(CT_ERR_INVALID, "%s: no store to share the NCCL id through", op);
        else if (me == 0) st = ct_store_set(store, key, &id, sizeof id);
        else {
            void *val = NULL;
            size_t len = 0;
            st = ct_store_get(store, key, pg->timeout, &val, &len);
            if (st == CT_OK && len != sizeof id) st = ct_error(CT_ERR_FORMAT, "%s: NCCL id of %zu bytes in the store", op, len);
            if (st == CT_OK) memcpy(&id, val, sizeof id);
            free(val);
        }
    }
    if (st == CT_OK) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        st = CT_GPU_CHECK(nccl, op, ncclCommInitRankConfig(&m->comm, n, id, me, &cfg));
        if (st == CT_OK) st = poll_done(m, false, ct_time_now() + pg->timeout, "communicator init");
        if (st != CT_OK) m->aborted = 1; /* poll_done aborted it, or init never produced one */
    }
    if (st != CT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ct_last_error());
        nccl_destroy(m);
        return ct_error(st, "%s", msg);
    }
    *out = m;
    return CT_OK;
}

ct_status ct_nccl_create(ct_pg *pg, int local_rank, void **impl_out) {
    *impl_out = NULL;
    int ndev = 0;
    ct_status st = CT_GPU_CHECK(cuda, "nccl backend", cudaGetDeviceCount(&ndev));
    if (st != CT_OK) return ct_error(st, "the nccl backend needs a GPU: %s", ct_last_error());
    if (ndev < 1) return ct_error(CT_ERR_UNSUPPORTED, "the nccl backend needs a GPU: none is visible");
    int dev = (local_rank < 0 ? 0 : local_rank) % ndev;
    nccl_pg *m;
    st = make_comm(pg, pg->rank, pg->size, dev, &m);
    if (st != CT_OK) return st;
    CT_LOG_INFO("nccl", "rank %d of %d on cuda:%d", pg->rank, pg->size, dev);
    *impl_out = m;
    return CT_OK;
}

static ct_status nccl_new_group(ct_pg *parent, ct_pg *child, const int *ranks, int n, int my_rank, void **impl_out) {
    (void)ranks;
    if (my_rank < 0) return CT_OK; /* not a member: nothing to create */
    nccl_pg *pm = parent->impl, *m;
    ct_status st = make_comm(child, my_rank, n, pm->dev, &m);
    if (st == CT_OK) *impl_out = m;
    return st;
}

const ct_backend ct_nccl_backend = {"nccl", nccl_run, nccl_new_group, nccl_destroy, NULL, NULL, NULL, nccl_issued};
