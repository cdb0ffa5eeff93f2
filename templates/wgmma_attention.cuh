/*
 * wgmma_attention.cuh — attention on Hopper's warpgroup MMA (sm_90a), warp-specialized:
 * one producer warpgroup moves Q and the K/V tiles into a ring of shared-memory stages, two
 * consumer warpgroups of 64 query rows each compute S = Q K^T (wgmma, both operands in shared
 * memory), the logits, mask and online softmax in registers, and O += P V (wgmma, P from
 * registers). One CTA per (128-row query tile, query head), or per planned work item of a
 * batch: single-request prefill, batch prefill and append (kv=ragged / kv=paged).
 *
 * Computes what mma_attention.cuh computes (the same math, masks, logits transforms, LSE and
 * partial states, written by the same stage functions over the same accumulator layout: a
 * wgmma m64nN accumulator is, per warp of its warpgroup, an m16 x N mma.sync accumulator).
 *
 * The ring: stage s holds one K and one V tile [BN][D] in the 128-byte swizzle (hopper.cuh).
 * full[s] completes when each of the producer's 128 threads has arrived and the copies have
 * landed: by TMA (LOAD_TMA, a whole tile: one thread's expect_tx and copies, the others'
 * plain arrivals), or by cp.async (each thread's arrival triggered by its copies:
 * cp_async_arrive; a consumer fences them for the async proxy after its wait). empty[s]
 * completes when the 256 consumer threads are done reading the stage. Tile n uses stage
 * n % STAGES and phase n / STAGES of both barriers; Q has its own full / empty pair, phase
 * `it` (the CTA's job count), and with PERSIST the job slot its job_full (wg_job_put). The
 * producer gives registers up (setmaxnreg) to the consumers.
 *
 * Cfg as mma_attention.cuh's, with WARPS = 8 (the consumer warps), MT = 1, PACK (a KV head's
 * G query heads packed into the rows, mma_shape::PG), LOAD (the producer's copies, KILN_WGMMA_LOAD_*),
 * PERSIST (a persistent grid, KILN_WGMMA_PERSIST_*: wg_produce_jobs). fp8 KV and RoPE go through
 * the producer's transforms (wg_produce_x); mask data is element masks with a tile map row per
 * consumer warpgroup (wg_tiles). Launch: 384 threads, kiln_wgmma_smem_bytes (params.h), grid
 * (ceil(L_Q / 128) x H) or (work items x H) jobs along x (with PACK ceil(L_Q G / 128) x H_KV, or
 * items of 128 / G tokens x H_KV), with PERSIST (kiln__persistent_grid(jobs), 1); with LOAD_TMA
 * the second argument is the kiln_tma_maps of Q, K, V and O (runtime/tma.c).
 *
 * Checked against the float64 CPU reference in tools/check/ (tests/test_gpu.c, kiln check).
 */
#ifndef KILN_WGMMA_ATTENTION_CUH
#define KILN_WGMMA_ATTENTION_CUH

#include "common/hopper.cuh"
#include "common/wgmma.cuh"
#include "mma_attention.cuh"

