/* IDX reader (the MNIST family's format), gzip or plain through zlib's gz* API, which reads
 * uncompressed files transparently. The header is checked against the file before the data
 * buffer is allocated, so a corrupt header can't ask for an absurd allocation. */
#include "ctrain/data.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

/* deflate can't compress better than ~1032:1; bounds what a gzip file of a given size holds. */
#define GZ_MAX_RATIO 1100u

static ct_status gz_fail(gzFile gz, const char *path, const char *what) {
    int zerr = 0;
    const char *msg = gzerror(gz, &zerr);
    if (zerr == Z_ERRNO) return ct_error(CT_ERR_IO, "%s: read failed while reading %s: %s", path, what, strerror(errno));
    if (zerr == Z_BUF_ERROR) return ct_error(CT_ERR_FORMAT, "%s: truncated gzip stream while reading %s", path, what);
    if (zerr != Z_OK) return ct_error(CT_ERR_FORMAT, "%s: corrupt gzip data while reading %s: %s", path, what, msg);
    return ct_error(CT_ERR_FORMAT, "%s: truncated: the file ends inside the %s", path, what);
}

/* Read exactly n bytes (gzread takes an unsigned count: go in chunks). */
static bool gz_read_all(gzFile gz, void *buf, size_t n) {
    char *p = buf;
    while (n) {
        unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
        int r = gzread(gz, p, chunk);
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

int64_t ct_idx_numel(const ct_idx *idx) {
    int64_t n = 1;
    for (int i = 0; i < idx->ndim; i++) n *= idx->dims[i];
    return n;
}

void ct_idx_free(ct_idx *idx) {
    if (!idx) return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}

ct_status ct_idx_load(const char *path, ct_idx *out) {
    memset(out, 0, sizeof *out);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ct_error(errno == ENOENT ? CT_ERR_NOT_FOUND : CT_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return ct_error(CT_ERR_IO, "%s: not a regular file", path);
    gzFile gz = gzopen(path, "rb");
    if (!gz) return ct_error(CT_ERR_IO, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    gzbuffer(gz, 1 << 17);
    ct_status st = CT_OK;
    uint8_t *data = NULL;
    unsigned char h[4 + 4 * CT_IDX_MAX_DIMS];

    if (!gz_read_all(gz, h, 4)) { st = gz_fail(gz, path, "4-byte magic number"); goto done; }
    if (h[0] || h[1]) {
        st = ct_error(CT_ERR_FORMAT, "%s: bad magic number 0x%02x%02x%02x%02x (an IDX file starts with 0x0000)", path, h[0], h[1],
                      h[2], h[3]);
        goto done;
    }
    ct_dtype dt;
    switch (h[2]) {
    case 0x08: dt = CT_U8; break;
    case 0x09: dt = CT_I8; break;
    case 0x0C: dt = CT_I32; break;
    case 0x0D: dt = CT_F32; break;
    case 0x0E: dt = CT_F64; break;
    case 0x0B: st = ct_error(CT_ERR_UNSUPPORTED, "%s: IDX element type 0x0B (int16) is not supported", path); goto done;
    default: st = ct_error(CT_ERR_FORMAT, "%s: bad magic number: unknown IDX element type 0x%02x", path, h[2]); goto done;
    }
    int nd = h[3];
    if (nd < 1 || nd > CT_IDX_MAX_DIMS) {
        st = ct_error(CT_ERR_FORMAT, "%s: %d dimensions in the header (1..%d allowed)", path, nd, CT_IDX_MAX_DIMS);
        goto done;
    }
    if (!gz_read_all(gz, h + 4, 4 * (size_t)nd)) { st = gz_fail(gz, path, "dimension sizes"); goto done; }
    size_t itemsize = ct_dtype_size(dt), nbytes = itemsize;
    int64_t span = (int64_t)itemsize; /* product of the non-zero dimensions, in bytes */
    for (int i = 0; i < nd; i++) {
        const unsigned char *q = h + 4 + 4 * i;
        uint32_t d = (uint32_t)q[0] << 24 | (uint32_t)q[1] << 16 | (uint32_t)q[2] << 8 | q[3];
        out->dims[i] = d;
        /* every product of dimensions (numel, sample sizes) must fit int64_t, also in an empty
         * file where another dimension is 0: [0xf9fffffd, 0xeeffffff, 0] overflowed numel */
        if (__builtin_mul_overflow(nbytes, (size_t)d, &nbytes) || (d && __builtin_mul_overflow(span, (int64_t)d, &span))) {
            st = ct_error(CT_ERR_FORMAT, "%s: dimensions overflow", path);
            goto done;
        }
    }
    size_t header = 4 + 4 * (size_t)nd, fsize = (size_t)sb.st_size;
    if (gzdirect(gz)) {
        if (fsize - header != nbytes) {
            st = ct_error(CT_ERR_FORMAT, "%s: the dimensions need %zu data bytes but the file has %zu%s", path, nbytes,
                          fsize - header, fsize - header < nbytes ? " (truncated?)" : "");
            goto done;
        }
    } else if (nbytes / GZ_MAX_RATIO > fsize) {
        st = ct_error(CT_ERR_FORMAT, "%s: the dimensions need %zu bytes, more than a %zu-byte gzip file can hold", path, nbytes,
                      fsize);
        goto done;
    }
    if (!(data = malloc(nbytes ? nbytes : 1))) {
        st = ct_error(CT_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, nbytes);
        goto done;
    }
    if (!gz_read_all(gz, data, nbytes)) { st = gz_fail(gz, path, "data"); goto done; }
    /* Reading past the end also makes zlib verify the gzip trailer (CRC and length). */
    char extra[64];
    int r = gzread(gz, extra, sizeof extra);
    if (r > 0) {
        st = ct_error(CT_ERR_FORMAT, "%s: unexpected bytes after the %zu data bytes the dimensions describe", path, nbytes);
        goto done;
    }
    int zerr = Z_OK;
    gzerror(gz, &zerr);
    /* zlib reports a stream cut before its trailer as a soft Z_BUF_ERROR with 0 bytes read */
    if (r < 0 || zerr != Z_OK) { st = gz_fail(gz, path, "end of the gzip stream"); goto done; }
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (itemsize > 1) /* IDX is big-endian */
        for (size_t i = 0; i < nbytes; i += itemsize)
            for (size_t a = 0, b = itemsize - 1; a < b; a++, b--) {
                uint8_t t = data[i + a];
                data[i + a] = data[i + b];
                data[i + b] = t;
            }
#endif
    out->dtype = dt;
    out->ndim = nd;
    out->data = data;
    out->nbytes = nbytes;
    data = NULL;
done:
    free(data);
    int cerr = gzclose_r(gz);
    if (cerr != Z_OK && st == CT_OK) {
        ct_idx_free(out);
        st = cerr == Z_BUF_ERROR ? ct_error(CT_ERR_FORMAT, "%s: truncated gzip stream", path)
                                 : ct_error(CT_ERR_IO, "%s: error closing the file", path);
    }
    if (st != CT_OK) memset(out, 0, sizeof *out);
    return st;
}
