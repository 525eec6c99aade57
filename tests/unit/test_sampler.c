/* DistributedSampler: indices identical to PyTorch 1.13's (fixture from
 * tests/torch/gen_sampler.py), resume semantics, argument checks. */
#include "ct_test.h"
#include "ctrain/data.h"
#include "ctrain/io.h"

#define FIXTURE "tests/fixtures/sampler/distributed_sampler.safetensors"

static int64_t get_i64(const void *p, int64_t i) {
    int64_t v;
    memcpy(&v, (const char *)p + 8 * i, 8);
    return v;
}

static ct_sampler *make(int64_t n, int R, int rank, bool shuffle, uint64_t seed, bool drop_last) {
    ct_sampler_opts o = ct_sampler_default_opts();
    o.n = n;
    o.num_replicas = R;
    o.rank = rank;
    o.shuffle = shuffle;
    o.seed = seed;
    o.drop_last = drop_last;
    ct_sampler *s = NULL;
    if (ct_sampler_create(&o, &s) != CT_OK) CT_FATAL("sampler create: %s", ct_last_error());
    return s;
}

CT_TEST(matches_pytorch) {
    ct_st_file *f;
    ct_status st = ct_st_open(FIXTURE, &f);
    if (st != CT_OK) { CT_FAILF("%s", ct_last_error()); return; }
    int ncases = atoi(ct_st_metadata(f, "cases"));
    CT_ASSERT(ncases > 200);
    int checked = 0;
    for (int k = 0; k < ncases; k++) {
        char name[64];
        ct_st_tensor p, idx, head, hash;
        snprintf(name, sizeof name, "case.%d.params", k);
        CT_EXPECT_OK(ct_st_get(f, name, &p));
        int64_t n = get_i64(p.data, 0), R = get_i64(p.data, 1), shuffle = get_i64(p.data, 2), seed = get_i64(p.data, 3),
                epoch = get_i64(p.data, 4), drop_last = get_i64(p.data, 5), full = get_i64(p.data, 6),
                ns = get_i64(p.data, 7);
        if (full) {
            snprintf(name, sizeof name, "case.%d.idx", k);
            CT_EXPECT_OK(ct_st_get(f, name, &idx));
        } else {
            snprintf(name, sizeof name, "case.%d.head", k);
            CT_EXPECT_OK(ct_st_get(f, name, &head));
            snprintf(name, sizeof name, "case.%d.hash", k);
            CT_EXPECT_OK(ct_st_get(f, name, &hash));
        }
        int64_t *buf = malloc((size_t)(ns + 1) * sizeof *buf);
        for (int r = 0; r < R; r++) {
            ct_sampler *s = make(n, (int)R, r, shuffle, (uint64_t)seed, drop_last);
            ct_sampler_set_epoch(s, epoch);
            CT_EXPECT_EQ(ct_sampler_len(s), ns);
            int64_t got = 0, v;
            while (ct_sampler_next(s, &v)) {
                if (got < ns) buf[got] = v;
                got++;
            }
            CT_EXPECT(!ct_sampler_next(s, &v));
            if (got != ns) { CT_FAILF("case %d rank %d: %lld indices, want %lld", k, r, (long long)got, (long long)ns); }
            else if (full) {
                for (int64_t j = 0; j < ns; j++) {
                    int32_t want;
                    memcpy(&want, (const char *)idx.data + 4 * (r * ns + j), 4);
                    if (buf[j] != want) {
                        CT_FAILF("case %d (n=%lld R=%lld shuffle=%lld seed=%llu epoch=%lld drop_last=%lld) rank %d [%lld]: %lld, want %d",
                                 k, (long long)n, (long long)R, (long long)shuffle, (unsigned long long)seed, (long long)epoch,
                                 (long long)drop_last, r, (long long)j, (long long)buf[j], want);
                        break;
                    }
                }
            } else {
                int64_t hl = head.shape[1];
                for (int64_t j = 0; j < hl; j++)
                    if (buf[j] != get_i64(head.data, r * hl + j)) {
                        CT_FAILF("case %d (n=%lld R=%lld) rank %d head[%lld] = %lld, want %lld", k, (long long)n, (long long)R, r,
                                 (long long)j, (long long)buf[j], (long long)get_i64(head.data, r * hl + j));
                        break;
                    }
                uint64_t h = 0xcbf29ce484222325ull;
                for (int64_t j = 0; j < ns; j++) h = (h ^ (uint64_t)buf[j]) * 0x100000001b3ull;
                if (h != (uint64_t)get_i64(hash.data, r))
                    CT_FAILF("case %d (n=%lld R=%lld seed=%lld epoch=%lld) rank %d: hash differs", k, (long long)n, (long long)R,
                             (long long)seed, (long long)epoch, r);
            }
            ct_sampler_free(s);
            checked++;
        }
        free(buf);
    }
    CT_EXPECT(checked > 500);
    ct_st_close(f);
}

