/* mt_host.h -- host-side glue every vendor shares: the thread-local error message, argument
 * checks that run before any work (so a refused call writes nothing), and the identity of the
 * build. Vendors compile mt_host.c into their library beside their own kernels. */
#ifndef MT_HOST_H
#define MT_HOST_H
#include <stdint.h>
#include "mojo_train.h"

#ifndef MT_VENDOR_NAME
#define MT_VENDOR_NAME "cpu"
#endif

#ifdef __cplusplus
extern "C" {
#endif

int mt_fail(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void mt_clear_error(void);

/* Checks: return MT_OK or the code mt_fail returned. `name` is the argument's name. */
int mt_check_registry(float *const *table, const int32_t *offsets, int32_t n_tensors,
                      const char *name);
int mt_check_ptr(const void *p, const char *name);
int mt_check_finite_scalar(float x, const char *name);
int mt_check_nonneg(float x, const char *name);
int mt_check_beta(float beta, const char *name);
int mt_check_adam_args(float lr, float beta1, float beta2, float eps, float weight_decay,
                       int32_t clip, float max_norm, int64_t step);
int mt_check_sgd_args(float lr, float momentum, float dampening, float weight_decay,
                      int32_t nesterov, int32_t clip, float max_norm);

/* mt_uniform_fill's arguments; on success *width = high - low (rounded once). */
int mt_check_uniform_args(float *width, const float *out, float low, float high, int64_t n);

/* The vendor's feature bits beyond the tier's (defined by each vendor). */
uint64_t mt_vendor_features(void);

#ifdef __cplusplus
}
#endif
#endif
