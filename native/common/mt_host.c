/* mt_host.c -- see mt_host.h. Identity exports live here so every vendor reports the same
 * way; MT_NUMERIC_MODE and MT_VENDOR_NAME come from the build. Nothing here may call into a
 * vendor's code: test emulators link this file alone (tests/test_embedding.py), so a shared
 * entry that ends in a vendor's function lives in a file of its own (mt_lm_head_args.c,
 * mt_attention_args.c). */
#include <stdlib.h>
#include "mt_host.h"
#include "mt_pinned.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#if defined(_MSC_VER)
#define MT_THREAD_LOCAL __declspec(thread)
#else
#define MT_THREAD_LOCAL _Thread_local
#endif

static MT_THREAD_LOCAL char g_error[512];

int mt_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    return code;
}

void mt_clear_error(void) { g_error[0] = '\0'; }

const char *mt_last_error(void) { return g_error; }

unsigned mt_fp_current(void) {
#if defined(__x86_64__) || defined(__i386__)
    return _mm_getcsr();
#elif defined(__aarch64__)
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    return (unsigned)fpcr;
#else
    return 0;
#endif
}

void mt_fp_set(unsigned control) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(control);
#elif defined(__aarch64__)
    uint64_t fpcr = control;
    __asm__ volatile("msr fpcr, %0" : : "r"(fpcr));
#else
    (void)control;
#endif
}

void mt_fp_begin(mt_fp_env *env) {
    env->saved = mt_fp_current();
#if defined(__x86_64__) || defined(__i386__)
    /* clear FTZ (bit 15), DAZ (bit 6) and the rounding field (bits 13-14: nearest) */
    mt_fp_set(env->saved & ~((1u << 15) | (1u << 6) | (3u << 13)));
#elif defined(__aarch64__)
    /* clear FZ (bit 24), FZ16 (bit 19) and RMode (bits 22-23: nearest) */
    mt_fp_set(env->saved & ~((1u << 24) | (1u << 19) | (3u << 22)));
#endif
}

void mt_fp_end(const mt_fp_env *env) { mt_fp_set(env->saved); }

MT_NOINLINE float mt_host_one_minus_pow(float base, int64_t exponent) {
    return mt_one_minus_pow_f32(base, exponent);
}

MT_NOINLINE float mt_host_round(double x) { return (float)x; }

MT_NOINLINE float mt_host_dropout_scale(float p) { return mt_dropout_scale(p); }


int mt_abi_version(void) { return MT_ABI_VERSION; }

const char *mt_vendor(void) { return MT_VENDOR_NAME; }

const char *mt_numeric_mode(void) {
#if MT_NUMERIC_MODE == MT_MODE_IDENTICAL
    return "identical";
#elif MT_NUMERIC_MODE == MT_MODE_IDENTICAL_FTZ
    return "identical_ftz";
#elif MT_NUMERIC_MODE == MT_MODE_DETERMINISTIC
    return "deterministic";
#else
    return "fast";
#endif
}

uint64_t mt_features(void) {
    uint64_t f = mt_vendor_features() | mt_optim_features() | mt_clip_features() | mt_loss_features() | mt_linear_features() | mt_rms_norm_features() | mt_layer_norm_features() | mt_lm_head_features() |
                 mt_embedding_features() | mt_random_features() | mt_accumulate_features() |
                 mt_elementwise_features() | mt_schedule_features() | mt_attention_features();
#if MT_NUMERIC_MODE == MT_MODE_IDENTICAL_FTZ
    f |= MT_FEATURE_PINNED_MATH | MT_FEATURE_FLUSH_RULE;
#elif MT_PINNED_ARITHMETIC
    f |= MT_FEATURE_PINNED_MATH;
#else
    f |= MT_FEATURE_CONTRACTION;
#endif
    return f;
}

int mt_check_ptr(const void *p, const char *name) {
    return p ? MT_OK : mt_fail(MT_EINVAL, "%s is NULL", name);
}

int mt_check_count(int64_t v, const char *name) {
    return v < 0 ? mt_fail(MT_EINVAL, "%s must be >= 0, got %lld", name, (long long)v) : MT_OK;
}

int mt_check_tensor(const void *p, int64_t elems, const char *name) {
    return elems > 0 ? mt_check_ptr(p, name) : MT_OK;
}

