/* The trainer's API on a small in-memory problem, one process: callbacks see every step and
 * evaluation and can stop training; options are checked; a checkpoint of another model kind
 * is refused on resume; the loss goes down; evaluation sees every held-out sample. */
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

static bool make_model_as(model *m, bool deferred) {
    if (ct_params_create(&m->P) != CT_OK) return false;
    m->net = ct_nn_sequential("");
    ct_seq_add(m->net, ct_nn_linear(m->P, ct_seq_next_name(m->net), D, 16, true));
    ct_seq_add(m->net, ct_nn_relu());
    ct_seq_add(m->net, ct_nn_linear(m->P, ct_seq_next_name(m->net), 16, C, true));
    return (deferred ? ct_params_finalize_deferred(m->P, 3) : ct_params_finalize(m->P, 3)) == CT_OK &&
           ct_optim_create_sgd(m->P, &(ct_sgd_opts){.momentum = 0.9}, &m->opt) == CT_OK;
}
static bool make_model(model *m) { return make_model_as(m, false); }
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

/* A deferred store (ct_params_finalize_deferred) that nothing shards is made whole by the
 * trainer and trains to the bits of a store initialised at once */
CT_TEST(deferred_store_without_sharding_trains_as_a_whole_one) {
    ct_dataset *train = make_data(1, N);
    CT_ASSERT(train);
    model a, b;
    CT_ASSERT(make_model_as(&a, false) && make_model_as(&b, true));
    CT_EXPECT(ct_params_is_deferred(b.P) && ct_params_data(b.P) == NULL);
    float *w[2] = {NULL, NULL};
    model *ms[2] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        ct_train_model tm = ct_train_model_module(ms[k]->net, ms[k]->P, "tiny");
        ct_trainer_opts o = ct_trainer_default_opts();
        o.epochs = 2;
        o.batch_size = 32;
        o.lr = 0.1;
        o.log_every = 0;
        o.metrics = false;
        o.output_dir = ct_test_tmp_path(k ? "deferred" : "whole");
        ct_trainer *t;
        CT_ASSERT(ct_trainer_create(&o, &tm, ms[k]->opt, train, NULL, &t) == CT_OK);
        CT_EXPECT(!ct_params_is_deferred(ms[k]->P));
        CT_EXPECT_OK(ct_trainer_fit(t));
        ct_trainer_free(t);
        w[k] = ct_params_data(ms[k]->P);
    }
    CT_EXPECT(w[0] && w[1] && !memcmp(w[0], w[1], ct_params_numel(a.P) * sizeof(float)));
    free_model(&a);
    free_model(&b);
    ct_dataset_free(train);
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
    o.amp = CT_I8; /* mixed precision in a type that is no low-precision float */
    CT_EXPECT_EQ(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t), CT_ERR_INVALID);
    CT_EXPECT(strstr(ct_last_error(), "amp must be") != NULL);
    o.amp = CT_F32;
    CT_EXPECT_OK(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t));
    ct_trainer_free(t);
    free_model(&m);
    free_model(&other);
    ct_dataset_free(train);
}

/* A target the model has no class for fails at creation, naming the sample, instead of an
 * abort() inside cross_entropy at whatever step draws it. */
CT_TEST(bad_labels_refused_before_training) {
    ct_dataset *train = make_data(1, N), *test = NULL;
    model m;
    CT_ASSERT(train && make_model(&m));
    static float x[N * D];
    static int32_t y[N];
    for (int i = 0; i < N; i++) y[i] = i % C;
    y[200] = C; /* one sample of class 3 for a 3-class model */
    CT_ASSERT(ct_dataset_tensors(x, D, y, 1, N, &test) == CT_OK);
    ct_train_model tm = ct_train_model_module(m.net, m.P, "tiny");
    tm.expect.classes = C;
    tm.expect.ignore_index = -100;
    ct_trainer_opts o = ct_trainer_default_opts();
    o.output_dir = ct_test_tmp_path("badlabel");
    o.metrics = false;
    o.log_every = 0;
    ct_trainer *t = (ct_trainer *)1;
    CT_EXPECT_EQ(ct_trainer_create(&o, &tm, m.opt, train, test, &t), CT_ERR_FORMAT);
    CT_EXPECT(t == NULL);
    CT_EXPECTF(strstr(ct_last_error(), "target 3 of sample 200") && strstr(ct_last_error(), "'tiny' has 3 classes"),
               "message: %s", ct_last_error());
    /* the input size is checked too */
    tm.expect.x_numel = D + 1;
    CT_EXPECT_EQ(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t), CT_ERR_FORMAT);
    CT_EXPECTF(strstr(ct_last_error(), "takes 9 values") != NULL, "message: %s", ct_last_error());
    tm.expect.x_numel = D;
    CT_EXPECT_OK(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t));
    ct_trainer_free(t);
    free_model(&m);
    ct_dataset_free(train);
    ct_dataset_free(test);
}

