/* GEMMs on cuBLASLt, loaded with dlopen on first use: linked directly, cuBLASLt's
 * initialisation cost every process ~70 ms at start (measured: 20 starts of an empty
 * program linked to it took 1.34 s against 0.06 s with cudart alone), CPU-only runs and
 * every spawned worker included. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so
 * the call passes B first and swaps M and N; a bias over C's columns is then a bias over
 * C^T's rows, which is what cuBLASLt's BIAS epilogues add. One handle and one 32 MiB
 * workspace (from the caching allocator) per device, created on first use; descriptors
 * are built per call (microseconds), the heuristic's algorithm is cached per problem
 * (shape, transposes, epilogue, compute type, operand alignment). */
#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "ctrain/config.h"
#include "cuda/check.h"
#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

#define MAX_DEV 64
#define WORKSPACE ((size_t)32 << 20)

/* the cuBLASLt functions used, through pointers of their declared types */
#define LT_FNS(X)                                                                                                  \
    X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetVersion) X(cublasLtGetStatusString)                          \
    X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutSetAttribute) X(cublasLtMatrixLayoutDestroy)               \
    X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulDescDestroy)                     \
    X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulPreferenceDestroy)   \
    X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)
#define LT_FIELD(f) __typeof__(&f) f;
static struct { LT_FNS(LT_FIELD) } lt;
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static char lt_err[512];
#define STR_(x) #x
#define STR(x) STR_(x)
static void lt_load(void) {
    const char *name = "libcublasLt.so." STR(CUBLAS_VER_MAJOR);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", CT_CUDA_LIBDIR, name);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(lt_err, sizeof lt_err, "cannot load %s: %s", name, dlerror());
        return;
    }
