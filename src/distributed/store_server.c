/* The store's server: one thread with a poll() loop over the listening socket and every
 * connection, holding the key table. The wire format is in store_internal.h.
 *
 * Each connection starts with the server's challenge (a fresh nonce) and its first request
 * must be HELLO with HMAC-SHA256(token, nonce || context) (store_internal.h): the token never
 * crosses the wire, and a HELLO recorded on one connection fails on any other. Anything else,
 * a frame over the limit or a malformed body closes that connection only.
 *
 * Before HELLO a connection costs the server a descriptor and a slot but proves nothing, so
 * strangers must not be able to hold either: an unauthenticated connection lives at most
 * AUTH_DEADLINE_S, at most MAX_UNAUTH_PER_ADDR of them per peer address and MAX_UNAUTH in
 * all (a new one evicts the oldest), and at the descriptor limit the server evicts one and
 * stops accepting for a moment instead of spinning on a listening socket that stays
 * readable. Legitimate clients send HELLO right after connecting, and ct_store_connect
 * reconnects when it was evicted before its HELLO was read. */
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

#include "ctrain/dist.h"
#include "store_internal.h"

#define MAX_CLIENTS 4096
#define MAX_UNAUTH 256
#define MAX_UNAUTH_PER_ADDR 32
#define AUTH_DEADLINE_S 1.0
#define ACCEPT_PAUSE_S 0.1 /* after EMFILE with nobody to evict */

