/* safetensors: round trip, a PyTorch-written fixture, atomic save, and malformed files
 * (each must be CT_ERR_FORMAT naming the file, never a crash). */
#include "ct_test.h"
#include "ctrain/io.h"

#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define TORCH_FIXTURE "tests/fixtures/io/torch_written.safetensors"


/* A file with header `json` (not padded) followed by `ndata` bytes 0..ndata-1. */
static void write_st(const char *path, const char *json, size_t ndata) {
    size_t hl = strlen(json);
    unsigned char *buf = malloc(8 + hl + ndata + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, json, hl);
    for (size_t i = 0; i < ndata; i++) buf[8 + hl + i] = (unsigned char)i;
    ct_test_write_file(path, buf, 8 + hl + ndata);
    free(buf);
}

/* ---- round trip: the same tensors tests/scripts/safetensors_torch.sh checks in PyTorch ---- */

typedef struct {
    float f32[15];
    double f64[4];
    uint16_t f16[6], bf16[5];
    int32_t i32[7];
    int64_t i64[3];
    uint8_t u8[5];
    int8_t i8[4];
    float scalar;
} rt_data;

static void fill_rt(rt_data *d) {
    for (int i = 0; i < 15; i++) d->f32[i] = (float)i * 0.1f - 0.7f;
    for (int i = 0; i < 4; i++) d->f64[i] = i / 7.0;
    for (int i = 0; i < 6; i++) d->f16[i] = ct_f32_to_f16((float)i * 0.5f - 2.0f);
    for (int i = 0; i < 5; i++) d->bf16[i] = ct_f32_to_bf16((float)i * 1.5f + 0.25f);
    for (int i = 0; i < 7; i++) d->i32[i] = (i - 3) * 1000003;
    for (int i = 0; i < 3; i++) d->i64[i] = (int64_t)i * ((int64_t)1 << 40) - 7;
    for (int i = 0; i < 5; i++) d->u8[i] = (uint8_t)(251 + i);
    for (int i = 0; i < 4; i++) d->i8[i] = (int8_t)(-128 + i);
    d->scalar = -2.5f;
}

static void expect_tensor(ct_st_file *f, const char *name, ct_dtype dt, int ndim, const int64_t *shape,
                          const void *data, size_t nbytes) {
    ct_st_tensor t;
    ct_status st = ct_st_get(f, name, &t);
    if (st != CT_OK) { CT_FAILF("get %s: %s", name, ct_last_error()); return; }
    if (t.dtype != dt || t.ndim != ndim || t.nbytes != nbytes) {
        CT_FAILF("%s: dtype %d ndim %d nbytes %zu, want %d %d %zu", name, t.dtype, t.ndim, t.nbytes, dt, ndim, nbytes);
        return;
    }
    for (int d = 0; d < ndim; d++)
        if (t.shape[d] != shape[d]) CT_FAILF("%s: shape[%d] = %lld, want %lld", name, d, (long long)t.shape[d], (long long)shape[d]);
    if (nbytes && memcmp(t.data, data, nbytes)) CT_FAILF("%s: data differs", name);
    if ((uintptr_t)t.data % ct_dtype_size(dt)) CT_FAILF("%s: data not aligned to its item size", name);
}

