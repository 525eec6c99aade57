/* config.json in and out for the kinds' Hugging Face layouts (hf_internal.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/hf_internal.h"

/* A config.json is read only when it is a regular file of at most 16 MB: a FIFO (opened
 * without blocking, then refused) would hang the reader, a directory has nothing to read. */
static ct_status read_all(const char *path, char **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return ct_error(CT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    ct_status st = CT_OK;
    if (fstat(fd, &sb) != 0) st = ct_error(CT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode)) st = ct_error(CT_ERR_FORMAT, "%s: not a regular file", path);
    else if (sb.st_size >= (1 << 24)) st = ct_error(CT_ERR_FORMAT, "%s: %lld bytes, too large for a config", path, (long long)sb.st_size);
    char *buf = st == CT_OK ? malloc((size_t)sb.st_size + 1) : NULL;
    if (st == CT_OK && !buf) st = ct_error(CT_ERR_NOMEM, "%s: out of memory", path);
    size_t got = 0;
    while (st == CT_OK && got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = ct_error(CT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        else if (r == 0) st = ct_error(CT_ERR_IO, "%s: cannot read: the file shrank while being read", path);
        else got += (size_t)r;
    }
    close(fd);
    if (st != CT_OK) { free(buf); return st; }
    buf[got] = 0;
    *out = buf;
    return CT_OK;
}

ct_status ct_hf_read_json_(const char *path, cJSON **out) {
    *out = NULL;
    char *text;
    ct_status rs = read_all(path, &text);
    if (rs != CT_OK) return rs;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j || !cJSON_IsObject(j)) { cJSON_Delete(j); return ct_error(CT_ERR_FORMAT, "%s: not a JSON object", path); }
    *out = j;
    return CT_OK;
}

bool ct_hf_json_int_(const cJSON *j, const char *key, int *out, ct_status *st, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || *st != CT_OK) return false;
    double d = v->valuedouble; /* checked before the cast: one outside int's range is undefined */
    if (!(d >= -2147483648.0 && d <= 2147483647.0) || d != (double)(int)d) {
        *st = ct_error(CT_ERR_FORMAT, "%s: %s = %g is not an integer", path, key, d);
        return false;
    }
    *out = (int)d;
    return true;
}

bool ct_hf_json_float_(const cJSON *j, const char *key, float lo, float hi, float *out, ct_status *st, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || *st != CT_OK) return false;
    double d = v->valuedouble;
    if (!(d >= lo && d < hi)) {
        *st = ct_error(CT_ERR_FORMAT, "%s: %s = %g must be in [%g, %g)", path, key, d, (double)lo, (double)hi);
        return false;
    }
    *out = (float)d;
    return true;
}

void ct_hf_json_add_float_(cJSON *j, const char *key, float v) {
    char s[32];
    snprintf(s, sizeof s, "%.6g", (double)v);
    if (strtof(s, NULL) != v) snprintf(s, sizeof s, "%.9g", (double)v);
    /* a whole number keeps a point, as Python writes a float (500000.0) */
    if (!strpbrk(s, ".eEn")) strncat(s, ".0", sizeof s - strlen(s) - 1);
    cJSON_AddRawToObject(j, key, s);
}

ct_status ct_hf_config_check_(const ct_model_config *c, const char *path) {
    if (ct_model_config_check(c) == CT_OK) return CT_OK;
    char why[256];
    snprintf(why, sizeof why, "%s", ct_last_error());
    return ct_error(CT_ERR_FORMAT, "%s: %s", path, why);
}

ct_status ct_hf_mkdirs_(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1;; p++) {
        if (*p && *p != '/') continue;
        char c = *p;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return ct_error(CT_ERR_IO, "cannot create %s: %s", buf, strerror(errno));
        if (!c) return CT_OK;
        *p = c;
    }
}

ct_status ct_hf_write_json_(cJSON *j, const char *path) {
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return ct_error(CT_ERR_NOMEM, "%s: out of memory", path);
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *fp = fopen(tmp, "wb");
    bool ok = fp && fputs(text, fp) >= 0 && fputc('\n', fp) != EOF;
    if (fp && fclose(fp) != 0) ok = false;
    free(text);
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return ct_error(CT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    return CT_OK;
}
