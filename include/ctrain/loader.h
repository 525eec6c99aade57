/* ctrain/loader.h — datasets and the data loader (PyTorch's Dataset + DataLoader).
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

typedef struct ct_dataset ct_dataset;

/* Image classification from IDX files (MNIST family): x [1, H, W] f32, y [] i32.
 * Pixels are x/255 normalised with (mean, std) of the training images (Fashion-MNIST:
 * 0.2860, 0.3530 as torchvision tutorials use; set with ct_dataset_set_normalize). */
ct_status ct_dataset_idx_open(const char *images_path, const char *labels_path, ct_dataset **out);
void ct_dataset_set_normalize(ct_dataset *d, float mean, float std);
/* Token shards in llm.c's .bin layout (256 x int32 header: magic 20240520, version 1, token
 * count; then uint16 tokens), several concatenated in the order given. Sample i is the
 * window tokens[i*T .. i*T+T]: x = first T tokens, y = the T tokens after each (i32). */
ct_status ct_dataset_tokens_open(const char *const *paths, int npaths, int block_size, ct_dataset **out);
/* Raw bytes of a text file as tokens (vocabulary 256), windows as for token shards. */
ct_status ct_dataset_text_open(const char *path, int block_size, ct_dataset **out);
/* In memory: n samples of x (f32, x_numel each) and y (i32, y_numel each); copied. */
ct_status ct_dataset_tensors(const float *x, int64_t x_numel, const int32_t *y, int64_t y_numel, int64_t n, ct_dataset **out);
/* Fashion-MNIST (or MNIST) in a directory, by the distribution's file names:
 * train-images-idx3-ubyte(.gz) + train-labels-idx1-ubyte(.gz), or the t10k-* test set when
 * train is false. CT_ERR_NOT_FOUND names the directory when the images are not there. */
ct_status ct_dataset_idx_open_dir(const char *dir, bool train, ct_dataset **out);
/* Samples [first, first + count) of d as a dataset of their own (a view: d must outlive it). */
ct_status ct_dataset_subset(const ct_dataset *d, int64_t first, int64_t count, ct_dataset **out);
/* A token dataset without a test set: the last 5% of windows (none below 20) held out for
 * evaluation, the rest for training; two views of d. */
ct_status ct_dataset_split_holdout(const ct_dataset *d, ct_dataset **train, ct_dataset **heldout);
void ct_dataset_free(ct_dataset *d);
int64_t ct_dataset_len(const ct_dataset *d);
/* Shape of one sample's x (ndim, dims) and its dtype; y has y_numel i32 elements. */
int ct_dataset_x_shape(const ct_dataset *d, int64_t *dims);
ct_dtype ct_dataset_x_dtype(const ct_dataset *d);
int64_t ct_dataset_x_numel(const ct_dataset *d);
int64_t ct_dataset_y_numel(const ct_dataset *d);
/* Classes (images: the largest label + 1, i.e. what the labels show, not what a model
 * takes) or vocabulary (tokens: the largest id + 1; text: 256). */
int ct_dataset_num_classes(const ct_dataset *d);
/* The file the samples come from (images file, first token shard, text file) or
 * "in-memory data"; a subset names its parent's. For messages. */
const char *ct_dataset_source(const ct_dataset *d);
/* One pass over the stored labels or tokens (no sample is decoded) for the first value a
 * model could not take: a target (y) outside [0, y_limit) other than y_ignore, or an
 * integer input (token id, x) outside [0, x_limit); a limit <= 0 is not checked. Returns
 * CT_ERR_FORMAT naming the file, the index in it and the value ("labels-idx1-ubyte: label
 * 12 at index 345 is outside [0, 10)"), else CT_OK. A subset checks its own samples only.
 * The trainer calls it with the model's limits (ct_train_check_data). */
ct_status ct_dataset_check_values(const ct_dataset *d, int64_t x_limit, int64_t y_limit, int64_t y_ignore);
/* Copy sample i into x (x_numel elements of x dtype) and y (y_numel i32). */
void ct_dataset_get(const ct_dataset *d, int64_t i, void *x, int32_t *y);

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
