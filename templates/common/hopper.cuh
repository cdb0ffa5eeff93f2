/*
 * hopper.cuh — the sm_90a vocabulary of the warp-specialized kernels: shared-memory matrix
 * descriptors of the 128-byte swizzle, the wgmma fences and groups, shared-memory words by
 * address, mbarriers (the producer / consumer handshake of a shared-memory ring), TMA and bulk
 * copies, named barriers, register reallocation (setmaxnreg) and the async-proxy fence. The
 * wgmma and setmaxnreg forms require --gpu-architecture=sm_90a, the rest sm_90; the mma.sync
 * kernels include it for their bulk loads (BULK), and a function no kernel calls is not
 * compiled for any arch.
 *
 * The 128-byte swizzled tile (kiln_kv_box_at in params.h gives a chunk's offset): a [rows][64]
 * block of 16-bit elements, 128 bytes a row, its 16-byte chunk c of row r stored at chunk
 * c ^ (r % 8); a [rows][D] matrix is D / 64 such blocks one after another. The block base must be 1024-byte aligned (the swizzle is
 * taken from address bits 4-6 and 7-9).
 */
#ifndef KILN_HOPPER_CUH
#define KILN_HOPPER_CUH

#include "common/device.cuh"

namespace kiln {

/* ---- matrix descriptors ----
 * bits 0-13 start address / 16, 16-29 leading byte offset / 16, 32-45 stride byte offset / 16,
 * 62-63 swizzle (1: 128 bytes). K-major (S = Q K^T): rows 128 bytes apart, 8-row groups 1024
 * apart (stride), the leading offset unused. N-major (V of P V): 8 keys a 1024-byte group
 * (stride), the next 64 columns one block further (leading: rows * 128). */
__device__ __forceinline__ u64 smem_desc(u32 addr, u32 lead, u32 stride)
{
    return (u64)((addr & 0x3ffff) >> 4) | ((u64)((lead >> 4) & 0x3fff) << 16) |
           ((u64)((stride >> 4) & 0x3fff) << 32) | (1ull << 62);
}

/* ---- wgmma groups ---- */
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Pin the accumulators in place across a wait: no access moves over it. */
template <int NT> __device__ __forceinline__ void reg_fence(float (&d)[NT][4])
{
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[i][e])::"memory");
}

/* ---- shared-memory words by address (a slot the warpgroups hand over, no generic pointer) ---- */
__device__ __forceinline__ void st_shared(u32 at, int v)
{
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_shared(u32 at)
{
    int v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(at) : "memory");
    return v;
}

/* ---- mbarriers ---- */
__device__ __forceinline__ void mbar_init(u32 bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
/* make the initialised barriers visible to the other threads and to the async proxy */
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(u32 bar)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
/* An arrival on bar once this thread's earlier cp.async copies have landed (counted in the
 * barrier's expected arrivals: .noinc). The copies are generic-proxy writes: a reader that
 * hands them to wgmma fences them first (fence_proxy_async after its wait). */
__device__ __forceinline__ void cp_async_arrive(u32 bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
/* Arrive on bar and add `bytes` to the transaction count of its phase (the bytes the TMA
 * copies that complete on it will write). */
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/* TMA: the box at (c0, c1, c2) of the 3-D tensor map (a __grid_constant__ parameter's address)
 * into shared memory at dst, completing `box bytes` of bar's transactions. */
__device__ __forceinline__ void tma_load_3d(u32 dst, const void *map, u32 bar, int c0, int c1, int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}
/* The same from a 4-D tensor map (a paged cache: D, head, row in page, page). */
__device__ __forceinline__ void tma_load_4d(u32 dst, const void *map, u32 bar, int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
/* A bulk copy without a tensor map: `bytes` (a multiple of 16; both addresses 16-byte aligned)
 * from global src into shared memory at dst, completing `bytes` of bar's transactions. sm_90. */
__device__ __forceinline__ void bulk_load(u32 dst, const void *src, u32 bytes, u32 bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
/* Fetch the box at (c0, c1, c2) of a 3-D tensor map into L2 only (no barrier, no shared
 * memory): a later TMA of the box then reads L2 instead of DRAM. */
__device__ __forceinline__ void tma_prefetch_3d(const void *map, int c0, int c1, int c2)
{
    asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(map), "r"(c0),
                 "r"(c1), "r"(c2)
                 : "memory");
}
/* TMA store: the box at (c0, c1, c2) of the 3-D tensor map from shared memory at src, in this
 * thread's bulk async-group (commit it with bulk_commit). The shared memory was written by the
 * generic proxy: each writer fences it (fence_proxy_async) before the barrier that precedes
 * this. */
__device__ __forceinline__ void tma_store_3d(const void *map, u32 src, int c0, int c1, int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* Wait until at most N of this thread's bulk groups still read their shared memory (.read: the
 * source may be written again), or, bulk_wait, are still incomplete (the global writes done). */
template <int N> __device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }
/* Wait until the phase of the given parity has completed. */
__device__ __forceinline__ void mbar_wait(u32 bar, int parity)
{
    asm volatile("{\n.reg .pred done;\nWAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

/* ---- fences and barriers ---- */
/* order this thread's generic-proxy shared-memory writes before async-proxy reads (wgmma) */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* a barrier among `threads` threads of the CTA, by id (0 is __syncthreads') */
__device__ __forceinline__ void named_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* arrive at barrier id without waiting: `threads` counts the arrivals and the waiters */
__device__ __forceinline__ void named_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* ---- register reallocation (one branch per warpgroup role) ---- */
template <int R> __device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R> __device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }

} /* namespace kiln */

#endif /* KILN_HOPPER_CUH */
