/* mpi backend: Open MPI's non-blocking collectives behind the ct_pg API, for jobs started
 * by mpirun (possibly across machines). Requests are polled with MPI_Test until the group
 * deadline. f16/bf16 travel as f32 (MPI has no half types); AVG is SUM then a division.
 * Fingerprints are one extra 24-byte MPI_Iallgather per operation.
 * Every MPI call goes through mpi_mu: each group has its own comm thread, so two groups
 * with queued work would otherwise call MPI at the same time, which MPI_THREAD_SERIALIZED
 * (what we ask for, and what Open MPI's default build is fast at) does not allow. */
#if CT_HAVE_MPI
#include "distributed/dist_internal.h"
#include "distributed/pg_common.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t mpi_mu = PTHREAD_MUTEX_INITIALIZER;
#define LOCKED(call) (pthread_mutex_lock(&mpi_mu), mpi_rc_ = (call), pthread_mutex_unlock(&mpi_mu), mpi_rc_)

typedef struct {
    MPI_Comm comm;
    int rank, n, fingerprint, owns_init;
    const int *granks;
    void *tmp, *tmp2;
    size_t cap, cap2;
} mpi_pg;

static MPI_Datatype mtype(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return MPI_DOUBLE;
    case CT_I32: return MPI_INT32_T;
    case CT_I64: return MPI_INT64_T;
    default: return MPI_FLOAT; /* f32, and f16/bf16 after conversion */
    }
}
static MPI_Op mop(ct_reduce_op op) {
    switch (op) {
    case CT_RED_MIN: return MPI_MIN;
    case CT_RED_MAX: return MPI_MAX;
    case CT_RED_PROD: return MPI_PROD;
    default: return MPI_SUM;
    }
}

static ct_status merr(int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return ct_error(CT_ERR_PEER, "MPI %s failed: %s", what, s);
}

static ct_status wait_req(MPI_Request *r, double deadline, const ct_work *w, MPI_Status *status) {
    int flag = 0;
    double t0 = ct_time_now();
    for (unsigned i = 0;; i++) {
        int mpi_rc_;
        int rc = LOCKED(MPI_Test(r, &flag, status ? status : MPI_STATUS_IGNORE));
        if (rc != MPI_SUCCESS) return merr(rc, ct_op_name(w->kind));
        if (flag) return CT_OK;
        if ((i & 63) == 0) {
            double now = ct_time_now();
            if (now > deadline) {
                char d[CT_WORK_DESC];
                ct_work_describe(w, d, sizeof d);
                return ct_error(CT_ERR_TIMEOUT, "%s timed out after %.0f s (mpi backend: some rank never reached it)",
                                d, now - t0);
            }
            if (now - t0 > 200e-6) usleep(20); /* long operation: stop burning the core */
        }
    }
}

/* f32 staging for half types. */
static float *stage(void **p, size_t *cap, size_t n) {
    if (*cap < n * 4) {
        free(*p);
        *p = malloc(n ? n * 4 : 4);
        *cap = *p ? n * 4 : 0;
    }
    return *p;
}

/* The fingerprint exchange: a 24-byte MPI_Iallgather (ct_op_fp_check) */
static ct_status fp_allgather(void *ctx, const ct_work *w, const void *mine, void *all, size_t bytes, double deadline) {
    mpi_pg *m = ctx;
    MPI_Request r;
    int mpi_rc_;
    int rc = LOCKED(MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, m->comm, &r));
    return rc == MPI_SUCCESS ? wait_req(&r, deadline, w, NULL) : merr(rc, "fingerprint exchange");
}

