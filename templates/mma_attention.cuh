/*
 * mma_attention.cuh — attention on tensor cores (mma.sync m16n8k16, f32 accumulate),
 * FlashAttention-2 style: one CTA per (query tile, query head), K/V tiles streamed through a
 * cp.async pipeline, online softmax in registers. One kernel serves single-request prefill,
 * batch prefill and append (kv=ragged / kv=paged, one CTA per planned work item), and, with
 * PACK, kiln's tensor-core decode.
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
 * Per CTA and key tile:  Q [BM, D] . K^T [D, BN] = S [BM, BN] -> logits, mask -> online softmax
 *                        -> P [BM, BN] . V [BN, D] += O [BM, D]  -> rows of o (or a partial).
 *
 * Template parameters (Cfg): D in {64,128,256}; G; DT / OUT_DT in {F16, BF16}; KV_DT (also
 * fp8); KV (kv_layout_id); LOGITS (logits_id); CAUSAL, WINDOW, LSE, ROPE in {0,1}; WARPS; MT
 * m16 tiles per warp; BN keys per tile (multiple of 16); STAGES of the K/V pipeline; Q_IN_REGS
 * keeps Q's fragments in registers; HAS_LOGITS_EXPR / HAS_MASK_EXPR with Cfg::logits_expr /
 * Cfg::mask_expr, the user snippets; MASK_DATA (mask_data_id); MASK_USES_HEAD (the mask
 * snippet reads a head index); FUSED_MERGE in {0,1} (batches: a split CTA's task is merged by
 * its last CTA, merge_task_if_last); PDL in {0,1} (sm_90+: the merge kernel is a programmatic
 * dependent launch, merge.cuh); KSPLIT (the tensor-core decode's key split, below); HX (an
 * item's KV heads on adjacent CTAs, mma_attention_kernel). Element
 * masks (snippet, data) are evaluated per element in
 * every tile unless a tile map from tile_map_kernel (tile_map.cuh) says a tile is hidden
 * (skipped) or fully visible (no element work). BM = WARPS * MT * 16 query rows per CTA.
 *
 * BULK (KILN_TUNE bulk=1; the PACK decode, 16-bit K/V, sm_90): each K and V row of a tile is one
 * cp.async.bulk issued by the row's lane into rows padded to KV_ROW_BYTES (no swizzle), a
 * stage's copies completing its mbarrier, which the consumer waits on instead of cp.async's
 * groups (kv_pipeline). BULK == 2 (bulk=2): a whole tile is TMA boxes issued by thread 0 (a box
 * a page and 64 columns from the paged maps of runtime/tma.c, the kernel's `maps`; ragged, a
 * box a tile and 64 columns), landing in D / 64 blocks of [BN][64] in the 128-byte swizzle; a
 * partial tile goes by cp.async rows into the same layout.
 *
 * PACK (batches only; G divides BM, or for decode G <= BM): one CTA per (query tile, KV head) whose rows are the G
 * query heads of each query token, row R = token R / G, head hk * G + R % G, so every K/V tile
 * is loaded once for the whole group. This is kiln's tensor-core decode (a decode request is
 * one token, its G heads are G rows of the m16 MMA) and an option of batch prefill.
 *
 * KSPLIT > 1 (PACK decode, one row warp, 16-bit or in-register fp8 K/V, no RoPE, no element mask,
 * no fused merge; KILN_TUNE ksplit=): the CTA holds KSPLIT copies of the one-warp kernel, each
 * on a layout of its own (prefill_layout::REGION apart) and on every KSPLIT-th key tile of the
 * work item (warp k: tiles t_first + k, + 2 KSPLIT, ...), synchronised by __syncwarp only; at
 * the end warps 1 .. KSPLIT - 1 leave their softmax states (m, l, O, register for register) in
 * their regions and warp 0 merges them in that order and stores. A split of the keys inside the
 * CTA, with no partial state in global memory: fewer, longer work items than one-warp CTAs need
 * for the same number of warps an SM, and so fewer splits for the merge kernel.
 *
 * Launch: grid (ceil(L_Q / BM), H), WARPS*32*KSPLIT threads, smem kiln_prefill_smem_bytes (params.h; KSPLIT regions)
 * (batches: grid (work items, H); PACK: (work items, H_KV)). A CTA's head scope, the heads of
 * its fused merge, is its blockIdx.y: one query head, or with PACK the G of its KV head.
 *
 * Checked against the float64 CPU reference in tools/check.c (tests/test_gpu.c, kiln check).
 */
#ifndef KILN_MMA_ATTENTION_CUH
#define KILN_MMA_ATTENTION_CUH

#include "common/device.cuh"
#include "common/fragment.cuh"
#include "common/params.h"
#include "common/schedule.cuh"
#include "common/variant.cuh"
#include "merge.cuh"
#include "mma_tiles.cuh"

