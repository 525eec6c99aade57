/* Process-group front end: initialisation from the environment, subgroups, the work queue
 * and its comm thread, and the public collective calls. Backends only see ct_work items,
 * one at a time, in issue order. */
#include "distributed/dist_internal.h"
#include "ctrain/config.h"

#include <errno.h>
#include <fcntl.h>
#include <immintrin.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ small helpers */
static const char *rop_names[CT_RED_COUNT_] = {"sum", "avg", "min", "max", "prod"};
const char *ct_reduce_op_name(ct_reduce_op op) { return (unsigned)op < CT_RED_COUNT_ ? rop_names[op] : "?"; }
ct_status ct_reduce_op_parse(const char *s, ct_reduce_op *out) {
    for (int i = 0; i < CT_RED_COUNT_; i++)
        if (!strcasecmp(s, rop_names[i])) { *out = (ct_reduce_op)i; return CT_OK; }
    return ct_error(CT_ERR_INVALID, "unknown reduce op '%s' (expected sum, avg, min, max, prod)", s);
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

ct_dist_opts ct_dist_default_opts(void) {
    ct_dist_opts o = {.rank = -1, .world_size = -1, .local_rank = -1, .local_world_size = -1, .fingerprint = -1};
    return o;
}

/* ------------------------------------------------------------------ comm thread */
static void work_finish(ct_work *w) {
    /* last touch of w unless a waiter sleeps; then the wake is the last touch */
    if (atomic_exchange(&w->state, 1) == 2) futex(&w->state, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
}

static void exec_work(ct_pg *pg, ct_work *w) {
    if (pg->broken != CT_OK) {
        w->st = pg->broken;
        snprintf(w->msg, sizeof w->msg, "process group unusable after an earlier failure: %.560s", pg->broken_msg);
        return;
    }
    double t0 = ct_time_now();
    ct_status st = pg->be->run(pg->impl, w, t0 + pg->timeout);
    w->st = st;
    if (st != CT_OK) {
        snprintf(w->msg, sizeof w->msg, "%s", ct_last_error());
        if (st == CT_ERR_TIMEOUT || st == CT_ERR_PEER || st == CT_ERR_MISMATCH) {
            pg->broken = st;
            snprintf(pg->broken_msg, sizeof pg->broken_msg, "%s", w->msg);
        }
    }
}

static void *comm_main(void *arg) {
    ct_pg *pg = arg;
    char name[16];
    snprintf(name, sizeof name, "ct-comm-%d", pg->gid);
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        while (!pg->stop && (!pg->head || pg->busy)) pthread_cond_wait(&pg->cv, &pg->mu);
        if (!pg->head && pg->stop) break;
        if (pg->busy) continue;
        ct_work *w = pg->head;
        pg->head = w->next;
        if (!pg->head) pg->tail = NULL;
        pg->busy = 1;
        pthread_mutex_unlock(&pg->mu);
        exec_work(pg, w);
        pthread_mutex_lock(&pg->mu);
        pg->busy = 0;
        work_finish(w);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

/* Queues w, or runs it right here when the queue is idle and `inline_ok` (sync wrappers). */
static void submit(ct_pg *pg, ct_work *w, int inline_ok) {
    if (pg->be->issued) pg->be->issued(pg->impl, w);
    pthread_mutex_lock(&pg->mu);
    if (inline_ok && !pg->head && !pg->busy) {
        pg->busy = 1;
        pthread_mutex_unlock(&pg->mu);
        exec_work(pg, w);
        atomic_store(&w->state, 1);
        pthread_mutex_lock(&pg->mu);
        pg->busy = 0;
        if (pg->head) pthread_cond_signal(&pg->cv);
        pthread_mutex_unlock(&pg->mu);
        return;
    }
    if (!pg->started) {
        if (pthread_create(&pg->th, NULL, comm_main, pg)) {
            pthread_mutex_unlock(&pg->mu);
            w->st = ct_error(CT_ERR_SYSTEM, "cannot start the comm thread");
            snprintf(w->msg, sizeof w->msg, "cannot start the comm thread");
            atomic_store(&w->state, 1);
            return;
        }
        pg->started = 1;
    }
    w->next = NULL;
    if (pg->tail) pg->tail->next = w;
    else pg->head = w;
    pg->tail = w;
    pthread_cond_signal(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
}

static ct_work oom_work = {.state = 1, .st = CT_ERR_NOMEM, .msg = "out of memory allocating a work handle"};

/* Builds a work item; argument errors complete it at once with CT_ERR_INVALID. */
static int work_init(ct_work *w, ct_pg *pg, int kind, const void *s, void *r, size_t count, ct_dtype dt,
                     ct_reduce_op op, int peer, int tag) {
    memset(w, 0, offsetof(ct_work, msg));
    w->msg[0] = 0;
    w->pg = pg;
    w->kind = kind;
    w->sbuf = s;
    w->rbuf = r;
    w->count = count;
    w->dt = dt;
    w->rop = op;
    w->peer = peer;
    w->tag = tag;
    const char *bad = NULL;
    char tmp[160];
    if (!pg) bad = "process group is NULL";
    else if ((unsigned)dt > CT_I64) bad = "dtype must be f32, f16, bf16, f64, i32 or i64";
    else if ((unsigned)op >= CT_RED_COUNT_) bad = "unknown reduce op";
    else if ((kind == CT_OP_BROADCAST || kind == CT_OP_REDUCE || kind == CT_OP_SEND || kind == CT_OP_RECV) &&
             (peer < 0 || peer >= pg->size)) {
        snprintf(tmp, sizeof tmp, "%s: rank %d is not in a group of %d", ct_op_name(kind), peer, pg->size);
        bad = tmp;
    } else if (ct_op_is_p2p(kind) && peer == pg->rank) bad = "send/recv to self";
    else if (count && kind != CT_OP_BARRIER && ((kind != CT_OP_RECV && !s && kind != CT_OP_ALLREDUCE &&
                                                 kind != CT_OP_BROADCAST && kind != CT_OP_REDUCE) ||
                                                (!r && kind != CT_OP_SEND)))
        bad = "NULL buffer";
    if (bad) {
        w->st = CT_ERR_INVALID;
        snprintf(w->msg, sizeof w->msg, "%s", bad);
        atomic_store(&w->state, 1);
        return 0;
    }
    if (!ct_op_is_p2p(kind)) w->seq = ++pg->seq;
    return 1;
}

static ct_work *async_op(ct_pg *pg, int kind, const void *s, void *r, size_t count, ct_dtype dt, ct_reduce_op op,
                         int peer, int tag) {
    ct_work *w = malloc(sizeof *w);
    if (!w) return &oom_work;
    if (work_init(w, pg, kind, s, r, count, dt, op, peer, tag)) submit(pg, w, 0);
    w->heap = 1;
    return w;
}

/* Runs queued works on the calling thread while the comm thread is idle (it may still be
 * waking up): the head is always the oldest work, so issue order is kept. Returns when w is
 * done or when the comm thread is running something. */
static void help_drain(ct_pg *pg, ct_work *w) {
    pthread_mutex_lock(&pg->mu);
    while (atomic_load(&w->state) != 1 && pg->head && !pg->busy) {
        ct_work *h = pg->head;
        pg->head = h->next;
        if (!pg->head) pg->tail = NULL;
        pg->busy = 1;
        pthread_mutex_unlock(&pg->mu);
        exec_work(pg, h);
        pthread_mutex_lock(&pg->mu);
        pg->busy = 0;
        work_finish(h);
    }
    if (pg->head && !pg->busy) pthread_cond_signal(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
}

ct_status ct_work_wait(ct_work *w) {
    if (!w) return ct_error(CT_ERR_INVALID, "ct_work_wait(NULL)");
    if (atomic_load_explicit(&w->state, memory_order_acquire) != 1 && w->pg) help_drain(w->pg, w);
    /* short spin: completions right after issue are common for small ops */
    for (int i = 0; i < 2000 && atomic_load_explicit(&w->state, memory_order_acquire) != 1; i++) _mm_pause();
    for (;;) {
        uint32_t s = atomic_load_explicit(&w->state, memory_order_acquire);
        if (s == 1) break;
        if (s == 0 && !atomic_compare_exchange_strong(&w->state, &s, 2)) continue;
        struct timespec ts = {0, 20 * 1000 * 1000};
        futex(&w->state, FUTEX_WAIT_PRIVATE, 2, &ts);
        if (atomic_load_explicit(&w->state, memory_order_acquire) != 1) help_drain(w->pg, w);
    }
    if (w->st != CT_OK) return ct_error(w->st, "%s", w->msg);
    return CT_OK;
}

bool ct_work_test(ct_work *w) { return w && atomic_load_explicit(&w->state, memory_order_acquire) == 1; }

void ct_work_free(ct_work *w) {
    if (!w || w == &oom_work) return;
    ct_status st = ct_work_wait(w);
    (void)st;
    if (w->heap) free(w);
}

static ct_status sync_op(ct_pg *pg, int kind, const void *s, void *r, size_t count, ct_dtype dt, ct_reduce_op op,
                         int peer, int tag) {
    ct_work w;
    if (work_init(&w, pg, kind, s, r, count, dt, op, peer, tag)) submit(pg, &w, 1);
    return ct_work_wait(&w);
}

/* ------------------------------------------------------------------ public collectives */
ct_work *ct_all_reduce(ct_pg *pg, void *buf, size_t count, ct_dtype dt, ct_reduce_op op) {
    return async_op(pg, CT_OP_ALLREDUCE, buf, buf, count, dt, op, 0, 0);
}
ct_work *ct_broadcast(ct_pg *pg, void *buf, size_t count, ct_dtype dt, int root) {
    return async_op(pg, CT_OP_BROADCAST, buf, buf, count, dt, CT_RED_SUM, root, 0);
}
ct_work *ct_reduce(ct_pg *pg, void *buf, size_t count, ct_dtype dt, ct_reduce_op op, int root) {
    return async_op(pg, CT_OP_REDUCE, buf, buf, count, dt, op, root, 0);
}
ct_work *ct_all_gather(ct_pg *pg, const void *send, void *recv, size_t count, ct_dtype dt) {
    return async_op(pg, CT_OP_ALLGATHER, send, recv, count, dt, CT_RED_SUM, 0, 0);
}
ct_work *ct_reduce_scatter(ct_pg *pg, const void *send, void *recv, size_t count, ct_dtype dt, ct_reduce_op op) {
    return async_op(pg, CT_OP_REDUCE_SCATTER, send, recv, count, dt, op, 0, 0);
}
ct_work *ct_all_to_all(ct_pg *pg, const void *send, void *recv, size_t count, ct_dtype dt) {
    return async_op(pg, CT_OP_ALLTOALL, send, recv, count, dt, CT_RED_SUM, 0, 0);
}
ct_work *ct_barrier(ct_pg *pg) { return async_op(pg, CT_OP_BARRIER, NULL, NULL, 0, CT_I32, CT_RED_SUM, 0, 0); }
ct_work *ct_send(ct_pg *pg, const void *buf, size_t count, ct_dtype dt, int dst, int tag) {
    return async_op(pg, CT_OP_SEND, buf, NULL, count, dt, CT_RED_SUM, dst, tag);
}
ct_work *ct_recv(ct_pg *pg, void *buf, size_t count, ct_dtype dt, int src, int tag) {
    return async_op(pg, CT_OP_RECV, NULL, buf, count, dt, CT_RED_SUM, src, tag);
}

ct_status ct_all_reduce_sync(ct_pg *pg, void *buf, size_t count, ct_dtype dt, ct_reduce_op op) {
    return sync_op(pg, CT_OP_ALLREDUCE, buf, buf, count, dt, op, 0, 0);
}
ct_status ct_broadcast_sync(ct_pg *pg, void *buf, size_t count, ct_dtype dt, int root) {
    return sync_op(pg, CT_OP_BROADCAST, buf, buf, count, dt, CT_RED_SUM, root, 0);
}
ct_status ct_reduce_sync(ct_pg *pg, void *buf, size_t count, ct_dtype dt, ct_reduce_op op, int root) {
    return sync_op(pg, CT_OP_REDUCE, buf, buf, count, dt, op, root, 0);
}
ct_status ct_all_gather_sync(ct_pg *pg, const void *send, void *recv, size_t count, ct_dtype dt) {
    return sync_op(pg, CT_OP_ALLGATHER, send, recv, count, dt, CT_RED_SUM, 0, 0);
}
ct_status ct_reduce_scatter_sync(ct_pg *pg, const void *send, void *recv, size_t count, ct_dtype dt,
                                 ct_reduce_op op) {
    return sync_op(pg, CT_OP_REDUCE_SCATTER, send, recv, count, dt, op, 0, 0);
}
ct_status ct_all_to_all_sync(ct_pg *pg, const void *send, void *recv, size_t count, ct_dtype dt) {
    return sync_op(pg, CT_OP_ALLTOALL, send, recv, count, dt, CT_RED_SUM, 0, 0);
}
ct_status ct_barrier_sync(ct_pg *pg) { return sync_op(pg, CT_OP_BARRIER, NULL, NULL, 0, CT_I32, CT_RED_SUM, 0, 0); }
ct_status ct_barrier_shared_sync(ct_pg *pg) {
    return sync_op(pg, CT_OP_BARRIER, NULL, NULL, 0, CT_I32, CT_RED_SUM, 0, CT_BARRIER_SHARED_TAG);
}
ct_status ct_send_sync(ct_pg *pg, const void *buf, size_t count, ct_dtype dt, int dst, int tag) {
    return sync_op(pg, CT_OP_SEND, buf, NULL, count, dt, CT_RED_SUM, dst, tag);
}
ct_status ct_recv_sync(ct_pg *pg, void *buf, size_t count, ct_dtype dt, int src, int tag) {
    return sync_op(pg, CT_OP_RECV, NULL, buf, count, dt, CT_RED_SUM, src, tag);
}

/* ------------------------------------------------------------------ shared memory */
ct_status ct_pg_alloc_shared(ct_pg *pg, size_t bytes, void **mine) {
    if (!mine) return ct_error(CT_ERR_INVALID, "ct_pg_alloc_shared: mine is NULL");
    *mine = NULL;
    if (!pg) return ct_error(CT_ERR_INVALID, "ct_pg_alloc_shared: process group is NULL");
    if (!pg->be->alloc_shared)
        return ct_error(CT_ERR_UNSUPPORTED, "shared allocations need the shm backend (this group uses %s)", pg->be->name);
    if (pg->broken) return ct_error(pg->broken, "process group unusable: %s", pg->broken_msg);
    /* same size everywhere; as a sync op it also drains the queue (the backend rendezvous
     * runs on this thread and changes what the comm thread looks up) */
    int64_t v[2] = {(int64_t)bytes, -(int64_t)bytes};
    ct_status st = ct_all_reduce_sync(pg, v, 2, CT_I64, CT_RED_MAX);
    if (st) return st;
    if (v[0] != (int64_t)bytes || -v[1] != (int64_t)bytes)
        return ct_error(CT_ERR_MISMATCH, "ct_pg_alloc_shared: ranks asked for different sizes (%zu bytes here, %lld to %lld elsewhere)",
                        bytes, (long long)-v[1], (long long)v[0]);
    void *p = NULL;
    ct_status mine_st = pg->be->alloc_shared(pg, pg->impl, bytes, &p);
    char msg[640] = "";
    if (mine_st) snprintf(msg, sizeof msg, "%s", ct_last_error());
    /* all or none: a rank that mapped it must not use it if another could not */
    int32_t ok = mine_st == CT_OK;
    st = ct_all_reduce_sync(pg, &ok, 1, CT_I32, CT_RED_MIN);
    if (st == CT_OK && ok) { *mine = p; return CT_OK; }
    if (p) pg->be->free_shared(pg->impl, p);
    if (st) return st;
    if (mine_st) return ct_error(mine_st, "%s", msg);
    return ct_error(CT_ERR_SYSTEM, "shared allocation failed on another rank (its log has the reason)");
}

void *ct_pg_shared_peer(ct_pg *pg, void *p, int rank) {
    if (!pg || !p || !pg->be->shared_peer) return NULL;
    return pg->be->shared_peer(pg->impl, p, rank);
}

void ct_pg_free_shared(ct_pg *pg, void *mine) {
    if (!pg || !mine || !pg->be->free_shared) return;
    /* works still queued or running may use the region (local: no peer needs to take part) */
    pthread_mutex_lock(&pg->mu);
    while (pg->head || pg->busy) {
        pthread_mutex_unlock(&pg->mu);
        struct timespec ts = {0, 200 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&pg->mu);
    }
    pthread_mutex_unlock(&pg->mu);
    pg->be->free_shared(pg->impl, mine);
}

/* ------------------------------------------------------------------ groups */
int ct_pg_rank(const ct_pg *pg) { return pg ? pg->rank : -1; }
int ct_pg_size(const ct_pg *pg) { return pg ? pg->size : 0; }
const char *ct_pg_backend(const ct_pg *pg) { return pg && pg->be ? pg->be->name : "none"; }
int ct_pg_global_rank(const ct_pg *pg, int r) { return pg && r >= 0 && r < pg->size ? pg->granks[r] : -1; }
ct_store *ct_pg_store(ct_pg *pg) { return pg ? pg->world->store : NULL; }

static ct_pg *pg_alloc(int rank, int size) {
    ct_pg *pg = calloc(1, sizeof *pg);
    if (!pg) return NULL;
    pg->granks = calloc((size_t)size, sizeof(int));
    if (!pg->granks) { free(pg); return NULL; }
    pg->rank = rank;
    pg->size = size;
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv, NULL);
    return pg;
}

static void pg_stop_thread(ct_pg *pg) {
    pthread_mutex_lock(&pg->mu);
    pg->stop = 1;
    pthread_cond_broadcast(&pg->cv);
    int started = pg->started;
    pthread_mutex_unlock(&pg->mu);
    if (started) pthread_join(pg->th, NULL);
}

static void pg_release(ct_pg *pg) {
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    free(pg->granks);
    free(pg);
}

/* Rank 0 hosts the store when there is no launcher: it must outlive the other ranks'
 * use of it, so every rank checks in before rank 0 shuts it down. */
static void world_finalize_store(ct_pg *pg) {
    if (!pg->store) return;
    char key[128];
    int64_t v = 0;
    snprintf(key, sizeof key, "%sfinalized", pg->prefix);
    ct_store_set_timeout(pg->store, pg->broken ? 2 : pg->timeout); /* the store may be gone with a peer */
    if (ct_store_add(pg->store, key, 1, &v) == CT_OK && v == pg->size) {
        snprintf(key, sizeof key, "%sfinalized_all", pg->prefix);
        ct_store_set(pg->store, key, "1", 1);
    }
    if (pg->server) {
        void *val = NULL;
        snprintf(key, sizeof key, "%sfinalized_all", pg->prefix);
        double t = pg->broken ? 2 : pg->timeout;
        if (ct_store_get(pg->store, key, t, &val, NULL) == CT_OK) free(val);
    }
}

void ct_pg_free(ct_pg *pg) {
    if (!pg) return;
    pg_stop_thread(pg);
    if (pg->impl) pg->be->destroy(pg->impl);
    if (pg->world == pg) {
        world_finalize_store(pg);
        ct_store_free(pg->store);
        ct_store_server_stop(pg->server);
        if (pg->token_file[0]) unlink(pg->token_file);
    }
    pg_release(pg);
}

ct_status ct_dist_new_group(ct_pg *parent, const int *ranks, int nranks, ct_pg **out) {
    *out = NULL;
    if (!parent) return ct_error(CT_ERR_INVALID, "ct_dist_new_group: parent is NULL");
    if (nranks < 1 || nranks > parent->size)
        return ct_error(CT_ERR_INVALID, "ct_dist_new_group: %d ranks for a group of %d", nranks, parent->size);
    int me = -1;
    for (int i = 0; i < nranks; i++) {
        if (ranks[i] < 0 || ranks[i] >= parent->size)
            return ct_error(CT_ERR_INVALID, "ct_dist_new_group: rank %d is not in a group of %d", ranks[i], parent->size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) return ct_error(CT_ERR_INVALID, "ct_dist_new_group: rank %d listed twice", ranks[i]);
        if (ranks[i] == parent->rank) me = i;
    }
    if (parent->broken) return ct_error(parent->broken, "process group unusable: %s", parent->broken_msg);
    /* the queue must be drained: backends rendezvous on the calling thread */
    ct_status st = ct_barrier_sync(parent);
    if (st) return st;
    int gid = ++parent->world->ngroups;
    ct_pg *child = NULL;
    if (me >= 0) {
        child = pg_alloc(me, nranks);
        if (!child) return ct_error(CT_ERR_NOMEM, "process group");
        for (int i = 0; i < nranks; i++) child->granks[i] = parent->granks[ranks[i]];
        child->gid = gid;
        child->be = parent->be;
        child->world = parent->world;
        child->timeout = parent->timeout;
        child->fingerprint = parent->fingerprint;
        child->local_size = parent->local_size;
        memcpy(child->prefix, parent->prefix, sizeof child->prefix);
        memcpy(child->runid, parent->runid, sizeof child->runid);
    }
    void *impl = NULL;
    st = parent->be->new_group(parent, child, ranks, nranks, me, &impl);
    if (st) {
        if (child) pg_release(child);
        return st;
    }
    if (child) {
        child->impl = impl;
        CT_LOG_INFO("pg", "group %d: rank %d of %d (%s)", gid, me, nranks, child->be->name);
    }
    *out = child;
    return CT_OK;
}

/* Pins local rank r to its own slice of the CPUs this process may use (as mpirun does):
 * spinning peers sharing a core, or the scheduler moving them around, costs 10-100x in
 * latency. Skipped when there are fewer CPUs than local ranks or CTRAIN_BIND=0. */
static void bind_local_rank(int lrank, int lsize) {
    if (!ct_config_bool(CT_CFG_BIND)) return;
    cpu_set_t cur, mine;
    if (sched_getaffinity(0, sizeof cur, &cur)) return;
    int ncpu = CPU_COUNT(&cur);
    if (lsize < 2 || ncpu < lsize || lrank < 0 || lrank >= lsize) return;
    int per = ncpu / lsize, k = 0, first = -1;
    CPU_ZERO(&mine);
    for (int c = 0; c < CPU_SETSIZE && k < (lrank + 1) * per; c++) {
        if (!CPU_ISSET(c, &cur)) continue;
        if (k >= lrank * per) { CPU_SET(c, &mine); if (first < 0) first = c; }
        k++;
    }
    if (!sched_setaffinity(0, sizeof mine, &mine))
        CT_LOG_INFO("pg", "local rank %d bound to %d CPU(s) from %d (CTRAIN_BIND=0 to disable)", lrank, per, first);
}

/* A rank other than 0 of a job without CTRAIN_STORE_TOKEN: the token is in rank 0's file.
 * The file may not exist yet, or still hold the token of an earlier job on the same port
 * (rank 0 replaces it before it listens), so a rejection is retried once the file changed. */
static ct_status connect_with_token_file(const char *addr, int port, double timeout, ct_store **out) {
    double deadline = ct_time_now() + timeout;
    char tok[128], tried[128] = "";
    for (;;) {
        ct_status st = ct_token_file_read(port, tok, sizeof tok);
        if (st && st != CT_ERR_NOT_FOUND) return st;
        if (st == CT_OK && strcmp(tok, tried)) {
            double left = deadline - ct_time_now();
            st = ct_store_connect(addr, port, tok, left > 0.1 ? left : 0.1, out);
            if (st != CT_ERR_PEER || !strstr(ct_last_error(), "rejected")) return st;
            snprintf(tried, sizeof tried, "%s", tok);
        }
        if (ct_time_now() > deadline) {
            char path[600] = "";
            ct_token_file_path(port, path, sizeof path);
            return ct_error(CT_ERR_TIMEOUT,
                            "no store token for port %d after %.0f s: rank 0 writes it to %s (is rank 0 running as the "
                            "same user on this machine? otherwise set CTRAIN_STORE_TOKEN on every rank)",
                            port, timeout, path);
        }
        usleep(20 * 1000);
    }
}

/* The store of a world group of several ranks whose backend meets through it: the
 * launcher's, torchrun's c10d TCPStore, or one that rank 0 hosts. On failure what was set
 * up stays in pg (pg->store, server, token_file) for the caller's cleanup. */
static ct_status join_store(ct_pg *pg, const ct_dist_opts *o, double timeout) {
    ct_status st;
    const char *addr = o->master_addr ? o->master_addr : ct_config_str(CT_CFG_MASTER_ADDR);
    if (!addr || !*addr) addr = "127.0.0.1";
    int port = o->master_port;
    if (port <= 0 && (st = ct_config_check(CT_CFG_MASTER_PORT))) return st;
    if (port <= 0) port = (int)ct_config_int(CT_CFG_MASTER_PORT);
    const char *token = o->token ? o->token : ct_config_str(CT_CFG_STORE_TOKEN);
    /* ranks started by hand on several machines: the secret may come from a 0600 file, as
     * ctrain run takes it (never from argv, never over the wire) */
    char file_token[256];
    const char *token_file = token ? NULL : ct_config_str(CT_CFG_STORE_TOKEN_FILE);
    if (token_file && *token_file) {
        if ((st = ct_store_secret_read_file(token_file, file_token, sizeof file_token)) != CT_OK) return st;
        token = file_token;
    }
    int hosted = ct_config_bool(CT_CFG_STORE_HOSTED);
    if ((st = ct_config_check(CT_CFG_TORCHELASTIC_USE_AGENT_STORE))) return st;
    int agent = ct_config_bool(CT_CFG_TORCHELASTIC_USE_AGENT_STORE); /* torchrun's c10d TCPStore */
    char made[64];
    if (agent) {
        token = NULL;
    } else if (pg->rank == 0 && !hosted) {
        if (!token) { /* ranks from the environment: a token of our own, shared through a 0600 file */
            st = ct_token_file_publish(port, made, sizeof made, pg->token_file, sizeof pg->token_file);
            if (st) {
                pg->token_file[0] = 0; /* not ours: an earlier job's file, if any, stays */
                return ct_error(st, "rank 0 cannot share a store token: %s", ct_last_error());
            }
            token = made;
        }
        /* the address the others were told, never all interfaces */
        st = ct_store_server_start(addr, port, token, &pg->server);
        if (st) return ct_error(st, "rank 0 cannot host the store: %s", ct_last_error());
    }
    if (agent) {
        st = ct_store_connect_c10d(addr, port, timeout, &pg->store);
        if (st) st = ct_error(st, "%s (torchrun's agent store, as TORCHELASTIC_USE_AGENT_STORE says)", ct_last_error());
    } else if (token) {
        st = ct_store_connect(addr, port, token, timeout, &pg->store);
    } else {
        st = connect_with_token_file(addr, port, timeout, &pg->store);
    }
    if (st) return st;
    CT_LOG_INFO("pg", "rendezvous through store %s:%d (%s, %s protocol)", addr, port,
                pg->server ? "hosted by rank 0" : "launcher's", ct_store_protocol(pg->store));
    return CT_OK;
}

/* "shm, mpi, gloo, hier or nccl": every name of the table. */
static void backend_names(char *out, size_t n) {
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < CT_BE_COUNT && o < n; i++)
        o += (size_t)snprintf(out + o, n - o, "%s%s", i == 0 ? "" : i == CT_BE_COUNT - 1 ? " or " : ", ",
                              ct_backend_table[i].pub.name);
}

/* The backend of a new world group, and hier's part, from the one asked for (`req`, NULL for
 * automatic) and how the job was started. */
static const ct_backend_desc *choose_backend(const ct_backend_desc *req, int launched_by_mpi, int world, int lworld,
                                             ct_hier_mode *hier) {
    const ct_backend_desc *tab = ct_backend_table, *gloo = &tab[CT_BE_GLOO];
    *hier = CT_HIER_OFF;
    if (req == &tab[CT_BE_HIER]) {
        *hier = CT_HIER_FORCE;
        /* a store-based launch: hier's leaders meet through gloo */
        return !launched_by_mpi && gloo->pub.built ? gloo : req;
    }
    if (req) return req;
    /* under mpirun there is no store: the MPI world bootstraps, and hier decides (the same way
     * on every rank, from the exchanged node keys) whether to stay flat. Across machines
     * without mpirun (ctrain run --nnodes, torchrun) gloo meets through the store, with hier on
     * top when a machine has several ranks. */
    if (launched_by_mpi && world > 1) {
        *hier = CT_HIER_AUTO;
        return &tab[CT_BE_HIER];
    }
    if (lworld == world) return &tab[CT_BE_SHM];
    if (launched_by_mpi || !gloo->pub.built) return &tab[CT_BE_MPI];
    *hier = CT_HIER_AUTO; /* lworld < world */
    return gloo;
}

ct_status ct_dist_init(const ct_dist_opts *opts_in, ct_pg **out) {
    *out = NULL;
    ct_dist_opts o = opts_in ? *opts_in : ct_dist_default_opts();
    ct_dist_world env;
    ct_status est = ct_dist_detect(&env);
    if (est) return est;
    int rank = o.rank >= 0 ? o.rank : env.rank, world = o.world_size >= 1 ? o.world_size : env.world_size;
    int lworld = o.local_world_size >= 1 ? o.local_world_size : env.local_world_size;
    if (rank >= world) return ct_error(CT_ERR_INVALID, "rank %d is not below the world size %d", rank, world);
    if (lworld < 1 || lworld > world) lworld = world;

    const char *name = o.backend;
    if (!name && ct_config_is_set(CT_CFG_BACKEND)) {
        if ((est = ct_config_check(CT_CFG_BACKEND))) return est;
        name = ct_config_str(CT_CFG_BACKEND);
    }
    if (name && !*name) name = NULL;
    const ct_backend_desc *req = name ? ct_backend_find(name) : NULL;
    if (name && !req) {
        char names[128];
        backend_names(names, sizeof names);
        return ct_error(CT_ERR_INVALID, "unknown backend '%s' (expected %s)", name, names);
    }
    const ct_backend_desc *mpi = &ct_backend_table[CT_BE_MPI];
    /* MPI's own world when a launcher that MPI_Init can bootstrap from started us: mpirun,
     * hydra, or srun with PMIx (PMIX_RANK beside SLURM_PROCID). A MASTER_PORT (for srun also a
     * MASTER_ADDR, which batch scripts written for torchrun export) asks for the store instead. */
    int srun_pmix = !strcmp(env.launcher, "slurm") && ct_config_is_set(CT_CFG_PMIX_RANK) && mpi->pub.built &&
                    !ct_config_is_set(CT_CFG_MASTER_ADDR);
    int launched_by_mpi = (!strcmp(env.launcher, "mpirun") || !strcmp(env.launcher, "pmi") || srun_pmix) &&
                          !ct_config_is_set(CT_CFG_MASTER_PORT);
    if (!strcmp(env.launcher, "slurm") && !launched_by_mpi && !ct_config_is_set(CT_CFG_MASTER_ADDR) &&
        !ct_config_bool(CT_CFG_TORCHELASTIC_USE_AGENT_STORE) && ct_config_is_set(CT_CFG_SLURM_STEP_NUM_NODES) &&
        ct_config_int(CT_CFG_SLURM_STEP_NUM_NODES) > 1 && req != mpi)
        /* the store would be on 127.0.0.1 of every machine: say so now rather than time out */
        return ct_error(CT_ERR_INVALID,
                        "srun started %ld machines without PMIx%s and MASTER_ADDR is unset, so the ranks have no "
                        "common place to meet: use `srun --mpi=pmix` (MPI between machines), or export MASTER_ADDR "
                        "(the first machine's address), MASTER_PORT and CTRAIN_STORE_TOKEN for ctrain's store",
                        ct_config_int(CT_CFG_SLURM_STEP_NUM_NODES),
                        ct_config_is_set(CT_CFG_PMIX_RANK) && !mpi->pub.built ? " support (this build has no MPI)" : "");
    ct_backend_args args = {.local_rank = o.local_rank >= 0 ? o.local_rank : env.local_rank};
    const ct_backend_desc *be = choose_backend(req, launched_by_mpi, world, lworld, &args.hier);
    if (!be->pub.built) return ct_error(CT_ERR_UNSUPPORTED, "%s", be->unbuilt);
    if (!(be->pub.caps & CT_PG_CAP_MULTI_MACHINE) && lworld < world)
        return ct_error(CT_ERR_UNSUPPORTED, "the %s backend works on one machine (%d of %d ranks are local); "
                        "use CTRAIN_BACKEND=gloo, or launch with mpirun and CTRAIN_BACKEND=mpi", be->pub.name, lworld,
                        world);
    double timeout = o.timeout_s;
    if (!(timeout > 0)) { /* a misspelt timeout must not silently become 300 s */
        if ((est = ct_config_check(CT_CFG_TIMEOUT))) return est;
        timeout = ct_config_float(CT_CFG_TIMEOUT);
    }
    int fp = o.fingerprint >= 0 ? o.fingerprint : ct_config_bool(CT_CFG_FINGERPRINT);

    ct_pg *pg = pg_alloc(rank, world);
    if (!pg) return ct_error(CT_ERR_NOMEM, "process group");
    for (int i = 0; i < world; i++) pg->granks[i] = i;
    pg->world = pg;
    pg->timeout = timeout;
    pg->fingerprint = fp;
    pg->local_size = lworld;
    /* torchrun's store outlives a restart: the attempt keeps the keys apart */
    long attempt = ct_config_is_set(CT_CFG_RESTART_COUNT) ? ct_config_int(CT_CFG_RESTART_COUNT)
                                                          : ct_config_int(CT_CFG_TORCHELASTIC_RESTART_COUNT);
    snprintf(pg->prefix, sizeof pg->prefix, "ctrain/%ld/", attempt);
    const char *rid = ct_config_str(CT_CFG_RUN_ID);
    snprintf(pg->runid, sizeof pg->runid, "%.32s", rid ? rid : "x");
    ct_log_set_rank(rank);

    ct_status st = CT_OK;
    if (be->needs_store) { /* under mpirun (mpi, hier on MPI) the launcher binds and MPI bootstraps */
        if (world > 1) st = join_store(pg, &o, timeout);
        if (!st && world > 1) st = ct_rdzv_check(pg, timeout);
        if (!st) bind_local_rank(args.local_rank, lworld);
    }
    if (!st) st = be->create(pg, &args);
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ct_last_error());
        ct_store_free(pg->store);
        ct_store_server_stop(pg->server);
        if (pg->token_file[0]) unlink(pg->token_file);
        pg_release(pg);
        return ct_error(st, "%s", msg);
    }
    if (pg->size != world || pg->rank != rank) { /* mpi may renumber */
        ct_log_set_rank(pg->rank);
    }
    CT_LOG_INFO("pg", "rank %d of %d, backend %s, timeout %.0f s, fingerprints %s", pg->rank, pg->size, pg->be->name,
                timeout, fp ? "on" : "off");
    *out = pg;
    return CT_OK;
}