static ct_status mpi_run_op(void *impl, ct_work *w, double deadline) {
    mpi_pg *m = impl;
    size_t esz = ct_dtype_size(w->dt);
    int half = w->dt == CT_F16 || w->dt == CT_BF16;
    size_t total = w->count * (w->kind == CT_OP_REDUCE_SCATTER || w->kind == CT_OP_ALLTOALL ? (size_t)m->n : 1);
    if (total * (half ? 4 : esz) > INT_MAX && w->kind != CT_OP_BARRIER)
        return ct_error(CT_ERR_UNSUPPORTED, "mpi backend: messages over 2 GiB are not supported");
    int cnt = (int)w->count;
    ct_status fst = ct_op_fp_check(w, m->fingerprint, m->n, m->rank, m->granks, fp_allgather, m, deadline);
    if (fst) return fst;
    MPI_Request r = MPI_REQUEST_NULL;
    MPI_Datatype t = mtype(w->dt);
    MPI_Op op = mop(w->rop);
    int rc = MPI_SUCCESS;
    void *buf = w->rbuf;
    float *f = NULL;
    pthread_mutex_lock(&mpi_mu); /* held for the start of the operation only (see the top) */
    switch (w->kind) {
    case CT_OP_ALLREDUCE: case CT_OP_REDUCE:
        if (half) {
            f = stage(&m->tmp, &m->cap, w->count);
            ct_convert(f, CT_F32, w->rbuf, w->dt, w->count);
            buf = f;
        }
        if (w->kind == CT_OP_ALLREDUCE) rc = MPI_Iallreduce(MPI_IN_PLACE, buf, cnt, t, op, m->comm, &r);
        else rc = MPI_Ireduce(m->rank == w->peer ? MPI_IN_PLACE : buf, buf, cnt, t, op, w->peer, m->comm, &r);
        break;
    case CT_OP_BROADCAST: rc = MPI_Ibcast(buf, (int)(w->count * esz), MPI_BYTE, w->peer, m->comm, &r); break;
    case CT_OP_ALLGATHER: {
        int bytes = (int)(w->count * esz);
        const void *s = (const uint8_t *)w->rbuf + (size_t)m->rank * w->count * esz == w->sbuf ? MPI_IN_PLACE : w->sbuf;
        rc = MPI_Iallgather(s, bytes, MPI_BYTE, w->rbuf, bytes, MPI_BYTE, m->comm, &r);
        break;
    }
    case CT_OP_REDUCE_SCATTER: {
        const void *s = w->sbuf;
        if (half) {
            f = stage(&m->tmp, &m->cap, total);
            ct_convert(f, CT_F32, w->sbuf, w->dt, total);
            s = f;
            buf = stage(&m->tmp2, &m->cap2, w->count);
        } else if ((const uint8_t *)w->rbuf >= (const uint8_t *)w->sbuf &&
                   (const uint8_t *)w->rbuf < (const uint8_t *)w->sbuf + total * esz) {
            void *c = stage(&m->tmp, &m->cap, total * esz / 4 + 1);
            memcpy(c, w->sbuf, total * esz);
            s = c;
        }
        rc = MPI_Ireduce_scatter_block(s, buf, cnt, t, op, m->comm, &r);
        break;
    }
    case CT_OP_ALLTOALL: {
        int bytes = (int)(w->count * esz);
        rc = MPI_Ialltoall(w->sbuf == w->rbuf ? MPI_IN_PLACE : w->sbuf, bytes, MPI_BYTE, w->rbuf, bytes, MPI_BYTE,
                           m->comm, &r);
        break;
    }
    case CT_OP_BARRIER: rc = MPI_Ibarrier(m->comm, &r); break;
    case CT_OP_SEND: rc = MPI_Isend(w->sbuf, (int)(w->count * esz), MPI_BYTE, w->peer, w->tag, m->comm, &r); break;
    case CT_OP_RECV: rc = MPI_Irecv(w->rbuf, (int)(w->count * esz), MPI_BYTE, w->peer, w->tag, m->comm, &r); break;
    default: pthread_mutex_unlock(&mpi_mu); return ct_error(CT_ERR_INVALID, "unknown op");
    }
    pthread_mutex_unlock(&mpi_mu);
    if (rc != MPI_SUCCESS) return merr(rc, ct_op_name(w->kind));
    MPI_Status status;
    ct_status st = wait_req(&r, deadline, w, &status);
    if (st) return st;
    if (w->kind == CT_OP_RECV) {
        int got = 0;
        MPI_Get_count(&status, MPI_BYTE, &got);
        if ((size_t)got != w->count * esz)
            return ct_error(CT_ERR_MISMATCH, "p2p mismatch: rank %d expected %zu bytes from rank %d, got %d",
                            m->granks[m->rank], w->count * esz, m->granks[w->peer], got);
    }
    int writes = w->kind == CT_OP_ALLREDUCE || w->kind == CT_OP_REDUCE_SCATTER ||
                 (w->kind == CT_OP_REDUCE && m->rank == w->peer);
    if (writes && w->rop == CT_RED_AVG) {
        if (half) ct_reduce_scale(CT_F32, buf, w->count, m->n);
        else ct_reduce_scale(w->dt, buf, w->count, m->n);
    }
    if (half && writes) ct_convert(w->rbuf, w->dt, buf, CT_F32, w->count);
    return CT_OK;
}

/* Set once an operation timed out or lost a peer: MPI_Finalize (and MPI_Comm_free) would
 * then wait forever for the ranks that are gone or stuck, so they are skipped and the
 * process exits unfinalised, which makes mpirun end the whole job. */
static _Atomic int job_failed;

static ct_status mpi_run(void *impl, ct_work *w, double deadline) {
    ct_status st = mpi_run_op(impl, w, deadline);
    if (st == CT_ERR_TIMEOUT || st == CT_ERR_PEER || st == CT_ERR_MISMATCH) job_failed = 1;
    return st;
}

static void mpi_destroy(void *impl) {
    mpi_pg *m = impl;
    if (!m) return;
    if (job_failed) {
        CT_LOG_INFO("mpi", "not finalising MPI after a failed operation (the launcher ends the job)");
        free(m->tmp);
        free(m->tmp2);
        free(m);
        return;
    }
    pthread_mutex_lock(&mpi_mu);
    /* a subgroup freed after the world that finalized MPI: its communicator is gone already */
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && m->comm != MPI_COMM_WORLD && m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    free(m->tmp);
    free(m->tmp2);
    if (m->owns_init && !fin) MPI_Finalize();
    pthread_mutex_unlock(&mpi_mu);
    free(m);
}

