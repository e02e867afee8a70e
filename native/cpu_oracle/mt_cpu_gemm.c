/* mt_cpu_gemm.c -- see mt_cpu_gemm.h. A packed, register-tiled GEMM (BLIS's loop nest):
 * B is packed once into panels of NR columns (row p of a panel is NR consecutive floats), A is
 * packed per item into panels of MR rows; a micro-kernel holds an MR x NR tile of C in
 * registers and runs every one of its chains over p in ascending order, one fused
 * multiply-add per step, vectorized across the NR outputs of a row. K is cut into blocks of
 * KC: a tile is stored after a block and reloaded for the next, which continues each chain
 * exactly (a float stored and loaded is the same float). Items (a block of rows x a block of
 * panels) are shared out over the thread pool; each output belongs to one item, so the
 * thread count never changes a bit. */
#include "mt_cpu_gemm.h"
#include "mt_cpu.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#ifndef KC
#define KC 256           /* depth of a K block */
#endif
#ifndef MB
#define MB 96            /* rows of an item (a multiple of every MR) */
#endif
#ifndef NB_PANELS
#define NB_PANELS 16     /* panels of an item */
#endif
#define MR_MAX 12
#define NR_MAX 32

typedef void (*kern_fn)(int64_t kc, const float *a, const float *b, float *c, int64_t ldc,
                        int load, const float *add);
typedef struct { const char *name; int mr, nr; kern_fn fn; } kernel_t;

/* ---- micro-kernels: C tile (MR x NR at c, row stride ldc) = chains over p < kc ----------
 * a: packed A panel, a[p*MR + r]; b: packed B panel, b[p*NR + j]. load: start from the tile's
 * values (continuing chains), else from +0.0. add (NR floats or NULL): added once at the end. */

