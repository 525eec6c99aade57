/* Optimizers, schedules, clipping and the grad scaler against PyTorch references
 * (tests/fixtures/optim/optim.safetensors, made by tests/torch/gen_optim.py), plus
 * checkpoint resume, thread-count independence and bad state files. */
#include "ct_test.h"
#include "ctrain/optim.h"
#include "ctrain/train.h"

#include <float.h>
#include <omp.h>
#include <unistd.h>

#define FIXTURE "tests/fixtures/optim/optim.safetensors"
#define STEPS 10
#define NP 3
static const char *PNAMES[NP] = {"fc.weight", "fc.bias", "conv.weight"};
static const int PNDIM[NP] = {2, 1, 3};
static const int64_t PSHAPE[NP][3] = {{7, 5}, {7}, {3, 2, 5}};

static ct_st_file *fx(void) {
    static ct_st_file *f;
    if (!f && ct_st_open(FIXTURE, &f) != CT_OK) {
        fprintf(stderr, "  cannot open %s: %s\n", FIXTURE, ct_last_error());
        return NULL;
    }
    return f;
}

/* Copy fixture tensor `name` (any float dtype given, F32 or F64 expected) into dst. */
static size_t fx_read(const char *name, void *dst, size_t cap_bytes) {
    ct_st_tensor t;
    if (ct_st_get(fx(), name, &t) != CT_OK) {
        fprintf(stderr, "  fixture tensor %s missing\n", name);
        abort();
    }
    CT_CHECK(t.nbytes <= cap_bytes, "fixture %s too big", name);
    memcpy(dst, t.data, t.nbytes);
    return t.nbytes;
}

static double fx_f64(const char *name) {
    double v;
    fx_read(name, &v, sizeof v);
    return v;
}

static ct_params *make_params(void) {
    ct_params *P; CT_EXPECT_OK(ct_params_create(&P));
    for (int i = 0; i < NP; i++) ct_param(P, PNAMES[i], PNDIM[i], PSHAPE[i], CT_INIT_ZEROS, 0);
    if (ct_params_finalize(P, 1) != CT_OK) abort();
    char nm[128];
    for (int i = 0; i < NP; i++) {
        snprintf(nm, sizeof nm, "init.%s", PNAMES[i]);
        fx_read(nm, ct_params_data(P) + ct_params_offset(P, i), 4096);
    }
    return P;
}

static long pnumel(int i) {
    long n = 1;
    for (int d = 0; d < PNDIM[i]; d++) n *= PSHAPE[i][d];
    return n;
}

/* Gradient of step s into the flat gradient buffer. */
static void set_grads(ct_params *P, int s) {
    static float buf[STEPS * 64];
    char nm[128];
    for (int i = 0; i < NP; i++) {
        snprintf(nm, sizeof nm, "grad.%s", PNAMES[i]);
        fx_read(nm, buf, sizeof buf);
        memcpy(ct_params_grad(P) + ct_params_offset(P, i), buf + s * pnumel(i), (size_t)pnumel(i) * sizeof(float));
    }
}

static ct_optim *make_opt(const char *cfg, ct_params *P) {
    char nm[128];
    double hp[11];
    snprintf(nm, sizeof nm, "%s.hp", cfg);
    fx_read(nm, hp, sizeof hp);
    if (hp[0] == 0) {
        ct_sgd_opts o = ct_sgd_default_opts();
        o.momentum = hp[1];
        o.dampening = hp[2];
        o.nesterov = hp[3] != 0;
        o.weight_decay = hp[4];
        o.decay_only_ndim_ge2 = hp[9] != 0;
        o.maximize = hp[10] != 0;
        ct_optim *r;
        CT_EXPECT_OK(ct_optim_create_sgd(P, &o, &r));
        return r;
    }
    ct_adamw_opts o = ct_adamw_default_opts();
    o.weight_decay = hp[4];
    o.beta1 = hp[5];
    o.beta2 = hp[6];
    o.eps = hp[7];
    o.amsgrad = hp[8] != 0;
    o.decay_only_ndim_ge2 = hp[9] != 0;
    o.maximize = hp[10] != 0;
    ct_optim *r;
    CT_EXPECT_OK(ct_optim_create_adamw(P, &o, &r));
    return r;
}