/* ------------------------------------------------------------------ state */
typedef struct { char *key; uint8_t *val; size_t len; } kv_t;
typedef struct {
    int fd;
    int authed;
    uint32_t peer;   /* IPv4 address, network order */
    double t_conn;   /* accept time: unauthenticated connections expire AUTH_DEADLINE_S after it */
    uint8_t mac[CT_SHA256_LEN]; /* the HELLO that answers this connection's challenge */
    ct_sbuf in;
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

/* ------------------------------------------------------------------ the key table */
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

/* ------------------------------------------------------------------ requests */
static int reply(client_t *c, ct_status st, const ct_sbuf *payload) {
    uint32_t len = 1 + (uint32_t)(payload ? payload->n : 0);
    uint8_t hdr[5];
    memcpy(hdr, &len, 4);
    hdr[4] = (uint8_t)st;
    if (ct_sock_send_all(c->fd, hdr, 5)) return -1;
    if (payload && payload->n && ct_sock_send_all(c->fd, payload->p, payload->n)) return -1;
    return 0;
}

static int reply_value(client_t *c, const kv_t *e) {
    ct_sbuf b = {0};
    int r = ct_sbuf_str(&b, e->val, e->len) ? -1 : reply(c, CT_OK, &b);
    free(b.p);
    return r;
}

/* An OK reply whose fields are the n bytes at d (a flag or an i64). */
static int reply_bytes(client_t *c, const void *d, size_t n) {
    ct_sbuf b = {0};
    ct_sbuf_put(&b, d, n);
    int r = reply(c, CT_OK, &b);
    free(b.p);
    return r;
}

static void client_close(client_t *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    free(c->in.p);
    c->in = (ct_sbuf){0};
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
    ct_srd r = {body, n, 1, 0};
    if (n < 1) return -1;
    int cmd = body[0];
    size_t klen = 0, vlen = 0, elen = 0;
    if (!c->authed) {
        if (cmd != CT_STORE_CMD_HELLO) return -1;
        const uint8_t *mac = ct_srd_str(&r, &klen, 255);
        /* constant time: how much of a guess matched must not show in the reply's timing */
        if (r.bad || klen != CT_SHA256_LEN || !ct_mem_equal_ct(mac, c->mac, CT_SHA256_LEN)) {
            CT_LOG_INFO("store", "rejected a client that did not answer its challenge (wrong token, or a replay)");
            reply(c, CT_ERR_PEER, NULL);
            return -1;
        }
        c->authed = 1;
        return reply(c, CT_OK, NULL);
    }
    if (c->wait_key) return -1; /* one request at a time */
    const char *key = NULL;
    if (cmd != CT_STORE_CMD_NKEYS) {
        key = (const char *)ct_srd_str(&r, &klen, CT_STORE_MAX_KEY);
        if (r.bad) return -1;
    }
    switch (cmd) {
    case CT_STORE_CMD_SET: {
        const uint8_t *v = ct_srd_str(&r, &vlen, CT_STORE_MAX_VALUE);
        if (r.bad) return -1;
        kv_t *e = kv_set(s, key, klen, v, vlen);
        if (!e) return reply(c, CT_ERR_NOMEM, NULL);
        if (reply(c, CT_OK, NULL)) return -1;
        wake_waiters(s, e);
        return 0;
    }
    case CT_STORE_CMD_GET: {
        uint32_t ms = ct_srd_u32(&r);
        if (r.bad) return -1;
        kv_t *e = kv_find(s, key, klen);
        if (e) return reply_value(c, e);
        c->wait_key = strndup(key, klen);
        c->wait_deadline = ct_time_now() + ms / 1000.0;
        return 0;
    }
    case CT_STORE_CMD_CHECK: {
        uint8_t ex = kv_find(s, key, klen) != NULL;
        return reply_bytes(c, &ex, 1);
    }
    case CT_STORE_CMD_ADD: {
        int64_t d = ct_srd_i64(&r);
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
        int rr = reply_bytes(c, &v, 8);
        if (!rr) wake_waiters(s, e);
        return rr;
    }
    case CT_STORE_CMD_CAS: {
        uint32_t has_exp = ct_srd_u32(&r);
        const uint8_t *ex = ct_srd_str(&r, &elen, CT_STORE_MAX_VALUE);
        const uint8_t *de = ct_srd_str(&r, &vlen, CT_STORE_MAX_VALUE);
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
    case CT_STORE_CMD_DEL: {
        kv_t *e = kv_find(s, key, klen);
        uint8_t ex = e != NULL;
        if (e) {
            free(e->key);
            free(e->val);
            *e = s->kv[--s->nkv];
        }
        return reply_bytes(c, &ex, 1);
    }
    case CT_STORE_CMD_NKEYS: {
        int64_t v = (int64_t)s->nkv;
        return reply_bytes(c, &v, 8);
    }
    default: return -1;
    }
}

/* ------------------------------------------------------------------ connections */
/* Reads what is available and handles complete frames. */
static void client_read(ct_store_server *s, client_t *c) {
    uint8_t tmp[65536];
    ssize_t r = recv(c->fd, tmp, sizeof tmp, 0);
    if (r <= 0) {
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
        client_close(c);
        return;
    }
    if (ct_sbuf_put(&c->in, tmp, (size_t)r)) { client_close(c); return; }
    size_t off = 0;
    while (c->fd >= 0 && c->in.n - off >= 4) {
        uint32_t len;
        memcpy(&len, c->in.p + off, 4);
        if (len > CT_STORE_MAX_FRAME || (!c->authed && len > 512)) {
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

/* Sends a new connection its nonce and keeps the MAC that answers it; -1 to drop it. */
static int challenge(const ct_store_server *s, client_t *c) {
    uint8_t nonce[CT_STORE_NONCE_LEN];
    if (ct_random_bytes(nonce, sizeof nonce)) {
        /* a guessable nonce would make recorded HELLOs replayable: serve nobody instead */
        CT_LOG_WARN_("store", "no random source for a challenge (getrandom, /dev/urandom): connection refused");
        return -1;
    }
    ct_store_auth_mac(s->token, nonce, c->mac);
    ct_sbuf b = {0};
    int r = ct_sbuf_put(&b, nonce, sizeof nonce) ? -1 : reply(c, CT_OK, &b);
    free(b.p);
    return r;
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
        s->cl[s->ncl] = (client_t){.fd = fd, .peer = peer, .t_conn = now};
        if (challenge(s, &s->cl[s->ncl])) { close(fd); continue; }
        s->ncl++;
    }
    return 0;
}

/* ------------------------------------------------------------------ the thread */
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

/* ------------------------------------------------------------------ public calls */
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
