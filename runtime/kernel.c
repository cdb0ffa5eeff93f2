/*
 * kernel.c — kiln_kernel_get / kiln_kernel_compile: in-process memo → SQLite cache → NVRTC
 * compile (stored in the cache) → module load on the context's device. The memo is keyed by
 * the variant's fields and the arch, so a hit does no formatting, hashing of text, NVRTC,
 * SQLite or driver work.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "runtime.h"

/* The memo key: the variant's fields and the arch, with no padding bytes. */
typedef struct memo_key {
    int32_t f[11];
    char arch[16];
} memo_key;

static void make_memo_key(const kiln_variant *v, const char *arch, memo_key *mk)
{
    memset(mk, 0, sizeof *mk);
    int32_t f[11] = {v->op, v->q_dtype, v->kv_dtype, v->out_dtype, v->head_dim, v->group,
                     v->layout, v->mask, v->window, v->logits, v->lse};
    memcpy(mk->f, f, sizeof f);
    snprintf(mk->arch, sizeof mk->arch, "%s", arch);
}

static int same_key(const kiln_kernel *k, const memo_key *mk)
{
    memo_key kk;
    make_memo_key(&k->v, k->arch, &kk);
    return !memcmp(&kk, mk, sizeof kk);
}

static kiln_kernel *memo_find(kiln_ctx *ctx, const memo_key *mk, uint64_t h)
{
    kiln_kernel *k = ctx->memo[h % KILN__MEMO_BUCKETS];
    for (; k; k = k->next)
        if (k->memo_hash == h && same_key(k, mk)) return k;
    return NULL;
}

/* Load the cubin on the context's device and resolve the entries. */
static kiln_status load_module(kiln_ctx *ctx, kiln_kernel *k, kiln__err *e)
{
    const kiln__cu *cu = ctx->cu;
    kiln_status st = kiln__ctx_bind(ctx, e);
    if (st) return st;
    CUresult r = cu->cuModuleLoadData(&k->module, k->cubin);
    if (r != CUDA_SUCCESS) return kiln__cu_fail(e, r, "load %s (%s) for %s", k->key, k->spec, k->arch);
    r = cu->cuModuleGetFunction(&k->fn_main, k->module, KILN__ENTRY_MAIN);
    if (r == CUDA_SUCCESS && k->v.op == KILN_OP_DECODE)
        r = cu->cuModuleGetFunction(&k->fn_merge, k->module, KILN__ENTRY_MERGE);
    if (r == CUDA_SUCCESS)
        r = cu->cuFuncSetAttribute(k->fn_main, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   k->cfg.smem_bytes);
    if (r == CUDA_SUCCESS)
        r = cu->cuOccupancyMaxActiveBlocksPerMultiprocessor(&k->ctas_per_sm, k->fn_main,
                                                            k->cfg.threads, (size_t)k->cfg.smem_bytes);
    if (r != CUDA_SUCCESS) {
        cu->cuModuleUnload(k->module);
        k->module = NULL;
        return kiln__cu_fail(e, r, "prepare %s (%s) on device %d", k->key, k->spec, ctx->info.ordinal);
    }
    if (k->ctas_per_sm < 1)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "kernel %s (%s) cannot run on device %d: %d threads, %d bytes of shared memory",
                          k->key, k->spec, ctx->info.ordinal, k->cfg.threads, k->cfg.smem_bytes);
    k->loaded = 1;
    return KILN_STATUS_OK;
}

