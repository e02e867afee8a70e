/* mt_gpu_gemm.cuh -- the chain GEMM of native/contracts/linear.md on a GPU, and the token rule
 * built on it: register-tiled SIMT float32 (FFMA; no tensor cores, no split-K).
 *
 * Contract: C(i, j) is ONE chain over the contraction index p: acc = +0.0 (or, when
 * continuing, C's current value), then acc = MT_DOT_STEP(A(i, p), B(j, p), acc) for p
 * ascending -- one fma, one rounding, one accumulator per output. Tiles, stages and threads
 * only decide who runs which chain, so the bits are the CPU oracle's on any shape.
 *
 * Operands are addressed by layout: element (r, p) of an operand (r an output index, p the
 * contraction index) is X[r * ld + p] (MT_KMAJOR, contraction-contiguous) or X[p * ld + r]
 * (MT_RMAJOR, output-contiguous). Either layout lands in shared memory as [p][r], so the
 * inner loop reads 16-byte fragments along r for every combination:
 *   linear forward   out = a . weight^T   A = a (KMAJOR)   B = weight (KMAJOR)
 *   linear da        da  = dc . weight    A = dc (KMAJOR)  B = weight (RMAJOR)
 *   linear dweight   dw  = dc^T . a       A = dc (RMAJOR)  B = a (RMAJOR), per token leaf
 *
 * Edges are zero-filled in shared memory, but only rows and columns past the edges of C
 * (never stored) run on zeros: every chain takes exactly its k steps (the last, short tile of
 * a range is computed step by step). Padding the contraction would not be exact: a chain can
 * end at -0.0 (a tiny negative product underflowing with acc == 0), and fma(0, 0, -0.0) is
 * +0.0.
 *
 * Host API (namespace mt_gemm; every launch on MT_STREAM, except gemm() on desc.stream when set;
 * kernels do nothing when the device word `refused` is nonzero):
 *   gemm(desc)                 C = chains (+ bias), optionally continuing C's chains, and
 *                              optionally batched over contraction slices (token leaves)
 *   gemm_tokens(desc, arena)   C = the token rule over p: leaf chains, then the pairwise tree
 *   fold_leaves(...)           the pairwise tree (mt_tree_fold) over leaf partials, elementwise
 *   token_col_sums(...)        dst[j] = token rule over rows of acc + x[i, j] (dbias)
 *   finite_check(...)          the pre-pass: flags[1 + b] = buffer b holds NaN/inf, flags[0] any
 */
#ifndef MT_GPU_GEMM_CUH
#define MT_GPU_GEMM_CUH

#include "mt_gpu.h"
#include "mt_gpu_runtime.h"
#include "mt_pinned.h"

/* The tiling (overridable for experiments: bench/gemm_variants.py builds each). MT_GEMM_SHAPE 0:
 * 256 threads, eight warps of 32 x 64 outputs, 8 x 8 chains a thread (128 registers, two blocks
 * an SM); 1: 128 threads, four warps of 64 x 64, 8 x 16 chains a thread (the shape of cuBLAS's
 * own FFMA kernel on the H200: 255 registers). Each tile is 128 x 128 outputs. Shape 1 ran at
 * 39-41 TFLOP/s where shape 0 ran at 45 (fifteenth session, bench/results/NOTES.md). */
#ifndef MT_GEMM_SHAPE
#define MT_GEMM_SHAPE 0
#endif
/* Tile depth and pipeline stages: MT_GEMM_BK / MT_GEMM_STAGES for the forward's layout (both
 * operands contraction-contiguous), MT_GEMM_BK_R / MT_GEMM_STAGES_R when either operand is
 * output-contiguous (the backward's da and dweight). On the H200 (fifteenth session,
 * bench/gemm_variants.py, both with the zigzag order) the forward ran at 45.5 TFLOP/s with
 * 16 x 3 and 45.3 with 32 x 2, da and dweight at 47.0 and 46.7 with 16 x 3 but 48.4 and 50.2
 * with 32 x 2. mt_gpu_lm_head.cu defines its own (16 x 3 for every layout: the whole LM head
 * was 15% slower with 32 x 2 though each of its products alone was not; sixteenth session). On
 * HIP an AMD workgroup has 64 KB of shared memory, so both layouts take 16 x 3 there. */
