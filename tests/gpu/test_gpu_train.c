/* Training on cuda:0 through the op table's device column, against the same steps on the
 * CPU: an MLP (linear, relu, cross-entropy) forward, backward and AdamW step; a chain of the
 * GPT ops (embedding, layer norm, linear, reshape, flash attention, add, gelu, scale, a tied
 * matmul, cross-entropy); mul, tanh, sigmoid, sum and mean; dropout; ct_train_step on cuda:0; a small GPT model (views, copies, split of
 * q, k, v, merge_heads); a small Llama (rms_norm, rope, repeat_kv, silu) in f32 and under bf16
 * autocast, and three of its ct_train_steps;
 * gradient clipping and the grad scaler on the device; an op without a device kernel failing
 * the context; DDP at world
 * size 1 on NCCL with the buckets reduced on the GPU; bf16 autocast on cuda:0 (the policy op by
 * op, an MLP, the GPT, ct_train_step) against CPU autocast within 1e-2. Built only with CUDA; without a GPU
 * every test skips with "no CUDA GPU" (scripts/gpu-check.sh runs them on one). Tolerances:
 * 1e-5 relative for the MLP (f32 GEMMs, no TF32), 1e-4 normwise for the GPT-op chain,
 * whose attention sums in another order than the CPU's tiles. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>

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
#include "ops/op_table.h"

#define OK(call) CT_ASSERT((call) == CT_OK || (fprintf(stderr, "%s: %s\n", #call, ct_last_error()), 0))

static double rel(double a, double b) { return fabs(a - b) / (fabs(b) > 1e-12 ? fabs(b) : 1e-12); }

/* the store's gradients, wherever they are, into host memory */
static void grads_to_host(ct_params *P, float *out);
/* normwise error of Pg's gradients against Pc's: all of them (i < 0) or parameter i's */
static double grad_err(ct_params *Pc, ct_params *Pg, int i) {
    size_t n = ct_params_numel(Pc);
    float *gc = malloc(n * sizeof(float)), *gg = malloc(n * sizeof(float));
    if (!gc || !gg) abort();
    grads_to_host(Pc, gc);
    grads_to_host(Pg, gg);
    size_t off = i < 0 ? 0 : ct_params_offset(Pc, i);
    double e = normwise(gg + off, gc + off, i < 0 ? (int64_t)n : ct_numel(ct_params_get(Pc, i)));
    free(gc);
    free(gg);
    return e;
}
static void grads_to_host(ct_params *P, float *out) {
    size_t bytes = ct_params_numel(P) * sizeof(float);
    /* backward's kernels run on the compute stream, which cudaMemcpy's stream does not wait for */
    if (ct_device_sync(ct_params_device(P)) != CT_OK) abort();
    if (ct_params_device(P).type == CT_DEV_CPU) memcpy(out, ct_params_grad(P), bytes);
    else if (cudaMemcpy(out, ct_params_grad(P), bytes, cudaMemcpyDeviceToHost) != cudaSuccess) abort();
}

/* one forward + backward; x and y on the model's device; returns the loss */
static double step(ct_ctx *c, ct_model *m, ct_tensor *x, ct_tensor *y) {
    ct_tensor *loss = ct_cross_entropy(c, ct_model_forward(c, m, x), y, -100);
    double l = ct_item(loss);
    ct_backward(c, loss);
    return l;
}

CT_TEST(mlp_step_on_cuda_matches_cpu) {
    NEED_GPU();
    ct_model *mc = gpu_test_mlp(), *mg = gpu_test_mlp();
    ct_params *Pc = ct_model_params(mc), *Pg = ct_model_params(mg);
    OK(ct_module_to(ct_model_module(mg), CT_CUDA(0)));
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    const int64_t B = 16;
    ct_tensor *x = rnd(c, 2, (int64_t[]){B, 32}, 1.0f), *xd, *yd;
    int32_t lab[16];
    for (int i = 0; i < B; i++) lab[i] = (i * 7) % 10;
    ct_tensor *y = ct_from_data(c, CT_I32, lab, 1, &B);
    OK(ct_tensor_to(c, x, CT_CUDA(0), &xd));
    OK(ct_tensor_to(c, y, CT_CUDA(0), &yd));
    double lc = step(c, mc, x, y), lg = step(c, mg, xd, yd), lg0 = lg;
    CT_EXPECTF(ct_ctx_status(c) == CT_OK, "step: %s", ct_last_error());
    CT_EXPECTF(rel(lg, lc) <= 1e-5, "loss cuda %.9g cpu %.9g", lg, lc);
    double e = grad_err(Pc, Pg, -1);
    CT_EXPECTF(e <= 1e-5, "gradients: normwise error %g", e);
    /* AdamW with momentum state: on the CPU, and on the GPU (the fused kernel on the flat
     * device buffers, queued after backward on the compute stream) */
    ct_optim *o, *og;
    OK(ct_optim_create_adamw(Pc, NULL, &o));
    OK(ct_optim_create_adamw(Pg, NULL, &og));
    ct_optim_step(o, 1e-2);
    ct_optim_step(og, 1e-2);
    CT_EXPECTF(ct_optim_status(og) == CT_OK, "optimizer on cuda:0: %s", ct_last_error());
    ct_params_zero_grad(Pc);
    ct_params_zero_grad(Pg);
    ct_ctx_reset(c);
    OK(ct_tensor_to(c, x = rnd(c, 2, (int64_t[]){B, 32}, 1.0f), CT_CUDA(0), &xd));
    y = ct_from_data(c, CT_I32, lab, 1, &B);
    OK(ct_tensor_to(c, y, CT_CUDA(0), &yd));
    lc = step(c, mc, x, y);
    lg = step(c, mg, xd, yd);
    CT_EXPECTF(ct_ctx_status(c) == CT_OK && rel(lg, lc) <= 1e-5, "loss after an AdamW step: cuda %.9g cpu %.9g (%s)", lg, lc,
               ct_ctx_status(c) ? ct_last_error() : "ok");
    printf("    MLP on cuda:0: loss %.7f then %.7f (cpu %.7f), gradient error %.2e\n", lg0, lg, lc, e);
    ct_cuda_mem_stats ms;
    ct_cuda_mem_stats_get(0, &ms);
    printf("    cuda:0 memory: %zu B in use, peak %zu B, %lld cudaMalloc calls\n", ms.current, ms.peak, (long long)ms.mallocs);
    ct_optim_free(o);
    ct_optim_free(og);
    ct_ctx_free(c);
    ct_model_free(mc);
    ct_model_free(mg);
}

