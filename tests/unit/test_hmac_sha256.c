/* SHA-256 against FIPS 180-4's examples and HMAC-SHA256 against RFC 4231's test cases: the
 * store's challenge-response (src/distributed/hmac_sha256.c) rests on both. */
#include <stdio.h>

#include "ct_test.h"
#include "distributed/store_internal.h"

static void hex(const uint8_t *d, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static int sha_is(const void *data, size_t n, const char *want) {
    uint8_t h[CT_SHA256_LEN];
    char got[2 * CT_SHA256_LEN + 1];
    ct_sha256(data, n, h);
    hex(h, sizeof h, got);
    if (strcmp(got, want)) fprintf(stderr, "  sha256 of %zu bytes: %s, expected %s\n", n, got, want);
    return !strcmp(got, want);
}

static int hmac_is(const void *key, size_t klen, const void *msg, size_t n, const char *want) {
    uint8_t h[CT_SHA256_LEN];
    char got[2 * CT_SHA256_LEN + 1];
    int ok = 1;
    /* the message in two parts, split anywhere, is the same message */
    for (size_t cut = 0; cut <= n; cut += n / 3 + 1) {
        ct_hmac_sha256(key, klen, msg, cut, (const uint8_t *)msg + cut, n - cut, h);
        hex(h, sizeof h, got);
        if (strcmp(got, want)) {
            fprintf(stderr, "  hmac (key %zu bytes, message %zu split at %zu): %s, expected %s\n", klen, n, cut, got, want);
            ok = 0;
        }
    }
    return ok;
}

CT_TEST(sha256_fips_180_4) {
    CT_EXPECT(sha_is("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    CT_EXPECT(sha_is("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 56 bytes: padding spills */
    CT_EXPECT(sha_is(two, strlen(two), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
    static char million[1000000];
    memset(million, 'a', sizeof million);
    CT_EXPECT(sha_is(million, sizeof million, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
}

CT_TEST(hmac_sha256_rfc_4231) {
    uint8_t k[131], d[50];
    memset(k, 0x0b, 20);
    CT_EXPECT(hmac_is(k, 20, "Hi There", 8, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"));
    const char *q = "what do ya want for nothing?";
    CT_EXPECT(hmac_is("Jefe", 4, q, strlen(q), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"));
    memset(k, 0xaa, 20);
    memset(d, 0xdd, 50);
    CT_EXPECT(hmac_is(k, 20, d, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"));
    for (int i = 0; i < 25; i++) k[i] = (uint8_t)(i + 1);
    memset(d, 0xcd, 50);
    CT_EXPECT(hmac_is(k, 25, d, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"));
    memset(k, 0xaa, 131); /* keys longer than a block are hashed first */
    const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    CT_EXPECT(hmac_is(k, 131, m6, strlen(m6), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"));
    const char *m7 = "This is a test using a larger than block-size key and a larger than block-size data. The key "
                     "needs to be hashed before being used by the HMAC algorithm.";
    CT_EXPECT(hmac_is(k, 131, m7, strlen(m7), "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"));
}

CT_TEST(constant_time_compare_and_nonces) {
    uint8_t a[32] = {0}, b[32] = {0};
    CT_EXPECT(ct_mem_equal_ct(a, b, 32));
    b[31] = 1;
    CT_EXPECT(!ct_mem_equal_ct(a, b, 32));
    b[31] = 0, b[0] = 0x80;
    CT_EXPECT(!ct_mem_equal_ct(a, b, 32));
    CT_EXPECT_OK(ct_random_bytes(a, sizeof a));
    CT_EXPECT_OK(ct_random_bytes(b, sizeof b));
    CT_EXPECT(memcmp(a, b, 32) != 0); /* two nonces alike: 2^-256 */
    /* the MAC binds token and nonce: another token or nonce, another MAC */
    uint8_t m1[CT_SHA256_LEN], m2[CT_SHA256_LEN];
    ct_store_auth_mac("secret", a, m1);
    ct_store_auth_mac("secret", b, m2);
    CT_EXPECT(memcmp(m1, m2, sizeof m1) != 0);
    ct_store_auth_mac("secreT", a, m2);
    CT_EXPECT(memcmp(m1, m2, sizeof m1) != 0);
}

CT_TEST_MAIN()
