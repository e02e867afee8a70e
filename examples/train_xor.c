/* train_xor.c -- train a small network from C through mojo_train.h alone.
 *
 * A two-layer perceptron learns XOR: logits = relu(x @ W1.T + b1) @ W2.T + b2, with a mean
 * cross-entropy loss and AdamW, every op a call into the library (identical numeric mode: the same
 * float32 bits on every vendor). The weights start from the library's own Philox stream.
 * It prints the loss every 25 steps and each input's prediction, and exits 0 only when the
 * loss fell below a tenth of its start and every prediction is right; 1 otherwise.
 *
 * Build and run it from any folder (here from the repository root, after `make`), or `make example`:
 *   B=$PWD/native/build; cc -std=c11 -Inative/include examples/train_xor.c -L$B \
 *      -lmojo_train_cpu_identical -Wl,-rpath,$B -o $B/train_xor && cd /tmp && $B/train_xor
 * The program needs the header to build and the one library to run; nothing else of the repo.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mojo_train.h"

#define ROWS 4     /* the four XOR inputs, one batch */
#define IN 2
#define HIDDEN 16
#define CLASSES 2
#ifndef STEPS
#define STEPS 200  /* -DSTEPS=1 shows the check failing: one step cannot learn XOR */
#endif
#define PRINT_EVERY 25

/* Stop with the library's message when a call is refused. */
#define CALL(expr)                                                                    \
    do {                                                                              \
        if ((expr) != MT_OK) {                                                        \
            fprintf(stderr, "train_xor: %s failed: %s\n", #expr, mt_last_error());    \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* The parameters, one flat buffer described by an offsets registry (the header's tensor list). */
enum { W1, B1, W2, B2, N_TENSORS };
static const int32_t OFFSETS[N_TENSORS + 1] = {
    0, HIDDEN * IN, HIDDEN * IN + HIDDEN, HIDDEN * IN + HIDDEN + CLASSES * HIDDEN,
    HIDDEN * IN + HIDDEN + CLASSES * HIDDEN + CLASSES};
#define N_PARAMS (HIDDEN * IN + HIDDEN + CLASSES * HIDDEN + CLASSES)

static const float X[ROWS * IN] = {0, 0, 0, 1, 1, 0, 1, 1};
static const int32_t Y[ROWS] = {0, 1, 1, 0};

struct net {
    float params[N_PARAMS], grads[N_PARAMS], exp_avg[N_PARAMS], exp_avg_sq[N_PARAMS];
    float pre[ROWS * HIDDEN], hid[ROWS * HIDDEN], logits[ROWS * CLASSES];
    float dlogits[ROWS * CLASSES], dhid[ROWS * HIDDEN], dpre[ROWS * HIDDEN];
};

static float *param(struct net *n, int j) { return n->params + OFFSETS[j]; }
static float *grad(struct net *n, int j) { return n->grads + OFFSETS[j]; }

/* Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) weights from Philox stream j, zero biases. */
static void init(struct net *n)
{
    CALL(mt_uniform_fill(param(n, W1), 7, W1, 0, -0.70710678, 0.70710678, HIDDEN * IN));
    CALL(mt_uniform_fill(param(n, W2), 7, W2, 0, -0.25, 0.25, CLASSES * HIDDEN));
    for (int i = OFFSETS[B1]; i < OFFSETS[B1 + 1]; i++) n->params[i] = 0.0f;
    for (int i = OFFSETS[B2]; i < OFFSETS[B2 + 1]; i++) n->params[i] = 0.0f;
}

static void forward(struct net *n)
{
    CALL(mt_linear_forward(n->pre, X, param(n, W1), param(n, B1), ROWS, HIDDEN, IN));
    CALL(mt_relu_forward(n->hid, n->pre, ROWS * HIDDEN));
    CALL(mt_linear_forward(n->logits, n->hid, param(n, W2), param(n, B2), ROWS, CLASSES, HIDDEN));
}

/* One training step: forward, loss and its gradient, backward, AdamW. Returns the loss. */
static float train_step(struct net *n, int64_t step)
{
    float loss;
    float *table_p[N_TENSORS], *table_g[N_TENSORS];
    forward(n);
    CALL(mt_cross_entropy(&loss, NULL, n->dlogits, n->logits, Y, sizeof Y[0], ROWS, CLASSES,
                          -100, MT_REDUCTION_MEAN, 0.0f, 0));
    CALL(mt_linear_backward(n->dhid, grad(n, W2), grad(n, B2), n->dlogits, n->hid, param(n, W2),
                            ROWS, CLASSES, HIDDEN));
    CALL(mt_relu_backward(n->dpre, n->dhid, n->pre, ROWS * HIDDEN));
    CALL(mt_linear_backward(NULL, grad(n, W1), grad(n, B1), n->dpre, X, param(n, W1),
                            ROWS, HIDDEN, IN));
    for (int j = 0; j < N_TENSORS; j++) {
        table_p[j] = param(n, j);
        table_g[j] = grad(n, j);
    }
    /* lr 0.05, torch's betas, eps and weight decay; no clipping (norm_out may be NULL). */
    CALL(mt_adamw_step(table_p, table_g, n->exp_avg, n->exp_avg_sq, NULL, OFFSETS, 0.05f, 0.9f,
                       0.999f, 1e-8f, 0.01f, 0, 0, 0.0f, step, N_TENSORS));
    return loss;
}

/* The loss of the trained weights and how many of the four inputs they classify right. */
static float evaluate(struct net *n, int *right)
{
    float loss;
    forward(n);
    CALL(mt_cross_entropy(&loss, NULL, NULL, n->logits, Y, sizeof Y[0], ROWS, CLASSES, -100,
                          MT_REDUCTION_MEAN, 0.0f, 0));
    *right = 0;
    for (int i = 0; i < ROWS; i++) {
        int guess = n->logits[i * CLASSES + 1] > n->logits[i * CLASSES];
        printf("  %g xor %g -> %d (want %d)\n", X[i * IN], X[i * IN + 1], guess, (int)Y[i]);
        *right += guess == Y[i];
    }
    return loss;
}

int main(void)
{
    static struct net n; /* zeroed: AdamW's moments start at zero */
    float first = 0.0f, loss;
    int right;
    printf("mojo_train %s library, %s numeric mode, ABI %d\n", mt_vendor(), mt_numeric_mode(), mt_abi_version());
    if (mt_abi_version() != MT_ABI_VERSION) {
        fprintf(stderr, "train_xor: built for ABI %d, the library has %d\n", MT_ABI_VERSION, mt_abi_version());
        return 1;
    }
    init(&n);
    for (int64_t step = 1; step <= STEPS; step++) {
        loss = train_step(&n, step);
        if (step == 1) first = loss;
        if (step == 1 || step % PRINT_EVERY == 0)
            printf("step %3lld  loss %.6f\n", (long long)step, loss);
    }
    loss = evaluate(&n, &right);
    int ok = loss < first / 10 && right == ROWS;
    printf("loss %.6f -> %.6f, %d of %d right: %s\n", first, loss, right, ROWS, ok ? "learned" : "FAILED");
    return ok ? 0 : 1;
}
