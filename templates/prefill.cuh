/*
 * prefill.cuh — single-request prefill on tensor cores (mma.sync m16n8k16, f32 accumulate),
 * FlashAttention-2 style: one CTA per (query tile, query head), K/V tiles streamed through a
 * cp.async pipeline, online softmax in registers.
 *
 * Computes, for every query row i < L_Q and head h (KV head h / G):
 *     o[i, h] = sum_j softmax_j(s(i, j)) v[j, h/G],   lse[i, h] = ln sum_j exp(s(i, j))
 * over the keys the mask leaves visible: causal keeps j <= i + L_KV - L_Q (bottom-right
 * aligned), the window keeps j >= i + L_KV - L_Q - window_left.
 *
 * Shapes (elements, strides at run time; D contiguous):
 *   q [L_Q, H, D]   k, v [L_KV, H_KV, D] (nhd) or [H_KV, L_KV, D] (hnd)   o [L_Q, H, D]
 *   lse [L_Q, H] float
 *
 * Template parameters (Cfg): D in {64,128,256}; G; DT / OUT_DT in {F16, BF16}; LOGITS 0 none /
 * 1 soft-cap / 2 ALiBi; CAUSAL, WINDOW, LSE in {0,1}; WARPS; MT m16 tiles per warp; BN keys per
 * tile (multiple of 16); STAGES of the K/V pipeline; Q_IN_REGS keeps Q's fragments in registers;
 * HAS_LOGITS_EXPR / HAS_MASK_EXPR with Cfg::logits_expr / Cfg::mask_expr, the user snippets;
 * MASK_DATA 0 / 1 bitmask / 2 bsr; MASK_USES_HEAD (the mask snippet reads a head index).
 * Element masks (snippet, data) are evaluated per element in every tile unless a tile map
 * from prefill_tile_map_kernel (kiln_prefill_mask_plan) says a tile is hidden (skipped) or
 * fully visible (no element work).
 * BM = WARPS * MT * 16 query rows per CTA.
 *
 * Launch: grid (ceil(L_Q / BM), H), WARPS*32 threads, smem prefill_layout<Cfg>::BYTES.
 * Shared tiles are [rows][D] with 16-byte chunks XOR-swizzled by (row & 7), so ldmatrix reads
 * of 8 rows at one column hit 8 different banks.
 *
 * Checked against the float64 CPU reference in tools/check.c (tests/test_gpu.c, kiln check).
 */
#ifndef KILN_PREFILL_CUH
#define KILN_PREFILL_CUH

#include "common/device.cuh"
#include "common/params.h"

