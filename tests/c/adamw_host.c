/* adamw_host.c -- a C host that uses mojo_train through its header alone.
 *
 * Built and run by tests/test_native.py:
 *   cc -std=c11 -pthread -Inative/include tests/c/adamw_host.c -Lnative/build
 *      -lmojo_train_cpu_identical -Wl,-rpath,native/build -o adamw_host
 *
 * 1. Three AdamW steps (with clipping) on two tensors whose values are small dyadic
 *    rationals, exact in C and in Python alike; prints every resulting float's bits so the
 *    Python test can compare them with the Python API's result on the same inputs.
 * 2. A refused call: a NaN gradient returns MT_ENONFINITE, writes nothing to params, grads,
 *    moments or norm_out, and leaves a message in mt_last_error().
 * 3. mt_adamw_step from several pthreads at once on separate buffers (large enough for the
 *    library's own thread pool), each thread's bytes compared with the serial result; then a
 *    refused call in every thread, a barrier, and each thread reads back its own message
 *    (mt_last_error is thread-local).
 * Exit status 0 when every check holds; a failed check prints "FAIL ..." and exits 1.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mojo_train.h"

#define N0 100
#define N1 37
#define STEPS 3
#define BIG0 70001   /* > the library's inline threshold, so its pool takes part */
#define BIG1 30011
#define N_THREADS 4

static int failures = 0;

#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            printf("FAIL line %d: ", __LINE__);           \
            printf(__VA_ARGS__);                          \
            printf("\n");                                 \
            failures++;                                   \
        }                                                 \
    } while (0)

/* The shared recipe (tests/test_native.py builds the same numbers). */
static float param_at(int64_t i) { return (float)((int)(i % 17) - 8) / 16.0f; }
static float grad_at(int64_t i, int step) { return (float)((int)((i * 7 + step * 3) % 13) - 6) / 8.0f; }

typedef struct {
    int64_t n0, n1;
    float *p, *g, *m, *v;   /* p and g hold both tensors back to back; m, v are flat */
    float norm[2 * STEPS];
    int32_t offsets[3];
} problem;

static int problem_init(problem *pb, int64_t n0, int64_t n1) {
    int64_t n = n0 + n1;
    pb->n0 = n0;
    pb->n1 = n1;
    pb->p = calloc((size_t)n, sizeof(float));
    pb->g = calloc((size_t)n, sizeof(float));
    pb->m = calloc((size_t)n, sizeof(float));
    pb->v = calloc((size_t)n, sizeof(float));
    if (!pb->p || !pb->g || !pb->m || !pb->v) return -1;
    for (int64_t i = 0; i < n; ++i) pb->p[i] = param_at(i);
    pb->offsets[0] = 0;
    pb->offsets[1] = (int32_t)n0;
    pb->offsets[2] = (int32_t)n;
    memset(pb->norm, 0, sizeof pb->norm);
    return 0;
}

static void problem_free(problem *pb) {
    free(pb->p); free(pb->g); free(pb->m); free(pb->v);
}

/* Steps 1..STEPS: lr 1e-2, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1, max_norm 2.0. */
static int run_steps(problem *pb) {
    int64_t n = pb->n0 + pb->n1;
    float *params[2] = {pb->p, pb->p + pb->n0};
    float *grads[2] = {pb->g, pb->g + pb->n0};
    for (int step = 1; step <= STEPS; ++step) {
        for (int64_t i = 0; i < n; ++i) pb->g[i] = grad_at(i, step);
        int rc = mt_adamw_step(params, grads, pb->m, pb->v, pb->norm + 2 * (step - 1), pb->offsets,
                               1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 0, 1, 2.0f, step, 2);
        if (rc != MT_OK) return rc;
    }
    return MT_OK;
}

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static void print_bits(const char *name, const float *x, int64_t n) {
    printf("%s", name);
    for (int64_t i = 0; i < n; ++i) printf(" %08x", (unsigned)bits_of(x[i]));
    printf("\n");
}

static int same_bytes(const problem *a, const problem *b) {
    size_t bytes = (size_t)(a->n0 + a->n1) * sizeof(float);
    return memcmp(a->p, b->p, bytes) == 0 && memcmp(a->g, b->g, bytes) == 0 &&
           memcmp(a->m, b->m, bytes) == 0 && memcmp(a->v, b->v, bytes) == 0 &&
           memcmp(a->norm, b->norm, sizeof a->norm) == 0;
}

