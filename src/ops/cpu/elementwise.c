/* Elementwise ops: mul, scale, bias_add, gelu (exact and tanh), tanh, sigmoid, silu, dropout.
 * Every loop is a flat, branch-light pass over contiguous f32 so gcc vectorises it;
 * OpenMP splits the index range statically, so results never depend on thread count
 * (each element is computed independently). Backward reads the saved input or output
 * rather than storing extra buffers. */
#include <math.h>

#include "ops/op_table.h"
#include "ctrain/ops.h"
#include "ops/cpu/gelu_simd.h"
#include "ops/cpu/sgemm.h" /* ct_sgemm_own_available: the AVX-512 check */
#include "ops/cpu/vmath.h"

/* Threshold for cheap (one flop) and expensive (transcendental) elementwise loops. */
#define PAR_CHEAP (1 << 16)
#define PAR_EXP (1 << 13)

static void check_unary(const char *op, const ct_tensor *x) {
    CT_CHECK_F32(op, x);
    CT_CHECK_CONTIG(op, x);
}

/* ---- mul ---- */
ct_tensor *ct_mul(ct_ctx *ctx, ct_tensor *a, ct_tensor *b) {
    CT_DEV_DISPATCH(ctx, CT_OP_MUL, .in = {a, b});
    CT_AUTOCAST(ctx, CT_OP_MUL, 2, ((ct_tensor **[]){&a, &b}), ct_mul(ctx, a, b));
    check_unary("mul", a); check_unary("mul", b);
    CT_CHECK_SAME_SHAPE("mul", a, b);
    ct_tensor *y = ct_new_like(ctx, a);
    int64_t n = ct_numel(a);
    const float *A = a->data, *B = b->data;
    float *Y = y->data;
#pragma omp parallel for simd if (n >= PAR_CHEAP)
    for (int64_t i = 0; i < n; i++) Y[i] = A[i] * B[i];
    ct_record(ctx, CT_OP_MUL, y, 2, (ct_tensor *[]){a, b});
    return y;
}
void ct_bw_mul(ct_ctx *ctx, ct_node *n) {
    int64_t N = ct_numel(n->out);
    const float *g = n->out->grad->data, *A = n->in[0]->data, *B = n->in[1]->data;
    /* ga and gb may alias (mul(x, x)): two separate passes keep both contributions */
    float *ga = ct_grad_acc(ctx, n->in[0]);
    if (ga)
#pragma omp parallel for simd if (N >= PAR_CHEAP)
        for (int64_t i = 0; i < N; i++) ga[i] += g[i] * B[i];
    float *gb = ct_grad_acc(ctx, n->in[1]);
    if (gb)
#pragma omp parallel for simd if (N >= PAR_CHEAP)
        for (int64_t i = 0; i < N; i++) gb[i] += g[i] * A[i];
}

/* ---- scale ---- */
ct_tensor *ct_scale(ct_ctx *ctx, ct_tensor *a, float s) {
    CT_DEV_DISPATCH(ctx, CT_OP_SCALE, .in = {a}, .f = {s});
    CT_AUTOCAST(ctx, CT_OP_SCALE, 1, ((ct_tensor **[]){&a}), ct_scale(ctx, a, s));
    check_unary("scale", a);
    ct_tensor *y = ct_new_like(ctx, a);
    int64_t n = ct_numel(a);
    const float *A = a->data;
    float *Y = y->data;
#pragma omp parallel for simd if (n >= PAR_CHEAP)
    for (int64_t i = 0; i < n; i++) Y[i] = A[i] * s;
    ct_node *nd = ct_record(ctx, CT_OP_SCALE, y, 1, &a);
    if (nd) nd->f[0] = s;
    return y;
}
void ct_bw_scale(ct_ctx *ctx, ct_node *n) {
    float *ga = ct_grad_acc(ctx, n->in[0]);
    if (!ga) return;
    int64_t N = ct_numel(n->out);
    const float *g = n->out->grad->data;
    float s = (float)n->f[0];
#pragma omp parallel for simd if (N >= PAR_CHEAP)
    for (int64_t i = 0; i < N; i++) ga[i] += g[i] * s;
}