CT_TEST(roundtrip) {
    rt_data d;
    fill_rt(&d);
    const char *keep = getenv("CT_ST_KEEP"); /* used by tests/scripts/safetensors_torch.sh */
    const char *path = keep ? keep : ct_test_tmp_path("rt.safetensors");
    int64_t s_f32[2] = {3, 5}, s_f64[1] = {4}, s_f16[2] = {2, 3}, s_bf16[1] = {5}, s_i32[1] = {7}, s_i64[1] = {3},
            s_u8[1] = {5}, s_i8[2] = {2, 2}, s_empty[2] = {0, 3};
    ct_st_writer *w; CT_EXPECT_OK(ct_st_writer_create(&w));
    CT_ASSERT(w);
    CT_EXPECT_OK(ct_st_writer_add(w, "model.w", CT_F32, 2, s_f32, d.f32));
    CT_EXPECT_OK(ct_st_writer_add(w, "f64", CT_F64, 1, s_f64, d.f64));
    CT_EXPECT_OK(ct_st_writer_add(w, "half", CT_F16, 2, s_f16, d.f16));
    CT_EXPECT_OK(ct_st_writer_add(w, "brain", CT_BF16, 1, s_bf16, d.bf16));
    CT_EXPECT_OK(ct_st_writer_add(w, "i32", CT_I32, 1, s_i32, d.i32));
    CT_EXPECT_OK(ct_st_writer_add(w, "i64", CT_I64, 1, s_i64, d.i64));
    CT_EXPECT_OK(ct_st_writer_add(w, "u8", CT_U8, 1, s_u8, d.u8));
    CT_EXPECT_OK(ct_st_writer_add(w, "i8", CT_I8, 2, s_i8, d.i8));
    CT_EXPECT_OK(ct_st_writer_add(w, "scalar", CT_F32, 0, NULL, &d.scalar));
    CT_EXPECT_OK(ct_st_writer_add(w, "empty", CT_F32, 2, s_empty, NULL));
    CT_EXPECT_EQ(ct_st_writer_add(w, "i8", CT_I8, 2, s_i8, d.i8), CT_ERR_INVALID); /* duplicate */
    CT_EXPECT_EQ(ct_st_writer_add(w, "__metadata__", CT_I8, 2, s_i8, d.i8), CT_ERR_INVALID);
    int64_t neg[1] = {-1};
    CT_EXPECT_EQ(ct_st_writer_add(w, "neg", CT_I8, 1, neg, d.i8), CT_ERR_INVALID);
    CT_EXPECT_EQ(ct_st_writer_add(w, "deep", CT_I8, 9, s_f32, d.i8), CT_ERR_INVALID);
    CT_EXPECT_OK(ct_st_writer_set_metadata(w, "format", "pt"));
    CT_EXPECT_OK(ct_st_writer_set_metadata(w, "step", "41"));
    CT_EXPECT_OK(ct_st_writer_set_metadata(w, "step", "42")); /* replaces */
    CT_EXPECT_OK(ct_st_writer_set_metadata(w, "quote\"d", "a\\b\n"));
    CT_EXPECT_OK(ct_st_writer_save(w, path));
    ct_st_writer_free(w);

    size_t n;
    unsigned char *raw = ct_test_read_file(path, &n);
    CT_ASSERT(raw);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | raw[i];
    CT_EXPECT_EQ(hl % 8, 0);
    CT_EXPECT(raw[8] == '{');
    free(raw);

    ct_st_file *f;
    CT_EXPECT_OK(ct_st_open(path, &f));
    CT_ASSERT(f);
    CT_EXPECT_EQ(ct_st_count(f), 10);
    /* file order: by item size (8, 4, 2, 1), then name */
    CT_EXPECT(!strcmp(ct_st_name(f, 0), "f64"));
    CT_EXPECT(!strcmp(ct_st_name(f, 1), "i64"));
    CT_EXPECT(!strcmp(ct_st_name(f, 9), "u8"));
    CT_EXPECT(ct_st_name(f, 10) == NULL);
    expect_tensor(f, "model.w", CT_F32, 2, s_f32, d.f32, sizeof d.f32);
    expect_tensor(f, "f64", CT_F64, 1, s_f64, d.f64, sizeof d.f64);
    expect_tensor(f, "half", CT_F16, 2, s_f16, d.f16, sizeof d.f16);
    expect_tensor(f, "brain", CT_BF16, 1, s_bf16, d.bf16, sizeof d.bf16);
    expect_tensor(f, "i32", CT_I32, 1, s_i32, d.i32, sizeof d.i32);
    expect_tensor(f, "i64", CT_I64, 1, s_i64, d.i64, sizeof d.i64);
    expect_tensor(f, "u8", CT_U8, 1, s_u8, d.u8, sizeof d.u8);
    expect_tensor(f, "i8", CT_I8, 2, s_i8, d.i8, sizeof d.i8);
    expect_tensor(f, "scalar", CT_F32, 0, NULL, &d.scalar, 4);
    expect_tensor(f, "empty", CT_F32, 2, s_empty, NULL, 0);
    CT_EXPECT(!strcmp(ct_st_metadata(f, "format"), "pt"));
    CT_EXPECT(!strcmp(ct_st_metadata(f, "step"), "42"));
    CT_EXPECT(!strcmp(ct_st_metadata(f, "quote\"d"), "a\\b\n"));
    CT_EXPECT(ct_st_metadata(f, "nope") == NULL);
    ct_st_tensor t;
    CT_EXPECT_EQ(ct_st_get(f, "missing", &t), CT_ERR_NOT_FOUND);
    CT_EXPECT(strstr(ct_last_error(), "missing") && strstr(ct_last_error(), path));
    ct_st_close(f);
    if (!keep) unlink(path);
}

