/* ctrain/text.h — tokenizers: byte-level BPE as GPT-2, Llama 3 and Qwen2 use it, and
 * SentencePiece-style BPE with byte fallback as Llama 2 and TinyLlama use it.
 *
 *   ct_tokenizer *tok;
 *   if (ct_tokenizer_load("tokenizer.json", &tok) != CT_OK) { puts(ct_last_error()); return 1; }
 *   int32_t *ids; size_t n;
 *   ct_tokenizer_encode_alloc(tok, text, strlen(text), &ids, &n);   // same ids as `tokenizers`
 *   char buf[4096]; size_t len;
 *   ct_tokenizer_decode(tok, ids, n, buf, sizeof buf, &len);       // buf[0..len) == text
 *   free(ids);
 *   ct_tokenizer_free(tok);
 *
 * Encoding matches the Hugging Face `tokenizers` package token for token (docs/tokenizer.md
 * says what is supported and how that was checked). Text is bytes: valid UTF-8 is split as
 * the pre-tokenizer's pattern says; a byte that is not part of valid UTF-8 is carried as a
 * byte, so decode(encode(x)) == x for any bytes when the vocabulary has all 256 bytes.
 * Encoding and decoding only read the tokenizer: threads may share one.
 */
#ifndef CTRAIN_TEXT_H
#define CTRAIN_TEXT_H

#include "ctrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_tokenizer ct_tokenizer;

/* Reads a Hugging Face tokenizer.json (model BPE; pre-tokenizer ByteLevel, or a Split with
 * the Llama 3 or Qwen2 pattern before ByteLevel, NFC or no normalizer; or SentencePiece
 * style: Llama 2's Prepend/Replace normalizer or a Metaspace pre-tokenizer, byte_fallback,
 * fuse_unk; added and special tokens). CT_ERR_FORMAT
 * for a malformed file, CT_ERR_UNSUPPORTED for a valid one this reader does not handle. */
ct_status ct_tokenizer_load(const char *path, ct_tokenizer **out);
/* Reads GPT-2's vocab.json and merges.txt (as GPT2TokenizerFast: ByteLevel, GPT-2 pattern,
 * <|endoftext|> a special token when the vocabulary has it). */
ct_status ct_tokenizer_load_gpt2(const char *vocab_json, const char *merges_txt, ct_tokenizer **out);
void ct_tokenizer_free(ct_tokenizer *tok);

/* Encodes text[0..len) without adding BOS/EOS. Writes at most cap ids and sets *n to the
 * number of ids the text has, as snprintf does: *n > cap means the ids did not fit. */
ct_status ct_tokenizer_encode(const ct_tokenizer *tok, const char *text, size_t len,
                              int32_t *ids, size_t cap, size_t *n);
/* The same into a malloc'd array (free it); *ids is NULL when *n is 0. */
ct_status ct_tokenizer_encode_alloc(const ct_tokenizer *tok, const char *text, size_t len,
                                    int32_t **ids, size_t *n);
/* The bytes of ids[0..n), special tokens included; at most cap bytes written, *len set to
 * the full length (no terminating NUL). CT_ERR_INVALID for an id outside the vocabulary.
 * A SentencePiece tokenizer's decoder drops the text's first space (the one its encoder
 * puts before the text), as the package's does: decode whole texts with it, and print
 * ids one at a time with ct_tokenizer_token_bytes. */
ct_status ct_tokenizer_decode(const ct_tokenizer *tok, const int32_t *ids, size_t n,
                              char *out, size_t cap, size_t *len);

/* The bytes of one token as it stands in a text (a SentencePiece token's U+2581 as a space,
 * <0xXX> as its byte), for printing ids one at a time: unlike ct_tokenizer_decode, nothing
 * is stripped. *bytes points into the tokenizer. CT_ERR_INVALID for an id outside it. */
ct_status ct_tokenizer_token_bytes(const ct_tokenizer *tok, int32_t id, const char **bytes, size_t *len);

/* One past the largest id. */
int32_t ct_tokenizer_vocab_size(const ct_tokenizer *tok);
/* The id of a token written as in tokenizer.json (an added token's content, or a
 * vocabulary entry in its byte-level form), or -1. */
int32_t ct_tokenizer_token_id(const ct_tokenizer *tok, const char *token);
/* BOS and EOS: the special tokens the post-processor's template puts before and after the
 * text, or -1 where it puts none. */
int32_t ct_tokenizer_bos(const ct_tokenizer *tok);
int32_t ct_tokenizer_eos(const ct_tokenizer *tok);

#ifdef __cplusplus
}
#endif
#endif
