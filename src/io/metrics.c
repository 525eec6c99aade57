/* Metrics: JSONL rows, TensorBoard event files (hand-written TFRecord + protobuf, so there is
 * no protobuf dependency), points kept for the SVG chart (src/io/svg.c). */

#include "io/metrics_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct ct_metrics {
    char *jsonl_path, *event_path;
    FILE *jsonl, *events;
    ct_mseries *series;
    int nseries, capseries;
    /* The JSONL row being accumulated: values of series pidx[i] for step pstep. */
    bool pending;
    int64_t pstep;
    double ptime;
    int *pidx;
    double *pval;
    int npend, cappend;
};

/* ---------------- CRC32C (Castagnoli), as TFRecord frames use ---------------- */

static uint32_t crc32c_table[256];

static void crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc32c_table[i] = c;
    }
}

static uint32_t crc32c(const void *data, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc32c_init);
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc32c_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* TFRecord stores CRCs rotated and offset so that a CRC of data containing CRCs stays strong. */
static uint32_t masked_crc(const void *data, size_t n) {
    uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---------------- protobuf encoding (only what Event needs) ---------------- */

typedef struct { uint8_t *p; size_t n; } pbuf;

static void pb_varint(pbuf *b, uint64_t v) {
    while (v >= 0x80) { b->p[b->n++] = (uint8_t)(v | 0x80); v >>= 7; }
    b->p[b->n++] = (uint8_t)v;
}
static size_t pb_varint_len(uint64_t v) { size_t n = 1; while (v >= 0x80) { v >>= 7; n++; } return n; }
static void pb_le(pbuf *b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) b->p[b->n++] = (uint8_t)(v >> (8 * i));
}
static void pb_bytes(pbuf *b, int field, const void *s, size_t len) {
    pb_varint(b, (uint64_t)field << 3 | 2);
    pb_varint(b, len);
    memcpy(b->p + b->n, s, len);
    b->n += len;
}

/* Event{wall_time=1, step=2, file_version=3 | summary=5{value=1{tag=1, simple_value=2}}}.
 * buf must hold CT_METRICS_MAX_TAG + 64 bytes. */
static size_t encode_event(uint8_t *buf, double wall, int64_t step, const char *file_version,
                           const char *tag, float value) {
    pbuf b = {buf, 0};
    uint64_t bits;
    memcpy(&bits, &wall, 8);
    pb_varint(&b, 1 << 3 | 1);
    pb_le(&b, bits, 8);
    if (step != 0) { pb_varint(&b, 2 << 3 | 0); pb_varint(&b, (uint64_t)step); }
    if (file_version) {
        pb_bytes(&b, 3, file_version, strlen(file_version));
        return b.n;
    }
    size_t tl = strlen(tag);
    size_t vlen = 1 + pb_varint_len(tl) + tl + 5;
    size_t slen = 1 + pb_varint_len(vlen) + vlen;
    pb_varint(&b, 5 << 3 | 2);
    pb_varint(&b, slen);
    pb_varint(&b, 1 << 3 | 2);
    pb_varint(&b, vlen);
    pb_bytes(&b, 1, tag, tl);
    uint32_t fb;
    memcpy(&fb, &value, 4);
    pb_varint(&b, 2 << 3 | 5);
    pb_le(&b, fb, 4);
    return b.n;
}

