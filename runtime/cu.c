/*
 * cu.c — loads libcuda.so.1 with dlopen and resolves the driver entry points we use through
 * their exact versioned symbols, once per process; an optional entry the driver lacks stays
 * NULL. See cu.h.
 */
#include "cu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static kiln__cu table;
static kiln_status load_status = KILN_STATUS_NO_DEVICE;
static kiln__err load_err;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        kiln__fail(&load_err, KILN_STATUS_NO_DEVICE, "no CUDA driver: dlopen libcuda.so.1: %s",
                   dlerror());
        return;
    }
    /* Each entry is looked up by the exact symbol the header's prototype names (cuda.h maps
     * e.g. cuMemAlloc to cuMemAlloc_v2), so the ABI always matches what we compiled against;
     * cuGetProcAddress would hand out the newest ABI instead (cuCtxSynchronize grew an
     * argument in 13.0). */
#define KILN__CU_STR2(x) #x
#define KILN__CU_STR(x)  KILN__CU_STR2(x)
#define KILN__CU_RESOLVE(name)                                                                     \
    {                                                                                              \
        void *fn = dlsym(lib, KILN__CU_STR(name));                                                 \
        if (!fn) {                                                                                 \
            kiln__fail(&load_err, KILN_STATUS_NO_DEVICE, "CUDA driver lacks %s (too old?)",        \
                       KILN__CU_STR(name));                                                        \
            return;                                                                                \
        }                                                                                          \
        memcpy(&table.name, &fn, sizeof fn);                                                       \
    }
    KILN__CU_FUNCS(KILN__CU_RESOLVE)
#undef KILN__CU_RESOLVE
    /* the optional entries stay NULL where the driver lacks them (the table is zeroed) */
#define KILN__CU_RESOLVE_OPTIONAL(name)                                                            \
    {                                                                                              \
        void *fn = dlsym(lib, KILN__CU_STR(name));                                                 \
        if (fn) memcpy(&table.name, &fn, sizeof fn);                                               \
    }
    KILN__CU_FUNCS_OPTIONAL(KILN__CU_RESOLVE_OPTIONAL)
#undef KILN__CU_RESOLVE_OPTIONAL
    CUresult r = table.cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char *s = NULL;
        table.cuGetErrorName(r, &s);
        kiln__fail(&load_err, KILN_STATUS_NO_DEVICE, "cuInit failed: %s (no usable GPU)",
                   s ? s : "unknown error");
        return;
    }
    load_status = KILN_STATUS_OK;
}

kiln_status kiln__cu_get(const kiln__cu **out, kiln__err *e)
{
    pthread_once(&once, load);
    *out = NULL;
    if (load_status != KILN_STATUS_OK) {
        if (e) *e = load_err;
        return load_status;
    }
    if (kiln__fault("cuda"))
        return kiln__fail(e, KILN_STATUS_NO_DEVICE, "CUDA driver: injected fault");
    *out = &table;
    return KILN_STATUS_OK;
}

kiln_status kiln__cu_fail(kiln__err *e, CUresult r, const char *fmt, ...)
{
    if (!e) return KILN_STATUS_CUDA;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *name = NULL, *desc = NULL;
    if (load_status == KILN_STATUS_OK) {
        table.cuGetErrorName(r, &name);
        table.cuGetErrorString(r, &desc);
    }
    snprintf(e->msg, sizeof e->msg, "%s: %s (%s)", what, name ? name : "CUDA error",
             desc ? desc : "no description");
    return KILN_STATUS_CUDA;
}
