/* The split patterns as matchers (see pretok.h). Alternatives are tried in the regex's
 * order; greedy runs followed by (?!\S) back off one code point, as the regex does. */
#include <string.h>

#include "text/pretok.h"
#include "text/unicode.h"

static const char *const gpt2_re =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char *const llama3_re =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const qwen2_re =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

int ct_pretok_from_regex(const char *re) {
    if (!strcmp(re, gpt2_re)) return CT_PRETOK_GPT2;
    if (!strcmp(re, llama3_re)) return CT_PRETOK_LLAMA3;
    if (!strcmp(re, qwen2_re)) return CT_PRETOK_QWEN2;
    return -1;
}

/* 's 't 're 've 'm 'll 'd at i: the length matched, or 0. Case-insensitive matching
 * follows Unicode case folding, under which U+017F (long s) is an s. */
static size_t contraction(const uint32_t *cp, size_t i, size_t n, int fold) {
    if (cp[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
    if (fold) {
        if (a == 0x17F) a = 's';
        if (a < 128) a |= (a >= 'A' && a <= 'Z') ? 32 : 0;
        if (b < 128) b |= (b >= 'A' && b <= 'Z') ? 32 : 0;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

static size_t run(const uint8_t *cls, size_t i, size_t n, int c) {
    size_t j = i;
    while (j < n && cls[j] == c) j++;
    return j - i;
}

/* \s+(?!\S)|\s+ at a space: the whole run at the end of the text or when it is one code
 * point; otherwise all but its last, which then leads the next piece. */
static size_t spaces(const uint8_t *cls, size_t i, size_t n) {
    size_t r = run(cls, i, n, CT_UC_SPACE);
    return (i + r == n || r == 1) ? r : r - 1;
}

static size_t match_gpt2(const uint32_t *cp, const uint8_t *cls, size_t i, size_t n) {
    size_t k = contraction(cp, i, n, 0);
    if (k) return k;
    size_t sp = (cp[i] == ' ' && i + 1 < n && cls[i + 1] != CT_UC_SPACE) ? 1 : 0;
    int c = cls[i + sp];
    if (c != CT_UC_SPACE) return sp + run(cls, i + sp, n, c);
    return spaces(cls, i, n);
}

static int is_nl(uint32_t c) { return c == '\r' || c == '\n'; }

static size_t match_llama3(const uint32_t *cp, const uint8_t *cls, size_t i, size_t n, size_t max_digits) {
    size_t k = contraction(cp, i, n, 1);
    if (k) return k;
    int c = cls[i];
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (c == CT_UC_LETTER) return run(cls, i, n, CT_UC_LETTER);
    if (c != CT_UC_NUMBER && !is_nl(cp[i]) && i + 1 < n && cls[i + 1] == CT_UC_LETTER)
        return 1 + run(cls, i + 1, n, CT_UC_LETTER);
    /* \p{N}{1,3} */
    if (c == CT_UC_NUMBER) {
        size_t r = run(cls, i, n, CT_UC_NUMBER);
        return r < max_digits ? r : max_digits;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t sp = (cp[i] == ' ' && i + 1 < n && cls[i + 1] == CT_UC_OTHER) ? 1 : 0;
    if (cls[i + sp] == CT_UC_OTHER) {
        size_t j = i + sp + run(cls, i + sp, n, CT_UC_OTHER);
        while (j < n && is_nl(cp[j])) j++;
        return j - i;
    }
    /* \s*[\r\n]+ : up to the run's last line break, if it has one */
    size_t r = run(cls, i, n, CT_UC_SPACE), last = 0;
    for (size_t j = i; j < i + r; j++)
        if (is_nl(cp[j])) last = j + 1;
    if (last) return last - i;
    return spaces(cls, i, n);
}

size_t ct_pretok_match(ct_pretok p, const uint32_t *cp, const uint8_t *cls, size_t i, size_t n) {
    switch (p) {
    case CT_PRETOK_GPT2: return match_gpt2(cp, cls, i, n);
    case CT_PRETOK_LLAMA3: return match_llama3(cp, cls, i, n, 3);
    case CT_PRETOK_QWEN2: return match_llama3(cp, cls, i, n, 1);
    default: return n - i;
    }
}
