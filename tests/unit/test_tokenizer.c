/* Byte-level BPE against the `tokenizers` package: the fixtures (tests/torch/gen_tokenizer.py)
 * hold two trained tokenizer.json files, a varied text and the package's ids for it. */
#include <stdint.h>

#include "ct_test.h"
#include "ctrain/text.h"
#include "text/nfc.h"

#define FIX "tests/fixtures/tokenizer/"

/* Encodes the fixture text and compares with the package's ids (int32, or uint16 for
 * *.ids16); then decodes back. */
static void check_against(const char *json, const char *ids_path) {
    ct_tokenizer *tok;
    CT_EXPECT_OK(ct_tokenizer_load(json, &tok));
    if (!tok) return;
    size_t tn, in;
    char *text = (char *)ct_test_read_file(FIX "text.txt", &tn);
    void *raw = ct_test_read_file(ids_path, &in);
    CT_ASSERT(text && raw);
    int32_t *want = raw;
    if (strstr(ids_path, ".ids16")) {
        in /= sizeof(uint16_t);
        want = malloc(in * sizeof *want + 1);
        for (size_t i = 0; i < in; i++) want[i] = ((const uint8_t *)raw)[2 * i] | ((const uint8_t *)raw)[2 * i + 1] << 8;
        free(raw);
    } else {
        in /= sizeof(int32_t);
    }
    int32_t *ids;
    size_t n;
    CT_EXPECT_OK(ct_tokenizer_encode_alloc(tok, text, tn, &ids, &n));
    size_t bad = 0, first = SIZE_MAX;
    for (size_t i = 0; i < n && i < in; i++)
        if (ids[i] != want[i]) { bad++; if (first == SIZE_MAX) first = i; }
    CT_EXPECTF(n == in && bad == 0, "%s: %zu ids (want %zu), %zu differ, first at %zu", json, n, in, bad, first);
    if (strstr(json, "qwen2")) { /* its normalizer: decode(encode(x)) is NFC(x) */
        unsigned char *nfc = NULL;
        size_t cap = 0;
        CT_EXPECT_OK(ct_nfc_utf8((const unsigned char *)text, tn, &nfc, &cap, &tn));
        free(text);
        text = (char *)nfc;
    }
    char *back = malloc(tn + 1);
    size_t len;
    CT_EXPECT_OK(ct_tokenizer_decode(tok, ids, n, back, tn + 1, &len));
    CT_EXPECTF(len == tn && !memcmp(back, text, tn), "%s: decode(encode(text)) differs", json);
    free(back), free(ids), free(text), free(want);
    ct_tokenizer_free(tok);
}

CT_TEST(gpt2_pattern_matches_tokenizers) { check_against(FIX "gpt2.json", FIX "gpt2.ids"); }
CT_TEST(llama3_pattern_matches_tokenizers) { check_against(FIX "llama3.json", FIX "llama3.ids"); }
CT_TEST(qwen2_nfc_matches_tokenizers) { check_against(FIX "qwen2.json", FIX "qwen2.ids16"); }
CT_TEST(sentencepiece_matches_tokenizers) { check_against(FIX "sp.json", FIX "sp.ids16"); }

/* Any bytes, valid UTF-8 or not, come back from decode(encode(x)): byte-level tokens, or
 * SentencePiece's byte fallback (random bytes hold no space, which decode would drop first,
 * and no U+2581, which it would give back as a space: those are tested apart). */
static void bytes_round_trip(const char *json) {
    ct_tokenizer *tok;
    CT_ASSERT(ct_tokenizer_load(json, &tok) == CT_OK);
    unsigned char buf[4096];
    uint32_t s = 12345;
    for (int round = 0; round < 50; round++) {
        size_t len = (size_t)round * 80;
        for (size_t i = 0; i < len; i++) {
            s = s * 1103515245u + 12345u, buf[i] = (unsigned char)(s >> 16);
            if (buf[i] == ' ' || (i >= 2 && !memcmp(buf + i - 2, "\xE2\x96\x81", 3))) buf[i] = 'x';
        }
        int32_t *ids;
        size_t n, back_len;
        CT_EXPECT_OK(ct_tokenizer_encode_alloc(tok, (const char *)buf, len, &ids, &n));
        char back[4096];
        CT_EXPECT_OK(ct_tokenizer_decode(tok, ids, n, back, sizeof back, &back_len));
        CT_EXPECTF(back_len == len && !memcmp(back, buf, len), "round %d: %zu bytes back of %zu", round, back_len, len);
        free(ids);
    }
    ct_tokenizer_free(tok);
}

CT_TEST(arbitrary_bytes_round_trip) { bytes_round_trip(FIX "gpt2.json"); }
CT_TEST(arbitrary_bytes_round_trip_sentencepiece) { bytes_round_trip(FIX "sp.json"); }