/* Run cfg's 10 steps from the fixture's weights and compare each step with PyTorch.
 * Error measure: |a - b| / max(1, |b|) (absolute for small values, relative for large). */
static double run_cfg(const char *cfg, int *exact_out) {
    ct_params *P = make_params();
    ct_optim *o = make_opt(cfg, P);
    CT_CHECK(o, "%s: %s", cfg, ct_last_error());
    char nm[160];
    double lr[STEPS];
    snprintf(nm, sizeof nm, "%s.lr", cfg);
    fx_read(nm, lr, sizeof lr);
    double worst = 0;
    int exact = 1;
    static float want[STEPS * 64];
    for (int s = 0; s < STEPS; s++) {
        set_grads(P, s);
        ct_optim_step(o, lr[s]);
        for (int i = 0; i < NP; i++) {
            snprintf(nm, sizeof nm, "%s.%s", cfg, PNAMES[i]);
            fx_read(nm, want, sizeof want);
            const float *got = ct_params_data(P) + ct_params_offset(P, i);
            const float *w = want + s * pnumel(i);
            double e = ct_max_rel_err(got, w, pnumel(i), 1.0);
            if (e > worst) worst = e;
            if (memcmp(got, w, (size_t)pnumel(i) * sizeof(float))) exact = 0;
        }
    }
    /* the padding of the flat buffer stays zero */
    const float *bias = ct_params_data(P) + ct_params_offset(P, 1);
    for (int j = 7; j < 16; j++) CT_EXPECT(bias[j] == 0.0f);
    CT_EXPECT_EQ(ct_optim_steps(o), STEPS);
    ct_optim_free(o);
    ct_params_free(P);
    *exact_out = exact;
    return worst;
}

static const char *CFGS[] = {"sgd_plain", "sgd_momentum", "sgd_nesterov", "sgd_wd", "sgd_dampening",
                             "sgd_plain_wd_max", "adamw_default", "adamw_wd", "adamw_amsgrad",
                             "adamw_nodecay1d", "adamw_sched"};

CT_TEST(optim_matches_pytorch) {
    CT_ASSERT(fx());
    for (size_t c = 0; c < sizeof CFGS / sizeof *CFGS; c++) {
        int exact;
        double e = run_cfg(CFGS[c], &exact);
        printf("  %-18s 10 steps: worst error %.3g%s\n", CFGS[c], e, exact ? " (bit-identical)" : "");
        if (!(e <= 1e-6)) CT_FAILF("%s: error %.3g > 1e-6", CFGS[c], e);
    }
}

/* ct_optim_set_weight_decay per parameter == decay_only_ndim_ge2 == PyTorch's two groups. */
/* STEPS steps of both optimizers on the same gradients: the same parameters after */
static bool same_steps(ct_params *A, ct_optim *oa, ct_params *B, ct_optim *ob) {
    for (int s = 0; s < STEPS; s++) {
        set_grads(A, s);
        set_grads(B, s);
        ct_optim_step(oa, 1e-2);
        ct_optim_step(ob, 1e-2);
    }
    return !memcmp(ct_params_data(A), ct_params_data(B), ct_params_numel(A) * sizeof(float));
}

CT_TEST(optim_per_param_weight_decay) {
    CT_ASSERT(fx());
    ct_params *A = make_params(), *B = make_params();
    ct_adamw_opts o = ct_adamw_default_opts();
    o.weight_decay = 0.1;
    o.decay_only_ndim_ge2 = true;
    ct_optim *oa; CT_EXPECT_OK(ct_optim_create_adamw(A, &o, &oa));
    o.decay_only_ndim_ge2 = false;
    ct_optim *ob; CT_EXPECT_OK(ct_optim_create_adamw(B, &o, &ob));
    CT_EXPECT(ct_optim_weight_decay(oa, 1) == 0.0 && ct_optim_weight_decay(oa, 0) == 0.1);
    ct_optim_set_weight_decay(ob, 1, 0.0);
    CT_EXPECT(same_steps(A, oa, B, ob));
    ct_optim_free(oa);
    ct_optim_free(ob);
    ct_params_free(A);
    ct_params_free(B);
}

/* A template (no state) copied with ct_optim_create_like over another store with the same
 * layout steps it as the original optimizer steps its own: FSDP's shards rely on it. */
