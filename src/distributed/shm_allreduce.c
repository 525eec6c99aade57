/* shm all-reduce and reduce.
 *
 * Small messages (<= CTRAIN_SHM_SMALL bytes, default 16 KiB): every rank copies its buffer
 * into its staging slot, posts once, and reduces all slots itself in rank order.
 *   cost: 1 synchronisation; per rank reads n*B, writes 2B.
 *
 * Large messages: reduce-scatter then all-gather through the staging slots, in rounds of at
 * most H bytes (CTRAIN_SHM_CHUNK, default 1 MiB for up to 4 ranks, alternating halves so a round can start
 * while peers still read the previous one). In a round each chunk is split in n parts;
 *   A. rank r copies every part except its own into its slot            (writes (n-1)/n B)
 *   B. rank r reduces part r over ranks 0..n-1 in that order, reading its own part from its
 *      buffer and the others from the peers' slots, writing the sum into its buffer and
 *      into its slot                                                     (reads B, writes 2B/n)
 *   C. rank r copies the other parts' sums from the peers' slots         (reads/writes (n-1)/n B)
 *   cost: 2 synchronisations per round; per rank about 2B read + 2B written, the minimum
 *   for a copy-in/copy-out scheme. The summation order is fixed by rank, so every rank gets
 *   bit-identical results whatever the timing.
 * reduce(root) is the same with only the root writing its buffer (others leave theirs intact).
 *
 * All-reduces from 32 KiB may go through cross-memory attach (shm_cma.c) where the kernel
 * allows it: the same reduction in 2 synchronisations instead of 2 per round, with no staging
 * copies, chosen per message size where it measures faster than the rounds.
 */
#include "distributed/shm.h"

#include <immintrin.h>
#include <string.h>

/* out (and out2) = src[0] op src[1] op ... op src[n-1]; acc is scratch that may alias out2. */
void shm_reduce_sources(ct_dtype dt, ct_reduce_op op, int n, const void *const *src, void *acc, void *out,
                           void *out2, size_t cnt) {
    int div = op == CT_RED_AVG ? n : 0;
    size_t esz = ct_dtype_size(dt);
    if (n == 1) {
        if (out != src[0]) memmove(out, src[0], cnt * esz);
        if (out2 && out2 != src[0]) memmove(out2, src[0], cnt * esz);
        return;
    }
    const void *prev = src[0];
    for (int r = 1; r < n; r++) {
        if (r == n - 1) ct_reduce2(dt, op, out, out2, prev, src[r], cnt, div);
        else {
            ct_reduce2(dt, op, acc, NULL, prev, src[r], cnt, 0);
            prev = acc;
        }
    }
}

static ct_status allreduce_small(shm_pg *s, ct_work *w, double deadline) {
    size_t esz = ct_dtype_size(w->dt), bytes = w->count * esz;
    int root = w->kind == CT_OP_REDUCE ? w->peer : -1;
    int b = (int)(s->round++ & 1);
    memcpy(shm_slot(s, s->rank, b), w->rbuf, bytes);
    shm_post(s);
    ct_status st = shm_wait_all(s, deadline, 1);
    if (st) return st;
    if (root >= 0 && root != s->rank) return CT_OK;
    const void *src[256];
    for (int r = 0; r < s->n; r++) src[r] = shm_slot(s, r, b);
    /* the accumulator is this rank's own buffer: all sources are slots */
    shm_reduce_sources(w->dt, w->rop, s->n, src, w->rbuf, w->rbuf, NULL, w->count);
    return CT_OK;
}

/* Cross-memory attach is a candidate from 32 KiB (and past the small path): below that its
 * 2(n-1) system calls cost more than one staged round. It is not held back to messages over
 * one round (CTRAIN_SHM_CHUNK): on an Intel Xeon (family 6, model 207) it ran 64 KiB-1 MiB at
 * 6.5-12 GB/s where the single staged round ran 2.8-5.8, while on Zen 4 the round wins there;
 * shm_allreduce_large measures which, per size class. */
