/* Byte-level BPE: the encoder (added tokens, pre-tokenizer pieces, merges by rank) and the
 * decoder, over the tables load.c fills. The merge loop follows the `tokenizers` package:
 * the pair of lowest rank merges first, the leftmost of equal ranks first, which a heap of
 * candidate pairs gives in O(m log m) for a piece of m bytes. */
#include <stdlib.h>
#include <string.h>

#include "text/bpe.h"
#include "text/nfc.h"
#include "text/unicode.h"

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
 * bytes for U+0100 onwards in byte order. */
static int bl_printable(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

uint32_t ct_bl_char(unsigned b) {
    if (bl_printable(b)) return b;
    unsigned k = 0;
    for (unsigned c = 0; c < b; c++) k += !bl_printable(c);
    return 256 + k;
}

int ct_bl_byte(uint32_t cp) {
    if (cp < 256) return bl_printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    unsigned k = cp - 256;
    for (unsigned b = 0; b < 256; b++)
        if (!bl_printable(b) && k-- == 0) return (int)b;
    return -1;
}

ct_status ct_tok_pool_add(ct_tokenizer *t, const char *s, size_t n, ct_span *out) {
    if (n >= UINT32_MAX || t->pool_len + n >= UINT32_MAX) return ct_error(CT_ERR_FORMAT, "tokenizer strings over 4 GiB");
    if (t->pool_len + n > t->pool_cap) {
        size_t cap = t->pool_cap ? t->pool_cap : 4096;
        while (cap < t->pool_len + n) cap *= 2;
        char *p = realloc(t->pool, cap);
        if (!p) return ct_error(CT_ERR_NOMEM, "tokenizer: %zu bytes of strings", cap);
        t->pool = p, t->pool_cap = cap;
    }
    memcpy(t->pool + t->pool_len, s, n);
    *out = (ct_span){(uint32_t)t->pool_len, (uint32_t)n};
    t->pool_len += n;
    return CT_OK;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t k) {
    k *= 0x9E3779B97F4A7C15ull;
    return k ^ (k >> 31);
}

int32_t ct_tok_vocab_find(const ct_tokenizer *t, const char *s, size_t n) {
    if (!t->vocab_cap) return -1;
    size_t mask = t->vocab_cap - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = t->vocab[i];
        if (id < 0) return -1;
        ct_span f = t->form[id];
        if (f.len == n && !memcmp(t->pool + f.off, s, n)) return id;
    }
}

ct_status ct_tok_vocab_build(ct_tokenizer *t) {
    size_t cap = 16;
    while (cap < 2 * (size_t)t->n_ids) cap *= 2;
    t->vocab = malloc(cap * sizeof *t->vocab);
    if (!t->vocab) return ct_error(CT_ERR_NOMEM, "tokenizer: vocabulary table of %zu slots", cap);
    memset(t->vocab, 0xFF, cap * sizeof *t->vocab);
    t->vocab_cap = cap;
    for (int32_t id = 0; id < t->n_ids; id++) {
        ct_span f = t->form[id];
        if (f.len == UINT32_MAX) continue;
        if (ct_tok_vocab_find(t, t->pool + f.off, f.len) >= 0)
            return ct_error(CT_ERR_FORMAT, "tokenizer: vocabulary entry \"%.*s\" twice", (int)(f.len > 64 ? 64 : f.len), t->pool + f.off);
        size_t i = hash_bytes(t->pool + f.off, f.len) & (cap - 1);
        while (t->vocab[i] >= 0) i = (i + 1) & (cap - 1);
        t->vocab[i] = id;
    }
    return CT_OK;
}

ct_status ct_tok_merges_alloc(ct_tokenizer *t, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    t->mkey = malloc(cap * sizeof *t->mkey);
    t->mrank = malloc(cap * sizeof *t->mrank);
    t->mnew = malloc(cap * sizeof *t->mnew);
    if (!t->mkey || !t->mrank || !t->mnew) return ct_error(CT_ERR_NOMEM, "tokenizer: merge table of %zu slots", cap);
    memset(t->mkey, 0xFF, cap * sizeof *t->mkey);
    t->merge_cap = cap;
    return CT_OK;
}