namespace kiln {

/* The shape of a CTA's work, in the MMA's terms. */
template <class Cfg> struct mma_shape {
    static constexpr int D = Cfg::D, BN = Cfg::BN, BM = prefill_layout<Cfg>::BM, MT = Cfg::MT;
    static constexpr int NT = BN / 8;  /* n8 tiles of S */
    static constexpr int DTN = D / 8;  /* n8 tiles of O */
    static constexpr int KD = D / 16;  /* k16 steps over D */
    static constexpr int PG = Cfg::PACK ? Cfg::G : 1; /* rows per query token */
    static constexpr int ROW_BYTES = D * 2; /* a row of Q (and of converted fp8 K / V tiles) */
    /* a row of the K / V tiles the MMAs read, the distance between their 64-column blocks, and
     * whether chunks are XOR-swizzled: rows of D * 2 bytes, swizzled; bulk=1's copied rows
     * padded instead (prefill_layout::KV_ROW); bulk=2's boxes D / 64 blocks of [BN][64],
     * swizzled (kiln_kv_box_at) */
    static constexpr int KV_ROW_BYTES = Cfg::BULK == 2 ? 128 : kiln_prefill_kv_row_bytes(D, 2, Cfg::BULK);
    static constexpr int KV_COL_BLOCK = Cfg::BULK == 2 ? BN * 128 : 128;
    static constexpr bool KV_SWZ = Cfg::BULK != 1;
    static constexpr bool ELEM = has_element_mask<Cfg>();
    /* With no logits transform the row max is taken on raw q.k (sm_scale > 0 keeps the order)
     * and c2 = sm_scale * log2(e) turns it into exp2 units inside one FFMA per element */
    static constexpr bool RAW = Cfg::LOGITS == LOGITS_NONE && !Cfg::HAS_LOGITS_EXPR;
    static_assert(BN % 16 == 0 && D % 64 == 0, "tile shape");
    /* jit/config.c admits a G that does not divide BM only for decode, whose item is one token */
    static_assert(!Cfg::PACK || ((Cfg::KV != KV_CONTIGUOUS || Cfg::WGMMA) && Cfg::G <= BM),
                  "PACK: batches (a single request too on the wgmma family), G rows fit BM");
};

/* What one CTA covers: a query tile of the single request (heaviest causal tiles first), or
 * one planned work item; and the key tiles [t_first, t_end) it visits. Work x of nx (the
 * CTA's blockIdx.x of gridDim.x, or a persistent CTA's x-th tile of nx). */
struct mma_work {
    int m_block, b, L_Q, L_KV, q_start, kv_start, slot;
    mask_base mb;
    int off;          /* L_KV - L_Q: the diagonal of query row i is key i + off */
    int m0, rows_hi;  /* first (packed) row of the tile, (packed) rows of the request */
    int tq0, tq1;     /* first and last query token of the tile */
    int key_hi;       /* keys at or past it are masked (the item's end) */
    int t_first, t_end;
};

template <class Cfg> __device__ __forceinline__ mma_work mma_load_work(const kiln_launch_params &p, int x, int nx)
{
    using S = mma_shape<Cfg>;
    mma_work w;
    w.b = w.q_start = w.kv_start = 0;
    w.slot = -1;
    w.mb = mask_base{0, 0};
    int it_lo = 0, it_hi;
    if constexpr (Cfg::KV != KV_CONTIGUOUS) {
        const work_item it = load_item(p, x);
        if constexpr (Cfg::MASK_DATA != MASK_DATA_NONE) w.mb = load_req_mask(p, it.b);
        w.b = it.b;
        w.m_block = it.m;
        w.L_Q = it.qo_len;
        w.L_KV = it.kv_len;
        w.q_start = it.q_start;
        w.kv_start = it.kv_start;
        w.slot = it.slot;
        it_lo = it.kv_lo;
        it_hi = it.kv_hi;
    } else {
        w.m_block = nx - 1 - x;
        w.L_Q = p.qo_len;
        w.L_KV = p.kv_len;
        it_hi = w.L_KV;
    }
    w.off = w.L_KV - w.L_Q;
    w.m0 = w.m_block * S::BM;
    w.rows_hi = w.L_Q * S::PG;
    w.tq0 = w.m0 / S::PG;
    w.tq1 = (w.m0 + S::BM - 1) / S::PG;
    int kv_hi = min(w.L_KV, it_hi), kv_lo = it_lo;
    w.key_hi = kv_hi;
    if (Cfg::CAUSAL) kv_hi = min(kv_hi, w.tq1 + 1 + w.off);
    if (Cfg::WINDOW) kv_lo = max(kv_lo, w.tq0 + w.off - p.window_left);
    kv_lo = max(kv_lo, 0);
    w.t_first = kv_lo / S::BN;
    w.t_end = kv_hi > kv_lo ? (kv_hi + S::BN - 1) / S::BN : w.t_first;
    return w;
}

/* The barrier of a CTA's K/V pipeline: the block's, or with the key split (KSPLIT > 1: a
 * one-warp pipeline per warp) the warp's. */
template <class Cfg> __device__ __forceinline__ void pipe_sync()
{
    if constexpr (Cfg::KSPLIT > 1) __syncwarp();
    else __syncthreads();
}

/* The K/V pipeline of a CTA: STAGES tiles in flight (pend[], oldest first; t_next the next to
 * load), tiles the tile map hides skipped, and for paged KV the row-offset table refilled a
 * tile ahead (page_rows). */
template <class Cfg> struct kv_pipeline {
    using L = prefill_layout<Cfg>;
    static constexpr int STAGES = Cfg::STAGES, BN = Cfg::BN, THREADS = L::THREADS;
    static constexpr int STEP = Cfg::KSPLIT; /* the key split's warps take every STEP-th tile */
    unsigned char *k_in, *v_in; /* [STAGES] loaded K, V tiles */
    i64 *tab_s;
    const unsigned char *kg, *vg;
    const int *pages;
    const unsigned char *map; /* this query tile's row of the tile map, or null */
    int t_end, L_KV, tid;
    int pend[STAGES];
    int t_next;
    page_rows<Cfg> pr;
    /* BULK: the stages' mbarriers (bar + 8 s) and the tiles waited for so far: tiles are
     * consumed in stage order, so wait n is for stage n % STAGES, phase parity (n / STAGES) & 1 */
    u32 bar, waits;
    /* BULK == 2: the K and V maps (runtime/tma.c), the CTA's KV head, and (ragged) the request's
     * first row in them */
    const kiln_tma_maps *maps;
    int hk, kv_row0;

    /* BULK == 2: whether tile t goes as TMA boxes (a whole tile; paged, of pages that nest with
     * it: p.kv_box_rows != 0) or by cp.async rows into the same layout (the request's last,
     * partial tile, whose rows past the end are zero-filled; pages that do not nest) */
    __device__ __forceinline__ bool by_boxes(const kiln_launch_params &p, int t) const
    {
        return (t + 1) * BN <= L_KV && (!L::PAGED || p.kv_box_rows != 0);
    }
    /* BULK == 2, one thread: tile t's K and V boxes into stage tiles kd, vd, completing on b.
     * Paged: a box a page (or a tile of a longer page), from the table's page and row of its
     * first key (page_rows::write); a dense pool's pages are rows of one 3-D map. */
    __device__ __forceinline__ void issue_boxes(const kiln_launch_params &p, u32 kd, u32 vd, u32 b, int t) const
    {
        constexpr int D = Cfg::D;
        if constexpr (L::PAGED) {
            const int2 *ids = reinterpret_cast<const int2 *>(tab_s + 2 * BN);
            for (int r = 0; r < BN; r += p.kv_box_rows) {
                const int2 id = ids[r]; /* page, row in it */
#pragma unroll
                for (int cb = 0; cb < D / 64; cb++) {
                    const u32 at = (u32)(cb * BN * 128 + r * 128);
                    if (p.kv_map_rows) {
                        tma_load_3d(kd + at, &maps->k, b, cb * 64, hk, id.x * p.page_size + id.y);
                        tma_load_3d(vd + at, &maps->v, b, cb * 64, hk, id.x * p.page_size + id.y);
                    } else {
                        tma_load_4d(kd + at, &maps->k, b, cb * 64, hk, id.y, id.x);
                        tma_load_4d(vd + at, &maps->v, b, cb * 64, hk, id.y, id.x);
                    }
                }
            }
        } else {
#pragma unroll
            for (int cb = 0; cb < D / 64; cb++) {
                tma_load_3d(kd + (u32)(cb * BN * 128), &maps->k, b, cb * 64, hk, kv_row0 + t * BN);
                tma_load_3d(vd + (u32)(cb * BN * 128), &maps->v, b, cb * 64, hk, kv_row0 + t * BN);
            }
        }
    }

    /* next_tile and issue are plain inline functions, not __forceinline__: inlined late (as
     * the lambdas they replace were), they keep the main loop's SASS and registers as before */
    __device__ __forceinline__ int next_tile(int t) const
    {
        if (mma_shape<Cfg>::ELEM && map)
            while (t < t_end && map[t] == TILE_HIDDEN) t++;
        return t;
    }
    __device__ __forceinline__ void issue(const kiln_launch_params &p, int st, int t)
    {
        if constexpr (L::BULK == 2) {
            const u32 b = bar + 8u * (u32)st;
            unsigned char *kd = k_in + st * L::STAGE_TILE, *vd = v_in + st * L::STAGE_TILE;
            if (by_boxes(p, t)) {
                if (tid == 0) {
                    mbar_arrive_expect_tx(b, (u32)(2 * L::TILE_BYTES));
                    issue_boxes(p, smem_addr(kd), smem_addr(vd), b, t);
                }
            } else { /* the stage's phase completes on the arrival alone; cp.async's wait covers the rows */
                load_kv_rows<Cfg, BN, THREADS>(kd, kg, p.k_stride_n, tab_s, t * BN, L_KV, tid);
                load_kv_rows<Cfg, BN, THREADS>(vd, vg, p.v_stride_n, tab_s + BN, t * BN, L_KV, tid);
                if (tid == 0) mbar_arrive(b);
            }
        } else if constexpr (L::BULK) {
            const u32 b = bar + 8u * (u32)st;
            const int rows = min(BN, L_KV - t * BN);
            if (tid == 0) mbar_arrive_expect_tx(b, (u32)(2 * rows * Cfg::D * L::ES));
            load_kv_rows_bulk<Cfg, BN, THREADS>(k_in + st * L::STAGE_TILE, kg, p.k_stride_n, tab_s, t * BN, L_KV, b,
                                                tid);
            load_kv_rows_bulk<Cfg, BN, THREADS>(v_in + st * L::STAGE_TILE, vg, p.v_stride_n, tab_s + BN, t * BN, L_KV,
                                                b, tid);
        } else {
            load_kv_rows<Cfg, BN, THREADS>(k_in + st * L::STAGE_TILE, kg, p.k_stride_n, tab_s, t * BN, L_KV, tid);
            load_kv_rows<Cfg, BN, THREADS>(v_in + st * L::STAGE_TILE, vg, p.v_stride_n, tab_s + BN, t * BN, L_KV,
                                           tid);
        }
    }
    /* the first STAGES - 1 tiles, then the table of the first tile of the loop and the page ids
     * of the tile after it, whose table the first iteration writes */
    __device__ __forceinline__ void prologue(const kiln_launch_params &p)
    {
        if constexpr (L::BULK) { /* one arrival (the expecting thread's) a phase */
            waits = 0;
            if (tid == 0) {
#pragma unroll
                for (int s = 0; s < STAGES; s++) mbar_init(bar + 8u * (u32)s, 1);
                mbar_init_fence();
            }
            pipe_sync<Cfg>();
        }
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            pend[s] = t_next;
            if (t_next < t_end) {
                if constexpr (L::PAGED) { /* the prologue fills each table in place */
                    pr.page_ids(p, pages, t_next, L_KV, tid);
                    pr.write(tab_s, p, tid);
                    pipe_sync<Cfg>();
                }
                issue(p, s, t_next);
                t_next = next_tile(t_next + STEP);
                if constexpr (L::PAGED) pipe_sync<Cfg>();
            }
            cp_async_commit();
        }
        if constexpr (L::PAGED) {
            if (t_next < t_end) {
                pr.page_ids(p, pages, t_next, L_KV, tid);
                pr.write(tab_s, p, tid);
                pr.page_ids(p, pages, next_tile(t_next + STEP), L_KV, tid);
            }
            pipe_sync<Cfg>();
        }
    }
    /* Issue the next tile into the stage freed last iteration; returns the tile to compute now
     * (t_end or past: the loop is done). */
    __device__ __forceinline__ int issue_next(const kiln_launch_params &p, int idx)
    {
        pend[STAGES - 1] = t_next;
        if (t_next < t_end) {
            issue(p, (idx + STAGES - 1) % STAGES, t_next);
            t_next = next_tile(t_next + STEP);
        }
        cp_async_commit();
        return pend[0];
    }
    /* Wait for the oldest tile; paged: every thread has issued from the table, refill it for
     * the next iteration's tile (the barrier at the end of this iteration publishes it). */
    __device__ __forceinline__ void wait(const kiln_launch_params &p)
    {
        cp_async_wait<STAGES - 1>(); /* BULK too: Q's copies are the first group's */
        if constexpr (L::BULK) {
            mbar_wait(bar + 8u * (waits % STAGES), (int)((waits / STAGES) & 1u));
            waits++;
        }
        /* BULK == 2: rows written by cp.async (the generic proxy) are fenced before a later
         * box (the async proxy) lands in their stage */
        if constexpr (L::BULK == 2)
            if (!by_boxes(p, pend[0])) fence_proxy_async();
        pipe_sync<Cfg>();
        if constexpr (L::PAGED)
            if (t_next < t_end) {
                pr.write(tab_s, p, tid); /* ids loaded an iteration ago */
                pr.page_ids(p, pages, next_tile(t_next + STEP), L_KV, tid);
            }
    }
    __device__ __forceinline__ void retire()
    {
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) pend[s] = pend[s + 1];
    }
};

