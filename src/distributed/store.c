/* TCP key-value store: one server thread with a poll() loop, blocking clients.
 *
 * Frame (both directions): u32 length of the rest (little endian), then the body.
 * Request body: u8 command, then fields; strings are u32 length + bytes.
 * Response body: u8 status (ct_status), then fields.
 * The first request of a connection must be HELLO with the server's token; anything else,
 * a frame over the limit or a malformed body closes that connection only.
 *
 * Before HELLO a connection costs the server a descriptor and a slot but proves nothing, so
 * strangers must not be able to hold either: an unauthenticated connection lives at most
 * AUTH_DEADLINE_S, at most MAX_UNAUTH_PER_ADDR of them per peer address and MAX_UNAUTH in
 * all (a new one evicts the oldest), and at the descriptor limit the server evicts one and
 * stops accepting for a moment instead of spinning on a listening socket that stays
 * readable. Legitimate clients send HELLO right after connecting, and ct_store_connect
 * reconnects when it was evicted before its HELLO was read. */
#include "ctrain/dist.h"
#include "dist_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { CMD_HELLO = 1, CMD_SET, CMD_GET, CMD_ADD, CMD_CAS, CMD_DEL, CMD_NKEYS, CMD_CHECK };
#define MAX_FRAME (CT_STORE_MAX_VALUE * 2u + 2 * CT_STORE_MAX_KEY + 64u)
#define MAX_CLIENTS 4096
#define MAX_UNAUTH 256
#define MAX_UNAUTH_PER_ADDR 32
#define AUTH_DEADLINE_S 1.0
#define ACCEPT_PAUSE_S 0.1 /* after EMFILE with nobody to evict */

/* ------------------------------------------------------------------ byte buffers */
typedef struct { uint8_t *p; size_t n, cap; } buf_t;

static int buf_put(buf_t *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n) c *= 2;
        uint8_t *q = realloc(b->p, c);
        if (!q) return -1;
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
    return 0;
}
static int buf_u32(buf_t *b, uint32_t v) { return buf_put(b, &v, 4); }
static int buf_str(buf_t *b, const void *s, size_t n) { return buf_u32(b, (uint32_t)n) || buf_put(b, s, n); }

typedef struct { const uint8_t *p; size_t n, off; int bad; } rd_t;
static uint32_t rd_u32(rd_t *r) {
    uint32_t v = 0;
    if (r->off + 4 > r->n) { r->bad = 1; return 0; }
    memcpy(&v, r->p + r->off, 4);
    r->off += 4;
    return v;
}
static int64_t rd_i64(rd_t *r) {
    int64_t v = 0;
    if (r->off + 8 > r->n) { r->bad = 1; return 0; }
    memcpy(&v, r->p + r->off, 8);
    r->off += 8;
    return v;
}
static const uint8_t *rd_str(rd_t *r, size_t *len, size_t max) {
    uint32_t n = rd_u32(r);
    if (r->bad || n > max || r->off + n > r->n) { r->bad = 1; return NULL; }
    const uint8_t *s = r->p + r->off;
    r->off += n;
    *len = n;
    return s;
}

/* ------------------------------------------------------------------ server */
typedef struct { char *key; uint8_t *val; size_t len; } kv_t;
typedef struct {
    int fd;
    int authed;
    uint32_t peer;   /* IPv4 address, network order */
    double t_conn;   /* accept time: unauthenticated connections expire AUTH_DEADLINE_S after it */
    buf_t in;
    char *wait_key; /* pending GET */
    double wait_deadline;
} client_t;

struct ct_store_server {
    int lfd, wake[2], port;
    char token[256];
    pthread_t th;
    int running; /* th exists; only the thread that owns the server changes this */
    kv_t *kv;
    size_t nkv, capkv;
    client_t *cl;
    size_t ncl;
};

static kv_t *kv_find(ct_store_server *s, const char *key, size_t klen) {
    for (size_t i = 0; i < s->nkv; i++)
        if (strlen(s->kv[i].key) == klen && !memcmp(s->kv[i].key, key, klen)) return &s->kv[i];
    return NULL;
}