#ifndef MT_GEMM_BK
#define MT_GEMM_BK (MT_GEMM_SHAPE == 1 ? 8 : 16)
#endif
#ifndef MT_GEMM_STAGES
#define MT_GEMM_STAGES 3
#endif
#if defined(__HIPCC__) || defined(MT_HIP)
#ifndef MT_GEMM_BK_R
#define MT_GEMM_BK_R MT_GEMM_BK
#endif
#ifndef MT_GEMM_STAGES_R
#define MT_GEMM_STAGES_R MT_GEMM_STAGES
#endif
#endif
#ifndef MT_GEMM_BK_R
#define MT_GEMM_BK_R (MT_GEMM_SHAPE == 1 ? 16 : 32)
#endif
#ifndef MT_GEMM_STAGES_R
#define MT_GEMM_STAGES_R 2
#endif
#ifndef MT_GEMM_MIN_BLOCKS
#define MT_GEMM_MIN_BLOCKS 2
#endif
#ifndef MT_GEMM_GROUP_M
#define MT_GEMM_GROUP_M 8
#endif
/* Register banks (sixteenth and seventeenth sessions, bench/results/NOTES.md): none of cuBLAS's
 * FFMA has its three source registers in one bank (register number mod 2); a quarter of ours
 * did, with dispatch stalls at 12% of warp samples against cuBLAS's 4%. The cause was the
 * epilogue's float4 store of C: it pins each row's four chains to a register quad (column c in
 * bank c % 2), where LDS.128 also puts B's column c. MT_GEMM_EPI_SCALAR 1 (CUDA's default)
 * stores C 4 bytes at a time, so ptxas places every chain itself: nvdisasm counts no same-bank
 * FFMA in any steady loop but <1, 1>'s (`python bench/sass_banks.py`), dispatch stalls fell to
 * 5.2% and the forward rose 47.4 -> 48.4 TFLOP/s (an earlier fix, swapping B's columns in pairs
 * in shared memory, reached 47.4 and measured slower than no swap once the stores were 4 bytes:
 * removed). HIP keeps float4 stores (0): AMD's register files differ and nothing measured them.
 * Bits unchanged: only which register holds a chain and how C is written. */
#ifndef MT_GEMM_EPI_SCALAR
#if defined(__HIPCC__) || defined(MT_HIP)
#define MT_GEMM_EPI_SCALAR 0
#else
#define MT_GEMM_EPI_SCALAR 1
#endif
#endif
#ifndef MT_GEMM_ZIGZAG   /* odd rows of the outer product walk the columns backwards (faster: NOTES) */
#define MT_GEMM_ZIGZAG 1
#endif

/* Everything below has internal linkage (an unnamed namespace): each .cu that includes this
 * gets its own kernels AND its own once-per-kernel shared-memory setup. With external linkage
 * the linker merged allow_smem's static across files, so one file's kernel copy launched
 * without its shared-memory limit raised ("invalid argument"). */
namespace mt_gemm {
namespace {

template <bool B> struct mt_flag { static constexpr bool value = B; };

__host__ __device__ __forceinline__ int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

enum layout { MT_KMAJOR = 0, MT_RMAJOR = 1 };

struct operand {
    const float *ptr;
    int64_t ld;
    int layout;   /* MT_KMAJOR or MT_RMAJOR */
};

/* C[i * ldc + j] for i < m, j < n: the chain over p < k of A(i, p) * B(j, p).
 * slices > 1: slice z covers p in [z * k_slice, min(k, (z + 1) * k_slice)) and writes its own
 * C + z * c_slice (the leaf partials of the token rule). */
struct desc {
    float *c = nullptr;
    int64_t ldc = 0;
    operand a{nullptr, 0, MT_KMAJOR}, b{nullptr, 0, MT_KMAJOR};
    const float *bias = nullptr;   /* (n) or NULL: C = chain + bias[j], one addition */
    int64_t m = 0, n = 0, k = 0;
    bool accumulate = false;       /* chains start from C's current values instead of +0.0 */
    int64_t k_slice = 0;           /* 0: one slice covering all of k */
    int64_t slices = 1;
    int64_t c_slice = 0;
    const int32_t *refused = nullptr;   /* device word; nonzero: every kernel returns at once */
    gpuStream_t stream = MT_STREAM;     /* where gemm() launches (ordering only, never bits); gemm_tokens,
                                           fold_leaves and token_col_sums use MT_STREAM whatever it says */
};

/* The fields every call sets: C (row stride ldc) = the chains of A and B over k, m x n;
 * `refused` as in desc. The rest keep desc's defaults until the caller sets them. */
inline desc make_desc(float *c, int64_t ldc, operand a, operand b, int64_t m, int64_t n, int64_t k,
                      const int32_t *refused = nullptr) {
    desc d;
    d.c = c; d.ldc = ldc; d.a = a; d.b = b;
    d.m = m; d.n = n; d.k = k; d.refused = refused;
    return d;
}

constexpr int BM = 128, BN = 128;
#if MT_GEMM_SHAPE == 1
constexpr int THREADS = 128, WARPS_M = 2, TM = 8, TN = 16;
#else
constexpr int THREADS = 256, WARPS_M = 4, TM = 8, TN = 8;
#endif
constexpr int WARPS_N = THREADS / 32 / WARPS_M;
constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;   /* a warp's outputs */
constexpr int LANES_N = WN / TN, LANES_M = 32 / LANES_N;
constexpr int GM = TM / 4, GN = TN / 4;               /* a thread's float4 groups of rows, of columns */
constexpr int SM_ = WM / GM, SN = WN / GN;            /* stride between a thread's groups */
constexpr int LDS = BM + 4;        /* one contraction step of a tile in shared memory, padded */
constexpr int GROUP_M = MT_GEMM_GROUP_M;   /* tile rows walked together (L2 reuse of B) */
static_assert(BM == 128 && BN == 128, "the loaders' maps assume 128-row tiles");
static_assert(THREADS == 128 || THREADS == 256, "the loaders' maps assume 128 or 256 threads");
static_assert(LANES_M * LANES_N == 32 && LANES_M * 4 * GM == WM && LANES_N * 4 * GN == WN, "thread tile");
constexpr int MAX_BK = 32;

/* The tile depth and stages of the kernel for loader kinds KA, KB (0: contraction-contiguous). */
template <int KA, int KB>
struct tiling {
    static constexpr bool FORWARD = KA == 0 && KB == 0;
    static constexpr int BK = FORWARD ? MT_GEMM_BK : MT_GEMM_BK_R;
    static constexpr int STAGES = FORWARD ? MT_GEMM_STAGES : MT_GEMM_STAGES_R;
    static constexpr int TILE = BK * LDS;                    /* floats of one operand's tile in one stage */
    static constexpr int SMEM_BYTES = STAGES * 2 * TILE * 4;   /* dynamic shared memory of one block */
    static_assert(BK % 8 == 0 && BK <= MAX_BK && BK % (THREADS / 32) == 0, "BK must be 8, 16, 24 or 32");
    static_assert(STAGES >= 2, "at least double buffering");
#if defined(__HIPCC__) || defined(MT_HIP)
    static_assert(SMEM_BYTES <= 64 * 1024, "more shared memory than an AMD workgroup has");
#else
    static_assert(SMEM_BYTES * MT_GEMM_MIN_BLOCKS <= 227 * 1024, "more shared memory than an SM has");
#endif
};

struct params {
    float *c;
    int64_t ldc, c_slice;
    const float *a, *b, *bias;
    int64_t lda, ldb;
    int64_t m, n, k, k_slice;
    int64_t z0;              /* first slice of this launch */
    int32_t tiles_m, tiles_n;
    int32_t accumulate;
    const int32_t *refused;
};

/* ---- tile loaders: one stage of one operand (128 rows x BK steps) into smem [p][r] --------
 * Each keeps only its running global pointer and a few small ints; the operand's base and
 * leading dimension are read from the kernel parameters at each use (constant bank, no
 * registers). `q` is the contraction offset of the tile inside the block's range and `len`
 * that range's length (both < 2^31, checked on the host). A copy that would read past an
 * edge reads nothing (src_bytes 0, from the operand's base) and zero-fills. */

/* Contraction-contiguous rows: lane groups of 8 copy 8 consecutive p of 4 rows (32-byte
 * global segments, conflict-free transposed stores: bank = 4 p + r mod 32). 4-byte copies;
 * a pass of the block covers THREADS / 8 rows. */
template <int BK>
struct kmajor_loader {
    static constexpr int ROWS = THREADS / 8, PASSES = BM / ROWS;
    const float *g;      /* row r0 at contraction offset kk of the next tile */
    int soff, kk;
    unsigned rowmask;    /* bit q: row r0 + ROWS q exists */