CT_TEST(optim_template_and_like) {
    CT_ASSERT(fx());
    ct_params *A = make_params(), *B = make_params(), *T = make_params();
    ct_adamw_opts o = ct_adamw_default_opts();
    o.weight_decay = 0.1;
    o.decay_only_ndim_ge2 = true;
    ct_optim *oa; CT_EXPECT_OK(ct_optim_create_adamw(A, &o, &oa));
    o.template_only = true;
    ct_optim *tmpl; CT_EXPECT_OK(ct_optim_create_adamw(T, &o, &tmpl));
    CT_EXPECT(ct_optim_is_template(tmpl) && !ct_optim_is_template(oa));
    float *buf = (float *)1;
    ct_optim_state_buffer(tmpl, 0, NULL, &buf, NULL);
    CT_EXPECT(buf == NULL); /* no state was allocated */
    ct_optim *ob; CT_EXPECT_OK(ct_optim_create_like(tmpl, B, &ob));
    CT_EXPECT(!ct_optim_is_template(ob) && !strcmp(ct_optim_kind(ob), "adamw"));
    for (int i = 0; i < ct_params_count(B); i++)
        CT_EXPECT(ct_optim_weight_decay(ob, i) == ct_optim_weight_decay(oa, i));
    CT_EXPECT(same_steps(A, oa, B, ob));
    ct_optim_release_state(oa); /* the trainer's under FSDP */
    CT_EXPECT(ct_optim_is_template(oa));
    ct_optim_free(oa);
    ct_optim_free(ob);
    ct_optim_free(tmpl);
    ct_params_free(A);
    ct_params_free(B);
    ct_params_free(T);
}

static char tmpdir[64];
static const char *tmp_path(const char *name) {
    static char buf[256];
    if (!tmpdir[0]) {
        strcpy(tmpdir, "/tmp/ct_optim_XXXXXX");
        if (!mkdtemp(tmpdir)) abort();
    }
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    return buf;
}

/* Save after 5 steps (weights + optimizer state in one safetensors file), restore into a
 * fresh store and optimizer, run 5 more: the same bits as 10 uninterrupted steps. */
static void check_resume(const char *cfg) {
    ct_params *A = make_params();
    ct_optim *oa = make_opt(cfg, A);
    for (int s = 0; s < STEPS; s++) {
        set_grads(A, s);
        ct_optim_step(oa, 0.01 + 0.001 * s);
    }
    ct_params *B = make_params();
    ct_optim *ob = make_opt(cfg, B);
    for (int s = 0; s < 5; s++) {
        set_grads(B, s);
        ct_optim_step(ob, 0.01 + 0.001 * s);
    }
    const char *path = tmp_path("ckpt.safetensors");
    ct_st_writer *w; CT_EXPECT_OK(ct_st_writer_create(&w));
    for (int i = 0; i < NP; i++)
        CT_EXPECT_OK(ct_st_writer_add(w, PNAMES[i], CT_F32, PNDIM[i], PSHAPE[i], ct_params_data(B) + ct_params_offset(B, i)));
    CT_EXPECT_OK(ct_checkpoint_add_optim(w, ob, "state."));
    CT_EXPECT_OK(ct_st_writer_save(w, path));
    ct_st_writer_free(w);
    ct_optim_free(ob);
    ct_params_free(B);

    ct_params *C = make_params();
    memset(ct_params_data(C), 0, ct_params_numel(C) * sizeof(float));
    ct_optim *oc = make_opt(cfg, C);
    ct_st_file *f;
    CT_EXPECT_OK(ct_st_open(path, &f));
    for (int i = 0; i < NP; i++) {
        ct_st_tensor t;
        CT_EXPECT_OK(ct_st_get(f, PNAMES[i], &t));
        memcpy(ct_params_data(C) + ct_params_offset(C, i), t.data, t.nbytes);
    }
    CT_EXPECT_OK(ct_checkpoint_read_optim(f, oc, "state."));
    ct_st_close(f);
    CT_EXPECT_EQ(ct_optim_steps(oc), 5);
    for (int s = 5; s < STEPS; s++) {
        set_grads(C, s);
        ct_optim_step(oc, 0.01 + 0.001 * s);
    }
    if (memcmp(ct_params_data(A), ct_params_data(C), ct_params_numel(A) * sizeof(float)))
        CT_FAILF("%s: resumed run differs from the uninterrupted one", cfg);
    for (int k = 0; k < ct_optim_state_count(oa); k++) {
        const char *na, *nc;
        float *da, *dc;
        size_t n;
        ct_optim_state_buffer(oa, k, &na, &da, &n);
        ct_optim_state_buffer(oc, k, &nc, &dc, NULL);
        CT_EXPECT(!strcmp(na, nc));
        if (memcmp(da, dc, n * sizeof(float))) CT_FAILF("%s: state %s differs after resume", cfg, na);
    }
    ct_optim_free(oa);
    ct_optim_free(oc);
    ct_params_free(A);
    ct_params_free(C);
    unlink(path);
}

