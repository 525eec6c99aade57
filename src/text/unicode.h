/* text/unicode.h — the Unicode classes the split patterns use, and UTF-8 decoding. */
#ifndef CT_TEXT_UNICODE_H
#define CT_TEXT_UNICODE_H
#include <stddef.h>
#include <stdint.h>

/* \p{L}, \p{N}, \s (White_Space) and everything else. */
enum { CT_UC_OTHER = 0, CT_UC_LETTER, CT_UC_NUMBER, CT_UC_SPACE };

extern const uint32_t ct_uc_letter_ranges[][2], ct_uc_number_ranges[][2], ct_uc_space_ranges[][2];
extern const int ct_uc_letter_count, ct_uc_number_count, ct_uc_space_count;

/* The class of code point cp (one of CT_UC_*). */
int ct_uc_class(uint32_t cp);

/* Decodes one code point from s[0..n) (n >= 1) into *cp and returns its length in bytes. A
 * byte that does not start a well-formed sequence (overlong, surrogate, past U+10FFFF,
 * truncated) is returned alone as the code point 0xFFFFFFFF, class OTHER: the byte-level
 * tokenizers then still carry it as a byte. */
int ct_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);
#endif