static kv_t *kv_set(ct_store_server *s, const char *key, size_t klen, const void *val, size_t len) {
    kv_t *e = kv_find(s, key, klen);
    uint8_t *v = malloc(len ? len : 1);
    if (!v) return NULL;
    memcpy(v, val, len);
    if (!e) {
        if (s->nkv == s->capkv) {
            size_t c = s->capkv ? s->capkv * 2 : 64;
            kv_t *q = realloc(s->kv, c * sizeof *q);
            if (!q) { free(v); return NULL; }
            s->kv = q;
            s->capkv = c;
        }
        e = &s->kv[s->nkv++];
        e->key = strndup(key, klen);
        e->val = NULL;
    } else {
        free(e->val);
    }
    e->val = v;
    e->len = len;
    return e;
}

/* Sends a whole frame; a peer that does not read for 2 s is dropped. */
int ct_sock_send_all(int fd, const void *d, size_t n) {
    const uint8_t *p = d;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) { p += w; n -= (size_t)w; continue; }
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            struct pollfd pf = {fd, POLLOUT, 0};
            if (poll(&pf, 1, 2000) <= 0) return -1;
            continue;
        }
        return -1;
    }
    return 0;
}

static int reply(client_t *c, ct_status st, const buf_t *payload) {
    uint32_t len = 1 + (uint32_t)(payload ? payload->n : 0);
    uint8_t hdr[5];
    memcpy(hdr, &len, 4);
    hdr[4] = (uint8_t)st;
    if (ct_sock_send_all(c->fd, hdr, 5)) return -1;
    if (payload && payload->n && ct_sock_send_all(c->fd, payload->p, payload->n)) return -1;
    return 0;
}

static int reply_value(client_t *c, const kv_t *e) {
    buf_t b = {0};
    int r = buf_str(&b, e->val, e->len) ? -1 : reply(c, CT_OK, &b);
    free(b.p);
    return r;
}

static void client_close(client_t *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    free(c->in.p);
    c->in = (buf_t){0};
    free(c->wait_key);
    c->wait_key = NULL;
}

/* A key changed: answer every client waiting for it. */
static void wake_waiters(ct_store_server *s, const kv_t *e) {
    for (size_t i = 0; i < s->ncl; i++) {
        client_t *c = &s->cl[i];
        if (c->fd >= 0 && c->wait_key && !strcmp(c->wait_key, e->key)) {
            free(c->wait_key);
            c->wait_key = NULL;
            if (reply_value(c, e)) client_close(c);
        }
    }
}