#define SCALAR_MR 4
#define SCALAR_NR 8
static void kern_scalar(int64_t kc, const float *a, const float *b, float *c, int64_t ldc,
                        int load, const float *add) {
    float acc[SCALAR_MR][SCALAR_NR];
    for (int r = 0; r < SCALAR_MR; ++r)
        for (int j = 0; j < SCALAR_NR; ++j) acc[r][j] = load ? c[r * ldc + j] : 0.0f;
    for (int64_t p = 0; p < kc; ++p, a += SCALAR_MR, b += SCALAR_NR)
        for (int r = 0; r < SCALAR_MR; ++r)
            for (int j = 0; j < SCALAR_NR; ++j) acc[r][j] = MT_DOT_STEP(a[r], b[j], acc[r][j]);
    for (int r = 0; r < SCALAR_MR; ++r)
        for (int j = 0; j < SCALAR_NR; ++j) c[r * ldc + j] = add ? acc[r][j] + add[j] : acc[r][j];
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(MT_NO_CLONES)
#define MT_GEMM_X86 1
#include <immintrin.h>

#define ROWS12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define ROWS6(X) X(0) X(1) X(2) X(3) X(4) X(5)

/* One template for every vector ISA: ROWS rows x 2 vectors of W floats, 2*ROWS accumulators;
 * per step 2 loads of B, ROWS broadcasts of A and 2*ROWS fused multiply-adds. The ISA's
 * spellings are the V_* macros in force where DEFINE_KERNEL is expanded. V_DOT is the vector
 * form of MT_DOT_STEP (the linear sabotage rounds the product first). */
#ifdef MT_SABOTAGE_LINEAR
#define V_DOT(x, y, acc) V_ADD(V_MUL((x), (y)), (acc))
#else
#define V_DOT(x, y, acc) V_FMA((x), (y), (acc))
#endif
#define K_DECL(r) V c##r##a, c##r##b;
#define K_ZERO(r) c##r##a = V_ZERO(); c##r##b = V_ZERO();
#define K_LOAD(r) c##r##a = V_LOADU(c + r * ldc); c##r##b = V_LOADU(c + r * ldc + W);
#define K_STEP(r) { V x = V_SET1(a[r]); c##r##a = V_DOT(x, b0, c##r##a); c##r##b = V_DOT(x, b1, c##r##b); }
#define K_ADD(r) c##r##a = V_ADD(c##r##a, d0); c##r##b = V_ADD(c##r##b, d1);
#define K_STORE(r) V_STOREU(c + r * ldc, c##r##a); V_STOREU(c + r * ldc + W, c##r##b);
#define DEFINE_KERNEL(NAME, TARGET, ROWS, MR)                                                    \
    __attribute__((target(TARGET))) static void NAME(int64_t kc, const float *a, const float *b,   \
                                                     float *c, int64_t ldc, int load,             \
                                                     const float *add) {                          \
        ROWS(K_DECL)                                                                             \
        if (load) { ROWS(K_LOAD) } else { ROWS(K_ZERO) }                                          \
        for (int64_t p = 0; p < kc; ++p, a += MR, b += 2 * W) {                                  \
            V b0 = V_LOAD(b), b1 = V_LOAD(b + W);                                                \
            ROWS(K_STEP)                                                                         \
        }                                                                                        \
        if (add) { V d0 = V_LOADU(add), d1 = V_LOADU(add + W); ROWS(K_ADD) }                      \
        ROWS(K_STORE)                                                                            \
    }

/* AVX-512: 12 x 32 (24 of the 32 registers accumulate). */
#define V __m512
#define W 16
#define V_ZERO _mm512_setzero_ps
#define V_LOAD _mm512_load_ps
#define V_LOADU _mm512_loadu_ps
#define V_STOREU _mm512_storeu_ps
#define V_SET1 _mm512_set1_ps
#define V_ADD _mm512_add_ps
#define V_MUL _mm512_mul_ps
#define V_FMA _mm512_fmadd_ps
DEFINE_KERNEL(kern_avx512, "avx512f", ROWS12, 12)
#undef V
#undef W
#undef V_ZERO
#undef V_LOAD
#undef V_LOADU
#undef V_STOREU
#undef V_SET1
#undef V_ADD
#undef V_MUL
#undef V_FMA

/* AVX2 + FMA: 6 x 16 (12 of the 16 registers accumulate). */
#define V __m256
#define W 8
#define V_ZERO _mm256_setzero_ps
#define V_LOAD _mm256_load_ps
#define V_LOADU _mm256_loadu_ps
#define V_STOREU _mm256_storeu_ps
#define V_SET1 _mm256_set1_ps
#define V_ADD _mm256_add_ps
#define V_MUL _mm256_mul_ps
#define V_FMA _mm256_fmadd_ps
DEFINE_KERNEL(kern_avx2, "avx2,fma", ROWS6, 6)
#endif

static const kernel_t KERNELS[] = {
#ifdef MT_GEMM_X86
    {"avx512", 12, 32, kern_avx512},
    {"avx2", 6, 16, kern_avx2},
#endif
    {"scalar", SCALAR_MR, SCALAR_NR, kern_scalar},
};
#define N_KERNELS ((int)(sizeof KERNELS / sizeof KERNELS[0]))

static int kernel_ok(const char *name) {
#ifdef MT_GEMM_X86
    __builtin_cpu_init();
    if (!strcmp(name, "avx512")) return __builtin_cpu_supports("avx512f");
    if (!strcmp(name, "avx2")) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return !strcmp(name, "scalar");
}

static const kernel_t *kernel(void) {
    static int chosen = -1;
    int k = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
    if (k >= 0) return &KERNELS[k];
    const char *want = getenv("MOJO_TRAIN_CPU_GEMM");
    int start = 0;
    for (int i = 0; want && i < N_KERNELS; ++i)
        if (!strcmp(want, KERNELS[i].name)) start = i;
    for (k = start; k < N_KERNELS - 1 && !kernel_ok(KERNELS[k].name); ++k) {
    }
    __atomic_store_n(&chosen, k, __ATOMIC_RELAXED);
    return &KERNELS[k];
}

const char *mt_cpu_gemm_kernel(void) { return kernel()->name; }

/* ---- packing: plain copies, laid out for the kernels (no arithmetic) ---------------------- */
#ifdef MT_GEMM_X86
/* r[c] becomes column c of the 16 x 16 block r (the usual unpack / shuffle network). */
__attribute__((target("avx512f"))) static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        __m512d x0 = _mm512_castps_pd(t[i]), x1 = _mm512_castps_pd(t[i + 1]);
        __m512d x2 = _mm512_castps_pd(t[i + 2]), x3 = _mm512_castps_pd(t[i + 3]);
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(x0, x2));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x0, x2));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(x1, x3));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(x1, x3));
    }
    for (int i = 0; i < 4; ++i) {       /* 128-bit lanes: rows i, i+4, i+8, i+12 */
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

/* dst[c*dst_ld + r] = src[r*ld + c] for c < 16 and the lanes r of `mask`; rows r >= rows
 * read as zeros. */
__attribute__((target("avx512f"))) static void transpose_block(float *dst, int64_t dst_ld, __mmask16 mask,
                                                                const float *src, int64_t ld, int rows) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_ps(src + i * ld) : _mm512_setzero_ps();
    transpose16(r);
    for (int c = 0; c < 16; ++c) _mm512_mask_storeu_ps(dst + c * dst_ld, mask, r[c]);
}
#define MT_FAST_TRANSPOSE(kn) ((kn)->fn == kern_avx512)
#else
#define MT_FAST_TRANSPOSE(kn) 0
#endif

