/* safetensors reader (mmap + full validation) and atomic writer.
 *
 * The reader trusts nothing in the file: every length, offset and shape is checked before
 * any pointer into the data is handed out, with the same rules as the Hugging Face library
 * (contiguous data, no holes, no overlaps, header <= 100 MB). */
#include "ctrain/io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* All dtype names of the safetensors spec we can size; ct < 0 = no ctrain type for it. */
static const struct { const char *name; size_t size; int ct; } st_dtypes[] = {
    {"F64", 8, CT_F64},  {"F32", 4, CT_F32},  {"F16", 2, CT_F16},     {"BF16", 2, CT_BF16},
    {"I64", 8, CT_I64},  {"I32", 4, CT_I32},  {"I8", 1, CT_I8},       {"U8", 1, CT_U8},
    {"BOOL", 1, CT_U8},  {"I16", 2, -1},      {"U16", 2, -1},         {"U32", 4, -1},
    {"U64", 8, -1},      {"F8_E5M2", 1, -1},  {"F8_E4M3", 1, -1},
};
#define N_ST_DTYPES (int)(sizeof st_dtypes / sizeof st_dtypes[0])

typedef struct {
    char *name;
    int dt; /* index into st_dtypes */
    int ndim;
    int64_t shape[CT_ST_MAX_DIMS];
    uint64_t begin, end; /* relative to the data region */
    int part;            /* a shard view's: the part whose data region holds it */
} st_entry;

struct ct_st_file {
    char *path;
    unsigned char *base; /* whole file */
    size_t size;
    bool mapped;
    const unsigned char *data; /* start of the data region */
    uint64_t data_size;
    st_entry *e;    /* sorted by offset */
    int *by_name;   /* indices into e, sorted by name */
    int n;
    char **meta_k, **meta_v;
    int n_meta;
    ct_st_file **parts; /* a shard view (ct_st_open_shards): the files; base, data unused */
    int nparts;
};

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ------------------------------------------------------------------ reader */

static void st_free(ct_st_file *f) {
    if (!f) return;
    if (f->base) {
        if (f->mapped) munmap(f->base, f->size);
        else free(f->base);
    }
    for (int i = 0; i < f->n; i++) free(f->e[i].name);
    free(f->e);
    free(f->by_name);
    for (int i = 0; i < f->n_meta; i++) { free(f->meta_k[i]); free(f->meta_v[i]); }
    free(f->meta_k);
    free(f->meta_v);
    for (int i = 0; i < f->nparts; i++) st_free(f->parts[i]);
    free(f->parts);
    free(f->path);
    free(f);
}

void ct_st_close(ct_st_file *f) { st_free(f); }

/* A JSON number that is a non-negative integer exactly representable as a double. */
static bool json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double v = j->valuedouble;
    if (!(v >= 0 && v <= 9007199254740992.0) || v != (double)(uint64_t)v) return false;
    *out = (uint64_t)v;
    return true;
}

