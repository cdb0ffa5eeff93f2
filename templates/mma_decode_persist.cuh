/*
 * mma_decode_persist.cuh — kiln's tensor-core batch decode (mma_attention.cuh with PACK: the G
 * query heads of a token packed as rows of the m16 MMA) on a persistent grid, whose K/V ring
 * runs on from one work item to the next (KILN_TUNE persist=1; opt-in, see jit/config.c).
 *
 * With a CTA per item (mma_attention_kernel) every item fills the cp.async ring from empty and
 * drains it at its end, and a batch of many short items (B256 x 512: four waves of CTAs of 16
 * key tiles) pays that at every wave. Here CTA (x, hk) runs items x, x + gridDim.x, ... of the
 * schedule for KV head hk, and its feed issues the next item's Q and first K/V tiles while the
 * compute finishes this item's last ones:
 *
 *   feed:    ... K/V item i (last tiles) | Q + K/V item i+1 (first tiles) ...   (a ring of STAGES)
 *   compute: ... tiles of item i, store item i's rows | Q frags, tiles of item i+1 ...
 *
 * Per item the math is mma_attention_kernel's (the same stage functions over the same
 * accumulators: qk_tile, mask_tile, online_softmax, pv_tile, store_rows), so each item's bits
 * are the ones a CTA per item writes. One Q tile in shared memory: the feed issues an item's Q
 * only once the compute has taken the previous one into registers (Q_IN_REGS); until then it
 * waits, issuing nothing. An item with no key tiles (an empty request) is stored as o = 0,
 * lse = -inf without a Q or a tile.
 *
 * Cfg as mma_attention.cuh's, with PACK, Q_IN_REGS, 16-bit K/V, no RoPE, no fused merge (a
 * split item writes its partial state; the merge kernel merges them). Launch: grid
 * (min(items, persistent bound), H_KV), Cfg::WARPS * 32 threads, kiln_prefill_smem_bytes; the
 * items are read from the schedule (num_items), so one captured launch serves any later
 * schedule within the plan's bound.
 *
 * Checked against the float64 CPU reference and bit for bit against mma_attention_kernel in
 * tests/test_batch.c (gpu_batch_decode_persist).
 */
#ifndef KILN_MMA_DECODE_PERSIST_CUH
#define KILN_MMA_DECODE_PERSIST_CUH

#include "mma_attention.cuh"

