/* Sharded checkpoints of ct_fsdp (ctrain/fsdp.h).
 *
 * Each rank writes only what it owns, so a checkpoint costs each rank 1/N of the model's
 * bytes, and nothing is gathered to write it. The index records, per parameter, which rank's
 * file holds which element range; a reader asks for an element range of a parameter (its own
 * shard at any world size, or the whole tensor) and copies the overlaps out of the files that
 * hold them. Reading validates everything into scratch buffers first and copies into the live
 * state only when every range was found whole: a bad checkpoint changes nothing.
 * On a device the shards and the optimizer's state go to the host for the write or the copy in
 * and back after (host_trip.c, as a GPU model's whole checkpoint does); P's buffers are staged. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>

#include "ctrain/train.h"
#include "train/fsdp_internal.h"
#include "train/host_trip.h"

#define INDEX_MAX_BYTES (256u << 20)

void ct_fsdp_shard_file(int r, int n, char *buf, size_t cap) { snprintf(buf, cap, "shard-%05d-of-%05d.safetensors", r, n); }

/* ---- writing ---- */

ct_status ct_fsdp_host_buffers_(ct_fsdp *f, const float **out, float **own) {
    size_t nb = ct_params_buffer_numel(f->P);
    *own = NULL;
    *out = ct_params_buffer_data(f->P);
    if (f->dev.type == CT_DEV_CPU || nb == 0) return CT_OK;
    if (!(*own = malloc(nb * sizeof(float)))) return ct_error(CT_ERR_NOMEM, "fsdp: out of memory for the buffers");
    *out = *own;
    return ct_device_copy(f->dev, *own, ct_params_buffer_data(f->P), nb * sizeof(float), false);
}

/* this rank's file, from host memory */
static ct_status save_shard(ct_fsdp *f, const char *dir) {
    const float *bufs = NULL;
    float *own = NULL;
    ct_status st = f->me == 0 ? ct_fsdp_host_buffers_(f, &bufs, &own) : CT_OK;
    ct_st_writer *w = NULL;
    if (st == CT_OK) st = ct_st_writer_create(&w);
    if (st != CT_OK) {
        free(own);
        return st;
    }
    int64_t *lens = malloc(sizeof(int64_t) * (size_t)(ct_params_count(f->S) + 1));
    if (!lens) st = ct_error(CT_ERR_NOMEM, "fsdp: out of memory");
    for (int k = 0; k < f->nu && st == CT_OK; k++)
        for (int j = 0; j < f->u[k].npieces && st == CT_OK; j++) {
            const piece *pc = &f->u[k].pieces[j];
            lens[pc->sidx] = (int64_t)pc->len;
            st = ct_st_writer_add(w, ct_params_get(f->P, pc->pidx)->name, CT_F32, 1, &lens[pc->sidx],
                                  ct_f32(ct_params_get(f->S, pc->sidx)));
        }
    if (st == CT_OK) st = ct_checkpoint_add_optim(w, f->opt, "optim.");
    /* buffers (running statistics) are the same on every rank: rank 0's file has them */
    char name[1100];
    for (int i = 0; f->me == 0 && i < ct_params_count(f->P) && st == CT_OK; i++) {
        const ct_tensor *t = ct_params_get(f->P, i);
        if (!ct_params_is_buffer(f->P, i)) continue;
        snprintf(name, sizeof name, "buffer.%s", t->name);
        st = ct_st_writer_add(w, name, CT_F32, t->ndim, t->shape, bufs + (ct_f32(t) - ct_params_buffer_data(f->P)));
    }
    char v[32];
    snprintf(v, sizeof v, "%d", f->me);
    if (st == CT_OK) st = ct_st_writer_set_metadata(w, "rank", v);
    snprintf(v, sizeof v, "%d", f->n);
    if (st == CT_OK) st = ct_st_writer_set_metadata(w, "world_size", v);
    if (st == CT_OK) st = ct_st_writer_set_metadata(w, "format", "ctrain-fsdp-shard-1");
    char path[4300];
    size_t dl = strlen(dir);
    snprintf(path, sizeof path, "%s/", dir);
    if (dl + 1 < sizeof path) ct_fsdp_shard_file(f->me, f->n, path + dl + 1, sizeof path - dl - 1);
    if (st == CT_OK) st = ct_st_writer_save(w, path);
    ct_st_writer_free(w);
    free(lens);
    free(own);
    return st;
}