/* The query token, head and ALiBi slope of each of this lane's accumulator rows (mt, r). */
template <class Cfg> struct mma_rows {
    static constexpr int MT = Cfg::MT;
    int i[MT][2], h[MT][2];
    float slope[MT][2];

    __device__ __forceinline__ void init(const kiln_launch_params &p, int m0, int wrow, int h0, int lane)
    {
        constexpr int PG = mma_shape<Cfg>::PG;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int R = m0 + wrow + mt * 16 + acc_row(lane, r);
                i[mt][r] = R / PG;
                h[mt][r] = h0 + R % PG;
                slope[mt][r] = alibi_slope<Cfg>(p, h[mt][r]);
            }
    }
};

/* ldmatrix addresses. Every row a lane reads has (row & 7) == (lane & 7), and the 16-byte
 * chunk it reads is 8q + (2 rem + b) for a per-operand bit b, so the swizzled chunk is
 * 8q + ((2 rem + b) ^ (lane & 7)): four per-lane offsets per operand, the rest immediates. */
struct mma_addrs {
    u32 q, k, v;
    u32 xq[4], xk[4], xv[4];
};

template <class Cfg>
__device__ __forceinline__ mma_addrs mma_frag_addrs(const u16 *q_s, const void *k_tiles, const void *v_tiles, int wrow,
                                                    int lane)
{
    constexpr int ROW_BYTES = mma_shape<Cfg>::ROW_BYTES, KV_ROW_BYTES = mma_shape<Cfg>::KV_ROW_BYTES;
    const int r7 = lane & 7, kv7 = mma_shape<Cfg>::KV_SWZ ? r7 : 0;
    const int bq = lane >> 4, bk = (lane >> 3) & 1, bv = lane >> 4;
    mma_addrs a;
    a.q = smem_addr(q_s) + (u32)((wrow + (lane & 15)) * ROW_BYTES);
    a.k = smem_addr(k_tiles) + (u32)(((lane >> 4) * 8 + r7) * KV_ROW_BYTES);
    a.v = smem_addr(v_tiles) + (u32)((((lane >> 3) & 1) * 8 + r7) * KV_ROW_BYTES);
#pragma unroll
    for (int rem = 0; rem < 4; rem++) {
        a.xq[rem] = (u32)(((2 * rem + bq) ^ r7) << 4);
        a.xk[rem] = (u32)(((2 * rem + bk) ^ kv7) << 4);
        a.xv[rem] = (u32)(((2 * rem + bv) ^ kv7) << 4);
    }
    return a;
}

/* The online softmax state of this warp's rows: o [MT][DTN] accumulators, row max m and this
 * lane's part of the row sum l (the quad sum completes it at the store). */
template <class Cfg> struct mma_state {
    static constexpr int MT = Cfg::MT, DTN = mma_shape<Cfg>::DTN;
    float o[MT][DTN][4];
    float m[MT][2], l[MT][2];

    __device__ __forceinline__ void init()
    {
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                m[mt][r] = neg_inf();
                l[mt][r] = 0.f;
            }
            fill(o[mt], 0.f);
        }
    }
};

/* Q's A fragments into registers, once (Q_IN_REGS). */
template <class Cfg>
__device__ __forceinline__ void load_q_frags(u32 (&qf)[Cfg::MT][mma_shape<Cfg>::KD][4], const mma_addrs &a)
{
    using S = mma_shape<Cfg>;
#pragma unroll
    for (int mt = 0; mt < S::MT; mt++)
#pragma unroll
        for (int kk = 0; kk < S::KD; kk++)
            ldmatrix_x4(a.q + mt * 16 * S::ROW_BYTES + (kk >> 2) * 128 + a.xq[kk & 3], qf[mt][kk][0], qf[mt][kk][1],
                        qf[mt][kk][2], qf[mt][kk][3]);
}

/* S = Q K^T for this warp's rows and the BN keys of the K tile at ks. */
template <class Cfg, class QF>
__device__ __forceinline__ void qk_tile(float (&s)[Cfg::MT][mma_shape<Cfg>::NT][4], const QF &qf, const mma_addrs &a,
                                        u32 ks)
{
    using S = mma_shape<Cfg>;
    constexpr int MT = S::MT, NT = S::NT, KD = S::KD, ROW_BYTES = S::ROW_BYTES, DT = Cfg::DT;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) fill(s[mt], 0.f);
    /* Fully unrolled, the scheduler hoists every K fragment load and runs out of
     * registers at MT=2; with Q in registers the kk index must stay compile-time. */