namespace kiln {

template <class Cfg> struct wg_layout {
    static constexpr int D = Cfg::D, BN = Cfg::BN, STAGES = Cfg::STAGES, BM = KILN_WGMMA_BM;
    /* the producer's transforms (wg_produce_x): K (XK) and V (XV) copied as stored into raw
     * stages and widened / rotated from there, Q transformed in place (XQ); MDT the MMAs'
     * operand type: f16 with fp8 KV (fp8 widens exactly into it; bf16 q goes to f16 times
     * f8_q_unit), q's type otherwise */
    static constexpr bool FP8 = Cfg::KV_DT >= KV_E4M3;
    static constexpr int ES = FP8 ? 1 : 2;
    static constexpr bool XK = FP8 || Cfg::ROPE, XV = FP8, XQ = Cfg::ROPE || (FP8 && Cfg::DT == BF16);
    static constexpr int MDT = FP8 ? F16 : Cfg::DT;
    static constexpr int RAW = kiln_wgmma_raw_stages(D, ES, Cfg::ROPE), RAW_TILE = BN * D * ES;
    static constexpr int RAW_STAGE = kiln_wgmma_raw_tiles(ES, Cfg::ROPE) * RAW_TILE;
    static constexpr int Q_BYTES = BM * D * 2, TILE = BN * D * 2;
    static constexpr int Q_AT = 0, K_AT = Q_BYTES, V_AT = K_AT + STAGES * TILE, RAW_AT = V_AT + STAGES * TILE;
    static constexpr int FREQ_AT = RAW_AT + RAW * RAW_STAGE, BAR_AT = FREQ_AT + kiln_rope_freq_bytes(D, Cfg::ROPE);
    static constexpr int JOB_AT = BAR_AT + kiln_wgmma_bar_bytes(STAGES, RAW);
    static constexpr int PRODUCER = KILN_WGMMA_PRODUCER_THREADS, CONSUMERS = Cfg::WARPS * WARP;
    /* a stage's full barrier: the producer's arrivals, once for K's and once for V's with
     * KVSPLIT; without, once for both (wg_produce), or once each for K and V into the one
     * barrier where the producer transforms them (wg_produce_x) */
    static constexpr int FULL_COUNT = Cfg::KVSPLIT || !XK ? PRODUCER : 2 * PRODUCER;
    static constexpr int BYTES = kiln_wgmma_smem_bytes(D, BM, BN, STAGES, ES, Cfg::ROPE);
    static_assert(Cfg::WARPS == 8 && Cfg::MT == 1, "two consumer warpgroups of 64 rows");
    static_assert(!Cfg::PACK || (BM / 2) % Cfg::G == 0, "PACK: whole tokens in a warpgroup's 64 rows");
    static_assert(prefill_layout<Cfg>::BM == BM, "the work items' tile is the CTA's");
    static_assert(XK == (RAW > 0) && BAR_AT % 8 == 0, "raw stages exactly where K is transformed");
    static_assert(D % 64 == 0, "whole 64-column swizzle blocks");
    static_assert(BN % 16 == 0 && BN >= 64 && BN <= 256, "key tiles of whole k16 slices of P V, an m64nBN S");
    static_assert(BYTES == KILN_WGMMA_ALIGN + JOB_AT + KILN_WGMMA_JOB_BYTES, "the regions fill the layout");
};

/* The shared-memory addresses of one CTA: the tiles, the producer's raw stages and RoPE
 * frequencies, the barriers and the job slot. With SPLIT (KILN_TUNE kvsplit, jit/config.c) a
 * stage's K and V have barriers of their own (full: landed; empty: both consumer warpgroups
 * are done with it): a K tile is free once both groups' S of it are done, half a turn before
 * its V tile (free after their P V), so the producer loads the next K that much earlier. With
 * two stages, as at d256, one barrier for both let the K of tile t + 2 in only after the
 * second group's P V of tile t, which the first group's S of tile t + 2 follows at once in
 * the tensor pipe: every tile waited for a load. Without SPLIT V's barriers are K's: the
 * producer's two arrivals complete one full barrier, and the consumers arrive on the empty
 * one once, after P V (wg_consume's k_done arrives only with SPLIT). */
template <class Cfg> struct wg_smem {
    static constexpr int STAGES = Cfg::STAGES, SPLIT = Cfg::KVSPLIT;
    u32 q, k, v, raw, freq, bar, slot;
    __device__ __forceinline__ u32 full_k(int s) const { return bar + 8 * s; }
    __device__ __forceinline__ u32 full_v(int s) const { return bar + 8 * ((SPLIT ? STAGES : 0) + s); }
    __device__ __forceinline__ u32 empty_k(int s) const { return bar + 8 * (2 * STAGES + s); }
    __device__ __forceinline__ u32 empty_v(int s) const { return bar + 8 * ((SPLIT ? 3 : 2) * STAGES + s); }
    __device__ __forceinline__ u32 q_full() const { return bar + 32 * STAGES; }
    __device__ __forceinline__ u32 q_empty() const { return bar + 32 * STAGES + 8; }
    __device__ __forceinline__ u32 job_full() const { return bar + 32 * STAGES + 16; }
    __device__ __forceinline__ u32 raw_full(int r) const { return bar + 32 * STAGES + 32 + 8 * r; }
    __device__ __forceinline__ u32 job() const { return slot; }
};

/* The persistent grid's job slot (shared memory, after the barriers): producer thread 0 writes
 * each job's work and query head (h < 0: no more jobs) and arrives on job_full; the consumers
 * copy it after their wait on job_full, and so before their arrival on q_empty, which the
 * producer waits for before it writes the next: one slot serves every job, and the consumers
 * read no schedule of their own. Words by shared address: the work's, h, then next[2], which
 * hands a claimed job index (KILN_WGMMA_PERSIST_DYNAMIC) from producer thread 0 to the
 * others, by job parity. */
constexpr int WG_WORK_WORDS = sizeof(mma_work) / 4;
constexpr int WG_JOB_H = WG_WORK_WORDS, WG_JOB_NEXT = WG_WORK_WORDS + 1;
static_assert(sizeof(mma_work) % 4 == 0 && (WG_JOB_NEXT + 2) * 4 <= KILN_WGMMA_JOB_BYTES, "the job slot");

__device__ __forceinline__ void wg_job_put(u32 slot, const mma_work &w, int h)
{
    int v[WG_WORK_WORDS];
    memcpy(v, &w, sizeof w);
#pragma unroll
    for (int i = 0; i < WG_WORK_WORDS; i++) st_shared(slot + 4 * i, v[i]);
    st_shared(slot + 4 * WG_JOB_H, h);
}
__device__ __forceinline__ mma_work wg_job_get(u32 slot)
{
    int v[WG_WORK_WORDS];
#pragma unroll
    for (int i = 0; i < WG_WORK_WORDS; i++) v[i] = ld_shared(slot + 4 * i);
    mma_work w;
    memcpy(&w, v, sizeof w);
    return w;
}
constexpr int WG_PRODUCER_BAR = 3; /* named barrier of the producer's threads (1, 2: the turns) */

/* PACK (mask data's default where G divides 64, else KILN_TUNE pack=1; jit/config.c): a job's
 * rows are the G query heads of a KV head, row R token R / G, head h + R % G (mma_attention.cuh's
 * packing), so both consumer warpgroups read the same 128 / G tokens' key tiles. mma_shape::PG
 * rows a token; a job's first query head h is a multiple of it, and a work tile has
 * num_qo_heads / PG jobs (wg_job_heads). */
template <class Cfg> __device__ __forceinline__ int wg_job_heads(const kiln_launch_params &p)
{
    return p.num_qo_heads / mma_shape<Cfg>::PG;
}

/* The works of a CTA's jobs: planned items (a batch), or query tiles (a single request). */
template <class Cfg> __device__ __forceinline__ int wg_nx(const kiln_launch_params &p)
{
    if constexpr (Cfg::KV != KV_CONTIGUOUS) return num_items(p);
    else return (p.qo_len * mma_shape<Cfg>::PG + KILN_WGMMA_BM - 1) / KILN_WGMMA_BM;
}

/* The key tiles a CTA visits, in order: [t_first, t_end), less those the tile map hides from
 * both consumer warpgroups. The map has a row per warpgroup (64 query rows: kiln_tile_map_bm),
 * at map and map + stride; a warpgroup whose rows start past the request (two: 0) has none,
 * and every tile is hidden from it. */
template <class Cfg> struct wg_tiles {
    const unsigned char *map;
    int t_end, stride;
    bool two;
    /* tile t's class for warpgroup c's rows (TILE_MIXED without a map) */
    __device__ __forceinline__ int cls(int t, int c) const
    {
        if (!mma_shape<Cfg>::ELEM || !map) return TILE_MIXED;
        return c && !two ? TILE_HIDDEN : map[c * stride + t];
    }
    /* whether warpgroup c skips tile t (no S, softmax or P V of its own), where it may: an
     * element mask, and no job's last P V issued with the next job's first S (XJOB). Lane 0's
     * answer, broadcast: ptxas then knows the branch around the S issue is warp-uniform (a
     * divergent one serializes every wgmma of the kernel: its warning C7520) */
    __device__ __forceinline__ bool skip(int t, int c) const
    {
        if constexpr (!mma_shape<Cfg>::ELEM || Cfg::XJOB) return false;
        return __shfl_sync(0xffffffffu, map && cls(t, c) == TILE_HIDDEN, 0);
    }
    __device__ __forceinline__ int next(int t) const
    {
        if (mma_shape<Cfg>::ELEM && map)
            while (t < t_end && cls(t, 0) == TILE_HIDDEN && cls(t, 1) == TILE_HIDDEN) t++;
        return t;
    }
};

/* The key tiles of work w: its two rows of the tile map, if any. */
template <class Cfg>
__device__ __forceinline__ wg_tiles<Cfg> wg_job_tiles(const kiln_launch_params &p, const mma_work &w)
{
    wg_tiles<Cfg> tiles;
    tiles.map = mma_shape<Cfg>::ELEM && p.tile_map
                    ? reinterpret_cast<const unsigned char *>(p.tile_map) + (i64)(2 * w.m_block) * p.kv_tiles
                    : nullptr;
    tiles.stride = p.kv_tiles;
    tiles.two = w.m0 + KILN_WGMMA_BM / 2 < w.rows_hi;
    tiles.t_end = w.t_end;
    return tiles;
}

/* The box of a paged K/V tile that producer thread tid copies by TMA (paged, whole tiles):
 * box b is lane b / 4 of warp b % 4, so that a tile's boxes spread over the four warps. A TMA
 * copy takes its operands in uniform registers, so a warp issues its lanes' copies one lane
 * after another (ptxas loops over them); eight boxes of page 16 in one warp took eight rounds
 * of four copies each. */
__device__ __forceinline__ int wg_box_of_thread(int tid) { return tid % WARP * 4 + tid / WARP; }

/* Whether the producer copies K/V tile t of work w by TMA (a whole tile, and with kv=paged
 * pages that nest with it: the async proxy, as wgmma reads it, so no proxy fence after the
 * wait) or by cp.async (generic-proxy writes, fenced by the consumer before its wgmma reads
 * them): the producer's test (with kv=paged, box_rows != 0), for the consumers' fence. */
template <class Cfg>
__device__ __forceinline__ bool wg_tile_by_tma(const kiln_launch_params &p, const mma_work &w, int t)
{
    if constexpr (Cfg::LOAD != KILN_WGMMA_LOAD_TMA) return false;
    const bool whole = (t + 1) * Cfg::BN <= w.L_KV;
    if constexpr (Cfg::KV == KV_PAGED) return whole && p.kv_box_rows != 0;
    return whole;
}

/* The same for a stage's K and V tiles as the consumers read them: generic-proxy writes of the
 * producer wherever it transforms K (wg_produce_x). */
template <class Cfg>
__device__ __forceinline__ bool wg_kv_by_tma(const kiln_launch_params &p, const mma_work &w, int t)
{
    return !wg_layout<Cfg>::XK && wg_tile_by_tma<Cfg>(p, w, t);
}

/* The same for the job's Q tile (wg_produce_tile's test with its BM rows). */
template <class Cfg> __device__ __forceinline__ bool wg_q_by_tma(const mma_work &w)
{
    return Cfg::LOAD == KILN_WGMMA_LOAD_TMA && !wg_layout<Cfg>::XQ && w.m0 + KILN_WGMMA_BM <= w.rows_hi;
}

/* ---- the producer ---- */

/* Byte offset of 16-byte chunk c (elements 8c .. 8c + 7) of row r in a 16-bit swizzled tile of
 * ROWS rows (D / 64 blocks of 64 columns, the layout wgmma reads and wg_load_rows writes). */
template <int ROWS> __device__ __forceinline__ u32 wg_chunk_at(int r, int c)
{
    return (u32)((c >> 3) * ROWS * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* LOAD_WARP's copies of rows [row0, row0 + ROWS) of CH 16-byte chunks each: each producer
 * warp takes ROWS / 4 rows, 32 at a time, lane l works out the address of its row l, and the
 * warp copies whole rows an instruction at a time, each row's address passed by shuffle;
 * chunk ch of tile row r lands at dst_at(r, ch), rows at or past row_hi zero-filled. */
template <int CH, int ROWS, class RowAt, class DstAt>
__device__ __forceinline__ void wg_copy_rows(const DstAt &dst_at, const unsigned char *g, const RowAt &row_at, int row0,
                                             int row_hi, int tid)
{
    constexpr int LPR = CH < WARP ? CH : WARP; /* lanes per row in one instruction */
    constexpr int RPI = WARP / LPR;            /* rows per instruction */
    constexpr int RW = ROWS / (KILN_WGMMA_PRODUCER_THREADS / WARP); /* rows per warp */
    static_assert(CH <= WARP && RW * (KILN_WGMMA_PRODUCER_THREADS / WARP) == ROWS && RW % RPI == 0, "load shape");
    const int lane = tid % WARP, rw0 = tid / WARP * RW, ch = lane % LPR;
    /* a warp's rows in rounds of up to 32 (a lane's row each) */
#pragma unroll
    for (int q0 = 0; q0 < RW; q0 += WARP) {
        const int qn = RW - q0 < WARP ? RW - q0 : WARP, jl = row0 + rw0 + q0 + lane;
        const i64 own = lane < qn && jl < row_hi ? row_at(jl) : -1; /* -1: zero-fill */
        const int own_lo = (int)(unsigned)(own & 0xffffffff), own_hi = (int)(own >> 32);
#pragma unroll 4
        for (int i = 0; i < qn / RPI; i++) {
            const int rl = i * RPI + lane / LPR, r = rw0 + q0 + rl;
            const i64 off = ((i64)__shfl_sync(0xffffffffu, own_hi, rl) << 32) |
                            (i64)(unsigned)__shfl_sync(0xffffffffu, own_lo, rl);
            const bool ok = off >= 0;
            cp_async16(dst_at(r, ch), ok ? g + off + ch * 16 : g, ok ? 16 : 0);
        }
    }
}

/* cp.async of rows [row0, row0 + ROWS) of a 16-bit [*, D] matrix into a swizzled tile: row j
 * from byte row_at(j) of g, rows at or past row_hi zero-filled. Two ways (the LOAD argument):
 *   LOAD_ROWS (KILN_TUNE load=0, the first version): one row (ROWS = 64: half a row) per
 *     producer thread, its address worked out once (a paged row: one page-table read); a warp
 *     instruction touches 32 rows, 16 bytes of each: every 32-byte L2 sector is fetched twice.
 *   LOAD_WARP (kv=paged's default, and TMA's partial tiles): each producer warp takes
 *     ROWS / 4 rows, 32 at a time, lane l works out the address of its row l, and the warp
 *     copies whole rows an instruction at a time (512 contiguous bytes where rows are
 *     contiguous), each row's address passed by shuffle: 1.5x the first version's speed on
 *     the H200. */
template <int LOAD, int D, int ROWS, class RowAt>
__device__ __forceinline__ void wg_load_rows(u32 dst, const unsigned char *g, const RowAt &row_at, int row0,
                                             int row_hi, int tid)
{
    constexpr int CH = D / 8; /* 16-byte chunks per row */
    if constexpr (LOAD == 0) {
        constexpr int TPR = KILN_WGMMA_PRODUCER_THREADS / ROWS, CPT = CH / TPR;
        static_assert(ROWS * TPR == KILN_WGMMA_PRODUCER_THREADS && CPT * TPR == CH, "load shape");
        const int r = tid / TPR, c0 = tid % TPR * CPT, j = row0 + r;
        const bool ok = j < row_hi;
        const unsigned char *src = ok ? g + row_at(j) : g;
        const u32 row = dst + (u32)(r * 128);
#pragma unroll
        for (int u = 0; u < CPT; u++) {
            const int c = c0 + u;
            cp_async16(row + (u32)((c >> 3) * ROWS * 128 + (((c & 7) ^ (r & 7)) << 4)), src + c * 16,
                       ok ? 16 : 0);
        }
    } else {
        wg_copy_rows<CH, ROWS>(
            [&](int r, int c) { return dst + wg_chunk_at<ROWS>(r, c); }, g, row_at, row0, row_hi, tid);
    }
}

/* TMA of one 16-bit tile [ROWS][D] (D / 64 boxes of 64 columns, each ROWS x 128 bytes in the
 * 128-byte swizzle: the layout wg_load_rows writes) from row `row` of head `head` of map. */
template <int D, int ROWS>
__device__ __forceinline__ void wg_tma_tile(u32 dst, const kiln_tma_map *map, u32 bar, int head, int row)
{
#pragma unroll
    for (int cb = 0; cb < D / 64; cb++) tma_load_3d(dst + (u32)(cb * ROWS * 128), map, bar, cb * 64, head, row);
}

/* The copies of one tile of ROWS rows from row0 (of row_hi) into dst, and the producer's
 * arrivals on bar (each of its threads arrives once). With LOAD_TMA a whole tile is one
 * thread's TMA (map, rows from map_row of head `head`), the rest arrive at once; a partial
 * tile (past row_hi: zeros, never the next request's rows) is copied by cp.async as with
 * LOAD_WARP. */
template <class Cfg, int ROWS, class RowAt>
__device__ __forceinline__ void wg_produce_tile(u32 dst, u32 bar, const unsigned char *g, const RowAt &row_at,
                                                int row0, int row_hi, const kiln_tma_map *map, int head,
                                                int map_row, int tid)
{
    constexpr int D = Cfg::D;
    if constexpr (Cfg::LOAD == KILN_WGMMA_LOAD_TMA) {
        if (row0 + ROWS <= row_hi) {
            if (tid == 0) {
                mbar_arrive_expect_tx(bar, ROWS * D * 2);
                wg_tma_tile<D, ROWS>(dst, map, bar, head, map_row);
            } else {
                mbar_arrive(bar);
            }
            return;
        }
        wg_load_rows<KILN_WGMMA_LOAD_WARP, D, ROWS>(dst, g, row_at, row0, row_hi, tid);
    } else {
        wg_load_rows<Cfg::LOAD, D, ROWS>(dst, g, row_at, row0, row_hi, tid);
    }
    cp_async_arrive(bar);
}

/* Job (w, h)'s Q rows: g is head h's row of the request's first token, and (packed) row j lies
 * at byte g + (*this)(j): token j, or with PACK token j / G of head h + j % G. map_row is the
 * tile's first token in Q's map (a box of PG heads: runtime/tma.c). */
template <class Cfg> struct wg_q_rows {
    const unsigned char *g;
    i64 sn, sh;
    int map_row;
    __device__ __forceinline__ i64 operator()(int j) const
    {
        constexpr int PG = mma_shape<Cfg>::PG;
        return PG > 1 ? (i64)(j / PG) * sn + (i64)(j % PG) * sh : (i64)j * sn;
    }
};
template <class Cfg>
__device__ __forceinline__ wg_q_rows<Cfg> wg_q_of(const kiln_launch_params &p, const mma_work &w, int h)
{
    wg_q_rows<Cfg> q;
    q.g = reinterpret_cast<const unsigned char *>(p.q) + ((i64)w.q_start * p.q_stride_n + (i64)h * p.q_stride_h) * 2;
    q.sn = p.q_stride_n * 2;
    q.sh = p.q_stride_h * 2;
    q.map_row = w.q_start + w.m0 / mma_shape<Cfg>::PG;
    return q;
}

/* The copies of one job: its first K/V tile into the ring (whose count n runs on across jobs),
 * then Q once q_turn() returns (the consumers are done with the previous job's Q), then the
 * other tiles; filled() once the ring holds the job's first STAGES tiles (or all of them):
 * the producer is then a ring ahead, and a pause costs the consumers nothing. */
template <class Cfg, class QTurn, class Filled>
__device__ __forceinline__ void wg_produce(const kiln_launch_params &p, const kiln_tma_maps *maps, const mma_work &w,
                                           const wg_tiles<Cfg> &tiles, const wg_smem<Cfg> &sm, int h, int hk,
                                           int tid, int &n, const QTurn &q_turn, const Filled &filled)
{
    using L = wg_layout<Cfg>;
    constexpr int D = Cfg::D, BN = Cfg::BN, STAGES = Cfg::STAGES;
    constexpr bool TMA = Cfg::LOAD == KILN_WGMMA_LOAD_TMA;
    auto produce_q = [&] {
        q_turn();
        const wg_q_rows<Cfg> q = wg_q_of<Cfg>(p, w, h);
        wg_produce_tile<Cfg, L::BM>(sm.q, sm.q_full(), q.g, q, w.m0, w.rows_hi, TMA ? &maps->q : nullptr, h,
                                    q.map_row, tid);
    };

    const unsigned char *kg = reinterpret_cast<const unsigned char *>(p.k) + (i64)hk * p.k_stride_h * 2;
    const unsigned char *vg = reinterpret_cast<const unsigned char *>(p.v) + (i64)hk * p.v_stride_h * 2;
    const int kv_row0 = Cfg::KV == KV_RAGGED ? w.kv_start : 0; /* the request's first row */
    kg += (i64)kv_row0 * p.k_stride_n * 2;
    vg += (i64)kv_row0 * p.v_stride_n * 2;
    const i64 ks = p.k_stride_n * 2, vs = p.v_stride_n * 2;
    const int *pages = Cfg::KV == KV_PAGED ? reinterpret_cast<const int *>(p.kv_indices) + w.kv_start : nullptr;
    /* paged: the byte offset of key j's row within the cache, through its page */
    auto paged_at = [&](int j, long long stride_page, i64 stride) {
        const int pg = j / p.page_size;
        return ((i64)pages[pg] * stride_page) * 2 + (i64)(j - pg * p.page_size) * stride;
    };
    const int n0 = n;
    for (int t = tiles.next(w.t_first); t < w.t_end; t = tiles.next(t + 1), n++) {
        const int s = n % STAGES, j0 = t * BN;
        /* paged by TMA, a whole tile: this thread's box of the tile (wg_box_of_thread), whose
         * page-table entry it reads before the wait for the stage, so that the read's latency
         * hides under it (after the wait it came before every tile's copies) */
        const int box_rows = TMA && Cfg::KV == KV_PAGED && j0 + BN <= w.L_KV ? p.kv_box_rows : 0;
        const int box = wg_box_of_thread(tid);
        const bool has_box = box_rows && box < BN / box_rows; /* a box of this tile is its own */
        int box_page = 0, box_row = 0;                          /* its page, its first row there */
        if (has_box) {
            box_page = pages[(j0 + box * box_rows) / p.page_size];
            box_row = (j0 + box * box_rows) % p.page_size;
        }
        const u32 kd = sm.k + s * L::TILE, vd = sm.v + s * L::TILE;
        /* K into its stage once both groups' S of its last tile are done, then V once their
         * P V are: each on its own full barrier (wg_smem). Without KVSPLIT, one wait for the
         * stage and one arrival a thread for both tiles, their bytes expected at once: with
         * K's copies (first), the arrivals with V's (last) */
#pragma unroll
        for (int kv = 0; kv < 2; kv++) {
            const bool first = Cfg::KVSPLIT || kv == 0, last = Cfg::KVSPLIT || kv == 1;
            constexpr int TILES = Cfg::KVSPLIT ? 1 : 2; /* the tiles a full barrier's bytes cover */
            const u32 dst = kv ? vd : kd, full = kv ? sm.full_v(s) : sm.full_k(s);
            const unsigned char *g = kv ? vg : kg;
            const kiln_tma_map *map = !TMA ? nullptr : kv ? &maps->v : &maps->k;
            const i64 st = kv ? vs : ks;
            const long long st_page = kv ? p.v_stride_page : p.k_stride_page;
            if (first && n >= STAGES) mbar_wait(kv ? sm.empty_v(s) : sm.empty_k(s), (n / STAGES - 1) & 1);
            if constexpr (Cfg::KV == KV_PAGED) {
                if (box_rows) {
                    /* a whole tile from pages of a multiple of 8 rows: one box per page (or
                     * per tile of a larger page), each from its thread's page-table entry;
                     * each box's thread expects its own bytes before its copies, the others
                     * arrive: a tile's boxes sum to the tile's bytes */
                    const int rows = box_rows;
                    if (has_box) {
                        const int pg = box_page, r = box_row;
                        if (first) mbar_arrive_expect_tx(full, TILES * rows * (L::TILE / BN));
#pragma unroll
                        for (int cb = 0; cb < D / 64; cb++) {
                            const u32 at = (u32)(cb * BN * 128 + box * rows * 128);
                            if (p.kv_map_rows) /* a dense pool: rows of one 3-D map */
                                tma_load_3d(dst + at, map, full, cb * 64, hk, pg * p.page_size + r);
                            else
                                tma_load_4d(dst + at, map, full, cb * 64, hk, r, pg);
                        }
                    } else if (last) {
                        mbar_arrive(full);
                    }
                } else {
                    constexpr int ROWS_LOAD = TMA ? KILN_WGMMA_LOAD_WARP : Cfg::LOAD;
                    wg_load_rows<ROWS_LOAD, D, BN>(dst, g, [&](int j) { return paged_at(j, st_page, st); }, j0, w.L_KV, tid);
                    if (last) cp_async_arrive(full);
                }
            } else if constexpr (TMA) {
                if (wg_kv_by_tma<Cfg>(p, w, t)) { /* a whole tile: one thread's TMA */
                    if (tid == 0) {
                        if (first) mbar_arrive_expect_tx(full, TILES * L::TILE);
                        wg_tma_tile<D, BN>(dst, map, full, hk, kv_row0 + j0);
                    } else if (last) {
                        mbar_arrive(full);
                    }
                } else {
                    wg_load_rows<KILN_WGMMA_LOAD_WARP, D, BN>(dst, g, [&](int j) { return (i64)j * st; }, j0, w.L_KV, tid);
                    if (last) cp_async_arrive(full);
                }
            } else {
                wg_load_rows<Cfg::LOAD, D, BN>(dst, g, [&](int j) { return (i64)j * st; }, j0, w.L_KV, tid);
                if (last) cp_async_arrive(full);
            }
        }
        if (n == n0) produce_q();
        if (n == n0 + STAGES - 1) filled();
    }
    if (n == n0) produce_q(); /* a job without key tiles */
    if (n - n0 < STAGES) filled();
}

/* ---- the producer's transforms (fp8 KV, RoPE) ----
 * Where K (or V) is not what the MMAs read as stored, the producer copies it as stored into a
 * raw stage (cp.async: fp8 rows plain, [BN][D] bytes; 16-bit rows in the swizzled layout of
 * wg_load_rows), and once the copies have landed (the raw stage's full barrier: every producer
 * thread's copies) turns it into the 16-bit stage the consumers read: fp8 widened exactly into
 * f16 pairs (fp8x4_f16, one cvt a pair: the values times f8_pair_unit, which k_unit / v_unit
 * give back), K rotated at its positions with RoPE. It writes the stage with generic stores,
 * fences them for the async proxy and arrives on the stage's full barrier; the consumers fence
 * again after their wait (wg_kv_by_tma is false). The raw stages form a ring of their own
 * (RAW deep; the raw tile of ring count n sits in raw stage n % RAW), filled RAW tiles ahead
 * within a job, so that the next tile's copies are in flight while the producer converts this
 * one; before refilling a raw stage the producer's threads meet (a named barrier), every
 * thread having read its part of it. V of 16-bit K/V with RoPE goes straight into the stage
 * (TMA or rows, as without transforms): the stage's full barrier then counts both arrivals.
 * Q with RoPE, or bf16 q beside fp8 K/V (the MMAs run in f16), is copied by rows, waited for,
 * and transformed in place before the producer arrives on q_full. */

/* cp.async of fp8 rows [row0, row0 + ROWS) of a [*, D]-byte matrix into a plain raw tile
 * [ROWS][D] (wg_copy_rows, D / 16 lanes a row); rows at or past row_hi zero-filled. */
template <int D, int ROWS, class RowAt>
__device__ __forceinline__ void wg_load_raw8(u32 dst, const unsigned char *g, const RowAt &row_at, int row0,
                                             int row_hi, int tid)
{
    wg_copy_rows<D / 16, ROWS>([&](int r, int c) { return dst + (u32)(r * D + c * 16); }, g, row_at, row0, row_hi,
                               tid);
}

/* Eight floats times `mul` as chunk c of row r of a 16-bit swizzled tile of type DT. */
template <int DT, int ROWS>
__device__ __forceinline__ void wg_write8(u32 tile, int r, int c, const float (&f)[8], float mul = 1.0f)
{
    uint4 w;
    w.x = pack2<DT>(f[0] * mul, f[1] * mul);
    w.y = pack2<DT>(f[2] * mul, f[3] * mul);
    w.z = pack2<DT>(f[4] * mul, f[5] * mul);
    w.w = pack2<DT>(f[6] * mul, f[7] * mul);
    sts128(tile + wg_chunk_at<ROWS>(r, c), w);
}

/* Rotate chunks c (d = 8c ..) and c + D / 16 (d + D / 2) of a row at position pos. */
template <int D>
__device__ __forceinline__ void wg_rope8(float (&a)[8], float (&b)[8], u32 freq, int c, float pos)
{
#pragma unroll
    for (int u = 0; u < 8; u++)
        rope_rotate(a[u], b[u], pos * __int_as_float(ld_shared(freq + (u32)(4 * (c * 8 + u)))));
}

/* A raw fp8 tile [BN][D] at src widened into the 16-bit swizzled tile at dst (the exact f16
 * pairs, no float round trip). Each thread keeps one 8-byte chunk column c of the rows r0,
 * r0 + RP, ... (RP rows a pass), so that its addresses are two bases and immediates (a row
 * RP further has the same swizzle, or with RP = 4 the other of two), and loads G chunks
 * before it converts and stores them: G shared loads in flight. */
template <class Cfg> __device__ __forceinline__ void wg_widen(u32 src, u32 dst, int tid)
{
    constexpr int D = Cfg::D, BN = Cfg::BN, C = D / 8, RP = KILN_WGMMA_PRODUCER_THREADS / C, PASSES = BN / RP;
    constexpr int G = 4;
    static_assert(RP * C == KILN_WGMMA_PRODUCER_THREADS && PASSES * RP == BN && PASSES % G == 0 &&
                      (RP % 8 == 0 || RP == 4),
                  "widen shape");
    const int c = tid % C, r0 = tid / C;
    const u32 s0 = src + (u32)(r0 * D + c * 8);
    const u32 d0 = dst + wg_chunk_at<BN>(r0, c);
    const u32 d1 = RP == 4 ? dst + wg_chunk_at<BN>(r0 + 4, c) - 4 * 128 : d0; /* odd passes at RP 4 */
#pragma unroll
    for (int i0 = 0; i0 < PASSES; i0 += G) {
        uint2 w[G];
#pragma unroll
        for (int g = 0; g < G; g++) w[g] = lds64(s0 + (u32)((i0 + g) * RP * D));
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int i = i0 + g;
            uint4 h;
            fp8x4_f16<Cfg::KV_DT>(w[g].x, h.x, h.y);
            fp8x4_f16<Cfg::KV_DT>(w[g].y, h.z, h.w);
            sts128((i & 1 ? d1 : d0) + (u32)(i * RP * 128), h);
        }
    }
}

/* A raw K tile [BN][D] (fp8, or 16-bit swizzled) at raw rotated into the 16-bit swizzled tile
 * at kd, row r at position pos0 + r. Each thread keeps the pair of chunk columns c and
 * c + D / 16 (d and d + D / 2) of rows r0, r0 + RP, ..., a half chunk (4 elements: their 4
 * frequencies, one 16-byte load) at a time, as wg_widen keeps its column. */
template <class Cfg> __device__ __forceinline__ void wg_rope_k(u32 raw, u32 kd, u32 freq, int pos0, int tid)
{
    using L = wg_layout<Cfg>;
    constexpr int D = Cfg::D, BN = Cfg::BN, C2 = D / 16, RP = KILN_WGMMA_PRODUCER_THREADS / C2, PASSES = BN / RP;
    static_assert(RP * C2 == KILN_WGMMA_PRODUCER_THREADS && PASSES * RP == BN && (RP % 8 == 0 || RP == 4),
                  "rope shape");
    const int c = tid % C2, r0 = tid / C2;
    /* 4 elements (half h) of chunk column cc of row r of the raw tile, as floats */
    auto read4 = [&](int r, int cc, int h, float (&f)[4]) {
        u32 w0, w1;
        if constexpr (L::FP8) {
            fp8x4_f16<Cfg::KV_DT>((u32)ld_shared(raw + (u32)(r * D + cc * 8 + h * 4)), w0, w1);
            half2_to_f(w0, f[0], f[1]);
            half2_to_f(w1, f[2], f[3]);
        } else {
            const uint2 w = lds64(raw + wg_chunk_at<BN>(r, cc) + (u32)(h * 8));
            unpack2<Cfg::DT>(w.x, f[0], f[1]);
            unpack2<Cfg::DT>(w.y, f[2], f[3]);
        }
    };
#pragma unroll 1
    for (int i = 0; i < PASSES; i++) {
        const int r = r0 + i * RP;
        const float pos = (float)(pos0 + r);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint4 fw = lds128(freq + (u32)(4 * (c * 8 + h * 4)));
            const float fr[4] = {__int_as_float(fw.x), __int_as_float(fw.y), __int_as_float(fw.z), __int_as_float(fw.w)};
            float a[4], b[4];
            read4(r, c, h, a);
            read4(r, c + C2, h, b);
#pragma unroll
            for (int u = 0; u < 4; u++) rope_rotate(a[u], b[u], pos * fr[u]);
            sts64(kd + wg_chunk_at<BN>(r, c) + (u32)(h * 8), make_uint2(pack2<L::MDT>(a[0], a[1]), pack2<L::MDT>(a[2], a[3])));
            sts64(kd + wg_chunk_at<BN>(r, c + C2) + (u32)(h * 8),
                  make_uint2(pack2<L::MDT>(b[0], b[1]), pack2<L::MDT>(b[2], b[3])));
        }
    }
}

/* The raw K tile of keys j0 .. j0 + BN in raw stage `raw` into the stage's 16-bit K tile kd:
 * fp8 pairs widened (the exact f16 pairs, no float round trip) and, with RoPE, rotated at
 * positions j + rope_off. (fp8 V: wg_widen of the raw stage's second tile.) */
template <class Cfg>
__device__ __forceinline__ void wg_xform_k(u32 raw, u32 kd, u32 freq, int j0, int rope_off, int tid)
{
    if constexpr (Cfg::ROPE) wg_rope_k<Cfg>(raw, kd, freq, j0 + rope_off, tid);
    else wg_widen<Cfg>(raw, kd, tid);
}

/* Q in place: RoPE at positions (m0 + r) / PG + pos_off (row r's token), and with fp8 K/V
 * bf16 q to f16 times f8_q_unit (the MMAs' type). */
template <class Cfg> __device__ __forceinline__ void wg_xform_q(u32 q, u32 freq, int m0, int pos_off, int tid)
{
    using L = wg_layout<Cfg>;
    constexpr int D = Cfg::D, BM = L::BM, C = D / 8, P = L::PRODUCER;
    constexpr float MUL = L::FP8 ? f8_q_unit<Cfg>() : 1.0f;
    auto read8 = [&](int r, int c, float (&f)[8]) {
        const uint4 w = lds128(q + wg_chunk_at<BM>(r, c));
        unpack2<Cfg::DT>(w.x, f[0], f[1]);
        unpack2<Cfg::DT>(w.y, f[2], f[3]);
        unpack2<Cfg::DT>(w.z, f[4], f[5]);
        unpack2<Cfg::DT>(w.w, f[6], f[7]);
    };
    if constexpr (Cfg::ROPE) {
        for (int e = tid; e < BM * (C / 2); e += P) {
            const int r = e / (C / 2), c = e % (C / 2);
            float a[8], b[8];
            read8(r, c, a);
            read8(r, c + C / 2, b);
            wg_rope8<D>(a, b, freq, c, (float)((m0 + r) / mma_shape<Cfg>::PG + pos_off));
            wg_write8<L::MDT, BM>(q, r, c, a, MUL);
            wg_write8<L::MDT, BM>(q, r, c + C / 2, b, MUL);
        }
    } else {
        for (int e = tid; e < BM * C; e += P) {
            float a[8];
            read8(e / C, e % C, a);
            wg_write8<L::MDT, BM>(q, e / C, e % C, a, MUL);
        }
    }
}

/* wg_produce with the transforms: the same tiles, stages, arrivals on full / q_full and calls
 * of q_turn and filled, the K (and V) tiles through the raw stages. */
template <class Cfg, class QTurn, class Filled>
__device__ __forceinline__ void wg_produce_x(const kiln_launch_params &p, const kiln_tma_maps *maps, const mma_work &w,
                                             const wg_tiles<Cfg> &tiles, const wg_smem<Cfg> &sm, int h,
                                             int hk, int tid, int &n, const QTurn &q_turn, const Filled &filled)
{
    using L = wg_layout<Cfg>;
    constexpr int D = Cfg::D, BN = Cfg::BN, STAGES = Cfg::STAGES, RAW = L::RAW, ES = L::ES, P = L::PRODUCER;
    constexpr bool TMA = Cfg::LOAD == KILN_WGMMA_LOAD_TMA;
    const int rope_off =
        Cfg::ROPE && Cfg::KV != KV_CONTIGUOUS && p.rope_offsets ? reinterpret_cast<const int *>(p.rope_offsets)[w.b] : 0;
    auto produce_q = [&] {
        q_turn();
        const wg_q_rows<Cfg> q = wg_q_of<Cfg>(p, w, h);
        if constexpr (L::XQ) {
            wg_load_rows<KILN_WGMMA_LOAD_WARP, D, L::BM>(sm.q, q.g, q, w.m0, w.rows_hi, tid);
            cp_async_commit();
            cp_async_wait<0>(); /* this thread's copies (and its raw copies in flight) */
            named_sync(WG_PRODUCER_BAR, P);
            wg_xform_q<Cfg>(sm.q, sm.freq, w.m0, w.off + rope_off, tid);
            fence_proxy_async();
            mbar_arrive(sm.q_full());
        } else {
            wg_produce_tile<Cfg, L::BM>(sm.q, sm.q_full(), q.g, q, w.m0, w.rows_hi, TMA ? &maps->q : nullptr, h,
                                        q.map_row, tid);
        }
    };

    const unsigned char *kg = reinterpret_cast<const unsigned char *>(p.k) + (i64)hk * p.k_stride_h * ES;
    const unsigned char *vg = reinterpret_cast<const unsigned char *>(p.v) + (i64)hk * p.v_stride_h * ES;
    const int kv_row0 = Cfg::KV == KV_RAGGED ? w.kv_start : 0;
    kg += (i64)kv_row0 * p.k_stride_n * ES;
    vg += (i64)kv_row0 * p.v_stride_n * ES;
    const i64 ks = p.k_stride_n * ES, vs = p.v_stride_n * ES;
    const int *pages = Cfg::KV == KV_PAGED ? reinterpret_cast<const int *>(p.kv_indices) + w.kv_start : nullptr;
    /* the byte offset of key j's row, through its page with kv=paged (wg_produce's paged_at) */
    auto row_at = [&](int j, long long stride_page, i64 stride) {
        if constexpr (Cfg::KV == KV_PAGED) {
            const int pg = j / p.page_size;
            return (i64)pages[pg] * stride_page * ES + (i64)(j - pg * p.page_size) * stride;
        } else {
            return (i64)j * stride;
        }
    };
    auto k_at = [&](int j) { return row_at(j, p.k_stride_page, ks); };
    auto v_at = [&](int j) { return row_at(j, p.v_stride_page, vs); };
    /* the raw copies of key tile t into raw stage r: by TMA where the tile is whole and not
     * paged (K and V boxes from maps of es-byte elements: fp8 rows plain, 16-bit rows in the
     * swizzle; through a page table the boxes' extra state spilled the producer), else by rows */
    auto issue = [&](int t, int r) {
        const u32 kr = sm.raw + (u32)(r * L::RAW_STAGE), bar = sm.raw_full(r);
        const int j0 = t * BN;
        if constexpr (TMA && Cfg::KV != KV_PAGED) {
            if (wg_tile_by_tma<Cfg>(p, w, t)) {
                constexpr int TILES = kiln_wgmma_raw_tiles(ES, Cfg::ROPE);
                if (tid == 0) {
                    mbar_arrive_expect_tx(bar, TILES * L::RAW_TILE);
                    if constexpr (L::FP8) {
                        tma_load_3d(kr, &maps->k, bar, 0, hk, kv_row0 + j0);
                        tma_load_3d(kr + L::RAW_TILE, &maps->v, bar, 0, hk, kv_row0 + j0);
                    } else {
                        wg_tma_tile<D, BN>(kr, &maps->k, bar, hk, kv_row0 + j0);
                    }
                } else {
                    mbar_arrive(bar);
                }
                return;
            }
        }
        if constexpr (L::FP8) {
            wg_load_raw8<D, BN>(kr, kg, k_at, j0, w.L_KV, tid);
            wg_load_raw8<D, BN>(kr + L::RAW_TILE, vg, v_at, j0, w.L_KV, tid);
        } else {
            wg_load_rows<KILN_WGMMA_LOAD_WARP, D, BN>(kr, kg, k_at, j0, w.L_KV, tid);
        }
        cp_async_arrive(bar);
    };
    /* V of 16-bit K/V straight into its stage: TMA for a whole tile where it can, else rows */
    auto v_direct = [&](u32 vd, u32 full, int t) {
        const int j0 = t * BN;
        if constexpr (TMA && Cfg::KV != KV_PAGED) {
            if (wg_tile_by_tma<Cfg>(p, w, t)) {
                if (tid == 0) {
                    mbar_arrive_expect_tx(full, L::TILE);
                    wg_tma_tile<D, BN>(vd, &maps->v, full, hk, kv_row0 + j0);
                } else {
                    mbar_arrive(full);
                }
                return;
            }
        }
        wg_load_rows<KILN_WGMMA_LOAD_WARP, D, BN>(vd, vg, v_at, j0, w.L_KV, tid);
        cp_async_arrive(full);
    };

    const int n0 = n;
    int ta = tiles.next(w.t_first), na = n; /* the next tile to copy raw, and its ring count */
    if (n0 > 0) named_sync(WG_PRODUCER_BAR, P); /* the last job's raw stages are read */
    for (; ta < w.t_end && na < n0 + RAW; ta = tiles.next(ta + 1), na++) issue(ta, na % RAW);
    for (int t = tiles.next(w.t_first); t < w.t_end; t = tiles.next(t + 1), n++) {
        const int s = n % STAGES, r = n % RAW;
        /* K first, once its tile is free, then V once its tile is (wg_smem: K frees half a
         * turn sooner): fp8 V widened from the raw stage, 16-bit V straight into its stage */
        const u32 kd = sm.k + s * L::TILE, vd = sm.v + s * L::TILE, raw = sm.raw + (u32)(r * L::RAW_STAGE);
        if (n >= STAGES) mbar_wait(sm.empty_k(s), (n / STAGES - 1) & 1);
        mbar_wait(sm.raw_full(r), (n / RAW) & 1);
        wg_xform_k<Cfg>(raw, kd, sm.freq, t * BN, rope_off, tid);
        fence_proxy_async();
        mbar_arrive(sm.full_k(s));
        if (n >= STAGES) mbar_wait(sm.empty_v(s), (n / STAGES - 1) & 1);
        if constexpr (L::XV) {
            wg_widen<Cfg>(raw + L::RAW_TILE, vd, tid);
            fence_proxy_async();
            mbar_arrive(sm.full_v(s));
        } else {
            v_direct(vd, sm.full_v(s), t);
        }
        if (ta < w.t_end) { /* raw stage r again, for the tile RAW ahead */
            named_sync(WG_PRODUCER_BAR, P);
            issue(ta, na % RAW);
            ta = tiles.next(ta + 1);
            na++;
        }
        if (n == n0) produce_q();
        if (n == n0 + STAGES - 1) filled();
    }
    if (n == n0) produce_q(); /* a job without key tiles */
    if (n - n0 < STAGES) filled();
}

/* The copies of one job, with or without the transforms. */
template <class Cfg, class QTurn, class Filled>
__device__ __forceinline__ void wg_produce_job(const kiln_launch_params &p, const kiln_tma_maps *maps,
                                               const mma_work &w, const wg_tiles<Cfg> &tiles,
                                               const wg_smem<Cfg> &sm, int h, int hk, int tid, int &n,
                                               const QTurn &q_turn, const Filled &filled)
{
    if constexpr (wg_layout<Cfg>::XK) wg_produce_x<Cfg>(p, maps, w, tiles, sm, h, hk, tid, n, q_turn, filled);
    else wg_produce<Cfg>(p, maps, w, tiles, sm, h, hk, tid, n, q_turn, filled);
}

/* Job i of the persistent grid (i below nx x H): its work x and first query head h. Jobs go
 * through sections of p.job_heads job heads (whole KV heads; the host's kiln__job_heads, 0:
 * one section of all H), a section's jobs as (x, head) with heads innermost: so the first
 * wave takes the heaviest tiles (x = 0: the last query tile of a single request, a batch's
 * longest items) of the first section's heads, a KV head's G query heads run side by side,
 * and the CTAs running at once read the K/V of the section's KV heads only, which L2 holds.
 * Every section but the last has job_heads heads. */
template <class Cfg> __device__ __forceinline__ void wg_persist_job(const kiln_launch_params &p, int i, int &x, int &h)
{
    const int H = wg_job_heads<Cfg>(p), sh = p.job_heads;
    int hj;
    if (sh <= 0 || sh >= H) {
        x = i / H;
        hj = i % H;
    } else {
        const int span = wg_nx<Cfg>(p) * sh, s = i / span, h0 = s * sh;
        const int n = H - h0 < sh ? H - h0 : sh, r = i - s * span;
        x = r / n;
        hj = h0 + r % n;
    }
    h = hj * mma_shape<Cfg>::PG;
}

/* Job i's Q rows into L2 (its TMA boxes: no barrier, no shared memory), i past the last job:
 * nothing. The item words it reads are then in cache for mma_load_work. */
template <class Cfg>
__device__ __forceinline__ void wg_prefetch_q(const kiln_launch_params &p, const kiln_tma_maps *maps, int i)
{
    if constexpr (Cfg::LOAD == KILN_WGMMA_LOAD_TMA) {
        constexpr int PG = mma_shape<Cfg>::PG;
        const int H = wg_job_heads<Cfg>(p);
        if (i >= wg_nx<Cfg>(p) * H) return;
        int x, h, row;
        wg_persist_job<Cfg>(p, i, x, h);
        if constexpr (Cfg::KV != KV_CONTIGUOUS) {
            const work_item it = load_item(p, x);
            row = it.q_start + it.m * (KILN_WGMMA_BM / PG);
        } else {
            row = (wg_nx<Cfg>(p) - 1 - x) * (KILN_WGMMA_BM / PG); /* mma_load_work's m_block */
        }
#pragma unroll
        for (int cb = 0; cb < Cfg::D / 64; cb++) tma_prefetch_3d(&maps->q, cb * 64, h, row);
    }
}

/* ---- the consumers ----
 * Two overlaps (FlashAttention-3's): the warpgroups take turns issuing their matrix work (a
 * named barrier each, ping-pong), so that one group's softmax runs while the other's MMAs
 * do; and within a group, S of tile n = Q K^T is issued together with O += P V of tile n - 1,
 * so that the softmax of tile n runs while P V of tile n - 1 is still on the tensor cores. */

/* Q's A fragments of this warpgroup's 64 rows where S takes Q from registers (Q_IN_REGS, at
 * D <= 128: the S instructions then read only K from shared memory, whose bandwidth S Q K^T
 * from two shared-memory operands nearly fills). One array of a single fragment otherwise. */
template <class Cfg> using wg_qfrag = u32[Cfg::Q_IN_REGS ? Cfg::D / 16 : 1][4];

/* Load them from the swizzled Q tile once it has landed: warp w's 16 rows, the m16k16 block of
 * k-step kk by one ldmatrix.x4 (lanes 0-15 address rows 0-15 at columns 0-7, lanes 16-31 the
 * same rows at columns 8-15: registers a0..a3 of the m16n8k16 A fragment). */
template <class Cfg> __device__ __forceinline__ void wg_load_q(wg_qfrag<Cfg> &qf, u32 q_rows, int tid)
{
    if constexpr (Cfg::Q_IN_REGS) {
        const int row = (tid / WARP) % 4 * 16 + tid % 16, half = (tid % WARP) / 16;
#pragma unroll
        for (int kk = 0; kk < Cfg::D / 16; kk++)
            ldmatrix_x4(q_rows + (kk / 4) * KILN_WGMMA_BM * 128 + row * 128 + ((((kk % 4) * 2 + half) ^ (row & 7)) << 4),
                        qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
    }
}

/* Issue S = Q K^T for this warpgroup's 64 rows (q_rows, or qf) and the K tile at k_tile. */
template <class Cfg>
__device__ __forceinline__ void wg_issue_qk(float (&s)[Cfg::BN / 8][4], const wg_qfrag<Cfg> &qf, u32 q_rows, u32 k_tile)
{
    constexpr int D = Cfg::D, BN = Cfg::BN, BM = KILN_WGMMA_BM;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const u64 db = smem_desc(k_tile + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024);
        if constexpr (Cfg::Q_IN_REGS) {
            wgmma_rk<wg_layout<Cfg>::MDT, BN>(s, qf[kk], db, kk > 0);
        } else {
            const u64 da = smem_desc(q_rows + (kk / 4) * BM * 128 + (kk % 4) * 32, 16, 1024);
            wgmma_ss<wg_layout<Cfg>::MDT, BN>(s, da, db, kk > 0);
        }
    }
    wgmma_commit();
}

/* Issue O += P V: P in registers (the A fragments of the softmax'd S), V of the tile at v_tile. */
template <class Cfg>
__device__ __forceinline__ void wg_issue_pv(float (&o)[Cfg::D / 8][4], const u32 (&pf)[Cfg::BN / 16][4], u32 v_tile)
{
    constexpr int BN = Cfg::BN;
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
        wgmma_rs<wg_layout<Cfg>::MDT, Cfg::D>(o, pf[kk], smem_desc(v_tile + kk * 16 * 128, BN * 128, 1024), 1);
    wgmma_commit();
}

/* A soft-cap bounds every logit: |cap tanh(.)| <= cap. Where cap log2(e) <= CAP_REF_MAX, every
 * row's softmax can take the fixed reference m = 0 instead of its running max: P = 2^(t c2)
 * lies in [2^-80, 2^80] (t the tanh, c2 = cap log2(e)), inside f32 and bf16 with room for a
 * sum of 2^20 keys times any |v| below 2^28, far above the flush to zero; the row max, its
 * quad shuffles and the rescale of O go (one instruction an element of about seven soft-cap
 * takes). Caps up to 55 (Gemma 2's 50, Grok's 30) take it; a larger one keeps the running
 * max. A logits snippet is bounded where kiln reads a bound from its form (jit/expand.c
 * logits_bound: `cap * tanhf(...)`; its values, in natural units, c2 = log2(e)); any other
 * snippet keeps the running max. */
constexpr float CAP_REF_MAX = 80.0f;
template <class Cfg> __device__ __forceinline__ bool wg_cap_ref(const kiln_launch_params &p)
{
    if constexpr (Cfg::HAS_LOGITS_EXPR && Cfg::LOGITS_BOUNDED) return Cfg::logits_bound(p) * LOG2E <= CAP_REF_MAX;
    else if constexpr ((Cfg::LOGITS == LOGITS_SOFTCAP || Cfg::LOGITS == LOGITS_SOFTCAP_ALIBI) && !Cfg::HAS_LOGITS_EXPR)
        return p.softcap * LOG2E <= CAP_REF_MAX;
    else return false;
}

/* Logits, mask and the rows' softmax of the S tile of key tile t (O's factor in scale). */
template <class Cfg>
__device__ __forceinline__ void wg_softmax_rows(mma_state<Cfg> &st, float (&sc)[1][Cfg::BN / 8][4],
                                                const kiln_launch_params &p, const mma_work &w,
                                                const mma_rows<Cfg> &rows, const wg_tiles<Cfg> &tiles, float c2,
                                                int hk, int t, int c, int lane, float (&scale)[1][2])
{
    using S = mma_shape<Cfg>;
    const int j0 = t * Cfg::BN;
    /* the element masks unless the map shows this warpgroup every key (a hidden tile that is
     * not skipped, with XJOB, is masked element by element) */
    const bool elem = S::ELEM && tiles.cls(t, c) != TILE_FULL;
    if constexpr (!S::RAW) logits_tile<Cfg>(sc, p, w, rows, k_unit<Cfg>(p), hk, j0, lane);
    if (tile_needs_mask<Cfg>(p, w, elem, j0)) mask_tile<Cfg>(sc, p, w, rows, elem, hk, j0, lane);
    if (wg_cap_ref<Cfg>(p)) { /* the fixed reference: m stays 0 (wg_consume set it) */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            scale[0][r] = 1.f;
            st.l[0][r] += exp2_row(sc[0], r, c2, 0.f);
        }
        return;
    }
    softmax_rows<Cfg, true>(st, sc, c2, scale); /* lazy: mma_attention.cuh, RESCALE_SLACK */
}

