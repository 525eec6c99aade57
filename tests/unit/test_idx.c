/* IDX reader: the real Fashion-MNIST files, hand-made files (plain and gzip, every element
 * type) and corrupted or truncated ones (each CT_ERR_FORMAT naming the file). */
#include "ct_test.h"
#include "ctrain/data.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define FMNIST "/usr/share/datasets/fashion-mnist"


static void write_gz(const char *path, const void *p, size_t n) {
    gzFile g = gzopen(path, "wb");
    if (!g) abort();
    if (n) gzwrite(g, p, (unsigned)n);
    gzclose(g);
}

/* Reference values computed with /usr/bin/python3 from Debian's dataset-fashion-mnist:
 *   b = gzip.open(path).read(); data = numpy.frombuffer(b[4 + 4*ndim:], numpy.uint8)
 *   data.sum(dtype=numpy.uint64), hex(zlib.crc32(data.tobytes())), data[:3]  */
static void check_file(const char *name, int ndim, int64_t n0, uint64_t sum, uint32_t crc, int first_label) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", FMNIST, name);
    ct_idx x;
    ct_status st = ct_idx_load(path, &x);
    if (st != CT_OK) { CT_FAILF("%s", ct_last_error()); return; }
    CT_EXPECT(x.dtype == CT_U8);
    CT_EXPECT_EQ(x.ndim, ndim);
    CT_EXPECT_EQ(x.dims[0], n0);
    if (ndim == 3) CT_EXPECT(x.dims[1] == 28 && x.dims[2] == 28);
    CT_EXPECT_EQ((int64_t)x.nbytes, ct_idx_numel(&x));
    uint64_t s = 0;
    for (size_t i = 0; i < x.nbytes; i++) s += x.data[i];
    CT_EXPECT_EQ(s, sum);
    CT_EXPECT_EQ(crc32(0, x.data, (uInt)x.nbytes), crc);
    if (first_label >= 0) CT_EXPECT_EQ(x.data[0], first_label);
    ct_idx_free(&x);
    CT_EXPECT(x.data == NULL && x.ndim == 0);
}

CT_TEST(fashion_mnist_train) {
    if (access(FMNIST "/train-images-idx3-ubyte.gz", R_OK) != 0) CT_SKIP(FMNIST " missing (apt-get install dataset-fashion-mnist)");
    check_file("train-labels-idx1-ubyte.gz", 1, 60000, 270000ull, 0x2ed6e46au, 9); /* first label: 9, ankle boot */
    check_file("train-images-idx3-ubyte.gz", 3, 60000, 3431114169ull, 0xae65dccdu, -1);
}

CT_TEST(fashion_mnist_test) {
    if (access(FMNIST "/t10k-images-idx3-ubyte.gz", R_OK) != 0) CT_SKIP(FMNIST " missing (apt-get install dataset-fashion-mnist)");
    check_file("t10k-labels-idx1-ubyte.gz", 1, 10000, 45000ull, 0x242bc73fu, 9);
    check_file("t10k-images-idx3-ubyte.gz", 3, 10000, 573469082ull, 0x12728439u, -1);
}

/* magic for `type` with `nd` dims, then the dims big-endian */
static size_t header(unsigned char *h, int type, int nd, const uint32_t *dims) {
    h[0] = h[1] = 0;
    h[2] = (unsigned char)type;
    h[3] = (unsigned char)nd;
    for (int i = 0; i < nd; i++)
        for (int b = 0; b < 4; b++) h[4 + 4 * i + b] = (unsigned char)(dims[i] >> (24 - 8 * b));
    return 4 + 4 * (size_t)nd;
}

