/* Metrics: JSONL rows parse, the event file decodes (both CRCs, protobuf fields) with a
 * decoder written here independently of the writer, bad directories and full files give
 * clear errors, the SVG chart is complete. CT_METRICS_KEEP=<dir> makes `tensorboard_fixture`
 * write into <dir> and keep it (tests/scripts/metrics_tensorboard.sh reads it with TensorBoard). */
#include "ct_test.h"
#include "ctrain/metrics.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---------------- helpers ---------------- */

static char *tmpdir(void) {
    static char buf[8][64];
    static int k;
    char *d = buf[k++ % 8];
    snprintf(d, 64, "/tmp/ct_metrics_XXXXXX");
    return mkdtemp(d);
}

static void rm_rf(const char *path) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "  could not remove %s\n", path);
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    size_t got = fread(b, 1, (size_t)sz, f);
    fclose(f);
    b[got] = 0;
    if (n) *n = got;
    return b;
}

/* Path of the single events.out.tfevents.* file in dir (count returned in *count). */
static int find_events(const char *dir, char *out, size_t n) {
    DIR *d = opendir(dir);
    int count = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0) {
            snprintf(out, n, "%s/%s", dir, e->d_name);
            count++;
        }
    if (d) closedir(d);
    return count;
}

static size_t count_str(const char *s, const char *needle) {
    size_t c = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) c++;
    return c;
}

/* ---------------- an independent TFRecord / Event decoder ---------------- */

static uint32_t crc32c_bitwise(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return ~c;
}
static uint32_t mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }
static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

typedef struct {
    double wall;
    int64_t step;
    char file_version[64];
    int nvalues;
    char tag[4][300];
    float value[4];
    int has_simple[4];
} event;

static int pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    *v = 0;
    for (int s = 0; s < 64; s += 7) {
        if (*p >= end) return -1;
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) return 0;
    }
    return -1;
}

/* Calls fn(field, wire, varint, ptr, len) for each field; returns -1 on malformed input. */
typedef int (*pb_fn)(void *ctx, int field, int wire, uint64_t v, const uint8_t *p, size_t len);
static int pb_walk(const uint8_t *p, size_t n, pb_fn fn, void *ctx) {
    const uint8_t *end = p + n;
    while (p < end) {
        uint64_t key, v = 0, len = 0;
        if (pb_varint(&p, end, &key)) return -1;
        int wire = key & 7, field = (int)(key >> 3);
        const uint8_t *q = p;
        if (wire == 0) { if (pb_varint(&p, end, &v)) return -1; }
        else if (wire == 1) { if (end - p < 8) return -1; v = le(p, 8); p += 8; len = 8; }
        else if (wire == 5) { if (end - p < 4) return -1; v = le(p, 4); p += 4; len = 4; }
        else if (wire == 2) {
            if (pb_varint(&p, end, &len) || len > (uint64_t)(end - p)) return -1;
            q = p;
            p += len;
        } else return -1;
        if (fn(ctx, field, wire, v, q, (size_t)len)) return -1;
    }
    return 0;
}

static int value_fn(void *ctx, int field, int wire, uint64_t v, const uint8_t *p, size_t len) {
    event *e = ctx;
    int k = e->nvalues - 1;
    if (field == 1 && wire == 2) {
        if (len >= sizeof e->tag[0]) return -1;
        memcpy(e->tag[k], p, len);
        e->tag[k][len] = 0;
    } else if (field == 2 && wire == 5) {
        uint32_t b = (uint32_t)v;
        memcpy(&e->value[k], &b, 4);
        e->has_simple[k] = 1;
    }
    return 0;
}
static int summary_fn(void *ctx, int field, int wire, uint64_t v, const uint8_t *p, size_t len) {
    (void)v;
    event *e = ctx;
    if (field != 1 || wire != 2 || e->nvalues >= 4) return -1;
    e->nvalues++;
    return pb_walk(p, len, value_fn, e);
}
static int event_fn(void *ctx, int field, int wire, uint64_t v, const uint8_t *p, size_t len) {
    event *e = ctx;
    if (field == 1 && wire == 1) memcpy(&e->wall, &v, 8);
    else if (field == 2 && wire == 0) e->step = (int64_t)v;
    else if (field == 3 && wire == 2) {
        if (len >= sizeof e->file_version) return -1;
        memcpy(e->file_version, p, len);
        e->file_version[len] = 0;
    } else if (field == 5 && wire == 2) return pb_walk(p, len, summary_fn, e);
    else return -1; /* the writer emits nothing else */
    return 0;
}