/* P, the softmax'd S, as the A fragments of P V. */
template <class Cfg>
__device__ __forceinline__ void wg_to_p(const float (&sc)[Cfg::BN / 8][4], u32 (&pf)[Cfg::BN / 16][4])
{
#pragma unroll
    for (int kk = 0; kk < Cfg::BN / 16; kk++) acc_to_a<wg_layout<Cfg>::MDT>(sc, kk, pf[kk]);
}

/* The turns of the two warpgroups: group c waits on barrier 1 + c, issues, then lets the
 * other go, so that their issues alternate and every arrival on a barrier is waited for
 * before its group arrives there again (a group's next arrival follows its own wait, which
 * needs the other group's pass, which follows that group's wait). The turns run on across a
 * CTA's jobs: group 1 gives group 0 its first turn (wg_turns_begin); each job ends with one
 * more turn each, the last P V's (or none, without tiles), so that group 1's pass after its
 * last P V is group 0's first turn of the next job, which group 0 starts while group 1 still
 * stores; group 0 takes the last one in wg_turns_end. With XJOB a job's last P V is instead
 * part of the next job's first turn where that job has a key tile (wg_consume); both groups
 * go through the same jobs, so their turns still pair. */
__device__ __forceinline__ void wg_turn_wait(int c) { named_sync(1 + c, 2 * 128); }
__device__ __forceinline__ void wg_turn_pass(int c) { named_arrive(2 - c, 2 * 128); }
__device__ __forceinline__ void wg_turns_begin(int c)
{
    if (c == 1) wg_turn_pass(c);
}
__device__ __forceinline__ void wg_turns_end(int c)
{
    if (c == 0) wg_turn_wait(c);
}

