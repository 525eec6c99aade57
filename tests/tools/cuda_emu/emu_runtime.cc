// The emulator's runtime (cuda_emu.h): a block's threads as host threads, barriers for
// __syncthreads, __syncwarp and the warp shuffles, dynamic shared memory, half conversions.
// Linked into emu_kernels (the kernel checks) and the emulated device (emu_device.cc).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <typeindex>
#include <vector>

#include "cuda_emu.h"
extern "C" {
#include "ctrain/tensor.h"
}

// ---- the emulator's runtime ----
thread_local uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim, gridDim;
float *ct_emu_dyn_smem;

namespace {
// a barrier over a changing number of threads: one that returns from the kernel leaves it
struct barrier {
    std::mutex m;
    std::condition_variable cv;
    int expected = 0, count = 0;
    long gen = 0;
    void wait() {
        std::unique_lock<std::mutex> lk(m);
        long g = gen;
        if (++count == expected) {
            count = 0;
            gen++;
            cv.notify_all();
        } else {
            cv.wait(lk, [&] { return gen != g; });
        }
    }
    void leave() {
        std::lock_guard<std::mutex> lk(m);
        expected--;
        if (count > 0 && count == expected) {
            count = 0;
            gen++;
            cv.notify_all();
        }
    }
};
barrier block_bar;
std::vector<barrier> warp_bar(32);
uint64_t slots[1024];
unsigned char xslots[1024][64];
std::vector<float> smem_buf;
unsigned tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
/* Launch sites whose kernel met no barrier (no __syncthreads, __syncwarp or shuffle) in the
 * first block of their first launch run their threads one after another on the caller's thread
 * from then on, much faster than a host thread each; should such a kernel meet a barrier later,
 * the run stops and says so. */
std::map<std::type_index, bool> met_barrier;
std::atomic<bool> barrier_seen;
bool sequential;
void barrier_met(const char *what) {
    if (sequential) {
        fprintf(stderr, "cuda_emu: a kernel that met no barrier on its first launch from this site met %s\n", what);
        abort();
    }
    barrier_seen = true;
}
/* The host threads of blocks that meet barriers: kept from block to block (starting a thread
 * for every CUDA thread of every block cost most of the emulation's time). Never destroyed:
 * its threads wait for the next block until the process exits. */
struct pool {
    std::mutex m;
    std::condition_variable start, done_cv;
    long gen = 0;
    unsigned nt = 0, done = 0;
    dim3 block;
    const std::function<void()> *body = nullptr;
    std::vector<std::thread> th;
    void run(unsigned t) {
        long seen = 0;
        std::unique_lock<std::mutex> lk(m);
        for (;;) {
            start.wait(lk, [&] { return gen != seen; });
            seen = gen;
            if (t >= nt) continue;
            const std::function<void()> *b = body;
            const dim3 bl = block;
            lk.unlock();
            threadIdx = {t % bl.x, t / bl.x % bl.y, t / (bl.x * bl.y)};
            (*b)();
            block_bar.leave();
            warp_bar[t / 32].leave();
            lk.lock();
            if (++done == nt) done_cv.notify_one();
        }
    }
    void run_block(unsigned n, dim3 bl, const std::function<void()> &f) {
        while (th.size() < n) {
            th.emplace_back([this, t = (unsigned)th.size()] { run(t); });
            th.back().detach();
        }
        std::unique_lock<std::mutex> lk(m);
        nt = n, done = 0, block = bl, body = &f;
        gen++;
        start.notify_all();
        done_cv.wait(lk, [&] { return done == nt; });
    }
};
pool *workers = new pool;
} // namespace

