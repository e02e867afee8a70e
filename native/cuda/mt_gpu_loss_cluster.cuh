/* mt_gpu_loss_cluster.cuh -- part of mt_gpu_loss.cu (included once, inside its unnamed namespace,
 * after the row helpers it uses: ce_scan, ce_exp_row, ce_sum, ce_plain_grad4, ce_dev, ce_target):
 * cross-entropy rows shared by a cluster of blocks on CUDA (sm_90), the plan of a row's split
 * and the launch. Split out of mt_gpu_loss.cu by concern; the device code is the same. */
#ifndef MT_GPU_LOSS_CLUSTER_CUH
#define MT_GPU_LOSS_CLUSTER_CUH

/* ---- rows shared by a cluster (CUDA, sm_90) --------------------------------------------
 * The staged kernel holds one row per block (201 KB at V = 50304), so the next row can only be
 * copied in while the gradient pass frees its slots: the exps (issue-bound, ~6.6 of 18.9 us a
 * row on an H200) run with no transfer in flight (bench/results/NOTES.md, eleventh session).
 * Here a cluster of CS blocks shares each row: block k holds chunks [lo_k, lo_k+1) of the row
 * (boundaries by ce_split_lo), in one of two buffers, and the next row's share is copied into
 * the other buffer while this one is computed. The max, min and top bits and the chunk
 * partials (the smoothing sum's, then the exp sum's) are exchanged through distributed shared
 * memory; every block then folds the same partials by the same tree. Each chunk is folded by
 * one warp from the same values as in k_ce_rows, so the bits are the same. Plain rows
 * (CE_PLAIN), 16-byte aligned, whose two buffers fit, and only with MOJO_TRAIN_CE_CLUSTER=1
 * (opt-in, same bits: slower than the one-block rows on the H200, bench/results/NOTES.md). */
#define CE_MAX_CLUSTER 8

/* First chunk of block k of a cluster of cs over a row of `chunks` chunks of `vocab` floats:
 * the chunk boundary nearest k * vocab / cs, kept at least one chunk after block k - 1's and
 * leaving a chunk for each later block (chunks >= cs). */
__host__ __device__ __forceinline__ int64_t ce_split_lo(int64_t vocab, int64_t chunks, int cs, int k) {
    int64_t lo = 0;
    for (int j = 1; j <= k; ++j) {
        int64_t want = (2 * (int64_t)j * vocab + (int64_t)cs * MT_CHUNK) / (2 * (int64_t)cs * MT_CHUNK);
        int64_t most = chunks - (cs - j);
        lo = want < lo + 1 ? lo + 1 : want;
        lo = lo > most ? most : lo;
    }
    return lo;
}

/* Floats of block k's share of a row. */
__host__ __device__ __forceinline__ int64_t ce_split_len(int64_t vocab, int64_t chunks, int cs, int k) {
    int64_t hi = k + 1 == cs ? vocab : ce_split_lo(vocab, chunks, cs, k + 1) * MT_CHUNK;
    return hi - ce_split_lo(vocab, chunks, cs, k) * MT_CHUNK;
}

/* Shared memory of a cluster block: two row buffers of `cap` floats, then the words below. */
struct ce_cluster_smem {
    int64_t cap, chunks;
    __host__ __device__ int64_t bytes() const {
        return 4 * (2 * cap + 8 + 2 * chunks + 2 * chunks + chunks + (chunks + 31) / 32 + 1 + 96);
    }
};

/* cap: the largest share of a row, or 0 when the plan does not fit or the row has too few
 * chunks; *cs: the smallest cluster size (2, 4, 8) whose two buffers fit in `optin` bytes. */
inline int64_t ce_cluster_plan(int64_t vocab, int64_t optin, int *cs) {
    int64_t chunks = mt_chunk_count(vocab);
    for (int c = 2; c <= CE_MAX_CLUSTER; c *= 2) {
        if (chunks < c) return 0;
        int64_t cap = 0;
        for (int k = 0; k < c; ++k) {
            int64_t len = ce_split_len(vocab, chunks, c, k);
            cap = len > cap ? len : cap;
        }
        if (ce_cluster_smem{cap, chunks}.bytes() <= optin) {
            *cs = c;
            return cap;
        }
    }
    return 0;
}

#if MT_CE_CLUSTERS
__global__ void __launch_bounds__(32 * CE_SMEM_WARPS, 1)
    k_ce_rows_cluster(const float *logits, float *dlogits, float *losses, uint8_t *flags, const void *targets,
                      int32_t bytes, int64_t n, int64_t vocab, int64_t ignore, const ce_dev *dev, int64_t cap) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();       /* never launched: the host checks cudaDevAttrClusterLaunch first */
