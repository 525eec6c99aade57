/* Client for PyTorch's c10d TCPStore: the store torchrun's agent hosts on MASTER_PORT,
 * behind the same ct_store_* calls as ctrain's own store (store.c checks their arguments).
 *
 * Wire layout (little endian, no framing): a query is one type byte, then its fields;
 * strings and byte vectors are a u64 length and the bytes, integers are i64. Replies carry
 * no status: GET and COMPARE_SET answer a vector, ADD/DELETE/GETNUMKEYS an i64, CHECK a u8
 * (0 ready, 1 not ready), WAIT a u8 (0 stop waiting, 1 wait canceled) once every key exists.
 * SET has no reply. A server that cannot serve a query (an ADD to a non-number) closes the
 * connection. Like torch's own client, keys go on the wire with a leading "/", so Python's
 * TCPStore sees ctrain's keys under their plain names.
 *
 * Two layouts, checked against the servers of PyTorch 1.13 (Debian's python3-torch) and
 * 2.15 (PyPI: the libuv server, the default, and the legacy one, use_libuv=False):
 *  - v1 (1.13, and 2.0 as far as its source shows): SET 0, COMPARE_SET 1, GET 2, ADD 3,
 *    CHECK 4, WAIT 5, GETNUMKEYS 6, (WATCH_KEY 7), DELETE_KEY 8. No handshake. A WAIT that
 *    times out cannot be canceled: the late reply would land in the next query, so the
 *    connection is replaced.
 *  - v2 (2.x with the validation handshake, 2.15 tested): VALIDATE 0, SET 1, COMPARE_SET 2,
 *    GET 3, ADD 4, CHECK 5, WAIT 6, GETNUMKEYS 7, DELETE_KEY 8, CANCEL_WAIT 12, PING 13.
 *    A connection opens with VALIDATE + u32 0x3C85F7CE (no reply) and PING + u32 nonce
 *    (the nonce comes back). A timed-out WAIT is canceled with CANCEL_WAIT.
 * The layout is found by sending the v2 opening: a v1 server reads it as a SET whose key
 * length (built from the magic number and the nonce, whose third byte is 0xff) exceeds what
 * it can allocate, and drops the connection; the client then reconnects speaking v1 and
 * checks the server answers GETNUMKEYS. 2.x releases between those layouts (no WATCH_KEY,
 * no handshake) are not covered. torchrun's store takes no token. */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctrain/dist.h"
#include "store_internal.h"

enum { Q_SET, Q_CAS, Q_GET, Q_ADD, Q_CHECK, Q_WAIT, Q_NKEYS, Q_DEL, Q_CANCEL_WAIT, Q_PING, Q_VALIDATE, Q_N_ };
static const uint8_t code_v1[Q_N_] = {0, 1, 2, 3, 4, 5, 6, 8, 0xff, 0xff, 0xff};
static const uint8_t code_v2[Q_N_] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 0};
#define MAGIC 0x3C85F7CEu
#define PROBE_S 5.0 /* least wait for a reply on connect (a v2 server answers PING at once, v1 hangs up) */

typedef struct {
    ct_store base; /* first: a ct_store * is a c10d_t * */
    int fd;
    int v2;
    pthread_mutex_t mu;
    char addr[256];
    int port;
} c10d_t;

static c10d_t *c10d(ct_store *c) { return (c10d_t *)c; }

/* A query being built: the first failed allocation is remembered and reported on send. */
typedef struct { ct_sbuf b; int oom; } qbuf;