CT_TEST(optim_resume_is_exact) {
    CT_ASSERT(fx());
    check_resume("adamw_amsgrad");
    check_resume("adamw_nodecay1d");
    check_resume("sgd_dampening");
    check_resume("sgd_nesterov");
    check_resume("sgd_plain");
}

CT_TEST(optim_state_names_and_errors) {
    CT_ASSERT(fx());
    ct_params *P = make_params();
    ct_optim *a; CT_EXPECT_OK(ct_optim_create_adamw(P, NULL, &a));
    ct_sgd_opts so = ct_sgd_default_opts();
    so.momentum = 0.9;
    ct_optim *s; CT_EXPECT_OK(ct_optim_create_sgd(P, &so, &s));
    CT_EXPECT(!strcmp(ct_optim_kind(a), "adamw") && !strcmp(ct_optim_kind(s), "sgd"));
    CT_EXPECT_EQ(ct_optim_state_count(a), 2);
    CT_EXPECT_EQ(ct_optim_state_count(s), 1);
    const char *nm;
    size_t n;
    ct_optim_state_buffer(a, 1, &nm, NULL, &n);
    CT_EXPECT(!strcmp(nm, "exp_avg_sq") && n == ct_params_numel(P));
    ct_optim_state_buffer(s, 0, &nm, NULL, NULL);
    CT_EXPECT(!strcmp(nm, "momentum_buffer"));

    set_grads(P, 0);
    ct_optim_step(s, 0.1);
    const char *path = tmp_path("sgd_state.safetensors");
    ct_st_writer *w; CT_EXPECT_OK(ct_st_writer_create(&w));
    CT_EXPECT_OK(ct_checkpoint_add_optim(w, s, "optim."));
    CT_EXPECT_OK(ct_st_writer_save(w, path));
    ct_st_writer_free(w);
    ct_st_file *f;
    CT_EXPECT_OK(ct_st_open(path, &f));
    CT_EXPECT_EQ(ct_st_count(f), 1 + NP);
    ct_st_tensor t;
    CT_EXPECT_OK(ct_st_get(f, "optim.momentum_buffer.conv.weight", &t));
    CT_EXPECT(t.ndim == 3 && t.shape[0] == 3 && t.shape[2] == 5);
    CT_EXPECT_OK(ct_st_get(f, "optim.step", &t));
    CT_EXPECT(t.dtype == CT_I64 && t.ndim == 0);
    /* SGD state has no exp_avg: not found, and the AdamW optimizer is unchanged */
    CT_EXPECT_EQ(ct_checkpoint_read_optim(f, a, "optim."), CT_ERR_NOT_FOUND);
    CT_EXPECT(strstr(ct_last_error(), "optim.exp_avg.fc.weight") != NULL);
    CT_EXPECT_EQ(ct_optim_steps(a), 0);
    CT_EXPECT_EQ(ct_checkpoint_read_optim(f, s, "other."), CT_ERR_NOT_FOUND);
    ct_st_close(f);

    /* a state whose shape disagrees with the parameter: format error, state untouched */
    float junk[64] = {1};
    int64_t step = 3, wrong[2] = {5, 7};
    CT_EXPECT_OK(ct_st_writer_create(&w));
    ct_st_writer_add(w, "optim.step", CT_I64, 0, NULL, &step);
    ct_st_writer_add(w, "optim.momentum_buffer.fc.weight", CT_F32, 2, wrong, junk);
    ct_st_writer_add(w, "optim.momentum_buffer.fc.bias", CT_F32, 1, PSHAPE[1], junk);
    ct_st_writer_add(w, "optim.momentum_buffer.conv.weight", CT_F32, 3, PSHAPE[2], junk);
    CT_EXPECT_OK(ct_st_writer_save(w, path));
    ct_st_writer_free(w);
    CT_EXPECT_OK(ct_st_open(path, &f));
    float *mb;
    ct_optim_state_buffer(s, 0, NULL, &mb, NULL);
    float before = mb[ct_params_offset(P, 1)];
    CT_EXPECT_EQ(ct_checkpoint_read_optim(f, s, "optim."), CT_ERR_FORMAT);
    CT_EXPECT(strstr(ct_last_error(), "fc.weight") != NULL);
    CT_EXPECT_EQ(ct_optim_steps(s), 1);
    CT_EXPECT(mb[ct_params_offset(P, 1)] == before);
    ct_st_close(f);
    unlink(path);
    ct_optim_free(a);
    ct_optim_free(s);
    ct_params_free(P);
}

