/* Autocast and low-precision tensors: the cast op, PyTorch's CPU autocast policy applied at
 * each op's entry (CT_AUTOCAST, op_table.h), and the way an op runs on bf16/f16 tensors.
 *
 * An op with low-precision inputs runs its f32 kernel on f32 copies of its inputs made in temporary
 * memory (exact: every bf16/f16 value is an f32), then rounds the result to nearest even
 * into a bf16/f16 output in the arena (f32 ops and promoted mixed inputs: an f32 output) — per element f32 math and a rounded store, PyTorch's
 * CPU behaviour; for a GEMM, products of rounded operands are exact in f32 and the sums are
 * f32 (the bf16 GEMM's contract, ct_sgemm_bf16). What the node keeps is the low-precision
 * input/output; its backward (ct_bw_lowp) makes f32 copies again, in backward scratch.
 * Gradient buffers stay f32 on the CPU; a low-precision tensor's gradient is rounded to its
 * dtype before the op that produced it consumes it, which is the value PyTorch's bf16/f16
 * gradient would hold. On a device the ops that declared so (ct_op_device_grad_lowp) get
 * that gradient in bf16/f16 itself, written rounded by the op that made it (ct_ac_grad_lowp).
 *
 * Matmul and linear in a bf16 run skip the copies (ct_ac_reads_bf16): the bf16 GEMM reads
 * bf16 storage itself, widening it in its packers, so they see the same values (the same
 * bits) without the f32 copies' memory traffic, forward and backward. GELU and merge_heads
 * on bf16, and add of a bf16 and an f32 tensor, do the same on the CPU (elementwise.c,
 * attention.c, basic.c): they widen each element, run the f32 math and round their output
 * (and, backward, the gradient) element by element — the bits of the copies without them.
 * The fused attention on a packed bf16 qkv (flash_attention.c) likewise widens each head's
 * rows into its kernels' scratch and rounds y and the gradient of y as it writes and reads them.
 *
 * Tensors on a GPU take the same policy from the device dispatch (ct_op_dispatch calls
 * ct_ac_enter/ct_ac_leave around the device forward): the casts are the device's cast op,
 * the f32 copies and the rounded output are made on the device by its conversion hooks
 * (ct_device_hooks.convert/round), and the copies are returned to the allocator when the op
 * is done, as the CPU's temporaries are. Device ops whose kernels read bf16/f16 themselves
 * say so when the backend registers them (ct_op_device_reads_lowp): matmul and linear
 * (cuBLASLt's low-precision GEMMs with f32 results), flash attention (low-precision output),
 * the elementwise ops, bias_add, split/merge heads, softmax, layer norm, the losses, sum and
 * mean of src/cuda. They get the low-precision tensors as they are, forward and backward; the
 * other device ops (conv2d, pooling, plain attention, ...) run on the f32 copies. */
#include <stdint.h>

#include "ops/op_table.h"
#include "ctrain/ops.h"
#include "ops/kmath.h"

static bool is_lowp(const ct_tensor *t) { return t && (t->dtype == CT_BF16 || t->dtype == CT_F16); }
static bool on_dev(const ct_tensor *t) { return t->device.type != CT_DEV_CPU; }

/* the device's conversion hook (NULL with the context failed when it has none) */
static const ct_device_hooks *dev_hooks(ct_ctx *ctx, ct_device d, bool round) {
    const ct_device_hooks *h = ct_device_hooks_get(d, "autocast");
    if (h && (round ? !h->round : !h->convert)) {
        char b[32];
        ct_ctx_fail(ctx, ct_error(CT_ERR_UNSUPPORTED, "autocast on %s: the backend has no conversion kernels",
                                  ct_device_str(d, b, sizeof b)));
        return NULL;
    }
    if (!h) ct_ctx_fail(ctx, CT_ERR_UNSUPPORTED);
    return h;
}
/* y = x converted to y's dtype (both contiguous, same size), on x's device */
static void convert(ct_ctx *ctx, ct_tensor *y, const ct_tensor *x) {
    size_t n = (size_t)ct_numel(x);
    if (!on_dev(x)) { ct_convert(y->data, y->dtype, x->data, x->dtype, n); return; }
    const ct_device_hooks *h = ct_ctx_status(ctx) == CT_OK && y->data && x->data ? dev_hooks(ctx, x->device, false) : NULL;
    if (h) ct_ctx_fail(ctx, h->convert(x->device.index, y->data, y->dtype, x->data, x->dtype, (int64_t)n));
}

