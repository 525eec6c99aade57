/* Devices: the registry of device backends (src/cuda registers itself when built), device
 * memory of a step, copies between host and device, and the context's sticky failure.
 * Activations on a device cannot sit in the host arena; they come from the backend's
 * caching allocator and go back to it at ct_ctx_reset, so a steady training loop does not
 * allocate from the driver. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/ctx_internal.h"
#include "core/kernel.h"

static const ct_device_hooks *backends[CT_DEV_TYPES];

void ct_device_register(ct_device_type type, const ct_device_hooks *h) {
    CT_CHECK(type > CT_DEV_CPU && type < CT_DEV_TYPES, "ct_device_register: bad device type %d", (int)type);
    backends[type] = h;
}

ct_status ct_device_parse(const char *s, ct_device *out) {
    *out = CT_CPU;
    if (!s) return ct_error(CT_ERR_INVALID, "device: NULL name");
    if (!strcmp(s, "cpu")) return CT_OK;
    if (!strcmp(s, "cuda")) { *out = CT_CUDA(0); return CT_OK; }
    if (!strncmp(s, "cuda:", 5) && s[5] >= '0' && s[5] <= '9') {
        char *end;
        long i = strtol(s + 5, &end, 10);
        if (*end == '\0' && i < 1024) { *out = CT_CUDA((int)i); return CT_OK; }
    }
    return ct_error(CT_ERR_INVALID, "device '%s': expected cpu, cuda or cuda:N", s);
}

const char *ct_device_str(ct_device d, char *buf, size_t n) {
    if (d.type == CT_DEV_CPU) snprintf(buf, n, "cpu");
    else snprintf(buf, n, "cuda:%d", d.index);
    return buf;
}

const ct_device_hooks *ct_device_hooks_get(ct_device d, const char *op) {
    char b[32];
    if (d.type <= CT_DEV_CPU || d.type >= CT_DEV_TYPES || !backends[d.type]) {
        ct_error(CT_ERR_UNSUPPORTED, "%s on %s: this build of ctrain has no CUDA support (built without nvcc)", op,
                 ct_device_str(d, b, sizeof b));
        return NULL;
    }
    return backends[d.type];
}

ct_status ct_device_count(ct_device_type type, int *n) {
    *n = type == CT_DEV_CPU ? 1 : 0;
    if (type == CT_DEV_CPU) return CT_OK;
    const ct_device_hooks *h = ct_device_hooks_get((ct_device){type, 0}, "device count");
    return h ? h->count(n) : CT_ERR_UNSUPPORTED;
}

/* the hooks of a device type for a report, or NULL with CT_ERR_UNSUPPORTED set: the CPU has none */
static const ct_device_hooks *report_hooks(ct_device_type type, const char *op) {
    if (type == CT_DEV_CPU) {
        ct_error(CT_ERR_UNSUPPORTED, "%s of the CPU: not a device backend", op);
        return NULL;
    }
    return ct_device_hooks_get((ct_device){type, 0}, op);
}

ct_status ct_device_info_get(ct_device d, ct_device_info *out) {
    *out = (ct_device_info){0};
    const ct_device_hooks *h = report_hooks(d.type, "device info");
    return h && h->info ? h->info(d.index, out) : CT_ERR_UNSUPPORTED;
}

void ct_device_versions(ct_device_type type, char *buf, size_t n) {
    if (n) buf[0] = 0;
    const ct_device_hooks *h = type == CT_DEV_CPU ? NULL : ct_device_hooks_get((ct_device){type, 0}, "device versions");
    if (h && h->versions) h->versions(buf, n);
}

ct_status ct_device_check(ct_device_type type, char *report, size_t len) {
    if (len) report[0] = 0;
    const ct_device_hooks *h = report_hooks(type, "device check");
    return h && h->check ? h->check(report, len) : CT_ERR_UNSUPPORTED;
}

