/*
 * decode.cuh — single-request decode on CUDA cores, split over the KV length.
 *
 * Computes, for every query head h (one query token):
 *     o[h] = sum_j softmax_j(s(q[h], k[j])) v[j],   lse[h] = ln sum_j exp(s(q[h], k[j]))
 * with s the variant's logits (sm_scale, soft-cap or ALiBi) and the key range limited by the
 * sliding window. Query heads h = hk*G + g share KV head hk (GQA).
 *
 * Shapes (elements, strides at run time; D contiguous):
 *   q [H, D]   k, v [L_KV, H_KV, D] (nhd) or [H_KV, L_KV, D] (hnd)   o [H, D]   lse [H] float
 *
 * Template parameters (Cfg): D in {64,128,256}; G query heads per KV head; GB heads per CTA
 * (divides G, <= 8); DT / OUT_DT in {F16, BF16}; LOGITS 0 none / 1 soft-cap / 2 ALiBi;
 * WINDOW, LSE in {0,1}; WARPS per CTA; STAGES of the per-warp cp.async pipeline; TILE = 32;
 * HAS_LOGITS_EXPR / HAS_MASK_EXPR with Cfg::logits_expr / Cfg::mask_expr, the user snippets;
 * MASK_DATA 0 / 1 bitmask / 2 bsr (the query is row 0 of the mask).
 *
 * Launch: main grid (num_splits, H_KV, G/GB), WARPS*32 threads, smem decode_smem_bytes<Cfg>().
 * Each CTA covers keys [kv_begin + split*kv_chunk, +kv_chunk) ∩ [0, L_KV). Every warp runs its
 * own pipeline over tiles of TILE keys (lane = key for q.k, lane = slice of D for p.v), keeps
 * an online softmax state, and the CTA combines its warps at the end. With one split the CTA
 * writes o directly; otherwise it writes a normalised partial (o, log2-sum-exp) and the merge
 * kernel (grid H, merge threads) combines the splits.
 *
 * Checked against the float64 CPU reference in tools/check.c (tests/test_gpu.c, kiln check).
 */
#ifndef KILN_DECODE_CUH
#define KILN_DECODE_CUH

#include "common/device.cuh"
#include "common/params.h"

namespace kiln {

template <class Cfg> struct decode_layout {
    static constexpr int D = Cfg::D, GB = Cfg::GB, TILE = Cfg::TILE;
    static constexpr int KROW = D + 8;                         /* padded K row, u16 */
    static constexpr int STAGE_U16 = TILE * KROW + TILE * D;   /* one K + one V tile */
    static constexpr int Q_BYTES = GB * D * 4;                  /* q as float [GB][D] */
    static constexpr int P_BYTES = Cfg::WARPS * GB * TILE * 4;  /* p [WARPS][GB][TILE] */
    static constexpr int KV_BYTES = Cfg::WARPS * Cfg::STAGES * STAGE_U16 * 2;
    static constexpr int COMBINE_BYTES = Cfg::WARPS * GB * (D + 2) * 4;
    static constexpr int REGION = KV_BYTES > COMBINE_BYTES ? KV_BYTES : COMBINE_BYTES;
    static constexpr int BYTES = Q_BYTES + P_BYTES + REGION;
};

/* Vector of N 16-bit values from global/shared memory into floats. */
template <int DT, int N> __device__ __forceinline__ void load_f(const u16 *p, float (&f)[N])
{
    if (N == 8) {
        uint4 w = *reinterpret_cast<const uint4 *>(p);
        unpack2<DT>(w.x, f[0], f[1]);
        unpack2<DT>(w.y, f[2], f[3]);
        unpack2<DT>(w.z, f[4], f[5]);
        unpack2<DT>(w.w, f[6], f[7]);
    } else if (N == 4) {
        uint2 w = *reinterpret_cast<const uint2 *>(p);
        unpack2<DT>(w.x, f[0], f[1]);
        unpack2<DT>(w.y, f[2], f[3]);
    } else {
        u32 w = *reinterpret_cast<const u32 *>(p);
        unpack2<DT>(w, f[0], f[1]);
    }
}

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = max_f(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* Issue the cp.async copies of one K tile and one V tile (keys [t0, t0+TILE) ∩ [.., hi)). */
template <class Cfg>
__device__ __forceinline__ void decode_load_tile(u16 *stage, const u16 *k, const u16 *v,
                                                 i64 ks, i64 vs, int t0, int hi, int lane)
{
    using L = decode_layout<Cfg>;
    constexpr int CHUNKS = Cfg::D / 8; /* 16-byte chunks per row */
    u16 *ks_ = stage;
    u16 *vs_ = stage + Cfg::TILE * L::KROW;
#pragma unroll
    for (int it = 0; it < Cfg::TILE * CHUNKS / WARP; it++) {
        int c = it * WARP + lane;
        int row = c / CHUNKS, col = c % CHUNKS;
        int j = t0 + row;
        bool ok = j < hi;
        const u16 *srck = ok ? k + (i64)j * ks + col * 8 : k;
        const u16 *srcv = ok ? v + (i64)j * vs + col * 8 : v;
        cp_async16(smem_addr(ks_ + row * L::KROW + col * 8), srck, ok ? 16 : 0);
        cp_async16(smem_addr(vs_ + row * Cfg::D + col * 8), srcv, ok ? 16 : 0);
    }
}

template <class Cfg> __device__ void decode_kernel(const kiln_launch_params &p)
{
    using L = decode_layout<Cfg>;
    constexpr int D = Cfg::D, GB = Cfg::GB, TILE = Cfg::TILE, WARPS = Cfg::WARPS;
    constexpr int STAGES = Cfg::STAGES, DT = Cfg::DT;
    constexpr int DPL = D / WARP; /* elements of D per lane in p.v */
    static_assert(TILE == WARP, "one key per lane");

    extern __shared__ __align__(16) unsigned char smem[];
    float *q_s = reinterpret_cast<float *>(smem);                 /* [GB][D] */
    float *p_s = reinterpret_cast<float *>(smem + L::Q_BYTES);    /* [WARPS][GB][TILE] */
    unsigned char *region = smem + L::Q_BYTES + L::P_BYTES;

    const int split = blockIdx.x, hk = blockIdx.y, g0 = blockIdx.z * GB;
    const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;
    const int L_KV = p.kv_len;
    const int lo = p.kv_begin + split * p.kv_chunk;
    const int hi = min(L_KV, lo + p.kv_chunk);

    const u16 *q = reinterpret_cast<const u16 *>(p.q);
    const u16 *k = reinterpret_cast<const u16 *>(p.k) + (i64)hk * p.k_stride_h;
    const u16 *v = reinterpret_cast<const u16 *>(p.v) + (i64)hk * p.v_stride_h;

    for (int i = tid; i < GB * D; i += WARPS * WARP) {
        int g = i / D, d = i % D;
        q_s[i] = to_float<DT>(q[(i64)(hk * Cfg::G + g0 + g) * p.q_stride_h + d]);
    }
    float slope[GB];
#pragma unroll
    for (int g = 0; g < GB; g++)
        slope[g] = Cfg::LOGITS == 2 ? reinterpret_cast<const float *>(p.alibi)[hk * Cfg::G + g0 + g] : 0.f;
    __syncthreads();

    /* Per-warp online softmax state: m (warp-uniform), l (per lane, summed at the end), o. */
    float m[GB], l[GB], o[GB][DPL];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        m[g] = neg_inf();
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; i++) o[g][i] = 0.f;
    }

