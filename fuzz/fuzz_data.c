/* Token-shard (llm.c .bin) and text readers. First byte: bit 0 chooses the reader (0 shards,
 * 1 text), bits 1-6 the block size (1..64); for shards bit 7 opens the file twice as two
 * shards (the concatenation path). Every window is then read back through ct_dataset_get. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    int mode = data[0], block = ((mode >> 1) & 63) + 1;
    data++, n--;
    const char *path = fz_write(mode & 1 ? "in.txt" : "in.bin", data, n);
    ct_dataset *d;
    ct_status st;
    if (mode & 1) st = ct_dataset_text_open(path, block, &d);
    else {
        const char *paths[2] = {path, path};
        st = ct_dataset_tokens_open(paths, mode & 128 ? 2 : 1, block, &d);
    }
    if (st != CT_OK) return 0;
    int64_t len = ct_dataset_len(d), xn = ct_dataset_x_numel(d), yn = ct_dataset_y_numel(d);
    int classes = ct_dataset_num_classes(d);
    int32_t *x = malloc((size_t)xn * sizeof *x), *y = malloc((size_t)yn * sizeof *y);
    if (!x || !y) abort();
    for (int64_t i = 0; i < len; i++) {
        ct_dataset_get(d, i, x, y);
        /* the class count the model is built with must cover every token read */
        for (int64_t j = 0; j < xn; j++) if (x[j] < 0 || x[j] >= classes) abort();
        for (int64_t j = 0; j < yn; j++) if (y[j] < 0 || y[j] >= classes) abort();
    }
    free(x);
    free(y);
    ct_dataset_free(d);
    return 0;
}