#define LT_SYM(f)                                                                                                  \
    if (!(lt.f = (__typeof__(lt.f))dlsym(h, #f)) && !lt_err[0]) snprintf(lt_err, sizeof lt_err, "%s: no %s", name, #f);
    LT_FNS(LT_SYM)
}
/* CT_OK once cuBLASLt is loaded; else CT_ERR_UNSUPPORTED saying why */
static ct_status lt_ready(void) {
    pthread_once(&lt_once, lt_load);
    return lt_err[0] ? ct_error(CT_ERR_UNSUPPORTED, "cuda gemm: %s", lt_err) : CT_OK;
}
size_t ct_cuda_cublaslt_version(void) { return lt_ready() == CT_OK ? lt.cublasLtGetVersion() : 0; }

/* CT_GPU_CHECK(cublas, ...) (check.h): the status's text from the loaded library */
ct_status ct_gpu_check_cublas(int code, const char *call, const char *op) {
    cublasStatus_t e = (cublasStatus_t)code;
    if (e == CUBLAS_STATUS_SUCCESS) return CT_OK;
    char dev[32];
    ct_cuda_dev_str(dev, sizeof dev);
    ct_status st = e == CUBLAS_STATUS_ALLOC_FAILED                                         ? CT_ERR_NOMEM
                   : (e == CUBLAS_STATUS_NOT_SUPPORTED || e == CUBLAS_STATUS_ARCH_MISMATCH) ? CT_ERR_UNSUPPORTED
                   : e == CUBLAS_STATUS_INVALID_VALUE                                       ? CT_ERR_INVALID
                                                                                            : CT_ERR_SYSTEM;
    return ct_error(st, "%s on %s: %s failed: %s", op, dev, call,
                    lt_ready() == CT_OK ? lt.cublasLtGetStatusString(e) : "cuBLAS error");
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t handles[MAX_DEV];
static void *workspaces[MAX_DEV];

static ct_status handle_of(int dev, cublasLtHandle_t *h, void **ws) {
    if (dev < 0 || dev >= MAX_DEV) return ct_error(CT_ERR_INVALID, "cuda gemm: device %d out of range", dev);
    ct_status st = CT_OK;
    pthread_mutex_lock(&mu);
    if (!handles[dev]) {
        st = ct_cuda_alloc(dev, WORKSPACE, &workspaces[dev]);
        if (st == CT_OK) st = CT_GPU_CHECK(cublas, "gemm", lt.cublasLtCreate(&handles[dev]));
        if (st != CT_OK) {
            ct_cuda_free(workspaces[dev]);
            workspaces[dev] = NULL;
            handles[dev] = NULL;
        }
    }
    *h = handles[dev];
    *ws = workspaces[dev];
    pthread_mutex_unlock(&mu);
    return st;
}

void ct_cuda_gemm_shutdown(void) {
    pthread_mutex_lock(&mu);
    for (int d = 0; d < MAX_DEV; d++) {
        if (handles[d]) (void)CT_GPU_CHECK(cublas, "gemm shutdown", lt.cublasLtDestroy(handles[d]));
        ct_cuda_free(workspaces[d]);
        handles[d] = NULL;
        workspaces[d] = NULL;
    }
    pthread_mutex_unlock(&mu);
}

/* column-major layout of a rows x cols matrix (ld = rows), batched at one matrix per step */
static ct_status layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t batch) {
    CT_GPU_TRY(cublas, "gemm", lt.cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, rows));
    if (batch > 1) {
        int32_t b = (int32_t)batch;
        int64_t stride = rows * cols;
        CT_GPU_TRY(cublas, "gemm", lt.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b));
        CT_GPU_TRY(cublas, "gemm",
                   lt.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
    return CT_OK;
}

/* ---- the heuristic's choice, per problem: asking cuBLASLt on every call costs host time
 * that a step of small GEMMs notices; the answer depends only on what the key holds ---- */
typedef struct {
    int dev, dt, compute, ta, tb, epi, c_f32;
    int64_t M, N, K, batch;
    uint32_t align[3]; /* cuBLASLt's A (our B), B (our A), C */
} algo_key;
#define CACHE 1024
static struct {
    bool used;
    algo_key k;
    cublasLtMatmulAlgo_t algo;
} cache[CACHE];
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;

static uint32_t align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}
static uint64_t key_hash(const algo_key *k) {
    uint64_t h = 1469598103934665603ull;
    const int64_t v[14] = {k->dev, k->dt, k->compute, k->ta, k->tb, k->epi, k->M, k->N, k->K, k->batch, k->align[0],
                           k->align[1], k->align[2], k->c_f32};
    for (int i = 0; i < 14; i++) h = (h ^ (uint64_t)v[i]) * 1099511628211ull;
    return h;
}
static bool key_eq(const algo_key *a, const algo_key *b) {
    return a->dev == b->dev && a->dt == b->dt && a->compute == b->compute && a->ta == b->ta && a->tb == b->tb &&
           a->epi == b->epi && a->M == b->M && a->N == b->N && a->K == b->K && a->batch == b->batch &&
           a->align[0] == b->align[0] && a->align[1] == b->align[1] && a->align[2] == b->align[2] && a->c_f32 == b->c_f32;
}
/* linear probing over a fixed table; when it is full, new problems are simply not cached */
static bool cache_get(const algo_key *k, cublasLtMatmulAlgo_t *out) {
    bool hit = false;
    pthread_mutex_lock(&cache_mu);
    for (uint64_t i = key_hash(k) % CACHE, n = 0; n < CACHE && cache[i].used; i = (i + 1) % CACHE, n++)
        if (key_eq(&cache[i].k, k)) {
            *out = cache[i].algo;
            hit = true;
            break;
        }
    pthread_mutex_unlock(&cache_mu);
    return hit;
}
static void cache_put(const algo_key *k, const cublasLtMatmulAlgo_t *algo) {
    pthread_mutex_lock(&cache_mu);
    for (uint64_t i = key_hash(k) % CACHE, n = 0; n < CACHE; i = (i + 1) % CACHE, n++)
        if (!cache[i].used) {
            cache[i].used = true;
            cache[i].k = *k;
            cache[i].algo = *algo;
            break;
        }
    pthread_mutex_unlock(&cache_mu);
}

/* the operands' cuBLAS type, and the problem's name in messages */
static cudaDataType_t data_type(ct_cuda_dtype dt) {
    return dt == CT_CUDA_BF16 ? CUDA_R_16BF : dt == CT_CUDA_F16 ? CUDA_R_16F : CUDA_R_32F;
}
static const char *type_name(const ct_cuda_gemm_desc *d) {
    if (d->dt == CT_CUDA_BF16) return d->c_f32 ? "bf16->f32" : "bf16";
    if (d->dt == CT_CUDA_F16) return d->c_f32 ? "f16->f32" : "f16";
    return "f32";
}

/* the three layouts are created in *l (freed by the caller, also on failure) */
static ct_status run(cublasLtHandle_t h, void *ws, cudaStream_t s, int dev, cublasComputeType_t compute,
                     const ct_cuda_gemm_desc *d, const void *A, const void *B, void *C, cublasLtMatmulDesc_t op,
                     cublasLtMatrixLayout_t *l) {
    cudaDataType_t t = data_type(d->dt), tc = d->c_f32 ? CUDA_R_32F : t;
    /* column-major operands: first B^T-ish (N x K), then A (K x M); transposes flip */
    cublasOperation_t opa = d->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = d->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CT_GPU_TRY(cublas, "gemm", lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CT_GPU_TRY(cublas, "gemm", lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    cublasLtEpilogue_t epi = d->epi == CT_GEMM_EPI_BIAS        ? CUBLASLT_EPILOGUE_BIAS
                             : d->epi == CT_GEMM_EPI_GELU      ? CUBLASLT_EPILOGUE_GELU
                             : d->epi == CT_GEMM_EPI_BIAS_GELU ? CUBLASLT_EPILOGUE_GELU_BIAS
                                                               : CUBLASLT_EPILOGUE_DEFAULT;
    CT_GPU_TRY(cublas, "gemm", lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (d->epi == CT_GEMM_EPI_BIAS || d->epi == CT_GEMM_EPI_BIAS_GELU) {
        if (!d->bias) return ct_error(CT_ERR_INVALID, "cuda gemm: a bias epilogue without a bias");
        CT_GPU_TRY(cublas, "gemm", lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &d->bias, sizeof d->bias));
        CT_GPU_TRY(cublas, "gemm", lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &tc, sizeof tc));
    }
    ct_status st = layout(&l[0], t, d->tb ? d->K : d->N, d->tb ? d->N : d->K, d->batch);
    if (st == CT_OK) st = layout(&l[1], t, d->ta ? d->M : d->K, d->ta ? d->K : d->M, d->batch);
    if (st == CT_OK) st = layout(&l[2], tc, d->N, d->M, d->batch);
    if (st != CT_OK) return st;
    cublasLtMatrixLayout_t la = l[0], lb = l[1], lc = l[2];
    /* cuBLASLt's operand A is our B, its B our A */
    algo_key key = {.dev = dev, .dt = d->dt, .compute = compute, .ta = d->ta, .tb = d->tb, .epi = d->epi, .c_f32 = d->c_f32,
                    .M = d->M, .N = d->N, .K = d->K, .batch = d->batch, .align = {align_of(B), align_of(A), align_of(C)}};
    cublasLtMatmulAlgo_t algo;
    if (!cache_get(&key, &algo)) {
        cublasLtMatmulPreference_t pref;
        CT_GPU_TRY(cublas, "gemm", lt.cublasLtMatmulPreferenceCreate(&pref));
        size_t wsb = WORKSPACE;
        st = CT_GPU_CHECK(cublas, "gemm",
                          lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
        /* the operands' real alignment: the default (256 bytes) would let the heuristic pick an
         * algorithm that a view's offset pointer cannot run */
        const cublasLtMatmulPreferenceAttributes_t at[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4 && st == CT_OK; i++) {
            uint32_t a = key.align[i < 3 ? i : 2];
            st = CT_GPU_CHECK(cublas, "gemm", lt.cublasLtMatmulPreferenceSetAttribute(pref, at[i], &a, sizeof a));
        }
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        if (st == CT_OK)
            st = CT_GPU_CHECK(cublas, "gemm", lt.cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &found));
        (void)lt.cublasLtMatmulPreferenceDestroy(pref);
        if (st != CT_OK) return st;
        if (found == 0)
            return ct_error(CT_ERR_UNSUPPORTED,
                            "cuda gemm: cuBLASLt has no algorithm for %s %lldx%lldx%lld (batch %lld, epilogue %d, alignment %u/%u/%u)",
                            type_name(d), (long long)d->M, (long long)d->N, (long long)d->K, (long long)d->batch,
                            (int)d->epi, key.align[0], key.align[1], key.align[2]);
        algo = res.algo;
        cache_put(&key, &algo);
    }
    return CT_GPU_CHECK(cublas, "gemm",
                        lt.cublasLtMatmul(h, op, &d->alpha, B, la, A, lb, &d->beta, C, lc, C, lc, &algo, ws, WORKSPACE, s));
}

/* f32 operands on tensor cores only when CTRAIN_CUDA_MATMUL asks (PyTorch's
 * float32_matmul_precision): TF32 keeps 10 mantissa bits, bf16 7; bf16 and f16 operands always
 * run on tensor cores with f32 accumulation (f16 sums would round coarsely and overflow past
 * 65504). */
static cublasComputeType_t compute_type(ct_cuda_dtype dt) {
    if (dt == CT_CUDA_BF16 || dt == CT_CUDA_F16) return CUBLAS_COMPUTE_32F;
    int c = ct_config_choice(CT_CFG_CUDA_MATMUL);
    return c == 1 ? CUBLAS_COMPUTE_32F_FAST_TF32 : c == 2 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
}

ct_status ct_cuda_gemm(cudaStream_t s, int dev, const ct_cuda_gemm_desc *d, const void *A, const void *B, void *C) {
    if (d->M <= 0 || d->N <= 0 || d->batch <= 0) return CT_OK;
    if (d->dt != CT_CUDA_F32 && d->dt != CT_CUDA_BF16 && d->dt != CT_CUDA_F16)
        return ct_error(CT_ERR_INVALID, "cuda gemm: unknown dtype %d", (int)d->dt);
    if (d->K < 0 || d->batch > INT32_MAX)
        return ct_error(CT_ERR_INVALID, "cuda gemm: bad sizes %lldx%lldx%lld batch %lld", (long long)d->M, (long long)d->N,
                        (long long)d->K, (long long)d->batch);
    cublasLtHandle_t h = NULL;
    void *ws = NULL;
    ct_status st = lt_ready();
    if (st == CT_OK) st = handle_of(dev, &h, &ws);
    if (st != CT_OK) return st;
    cublasLtMatmulDesc_t op;
    const cublasComputeType_t compute = compute_type(d->dt);
    CT_GPU_TRY(cublas, "gemm", lt.cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
    cublasLtMatrixLayout_t l[3] = {NULL, NULL, NULL};
    st = run(h, ws, s, dev, compute, d, A, B, C, op, l);
    for (int i = 0; i < 3; i++)
        if (l[i]) (void)lt.cublasLtMatrixLayoutDestroy(l[i]);
    (void)lt.cublasLtMatmulDescDestroy(op);
    return st;
}