/* Evaluation data without samples: nothing is evaluated and that is said, instead of a
 * loss and accuracy of 0/0 reported as "nan". */
CT_TEST(empty_evaluation_data_is_not_evaluated) {
    ct_dataset *train = make_data(1, N), *none = NULL;
    model m;
    CT_ASSERT(train && make_model(&m));
    CT_ASSERT(ct_dataset_subset(train, N, 0, &none) == CT_OK);
    ct_train_model tm = ct_train_model_module(m.net, m.P, "tiny");
    seen s = {.stop_at = -1};
    ct_trainer_opts o = ct_trainer_default_opts();
    o.output_dir = ct_test_tmp_path("noeval");
    o.metrics = false;
    o.log_every = 0;
    o.batch_size = 32;
    o.epochs = 2;
    o.on_step = on_step;
    o.on_eval = on_eval;
    o.user = &s;
    ct_trainer *t;
    CT_ASSERT(ct_trainer_create(&o, &tm, m.opt, train, none, &t) == CT_OK);
    CT_EXPECT_OK(ct_trainer_fit(t));
    CT_EXPECT_EQ(s.steps, 2 * N / 32);
    CT_EXPECT_EQ(s.evals, 0);
    ct_eval_report ev;
    CT_EXPECT_EQ(ct_trainer_evaluate(t, &ev), CT_ERR_INVALID);
    CT_EXPECT(strstr(ct_last_error(), "nothing to evaluate") != NULL);
    ct_trainer_free(t);
    free_model(&m);
    ct_dataset_free(none);
    ct_dataset_free(train);
}

static bool exists(const char *dir, const char *name) {
    char p[1500];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}
static void put(const char *dir, const char *name, const char *text) {
    char p[1500];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (f) { fputs(text, f); fclose(f); }
}
static void rm_rf(const char *dir) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}
static long dead_pid(void) {
    pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
    return (long)p;
}

/* The leftovers of killed saves and prunes (hidden names with a dead pid) are removed at the
 * next start; a re-save cut between its renames gets its step-N back; a live process's
 * directory is not touched; pruning never leaves a partial step-N behind. */
