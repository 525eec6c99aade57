/* ctrain/data.h — datasets (PyTorch's Dataset: IDX images, token shards, text, tensors in
 * memory) and PyTorch's DistributedSampler; loader.h batches them.
 *
 *   ct_idx images;                                   // MNIST-family IDX file, gzip or plain
 *   if (ct_idx_load("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", &images) != CT_OK) {
 *       fprintf(stderr, "%s\n", ct_last_error());
 *       return 1;
 *   }
 *   // images.ndim == 3, images.dims = {60000, 28, 28}, images.data = 47,040,000 bytes
 *
 *   ct_sampler_opts o = ct_sampler_default_opts();   // shuffle on, seed 0, as PyTorch
 *   o.n = images.dims[0]; o.num_replicas = world; o.rank = rank;
 *   ct_sampler *s;
 *   ct_sampler_create(&o, &s);
 *   for (int64_t epoch = 0; epoch < epochs; epoch++) {
 *       ct_sampler_set_epoch(s, epoch);              // same order as PyTorch's set_epoch
 *       int64_t i;
 *       while (ct_sampler_next(s, &i)) train_on(i);
 *   }
 *   ct_sampler_free(s);
 *   ct_idx_free(&images);
 */
#ifndef CTRAIN_DATA_H
#define CTRAIN_DATA_H

#include "ctrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================ IDX files */

#define CT_IDX_MAX_DIMS 8

typedef struct ct_idx {
    ct_dtype dtype;     /* CT_U8 (type 0x08; all MNIST files), CT_I8, CT_I32, CT_F32, CT_F64 */
    int ndim;           /* 1..CT_IDX_MAX_DIMS */
    int64_t dims[CT_IDX_MAX_DIMS];
    uint8_t *data;      /* numel * itemsize bytes, converted to host byte order; malloc'd */
    size_t nbytes;
} ct_idx;

/* Load an IDX file (magic 0x0000TTNN: T = element type, N = number of dims, then N
 * big-endian uint32 dims, then the data), gzip-compressed or plain. A bad magic, an
 * unsupported type, zero or too many dims, a size that does not match the dims, a
 * truncated or corrupt gzip stream or trailing bytes: CT_ERR_FORMAT naming the file;
 * a missing file: CT_ERR_NOT_FOUND; other read failures: CT_ERR_IO. On failure *out is
 * zeroed and owns nothing. */
ct_status ct_idx_load(const char *path, ct_idx *out);
void ct_idx_free(ct_idx *idx);
/* Product of the dims. */
int64_t ct_idx_numel(const ct_idx *idx);

/* ================================================================ datasets */

typedef struct ct_dataset ct_dataset;

/* Image classification from IDX files (MNIST family): x [1, H, W] f32, y [] i32.
 * Pixels are x/255 normalised with (mean, std) of the training images (Fashion-MNIST:
 * 0.2860, 0.3530 as torchvision tutorials use; set with ct_dataset_set_normalize). */
ct_status ct_dataset_idx_open(const char *images_path, const char *labels_path, ct_dataset **out);
void ct_dataset_set_normalize(ct_dataset *d, float mean, float std);
/* Token shards in llm.c's .bin layout (256 x int32 header: magic 20240520, version 1, token
 * count; then uint16 tokens), or ctrain's version 2 of it for vocabularies past 65,536
 * (the same header with version 2, then uint32 tokens); several concatenated in the order
 * given, versions mixed freely. Sample i is the window tokens[i*T .. i*T+T]: x = first T
 * tokens, y = the T tokens after each (i32). */
#define CT_SHARD_MAGIC 20240520
#define CT_SHARD_VERSION_U16 1
#define CT_SHARD_VERSION_U32 2
ct_status ct_dataset_tokens_open(const char *const *paths, int npaths, int block_size, ct_dataset **out);
/* Token ids already in memory (e.g. a tokenized text) as a token dataset, windows as for
 * shards; the ids are copied. source names them in messages and ct_dataset_source. */
ct_status ct_dataset_tokens_from_ids(const int32_t *ids, int64_t n, const char *source, int block_size, ct_dataset **out);
/* Writes ids[0..n) as a token shard of that version (CT_SHARD_VERSION_U16: every id <
 * 65,536; CT_SHARD_VERSION_U32: any non-negative id); CT_ERR_INVALID for an id that does
 * not fit, CT_ERR_IO (the partial file removed) when writing fails. */
