/* Readers: Hugging Face tokenizer.json, and GPT-2's vocab.json + merges.txt. Everything a
 * file sets is checked, and every table is sized by what the file holds (ids at most about
 * twice the number of entries), so a hostile file gets an error, not a crash or a huge
 * allocation. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/bpe.h"
#include "text/unicode.h"

#define MAX_FILE (1u << 30)
#define SP_MARK "\xE2\x96\x81" /* U+2581 */

static ct_status read_file(const char *path, char **out, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return ct_error(CT_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    ct_status st = CT_OK;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            cap = cap ? 2 * cap : 1 << 20;
            if (cap > MAX_FILE) { st = ct_error(CT_ERR_FORMAT, "%s: over %u bytes", path, MAX_FILE); break; }
            char *b = realloc(buf, cap);
            if (!b) { st = ct_error(CT_ERR_NOMEM, "%s: %zu bytes", path, cap); break; }
            buf = b;
        }
        size_t k = fread(buf + len, 1, cap - len - 1, f);
        len += k;
        if (k == 0) {
            if (ferror(f)) st = ct_error(CT_ERR_IO, "%s: read failed", path);
            break;
        }
    }
    fclose(f);
    if (st != CT_OK) { free(buf); return st; }
    buf[len] = 0;
    *out = buf, *n = len;
    return CT_OK;
}

/* The bytes a vocabulary entry stands for: its byte-level characters mapped back, or, for
 * an entry with a character outside that alphabet, its own UTF-8 (as the package's
 * ByteLevel decoder does). */
static ct_status add_entry(ct_tokenizer *t, const char *path, const char *s, int32_t id) {
    size_t n = strlen(s);
    if (n > 65536) return ct_error(CT_ERR_FORMAT, "%s: a token of %zu bytes", path, n);
    if (t->form[id].len != UINT32_MAX) return ct_error(CT_ERR_FORMAT, "%s: id %d used twice", path, id);
    ct_status st = ct_tok_pool_add(t, s, n, &t->form[id]);
    if (st != CT_OK) return st;
    char raw[65536];
    size_t k = 0;
    if (t->sp) { /* U+2581 is a space; <0xXX> its byte, as the ByteFallback decoder has it */
        if (n == 6 && !memcmp(s, "<0x", 3) && isxdigit((unsigned char)s[3]) && isxdigit((unsigned char)s[4]) && s[5] == '>') {
            raw[0] = (char)strtoul((char[]){s[3], s[4], 0}, NULL, 16);
            return ct_tok_pool_add(t, raw, 1, &t->bytes[id]);
        }
        for (size_t i = 0; i < n; i++) {
            if (i + 3 <= n && !memcmp(s + i, "\xE2\x96\x81", 3)) raw[k++] = ' ', i += 2;
            else raw[k++] = s[i];
        }
        return ct_tok_pool_add(t, raw, k, &t->bytes[id]);
    }
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)ct_utf8_next((const unsigned char *)s + i, n - i, &cp);
        int b = cp == 0xFFFFFFFFu ? -1 : ct_bl_byte(cp);
        if (b < 0) return ct_tok_pool_add(t, s, n, &t->bytes[id]);
        raw[k++] = (char)b;
    }
    return ct_tok_pool_add(t, raw, k, &t->bytes[id]);
}

static ct_status get_id(const cJSON *v, const char *path, const char *what, int32_t limit, int32_t *id) {
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int32_t)v->valuedouble || v->valuedouble < 0)
        return ct_error(CT_ERR_FORMAT, "%s: %s: id is not a non-negative integer", path, what);
    if (v->valuedouble >= limit)
        return ct_error(CT_ERR_FORMAT, "%s: %s: id %.0f is out of range for %d entries", path, what, v->valuedouble, limit / 2);
    *id = (int32_t)v->valuedouble;
    return CT_OK;
}

