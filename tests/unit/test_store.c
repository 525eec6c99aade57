/* TCP store: operations, waits, token check, and robustness against garbage. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ct_test.h"
#include "ctrain/dist.h"
#include "distributed/store_internal.h" /* the challenge's MAC, for a client by hand */

static ct_store_server *srv;
static ct_store *cli;

static void setup(void) {
    CT_EXPECT_OK(ct_store_server_start(NULL, 0, "secret", &srv));
    CT_EXPECT_OK(ct_store_connect("127.0.0.1", ct_store_server_port(srv), "secret", 5, &cli));
}
static void teardown(void) {
    ct_store_free(cli);
    ct_store_server_stop(srv);
    cli = NULL;
    srv = NULL;
}

CT_TEST(store_basic_ops) {
    setup();
    CT_ASSERT(cli);
    CT_EXPECT_OK(ct_store_set(cli, "a", "hello", 5));
    void *v = NULL;
    size_t n = 0;
    CT_EXPECT_OK(ct_store_get(cli, "a", 1, &v, &n));
    CT_EXPECT_EQ(n, 5);
    CT_EXPECT(v && !memcmp(v, "hello", 5));
    free(v);
    int64_t x = 0;
    CT_EXPECT_OK(ct_store_add(cli, "cnt", 5, &x));
    CT_EXPECT_EQ(x, 5);
    CT_EXPECT_OK(ct_store_add(cli, "cnt", -2, &x));
    CT_EXPECT_EQ(x, 3);
    /* compare-set: mismatch keeps the value, match replaces it */
    void *cur = NULL;
    CT_EXPECT_OK(ct_store_compare_set(cli, "a", "nope", 4, "x", 1, &cur, &n));
    CT_EXPECT(cur && !strcmp(cur, "hello"));
    free(cur);
    CT_EXPECT_OK(ct_store_compare_set(cli, "a", "hello", 5, "world", 5, &cur, &n));
    CT_EXPECT(cur && !strcmp(cur, "world"));
    free(cur);
    CT_EXPECT_OK(ct_store_compare_set(cli, "new", NULL, 0, "v", 1, &cur, &n));
    CT_EXPECT(cur && !strcmp(cur, "v"));
    free(cur);
    int64_t k = 0;
    CT_EXPECT_OK(ct_store_num_keys(cli, &k));
    CT_EXPECT_EQ(k, 3);
    bool ex = false;
    CT_EXPECT_OK(ct_store_delete(cli, "a", &ex));
    CT_EXPECT(ex);
    CT_EXPECT_OK(ct_store_check(cli, "a", &ex));
    CT_EXPECT(!ex);
    CT_EXPECT_OK(ct_store_num_keys(cli, &k));
    CT_EXPECT_EQ(k, 2);
    /* empty value and big value */
    CT_EXPECT_OK(ct_store_set(cli, "empty", "", 0));
    CT_EXPECT_OK(ct_store_get(cli, "empty", 1, &v, &n));
    CT_EXPECT_EQ(n, 0);
    free(v);
    size_t big = 3u << 20;
    char *b = malloc(big);
    for (size_t i = 0; i < big; i++) b[i] = (char)(i * 31);
    CT_EXPECT_OK(ct_store_set(cli, "big", b, big));
    CT_EXPECT_OK(ct_store_get(cli, "big", 1, &v, &n));
    CT_EXPECT_EQ(n, big);
    CT_EXPECT(v && !memcmp(v, b, big));
    free(v);
    free(b);
    teardown();
}

CT_TEST(store_get_times_out) {
    setup();
    void *v = NULL;
    double t0 = ct_time_now();
    CT_EXPECT_EQ(ct_store_get(cli, "missing", 0.2, &v, NULL), CT_ERR_TIMEOUT);
    double t = ct_time_now() - t0;
    CT_EXPECT(t >= 0.15 && t < 2);
    CT_EXPECT(strstr(ct_last_error(), "missing") != NULL);
    /* the connection is still usable */
    CT_EXPECT_OK(ct_store_set(cli, "k", "1", 1));
    teardown();
}

