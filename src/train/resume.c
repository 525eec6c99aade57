/* Resume is agreed, never assumed. Only rank 0 writes checkpoints, but every rank looks for
 * one under its own --output-dir: with a directory per node, node 0 resumed at step 40 while
 * node 1 started from step 0, and the ranks trained 20 steps on mismatched states before a
 * collective failed. So the ranks exchange what each found before anything is loaded, and
 * either all take the same state or all refuse. */
#include "train/resume.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "train/host_trip.h"

/* What one rank found, exchanged as i32 words (the collectives have no byte type). */
typedef struct {
    int64_t step;     /* the checkpoint's step; -1 when none */
    uint32_t crc;     /* CRC-32 of its manifest.json: two copies of one checkpoint agree */
    int32_t found;    /* 1 found and verified, 0 none (auto), -1 unreadable (a --resume directory) */
    char host[64];
    char where[432];  /* the checkpoint directory, or the one searched */
} found_rec;
_Static_assert(sizeof(found_rec) % 4 == 0, "found_rec travels as i32 words");

static uint32_t manifest_crc(const char *dir) {
    char p[4300], buf[8192];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return (uint32_t)crc32(crc32(0, NULL, 0), (const Bytef *)buf, (uInt)n);
}

static int64_t checkpoint_step(const char *dir) {
    char p[4300];
    snprintf(p, sizeof p, "%s/train_state.safetensors", dir);
    ct_st_file *f;
    if (ct_st_open(p, &f) != CT_OK) return -1;
    const char *s = ct_st_metadata(f, "step");
    int64_t step = s ? strtoll(s, NULL, 10) : -1;
    ct_st_close(f);
    return step;
}

/* A path into the record: a long one keeps its end, the part that tells directories apart. */
static void set_where(found_rec *r, const char *path) {
    size_t n = strlen(path), cap = sizeof r->where - 1;
    if (n <= cap) {
        memcpy(r->where, path, n + 1);
        return;
    }
    memcpy(r->where, "...", 3);
    memcpy(r->where + 3, path + n - (cap - 3), cap - 2);
}

/* This rank's candidate; dir gets the directory to load. */
static ct_status look(const char *resume, const char *output_dir, found_rec *r, char *dir, size_t n) {
    memset(r, 0, sizeof *r);
    r->step = -1;
    if (gethostname(r->host, sizeof r->host - 1)) snprintf(r->host, sizeof r->host, "?");
    ct_status st;
    if (!strcmp(resume, "auto")) {
        char root[4200];
        snprintf(root, sizeof root, "%s/checkpoints", output_dir);
        st = ct_checkpoint_find_latest(root, dir, n);
        if (st == CT_ERR_NOT_FOUND) {
            set_where(r, root);
            return CT_OK;
        }
    } else {
        snprintf(dir, n, "%s", resume);
        st = ct_checkpoint_verify(dir);
    }
    set_where(r, dir);
    if (st != CT_OK || (r->step = checkpoint_step(dir)) < 0) {
        r->found = -1;
        return st != CT_OK ? st : ct_error(CT_ERR_FORMAT, "%s: train_state.safetensors holds no step", dir);
    }
    r->found = 1;
    r->crc = manifest_crc(dir);
    return CT_OK;
}

static int describe(const found_rec *r, int rank, char *b, size_t n) {
    if (r->found == 1) return snprintf(b, n, "rank %d on %s: step %" PRId64 " in %s", rank, r->host, r->step, r->where);
    if (r->found == 0) return snprintf(b, n, "rank %d on %s: no checkpoint under %s", rank, r->host, r->where);
    return snprintf(b, n, "rank %d on %s: cannot read %s", rank, r->host, r->where);
}

/* Whether rank k's find conflicts with rank 0's: a newer step, or another checkpoint of the
 * same step. Older, absent or unreadable is what an output directory per node gives. */
static bool conflicts(const found_rec *r0, const found_rec *rk) {
    if (rk->found != 1) return false;
    if (r0->found != 1) return true;
    return rk->step > r0->step || (rk->step == r0->step && rk->crc != r0->crc);
}

/* Bytes from rank 0 to every rank, as i32 words (a tail that is not a whole word through a
 * small copy). */
static ct_status bcast_bytes(ct_pg *pg, void *p, size_t n) {
    size_t whole = n / 4 * 4;
    ct_status st = whole ? ct_broadcast_sync(pg, p, whole / 4, CT_I32, 0) : CT_OK;
    if (st != CT_OK || whole == n) return st;
    int32_t w = 0;
    memcpy(&w, (char *)p + whole, n - whole);
    st = ct_broadcast_sync(pg, &w, 1, CT_I32, 0);
    memcpy((char *)p + whole, &w, n - whole);
    return st;
}

/* Rank 0's weights, optimizer state and train state to every rank. */
static ct_status bcast_state(ct_pg *pg, const ct_train_model *m, ct_optim *o, ct_train_state *ts) {
    ct_device was;
    ct_status st = ct_train_to_host_(m, o, &was);
    if (st != CT_OK) return st;
    st = bcast_bytes(pg, ct_params_data(m->params), (size_t)ct_params_numel(m->params) * sizeof(float));
    int k = o ? ct_optim_state_tensor_count(o) : 0;
    for (int i = 0; i < k && st == CT_OK; i++) {
        ct_optim_state_tensor v = ct_optim_state_tensor_at(o, i);
        size_t numel = 1;
        for (int d = 0; d < v.ndim; d++) numel *= (size_t)v.shape[d];
        st = bcast_bytes(pg, v.data, numel * ct_dtype_size(v.dtype));
    }
    if (st == CT_OK) st = bcast_bytes(pg, ts, sizeof *ts);
    return ct_train_from_host_(m, o, was, st);
}

