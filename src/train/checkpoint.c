/* Checkpoints: write everything into a hidden temporary directory, fsync each file and the
 * directory, then rename it into place. A reader only trusts a directory whose manifest
 * lists every file with the right size and CRC-32.
 *
 * Every directory that is not a complete checkpoint has a hidden name, so a kill at any
 * moment leaves nothing that looks like one: `.step-N.tmp.<pid>` while being written,
 * `.step-N.old.<pid>` for the copy a re-save of step N replaces, `.step-N.del.<pid>` for a
 * pruned one (renamed first, then emptied). ct_checkpoint_cleanup removes what a dead
 * process left of these at the next start. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zlib.h>
#include <cjson/cJSON.h>

#include "ctrain/train.h"
#include "train/fsdp_internal.h"
#include "train/host_trip.h"
#include "train/resume.h"

static const char *FILES[] = {"model.safetensors", "train_state.safetensors"};
#define NFILES 2

static ct_status mkdirs(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return ct_error(CT_ERR_IO, "cannot create %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return ct_error(CT_ERR_IO, "cannot create %s: %s", buf, strerror(errno));
    return CT_OK;
}

static void rmtree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4096];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static void fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd >= 0) { fsync(fd); close(fd); }
}

static ct_status file_crc(const char *path, uint32_t *crc, int64_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return ct_error(errno == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO, "%s: %s", path, strerror(errno));
    unsigned char buf[1 << 16];
    uLong c = crc32(0, NULL, 0);
    int64_t n = 0;
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, f)) > 0) { c = crc32(c, buf, (uInt)r); n += (int64_t)r; }
    int err = ferror(f);
    fclose(f);
    if (err) return ct_error(CT_ERR_IO, "%s: read error", path);
    *crc = (uint32_t)c;
    *size = n;
    return CT_OK;
}

/* ---- optimizer state as named tensors ---- */

static ct_status state_name(char *buf, size_t cap, const char *prefix, const ct_optim_state_tensor *v) {
    int k = v->param ? snprintf(buf, cap, "%s%s.%s", prefix, v->state, v->param) : snprintf(buf, cap, "%s%s", prefix, v->state);
    if (k < 0 || (size_t)k >= cap) return ct_error(CT_ERR_INVALID, "optimizer state: name too long: %s%s...", prefix, v->state);
    return CT_OK;
}

ct_status ct_checkpoint_add_optim(ct_st_writer *w, ct_optim *o, const char *prefix) {
    char name[1024];
    if (!prefix) prefix = "";
    int n = ct_optim_state_tensor_count(o);
    for (int i = 0; i < n; i++) {
        ct_optim_state_tensor v = ct_optim_state_tensor_at(o, i);
        ct_status st = state_name(name, sizeof name, prefix, &v);
        if (st == CT_OK) st = ct_st_writer_add(w, name, v.dtype, v.ndim, v.shape, v.data);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

ct_status ct_checkpoint_read_optim(const ct_st_file *f, ct_optim *o, const char *prefix) {
    char name[1024];
    if (!prefix) prefix = "";
    int n = ct_optim_state_tensor_count(o);
    /* validate everything first, then copy: a bad file leaves the optimizer untouched */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            ct_optim_state_tensor v = ct_optim_state_tensor_at(o, i);
            ct_st_tensor t;
            ct_status st = state_name(name, sizeof name, prefix, &v);
            if (st != CT_OK) return st;
            if ((st = ct_st_get(f, name, &t)) != CT_OK)
                return ct_error(st, "%s: optimizer state '%s': %s", ct_st_path(f), name, ct_status_str(st));
            if (v.dtype == CT_I64) { /* the step counter */
                int64_t step;
                if (t.dtype != CT_I64 || t.nbytes != sizeof step)
                    return ct_error(CT_ERR_FORMAT, "%s: optimizer state '%s' must be one I64", ct_st_path(f), name);
                memcpy(&step, t.data, sizeof step);
                if (step < 0) return ct_error(CT_ERR_FORMAT, "%s: optimizer state '%s' is negative", ct_st_path(f), name);
                if (pass) memcpy(v.data, &step, sizeof step);
                continue;
            }
            bool same = t.dtype == v.dtype && t.ndim == v.ndim;
            for (int d = 0; same && d < v.ndim; d++) same = t.shape[d] == v.shape[d];
            if (!same) {
                char sb[96];
                ct_shape_str(ct_params_find(ct_optim_params(o), v.param), sb, sizeof sb);
                return ct_error(CT_ERR_FORMAT, "%s: optimizer state '%s' is %s %d-d, parameter is %s", ct_st_path(f), name,
                                ct_dtype_name(t.dtype), t.ndim, sb);
            }
            if (pass) memcpy(v.data, t.data, t.nbytes);
        }
    }
    return CT_OK;
}