/* With PERSIST, the consumers let Q go after the job's last S (tile t the last one): the
 * producer loads the next job's Q under this job's softmax, last P V and store. One job per
 * CTA: nothing waits (and the test would cost a register), Q is let go at the end. */
template <class Cfg>
__device__ __forceinline__ void wg_q_done(const wg_tiles<Cfg> &tiles, const mma_work &w, const wg_smem<Cfg> &sm,
                                          int t)
{
    if (Cfg::PERSIST && tiles.next(t + 1) >= w.t_end) mbar_arrive(sm.q_empty());
}

/* The head of job `it` in the slot, once the producer has put it there (job_full's phase it;
 * h < 0: no more jobs). */
template <class Cfg> __device__ __forceinline__ int wg_slot_head(const wg_smem<Cfg> &sm, int it)
{
    mbar_wait(sm.job_full(), it & 1);
    return ld_shared(sm.job() + 4 * WG_JOB_H);
}

/* ---- the epilogue: O by TMA ----
 * A warpgroup's 64 rows of O go out by TMA stores where they can: a direct result (no split
 * slot), all 64 rows inside the request, O's map there (kiln_launch_params.o_by_tma) and
 * shared memory to stage them in. Each thread writes its normalised, packed accumulators into
 * D / 64 boxes of 64 rows x 128 bytes in the 128-byte swizzle (the map's box layout; the
 * writes are conflict-free: the 8 rows of a warp's store take the 8 chunk positions), fences
 * them for the async proxy, and after a barrier of the warpgroup one thread issues the boxes'
 * stores. Elsewhere store_rows writes O from registers (4 bytes a lane, 16 bytes a row per
 * quad), which measured 8 % of 4 x 4096 causal and 18 % of 16 x 1024 on the H200 (docs/perf/
 * notes.md, session 36). Where O is staged:
 *   - a CTA per job: in the warpgroup's own rows of the Q tile, which only its S read;
 *   - the persistent grid: Q is the next job's by then, so in the K tile of the job's last
 *     stage, once both groups' last S are done (q_empty's phase `it`): with BN >= 128 only (it
 *     holds both groups' boxes; d256's 80-key persistent grid, opt-in and slower, stores from
 *     registers). The stage stays held until the stores have read it: the issuing thread's
 *     arrival on its empty barrier waits for that (wg_release_o), in the next job, under its
 *     first S. */