/* Fill k's binary: from the cache when present and sound, else compile (and store). */
static kiln_status build(kiln_ctx *ctx, kiln_kernel *k, kiln__err *e)
{
    kiln_status st = kiln__config_pick(&k->v, kiln__arch_sm(k->arch), &k->cfg, e);
    if (st) return st;
    if (!kiln__spec_format(&k->v, k->spec, sizeof k->spec, e)) return KILN_STATUS_UNSUPPORTED;
    if ((st = kiln__key_material(&k->v, &k->cfg, k->arch, &k->key_material, e))) return st;
    kiln__key_hash(k->key_material, k->key);

    if (ctx->cache) {
        kiln__entry en = {0};
        kiln__err ce = {{0}};
        st = kiln__cache_get(ctx->cache, k->key, 1, &en, &ce);
        if (st == KILN_STATUS_OK) {
            k->source = en.source;
            k->log = en.log;
            k->cubin = en.cubin;
            k->cubin_size = en.cubin_size;
            k->registers = en.registers;
            k->smem_total = en.smem_bytes;
            k->spill_bytes = en.spill_bytes;
            k->stack_bytes = en.stack_bytes;
            k->compile_ms = en.compile_ms;
            k->from_cache = 1;
            en.source = en.log = NULL;
            en.cubin = NULL;
            kiln__entry_free(&en);
            return KILN_STATUS_OK;
        }
        if (st != KILN_STATUS_NOT_FOUND) {
            /* A corrupt row is reported on stderr and replaced, never loaded. */
            fprintf(stderr, "kiln: %s; recompiling\n", ce.msg);
        }
    }

    if ((st = kiln__expand(&k->v, &k->cfg, k->arch, &k->source, e))) return st;
    char name[64];
    snprintf(name, sizeof name, "kiln_%.12s.cu", k->key);
    kiln__compiled c;
    st = kiln__nvrtc_compile(k->source, k->arch, name, &c, e);
    if (st) {
        kiln__err_prefix(e, "%s", k->spec);
        kiln__compiled_free(&c);
        return st;
    }
    k->cubin = c.cubin;
    k->cubin_size = c.cubin_size;
    k->log = c.log;
    k->compile_ms = c.compile_ms;
    k->registers = c.registers;
    k->smem_total = c.smem_static + k->cfg.smem_bytes;
    k->spill_bytes = c.spill_bytes;
    k->stack_bytes = c.stack_bytes;
    k->from_cache = 0;

    if (ctx->cache) {
        kiln__entry en = {0};
        memcpy(en.key, k->key, sizeof en.key);
        en.spec = k->spec;
        en.arch = k->arch;
        en.nvrtc = (char *)kiln_nvrtc_version();
        en.key_material = k->key_material;
        en.source = k->source;
        en.log = k->log;
        en.cubin = k->cubin;
        en.cubin_size = k->cubin_size;
        en.registers = k->registers;
        en.smem_bytes = k->smem_total;
        en.spill_bytes = k->spill_bytes;
        en.stack_bytes = k->stack_bytes;
        en.compile_ms = k->compile_ms;
        if ((st = kiln__cache_put(ctx->cache, &en, e))) return st;
    }
    return KILN_STATUS_OK;
}