/* x * y elements (`what` names the tensor and its factors): at most 2^60. */
static int check_product(int64_t x, int64_t y, const char *what) {
    const int64_t max_elems = (int64_t)1 << 60;
    if (x && y > max_elems / x)
        return mt_fail(MT_EINVAL, "%s = %lld x %lld elements is too large", what, (long long)x, (long long)y);
    return MT_OK;
}

int mt_check_linear_sizes(int64_t m, int64_t n, int64_t k) {
    int rc;
    if ((rc = mt_check_count(m, "m")) || (rc = mt_check_count(n, "n")) || (rc = mt_check_count(k, "k")) ||
        (rc = check_product(m, k, "a (m x k)")) || (rc = check_product(n, k, "weight (n x k)")) ||
        (rc = check_product(m, n, "out (m x n)")))
        return rc;
    return MT_OK;
}

static int check_rms_norm_sizes(float eps, int64_t rows, int64_t dim) {
    int rc;
    if (dim < 1) return mt_fail(MT_EINVAL, "dim must be >= 1, got %lld", (long long)dim);
    if ((rc = mt_check_count(rows, "rows")) || (rc = check_product(rows, dim, "x (rows x dim)"))) return rc;
    return mt_check_nonneg(eps, "eps");
}

int mt_check_rms_norm_forward_args(const float *y, const float *x, float eps, int64_t rows, int64_t dim) {
    int rc;
    if ((rc = check_rms_norm_sizes(eps, rows, dim)) || (rc = mt_check_tensor(y, rows * dim, "y")) ||
        (rc = mt_check_tensor(x, rows * dim, "x")))
        return rc;
    return MT_OK;
}

int mt_check_rms_norm_backward_args(const float *dweight, const float *dy, const float *x, const float *weight,
                                    float eps, int64_t rows, int64_t dim) {
    int rc;
    if ((rc = check_rms_norm_sizes(eps, rows, dim)) || (rc = mt_check_tensor(dy, rows * dim, "dy")) ||
        (rc = mt_check_tensor(x, rows * dim, "x")))
        return rc;
    if (dweight && !weight)
        return mt_fail(MT_EINVAL, "dweight was asked for but weight is NULL (no affine weight, no gradient)");
    return MT_OK;
}

int mt_check_map_flags(uint32_t flags) {
    if (flags & ~(uint32_t)MT_MAP_OUT_FRESH)
        return mt_fail(MT_EINVAL, "flags 0x%x has unknown bits: 0 or MT_MAP_OUT_FRESH (1)", (unsigned)flags);
    return MT_OK;
}

int mt_check_map_args(const float *out, const float *a, const float *b, int64_t n, const char *const names[3]) {
    int rc;
    if ((rc = mt_check_ptr(out, names[0])) || (rc = mt_check_ptr(a, names[1])) ||
        (b != a && (rc = mt_check_ptr(b, names[2]))))
        return rc;
    if (n < 0) return mt_fail(MT_EINVAL, "n must be >= 0, got %lld", (long long)n);
    if ((rc = mt_check_alias(out, a, n, 1, names[0], names[1])) ||
        (b != a && (rc = mt_check_alias(out, b, n, 1, names[0], names[2]))))
        return rc;
    return MT_OK;
}

int mt_check_dropout_args(const float *y, const float *x, float p, uint64_t offset, int64_t n, uint32_t flags,
                          const char *yname, const char *xname) {
    int rc;
    const char *why = mt_dropout_problem(p);
    if ((rc = mt_check_ptr(y, yname)) || (rc = mt_check_ptr(x, xname)) || (rc = mt_check_span(offset, n))) return rc;
    if (why) return mt_fail(MT_EINVAL, "%s, got %g", why, (double)p);
    if ((rc = mt_check_alias(y, x, n, 1, yname, xname)) || (rc = mt_check_map_flags(flags))) return rc;
    return MT_OK;
}

int mt_check_span(uint64_t offset, int64_t n) {
    const char *why = mt_span_problem(offset, n);
    return why ? mt_fail(MT_EINVAL, "%s (offset %llu, n %lld)", why, (unsigned long long)offset, (long long)n)
               : MT_OK;
}

