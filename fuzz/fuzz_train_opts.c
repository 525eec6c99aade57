/* `ctrain train` flag parsing (src/cli/train_opts.c): the input, split at NUL bytes, is the
 * argument list after "train" (model kind first). Every flag value is checked there; the
 * invariants below are what the trainer relies on afterwards. */
#include "cli/train_opts.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n > 4096) return 0;
    char *buf = malloc(n + 1);
    char *argv[256];
    int argc = 0;
    if (!buf) abort();
    memcpy(buf, data, n);
    buf[n] = 0;
    argv[argc++] = "train";
    for (size_t i = 0; i <= n && argc < 255;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;
    train_opts o;
    int rc = train_opts_parse(argc, argv, &o);
    if (rc == -1) {
        if (o.batch_size < 1 || o.grad_accum < 1 || o.epochs < 1 || o.lr <= 0 || o.keep < 0 || o.log_every < 1) abort();
        /* the flags' model is one the library builds (with --init-from the file's shape
         * replaces them); whatever the flags, the kind's list fields stay in bounds */
        if (!o.init_from && ct_model_config_check(&o.cfg) != CT_OK) abort();
        if (o.cfg.mlp.n_hidden > CT_MLP_MAX_HIDDEN) abort();
        for (int i = 0; i < o.cfg.mlp.n_hidden; i++) if (o.cfg.mlp.hidden[i] < 1) abort();
        /* a device the trainer resolves without a second check of the spelling */
        ct_device dv;
        if (o.device && strcmp(o.device, "auto") && ct_device_parse(o.device, &dv) != CT_OK) abort();
    }
    free(buf);
    return 0;
}