ct_status ct_device_current(ct_device_type type, ct_device *out) {
    *out = CT_CPU;
    if (type == CT_DEV_CPU) return CT_OK;
    const ct_device_hooks *h = ct_device_hooks_get((ct_device){type, 0}, "current device");
    int dev = 0;
    ct_status st = h && h->current ? h->current(&dev) : CT_ERR_UNSUPPORTED;
    if (st == CT_OK) *out = (ct_device){type, dev};
    return st;
}

ct_status ct_device_sync(ct_device d) {
    if (d.type == CT_DEV_CPU) return CT_OK;
    const ct_device_hooks *h = ct_device_hooks_get(d, "device sync");
    return h ? h->sync(d.index) : CT_ERR_UNSUPPORTED;
}

ct_status ct_device_mem_get(ct_device d, ct_device_mem *out) {
    *out = (ct_device_mem){0};
    if (d.type == CT_DEV_CPU) return ct_error(CT_ERR_UNSUPPORTED, "device memory of the CPU: not tracked");
    const ct_device_hooks *h = ct_device_hooks_get(d, "device memory");
    if (!h || !h->mem) return CT_ERR_UNSUPPORTED;
    h->mem(d.index, &out->current, &out->peak, &out->reserved);
    return CT_OK;
}

/* Buffers of d's kind through its hooks, or malloc on the CPU: device memory (ct_device_alloc)
 * or pinned host memory for staging copies to d (ct_host_alloc). */
static ct_status buf_alloc(ct_device d, size_t bytes, void **out, bool pinned) {
    *out = NULL;
    if (d.type == CT_DEV_CPU) {
        *out = malloc(bytes ? bytes : 1);
        return *out ? CT_OK : ct_error(CT_ERR_NOMEM, "out of memory for %zu bytes", bytes);
    }
    const ct_device_hooks *h = ct_device_hooks_get(d, pinned ? "pinned host memory" : "device buffer");
    if (!h) return CT_ERR_UNSUPPORTED;
    return (pinned ? h->host_alloc : h->alloc)(d.index, bytes ? bytes : 1, out);
}
static void buf_free(ct_device d, void *p, bool pinned) {
    if (!p) return;
    if (d.type == CT_DEV_CPU) { free(p); return; }
    const ct_device_hooks *h = ct_device_hooks_get(d, pinned ? "pinned host memory" : "device buffer");
    CT_CHECK(h, "%s: %p was not allocated by %s on this device type", pinned ? "ct_host_free" : "ct_device_free", p,
             pinned ? "ct_host_alloc" : "ct_device_alloc");
    (pinned ? h->host_free : h->free)(p);
}
ct_status ct_device_alloc(ct_device d, size_t bytes, void **out) { return buf_alloc(d, bytes, out, false); }
void ct_device_free(ct_device d, void *p) { buf_free(d, p, false); }
ct_status ct_host_alloc(ct_device d, size_t bytes, void **out) { return buf_alloc(d, bytes, out, true); }
void ct_host_free(ct_device d, void *p) { buf_free(d, p, true); }

ct_status ct_device_convert(ct_device d, void *y, ct_dtype to, const void *x, ct_dtype from, int64_t n) {
    if (d.type == CT_DEV_CPU) { ct_convert(y, to, x, from, (size_t)n); return CT_OK; }
    const ct_device_hooks *h = ct_device_hooks_get(d, "convert");
    if (!h || !h->convert) return h ? ct_error(CT_ERR_UNSUPPORTED, "convert: the device backend has no conversion kernel") : CT_ERR_UNSUPPORTED;
    return h->convert(d.index, y, to, x, from, n);
}
ct_status ct_device_copy(ct_device d, void *dst, const void *src, size_t bytes, bool to_device) {
    if (d.type == CT_DEV_CPU) {
        if (bytes) memcpy(dst, src, bytes);
        return CT_OK;
    }
    const ct_device_hooks *h = ct_device_hooks_get(d, "device copy");
    if (!h) return CT_ERR_UNSUPPORTED;
    return h->copy(d.index, dst, src, bytes, to_device ? CT_COPY_H2D : CT_COPY_D2H);
}
ct_status ct_device_scale(ct_device d, float *x, float coef, int64_t n) {
    if (d.type == CT_DEV_CPU) {
        for (int64_t i = 0; i < n; i++) x[i] *= coef;
        return CT_OK;
    }
    const ct_device_hooks *h = ct_device_hooks_get(d, "scale");
    if (!h || !h->scale) return h ? ct_error(CT_ERR_UNSUPPORTED, "scale: the device backend has no scaling kernel") : CT_ERR_UNSUPPORTED;
    return h->scale(d.index, x, coef, n, NULL);
}