CT_TEST(plain_and_gzip) {
    unsigned char buf[4096];
    uint32_t dims[3] = {3, 4, 5};
    size_t h = header(buf, 0x08, 3, dims);
    for (int i = 0; i < 60; i++) buf[h + i] = (unsigned char)(i * 7);
    const char *p = ct_test_tmp_path("a.idx"), *g = ct_test_tmp_path("a.idx.gz");
    ct_test_write_file(p, buf, h + 60);
    write_gz(g, buf, h + 60);
    for (int k = 0; k < 2; k++) {
        ct_idx x;
        CT_EXPECT_OK(ct_idx_load(k ? g : p, &x));
        CT_EXPECT(x.ndim == 3 && x.dims[0] == 3 && x.dims[1] == 4 && x.dims[2] == 5 && x.nbytes == 60 && x.dtype == CT_U8);
        for (int i = 0; i < 60 && x.data; i++) CT_EXPECT_EQ(x.data[i], (unsigned char)(i * 7));
        ct_idx_free(&x);
    }
    /* multi-byte types come back in host order */
    uint32_t d1[1] = {3};
    h = header(buf, 0x0C, 1, d1);
    int32_t iv[3] = {-2, 70000, 0x01020304};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++) buf[h + 4 * i + b] = (unsigned char)((uint32_t)iv[i] >> (24 - 8 * b));
    write_gz(g, buf, h + 12);
    ct_idx x;
    CT_EXPECT_OK(ct_idx_load(g, &x));
    CT_EXPECT(x.dtype == CT_I32 && x.nbytes == 12);
    if (x.data) for (int i = 0; i < 3; i++) CT_EXPECT_EQ(((int32_t *)x.data)[i], iv[i]);
    ct_idx_free(&x);
    h = header(buf, 0x0D, 1, d1);
    float fv[3] = {1.5f, -0.25f, 3e10f};
    for (int i = 0; i < 3; i++) {
        uint32_t u;
        memcpy(&u, &fv[i], 4);
        for (int b = 0; b < 4; b++) buf[h + 4 * i + b] = (unsigned char)(u >> (24 - 8 * b));
    }
    ct_test_write_file(p, buf, h + 12);
    CT_EXPECT_OK(ct_idx_load(p, &x));
    CT_EXPECT(x.dtype == CT_F32);
    if (x.data) for (int i = 0; i < 3; i++) CT_EXPECT(((float *)x.data)[i] == fv[i]);
    ct_idx_free(&x);
    /* a zero-length dimension is valid */
    uint32_t d0[2] = {0, 28};
    h = header(buf, 0x08, 2, d0);
    ct_test_write_file(p, buf, h);
    CT_EXPECT_OK(ct_idx_load(p, &x));
    CT_EXPECT(x.ndim == 2 && x.dims[0] == 0 && x.nbytes == 0);
    ct_idx_free(&x);
    unlink(p);
    unlink(g);
}

static void expect_bad(const char *path, ct_status want, const char *what, const char *needle) {
    ct_idx x;
    memset(&x, 0x5a, sizeof x);
    ct_status st = ct_idx_load(path, &x);
    CT_EXPECTF(st == want, "%s: status %d (%s), want %d", what, st, ct_last_error(), want);
    CT_EXPECTF(strstr(ct_last_error(), path), "%s: message does not name the file: %s", what, ct_last_error());
    CT_EXPECTF(!needle || strstr(ct_last_error(), needle), "%s: message lacks '%s': %s", what, needle, ct_last_error());
    CT_EXPECTF(!x.data && !x.ndim && !x.nbytes, "%s: output not cleared on failure", what);
}

