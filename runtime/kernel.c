/*
 * kernel.c — kiln_kernel_get / kiln_kernel_compile: in-process memo → local SQLite cache →
 * read-only base cache → (strict mode stops here) → NVRTC compile under the key's compile
 * lease, so that one process of many compiles it (stored in the local cache) → module load on
 * the context's device. The memo is keyed by the variant's fields and the arch, so a hit does
 * no formatting, hashing of text, NVRTC, SQLite or driver work.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "runtime.h"
#include "snippet.h"

/* The memo key: the variant with every byte defined (padding and the bytes after each
 * string's NUL zeroed) and the arch. Raw snippet text, not canonical: canonicalising costs a
 * libclang parse, which a memo hit must not pay; two spellings get two entries that share one
 * cache row. */
typedef struct memo_key {
    kiln_variant v;
    char arch[16];
} memo_key;

static void copy_str(char *dst, const char *src, size_t cap)
{
    const size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
}

static void make_memo_key(const kiln_variant *v, const char *arch, memo_key *mk)
{
    memset(mk, 0, sizeof *mk);
    kiln_variant *n = &mk->v;
    n->op = v->op;
    n->q_dtype = v->q_dtype;
    n->kv_dtype = v->kv_dtype;
    n->out_dtype = v->out_dtype;
    n->head_dim = v->head_dim;
    n->group = v->group;
    n->layout = v->layout;
    n->mask = v->mask;
    n->window = v->window;
    n->logits = v->logits;
    n->lse = v->lse;
    n->mask_data = v->mask_data;
    n->kv = v->kv;
    n->rope = v->rope;
    n->q_tokens = v->q_tokens;
    n->num_params = v->num_params;
    for (int i = 0; i < v->num_params && i < KILN_MAX_USER_PARAMS; i++) {
        copy_str(n->params[i].name, v->params[i].name, sizeof n->params[i].name);
        n->params[i].type = v->params[i].type;
    }
    copy_str(n->logits_expr, v->logits_expr, sizeof n->logits_expr);
    copy_str(n->mask_expr, v->mask_expr, sizeof n->mask_expr);
    snprintf(mk->arch, sizeof mk->arch, "%s", arch);
}

static int same_key(const kiln_kernel *k, const memo_key *mk)
{
    return !memcmp(&k->key_v, &mk->v, sizeof mk->v) && !strcmp(k->arch, mk->arch);
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
    if (r != CUDA_SUCCESS)
        return kiln__cu_fail(e, r, "load %s (%s) for %s", k->key, k->spec, k->arch);
    if (k->v.op == KILN_OP_MERGE) {
        r = cu->cuModuleGetFunction(&k->fn_main, k->module, KILN__ENTRY_MERGE_STATE);
        if (r == CUDA_SUCCESS)
            r = cu->cuModuleGetFunction(&k->fn_merge, k->module, KILN__ENTRY_MERGE_IN_PLACE);
        if (r == CUDA_SUCCESS)
            r = cu->cuModuleGetFunction(&k->fn_aux, k->module, KILN__ENTRY_MERGE_STATES);
    } else {
        r = cu->cuModuleGetFunction(&k->fn_main, k->module, KILN__ENTRY_MAIN);
        if (r == CUDA_SUCCESS && (k->v.op == KILN_OP_DECODE || k->v.kv != KILN_KV_CONTIGUOUS))
            r = cu->cuModuleGetFunction(&k->fn_merge, k->module, KILN__ENTRY_MERGE);
        if (r == CUDA_SUCCESS && k->v.op == KILN_OP_DECODE && k->v.kv != KILN_KV_CONTIGUOUS)
            r = cu->cuModuleGetFunction(&k->fn_merge_wide, k->module, KILN__ENTRY_MERGE_WIDE);
    }
    if (r == CUDA_SUCCESS)
        r = cu->cuFuncSetAttribute(k->fn_main, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   k->cfg.smem_bytes);
    if (r == CUDA_SUCCESS)
        r = cu->cuOccupancyMaxActiveBlocksPerMultiprocessor(&k->ctas_per_sm, k->fn_main,
                                                            k->cfg.threads,
                                                            (size_t)k->cfg.smem_bytes);
    /* the wgmma family's setmaxnreg split must fit what the launch gives the CTA (threads x
     * the kernel's count): one that does not blocks the consumers for ever (params.h) */
    int regs = KILN_WGMMA_LAUNCH_REGS;
    if (r == CUDA_SUCCESS && k->cfg.wgmma)
        r = cu->cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, k->fn_main);
    if (r != CUDA_SUCCESS)
        st =
            kiln__cu_fail(e, r, "prepare %s (%s) on device %d", k->key, k->spec, ctx->info.ordinal);
    else if (k->ctas_per_sm < 1)
        st = kiln__fail(
            e, KILN_STATUS_UNSUPPORTED,
            "kernel %s (%s) cannot run on device %d: %d threads, %d bytes of shared memory", k->key,
            k->spec, ctx->info.ordinal, k->cfg.threads, k->cfg.smem_bytes);
    else if (regs < KILN_WGMMA_LAUNCH_REGS)
        st = kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                        "kernel %s (%s): %d registers per thread, not the %d its warpgroups' "
                        "setmaxnreg split assumes: it would hang",
                        k->key, k->spec, regs, KILN_WGMMA_LAUNCH_REGS);
    if (st) {
        cu->cuModuleUnload(k->module);
        k->module = NULL;
        return st;
    }
    k->loaded = 1;
    return KILN_STATUS_OK;
}