/* Handles one request body; returns -1 to drop the connection. */
static int handle(ct_store_server *s, client_t *c, const uint8_t *body, size_t n) {
    rd_t r = {body, n, 1, 0};
    if (n < 1) return -1;
    int cmd = body[0];
    size_t klen = 0, vlen = 0, elen = 0;
    if (!c->authed) {
        if (cmd != CMD_HELLO) return -1;
        const uint8_t *tok = rd_str(&r, &klen, 255);
        if (r.bad || klen != strlen(s->token) || memcmp(tok, s->token, klen)) {
            CT_LOG_INFO("store", "rejected a client with a wrong token");
            reply(c, CT_ERR_PEER, NULL);
            return -1;
        }
        c->authed = 1;
        return reply(c, CT_OK, NULL);
    }
    if (c->wait_key) return -1; /* one request at a time */
    const char *key = NULL;
    if (cmd != CMD_NKEYS) {
        key = (const char *)rd_str(&r, &klen, CT_STORE_MAX_KEY);
        if (r.bad) return -1;
    }
    switch (cmd) {
    case CMD_SET: {
        const uint8_t *v = rd_str(&r, &vlen, CT_STORE_MAX_VALUE);
        if (r.bad) return -1;
        kv_t *e = kv_set(s, key, klen, v, vlen);
        if (!e) return reply(c, CT_ERR_NOMEM, NULL);
        if (reply(c, CT_OK, NULL)) return -1;
        wake_waiters(s, e);
        return 0;
    }
    case CMD_GET: {
        uint32_t ms = rd_u32(&r);
        if (r.bad) return -1;
        kv_t *e = kv_find(s, key, klen);
        if (e) return reply_value(c, e);
        c->wait_key = strndup(key, klen);
        c->wait_deadline = ct_time_now() + ms / 1000.0;
        return 0;
    }
    case CMD_CHECK: {
        buf_t b = {0};
        uint8_t ex = kv_find(s, key, klen) != NULL;
        buf_put(&b, &ex, 1);
        int rr = reply(c, CT_OK, &b);
        free(b.p);
        return rr;
    }
    case CMD_ADD: {
        int64_t d = rd_i64(&r);
        if (r.bad) return -1;
        kv_t *e = kv_find(s, key, klen);
        int64_t v = 0;
        if (e) {
            char tmp[32], *end = NULL;
            size_t m = e->len < sizeof tmp - 1 ? e->len : sizeof tmp - 1;
            memcpy(tmp, e->val, m);
            tmp[m] = 0;
            errno = 0;
            long long x = strtoll(tmp, &end, 10);
            /* a counter that is not a number, or out of range, stays as it is */
            if (end == tmp || *end || errno || m != e->len) return reply(c, CT_ERR_INVALID, NULL);
            v = x;
        }
        /* int64 overflow is an error for the caller, never wrap-around (undefined in C) */
        if (__builtin_add_overflow(v, d, &v)) return reply(c, CT_ERR_INVALID, NULL);
        char num[32];
        int m = snprintf(num, sizeof num, "%lld", (long long)v);
        e = kv_set(s, key, klen, num, (size_t)m);
        if (!e) return reply(c, CT_ERR_NOMEM, NULL);
        buf_t b = {0};
        buf_put(&b, &v, 8);
        int rr = reply(c, CT_OK, &b);
        free(b.p);
        if (!rr) wake_waiters(s, e);
        return rr;
    }
    case CMD_CAS: {
        uint32_t has_exp = rd_u32(&r);
        const uint8_t *ex = rd_str(&r, &elen, CT_STORE_MAX_VALUE);
        const uint8_t *de = rd_str(&r, &vlen, CT_STORE_MAX_VALUE);
        if (r.bad) return -1;
        kv_t *e = kv_find(s, key, klen);
        int match = has_exp ? (e && e->len == elen && !memcmp(e->val, ex, elen)) : !e;
        if (match) {
            e = kv_set(s, key, klen, de, vlen);
            if (!e) return reply(c, CT_ERR_NOMEM, NULL);
            if (reply_value(c, e)) return -1;
            wake_waiters(s, e);
            return 0;
        }
        if (!e) return reply(c, CT_ERR_NOT_FOUND, NULL);
        return reply_value(c, e);
    }
    case CMD_DEL: {
        kv_t *e = kv_find(s, key, klen);
        uint8_t ex = e != NULL;
        if (e) {
            free(e->key);
            free(e->val);
            *e = s->kv[--s->nkv];
        }
        buf_t b = {0};
        buf_put(&b, &ex, 1);
        int rr = reply(c, CT_OK, &b);
        free(b.p);
        return rr;
    }
    case CMD_NKEYS: {
        int64_t v = (int64_t)s->nkv;
        buf_t b = {0};
        buf_put(&b, &v, 8);
        int rr = reply(c, CT_OK, &b);
        free(b.p);
        return rr;
    }
    default: return -1;
    }
}

/* Reads what is available and handles complete frames. */
static void client_read(ct_store_server *s, client_t *c) {
    uint8_t tmp[65536];
    ssize_t r = recv(c->fd, tmp, sizeof tmp, 0);
    if (r <= 0) {
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
        client_close(c);
        return;
    }
    if (buf_put(&c->in, tmp, (size_t)r)) { client_close(c); return; }
    size_t off = 0;
    while (c->fd >= 0 && c->in.n - off >= 4) {
        uint32_t len;
        memcpy(&len, c->in.p + off, 4);
        if (len > MAX_FRAME || (!c->authed && len > 512)) {
            CT_LOG_INFO("store", "dropping a client that sent a %u-byte frame", len);
            client_close(c);
            return;
        }
        if (c->in.n - off - 4 < len) break;
        if (handle(s, c, c->in.p + off + 4, len)) { client_close(c); return; }
        off += 4 + len;
    }
    if (c->fd >= 0 && off) {
        memmove(c->in.p, c->in.p + off, c->in.n - off);
        c->in.n -= off;
    }
}

