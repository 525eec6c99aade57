/* Datasets: IDX images+labels, llm.c token shards, raw text bytes, in-memory tensors.
 * Each is loaded whole into memory (Fashion-MNIST is 47 MB; shards are mmap-sized reads)
 * and validated on open, so a bad file fails once, clearly, before training starts. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctrain/data.h"

enum { DS_IDX, DS_TOKENS, DS_TENSORS, DS_SUBSET };

struct ct_dataset {
    int kind;
    int64_t n;
    int xnd;
    int64_t xdims[4];
    ct_dtype xdt;
    int64_t xnumel, ynumel;
    int classes;
    ct_idx images, labels;      /* DS_IDX */
    float mean, std;
    uint16_t *tokens;           /* DS_TOKENS: uint16 (text bytes are widened to it) ... */
    uint32_t *tokens32;         /* ... or, when an id needs more than 16 bits, uint32 */
    int64_t ntok;
    int T;
    float *fx;                  /* DS_TENSORS */
    int32_t *fy;
    const ct_dataset *parent;   /* DS_SUBSET: samples [first, first + n) of parent */
    int64_t first;
    /* where the values came from, so that a bad one can be named by file and index:
     * the images file (DS_IDX), the text file or each token shard with the index of its
     * first token in `tokens` (DS_TOKENS) */
    char *xpath, *ypath;
    char **shard;
    int64_t *shard_start;
    int nshard;
};

ct_status ct_dataset_idx_open(const char *ip, const char *lp, ct_dataset **out) {
    *out = NULL;
    ct_dataset *d = calloc(1, sizeof *d);
    if (!d) return ct_error(CT_ERR_NOMEM, "out of memory");
    ct_status st = ct_idx_load(ip, &d->images);
    if (st == CT_OK) st = ct_idx_load(lp, &d->labels);
    if (st != CT_OK) { ct_dataset_free(d); return st; }
    if (d->images.dtype != CT_U8 || d->images.ndim != 3 || d->labels.dtype != CT_U8 || d->labels.ndim != 1) {
        ct_dataset_free(d);
        return ct_error(CT_ERR_FORMAT, "%s / %s: expected u8 images [N, H, W] and u8 labels [N]", ip, lp);
    }
    if (d->images.dims[0] != d->labels.dims[0]) {
        int64_t a = d->images.dims[0], b = d->labels.dims[0];
        ct_dataset_free(d);
        return ct_error(CT_ERR_FORMAT, "%s has %lld images but %s has %lld labels", ip, (long long)a, lp, (long long)b);
    }
    int maxl = 0;
    for (int64_t i = 0; i < d->labels.dims[0]; i++)
        if (d->labels.data[i] > maxl) maxl = d->labels.data[i];
    d->kind = DS_IDX;
    d->n = d->images.dims[0];
    d->xnd = 3;
    d->xdims[0] = 1;
    d->xdims[1] = d->images.dims[1];
    d->xdims[2] = d->images.dims[2];
    d->xnumel = d->xdims[1] * d->xdims[2];
    d->ynumel = 1;
    d->xdt = CT_F32;
    d->classes = maxl + 1;
    d->xpath = strdup(ip);
    d->ypath = strdup(lp);
    if (!d->xpath || !d->ypath) { ct_dataset_free(d); return ct_error(CT_ERR_NOMEM, "out of memory"); }
    d->mean = 0.2860f; /* Fashion-MNIST training-set pixel mean and std */
    d->std = 0.3530f;
    *out = d;
    return CT_OK;
}

void ct_dataset_set_normalize(ct_dataset *d, float mean, float std) {
    CT_CHECK(std > 0, "normalisation std must be > 0, got %g", std);
    d->mean = mean;
    d->std = std;
}

static inline int64_t tok_at(const ct_dataset *d, int64_t j) { return d->tokens32 ? d->tokens32[j] : d->tokens[j]; }

/* A whole regular file. O_NONBLOCK on open: a FIFO (or a device) given as a data file
 * would otherwise block the open until a writer appears, i.e. forever; it is refused. */
