// gloo backend, C++ half: Gloo's collectives over its TCP transport, bootstrapped through
// ctrain's store, behind the C interface of distributed/gloo.h. Gloo reports failures (a
// dead peer, a timeout, a bad argument) by throwing; every entry point catches everything,
// so no exception crosses into C and a failure is a ct_status with a message naming the
// operation and, where Gloo's message carries its address, the peer's rank and host.
#include "distributed/gloo.h"

#include "ctrain/config.h"

#include <gloo/allgather.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace {

// A ct_store failure inside Gloo's rendezvous, with its status (Gloo only sees the throw).
struct StoreError : std::exception {
    ct_status st;
    std::string msg;
    StoreError(ct_status s, const char *m) : st(s), msg(m) {}
    const char *what() const noexcept override { return msg.c_str(); }
};

std::chrono::milliseconds to_ms(double s) {
    double ms = s * 1e3;
    if (!(ms >= 1)) ms = 1;       // Gloo rejects a zero timeout
    if (ms > 1e12) ms = 1e12;     // "never" without overflowing the clock arithmetic
    return std::chrono::milliseconds(static_cast<long long>(ms));
}

// Gloo's rendezvous over ctrain's store; every key under the group's prefix.
class CtStore : public gloo::rendezvous::Store {
  public:
    CtStore(ct_store *s, std::string ns, double timeout) : s_(s), ns_(std::move(ns)), timeout_(timeout) {}
    void set(const std::string &key, const std::vector<char> &data) override {
        ct_status st = ct_store_set(s_, (ns_ + key).c_str(), data.data(), data.size());
        if (st) throw StoreError(st, ct_last_error());
    }
    std::vector<char> get(const std::string &key) override {
        void *v = nullptr;
        size_t len = 0;
        ct_status st = ct_store_get(s_, (ns_ + key).c_str(), timeout_, &v, &len);
        if (st) throw StoreError(st, ct_last_error());
        std::vector<char> out(static_cast<char *>(v), static_cast<char *>(v) + len);
        free(v);
        return out;
    }
    void wait(const std::vector<std::string> &keys) override { wait(keys, to_ms(timeout_)); }
    void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) override {
        std::vector<std::string> full;
        std::vector<const char *> ptrs;
        for (const auto &k : keys) full.push_back(ns_ + k);
        for (const auto &k : full) ptrs.push_back(k.c_str());
        double t = timeout.count() > 0 ? static_cast<double>(timeout.count()) / 1e3 : timeout_;
        ct_status st = ct_store_wait(s_, ptrs.data(), static_cast<int>(ptrs.size()), t);
        if (st == CT_ERR_TIMEOUT) throw StoreError(st, missing(keys, t).c_str());
        if (st) throw StoreError(st, ct_last_error());
    }

  private:
    // Gloo's keys are the ranks' numbers: name the ranks that never came.
    std::string missing(const std::vector<std::string> &keys, double t) {
        std::string list;
        for (const auto &k : keys) {
            bool there = false;
            if (ct_store_check(s_, (ns_ + k).c_str(), &there) == CT_OK && !there) list += (list.empty() ? "" : ", ") + k;
        }
        char m[200];
        snprintf(m, sizeof m, "no address from rank(s) %.120s after %.0f s (not started, or cannot reach the store)",
                 list.empty() ? "?" : list.c_str(), t);
        return m;
    }


    ct_store *s_;
    std::string ns_;
    double timeout_;
};

// Send/recv slots: a prefix none of Gloo's collectives uses (they take 0x01-0x08).
constexpr uint8_t kP2PSlotPrefix = 0x40;

}  // namespace

struct ct_gloo_comm {
    ct_store *store = nullptr;
    std::string ns, ifaddr;
    int rank = 0, size = 1;
    std::vector<int> granks; // world rank of each group rank, for messages (empty: the world)
    int world_size = 0;
    std::shared_ptr<gloo::transport::Device> dev;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    std::vector<unsigned char> scratch;
};