/* One panel: columns j0 .. j0 + nv of B (zero beyond, up to nr), rows p < k, at dst[p*nr + j]. */
static void pack_b_panel(const kernel_t *kn, float *dst, const float *b, int64_t b_rs, int64_t b_cs,
                         int64_t k, int64_t j0, int64_t nv) {
    int64_t nr = kn->nr, p0 = 0;
    if (b_cs == 1) {
        for (int64_t p = 0; p < k; ++p) {
            const float *src = b + p * b_rs + j0;
            for (int64_t j = 0; j < nr; ++j) dst[p * nr + j] = j < nv ? src[j] : 0.0f;
        }
        return;
    }
#ifdef MT_GEMM_X86
    if (MT_FAST_TRANSPOSE(kn) && b_rs == 1)            /* 16 x 16 blocks, two per 32-wide panel */
        for (; p0 + 16 <= k; p0 += 16)
            for (int h = 0; h < 2; ++h) {
                int64_t rows = nv - 16 * h;
                transpose_block(dst + p0 * nr + 16 * h, nr, 0xffff, b + (j0 + 16 * h) * b_cs + p0, b_cs,
                                rows < 0 ? 0 : rows > 16 ? 16 : (int)rows);
            }
#endif
    for (int64_t j = 0; j < nr; ++j) {
        const float *src = b + (j0 + j) * b_cs;
        for (int64_t p = p0; p < k; ++p) dst[p * nr + j] = j < nv ? src[p * b_rs] : 0.0f;
    }
}

typedef struct { const kernel_t *kn; float *dst; const float *b; int64_t b_rs, b_cs, k, n, q0; } pack_b_job;

/* Panels q0 + [b, e) of B's rows 0 .. k, one after another at job->dst. */
static void pack_b_range(void *ctx, int64_t b, int64_t e) {
    pack_b_job *job = (pack_b_job *)ctx;
    int64_t nr = job->kn->nr;
    for (int64_t q = b; q < e; ++q) {
        int64_t j0 = (job->q0 + q) * nr, nv = job->n - j0 < nr ? job->n - j0 : nr;
        pack_b_panel(job->kn, job->dst + q * job->k * nr, job->b, job->b_rs, job->b_cs, job->k, j0, nv);
    }
}