constexpr int WG_STORE_BAR = 4; /* named barriers 4, 5: the warpgroups' O staging */

/* Where warpgroup c stages O of work w (box cb at base + cb * stride), or base 0: store from
 * registers. last: the job's last stage, -1 without key tiles. */
struct wg_o_stage {
    u32 base, stride;
};
template <class Cfg>
__device__ __forceinline__ wg_o_stage wg_o_stage_at(const kiln_launch_params &p, const mma_work &w,
                                                    const wg_smem<Cfg> &sm, int c, int last)
{
    using L = wg_layout<Cfg>;
    constexpr int BOX = 64 * 128; /* 64 rows x 128 bytes */
    wg_o_stage o = {0, 0};
    if constexpr (Cfg::LOAD == KILN_WGMMA_LOAD_TMA && !Cfg::XJOB && (!Cfg::PERSIST || Cfg::BN >= L::BM)) {
        if (!p.o_by_tma || w.slot >= 0 || last < 0 || w.m0 + (c + 1) * 64 > w.rows_hi) return o;
        if constexpr (Cfg::PERSIST) {
            o.base = sm.k + last * L::TILE + c * (Cfg::D / 64) * BOX;
            o.stride = BOX;
        } else {
            o.base = sm.q + c * BOX;
            o.stride = L::BM * 128;
        }
    }
    return o;
}

