/* shm all-reduce of large private buffers through cross-memory attach (process_vm_readv /
 * process_vm_writev), as Open MPI's vader does for large messages.
 *
 * The staged path (shm_allreduce.c) needs 2 synchronisations per CTRAIN_SHM_CHUNK round: a
 * 64 MiB all-reduce waits 512 times for the peers, and where a peer is descheduled or asleep
 * each wait costs a wake-up (docs/bench/collectives.md). Here every rank reads and writes the
 * peers' buffers itself, so the whole message takes 2:
 *   1. publish the buffer's address, post, wait for every rank (fingerprints checked);
 *   2. rank r reduces part r (the staged path's split) in pieces of cma_chunk bytes: reads
 *      the peers' piece into scratch, reduces in rank order with shm_reduce_sources — the
 *      staged path's arithmetic, so the same bits — into its own buffer, and writes the sum
 *      into every peer's buffer;
 *   3. post, wait for every rank: only then is every part everywhere.
 *   cost per rank: reads (n-1)/n B from peers, writes (n-1)/n B to them (kernel copies), one
 *   reduction pass over B/n; no staging copies.
 * Whether the kernel allows it (ptrace rules, seccomp) is probed at the first such all-reduce,
 * with one extra synchronisation; if any rank cannot, every rank uses the staged path.
 *
 * Which path is faster depends on the machine (docs/bench/collectives.md): on a quiet VM the
 * staged rounds ran 16 MiB at 7.6-8.6 GB/s and this path at 4.4-5.3 (the kernel pins every
 * page it copies); under load the rounds' 2 waits per 256 KiB each cost a wake-up and the
 * staged path fell to 0.01 GB/s where this one kept 0.35. So unless CTRAIN_SHM_CMA is set,
 * shm_allreduce_large measures both per size class and uses the faster (cma_plan). */
#include "distributed/shm.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

/* Copies `len` bytes between this process at `local` and rank p's at `remote`; 0 or errno. */
static int cma_copy(shm_pg *s, int p, void *local, uint64_t remote, size_t len, int write) {
    while (len) {
        struct iovec l = {local, len}, r = {(void *)(uintptr_t)remote, len};
        ssize_t k = write ? process_vm_writev(s->ctl[p].pid, &l, 1, &r, 1, 0) : process_vm_readv(s->ctl[p].pid, &l, 1, &r, 1, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (k == 0) return EFAULT;
        local = (uint8_t *)local + k;
        remote += (uint64_t)k;
        len -= (size_t)k;
    }
    return 0;
}

/* After step 1 of the first large all-reduce: can this rank read every peer's buffer? The
 * answers travel in ctl[].cma_ok with one more post; all ranks reach the same decision. */
static ct_status cma_probe(shm_pg *s, uint64_t const *addr, double deadline) {
    int ok = 1;
    if (!s->cma_tmp) s->cma_tmp = aligned_alloc(64, s->cma_chunk * (size_t)s->n);
    if (!s->cma_tmp) ok = 0;
    for (int p = 0; p < s->n && ok; p++)
        if (p != s->rank && cma_copy(s, p, s->cma_tmp, addr[p], 64, 0)) ok = 0;
    s->ctl[s->rank].cma_ok = ok ? 1 : 2;
    shm_post(s);
    ct_status st = shm_wait_all(s, deadline, 0);
    if (st) return st;
    s->cma = 1;
    for (int p = 0; p < s->n; p++)
        if (s->ctl[p].cma_ok != 1) s->cma = 0;
    CT_LOG_INFO("shm", "group %d: large all-reduces %s (pieces of %zu KiB)", s->gid,
                s->cma ? "through cross-memory attach" : "staged: some rank cannot use process_vm_readv",
                s->cma_chunk >> 10);
    return CT_OK;
}

static ct_status allreduce_cma(shm_pg *s, ct_work *w, double deadline) {
    int n = s->n, me = s->rank;
    size_t esz = ct_dtype_size(w->dt);
    uint8_t *buf = w->rbuf;
    shm_fp_begin(s, w);
    if (s->fingerprint) s->ctl[me].fp[w->seq & 1].zc = SHM_ZC_CMA;
    s->ctl[me].cma_addr[w->seq & 1] = (uint64_t)(uintptr_t)buf;
    CT_LOG_TRACE("shm", "all_reduce #%u: cross-memory attach, %zu B", w->seq, w->count * esz);
    /* 1: my buffer holds my input; peers may read it and write their parts' sums into it */
    shm_post(s);
    double t0 = ct_time_now();
    ct_status st = shm_wait_all(s, deadline, 1);
    s->wait1_s = ct_time_now() - t0;
    if (st) return st;
    uint64_t addr[256];
    for (int p = 0; p < n; p++) addr[p] = s->ctl[p].cma_addr[w->seq & 1];
    if (s->cma < 0) {
        if ((st = cma_probe(s, addr, deadline))) return st;
        if (!s->cma) return shm_allreduce_staged(s, w, deadline);
    }
    /* 2: my part, in rank order, piece by piece */
    size_t pe = shm_part(w->count, n, esz), lo = (size_t)me * pe, hi = lo + pe < w->count ? lo + pe : w->count;
    size_t piece = s->cma_chunk / esz;
    uint8_t *acc = s->cma_tmp + (size_t)me * s->cma_chunk; /* my slot of the scratch: the partial sums */
    for (size_t c = lo; c < hi; c += piece) {
        size_t m = hi - c < piece ? hi - c : piece, off = c * esz;
        const void *src[256];
        for (int p = 0; p < n; p++) {
            if (p == me) { src[p] = buf + off; continue; }
            uint8_t *t = s->cma_tmp + (size_t)p * s->cma_chunk;
            int e = cma_copy(s, p, t, addr[p] + off, m * esz, 0);
            if (e) return shm_fail(s, CT_ERR_PEER, "all-reduce: reading rank %d's buffer: %s", s->granks[p], strerror(e));
            src[p] = t;
        }
        shm_reduce_sources(w->dt, w->rop, n, src, acc, buf + off, NULL, m);
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            int e = cma_copy(s, p, buf + off, addr[p] + off, m * esz, 1);
            if (e) return shm_fail(s, CT_ERR_PEER, "all-reduce: writing rank %d's buffer: %s", s->granks[p], strerror(e));
        }
    }
    /* 3: complete once every part is everywhere; afterwards nobody touches my buffer */
    s->in_op = 1;
    shm_post(s);
    return shm_wait_all(s, deadline, 0);
}