/* ---- bias_add: x [N, C, ...] + b[C] ---- */
ct_tensor *ct_bias_add(ct_ctx *ctx, ct_tensor *x, ct_tensor *b) {
    CT_DEV_DISPATCH(ctx, CT_OP_BIAS_ADD, .in = {x, b});
    CT_AUTOCAST(ctx, CT_OP_BIAS_ADD, 2, ((ct_tensor **[]){&x, &b}), ct_bias_add(ctx, x, b));
    int64_t N, C, inner;
    ct_check_bias_add(x, b, &N, &C, &inner);
    ct_tensor *y = ct_new_like(ctx, x);
    const float *X = x->data, *B = b->data;
    float *Y = y->data;
#pragma omp parallel for if (N * C * inner >= PAR_CHEAP)
    for (int64_t nc = 0; nc < N * C; nc++) {
        float bv = B[nc % C];
        const float *xs = X + nc * inner;
        float *ys = Y + nc * inner;
        for (int64_t j = 0; j < inner; j++) ys[j] = xs[j] + bv;
    }
    ct_node *nd = ct_record(ctx, CT_OP_BIAS_ADD, y, 2, (ct_tensor *[]){x, b});
    if (nd) { nd->i[0] = N; nd->i[1] = C; nd->i[2] = inner; }
    return y;
}
void ct_bw_bias_add(ct_ctx *ctx, ct_node *n) {
    int64_t N = n->i[0], C = n->i[1], inner = n->i[2];
    const float *g = n->out->grad->data;
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (gx) {
        int64_t T = N * C * inner;
#pragma omp parallel for simd if (T >= PAR_CHEAP)
        for (int64_t i = 0; i < T; i++) gx[i] += g[i];
    }
    float *gb = ct_grad_acc(ctx, n->in[1]);
    if (gb)
        /* one thread per channel, fixed order over (n, j): deterministic; double sum
         * keeps long reductions close to PyTorch's pairwise float sums */
#pragma omp parallel for if (N * C * inner >= PAR_CHEAP)
        for (int64_t c = 0; c < C; c++) {
            double s = 0;
            for (int64_t i = 0; i < N; i++) {
                const float *gs = g + (i * C + c) * inner;
                float part = 0;
#pragma omp simd reduction(+ : part)
                for (int64_t j = 0; j < inner; j++) part += gs[j];
                s += part;
            }
            gb[c] += (float)s;
        }
}

/* ---- gelu ---- */
/* The f32 math of both dtypes is these two functions, never inlined: the bf16 path runs the
 * same machine code on widened chunks, so even a NaN's sign (which operand order a compiler
 * picks decides) is the f32 op's. Per element, so any split gives the same bits. */
__attribute__((noinline)) static void gelu_span(const float *restrict X, float *restrict Y, int64_t n, bool tanh_approx) {
    if (tanh_approx) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) Y[i] = ct_k_gelu_tanh(X[i]);
    } else if (ct_sgemm_own_available()) {
        ct_gelu_simd(X, Y, n); /* the same bits, written out in AVX-512 */
    } else if (ct_gelu_avx2_available()) {
        ct_gelu_avx2(X, Y, n); /* and in AVX2 */
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) Y[i] = ct_k_gelu(X[i]);
    }
}
/* gx[i] += d/dx, or gx[i] = +0 + d/dx into a fresh (unzeroed) buffer: the bits of adding to
 * zeros without the zeroing pass */
#define GELU_BW(d)                                                                           \
    do {                                                                                     \
        if (fresh) {                                                                         \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) gx[i] = 0.0f + (d);          \
        } else {                                                                             \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) gx[i] += (d);                \
        }                                                                                    \
    } while (0)