/* Round f32 values to dt's precision in place (nearest even), keeping them f32. */
static void round_to(float *x, int64_t n, ct_dtype dt) {
    if (dt == CT_BF16) {
#pragma omp parallel for if (n >= (1 << 16))
        for (int64_t i = 0; i < n; i++) x[i] = ct_k_round_bf16(x[i]); /* branch-free: vectorises */
    } else if (dt == CT_F16) {
        uint16_t buf[1024];
        for (int64_t i = 0; i < n; i += 1024) {
            size_t m = (size_t)(n - i < 1024 ? n - i : 1024);
            ct_convert(buf, CT_F16, x + i, CT_F32, m);
            ct_convert(x + i, CT_F32, buf, CT_F16, m);
        }
    }
}

/* a device op that reads its input i of dtype dt as it is (ct_op_device_reads_lowp) */
static bool dev_reads(int op, int i, ct_dtype dt) {
    const ct_op_dev_entry *e = &ct_op_table_dev[op];
    return (e->lowp_in >> i & 1u) && (e->lowp_dt >> dt & 1u);
}

/* op gives its result in the run's dtype itself, reading low-precision inputs as they are.
 * On a device: the ops the backend declared (ct_op_device_reads_lowp: cuBLASLt's low-precision
 * GEMMs, the attention, elementwise, row and loss kernels of src/cuda), for
 * the runs they declared (bf16, f16, and f32 for f32 ops and mixed inputs); inputs they do
 * not read are still copied. On the CPU, in a bf16 run: the bf16 GEMM where the CPU has it; GELU,
 * merge_heads and the fused qkv attention read and write bf16 themselves (elementwise.c,
 * attention.c, flash_attention.c: they never come through ct_ac_enter with bf16, and their
 * backward rounds the gradient as it reads it; an f32 qkv cast by ct_ac_enter gives an f32 y). */
static bool direct(int op, ct_dtype run, bool dev) {
    if (dev) return ct_op_table_dev[op].lowp_in && (ct_op_table_dev[op].lowp_dt >> run & 1u);
    if (run != CT_BF16) return false;
    if (op == CT_OP_LINEAR || op == CT_OP_MATMUL) return ct_ac_reads_bf16();
    if (op == CT_OP_GELU || op == CT_OP_MERGE_HEADS) return true;
    return op == CT_OP_FLASH_ATTENTION_QKV && ct_flash_reads_bf16();
}

/* the gradient g of a low-precision tensor t rounded to t's dtype, in place */
static void round_grad(ct_ctx *ctx, const ct_tensor *t, float *g) {
    if (!on_dev(t)) { round_to(g, ct_numel(t), t->dtype); return; }
    const ct_device_hooks *h = ct_ctx_status(ctx) == CT_OK && g ? dev_hooks(ctx, t->device, true) : NULL;
    if (h) ct_ctx_fail(ctx, h->round(t->device.index, g, t->dtype, ct_numel(t)));
}

/* Which values an op's backward reads (bit i: input i, READS_OUT: the output), beyond shapes
 * and gradients: ct_bw_lowp copies only those to f32; the others it hands over as the
 * low-precision tensors they are. Ops not listed read everything. */
#define READS_OUT (1u << 31)
static unsigned bw_reads(int op) {
    switch (op) {
    case CT_OP_ADD: case CT_OP_SCALE: case CT_OP_RESHAPE: case CT_OP_CONTIGUOUS: case CT_OP_SPLIT_HEADS: case CT_OP_MERGE_HEADS:
        return 0;
    case CT_OP_GELU:
        return 1u; /* its input */
    default:
        return ~0u;
    }
}

