/* Dynamic loss scaling: torch.cuda.amp.GradScaler's update rule (_amp_update_scale_) and
 * unscale (_amp_foreach_non_finite_check_and_unscale_). */
#include "ctrain/optim.h"

#include <math.h>
#include <stdlib.h>

#include "core/kernel.h" /* device hooks: the pass on a GPU */

struct ct_grad_scaler {
    ct_grad_scaler_opts o;
    float scale;
    int32_t tracker;
};

ct_grad_scaler_opts ct_grad_scaler_default_opts(void) {
    return (ct_grad_scaler_opts){.init_scale = 65536.0f, .growth_factor = 2.0, .backoff_factor = 0.5,
                                 .growth_interval = 2000, .enabled = true, .min_scale = 1.0f};
}

ct_status ct_grad_scaler_create(const ct_grad_scaler_opts *opts, ct_grad_scaler **out) {
    *out = NULL;
    ct_grad_scaler_opts o = opts ? *opts : ct_grad_scaler_default_opts();
    if (!(o.init_scale > 0) || !isfinite(o.init_scale) || !(o.growth_factor > 1) || !(o.min_scale >= 0) ||
        o.min_scale > o.init_scale ||
        !(o.backoff_factor > 0 && o.backoff_factor < 1) || o.growth_interval < 1)
        return ct_error(CT_ERR_INVALID,
                        "grad scaler: need init_scale > 0 (%g), growth_factor > 1 (%g), 0 < backoff_factor < 1 (%g), "
                        "growth_interval >= 1 (%d), 0 <= min_scale <= init_scale (%g)", (double)o.init_scale, o.growth_factor,
                        o.backoff_factor, (int)o.growth_interval, (double)o.min_scale);
    ct_grad_scaler *s = calloc(1, sizeof *s);
    if (!s) return ct_error(CT_ERR_NOMEM, "grad scaler: out of memory");
    s->o = o;
    s->scale = o.init_scale;
    *out = s;
    return CT_OK;
}

void ct_grad_scaler_free(ct_grad_scaler *s) { free(s); }

float ct_grad_scaler_scale(const ct_grad_scaler *s) { return s->o.enabled ? s->scale : 1.0f; }

bool ct_grad_scaler_unscale_and_check(ct_grad_scaler *s, ct_params *p) {
    if (!s->o.enabled) return true;
    /* PyTorch: inv_scale = scale.double().reciprocal().float(); a value is checked before
     * it is scaled, and every gradient is scaled even when some are not finite */
    const float inv = (float)(1.0 / (double)s->scale);
    float *G = ct_params_grad(p);
    long n = (long)ct_params_numel(p);
    if (ct_params_device(p).type != CT_DEV_CPU) { /* the same pass on the device; a failure skips the step */
        const ct_device_hooks *h = ct_device_hooks_get(ct_params_device(p), "grad_scaler");
        bool nonfinite = true;
        if (h && !h->scale) ct_error(CT_ERR_UNSUPPORTED, "grad_scaler: the device backend has no scaling pass");
        else if (h && h->scale(ct_params_device(p).index, G, inv, n, &nonfinite) != CT_OK) nonfinite = true;
        return !nonfinite;
    }
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n > 32768)
    for (long i = 0; i < n; i++) {
        float g = G[i];
        bad |= !isfinite(g);
        G[i] = g * inv;
    }
    return !bad;
}

void ct_grad_scaler_update(ct_grad_scaler *s, bool found_inf) {
    if (!s->o.enabled) return;
    if (found_inf) {
        float backed = (float)((double)s->scale * s->o.backoff_factor);
        /* the floor: a scale that keeps halving towards 0 hides a diverged model */
        s->scale = backed < s->o.min_scale ? s->o.min_scale : backed;
        s->tracker = 0;
    } else if (s->tracker + 1 == s->o.growth_interval) {
        float grown = (float)((double)s->scale * s->o.growth_factor);
        if (isfinite(grown)) s->scale = grown; /* never grow past float range to inf */
        s->tracker = 0;
    } else {
        s->tracker++;
    }
}

ct_grad_scaler_state ct_grad_scaler_get_state(const ct_grad_scaler *s) {
    return (ct_grad_scaler_state){.scale = s->scale, .growth_tracker = s->tracker};
}

void ct_grad_scaler_set_state(ct_grad_scaler *s, ct_grad_scaler_state st) {
    s->scale = st.scale;
    s->tracker = st.growth_tracker;
}

bool ct_grad_scaler_at_floor(const ct_grad_scaler *s) { return s->o.enabled && s->scale <= s->o.min_scale; }
