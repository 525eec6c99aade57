/* The nccl backend between ranks, each driving its own GPU (ct_spawn's processes): every
 * collective on device buffers (several rounds of a large all-reduce, bf16, the staged host
 * all-reduce, all-gather, reduce-scatter, broadcast, all-to-all, send/recv, a subgroup of two
 * ranks in reverse order); DDP on NCCL with
 * several buckets against one process on the whole batch (f32 and bf16 compression), the
 * ranks' gradients the same bits; sharded training (ct_fsdp: ZeRO-1, SHARD_GRAD_OP and
 * FULL_SHARD) on NCCL against one process, its sharded checkpoints resumed bit for bit, an
 * unsharded checkpoint read into device shards and the whole model streamed out of them; a
 * peer that leaves early failing the survivor's next collective (with the rank named, where the
 * emulated NCCL sees the process gone), and a stuck peer timing the collective out within the
 * group's timeout, after which the communicator is aborted and the later calls fail at once.
 * NCCL refuses two ranks on one GPU, so on real hardware this needs two GPUs and skips
 * otherwise; under the emulated device (CT_EMU_DEVICE=1, tests/scripts/cuda_emu_device.sh)
 * each rank is a process with its own emulated GPU and NCCL is tests/tools/cuda_emu/emu_nccl.cc. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "ct_test.h"
#include "ctrain/ddp.h"
#include "ctrain/dist.h"
#include "ctrain/fsdp.h"
#include "ctrain/models.h"
#include "ctrain/nn.h"
#include "ctrain/ops.h"
#include "ctrain/optim.h"
#include "ctrain/train.h"
#include "cuda/cuda.h"
#include "gpu/gpu_test.h"
#include "kernel_check.h"
#include "train/fsdp_internal.h"

static char no_gpus[700];
/* two ranks can run: two GPUs, or the emulated device (one per process) */
static bool have_gpus(void) {
    if (!have_gpu()) return snprintf(no_gpus, sizeof no_gpus, "%s", no_gpu), false;
    if (getenv("CT_EMU_DEVICE")) return true;
    int n = 0;
    if (ct_cuda_device_count(&n) == CT_OK && n >= 2) return true;
    snprintf(no_gpus, sizeof no_gpus, "one CUDA GPU: NCCL needs a GPU per rank (two or more)");
    return false;
}
#define NEED_GPUS() do { if (!have_gpus()) CT_SKIP(no_gpus); } while (0)

#define RANK_OK(call) do { if ((call) != CT_OK) { fprintf(stderr, "rank %d: %s: %s\n", rank, #call, ct_last_error()); return 1; } } while (0)

static ct_pg *nccl_init(double timeout_s) {
    ct_dist_opts o = ct_dist_default_opts();
    o.backend = "nccl";
    o.timeout_s = timeout_s;
    ct_pg *pg = NULL;
    if (ct_dist_init(&o, &pg) != CT_OK) fprintf(stderr, "nccl init: %s\n", ct_last_error());
    return pg;
}
static void *dev_copy(const void *host, size_t bytes) {
    void *d = NULL;
    if (ct_cuda_alloc(0, bytes, &d) != CT_OK) return NULL;
    if (host && cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) return NULL;
    return d;
}
static void to_host(void *host, const void *d, size_t bytes) {
    if (ct_device_sync(CT_CUDA(0)) != CT_OK || cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) abort();
}