ct_status ct_fsdp_save_shard(ct_fsdp *f, const char *dir) {
    ct_train_model shards = {.params = f->S};
    ct_device was;
    ct_status st = ct_train_to_host_(&shards, f->opt, &was);
    return st != CT_OK ? st : ct_train_from_host_(&shards, f->opt, was, save_shard(f, dir));
}

ct_status ct_fsdp_save_index(const ct_fsdp *f, const char *dir) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return ct_error(CT_ERR_NOMEM, "fsdp: out of memory");
    cJSON_AddStringToObject(root, "format", "ctrain-fsdp-1");
    cJSON_AddNumberToObject(root, "world_size", f->n);
    cJSON_AddStringToObject(root, "optimizer", ct_optim_kind(f->opt));
    cJSON *files = cJSON_AddArrayToObject(root, "files"), *params = cJSON_AddObjectToObject(root, "params");
    char fn[64];
    for (int r = 0; r < f->n; r++) {
        ct_fsdp_shard_file(r, f->n, fn, sizeof fn);
        cJSON_AddItemToArray(files, cJSON_CreateString(fn));
    }
    for (int k = 0; k < f->nu; k++) {
        const unit *u = &f->u[k];
        for (int i = u->first; i <= u->last; i++) {
            if (f->unit_of[i] != k) continue;
            const ct_tensor *t = ct_params_get(f->P, i);
            size_t lo = ct_params_offset(f->P, i), hi = lo + (size_t)ct_numel(t);
            cJSON *e = cJSON_AddObjectToObject(params, t->name), *shape = cJSON_AddArrayToObject(e, "shape"),
                  *shards = cJSON_AddArrayToObject(e, "shards");
            for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
            for (int r = 0; r < f->n; r++) {
                size_t a, b;
                ct_fsdp_rank_range_(u, r, &a, &b);
                if (a < lo) a = lo;
                if (b > hi) b = hi;
                if (a >= b) continue;
                double e3[3] = {r, (double)(a - lo), (double)(b - a)};
                cJSON_AddItemToArray(shards, cJSON_CreateDoubleArray(e3, 3));
            }
        }
    }
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    if (!txt) return ct_error(CT_ERR_NOMEM, "fsdp: out of memory for the index");
    char path[4300];
    snprintf(path, sizeof path, "%s/%s", dir, CT_FSDP_INDEX);
    FILE *fp = fopen(path, "wb");
    size_t len = strlen(txt);
    ct_status st = CT_OK;
    if (!fp || fwrite(txt, 1, len, fp) != len || fflush(fp) != 0 || fsync(fileno(fp)) != 0)
        st = ct_error(CT_ERR_IO, "%s: %s", path, strerror(errno ? errno : EIO));
    if (fp && fclose(fp) != 0 && st == CT_OK) st = ct_error(CT_ERR_IO, "%s: %s", path, strerror(errno));
    free(txt);
    return st;
}

/* ---- reading ---- */

typedef struct {
    int r;
    size_t off, len;
} span;

typedef struct {
    char path[4300];       /* the index */
    cJSON *root, *params;
    const char *optimizer;
    int n;
    ct_st_file **files;
} idx;

static void idx_close(idx *X) {
    for (int r = 0; X->files && r < X->n; r++) ct_st_close(X->files[r]);
    free(X->files);
    cJSON_Delete(X->root);
    memset(X, 0, sizeof *X);
}