/* ---- build: local cache → base cache → (strict: stop) → lease → compile → store ---------- */

/* Longest a process waits for another's compile lease before compiling the kernel itself. */
#define LEASE_WAIT_MAX_MS (600 * 1000)
/* Poll interval while waiting for a lease: starts here, doubles up to the maximum. */
#define LEASE_POLL_MIN_MS 20
#define LEASE_POLL_MAX_MS 200

typedef enum lookup_result { LOOKUP_HIT, LOOKUP_MISS, LOOKUP_BAD } lookup_result;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* k takes en's binary and build facts (its source, log and cubin pointers included: the caller
 * stops owning them). from_cache: where en came from. */
static void take_entry(kiln_kernel *k, const kiln__entry *en, int from_cache)
{
    k->source = en->source;
    k->log = en->log;
    k->cubin = en->cubin;
    k->cubin_size = en->cubin_size;
    k->registers = en->registers;
    k->smem_total = en->smem_bytes;
    k->spill_bytes = en->spill_bytes;
    k->stack_bytes = en->stack_bytes;
    k->compile_ms = en->compile_ms;
    k->from_cache = from_cache;
}

/* Look k's key up in cache c. A hit must be the kernel asked for: its key material is ours
 * byte for byte (so the stored key is the hash of the stored material) and its cubin is a
 * whole ELF file; anything else is LOOKUP_BAD with the reason in bad[cap] and is never
 * loaded. */
static lookup_result lookup(kiln__cache *c, kiln_kernel *k, char *bad, size_t cap)
{
    kiln__entry en = {0};
    kiln__err ce = {{0}};
    kiln_status st = kiln__cache_get(c, k->key, 1, &en, &ce);
    if (st == KILN_STATUS_NOT_FOUND) return LOOKUP_MISS;
    if (st) {
        snprintf(bad, cap, "%s", ce.msg);
        return LOOKUP_BAD;
    }
    char why[512];
    if (strcmp(en.key_material, k->key_material) != 0) {
        snprintf(bad, cap,
                 "cache %s: entry %s (%s, %s): its key material is not the text that hashes to "
                 "%s (the row is for another kernel); not loaded",
                 kiln__cache_path(c), k->key, en.spec, en.arch, k->key);
        kiln__entry_free(&en);
        return LOOKUP_BAD;
    }
    if (kiln__cubin_check(en.cubin, en.cubin_size, why, sizeof why)) {
        snprintf(bad, cap, "cache %s: entry %s (%s, %s): %s; not loaded", kiln__cache_path(c),
                 k->key, en.spec, en.arch, why);
        kiln__entry_free(&en);
        return LOOKUP_BAD;
    }
    take_entry(k, &en, 1);
    en.source = en.log = NULL;
    en.cubin = NULL;
    kiln__entry_free(&en);
    return LOOKUP_HIT;
}