static ct_status alloc_tables(ct_tokenizer *t, int32_t n_ids) {
    t->n_ids = n_ids;
    t->form = malloc((size_t)n_ids * sizeof *t->form);
    t->bytes = malloc((size_t)n_ids * sizeof *t->bytes);
    if (!t->form || !t->bytes) return ct_error(CT_ERR_NOMEM, "tokenizer: %d ids", n_ids);
    memset(t->form, 0xFF, (size_t)n_ids * sizeof *t->form);
    memset(t->bytes, 0xFF, (size_t)n_ids * sizeof *t->bytes);
    return CT_OK;
}

/* vocab (token -> id) into the tables; extra ids: added tokens to come. */
static ct_status load_vocab(ct_tokenizer *t, const char *path, const cJSON *vocab, const cJSON *added) {
    if (!cJSON_IsObject(vocab)) return ct_error(CT_ERR_FORMAT, "%s: the BPE vocab is not an object", path);
    int n = cJSON_GetArraySize(vocab), na = cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0;
    int32_t limit = 2 * (n + na) + 1024, max = -1, id = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        ct_status st = get_id(e, path, e->string, limit, &id);
        if (st != CT_OK) return st;
        if (id > max) max = id;
    }
    cJSON_ArrayForEach(e, added) {
        ct_status st = get_id(cJSON_GetObjectItemCaseSensitive(e, "id"), path, "added token", limit, &id);
        if (st != CT_OK) return st;
        if (id > max) max = id;
    }
    ct_status st = alloc_tables(t, max + 1);
    cJSON_ArrayForEach(e, vocab) {
        if (st == CT_OK) st = add_entry(t, path, e->string, (int32_t)e->valuedouble);
    }
    if (st == CT_OK) st = ct_tok_vocab_build(t);
    for (int b = 0; b < 256 && st == CT_OK && t->sp; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->byte_id[b] = ct_tok_vocab_find(t, s, 6);
        if (b < 128) s[0] = (char)b, t->char_id[b] = ct_tok_vocab_find(t, s, 1);
    }
    for (int b = 0; b < 256 && st == CT_OK && !t->sp; b++) {
        char s[3];
        uint32_t c = ct_bl_char((unsigned)b);
        size_t k = 0;
        if (c < 128) s[k++] = (char)c;
        else s[k++] = (char)(0xC0 | c >> 6), s[k++] = (char)(0x80 | (c & 63));
        t->byte_id[b] = ct_tok_vocab_find(t, s, k);
    }
    return st;
}

/* One merge "a b" (or ["a", "b"]): both sides and their concatenation must be tokens. */
static ct_status add_merge(ct_tokenizer *t, const char *path, const char *a, size_t na, const char *b, size_t nb, uint32_t rank) {
    int32_t ia = ct_tok_vocab_find(t, a, na), ib = ct_tok_vocab_find(t, b, nb);
    if (ia < 0 || ib < 0 || na + nb > 65536)
        return ct_error(CT_ERR_FORMAT, "%s: merge %u: \"%.*s\" + \"%.*s\": not in the vocabulary", path, rank,
                        (int)(na > 64 ? 64 : na), a, (int)(nb > 64 ? 64 : nb), b);
    char cat[65536];
    memcpy(cat, a, na), memcpy(cat + na, b, nb);
    int32_t m = ct_tok_vocab_find(t, cat, na + nb);
    if (m < 0) return ct_error(CT_ERR_FORMAT, "%s: merge %u: \"%.*s\" is not in the vocabulary", path, rank, (int)(na + nb > 64 ? 64 : na + nb), cat);
    ct_tok_merge_add(t, ia, ib, m, rank); /* a repeated pair keeps its first rank, as the package */
    return CT_OK;
}

static ct_status load_merges(ct_tokenizer *t, const char *path, const cJSON *merges) {
    if (!cJSON_IsArray(merges)) return ct_error(CT_ERR_FORMAT, "%s: the BPE merges are not an array", path);
    ct_status st = ct_tok_merges_alloc(t, (size_t)cJSON_GetArraySize(merges));
    uint32_t rank = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        if (st != CT_OK) break;
        if (cJSON_IsString(e)) {
            const char *s = e->valuestring, *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) return ct_error(CT_ERR_FORMAT, "%s: merge %u is not \"a b\"", path, rank);
            st = add_merge(t, path, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), rank);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) && cJSON_IsString(e->child->next)) {
            const char *a = e->child->valuestring, *b = e->child->next->valuestring;
            st = add_merge(t, path, a, strlen(a), b, strlen(b), rank);
        } else {
            st = ct_error(CT_ERR_FORMAT, "%s: merge %u is neither \"a b\" nor [a, b]", path, rank);
        }
        rank++;
    }
    return st;
}

