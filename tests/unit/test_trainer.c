/* The trainer's API on a small in-memory problem, one process: callbacks see every step and
 * evaluation and can stop training; options are checked; a checkpoint of another model kind
 * is refused on resume; the loss goes down; evaluation sees every held-out sample. */
#include <sys/stat.h>
#include <unistd.h>

#include "ct_test.h"
#include "ctrain/ctrain.h"

#define N 256
#define D 8
#define C 3

/* y = argmax of three fixed linear scores of x: learnable by a linear model */
static ct_dataset *make_data(int seed, int n) {
    static float x[N * D];
    static int32_t y[N];
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)seed;
    for (int i = 0; i < n; i++) {
        float sc[C] = {0};
        for (int j = 0; j < D; j++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            x[i * D + j] = (float)((s >> 40) * (1.0 / 16777216.0)) - 0.5f;
            for (int c = 0; c < C; c++) sc[c] += x[i * D + j] * (float)((j * (c + 1)) % 5 - 2);
        }
        y[i] = sc[1] > sc[0] ? (sc[2] > sc[1] ? 2 : 1) : (sc[2] > sc[0] ? 2 : 0);
    }
    ct_dataset *d = NULL;
    if (ct_dataset_tensors(x, D, y, 1, n, &d) != CT_OK) return NULL;
    return d;
}

typedef struct {
    int steps, evals, stop_at;
    double first_loss, last_loss, last_acc;
} seen;

static bool on_step(ct_trainer *t, const ct_step_report *r, void *user) {
    seen *s = user;
    if (r->step != ct_trainer_step(t)) return false; /* the report is the trainer's state */
    if (s->steps++ == 0) s->first_loss = r->loss;
    s->last_loss = r->loss;
    return r->step != s->stop_at;
}
static bool on_eval(ct_trainer *t, const ct_eval_report *r, void *user) {
    (void)t;
    seen *s = user;
    s->evals++;
    s->last_acc = r->accuracy;
    return true;
}

typedef struct {
    ct_params *P;
    ct_module *net;
    ct_optim *opt;
} model;

static bool make_model(model *m) {
    if (ct_params_create(&m->P) != CT_OK) return false;
    m->net = ct_nn_sequential("");
    ct_seq_add(m->net, ct_nn_linear(m->P, ct_seq_next_name(m->net), D, 16, true));
    ct_seq_add(m->net, ct_nn_relu());
    ct_seq_add(m->net, ct_nn_linear(m->P, ct_seq_next_name(m->net), 16, C, true));
    return ct_params_finalize(m->P, 3) == CT_OK && ct_optim_create_sgd(m->P, &(ct_sgd_opts){.momentum = 0.9}, &m->opt) == CT_OK;
}
static void free_model(model *m) {
    ct_optim_free(m->opt);
    ct_module_free(m->net);
    ct_params_free(m->P);
}

CT_TEST(callbacks_see_every_step_and_can_stop) {
    ct_dataset *train = make_data(1, N), *test = make_data(2, 100);
    CT_ASSERT(train && test);
    model m;
    CT_ASSERT(make_model(&m));
    ct_train_model tm = ct_train_model_module(m.net, m.P, "tiny");
    seen s = {.stop_at = 40};
    ct_trainer_opts o = ct_trainer_default_opts();
    o.epochs = 10; /* 8 steps per epoch at batch 32: stopped at 40 (epoch 5) */
    o.batch_size = 32;
    o.lr = 0.1;
    o.log_every = 0;
    o.output_dir = ct_test_tmp_path("stop");
    o.on_step = on_step;
    o.on_eval = on_eval;
    o.user = &s;
    ct_trainer *t;
    CT_ASSERT(ct_trainer_create(&o, &tm, m.opt, train, test, &t) == CT_OK);
    CT_EXPECT_EQ(ct_trainer_steps_per_epoch(t), N / 32);
    CT_EXPECT_EQ(ct_trainer_total_steps(t), 10 * N / 32);
    CT_EXPECT_OK(ct_trainer_fit(t));
    CT_EXPECT_EQ(ct_trainer_step(t), 40);
    CT_EXPECT_EQ(s.steps, 40);
    CT_EXPECT_EQ(s.evals, 4); /* after epochs 1-4; the stop at step 40 comes before epoch 5's */
    CT_EXPECT(s.last_loss < 0.6 * s.first_loss);
    CT_EXPECT(s.last_acc > 0.7 && s.last_acc <= 1.0);
    ct_eval_report ev;
    CT_EXPECT_OK(ct_trainer_evaluate(t, &ev));
    CT_EXPECT_NEAR(ev.accuracy * 100, (double)(long)(ev.accuracy * 100 + 0.5), 1e-9); /* 100 samples counted */
    char p[512];
    struct stat sb;
    snprintf(p, sizeof p, "%s/model.safetensors", o.output_dir);
    CT_EXPECT(stat(p, &sb) == 0);
    snprintf(p, sizeof p, "%s/checkpoints/step-00000040/manifest.json", o.output_dir);
    CT_EXPECT(stat(p, &sb) == 0);
    ct_trainer_free(t);

    /* resume as another kind: refused, nothing changed */
    tm.kind = "other";
    o.resume = "auto";
    o.on_step = NULL;
    o.on_eval = NULL;
    CT_ASSERT(ct_trainer_create(&o, &tm, m.opt, train, test, &t) == CT_OK);
    float w0 = ct_params_data(m.P)[0];
    CT_EXPECT_EQ(ct_trainer_fit(t), CT_ERR_MISMATCH);
    CT_EXPECT(strstr(ct_last_error(), "'tiny' model") != NULL);
    CT_EXPECT(ct_params_data(m.P)[0] == w0);
    ct_trainer_free(t);
    free_model(&m);
    ct_dataset_free(train);
    ct_dataset_free(test);
}

