/* The client of ctrain's own store (store_server.c): one blocking connection, one request at
 * a time under a lock, each request a frame answered by a status and its fields (the wire
 * format is in store_internal.h). store.c has checked the arguments before any of these
 * operations runs.
 *
 * Every reply is awaited for at most the client's timeout (a GET: its own wait plus
 * CT_STORE_REPLY_SLACK_S), never a fixed time: a frozen store is reported when the caller's
 * CTRAIN_TIMEOUT says. A reply that did not come leaves the stream out of step (it may still
 * arrive), so that connection is closed and the calls after it fail at once. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctrain/dist.h"
#include "store_internal.h"

typedef struct {
    ct_store base; /* first: a ct_store * is a wire_t * */
    int fd;
    pthread_mutex_t mu;
    char addr[256];
    int port;
    char lost[512]; /* why the connection was closed, when it was */
} wire_t;

static wire_t *wire(ct_store *c) { return (wire_t *)c; }

static void wire_close(ct_store *c) {
    wire_t *w = wire(c);
    if (w->fd >= 0) close(w->fd);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* Closes a connection whose stream can no longer be trusted; returns st with the message. */
static ct_status drop(wire_t *c, ct_status st, const char *fmt, double timeout_s) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    snprintf(c->lost, sizeof c->lost, fmt, c->addr, c->port, timeout_s);
    return ct_error(st, "%s", c->lost);
}

/* Reads one response frame by deadline (status byte stripped into *st). */
static ct_status read_reply(wire_t *c, double deadline, double timeout_s, ct_status *st, ct_sbuf *resp) {
    uint8_t hdr[5];
    uint32_t len;
    int r = ct_sock_recv_all(c->fd, hdr, 5, deadline);
    if (r == -2) return drop(c, CT_ERR_TIMEOUT, "store %s:%d: no reply within %.0f s (the store's host is stopped, "
                                                "overloaded or unreachable)", timeout_s);
    if (r) return drop(c, CT_ERR_PEER, "store %s:%d: connection closed by the server", 0);
    memcpy(&len, hdr, 4);
    if (len < 1 || len > CT_STORE_MAX_FRAME) return drop(c, CT_ERR_FORMAT, "store %s:%d: malformed reply", 0);
    *st = (ct_status)hdr[4];
    resp->n = 0;
    if (len > 1) {
        uint8_t *p = malloc(len - 1);
        if (!p) return drop(c, CT_ERR_NOMEM, "store %s:%d: no memory for a reply", 0);
        if ((r = ct_sock_recv_all(c->fd, p, len - 1, deadline))) {
            free(p);
            return drop(c, r == -2 ? CT_ERR_TIMEOUT : CT_ERR_PEER, "store %s:%d: connection lost (reply)", 0);
        }
        free(resp->p);
        resp->p = p;
        resp->n = resp->cap = len - 1;
    }
    return CT_OK;
}

/* Sends a request and reads the response. */
static ct_status rpc(wire_t *c, const ct_sbuf *req, double timeout_s, ct_status *st, ct_sbuf *resp) {
    if (c->fd < 0) return ct_error(CT_ERR_PEER, "%s (earlier; the connection is closed)", c->lost);
    uint32_t len = (uint32_t)req->n;
    double deadline = ct_time_now() + timeout_s;
    if (ct_sock_send_all(c->fd, &len, 4) || ct_sock_send_all(c->fd, req->p, req->n))
        return drop(c, CT_ERR_PEER, "store %s:%d: connection lost (send)", 0);
    return read_reply(c, deadline, timeout_s, st, resp);
}

/* Runs one request under the client lock; copies the reply's status into a ct_error. */
static ct_status call(ct_store *cs, ct_sbuf *req, double timeout_s, ct_sbuf *resp, const char *what, const char *key) {
    wire_t *c = wire(cs);
    ct_status st = CT_OK;
    pthread_mutex_lock(&c->mu);
    ct_status rs = rpc(c, req, timeout_s, &st, resp);
    pthread_mutex_unlock(&c->mu);
    free(req->p);
    if (rs != CT_OK) return rs;
    if (st == CT_ERR_TIMEOUT) return ct_error(st, "store: timed out waiting for key '%s'", key);
    if (st != CT_OK) return ct_error(st, "store: %s '%s' failed: %s", what, key, ct_status_str(st));
    return CT_OK;
}

static void req_start(ct_sbuf *b, int cmd, const char *key) {
    uint8_t cb = (uint8_t)cmd;
    ct_sbuf_put(b, &cb, 1);
    if (key) ct_sbuf_str(b, key, strlen(key));
}

static const char *wire_protocol(const ct_store *c) {
    (void)c;
    return "ctrain";
}