    __device__ __forceinline__ void init(const float *x, int64_t ld, int64_t rows, int64_t row0, int64_t p0) {
        const int t = threadIdx.x, r0 = t >> 3;
        kk = t & 7;
        soff = kk * LDS + r0;
        mt_opaque(kk);
        mt_opaque(soff);
        g = x + (row0 + r0) * ld + p0 + kk;
        rowmask = 0;
        for (int q = 0; q < PASSES; ++q) rowmask |= (row0 + r0 + ROWS * q < rows) ? 1u << q : 0u;
    }
    template <bool EDGE>
    __device__ __forceinline__ void load(float *s, const float *base, int64_t ld, int q, int len) {
        MT_PRAGMA_UNROLL
        for (int j = 0; j < PASSES * (BK / 8); ++j) {
            const int kq = j % (BK / 8), rq = j / (BK / 8);
            const float *src = g + rq * ROWS * ld + kq * 8;
            float *dst = s + soff + kq * 8 * LDS + rq * ROWS;
            if (!EDGE) {
                mt_cp_async4(dst, src, 4);
            } else {
                const bool ok = ((rowmask >> rq) & 1u) && q + kk + kq * 8 < len;
                mt_cp_async4(dst, ok ? src : base, ok ? 4 : 0);
            }
        }
        g += BK;
    }
};

/* Output-contiguous rows, 16-byte aligned (x aligned, ld % 4 == 0): a warp copies 128
 * consecutive floats of one contraction step, 16 bytes a lane; a pass covers THREADS / 32 steps. */
template <int BK>
struct rmajor_vec_loader {
    static constexpr int STEPS = THREADS / 32;
    const float *g;
    int soff, kr, nbytes;   /* nbytes: bytes of this lane's 4 columns that exist (0..16) */

    __device__ __forceinline__ void init(const float *x, int64_t ld, int64_t rows, int64_t row0, int64_t p0) {
        const int t = threadIdx.x, col = (t & 31) * 4;
        kr = t >> 5;
        soff = kr * LDS + col;
        mt_opaque(kr);
        mt_opaque(soff);
        g = x + (p0 + kr) * ld + row0 + col;
        const int64_t left = rows - (row0 + col);
        nbytes = left >= 4 ? 16 : left > 0 ? (int)left * 4 : 0;
    }
    template <bool EDGE>
    __device__ __forceinline__ void load(float *s, const float *base, int64_t ld, int q, int len) {
        MT_PRAGMA_UNROLL
        for (int j = 0; j < BK / STEPS; ++j) {
            const float *src = g + STEPS * j * ld;
            float *dst = s + soff + STEPS * j * LDS;
            if (!EDGE) {
                mt_cp_async16(dst, src, 16);
            } else {
                const bool ok = nbytes > 0 && q + kr + STEPS * j < len;
                mt_cp_async16(dst, ok ? src : base, ok ? nbytes : 0);
            }
        }
        g += BK * ld;
    }
};

/* Output-contiguous rows, any alignment: 4-byte copies, a warp covers 32 consecutive floats;
 * a pass covers THREADS / 128 steps. */
template <int BK>
struct rmajor_loader {
    static constexpr int STEPS = THREADS / 128;
    const float *g;
    int soff, kr;
    bool colok;

