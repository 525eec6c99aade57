/* text/bpe.h — the tokenizer's tables, shared by the readers (load.c) and the
 * encoder/decoder (bpe.c). */
#ifndef CT_TEXT_BPE_H
#define CT_TEXT_BPE_H
#include <stdbool.h>

#include "ctrain/text.h"
#include "text/pretok.h"

typedef struct { uint32_t off, len; } ct_span; /* bytes in the pool; len UINT32_MAX: none */

typedef struct {
    ct_span text;
    int32_t id;
    bool lstrip, rstrip;
} ct_added_tok;

struct ct_tokenizer {
    char *pool;
    size_t pool_len, pool_cap;
    int32_t n_ids;
    ct_span *form;    /* id -> the vocabulary entry as written in the file (UTF-8) */
    ct_span *bytes;   /* id -> what it decodes to */
    int32_t *vocab;   /* open-addressed set of ids keyed by form; -1 empty */
    size_t vocab_cap;
    uint64_t *mkey;   /* merges: (left << 32 | right) -> rank, merged id; UINT64_MAX empty */
    uint32_t *mrank;
    int32_t *mnew;
    size_t merge_cap;
    int32_t byte_id[256]; /* the token of each single byte, -1 if none */
    ct_added_tok *added;
    int n_added;
    uint8_t added_first[256]; /* 1 where some added token starts with that byte */
    ct_pretok pretok;
    bool add_prefix_space, ignore_merges;
    int32_t unk, bos, eos;
    bool nfc;           /* the NFC normalizer (Qwen2) */
    /* SentencePiece-style BPE (Llama 2): spaces become U+2581, merges over characters */
    bool sp, sp_split;  /* sp_split: Metaspace's split, a piece at each U+2581 */
    bool sp_cut;        /* no token has U+2581 after another character: merges never cross
                         * the start of a word, so words can be merged one by one */
    int sp_prepend;     /* CT_SP_PREPEND_*: where a U+2581 goes before a segment */
    bool byte_fallback, fuse_unk, strip_lead; /* strip_lead: decode drops one leading space */
    int32_t char_id[128]; /* sp: the token of each ASCII character, -1 if none */
};

enum {
    CT_SP_PREPEND_NONE = 0,
    CT_SP_PREPEND_ALL,    /* the Prepend normalizer: before every non-empty segment */
    CT_SP_PREPEND_ALWAYS, /* Metaspace "always": unless the segment starts with one */
    CT_SP_PREPEND_FIRST,  /* Metaspace "first": the same, for the text's first segment only */
};

/* The byte-level alphabet: byte -> code point, and code point (< 324) -> byte or -1. */
uint32_t ct_bl_char(unsigned b);
int ct_bl_byte(uint32_t cp);

/* Hash table plumbing for the readers. */
ct_status ct_tok_pool_add(ct_tokenizer *t, const char *s, size_t n, ct_span *out);
int32_t ct_tok_vocab_find(const ct_tokenizer *t, const char *s, size_t n);
ct_status ct_tok_vocab_build(ct_tokenizer *t);
ct_status ct_tok_merges_alloc(ct_tokenizer *t, size_t n_merges);
/* Adds merge (a, b) -> m with the next rank; false when the pair is already there. */
bool ct_tok_merge_add(ct_tokenizer *t, int32_t a, int32_t b, int32_t m, uint32_t rank);
#endif