static size_t count_unauth(const ct_store_server *s, const uint32_t *peer) {
    size_t n = 0;
    for (size_t i = 0; i < s->ncl; i++)
        n += s->cl[i].fd >= 0 && !s->cl[i].authed && (!peer || s->cl[i].peer == *peer);
    return n;
}

/* Closes the oldest unauthenticated connection (from `peer` when not NULL); 0 if none. */
static int evict_oldest_unauth(ct_store_server *s, const uint32_t *peer) {
    client_t *old = NULL;
    for (size_t i = 0; i < s->ncl; i++) {
        client_t *c = &s->cl[i];
        if (c->fd >= 0 && !c->authed && (!peer || c->peer == *peer) && (!old || c->t_conn < old->t_conn)) old = c;
    }
    if (!old) return 0;
    client_close(old);
    return 1;
}

/* Accepts what the backlog holds (bounded per round so that clients are served too).
 * Returns the time until which the listening socket must not be polled (0: no pause). */
static double accept_clients(ct_store_server *s, double now) {
    for (int k = 0; k < 64; k++) {
        struct sockaddr_in sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(s->lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* out of descriptors: free one held by a stranger, else wait (no busy loop) */
                if (evict_oldest_unauth(s, NULL)) continue;
                CT_LOG_INFO("store", "out of descriptors (%s): accepting again in %.0f ms", strerror(errno),
                            ACCEPT_PAUSE_S * 1000);
                return now + ACCEPT_PAUSE_S;
            }
            return 0; /* EAGAIN: backlog empty */
        }
        uint32_t peer = sl >= sizeof sa && sa.sin_family == AF_INET ? sa.sin_addr.s_addr : 0;
        if (count_unauth(s, &peer) >= MAX_UNAUTH_PER_ADDR) {
            /* a burst of real ranks looks the same: read what they sent before evicting anyone,
             * those whose HELLO is already there leave the unauthenticated count */
            for (size_t i = 0; i < s->ncl; i++)
                if (s->cl[i].fd >= 0 && !s->cl[i].authed && s->cl[i].peer == peer) client_read(s, &s->cl[i]);
            if (count_unauth(s, &peer) >= MAX_UNAUTH_PER_ADDR) evict_oldest_unauth(s, &peer);
        } else if (count_unauth(s, NULL) >= MAX_UNAUTH) evict_oldest_unauth(s, NULL);
        size_t live = 0;
        for (size_t i = 0; i < s->ncl; i++) live += s->cl[i].fd >= 0;
        if (live >= MAX_CLIENTS) { close(fd); continue; } /* only authenticated clients left */
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        client_t *q = realloc(s->cl, (s->ncl + 1) * sizeof *q);
        if (!q) { close(fd); continue; }
        s->cl = q;
        s->cl[s->ncl++] = (client_t){.fd = fd, .peer = peer, .t_conn = now};
    }
    return 0;
}