static void *late_setter(void *arg) {
    usleep(100000);
    ct_store *c = NULL;
    if (ct_store_connect("127.0.0.1", *(int *)arg, "secret", 5, &c) == CT_OK) {
        ct_store_set(c, "late", "v", 1);
        ct_store_free(c);
    }
    return NULL;
}

CT_TEST(store_wait_for_key_set_later) {
    setup();
    int port = ct_store_server_port(srv);
    pthread_t th;
    pthread_create(&th, NULL, late_setter, &port);
    const char *keys[] = {"late"};
    CT_EXPECT_OK(ct_store_wait(cli, keys, 1, 5));
    pthread_join(th, NULL);
    teardown();
}

CT_TEST(store_rejects_wrong_token) {
    setup();
    ct_store *bad = NULL;
    CT_EXPECT_EQ(ct_store_connect("127.0.0.1", ct_store_server_port(srv), "guess", 2, &bad), CT_ERR_PEER);
    CT_EXPECT(bad == NULL);
    CT_EXPECT(strstr(ct_last_error(), "rejected") != NULL);
    CT_EXPECT_EQ(ct_store_connect("127.0.0.1", ct_store_server_port(srv), NULL, 2, &bad), CT_ERR_PEER);
    CT_EXPECT_OK(ct_store_set(cli, "still", "ok", 2)); /* the good client is unaffected */
    teardown();
}

static int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) { close(fd); return -1; }
    return fd;
}

/* The server must close a connection after garbage; read() then returns 0. */
static int closed_by_server(int fd) {
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[64];
    ssize_t r;
    while ((r = read(fd, b, sizeof b)) > 0) {}
    return r == 0;
}