static int cmp_offset(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Merge sort of indices by name (qsort has no context argument). */
static void sort_by_name(const st_entry *e, int *idx, int *tmp, int n) {
    if (n < 2) return;
    int h = n / 2;
    sort_by_name(e, idx, tmp, h);
    sort_by_name(e, idx + h, tmp, n - h);
    int i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = strcmp(e[idx[i]].name, e[idx[j]].name) <= 0 ? idx[i++] : idx[j++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, (size_t)n * sizeof *idx);
}

/* by_name over f->e, and no name twice */
static ct_status index_names(ct_st_file *f) {
    int *tmp = malloc(((size_t)f->n + 1) * sizeof *tmp);
    if (!tmp) return ct_error(CT_ERR_NOMEM, "%s: out of memory", f->path);
    for (int i = 0; i < f->n; i++) f->by_name[i] = i;
    sort_by_name(f->e, f->by_name, tmp, f->n);
    free(tmp);
    for (int i = 1; i < f->n; i++)
        if (!strcmp(f->e[f->by_name[i]].name, f->e[f->by_name[i - 1]].name))
            return ct_error(CT_ERR_FORMAT, "%s: tensor name '%s' appears twice", f->path, f->e[f->by_name[i]].name);
    return CT_OK;
}

static ct_status parse_entry(ct_st_file *f, const cJSON *j, st_entry *en) {
    const char *p = f->path, *nm = j->string;
    if (!cJSON_IsObject(j)) return ct_error(CT_ERR_FORMAT, "%s: header entry '%s' is not an object", p, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt)) return ct_error(CT_ERR_FORMAT, "%s: tensor '%s' has no \"dtype\" string", p, nm);
    en->dt = -1;
    for (int i = 0; i < N_ST_DTYPES; i++)
        if (!strcmp(dt->valuestring, st_dtypes[i].name)) en->dt = i;
    if (en->dt < 0) return ct_error(CT_ERR_FORMAT, "%s: tensor '%s' has unknown dtype \"%.32s\"", p, nm, dt->valuestring);
    if (!cJSON_IsArray(sh)) return ct_error(CT_ERR_FORMAT, "%s: tensor '%s' has no \"shape\" array", p, nm);
    int nd = cJSON_GetArraySize(sh);
    if (nd > CT_ST_MAX_DIMS)
        return ct_error(CT_ERR_FORMAT, "%s: tensor '%s' has %d dimensions (at most %d supported)", p, nm, nd, CT_ST_MAX_DIMS);
    en->ndim = nd;
    uint64_t numel = 1;
    int d = 0;
    for (const cJSON *x = sh->child; x; x = x->next, d++) {
        uint64_t v;
        if (!json_u64(x, &v))
            return ct_error(CT_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", p, nm, d);
        en->shape[d] = (int64_t)v;
        if (__builtin_mul_overflow(numel, v, &numel))
            return ct_error(CT_ERR_FORMAT, "%s: tensor '%s': shape overflows", p, nm);
    }
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_u64(off->child, &en->begin) ||
        !json_u64(off->child->next, &en->end))
        return ct_error(CT_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" must be [begin, end] non-negative integers", p, nm);
    if (en->end < en->begin)
        return ct_error(CT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before begin", p, nm,
                        (unsigned long long)en->begin, (unsigned long long)en->end);
    if (en->end > f->data_size)
        return ct_error(CT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] past the end of the data (%llu bytes)",
                        p, nm, (unsigned long long)en->begin, (unsigned long long)en->end,
                        (unsigned long long)f->data_size);
    uint64_t need;
    if (__builtin_mul_overflow(numel, (uint64_t)st_dtypes[en->dt].size, &need) || need != en->end - en->begin)
        return ct_error(CT_ERR_FORMAT, "%s: tensor '%s': %llu data bytes but its shape and dtype %s need %llu", p, nm,
                        (unsigned long long)(en->end - en->begin), st_dtypes[en->dt].name,
                        (unsigned long long)need);
    return CT_OK;
}