__attribute__((noinline)) static void gelu_bwd_span(const float *restrict X, const float *restrict g, float *restrict gx, int64_t n,
                                                    bool tanh_approx, bool fresh) {
    /* kmath.h's derivatives: the same expressions (and bits) as the forward's constants */
    if (tanh_approx) GELU_BW(ct_k_gelu_tanh_bwd(X[i], g[i]));
    else if (ct_sgemm_own_available()) ct_gelu_bwd_simd(X, g, gx, n, fresh);
    else if (ct_gelu_avx2_available()) ct_gelu_bwd_avx2(X, g, gx, n, fresh);
    else GELU_BW(ct_k_gelu_bwd(X[i], g[i]));
}
#define GELU_CHUNK 1024 /* bf16 path: widened chunks on the stack (L1) */
#define GELU_F32_CHUNK 4096

/* bf16 x (autocast: GELU follows its input's dtype): read and written as bf16, the f32 op's
 * math between, each output rounded as ct_convert rounds — the bits of autocast's f32 copy
 * and conversion (autocast.c) without those passes over memory. The output goes where that
 * conversion would put it: the arena (no temporaries are open here). */
static ct_tensor *gelu_bf16(ct_ctx *ctx, ct_tensor *x, bool tanh_approx) {
    if (!ct_is_contiguous(x)) x = ct_contiguous(ctx, x);
    ct_tensor *y = ct_new_like(ctx, x);
    int64_t n = ct_numel(x);
    const uint16_t *X = x->data;
    uint16_t *Y = y->data;
#pragma omp parallel for if (n >= PAR_EXP)
    for (int64_t c = 0; c < n; c += GELU_CHUNK) {
        float xs[GELU_CHUNK], ys[GELU_CHUNK];
        int64_t m = n - c < GELU_CHUNK ? n - c : GELU_CHUNK;
        for (int64_t i = 0; i < m; i++) xs[i] = ct_k_bf16_to_f32(X[c + i]);
        gelu_span(xs, ys, m, tanh_approx);
        for (int64_t i = 0; i < m; i++) Y[c + i] = ct_k_f32_to_bf16(ys[i]);
    }
    ct_node *nd = ct_record(ctx, CT_OP_GELU, y, 1, &x);
    if (nd) {
        nd->i[0] = tanh_approx;
        nd->op = &ct_op_table_lp[CT_OP_GELU]; /* a low-precision node, as ct_ac_leave makes */
    }
    return y;
}

ct_tensor *ct_gelu(ct_ctx *ctx, ct_tensor *x, bool tanh_approx) {
    CT_DEV_DISPATCH(ctx, CT_OP_GELU, .in = {x}, .i = {tanh_approx});
    if (x->dtype == CT_BF16) return gelu_bf16(ctx, x, tanh_approx);
    CT_AUTOCAST(ctx, CT_OP_GELU, 1, ((ct_tensor **[]){&x}), ct_gelu(ctx, x, tanh_approx));
    check_unary("gelu", x);
    ct_tensor *y = ct_new_like(ctx, x);
    int64_t n = ct_numel(x);
    const float *X = x->data;
    float *Y = y->data;
#pragma omp parallel for if (n >= PAR_EXP)
    for (int64_t c = 0; c < n; c += GELU_F32_CHUNK)
        gelu_span(X + c, Y + c, n - c < GELU_F32_CHUNK ? n - c : GELU_F32_CHUNK, tanh_approx);
    ct_node *nd = ct_record(ctx, CT_OP_GELU, y, 1, &x);
    if (nd) nd->i[0] = tanh_approx;
    return y;
}
void ct_bw_gelu(ct_ctx *ctx, ct_node *n) {
    bool fresh;
    float *gx = ct_grad_acc_fresh(ctx, n->in[0], &fresh);
    if (!gx) return;
    int64_t N = ct_numel(n->out);
    const float *g = n->out->grad->data;
    bool th = n->i[0] != 0;
    if (n->in[0]->dtype == CT_BF16) {
        /* gelu_bf16's node (through ct_bw_lowp): bf16 x widened and the gradient rounded to
         * bf16 (ct_k_round_bf16: autocast's round_to) chunk by chunk, instead of ct_bw_lowp's
         * f32 copy and in-place rounding pass */
        const uint16_t *X = n->in[0]->data;
#pragma omp parallel for if (N >= PAR_EXP)
        for (int64_t c = 0; c < N; c += GELU_CHUNK) {
            float xs[GELU_CHUNK], gs[GELU_CHUNK];
            int64_t m = N - c < GELU_CHUNK ? N - c : GELU_CHUNK;
            for (int64_t i = 0; i < m; i++) {
                xs[i] = ct_k_bf16_to_f32(X[c + i]);
                gs[i] = ct_k_round_bf16(g[c + i]);
            }
            gelu_bwd_span(xs, gs, gx + c, m, th, fresh);
        }
        return;
    }
    const float *X = n->in[0]->data;
#pragma omp parallel for if (N >= PAR_EXP)
    for (int64_t c = 0; c < N; c += GELU_F32_CHUNK)
        gelu_bwd_span(X + c, g + c, gx + c, N - c < GELU_F32_CHUNK ? N - c : GELU_F32_CHUNK, th, fresh);
}

