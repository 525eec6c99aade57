/* shm send/recv: one channel per ordered pair (src, dst) with two P-byte buffers (128 KiB).
 * The sender fills buffer k&1 once the receiver has consumed chunk k-2, then bumps `sent`;
 * the receiver waits for `sent`, checks the header (tag, dtype, count must match), copies,
 * bumps `acked`. Messages are matched in order per pair.
 *   cost: B written + B read per side, one wake-up per chunk at most. */
#include "distributed/shm.h"

#include <string.h>

ct_status shm_send(shm_pg *s, ct_work *w, double deadline) {
    s->cur = w;
    int d = w->peer;
    shm_chan *ch = shm_ch(s, s->rank, d);
    size_t esz = ct_dtype_size(w->dt), bytes = w->count * esz, off = 0;
    const uint8_t *src = w->sbuf;
    do {
        uint32_t k = s->p2p_sent[d];
        ct_status st = shm_wait_word(s, &ch->acked, k - 1, d, deadline);
        if (st == CT_ERR_TIMEOUT) {
            char t[CT_WORK_DESC];
            ct_work_describe(w, t, sizeof t);
            return shm_fail(s, st, "%s timed out: rank %d is not receiving", t, s->granks[d]);
        }
        if (st) return st;
        size_t m = bytes - off < s->P ? bytes - off : s->P;
        ch->hdr[k & 1] = (shm_msghdr){(uint32_t)w->tag, (uint32_t)w->dt, w->count};
        if (m) memcpy(shm_pbuf(s, s->rank, d, (int)(k & 1)), src + off, m);
        s->p2p_sent[d] = k + 1;
        shm_word_add(s, &ch->sent);
        off += m;
    } while (off < bytes);
    return CT_OK;
}

ct_status shm_recv(shm_pg *s, ct_work *w, double deadline) {
    s->cur = w;
    int src_rank = w->peer;
    shm_chan *ch = shm_ch(s, src_rank, s->rank);
    size_t esz = ct_dtype_size(w->dt), bytes = w->count * esz, off = 0;
    uint8_t *dst = w->rbuf;
    do {
        uint32_t k = s->p2p_recv[src_rank];
        ct_status st = shm_wait_word(s, &ch->sent, k + 1, src_rank, deadline);
        if (st == CT_ERR_TIMEOUT) {
            char t[CT_WORK_DESC];
            ct_work_describe(w, t, sizeof t);
            return shm_fail(s, st, "%s timed out: rank %d never sent", t, s->granks[src_rank]);
        }
        if (st) return st;
        shm_msghdr h = ch->hdr[k & 1];
        if (h.tag != (uint32_t)w->tag || h.dt != (uint32_t)w->dt || h.count != w->count) {
            char t[CT_WORK_DESC];
            ct_work_describe(w, t, sizeof t);
            return shm_fail(s, CT_ERR_MISMATCH, "p2p mismatch: rank %d posted %s but rank %d sent %s x %llu with tag %u",
                            s->granks[s->rank], t, s->granks[src_rank], ct_dtype_name((ct_dtype)h.dt),
                            (unsigned long long)h.count, h.tag);
        }
        size_t m = bytes - off < s->P ? bytes - off : s->P;
        if (m) memcpy(dst + off, shm_pbuf(s, src_rank, s->rank, (int)(k & 1)), m);
        s->p2p_recv[src_rank] = k + 1;
        shm_word_add(s, &ch->acked);
        off += m;
    } while (off < bytes);
    return CT_OK;
}
