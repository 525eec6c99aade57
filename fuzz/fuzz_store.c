/* The store server's request parser, over a real loopback connection to a server thread (the
 * parser is internal to src/distributed/store_server.c, and the framing, the HELLO check and
 * the per-connection buffering are part of what a stranger on the port can reach).
 * First byte: bit 0 set, the harness first answers the server's challenge with a correct
 * HELLO (so the commands behind authentication are reached); bit 1 set, the rest is split at "\n====\n" into request
 * bodies that the harness frames with their lengths; clear, the rest is the raw byte stream.
 * A fresh server per input keeps every input reproducible on its own. The connection is
 * then half-closed and read to its end: the server must answer and close, never hang. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "fuzz.h"
#include "distributed/store_internal.h" /* the challenge's MAC */

#define TOKEN "fuzz-token"

static void send_all(int fd, const void *d, size_t n) {
    const uint8_t *p = d;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return; /* the server may drop us at any point: that is allowed */
        p += w;
        n -= (size_t)w;
    }
}

static void send_frame(int fd, const uint8_t *body, size_t n) {
    uint32_t len = (uint32_t)n;
    send_all(fd, &len, 4);
    send_all(fd, body, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    int mode = data[0];
    data++, n--;
    ct_store_server *s;
    if (ct_store_server_start(NULL, 0, TOKEN, &s) != CT_OK) abort();
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ct_store_server_port(s))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) abort();
    if (mode & 1) { /* the challenge: u32 33, status 0, the nonce */
        uint8_t ch[4 + 1 + CT_STORE_NONCE_LEN], hello[1 + 4 + CT_SHA256_LEN] = {CT_STORE_CMD_HELLO, CT_SHA256_LEN};
        size_t got = 0;
        while (got < sizeof ch) {
            struct pollfd pf = {fd, POLLIN, 0};
            ssize_t r = poll(&pf, 1, 10000) == 1 ? recv(fd, ch + got, sizeof ch - got, 0) : -1;
            if (r <= 0) { fprintf(stderr, "store server sent no challenge\n"); abort(); }
            got += (size_t)r;
        }
        ct_store_auth_mac(TOKEN, ch + 5, hello + 5);
        send_frame(fd, hello, sizeof hello);
    }
    if (mode & 2) {
        const uint8_t *part[64];
        size_t len[64];
        int k = fz_split(data, n, part, len, 64);
        for (int i = 0; i < k; i++) send_frame(fd, part[i], len[i]);
    } else {
        send_all(fd, data, n);
    }
    shutdown(fd, SHUT_WR);
    /* the server has read everything once it closes: it must do so promptly */
    uint8_t buf[65536];
    for (;;) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 10000) != 1) { fprintf(stderr, "store server did not close the connection\n"); abort(); }
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0) break;
    }
    /* reset instead of TIME_WAIT: thousands of inputs a second would exhaust the ports */
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
    ct_store_server_stop(s);
    return 0;
}
