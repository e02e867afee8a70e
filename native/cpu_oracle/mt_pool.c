/* mt_pool.c -- see mt_pool.h. Threads start on first use and live for the process (a forked
 * child starts its own). The number of threads comes from MOJO_TRAIN_NUM_THREADS, else the
 * online processor count. Each job runs in the caller's floating-point environment. */
#include "mt_pool.h"
#include "mt_host.h"
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#define MT_POOL_MAX 64
#define MT_INLINE_WORK 65536

static pthread_mutex_t g_busy = PTHREAD_MUTEX_INITIALIZER;   /* one job at a time */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;   /* guards the fields below */
static pthread_cond_t g_start = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_done = PTHREAD_COND_INITIALIZER;
static pthread_once_t g_fork_once = PTHREAD_ONCE_INIT;
static int g_threads = 0;        /* workers + the caller */
static int g_started = 0;        /* workers running */
static uint64_t g_generation = 0;
static uint64_t g_birth[MT_POOL_MAX];   /* the generation each worker was started at */
static int g_pending = 0;
static mt_range_fn g_fn;
static void *g_ctx;
static int64_t g_n, g_grain;
static int g_parts;
static unsigned g_fp;            /* the caller's floating-point control word for this job */

static int default_threads(void) {
    const char *env = getenv("MOJO_TRAIN_NUM_THREADS");
    long n = env ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > MT_POOL_MAX) n = MT_POOL_MAX;
    return (int)n;
}

static void part_range(int part, int parts, int64_t n, int64_t grain, int64_t *b, int64_t *e) {
    int64_t units = (n + grain - 1) / grain;
    int64_t ub = units * part / parts, ue = units * (part + 1) / parts;
    *b = ub * grain;
    *e = ue * grain < n ? ue * grain : n;
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t seen = g_birth[id];
    for (;;) {
        pthread_mutex_lock(&g_lock);
        while (g_generation == seen) pthread_cond_wait(&g_start, &g_lock);
        seen = g_generation;
        int parts = g_parts;
        mt_range_fn fn = g_fn;
        void *ctx = g_ctx;
        int64_t n = g_n, grain = g_grain;
        unsigned fp = g_fp;
        pthread_mutex_unlock(&g_lock);
        if (id < parts) {
            int64_t b, e;
            part_range(id, parts, n, grain, &b, &e);
            if (b < e) {
                unsigned mine = mt_fp_current();
                mt_fp_set(fp);
                fn(ctx, b, e);
                mt_fp_set(mine);
            }
        }
        pthread_mutex_lock(&g_lock);
        if (--g_pending == 0) pthread_cond_signal(&g_done);
        pthread_mutex_unlock(&g_lock);
    }
    return NULL;
}

/* A forked child has none of the parent's workers: forget them and start afresh. */
static void after_fork_in_child(void) {
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    g_busy = m;
    g_lock = m;
    g_start = c;
    g_done = c;
    g_started = 0;
    g_pending = 0;
}

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

/* Called with g_busy held: no job is in flight, so g_generation is stable. */
static void ensure_started(void) {
    pthread_once(&g_fork_once, register_fork_handler);
    if (g_threads == 0) g_threads = default_threads();
    while (g_started < g_threads - 1) {
        pthread_t t;
        int id = g_started + 1;
        g_birth[id] = g_generation;
        if (pthread_create(&t, NULL, worker, (void *)(intptr_t)id) != 0) {
            g_threads = g_started + 1;
            break;
        }
        pthread_detach(t);
        g_started++;
    }
}

void mt_parallel_for_work(int64_t n, int64_t grain, int64_t work, mt_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (work <= MT_INLINE_WORK || pthread_mutex_trylock(&g_busy) != 0) {
        fn(ctx, 0, n);
        return;
    }
    ensure_started();
    int parts = g_threads;
    if (parts <= 1) {
        pthread_mutex_unlock(&g_busy);
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&g_lock);
    g_fn = fn; g_ctx = ctx; g_n = n; g_grain = grain; g_parts = parts; g_fp = mt_fp_current();
    g_pending = g_started;
    g_generation++;
    pthread_cond_broadcast(&g_start);
    pthread_mutex_unlock(&g_lock);
    int64_t b, e;
    part_range(0, parts, n, grain, &b, &e);
    if (b < e) fn(ctx, b, e);
    pthread_mutex_lock(&g_lock);
    while (g_pending > 0) pthread_cond_wait(&g_done, &g_lock);
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_unlock(&g_busy);
}

void mt_parallel_for(int64_t n, int64_t grain, mt_range_fn fn, void *ctx) {
    mt_parallel_for_work(n, grain, n, fn, ctx);
}

int mt_pool_threads(void) {
    if (g_threads == 0) g_threads = default_threads();
    return g_threads;
}

int mt_pool_set_threads(int n) {
    if (n < 1 || n > MT_POOL_MAX) return -1;
    pthread_mutex_lock(&g_busy);
    g_threads = n;
    if (n > g_started + 1) ensure_started();   /* extra workers stay parked: ids >= parts idle */
    pthread_mutex_unlock(&g_busy);
    return 0;
}
