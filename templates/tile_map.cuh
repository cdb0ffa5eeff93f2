/*
 * tile_map.cuh — the tile map of a prefill's element masks (kiln_prefill_mask_plan): one byte
 * per (query tile, key tile) of the tensor-core kernel (mma_attention.cuh), a tile_class_id
 * (params.h): TILE_HIDDEN, no key visible under the builtin and element masks (the tile is
 * skipped); TILE_FULL, the element masks show every in-range key (only builtin masks remain);
 * TILE_MIXED otherwise. A mask snippet that reads qo_head or kv_head is evaluated for every
 * head.
 *
 * Shapes: tile_map u8 [ceil(L_Q PG / BM)][kv_tiles], BM = kiln_tile_map_bm (the CTA's rows, or
 * a wgmma consumer warpgroup's 64), PG rows a token (G with PACK, else 1); with the wgmma
 * family's dynamic persistent grid on a single request, its job counter after the map
 * (kiln_tile_map_counter_at), written 0 here. Launch: grid (map rows, key tiles), any thread
 * count (KILN__TILE_MAP_THREADS). Checked by the prefill tests with and without a map.
 */
#ifndef KILN_TILE_MAP_CUH
#define KILN_TILE_MAP_CUH

#include "common/device.cuh"
#include "common/params.h"
#include "common/variant.cuh"
#include "mma_tiles.cuh"

namespace kiln {

template <class Cfg> __device__ void tile_map_kernel(const kiln_launch_params &p)
{
    /* a map row's query tokens: BM rows, or with PACK (the wgmma family's) BM / G tokens of G
     * rows each; the map is the same for every head, so a packed row reads its token's */
    constexpr int BM = kiln_tile_map_bm(prefill_layout<Cfg>::BM, Cfg::WGMMA) / (Cfg::PACK ? Cfg::G : 1);
    constexpr int BN = Cfg::BN;
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
        reinterpret_cast<unsigned char *>(p.tile_map)[(i64)mb * p.kv_tiles + t] =
            !any ? TILE_HIDDEN : all ? TILE_FULL : TILE_MIXED;
    /* a single request's dynamic persistent grid claims its jobs from the int after the map */
    if constexpr (Cfg::WGMMA && Cfg::KV == KV_CONTIGUOUS) {
        if constexpr (Cfg::PERSIST == KILN_WGMMA_PERSIST_DYNAMIC)
            if (mb == 0 && t == 0 && threadIdx.x == 0)
                *reinterpret_cast<int *>(reinterpret_cast<unsigned char *>(p.tile_map) +
                                         kiln_tile_map_counter_at((i64)gridDim.x * p.kv_tiles)) = 0;
    }
}

} /* namespace kiln */

#endif /* KILN_TILE_MAP_CUH */
