/* shm backend: segment creation and rendezvous, waits (spin, yield, futex), fingerprints,
 * failure propagation, and the dispatch table. The collectives live in shm_*.c. */
#include "distributed/shm.h"
#include "ctrain/config.h"

#include <errno.h>
#include <fcntl.h>
#include <immintrin.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x63747368u /* "ctsh" */

static long futex_shared(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static inline int reached(uint32_t v, uint32_t target) { return (int32_t)(v - target) >= 0; }

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

void shm_word_add(shm_pg *s, shm_word *w) {
    atomic_fetch_add(&w->v, 1); /* seq_cst: pairs with the waiter's waiters++ then load */
    if (atomic_load(&w->waiters)) {
        atomic_store_explicit(&w->woke_ns, now_ns(), memory_order_relaxed);
        futex_shared(&w->v, FUTEX_WAKE, INT_MAX, NULL);
        s->st_wakes++;
    }
}

void shm_post(shm_pg *s) {
    s->posts++;
    shm_word_add(s, &s->ctl[s->rank].seq);
}

static void wake_everyone(shm_pg *s) {
    for (int r = 0; r < s->n; r++) futex_shared(&s->ctl[r].seq.v, FUTEX_WAKE, INT_MAX, NULL);
    for (int i = 0; i < s->n * s->n; i++) {
        futex_shared(&s->chan[i].sent.v, FUTEX_WAKE, INT_MAX, NULL);
        futex_shared(&s->chan[i].acked.v, FUTEX_WAKE, INT_MAX, NULL);
    }
}

/* Records the failure in the segment (first one wins) so that every rank fails at once. */
ct_status shm_fail(shm_pg *s, ct_status st, const char *fmt, ...) {
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    uint32_t zero = 0;
    if (atomic_compare_exchange_strong(&s->hdr->abort, &zero, (uint32_t)st | 0x100u)) {
        s->hdr->abort_rank = s->rank;
        memcpy(s->hdr->abort_msg, msg, sizeof msg);
        atomic_thread_fence(memory_order_seq_cst);
        atomic_store(&s->hdr->abort, 0x10000u | (uint32_t)st);
        wake_everyone(s);
    }
    return ct_error(st, "%s", msg);
}

static ct_status check_abort(shm_pg *s) {
    uint32_t a = atomic_load_explicit(&s->hdr->abort, memory_order_acquire);
    if (!a) return CT_OK;
    while (!(a & 0x10000u)) { _mm_pause(); a = atomic_load(&s->hdr->abort); } /* message being written */
    char d[CT_WORK_DESC] = "";
    if (s->cur) ct_work_describe(s->cur, d, sizeof d);
    return ct_error((ct_status)(a & 0xffu), "%s failed because rank %d failed: %s", d, s->hdr->abort_rank,
                    s->hdr->abort_msg);
}

static int peer_dead(shm_pg *s, int peer) {
    pid_t pid = s->ctl[peer].pid;
    return pid > 0 && kill(pid, 0) && errno == ESRCH;
}

/* A sleeping waiter measured how long its wake-up took (the poster's FUTEX_WAKE to its return):
 * spinning for a few wake-ups' worth costs less than sleeping through one. Where waking is
 * cheap (bare metal, idle cores) this stays at the floor; in a VM whose idle vCPU must be
 * woken by the hypervisor, or on a loaded machine, it grows, up to the cap. */
#define SHM_SPIN_FLOOR_S 200e-6
#define SHM_SPIN_FLOOR_OVERSUB_S 50e-6
#define SHM_SPIN_CAP_S 5e-3
#define SHM_SPIN_IN_OP_S 10e-3 /* later rounds of a multi-round op: the peers are in it too */
static void note_wakeup(shm_pg *s, double lat) {
    s->st_wakeups++;
    s->st_wake_s += lat;
    s->wake_s = s->wake_s > 0 ? 0.8 * s->wake_s + 0.2 * lat : lat;
    /* ranks outnumbering CPUs stay at the short spin: the peer a spinner waits for may be
     * queued behind it on its CPU (4 ranks on 2 cores, 8 B: 96-142 us with 50 us against
     * 100-3,700 us adapted, in alternation) */
    if (s->spin_fixed || s->oversub) return;
    double spin = 4 * s->wake_s;
    s->spin_s = spin < SHM_SPIN_FLOOR_S ? SHM_SPIN_FLOOR_S : spin > SHM_SPIN_CAP_S ? SHM_SPIN_CAP_S : spin;
}

ct_status shm_wait_word(shm_pg *s, shm_word *w, uint32_t target, int peer, double deadline) {
    s->st_waits++;
    if (reached(atomic_load_explicit(&w->v, memory_order_acquire), target)) { s->st_ready++; return CT_OK; }
    double t0 = ct_time_now(), last_pid = t0;
    double budget = s->in_op && !s->spin_fixed && !s->oversub && s->spin_s < SHM_SPIN_IN_OP_S ? SHM_SPIN_IN_OP_S : s->spin_s;
    /* 1. spin: the peer is usually a few hundred ns away. After the first microseconds (at
     * once when ranks outnumber CPUs) each poll also yields, so that a peer or another job
     * waiting for this CPU runs instead of the spinner: the spin shares the core fairly. A
     * yield that took long means another task wanted this CPU: spinning on then only spends
     * this rank's share of it, and a sleeper that wakes is scheduled before a spinner that
     * used its share (measured on a VM at load 20-80: docs/bench/collectives.md), so sleep. */
    int contended = 0;
    /* polls between checks of the clock, the abort flag and the yield: 256 pauses are about
     * 5 us on Zen 4, which is what an oversubscribed waiter kept the CPU from the very peer it
     * waited for (4 ranks on 2 cores, 8 B: 9.8-18 us a call against 5.9-7.7 for Open MPI,
     * which yields at every poll); so when ranks outnumber CPUs, yield at every poll */
    unsigned every = s->oversub ? 0 : 255;
    for (unsigned i = 1;; i++) {
        if (reached(atomic_load_explicit(&w->v, memory_order_acquire), target)) {
            s->st_spun++;
            s->st_wait_s += ct_time_now() - t0;
            return CT_OK;
        }
        _mm_pause();
        if ((i & every) == 0) {
            if (atomic_load_explicit(&s->hdr->abort, memory_order_relaxed)) return check_abort(s);
            double el = ct_time_now() - t0;
            if (el > budget) break;
            if (s->oversub || el > 20e-6) {
                double y0 = ct_time_now();
                sched_yield();
                if (ct_time_now() - y0 > 50e-6 && ++contended >= 2) { s->st_contended++; break; }
            }
        }
    }
    /* 2. sleep on the futex; wake up now and then to check for dead peers and aborts */
    for (;;) {
        ct_status st = check_abort(s);
        if (st) return st;
        double now = ct_time_now();
        if (now >= deadline) return CT_ERR_TIMEOUT; /* caller writes the message */
        if (now - last_pid > 0.1) {
            last_pid = now;
            if (peer >= 0 && peer_dead(s, peer)) {
                char d[CT_WORK_DESC] = "";
                if (s->cur) ct_work_describe(s->cur, d, sizeof d);
                return shm_fail(s, CT_ERR_PEER, "rank %d (pid %d) exited during %s", s->granks[peer],
                                (int)s->ctl[peer].pid, d);
            }
        }
        double left = deadline - now;
        if (left > 0.1) left = 0.1;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        uint64_t slept_ns = now_ns();
        atomic_fetch_add(&w->waiters, 1);
        uint32_t v = atomic_load(&w->v);
        if (!reached(v, target)) futex_shared(&w->v, FUTEX_WAIT, v, &ts);
        atomic_fetch_sub(&w->waiters, 1);
        if (reached(atomic_load_explicit(&w->v, memory_order_acquire), target)) {
            uint64_t woke = atomic_load_explicit(&w->woke_ns, memory_order_relaxed), back = now_ns();
            if (woke >= slept_ns && back >= woke) note_wakeup(s, (double)(back - woke) * 1e-9);
            s->st_slept++;
            s->st_wait_s += ct_time_now() - t0;
            return CT_OK;
        }
    }
}

static void fp_text(const shm_fp *f, char *out, size_t n) {
    ct_work w = {.kind = f->kind, .seq = f->seq, .dt = (ct_dtype)f->dt, .count = f->count, .rop = (ct_reduce_op)f->rop,
                 .peer = f->root};
    ct_work_describe(&w, out, n);
    size_t l = strlen(out);
    if (f->zc == SHM_ZC_CMA && l < n) snprintf(out + l, n - l, " through cross-memory attach");
    else if (f->zc && l < n)
        snprintf(out + l, n - l, " in place in shared allocation %llu at byte %llu", (unsigned long long)(f->zc >> 40) - 1,
                 (unsigned long long)(f->zc & ((1ull << 40) - 1)));
}

void shm_fp_begin(shm_pg *s, const ct_work *w) {
    s->cur = w;
    if (!s->fingerprint) return;
    shm_fp *f = &s->ctl[s->rank].fp[w->seq & 1];
    f->seq = w->seq;
    f->kind = (uint8_t)w->kind;
    f->dt = (uint8_t)w->dt;
    f->rop = (uint8_t)((w->kind == CT_OP_ALLREDUCE || w->kind == CT_OP_REDUCE || w->kind == CT_OP_REDUCE_SCATTER)
                           ? w->rop : 0);
    f->root = (w->kind == CT_OP_BROADCAST || w->kind == CT_OP_REDUCE) ? w->peer : 0;
    f->count = w->count;
    f->zc = 0;
    f->valid = 1;
    /* the post that follows publishes it (seq_cst increment) */
}

ct_status shm_wait_all(shm_pg *s, double deadline, int check) {
    for (int p = 0; p < s->n; p++) {
        if (p == s->rank) continue;
        ct_status st = shm_wait_word(s, &s->ctl[p].seq, s->posts, p, deadline);
        if (st == CT_ERR_TIMEOUT) {
            char missing[256] = "", d[200] = "";
            size_t o = 0;
            for (int q = 0; q < s->n; q++)
                if (q != s->rank && !reached(atomic_load(&s->ctl[q].seq.v), s->posts) && o < sizeof missing - 16)
                    o += (size_t)snprintf(missing + o, sizeof missing - o, "%s%d", o ? ", " : "", s->granks[q]);
            if (s->cur) ct_work_describe(s->cur, d, sizeof d);
            return shm_fail(s, CT_ERR_TIMEOUT, "%s timed out on rank %d: rank(s) %s never reached it", d,
                            s->granks[s->rank], missing);
        }
        if (st) return st;
    }
    if (check && s->fingerprint && s->cur) {
        const shm_fp *mine = &s->ctl[s->rank].fp[s->cur->seq & 1];
        for (int p = 0; p < s->n; p++) {
            if (p == s->rank) continue;
            const shm_fp *f = &s->ctl[p].fp[s->cur->seq & 1];
            if (f->seq != mine->seq || f->kind != mine->kind || f->dt != mine->dt || f->rop != mine->rop ||
                f->root != mine->root || f->count != mine->count || f->zc != mine->zc) {
                char a[CT_WORK_DESC], b[CT_WORK_DESC];
                fp_text(mine, a, sizeof a);
                fp_text(f, b, sizeof b);
                return shm_fail(s, CT_ERR_MISMATCH, "collective mismatch: rank %d called %s but rank %d called %s",
                                s->granks[s->rank], a, s->granks[p], b);
            }
        }
    }
    return CT_OK;
}

size_t shm_part(size_t ce, int n, size_t esz) {
    size_t align = 64 / esz;
    size_t pe = (ce + (size_t)n - 1) / (size_t)n;
    return (pe + align - 1) / align * align;
}

/* ------------------------------------------------------------------ dispatch */
static ct_status shm_run(void *impl, ct_work *w, double deadline) {
    shm_pg *s = impl;
    ct_status st = check_abort(s);
    if (st) return st;
    switch (w->kind) {
    case CT_OP_ALLREDUCE: {
        shm_shared *a = shm_find_shared(s, w->rbuf, w->count * ct_dtype_size(w->dt));
        st = a ? shm_allreduce_shared(s, a, w, deadline) : shm_allreduce(s, w, deadline);
        break;
    }
    case CT_OP_REDUCE: st = shm_allreduce(s, w, deadline); break;
    case CT_OP_BROADCAST: st = shm_broadcast(s, w, deadline); break;
    case CT_OP_ALLGATHER: st = shm_allgather(s, w, deadline); break;
    case CT_OP_REDUCE_SCATTER: st = shm_reduce_scatter(s, w, deadline); break;
    case CT_OP_ALLTOALL: st = shm_alltoall(s, w, deadline); break;
    case CT_OP_BARRIER: st = shm_barrier(s, w, deadline); break;
    case CT_OP_SEND: st = shm_send(s, w, deadline); break;
    case CT_OP_RECV: st = shm_recv(s, w, deadline); break;
    default: st = ct_error(CT_ERR_INVALID, "unknown op %d", w->kind);
    }
    s->cur = NULL;
    s->in_op = 0;
    return st;
}

static void shm_destroy(void *impl) {
    shm_pg *s = impl;
    if (!s) return;
    if (s->st_waits)
        CT_LOG_INFO("shm", "group %d: %llu waits: %llu found ready, %llu spun (%.1f us mean), %llu slept (%llu of them because another task wanted the CPU); %llu futex wakes "
                    "issued; wake-up %.1f us mean over %llu; spin budget now %.0f us", s->gid,
                    (unsigned long long)s->st_waits, (unsigned long long)s->st_ready, (unsigned long long)s->st_spun,
                    s->st_spun + s->st_slept ? s->st_wait_s * 1e6 / (double)(s->st_spun + s->st_slept) : 0.0,
                    (unsigned long long)s->st_slept, (unsigned long long)s->st_contended, (unsigned long long)s->st_wakes,
                    s->st_wakeups ? s->st_wake_s * 1e6 / (double)s->st_wakeups : 0.0, (unsigned long long)s->st_wakeups,
                    s->spin_s * 1e6);
    if (s->st_large[0] + s->st_large[1])
        CT_LOG_INFO("shm", "group %d: all-reduces from 32 KiB (one round: %zu KiB): %llu through cross-memory attach, %llu staged", s->gid,
                    s->H >> 10, (unsigned long long)s->st_large[1], (unsigned long long)s->st_large[0]);
    shm_free_all_shared(s);
    free(s->cma_tmp);
    if (s->base) munmap(s->base, s->map_bytes);
    free(s->p2p_sent);
    free(s->p2p_recv);
    free(s);
}

/* Creates (leader) or opens the segment and publishes/reads its name through the store.
 * key_base names the group ("ctrain/0/g3/"). With `given` (ct_shm_create_named) the caller
 * chose the name and does the rendezvous: no store is used. */
static ct_status shm_setup(ct_pg *pg, int rank, int n, const int *granks, int gid, double timeout, int fingerprint,
                           int local_size, const char *given, void **out) {
    *out = NULL;
    shm_pg *s = calloc(1, sizeof *s);
    if (!s) return ct_error(CT_ERR_NOMEM, "shm group");
    s->rank = rank;
    s->n = n;
    s->gid = gid;
    s->granks = granks;
    s->subgroup = gid != 0;
    s->fingerprint = fingerprint;
    /* Default chunk: 1 MiB, so that an all-reduce of up to 1 MiB is one round (2 waits, as few
     * as cross-memory attach) and larger ones have 4x fewer rounds than with 256 KiB: on the
     * 2-core Zen 4 VM, 2 ranks, 1 MiB ran 12.6-21 GB/s against 9-12.6 and 16 MiB 8.3-10 against
     * 7.2-7.4 (docs/bench/collectives.md). Past 4 ranks it shrinks so that the staging slots
     * stay at 8 MiB (a container's /dev/shm is often 64 MiB), never below 256 KiB. */
    long hc = ct_config_int(CT_CFG_SHM_CHUNK);
    if (hc > 0) s->H = (size_t)hc & ~(size_t)4095;
    else {
        size_t h = ((size_t)8 << 20) / (2 * (size_t)n);
        s->H = h > ((size_t)1 << 20) ? (size_t)1 << 20 : h < ((size_t)256 << 10) ? (size_t)256 << 10 : h & ~(size_t)4095;
    }
    /* a round splits a chunk into n parts of at least one 64-byte line; a smaller chunk gave
     * rounds of zero elements and a loop that never advanced (a false timeout with 66 ranks
     * and CTRAIN_SHM_CHUNK=4096). Same n and variable on every rank: the same H everywhere. */
    size_t minH = ((size_t)n * 64 + 4095) & ~(size_t)4095;
    if (s->H < minH) s->H = minH;
    s->P = 128 << 10;
    s->small_max = (size_t)ct_config_int(CT_CFG_SHM_SMALL);
    if (s->small_max > s->H) s->small_max = s->H;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    s->oversub = local_size > ncpu;
    s->spin_fixed = ct_config_is_set(CT_CFG_SHM_SPIN_US);
    s->spin_s = s->spin_fixed ? ct_config_float(CT_CFG_SHM_SPIN_US) * 1e-6
                              : s->oversub ? SHM_SPIN_FLOOR_OVERSUB_S : SHM_SPIN_FLOOR_S;
    s->cma = n > 1 && ct_config_bool(CT_CFG_SHM_CMA) ? -1 : 0; /* -1: probed at the first large all-reduce */
    s->cma_adapt = !ct_config_is_set(CT_CFG_SHM_CMA);
    s->cma_mask = ~0ull; /* cross-memory attach first: it holds up where wake-ups are slow */
    /* a peer's data is read in pieces that, with the partial sums, fill half of the L2 cache */
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 <= 0) l2 = 1 << 20;
    s->cma_chunk = ((size_t)l2 / 2 / (size_t)n) & ~(size_t)4095;
    if (s->cma_chunk < 16384) s->cma_chunk = 16384;
    s->p2p_sent = calloc((size_t)n, sizeof(uint32_t));
    s->p2p_recv = calloc((size_t)n, sizeof(uint32_t));
    size_t ctl_off = sizeof(shm_hdr);
    size_t chan_off = ctl_off + (size_t)n * sizeof(shm_ctl);
    size_t slot_off = (chan_off + (size_t)n * n * sizeof(shm_chan) + 4095) & ~(size_t)4095;
    size_t p2p_off = slot_off + (size_t)n * 2 * s->H;
    size_t total = p2p_off + (size_t)n * n * 2 * s->P;
    char key[160];
    snprintf(key, sizeof key, "%sg%d/shm", pg->prefix, gid);
    int fd = -1;
    ct_status st = CT_OK;
    if (rank == 0) {
        char hex[40];
        ct_random_hex(hex, 12);
        if (given) snprintf(s->name, sizeof s->name, "%s", given);
        else snprintf(s->name, sizeof s->name, "/ctrain-%s-%s", pg->runid, hex);
        /* A segment larger than /dev/shm maps fine and then kills the rank with SIGBUS at the
         * first page that does not fit: check the free space, then reserve every page. */
        struct statvfs vs;
        if (!statvfs("/dev/shm", &vs) && (double)vs.f_bavail * (double)vs.f_frsize < (double)total) {
            st = ct_error(CT_ERR_SYSTEM,
                          "/dev/shm has %.1f MiB free, the shm backend needs %.1f MiB for %d ranks (CTRAIN_SHM_CHUNK %zu "
                          "KiB): enlarge /dev/shm (docker run --shm-size) or lower CTRAIN_SHM_CHUNK",
                          (double)vs.f_bavail * (double)vs.f_frsize / 1048576.0, (double)total / 1048576.0, n,
                          s->H >> 10);
            goto fail_tell;
        }
        fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0) { st = ct_error(CT_ERR_SYSTEM, "shm_open %s: %s", s->name, strerror(errno)); goto fail_tell; }
        int e = 0;
        if (ftruncate(fd, (off_t)total)) {
            st = ct_error(CT_ERR_SYSTEM, "ftruncate %s to %zu bytes: %s", s->name, total, strerror(errno));
            goto fail_tell;
        }
        if ((e = posix_fallocate(fd, 0, (off_t)total))) {
            st = ct_error(CT_ERR_SYSTEM, "cannot reserve %.1f MiB in /dev/shm for %d ranks: %s: enlarge /dev/shm (docker "
                          "run --shm-size) or lower CTRAIN_SHM_CHUNK", (double)total / 1048576.0, n, strerror(e));
            goto fail_tell;
        }
    } else {
        void *v = NULL;
        st = given ? CT_OK : ct_store_get(pg->world->store, key, timeout, &v, NULL);
        if (st) { st = ct_error(st, "rendezvous: %s (is rank 0 of group %d running?)", ct_last_error(), gid); goto fail; }
        if (v && ((char *)v)[0] == '!') { /* rank 0 could not create it: its reason, not a timeout */
            st = ct_error(CT_ERR_PEER, "rank 0 of group %d could not create the shared segment: %s", gid, (char *)v + 1);
            free(v);
            goto fail;
        }
        snprintf(s->name, sizeof s->name, "%s", given ? given : (char *)v);
        free(v);
        fd = shm_open(s->name, O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0) { st = ct_error(CT_ERR_SYSTEM, "shm_open %s: %s", s->name, strerror(errno)); goto fail; }
        struct stat sb;
        if (fstat(fd, &sb) || (size_t)sb.st_size != total) {
            st = ct_error(CT_ERR_MISMATCH, "segment %s has %lld bytes, expected %zu (CTRAIN_SHM_CHUNK differs between ranks?)",
                          s->name, (long long)sb.st_size, total);
            goto fail;
        }
    }
    s->base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    fd = -1;
    if (s->base == MAP_FAILED) { s->base = NULL; st = ct_error(CT_ERR_SYSTEM, "mmap: %s", strerror(errno)); goto fail; }
    s->map_bytes = total;
    s->hdr = (shm_hdr *)s->base;
    s->ctl = (shm_ctl *)(s->base + ctl_off);
    s->chan = (shm_chan *)(s->base + chan_off);
    s->slots = s->base + slot_off;
    s->p2p = s->base + p2p_off;
    s->ctl[rank].pid = getpid();
    if (rank == 0) {
        s->hdr->magic = SHM_MAGIC;
        s->hdr->nranks = (uint32_t)n;
        s->hdr->H = s->H;
        s->hdr->P = s->P;
        s->hdr->total = total;
        if (given) goto done; /* the caller unlinks once every rank attached */
        if (n > 1) {
            st = ct_store_set(pg->world->store, key, s->name, strlen(s->name));
            if (st) goto fail;
            /* wait for everyone to map it, then unlink: nothing is left in /dev/shm even if a rank is killed */
            char k2[170];
            snprintf(k2, sizeof k2, "%sattached", key);
            void *v = NULL;
            st = ct_store_get(pg->world->store, k2, timeout, &v, NULL);
            free(v);
            if (st) { st = ct_error(st, "rendezvous: not every rank of group %d attached: %s", gid, ct_last_error()); goto fail; }
        }
        shm_unlink(s->name);
    } else {
        if (s->hdr->magic != SHM_MAGIC || s->hdr->nranks != (uint32_t)n) {
            st = ct_error(CT_ERR_MISMATCH, "segment %s is for %u ranks, this group has %d", s->name, s->hdr->nranks, n);
            goto fail;
        }
        if (given) goto done;
        char k2[170];
        int64_t v = 0;
        snprintf(k2, sizeof k2, "%sn", key);
        st = ct_store_add(pg->world->store, k2, 1, &v);
        if (st) goto fail;
        if (v == n - 1) {
            snprintf(k2, sizeof k2, "%sattached", key);
            st = ct_store_set(pg->world->store, k2, "1", 1);
            if (st) goto fail;
        }
    }