namespace kiln {

/* The feed: the item whose tiles are being issued, the ring's counts, and the page ids of the
 * next tile to issue (loaded an issue ahead, as kv_pipeline does, so that no issue waits on a
 * page-table read). */
template <class Cfg> struct dp_feed {
    using L = prefill_layout<Cfg>;
    static constexpr int BN = Cfg::BN, STAGES = Cfg::STAGES, THREADS = L::THREADS;
    int x;                  /* the item being issued (>= num_items: none left) */
    int t, t_end;           /* its next tile, and its end */
    int L_KV, kv_start;     /* its keys, and where they start (ragged row, paged index) */
    bool q_issued;          /* its Q tile is issued */
    int issued;             /* tiles issued so far (tile n sits in stage n % STAGES) */
    page_rows<Cfg> pr;      /* paged: the page ids of tile t of item x */

    /* Take item x (its record read from the schedule; no tiles when x is past the end). */
    __device__ __forceinline__ void take(const kiln_launch_params &p, int nx, int x_, int tid)
    {
        x = x_;
        q_issued = false;
        if (x >= nx) {
            t = t_end = 0;
            return;
        }
        const mma_work w = mma_load_work<Cfg>(p, x, nx);
        t = w.t_first;
        t_end = w.t_end;
        L_KV = w.L_KV;
        kv_start = w.kv_start;
        if constexpr (L::PAGED)
            if (t < t_end) pr.page_ids(p, reinterpret_cast<const int *>(p.kv_indices) + kv_start, t, L_KV, tid);
    }

    /* Issue the next tile (and, first, its item's Q) into the ring, moving past items with no
     * tiles; false when nothing can be issued: no items left, the ring full (computed: tiles
     * the compute is done with), or a Q the compute has not taken (q_pending). One cp.async
     * group per tile issued. */
    __device__ __forceinline__ bool issue(const kiln_launch_params &p, int nx, int step, int computed,
                                          bool &q_pending, u16 *q_s, unsigned char *k_in, unsigned char *v_in,
                                          i64 *tab_s, const unsigned char *kbase, const unsigned char *vbase, int h,
                                          int tid)
    {
        while (x < nx && t >= t_end) take(p, nx, x + step, tid); /* an empty item: nothing to load */
        if (x >= nx || issued - computed >= STAGES) return false;
        if (!q_issued) {
            if (q_pending) return false; /* the one Q tile still holds the compute's next item */
            const mma_work w = mma_load_work<Cfg>(p, x, nx);
            const u16 *qg = reinterpret_cast<const u16 *>(p.q) + (i64)w.q_start * p.q_stride_n +
                            (i64)h * p.q_stride_h;
            load_q_tile<Cfg>(q_s, qg, p, w.m0, w.L_Q, tid);
            q_issued = true;
            q_pending = true;
        }
        const unsigned char *kg = kbase, *vg = vbase;
        if constexpr (Cfg::KV == KV_RAGGED) {
            kg += (i64)kv_start * p.k_stride_n * L::ES;
            vg += (i64)kv_start * p.v_stride_n * L::ES;
        }
        if constexpr (L::PAGED) { /* this tile's row offsets, read by every thread's copies */
            pr.write(tab_s, p, tid);
            __syncthreads();
        }
        const int s = issued % STAGES;
        load_kv_rows<Cfg, BN, THREADS>(k_in + s * L::STAGE_TILE, kg, p.k_stride_n, tab_s, t * BN, L_KV, tid);
        load_kv_rows<Cfg, BN, THREADS>(v_in + s * L::STAGE_TILE, vg, p.v_stride_n, tab_s + BN, t * BN, L_KV, tid);
        cp_async_commit();
        issued++;
        t++;
        if constexpr (L::PAGED) {
            __syncthreads(); /* every thread's copies have read the table before it is rewritten */
            if (t < t_end) pr.page_ids(p, reinterpret_cast<const int *>(p.kv_indices) + kv_start, t, L_KV, tid);
        }
        return true;
    }
};

/* Wait for the cp.async group of the oldest tile not yet computed: `ahead` groups were
 * committed after it (0 .. STAGES - 1). */
template <int STAGES> __device__ __forceinline__ void dp_wait_oldest(int ahead)
{
    static_assert(STAGES >= 1 && STAGES <= 4, "ring depth");
    if (STAGES > 3 && ahead >= 3) cp_async_wait<(STAGES > 3 ? 3 : 0)>();
    else if (STAGES > 2 && ahead >= 2) cp_async_wait<(STAGES > 2 ? 2 : 0)>();
    else if (STAGES > 1 && ahead >= 1) cp_async_wait<(STAGES > 1 ? 1 : 0)>();
    else cp_async_wait<0>();
}

template <class Cfg> __device__ void mma_decode_persist_kernel(const kiln_launch_params &p)
{
    using L = prefill_layout<Cfg>;
    using S = mma_shape<Cfg>;
    constexpr int STAGES = Cfg::STAGES, MT = Cfg::MT;
    static_assert(Cfg::PACK && Cfg::KV != KV_CONTIGUOUS && Cfg::Q_IN_REGS && !L::FP8 && !Cfg::ROPE && !Cfg::BULK &&
                      !Cfg::FUSED_MERGE && !S::ELEM,
                  "the persistent decode: packed rows, a batch, Q in registers, 16-bit K/V, no RoPE, no bulk "
                  "loads, no fused merge, no element mask");

    extern __shared__ __align__(128) unsigned char smem[];
    u16 *q_s = reinterpret_cast<u16 *>(smem);
    unsigned char *k_in = smem + L::K_AT, *v_in = smem + L::V_AT;
    i64 *tab_s = reinterpret_cast<i64 *>(smem + L::TAB_AT);

    const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;
    const int hk = (int)blockIdx.y, h = hk * Cfg::G; /* the CTA's KV head, its first query head */
    let_merge_launch<Cfg>(); /* first thing: merge.cuh says why */
    const int nx = num_items(p), step = (int)gridDim.x;
    const unsigned char *kbase = reinterpret_cast<const unsigned char *>(p.k) + (i64)hk * p.k_stride_h * L::ES;
    const unsigned char *vbase = reinterpret_cast<const unsigned char *>(p.v) + (i64)hk * p.v_stride_h * L::ES;
    const float c2 = logits_c2<Cfg>(p, 1.0f);
    const int wrow = warp * MT * 16; /* this warp's first row in the CTA tile */
    const mma_addrs a = mma_frag_addrs<Cfg>(q_s, k_in, v_in, wrow, lane);

    dp_feed<Cfg> feed;
    feed.issued = 0;
    feed.take(p, nx, (int)blockIdx.x, tid);
    bool q_pending = false; /* a Q tile issued that the compute has not taken into registers */
    int computed = 0;       /* tiles the compute is done with */
    auto top_up = [&] { /* the ring as full as it may be */
        while (feed.issue(p, nx, step, computed, q_pending, q_s, k_in, v_in, tab_s, kbase, vbase, h, tid)) {
        }
    };

    for (int x = (int)blockIdx.x; x < nx; x += step) {
        const mma_work w = mma_load_work<Cfg>(p, x, nx);
        mma_rows<Cfg> rows;
        rows.init(p, w.m0, wrow, h, lane);
        mma_state<Cfg> st;
        st.init();
        u32 qf[MT][S::KD][4];
        for (int t = w.t_first; t < w.t_end; t++) {
            top_up(); /* this tile is issued by now: the feed issues tiles in this order */
            dp_wait_oldest<STAGES>(feed.issued - computed - 1);
            __syncthreads();
            if (t == w.t_first) { /* this item's Q, issued with its first tile */
                load_q_frags<Cfg>(qf, a);
                q_pending = false;
            }
            const u32 stage = (u32)((computed % STAGES) * L::STAGE_TILE);
            float s[MT][S::NT][4];
            qk_tile<Cfg>(s, qf, a, a.k + stage);
            const int j0 = t * Cfg::BN;
            if constexpr (!S::RAW) logits_tile<Cfg>(s, p, w, rows, 1.0f, hk, j0, lane);
            if (tile_needs_mask<Cfg>(p, w, false, j0)) mask_tile<Cfg>(s, p, w, rows, false, hk, j0, lane);
            online_softmax<Cfg>(st, s, c2);
            pv_tile<Cfg>(st, s, a, a.v + stage);
            __syncthreads(); /* the stage read here may be refilled by the next issue */
            computed++;
        }
        /* the next item's first tiles go out before this item's rows are stored */
        top_up();
        store_rows<Cfg>(st, rows, p, w, c2, wrow, lane);
    }
    cp_async_wait<0>(); /* no copy outlives its thread */
}

} /* namespace kiln */

#endif /* KILN_MMA_DECODE_PERSIST_CUH */
