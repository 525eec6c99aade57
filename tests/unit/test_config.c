/* The configuration table (ctrain/config.h): defaults, valid and bad values of each type,
 * ct_config_set/unset, and changes made behind its back with setenv(). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ct_test.h"
#include "ctrain/config.h"

/* Sets name to text (NULL: unset) through the table; returns what ct_config_check says. */
static ct_status with(const char *name, const char *text) {
    ct_config_unset(name);
    if (text) setenv(name, text, 1); /* as a user would: bad values cannot go through ct_config_set */
    return ct_config_check((ct_config_var)ct_config_find(name));
}

CT_TEST(every_default_parses_and_is_used) {
    for (int k = 0; k < CT_CFG_COUNT_; k++) {
        const ct_config_info *c = ct_config_info_of((ct_config_var)k);
        CT_ASSERT(c && c->name && c->help && c->help[0]);
        CT_EXPECT_EQ(ct_config_find(c->name), k);
        ct_config_unset(c->name);
        CT_EXPECT(!ct_config_is_set((ct_config_var)k));
        CT_EXPECT_OK(ct_config_check((ct_config_var)k));
        /* unset: the accessors give the table's default */
        const char *s = ct_config_str((ct_config_var)k);
        CT_EXPECT((s == NULL) == (c->dflt == NULL));
        if (s && c->dflt) CT_EXPECT(!strcmp(s, c->dflt));
    }
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_TIMEOUT), 300, 0);
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_GRACE), 5, 0);
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_DDP_BUCKET_MB), 25, 0);
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_DDP_FIRST_BUCKET_MB), 1, 0);
    CT_EXPECT_EQ(ct_config_int(CT_CFG_RANK), 0);
    CT_EXPECT_EQ(ct_config_int(CT_CFG_WORLD_SIZE), 1);
    CT_EXPECT_EQ(ct_config_int(CT_CFG_MASTER_PORT), 29500);
    CT_EXPECT_EQ(ct_config_int(CT_CFG_LOCAL_WORLD_SIZE), 0); /* no default: the code derives one */
    CT_EXPECT_EQ(ct_config_int(CT_CFG_SHM_CHUNK), 0); /* no default: sized by the group (1 MiB for 2 ranks) */
    CT_EXPECT_EQ(ct_config_int(CT_CFG_SHM_SMALL), 16 << 10);
    CT_EXPECT(ct_config_bool(CT_CFG_FINGERPRINT) && ct_config_bool(CT_CFG_BIND) && ct_config_bool(CT_CFG_DDP_ZERO_COPY));
    CT_EXPECT(!ct_config_bool(CT_CFG_STORE_HOSTED));
    CT_EXPECT_EQ(ct_config_choice(CT_CFG_DEBUG), 1); /* WARN */
    CT_EXPECT_EQ(ct_config_choice(CT_CFG_BACKEND), -1);
    CT_EXPECT(!strcmp(ct_config_str(CT_CFG_MASTER_ADDR), "127.0.0.1"));
    CT_EXPECT(ct_config_str(CT_CFG_STORE_TOKEN) == NULL);
    CT_EXPECT(ct_config_find("NO_SUCH_VARIABLE") == -1);
    CT_EXPECT_OK(ct_config_load());
}