static bool whole(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && v->valuedouble >= lo && v->valuedouble <= hi && v->valuedouble == (double)(int64_t)v->valuedouble;
}

/* the index parsed and checked, every shard file it names opened (each validated whole) */
static ct_status idx_open(const char *dir, idx *X) {
    memset(X, 0, sizeof *X);
    snprintf(X->path, sizeof X->path, "%s/%s", dir, CT_FSDP_INDEX);
    FILE *fp = fopen(X->path, "rb");
    if (!fp) return ct_error(errno == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO, "%s: %s", X->path, strerror(errno));
    char *buf = NULL;
    long size = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
    ct_status st = CT_OK;
    if (size < 0 || (unsigned long)size > INDEX_MAX_BYTES)
        st = ct_error(CT_ERR_FORMAT, "%s: %ld bytes: not an index (at most %u)", X->path, size, INDEX_MAX_BYTES);
    else if (!(buf = malloc((size_t)size + 1)))
        st = ct_error(CT_ERR_NOMEM, "%s: out of memory", X->path);
    else if (fseek(fp, 0, SEEK_SET) != 0 || fread(buf, 1, (size_t)size, fp) != (size_t)size)
        st = ct_error(CT_ERR_IO, "%s: cannot read it", X->path);
    fclose(fp);
    if (st != CT_OK) { free(buf); return st; }
    buf[size] = 0;
    X->root = cJSON_Parse(buf);
    free(buf);
    cJSON *ws = cJSON_GetObjectItemCaseSensitive(X->root, "world_size"), *files = cJSON_GetObjectItemCaseSensitive(X->root, "files"),
          *opt = cJSON_GetObjectItemCaseSensitive(X->root, "optimizer");
    X->params = cJSON_GetObjectItemCaseSensitive(X->root, "params");
    if (!X->root || !whole(ws, 1, 1 << 20) || !cJSON_IsArray(files) || cJSON_GetArraySize(files) != (int)ws->valuedouble ||
        !cJSON_IsObject(X->params) || !cJSON_IsString(opt)) {
        st = ct_error(CT_ERR_FORMAT, "%s: not a sharded checkpoint index (world_size, files, optimizer, params)", X->path);
        idx_close(X);
        return st;
    }
    X->n = (int)ws->valuedouble;
    X->optimizer = opt->valuestring;
    /* the names are ours, never a path the file chose */
    char want[64], p[4400];
    X->files = calloc((size_t)X->n, sizeof *X->files);
    if (!X->files) st = ct_error(CT_ERR_NOMEM, "out of memory");
    for (int r = 0; r < X->n && st == CT_OK; r++) {
        ct_fsdp_shard_file(r, X->n, want, sizeof want);
        const cJSON *e = cJSON_GetArrayItem(files, r);
        if (!cJSON_IsString(e) || strcmp(e->valuestring, want))
            st = ct_error(CT_ERR_FORMAT, "%s: files[%d] should be \"%s\"", X->path, r, want);
        snprintf(p, sizeof p, "%s/%s", dir, want);
        if (st == CT_OK) st = ct_st_open(p, &X->files[r]);
    }
    /* every span in range: rank < n, offset + length <= the shape's elements */
    const cJSON *e;
    cJSON_ArrayForEach(e, X->params) {
        if (st != CT_OK) break;
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape"), *shards = cJSON_GetObjectItemCaseSensitive(e, "shards"), *d;
        double numel = 1;
        bool ok = cJSON_IsArray(shape) && cJSON_IsArray(shards) && cJSON_GetArraySize(shape) <= CT_MAX_DIMS;
        cJSON_ArrayForEach(d, shape) { ok = ok && whole(d, 0, 1e15); numel *= ok ? d->valuedouble : 0; }
        cJSON_ArrayForEach(d, shards) {
            const cJSON *r = cJSON_GetArrayItem(d, 0), *o = cJSON_GetArrayItem(d, 1), *l = cJSON_GetArrayItem(d, 2);
            ok = ok && cJSON_GetArraySize(d) == 3 && whole(r, 0, X->n - 1) && whole(o, 0, numel) && whole(l, 1, numel) &&
                 o->valuedouble + l->valuedouble <= numel;
        }
        if (!ok) st = ct_error(CT_ERR_FORMAT, "%s: parameter '%s': shape or shards out of range", X->path, e->string);
    }
    if (st != CT_OK) idx_close(X);
    return st;
}

