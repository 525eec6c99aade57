/* cuDNN, loaded with dlopen on first use (see cudnn_lib.h); one handle per device on its
 * compute stream, and one workspace per device from the caching allocator, grown to the
 * largest request so far. Errors go through CT_GPU_CHECK(cudnn, ...), defined here: its text
 * comes from cudnnGetErrorString. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"
#include "cuda/cudnn_lib.h"

#define MAX_DEV 64
#define STR_(x) #x
#define STR(x) STR_(x)
#define SONAME "libcudnn.so." STR(CUDNN_MAJOR)

ct_cudnn_fns ct_cudnn;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static ct_status load_st = CT_OK;
static char load_err[600];

ct_status ct_cudnn_load_from(const char *soname, ct_cudnn_fns *f, const char *op) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", CT_CUDA_LIBDIR, soname);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        return ct_error(CT_ERR_UNSUPPORTED, "%s: cuDNN: cannot load %s: %s", op, soname, why ? why : "not found");
    }
#define CT_CUDNN_SYM(fn)                                                                                               \
    if (!(f->fn = (__typeof__(f->fn))dlsym(h, #fn)))                                                                    \
        return ct_error(CT_ERR_UNSUPPORTED, "%s: cuDNN: %s has no %s (cuDNN %d or newer needed)", op, soname, #fn,      \
                        CUDNN_MAJOR);
    CT_CUDNN_FNS(CT_CUDNN_SYM)
#undef CT_CUDNN_SYM
    return CT_OK;
}

static void load(void) {
    load_st = ct_cudnn_load_from(SONAME, &ct_cudnn, "cudnn");
    if (load_st != CT_OK) snprintf(load_err, sizeof load_err, "%s", ct_last_error());
}

ct_status ct_cudnn_ready(const char *op) {
    pthread_once(&once, load);
    /* the message of the first failure (load's "cudnn: ..."), renamed to this op */
    return load_st == CT_OK ? CT_OK : ct_error(load_st, "%s: %s", op, load_err + strlen("cudnn: "));
}

size_t ct_cuda_cudnn_version(void) { return ct_cudnn_ready("cudnn") == CT_OK ? ct_cudnn.cudnnGetVersion() : 0; }
const char *ct_cuda_cudnn_load_error(void) { return ct_cudnn_ready("cudnn") == CT_OK ? NULL : load_err + strlen("cudnn: "); }

/* CT_GPU_CHECK(cudnn, ...) (check.h): the status's text from the loaded library */
ct_status ct_gpu_check_cudnn(int code, const char *call, const char *op) {
    cudnnStatus_t e = (cudnnStatus_t)code;
    if (e == CUDNN_STATUS_SUCCESS) return CT_OK;
    char dev[32];
    ct_cuda_dev_str(dev, sizeof dev);
    /* cuDNN 9 groups its codes by thousands: 2xxx bad parameter, 3xxx not supported */
    ct_status st = (e == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED || e == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
                       ? CT_ERR_NOMEM
                   : code / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000 ? CT_ERR_UNSUPPORTED
                   : code / 1000 == CUDNN_STATUS_BAD_PARAM / 1000     ? CT_ERR_INVALID
                                                                      : CT_ERR_SYSTEM;
    return ct_error(st, "%s on %s: %s failed: %s (%d)", op, dev, call,
                    ct_cudnn_ready("cudnn") == CT_OK ? ct_cudnn.cudnnGetErrorString(e) : "cuDNN error", code);
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct { cudnnHandle_t h; void *ws; size_t ws_bytes; } per_dev[MAX_DEV];

ct_status ct_cudnn_handle(int dev, cudaStream_t s, size_t bytes, cudnnHandle_t *h, void **ws, const char *op) {
    *h = NULL;
    *ws = NULL;
    ct_status st = ct_cudnn_ready(op);
    if (st != CT_OK) return st;
    if (dev < 0 || dev >= MAX_DEV) return ct_error(CT_ERR_INVALID, "%s: cuDNN: device %d out of range", op, dev);
    pthread_mutex_lock(&mu);
    if (!per_dev[dev].h) {
        st = CT_GPU_CHECK(cudnn, op, ct_cudnn.cudnnCreate(&per_dev[dev].h));
        if (st == CT_OK) st = CT_GPU_CHECK(cudnn, op, ct_cudnn.cudnnSetStream(per_dev[dev].h, s));
        if (st != CT_OK && per_dev[dev].h) {
            (void)ct_cudnn.cudnnDestroy(per_dev[dev].h);
            per_dev[dev].h = NULL;
        }
    }
    if (st == CT_OK && bytes > per_dev[dev].ws_bytes) {
        /* blocks are stream-ordered on the compute stream: kernels queued on the old one run
         * before anything that reuses it */
        ct_cuda_free(per_dev[dev].ws);
        per_dev[dev].ws = NULL;
        per_dev[dev].ws_bytes = 0;
        st = ct_cuda_alloc(dev, bytes, &per_dev[dev].ws);
        if (st == CT_OK) per_dev[dev].ws_bytes = bytes;
    }
    *h = per_dev[dev].h;
    *ws = per_dev[dev].ws;
    pthread_mutex_unlock(&mu);
    return st;
}

void ct_cuda_cudnn_shutdown(void) {
    pthread_mutex_lock(&mu);
    for (int d = 0; d < MAX_DEV; d++) {
        if (per_dev[d].h) (void)CT_GPU_CHECK(cudnn, "cudnn shutdown", ct_cudnn.cudnnDestroy(per_dev[d].h));
        ct_cuda_free(per_dev[d].ws);
        memset(&per_dev[d], 0, sizeof per_dev[d]);
    }
    pthread_mutex_unlock(&mu);
}