/* One TFRecord: u64 length, masked CRC of the length, data, masked CRC of the data. */
static ct_status write_record(ct_metrics *m, const uint8_t *data, size_t n) {
    uint8_t head[12], tail[4];
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)n >> (8 * i));
    uint32_t c = masked_crc(head, 8);
    for (int i = 0; i < 4; i++) head[8 + i] = (uint8_t)(c >> (8 * i));
    c = masked_crc(data, n);
    for (int i = 0; i < 4; i++) tail[i] = (uint8_t)(c >> (8 * i));
    if (fwrite(head, 1, 12, m->events) != 12 || fwrite(data, 1, n, m->events) != n ||
        fwrite(tail, 1, 4, m->events) != 4)
        return ct_error(CT_ERR_IO, "metrics: writing %s: %s", m->event_path, strerror(errno));
    return CT_OK;
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------- JSONL ---------------- */

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') { fputc('\\', f); fputc(ch, f); }
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* Shortest of %.15g..%.17g that reads back exactly: 0.1 stays "0.1", not 0.10000000000000001. */
static void json_number(FILE *f, double v) {
    if (!isfinite(v)) { fputs("null", f); return; }
    char s[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, v);
        for (char *c = s; *c; c++) if (*c == ',') *c = '.'; /* a caller's LC_NUMERIC */
        if (strtod(s, NULL) == v) break;
    }
    fputs(s, f);
}

static ct_status write_pending(ct_metrics *m) {
    if (!m->pending) return CT_OK;
    m->pending = false;
    FILE *f = m->jsonl;
    fprintf(f, "{\"step\": %lld, \"time\": %.3f", (long long)m->pstep, m->ptime);
    for (int i = 0; i < m->npend; i++) {
        fputs(", ", f);
        json_string(f, m->series[m->pidx[i]].tag);
        fputs(": ", f);
        json_number(f, m->pval[i]);
    }
    fputs("}\n", f);
    m->npend = 0;
    if (ferror(f)) return ct_error(CT_ERR_IO, "metrics: writing %s: %s", m->jsonl_path, strerror(errno));
    return CT_OK;
}

/* ---------------- open / close ---------------- */

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a == 0 || dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

/* mkdir -p, with the failing component in the message. */
static ct_status make_dirs(const char *dir) {
    char *p = xstrdup(dir);
    if (!p) return ct_error(CT_ERR_NOMEM, "metrics: out of memory");
    ct_status st = CT_OK;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != 0) continue;
        char saved = *s;
        *s = 0;
        struct stat sb;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            st = ct_error(CT_ERR_IO, "metrics: cannot create directory %s: %s", p, strerror(errno));
            break;
        }
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            st = ct_error(CT_ERR_IO, "metrics: cannot create directory %s: %s exists and is not a directory",
                          dir, p);
            break;
        }
        *s = saved;
        if (!saved) break;
        while (s[1] == '/') s++;
        if (!s[1]) break;
    }
    free(p);
    return st;
}

static void metrics_free(ct_metrics *m) {
    if (m->jsonl) fclose(m->jsonl);
    if (m->events) fclose(m->events);
    for (int i = 0; i < m->nseries; i++) {
        free(m->series[i].tag);
        free(m->series[i].step);
        free(m->series[i].val);
    }
    free(m->series);
    free(m->pidx);
    free(m->pval);
    free(m->jsonl_path);
    free(m->event_path);
    free(m);
}