/* Draw everything of one rank into out; returns the count. */
static int64_t drain(ct_sampler *s, int64_t *out) {
    int64_t k = 0, v;
    while (ct_sampler_next(s, &v)) out[k++] = v;
    return k;
}

CT_TEST(resume_same_ranks) {
    const int64_t ns[] = {10, 11, 13, 1000};
    for (int a = 0; a < 4; a++)
        for (int R = 1; R <= 4; R++)
            for (int dl = 0; dl < 2; dl++) {
                int64_t n = ns[a];
                int64_t full[4][1100];
                int64_t cnt = 0;
                for (int r = 0; r < R; r++) {
                    ct_sampler *s = make(n, R, r, true, 17, dl);
                    ct_sampler_set_epoch(s, 3);
                    cnt = drain(s, full[r]);
                    ct_sampler_free(s);
                }
                for (int64_t stop = 0; stop <= cnt; stop += (cnt > 20 ? 7 : 1)) {
                    ct_sampler_state saved = {0};
                    for (int r = 0; r < R; r++) { /* each rank draws `stop` indices, then saves */
                        ct_sampler *s = make(n, R, r, true, 17, dl);
                        ct_sampler_set_epoch(s, 3);
                        int64_t v;
                        for (int64_t j = 0; j < stop; j++) CT_ASSERT(ct_sampler_next(s, &v) && v == full[r][j]);
                        ct_sampler_state st = ct_sampler_get_state(s);
                        CT_EXPECT_EQ(st.position, stop * R);
                        CT_EXPECT_EQ(st.epoch, 3);
                        if (r == 0) saved = st;
                        ct_sampler_free(s);
                    }
                    for (int r = 0; r < R; r++) { /* fresh process, seed from opts differs: state wins */
                        ct_sampler *s = make(n, R, r, true, 999, dl);
                        CT_EXPECT_OK(ct_sampler_set_state(s, &saved));
                        ct_sampler_set_epoch(s, 3); /* the usual loop calls it: keeps the position */
                        CT_EXPECT_EQ(ct_sampler_remaining(s), cnt - stop);
                        int64_t rest[1100];
                        int64_t k = drain(s, rest);
                        CT_EXPECT_EQ(k, cnt - stop);
                        for (int64_t j = 0; j < k && j + stop < cnt; j++)
                            if (rest[j] != full[r][stop + j]) {
                                CT_FAILF("n=%lld R=%d dl=%d stop=%lld rank %d: resumed [%lld] = %lld, want %lld", (long long)n, R, dl,
                                         (long long)stop, r, (long long)j, (long long)rest[j], (long long)full[r][stop + j]);
                                break;
                            }
                        /* the next epoch is a normal fresh one */
                        ct_sampler_set_epoch(s, 4);
                        CT_EXPECT_EQ(ct_sampler_get_state(s).position, 0);
                        CT_EXPECT_EQ(ct_sampler_remaining(s), cnt);
                        ct_sampler_free(s);
                    }
                }
            }
}

/* Saved with R ranks, resumed with R2: every sample not yet seen is visited, in the order
 * of the epoch's permutation, shared out rank-strided. */