namespace {

// Gloo's timeout names nobody; this one names the peers (world ranks) whose half of a
// message had not happened: they never reached the collective, or are stuck before it.
struct Missing : std::exception {
    std::string ranks;
    explicit Missing(std::string r) : ranks(std::move(r)) {}
    const char *what() const noexcept override { return "timed out"; }
};

// One buffer per peer (null at this rank's own index). Gloo's buffer keeps only the rank of
// its latest completion: two that land before the waiter wakes read as one peer twice, and a
// timeout then named a peer whose message had come (multinode_stall: rank 1 named with the
// stopped rank 2, about 1 run in 40 on 2 cores). A buffer of its own per peer says which.
using PeerBufs = std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>>;

// peer q's buffer over [p + q * stride, + bytes) for every q but this rank (stride 0: the same
// bytes for all, e.g. this rank's own block going to everyone)
PeerBufs per_peer(ct_gloo_comm *c, unsigned char *p, size_t stride, size_t bytes) {
    PeerBufs b(static_cast<size_t>(c->size));
    for (int q = 0; q < c->size; q++)
        if (q != c->rank) b[static_cast<size_t>(q)] = c->ctx->createUnboundBuffer(p + static_cast<size_t>(q) * stride, bytes);
    return b;
}

std::string group_rank_name(const ct_gloo_comm *c, int q) {
    return std::to_string(c->granks.empty() ? q : c->granks[static_cast<size_t>(q)]);
}

// Waits for the receive (recv) or send posted on each peer's buffer, all within `to`. On a
// timeout the peers whose operation had not completed are named (Gloo then closes the pairs,
// so a peer checked after that which had not completed reads as missing too).
void wait_each_peer(ct_gloo_comm *c, PeerBufs &b, bool recv, std::chrono::milliseconds to) {
    using namespace std::chrono;
    const auto deadline = steady_clock::now() + to;
    for (int q = 0; q < c->size; q++) {
        auto *bq = b[static_cast<size_t>(q)].get();
        if (!bq) continue;
        auto left = std::max(milliseconds(0), duration_cast<milliseconds>(deadline - steady_clock::now()));
        try {
            if (recv) bq->waitRecv(left);
            else bq->waitSend(left);
        } catch (const gloo::IoException &e) {
            if (!strstr(e.what(), "imed out")) throw;
            std::string list = group_rank_name(c, q);
            for (int r = q + 1; r < c->size; r++) {
                auto *br = b[static_cast<size_t>(r)].get();
                if (!br) continue;
                bool done = false;
                try {
                    done = recv ? br->waitRecv(milliseconds(0)) : br->waitSend(milliseconds(0));
                } catch (const std::exception &) {  // the pairs closed by the timeout: not completed
                }
                if (!done) list += ", " + group_rank_name(c, r);
            }
            throw Missing(list);
        }
    }
}

// Every rank's block straight to every other (not Gloo's ring): a timeout then knows which
// peers never sent theirs. Slot prefix beside the p2p one, unused by Gloo's collectives.
constexpr uint8_t kAgDirectSlotPrefix = 0x43, kA2aDirectSlotPrefix = 0x44;

// Block q of out from every other rank q, every receive posted before the sends, and to each
// rank q block q of in (the all-to-all) or this rank's own block (own: the all-gather, where
// in and out are one buffer). Gloo's own all-to-all ran at half the link's rate over a shaped
// 1 Gbit/s link (2 x 1, 32 MiB a way: 560 ms against this all-gather's 287 ms).
void exchange_direct(ct_gloo_comm *c, unsigned char *in, unsigned char *out, size_t bytes, bool own, uint64_t slot,
                     std::chrono::milliseconds to) {
    const size_t me = static_cast<size_t>(c->rank) * bytes;
    PeerBufs rb = per_peer(c, out, bytes, bytes), sb = own ? per_peer(c, in + me, 0, bytes) : per_peer(c, in, bytes, bytes);
    for (int q = 0; q < c->size; q++) {
        if (q == c->rank) continue;
        rb[static_cast<size_t>(q)]->recv(q, slot, 0, bytes);
        sb[static_cast<size_t>(q)]->send(q, slot, 0, bytes);
    }
    wait_each_peer(c, rb, true, to);
    wait_each_peer(c, sb, false, to);
}

unsigned char *scratch(ct_gloo_comm *c, size_t bytes) {
    if (c->scratch.size() < bytes) c->scratch.resize(bytes);
    return c->scratch.data();
}

template <typename T>
void run_typed(ct_gloo_comm *c, const ct_gloo_op *op, std::chrono::milliseconds to) {
    const auto &ctx = c->ctx;
    const size_t n = op->count, bytes = n * sizeof(T), all = bytes * static_cast<size_t>(c->size);
    T *r = static_cast<T *>(op->rbuf);
    const T *s = static_cast<const T *>(op->sbuf);
    switch (op->kind) {
    case CT_GLOO_BROADCAST: {
        gloo::BroadcastOptions o(ctx);
        o.setOutput(r, n);
        o.setRoot(op->peer);
        o.setTag(op->tag);
        o.setTimeout(to);
        gloo::broadcast(o);
        break;
    }
    case CT_GLOO_ALLGATHER: {
        T *mine = r + static_cast<size_t>(c->rank) * n;
        if (s != mine) memmove(mine, s, bytes);
        unsigned char *rb = reinterpret_cast<unsigned char *>(r);
        exchange_direct(c, rb, rb, bytes, true, gloo::Slot::build(kAgDirectSlotPrefix, op->tag), to);
        break;
    }
    case CT_GLOO_ALLTOALL: {
        const unsigned char *sb = reinterpret_cast<const unsigned char *>(s);
        unsigned char *rb = reinterpret_cast<unsigned char *>(r);
        if (sb < rb + all && rb < sb + all) {  // overlapping: the sends read what the receives write
            unsigned char *t = scratch(c, all);
            memcpy(t, sb, all);
            sb = t;
        }
        const size_t me = static_cast<size_t>(c->rank) * bytes;
        memcpy(rb + me, sb + me, bytes);
        exchange_direct(c, const_cast<unsigned char *>(sb), rb, bytes, false, gloo::Slot::build(kA2aDirectSlotPrefix, op->tag), to);
        break;
    }
    case CT_GLOO_BARRIER: {
        gloo::BarrierOptions o(ctx);
        o.setTag(op->tag);
        o.setTimeout(to);
        gloo::barrier(o);
        break;
    }
    case CT_GLOO_SEND: {
        auto b = ctx->createUnboundBuffer(const_cast<T *>(s), bytes);
        b->send(op->peer, gloo::Slot::build(kP2PSlotPrefix, op->tag));
        b->waitSend(to);
        break;
    }
    case CT_GLOO_RECV: {
        auto b = ctx->createUnboundBuffer(r, bytes);
        b->recv(op->peer, gloo::Slot::build(kP2PSlotPrefix, op->tag));
        b->waitRecv(to);
        break;
    }
    case CT_GLOO_ALLREDUCE_ORDERED: break;  // allreduce_ordered: not by element type
    }
}

// All-reduce whose every element is summed in rank order (op->combine over ranks 0..n-1):
// rank p reduces part p of the n parts of rbuf and sends the result to all (a reduce-scatter
// and an all-gather, each peer to peer). Parts go in segments of kSeg bytes, two in flight: the
// next segment travels while this one is reduced. Each role has its own buffer object per
// segment parity, so that a count of completions on it is exactly one segment's.
constexpr size_t kSeg = 1 << 20;
constexpr uint8_t kRsSlotPrefix = 0x41, kAgSlotPrefix = 0x42;

void allreduce_ordered(ct_gloo_comm *c, const ct_gloo_op *op, std::chrono::milliseconds to) {
    const int n = c->size, me = c->rank;
    const size_t es = op->esize, part = op->count / static_cast<size_t>(n) * es;  // bytes per part
    const size_t seg = kSeg / es * es, nseg = (part + seg - 1) / seg;
    unsigned char *buf = static_cast<unsigned char *>(op->rbuf);
    unsigned char *stage = scratch(c, 2 * static_cast<size_t>(n) * seg);  // [parity][rank] segment
    const uint64_t rs = gloo::Slot::build(kRsSlotPrefix, op->tag), ag = gloo::Slot::build(kAgSlotPrefix, op->tag);
    // per parity and peer: its segment of the stage, its part of buf (offset j * seg within)
    PeerBufs st[2], rs_send[2], ag_send[2], ag_recv[2];
    for (int h = 0; h < 2; h++) {
        st[h] = per_peer(c, stage + h * static_cast<size_t>(n) * seg, seg, seg);
        rs_send[h] = per_peer(c, buf, part, part);
        ag_send[h] = per_peer(c, buf + static_cast<size_t>(me) * part, 0, part);
        ag_recv[h] = per_peer(c, buf, part, part);
    }
    auto len = [&](size_t j) { return std::min(seg, part - j * seg); };
    auto post_rs = [&](size_t j) {  // segment j of every part to its owner; mine from everyone
        int h = static_cast<int>(j & 1);
        for (int q = 0; q < n; q++) {
            if (q == me) continue;
            st[h][static_cast<size_t>(q)]->recv(q, rs, 0, len(j));
            rs_send[h][static_cast<size_t>(q)]->send(q, rs, j * seg, len(j));
        }
    };
    post_rs(0);
    if (nseg > 1) post_rs(1);
    for (size_t j = 0; j < nseg; j++) {
        int h = static_cast<int>(j & 1);
        wait_each_peer(c, st[h], true, to);
        unsigned char *mine = buf + static_cast<size_t>(me) * part + j * seg;
        unsigned char *acc = stage + h * static_cast<size_t>(n) * seg + static_cast<size_t>(me) * seg;  // unused slot
        const size_t k = len(j) / es;
        const void *prev = me == 0 ? mine : stage + h * static_cast<size_t>(n) * seg;
        for (int r = 1; r < n; r++) {
            const void *src = r == me ? mine : stage + h * static_cast<size_t>(n) * seg + static_cast<size_t>(r) * seg;
            bool last = r == n - 1;
            op->combine(last ? mine : acc, prev, src, k, last, op->combine_arg);
            prev = acc;
        }
        wait_each_peer(c, rs_send[h], false, to);  // the peers' parts of j may be overwritten now
        if (j >= 2) {
            wait_each_peer(c, ag_send[h], false, to);
            wait_each_peer(c, ag_recv[h], true, to);
        }
        for (int q = 0; q < n; q++) {
            if (q == me) continue;
            ag_recv[h][static_cast<size_t>(q)]->recv(q, ag, j * seg, len(j));
            ag_send[h][static_cast<size_t>(q)]->send(q, ag, j * seg, len(j));
        }
        if (j + 2 < nseg) post_rs(j + 2);
    }
    for (size_t j = nseg >= 2 ? nseg - 2 : 0; j < nseg; j++) {
        wait_each_peer(c, ag_send[j & 1], false, to);
        wait_each_peer(c, ag_recv[j & 1], true, to);
    }
}

// One rank: nothing to exchange (Gloo itself insists on a pair to each neighbour).
void run_alone(const ct_gloo_op *op) {
    size_t bytes = op->count * op->esize;
    if ((op->kind == CT_GLOO_ALLGATHER || op->kind == CT_GLOO_ALLTOALL || op->kind == CT_GLOO_SEND) && op->rbuf &&
        op->sbuf != op->rbuf)
        memmove(op->rbuf, op->sbuf, bytes);
}

// "[10.0.0.2]:40151" of a pair's address, without what may follow (a sequence number).
std::string listen_addr(const std::string &a) {
    size_t e = a.find("]:");
    if (e == std::string::npos) return a;
    size_t p = e + 2;
    while (p < a.size() && a[p] >= '0' && a[p] <= '9') p++;
    return a.substr(0, p);
}

// "[IP]:PORT" of every established IPv4 TCP connection of this process (its descriptors'
// socket inodes looked up in /proc/self/net/tcp): where this rank connected, the peer's Gloo
// names it by that ephemeral port, which no listening address gives away.
std::string local_tcp_addrs() {
    std::vector<unsigned long> inodes;
    if (DIR *d = opendir("/proc/self/fd")) {
        while (struct dirent *e = readdir(d)) {
            char path[300], target[64];
            snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
            ssize_t n = readlink(path, target, sizeof target - 1);
            unsigned long ino;
            if (n > 0 && (target[n] = 0, sscanf(target, "socket:[%lu]", &ino) == 1)) inodes.push_back(ino);
        }
        closedir(d);
    }
    std::string out;
    FILE *f = fopen("/proc/self/net/tcp", "r");
    if (!f) return out;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned long ip, port, state, ino;
        if (sscanf(line, " %*u: %lx:%lx %*x:%*x %lx %*x:%*x %*x:%*x %*x %*u %*u %lu", &ip, &port, &state, &ino) != 4 ||
            state != 1 /* ESTABLISHED */ || std::find(inodes.begin(), inodes.end(), ino) == inodes.end())
            continue;
        struct in_addr a;
        a.s_addr = static_cast<uint32_t>(ip);  // the kernel prints the address as stored
        char txt[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &a, txt, sizeof txt);
        out += "[" + std::string(txt) + "]:" + std::to_string(port) + " ";
    }
    fclose(f);
    return out;
}