ct_status ct_token_shard_write(const char *path, const int32_t *ids, int64_t n, int version);
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

/* ================================================================ DistributedSampler
 *
 * PyTorch's torch.utils.data.distributed.DistributedSampler, index for index:
 *  - num_samples (per rank) = ceil(n / R), or floor(n / R) with drop_last;
 *  - the epoch's order is 0..n-1, or with shuffle PyTorch's CPU torch.randperm(n) from a
 *    generator seeded with seed + epoch (MT19937 on the low 32 bits; Fisher-Yates style
 *    swap of r[i] and r[i + next32() % (n - i)] for i in 0..n-2);
 *  - without drop_last the order is padded to num_samples * R by wrapping around to its
 *    start (repeatedly if n < R); with drop_last its tail is cut;
 *  - rank r takes positions r, r + R, r + 2R, ...
 *
 * Resuming. The state is (seed, epoch, position), where position is GLOBAL: the number of
 * positions of the epoch's order consumed by all ranks together, i.e. base + k * R after
 * this rank has drawn k indices since the epoch started at `base` (0 for a fresh epoch).
 * Ranks that step in lockstep (as DDP does) all report the same state, so rank 0 saves it.
 * Restoring (seed, epoch, p) with R' ranks - R' may differ from the R that saved it -
 * continues the epoch with the samples not yet seen: the rest of the order from position p
 * is shared out as a DistributedSampler over those n - p samples would (rank r takes
 * p + r, p + r + R', ...; count ceil((n-p)/R'), or floor with drop_last; padding wraps to
 * the start of the epoch's order). With R' == R this is exactly the sequence the
 * uninterrupted run would have produced. p >= n means the epoch is finished.
 * The next set_epoch() starts the following epoch from position 0.
 */

typedef struct ct_sampler_opts {
    int64_t n;          /* dataset length, >= 0 */
    int num_replicas;   /* world size, >= 1 */
    int rank;           /* 0 .. num_replicas-1 */
    bool shuffle;       /* default true, as PyTorch */
    uint64_t seed;      /* default 0; seed + epoch is used modulo 2^64, as torch.Generator.manual_seed */
    bool drop_last;     /* default false */
} ct_sampler_opts;

typedef struct ct_sampler_state {
    uint64_t seed;
    int64_t epoch;
    int64_t position;   /* global, see above */
} ct_sampler_state;

typedef struct ct_sampler ct_sampler;

/* n = 0, one replica, rank 0, shuffle on, seed 0, drop_last off. */
ct_sampler_opts ct_sampler_default_opts(void);
/* CT_ERR_INVALID for n < 0, num_replicas < 1 or a rank out of range; CT_ERR_NOMEM if the
 * permutation buffer (4 bytes per sample, 8 beyond 2^32 samples) can't be allocated. */
ct_status ct_sampler_create(const ct_sampler_opts *opts, ct_sampler **out);
void ct_sampler_free(ct_sampler *s);
/* Start epoch `epoch` from its beginning - except right after ct_sampler_set_state() for
 * that same epoch with nothing drawn yet, where the restored position is kept, so the
 * usual `for (e = state.epoch; ...) { set_epoch(e); ... }` loop resumes correctly. */
void ct_sampler_set_epoch(ct_sampler *s, int64_t epoch);
int64_t ct_sampler_epoch(const ct_sampler *s);
/* Indices per rank in a full epoch (PyTorch's len(sampler)). */
int64_t ct_sampler_len(const ct_sampler *s);
/* Indices this rank will still yield in the current epoch. */
int64_t ct_sampler_remaining(const ct_sampler *s);
/* Next dataset index for this rank; false at the end of the epoch (and until set_epoch). */
bool ct_sampler_next(ct_sampler *s, int64_t *idx);
/* Up to `max` next indices into out; returns how many (0 at the end of the epoch). */
int64_t ct_sampler_next_batch(ct_sampler *s, int64_t *out, int64_t max);
ct_sampler_state ct_sampler_get_state(const ct_sampler *s);
/* Position the sampler for a resume (see above). CT_ERR_INVALID for a negative position. */
ct_status ct_sampler_set_state(ct_sampler *s, const ct_sampler_state *state);

#ifdef __cplusplus
}
#endif
#endif