CT_TEST(checkpoint_leftovers_cleaned_at_start) {
    model m;
    CT_ASSERT(make_model(&m));
    ct_train_model tm = ct_train_model_module(m.net, m.P, "tiny");
    char root[300], p[700];
    snprintf(root, sizeof root, "%s", ct_test_tmp_path("leftovers"));
    rm_rf(root);
    ct_train_state ts = {.step = 8};
    CT_ASSERT(ct_checkpoint_save(root, &tm, m.opt, &ts, 0) == CT_OK);
    long dead = dead_pid(), live = (long)getppid();
    /* a re-save of step 8 killed after moving the old copy aside */
    snprintf(p, sizeof p, "%s/step-00000008", root);
    char old[700];
    snprintf(old, sizeof old, "%s/.step-00000008.old.%ld", root, dead);
    CT_ASSERT(rename(p, old) == 0);
    const char *names[] = {".step-00000002.tmp.", ".step-00000004.del.", "step-00000006.old."};
    char made[3][64];
    for (int i = 0; i < 3; i++) {
        snprintf(made[i], sizeof made[i], "%s%ld", names[i], dead);
        snprintf(p, sizeof p, "%s/%s", root, made[i]);
        CT_ASSERT(mkdir(p, 0755) == 0);
        put(p, "model.safetensors", "partial");
    }
    char alive[64];
    snprintf(alive, sizeof alive, ".step-00000010.tmp.%ld", live);
    snprintf(p, sizeof p, "%s/%s", root, alive);
    CT_ASSERT(mkdir(p, 0755) == 0);
    CT_EXPECT_OK(ct_checkpoint_cleanup(root));
    for (int i = 0; i < 3; i++) CT_EXPECTF(!exists(root, made[i]), "%s left", made[i]);
    CT_EXPECT(exists(root, alive));
    CT_EXPECT(!exists(root, old + strlen(root) + 1));
    snprintf(p, sizeof p, "%s/step-00000008", root);
    CT_EXPECT_OK(ct_checkpoint_verify(p)); /* restored, complete */
    char found[700];
    CT_EXPECT_OK(ct_checkpoint_find_latest(root, found, sizeof found));
    CT_EXPECT(strcmp(found, p) == 0);
    /* pruning: keep 2 of steps 8, 9, 10; nothing but complete step-N and the live dir remains */
    for (int s = 9; s <= 10; s++) {
        ts.step = s;
        CT_EXPECT_OK(ct_checkpoint_save(root, &tm, m.opt, &ts, 2));
    }
    CT_EXPECT(!exists(root, "step-00000008"));
    DIR *d = opendir(root);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.' && strcmp(e->d_name, alive) && strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            CT_FAILF("left behind: %s", e->d_name);
        n += strncmp(e->d_name, "step-", 5) == 0;
    }
    if (d) closedir(d);
    CT_EXPECT_EQ(n, 2);
    rm_rf(root);
    free_model(&m);
}

/* The temporary file of a final save killed before its rename is removed at the next
 * start; one of a live process, or of another file, is not. */
CT_TEST(stale_weight_temporaries_removed) {
    char dir[300], n1[64], n2[64];
    snprintf(dir, sizeof dir, "%s", ct_test_tmp_path("stale"));
    rm_rf(dir);
    CT_ASSERT(mkdir(dir, 0755) == 0);
    long dead = dead_pid(), live = (long)getppid();
    snprintf(n1, sizeof n1, "model.safetensors.tmp.%ld.1f2e", dead);
    snprintf(n2, sizeof n2, "model.safetensors.tmp.%ld.3a", live);
    put(dir, n1, "partial");
    put(dir, n2, "being written");
    put(dir, "model.safetensors.tmpx", "not a temporary");
    char other[64];
    snprintf(other, sizeof other, "other.safetensors.tmp.%ld.1", dead);
    put(dir, other, "another file's");
    char p[400];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CT_EXPECT_EQ(ct_st_remove_stale_tmp(p), 1);
    CT_EXPECT(!exists(dir, n1));
    CT_EXPECT(exists(dir, n2) && exists(dir, "model.safetensors.tmpx") && exists(dir, other));
    rm_rf(dir);
}

/* The train state comes back as saved, all 64 bits of the seeds included (they were read
 * with strtoll, which clamped a seed >= 2^63: the resumed run shuffled differently). */
CT_TEST(train_state_numbers_round_trip) {
    model m;
    CT_ASSERT(make_model(&m));
    ct_train_model tm = ct_train_model_module(m.net, m.P, "tiny");
    char root[300], dir[700];
    snprintf(root, sizeof root, "%s", ct_test_tmp_path("state"));
    rm_rf(root);
    ct_train_state ts = {.step = 7, .epoch = 2, .sampler = {.seed = 0xfffffffffffffff0ull, .epoch = 2, .position = 1234},
                         .seed = 0x8000000000000001ull, .world_size = 3, .loss_scale = 32768, .scaler_growth_tracker = 5}, back;
    CT_ASSERT(ct_checkpoint_save(root, &tm, m.opt, &ts, 0) == CT_OK);
    snprintf(dir, sizeof dir, "%s/step-00000007", root);
    CT_ASSERT(ct_checkpoint_load(dir, &tm, m.opt, &back) == CT_OK);
    CT_EXPECT(back.sampler.seed == ts.sampler.seed);
    CT_EXPECT(back.seed == ts.seed);
    CT_EXPECT_EQ(back.step, 7);
    CT_EXPECT_EQ(back.epoch, 2);
    CT_EXPECT_EQ(back.sampler.epoch, 2);
    CT_EXPECT_EQ(back.sampler.position, 1234);
    CT_EXPECT_EQ(back.world_size, 3);
    CT_EXPECT(back.loss_scale == 32768);
    CT_EXPECT_EQ(back.scaler_growth_tracker, 5);
    rm_rf(root);
    free_model(&m);
}

