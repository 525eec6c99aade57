/* ctrain/dist.h — distributed runtime: TCP store, process groups, collectives, spawn.
 *
 *   ct_pg *pg;
 *   if (ct_dist_init(NULL, &pg) != CT_OK) {          // RANK/WORLD_SIZE/... from `ctrain run`
 *       fprintf(stderr, "init: %s\n", ct_last_error());
 *       return 1;
 *   }
 *   ct_work *w = ct_all_reduce(pg, grad, n, CT_F32, CT_RED_AVG);   // queued, returns at once
 *   ...compute...
 *   if (ct_work_wait(w) != CT_OK) fprintf(stderr, "%s\n", ct_last_error());
 *   ct_work_free(w);
 *   ct_barrier_sync(pg);
 *   ct_pg_free(pg);
 *
 * Collectives operate on raw buffers and must be issued in the same order on every rank of
 * the group, from one thread. Each group has a comm thread that runs queued operations in
 * order, so ct_work_wait() is the only call that blocks; the *_sync wrappers run the
 * operation on the calling thread when nothing is queued (lowest latency).
 * Every operation carries a fingerprint (sequence, op, dtype, count, reduce op, root); ranks
 * that disagree all fail with a message naming both sides. Every wait has a timeout
 * (CTRAIN_TIMEOUT seconds, default 300). After a failure the group is unusable.
 */
#ifndef CTRAIN_DIST_H
#define CTRAIN_DIST_H

#include "ctrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ store */
/* A TCP key-value store for rendezvous. The server runs on a thread of the process that
 * starts it (the launcher, ct_spawn's parent, or rank 0). Every client must prove that it
 * knows the server's token before anything else, by challenge-response: the token itself
 * never crosses the network (HMAC-SHA256 of a fresh nonce per connection; an empty token is
 * a known key, so no protection). Traffic after that is not encrypted. Values are at most
 * CT_STORE_MAX_VALUE bytes. A connection that has not authenticated is closed after 1 s, and
 * at most 32 per peer address (256 in all) are kept, the oldest evicted first; an evicted
 * client's ct_store_connect reconnects. ADD past the int64 range is CT_ERR_INVALID. */
#define CT_STORE_MAX_KEY 1024
#define CT_STORE_MAX_VALUE (16u << 20)

typedef struct ct_store_server ct_store_server;
typedef struct ct_store ct_store;

/* bind_addr NULL = 127.0.0.1; port 0 = pick a free one (see ct_store_server_port).
 * Same as ct_store_server_listen followed by ct_store_server_run. */
ct_status ct_store_server_start(const char *bind_addr, int port, const char *token, ct_store_server **out);
/* Binds and listens but starts no thread: clients can connect (the kernel queues them) and
 * their requests wait until ct_store_server_run. For a process that fork()s workers after
 * creating the store: forking with no other thread alive is the only safe way (a child
 * gets one thread, and locks another held at fork time, malloc's too, stay held). */
ct_status ct_store_server_listen(const char *bind_addr, int port, const char *token, ct_store_server **out);
/* Starts serving on a thread of the calling process (no-op when already serving). */
ct_status ct_store_server_run(ct_store_server *s);
/* Stops the thread, keeping the keys and connections (requests queue again) until the
 * next ct_store_server_run: lets the owner fork again single-threaded. */
void ct_store_server_pause(ct_store_server *s);
int ct_store_server_port(const ct_store_server *s);
/* Stops serving (if it was) and frees everything. */
void ct_store_server_stop(ct_store_server *s);

/* Connects, retrying until timeout_s (the server may not be up yet). */
ct_status ct_store_connect(const char *addr, int port, const char *token, double timeout_s, ct_store **out);
/* Connects to PyTorch's c10d TCPStore (torchrun's agent store, torch.distributed.TCPStore)
 * instead of a ctrain store: no token; the ct_store_* calls below work on it unchanged.
 * Speaks the layouts of PyTorch 1.13 and 2.x with the validation handshake (2.15 tested),
 * found on connect. ct_store_protocol: "ctrain", "c10d-v1" or "c10d-v2". */
ct_status ct_store_connect_c10d(const char *addr, int port, double timeout_s, ct_store **out);
const char *ct_store_protocol(const ct_store *c);
/* How long a call waits for the store's reply: the connect's timeout_s (at least 5 s) until
 * changed here; a GET waits its own timeout plus a second. A store that stays silent that
 * long (its host stopped or cut off) fails the call with CT_ERR_TIMEOUT and closes the
 * connection: the calls after it fail at once. */