int mt_cpu_gemm_pack_b(mt_gemm_b *pb, const float *b, int64_t b_rs, int64_t b_cs, int64_t k,
                       int64_t n) {
    const kernel_t *kn = kernel();
    int64_t panels = (n + kn->nr - 1) / kn->nr;
    pb->k = k; pb->n = n; pb->nr = kn->nr;
    pb->bytes = panels * k * kn->nr * (int64_t)sizeof(float) + 64;
    pb->data = NULL;
    pb->base = NULL;
    if (panels * k == 0) { pb->bytes = 0; return MT_OK; }
    if (!(pb->base = mt_scratch_alloc(pb->bytes, "the packed GEMM operand"))) return MT_ENOMEM;
    pb->data = (float *)(((uintptr_t)pb->base + 63) & ~(uintptr_t)63);
    pack_b_job job = {kn, pb->data, b, b_rs, b_cs, k, n, 0};
    mt_parallel_for_work(panels, 1, panels * k * kn->nr, pack_b_range, &job);
    return MT_OK;
}

void mt_cpu_gemm_free_b(mt_gemm_b *pb) {
    mt_scratch_free(pb->base, pb->bytes);
    pb->base = NULL;
    pb->data = NULL;
}

/* Rows i0 .. i0 + mb of A, columns p0 .. p0 + kc, into panels of mr rows (zero beyond mb). */
static void pack_a(const kernel_t *kn, float *dst, const float *a, int64_t a_rs, int64_t a_cs, int64_t i0,
                   int64_t mb, int64_t p0, int64_t kc) {
    int mr = kn->mr;
    for (int64_t r0 = 0; r0 < mb; r0 += mr, dst += kc * mr) {
        int mv = mb - r0 < mr ? (int)(mb - r0) : mr;
        const float *base = a + (i0 + r0) * a_rs + p0 * a_cs;
        int64_t p = 0;
        if (a_rs == 1) {
            for (; p < kc; ++p)
                for (int r = 0; r < mr; ++r) dst[p * mr + r] = r < mv ? base[p * a_cs + r] : 0.0f;
            continue;
        }
#ifdef MT_GEMM_X86
        if (MT_FAST_TRANSPOSE(kn) && a_cs == 1)        /* 12 rows of 16 columns at a time */
            for (; p + 16 <= kc; p += 16) transpose_block(dst + p * mr, mr, 0x0fff, base + p, a_rs, mv);
#endif
        for (; p < kc; ++p)
            for (int r = 0; r < mr; ++r) dst[p * mr + r] = r < mv ? base[r * a_rs + p * a_cs] : 0.0f;
    }
}

/* ---- the driver --------------------------------------------------------------------------- */
/* B comes prepacked (pb), or -- for a GEMM with a single block of rows, where each panel is used
 * by one item only -- each item packs its own panels per K block into its scratch (bbuf), so
 * that B is read from memory once and its packed copy stays in cache. */
typedef struct {
    float *c; int64_t ldc; const float *a; int64_t a_rs, a_cs;
    const mt_gemm_b *pb; const float *b; int64_t b_rs, b_cs;
    int64_t m, n, k; int accumulate; const float *add;
    const kernel_t *kn; int64_t col_blocks;
    float **abuf, **bbuf; int *busy; int n_bufs;
} gemm_job;

/* One tile through a scratch tile when it overhangs C (the kernel always writes MR x NR). */
static void edge_tile(const kernel_t *kn, int64_t kc, const float *ap, const float *bp, float *c,
                      int64_t ldc, int64_t mv, int64_t nv, int load, const float *add) {
    float tile[MR_MAX * NR_MAX] __attribute__((aligned(64)));
    for (int64_t r = 0; r < mv; ++r)
        for (int64_t j = 0; j < nv; ++j) tile[r * kn->nr + j] = load ? c[r * ldc + j] : 0.0f;
    kn->fn(kc, ap, bp, tile, kn->nr, load, add);
    for (int64_t r = 0; r < mv; ++r)
        for (int64_t j = 0; j < nv; ++j) c[r * ldc + j] = tile[r * kn->nr + j];
}