ct_status ct_train_all_ok_(ct_pg *pg, ct_status st, const char *what) {
    int32_t v = st != CT_OK ? ct_pg_rank(pg) + 1 : 0;
    ct_status cs = ct_all_reduce_sync(pg, &v, 1, CT_I32, CT_RED_MAX);
    if (st != CT_OK) return st;
    if (cs != CT_OK) return cs;
    return v ? ct_error(CT_ERR_IO, "%s failed on rank %d (see its message)", what, v - 1) : CT_OK;
}

ct_status ct_train_resume_(ct_pg *pg, ct_fsdp *fsdp, const char *resume, const char *output_dir, const ct_train_model *m, ct_optim *o,
                           ct_train_state *ts, bool *resumed, char *dir, size_t n) {
    *resumed = false;
    int world = pg ? ct_pg_size(pg) : 1, rank = pg ? ct_pg_rank(pg) : 0;
    found_rec mine;
    ct_status lst = look(resume, output_dir, &mine, dir, n);
    if (world == 1) {
        if (lst != CT_OK || !mine.found) return lst;
        ct_status st = ct_checkpoint_load(dir, m, o, ts);
        *resumed = st == CT_OK;
        return st;
    }
    found_rec *all = calloc((size_t)world, sizeof *all);
    if (!all) return ct_error(CT_ERR_NOMEM, "out of memory for %d ranks' checkpoints", world);
    /* an all-gather as a sum of zeros and one record per rank: the nccl backend stages an
     * in-place all-reduce of host memory, but takes no host buffers for an all-gather */
    all[rank] = mine;
    ct_status st = ct_all_reduce_sync(pg, all, (size_t)world * sizeof mine / 4, CT_I32, CT_RED_SUM);
    if (st != CT_OK) { free(all); return st; }
    const found_rec *r0 = &all[0];
    bool same = true, conflict = false, any = false;
    for (int k = 0; k < world; k++) {
        same = same && all[k].found == r0->found && all[k].step == r0->step && all[k].crc == r0->crc;
        conflict = conflict || conflicts(r0, &all[k]);
        any = any || all[k].found != 0;
    }
    if (r0->found == -1) { /* rank 0 cannot read the --resume directory: nothing to agree on */
        st = rank == 0 ? lst : ct_error(CT_ERR_NOT_FOUND, "cannot resume: rank 0 on %s cannot read %s", r0->host, r0->where);
    } else if (conflict) {
        char msg[1024];
        int off = snprintf(msg, sizeof msg, "the ranks found different checkpoints to resume from, and rank 0's is not the "
                           "newest: ");
        for (int k = 0; k < world && off < (int)sizeof msg - 2; k++) {
            if (k > 0 && all[k].found == r0->found && all[k].step == r0->step && all[k].crc == r0->crc) continue;
            if (k) off += snprintf(msg + off, sizeof msg - (size_t)off, "; ");
            if (off < (int)sizeof msg - 2) off += describe(&all[k], k, msg + off, sizeof msg - (size_t)off);
        }
        st = ct_error(CT_ERR_MISMATCH, "%s. Only rank 0 writes checkpoints: give every node the same --output-dir on a "
                      "shared filesystem, or copy the newest checkpoint into rank 0's (docs/multinode.md)", msg);
    } else if (same) { /* one shared directory, or identical copies: each rank loads its own */
        if (r0->found == 1 && fsdp) {
            st = lst != CT_OK ? ct_train_all_ok_(pg, lst, "finding the checkpoint") : ct_checkpoint_load_sharded(pg, fsdp, dir, m, ts);
            *resumed = st == CT_OK;
        } else if (r0->found == 1) {
            st = ct_train_all_ok_(pg, lst == CT_OK ? ct_checkpoint_load(dir, m, o, ts) : lst, "loading the checkpoint");
            *resumed = st == CT_OK;
        }
    } else if (any && r0->found == 1 && fsdp) { /* the shards are read where they were written: all must see them */
        char b[600];
        int k = 1;
        while (k < world - 1 && all[k].found == 1 && all[k].step == r0->step && all[k].crc == r0->crc) k++;
        describe(&all[k], k, b, sizeof b);
        st = ct_error(CT_ERR_NOT_FOUND, "cannot resume the sharded run: rank 0 resumes step %" PRId64 " from %s, but %s. Every "
                      "rank reads its shards from that directory: give all nodes one --output-dir on a shared filesystem",
                      r0->step, r0->where, b);
    } else if (any && r0->found == 1) { /* rank 0 has the newest, some ranks not: rank 0's state, broadcast */
        if (rank == 0) {
            for (int k = 1; k < world; k++) {
                if (all[k].found == 1 && all[k].step == r0->step && all[k].crc == r0->crc) continue;
                char b[600];
                describe(&all[k], k, b, sizeof b);
                CT_LOG_WARN_("train", "%s: it gets rank 0's step %" PRId64 " (%s) by broadcast", b, r0->step, r0->where);
            }
        }
        st = ct_train_all_ok_(pg, rank == 0 ? ct_checkpoint_load(dir, m, o, ts) : CT_OK, "loading the checkpoint");
        if (st == CT_OK) st = bcast_state(pg, m, o, ts);
        *resumed = st == CT_OK;
        snprintf(dir, n, "%s", r0->where);
    }
    free(all);
    return st;
}
