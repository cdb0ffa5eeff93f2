/*
 * simt_decode.cuh — decode on CUDA cores, split over the KV length: a single request (split-KV,
 * merged by decode_merge_kernel) or the items of a batch plan (kv=ragged / kv=paged, merged by
 * batch_merge_kernel, or with FUSED_MERGE by the last CTA of each merge task) whose group does
 * not run on tensor cores (mma_attention.cuh).
 *
 * Computes, for every query head h (one query token):
 *     o[h] = sum_j softmax_j(s(q[h], k[j])) v[j],   lse[h] = ln sum_j exp(s(q[h], k[j]))
 * with s the variant's logits (sm_scale, soft-cap or ALiBi, the logits snippet) and the key
 * range limited by the sliding window and the element masks. Query heads h = hk*G + g share
 * KV head hk (GQA).
 *
 * Shapes (elements, strides at run time; D contiguous):
 *   q [H, D]   k, v [L_KV, H_KV, D] (nhd) or [H_KV, L_KV, D] (hnd)   o [H, D]   lse [H] float
 *   batches: q / o [sum L_Q, H, D], k / v ragged rows or pages (params.h)
 *
 * Template parameters (Cfg): D in {64,128,256}; G query heads per KV head; GB heads per CTA
 * (divides G, <= 8); DT / OUT_DT in {F16, BF16}; KV_DT (also fp8); KV (kv_layout_id); LOGITS
 * (logits_id); WINDOW, LSE, ROPE in {0,1}; WARPS per CTA; STAGES of the per-warp cp.async
 * pipeline; TILE = KILN_DECODE_TILE; HAS_LOGITS_EXPR / HAS_MASK_EXPR with Cfg::logits_expr /
 * Cfg::mask_expr, the user snippets; MASK_DATA (mask_data_id; the query is row 0 of the mask);
 * FUSED_MERGE in {0,1} (batches only: the split CTAs merge their task's slots themselves);
 * PDL in {0,1} (sm_90+: the merge kernel is a programmatic dependent launch, merge.cuh).
 *
 * Launch: main grid (num_splits, H_KV, G/GB) (batches: (work items, H_KV, G/GB)), WARPS*32
 * threads, smem kiln_decode_smem_bytes (params.h). Each CTA covers keys [kv_begin +
 * split*kv_chunk, +kv_chunk) ∩ [0, L_KV). Every warp runs its own pipeline over tiles of TILE
 * keys (lane = key for q.k, lane = slice of D for p.v), keeps an online softmax state, and the
 * CTA combines its warps at the end. With one split the CTA writes o directly; otherwise it
 * writes a normalised partial (o, log2-sum-exp) that merge.cuh combines: in a kernel of its
 * own, or (FUSED_MERGE) here, by the task's last CTA to finish, for the GB heads of its head
 * scope blockIdx.y * gridDim.z + blockIdx.z (merge_task_if_last).
 *
 * Per CTA:  q [GB, D] -> per warp, per tile: s [GB, TILE] = q k^T -> p = softmax state update
 *           -> o [GB, D] += p v -> warps combined -> o [GB, D] (or a partial).
 *
 * Checked against the float64 CPU reference in tools/check.c (tests/test_gpu.c, kiln check).
 */
#ifndef KILN_SIMT_DECODE_CUH
#define KILN_SIMT_DECODE_CUH

#include "common/device.cuh"
#include "common/fragment.cuh"
#include "common/params.h"
#include "common/schedule.cuh"
#include "common/state_merge.cuh"
#include "common/variant.cuh"
#include "merge.cuh"