/* ---- checkpoint directories ---- */

static ct_status save_weights(const ct_train_model *m, const char *path) {
    return m->save ? m->save(m->self, path) : ct_params_save(m->params, path);
}
static ct_status load_weights(const ct_train_model *m, const char *path) {
    return m->load ? m->load(m->self, path) : ct_params_load(m->params, path);
}

/* sharded: the world size of a sharded checkpoint, whose optimizer state is in the shards
 * (o then gives only its kind); 0 for a whole one */
static ct_status write_train_state(const char *path, ct_optim *o, const ct_train_state *ts, const ct_train_model *m, int sharded) {
    ct_st_writer *w;
    ct_status st = ct_st_writer_create(&w);
    if (st != CT_OK) return st;
    if (o && !sharded) st = ct_checkpoint_add_optim(w, o, "optim.");
    char v[64];
#define META(k, fmt, x) do { snprintf(v, sizeof v, fmt, x); if (st == CT_OK) st = ct_st_writer_set_metadata(w, k, v); } while (0)
    META("step", "%" PRId64, ts->step);
    META("epoch", "%" PRId64, ts->epoch);
    META("sampler.seed", "%" PRIu64, ts->sampler.seed);
    META("sampler.epoch", "%" PRId64, ts->sampler.epoch);
    META("sampler.position", "%" PRId64, ts->sampler.position);
    META("seed", "%" PRIu64, ts->seed);
    META("world_size", "%d", ts->world_size);
    META("loss_scale", "%.17g", ts->loss_scale);
    META("scaler_growth_tracker", "%" PRId64, ts->scaler_growth_tracker);
    META("model", "%s", m->kind ? m->kind : "model");
    META("optimizer", "%s", o ? ct_optim_kind(o) : "none");
    if (sharded) META("sharded", "%d", sharded);
    if (sharded && m->save_config && st == CT_OK) st = m->save_config(m->self, w);
#undef META
    if (st == CT_OK) st = ct_st_writer_save(w, path);
    ct_st_writer_free(w);
    return st;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted names of step-* directories under root (caller frees). */
static int list_ckpts(const char *root, char ***out) {
    *out = NULL;
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0, cap = 0;
    char **v = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        /* exactly step-<digits>: not the step-N.old.<pid> an older version left visible */
        if (strncmp(e->d_name, "step-", 5) || !e->d_name[5] || strspn(e->d_name + 5, "0123456789") != strlen(e->d_name + 5))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nv = realloc(v, sizeof *v * (size_t)cap);
            if (!nv) break;
            v = nv;
        }
        v[n++] = strdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_str);
    *out = v;
    return n;
}

ct_status ct_checkpoint_free_space(const char *dir, uint64_t need, const char *what) {
    struct statvfs sv;
    /* unknown free space (statvfs unsupported) is not a reason to refuse: the write itself reports */
    if (statvfs(dir, &sv) != 0 || sv.f_frsize == 0) return CT_OK;
    uint64_t avail = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    if (avail >= need) return CT_OK;
    return ct_error(CT_ERR_IO, "%s: %s needs at least %" PRIu64 " bytes, %" PRIu64 " are free: %s (nothing written)", dir, what,
                    need, avail, strerror(ENOSPC));
}