    const int n_tiles = (hi - lo + TILE - 1) / TILE;
    const int n_mine = n_tiles > warp ? (n_tiles - warp + WARPS - 1) / WARPS : 0;
    u16 *stages = reinterpret_cast<u16 *>(region) + warp * STAGES * L::STAGE_U16;
    float *pw = p_s + warp * GB * TILE;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < n_mine)
            decode_load_tile<Cfg>(stages + s * L::STAGE_U16, k, v, p.k_stride_n, p.v_stride_n,
                                  lo + (warp + s * WARPS) * TILE, hi, lane);
        cp_async_commit();
    }

    for (int i = 0; i < n_mine; i++) {
        const int ahead = i + STAGES - 1;
        if (ahead < n_mine)
            decode_load_tile<Cfg>(stages + (ahead % STAGES) * L::STAGE_U16, k, v, p.k_stride_n,
                                  p.v_stride_n, lo + (warp + ahead * WARPS) * TILE, hi, lane);
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        __syncwarp();

        const u16 *ks_ = stages + (i % STAGES) * L::STAGE_U16;
        const u16 *vs_ = ks_ + TILE * L::KROW;
        const int t0 = lo + (warp + i * WARPS) * TILE;
        const int j = t0 + lane;

        /* s = q.k for this lane's key, every head of the group. */
        float acc[GB];
#pragma unroll
        for (int g = 0; g < GB; g++) acc[g] = 0.f;
#pragma unroll 8
        for (int c = 0; c < D / 8; c++) {
            float kf[8];
            load_f<DT, 8>(ks_ + lane * L::KROW + c * 8, kf);
#pragma unroll
            for (int g = 0; g < GB; g++) {
                const float4 qa = *reinterpret_cast<const float4 *>(q_s + g * D + c * 8);
                const float4 qb = *reinterpret_cast<const float4 *>(q_s + g * D + c * 8 + 4);
                acc[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] +
                          qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
            }
        }
        const bool valid = j < hi;
#pragma unroll
        for (int g = 0; g < GB; g++) {
            const int h = hk * Cfg::G + g0 + g;
            const bool vis = valid && mask_data<Cfg>(p, 0, j) && mask_user<Cfg>(p, 0, j, h, hk);
            float s = vis ? logit_full<Cfg>(acc[g], p, slope[g], 0, j, h, hk) : neg_inf();
            float m_new = max_f(m[g], warp_max(s));
            /* a tile the mask hides entirely leaves m at -inf: keep exp2 finite */
            float m_use = m_new == neg_inf() ? 0.f : m_new;
            float scale = exp2_fast(m[g] - m_use);
            float pj = exp2_fast(s - m_use);
            m[g] = m_new;
            l[g] = l[g] * scale + pj;
#pragma unroll
            for (int e = 0; e < DPL; e++) o[g][e] *= scale;
            pw[g * TILE + lane] = pj;
        }
        __syncwarp();

        /* o += p v: lane owns D/32 consecutive elements of every value row. */
#pragma unroll 2
        for (int t = 0; t < TILE; t += 4) {
            float vf[4][DPL];
#pragma unroll
            for (int u = 0; u < 4; u++) load_f<DT, DPL>(vs_ + (t + u) * D + lane * DPL, vf[u]);
#pragma unroll
            for (int g = 0; g < GB; g++) {
                const float4 pp = *reinterpret_cast<const float4 *>(pw + g * TILE + t);
#pragma unroll
                for (int e = 0; e < DPL; e++)
                    o[g][e] += pp.x * vf[0][e] + pp.y * vf[1][e] + pp.z * vf[2][e] + pp.w * vf[3][e];
            }
        }
        __syncwarp();
    }
    cp_async_wait<0>();
    __syncthreads(); /* every warp is done with the KV region: reuse it to combine */

    float *cm = reinterpret_cast<float *>(region);     /* [WARPS][GB] */
    float *cl = cm + WARPS * GB;                        /* [WARPS][GB] */
    float *co = cl + WARPS * GB;                        /* [WARPS][GB][D] */