/* Strict mode's refusal: names the key, the spec, the arch and where it looked. */
static kiln_status strict_miss(kiln_ctx *ctx, const kiln_kernel *k, const char *bad, kiln__err *e)
{
    char where[2200];
    if (ctx->cache && ctx->base)
        snprintf(where, sizeof where, "%s or the base cache %s", ctx->cache_path, ctx->base_path);
    else if (ctx->cache || ctx->base)
        snprintf(where, sizeof where, "%s", ctx->cache ? ctx->cache_path : ctx->base_path);
    else snprintf(where, sizeof where, "any cache (the context has none)");
    return kiln__fail(e, KILN_STATUS_CACHE_MISS,
                      "strict mode: kernel %s (%s, %s) is not in %s; nothing compiled%s%s", k->key,
                      k->spec, k->arch, where, bad[0] ? "; a row was found but refused: " : "",
                      bad);
}

/* Expand, compile with NVRTC and store in the local cache (when there is one). */
static kiln_status compile_store(kiln_ctx *ctx, kiln_kernel *k, kiln__err *e)
{
    kiln_status st = kiln__expand(&k->v, &k->cfg, k->arch, &k->source, e);
    if (st) return st;
    char name[64];
    snprintf(name, sizeof name, "kiln_%.12s.cu", k->key);
    kiln__compiled c;
    st = kiln__nvrtc_compile(k->source, k->arch, name, &c, e);
    if (st) {
        kiln__err_prefix(e, "%s", k->spec);
        kiln__compiled_free(&c);
        return st;
    }
    /* the row to store, which k then takes its binary from */
    kiln__entry en = {0};
    memcpy(en.key, k->key, sizeof en.key);
    en.spec = k->spec;
    en.arch = k->arch;
    en.nvrtc = (char *)kiln_nvrtc_version();
    en.key_material = k->key_material;
    en.source = k->source;
    en.log = c.log;
    en.cubin = c.cubin;
    en.cubin_size = c.cubin_size;
    en.registers = c.registers;
    en.smem_bytes = c.smem_static + k->cfg.smem_bytes;
    en.spill_bytes = c.spill_bytes;
    en.stack_bytes = c.stack_bytes;
    en.compile_ms = c.compile_ms;
    take_entry(k, &en, 0);
    if (!ctx->cache) return KILN_STATUS_OK;

    kiln__err pe = {{0}};
    if (kiln__cache_put(ctx->cache, &en, &pe)) {
        /* The kernel is compiled and correct; only storing it failed (a read-only or full
         * cache). Say so and go on: the next process compiles again. */
        fprintf(stderr, "kiln: %s (kernel %s compiled but not stored)\n", pe.msg, k->key);
        return KILN_STATUS_OK;
    }
    if (ctx->max_bytes > 0) {
        kiln__err ee = {{0}};
        if (kiln__cache_evict(ctx->cache, ctx->max_bytes, k->key, NULL, NULL, &ee))
            fprintf(stderr, "kiln: %s (the kernel is stored; the bound is enforced later)\n",
                    ee.msg);
    }
    return KILN_STATUS_OK;
}

/* Take k's compile lease in the local cache, or wait until whoever holds it has stored the
 * row (then *hit = 1 and k is filled from it). *taken = 1 when this context holds the lease.
 * replace: the local row is corrupt and is to be replaced. */