/* What a checkpoint takes at least: the weights and the optimizer state as raw f32 (the
 * headers, the manifest and a tied GPT head come on top, hence "at least"). */
static uint64_t ckpt_min_bytes(const ct_train_model *m, ct_optim *o) {
    uint64_t n = (uint64_t)ct_params_numel(m->params) * sizeof(float);
    int k = o ? ct_optim_state_tensor_count(o) : 0;
    for (int i = 0; i < k; i++) {
        ct_optim_state_tensor v = ct_optim_state_tensor_at(o, i);
        uint64_t e = ct_dtype_size(v.dtype);
        for (int d = 0; d < v.ndim; d++) e *= (uint64_t)v.shape[d];
        n += e;
    }
    return n;
}

/* The manifest of tmp's files (sizes, CRC-32), fsync, then tmp renamed to fin (a re-save
 * replacing the old fin) and the oldest checkpoints beyond keep pruned. tmp is removed on
 * failure. */
static ct_status commit(const char *root, const char *tmp, const char *fin, int64_t step, const char *const *files_, int nfiles,
                        const char *format, int keep) {
    ct_status st = CT_OK;
    char path[4200];
    cJSON *man = cJSON_CreateObject(), *files = cJSON_AddObjectToObject(man, "files");
    cJSON_AddNumberToObject(man, "step", (double)step);
    cJSON_AddStringToObject(man, "format", format);
    for (int i = 0; st == CT_OK && i < nfiles; i++) {
        uint32_t crc;
        int64_t size;
        snprintf(path, sizeof path, "%s/%s", tmp, files_[i]);
        st = file_crc(path, &crc, &size);
        if (st != CT_OK) break;
        cJSON *f = cJSON_AddObjectToObject(files, files_[i]);
        cJSON_AddNumberToObject(f, "bytes", (double)size);
        cJSON_AddNumberToObject(f, "crc32", (double)crc);
    }
    if (st == CT_OK) {
        char *txt = cJSON_Print(man);
        snprintf(path, sizeof path, "%s/manifest.json", tmp);
        FILE *f = fopen(path, "wb");
        size_t len = strlen(txt);
        if (!f || fwrite(txt, 1, len, f) != len || fflush(f) != 0 || fsync(fileno(f)) != 0)
            st = ct_error(CT_ERR_IO, "%s: %s", path, strerror(errno ? errno : EIO));
        if (f && fclose(f) != 0 && st == CT_OK) st = ct_error(CT_ERR_IO, "%s: %s", path, strerror(errno));
        free(txt);
    }
    cJSON_Delete(man);
    if (st == CT_OK) {
        fsync_path(tmp);
        /* re-saving a step (after a resume) replaces the old directory */
        char old[4200];
        snprintf(old, sizeof old, "%s/.step-%08" PRId64 ".old.%d", root, step, (int)getpid());
        bool had = rename(fin, old) == 0;
        if (rename(tmp, fin) != 0) {
            st = ct_error(CT_ERR_IO, "cannot rename %s to %s: %s", tmp, fin, strerror(errno));
            if (had) rename(old, fin);
        } else if (had) {
            rmtree(old);
        }
        fsync_path(root);
    }
    if (st != CT_OK) {
        rmtree(tmp);
        return st;
    }
    CT_LOG_INFO("ckpt", "saved %s", fin);
    if (keep > 0) {
        char **v;
        int n = list_ckpts(root, &v);
        for (int i = 0; i < n; i++) {
            if (i < n - keep) {
                /* renamed away first: a prune cut short leaves a hidden .del directory, never
                 * a step-N with some of its files gone */
                char del[4200];
                snprintf(path, sizeof path, "%s/%s", root, v[i]);
                snprintf(del, sizeof del, "%s/.%s.del.%d", root, v[i], (int)getpid());
                if (rename(path, del) == 0) rmtree(del);
                else CT_LOG_WARN_("ckpt", "cannot prune %s: %s", path, strerror(errno));
            }
            free(v[i]);
        }
        free(v);
    }
    return CT_OK;
}

