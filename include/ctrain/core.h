/* ctrain/core.h — statuses, errors, logging, dtypes. Everything else builds on this.
 *
 *   ct_status st = ct_safetensors_load(model, "w.safetensors");
 *   if (st != CT_OK) {
 *       fprintf(stderr, "load failed: %s: %s\n", ct_status_str(st), ct_last_error());
 *       return 1;
 *   }
 *   CT_LOG_INFO("store", "rank %d joined", rank);     // shown with CTRAIN_DEBUG=INFO
 *
 * Two kinds of failure:
 *  - anything the environment can break (files, peers, timeouts, memory) returns a ct_status;
 *    the message of the latest failure on this thread is in ct_last_error();
 *  - programmer errors (shape mismatch, bad argument) stop the process with file:line and
 *    the offending shapes through CT_CHECK / ct_fatal. The library never calls exit().
 */
#ifndef CTRAIN_CORE_H
#define CTRAIN_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CT_VERSION_MAJOR 0
#define CT_VERSION_MINOR 1
#define CT_VERSION_PATCH 0
#define CT_VERSION_STRING "0.1.0"

typedef enum ct_status {
    CT_OK = 0,
    CT_ERR_INVALID,     /* bad argument, flag or environment variable value */
    CT_ERR_IO,          /* open/read/write/fsync failed */
    CT_ERR_FORMAT,      /* a file or message is malformed */
    CT_ERR_NOMEM,       /* allocation failed */
    CT_ERR_TIMEOUT,     /* a wait ran past its deadline */
    CT_ERR_PEER,        /* a peer died, disconnected or disagreed */
    CT_ERR_MISMATCH,    /* ranks disagree (desync, shapes, fingerprints) */
    CT_ERR_UNSUPPORTED, /* feature not compiled in or not available here */
    CT_ERR_SYSTEM,      /* other OS error (errno in message) */
    CT_ERR_NOT_FOUND,   /* key, file, tensor name not found */
    CT_ERR_COUNT_
} ct_status;

/* Short fixed name of a status ("timeout", "io error", ...). */
const char *ct_status_str(ct_status st);
/* Message of the last failure recorded on this thread ("" if none). */
const char *ct_last_error(void);
/* Record a failure message (printf-style) and return st, so callers can write
 * `return ct_error(CT_ERR_IO, "%s: %s", path, strerror(errno));` */
ct_status ct_error(ct_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ct_clear_error(void);

/* ---- logging: CTRAIN_DEBUG=WARN|INFO|TRACE, CTRAIN_DEBUG_SUBSYS=store,shm,... ---- */
typedef enum { CT_LOG_ERROR = 0, CT_LOG_WARN = 1, CT_LOG_INFO = 2, CT_LOG_TRACE = 3 } ct_log_level;
int ct_log_enabled(ct_log_level lvl, const char *subsys);
void ct_log(ct_log_level lvl, const char *subsys, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Rank shown in log prefixes; -1 = not distributed. Set by ct_dist_init. */
void ct_log_set_rank(int rank);

#define CT_LOG_WARN_(sub, ...) ct_log(CT_LOG_WARN, sub, __VA_ARGS__)
#define CT_LOG_INFO(sub, ...) do { if (ct_log_enabled(CT_LOG_INFO, sub)) ct_log(CT_LOG_INFO, sub, __VA_ARGS__); } while (0)
#define CT_LOG_TRACE(sub, ...) do { if (ct_log_enabled(CT_LOG_TRACE, sub)) ct_log(CT_LOG_TRACE, sub, __VA_ARGS__); } while (0)

/* ---- programmer errors: print file:line and message, then abort() ---- */
void ct_fatal(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
#define CT_FATAL(...) ct_fatal(__FILE__, __LINE__, __VA_ARGS__)
#define CT_CHECK(cond, ...) do { if (!(cond)) ct_fatal(__FILE__, __LINE__, __VA_ARGS__); } while (0)

/* ---- dtypes ---- */
typedef enum ct_dtype {
    CT_F32 = 0, CT_F16, CT_BF16, CT_F64, CT_I32, CT_I64, CT_U8, CT_I8, CT_DTYPE_COUNT_
} ct_dtype;

size_t ct_dtype_size(ct_dtype dt);
const char *ct_dtype_name(ct_dtype dt);            /* "f32", "bf16", ... */
const char *ct_dtype_safetensors_name(ct_dtype dt); /* "F32", "BF16", ... */
/* Parse "f32"/"float32"/"F32"... Returns CT_ERR_INVALID on unknown names. */
ct_status ct_dtype_parse(const char *s, ct_dtype *out);
bool ct_dtype_is_float(ct_dtype dt);

/* Scalar conversions, round-to-nearest-even (as PyTorch). */
uint16_t ct_f32_to_f16(float f);
float ct_f16_to_f32(uint16_t h);
uint16_t ct_f32_to_bf16(float f);
float ct_bf16_to_f32(uint16_t h);
/* Element i of a buffer of any dtype, read as or written from a double (exact for every
 * dtype but i64 beyond 2^53; f16/bf16 round to nearest even on write). */
double ct_elem_get(const void *p, ct_dtype dt, size_t i);
void ct_elem_set(void *p, ct_dtype dt, size_t i, double v);
/* Bulk conversions between any two dtypes (floats through f32/f64; ints saturate-free C casts).
 * Uses F16C / AVX-512 BF16 where the CPU has it. */
void ct_convert(void *dst, ct_dtype dst_dt, const void *src, ct_dtype src_dt, size_t n);

/* ---- threads and machine facts ---- */
/* Threads for kernels (OpenMP) and the BLAS, set together so they never fight. Also
 * reserves the GEMM packing buffers for n threads (ct_ctx_create reserves them for the
 * current count and fails with CT_ERR_NOMEM when it cannot); short of memory here, GEMMs
 * run on fewer threads, with the same results. */
void ct_set_num_threads(int n);
int ct_get_num_threads(void);
/* The most threads ct_set_num_threads gives (it uses this many when asked for more, with a
 * warning): OpenBLAS reserves a 128 MiB buffer per thread and retries a failed reservation
 * forever, so under an address-space limit (ulimit -v) too many threads would spin without
 * end; the bound keeps the buffers within the room the limit leaves (1 GiB kept for the rest).
 * CT_MAX_THREADS without a limit. When below that, why (if non-NULL) gets the reason. */
#define CT_MAX_THREADS 1024
int ct_max_num_threads(char *why, size_t cap);
/* OMP_NUM_THREADS if set, else cores / LOCAL_WORLD_SIZE (at least 1). */
int ct_default_num_threads(void);
/* What ctrain's hand-written CPU kernels may use: the CPU's best, capped by
 * CTRAIN_CPU_CAPABILITY (auto|avx2|none). AVX512 means AVX-512 F and BW; AVX2 means AVX2 and
 * FMA. Every kernel choice asks this, so a cap runs the kernels of a lesser CPU, to test or
 * measure them on this one. */
typedef enum { CT_CPU_BASELINE = 0, CT_CPU_AVX2 = 1, CT_CPU_AVX512 = 2 } ct_cpu_level;
ct_cpu_level ct_cpu_capability(void);
/* The CPU's vector extensions in words (not capped), e.g. "AVX-512 (F, BW)". */
const char *ct_simd_level(void);
void ct_cpu_model(char *buf, size_t n);
const char *ct_blas_info(void);

/* Monotonic clock in seconds. */
double ct_time_now(void);

#ifdef __cplusplus
}
#endif
#endif
