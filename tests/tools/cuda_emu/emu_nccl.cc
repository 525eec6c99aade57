// An emulated NCCL (crt/nccl.h) for the emulated device's multi-rank tests
// (tests/scripts/cuda_emu_device.sh): src/distributed/nccl.c runs unchanged between processes on
// one machine, each with its own emulated GPU of host memory. It keeps what that backend relies
// on: non-blocking communicators (init and every call return at once; the work runs on a
// thread per communicator, in issue order, and the stream it was issued on reads as busy
// through cudaStreamQuery until it is done), asynchronous errors (ncclCommGetAsyncError),
// ncclCommAbort releasing a stuck call, send/recv matched by order within groups, and a dead
// or departed peer reported as ncclRemoteError naming the rank.
//
// Transport: one POSIX shared-memory segment per communicator, named in the unique id.
//   header | n slots of kSlot bytes (collectives) | n x n channels of kChan bytes (send/recv)
// A collective runs in rounds of at most a slot per rank: each rank writes its part into its
// slot, all meet at a barrier (per-rank phase counters), each reads the slots it needs, and
// all meet again before the slots are reused. Reductions combine ranks 0..n-1 in order in f64
// (int64 for integers) and round once, so every rank gets the same bits.
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <nccl.h> // crt/

// emu_runtime.cc
float ct_emu_half_to_float(uint16_t h);
uint16_t ct_emu_float_to_half(float f);

namespace {
constexpr int kMaxRanks = 16;
constexpr size_t kSlot = (size_t)1 << 20;  // bytes of one rank's part of a collective round
// bytes of one send/recv piece: NCCL_BUFFSIZE's default, so that a send up to it completes
// before its receive is posted, as NCCL's does (the pages are touched only as used)
constexpr size_t kChan = (size_t)4 << 20;
constexpr uint32_t kMagic = 0x4e43454d;

struct Chan { // src -> dst, one piece at a time
    std::atomic<uint64_t> put, got;
    size_t len;
    char buf[kChan];
};
struct Header {
    std::atomic<uint32_t> magic; // set last by rank 0: the segment is ready
    int n;
    std::atomic<int> joined;
    std::atomic<int> pid[kMaxRanks];
    std::atomic<int> left[kMaxRanks];       // aborted or destroyed its communicator
    std::atomic<uint64_t> phase[kMaxRanks]; // barriers passed
};
constexpr size_t kHead = (sizeof(Header) + 4095) & ~(size_t)4095;
size_t seg_bytes(int n) { return kHead + (size_t)n * kSlot + (size_t)n * n * sizeof(Chan); }

// the library's last error (NCCL keeps one per process, not per communicator)
std::mutex err_mu;
char last_err[512];
void set_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void set_err(const char *fmt, ...) {
    std::lock_guard<std::mutex> g(err_mu);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_err, sizeof last_err, fmt, ap);
    va_end(ap);
}

// streams with queued collective work (cudaStreamQuery reads them as busy)
std::mutex busy_mu;
std::condition_variable busy_cv;
std::map<void *, int> busy;

bool pid_dead(int pid) {
    if (pid <= 0) return false;
    if (kill(pid, 0) == -1 && errno == ESRCH) return true;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[k] = 0;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'); // exited, not yet reaped
}

struct P2p {
    bool send;
    int peer;
    char *p;
    size_t bytes, done;
};
struct Task {
    void *stream;
    std::function<ncclResult_t()> run;
};
} // namespace

struct ncclComm {
    int n, me;
    char name[NCCL_UNIQUE_ID_BYTES];
    Header *h = nullptr;
    size_t bytes = 0;
    uint64_t phase = 0;
    std::atomic<bool> aborted{false};
    std::atomic<int> async{ncclSuccess};
    std::atomic<int> pending_sync{0}; // init and finalize, which ncclCommGetAsyncError reports as in progress
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Task> q;
    bool stop = false;
    std::thread worker;

    char *slot(int r) const { return (char *)h + kHead + (size_t)r * kSlot; }
    Chan *chan(int src, int dst) const { return (Chan *)((char *)h + kHead + (size_t)n * kSlot) + (size_t)src * n + dst; }