static ct_status ckpt_save(const char *root, const ct_train_model *m, ct_optim *o, const ct_train_state *ts, int keep) {
    ct_status st = mkdirs(root);
    if (st != CT_OK) return st;
    char what[64];
    snprintf(what, sizeof what, "the checkpoint of step %" PRId64, ts->step);
    /* a disk known to be too full fails now, before the write, not after filling it */
    if ((st = ct_checkpoint_free_space(root, ckpt_min_bytes(m, o), what)) != CT_OK) return st;
    char tmp[4096], fin[4096], path[4200];
    snprintf(tmp, sizeof tmp, "%s/.step-%08" PRId64 ".tmp.%d", root, ts->step, (int)getpid());
    snprintf(fin, sizeof fin, "%s/step-%08" PRId64, root, ts->step);
    rmtree(tmp);
    if (mkdir(tmp, 0755) != 0) return ct_error(CT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    snprintf(path, sizeof path, "%s/%s", tmp, FILES[0]);
    st = save_weights(m, path);
    snprintf(path, sizeof path, "%s/%s", tmp, FILES[1]);
    if (st == CT_OK) st = write_train_state(path, o, ts, m, 0);
    if (st == CT_OK) return commit(root, tmp, fin, ts->step, FILES, NFILES, "ctrain-checkpoint-1", keep);
    rmtree(tmp);
    return st;
}

/* ".step-00000012.tmp.4242" -> step string "00000012", kind "tmp", pid 4242; also the
 * visible "step-00000012.old.4242" older versions left. */
static bool parse_leftover(const char *name, char *step, size_t n, char *kind, long *pid) {
    const char *p = name[0] == '.' ? name + 1 : name;
    if (strncmp(p, "step-", 5)) return false;
    p += 5;
    size_t nd = strspn(p, "0123456789");
    if (nd == 0 || nd >= n || p[nd] != '.') return false;
    memcpy(step, p, nd);
    step[nd] = 0;
    p += nd + 1;
    const char *kinds[] = {"tmp.", "old.", "del."};
    for (int k = 0; k < 3; k++) {
        if (strncmp(p, kinds[k], 4)) continue;
        char *end;
        errno = 0;
        long v = strtol(p + 4, &end, 10);
        if (*end || end == p + 4 || errno || v <= 0) return false;
        if (k == 0 && name[0] != '.') return false;
        *kind = kinds[k][0];
        *pid = v;
        return true;
    }
    return false;
}

static bool pid_alive(long pid) { return kill((pid_t)pid, 0) == 0 || errno == EPERM; }

ct_status ct_checkpoint_cleanup(const char *root) {
    DIR *d = opendir(root);
    if (!d) return errno == ENOENT ? CT_OK : ct_error(CT_ERR_IO, "%s: %s", root, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char step[32], kind;
        long pid;
        if (!parse_leftover(e->d_name, step, sizeof step, &kind, &pid)) continue;
        /* a live process's directory is its save or prune in progress (another job on this
         * output directory, or this very process): not ours to touch */
        if (pid_alive(pid) && pid != (long)getpid()) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            char **nv = realloc(names, sizeof *names * (size_t)cap);
            if (!nv) break;
            names = nv;
        }
        if (!(names[n] = strdup(e->d_name))) break;
        n++;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        char step[32], kind, p[4200], fin[4200];
        long pid;
        parse_leftover(names[i], step, sizeof step, &kind, &pid);
        snprintf(p, sizeof p, "%s/%s", root, names[i]);
        snprintf(fin, sizeof fin, "%s/step-%s", root, step);
        struct stat sb;
        /* a re-save killed between its two renames: the old copy is the only step-N left */
        if (kind == 'o' && stat(fin, &sb) != 0 && ct_checkpoint_verify(p) == CT_OK && rename(p, fin) == 0) {
            CT_LOG_WARN_("ckpt", "restored %s from %s (a save of it was interrupted)", fin, names[i]);
        } else {
            rmtree(p);
            CT_LOG_WARN_("ckpt", "removed %s, left by an interrupted %s of process %ld", p,
                         kind == 't' ? "save" : kind == 'd' ? "prune" : "re-save", pid);
        }
        free(names[i]);
    }
    free(names);
    fsync_path(root);
    return CT_OK;
}