    __device__ __forceinline__ void init(const float *x, int64_t ld, int64_t rows, int64_t row0, int64_t p0) {
        const int t = threadIdx.x, col = t & 127;
        kr = t >> 7;
        soff = kr * LDS + col;
        mt_opaque(kr);
        mt_opaque(soff);
        g = x + (p0 + kr) * ld + row0 + col;
        colok = row0 + col < rows;
    }
    template <bool EDGE>
    __device__ __forceinline__ void load(float *s, const float *base, int64_t ld, int q, int len) {
        MT_PRAGMA_UNROLL
        for (int j = 0; j < BK / STEPS; ++j) {
            const float *src = g + STEPS * j * ld;
            float *dst = s + soff + STEPS * j * LDS;
            if (!EDGE) {
                mt_cp_async4(dst, src, 4);
            } else {
                const bool ok = colok && q + kr + STEPS * j < len;
                mt_cp_async4(dst, ok ? src : base, ok ? 4 : 0);
            }
        }
        g += BK * ld;
    }
};

/* Loader kinds: 0 contraction-contiguous, 1 output-contiguous (4-byte), 2 output-contiguous
 * (16-byte). */
template <int KIND, int BK> struct loader_of;
template <int BK> struct loader_of<0, BK> { typedef kmajor_loader<BK> type; };
template <int BK> struct loader_of<1, BK> { typedef rmajor_loader<BK> type; };
template <int BK> struct loader_of<2, BK> { typedef rmajor_vec_loader<BK> type; };

/* ---- the kernel ---------------------------------------------------------------------------
 * THREADS threads own a 128 x 128 tile of C in WARPS_M x WARPS_N warps of WM x WN outputs; in
 * a warp, lane l owns rows 4 (l / LANES_N) + SM_ g + {0..3} (g < GM) and columns
 * 4 (l % LANES_N) + SN h + {0..3} (h < GN): TM x TN chains held in registers. Per contraction
 * step a thread reads GM + GN 16-byte fragments (broadcasts within the warp) and issues TM TN
 * FFMA. Shared memory holds STAGES stages filled by cp.async, STAGES - 1 tiles ahead of the one
 * computed; one barrier per tile. FP32 peak is 132 SMs x 128 lanes x 2 x 1.98 GHz = 67 TFLOP/s.
 * Shape 0 (256 threads, 8 x 8 a thread): per 64 FFMA the steady loop issues 4 LDS.128 and,
 * at BK 16, 1 LDGSTS; ncu (fifteenth session, the forward at BK 16 before the zigzag order)
 * counts 1,140 instructions per 1,024 FFMA and 77% of issue slots busy, the rest mostly
 * dispatch stalls and the barrier. Shape 1 (128 threads, 8 x 16; BK 8 for the forward) has
 * cuBLAS's mix (6 LDS.128 per 128 FFMA) but nvcc's code for it reached 67% of issue slots
 * against cuBLAS's 87%. bench/gemm_variants.py times the tilings. */
template <int KA, int KB>
__global__ void __launch_bounds__(THREADS, MT_GEMM_MIN_BLOCKS) k_gemm(const params P) {
    if (P.refused && *P.refused) return;
    extern __shared__ __align__(16) float smem[];   /* STAGES x (A tile, B tile) */
    constexpr int BK = tiling<KA, KB>::BK, STAGES = tiling<KA, KB>::STAGES, TILE = tiling<KA, KB>::TILE;

    /* tile of this block: GROUP_M tile rows walked column by column (L2 reuse) */
    const int pid = blockIdx.x, group = GROUP_M * P.tiles_n;
    const int first_m = (pid / group) * GROUP_M;
    const int gm = P.tiles_m - first_m < GROUP_M ? P.tiles_m - first_m : GROUP_M;
    const int64_t row0 = (int64_t)(first_m + (pid % group) % gm) * BM;
    const int64_t col0 = (int64_t)((pid % group) / gm) * BN;
    const int64_t z = P.z0 + blockIdx.y;
    const int64_t p_begin = P.k_slice ? z * P.k_slice : 0;
    const int len = (int)(P.k_slice ? min64(P.k - p_begin, P.k_slice) : P.k);   /* < 2^31 (host) */
    float *C = P.c + z * P.c_slice;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int am = (warp / WARPS_N) * WM + (lane / LANES_N) * 4;   /* rows am + SM_ g + {0..3} */
    int bn = (warp % WARPS_N) * WN + (lane % LANES_N) * 4;   /* cols bn + SN h + {0..3} */
    mt_opaque(am);   /* kept in registers: recomputing them from threadIdx each tile stalled on S2R */
    mt_opaque(bn);

    typename loader_of<KA, BK>::type la;
    typename loader_of<KB, BK>::type lb;
    la.init(P.a, P.lda, P.m, row0, p_begin);
    lb.init(P.b, P.ldb, P.n, col0, p_begin);
    const bool interior = row0 + BM <= P.m && col0 + BN <= P.n;

    float acc[TM][TN];
    MT_PRAGMA_UNROLL
    for (int i = 0; i < TM; ++i) {
        MT_PRAGMA_UNROLL
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
    }
    if (P.accumulate) {   /* continue the chains already in C */
        MT_PRAGMA_UNROLL
        for (int i = 0; i < TM; ++i) {
            const int64_t r = row0 + am + (i & 3) + (i >> 2) * SM_;
            MT_PRAGMA_UNROLL
            for (int j = 0; j < TN; ++j) {
                const int64_t cc = col0 + bn + (j & 3) + (j >> 2) * SN;
                if (r < P.m && cc < P.n) acc[i][j] = C[r * P.ldc + cc];
            }
        }
    }

    const int ntiles = len > 0 ? (len + BK - 1) / BK : 0;
    /* tile tt (issued in order, tt < ntiles) into its stage */
    /* The tile pipeline, instantiated twice: ALL_FAST (an interior block whose range is whole
     * tiles: every copy unguarded, no edge code in the loop) and the general one. */
    auto pipeline = [&](auto all_fast) {
        constexpr bool ALL_FAST = decltype(all_fast)::value;
        /* tile tt (issued in order, tt < ntiles) into its stage */
        auto issue = [&](int tt, int stage) {
            float *s_ = smem + stage * 2 * TILE;
            const int q_ = tt * BK;
            if (ALL_FAST || (interior && q_ + BK <= len)) {
                la.template load<false>(s_, P.a, P.lda, q_, len);
                lb.template load<false>(s_ + TILE, P.b, P.ldb, q_, len);
            } else {
                la.template load<true>(s_, P.a, P.lda, q_, len);
                lb.template load<true>(s_ + TILE, P.b, P.ldb, q_, len);
            }
        };
        MT_PRAGMA_UNROLL
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < ntiles) issue(s, s);
            mt_cp_async_commit();
        }
        /* A step's fragments into registers, and its TM x TN chain steps from registers. */
        auto fragments = [&](const float *As, const float *Bs, int kk, float (&av)[TM], float (&bv)[TN]) {
            MT_PRAGMA_UNROLL
            for (int g = 0; g < GM; ++g) {
                const float4 f = *(const float4 *)(As + kk * LDS + am + SM_ * g);
                av[4 * g] = f.x; av[4 * g + 1] = f.y; av[4 * g + 2] = f.z; av[4 * g + 3] = f.w;
            }
            MT_PRAGMA_UNROLL
            for (int h = 0; h < GN; ++h) {
                const float4 f = *(const float4 *)(Bs + kk * LDS + bn + SN * h);
                bv[4 * h] = f.x; bv[4 * h + 1] = f.y; bv[4 * h + 2] = f.z; bv[4 * h + 3] = f.w;
            }
        };
        auto chain_step = [&](const float (&av)[TM], const float (&bv)[TN]) {
            MT_PRAGMA_UNROLL
            for (int i = 0; i < TM; ++i) {
                MT_PRAGMA_UNROLL
                for (int jj = 0; jj < TN; ++jj) {
                    /* MT_GEMM_ZIGZAG: odd rows walk the columns backwards (the last B operand of
                     * one row is the first of the next); each chain's own order is unchanged */
                    const int j = (MT_GEMM_ZIGZAG && (i & 1)) ? TN - 1 - jj : jj;
                    acc[i][j] = MT_DOT_STEP(av[i], bv[j], acc[i][j]);
                }
            }
        };
        /* Whole tiles, software-pipelined: step kk + 1's fragments are read while step kk's chain
         * steps run, and the barrier that publishes tile t + 1 comes before tile t's last step
         * (whose fragments are already in registers), so tile t + 1's first fragments are read
         * across it. After that barrier nobody reads tile t's stage, so tile t + STAGES is issued
         * into it. */
        const int nfull = len / BK;    /* whole tiles; a short last one follows them */
        int cs = 0;                    /* stage of the tile computed */
        float av[2][TM], bv[2][TN];
        if (nfull > 0) {
            mt_cp_async_wait<STAGES - 2>();
            __syncthreads();   /* tile 0 is in for everyone */
            if (STAGES - 1 < ntiles) issue(STAGES - 1, STAGES - 1);
            mt_cp_async_commit();
            fragments(smem, smem + TILE, 0, av[0], bv[0]);
        }
        for (int t = 0; t < nfull; ++t) {
            const float *As = smem + cs * 2 * TILE, *Bs = As + TILE;
            MT_PRAGMA_UNROLL
            for (int kk = 0; kk < BK - 1; ++kk) {
                fragments(As, Bs, kk + 1, av[(kk + 1) & 1], bv[(kk + 1) & 1]);
                chain_step(av[kk & 1], bv[kk & 1]);
            }
            const int ns = cs == STAGES - 1 ? 0 : cs + 1;   /* tile t + 1's stage */
            if (t + 1 < nfull) {
                mt_cp_async_wait<STAGES - 2>();
                __syncthreads();   /* tile t + 1 is in for everyone; everyone is done reading tile t */
                if (t + STAGES < ntiles) issue(t + STAGES, cs);
                mt_cp_async_commit();
                fragments(smem + ns * 2 * TILE, smem + ns * 2 * TILE + TILE, 0, av[0], bv[0]);   /* BK is even */
            }
            chain_step(av[(BK - 1) & 1], bv[(BK - 1) & 1]);
            cs = ns;
        }
        if (nfull < ntiles) {
            /* The short last tile: exactly its steps. A zero-padded step would not always be an
             * identity: a chain can end at -0.0 (a tiny negative product underflowing), and
             * fma(0, 0, -0.0) = +0.0. */
            mt_cp_async_wait<0>();
            __syncthreads();
            const float *As = smem + cs * 2 * TILE, *Bs = As + TILE;
            const int steps = len - nfull * BK;
#pragma unroll 1
            for (int kk = 0; kk < steps; ++kk) {
                fragments(As, Bs, kk, av[0], bv[0]);
                chain_step(av[0], bv[0]);
            }
        }
    };
    if (interior && len % BK == 0) pipeline(mt_flag<true>());
    else pipeline(mt_flag<false>());
    mt_cp_async_wait<0>();

