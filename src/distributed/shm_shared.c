/* shm backend: memory shared by the ranks (ct_pg_alloc_shared) and the in-place all-reduce
 * over it — DDP's zero-copy gradient reduction.
 *
 * An allocation is one segment of n regions, rank r's at r * stride, mapped by every rank.
 * An all-reduce of [off, off + count) inside it takes two posts on the group's counters (so
 * ordering, fingerprints, timeouts naming the missing ranks, dead-peer detection and abort
 * propagation are those of every other collective):
 *   1. post "my buffer is final"; wait for every rank's (fingerprints checked, including the
 *      offset and the allocation, so a rank on the staged path is a named mismatch);
 *   2. rank r reduces slice r over regions 0..n-1 in rank order — accumulating in region 0's
 *      slice, which nobody else touches now — and writes the result into every region;
 *   3. post "my slice is written"; wait for every rank's. Only then does the work complete:
 *      afterwards no peer reads or writes this rank's buffer, so it may be reused (zero_grad).
 *   cost: 2 synchronisations; per rank reads B, writes B (n = 2) — half of the staged path's
 *   traffic, and no copies. The summation order and arithmetic are those of the staged path
 *   (shm_allreduce.c), so results are bit-identical to it and independent of timing.
 */
#include "distributed/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

shm_shared *shm_find_shared(shm_pg *s, const void *buf, size_t bytes) {
    const uint8_t *p = buf;
    for (shm_shared *a = s->shared; a; a = a->next) {
        const uint8_t *mine = a->base + (size_t)s->rank * a->stride;
        if (p >= mine && p < mine + a->stride && bytes <= (size_t)(mine + a->stride - p)) return a;
    }
    return NULL;
}

/* o1 = o2 = (a + b) [/ div]: the f32 sum/avg case, explicitly vectorised because o1 aliases a
 * and o2 aliases b (the compiler's overlap checks would otherwise pick its scalar loop).
 * Division, not a reciprocal multiply, to match ct_reduce2 bit for bit. */
static void sum2_f32(float *o1, float *o2, const float *a, const float *b, size_t n, int div) {
    size_t i = 0;
#ifdef __AVX512F__
    __m512 d = _mm512_set1_ps((float)div);
    if (div > 1)
        for (; i + 16 <= n; i += 16) {
            __m512 r = _mm512_div_ps(_mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)), d);
            _mm512_storeu_ps(o1 + i, r);
            if (o2) _mm512_storeu_ps(o2 + i, r);
        }
    else
        for (; i + 16 <= n; i += 16) {
            __m512 r = _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));
            _mm512_storeu_ps(o1 + i, r);
            if (o2) _mm512_storeu_ps(o2 + i, r);
        }
#elif defined(__AVX__)
    __m256 d = _mm256_set1_ps((float)div);
    for (; i + 8 <= n; i += 8) {
        __m256 r = _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));
        if (div > 1) r = _mm256_div_ps(r, d);
        _mm256_storeu_ps(o1 + i, r);
        if (o2) _mm256_storeu_ps(o2 + i, r);
    }
#endif
    for (; i < n; i++) {
        float r = a[i] + b[i];
        if (div > 1) r = r / (float)div;
        o1[i] = r;
        if (o2) o2[i] = r;
    }
}

static void reduce2_any(ct_dtype dt, ct_reduce_op op, void *o1, void *o2, const void *a, const void *b, size_t n,
                        int div) {
    if (dt == CT_F32 && (op == CT_RED_SUM || op == CT_RED_AVG)) sum2_f32(o1, o2, a, b, n, div);
    else ct_reduce2(dt, op, o1, o2, a, b, n, div);
}