CT_TEST(resume_other_rank_count) {
    const int64_t n = 103;
    int64_t perm[103];
    ct_sampler *one = make(n, 1, 0, true, 5, false);
    ct_sampler_set_epoch(one, 2);
    CT_ASSERT(drain(one, perm) == n);
    ct_sampler_free(one);
    for (int R = 1; R <= 4; R++)
        for (int R2 = 1; R2 <= 5; R2++)
            for (int dl = 0; dl < 2; dl++)
                for (int64_t k = 0; k * R <= n; k += 5) {
                    int64_t p = k * R;
                    int seen[103] = {0};
                    for (int64_t i = 0; i < p && i < n; i++) seen[perm[i]]++;
                    ct_sampler_state st = {.seed = 5, .epoch = 2, .position = p};
                    int64_t want_cnt = p >= n ? 0 : dl ? (n - p) / R2 : (n - p + R2 - 1) / R2;
                    for (int r = 0; r < R2; r++) {
                        ct_sampler *s = make(n, R2, r, true, 0, dl);
                        CT_EXPECT_OK(ct_sampler_set_state(s, &st));
                        int64_t got[110];
                        int64_t c = drain(s, got);
                        CT_EXPECT_EQ(c, want_cnt);
                        for (int64_t j = 0; j < c; j++) {
                            int64_t pos = p + r + j * R2;
                            if (got[j] != perm[pos % n]) { CT_FAILF("R=%d R2=%d p=%lld rank %d [%lld]", R, R2, (long long)p, r, (long long)j); break; }
                            if (pos < n) seen[got[j]]++;
                        }
                        CT_EXPECT_EQ(ct_sampler_get_state(s).position, p + c * R2);
                        ct_sampler_free(s);
                    }
                    if (!dl) /* without drop_last nothing is lost */
                        for (int i = 0; i < n; i++)
                            if (seen[i] != 1) { CT_FAILF("R=%d R2=%d p=%lld: sample %d seen %d times", R, R2, (long long)p, i, seen[i]); break; }
                }
}

CT_TEST(epochs_and_batches) {
    ct_sampler *a = make(50, 2, 1, true, 3, false), *b = make(50, 2, 1, true, 3, false);
    int64_t x[25], y[25], v;
    ct_sampler_set_epoch(a, 0);
    CT_EXPECT_EQ(drain(a, x), 25);
    CT_EXPECT(!ct_sampler_next(a, &v));
    CT_EXPECT_EQ(ct_sampler_remaining(a), 0);
    ct_sampler_set_epoch(a, 1);
    CT_EXPECT_EQ(drain(a, y), 25);
    CT_EXPECT(memcmp(x, y, sizeof x) != 0); /* epochs differ */
    ct_sampler_set_epoch(a, 0);
    CT_EXPECT_EQ(drain(a, y), 25);
    CT_EXPECT(memcmp(x, y, sizeof x) == 0); /* and repeat */
    /* batches give the same stream */
    int64_t z[25], k = 0, got;
    while ((got = ct_sampler_next_batch(b, z + k, 7)) > 0) k += got;
    CT_EXPECT_EQ(k, 25);
    CT_EXPECT(memcmp(x, z, sizeof x) == 0);
    /* set_state then set_epoch of a different epoch: a fresh start of that epoch */
    ct_sampler_state st = {.seed = 3, .epoch = 0, .position = 20};
    CT_EXPECT_OK(ct_sampler_set_state(a, &st));
    ct_sampler_set_epoch(a, 1);
    CT_EXPECT_EQ(ct_sampler_remaining(a), 25);
    /* a finished-epoch state: nothing left */
    st.position = 50;
    CT_EXPECT_OK(ct_sampler_set_state(a, &st));
    CT_EXPECT(!ct_sampler_next(a, &v));
    st.position = -1;
    CT_EXPECT_EQ(ct_sampler_set_state(a, &st), CT_ERR_INVALID);
    ct_sampler_free(a);
    ct_sampler_free(b);
}

CT_TEST(bad_options) {
    ct_sampler_opts o = ct_sampler_default_opts();
    ct_sampler *s = (ct_sampler *)1;
    CT_EXPECT(o.shuffle && !o.drop_last && o.seed == 0 && o.num_replicas == 1);
    o.n = -1;
    CT_EXPECT_EQ(ct_sampler_create(&o, &s), CT_ERR_INVALID);
    CT_EXPECT(s == NULL);
    o.n = 10;
    o.num_replicas = 0;
    CT_EXPECT_EQ(ct_sampler_create(&o, &s), CT_ERR_INVALID);
    o.num_replicas = 2;
    o.rank = 2;
    CT_EXPECT_EQ(ct_sampler_create(&o, &s), CT_ERR_INVALID);
    CT_EXPECT(strstr(ct_last_error(), "rank 2") != NULL);
    o.rank = -1;
    CT_EXPECT_EQ(ct_sampler_create(&o, &s), CT_ERR_INVALID);
}

CT_TEST_MAIN()