    /* epilogue: C = chain (+ bias); 16-byte stores where the row allows, unless
     * MT_GEMM_EPI_SCALAR (CUDA's default, above) */
    const bool vec_c = !MT_GEMM_EPI_SCALAR && ((P.ldc & 3) == 0) && ((((uintptr_t)C) & 15u) == 0);
    MT_PRAGMA_UNROLL
    for (int i = 0; i < TM; ++i) {
        const int64_t r = row0 + am + (i & 3) + (i >> 2) * SM_;
        if (r >= P.m) continue;
        float *crow = C + r * P.ldc;
        MT_PRAGMA_UNROLL
        for (int h = 0; h < GN; ++h) {
            const int64_t cc = col0 + bn + SN * h;
            float v[4];
            MT_PRAGMA_UNROLL
            for (int e = 0; e < 4; ++e) {
                v[e] = acc[i][4 * h + e];
                if (P.bias && cc + e < P.n) v[e] = v[e] + P.bias[cc + e];
            }
            if (vec_c && cc + 3 < P.n) {
                *(float4 *)(crow + cc) = make_float4(v[0], v[1], v[2], v[3]);
            } else {
                MT_PRAGMA_UNROLL
                for (int e = 0; e < 4; ++e)
                    if (cc + e < P.n) crow[cc + e] = v[e];
            }
        }
    }
}