ct_status ct_checkpoint_verify(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f && errno == ENOENT)
        return ct_error(CT_ERR_NOT_FOUND, "%s is not a ctrain checkpoint (no manifest.json; checkpoints are the step-* "
                        "directories under <output-dir>/checkpoints)", dir);
    if (!f) return ct_error(CT_ERR_IO, "%s: %s", path, strerror(errno));
    /* a sharded checkpoint lists a file per rank: the manifest grows with the world */
    enum { MAX_MANIFEST = 4 << 20 };
    char *buf = malloc(MAX_MANIFEST + 1);
    size_t n = buf ? fread(buf, 1, MAX_MANIFEST, f) : 0;
    fclose(f);
    if (!buf) return ct_error(CT_ERR_NOMEM, "%s: out of memory", path);
    buf[n] = 0;
    cJSON *man = cJSON_Parse(buf);
    free(buf);
    cJSON *files = man ? cJSON_GetObjectItem(man, "files") : NULL;
    if (!cJSON_IsObject(files)) { cJSON_Delete(man); return ct_error(CT_ERR_FORMAT, "%s: not a ctrain checkpoint manifest", path); }
    ct_status st = CT_OK;
    /* the files a checkpoint must have: the train state, and the weights whole or sharded */
    const char *weights = cJSON_GetObjectItem(files, CT_FSDP_INDEX) ? CT_FSDP_INDEX : FILES[0];
    const char *need[] = {weights, FILES[1]};
    for (int i = 0; i < 2 && st == CT_OK; i++)
        if (!cJSON_GetObjectItem(files, need[i])) st = ct_error(CT_ERR_FORMAT, "%s: no entry for %s", path, need[i]);
    const cJSON *e;
    cJSON_ArrayForEach(e, files) {
        if (st != CT_OK) break;
        const char *name = e->string;
        /* names inside this directory only: a manifest never makes us read elsewhere */
        if (!name || !*name || name[0] == '.' || strchr(name, '/')) {
            st = ct_error(CT_ERR_FORMAT, "%s: file name '%s' is not a name inside the checkpoint", path, name ? name : "");
            break;
        }
        cJSON *b = cJSON_GetObjectItem(e, "bytes"), *c = cJSON_GetObjectItem(e, "crc32");
        if (!cJSON_IsNumber(b) || !cJSON_IsNumber(c)) { st = ct_error(CT_ERR_FORMAT, "%s: no entry for %s", path, name); break; }
        /* the casts below are only defined for values in range: a hand-edited or corrupt
         * manifest ("crc32": -3656149109) is a format error, not undefined behaviour */
        double bv = b->valuedouble, cv = c->valuedouble;
        if (!(bv >= 0 && bv <= 9007199254740992.0 && bv == (double)(int64_t)bv)) {
            st = ct_error(CT_ERR_FORMAT, "%s: %s: \"bytes\": %.17g is not a whole number of bytes", path, name, bv);
            break;
        }
        if (!(cv >= 0 && cv <= 4294967295.0 && cv == (double)(uint32_t)cv)) {
            st = ct_error(CT_ERR_FORMAT, "%s: %s: \"crc32\": %.17g is not a CRC-32 (a whole number in [0, 4294967295])", path,
                          name, cv);
            break;
        }
        int64_t want_size = (int64_t)bv;
        uint32_t want_crc = (uint32_t)cv, crc;
        int64_t size;
        char fp[4300];
        snprintf(fp, sizeof fp, "%s/%s", dir, name);
        st = file_crc(fp, &crc, &size);
        if (st == CT_OK && (size != want_size || crc != want_crc))
            st = ct_error(CT_ERR_FORMAT, "%s: size or checksum differs from the manifest (%lld bytes, crc %08x; expected %lld, %08x)",
                          fp, (long long)size, crc, (long long)want_size, want_crc);
    }
    cJSON_Delete(man);
    return st;
}