// "[/build/gloo/transport/tcp/pair.cc:589] Connection closed by peer [10.0.0.2]:40151": the
// source position means nothing to a user.
const char *strip_position(const char *m) {
    if (m[0] == '[') {
        const char *e = strstr(m, "] ");
        if (e) return e + 2;
    }
    return m;
}

// Who Gloo's message is about, from the labels the ranks published ("HOSTNAME IFADDR|[IP]:PORT
// ..."): "rank 2 of 4 on HOST IFADDR" when one of a rank's listening addresses appears in it;
// when only the IP does, the ranks on that host. Empty when nothing matches. Asks the store: only after a failure.
int world_rank(const ct_gloo_comm *c, int r) { return c->granks.empty() ? r : c->granks[(size_t)r]; }
std::string world_rank_name(const ct_gloo_comm *c, const std::string &ranks) {
    return "rank " + ranks + " of " + std::to_string(c->granks.empty() ? c->size : c->world_size);
}

std::string peer_in_message(ct_gloo_comm *c, const char *msg) {
    std::string ip, on_ip, host;
    if (const char *b = strchr(msg, '[')) {
        const char *e = strstr(b, "]:");
        if (e) ip = std::string(b + 1, e);
    }
    double give_up = ct_time_now() + 2;  // the store may be gone with the peer
    for (int r = 0; r < c->size && ct_time_now() < give_up; r++) {
        if (r == c->rank) continue;
        void *v = nullptr;
        size_t len = 0;
        std::string key = c->ns + "host/" + std::to_string(r);
        if (ct_store_get(c->store, key.c_str(), 1.0, &v, &len) != CT_OK) break;
        std::string label(static_cast<char *>(v), len);
        free(v);
        size_t bar = label.find('|');
        if (bar == std::string::npos) continue;
        std::string who = label.substr(0, bar);
        for (size_t p = bar + 1; p < label.size();) {
            size_t e = label.find(' ', p);
            if (e == std::string::npos) e = label.size();
            if (e > p && strstr(msg, label.substr(p, e - p).c_str()))
                return world_rank_name(c, std::to_string(world_rank(c, r))) + " on " + who;
            p = e + 1;
        }
        size_t sp = who.rfind(' ');
        if (!ip.empty() && sp != std::string::npos && who.compare(sp + 1, std::string::npos, ip) == 0) {
            on_ip += (on_ip.empty() ? "" : " or ") + std::to_string(world_rank(c, r));
            host = who;
        }
    }
    if (on_ip.empty()) return "";
    return world_rank_name(c, on_ip) + " on " + host;
}

