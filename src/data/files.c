/* What a dataset's files are called and how a text is split: Fashion-MNIST's IDX names (as
 * Debian's dataset-fashion-mnist and the original distribution ship them, gzipped or not)
 * and the held-out tail of a token dataset. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ctrain/data.h"

ct_status ct_dataset_idx_open_dir(const char *dir, bool train, ct_dataset **out) {
    *out = NULL;
    const char *pre = train ? "train" : "t10k";
    char ip[4096], lp[4096];
    /* gzipped first (Debian's package), then uncompressed files */
    for (int gz = 1; gz >= 0; gz--) {
        snprintf(ip, sizeof ip, "%s/%s-images-idx3-ubyte%s", dir, pre, gz ? ".gz" : "");
        snprintf(lp, sizeof lp, "%s/%s-labels-idx1-ubyte%s", dir, pre, gz ? ".gz" : "");
        if (access(ip, R_OK) == 0) return ct_dataset_idx_open(ip, lp, out);
    }
    return ct_error(CT_ERR_NOT_FOUND, "no %s-images-idx3-ubyte(.gz) in %s%s", pre, dir,
                    train ? " (Fashion-MNIST: apt-get install dataset-fashion-mnist)" : "");
}

ct_status ct_dataset_split_holdout(const ct_dataset *d, ct_dataset **train, ct_dataset **heldout) {
    *train = *heldout = NULL;
    int64_t n = ct_dataset_len(d);
    int64_t first = n >= 20 ? n - n / 20 : n; /* the last 5% of windows, once there are 20 */
    ct_status st = ct_dataset_subset(d, 0, first, train);
    if (st == CT_OK) st = ct_dataset_subset(d, first, n - first, heldout);
    if (st != CT_OK) {
        ct_dataset_free(*train);
        *train = NULL;
    }
    return st;
}
