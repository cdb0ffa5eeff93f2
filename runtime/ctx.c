/*
 * ctx.c — kiln_ctx: the device (through the dlopen'ed driver, or none: compile-only), the
 * target arch, the cache handles (local, and the read-only base; policy.c) and the last-error
 * message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime.h"

kiln_status kiln__ctx_error(kiln_ctx *ctx, kiln_status st, const kiln__err *e)
{
    if (st == KILN_STATUS_OK) return st;
    if (ctx && e) {
        pthread_mutex_lock(&ctx->err_lock);
        ctx->err = *e;
        pthread_mutex_unlock(&ctx->err_lock);
    }
    if (e && e != kiln__tls_err()) *kiln__tls_err() = *e;
    return st;
}

void kiln__assert_fail(const char *file, int line, const char *cond, const char *more)
{
    fprintf(stderr, "kiln: %s:%d: invariant failed: %s%s%s\n", file, line, cond, more ? " " : "",
            more ? more : "");
    fflush(stderr);
    abort();
}

void kiln__assert_fail_le(const char *file, int line, const char *cond, int64_t a, int64_t b)
{
    char both[96];
    snprintf(both, sizeof both, "(%lld vs %lld)", (long long)a, (long long)b);
    kiln__assert_fail(file, line, cond, both);
}

const char *kiln_ctx_errmsg(const kiln_ctx *ctx) { return ctx ? ctx->err.msg : kiln_errmsg(); }

kiln_status kiln__ctx_bind(kiln_ctx *ctx, kiln__err *e)
{
    /* Always set: a handle equal to ours may be a stale one left current by a destroyed
     * primary context. Not on the launch path. */
    CUresult r = ctx->cu->cuCtxSetCurrent(ctx->cuctx);
    if (r != CUDA_SUCCESS)
        return kiln__cu_fail(e, r, "cuCtxSetCurrent on device %d", ctx->info.ordinal);
    return KILN_STATUS_OK;
}

static kiln_status open_device(kiln_ctx *ctx, int ordinal, kiln__err *e)
{
    const kiln__cu *cu = NULL;
    kiln_status st = kiln__cu_get(&cu, e);
    if (st) return st;
    int count = 0;
    CUresult r = cu->cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS) return kiln__cu_fail(e, r, "cuDeviceGetCount");
    if (count == 0) return kiln__fail(e, KILN_STATUS_NO_DEVICE, "the CUDA driver sees no GPU");
    if (ordinal < 0 || ordinal >= count)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "device %d does not exist (%d GPUs)",
                          ordinal, count);
    if ((r = cu->cuDeviceGet(&ctx->dev, ordinal)) != CUDA_SUCCESS)
        return kiln__cu_fail(e, r, "cuDeviceGet(%d)", ordinal);
    int major = 0, minor = 0;
    cu->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ctx->dev);
    cu->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ctx->dev);
    cu->cuDeviceGetAttribute(&ctx->info.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                             ctx->dev);
    int l2 = 0;
    cu->cuDeviceGetAttribute(&l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, ctx->dev);
    ctx->l2_bytes = l2 > 0 ? l2 : 0;
    /* KILN_JOB_HEADS=N: the persistent wgmma grid's sections of N job heads whatever the
     * shape (0: one section of all heads), for the GPU tests and A/B runs */
    ctx->job_heads_env = -1;
    const char *jh = getenv("KILN_JOB_HEADS");
    if (jh && *jh) {
        char *end = NULL;
        const long n = strtol(jh, &end, 10);
        if (*end || n < 0 || n > INT32_MAX)
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "KILN_JOB_HEADS='%s': a count of job heads (0 or more) was expected",
                              jh);
        ctx->job_heads_env = (int)n;
    }
    cu->cuDeviceGetName(ctx->info.name, (int)sizeof ctx->info.name, ctx->dev);
    cu->cuDriverGetVersion(&ctx->info.driver_version);
    ctx->info.sm = major * 10 + minor;
    if ((r = cu->cuDevicePrimaryCtxRetain(&ctx->cuctx, ctx->dev)) != CUDA_SUCCESS)
        return kiln__cu_fail(e, r, "cuDevicePrimaryCtxRetain(device %d)", ordinal);
    ctx->cu = cu;
    ctx->info.present = 1;
    ctx->info.ordinal = ordinal;
    /* Leave the caller's current context alone if it has one; else make ours current. */
    CUcontext cur = NULL;
    cu->cuCtxGetCurrent(&cur);
    if (!cur) {
        cu->cuCtxSetCurrent(ctx->cuctx);
        ctx->set_current = 1;
    }
    return KILN_STATUS_OK;
}

/* mkdir -p of every parent of path (not path itself), mode 0700; errors are left to the
 * cache open, which reports them with the path. */
static void make_parents(const char *path)
{
    char buf[900];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(buf, 0700);
        *p = '/';
    }
}