static void *server_main(void *arg) {
    ct_store_server *s = arg;
    struct pollfd *pf = NULL;
    size_t cap = 0;
    double accept_pause_until = 0;
    for (;;) {
        /* compact closed clients */
        size_t j = 0;
        for (size_t i = 0; i < s->ncl; i++)
            if (s->cl[i].fd >= 0) s->cl[j++] = s->cl[i];
        s->ncl = j;
        if (cap < s->ncl + 2) {
            cap = s->ncl + 64;
            struct pollfd *q = realloc(pf, cap * sizeof *pf);
            if (!q) break;
            pf = q;
        }
        double now = ct_time_now(), next = now + 3600;
        int accepting = now >= accept_pause_until;
        if (!accepting) next = accept_pause_until;
        pf[0] = (struct pollfd){s->wake[0], POLLIN, 0};
        pf[1] = (struct pollfd){s->lfd, accepting ? POLLIN : 0, 0};
        for (size_t i = 0; i < s->ncl; i++) {
            client_t *c = &s->cl[i];
            pf[2 + i] = (struct pollfd){c->fd, POLLIN, 0};
            if (c->wait_key && c->wait_deadline < next) next = c->wait_deadline;
            if (!c->authed && c->t_conn + AUTH_DEADLINE_S < next) next = c->t_conn + AUTH_DEADLINE_S;
        }
        int ms = (int)((next - now) * 1000) + 1;
        if (ms < 0) ms = 0;
        int n = poll(pf, 2 + s->ncl, ms);
        if (n < 0 && errno != EINTR) break;
        if (pf[0].revents) break;
        size_t npolled = s->ncl; /* clients accepted below have no pollfd yet */
        for (size_t i = 0; i < npolled; i++) {
            client_t *c = &s->cl[i];
            if (c->fd >= 0 && pf[2 + i].fd == c->fd && (pf[2 + i].revents & (POLLIN | POLLHUP | POLLERR)))
                client_read(s, c);
        }
        if (pf[1].revents & POLLIN) accept_pause_until = accept_clients(s, ct_time_now());
        now = ct_time_now();
        for (size_t i = 0; i < s->ncl; i++) {
            client_t *c = &s->cl[i];
            if (c->fd >= 0 && !c->authed && c->t_conn + AUTH_DEADLINE_S <= now) {
                CT_LOG_INFO("store", "dropping a client that did not authenticate within %.0f s", AUTH_DEADLINE_S);
                client_close(c);
                continue;
            }
            if (c->fd >= 0 && c->wait_key && c->wait_deadline <= now) {
                free(c->wait_key);
                c->wait_key = NULL;
                if (reply(c, CT_ERR_TIMEOUT, NULL)) client_close(c);
            }
        }
    }
    free(pf);
    return NULL;
}

/* Listening without a thread lets a caller fork before any thread exists: until
 * ct_store_server_run, clients' connections wait in the listen backlog. */
ct_status ct_store_server_listen(const char *bind_addr, int port, const char *token, ct_store_server **out) {
    *out = NULL;
    if (token && strlen(token) > 255) return ct_error(CT_ERR_INVALID, "store token longer than 255 bytes");
    ct_store_server *s = calloc(1, sizeof *s);
    if (!s) return ct_error(CT_ERR_NOMEM, "store server");
    snprintf(s->token, sizeof s->token, "%s", token ? token : "");
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    const char *ba = bind_addr ? bind_addr : "127.0.0.1";
    if (inet_pton(AF_INET, ba, &sa.sin_addr) != 1) {
        struct addrinfo hints = {.ai_family = AF_INET}, *ai = NULL;
        if (getaddrinfo(ba, NULL, &hints, &ai) || !ai) {
            free(s);
            return ct_error(CT_ERR_INVALID, "store: cannot resolve bind address '%s'", ba);
        }
        sa.sin_addr = ((struct sockaddr_in *)ai->ai_addr)->sin_addr;
        freeaddrinfo(ai);
    }
    /* non-blocking: the server drains the backlog until EAGAIN */
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&sa, sizeof sa) || listen(s->lfd, 512)) {
        int e = errno;
        if (s->lfd >= 0) close(s->lfd);
        free(s);
        if (e == EADDRINUSE) return ct_error(CT_ERR_SYSTEM, "port %d on %s is already in use", port, ba);
        return ct_error(CT_ERR_SYSTEM, "store: cannot listen on %s:%d: %s", ba, port, strerror(e));
    }
    socklen_t sl = sizeof sa;
    getsockname(s->lfd, (struct sockaddr *)&sa, &sl);
    s->port = ntohs(sa.sin_port);
    /* non-blocking: ct_store_server_run drains stale wake-ups left by a pause */
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK)) {
        close(s->lfd);
        free(s);
        return ct_error(CT_ERR_SYSTEM, "pipe: %s", strerror(errno));
    }
    CT_LOG_INFO("store", "listening on %s:%d", ba, s->port);
    *out = s;
    return CT_OK;
}

ct_status ct_store_server_run(ct_store_server *s) {
    if (!s) return ct_error(CT_ERR_INVALID, "ct_store_server_run: server is NULL");
    if (s->running) return CT_OK;
    char junk[64];
    while (read(s->wake[0], junk, sizeof junk) > 0) {}
    if (pthread_create(&s->th, NULL, server_main, s)) return ct_error(CT_ERR_SYSTEM, "store: cannot start thread");
    s->running = 1;
    return CT_OK;
}