static ct_status parse_header(ct_st_file *f, const char *hdr, size_t hlen) {
    const char *p = f->path;
    if (hlen == 0 || hdr[0] != '{') return ct_error(CT_ERR_FORMAT, "%s: header does not start with '{'", p);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
    if (!root) {
        size_t at = end && end >= hdr && end <= hdr + hlen ? (size_t)(end - hdr) : 0;
        return ct_error(CT_ERR_FORMAT, "%s: header is not valid JSON (error near byte %zu of %zu)", p, at, hlen);
    }
    ct_status st = CT_OK;
    for (const char *q = end; q < hdr + hlen; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            st = ct_error(CT_ERR_FORMAT, "%s: trailing bytes after the JSON header", p);
            goto done;
        }
    if (!cJSON_IsObject(root)) { st = ct_error(CT_ERR_FORMAT, "%s: header is not a JSON object", p); goto done; }
    int n = 0;
    for (const cJSON *j = root->child; j; j = j->next) n++;
    f->e = calloc((size_t)n + 1, sizeof *f->e);
    f->by_name = calloc((size_t)n + 1, sizeof *f->by_name);
    if (!f->e || !f->by_name) { st = ct_error(CT_ERR_NOMEM, "%s: out of memory", p); goto done; }
    bool seen_meta = false;
    for (const cJSON *j = root->child; j; j = j->next) {
        if (!strcmp(j->string, "__metadata__")) {
            if (cJSON_IsNull(j) && !seen_meta) { seen_meta = true; continue; } /* Python's None */
            if (seen_meta || !cJSON_IsObject(j)) {
                st = ct_error(CT_ERR_FORMAT, "%s: \"__metadata__\" must be one object of strings", p);
                goto done;
            }
            seen_meta = true;
            int nm = cJSON_GetArraySize(j);
            f->meta_k = calloc((size_t)nm + 1, sizeof(char *));
            f->meta_v = calloc((size_t)nm + 1, sizeof(char *));
            if (!f->meta_k || !f->meta_v) { st = ct_error(CT_ERR_NOMEM, "%s: out of memory", p); goto done; }
            for (const cJSON *m = j->child; m; m = m->next) {
                if (!cJSON_IsString(m)) {
                    st = ct_error(CT_ERR_FORMAT, "%s: metadata value of '%s' is not a string", p, m->string);
                    goto done;
                }
                int k = f->n_meta++; /* counted first so st_free releases a half-made pair */
                f->meta_k[k] = xstrdup(m->string);
                f->meta_v[k] = xstrdup(m->valuestring);
                if (!f->meta_k[k] || !f->meta_v[k]) { st = ct_error(CT_ERR_NOMEM, "%s: out of memory", p); goto done; }
            }
            continue;
        }
        st_entry *en = &f->e[f->n];
        if ((st = parse_entry(f, j, en)) != CT_OK) goto done;
        if (!(en->name = xstrdup(j->string))) { st = ct_error(CT_ERR_NOMEM, "%s: out of memory", p); goto done; }
        f->n++;
    }
    qsort(f->e, (size_t)f->n, sizeof *f->e, cmp_offset);
    uint64_t at = 0;
    for (int i = 0; i < f->n; i++) {
        const st_entry *en = &f->e[i];
        if (en->begin < at) {
            st = ct_error(CT_ERR_FORMAT, "%s: tensor '%s' (bytes %llu..%llu) overlaps tensor '%s' (bytes %llu..%llu)", p,
                          en->name, (unsigned long long)en->begin, (unsigned long long)en->end, f->e[i - 1].name,
                          (unsigned long long)f->e[i - 1].begin, (unsigned long long)f->e[i - 1].end);
            goto done;
        }
        if (en->begin > at) {
            st = ct_error(CT_ERR_FORMAT, "%s: bytes %llu..%llu of the data belong to no tensor (hole before '%s')", p,
                          (unsigned long long)at, (unsigned long long)en->begin, en->name);
            goto done;
        }
        at = en->end;
    }
    if (at != f->data_size) {
        st = ct_error(CT_ERR_FORMAT, "%s: data region is %llu bytes but the tensors cover %llu", p,
                      (unsigned long long)f->data_size, (unsigned long long)at);
        goto done;
    }
    if ((st = index_names(f)) != CT_OK) goto done;
done:
    cJSON_Delete(root);
    return st;
}