CT_TEST(empty_writer) {
    const char *path = ct_test_tmp_path("none.safetensors");
    ct_st_writer *w; CT_EXPECT_OK(ct_st_writer_create(&w));
    CT_EXPECT_OK(ct_st_writer_save(w, path));
    ct_st_writer_free(w);
    ct_st_file *f;
    CT_EXPECT_OK(ct_st_open(path, &f));
    CT_ASSERT(f);
    CT_EXPECT_EQ(ct_st_count(f), 0);
    ct_st_close(f);
    unlink(path);
}

/* ct_st_writer_set_fetch: called once per tensor, in file order, before its bytes are
 * written, and what it writes there is what the file holds (or what it points the source to,
 * as a device's host copy); its error stops the save and leaves no file */
typedef struct { const void *seen[4]; int n, fail_at; float *fill; const void *from, *to; } fetch_log;
static ct_status fetch_cb(void *user, const void *data, size_t nbytes, const void **src) {
    fetch_log *l = user;
    if (l->n == l->fail_at) return ct_error(CT_ERR_PEER, "fetch refused");
    CT_EXPECT(*src == data);
    l->seen[l->n++] = data;
    if (data == l->fill) for (size_t i = 0; i < nbytes / 4; i++) l->fill[i] = 7.0f + (float)i; /* made just in time */
    if (data == l->from) *src = l->to;
    return CT_OK;
}

CT_TEST(fetch_before_each_tensor) {
    const char *path = ct_test_tmp_path("fetch.safetensors");
    float a[3] = {0}, b[2] = {1, 2};
    double c[1] = {3};
    ct_st_writer *w; CT_EXPECT_OK(ct_st_writer_create(&w));
    CT_EXPECT_OK(ct_st_writer_add(w, "b", CT_F32, 1, (int64_t[]){2}, b));
    CT_EXPECT_OK(ct_st_writer_add(w, "a", CT_F32, 1, (int64_t[]){3}, a));
    CT_EXPECT_OK(ct_st_writer_add(w, "c", CT_F64, 1, (int64_t[]){1}, c));
    const float b_elsewhere[2] = {-4, 5}; /* b's bytes come from here */
    fetch_log l = {.fail_at = -1, .fill = a, .from = b, .to = b_elsewhere};
    ct_st_writer_set_fetch(w, fetch_cb, &l);
    CT_EXPECT_OK(ct_st_writer_save(w, path));
    /* file order: the 8-byte f64 first, then the f32 ones by name */
    CT_EXPECT(l.n == 3 && l.seen[0] == c && l.seen[1] == a && l.seen[2] == b);
    ct_st_file *f;
    CT_EXPECT_OK(ct_st_open(path, &f));
    CT_ASSERT(f);
    ct_st_tensor t;
    CT_EXPECT_OK(ct_st_get(f, "a", &t));
    float v[3];
    memcpy(v, t.data, sizeof v);
    CT_EXPECT(v[0] == 7.0f && v[1] == 8.0f && v[2] == 9.0f);
    CT_EXPECT_OK(ct_st_get(f, "b", &t));
    memcpy(v, t.data, 2 * sizeof(float));
    CT_EXPECT(v[0] == -4.0f && v[1] == 5.0f && b[0] == 1.0f);
    ct_st_close(f);
    unlink(path);
    fetch_log l2 = {.fail_at = 1, .fill = a};
    ct_st_writer_set_fetch(w, fetch_cb, &l2);
    CT_EXPECT(ct_st_writer_save(w, path) == CT_ERR_PEER);
    CT_EXPECT(access(path, F_OK) != 0); /* nothing left, not even the temporary file */
    DIR *dir = opendir(ct_test_tmp_dir());
    int tmps = 0;
    for (struct dirent *e; dir && (e = readdir(dir));) tmps += strstr(e->d_name, "fetch.safetensors.tmp") != NULL;
    if (dir) closedir(dir);
    CT_EXPECT(tmps == 0);
    ct_st_writer_free(w);
}

/* ---- written by PyTorch (tests/torch/gen_safetensors.py) ---- */

