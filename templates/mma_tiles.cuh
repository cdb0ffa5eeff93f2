/*
 * mma_tiles.cuh — the shared-memory tiles of the tensor-core kernels (mma_attention.cuh): the
 * layout of a CTA's shared memory, the XOR swizzle of [rows][D] tiles, the cp.async loads of
 * Q and K/V rows (contiguous, ragged or through the page table), the paged row-offset table,
 * and the in-shared-memory transforms (fp8 widening, RoPE of K and of Q).
 *
 * Shared tiles are [rows][D] with 16-byte chunks XOR-swizzled by (row & 7), so ldmatrix reads
 * of 8 rows at one column hit 8 different banks.
 */
#ifndef KILN_MMA_TILES_CUH
#define KILN_MMA_TILES_CUH

#include "common/device.cuh"
#include "common/hopper.cuh"
#include "common/params.h"

namespace kiln {

/* The shared-memory layout of one CTA: the contract's formulas (params.h), named. */
template <class Cfg> struct prefill_layout {
    static constexpr int D = Cfg::D, BN = Cfg::BN;
    static constexpr int BM = Cfg::WARPS * Cfg::MT * 16;
    static constexpr bool FP8 = Cfg::KV_DT >= KV_E4M3;
    static constexpr bool PAGED = Cfg::KV == KV_PAGED;
    static constexpr int ES = FP8 ? 1 : 2;                           /* bytes per stored K/V element */
    /* the mma.sync family's packed rows (its layout's fp8 tiles and conversion buffer follow
     * them; the wgmma family's packed rows change only which rows a job's Q holds) */
    static constexpr bool MMA_PACK = Cfg::PACK && !Cfg::WGMMA;
    /* fp8 read by the MMAs from the loaded tiles (mma_attention.cuh, "fp8 in registers") */
    static constexpr bool F8R = kiln_prefill_fp8_in_regs(ES, MMA_PACK, Cfg::ROPE);
    /* fp8 K/V widened exactly (fp8x4_f16: F8R's registers, the wgmma producer's tiles), and so
     * f8_pair_unit times the converted tiles' values, which their scales give back */
    static constexpr bool F8P = F8R || (FP8 && Cfg::WGMMA);
    static constexpr int Q_BYTES = kiln_prefill_q_bytes(D, BM);
    /* BULK (KILN_TUNE bulk=1): K/V rows copied whole by cp.async.bulk into padded rows
     * (load_kv_rows_bulk), each stage completing an mbarrier */
    static constexpr int BULK = Cfg::BULK; /* 2: pages by TMA boxes (kv_pipeline::issue_boxes) */
    static constexpr int KV_ROW = kiln_prefill_kv_row_bytes(D, ES, BULK); /* a K/V row as loaded */
    static constexpr int STAGE_TILE = kiln_prefill_stage_tile(D, ES, BN, BULK); /* one K or V tile as loaded */
    static constexpr int TILE_BYTES = BN * D * 2;                    /* one K or V tile as the MMAs read it */
    static constexpr int FREQ_BYTES = kiln_rope_freq_bytes(D, Cfg::ROPE);
    /* fp8 not in registers: the pipeline's fp8 tiles converted into one 16-bit K and V tile
     * per step */
    static constexpr int CONV_BYTES = kiln_prefill_conv_bytes(D, ES, BN, MMA_PACK, Cfg::ROPE);
    /* paged: byte offsets of the K and V rows of the next key tile, filled a step ahead */
    static constexpr int TAB_BYTES = kiln_prefill_tab_bytes(BN, PAGED, BULK);
    /* where each region starts */
    static constexpr int K_AT = Q_BYTES, V_AT = K_AT + Cfg::STAGES * STAGE_TILE, CONV_AT = V_AT + Cfg::STAGES * STAGE_TILE,
                         FREQ_AT = CONV_AT + CONV_BYTES, TAB_AT = FREQ_AT + FREQ_BYTES,
                         BAR_AT = TAB_AT + TAB_BYTES;
    /* a K/V tile load: each thread copies one 16-byte chunk of every STEP-th row */
    static constexpr int THREADS = Cfg::WARPS * 32, CHUNKS = D * ES / 16, STEP = THREADS / CHUNKS,
                         ITERS = BN / STEP;
    /* where row r's offset sits in a table: a thread's rows r0, r0 + STEP, ... are adjacent,
     * so it reads them with a few wide loads instead of one dependent load per row */
    static __device__ __forceinline__ int tab_at(int r) { return (r % STEP) * ITERS + r / STEP; }
    static constexpr int BYTES =
        kiln_prefill_smem_bytes(D, ES, BM, BN, Cfg::STAGES, PAGED, Cfg::ROPE, MMA_PACK, BULK);
    static_assert(BYTES == BAR_AT + kiln_prefill_bar_bytes(Cfg::STAGES, BULK), "the regions fill the layout");
    static_assert(!BULK || (BAR_AT % 8 == 0 && KV_ROW % 16 == 0), "mbarriers 8-byte and rows 16-byte aligned");
    /* KSPLIT > 1 (the tensor-core decode's key split, mma_attention.cuh): each of the CTA's
     * KSPLIT pipelines (THREADS threads each) owns a layout of its own, REGION bytes apart */
    static constexpr int REGION = kiln_ksplit_region(BYTES, BULK);
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
 * into the swizzled layout, fp8 into a [ROWS][D] byte tile (plain, or chunk-swizzled where the
 * MMAs read it in registers, kiln_f8_swz); rows at or past row_hi are
 * zero-filled. Contiguous / ragged: rows at base + j * stride (ragged bases are shifted to the
 * request); paged: rows at base + tab[row], the byte offsets page_rows::write put there for
 * this tile. */
template <class Cfg, int ROWS, int THREADS>
__device__ __forceinline__ void load_kv_rows(unsigned char *tile, const unsigned char *g, i64 stride_n,
                                             const i64 *tab, int row0, int row_hi, int tid)
{
    using L = prefill_layout<Cfg>;
    constexpr int D = Cfg::D, ES = L::ES;
    if constexpr (Cfg::KV != KV_PAGED && !L::FP8 && L::BULK != 2) {
        load_rows<ROWS, D, THREADS>(reinterpret_cast<u16 *>(tile), reinterpret_cast<const u16 *>(g), stride_n,
                                    row0, row_hi, tid);
    } else {
        constexpr int CHUNKS = D * ES / 16;
        constexpr int STEP = THREADS / CHUNKS;
        static_assert(THREADS % CHUNKS == 0 && ROWS % STEP == 0, "load shape");
        const int r0 = tid / CHUNKS, ch = tid % CHUNKS;
        auto f8_chunk = [&](int row) { return L::F8R ? ch ^ kiln_f8_swz(D, row) : ch; };
        /* where this thread's chunk of a row lands: fp8 rows, the swizzled [rows][D] tile, or
         * bulk=2's box layout */
        auto chunk_dst = [&](int row) {
            if constexpr (L::FP8) return smem_addr(tile + row * D * ES + f8_chunk(row) * 16);
            else if constexpr (L::BULK == 2) return smem_addr(tile + kiln_kv_box_at(ROWS, row, ch));
            else return smem_addr(reinterpret_cast<u16 *>(tile) + swz<D>(row, ch));
        };
        static_assert(Cfg::KV != KV_PAGED || (ROWS == Cfg::BN && STEP == L::STEP), "the table's row order");
        /* this thread's row offsets (tab_at order), read up front: the copies are volatile
         * asm, which no load moves across, so reads between them would each wait in turn */
        constexpr int IT = ROWS / STEP;
        i64 trow[Cfg::KV == KV_PAGED ? IT : 1];
        if constexpr (Cfg::KV == KV_PAGED) {
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
                const i64 off = Cfg::KV == KV_PAGED ? trow[Cfg::KV == KV_PAGED ? it : 0] : (i64)(row0 + row) * stride_n * ES;
                const u32 dst = chunk_dst(row);
                cp_async16_full(dst, g + off + ch * 16);
            }
            return;
        }
#pragma unroll
        for (int it = 0; it < ROWS / STEP; it++) {
            const int row = r0 + it * STEP, j = row0 + row;
            const bool ok = j < row_hi;
            const i64 off = Cfg::KV == KV_PAGED ? trow[Cfg::KV == KV_PAGED ? it : 0] : (i64)j * stride_n * ES;
            const u32 dst = chunk_dst(row);
            cp_async16(dst, ok ? g + off + ch * 16 : g, ok ? 16 : 0);
        }
    }
}

/* BULK (KILN_TUNE bulk=1, sm_90): keys [row0, row0 + ROWS) of one request's 16-bit K or V into a
 * stage of padded rows (prefill_layout::KV_ROW bytes apart, not swizzled), one cp.async.bulk a
 * row, issued by the row's thread, completing its bytes on the stage's mbarrier `bar` (the
 * caller expects the copied rows' bytes). Rows at or past row_hi are zeroed by plain stores
 * instead, fenced for the async proxy that may copy into them later. Contiguous / ragged rows
 * at base + j * stride, paged at base + tab[tab_at(row)], as load_kv_rows. */
template <class Cfg, int ROWS, int THREADS>
__device__ __forceinline__ void load_kv_rows_bulk(unsigned char *tile, const unsigned char *g, i64 stride_n,
                                                  const i64 *tab, int row0, int row_hi, u32 bar, int tid)
{
    using L = prefill_layout<Cfg>;
    constexpr int RB = Cfg::D * L::ES; /* bytes a row copies */
    static_assert(L::BULK && !L::FP8 && THREADS >= ROWS && RB % 16 == 0, "bulk: a 16-bit row a thread");
    if (tid >= ROWS) return;
    const int j = row0 + tid;
    const u32 dst = smem_addr(tile + tid * L::KV_ROW);
    if (j < row_hi) {
        const i64 off = Cfg::KV == KV_PAGED ? tab[L::tab_at(tid)] : (i64)j * stride_n * L::ES;
        bulk_load(dst, g + off, RB, bar);
    } else {
        const uint4 zero = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int c = 0; c < RB / 16; c++) sts128(dst + c * 16, zero);
        fence_proxy_async();
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
                /* bulk=2: the row's page and row in it, by row (the boxes read their first's) */
                if constexpr (prefill_layout<Cfg>::BULK == 2)
                    reinterpret_cast<int2 *>(tab + 2 * BN)[r] = make_int2(page[u], in[u]);
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

/* Q rows [m0, m0 + BM) of the CTA into its swizzled tile. PACK: row R is token R / G, head
 * h + R % G (qg points at head h); otherwise token m0 + r of head h. */
template <class Cfg>
__device__ __forceinline__ void load_q_tile(u16 *q_s, const u16 *qg, const kiln_launch_params &p, int m0, int L_Q,
                                            int tid)
{
    using L = prefill_layout<Cfg>;
    constexpr int D = Cfg::D, BM = L::BM, THREADS = L::THREADS;
    if constexpr (Cfg::PACK) {
        constexpr int PG = Cfg::G;
        const int rows_hi = L_Q * PG;
        for (int e = tid; e < BM * (D / 8); e += THREADS) {
            const int r = e / (D / 8), ch = e % (D / 8), R = m0 + r;
            const bool ok = R < rows_hi;
            const u16 *src = qg + (i64)(R / PG) * p.q_stride_n + (i64)(R % PG) * p.q_stride_h + ch * 8;
            cp_async16(smem_addr(q_s + swz<D>(r, ch)), ok ? src : qg, ok ? 16 : 0);
        }
    } else {
        load_rows<BM, D, THREADS>(q_s, qg, p.q_stride_n, m0, L_Q, tid);
    }
}

/* RoPE of the Q tile, once, in place: row r at position token + pos_off (PG rows a token). */
template <class Cfg>
__device__ __forceinline__ void rope_q_tile(u16 *q_s, const float *freq_s, int m0, int pos_off, int tid)
{
    using L = prefill_layout<Cfg>;
    constexpr int D = Cfg::D, BM = L::BM, THREADS = L::THREADS, DT = Cfg::DT;
    constexpr int PG = Cfg::PACK ? Cfg::G : 1;
    for (int e = tid; e < BM * (D / 16); e += THREADS) {
        const int row = e / (D / 16), c = e % (D / 16);
        u16 *ra = q_s + swz<D>(row, c), *rb = q_s + swz<D>(row, c + D / 16);
        const float pos = (float)((m0 + row) / PG + pos_off);
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

} /* namespace kiln */

#endif /* KILN_MMA_TILES_CUH */