void ct_store_set_timeout(ct_store *c, double timeout_s);
void ct_store_free(ct_store *c);
ct_status ct_store_set(ct_store *c, const char *key, const void *val, size_t len);
/* Waits until key exists (up to timeout_s), then returns a malloc'd copy (free() it). */
ct_status ct_store_get(ct_store *c, const char *key, double timeout_s, void **val, size_t *len);
/* Waits until every key exists. */
ct_status ct_store_wait(ct_store *c, const char *const *keys, int nkeys, double timeout_s);
/* Atomically adds delta to the decimal integer stored at key (missing = 0); returns the new value. */
ct_status ct_store_add(ct_store *c, const char *key, int64_t delta, int64_t *out);
/* If key's value equals expected (or key is missing and expected is NULL), sets desired.
 * The value after the operation is returned in *cur (malloc'd, may be NULL if cur is NULL). */
ct_status ct_store_compare_set(ct_store *c, const char *key, const void *expected, size_t elen, const void *desired,
                               size_t dlen, void **cur, size_t *curlen);
ct_status ct_store_delete(ct_store *c, const char *key, bool *existed);
ct_status ct_store_num_keys(ct_store *c, int64_t *out);
/* Non-blocking existence check. */
ct_status ct_store_check(ct_store *c, const char *key, bool *exists);

/* ------------------------------------------------------------------ process groups */
typedef struct ct_pg ct_pg;
typedef struct ct_work ct_work;

typedef enum { CT_RED_SUM = 0, CT_RED_AVG, CT_RED_MIN, CT_RED_MAX, CT_RED_PROD, CT_RED_COUNT_ } ct_reduce_op;
const char *ct_reduce_op_name(ct_reduce_op op);
ct_status ct_reduce_op_parse(const char *s, ct_reduce_op *out);

typedef struct ct_dist_opts {
    int rank, world_size;             /* -1 = from the environment */
    int local_rank, local_world_size; /* -1 = from the environment (default: = rank / world) */
    const char *master_addr;          /* NULL = MASTER_ADDR or 127.0.0.1 */
    int master_port;                  /* 0 = MASTER_PORT or 29500 */
    const char *backend;              /* "shm", "mpi", "gloo", "hier", "nccl" (ct_dist_backend_at lists them) or
                                         NULL = CTRAIN_BACKEND or automatic */
    const char *token;                /* store token; NULL = CTRAIN_STORE_TOKEN, else rank 0 makes one up and
                                         shares it through a 0600 file (see XDG_RUNTIME_DIR) */
    double timeout_s;                 /* 0 = CTRAIN_TIMEOUT or 300 */
    int fingerprint;                  /* -1 = CTRAIN_FINGERPRINT or on; 0 off; 1 on */
} ct_dist_opts;

ct_dist_opts ct_dist_default_opts(void);

/* Who started this process, as every entry point sees it: rank and size from one launcher's
 * pair of variables (RANK/WORLD_SIZE, else OMPI_COMM_WORLD_*, else PMI_RANK/PMI_SIZE, else
 * SLURM_PROCID/SLURM_NTASKS), and its local rank and size (default: the whole world).
 * Distributed means world_size > 1. A world of one while a multi-process launcher's
 * variables say otherwise (mpirun -np 2 with WORLD_SIZE=1) is CT_ERR_INVALID. */
typedef struct ct_dist_world {
    int rank, world_size, local_rank, local_world_size;
    const char *launcher;              /* "none", "env", "mpirun", "pmi" or "slurm" */
    const char *rank_var, *world_var;  /* the variables read ("OMPI_COMM_WORLD_RANK"...), NULL for none */
} ct_dist_world;
ct_status ct_dist_detect(ct_dist_world *out);
/* Creates the world group. Rank and size come from opts, else ct_dist_detect.
 * The store is the launcher's (CTRAIN_STORE_HOSTED=1), torchrun's PyTorch c10d TCPStore
 * (TORCHELASTIC_USE_AGENT_STORE=True, see docs/multinode.md) or is hosted by rank 0 on MASTER_ADDR. */