/* ---- tanh, sigmoid: backward from the saved output ---- */
ct_tensor *ct_tanh(ct_ctx *ctx, ct_tensor *x) {
    CT_DEV_DISPATCH(ctx, CT_OP_TANH, .in = {x});
    CT_AUTOCAST(ctx, CT_OP_TANH, 1, ((ct_tensor **[]){&x}), ct_tanh(ctx, x));
    check_unary("tanh", x);
    ct_tensor *y = ct_new_like(ctx, x);
    int64_t n = ct_numel(x);
    const float *X = x->data;
    float *Y = y->data;
#pragma omp parallel for simd if (n >= PAR_EXP)
    for (int64_t i = 0; i < n; i++) Y[i] = ct_k_tanh(X[i]);
    ct_record(ctx, CT_OP_TANH, y, 1, &x);
    return y;
}
void ct_bw_tanh(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    int64_t N = ct_numel(n->out);
    const float *g = n->out->grad->data, *Y = n->out->data;
#pragma omp parallel for simd if (N >= PAR_CHEAP)
    for (int64_t i = 0; i < N; i++) gx[i] += ct_k_tanh_bwd(Y[i], g[i]);
}

ct_tensor *ct_sigmoid(ct_ctx *ctx, ct_tensor *x) {
    CT_DEV_DISPATCH(ctx, CT_OP_SIGMOID, .in = {x});
    CT_AUTOCAST(ctx, CT_OP_SIGMOID, 1, ((ct_tensor **[]){&x}), ct_sigmoid(ctx, x));
    check_unary("sigmoid", x);
    ct_tensor *y = ct_new_like(ctx, x);
    int64_t n = ct_numel(x);
    const float *X = x->data;
    float *Y = y->data;
#pragma omp parallel for simd if (n >= PAR_EXP)
    for (int64_t i = 0; i < n; i++) Y[i] = ct_k_sigmoid(X[i]);
    ct_record(ctx, CT_OP_SIGMOID, y, 1, &x);
    return y;
}
void ct_bw_sigmoid(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    int64_t N = ct_numel(n->out);
    const float *g = n->out->grad->data, *Y = n->out->data;
#pragma omp parallel for simd if (N >= PAR_CHEAP)
    for (int64_t i = 0; i < N; i++) gx[i] += ct_k_sigmoid_bwd(Y[i], g[i]);
}

/* ---- silu: x * sigmoid(x); backward from the saved input ----
 * Without AVX-512 (where gcc's 16-lane vectorisation of these loops is fine) the same
 * operations are written out on 8 lanes: gcc's 8-lane version of them took 9% of a Llama
 * step on an AMD Zen 3. Per element, so any split gives the same bits. */
#define SILU_CHUNK 4096
static bool silu_avx2(void) { return !ct_sgemm_own_available() && ct_gelu_avx2_available(); }

