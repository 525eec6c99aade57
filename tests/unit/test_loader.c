/* Datasets and the loader: determinism across worker counts, exact mid-epoch resume,
 * token-shard validation. */
#include <stdio.h>
#include <unistd.h>

#include "ct_test.h"
#include "ctrain/loader.h"

static ct_dataset *toy(int64_t n) {
    float x[3 * 1000];
    int32_t y[1000];
    for (int64_t i = 0; i < n; i++) {
        for (int j = 0; j < 3; j++) x[i * 3 + j] = (float)(i * 10 + j);
        y[i] = (int32_t)(i % 7);
    }
    ct_dataset *d;
    ct_dataset_tensors(x, 3, y, 1, n, &d);
    return d;
}

/* all x values of epochs [0, 2) for rank 0 of 2, batch 4 */
static int run(ct_dataset *d, int workers, float *out, int64_t *nout) {
    ct_sampler_opts so = ct_sampler_default_opts();
    so.n = ct_dataset_len(d); so.num_replicas = 2; so.rank = 0; so.seed = 5;
    ct_sampler *s;
    if (ct_sampler_create(&so, &s) != CT_OK) return -1;
    ct_loader_opts lo = ct_loader_default_opts();
    lo.batch_size = 4; lo.workers = workers;
    ct_loader *L;
    if (ct_loader_create(d, s, &lo, &L) != CT_OK) return -1;
    int64_t k = 0;
    for (int e = 0; e < 2; e++) {
        ct_loader_start_epoch(L, e);
        ct_batch b;
        while (ct_loader_next(L, &b) == CT_OK && b.n > 0)
            for (int64_t i = 0; i < b.n * 3; i++) out[k++] = ((float *)b.x)[i];
    }
    *nout = k;
    ct_loader_free(L);
    ct_sampler_free(s);
    return 0;
}

CT_TEST(same_batches_whatever_the_worker_count) {
    ct_dataset *d = toy(37);
    static float a[1000], b[1000];
    int64_t na, nb;
    CT_ASSERT(run(d, 0, a, &na) == 0);
    CT_EXPECT_EQ(na, 2 * 19 * 3);
    for (int w = 1; w <= 3; w++) {
        CT_ASSERT(run(d, w, b, &nb) == 0);
        CT_EXPECT_EQ(na, nb);
        CT_EXPECT(memcmp(a, b, sizeof(float) * (size_t)na) == 0);
    }
    ct_dataset_free(d);
}

CT_TEST(resume_mid_epoch_gives_the_remaining_batches) {
    ct_dataset *d = toy(50);
    ct_sampler_opts so = ct_sampler_default_opts();
    so.n = 50; so.seed = 11;
    ct_loader_opts lo = ct_loader_default_opts();
    lo.batch_size = 6; lo.workers = 2;
    ct_sampler *s1, *s2;
    ct_loader *L1, *L2;
    ct_sampler_create(&so, &s1);
    ct_loader_create(d, s1, &lo, &L1);
    ct_loader_start_epoch(L1, 1);
    ct_batch b;
    for (int i = 0; i < 3; i++) ct_loader_next(L1, &b);
    ct_sampler_state st = ct_loader_state(L1);
    CT_EXPECT_EQ(st.epoch, 1);
    CT_EXPECT_EQ(st.position, 18);
    int64_t rest1[64], n1 = 0, rest2[64], n2 = 0;
    while (ct_loader_next(L1, &b) == CT_OK && b.n > 0)
        for (int64_t i = 0; i < b.n; i++) rest1[n1++] = b.idx[i];
    ct_sampler_create(&so, &s2);
    CT_EXPECT_OK(ct_sampler_set_state(s2, &st));
    ct_loader_create(d, s2, &lo, &L2);
    ct_loader_start_epoch(L2, st.epoch);
    while (ct_loader_next(L2, &b) == CT_OK && b.n > 0)
        for (int64_t i = 0; i < b.n; i++) rest2[n2++] = b.idx[i];
    CT_EXPECT_EQ(n1, 32);
    CT_EXPECT_EQ(n1, n2);
    CT_EXPECT(memcmp(rest1, rest2, sizeof(int64_t) * (size_t)n1) == 0);
    ct_loader_free(L1); ct_loader_free(L2); ct_sampler_free(s1); ct_sampler_free(s2);
    ct_dataset_free(d);
}

static void write_shard(const char *path, int32_t magic, int32_t version, int32_t count, int actual) {
    FILE *f = fopen(path, "wb");
    int32_t hdr[256] = {magic, version, count};
    fwrite(hdr, sizeof hdr, 1, f);
    for (int i = 0; i < actual; i++) { uint16_t t = (uint16_t)(i % 50); fwrite(&t, 2, 1, f); }
    fclose(f);
}

