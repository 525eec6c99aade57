/* Modules and models against PyTorch (fixtures from tests/torch/gen_models.py):
 *  - each module: weights loaded from a PyTorch-written state_dict, forward output, input
 *    gradient and every parameter gradient of sum(R * module(x));
 *  - MLP, CNN, GPT: output, loss and every parameter gradient; then 20 plain-SGD steps on
 *    fixed batches, the loss of every step within 1e-4 relative of PyTorch's;
 *  - a model saved by ctrain loads in PyTorch with load_state_dict(strict=True) and gives
 *    the same forward (skipped when /usr/bin/python3 with torch is not there).
 * Error measures: see cmp() below (normwise 1e-5 vs PyTorch, and vs a float64 answer). */
#include <unistd.h>

#include "ct_test.h"
#include "ctrain/io.h"
#include "ctrain/models.h"
#include "model_fixture.h"

#define FIX "tests/fixtures/models/"
#define TOL 1e-5

static double worst_all, worst_exact;
static char worst_all_what[160];
static int worst_reported;
/* at exit, after whichever tests ran: the largest errors seen, for the log */
static void report_worst(void) {
    printf("  worst normwise error vs PyTorch: %.2e (%s); worst elementwise vs float64: %.2e\n", worst_all, worst_all_what, worst_exact);
}

static ct_st_file *open_fix(const char *name, const char *kind) {
    char p[256];
    snprintf(p, sizeof p, FIX "%s.%s.safetensors", name, kind);
    ct_st_file *f = NULL;
    if (ct_st_open(p, &f) != CT_OK) {
        fprintf(stderr, "  cannot open %s: %s\n", p, ct_last_error());
        return NULL;
    }
    return f;
}

/* a fixture tensor as an arena tensor (converted from its file dtype when `to` differs) */
static ct_tensor *fix_tensor(ct_ctx *ctx, ct_st_file *f, const char *name) {
    ct_st_tensor t;
    CT_CHECK(ct_st_get(f, name, &t) == CT_OK, "fixture %s lacks '%s': %s", ct_st_path(f), name, ct_last_error());
    return ct_from_data(ctx, t.dtype, t.data, t.ndim, t.shape);
}

/* fixture tensor `name` as f32 data with n elements, or NULL */
static const float *fix_f32(ct_st_file *f, const char *name, int64_t n) {
    ct_st_tensor t;
    if (ct_st_get(f, name, &t) != CT_OK || t.dtype != CT_F32) return NULL;
    int64_t m = 1;
    for (int d = 0; d < t.ndim; d++) m *= t.shape[d];
    return m == n ? t.data : NULL;
}

static double norm_err(const float *a, const float *b, int64_t n) { /* max|a-b| / max|b| */
    double d = 0, mx = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        d = (e > d || e != e) ? e : d;
        mx = fmax(mx, fabs(b[i]));
    }
    return d / mx;
}
static double elem_err(const float *a, const float *b, int64_t n) { /* |a-b| / max(|b|, 1e-3 max|b|) */
    double mx = 1e-30;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(b[i]));
    return ct_max_rel_err(a, b, (long)n, 1e-3 * mx);
}

typedef struct { double norm, elem, exact, torch_exact; } errs;

/* Compare ctrain's tensor with PyTorch's `name` (and the float64 "exact.<name>"):
 *  - normwise vs PyTorch f32: max|ours - torch| / max|torch| <= 1e-5;
 *  - elementwise vs the exact answer: no worse than 4x PyTorch's own f32 error or 5e-5
 *    (elementwise vs PyTorch alone is no fair test: where terms cancel, two f32 summation
 *    orders differ by more than 1e-5 relative, PyTorch's own error included). */
static void cmp(ct_st_file *f, const char *name, const ct_tensor *got, const char *label, errs *w) {
    int64_t n = got ? ct_numel(got) : 0;
    const float *ref = fix_f32(f, name, n);
    char ex[CT_NN_NAME_MAX + 16];
    snprintf(ex, sizeof ex, "exact.%s", name);
    const float *exact = fix_f32(f, ex, n);
    if (!got || !ref || !exact) {
        CT_FAILF("%s: %s: missing, or %lld elements in ctrain and not in the fixture", label, name, (long long)n);
        return;
    }
    const float *a = ct_f32(got);
    double e = norm_err(a, ref, n), el = elem_err(a, ref, n), ee = elem_err(a, exact, n), te = elem_err(ref, exact, n);
    if (getenv("CT_VERBOSE"))
        fprintf(stderr, "  %-12s %-40s vs torch %.2e (elementwise %.2e)  vs exact %.2e (torch %.2e)\n", label, name, e, el, ee, te);
    CT_EXPECTF(e <= TOL, "%s: %s differs from PyTorch: normwise relative error %.3g > %g", label, name, e, TOL);
    CT_EXPECTF(ee <= fmax(4 * te, 5e-5), "%s: %s less accurate than PyTorch: elementwise error vs float64 %.3g, PyTorch's %.3g",
               label, name, ee, te);
    w->norm = fmax(w->norm, e);
    w->elem = fmax(w->elem, el);
    w->exact = fmax(w->exact, ee);
    w->torch_exact = fmax(w->torch_exact, te);
    if (!worst_reported++) atexit(report_worst);
    if (e > worst_all) { worst_all = e; snprintf(worst_all_what, sizeof worst_all_what, "%s %s", label, name); }
    if (ee > worst_exact) worst_exact = ee;
}