done:
    CT_LOG_INFO("shm", "group %d: segment %s, %zu KiB (staging %zu KiB x 2 per rank, small path <= %zu B), spin %.0f us",
                gid, s->name, total >> 10, s->H >> 10, s->small_max, s->spin_s * 1e6);
    *out = s;
    return CT_OK;
fail_tell:
    if (n > 1 && !given) { /* the others wait for the segment's name: give them the reason instead */
        char msg[700];
        snprintf(msg, sizeof msg, "!%s", ct_last_error());
        ct_store_set(pg->world->store, key, msg, strlen(msg));
        ct_error(st, "%s", msg + 1);
    }
fail:
    if (fd >= 0) close(fd);
    if (rank == 0 && s->name[0] && !given) shm_unlink(s->name);
    shm_destroy(s);
    return st;
}

ct_status ct_shm_create(ct_pg *pg, void **impl_out) {
    return shm_setup(pg, pg->rank, pg->size, pg->granks, 0, pg->timeout, pg->fingerprint, pg->local_size, NULL, impl_out);
}

ct_status ct_shm_create_named(ct_pg *pg, const char *name, void **impl_out) {
    return shm_setup(pg, pg->rank, pg->size, pg->granks, pg->gid, pg->timeout, pg->fingerprint, pg->local_size, name,
                     impl_out);
}

static ct_status shm_new_group(ct_pg *parent, ct_pg *child, const int *ranks, int n, int my_rank, void **impl_out) {
    (void)ranks;
    (void)n;
    *impl_out = NULL;
    if (my_rank < 0) return CT_OK;
    return shm_setup(parent, my_rank, child->size, child->granks, child->gid, child->timeout, child->fingerprint,
                     child->local_size, NULL, impl_out);
}

const ct_backend ct_shm_backend = {"shm", shm_run, shm_new_group, shm_destroy, shm_alloc_shared, shm_free_shared,
                                  shm_shared_peer, NULL};

void ct_shm_abort(void *impl, ct_status st, const char *msg) {
    if (impl) shm_fail(impl, st, "%s", msg);
}