    // whether something keeps a wait from ever ending: this communicator aborted, or a peer gone
    ncclResult_t broken() {
        if (aborted.load()) {
            set_err("the communicator of rank %d was aborted", me);
            return ncclInvalidUsage;
        }
        for (int r = 0; r < n && h; r++) {
            if (r == me) continue;
            if (h->left[r].load()) {
                set_err("rank %d left: it aborted or destroyed its communicator", r);
                return ncclRemoteError;
            }
            if (pid_dead(h->pid[r].load())) {
                set_err("rank %d (pid %d) exited", r, h->pid[r].load());
                return ncclRemoteError;
            }
        }
        return ncclSuccess;
    }
    template <class F> ncclResult_t wait(F done) {
        for (unsigned i = 0;; i++) {
            if (done()) return ncclSuccess;
            if (i % 256 == 255) {
                ncclResult_t b = broken();
                if (b != ncclSuccess) return done() ? ncclSuccess : b; // a peer may arrive, then leave
            }
            if (i < 64) sched_yield();
            else usleep(50);
        }
    }
    ncclResult_t barrier() {
        const uint64_t ph = ++phase;
        h->phase[me].store(ph);
        return wait([&] {
            for (int r = 0; r < n; r++)
                if (h->phase[r].load() < ph) return false;
            return true;
        });
    }
    void submit(void *stream, std::function<ncclResult_t()> fn) {
        {
            std::lock_guard<std::mutex> g(busy_mu);
            busy[stream]++;
        }
        std::lock_guard<std::mutex> g(mu);
        q.push_back(Task{stream, std::move(fn)});
        cv.notify_one();
    }
    void loop() {
        for (;;) {
            Task t;
            {
                std::unique_lock<std::mutex> g(mu);
                cv.wait(g, [&] { return stop || !q.empty(); });
                if (q.empty()) return;
                t = std::move(q.front());
                q.pop_front();
            }
            // after an error or an abort the queued work is dropped: its results are undefined
            if (async.load() == ncclSuccess && !aborted.load()) {
                ncclResult_t r = t.run();
                if (r != ncclSuccess) {
                    int ok = ncclSuccess;
                    async.compare_exchange_strong(ok, r);
                }
            }
            std::lock_guard<std::mutex> g(busy_mu);
            if (--busy[t.stream] == 0) busy.erase(t.stream);
            busy_cv.notify_all();
        }
    }
    void halt() {
        {
            std::lock_guard<std::mutex> g(mu);
            stop = true;
            cv.notify_one();
        }
        if (worker.joinable()) worker.join();
    }
    ncclResult_t join();
    ncclResult_t p2p(std::vector<P2p> ops);
};

ncclResult_t ncclComm::join() {
    const size_t want = seg_bytes(n);
    int fd = -1;
    if (me == 0) {
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)want) != 0) {
            set_err("shm_open/ftruncate %s: %s", name, strerror(errno));
            if (fd >= 0) close(fd), shm_unlink(name);
            return ncclSystemError;
        }
    } else {
        ncclResult_t r = wait([&] { // rank 0 creates the segment and sizes it
            if (fd < 0) fd = shm_open(name, O_RDWR, 0600);
            struct stat st;
            return fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size == want;
        });
        if (r != ncclSuccess) {
            if (fd >= 0) close(fd);
            return r;
        }
    }
    void *p = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        set_err("mmap of %zu bytes for %s: %s", want, name, strerror(errno));
        if (me == 0) shm_unlink(name);
        return ncclSystemError;
    }
    Header *hd = (Header *)p;
    if (me == 0) {
        hd->n = n;
        hd->magic.store(kMagic);
    }
    ncclResult_t r = wait([&] { return hd->magic.load() == kMagic; });
    if (r == ncclSuccess && hd->n != n) {
        set_err("rank %d joined a communicator of %d ranks as one of %d", me, hd->n, n);
        r = ncclInvalidUsage;
    }
    if (r != ncclSuccess) {
        munmap(p, want);
        if (me == 0) shm_unlink(name);
        return r;
    }
    h = hd;
    bytes = want;
    h->pid[me].store((int)getpid());
    h->joined.fetch_add(1);
    r = wait([&] { return h->joined.load() == n; });
    if (me == 0) shm_unlink(name); // every rank has it mapped now (or init failed): nothing to leak
    return r;
}

