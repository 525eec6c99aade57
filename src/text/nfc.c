/* NFC as Unicode's UAX #15 gives it: full canonical decomposition, canonical ordering of
 * combining marks (a stable sort by combining class within each run of non-starters), then
 * canonical composition of each mark with the last starter it is not blocked from. */
#include <stdlib.h>
#include <string.h>

#include "text/nfc.h"
#include "text/unicode.h"

#define RAW 0x80000000u /* a byte that is not valid UTF-8, carried through as RAW | byte */

enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7, LCOUNT = 19, VCOUNT = 21, TCOUNT = 28 };
enum { NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

static int ccc(uint32_t cp) {
    if (cp < 0x300 || cp >= RAW) return 0;
    int lo = 0, hi = ct_nfc_ccc_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < ct_nfc_ccc[mid][0]) hi = mid - 1;
        else if (cp > ct_nfc_ccc[mid][1]) lo = mid + 1;
        else return (int)ct_nfc_ccc[mid][2];
    }
    return 0;
}

/* The row of cp's canonical decomposition, or -1. */
static int decomp_row(uint32_t cp) {
    if (cp < 0xC0 || cp >= RAW) return -1;
    int lo = 0, hi = ct_nfc_decomp_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < ct_nfc_decomp[mid][0]) hi = mid - 1;
        else if (cp > ct_nfc_decomp[mid][0]) lo = mid + 1;
        else return mid;
    }
    return -1;
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    if (b < 0x300 || a >= RAW || b >= RAW) return 0;
    int lo = 0, hi = ct_nfc_comp_count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const uint32_t *r = ct_nfc_comp[mid];
        if (a < r[0] || (a == r[0] && b < r[1])) hi = mid - 1;
        else if (a > r[0] || b > r[1]) lo = mid + 1;
        else return r[2];
    }
    return 0;
}

/* Appends cp's full canonical decomposition (at most 4 code points) at d[*n]. */
static void decompose(uint32_t cp, uint32_t *d, size_t *n) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        d[(*n)++] = LBASE + s / NCOUNT;
        d[(*n)++] = VBASE + s % NCOUNT / TCOUNT;
        if (s % TCOUNT) d[(*n)++] = TBASE + s % TCOUNT;
        return;
    }
    int r = decomp_row(cp);
    if (r < 0) { d[(*n)++] = cp; return; }
    for (uint32_t i = 0; i < ct_nfc_decomp[r][2]; i++) d[(*n)++] = ct_nfc_decomp_pool[ct_nfc_decomp[r][1] + i];
}

static size_t put_utf8(unsigned char *o, uint32_t cp) {
    if (cp >= RAW) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xC0 | cp >> 6); o[1] = (unsigned char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12), o[1] = (unsigned char)(0x80 | (cp >> 6 & 63));
        o[2] = (unsigned char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18), o[1] = (unsigned char)(0x80 | (cp >> 12 & 63));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 63)), o[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

ct_status ct_nfc_utf8(const unsigned char *text, size_t len, unsigned char **out, size_t *cap, size_t *out_len) {
    /* a code point decomposes into at most 4 and each is at most 4 bytes of UTF-8 per input
     * byte of it; composition only shortens */
    uint32_t *d = malloc((4 * len + 1) * sizeof *d);
    if (!d) return ct_error(CT_ERR_NOMEM, "tokenizer: NFC of %zu bytes", len);
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = ct_utf8_next(text + i, len - i, &cp);
        decompose(cp == 0xFFFFFFFFu ? RAW | text[i] : cp, d, &n);
        i += (size_t)k;
    }
    /* canonical ordering: insertion sort of each run of non-starters, stable */
    for (size_t i = 1; i < n; i++) {
        int c = ccc(d[i]);
        if (!c) continue;
        uint32_t x = d[i];
        size_t j = i;
        while (j > 0 && ccc(d[j - 1]) > c) d[j] = d[j - 1], j--;
        d[j] = x;
    }
    /* composition in place: d[0..m) holds the result so far */
    size_t m = 0, starter = SIZE_MAX;
    int last = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = d[i];
        int c = ccc(cp);
        if (starter != SIZE_MAX && (m - 1 == starter || (last != 0 && last < c))) {
            uint32_t comp = compose(d[starter], cp);
            if (comp) { d[starter] = comp; continue; }
        }
        if (c == 0) starter = m, last = 0;
        else last = c;
        d[m++] = cp;
    }
    size_t need = 4 * m + 1;
    if (need > *cap) {
        unsigned char *o = realloc(*out, need);
        if (!o) { free(d); return ct_error(CT_ERR_NOMEM, "tokenizer: NFC of %zu bytes", len); }
        *out = o, *cap = need;
    }
    size_t k = 0;
    for (size_t i = 0; i < m; i++) k += put_utf8(*out + k, d[i]);
    free(d);
    *out_len = k;
    return CT_OK;
}