/* Random bytes through Qwen2's NFC: decode gives NFC(x), the invalid bytes as they were. */
CT_TEST(arbitrary_bytes_nfc) {
    ct_tokenizer *tok;
    CT_ASSERT(ct_tokenizer_load(FIX "qwen2.json", &tok) == CT_OK);
    unsigned char buf[2048], *nfc = NULL;
    size_t cap = 0;
    uint32_t s = 777;
    for (int round = 0; round < 40; round++) {
        size_t len = (size_t)round * 50;
        for (size_t i = 0; i < len; i++) {
            s = s * 1103515245u + 12345u;
            /* a mix of ASCII, combining marks (U+0300-U+033F) and random bytes */
            unsigned r = s >> 16;
            if (r % 4 == 0 && i + 1 < len) buf[i++] = 0xCC, buf[i] = (unsigned char)(0x80 | (r >> 2 & 63));
            else buf[i] = (unsigned char)(r % 4 == 1 ? 'a' + r % 26 : r >> 3);
        }
        int32_t *ids;
        size_t n, back_len, nl;
        CT_EXPECT_OK(ct_tokenizer_encode_alloc(tok, (const char *)buf, len, &ids, &n));
        CT_EXPECT_OK(ct_nfc_utf8(buf, len, &nfc, &cap, &nl));
        char back[8192];
        CT_EXPECT_OK(ct_tokenizer_decode(tok, ids, n, back, sizeof back, &back_len));
        CT_EXPECTF(back_len == nl && !memcmp(back, nfc, nl), "round %d: %zu bytes back, NFC has %zu", round, back_len, nl);
        free(ids);
    }
    free(nfc);
    ct_tokenizer_free(tok);
}

/* Characters with no token: <0xXX> where all their bytes have one, else <unk>, a run of
 * them one <unk> with fuse_unk; a pending <unk> goes out after byte tokens that follow it
 * ("yxy"), and "<unk>" in the text is the special token, the segment after it starting
 * with its own U+2581. The ids are what `tokenizers` 0.23.3 gives for this file. */
CT_TEST(sentencepiece_unk_and_fallback) {
    static const int32_t fused[] = {4, 1, 5, 0, 1, 3, 0, 1, 0, 1, 5, 0};
    static const int32_t unfused[] = {4, 1, 5, 0, 0, 1, 3, 0, 1, 0, 0, 1, 5, 0, 0};
    for (int fuse = 0; fuse < 2; fuse++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"normalized\": false, \"special\": true}],"
                 " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\u2581\"},"
                 " {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}]}, \"pre_tokenizer\": null,"
                 " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": %s, \"byte_fallback\": true,"
                 " \"vocab\": {\"<unk>\": 0, \"\u2581\": 1, \"a\": 2, \"b\": 3, \"\u2581a\": 4, \"<0x78>\": 5}, \"merges\": [\"\u2581 a\"]}}",
                 fuse ? "true" : "false");
        const char *p = ct_test_tmp_path("sp_unk.json");
        ct_test_write_file(p, json, strlen(json));
        ct_tokenizer *tok;
        CT_ASSERT(ct_tokenizer_load(p, &tok) == CT_OK);
        const char *text = "a xyz b<unk>qq yxy";
        int32_t ids[32];
        size_t n;
        CT_EXPECT_OK(ct_tokenizer_encode(tok, text, strlen(text), ids, 32, &n));
        const int32_t *want = fuse ? fused : unfused;
        size_t wn = fuse ? sizeof fused / sizeof *fused : sizeof unfused / sizeof *unfused;
        CT_EXPECTF(n == wn && !memcmp(ids, want, n * sizeof *ids), "fuse_unk %d: %zu ids (want %zu)", fuse, n, wn);
        ct_tokenizer_free(tok);
        remove(p);
    }
}

CT_TEST(specials_and_small_buffers) {
    ct_tokenizer *tok;
    CT_ASSERT(ct_tokenizer_load(FIX "llama3.json", &tok) == CT_OK);
    int32_t bot = ct_tokenizer_token_id(tok, "<|begin_of_text|>");
    CT_EXPECT(bot >= 0);
    CT_EXPECT_EQ(ct_tokenizer_bos(tok), bot);
    CT_EXPECT_EQ(ct_tokenizer_eos(tok), -1);
    CT_EXPECT(ct_tokenizer_vocab_size(tok) >= 3000);
    int32_t ids[2];
    size_t n;
    CT_EXPECT_OK(ct_tokenizer_encode(tok, "x<|begin_of_text|>yz hello world", 32, ids, 2, &n));
    CT_EXPECT(n > 2);
    CT_EXPECT_EQ(ids[1], bot);
    int32_t bad = ct_tokenizer_vocab_size(tok);
    char out[8];
    size_t len;
    CT_EXPECT(ct_tokenizer_decode(tok, &bad, 1, out, sizeof out, &len) == CT_ERR_INVALID);
    ct_tokenizer_free(tok);
}