#else
    namespace cg = cooperative_groups;
    extern __shared__ float4 smem4[];
    if (dev->first_bad < n) return;     /* the same for every block: no cluster barrier is left waiting */
    cg::cluster_group cluster = cg::this_cluster();
    const int cs = (int)cluster.num_blocks(), me = (int)cluster.block_rank();
    const int64_t chunks = mt_chunk_count(vocab), lo = ce_split_lo(vocab, chunks, cs, me);
    const int64_t off = lo * MT_CHUNK, len = ce_split_len(vocab, chunks, cs, me), len4 = len / 4;
    const int64_t mine = (me + 1 == cs ? chunks : ce_split_lo(vocab, chunks, cs, me + 1)) - lo;
    uint32_t *pub = (uint32_t *)((float *)smem4 + 2 * cap);              /* [2][4]: m, mn, top bits */
    float *xpart = (float *)(pub + 8), *spart = xpart + 2 * chunks;     /* [2][chunks] each */
    float *part = spart + 2 * chunks, *part2 = part + chunks;
    uint32_t *red = (uint32_t *)(part2 + (chunks + 31) / 32 + 1);
    const mt_ce_scalars sc = dev->sc;
    const int w = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
    const int64_t c0 = blockIdx.x / cs, stride = gridDim.x / cs;
    auto copy_in = [&](float *dst, int64_t r) {
        const float *src = logits + r * vocab + off;
        for (int64_t q = threadIdx.x; q < len4; q += blockDim.x) mt_cp_async16(dst + 4 * q, src + 4 * q, 16);
    };
    /* partials[c] of every chunk, each from the block that owns it, into part; then the tree */
    auto gather_fold = [&](float *pub_part) {
        for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
            int k = 0;
            while (k + 1 < cs && ce_split_lo(vocab, chunks, cs, k + 1) <= c) ++k;
            part[c] = *cluster.map_shared_rank(pub_part + c, k);
        }
        __syncthreads();
        return mt_block_tree_fold(part, chunks, part2, part);
    };
    if (c0 < n) copy_in((float *)smem4, c0);
    mt_cp_async_commit();
    int it = 0;
    for (int64_t r = c0; r < n; r += stride, ++it) {
        const int par = it & 1;
        float *row = (float *)smem4 + par * cap;
        if (r + stride < n) copy_in((float *)smem4 + (par ^ 1) * cap, r + stride);   /* under everything below */
        mt_cp_async_commit();
        mt_cp_async_wait<1>();
        __syncthreads();
        const int64_t t = ce_target(targets, bytes, r);
        const bool ignored = t == ignore;
        /* x_t for the loss, read before exchange 1: in place (the LM head's call), the block that
         * owns t writes its gradient over it once exchange 2 is passed */
        const float xt = me == 0 && threadIdx.x == 0 && !ignored ? logits[r * vocab + t] : 0.0f;
        ce_scan scan;
        for (int64_t q = threadIdx.x; q < len4; q += blockDim.x) scan(((const float4 *)row)[q]);
        scan.block(red);
        if (!ignored && sc.eps != 0.0f)     /* label smoothing's sum of the logits, before e_j replaces x_j */
            for (int64_t c = w; c < mine; c += nw) {
                int64_t cl = c * MT_CHUNK, clen = len - cl < MT_CHUNK ? len - cl : MT_CHUNK;
                float out[1];
                mt_warp_chunk_fold<1>(out, ce_sum<true>{row + cl}, clen, lane, MT_SAB_LOSS);
                if (lane == 0) xpart[par * chunks + lo + c] = out[0];
            }
        if (threadIdx.x == 0) {
            pub[4 * par] = mt_f32_bits(scan.m);
            pub[4 * par + 1] = mt_f32_bits(scan.mn);
            pub[4 * par + 2] = scan.top;
        }
        cluster.sync();                     /* exchange 1: the scans and the smoothing partials */
        for (int k = 0; k < cs; ++k) {
            const uint32_t *o = cluster.map_shared_rank(pub + 4 * par, k);
            scan.m = fmaxf(scan.m, mt_bits_f32(o[0]));
            scan.mn = fminf(scan.mn, mt_bits_f32(o[1]));
            scan.top = max(scan.top, o[2]);
        }
        const float m = scan.m;
        float s = 0.0f, sum_x = 0.0f;
        if (!ignored) {
            if (sc.eps != 0.0f) sum_x = gather_fold(xpart + par * chunks);
            if (scan.mn - m >= MT_EXPF_MID_LO) ce_exp_row<true>(row, len, m);
            else ce_exp_row<false>(row, len, m);
            __syncthreads();
            for (int64_t c = w; c < mine; c += nw) {
                int64_t cl = c * MT_CHUNK, clen = len - cl < MT_CHUNK ? len - cl : MT_CHUNK;
                float out[1];
                mt_warp_chunk_fold<1>(out, ce_sum<true>{row + cl}, clen, lane, MT_SAB_LOSS);
                if (lane == 0) spart[par * chunks + lo + c] = out[0];
            }
            cluster.sync();                 /* exchange 2: the exp sums' partials */
            s = gather_fold(spart + par * chunks);
        }
        if (dlogits) {
            float *d = dlogits + r * vocab + off;
            if (ignored) {
                for (int64_t q = threadIdx.x; q < len4; q += blockDim.x)
                    MT_STCS((float4 *)(d + 4 * q), make_float4(0.0f, 0.0f, 0.0f, 0.0f));
            } else {
                const float y = 1.0f / s;
                const int tt = (int)(t - off);     /* row-local indices fit in int: vocab < 2^24 */
                for (int64_t q = threadIdx.x; q < len4; q += blockDim.x) {
                    const int i = (int)(4 * q);
                    MT_STCS((float4 *)(d + i), ce_plain_grad4(((const float4 *)row)[q], s, y, tt - i, sc));
                }
            }
        }
        if (me == 0 && threadIdx.x == 0) {
            losses[r] = ignored ? 0.0f : mt_ce_row_loss(m, s, xt, sum_x, &sc);
            flags[r] = (uint8_t)(scan.top >= 0x7f800000u);
        }
        __syncthreads();                    /* this buffer is free for the row after next */
    }
    cluster.sync();                         /* no block leaves while another may read its words */
