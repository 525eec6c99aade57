/* ct_zero: the sharded optimizer step — ZeroRedundancyOptimizer's idea over the memory the
 * ranks of one machine share.
 *
 * Without it every rank all-reduces the whole gradient (reads B, writes B on the shm
 * backend) and then runs the whole optimizer step on its own copy of the parameters (for
 * SGD with momentum: reads g, p, m, writes p, m). With it the parameters and the
 * optimizer's state are one copy in a shared segment; DDP defers the averaging
 * (ct_ddp_set_deferred), and each rank updates only its 1/n of the flat buffers, averaging
 * each gradient element from the n ranks' buffers as the update reads it:
 *   per rank: reads (n + 2)/n B, writes 2/n B for SGD with momentum, against 5B read and
 *   3B written before (B = the gradient's bytes); 2 synchronisations per step (every
 *   backward done; every share updated).
 * The averaging is the all-reduce's ((g0 + g1) + ...) / n and the update is elementwise, so
 * the bits are those of the unsharded step on any number of ranks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ctrain/config.h"
#include "ctrain/train.h"

struct ct_zero {
    ct_ddp *ddp;
    ct_pg *pg;
    ct_params *P;
    ct_optim *opt;        /* NULL once the optimizer was freed first */
    void *seg;            /* this rank's region of the segment of parameters and state */
    bool params_in;       /* the parameters are in the segment (until the optimizer is freed first) */
    const float **grads;  /* every rank's gradient buffer (DDP's zero-copy segment) */
    bool averaging;       /* this step: DDP deferred, the step averages */
};

/* after each rank updated its share: the next forward reads the others' */
static ct_status zero_sync(void *user) {
    ct_zero *z = user;
    double t0 = ct_time_now();
    ct_status st = ct_barrier_sync(z->pg);
    ct_ddp_add_wait(z->ddp, ct_time_now() - t0);
    return st;
}

/* The optimizer is freed first (its state goes with it): the parameters go back to private
 * memory, so that a later optimizer steps them alone. */
static void zero_detach(void *user) {
    ct_zero *z = user;
    z->opt = NULL;
    if (ct_params_set_data_storage(z->P, NULL, true) != CT_OK) CT_LOG_WARN_("zero", "%s", ct_last_error());
    else z->params_in = false;
}

/* Parameters and state into the segment (cannot fail: it is page-aligned and on the CPU, as
 * are the store and the state), and back out: false when memory ran out (a warning). */
static void move_in(ct_params *P, ct_optim *opt, float *base, size_t N16, bool copy) {
    ct_status st = ct_params_set_data_storage(P, base, copy);
    for (int k = 0; st == CT_OK && k < ct_optim_state_count(opt); k++)
        st = ct_optim_set_state_storage(opt, k, base + (size_t)(k + 1) * N16, copy);
    CT_CHECK(st == CT_OK, "ct_zero_create: moving the parameters and state: %s", ct_last_error());
}

/* Drops this process's mapping of the pages inside [p, p + n floats) (the segment keeps
 * them): moving out one buffer at a time, the process's memory grows by one buffer, not by
 * all of them while the shared copies still count. */
