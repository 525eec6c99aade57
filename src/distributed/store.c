/* The public store client calls. A ct_store is ctrain's own client (store_client.c,
 * ct_store_connect) or PyTorch's TCPStore client (store_c10d.c, ct_store_connect_c10d);
 * both sit behind the ct_store_ops of store_internal.h. Each call here checks its
 * arguments the same way for both, then goes to the client's operation once. The server is
 * store_server.c; the sockets and frames under all of them are store_sock.c. */
#include <stdlib.h>
#include <string.h>

#include "ctrain/dist.h"
#include "store_internal.h"

const char *ct_store_protocol(const ct_store *c) { return c ? c->ops->protocol(c) : NULL; }

void ct_store_set_timeout(ct_store *c, double timeout_s) {
    if (c) c->timeout = timeout_s >= 0.01 ? timeout_s : 0.01; /* NaN too: a reply is never awaited forever by mistake */
}

void ct_store_free(ct_store *c) {
    if (c) c->ops->close(c);
}

static ct_status check_key(const char *key) {
    if (!key || strlen(key) > CT_STORE_MAX_KEY) return ct_error(CT_ERR_INVALID, "store key too long or NULL");
    return CT_OK;
}

ct_status ct_store_set(ct_store *c, const char *key, const void *val, size_t len) {
    if (check_key(key)) return CT_ERR_INVALID;
    if (len > CT_STORE_MAX_VALUE) return ct_error(CT_ERR_INVALID, "store value of %zu bytes is over the limit", len);
    return c->ops->set(c, key, val, len);
}

ct_status ct_store_get(ct_store *c, const char *key, double timeout_s, void **val, size_t *len) {
    *val = NULL;
    if (len) *len = 0;
    if (check_key(key)) return CT_ERR_INVALID;
    return c->ops->get(c, key, timeout_s, val, len);
}

ct_status ct_store_wait(ct_store *c, const char *const *keys, int nkeys, double timeout_s) {
    double deadline = ct_time_now() + timeout_s;
    for (int i = 0; i < nkeys; i++) {
        void *v;
        double left = deadline - ct_time_now();
        ct_status st = ct_store_get(c, keys[i], left > 0 ? left : 0, &v, NULL);
        if (st) return st;
        free(v);
    }
    return CT_OK;
}

ct_status ct_store_add(ct_store *c, const char *key, int64_t delta, int64_t *out) {
    if (check_key(key)) return CT_ERR_INVALID;
    return c->ops->add(c, key, delta, out);
}

ct_status ct_store_compare_set(ct_store *c, const char *key, const void *expected, size_t elen, const void *desired,
                               size_t dlen, void **cur, size_t *curlen) {
    if (cur) *cur = NULL;
    if (check_key(key)) return CT_ERR_INVALID;
    if (elen > CT_STORE_MAX_VALUE || dlen > CT_STORE_MAX_VALUE) return ct_error(CT_ERR_INVALID, "store value too large");
    return c->ops->compare_set(c, key, expected, elen, desired, dlen, cur, curlen);
}

ct_status ct_store_delete(ct_store *c, const char *key, bool *existed) {
    if (check_key(key)) return CT_ERR_INVALID;
    return c->ops->del(c, key, existed);
}

ct_status ct_store_check(ct_store *c, const char *key, bool *exists) {
    if (check_key(key)) return CT_ERR_INVALID;
    return c->ops->check(c, key, exists);
}

ct_status ct_store_num_keys(ct_store *c, int64_t *out) { return c->ops->num_keys(c, out); }