/* Every trainable parameter of P in the index with its shape, and nothing else there. */
static ct_status check_params(const idx *X, const ct_params *P) {
    int count = 0;
    char a[96], b[96];
    for (int i = 0; i < ct_params_count(P); i++) {
        const ct_tensor *t = ct_params_get(P, i);
        if (ct_params_is_buffer(P, i) || ct_numel(t) == 0) continue;
        count++;
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(X->params, t->name);
        if (!e) return ct_error(CT_ERR_MISMATCH, "%s: no parameter '%s' in this checkpoint: it is of another model", X->path, t->name);
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        bool same = cJSON_GetArraySize(shape) == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = cJSON_GetArrayItem(shape, d)->valuedouble == (double)t->shape[d];
        if (!same) {
            size_t o = 0;
            o += (size_t)snprintf(a + o, sizeof a - o, "[");
            for (int d = 0; d < cJSON_GetArraySize(shape) && o < sizeof a - 16; d++)
                o += (size_t)snprintf(a + o, sizeof a - o, "%s%.0f", d ? ", " : "", cJSON_GetArrayItem(shape, d)->valuedouble);
            snprintf(a + o, sizeof a - o, "]");
            return ct_error(CT_ERR_MISMATCH, "%s: parameter '%s' is %s in the checkpoint, %s in this model", X->path, t->name, a,
                            ct_shape_str(t, b, sizeof b));
        }
    }
    if (cJSON_GetArraySize(X->params) != count)
        return ct_error(CT_ERR_MISMATCH, "%s: %d parameters in the checkpoint, %d in this model: it is of another model", X->path,
                        cJSON_GetArraySize(X->params), count);
    return CT_OK;
}

/* Elements [poff, poff + len) of parameter pname's tensor prefix + pname into dst, from
 * whichever files hold them; every element exactly once. */
static ct_status read_range(const idx *X, const char *prefix, const char *pname, size_t poff, size_t len, float *dst) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(X->params, pname), *sp;
    char name[1200];
    snprintf(name, sizeof name, "%s%s", prefix, pname);
    size_t covered = 0;
    cJSON_ArrayForEach(sp, cJSON_GetObjectItemCaseSensitive(e, "shards")) {
        int r = (int)cJSON_GetArrayItem(sp, 0)->valuedouble;
        size_t off = (size_t)cJSON_GetArrayItem(sp, 1)->valuedouble, l = (size_t)cJSON_GetArrayItem(sp, 2)->valuedouble;
        size_t lo = poff > off ? poff : off, hi = poff + len < off + l ? poff + len : off + l;
        if (lo >= hi) continue;
        ct_st_tensor t;
        if (ct_st_get(X->files[r], name, &t) != CT_OK)
            return ct_error(CT_ERR_FORMAT, "%s: no tensor '%s', which the index places there", ct_st_path(X->files[r]), name);
        if (t.dtype != CT_F32 || t.ndim != 1 || t.shape[0] != (int64_t)l)
            return ct_error(CT_ERR_FORMAT, "%s: tensor '%s' is %s %d-d, the index says F32 [%zu]", ct_st_path(X->files[r]), name,
                            ct_dtype_name(t.dtype), t.ndim, l);
        memcpy(dst + (lo - poff), (const char *)t.data + (lo - off) * sizeof(float), (hi - lo) * sizeof(float));
        covered += hi - lo;
    }
    if (covered != len)
        return ct_error(CT_ERR_FORMAT, "%s: parameter '%s': elements [%zu, %zu) are held %zu times in all, not once each", X->path,
                        pname, poff, poff + len, covered);
    return CT_OK;
}

