/* A kind's options as text: the one parser behind `ctrain train`'s model flags, the model
 * file's metadata ("ctrain.<key>" = value) and ct_model_config_set. Each option names its
 * field in ct_model_config (an offset), so no code here knows a kind. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model_internal.h"

const ct_model_option *ct_model_option_find(ct_model_kind k, const char *key_or_flag) {
    const ct_model_kind_info *ki = ct_model_kind_info_of(k);
    if (!ki || !key_or_flag) return NULL;
    char flag[96];
    for (int i = 0; i < ki->noptions; i++) {
        const ct_model_option *o = &ki->options[i];
        if (!strcmp(key_or_flag, o->key)) return o;
        if ((o->flags & CT_OPT_FLAG) && !strcmp(key_or_flag, ct_model_option_flag(o, flag, sizeof flag))) return o;
    }
    return NULL;
}

const char *ct_model_option_flag(const ct_model_option *o, char *buf, size_t n) {
    if (o->flag) snprintf(buf, n, "%s", o->flag);
    else {
        snprintf(buf, n, "--%s", o->key);
        for (char *c = buf + 2; *c; c++)
            if (*c == '_') *c = '-';
    }
    return buf;
}

const char *ct_model_option_want(const ct_model_option *o, char *buf, size_t n) {
    if (o->want) snprintf(buf, n, "%s", o->want);
    else if (o->type == 'i') snprintf(buf, n, "an integer in [%.0f, %.0f]", o->lo, o->hi);
    else if (o->type == 'f') snprintf(buf, n, "a number in [%g, %g]", o->lo, o->hi);
    else if (o->type == 'l') snprintf(buf, n, "comma-separated integers in [%.0f, %.0f]", o->lo, o->hi);
    else if (o->words) {
        const char *bar = strchr(o->words, '|');
        snprintf(buf, n, "%.*s or %s", bar ? (int)(bar - o->words) : 0, o->words, bar ? bar + 1 : o->words);
    } else snprintf(buf, n, "true or false");
    return buf;
}

/* a whole int in [lo, hi] (bounded) or any int (not) */
static bool parse_int(const char *s, bool bounded, double lo, double hi, int *out) {
    if (!s || !*s) return false;
    char *e;
    errno = 0;
    long long v = strtoll(s, &e, 10);
    if (*e || errno || v < INT_MIN || v > INT_MAX || (bounded && (v < lo || v > hi))) return false;
    *out = (int)v;
    return true;
}

/* the value into the field, bounded by the option or (metadata: the kind's check decides)
 * not; false leaves the config unchanged */
static bool set_value(ct_model_config *c, const ct_model_option *o, const char *v, bool bounded) {
    char *at = (char *)c + o->off, *e;
    if (o->type == 'i') return parse_int(v, bounded, o->lo, o->hi, (int *)at);
    if (o->type == 'f') {
        if (!v || !*v) return false;
        if (!bounded) { /* metadata: the float printed with %.9g, read back to the bit */
            float f = strtof(v, &e);
            if (*e) return false;
            *(float *)at = f;
            return true;
        }
        errno = 0; /* a flag: the bounds hold for the number as written ("0.99") */
        double d = strtod(v, &e);
        if (*e || errno || !(d >= o->lo && d <= o->hi)) return false;
        *(float *)at = (float)d;
        return true;
    }
    if (o->type == 'b') {
        const char *bar = o->words ? strchr(o->words, '|') : NULL;
        bool t = !v || !strcmp(v, "true"), f = v && !strcmp(v, "false");
        if (bar && v) { /* "plain|flash": the first word is false */
            t = t || !strcmp(v, bar + 1);
            f = f || (strlen(v) == (size_t)(bar - o->words) && !strncmp(v, o->words, (size_t)(bar - o->words)));
        }
        if (!t && !f) return false;
        *(bool *)at = t;
        return true;
    }
    /* 'l': split by hand, as strtok would skip empty fields and accept "1,,2" */
    char buf[CT_MLP_MAX_HIDDEN * 12 + 16];
    int vals[CT_MLP_MAX_HIDDEN], n = 0;
    if (!v || strlen(v) >= sizeof buf) return false;
    if (!*v && !bounded) { /* metadata of an MLP without hidden layers */
        *(int *)((char *)c + o->len_off) = 0;
        return true;
    }
    snprintf(buf, sizeof buf, "%s", v);
    for (char *t = buf, *comma;; t = comma + 1) {
        comma = strchr(t, ',');
        if (comma) *comma = 0;
        if (n == CT_MLP_MAX_HIDDEN || !parse_int(t, bounded, o->lo, o->hi, &vals[n])) return false;
        n++;
        if (!comma) break;
    }
    memcpy(at, vals, (size_t)n * sizeof(int));
    *(int *)((char *)c + o->len_off) = n;
    return true;
}

ct_status ct_model_config_set(ct_model_config *c, const ct_model_option *o, const char *value) {
    if (set_value(c, o, value, true)) return CT_OK;
    char want[128];
    return ct_error(CT_ERR_INVALID, "%s expects %s, got '%s'", o->key, ct_model_option_want(o, want, sizeof want), value ? value : "(nothing)");
}

/* metadata: any value of the type; the kind's check judges the whole config afterwards */
bool ct_model_option_parse_(ct_model_config *c, const ct_model_option *o, const char *value) { return set_value(c, o, value, false); }

const char *ct_model_config_get(const ct_model_config *c, const ct_model_option *o, char *buf, size_t n) {
    const char *at = (const char *)c + o->off;
    if (o->type == 'i') snprintf(buf, n, "%d", *(const int *)at);
    else if (o->type == 'f') snprintf(buf, n, "%.9g", (double)*(const float *)at);
    else if (o->type == 'b') snprintf(buf, n, "%s", *(const bool *)at ? "true" : "false");
    else {
        size_t k = 0;
        buf[0] = 0;
        for (int j = 0; j < *(const int *)((const char *)c + o->len_off) && k < n; j++)
            k += (size_t)snprintf(buf + k, n - k, "%s%d", j ? "," : "", ((const int *)at)[j]);
    }
    return buf;
}

ct_model_config ct_model_cli_config(ct_model_kind k) {
    ct_model_config c = ct_model_default_config(k);
    const ct_model_kind_info *ki = ct_model_kind_info_of(k);
    for (int i = 0; ki && i < ki->noptions; i++)
        if (ki->options[i].cli_default) set_value(&c, &ki->options[i], ki->options[i].cli_default, false);
    return c;
}