/* Decodes every record of an event file, checking both CRCs of each. Returns the number of
 * events (at most cap), or -1 with a message if the framing or a CRC is wrong. */
static int read_events(const char *path, event *ev, int cap) {
    size_t n;
    uint8_t *b = (uint8_t *)read_all(path, &n);
    if (!b) { fprintf(stderr, "  cannot read %s\n", path); return -1; }
    size_t off = 0;
    int count = 0;
    while (off < n) {
        if (n - off < 12) { fprintf(stderr, "  truncated header at %zu\n", off); count = -1; break; }
        uint64_t len = le(b + off, 8);
        if ((uint32_t)le(b + off + 8, 4) != mask(crc32c_bitwise(b + off, 8))) {
            fprintf(stderr, "  bad length crc at %zu\n", off); count = -1; break;
        }
        if (len > n - off - 16) { fprintf(stderr, "  truncated record at %zu\n", off); count = -1; break; }
        const uint8_t *data = b + off + 12;
        if ((uint32_t)le(data + len, 4) != mask(crc32c_bitwise(data, len))) {
            fprintf(stderr, "  bad data crc at %zu\n", off); count = -1; break;
        }
        if (count < cap) {
            memset(&ev[count], 0, sizeof ev[count]);
            if (pb_walk(data, len, event_fn, &ev[count])) {
                fprintf(stderr, "  malformed Event at %zu\n", off); count = -1; break;
            }
        }
        count++;
        off += 12 + len + 4;
    }
    free(b);
    return count;
}

/* ---------------- tests ---------------- */

CT_TEST(crc32c_reference) {
    /* The check value of CRC-32C (RFC 3720 appendix) — guards the test's own decoder. */
    CT_EXPECT_EQ(crc32c_bitwise((const uint8_t *)"123456789", 9), 0xE3069283u);
}

static void write_sample(ct_metrics *m) {
    CT_EXPECT_OK(ct_metrics_scalar(m, "train/loss", 1, 2.302585));
    CT_EXPECT_OK(ct_metrics_scalar(m, "train/lr", 1, 0.1));
    CT_EXPECT_OK(ct_metrics_scalar(m, "train/loss", 2, 1.5));
    CT_EXPECT_OK(ct_metrics_scalar(m, "train/lr", 2, 0.05));
    CT_EXPECT_OK(ct_metrics_scalar(m, "eval/accuracy", 2, 0.8125));
    CT_EXPECT_OK(ct_metrics_scalar(m, "train/loss", 3, NAN));
    CT_EXPECT_OK(ct_metrics_scalar(m, "train/samples_per_s", 3, 12345.5));
    CT_EXPECT_OK(ct_metrics_scalar(m, "train/loss", 4000000000LL, -INFINITY));
}