/* The base cache must not be the local cache itself: the base is read without locks. */
static kiln_status check_layers(kiln_ctx *ctx, kiln__err *e)
{
    struct stat a, b;
    if (ctx->cache && ctx->base && stat(ctx->cache_path, &a) == 0 &&
        stat(ctx->base_path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "the base cache %s is the cache itself; name another directory",
                          ctx->base_path);
    return KILN_STATUS_OK;
}

kiln_status kiln_ctx_create(const kiln_ctx_opts *opts, kiln_ctx **out)
{
    kiln__err *e = kiln__tls_err();
    if (!out) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "kiln_ctx_create: out is NULL");
    *out = NULL;
    kiln_ctx_opts o = {0};
    if (opts) o = *opts;
    kiln_ctx *ctx = kiln__fault("malloc") ? NULL : calloc(1, sizeof *ctx);
    if (!ctx) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "kiln_ctx_create: out of memory");
    pthread_mutex_init(&ctx->memo_lock, NULL);
    pthread_cond_init(&ctx->memo_cond, NULL);
    pthread_mutex_init(&ctx->err_lock, NULL);
    ctx->record_fd = -1;
    ctx->info.ordinal = o.device;

    kiln_status st = KILN_STATUS_OK;
    if (!o.no_device) {
        kiln__err derr = {{0}};
        st = open_device(ctx, o.device, &derr);
        if (st == KILN_STATUS_NO_DEVICE) {
            /* Compile-only context: not an error here; kiln_kernel_get reports it. */
            ctx->err = derr;
            snprintf(ctx->nodev_why, sizeof ctx->nodev_why, "%s", derr.msg);
            st = KILN_STATUS_OK;
        } else if (st) {
            *e = derr;
            kiln_ctx_destroy(ctx);
            return st;
        }
    } else {
        kiln__fail(&ctx->err, KILN_STATUS_NO_DEVICE, "context created with no_device");
        snprintf(ctx->nodev_why, sizeof ctx->nodev_why, "%s", ctx->err.msg);
    }

    if (o.arch) {
        st = kiln__arch_normalize(o.arch, ctx->info.arch, e);
        if (st) {
            kiln__err_prefix(e, "kiln_ctx_create");
            kiln_ctx_destroy(ctx);
            return st;
        }
        /* A cubin runs only on its own major version, at or above its minor; arch-specific
         * targets (sm_90a, sm_100a) only on exactly that arch. */
        const int want = kiln__arch_sm(ctx->info.arch);
        const size_t n = strlen(ctx->info.arch);
        const int specific = n && (ctx->info.arch[n - 1] == 'a');
        if (ctx->info.present && (want / 10 != ctx->info.sm / 10 || want > ctx->info.sm ||
                                  (specific && want != ctx->info.sm))) {
            kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                       "kiln_ctx_create: arch %s cannot run on device %d (%s, sm_%d)",
                       ctx->info.arch, ctx->info.ordinal, ctx->info.name, ctx->info.sm);
            kiln_ctx_destroy(ctx);
            return KILN_STATUS_UNSUPPORTED;
        }
    } else if (ctx->info.present) {
        kiln__arch_from_sm(ctx->info.sm, ctx->info.arch);
        if (ctx->info.sm < 80) {
            kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                       "kiln_ctx_create: device %d (%s) is sm_%d; kiln needs sm_80 or newer",
                       ctx->info.ordinal, ctx->info.name, ctx->info.sm);
            kiln_ctx_destroy(ctx);
            return KILN_STATUS_UNSUPPORTED;
        }
    }
    ctx->arch_sm = ctx->info.arch[0] ? kiln__arch_sm(ctx->info.arch) : 0;

    if (!o.no_cache) {
        char dir[900];
        if (o.cache_dir) snprintf(dir, sizeof dir, "%s", o.cache_dir);
        else if ((st = kiln__cache_default_dir(dir, sizeof dir, e))) {
            kiln_ctx_destroy(ctx);
            return st;
        } else {
            make_parents(dir); /* ~/.cache may not exist yet on a fresh machine */
        }
        if ((st = kiln__cache_open(dir, &ctx->cache, e))) {
            kiln_ctx_destroy(ctx);
            return st;
        }
        snprintf(ctx->cache_path, sizeof ctx->cache_path, "%s", kiln__cache_path(ctx->cache));
    }
    if ((st = kiln__ctx_policy(ctx, &o, e)) || (st = check_layers(ctx, e))) {
        kiln__err_prefix(e, "kiln_ctx_create");
        kiln_ctx_destroy(ctx);
        return st;
    }
    *out = ctx;
    return KILN_STATUS_OK;
}

static void kernel_free(kiln_ctx *ctx, kiln_kernel *k)
{
    if (k->module && ctx->cu) ctx->cu->cuModuleUnload(k->module);
    free(k->source);
    free(k->log);
    free(k->key_material);
    free(k->cubin);
    free(k);
}

void kiln_ctx_destroy(kiln_ctx *ctx)
{
    if (!ctx) return;
    if (ctx->cu && ctx->cuctx) kiln__ctx_bind(ctx, NULL);
    for (int b = 0; b < KILN__MEMO_BUCKETS; b++) {
        kiln_kernel *k = ctx->memo[b];
        while (k) {
            kiln_kernel *next = k->next;
            kernel_free(ctx, k);
            k = next;
        }
    }
    if (ctx->cu && ctx->cuctx) {
        /* Undo what create did, so no destroyed context stays current on this thread. */
        CUcontext cur = NULL;
        if (ctx->set_current && ctx->cu->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx->cuctx)
            ctx->cu->cuCtxSetCurrent(NULL);
        ctx->cu->cuDevicePrimaryCtxRelease(ctx->dev);
    }
    kiln__cache_close(ctx->cache);
    kiln__ctx_policy_free(ctx);
    pthread_mutex_destroy(&ctx->memo_lock);
    pthread_cond_destroy(&ctx->memo_cond);
    pthread_mutex_destroy(&ctx->err_lock);
    free(ctx);
}

kiln_status kiln_ctx_device(const kiln_ctx *ctx, kiln_device_info *out)
{
    if (!ctx || !out)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT,
                          "kiln_ctx_device: NULL argument");
    *out = ctx->info;
    return KILN_STATUS_OK;
}

const char *kiln_ctx_cache_path(const kiln_ctx *ctx) { return ctx ? ctx->cache_path : ""; }