bool ct_tok_merge_add(ct_tokenizer *t, int32_t a, int32_t b, int32_t m, uint32_t rank) {
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = t->merge_cap - 1, i = hash_pair(k) & mask;
    for (; t->mkey[i] != UINT64_MAX; i = (i + 1) & mask)
        if (t->mkey[i] == k) return false;
    t->mkey[i] = k, t->mrank[i] = rank, t->mnew[i] = m;
    return true;
}

static long merge_find(const ct_tokenizer *t, int32_t a, int32_t b) {
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = t->merge_cap - 1;
    for (size_t i = hash_pair(k) & mask; t->mkey[i] != UINT64_MAX; i = (i + 1) & mask)
        if (t->mkey[i] == k) return (long)i;
    return -1;
}

/* Per-call scratch: encoding reads the tokenizer only. */
typedef struct { uint32_t rank, pos; int32_t id; } cand;
typedef struct {
    int32_t *out;
    size_t n_out, cap_out;
    uint32_t *cp;
    uint8_t *cls;
    size_t *off;
    size_t cap_cp;
    int32_t *sym, *prev, *next;
    cand *heap;
    size_t cap_sym;
    char *buf; /* a piece in byte-level form */
    size_t cap_buf;
    unsigned char *norm; /* the segment normalized */
    size_t cap_norm;
} scratch;

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q, *cap = c;
    return true;
}

static ct_status emit(scratch *s, int32_t id) {
    if (s->n_out == s->cap_out && !grow((void **)&s->out, &s->cap_out, s->n_out + 1, sizeof *s->out))
        return ct_error(CT_ERR_NOMEM, "tokenizer: %zu ids", s->n_out + 1);
    s->out[s->n_out++] = id;
    return CT_OK;
}

