/* Private to src/distributed: the backend vtable and the table of backends, process-group
 * internals, the store's and token file's helpers. Work items and what the backends share
 * about them are in pg_common.h. */
#ifndef CT_DIST_INTERNAL_H
#define CT_DIST_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "distributed/pg_common.h" /* ct_work, ct_op_name, ct_work_describe, fingerprints */

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

/* Before a store rendezvous (rdzv_check.c): every rank declares its world size, machines and
 * ranks per machine; a rank that disagrees with rank 0 fails, and so do the others, with one
 * line naming both nodes' values; a timeout names every rank that never came. */
ct_status ct_rdzv_check(ct_pg *pg, double timeout);
/* "1, 3-7, 9": sorted ranks, compactly, cut with "..." when out is too small. */
void ct_rank_ranges(const int *ranks, int n, char *out, size_t on);

/* The store token of a job started from the environment (token_file.c). Rank 0 publishes a
 * new random token (32 hex characters) for `port` and gets the file's path; the others read
 * it (CT_ERR_NOT_FOUND, with no message set, while the file does not exist yet). */
ct_status ct_token_file_path(int port, char *path, size_t n);
ct_status ct_token_file_publish(int port, char *token, size_t n, char *path, size_t pn);
ct_status ct_token_file_read(int port, char *token, size_t n);


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

/* The backend table (backends.c): every backend ctrain knows, built into this library or
 * not, and how ct_dist_init builds a world group on it. The only place that knows which
 * backends a build has (the CT_HAVE_* macros); pg.c chooses by table entry, not by name. */
typedef enum { CT_BE_SHM, CT_BE_MPI, CT_BE_GLOO, CT_BE_HIER, CT_BE_NCCL, CT_BE_COUNT } ct_backend_id;
/* gloo: hier on top (shm inside machines) where it splits the job (AUTO) or always (FORCE);
 * hier: split even a job on one machine or with one rank per machine (FORCE) or not (AUTO). */
typedef enum { CT_HIER_OFF, CT_HIER_AUTO, CT_HIER_FORCE } ct_hier_mode;
typedef struct {
    int local_rank; /* this rank on its machine (nccl: its GPU) */
    ct_hier_mode hier;
} ct_backend_args;
typedef struct {
    ct_dist_backend pub;  /* name, built, caps, about, missing: what ct_dist_backend_at gives */
    bool needs_store;     /* its ranks meet through the store (world size > 1) */
    const char *unbuilt;  /* ct_dist_init's error when it is not built */
    const ct_backend *vt; /* its groups' vtable (NULL when not built): ct_pg_caps */
    /* Sets pg->be and pg->impl for the world group (NULL when not built). */
    ct_status (*create)(ct_pg *pg, const ct_backend_args *a);
} ct_backend_desc;
extern const ct_backend_desc ct_backend_table[CT_BE_COUNT];
/* The entry called name, or NULL. */
const ct_backend_desc *ct_backend_find(const char *name);

/* Reduction kernels (reduce.c): o1[i] = a[i] op b[i] (and o2 too when not NULL), any
 * aliasing of outputs with inputs at the same index is allowed. `divisor` > 0 divides the
 * result (AVG's last pass). */
void ct_reduce2(ct_dtype dt, ct_reduce_op op, void *o1, void *o2, const void *a, const void *b, size_t n,
                int divisor);
/* o[i] /= divisor in place (AVG when there is only one source). */
void ct_reduce_scale(ct_dtype dt, void *o, size_t n, int divisor);
/* A barrier's tag: only the ranks sharing memory (ct_barrier_shared_sync); backends that have
 * no such subset ignore it and wait for the whole group */
#define CT_BARRIER_SHARED_TAG 1
#endif