/* the optimizer's step counter, "optim.step" (a shard file's or a whole train state's) */
static ct_status read_step(const ct_st_file *f, int64_t *step) {
    ct_st_tensor t;
    if (ct_st_get(f, "optim.step", &t) != CT_OK || t.dtype != CT_I64 || t.nbytes != sizeof *step)
        return ct_error(CT_ERR_FORMAT, "%s: no I64 'optim.step'", ct_st_path(f));
    memcpy(step, t.data, sizeof *step);
    if (*step < 0) return ct_error(CT_ERR_FORMAT, "%s: 'optim.step' is negative", ct_st_path(f));
    return CT_OK;
}

/* P's buffers from rank 0's file into dst (ct_params_buffer_data's layout) */
static ct_status read_buffers(const idx *X, const ct_params *P, float *dst) {
    char name[1100];
    const float *base = ct_params_buffer_data(P);
    for (int i = 0; i < ct_params_count(P); i++) {
        const ct_tensor *t = ct_params_get(P, i);
        if (!ct_params_is_buffer(P, i)) continue;
        snprintf(name, sizeof name, "buffer.%s", t->name);
        ct_st_tensor s;
        if (ct_st_get(X->files[0], name, &s) != CT_OK || s.dtype != CT_F32 || s.nbytes != (size_t)ct_numel(t) * sizeof(float))
            return ct_error(CT_ERR_FORMAT, "%s: no F32 '%s' of %lld elements", ct_st_path(X->files[0]), name, (long long)ct_numel(t));
        memcpy(dst + (ct_f32(t) - base), s.data, s.nbytes);
    }
    return CT_OK;
}

static ct_status check_optim(const idx *X, const ct_optim *o) {
    if (o && strcmp(X->optimizer, ct_optim_kind(o)))
        return ct_error(CT_ERR_MISMATCH, "%s: checkpoint optimizer '%s', this run uses '%s'", X->path, X->optimizer, ct_optim_kind(o));
    return CT_OK;
}

/* "optim.<state>." */
static void state_prefix(const ct_optim *o, int s, char *buf, size_t cap) {
    const char *name;
    ct_optim_state_buffer(o, s, &name, NULL, NULL);
    snprintf(buf, cap, "optim.%s.", name);
}

/* All or none: this rank's outcome st agreed with every rank's (a rank that could not read
 * stops all before the gathers); then tmp (the shards' values, each optimizer state's, then nb
 * floats of buffers) and the step counter copied into place and the kept units gathered.
 * Frees tmp. Collective. */
static ct_status commit_shards(ct_fsdp *f, const char *dir, ct_status st, float *tmp, int64_t step, size_t nb) {
    size_t ns = ct_params_numel(f->S);
    int nstate = ct_optim_state_count(f->opt);
    int32_t bad = st != CT_OK ? f->me + 1 : 0;
    ct_status cs = ct_all_reduce_sync(f->pg, &bad, 1, CT_I32, CT_RED_MAX);
    if (st == CT_OK && cs != CT_OK) st = cs;
    if (st == CT_OK && bad) st = ct_error(CT_ERR_IO, "reading the checkpoint %s failed on rank %d (see its message)", dir, bad - 1);
    ct_train_model shards = {.params = f->S};
    ct_device was;
    if (st == CT_OK && (st = ct_train_to_host_(&shards, f->opt, &was)) == CT_OK) {
        memcpy(ct_params_data(f->S), tmp, ns * sizeof(float));
        for (int s = 0; s < nstate; s++) {
            float *d;
            ct_optim_state_buffer(f->opt, s, NULL, &d, NULL);
            memcpy(d, tmp + (size_t)(1 + s) * ns, ns * sizeof(float));
        }
        *(int64_t *)ct_optim_state_tensor_at(f->opt, 0).data = step;
        ct_status bs = nb ? ct_device_copy(f->dev, ct_params_buffer_data(f->P), tmp + (size_t)(1 + nstate) * ns, nb * sizeof(float), true)
                          : CT_OK;
        st = ct_train_from_host_(&shards, f->opt, was, bs);
    }
    free(tmp);
    return st == CT_OK ? ct_fsdp_regather_(f) : st;
}

