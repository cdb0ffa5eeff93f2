/*
 * test_gpu.c — GPU tests: every builtin variant against the float64 CPU reference
 * (tools/check.c) on fresh random data with poisoned outputs.
 *
 * The variant grid is the full product of head dim {64,128,256} × group {1,4,8} ×
 * dtype {f16,bf16} × mask {none,causal} × window {0,1} × logits {none,softcap,alibi}, for
 * decode and prefill (layout, lse and out dtype alternate through it). Every variant runs on a
 * few odd shapes; the "shape" variants (group 4, plain logits) run the whole length grid:
 * L_KV in {1,17,127,577,4093,32768} and, for prefill, L_Q in {1,37,577} (L_Q <= L_KV where
 * causal). Kernels are compiled up front by a pool of threads (NVRTC is thread-safe).
 * KILN_TEST_QUICK=1 trims the grid.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "grid.h"
#include "jit.h"
#include "kt.h"
#include "runtime.h"

#define MAX_VARIANTS KT_GRID_MAX

typedef struct grid {
    kiln_variant v[MAX_VARIANTS];
    int n;
} grid;

static void build_grid(kiln_op op, grid *g) { g->n = kt_builtin_grid(op, g->v); }

typedef struct pool {
    kiln_ctx *ctx;
    const grid *g;
    int next, failed;
    pthread_mutex_t lock;
    char msg[512];
} pool;

static void *compile_worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        int i = p->next++;
        pthread_mutex_unlock(&p->lock);
        if (i >= p->g->n) return NULL;
        kiln_kernel *k = NULL;
        if (kiln_kernel_get(p->ctx, &p->g->v[i], &k) != KILN_STATUS_OK) {
            pthread_mutex_lock(&p->lock);
            if (!p->failed++) snprintf(p->msg, sizeof p->msg, "%s", kiln_ctx_errmsg(p->ctx));
            pthread_mutex_unlock(&p->lock);
        }
    }
}

/* Compile and load every variant of g with one thread per core. */
static int warm(kiln_ctx *ctx, const grid *g)
{
    pool p = {.ctx = ctx, .g = g};
    pthread_mutex_init(&p.lock, NULL);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = n < 1 ? 1 : n > 32 ? 32 : (int)n;
    pthread_t th[32];
    for (int t = 0; t < nt; t++) pthread_create(&th[t], NULL, compile_worker, &p);
    for (int t = 0; t < nt; t++) pthread_join(th[t], NULL);
    pthread_mutex_destroy(&p.lock);
    if (p.failed)
        kt_fail(__FILE__, __LINE__, "%d variants failed to build; first: %s", p.failed, p.msg);
    return p.failed;
}

typedef struct tally {
    int cases, bad;
    double worst_rel;
} tally;

static void run_case(kiln_ctx *ctx, const kiln_variant *v, int H, int L_Q, int L_KV, int strided,
                     tally *t)
{
    kiln_kernel *k = NULL;
    char spec[256];
    kiln_variant_format(v, spec, sizeof spec);
    if (kiln_kernel_get(ctx, v, &k) != KILN_STATUS_OK) {
        kt_fail(__FILE__, __LINE__, "%s: %s", spec, kiln_ctx_errmsg(ctx));
        t->bad++;
        return;
    }
    kiln_check_shape s = {
        .num_qo_heads = H, .qo_len = L_Q, .kv_len = L_KV, .window_left = -1, .strided = strided};
    kiln_check_result r;
    char msg[512];
    kiln_status st = kiln_check_run(ctx, k, &s, 0, &r, msg, sizeof msg);
    t->cases++;
    if (r.rel_l2 > t->worst_rel) t->worst_rel = r.rel_l2;
    if (st != KILN_STATUS_OK) {
        t->bad++;
        kt_fail(__FILE__, __LINE__, "%s H=%d L_Q=%d L_KV=%d%s: %s (max_err %.3g rel_l2 %.3g)", spec,
                H, L_Q, L_KV, strided ? " strided" : "", msg, r.max_err, r.rel_l2);
    }
}

