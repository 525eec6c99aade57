/* The data loader. The calling thread draws each batch's indices from the sampler in
 * order (cheap), records the sampler state before it, and hands the batch to a slot of a
 * ring; worker threads collate slots (the expensive part: decoding and normalising
 * samples). Batch k always gets the same indices, so results never depend on timing, and
 * the state stored with a slot is exactly where a resume must start. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/loader.h"

enum { SLOT_FREE, SLOT_TODO, SLOT_BUSY, SLOT_READY };

typedef struct {
    int state;
    int64_t batch;            /* sequence number within the epoch */
    int64_t n;
    int64_t *idx;
    void *x;
    int32_t *y;
    ct_sampler_state before;  /* sampler state before this batch's indices were drawn */
} slot;

struct ct_loader {
    const ct_dataset *d;
    ct_sampler *s;
    ct_loader_opts o;
    slot *slots;
    int nslots;
    int64_t scheduled, consumed; /* batches handed to slots / returned to the caller */
    bool exhausted;              /* the sampler has no more indices this epoch */
    int held;                    /* slot returned by the last ct_loader_next, -1 if none */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    pthread_t *threads;
    bool stop;
    size_t xsz;
};

ct_loader_opts ct_loader_default_opts(void) {
    return (ct_loader_opts){.batch_size = 64, .workers = 1, .prefetch = 0, .drop_last = false};
}

static void collate(ct_loader *L, slot *s) {
    int64_t xn = ct_dataset_x_numel(L->d), yn = ct_dataset_y_numel(L->d);
    for (int64_t j = 0; j < s->n; j++) ct_dataset_get(L->d, s->idx[j], (char *)s->x + (size_t)(j * xn) * L->xsz, s->y + j * yn);
}

static void *worker(void *arg) {
    ct_loader *L = arg;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        slot *pick = NULL;
        while (!L->stop) {
            /* oldest batch first, so the caller's next batch is never starved */
            for (int i = 0; i < L->nslots; i++)
                if (L->slots[i].state == SLOT_TODO && (!pick || L->slots[i].batch < pick->batch)) pick = &L->slots[i];
            if (pick) break;
            pthread_cond_wait(&L->cv_work, &L->mu);
        }
        if (L->stop) break;
        pick->state = SLOT_BUSY;
        pthread_mutex_unlock(&L->mu);
        collate(L, pick);
        pthread_mutex_lock(&L->mu);
        pick->state = SLOT_READY;
        pthread_cond_broadcast(&L->cv_done);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

ct_status ct_loader_create(const ct_dataset *d, ct_sampler *s, const ct_loader_opts *opts, ct_loader **out) {
    *out = NULL;
    ct_loader_opts o = opts ? *opts : ct_loader_default_opts();
    if (o.batch_size < 1) return ct_error(CT_ERR_INVALID, "batch size must be >= 1, got %d", o.batch_size);
    if (o.workers < 0 || o.workers > 64) return ct_error(CT_ERR_INVALID, "loader workers must be in [0, 64], got %d", o.workers);
    if (o.prefetch <= 0) o.prefetch = 2 * (o.workers > 0 ? o.workers : 1);
    ct_loader *L = calloc(1, sizeof *L);
    if (!L) return ct_error(CT_ERR_NOMEM, "out of memory");
    L->d = d;
    L->s = s;
    L->o = o;
    L->held = -1;
    L->xsz = ct_dtype_size(ct_dataset_x_dtype(d));
    /* one slot more than the prefetch depth: the caller holds one while others fill */
    L->nslots = o.prefetch + 1;
    L->slots = calloc((size_t)L->nslots, sizeof(slot));
    if (!L->slots) { free(L); return ct_error(CT_ERR_NOMEM, "out of memory"); }
    int64_t B = o.batch_size, xn = ct_dataset_x_numel(d), yn = ct_dataset_y_numel(d);
    for (int i = 0; i < L->nslots; i++) {
        L->slots[i].idx = malloc(sizeof(int64_t) * (size_t)B);
        L->slots[i].x = malloc(L->xsz * (size_t)(B * xn));
        L->slots[i].y = malloc(sizeof(int32_t) * (size_t)(B * yn));
        if (!L->slots[i].idx || !L->slots[i].x || !L->slots[i].y) {
            L->o.workers = 0;
            ct_loader_free(L);
            return ct_error(CT_ERR_NOMEM, "out of memory for %d loader slots of %lld samples", L->nslots, (long long)B);
        }
    }
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->cv_work, NULL);
    pthread_cond_init(&L->cv_done, NULL);
    if (o.workers > 0) {
        L->threads = calloc((size_t)o.workers, sizeof(pthread_t));
        for (int i = 0; i < o.workers; i++)
            if (pthread_create(&L->threads[i], NULL, worker, L) != 0) {
                L->o.workers = i;
                ct_loader_free(L);
                return ct_error(CT_ERR_SYSTEM, "cannot start loader thread %d", i);
            }
    }
    *out = L;
    return CT_OK;
}

