/* ctrain/loader.h — the data loader (PyTorch's DataLoader) over data.h's datasets and sampler.
 *
 *   ct_dataset *train;
 *   if (ct_dataset_idx_open(".../train-images-idx3-ubyte.gz", ".../train-labels-idx1-ubyte.gz", &train) != CT_OK)
 *       return fail(ct_last_error());
 *   ct_sampler *s;  ... ct_sampler_create(&(ct_sampler_opts){.n = ct_dataset_len(train), ...}, &s);
 *   ct_loader_opts lo = ct_loader_default_opts();
 *   lo.batch_size = 64; lo.workers = 2;
 *   ct_loader *L;
 *   ct_loader_create(train, s, &lo, &L);
 *   for (int64_t epoch = 0; epoch < 3; epoch++) {
 *       ct_loader_start_epoch(L, epoch);          // calls ct_sampler_set_epoch
 *       ct_batch b;
 *       while (ct_loader_next(L, &b) == CT_OK && b.n > 0) train_step(b.x, b.y, b.n);
 *   }
 *
 * Samples have a fixed shape: x is f32 (images, scaled to [0,1] and normalised with the
 * dataset's mean/std) or i32 (tokens); y is i32 (class or next tokens). Batches are
 * collated by background threads into a ring of `prefetch` slots; batch k always holds the
 * same samples whatever the thread timing, and ct_loader_state() is the sampler state of
 * the next batch the caller has not consumed, so a checkpoint resumes exactly.
 */
#ifndef CTRAIN_LOADER_H
#define CTRAIN_LOADER_H

#include "ctrain/core.h"
#include "ctrain/data.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_loader_opts {
    int batch_size;  /* per rank, default 64 */
    int workers;     /* collation threads, default 1; 0 = collate on the calling thread */
    int prefetch;    /* batches in flight, default 2 * max(workers, 1) */
    bool drop_last;  /* drop a final partial batch (default false) */
} ct_loader_opts;

typedef struct ct_batch {
    int64_t n;          /* samples in this batch (0 at the end of the epoch) */
    void *x;            /* n * x_numel elements (f32 or i32), valid until the next ct_loader_next */
    int32_t *y;         /* n * y_numel */
    const int64_t *idx; /* the dataset indices, n of them */
} ct_batch;

typedef struct ct_loader ct_loader;
ct_loader_opts ct_loader_default_opts(void);
/* The loader draws from `sampler` (not owned; one loader per sampler). */
ct_status ct_loader_create(const ct_dataset *d, ct_sampler *sampler, const ct_loader_opts *opts, ct_loader **out);
void ct_loader_free(ct_loader *L);
/* Begin an epoch (ct_sampler_set_epoch semantics, so a restored state is honoured). */
void ct_loader_start_epoch(ct_loader *L, int64_t epoch);
/* Next batch; b->n == 0 at the end of the epoch. */
ct_status ct_loader_next(ct_loader *L, ct_batch *b);
/* Batches per epoch for this rank. */
int64_t ct_loader_len(const ct_loader *L);
/* Sampler state positioned at the first sample the caller has not received. */
ct_sampler_state ct_loader_state(const ct_loader *L);

#ifdef __cplusplus
}
#endif
#endif
