/* safetensors reader: ct_st_open on arbitrary bytes, then every tensor and a metadata key.
 * Seeds: fuzz/corpus/safetensors/ (small valid files and a few broken headers). */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const char *path = fz_write("in.safetensors", data, n);
    ct_st_file *f;
    if (ct_st_open(path, &f) != CT_OK) return 0;
    int count = ct_st_count(f);
    for (int i = 0; i < count; i++) {
        const char *name = ct_st_name(f, i);
        ct_st_tensor t;
        if (ct_st_get(f, name, &t) != CT_OK) continue;
        int64_t numel = 1;
        for (int d = 0; d < t.ndim; d++) numel *= t.shape[d];
        /* the documented contract: nbytes is numel times the dtype's size */
        if ((size_t)numel * ct_dtype_size(t.dtype) != t.nbytes) abort();
        fz_touch(t.data, t.nbytes);
    }
    const char *m = ct_st_metadata(f, "format");
    if (m) fz_touch(m, strlen(m));
    ct_st_close(f);
    return 0;
}