ct_status op_failed(ct_gloo_comm *c, const ct_gloo_op *op, const char *what) {
    const char *m = strip_position(what);
    if (strstr(m, "imed out") || strstr(m, "imeout"))
        return ct_error(CT_ERR_TIMEOUT, "%s timed out after %.0f s (gloo backend: some rank never reached it): %s",
                        op->what, op->timeout_s, m);
    std::string who = peer_in_message(c, m);
    if (!who.empty()) return ct_error(CT_ERR_PEER, "%s failed: lost %s (gloo backend: %s)", op->what, who.c_str(), m);
    return ct_error(CT_ERR_PEER, "%s failed (gloo backend): %s", op->what, m);
}

}  // namespace

extern "C" ct_status ct_gloo_comm_run(ct_gloo_comm *c, const ct_gloo_op *op) {
    if (c->size == 1 || (op->count == 0 && op->kind != CT_GLOO_BARRIER)) {
        if (c->size == 1) run_alone(op);
        return CT_OK;
    }
    try {
        auto to = to_ms(op->timeout_s);
        if (op->kind == CT_GLOO_ALLREDUCE_ORDERED) {
            allreduce_ordered(c, op, to);
            return CT_OK;
        }
        switch (op->esize) {
        case 1: run_typed<uint8_t>(c, op, to); break;
        case 2: run_typed<uint16_t>(c, op, to); break;
        case 4: run_typed<uint32_t>(c, op, to); break;
        case 8: run_typed<uint64_t>(c, op, to); break;
        default: return ct_error(CT_ERR_UNSUPPORTED, "%s: gloo backend: no %zu-byte elements", op->what, op->esize);
        }
        return CT_OK;
    } catch (const Missing &e) {
        // the wording of the shm backend's, which the launcher reads to name the root cause
        return ct_error(CT_ERR_TIMEOUT, "%s timed out on rank %d after %.0f s: rank(s) %s never reached it (gloo backend)",
                        op->what, world_rank(c, c->rank), op->timeout_s, e.ranks.c_str());
    } catch (const std::exception &e) {
        return op_failed(c, op, e.what());
    } catch (...) {
        return op_failed(c, op, "unknown exception");
    }
}