static ct_status read_file(const char *path, uint8_t **buf, size_t *len) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return ct_error(errno == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) { int e = errno; close(fd); return ct_error(CT_ERR_IO, "%s: %s", path, strerror(e)); }
    if (S_ISDIR(sb.st_mode)) { close(fd); return ct_error(CT_ERR_INVALID, "%s: is a directory, not a file", path); }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return ct_error(CT_ERR_INVALID, "%s: is a %s, not a regular file (data is read whole: copy it to a file first)", path,
                        S_ISFIFO(sb.st_mode) ? "FIFO" : S_ISCHR(sb.st_mode) ? "character device" : S_ISSOCK(sb.st_mode) ? "socket" : "special file");
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) { int e = errno; close(fd); return ct_error(CT_ERR_IO, "%s: %s", path, strerror(e)); }
    *len = (size_t)sb.st_size;
    *buf = malloc(*len ? *len : 1);
    if (!*buf) { fclose(f); return ct_error(CT_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, *len); }
    if (fread(*buf, 1, *len, f) != *len) {
        free(*buf);
        fclose(f);
        return ct_error(CT_ERR_IO, "%s: short read", path);
    }
    fclose(f);
    return CT_OK;
}

static ct_status windows(ct_dataset *d, int block_size, const char *what) {
    if (block_size < 1) return ct_error(CT_ERR_INVALID, "block size must be >= 1, got %d", block_size);
    d->T = block_size;
    d->n = d->ntok > block_size ? (d->ntok - 1) / block_size : 0;
    if (d->n == 0)
        return ct_error(CT_ERR_FORMAT, "%s: %lld tokens is too few for one window of %d (+1) tokens", what, (long long)d->ntok, block_size);
    d->kind = DS_TOKENS;
    d->xnd = 1;
    d->xdims[0] = block_size;
    d->xnumel = block_size;
    d->ynumel = block_size;
    d->xdt = CT_I32;
    return CT_OK;
}

/* Appends n tokens of w bytes each (2: uint16, 4: uint32) from src to d, widening what d
 * holds to uint32 the first time a shard or id needs it. */
static ct_status append_tokens(ct_dataset *d, const uint8_t *src, int64_t n, int w, const char *what) {
    if (w == 4 && !d->tokens32) {
        uint32_t *t = malloc((size_t)(d->ntok + n) * sizeof *t + 4);
        if (!t) return ct_error(CT_ERR_NOMEM, "out of memory for tokens");
        for (int64_t i = 0; i < d->ntok; i++) t[i] = d->tokens[i];
        free(d->tokens);
        d->tokens = NULL;
        d->tokens32 = t;
    } else if (d->tokens32) {
        uint32_t *t = realloc(d->tokens32, (size_t)(d->ntok + n) * sizeof *t + 4);
        if (!t) return ct_error(CT_ERR_NOMEM, "out of memory for tokens");
        d->tokens32 = t;
    } else {
        uint16_t *t = realloc(d->tokens, (size_t)(d->ntok + n) * sizeof *t + 2);
        if (!t) return ct_error(CT_ERR_NOMEM, "out of memory for tokens");
        d->tokens = t;
    }
    if (d->tokens32 && w == 4) memcpy(d->tokens32 + d->ntok, src, (size_t)n * 4);
    else if (d->tokens32)
        for (int64_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, src + 2 * i, 2);
            d->tokens32[d->ntok + i] = v;
        }
    else memcpy(d->tokens + d->ntok, src, (size_t)n * 2);
    int64_t maxtok = d->classes - 1;
    for (int64_t i = d->ntok; i < d->ntok + n; i++)
        if (tok_at(d, i) > maxtok) maxtok = tok_at(d, i);
    if (maxtok >= INT32_MAX) return ct_error(CT_ERR_FORMAT, "%s: token id %lld does not fit an int32", what, (long long)maxtok);
    d->classes = (int)(maxtok + 1);
    d->ntok += n;
    return CT_OK;
}