CT_TEST(bad_options_are_errors) {
    ct_dataset *train = make_data(1, 64);
    model m, other;
    CT_ASSERT(train && make_model(&m) && make_model(&other));
    ct_train_model tm = ct_train_model_module(m.net, m.P, "tiny");
    ct_trainer *t = (ct_trainer *)1;
    ct_trainer_opts o = ct_trainer_default_opts();
    o.output_dir = ct_test_tmp_path("bad");
    o.metrics = false;
    o.grad_accum = 0;
    CT_EXPECT_EQ(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t), CT_ERR_INVALID);
    CT_EXPECT(t == NULL);
    o.grad_accum = 1;
    CT_EXPECT_EQ(ct_trainer_create(&o, &tm, other.opt, train, NULL, &t), CT_ERR_INVALID); /* another store's optimizer */
    CT_EXPECT(strstr(ct_last_error(), "another parameter store") != NULL);
    o.batch_size = 40; /* 64 samples: one batch of 40, but two micro-batches do not fit */
    o.grad_accum = 2;
    CT_EXPECT_EQ(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t), CT_ERR_INVALID);
    CT_EXPECT(strstr(ct_last_error(), "--grad-accum") != NULL);
    o.grad_accum = 1;
    CT_EXPECT_OK(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t));
    ct_trainer_free(t);
    free_model(&m);
    free_model(&other);
    ct_dataset_free(train);
}

/* loss scaling: a loss made inf on chosen calls overflows the gradients */
static int loss_calls, bad_from, bad_to;
static ct_tensor *flaky_loss(ct_ctx *ctx, void *self, ct_tensor *x, ct_tensor *y) {
    ct_tensor *l = ct_cross_entropy(ctx, ct_module_forward(ctx, self, x), y, -100);
    loss_calls++;
    return loss_calls >= bad_from && loss_calls <= bad_to ? ct_scale(ctx, l, INFINITY) : l;
}
typedef struct {
    ct_params *P;
    float before[4], after_skip[4];
    int skipped_at;
} watch;
static bool watch_step(ct_trainer *t, const ct_step_report *r, void *user) {
    (void)t;
    watch *w = user;
    if (r->step == w->skipped_at - 1) memcpy(w->before, ct_params_data(w->P), sizeof w->before);
    if (r->step == w->skipped_at) memcpy(w->after_skip, ct_params_data(w->P), sizeof w->after_skip);
    return true;
}

CT_TEST(loss_scaling_skips_overflowing_steps_and_resumes_its_scale) {
    ct_dataset *train = make_data(1, N);
    model m;
    CT_ASSERT(train && make_model(&m));
    ct_train_model tm = ct_train_model_module(m.net, m.P, "tiny");
    tm.loss = flaky_loss;
    watch w = {.P = m.P, .skipped_at = 5};
    ct_trainer_opts o = ct_trainer_default_opts();
    o.max_steps = 12;
    o.batch_size = 32;
    o.log_every = 0;
    o.save_every = 6;
    o.output_dir = ct_test_tmp_path("scaler");
    o.loss_scaling = true;
    o.scaler.growth_interval = 4;
    o.on_step = watch_step;
    o.user = &w;
    loss_calls = 0, bad_from = bad_to = 5;
    ct_trainer *t;
    CT_ASSERT(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t) == CT_OK);
    CT_EXPECT_OK(ct_trainer_fit(t));
    CT_EXPECT_EQ(ct_trainer_skipped_steps(t), 1);
    CT_EXPECT(memcmp(w.before, w.after_skip, sizeof w.before) == 0); /* the skipped step changed nothing */
    /* 65536: 4 clean steps -> 131072, the overflow at 5 -> 65536, 4 clean (6-9) -> 131072, 10-12 */
    CT_EXPECT(ct_trainer_loss_scale(t) == 131072.0f);
    ct_trainer_free(t);
    /* the checkpoint at step 6 holds scale 65536 and tracker 1; resuming there continues them */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/checkpoints/step-00000006", o.output_dir);
    o.resume = dir;
    o.max_steps = 9; /* steps 7-9: tracker 1 -> 4 = growth: 131072 */
    o.on_step = NULL;
    o.output_dir = ct_test_tmp_path("scaler2");
    bad_from = bad_to = 0;
    CT_ASSERT(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t) == CT_OK);
    CT_EXPECT_OK(ct_trainer_fit(t));
    CT_EXPECT(ct_trainer_loss_scale(t) == 131072.0f);
    CT_EXPECT_EQ(ct_trainer_skipped_steps(t), 0);
    ct_trainer_free(t);
    /* overflow on every step: the scale stops at its floor instead of collapsing to 0 */
    o.resume = NULL;
    o.max_steps = 6;
    o.scaler.init_scale = 4.0f;
    o.output_dir = ct_test_tmp_path("scaler3");
    loss_calls = 0, bad_from = 1, bad_to = 1000;
    CT_ASSERT(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t) == CT_OK);
    CT_EXPECT_OK(ct_trainer_fit(t));
    CT_EXPECT_EQ(ct_trainer_skipped_steps(t), 6);
    CT_EXPECT(ct_trainer_loss_scale(t) == 1.0f);
    ct_trainer_free(t);
    free_model(&m);
    ct_dataset_free(train);
}

CT_TEST_MAIN()