/* ---- cast ---- */
ct_tensor *ct_cast(ct_ctx *ctx, ct_tensor *x, ct_dtype dt) {
    CT_DEV_DISPATCH(ctx, CT_OP_CAST, .in = {x}, .i = {dt});
    if (x->dtype == dt) return x;
    CT_CHECK(ct_dtype_is_float(x->dtype) && (dt == CT_F32 || dt == CT_BF16 || dt == CT_F16),
             "cast: %s -> %s is not a float conversion ctrain supports (f32, bf16, f16)", ct_dtype_name(x->dtype), ct_dtype_name(dt));
    x = ct_contiguous(ctx, x);
    ct_tensor *y = ct_new(ctx, dt, x->ndim, x->shape);
    ct_convert(y->data, dt, x->data, x->dtype, (size_t)ct_numel(x));
    ct_record(ctx, CT_OP_CAST, y, 1, &x);
    return y;
}
void ct_bw_cast(ct_ctx *ctx, ct_node *n) {
    float *gi = ct_grad_acc(ctx, n->in[0]);
    if (!gi) return;
    int64_t N = ct_numel(n->out);
    float *g = n->out->grad->data;
    round_to(g, N, n->out->dtype); /* the low-precision gradient's value */
#pragma omp parallel for if (N >= (1 << 16))
    for (int64_t i = 0; i < N; i++) gi[i] += g[i];
}

/* a copy of x (contiguous) as dt in whatever memory ct_new hands out now, on x's device */
static ct_tensor *copy_as(ct_ctx *ctx, const ct_tensor *x, ct_dtype dt) {
    ct_tensor *c = ct_new_on(ctx, x->device, dt, x->ndim, x->shape, "autocast");
    convert(ctx, c, x);
    return c;
}
static ct_tensor *f32_copy(ct_ctx *ctx, const ct_tensor *x) { return copy_as(ctx, x, CT_F32); }

/* An input cast for an op: parameters once per region (the weight cast cache), with a node
 * so their gradients reach the f32 master copy. */
static ct_tensor *cast_arg(ct_ctx *ctx, ct_tensor *t, ct_dtype dt) {
    bool cacheable = (t->flags & CT_TF_PARAM) && !ct_ckpt_active_(ctx) && ct_autocast_dtype(ctx) != CT_F32;
    if (!cacheable) return ct_cast(ctx, t, dt);
    bool grad = ct_grad_enabled(ctx) && (t->flags & CT_TF_REQUIRES_GRAD);
    ct_tensor *c = ct_autocast_cache_get_(ctx, t, dt, grad);
    if (c) return c;
    c = ct_cast(ctx, t, dt);
    ct_autocast_cache_put_(ctx, t, c, dt, grad);
    return c;
}

bool ct_ac_enter(ct_ctx *ctx, int op, ct_ac_frame *f, int n, ct_tensor **const *args) {
    if (ct_ctx_temp_depth_(ctx) > 0) return false; /* already running on f32 copies */
    ct_dtype ac = ct_autocast_dtype(ctx), lp = CT_F32;
    bool any_lp = false, any_f32 = false, mixed = false;
    for (int i = 0; i < n; i++) {
        const ct_tensor *t = *args[i];
        if (!t || !ct_dtype_is_float(t->dtype)) continue;
        if (is_lowp(t)) {
            if (any_lp && lp != t->dtype) mixed = true;
            lp = t->dtype;
            any_lp = true;
        } else {
            any_f32 = true;
        }
    }
    ct_autocast_class cls = ct_op_table[op].autocast;
    if (ac != CT_F32 && cls == CT_AC_LOWP) {
        for (int i = 0; i < n; i++) {
            ct_tensor *t = *args[i];
            if (t && ct_dtype_is_float(t->dtype) && t->dtype != ac) *args[i] = cast_arg(ctx, t, ac);
        }
        lp = ac;
    } else if (!any_lp) {
        return false;
    } else if (cls == CT_AC_FP32 || any_f32 || mixed) {
        /* f32 ops, and promotion of mixed inputs to the widest (f32): the same run on f32
         * copies, with an f32 result; the node keeps the low-precision inputs (an up-cast
         * node would keep an f32 copy of each for the whole step) */
        lp = CT_F32;
    }
    /* run on f32 copies of the lp inputs; contiguous before the temporaries start */
    f->dt = lp;
    f->n = n;
    for (int i = 0; i < n; i++) {
        ct_tensor *t = *args[i];
        if (is_lowp(t) && !ct_is_contiguous(t)) *args[i] = t = ct_contiguous(ctx, t);
        f->orig[i] = f->tmp[i] = t;
    }
    f->mark = ct_ctx_temp_begin_(ctx);
    f->prev_run = ct_ctx_set_lowp_run_(ctx, lp);
    bool dev = f->orig[0] && on_dev(f->orig[0]);
    f->direct = direct(op, lp, dev);
    for (int i = 0; i < n && !(f->direct && !dev); i++) {
        ct_tensor *t = f->orig[i];
        if (!is_lowp(t) || (f->direct && dev_reads(op, i, t->dtype))) continue;
        ct_tensor *c = f32_copy(ctx, t);
        c->flags = t->flags & CT_TF_REQUIRES_GRAD;
        f->tmp[i] = *args[i] = c;
    }
    return true;
}