ct_status ct_metrics_open(const char *dir, ct_metrics **out) {
    if (!out) return ct_error(CT_ERR_INVALID, "ct_metrics_open: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return ct_error(CT_ERR_INVALID, "ct_metrics_open: empty directory name");
    ct_status st = make_dirs(dir);
    if (st != CT_OK) return st;

    ct_metrics *m = calloc(1, sizeof *m);
    if (!m) return ct_error(CT_ERR_NOMEM, "metrics: out of memory");
    m->jsonl_path = path_join(dir, "metrics.jsonl");
    if (!m->jsonl_path) { metrics_free(m); return ct_error(CT_ERR_NOMEM, "metrics: out of memory"); }

    m->jsonl = fopen(m->jsonl_path, "ae");
    if (!m->jsonl) {
        st = ct_error(CT_ERR_IO, "metrics: cannot open %s: %s", m->jsonl_path, strerror(errno));
        metrics_free(m);
        return st;
    }
    /* A new file per writer, as TensorBoard expects; O_EXCL so two writers never interleave.
     * A second writer in the same second and process takes the next second's name. */
    char host[256] = "localhost", name[400];
    if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++) if (*c == '/') *c = '_';
    long long t0 = (long long)time(NULL);
    int fd = -1;
    for (int k = 0; k < 1000 && fd < 0; k++) {
        snprintf(name, sizeof name, "events.out.tfevents.%lld.%s.%ld.ctrain", t0 + k, host, (long)getpid());
        free(m->event_path);
        if (!(m->event_path = path_join(dir, name))) { metrics_free(m); return ct_error(CT_ERR_NOMEM, "metrics: out of memory"); }
        fd = open(m->event_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0 || !(m->events = fdopen(fd, "wb"))) {
        st = ct_error(CT_ERR_IO, "metrics: cannot create %s: %s", m->event_path, strerror(errno));
        if (fd >= 0) close(fd);
        metrics_free(m);
        return st;
    }
    uint8_t buf[CT_METRICS_MAX_TAG + 64];
    size_t n = encode_event(buf, wall_now(), 0, "brain.Event:2", NULL, 0);
    st = write_record(m, buf, n);
    /* Flushed now so TensorBoard sees a valid (empty) run from the start. */
    if (st == CT_OK && fflush(m->events) != 0)
        st = ct_error(CT_ERR_IO, "metrics: writing %s: %s", m->event_path, strerror(errno));
    if (st != CT_OK) { metrics_free(m); return st; }
    *out = m;
    return CT_OK;
}

/* ---------------- recording ---------------- */

static bool tag_ok(const char *t) {
    size_t n = strlen(t);
    if (n == 0 || n > CT_METRICS_MAX_TAG) return false;
    /* UTF-8 check: TensorBoard's protobuf rejects an Event whose string is not UTF-8. */
    const unsigned char *p = (const unsigned char *)t;
    while (*p) {
        unsigned c = *p;
        int extra;
        if (c < 0x20 || c == 0x7f) return false;
        if (c < 0x80) extra = 0;
        else if (c >= 0xC2 && c <= 0xDF) extra = 1;
        else if (c >= 0xE0 && c <= 0xEF) extra = 2;
        else if (c >= 0xF0 && c <= 0xF4) extra = 3;
        else return false;
        p++;
        for (int i = 0; i < extra; i++, p++) if ((*p & 0xC0) != 0x80) return false;
    }
    return true;
}

static int find_series(ct_metrics *m, const char *tag) {
    for (int i = 0; i < m->nseries; i++)
        if (strcmp(m->series[i].tag, tag) == 0) return i;
    if (m->nseries == m->capseries) {
        int cap = m->capseries ? 2 * m->capseries : 8;
        ct_mseries *s = realloc(m->series, (size_t)cap * sizeof *s);
        int *pi = realloc(m->pidx, (size_t)cap * sizeof *pi);
        if (pi) m->pidx = pi;
        double *pv = realloc(m->pval, (size_t)cap * sizeof *pv);
        if (pv) m->pval = pv;
        if (s) m->series = s;
        if (!s || !pi || !pv) return -1;
        m->capseries = cap;
    }
    ct_mseries *s = &m->series[m->nseries];
    memset(s, 0, sizeof *s);
    if (!(s->tag = xstrdup(tag))) return -1;
    return m->nseries++;
}

static bool series_add(ct_mseries *s, int64_t step, double v) {
    if (s->n && s->step[s->n - 1] == step) { s->val[s->n - 1] = v; return true; }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        int64_t *a = realloc(s->step, cap * sizeof *a);
        if (a) s->step = a;
        double *b = realloc(s->val, cap * sizeof *b);
        if (b) s->val = b;
        if (!a || !b) return false;
        s->cap = cap;
    }
    s->step[s->n] = step;
    s->val[s->n++] = v;
    return true;
}