static bool json_true(const cJSON *o, const char *key) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key)); }
static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
static bool json_null(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return !v || cJSON_IsNull(v);
}

static ct_status load_added(ct_tokenizer *t, const char *path, const cJSON *added) {
    if (!added || cJSON_IsNull(added)) return CT_OK;
    if (!cJSON_IsArray(added)) return ct_error(CT_ERR_FORMAT, "%s: added_tokens is not an array", path);
    int n = cJSON_GetArraySize(added);
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added) return ct_error(CT_ERR_NOMEM, "%s: %d added tokens", path, n);
    const cJSON *e;
    cJSON_ArrayForEach(e, added) {
        const char *c = json_str(e, "content");
        if (!c || !*c || strlen(c) > 65536) return ct_error(CT_ERR_FORMAT, "%s: an added token without content", path);
        if (json_true(e, "single_word"))
            return ct_error(CT_ERR_UNSUPPORTED, "%s: added token \"%.64s\": single_word is not supported", path, c);
        /* the package matches those on the normalized text, after normalizing their content */
        if ((t->sp || t->nfc) && !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(e, "normalized")))
            return ct_error(CT_ERR_UNSUPPORTED, "%s: added token \"%.64s\": normalized with a normalizer is not supported", path, c);
        ct_added_tok *a = &t->added[t->n_added++];
        a->id = (int32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble; /* checked in load_vocab */
        a->lstrip = json_true(e, "lstrip"), a->rstrip = json_true(e, "rstrip");
        ct_status st = ct_tok_pool_add(t, c, strlen(c), &a->text);
        if (st != CT_OK) return st;
        t->added_first[(unsigned char)c[0]] = 1;
        /* an id the model has decodes as the model's token; one only added, as its text */
        if (t->bytes[a->id].len == UINT32_MAX) t->bytes[a->id] = a->text;
    }
    return CT_OK;
}

/* Metaspace (newer files for Llama 2): replacement U+2581, prepend_scheme (or the older
 * add_prefix_space), split. */
static ct_status load_metaspace(ct_tokenizer *t, const char *path, const cJSON *pt) {
    const char *rep = json_str(pt, "replacement"), *scheme = json_str(pt, "prepend_scheme");
    if (!rep || strcmp(rep, SP_MARK)) return ct_error(CT_ERR_UNSUPPORTED, "%s: Metaspace: only the replacement U+2581 is supported", path);
    if (scheme && !strcmp(scheme, "first")) t->sp_prepend = CT_SP_PREPEND_FIRST;
    else if (scheme && !strcmp(scheme, "always")) t->sp_prepend = CT_SP_PREPEND_ALWAYS;
    else if (scheme && !strcmp(scheme, "never")) t->sp_prepend = CT_SP_PREPEND_NONE;
    else if (scheme) return ct_error(CT_ERR_UNSUPPORTED, "%s: Metaspace: prepend_scheme %.32s", path, scheme);
    else t->sp_prepend = json_true(pt, "add_prefix_space") ? CT_SP_PREPEND_ALWAYS : CT_SP_PREPEND_NONE;
    const cJSON *split = cJSON_GetObjectItemCaseSensitive(pt, "split");
    t->sp_split = !split || cJSON_IsTrue(split); /* true unless the file says false */
    t->sp = true;
    return CT_OK;
}