static ct_status load_text(const char *json) {
    const char *p = ct_test_tmp_path("tok.json");
    FILE *f = fopen(p, "w");
    fputs(json, f);
    fclose(f);
    ct_tokenizer *tok = NULL;
    ct_status st = ct_tokenizer_load(p, &tok);
    ct_tokenizer_free(tok);
    remove(p);
    return st;
}

CT_TEST(malformed_files_are_errors) {
    const char *pre = "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}";
    char buf[512];
    CT_EXPECT(load_text("[1, 2]") == CT_ERR_FORMAT);
    CT_EXPECT(load_text("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}") == CT_ERR_FORMAT);
    CT_EXPECT(load_text("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}") == CT_ERR_UNSUPPORTED);
    snprintf(buf, sizeof buf, "{\"model\": {\"vocab\": {\"a\": 2000000000}, \"merges\": []}, %s}", pre);
    CT_EXPECT(load_text(buf) == CT_ERR_FORMAT);
    snprintf(buf, sizeof buf, "{\"model\": {\"vocab\": {\"a\": -1}, \"merges\": []}, %s}", pre);
    CT_EXPECT(load_text(buf) == CT_ERR_FORMAT);
    snprintf(buf, sizeof buf, "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}, %s}", pre);
    CT_EXPECT(load_text(buf) == CT_ERR_FORMAT);
    snprintf(buf, sizeof buf, "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}, %s}", pre);
    CT_EXPECT(load_text(buf) == CT_ERR_FORMAT);
    snprintf(buf, sizeof buf, "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [[\"a\", \"b\"]]}, %s}", pre);
    CT_EXPECT_OK(load_text(buf));
    snprintf(buf, sizeof buf, "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"added_tokens\": {\"x\": 1}, %s}", pre);
    CT_EXPECT(load_text(buf) != CT_OK);
    CT_EXPECT(load_text("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Whitespace\"}}") ==
              CT_ERR_UNSUPPORTED);
    /* refused, not misread: a normalized added token beside a normalizer, a normalizer other
     * than NFC or SentencePiece's, U+0000 in a string (cJSON would cut the token there) */
    snprintf(buf, sizeof buf, "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"normalizer\": {\"type\": \"NFC\"}, "
             "\"added_tokens\": [{\"id\": 1, \"content\": \"x\", \"normalized\": true}], %s}", pre);
    CT_EXPECT(load_text(buf) == CT_ERR_UNSUPPORTED);
    snprintf(buf, sizeof buf, "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}, \"normalizer\": {\"type\": \"Lowercase\"}, %s}", pre);
    CT_EXPECT(load_text(buf) == CT_ERR_UNSUPPORTED);
    snprintf(buf, sizeof buf, "{\"model\": {\"vocab\": {\"a\\u0000\": 0, \"a\": 1}, \"merges\": []}, %s}", pre);
    CT_EXPECT(load_text(buf) == CT_ERR_UNSUPPORTED);
    ct_tokenizer *tok = NULL;
    CT_EXPECT(ct_tokenizer_load("/nonexistent/tokenizer.json", &tok) == CT_ERR_IO && !tok);
}

/* GPT-2's vocab.json + merges.txt: the "#version" line skipped, <|endoftext|> special. */
CT_TEST(gpt2_vocab_and_merges) {
    char vocab[64], merges[64];
    snprintf(vocab, sizeof vocab, "%s", ct_test_tmp_path("vocab.json"));
    snprintf(merges, sizeof merges, "%s", ct_test_tmp_path("merges.txt"));
    const char *v = "{\"a\": 0, \"b\": 1, \"ab\": 2, \"\u0120\": 3, \"\u0120ab\": 4, \"<|endoftext|>\": 5}";
    const char *m = "#version: 0.2\na b\r\n\u0120 ab\n";
    ct_test_write_file(vocab, v, strlen(v));
    ct_test_write_file(merges, m, strlen(m));
    ct_tokenizer *tok;
    CT_ASSERT(ct_tokenizer_load_gpt2(vocab, merges, &tok) == CT_OK);
    int32_t ids[8];
    size_t n;
    CT_EXPECT_OK(ct_tokenizer_encode(tok, "ab ab<|endoftext|>ba", 20, ids, 8, &n));
    CT_EXPECT_EQ(n, 5);
    CT_EXPECT(ids[0] == 2 && ids[1] == 4 && ids[2] == 5 && ids[3] == 1 && ids[4] == 0);
    ct_tokenizer_free(tok);
    remove(vocab), remove(merges);
}