/* A manifest with numbers no checksum or size can be is a format error naming the field
 * (the out-of-range cast it used to be is undefined behaviour: UBSan flagged it). */
CT_TEST(manifest_numbers_validated) {
    model m;
    CT_ASSERT(make_model(&m));
    ct_train_model tm = ct_train_model_module(m.net, m.P, "tiny");
    char root[300], dir[700];
    snprintf(root, sizeof root, "%s", ct_test_tmp_path("manifest"));
    rm_rf(root);
    ct_train_state ts = {.step = 1};
    CT_ASSERT(ct_checkpoint_save(root, &tm, m.opt, &ts, 0) == CT_OK);
    snprintf(dir, sizeof dir, "%s/step-00000001", root);
    const char *bad[][2] = {{"\"crc32\": -3656149109", "\"crc32\": -3656149109 is not a CRC-32"},
                            {"\"crc32\": 4294967296", "\"crc32\": 4294967296 is not a CRC-32"},
                            {"\"crc32\": 1.5", "\"crc32\": 1.5 is not"},
                            {"\"bytes\": 1e300", "\"bytes\": 1.0000000000000001e+300 is not a whole number"},
                            {"\"bytes\": -1", "\"bytes\": -1 is not"}};
    for (int i = 0; i < 5; i++) {
        char man[600];
        const char *field = strstr(bad[i][0], "crc32") ? "\"bytes\": 10" : "\"crc32\": 10";
        snprintf(man, sizeof man, "{\"files\": {\"model.safetensors\": {%s, %s}, \"train_state.safetensors\": "
                 "{\"bytes\": 1, \"crc32\": 1}}}", bad[i][0], field);
        put(dir, "manifest.json", man);
        CT_EXPECT_EQ(ct_checkpoint_verify(dir), CT_ERR_FORMAT);
        CT_EXPECTF(strstr(ct_last_error(), bad[i][1]) != NULL, "%s: %s", bad[i][0], ct_last_error());
    }
    rm_rf(root);
    free_model(&m);
}

/* A checkpoint or the final weights that cannot be written end fit with the path and the
 * cause, unless told to go on past checkpoints; the final weights are never optional. */
CT_TEST(save_failures_fail_the_run) {
    ct_dataset *train = make_data(1, N);
    model m;
    CT_ASSERT(train && make_model(&m));
    ct_train_model tm = ct_train_model_module(m.net, m.P, "tiny");
    char out[300], p[700];
    snprintf(out, sizeof out, "%s", ct_test_tmp_path("savefail"));
    rm_rf(out);
    CT_ASSERT(mkdir(out, 0755) == 0);
    put(out, "checkpoints", "a file where the checkpoint directory goes"); /* every save fails */
    ct_trainer_opts o = ct_trainer_default_opts();
    o.output_dir = out;
    o.metrics = false;
    o.log_every = 0;
    o.batch_size = 32;
    o.max_steps = 6;
    o.save_every = 2;
    ct_trainer *t;
    CT_ASSERT(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t) == CT_OK);
    CT_EXPECT_EQ(ct_trainer_fit(t), CT_ERR_IO);
    CT_EXPECTF(strstr(ct_last_error(), "checkpoints/.step-00000002.tmp.") && strstr(ct_last_error(), "Not a directory"),
               "message: %s", ct_last_error());
    CT_EXPECT_EQ(ct_trainer_step(t), 2); /* stopped at the failed save */
    CT_EXPECT(!exists(out, "model.safetensors"));
    ct_trainer_free(t);
    /* going on past checkpoints: the run ends with its weights */
    o.keep_going_on_save_error = true;
    CT_ASSERT(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t) == CT_OK);
    CT_EXPECT_OK(ct_trainer_fit(t));
    CT_EXPECT_EQ(ct_trainer_step(t), 6);
    CT_EXPECT(exists(out, "model.safetensors"));
    ct_trainer_free(t);
    /* the final weights cannot be written (a directory in the way): an error either way */
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    CT_ASSERT(unlink(p) == 0 && mkdir(p, 0755) == 0);
    CT_ASSERT(ct_trainer_create(&o, &tm, m.opt, train, NULL, &t) == CT_OK);
    CT_EXPECT_EQ(ct_trainer_fit(t), CT_ERR_IO);
    CT_EXPECTF(strstr(ct_last_error(), "model.safetensors") && strstr(ct_last_error(), "Is a directory"), "message: %s",
               ct_last_error());
    ct_trainer_free(t);
    rm_rf(out);
    free_model(&m);
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