static ct_status load_pretok(ct_tokenizer *t, const char *path, const cJSON *pt) {
    const char *type = json_str(pt, "type");
    if (!pt || cJSON_IsNull(pt)) {
        if (t->sp) return CT_OK; /* Llama 2: the normalizer did it all */
        return ct_error(CT_ERR_UNSUPPORTED, "%s: no pre_tokenizer and no SentencePiece normalizer", path);
    }
    if (type && !strcmp(type, "Metaspace")) {
        if (t->sp) return ct_error(CT_ERR_UNSUPPORTED, "%s: a SentencePiece normalizer and Metaspace both", path);
        return load_metaspace(t, path, pt);
    }
    if (t->sp) return ct_error(CT_ERR_UNSUPPORTED, "%s: a SentencePiece normalizer with pre_tokenizer %.32s", path, type ? type : "?");
    if (type && !strcmp(type, "ByteLevel")) {
        t->add_prefix_space = json_true(pt, "add_prefix_space");
        t->pretok = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(pt, "use_regex")) ? CT_PRETOK_NONE : CT_PRETOK_GPT2;
        return CT_OK;
    }
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
    if (type && !strcmp(type, "Sequence") && cJSON_GetArraySize(seq) == 2) {
        const cJSON *sp = seq->child, *bl = seq->child->next;
        const char *re = json_str(cJSON_GetObjectItemCaseSensitive(sp, "pattern"), "Regex");
        const char *beh = json_str(sp, "behavior"), *bt = json_str(bl, "type"), *st = json_str(sp, "type");
        int p = re ? ct_pretok_from_regex(re) : -1;
        if (st && !strcmp(st, "Split") && p >= 0 && beh && !strcmp(beh, "Isolated") && !json_true(sp, "invert") &&
            bt && !strcmp(bt, "ByteLevel") && cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(bl, "use_regex"))) {
            t->pretok = (ct_pretok)p;
            t->add_prefix_space = json_true(bl, "add_prefix_space");
            return CT_OK;
        }
    }
    return ct_error(CT_ERR_UNSUPPORTED, "%s: pre_tokenizer: only ByteLevel, or Split with the GPT-2, Llama 3 or Qwen2 "
                    "pattern then ByteLevel, are supported", path);
}

/* BOS/EOS: the special tokens of the template for one sequence, before and after it. */
static void load_post(ct_tokenizer *t, const cJSON *pp) {
    const char *type = json_str(pp, "type");
    if (!type || strcmp(type, "TemplateProcessing")) return;
    const cJSON *e, *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    bool seen_text = false;
    cJSON_ArrayForEach(e, single) {
        if (cJSON_GetObjectItemCaseSensitive(e, "Sequence")) { seen_text = true; continue; }
        const char *name = json_str(cJSON_GetObjectItemCaseSensitive(e, "SpecialToken"), "id");
        int32_t id = name ? ct_tokenizer_token_id(t, name) : -1;
        if (id < 0) continue;
        if (!seen_text && t->bos < 0) t->bos = id;
        if (seen_text && t->eos < 0) t->eos = id;
    }
}

/* Whether no vocabulary entry has U+2581 right after a character other than U+2581 (and
 * U+2581 itself is a token): then no merge joins the text before a word's U+2581 to it. */
static bool sp_words_separate(const ct_tokenizer *t) {
    if (ct_tok_vocab_find(t, SP_MARK, 3) < 0) return false;
    for (int32_t id = 0; id < t->n_ids; id++) {
        ct_span f = t->form[id];
        if (f.len == UINT32_MAX) continue;
        const char *s = t->pool + f.off;
        for (uint32_t i = 1; i + 3 <= f.len; i++)
            if (!memcmp(s + i, SP_MARK, 3) && (i < 3 || memcmp(s + i - 3, SP_MARK, 3))) return false;
    }
    return true;
}

static bool is_replace(const cJSON *n, const char *from, const char *to) {
    const char *type = json_str(n, "type"), *content = json_str(n, "content");
    const char *pat = json_str(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "String");
    return type && !strcmp(type, "Replace") && pat && !strcmp(pat, from) && content && !strcmp(content, to);
}

/* NFC (Qwen2), or Llama 2's Sequence [Prepend(U+2581), Replace(" ", U+2581)] (or the
 * Replace alone). */