/* The source names of a token dataset: one per shard (or text), for messages. */
static ct_status alloc_sources(ct_dataset *d, int n) {
    d->shard = calloc((size_t)n, sizeof *d->shard);
    d->shard_start = calloc((size_t)n, sizeof *d->shard_start);
    return d->shard && d->shard_start ? CT_OK : ct_error(CT_ERR_NOMEM, "out of memory");
}

ct_status ct_dataset_tokens_open(const char *const *paths, int npaths, int block_size, ct_dataset **out) {
    *out = NULL;
    if (npaths < 1) return ct_error(CT_ERR_INVALID, "no token shard given");
    ct_dataset *d = calloc(1, sizeof *d);
    if (!d) return ct_error(CT_ERR_NOMEM, "out of memory");
    d->classes = 1;
    if (alloc_sources(d, npaths) != CT_OK) { ct_dataset_free(d); return ct_error(CT_ERR_NOMEM, "out of memory"); }
    for (int p = 0; p < npaths; p++) {
        if (!(d->shard[p] = strdup(paths[p]))) { ct_dataset_free(d); return ct_error(CT_ERR_NOMEM, "out of memory"); }
        d->nshard = p + 1;
        d->shard_start[p] = d->ntok;
        uint8_t *buf;
        size_t len;
        ct_status st = read_file(paths[p], &buf, &len);
        if (st != CT_OK) { ct_dataset_free(d); return st; }
        int32_t hdr[256];
        if (len < sizeof hdr) {
            free(buf); ct_dataset_free(d);
            return ct_error(CT_ERR_FORMAT, "%s: %zu bytes is shorter than the 1024-byte shard header", paths[p], len);
        }
        memcpy(hdr, buf, sizeof hdr);
        if (hdr[0] != CT_SHARD_MAGIC) {
            free(buf); ct_dataset_free(d);
            return ct_error(CT_ERR_FORMAT, "%s: bad magic %d (expected 20240520, llm.c token shard)", paths[p], hdr[0]);
        }
        if (hdr[1] != CT_SHARD_VERSION_U16 && hdr[1] != CT_SHARD_VERSION_U32) {
            free(buf); ct_dataset_free(d);
            return ct_error(CT_ERR_FORMAT, "%s: unsupported shard version %d (expected 1: uint16 tokens, or 2: uint32 tokens)", paths[p], hdr[1]);
        }
        int w = hdr[1] == CT_SHARD_VERSION_U32 ? 4 : 2;
        int64_t nt = hdr[2];
        if (nt < 0 || (uint64_t)len != sizeof hdr + (uint64_t)w * (uint64_t)nt) {
            free(buf); ct_dataset_free(d);
            return ct_error(CT_ERR_FORMAT, "%s: header says %lld tokens (%lld bytes) but the file holds %zu bytes after the header",
                            paths[p], (long long)nt, (long long)(w * nt), len - sizeof hdr);
        }
        st = append_tokens(d, buf + sizeof hdr, nt, w, paths[p]);
        free(buf);
        if (st != CT_OK) { ct_dataset_free(d); return st; }
    }
    ct_status st = windows(d, block_size, paths[0]);
    if (st != CT_OK) { ct_dataset_free(d); return st; }
    *out = d;
    return CT_OK;
}