static void print_errs(const errs *w) {
    printf("vs PyTorch %.1e (elementwise %.1e), vs float64 %.1e (PyTorch's %.1e)", w->norm, w->elem, w->exact, w->torch_exact);
}

/* ---------------------------------------------------------------- modules */
typedef ct_module *(*make_fn)(ct_params *P);
static ct_module *mk_linear(ct_params *P) { return ct_nn_linear(P, "", 7, 5, true); }
static ct_module *mk_linear_nb(ct_params *P) { return ct_nn_linear(P, "", 6, 4, false); }
static ct_module *mk_conv(ct_params *P) { return ct_nn_conv2d(P, "", 3, 4, 3, 1, 1, true); }
static ct_module *mk_conv_s2(ct_params *P) { return ct_nn_conv2d(P, "", 2, 3, 5, 2, 2, true); }
static ct_module *mk_pool(ct_params *P) { (void)P; return ct_nn_max_pool2d(2, 0, 0); }
static ct_module *mk_pool3(ct_params *P) { (void)P; return ct_nn_max_pool2d(3, 2, 1); }
static ct_module *mk_emb(ct_params *P) { return ct_nn_embedding(P, "", 11, 6); }
static ct_module *mk_ln(ct_params *P) { return ct_nn_layer_norm(P, "", 9, 1e-5f, true); }
static ct_module *mk_drop(ct_params *P) { (void)P; return ct_nn_dropout(0.0f); }
static ct_module *mk_relu(ct_params *P) { (void)P; return ct_nn_relu(); }
static ct_module *mk_gelu(ct_params *P) { (void)P; return ct_nn_gelu(false); }
static ct_module *mk_gelu_t(ct_params *P) { (void)P; return ct_nn_gelu(true); }
static ct_module *mk_tanh(ct_params *P) { (void)P; return ct_nn_tanh(); }
static ct_module *mk_sigm(ct_params *P) { (void)P; return ct_nn_sigmoid(); }
static ct_module *mk_flat(ct_params *P) { (void)P; return ct_nn_flatten(1); }
static ct_module *mk_seq(ct_params *P) {
    ct_module *s = ct_nn_sequential("");
    ct_seq_add(s, ct_nn_conv2d(P, ct_seq_next_name(s), 2, 3, 3, 1, 1, true));
    ct_seq_add(s, ct_nn_relu());
    ct_seq_add(s, ct_nn_max_pool2d(2, 0, 0));
    ct_seq_add(s, ct_nn_flatten(1));
    ct_seq_add(s, ct_nn_linear(P, ct_seq_next_name(s), 48, 5, true));
    ct_seq_add(s, ct_nn_tanh());
    ct_seq_add(s, ct_nn_dropout(0.0f));
    ct_seq_add(s, ct_nn_linear(P, ct_seq_next_name(s), 5, 3, true));
    ct_seq_add(s, ct_nn_gelu(false));
    return s;
}
static ct_module *mk_attn(ct_params *P) { return ct_nn_causal_self_attention(P, "", 16, 4, true, 0.0f, 0.02, 0.02); }