static int quick(void)
{
    const char *q = getenv("KILN_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static const int kv_lens[] = {1, 17, 127, 577, 4093, 32768};
static const int qo_lens[] = {1, 37, 577};

KT_GPU_TEST(gpu_decode_grid)
{
    static grid g;
    build_grid(KILN_OP_DECODE, &g);
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    warm(ctx, &g);
    tally t = {0};
    for (int i = 0; i < g.n; i++) {
        const kiln_variant *v = &g.v[i];
        const int H = 2 * v->group;
        const int full = v->group == 4 && v->logits == KILN_LOGITS_NONE && !quick();
        if (full) {
            for (size_t li = 0; li < sizeof kv_lens / sizeof kv_lens[0]; li++)
                run_case(ctx, v, H, 1, kv_lens[li], (int)li % 2, &t);
        } else {
            run_case(ctx, v, H, 1, 1, 0, &t);
            run_case(ctx, v, H, 1, 577 + i, i % 2, &t);
            if (!quick() && i % 4 == 0) run_case(ctx, v, 32, 1, 4093, 0, &t);
        }
    }
    printf("    decode: %d variants, %d cases, %d bad, worst rel_l2 %.3g\n", g.n, t.cases, t.bad,
           t.worst_rel);
    kiln_ctx_destroy(ctx);
}

/* The prefill grid on the context's default kernel family (on sm_90 the wgmma family, for
 * every variant it serves; the check says so), or with KILN_TUNE=wgmma=0 the mma.sync family
 * (pack=1: the wgmma family with a KV head's query heads packed into its rows). */
static void prefill_grid(const char *tune)
{
    static grid g;
    build_grid(KILN_OP_PREFILL, &g);
    if (tune) setenv("KILN_TUNE", tune, 1);
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    if (!ctx) goto out;
    kiln_device_info dev;
    KT_CHECK(kiln_ctx_device(ctx, &dev) == KILN_STATUS_OK);
    warm(ctx, &g);
    tally t = {0};
    int wgmma = 0, served = 0;
    for (int i = 0; i < g.n; i++) {
        const kiln_variant *v = &g.v[i];
        int can;
        served += !kiln__wgmma_refusal(v, dev.sm, &can);
        kiln_kernel *k = NULL;
        if (kiln_kernel_get(ctx, v, &k) == KILN_STATUS_OK)
            wgmma += !strcmp(kiln_kernel_family(k), "wgmma");
        const int H = 2 * v->group;
        const int full = v->group == 4 && v->logits == KILN_LOGITS_NONE && !quick();
        if (full) {
            for (size_t li = 0; li < sizeof kv_lens / sizeof kv_lens[0]; li++)
                for (size_t qi = 0; qi < sizeof qo_lens / sizeof qo_lens[0]; qi++) {
                    const int L_KV = kv_lens[li], L_Q = qo_lens[qi];
                    if (v->mask == KILN_MASK_CAUSAL && L_Q > L_KV) continue;
                    if (L_KV == 32768 && L_Q == 577 && v->head_dim != 128)
                        continue; /* CPU reference cost */
                    run_case(ctx, v, H, L_Q, L_KV, (int)(li + qi) % 2, &t);
                }
        } else {
            run_case(ctx, v, H, 1, 1, 0, &t);
            run_case(ctx, v, H, 37, 127 + i, i % 2, &t);
            run_case(ctx, v, H, 200 + i, 577, 0, &t);
        }
    }
    /* on sm_90 the variants the wgmma family serves (head dims 64, 128, 256) run on it, unless
     * KILN_TUNE turned it off; never silently fewer */
    KT_EQ_INT(wgmma, tune && strstr(tune, "wgmma=0") ? 0 : served);
    KT_CHECK(dev.sm != 90 || served > 0);
    printf("    prefill (%s): %d variants, %d cases, %d bad, worst rel_l2 %.3g\n",
           wgmma ? "wgmma family" : "mma.sync family", g.n, t.cases, t.bad, t.worst_rel);
    kiln_ctx_destroy(ctx);
out:
    if (tune) unsetenv("KILN_TUNE");
}

KT_GPU_TEST(gpu_prefill_grid) { prefill_grid(NULL); }

/* On sm_90 the grid once more on the mma.sync family, which the wgmma family replaced there
 * (it stays the family of sm_80 - sm_89 and of what the wgmma family does not serve). */
KT_GPU_TEST(gpu_mma_sync_prefill_grid) { prefill_grid("wgmma=0"); }

/* The grid on the wgmma family with packed rows (KILN_TUNE pack=1: a job's rows are the G query
 * heads of each of 128 / G tokens; the grid's groups 1, 4 and 8 divide 64). */
KT_GPU_TEST(gpu_wgmma_pack_prefill_grid) { prefill_grid("pack=1"); }

/* The same launch twice gives bitwise equal output, and a wrong call is refused cleanly. */
KT_GPU_TEST(gpu_launch_errors)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    kiln_kernel *k = NULL;
    KT_OK(kiln_kernel_get_spec(ctx, "op=decode dtype=bf16 head_dim=128 group=4", &k),
          kiln_ctx_errmsg(ctx));
    KT_REQUIRE(k);
    kiln_attn_args a = {0};
    a.num_qo_heads = 32;
    a.kv_len = 32768;
    KT_STATUS(kiln_single_decode(k, &a, NULL), KILN_STATUS_INVALID_ARGUMENT, kiln_ctx_errmsg(ctx));
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "must be non-zero");
    a.q = a.k = a.v = a.o = 256;
    KT_STATUS(kiln_single_decode(k, &a, NULL), KILN_STATUS_WORKSPACE, kiln_ctx_errmsg(ctx));
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "workspace");
    a.num_qo_heads = 30;
    KT_STATUS(kiln_single_decode(k, &a, NULL), KILN_STATUS_INVALID_ARGUMENT, kiln_ctx_errmsg(ctx));
    KT_STATUS(kiln_single_prefill(k, &a, NULL), KILN_STATUS_INVALID_ARGUMENT, kiln_ctx_errmsg(ctx));
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "decode kernel");
    kiln_ctx_destroy(ctx);
}