/* ---- the token rule's tree and sums, the pre-pass ----------------------------------------- */

/* dst item g = the pairwise tree (mt_tree_fold) of src items 32 g .. min(32 g + 32, cnt) - 1,
 * each item `elems` floats. Aligned groups of 32 leaves are subtrees of the pairwise tree, so
 * passes of this kernel build the whole tree. The last pass may write a 2-D destination:
 * element e = (e / cols, e % cols) lands at dst[(e / cols) * ldd + e % cols]. */
static __global__ void __launch_bounds__(MT_MAX_THREADS)
k_fold32(float *dst, int64_t ldd, int64_t cols, const float *src, int64_t cnt, int64_t elems, const int32_t *refused) {
    if (refused && *refused) return;
    const int64_t groups = (cnt + 31) / 32, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t g = 0; g < groups; ++g) {
        const int n_valid = (int)min64(32, cnt - 32 * g);
        const float *s = src + 32 * g * elems;
        for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < elems; e += stride) {
            float v[32];
            MT_PRAGMA_UNROLL
            for (int i = 0; i < 32; ++i) v[i] = i < n_valid ? s[i * elems + e] : 0.0f;
            MT_PRAGMA_UNROLL
            for (int d = 1; d < 32; d <<= 1) {
                MT_PRAGMA_UNROLL
                for (int t = 0; t < 32; t += 2 * d)
                    if (t + d < n_valid) v[t] = v[t] + v[t + d];
            }
            dst[ldd == cols ? g * elems + e : g * elems + (e / cols) * ldd + e % cols] = v[0];
        }
    }
}

/* dst[leaf * cols + j] = the leaf's sum over its rows of x[i * cols + j], acc = acc + x from
 * +0.0 in ascending rows (rows 1024 leaf .. min(rows, 1024 (leaf + 1)) - 1). */
static __global__ void __launch_bounds__(MT_MAX_THREADS)
k_leaf_col_sums(float *dst, const float *x, int64_t rows, int64_t cols, int64_t leaves, const int32_t *refused) {
    if (refused && *refused) return;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; it < leaves * cols; it += stride) {
        const int64_t leaf = it / cols, j = it % cols;
        const int64_t r0 = leaf * MT_TOKEN_LEAF, r1 = min64(rows, r0 + MT_TOKEN_LEAF);
        const float *col = x + j;
        float acc = 0.0f;
        int64_t r = r0;
        for (; r + 8 <= r1; r += 8) {   /* loads issued ahead, additions in order */
            float q[8];
            MT_PRAGMA_UNROLL
            for (int u = 0; u < 8; ++u) q[u] = col[(r + u) * cols];
            MT_PRAGMA_UNROLL
            for (int u = 0; u < 8; ++u) acc = acc + q[u];
        }
        for (; r < r1; ++r) acc = acc + col[r * cols];
        dst[it] = acc;
    }
}

/* The finiteness pre-pass over up to 4 flat buffers: flags[1 + b] = 1 when buffer b holds a
 * NaN or inf, and flags[0] = 1 then (every writer stores the same value: no atomics). */