namespace kiln {

template <class Cfg> struct prefill_layout {
    static constexpr int D = Cfg::D, BN = Cfg::BN;
    static constexpr int BM = Cfg::WARPS * Cfg::MT * 16;
    static constexpr int Q_BYTES = BM * D * 2;
    static constexpr int TILE_BYTES = BN * D * 2;
    static constexpr int BYTES = Q_BYTES + 2 * Cfg::STAGES * TILE_BYTES;
};

/* Element offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][D] tile. */
template <int D> __device__ __forceinline__ int swz(int row, int chunk)
{
    return row * D + ((chunk ^ (row & 7)) << 3);
}

/* Byte offset between the swizzled chunk `ch` of row r0 and of row r0 + dr, beyond the plain
 * dr * D * 2: zero when dr is a multiple of 8 (then row & 7 does not change). */
template <int D> __device__ __forceinline__ u32 swz_delta(int r0, int ch, int dr)
{
    if (dr % 8 == 0) return 0;
    return (u32)((((ch ^ ((r0 + dr) & 7)) - (ch ^ (r0 & 7)))) * 16);
}

/* Issue cp.async copies of rows [row0, row0 + ROWS) of a [*, D] global matrix with row stride
 * `stride` into a swizzled tile; rows at or past row_hi are zero-filled. */
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_rows(u16 *tile, const u16 *g, i64 stride, int row0,
                                          int row_hi, int tid)
{
    constexpr int CHUNKS = D / 8;              /* 16-byte chunks per row */
    constexpr int STEP = THREADS / CHUNKS;     /* rows covered by one pass of the block */
    static_assert(THREADS % CHUNKS == 0 && ROWS % STEP == 0, "load shape");
    /* Each thread keeps one column chunk; its rows advance by STEP, so the source advances
     * by STEP*stride and, with STEP a multiple of 8 (or the swizzle recomputed), the
     * destination by a constant. One 64-bit address per call, not one per pass. */
    const int r0 = tid / CHUNKS, ch = tid % CHUNKS;
    const u16 *src = g + (i64)(row0 + r0) * stride + ch * 8;
    const i64 step = (i64)STEP * stride;
    const u32 dst = smem_addr(tile + swz<D>(r0, ch));
    if (row0 + ROWS <= row_hi) { /* interior tile: no bounds checks */
#pragma unroll
        for (int it = 0; it < ROWS / STEP; it++) {
            cp_async16(dst + (u32)(it * STEP * D * 2) + swz_delta<D>(r0, ch, it * STEP), src, 16);
            src += step;
        }
        return;
    }
#pragma unroll
    for (int it = 0; it < ROWS / STEP; it++) {
        const int row = r0 + it * STEP;
        const bool ok = row0 + row < row_hi;
        cp_async16(smem_addr(tile + swz<D>(row, ch)), ok ? src : g, ok ? 16 : 0);
        src += step;
    }
}

template <class Cfg> __device__ void prefill_kernel(const kiln_launch_params &p)
{
    using L = prefill_layout<Cfg>;
    constexpr int D = Cfg::D, BN = Cfg::BN, BM = L::BM, MT = Cfg::MT, DT = Cfg::DT;
    constexpr int THREADS = Cfg::WARPS * WARP, STAGES = Cfg::STAGES;
    constexpr int NT = BN / 8; /* n8 tiles of S */
    constexpr int DTN = D / 8; /* n8 tiles of O */
    constexpr int KD = D / 16; /* k16 steps over D */
    static_assert(BN % 16 == 0 && D % 64 == 0, "tile shape");

    extern __shared__ __align__(128) unsigned char smem[];
    u16 *q_s = reinterpret_cast<u16 *>(smem);
    u16 *k_s = reinterpret_cast<u16 *>(smem + L::Q_BYTES);
    u16 *v_s = k_s + STAGES * BN * D;

    const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;
    const int m_block = gridDim.x - 1 - blockIdx.x; /* heaviest causal tiles first */
    const int h = blockIdx.y, hk = h / Cfg::G;
    const int L_Q = p.qo_len, L_KV = p.kv_len, off = L_KV - L_Q;
    const int m0 = m_block * BM;

    const u16 *qg = reinterpret_cast<const u16 *>(p.q) + (i64)h * p.q_stride_h;
    const u16 *kg = reinterpret_cast<const u16 *>(p.k) + (i64)hk * p.k_stride_h;
    const u16 *vg = reinterpret_cast<const u16 *>(p.v) + (i64)hk * p.v_stride_h;

    int kv_hi = L_KV, kv_lo = 0;
    if (Cfg::CAUSAL) kv_hi = min(L_KV, m0 + BM + off);
    if (Cfg::WINDOW) kv_lo = max(0, m0 + off - p.window_left);
    const int t_first = kv_lo / BN;
    const int t_end = kv_hi > kv_lo ? (kv_hi + BN - 1) / BN : t_first;
    const float slope = Cfg::LOGITS == 2 ? reinterpret_cast<const float *>(p.alibi)[h] : 0.f;
    /* With no logits transform the row max is taken on raw q.k (sm_scale > 0 keeps the order)
     * and c2 = sm_scale * log2(e) turns it into exp2 units inside one FFMA per element;
     * otherwise the transform already returns log2 units and c2 = 1. */
    constexpr bool RAW = Cfg::LOGITS == 0 && !Cfg::HAS_LOGITS_EXPR;
    const float c2 = RAW ? p.sm_scale * LOG2E : 1.0f;

    /* Element masks (snippet or mask data): the tile map, when given, classes each key tile of
     * this query tile as hidden (skipped), mixed (per-element mask) or fully visible. */
    constexpr bool ELEM = Cfg::HAS_MASK_EXPR || Cfg::MASK_DATA != 0;
    const unsigned char *map =
        ELEM && p.tile_map ? reinterpret_cast<const unsigned char *>(p.tile_map) + (i64)m_block * p.kv_tiles
                           : nullptr;
    auto next_tile = [&](int t) {
        if (ELEM && map)
            while (t < t_end && map[t] == 0) t++;
        return t;
    };

    /* pend[]: key tiles in flight, oldest first; t_next: the next one to load. */
    int pend[STAGES];
    int t_next = next_tile(t_first);
    load_rows<BM, D, THREADS>(q_s, qg, p.q_stride_n, m0, L_Q, tid);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        pend[s] = t_next;
        if (t_next < t_end) {
            load_rows<BN, D, THREADS>(k_s + s * BN * D, kg, p.k_stride_n, t_next * BN, L_KV, tid);
            load_rows<BN, D, THREADS>(v_s + s * BN * D, vg, p.v_stride_n, t_next * BN, L_KV, tid);
            t_next = next_tile(t_next + 1);
        }
        cp_async_commit();
    }