#pragma unroll(Cfg::Q_IN_REGS ? KD / 4 : 1)
    for (int kq = 0; kq < KD / 4; kq++)
#pragma unroll
    for (int rem = 0; rem < 4; rem++) {
        const int kk = kq * 4 + rem;
        u32 af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if (Cfg::Q_IN_REGS) {
#pragma unroll
                for (int e = 0; e < 4; e++) af[mt][e] = qf[Cfg::Q_IN_REGS ? mt : 0][Cfg::Q_IN_REGS ? kk : 0][e];
            } else {
                ldmatrix_x4(a.q + mt * 16 * ROW_BYTES + kq * 128 + a.xq[rem], af[mt][0], af[mt][1], af[mt][2],
                            af[mt][3]);
            }
        }
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            u32 b0, b1, b2, b3;
            ldmatrix_x4(ks + np * 16 * S::KV_ROW_BYTES + kq * S::KV_COL_BLOCK + a.xk[rem], b0, b1, b2, b3);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma16816<DT>(s[mt][2 * np], af[mt], b0, b1);
                mma16816<DT>(s[mt][2 * np + 1], af[mt], b2, b3);
            }
        }
    }
}

/* ---- fp8 in registers (prefill_layout::F8R: the packed rows, fp8 K/V, no RoPE) ----
 * The MMAs take fp8 K and V straight from the loaded (kiln_f8_swz-swizzled) tiles: each lane reads
 * 16-byte runs of bytes and widens them in registers (fp8x4_f16), with no converted tile and
 * no block barrier between load and use. The MMAs run in f16 whatever q's type (fp8 fits f16;
 * bf16 q is rounded to f16 times 2^-8, f8_q_unit, exact for |q| in [2^-9, 2^24), and P in
 * [0, 1] keeps 3 more bits than in bf16). A dot product does not care in which order its terms
 * come, so the fragments permute what they hold instead of shuffling bytes:
 *  - Q K^T: lane (g = lane / 4, c = lane % 4) of k16 step kk reads bytes o .. o + 3 of K row g,
 *    o = 16 (c + 4 (kk / 4)) + 4 (kk % 4), as its B registers (o, o + 1) and (o + 2, o + 3);
 *    its Q registers hold those d of rows g and g + 8 (q_frag_f8).
 *  - P V: the lane's B registers pair the keys of P's columns 2c, 2c + 1 (and + 8) at one d, so
 *    it reads one run of d from each of its 4 key rows and pairs their bytes (byte_perm); its
 *    n8 block dn is d = kiln_f8_d(D, dn, n) for O column n (lane g reads d 16 g .. 16 g + 15,
 *    and 128 + ... at D 256; 8 g .. 8 g + 7 at D 64), which store_rows maps back. */

/* The factor bf16 q takes on its way to f16 (and K's scale gives back). */
template <class Cfg> __device__ __forceinline__ constexpr float f8_q_unit()
{
    return Cfg::DT == BF16 ? 1.0f / 256.0f : 1.0f;
}

/* This lane's shared-memory offsets into an F8R K tile (xk[G]: byte group G of row g, before
 * the n8 block's row) and V tile (xv[e]: row 2c + e's run of d). */
struct f8_addrs {
    u32 xk[4], xv[2];
};

template <class Cfg> __device__ __forceinline__ f8_addrs f8_frag_addrs(int lane)
{
    f8_addrs a;
#pragma unroll
    for (int G = 0; G < 4; G++) a.xk[G] = (u32)kiln_f8_k_off(Cfg::D, lane, G);
#pragma unroll
    for (int e = 0; e < 2; e++) a.xv[e] = (u32)kiln_f8_v_off(Cfg::D, lane, e);
    return a;
}

/* Two q values (a packed DT pair) as the f16 pair the F8R MMAs take. */
template <class Cfg> __device__ __forceinline__ u32 q_pair_f16(u32 w)
{
    if constexpr (Cfg::DT == F16) {
        return w;
    } else {
        float lo, hi;
        unpack2<BF16>(w, lo, hi);
        return pack2<F16>(lo * f8_q_unit<Cfg>(), hi * f8_q_unit<Cfg>());
    }
}

/* Q's A fragment of k16 step kk for the m16 block at row `row0` of the Q tile, in the F8R
 * order: a0 / a1 = d (o, o + 1) of rows g / g + 8, a2 / a3 = d (o + 2, o + 3). */
template <class Cfg>
__device__ __forceinline__ void q_frag_f8(const u16 *q_s, int row0, int kk, int lane, u32 (&f)[4])
{
    constexpr int D = Cfg::D;
    const int g = lane / 4, o = kiln_f8_qk_d(lane, kk);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + g + 8 * r;
        const uint2 w = lds64(smem_addr(q_s + swz<D>(row, o / 8) + o % 8));
        f[r] = q_pair_f16<Cfg>(w.x);
        f[2 + r] = q_pair_f16<Cfg>(w.y);
    }
}

template <class Cfg>
__device__ __forceinline__ void load_q_frags_f8(u32 (&qf)[Cfg::MT][mma_shape<Cfg>::KD][4], const u16 *q_s, int wrow,
                                                int lane)
{
#pragma unroll
    for (int mt = 0; mt < Cfg::MT; mt++)
#pragma unroll
        for (int kk = 0; kk < mma_shape<Cfg>::KD; kk++) q_frag_f8<Cfg>(q_s, wrow + mt * 16, kk, lane, qf[mt][kk]);
}

__device__ __forceinline__ u32 word_of(const uint4 &w, int i)
{
    return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
}

/* S = Q K^T from the fp8 K tile at ks (F8R). */
template <class Cfg, class QF>
__device__ __forceinline__ void qk_tile_f8(float (&s)[Cfg::MT][mma_shape<Cfg>::NT][4], const QF &qf, const u16 *q_s,
                                           const f8_addrs &a, u32 ks, int wrow, int lane)
{
    using S = mma_shape<Cfg>;
    constexpr int MT = S::MT, NT = S::NT, D = Cfg::D;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) fill(s[mt], 0.f);
#pragma unroll
    for (int G = 0; G < D / 64; G++) {
        uint4 w[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) w[nt] = lds128(ks + (u32)(nt * 8 * D) + a.xk[G]);
#pragma unroll
        for (int kq = 0; kq < 4; kq++) {
            const int kk = 4 * G + kq;
            u32 af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if constexpr (Cfg::Q_IN_REGS) {
#pragma unroll
                    for (int e = 0; e < 4; e++) af[mt][e] = qf[Cfg::Q_IN_REGS ? mt : 0][Cfg::Q_IN_REGS ? kk : 0][e];
                } else {
                    q_frag_f8<Cfg>(q_s, wrow + mt * 16, kk, lane, af[mt]);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                u32 b0, b1;
                fp8x4_f16<Cfg::KV_DT>(word_of(w[nt], kq), b0, b1);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) mma16816<F16>(s[mt][nt], af[mt], b0, b1);
            }
        }
    }
}

