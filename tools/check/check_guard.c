/*
 * check_guard.c — guarded device buffers for the check library. A guarded buffer's last byte
 * is the last mapped byte before a reserved granule that is never mapped, so a kernel that
 * reads even one element past the buffer faults (CUDA_ERROR_ILLEGAL_ADDRESS, reported at the
 * next synchronisation) instead of reading whatever an allocator left beside it. The checks
 * upload mask data (bitmask, BSR arrays) and snippet arrays this way: a kernel that evaluates
 * a mask or a snippet on rows or keys past a request fails the check. (The BSR row search once
 * read indptr past its end for the rows of a partial tile: every check passed on the zeros
 * beyond a cuMemAlloc, and the same kernel raised CUDA error 717 under torch's allocator.)
 *
 * Without the driver's virtual memory entries (runtime/cu.h, optional) a guarded buffer is a
 * plain cuMemAlloc (base 0).
 */
#include <string.h>

#include "check_internal.h"

kiln_status kiln__check_guard_alloc(const kiln__cu *cu, CUdevice dev, size_t bytes, size_t align,
                                    kiln__check_guard *g, kiln__err *e)
{
    memset(g, 0, sizeof *g);
    if (align < 1) align = 1;
    const size_t need = ((bytes ? bytes : 1) + align - 1) / align * align;
    if (!cu->cuMemCreate || !cu->cuMemGetAllocationGranularity || !cu->cuMemAddressReserve ||
        !cu->cuMemMap || !cu->cuMemSetAccess || !cu->cuMemUnmap || !cu->cuMemRelease ||
        !cu->cuMemAddressFree) {
        KILN__CHECK_CU_RET("check", cu->cuMemAlloc(&g->ptr, need), "alloc (unguarded)");
        return KILN_STATUS_OK;
    }
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)dev;
    size_t gran = 0;
    KILN__CHECK_CU_RET("check",
                       cu->cuMemGetAllocationGranularity(&gran, &prop,
                                                         CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                       "guarded alloc: granularity");
    if (!gran) gran = 2u << 20;
    g->mapped = (need + gran - 1) / gran * gran;
    g->reserved = g->mapped + gran; /* the last granule stays unmapped: the guard */
    KILN__CHECK_CU_RET("check", cu->cuMemAddressReserve(&g->base, g->reserved, gran, 0, 0),
                       "guarded alloc: reserve");
    CUresult r = cu->cuMemCreate(&g->handle, g->mapped, &prop, 0);
    if (r == CUDA_SUCCESS) {
        r = cu->cuMemMap(g->base, g->mapped, 0, g->handle, 0);
        if (r != CUDA_SUCCESS) cu->cuMemRelease(g->handle);
    }
    if (r == CUDA_SUCCESS) {
        CUmemAccessDesc acc;
        memset(&acc, 0, sizeof acc);
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        r = cu->cuMemSetAccess(g->base, g->mapped, &acc, 1);
        if (r != CUDA_SUCCESS) {
            cu->cuMemUnmap(g->base, g->mapped);
            cu->cuMemRelease(g->handle);
        }
    }
    if (r != CUDA_SUCCESS) {
        cu->cuMemAddressFree(g->base, g->reserved);
        memset(g, 0, sizeof *g);
        return kiln__cu_fail(e, r, "check: guarded alloc of %zu bytes", need);
    }
    g->ptr = g->base + g->mapped - need;
    return KILN_STATUS_OK;
}

kiln_status kiln__check_guard_upload(const kiln__cu *cu, CUdevice dev, const void *host,
                                     size_t bytes, size_t align, kiln__check_guard *g, kiln__err *e)
{
    kiln_status st = kiln__check_guard_alloc(cu, dev, bytes, align, g, e);
    if (!st && bytes) KILN__CHECK_CU_RET("check", cu->cuMemcpyHtoD(g->ptr, host, bytes), "upload");
    return st;
}

void kiln__check_guard_free(const kiln__cu *cu, kiln__check_guard *g)
{
    if (g->base) {
        cu->cuMemUnmap(g->base, g->mapped);
        cu->cuMemRelease(g->handle);
        cu->cuMemAddressFree(g->base, g->reserved);
    } else if (g->ptr) {
        cu->cuMemFree(g->ptr);
    }
    memset(g, 0, sizeof *g);
}