CT_TEST(jsonl_lines_parse) {
    char *dir = tmpdir();
    ct_metrics *m;
    CT_ASSERT(dir);
    CT_EXPECT_OK(ct_metrics_open(dir, &m));
    CT_ASSERT(m);
    double t0 = (double)time(NULL);
    write_sample(m);
    ct_metrics_close(m);

    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    char *txt = read_all(path, NULL);
    CT_ASSERT(txt);
    struct { int64_t step; int nkeys; } want[] = {{1, 4}, {2, 5}, {3, 4}, {4000000000LL, 3}};
    int line = 0;
    for (char *s = strtok(txt, "\n"); s; s = strtok(NULL, "\n"), line++) {
        cJSON *j = cJSON_Parse(s);
        CT_EXPECT(j != NULL);
        if (!j) { fprintf(stderr, "  line %d: %s\n", line, s); continue; }
        CT_ASSERT(line < 4);
        CT_EXPECT_EQ(cJSON_GetArraySize(j), want[line].nkeys);
        cJSON *step = cJSON_GetObjectItemCaseSensitive(j, "step");
        CT_EXPECT(cJSON_IsNumber(step) && (int64_t)step->valuedouble == want[line].step);
        cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "time");
        CT_EXPECT(cJSON_IsNumber(t) && fabs(t->valuedouble - t0) < 120);
        cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "train/loss");
        if (line == 0) {
            CT_EXPECT(cJSON_IsNumber(loss) && loss->valuedouble == 2.302585);
            cJSON *lr = cJSON_GetObjectItemCaseSensitive(j, "train/lr");
            CT_EXPECT(cJSON_IsNumber(lr) && lr->valuedouble == 0.1);
            CT_EXPECT(strstr(s, "\"train/lr\": 0.1}") != NULL); /* shortest exact form */
        } else if (line == 1) {
            cJSON *acc = cJSON_GetObjectItemCaseSensitive(j, "eval/accuracy");
            CT_EXPECT(cJSON_IsNumber(acc) && acc->valuedouble == 0.8125);
        } else if (line == 2) {
            CT_EXPECT(cJSON_IsNull(loss));
            cJSON *sps = cJSON_GetObjectItemCaseSensitive(j, "train/samples_per_s");
            CT_EXPECT(cJSON_IsNumber(sps) && sps->valuedouble == 12345.5);
        } else {
            CT_EXPECT(cJSON_IsNull(loss));
        }
        cJSON_Delete(j);
    }
    CT_EXPECT_EQ(line, 4);
    free(txt);

    /* A second writer (a resumed run) appends to metrics.jsonl and gets its own event file. */
    CT_EXPECT_OK(ct_metrics_open(dir, &m));
    CT_EXPECT_OK(ct_metrics_scalar(m, "train/loss", 5, 0.25));
    CT_EXPECT_OK(ct_metrics_flush(m));
    ct_metrics_close(m);
    txt = read_all(path, NULL);
    CT_EXPECT_EQ(count_str(txt, "\n"), 5);
    CT_EXPECT(strstr(txt, "{\"step\": 5, ") != NULL);
    free(txt);
    char ev[512];
    CT_EXPECT_EQ(find_events(dir, ev, sizeof ev), 2);
    rm_rf(dir);
}

CT_TEST(event_file_decodes) {
    char *dir = tmpdir();
    ct_metrics *m;
    CT_ASSERT(dir);
    CT_EXPECT_OK(ct_metrics_open(dir, &m));
    double t0 = (double)time(NULL);
    write_sample(m);
    CT_EXPECT_OK(ct_metrics_flush(m));

    char path[512];
    CT_ASSERT(find_events(dir, path, sizeof path) == 1);
    /* File name: events.out.tfevents.<unix time>.<hostname>.<pid>.ctrain */
    char host[256] = {0}, suffix[300];
    gethostname(host, sizeof host - 1);
    snprintf(suffix, sizeof suffix, ".%s.%ld.ctrain", host, (long)getpid());
    CT_EXPECT(strlen(path) > strlen(suffix) && strcmp(path + strlen(path) - strlen(suffix), suffix) == 0);
    long long ft = atoll(strstr(path, "tfevents.") + 9);
    CT_EXPECT(llabs(ft - (long long)t0) < 120);

    event ev[16];
    int n = read_events(path, ev, 16); /* readable while open: flush wrote everything */
    CT_EXPECT_EQ(n, 9);
    ct_metrics_close(m);
    n = read_events(path, ev, 16);
    CT_ASSERT(n == 9);
    CT_EXPECT(strcmp(ev[0].file_version, "brain.Event:2") == 0);
    CT_EXPECT_EQ(ev[0].nvalues, 0);
    struct { const char *tag; int64_t step; float v; } want[] = {
        {"train/loss", 1, 2.302585f}, {"train/lr", 1, 0.1f}, {"train/loss", 2, 1.5f},
        {"train/lr", 2, 0.05f}, {"eval/accuracy", 2, 0.8125f}, {"train/loss", 3, NAN},
        {"train/samples_per_s", 3, 12345.5f}, {"train/loss", 4000000000LL, -INFINITY}};
    for (int i = 0; i < 8; i++) {
        event *e = &ev[i + 1];
        CT_EXPECT(fabs(e->wall - t0) < 120);
        CT_EXPECT(e->wall >= ev[i].wall);
        CT_EXPECT_EQ(e->step, want[i].step);
        CT_EXPECT_EQ(e->nvalues, 1);
        CT_EXPECT(e->has_simple[0]);
        CT_EXPECT(strcmp(e->tag[0], want[i].tag) == 0);
        if (isnan(want[i].v)) CT_EXPECT(isnan(e->value[0]));
        else CT_EXPECT(e->value[0] == want[i].v);
    }
    rm_rf(dir);
}