CT_TEST(store_survives_garbage) {
    setup();
    int port = ct_store_server_port(srv);
    /* random bytes */
    int fd = raw_connect(port);
    CT_ASSERT(fd >= 0);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n\xff\xfe\x00\x01garbage";
    CT_EXPECT(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
    CT_EXPECT(closed_by_server(fd));
    close(fd);
    /* an oversized frame length */
    fd = raw_connect(port);
    uint32_t huge = 0xfffffff0u;
    CT_EXPECT(write(fd, &huge, 4) == 4);
    CT_EXPECT(closed_by_server(fd));
    close(fd);
    /* a well-formed frame with a command before HELLO */
    fd = raw_connect(port);
    uint8_t frame[] = {5, 0, 0, 0, 2, 1, 0, 0, 0};
    CT_EXPECT(write(fd, frame, sizeof frame) == (ssize_t)sizeof frame);
    CT_EXPECT(closed_by_server(fd));
    close(fd);
    /* a truncated frame, then hang up */
    fd = raw_connect(port);
    uint8_t part[] = {100, 0, 0, 0, 1, 2};
    CT_EXPECT(write(fd, part, sizeof part) == (ssize_t)sizeof part);
    close(fd);
    /* the store keeps serving */
    CT_EXPECT_OK(ct_store_set(cli, "alive", "1", 1));
    ct_store *c2 = NULL;
    CT_EXPECT_OK(ct_store_connect("127.0.0.1", port, "secret", 2, &c2));
    void *v = NULL;
    CT_EXPECT_OK(ct_store_get(c2, "alive", 1, &v, NULL));
    free(v);
    ct_store_free(c2);
    teardown();
}

CT_TEST(store_limits) {
    setup();
    char key[CT_STORE_MAX_KEY + 2];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = 0;
    CT_EXPECT_EQ(ct_store_set(cli, key, "v", 1), CT_ERR_INVALID);
    CT_EXPECT_EQ(ct_store_set(cli, "v", "x", (size_t)CT_STORE_MAX_VALUE + 1), CT_ERR_INVALID);
    teardown();
}

CT_TEST(store_port_in_use) {
    setup();
    ct_store_server *s2 = NULL;
    CT_EXPECT_EQ(ct_store_server_start(NULL, ct_store_server_port(srv), "t", &s2), CT_ERR_SYSTEM);
    CT_EXPECT(strstr(ct_last_error(), "already in use") != NULL);
    teardown();
}

CT_TEST(store_connect_times_out) {
    ct_store *c = NULL;
    double t0 = ct_time_now();
    /* port 1 on loopback: nobody listens */
    CT_EXPECT_EQ(ct_store_connect("127.0.0.1", 1, "", 0.3, &c), CT_ERR_TIMEOUT);
    CT_EXPECT(ct_time_now() - t0 < 3);
}

/* A client of a server that only listens: it connects (backlog) and its first request
 * waits until ct_store_server_run; a pause keeps keys and connections. */
typedef struct { ct_store_server *s; double t_run; } run_later_arg;
static void *run_later(void *p) {
    run_later_arg *a = p;
    usleep(300 * 1000);
    a->t_run = ct_time_now();
    ct_store_server_run(a->s);
    return NULL;
}

CT_TEST(store_listen_then_run_and_pause) {
    ct_store_server *s = NULL;
    CT_EXPECT_OK(ct_store_server_listen(NULL, 0, "tok", &s));
    CT_EXPECT(ct_store_server_port(s) > 0);
    run_later_arg a = {s, 0};
    pthread_t th;
    pthread_create(&th, NULL, run_later, &a);
    ct_store *c = NULL;
    CT_EXPECT_OK(ct_store_connect("127.0.0.1", ct_store_server_port(s), "tok", 5, &c));
    double t_conn = ct_time_now();
    pthread_join(th, NULL);
    CT_EXPECT(t_conn >= a.t_run); /* the hello was answered by the thread started late */
    CT_EXPECT_OK(ct_store_set(c, "k", "v1", 2));
    CT_EXPECT_OK(ct_store_server_run(s)); /* already running: no-op */
    ct_store_server_pause(s);
    ct_store_server_pause(s); /* repeatable */
    bool ex = false;
    a.t_run = 0;
    pthread_create(&th, NULL, run_later, &a);
    CT_EXPECT_OK(ct_store_check(c, "k", &ex)); /* same connection, answered after the resume */
    CT_EXPECT(ex);
    CT_EXPECT(ct_time_now() >= a.t_run && a.t_run > 0);
    pthread_join(th, NULL);
    void *v = NULL;
    size_t n = 0;
    CT_EXPECT_OK(ct_store_get(c, "k", 1, &v, &n));
    CT_EXPECT(n == 2 && !memcmp(v, "v1", 2));
    free(v);
    ct_store_free(c);
    ct_store_server_stop(s);
    /* stop without ever running */
    CT_EXPECT_OK(ct_store_server_listen(NULL, 0, NULL, &s));
    ct_store_server_stop(s);
}

/* Two ADDs past INT64_MAX were signed overflow (undefined); now the second is an error and
 * the counter keeps its value. */
CT_TEST(store_add_overflow_is_an_error) {
    setup();
    int64_t v = 0;
    CT_EXPECT_OK(ct_store_add(cli, "n", INT64_MAX - 1, &v));
    CT_EXPECT_EQ(v, INT64_MAX - 1);
    CT_EXPECT_EQ(ct_store_add(cli, "n", 5, &v), CT_ERR_INVALID);
    CT_EXPECT_OK(ct_store_add(cli, "n", 1, &v));
    CT_EXPECT_EQ(v, INT64_MAX);
    CT_EXPECT_OK(ct_store_add(cli, "m", INT64_MIN, &v));
    CT_EXPECT_EQ(ct_store_add(cli, "m", -1, &v), CT_ERR_INVALID);
    CT_EXPECT_OK(ct_store_add(cli, "m", 0, &v));
    CT_EXPECT_EQ(v, INT64_MIN);
    /* a value that is not a number is not a counter */
    CT_EXPECT_OK(ct_store_set(cli, "s", "12abc", 5));
    CT_EXPECT_EQ(ct_store_add(cli, "s", 1, &v), CT_ERR_INVALID);
    teardown();
}

/* Timeouts outside what the protocol carries: NaN and negative used to be cast to uint32_t
 * (undefined; on x86 a negative became a 49-day wait), inf overflowed the poll() timeout. */
CT_TEST(store_get_odd_timeouts) {
    setup();
    void *v = NULL;
    double t0 = ct_time_now();
    CT_EXPECT_EQ(ct_store_get(cli, "missing", -5, &v, NULL), CT_ERR_TIMEOUT);
    CT_EXPECT_EQ(ct_store_get(cli, "missing", NAN, &v, NULL), CT_ERR_TIMEOUT);
    CT_EXPECT_EQ(ct_store_get(cli, "missing", -INFINITY, &v, NULL), CT_ERR_TIMEOUT);
    CT_EXPECTF(ct_time_now() - t0 < 2, "odd timeouts took %.1f s", ct_time_now() - t0);
    CT_EXPECT_OK(ct_store_set(cli, "k", "v", 1));
    CT_EXPECT_OK(ct_store_get(cli, "k", INFINITY, &v, NULL));
    free(v);
    CT_EXPECT_OK(ct_store_get(cli, "k", 1e300, &v, NULL));
    free(v);
    teardown();
}

/* Reads the challenge the server sends every new connection (u32 length, status, nonce):
 * 1 when it came; the nonce goes to `nonce` when not NULL. */
static int read_challenge(int fd, uint8_t *nonce) {
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t b[37];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t r = read(fd, b + got, sizeof b - got);
        if (r <= 0) return 0;
        got += (size_t)r;
    }
    uint32_t len;
    memcpy(&len, b, 4);
    if (len != 33 || b[4] != CT_OK) return 0;
    if (nonce) memcpy(nonce, b + 5, 32);
    return 1;
}