ct_status ct_checkpoint_find_latest(const char *root, char *dir, size_t n) {
    char **v;
    int k = list_ckpts(root, &v);
    ct_status st = ct_error(CT_ERR_NOT_FOUND, "no valid checkpoint under %s", root);
    for (int i = k - 1; i >= 0; i--) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", root, v[i]);
        if (st != CT_OK && ct_checkpoint_verify(p) == CT_OK) {
            snprintf(dir, n, "%s", p);
            st = CT_OK;
        } else if (st != CT_OK) {
            CT_LOG_WARN_("ckpt", "skipping %s: %s", p, ct_last_error());
        }
    }
    for (int i = 0; i < k; i++) free(v[i]);
    free(v);
    if (st != CT_OK) ct_error(CT_ERR_NOT_FOUND, "no valid checkpoint under %s", root);
    return st;
}

/* One number of the train state's metadata, checked whole and in [lo, hi]: strtoll alone
 * turned garbage into 0 and clamped a seed >= 2^63 (written with PRIu64) to 2^63 - 1, so a
 * resume went on with another shuffle. A missing key gives dflt (older checkpoints). */
static ct_status meta_num(const ct_st_file *f, const char *k, bool is_unsigned, int64_t lo, int64_t hi, uint64_t dflt,
                          uint64_t *out) {
    const char *v = ct_st_metadata(f, k);
    if (!v) { *out = dflt; return CT_OK; }
    char *end;
    errno = 0;
    bool ok;
    if (is_unsigned) {
        ok = *v >= '0' && *v <= '9';
        *out = strtoull(v, &end, 10);
    } else {
        long long x = strtoll(v, &end, 10);
        ok = x >= lo && x <= hi;
        *out = (uint64_t)x;
    }
    if (!ok || errno || end == v || *end)
        return ct_error(CT_ERR_FORMAT, "%s: train state '%s' is '%s', not a whole number%s", ct_st_path(f), k, v,
                        is_unsigned ? " in [0, 2^64)" : lo >= 0 ? " >= 0" : "");
    return CT_OK;
}

static ct_status read_train_state(const ct_st_file *f, ct_train_state *ts) {
    memset(ts, 0, sizeof *ts);
    uint64_t v[9];
    ct_status st = meta_num(f, "step", false, 0, INT64_MAX, 0, &v[0]);
    if (st == CT_OK) st = meta_num(f, "epoch", false, 0, INT64_MAX, 0, &v[1]);
    if (st == CT_OK) st = meta_num(f, "sampler.seed", true, 0, 0, 0, &v[2]);
    if (st == CT_OK) st = meta_num(f, "sampler.epoch", false, 0, INT64_MAX, 0, &v[3]);
    if (st == CT_OK) st = meta_num(f, "sampler.position", false, 0, INT64_MAX, 0, &v[4]);
    if (st == CT_OK) st = meta_num(f, "seed", true, 0, 0, 0, &v[5]);
    if (st == CT_OK) st = meta_num(f, "world_size", false, 1, INT32_MAX, 1, &v[6]);
    if (st == CT_OK) st = meta_num(f, "scaler_growth_tracker", false, INT64_MIN, INT64_MAX, 0, &v[7]);
    if (st != CT_OK) return st;
    ts->step = (int64_t)v[0];
    ts->epoch = (int64_t)v[1];
    ts->sampler.seed = v[2];
    ts->sampler.epoch = (int64_t)v[3];
    ts->sampler.position = (int64_t)v[4];
    ts->seed = v[5];
    ts->world_size = (int)v[6];
    ts->scaler_growth_tracker = (int64_t)v[7];
    const char *ls = ct_st_metadata(f, "loss_scale");
    char *end = NULL;
    ts->loss_scale = ls ? strtod(ls, &end) : 0;
    if (ls && (end == ls || *end || !(ts->loss_scale >= 0) || ts->loss_scale == INFINITY))
        return ct_error(CT_ERR_FORMAT, "%s: train state 'loss_scale' is '%s', not a finite number >= 0", ct_st_path(f), ls);
    return CT_OK;
}