    const int wrow = warp * MT * 16; /* this warp's first row in the CTA tile */

    /* ldmatrix addresses. Every row a lane reads has (row & 7) == (lane & 7), and the 16-byte
     * chunk it reads is 8q + (2 rem + b) for a per-operand bit b, so the swizzled chunk is
     * 8q + ((2 rem + b) ^ (lane & 7)): four per-lane offsets per operand, the rest immediates. */
    constexpr int ROW_BYTES = D * 2;
    const int r7 = lane & 7;
    const int bq = lane >> 4, bk = (lane >> 3) & 1, bv = lane >> 4;
    const u32 q_addr = smem_addr(q_s) + (u32)((wrow + (lane & 15)) * ROW_BYTES);
    const u32 k_addr = smem_addr(k_s) + (u32)(((lane >> 4) * 8 + r7) * ROW_BYTES);
    const u32 v_addr = smem_addr(v_s) + (u32)((((lane >> 3) & 1) * 8 + r7) * ROW_BYTES);
    u32 xq[4], xk[4], xv[4];
#pragma unroll
    for (int rem = 0; rem < 4; rem++) {
        xq[rem] = (u32)(((2 * rem + bq) ^ r7) << 4);
        xk[rem] = (u32)(((2 * rem + bk) ^ r7) << 4);
        xv[rem] = (u32)(((2 * rem + bv) ^ r7) << 4);
    }
    u32 qf[Cfg::Q_IN_REGS ? MT : 1][Cfg::Q_IN_REGS ? KD : 1][4];
    float o[MT][DTN][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            m[mt][r] = neg_inf();
            l[mt][r] = 0.f;
        }
#pragma unroll
        for (int dt = 0; dt < DTN; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[mt][dt][e] = 0.f;
    }

    for (int idx = 0;; idx++) {
        pend[STAGES - 1] = t_next;
        if (t_next < t_end) {
            const int st = (idx + STAGES - 1) % STAGES;
            load_rows<BN, D, THREADS>(k_s + st * BN * D, kg, p.k_stride_n, t_next * BN, L_KV, tid);
            load_rows<BN, D, THREADS>(v_s + st * BN * D, vg, p.v_stride_n, t_next * BN, L_KV, tid);
            t_next = next_tile(t_next + 1);
        }
        cp_async_commit();
        const int t = pend[0];
        if (t >= t_end) break;
        cp_async_wait<STAGES - 1>();
        __syncthreads();

        if (Cfg::Q_IN_REGS && idx == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < KD; kk++)
                    ldmatrix_x4(q_addr + mt * 16 * ROW_BYTES + (kk >> 2) * 128 + xq[kk & 3], qf[mt][kk][0],
                                qf[mt][kk][1], qf[mt][kk][2], qf[mt][kk][3]);
        }
        const u32 ks = k_addr + (u32)((idx % STAGES) * BN * ROW_BYTES);
        const u32 vs = v_addr + (u32)((idx % STAGES) * BN * ROW_BYTES);