/* the GPT ops in one chain: returns the loss; grads in P */
static double gpt_chain(ct_ctx *c, ct_params *P, ct_tensor *idx, ct_tensor *tgt) {
    ct_tensor *E = ct_params_find(P, "wte"), *lw = ct_params_find(P, "ln.w"), *lb = ct_params_find(P, "ln.b");
    ct_tensor *Wq = ct_params_find(P, "q"), *Wk = ct_params_find(P, "k"), *Wv = ct_params_find(P, "v");
    ct_tensor *W1 = ct_params_find(P, "fc.w"), *b1 = ct_params_find(P, "fc.b");
    ct_tensor *x = ct_layer_norm(c, ct_embedding(c, E, idx), lw, lb, 1e-5f); /* [16, 32] */
    int64_t heads[4] = {2, 1, 8, 32};
    ct_tensor *q = ct_reshape(c, ct_linear(c, x, Wq, NULL), 4, heads), *k = ct_reshape(c, ct_linear(c, x, Wk, NULL), 4, heads);
    ct_tensor *v = ct_reshape(c, ct_linear(c, x, Wv, NULL), 4, heads);
    ct_tensor *a = ct_reshape(c, ct_flash_attention(c, q, k, v, true), 2, (int64_t[]){16, 32});
    ct_tensor *h = ct_scale(c, ct_gelu(c, ct_linear(c, ct_add(c, a, x), W1, b1), true), 0.5f);
    ct_tensor *logits = ct_matmul(c, h, E, false, true); /* tied: E's gradient accumulates twice */
    ct_tensor *loss = ct_cross_entropy(c, logits, tgt, -100);
    double l = ct_item(loss);
    ct_backward(c, loss);
    return l;
}

static ct_params *gpt_params(void) {
    ct_params *P;
    if (ct_params_create(&P) != CT_OK) abort();
    ct_param(P, "wte", 2, (int64_t[]){50, 32}, CT_INIT_NORMAL, 0.1);
    ct_param(P, "ln.w", 1, (int64_t[]){32}, CT_INIT_UNIFORM, 1.0);
    ct_param(P, "ln.b", 1, (int64_t[]){32}, CT_INIT_UNIFORM, 0.1);
    const char *names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++) ct_param(P, names[i], 2, (int64_t[]){32, 32}, CT_INIT_KAIMING_UNIFORM, 32);
    ct_param(P, "fc.w", 2, (int64_t[]){32, 32}, CT_INIT_KAIMING_UNIFORM, 32);
    ct_param(P, "fc.b", 1, (int64_t[]){32}, CT_INIT_KAIMING_UNIFORM, 32);
    if (ct_params_finalize(P, 11) != CT_OK) abort();
    return P;
}

CT_TEST(gpt_ops_chain_on_cuda_matches_cpu) {
    NEED_GPU();
    ct_params *Pc = gpt_params(), *Pg = gpt_params();
    OK(ct_params_to(Pg, CT_CUDA(0)));
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    int64_t ids[16], tg[16], n16 = 16;
    for (int i = 0; i < 16; i++) { ids[i] = (i * 13) % 50; tg[i] = (i * 17 + 3) % 50; }
    ct_tensor *idx = ct_from_data(c, CT_I64, ids, 1, &n16), *tgt = ct_from_data(c, CT_I64, tg, 1, &n16), *idxd, *tgtd;
    OK(ct_tensor_to(c, idx, CT_CUDA(0), &idxd));
    OK(ct_tensor_to(c, tgt, CT_CUDA(0), &tgtd));
    double lc = gpt_chain(c, Pc, idx, tgt), lg = gpt_chain(c, Pg, idxd, tgtd);
    CT_EXPECTF(ct_ctx_status(c) == CT_OK, "chain: %s", ct_last_error());
    CT_EXPECTF(rel(lg, lc) <= 1e-5, "loss cuda %.9g cpu %.9g", lg, lc);
    for (int i = 0; i < ct_params_count(Pc); i++) {
        double e = grad_err(Pc, Pg, i);
        CT_EXPECTF(e <= 1e-4, "gradient of %s: normwise error %g", ct_params_get(Pc, i)->name, e);
    }
    ct_ctx_free(c);
    ct_params_free(Pc);
    ct_params_free(Pg);
}

/* the MLP's batch of a step: 8 rows of 32 features, classes of 10 (static buffers) */
static ct_train_batch mlp_batch(int step) {
    static float x[8 * 32];
    static int32_t y[8];
    for (int i = 0; i < 8 * 32; i++) x[i] = (float)sin(0.37 * i + step);
    for (int i = 0; i < 8; i++) y[i] = (i * 3 + step) % 10;
    return ct_train_batch_of(CT_F32, x, 2, (int64_t[]){8, 32}, y, 1, (int64_t[]){8});
}
/* ct_train_step (the loop every trainer uses) with the model of make on cuda:0: three AdamW
 * steps on batch(step), each loss against the CPU's (amp: both under autocast); the device's
 * losses in loss[3] */
static void train_steps_match(ct_model *(*make)(void), ct_train_batch (*batch)(int), ct_dtype amp, double tol, double *loss) {
    gpu_test_pair p = gpu_test_pair_make(make);
    for (int step = 0; step < 3; step++) {
        ct_train_batch b = batch(step);
        ct_step_result r[2];
        for (int j = 0; j < 2; j++) {
            ct_step_args sa = {.ctx = p.c[j], .model = &p.tm[j], .opt = p.o[j], .lr = 1e-2, .step = step, .amp = amp};
            OK(ct_train_step(&sa, &b, 1, &r[j]));
        }
        CT_EXPECTF(rel(r[1].loss, r[0].loss) <= tol, "step %d (%s): loss cuda %.9g cpu %.9g", step, ct_dtype_name(amp),
                   r[1].loss, r[0].loss);
        if (loss) loss[step] = r[1].loss;
    }
    gpu_test_pair_free(&p);
}
CT_TEST(train_step_on_cuda_matches_cpu) {
    NEED_GPU();
    train_steps_match(gpu_test_mlp, mlp_batch, CT_F32, 1e-5, NULL);
}
/* bf16 autocast on the GPU through the device dispatch (built, not yet run on a GPU) */
CT_TEST(train_step_bf16_autocast_on_cuda_matches_cpu) {
    NEED_GPU();
    train_steps_match(gpu_test_mlp, mlp_batch, CT_BF16, 1e-2, NULL);
}
/* f16 autocast: the GEMMs, attention, elementwise, layer norm and cross-entropy kernels reading
 * f16 themselves (f16 keeps 3 more bits than bf16: the same tolerance is loose) */