/* ---- every collective: values each rank can predict ---- */
static int collectives(int rank, int n, void *arg) {
    (void)arg;
    ct_pg *pg = nccl_init(60);
    if (!pg) return 1;
    /* all-reduce of 300,000 f32 (over an emulated round of 1 MiB), in place */
    const size_t N = 300000;
    float *h = malloc(N * sizeof(float)), *g = malloc(N * n * sizeof(float));
    if (!h || !g) return 1;
    for (size_t i = 0; i < N; i++) h[i] = (float)(rank + 1) * 0.5f + (float)(i % 1000) * 1e-3f;
    float *d = dev_copy(h, N * sizeof(float)), *dg = dev_copy(NULL, N * n * sizeof(float));
    if (!d || !dg) return 1;
    RANK_OK(ct_all_reduce_sync(pg, d, N, CT_F32, CT_RED_SUM));
    to_host(h, d, N * sizeof(float));
    double e = 0;
    for (size_t i = 0; i < N; i++) { /* sum over r of (r+1)/2 + n * c */
        double want = 0.25 * n * (n + 1) + n * (double)(float)((float)(i % 1000) * 1e-3f);
        e = fmax(e, fabs(h[i] - want) / fmax(1.0, fabs(want)));
    }
    CT_EXPECTF(e <= 1e-6, "rank %d: all_reduce f32 sum: max relative error %g", rank, e);
    /* bf16 average: (r+1) in each, mean (n+1)/2, exact in bf16 for n <= 4 */
    uint16_t b[64];
    for (int i = 0; i < 64; i++) b[i] = ct_k_f32_to_bf16((float)(rank + 1) * (float)(1 << (i % 4)));
    uint16_t *db = dev_copy(b, sizeof b);
    RANK_OK(ct_all_reduce_sync(pg, db, 64, CT_BF16, CT_RED_AVG));
    to_host(b, db, sizeof b);
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += ct_k_bf16_to_f32(b[i]) != 0.5f * (n + 1) * (float)(1 << (i % 4));
    CT_EXPECTF(bad == 0, "rank %d: all_reduce bf16 avg: %d of 64 wrong", rank, bad);
    /* host memory: staged through the device (DDP's parameter check uses it) */
    int64_t hv[3] = {rank, 10 * rank, -rank};
    RANK_OK(ct_all_reduce_sync(pg, hv, 3, CT_I64, CT_RED_MAX));
    CT_EXPECTF(hv[0] == n - 1 && hv[1] == 10 * (n - 1) && hv[2] == 0, "rank %d: host all_reduce max: %lld %lld %lld", rank,
               (long long)hv[0], (long long)hv[1], (long long)hv[2]);
    /* all-gather: rank r's N values at r * N */
    for (size_t i = 0; i < N; i++) h[i] = (float)(rank * 7 + (int)(i % 13));
    cudaMemcpy(d, h, N * sizeof(float), cudaMemcpyHostToDevice);
    RANK_OK(ct_all_gather_sync(pg, d, dg, N, CT_F32));
    to_host(g, dg, N * n * sizeof(float));
    bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < N; i++) bad += g[r * N + i] != (float)(r * 7 + (int)(i % 13));
    CT_EXPECTF(bad == 0, "rank %d: all_gather: %d wrong", rank, bad);
    /* reduce-scatter: g[j] = j + rank everywhere; this rank's block of the sum */
    for (size_t j = 0; j < N * n; j++) g[j] = (float)(j % 4096) + (float)rank;
    cudaMemcpy(dg, g, N * n * sizeof(float), cudaMemcpyHostToDevice);
    RANK_OK(ct_reduce_scatter_sync(pg, dg, d, N, CT_F32, CT_RED_SUM));
    to_host(h, d, N * sizeof(float));
    bad = 0;
    for (size_t i = 0; i < N; i++) bad += h[i] != (float)n * (float)((rank * N + i) % 4096) + 0.5f * n * (n - 1);
    CT_EXPECTF(bad == 0, "rank %d: reduce_scatter: %d wrong", rank, bad);
    /* broadcast from the last rank */
    for (size_t i = 0; i < N; i++) h[i] = rank == n - 1 ? (float)i : -1.0f;
    cudaMemcpy(d, h, N * sizeof(float), cudaMemcpyHostToDevice);
    RANK_OK(ct_broadcast_sync(pg, d, N, CT_F32, n - 1));
    to_host(h, d, N * sizeof(float));
    bad = 0;
    for (size_t i = 0; i < N; i++) bad += h[i] != (float)i;
    CT_EXPECTF(bad == 0, "rank %d: broadcast: %d wrong", rank, bad);
    /* all-to-all: block p of rank r's send = 100 r + p; block p received = 100 p + rank */
    const size_t M = 1100000; /* a block over NCCL's 4 MiB buffer: the grouped sends and receives take turns */
    int32_t *s = malloc(M * n * 4), *t = malloc(M * n * 4);
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < M; i++) s[p * M + i] = 100 * rank + p + (int32_t)i * 1000;
    int32_t *ds = dev_copy(s, M * n * 4), *dt = dev_copy(NULL, M * n * 4);
    RANK_OK(ct_all_to_all_sync(pg, ds, dt, M, CT_I32));
    to_host(t, dt, M * n * 4);
    bad = 0;
    for (int p = 0; p < n; p++)
        for (size_t i = 0; i < M; i++) bad += t[p * M + i] != 100 * p + rank + (int32_t)i * 1000;
    CT_EXPECTF(bad == 0, "rank %d: all_to_all: %d wrong", rank, bad);
    /* send/recv around the ring, two messages in order: each rank's send first, which completes
     * once NCCL has buffered it (the backend runs one operation at a time) */
    const int to = (rank + 1) % n, from = (rank + n - 1) % n;
    const size_t m = 70000;
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < m; i++) s[i] = rank * 1000 + k + (int32_t)i;
        cudaMemcpy(ds, s, m * 4, cudaMemcpyHostToDevice);
        ct_work *w = ct_send(pg, ds, m, CT_I32, to, 0), *v = ct_recv(pg, dt, m, CT_I32, from, 0);
        RANK_OK(ct_work_wait(w));
        RANK_OK(ct_work_wait(v));
        ct_work_free(w);
        ct_work_free(v);
        to_host(t, dt, m * 4);
        bad = 0;
        for (size_t i = 0; i < m; i++) bad += t[i] != from * 1000 + k + (int32_t)i;
        CT_EXPECTF(bad == 0, "rank %d: message %d from rank %d: %d wrong", rank, k, from, bad);
    }
    /* a group of the last two ranks, in reverse order (a communicator of its own): its rank 0 is
     * world rank n - 1; a sum over it of each member's world rank */
    const int members[2] = {n - 1, n - 2};
    ct_pg *sub = NULL;
    RANK_OK(ct_dist_new_group(pg, members, 2, &sub));
    CT_EXPECTF((sub != NULL) == (rank >= n - 2), "rank %d: member of the group %d", rank, sub != NULL);
    if (sub) {
        CT_EXPECTF(ct_pg_rank(sub) == (rank == n - 1 ? 0 : 1) && !strcmp(ct_pg_backend(sub), "nccl"), "rank %d: group rank %d on %s",
                   rank, ct_pg_rank(sub), ct_pg_backend(sub));
        float v[4] = {(float)rank, 1, 2, 3};
        cudaMemcpy(d, v, sizeof v, cudaMemcpyHostToDevice);
        RANK_OK(ct_all_reduce_sync(sub, d, 4, CT_F32, CT_RED_SUM));
        to_host(v, d, sizeof v);
        CT_EXPECTF(v[0] == (float)(2 * n - 3) && v[1] == 2 && v[3] == 6, "rank %d: the group's sum %g %g %g %g", rank, v[0], v[1],
                   v[2], v[3]);
        ct_pg_free(sub);
    }
    RANK_OK(ct_barrier_sync(pg));
    ct_cuda_free(d), ct_cuda_free(dg), ct_cuda_free(db), ct_cuda_free(ds), ct_cuda_free(dt);
    free(h), free(g), free(s), free(t);
    ct_pg_free(pg);
    return ct_failed_ ? 1 : 0;
}
CT_TEST(collectives_on_nccl_between_ranks) {
    NEED_GPUS();
    for (int n = 2; n <= 3; n++) {
        ct_status st = ct_spawn(collectives, n, NULL);
        CT_EXPECTF(st == CT_OK, "%d ranks: %s", n, ct_last_error());
    }
}