CT_TEST(token_shards_validated) {
    char p[64];
    snprintf(p, sizeof p, "/tmp/ct_shard_%d.bin", (int)getpid());
    const char *paths[1] = {p};
    ct_dataset *d;
    write_shard(p, 20240520, 1, 101, 101);
    CT_EXPECT_OK(ct_dataset_tokens_open(paths, 1, 10, &d));
    if (d) {
        CT_EXPECT_EQ(ct_dataset_len(d), 10);
        int32_t x[10], y[10];
        ct_dataset_get(d, 2, x, y);
        CT_EXPECT_EQ(x[0], 20);
        CT_EXPECT_EQ(y[9], 30);
        ct_dataset_free(d);
    }
    write_shard(p, 1234, 1, 101, 101);
    CT_EXPECT_EQ(ct_dataset_tokens_open(paths, 1, 10, &d), CT_ERR_FORMAT);
    CT_EXPECT(strstr(ct_last_error(), "magic") && strstr(ct_last_error(), p));
    write_shard(p, 20240520, 1, 200, 101);
    CT_EXPECT_EQ(ct_dataset_tokens_open(paths, 1, 10, &d), CT_ERR_FORMAT);
    CT_EXPECT(strstr(ct_last_error(), "200 tokens") != NULL);
    write_shard(p, 20240520, 7, 101, 101);
    CT_EXPECT_EQ(ct_dataset_tokens_open(paths, 1, 10, &d), CT_ERR_FORMAT);
    FILE *f = fopen(p, "wb"); fwrite("abc", 1, 3, f); fclose(f);
    CT_EXPECT_EQ(ct_dataset_tokens_open(paths, 1, 10, &d), CT_ERR_FORMAT);
    unlink(p);
    CT_EXPECT_EQ(ct_dataset_tokens_open(paths, 1, 10, &d), CT_ERR_NOT_FOUND);
}

/* Token ids a model cannot take are named by shard and index there, in one pass; only the
 * tokens a subset's windows read are checked. */
CT_TEST(token_ids_checked_against_a_vocabulary) {
    char p0[64], p1[64];
    snprintf(p0, sizeof p0, "/tmp/ct_shard_a_%d.bin", (int)getpid());
    snprintf(p1, sizeof p1, "/tmp/ct_shard_b_%d.bin", (int)getpid());
    write_shard(p0, 20240520, 1, 101, 101); /* tokens i % 50 */
    write_shard(p1, 20240520, 1, 101, 101);
    /* token 7 of the second shard becomes 70 (global index 108: window 10 at T = 10) */
    FILE *f = fopen(p1, "r+b");
    uint16_t big = 70;
    CT_ASSERT(f && fseek(f, 1024 + 2 * 7, SEEK_SET) == 0 && fwrite(&big, 2, 1, f) == 1);
    fclose(f);
    const char *paths[2] = {p0, p1};
    ct_dataset *d = NULL, *head = NULL, *tail = NULL;
    CT_ASSERT(ct_dataset_tokens_open(paths, 2, 10, &d) == CT_OK);
    CT_EXPECT(strcmp(ct_dataset_source(d), p0) == 0);
    CT_EXPECT_OK(ct_dataset_check_values(d, 71, 71, -1));
    CT_EXPECT_EQ(ct_dataset_check_values(d, 64, 64, -1), CT_ERR_FORMAT);
    CT_EXPECTF(strstr(ct_last_error(), p1) && strstr(ct_last_error(), "token id 70 at token index 7 (window 10)") &&
               strstr(ct_last_error(), "[0, 64)"), "message: %s", ct_last_error());
    /* token 108 is read by window 10 alone (input [100, 110), targets [101, 110]) */
    CT_ASSERT(ct_dataset_subset(d, 0, 10, &head) == CT_OK && ct_dataset_subset(d, 11, 9, &tail) == CT_OK);
    CT_EXPECT_EQ(ct_dataset_check_values(head, 0, 64, -1), CT_OK);  /* windows 0-9 read targets up to token 100 */
    CT_EXPECT_EQ(ct_dataset_check_values(tail, 64, 64, -1), CT_OK); /* windows 11- start at token 110 */
    CT_EXPECT_EQ(ct_dataset_check_values(head, 64, 0, -1), CT_OK);
    ct_dataset_free(head);
    CT_ASSERT(ct_dataset_subset(d, 0, 11, &head) == CT_OK);
    CT_EXPECT_EQ(ct_dataset_check_values(head, 0, 64, -1), CT_ERR_FORMAT);
    CT_EXPECT(strstr(ct_last_error(), "target token id 70") != NULL);
    ct_dataset_free(head);
    ct_dataset_free(tail);
    ct_dataset_free(d);
    unlink(p0);
    unlink(p1);
}

/* The writer's shards read back: version 1 (uint16) and 2 (uint32, ids past 65,535) mixed,
 * and the same ids from memory give the same windows. */