#define SHM_CMA_MIN_BYTES ((size_t)32 << 10)

/* All-reduce of at most SHM_TINY_BYTES: every rank writes its input and its description into
 * its ctl[].tiny line, stores the op's sequence number last, posts, and reads the peers'
 * lines as soon as their sequence number shows — one cache-line transfer per peer, where the
 * small path reads the post, the fingerprint and the slot (three: 0.50 us for 8 B on an Intel
 * Xeon, Open MPI's fast boxes 0.48). The same rank-order reduction as the small path, so the
 * same bits. Lines alternate by tiny-op parity: a rank writes line b again only two tiny ops
 * later, after every peer posted the op between, which it does only once done reading.
 * A peer not there within a short spin (at once when ranks outnumber CPUs) is waited for as
 * in every collective (sleep, timeout, abort, fingerprints). */
static ct_status allreduce_tiny(shm_pg *s, ct_work *w, double deadline) {
    int b = (int)(s->tiny_round++ & 1), n = s->n;
    shm_tiny *mine = &s->ctl[s->rank].tiny[b];
    size_t bytes = w->count * ct_dtype_size(w->dt);
    memcpy(mine->data, w->rbuf, bytes);
    mine->kind = (uint8_t)w->kind;
    mine->dt = (uint8_t)w->dt;
    mine->rop = (uint8_t)w->rop;
    mine->count = (uint32_t)w->count;
    atomic_store_explicit(&mine->seq, w->seq, memory_order_release);
    shm_post(s);
    int seen = 1;
    for (int p = 0; p < n && seen; p++) {
        if (p == s->rank) continue;
        unsigned polls = s->oversub ? 0 : 512;
        for (;;) {
            if (atomic_load_explicit(&s->ctl[p].tiny[b].seq, memory_order_acquire) == w->seq) break;
            if (polls-- == 0) { seen = 0; break; }
            _mm_pause();
        }
    }
    s->st_waits++;
    ct_status st;
    if (!seen && (st = shm_wait_all(s, deadline, 1))) return st;
    s->st_spun += seen;
    const void *src[256];
    for (int p = 0; p < n; p++) {
        const shm_tiny *t = &s->ctl[p].tiny[b];
        /* the fingerprint in one line; a disagreement is then named by the full check */
        if (atomic_load_explicit(&t->seq, memory_order_acquire) != w->seq || t->kind != mine->kind ||
            t->dt != mine->dt || t->rop != mine->rop || t->count != mine->count) {
            if (seen && (st = shm_wait_all(s, deadline, 1))) return st;
            return shm_fail(s, CT_ERR_MISMATCH, "collective mismatch: rank %d's all_reduce #%u (%u elements) met rank %d's "
                            "tiny all_reduce #%u (%u elements)", s->granks[s->rank], w->seq, (unsigned)w->count,
                            s->granks[p], (unsigned)atomic_load(&t->seq), (unsigned)t->count);
        }
        src[p] = t->data;
    }
    shm_reduce_sources(w->dt, w->rop, n, src, w->rbuf, w->rbuf, NULL, w->count);
    return CT_OK;
}

/* Ranks outnumbering the CPUs keep a message of one staged round on the staged path: there
 * both paths synchronise twice, and cross-memory attach ran slower (4 ranks on 2 cores of a
 * Zen 4, 1 MiB: 1.9-4.0 GB/s against the round's 5.6-8.7, 8 runs each), so the chooser's
 * trials of it only cost: 5 of a short run's 69 calls made the default 25% slower than the
 * staged path alone (median 5.8 against 7.7 GB/s, 12 runs each). Larger messages, where
 * cross-memory attach saves the rounds' synchronisations, are still measured. */
ct_status shm_allreduce(shm_pg *s, ct_work *w, double deadline) {
    size_t bytes = w->count * ct_dtype_size(w->dt);
    if (w->kind == CT_OP_ALLREDUCE && s->cma && bytes > s->small_max && bytes >= SHM_CMA_MIN_BYTES && s->n <= 256 &&
        !(s->oversub && bytes <= s->H))
        return shm_allreduce_large(s, w, deadline);
    return shm_allreduce_staged(s, w, deadline);
}