/* ---- DDP on NCCL: rank r trains on rows [4r, 4r + 4) of an 8-row batch ---- */
static double loss_backward(ct_ctx *c, ct_model *m, ct_tensor *x, ct_tensor *y) {
    ct_tensor *loss = ct_cross_entropy(c, ct_model_forward(c, m, x), y, -100);
    double l = ct_item(loss);
    ct_backward(c, loss);
    return l;
}
/* whether every rank holds the same bits in x: the smallest and largest hash over the ranks agree */
static bool same_on_every_rank(ct_pg *pg, const float *x, size_t n) {
    int64_t hs[2] = {0, 0};
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        hs[0] = (hs[0] * 1000003 + u) % 2147483647;
    }
    hs[1] = -hs[0];
    return ct_all_reduce_sync(pg, hs, 2, CT_I64, CT_RED_MAX) == CT_OK && hs[0] == -hs[1];
}
static int ddp_rank(int rank, int n, void *arg) {
    const ct_dtype comm = *(const ct_dtype *)arg;
    const double tol = comm == CT_F32 ? 1e-5 : 4e-3; /* bf16 keeps 8 bits */
    ct_pg *pg = nccl_init(60);
    if (!pg) return 1;
    const int64_t B = 8, b = B / n;
    float x[8 * 32];
    int32_t y[8];
    for (int i = 0; i < 8 * 32; i++) x[i] = (float)sin(0.37 * i);
    for (int i = 0; i < 8; i++) y[i] = (i * 3) % 10;
    ct_ctx *c;
    RANK_OK(ct_ctx_create(NULL, &c));
    /* the whole batch on the CPU, one process */
    ct_model *mc = gpu_test_mlp(), *mg = gpu_test_mlp();
    loss_backward(c, mc, ct_from_data(c, CT_F32, x, 2, (int64_t[]){B, 32}), ct_from_data(c, CT_I32, y, 1, &B));
    /* this rank's rows on its GPU, gradients averaged by DDP over NCCL */
    RANK_OK(ct_module_to(ct_model_module(mg), CT_CUDA(0)));
    ct_ddp_opts o = ct_ddp_default_opts();
    o.comm_dtype = comm;
    o.bucket_cap_bytes = 4096; /* several buckets, launched from the hooks during backward */
    o.first_bucket_bytes = 1024;
    ct_ddp *ddp;
    RANK_OK(ct_ddp_create(pg, ct_model_params(mg), &o, &ddp));
    CT_EXPECT(ct_ddp_num_buckets(ddp) > 1);
    ct_tensor *xd, *yd;
    RANK_OK(ct_tensor_to(c, ct_from_data(c, CT_F32, x + rank * b * 32, 2, (int64_t[]){b, 32}), CT_CUDA(0), &xd));
    RANK_OK(ct_tensor_to(c, ct_from_data(c, CT_I32, y + rank * b, 1, &b), CT_CUDA(0), &yd));
    loss_backward(c, mg, xd, yd);
    RANK_OK(ct_ddp_finish(ddp));
    RANK_OK(ct_ctx_status(c));
    ct_params *Pc = ct_model_params(mc), *Pg = ct_model_params(mg);
    const size_t np = ct_params_numel(Pc);
    float *gc = malloc(np * sizeof(float)), *gg = malloc(np * sizeof(float));
    memcpy(gc, ct_params_grad(Pc), np * sizeof(float));
    to_host(gg, ct_params_grad(Pg), np * sizeof(float));
    double e = normwise(gg, gc, (int64_t)np);
    CT_EXPECTF(e <= tol, "rank %d: DDP (%s) gradients against one process's: normwise error %g", rank, ct_dtype_name(comm), e);
    CT_EXPECTF(same_on_every_rank(pg, gg, np), "rank %d: the ranks' gradients differ", rank);
    free(gc), free(gg);
    ct_ddp_free(ddp);
    ct_ctx_free(c);
    ct_model_free(mc), ct_model_free(mg);
    ct_pg_free(pg);
    return ct_failed_ ? 1 : 0;
}
CT_TEST(ddp_on_nccl_matches_one_process) {
    NEED_GPUS();
    const ct_dtype comms[2] = {CT_F32, CT_BF16};
    for (int k = 0; k < 2; k++) {
        ct_status st = ct_spawn(ddp_rank, 2, (void *)&comms[k]);
        CT_EXPECTF(st == CT_OK, "DDP over NCCL (%s): %s", ct_dtype_name(comms[k]), ct_last_error());
    }
}