int mt_bytes_overlap(const void *a, int64_t a_bytes, const void *b, int64_t b_bytes) {
    if (!a || !b || a_bytes <= 0 || b_bytes <= 0) return 0;
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return a0 < b0 + (uintptr_t)b_bytes && b0 < a0 + (uintptr_t)a_bytes;
}

int mt_check_alias(const float *out, const float *in, int64_t n, int in_place_ok, const char *out_name,
                   const char *in_name) {
    uintptr_t o = (uintptr_t)out, i = (uintptr_t)in;
    if (!mt_bytes_overlap(out, n * 4, in, n * 4) || (in_place_ok && o == i)) return MT_OK;
    if (o == i) return mt_fail(MT_EINVAL, "%s is %s; %s must be a buffer of its own", out_name, in_name, out_name);
    return mt_fail(MT_EINVAL, "%s and %s overlap without being the same buffer (%s starts %llu bytes %s %s); pass %s",
                   out_name, in_name, out_name, (unsigned long long)(o > i ? o - i : i - o), o > i ? "after" : "before",
                   in_name, in_place_ok ? "the very same buffer (in place) or a separate one" : "a separate buffer");
}

static int check_list(float *const *table, const int32_t *offsets, int32_t n_tensors, const char *name,
                      int allow_empty) {
    if (n_tensors < 1) return mt_fail(MT_EINVAL, "n_tensors must be >= 1 (got %d) for %s", (int)n_tensors, name);
    if (!table) return mt_fail(MT_EINVAL, "%s is NULL", name);
    if (!offsets) return mt_fail(MT_EINVAL, "offsets of %s is NULL", name);
    if (offsets[0] != 0) return mt_fail(MT_EINVAL, "offsets[0] of %s must be 0, got %d", name, (int)offsets[0]);
    for (int32_t j = 0; j < n_tensors; ++j) {
        if (offsets[j + 1] < offsets[j] || (offsets[j + 1] == offsets[j] && !allow_empty))
            return mt_fail(MT_EINVAL, "offsets of %s must rise strictly (tensor %d is empty or negative)", name, (int)j);
        if (!table[j] && offsets[j + 1] > offsets[j]) return mt_fail(MT_EINVAL, "%s[%d] is NULL", name, (int)j);
    }
    return MT_OK;
}

int mt_check_registry(float *const *table, const int32_t *offsets, int32_t n_tensors,
                      const char *name) {
    return check_list(table, offsets, n_tensors, name, 0);
}

int mt_check_registry_empty_ok(float *const *table, const int32_t *offsets, int32_t n_tensors,
                               const char *name) {
    return check_list(table, offsets, n_tensors, name, 1);
}

int mt_check_norm_type(float norm_type, int *kind) {
    if (norm_type == 2.0f) *kind = MT_NORM_KIND_L2;
    else if (norm_type == 1.0f) *kind = MT_NORM_KIND_L1;
    else if (norm_type == INFINITY) *kind = MT_NORM_KIND_INF;
    else return mt_fail(MT_EINVAL, "norm_type must be 2, 1 or inf (torch's norm_type), got %g", (double)norm_type);
    return MT_OK;
}

int mt_check_finite_scalar(float x, const char *name) {
    return mt_is_finite(x) ? MT_OK : mt_fail(MT_EINVAL, "%s must be finite, got %g", name, (double)x);
}

int mt_check_nonneg(float x, const char *name) {
    if (!mt_is_finite(x) || x < 0.0f) return mt_fail(MT_EINVAL, "%s must be finite and >= 0, got %g", name, (double)x);
    return MT_OK;
}

int mt_check_beta(float beta, const char *name) {
    if (!(beta >= 0.0f && beta < 1.0f)) return mt_fail(MT_EINVAL, "%s must be in [0, 1), got %g", name, (double)beta);
    return MT_OK;
}

static int check_clip(int32_t clip, float max_norm) {
    return clip ? mt_check_nonneg(max_norm, "max_norm") : MT_OK;
}

int mt_check_adam_args(float lr, float beta1, float beta2, float eps, float weight_decay,
                       int32_t clip, float max_norm, int64_t step) {
    int rc;
    if ((rc = mt_check_nonneg(lr, "lr")) || (rc = mt_check_beta(beta1, "beta1")) ||
        (rc = mt_check_beta(beta2, "beta2")) || (rc = mt_check_nonneg(eps, "eps")) ||
        (rc = mt_check_nonneg(weight_decay, "weight_decay")) || (rc = check_clip(clip, max_norm)))
        return rc;
    if (step < 1) return mt_fail(MT_EINVAL, "step must be >= 1 (one-based), got %lld", (long long)step);
    return MT_OK;
}