/* ---- 2. a refused call ----------------------------------------------------------------- */
static void check_refusal(problem *pb) {
    int64_t n = pb->n0 + pb->n1;
    size_t bytes = (size_t)n * sizeof(float);
    float *params[2] = {pb->p, pb->p + pb->n0};
    float *grads[2] = {pb->g, pb->g + pb->n0};
    pb->g[pb->n0 + 5] = NAN;
    float *before[4];
    float *now[4] = {pb->p, pb->g, pb->m, pb->v};
    for (int k = 0; k < 4; ++k) {
        before[k] = malloc(bytes);
        if (!before[k]) { printf("FAIL: out of memory\n"); exit(1); }
        memcpy(before[k], now[k], bytes);
    }
    float norm_out[2] = {-7.0f, -7.0f};
    for (int clip = 0; clip <= 1; ++clip) {
        int rc = mt_adamw_step(params, grads, pb->m, pb->v, norm_out, pb->offsets, 1e-2f, 0.9f,
                               0.999f, 1e-8f, 0.1f, 0, clip, 1e-3f, STEPS + 1, 2);
        CHECK(rc == MT_ENONFINITE, "NaN grad (clip=%d) returned %d, not MT_ENONFINITE", clip, rc);
        for (int k = 0; k < 4; ++k)
            CHECK(memcmp(before[k], now[k], bytes) == 0, "refused call (clip=%d) wrote buffer %d", clip, k);
        CHECK(norm_out[0] == -7.0f && norm_out[1] == -7.0f, "refused call (clip=%d) wrote norm_out", clip);
        const char *msg = mt_last_error();
        CHECK(msg != NULL && strstr(msg, "grads[1]") != NULL,
              "mt_last_error() after the refusal (clip=%d) is \"%s\", not naming grads[1]", clip,
              msg ? msg : "(null)");
    }
    printf("REFUSED %d %s\n", MT_ENONFINITE, mt_last_error());
    for (int k = 0; k < 4; ++k) free(before[k]);
}

/* ---- 3. several threads at once ----------------------------------------------------------- */
typedef struct {
    problem pb;
    int rc, refusal_rc, index;
    char message[512];
    pthread_barrier_t *barrier;
} thread_job;

static void *thread_main(void *arg) {
    thread_job *job = (thread_job *)arg;
    job->rc = run_steps(&job->pb);
    /* Thread k refuses for its own reason: a NaN or an infinity in grads[k % 2] (a step does
     * not read the params before its update: optim.md step 3). */
    int j = job->index % 2;
    int64_t at = (j ? job->pb.n0 : 0) + job->index;
    float *params[2] = {job->pb.p, job->pb.p + job->pb.n0};
    float *grads[2] = {job->pb.g, job->pb.g + job->pb.n0};
    float saved = job->pb.g[at];
    job->pb.g[at] = (job->index / 2) % 2 ? NAN : INFINITY;
    job->refusal_rc = mt_adamw_step(params, grads, job->pb.m, job->pb.v, job->pb.norm, job->pb.offsets,
                                    1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 0, 0, 0.0f, STEPS + 1, 2);
    job->pb.g[at] = saved;
    pthread_barrier_wait(job->barrier);   /* every thread has failed before any reads */
    snprintf(job->message, sizeof job->message, "%s", mt_last_error());
    return NULL;
}

static void check_threads(void) {
    problem serial;
    if (problem_init(&serial, BIG0, BIG1)) { printf("FAIL: out of memory\n"); exit(1); }
    CHECK(run_steps(&serial) == MT_OK, "serial big run failed: %s", mt_last_error());
    thread_job jobs[N_THREADS];
    pthread_t threads[N_THREADS];
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, N_THREADS);
    for (int k = 0; k < N_THREADS; ++k) {
        if (problem_init(&jobs[k].pb, BIG0, BIG1)) { printf("FAIL: out of memory\n"); exit(1); }
        jobs[k].index = k;
        jobs[k].barrier = &barrier;
    }
    for (int k = 0; k < N_THREADS; ++k)
        CHECK(pthread_create(&threads[k], NULL, thread_main, &jobs[k]) == 0, "pthread_create %d", k);
    for (int k = 0; k < N_THREADS; ++k) pthread_join(threads[k], NULL);
    for (int k = 0; k < N_THREADS; ++k) {
        char want[32];
        snprintf(want, sizeof want, "grads[%d]", k % 2);
        CHECK(jobs[k].rc == MT_OK, "thread %d: steps returned %d", k, jobs[k].rc);
        CHECK(same_bytes(&jobs[k].pb, &serial), "thread %d: result differs from the serial run", k);
        CHECK(jobs[k].refusal_rc == MT_ENONFINITE, "thread %d: refusal returned %d", k, jobs[k].refusal_rc);
        CHECK(strstr(jobs[k].message, want) != NULL, "thread %d: its mt_last_error() is \"%s\", not naming %s",
              k, jobs[k].message, want);
        problem_free(&jobs[k].pb);
    }
    pthread_barrier_destroy(&barrier);
    problem_free(&serial);
    printf("THREADS %d\n", N_THREADS);
}

int main(void) {
    printf("IDENTITY %s %s %d %llu\n", mt_vendor(), mt_numeric_mode(), mt_abi_version(),
           (unsigned long long)mt_features());
    CHECK(mt_abi_version() == MT_ABI_VERSION, "mt_abi_version() %d != header's %d", mt_abi_version(),
          MT_ABI_VERSION);
    CHECK(strcmp(mt_numeric_mode(), "identical") == 0, "numeric mode %s", mt_numeric_mode());

    problem pb;
    if (problem_init(&pb, N0, N1)) { printf("FAIL: out of memory\n"); return 1; }
    int rc = run_steps(&pb);
    CHECK(rc == MT_OK, "adamw steps returned %d: %s", rc, mt_last_error());
    print_bits("PARAMS", pb.p, N0 + N1);
    print_bits("EXP_AVG", pb.m, N0 + N1);
    print_bits("EXP_AVG_SQ", pb.v, N0 + N1);
    print_bits("GRADS", pb.g, N0 + N1);
    print_bits("NORMS", pb.norm, 2 * STEPS);
    check_refusal(&pb);
    problem_free(&pb);

    check_threads();
    if (failures) {
        printf("FAILURES %d\n", failures);
        return 1;
    }
    printf("OK\n");
    return 0;
}