static ct_status load_normalizer(ct_tokenizer *t, const char *path, const cJSON *nz) {
    if (!nz || cJSON_IsNull(nz)) return CT_OK;
    const char *type = json_str(nz, "type");
    if (type && !strcmp(type, "NFC")) { t->nfc = true; return CT_OK; }
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(nz, "normalizers"), *last = NULL;
    if (type && !strcmp(type, "Sequence") && cJSON_IsArray(seq)) {
        int n = cJSON_GetArraySize(seq);
        const cJSON *first = seq->child;
        const char *ft = json_str(first, "type"), *pre = json_str(first, "prepend");
        if (n == 2 && ft && !strcmp(ft, "Prepend") && pre && !strcmp(pre, SP_MARK)) last = first->next, t->sp_prepend = CT_SP_PREPEND_ALL;
        else if (n == 1) last = first;
    } else if (type && !strcmp(type, "Replace")) {
        last = nz;
    }
    if (last && is_replace(last, " ", SP_MARK)) { t->sp = true; return CT_OK; }
    return ct_error(CT_ERR_UNSUPPORTED, "%s: normalizer: only NFC, or Prepend(U+2581) and Replace(\" \", U+2581), are supported", path);
}

/* The decoder's part that is not per token: Llama 2's Strip(" ", 1, 0), or Metaspace's
 * dropping the space it put first. */
static void load_decoder(ct_tokenizer *t, const cJSON *d) {
    const char *type = json_str(d, "type");
    if (!type) return;
    if (!strcmp(type, "Metaspace")) {
        const char *scheme = json_str(d, "prepend_scheme");
        t->strip_lead = scheme ? strcmp(scheme, "never") != 0 : json_true(d, "add_prefix_space");
        return;
    }
    const cJSON *e;
    if (!strcmp(type, "Sequence")) cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(d, "decoders")) {
            const char *et = json_str(e, "type"), *content = json_str(e, "content");
            const cJSON *start = cJSON_GetObjectItemCaseSensitive(e, "start");
            if (et && !strcmp(et, "Strip") && content && !strcmp(content, " ") && cJSON_IsNumber(start) && start->valuedouble == 1)
                t->strip_lead = true;
        }
}