int mt_check_sgd_args(float lr, float momentum, float dampening, float weight_decay,
                      int32_t nesterov, int32_t clip, float max_norm) {
    int rc;
    if ((rc = mt_check_nonneg(lr, "lr")) || (rc = mt_check_nonneg(momentum, "momentum")) ||
        (rc = mt_check_finite_scalar(dampening, "dampening")) ||
        (rc = mt_check_nonneg(weight_decay, "weight_decay")) || (rc = check_clip(clip, max_norm)))
        return rc;
    if (nesterov && (momentum == 0.0f || dampening != 0.0f))
        return mt_fail(MT_EINVAL, "nesterov needs momentum > 0 and dampening == 0 (got momentum %g, dampening %g)",
                       (double)momentum, (double)dampening);
    return MT_OK;
}

int mt_one_minus_pow(float *out, float base, int64_t exponent) {
    int rc;
    if ((rc = mt_check_ptr(out, "out"))) return rc;
    if (!(base >= -1.0f && base <= 1.0f)) return mt_fail(MT_EINVAL, "base must be in [-1, 1], got %g", (double)base);
    if (exponent < 0) return mt_fail(MT_EINVAL, "exponent must be >= 0, got %lld", (long long)exponent);
    mt_fp_env env;
    mt_fp_begin(&env);
    *out = mt_host_one_minus_pow(base, exponent);
    mt_fp_end(&env);
    return MT_OK;
}

int mt_philox4x32_10(uint32_t *out, const uint32_t *counter, const uint32_t *key) {
    int rc;
    if ((rc = mt_check_ptr(out, "out")) || (rc = mt_check_ptr(counter, "counter")) || (rc = mt_check_ptr(key, "key")))
        return rc;
    uint32_t tmp[4];
    mt_philox4x32_10_block(tmp, counter, key);
    for (int i = 0; i < 4; ++i) out[i] = tmp[i];
    return MT_OK;
}

/* Out of line and under IEEE defaults: comparisons of subnormals must not see zeros. */
MT_NOINLINE static int uniform_bounds(float *width, float *lo, float *hi, double low, double high) {
    *lo = (float)low;
    *hi = (float)high;
    *width = *hi - *lo;
    return *lo < *hi;
}

int mt_check_uniform_args(float *width, float *low32, const float *out, uint64_t offset, double low, double high,
                          int64_t n) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    float lo, hi;
    mt_fp_env env;
    mt_fp_begin(&env);
    int ordered = uniform_bounds(width, &lo, &hi, low, high);
    mt_fp_end(&env);
    if (!mt_is_finite(lo)) return mt_fail(MT_EINVAL, "low must be finite in float32, got %g", low);
    if (!mt_is_finite(hi)) return mt_fail(MT_EINVAL, "high must be finite in float32, got %g", high);
    if (!ordered) return mt_fail(MT_EINVAL, "low must be < high in float32 (got %g, %g)", low, high);
    if (!mt_is_finite(*width)) return mt_fail(MT_EINVAL, "high - low overflows float32");
    if (n < 0) return mt_fail(MT_EINVAL, "n must be >= 0, got %lld", (long long)n);
    if ((rc = mt_check_span(offset, n))) return rc;
    *low32 = lo;
    return MT_OK;
}

/* ---- scratch memory counters ---- */
static int64_t mem_now, mem_peak;