CT_TEST(optim_invalid_options) {
    ct_params *P = make_params();
    ct_sgd_opts so = ct_sgd_default_opts();
    so.nesterov = true; /* needs momentum */
    ct_optim *bad = (ct_optim *)P; /* must come back NULL */
    CT_EXPECT(ct_optim_create_sgd(P, &so, &bad) == CT_ERR_INVALID && bad == NULL);
    CT_EXPECT(strstr(ct_last_error(), "Nesterov") != NULL);
    ct_adamw_opts ao = ct_adamw_default_opts();
    ao.beta2 = 1.0;
    CT_EXPECT(ct_optim_create_adamw(P, &ao, &bad) == CT_ERR_INVALID && bad == NULL);
    CT_EXPECT(ct_optim_create_adamw(NULL, NULL, &bad) == CT_ERR_INVALID && bad == NULL);
    /* PyTorch's defaults */
    ao = ct_adamw_default_opts();
    CT_EXPECT(ao.beta1 == 0.9 && ao.beta2 == 0.999 && ao.eps == 1e-8 && ao.weight_decay == 1e-2 && !ao.amsgrad);
    ct_params_free(P);
}

/* A store big enough for the parallel loops: 1 and 2 threads give the same bits. */
CT_TEST(optim_thread_count_independent) {
    ct_params *P[2];
    for (int k = 0; k < 2; k++) {
        CT_EXPECT_OK(ct_params_create(&P[k]));
        ct_param(P[k], "big.weight", 2, (int64_t[]){300, 1001}, CT_INIT_KAIMING_UNIFORM, 1001);
        ct_param(P[k], "big.bias", 1, (int64_t[]){300}, CT_INIT_UNIFORM, 0.1);
        CT_ASSERT(ct_params_finalize(P[k], 7) == CT_OK);
    }
    size_t n = ct_params_numel(P[0]);
    ct_adamw_opts ao = ct_adamw_default_opts();
    ao.decay_only_ndim_ge2 = true;
    double norms[2];
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(k + 1);
        ct_optim *o; CT_EXPECT_OK(ct_optim_create_adamw(P[k], &ao, &o));
        for (int s = 0; s < 3; s++) {
            float *g = ct_params_grad(P[k]);
            for (size_t i = 0; i < n; i++) g[i] = (float)sin(0.001 * (double)i * (s + 1)) * 5;
            norms[k] = ct_clip_grad_norm(P[k], 1.0f);
            ct_optim_step(o, 1e-3);
        }
        ct_optim_free(o);
    }
    omp_set_num_threads(2);
    CT_EXPECT(norms[0] == norms[1]);
    CT_EXPECT(!memcmp(ct_params_data(P[0]), ct_params_data(P[1]), n * sizeof(float)));
    ct_params_free(P[0]);
    ct_params_free(P[1]);
}

/* ---- schedules ---- */