CT_TEST(creates_nested_dirs) {
    char *dir = tmpdir();
    CT_ASSERT(dir);
    char sub[256];
    snprintf(sub, sizeof sub, "%s/run1//metrics/", dir);
    ct_metrics *m;
    CT_EXPECT_OK(ct_metrics_open(sub, &m));
    CT_EXPECT_OK(ct_metrics_scalar(m, "train/loss", 0, 1.0));
    ct_metrics_close(m);
    char p[300];
    snprintf(p, sizeof p, "%s/run1/metrics/metrics.jsonl", dir);
    struct stat sb;
    CT_EXPECT(stat(p, &sb) == 0 && sb.st_size > 0);
    rm_rf(dir);
}

CT_TEST(unwritable_dir_is_clear_error) {
    char *dir = tmpdir();
    CT_ASSERT(dir);
    char file[256], bad[300];
    snprintf(file, sizeof file, "%s/plainfile", dir);
    FILE *f = fopen(file, "w");
    CT_ASSERT(f);
    fclose(f);
    snprintf(bad, sizeof bad, "%s/sub/metrics", file);
    ct_metrics *m = (ct_metrics *)1;
    ct_status st = ct_metrics_open(bad, &m);
    CT_EXPECT_EQ(st, CT_ERR_IO);
    CT_EXPECT(m == NULL);
    CT_EXPECT(strstr(ct_last_error(), file) != NULL);
    CT_EXPECT(strstr(ct_last_error(), "directory") != NULL);
    fprintf(stderr, "  (message: %s)\n", ct_last_error());

    /* The directory itself is a regular file. */
    st = ct_metrics_open(file, &m);
    CT_EXPECT_EQ(st, CT_ERR_IO);
    CT_EXPECT(strstr(ct_last_error(), file) != NULL);

    CT_EXPECT_EQ(ct_metrics_open("", &m), CT_ERR_INVALID);
    rm_rf(dir);
}

CT_TEST(bad_tags_rejected) {
    char *dir = tmpdir();
    CT_ASSERT(dir);
    ct_metrics *m;
    CT_EXPECT_OK(ct_metrics_open(dir, &m));
    char long_tag[CT_METRICS_MAX_TAG + 2];
    memset(long_tag, 'a', sizeof long_tag - 1);
    long_tag[sizeof long_tag - 1] = 0;
    CT_EXPECT_EQ(ct_metrics_scalar(m, "", 1, 1.0), CT_ERR_INVALID);
    CT_EXPECT_EQ(ct_metrics_scalar(m, "a\nb", 1, 1.0), CT_ERR_INVALID);
    CT_EXPECT_EQ(ct_metrics_scalar(m, "bad\xff", 1, 1.0), CT_ERR_INVALID);
    CT_EXPECT_EQ(ct_metrics_scalar(m, long_tag, 1, 1.0), CT_ERR_INVALID);
    long_tag[CT_METRICS_MAX_TAG] = 0;
    CT_EXPECT_OK(ct_metrics_scalar(m, long_tag, 1, 1.0));
    CT_EXPECT_OK(ct_metrics_scalar(m, "caf\xc3\xa9/\"quoted\"", 1, 2.0)); /* UTF-8, JSON-escaped */
    ct_metrics_close(m);
    char p[300];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    char *txt = read_all(p, NULL);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    CT_EXPECT(j && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "caf\xc3\xa9/\"quoted\"")));
    cJSON_Delete(j);
    free(txt);
    rm_rf(dir);
}

