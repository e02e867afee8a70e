/* mt_schedule.c -- exact learning-rate schedules, host code shared by every vendor: NOT BUILT
 * YET (placeholder; mt_lr_values refuses with MT_EUNSUPPORTED, mt_schedule_features is 0). */
#include "mt_host.h"

uint64_t mt_schedule_features(void) { return 0; }

int mt_lr_values(float *out, int32_t kind, double peak_lr, double min_lr, int64_t warmup_steps, int64_t total_steps,
                 int64_t first_step, int64_t n) {
    return mt_fail(MT_EUNSUPPORTED, "mt_lr_values is not built yet");
}