ct_status ct_dist_init(const ct_dist_opts *opts, ct_pg **out);
/* Collective over every rank of parent (all must call, in the same order). Members get a
 * new group whose ranks are numbered in the order of `ranks`; non-members get *out = NULL. */
ct_status ct_dist_new_group(ct_pg *parent, const int *ranks, int nranks, ct_pg **out);
int ct_pg_rank(const ct_pg *pg);
int ct_pg_size(const ct_pg *pg);
const char *ct_pg_backend(const ct_pg *pg);
/* Global rank (in the world group) of group rank r. */
int ct_pg_global_rank(const ct_pg *pg, int r);
/* What a group's backend can do (ct_pg_caps), or a backend of the table (ct_dist_backend):
 * code that depends on it asks this instead of comparing ct_pg_backend() with a name. */
#define CT_PG_CAP_SHARED_MEMORY (1u << 0)  /* ct_pg_alloc_shared works: DDP's zero-copy gradients (shm; hier:
                                              among the ranks of each machine, not under mpirun) */
#define CT_PG_CAP_DEVICE_BUFFERS (1u << 1) /* collectives take GPU memory (nccl); host memory only for in-place
                                              all-reduce, broadcast and reduce (staged through the GPU) */
#define CT_PG_CAP_MULTI_MACHINE (1u << 2)  /* its ranks may be on several machines */
/* CT_PG_CAP_* of pg's backend; 0 for NULL. A subgroup of a hier group runs on the flat backend
 * between machines (mpi or gloo) and has its capabilities. */
unsigned ct_pg_caps(const ct_pg *pg);
/* The backends ctrain knows, built into this library or not. */
typedef struct ct_dist_backend {
    const char *name;    /* what ct_dist_opts.backend and CTRAIN_BACKEND take */
    bool built;          /* in this build; ct_dist_init fails on one that is not */
    unsigned caps;       /* CT_PG_CAP_* of its groups */
    const char *about;   /* a few words on what it is for */
    const char *missing; /* when not built: what would build it */
} ct_dist_backend;
/* Backend i from 0, in the order `ctrain env` lists them; NULL past the last. */
const ct_dist_backend *ct_dist_backend_at(int i);
/* The backend called name (built or not), or NULL when ctrain has none of that name. */
const ct_dist_backend *ct_dist_backend_find(const char *name);
/* Store shared by the job (NULL under mpirun, where the mpi or hier backend bootstraps
 * through MPI, or in a 1-rank world). */
ct_store *ct_pg_store(ct_pg *pg);
/* Drains the queue and frees. Freeing the world group also frees its subgroups' store. */
void ct_pg_free(ct_pg *pg);

/* ---- memory shared by the ranks of a group (shm backend; on hier, by the ranks of each machine,
 * ct_pg_shared_peer giving NULL for a rank on another; CT_ERR_UNSUPPORTED elsewhere) ----
 * Collective: every rank calls it with the same `bytes`. Maps one segment holding a region
 * of `bytes` (rounded up to 4 KiB, zeroed) per rank; *mine is this rank's. An all_reduce
 * whose buffer lies inside `mine` (the same offset on every rank) is done in place across
 * the regions, with no staging copies: each rank reduces its slice reading every rank's
 * region in rank order and writes the result into all of them. Until such an all-reduce
 * completes, peers may read or write the whole buffer. Free with ct_pg_free_shared (local,
 * after every work on it completed) before freeing the group. */
ct_status ct_pg_alloc_shared(ct_pg *pg, size_t bytes, void **mine);
void ct_pg_free_shared(ct_pg *pg, void *mine);
/* Rank `rank`'s counterpart of p, an address inside this rank's region of a shared
 * allocation (same offset in that rank's region), or NULL when p is in none or rank is out
 * of range. Local; reading or writing it needs synchronisation with that rank (a barrier). */
void *ct_pg_shared_peer(ct_pg *pg, void *p, int rank);
/* A barrier among the ranks that share memory with this one: the whole group on shm, this
 * machine's ranks on hier (the whole group on other backends). Collective: every rank of the
 * group calls it, in the same order as the group's other collectives. */
ct_status ct_barrier_shared_sync(ct_pg *pg);

/* ---- asynchronous collectives: return a work handle that is never NULL ----
 * Buffers must stay valid until the work completes. count is in elements. */
