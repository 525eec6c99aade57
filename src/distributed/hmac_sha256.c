/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104) for the store's challenge-response: the
 * secret proves itself without crossing the wire, and no crypto library is linked for it.
 * Small and unhurried: the store hashes a few dozen bytes per connection. Checked against
 * the FIPS 180-4 and RFC 4231 vectors in tests/unit/test_hmac_sha256.c. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "store_internal.h"

typedef struct {
    uint32_t h[8];
    uint8_t buf[64];
    size_t nbuf;
    uint64_t total; /* bytes hashed so far */
} sha256_ctx;

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void block(sha256_ctx *c, const uint8_t *p) {
    uint32_t w[64], s[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(s, c->h, sizeof s);
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = s[7] + (ror(s[4], 6) ^ ror(s[4], 11) ^ ror(s[4], 25)) + ((s[4] & s[5]) ^ (~s[4] & s[6])) + K[i] + w[i];
        uint32_t t2 = (ror(s[0], 2) ^ ror(s[0], 13) ^ ror(s[0], 22)) + ((s[0] & s[1]) ^ (s[0] & s[2]) ^ (s[1] & s[2]));
        memmove(s + 1, s, 7 * sizeof *s);
        s[4] += t1;
        s[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) c->h[i] += s[i];
}

static void sha_init(sha256_ctx *c) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->nbuf = 0;
    c->total = 0;
}

static void sha_update(sha256_ctx *c, const void *data, size_t n) {
    const uint8_t *p = data;
    c->total += n;
    while (n) {
        size_t k = 64 - c->nbuf < n ? 64 - c->nbuf : n;
        memcpy(c->buf + c->nbuf, p, k);
        c->nbuf += k;
        p += k;
        n -= k;
        if (c->nbuf == 64) {
            block(c, c->buf);
            c->nbuf = 0;
        }
    }
}

static void sha_final(sha256_ctx *c, uint8_t out[CT_SHA256_LEN]) {
    uint64_t bits = c->total * 8;
    uint8_t pad[72] = {0x80};
    size_t npad = (c->nbuf < 56 ? 56 : 120) - c->nbuf; /* then 8 bytes of length end a block */
    for (int i = 0; i < 8; i++) pad[npad + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha_update(c, pad, npad + 8);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(c->h[i] >> (24 - 8 * j));
}

void ct_sha256(const void *data, size_t n, uint8_t out[CT_SHA256_LEN]) {
    sha256_ctx c;
    sha_init(&c);
    sha_update(&c, data, n);
    sha_final(&c, out);
}

void ct_hmac_sha256(const void *key, size_t klen, const void *msg1, size_t n1, const void *msg2, size_t n2,
                    uint8_t out[CT_SHA256_LEN]) {
    uint8_t k[64] = {0}, pad[64], inner[CT_SHA256_LEN];
    if (klen > 64) ct_sha256(key, klen, k); /* RFC 2104: a long key is hashed first */
    else if (klen) memcpy(k, key, klen);
    sha256_ctx c;
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    sha_init(&c);
    sha_update(&c, pad, 64);
    sha_update(&c, msg1, n1);
    if (n2) sha_update(&c, msg2, n2);
    sha_final(&c, inner);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    sha_init(&c);
    sha_update(&c, pad, 64);
    sha_update(&c, inner, sizeof inner);
    sha_final(&c, out);
    memset(k, 0, sizeof k); /* best effort: the key does not linger on the stack */
}

int ct_mem_equal_ct(const void *a, const void *b, size_t n) {
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;
    for (size_t i = 0; i < n; i++) d |= (uint8_t)(x[i] ^ y[i]);
    return d == 0;
}

int ct_random_bytes(void *out, size_t n) {
    uint8_t *p = out;
    while (n) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        p += r;
        n -= (size_t)r;
    }
    if (!n) return 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t r = read(fd, p, n);
    close(fd);
    return r == (ssize_t)n ? 0 : -1;
}

void ct_store_auth_mac(const char *token, const uint8_t nonce[CT_STORE_NONCE_LEN], uint8_t mac[CT_SHA256_LEN]) {
    const char *t = token ? token : "";
    ct_hmac_sha256(t, strlen(t), nonce, CT_STORE_NONCE_LEN, CT_STORE_AUTH_CONTEXT, strlen(CT_STORE_AUTH_CONTEXT), mac);
}