static void release(const float *p, size_t n) {
    uintptr_t lo = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, hi = ((uintptr_t)(p + n)) & ~(uintptr_t)4095;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Moves what is still in the segment back out: the state buffers of opt (NULL once freed) and,
 * where params_in, the parameters. Parameters already moved out (the optimizer freed first)
 * are private memory: releasing their pages would zero them. */
static bool move_out(ct_params *P, ct_optim *opt, bool params_in) {
    ct_status st = CT_OK;
    size_t N = ct_params_numel(P);
    for (int k = 0; opt && st == CT_OK && k < ct_optim_state_count(opt); k++) {
        float *shared;
        ct_optim_state_buffer(opt, k, NULL, &shared, NULL);
        if ((st = ct_optim_set_state_storage(opt, k, NULL, true)) == CT_OK) release(shared, N);
    }
    const float *shared = ct_params_data(P);
    if (params_in && st == CT_OK && (st = ct_params_set_data_storage(P, NULL, true)) == CT_OK) release(shared, N);
    if (st != CT_OK) CT_LOG_WARN_("zero", "%s", ct_last_error());
    return st == CT_OK;
}

void ct_zero_free(ct_zero *z) {
    if (!z) return;
    (void)ct_ddp_set_deferred(z->ddp, false);
    if (z->opt) ct_optim_set_shard(z->opt, NULL);
    /* everything leaves the segment before it goes; without memory for it, it stays mapped */
    if (move_out(z->P, z->opt, z->params_in)) ct_pg_free_shared(z->pg, z->seg);
    free(z->grads);
    free(z);
}

/* Layout of the segment: the parameters, then each state buffer, each rounded up to 16
 * floats. Rank r's region follows rank r-1's, so region 0's address starts one buffer that
 * spans them all. */
ct_status ct_zero_create(ct_ddp *ddp, ct_optim *opt, ct_zero **out) {
    *out = NULL;
    CT_CHECK(ddp && opt && ct_optim_params(opt) == ct_ddp_params(ddp), "ct_zero_create: the optimizer must be over the DDP's parameters");
    ct_pg *pg = ct_ddp_pg(ddp);
    int32_t want = ct_ddp_zero_copy(ddp) && ct_optim_device(opt).type == CT_DEV_CPU && ct_config_bool(CT_CFG_DDP_SHARD_OPTIM);
    ct_status st = ct_all_reduce_sync(pg, &want, 1, CT_I32, CT_RED_MIN);
    if (st != CT_OK || !want) return st;
    ct_params *P = ct_ddp_params(ddp);
    int n = ct_pg_size(pg), me = ct_pg_rank(pg), nst = ct_optim_state_count(opt);
    size_t N = ct_params_numel(P), N16 = (N + 15) & ~(size_t)15, total = (size_t)(1 + nst) * N16 * sizeof(float);
    ct_zero *z = calloc(1, sizeof *z);
    if (z) z->grads = malloc(sizeof(float *) * (size_t)n);
    if (!z || !z->grads) { free(z); return ct_error(CT_ERR_NOMEM, "sharded optimizer: out of memory"); }
    z->ddp = ddp;
    z->pg = pg;
    z->P = P;
    st = ct_pg_alloc_shared(pg, (total + (size_t)n - 1) / (size_t)n, &z->seg);
    if (st == CT_ERR_SYSTEM || st == CT_ERR_NOMEM) { /* /dev/shm full: the same decision on every rank */
        CT_LOG_WARN_("zero", "optimizer not sharded, every rank steps its own copy: %s", ct_last_error());
        free(z->grads);
        free(z);
        return CT_OK;
    }
    if (st != CT_OK) { free(z->grads); free(z); return st; }
    float *base = ct_pg_shared_peer(pg, z->seg, 0);
    /* Rank 0's values, as DDP's start broadcasts its parameters: rank 0 moves its buffers in
     * (one at a time: its peak memory grows by one buffer, not all), the others switch once
     * it is done */
    if (me == 0) move_in(P, opt, base, N16, true);
    if ((st = ct_barrier_sync(pg)) != CT_OK) {
        if (me == 0) move_out(P, opt, true); /* back to private memory before the segment goes */
        ct_pg_free_shared(pg, z->seg);
        free(z->grads);
        free(z);
        return st;
    }
    if (me != 0) move_in(P, opt, base, N16, false);
    z->params_in = true;
    const float *g = ct_params_grad(P);
    for (int r = 0; r < n; r++) z->grads[r] = ct_pg_shared_peer(pg, (void *)g, r);
    /* shares of whole 64-byte lines, so that no two ranks write one */
    size_t per = ((N + (size_t)n - 1) / (size_t)n + 15) & ~(size_t)15;
    size_t lo = (size_t)me * per < N ? (size_t)me * per : N, hi = lo + per < N ? lo + per : N;
    ct_optim_shard sh = {.lo = lo, .hi = hi, .grads = z->grads, .ngrads = n, .sync = zero_sync, .detach = zero_detach,
                         .user = z};
    ct_optim_set_shard(opt, &sh);
    z->opt = opt;
    CT_LOG_INFO("zero", "sharded %s step: elements [%zu, %zu) of %zu here; parameters and %d state buffer%s in memory "
                "shared by the %d ranks", ct_optim_kind(opt), lo, hi, N, nst, nst == 1 ? "" : "s", n);
    *out = z;
    return CT_OK;
}

ct_status ct_zero_begin_step(ct_zero *z, bool average) {
    z->averaging = average && z->opt;
    if (z->opt) ct_optim_set_average(z->opt, false);
    return ct_ddp_set_deferred(z->ddp, z->averaging);
}

void ct_zero_gradients_final(ct_zero *z) {
    if (z->averaging) ct_optim_set_average(z->opt, true);
}

ct_status ct_zero_skip_step(ct_zero *z) {
    if (z->opt) ct_optim_set_average(z->opt, false);
    return ct_barrier_sync(z->pg);
}