ct_status ct_device_zero(ct_device d, void *p, size_t bytes) {
    if (d.type == CT_DEV_CPU) {
        if (bytes) memset(p, 0, bytes);
        return CT_OK;
    }
    const ct_device_hooks *h = ct_device_hooks_get(d, "zero");
    return h ? h->zero(d.index, p, bytes) : CT_ERR_UNSUPPORTED;
}
ct_status ct_device_copy_within(ct_device d, void *dst, const void *src, size_t bytes) {
    if (d.type == CT_DEV_CPU) {
        if (bytes) memcpy(dst, src, bytes);
        return CT_OK;
    }
    const ct_device_hooks *h = ct_device_hooks_get(d, "device copy");
    return h ? h->copy(d.index, dst, src, bytes, CT_COPY_D2D) : CT_ERR_UNSUPPORTED;
}
ct_status ct_device_add(ct_device d, float *y, const float *x, int64_t n) {
    if (d.type == CT_DEV_CPU) {
        for (int64_t i = 0; i < n; i++) y[i] += x[i];
        return CT_OK;
    }
    const ct_device_hooks *h = ct_device_hooks_get(d, "add");
    if (!h || !h->add) return h ? ct_error(CT_ERR_UNSUPPORTED, "add: the device backend has no add kernel") : CT_ERR_UNSUPPORTED;
    return h->add(d.index, y, x, n);
}
ct_status ct_device_sumsq(ct_device d, const float *x, int64_t n, double *out) {
    if (d.type == CT_DEV_CPU) {
        double s = 0;
        for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
        *out = s;
        return CT_OK;
    }
    const ct_device_hooks *h = ct_device_hooks_get(d, "sum of squares");
    if (!h || !h->sumsq) return h ? ct_error(CT_ERR_UNSUPPORTED, "sumsq: the device backend has no such pass") : CT_ERR_UNSUPPORTED;
    return h->sumsq(d.index, x, n, out);
}

/* ---- address ranges whose memory comes and goes: on the CPU an anonymous mapping whose
 * pages are given back with madvise (they read as zeros when touched again) ---- */