static kiln_status get(kiln_ctx *ctx, const kiln_variant *v, const char *arch_in, int load,
                       kiln_kernel **out)
{
    kiln__err e = {{0}};
    if (!out) return kiln__ctx_error(ctx, kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT, "out is NULL"), &e);
    *out = NULL;
    if (!ctx || !v)
        return kiln__ctx_error(ctx, kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT, "NULL context or variant"), &e);
    kiln_status st = kiln__variant_check(v, &e);
    if (st) return kiln__ctx_error(ctx, st, &e);

    char arch[16];
    if (arch_in) {
        if ((st = kiln__arch_normalize(arch_in, arch, &e))) return kiln__ctx_error(ctx, st, &e);
    } else if (ctx->info.arch[0]) {
        memcpy(arch, ctx->info.arch, sizeof arch);
    } else {
        return kiln__ctx_error(ctx, kiln__fail(&e, KILN_STATUS_NO_DEVICE,
                                               "no GPU and no arch named: %s; name an arch (e.g. sm_90a)",
                                               ctx->err.msg), &e);
    }
    if (load) {
        if (!ctx->cu)
            return kiln__ctx_error(ctx, kiln__fail(&e, KILN_STATUS_NO_DEVICE,
                                                   "cannot load a kernel: compile-only context (%s)",
                                                   ctx->err.msg), &e);
        if (strcmp(arch, ctx->info.arch) != 0)
            return kiln__ctx_error(ctx, kiln__fail(&e, KILN_STATUS_UNSUPPORTED,
                                                   "cannot load an %s kernel on the context's %s device",
                                                   arch, ctx->info.arch), &e);
    }

    memo_key mk;
    make_memo_key(v, arch, &mk);
    const uint64_t h = XXH3_64bits(&mk, sizeof mk);

    /* Memo hit, or claim the key: the first thread inserts a placeholder (building=1) and
     * builds outside the lock; others wanting the same key wait for it (single flight). */
    pthread_mutex_lock(&ctx->memo_lock);
    kiln_kernel *k;
    for (;;) {
        k = memo_find(ctx, &mk, h);
        if (!k || !k->building) break;
        pthread_cond_wait(&ctx->memo_cond, &ctx->memo_lock);
    }
    if (k && (k->loaded || !load)) {
        pthread_mutex_unlock(&ctx->memo_lock);
        *out = k;
        return KILN_STATUS_OK;
    }
    int fresh = 0;
    if (!k) {
        k = kiln__fault("malloc") ? NULL : calloc(1, sizeof *k);
        if (!k) {
            pthread_mutex_unlock(&ctx->memo_lock);
            return kiln__ctx_error(ctx, kiln__fail(&e, KILN_STATUS_NO_MEMORY, "out of memory"), &e);
        }
        k->ctx = ctx;
        memcpy(&k->v, v, sizeof *v);
        memcpy(k->arch, arch, sizeof k->arch);
        k->memo_hash = h;
        k->next = ctx->memo[h % KILN__MEMO_BUCKETS];
        ctx->memo[h % KILN__MEMO_BUCKETS] = k;
        fresh = 1;
    }
    k->building = 1;
    pthread_mutex_unlock(&ctx->memo_lock);

    st = fresh ? build(ctx, k, &e) : KILN_STATUS_OK;
    if (!st && load && !k->loaded) st = load_module(ctx, k, &e);

    pthread_mutex_lock(&ctx->memo_lock);
    k->building = 0;
    if (st && fresh) {
        kiln_kernel **pp = &ctx->memo[h % KILN__MEMO_BUCKETS];
        while (*pp != k) pp = &(*pp)->next;
        *pp = k->next;
        free(k->source);
        free(k->log);
        free(k->key_material);
        free(k->cubin);
        free(k);
    }
    pthread_cond_broadcast(&ctx->memo_cond);
    pthread_mutex_unlock(&ctx->memo_lock);
    if (st) return kiln__ctx_error(ctx, st, &e);
    *out = k;
    return KILN_STATUS_OK;
}

kiln_status kiln_kernel_get(kiln_ctx *ctx, const kiln_variant *v, kiln_kernel **out)
{
    return get(ctx, v, NULL, 1, out);
}

kiln_status kiln_kernel_compile(kiln_ctx *ctx, const kiln_variant *v, const char *arch,
                                kiln_kernel **out)
{
    return get(ctx, v, arch, 0, out);
}

kiln_status kiln_kernel_get_spec(kiln_ctx *ctx, const char *spec, kiln_kernel **out)
{
    kiln_variant v;
    kiln__err e = {{0}};
    if (out) *out = NULL;
    kiln_status st = kiln__spec_parse(spec, &v, &e);
    if (st) return kiln__ctx_error(ctx, st, &e);
    return kiln_kernel_get(ctx, &v, out);
}

kiln_status kiln_kernel_describe(const kiln_kernel *k, kiln_kernel_info *out)
{
    if (!k || !out)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT, "kiln_kernel_describe: NULL argument");
    memset(out, 0, sizeof *out);
    memcpy(out->key, k->key, sizeof out->key);
    memcpy(out->arch, k->arch, sizeof out->arch);
    snprintf(out->spec, sizeof out->spec, "%s", k->spec);
    out->from_cache = k->from_cache;
    out->compile_ms = k->compile_ms;
    out->registers = k->registers;
    out->smem_bytes = k->smem_total;
    out->spill_bytes = k->spill_bytes;
    out->stack_bytes = k->stack_bytes;
    out->cubin_bytes = k->cubin_size;
    out->threads = k->cfg.threads;
    return KILN_STATUS_OK;
}

const char *kiln_kernel_source(const kiln_kernel *k) { return k && k->source ? k->source : ""; }
const char *kiln_kernel_log(const kiln_kernel *k) { return k && k->log ? k->log : ""; }
const char *kiln_kernel_key_material(const kiln_kernel *k)
{
    return k && k->key_material ? k->key_material : "";
}
const void *kiln_kernel_cubin(const kiln_kernel *k, size_t *size)
{
    if (size) *size = k ? k->cubin_size : 0;
    return k ? k->cubin : NULL;
}