/* Soft-cap with ALiBi (logits=softcap_alibi: cap * tanh(x / cap + slope * rel), FlashInfer's
 * order) on every kernel family against the float64 reference: single decode (CUDA cores
 * G 1 and G 8), single prefill (wgmma d128 causal, d64 with a window), batch decode on the
 * packed tensor-core rows (G 4, paged, and fp8 KV) and batch prefill (ragged causal, paged);
 * a small cap (5) so the tanh bends the logits, and a large one (200): the wgmma family's
 * softmax takes a fixed reference for caps up to 55 and its running max above
 * (wgmma_attention.cuh, CAP_REF_MAX); odd lengths. */
KT_GPU_TEST(gpu_softcap_alibi)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    static const char *const single[] = {
        "op=decode dtype=bf16 head_dim=128 group=1 logits=softcap_alibi lse=1",
        "op=decode dtype=f16 head_dim=64 group=8 layout=hnd logits=softcap_alibi",
        "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal logits=softcap_alibi lse=1",
        "op=prefill dtype=f16 head_dim=64 group=2 window=1 logits=softcap_alibi",
    };
    for (size_t i = 0; i < sizeof single / sizeof single[0]; i++) {
        kiln_kernel *k = NULL;
        if (kiln_kernel_get_spec(ctx, single[i], &k) != KILN_STATUS_OK) {
            kt_fail(__FILE__, __LINE__, "%s: %s", single[i], kiln_ctx_errmsg(ctx));
            continue;
        }
        const int decode = k->v.op == KILN_OP_DECODE;
        static const int lq[] = {1, 37, 200}, lkv[] = {1, 577, 4093};
        for (int c = 0; c < 4; c++) {
            kiln_check_shape s = {.num_qo_heads = 2 * k->v.group * (c % 3 + 1),
                                  .qo_len = decode ? 1 : lq[c % 3],
                                  .kv_len = lkv[c % 3] < lq[c % 3] ? lq[c % 3] : lkv[c % 3],
                                  .window_left = -1,
                                  .softcap = c == 3 ? 200.0f : 5.0f,
                                  .strided = c == 1};
            kiln_check_result r;
            char msg[512];
            if (kiln_check_run(ctx, k, &s, 0, &r, msg, sizeof msg) != KILN_STATUS_OK)
                kt_fail(__FILE__, __LINE__, "%s L_Q=%d L_KV=%d: %s (max_err %.3g)", single[i],
                        s.qo_len, s.kv_len, msg, r.max_err);
        }
    }
    static const char *const batched[] = {
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged logits=softcap_alibi lse=1",
        "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged "
        "logits=softcap_alibi lse=1",
        "op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal logits=softcap_alibi "
        "lse=1",
        "op=prefill dtype=f16 head_dim=64 group=1 kv=paged logits=softcap_alibi lse=1",
    };
    static const int kv[5] = {1, 300, 0, 2049, 77}, qo[5] = {1, 37, 3, 64, 5};
    for (size_t i = 0; i < 2 * sizeof batched / sizeof batched[0]; i++) {
        const size_t b = i % (sizeof batched / sizeof batched[0]);
        const float cap = i == b ? 5.0f : 200.0f;
        kiln_kernel *k = NULL;
        if (kiln_kernel_get_spec(ctx, batched[b], &k) != KILN_STATUS_OK) {
            kt_fail(__FILE__, __LINE__, "%s: %s", batched[b], kiln_ctx_errmsg(ctx));
            continue;
        }
        kiln_check_batch s = {.batch = 5,
                              .qo_lens = k->v.op == KILN_OP_PREFILL ? qo : NULL,
                              .kv_lens = kv,
                              .num_qo_heads = 4 * k->v.group,
                              .page_size = 16,
                              .window_left = -1,
                              .softcap = cap,
                              .seed = 211u + (uint64_t)i};
        kiln_check_batch_result r;
        char msg[1024];
        if (kiln_check_batch_run(ctx, k, &s, 0, &r, msg, sizeof msg) != KILN_STATUS_OK)
            kt_fail(__FILE__, __LINE__, "%s cap %g: %s (request %d)", batched[b], cap, msg,
                    r.bad_request);
    }
    kiln_ctx_destroy(ctx);
}