static size_t cpu_page(void) { return (size_t)sysconf(_SC_PAGESIZE); }
static const ct_device_hooks *vm_hooks(ct_device d, const char *op) {
    const ct_device_hooks *h = ct_device_hooks_get(d, op);
    if (h && !h->vm_reserve) {
        (void)ct_error(CT_ERR_UNSUPPORTED, "%s: the device backend cannot map and unmap memory under fixed addresses", op);
        return NULL;
    }
    return h;
}
static void check_granules(const void *p, size_t bytes, size_t g, const char *op) {
    CT_CHECK((uintptr_t)p % g == 0 && bytes % g == 0, "%s(%p, %zu): not whole granules of %zu bytes", op, p, bytes, g);
}
ct_status ct_device_reserve(ct_device d, size_t bytes, void **base, size_t *granule) {
    *base = NULL;
    if (d.type != CT_DEV_CPU) {
        const ct_device_hooks *h = vm_hooks(d, "ct_device_reserve");
        return h ? h->vm_reserve(d.index, bytes, base, granule) : CT_ERR_UNSUPPORTED;
    }
    *granule = cpu_page();
    size_t len = (bytes + *granule - 1) / *granule * *granule;
    void *m = mmap(NULL, len ? len : *granule, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return ct_error(CT_ERR_NOMEM, "reserve: cannot map %zu bytes: %s", len, strerror(errno));
    *base = m;
    return CT_OK;
}
/* on the CPU both drop the pages: given back, and zeros when touched again */
static ct_status map_or_unmap(ct_device d, void *p, size_t bytes, bool map) {
    const char *op = map ? "ct_device_map" : "ct_device_unmap";
    if (d.type != CT_DEV_CPU) {
        const ct_device_hooks *h = vm_hooks(d, op);
        return !h ? CT_ERR_UNSUPPORTED : map ? h->vm_map(d.index, p, bytes) : h->vm_unmap(d.index, p, bytes);
    }
    check_granules(p, bytes, cpu_page(), op);
    if (bytes) (void)madvise(p, bytes, MADV_DONTNEED);
    return CT_OK;
}
ct_status ct_device_map(ct_device d, void *p, size_t bytes) { return map_or_unmap(d, p, bytes, true); }
ct_status ct_device_unmap(ct_device d, void *p, size_t bytes) { return map_or_unmap(d, p, bytes, false); }
void ct_device_unreserve(ct_device d, void *base, size_t bytes) {
    if (!base) return;
    if (d.type != CT_DEV_CPU) {
        const ct_device_hooks *h = vm_hooks(d, "ct_device_unreserve");
        CT_CHECK(h, "ct_device_unreserve: %p was not reserved on this device type", base);
        h->vm_release(d.index, base, bytes);
        return;
    }
    size_t g = cpu_page();
    munmap(base, bytes ? (bytes + g - 1) / g * g : g);
}

ct_status ct_ctx_fail(ct_ctx *c, ct_status st) {
    if (st != CT_OK && c->dev_status == CT_OK) c->dev_status = st;
    return st;
}
ct_status ct_ctx_status(const ct_ctx *c) { return c->dev_status; }

void *ct_ctx_dev_alloc(ct_ctx *c, ct_device d, size_t bytes, const char *op) {
    if (c->dev_status != CT_OK) return NULL;
    const ct_device_hooks *h = ct_device_hooks_get(d, op);
    if (!h) { ct_ctx_fail(c, CT_ERR_UNSUPPORTED); return NULL; }
    if (c->dev_n == c->dev_cap) {
        int cap = c->dev_cap ? 2 * c->dev_cap : 256;
        void *nb = realloc(c->dev_bufs, (size_t)cap * sizeof *c->dev_bufs);
        if (!nb) { ct_ctx_fail(c, ct_error(CT_ERR_NOMEM, "%s: out of host memory listing device buffers", op)); return NULL; }
        c->dev_bufs = nb;
        c->dev_cap = cap;
    }
    void *p = NULL;
    ct_status st = h->alloc(d.index, bytes ? bytes : 1, &p);
    if (st != CT_OK) { ct_ctx_fail(c, st); return NULL; }
    c->dev_bufs[c->dev_n].p = p;
    c->dev_bufs[c->dev_n].type = d.type;
    /* what a backward allocates besides gradients is its own scratch (as on the CPU) */
    c->dev_bufs[c->dev_n].scratch = c->bw_depth > 0 && !c->grad_alloc;
    c->dev_n++;
    return p;
}

/* Early returns keep the step's peak near what is live, not all the step ever allocated.
 * Safe in stream order: a block handed out again is written by kernels queued after the
 * ones that read it (one compute stream per device; NCCL touches parameter gradients only). */
void ct_ctx_dev_free_(ct_ctx *c, void *p) {
    for (int i = c->dev_n - 1; i >= 0; i--) /* recent buffers are at the end */
        if (c->dev_bufs[i].p == p) {
            backends[c->dev_bufs[i].type]->free(p);
            c->dev_bufs[i] = c->dev_bufs[--c->dev_n];
            return;
        }
}

void ct_ctx_dev_scratch_free_(ct_ctx *c) {
    int k = 0;
    for (int i = 0; i < c->dev_n; i++) {
        if (c->dev_bufs[i].scratch) backends[c->dev_bufs[i].type]->free(c->dev_bufs[i].p);
        else c->dev_bufs[k++] = c->dev_bufs[i];
    }
    c->dev_n = k;
}

int ct_ctx_dev_mark_(const ct_ctx *c) { return c->dev_n; }

/* ct_ctx_dev_free_ fills a hole with the last buffer, so the entries from `mark` on are always
 * ones allocated after it (an earlier one freed meanwhile only pulls a later one below the
 * mark, where it stays until the reset) */
void ct_ctx_dev_rewind_(ct_ctx *c, int mark, const void *keep) {
    int k = mark < c->dev_n ? mark : c->dev_n;
    for (int i = k; i < c->dev_n; i++) {
        if (c->dev_bufs[i].p == keep) c->dev_bufs[k++] = c->dev_bufs[i];
        else backends[c->dev_bufs[i].type]->free(c->dev_bufs[i].p);
    }
    c->dev_n = k;
}

void ct_ctx_dev_release_(ct_ctx *c) {
    /* blocks go back to the caching allocator in stream order: the next step's kernels,
     * queued on the same stream, run after the last use of this one's */
    for (int i = 0; i < c->dev_n; i++) backends[c->dev_bufs[i].type]->free(c->dev_bufs[i].p);
    c->dev_n = 0;
    c->dev_status = CT_OK;
}

ct_tensor *ct_new_on(ct_ctx *c, ct_device d, ct_dtype dt, int ndim, const int64_t *shape, const char *op) {
    if (d.type == CT_DEV_CPU) return ct_new(c, dt, ndim, shape);
    ct_tensor *t = ct_wrap(c, dt, NULL, ndim, shape);
    t->device = d;
    t->data = ct_ctx_dev_alloc(c, d, ct_nbytes(t), op);
    return t;
}

ct_status ct_tensor_to(ct_ctx *c, const ct_tensor *t, ct_device dev, ct_tensor **out) {
    *out = NULL;
    char b1[32], b2[32];
    if (!ct_is_contiguous(t)) return ct_error(CT_ERR_INVALID, "ct_tensor_to: tensor is not contiguous (use ct_contiguous)");
    if (ct_device_eq(t->device, dev)) { *out = (ct_tensor *)t; return CT_OK; }
    if (t->device.type != CT_DEV_CPU && dev.type != CT_DEV_CPU)
        return ct_error(CT_ERR_UNSUPPORTED, "ct_tensor_to: %s to %s: copies between devices are not supported",
                        ct_device_str(t->device, b1, sizeof b1), ct_device_str(dev, b2, sizeof b2));
    ct_device gpu = dev.type == CT_DEV_CPU ? t->device : dev;
    const ct_device_hooks *h = ct_device_hooks_get(gpu, "ct_tensor_to");
    if (!h) return CT_ERR_UNSUPPORTED;
    if (c->dev_status != CT_OK) return c->dev_status;
    if (!t->data && ct_nbytes(t)) return ct_error(CT_ERR_INVALID, "ct_tensor_to: a placeholder of a failed device op has no data");
    ct_tensor *y = ct_new_on(c, dev, t->dtype, t->ndim, t->shape, "ct_tensor_to");
    if (c->dev_status != CT_OK) return c->dev_status;
    ct_status st = h->copy(gpu.index, y->data, t->data, ct_nbytes(t), dev.type == CT_DEV_CPU ? CT_COPY_D2H : CT_COPY_H2D);
    if (st != CT_OK) return st;
    *out = y;
    return CT_OK;
}

/* ct_item of a device tensor: one element copied back (waits for the device) */
bool ct_device_item_(const ct_tensor *t, double *v) {
    if (t->device.type == CT_DEV_CPU) return false;
    *v = NAN;
    const ct_device_hooks *h = t->data ? ct_device_hooks_get(t->device, "ct_item") : NULL;
    char buf[16];
    if (h && h->copy(t->device.index, buf, t->data, ct_dtype_size(t->dtype), CT_COPY_D2H) == CT_OK)
        ct_convert(v, CT_F64, buf, t->dtype, 1);
    return true;
}