/* A write that fails (the file size limit stands in for a full disk) is an I/O error naming
 * the file, not a crash or a silent loss. In a child: the limit is per process. */
CT_TEST(write_failure_reported) {
    char *dir = tmpdir();
    CT_ASSERT(dir);
    fflush(NULL);
    pid_t pid = fork();
    CT_ASSERT(pid >= 0);
    if (pid == 0) {
        ct_metrics *m;
        if (ct_metrics_open(dir, &m) != CT_OK) _exit(2);
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {8192, 8192};
        setrlimit(RLIMIT_FSIZE, &rl);
        ct_status st = CT_OK;
        for (int i = 0; i < 2000 && st == CT_OK; i++) st = ct_metrics_scalar(m, "train/loss", i, 1.0 / (i + 1));
        if (st == CT_OK) st = ct_metrics_flush(m);
        int ok = st == CT_ERR_IO && (strstr(ct_last_error(), "metrics.jsonl") || strstr(ct_last_error(), "tfevents"));
        if (!ok) fprintf(stderr, "  child: status %d, message %s\n", st, ct_last_error());
        else fprintf(stderr, "  (message: %s)\n", ct_last_error());
        ct_metrics_close(m);
        _exit(ok ? 0 : 1);
    }
    int ws;
    waitpid(pid, &ws, 0);
    CT_EXPECT(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    rm_rf(dir);
}

CT_TEST(svg_chart) {
    char *dir = tmpdir();
    CT_ASSERT(dir);
    ct_metrics *m;
    CT_EXPECT_OK(ct_metrics_open(dir, &m));
    /* A plausible run: loss falling with noise, eval every 100 steps, a NaN in the middle. */
    uint32_t r = 12345;
    for (int s = 1; s <= 600; s++) {
        r = r * 1664525u + 1013904223u;
        double noise = ((r >> 8) / 16777216.0 - 0.5) * 0.15;
        CT_EXPECT_OK(ct_metrics_scalar(m, "train/loss", s, 2.3 * exp(-s / 120.0) + 0.25 + noise));
        CT_EXPECT_OK(ct_metrics_scalar(m, "train/lr", s, 0.01 * (1 - s / 600.0)));
        CT_EXPECT_OK(ct_metrics_scalar(m, "train/samples_per_s", s, s == 300 ? NAN : 8200 + 300 * noise));
        if (s % 100 == 0) {
            CT_EXPECT_OK(ct_metrics_scalar(m, "eval/loss", s, 2.3 * exp(-s / 130.0) + 0.3));
            CT_EXPECT_OK(ct_metrics_scalar(m, "eval/accuracy", s, 0.91 - 0.6 * exp(-s / 110.0)));
        }
    }
    char path[300];
    snprintf(path, sizeof path, "%s/chart.svg", dir);
    CT_EXPECT_OK(ct_metrics_write_svg(m, path, "cnn <fashion-mnist> & friends"));
    size_t n;
    char *svg = read_all(path, &n);
    CT_ASSERT(svg);
    CT_EXPECT(strncmp(svg, "<svg ", 5) == 0);
    CT_EXPECT(n > 7 && strcmp(svg + n - 7, "</svg>\n") == 0);
    CT_EXPECT(strstr(svg, "&lt;fashion-mnist&gt; &amp; friends") != NULL);
    const char *tags[] = {"train/loss", "train/lr", "train/samples_per_s", "eval/loss", "eval/accuracy"};
    for (int i = 0; i < 5; i++) {
        char t[64];
        snprintf(t, sizeof t, "<title>%s</title>", tags[i]);
        CT_EXPECT(strstr(svg, t) != NULL);
    }
    /* one polyline per tag, plus one for the NaN gap; four panels (loss, lr, samples_per_s, accuracy) */
    CT_EXPECT_EQ(count_str(svg, "<polyline"), 6);
    CT_EXPECT_EQ(count_str(svg, ">step</text>"), 4);
    CT_EXPECT_EQ(count_str(svg, "<svg"), 1);
    CT_EXPECT_EQ(count_str(svg, "<g"), count_str(svg, "</g>"));
    if (getenv("CT_METRICS_SVG")) { /* for a look: CT_METRICS_SVG=/tmp/x.svg */
        char cmd[700];
        snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path, getenv("CT_METRICS_SVG"));
        CT_EXPECT(system(cmd) == 0);
    }
    free(svg);

    /* No temporary left behind; an unwritable target is an error naming it. */
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) CT_EXPECT(strstr(e->d_name, ".tmp") == NULL);
    if (d) closedir(d);
    char bad[400];
    snprintf(bad, sizeof bad, "%s/metrics.jsonl/chart.svg", dir);
    CT_EXPECT_EQ(ct_metrics_write_svg(m, bad, "x"), CT_ERR_IO);
    CT_EXPECT(strstr(ct_last_error(), bad) != NULL);
    ct_metrics_close(m);
    rm_rf(dir);
}