ct_status ct_st_open(const char *path, ct_st_file **out) {
    *out = NULL;
    ct_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = xstrdup(path))) { free(f); return ct_error(CT_ERR_NOMEM, "%s: out of memory", path); }
    ct_status st = CT_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { st = ct_error(errno == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO, "%s: %s", path, strerror(errno)); goto fail; }
    struct stat sb;
    if (fstat(fd, &sb) != 0) { st = ct_error(CT_ERR_IO, "%s: %s", path, strerror(errno)); goto fail; }
    if (!S_ISREG(sb.st_mode)) { st = ct_error(CT_ERR_IO, "%s: not a regular file", path); goto fail; }
    f->size = (size_t)sb.st_size;
    if (f->size < 8) {
        st = ct_error(CT_ERR_FORMAT, "%s: file is %zu bytes, too short for the 8-byte header length", path, f->size);
        goto fail;
    }
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
        f->base = m;
        f->mapped = true;
    } else { /* e.g. a filesystem without mmap: read it */
        if (!(f->base = malloc(f->size))) { st = ct_error(CT_ERR_NOMEM, "%s: out of memory (%zu bytes)", path, f->size); goto fail; }
        size_t got = 0;
        while (got < f->size) {
            ssize_t r = pread(fd, f->base + got, f->size - got, (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) { st = ct_error(CT_ERR_IO, "%s: read failed: %s", path, r ? strerror(errno) : "unexpected end of file"); goto fail; }
            got += (size_t)r;
        }
    }
    close(fd);
    fd = -1;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->base[i];
    if (hlen > CT_ST_MAX_HEADER) {
        st = ct_error(CT_ERR_FORMAT, "%s: header length %llu exceeds the %llu-byte limit", path, (unsigned long long)hlen,
                      (unsigned long long)CT_ST_MAX_HEADER);
        goto fail;
    }
    if (hlen > f->size - 8) {
        st = ct_error(CT_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                      (unsigned long long)hlen, f->size);
        goto fail;
    }
    f->data = f->base + 8 + hlen;
    f->data_size = f->size - 8 - hlen;
    if ((st = parse_header(f, (const char *)f->base + 8, (size_t)hlen)) != CT_OK) goto fail;
    *out = f;
    return CT_OK;
fail:
    if (fd >= 0) close(fd);
    st_free(f);
    return st;
}

ct_status ct_st_open_shards(const char *name, const char *const *paths, int n, ct_st_file **out) {
    *out = NULL;
    ct_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = xstrdup(name)) || !(f->parts = calloc((size_t)(n > 0 ? n : 1), sizeof *f->parts))) {
        st_free(f);
        return ct_error(CT_ERR_NOMEM, "%s: out of memory", name);
    }
    ct_status st = CT_OK;
    int total = 0;
    for (int i = 0; i < n && st == CT_OK; i++) {
        st = ct_st_open(paths[i], &f->parts[i]);
        if (st == CT_OK) {
            f->nparts++;
            total += f->parts[i]->n;
        }
    }
    if (st == CT_OK && (!(f->e = calloc((size_t)total + 1, sizeof *f->e)) || !(f->by_name = calloc((size_t)total + 1, sizeof *f->by_name))))
        st = ct_error(CT_ERR_NOMEM, "%s: out of memory", name);
    for (int i = 0; i < f->nparts && st == CT_OK; i++)
        for (int j = 0; j < f->parts[i]->n && st == CT_OK; j++) {
            st_entry *en = &f->e[f->n];
            *en = f->parts[i]->e[j];
            en->part = i;
            if (!(en->name = xstrdup(en->name))) st = ct_error(CT_ERR_NOMEM, "%s: out of memory", name);
            else f->n++;
        }
    if (st == CT_OK) st = index_names(f);
    if (st != CT_OK) {
        st_free(f);
        return st;
    }
    /* the first shard's metadata (save_pretrained writes format=pt in each) */
    if (f->nparts) {
        f->meta_k = f->parts[0]->meta_k; f->meta_v = f->parts[0]->meta_v; f->n_meta = f->parts[0]->n_meta;
        f->parts[0]->meta_k = f->parts[0]->meta_v = NULL; f->parts[0]->n_meta = 0;
    }
    *out = f;
    return CT_OK;
}

int ct_st_count(const ct_st_file *f) { return f->n; }
const char *ct_st_name(const ct_st_file *f, int i) { return i >= 0 && i < f->n ? f->e[i].name : NULL; }
const char *ct_st_path(const ct_st_file *f) { return f->path; }