ct_status shm_allreduce_shared(shm_pg *s, shm_shared *a, ct_work *w, double deadline) {
    int n = s->n, me = s->rank;
    size_t esz = ct_dtype_size(w->dt);
    size_t off = (size_t)((uint8_t *)w->rbuf - (a->base + (size_t)me * a->stride));
    shm_fp_begin(s, w);
    if (s->fingerprint) s->ctl[me].fp[w->seq & 1].zc = ((uint64_t)(a->id + 1) << 40) | (uint64_t)off;
    CT_LOG_TRACE("shm", "all_reduce #%u: in place, %zu B at +%zu of shared allocation %u", w->seq, w->count * esz, off,
                 a->id);
    /* 1: this rank's buffer is final; peers may now read it and write results into it */
    shm_post(s);
    ct_status st = shm_wait_all(s, deadline, 1);
    if (st) return st;
    /* 2: reduce slice `me`, in chunks that keep region 0's partial sums in L1 when n > 2 */
    size_t pe = shm_part(w->count, n, esz), lo = (size_t)me * pe, hi = lo + pe < w->count ? lo + pe : w->count;
    int div = w->rop == CT_RED_AVG ? n : 0;
    size_t chunk = 16384 / esz;
    for (size_t c = lo; c < hi && n > 1; c += chunk) {
        size_t m = hi - c < chunk ? hi - c : chunk;
        uint8_t *src[256];
        for (int r = 0; r < n; r++) src[r] = a->base + (size_t)r * a->stride + off + c * esz;
        /* same passes as reduce_sources(): ((s0 op s1) op s2) ... op s(n-1), divided at the end */
        for (int r = 1; r < n - 1; r++) reduce2_any(w->dt, w->rop, src[0], NULL, src[0], src[r], m, 0);
        reduce2_any(w->dt, w->rop, src[0], src[n - 1], src[0], src[n - 1], m, div);
        for (int r = 1; r < n - 1; r++) memcpy(src[r], src[0], m * esz);
    }
    /* 3: every region holds slice `me`'s result; complete once all slices are everywhere */
    shm_post(s);
    return shm_wait_all(s, deadline, 0);
}

/* ------------------------------------------------------------------ allocation */
static void shared_key(const ct_pg *pg, const shm_pg *s, uint32_t id, const char *what, char *out, size_t n) {
    snprintf(out, n, "%sg%d/shared%u/%s", pg->prefix, s->gid, id, what);
}

/* Collective. Group rank 0 creates the segment and publishes its name ("!message" if it
 * could not); the others map it and count in; rank 0 unlinks it once all did (or one failed:
 * "attached" = "!message"). pg.c then agrees on success with an all-reduce. */