CT_TEST(train_step_f16_autocast_on_cuda_matches_cpu) {
    NEED_GPU();
    train_steps_match(gpu_test_mlp, mlp_batch, CT_F16, 1e-2, NULL);
}

/* a small GPT (nanoGPT layout, fused attention) through ct_model_loss: the split of q, k, v by
 * transposes, a copy and slices, merge_heads, the tied LM head */
static bool ckpt_blocks;       /* small_gpt with each block a checkpointed segment */
static int64_t small_vocab = 64; /* small_gpt's vocabulary */
static ct_model *small_gpt(void) { return gpu_test_gpt(2, 32, 2, small_vocab, ckpt_blocks); }

/* one forward and backward of the small GPT on x, y (either device), under autocast when amp
 * is not f32; returns the loss */
static double gpt_loss_step(ct_ctx *c, ct_model *m, ct_tensor *x, ct_tensor *y, ct_dtype amp) {
    if (amp != CT_F32 && ct_autocast_begin(c, amp) != CT_OK) abort();
    ct_tensor *l = ct_model_loss(c, m, x, y);
    if (amp != CT_F32) ct_autocast_end(c);
    double v = ct_item(l);
    ct_backward(c, l);
    return v;
}
/* the small model of make (vocabulary 64, context 16) on cuda:0 against the CPU: loss within tol
 * relative, each gradient normwise */
static void model_match(ct_model *(*make)(void), ct_dtype amp, double tol, double gtol) {
    ct_model *mc = make(), *mg = make();
    OK(ct_module_to(ct_model_module(mg), CT_CUDA(0)));
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    int32_t tok[2 * 16], tgt[2 * 16];
    for (int i = 0; i < 32; i++) { tok[i] = (i * 11 + 5) % 64; tgt[i] = (i * 7 + 1) % 64; }
    int64_t shape[2] = {2, 16};
    ct_tensor *x = ct_from_data(c, CT_I32, tok, 2, shape), *y = ct_from_data(c, CT_I32, tgt, 2, shape), *xd, *yd;
    OK(ct_tensor_to(c, x, CT_CUDA(0), &xd));
    OK(ct_tensor_to(c, y, CT_CUDA(0), &yd));
    /* one backward per forward: a backward consumes the whole tape */
    double vc = gpt_loss_step(c, mc, x, y, amp), vg = gpt_loss_step(c, mg, xd, yd, amp);
    CT_EXPECTF(ct_ctx_status(c) == CT_OK, "model on cuda:0 (%s): %s", ct_dtype_name(amp), ct_last_error());
    CT_EXPECTF(rel(vg, vc) <= tol, "loss (%s) cuda %.9g cpu %.9g", ct_dtype_name(amp), vg, vc);
    ct_params *Pc = ct_model_params(mc);
    for (int i = 0; i < ct_params_count(Pc); i++) {
        if (ct_params_is_buffer(Pc, i)) continue;
        double e = grad_err(Pc, ct_model_params(mg), i);
        CT_EXPECTF(e <= gtol, "gradient of %s (%s): normwise error %g", ct_params_get(Pc, i)->name, ct_dtype_name(amp), e);
    }
    ct_ctx_free(c);
    ct_model_free(mc);
    ct_model_free(mg);
}
static void gpt_model_match(ct_dtype amp, double tol, double gtol) { model_match(small_gpt, amp, tol, gtol); }
CT_TEST(gpt_model_on_cuda_matches_cpu) {
    NEED_GPU();
    gpt_model_match(CT_F32, 1e-5, 1e-4);
}
/* bf16 autocast: both sides round the same activations; the sums run in other orders, so a
 * value near a bf16 rounding boundary may round the other way: bf16 tolerance */
CT_TEST(gpt_model_bf16_autocast_on_cuda_matches_cpu) {
    NEED_GPU();
    gpt_model_match(CT_BF16, 1e-2, 1e-2);
}
CT_TEST(gpt_model_f16_autocast_on_cuda_matches_cpu) {
    NEED_GPU();
    gpt_model_match(CT_F16, 1e-2, 1e-2);
}
/* activation checkpointing on the device: each block recomputed in backward, the segments'
 * intermediates returned to the allocator after their forward; the same loss and gradients */
CT_TEST(gpt_model_checkpointed_on_cuda_matches_cpu) {
    NEED_GPU();
    ckpt_blocks = true;
    gpt_model_match(CT_F32, 1e-5, 1e-4);
    gpt_model_match(CT_BF16, 1e-2, 1e-2);
    ckpt_blocks = false;
}

/* a vocabulary that is not a multiple of 64 (67): on the device the loss's LM head runs over
 * wte padded to 128 rows with -inf logits on the padding (gpt.c's padded_head), so its rows are
 * 16-byte aligned; the loss and every gradient (wte's through the padding) as the CPU's */
CT_TEST(gpt_model_odd_vocab_on_cuda_matches_cpu) {
    NEED_GPU();
    small_vocab = 67;
    gpt_model_match(CT_F32, 1e-5, 1e-4);
    gpt_model_match(CT_BF16, 1e-2, 1e-2);
    small_vocab = 64;
}

/* Under bf16 autocast the activations' gradients stay bf16 on the device (CTRAIN_CUDA_LOWP_GRADS,
 * on by default): cross-entropy writes the LM head's dlogits in bf16 (the fused classifier), the
 * linears read their output's bf16 gradient as it is and write dX and dW in bf16 into the casts
 * and GELU before them, GELU and the residual adds write theirs in bf16. Against the same step
 * with every declaration taken away (f32 gradients rounded in place to the same values): the
 * same loss and parameter gradients (bit for bit on the emulated device, whose GEMM sums in one
 * order whatever the output type; within bf16 rounding of a sum on a GPU, where cuBLASLt may
 * take another algorithm for a bf16 output), and the step's peak device memory lower by most of
 * the f32 [N, V] gradient of the logits that is no longer made. */