namespace kiln {

/* The shared-memory layout of one CTA: the contract's formulas (params.h), named. */
template <class Cfg> struct decode_layout {
    static constexpr int D = Cfg::D, GB = Cfg::GB, TILE = Cfg::TILE;
    static_assert(TILE == KILN_DECODE_TILE, "the host plans in tiles of KILN_DECODE_TILE keys");
    static constexpr bool FP8 = Cfg::KV_DT >= KV_E4M3;
    static constexpr int ES = FP8 ? 1 : 2;                            /* bytes per K/V element */
    static constexpr int KROW = kiln_decode_krow(D, ES);               /* padded K row, bytes (16-byte
                                                                          aligned for cp.async) */
    static constexpr int VROW = kiln_decode_vrow(D, ES);               /* V row, bytes */
    static constexpr int STAGE_BYTES = kiln_decode_stage_bytes(D, ES); /* one K + one V tile */
    static constexpr int Q_BYTES = kiln_decode_q_bytes(D, GB);         /* q as float [GB][D] */
    static constexpr int P_BYTES = kiln_decode_p_bytes(GB, Cfg::WARPS); /* p [WARPS][GB][TILE] */
    static constexpr int OFF_BYTES = kiln_decode_off_bytes(Cfg::WARPS, Cfg::KV == KV_PAGED); /* page rows */
    static constexpr int FREQ_BYTES = kiln_rope_freq_bytes(D, Cfg::ROPE);
    static constexpr int HEAD = kiln_decode_head_bytes(D, GB, Cfg::WARPS, Cfg::KV == KV_PAGED, Cfg::ROPE);
    static constexpr int BYTES = kiln_decode_smem_bytes(D, ES, GB, Cfg::WARPS, Cfg::STAGES, Cfg::KV == KV_PAGED, Cfg::ROPE);
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

/* N consecutive K/V elements (16-bit or fp8, as the variant stores them) into floats; fp8
 * values come out without their scale (see fp8x4_halves). */
template <class Cfg, int N> __device__ __forceinline__ void load_kv(const unsigned char *p, float (&f)[N])
{
    if constexpr (Cfg::KV_DT < KV_E4M3) {
        load_f<Cfg::KV_DT, N>(reinterpret_cast<const u16 *>(p), f);
    } else if constexpr (N == 8) {
        const uint2 w = *reinterpret_cast<const uint2 *>(p);
        fp8x4_to_f<Cfg::KV_DT>(w.x, f);
        fp8x4_to_f<Cfg::KV_DT>(w.y, f + 4);
    } else if constexpr (N == 4) {
        fp8x4_to_f<Cfg::KV_DT>(*reinterpret_cast<const u32 *>(p), f);
    } else {
        float t[4];
        fp8x4_to_f<Cfg::KV_DT>((u32) * reinterpret_cast<const u16 *>(p), t);
        f[0] = t[0];
        f[1] = t[1];
    }
}

/* Issue the cp.async copies of one K tile and one V tile (keys [t0, t0+TILE) ∩ [.., hi)) of
 * a request whose keys start at kv_start. Paged KV: each lane first looks up the page of one
 * row and leaves the row's byte offsets in the warp's table `offs`. */
template <class Cfg>
__device__ __forceinline__ void decode_load_tile(unsigned char *stage, const unsigned char *k,
                                                 const unsigned char *v, const kiln_launch_params &p,
                                                 int page, int t0, int hi, int lane, i64 *offs)
{
    using L = decode_layout<Cfg>;
    constexpr int CHUNKS = Cfg::D * L::ES / 16; /* 16-byte chunks per row */
    constexpr int ES = L::ES;
    unsigned char *ks_ = stage;
    unsigned char *vs_ = stage + Cfg::TILE * L::KROW;
    if constexpr (Cfg::KV == KV_PAGED) {
        const int j = t0 + lane;
        i64 ko = 0, vo = 0; /* rows past the end read nothing (zero-filled) at offset 0 */
        if (j < hi) { /* page: this lane's row's page id, loaded a step ahead (decode_row_page) */
            const i64 in = j % p.page_size;
            ko = ((i64)page * p.k_stride_page + in * p.k_stride_n) * ES;
            vo = ((i64)page * p.v_stride_page + in * p.v_stride_n) * ES;
        }
        offs[lane * 2] = ko;
        offs[lane * 2 + 1] = vo;
        __syncwarp();
    }
    /* paged: unrolled fully, the table reads are all hoisted ahead of the copies (spills) */
#pragma unroll(Cfg::KV == KV_PAGED ? 2 : Cfg::TILE * CHUNKS / WARP)
    for (int it = 0; it < Cfg::TILE * CHUNKS / WARP; it++) {
        int c = it * WARP + lane;
        int row = c / CHUNKS, col = c % CHUNKS;
        int j = t0 + row;
        bool ok = j < hi;
        const unsigned char *srck, *srcv;
        if constexpr (Cfg::KV == KV_PAGED) {
            const longlong2 o2 = *reinterpret_cast<const longlong2 *>(offs + row * 2);
            srck = k + o2.x + col * 16;
            srcv = v + o2.y + col * 16;
        } else if constexpr (ES == 2) { /* element arithmetic: byte offsets from a register copy of
                                            the strides cost ~50 registers (measured) */
            srck = ok ? reinterpret_cast<const unsigned char *>(reinterpret_cast<const u16 *>(k) + (i64)j * p.k_stride_n + col * 8) : k;
            srcv = ok ? reinterpret_cast<const unsigned char *>(reinterpret_cast<const u16 *>(v) + (i64)j * p.v_stride_n + col * 8) : v;
        } else {
            srck = ok ? k + (i64)j * p.k_stride_n + col * 16 : k;
            srcv = ok ? v + (i64)j * p.v_stride_n + col * 16 : v;
        }
        cp_async16(smem_addr(ks_ + row * L::KROW + col * 16), srck, ok ? 16 : 0);
        cp_async16(smem_addr(vs_ + row * L::VROW + col * 16), srcv, ok ? 16 : 0);
    }
    if constexpr (Cfg::KV == KV_PAGED) __syncwarp(); /* the table is rewritten by the next call */
}

/* Paged KV: the page id of key t0 + lane (0 past hi), loaded one tile before it is needed so
 * the index load's latency hides behind a tile of compute. */
__device__ __forceinline__ int decode_row_page(const kiln_launch_params &p, const int *pages, int t0, int hi,
                                               int lane)
{
    const int j = t0 + lane;
    return pages && j < hi ? pages[j / p.page_size] : 0;
}

/* What one CTA covers: a split of the single request, or one planned work item. */
struct decode_work {
    int b, L_KV, lo, hi, slot, task, q_row, kv_start;
    mask_base mb;
};

template <class Cfg> __device__ __forceinline__ decode_work decode_load_work(const kiln_launch_params &p)
{
    decode_work w{0, 0, 0, 0, 0, -1, 0, 0, mask_base{0, 0}};
    if constexpr (Cfg::KV != KV_CONTIGUOUS) {
        const work_item it = load_item(p, blockIdx.x);
        if constexpr (Cfg::MASK_DATA != MASK_DATA_NONE) w.mb = load_req_mask(p, it.b);
        w.b = it.b;
        w.L_KV = it.kv_len;
        w.q_row = it.q_start;
        w.kv_start = it.kv_start;
        w.slot = it.slot;
        w.task = it.task;
        w.lo = it.kv_lo;
        w.hi = min(w.L_KV, it.kv_hi);
        if (Cfg::WINDOW) w.lo = max(w.lo, w.L_KV - 1 - p.window_left);
        if (w.hi < w.lo) w.hi = w.lo;
    } else {
        w.L_KV = p.kv_len;
        w.lo = p.kv_begin + blockIdx.x * p.kv_chunk;
        w.hi = min(w.L_KV, w.lo + p.kv_chunk);
        w.slot = p.num_splits == 1 ? -1 : (int)blockIdx.x;
    }
    return w;
}

/* The CTA's GB query heads into shared memory as floats, RoPE-rotated at the query's position
 * (and the RoPE frequencies into freq_s). */
template <class Cfg>
__device__ __forceinline__ void decode_load_q(float *q_s, float *freq_s, const u16 *q, const kiln_launch_params &p,
                                              int hk, int g0, int pos0, int tid)
{
    constexpr int D = Cfg::D, GB = Cfg::GB, THREADS = Cfg::WARPS * WARP;
    if constexpr (Cfg::ROPE) {
        for (int d = tid; d < D / 2; d += THREADS) freq_s[d] = rope_freq(d, D, p.rope_rcp_scale, p.rope_log2_theta);
        __syncthreads();
        const float pos = (float)pos0;
        for (int i = tid; i < GB * D / 2; i += THREADS) {
            const int g = i / (D / 2), d = i % (D / 2);
            const u16 *qh = q + (i64)(hk * Cfg::G + g0 + g) * p.q_stride_h;
            float x0 = to_float<Cfg::DT>(qh[d]), x1 = to_float<Cfg::DT>(qh[d + D / 2]);
            rope_rotate(x0, x1, pos * freq_s[d]);
            q_s[g * D + d] = x0;
            q_s[g * D + d + D / 2] = x1;
        }
    } else {
        for (int i = tid; i < GB * D; i += THREADS) {
            int g = i / D, d = i % D;
            q_s[i] = to_float<Cfg::DT>(q[(i64)(hk * Cfg::G + g0 + g) * p.q_stride_h + d]);
        }
    }
}

/* One warp's online softmax state of its GB heads: m (warp-uniform, log2 units), l (per lane,
 * summed at the end), o (lane's D / 32 elements). */
template <class Cfg> struct decode_state {
    static constexpr int GB = Cfg::GB, DPL = Cfg::D / WARP;
    float m[GB], l[GB], o[GB][DPL];

    __device__ __forceinline__ void init()
    {
#pragma unroll
        for (int g = 0; g < GB; g++) {
            m[g] = neg_inf();
            l[g] = 0.f;
#pragma unroll
            for (int i = 0; i < DPL; i++) o[g][i] = 0.f;
        }
    }
};

/* S = q k^T: acc[g] = q[g] . k[lane's key] (raw; fp8 without k_scale), K rotated at key j. */
template <class Cfg>
__device__ __forceinline__ void decode_qk(float (&acc)[Cfg::GB], const unsigned char *ks_, const float *q_s,
                                          const float *freq_s, int j, int rope_off, int lane)
{
    using L = decode_layout<Cfg>;
    constexpr int D = Cfg::D, GB = Cfg::GB, ES = L::ES;
#pragma unroll
    for (int g = 0; g < GB; g++) acc[g] = 0.f;
    if constexpr (Cfg::ROPE) {
        const float pos = (float)(j + rope_off);
#pragma unroll 1
        for (int c = 0; c < D / 16; c++) {
            float k0[8], k1[8];
            load_kv<Cfg, 8>(ks_ + lane * L::KROW + c * 8 * ES, k0);
            load_kv<Cfg, 8>(ks_ + lane * L::KROW + (c * 8 + D / 2) * ES, k1);
#pragma unroll
            for (int e = 0; e < 8; e++) rope_rotate(k0[e], k1[e], pos * freq_s[c * 8 + e]);
#pragma unroll
            for (int g = 0; g < GB; g++) {
                const float *qa = q_s + g * D + c * 8, *qb = qa + D / 2;
#pragma unroll
                for (int e = 0; e < 8; e++) acc[g] += qa[e] * k0[e] + qb[e] * k1[e];
            }
        }
    } else if constexpr (L::FP8) {
        /* 16 keys' bytes per read: a quarter warp then covers all 32 banks once */
#pragma unroll 2
        for (int c = 0; c < D / 16; c++) {
            const uint4 w = *reinterpret_cast<const uint4 *>(ks_ + lane * L::KROW + c * 16);
            float kf[16];
            fp8x4_to_f<Cfg::KV_DT>(w.x, kf);
            fp8x4_to_f<Cfg::KV_DT>(w.y, kf + 4);
            fp8x4_to_f<Cfg::KV_DT>(w.z, kf + 8);
            fp8x4_to_f<Cfg::KV_DT>(w.w, kf + 12);
#pragma unroll
            for (int g = 0; g < GB; g++) {
                const float *qa = q_s + g * D + c * 16;
#pragma unroll
                for (int e = 0; e < 16; e++) acc[g] += qa[e] * kf[e];
            }
        }
    } else {
#pragma unroll 4
        for (int c = 0; c < D / 8; c++) {
            float kf[8];
            load_kv<Cfg, 8>(ks_ + lane * L::KROW + c * 8 * ES, kf);
#pragma unroll
            for (int g = 0; g < GB; g++) {
                const float4 qa = *reinterpret_cast<const float4 *>(q_s + g * D + c * 8);
                const float4 qb = *reinterpret_cast<const float4 *>(q_s + g * D + c * 8 + 4);
                acc[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] +
                          qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
            }
        }
    }
}

/* Logits and mask, then the online softmax: s = the logit of key j (-inf where hidden), the
 * state rescaled to the new row max, p = exp2(s - m) into the warp's p row pw. */
template <class Cfg>
__device__ __forceinline__ void decode_softmax(decode_state<Cfg> &st, const float (&acc)[Cfg::GB], float *pw,
                                               const kiln_launch_params &p, const decode_work &w,
                                               const float (&slope)[Cfg::GB], int hk, int g0, int j, int lane)
{
    constexpr int GB = Cfg::GB, TILE = Cfg::TILE;
    const bool valid = j < w.hi;
#pragma unroll
    for (int g = 0; g < GB; g++) {
        const int h = hk * Cfg::G + g0 + g;
        const int iq = 0; /* the one query row */
        const bool vis = valid && mask_data<Cfg>(p, w.mb, w.L_KV, iq, j) &&
                         mask_user<Cfg>(p, iq, j, h, hk, w.b, 1, w.L_KV);
        const float qk = decode_layout<Cfg>::FP8 ? acc[g] * p.k_scale : acc[g];
        float s = vis ? logit_full<Cfg>(qk, p, slope[g], iq, j, h, hk, w.b, 1, w.L_KV) : neg_inf();
        float m_new = max_f(st.m[g], warp_max(s));
        /* a tile the mask hides entirely leaves m at -inf: keep exp2 finite */
        float m_use = m_new == neg_inf() ? 0.f : m_new;
        float scale = exp2_fast(st.m[g] - m_use);
        float pj = exp2_fast(s - m_use);
        st.m[g] = m_new;
        st.l[g] = st.l[g] * scale + pj;
#pragma unroll
        for (int e = 0; e < decode_state<Cfg>::DPL; e++) st.o[g][e] *= scale;
        pw[g * TILE + lane] = pj;
    }
}

/* O += P V: lane owns D/32 consecutive elements of every value row. */
template <class Cfg>
__device__ __forceinline__ void decode_pv(decode_state<Cfg> &st, const unsigned char *vs_, const float *pw, int lane)
{
    using L = decode_layout<Cfg>;
    constexpr int GB = Cfg::GB, TILE = Cfg::TILE, DPL = decode_state<Cfg>::DPL, ES = L::ES;
#pragma unroll 2
    for (int t = 0; t < TILE; t += 4) {
        float vf[4][DPL];
#pragma unroll
        for (int u = 0; u < 4; u++) load_kv<Cfg, DPL>(vs_ + (t + u) * L::VROW + lane * DPL * ES, vf[u]);
#pragma unroll
        for (int g = 0; g < GB; g++) {
            const float4 pp = *reinterpret_cast<const float4 *>(pw + g * TILE + t);
#pragma unroll
            for (int e = 0; e < DPL; e++)
                st.o[g][e] += pp.x * vf[0][e] + pp.y * vf[1][e] + pp.z * vf[2][e] + pp.w * vf[3][e];
        }
    }
}

/* The warps' states into the (now free) KV region: cm, cl [WARPS][GB], co [WARPS][GB][D]. */
template <class Cfg>
__device__ __forceinline__ void decode_publish(const decode_state<Cfg> &st, float *cm, int warp, int lane)
{
    constexpr int GB = Cfg::GB, WARPS = Cfg::WARPS, D = Cfg::D, DPL = decode_state<Cfg>::DPL;
    float *cl = cm + WARPS * GB;
    float *co = cl + WARPS * GB;
#pragma unroll
    for (int g = 0; g < GB; g++) {
        float lsum = warp_sum(st.l[g]);
        if (lane == 0) {
            cm[warp * GB + g] = st.m[g];
            cl[warp * GB + g] = lsum;
        }
#pragma unroll
        for (int e = 0; e < DPL; e++) co[(warp * GB + g) * D + lane * DPL + e] = st.o[g][e];
    }
}

/* Merge the warps' states and store: o and lse, or the split's partial state. */
template <class Cfg>
__device__ __forceinline__ void decode_store(const float *cm, const kiln_launch_params &p, const decode_work &w,
                                             int hk, int g0, int tid)
{
    constexpr int GB = Cfg::GB, WARPS = Cfg::WARPS, D = Cfg::D;
    const float *cl = cm + WARPS * GB;
    const float *co = cl + WARPS * GB;
    const float vsc = p.v_scale; /* fp8: with its unit; 16-bit: FlashInfer's v_scale, 1 by default */
    for (int i = tid; i < GB * D; i += WARPS * WARP) {
        const int g = i / D, d = i % D, h = hk * Cfg::G + g0 + g;
        float M = neg_inf();
#pragma unroll
        for (int u = 0; u < WARPS; u++) M = max_f(M, cm[u * GB + g]);
        state_merge acc(M);
#pragma unroll
        for (int u = 0; u < WARPS; u++) {
            const float f = acc.weight(cm[u * GB + g]);
            acc.add(f, cl[u * GB + g], co[(u * GB + g) * D + d]);
        }
        const float out = acc.out(vsc);
        const float lse2 = acc.lse2(); /* log2 units */
        if (w.slot < 0) {
            reinterpret_cast<u16 *>(p.o)[(i64)w.q_row * p.o_stride_n + (i64)h * p.o_stride_h + d] =
                from_float<Cfg::OUT_DT>(out);
            if (Cfg::LSE && d == 0)
                reinterpret_cast<float *>(p.lse)[(i64)w.q_row * p.num_qo_heads + h] = lse2 * p.lse_unit;
        } else {
            reinterpret_cast<float *>(p.partial_o)[((i64)w.slot * p.num_qo_heads + h) * D + d] = out;
            if (d == 0) reinterpret_cast<float *>(p.partial_lse)[(i64)w.slot * p.num_qo_heads + h] = lse2;
        }
    }
}

template <class Cfg> __device__ void simt_decode_kernel(const kiln_launch_params &p)
{
    using L = decode_layout<Cfg>;
    constexpr int GB = Cfg::GB, TILE = Cfg::TILE, WARPS = Cfg::WARPS, STAGES = Cfg::STAGES, ES = L::ES;
    constexpr bool BATCH = Cfg::KV != KV_CONTIGUOUS;
    static_assert(TILE == WARP, "one key per lane");

    extern __shared__ __align__(16) unsigned char smem[];
    float *q_s = reinterpret_cast<float *>(smem);                 /* [GB][D] */
    float *p_s = reinterpret_cast<float *>(smem + L::Q_BYTES);    /* [WARPS][GB][TILE] */
    i64 *off_s = reinterpret_cast<i64 *>(smem + L::Q_BYTES + L::P_BYTES); /* [WARPS][TILE][2] */
    float *freq_s = reinterpret_cast<float *>(smem + L::Q_BYTES + L::P_BYTES + L::OFF_BYTES);
    unsigned char *region = smem + L::HEAD;

    const int hk = blockIdx.y, g0 = blockIdx.z * GB;
    const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;

    let_merge_launch<Cfg>(); /* first thing: merge.cuh says why */
    if (BATCH && (int)blockIdx.x >= num_items(p)) return; /* padding of a graph-sized grid */
    const decode_work w = decode_load_work<Cfg>(p);
    const int lo = w.lo, hi = w.hi;

    const u16 *q = reinterpret_cast<const u16 *>(p.q) + (i64)w.q_row * p.q_stride_n;
    const unsigned char *k = reinterpret_cast<const unsigned char *>(p.k) + (i64)hk * p.k_stride_h * ES;
    const unsigned char *v = reinterpret_cast<const unsigned char *>(p.v) + (i64)hk * p.v_stride_h * ES;
    if (Cfg::KV == KV_RAGGED) { /* ragged: start at the request's first row */
        k += (i64)w.kv_start * p.k_stride_n * ES;
        v += (i64)w.kv_start * p.v_stride_n * ES;
    }
    const int *pages = Cfg::KV == KV_PAGED ? reinterpret_cast<const int *>(p.kv_indices) + w.kv_start : nullptr;
    const int rope_off = Cfg::ROPE && BATCH && p.rope_offsets
                             ? reinterpret_cast<const int *>(p.rope_offsets)[w.b] : 0;

    decode_load_q<Cfg>(q_s, freq_s, q, p, hk, g0, w.L_KV - 1 + rope_off, tid);
    float slope[GB];
#pragma unroll
    for (int g = 0; g < GB; g++) slope[g] = alibi_slope<Cfg>(p, hk * Cfg::G + g0 + g);
    __syncthreads();

    decode_state<Cfg> st;
    st.init();

    /* this warp's tiles: warp, warp + WARPS, ... of the CTA's range, through its own stages */
    const int n_tiles = (hi - lo + TILE - 1) / TILE;
    const int n_mine = n_tiles > warp ? (n_tiles - warp + WARPS - 1) / WARPS : 0;
    unsigned char *stages = region + warp * STAGES * L::STAGE_BYTES;
    float *pw = p_s + warp * GB * TILE;
    i64 *offs = off_s + warp * TILE * 2;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < n_mine) {
            const int t0 = lo + (warp + (s) * WARPS) * TILE;
            decode_load_tile<Cfg>(stages + s * L::STAGE_BYTES, k, v, p,
                                  Cfg::KV == KV_PAGED ? decode_row_page(p, pages, t0, hi, lane) : 0, t0, hi, lane, offs);
        }
        cp_async_commit();
    }
    int page_ahead = Cfg::KV == KV_PAGED ? decode_row_page(p, pages, lo + (warp + (STAGES - 1) * WARPS) * TILE, hi, lane) : 0;

