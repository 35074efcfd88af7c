/* schedule.h: learning-rate schedule (docs/design.md, training), identical in dev/tsdc_io.py lr_at.
 *   update s (0-based): s < warmup: max_lr*(s+1)/warmup;
 *   else cosine from max_lr to final_frac*max_lr over [warmup, total): progress = (s-warmup)/(total-warmup),
 *   lr = lo + 0.5*(max_lr - lo)*(1 + cos(pi*min(progress,1))). Computed in double. */
#ifndef TSDC_SCHEDULE_H
#define TSDC_SCHEDULE_H

#include <math.h>

/* AdamW hyperparameters of one update (lr from the schedule) */
typedef struct { double lr, beta1, beta2, eps, weight_decay; } AdamW;

static inline double lr_at(long long step, double max_lr, int warmup, long long total, double final_frac) {
    if (step < warmup) return max_lr * (double)(step + 1) / (double)warmup;
    if (total <= warmup) return max_lr;
    double progress = (double)(step - warmup) / (double)(total - warmup);
    if (progress > 1.0) progress = 1.0;
    double lo = final_frac * max_lr;
    return lo + 0.5 * (max_lr - lo) * (1.0 + cos(M_PI * progress));
}

#endif
