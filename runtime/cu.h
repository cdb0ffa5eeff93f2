/*
 * cu.h — the CUDA Driver API, loaded with dlopen at run time so that kiln runs (compile-only)
 * on machines with no GPU or driver. Every entry is resolved by the exact versioned symbol
 * that the header's prototype names.
 */
#ifndef KILN_CU_H
#define KILN_CU_H

#include <cuda.h>

#include "kiln.h"
#include "util.h"

/* one entry a line */
/* clang-format off */
#define KILN__CU_FUNCS(X)                          \
    X(cuInit)                                      \
    X(cuDriverGetVersion)                          \
    X(cuDeviceGetCount)                            \
    X(cuDeviceGet)                                 \
    X(cuDeviceGetName)                             \
    X(cuDeviceGetAttribute)                        \
    X(cuDevicePrimaryCtxRetain)                    \
    X(cuDevicePrimaryCtxRelease)                   \
    X(cuCtxGetCurrent)                             \
    X(cuCtxSetCurrent)                             \
    X(cuCtxPushCurrent)                            \
    X(cuCtxPopCurrent)                             \
    X(cuCtxSynchronize)                            \
    X(cuModuleLoadData)                            \
    X(cuModuleUnload)                              \
    X(cuModuleGetFunction)                         \
    X(cuFuncSetAttribute)                          \
    X(cuFuncGetAttribute)                          \
    X(cuLaunchKernel)                              \
    X(cuGetErrorString)                            \
    X(cuGetErrorName)                              \
    X(cuMemAlloc)                                  \
    X(cuMemFree)                                   \
    X(cuMemcpyHtoD)                                \
    X(cuMemcpyDtoH)                                \
    X(cuMemcpyDtoD)                                \
    X(cuMemsetD8)                                  \
    X(cuMemsetD32)                                 \
    X(cuStreamCreate)                              \
    X(cuStreamDestroy)                             \
    X(cuStreamSynchronize)                         \
    X(cuEventCreate)                               \
    X(cuEventRecord)                               \
    X(cuEventSynchronize)                          \
    X(cuEventElapsedTime)                          \
    X(cuEventDestroy)                              \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor) \
    X(cuMemHostAlloc)                              \
    X(cuMemFreeHost)                               \
    X(cuMemcpyHtoDAsync)                           \
    X(cuTensorMapEncodeTiled)
/* clang-format on */

/* Entries a driver may lack (kiln runs without them): NULL in the table where the symbol is
 * missing, and the caller falls back. cuLaunchKernelEx (CUDA 12.0): the merge kernel's
 * programmatic dependent launch; without it the merge kernel is an ordinary launch. The
 * virtual memory entries (cuMemCreate ...) are the check library's (tools/check): its mask
 * and snippet arrays end where the mapped memory ends, so a kernel reading past one faults;
 * without them it allocates with cuMemAlloc. The library itself does not call them. */
/* clang-format off */
#define KILN__CU_FUNCS_OPTIONAL(X)                 \
    X(cuLaunchKernelEx)                            \
    X(cuMemGetAllocationGranularity)               \
    X(cuMemCreate)                                 \
    X(cuMemRelease)                                \
    X(cuMemAddressReserve)                         \
    X(cuMemAddressFree)                            \
    X(cuMemMap)                                    \
    X(cuMemUnmap)                                  \
    X(cuMemSetAccess)
/* clang-format on */

typedef struct kiln__cu {
#define KILN__CU_MEMBER(name) __typeof__(&name) name;
    KILN__CU_FUNCS(KILN__CU_MEMBER)
    KILN__CU_FUNCS_OPTIONAL(KILN__CU_MEMBER)
#undef KILN__CU_MEMBER
} kiln__cu;

/* The process-wide driver table, loaded and cuInit'ed once. KILN_STATUS_NO_DEVICE (with a
 * message saying why) when libcuda is missing or cuInit fails. */
kiln_status kiln__cu_get(const kiln__cu **out, kiln__err *e);

/* Write "what: CUDA_ERROR_X (description)" into e and return KILN_STATUS_CUDA. */
kiln_status kiln__cu_fail(kiln__err *e, CUresult r, const char *fmt, ...) KILN__PRINTF(3, 4);

#endif /* KILN_CU_H */