#pragma unroll
    for (int g = 0; g < GB; g++) {
        float lsum = warp_sum(l[g]);
        if (lane == 0) {
            cm[warp * GB + g] = m[g];
            cl[warp * GB + g] = lsum;
        }
#pragma unroll
        for (int e = 0; e < DPL; e++) co[(warp * GB + g) * D + lane * DPL + e] = o[g][e];
    }
    __syncthreads();

    for (int i = tid; i < GB * D; i += WARPS * WARP) {
        const int g = i / D, d = i % D, h = hk * Cfg::G + g0 + g;
        float M = neg_inf();
#pragma unroll
        for (int w = 0; w < WARPS; w++) M = max_f(M, cm[w * GB + g]);
        float lsum = 0.f, osum = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) {
            float mw = cm[w * GB + g];
            float f = mw == neg_inf() ? 0.f : exp2_fast(mw - M);
            lsum += cl[w * GB + g] * f;
            osum += co[(w * GB + g) * D + d] * f;
        }
        const float out = lsum > 0.f ? osum / lsum : 0.f;
        const float lse2 = lsum > 0.f ? M + log2_fast(lsum) : neg_inf(); /* log2 units */
        if (p.num_splits == 1) {
            reinterpret_cast<u16 *>(p.o)[(i64)h * p.o_stride_h + d] = from_float<Cfg::OUT_DT>(out);
            if (Cfg::LSE && d == 0) reinterpret_cast<float *>(p.lse)[h] = lse2 * LN2;
        } else {
            reinterpret_cast<float *>(p.partial_o)[((i64)split * p.num_qo_heads + h) * D + d] = out;
            if (d == 0) reinterpret_cast<float *>(p.partial_lse)[(i64)split * p.num_qo_heads + h] = lse2;
        }
    }
}

/* Combine the num_splits partial states of each query head: grid H, any thread count. */
template <class Cfg> __device__ void decode_merge_kernel(const kiln_launch_params &p)
{
    constexpr int D = Cfg::D;
    const int h = blockIdx.x, H = p.num_qo_heads, S = p.num_splits;
    const float *plse = reinterpret_cast<const float *>(p.partial_lse);
    const float *po = reinterpret_cast<const float *>(p.partial_o);
    float M = neg_inf();
    for (int s = 0; s < S; s++) M = max_f(M, plse[s * H + h]);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float lsum = 0.f, osum = 0.f;
        for (int s = 0; s < S; s++) {
            float ls = plse[s * H + h];
            float w = ls == neg_inf() ? 0.f : exp2_fast(ls - M);
            lsum += w;
            osum += w * po[((i64)s * H + h) * D + d];
        }
        const float out = lsum > 0.f ? osum / lsum : 0.f;
        reinterpret_cast<u16 *>(p.o)[(i64)h * p.o_stride_h + d] = from_float<Cfg::OUT_DT>(out);
        if (Cfg::LSE && d == 0)
            reinterpret_cast<float *>(p.lse)[h] = lsum > 0.f ? (M + log2_fast(lsum)) * LN2 : neg_inf();
    }
}

} /* namespace kiln */

#endif /* KILN_DECODE_CUH */