void ct_store_server_pause(ct_store_server *s) {
    if (!s || !s->running) return;
    ssize_t w = write(s->wake[1], "x", 1);
    (void)w;
    pthread_join(s->th, NULL);
    s->running = 0;
}

ct_status ct_store_server_start(const char *bind_addr, int port, const char *token, ct_store_server **out) {
    ct_status st = ct_store_server_listen(bind_addr, port, token, out);
    if (st) return st;
    st = ct_store_server_run(*out);
    if (st) {
        ct_store_server_stop(*out);
        *out = NULL;
    }
    return st;
}

int ct_store_server_port(const ct_store_server *s) { return s ? s->port : 0; }

void ct_store_server_stop(ct_store_server *s) {
    if (!s) return;
    ct_store_server_pause(s);
    for (size_t i = 0; i < s->ncl; i++) client_close(&s->cl[i]);
    for (size_t i = 0; i < s->nkv; i++) {
        free(s->kv[i].key);
        free(s->kv[i].val);
    }
    free(s->kv);
    free(s->cl);
    close(s->lfd);
    close(s->wake[0]);
    close(s->wake[1]);
    free(s);
}

/* ------------------------------------------------------------------ client */
struct ct_store {
    ct_c10d *c10d; /* PyTorch's store: every call goes to store_c10d.c */
    int fd;
    pthread_mutex_t mu;
    char addr[256];
    int port;
};