static void lowp_grads_run(ct_dtype amp, int64_t vocab, float **grads, size_t *n, size_t *peak, double *loss) {
    *grads = NULL;
    ct_model_config cfg = ct_model_default_config(CT_MODEL_GPT);
    cfg.gpt.n_layer = 1;
    cfg.gpt.n_embd = 32;
    cfg.gpt.n_head = 2;
    cfg.gpt.block_size = 16;
    cfg.gpt.vocab_size = vocab; /* the logits' gradient dominates the step's memory */
    cfg.gpt.flash_attention = true;
    ct_model *m = NULL;
    ct_cuda_mem_reset_peak(0); /* this run's peak, not an earlier one's */
    OK(ct_model_create(&cfg, 9, &m));
    OK(ct_module_to(ct_model_module(m), CT_CUDA(0)));
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    int32_t tok[32], tgt[32];
    for (int i = 0; i < 32; i++) { tok[i] = (int32_t)((i * 211 + 5) % vocab); tgt[i] = (int32_t)((i * 97 + 1) % vocab); }
    int64_t shape[2] = {2, 16};
    ct_tensor *x, *y;
    OK(ct_tensor_to(c, ct_from_data(c, CT_I32, tok, 2, shape), CT_CUDA(0), &x));
    OK(ct_tensor_to(c, ct_from_data(c, CT_I32, tgt, 2, shape), CT_CUDA(0), &y));
    *loss = gpt_loss_step(c, m, x, y, amp);
    CT_EXPECTF(ct_ctx_status(c) == CT_OK, "step: %s", ct_last_error());
    *n = ct_params_numel(ct_model_params(m));
    if (!(*grads = malloc(*n * sizeof(float)))) abort();
    grads_to_host(ct_model_params(m), *grads);
    ct_device_mem mem;
    OK(ct_device_mem_get(CT_CUDA(0), &mem));
    *peak = mem.peak;
    ct_ctx_free(c);
    ct_model_free(m);
}
/* No host work in the step: after two warm-up steps (the caching allocator's blocks, cuBLASLt's
 * algorithms), a bf16 GPT training step on the device (batch upload, forward, backward, AdamW,
 * zeroing) makes no cudaMalloc, uploads its batch and nothing else (the positions and the
 * padded head's bias are the model's, made once), and never waits for the device until its
 * loss is read back: the host only queues work, as PyTorch's eager step does when nothing calls
 * .item(). A vocabulary of 67, so that the LM head is padded. */
CT_TEST(train_step_on_cuda_queues_without_host_waits) {
    NEED_GPU();
    small_vocab = 67;
    ct_model *m = small_gpt();
    small_vocab = 64;
    OK(ct_module_to(ct_model_module(m), CT_CUDA(0)));
    ct_optim *o = NULL;
    OK(ct_optim_create_adamw(ct_model_params(m), NULL, &o));
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    int32_t tok[32], tgt[32];
    for (int i = 0; i < 32; i++) { tok[i] = (i * 11 + 5) % 64; tgt[i] = (i * 7 + 1) % 64; }
    int64_t shape[2] = {2, 16};
    for (int step = 0; step < 3; step++) {
        ct_cuda_mem_stats m0;
        ct_cuda_mem_stats_get(0, &m0);
        int64_t w0 = ct_cuda_host_waits(), u0 = ct_cuda_uploads();
        ct_tensor *x, *y;
        OK(ct_tensor_to(c, ct_from_data(c, CT_I32, tok, 2, shape), CT_CUDA(0), &x));
        OK(ct_tensor_to(c, ct_from_data(c, CT_I32, tgt, 2, shape), CT_CUDA(0), &y));
        OK(ct_autocast_begin(c, CT_BF16));
        ct_tensor *l = ct_model_loss(c, m, x, y);
        ct_autocast_end(c);
        ct_backward(c, l);
        ct_optim_step(o, 1e-3);
        ct_params_zero_grad(ct_model_params(m));
        ct_cuda_mem_stats m1;
        ct_cuda_mem_stats_get(0, &m1);
        int64_t w1 = ct_cuda_host_waits(), u1 = ct_cuda_uploads();
        double v = ct_item(l);
        CT_EXPECTF(ct_ctx_status(c) == CT_OK && ct_optim_status(o) == CT_OK && isfinite(v), "step %d: %s", step, ct_last_error());
        if (step == 2) {
            printf("step 3: %lld cudaMalloc calls, %lld uploads, %lld host waits before the loss is read, %lld reading it\n",
                   (long long)(m1.mallocs - m0.mallocs), (long long)(u1 - u0), (long long)(w1 - w0),
                   (long long)(ct_cuda_host_waits() - w1));
            CT_EXPECTF(u1 - u0 == 2, "the step made %lld host-to-device copies (the batch is 2)", (long long)(u1 - u0));
            CT_EXPECTF(m1.mallocs == m0.mallocs, "the step called cudaMalloc %lld times", (long long)(m1.mallocs - m0.mallocs));
            CT_EXPECTF(w1 == w0, "the step waited for the device %lld times before its loss was read", (long long)(w1 - w0));
            CT_EXPECTF(ct_cuda_host_waits() == w1 + 1, "reading the loss waited %lld times", (long long)(ct_cuda_host_waits() - w1));
        }
        ct_ctx_reset(c);
    }
    ct_ctx_free(c);
    ct_optim_free(o);
    ct_model_free(m);
}
/* vocab 2048, and 2047: the LM head over the padded vocabulary, its dW written in bf16 by the
 * GEMM and its rows handed to the weight's cast (pad_rows' bf16 gradient) */