ct_status shm_alloc_shared(ct_pg *pg, void *impl, size_t bytes, void **mine) {
    shm_pg *s = impl;
    *mine = NULL;
    if (s->n > 256) return ct_error(CT_ERR_UNSUPPORTED, "shared allocations support up to 256 ranks");
    uint32_t id = s->nshared++;
    size_t stride = (bytes + 4095) & ~(size_t)4095;
    if (!stride) stride = 4096;
    size_t total = stride * (size_t)s->n;
    char key[200], akey[200], name[128];
    shared_key(pg, s, id, "name", key, sizeof key);
    shared_key(pg, s, id, "attached", akey, sizeof akey);
    ct_store *store = pg->world->store;
    int fd = -1;
    ct_status st = CT_OK;
    char err[400] = "";
    if (s->rank == 0) {
        char hex[40];
        ct_random_hex(hex, 12);
        snprintf(name, sizeof name, "/ctrain-%s-%s-m%u", pg->runid, hex, id);
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        int e = 0;
        if (fd < 0) snprintf(err, sizeof err, "shm_open %s: %s", name, strerror(errno));
        else if (ftruncate(fd, (off_t)total)) snprintf(err, sizeof err, "ftruncate %s to %zu bytes: %s", name, total, strerror(errno));
        /* reserve the pages now: on a full /dev/shm this fails here instead of SIGBUS later */
        else if ((e = posix_fallocate(fd, 0, (off_t)total)))
            snprintf(err, sizeof err, "cannot reserve %zu bytes of shared memory in /dev/shm: %s", total, strerror(e));
        if (s->n > 1 && store) {
            char v[420];
            snprintf(v, sizeof v, "%s%s", err[0] ? "!" : "", err[0] ? err : name);
            ct_store_set(store, key, v, strlen(v));
        }
        if (err[0]) { st = ct_error(CT_ERR_SYSTEM, "%s", err); goto fail; }
    } else {
        void *v = NULL;
        size_t len = 0;
        st = ct_store_get(store, key, pg->timeout, &v, &len);
        if (st) return ct_error(st, "shared allocation: rank 0 of the group never published it: %s", ct_last_error());
        snprintf(name, sizeof name, "%.*s", (int)len, (char *)v);
        free(v);
        if (name[0] == '!') return ct_error(CT_ERR_SYSTEM, "shared allocation failed on group rank 0: %s", name + 1);
        fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
        struct stat sb;
        if (fd < 0) snprintf(err, sizeof err, "shm_open %s: %s", name, strerror(errno));
        else if (fstat(fd, &sb) || (size_t)sb.st_size != total)
            snprintf(err, sizeof err, "shared segment %s has %lld bytes, expected %zu", name, (long long)sb.st_size, total);
    }
    uint8_t *base = NULL;
    if (!err[0]) {
        /* no MAP_POPULATE: pages are reserved (fallocate); faulting them in on first use keeps
         * the peak RSS of ct_params_set_grad_storage's copy at data + 2 x gradients */
        base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) { base = NULL; snprintf(err, sizeof err, "mmap %zu bytes: %s", total, strerror(errno)); }
    }
    if (fd >= 0) close(fd);
    fd = -1;
    if (s->rank != 0 && s->n > 1) {
        if (err[0]) {
            char v[420];
            snprintf(v, sizeof v, "!rank %d: %s", s->granks[s->rank], err);
            ct_store_set(store, akey, v, strlen(v)); /* wakes rank 0 at once */
        } else {
            char ckey[200];
            int64_t cnt = 0;
            shared_key(pg, s, id, "n", ckey, sizeof ckey);
            st = ct_store_add(store, ckey, 1, &cnt);
            if (st == CT_OK && cnt == s->n - 1) st = ct_store_set(store, akey, "1", 1);
            if (st) snprintf(err, sizeof err, "%s", ct_last_error());
        }
    } else if (s->rank == 0 && s->n > 1 && store) {
        /* unlink once everyone mapped it: nothing stays in /dev/shm even if a rank is killed */
        void *v = NULL;
        size_t len = 0;
        ct_status g = ct_store_get(store, akey, pg->timeout, &v, &len);
        if (g) snprintf(err, sizeof err, "not every rank mapped the shared allocation: %s", ct_last_error());
        else if (len && ((char *)v)[0] == '!') snprintf(err, sizeof err, "%.*s", (int)len - 1, (char *)v + 1);
        free(v);
    }
    if (s->rank == 0) shm_unlink(name);
    if (err[0]) {
        if (base) munmap(base, total);
        return ct_error(CT_ERR_SYSTEM, "shared allocation of %zu bytes per rank: %s", stride, err);
    }
    shm_shared *a = calloc(1, sizeof *a);
    if (!a) { munmap(base, total); return ct_error(CT_ERR_NOMEM, "shared allocation record"); }
    a->base = base;
    a->stride = stride;
    a->map_bytes = total;
    a->id = id;
    a->next = s->shared;
    s->shared = a;
    *mine = base + (size_t)s->rank * stride;
    CT_LOG_INFO("shm", "group %d: shared allocation %u, %zu KiB per rank x %d", s->gid, id, stride >> 10, s->n);
    return CT_OK;
fail:
    if (fd >= 0) close(fd);
    shm_unlink(name);
    return st;
}

void shm_free_shared(void *impl, void *mine) {
    shm_pg *s = impl;
    for (shm_shared **pa = &s->shared; *pa; pa = &(*pa)->next) {
        shm_shared *a = *pa;
        if ((uint8_t *)mine == a->base + (size_t)s->rank * a->stride) {
            *pa = a->next;
            munmap(a->base, a->map_bytes);
            free(a);
            return;
        }
    }
}

/* Reads the allocation list, which changes only with the queue drained (alloc/free), so the
 * caller's own thread may look it up without the comm thread's lock. */
void *shm_shared_peer(void *impl, void *p, int rank) {
    shm_pg *s = impl;
    if (rank < 0 || rank >= s->n) return NULL;
    shm_shared *a = shm_find_shared(s, p, 1);
    if (!a) return NULL;
    size_t off = (size_t)((uint8_t *)p - (a->base + (size_t)s->rank * a->stride));
    return a->base + (size_t)rank * a->stride + off;
}

void shm_free_all_shared(shm_pg *s) {
    while (s->shared) {
        shm_shared *a = s->shared;
        s->shared = a->next;
        munmap(a->base, a->map_bytes);
        free(a);
    }
}