static void module_case(const char *name, make_fn mk) {
    ct_params *P; CT_EXPECT_OK(ct_params_create(&P));
    ct_module *m = mk(P);
    CT_EXPECT_OK(ct_params_finalize(P, 99));
    if (ct_params_count(P) > 0) {
        char wp[256];
        snprintf(wp, sizeof wp, FIX "%s.weights.safetensors", name);
        CT_EXPECT_OK(ct_params_load(P, wp)); /* strict: the names are PyTorch's */
    }
    ct_st_file *f = open_fix(name, "ref");
    if (!f) { CT_FAILF("no fixture for %s", name); ct_module_free(m); ct_params_free(P); return; }
    ct_ctx *ctx; CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));
    ct_tensor *x = fix_tensor(ctx, f, "input");
    bool fx = x->dtype == CT_F32;
    if (fx) ct_requires_grad(x);
    ct_tensor *y = ct_module_forward(ctx, m, x);
    errs w = {0};
    cmp(f, "output", y, name, &w);
    ct_tensor *R = fix_tensor(ctx, f, "grad_out");
    ct_backward_seed(ctx, y, R);
    if (fx) cmp(f, "grad.input", x->grad, name, &w);
    for (int i = 0; i < ct_params_count(P); i++) {
        ct_tensor *p = ct_params_get(P, i);
        char g[CT_NN_NAME_MAX + 8];
        snprintf(g, sizeof g, "grad.%s", p->name);
        cmp(f, g, p->grad, name, &w);
    }
    printf("  %-17s output + %d grad%s: ", name, ct_params_count(P) + fx, ct_params_count(P) + fx == 1 ? " " : "s");
    print_errs(&w);
    printf("\n");
    ct_ctx_free(ctx);
    ct_st_close(f);
    ct_module_free(m);
    ct_params_free(P);
}

CT_TEST(linear) { module_case("linear", mk_linear); module_case("linear_nobias", mk_linear_nb); }
CT_TEST(conv2d) { module_case("conv2d", mk_conv); module_case("conv2d_s2", mk_conv_s2); }
CT_TEST(max_pool2d) { module_case("maxpool2d", mk_pool); module_case("maxpool2d_k3s2p1", mk_pool3); }
CT_TEST(embedding) { module_case("embedding", mk_emb); }
CT_TEST(layer_norm) { module_case("layernorm", mk_ln); }
CT_TEST(dropout_p0) { module_case("dropout", mk_drop); }
CT_TEST(activations) {
    module_case("relu", mk_relu);
    module_case("gelu", mk_gelu);
    module_case("gelu_tanh", mk_gelu_t);
    module_case("tanh", mk_tanh);
    module_case("sigmoid", mk_sigm);
}
CT_TEST(flatten) { module_case("flatten", mk_flat); }
CT_TEST(sequential) { module_case("sequential", mk_seq); }
CT_TEST(causal_self_attention) { module_case("attention", mk_attn); }

/* ---------------------------------------------------------------- models */

/* batch s of a [S, ...] fixture tensor, as an arena tensor */
static ct_tensor *batch_of(ct_ctx *ctx, ct_st_file *f, const char *name, int s) {
    ct_st_tensor t;
    CT_CHECK(ct_st_get(f, name, &t) == CT_OK, "fixture lacks %s", name);
    size_t per = t.nbytes / (size_t)t.shape[0];
    return ct_from_data(ctx, t.dtype, (const char *)t.data + per * (size_t)(s % t.shape[0]), t.ndim - 1, t.shape + 1);
}

static void model_case(ct_model_kind kind) {
    char name[32];
    snprintf(name, sizeof name, "model_%s", ct_model_kind_name(kind));
    ct_st_file *f = open_fix(name, "ref");
    if (!f) { CT_FAILF("no fixture for %s", name); return; }
    ct_model_config cfg = config_from_fixture(kind, f);
    ct_model *m; CT_EXPECT_OK(ct_model_create(&cfg, 7, &m));
    CT_ASSERT(m);
    char wp[256];
    snprintf(wp, sizeof wp, FIX "%s.weights.safetensors", name);
    CT_EXPECT_OK(ct_model_load(m, wp)); /* GPT: the file has PyTorch's tied lm_head.weight too */
    ct_params *P = ct_model_params(m);
    ct_ctx *ctx; CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));

    /* forward, loss, gradients */
    ct_tensor *x = fix_tensor(ctx, f, "input"), *y = fix_tensor(ctx, f, "target");
    ct_tensor *out = ct_model_forward(ctx, m, x);
    errs w = {0};
    cmp(f, "output", out, name, &w);
    ct_tensor *loss = ct_model_loss(ctx, m, x, y);
    cmp(f, "loss", loss, name, &w);
    ct_backward(ctx, loss);
    for (int i = 0; i < ct_params_count(P); i++) {
        ct_tensor *p = ct_params_get(P, i);
        char g[CT_NN_NAME_MAX + 8];
        snprintf(g, sizeof g, "grad.%s", p->name);
        cmp(f, g, p->grad, name, &w);
    }
    ct_params_zero_grad(P);
    ct_ctx_reset(ctx);

    /* 20 SGD steps */
    ct_st_tensor tl, tlr;
    CT_ASSERT(ct_st_get(f, "train.loss", &tl) == CT_OK && tl.dtype == CT_F64);
    CT_ASSERT(ct_st_get(f, "train.lr", &tlr) == CT_OK);
    const double *want = tl.data;
    float lr = *(const float *)tlr.data;
    float *pd = ct_params_data(P), *gd = ct_params_grad(P);
    size_t n = ct_params_numel(P);
    double tw = 0;
    int steps = (int)tl.shape[0];
    for (int s = 0; s < steps; s++) {
        ct_tensor *bx = batch_of(ctx, f, "train.x", s), *by = batch_of(ctx, f, "train.y", s);
        ct_tensor *l = ct_model_loss(ctx, m, bx, by);
        double got = ct_item(l), e = fabs(got - want[s]) / fabs(want[s]);
        CT_EXPECTF(e <= 1e-4, "%s step %d: loss %.7f, PyTorch %.7f (rel err %.2e)", name, s, got, want[s], e);
        if (e > tw) tw = e;
        ct_backward(ctx, l);
        for (size_t i = 0; i < n; i++) pd[i] -= lr * gd[i];
        ct_params_zero_grad(P);
        ct_ctx_reset(ctx);
    }
    printf("  %-10s output, loss, %d grads: ", name, ct_params_count(P));
    print_errs(&w);
    printf("\n  %-10s %d SGD steps: loss %.4f -> %.4f, max rel err %.2e\n", name, steps, want[0], want[steps - 1], tw);
    ct_ctx_free(ctx);
    ct_st_close(f);
    ct_model_free(m);
}