        /* S = Q K^T for this warp's rows and BN keys. */
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[mt][nt][e] = 0.f;
        /* Fully unrolled, the scheduler hoists every K fragment load and runs out of
         * registers at MT=2; with Q in registers the kk index must stay compile-time. */
#pragma unroll(Cfg::Q_IN_REGS ? KD / 4 : 1)
        for (int kq = 0; kq < KD / 4; kq++)
#pragma unroll
        for (int rem = 0; rem < 4; rem++) {
            const int kk = kq * 4 + rem;
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (Cfg::Q_IN_REGS) {
#pragma unroll
                    for (int e = 0; e < 4; e++) a[mt][e] = qf[Cfg::Q_IN_REGS ? mt : 0][Cfg::Q_IN_REGS ? kk : 0][e];
                } else {
                    ldmatrix_x4(q_addr + mt * 16 * ROW_BYTES + kq * 128 + xq[rem], a[mt][0], a[mt][1],
                                a[mt][2], a[mt][3]);
                }
            }
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                u32 b0, b1, b2, b3;
                ldmatrix_x4(ks + np * 16 * ROW_BYTES + kq * 128 + xk[rem], b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816<DT>(s[mt][2 * np], a[mt], b0, b1);
                    mma16816<DT>(s[mt][2 * np + 1], a[mt], b2, b3);
                }
            }
        }

        /* Logits transform, mask, online softmax. */
        const int j0 = t * BN;
        const bool elem = ELEM && (!map || map[t] == 1);
        const bool need_mask = elem || j0 + BN > L_KV || (Cfg::CAUSAL && j0 + BN - 1 > m0 + off) ||
                               (Cfg::WINDOW && j0 < m0 + BM - 1 + off - p.window_left);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int i = m0 + wrow + mt * 16 + lane / 4 + r * 8;
                float rmax = neg_inf();
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int j = j0 + nt * 8 + (lane % 4) * 2 + c;
                        /* RAW: keep q.k; the scale is folded into the exp2 below */
                        float x = RAW ? s[mt][nt][r * 2 + c]
                                      : logit_full<Cfg>(s[mt][nt][r * 2 + c], p, slope, i, j, h, hk);
                        if (need_mask) {
                            bool vis = j < L_KV;
                            if (Cfg::CAUSAL) vis = vis && j <= i + off;
                            if (Cfg::WINDOW) vis = vis && j >= i + off - p.window_left;
                            if (ELEM && elem)
                                vis = vis && mask_data<Cfg>(p, i, j) && mask_user<Cfg>(p, i, j, h, hk);
                            x = vis ? x : neg_inf();
                        }
                        s[mt][nt][r * 2 + c] = x;
                        rmax = max_f(rmax, x);
                    }
                rmax = max_f(rmax, __shfl_xor_sync(0xffffffffu, rmax, 1));
                rmax = max_f(rmax, __shfl_xor_sync(0xffffffffu, rmax, 2));
                const float m_new = max_f(m[mt][r], rmax);
                const float m_use = m_new == neg_inf() ? 0.f : m_new;
                const float m_scaled = m_use * c2;
                const float scale = exp2_fast((m[mt][r] - m_use) * c2);
                m[mt][r] = m_new;
                float rsum = 0.f;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const float pv = exp2_fast(fmaf(s[mt][nt][r * 2 + c], c2, -m_scaled));
                        s[mt][nt][r * 2 + c] = pv;
                        rsum += pv;
                    }
                l[mt][r] = l[mt][r] * scale + rsum;