static ct_status ckpt_load(const char *dir, const ct_train_model *m, ct_optim *o, ct_train_state *ts) {
    ct_status st = ct_checkpoint_verify(dir);
    if (st != CT_OK) return st;
    char path[4200];
    snprintf(path, sizeof path, "%s/train_state.safetensors", dir);
    ct_st_file *f;
    st = ct_st_open(path, &f);
    if (st != CT_OK) return st;
    const char *kind = ct_st_metadata(f, "model"), *opt = ct_st_metadata(f, "optimizer");
    const char *want = m->kind ? m->kind : "model";
    if (!kind || strcmp(kind, want)) {
        st = ct_error(CT_ERR_MISMATCH, "%s: checkpoint of a '%s' model, this run trains '%s'", dir, kind ? kind : "?", want);
    } else if (o && (!opt || strcmp(opt, ct_optim_kind(o)))) {
        st = ct_error(CT_ERR_MISMATCH, "%s: checkpoint optimizer '%s', this run uses '%s'", dir, opt ? opt : "?", ct_optim_kind(o));
    }
    /* the numbers first: a bad one must not leave half-loaded weights behind */
    ct_train_state loaded;
    if (st == CT_OK) st = read_train_state(f, &loaded);
    /* the live weights kept in a copy, so that a mismatch of the optimizer state leaves them
     * untouched (the sharded reader checks everything before it writes) */
    size_t nbytes = ct_params_numel(m->params) * sizeof(float);
    float *backup = NULL;
    if (st == CT_OK && ct_fsdp_checkpoint_world(dir)) {
        /* written under --shard, resumed whole: every tensor assembled from the shards */
        st = ct_fsdp_read_full(dir, m->params, o);
    } else if (st == CT_OK && !(backup = malloc(nbytes ? nbytes : 1))) {
        st = ct_error(CT_ERR_NOMEM, "out of memory");
    } else if (st == CT_OK) {
        memcpy(backup, ct_params_data(m->params), nbytes);
        char mp[4200];
        snprintf(mp, sizeof mp, "%s/model.safetensors", dir);
        st = load_weights(m, mp);
        if (st == CT_OK && o) {
            st = ct_checkpoint_read_optim(f, o, "optim.");
            if (st != CT_OK) memcpy(ct_params_data(m->params), backup, nbytes);
        }
    }
    free(backup);
    if (st == CT_OK) *ts = loaded;
    ct_st_close(f);
    return st;
}

/* A model on a GPU: saved and loaded on the host (host_trip.c), then back on its device */
ct_status ct_checkpoint_save(const char *root, const ct_train_model *m, ct_optim *o, const ct_train_state *ts, int keep) {
    ct_device was;
    ct_status st = ct_train_to_host_(m, o, &was);
    return st != CT_OK ? st : ct_train_from_host_(m, o, was, ckpt_save(root, m, o, ts, keep));
}

ct_status ct_checkpoint_load(const char *dir, const ct_train_model *m, ct_optim *o, ct_train_state *ts) {
    ct_device was;
    ct_status st = ct_train_to_host_(m, o, &was);
    return st != CT_OK ? st : ct_train_from_host_(m, o, was, ckpt_load(dir, m, o, ts));
}

/* ---- sharded checkpoints (--shard): every rank writes its shards into one directory ---- */