/* O += P V from the fp8 V tile at vs (F8R). */
template <class Cfg>
__device__ __forceinline__ void pv_tile_f8(mma_state<Cfg> &st, const float (&s)[Cfg::MT][mma_shape<Cfg>::NT][4],
                                           const f8_addrs &a, u32 vs)
{
    using S = mma_shape<Cfg>;
    constexpr int MT = S::MT, D = Cfg::D;
    constexpr int RUNS = D == 256 ? 2 : 1, WORDS = D == 64 ? 2 : 4; /* 16-byte runs a row, words a run */
#pragma unroll
    for (int kk = 0; kk < Cfg::BN / 16; kk++) {
        u32 af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) acc_to_a<F16>(s[mt], kk, af[mt]);
#pragma unroll
        for (int run = 0; run < RUNS; run++) {
            /* keys 2c, 2c + 1, 2c + 8, 2c + 9 of this k16 step: P's columns of the lane */
            u32 wv[4][4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const u32 at = vs + (u32)((16 * kk + 8 * (i >> 1)) * D + run * 128) + a.xv[i & 1];
                if constexpr (WORDS == 4) {
                    const uint4 w = lds128(at);
                    wv[i][0] = w.x, wv[i][1] = w.y, wv[i][2] = w.z, wv[i][3] = w.w;
                } else {
                    const uint2 w = lds64(at);
                    wv[i][0] = w.x, wv[i][1] = w.y;
                }
            }
#pragma unroll
            for (int q = 0; q < WORDS; q++) {
                /* byte u of the word, of keys (2c, 2c + 1) and of (2c + 8, 2c + 9), as pairs */
                u32 b0[4], b1[4];
                fp8x4_f16<Cfg::KV_DT>(__byte_perm(wv[0][q], wv[1][q], 0x5140), b0[0], b0[1]);
                fp8x4_f16<Cfg::KV_DT>(__byte_perm(wv[0][q], wv[1][q], 0x7362), b0[2], b0[3]);
                fp8x4_f16<Cfg::KV_DT>(__byte_perm(wv[2][q], wv[3][q], 0x5140), b1[0], b1[1]);
                fp8x4_f16<Cfg::KV_DT>(__byte_perm(wv[2][q], wv[3][q], 0x7362), b1[2], b1[3]);
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int dn = run * 16 + q * 4 + u;
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) mma16816<F16>(st.o[mt][dn], af[mt], b0[u], b1[u]);
                }
            }
        }
    }
}

/* The factor c2 that takes S, as the logits pass leaves it, into exp2 units inside the
 * softmax's one FFMA per element (exp2(S c2 - m c2)): with no transform S is the raw q.k and c2
 * sm_scale log2(e) (times the fp8 K unit ksc); a builtin transform without a snippet leaves S
 * in units of its own (logits_tile: soft-cap tanh's, c2 = cap log2(e); ALiBi natural, c2 =
 * log2(e)); a snippet leaves it in natural units too (logit_scaled), c2 = log2(e), but one
 * whose output factor B kiln folded (jit/expand.c, logits_fold) leaves S = the snippet / |B|,
 * c2 = |B| log2(e). Every c2 > 0 keeps the order, so the row max is taken on S as it is. */
template <class Cfg> __device__ __forceinline__ float logits_c2(const kiln_launch_params &p, float ksc)
{
    if constexpr (mma_shape<Cfg>::RAW) return p.sm_scale * LOG2E * ksc;
    else if constexpr (Cfg::HAS_LOGITS_EXPR && Cfg::LOGITS_OUTER)
        return fmaxf(fabsf(Cfg::logits_outer(p)) * LOG2E, 1.17549435e-38f); /* > 0: -inf stays -inf */
    else if constexpr (Cfg::HAS_LOGITS_EXPR) return LOG2E;
    else if constexpr (Cfg::LOGITS == LOGITS_SOFTCAP || Cfg::LOGITS == LOGITS_SOFTCAP_ALIBI) return p.softcap * LOG2E;
    else return LOG2E;
}

/* Logits: the variant's transform of every element of S, keys from j0, into the units
 * logits_c2 names. A builtin transform without a snippet takes two instructions an element
 * (the softmax's exp2 units in c2): soft-cap tanh(q.k a), a = ksc sm_scale / cap; ALiBi
 * q.k a + slope rel, rel = rel_0 + (the element's column in the lane's quad: a constant), so
 * that no element converts an integer (an I2F costs what an exp2 does); with both, tanh of
 * the sum, ALiBi inside the tanh (logit_nat's order). A snippet: logit_tiled of q.k a, a =
 * ksc sm_scale (one multiply before the snippet's own work; times the snippet's own input
 * factor where kiln folded it), natural units. */