/* ---- sharded training on NCCL (ct_fsdp: ZeRO-1, SHARD_GRAD_OP and FULL_SHARD): a small GPT
 * (four blocks, the units) on each rank's GPU, rank r on rows [2r, 2r + 2) of a 4 x 16 batch,
 * three AdamW steps with clipping, against one process on the CPU on the whole batch. The
 * modes that give memory back unmap it (the emulated device: pages behind PROT_NONE, so a
 * touch of a released unit is a fault, as on a GPU). ---- */
static ct_model *small_gpt(void) { return gpu_test_gpt(4, 32, 2, 64, false); }
static int sharded_rank(int rank, int n, void *arg) {
    const ct_shard_mode mode = *(const ct_shard_mode *)arg;
    ct_pg *pg = nccl_init(60);
    if (!pg) return 1;
    const int64_t B = 4, T = 16, b = B / n;
    gpu_test_pair p = gpu_test_pair_make(small_gpt); /* the CPU's, this rank's */
    ct_fsdp *f = NULL;
    RANK_OK(ct_fsdp_create(pg, ct_model_params(p.m[1]), p.o[1], mode, &f));
    ct_fsdp_set_prefetch(f, mode == CT_SHARD_FULL); /* the overlapped gathers and reduce-scatters too */
    int32_t tok[4 * 16], tgt[4 * 16];
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < B * T; i++) { tok[i] = (i * 11 + 5 + step) % 64; tgt[i] = (i * 7 + 1 + 3 * step) % 64; }
        ct_train_batch whole = ct_train_batch_of(CT_I32, tok, 2, (int64_t[]){B, T}, tgt, 2, (int64_t[]){B, T});
        ct_train_batch mine =
            ct_train_batch_of(CT_I32, tok + rank * b * T, 2, (int64_t[]){b, T}, tgt + rank * b * T, 2, (int64_t[]){b, T});
        ct_step_result rc, rg;
        RANK_OK(gpu_test_pair_step(&p, f, 1e-2, 0.5, step, &whole, &mine, &rc, &rg));
        double l = rg.loss; /* this rank's rows; the mean over the ranks is the whole batch's */
        RANK_OK(ct_all_reduce_sync(pg, &l, 1, CT_F64, CT_RED_AVG));
        CT_EXPECTF(fabs(l - rc.loss) <= 1e-5 * fabs(rc.loss) && fabs(rg.grad_norm - rc.grad_norm) <= 1e-4 * rc.grad_norm,
                   "rank %d step %d: loss %.9g (one process %.9g), gradient norm %.7g (%.7g)", rank, step, l, rc.loss,
                   rg.grad_norm, rc.grad_norm);
    }
    /* the updated shards gathered back into every rank's whole parameters */
    ct_params *Pc = ct_model_params(p.m[0]), *Pg = ct_model_params(p.m[1]);
    const size_t np = ct_params_numel(Pc);
    float *wc = malloc(np * sizeof(float)), *wg = malloc(np * sizeof(float));
    memcpy(wc, ct_params_data(Pc), np * sizeof(float));
    {
        ct_fsdp_mem mm = ct_fsdp_memory(f);
        /* given back: what was mapped at the step's peak, against P's parameters and gradients whole */
        const size_t whole = 2 * np * sizeof(float), slack = 8 * 4096;
        /* FULL_SHARD: the root and two units (one prefetched), their gradients; SHARD_GRAD_OP:
         * every parameter, the root's gradients and one unit's */
        const size_t bound = mode == CT_SHARD_FULL ? 2 * (mm.root_bytes + 2 * mm.largest_unit_bytes) + slack
                                                   : np * sizeof(float) + mm.root_bytes + mm.largest_unit_bytes + slack;
        if (mode != CT_SHARD_OPTIM)
            CT_EXPECTF(mm.peak_resident_bytes > 0 && mm.peak_resident_bytes <= bound && mm.peak_resident_bytes < whole,
                       "rank %d %s: %zu bytes mapped at the peak, of %zu (root %zu, largest unit %zu)", rank,
                       ct_shard_mode_name(mode), (size_t)mm.peak_resident_bytes, whole, (size_t)mm.root_bytes,
                       (size_t)mm.largest_unit_bytes);
        printf("rank %d %s: peak mapped %zu bytes of parameters and gradients, of %zu whole\n", rank, ct_shard_mode_name(mode),
               (size_t)mm.peak_resident_bytes, whole);
    }
    RANK_OK(ct_fsdp_gather_all(f)); /* FULL_SHARD released the blocks after the step */
    to_host(wg, ct_params_data(Pg), np * sizeof(float));
    /* (AdamW's m / sqrt(v) magnifies the rounding differences of gradients near 0: 1.7e-5 here) */
    double e = normwise(wg, wc, (int64_t)np);
    CT_EXPECTF(e <= 1e-4, "rank %d: weights after three sharded steps against one process's: normwise error %g", rank, e);
    printf("rank %d %s: weights after three steps against one process's: normwise error %.3g\n", rank, ct_shard_mode_name(mode), e);
    CT_EXPECTF(same_on_every_rank(pg, wg, np), "rank %d: the ranks' weights differ after the sharded steps", rank);
    {
        ct_fsdp_mem mm = ct_fsdp_memory(f);
        CT_EXPECTF(mm.optim_state_bytes > 0 && mm.optim_state_bytes * (size_t)n <= 2 * np * sizeof(float) + 4096 * (size_t)n,
                   "rank %d: optimizer state of %zu bytes for %zu parameters on %d ranks", rank, mm.optim_state_bytes, np, n);
    }
    /* freed: P back in memory of its own on the device, with the same values */
    ct_fsdp_free(f);
    memset(wg, 0, np * sizeof(float));
    to_host(wg, ct_params_data(Pg), np * sizeof(float));
    e = normwise(wg, wc, (int64_t)np);
    CT_EXPECTF(e <= 1e-4, "rank %d: weights after ct_fsdp_free: normwise error %g", rank, e);
    free(wc), free(wg);
    gpu_test_pair_free(&p);
    ct_pg_free(pg);
    return ct_failed_ ? 1 : 0;
}
static void sharded(ct_shard_mode mode) {
    ct_status st = ct_spawn(sharded_rank, 2, &mode);
    CT_EXPECTF(st == CT_OK, "%s: %s", ct_shard_mode_name(mode), ct_last_error());
}
CT_TEST(zero1_on_nccl_matches_one_process) {
    NEED_GPUS();
    sharded(CT_SHARD_OPTIM);
}
CT_TEST(shard_grad_op_on_nccl_matches_one_process) {
    NEED_GPUS();
    sharded(CT_SHARD_GRAD_OPTIM);
}
CT_TEST(full_shard_on_nccl_matches_one_process) {
    NEED_GPUS();
    sharded(CT_SHARD_FULL);
}

