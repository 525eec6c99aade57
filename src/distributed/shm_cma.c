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
 * with one extra synchronisation; if any rank cannot, every rank uses the staged path. */
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

ct_status shm_allreduce_cma(shm_pg *s, ct_work *w, double deadline) {
    int n = s->n, me = s->rank;
    size_t esz = ct_dtype_size(w->dt);
    uint8_t *buf = w->rbuf;
    shm_fp_begin(s, w);
    if (s->fingerprint) s->ctl[me].fp[w->seq & 1].zc = SHM_ZC_CMA;
    s->ctl[me].cma_addr[w->seq & 1] = (uint64_t)(uintptr_t)buf;
    CT_LOG_TRACE("shm", "all_reduce #%u: cross-memory attach, %zu B", w->seq, w->count * esz);
    /* 1: my buffer holds my input; peers may read it and write their parts' sums into it */
    shm_post(s);
    ct_status st = shm_wait_all(s, deadline, 1);
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