static bool cand_less(cand a, cand b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(cand *h, size_t *n, cand c) {
    size_t i = (*n)++;
    while (i && cand_less(c, h[(i - 1) / 2])) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n) {
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(h[c + 1], h[c])) c++;
        if (!cand_less(h[c], last)) break;
        h[i] = h[c], i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void push_pair(const ct_tokenizer *t, scratch *s, size_t *nh, int32_t pos) {
    int32_t nx = s->next[pos];
    if (nx < 0) return;
    long k = merge_find(t, s->sym[pos], s->sym[nx]);
    if (k >= 0) heap_push(s->heap, nh, (cand){t->mrank[k], (uint32_t)pos, t->mnew[k]});
}

static ct_status sym_reserve(scratch *s, size_t m) {
    if (m <= s->cap_sym) return CT_OK;
    size_t c = m < 64 ? 64 : m;
    int32_t *a = realloc(s->sym, c * sizeof *a), *b = a ? realloc(s->prev, c * sizeof *b) : NULL;
    if (a) s->sym = a;
    if (b) s->prev = b;
    int32_t *d = b ? realloc(s->next, c * sizeof *d) : NULL;
    if (d) s->next = d;
    /* each merge pops one candidate and pushes at most two: 2m bound the heap */
    cand *h = d ? realloc(s->heap, 2 * c * sizeof *h) : NULL;
    if (!h) return ct_error(CT_ERR_NOMEM, "tokenizer: piece of %zu symbols", m);
    s->heap = h, s->cap_sym = c;
    return CT_OK;
}

/* The merges over the symbols s->sym[0..n), then their ids out. */
static ct_status merge_emit(const ct_tokenizer *t, scratch *s, int32_t n) {
    if (!n) return CT_OK;
    for (int32_t i = 0; i < n; i++) s->prev[i] = i - 1, s->next[i] = i + 1;
    s->next[n - 1] = -1;
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < n; i++) push_pair(t, s, &nh, i);
    while (nh) {
        cand c = heap_pop(s->heap, &nh);
        int32_t p = (int32_t)c.pos, nx = s->next[p];
        if (s->sym[p] < 0 || nx < 0) continue;
        long k = merge_find(t, s->sym[p], s->sym[nx]);
        if (k < 0 || t->mnew[k] != c.id) continue; /* stale: a neighbour merged first */
        s->sym[p] = c.id;
        s->sym[nx] = -1;
        s->next[p] = s->next[nx];
        if (s->next[p] >= 0) s->prev[s->next[p]] = p;
        if (s->prev[p] >= 0) push_pair(t, s, &nh, s->prev[p]);
        push_pair(t, s, &nh, p);
    }
    for (int32_t i = 0; i >= 0; i = s->next[i]) {
        ct_status st = emit(s, s->sym[i]);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

/* One piece of the pre-tokenizer: its bytes w[0..m) to ids. */
static ct_status bpe_piece(const ct_tokenizer *t, scratch *s, const unsigned char *w, size_t m) {
    if (m == 1 && t->byte_id[w[0]] >= 0) return emit(s, t->byte_id[w[0]]);
    if (t->ignore_merges) { /* a piece the vocabulary has whole is that token */
        if (!grow((void **)&s->buf, &s->cap_buf, 2 * m, 1)) return ct_error(CT_ERR_NOMEM, "tokenizer: piece of %zu bytes", m);
        size_t k = 0;
        for (size_t i = 0; i < m; i++) {
            uint32_t c = ct_bl_char(w[i]);
            if (c < 128) s->buf[k++] = (char)c;
            else s->buf[k++] = (char)(0xC0 | c >> 6), s->buf[k++] = (char)(0x80 | (c & 63));
        }
        int32_t id = ct_tok_vocab_find(t, s->buf, k);
        if (id >= 0) return emit(s, id);
    }
    ct_status st = sym_reserve(s, m);
    if (st != CT_OK) return st;
    int32_t n = 0;
    for (size_t i = 0; i < m; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id < 0) id = t->unk;
        if (id < 0) continue; /* as `tokenizers`: a byte with no token and no unk is dropped */
        s->sym[n++] = id;
    }
    return merge_emit(t, s, n);
}

/* SentencePiece-style: the characters of w[0..m) are the symbols; one the vocabulary lacks
 * becomes its bytes' <0xXX> tokens (byte_fallback, when all are there), else unk, runs of
 * unk fused into one with fuse_unk. A pending unk waits for the next known character, so
 * byte tokens can come before it: the package's order, kept. A byte that is not valid
 * UTF-8 is a character of its own here. */
static ct_status sp_piece(const ct_tokenizer *t, scratch *s, const unsigned char *w, size_t m) {
    ct_status st = sym_reserve(s, m);
    if (st != CT_OK) return st;
    int32_t n = 0, unk = -1;
    for (size_t i = 0; i < m;) {
        uint32_t cp;
        size_t k = (size_t)ct_utf8_next(w + i, m - i, &cp);
        int32_t id = cp < 128 ? t->char_id[cp] : ct_tok_vocab_find(t, (const char *)w + i, k);
        if (id >= 0) {
            if (unk >= 0) s->sym[n++] = unk, unk = -1;
            s->sym[n++] = id;
            i += k;
            continue;
        }
        bool bytes = t->byte_fallback;
        for (size_t j = 0; j < k && bytes; j++) bytes = t->byte_id[w[i + j]] >= 0;
        if (bytes) {
            for (size_t j = 0; j < k; j++) s->sym[n++] = t->byte_id[w[i + j]];
        } else if (t->unk >= 0) {
            if (unk >= 0 && !t->fuse_unk) s->sym[n++] = unk;
            unk = t->unk;
        }
        i += k;
    }
    if (unk >= 0) s->sym[n++] = unk;
    return merge_emit(t, s, n);
}

/* Text between added tokens: code points and classes, then the pre-tokenizer's pieces. */
static ct_status split_pieces(const ct_tokenizer *t, scratch *s, const unsigned char *text, size_t len) {
    if (!len) return CT_OK;
    if (len > s->cap_cp) {
        size_t c = len;
        uint32_t *cp = realloc(s->cp, c * sizeof *cp);
        if (cp) s->cp = cp;
        uint8_t *cls = cp ? realloc(s->cls, c) : NULL;
        if (cls) s->cls = cls;
        size_t *off = cls ? realloc(s->off, (c + 1) * sizeof *off) : NULL;
        if (!off) return ct_error(CT_ERR_NOMEM, "tokenizer: text of %zu bytes", len);
        s->off = off, s->cap_cp = c;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; n++) {
        s->off[n] = i;
        i += (size_t)ct_utf8_next(text + i, len - i, &s->cp[n]);
        s->cls[n] = (uint8_t)ct_uc_class(s->cp[n]);
    }
    s->off[n] = len;
    for (size_t i = 0; i < n;) {
        size_t k = ct_pretok_match(t->pretok, s->cp, s->cls, i, n);
        ct_status st = bpe_piece(t, s, text + s->off[i], s->off[i + k] - s->off[i]);
        if (st != CT_OK) return st;
        i += k;
    }
    return CT_OK;
}

#define SP_MARK "\xE2\x96\x81" /* U+2581, SentencePiece's space */

/* SentencePiece-style: spaces to U+2581, one before the segment as the normalizer or
 * Metaspace says, then pieces (the whole segment, or one from each U+2581 on with split). */
static ct_status sp_segment(const ct_tokenizer *t, scratch *s, const unsigned char *text, size_t len, bool at_start) {
    bool mark_first = text[0] == ' ' || (len >= 3 && !memcmp(text, SP_MARK, 3));
    bool pre = t->sp_prepend == CT_SP_PREPEND_ALL || (t->sp_prepend == CT_SP_PREPEND_ALWAYS && !mark_first) ||
               (t->sp_prepend == CT_SP_PREPEND_FIRST && !mark_first && at_start);
    if (!grow((void **)&s->norm, &s->cap_norm, 3 * len + 3, 1)) return ct_error(CT_ERR_NOMEM, "tokenizer: text of %zu bytes", len);
    unsigned char *o = s->norm;
    size_t k = 0;
    if (pre) memcpy(o, SP_MARK, 3), k = 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') memcpy(o + k, SP_MARK, 3), k += 3;
        else o[k++] = text[i];
    }
    if (!t->sp_split && !t->sp_cut) return sp_piece(t, s, o, k);
    /* split: before every U+2581; cut: before a U+2581 after another character, which
     * gives the same ids as the whole (no merge spans that point) at less cost */
    size_t start = 0;
    for (size_t i = 3; i + 3 <= k; i++) {
        if (o[i] != 0xE2 || memcmp(o + i, SP_MARK, 3)) continue;
        if (!t->sp_split && !memcmp(o + i - 3, SP_MARK, 3)) { i += 2; continue; }
        ct_status st = sp_piece(t, s, o + start, i - start);
        if (st != CT_OK) return st;
        start = i, i += 2;
    }
    return sp_piece(t, s, o + start, k - start);
}