/* ---- sharded checkpoints of device shards: written after a step at 2 ranks (each rank its
 * shard, the shards and AdamW's state copied to the host for the write), read back into a
 * fresh run that had gone elsewhere for a step; the two following steps then give the
 * uninterrupted run's losses and weights bit for bit, and the files read on the CPU whole
 * give the weights the device held when they were written ---- */
static void sharded_batch(int rank, int n, int step, int32_t *tok, int32_t *tgt, ct_train_batch *whole, ct_train_batch *mine) {
    const int64_t B = 4, T = 16, b = B / n;
    for (int i = 0; i < B * T; i++) { tok[i] = (i * 11 + 5 + step) % 64; tgt[i] = (i * 7 + 1 + 3 * step) % 64; }
    *whole = ct_train_batch_of(CT_I32, tok, 2, (int64_t[]){B, T}, tgt, 2, (int64_t[]){B, T});
    *mine = ct_train_batch_of(CT_I32, tok + rank * b * T, 2, (int64_t[]){b, T}, tgt + rank * b * T, 2, (int64_t[]){b, T});
}
static int ckpt_rank(int rank, int n, void *arg) {
    const char *dir = arg;
    ct_pg *pg = nccl_init(60);
    if (!pg) return 1;
    ct_model *cpu = small_gpt(); /* for its size now; the checkpoint read whole into it at the end */
    const size_t np = ct_params_numel(ct_model_params(cpu));
    float *w[3] = {malloc(np * sizeof(float)), malloc(np * sizeof(float)), malloc(np * sizeof(float))};
    double loss[2][2];
    int32_t tok[64], tgt[64];
    ct_train_batch whole, mine;
    ct_step_result rc, rg;
    for (int run = 0; run < 2; run++) {
        gpu_test_pair p = gpu_test_pair_make(small_gpt);
        ct_fsdp *f = NULL;
        RANK_OK(ct_fsdp_create(pg, ct_model_params(p.m[1]), p.o[1], CT_SHARD_FULL, &f));
        sharded_batch(rank, n, run == 0 ? 0 : 7, tok, tgt, &whole, &mine); /* the resumed run first goes elsewhere */
        RANK_OK(gpu_test_pair_step(&p, f, 1e-2, 0.5, 0, &whole, &mine, &rc, &rg));
        if (run == 0) {
            RANK_OK(ct_fsdp_save_shard(f, dir));
            if (rank == 0) RANK_OK(ct_fsdp_save_index(f, dir));
            RANK_OK(ct_fsdp_gather_all(f));
            to_host(w[2], ct_params_data(ct_model_params(p.m[1])), np * sizeof(float));
            RANK_OK(ct_fsdp_reshard(f));
            RANK_OK(ct_barrier_sync(pg)); /* every shard written before anyone reads */
        } else {
            RANK_OK(ct_fsdp_load_shards(f, dir));
        }
        for (int step = 1; step < 3; step++) {
            sharded_batch(rank, n, step, tok, tgt, &whole, &mine);
            RANK_OK(gpu_test_pair_step(&p, f, 1e-2, 0.5, step, &whole, &mine, &rc, &rg));
            loss[run][step - 1] = rg.loss;
        }
        RANK_OK(ct_fsdp_gather_all(f));
        to_host(w[run], ct_params_data(ct_model_params(p.m[1])), np * sizeof(float));
        ct_fsdp_free(f);
        gpu_test_pair_free(&p);
    }
    CT_EXPECTF(loss[1][0] == loss[0][0] && loss[1][1] == loss[0][1], "rank %d: resumed losses %.9g %.9g, uninterrupted %.9g %.9g",
               rank, loss[1][0], loss[1][1], loss[0][0], loss[0][1]);
    CT_EXPECTF(!memcmp(w[0], w[1], np * sizeof(float)), "rank %d: the resumed run's weights differ from the uninterrupted run's",
               rank);
    /* the files whole, on the CPU: what the device held when they were written */
    RANK_OK(ct_fsdp_read_full(dir, ct_model_params(cpu), NULL));
    CT_EXPECTF(!memcmp(ct_params_data(ct_model_params(cpu)), w[2], np * sizeof(float)),
               "rank %d: the checkpoint read whole differs from the device's weights at the save", rank);
    ct_model_free(cpu);
    for (int k = 0; k < 3; k++) free(w[k]);
    ct_pg_free(pg);
    return ct_failed_ ? 1 : 0;
}
/* fn on 2 ranks, given a fresh directory, removed after */
static void spawn_in_dir(int (*fn)(int, int, void *)) {
    char dir[] = "/tmp/ct_gpu_fsdp_XXXXXX";
    CT_ASSERT(mkdtemp(dir));
    ct_status st = ct_spawn(fn, 2, dir);
    CT_EXPECTF(st == CT_OK, "%s", ct_last_error());
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CT_EXPECT(system(cmd) == 0);
}
CT_TEST(sharded_checkpoint_of_device_shards_resumes) {
    NEED_GPUS();
    spawn_in_dir(ckpt_rank);
}