/* the low-precision row of a node's op-table row (CPU or device), or NULL for a node that
 * is no op-table row (say, a checkpoint node): compared as addresses, the rows being arrays */
static const ct_op_def *lp_row(const ct_op_def *op) {
    uintptr_t row = (uintptr_t)op, t0 = (uintptr_t)ct_op_table;
    if (row >= t0 && row < t0 + sizeof ct_op_table) return &ct_op_table_lp[op - ct_op_table];
    for (int i = 0; i < CT_OP_COUNT; i++)
        if (op == &ct_op_table_dev[i].row) return &ct_op_table_dev_lp[i];
    return NULL;
}

/* the device op of a node the device column recorded (its row or its low-precision row), or -1 */
static int dev_op(const ct_node *n) {
    uintptr_t p = (uintptr_t)n->op, t0 = (uintptr_t)ct_op_table_dev_lp;
    if (p >= t0 && p < t0 + sizeof ct_op_table_dev_lp) return (int)(n->op - ct_op_table_dev_lp);
    for (int i = 0; i < CT_OP_COUNT; i++)
        if (n->op == &ct_op_table_dev[i].row) return i;
    return -1;
}

bool ct_ac_takes_grad_lowp(const ct_tensor *t) {
    if (!t || !is_lowp(t) || !on_dev(t) || t->grad || (t->flags & CT_TF_PARAM) || !(t->flags & CT_TF_REQUIRES_GRAD) ||
        !t->node || t->node->out != t)
        return false;
    int op = dev_op(t->node);
    return op >= 0 && (ct_op_table_dev[op].lowp_grad_dt >> t->dtype & 1u);
}
void *ct_ac_grad_lowp(ct_ctx *ctx, ct_tensor *t) { return ct_ac_takes_grad_lowp(t) ? ct_grad_fresh_as_(ctx, t, t->dtype) : NULL; }

/* Device copies go back to the allocator when the op is done (the CPU's temporaries are
 * rewound): the f32 copies of the inputs and the f32 result, once nothing points at them. */
static void free_dev_temps(ct_ctx *ctx, const ct_ac_frame *f, void *y_data) {
    for (int i = 0; i < f->n; i++)
        if (f->tmp[i] != f->orig[i] && on_dev(f->tmp[i]) && f->tmp[i]->data) ct_ctx_dev_free_(ctx, f->tmp[i]->data);
    if (y_data) ct_ctx_dev_free_(ctx, y_data);
}

ct_tensor *ct_ac_leave(ct_ctx *ctx, ct_ac_frame *f, ct_tensor *y) {
    ct_ctx_set_lowp_run_(ctx, f->prev_run);
    for (int i = 0; i < f->n; i++)
        if (y == f->tmp[i]) { /* identity (dropout off) */
            ct_ctx_temp_end_(ctx, f->mark);
            if (on_dev(y)) free_dev_temps(ctx, f, NULL);
            return f->orig[i];
        }
    /* a device op with low-precision kernels gives its result in the run's dtype (an f32 one
     * too, when direct), and so does the CPU's direct bf16 linear (its GEMM rounds as it stores) */
    bool own = (on_dev(y) || f->direct) && y->dtype == f->dt && (f->dt != CT_F32 || (f->direct && on_dev(y)));
    CT_CHECK((y->dtype == CT_F32 || own) && ct_is_contiguous(y), "autocast: an op returned a %s tensor on its f32 copies",
             ct_dtype_name(y->dtype));
    /* the temporaries are released first so that the output lands in the arena; y's bytes
     * stay where they are until the next temporary is allocated, after the conversion */
    ct_ctx_temp_end_(ctx, f->mark);
    ct_tensor *out;
    if (own) { /* y's header was a temporary: a new one for its data (kept: device memory, or ct_ctx_alloc_keep) */
        out = ct_wrap(ctx, y->dtype, y->data, y->ndim, y->shape);
        out->device = y->device;
    } else {
        out = copy_as(ctx, y, f->dt);
    }
    ct_node *nd = y->node;
    const ct_op_def *lp = nd && nd->out == y ? lp_row(nd->op) : NULL;
    if (on_dev(y) && (!nd || lp)) free_dev_temps(ctx, f, own ? NULL : y->data); /* else the node may still read them */
    if (lp) {
        nd->op = lp;
        nd->out = out;
        for (int j = 0; j < nd->nin; j++)
            for (int i = 0; i < f->n; i++)
                if (nd->in[j] && nd->in[j] == f->tmp[i]) nd->in[j] = f->orig[i];
        for (int j = 0; j < 2; j++) {
            for (int i = 0; i < f->n; i++)
                if (nd->saved_t[j] && nd->saved_t[j] == f->tmp[i]) nd->saved_t[j] = f->orig[i];
            if (nd->saved_t[j] == y) nd->saved_t[j] = out;
        }
        out->node = nd;
        out->flags |= y->flags & CT_TF_REQUIRES_GRAD;
    }
    return out;
}