namespace {

// Gloo's event loop (one thread per device) meets a connection whose lock another thread holds
// by returning to epoll at once, and the socket, level-triggered, is still readable: it spins
// (Pair::handleEvents, try_lock). The holder is this process's thread posting a send or a
// receive. Where threads outnumber cores it is often preempted in there (the write that
// wakes a peer), and the spinning loops then take the cores it waits for, time slice after
// time slice: 4 ranks on 2 cores took 6-8 ms for an all-gather of 4 KiB, the loops busy
// 40% of a core each. At nice 19 the loop gives way to the holder: 0.7 ms (docs/multinode.md).
// A thread's nice comes from the thread that made it, and a thread cannot lower its own nice
// again without privilege, so the device (whose constructor starts the loop) is made on a
// short-lived thread at that nice.
std::shared_ptr<gloo::transport::Device> create_device(const gloo::transport::tcp::attr &a, int nice) {
    errno = 0;
    int mine = getpriority(PRIO_PROCESS, 0); // Linux: this thread's
    if (nice <= 0 || (errno == 0 && mine >= nice)) return gloo::transport::tcp::CreateDevice(a);
    std::shared_ptr<gloo::transport::Device> dev;
    std::exception_ptr err;
    try {
        std::thread t([&] {
            try {
                if (setpriority(PRIO_PROCESS, 0, nice)) // then the loop runs at this thread's nice, as before
                    CT_LOG_INFO("pg", "gloo: event loop at the process's nice (setpriority: %s)", strerror(errno));
                dev = gloo::transport::tcp::CreateDevice(a);
            } catch (...) {
                err = std::current_exception();
            }
        });
        t.join();
    } catch (const std::system_error &) { // no thread to spare: the loop at this thread's nice
        return gloo::transport::tcp::CreateDevice(a);
    }
    if (err) std::rethrow_exception(err);
    return dev;
}

}  // namespace