ct_status ct_fsdp_load_shards(ct_fsdp *f, const char *dir) {
    idx X;
    ct_status st = idx_open(dir, &X);
    if (st == CT_OK) st = check_params(&X, f->P);
    if (st == CT_OK) st = check_optim(&X, f->opt);
    size_t ns = ct_params_numel(f->S), nb = ct_params_buffer_numel(f->P);
    int nstate = ct_optim_state_count(f->opt);
    float *tmp = st == CT_OK ? malloc(((size_t)(1 + nstate) * ns + nb + 1) * sizeof(float)) : NULL;
    if (st == CT_OK && !tmp) st = ct_error(CT_ERR_NOMEM, "fsdp: out of memory to read the shards");
    char prefix[256];
    for (int k = 0; k < f->nu && st == CT_OK; k++)
        for (int j = 0; j < f->u[k].npieces && st == CT_OK; j++) {
            const piece *pc = &f->u[k].pieces[j];
            const char *name = ct_params_get(f->P, pc->pidx)->name;
            size_t poff = pc->goff - ct_params_offset(f->P, pc->pidx), at = ct_params_offset(f->S, pc->sidx);
            st = read_range(&X, "", name, poff, pc->len, tmp + at);
            for (int s = 0; s < nstate && st == CT_OK; s++) {
                state_prefix(f->opt, s, prefix, sizeof prefix);
                st = read_range(&X, prefix, name, poff, pc->len, tmp + (size_t)(1 + s) * ns + at);
            }
        }
    int64_t step = 0;
    if (st == CT_OK) st = read_step(X.files[0], &step);
    if (st == CT_OK && nb) st = read_buffers(&X, f->P, tmp + (size_t)(1 + nstate) * ns);
    idx_close(&X);
    return commit_shards(f, dir, st, tmp, step, nb);
}

ct_status ct_fsdp_read_full(const char *dir, ct_params *P, ct_optim *o) {
    CT_CHECK(!o || ct_optim_params(o) == P, "ct_fsdp_read_full: the optimizer must be over P");
    idx X;
    ct_status st = idx_open(dir, &X);
    if (st == CT_OK) st = check_params(&X, P);
    if (st == CT_OK) st = check_optim(&X, o);
    size_t n = ct_params_numel(P), nb = ct_params_buffer_numel(P);
    int nstate = o ? ct_optim_state_count(o) : 0;
    float *tmp = st == CT_OK ? calloc((size_t)(1 + nstate) * n + nb + 1, sizeof(float)) : NULL;
    if (st == CT_OK && !tmp) st = ct_error(CT_ERR_NOMEM, "out of memory to read the checkpoint %s whole", dir);
    char prefix[256];
    for (int i = 0; i < ct_params_count(P) && st == CT_OK; i++) {
        const ct_tensor *t = ct_params_get(P, i);
        if (ct_params_is_buffer(P, i) || ct_numel(t) == 0) continue;
        size_t at = ct_params_offset(P, i);
        st = read_range(&X, "", t->name, 0, (size_t)ct_numel(t), tmp + at);
        for (int s = 0; s < nstate && st == CT_OK; s++) {
            state_prefix(o, s, prefix, sizeof prefix);
            st = read_range(&X, prefix, t->name, 0, (size_t)ct_numel(t), tmp + (size_t)(1 + s) * n + at);
        }
    }
    int64_t step = 0;
    if (st == CT_OK && o) st = read_step(X.files[0], &step);
    if (st == CT_OK && nb) st = read_buffers(&X, P, tmp + (size_t)(1 + nstate) * n);
    if (st == CT_OK) {
        memcpy(ct_params_data(P), tmp, n * sizeof(float));
        for (int s = 0; s < nstate; s++) {
            float *d;
            ct_optim_state_buffer(o, s, NULL, &d, NULL);
            memcpy(d, tmp + (size_t)(1 + s) * n, n * sizeof(float));
        }
        if (o) *(int64_t *)ct_optim_state_tensor_at(o, 0).data = step;
        if (nb) memcpy(ct_params_buffer_data(P), tmp + (size_t)(1 + nstate) * n, nb * sizeof(float));
    }
    free(tmp);
    idx_close(&X);
    return st;
}