static void gemm_item(gemm_job *job, float *ap, float *bbuf, int64_t item) {
    const kernel_t *kn = job->kn;
    int64_t nr = kn->nr, mr = kn->mr, k = job->k;
    int64_t i0 = (item / job->col_blocks) * MB, q0 = (item % job->col_blocks) * NB_PANELS;
    int64_t mb = job->m - i0 < MB ? job->m - i0 : MB;
    int64_t panels = (job->n + nr - 1) / nr, q1 = q0 + NB_PANELS < panels ? q0 + NB_PANELS : panels;
    for (int64_t p0 = 0; p0 < k; p0 += KC) {
        int64_t kc = k - p0 < KC ? k - p0 : KC;
        int load = job->accumulate || p0 > 0, last = p0 + kc == k;
        pack_a(kn, ap, job->a, job->a_rs, job->a_cs, i0, mb, p0, kc);
        if (!job->pb) {
            pack_b_job pj = {kn, bbuf, job->b + p0 * job->b_rs, job->b_rs, job->b_cs, kc, job->n, q0};
            pack_b_range(&pj, 0, q1 - q0);
        }
        for (int64_t q = q0; q < q1; ++q) {
            const float *bp = job->pb ? job->pb->data + (q * k + p0) * nr : bbuf + (q - q0) * kc * nr;
            int64_t j0 = q * nr, nv = job->n - j0 < nr ? job->n - j0 : nr;
            const float *add = last && job->add ? job->add + j0 : NULL;
            for (int64_t r0 = 0; r0 < mb; r0 += mr) {
                int64_t mv = mb - r0 < mr ? mb - r0 : mr;
                float *c = job->c + (i0 + r0) * job->ldc + j0;
                if (mv == mr && nv == nr) kn->fn(kc, ap + r0 * kc, bp, c, job->ldc, load, add);
                else edge_tile(kn, kc, ap + r0 * kc, bp, c, job->ldc, mv, nv, load, add);
            }
        }
    }
}

/* Each range borrows one of the packing buffers allocated up front (there are as many as
 * the pool has threads, so a range never waits for long, and never fails to get one). */
