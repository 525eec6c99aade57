/* Private to src/models/: what the Hugging Face readers and writers of the kinds share
 * (hf_common.c): config.json in and out, the export directory. */
#ifndef CT_HF_INTERNAL_H
#define CT_HF_INTERNAL_H
#include <cjson/cJSON.h>

#include "models/model_internal.h"

/* path's JSON object (a regular file of at most 16 MB, read without blocking on a FIFO);
 * CT_ERR_FORMAT naming the file when it is none. Free with cJSON_Delete. */
ct_status ct_hf_read_json_(const char *path, cJSON **out);
/* A whole number in int's range under key: false leaves *out (absent, or not a number, or
 * *st already an error); a number that is no such int sets *st to CT_ERR_FORMAT */
bool ct_hf_json_int_(const cJSON *j, const char *key, int *out, ct_status *st, const char *path);
/* A float under key in [lo, hi) (a double beyond float's range has no float): the same rules */
bool ct_hf_json_float_(const cJSON *j, const char *key, float lo, float hi, float *out, ct_status *st, const char *path);
/* key = v as the float's short text (1e-05, not 9.99999975e-06) where it reads back as v */
void ct_hf_json_add_float_(cJSON *j, const char *key, float v);
/* ct_model_config_check of a config read from path's files: CT_ERR_FORMAT naming path */
ct_status ct_hf_config_check_(const ct_model_config *c, const char *path);
/* mkdir -p */
ct_status ct_hf_mkdirs_(const char *path);
/* j as text into path through path.tmp and a rename; j is freed */
ct_status ct_hf_write_json_(cJSON *j, const char *path);
#endif