int ct_fsdp_checkpoint_world(const char *dir) {
    char path[4300];
    snprintf(path, sizeof path, "%s/%s", dir, CT_FSDP_INDEX);
    if (access(path, F_OK) != 0) return 0;
    FILE *fp = fopen(path, "rb");
    char buf[256] = "";
    size_t k = fp ? fread(buf, 1, sizeof buf - 1, fp) : 0;
    if (fp) fclose(fp);
    buf[k] = 0;
    const char *w = strstr(buf, "\"world_size\":");
    int n = w ? atoi(w + 13) : 0;
    return n > 0 ? n : 0;
}

ct_status ct_fsdp_open_model(const char *dir, ct_model **out) {
    *out = NULL;
    char path[4300];
    snprintf(path, sizeof path, "%s/train_state.safetensors", dir);
    ct_status st = ct_checkpoint_verify(dir);
    ct_st_file *f = NULL;
    if (st == CT_OK) st = ct_st_open(path, &f);
    ct_model_config cfg;
    double need = 0, have = 0;
    if (st == CT_OK) st = ct_model_config_from_metadata(f, &cfg, &need);
    if (st == CT_ERR_NOT_FOUND)
        st = ct_error(CT_ERR_FORMAT, "%s: no model config in it (a model the trainer was given as a module): it resumes, but cannot "
                      "be built alone", path);
    ct_st_close(f);
    idx X;
    if (st == CT_OK && (st = idx_open(dir, &X)) == CT_OK) {
        /* the config never allocates more than the shards hold */
        for (int r = 0; r < X.n; r++)
            for (int j = 0; j < ct_st_count(X.files[r]); j++) {
                ct_st_tensor t;
                if (ct_st_get(X.files[r], ct_st_name(X.files[r], j), &t) == CT_OK && t.dtype == CT_F32 &&
                    strncmp(ct_st_name(X.files[r], j), "optim.", 6))
                    have += (double)(t.nbytes / sizeof(float));
            }
        idx_close(&X);
        if (need > have)
            st = ct_error(CT_ERR_FORMAT, "%s: its config describes %.0f parameters, the shards hold %.0f values", path, need, have);
    }
    ct_model *m = NULL;
    if (st == CT_OK) st = ct_model_create(&cfg, 0, &m);
    if (st == CT_OK) st = ct_fsdp_read_full(dir, ct_model_params(m), NULL);
    if (st != CT_OK) {
        ct_model_free(m);
        return st;
    }
    *out = m;
    return CT_OK;
}

/* ---- an unsharded checkpoint into the shards ---- */

