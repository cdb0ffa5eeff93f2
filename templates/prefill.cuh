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
 * PACK (batches only; G divides 16): one CTA per (query tile, KV head) whose rows are the G
 * query heads of each query token, row R = token R / G, head hk * G + R % G, so every K/V tile
 * is loaded once for the whole group. This is kiln's tensor-core decode (a decode request is
 * one token, its G heads are G rows of the m16 MMA) and an option of batch prefill.
 *
 * Launch: grid (ceil(L_Q / BM), H), WARPS*32 threads, smem prefill_layout<Cfg>::BYTES
 * (PACK: grid (work items, H_KV)).
 * Shared tiles are [rows][D] with 16-byte chunks XOR-swizzled by (row & 7), so ldmatrix reads
 * of 8 rows at one column hit 8 different banks.
 *
 * Checked against the float64 CPU reference in tools/check.c (tests/test_gpu.c, kiln check).
 */
#ifndef KILN_PREFILL_CUH
#define KILN_PREFILL_CUH

#include "common/device.cuh"
#include "common/params.h"
#include "merge.cuh"

namespace kiln {

template <class Cfg> struct prefill_layout {
    static constexpr int D = Cfg::D, BN = Cfg::BN;
    static constexpr int BM = Cfg::WARPS * Cfg::MT * 16;
    static constexpr bool FP8 = Cfg::KV_DT >= 2;
    static constexpr int ES = FP8 ? 1 : 2;           /* bytes per stored K/V element */
    static constexpr int Q_BYTES = BM * D * 2;
    static constexpr int STAGE_TILE = BN * D * ES;   /* one K or V tile as loaded */
    static constexpr int TILE_BYTES = BN * D * 2;    /* one K or V tile as the MMAs read it */
    static constexpr int FREQ_BYTES = Cfg::ROPE ? D / 2 * 4 : 0;
    /* fp8: the pipeline holds fp8 tiles, converted into one 16-bit K and V tile per step */
    static constexpr int CONV_BYTES = FP8 ? 2 * TILE_BYTES : 0;
    /* paged: byte offsets of the K and V rows of the next key tile, filled a step ahead */
    static constexpr int TAB_BYTES = Cfg::KV == 2 ? 2 * BN * 8 : 0;
    /* a K/V tile load: each thread copies one 16-byte chunk of every STEP-th row */
    static constexpr int THREADS = Cfg::WARPS * 32, CHUNKS = D * ES / 16, STEP = THREADS / CHUNKS,
                         ITERS = BN / STEP;
    /* where row r's offset sits in a table: a thread's rows r0, r0 + STEP, ... are adjacent,
     * so it reads them with a few wide loads instead of one dependent load per row */
    static __device__ __forceinline__ int tab_at(int r) { return (r % STEP) * ITERS + r / STEP; }
    static constexpr int BYTES = Q_BYTES + 2 * Cfg::STAGES * STAGE_TILE + CONV_BYTES + FREQ_BYTES + TAB_BYTES;
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
            cp_async16_full(dst + (u32)(it * STEP * D * 2) + swz_delta<D>(r0, ch, it * STEP), src);
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

/* Issue cp.async copies of keys [row0, row0 + ROWS) of one request into a tile: 16-bit K/V
 * into the swizzled layout, fp8 into a plain [ROWS][D] byte tile; rows at or past row_hi are
 * zero-filled. KV 0 / 1: rows at base + j * stride (ragged bases are shifted to the request);
 * KV 2: rows at base + tab[row], the byte offsets page_rows::write put there for this tile. */
template <class Cfg, int ROWS, int THREADS>
__device__ __forceinline__ void load_kv_rows(unsigned char *tile, const unsigned char *g, i64 stride_n,
                                             const i64 *tab, int row0, int row_hi, int tid)
{
    using L = prefill_layout<Cfg>;
    constexpr int D = Cfg::D, ES = L::ES;
    if constexpr (Cfg::KV != 2 && !L::FP8) {
        load_rows<ROWS, D, THREADS>(reinterpret_cast<u16 *>(tile), reinterpret_cast<const u16 *>(g), stride_n,
                                    row0, row_hi, tid);
    } else {
        constexpr int CHUNKS = D * ES / 16;
        constexpr int STEP = THREADS / CHUNKS;
        static_assert(THREADS % CHUNKS == 0 && ROWS % STEP == 0, "load shape");
        const int r0 = tid / CHUNKS, ch = tid % CHUNKS;
        static_assert(Cfg::KV != 2 || (ROWS == Cfg::BN && STEP == L::STEP), "the table's row order");
        /* this thread's row offsets (tab_at order), read up front: the copies are volatile
         * asm, which no load moves across, so reads between them would each wait in turn */
        constexpr int IT = ROWS / STEP;
        i64 trow[Cfg::KV == 2 ? IT : 1];
        if constexpr (Cfg::KV == 2) {
            const i64 *t0 = tab + r0 * IT;
            if constexpr (IT % 2 == 0) {
#pragma unroll
                for (int it = 0; it < IT; it += 2) {
                    const longlong2 w = *reinterpret_cast<const longlong2 *>(t0 + it);
                    trow[it] = w.x;
                    trow[it + 1] = w.y;
                }
            } else {
#pragma unroll
                for (int it = 0; it < IT; it++) trow[it] = t0[it];
            }
        }
        if (row0 + ROWS <= row_hi) { /* interior tile: no bounds checks, no zero-fill form */
#pragma unroll
            for (int it = 0; it < ROWS / STEP; it++) {
                const int row = r0 + it * STEP;
                const i64 off = Cfg::KV == 2 ? trow[Cfg::KV == 2 ? it : 0] : (i64)(row0 + row) * stride_n * ES;
                const u32 dst = L::FP8 ? smem_addr(tile + row * D * ES + ch * 16)
                                       : smem_addr(reinterpret_cast<u16 *>(tile) + swz<D>(row, ch));
                cp_async16_full(dst, g + off + ch * 16);
            }
            return;
        }
#pragma unroll
        for (int it = 0; it < ROWS / STEP; it++) {
            const int row = r0 + it * STEP, j = row0 + row;
            const bool ok = j < row_hi;
            const i64 off = Cfg::KV == 2 ? trow[Cfg::KV == 2 ? it : 0] : (i64)j * stride_n * ES;
            const u32 dst = L::FP8 ? smem_addr(tile + row * D * ES + ch * 16)
                                   : smem_addr(reinterpret_cast<u16 *>(tile) + swz<D>(row, ch));
            cp_async16(dst, ok ? g + off + ch * 16 : g, ok ? 16 : 0);
        }
    }
}

/* Paged KV: the byte offsets of the K rows (tab[0..BN)) and V rows (tab[BN..2BN)) of a key
 * tile, in prefill_layout::tab_at order, one row per thread (RPT rows where BN exceeds the
 * block). The page ids come through registers a tile ahead: page_ids() issues their loads for a
 * later tile, write() turns the ids loaded one iteration earlier into offsets, so no warp waits
 * on a global load before its MMAs. Rows past the request read page 0 (they are zero-filled
 * anyway). */
template <class Cfg> struct page_rows {
    static constexpr int THREADS = Cfg::WARPS * WARP, BN = Cfg::BN;
    static constexpr int RPT = (BN + THREADS - 1) / THREADS;
    int page[RPT], in[RPT];

    __device__ __forceinline__ void page_ids(const kiln_launch_params &p, const int *pages, int t, int L_KV, int tid)
    {
#pragma unroll
        for (int u = 0; u < RPT; u++) {
            const int r = tid + u * THREADS, j = t * BN + r;
            const bool ok = r < BN && j < L_KV;
            const int pg = ok ? j / p.page_size : 0;
            page[u] = ok ? pages[pg] : 0;
            in[u] = ok ? j - pg * p.page_size : 0;
        }
    }

    __device__ __forceinline__ void write(i64 *tab, const kiln_launch_params &p, int tid) const
    {
        constexpr int ES = prefill_layout<Cfg>::ES;
#pragma unroll
        for (int u = 0; u < RPT; u++) {
            const int r = tid + u * THREADS;
            if (r < BN) {
                const int at = prefill_layout<Cfg>::tab_at(r);
                tab[at] = ((i64)page[u] * p.k_stride_page + (i64)in[u] * p.k_stride_n) * ES;
                tab[BN + at] = ((i64)page[u] * p.v_stride_page + (i64)in[u] * p.v_stride_n) * ES;
            }
        }
    }
};

/* fp8 and RoPE: turn the loaded K (and, fp8, V) tile of keys j0 .. j0 + BN into the 16-bit
 * swizzled tiles the MMAs read: dequantise (without the scale, folded elsewhere) and rotate K
 * at positions j + rope_off. Every thread takes 16-byte chunks (8 elements); a RoPE chunk of
 * the first half of D is rotated together with its partner chunk D/2 further. */
template <class Cfg, int THREADS>
__device__ __forceinline__ void prefill_transform(const unsigned char *kin, const unsigned char *vin, u16 *kout,
                                                  u16 *vout, const float *freq, int j0, int rope_off, int tid)
{
    using L = prefill_layout<Cfg>;
    constexpr int D = Cfg::D, BN = Cfg::BN, DT = Cfg::DT, C = D / 8;
    auto read8 = [&](const unsigned char *t, int row, int c, float (&f)[8]) {
        if constexpr (L::FP8) {
            const uint2 w = *reinterpret_cast<const uint2 *>(t + row * D + c * 8);
            fp8x4_to_f<Cfg::KV_DT>(w.x, f);
            fp8x4_to_f<Cfg::KV_DT>(w.y, f + 4);
        } else {
            const uint4 w = *reinterpret_cast<const uint4 *>(reinterpret_cast<const u16 *>(t) + swz<D>(row, c));
            unpack2<DT>(w.x, f[0], f[1]);
            unpack2<DT>(w.y, f[2], f[3]);
            unpack2<DT>(w.z, f[4], f[5]);
            unpack2<DT>(w.w, f[6], f[7]);
        }
    };
    auto write8 = [&](u16 *t, int row, int c, const float (&f)[8]) {
        uint4 w;
        w.x = pack2<DT>(f[0], f[1]);
        w.y = pack2<DT>(f[2], f[3]);
        w.z = pack2<DT>(f[4], f[5]);
        w.w = pack2<DT>(f[6], f[7]);
        *reinterpret_cast<uint4 *>(t + swz<D>(row, c)) = w;
    };
    if constexpr (Cfg::ROPE) {
        for (int e = tid; e < BN * (C / 2); e += THREADS) {
            const int row = e / (C / 2), c = e % (C / 2);
            float a[8], b[8];
            read8(kin, row, c, a);
            read8(kin, row, c + C / 2, b);
            const float pos = (float)(j0 + row + rope_off);
#pragma unroll
            for (int u = 0; u < 8; u++) rope_rotate(a[u], b[u], pos * freq[c * 8 + u]);
            write8(kout, row, c, a);
            write8(kout, row, c + C / 2, b);
        }
    } else {
        for (int e = tid; e < BN * C; e += THREADS) {
            float a[8];
            read8(kin, e / C, e % C, a);
            write8(kout, e / C, e % C, a);
        }
    }
    if constexpr (L::FP8) {
        for (int e = tid; e < BN * C; e += THREADS) {
            float a[8];
            read8(vin, e / C, e % C, a);
            write8(vout, e / C, e % C, a);
        }
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
    constexpr bool BATCH = Cfg::KV != 0, XFORM = L::FP8 || Cfg::ROPE;
    constexpr int ES = L::ES;
    u16 *q_s = reinterpret_cast<u16 *>(smem);
    unsigned char *k_in = smem + L::Q_BYTES;                  /* [STAGES] loaded K tiles */
    unsigned char *v_in = k_in + STAGES * L::STAGE_TILE;      /* [STAGES] loaded V tiles */
    u16 *kc_s = reinterpret_cast<u16 *>(v_in + STAGES * L::STAGE_TILE); /* fp8: converted K, V */
    u16 *vc_s = kc_s + BN * D;
    float *freq_s = reinterpret_cast<float *>(smem + L::Q_BYTES + 2 * STAGES * L::STAGE_TILE + L::CONV_BYTES);

    const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;
    /* PG rows per query token; h is the CTA's (PACK: first) query head */
    constexpr int PG = Cfg::PACK ? Cfg::G : 1;
    static_assert(!Cfg::PACK || (Cfg::KV != 0 && BM % Cfg::G == 0), "PACK: batches, G divides BM");
    const int hk = Cfg::PACK ? (int)blockIdx.y : (int)blockIdx.y / Cfg::G;
    const int h = Cfg::PACK ? hk * Cfg::G : (int)blockIdx.y;
    /* The query tile and key range of this CTA: a tile of the single request (heaviest causal
     * tiles first), or one planned work item. */
    int m_block, b = 0, L_Q, L_KV, q_start = 0, kv_start = 0, slot = -1, it_lo = 0, it_hi;
    mask_base mb{0, 0};
    if constexpr (BATCH) {
        if ((int)blockIdx.x >= num_items(p)) return; /* padding of a graph-sized grid */
        const work_item it = load_item(p, blockIdx.x);
        const work_req r = load_req(p, it.b);
        if constexpr (Cfg::MASK_DATA != 0) mb = load_req_mask(p, it.b);
        b = it.b;
        m_block = it.m;
        L_Q = r.qo_len;
        L_KV = r.kv_len;
        q_start = r.q_start;
        kv_start = r.kv_start;
        slot = it.slot;
        it_lo = it.kv_lo;
        it_hi = it.kv_hi;
    } else {
        m_block = gridDim.x - 1 - blockIdx.x;
        L_Q = p.qo_len;
        L_KV = p.kv_len;
        it_hi = L_KV;
    }
    const int off = L_KV - L_Q;
    const int m0 = m_block * BM;          /* first (packed) row of the tile */
    const int rows_hi = L_Q * PG;         /* (packed) rows of the request */
    const int tq0 = m0 / PG, tq1 = (m0 + BM - 1) / PG; /* first and last query token of the tile */

    const u16 *qg = reinterpret_cast<const u16 *>(p.q) + (i64)q_start * p.q_stride_n + (i64)h * p.q_stride_h;
    const unsigned char *kg = reinterpret_cast<const unsigned char *>(p.k) + (i64)hk * p.k_stride_h * ES;
    const unsigned char *vg = reinterpret_cast<const unsigned char *>(p.v) + (i64)hk * p.v_stride_h * ES;
    if constexpr (Cfg::KV == 1) { /* ragged: the request's rows start at kv_start */
        kg += (i64)kv_start * p.k_stride_n * ES;
        vg += (i64)kv_start * p.v_stride_n * ES;
    }
    const int rope_off = Cfg::ROPE && BATCH && p.rope_offsets ? reinterpret_cast<const int *>(p.rope_offsets)[b] : 0;
    if constexpr (Cfg::ROPE) {
        for (int d = tid; d < D / 2; d += THREADS) freq_s[d] = rope_freq(d, D, p.rope_rcp_scale, p.rope_log2_theta);
        /* the first barrier of the main loop orders these writes before any read */
    }

    int kv_hi = min(L_KV, it_hi), kv_lo = it_lo;
    const int key_hi = kv_hi; /* keys at or past it are masked (the item's end) */
    if (Cfg::CAUSAL) kv_hi = min(kv_hi, tq1 + 1 + off);
    if (Cfg::WINDOW) kv_lo = max(kv_lo, tq0 + off - p.window_left);
    kv_lo = max(kv_lo, 0);
    const int t_first = kv_lo / BN;
    const int t_end = kv_hi > kv_lo ? (kv_hi + BN - 1) / BN : t_first;
    /* With no logits transform the row max is taken on raw q.k (sm_scale > 0 keeps the order)
     * and c2 = sm_scale * log2(e) turns it into exp2 units inside one FFMA per element;
     * otherwise the transform already returns log2 units and c2 = 1. fp8 K: its scale joins
     * the raw product. */
    constexpr bool RAW = Cfg::LOGITS == 0 && !Cfg::HAS_LOGITS_EXPR;
    const float ksc = L::FP8 ? p.k_scale : 1.0f;
    const float c2 = RAW ? p.sm_scale * LOG2E * ksc : 1.0f;

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
    i64 *tab_s = reinterpret_cast<i64 *>(smem + L::Q_BYTES + 2 * STAGES * L::STAGE_TILE + L::CONV_BYTES +
                                         L::FREQ_BYTES);
    const int *pages = Cfg::KV == 2 ? reinterpret_cast<const int *>(p.kv_indices) + kv_start : nullptr;
    auto issue = [&](int st, int t) {
        load_kv_rows<Cfg, BN, THREADS>(k_in + st * L::STAGE_TILE, kg, p.k_stride_n, tab_s, t * BN, L_KV, tid);
        load_kv_rows<Cfg, BN, THREADS>(v_in + st * L::STAGE_TILE, vg, p.v_stride_n, tab_s + BN, t * BN, L_KV, tid);
    };

    /* pend[]: key tiles in flight, oldest first; t_next: the next one to load. */
    int pend[STAGES];
    int t_next = next_tile(t_first);
    if constexpr (Cfg::PACK) { /* row R: token R / G, head h + R % G */
        for (int e = tid; e < BM * (D / 8); e += THREADS) {
            const int r = e / (D / 8), ch = e % (D / 8), R = m0 + r;
            const bool ok = R < rows_hi;
            const u16 *src = qg + (i64)(R / PG) * p.q_stride_n + (i64)(R % PG) * p.q_stride_h + ch * 8;
            cp_async16(smem_addr(q_s + swz<D>(r, ch)), ok ? src : qg, ok ? 16 : 0);
        }
    } else {
        load_rows<BM, D, THREADS>(q_s, qg, p.q_stride_n, m0, L_Q, tid);
    }
    page_rows<Cfg> pr;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        pend[s] = t_next;
        if (t_next < t_end) {
            if constexpr (Cfg::KV == 2) { /* the prologue fills each table in place */
                pr.page_ids(p, pages, t_next, L_KV, tid);
                pr.write(tab_s, p, tid);
                __syncthreads();
            }
            issue(s, t_next);
            t_next = next_tile(t_next + 1);
            if constexpr (Cfg::KV == 2) __syncthreads();
        }
        cp_async_commit();
    }
    /* the first tile of the loop: its table; then the page ids of the tile after it, whose
     * table the first iteration writes (each iteration then loads the ids a tile further) */
    if constexpr (Cfg::KV == 2) {
        if (t_next < t_end) {
            pr.page_ids(p, pages, t_next, L_KV, tid);
            pr.write(tab_s, p, tid);
            pr.page_ids(p, pages, next_tile(t_next + 1), L_KV, tid);
        }
        __syncthreads();
    }

    const int wrow = warp * MT * 16; /* this warp's first row in the CTA tile */
    /* The query token and head of each of this lane's rows (mt, r), and its ALiBi slope. */
    int row_i[MT][2], row_h[MT][2];
    float slope[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int R = m0 + wrow + mt * 16 + lane / 4 + r * 8;
            row_i[mt][r] = R / PG;
            row_h[mt][r] = h + R % PG;
            slope[mt][r] = Cfg::LOGITS == 2 ? reinterpret_cast<const float *>(p.alibi)[row_h[mt][r]] : 0.f;
        }

    /* ldmatrix addresses. Every row a lane reads has (row & 7) == (lane & 7), and the 16-byte
     * chunk it reads is 8q + (2 rem + b) for a per-operand bit b, so the swizzled chunk is
     * 8q + ((2 rem + b) ^ (lane & 7)): four per-lane offsets per operand, the rest immediates. */
    constexpr int ROW_BYTES = D * 2;
    const int r7 = lane & 7;
    const int bq = lane >> 4, bk = (lane >> 3) & 1, bv = lane >> 4;
    const u32 q_addr = smem_addr(q_s) + (u32)((wrow + (lane & 15)) * ROW_BYTES);
    /* fp8 reads the converted tiles (one buffer), 16-bit the pipeline's stages */
    const u32 k_addr = smem_addr(L::FP8 ? (void *)kc_s : (void *)k_in) + (u32)(((lane >> 4) * 8 + r7) * ROW_BYTES);
    const u32 v_addr = smem_addr(L::FP8 ? (void *)vc_s : (void *)v_in) + (u32)((((lane >> 3) & 1) * 8 + r7) * ROW_BYTES);
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
            issue((idx + STAGES - 1) % STAGES, t_next);
            t_next = next_tile(t_next + 1);
        }
        cp_async_commit();
        const int t = pend[0];
        if (t >= t_end) break;
        cp_async_wait<STAGES - 1>();
        __syncthreads();
        /* every thread has issued from the table: refill it for the next iteration's tile (the
         * barrier at the end of this iteration publishes it) */
        if constexpr (Cfg::KV == 2)
            if (t_next < t_end) {
                pr.write(tab_s, p, tid); /* ids loaded an iteration ago */
                pr.page_ids(p, pages, next_tile(t_next + 1), L_KV, tid);
            }
        if constexpr (XFORM) {
            if (Cfg::ROPE && idx == 0) { /* rotate Q once, in place, at positions i + off */
                for (int e = tid; e < BM * (D / 16); e += THREADS) {
                    const int row = e / (D / 16), c = e % (D / 16);
                    u16 *ra = q_s + swz<D>(row, c), *rb = q_s + swz<D>(row, c + D / 16);
                    const float pos = (float)((m0 + row) / PG + off + rope_off);
#pragma unroll
                    for (int u = 0; u < 8; u += 2) {
                        float a0, a1, b0, b1;
                        unpack2<DT>(*reinterpret_cast<u32 *>(ra + u), a0, a1);
                        unpack2<DT>(*reinterpret_cast<u32 *>(rb + u), b0, b1);
                        rope_rotate(a0, b0, pos * freq_s[c * 8 + u]);
                        rope_rotate(a1, b1, pos * freq_s[c * 8 + u + 1]);
                        *reinterpret_cast<u32 *>(ra + u) = pack2<DT>(a0, a1);
                        *reinterpret_cast<u32 *>(rb + u) = pack2<DT>(b0, b1);
                    }
                }
            }
            const int st = idx % STAGES;
            u16 *kdst = L::FP8 ? kc_s : reinterpret_cast<u16 *>(k_in + st * L::STAGE_TILE);
            prefill_transform<Cfg, THREADS>(k_in + st * L::STAGE_TILE, v_in + st * L::STAGE_TILE, kdst, vc_s,
                                            freq_s, t * BN, rope_off, tid);
            __syncthreads();
        }

        if (Cfg::Q_IN_REGS && idx == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < KD; kk++)
                    ldmatrix_x4(q_addr + mt * 16 * ROW_BYTES + (kk >> 2) * 128 + xq[kk & 3], qf[mt][kk][0],
                                qf[mt][kk][1], qf[mt][kk][2], qf[mt][kk][3]);
        }
        const u32 ks = k_addr + (L::FP8 ? 0u : (u32)((idx % STAGES) * BN * ROW_BYTES));
        const u32 vs = v_addr + (L::FP8 ? 0u : (u32)((idx % STAGES) * BN * ROW_BYTES));

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
        const bool need_mask = elem || j0 + BN > key_hi || (Cfg::CAUSAL && j0 + BN - 1 > tq0 + off) ||
                               (Cfg::WINDOW && j0 < tq1 + off - p.window_left);
        /* The transform, then the mask in a pass of its own behind a warp-uniform branch:
         * interleaved with the row max, the compiler predicated the mask's compares and
         * selects into every tile (about 200 instructions per tile and warp) instead of only
         * the few tiles that need them. */
        if constexpr (!RAW) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int c = 0; c < 2; c++) {
                            const int j = j0 + nt * 8 + (lane % 4) * 2 + c;
                            float &x = s[mt][nt][r * 2 + c];
                            x = logit_full<Cfg>(x * ksc, p, slope[mt][r], row_i[mt][r], j, row_h[mt][r], hk, b,
                                                L_Q, L_KV);
                        }
        }
        if (need_mask) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int i = row_i[mt][r], hr = row_h[mt][r];
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int c = 0; c < 2; c++) {
                            const int j = j0 + nt * 8 + (lane % 4) * 2 + c;
                            bool vis = j < key_hi;
                            if (Cfg::CAUSAL) vis = vis && j <= i + off;
                            if (Cfg::WINDOW) vis = vis && j >= i + off - p.window_left;
                            if (ELEM && elem)
                                vis = vis && mask_data<Cfg>(p, mb, L_KV, i, j) &&
                                      mask_user<Cfg>(p, i, j, hr, hk, b, L_Q, L_KV);
                            if (!vis) s[mt][nt][r * 2 + c] = neg_inf();
                        }
                }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float rmax = neg_inf();
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) rmax = max_f(rmax, s[mt][nt][r * 2 + c]);
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

    /* Normalise and store: o rows directly, or a partial state of the item's slot. */
    u16 *og = reinterpret_cast<u16 *>(p.o) + (i64)q_start * p.o_stride_n;
    const float vsc = L::FP8 ? p.v_scale : 1.0f;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lr = l[mt][r];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            const float inv = lr > 0.f ? vsc / lr : 0.f;
            const int i = row_i[mt][r], hr = row_h[mt][r];
            const bool in = m0 + wrow + mt * 16 + lane / 4 + r * 8 < rows_hi;
            const float lse2 = lr > 0.f ? m[mt][r] * c2 + log2_fast(lr) : neg_inf();
            if (in && slot < 0) {
                u16 *orow = og + (i64)i * p.o_stride_n + (i64)hr * p.o_stride_h;
#pragma unroll
                for (int dt = 0; dt < DTN; dt++) {
                    const int d = dt * 8 + (lane % 4) * 2;
                    *reinterpret_cast<u32 *>(orow + d) = pack2<Cfg::OUT_DT>(
                        o[mt][dt][r * 2] * inv, o[mt][dt][r * 2 + 1] * inv);
                }
                if (Cfg::LSE && lane % 4 == 0)
                    reinterpret_cast<float *>(p.lse)[((i64)q_start + i) * p.num_qo_heads + hr] = lse2 * LN2;
            } else if (in) { /* slot rows are the tile's query tokens */
                const i64 at = ((i64)slot * p.num_qo_heads + hr) * p.slot_rows + (i - tq0);
                float *prow = reinterpret_cast<float *>(p.partial_o) + at * D;
#pragma unroll
                for (int dt = 0; dt < DTN; dt++) {
                    const int d = dt * 8 + (lane % 4) * 2;
                    float2 f2;
                    f2.x = o[mt][dt][r * 2] * inv;
                    f2.y = o[mt][dt][r * 2 + 1] * inv;
                    *reinterpret_cast<float2 *>(prow + d) = f2;
                }
                if (lane % 4 == 0) reinterpret_cast<float *>(p.partial_lse)[at] = lse2;
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
            const bool vis = mask_data<Cfg>(p, mask_base{0, 0}, L_KV, i, j) &&
                             mask_user<Cfg>(p, i, j, h, h / Cfg::G, 0, L_Q, L_KV);
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
