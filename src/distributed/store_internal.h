/* Private to the store's files: the socket and framing helpers (store_sock.c), the wire
 * format that ctrain's server and client share (store_server.c, store_client.c), and the
 * interface that each kind of client fills for the public ct_store_* calls (store.c). */
#ifndef CT_STORE_INTERNAL_H
#define CT_STORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/dist.h"

/* ------------------------------------------------------------------ sockets (store_sock.c) */
/* Blocking socket helpers. send_all: 0 or -1; recv_all: 0, -1 (closed or error) or -2
 * (deadline passed); connect: a TCP_NODELAY socket, -1 (refused) or -2 (address does not
 * resolve). */
int ct_sock_send_all(int fd, const void *d, size_t n);
int ct_sock_recv_all(int fd, void *d, size_t n, double deadline);
int ct_sock_connect(const char *addr, int port);

/* A growing byte buffer: put/u32/str return 0, or -1 when out of memory. */
typedef struct { uint8_t *p; size_t n, cap; } ct_sbuf;
int ct_sbuf_put(ct_sbuf *b, const void *d, size_t n);
int ct_sbuf_u32(ct_sbuf *b, uint32_t v);
int ct_sbuf_str(ct_sbuf *b, const void *s, size_t n); /* u32 length, then the bytes */

/* A bounded reader: a read past the end, or a string over `max`, sets bad and yields 0/NULL. */
typedef struct { const uint8_t *p; size_t n, off; int bad; } ct_srd;
uint32_t ct_srd_u32(ct_srd *r);
int64_t ct_srd_i64(ct_srd *r);
const uint8_t *ct_srd_str(ct_srd *r, size_t *len, size_t max);

/* ------------------------------------------------------------------ hashing (hmac_sha256.c) */
#define CT_SHA256_LEN 32
void ct_sha256(const void *data, size_t n, uint8_t out[CT_SHA256_LEN]);
/* HMAC-SHA256(key, msg1 || msg2) */
void ct_hmac_sha256(const void *key, size_t klen, const void *msg1, size_t n1, const void *msg2, size_t n2,
                    uint8_t out[CT_SHA256_LEN]);
/* 1 when a and b hold the same n bytes; the time taken does not depend on where they differ */
int ct_mem_equal_ct(const void *a, const void *b, size_t n);
/* n bytes from the kernel's random source: 0, or -1 when there is none (never a weaker stand-in) */
int ct_random_bytes(void *out, size_t n);

/* ------------------------------------------------------------------ ctrain's wire format */
/* Frame (both directions): u32 length of the rest (little endian), then the body.
 * Request body: u8 command, then fields; strings are u32 length + bytes.
 * Response body: u8 status (ct_status), then fields.
 *
 * Authentication, so that the secret never crosses the wire and a recorded exchange is
 * worth nothing later: on accept the server sends a challenge, a response frame of status
 * CT_OK and CT_STORE_NONCE_LEN fresh random bytes; the client's first request is HELLO with
 * one string field, ct_store_auth_mac(token, nonce); the server compares it in constant time
 * and answers CT_OK, or CT_ERR_PEER and closes. */
enum {
    CT_STORE_CMD_HELLO = 1, CT_STORE_CMD_SET, CT_STORE_CMD_GET, CT_STORE_CMD_ADD, CT_STORE_CMD_CAS,
    CT_STORE_CMD_DEL, CT_STORE_CMD_NKEYS, CT_STORE_CMD_CHECK
};
#define CT_STORE_NONCE_LEN 32
#define CT_STORE_AUTH_CONTEXT "ctrain-store-auth-v1" /* binds the MAC to this use of the secret */
void ct_store_auth_mac(const char *token, const uint8_t nonce[CT_STORE_NONCE_LEN], uint8_t mac[CT_SHA256_LEN]);
#define CT_STORE_MAX_FRAME (CT_STORE_MAX_VALUE * 2u + 2 * CT_STORE_MAX_KEY + 64u)

/* ------------------------------------------------------------------ clients (store.c) */
/* One kind of client: ctrain's own (store_client.c) or PyTorch's TCPStore (store_c10d.c).
 * store.c checks the arguments of each ct_store_* call (key and value sizes, cleared
 * outputs) and then calls the operation once; each client's struct starts with a ct_store,
 * so the operations cast it back to their own. */
typedef struct ct_store_ops {
    const char *(*protocol)(const ct_store *c); /* ct_store_protocol's answer */
    void (*close)(ct_store *c);                 /* closes the connection and frees c */
    ct_status (*set)(ct_store *c, const char *key, const void *val, size_t len);
    ct_status (*get)(ct_store *c, const char *key, double timeout_s, void **val, size_t *len);
    ct_status (*add)(ct_store *c, const char *key, int64_t delta, int64_t *out);
    ct_status (*compare_set)(ct_store *c, const char *key, const void *expected, size_t elen, const void *desired,
                             size_t dlen, void **cur, size_t *curlen);
    ct_status (*del)(ct_store *c, const char *key, bool *existed);
    ct_status (*check)(ct_store *c, const char *key, bool *exists);
    ct_status (*num_keys)(ct_store *c, int64_t *out);
} ct_store_ops;

struct ct_store {
    const ct_store_ops *ops;
    double timeout; /* how long a reply may take (a GET's: its own wait + CT_STORE_REPLY_SLACK_S) */
};
/* A GET's reply comes at the latest when the server gives up waiting for the key; this is
 * for the trip back. A client that waited this long past it has a silent (frozen) store. */
#define CT_STORE_REPLY_SLACK_S 1.0
/* The least reply timeout a connect sets: a rank that connects late in its rendezvous passes
 * what is left of it, and a busy store host must still have time to answer the job's calls. */
#define CT_STORE_MIN_REPLY_S 5.0

#endif
