/* text/pretok.h — the pre-tokenizers' split patterns, each a hand-written matcher that
 * gives the same pieces as the regex in the `tokenizers` package (Oniguruma): at each
 * position the first alternative that matches wins, as in a backtracking regex engine. */
#ifndef CT_TEXT_PRETOK_H
#define CT_TEXT_PRETOK_H
#include <stddef.h>
#include <stdint.h>

typedef enum {
    CT_PRETOK_NONE = 0, /* the whole text is one piece */
    CT_PRETOK_GPT2,     /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    CT_PRETOK_LLAMA3,   /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    CT_PRETOK_QWEN2,    /* the same with \p{N} for \p{N}{1,3} */
} ct_pretok;

/* The pattern a regex string names, or -1 for one not supported. */
int ct_pretok_from_regex(const char *re);

/* The length in code points (>= 1) of the piece starting at code point i of
 * cp[0..n) whose classes (CT_UC_*) are cls[0..n). */
size_t ct_pretok_match(ct_pretok p, const uint32_t *cp, const uint8_t *cls, size_t i, size_t n);
#endif