static kiln_status acquire(kiln_ctx *ctx, kiln_kernel *k, int replace, int *taken, int *hit,
                           kiln__err *e)
{
    char bad[1024];
    int delay = LEASE_POLL_MIN_MS;
    uint64_t t0 = kiln__now_ns();
    *taken = *hit = 0;
    for (;;) {
        kiln__lease l;
        kiln_status st = kiln__cache_lease_take(ctx->cache, k->key, replace, &l, e);
        if (st) return st;
        if (l.state == KILN__LEASE_TAKEN) {
            *taken = 1;
            return KILN_STATUS_OK;
        }
        if (l.state == KILN__LEASE_PRESENT) {
            bad[0] = 0;
            lookup_result r = lookup(ctx->cache, k, bad, sizeof bad);
            if (r == LOOKUP_HIT) {
                *hit = 1;
                return KILN_STATUS_OK;
            }
            if (r == LOOKUP_BAD) fprintf(stderr, "kiln: %s; recompiling\n", bad);
            replace = r == LOOKUP_BAD; /* else it was evicted in between: ask again */
            continue;
        }
        if ((kiln__now_ns() - t0) / 1000000 > LEASE_WAIT_MAX_MS) {
            fprintf(stderr,
                    "kiln: waited %d s for %s (%s, %s), whose compile lease %s still holds; "
                    "compiling it here too\n",
                    LEASE_WAIT_MAX_MS / 1000, k->key, k->spec, k->arch, l.holder);
            return KILN_STATUS_OK;
        }
        sleep_ms(delay);
        delay = delay * 2 > LEASE_POLL_MAX_MS ? LEASE_POLL_MAX_MS : delay * 2;
    }
}

/* Fill k's binary: from the local cache, else the base cache, else (unless strict) compile it
 * under the key's compile lease and store it in the local cache. A row that is corrupt or is
 * not the kernel asked for is reported on stderr, never loaded, and replaced. Failures of the
 * cache itself (a lease that cannot be taken, a row that cannot be stored) are reported on
 * stderr and do not fail a kernel that compiles. */
static kiln_status build(kiln_ctx *ctx, kiln_kernel *k, kiln__err *e)
{
    kiln_status st;
    /* Snippets are validated by libclang and replaced by their canonical token text before
     * anything is keyed, expanded or compiled (the parser did it already for spec lines; a
     * struct filled in C arrives here raw). Nothing reaches NVRTC or the cache unless it passed. */
    if ((k->v.logits_expr[0] || k->v.mask_expr[0]) && (st = kiln__variant_canonicalize(&k->v, e)))
        return st;
    st = kiln__config_pick(&k->v, kiln__arch_sm(k->arch), &k->cfg, e);
    if (st) return st;
    if (!kiln__spec_format(&k->v, k->spec, sizeof k->spec, e)) return KILN_STATUS_UNSUPPORTED;
    if ((st = kiln__key_material(&k->v, &k->cfg, k->arch, &k->key_material, e))) return st;
    kiln__key_hash(k->key_material, k->key);
    if (ctx->record_fd >= 0 && (st = kiln__ctx_record(ctx, k->spec, k->arch, e))) return st;

    char bad[1024] = "";
    lookup_result r = ctx->cache ? lookup(ctx->cache, k, bad, sizeof bad) : LOOKUP_MISS;
    if (r == LOOKUP_HIT) return KILN_STATUS_OK;
    int local_bad = r == LOOKUP_BAD;
    if (local_bad && !ctx->strict) fprintf(stderr, "kiln: %s; recompiling\n", bad);
    if (ctx->base) {
        char bad_base[1024] = "";
        r = lookup(ctx->base, k, bad_base, sizeof bad_base);
        if (r == LOOKUP_HIT) return KILN_STATUS_OK;
        if (r == LOOKUP_BAD && !ctx->strict)
            fprintf(stderr, "kiln: %s; compiling into the local cache\n", bad_base);
        if (r == LOOKUP_BAD && !bad[0]) memcpy(bad, bad_base, sizeof bad);
    }
    if (ctx->strict) return strict_miss(ctx, k, bad, e);
    /* An arch the installed NVRTC does not offer (sm_999) is bad input, refused before a lease
     * is taken or NVRTC is run. Checked only here: a cache hit never loads NVRTC. */
    if ((st = kiln__arch_offered(k->arch, e))) return st;
    /* A cache that cannot be written (read-only, full, failing) never fails a kernel that can be
     * compiled: compile_store says on stderr that it was not stored. */
    if (!ctx->cache || kiln__cache_readonly(ctx->cache, NULL)) return compile_store(ctx, k, e);

    int taken = 0, hit = 0;
    kiln__err le = {{0}};
    if (acquire(ctx, k, local_bad, &taken, &hit, &le))
        fprintf(stderr, "kiln: %s (%s): %s; compiling it without the lease\n", k->spec, k->arch,
                le.msg);
    if (hit) return KILN_STATUS_OK;
    st = compile_store(ctx, k, e);
    if (taken) kiln__cache_lease_release(ctx->cache, k->key);
    return st;
}

