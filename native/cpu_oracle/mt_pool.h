/* mt_pool.h -- a persistent pthread pool for the CPU oracle.
 *
 * mt_parallel_for(n, grain, fn, ctx) splits [0, n) into contiguous ranges whose starts are
 * multiples of grain and runs fn(ctx, begin, end) on them, the caller's thread taking one.
 * The split decides only who computes what, never the arithmetic: every op's result is a
 * pure function of its inputs, whatever the thread count. Small jobs run inline. A second
 * caller arriving while the pool is busy runs its job inline rather than waiting. Workers
 * run each job under the caller's floating-point control word (see mt_fp_current).
 */
#ifndef MT_POOL_H
#define MT_POOL_H
#include <stdint.h>

typedef void (*mt_range_fn)(void *ctx, int64_t begin, int64_t end);

void mt_parallel_for(int64_t n, int64_t grain, mt_range_fn fn, void *ctx);
/* The same, deciding inline-or-parallel by `work` (e.g. elements) rather than by n items. */
void mt_parallel_for_work(int64_t n, int64_t grain, int64_t work, mt_range_fn fn, void *ctx);
int mt_pool_threads(void);
int mt_pool_set_threads(int n);

#endif