ct_status ct_dataset_tokens_from_ids(const int32_t *ids, int64_t n, const char *source, int block_size, ct_dataset **out) {
    *out = NULL;
    if (n < 0) return ct_error(CT_ERR_INVALID, "%s: negative token count %lld", source, (long long)n);
    int w = 2;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0) return ct_error(CT_ERR_INVALID, "%s: token id %d at index %lld is negative", source, ids[i], (long long)i);
        if (ids[i] > UINT16_MAX) w = 4;
    }
    ct_dataset *d = calloc(1, sizeof *d);
    if (!d) return ct_error(CT_ERR_NOMEM, "out of memory");
    d->classes = 1;
    ct_status st = alloc_sources(d, 1);
    if (st == CT_OK && !(d->shard[0] = strdup(source))) st = ct_error(CT_ERR_NOMEM, "out of memory");
    if (st == CT_OK) {
        d->nshard = 1;
        if (w == 2) {
            /* as a shard would hold them, so both paths give the same samples */
            uint16_t *t = malloc((size_t)n * 2 + 2);
            if (!t) st = ct_error(CT_ERR_NOMEM, "out of memory for tokens");
            for (int64_t i = 0; t && i < n; i++) t[i] = (uint16_t)ids[i];
            if (t) st = append_tokens(d, (const uint8_t *)t, n, 2, source);
            free(t);
        } else {
            st = append_tokens(d, (const uint8_t *)ids, n, 4, source);
        }
    }
    if (st == CT_OK) st = windows(d, block_size, source);
    if (st != CT_OK) { ct_dataset_free(d); return st; }
    *out = d;
    return CT_OK;
}

ct_status ct_token_shard_write(const char *path, const int32_t *ids, int64_t n, int version) {
    if (version != CT_SHARD_VERSION_U16 && version != CT_SHARD_VERSION_U32)
        return ct_error(CT_ERR_INVALID, "%s: shard version %d (expected 1 or 2)", path, version);
    if (n < 0 || n > INT32_MAX) return ct_error(CT_ERR_INVALID, "%s: %lld tokens does not fit a shard (at most 2^31 - 1)", path, (long long)n);
    uint32_t lim = version == CT_SHARD_VERSION_U16 ? UINT16_MAX : UINT32_MAX;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] > lim)
            return ct_error(CT_ERR_INVALID, "%s: token id %d at index %lld does not fit a version %d shard", path, ids[i], (long long)i, version);
    int32_t hdr[256] = {CT_SHARD_MAGIC, version, (int32_t)n};
    FILE *f = fopen(path, "wb");
    if (!f) return ct_error(errno == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO, "%s: %s", path, strerror(errno));
    bool ok = fwrite(hdr, sizeof hdr, 1, f) == 1;
    uint16_t buf[4096];
    for (int64_t i = 0; ok && i < n; i += 4096) {
        size_t k = (size_t)(n - i < 4096 ? n - i : 4096);
        if (version == CT_SHARD_VERSION_U32) { ok = fwrite(ids + i, 4, k, f) == k; continue; }
        for (size_t j = 0; j < k; j++) buf[j] = (uint16_t)ids[i + (int64_t)j];
        ok = fwrite(buf, 2, k, f) == k;
    }
    int e = errno;
    if (fclose(f) != 0 && ok) { ok = false; e = errno; }
    if (!ok) {
        remove(path);
        return ct_error(CT_ERR_IO, "%s: %s", path, strerror(e));
    }
    return CT_OK;
}

ct_status ct_dataset_text_open(const char *path, int block_size, ct_dataset **out) {
    *out = NULL;
    uint8_t *buf;
    size_t len;
    ct_status st = read_file(path, &buf, &len);
    if (st != CT_OK) return st;
    ct_dataset *d = calloc(1, sizeof *d);
    if (!d) { free(buf); return ct_error(CT_ERR_NOMEM, "out of memory"); }
    d->tokens = malloc((len ? len : 1) * sizeof(uint16_t));
    if (!d->tokens) { free(buf); free(d); return ct_error(CT_ERR_NOMEM, "out of memory"); }
    for (size_t i = 0; i < len; i++) d->tokens[i] = buf[i];
    free(buf);
    d->ntok = (int64_t)len;
    d->classes = 256;
    if (alloc_sources(d, 1) != CT_OK || !(d->shard[0] = strdup(path))) { ct_dataset_free(d); return ct_error(CT_ERR_NOMEM, "out of memory"); }
    d->nshard = 1;
    st = windows(d, block_size, path);
    if (st != CT_OK) { ct_dataset_free(d); return st; }
    *out = d;
    return CT_OK;
}