template <class Cfg>
__device__ __forceinline__ void logits_tile(float (&s)[Cfg::MT][mma_shape<Cfg>::NT][4], const kiln_launch_params &p,
                                            const mma_work &w, const mma_rows<Cfg> &rows, float ksc, int hk, int j0,
                                            int lane)
{
    using S = mma_shape<Cfg>;
    if constexpr (!Cfg::HAS_LOGITS_EXPR) {
        constexpr bool CAP = Cfg::LOGITS == LOGITS_SOFTCAP || Cfg::LOGITS == LOGITS_SOFTCAP_ALIBI;
        constexpr bool ALI = Cfg::LOGITS == LOGITS_ALIBI || Cfg::LOGITS == LOGITS_SOFTCAP_ALIBI;
        const float a = CAP ? ksc * p.sm_scale / p.softcap : ksc * p.sm_scale;
#pragma unroll
        for (int mt = 0; mt < S::MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float sl = rows.slope[mt][r];
                /* slope times the distance of the lane's first column from the row's diagonal */
                const float sb = ALI ? sl * (float)(j0 + acc_col(lane, 0, 0) - (rows.i[mt][r] + w.L_KV - w.L_Q)) : 0.f;
#pragma unroll
                for (int nt = 0; nt < S::NT; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        float &x = s[mt][nt][r * 2 + c];
                        const float y = ALI ? fmaf(x, a, fmaf(sl, (float)(nt * 8 + c), sb)) : x * a;
                        x = CAP ? tanh_fast(y) : y;
                    }
            }
    } else {
        float a = ksc * p.sm_scale;
        if constexpr (Cfg::LOGITS_PRE) a *= Cfg::logits_pre(p);
#pragma unroll
        for (int mt = 0; mt < S::MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int nt = 0; nt < S::NT; nt++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int j = j0 + acc_col(lane, nt, c);
                        float &x = s[mt][nt][r * 2 + c];
                        x = logit_tiled<Cfg>(x * a, p, rows.slope[mt][r], rows.i[mt][r], j, rows.h[mt][r], hk,
                                             w.b, w.L_Q, w.L_KV);
                    }
        if constexpr (Cfg::LOGITS_OUTER) /* c2 took |outer| (logits_c2): the sign goes here */
            if (Cfg::logits_outer(p) < 0.f) {
#pragma unroll
                for (int mt = 0; mt < S::MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < S::NT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[mt][nt][e] = -s[mt][nt][e];
            }
    }
}

/* Whether the key tile at j0 needs the mask pass: element masks in a mixed tile, or the
 * tile crosses the item's end, the causal diagonal or the window's edge. */
template <class Cfg>
__device__ __forceinline__ bool tile_needs_mask(const kiln_launch_params &p, const mma_work &w, bool elem, int j0)
{
    constexpr int BN = Cfg::BN;
    return elem || j0 + BN > w.key_hi || (Cfg::CAUSAL && j0 + BN - 1 > w.tq0 + w.off) ||
           (Cfg::WINDOW && j0 < w.tq1 + w.off - p.window_left);
}

/* The mask: hidden elements of S to -inf (builtin masks, then the element masks when elem).
 * BSR mask data whose blocks are at least two keys wide (a tile spans at most 64 column blocks)
 * reads each row's blocks of the tile once (bsr_row_bits) and tests a bit per element. */
template <class Cfg>
__device__ __forceinline__ void mask_tile(float (&s)[Cfg::MT][mma_shape<Cfg>::NT][4], const kiln_launch_params &p,
                                          const mma_work &w, const mma_rows<Cfg> &rows, bool elem, int hk, int j0,
                                          int lane)
{
    using S = mma_shape<Cfg>;
    constexpr bool BSR = Cfg::MASK_DATA == MASK_DATA_BSR;
    const int cb0 = BSR ? j0 / p.bsr_c : 0;
    const bool by_bits = BSR && S::ELEM && elem && (j0 + Cfg::BN - 1) / p.bsr_c - cb0 < 64;
#pragma unroll
    for (int mt = 0; mt < S::MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int i = rows.i[mt][r], hr = rows.h[mt][r];
            /* rows past the request read no mask data (below) */
            const unsigned long long bits = by_bits && i < w.L_Q ? bsr_row_bits(p, w.mb, i, cb0) : 0;
            /* the row's keys the builtin masks leave, as columns past this thread's first one
             * (col0): [lo, hi], so that an element tests its constant column offset against
             * them (two compares with immediates) instead of its key against three bounds */
            const int col0 = j0 + acc_col(lane, 0, 0);
            int hi = w.key_hi - 1 - col0;
            if (Cfg::CAUSAL) hi = min(hi, i + w.off - col0);
            const int lo = Cfg::WINDOW ? i + w.off - p.window_left - col0 : 0;
#pragma unroll
            for (int nt = 0; nt < S::NT; nt++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int dc = acc_col(0, nt, c), j = col0 + dc;
                    bool vis = dc <= hi;
                    if (Cfg::WINDOW) vis = vis && dc >= lo;
                    /* rows past the request (a partial tile) never read the mask data or
                     * the snippet: a BSR row block past the last one reads indptr past its
                     * end, and its garbage bounds sent the search anywhere (CUDA error 717 /
                     * 700 under torch's allocator); those rows are never stored */
                    if (S::ELEM && elem)
                        vis = vis && i < w.L_Q &&
                              (by_bits ? (bits >> (j / p.bsr_c - cb0)) & 1
                                       : mask_data<Cfg>(p, w.mb, w.L_KV, i, j)) &&
                              mask_user<Cfg>(p, i, j, hr, hk, w.b, w.L_Q, w.L_KV);
                    if (!vis) s[mt][nt][r * 2 + c] = neg_inf();
                }
        }
}

/* How far (log2 units) a row's max may pass the reference m of its state before a lazy
 * softmax (the wgmma family's) re-bases the state on it: until then P = exp2(S c2 - m c2) and
 * l grow by at most 2^RESCALE_SLACK (exact in f32, P's 16-bit rounding relative), the
 * normalisation by l at the end is the same, and O is not rescaled: most tiles after the first
 * pass no row's reference by that much. Measured on the H200 (docs/perf/notes.md, session 35):
 * +0.6-1 % on causal wgmma prefill, neutral non-causal; the one-warp packed decode was 1 %
 * slower at B1 x 4096 with it, so the mma.sync families keep the exact running max. */
constexpr float RESCALE_SLACK = 8.0f;

/* Online softmax, the rows' part: per row the new reference max (the running max; with LAZY
 * re-based only when the tile's max passes it by more than RESCALE_SLACK, and always from
 * -inf), S -> P = exp2(S c2 - m c2) in place, the row sum; scale[mt][r] is the factor O must
 * take for the new reference (rescale_rows; with LAZY exactly 1 where it stays). */
template <class Cfg, bool LAZY = false>
__device__ __forceinline__ void softmax_rows(mma_state<Cfg> &st, float (&s)[Cfg::MT][mma_shape<Cfg>::NT][4], float c2,
                                             float (&scale)[Cfg::MT][2])
{
#pragma unroll
    for (int mt = 0; mt < Cfg::MT; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float m_tile = row_max(s[mt], r), m_old = st.m[mt][r];
            /* LAZY from -inf: +inf > slack; both -inf: NaN, false (the row stays hidden) */
            const float m_new = LAZY ? ((m_tile - m_old) * c2 > RESCALE_SLACK ? m_tile : m_old) : max_f(m_old, m_tile);
            const float m_use = m_new == neg_inf() ? 0.f : m_new; /* a hidden row: keep exp2 finite */
            const float m_scaled = m_use * c2;
            scale[mt][r] = LAZY && m_new == m_old ? 1.f : exp2_fast((m_old - m_use) * c2);
            st.m[mt][r] = m_new;
            const float rsum = exp2_row(s[mt], r, c2, m_scaled);
            st.l[mt][r] = st.l[mt][r] * scale[mt][r] + rsum;
        }
    }
}

/* O *= scale, row by row; with LAZY nothing when no row of the warp was re-based. */
template <class Cfg, bool LAZY = false>
__device__ __forceinline__ void rescale_rows(mma_state<Cfg> &st, const float (&scale)[Cfg::MT][2])
{
    if constexpr (LAZY) {
        bool any = false;
#pragma unroll
        for (int mt = 0; mt < Cfg::MT; mt++) any = any || scale[mt][0] != 1.f || scale[mt][1] != 1.f;
        if (!__any_sync(0xffffffffu, any)) return;
    }
#pragma unroll
    for (int mt = 0; mt < Cfg::MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) scale_row(st.o[mt], r, scale[mt][r]);
}

/* Online softmax: the rows' new max, P and sum, then the state rescaled. */
template <class Cfg>
__device__ __forceinline__ void online_softmax(mma_state<Cfg> &st, float (&s)[Cfg::MT][mma_shape<Cfg>::NT][4],
                                               float c2)
{
    float scale[Cfg::MT][2];
    softmax_rows<Cfg>(st, s, c2, scale);
    rescale_rows<Cfg>(st, scale);
}

/* O += P V: P's accumulator layout is the A-fragment layout of the next MMA. */
template <class Cfg>
__device__ __forceinline__ void pv_tile(mma_state<Cfg> &st, const float (&s)[Cfg::MT][mma_shape<Cfg>::NT][4],
                                        const mma_addrs &a, u32 vs)
{
    using S = mma_shape<Cfg>;
    constexpr int MT = S::MT, DTN = S::DTN, KV_ROW_BYTES = S::KV_ROW_BYTES, DT = Cfg::DT;
#pragma unroll
    for (int kk = 0; kk < Cfg::BN / 16; kk++) {
        u32 af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) acc_to_a<DT>(s[mt], kk, af[mt]);
#pragma unroll
        for (int dp = 0; dp < DTN / 2; dp++) {
            u32 b0, b1, b2, b3;
            ldmatrix_x4_trans(vs + kk * 16 * KV_ROW_BYTES + (dp >> 2) * S::KV_COL_BLOCK + a.xv[dp & 3], b0, b1, b2, b3);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma16816<DT>(st.o[mt][2 * dp], af[mt], b0, b1);
                mma16816<DT>(st.o[mt][2 * dp + 1], af[mt], b2, b3);
            }
        }
    }
}

/* Pair u (0 .. DTN - 1) of row r of this lane's O accumulators: columns d, d + 1 of O (the
 * return) with values x, y. F8R: n8 blocks dn, dn + 1 of one column (kiln_f8_d); else one block's two
 * columns. */
template <class Cfg>
__device__ __forceinline__ int o_pair(const float (&o)[mma_shape<Cfg>::DTN][4], int r, int u, int lane, float &x,
                                      float &y)
{
    if constexpr (prefill_layout<Cfg>::F8R) {
        const int e = u & 1, dn = u & ~1;
        x = o[dn][r * 2 + e];
        y = o[dn + 1][r * 2 + e];
        return kiln_f8_d(Cfg::D, dn, (lane % 4) * 2 + e);
    } else {
        x = o[u][r * 2];
        y = o[u][r * 2 + 1];
        return acc_col(lane, u, 0);
    }
}

/* O's factor: V's scale, in the units of its converted tiles (16-bit V: the scale itself,
 * FlashInfer's v_scale, 1 by default). */
template <class Cfg> __device__ __forceinline__ float v_unit(const kiln_launch_params &p)
{
    using L = prefill_layout<Cfg>;
    return !L::FP8 ? p.v_scale : L::F8P ? p.v_scale / f8_pair_unit<Cfg::KV_DT>() : p.v_scale;
}

