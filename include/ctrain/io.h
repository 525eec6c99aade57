/* ctrain/io.h — safetensors files (the format Hugging Face's `safetensors` library and
 * PyTorch users exchange weights in), at the level of raw buffers: no tensor struct here,
 * model save/load is built on top.
 *
 *   ct_st_file *f;
 *   if (ct_st_open("model.safetensors", &f) != CT_OK) { puts(ct_last_error()); return 1; }
 *   ct_st_tensor t;
 *   if (ct_st_get(f, "fc1.weight", &t) == CT_OK && t.dtype == CT_F32)
 *       memcpy(my_weights, t.data, t.nbytes);
 *   printf("format=%s\n", ct_st_metadata(f, "format") ? ct_st_metadata(f, "format") : "-");
 *   ct_st_close(f);
 *
 *   ct_st_writer *w;
 *   if (ct_st_writer_create(&w) != CT_OK) ...                      // CT_ERR_NOMEM
 *   int64_t shape[2] = {10, 784};
 *   ct_st_writer_add(w, "fc1.weight", CT_F32, 2, shape, weights);  // pointer kept until save
 *   ct_st_writer_set_metadata(w, "format", "pt");
 *   ct_status st = ct_st_writer_save(w, "out/model.safetensors"); // atomic replace
 *   ct_st_writer_free(w);
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
 * then the data, little-endian, offsets relative to the end of the header.
 */
#ifndef CTRAIN_IO_H
#define CTRAIN_IO_H

#include "ctrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CT_ST_MAX_DIMS 8
/* Largest header accepted, as the Hugging Face library (100 MB). */
#define CT_ST_MAX_HEADER 100000000ull

typedef struct ct_st_file ct_st_file;

typedef struct ct_st_tensor {
    ct_dtype dtype;       /* BOOL tensors are reported as CT_U8 (one byte, 0 or 1) */
    int ndim;             /* 0 for a scalar */
    int64_t shape[CT_ST_MAX_DIMS];
    /* Points into the opened file's read-only memory; valid until ct_st_close. Aligned to
     * 8 bytes when the writer padded its header to 8 (the HF library and ctrain do) and
     * ordered tensors by alignment; otherwise it may be unaligned: memcpy, don't cast. */
    const void *data;
    size_t nbytes;
} ct_st_tensor;

/* Map and validate a whole file: header length within the file and CT_ST_MAX_HEADER, JSON,
 * dtypes, shapes (rank <= 8, non-negative), offsets in bounds, sizes equal to
 * numel * itemsize, no overlaps and no holes (the data region exactly covered, as the
 * format requires). Any violation: CT_ERR_FORMAT with a message naming the file; a file
 * that can't be opened or read: CT_ERR_IO. */
ct_status ct_st_open(const char *path, ct_st_file **out);
void ct_st_close(ct_st_file *f);
/* The tensors of several files (a sharded checkpoint's shards) as one file named name:
 * each opened as ct_st_open does; a name in two of them is CT_ERR_FORMAT. Metadata: the
 * first file's. */
ct_status ct_st_open_shards(const char *name, const char *const *paths, int n, ct_st_file **out);

/* Tensors in file order (by data offset). */
int ct_st_count(const ct_st_file *f);
const char *ct_st_name(const ct_st_file *f, int i);
/* CT_ERR_NOT_FOUND if no such tensor; CT_ERR_UNSUPPORTED for a valid safetensors dtype
 * ctrain has no type for (I16, U16, U32, U64, F8_*). */
ct_status ct_st_get(const ct_st_file *f, const char *name, ct_st_tensor *out);
/* Value of a "__metadata__" key, or NULL. */
const char *ct_st_metadata(const ct_st_file *f, const char *key);
const char *ct_st_path(const ct_st_file *f);

typedef struct ct_st_writer ct_st_writer;

/* CT_ERR_NOMEM when out of memory (*out = NULL). */
ct_status ct_st_writer_create(ct_st_writer **out);
void ct_st_writer_free(ct_st_writer *w);
/* Register a tensor. `data` (contiguous, little-endian, numel * itemsize bytes) is not
 * copied: it must stay valid until ct_st_writer_save returns. CT_ERR_INVALID for a duplicate
 * or empty name, ndim outside 0..8 or a negative dimension. */
ct_status ct_st_writer_add(ct_st_writer *w, const char *name, ct_dtype dtype, int ndim,
                           const int64_t *shape, const void *data);
/* Set (or replace) a "__metadata__" string entry. */
ct_status ct_st_writer_set_metadata(ct_st_writer *w, const char *key, const char *value);
/* Called by ct_st_writer_save just before it writes a tensor's bytes (in file order) with the
 * pointer and size given to ct_st_writer_add: to make them just in time, as FSDP gathers one
 * unit at a time for a whole-model file (ct_fsdp_stream). *src comes in as data; the fetch may
 * point it elsewhere (a host copy of device memory, valid until the next call or the save's
 * end), and the bytes are written from there. Another status stops the save. */
typedef ct_status (*ct_st_fetch_fn)(void *user, const void *data, size_t nbytes, const void **src);
void ct_st_writer_set_fetch(ct_st_writer *w, ct_st_fetch_fn fn, void *user);
/* Write atomically: a temporary file in the same directory, fsync, rename over `path`,
 * fsync the directory. On any failure (full disk, missing or unwritable directory) returns
 * CT_ERR_IO naming the path, removes the temporary file and leaves an existing `path`
 * untouched. Tensors are laid out by decreasing item size then name (as the HF library),
 * the header padded with spaces to a multiple of 8, so every tensor is aligned. */
ct_status ct_st_writer_save(const ct_st_writer *w, const char *path);
/* Removes the temporary files a save to `path` left when its process was killed
 * (`<path>.tmp.<pid>.<n>` of processes no longer running, or of this one: call it before
 * saving). Returns how many were removed (each is logged). */
int ct_st_remove_stale_tmp(const char *path);

#ifdef __cplusplus
}
#endif
#endif
