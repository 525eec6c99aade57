/* The configuration table (src/core/config.c): every environment variable ctrain reads.
 * First byte: the variable (modulo the table size); second byte, bit 0: set through
 * ct_config_set (validated on the way in) or, clear, put straight into the environment as a
 * launcher or a user would (parsed when read). The rest, up to a NUL, is the value. Then the
 * value is checked and read back through the accessor of its type, as ctrain would. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 2 || n > 4096) return 0;
    ct_config_var v = (ct_config_var)(data[0] % CT_CFG_COUNT_);
    const ct_config_info *c = ct_config_info_of(v);
    char *val = malloc(n - 1);
    if (!val || !c) abort();
    memcpy(val, data + 2, n - 2);
    val[n - 2] = 0;
    if (data[1] & 1) ct_config_set(c->name, val);
    else setenv(c->name, val, 1);
    ct_status st = ct_config_check(v);
    switch (c->type) {
    case CT_CFG_INT:
    case CT_CFG_BYTES: {
        long x = ct_config_int(v);
        /* a valid value is within the table's range; an invalid one falls back */
        if (st == CT_OK && ct_config_is_set(v) && !(x >= c->min && x <= c->max)) abort();
        break;
    }
    case CT_CFG_FLOAT: {
        double x = ct_config_float(v);
        if (st == CT_OK && ct_config_is_set(v) && !(x >= c->min && x <= c->max)) abort();
        break;
    }
    case CT_CFG_BOOL: ct_config_bool(v); break;
    case CT_CFG_CHOICE: ct_config_choice(v); break;
    default: {
        const char *s = ct_config_str(v);
        if (s) fz_touch(s, strlen(s));
    }
    }
    ct_config_unset(c->name);
    free(val);
    return 0;
}