#endif
}
#endif

#if MT_CE_CLUSTERS
/* k_ce_rows_cluster over the rows: clusters of cs blocks, as many as can be resident at once
 * (each block holds two shares of `cap` floats), capped by the rows and by mt_gpu_blocks's cap
 * (mt_set_launch_geometry) counted in blocks. Returns -1, launching nothing, when the device
 * has no cluster launch or cannot place such a cluster, or the cap is below cs: the caller
 * then runs the one-block rows. */
int ce_launch_cluster(float *rows, uint8_t *flags, const ce_dev *dev, const void *targets, int32_t target_bytes,
                      int64_t n, int64_t vocab, int64_t ignore_index, const float *logits, float *dlogits, int cs,
                      int64_t cap) {
    static std::once_flag once, probe;
    static bool can_cluster = false;
    static std::mutex lock;
    static std::map<std::pair<int, size_t>, int> resident;   /* (cs, shared bytes) -> clusters */
    std::call_once(probe, [] {
        int v = 0;
        can_cluster = cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, 0) == cudaSuccess && v != 0;
        cudaGetLastError();
    });
    const int64_t blocks = mt_gpu_blocks(n * cs, 1);
    if (!can_cluster || blocks < cs) return -1;
    const size_t smem = (size_t)ce_cluster_smem{cap, mt_chunk_count(vocab)}.bytes();
    int rc;
    if ((rc = mt_rows_allow_smem(k_ce_rows_cluster, once))) return rc;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)cs;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(32 * CE_SMEM_WARPS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = MT_STREAM;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    {
        std::lock_guard<std::mutex> hold(lock);
        auto it = resident.find({cs, smem});
        if (it != resident.end()) {
            clusters = it->second;
        } else {
            cfg.gridDim = dim3((unsigned)(cs * mt_rows_limits().sms));
            if (cudaOccupancyMaxActiveClusters(&clusters, k_ce_rows_cluster, &cfg) != cudaSuccess) clusters = 0;
            cudaGetLastError();
            resident[{cs, smem}] = clusters;
        }
    }
    if (clusters < 1) return -1;
    int64_t want = blocks / cs;
    clusters = (int)(want < clusters ? want : clusters);
    cfg.gridDim = dim3((unsigned)(cs * clusters));
    MT_GPU_CHECK(cudaLaunchKernelEx(&cfg, k_ce_rows_cluster, logits, dlogits, rows, flags, targets, target_bytes,
                                    n, vocab, ignore_index, dev, cap),
                 "cross_entropy rows (cluster)");
    return mt_rows_launched("cross_entropy rows (cluster)");
}
#endif

#endif /* MT_GPU_LOSS_CLUSTER_CUH */