/* Normalise this warpgroup's O rows into the staging boxes (and store LSE), then one thread
 * issues the boxes' TMA stores (its bulk group: wg_release_o and the kernel's end wait for it).
 * Returns with the warpgroup's writes done (its barrier). */
template <class Cfg>
__device__ __forceinline__ void wg_store_o_tma(const mma_state<Cfg> &st, const mma_rows<Cfg> &rows,
                                               const kiln_launch_params &p, const kiln_tma_maps *maps,
                                               const mma_work &w, float c2, wg_o_stage o, int c, int h, int tid)
{
    constexpr int D = Cfg::D;
    const int lane = tid % WARP, wr = (tid / WARP) % 4 * 16; /* the warp's first row of the 64 */
    const float vsc = v_unit<Cfg>(p);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float lr = quad_sum(st.l[0][r]);
        const float inv = lr > 0.f ? vsc / lr : 0.f;
        if (Cfg::LSE && lane % 4 == 0) {
            const float lse2 = lr > 0.f ? st.m[0][r] * c2 + log2_fast(lr) : neg_inf();
            reinterpret_cast<float *>(p.lse)[((i64)w.q_start + rows.i[0][r]) * p.num_qo_heads + rows.h[0][r]] =
                lse2 * p.lse_unit;
        }
        const int row = wr + acc_row(lane, r);
        const u32 at = o.base + (u32)(row * 128 + (lane % 4) * 4);
#pragma unroll
        for (int u = 0; u < D / 8; u++) /* columns 8u + 2 (lane % 4), +1: box u / 8, chunk u % 8 */
            st_shared(at + (u32)((u / 8) * o.stride + (((u % 8) ^ (row & 7)) << 4)),
                      (int)pack2<Cfg::OUT_DT>(st.o[0][u][r * 2] * inv, st.o[0][u][r * 2 + 1] * inv));
    }
    fence_proxy_async();
    named_sync(WG_STORE_BAR + c, 128);
    if (tid % 128 == 0) {
#pragma unroll
        for (int cb = 0; cb < D / 64; cb++)
            tma_store_3d(&maps->o, o.base + (u32)(cb * o.stride), cb * 64, h,
                         w.q_start + (w.m0 + c * 64) / mma_shape<Cfg>::PG);
        bulk_commit();
    }
}

/* The persistent grid's held stage (its empty barrier, 0: none): released by the issuing thread
 * once its stores have read the staging boxes. */
__device__ __forceinline__ void wg_release_o(u32 &held)
{
    if (held) {
        bulk_wait_read<0>();
        mbar_arrive(held);
        held = 0;
    }
}

/* What a consumer knows of its next job when one ends (PERSIST: the slot's; one job per CTA:
 * none, h = -1): its head (h < 0: no more jobs), and with XJOB whether S of its first key tile
 * is already in the S registers, issued in one turn with the ended job's last P V. */
struct wg_next {
    int h;
    bool s_ready;
};

/* The key tiles of the job in the slot and its first one (t_first): the slot's other words
 * are read again when the job starts, so that no register holds them across the turn. */
template <class Cfg>
__device__ __forceinline__ wg_tiles<Cfg> wg_slot_tiles(const kiln_launch_params &p, u32 slot, int &t_first)
{
    const mma_work w = wg_job_get(slot);
    t_first = w.t_first;
    return wg_job_tiles<Cfg>(p, w);
}

/* One job (work tile `it`) of the consumers: Q's phase it, K/V tiles from ring count n on.
 * With s_ready, S of its first tile is in sc already (wg_next). With PERSIST it ends by
 * taking the next job from the slot (job_full's phase it + 1); with XJOB, where that job has
 * a key tile, its first S goes in one turn with this job's last P V (P V first: this job's O
 * is stored while that S runs, and the next job's softmax follows; the S registers carry it
 * over, so that no P or O registers live across the jobs). */
