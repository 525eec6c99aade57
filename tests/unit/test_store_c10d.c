/* The c10d TCPStore client against PyTorch's own servers: Debian's 1.13 (/usr/bin/python3)
 * and, where installed, a PyTorch >= 2 (PYTHON, else /tmp/gpt2-venv/bin/python) with its
 * libuv server and its legacy one. Operations, keys seen from Python, a timed-out wait that
 * leaves the handle usable, an absent key, the server gone, nobody listening, and a server
 * that is not PyTorch's. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ct_test.h"
#include "ctrain/dist.h"

/* Prints "ready PORT", then waits for stdin to close and prints the value ctrain set. */
static const char *SERVER =
    "import sys, datetime\n"
    "import torch.distributed as dist\n"
    "kw = {} if sys.argv[1] == '-' else {'use_libuv': sys.argv[1] == '1'}\n"
    "s = dist.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False,\n"
    "                  timeout=datetime.timedelta(seconds=30), **kw)\n"
    "s.set('from_py', 'hello')\n"
    "print('ready', s.port, flush=True)\n"
    "sys.stdin.read()\n"
    "print('from_c=' + s.get('from_c').decode(), flush=True)\n";

typedef struct { pid_t pid; int in, out; int port; } server;

static int server_start(const char *py, const char *libuv, server *s) {
    int pin[2], pout[2];
    if (pipe(pin) || pipe(pout)) return -1;
    s->pid = fork();
    if (s->pid == 0) {
        dup2(pin[0], 0);
        dup2(pout[1], 1);
        close(pin[1]);
        close(pout[0]);
        execl(py, py, "-W", "ignore", "-c", SERVER, libuv, (char *)NULL);
        _exit(127);
    }
    close(pin[0]);
    close(pout[1]);
    s->in = pin[1];
    s->out = pout[0];
    char line[128];
    FILE *f = fdopen(dup(s->out), "r");
    int ok = f && fgets(line, sizeof line, f) && sscanf(line, "ready %d", &s->port) == 1;
    if (f) fclose(f);
    return ok ? 0 : -1;
}

/* Closes the server's stdin; returns what it printed last (the value of from_c). */
static void server_stop(server *s, char *last, size_t n) {
    close(s->in);
    last[0] = 0;
    FILE *f = fdopen(s->out, "r");
    if (f) {
        if (!fgets(last, (int)n, f)) last[0] = 0;
        fclose(f);
    }
    waitpid(s->pid, NULL, 0);
}

static int has_torch(const char *py, int want_major) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s -c 'import sys, torch; sys.exit(int(torch.__version__.split(\".\")[0]) < %d)' "
             ">/dev/null 2>&1", py, want_major);
    return access(py, X_OK) == 0 && system(cmd) == 0;
}