static void check_sched(const char *name, double tol) {
    char nm[96];
    double cfg[5], lr[128];
    snprintf(nm, sizeof nm, "sched.%s.cfg", name);
    fx_read(nm, cfg, sizeof cfg);
    snprintf(nm, sizeof nm, "sched.%s.lr", name);
    int n = (int)(fx_read(nm, lr, sizeof lr) / sizeof(double));
    ct_lr_schedule s = {(ct_lr_kind)cfg[0], cfg[1], cfg[2], (int64_t)cfg[3], (int64_t)cfg[4]};
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double got = ct_lr_at(&s, i);
        double e = fabs(got - lr[i]) / (fabs(lr[i]) > 1e-30 ? fabs(lr[i]) : 1.0);
        if (lr[i] == 0 && got != 0) e = fabs(got) / cfg[1];
        if (e > worst) worst = e;
    }
    printf("  sched %-14s %2d steps: worst relative error %.3g\n", name, n, worst);
    if (!(worst <= tol)) CT_FAILF("schedule %s: error %.3g > %g", name, worst, tol);
}

CT_TEST(optim_lr_schedules) {
    CT_ASSERT(fx());
    check_sched("constant_w", 1e-14);
    check_sched("linear", 1e-14);
    check_sched("linear_min", 1e-14);
    check_sched("cosine", 1e-14);
    check_sched("cosine_nowarm", 1e-14);
    check_sched("annealing", 1e-12); /* CosineAnnealingLR's recursive form drifts by ulps */
    /* constructors and the ends */
    ct_lr_schedule c = ct_lr_cosine(1.0, 0.1, 10, 110);
    CT_EXPECT(ct_lr_at(&c, 0) == 0.0);
    CT_EXPECT_NEAR(ct_lr_at(&c, 5), 0.5, 1e-15);
    CT_EXPECT(ct_lr_at(&c, 10) == 1.0);
    CT_EXPECT_NEAR(ct_lr_at(&c, 60), 0.55, 1e-15);
    CT_EXPECT_NEAR(ct_lr_at(&c, 110), 0.1, 1e-15);
    CT_EXPECT_NEAR(ct_lr_at(&c, 100000), 0.1, 1e-15);
    ct_lr_schedule k = ct_lr_constant(3e-4, 0);
    CT_EXPECT(ct_lr_at(&k, 0) == 3e-4 && ct_lr_at(&k, 1000000) == 3e-4);
    ct_lr_schedule l = ct_lr_linear(1.0, 0.0, 0, 100);
    CT_EXPECT(ct_lr_at(&l, 0) == 1.0);
    CT_EXPECT_NEAR(ct_lr_at(&l, 75), 0.25, 1e-15);
    CT_EXPECT(ct_lr_at(&l, 150) == 0.0);
}

/* ---- clipping ---- */

CT_TEST(optim_clip_grad_norm) {
    CT_ASSERT(fx());
    ct_params *P = make_params();
    char nm[96];
    static float want[64];
    double worst_norm = 0, worst_g = 0;
    for (int c = 0; c < 3; c++) {
        for (int i = 0; i < NP; i++) {
            snprintf(nm, sizeof nm, "clip.in.%s", PNAMES[i]);
            fx_read(nm, ct_params_grad(P) + ct_params_offset(P, i), 4096);
        }
        snprintf(nm, sizeof nm, "clip%d.max_norm", c);
        float max_norm = (float)fx_f64(nm);
        float total_want;
        snprintf(nm, sizeof nm, "clip%d.total", c);
        fx_read(nm, &total_want, sizeof total_want);
        float total = ct_clip_grad_norm(P, max_norm);
        double e = fabs((double)total - total_want) / total_want;
        if (e > worst_norm) worst_norm = e;
        for (int i = 0; i < NP; i++) {
            snprintf(nm, sizeof nm, "clip%d.%s", c, PNAMES[i]);
            fx_read(nm, want, sizeof want);
            double eg = ct_max_rel_err(ct_params_grad(P) + ct_params_offset(P, i), want, pnumel(i), 1e-6);
            if (eg > worst_g) worst_g = eg;
        }
    }
    printf("  clip: worst total-norm relative error %.3g, worst clipped-gradient relative error %.3g\n",
           worst_norm, worst_g);
    CT_EXPECT(worst_norm <= 1e-6);
    CT_EXPECT(worst_g <= 1e-6);
    /* a nan gradient: nan norm, gradients become nan (PyTorch, error_if_nonfinite=False) */
    ct_params_grad(P)[0] = NAN;
    CT_EXPECT(isnan(ct_clip_grad_norm(P, 1.0f)));
    CT_EXPECT(isnan(ct_params_grad(P)[1]));
    /* zero gradients: norm 0, nothing changes */
    ct_params_zero_grad(P);
    CT_EXPECT(ct_clip_grad_norm(P, 1.0f) == 0.0f);
    ct_params_free(P);
}