ct_status ct_metrics_scalar(ct_metrics *m, const char *tag, int64_t step, double value) {
    if (!m || !tag) return ct_error(CT_ERR_INVALID, "ct_metrics_scalar: NULL argument");
    if (!tag_ok(tag))
        return ct_error(CT_ERR_INVALID, "metrics: bad tag \"%.80s\" (want 1..%d bytes of UTF-8, no control characters)",
                        tag, CT_METRICS_MAX_TAG);
    int si = find_series(m, tag);
    if (si < 0 || !series_add(&m->series[si], step, value))
        return ct_error(CT_ERR_NOMEM, "metrics: out of memory recording %s", tag);

    double now = wall_now();
    ct_status st = CT_OK;
    if (m->pending && m->pstep != step) st = write_pending(m);
    if (!m->pending) { m->pending = true; m->pstep = step; m->ptime = now; m->npend = 0; }
    int k = 0;
    while (k < m->npend && m->pidx[k] != si) k++;
    if (k == m->npend) { m->pidx[k] = si; m->npend++; }  /* pidx has room for every series */
    m->pval[k] = value;

    uint8_t buf[CT_METRICS_MAX_TAG + 64];
    size_t n = encode_event(buf, now, step, NULL, tag, (float)value);
    ct_status st2 = write_record(m, buf, n);
    return st != CT_OK ? st : st2;
}

ct_status ct_metrics_flush(ct_metrics *m) {
    if (!m) return ct_error(CT_ERR_INVALID, "ct_metrics_flush: NULL");
    ct_status st = write_pending(m);
    if (fflush(m->jsonl) != 0 || fsync(fileno(m->jsonl)) != 0) {
        if (st == CT_OK) st = ct_error(CT_ERR_IO, "metrics: writing %s: %s", m->jsonl_path, strerror(errno));
    }
    if (fflush(m->events) != 0 || ferror(m->events) || fsync(fileno(m->events)) != 0) {
        if (st == CT_OK) st = ct_error(CT_ERR_IO, "metrics: writing %s: %s", m->event_path, strerror(errno));
    }
    return st;
}

void ct_metrics_close(ct_metrics *m) {
    if (!m) return;
    if (ct_metrics_flush(m) != CT_OK) {
        const char *e = ct_last_error();
        CT_LOG_WARN_("metrics", "%s", strncmp(e, "metrics: ", 9) == 0 ? e + 9 : e);
    }
    int a = fclose(m->jsonl), b = fclose(m->events);
    m->jsonl = m->events = NULL;
    if (a != 0 || b != 0)
        CT_LOG_WARN_("metrics", "closing %s: %s", a ? m->jsonl_path : m->event_path, strerror(errno));
    metrics_free(m);
}

/* ---------------- chart ---------------- */

ct_status ct_metrics_write_svg(const ct_metrics *m, const char *path, const char *title) {
    if (!m || !path || !*path) return ct_error(CT_ERR_INVALID, "ct_metrics_write_svg: NULL or empty argument");
    size_t n = strlen(path);
    char *tmp = malloc(n + 32);
    if (!tmp) return ct_error(CT_ERR_NOMEM, "metrics: out of memory");
    snprintf(tmp, n + 32, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "we");
    if (!f) {
        ct_status st = ct_error(CT_ERR_IO, "metrics: cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    ct_status st = ct_svg_chart_(f, m->series, m->nseries, title ? title : "");
    if (st == CT_OK && (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0))
        st = ct_error(CT_ERR_IO, "metrics: writing %s: %s", tmp, strerror(errno));
    if (fclose(f) != 0 && st == CT_OK)
        st = ct_error(CT_ERR_IO, "metrics: writing %s: %s", tmp, strerror(errno));
    if (st == CT_OK && rename(tmp, path) != 0)
        st = ct_error(CT_ERR_IO, "metrics: renaming %s to %s: %s", tmp, path, strerror(errno));
    if (st != CT_OK) unlink(tmp);
    free(tmp);
    return st;
}