ct_status ct_mpi_create(ct_pg *pg, void **impl_out) {
    *impl_out = NULL;
    int inited = 0, provided = 0;
    mpi_pg *m = calloc(1, sizeof *m);
    if (!m) return ct_error(CT_ERR_NOMEM, "mpi group");
    pthread_mutex_lock(&mpi_mu);
    MPI_Initialized(&inited);
    /* comm threads and inline callers take turns through mpi_mu: SERIALIZED is enough */
    if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        pthread_mutex_unlock(&mpi_mu);
        free(m);
        return ct_error(CT_ERR_SYSTEM, "MPI_Init_thread failed");
    }
    if (inited) MPI_Query_thread(&provided);
    m->comm = MPI_COMM_WORLD;
    m->owns_init = !inited;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int wn = 0, rc = MPI_SUCCESS;
    MPI_Comm_size(MPI_COMM_WORLD, &wn);
    if (pg->size < wn && pg->world && pg->world != pg) {
        /* a group of some world ranks (pg->granks), e.g. hier's one leader per machine: only
         * its members call this, so the communicator is made with MPI_Comm_create_group */
        MPI_Group wg, g;
        MPI_Comm_group(MPI_COMM_WORLD, &wg);
        rc = MPI_Group_incl(wg, pg->size, pg->granks, &g);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(MPI_COMM_WORLD, g, 0x6374, &m->comm);
        if (rc == MPI_SUCCESS) MPI_Group_free(&g);
        MPI_Group_free(&wg);
        if (rc == MPI_SUCCESS) MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    }
    if (rc == MPI_SUCCESS) {
        MPI_Comm_rank(m->comm, &m->rank);
        MPI_Comm_size(m->comm, &m->n);
    }
    pthread_mutex_unlock(&mpi_mu);
    if (rc != MPI_SUCCESS) {
        free(m);
        return merr(rc, "Comm_create_group");
    }
    if (provided < MPI_THREAD_SERIALIZED) /* MPI_Init by the caller: works in practice with Open MPI */
        CT_LOG_WARN_("mpi", "MPI provides thread level %d, below MPI_THREAD_SERIALIZED; ctrain calls MPI from its "
                    "comm threads (one at a time): initialise MPI with MPI_Init_thread(..., MPI_THREAD_SERIALIZED)",
                    provided);
    if (m->n != pg->size || m->rank != pg->rank) {
        int r = m->rank, n = m->n;
        mpi_destroy(m);
        return ct_error(CT_ERR_MISMATCH, "MPI says rank %d of %d but the environment says rank %d of %d", r, n,
                        pg->rank, pg->size);
    }
    m->fingerprint = pg->fingerprint;
    m->granks = pg->granks;
    char host[256] = "";
    gethostname(host, sizeof host);
    CT_LOG_INFO("mpi", "rank %d of %d on %s (MPI initialised %s%s)", m->rank, m->n, host, inited ? "by the caller" : "here",
                m->comm == MPI_COMM_WORLD ? "" : ", a group of the world's ranks");
    *impl_out = m;
    return CT_OK;
}

static ct_status mpi_new_group(ct_pg *parent, ct_pg *child, const int *ranks, int n, int my_rank, void **impl_out) {
    (void)ranks;
    (void)n;
    mpi_pg *pm = parent->impl;
    MPI_Comm c = MPI_COMM_NULL;
    mpi_pg *m = my_rank >= 0 ? calloc(1, sizeof *m) : NULL;
    if (my_rank >= 0 && !m) return ct_error(CT_ERR_NOMEM, "mpi group"); /* before the split: no comm to leak */
    /* blocking, with mpi_mu held: MPI progresses other groups' requests inside it */
    pthread_mutex_lock(&mpi_mu);
    int rc = MPI_Comm_split(pm->comm, my_rank >= 0 ? 0 : MPI_UNDEFINED, my_rank, &c);
    if (rc == MPI_SUCCESS && m) {
        MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
        MPI_Comm_rank(c, &m->rank);
        MPI_Comm_size(c, &m->n);
    }
    pthread_mutex_unlock(&mpi_mu);
    if (rc != MPI_SUCCESS) { free(m); return merr(rc, "Comm_split"); }
    if (!m) return CT_OK;
    m->comm = c;
    m->fingerprint = child->fingerprint;
    m->granks = child->granks;
    *impl_out = m;
    return CT_OK;
}

const ct_backend ct_mpi_backend = {"mpi", mpi_run, mpi_new_group, mpi_destroy, NULL, NULL, NULL, NULL}; /* no shared allocations */
#else
typedef int ct_mpi_backend_not_built;
#endif