CT_TEST(mlp_forward_backward_and_20_sgd_steps) { model_case(CT_MODEL_MLP); }
CT_TEST(cnn_forward_backward_and_20_sgd_steps) { model_case(CT_MODEL_CNN); }
CT_TEST(gpt_forward_backward_and_20_sgd_steps) { model_case(CT_MODEL_GPT); }

/* ---------------------------------------------------------------- ctrain → PyTorch */
/* Each built-in model with ctrain's own initial weights, saved by ct_model_save (what `ctrain
 * train` writes as model.safetensors), loads into tests/torch/gen_models.py's definition with
 * load_state_dict(strict=True), and PyTorch's logits on the fixture's batch match the logits
 * computed here (max relative error 1e-5 per logit vector). */
CT_TEST(saved_models_load_in_pytorch) {
    if (access("/usr/bin/python3", X_OK) != 0 || system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
        CT_SKIP("no /usr/bin/python3 with torch (bash scripts/setup-interop.sh installs python3-torch)");
    char dir[] = "/tmp/ct_nn_torch_XXXXXX";
    CT_ASSERT(mkdtemp(dir));
    for (int k = CT_MODEL_MLP; k <= CT_MODEL_GPT; k++) {
        char name[32], wp[96], rp[96], cmd[512];
        snprintf(name, sizeof name, "model_%s", ct_model_kind_name((ct_model_kind)k));
        ct_st_file *f = open_fix(name, "ref");
        CT_ASSERT(f);
        ct_model_config cfg = config_from_fixture((ct_model_kind)k, f);
        ct_model *m; CT_EXPECT_OK(ct_model_create(&cfg, 1000 + (uint64_t)k, &m)); /* ctrain's own initialisation */
        CT_ASSERT(m);
        snprintf(wp, sizeof wp, "%s/w.safetensors", dir);
        snprintf(rp, sizeof rp, "%s/r.safetensors", dir);
        CT_EXPECT_OK(ct_model_save(m, wp));
        ct_ctx *ctx; CT_EXPECT_OK(ct_ctx_create(NULL, &ctx));
        ct_set_grad_enabled(ctx, false);
        ct_tensor *x = fix_tensor(ctx, f, "input");
        ct_tensor *y = ct_model_forward(ctx, m, x);
        ct_st_tensor cfgt;
        CT_ASSERT(ct_st_get(f, "config", &cfgt) == CT_OK);
        ct_st_writer *w; CT_EXPECT_OK(ct_st_writer_create(&w));
        ct_st_writer_add(w, "config", CT_I64, cfgt.ndim, cfgt.shape, cfgt.data);
        ct_st_writer_add(w, "input", x->dtype, x->ndim, x->shape, x->data);
        ct_st_writer_add(w, "output", CT_F32, y->ndim, y->shape, y->data);
        CT_EXPECT_OK(ct_st_writer_save(w, rp));
        ct_st_writer_free(w);
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/torch/gen_models.py --check-load %s %s %s 2>&1",
                 ct_model_kind_name((ct_model_kind)k), wp, rp);
        fflush(stdout);
        int rc = system(cmd);
        CT_EXPECTF(rc == 0, "%s: PyTorch could not load ctrain's state_dict or its forward differs (exit %d)", name, rc);
        ct_ctx_free(ctx);
        ct_model_free(m);
        ct_st_close(f);
        unlink(wp);
        unlink(rp);
    }
    rmdir(dir);
}

CT_TEST_MAIN()
