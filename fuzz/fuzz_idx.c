/* IDX reader, plain and gzip. The first byte chooses: bit 0 set, the rest is gzip-compressed
 * here first (so the fuzzer explores IDX headers behind a valid gzip stream); clear, the rest
 * is the file as is (which covers corrupt and truncated gzip streams too, by their magic).
 * Bit 1 also opens the file as an images+labels dataset against a fixed label file. */
#include <zlib.h>

#include "fuzz.h"

static const char *gz_write(const uint8_t *d, size_t n) {
    z_stream z = {0};
    if (deflateInit2(&z, 1, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
    size_t cap = deflateBound(&z, (uLong)n) + 64;
    uint8_t *out = malloc(cap);
    if (!out) abort();
    z.next_in = (Bytef *)d;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    if (deflate(&z, Z_FINISH) != Z_STREAM_END) abort();
    const char *p = fz_write("in-idx.gz", out, z.total_out);
    deflateEnd(&z);
    free(out);
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    int mode = data[0];
    data++, n--;
    const char *path = mode & 1 ? gz_write(data, n) : fz_write("in-idx", data, n);
    ct_idx x;
    if (ct_idx_load(path, &x) == CT_OK) {
        int64_t numel = ct_idx_numel(&x);
        if (x.ndim < 1 || x.ndim > CT_IDX_MAX_DIMS || (size_t)numel * ct_dtype_size(x.dtype) != x.nbytes) abort();
        fz_touch(x.data, x.nbytes);
        ct_idx_free(&x);
    }
    if (mode & 2) {
        /* two labels, 0 and 1: images with a first dimension of 2 pass the pairing check */
        static const uint8_t labels[] = {0, 0, 8, 1, 0, 0, 0, 2, 0, 1};
        const char *lp = fz_write("labels-idx", labels, sizeof labels);
        ct_dataset *d;
        if (ct_dataset_idx_open(path, lp, &d) == CT_OK) {
            int64_t len = ct_dataset_len(d);
            float *xb = malloc((size_t)ct_dataset_x_numel(d) * sizeof(float) + 1);
            int32_t y[1];
            if (!xb) abort();
            for (int64_t i = 0; i < len; i++) ct_dataset_get(d, i, xb, y);
            free(xb);
            ct_dataset_free(d);
        }
    }
    return 0;
}
