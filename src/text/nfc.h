/* text/nfc.h — Unicode Normalization Form C over UTF-8 (Qwen2's normalizer), from the
 * tables scripts/gen_nfc_table.py generates (nfc_table.c). */
#ifndef CT_TEXT_NFC_H
#define CT_TEXT_NFC_H
#include <stddef.h>
#include <stdint.h>

#include "ctrain/core.h"

extern const uint32_t ct_nfc_ccc[][3], ct_nfc_decomp[][3], ct_nfc_decomp_pool[], ct_nfc_comp[][3];
extern const int ct_nfc_ccc_count, ct_nfc_decomp_count, ct_nfc_comp_count;

/* NFC of text[0..len) into *out (realloc'd to *cap bytes as needed); *out_len its length.
 * A byte that is not part of valid UTF-8 is kept as it is and blocks composition across it. */
ct_status ct_nfc_utf8(const unsigned char *text, size_t len, unsigned char **out, size_t *cap, size_t *out_len);
#endif