static kiln_status get(kiln_ctx *ctx, const kiln_variant *v, const char *arch_in, int load,
                       kiln_kernel **out)
{
    kiln__err e = {{0}};
    if (!out)
        return kiln__ctx_error(ctx, kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT, "out is NULL"),
                               &e);
    *out = NULL;
    if (!ctx || !v)
        return kiln__ctx_error(
            ctx, kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT, "NULL context or variant"), &e);
    kiln_status st = kiln__variant_check(v, &e);
    if (st) return kiln__ctx_error(ctx, st, &e);

    char arch[16];
    if (arch_in) {
        if ((st = kiln__arch_normalize(arch_in, arch, &e))) return kiln__ctx_error(ctx, st, &e);
    } else if (ctx->info.arch[0]) {
        memcpy(arch, ctx->info.arch, sizeof arch);
    } else {
        return kiln__ctx_error(ctx,
                               kiln__fail(&e, KILN_STATUS_NO_DEVICE, "no GPU (%s): %s",
                                          ctx->nodev_why,
                                          load
                                              ? "kernels can be compiled (kiln_kernel_compile with "
                                                "an arch) but not loaded"
                                              : "name an arch (e.g. sm_90a)"),
                               &e);
    }
    if (load) {
        if (!ctx->cu)
            return kiln__ctx_error(ctx,
                                   kiln__fail(&e, KILN_STATUS_NO_DEVICE,
                                              "cannot load a kernel: compile-only context (%s)",
                                              ctx->nodev_why),
                                   &e);
        if (strcmp(arch, ctx->info.arch) != 0)
            return kiln__ctx_error(ctx,
                                   kiln__fail(&e, KILN_STATUS_UNSUPPORTED,
                                              "cannot load an %s kernel on the context's %s device",
                                              arch, ctx->info.arch),
                                   &e);
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
        k->key_v = mk.v;
        k->v = mk.v;
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
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT,
                          "kiln_kernel_describe: NULL argument");
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
const char *kiln_kernel_spec(const kiln_kernel *k) { return k ? k->spec : ""; }
const char *kiln_kernel_log(const kiln_kernel *k) { return k && k->log ? k->log : ""; }

const char *kiln_kernel_family(const kiln_kernel *k)
{
    return kiln__source_family(k ? k->source : NULL);
}
const char *kiln_kernel_key_material(const kiln_kernel *k)
{
    return k && k->key_material ? k->key_material : "";
}
const void *kiln_kernel_cubin(const kiln_kernel *k, size_t *size)
{
    if (size) *size = k ? k->cubin_size : 0;
    return k ? k->cubin : NULL;
}