void __syncthreads(void) {
    barrier_met("__syncthreads");
    block_bar.wait();
}
void __syncwarp(unsigned) {
    barrier_met("__syncwarp");
    warp_bar[tid() / 32].wait();
}
void ct_emu_wmma_check(const void *p, unsigned ldm, size_t elem, const char *what) {
    if ((uintptr_t)p % 32 == 0 && (ldm * elem) % 16 == 0) return;
    fprintf(stderr, "wmma::%s: pointer %p (must be 32-byte aligned), ldm %u of %zu-byte elements (a multiple of 16 bytes)\n",
            what, p, ldm, elem);
    abort();
}
uint64_t ct_emu_shfl_xor(uint64_t bits, int o) {
    barrier_met("a warp shuffle");
    unsigned t = tid(), w = t / 32;
    slots[t] = bits;
    warp_bar[w].wait();
    uint64_t r = slots[(t & ~31u) | ((t & 31u) ^ (unsigned)o)];
    warp_bar[w].wait();
    return r;
}
void ct_emu_warp_exchange(const void *mine, size_t bytes, void *all) {
    barrier_met("a warp exchange (mma.sync, ldmatrix)");
    if (bytes > sizeof xslots[0]) abort();
    unsigned t = tid(), w = t / 32;
    memcpy(xslots[t], mine, bytes);
    warp_bar[w].wait();
    for (unsigned l = 0; l < 32; l++) memcpy((unsigned char *)all + l * bytes, xslots[(t & ~31u) | l], bytes);
    warp_bar[w].wait();
}

namespace {
struct cp_copy {
    void *dst;
    const void *src; /* NULL: zeros */
    int group;
};
thread_local std::vector<cp_copy> cp_pending;
thread_local int cp_groups;
void cp_land(const cp_copy &c) {
    if (c.src) memcpy(c.dst, c.src, 16);
    else memset(c.dst, 0, 16);
}
} // namespace
void ct_emu_cp_async16(void *dst, const void *src, bool valid) {
    if ((uintptr_t)dst % 16 || (valid && (uintptr_t)src % 16)) {
        fprintf(stderr, "cp.async: %p <- %p is not 16-byte aligned\n", dst, src);
        abort();
    }
    const cp_copy c = {dst, valid ? src : nullptr, cp_groups};
    if (getenv("CT_EMU_CP_EAGER")) cp_land(c);
    else cp_pending.push_back(c);
}
void ct_emu_cp_async_commit(void) { cp_groups++; }
void ct_emu_cp_async_wait(int n) {
    std::vector<cp_copy> left;
    for (const cp_copy &c : cp_pending) {
        if (c.group < cp_groups - n) cp_land(c);
        else left.push_back(c);
    }
    cp_pending.swap(left);
}

void ct_emu_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
    unsigned nt = block.x * block.y * block.z;
    if (nt > 1024) abort();
    smem_buf.assign(smem / sizeof(float) + 32, 0.0f);
    /* aligned as a GPU's shared memory is (the wmma loads need 32 bytes) */
    ct_emu_dyn_smem = (float *)(((uintptr_t)smem_buf.data() + 127) & ~(uintptr_t)127);
    gridDim = grid;
    blockDim = block;
    const std::type_index site(body.target_type());
    auto known = met_barrier.find(site);
    /* the blocks from `from` on (in x, y, z order), each thread after the other on this thread */
    auto run_sequential = [&](unsigned long from) {
        sequential = true;
        unsigned long i = 0;
        for (unsigned z = 0; z < grid.z; z++)
            for (unsigned y = 0; y < grid.y; y++)
                for (unsigned x = 0; x < grid.x; x++, i++) {
                    if (i < from) continue;
                    blockIdx = {x, y, z};
                    for (unsigned t = 0; t < nt; t++) {
                        threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
                        body();
                    }
                }
        sequential = false;
    };
    if (known != met_barrier.end() && !known->second) {
        run_sequential(0);
        return;
    }
    /* an unknown site's first block decides: with no barrier met there, the rest of the grid
     * runs sequentially too (a later block meeting one stops the run and says so) */
    barrier_seen = false;
    unsigned long i = 0;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++, i++) {
                if (i == 1 && known == met_barrier.end() && !barrier_seen) {
                    met_barrier[site] = false;
                    run_sequential(1);
                    return;
                }
                blockIdx = {x, y, z};
                block_bar.expected = (int)nt;
                for (unsigned w = 0; w < (nt + 31) / 32; w++) warp_bar[w].expected = (int)(nt - 32 * w < 32 ? nt - 32 * w : 32);
                workers->run_block(nt, block, body);
            }
    met_barrier[site] = barrier_seen;
}

float ct_emu_half_to_float(uint16_t h) {
    float f;
    ct_convert(&f, CT_F32, &h, CT_F16, 1);
    return f;
}
uint16_t ct_emu_float_to_half(float f) {
    uint16_t h;
    ct_convert(&h, CT_F16, &f, CT_F32, 1);
    return h;
}