static void exercise(const char *py, const char *libuv, const char *want_proto) {
    server s;
    CT_ASSERT(server_start(py, libuv, &s) == 0);
    ct_store *c = NULL;
    CT_EXPECT_OK(ct_store_connect_c10d("127.0.0.1", s.port, 10, &c));
    CT_ASSERT(c);
    CT_EXPECT(!strcmp(ct_store_protocol(c), want_proto));
    void *v = NULL;
    size_t n = 0;
    CT_EXPECT_OK(ct_store_get(c, "from_py", 5, &v, &n)); /* Python's key, under its plain name */
    CT_EXPECT(n == 5 && v && !memcmp(v, "hello", 5));
    free(v);
    int64_t k0 = 0, k1 = 0, x = 0;
    CT_EXPECT_OK(ct_store_num_keys(c, &k0));
    CT_EXPECT_OK(ct_store_set(c, "from_c", "world", 5));
    CT_EXPECT_OK(ct_store_num_keys(c, &k1));
    CT_EXPECT_EQ(k1, k0 + 1);
    CT_EXPECT_OK(ct_store_add(c, "n", 5, &x));
    CT_EXPECT_EQ(x, 5);
    CT_EXPECT_OK(ct_store_add(c, "n", -2, &x));
    CT_EXPECT_EQ(x, 3);
    bool b = true;
    CT_EXPECT_OK(ct_store_check(c, "absent", &b));
    CT_EXPECT(!b);
    CT_EXPECT_OK(ct_store_check(c, "n", &b));
    CT_EXPECT(b);
    CT_EXPECT_OK(ct_store_compare_set(c, "cas", NULL, 0, "a", 1, &v, &n)); /* missing: set */
    CT_EXPECT(n == 1 && !memcmp(v, "a", 1));
    free(v);
    CT_EXPECT_OK(ct_store_compare_set(c, "cas", "zz", 2, "b", 1, &v, &n)); /* mismatch: unchanged */
    CT_EXPECT(n == 1 && !memcmp(v, "a", 1));
    free(v);
    CT_EXPECT_OK(ct_store_compare_set(c, "cas", "a", 1, "b", 1, &v, &n));
    CT_EXPECT(n == 1 && !memcmp(v, "b", 1));
    free(v);
    CT_EXPECT_OK(ct_store_delete(c, "cas", &b));
    CT_EXPECT(b);
    CT_EXPECT_OK(ct_store_delete(c, "cas", &b));
    CT_EXPECT(!b);
    /* a wait that times out, then the same handle still works */
    double t0 = ct_time_now();
    CT_EXPECT_EQ(ct_store_get(c, "never", 0.3, &v, &n), CT_ERR_TIMEOUT);
    double dt = ct_time_now() - t0;
    CT_EXPECT(dt > 0.25 && dt < 5);
    CT_EXPECT(strstr(ct_last_error(), "never"));
    CT_EXPECT_OK(ct_store_set(c, "after", "1", 1));
    CT_EXPECT_OK(ct_store_get(c, "after", 5, &v, &n));
    CT_EXPECT(n == 1 && !memcmp(v, "1", 1));
    free(v);
    char last[256];
    server_stop(&s, last, sizeof last);
    CT_EXPECT(!strncmp(last, "from_c=world", 12)); /* ctrain's key, seen by Python */
    ct_status st = ct_store_add(c, "n", 1, &x);
    CT_EXPECT_EQ(st, CT_ERR_PEER);
    CT_EXPECT(strstr(ct_last_error(), "closed") || strstr(ct_last_error(), "lost"));
    CT_EXPECT_EQ(ct_store_get(c, "from_py", 1, &v, &n), CT_ERR_PEER);
    ct_store_free(c);
}

CT_TEST(c10d_store_against_pytorch) {
    if (!has_torch("/usr/bin/python3", 1)) CT_SKIP("Debian's python3-torch not installed (scripts/setup-interop.sh)");
    exercise("/usr/bin/python3", "-", "c10d-v1");
    const char *py2 = getenv("PYTHON") ? getenv("PYTHON") : "/tmp/gpt2-venv/bin/python";
    if (has_torch(py2, 2)) {
        exercise(py2, "1", "c10d-v2"); /* libuv server, the default */
        exercise(py2, "0", "c10d-v2"); /* legacy server */
    } else {
        printf("  (no PyTorch >= 2 at %s: only 1.13's server was tried)\n", py2);
    }
}

CT_TEST(c10d_store_connect_errors) {
    /* nobody listening: a free port from a server stopped at once */
    ct_store_server *srv = NULL;
    CT_EXPECT_OK(ct_store_server_start(NULL, 0, "tok", &srv));
    int port = ct_store_server_port(srv);
    ct_store *c = NULL;
    /* ctrain's own store is not PyTorch's */
    CT_EXPECT_EQ(ct_store_connect_c10d("127.0.0.1", port, 5, &c), CT_ERR_PEER);
    CT_EXPECT(strstr(ct_last_error(), "PyTorch TCPStore"));
    CT_EXPECT(!c);
    ct_store_server_stop(srv);
    double t0 = ct_time_now();
    CT_EXPECT_EQ(ct_store_connect_c10d("127.0.0.1", port, 0.5, &c), CT_ERR_TIMEOUT);
    CT_EXPECT(ct_time_now() - t0 < 5);
    CT_EXPECT(strstr(ct_last_error(), "nobody listening"));
    CT_EXPECT_EQ(ct_store_connect_c10d("no-such-host.invalid", 1, 1, &c), CT_ERR_INVALID);
    CT_EXPECT_EQ(ct_store_connect_c10d("127.0.0.1", 70000, 1, &c), CT_ERR_INVALID);
}

CT_TEST_MAIN()