ct_tensor *ct_silu(ct_ctx *ctx, ct_tensor *x) {
    CT_DEV_DISPATCH(ctx, CT_OP_SILU, .in = {x});
    CT_AUTOCAST(ctx, CT_OP_SILU, 1, ((ct_tensor **[]){&x}), ct_silu(ctx, x));
    check_unary("silu", x);
    ct_tensor *y = ct_new_like(ctx, x);
    int64_t n = ct_numel(x);
    const float *X = x->data;
    float *Y = y->data;
    if (silu_avx2()) {
#pragma omp parallel for if (n >= PAR_EXP)
        for (int64_t i = 0; i < n; i += SILU_CHUNK) ct_silu_avx2(X + i, Y + i, n - i < SILU_CHUNK ? n - i : SILU_CHUNK);
    } else {
#pragma omp parallel for simd if (n >= PAR_EXP)
        for (int64_t i = 0; i < n; i++) Y[i] = X[i] * ct_k_sigmoid(X[i]);
    }
    ct_record(ctx, CT_OP_SILU, y, 1, &x);
    return y;
}
void ct_bw_silu(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    int64_t N = ct_numel(n->out);
    const float *g = n->out->grad->data, *X = n->in[0]->data;
    /* d/dx x s(x) = s (1 + x (1 - s)) */
    if (silu_avx2()) {
#pragma omp parallel for if (N >= PAR_EXP)
        for (int64_t i = 0; i < N; i += SILU_CHUNK) ct_silu_bwd_avx2(X + i, g + i, gx + i, N - i < SILU_CHUNK ? N - i : SILU_CHUNK);
        return;
    }
#pragma omp parallel for simd if (N >= PAR_EXP)
    for (int64_t i = 0; i < N; i++) {
        float s = ct_k_sigmoid(X[i]);
        gx[i] += g[i] * (s * (1.0f + X[i] * (1.0f - s)));
    }
}

/* ---- dropout ----
 * Element i is kept when u(key, i) >= p, u uniform in [0,1) with 24 bits. The key comes
 * from (seed, step, call number in the step), so the mask is a pure function of the
 * element index; backward regenerates it from the saved key instead of storing it. */

ct_tensor *ct_dropout(ct_ctx *ctx, ct_tensor *x, float p) {
    CT_CHECK(p >= 0.0f && p <= 1.0f, "dropout: probability %g outside [0, 1]", (double)p);
    if (!ct_ctx_training(ctx) || p == 0.0f) return x; /* any dtype and device: nothing to compute */
    CT_DEV_DISPATCH(ctx, CT_OP_DROPOUT, .in = {x}, .f = {p});
    CT_AUTOCAST(ctx, CT_OP_DROPOUT, 1, ((ct_tensor **[]){&x}), ct_dropout(ctx, x, p));
    check_unary("dropout", x);
    uint64_t key = ct_ctx_dropout_key(ctx);
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; /* p == 1: everything dropped, as PyTorch */
    ct_tensor *y = ct_new_like(ctx, x);
    int64_t n = ct_numel(x);
    const float *X = x->data;
    float *Y = y->data;
#pragma omp parallel for simd if (n >= PAR_EXP)
    for (int64_t i = 0; i < n; i++) Y[i] = X[i] * ct_k_dropout(key, i, p, scale);
    ct_node *nd = ct_record(ctx, CT_OP_DROPOUT, y, 1, &x);
    if (nd) { nd->i[0] = (int64_t)key; nd->f[0] = p; nd->f[1] = scale; }
    return y;
}
void ct_bw_dropout(ct_ctx *ctx, ct_node *n) {
    float *gx = ct_grad_acc(ctx, n->in[0]);
    if (!gx) return;
    int64_t N = ct_numel(n->out);
    const float *g = n->out->grad->data;
    uint64_t key = (uint64_t)n->i[0];
    float p = (float)n->f[0], scale = (float)n->f[1];
#pragma omp parallel for simd if (N >= PAR_EXP)
    for (int64_t i = 0; i < N; i++) gx[i] += g[i] * ct_k_dropout(key, i, p, scale);
}
