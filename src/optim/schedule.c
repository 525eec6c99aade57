/* Learning-rate schedules: LambdaLR-style lambdas (Hugging Face `transformers` formulas),
 * see ct_lr_at in ctrain/optim.h. Evaluated in double, as Python does. */
#include "ctrain/optim.h"

#include <math.h>

double ct_lr_at(const ct_lr_schedule *s, int64_t step) {
    if (step < 0) step = 0;
    const int64_t W = s->warmup_steps > 0 ? s->warmup_steps : 0;
    if (step < W) return s->base_lr * ((double)step / (double)W);
    if (s->kind == CT_LR_CONSTANT) return s->base_lr;
    const int64_t span = s->total_steps - W > 1 ? s->total_steps - W : 1;
    double f;
    if (s->kind == CT_LR_LINEAR) {
        f = (double)(s->total_steps - step) / (double)span;
        if (f < 0) f = 0;
    } else {
        double progress = (double)(step - W) / (double)span;
        if (progress > 1) progress = 1; /* hold min_lr after the decay, as nanoGPT */
        f = 0.5 * (1.0 + cos(M_PI * progress));
    }
    return s->min_lr + (s->base_lr - s->min_lr) * f;
}