static void lowp_grads_compare(int64_t vocab) {
    float *g[2];
    size_t n[2], peak[2];
    double loss[2];
    lowp_grads_run(CT_BF16, vocab, &g[0], &n[0], &peak[0], &loss[0]);
    unsigned saved[CT_OP_COUNT];
    for (int i = 0; i < CT_OP_COUNT; i++) {
        saved[i] = ct_op_table_dev[i].lowp_grad_dt;
        ct_op_table_dev[i].lowp_grad_dt = 0;
    }
    lowp_grads_run(CT_BF16, vocab, &g[1], &n[1], &peak[1], &loss[1]);
    for (int i = 0; i < CT_OP_COUNT; i++) ct_op_table_dev[i].lowp_grad_dt = saved[i];
    CT_ASSERT(g[0] && g[1] && n[0] == n[1]);
    double e = normwise(g[0], g[1], (int64_t)n[0]);
    size_t nv = 32 * (size_t)vocab; /* the N x V logits */
    printf("bf16 activation gradients, vocabulary %lld: loss %.9g / %.9g, gradients' normwise difference %g, peak %zu / %zu bytes\n",
           (long long)vocab, loss[0], loss[1], e, peak[0], peak[1]);
    CT_EXPECTF(loss[0] == loss[1], "loss %.9g with bf16 activation gradients, %.9g without", loss[0], loss[1]);
    if (getenv("CT_EMU_DEVICE")) CT_EXPECTF(!memcmp(g[0], g[1], n[0] * sizeof(float)), "gradients differ: normwise %g", e);
    else CT_EXPECTF(e <= 1e-2, "gradients differ: normwise %g", e);
    /* the f32 gradient (4 N V bytes) and its bf16 copy for the GEMMs (2 N V) against one bf16
     * gradient (2 N V), less what the peaks' moments differ by: at least 3 N V bytes */
    CT_EXPECTF(peak[1] >= peak[0] + 3 * nv, "peak device memory %zu bytes with bf16 activation gradients, %zu without",
               peak[0], peak[1]);
    free(g[0]);
    free(g[1]);
}
CT_TEST(lowp_activation_grads_on_cuda) {
    NEED_GPU();
    CT_EXPECTF(ct_op_table_dev[CT_OP_LINEAR].lowp_grad_dt && ct_op_table_dev[CT_OP_CAST].lowp_grad_dt,
               "the linears and casts declare no bf16 gradients (CTRAIN_CUDA_LOWP_GRADS=0?)");
    lowp_grads_compare(2048);
    lowp_grads_compare(2047);
}

/* a small Llama (RMSNorm, rotary positions, grouped-query attention through repeat_kv, SwiGLU):
 * 4 query heads sharing 2 key/value heads, the fused or the plain attention, each layer a
 * checkpointed segment or not, rope with Llama 3.1's scaling or not */
static bool llama_plain, llama_ckpt, llama_scaled;
static ct_model *small_llama(void) {
    ct_model_config cfg = ct_model_default_config(CT_MODEL_LLAMA);
    cfg.llama.vocab_size = 64;
    cfg.llama.hidden_size = 32;
    cfg.llama.intermediate_size = 48;
    cfg.llama.num_hidden_layers = 2;
    cfg.llama.num_attention_heads = 4;
    cfg.llama.num_key_value_heads = 2;
    cfg.llama.max_position_embeddings = 16;
    cfg.llama.flash_attention = !llama_plain;
    cfg.llama.checkpoint_activations = llama_ckpt;
    /* Llama 3.1's rope scaling: at head size 8 one frequency blended, three divided */
    if (llama_scaled) cfg.llama.rope_scaling = (ct_rope_scaling){8.0f, 1.0f, 4.0f, 8};
    ct_model *m = NULL;
    if (ct_model_create(&cfg, 11, &m) != CT_OK) abort();
    return m;
}
CT_TEST(llama_model_on_cuda_matches_cpu) {
    NEED_GPU();
    model_match(small_llama, CT_F32, 1e-5, 1e-4);
    llama_plain = true;
    model_match(small_llama, CT_F32, 1e-5, 1e-4);
    llama_plain = false;
    llama_ckpt = true; /* the layers recomputed on the device in backward */
    model_match(small_llama, CT_F32, 1e-5, 1e-4);
    llama_ckpt = false;
    llama_scaled = true;
    model_match(small_llama, CT_F32, 1e-5, 1e-4);
    llama_scaled = false;
}
/* bf16 autocast: rms_norm reading bf16 with an f32 result, rope, repeat_kv and silu bf16 */
CT_TEST(llama_model_bf16_autocast_on_cuda_matches_cpu) {
    NEED_GPU();
    model_match(small_llama, CT_BF16, 1e-2, 1e-2);
}
CT_TEST(llama_model_f16_autocast_on_cuda_matches_cpu) {
    NEED_GPU();
    model_match(small_llama, CT_F16, 1e-2, 1e-2);
}
/* the Llama's batch of a step: 2 sequences of 16 tokens, the targets shifted by one */
static ct_train_batch llama_batch(int step) {
    static int32_t tok[2 * 16], tgt[2 * 16];
    for (int i = 0; i < 32; i++) { tok[i] = (i * 11 + 5 * step) % 64; tgt[i] = (i * 11 + 5 * step + 11) % 64; }
    return ct_train_batch_of(CT_I32, tok, 2, (int64_t[]){2, 16}, tgt, 2, (int64_t[]){2, 16});
}
/* ct_train_step with the small Llama on cuda:0: three AdamW steps on token batches, each loss
 * against the CPU's, and the loss going down */
CT_TEST(llama_train_steps_on_cuda_match_cpu) {
    NEED_GPU();
    double loss[3];
    train_steps_match(small_llama, llama_batch, CT_F32, 1e-5, loss);
    CT_EXPECTF(loss[2] < loss[0], "the loss on cuda:0 went from %g to %g", loss[0], loss[2]);
}

/* The autocast policy on cuda:0, op by op, against the CPU's under the same region: linear,
 * matmul and flash attention give bf16 (LOWP), softmax, layer norm and cross-entropy f32
 * (FP32), gelu keeps bf16 and add promotes bf16 + f32 to f32 (PROMOTE); values within bf16
 * tolerance; an MLP's forward and backward under autocast against the CPU's. */