namespace {
size_t tsize(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}
bool t_ok(int t) { return t >= 0 && t <= ncclBfloat16; }
bool op_ok(int op) { return op >= 0 && op <= ncclAvg; }
float bf16_to_f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t f_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); // NaN stays NaN
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
double get_f(const char *p, ncclDataType_t t) {
    uint16_t s;
    float f;
    switch (t) {
    case ncclFloat16: memcpy(&s, p, 2); return ct_emu_half_to_float(s);
    case ncclBfloat16: memcpy(&s, p, 2); return bf16_to_f(s);
    case ncclFloat32: memcpy(&f, p, 4); return f;
    default: { double d; memcpy(&d, p, 8); return d; }
    }
}
void put_f(char *p, ncclDataType_t t, double v) {
    uint16_t s;
    float f = (float)v;
    switch (t) {
    case ncclFloat16: s = ct_emu_float_to_half(f); memcpy(p, &s, 2); break;
    case ncclBfloat16: s = f_to_bf16(f); memcpy(p, &s, 2); break;
    case ncclFloat32: memcpy(p, &f, 4); break;
    default: memcpy(p, &v, 8); break;
    }
}
int64_t get_i(const char *p, ncclDataType_t t) {
    switch (t) {
    case ncclInt8: return *(const int8_t *)p;
    case ncclUint8: return *(const uint8_t *)p;
    case ncclInt32: { int32_t v; memcpy(&v, p, 4); return v; }
    case ncclUint32: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
    }
}
void put_i(char *p, ncclDataType_t t, int64_t v) {
    switch (t) {
    case ncclInt8: case ncclUint8: *(uint8_t *)p = (uint8_t)v; break;
    case ncclInt32: case ncclUint32: { uint32_t w = (uint32_t)v; memcpy(p, &w, 4); break; }
    default: memcpy(p, &v, 8); break;
    }
}
bool is_float(ncclDataType_t t) { return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64; }
template <class V> V combine(V a, V b, ncclRedOp_t op) {
    switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
    default: return a + b;
    }
}
// out[i] = op over ranks 0..n-1 in order of src[r][i], i < c
void reduce(char *out, const std::vector<const char *> &src, size_t c, ncclDataType_t t, ncclRedOp_t op) {
    const size_t e = tsize(t);
    const int n = (int)src.size();
    for (size_t i = 0; i < c; i++) {
        if (is_float(t)) {
            double a = get_f(src[0] + i * e, t);
            for (int r = 1; r < n; r++) a = combine(a, get_f(src[r] + i * e, t), op);
            put_f(out + i * e, t, op == ncclAvg ? a / n : a);
        } else {
            int64_t a = get_i(src[0] + i * e, t);
            for (int r = 1; r < n; r++) a = combine(a, get_i(src[r] + i * e, t), op);
            put_i(out + i * e, t, op == ncclAvg ? a / n : a);
        }
    }
}
} // namespace

ncclResult_t ncclComm::p2p(std::vector<P2p> ops) {
    for (unsigned idle = 0;;) {
        bool all = true, moved = false;
        for (size_t k = 0; k < ops.size(); k++) {
            P2p &o = ops[k];
            if (o.done == o.bytes) continue;
            all = false;
            bool first = true; // a pair's transfers go in issue order
            for (size_t j = 0; j < k && first; j++)
                first = !(ops[j].send == o.send && ops[j].peer == o.peer && ops[j].done < ops[j].bytes);
            if (!first) continue;
            Chan *c = o.send ? chan(me, o.peer) : chan(o.peer, me);
            const uint64_t put = c->put.load(), got = c->got.load();
            if (o.send && put == got) {
                c->len = o.bytes - o.done < kChan ? o.bytes - o.done : kChan;
                memcpy(c->buf, o.p + o.done, c->len);
                o.done += c->len;
                c->put.store(put + 1);
                moved = true;
            } else if (!o.send && put > got) {
                if (c->len > o.bytes - o.done) {
                    set_err("rank %d received %zu bytes from rank %d beyond the %zu of its recv", me, c->len, o.peer, o.bytes);
                    return ncclInvalidUsage;
                }
                memcpy(o.p + o.done, c->buf, c->len);
                o.done += c->len;
                c->got.store(got + 1);
                moved = true;
            }
        }
        if (all) return ncclSuccess;
        if (moved) {
            idle = 0;
            continue;
        }
        if (++idle % 256 == 0) {
            ncclResult_t r = broken();
            if (r != ncclSuccess) return r;
        }
        if (idle < 64) sched_yield();
        else usleep(50);
    }
}

