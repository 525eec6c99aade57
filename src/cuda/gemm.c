/* GEMMs on cuBLASLt, loaded with dlopen on first use: linked directly, cuBLASLt's
 * initialisation cost every process ~70 ms at start (measured: 20 starts of an empty
 * program linked to it took 1.34 s against 0.06 s with cudart alone), CPU-only runs and
 * every spawned worker included. Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so
 * the call passes B first and swaps M and N; a bias over C's columns is then a bias over
 * C^T's rows, which is what cuBLASLt's BIAS epilogues add. One handle and one 32 MiB
 * workspace (from the caching allocator) per device, created on first use; descriptors
 * are built per call (microseconds, against GEMMs of milliseconds). */
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
const char *ct_cuda_cublaslt_status(int code) {
    return lt_ready() == CT_OK ? lt.cublasLtGetStatusString((cublasStatus_t)code) : "cuBLAS error";
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

/* the three layouts are created in *l (freed by the caller, also on failure) */
static ct_status run(cublasLtHandle_t h, void *ws, cudaStream_t s, const ct_cuda_gemm_desc *d, const void *A, const void *B,
                     void *C, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t *l) {
    cudaDataType_t t = d->dt == CT_CUDA_BF16 ? CUDA_R_16BF : CUDA_R_32F;
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
        CT_GPU_TRY(cublas, "gemm", lt.cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t));
    }
    ct_status st = layout(&l[0], t, d->tb ? d->K : d->N, d->tb ? d->N : d->K, d->batch);
    if (st == CT_OK) st = layout(&l[1], t, d->ta ? d->M : d->K, d->ta ? d->K : d->M, d->batch);
    if (st == CT_OK) st = layout(&l[2], t, d->N, d->M, d->batch);
    if (st != CT_OK) return st;
    cublasLtMatrixLayout_t la = l[0], lb = l[1], lc = l[2];
    cublasLtMatmulPreference_t pref;
    CT_GPU_TRY(cublas, "gemm", lt.cublasLtMatmulPreferenceCreate(&pref));
    size_t wsb = WORKSPACE;
    st = CT_GPU_CHECK(cublas, "gemm",
                                lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (st == CT_OK)
        st = CT_GPU_CHECK(cublas, "gemm", lt.cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &found));
    (void)lt.cublasLtMatmulPreferenceDestroy(pref);
    if (st != CT_OK) return st;
    if (found == 0)
        return ct_error(CT_ERR_UNSUPPORTED, "cuda gemm: cuBLASLt has no algorithm for %s %lldx%lldx%lld (batch %lld, epilogue %d)",
                        d->dt == CT_CUDA_BF16 ? "bf16" : "f32", (long long)d->M, (long long)d->N, (long long)d->K,
                        (long long)d->batch, (int)d->epi);
    return CT_GPU_CHECK(cublas, "gemm",
                        lt.cublasLtMatmul(h, op, &d->alpha, B, la, A, lb, &d->beta, C, lc, C, lc, &res.algo, ws, WORKSPACE, s));
}

/* f32 operands on tensor cores only when CTRAIN_CUDA_MATMUL asks (PyTorch's
 * float32_matmul_precision): TF32 keeps 10 mantissa bits, bf16 7; bf16 operands always run on
 * tensor cores with f32 accumulation. */
static cublasComputeType_t compute_type(ct_cuda_dtype dt) {
    if (dt == CT_CUDA_BF16) return CUBLAS_COMPUTE_32F;
    int c = ct_config_choice(CT_CFG_CUDA_MATMUL);
    return c == 1 ? CUBLAS_COMPUTE_32F_FAST_TF32 : c == 2 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
}

ct_status ct_cuda_gemm(cudaStream_t s, int dev, const ct_cuda_gemm_desc *d, const void *A, const void *B, void *C) {
    if (d->M <= 0 || d->N <= 0 || d->batch <= 0) return CT_OK;
    if (d->K < 0 || d->batch > INT32_MAX)
        return ct_error(CT_ERR_INVALID, "cuda gemm: bad sizes %lldx%lldx%lld batch %lld", (long long)d->M, (long long)d->N,
                        (long long)d->K, (long long)d->batch);
    cublasLtHandle_t h = NULL;
    void *ws = NULL;
    ct_status st = lt_ready();
    if (st == CT_OK) st = handle_of(dev, &h, &ws);
    if (st != CT_OK) return st;
    cublasLtMatmulDesc_t op;
    CT_GPU_TRY(cublas, "gemm", lt.cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatrixLayout_t l[3] = {NULL, NULL, NULL};
    st = run(h, ws, s, d, A, B, C, op, l);
    for (int i = 0; i < 3; i++)
        if (l[i]) (void)lt.cublasLtMatrixLayoutDestroy(l[i]);
    (void)lt.cublasLtMatmulDescDestroy(op);
    return st;
}
