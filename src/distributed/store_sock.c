/* The store's plumbing, shared by the server and both clients: blocking TCP sends and
 * receives with deadlines, connecting to an address, and the byte buffers that frames are
 * built in and read from (reads bounded by the frame's length and each field's limit). */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ctrain/dist.h"
#include "store_internal.h"

/* ------------------------------------------------------------------ sockets */
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

/* ------------------------------------------------------------------ byte buffers */
int ct_sbuf_put(ct_sbuf *b, const void *d, size_t n) {
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
int ct_sbuf_u32(ct_sbuf *b, uint32_t v) { return ct_sbuf_put(b, &v, 4); }
int ct_sbuf_str(ct_sbuf *b, const void *s, size_t n) { return ct_sbuf_u32(b, (uint32_t)n) || ct_sbuf_put(b, s, n); }

uint32_t ct_srd_u32(ct_srd *r) {
    uint32_t v = 0;
    if (r->off + 4 > r->n) { r->bad = 1; return 0; }
    memcpy(&v, r->p + r->off, 4);
    r->off += 4;
    return v;
}
int64_t ct_srd_i64(ct_srd *r) {
    int64_t v = 0;
    if (r->off + 8 > r->n) { r->bad = 1; return 0; }
    memcpy(&v, r->p + r->off, 8);
    r->off += 8;
    return v;
}
const uint8_t *ct_srd_str(ct_srd *r, size_t *len, size_t max) {
    uint32_t n = ct_srd_u32(r);
    if (r->bad || n > max || r->off + n > r->n) { r->bad = 1; return NULL; }
    const uint8_t *s = r->p + r->off;
    r->off += n;
    *len = n;
    return s;
}