CT_TEST(torch_written) {
    ct_st_file *f;
    ct_status st = ct_st_open(TORCH_FIXTURE, &f);
    if (st != CT_OK) { CT_FAILF("%s", ct_last_error()); return; }
    CT_EXPECT_EQ(ct_st_count(f), 12);
    CT_EXPECT(!strcmp(ct_st_metadata(f, "format"), "pt"));
    ct_st_tensor t;
    CT_EXPECT_OK(ct_st_get(f, "f32", &t));
    CT_EXPECT(t.dtype == CT_F32 && t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 3);
    for (int i = 0; i < 6; i++) { float v; memcpy(&v, (const char *)t.data + 4 * i, 4); CT_EXPECT(v == i * 0.25f - 1); }
    CT_EXPECT_OK(ct_st_get(f, "f64", &t));
    CT_EXPECT(t.dtype == CT_F64 && t.ndim == 1 && t.shape[0] == 5);
    for (int i = 0; i < 5; i++) { double v; memcpy(&v, (const char *)t.data + 8 * i, 8); CT_EXPECT(v == i / 3.0); }
    CT_EXPECT_OK(ct_st_get(f, "f16", &t));
    CT_EXPECT(t.dtype == CT_F16 && t.ndim == 3 && t.nbytes == 16);
    for (int i = 0; i < 8; i++) { uint16_t h; memcpy(&h, (const char *)t.data + 2 * i, 2); CT_EXPECT(ct_f16_to_f32(h) == i * 0.5f - 2); }
    CT_EXPECT_OK(ct_st_get(f, "bf16", &t));
    CT_EXPECT(t.dtype == CT_BF16 && t.ndim == 2 && t.shape[0] == 4 && t.shape[1] == 1);
    for (int i = 0; i < 4; i++) { uint16_t h; memcpy(&h, (const char *)t.data + 2 * i, 2); CT_EXPECT(ct_bf16_to_f32(h) == i * 1.5f + 0.25f); }
    CT_EXPECT_OK(ct_st_get(f, "layer.0.weight", &t));
    CT_EXPECT(t.dtype == CT_F32 && t.ndim == 3 && t.shape[2] == 4);
    for (int i = 0; i < 24; i++) { float v; memcpy(&v, (const char *)t.data + 4 * i, 4); CT_EXPECT(v == (i - 12) / 8.0f); }
    CT_EXPECT_OK(ct_st_get(f, "i32", &t));
    for (int i = 0; i < 6; i++) { int32_t v; memcpy(&v, (const char *)t.data + 4 * i, 4); CT_EXPECT(v == (i - 3) * 1000003); }
    CT_EXPECT_OK(ct_st_get(f, "i64", &t));
    for (int i = 0; i < 3; i++) { int64_t v; memcpy(&v, (const char *)t.data + 8 * i, 8); CT_EXPECT(v == (int64_t)i * ((int64_t)1 << 40) - 7); }
    CT_EXPECT_OK(ct_st_get(f, "u8", &t));
    CT_EXPECT(t.dtype == CT_U8 && t.nbytes == 6);
    for (int i = 0; i < 6; i++) CT_EXPECT(((const uint8_t *)t.data)[i] == 250 + i);
    CT_EXPECT_OK(ct_st_get(f, "i8", &t));
    for (int i = 0; i < 4; i++) CT_EXPECT(((const int8_t *)t.data)[i] == -128 + i);
    CT_EXPECT_OK(ct_st_get(f, "mask", &t)); /* BOOL reads as u8 */
    CT_EXPECT(t.dtype == CT_U8 && t.nbytes == 3);
    CT_EXPECT(((const uint8_t *)t.data)[0] == 1 && ((const uint8_t *)t.data)[1] == 0 && ((const uint8_t *)t.data)[2] == 1);
    CT_EXPECT_OK(ct_st_get(f, "scalar", &t));
    CT_EXPECT(t.ndim == 0 && t.nbytes == 4 && *(const float *)t.data == 3.5f);
    CT_EXPECT_OK(ct_st_get(f, "empty", &t));
    CT_EXPECT(t.ndim == 2 && t.shape[0] == 0 && t.shape[1] == 3 && t.nbytes == 0);
    ct_st_close(f);
}

/* ---- malformed files ---- */