template <class Cfg>
__device__ __forceinline__ wg_next wg_consume(const kiln_launch_params &p, const kiln_tma_maps *maps, const mma_work &w,
                                              const wg_tiles<Cfg> &tiles, const wg_smem<Cfg> &sm, int h, int hk,
                                              int tid, int it, int &n, float (&sc)[1][Cfg::BN / 8][4], bool s_ready,
                                              u32 &held)
{
    using L = wg_layout<Cfg>;
    using S = mma_shape<Cfg>;
    constexpr int STAGES = Cfg::STAGES, BN = Cfg::BN;
    static_assert(!Cfg::XJOB || Cfg::PERSIST, "a next job: the persistent grid's");
    const int c = tid / 128 - 1, lane = tid % WARP;
    const int wrow = c * 64 + (tid / WARP) % 4 * 16; /* this warp's first row in the CTA tile */
    mma_rows<Cfg> rows;
    rows.init(p, w.m0, wrow, h, lane);
    mma_state<Cfg> st;
    st.init();
    if (wg_cap_ref<Cfg>(p)) st.m[0][0] = st.m[0][1] = 0.f; /* the soft-cap's fixed reference */
    const float c2 = logits_c2<Cfg>(p, k_unit<Cfg>(p));
    const u32 q_rows = sm.q + c * 64 * 128;
    wg_qfrag<Cfg> qf;
    static_assert(!Cfg::Q_IN_REGS || !Cfg::XJOB, "Q in registers: one job's at a time (jit/config.c)");
    wg_next next = {-1, false};
    bool taken = !Cfg::PERSIST; /* the next job (none with a CTA per job) */

    u32 pf[BN / 16][4]; /* P of the previous tile */
    int last = -1;      /* the stage of the job's last key tile */
    /* A stage's K is let go once this group's S of it is done (where the group skips the
     * tile, once it has landed), its V once the group's P V of it is (wg_smem; without
     * KVSPLIT the one barrier once, with V). The persistent grid stages O in the K tile of the
     * job's last stage (wg_o_stage_at): that K is let go after the store instead (hold_k). */
    const bool hold_k = Cfg::PERSIST && wg_o_stage_at<Cfg>(p, w, sm, c, 0).base != 0;
    auto k_done = [&](int sk, int tk) {
        if (Cfg::KVSPLIT && !(hold_k && tiles.next(tk + 1) >= w.t_end)) mbar_arrive(sm.empty_k(sk));
    };
    /* V of the tile in stage sp (ring count np) landed: before its P V (v_ready: fenced where
     * cp.async wrote it), or before it is let go unread (v_unread). Without KVSPLIT the wait
     * for K's full barrier, and its fence, were V's too */
    auto v_landed = [&](int sp, int np) {
        if (Cfg::KVSPLIT) mbar_wait(sm.full_v(sp), (np / STAGES) & 1);
    };
    auto v_ready = [&](int sp, int np, int tp) {
        v_landed(sp, np);
        if (Cfg::KVSPLIT && !wg_kv_by_tma<Cfg>(p, w, tp)) fence_proxy_async();
    };
    auto v_unread = [&](int sp, int np) {
        v_landed(sp, np);
        mbar_arrive(sm.empty_v(sp));
    };
    if (!s_ready) {
        mbar_wait(sm.q_full(), it & 1);
        wg_load_q<Cfg>(qf, q_rows, tid);
    }
    int t = tiles.next(w.t_first);
    if (t < w.t_end) {
        /* the first tile: S (unless the last job's turn issued it), softmax, P. A tile the
         * map hides from this warpgroup's rows (skip) has no S, softmax or P here (have, below,
         * says no P V follows for it); the group still waits for the tile, takes its turns and
         * frees its stage */
        int s = n % STAGES;
        bool skip = tiles.skip(t, c);
        if (!s_ready) {
            mbar_wait(sm.full_k(s), (n / STAGES) & 1);
            /* the producer's cp.async writes (K, or Q), for the tensor cores */
            if (!wg_q_by_tma<Cfg>(w) || !wg_kv_by_tma<Cfg>(p, w, t)) fence_proxy_async();
            if (skip) {
                k_done(s, t);
                wg_turn_wait(c);
                wg_turn_pass(c);
                wg_release_o(held);
            } else {
                wg_turn_wait(c);
                wgmma_fence();
                wg_issue_qk<Cfg>(sc[0], qf, q_rows, sm.k + s * L::TILE);
                wg_turn_pass(c);
                wg_release_o(held); /* the last job's staged O, read by now */
                wgmma_wait<0>();
                reg_fence(sc[0]);
                k_done(s, t);
            }
        } else {
            k_done(s, t); /* its S, issued in the last job's last turn, is done */
        }
        wg_q_done<Cfg>(tiles, w, sm, t);
        float scale[1][2]; /* O is still zero: its factor is not applied */
        if (!skip) {
            wg_softmax_rows<Cfg>(st, sc, p, w, rows, tiles, c2, hk, t, c, lane, scale);
            wg_to_p<Cfg>(sc[0], pf);
        }
        bool have = !skip; /* P of tile prev is in pf (this warpgroup did not skip it) */
        int prev = s, np = n, tprev = t;
        n++;
        /* each case of (this tile skipped, the last one skipped) is a branch of its own, with
         * its issues, waits and P whole: P V on a condition inside a shared body, or P zeroed
         * to skip one, makes ptxas serialize every wgmma of the kernel (C7520, C7513) */
        for (t = tiles.next(t + 1); t < w.t_end; t = tiles.next(t + 1), n++) {
            s = n % STAGES;
            skip = tiles.skip(t, c);
            mbar_wait(sm.full_k(s), (n / STAGES) & 1);
            if (!wg_kv_by_tma<Cfg>(p, w, t)) fence_proxy_async();
            if (!skip && have) {
                v_ready(prev, np, tprev);
                wg_turn_wait(c);
                wgmma_fence();
                wg_issue_qk<Cfg>(sc[0], qf, q_rows, sm.k + s * L::TILE);
                wg_issue_pv<Cfg>(st.o[0], pf, sm.v + prev * L::TILE);
                wg_turn_pass(c);
                wgmma_wait<1>(); /* S; P V of the previous tile may still run */
                reg_fence(sc[0]);
                k_done(s, t);
                wg_q_done<Cfg>(tiles, w, sm, t);
                wg_softmax_rows<Cfg>(st, sc, p, w, rows, tiles, c2, hk, t, c, lane, scale);
                wgmma_wait<0>(); /* P V of the previous tile: O and its V are free */
                reg_fence(st.o[0]);
                mbar_arrive(sm.empty_v(prev));
                rescale_rows<Cfg, true>(st, scale);
                wg_to_p<Cfg>(sc[0], pf);
            } else if (!skip) { /* S alone: the last tile was skipped */
                wg_turn_wait(c);
                wgmma_fence();
                wg_issue_qk<Cfg>(sc[0], qf, q_rows, sm.k + s * L::TILE);
                wg_turn_pass(c);
                wgmma_wait<0>();
                reg_fence(sc[0]);
                k_done(s, t);
                wg_q_done<Cfg>(tiles, w, sm, t);
                v_unread(prev, np);
                wg_softmax_rows<Cfg>(st, sc, p, w, rows, tiles, c2, hk, t, c, lane, scale);
                rescale_rows<Cfg, true>(st, scale);
                wg_to_p<Cfg>(sc[0], pf);
                have = true;
            } else if (have) { /* P V alone: this tile is skipped */
                k_done(s, t);
                v_ready(prev, np, tprev);
                wg_turn_wait(c);
                wgmma_fence();
                wg_issue_pv<Cfg>(st.o[0], pf, sm.v + prev * L::TILE);
                wg_turn_pass(c);
                wg_q_done<Cfg>(tiles, w, sm, t);
                wgmma_wait<0>();
                reg_fence(st.o[0]);
                mbar_arrive(sm.empty_v(prev));
                have = false;
            } else { /* neither: the turn alone */
                k_done(s, t);
                wg_turn_wait(c);
                wg_turn_pass(c);
                wg_q_done<Cfg>(tiles, w, sm, t);
                v_unread(prev, np);
            }
            prev = s;
            np = n;
            tprev = t;
        }
        if (!Cfg::PERSIST) mbar_arrive(sm.q_empty());
        if constexpr (Cfg::XJOB) { /* the next job, and its first S with this last P V */
            next.h = wg_slot_head(sm, it + 1);
            taken = true;
            int t2 = 0;
            const wg_tiles<Cfg> tiles2 = wg_slot_tiles<Cfg>(p, sm.job(), t2);
            t2 = next.h >= 0 ? tiles2.next(t2) : tiles2.t_end;
            if (t2 < tiles2.t_end) {
                s = n % STAGES; /* the next job's first tile (its K let go in that job) */
                mbar_wait(sm.q_full(), (it + 1) & 1);
                mbar_wait(sm.full_k(s), (n / STAGES) & 1);
                fence_proxy_async();
                v_ready(prev, np, tprev); /* XJOB skips no tile: P of prev is here */
                wg_turn_wait(c);
                wgmma_fence();
                wg_issue_pv<Cfg>(st.o[0], pf, sm.v + prev * L::TILE);
                wg_issue_qk<Cfg>(sc[0], qf, q_rows, sm.k + s * L::TILE);
                wg_turn_pass(c);
                wgmma_wait<1>(); /* this job's O; the next job's S may still run */
                reg_fence(st.o[0]);
                mbar_arrive(sm.empty_v(prev));
                store_rows<Cfg>(st, rows, p, w, c2, wrow, lane);
                wgmma_wait<0>();
                reg_fence(sc[0]);
                next.s_ready = true;
                return next;
            }
        }
        /* P V of the last tile, a turn of its own (the turn alone where it was skipped) */
        if (have) {
            v_ready(prev, np, tprev);
            wg_turn_wait(c);
            wgmma_fence();
            wg_issue_pv<Cfg>(st.o[0], pf, sm.v + prev * L::TILE);
            wg_turn_pass(c);
            wgmma_wait<0>();
            reg_fence(st.o[0]);
        } else {
            v_landed(prev, np); /* let go below, with a used one's */
            wg_turn_wait(c);
            wg_turn_pass(c);
        }
        last = prev;
    } else {
        wg_release_o(held);
        mbar_arrive(sm.q_empty());
        wg_turn_wait(c); /* the job's last turn, without an issue */
        wg_turn_pass(c);
    }
    /* the last V: its P V done, or skipped and landed (without KVSPLIT, where K is held, the
     * one arrival is the held one below) */
    if (last >= 0 && (Cfg::KVSPLIT || !hold_k)) mbar_arrive(sm.empty_v(last));
    const wg_o_stage o = wg_o_stage_at<Cfg>(p, w, sm, c, last);
    if (o.base) {
        if (Cfg::PERSIST) mbar_wait(sm.q_empty(), it & 1); /* both groups' last S: the K tile is free */
        wg_store_o_tma<Cfg>(st, rows, p, maps, w, c2, o, c, h, tid);
        if (Cfg::PERSIST) { /* hold_k: the K tile, once the stores have read it */
            if (tid % 128 == 0) held = sm.empty_k(last);
            else mbar_arrive(sm.empty_k(last));
        }
    } else {
        store_rows<Cfg>(st, rows, p, w, c2, wrow, lane);
    }
    if (!taken) next.h = wg_slot_head(sm, it + 1);
    return next;
}

/* The jobs of a CTA: (work x of nx, query head h). With PERSIST, job i of all nx x H is
 * wg_persist_job's: (x, head) with heads innermost within sections of KV heads whose K/V L2
 * holds, so that the first wave takes the heaviest causal tiles of the first section's heads
 * (x = 0 is the last query tile of a single request, a batch's items are longest first) and a
 * KV head's G query heads run side by side; CTA b takes job b, then its job of
 * each later round (STATIC: wg_static_job), or claims each later one from the schedule's
 * counter (DYNAMIC: the CTA that frees first takes the next). With a CTA per job, CTA i runs
 * job i of a KV-head-major order (wg_flat_job), which the GPU starts in index order. */