/* ---- an unsharded checkpoint into device shards, and the whole model written from them
 * (what `ctrain train --shard` does at a resume and at the end): after a step, rank 0 writes
 * the CPU's checkpoint; the device run goes elsewhere for a step, then reads it into its shards
 * (the weights gathered are the CPU's bit for bit) and two more steps follow the CPU's; then
 * model.safetensors is streamed a unit at a time, each copied to the host for the writer, and
 * read on the CPU it holds the device's weights bit for bit ---- */
typedef struct {
    ct_model *m;
    const char *path;
    ct_st_fetch_fn fetch; /* the stream's */
    void *user;
    int tensors, on_device; /* written, and of them read from device memory (none may be) */
} whole_file;
static ct_status fetch_checked(void *user, const void *data, size_t nbytes, const void **src) {
    whole_file *w = user;
    ct_status st = w->fetch(w->user, data, nbytes, src);
    struct cudaPointerAttributes pa;
    w->tensors++;
    if (st == CT_OK && cudaPointerGetAttributes(&pa, *src) == cudaSuccess && pa.type == cudaMemoryTypeDevice) w->on_device++;
    return st;
}
static ct_status write_whole(void *arg, ct_st_fetch_fn fetch, void *user) {
    whole_file *w = arg;
    w->fetch = fetch, w->user = user;
    return ct_model_save_fetch(w->m, w->path, fetch_checked, w);
}
static int whole_rank(int rank, int n, void *arg) {
    const char *dir = arg;
    ct_pg *pg = nccl_init(60);
    if (!pg) return 1;
    gpu_test_pair p = gpu_test_pair_make(small_gpt);
    ct_params *Pc = ct_model_params(p.m[0]), *Pg = ct_model_params(p.m[1]);
    const size_t np = ct_params_numel(Pc);
    float *wg = malloc(np * sizeof(float));
    ct_fsdp *f = NULL;
    RANK_OK(ct_fsdp_create(pg, Pg, p.o[1], CT_SHARD_FULL, &f));
    int32_t tok[64], tgt[64];
    ct_train_batch whole, mine;
    ct_step_result rc, rg;
    sharded_batch(rank, n, 0, tok, tgt, &whole, &mine);
    RANK_OK(gpu_test_pair_step(&p, f, 1e-2, 0.5, 0, &whole, &mine, &rc, &rg));
    char ck[600];
    snprintf(ck, sizeof ck, "%s/checkpoints", dir);
    ct_train_state ts = {.step = 1, .world_size = 1};
    if (rank == 0) RANK_OK(ct_checkpoint_save(ck, &p.tm[0], p.o[0], &ts, 0));
    RANK_OK(ct_barrier_sync(pg));
    /* elsewhere first: the device alone on other data */
    sharded_batch(rank, n, 7, tok, tgt, &whole, &mine);
    ct_step_args ag = {.ctx = p.c[1], .model = &p.tm[1], .opt = p.o[1], .lr = 1e-2, .clip_norm = 0.5, .step = 1, .fsdp = f};
    RANK_OK(ct_train_step(&ag, &mine, 1, &rg));
    snprintf(ck, sizeof ck, "%s/checkpoints/step-00000001", dir);
    RANK_OK(ct_fsdp_load_whole_(f, ck, &p.tm[1]));
    RANK_OK(ct_fsdp_gather_all(f));
    to_host(wg, ct_params_data(Pg), np * sizeof(float));
    CT_EXPECTF(!memcmp(wg, ct_params_data(Pc), np * sizeof(float)), "rank %d: the device shards read from the whole checkpoint "
               "differ from the CPU's weights: normwise %g", rank, normwise(wg, ct_params_data(Pc), (int64_t)np));
    RANK_OK(ct_fsdp_reshard(f));
    for (int step = 1; step < 3; step++) {
        sharded_batch(rank, n, step, tok, tgt, &whole, &mine);
        RANK_OK(gpu_test_pair_step(&p, f, 1e-2, 0.5, step, &whole, &mine, &rc, &rg));
        double l = rg.loss;
        RANK_OK(ct_all_reduce_sync(pg, &l, 1, CT_F64, CT_RED_AVG));
        CT_EXPECTF(fabs(l - rc.loss) <= 1e-5 * fabs(rc.loss), "rank %d step %d after the read: loss %.9g, the CPU's %.9g", rank,
                   step, l, rc.loss);
    }
    /* the whole model streamed from the shards: no unit stays gathered but the root */
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    whole_file wf = {.m = p.m[1], .path = path};
    RANK_OK(ct_fsdp_stream(f, write_whole, &wf));
    CT_EXPECTF(rank != 0 || (wf.tensors > 0 && wf.on_device == 0), "rank 0: %d of %d tensors written from device memory",
               wf.on_device, wf.tensors);
    RANK_OK(ct_barrier_sync(pg));
    ct_model *back = small_gpt();
    ct_train_model tb = ct_train_model_builtin(back);
    RANK_OK(tb.load(tb.self, path));
    RANK_OK(ct_fsdp_gather_all(f));
    to_host(wg, ct_params_data(Pg), np * sizeof(float));
    CT_EXPECTF(!memcmp(wg, ct_params_data(ct_model_params(back)), np * sizeof(float)),
               "rank %d: model.safetensors streamed from the device shards differs from their weights", rank);
    double e = normwise(wg, ct_params_data(Pc), (int64_t)np);
    CT_EXPECTF(e <= 1e-4, "rank %d: weights after the read and two steps against the CPU's: normwise error %g", rank, e);
    printf("rank %d: whole checkpoint into device shards, two steps, streamed out: normwise error %.3g against the CPU\n", rank, e);
    ct_model_free(back);
    ct_fsdp_free(f);
    gpu_test_pair_free(&p);
    free(wg);
    ct_pg_free(pg);
    return ct_failed_ ? 1 : 0;
}
CT_TEST(whole_checkpoint_into_device_shards_and_streamed_out) {
    NEED_GPUS();
    spawn_in_dir(whole_rank);
}

