/* Checkpoint manifest and train_state readers: ct_checkpoint_verify and ct_checkpoint_load on
 * a directory holding the input, split at "\n====\n" into manifest.json, model.safetensors
 * and train_state.safetensors. The first byte chooses: bit 0 set, the harness replaces the
 * manifest by a correct one for the other two files (the fuzzer cannot forge CRC-32s, and
 * without it the loaders behind the check would never run); bit 1, AdamW instead of SGD with
 * momentum (different state tensors). The model is a small MLP (4-3-2), built once. */
#include <sys/stat.h>
#include <zlib.h>

#include "fuzz.h"

static ct_model *model;
static ct_optim *opt[2];
static ct_train_model tm;

static void setup(void) {
    ct_model_config cfg = ct_model_default_config(CT_MODEL_MLP);
    cfg.mlp.in = 4;
    cfg.mlp.n_hidden = 1;
    cfg.mlp.hidden[0] = 3;
    cfg.mlp.out = 2;
    if (ct_model_create(&cfg, 1, &model) != CT_OK) abort();
    tm = ct_train_model_builtin(model);
    ct_sgd_opts so = ct_sgd_default_opts();
    so.momentum = 0.9;
    if (ct_optim_create_sgd(ct_model_params(model), &so, &opt[0]) != CT_OK) abort();
    if (ct_optim_create_adamw(ct_model_params(model), NULL, &opt[1]) != CT_OK) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (!model) setup();
    if (n < 1) return 0;
    int mode = data[0];
    const uint8_t *part[3];
    size_t len[3] = {0, 0, 0};
    int k = fz_split(data + 1, n - 1, part, len, 3);
    char dir[600], p[700];
    snprintf(dir, sizeof dir, "%s/ckpt", fz_dir());
    mkdir(dir, 0700);
    static const char *names[3] = {"manifest.json", "model.safetensors", "train_state.safetensors"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (i >= k) { unlink(p); continue; } /* a missing file is a case too */
        char rel[64];
        snprintf(rel, sizeof rel, "ckpt/%s", names[i]);
        if (i == 0 && (mode & 1)) {
            char man[512];
            int m = snprintf(man, sizeof man,
                             "{\"step\": 1, \"format\": \"ctrain-checkpoint-1\", \"files\": {"
                             "\"model.safetensors\": {\"bytes\": %zu, \"crc32\": %lu}, "
                             "\"train_state.safetensors\": {\"bytes\": %zu, \"crc32\": %lu}}}",
                             len[1], crc32(0, k > 1 ? part[1] : (const Bytef *)"", (uInt)len[1]),
                             len[2], crc32(0, k > 2 ? part[2] : (const Bytef *)"", (uInt)len[2]));
            fz_write(rel, (const uint8_t *)man, (size_t)m);
        } else {
            fz_write(rel, part[i], len[i]);
        }
    }
    if (ct_checkpoint_verify(dir) == CT_OK) {
        ct_train_state ts;
        ct_checkpoint_load(dir, &tm, opt[(mode >> 1) & 1], &ts);
    }
    return 0;
}