#pragma unroll
                for (int dt = 0; dt < DTN; dt++) {
                    o[mt][dt][r * 2] *= scale;
                    o[mt][dt][r * 2 + 1] *= scale;
                }
            }
        }

        /* O += P V: P's accumulator layout is the A-fragment layout of the next MMA. */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            u32 a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                a[mt][0] = pack2<DT>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                a[mt][1] = pack2<DT>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                a[mt][2] = pack2<DT>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                a[mt][3] = pack2<DT>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < DTN / 2; dp++) {
                u32 b0, b1, b2, b3;
                ldmatrix_x4_trans(vs + kk * 16 * ROW_BYTES + (dp >> 2) * 128 + xv[dp & 3], b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816<DT>(o[mt][2 * dp], a[mt], b0, b1);
                    mma16816<DT>(o[mt][2 * dp + 1], a[mt], b2, b3);
                }
            }
        }
        __syncthreads(); /* the stage read here is refilled by the next iteration */
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) pend[s] = pend[s + 1];
    }
    cp_async_wait<0>();

    /* Normalise and store. */
    u16 *og = reinterpret_cast<u16 *>(p.o) + (i64)h * p.o_stride_h;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lr = l[mt][r];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            const float inv = lr > 0.f ? 1.f / lr : 0.f;
            const int i = m0 + wrow + mt * 16 + lane / 4 + r * 8;
            if (i < L_Q) {
                u16 *orow = og + (i64)i * p.o_stride_n;
#pragma unroll
                for (int dt = 0; dt < DTN; dt++) {
                    const int d = dt * 8 + (lane % 4) * 2;
                    *reinterpret_cast<u32 *>(orow + d) = pack2<Cfg::OUT_DT>(
                        o[mt][dt][r * 2] * inv, o[mt][dt][r * 2 + 1] * inv);
                }
                if (Cfg::LSE && lane % 4 == 0)
                    reinterpret_cast<float *>(p.lse)[(i64)i * p.num_qo_heads + h] =
                        lr > 0.f ? (m[mt][r] * c2 + log2_fast(lr)) * LN2 : neg_inf();
            }
        }
    }
}

/* The tile map of the element masks: one CTA per (query tile mb, key tile t), any thread
 * count. Class 0: no key visible under builtin and element masks (the tile is skipped);
 * 2: the element masks show every in-range key (only builtin masks remain); 1: mixed. A mask
 * snippet that reads qo_head or kv_head is evaluated for every head. */
template <class Cfg> __device__ void prefill_tile_map_kernel(const kiln_launch_params &p)
{
    constexpr int BM = prefill_layout<Cfg>::BM, BN = Cfg::BN;
    const int mb = blockIdx.x, t = blockIdx.y;
    const int L_Q = p.qo_len, L_KV = p.kv_len, off = L_KV - L_Q;
    const int heads = Cfg::MASK_USES_HEAD ? p.num_qo_heads : 1;
    bool any = false, all = true;
    for (int e = threadIdx.x; e < BM * BN; e += blockDim.x) {
        const int i = mb * BM + e / BN, j = t * BN + e % BN;
        if (i >= L_Q || j >= L_KV) continue;
        bool builtin = true;
        if (Cfg::CAUSAL) builtin = builtin && j <= i + off;
        if (Cfg::WINDOW) builtin = builtin && j >= i + off - p.window_left;
        for (int h = 0; h < heads; h++) {
            const bool vis = mask_data<Cfg>(p, i, j) && mask_user<Cfg>(p, i, j, h, h / Cfg::G);
            any = any || (vis && builtin);
            all = all && vis;
        }
    }
    any = __syncthreads_or(any);
    all = __syncthreads_and(all);
    if (threadIdx.x == 0)
        reinterpret_cast<unsigned char *>(p.tile_map)[(i64)mb * p.kv_tiles + t] = !any ? 0 : all ? 2 : 1;
}

} /* namespace kiln */

#endif /* KILN_PREFILL_CUH */