static ct_status encode_segment(const ct_tokenizer *t, scratch *s, const unsigned char *text, size_t len, bool at_start) {
    if (!len) return CT_OK;
    if (t->sp) return sp_segment(t, s, text, len, at_start);
    if (t->nfc) { /* ASCII is its own NFC: only text with other bytes is normalized */
        size_t i = 0;
        while (i < len && text[i] < 0x80) i++;
        if (i < len) {
            ct_status st = ct_nfc_utf8(text, len, &s->norm, &s->cap_norm, &len);
            if (st != CT_OK) return st;
            text = s->norm;
        }
    }
    if (!t->add_prefix_space || text[0] == ' ') return split_pieces(t, s, text, len);
    unsigned char *copy = malloc(len + 1);
    if (!copy) return ct_error(CT_ERR_NOMEM, "tokenizer: text of %zu bytes", len);
    copy[0] = ' ';
    memcpy(copy + 1, text, len);
    ct_status st = split_pieces(t, s, copy, len + 1);
    free(copy);
    return st;
}

/* The length of a White_Space code point ending at text[i] (not before lo), or 0. */
static size_t space_before(const unsigned char *text, size_t lo, size_t i) {
    for (size_t k = 1; k <= 4 && k <= i - lo; k++) {
        uint32_t cp;
        if ((size_t)ct_utf8_next(text + i - k, k, &cp) == k && cp != 0xFFFFFFFFu)
            return ct_uc_class(cp) == CT_UC_SPACE ? k : 0;
    }
    return 0;
}

static size_t space_after(const unsigned char *text, size_t i, size_t len) {
    uint32_t cp;
    size_t k = (size_t)ct_utf8_next(text + i, len - i, &cp);
    return cp != 0xFFFFFFFFu && ct_uc_class(cp) == CT_UC_SPACE ? k : 0;
}