static ct_tensor *host_f32(ct_ctx *c, ct_tensor *t) {
    ct_tensor *h = NULL;
    if (ct_tensor_to(c, ct_contiguous(c, t), CT_CPU, &h) != CT_OK) {
        fprintf(stderr, "to the host: %s\n", ct_last_error());
        abort();
    }
    return h->dtype == CT_F32 ? h : ct_cast(c, h, CT_F32);
}
CT_TEST(autocast_policy_on_cuda_matches_cpu) {
    NEED_GPU();
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    ct_tensor *x = rnd(c, 2, (int64_t[]){16, 32}, 1.0f), *w = rnd(c, 2, (int64_t[]){32, 32}, 0.2f);
    ct_tensor *lw = rnd(c, 1, (int64_t[]){32}, 1.0f), *lb = rnd(c, 1, (int64_t[]){32}, 0.1f);
    int32_t lab[16];
    for (int i = 0; i < 16; i++) lab[i] = (i * 5) % 32;
    ct_tensor *y = ct_from_data(c, CT_I32, lab, 1, (int64_t[]){16});
    ct_tensor *in[2][5] = {{x, w, lw, lb, y}};
    for (int i = 0; i < 5; i++) OK(ct_tensor_to(c, in[0][i], CT_CUDA(0), &in[1][i]));
    enum { LIN, MM, GELU, ADD, SM, LN, ATT, XE, NOUT };
    static const char *names[NOUT] = {"linear", "matmul", "gelu", "add", "softmax", "layer_norm", "flash_attention", "cross_entropy"};
    static const ct_dtype want[NOUT] = {CT_BF16, CT_BF16, CT_BF16, CT_F32, CT_F32, CT_F32, CT_BF16, CT_F32};
    ct_tensor *out[2][NOUT];
    OK(ct_autocast_begin(c, CT_BF16));
    for (int d = 0; d < 2; d++) {
        ct_tensor **t = in[d], **o = out[d];
        o[LIN] = ct_linear(c, t[0], t[1], t[3]);
        o[MM] = ct_matmul(c, o[LIN], t[1], false, true);
        o[GELU] = ct_gelu(c, o[MM], true);
        o[ADD] = ct_add(c, o[GELU], t[0]);
        o[SM] = ct_softmax(c, o[GELU]);
        o[LN] = ct_layer_norm(c, o[GELU], t[2], t[3], 1e-5f);
        ct_tensor *q = ct_reshape(c, o[LIN], 4, (int64_t[]){2, 1, 8, 32});
        o[ATT] = ct_flash_attention(c, q, q, q, true);
        o[XE] = ct_cross_entropy(c, o[GELU], t[4], -100);
    }
    ct_autocast_end(c);
    CT_EXPECTF(ct_ctx_status(c) == CT_OK, "autocast ops on cuda:0: %s", ct_last_error());
    for (int k = 0; k < NOUT; k++) {
        ct_tensor *a = out[0][k], *b = out[1][k];
        CT_EXPECTF(a->dtype == want[k] && b->dtype == want[k] && b->device.type == CT_DEV_CUDA, "%s: cpu %s, cuda %s (want %s)",
                   names[k], ct_dtype_name(a->dtype), ct_dtype_name(b->dtype), ct_dtype_name(want[k]));
        ct_tensor *ha = host_f32(c, a), *hb = host_f32(c, b);
        double e = normwise(hb->data, ha->data, ct_numel(ha));
        CT_EXPECTF(e <= 1e-2, "%s: normwise error %g against the CPU", names[k], e);
    }
    ct_ctx_free(c);
}

CT_TEST(mlp_bf16_autocast_on_cuda_matches_cpu) {
    NEED_GPU();
    ct_model *m[2] = {gpu_test_mlp(), gpu_test_mlp()};
    OK(ct_module_to(ct_model_module(m[1]), CT_CUDA(0)));
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    const int64_t B = 16;
    ct_tensor *x[2] = {rnd(c, 2, (int64_t[]){B, 32}, 1.0f)}, *y[2];
    int32_t lab[16];
    for (int i = 0; i < B; i++) lab[i] = (i * 7) % 10;
    y[0] = ct_from_data(c, CT_I32, lab, 1, &B);
    OK(ct_tensor_to(c, x[0], CT_CUDA(0), &x[1]));
    OK(ct_tensor_to(c, y[0], CT_CUDA(0), &y[1]));
    double l[2];
    for (int d = 0; d < 2; d++) {
        OK(ct_autocast_begin(c, CT_BF16));
        ct_tensor *logits = ct_model_forward(c, m[d], x[d]);
        ct_tensor *loss = ct_cross_entropy(c, logits, y[d], -100);
        ct_autocast_end(c);
        CT_EXPECTF(logits->dtype == CT_BF16 && loss->dtype == CT_F32, "logits %s, loss %s", ct_dtype_name(logits->dtype),
                   ct_dtype_name(loss->dtype));
        l[d] = ct_item(loss);
        ct_backward(c, loss);
    }
    CT_EXPECTF(ct_ctx_status(c) == CT_OK, "MLP under autocast on cuda:0: %s", ct_last_error());
    CT_EXPECTF(rel(l[1], l[0]) <= 1e-2, "loss cuda %.9g cpu %.9g", l[1], l[0]);
    double e = grad_err(ct_model_params(m[0]), ct_model_params(m[1]), -1);
    CT_EXPECTF(e <= 1e-2, "f32 master gradients: normwise error %g", e);
    printf("    MLP bf16 autocast on cuda:0: loss %.7f (cpu %.7f), gradient error %.2e\n", l[1], l[0], e);
    ct_ctx_free(c);
    for (int d = 0; d < 2; d++) ct_model_free(m[d]);
}

/* mul, tanh, sigmoid (kmath.h's functions), sum and mean of all elements (a GEMM with ones on
 * the device), forward and backward */
CT_TEST(elementwise_and_reductions_on_cuda_match_cpu) {
    NEED_GPU();
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    ct_tensor *x = rnd(c, 2, (int64_t[]){37, 29}, 1.0f), *xd;
    OK(ct_tensor_to(c, x, CT_CUDA(0), &xd));
    ct_requires_grad(x);
    ct_requires_grad(xd);
    double v[2];
    ct_tensor *t[2] = {x, xd}, *gh = NULL;
    for (int j = 0; j < 2; j++) {
        ct_tensor *m = ct_mul(c, ct_tanh(c, t[j]), ct_sigmoid(c, t[j]));
        ct_tensor *loss = ct_add(c, ct_mean(c, ct_mul(c, m, m)), ct_scale(c, ct_sum(c, t[j]), 0.25f));
        v[j] = ct_item(loss);
        ct_backward(c, loss);
    }
    CT_EXPECTF(ct_ctx_status(c) == CT_OK, "reductions on cuda:0: %s", ct_last_error());
    CT_EXPECTF(rel(v[1], v[0]) <= 1e-5, "mean((tanh x sigmoid)^2) + sum / 4: cuda %.9g cpu %.9g", v[1], v[0]);
    OK(ct_tensor_to(c, xd->grad, CT_CPU, &gh));
    CT_EXPECTF(normwise(gh->data, x->grad->data, ct_numel(x)) <= 1e-5, "gradient: %g",
               normwise(gh->data, x->grad->data, ct_numel(x)));
    ct_ctx_free(c);
}