ct_status ct_checkpoint_save_sharded(ct_pg *pg, ct_fsdp *f, const char *root, const ct_train_model *m, const ct_train_state *ts,
                                     int keep) {
    int rank = ct_pg_rank(pg), n = ct_pg_size(pg);
    ct_optim *o = ct_fsdp_optim(f);
    /* rank 0 makes the hidden directory and tells the others its name */
    int32_t tmpw[1024];
    char *tmp = (char *)tmpw, fin[4096], what[64];
    memset(tmpw, 0, sizeof tmpw);
    snprintf(fin, sizeof fin, "%s/step-%08" PRId64, root, ts->step);
    ct_status st = CT_OK;
    if (rank == 0) {
        st = mkdirs(root);
        snprintf(what, sizeof what, "the checkpoint of step %" PRId64, ts->step);
        uint64_t need = (uint64_t)ct_params_numel(m->params) * sizeof(float) * (uint64_t)(1 + ct_optim_state_count(o));
        if (st == CT_OK) st = ct_checkpoint_free_space(root, need, what);
        snprintf(tmp, sizeof tmpw, "%s/.step-%08" PRId64 ".tmp.%d", root, ts->step, (int)getpid());
        if (st == CT_OK) {
            rmtree(tmp);
            if (mkdir(tmp, 0755) != 0) st = ct_error(CT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        }
    }
    if ((st = ct_train_all_ok_(pg, st, "preparing the sharded checkpoint")) != CT_OK) return st;
    if ((st = ct_broadcast_sync(pg, tmpw, 1024, CT_I32, 0)) != CT_OK) return st;
    tmp[sizeof tmpw - 1] = 0;
    st = ct_train_all_ok_(pg, ct_fsdp_save_shard(f, tmp), "writing a shard of the checkpoint");
    if (rank == 0 && st == CT_OK) {
        int nfiles = n + 2;
        char **names = calloc((size_t)nfiles, sizeof *names), path[4200];
        if (!names) st = ct_error(CT_ERR_NOMEM, "out of memory");
        for (int r = 0; r < n && st == CT_OK; r++) {
            if (!(names[r + 2] = malloc(64))) { st = ct_error(CT_ERR_NOMEM, "out of memory"); break; }
            ct_fsdp_shard_file(r, n, names[r + 2], 64);
            snprintf(path, sizeof path, "%s/%s", tmp, names[r + 2]);
            /* another node's shard must be here too, or the checkpoint is not whole */
            if (access(path, R_OK) != 0)
                st = ct_error(CT_ERR_IO, "%s: %s: rank %d wrote its shard, but rank 0 cannot see it. Sharded checkpoints need "
                              "one --output-dir every rank shares (a shared filesystem across nodes)", path, strerror(errno), r);
        }
        if (st == CT_OK) {
            names[0] = (char *)CT_FSDP_INDEX;
            names[1] = (char *)FILES[1];
            st = ct_fsdp_save_index(f, tmp);
            snprintf(path, sizeof path, "%s/%s", tmp, FILES[1]);
            if (st == CT_OK) st = write_train_state(path, o, ts, m, n);
        }
        if (st == CT_OK) st = commit(root, tmp, fin, ts->step, (const char *const *)names, nfiles, "ctrain-checkpoint-1", keep);
        else rmtree(tmp);
        for (int r = 0; names && r < n; r++) free(names[r + 2]);
        free(names);
    } else if (rank == 0) {
        rmtree(tmp);
    }
    return ct_train_all_ok_(pg, st, "writing the sharded checkpoint");
}

ct_status ct_checkpoint_load_sharded(ct_pg *pg, ct_fsdp *f, const char *dir, const ct_train_model *m, ct_train_state *ts) {
    ct_status st = ct_checkpoint_verify(dir);
    ct_train_state loaded;
    ct_st_file *sf = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/train_state.safetensors", dir);
    if (st == CT_OK) st = ct_st_open(path, &sf);
    if (st == CT_OK) {
        const char *kind = ct_st_metadata(sf, "model"), *want = m->kind ? m->kind : "model";
        if (!kind || strcmp(kind, want))
            st = ct_error(CT_ERR_MISMATCH, "%s: checkpoint of a '%s' model, this run trains '%s'", dir, kind ? kind : "?", want);
        else
            st = read_train_state(sf, &loaded);
    }
    ct_st_close(sf);
    if ((st = ct_train_all_ok_(pg, st, "checking the checkpoint")) != CT_OK) return st;
    /* a checkpoint written without --shard: read whole on every rank, each keeping its pieces */
    st = ct_fsdp_checkpoint_world(dir) ? ct_fsdp_load_shards(f, dir) : ct_fsdp_load_whole_(f, dir, m);
    if (st == CT_OK) *ts = loaded;
    return st;
}
