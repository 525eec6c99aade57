/* Module plumbing: allocation, forward dispatch, recursive free, names, repr. Knows no
 * module type: each type's own line comes from its ops (repr). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/nn.h"

ct_module *ct_module_new(const ct_module_ops *ops, const char *name) {
    CT_CHECK(ops && ops->forward, "ct_module_new: ops without forward");
    size_t n = name ? strlen(name) : 0;
    CT_CHECK(n < CT_NN_NAME_MAX, "module name '%s' longer than %d characters", name, CT_NN_NAME_MAX - 1);
    ct_module *m = calloc(1, sizeof *m);
    if (!m) {
        ct_error(CT_ERR_NOMEM, "out of memory creating a %s module", ops->type);
        return NULL;
    }
    m->ops = ops;
    if (name) memcpy(m->name, name, n + 1);
    return m;
}

const ct_tensor *ct_module_first_param(const ct_module *m) {
    const ct_tensor *ts[6] = {m->w, m->b, m->p[0], m->p[1], m->p[2], m->p[3]};
    for (int i = 0; i < 6; i++)
        if (ts[i] && ts[i]->params && ts[i]->param_id >= 0 && !ct_params_is_buffer(ts[i]->params, ts[i]->param_id)) return ts[i];
    for (int i = 0; i < m->nchildren; i++) {
        const ct_tensor *t = ct_module_first_param(m->children[i]);
        if (t) return t;
    }
    return NULL;
}

/* bracketed as a unit: a sharded store (FSDP) has the unit's parameters gathered inside */
ct_tensor *ct_module_forward(ct_ctx *ctx, ct_module *m, ct_tensor *x) {
    const ct_tensor *u = ct_module_first_param(m);
    ct_unit_enter(ctx, u);
    ct_tensor *y = m->ops->forward(ctx, m, x);
    ct_unit_leave(ctx, u);
    return y;
}

/* the one store of m's tree's parameters into *P (NULL: none yet); false when there are two */
static bool find_store(const ct_module *m, ct_params **P) {
    const ct_tensor *ts[6] = {m->w, m->b, m->p[0], m->p[1], m->p[2], m->p[3]};
    for (int i = 0; i < 6; i++) {
        if (!ts[i] || !ts[i]->params) continue;
        if (*P && *P != ts[i]->params) return false;
        *P = ts[i]->params;
    }
    for (int i = 0; i < m->nchildren; i++)
        if (!find_store(m->children[i], P)) return false;
    return true;
}

ct_status ct_module_to(ct_module *m, ct_device dev) {
    ct_params *P = NULL;
    if (!find_store(m, &P))
        return ct_error(CT_ERR_INVALID, "ct_module_to: %s '%s' has parameters in more than one store (move them with ct_params_to)",
                        m->ops->type, m->name);
    return P ? ct_params_to(P, dev) : CT_OK;
}

void ct_module_free(ct_module *m) {
    if (!m) return;
    for (int i = 0; i < m->nchildren; i++) ct_module_free(m->children[i]);
    free(m->children);
    if (m->ops->destroy) m->ops->destroy(m);
    free(m);
}

const char *ct_module_type(const ct_module *m) { return m->ops->type; }

ct_module *ct_module_child(const ct_module *m, const char *leaf) {
    size_t n = strlen(leaf);
    for (int i = 0; i < m->nchildren; i++) {
        const char *nm = m->children[i]->name;
        size_t len = strlen(nm);
        if (len >= n && !strcmp(nm + len - n, leaf) && (len == n || nm[len - n - 1] == '.')) return m->children[i];
    }
    return NULL;
}

/* NULL in, NULL out (nn.h): a missing child marks the parent incomplete, a missing parent
 * takes the child with it. */
ct_module *ct_module_add_child(ct_module *parent, ct_module *child) {
    if (!parent) { ct_module_free(child); return NULL; }
    if (!child) { parent->incomplete = true; return NULL; }
    if (parent->nchildren == parent->cap) {
        int cap = parent->cap ? 2 * parent->cap : 8;
        ct_module **c = realloc(parent->children, (size_t)cap * sizeof *c);
        if (!c) {
            ct_error(CT_ERR_NOMEM, "out of memory adding a child to %s '%s'", parent->ops->type, parent->name);
            ct_module_free(child);
            parent->incomplete = true;
            return NULL;
        }
        parent->children = c;
        parent->cap = cap;
    }
    parent->children[parent->nchildren++] = child;
    return child;
}

ct_status ct_module_status(const ct_module *m) {
    if (!m) return ct_error(CT_ERR_NOMEM, "out of memory building modules");
    if (m->incomplete)
        return ct_error(CT_ERR_NOMEM, "out of memory building modules: %s '%s' lacks a child", m->ops->type, m->name);
    for (int i = 0; i < m->nchildren; i++) {
        ct_status st = ct_module_status(m->children[i]);
        if (st != CT_OK) return st;
    }
    return CT_OK;
}

const char *ct_nn_join(char *buf, size_t n, const char *prefix, const char *leaf) {
    int r = (prefix && *prefix) ? snprintf(buf, n, "%s.%s", prefix, leaf) : snprintf(buf, n, "%s", leaf);
    CT_CHECK(r >= 0 && (size_t)r < n, "parameter name '%s.%s' too long", prefix ? prefix : "", leaf);
    return buf;
}

/* ---- repr ---- */
typedef struct { char *buf; size_t n, len; } sbuf;
/* where the next bytes go and how many fit (NULL, 0 once full: only the length counts on) */
static char *sb_end(const sbuf *s) { return s->len < s->n ? s->buf + s->len : NULL; }
static size_t sb_left(const sbuf *s) { return s->len < s->n ? s->n - s->len : 0; }
static void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(sb_end(s), sb_left(s), fmt, ap);
    va_end(ap);
    if (r > 0) s->len += (size_t)r;
}

/* a leaf's own line: its ops' repr, else "Type()" */
static void repr_one(const ct_module *m, sbuf *s) {
    if (!m->ops->repr) { sb_printf(s, "%s()", m->ops->type); return; }
    int r = m->ops->repr(m, sb_end(s), sb_left(s));
    if (r > 0) s->len += (size_t)r;
}

static void repr_rec(const ct_module *m, sbuf *s, int depth) {
    if (m->nchildren == 0) { repr_one(m, s); return; }
    sb_printf(s, "%s(\n", m->ops->type);
    for (int i = 0; i < m->nchildren; i++) {
        const ct_module *c = m->children[i];
        const char *leaf = strrchr(c->name, '.');
        leaf = leaf ? leaf + 1 : (c->name[0] ? c->name : NULL);
        sb_printf(s, "%*s(", 2 * (depth + 1), "");
        if (leaf) sb_printf(s, "%s", leaf); else sb_printf(s, "%d", i);
        sb_printf(s, "): ");
        repr_rec(c, s, depth + 1);
        sb_printf(s, "\n");
    }
    sb_printf(s, "%*s)", 2 * depth, "");
}

size_t ct_module_repr(const ct_module *m, char *buf, size_t n) {
    sbuf s = {buf, n, 0};
    if (buf && n) buf[0] = 0;
    repr_rec(m, &s, 0);
    return s.len;
}
