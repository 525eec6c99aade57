/* A model from its file alone (ct_model_open: ctrain's config metadata, or a GPT-2 state_dict
 * in ctrain's or Hugging Face's layout with an optional config.json beside it), the path of
 * `ctrain eval`, `generate` and `--init-from`. Input: model.safetensors and config.json split
 * at "\n====\n" (no second part: no config.json). The model a file describes is built before
 * its weights are read, so a small file must not be able to ask for an unbounded one: its
 * parameters are bounded by the file's float values (ct_model_config_fits_file), and
 * -rss_limit_mb catches a way around that. */
#include <sys/stat.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const uint8_t *part[2];
    size_t len[2];
    int k = fz_split(data, n, part, len, 2);
    char dir[600], cfg[700];
    snprintf(dir, sizeof dir, "%s/model", fz_dir());
    mkdir(dir, 0700);
    const char *path = fz_write("model/model.safetensors", part[0], len[0]);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    if (k > 1) fz_write("model/config.json", part[1], len[1]);
    else unlink(cfg);
    ct_model *m;
    if (ct_model_open(path, &m) == CT_OK) ct_model_free(m);
    return 0;
}
