/* The caching device allocator (cuda.h): blocks from cudaMalloc are kept after
 * ct_cuda_free and reused, so a training loop that allocates the same sizes every step
 * calls cudaMalloc only during its first step. Sizes are rounded up (512 B below 1 MiB,
 * 2 MiB above) to make reuse likely; free blocks sit in power-of-two bins per device, and
 * a request takes the smallest cached block of at least its size and at most twice it.
 * Live blocks are found on free through a pointer hash. One mutex: allocation is not on a
 * hot path once the cache is warm (a few hundred calls per step). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda/check.h"
#include "cuda/cuda.h"

#define MAX_DEV 64
#define NBIN 48
#define NHASH 4096

typedef struct block {
    void *p;
    size_t size;
    int dev;
    struct block *next; /* in a bin's free list or a hash chain */
} block;

typedef struct {
    block *bins[NBIN];
    ct_cuda_mem_stats st;
} devstate;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static devstate devs[MAX_DEV];
static block *live[NHASH];

static size_t round_size(size_t n) {
    if (n == 0) n = 1;
    size_t q = n < ((size_t)1 << 20) ? 512 : (size_t)2 << 20;
    return (n + q - 1) / q * q;
}
static int bin_of(size_t n) {
    int b = 0;
    while (b < NBIN - 1 && ((size_t)1 << (b + 1)) <= n) b++;
    return b;
}
static unsigned hash_of(const void *p) { return (unsigned)(((uintptr_t)p >> 9) * 2654435761u) % NHASH; }

/* the smallest free block in [n, 2n] of dev, unlinked; NULL if none */
static block *take_cached(devstate *d, size_t n) {
    block *best = NULL, **bestp = NULL;
    for (int b = bin_of(n); b < NBIN && b <= bin_of(2 * n); b++)
        for (block **pp = &d->bins[b]; *pp; pp = &(*pp)->next)
            if ((*pp)->size >= n && (*pp)->size <= 2 * n && (!best || (*pp)->size < best->size)) {
                best = *pp;
                bestp = pp;
            }
    if (best) *bestp = best->next;
    return best;
}

static void release_cache(int dev) {
    devstate *d = &devs[dev];
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) return;
    if (cudaSetDevice(dev) != cudaSuccess) return;
    for (int b = 0; b < NBIN; b++) {
        while (d->bins[b]) {
            block *k = d->bins[b];
            d->bins[b] = k->next;
            (void)CT_GPU_CHECK(cuda, "empty cache", cudaFree(k->p)); /* a failure here is logged, the block dropped */
            d->st.reserved -= k->size;
            free(k);
        }
    }
    (void)cudaSetDevice(prev);
}

ct_status ct_cuda_alloc(int dev, size_t bytes, void **out) {
    *out = NULL;
    if (dev < 0 || dev >= MAX_DEV) return ct_error(CT_ERR_INVALID, "cuda alloc: device %d out of range", dev);
    size_t n = round_size(bytes);
    pthread_mutex_lock(&mu);
    devstate *d = &devs[dev];
    block *k = take_cached(d, n);
    ct_status st = CT_OK;
    if (!k) {
        k = malloc(sizeof *k);
        if (!k) {
            pthread_mutex_unlock(&mu);
            return ct_error(CT_ERR_NOMEM, "cuda alloc: out of host memory");
        }
        int prev = 0;
        st = CT_GPU_CHECK(cuda, "alloc", cudaGetDevice(&prev));
        if (st == CT_OK) st = CT_GPU_CHECK(cuda, "alloc", cudaSetDevice(dev));
        if (st == CT_OK) {
            cudaError_t e = cudaMalloc(&k->p, n);
            if (e == cudaErrorMemoryAllocation) { /* give the cache back and try once more */
                (void)cudaGetLastError();
                release_cache(dev);
                e = cudaMalloc(&k->p, n);
            }
            st = ct_gpu_check_cuda(e, "cudaMalloc", "alloc"); /* names the call, not the variable */
            (void)cudaSetDevice(prev);
        }
        if (st != CT_OK) {
            free(k);
            pthread_mutex_unlock(&mu);
            return st == CT_ERR_NOMEM ? ct_error(st, "%s (%zu bytes asked, %zu in use, %zu reserved)", ct_last_error(), bytes,
                                                 d->st.current, d->st.reserved)
                                      : st;
        }
        k->size = n;
        k->dev = dev;
        d->st.reserved += n;
        d->st.mallocs++;
    }
    d->st.current += k->size;
    if (d->st.current > d->st.peak) d->st.peak = d->st.current;
    unsigned h = hash_of(k->p);
    k->next = live[h];
    live[h] = k;
    *out = k->p;
    pthread_mutex_unlock(&mu);
    return CT_OK;
}

void ct_cuda_free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&mu);
    unsigned h = hash_of(p);
    block *k = NULL;
    for (block **pp = &live[h]; *pp; pp = &(*pp)->next)
        if ((*pp)->p == p) {
            k = *pp;
            *pp = k->next;
            break;
        }
    if (!k) {
        pthread_mutex_unlock(&mu);
        CT_FATAL("ct_cuda_free: %p was not allocated by ct_cuda_alloc (or freed twice)", p);
    }
    devstate *d = &devs[k->dev];
    d->st.current -= k->size;
    int b = bin_of(k->size);
    k->next = d->bins[b];
    d->bins[b] = k;
    pthread_mutex_unlock(&mu);
}

void ct_cuda_mem_stats_get(int dev, ct_cuda_mem_stats *s) {
    pthread_mutex_lock(&mu);
    *s = dev >= 0 && dev < MAX_DEV ? devs[dev].st : (ct_cuda_mem_stats){0, 0, 0, 0};
    pthread_mutex_unlock(&mu);
}

void ct_cuda_mem_mapped_(int dev, int64_t delta) {
    if (dev < 0 || dev >= MAX_DEV) return;
    pthread_mutex_lock(&mu);
    devstate *d = &devs[dev];
    d->st.current = (size_t)((int64_t)d->st.current + delta);
    d->st.reserved = (size_t)((int64_t)d->st.reserved + delta);
    if (d->st.current > d->st.peak) d->st.peak = d->st.current;
    pthread_mutex_unlock(&mu);
}

void ct_cuda_mem_reset_peak(int dev) {
    if (dev < 0 || dev >= MAX_DEV) return;
    pthread_mutex_lock(&mu);
    devs[dev].st.peak = devs[dev].st.current;
    pthread_mutex_unlock(&mu);
}

void ct_cuda_empty_cache(int dev) {
    if (dev < 0 || dev >= MAX_DEV) return;
    pthread_mutex_lock(&mu);
    release_cache(dev);
    pthread_mutex_unlock(&mu);
}