namespace {
thread_local int group_depth;
thread_local std::vector<std::pair<ncclComm *, P2p>> group_ops;
thread_local void *group_stream;

bool valid(ncclComm *c) {
    if (c) return true;
    set_err("a NULL communicator");
    return false;
}
bool args_ok(ncclComm *c, int t, int op, int root) {
    if (!valid(c)) return false;
    if (!t_ok(t) || !op_ok(op)) return set_err("datatype %d or reduction %d unknown", t, op), false;
    if (root < 0 || root >= c->n) return set_err("root/peer %d of %d ranks", root, c->n), false;
    return true;
}
// a collective's rounds: f(off, count) per round of at most `per` elements
template <class F> ncclResult_t rounds(size_t count, size_t per, F f) {
    for (size_t off = 0; off < count; off += per) {
        ncclResult_t r = f(off, count - off < per ? count - off : per);
        if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
}
} // namespace

extern "C" {
// emu_device.cc: whether `stream` has collective work still to finish
int ct_emu_nccl_busy(void *stream) {
    std::lock_guard<std::mutex> g(busy_mu);
    return busy.count(stream) ? 1 : 0;
}
void ct_emu_nccl_wait(void *stream) {
    std::unique_lock<std::mutex> g(busy_mu);
    busy_cv.wait(g, [&] { return stream ? !busy.count(stream) : busy.empty(); });
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static std::atomic<unsigned> seq{0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "/ct_emu_nccl_%d_%ld_%u", (int)getpid(), (long)ts.tv_nsec, seq++);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int n, ncclUniqueId id, int rank, ncclConfig_t *cfg) {
    if (!out || n < 1 || n > kMaxRanks || rank < 0 || rank >= n || strncmp(id.internal, "/ct_emu_nccl_", 13)) {
        set_err("init: rank %d of %d ranks (at most %d), id '%.40s'", rank, n, kMaxRanks, id.internal);
        return ncclInvalidArgument;
    }
    ncclComm *c = new ncclComm;
    c->n = n;
    c->me = rank;
    memcpy(c->name, id.internal, sizeof c->name);
    c->name[sizeof c->name - 1] = 0;
    c->pending_sync = 1;
    c->worker = std::thread([c] { c->loop(); });
    c->submit(nullptr, [c] {
        ncclResult_t r = c->join();
        c->pending_sync--;
        return r;
    });
    *out = c;
    if (cfg && !cfg->blocking) return ncclInProgress;
    ct_emu_nccl_wait(nullptr);
    return (ncclResult_t)c->async.load();
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *e) {
    if (!valid(c) || !e) return ncclInvalidArgument;
    const int a = c->async.load();
    *e = a != ncclSuccess ? (ncclResult_t)a : c->pending_sync.load() ? ncclInProgress : ncclSuccess;
    return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t c) {
    if (!valid(c)) return ncclInvalidArgument;
    c->pending_sync++;
    c->submit(nullptr, [c] { return c->pending_sync--, ncclSuccess; });
    return ncclInProgress;
}
static void release(ncclComm *c) {
    c->halt();
    if (c->h) {
        c->h->left[c->me].store(1);
        munmap(c->h, c->bytes);
    }
    delete c;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!valid(c)) return ncclInvalidArgument;
    release(c);
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclSuccess;
    c->aborted = true; // a wait in progress returns: the worker stops
    release(c);
    return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}
const char *ncclGetLastError(ncclComm_t) { return last_err; }

} // extern "C"