struct finite_set {
    const float *p[4];
    int64_t n[4];
    int count;
};

static __global__ void __launch_bounds__(MT_MAX_THREADS) k_finite(finite_set set, int32_t *flags) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    for (int b = 0; b < set.count; ++b) {
        const float *x = set.p[b];
        const int64_t n = set.n[b];
        bool bad = false;
        if ((((uintptr_t)x) & 15u) == 0) {
            const int64_t n4 = n / 4;
            const float4 *x4 = (const float4 *)x;
            int64_t i = tid;
            for (; i + 3 * stride < n4; i += 4 * stride) {
                float4 q[4];
                MT_PRAGMA_UNROLL
                for (int u = 0; u < 4; ++u) q[u] = x4[i + u * stride];
                MT_PRAGMA_UNROLL
                for (int u = 0; u < 4; ++u)
                    bad |= !(mt_is_finite(q[u].x) & mt_is_finite(q[u].y) & mt_is_finite(q[u].z) & mt_is_finite(q[u].w));
            }
            for (; i < n4; i += stride) {
                float4 q = x4[i];
                bad |= !(mt_is_finite(q.x) & mt_is_finite(q.y) & mt_is_finite(q.z) & mt_is_finite(q.w));
            }
            for (int64_t e = 4 * n4 + tid; e < n; e += stride) bad |= !mt_is_finite(x[e]);
        } else {
            for (int64_t e = tid; e < n; e += stride) bad |= !mt_is_finite(x[e]);
        }
        if (bad) {
            flags[1 + b] = 1;
            flags[0] = 1;
        }
    }
}

/* ---- host side ---------------------------------------------------------------------------- */
/* Every launch goes through MT_LAUNCH_ON (MT_LAUNCH: on MT_STREAM); a host-compiled emulation
 * of these kernels may define its own before including this header. */
#ifndef MT_LAUNCH_ON
#define MT_LAUNCH_ON(stream, kernel, grid, block, smem, ...) kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#endif
#ifndef MT_LAUNCH
#define MT_LAUNCH(kernel, grid, block, smem, ...) MT_LAUNCH_ON(MT_STREAM, kernel, grid, block, smem, __VA_ARGS__)
#endif

inline int launch_check(const char *what) {
    MT_GPU_CHECK(gpuGetLastError(), what);
    return MT_OK;
}

/* Blocks and threads of an element kernel: the library's launch geometry (recorded). */
inline void element_launch(int *blocks, int *threads, int64_t items) {
    *threads = mt_gpu_threads();
    *blocks = mt_gpu_blocks(items, *threads);
    mt_gpu_record_launch(*threads, *blocks);
}

inline int kind_of(const operand &o) {
    if (o.layout == MT_KMAJOR) return 0;
    return ((((uintptr_t)o.ptr) & 15u) == 0 && o.ld % 4 == 0) ? 2 : 1;
}

/* The kernel's dynamic shared memory limit, raised once per instantiation (thread-safe). */
template <int KA, int KB>
inline int allow_smem() {
    static const gpuError_t err =
        gpuFuncSetAttribute((const void *)k_gemm<KA, KB>, gpuFuncAttributeMaxDynamicSharedMemorySize,
                            tiling<KA, KB>::SMEM_BYTES);
    MT_GPU_CHECK(err, "gemm shared memory size");
    return MT_OK;
}

template <int KA, int KB>
inline int launch(const params &p, int64_t slices, gpuStream_t stream) {
    int rc = allow_smem<KA, KB>();
    if (rc) return rc;
    const int64_t tiles = (int64_t)p.tiles_m * p.tiles_n;
    for (int64_t z0 = 0; z0 < slices; z0 += 65535) {
        params q = p;
        q.z0 = z0;
        const dim3 grid((unsigned)tiles, (unsigned)min64(slices - z0, 65535));
        void (*const kernel)(params) = k_gemm<KA, KB>;
        constexpr int smem_bytes = tiling<KA, KB>::SMEM_BYTES;
        MT_LAUNCH_ON(stream, kernel, grid, THREADS, smem_bytes, q);
    }
    return launch_check("gemm");
}

/* C = chains (+ bias); see desc. Refuses (MT_EINVAL) only shapes beyond its grid. */
inline int gemm(const desc &d) {
    if (d.m <= 0 || d.n <= 0 || d.slices <= 0) return MT_OK;
    const int64_t tm = (d.m + BM - 1) / BM, tn = (d.n + BN - 1) / BN;
    if (tm * tn > 0x7fffffff - GROUP_M * tn)
        return mt_fail(MT_EINVAL, "a %lld x %lld product is more tiles than one launch holds", (long long)d.m,
                       (long long)d.n);
    if ((d.slices > 1 ? d.k_slice : d.k) > 0x7fffffff - 2 * MAX_BK)
        return mt_fail(MT_EINVAL, "a contraction of %lld steps is longer than one launch holds (2^31 - 1 - %d)",
                       (long long)(d.slices > 1 ? d.k_slice : d.k), 2 * MAX_BK);
    params p;
    p.c = d.c;
    p.ldc = d.ldc;
    p.c_slice = d.c_slice;
    p.a = d.a.ptr;
    p.lda = d.a.ld;
    p.b = d.b.ptr;
    p.ldb = d.b.ld;
    p.bias = d.bias;
    p.m = d.m;
    p.n = d.n;
    p.k = d.k;
    p.k_slice = d.slices > 1 ? d.k_slice : 0;
    p.z0 = 0;
    p.tiles_m = (int32_t)tm;
    p.tiles_n = (int32_t)tn;
    p.accumulate = d.accumulate;
    p.refused = d.refused;
    switch (kind_of(d.a) * 3 + kind_of(d.b)) {
    case 0: return launch<0, 0>(p, d.slices, d.stream);
    case 1: return launch<0, 1>(p, d.slices, d.stream);
    case 2: return launch<0, 2>(p, d.slices, d.stream);
    case 3: return launch<1, 0>(p, d.slices, d.stream);
    case 4: return launch<1, 1>(p, d.slices, d.stream);
    case 5: return launch<1, 2>(p, d.slices, d.stream);
    case 6: return launch<2, 0>(p, d.slices, d.stream);
    case 7: return launch<2, 1>(p, d.slices, d.stream);
    default: return launch<2, 2>(p, d.slices, d.stream);
    }
}