/* preemption, one process: a real SIGTERM during step 5 (from the step callback) ends fit
 * with a checkpoint at step 5 and no model.safetensors; resuming gives the uninterrupted bits */
static bool term_at_5(ct_trainer *t, const ct_step_report *r, void *user) {
    (void)t, (void)user;
    if (r->step == 5) raise(SIGTERM);
    return true;
}

CT_TEST(preemption_signal_saves_at_the_step_and_resumes_bit_for_bit) {
    ct_dataset *train = make_data(1, N);
    model a, b;
    CT_ASSERT(train && make_model(&a) && make_model(&b));
    ct_train_model ta = ct_train_model_module(a.net, a.P, "tiny"), tb = ct_train_model_module(b.net, b.P, "tiny");
    ct_trainer_opts o = ct_trainer_default_opts();
    o.max_steps = 12;
    o.batch_size = 32;
    o.log_every = 0;
    o.metrics = false;
    o.output_dir = ct_test_tmp_path("preempt_ref");
    ct_trainer *t;
    CT_ASSERT(ct_trainer_create(&o, &ta, a.opt, train, NULL, &t) == CT_OK);
    CT_EXPECT_OK(ct_trainer_fit(t));
    CT_EXPECT_EQ(ct_trainer_preempted(t), 0);
    ct_trainer_free(t);

    uint64_t mask;
    CT_EXPECT_OK(ct_preempt_parse("SIGTERM, usr1", &mask));
    CT_EXPECT_EQ(mask, (1ull << SIGTERM) | (1ull << SIGUSR1));
    CT_EXPECT_EQ(ct_preempt_parse("TERM,KILL", &mask), CT_ERR_INVALID);
    CT_EXPECT(strstr(ct_last_error(), "'KILL'") != NULL);
    CT_ASSERT(ct_preempt_catch(1ull << SIGTERM) == CT_OK);
    o.output_dir = ct_test_tmp_path("preempt");
    o.preemptible = true;
    o.on_step = term_at_5;
    CT_ASSERT(ct_trainer_create(&o, &tb, b.opt, train, NULL, &t) == CT_OK);
    CT_EXPECT_OK(ct_trainer_fit(t));
    signal(SIGTERM, SIG_DFL);
    CT_EXPECT_EQ(ct_preempt_signal(), SIGTERM);
    CT_EXPECT_EQ(ct_trainer_preempted(t), SIGTERM);
    CT_EXPECT_EQ(ct_trainer_step(t), 5);
    ct_trainer_free(t);
    CT_EXPECT(exists(o.output_dir, "checkpoints/step-00000005/manifest.json"));
    CT_EXPECT(!exists(o.output_dir, "model.safetensors"));

    o.preemptible = false; /* the signal stays recorded for this process */
    o.on_step = NULL;
    o.resume = "auto";
    CT_ASSERT(ct_trainer_create(&o, &tb, b.opt, train, NULL, &t) == CT_OK);
    CT_EXPECT_OK(ct_trainer_fit(t));
    CT_EXPECT_EQ(ct_trainer_step(t), 12);
    ct_trainer_free(t);
    CT_EXPECT(memcmp(ct_params_data(a.P), ct_params_data(b.P), (size_t)ct_params_numel(a.P) * sizeof(float)) == 0);
    free_model(&a);
    free_model(&b);
    ct_dataset_free(train);
}

CT_TEST_MAIN()