CT_TEST(svg_downsamples_long_runs) {
    char *dir = tmpdir();
    CT_ASSERT(dir);
    ct_metrics *m;
    CT_EXPECT_OK(ct_metrics_open(dir, &m));
    for (int s = 0; s < 50000; s++) CT_EXPECT_OK(ct_metrics_scalar(m, "train/loss", s, 1.0 / (1 + s * 1e-3)));
    CT_EXPECT_OK(ct_metrics_scalar(m, "eval/accuracy", 49999, 0.9)); /* a single point still shows */
    char path[300];
    snprintf(path, sizeof path, "%s/chart.svg", dir);
    CT_EXPECT_OK(ct_metrics_write_svg(m, path, "long"));
    size_t n;
    char *svg = read_all(path, &n);
    CT_ASSERT(svg);
    CT_EXPECT_EQ(count_str(svg, "<polyline"), 2);
    char *pl = strstr(svg, "points=\"");
    CT_ASSERT(pl);
    size_t pts = 0;
    for (char *c = pl + 8; *c && *c != '"'; c++) pts += *c == ',';
    CT_EXPECT(pts >= 1000 && pts <= 2 * 1000 + 2);
    CT_EXPECT(n < 200000);
    CT_EXPECT_EQ(count_str(svg, "<circle"), 1);
    free(svg);

    /* Nothing recorded: still a valid chart. */
    ct_metrics *e;
    CT_EXPECT_OK(ct_metrics_open(dir, &e));
    CT_EXPECT_OK(ct_metrics_write_svg(e, path, "empty"));
    svg = read_all(path, NULL);
    CT_EXPECT(svg && strncmp(svg, "<svg ", 5) == 0 && strstr(svg, "no metrics recorded"));
    free(svg);
    ct_metrics_close(e);
    ct_metrics_close(m);
    rm_rf(dir);
}

/* Known data for tests/scripts/metrics_tensorboard.sh; with CT_METRICS_KEEP set it writes
 * there and keeps the files. */
CT_TEST(tensorboard_fixture) {
    const char *keep = getenv("CT_METRICS_KEEP");
    char *dir = keep ? (char *)keep : tmpdir();
    CT_ASSERT(dir);
    ct_metrics *m;
    CT_EXPECT_OK(ct_metrics_open(dir, &m));
    for (int s = 1; s <= 50; s++) {
        CT_EXPECT_OK(ct_metrics_scalar(m, "train/loss", s, 2.0 / s));
        CT_EXPECT_OK(ct_metrics_scalar(m, "train/lr", s, 0.001 * s));
        if (s % 10 == 0) CT_EXPECT_OK(ct_metrics_scalar(m, "eval/accuracy", s, 0.5 + s / 200.0));
    }
    CT_EXPECT_OK(ct_metrics_flush(m));
    char path[300];
    snprintf(path, sizeof path, "%s/metrics.svg", dir);
    CT_EXPECT_OK(ct_metrics_write_svg(m, path, "tensorboard fixture"));
    ct_metrics_close(m);
    if (!keep) rm_rf(dir);
}

CT_TEST_MAIN()
