/* Unicode classes by binary search over the generated ranges (unicode_table.c), with a
 * table for ASCII, which is most of most text; and strict UTF-8 decoding. */
#include "text/unicode.h"

static int in_ranges(const uint32_t (*r)[2], int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid][0]) hi = mid - 1;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

static int class_slow(uint32_t cp) {
    if (in_ranges(ct_uc_letter_ranges, ct_uc_letter_count, cp)) return CT_UC_LETTER;
    if (in_ranges(ct_uc_number_ranges, ct_uc_number_count, cp)) return CT_UC_NUMBER;
    if (in_ranges(ct_uc_space_ranges, ct_uc_space_count, cp)) return CT_UC_SPACE;
    return CT_UC_OTHER;
}

int ct_uc_class(uint32_t cp) {
    if (cp < 128) {
        if ((cp | 32) >= 'a' && (cp | 32) <= 'z') return CT_UC_LETTER;
        if (cp >= '0' && cp <= '9') return CT_UC_NUMBER;
        if (cp == ' ' || (cp >= 9 && cp <= 13)) return CT_UC_SPACE;
        return CT_UC_OTHER;
    }
    return cp > 0x10FFFF ? CT_UC_OTHER : class_slow(cp);
}

int ct_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    int len;
    uint32_t v, min;
    if (c < 0x80) { *cp = c; return 1; }
    if (c >= 0xC2 && c <= 0xDF) { len = 2; v = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; v = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; v = c & 0x07; min = 0x10000; }
    else goto bad;
    if (n < (size_t)len) goto bad;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) goto bad;
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) goto bad;
    *cp = v;
    return len;
bad:
    *cp = 0xFFFFFFFFu;
    return 1;
}