// every rank's slot, from byte `at` on, reduced into out (k elements)
static void reduce_slots(ncclComm *c, char *out, size_t at, size_t k, ncclDataType_t t, ncclRedOp_t op) {
    std::vector<const char *> src;
    for (int q = 0; q < c->n; q++) src.push_back(c->slot(q) + at);
    reduce(out, src, k, t, op);
}
// queues a collective of `count` elements in rounds of at most `per`: each rank writes its part
// of a round into its slot (put), all meet, each reads the slots it needs (take), all meet again
template <class Put, class Take>
static void collective(ncclComm *c, cudaStream_t st, size_t count, size_t per, Put put, Take take) {
    c->submit(st, [=] {
        return rounds(count, per, [&](size_t off, size_t k) {
            put(off, k);
            ncclResult_t x = c->barrier();
            if (x != ncclSuccess) return x;
            take(off, k);
            return c->barrier();
        });
    });
}
// an all-reduce (root < 0) or a reduce to root
static ncclResult_t reduce_to(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t c,
                              cudaStream_t st) {
    if (!args_ok(c, t, op, root < 0 ? 0 : root)) return ncclInvalidArgument;
    const size_t e = tsize(t);
    collective(
        c, st, count, kSlot / e, [=](size_t off, size_t k) { memcpy(c->slot(c->me), (const char *)s + off * e, k * e); },
        [=](size_t off, size_t k) {
            if (root < 0 || c->me == root) reduce_slots(c, (char *)r + off * e, 0, k, t, op);
        });
    return ncclSuccess;
}

extern "C" {
ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st) {
    return reduce_to(s, r, count, t, op, -1, c, st);
}
ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t c,
                        cudaStream_t st) {
    return root < 0 ? (set_err("root %d", root), ncclInvalidArgument) : reduce_to(s, r, count, t, op, root, c, st);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) {
    if (!args_ok(c, t, 0, root)) return ncclInvalidArgument;
    const size_t e = tsize(t);
    collective(
        c, st, count, kSlot / e,
        [=](size_t off, size_t k) {
            if (c->me == root) memcpy(c->slot(root), (const char *)s + off * e, k * e);
        },
        [=](size_t off, size_t k) { memmove((char *)r + off * e, c->slot(root), k * e); });
    return ncclSuccess;
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t count, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
    if (!args_ok(c, t, 0, 0)) return ncclInvalidArgument;
    const size_t e = tsize(t);
    collective(
        c, st, count, kSlot / e, [=](size_t off, size_t k) { memcpy(c->slot(c->me), (const char *)s + off * e, k * e); },
        [=](size_t off, size_t k) {
            for (int q = 0; q < c->n; q++) memmove((char *)r + (q * count + off) * e, c->slot(q), k * e);
        });
    return ncclSuccess;
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t st) {
    if (!args_ok(c, t, op, 0)) return ncclInvalidArgument;
    const size_t e = tsize(t), n = (size_t)c->n;
    collective(
        c, st, count, kSlot / e / n,
        [=](size_t off, size_t k) {
            for (size_t d = 0; d < n; d++) memcpy(c->slot(c->me) + d * k * e, (const char *)s + (d * count + off) * e, k * e);
        },
        [=](size_t off, size_t k) { reduce_slots(c, (char *)r + off * e, c->me * k * e, k, t, op); });
    return ncclSuccess;
}

static ncclResult_t p2p_call(bool send, void *p, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    if (!args_ok(c, t, 0, peer)) return ncclInvalidArgument;
    P2p o{send, peer, (char *)p, count * tsize(t), 0};
    if (group_depth > 0) {
        group_ops.push_back({c, o});
        group_stream = st;
        return ncclSuccess;
    }
    c->submit(st, [c, o] { return c->p2p({o}); });
    return ncclSuccess;
}
ncclResult_t ncclSend(const void *p, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    return p2p_call(true, (void *)p, count, t, peer, c, st);
}
ncclResult_t ncclRecv(void *p, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    return p2p_call(false, p, count, t, peer, c, st);
}
ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}
// the group's sends and receives progress together, one task per communicator
ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return set_err("ncclGroupEnd without ncclGroupStart"), ncclInvalidUsage;
    if (--group_depth > 0) return ncclSuccess;
    std::map<ncclComm *, std::vector<P2p>> by;
    for (auto &o : group_ops) by[o.first].push_back(o.second);
    group_ops.clear();
    for (auto &b : by) {
        ncclComm *c = b.first;
        std::vector<P2p> ops = b.second;
        c->submit(group_stream, [c, ops] { return c->p2p(ops); });
    }
    return ncclSuccess;
}
} // extern "C"