CT_TEST(valid_values_of_each_type) {
    CT_EXPECT_OK(with("CTRAIN_TIMEOUT", "12.5"));
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_TIMEOUT), 12.5, 0);
    CT_EXPECT_OK(with("WORLD_SIZE", "4"));
    CT_EXPECT_EQ(ct_config_int(CT_CFG_WORLD_SIZE), 4);
    CT_EXPECT_OK(with("OMP_NUM_THREADS", "3,2")); /* OpenMP's nested list: the first counts */
    CT_EXPECT_EQ(ct_config_int(CT_CFG_OMP_NUM_THREADS), 3);
    CT_EXPECT_OK(with("SLURM_NTASKS_PER_NODE", "2(x3)"));
    CT_EXPECT_EQ(ct_config_int(CT_CFG_SLURM_NTASKS_PER_NODE), 2);
    CT_EXPECT_OK(with("CTRAIN_SHM_CHUNK", "64k"));
    CT_EXPECT_EQ(ct_config_int(CT_CFG_SHM_CHUNK), 64 << 10);
    CT_EXPECT_OK(with("CTRAIN_SHM_CHUNK", "1M"));
    CT_EXPECT_EQ(ct_config_int(CT_CFG_SHM_CHUNK), 1 << 20);
    static const char *on[] = {"1", "true", "ON", "yes"}, *off[] = {"0", "False", "off", "no", "none"};
    for (int i = 0; i < 4; i++) {
        CT_EXPECT_OK(with("CTRAIN_BIND", on[i]));
        CT_EXPECT(ct_config_bool(CT_CFG_BIND));
    }
    for (int i = 0; i < 5; i++) {
        CT_EXPECT_OK(with("CTRAIN_BIND", off[i]));
        CT_EXPECT(!ct_config_bool(CT_CFG_BIND));
    }
    CT_EXPECT_OK(with("CTRAIN_DEBUG", "trace")); /* case-insensitive */
    CT_EXPECT_EQ(ct_config_choice(CT_CFG_DEBUG), 3);
    CT_EXPECT_OK(with("CTRAIN_BACKEND", "mpi"));
    CT_EXPECT_EQ(ct_config_choice(CT_CFG_BACKEND), 1);
    CT_EXPECT(!strcmp(ct_config_str(CT_CFG_BACKEND), "mpi"));
    CT_EXPECT_OK(with("CTRAIN_DATA_DIR", "/data/x"));
    CT_EXPECT(!strcmp(ct_config_str(CT_CFG_DATA_DIR), "/data/x"));
    CT_EXPECT_OK(with("CTRAIN_DATA_DIR", "")); /* empty is unset */
    CT_EXPECT(!ct_config_is_set(CT_CFG_DATA_DIR));
    CT_EXPECT(!strcmp(ct_config_str(CT_CFG_DATA_DIR), "/usr/share/datasets/fashion-mnist"));
    const char *vars[] = {"CTRAIN_TIMEOUT", "WORLD_SIZE", "OMP_NUM_THREADS", "SLURM_NTASKS_PER_NODE", "CTRAIN_SHM_CHUNK",
                          "CTRAIN_BIND", "CTRAIN_DEBUG", "CTRAIN_BACKEND", "CTRAIN_DATA_DIR"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) ct_config_unset(vars[i]);
    CT_EXPECT_OK(ct_config_load());
}

/* Each kind of bad value: the message names the variable, the value and what was expected;
 * the accessor falls back to the default. */
CT_TEST(bad_values_name_the_variable) {
    static const struct { const char *name, *text, *expect; } bad[] = {
        {"CTRAIN_TIMEOUT", "abc", "CTRAIN_TIMEOUT='abc': expected a number of seconds > 0"},
        {"CTRAIN_TIMEOUT", "0", "expected a number of seconds > 0"},
        {"CTRAIN_TIMEOUT", "5s", "expected a number of seconds > 0"},
        {"CTRAIN_TIMEOUT", "inf", "expected a number of seconds > 0"},
        {"CTRAIN_DDP_BUCKET_MB", "-1", "CTRAIN_DDP_BUCKET_MB='-1': expected a number of MiB > 0 and <= 1000000"},
        {"CTRAIN_DDP_BUCKET_MB", "2e6", "expected a number of MiB > 0 and <= 1000000"},
        {"RANK", "x", "RANK='x': expected an integer >= 0"},
        {"RANK", "-1", "RANK='-1': expected an integer >= 0"},
        {"RANK", "3(x2)", "expected an integer >= 0"}, /* the list suffix is Slurm's and OpenMP's only */
        {"WORLD_SIZE", "0", "WORLD_SIZE='0': expected an integer >= 1"},
        {"WORLD_SIZE", "99999999999999999999", "expected an integer >= 1"},
        {"MASTER_PORT", "65536", "MASTER_PORT='65536': expected an integer between 1 and 65535"},
        {"CTRAIN_DDP_ZERO_COPY", "maybe", "CTRAIN_DDP_ZERO_COPY='maybe': expected 1, true, on, yes or 0, false, off, no"},
        {"CTRAIN_DEBUG", "loud", "CTRAIN_DEBUG='loud': expected one of ERROR, WARN, INFO, TRACE"},
        {"CTRAIN_BACKEND", "bogus", "CTRAIN_BACKEND='bogus': expected one of shm, mpi"},
        {"CTRAIN_SHM_CHUNK", "1k", "CTRAIN_SHM_CHUNK='1k': expected a size in bytes between 4096"},
        {"CTRAIN_SHM_CHUNK", "64q", "expected a size in bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ct_status st = with(bad[i].name, bad[i].text);
        CT_EXPECT_EQ(st, CT_ERR_INVALID);
        if (!strstr(ct_last_error(), bad[i].expect)) CT_FAILF("%s='%s': got '%s'", bad[i].name, bad[i].text, ct_last_error());
        CT_EXPECT(ct_config_is_set((ct_config_var)ct_config_find(bad[i].name))); /* present, though bad */
        CT_EXPECT_EQ(ct_config_load(), CT_ERR_INVALID);
        CT_EXPECT(strstr(ct_last_error(), bad[i].name) != NULL);
        ct_config_unset(bad[i].name);
    }
    /* the accessors never fail: the default, with a warning on stderr */
    setenv("CTRAIN_TIMEOUT", "soon", 1);
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_TIMEOUT), 300, 0);
    setenv("CTRAIN_DEBUG", "loud", 1);
    CT_EXPECT_EQ(ct_config_choice(CT_CFG_DEBUG), 1);
    setenv("RANK", "x", 1);
    CT_EXPECT_EQ(ct_config_int(CT_CFG_RANK), 0);
    ct_config_unset("CTRAIN_TIMEOUT");
    ct_config_unset("CTRAIN_DEBUG");
    ct_config_unset("RANK");
    CT_EXPECT_OK(ct_config_load());
}