static ct_status wire_set(ct_store *c, const char *key, const void *val, size_t len) {
    ct_sbuf req = {0}, resp = {0};
    req_start(&req, CT_STORE_CMD_SET, key);
    ct_sbuf_str(&req, val, len);
    ct_status st = call(c, &req, c->timeout, &resp, "set", key);
    free(resp.p);
    return st;
}

/* A value field of a reply as a malloc'd NUL-terminated copy (handy for strings). */
static ct_status copy_value(const ct_sbuf *resp, void **val, size_t *len, const char *malformed) {
    ct_srd r = {resp->p, resp->n, 0, 0};
    size_t n = 0;
    const uint8_t *v = ct_srd_str(&r, &n, CT_STORE_MAX_VALUE);
    if (r.bad) return ct_error(CT_ERR_FORMAT, "%s", malformed);
    uint8_t *o = malloc(n + 1);
    if (!o) return ct_error(CT_ERR_NOMEM, "store value");
    memcpy(o, v, n);
    o[n] = 0;
    *val = o;
    if (len) *len = n;
    return CT_OK;
}

static ct_status wire_get(ct_store *c, const char *key, double timeout_s, void **val, size_t *len) {
    ct_sbuf req = {0}, resp = {0};
    req_start(&req, CT_STORE_CMD_GET, key);
    /* a double outside [0, 2^32) cast to uint32_t is undefined: NaN and negative mean "now",
     * inf and huge values the longest wait the protocol carries (46 days) */
    double ms = timeout_s * 1000;
    ct_sbuf_u32(&req, !(ms > 0) ? 0u : ms > 4e9 ? 4000000000u : (uint32_t)ms);
    if (!(timeout_s >= 0)) timeout_s = 0;
    ct_status st = call(c, &req, timeout_s + CT_STORE_REPLY_SLACK_S, &resp, "get", key);
    if (st == CT_OK) st = copy_value(&resp, val, len, "store: malformed value");
    free(resp.p);
    return st;
}

/* An i64 reply field; `malformed` names the reply when it is short. */
static ct_status read_i64(const ct_sbuf *resp, int64_t *out, const char *malformed) {
    ct_srd r = {resp->p, resp->n, 0, 0};
    int64_t v = ct_srd_i64(&r);
    if (r.bad) return ct_error(CT_ERR_FORMAT, "%s", malformed);
    if (out) *out = v;
    return CT_OK;
}

static ct_status wire_add(ct_store *c, const char *key, int64_t delta, int64_t *out) {
    ct_sbuf req = {0}, resp = {0};
    req_start(&req, CT_STORE_CMD_ADD, key);
    ct_sbuf_put(&req, &delta, 8);
    ct_status st = call(c, &req, c->timeout, &resp, "add", key);
    if (st == CT_OK) st = read_i64(&resp, out, "store: malformed add reply");
    free(resp.p);
    return st;
}

static ct_status wire_compare_set(ct_store *c, const char *key, const void *expected, size_t elen, const void *desired,
                                  size_t dlen, void **cur, size_t *curlen) {
    ct_sbuf req = {0}, resp = {0};
    req_start(&req, CT_STORE_CMD_CAS, key);
    ct_sbuf_u32(&req, expected != NULL);
    ct_sbuf_str(&req, expected ? expected : "", expected ? elen : 0);
    ct_sbuf_str(&req, desired, dlen);
    ct_status st = call(c, &req, c->timeout, &resp, "compare_set", key);
    if (st == CT_OK && cur) {
        ct_srd r = {resp.p, resp.n, 0, 0};
        size_t n = 0;
        const uint8_t *v = ct_srd_str(&r, &n, CT_STORE_MAX_VALUE);
        if (r.bad) st = ct_error(CT_ERR_FORMAT, "store: malformed reply");
        else if ((*cur = malloc(n + 1))) {
            memcpy(*cur, v, n);
            ((char *)*cur)[n] = 0;
            if (curlen) *curlen = n;
        }
    }
    free(resp.p);
    return st;
}

/* DELETE and CHECK: a request with a key, answered by one flag byte. */
static ct_status flag_call(ct_store *c, int cmd, const char *key, bool *flag) {
    ct_sbuf req = {0}, resp = {0};
    req_start(&req, cmd, key);
    ct_status st = call(c, &req, c->timeout, &resp, cmd == CT_STORE_CMD_DEL ? "delete" : "check", key);
    if (st == CT_OK && flag) *flag = resp.n >= 1 && resp.p[0];
    free(resp.p);
    return st;
}
static ct_status wire_del(ct_store *c, const char *key, bool *existed) {
    return flag_call(c, CT_STORE_CMD_DEL, key, existed);
}
static ct_status wire_check(ct_store *c, const char *key, bool *exists) {
    return flag_call(c, CT_STORE_CMD_CHECK, key, exists);
}