CT_TEST(corrupted) {
    unsigned char buf[4096];
    uint32_t dims[2] = {10, 10};
    size_t h = header(buf, 0x08, 2, dims);
    memset(buf + h, 7, 100);
    const char *p = ct_test_tmp_path("bad.idx"), *g = ct_test_tmp_path("bad.idx.gz");
    for (int gz = 0; gz < 2; gz++) {
        void (*wr)(const char *, const void *, size_t) = gz ? write_gz : ct_test_write_file;
        const char *f = gz ? g : p;
        wr(f, "", 0);
        expect_bad(f, CT_ERR_FORMAT, "empty", "magic");
        wr(f, buf, 2);
        expect_bad(f, CT_ERR_FORMAT, "2 bytes", "truncated");
        unsigned char b2[4096];
        memcpy(b2, buf, h + 100);
        b2[0] = 0x1f;
        wr(f, b2, h + 100);
        expect_bad(f, CT_ERR_FORMAT, "bad magic", "magic");
        memcpy(b2, buf, h + 100);
        b2[2] = 0x07;
        wr(f, b2, h + 100);
        expect_bad(f, CT_ERR_FORMAT, "unknown type", "type");
        b2[2] = 0x0B;
        wr(f, b2, h + 100);
        expect_bad(f, CT_ERR_UNSUPPORTED, "int16", "int16");
        memcpy(b2, buf, h + 100);
        b2[3] = 0;
        wr(f, b2, h + 100);
        expect_bad(f, CT_ERR_FORMAT, "zero dims", "dimensions");
        b2[3] = 9;
        wr(f, b2, h + 100);
        expect_bad(f, CT_ERR_FORMAT, "9 dims", "dimensions");
        wr(f, buf, 6); /* inside the dims */
        expect_bad(f, CT_ERR_FORMAT, "truncated dims", "truncated");
        wr(f, buf, h + 99); /* one data byte short */
        expect_bad(f, CT_ERR_FORMAT, "truncated data", gz ? "truncated" : "need 100");
        memset(buf + h + 100, 0, 8);
        wr(f, buf, h + 101); /* one byte too many */
        expect_bad(f, CT_ERR_FORMAT, "extra byte", gz ? "unexpected bytes" : "need 100");
        uint32_t huge[3] = {60000, 60000, 60000};
        size_t hh = header(b2, 0x0E, 3, huge);
        wr(f, b2, hh + 16);
        expect_bad(f, CT_ERR_FORMAT, "huge dims", NULL);
        uint32_t over[8] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 4, 4, 4, 4, 4};
        hh = header(b2, 0x08, 8, over);
        wr(f, b2, hh + 16);
        expect_bad(f, CT_ERR_FORMAT, "overflowing dims", "overflow");
    }
    /* a gzip stream cut short, and one with a flipped byte (bad CRC or bad deflate data) */
    size_t n = 0;
    write_gz(g, buf, h + 100);
    unsigned char *z = ct_test_read_file(g, &n);
    CT_ASSERT(z && n > 20);
    ct_test_write_file(g, z, n - 4); /* trailer cut: length field missing */
    expect_bad(g, CT_ERR_FORMAT, "gzip without trailer", "truncated");
    ct_test_write_file(g, z, n / 2);
    expect_bad(g, CT_ERR_FORMAT, "gzip cut in half", "truncated");
    z[n - 6] ^= 0xff; /* inside the CRC */
    ct_test_write_file(g, z, n);
    expect_bad(g, CT_ERR_FORMAT, "bad gzip crc", "corrupt");
    free(z);
    expect_bad("/nonexistent/train-images-idx3-ubyte.gz", CT_ERR_NOT_FOUND, "missing file", NULL);
    expect_bad(ct_test_tmp_dir(), CT_ERR_IO, "directory", NULL);
    unlink(p);
    unlink(g);
}

/* The real labels file cut at many lengths: always a clean CT_ERR_FORMAT. */
CT_TEST(truncated_real_file) {
    size_t n;
    unsigned char *z = ct_test_read_file(FMNIST "/t10k-labels-idx1-ubyte.gz", &n);
    if (!z) CT_SKIP(FMNIST " missing (apt-get install dataset-fashion-mnist)");
    const char *g = ct_test_tmp_path("cut-labels.gz");
    for (size_t len = 0; len < n; len += 61) {
        ct_test_write_file(g, z, len);
        ct_idx x;
        ct_status st = ct_idx_load(g, &x);
        CT_EXPECTF(st == CT_ERR_FORMAT, "cut at %zu of %zu: status %d (%s)", len, n, st, ct_last_error());
        ct_idx_free(&x);
    }
    free(z);
    unlink(g);
}

CT_TEST(empty_file_with_huge_dimensions) {
    /* found by fuzz_idx: u8 [0xf9fffffd, 0xeeffffff, 0] holds 0 bytes, so its size checked out,
     * but the product of the first two dimensions overflowed int64_t in ct_idx_numel */
    static const unsigned char f[] = {0, 0, 8, 3, 0xf9, 0xff, 0xff, 0xfd, 0xee, 0xff, 0xff, 0xff, 0, 0, 0, 0};
    const char *p = ct_test_tmp_path("huge_dims.idx");
    ct_test_write_file(p, f, sizeof f);
    ct_idx x;
    CT_EXPECT_EQ(ct_idx_load(p, &x), CT_ERR_FORMAT);
    CT_EXPECT(strstr(ct_last_error(), "overflow") != NULL);
    /* the same with the empty dimension first is a valid empty array */
    static const unsigned char g[] = {0, 0, 8, 3, 0, 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 28};
    ct_test_write_file(p, g, sizeof g);
    CT_EXPECT_OK(ct_idx_load(p, &x));
    CT_EXPECT_EQ(ct_idx_numel(&x), 0);
    ct_idx_free(&x);
}

CT_TEST_MAIN()
