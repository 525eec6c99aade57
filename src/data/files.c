/* What a dataset's files are called and how a text is split: Fashion-MNIST's IDX names (as
 * Debian's dataset-fashion-mnist and the original distribution ship them, gzipped or not)
 * and the held-out tail of a token dataset. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ctrain/data.h"

/* path gets DIR/NAME.gz, else DIR/NAME (gzipped first: Debian's package); false if neither is readable. */
static bool find_idx(const char *dir, const char *name, char *path, size_t n) {
    for (int gz = 1; gz >= 0; gz--) {
        snprintf(path, n, "%s/%s%s", dir, name, gz ? ".gz" : "");
        if (access(path, R_OK) == 0) return true;
    }
    return false;
}

ct_status ct_dataset_idx_open_dir(const char *dir, bool train, ct_dataset **out) {
    *out = NULL;
    const char *pre = train ? "train" : "t10k";
    char ip[4096], lp[4096], in[64], ln[64];
    snprintf(in, sizeof in, "%s-images-idx3-ubyte", pre);
    snprintf(ln, sizeof ln, "%s-labels-idx1-ubyte", pre);
    /* each file in either form: a gzipped images file beside plain labels is fine */
    if (!find_idx(dir, in, ip, sizeof ip))
        return ct_error(CT_ERR_NOT_FOUND, "no %s(.gz) in %s%s", in, dir,
                        train ? " (Fashion-MNIST: apt-get install dataset-fashion-mnist)" : "");
    /* not CT_ERR_NOT_FOUND, which callers read as "no images": this names the labels */
    if (!find_idx(dir, ln, lp, sizeof lp))
        return ct_error(CT_ERR_IO, "no %s(.gz) in %s beside %s", ln, dir, ip + strlen(dir) + 1);
    return ct_dataset_idx_open(ip, lp, out);
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
