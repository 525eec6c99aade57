/* Private to src/distributed: work items, the backend vtable, process-group internals. */
#ifndef CT_DIST_INTERNAL_H
#define CT_DIST_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "ctrain/dist.h"
#include "ctrain/launch.h" /* ct_random_hex */

typedef enum {
    CT_OP_ALLREDUCE = 1, CT_OP_BROADCAST, CT_OP_REDUCE, CT_OP_ALLGATHER, CT_OP_REDUCE_SCATTER,
    CT_OP_ALLTOALL, CT_OP_BARRIER, CT_OP_SEND, CT_OP_RECV
} ct_opkind;

const char *ct_op_name(int kind);

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
    uint32_t seq; /* collective sequence number in the group */
    _Atomic uint32_t state; /* 0 pending, 1 done, 2 pending with a sleeping waiter */
    ct_status st;
    int heap;
    char msg[640];
};

/* One line describing an operation: "all_reduce #5 (f32 x 1000, sum)". */
void ct_work_describe(const ct_work *w, char *out, size_t n);

typedef struct ct_backend {
    const char *name;
    /* Runs w to completion or failure by deadline; the message goes to ct_error. */
    ct_status (*run)(void *impl, ct_work *w, double deadline);
    /* Called on every rank of parent; my_rank < 0 for non-members (impl_out stays NULL). */
    ct_status (*new_group)(ct_pg *parent, ct_pg *child, const int *ranks, int n, int my_rank, void **impl_out);
    void (*destroy)(void *impl);
    /* ct_pg_alloc_shared / ct_pg_free_shared; NULL = unsupported. Called with the queue drained. */
    ct_status (*alloc_shared)(ct_pg *pg, void *impl, size_t bytes, void **mine);
    void (*free_shared)(void *impl, void *mine);
    /* ct_pg_shared_peer: rank r's counterpart of p (inside this rank's region), or NULL */
    void *(*shared_peer)(void *impl, void *p, int rank);
    /* NULL, or called on the caller's thread when w is issued, before it is queued: what w
     * must be ordered after at that moment (nccl: the compute stream's work, by an event) */
    void (*issued)(void *impl, ct_work *w);
} ct_backend;

struct ct_pg {
    int rank, size, gid;
    int *granks; /* group rank -> world rank */
    const ct_backend *be;
    void *impl;
    ct_pg *world; /* self for the world group */
    ct_store *store;
    ct_store_server *server; /* hosted here (rank 0 without a launcher) */
    char prefix[64];         /* store key prefix for this run attempt */
    char runid[40];
    char token_file[600];    /* published by this rank (rank 0 without a token): removed at the end */
    double timeout;
    int fingerprint;
    int local_size;
    uint32_t seq;
    int ngroups;
    /* comm thread queue */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ct_work *head, *tail;
    int busy, stop, started;
    pthread_t th;
    ct_status broken;
    char broken_msg[640];
};

/* The store token of a job started from the environment (token_file.c). Rank 0 publishes a
 * new random token (32 hex characters) for `port` and gets the file's path; the others read
 * it (CT_ERR_NOT_FOUND, with no message set, while the file does not exist yet). */
ct_status ct_token_file_path(int port, char *path, size_t n);
ct_status ct_token_file_publish(int port, char *token, size_t n, char *path, size_t pn);
ct_status ct_token_file_read(int port, char *token, size_t n);

/* What a rank is about to run, exchanged before a collective by the backends that send it
 * as a message (fingerprint.c); fields a kind does not use are zero. */
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

/* Backends. */
extern const ct_backend ct_shm_backend;
ct_status ct_shm_create(ct_pg *pg, void **impl_out);
/* A shm group bootstrapped by the caller instead of the store: group rank 0 creates the
 * segment `name` (the caller then tells the others, lets them open it, and shm_unlink()s
 * it); the others open it. Uses pg's rank, size, granks, gid, timeout, fingerprint and
 * local_size. */
ct_status ct_shm_create_named(ct_pg *pg, const char *name, void **impl_out);
/* Fails every rank of the shm group at once with msg (a step outside shm failed here). */
void ct_shm_abort(void *impl, ct_status st, const char *msg);

/* A flat backend's constructor, the shape hier.c plugs in between machines: ct_mpi_create,
 * and a Gloo one the same way. It is given a group of some world ranks (the whole world
 * for the bootstrap group, one leader per machine after that) and may use its rank, size,
 * granks, store, prefix (unique per group), timeout and fingerprint. */
typedef ct_status (*ct_flat_create_fn)(ct_pg *pg, void **impl_out);
extern const ct_backend ct_hier_backend;
/* Sets pg->be and pg->impl: hierarchical (shm per machine + flat_be between machines), or
 * flat_be alone when the job is on one machine or has one rank per machine, unless force.
 * Collective over the whole world. */
ct_status ct_hier_init(ct_pg *pg, const ct_backend *flat_be, ct_flat_create_fn create, int force);
#if CT_HAVE_MPI
extern const ct_backend ct_mpi_backend;
ct_status ct_mpi_create(ct_pg *pg, void **impl_out);
#endif
#if CT_HAVE_CUDA
extern const ct_backend ct_nccl_backend;
/* device: local_rank modulo the visible GPUs */
ct_status ct_nccl_create(ct_pg *pg, int local_rank, void **impl_out);
#endif
#if CT_HAVE_GLOO
/* Uses only pg->rank, size, store, prefix (its keys go under prefix + "gloo/"), timeout and
 * fingerprint: a group that another backend builds (one leader per machine) can run on it. */
extern const ct_backend ct_gloo_backend;
ct_status ct_gloo_create(ct_pg *pg, void **impl_out);
#endif

/* Reduction kernels (reduce.c): o1[i] = a[i] op b[i] (and o2 too when not NULL), any
 * aliasing of outputs with inputs at the same index is allowed. `divisor` > 0 divides the
 * result (AVG's last pass). */
void ct_reduce2(ct_dtype dt, ct_reduce_op op, void *o1, void *o2, const void *a, const void *b, size_t n,
                int divisor);
/* o[i] /= divisor in place (AVG when there is only one source). */
void ct_reduce_scale(ct_dtype dt, void *o, size_t n, int divisor);
#endif