void ct_bw_lowp(ct_ctx *ctx, ct_node *n) {
    uintptr_t p = (uintptr_t)n->op, t0 = (uintptr_t)ct_op_table_lp;
    bool cpu = p >= t0 && p < t0 + sizeof ct_op_table_lp;
    int op = (int)(cpu ? n->op - ct_op_table_lp : n->op - ct_op_table_dev_lp);
    const ct_op_def *row = cpu ? &ct_op_table[op] : &ct_op_table_dev[op].row;
    ct_node s = *n;
    s.op = row;
    ct_tensor *o = n->out;
    bool dir = direct(op, o->dtype, !cpu);
    /* direct: the op reads the low-precision tensors themselves (on a device, the inputs it
     * declared and its own output) */
    unsigned reads = dir && cpu ? 0 : dir ? bw_reads(op) & ~READS_OUT : bw_reads(op);
    /* a direct CPU op rounds the gradient itself (the bf16 GEMM's packers, linear's bias sum);
     * a device one gets it rounded (then read as bf16 by its GEMMs, exactly), or in the low
     * precision itself where it declared so (ct_ac_grad_lowp gave it); an op that runs on f32
     * copies gets that one widened */
    if (o->grad->dtype != CT_F32 && !(dir && !cpu && (ct_op_table_dev[op].lowp_grad_dt >> o->grad->dtype & 1u)))
        ct_grad_widen_(ctx, o);
    if (is_lowp(o) && (!dir || !cpu) && o->grad->dtype == CT_F32) round_grad(ctx, o, o->grad->data);
    if (is_lowp(o) && (reads & READS_OUT)) {
        s.out = f32_copy(ctx, o);
        s.out->flags = o->flags & CT_TF_REQUIRES_GRAD;
        s.out->grad = o->grad;
    }
    /* an input's gradient the op creates itself (t has none yet and is no other input of
     * n): the copy's, handed to t afterwards, so that the op writes it fresh (ct_grad_acc_fresh)
     * instead of adding to a zeroed buffer: the same bits, without the zeroing pass */
    bool handoff[CT_NODE_MAX_IN] = {false};
    for (int i = 0; i < n->nin; i++) {
        ct_tensor *t = n->in[i];
        if (!is_lowp(t) || !(reads >> i & 1u) || (dir && dev_reads(op, i, t->dtype))) continue;
        ct_tensor *c = f32_copy(ctx, t);
        c->flags = t->flags & CT_TF_REQUIRES_GRAD;
        if (c->flags) {
            bool shared = false;
            for (int j = 0; j < n->nin; j++) shared |= j != i && n->in[j] == t;
            if (t->grad || shared) { ct_grad_acc(ctx, t); c->grad = t->grad; }
            else handoff[i] = true;
        }
        s.in[i] = c;
        for (int j = 0; j < 2; j++)
            if (n->saved_t[j] == t) s.saved_t[j] = c;
    }
    for (int j = 0; j < 2; j++)
        if (n->saved_t[j] == o) s.saved_t[j] = s.out;
    ct_dtype prev = ct_ctx_set_lowp_run_(ctx, o->dtype);
    row->backward(ctx, &s);
    ct_ctx_set_lowp_run_(ctx, prev);
    for (int i = 0; i < n->nin; i++)
        if (handoff[i]) n->in[i]->grad = s.in[i]->grad; /* NULL if the op gave it none */
}