CT_TEST(set_validates_and_updates_environment_and_cache) {
    CT_EXPECT_OK(ct_config_set("CTRAIN_TIMEOUT", "7"));
    CT_EXPECT(getenv("CTRAIN_TIMEOUT") && !strcmp(getenv("CTRAIN_TIMEOUT"), "7"));
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_TIMEOUT), 7, 0);
    CT_EXPECT(ct_config_is_set(CT_CFG_TIMEOUT));
    /* a bad value is refused and changes nothing */
    CT_EXPECT_EQ(ct_config_set("CTRAIN_TIMEOUT", "-1"), CT_ERR_INVALID);
    CT_EXPECT(strstr(ct_last_error(), "CTRAIN_TIMEOUT='-1'") != NULL);
    CT_EXPECT(!strcmp(getenv("CTRAIN_TIMEOUT"), "7"));
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_TIMEOUT), 7, 0);
    /* names outside the table are refused: the table lists everything ctrain touches */
    CT_EXPECT_EQ(ct_config_set("CTRAIN_NO_SUCH_THING", "1"), CT_ERR_INVALID);
    CT_EXPECT(strstr(ct_last_error(), "CTRAIN_NO_SUCH_THING") != NULL);
    CT_EXPECT(getenv("CTRAIN_NO_SUCH_THING") == NULL);
    CT_EXPECT_EQ(ct_config_unset("CTRAIN_NO_SUCH_THING"), CT_ERR_INVALID);
    CT_EXPECT_OK(ct_config_unset("CTRAIN_TIMEOUT"));
    CT_EXPECT(getenv("CTRAIN_TIMEOUT") == NULL);
    CT_EXPECT(!ct_config_is_set(CT_CFG_TIMEOUT));
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_TIMEOUT), 300, 0);
}

/* What the launcher relies on: values set in a fork()ed child are what the child reads
 * (the parent's cache is not), and the parent is untouched. */
CT_TEST(hier_allreduce_auto_is_ordered_on_two_machines_rail_beyond) {
    CT_EXPECT_OK(ct_config_unset("CTRAIN_HIER_ALLREDUCE"));
    CT_EXPECT_EQ(ct_config_hier_allreduce(2), CT_HIER_ORDERED);
    CT_EXPECT_EQ(ct_config_hier_allreduce(3), CT_HIER_RAIL);
    CT_EXPECT_OK(ct_config_set("CTRAIN_HIER_ALLREDUCE", "ordered"));
    CT_EXPECT_EQ(ct_config_hier_allreduce(8), CT_HIER_ORDERED);
    CT_EXPECT_OK(ct_config_set("CTRAIN_HIER_ALLREDUCE", "tree"));
    CT_EXPECT_EQ(ct_config_hier_allreduce(2), CT_HIER_TREE);
    CT_EXPECT_OK(ct_config_set("CTRAIN_HIER_ALLREDUCE", "rail"));
    CT_EXPECT_EQ(ct_config_hier_allreduce(2), CT_HIER_RAIL);
    CT_EXPECT_OK(ct_config_unset("CTRAIN_HIER_ALLREDUCE"));
}

