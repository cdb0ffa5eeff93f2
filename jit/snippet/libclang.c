/*
 * libclang.c — loads libclang with dlopen on first use and resolves the functions that
 * the snippet validator (jit/snippet/) calls (see libclang.h). Linking libclang would cost every process its start-up
 * and a hard dependency; only snippets need it.
 */
#include "libclang.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tried in order after $KILN_LIBCLANG. */
static const char *const candidates[] = {"libclang-14.so.1", "libclang.so.1",
                                         "/usr/lib/llvm-14/lib/libclang-14.so.1"};

static kiln__clang api;
static kiln_status api_status = KILN_STATUS_UNSUPPORTED;
static kiln__err api_err;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

static void *open_library(void)
{
    char tried[512] = "";
    size_t at = 0;
    const char *env = getenv("KILN_LIBCLANG");
    if (env && *env) {
        void *lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            snprintf(api.path, sizeof api.path, "%s", env);
            return lib;
        }
        kiln__fail(&api_err, KILN_STATUS_UNSUPPORTED,
                   "snippet: cannot load libclang from $KILN_LIBCLANG=%s: %s", env, dlerror());
        return NULL;
    }
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
        void *lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            snprintf(api.path, sizeof api.path, "%s", candidates[i]);
            return lib;
        }
        int w = snprintf(tried + at, sizeof tried - at, "%s%s", i ? ", " : "", candidates[i]);
        if (w > 0 && (size_t)w < sizeof tried - at) at += (size_t)w;
    }
    kiln__fail(&api_err, KILN_STATUS_UNSUPPORTED,
               "snippet: cannot load libclang (tried %s): install libclang1-14 (make deps) or set "
               "KILN_LIBCLANG to the library's path; snippets need it",
               tried);
    return NULL;
}

static void api_load(void)
{
    void *lib = open_library();
    if (!lib) return;
#define KILN__CLANG_RESOLVE(name)                                                                  \
    {                                                                                              \
        void *fn = dlsym(lib, #name);                                                              \
        if (!fn) {                                                                                 \
            kiln__fail(&api_err, KILN_STATUS_UNSUPPORTED,                                          \
                       "snippet: %s lacks %s (need libclang "                                      \
                       ">= 14)",                                                                   \
                       api.path, #name);                                                           \
            return;                                                                                \
        }                                                                                          \
        memcpy(&api.name, &fn, sizeof fn);                                                         \
    }
    KILN__CLANG_FUNCS(KILN__CLANG_RESOLVE)
#undef KILN__CLANG_RESOLVE
    /* excludeDeclarationsFromPCH = 0, displayDiagnostics = 0: nothing is printed to stderr. */
    api.index = api.clang_createIndex(0, 0);
    if (!api.index) {
        kiln__fail(&api_err, KILN_STATUS_UNSUPPORTED, "snippet: clang_createIndex failed (%s)",
                   api.path);
        return;
    }
    CXString v = api.clang_getClangVersion();
    const char *s = api.clang_getCString(v);
    snprintf(api.version, sizeof api.version, "%s", s ? s : "?");
    api.clang_disposeString(v);
    api_status = KILN_STATUS_OK;
}

const kiln__clang *kiln__clang_get(kiln__err *e)
{
    if (kiln__fault("libclang")) {
        kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                   "snippet: cannot load libclang (fault injected): snippets need it");
        return NULL;
    }
    pthread_once(&api_once, api_load);
    if (api_status) {
        if (e) *e = api_err;
        return NULL;
    }
    return &api;
}