    for (int i = 0; i < n_mine; i++) {
        /* issue the tile STAGES - 1 ahead, wait for this one */
        const int ahead = i + STAGES - 1;
        if (ahead < n_mine)
            decode_load_tile<Cfg>(stages + (ahead % STAGES) * L::STAGE_BYTES, k, v, p, page_ahead, lo + (warp + (ahead) * WARPS) * TILE,
                                  hi, lane, offs);
        cp_async_commit();
        if constexpr (Cfg::KV == KV_PAGED) page_ahead = decode_row_page(p, pages, lo + (warp + (ahead + 1) * WARPS) * TILE, hi, lane);
        cp_async_wait<STAGES - 1>();
        __syncwarp();

        const unsigned char *ks_ = stages + (i % STAGES) * L::STAGE_BYTES;
        const unsigned char *vs_ = ks_ + TILE * L::KROW;
        const int j = lo + (warp + (i) * WARPS) * TILE + lane;

        float acc[GB];
        decode_qk<Cfg>(acc, ks_, q_s, freq_s, j, rope_off, lane);
        decode_softmax<Cfg>(st, acc, pw, p, w, slope, hk, g0, j, lane);
        __syncwarp();
        decode_pv<Cfg>(st, vs_, pw, lane);
        __syncwarp();
    }
    cp_async_wait<0>();
    __syncthreads(); /* every warp is done with the KV region: reuse it to combine */

    float *cm = reinterpret_cast<float *>(region);
    decode_publish<Cfg>(st, cm, warp, lane);
    __syncthreads();
    decode_store<Cfg>(cm, p, w, hk, g0, tid);
    if constexpr (BATCH && Cfg::FUSED_MERGE)
        if (w.slot >= 0) merge_task_if_last<Cfg, GB, Cfg::WARPS>(p, w.task, hk * Cfg::G + g0);
}

} /* namespace kiln */

#endif /* KILN_SIMT_DECODE_CUH */