/* Rank 0's plan for the next large all-reduce: bit c set = size class c goes through
 * cross-memory attach. Each class uses the path with the lower measured cost; the other is
 * tried again after cma_every[c] calls of the class (first 2: both paths are still warming
 * up; then doubling while it stays slower, 8x when it was over 4x slower, at most 1024 calls;
 * 8 again once it measured faster), so a change in the machine's load is seen without paying
 * often for the slow path. */
static uint64_t cma_plan(shm_pg *s) {
    uint64_t m = 0;
    for (int c = 0; c < 64; c++) {
        float st = s->cma_cost[0][c], cm = s->cma_cost[1][c];
        int fast = !(st > 0 && (cm <= 0 || st < cm)); /* unmeasured: cross-memory attach */
        int use = fast;
        if (cm > 0 && st <= 0) use = 0; /* the staged rounds not yet measured in this class */
        else if (cm > 0 && st > 0 && s->cma_since[c] >= s->cma_every[c]) {
            use = !fast;
            s->cma_since[c] = 0;
        }
        m |= (uint64_t)use << c;
    }
    return m;
}

/* Rank 0: path p took `sec` for `bytes` in class c. */
static void cma_record(shm_pg *s, int c, int p, size_t bytes, double sec) {
    float x = (float)(sec / (double)bytes), *cost = &s->cma_cost[p][c], other = s->cma_cost[!p][c];
    int was_fast = other <= 0 || (*cost > 0 && *cost <= other);
    /* The path in use keeps a running mean. A path tried again after a pause takes the new
     * sample as it is: its mean is old, and its first calls carried one-time costs (the probe,
     * first touches of the scratch and of the peers' pages: 2-3x its later calls for 16 MiB
     * through cross-memory attach on an Intel Xeon), which a mean kept for hundreds of calls.
     * A sample under half of the mean replaces it too (the machine got quieter). */
    int retried = other > 0 && !was_fast;
    *cost = *cost > 0 && !retried && x >= 0.5f * *cost ? 0.7f * *cost + 0.3f * x : x;
    if (s->cma_every[c] == 0) s->cma_every[c] = 2;
    if (retried) { /* the slower path, tried again */
        if (*cost < other) s->cma_every[c] = 8; /* it is now the faster one */
        else {
            unsigned e = s->cma_every[c] * (*cost > 4 * other ? 8u : 2u);
            s->cma_every[c] = (uint16_t)(e > 1024 ? 1024 : e);
        }
    }
    if (s->cma_since[c] < UINT16_MAX) s->cma_since[c]++;
}

ct_status shm_allreduce_large(shm_pg *s, ct_work *w, double deadline) {
    size_t bytes = w->count * ct_dtype_size(w->dt);
    int c = 63 - __builtin_clzll((unsigned long long)bytes), k = (int)(s->nlarge++ & 1);
    /* the plan for the next large all-reduce, published with this one's first post; every
     * rank reads it once this one is complete (by parity: rank 0 writes the other half next) */
    if (s->cma_adapt && s->rank == 0) s->ctl[0].cma_plan[k] = cma_plan(s);
    int use = s->cma < 0 || !s->cma_adapt || (s->cma_mask >> c & 1);
    double t0 = ct_time_now();
    s->wait1_s = 0;
    ct_status st = use ? allreduce_cma(s, w, deadline) : shm_allreduce_staged(s, w, deadline);
    s->st_large[use]++;
    if (st || !s->cma_adapt || !s->cma) return st;
    if (s->rank == 0) cma_record(s, c, use, bytes, ct_time_now() - t0 - s->wait1_s);
    s->cma_mask = s->ctl[0].cma_plan[k];
    return CT_OK;
}