void ct_loader_free(ct_loader *L) {
    if (!L) return;
    if (L->threads) {
        pthread_mutex_lock(&L->mu);
        L->stop = true;
        pthread_cond_broadcast(&L->cv_work);
        pthread_mutex_unlock(&L->mu);
        for (int i = 0; i < L->o.workers; i++) pthread_join(L->threads[i], NULL);
        free(L->threads);
    }
    for (int i = 0; i < L->nslots; i++) {
        free(L->slots[i].idx);
        free(L->slots[i].x);
        free(L->slots[i].y);
    }
    free(L->slots);
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv_work);
    pthread_cond_destroy(&L->cv_done);
    free(L);
}

/* Wait until no worker is collating, then forget every slot. */
static void drain(ct_loader *L) {
    pthread_mutex_lock(&L->mu);
    for (;;) {
        bool busy = false;
        for (int i = 0; i < L->nslots; i++)
            if (L->slots[i].state == SLOT_BUSY) busy = true;
        if (!busy) break;
        pthread_cond_wait(&L->cv_done, &L->mu);
    }
    for (int i = 0; i < L->nslots; i++) L->slots[i].state = SLOT_FREE;
    pthread_mutex_unlock(&L->mu);
    L->held = -1;
    L->scheduled = L->consumed = 0;
    L->exhausted = false;
}

void ct_loader_start_epoch(ct_loader *L, int64_t epoch) {
    drain(L);
    ct_sampler_set_epoch(L->s, epoch);
}

int64_t ct_loader_len(const ct_loader *L) {
    int64_t n = ct_sampler_len(L->s), B = L->o.batch_size;
    return L->o.drop_last ? n / B : (n + B - 1) / B;
}

/* Fill free slots with the next batches' indices (called with the lock held). */
static void schedule(ct_loader *L) {
    while (!L->exhausted) {
        slot *f = NULL;
        for (int i = 0; i < L->nslots; i++)
            if (L->slots[i].state == SLOT_FREE && i != L->held) { f = &L->slots[i]; break; }
        if (!f) return;
        f->before = ct_sampler_get_state(L->s);
        f->n = ct_sampler_next_batch(L->s, f->idx, L->o.batch_size);
        if (f->n == 0 || (L->o.drop_last && f->n < L->o.batch_size)) {
            L->exhausted = true;
            return;
        }
        f->batch = L->scheduled++;
        f->state = SLOT_TODO;
        pthread_cond_signal(&L->cv_work);
    }
}

ct_status ct_loader_next(ct_loader *L, ct_batch *b) {
    memset(b, 0, sizeof *b);
    pthread_mutex_lock(&L->mu);
    if (L->held >= 0) {
        L->slots[L->held].state = SLOT_FREE;
        L->held = -1;
    }
    schedule(L);
    slot *s = NULL;
    for (int i = 0; i < L->nslots; i++)
        if (L->slots[i].state != SLOT_FREE && L->slots[i].batch == L->consumed) s = &L->slots[i];
    if (!s) { /* end of epoch */
        pthread_mutex_unlock(&L->mu);
        return CT_OK;
    }
    if (L->o.workers == 0 && s->state == SLOT_TODO) {
        s->state = SLOT_BUSY;
        pthread_mutex_unlock(&L->mu);
        collate(L, s);
        pthread_mutex_lock(&L->mu);
        s->state = SLOT_READY;
    }
    while (s->state != SLOT_READY) pthread_cond_wait(&L->cv_done, &L->mu);
    L->held = (int)(s - L->slots);
    L->consumed++;
    b->n = s->n;
    b->x = s->x;
    b->y = s->y;
    b->idx = s->idx;
    pthread_mutex_unlock(&L->mu);
    return CT_OK;
}

ct_sampler_state ct_loader_state(const ct_loader *L) {
    ct_loader *m = (ct_loader *)L;
    pthread_mutex_lock(&m->mu);
    ct_sampler_state st = ct_sampler_get_state(L->s);
    /* the oldest batch drawn but not yet returned is where a resume starts */
    int64_t best = -1;
    for (int i = 0; i < L->nslots; i++) {
        const slot *s = &L->slots[i];
        if (i != L->held && s->state != SLOT_FREE && s->batch >= L->consumed && (best < 0 || s->batch < best)) {
            best = s->batch;
            st = s->before;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}
