/* ctrain/data.h — datasets and PyTorch's DistributedSampler.
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