ct_status ct_dataset_tensors(const float *x, int64_t xn, const int32_t *y, int64_t yn, int64_t n, ct_dataset **out) {
    *out = NULL;
    if (xn < 1 || yn < 1 || n < 0) return ct_error(CT_ERR_INVALID, "in-memory dataset needs x_numel, y_numel >= 1 and n >= 0");
    ct_dataset *d = calloc(1, sizeof *d);
    if (!d) return ct_error(CT_ERR_NOMEM, "out of memory");
    d->fx = malloc((size_t)(xn * n + 1) * sizeof(float));
    d->fy = malloc((size_t)(yn * n + 1) * sizeof(int32_t));
    if (!d->fx || !d->fy) { ct_dataset_free(d); return ct_error(CT_ERR_NOMEM, "out of memory"); }
    memcpy(d->fx, x, (size_t)(xn * n) * sizeof(float));
    memcpy(d->fy, y, (size_t)(yn * n) * sizeof(int32_t));
    int maxc = 0;
    for (int64_t i = 0; i < yn * n; i++)
        if (y[i] > maxc) maxc = y[i];
    d->kind = DS_TENSORS;
    d->n = n;
    d->xnd = 1;
    d->xdims[0] = xn;
    d->xnumel = xn;
    d->ynumel = yn;
    d->xdt = CT_F32;
    d->classes = maxc + 1;
    *out = d;
    return CT_OK;
}

void ct_dataset_free(ct_dataset *d) {
    if (!d) return;
    ct_idx_free(&d->images);
    ct_idx_free(&d->labels);
    free(d->tokens);
    free(d->tokens32);
    free(d->fx);
    free(d->fy);
    free(d->xpath);
    free(d->ypath);
    for (int i = 0; i < d->nshard; i++) free(d->shard[i]);
    free(d->shard);
    free(d->shard_start);
    free(d);
}

int64_t ct_dataset_len(const ct_dataset *d) { return d->n; }
int ct_dataset_x_shape(const ct_dataset *d, int64_t *dims) {
    memcpy(dims, d->xdims, sizeof(int64_t) * (size_t)d->xnd);
    return d->xnd;
}
ct_dtype ct_dataset_x_dtype(const ct_dataset *d) { return d->xdt; }
int64_t ct_dataset_x_numel(const ct_dataset *d) { return d->xnumel; }
int64_t ct_dataset_y_numel(const ct_dataset *d) { return d->ynumel; }
int ct_dataset_num_classes(const ct_dataset *d) { return d->classes; }

void ct_dataset_get(const ct_dataset *d, int64_t i, void *x, int32_t *y) {
    CT_CHECK(i >= 0 && i < d->n, "dataset index %lld out of range [0, %lld)", (long long)i, (long long)d->n);
    switch (d->kind) {
    case DS_IDX: {
        const uint8_t *px = d->images.data + i * d->xnumel;
        float *fx = x;
        /* same float operations as torchvision's ToTensor() + Normalize() */
        for (int64_t j = 0; j < d->xnumel; j++) fx[j] = ((float)px[j] / 255.0f - d->mean) / d->std;
        y[0] = d->labels.data[i];
        break;
    }
    case DS_TOKENS: {
        int32_t *xi = x;
        if (d->tokens32) {
            const uint32_t *t = d->tokens32 + i * d->T;
            for (int j = 0; j < d->T; j++) { xi[j] = (int32_t)t[j]; y[j] = (int32_t)t[j + 1]; }
            break;
        }
        const uint16_t *t = d->tokens + i * d->T;
        for (int j = 0; j < d->T; j++) { xi[j] = t[j]; y[j] = t[j + 1]; }
        break;
    }
    case DS_SUBSET:
        ct_dataset_get(d->parent, d->first + i, x, y);
        break;
    default:
        memcpy(x, d->fx + i * d->xnumel, (size_t)d->xnumel * sizeof(float));
        memcpy(y, d->fy + i * d->ynumel, (size_t)d->ynumel * sizeof(int32_t));
    }
}