/* elements [poff, poff + len) of the whole tensor prefix + pname of f into dst */
static ct_status read_whole(const ct_st_file *f, const char *prefix, const ct_tensor *p, size_t poff, size_t len, float *dst) {
    char name[1200];
    snprintf(name, sizeof name, "%s%s", prefix, p->name);
    ct_st_tensor t;
    if (ct_st_get(f, name, &t) != CT_OK) return ct_error(CT_ERR_FORMAT, "%s: no tensor '%s'", ct_st_path(f), name);
    if (t.dtype != CT_F32 || t.nbytes != (size_t)ct_numel(p) * sizeof(float))
        return ct_error(CT_ERR_FORMAT, "%s: '%s' is not F32 of %lld elements", ct_st_path(f), name, (long long)ct_numel(p));
    memcpy(dst, (const char *)t.data + poff * sizeof(float), len * sizeof(float));
    return CT_OK;
}

ct_status ct_fsdp_load_whole_(ct_fsdp *f, const char *dir, const ct_train_model *m) {
    /* On the CPU the weights go whole into P (its mappings fault the pages in; the model's own
     * load reads its file), then this rank's pieces out. On a device P's released units are not
     * mapped: each piece (and each buffer) is read from the file by its name in P. */
    const bool dev = ct_params_device(f->P).type != CT_DEV_CPU;
    char path[4300];
    snprintf(path, sizeof path, "%s/train_state.safetensors", dir);
    ct_st_file *sf = NULL, *wf = NULL;
    ct_status st = ct_st_open(path, &sf);
    const char *opt = st == CT_OK ? ct_st_metadata(sf, "optimizer") : NULL;
    if (st == CT_OK && (!opt || strcmp(opt, ct_optim_kind(f->opt))))
        st = ct_error(CT_ERR_MISMATCH, "%s: checkpoint optimizer '%s', this run uses '%s'", dir, opt ? opt : "?", ct_optim_kind(f->opt));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st == CT_OK) st = dev ? ct_st_open(path, &wf) : m->load ? m->load(m->self, path) : ct_params_load(f->P, path);
    size_t ns = ct_params_numel(f->S), nb = dev ? ct_params_buffer_numel(f->P) : 0;
    int nstate = ct_optim_state_count(f->opt);
    float *tmp = st == CT_OK ? malloc(((size_t)(1 + nstate) * ns + nb + 1) * sizeof(float)) : NULL;
    if (st == CT_OK && !tmp) st = ct_error(CT_ERR_NOMEM, "fsdp: out of memory to read the checkpoint");
    char prefix[256];
    for (int k = 0; k < f->nu && st == CT_OK; k++)
        for (int j = 0; j < f->u[k].npieces && st == CT_OK; j++) {
            const piece *pc = &f->u[k].pieces[j];
            const ct_tensor *p = ct_params_get(f->P, pc->pidx);
            size_t poff = pc->goff - ct_params_offset(f->P, pc->pidx), at = ct_params_offset(f->S, pc->sidx);
            if (dev) st = read_whole(wf, "", p, poff, pc->len, tmp + at);
            else memcpy(tmp + at, ct_params_data(f->P) + pc->goff, pc->len * sizeof(float));
            for (int s = 0; s < nstate && st == CT_OK; s++) {
                state_prefix(f->opt, s, prefix, sizeof prefix);
                st = read_whole(sf, prefix, p, poff, pc->len, tmp + (size_t)(1 + s) * ns + at);
            }
        }
    float *bufs = tmp ? tmp + (size_t)(1 + nstate) * ns : NULL;
    for (int i = 0; nb && i < ct_params_count(f->P) && st == CT_OK; i++) {
        const ct_tensor *t = ct_params_get(f->P, i);
        if (ct_params_is_buffer(f->P, i))
            st = read_whole(wf, "", t, 0, (size_t)ct_numel(t), bufs + (ct_f32(t) - ct_params_buffer_data(f->P)));
    }
    int64_t step = 0;
    if (st == CT_OK) st = read_step(sf, &step);
    ct_st_close(sf);
    ct_st_close(wf);
    if (!dev) ct_fsdp_drop_released_(f);
    return commit_shards(f, dir, st, tmp, step, nb);
}