ct_status ct_st_get(const ct_st_file *f, const char *name, ct_st_tensor *out) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(name, f->e[f->by_name[mid]].name);
        if (c == 0) {
            const st_entry *en = &f->e[f->by_name[mid]];
            if (st_dtypes[en->dt].ct < 0)
                return ct_error(CT_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, which ctrain does not support", f->path,
                                name, st_dtypes[en->dt].name);
            memset(out, 0, sizeof *out);
            out->dtype = (ct_dtype)st_dtypes[en->dt].ct;
            out->ndim = en->ndim;
            memcpy(out->shape, en->shape, sizeof en->shape);
            out->data = (f->parts ? f->parts[en->part]->data : f->data) + en->begin;
            out->nbytes = (size_t)(en->end - en->begin);
            return CT_OK;
        }
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return ct_error(CT_ERR_NOT_FOUND, "%s: no tensor named '%s'", f->path, name);
}

const char *ct_st_metadata(const ct_st_file *f, const char *key) {
    for (int i = f->n_meta - 1; i >= 0; i--) /* last one wins, as a JSON object would */
        if (!strcmp(f->meta_k[i], key)) return f->meta_v[i];
    return NULL;
}

/* ------------------------------------------------------------------ writer */

typedef struct {
    char *name;
    ct_dtype dt;
    int ndim;
    int64_t shape[CT_ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
} w_entry;

struct ct_st_writer {
    w_entry *e;
    int n, cap;
    char **mk, **mv;
    int nm, mcap;
    ct_st_fetch_fn fetch; /* ct_st_writer_set_fetch */
    void *fetch_user;
};

void ct_st_writer_set_fetch(ct_st_writer *w, ct_st_fetch_fn fn, void *user) {
    w->fetch = fn;
    w->fetch_user = user;
}

ct_status ct_st_writer_create(ct_st_writer **out) {
    *out = calloc(1, sizeof(ct_st_writer));
    return *out ? CT_OK : ct_error(CT_ERR_NOMEM, "safetensors writer: out of memory");
}

void ct_st_writer_free(ct_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->e[i].name);
    for (int i = 0; i < w->nm; i++) { free(w->mk[i]); free(w->mv[i]); }
    free(w->e);
    free(w->mk);
    free(w->mv);
    free(w);
}

ct_status ct_st_writer_add(ct_st_writer *w, const char *name, ct_dtype dtype, int ndim, const int64_t *shape,
                           const void *data) {
    if (!name || !*name || !strcmp(name, "__metadata__"))
        return ct_error(CT_ERR_INVALID, "safetensors writer: bad tensor name '%s'", name ? name : "(null)");
    if ((unsigned)dtype >= CT_DTYPE_COUNT_) return ct_error(CT_ERR_INVALID, "safetensors writer: '%s': bad dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > CT_ST_MAX_DIMS)
        return ct_error(CT_ERR_INVALID, "safetensors writer: '%s': %d dimensions (0..%d allowed)", name, ndim, CT_ST_MAX_DIMS);
    size_t nbytes = ct_dtype_size(dtype);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return ct_error(CT_ERR_INVALID, "safetensors writer: '%s': negative dimension %lld", name, (long long)shape[d]);
        if (__builtin_mul_overflow(nbytes, (size_t)shape[d], &nbytes))
            return ct_error(CT_ERR_INVALID, "safetensors writer: '%s': size overflows", name);
    }
    if (nbytes && !data) return ct_error(CT_ERR_INVALID, "safetensors writer: '%s': NULL data", name);
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->e[i].name, name)) return ct_error(CT_ERR_INVALID, "safetensors writer: tensor '%s' added twice", name);
    if (w->n == w->cap) {
        int nc = w->cap ? 2 * w->cap : 16;
        w_entry *ne = realloc(w->e, (size_t)nc * sizeof *ne);
        if (!ne) return ct_error(CT_ERR_NOMEM, "safetensors writer: out of memory");
        w->e = ne;
        w->cap = nc;
    }
    w_entry *en = &w->e[w->n];
    memset(en, 0, sizeof *en);
    if (!(en->name = xstrdup(name))) return ct_error(CT_ERR_NOMEM, "safetensors writer: out of memory");
    en->dt = dtype;
    en->ndim = ndim;
    for (int d = 0; d < ndim; d++) en->shape[d] = shape[d];
    en->data = data;
    en->nbytes = nbytes;
    w->n++;
    return CT_OK;
}