/* dropout on the device: the CPU's mask (same seed, step and call: the same key), forward
 * and backward */
CT_TEST(dropout_on_cuda_matches_cpu) {
    NEED_GPU();
    ct_ctx *c[2];
    ct_tensor *y[2], *x[2], *gy = NULL, *gx = NULL;
    for (int j = 0; j < 2; j++) {
        ct_ctx_opts co = ct_ctx_default_opts();
        co.seed = 77;
        OK(ct_ctx_create(&co, &c[j]));
        ct_ctx_set_step(c[j], 5);
        x[j] = rnd(c[j], 2, (int64_t[]){33, 70}, 1.0f);
    }
    memcpy(x[1]->data, x[0]->data, ct_nbytes(x[0]));
    OK(ct_tensor_to(c[1], x[1], CT_CUDA(0), &x[1]));
    for (int j = 0; j < 2; j++) {
        ct_requires_grad(x[j]);
        y[j] = ct_dropout(c[j], x[j], 0.25f);
        ct_backward(c[j], ct_sum(c[j], ct_mul(c[j], y[j], y[j])));
    }
    CT_EXPECTF(ct_ctx_status(c[1]) == CT_OK, "dropout on cuda:0: %s", ct_last_error());
    OK(ct_tensor_to(c[1], y[1], CT_CPU, &gy));
    OK(ct_tensor_to(c[1], x[1]->grad, CT_CPU, &gx));
    CT_EXPECTF(normwise(gy->data, y[0]->data, ct_numel(y[0])) == 0, "dropout forward differs: %g",
               normwise(gy->data, y[0]->data, ct_numel(y[0])));
    CT_EXPECTF(normwise(gx->data, x[0]->grad->data, ct_numel(x[0])) <= 1e-6, "dropout backward: %g",
               normwise(gx->data, x[0]->grad->data, ct_numel(x[0])));
    for (int j = 0; j < 2; j++) ct_ctx_free(c[j]);
}

/* gradient clipping and the grad scaler's unscale on cuda:0: the same norm (kmath.h's chunks
 * in order) and the same clipped gradients as on the CPU, and the inf check */