/* dst (rows x cols, row stride ldd) = the pairwise tree over `leaves` partials of rows * cols
 * floats each (partials[l * rows * cols + e]); leaves >= 1. Passes of 32 leaves; scratch for
 * the intermediate levels (ceil(leaves / 32) items ...) comes from the arena. */
inline int fold_leaves(float *dst, int64_t ldd, int64_t rows, int64_t cols, const float *partials, int64_t leaves,
                       mt_arena *arena, const int32_t *refused) {
    const int64_t elems = rows * cols;
    if (elems <= 0) return MT_OK;
    int blocks, threads, rc;
    element_launch(&blocks, &threads, elems);
    const float *src = partials;
    while (leaves > 32) {
        const int64_t groups = (leaves + 31) / 32;
        float *next = nullptr;
        if ((rc = arena->alloc((void **)&next, groups * elems * 4))) return rc;
        MT_LAUNCH(k_fold32, blocks, threads, 0, next, elems, elems, src, leaves, elems, refused);
        if ((rc = launch_check("leaf tree"))) return rc;
        src = next;
        leaves = groups;
    }
    MT_LAUNCH(k_fold32, blocks, threads, 0, dst, ldd, cols, src, leaves, elems, refused);
    return launch_check("leaf tree");
}

/* C = the token rule over the contraction index (the tokens): leaves of MT_TOKEN_LEAF steps,
 * each a chain from +0.0, then the pairwise tree. One leaf (k <= 1024): the chain itself,
 * straight into C. More: leaves * m * n floats of scratch for the partials (one launch,
 * one slice per leaf), then the tree. No bias, no accumulate. */
inline int gemm_tokens(const desc &d, mt_arena *arena) {
    const int64_t leaves = mt_token_leaves(d.k);
    if (d.m <= 0 || d.n <= 0) return MT_OK;
    if (leaves <= 1) return gemm(d);
    float *part = nullptr;
    int rc;
    if ((rc = arena->alloc((void **)&part, leaves * d.m * d.n * 4))) return rc;
    desc s = d;
    s.c = part;
    s.ldc = d.n;
    s.c_slice = d.m * d.n;
    s.k_slice = MT_TOKEN_LEAF;
    s.slices = leaves;
    s.bias = nullptr;
    s.accumulate = false;
    if ((rc = gemm(s))) return rc;
    return fold_leaves(d.c, d.ldc, d.m, d.n, part, leaves, arena, d.refused);
}

/* dst[j] = the token rule over rows i < rows of acc + x[i * cols + j] (dbias). */
inline int token_col_sums(float *dst, const float *x, int64_t rows, int64_t cols, mt_arena *arena,
                          const int32_t *refused) {
    if (cols <= 0) return MT_OK;
    const int64_t leaves = rows > 0 ? mt_token_leaves(rows) : 1;
    float *part = dst;
    int rc, blocks, threads;
    if (leaves > 1 && (rc = arena->alloc((void **)&part, leaves * cols * 4))) return rc;
    element_launch(&blocks, &threads, leaves * cols);
    MT_LAUNCH(k_leaf_col_sums, blocks, threads, 0, part, x, rows, cols, leaves, refused);
    if ((rc = launch_check("leaf sums"))) return rc;
    return leaves > 1 ? fold_leaves(dst, cols, 1, cols, part, leaves, arena, refused) : MT_OK;
}

/* The pre-pass over up to 4 flat buffers (NULL or empty ones skipped, keeping their index). */
inline int finite_check(int32_t *flags, const float *const *ptrs, const int64_t *counts, int count) {
    finite_set set;
    int64_t most = 0;
    set.count = count;
    for (int b = 0; b < 4; ++b) {
        set.p[b] = b < count ? ptrs[b] : nullptr;
        set.n[b] = (b < count && ptrs[b]) ? counts[b] : 0;
        if (set.n[b] > most) most = set.n[b];
    }
    int blocks, threads;
    element_launch(&blocks, &threads, (most + 3) / 4);
    MT_LAUNCH(k_finite, blocks, threads, 0, set, flags);
    return launch_check("finiteness pre-pass");
}

}  // namespace
}  // namespace mt_gemm

#endif /* MT_GPU_GEMM_CUH */