/* S's factor: K's scale, in the units of its converted tiles and q's (F8P with bf16 q: f16
 * q times f8_q_unit); it joins c2 or the logits transform's input. */
template <class Cfg> __device__ __forceinline__ float k_unit(const kiln_launch_params &p)
{
    using L = prefill_layout<Cfg>;
    return !L::FP8 ? 1.0f : L::F8P ? p.k_scale / (f8_pair_unit<Cfg::KV_DT>() * f8_q_unit<Cfg>()) : p.k_scale;
}

/* Normalise and store: o rows (and lse) directly, or a partial state of the item's slot. */
template <class Cfg>
__device__ __forceinline__ void store_rows(const mma_state<Cfg> &st, const mma_rows<Cfg> &rows,
                                           const kiln_launch_params &p, const mma_work &w, float c2, int wrow,
                                           int lane)
{
    using S = mma_shape<Cfg>;
    constexpr int D = Cfg::D;
    u16 *og = reinterpret_cast<u16 *>(p.o) + (i64)w.q_start * p.o_stride_n;
    const float vsc = v_unit<Cfg>(p);
#pragma unroll
    for (int mt = 0; mt < Cfg::MT; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float lr = quad_sum(st.l[mt][r]);
            const float inv = lr > 0.f ? vsc / lr : 0.f;
            const int i = rows.i[mt][r], hr = rows.h[mt][r];
            const bool in = w.m0 + wrow + mt * 16 + acc_row(lane, r) < w.rows_hi;
            const float lse2 = lr > 0.f ? st.m[mt][r] * c2 + log2_fast(lr) : neg_inf();
            if (in && w.slot < 0) {
                u16 *orow = og + (i64)i * p.o_stride_n + (i64)hr * p.o_stride_h;
#pragma unroll
                for (int u = 0; u < S::DTN; u++) {
                    float x, y;
                    const int d = o_pair<Cfg>(st.o[mt], r, u, lane, x, y);
                    *reinterpret_cast<u32 *>(orow + d) = pack2<Cfg::OUT_DT>(x * inv, y * inv);
                }
                if (Cfg::LSE && lane % 4 == 0)
                    reinterpret_cast<float *>(p.lse)[((i64)w.q_start + i) * p.num_qo_heads + hr] = lse2 * p.lse_unit;
            } else if (in) { /* slot rows are the tile's query tokens */
                const i64 at = ((i64)w.slot * p.num_qo_heads + hr) * p.slot_rows + (i - w.tq0);
                float *prow = reinterpret_cast<float *>(p.partial_o) + at * D;
#pragma unroll
                for (int u = 0; u < S::DTN; u++) {
                    float2 f2;
                    const int d = o_pair<Cfg>(st.o[mt], r, u, lane, f2.x, f2.y);
                    f2.x *= inv;
                    f2.y *= inv;
                    *reinterpret_cast<float2 *>(prow + d) = f2;
                }
                if (lane % 4 == 0) reinterpret_cast<float *>(p.partial_lse)[at] = lse2;
            }
        }
    }
}

/* The key split's end (KSPLIT > 1): warps 1 .. KSPLIT - 1 leave their states in their own
 * regions (every pipeline has drained: cp_async_wait<0> before the block barrier), warp 0 takes
 * them in that order into its own and goes on to store; the others are done (false). Lane i of
 * every warp holds the same rows and columns (the same fragments), so the merge is register
 * for register: per row the larger reference max, both sides rescaled to it (exp2 of -inf is
 * 0: a warp with no keys adds nothing), l (the lane's part of the row sum) and O alike. */
template <class Cfg>
__device__ __forceinline__ bool ksplit_merge(mma_state<Cfg> &st, unsigned char *smem_all, int ks, float c2, int lane)
{
    using L = prefill_layout<Cfg>;
    constexpr int MT = Cfg::MT, DTN = mma_shape<Cfg>::DTN, WORDS = MT * 4 + MT * DTN * 4;
    static_assert(WORDS * 32 * 4 <= L::BYTES, "a state fits its pipeline's region");
    __syncthreads();
    if (ks > 0) {
        float *x = reinterpret_cast<float *>(smem_all + ks * L::REGION) + lane;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                x[32 * (mt * 2 + r)] = st.m[mt][r];
                x[32 * (MT * 2 + mt * 2 + r)] = st.l[mt][r];
            }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int dn = 0; dn < DTN; dn++)
#pragma unroll
                for (int e = 0; e < 4; e++) x[32 * (MT * 4 + (mt * DTN + dn) * 4 + e)] = st.o[mt][dn][e];
    }
    __syncthreads();
    if (ks > 0) return false;
    for (int k = 1; k < Cfg::KSPLIT; k++) {
        const float *x = reinterpret_cast<const float *>(smem_all + k * L::REGION) + lane;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float mb = x[32 * (mt * 2 + r)], lb = x[32 * (MT * 2 + mt * 2 + r)];
                const float ma = st.m[mt][r], m = max_f(ma, mb);
                const float mu = m == neg_inf() ? 0.f : m;
                const float sa = exp2_fast((ma - mu) * c2), sb = exp2_fast((mb - mu) * c2);
                st.m[mt][r] = m;
                st.l[mt][r] = st.l[mt][r] * sa + lb * sb;
#pragma unroll
                for (int dn = 0; dn < DTN; dn++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        const int e = r * 2 + c;
                        st.o[mt][dn][e] = st.o[mt][dn][e] * sa + x[32 * (MT * 4 + (mt * DTN + dn) * 4 + e)] * sb;
                    }
            }
    }
    return true;
}