static ct_status wire_num_keys(ct_store *c, int64_t *out) {
    ct_sbuf req = {0}, resp = {0};
    req_start(&req, CT_STORE_CMD_NKEYS, NULL);
    ct_status st = call(c, &req, c->timeout, &resp, "num_keys", "");
    if (st == CT_OK) st = read_i64(&resp, out, "store: malformed reply");
    free(resp.p);
    return st;
}

static const ct_store_ops wire_ops = {
    .protocol = wire_protocol,
    .close = wire_close,
    .set = wire_set,
    .get = wire_get,
    .add = wire_add,
    .compare_set = wire_compare_set,
    .del = wire_del,
    .check = wire_check,
    .num_keys = wire_num_keys,
};

/* Answers the server's challenge (store_internal.h): reads the nonce, sends HELLO with the
 * MAC. The transport's status; the server's answer in *st. */
static ct_status hello(wire_t *c, const char *token, double deadline, double timeout_s, ct_status *st) {
    ct_sbuf req = {0}, resp = {0};
    ct_status rs = read_reply(c, deadline, timeout_s, st, &resp);
    if (rs == CT_OK && (*st != CT_OK || resp.n != CT_STORE_NONCE_LEN))
        rs = drop(c, CT_ERR_FORMAT, "store %s:%d: no challenge from the server (not a ctrain store of this version?)", 0);
    if (rs == CT_OK) {
        uint8_t mac[CT_SHA256_LEN], cmd = CT_STORE_CMD_HELLO;
        ct_store_auth_mac(token, resp.p, mac);
        if (ct_sbuf_put(&req, &cmd, 1) || ct_sbuf_str(&req, mac, sizeof mac)) rs = ct_error(CT_ERR_NOMEM, "store hello");
        else rs = rpc(c, &req, deadline - ct_time_now(), st, &resp);
    }
    free(req.p);
    free(resp.p);
    return rs;
}

/* Connects and authenticates. A connection closed before the HELLO reply (the server
 * evicted it while strangers crowded the unauthenticated slots) is retried until the
 * deadline; an explicit rejection (wrong token) is final. */
ct_status ct_store_connect(const char *addr, int port, const char *token, double timeout_s, ct_store **out) {
    *out = NULL;
    if (!addr) addr = "127.0.0.1";
    if (port <= 0 || port > 65535) return ct_error(CT_ERR_INVALID, "store port %d out of range", port);
    if (token && strlen(token) > 255) return ct_error(CT_ERR_INVALID, "store token longer than 255 bytes");
    double deadline = ct_time_now() + timeout_s;
    int delay_us = 1000;
    for (;;) {
        int fd = ct_sock_connect(addr, port);
        if (fd == -2) return ct_error(CT_ERR_INVALID, "store: cannot resolve '%s'", addr);
        if (fd < 0) {
            if (ct_time_now() > deadline)
                return ct_error(CT_ERR_TIMEOUT, "store %s:%d: nobody listening after %.0f s", addr, port, timeout_s);
            usleep((useconds_t)delay_us);
            if (delay_us < 100000) delay_us *= 2;
            continue;
        }
        wire_t *c = calloc(1, sizeof *c);
        if (!c) { close(fd); return ct_error(CT_ERR_NOMEM, "store client"); }
        c->base.ops = &wire_ops;
        c->fd = fd;
        c->port = port;
        snprintf(c->addr, sizeof c->addr, "%s", addr);
        c->base.timeout = timeout_s >= CT_STORE_MIN_REPLY_S ? timeout_s : CT_STORE_MIN_REPLY_S; /* NaN too */
        pthread_mutex_init(&c->mu, NULL);
        /* a store that accepted (its kernel did) but never speaks: at most the timeout */
        double until = deadline > ct_time_now() + 1 ? deadline : ct_time_now() + 1;
        ct_status st = CT_OK, rs = hello(c, token, until, timeout_s, &st);
        if (rs == CT_OK && st == CT_OK) {
            *out = &c->base;
            return CT_OK;
        }
        wire_close(&c->base);
        if (rs == CT_OK)
            return ct_error(CT_ERR_PEER, "store %s:%d rejected this process (wrong CTRAIN_STORE_TOKEN?)", addr, port);
        if (rs != CT_ERR_PEER || ct_time_now() > deadline) {
            if (rs == CT_ERR_PEER)
                return ct_error(CT_ERR_PEER, "store %s:%d closed every connection before authentication for %.0f s",
                                addr, port, timeout_s);
            return rs;
        }
        usleep((useconds_t)delay_us);
        if (delay_us < 100000) delay_us *= 2;
    }
}