ct_status ct_dataset_subset(const ct_dataset *d, int64_t first, int64_t count, ct_dataset **out) {
    *out = NULL;
    if (first < 0 || count < 0 || first > d->n || count > d->n - first)
        return ct_error(CT_ERR_INVALID, "subset [%lld, %lld) outside the dataset's %lld samples", (long long)first,
                        (long long)(first + count), (long long)d->n);
    ct_dataset *s = calloc(1, sizeof *s);
    if (!s) return ct_error(CT_ERR_NOMEM, "out of memory");
    /* the shape fields only: no storage of its own (ct_idx_free of zeroed idx is a no-op) */
    s->kind = DS_SUBSET;
    s->n = count;
    s->xnd = d->xnd;
    memcpy(s->xdims, d->xdims, sizeof s->xdims);
    s->xdt = d->xdt;
    s->xnumel = d->xnumel;
    s->ynumel = d->ynumel;
    s->classes = d->classes;
    s->parent = d;
    s->first = first;
    *out = s;
    return CT_OK;
}

const char *ct_dataset_source(const ct_dataset *d) {
    while (d->kind == DS_SUBSET) d = d->parent;
    if (d->kind == DS_IDX) return d->xpath;
    if (d->kind == DS_TOKENS && d->nshard > 0) return d->shard[0];
    return "in-memory data";
}

static bool out_of(int64_t v, int64_t limit, int64_t ignore) { return limit > 0 && v != ignore && (v < 0 || v >= limit); }

/* The token at global position j named by its shard and its index there. */
static ct_status bad_token(const ct_dataset *d, int64_t j, const char *role, int64_t limit) {
    int s = 0;
    while (s + 1 < d->nshard && d->shard_start[s + 1] <= j) s++;
    return ct_error(CT_ERR_FORMAT, "%s: %s %" PRId64 " at token index %" PRId64 " (window %" PRId64 ") is outside [0, %" PRId64 ")",
                    d->nshard ? d->shard[s] : "tokens", role, tok_at(d, j), j - (d->nshard ? d->shard_start[s] : 0), j / d->T,
                    limit);
}

/* Samples [first, first + n) of a stored (non-subset) dataset. */
static ct_status check_range(const ct_dataset *d, int64_t first, int64_t n, int64_t x_limit, int64_t y_limit, int64_t y_ignore) {
    switch (d->kind) {
    case DS_IDX:
        for (int64_t i = first; i < first + n; i++)
            if (out_of(d->labels.data[i], y_limit, y_ignore))
                return ct_error(CT_ERR_FORMAT, "%s: label %u at index %" PRId64 " is outside [0, %" PRId64 ")", d->ypath,
                                d->labels.data[i], i, y_limit);
        return CT_OK;
    case DS_TOKENS: {
        /* window i reads tokens [i*T, i*T + T) as inputs and [i*T + 1, i*T + T] as targets */
        if (n == 0) return CT_OK;
        int64_t lo = first * d->T, xend = (first + n) * d->T, yend = xend + 1;
        for (int64_t j = lo; j < yend; j++) {
            int64_t v = tok_at(d, j);
            if (j < xend && out_of(v, x_limit, -1)) return bad_token(d, j, "token id", x_limit);
            if (j > lo && out_of(v, y_limit, y_ignore)) return bad_token(d, j, "target token id", y_limit);
        }
        return CT_OK;
    }
    default: /* in-memory f32 inputs: only the targets have a range */
        for (int64_t i = first * d->ynumel; i < (first + n) * d->ynumel; i++)
            if (out_of(d->fy[i], y_limit, y_ignore))
                return ct_error(CT_ERR_FORMAT, "in-memory data: target %" PRId32 " of sample %" PRId64 " (element %" PRId64
                                ") is outside [0, %" PRId64 ")", d->fy[i], i / d->ynumel, i, y_limit);
        return CT_OK;
    }
}

ct_status ct_dataset_check_values(const ct_dataset *d, int64_t x_limit, int64_t y_limit, int64_t y_ignore) {
    int64_t first = 0, n = d->n;
    while (d->kind == DS_SUBSET) {
        first += d->first;
        d = d->parent;
    }
    return check_range(d, first, n, x_limit, y_limit, y_ignore);
}