CT_TEST(token_shards_written_and_read_in_both_widths) {
    char p16[64], p32[64];
    snprintf(p16, sizeof p16, "/tmp/ct_shard16_%d.bin", (int)getpid());
    snprintf(p32, sizeof p32, "/tmp/ct_shard32_%d.bin", (int)getpid());
    int32_t ids[42];
    for (int i = 0; i < 42; i++) ids[i] = i < 21 ? i * 1000 : 70000 + i;
    CT_ASSERT(ct_token_shard_write(p16, ids, 21, CT_SHARD_VERSION_U16) == CT_OK);
    CT_EXPECT_EQ(ct_token_shard_write(p32, ids, 42, CT_SHARD_VERSION_U16), CT_ERR_INVALID);
    CT_EXPECT(strstr(ct_last_error(), "70021") != NULL);
    CT_ASSERT(ct_token_shard_write(p32, ids + 21, 21, CT_SHARD_VERSION_U32) == CT_OK);
    const char *paths[2] = {p16, p32};
    ct_dataset *d = NULL, *m = NULL;
    CT_ASSERT(ct_dataset_tokens_open(paths, 2, 5, &d) == CT_OK);
    CT_ASSERT(ct_dataset_tokens_from_ids(ids, 42, "ids", 5, &m) == CT_OK);
    CT_EXPECT_EQ(ct_dataset_len(d), 8);
    CT_EXPECT_EQ(ct_dataset_len(m), 8);
    CT_EXPECT_EQ(ct_dataset_num_classes(d), 70042);
    CT_EXPECT_EQ(ct_dataset_num_classes(m), 70042);
    CT_EXPECT(strcmp(ct_dataset_source(m), "ids") == 0);
    for (int64_t i = 0; i < 8; i++) {
        int32_t x[5], y[5], mx[5], my[5];
        ct_dataset_get(d, i, x, y);
        ct_dataset_get(m, i, mx, my);
        for (int j = 0; j < 5; j++) {
            CT_EXPECT_EQ(x[j], ids[i * 5 + j]);
            CT_EXPECT_EQ(y[j], ids[i * 5 + j + 1]);
            CT_EXPECT(mx[j] == x[j] && my[j] == y[j]);
        }
    }
    CT_EXPECT_EQ(ct_dataset_check_values(d, 70000, 0, -1), CT_ERR_FORMAT);
    CT_EXPECTF(strstr(ct_last_error(), p32) && strstr(ct_last_error(), "token id 70021 at token index 0"), "message: %s", ct_last_error());
    ct_dataset_free(d);
    ct_dataset_free(m);
    unlink(p16);
    unlink(p32);
}

/* In-memory labels: the ignore index passes, anything else outside the range is named. */
CT_TEST(labels_checked_against_classes) {
    float x[8] = {0};
    int32_t y[8] = {0, 1, 2, -100, 2, 1, 3, -1};
    ct_dataset *d = NULL;
    CT_ASSERT(ct_dataset_tensors(x, 1, y, 1, 8, &d) == CT_OK);
    CT_EXPECT_OK(ct_dataset_check_values(d, 0, 0, -100)); /* no limit: nothing checked */
    CT_EXPECT_EQ(ct_dataset_check_values(d, 0, 3, -100), CT_ERR_FORMAT);
    CT_EXPECTF(strstr(ct_last_error(), "target 3 of sample 6") != NULL, "message: %s", ct_last_error());
    CT_EXPECT_EQ(ct_dataset_check_values(d, 0, 4, -100), CT_ERR_FORMAT); /* -1 is not ignored */
    CT_EXPECTF(strstr(ct_last_error(), "target -1 of sample 7") != NULL, "message: %s", ct_last_error());
    CT_EXPECT_EQ(ct_dataset_check_values(d, 0, 4, -1), CT_ERR_FORMAT); /* ... nor -100 then */
    ct_dataset_free(d);
}

CT_TEST(fashion_mnist_images_normalised) {
    const char *dir = "/usr/share/datasets/fashion-mnist";
    char ip[256], lp[256];
    snprintf(ip, sizeof ip, "%s/t10k-images-idx3-ubyte.gz", dir);
    snprintf(lp, sizeof lp, "%s/t10k-labels-idx1-ubyte.gz", dir);
    if (access(ip, R_OK) != 0) CT_SKIP("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)");
    ct_dataset *d;
    CT_EXPECT_OK(ct_dataset_idx_open(ip, lp, &d));
    CT_ASSERT(d);
    CT_EXPECT_EQ(ct_dataset_len(d), 10000);
    CT_EXPECT_EQ(ct_dataset_num_classes(d), 10);
    float x[784];
    int32_t y;
    ct_dataset_get(d, 0, x, &y);
    CT_EXPECT_EQ(y, 9); /* first test label of Fashion-MNIST: ankle boot */
    CT_EXPECT_NEAR(x[0], (0.0f - 0.2860f) / 0.3530f, 1e-6);
    ct_dataset_free(d);
}
CT_TEST_MAIN()
