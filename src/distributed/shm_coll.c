/* shm broadcast, all-gather, reduce-scatter, all-to-all and barrier. Each runs in rounds
 * through the staging slots (H bytes per rank, halves alternating), one post per round:
 * a rank writes its slot, posts, waits for all peers, then reads theirs; the next round's
 * post proves to the peers that this rank has finished reading.
 *
 *   broadcast       B bytes: root writes B, every other rank reads B.       rounds: B/H
 *   all_gather      B per rank: each writes B, reads (n-1)B.               rounds: B/H
 *   reduce_scatter  nB in, B out: each writes (n-1)B, reads (n-1)B, reduces in rank order.
 *                                                                            rounds: nB/H
 *   all_to_all      nB in, nB out: each writes nB, reads nB.                rounds: nB/H
 *   barrier         one post, one wait.
 */
#include "distributed/shm.h"

#include <string.h>

ct_status shm_barrier(shm_pg *s, ct_work *w, double deadline) {
    shm_fp_begin(s, w);
    s->round++;
    shm_post(s);
    return shm_wait_all(s, deadline, 1);
}

ct_status shm_broadcast(shm_pg *s, ct_work *w, double deadline) {
    shm_fp_begin(s, w);
    size_t esz = ct_dtype_size(w->dt), bytes = w->count * esz;
    uint8_t *buf = w->rbuf;
    int first = 1;
    size_t off = 0;
    do {
        size_t m = bytes - off < s->H ? bytes - off : s->H;
        int b = (int)(s->round++ & 1);
        if (s->rank == w->peer && m) memcpy(shm_slot(s, s->rank, b), buf + off, m);
        ct_status st = shm_round(s, deadline, &first);
        if (st) return st;
        if (s->rank != w->peer && m) memcpy(buf + off, shm_slot(s, w->peer, b), m);
        off += m;
    } while (off < bytes);
    return CT_OK;
}

ct_status shm_allgather(shm_pg *s, ct_work *w, double deadline) {
    shm_fp_begin(s, w);
    size_t esz = ct_dtype_size(w->dt), bytes = w->count * esz;
    const uint8_t *send = w->sbuf;
    uint8_t *recv = w->rbuf;
    int first = 1;
    size_t off = 0;
    do {
        size_t m = bytes - off < s->H ? bytes - off : s->H;
        int b = (int)(s->round++ & 1);
        if (m) memcpy(shm_slot(s, s->rank, b), send + off, m);
        ct_status st = shm_round(s, deadline, &first);
        if (st) return st;
        for (int p = 0; p < s->n && m; p++)
            memmove(recv + (size_t)p * bytes + off, shm_slot(s, p, b), m); /* own part too: send may alias recv */
        off += m;
    } while (off < bytes);
    return CT_OK;
}

ct_status shm_reduce_scatter(shm_pg *s, ct_work *w, double deadline) {
    shm_fp_begin(s, w);
    size_t esz = ct_dtype_size(w->dt);
    int n = s->n, me = s->rank;
    if (n > 256) return ct_error(CT_ERR_UNSUPPORTED, "shm reduce-scatter supports up to 256 ranks");
    const uint8_t *send = w->sbuf;
    uint8_t *recv = w->rbuf;
    size_t blk = w->count * esz;                     /* bytes per rank block */
    size_t cap = (s->H / (size_t)n) / 64 * 64 / esz; /* elements per part per round */
    int first = 1;
    size_t off = 0;
    do {
        size_t ce = w->count - off < cap ? w->count - off : cap;
        int b = (int)(s->round++ & 1);
        uint8_t *mine = shm_slot(s, me, b);
        size_t part = cap * esz;
        for (int p = 0; p < n; p++)
            if (p != me && ce) memcpy(mine + (size_t)p * part, send + (size_t)p * blk + off * esz, ce * esz);
        ct_status st = shm_round(s, deadline, &first);
        if (st) return st;
        if (ce) {
            const void *src[256];
            for (int r = 0; r < n; r++)
                src[r] = r == me ? send + (size_t)me * blk + off * esz : shm_slot(s, r, b) + (size_t)me * part;
            void *acc = mine + (size_t)me * part;
            /* same pass structure as all-reduce's part reduction */
            int div = w->rop == CT_RED_AVG ? n : 0;
            if (n == 1) memmove(recv + off * esz, src[0], ce * esz);
            const void *prev = src[0];
            for (int r = 1; r < n; r++) {
                if (r == n - 1) ct_reduce2(w->dt, w->rop, recv + off * esz, NULL, prev, src[r], ce, div);
                else { ct_reduce2(w->dt, w->rop, acc, NULL, prev, src[r], ce, 0); prev = acc; }
            }
        }
        off += ce;
    } while (off < w->count);
    return CT_OK;
}

ct_status shm_alltoall(shm_pg *s, ct_work *w, double deadline) {
    shm_fp_begin(s, w);
    size_t esz = ct_dtype_size(w->dt);
    int n = s->n, me = s->rank;
    const uint8_t *send = w->sbuf;
    uint8_t *recv = w->rbuf;
    size_t blk = w->count * esz;
    size_t part = (s->H / (size_t)n) / 64 * 64;
    size_t cap = part / esz;
    int first = 1;
    size_t off = 0;
    do {
        size_t ce = w->count - off < cap ? w->count - off : cap;
        int b = (int)(s->round++ & 1);
        uint8_t *mine = shm_slot(s, me, b);
        for (int p = 0; p < n && ce; p++) memcpy(mine + (size_t)p * part, send + (size_t)p * blk + off * esz, ce * esz);
        ct_status st = shm_round(s, deadline, &first);
        if (st) return st;
        for (int p = 0; p < n && ce; p++)
            memcpy(recv + (size_t)p * blk + off * esz, shm_slot(s, p, b) + (size_t)me * part, ce * esz);
        off += ce;
    } while (off < w->count);
    return CT_OK;
}
