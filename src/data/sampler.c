/* DistributedSampler with PyTorch's partition and, bit for bit, PyTorch's CPU randperm.
 *
 * The epoch's padded order is an infinite cyclic extension E[i] = perm[i % n] of the
 * permutation: PyTorch's padding (wrap to the start, repeatedly if needed) is exactly the
 * first total_size entries of E. Rank r's k-th index after starting at global position
 * `base` is E[base + r + k * R], which also gives the resume semantics for free. */
#include "ctrain/data.h"

#include <stdlib.h>
#include <string.h>

/* ---- MT19937, as at::mt19937 (std::mt19937 seeding, 32-bit outputs) ---- */
typedef struct { uint32_t s[624]; int i; } mt19937;

static void mt_seed(mt19937 *m, uint32_t seed) {
    m->s[0] = seed;
    for (int i = 1; i < 624; i++) m->s[i] = 1812433253u * (m->s[i - 1] ^ (m->s[i - 1] >> 30)) + (uint32_t)i;
    m->i = 624;
}

static uint32_t mt_next(mt19937 *m) {
    if (m->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (m->s[k] & 0x80000000u) | (m->s[(k + 1) % 624] & 0x7fffffffu);
            m->s[k] = m->s[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        m->i = 0;
    }
    uint32_t y = m->s[m->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

struct ct_sampler {
    ct_sampler_opts o;
    int64_t epoch;
    int64_t base;      /* global position the current epoch (re)started at */
    int64_t taken;     /* indices this rank drew since base */
    int64_t count;     /* indices this rank yields from base */
    bool resume_pending;
    int64_t perm_epoch; /* epoch perm holds; -1 = none (also when !shuffle) */
    bool perm_valid;
    uint32_t *p32;     /* permutation, when n <= 2^32 */
    int64_t *p64;      /* otherwise */
};

ct_sampler_opts ct_sampler_default_opts(void) {
    ct_sampler_opts o = {.n = 0, .num_replicas = 1, .rank = 0, .shuffle = true, .seed = 0, .drop_last = false};
    return o;
}

static int64_t count_from(const ct_sampler *s, int64_t base) {
    int64_t n = s->o.n, R = s->o.num_replicas;
    if (base >= n) return 0;
    int64_t m = n - base;
    return s->o.drop_last ? m / R : (m + R - 1) / R;
}

ct_status ct_sampler_create(const ct_sampler_opts *o, ct_sampler **out) {
    *out = NULL;
    if (o->n < 0) return ct_error(CT_ERR_INVALID, "sampler: dataset length %lld is negative", (long long)o->n);
    if (o->num_replicas < 1) return ct_error(CT_ERR_INVALID, "sampler: num_replicas %d must be >= 1", o->num_replicas);
    if (o->rank < 0 || o->rank >= o->num_replicas)
        return ct_error(CT_ERR_INVALID, "sampler: rank %d outside 0..%d", o->rank, o->num_replicas - 1);
    ct_sampler *s = calloc(1, sizeof *s);
    if (!s) return ct_error(CT_ERR_NOMEM, "sampler: out of memory");
    s->o = *o;
    if (o->shuffle && o->n > 0) {
        if ((uint64_t)o->n <= ((uint64_t)1 << 32)) s->p32 = malloc((size_t)o->n * sizeof *s->p32);
        else s->p64 = malloc((size_t)o->n * sizeof *s->p64);
        if (!s->p32 && !s->p64) {
            free(s);
            return ct_error(CT_ERR_NOMEM, "sampler: cannot allocate the permutation of %lld indices", (long long)o->n);
        }
    }
    ct_sampler_set_epoch(s, 0);
    *out = s;
    return CT_OK;
}

void ct_sampler_free(ct_sampler *s) {
    if (!s) return;
    free(s->p32);
    free(s->p64);
    free(s);
}

void ct_sampler_set_epoch(ct_sampler *s, int64_t epoch) {
    if (s->resume_pending && epoch == s->epoch && s->taken == 0) {
        s->resume_pending = false; /* keep the restored position */
        return;
    }
    s->resume_pending = false;
    s->epoch = epoch;
    s->base = 0;
    s->taken = 0;
    s->count = count_from(s, 0);
}

int64_t ct_sampler_epoch(const ct_sampler *s) { return s->epoch; }
int64_t ct_sampler_len(const ct_sampler *s) { return count_from(s, 0); }
int64_t ct_sampler_remaining(const ct_sampler *s) { return s->count - s->taken; }

/* torch.randperm(n, generator=g) on the CPU, g.manual_seed(seed + epoch). */
static void make_perm(ct_sampler *s) {
    int64_t n = s->o.n;
    mt19937 mt;
    mt_seed(&mt, (uint32_t)(s->o.seed + (uint64_t)s->epoch));
    if (s->p32) {
        uint32_t *r = s->p32;
        for (int64_t i = 0; i < n; i++) r[i] = (uint32_t)i;
        for (int64_t i = 0; i < n - 1; i++) {
            int64_t z = (int64_t)(mt_next(&mt) % (uint64_t)(n - i));
            uint32_t t = r[i];
            r[i] = r[z + i];
            r[z + i] = t;
        }
    } else {
        int64_t *r = s->p64;
        for (int64_t i = 0; i < n; i++) r[i] = i;
        for (int64_t i = 0; i < n - 1; i++) {
            int64_t z = (int64_t)(mt_next(&mt) % (uint64_t)(n - i));
            int64_t t = r[i];
            r[i] = r[z + i];
            r[z + i] = t;
        }
    }
    s->perm_epoch = s->epoch;
    s->perm_valid = true;
}

static inline int64_t at(const ct_sampler *s, int64_t pos) {
    int64_t i = pos % s->o.n;
    if (!s->o.shuffle) return i;
    return s->p32 ? (int64_t)s->p32[i] : s->p64[i];
}

int64_t ct_sampler_next_batch(ct_sampler *s, int64_t *out, int64_t max) {
    int64_t k = s->count - s->taken;
    if (k > max) k = max;
    if (k <= 0) return 0;
    if (s->o.shuffle && (!s->perm_valid || s->perm_epoch != s->epoch)) make_perm(s);
    int64_t R = s->o.num_replicas, pos = s->base + s->o.rank + s->taken * R;
    for (int64_t j = 0; j < k; j++, pos += R) out[j] = at(s, pos);
    s->taken += k;
    s->resume_pending = false;
    return k;
}

bool ct_sampler_next(ct_sampler *s, int64_t *idx) { return ct_sampler_next_batch(s, idx, 1) == 1; }

ct_sampler_state ct_sampler_get_state(const ct_sampler *s) {
    ct_sampler_state st = {.seed = s->o.seed, .epoch = s->epoch, .position = s->base + s->taken * s->o.num_replicas};
    return st;
}

ct_status ct_sampler_set_state(ct_sampler *s, const ct_sampler_state *st) {
    if (st->position < 0) return ct_error(CT_ERR_INVALID, "sampler: negative position %lld in state", (long long)st->position);
    if (st->seed != s->o.seed) s->perm_valid = false;
    s->o.seed = st->seed;
    s->epoch = st->epoch;
    s->base = st->position;
    s->taken = 0;
    s->count = count_from(s, st->position);
    s->resume_pending = true;
    return CT_OK;
}