static void put(qbuf *b, const void *d, size_t n) {
    if (!b->oom && ct_sbuf_put(&b->b, d, n)) b->oom = 1;
}
static void put_u64(qbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_bytes(qbuf *b, const void *d, size_t n) { put_u64(b, n); put(b, d, n); }
static void put_key(qbuf *b, const char *key) {
    put_u64(b, strlen(key) + 1);
    put(b, "/", 1);
    put(b, key, strlen(key));
}
static void start(c10d_t *c, qbuf *b, int q) {
    uint8_t t = (c->v2 ? code_v2 : code_v1)[q];
    put(b, &t, 1);
}

static ct_status lost(c10d_t *c, int r, double timeout_s) {
    if (r == -2) return ct_error(CT_ERR_TIMEOUT, "c10d store %s:%d: no reply within %.0f s", c->addr, c->port, timeout_s);
    return ct_error(CT_ERR_PEER, "c10d store %s:%d: connection closed by the server", c->addr, c->port);
}

/* Sends b (and frees it). */
static ct_status send_q(c10d_t *c, qbuf *b) {
    if (b->oom) { free(b->b.p); return ct_error(CT_ERR_NOMEM, "c10d store query"); }
    int r = ct_sock_send_all(c->fd, b->b.p, b->b.n);
    free(b->b.p);
    if (r) return ct_error(CT_ERR_PEER, "c10d store %s:%d: connection lost (send)", c->addr, c->port);
    return CT_OK;
}

static ct_status recv_exact(c10d_t *c, void *d, size_t n, double timeout_s) {
    int r = ct_sock_recv_all(c->fd, d, n, ct_time_now() + timeout_s);
    return r ? lost(c, r, timeout_s) : CT_OK;
}

static ct_status recv_i64(c10d_t *c, int64_t *v, double timeout_s) { return recv_exact(c, v, 8, timeout_s); }

/* A vector reply as a malloc'd NUL-terminated copy. */
static ct_status recv_vec(c10d_t *c, void **val, size_t *len, double timeout_s) {
    uint64_t n = 0;
    ct_status st = recv_exact(c, &n, 8, timeout_s);
    if (st) return st;
    if (n > CT_STORE_MAX_VALUE) return ct_error(CT_ERR_FORMAT, "c10d store: value of %llu bytes is over the limit",
                                                (unsigned long long)n);
    uint8_t *o = malloc(n + 1);
    if (!o) return ct_error(CT_ERR_NOMEM, "c10d store value");
    if ((st = recv_exact(c, o, n, timeout_s))) { free(o); return st; }
    o[n] = 0;
    *val = o;
    if (len) *len = n;
    return CT_OK;
}

/* Opens a connection speaking v2 (probe = 1: returns -3 when the server hung up on the
 * handshake, i.e. speaks v1) or v1 (checked with GETNUMKEYS). */
static int open_fd(c10d_t *c, int v2, double timeout_s) {
    int fd = ct_sock_connect(c->addr, c->port);
    if (fd < 0) return fd;
    qbuf b = {0};
    int64_t n = 0;
    if (v2) {
        uint32_t magic = MAGIC, nonce = 0x00ff0000u | ((uint32_t)getpid() & 0xffffu), back = 0;
        uint8_t t = code_v2[Q_VALIDATE];
        put(&b, &t, 1);
        put(&b, &magic, 4);
        t = code_v2[Q_PING];
        put(&b, &t, 1);
        put(&b, &nonce, 4);
        int r = b.oom ? -1 : ct_sock_send_all(fd, b.b.p, b.b.n);
        free(b.b.p);
        if (!r) r = ct_sock_recv_all(fd, &back, 4, ct_time_now() + timeout_s);
        if (!r && back == nonce) return fd;
        close(fd);
        return r == -1 ? -3 : -4;
    }
    uint8_t t = code_v1[Q_NKEYS];
    if (ct_sock_send_all(fd, &t, 1) || ct_sock_recv_all(fd, &n, 8, ct_time_now() + timeout_s) || n < 0) {
        close(fd);
        return -4;
    }
    return fd;
}

/* Waits for one key. On timeout the WAIT is canceled (v2) or the connection replaced (v1),
 * so the handle stays usable. Called with c->mu held. */
static ct_status wait_key(c10d_t *c, const char *key, double timeout_s) {
    qbuf b = {0};
    start(c, &b, Q_WAIT);
    put_u64(&b, 1);
    put_key(&b, key);
    ct_status st = send_q(c, &b);
    if (st) return st;
    uint8_t r8 = 0;
    int r = ct_sock_recv_all(c->fd, &r8, 1, ct_time_now() + (timeout_s > 0 ? timeout_s : 0));
    if (r == -1) return lost(c, r, timeout_s);
    if (r == 0) {
        if (r8 != 0) return ct_error(CT_ERR_FORMAT, "c10d store: unexpected reply %u to WAIT", r8);
        return CT_OK;
    }
    if (c->v2) {
        b = (qbuf){0};
        start(c, &b, Q_CANCEL_WAIT);
        if ((st = send_q(c, &b))) return st;
        /* a STOP_WAITING sent before the server saw the cancel comes first */
        for (int i = 0; i < 2; i++) {
            if ((st = recv_exact(c, &r8, 1, 30))) return st;
            if (r8 == 1) break;
        }
    } else {
        int fd = open_fd(c, 0, PROBE_S);
        if (fd < 0) return ct_error(CT_ERR_PEER, "c10d store %s:%d: cannot reconnect after a timed-out wait", c->addr,
                                    c->port);
        close(c->fd);
        c->fd = fd;
    }
    return ct_error(CT_ERR_TIMEOUT, "store: timed out waiting for key '%s'", key);
}

static ct_status c10d_set(ct_store *cs, const char *key, const void *val, size_t len) {
    c10d_t *c = c10d(cs);
    qbuf b = {0};
    start(c, &b, Q_SET);
    put_key(&b, key);
    put_bytes(&b, val, len);
    pthread_mutex_lock(&c->mu);
    ct_status st = send_q(c, &b);
    pthread_mutex_unlock(&c->mu);
    return st;
}

static ct_status c10d_get(ct_store *cs, const char *key, double timeout_s, void **val, size_t *len) {
    c10d_t *c = c10d(cs);
    pthread_mutex_lock(&c->mu);
    ct_status st = wait_key(c, key, timeout_s);
    if (!st) {
        qbuf b = {0};
        start(c, &b, Q_GET);
        put_key(&b, key);
        st = send_q(c, &b);
        if (!st) st = recv_vec(c, val, len, c->base.timeout);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* One query whose reply is an i64. */
static ct_status call_i64(c10d_t *c, int q, const char *key, const int64_t *arg, int64_t *out) {
    qbuf b = {0};
    start(c, &b, q);
    if (key) put_key(&b, key);
    if (arg) put(&b, arg, 8);
    pthread_mutex_lock(&c->mu);
    ct_status st = send_q(c, &b);
    if (!st) st = recv_i64(c, out, c->base.timeout);
    pthread_mutex_unlock(&c->mu);
    return st;
}

static ct_status c10d_add(ct_store *cs, const char *key, int64_t delta, int64_t *out) {
    c10d_t *c = c10d(cs);
    int64_t v = 0;
    ct_status st = call_i64(c, Q_ADD, key, &delta, &v);
    if (!st && out) *out = v;
    return st;
}

static ct_status c10d_delete(ct_store *cs, const char *key, bool *existed) {
    c10d_t *c = c10d(cs);
    int64_t n = 0;
    ct_status st = call_i64(c, Q_DEL, key, NULL, &n);
    if (!st && existed) *existed = n > 0;
    return st;
}

static ct_status c10d_num_keys(ct_store *c, int64_t *out) { return call_i64(c10d(c), Q_NKEYS, NULL, NULL, out); }

static ct_status c10d_check(ct_store *cs, const char *key, bool *exists) {
    c10d_t *c = c10d(cs);
    qbuf b = {0};
    start(c, &b, Q_CHECK);
    put_u64(&b, 1);
    put_key(&b, key);
    uint8_t r8 = 0;
    pthread_mutex_lock(&c->mu);
    ct_status st = send_q(c, &b);
    if (!st) st = recv_exact(c, &r8, 1, c->base.timeout);
    pthread_mutex_unlock(&c->mu);
    if (!st && r8 > 1) st = ct_error(CT_ERR_FORMAT, "c10d store: unexpected reply %u to CHECK", r8);
    if (!st && exists) *exists = r8 == 0;
    return st;
}

/* c10d's compare-set: a missing key with an empty expected value is set; a missing key
 * with another expected value is left missing and that value comes back. */
static ct_status c10d_compare_set(ct_store *cs, const char *key, const void *expected, size_t elen,
                                  const void *desired, size_t dlen, void **cur, size_t *curlen) {
    c10d_t *c = c10d(cs);
    qbuf b = {0};
    start(c, &b, Q_CAS);
    put_key(&b, key);
    put_bytes(&b, expected ? expected : "", expected ? elen : 0);
    put_bytes(&b, desired, dlen);
    void *v = NULL;
    size_t n = 0;
    pthread_mutex_lock(&c->mu);
    ct_status st = send_q(c, &b);
    if (!st) st = recv_vec(c, &v, &n, c->base.timeout);
    pthread_mutex_unlock(&c->mu);
    if (st) return st;
    if (cur) {
        *cur = v;
        if (curlen) *curlen = n;
    } else {
        free(v);
    }
    return CT_OK;
}

static const char *c10d_protocol(const ct_store *c) { return ((const c10d_t *)c)->v2 ? "c10d-v2" : "c10d-v1"; }

static void c10d_close(ct_store *cs) {
    c10d_t *c = c10d(cs);
    if (c->fd >= 0) close(c->fd);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static const ct_store_ops c10d_ops = {
    .protocol = c10d_protocol,
    .close = c10d_close,
    .set = c10d_set,
    .get = c10d_get,
    .add = c10d_add,
    .compare_set = c10d_compare_set,
    .del = c10d_delete,
    .check = c10d_check,
    .num_keys = c10d_num_keys,
};

ct_status ct_store_connect_c10d(const char *addr, int port, double timeout_s, ct_store **out) {
    *out = NULL;
    if (!addr) addr = "127.0.0.1";
    if (port <= 0 || port > 65535) return ct_error(CT_ERR_INVALID, "store port %d out of range", port);
    c10d_t *c = calloc(1, sizeof *c);
    if (!c) return ct_error(CT_ERR_NOMEM, "c10d store client");
    c->base.ops = &c10d_ops;
    c->base.timeout = timeout_s >= CT_STORE_MIN_REPLY_S ? timeout_s : CT_STORE_MIN_REPLY_S; /* each reply's limit, as ctrain's client */
    snprintf(c->addr, sizeof c->addr, "%s", addr);
    c->port = port;
    double deadline = ct_time_now() + timeout_s;
    int delay_us = 1000;
    for (;;) {
        /* a server that answers neither way within the whole timeout is hung, not foreign */
        double left = deadline - ct_time_now();
        if (left < PROBE_S) left = PROBE_S;
        int fd = open_fd(c, 1, left);
        if (fd == -3) { /* hung up on the handshake: a v1 server */
            fd = open_fd(c, 0, left);
            if (fd >= 0) c->v2 = 0;
        } else if (fd >= 0) {
            c->v2 = 1;
        }
        if (fd == -2) {
            free(c);
            return ct_error(CT_ERR_INVALID, "store: cannot resolve '%s'", addr);
        }
        if (fd == -4 || fd == -3) {
            free(c);
            return ct_error(CT_ERR_PEER, "%s:%d does not answer like a PyTorch TCPStore (1.13 or 2.x with the "
                            "validation handshake)", addr, port);
        }
        if (fd >= 0) {
            c->fd = fd;
            pthread_mutex_init(&c->mu, NULL);
            *out = &c->base;
            return CT_OK;
        }
        if (ct_time_now() > deadline) {
            free(c);
            return ct_error(CT_ERR_TIMEOUT, "c10d store %s:%d: nobody listening after %.0f s", addr, port, timeout_s);
        }
        usleep((useconds_t)delay_us);
        if (delay_us < 100000) delay_us *= 2;
    }
}