static ct_status load_json(ct_tokenizer *t, const char *path, const cJSON *j) {
    if (!cJSON_IsObject(j)) return ct_error(CT_ERR_FORMAT, "%s: not a JSON object", path);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (!cJSON_IsObject(model)) return ct_error(CT_ERR_FORMAT, "%s: no \"model\" object", path);
    const char *type = json_str(model, "type");
    if (type && strcmp(type, "BPE")) return ct_error(CT_ERR_UNSUPPORTED, "%s: model type %s: only BPE is supported", path, type);
    if (!json_null(model, "continuing_subword_prefix") || !json_null(model, "end_of_word_suffix"))
        return ct_error(CT_ERR_UNSUPPORTED, "%s: BPE with a subword prefix or word suffix is not supported", path);
    ct_status st = load_normalizer(t, path, cJSON_GetObjectItemCaseSensitive(j, "normalizer"));
    if (st == CT_OK) st = load_pretok(t, path, cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer"));
    if (st != CT_OK) return st;
    t->byte_fallback = json_true(model, "byte_fallback"), t->fuse_unk = json_true(model, "fuse_unk");
    if (!t->sp && (t->byte_fallback || t->fuse_unk))
        return ct_error(CT_ERR_UNSUPPORTED, "%s: byte fallback or fused unk with a byte-level pre-tokenizer", path);
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    st = load_vocab(t, path, cJSON_GetObjectItemCaseSensitive(model, "vocab"), cJSON_IsArray(added) ? added : NULL);
    if (st == CT_OK) st = load_merges(t, path, cJSON_GetObjectItemCaseSensitive(model, "merges"));
    if (st == CT_OK) st = load_added(t, path, added);
    if (st != CT_OK) return st;
    load_decoder(t, cJSON_GetObjectItemCaseSensitive(j, "decoder"));
    if (t->sp) t->sp_cut = sp_words_separate(t);
    t->ignore_merges = json_true(model, "ignore_merges");
    const char *unk = json_str(model, "unk_token");
    if (unk && (t->unk = ct_tok_vocab_find(t, unk, strlen(unk))) < 0)
        return ct_error(CT_ERR_FORMAT, "%s: unk_token \"%.64s\" is not in the vocabulary", path, unk);
    load_post(t, cJSON_GetObjectItemCaseSensitive(j, "post_processor"));
    return CT_OK;
}

static ct_tokenizer *tok_new(void) {
    ct_tokenizer *t = calloc(1, sizeof *t);
    if (t) t->unk = t->bos = t->eos = -1;
    return t;
}

ct_status ct_tokenizer_load(const char *path, ct_tokenizer **out) {
    *out = NULL;
    char *text;
    size_t n;
    ct_status st = read_file(path, &text, &n);
    if (st != CT_OK) return st;
    if (strstr(text, "\\u0000")) { /* cJSON's strings end at a NUL: such a token would be cut short */
        free(text);
        return ct_error(CT_ERR_UNSUPPORTED, "%s: a string with U+0000 is not supported", path);
    }
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    if (!j) return ct_error(CT_ERR_FORMAT, "%s: not valid JSON", path);
    ct_tokenizer *t = tok_new();
    st = t ? load_json(t, path, j) : ct_error(CT_ERR_NOMEM, "tokenizer");
    cJSON_Delete(j);
    if (st != CT_OK) { ct_tokenizer_free(t); return st; }
    *out = t;
    return CT_OK;
}

/* GPT-2's two files as the tokenizer.json GPT2TokenizerFast would make of them. */
ct_status ct_tokenizer_load_gpt2(const char *vocab_json, const char *merges_txt, ct_tokenizer **out) {
    *out = NULL;
    char *vtext, *mtext;
    size_t vn, mn;
    ct_status st = read_file(vocab_json, &vtext, &vn);
    if (st != CT_OK) return st;
    cJSON *vocab = cJSON_ParseWithLength(vtext, vn);
    free(vtext);
    if (!vocab) return ct_error(CT_ERR_FORMAT, "%s: not valid JSON", vocab_json);
    if ((st = read_file(merges_txt, &mtext, &mn)) != CT_OK) { cJSON_Delete(vocab); return st; }
    cJSON *j = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(j, "model");
    cJSON *merges = cJSON_AddArrayToObject(model, "merges"), *pt = cJSON_AddObjectToObject(j, "pre_tokenizer");
    cJSON *added = cJSON_AddArrayToObject(j, "added_tokens");
    bool ok = j && model && merges && pt && added && cJSON_AddStringToObject(pt, "type", "ByteLevel");
    cJSON_AddItemToObject(model, "vocab", vocab);
    /* one merge a line; "#version" lines and blank lines are not merges */
    for (char *line = mtext, *end; ok && line < mtext + mn; line = end + 1) {
        end = memchr(line, '\n', (size_t)(mtext + mn - line));
        if (!end) end = mtext + mn;
        *end = 0;
        if (end > line && end[-1] == '\r') end[-1] = 0;
        if (*line && strncmp(line, "#version", 8)) ok = cJSON_AddItemToArray(merges, cJSON_CreateString(line));
    }
    free(mtext);
    const cJSON *eot = cJSON_GetObjectItemCaseSensitive(vocab, "<|endoftext|>");
    if (ok && cJSON_IsNumber(eot)) {
        cJSON *a = cJSON_CreateObject();
        ok = a && cJSON_AddItemToArray(added, a) && cJSON_AddNumberToObject(a, "id", eot->valuedouble) &&
             cJSON_AddStringToObject(a, "content", "<|endoftext|>") && cJSON_AddTrueToObject(a, "special");
    }
    ct_tokenizer *t = ok ? tok_new() : NULL;
    st = t ? load_json(t, vocab_json, j) : ct_error(CT_ERR_NOMEM, "%s: building the tokenizer", vocab_json);
    cJSON_Delete(j);
    if (st != CT_OK) { ct_tokenizer_free(t); return st; }
    *out = t;
    return CT_OK;
}