void mt_mem_count(int64_t bytes) {
    int64_t now = __atomic_add_fetch(&mem_now, bytes, __ATOMIC_RELAXED);
    int64_t peak = __atomic_load_n(&mem_peak, __ATOMIC_RELAXED);
    while (now > peak &&
           !__atomic_compare_exchange_n(&mem_peak, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

void *mt_scratch_alloc(int64_t bytes, const char *what) {
    void *p = bytes > 0 ? malloc((size_t)bytes) : NULL;
    if (bytes > 0 && !p) {
        mt_fail(MT_ENOMEM, "cannot allocate %lld bytes for %s", (long long)bytes, what);
        return NULL;
    }
    mt_mem_count(bytes);
    return p;
}

void mt_scratch_free(void *p, int64_t bytes) {
    if (!p) return;
    free(p);
    mt_mem_count(-bytes);
}

int mt_memory_stats(int64_t *out, int32_t reset) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    out[0] = __atomic_load_n(&mem_now, __ATOMIC_RELAXED);
    out[1] = __atomic_load_n(&mem_peak, __ATOMIC_RELAXED);
    if (reset) __atomic_store_n(&mem_peak, out[0], __ATOMIC_RELAXED);
    return MT_OK;
}

/* ---- checks and reductions the loss ops of every vendor share ---- */
static int check_smoothing_and_items(float label_smoothing, int64_t num_items) {
    if (!(label_smoothing >= 0.0f && label_smoothing < 1.0f))
        return mt_fail(MT_EINVAL, "label_smoothing must be finite and in [0, 1), got %g", (double)label_smoothing);
    if (num_items < 0)
        return mt_fail(MT_EINVAL, "num_items must be >= 1, or 0 for the count of non-ignored rows; got %lld",
                       (long long)num_items);
    return MT_OK;
}

int mt_check_outputs_apart(const mt_named_buf *bufs, int n) {
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
            if (bufs[i].out && i != j && (j > i || !bufs[j].out) &&
                mt_bytes_overlap(bufs[i].p, bufs[i].bytes, bufs[j].p, bufs[j].bytes))
                return mt_fail(MT_EINVAL, "%s and %s overlap; %s must be a buffer of its own", bufs[i].name,
                               bufs[j].name, bufs[i].name);
    return MT_OK;
}

int mt_check_linear_outputs(const float *da, const float *dweight, const float *dbias, int64_t m, int64_t n,
                            int64_t k) {
    const mt_named_buf outs[3] = {{"da", da, m * k * 4, 1}, {"dweight", dweight, n * k * 4, 1},
                                  {"dbias", dbias, n * 4, 1}};
    return mt_check_outputs_apart(outs, 3);
}

int mt_check_lm_head_args(const float *loss_out, const float *row_loss, const float *d_hidden,
                          const float *d_weight, const float *d_bias, const float *hidden,
                          const float *weight, const float *bias, const void *targets,
                          int32_t target_bytes, int64_t rows, int64_t vocab, int64_t width,
                          int32_t reduction, float label_smoothing, int64_t num_items,
                          int64_t chunk_rows) {
    int rc;
    if (reduction < MT_REDUCTION_NONE || reduction > MT_REDUCTION_MEAN)
        return mt_fail(MT_EINVAL, "reduction must be 0 (none), 1 (sum) or 2 (mean), got %d", (int)reduction);
    if (rows < 0 || width < 0 || vocab < 1 || vocab >= ((int64_t)1 << 24) || chunk_rows < 0)
        return mt_fail(MT_EINVAL, "rows (%lld) and width (%lld) must be >= 0, vocab (%lld) in [1, 2^24), "
                       "chunk_rows (%lld) >= 0", (long long)rows, (long long)width, (long long)vocab,
                       (long long)chunk_rows);
    if (reduction == MT_REDUCTION_NONE && (d_hidden || d_weight || d_bias))
        return mt_fail(MT_EINVAL, "reduction NONE has no gradient: d_hidden, d_weight and d_bias must be NULL");
    if (reduction == MT_REDUCTION_NONE ? !row_loss && rows > 0 : !loss_out)
        return mt_fail(MT_EINVAL, "%s is NULL", reduction == MT_REDUCTION_NONE ? "row_loss" : "loss_out");
    if (d_bias && !bias) return mt_fail(MT_EINVAL, "d_bias needs bias (the call has none)");
    if (target_bytes != 4 && target_bytes != 8)
        return mt_fail(MT_EINVAL, "target_bytes must be 4 or 8, got %d", (int)target_bytes);
    if ((rc = check_product(rows, width, "hidden (rows x width)")) ||
        (rc = check_product(vocab, width, "weight (vocab x width)")) ||
        (rc = check_product(rows, 8, "targets (rows of up to 8 bytes)")))   /* with width 0 rows is bound here */
        return rc;
    if (rows > 0 && ((rc = mt_check_ptr(hidden, "hidden")) || (rc = mt_check_ptr(targets, "targets"))))
        return rc;
    if ((rc = mt_check_ptr(weight, "weight"))) return rc;
    const mt_named_buf bufs[] = {
        {"loss_out", loss_out, reduction == MT_REDUCTION_NONE ? 0 : 4, 1}, {"row_loss", row_loss, reduction == MT_REDUCTION_NONE ? rows * 4 : 0, 1},
        {"d_hidden", d_hidden, rows * width * 4, 1}, {"d_weight", d_weight, vocab * width * 4, 1},
        {"d_bias", d_bias, vocab * 4, 1}, {"hidden", hidden, rows * width * 4, 0},
        {"weight", weight, vocab * width * 4, 0}, {"bias", bias, vocab * 4, 0},
        {"targets", targets, rows * target_bytes, 0}};
    if ((rc = mt_check_outputs_apart(bufs, (int)(sizeof bufs / sizeof bufs[0])))) return rc;
    return check_smoothing_and_items(label_smoothing, num_items);
}

int mt_check_targets(int64_t *kept, const void *targets, int32_t bytes, int64_t rows, int64_t vocab,
                     int64_t ignore_index) {
    int64_t count = 0;
    for (int64_t i = 0; i < rows; ++i) {
        int64_t t = mt_index_at(targets, bytes, i);
        if (t == ignore_index && ignore_index != MT_NO_IGNORE_INDEX) continue;
        if (t < 0 || t >= vocab) return mt_fail_target(i, t, vocab, ignore_index);
        ++count;
    }
    *kept = count;
    return MT_OK;
}

int mt_fail_target(int64_t row, int64_t value, int64_t vocab, int64_t ignore_index) {
    if (ignore_index == MT_NO_IGNORE_INDEX)
        return mt_fail(MT_EINVAL, "targets[%lld] = %lld is outside [0, %lld) (there is no ignore index); nothing "
                       "was written", (long long)row, (long long)value, (long long)vocab);
    return mt_fail(MT_EINVAL, "targets[%lld] = %lld is outside [0, %lld) and is not ignore_index (%lld); nothing "
                   "was written", (long long)row, (long long)value, (long long)vocab, (long long)ignore_index);
}

static MT_THREAD_LOCAL int64_t g_lm_row0 = -1;
static MT_THREAD_LOCAL int g_lm_bias;

void mt_logits_of_lm_head(int64_t row0, int has_bias) {
    g_lm_row0 = row0;
    g_lm_bias = has_bias;
}

/* The refusal of logits row `row` holding NaN or inf; `written`: what the caller may find
 * written (NULL: nothing). Inside the LM head the logits and their gradient are its scratch;
 * what it may have written is the chunks before the bad one. */
static int fail_nonfinite_logits(int64_t row, const char *written) {
    char tail[96];
    if (written)
        snprintf(tail, sizeof tail, "%s left undefined, loss_out not written", written);
    else
        snprintf(tail, sizeof tail, "nothing was written");
    if (g_lm_row0 < 0)
        return mt_fail(MT_ENONFINITE, "logits row %lld holds NaN or inf (every logit must be finite, ignored rows "
                       "too); %s", (long long)row, tail);
    return mt_fail(MT_ENONFINITE, "the logits of hidden row %lld (hidden @ weight.T%s) overflow float32 to inf or "
                   "NaN although %s are finite; scale hidden or weight down; %s",
                   (long long)(g_lm_row0 + row), g_lm_bias ? " + bias" : "",
                   g_lm_bias ? "hidden, weight and bias" : "hidden and weight",
                   g_lm_row0 > 0 ? "d_hidden, d_weight, d_bias and row_loss left undefined (earlier chunks "
                                   "were computed), loss_out not written"
                                 : "nothing was written");   /* its logits are its own scratch */
}

int mt_fail_nonfinite_logits(int64_t row) { return fail_nonfinite_logits(row, NULL); }

int mt_fail_nonfinite_logits_after(int64_t row, const char *written) { return fail_nonfinite_logits(row, written); }

float mt_token_sum(const float *x, int64_t rows, float *partials) {
    int64_t leaves = mt_token_leaves(rows);
    for (int64_t k = 0; k < leaves; ++k) {
        int64_t end = (k + 1) * MT_TOKEN_LEAF < rows ? (k + 1) * MT_TOKEN_LEAF : rows;
        float acc = 0.0f;
        for (int64_t r = k * MT_TOKEN_LEAF; r < end; ++r) acc = acc + x[r];
        partials[k] = acc;
    }
    return mt_token_tree(partials, leaves, 0);
}

int mt_check_accumulate_args(const float *out, const float *const *parts, int32_t n_parts, int64_t n) {
    if (n < 0) return mt_fail(MT_EINVAL, "n must be >= 0, got %lld", (long long)n);
    if (n_parts < 1) return mt_fail(MT_EINVAL, "n_parts must be >= 1, got %d", (int)n_parts);
    if (!parts) return mt_fail(MT_EINVAL, "parts is NULL");
    if (n == 0) return MT_OK;
    if (!out) return mt_fail(MT_EINVAL, "out is NULL");
    uintptr_t o0 = (uintptr_t)out, o1 = o0 + (uintptr_t)n * 4;
    for (int32_t k = 0; k < n_parts; ++k) {
        if (!parts[k]) return mt_fail(MT_EINVAL, "parts[%d] is NULL", (int)k);
        uintptr_t p0 = (uintptr_t)parts[k], p1 = p0 + (uintptr_t)n * 4;
        if (p0 < o1 && o0 < p1) return mt_fail(MT_EINVAL, "out overlaps parts[%d]; out must be its own buffer", (int)k);
    }
    return MT_OK;
}


int mt_check_ce_args(const float *loss_out, const float *row_loss, const float *dlogits,
                     const float *logits, const void *targets, int32_t target_bytes, int64_t n_rows,
                     int64_t vocab, int32_t reduction, float label_smoothing, int64_t num_items) {
    int rc;
    if (reduction < MT_REDUCTION_NONE || reduction > MT_REDUCTION_MEAN)
        return mt_fail(MT_EINVAL, "reduction must be 0 (none), 1 (sum) or 2 (mean), got %d", (int)reduction);
    if (n_rows < 0) return mt_fail(MT_EINVAL, "n_rows must be >= 0, got %lld", (long long)n_rows);
    if (vocab < 1 || vocab >= ((int64_t)1 << 24))
        return mt_fail(MT_EINVAL, "vocab must be in [1, 2^24), got %lld", (long long)vocab);
    if (n_rows > INT64_MAX / 4 / vocab)
        return mt_fail(MT_EINVAL, "n_rows * vocab overflows (%lld x %lld)", (long long)n_rows, (long long)vocab);
    if (target_bytes != 4 && target_bytes != 8)
        return mt_fail(MT_EINVAL, "target_bytes must be 4 (int32) or 8 (int64), got %d", (int)target_bytes);
    if (n_rows > 0 && ((rc = mt_check_ptr(logits, "logits")) || (rc = mt_check_ptr(targets, "targets"))))
        return rc;
    if (reduction == MT_REDUCTION_NONE) {
        if (!row_loss) return mt_fail(MT_EINVAL, "row_loss is NULL; reduction NONE returns the per-row losses there");
        if (dlogits)
            return mt_fail(MT_EINVAL, "dlogits must be NULL with reduction NONE: 'none' has no gradient "
                                      "(the placement of a per-row upstream gradient is not in loss v1)");
    } else if ((rc = mt_check_ptr(loss_out, "loss_out"))) {
        return rc;
    }
    return check_smoothing_and_items(label_smoothing, num_items);
}

int mt_find_bad_state(int64_t *first_bad, const float *x, int64_t n, int32_t nonnegative) {
    int rc;
    if ((rc = mt_check_ptr(first_bad, "first_bad"))) return rc;
    if (n < 0) return mt_fail(MT_EINVAL, "n must be >= 0, got %lld", (long long)n);
    if (n > 0 && (rc = mt_check_ptr(x, "x"))) return rc;
    for (int64_t i = 0; i < n; ++i) {       /* bit tests: no float operation, no FP environment */
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        /* a second moment (nonnegative): NaN or below zero (-inf too; -0.0 is not); +inf is what a step
         * writes when a gradient's square overflows. Else NaN or either infinity. */
        int bad = nonnegative ? (u & 0x7fffffffu) > 0x7f800000u || ((u >> 31) && (u & 0x7fffffffu))
                              : (u & 0x7f800000u) == 0x7f800000u;
        if (bad) {
            *first_bad = i;
            return MT_OK;
        }
    }
    *first_bad = -1;
    return MT_OK;
}