static void expect_format(const char *path, const char *what, const char *needle) {
    ct_st_file *f = NULL;
    ct_clear_error();
    ct_status st = ct_st_open(path, &f);
    CT_EXPECTF(st == CT_ERR_FORMAT, "%s: status %d (%s), want CT_ERR_FORMAT", what, st, ct_last_error());
    CT_EXPECTF(!f, "%s: handle returned on failure", what);
    CT_EXPECTF(strstr(ct_last_error(), path), "%s: message does not name the file: %s", what, ct_last_error());
    CT_EXPECTF(!needle || strstr(ct_last_error(), needle), "%s: message lacks '%s': %s", what, needle, ct_last_error());
}

CT_TEST(malformed) {
    const char *p = ct_test_tmp_path("bad.safetensors");
    ct_test_write_file(p, "", 0);
    expect_format(p, "empty file", "too short");
    ct_test_write_file(p, "\x10\0\0\0", 4);
    expect_format(p, "truncated length", "too short");
    /* header length past the end */
    { unsigned char b[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'}; ct_test_write_file(p, b, 10); }
    expect_format(p, "header past end", "past the end of the file");
    { unsigned char b[10] = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'}; ct_test_write_file(p, b, 10); }
    expect_format(p, "huge header length", "limit");
    /* header truncated mid-JSON: declared length fits but JSON is cut */
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_off", 0);
    expect_format(p, "truncated header", "JSON");
    write_st(p, "{\"a\": {\"dtype\": F32}}", 0);
    expect_format(p, "bad JSON", "JSON");
    write_st(p, "[1,2]", 0);
    expect_format(p, "not an object", NULL);
    write_st(p, "{}xyz", 0);
    expect_format(p, "trailing garbage in header", NULL);
    write_st(p, "{\"a\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    expect_format(p, "unknown dtype", "unknown dtype");
    write_st(p, "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    expect_format(p, "missing dtype", "dtype");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4);
    expect_format(p, "offsets past end", "past the end");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12);
    expect_format(p, "overlapping tensors", "overlaps");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    expect_format(p, "size mismatch", "need 12");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    expect_format(p, "hole", "belong to no tensor");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6);
    expect_format(p, "trailing data", "cover");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4);
    expect_format(p, "rank 9", "dimensions");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4);
    expect_format(p, "negative dim", "shape");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4);
    expect_format(p, "fractional dim", "shape");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4);
    expect_format(p, "overflowing shape", NULL);
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4);
    expect_format(p, "end before begin", NULL);
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4);
    expect_format(p, "one offset", "data_offsets");
    write_st(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    expect_format(p, "duplicate name", "twice");
    write_st(p, "{\"__metadata__\":{\"k\":1}}", 0);
    expect_format(p, "metadata not string", "metadata");
    write_st(p, "{\"a\":[]}", 0);
    expect_format(p, "entry not object", NULL);
    unlink(p);
}

CT_TEST(open_errors) {
    ct_st_file *f = NULL;
    CT_EXPECT_EQ(ct_st_open("/nonexistent/x.safetensors", &f), CT_ERR_NOT_FOUND);
    CT_EXPECT(strstr(ct_last_error(), "/nonexistent/x.safetensors") != NULL);
    CT_EXPECT(f == NULL);
    CT_EXPECT_EQ(ct_st_open("/tmp", &f), CT_ERR_IO);
}

CT_TEST(unsupported_dtype) {
    const char *p = ct_test_tmp_path("i16.safetensors");
    write_st(p, "{\"a\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]}}", 6);
    ct_st_file *f;
    CT_EXPECT_OK(ct_st_open(p, &f));
    CT_ASSERT(f);
    ct_st_tensor t;
    CT_EXPECT_EQ(ct_st_get(f, "a", &t), CT_ERR_UNSUPPORTED);
    CT_EXPECT_OK(ct_st_get(f, "b", &t));
    CT_EXPECT(((const uint8_t *)t.data)[0] == 4 && ((const uint8_t *)t.data)[1] == 5);
    ct_st_close(f);
    unlink(p);
}

/* Every truncation and many single-byte corruptions of a valid file: open must either
 * succeed or fail with CT_ERR_FORMAT, never crash (run under ASan/valgrind to be sure). */