/* ---- several GPUs in one process (issue 19) ---- */

enum { MAX_DEVS = 8 };

typedef struct dev_job {
    kiln_ctx *ctx;
    kiln_kernel *dec, *pre;
    int bad;
    char msg[600];
} dev_job;

/* One thread per device: a decode and a prefill on that device's context against the float64
 * reference (the check binds the context to the calling thread). */
static void *dev_worker(void *arg)
{
    dev_job *j = arg;
    static const int lens[3] = {1, 577, 4093};
    for (int c = 0; c < 3 && !j->bad; c++) {
        kiln_check_shape s = {.num_qo_heads = 32,
                              .qo_len = 1,
                              .kv_len = lens[c],
                              .window_left = -1};
        kiln_check_result r;
        if (kiln_check_run(j->ctx, j->dec, &s, 0, &r, j->msg, sizeof j->msg) != KILN_STATUS_OK)
            j->bad = 1;
        s.qo_len = 37 + c;
        if (!j->bad &&
            kiln_check_run(j->ctx, j->pre, &s, 0, &r, j->msg, sizeof j->msg) != KILN_STATUS_OK)
            j->bad = 1;
    }
    return NULL;
}

/* A context on every visible device, kernels memoised per device (the same spec twice on one
 * context is one kernel; on two contexts, two, each loaded on its device), and every device
 * running a decode and a prefill at once from a thread of its own, each checked against the
 * float64 reference. Skipped with fewer than two GPUs. */
KT_GPU_TEST(gpu_multi_device)
{
    kiln_ctx *ctx[MAX_DEVS] = {0};
    int n = 0;
    for (; n < MAX_DEVS; n++) {
        kiln_ctx_opts o = {0};
        o.cache_dir = kt_cache_dir();
        o.device = n;
        if (kiln_ctx_create(&o, &ctx[n]) != KILN_STATUS_OK) break; /* past the last device */
    }
    if (n < 2) {
        kt_skip("needs two or more GPUs (this machine: %d)", n);
        for (int d = 0; d < n; d++) kiln_ctx_destroy(ctx[d]);
        return;
    }
    dev_job jobs[MAX_DEVS];
    memset(jobs, 0, sizeof jobs);
    for (int d = 0; d < n; d++) {
        kiln_device_info info;
        KT_OK(kiln_ctx_device(ctx[d], &info), kiln_ctx_errmsg(ctx[d]));
        KT_EQ_INT(info.ordinal, d);
        jobs[d].ctx = ctx[d];
        KT_OK(kiln_kernel_get_spec(ctx[d], "op=decode dtype=bf16 head_dim=128 group=4",
                                   &jobs[d].dec),
              kiln_ctx_errmsg(ctx[d]));
        KT_OK(kiln_kernel_get_spec(ctx[d], "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal",
                                   &jobs[d].pre),
              kiln_ctx_errmsg(ctx[d]));
        kiln_kernel *again = NULL;
        KT_OK(kiln_kernel_get_spec(ctx[d], "op=decode dtype=bf16 head_dim=128 group=4", &again),
              kiln_ctx_errmsg(ctx[d]));
        KT_CHECK(again == jobs[d].dec); /* memoised per context */
        if (d > 0) KT_CHECK(jobs[d].dec != jobs[0].dec);
    }
    pthread_t th[MAX_DEVS];
    for (int d = 0; d < n; d++) pthread_create(&th[d], NULL, dev_worker, &jobs[d]);
    for (int d = 0; d < n; d++) pthread_join(th[d], NULL);
    for (int d = 0; d < n; d++)
        if (jobs[d].bad) kt_fail(__FILE__, __LINE__, "device %d: %s", d, jobs[d].msg);
    printf("    %d devices: a decode and a prefill on each at once, checked\n", n);
    for (int d = 0; d < n; d++) kiln_ctx_destroy(ctx[d]);
}