/* A man in the middle that forwards one connection both ways and keeps what the client sent. */
typedef struct { int lfd, port, to; uint8_t rec[4096]; size_t nrec; } tap_t;
static void *tap_main(void *p) {
    tap_t *t = p;
    int a = accept(t->lfd, NULL, NULL), b = raw_connect(t->to);
    struct pollfd pf[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    uint8_t buf[4096];
    while (a >= 0 && b >= 0 && poll(pf, 2, 5000) > 0) {
        int from = pf[0].revents ? 0 : 1;
        ssize_t r = read(pf[from].fd, buf, sizeof buf);
        if (r <= 0 || write(pf[1 - from].fd, buf, (size_t)r) != r) break;
        if (from == 0 && t->nrec + (size_t)r <= sizeof t->rec) memcpy(t->rec + t->nrec, buf, (size_t)r), t->nrec += (size_t)r;
    }
    if (a >= 0) close(a);
    if (b >= 0) close(b);
    return NULL;
}

/* The red team's sniffer read the token in the HELLO and spoke to the store as a member. Now
 * the token is not in what the client sends, and the recorded bytes replayed on a new
 * connection (another nonce) are refused before the SET behind them is done. */
CT_TEST(store_hello_is_not_replayable) {
    const char *tok = "sn1ff-me-if-you-can-0123456789";
    CT_EXPECT_OK(ct_store_server_start(NULL, 0, tok, &srv));
    int port = ct_store_server_port(srv);
    tap_t *t = calloc(1, sizeof *t);
    t->to = port;
    t->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof sa;
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    CT_ASSERT(!bind(t->lfd, (struct sockaddr *)&sa, sizeof sa) && !listen(t->lfd, 1));
    getsockname(t->lfd, (struct sockaddr *)&sa, &sl);
    pthread_t th;
    pthread_create(&th, NULL, tap_main, t);
    ct_store *c = NULL;
    CT_EXPECT_OK(ct_store_connect("127.0.0.1", ntohs(sa.sin_port), tok, 5, &c));
    CT_EXPECT_OK(ct_store_set(c, "ctrain/0/victim", "1", 1));
    ct_store_free(c);
    pthread_join(th, NULL);
    close(t->lfd);
    CT_ASSERT(t->nrec > 5);
    CT_EXPECT(!memmem(t->rec, t->nrec, tok, strlen(tok))); /* the secret never crossed */
    CT_EXPECT(!memmem(t->rec, t->nrec, tok, 8));
    CT_EXPECT_OK(ct_store_connect("127.0.0.1", port, tok, 5, &cli));
    bool ex = true;
    CT_EXPECT_OK(ct_store_delete(cli, "ctrain/0/victim", &ex));
    CT_EXPECT(ex);
    /* the replay: HELLO (for the recorded nonce) and SET, sent after a new challenge */
    int fd = raw_connect(port);
    CT_ASSERT(fd >= 0);
    CT_EXPECT(read_challenge(fd, NULL));
    CT_EXPECT(write(fd, t->rec, t->nrec) == (ssize_t)t->nrec);
    uint8_t r[5] = {0};
    CT_EXPECT(read(fd, r, 5) == 5 && r[0] == 1 && r[4] != CT_OK); /* one rejection, then EOF */
    CT_EXPECT(closed_by_server(fd));
    close(fd);
    CT_EXPECT_OK(ct_store_check(cli, "ctrain/0/victim", &ex));
    CT_EXPECT(!ex);
    /* the right answer to a challenge gets in: the test's replay was the only fault */
    uint8_t nonce[32], mac[32];
    fd = raw_connect(port);
    CT_ASSERT(fd >= 0);
    CT_EXPECT(read_challenge(fd, nonce));
    ct_store_auth_mac(tok, nonce, mac);
    uint8_t hello[41] = {37, 0, 0, 0, 1, 32, 0, 0, 0};
    memcpy(hello + 9, mac, 32);
    CT_EXPECT(write(fd, hello, sizeof hello) == (ssize_t)sizeof hello);
    CT_EXPECT(read(fd, r, 5) == 5 && r[0] == 1 && r[4] == CT_OK);
    close(fd);
    free(t);
    teardown();
}

/* A store that stops answering (its host SIGSTOPped): a call waits the client's timeout, not
 * a fixed minute, and the calls after it fail at once; connecting waits the connect's timeout. */
CT_TEST(store_frozen_server_times_out) {
    setup();
    int port = ct_store_server_port(srv);
    ct_store_server_pause(srv); /* the thread is gone: connections are held, nothing answers */
    ct_store_set_timeout(cli, 0.5);
    int64_t v = 0;
    double t0 = ct_time_now();
    CT_EXPECT_EQ(ct_store_add(cli, "ctrain/0/finalized", 1, &v), CT_ERR_TIMEOUT);
    double dt = ct_time_now() - t0;
    CT_EXPECTF(dt >= 0.4 && dt < 1.5, "add on a frozen store returned after %.2f s", dt);
    CT_EXPECT(strstr(ct_last_error(), "no reply within") != NULL);
    t0 = ct_time_now();
    CT_EXPECT(ct_store_set(cli, "k", "v", 1) != CT_OK);
    void *val = NULL;
    CT_EXPECT(ct_store_get(cli, "k", 10, &val, NULL) != CT_OK);
    CT_EXPECTF(ct_time_now() - t0 < 0.2, "calls on a dropped connection took %.2f s", ct_time_now() - t0);
    /* a GET waits its own timeout plus the reply slack */
    ct_store *c2 = NULL;
    CT_EXPECT_OK(ct_store_server_run(srv));
    CT_EXPECT_OK(ct_store_connect("127.0.0.1", port, "secret", 5, &c2));
    ct_store_server_pause(srv);
    t0 = ct_time_now();
    CT_EXPECT_EQ(ct_store_get(c2, "never", 0.5, &val, NULL), CT_ERR_TIMEOUT);
    dt = ct_time_now() - t0;
    CT_EXPECTF(dt >= 0.4 && dt < 2.5, "get(0.5 s) on a frozen store returned after %.2f s", dt);
    ct_store_free(c2);
    c2 = NULL;
    t0 = ct_time_now();
    CT_EXPECT_EQ(ct_store_connect("127.0.0.1", port, "secret", 1, &c2), CT_ERR_TIMEOUT);
    dt = ct_time_now() - t0;
    CT_EXPECTF(dt >= 0.9 && dt < 2.5, "connect(1 s) to a frozen store returned after %.2f s", dt);
    teardown();
}

/* Is fd still open at the server's end? (a read that times out: yes; EOF/reset: no) */
static int still_open(int fd, int ms) {
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[8];
    return read(fd, b, sizeof b) < 0;
}

/* A connection that never says HELLO is closed after about a second, and one address cannot
 * hold more than a few dozen of them: idle strangers cannot fill the table. */
CT_TEST(store_drops_idle_strangers) {
    setup();
    int port = ct_store_server_port(srv);
    enum { N = 100 };
    int fds[N];
    double t0 = ct_time_now();
    for (int i = 0; i < N; i++) fds[i] = raw_connect(port);
    usleep(300 * 1000);
    for (int i = 0; i < N; i++) if (fds[i] >= 0) read_challenge(fds[i], NULL); /* sent before any eviction */
    int open_now = 0;
    for (int i = 0; i < N; i++) open_now += fds[i] >= 0 && still_open(fds[i], 1);
    CT_EXPECTF(open_now <= 32, "%d of %d idle connections held by the store", open_now, N);
    /* a client with the token gets in while strangers crowd the port */
    ct_store *c2 = NULL;
    CT_EXPECT_OK(ct_store_connect("127.0.0.1", port, "secret", 5, &c2));
    CT_EXPECT_OK(ct_store_set(c2, "k", "v", 1));
    ct_store_free(c2);
    int last_open = -1;
    for (int i = N - 1; i >= 0 && last_open < 0; i--)
        if (fds[i] >= 0 && still_open(fds[i], 1)) last_open = i;
    if (last_open >= 0) {
        CT_EXPECT(!still_open(fds[last_open], 2000)); /* closed by the deadline */
        double dt = ct_time_now() - t0;
        CT_EXPECTF(dt < 2.5, "an idle stranger lived %.2f s", dt);
    }
    for (int i = 0; i < N; i++) if (fds[i] >= 0) close(fds[i]);
    /* an authenticated client may stay idle as long as it likes */
    usleep(1300 * 1000);
    CT_EXPECT_OK(ct_store_set(cli, "late", "1", 1));
    teardown();
}

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n - 3; /* ".", ".." and the directory's own descriptor */
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* At the descriptor limit accept() fails with EMFILE while the listening socket stays
 * readable: the store thread used to poll/accept in a loop at 98% CPU. Here the server
 * runs with a few descriptors to spare while another process holds 100 idle connections. */
CT_TEST(store_no_busy_loop_at_descriptor_limit) {
    setup();
    int port = ct_store_server_port(srv);
    int nfd = count_fds();
    CT_ASSERT(nfd > 0);
    struct rlimit old, lim;
    getrlimit(RLIMIT_NOFILE, &old);
    int go[2];
    CT_ASSERT(pipe(go) == 0);
    pid_t pid = fork();
    CT_ASSERT(pid >= 0);
    if (pid == 0) { /* the stranger: 100 connections that never speak */
        char b;
        if (read(go[0], &b, 1) != 1) _exit(1);
        int fds[100];
        for (int i = 0; i < 100; i++) fds[i] = raw_connect(port);
        sleep(3);
        for (int i = 0; i < 100; i++) if (fds[i] >= 0) close(fds[i]);
        _exit(0);
    }
    lim = old;
    lim.rlim_cur = (rlim_t)nfd + 10;
    setrlimit(RLIMIT_NOFILE, &lim);
    CT_EXPECT(write(go[1], "g", 1) == 1);
    usleep(200 * 1000);
    double c0 = cpu_seconds(), t0 = ct_time_now();
    usleep(1500 * 1000);
    double cpu = cpu_seconds() - c0, wall = ct_time_now() - t0;
    CT_EXPECTF(cpu < 0.2 * wall, "store used %.2f s of CPU in %.2f s with 100 idle connections at the limit", cpu, wall);
    /* the good client still gets through (the descriptor limit still in force) */
    ct_store *c2 = NULL;
    CT_EXPECT_OK(ct_store_connect("127.0.0.1", port, "secret", 5, &c2));
    if (c2) CT_EXPECT_OK(ct_store_set(c2, "k", "v", 1));
    ct_store_free(c2);
    setrlimit(RLIMIT_NOFILE, &old);
    int status = 0;
    waitpid(pid, &status, 0);
    close(go[0]);
    close(go[1]);
    CT_EXPECT_OK(ct_store_set(cli, "after", "1", 1));
    teardown();
}

CT_TEST_MAIN()