ct_status shm_allreduce_staged(shm_pg *s, ct_work *w, double deadline) {
    shm_fp_begin(s, w);
    size_t esz = ct_dtype_size(w->dt), bytes = w->count * esz;
    if (s->n > 256) return ct_error(CT_ERR_UNSUPPORTED, "shm all-reduce supports up to 256 ranks");
    if (w->kind == CT_OP_ALLREDUCE && bytes <= SHM_TINY_BYTES) {
        CT_LOG_TRACE("shm", "all_reduce #%u: tiny path, %zu B", w->seq, bytes);
        return allreduce_tiny(s, w, deadline);
    }
    if (bytes <= s->small_max) {
        CT_LOG_TRACE("shm", "%s #%u: small path, %zu B", ct_op_name(w->kind), w->seq, bytes);
        return allreduce_small(s, w, deadline);
    }
    CT_LOG_TRACE("shm", "%s #%u: reduce-scatter + all-gather, %zu B in rounds of %zu B", ct_op_name(w->kind), w->seq,
                 bytes, s->H);
    int root = w->kind == CT_OP_REDUCE ? w->peer : -1;
    int writes = root < 0 || root == s->rank; /* does this rank's buffer receive the result? */
    uint8_t *buf = w->rbuf;
    int n = s->n, me = s->rank;
    /* elements per round: n parts of pe elements each fit in H */
    size_t cap = s->H / esz;
    size_t align = 64 / esz;
    cap = cap / ((size_t)n * align) * ((size_t)n * align);
    if (cap == 0) /* shm_setup sizes H for n parts of a line each: never here, but never a loop that cannot advance */
        return ct_error(CT_ERR_INVALID, "shm all-reduce: chunk of %zu bytes too small for %d ranks", s->H, n);
    int first = 1;
    for (size_t off = 0; off < w->count; off += cap) {
        size_t ce = w->count - off < cap ? w->count - off : cap;
        size_t pe = shm_part(ce, n, esz);
        int b = (int)(s->round++ & 1);
        uint8_t *mine = shm_slot(s, me, b);
        /* A: stage the parts the peers reduce */
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            size_t lo = (size_t)p * pe, hi = lo + pe < ce ? lo + pe : ce;
            if (lo < hi) memcpy(mine + lo * esz, buf + (off + lo) * esz, (hi - lo) * esz);
        }
        ct_status st = shm_round(s, deadline, &first);
        if (st) return st;
        /* B: reduce my part in rank order */
        size_t lo = (size_t)me * pe, hi = lo + pe < ce ? lo + pe : ce;
        if (lo < hi) {
            const void *src[256];
            for (int r = 0; r < n; r++) src[r] = r == me ? buf + (off + lo) * esz : shm_slot(s, r, b) + lo * esz;
            void *acc = mine + lo * esz; /* unused by the peers: my own part */
            if (writes && root < 0) shm_reduce_sources(w->dt, w->rop, n, src, acc, buf + (off + lo) * esz, acc, hi - lo);
            else if (writes) shm_reduce_sources(w->dt, w->rop, n, src, acc, buf + (off + lo) * esz, NULL, hi - lo);
            else shm_reduce_sources(w->dt, w->rop, n, src, acc, acc, NULL, hi - lo);
        }
        shm_post(s);
        st = shm_wait_all(s, deadline, 0);
        if (st) return st;
        /* C: collect the other parts' results */
        if (writes) {
            for (int p = 0; p < n; p++) {
                if (p == me) continue;
                size_t l = (size_t)p * pe, h = l + pe < ce ? l + pe : ce;
                if (l < h) memcpy(buf + (off + l) * esz, shm_slot(s, p, b) + l * esz, (h - l) * esz);
            }
        }
    }
    return CT_OK;
}
