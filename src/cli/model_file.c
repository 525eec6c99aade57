/* --checkpoint DIR|FILE for eval, generate and export: a weights file, an output directory (its
 * model.safetensors, else its newest valid checkpoint) or a checkpoint directory, sharded
 * (--shard) or not. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "ctrain/ctrain.h"

static bool is_file(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISREG(s.st_mode);
}

ct_status cli_open_model(const char *arg, ct_model **out, char *path, size_t n) {
    *out = NULL;
    struct stat s;
    if (!arg || !*arg) return ct_error(CT_ERR_INVALID, "--checkpoint DIR|FILE is required");
    if (stat(arg, &s) != 0) return ct_error(CT_ERR_NOT_FOUND, "--checkpoint %s: %s", arg, strerror(errno));
    if (S_ISREG(s.st_mode)) {
        snprintf(path, n, "%s", arg);
    } else if (ct_fsdp_checkpoint_world(arg)) { /* a sharded checkpoint (--shard): assembled whole */
        snprintf(path, n, "%s", arg);
        return ct_fsdp_open_model(arg, out);
    } else {
        char dir[4200], root[4300];
        snprintf(path, n, "%s/model.safetensors.index.json", arg);
        bool sharded = is_file(path); /* a sharded Hugging Face checkpoint: the library reads the index */
        snprintf(path, n, "%s/model.safetensors", arg);
        if (sharded && !is_file(path)) snprintf(path, n, "%s", arg);
        else if (!is_file(path)) {
            snprintf(root, sizeof root, "%s/checkpoints", arg);
            ct_status st = ct_checkpoint_find_latest(root, dir, sizeof dir);
            if (st != CT_OK) st = ct_checkpoint_find_latest(arg, dir, sizeof dir);
            if (st != CT_OK)
                return ct_error(CT_ERR_NOT_FOUND, "--checkpoint %s: no model.safetensors in it and no valid checkpoint under it", arg);
            if (ct_fsdp_checkpoint_world(dir)) {
                snprintf(path, n, "%s", dir);
                return ct_fsdp_open_model(dir, out);
            }
            snprintf(path, n, "%s/model.safetensors", dir);
        }
    }
    return ct_model_open(path, out);
}