int ct_sock_recv_all(int fd, void *d, size_t n, double deadline) {
    uint8_t *p = d;
    while (n) {
        double left = (deadline - ct_time_now()) * 1000; /* deadline may be +inf */
        if (!(left >= 1)) return -2;
        int ms = left > 1e9 ? 1000000000 : (int)left;
        struct pollfd pf = {fd, POLLIN, 0};
        int r = poll(&pf, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r == 0 ? -2 : -1;
        ssize_t g = recv(fd, p, n, 0);
        if (g <= 0) {
            if (g < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            return -1;
        }
        p += g;
        n -= (size_t)g;
    }
    return 0;
}

/* Sends a request and reads the response body (status byte stripped into *st). */
static ct_status rpc(ct_store *c, const buf_t *req, double timeout_s, ct_status *st, buf_t *resp) {
    uint32_t len = (uint32_t)req->n;
    double deadline = ct_time_now() + timeout_s;
    if (ct_sock_send_all(c->fd, &len, 4) || ct_sock_send_all(c->fd, req->p, req->n))
        return ct_error(CT_ERR_PEER, "store %s:%d: connection lost (send)", c->addr, c->port);
    uint8_t hdr[5];
    int r = ct_sock_recv_all(c->fd, hdr, 5, deadline);
    if (r == -2) return ct_error(CT_ERR_TIMEOUT, "store %s:%d: no reply within %.0f s", c->addr, c->port, timeout_s);
    if (r) return ct_error(CT_ERR_PEER, "store %s:%d: connection closed by the server", c->addr, c->port);
    memcpy(&len, hdr, 4);
    if (len < 1 || len > MAX_FRAME) return ct_error(CT_ERR_FORMAT, "store: malformed reply");
    *st = (ct_status)hdr[4];
    resp->n = 0;
    if (len > 1) {
        uint8_t *p = malloc(len - 1);
        if (!p) return ct_error(CT_ERR_NOMEM, "store reply");
        if (ct_sock_recv_all(c->fd, p, len - 1, deadline)) {
            free(p);
            return ct_error(CT_ERR_PEER, "store: connection lost (reply)");
        }
        free(resp->p);
        resp->p = p;
        resp->n = resp->cap = len - 1;
    }
    return CT_OK;
}

int ct_sock_connect(const char *addr, int port) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(addr, ps, &hints, &ai) || !ai) return -2;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
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
        ct_store *c = calloc(1, sizeof *c);
        if (!c) { close(fd); return ct_error(CT_ERR_NOMEM, "store client"); }
        c->fd = fd;
        c->port = port;
        snprintf(c->addr, sizeof c->addr, "%s", addr);
        pthread_mutex_init(&c->mu, NULL);
        buf_t req = {0}, resp = {0};
        uint8_t cmd = CMD_HELLO;
        buf_put(&req, &cmd, 1);
        buf_str(&req, token ? token : "", token ? strlen(token) : 0);
        double left = deadline - ct_time_now();
        ct_status st = CT_OK, rs = rpc(c, &req, left > 5 ? left : 5, &st, &resp);
        free(req.p);
        free(resp.p);
        if (rs == CT_OK && st == CT_OK) {
            *out = c;
            return CT_OK;
        }
        ct_store_free(c);
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

ct_status ct_store_connect_c10d(const char *addr, int port, double timeout_s, ct_store **out) {
    *out = NULL;
    ct_store *c = calloc(1, sizeof *c);
    if (!c) return ct_error(CT_ERR_NOMEM, "store client");
    ct_status st = ct_c10d_connect(addr, port, timeout_s, &c->c10d);
    if (st) { free(c); return st; }
    c->fd = -1;
    c->port = port;
    snprintf(c->addr, sizeof c->addr, "%s", addr ? addr : "127.0.0.1");
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return CT_OK;
}

const char *ct_store_protocol(const ct_store *c) {
    if (!c) return NULL;
    return !c->c10d ? "ctrain" : ct_c10d_version(c->c10d) == 2 ? "c10d-v2" : "c10d-v1";
}

void ct_store_free(ct_store *c) {
    if (!c) return;
    ct_c10d_free(c->c10d);
    if (c->fd >= 0) close(c->fd);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static ct_status check_key(const char *key) {
    if (!key || strlen(key) > CT_STORE_MAX_KEY) return ct_error(CT_ERR_INVALID, "store key too long or NULL");
    return CT_OK;
}

/* Runs one request under the client lock; copies the reply's status into a ct_error. */
static ct_status call(ct_store *c, buf_t *req, double timeout_s, buf_t *resp, const char *what, const char *key) {
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

static void req_start(buf_t *b, int cmd, const char *key) {
    uint8_t cb = (uint8_t)cmd;
    buf_put(b, &cb, 1);
    if (key) buf_str(b, key, strlen(key));
}

ct_status ct_store_set(ct_store *c, const char *key, const void *val, size_t len) {
    if (check_key(key)) return CT_ERR_INVALID;
    if (len > CT_STORE_MAX_VALUE) return ct_error(CT_ERR_INVALID, "store value of %zu bytes is over the limit", len);
    if (c->c10d) return ct_c10d_set(c->c10d, key, val, len);
    buf_t req = {0}, resp = {0};
    req_start(&req, CMD_SET, key);
    buf_str(&req, val, len);
    ct_status st = call(c, &req, 60, &resp, "set", key);
    free(resp.p);
    return st;
}

ct_status ct_store_get(ct_store *c, const char *key, double timeout_s, void **val, size_t *len) {
    *val = NULL;
    if (len) *len = 0;
    if (check_key(key)) return CT_ERR_INVALID;
    if (c->c10d) return ct_c10d_get(c->c10d, key, timeout_s, val, len);
    buf_t req = {0}, resp = {0};
    req_start(&req, CMD_GET, key);
    /* a double outside [0, 2^32) cast to uint32_t is undefined: NaN and negative mean "now",
     * inf and huge values the longest wait the protocol carries (46 days) */
    double ms = timeout_s * 1000;
    buf_u32(&req, !(ms > 0) ? 0u : ms > 4e9 ? 4000000000u : (uint32_t)ms);
    if (!(timeout_s >= 0)) timeout_s = 0;
    ct_status st = call(c, &req, timeout_s + 10, &resp, "get", key);
    if (st != CT_OK) { free(resp.p); return st; }
    rd_t r = {resp.p, resp.n, 0, 0};
    size_t n = 0;
    const uint8_t *v = rd_str(&r, &n, CT_STORE_MAX_VALUE);
    if (r.bad) { free(resp.p); return ct_error(CT_ERR_FORMAT, "store: malformed value"); }
    uint8_t *o = malloc(n + 1);
    if (!o) { free(resp.p); return ct_error(CT_ERR_NOMEM, "store value"); }
    memcpy(o, v, n);
    o[n] = 0; /* handy for strings */
    free(resp.p);
    *val = o;
    if (len) *len = n;
    return CT_OK;
}

ct_status ct_store_wait(ct_store *c, const char *const *keys, int nkeys, double timeout_s) {
    double deadline = ct_time_now() + timeout_s;
    for (int i = 0; i < nkeys; i++) {
        void *v;
        double left = deadline - ct_time_now();
        ct_status st = ct_store_get(c, keys[i], left > 0 ? left : 0, &v, NULL);
        if (st) return st;
        free(v);
    }
    return CT_OK;
}

ct_status ct_store_add(ct_store *c, const char *key, int64_t delta, int64_t *out) {
    if (check_key(key)) return CT_ERR_INVALID;
    if (c->c10d) return ct_c10d_add(c->c10d, key, delta, out);
    buf_t req = {0}, resp = {0};
    req_start(&req, CMD_ADD, key);
    buf_put(&req, &delta, 8);
    ct_status st = call(c, &req, 60, &resp, "add", key);
    if (st == CT_OK) {
        rd_t r = {resp.p, resp.n, 0, 0};
        int64_t v = rd_i64(&r);
        if (r.bad) st = ct_error(CT_ERR_FORMAT, "store: malformed add reply");
        else if (out) *out = v;
    }
    free(resp.p);
    return st;
}

ct_status ct_store_compare_set(ct_store *c, const char *key, const void *expected, size_t elen, const void *desired,
                               size_t dlen, void **cur, size_t *curlen) {
    if (cur) *cur = NULL;
    if (check_key(key)) return CT_ERR_INVALID;
    if (elen > CT_STORE_MAX_VALUE || dlen > CT_STORE_MAX_VALUE) return ct_error(CT_ERR_INVALID, "store value too large");
    if (c->c10d) return ct_c10d_compare_set(c->c10d, key, expected, elen, desired, dlen, cur, curlen);
    buf_t req = {0}, resp = {0};
    req_start(&req, CMD_CAS, key);
    buf_u32(&req, expected != NULL);
    buf_str(&req, expected ? expected : "", expected ? elen : 0);
    buf_str(&req, desired, dlen);
    ct_status st = call(c, &req, 60, &resp, "compare_set", key);
    if (st == CT_OK && cur) {
        rd_t r = {resp.p, resp.n, 0, 0};
        size_t n = 0;
        const uint8_t *v = rd_str(&r, &n, CT_STORE_MAX_VALUE);
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

static ct_status flag_call(ct_store *c, int cmd, const char *key, bool *flag) {
    if (check_key(key)) return CT_ERR_INVALID;
    buf_t req = {0}, resp = {0};
    req_start(&req, cmd, key);
    ct_status st = call(c, &req, 60, &resp, cmd == CMD_DEL ? "delete" : "check", key);
    if (st == CT_OK && flag) *flag = resp.n >= 1 && resp.p[0];
    free(resp.p);
    return st;
}
ct_status ct_store_delete(ct_store *c, const char *key, bool *existed) {
    if (c->c10d && !check_key(key)) return ct_c10d_delete(c->c10d, key, existed);
    return flag_call(c, CMD_DEL, key, existed);
}
ct_status ct_store_check(ct_store *c, const char *key, bool *exists) {
    if (c->c10d && !check_key(key)) return ct_c10d_check(c->c10d, key, exists);
    return flag_call(c, CMD_CHECK, key, exists);
}

ct_status ct_store_num_keys(ct_store *c, int64_t *out) {
    if (c->c10d) return ct_c10d_num_keys(c->c10d, out);
    buf_t req = {0}, resp = {0};
    req_start(&req, CMD_NKEYS, NULL);
    ct_status st = call(c, &req, 60, &resp, "num_keys", "");
    if (st == CT_OK) {
        rd_t r = {resp.p, resp.n, 0, 0};
        int64_t v = rd_i64(&r);
        if (r.bad) st = ct_error(CT_ERR_FORMAT, "store: malformed reply");
        else *out = v;
    }
    free(resp.p);
    return st;
}