CT_TEST(set_in_forked_child_is_seen_there_only) {
    CT_EXPECT_OK(ct_config_set("RANK", "0"));
    CT_EXPECT_EQ(ct_config_int(CT_CFG_RANK), 0); /* cached in the parent */
    pid_t pid = fork();
    CT_ASSERT(pid >= 0);
    if (pid == 0) {
        int ok = ct_config_set("RANK", "5") == CT_OK && ct_config_int(CT_CFG_RANK) == 5 &&
                 !strcmp(getenv("RANK"), "5") && ct_config_unset("OMPI_COMM_WORLD_SIZE") == CT_OK &&
                 !ct_config_is_set(CT_CFG_OMPI_SIZE);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CT_EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CT_EXPECT_EQ(ct_config_int(CT_CFG_RANK), 0);
    ct_config_unset("RANK");
}

/* Programs (and tests) that call setenv() themselves after the first read are still seen. */
CT_TEST(setenv_behind_the_tables_back_is_seen) {
    ct_config_unset("CTRAIN_GRACE");
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_GRACE), 5, 0);
    setenv("CTRAIN_GRACE", "2", 1);
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_GRACE), 2, 0);
    setenv("CTRAIN_GRACE", "0.5", 1);
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_GRACE), 0.5, 0);
    unsetenv("CTRAIN_GRACE");
    CT_EXPECT(!ct_config_is_set(CT_CFG_GRACE));
    CT_EXPECT_NEAR(ct_config_float(CT_CFG_GRACE), 5, 0);
}

static void *reader(void *arg) {
    long bad = 0;
    for (int i = 0; i < 20000; i++) {
        double t = ct_config_float(CT_CFG_TIMEOUT);
        bad += !(t == 300 || t == 9);
        bad += ct_config_int(CT_CFG_MASTER_PORT) != 29500;
    }
    *(long *)arg = bad;
    return NULL;
}

/* Readers on several threads while another changes a variable: every read sees either the
 * old or the new value (run it under -fsanitize=thread to see the locking too). */
CT_TEST(concurrent_reads_and_sets) {
    ct_config_unset("CTRAIN_TIMEOUT");
    ct_config_unset("MASTER_PORT");
    pthread_t th[4];
    long bad[4] = {0};
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, reader, &bad[i]);
    for (int i = 0; i < 2000; i++) CT_EXPECT_OK(i & 1 ? ct_config_unset("CTRAIN_TIMEOUT") : ct_config_set("CTRAIN_TIMEOUT", "9"));
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CT_EXPECT_EQ(bad[i], 0);
    }
    ct_config_unset("CTRAIN_TIMEOUT");
}

CT_TEST(expected_text_and_type_names) {
    char exp[256];
    ct_config_expected(CT_CFG_DEBUG, exp, sizeof exp);
    CT_EXPECT(!strcmp(exp, "one of ERROR, WARN, INFO, TRACE"));
    ct_config_expected(CT_CFG_MASTER_PORT, exp, sizeof exp);
    CT_EXPECT(!strcmp(exp, "an integer between 1 and 65535"));
    ct_config_expected(CT_CFG_TIMEOUT, exp, sizeof exp);
    CT_EXPECT(!strcmp(exp, "a number of seconds > 0"));
    ct_config_expected(CT_CFG_DATA_DIR, exp, sizeof exp);
    CT_EXPECT(!strcmp(exp, "any text"));
    CT_EXPECT(!strcmp(ct_config_type_name(CT_CFG_BYTES), "bytes"));
    CT_EXPECT(ct_config_info_of(CT_CFG_COUNT_) == NULL);
    CT_EXPECT(ct_config_info_of(CT_CFG_PATH)->type == CT_CFG_STRING);
}

CT_TEST_MAIN()