ct_status ct_st_writer_set_metadata(ct_st_writer *w, const char *key, const char *value) {
    if (!key || !value) return ct_error(CT_ERR_INVALID, "safetensors writer: NULL metadata key or value");
    for (int i = 0; i < w->nm; i++)
        if (!strcmp(w->mk[i], key)) {
            char *v = xstrdup(value);
            if (!v) return ct_error(CT_ERR_NOMEM, "safetensors writer: out of memory");
            free(w->mv[i]);
            w->mv[i] = v;
            return CT_OK;
        }
    if (w->nm == w->mcap) {
        int nc = w->mcap ? 2 * w->mcap : 8;
        char **a = realloc(w->mk, (size_t)nc * sizeof *a);
        if (!a) return ct_error(CT_ERR_NOMEM, "safetensors writer: out of memory");
        w->mk = a;
        char **b = realloc(w->mv, (size_t)nc * sizeof *b);
        if (!b) return ct_error(CT_ERR_NOMEM, "safetensors writer: out of memory");
        w->mv = b;
        w->mcap = nc;
    }
    w->mk[w->nm] = xstrdup(key);
    w->mv[w->nm] = xstrdup(value);
    if (!w->mk[w->nm] || !w->mv[w->nm]) {
        free(w->mk[w->nm]);
        free(w->mv[w->nm]);
        return ct_error(CT_ERR_NOMEM, "safetensors writer: out of memory");
    }
    w->nm++;
    return CT_OK;
}

/* Largest item size first keeps every tensor aligned to its item size; then by name. */
static int cmp_layout(const void *a, const void *b) {
    const w_entry *x = *(const w_entry *const *)a, *y = *(const w_entry *const *)b;
    size_t sx = ct_dtype_size(x->dt), sy = ct_dtype_size(y->dt);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

static cJSON *int_array(const int64_t *v, int n) {
    char buf[CT_ST_MAX_DIMS * 24 + 4];
    size_t k = 0;
    buf[k++] = '[';
    for (int i = 0; i < n; i++) k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%lld", i ? "," : "", (long long)v[i]);
    buf[k++] = ']';
    buf[k] = 0;
    return cJSON_CreateRaw(buf); /* exact integers: cJSON would print through double */
}

static bool write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t r = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = ENOSPC;
            return false;
        }
        p += r;
        n -= (size_t)r;
    }
    return true;
}