/* The (work x, query head h) of job i of a CTA-per-job grid of nx x H: KV head outermost,
 * then x, the KV head's G query heads innermost. So a KV head's heaviest tiles start first,
 * its G query heads side by side on one tile, and the CTAs running at once read one or two KV
 * heads' K/V (L2 holds them). With x innermost (the grid (nx, H) before) each head's heaviest
 * tiles started after every earlier head's lightest, and the last head's ran on alone: 35 %
 * of a 1 x 4096 causal prefill's time at H 8 by a list-scheduling model, 12 % at H 32. Heads
 * innermost (all nx x H jobs as (i / H, i % H)) balanced them (measured on an H200, session
 * 43: 369 -> 549 TFLOP/s at H 8) but ran every KV head at once, and d256 4 x 4096 H 32, whose
 * K/V then streamed past L2, lost 13 %. This order is not yet measured. */
template <class Cfg> __device__ __forceinline__ void wg_flat_job(const kiln_launch_params &p, int i, int &x, int &h)
{
    constexpr int PG = mma_shape<Cfg>::PG, GJ = Cfg::G / PG; /* a KV head's jobs a work tile */
    const int per_hk = (int)gridDim.x / wg_job_heads<Cfg>(p) * GJ; /* the grid's nx x GJ */
    const int hk = i / per_hk, r = i % per_hk;
    x = r / GJ;
    h = hk * Cfg::G + r % GJ * PG;
}

/* The static persistent grid's job of round r (KILN_WGMMA_PERSIST_STATIC): rounds of gridDim.x
 * jobs, taken forwards in even rounds and backwards in odd ones (CTA b: job b, then 2G - 1 - b,
 * 2G + b, ...), so that jobs in decreasing order of weight (the causal tiles, heaviest first)
 * even out across CTAs. A round robin (job b + r G) gives CTA 0 the heaviest job of every round:
 * one causal request of 16384 rows, 8 heads, 128-key tiles, over 132 CTAs puts 564 key tiles on
 * CTA 0 against a mean of 500 (the snake: at most 503; 32 heads: 2064 against 2000, snake 2003). */
__device__ __forceinline__ int wg_static_job(int r)
{
    const int G = (int)gridDim.x, b = (int)blockIdx.x;
    return r * G + (r & 1 ? G - 1 - b : b);
}

/* The dynamic persistent grid's claim counter: a batch's in its schedule (next_job), a single
 * request's after its tile map (kiln_tile_map_counter_at: jit/config.c takes the dynamic grid
 * for kv=contiguous only with element masks, and the launch refuses a run without the map). */
template <class Cfg> __device__ __forceinline__ int *wg_job_counter(const kiln_launch_params &p)
{
    if constexpr (Cfg::KV != KV_CONTIGUOUS) {
        return reinterpret_cast<int *>(p.work) + KILN_WORK_HEADER_NEXT_AT;
    } else {
        static_assert(mma_shape<Cfg>::ELEM, "a single request's counter lives after its tile map");
        const long long rows =
            kiln_tile_map_rows(p.qo_len, mma_shape<Cfg>::PG, kiln_tile_map_bm(KILN_WGMMA_BM, 1));
        return reinterpret_cast<int *>(reinterpret_cast<unsigned char *>(p.tile_map) +
                                       kiln_tile_map_counter_at(rows * p.kv_tiles));
    }
}

/* The persistent producer: for each job, its work (read while the ring still holds the last
 * job's tiles), its first K/V tile, the job slot once the consumers let the last Q go, then Q
 * and the other tiles; at the end a slot with h = -1. Once the job's tiles fill the ring,
 * thread 0 takes the next job and fetches its Q into L2 (wg_prefetch_q), under the wait for
 * a free stage: DYNAMIC claims it, index v + gridDim.x of the counter's value v. Each CTA
 * with a first job claims once per job it runs, the last claim past the end, so a run makes
 * exactly nx x H claims: the one that draws the last value resets the counter (no other
 * claim follows it). */
template <class Cfg>
__device__ __forceinline__ void wg_produce_jobs(const kiln_launch_params &p, const kiln_tma_maps *maps,
                                                const wg_smem<Cfg> &sm, int tid)
{
    /* nx and H are read again where used (a parameter, a schedule word): the producer's
     * registers hold the current job's copies */
    int n = 0; /* K/V tiles through the ring so far */
    for (int i = blockIdx.x, it = 0;; it++) {
        const int H = wg_job_heads<Cfg>(p);
        const bool more = i < wg_nx<Cfg>(p) * H;
        if (!more) { /* the slot's end, once the consumers let the last job's Q go */
            if (it > 0) mbar_wait(sm.q_empty(), (it - 1) & 1);
            if (tid == 0) {
                st_shared(sm.job() + 4 * WG_JOB_H, -1);
                mbar_arrive(sm.job_full());
            }
            return;
        }
        int x, h; /* the job's work and first query head */
        wg_persist_job<Cfg>(p, i, x, h);
        const mma_work w = mma_load_work<Cfg>(p, x, wg_nx<Cfg>(p));
        const u32 next = sm.job() + 4 * (WG_JOB_NEXT + (it & 1));
        wg_produce_job<Cfg>(
            p, maps, w, wg_job_tiles<Cfg>(p, w), sm, h, h / Cfg::G, tid, n,
            [&] { /* the job slot, once the consumers let the last job's Q go */
                if (it > 0) mbar_wait(sm.q_empty(), (it - 1) & 1);
                if (tid == 0) {
                    wg_job_put(sm.job(), w, h);
                    mbar_arrive(sm.job_full());
                }
            },
            [&] { /* the ring is full: the next job, and its Q into L2 */
                if (tid != 0) return;
                int j = wg_static_job(it + 1);
                if constexpr (Cfg::PERSIST == KILN_WGMMA_PERSIST_DYNAMIC) {
                    int *counter = wg_job_counter<Cfg>(p);
                    const int v = atomicAdd(counter, 1);
                    if (v == wg_nx<Cfg>(p) * wg_job_heads<Cfg>(p) - 1) atomicExch(counter, 0);
                    j = v + (int)gridDim.x;
                    st_shared(next, j);
                }
                wg_prefetch_q<Cfg>(p, maps, j);
            });
        if constexpr (Cfg::PERSIST == KILN_WGMMA_PERSIST_DYNAMIC) {
            named_sync(WG_PRODUCER_BAR, KILN_WGMMA_PRODUCER_THREADS);
            i = ld_shared(next);
        } else {
            i = wg_static_job(it + 1);
        }
    }
}

/* The persistent consumers: each job as the slot gives it, until h = -1. */
template <class Cfg>
__device__ __forceinline__ void wg_consume_jobs(const kiln_launch_params &p, const kiln_tma_maps *maps,
                                                const wg_smem<Cfg> &sm, int tid)
{
    const int c = tid / 128 - 1;
    wg_turns_begin(c);
    int n = 0;
    u32 held = 0;                /* a stage held by staged O (wg_release_o) */
    float sc[1][Cfg::BN / 8][4]; /* S, carried into the next job where its first S is issued early */
    wg_next job = {wg_slot_head(sm, 0), false};
    for (int it = 0; job.h >= 0; it++) {
        const mma_work w = wg_job_get(sm.job());
        job = wg_consume<Cfg>(p, maps, w, wg_job_tiles<Cfg>(p, w), sm, job.h, job.h / Cfg::G, tid, it, n, sc,
                              job.s_ready, held);
    }
    wg_release_o(held);
    wg_turns_end(c);
}

template <class Cfg> __device__ void wgmma_attention_kernel(const kiln_launch_params &p, const kiln_tma_maps *maps)
{
    using L = wg_layout<Cfg>;
    extern __shared__ __align__(1024) unsigned char smem[];
    const u32 raw = smem_addr(smem);
    const u32 base = (raw + (KILN_WGMMA_ALIGN - 1)) & ~(u32)(KILN_WGMMA_ALIGN - 1);
    wg_smem<Cfg> sm;
    sm.q = base + L::Q_AT;
    sm.k = base + L::K_AT;
    sm.v = base + L::V_AT;
    sm.raw = base + L::RAW_AT;
    sm.freq = base + L::FREQ_AT;
    sm.bar = base + L::BAR_AT;
    sm.slot = base + L::JOB_AT;

    const int tid = threadIdx.x;
    let_merge_launch<Cfg>(); /* first thing: merge.cuh says why */
    int x = 0, h = 0; /* a CTA per job: its job */
    if constexpr (!Cfg::PERSIST) wg_flat_job<Cfg>(p, (int)blockIdx.x, x, h);
    if (Cfg::KV != KV_CONTIGUOUS && !Cfg::PERSIST && x >= num_items(p)) return; /* padding of a graph-sized grid */
    if (tid == 0) {
        for (int s = 0; s < Cfg::STAGES; s++) {
            mbar_init(sm.full_k(s), L::FULL_COUNT);
            mbar_init(sm.empty_k(s), L::CONSUMERS);
            if (Cfg::KVSPLIT) {
                mbar_init(sm.full_v(s), L::FULL_COUNT);
                mbar_init(sm.empty_v(s), L::CONSUMERS);
            }
        }
        for (int r = 0; r < L::RAW; r++) mbar_init(sm.raw_full(r), L::PRODUCER);
        mbar_init(sm.q_full(), L::PRODUCER);
        mbar_init(sm.q_empty(), L::CONSUMERS);
        mbar_init(sm.job_full(), 1);
        mbar_init_fence();
    }
    if constexpr (Cfg::ROPE) /* the producer's RoPE frequencies, before the barrier */
        for (int d = tid; d < Cfg::D / 2; d += blockDim.x)
            st_shared(sm.freq + 4 * d, __float_as_int(rope_freq(d, Cfg::D, p.rope_rcp_scale, p.rope_log2_theta)));
    __syncthreads();
    /* one branch per role (setmaxnreg), each going through the same jobs */
    if constexpr (Cfg::PERSIST) {
        if (tid < L::PRODUCER) {
            regs_dec<KILN_WGMMA_PRODUCER_REGS>();
            wg_produce_jobs<Cfg>(p, maps, sm, tid);
            cp_async_wait<0>(); /* no copy outlives its thread */
        } else {
            regs_inc<KILN_WGMMA_CONSUMER_REGS>();
            wg_consume_jobs<Cfg>(p, maps, sm, tid);
            bulk_wait<0>(); /* O's stores done before the CTA ends */
        }
    } else { /* a CTA per (tile, head) job, (x, h) above; each role reads the work after its
                setmaxnreg (read before it, the work's registers cost the consumers spills) */
        int n = 0;
        if (tid < L::PRODUCER) {
            regs_dec<KILN_WGMMA_PRODUCER_REGS>();
            const mma_work w = mma_load_work<Cfg>(p, x, wg_nx<Cfg>(p));
            wg_produce_job<Cfg>(p, maps, w, wg_job_tiles<Cfg>(p, w), sm, h, h / Cfg::G, tid, n, [] {}, [] {});
            cp_async_wait<0>();
        } else {
            regs_inc<KILN_WGMMA_CONSUMER_REGS>();
            const mma_work w = mma_load_work<Cfg>(p, x, wg_nx<Cfg>(p));
            const int c = tid / 128 - 1;
            float sc[1][Cfg::BN / 8][4];
            wg_turns_begin(c);
            u32 held = 0;
            wg_consume<Cfg>(p, maps, w, wg_job_tiles<Cfg>(p, w), sm, h, h / Cfg::G, tid, 0, n, sc, false, held);
            wg_turns_end(c);
            bulk_wait<0>(); /* O's stores done before the CTA ends */
        }
    }
}

} /* namespace kiln */

#endif /* KILN_WGMMA_ATTENTION_CUH */