ct_work *ct_all_reduce(ct_pg *pg, void *buf, size_t count, ct_dtype dt, ct_reduce_op op);
ct_work *ct_broadcast(ct_pg *pg, void *buf, size_t count, ct_dtype dt, int root);
/* Result on root only; other ranks' buffers are left unchanged. */
ct_work *ct_reduce(ct_pg *pg, void *buf, size_t count, ct_dtype dt, ct_reduce_op op, int root);
/* recv holds size*count elements, rank r's send at recv + r*count. */
ct_work *ct_all_gather(ct_pg *pg, const void *send, void *recv, size_t count, ct_dtype dt);
/* send holds size*count elements; recv gets the reduction of block `rank` (count elements). */
ct_work *ct_reduce_scatter(ct_pg *pg, const void *send, void *recv, size_t count, ct_dtype dt, ct_reduce_op op);
/* send and recv hold size*count elements; block j of send goes to rank j. */
ct_work *ct_all_to_all(ct_pg *pg, const void *send, void *recv, size_t count, ct_dtype dt);
ct_work *ct_barrier(ct_pg *pg);
/* Point to point: matched in order per (sender, receiver) pair; tag, count and dtype
 * must agree. A send returns once its data is buffered in shared memory (shm) or sent. */
ct_work *ct_send(ct_pg *pg, const void *buf, size_t count, ct_dtype dt, int dst, int tag);
ct_work *ct_recv(ct_pg *pg, void *buf, size_t count, ct_dtype dt, int src, int tag);

/* Blocks until done (the comm thread enforces the group timeout). Repeatable. */
ct_status ct_work_wait(ct_work *w);
bool ct_work_test(ct_work *w);
/* Waits first if the work is still running. */
void ct_work_free(ct_work *w);

/* ---- blocking wrappers ---- */
ct_status ct_all_reduce_sync(ct_pg *pg, void *buf, size_t count, ct_dtype dt, ct_reduce_op op);
ct_status ct_broadcast_sync(ct_pg *pg, void *buf, size_t count, ct_dtype dt, int root);
ct_status ct_reduce_sync(ct_pg *pg, void *buf, size_t count, ct_dtype dt, ct_reduce_op op, int root);
ct_status ct_all_gather_sync(ct_pg *pg, const void *send, void *recv, size_t count, ct_dtype dt);
ct_status ct_reduce_scatter_sync(ct_pg *pg, const void *send, void *recv, size_t count, ct_dtype dt,
                                 ct_reduce_op op);
ct_status ct_all_to_all_sync(ct_pg *pg, const void *send, void *recv, size_t count, ct_dtype dt);
ct_status ct_barrier_sync(ct_pg *pg);
ct_status ct_send_sync(ct_pg *pg, const void *buf, size_t count, ct_dtype dt, int dst, int tag);
ct_status ct_recv_sync(ct_pg *pg, void *buf, size_t count, ct_dtype dt, int src, int tag);

/* ------------------------------------------------------------------ spawn */
/* Like torch.multiprocessing.spawn: forks nprocs children, each with RANK, WORLD_SIZE,
 * LOCAL_RANK, MASTER_ADDR/PORT and a store hosted by the parent, runs fn(rank, nprocs, arg)
 * and exits with its return value. Returns CT_OK if all return 0; otherwise stops the
 * others (SIGTERM, then SIGKILL), prints the failure report to stderr and returns
 * CT_ERR_PEER with the root cause (rank, exit code or signal) in ct_last_error().
 * Call it before the parent computes anything: the children are fork()ed, and an OpenMP
 * thread pool that already exists in the parent does not exist in a child (a parallel region
 * there would wait forever) — the reason torch.multiprocessing.spawn starts fresh
 * interpreters. Programs that must compute first should use `ctrain run` instead. */
typedef int (*ct_spawn_fn)(int rank, int nprocs, void *arg);
ct_status ct_spawn(ct_spawn_fn fn, int nprocs, void *arg);

/* Self-test for `ctrain env --check`: spawns nranks (>= 2) ranks on the shm backend, checks
 * an all-reduce of several sizes and measures bus bandwidth at 16 MiB. Writes a one-line
 * summary into report. Returns CT_OK when the results are correct. */
ct_status ct_dist_selfcheck(int nranks, double *busbw_gbps, char *report, size_t n);

#ifdef __cplusplus
}
#endif
#endif