CT_TEST(fuzz_truncate_and_flip) {
    size_t n;
    unsigned char *good = ct_test_read_file(TORCH_FIXTURE, &n);
    CT_ASSERT(good);
    const char *p = ct_test_tmp_path("fuzz.safetensors");
    for (size_t len = 0; len < n; len++) {
        ct_test_write_file(p, good, len);
        ct_st_file *f = NULL;
        ct_status st = ct_st_open(p, &f);
        if (st != CT_ERR_FORMAT) CT_FAILF("truncated to %zu: status %d", len, st);
        ct_st_close(f);
    }
    unsigned char *bad = malloc(n);
    uint32_t x = 12345;
    for (int it = 0; it < 3000; it++) {
        memcpy(bad, good, n);
        x = x * 1664525u + 1013904223u;
        size_t pos = (x >> 8) % (n < 700 ? n : 700); /* mostly the header */
        x = x * 1664525u + 1013904223u;
        bad[pos] = (unsigned char)(x >> 24);
        ct_test_write_file(p, bad, n);
        ct_st_file *f = NULL;
        ct_status st = ct_st_open(p, &f);
        if (st != CT_OK && st != CT_ERR_FORMAT) CT_FAILF("flip at %zu: status %d", pos, st);
        if (st == CT_OK) {
            for (int i = 0; i < ct_st_count(f); i++) {
                ct_st_tensor t;
                if (ct_st_get(f, ct_st_name(f, i), &t) == CT_OK && t.nbytes)
                    (void)*(volatile const char *)((const char *)t.data + t.nbytes - 1);
            }
        }
        ct_st_close(f);
    }
    free(bad);
    free(good);
    unlink(p);
}

/* ---- atomic save ---- */

static int count_tmp_files(void) {
    DIR *d = opendir(ct_test_tmp_dir());
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

CT_TEST(save_errors_keep_old_file) {
    const char *p = ct_test_tmp_path("keep.safetensors");
    static float big[64 * 1024];
    for (int i = 0; i < 64 * 1024; i++) big[i] = (float)i;
    int64_t s1[1] = {4}, s2[1] = {64 * 1024};
    ct_st_writer *w; CT_EXPECT_OK(ct_st_writer_create(&w));
    CT_EXPECT_OK(ct_st_writer_add(w, "small", CT_F32, 1, s1, big));
    CT_EXPECT_OK(ct_st_writer_save(w, p));
    ct_st_writer_free(w);
    size_t n0;
    unsigned char *before = ct_test_read_file(p, &n0);
    CT_ASSERT(before);

    /* "disk full": a 16 KiB file-size limit makes the 256 KiB write fail with EFBIG */
    CT_EXPECT_OK(ct_st_writer_create(&w));
    CT_EXPECT_OK(ct_st_writer_add(w, "big", CT_F32, 1, s2, big));
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 16384;
    void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
    CT_ASSERT(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    ct_status st = ct_st_writer_save(w, p);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, oldsig);
    CT_EXPECT_EQ(st, CT_ERR_IO);
    CT_EXPECT(strstr(ct_last_error(), p) != NULL);
    size_t n1;
    unsigned char *after = ct_test_read_file(p, &n1);
    CT_ASSERT(after);
    CT_EXPECT(n0 == n1 && !memcmp(before, after, n0));
    CT_EXPECT_EQ(count_tmp_files(), 0);
    free(after);

    /* missing directory */
    st = ct_st_writer_save(w, "/nonexistent-dir/x.safetensors");
    CT_EXPECT_EQ(st, CT_ERR_IO);
    CT_EXPECT(strstr(ct_last_error(), "/nonexistent-dir/x.safetensors") != NULL);
    /* target is a directory: rename fails, nothing left behind */
    char dir[300];
    snprintf(dir, sizeof dir, "%s/adir", ct_test_tmp_dir());
    mkdir(dir, 0755);
    CT_EXPECT_EQ(ct_st_writer_save(w, dir), CT_ERR_IO);
    rmdir(dir);
    CT_EXPECT_EQ(count_tmp_files(), 0);

    /* and a successful save replaces the file */
    CT_EXPECT_OK(ct_st_writer_save(w, p));
    ct_st_writer_free(w);
    ct_st_file *f;
    CT_EXPECT_OK(ct_st_open(p, &f));
    ct_st_tensor t;
    CT_EXPECT_OK(ct_st_get(f, "big", &t));
    CT_EXPECT(t.nbytes == sizeof big && !memcmp(t.data, big, sizeof big));
    ct_st_close(f);
    free(before);
    unlink(p);
}

CT_TEST_MAIN()