CT_TEST(clipping_and_unscale_on_cuda_match_cpu) {
    NEED_GPU();
    ct_params *P[2];
    for (int j = 0; j < 2; j++) {
        if (ct_params_create(&P[j]) != CT_OK) abort();
        ct_param(P[j], "w", 2, (int64_t[]){1000, 333}, CT_INIT_KAIMING_UNIFORM, 333); /* 20 chunks and a tail */
        if (ct_params_finalize(P[j], 4) != CT_OK) abort();
    }
    OK(ct_params_to(P[1], CT_CUDA(0)));
    size_t n = ct_params_numel(P[0]);
    float *g = ct_params_grad(P[0]), *h = malloc(n * sizeof(float));
    if (!h) abort();
    for (size_t i = 0; i < n; i++) g[i] = (float)sin((double)i * 0.37) * 3.0f;
    CT_ASSERT(cudaMemcpy(ct_params_grad(P[1]), g, n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    float t0 = ct_clip_grad_norm(P[0], 1.0f), t1 = ct_clip_grad_norm(P[1], 1.0f);
    CT_EXPECTF(t0 == t1 && t0 > 1.0f, "norm cpu %.9g cuda %.9g (%s)", t0, t1, ct_last_error());
    grads_to_host(P[1], h);
    CT_EXPECT(!memcmp(g, h, n * sizeof(float)));
    ct_grad_scaler *s;
    OK(ct_grad_scaler_create(NULL, &s));
    CT_EXPECT(ct_grad_scaler_unscale_and_check(s, P[1]));
    float inf = INFINITY;
    CT_ASSERT(cudaMemcpy(ct_params_grad(P[1]) + n - 1, &inf, sizeof inf, cudaMemcpyHostToDevice) == cudaSuccess);
    CT_EXPECT(!ct_grad_scaler_unscale_and_check(s, P[1]));
    ct_grad_scaler_free(s);
    free(h);
    for (int j = 0; j < 2; j++) ct_params_free(P[j]);
}

CT_TEST(op_without_cuda_kernel_fails_the_step) {
    NEED_GPU();
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    ct_tensor *x = rnd(c, 4, (int64_t[]){1, 2, 8, 8}, 1.0f), *xd;
    OK(ct_tensor_to(c, x, CT_CUDA(0), &xd));
    /* every op has a CUDA entry now: max_pool2d's is taken out for the test, then restored */
    ct_op_dev_entry saved = ct_op_table_dev[CT_OP_MAX_POOL2D];
    ct_op_register_device(CT_DEV_CUDA, CT_OP_MAX_POOL2D, NULL, NULL);
    ct_tensor *y = ct_max_pool2d(c, xd, 2, 2, 0);
    ct_op_table_dev[CT_OP_MAX_POOL2D] = saved;
    CT_EXPECTF(ct_ctx_status(c) == CT_ERR_UNSUPPORTED && strstr(ct_last_error(), "max_pool2d on cuda:0"), "%s", ct_last_error());
    CT_EXPECT(y->data == NULL);
    ct_ctx_reset(c);
    CT_EXPECT(ct_ctx_status(c) == CT_OK);
    ct_ctx_free(c);
}

/* DDP at world size 1 on NCCL, f32 or with the gradients compressed to comm (bf16/f16: the
 * conversion kernels on the device around an all-reduce of that type), against the CPU's
 * gradients within tol */
static void ddp_world1(ct_dtype comm, double tol) {
    ct_pg *pg = NULL;
    OK(nccl_world1(&pg));
    ct_model *mc = gpu_test_mlp(), *mg = gpu_test_mlp();
    OK(ct_module_to(ct_model_module(mg), CT_CUDA(0)));
    ct_ddp_opts dopts = ct_ddp_default_opts();
    dopts.comm_dtype = comm;
    dopts.bucket_cap_bytes = 4096; /* several buckets: launched from the hooks during backward */
    dopts.first_bucket_bytes = 1024;
    ct_ddp *ddp;
    OK(ct_ddp_create(pg, ct_model_params(mg), &dopts, &ddp));
    CT_EXPECT(ct_ddp_num_buckets(ddp) > 1);
    ct_ctx *c;
    OK(ct_ctx_create(NULL, &c));
    const int64_t B = 8;
    ct_tensor *x = rnd(c, 2, (int64_t[]){B, 32}, 1.0f), *xd, *yd;
    int32_t lab[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ct_tensor *y = ct_from_data(c, CT_I32, lab, 1, &B);
    OK(ct_tensor_to(c, x, CT_CUDA(0), &xd));
    OK(ct_tensor_to(c, y, CT_CUDA(0), &yd));
    double lc = step(c, mc, x, y), lg = step(c, mg, xd, yd);
    OK(ct_ddp_finish(ddp));
    CT_EXPECTF(ct_ctx_status(c) == CT_OK && rel(lg, lc) <= 1e-5, "loss cuda %.9g cpu %.9g", lg, lc);
    double e = grad_err(ct_model_params(mc), ct_model_params(mg), -1);
    CT_EXPECTF(e <= tol, "gradients after the NCCL all-reduce (%s, world 1): normwise error %g", ct_dtype_name(comm), e);
    ct_ctx_free(c);
    ct_ddp_free(ddp);
    ct_model_free(mc);
    ct_model_free(mg);
    ct_pg_free(pg);
}
CT_TEST(ddp_world1_on_nccl_matches_cpu) {
    NEED_GPU();
    ddp_world1(CT_F32, 1e-5);
}
/* bf16 keeps 8 bits: each gradient within 2^-8 relative */
CT_TEST(ddp_world1_on_nccl_bf16_compression) {
    NEED_GPU();
    ddp_world1(CT_BF16, 4e-3);
    ddp_world1(CT_F16, 5e-4);
}

/* FULL_SHARD at world size 1 on NCCL: nothing is divided, but every unit is still released
 * after its forward and its backward, so the device's address ranges (src/cuda/vmm.c on a GPU;
 * pages behind PROT_NONE in the emulation) are unmapped and mapped again every step. A GPT of
 * four 256-wide blocks (3 MB each: whole 2 MiB granules inside each unit on a GPU), each block
 * a checkpointed segment (recomputed in backward), two AdamW steps with clipping, against the
 * same steps on the CPU; the mapped peak below the parameters and gradients whole. */
static ct_model *wide_gpt(void) { return gpu_test_gpt(4, 256, 4, 64, true); }
CT_TEST(fsdp_full_world1_on_nccl_matches_cpu) {
    NEED_GPU();
    ct_pg *pg = NULL;
    OK(nccl_world1(&pg));
    gpu_test_pair p = gpu_test_pair_make(wide_gpt);
    ct_fsdp *f = NULL;
    OK(ct_fsdp_create(pg, ct_model_params(p.m[1]), p.o[1], CT_SHARD_FULL, &f));
    ct_fsdp_set_prefetch(f, true);
    const int64_t B = 2, T = 16;
    int32_t tok[2 * 16], tgt[2 * 16];
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < B * T; i++) { tok[i] = (i * 13 + 3 + step) % 64; tgt[i] = (i * 5 + 2 + step) % 64; }
        ct_train_batch b = ct_train_batch_of(CT_I32, tok, 2, (int64_t[]){B, T}, tgt, 2, (int64_t[]){B, T});
        ct_step_result rc, rg;
        OK(gpu_test_pair_step(&p, f, 1e-3, 1.0, step, &b, &b, &rc, &rg));
        CT_EXPECTF(rel(rg.loss, rc.loss) <= 1e-5 && rel(rg.grad_norm, rc.grad_norm) <= 1e-4,
                   "step %d: loss %.9g (cpu %.9g), gradient norm %.7g (%.7g)", step, rg.loss, rc.loss, rg.grad_norm, rc.grad_norm);
    }
    ct_fsdp_mem mm = ct_fsdp_memory(f);
    ct_params *Pc = ct_model_params(p.m[0]), *Pg = ct_model_params(p.m[1]);
    const size_t np = ct_params_numel(Pc), whole = 2 * np * sizeof(float);
    printf("fsdp full, world 1: peak mapped %zu of %zu bytes (largest unit %zu, root %zu)\n", (size_t)mm.peak_resident_bytes, whole,
           (size_t)mm.largest_unit_bytes, (size_t)mm.root_bytes);
    CT_EXPECTF(mm.peak_resident_bytes > 0 && mm.peak_resident_bytes < whole, "peak mapped %zu of %zu bytes",
               (size_t)mm.peak_resident_bytes, whole);
    /* the device's memory figures count the mapped units: gathering every unit back maps what
     * the step had released, and the device's peak holds the step's mapped peak */
    ct_device_mem m0, m1;
    OK(ct_device_mem_get(CT_CUDA(0), &m0));
    OK(ct_fsdp_gather_all(f));
    OK(ct_device_mem_get(CT_CUDA(0), &m1));
    printf("fsdp full, world 1: device memory in use %zu -> %zu bytes gathering every unit, peak %zu\n", m0.current, m1.current,
           m1.peak);
    CT_EXPECTF(m1.current > m0.current && m1.current - m0.current <= whole / 2 && m1.peak >= mm.peak_resident_bytes,
               "device memory %zu -> %zu bytes (peak %zu) gathering every unit; the step's mapped peak %zu of %zu", m0.current,
               m1.current, m1.peak, (size_t)mm.peak_resident_bytes, whole);
    float *wg = malloc(np * sizeof(float));
    CT_ASSERT(cudaMemcpy(wg, ct_params_data(Pg), np * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    double num = 0, den = 0;
    for (size_t i = 0; i < np; i++) {
        double d = (double)wg[i] - ct_params_data(Pc)[i];
        num += d * d, den += (double)ct_params_data(Pc)[i] * ct_params_data(Pc)[i];
    }
    /* (AdamW's m / sqrt(v) magnifies the rounding differences of gradients near 0) */
    printf("fsdp full, world 1: weights after two steps against the CPU's: normwise error %.3g\n", sqrt(num / den));
    CT_EXPECTF(sqrt(num / (den > 0 ? den : 1)) <= 1e-4, "weights after two sharded steps: normwise error %g", sqrt(num / den));
    free(wg);
    ct_fsdp_free(f);
    gpu_test_pair_free(&p);
    ct_pg_free(pg);
}

CT_TEST_MAIN()