/* ---- grad scaler ---- */

CT_TEST(optim_grad_scaler_update_rule) {
    CT_ASSERT(fx());
    uint8_t found[64];
    float scale[64];
    int32_t tracker[64];
    int n = (int)fx_read("scaler.found_inf", found, sizeof found);
    fx_read("scaler.scale", scale, sizeof scale);
    fx_read("scaler.tracker", tracker, sizeof tracker);
    ct_grad_scaler_opts o = ct_grad_scaler_default_opts();
    CT_EXPECT(o.init_scale == 65536.0f && o.growth_factor == 2.0 && o.backoff_factor == 0.5 &&
              o.growth_interval == 2000 && o.enabled);
    o.growth_interval = 3; /* as the fixture */
    ct_grad_scaler *s; CT_EXPECT_OK(ct_grad_scaler_create(&o, &s));
    CT_EXPECT(ct_grad_scaler_scale(s) == 65536.0f);
    for (int i = 0; i < n; i++) {
        ct_grad_scaler_update(s, found[i] != 0);
        ct_grad_scaler_state st = ct_grad_scaler_get_state(s);
        if (st.scale != scale[i] || st.growth_tracker != tracker[i])
            CT_FAILF("step %d: scale %g tracker %d, PyTorch %g %d", i, (double)st.scale, st.growth_tracker,
                     (double)scale[i], tracker[i]);
    }
    /* state round trip */
    ct_grad_scaler_state st = {1024.0f, 2};
    ct_grad_scaler_set_state(s, st);
    ct_grad_scaler_update(s, false);
    CT_EXPECT(ct_grad_scaler_scale(s) == 2048.0f && ct_grad_scaler_get_state(s).growth_tracker == 0);
    ct_grad_scaler_free(s);

    /* never grows to inf */
    o.init_scale = 0x1p127f;
    o.growth_interval = 1;
    CT_EXPECT_OK(ct_grad_scaler_create(&o, &s));
    ct_grad_scaler_update(s, false);
    CT_EXPECT(ct_grad_scaler_scale(s) == 0x1p127f);
    ct_grad_scaler_free(s);

    o.backoff_factor = 1.5;
    s = (ct_grad_scaler *)&o; /* must come back NULL */
    CT_EXPECT(ct_grad_scaler_create(&o, &s) == CT_ERR_INVALID && s == NULL);
}

CT_TEST(optim_grad_scaler_unscale) {
    ct_params *P = make_params();
    ct_grad_scaler *s; CT_EXPECT_OK(ct_grad_scaler_create(NULL, &s));
    float *g = ct_params_grad(P);
    g[0] = 65536.0f * 3;
    g[ct_params_offset(P, 2) + 4] = -65536.0f / 8;
    CT_EXPECT(ct_grad_scaler_unscale_and_check(s, P));
    CT_EXPECT(g[0] == 3.0f && g[ct_params_offset(P, 2) + 4] == -0.125f);
    g[ct_params_offset(P, 1) + 2] = INFINITY;
    g[0] = 65536.0f;
    CT_EXPECT(!ct_grad_scaler_unscale_and_check(s, P));
    CT_EXPECT(g[0] == 1.0f); /* all gradients are unscaled even when one is not finite */
    g[ct_params_offset(P, 1) + 2] = NAN;
    CT_EXPECT(!ct_grad_scaler_unscale_and_check(s, P));
    ct_grad_scaler_free(s);
    ct_grad_scaler_opts o = ct_grad_scaler_default_opts();
    o.enabled = false;
    CT_EXPECT_OK(ct_grad_scaler_create(&o, &s));
    CT_EXPECT(ct_grad_scaler_scale(s) == 1.0f);
    CT_EXPECT(ct_grad_scaler_unscale_and_check(s, P));
    ct_grad_scaler_free(s);
    ct_params_free(P);
}

CT_TEST_MAIN()
