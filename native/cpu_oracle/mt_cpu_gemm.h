/* mt_cpu_gemm.h -- the CPU oracle's GEMM and token-rule accumulators (contract: linear.md),
 * shared by linear (mt_cpu_linear.c), RMSNorm's dweight (mt_cpu_rms_norm.c) and the chunked
 * LM head.
 *
 * GEMM: every output C(i,j) is one chain over p = 0..k-1 in ascending order,
 * acc = MT_DOT_STEP(A(i,p), B(p,j), acc), starting from +0.0 or, with `accumulate`, from C's
 * current value (so a chain can be continued over several calls with consecutive p ranges).
 * Tiling, vector width (AVX-512, AVX2+FMA or scalar, chosen at run time) and the thread
 * count decide only who computes what: the bits are the chain's. Operands are addressed by
 * strides: A(i,p) = a[i*a_rs + p*a_cs], B(p,j) = b[p*b_rs + j*b_cs], C(i,j) = c[i*ldc + j].
 * MOJO_TRAIN_CPU_GEMM=avx512|avx2|scalar (read once) forces a kernel, for tests and
 * benchmarks; a kernel the CPU lacks falls back to the next one down.
 *
 * Token rule: partials of consecutive leaves (MT_TOKEN_LEAF tokens each) meet in the pairwise
 * tree of mt_tree_fold. mt_token_fold_rows folds partials held side by side; mt_token_acc
 * streams them with a stack of complete subtrees (log2(leaves) + 1 partials alive) and
 * gives the same bits.
 *
 * Inputs must be finite (callers refuse NaN/inf first; mt_cpu_nonfinite is the pre-pass).
 * Functions returning int give MT_OK or MT_ENOMEM (message set); they run on the thread pool
 * and, called from inside a pool job, run inline. Callers bracket them with mt_fp_begin/end.
 */
#ifndef MT_CPU_GEMM_H
#define MT_CPU_GEMM_H
#include <stdint.h>

/* B packed once into column panels, for GEMMs that reuse one B with many A (row chunks). */
typedef struct {
    float *data;     /* panels of nr columns: panel q, row p at data[(q*k + p)*nr] */
    void *base;      /* the allocation (data is base rounded up to 64 bytes) */
    int64_t k, n, nr, bytes;
} mt_gemm_b;

/* C (m x n) = chains of A (m x k) and B (k x n), see above. col_add (n floats, or NULL) is
 * added once to each finished chain: C(i,j) = chain + col_add[j] (a linear layer's bias;
 * pass it only with the call that ends the chains). k == 0 leaves chains of +0.0 (or C's
 * values when accumulating). Returns MT_OK or MT_ENOMEM (nothing written then). */
int mt_cpu_gemm(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_cs,
                const float *b, int64_t b_rs, int64_t b_cs, int64_t m, int64_t n, int64_t k,
                int accumulate, const float *col_add);

/* The same in two steps: pack B (k x n) once, run it against any number of A's. */
int mt_cpu_gemm_pack_b(mt_gemm_b *pb, const float *b, int64_t b_rs, int64_t b_cs, int64_t k,
                       int64_t n);
int mt_cpu_gemm_packed(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_cs,
                       const mt_gemm_b *pb, int64_t m, int accumulate, const float *col_add);
void mt_cpu_gemm_free_b(mt_gemm_b *pb);

/* The pairwise tree over m partial vectors of `width` floats stored one after another
 * (s[l*width + x] is leaf l's partial of element x), in place: the root lands in
 * s[0 .. width). m == 0 writes nothing (the root is +0.0 then: the caller's to write). */
void mt_token_fold_rows(float *s, int64_t m, int64_t width);

/* A running token-rule sum of `width`-float leaf partials. Write each leaf's partial into
 * mt_token_acc_leaf()'s buffer, then mt_token_acc_push(); equal-sized complete subtrees merge
 * (left + right) as they appear; mt_token_acc_finish writes the root (the mt_tree_fold of
 * all partials pushed; +0.0 for none). With `reversed` (a sabotage switch) nothing merges and
 * finish folds right to left, which must change bits. */
typedef struct {
    int64_t width;
    int depth, cap, reversed;
    int64_t *leaves;   /* leaves under each held subtree, bottom of the stack first */
    float **slot;      /* their partials; slot[depth] is the buffer for the next leaf */
} mt_token_acc;

int mt_token_acc_init(mt_token_acc *t, int64_t width, int reversed);
float *mt_token_acc_leaf(mt_token_acc *t);   /* NULL (MT_ENOMEM set) when out of memory */
void mt_token_acc_push(mt_token_acc *t);
void mt_token_acc_finish(mt_token_acc *t, float *out);
void mt_token_acc_free(mt_token_acc *t);

/* The finiteness pre-pass: nonzero when x[0..n) holds a NaN or an infinity (pool-parallel). */
int mt_cpu_nonfinite(const float *x, int64_t n);
/* The pre-pass as a refusal: MT_ENONFINITE naming `name` ("x holds NaN or inf; nothing was
 * written") when x[0..n) holds one; MT_OK for a NULL x (an optional input not given). */
int mt_cpu_refuse_nonfinite(const float *x, int64_t n, const char *name);

/* Which GEMM kernel runs: "avx512", "avx2" or "scalar". */
const char *mt_cpu_gemm_kernel(void);
#endif