static void gemm_range(void *ctx, int64_t b, int64_t e) {
    gemm_job *job = (gemm_job *)ctx;
    int s = 0;
    for (;; s = (s + 1) % job->n_bufs) {
        int free_ = 0;
        if (__atomic_compare_exchange_n(&job->busy[s], &free_, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            break;
        if (s == job->n_bufs - 1) sched_yield();
    }
    for (int64_t item = b; item < e; ++item) gemm_item(job, job->abuf[s], job->bbuf[s], item);
    __atomic_store_n(&job->busy[s], 0, __ATOMIC_RELEASE);
}

/* k == 0: every chain is empty. */
static void empty_chains(float *c, int64_t ldc, int64_t m, int64_t n, int accumulate, const float *add) {
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            float v = accumulate ? c[i * ldc + j] : 0.0f;
            c[i * ldc + j] = add ? v + add[j] : v;
        }
}

#define MAX_BUFS 64
static int run_items(gemm_job *job) {
    const kernel_t *kn = job->kn;
    int n_bufs = mt_pool_threads() < MAX_BUFS ? mt_pool_threads() : MAX_BUFS;
    int64_t a_floats = (int64_t)MB * KC, b_floats = job->pb ? 0 : (int64_t)KC * NB_PANELS * kn->nr;
    int64_t per = (a_floats + b_floats) * (int64_t)sizeof(float) + 128, bytes = per * n_bufs;
    int64_t panels = (job->n + kn->nr - 1) / kn->nr;
    char *raw = (char *)mt_scratch_alloc(bytes, "GEMM packing buffers");
    float *abuf[MAX_BUFS], *bbuf[MAX_BUFS];
    int busy[MAX_BUFS] = {0};
    if (!raw) return MT_ENOMEM;
    for (int s = 0; s < n_bufs; ++s) {
        abuf[s] = (float *)(((uintptr_t)(raw + s * per) + 63) & ~(uintptr_t)63);
        bbuf[s] = (float *)(((uintptr_t)(abuf[s] + a_floats) + 63) & ~(uintptr_t)63);
    }
    job->col_blocks = (panels + NB_PANELS - 1) / NB_PANELS;
    job->abuf = abuf; job->bbuf = bbuf; job->busy = busy; job->n_bufs = n_bufs;
    int64_t items = ((job->m + MB - 1) / MB) * job->col_blocks;
    mt_parallel_for_work(items, 1, job->m * job->n * job->k, gemm_range, job);
    mt_scratch_free(raw, bytes);
    return MT_OK;
}

/* The bias padded to whole panels when the last panel overhangs (the kernels read nr values). */
static int padded_add(const kernel_t *kn, const float *col_add, int64_t n, float **add, float **own,
                      int64_t *bytes) {
    int64_t panels = (n + kn->nr - 1) / kn->nr;
    *add = (float *)col_add;
    *own = NULL;
    *bytes = panels * kn->nr * (int64_t)sizeof(float);
    if (!col_add || n % kn->nr == 0) return MT_OK;
    if (!(*own = (float *)mt_scratch_alloc(*bytes, "the padded bias"))) return MT_ENOMEM;
    memcpy(*own, col_add, (size_t)n * sizeof(float));
    memset(*own + n, 0, (size_t)(panels * kn->nr - n) * sizeof(float));
    *add = *own;
    return MT_OK;
}

static int gemm_run(gemm_job *job, const float *col_add) {
    if (job->m == 0 || job->n == 0) return MT_OK;
    if (job->k == 0) {
        empty_chains(job->c, job->ldc, job->m, job->n, job->accumulate, col_add);
        return MT_OK;
    }
    float *add, *own;
    int64_t bytes;
    if (padded_add(job->kn, col_add, job->n, &add, &own, &bytes)) return MT_ENOMEM;
    job->add = add;
    int rc = run_items(job);
    mt_scratch_free(own, bytes);
    return rc;
}

int mt_cpu_gemm_packed(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_cs,
                       const mt_gemm_b *pb, int64_t m, int accumulate, const float *col_add) {
    gemm_job job = {c, ldc, a, a_rs, a_cs, pb, NULL, 0, 0, m, pb->n, pb->k, accumulate, NULL, kernel()};
    return gemm_run(&job, col_add);
}

int mt_cpu_gemm(float *c, int64_t ldc, const float *a, int64_t a_rs, int64_t a_cs,
                const float *b, int64_t b_rs, int64_t b_cs, int64_t m, int64_t n, int64_t k,
                int accumulate, const float *col_add) {
    if (m <= MB) {                       /* one block of rows: each item packs its own panels */
        gemm_job job = {c, ldc, a, a_rs, a_cs, NULL, b, b_rs, b_cs, m, n, k, accumulate, NULL, kernel()};
        return gemm_run(&job, col_add);
    }
    if (n == 0) return MT_OK;
    mt_gemm_b pb;
    if (mt_cpu_gemm_pack_b(&pb, b, b_rs, b_cs, k, n)) return MT_ENOMEM;
    int rc = mt_cpu_gemm_packed(c, ldc, a, a_rs, a_cs, &pb, m, accumulate, col_add);
    mt_cpu_gemm_free_b(&pb);
    return rc;
}

/* ---- the token rule ----------------------------------------------------------------------- */
#define COLS_GRAIN 4096

typedef struct { float *s; int64_t m, width; } fold_job;

MT_SIMD static void add_into(float *dst, const float *x, const float *y,
                             int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = x[i] + y[i];
}

static void fold_range(void *ctx, int64_t b, int64_t e) {
    fold_job *job = (fold_job *)ctx;
    int64_t w = job->width, m = job->m, n = e - b;
    float *s = job->s + b;
    while (m > 1) {
        int64_t half = m / 2;
        for (int64_t k = 0; k < half; ++k) add_into(s + k * w, s + 2 * k * w, s + (2 * k + 1) * w, n);
        if (m & 1) memmove(s + half * w, s + (m - 1) * w, (size_t)n * sizeof(float));
        m = half + (m & 1);
    }
}

void mt_token_fold_rows(float *s, int64_t m, int64_t width) {
    fold_job job = {s, m, width};
    if (m > 1) mt_parallel_for_work(width, COLS_GRAIN, width * m, fold_range, &job);
}

int mt_token_acc_init(mt_token_acc *t, int64_t width, int reversed) {
    memset(t, 0, sizeof *t);
    t->width = width;
    t->reversed = reversed;
    return MT_OK;
}

static int acc_reserve(mt_token_acc *t) {
    if (t->depth < t->cap) return MT_OK;
    int cap = t->cap ? 2 * t->cap : 8;
    int64_t *leaves = (int64_t *)realloc(t->leaves, sizeof(int64_t) * (size_t)cap);
    if (leaves) t->leaves = leaves;
    float **slot = (float **)realloc(t->slot, sizeof(float *) * (size_t)cap);
    if (slot) t->slot = slot;
    if (!leaves || !slot) return mt_fail(MT_ENOMEM, "out of memory for the token-rule stack");
    for (int d = t->cap; d < cap; ++d) t->slot[d] = NULL;
    t->cap = cap;
    return MT_OK;
}

float *mt_token_acc_leaf(mt_token_acc *t) {
    if (acc_reserve(t)) return NULL;
    if (!t->slot[t->depth])
        t->slot[t->depth] = (float *)mt_scratch_alloc(t->width * (int64_t)sizeof(float),
                                                      "a token-rule partial");
    return t->slot[t->depth];
}

typedef struct { float *dst; const float *src; } merge_job;

static void merge_range(void *ctx, int64_t b, int64_t e) {
    merge_job *job = (merge_job *)ctx;
    add_into(job->dst + b, job->dst + b, job->src + b, e - b);
}

void mt_token_acc_push(mt_token_acc *t) {
    t->leaves[t->depth++] = 1;
    while (!t->reversed && t->depth >= 2 && t->leaves[t->depth - 1] == t->leaves[t->depth - 2]) {
        float *left = t->slot[t->depth - 2], *right = t->slot[t->depth - 1];
        merge_job job = {left, right};
        mt_parallel_for_work(t->width, COLS_GRAIN, t->width, merge_range, &job);
        t->leaves[t->depth - 2] *= 2;
        t->depth--;                       /* right's buffer is now the next leaf's */
    }
}

typedef struct { float *out; float *const *slot; int depth; } finish_job;

static void finish_range(void *ctx, int64_t b, int64_t e) {
    finish_job *job = (finish_job *)ctx;
    float *out = job->out;
    if (job->depth == 0) {
        for (int64_t x = b; x < e; ++x) out[x] = 0.0f;
        return;
    }
    memcpy(out + b, job->slot[job->depth - 1] + b, (size_t)(e - b) * sizeof(float));
    for (int d = job->depth - 2; d >= 0; --d) add_into(out + b, job->slot[d] + b, out + b, e - b);
}

void mt_token_acc_finish(mt_token_acc *t, float *out) {
    finish_job job = {out, t->slot, t->depth};
    mt_parallel_for_work(t->width, COLS_GRAIN, t->width * (t->depth + 1), finish_range, &job);
}

void mt_token_acc_free(mt_token_acc *t) {
    for (int d = 0; d < t->cap; ++d) mt_scratch_free(t->slot[d], t->width * (int64_t)sizeof(float));
    free(t->slot);
    free(t->leaves);
    memset(t, 0, sizeof *t);
}

/* ---- the finiteness pre-pass -------------------------------------------------------------- */
typedef struct { const float *x; int bad; } nonfinite_job;

static void nonfinite_range(void *ctx, int64_t b, int64_t e) {
    nonfinite_job *job = (nonfinite_job *)ctx;
    if (mt_cpu_any_nonfinite(job->x + b, e - b)) __atomic_store_n(&job->bad, 1, __ATOMIC_RELAXED);
}

int mt_cpu_nonfinite(const float *x, int64_t n) {
    nonfinite_job job = {x, 0};
    if (n > 0) mt_parallel_for(n, 16384, nonfinite_range, &job);
    return job.bad;
}

int mt_cpu_refuse_nonfinite(const float *x, int64_t n, const char *name) {
    if (x && mt_cpu_nonfinite(x, n)) return mt_fail(MT_ENONFINITE, "%s holds NaN or inf; nothing was written", name);
    return MT_OK;
}