/* ---- failures: a peer that leaves, a peer that is stuck ---- */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
/* a group with this timeout after a first all-reduce of *d (1,024 zeros): every rank joined */
static ct_pg *joined(int rank, double timeout_s, float **d) {
    ct_pg *pg = nccl_init(timeout_s);
    *d = pg ? dev_copy(NULL, 1024 * sizeof(float)) : NULL;
    if (*d) cudaMemset(*d, 0, 1024 * sizeof(float));
    if (*d && ct_all_reduce_sync(pg, *d, 1024, CT_F32, CT_RED_SUM) == CT_OK) return pg;
    fprintf(stderr, "rank %d: the first all_reduce: %s\n", rank, ct_last_error());
    return NULL;
}
/* a rank's end: its exit status */
static int done(ct_pg *pg, float *d) {
    ct_cuda_free(d);
    ct_pg_free(pg);
    return ct_failed_ ? 1 : 0;
}
static int leaver(int rank, int n, void *arg) {
    (void)n, (void)arg;
    float *d;
    ct_pg *pg = joined(rank, 10, &d);
    if (!pg) return 1;
    if (rank == 1) return 0; /* leaves without its communicator's goodbye: the process ends */
    usleep(200 * 1000);
    const double t0 = now_s();
    ct_status st = ct_all_reduce_sync(pg, d, 1024, CT_F32, CT_RED_SUM);
    const double dt = now_s() - t0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ct_last_error());
    /* the emulated NCCL sees the process gone and names it; a real one may only time out */
    if (getenv("CT_EMU_DEVICE"))
        CT_EXPECTF(st == CT_ERR_PEER && strstr(msg, "rank 1") && strstr(msg, "aborted"), "the survivor's all_reduce: %d %s",
                   (int)st, msg);
    else
        CT_EXPECTF((st == CT_ERR_PEER || st == CT_ERR_TIMEOUT) && strstr(msg, "aborted"), "the survivor's all_reduce: %d %s",
                   (int)st, msg);
    CT_EXPECTF(dt < 12, "the dead peer failed the call after %.1f s (timeout 10 s)", dt);
    st = ct_all_reduce_sync(pg, d, 1024, CT_F32, CT_RED_SUM);
    CT_EXPECTF(st == CT_ERR_PEER && strstr(ct_last_error(), "earlier failure"), "the next call: %d %s", (int)st,
               ct_last_error());
    return done(pg, d);
}
CT_TEST(nccl_peer_gone_fails_the_survivor) {
    NEED_GPUS();
    ct_status st = ct_spawn(leaver, 2, NULL);
    CT_EXPECTF(st == CT_OK, "%s", ct_last_error());
}
static int stuck(int rank, int n, void *arg) {
    (void)n, (void)arg;
    float *d;
    ct_pg *pg = joined(rank, 2, &d);
    if (!pg) return 1;
    if (rank == 1) usleep(4500 * 1000); /* stuck past rank 0's timeout */
    const double t0 = now_s();
    ct_status st = ct_all_reduce_sync(pg, d, 1024, CT_F32, CT_RED_SUM);
    const double dt = now_s() - t0;
    if (rank == 0) {
        CT_EXPECTF(st == CT_ERR_TIMEOUT && strstr(ct_last_error(), "timed out") && strstr(ct_last_error(), "aborted"),
                   "rank 0's all_reduce: %d %s", (int)st, ct_last_error());
        CT_EXPECTF(dt >= 1.5 && dt < 4.0, "rank 0 gave up after %.2f s (timeout 2 s)", dt);
    } else { /* rank 0 aborted its communicator: rank 1's call fails (the peer is gone) */
        CT_EXPECTF(st != CT_OK, "rank 1's all_reduce after rank 0 gave up succeeded");
    }
    return done(pg, d);
}
CT_TEST(nccl_stuck_peer_times_out) {
    NEED_GPUS();
    ct_status st = ct_spawn(stuck, 2, NULL);
    CT_EXPECTF(st == CT_OK, "%s", ct_last_error());
}

CT_TEST_MAIN()