ct_status ct_st_writer_save(const ct_st_writer *w, const char *path) {
    ct_status st = CT_OK;
    const w_entry **order = malloc(((size_t)w->n + 1) * sizeof *order);
    cJSON *root = cJSON_CreateObject();
    char *json = NULL, *tmp = NULL;
    int fd = -1;
    if (!order || !root) { st = ct_error(CT_ERR_NOMEM, "%s: out of memory", path); goto done; }
    for (int i = 0; i < w->n; i++) order[i] = &w->e[i];
    qsort(order, (size_t)w->n, sizeof *order, cmp_layout);

    if (w->nm) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        if (!m) { st = ct_error(CT_ERR_NOMEM, "%s: out of memory", path); goto done; }
        for (int i = 0; i < w->nm; i++)
            if (!cJSON_AddStringToObject(m, w->mk[i], w->mv[i])) { st = ct_error(CT_ERR_NOMEM, "%s: out of memory", path); goto done; }
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const w_entry *en = order[i];
        cJSON *o = cJSON_CreateObject();
        int64_t offs[2] = {(int64_t)off, (int64_t)(off + en->nbytes)};
        cJSON *sh = int_array(en->shape, en->ndim), *of = int_array(offs, 2);
        if (!o || !sh || !of || !cJSON_AddItemToObject(root, en->name, o) ||
            !cJSON_AddStringToObject(o, "dtype", ct_dtype_safetensors_name(en->dt)) ||
            !cJSON_AddItemToObject(o, "shape", sh) || !cJSON_AddItemToObject(o, "data_offsets", of)) {
            st = ct_error(CT_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        off += en->nbytes;
    }
    if (!(json = cJSON_PrintUnformatted(root))) { st = ct_error(CT_ERR_NOMEM, "%s: out of memory", path); goto done; }
    size_t jl = strlen(json), hl = (jl + 7) & ~(size_t)7;
    char *hdr = realloc(json, hl + 8);
    if (!hdr) { st = ct_error(CT_ERR_NOMEM, "%s: out of memory", path); goto done; }
    json = hdr;
    memmove(hdr + 8, hdr, jl);
    memset(hdr + 8 + jl, ' ', hl - jl); /* pad with spaces, as the HF library */
    for (int i = 0; i < 8; i++) hdr[i] = (char)(((uint64_t)hl >> (8 * i)) & 0xff);

    size_t pl = strlen(path);
    if (!(tmp = malloc(pl + 64))) { st = ct_error(CT_ERR_NOMEM, "%s: out of memory", path); goto done; }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(tmp, pl + 64, "%s.tmp.%d.%lx", path, (int)getpid(), (unsigned long)ts.tv_nsec);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = ct_error(CT_ERR_IO, "%s: cannot create a temporary file next to it: %s", path, strerror(errno));
        free(tmp);
        tmp = NULL; /* nothing to remove */
        goto done;
    }
    if (!write_all(fd, hdr, hl + 8)) goto write_err;
    for (int i = 0; i < w->n; i++) {
        const void *src = order[i]->data;
        if (w->fetch && (st = w->fetch(w->fetch_user, order[i]->data, order[i]->nbytes, &src)) != CT_OK) goto done;
        if (order[i]->nbytes && !write_all(fd, src, order[i]->nbytes)) goto write_err;
    }
    if (fsync(fd) != 0) goto write_err;
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) goto write_err;
    if (rename(tmp, path) != 0) {
        st = ct_error(CT_ERR_IO, "%s: cannot rename the temporary file into place: %s", path, strerror(errno));
        goto done;
    }
    free(tmp);
    tmp = NULL;
    { /* make the rename itself durable */
        char *dcopy = xstrdup(path);
        if (dcopy) {
            int dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd >= 0) {
                fsync(dfd); /* best effort: some filesystems refuse fsync on directories */
                close(dfd);
            }
            free(dcopy);
        }
    }
    goto done;
write_err:
    st = ct_error(CT_ERR_IO, "%s: write failed: %s (the previous file, if any, is untouched)", path, strerror(errno));
done:
    if (fd >= 0) close(fd);
    if (tmp) {
        unlink(tmp);
        free(tmp);
    }
    free(json);
    cJSON_Delete(root);
    free(order);
    return st;
}

int ct_st_remove_stale_tmp(const char *path) {
    char *dcopy = xstrdup(path), *bcopy = xstrdup(path), dir[4096];
    if (!dcopy || !bcopy) { free(dcopy); free(bcopy); return 0; }
    snprintf(dir, sizeof dir, "%s", dirname(dcopy));
    const char *base = basename(bcopy);
    size_t bl = strlen(base);
    int removed = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        /* <base>.tmp.<pid>.<hex>, as ct_st_writer_save names it */
        if (strncmp(e->d_name, base, bl) || strncmp(e->d_name + bl, ".tmp.", 5)) continue;
        char *end;
        long pid = strtol(e->d_name + bl + 5, &end, 10);
        if (pid <= 0 || *end != '.') continue;
        /* a live process other than this one may be saving right now (EPERM: alive, not ours) */
        if (pid != (long)getpid() && (kill((pid_t)pid, 0) == 0 || errno == EPERM)) continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) == 0) {
            removed++;
            CT_LOG_WARN_("io", "removed %s, left by an interrupted save of process %ld", p, pid);
        }
    }
    if (d) closedir(d);
    free(dcopy);
    free(bcopy);
    return removed;
}