static ct_status encode_all(const ct_tokenizer *t, scratch *s, const unsigned char *text, size_t len) {
    size_t pos = 0;
    /* added tokens first, leftmost then longest, as the package's Aho-Corasick matcher */
    for (size_t i = 0; i < len && t->n_added; i++) {
        if (!t->added_first[text[i]]) continue;
        int best = -1;
        for (int a = 0; a < t->n_added; a++) {
            ct_span c = t->added[a].text;
            if (c.len <= len - i && (best < 0 || c.len > t->added[best].text.len) &&
                !memcmp(t->pool + c.off, text + i, c.len))
                best = a;
        }
        if (best < 0) continue;
        size_t start = i, end = i + t->added[best].text.len;
        if (t->added[best].lstrip)
            for (size_t k; (k = space_before(text, pos, start));) start -= k;
        if (t->added[best].rstrip)
            for (size_t k; end < len && (k = space_after(text, end, len));) end += k;
        ct_status st = encode_segment(t, s, text + pos, start - pos, pos == 0);
        if (st == CT_OK) st = emit(s, t->added[best].id);
        if (st != CT_OK) return st;
        pos = end, i = end - 1;
    }
    return encode_segment(t, s, text + pos, len - pos, pos == 0);
}

static void scratch_free(scratch *s) {
    free(s->cp), free(s->cls), free(s->off), free(s->sym), free(s->prev), free(s->next), free(s->heap), free(s->buf), free(s->norm);
}

ct_status ct_tokenizer_encode_alloc(const ct_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n) {
    scratch s = {0};
    ct_status st = encode_all(t, &s, (const unsigned char *)text, len);
    scratch_free(&s);
    if (st != CT_OK) { free(s.out); *ids = NULL, *n = 0; return st; }
    *ids = s.out, *n = s.n_out;
    return CT_OK;
}

ct_status ct_tokenizer_encode(const ct_tokenizer *t, const char *text, size_t len, int32_t *ids, size_t cap, size_t *n) {
    int32_t *all;
    ct_status st = ct_tokenizer_encode_alloc(t, text, len, &all, n);
    if (st != CT_OK) return st;
    memcpy(ids, all, (*n < cap ? *n : cap) * sizeof *ids);
    free(all);
    return CT_OK;
}

ct_status ct_tokenizer_decode(const ct_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap, size_t *len) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || t->bytes[ids[i]].len == UINT32_MAX)
            return ct_error(CT_ERR_INVALID, "tokenizer: id %d at %zu is not in the vocabulary (%d ids)", ids[i], i, t->n_ids);
        ct_span b = t->bytes[ids[i]];
        if (k < cap) memcpy(out + k, t->pool + b.off, b.len < cap - k ? b.len : cap - k);
        k += b.len;
    }
    /* the decoder's Strip (Llama 2): the space of the U+2581 put before the text goes */
    size_t first = 0;
    while (first < n && !t->bytes[ids[first]].len) first++;
    if (t->strip_lead && first < n && t->pool[t->bytes[ids[first]].off] == ' ') {
        if (cap) memmove(out, out + 1, (k < cap ? k : cap) - 1);
        k--;
    }
    *len = k;
    return CT_OK;
}

ct_status ct_tokenizer_token_bytes(const ct_tokenizer *t, int32_t id, const char **bytes, size_t *len) {
    if (id < 0 || id >= t->n_ids || t->bytes[id].len == UINT32_MAX)
        return ct_error(CT_ERR_INVALID, "tokenizer: id %d is not in the vocabulary (%d ids)", id, t->n_ids);
    *bytes = t->pool + t->bytes[id].off, *len = t->bytes[id].len;
    return CT_OK;
}

int32_t ct_tokenizer_vocab_size(const ct_tokenizer *t) { return t->n_ids; }
int32_t ct_tokenizer_bos(const ct_tokenizer *t) { return t->bos; }
int32_t ct_tokenizer_eos(const ct_tokenizer *t) { return t->eos; }

int32_t ct_tokenizer_token_id(const ct_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (int a = 0; a < t->n_added; a++)
        if (t->added[a].text.len == n && !memcmp(t->pool + t->added[a].text.off, token, n)) return t->added[a].id;
    return ct_tok_vocab_find(t, token, n);
}

void ct_tokenizer_free(ct_tokenizer *t) {
    if (!t) return;
    free(t->pool), free(t->form), free(t->bytes), free(t->vocab);
    free(t->mkey), free(t->mrank), free(t->mnew), free(t->added);
    free(t);
}