/* One column of NormalizationTest.txt ("0044 0307") as UTF-8 into out; its length. */
static size_t test_column(const char *col, unsigned char *out) {
    size_t k = 0;
    for (char *end; *col && *col != ';'; col = end) {
        unsigned long cp = strtoul(col, &end, 16);
        if (end == col) break;
        if (cp < 0x80) out[k++] = (unsigned char)cp;
        else if (cp < 0x800) out[k++] = (unsigned char)(0xC0 | cp >> 6), out[k++] = (unsigned char)(0x80 | (cp & 63));
        else if (cp < 0x10000)
            out[k++] = (unsigned char)(0xE0 | cp >> 12), out[k++] = (unsigned char)(0x80 | (cp >> 6 & 63)),
            out[k++] = (unsigned char)(0x80 | (cp & 63));
        else
            out[k++] = (unsigned char)(0xF0 | cp >> 18), out[k++] = (unsigned char)(0x80 | (cp >> 12 & 63)),
            out[k++] = (unsigned char)(0x80 | (cp >> 6 & 63)), out[k++] = (unsigned char)(0x80 | (cp & 63));
        while (*end == ' ') end++;
    }
    return k;
}

/* NFC as Unicode's own conformance test (NormalizationTest.txt, package unicode-data, the
 * data the tables come from) has it: c2 == NFC(c1) == NFC(c2) == NFC(c3), c4 == NFC(c4) ==
 * NFC(c5), on every line. */
CT_TEST(nfc_conformance) {
    const char *path = "/usr/share/unicode/NormalizationTest.txt.bz2";
    FILE *f = fopen(path, "rb");
    CT_ASSERT(f && "install unicode-data and bzip2 (bash scripts/setup-interop.sh)");
    fclose(f);
    FILE *p = popen("bzcat /usr/share/unicode/NormalizationTest.txt.bz2", "r");
    CT_ASSERT(p);
    char line[2048];
    unsigned char col[5][256], *out = NULL;
    size_t cap = 0, lines = 0, bad = 0;
    while (fgets(line, sizeof line, p)) {
        if (line[0] == '#' || line[0] == '@' || line[0] == '\n') continue;
        size_t len[5];
        char *c = line;
        for (int i = 0; i < 5; i++) {
            len[i] = test_column(c, col[i]);
            c = strchr(c, ';') + 1;
        }
        static const int want[5] = {1, 1, 1, 3, 3};
        for (int i = 0; i < 5; i++) {
            size_t n;
            CT_ASSERT(ct_nfc_utf8(col[i], len[i], &out, &cap, &n) == CT_OK);
            if (n != len[want[i]] || memcmp(out, col[want[i]], n)) {
                if (bad++ < 5) fprintf(stderr, "NFC of column %d differs: %s", i + 1, line);
            }
        }
        lines++;
    }
    pclose(p);
    free(out);
    CT_EXPECTF(lines > 10000 && bad == 0, "%zu lines, %zu NFC results differ", lines, bad);
}

/* SentencePiece-style: a leading space, spaces inside, text after a special token (which
 * gets its own U+2581), and any bytes, invalid UTF-8 included, come back through byte
 * fallback; ct_tokenizer_token_bytes gives the space the decoder strips. */
CT_TEST(sentencepiece_round_trip) {
    ct_tokenizer *tok;
    CT_ASSERT(ct_tokenizer_load(FIX "sp.json", &tok) == CT_OK);
    CT_EXPECT_EQ(ct_tokenizer_bos(tok), ct_tokenizer_token_id(tok, "<s>"));
    CT_EXPECT_EQ(ct_tokenizer_token_id(tok, "<0x0A>"), 13);
    const char *cases[] = {"hello world", "  two  spaces ", "\xF0\x9F\xA6\x80 \xE4\xB8\x80\xE9\xBE\xA5", "a\xFF\xC0" "b\x80"};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        size_t len = strlen(cases[c]), n, back_len;
        int32_t *ids;
        char back[256];
        CT_EXPECT_OK(ct_tokenizer_encode_alloc(tok, cases[c], len, &ids, &n));
        CT_EXPECT_OK(ct_tokenizer_decode(tok, ids, n, back, sizeof back, &back_len));
        CT_EXPECTF(back_len == len && !memcmp(back, cases[c], len), "case %zu: %zu bytes back of %zu", c, back_len, len);
        const char *b;
        size_t bl;
        CT_EXPECT_OK(ct_tokenizer_token_bytes(tok, ids[0], &b, &bl));
        CT_EXPECT(bl > 0 && b[0] == ' ');
        free(ids);
    }
    ct_tokenizer_free(tok);
}

CT_TEST_MAIN()