extern "C" ct_status ct_gloo_comm_create(ct_store *store, const char *ns, int rank, int size, double timeout_s,
                                         const char *ifaddr, ct_gloo_comm **out) {
    *out = nullptr;
    ct_gloo_comm *c = nullptr;
    try {
        c = new ct_gloo_comm();
        c->store = store;
        c->ns = ns;
        c->ifaddr = ifaddr;
        c->rank = rank;
        c->size = size;
        if (size > 1) {
            // A peer that dies mid-write must be an error here, not SIGPIPE killing this process
            // (Gloo writes with writev, which has no MSG_NOSIGNAL). Only the default is replaced.
            struct sigaction sa;
            if (sigaction(SIGPIPE, nullptr, &sa) == 0 && sa.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
            ct_status cst = ct_config_check(CT_CFG_GLOO_LOOP_NICE);
            if (cst) {
                delete c;
                return cst;
            }
            gloo::transport::tcp::attr a;
            a.hostname = ifaddr;
            c->dev = create_device(a, (int)ct_config_int(CT_CFG_GLOO_LOOP_NICE));
            c->ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
            c->ctx->setTimeout(to_ms(timeout_s));
            CtStore s(store, c->ns, timeout_s);
            c->ctx->connectFullMesh(s, c->dev);
            // who this is, for the others' error messages: Gloo names a lost peer by the
            // address its end of the connection listened on (one per pair)
            char host[256] = "";
            gethostname(host, sizeof host - 1);
            std::string label = std::string(host) + " " + ifaddr + "|";
            for (int r = 0; r < size; r++)
                if (r != rank) label += listen_addr(c->ctx->getPair(r)->address().str()) + " ";
            label += local_tcp_addrs();
            std::string key = c->ns + "host/" + std::to_string(rank);
            ct_status st = ct_store_set(store, key.c_str(), label.data(), label.size());
            if (st) throw StoreError(st, ct_last_error());
        }
        *out = c;
        return CT_OK;
    } catch (const StoreError &e) {
        delete c;
        return ct_error(e.st, "gloo backend: rendezvous of %d ranks through the store failed: %s", size, e.what());
    } catch (const std::exception &e) {
        delete c;
        return ct_error(CT_ERR_PEER, "gloo backend: rank %d of %d cannot connect from %s: %s", rank, size, ifaddr,
                        strip_position(e.what()));
    } catch (...) {
        delete c;
        return ct_error(CT_ERR_PEER, "gloo backend: rank %d of %d cannot connect from %s", rank, size, ifaddr);
    }
}

extern "C" ct_status ct_gloo_comm_name_world_ranks(ct_gloo_comm *c, const int *granks, int world_size) {
    try {
        c->granks.assign(granks, granks + c->size);
        c->world_size = world_size;
        return CT_OK;
    } catch (const std::bad_alloc &) {
        return ct_error(CT_ERR_NOMEM, "gloo backend: rank names");
    }
}

void ct_gloo_comm_free(ct_gloo_comm *c) {
    try {
        if (c) c->ctx.reset();  // the pairs before the device they run on
        delete c;
    } catch (...) {  // closing sockets of a dead peer: nothing left to report to
    }
}