template <class Cfg> __device__ void mma_attention_kernel(const kiln_launch_params &p, const kiln_tma_maps *maps = nullptr)
{
    using L = prefill_layout<Cfg>;
    using S = mma_shape<Cfg>;
    constexpr int D = Cfg::D, BN = Cfg::BN, MT = Cfg::MT, STAGES = Cfg::STAGES, THREADS = L::THREADS;
    constexpr int ES = L::ES;
    constexpr bool CONV = L::FP8 && !L::F8R; /* the MMAs read converted tiles */
    constexpr bool BATCH = Cfg::KV != KV_CONTIGUOUS, XFORM = CONV || Cfg::ROPE;

    constexpr int KSPLIT = Cfg::KSPLIT;
    static_assert(KSPLIT == 1 || (Cfg::PACK && Cfg::WARPS == 1 && !XFORM && !mma_shape<Cfg>::ELEM && !Cfg::FUSED_MERGE),
                  "the key split: the one-warp packed decode, no transform, element mask or fused merge");

    static_assert(!Cfg::BULK || (Cfg::PACK && BATCH && !XFORM && !L::F8R && THREADS >= BN),
                  "BULK: the packed batch decode's 16-bit K/V, a row a thread");
    static_assert(Cfg::BULK != 2 || Cfg::D % 64 == 0, "BULK 2: 64-column boxes");

    /* ks: this thread's pipeline (the key split's warp; 0 without it), tid its thread in it */
    const int ks = KSPLIT > 1 ? (int)threadIdx.x / THREADS : 0;
    const int tid = KSPLIT > 1 ? (int)threadIdx.x % THREADS : (int)threadIdx.x, warp = tid / WARP, lane = tid % WARP;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    /* BULK == 2: from the window's first 1024-byte boundary (kiln_prefill_align_bytes) */
    unsigned char *smem_all =
        Cfg::BULK == 2 ? smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u) : smem_raw;
    unsigned char *smem = smem_all + ks * L::REGION;            /* this pipeline's layout */
    u16 *q_s = reinterpret_cast<u16 *>(smem);
    unsigned char *k_in = smem + L::K_AT;                       /* [STAGES] loaded K tiles */
    unsigned char *v_in = smem + L::V_AT;                       /* [STAGES] loaded V tiles */
    u16 *kc_s = reinterpret_cast<u16 *>(smem + L::CONV_AT);     /* fp8: converted K, V */
    u16 *vc_s = kc_s + BN * D;
    float *freq_s = reinterpret_cast<float *>(smem + L::FREQ_AT);

    /* the CTA's work item cx and head scope cy: blockIdx.x and .y, or with HX (KILN_TUNE hx=1,
     * PACK batches without the fused merge, whose counters go by blockIdx.y) the KV heads of an
     * item on adjacent CTAs in the order CTAs are dispatched (blockIdx.x fastest), so the CTAs
     * reading one page's rows run at once */
    constexpr bool HX = Cfg::HX;
    static_assert(!HX || (Cfg::PACK && BATCH && !Cfg::FUSED_MERGE), "HX: PACK batches, no fused merge");
    const int lin = (int)(blockIdx.y * gridDim.x + blockIdx.x);
    const int cx = HX ? lin / (int)gridDim.y : (int)blockIdx.x;
    const int cy = HX ? lin % (int)gridDim.y : (int)blockIdx.y;
    /* h is the CTA's (PACK: first) query head */
    const int hk = Cfg::PACK ? cy : cy / Cfg::G;
    const int h = Cfg::PACK ? hk * Cfg::G : cy;
    let_merge_launch<Cfg>(); /* first thing: merge.cuh says why */
    if (BATCH && cx >= num_items(p)) return; /* padding of a graph-sized grid */
    const mma_work w = mma_load_work<Cfg>(p, cx, gridDim.x);

    const u16 *qg = reinterpret_cast<const u16 *>(p.q) + (i64)w.q_start * p.q_stride_n + (i64)h * p.q_stride_h;
    const unsigned char *kg = reinterpret_cast<const unsigned char *>(p.k) + (i64)hk * p.k_stride_h * ES;
    const unsigned char *vg = reinterpret_cast<const unsigned char *>(p.v) + (i64)hk * p.v_stride_h * ES;
    if constexpr (Cfg::KV == KV_RAGGED) { /* ragged: the request's rows start at kv_start */
        kg += (i64)w.kv_start * p.k_stride_n * ES;
        vg += (i64)w.kv_start * p.v_stride_n * ES;
    }
    const int rope_off = Cfg::ROPE && BATCH && p.rope_offsets ? reinterpret_cast<const int *>(p.rope_offsets)[w.b] : 0;
    if constexpr (Cfg::ROPE) {
        for (int d = tid; d < D / 2; d += THREADS) freq_s[d] = rope_freq(d, D, p.rope_rcp_scale, p.rope_log2_theta);
        /* the first barrier of the main loop orders these writes before any read */
    }
    /* fp8 K: its scale joins the raw product (c2, or the transform's input); F8R's pairs and
     * f16 q carry their own units */
    const float ksc = k_unit<Cfg>(p);
    const float c2 = logits_c2<Cfg>(p, ksc);

    kv_pipeline<Cfg> pipe;
    pipe.k_in = k_in;
    pipe.v_in = v_in;
    pipe.tab_s = reinterpret_cast<i64 *>(smem + L::TAB_AT);
    pipe.kg = kg;
    pipe.vg = vg;
    pipe.pages = L::PAGED ? reinterpret_cast<const int *>(p.kv_indices) + w.kv_start : nullptr;
    pipe.map = S::ELEM && p.tile_map ? reinterpret_cast<const unsigned char *>(p.tile_map) + (i64)w.m_block * p.kv_tiles
                                     : nullptr;
    pipe.t_end = w.t_end;
    pipe.L_KV = w.L_KV;
    pipe.tid = tid;
    pipe.t_next = pipe.next_tile(w.t_first + ks);
    pipe.bar = smem_addr(smem + L::BAR_AT);
    pipe.maps = maps;
    pipe.hk = hk;
    pipe.kv_row0 = Cfg::KV == KV_RAGGED ? w.kv_start : 0;
    load_q_tile<Cfg>(q_s, qg, p, w.m0, w.L_Q, tid);
    pipe.prologue(p);

    const int wrow = warp * MT * 16; /* this warp's first row in the CTA tile */
    mma_rows<Cfg> rows;
    rows.init(p, w.m0, wrow, h, lane);
    /* converted fp8 is read from its one buffer, the rest from the pipeline's stages */
    const mma_addrs a = mma_frag_addrs<Cfg>(q_s, CONV ? (void *)kc_s : (void *)k_in, CONV ? (void *)vc_s : (void *)v_in,
                                            wrow, lane);
    const f8_addrs a8 = f8_frag_addrs<Cfg>(lane);
    u32 qf[Cfg::Q_IN_REGS ? MT : 1][Cfg::Q_IN_REGS ? S::KD : 1][4];
    mma_state<Cfg> st;
    st.init();

    for (int idx = 0;; idx++) {
        const int t = pipe.issue_next(p, idx);
        if (t >= w.t_end) break;
        pipe.wait(p);
        if constexpr (XFORM) { /* RoPE of Q (once), fp8 / RoPE of this K/V tile */
            if (Cfg::ROPE && idx == 0) rope_q_tile<Cfg>(q_s, freq_s, w.m0, w.off + rope_off, tid);
            const int sti = idx % STAGES;
            u16 *kdst = CONV ? kc_s : reinterpret_cast<u16 *>(k_in + sti * L::STAGE_TILE);
            prefill_transform<Cfg, THREADS>(k_in + sti * L::STAGE_TILE, v_in + sti * L::STAGE_TILE, kdst, vc_s, freq_s,
                                            t * BN, rope_off, tid);
            __syncthreads();
        }
        if constexpr (Cfg::Q_IN_REGS)
            if (idx == 0) {
                if constexpr (L::F8R) load_q_frags_f8<Cfg>(qf, q_s, wrow, lane);
                else load_q_frags<Cfg>(qf, a);
            }
        const u32 stage = CONV ? 0u : (u32)((idx % STAGES) * L::STAGE_TILE);

        float s[MT][S::NT][4];
        if constexpr (L::F8R) qk_tile_f8<Cfg>(s, qf, q_s, a8, smem_addr(k_in) + stage, wrow, lane);
        else qk_tile<Cfg>(s, qf, a, a.k + stage);
        const int j0 = t * BN;
        const bool elem = S::ELEM && (!pipe.map || pipe.map[t] == TILE_MIXED);
        /* The transform, then the mask in a pass of its own behind a warp-uniform branch:
         * interleaved with the row max, the compiler predicated the mask's compares and
         * selects into every tile (about 200 instructions per tile and warp) instead of only
         * the few tiles that need them. */
        if constexpr (!S::RAW) logits_tile<Cfg>(s, p, w, rows, ksc, hk, j0, lane);
        if (tile_needs_mask<Cfg>(p, w, elem, j0)) mask_tile<Cfg>(s, p, w, rows, elem, hk, j0, lane);
        online_softmax<Cfg>(st, s, c2);
        if constexpr (L::F8R) pv_tile_f8<Cfg>(st, s, a8, smem_addr(v_in) + stage);
        else pv_tile<Cfg>(st, s, a, a.v + stage);
        pipe_sync<Cfg>(); /* the stage read here is refilled by the next iteration */
        pipe.retire();
    }
    cp_async_wait<0>();
    if constexpr (KSPLIT > 1)
        if (!ksplit_merge<Cfg>(st, smem_all, ks, c2, lane)) return;
    store_rows<Cfg>(st, rows, p, w, c2, wrow, lane);
    if constexpr (BATCH && Cfg::FUSED_MERGE)
        if (w.slot >= 0) merge_task_if_last<Cfg, S::PG, THREADS / WARP>(p, load_item(p, cx).task, h);
}

} /* namespace kiln */

#endif /* KILN_MMA_ATTENTION_CUH */
