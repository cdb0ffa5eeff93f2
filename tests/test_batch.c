/*
 * test_batch.c — the batch kernels (kv=ragged|paged, kiln_plan_schedule / kiln_plan_run), the
 * state merges and cascades on the GPU against the float64 references of tools/check_batch.c
 * (whose own pieces test_batch_check.c tests on the CPU), and the grid's cases checked on the
 * CPU.
 *
 * GPU grids follow FlashInfer's test grids — batch {1,12,17,128} × kv_len {1,54,97,512,2048,
 * 16384} × qo_len {1,17,37,127,577} × page size {1,5,8,16} × head dim {64,128,256} × group
 * {1,4,8} × layout {nhd,hnd} × mask {none,causal} × window × logits {none,softcap,alibi} ×
 * kv dtype {f16,bf16,e4m3,e5m2} × rope × lse × strides × mask data {none, bitmask, bsr} — as a
 * covering walk rather than the product: case i takes value (i + i / n_f) mod n_f of each factor f (n_f its size, the
 * factors' sizes mostly co-prime), so every value of every factor appears and pairs rotate.
 * Per-request lengths scatter around the case's kv_len and qo_len, with an empty request
 * (L_KV = 0), a request with no rows (prefill), odd last pages and shuffled pages in a pool
 * bigger than needed. KILN_TEST_QUICK=1 runs 24 cases per op; otherwise 160.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_batch.h"
#include "jit.h"
#include "kt.h"

/* ---- GPU ------------------------------------------------------------------------------------ */

static int quick(void)
{
    const char *q = getenv("KILN_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* Parse spec into *v; 0 after recording a failure that names it. */
static int parsed(const char *spec, kiln_variant *v)
{
    if (kiln_variant_parse(spec, v) == KILN_STATUS_OK) return 1;
    kt_fail(__FILE__, __LINE__, "%s: %s", spec, kiln_errmsg());
    return 0;
}

static kiln_kernel *get(kiln_ctx *ctx, const kiln_variant *v)
{
    kiln_kernel *k = NULL;
    char spec[512];
    kiln_variant_format(v, spec, sizeof spec);
    if (kiln_kernel_get(ctx, v, &k) != KILN_STATUS_OK) {
        kt_fail(__FILE__, __LINE__, "%s: %s", spec, kiln_ctx_errmsg(ctx));
        return NULL;
    }
    return k;
}

static const int g_batch[] = {1, 12, 17, 128}, g_kv[] = {1, 54, 97, 512, 2048, 16384};
static const int g_qo[] = {1, 17, 37, 127, 577}, g_page[] = {1, 5, 8, 16}, g_dim[] = {64, 128, 256};
static const int g_group[] = {1, 4, 8};
static const kiln_dtype g_kvdt[] = {KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_E4M3,
                                    KILN_DTYPE_E5M2};

#define N_OF(a)    ((int)(sizeof(a) / sizeof((a)[0])))
#define PICK(a, i) ((a)[((i) + (i) / N_OF(a)) % N_OF(a)])

/* CPU reference work budget per case (multiply-adds); shapes above it shrink. */
#define REF_BUDGET_QUICK 4e8
#define REF_BUDGET_FULL  3e9

/* One case of the covering walk: variant and shape. */
typedef struct bcase {
    kiln_variant v;
    kiln_check_batch s;
    int qo[128], kv[128];
} bcase;

static void make_case(kiln_op op, int i, bcase *c)
{
    kiln_variant *v = &c->v;
    kiln_variant_default(v);
    v->op = op;
    v->kv = i % 2 ? KILN_KV_PAGED : KILN_KV_RAGGED;
    v->head_dim = PICK(g_dim, i);
    v->group = PICK(g_group, i / 2);
    v->layout = (i / 3) % 2 ? KILN_LAYOUT_HND : KILN_LAYOUT_NHD;
    v->mask = (op == KILN_OP_PREFILL && (i / 2) % 2) ? KILN_MASK_CAUSAL : KILN_MASK_NONE;
    v->window = i % 7 == 3;
    v->logits = (kiln_logits)((i / 5) % 3);
    v->lse = i % 3 == 1;
    v->rope = i % 5 == 2;
    /* mask data per request: none, none, bitmask, bsr */
    v->mask_data = (i + i / 7) % 4 == 2   ? KILN_MASK_DATA_BITMASK
                   : (i + i / 7) % 4 == 3 ? KILN_MASK_DATA_BSR
                                          : KILN_MASK_DATA_NONE;
    const kiln_dtype kd = PICK(g_kvdt, i / 4);
    v->q_dtype = v->out_dtype = kd == KILN_DTYPE_BF16 || (kd == KILN_DTYPE_E5M2 && i % 2)
                                    ? KILN_DTYPE_BF16
                                    : KILN_DTYPE_F16;
    v->kv_dtype = kd == KILN_DTYPE_F16 || kd == KILN_DTYPE_BF16 ? v->q_dtype : kd;
    kiln_check_batch *s = &c->s;
    memset(s, 0, sizeof *s);
    int B = PICK(g_batch, i / 3), kv = PICK(g_kv, i),
        qo = op == KILN_OP_PREFILL ? PICK(g_qo, i / 6) : 1;
    const int H = 2 * v->group;
    if (v->rope && kv > 2048) kv = 2048; /* fp32 angles of large positions drift */
    const double budget = quick() ? REF_BUDGET_QUICK : REF_BUDGET_FULL;
    while ((double)B * qo * kv * H * v->head_dim * 2 > budget && B > 1)
        B = B > 12 ? 12 : B > 2 ? B / 2 : 1;
    while ((double)B * qo * kv * H * v->head_dim * 2 > budget && kv > 97) kv /= 2;
    uint64_t seed = 0x5eed0000u + (uint64_t)i * 7919u + (uint64_t)op;
    for (int b = 0; b < B; b++) {
        c->kv[b] = kv / 2 + (int)(kiln_check_rng(&seed) % (uint64_t)(kv - kv / 2 + 1));
        c->qo[b] =
            qo > 1 ? qo / 2 + (int)(kiln_check_rng(&seed) % (uint64_t)(qo - qo / 2 + 1)) : qo;
        if (v->mask == KILN_MASK_CAUSAL && c->qo[b] > c->kv[b]) c->qo[b] = c->kv[b];
    }
    if (B > 1) c->kv[B / 2] = 0; /* an empty request: o = 0, lse = -inf */
    if (B > 1 && v->mask == KILN_MASK_CAUSAL && c->qo[B / 2] == 0) c->qo[B / 2] = 3;
    if (B > 2 && op == KILN_OP_PREFILL) c->qo[B - 1] = 0; /* a request with no rows */
    s->batch = B;
    s->qo_lens = c->qo;
    s->kv_lens = c->kv;
    s->num_qo_heads = H;
    s->page_size = PICK(g_page, i / 5);
    s->window_left = -1;
    s->strided = i % 4 == 3;
    s->rope_offsets = v->rope && i % 2;
    s->bsr_r = i % 3 ? 7 : 16;
    s->bsr_c = i % 4 ? 40 : 64;
    s->seed = seed;
}

static void decode_case(int i, bcase *c) { make_case(KILN_OP_DECODE, i, c); }
static void prefill_case(int i, bcase *c) { make_case(KILN_OP_PREFILL, i, c); }

/* Run cases 0 .. n - 1 of a walk on the GPU against the float64 reference; print
 * "<label>: N cases, N bad, worst rel_l2 X". */
static void run_walk(void (*make)(int, bcase *), int n, const char *label)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    if (!ctx) return;
    int bad = 0;
    double worst = 0;
    static bcase c;
    for (int i = 0; i < n; i++) {
        make(i, &c);
        kiln_kernel *k = get(ctx, &c.v);
        if (!k) {
            bad++;
            continue;
        }
        kiln_check_batch_result r;
        char msg[1024], spec[512];
        kiln_status st = kiln_check_batch_run(ctx, k, &c.s, 0, &r, msg, sizeof msg);
        if (r.r.rel_l2 > worst) worst = r.r.rel_l2;
        if (getenv("KILN_TEST_VERBOSE")) { /* progress of a long grid, one line per case */
            kiln_variant_format(&c.v, spec, sizeof spec);
            printf("    case %d %s B=%d: %s rel_l2 %.3g\n", i, spec, c.s.batch, st ? "BAD" : "ok",
                   r.r.rel_l2);
            fflush(stdout);
        }
        if (st) {
            bad++;
            kiln_variant_format(&c.v, spec, sizeof spec);
            kt_fail(__FILE__, __LINE__, "case %d: %s B=%d P=%d%s%s: %s (max_err %.3g, request %d)",
                    i, spec, c.s.batch, c.s.page_size, c.s.strided ? " strided" : "",
                    c.s.graph ? " graph" : "", msg, r.r.max_err, r.bad_request);
        }
    }
    printf("    %s: %d cases, %d bad, worst rel_l2 %.3g\n", label, n, bad, worst);
    kiln_ctx_destroy(ctx);
}

static void run_grid(kiln_op op)
{
    run_walk(op == KILN_OP_DECODE ? decode_case : prefill_case, quick() ? 24 : 160,
             op == KILN_OP_DECODE ? "decode batches" : "prefill batches");
}

/* CPU: case i's spec parses back and its config picks (*cfg), else a failure naming it; with
 * f, the spec is appended to it (a manifest line). */
static int case_picks(const bcase *c, int i, FILE *f, kiln__config *cfg)
{
    char spec[512];
    kiln_variant_format(&c->v, spec, sizeof spec);
    kiln_variant back;
    kiln__err e;
    if (kiln_variant_parse(spec, &back) != KILN_STATUS_OK ||
        kiln__config_pick(&back, 90, cfg, &e)) {
        kt_fail(__FILE__, __LINE__, "case %d: %s: %s", i, spec, kiln_errmsg());
        return 0;
    }
    if (f) fprintf(f, "%s\n", spec);
    return 1;
}

/* CPU: every case of both full grids is a valid batch variant whose config picks (the GPU run
 * must not fail on a spec); with KILN_TEST_GRID_SPECS=FILE the specs are appended to FILE, a
 * manifest for `kiln warm` (to compile the grid's kernels ahead, on a machine without a GPU). */
KT_TEST(batch_grid_cases_valid)
{
    const char *path = getenv("KILN_TEST_GRID_SPECS");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    static bcase c;
    int n = 0, packed = 0;
    for (int op = 0; op < 2; op++)
        for (int i = 0; i < 160; i++) {
            make_case(op ? KILN_OP_PREFILL : KILN_OP_DECODE, i, &c);
            kiln__config cfg;
            if (!case_picks(&c, i, f, &cfg)) continue;
            KT_CHECK(c.s.batch >= 1 && c.s.batch <= 128 && c.s.num_qo_heads % c.v.group == 0);
            packed += cfg.pack && !op; /* mask-data prefills pack too, on the wgmma family */
            n++;
        }
    if (f) fclose(f);
    KT_EQ_INT(n, 320);
    KT_CHECK(packed > 0 && packed < 160); /* both decode kernels appear */
}

KT_GPU_TEST(gpu_batch_decode_grid) { run_grid(KILN_OP_DECODE); }
KT_GPU_TEST(gpu_batch_prefill_grid) { run_grid(KILN_OP_PREFILL); }
/* On sm_90 the wgmma family serves the batch prefill grid; once more on the mma.sync family */
KT_GPU_TEST(gpu_mma_sync_batch_prefill_grid)
{
    setenv("KILN_TUNE", "wgmma=0", 1);
    run_grid(KILN_OP_PREFILL);
    unsetenv("KILN_TUNE");
}
/* and on the wgmma family with packed rows (pack=1; the grid's groups 1, 4, 8 divide 64) */
KT_GPU_TEST(gpu_wgmma_pack_batch_prefill_grid)
{
    setenv("KILN_TUNE", "pack=1", 1);
    run_grid(KILN_OP_PREFILL);
    unsetenv("KILN_TUNE");
}

/* Few query tokens a request (q_tokens: speculative-decoding verify): a covering walk over
 * q_tokens {1, 2, 4, 8, 16} x group {1, 2, 4, 8, 16, 32} x head dim x kv dtype (fp8 too) x
 * causal x window x logits x rope x lse x page size x ragged / paged, each request 0 ..
 * q_tokens tokens over 0 .. ~3000 keys (an empty request, one with no tokens), every tenth a
 * graph replay after a re-plan; against the float64 reference. The cases are few_case(i). */
static void few_case(int i, bcase *c)
{
    static const int qt[] = {1, 2, 4, 8, 16}, grp[] = {4, 8, 1, 2, 16, 32},
                     kvl[] = {3000, 577, 61, 1999, 4097};
    kiln_variant *v = &c->v;
    kiln_variant_default(v);
    v->op = KILN_OP_PREFILL;
    v->kv = i % 2 ? KILN_KV_PAGED : KILN_KV_RAGGED;
    v->q_tokens = PICK(qt, i);
    v->group = PICK(grp, i / 2);
    v->head_dim = PICK(g_dim, i / 3);
    v->mask = i % 4 != 1 ? KILN_MASK_CAUSAL : KILN_MASK_NONE;
    v->window = i % 7 == 3;
    v->logits = (kiln_logits)((i / 5) % 3);
    v->lse = i % 3 != 2;
    v->rope = i % 9 == 4;
    v->layout = (i / 4) % 2 ? KILN_LAYOUT_HND : KILN_LAYOUT_NHD;
    const kiln_dtype kd = PICK(g_kvdt, i / 7);
    v->q_dtype = v->out_dtype = kd == KILN_DTYPE_BF16 || i % 2 ? KILN_DTYPE_BF16 : KILN_DTYPE_F16;
    v->kv_dtype = kd == KILN_DTYPE_F16 || kd == KILN_DTYPE_BF16 ? v->q_dtype : kd;
    kiln_check_batch *s = &c->s;
    memset(s, 0, sizeof *s);
    int B = 1 + (i * 7) % 23, kv = PICK(kvl, i / 2);
    const double H = 2.0 * v->group, budget = quick() ? REF_BUDGET_QUICK : REF_BUDGET_FULL;
    while ((double)B * v->q_tokens * kv * H * v->head_dim * 2 > budget && B > 1) B = (B + 1) / 2;
    while ((double)B * v->q_tokens * kv * H * v->head_dim * 2 > budget && kv > 97) kv /= 2;
    uint64_t seed = 0xfe70000u + (uint64_t)i * 104729u;
    for (int b = 0; b < B; b++) {
        c->kv[b] = kv / 3 + (int)(kiln_check_rng(&seed) % (uint64_t)(kv - kv / 3 + 1));
        c->qo[b] = (int)(kiln_check_rng(&seed) % (uint64_t)(v->q_tokens + 1));
        if (b == 0) c->qo[b] = v->q_tokens; /* the bound itself */
    }
    if (B > 2) c->kv[B / 2] = 0, c->qo[B / 2] = v->mask == KILN_MASK_CAUSAL ? 0 : 1;
    s->batch = B;
    s->qo_lens = c->qo;
    s->kv_lens = c->kv;
    s->num_qo_heads = 2 * v->group;
    s->page_size = PICK(g_page, i / 3);
    s->window_left = -1;
    s->strided = i % 5 == 2;
    s->rope_offsets = v->rope && i % 2;
    s->graph = i % 10 == 9;
    s->seed = seed;
}

KT_TEST(batch_few_tokens_cases_valid)
{
    const char *path = getenv("KILN_TEST_GRID_SPECS");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    static bcase c;
    for (int i = 0; i < 60; i++) {
        few_case(i, &c);
        kiln__config cfg;
        if (case_picks(&c, i, f, &cfg)) KT_CHECK(cfg.pack && !cfg.wgmma);
    }
    if (f) fclose(f);
}

KT_GPU_TEST(gpu_batch_few_tokens)
{
    run_walk(few_case, quick() ? 20 : 60, "few-token prefill batches");
}

/* Mask data per request: bitmask and bsr, decode on tensor cores (G 1 and 4) and CUDA cores
 * (fp8 KV with RoPE) and prefill, ragged and paged, with a causal mask on prefill and a graph
 * replay on one. */
KT_GPU_TEST(gpu_batch_mask_data)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    if (!ctx) return;
    static const char *const specs[] = {
        "op=decode dtype=f16 head_dim=128 group=1 kv=paged mask_data=bitmask lse=1",
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged mask_data=bsr",
        "op=decode dtype=bf16 head_dim=64 group=4 kv=ragged mask_data=bitmask",
        "op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask=causal mask_data=bitmask lse=1",
        "op=prefill dtype=f16 head_dim=64 group=1 kv=ragged mask_data=bsr",
        "op=prefill dtype=bf16 head_dim=128 group=8 kv=ragged mask=causal mask_data=bsr",
        "op=decode q_dtype=f16 kv_dtype=e4m3 out_dtype=f16 head_dim=128 group=1 kv=paged "
        "mask_data=bitmask rope=1 lse=1",
    };
    int qo[17], kv[17];
    uint64_t seed = 0x6d61736bu;
    for (int b = 0; b < 17; b++) {
        kv[b] = b == 5 ? 0 : 1 + (int)(kiln_check_rng(&seed) % 700);
        qo[b] = b == 9 ? 0 : 1 + (int)(kiln_check_rng(&seed) % 90);
        if (qo[b] > kv[b]) qo[b] = kv[b];
    }
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kiln_variant v;
        if (!parsed(specs[i], &v)) continue;
        kiln_kernel *k = get(ctx, &v);
        if (!k) continue;
        kiln_check_batch s;
        memset(&s, 0, sizeof s);
        s.batch = 17;
        s.qo_lens = qo;
        s.kv_lens = kv;
        s.num_qo_heads = 2 * v.group;
        s.page_size = 5;
        s.window_left = -1;
        s.bsr_r = i % 2 ? 3 : 16;
        s.bsr_c = i % 2 ? 24 : 64;
        s.graph = i == 3;
        s.seed = 0x6d61736bu + i;
        kiln_check_batch_result r;
        char msg[1024];
        if (kiln_check_batch_run(ctx, k, &s, 0, &r, msg, sizeof msg) != KILN_STATUS_OK)
            kt_fail(__FILE__, __LINE__, "%s: %s (request %d)", specs[i], msg, r.bad_request);
    }
    kiln_ctx_destroy(ctx);
}

/* A base variant for the focused tests. */
static void base_variant(kiln_variant *v, kiln_op op, kiln_kv_storage kv)
{
    kiln_variant_default(v);
    v->op = op;
    v->kv = kv;
    v->head_dim = 128;
    v->group = 4;
    v->q_dtype = v->kv_dtype = v->out_dtype = KILN_DTYPE_BF16;
    v->lse = 1;
}

/* Paged and ragged storage of one logical batch agree (bitwise under the same split). */
KT_GPU_TEST(gpu_batch_paged_equals_ragged)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    static const int kv[6] = {1, 54, 0, 513, 2048, 97}, qo[6] = {1, 17, 5, 37, 127, 0};
    for (int t = 0; t < 4; t++) {
        kiln_variant vp, vr;
        base_variant(&vp, t < 2 ? KILN_OP_DECODE : KILN_OP_PREFILL, KILN_KV_PAGED);
        vp.layout = t % 2 ? KILN_LAYOUT_HND : KILN_LAYOUT_NHD;
        vp.mask = t == 3 ? KILN_MASK_CAUSAL : KILN_MASK_NONE;
        vr = vp;
        vr.kv = KILN_KV_RAGGED;
        kiln_kernel *kp = get(ctx, &vp), *kr = get(ctx, &vr);
        if (!kp || !kr) continue;
        for (int fixed = 0; fixed < 2; fixed++) {
            int q6[6];
            memcpy(q6, qo, sizeof q6);
            if (vp.mask == KILN_MASK_CAUSAL)
                for (int b = 0; b < 6; b++) q6[b] = q6[b] > kv[b] ? kv[b] : q6[b];
            kiln_check_batch s = {.batch = 6,
                                  .qo_lens = q6,
                                  .kv_lens = kv,
                                  .num_qo_heads = 8,
                                  .page_size = 5,
                                  .window_left = -1,
                                  .fixed_split = fixed ? 256 : 0,
                                  .seed = 11u + (uint64_t)t};
            kiln_check_pair p;
            char msg[1024];
            kiln_status st = kiln_check_batch_equiv(ctx, kp, kr, &s, &p, msg, sizeof msg);
            if (st) kt_fail(__FILE__, __LINE__, "case %d fixed=%d: %s", t, fixed, msg);
            printf("    case %d fixed_split=%d: %s split, %s (max diff %.3g)\n", t, fixed ? 256 : 0,
                   p.same_split ? "same" : "different",
                   p.bitwise ? "bitwise equal" : "within tolerance", p.max_diff);
        }
    }
    kiln_ctx_destroy(ctx);
}

/* Ragged ≡ contiguous: each request of a ragged batch run alone through the single-request
 * kernel on the same data gives its batch rows (within tolerance: the batch decode of G 4 runs
 * on tensor cores, the single one on CUDA cores). */
KT_GPU_TEST(gpu_batch_equals_single)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    static const char *const specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=4 lse=1",
        "op=decode dtype=f16 head_dim=64 group=1 logits=softcap window=1",
        "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal lse=1",
        "op=prefill dtype=f16 head_dim=256 group=2 logits=alibi window=1",
    };
    static const int kv[7] = {1, 54, 0, 513, 2048, 97, 700}, qo[7] = {1, 17, 5, 37, 127, 0, 64};
    for (int t = 0; t < 4; t++) {
        kiln_variant vs, vb;
        if (!parsed(specs[t], &vs)) continue;
        vb = vs;
        vb.kv = KILN_KV_RAGGED;
        kiln_kernel *ks = get(ctx, &vs), *kb = get(ctx, &vb);
        if (!ks || !kb) continue;
        int q7[7];
        memcpy(q7, qo, sizeof q7);
        for (int b = 0; b < 7; b++)
            if (vs.mask == KILN_MASK_CAUSAL && q7[b] > kv[b]) q7[b] = kv[b];
        kiln_check_batch s = {.batch = 7,
                              .qo_lens = q7,
                              .kv_lens = kv,
                              .num_qo_heads = 8,
                              .window_left = -1,
                              .seed = 21u + (uint64_t)t};
        kiln_check_pair p;
        char msg[1024];
        if (kiln_check_batch_vs_single(ctx, kb, ks, &s, &p, msg, sizeof msg) != KILN_STATUS_OK)
            kt_fail(__FILE__, __LINE__, "%s: %s", specs[t], msg);
        else
            printf("    %s: %lld elements, %s (max diff %.3g)\n", specs[t], p.compared,
                   p.bitwise ? "bitwise equal" : "within tolerance", p.max_diff);
    }
    kiln_ctx_destroy(ctx);
}

/* Graph mode: one captured run replayed after re-planning other lengths into the workspace. */
KT_GPU_TEST(gpu_batch_graph_replay)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    static const int kv[12] = {1, 54, 97, 512, 2048, 0, 5, 16, 17, 300, 1000, 64};
    static const int qo[12] = {1, 17, 37, 127, 64, 3, 5, 16, 0, 9, 40, 1};
    for (int t = 0; t < 4; t++) {
        kiln_variant v;
        base_variant(&v, t % 2 ? KILN_OP_PREFILL : KILN_OP_DECODE,
                     t < 2 ? KILN_KV_PAGED : KILN_KV_RAGGED);
        v.layout = t == 3 ? KILN_LAYOUT_HND : KILN_LAYOUT_NHD;
        kiln_kernel *k = get(ctx, &v);
        if (!k) continue;
        kiln_check_batch s = {.batch = 12,
                              .qo_lens = qo,
                              .kv_lens = kv,
                              .num_qo_heads = 8,
                              .page_size = 16,
                              .window_left = -1,
                              .graph = 1,
                              .max_batch = 16,
                              .seed = 21u + (uint64_t)t};
        kiln_check_batch_result r;
        char msg[1024];
        kiln_status st = kiln_check_batch_run(ctx, k, &s, 0, &r, msg, sizeof msg);
        if (st) kt_fail(__FILE__, __LINE__, "case %d: %s", t, msg);
        KT_EQ_INT(r.batches, 2);
        KT_CHECK(r.plan.grid >= r.plan.items);
    }
    kiln_ctx_destroy(ctx);
}

/* fixed_split: a request's bits do not depend on the rest of the batch. */
KT_GPU_TEST(gpu_batch_invariance)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    int kv[17], qo[17];
    kiln_check_lens_uniform(kv, 17, 0, 3000, 5);
    kiln_check_lens_uniform(qo, 17, 1, 64, 6);
    kv[4] = 4097;
    for (int t = 0; t < 4; t++) {
        kiln_variant v;
        base_variant(&v, t % 2 ? KILN_OP_PREFILL : KILN_OP_DECODE,
                     t < 2 ? KILN_KV_PAGED : KILN_KV_RAGGED);
        v.logits = t == 2 ? KILN_LOGITS_SOFTCAP : KILN_LOGITS_NONE;
        kiln_kernel *k = get(ctx, &v);
        if (!k) continue;
        kiln_check_batch s = {.batch = 17,
                              .qo_lens = qo,
                              .kv_lens = kv,
                              .num_qo_heads = 8,
                              .page_size = 8,
                              .window_left = -1,
                              .fixed_split = 512,
                              .seed = 31u + (uint64_t)t};
        const int reqs[3] = {0, 4, 16};
        for (int j = 0; j < 3; j++) {
            kiln_check_pair p;
            char msg[1024];
            if (kiln_check_batch_invariance(ctx, k, &s, reqs[j], &p, msg, sizeof msg))
                kt_fail(__FILE__, __LINE__, "case %d: %s", t, msg);
        }
    }
    kiln_ctx_destroy(ctx);
}

/* Twin kernels k0 and k1 (one variant, two KILN_TUNE configs) on batch s in a mode: the same
 * bits both ways (kiln_check_batch_same), then k1 against the float64 reference; prints the
 * pair's line and returns it for the caller's checks. */
static kiln_check_pair twin_check(kiln_ctx *c1, kiln_kernel *k0, kiln_kernel *k1,
                                  const kiln_check_batch *s, const char *spec, int mode,
                                  const char *what)
{
    kiln_check_pair p;
    char msg[1024];
    if (kiln_check_batch_same(k0, k1, s, &p, msg, sizeof msg) != KILN_STATUS_OK)
        kt_fail(__FILE__, __LINE__, "%s mode %d: %s", spec, mode, msg);
    kiln_check_batch_result r;
    if (kiln_check_batch_run(c1, k1, s, 0, &r, msg, sizeof msg) != KILN_STATUS_OK)
        kt_fail(__FILE__, __LINE__, "%s mode %d (%s, reference): %s (request %d)", spec, mode, what,
                msg, r.bad_request);
    printf("    %s mode %d: %d items, %d merge tasks, %s\n", spec, mode, p.b.items, p.b.merge_tasks,
           p.bitwise ? "bitwise equal" : "DIFFERENT");
    return p;
}

/* A batch whose requests are all empty (no key, so no page at all): o = 0 and lse = -inf for
 * every row, on both decode families and the prefill kernels; eagerly with no page ids passed
 * (kv_indices 0, as a caller with no pages has none) and from a CUDA graph (page ids passed:
 * a graph-mode plan keeps needing them for the later schedules it replays). */
KT_GPU_TEST(gpu_batch_all_empty)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    static const char *const specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
        "op=decode dtype=f16 head_dim=64 group=1 kv=paged lse=1",
        "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
        "op=prefill dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
        "op=prefill dtype=f16 head_dim=64 group=1 kv=paged lse=1 q_tokens=4",
    };
    static const int qo[3] = {2, 1, 3}, kv0[3] = {0, 0, 0};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kiln_variant v;
        if (!parsed(specs[i], &v)) continue;
        kiln_kernel *k = get(ctx, &v);
        if (!k) continue;
        for (int graph = 0; graph < 2; graph++)
            for (int B = 1; B <= 3; B += 2) {
                kiln_check_batch s = {.batch = B,
                                      .qo_lens = v.op == KILN_OP_PREFILL ? qo : NULL,
                                      .kv_lens = kv0,
                                      .num_qo_heads = 2 * v.group,
                                      .page_size = 16,
                                      .window_left = -1,
                                      .graph = graph,
                                      .seed = 97u + i};
                kiln_check_batch_result r;
                char msg[1024];
                const kiln_status st = kiln_check_batch_run(ctx, k, &s, 0, &r, msg, sizeof msg);
                if (st)
                    kt_fail(__FILE__, __LINE__, "%s B=%d%s: %s", specs[i], B, graph ? " graph" : "",
                            msg);
                KT_CHECK(r.plan.total_keys == 0);
            }
    }
    kiln_ctx_destroy(ctx);
}

/* The partial states in a scratch buffer shared with a second plan (kiln_plan_schedule_scratch,
 * FlashInfer's shared float workspace): after every schedule, and before every run or replay,
 * the second plan of the same kernel is scheduled and run over the first half of the requests
 * on the same scratch (kiln_check_batch.scratch); the checked batch must still match the
 * float64 reference. Decode on both families (tensor cores G 4 bf16 and fp8 KV; CUDA cores
 * G 1), the fused merge (its counters live in each plan's own workspace), paged and ragged
 * prefill; eagerly and from a CUDA graph; a long request so that the planner splits. */
KT_GPU_TEST(gpu_batch_shared_scratch)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1), *fused = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx && fused);
    static const char *const specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
        "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
        "op=decode dtype=bf16 head_dim=128 group=1 kv=paged lse=1",
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", /* merge=1 below */
        "op=prefill dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
        "op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged lse=1",
    };
    static const int kv[7] = {1, 17, 1000, 4097, 0, 300, 2500};
    static const int qo[7] = {1, 17, 37, 5, 3, 64, 9};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kiln_variant v;
        if (!parsed(specs[i], &v)) continue;
        if (i == 3) setenv("KILN_TUNE", "merge=1", 1); /* read when the kernel is built */
        kiln_kernel *k = get(i == 3 ? fused : ctx, &v);
        if (i == 3) unsetenv("KILN_TUNE");
        if (!k) continue;
        if (i == 3) KT_CHECK(k->cfg.fused_merge == 1);
        for (int graph = 0; graph < 2; graph++) {
            kiln_check_batch s = {.batch = 7,
                                  .qo_lens = v.op == KILN_OP_PREFILL ? qo : NULL,
                                  .kv_lens = kv,
                                  .num_qo_heads = v.group == 1 ? 8 : 4 * v.group,
                                  .page_size = 16,
                                  .window_left = -1,
                                  .graph = graph,
                                  .scratch = 1,
                                  .seed = 131u + (uint64_t)(i * 2 + graph)};
            kiln_check_batch_result r;
            char msg[1024];
            if (kiln_check_batch_run(ctx, k, &s, 0, &r, msg, sizeof msg))
                kt_fail(__FILE__, __LINE__, "%s%s: %s (request %d)", specs[i],
                        graph ? " graph" : "", msg, r.bad_request);
            KT_CHECK(r.plan.merge_tasks > 0); /* split: the partial states were used */
        }
    }
    kiln_ctx_destroy(fused);
    kiln_ctx_destroy(ctx);
}

/* kiln_plan_schedule_scratch refuses bad buffers with a message naming the sizes, and a run
 * with another workspace than the one scheduled into: a schedule workspace below the int
 * region, a scratch that is not 256-byte aligned, a scratch pointer of 0 with bytes, and
 * kiln_plan_run given the scratch as its workspace. A scratch of 0 bytes schedules with no
 * split. */
KT_GPU_TEST(gpu_plan_scratch_errors)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    kiln_variant v;
    kiln_kernel *k = parsed("op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", &v)
                         ? get(ctx, &v)
                         : NULL;
    kiln_plan *pl = NULL;
    kiln_plan_opts o = {.num_qo_heads = 32, .page_size = 16};
    if (!k || kiln_plan_create(k, &o, &pl) != KILN_STATUS_OK) {
        kt_fail(__FILE__, __LINE__, "plan: %s", kiln_ctx_errmsg(ctx));
        kiln_ctx_destroy(ctx);
        return;
    }
    size_t sched = 0, scratch = 0;
    KT_OK(kiln_plan_workspace_sizes(pl, 1, 1, &sched, &scratch), kiln_ctx_errmsg(ctx));
    const kiln__cu *cu = ctx->cu;
    CUdeviceptr ws = 0, sc = 0;
    KT_REQUIRE(cu->cuMemAlloc(&ws, sched) == CUDA_SUCCESS);
    KT_REQUIRE(cu->cuMemAlloc(&sc, scratch + 256) == CUDA_SUCCESS);
    static const int indptr[2] = {0, 2048}, last[1] = {16}; /* 32768 keys: the planner splits */
    kiln_batch_shape sh = {.batch = 1, .kv_indptr = indptr, .kv_last_page_len = last};
    KT_STATUS(kiln_plan_schedule_scratch(pl, &sh, ws, 64, sc, scratch, NULL), KILN_STATUS_WORKSPACE,
              "schedule workspace too small");
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "the schedule workspace holds 64 bytes");
    KT_STATUS(kiln_plan_schedule_scratch(pl, &sh, ws, sched, sc + 16, scratch, NULL),
              KILN_STATUS_WORKSPACE, "misaligned scratch");
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "256-byte aligned");
    KT_STATUS(kiln_plan_schedule_scratch(pl, &sh, ws, sched, 0, scratch, NULL),
              KILN_STATUS_WORKSPACE, "no scratch pointer");
    KT_OK(kiln_plan_schedule_scratch(pl, &sh, ws, sched, 0, 0, NULL), kiln_ctx_errmsg(ctx));
    kiln_plan_info info;
    KT_OK(kiln_plan_describe(pl, &info), kiln_ctx_errmsg(ctx));
    KT_EQ_INT(info.split_items, 0);
    KT_OK(kiln_plan_schedule_scratch(pl, &sh, ws, sched, sc, scratch, NULL), kiln_ctx_errmsg(ctx));
    KT_OK(kiln_plan_describe(pl, &info), kiln_ctx_errmsg(ctx));
    KT_CHECK(info.split_items > 0);
    kiln_batch_args a = {.q = sc,
                         .k = sc,
                         .v = sc,
                         .o = sc,
                         .lse = sc,
                         .kv_indices = sc,
                         .workspace = sc,
                         .workspace_bytes = scratch};
    KT_STATUS(kiln_plan_run(pl, &a, NULL), KILN_STATUS_WORKSPACE, "run on the scratch");
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "is not the one planned into");
    KT_OK(cu->cuCtxSynchronize() == CUDA_SUCCESS ? KILN_STATUS_OK : KILN_STATUS_CUDA, "sync");
    kiln_plan_destroy(pl);
    cu->cuMemFree(ws);
    cu->cuMemFree(sc);
    kiln_ctx_destroy(ctx);
}

/* The split merge fused into the batch decode kernels (KILN_TUNE merge=1: the last CTA of each
 * merge task merges it) writes the bits the merge kernel writes (the default), on both
 * decode families: tensor cores (G 4 and G 1, paged and ragged, and fp8 KV read in
 * registers), CUDA cores (fp8 KV with RoPE at G 4).
 * A batch of odd lengths (1, 17, 1000, 4097, 0), pages of 16, lse on, split by fixed_split (256
 * keys, and 64: 33 to 65 slots in the longest request's task, which the merge kernel reads with
 * kiln_merge_wide, 64 states a round trip) and by the planner, run eagerly and from a CUDA
 * graph (kiln_check_batch_same: in graph mode each
 * schedule's graph is launched twice, the second time on the counters the first put back, and
 * a second schedule of other lengths is replayed the same way); the fused kernel is then
 * checked against the float64 reference in the same modes. */
KT_GPU_TEST(gpu_batch_fused_merge)
{
    kiln_ctx *c0 = KT_CTX(kt_cache_dir(), 1), *c1 = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(c0 && c1);
    static const char *const specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
        "op=decode dtype=f16 head_dim=64 group=4 kv=ragged lse=1 logits=softcap",
        "op=decode dtype=bf16 head_dim=128 group=1 kv=paged lse=1",
        "op=decode q_dtype=f16 kv_dtype=e4m3 out_dtype=f16 head_dim=256 group=4 kv=paged lse=1",
        "op=decode q_dtype=bf16 kv_dtype=e5m2 out_dtype=bf16 head_dim=128 group=4 kv=paged lse=1 "
        "rope=1",
    };
    static const int kv[5] = {1, 17, 1000, 4097, 0};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kiln_variant v;
        if (!parsed(specs[i], &v)) continue;
        /* KILN_TUNE is read when a kernel is built; each context memoises its own */
        kiln_kernel *k0 = get(c0, &v);
        setenv("KILN_TUNE", "merge=1", 1);
        kiln_kernel *k1 = get(c1, &v);
        unsetenv("KILN_TUNE");
        if (!k0 || !k1) continue;
        KT_CHECK(k0->cfg.fused_merge == 0 && k1->cfg.fused_merge == 1);
        KT_EQ_INT(k1->cfg.pack, !v.rope);      /* fp8 KV with RoPE: CUDA cores */
        for (int mode = 0; mode < 6; mode++) { /* planner / 256 / 64 keys a split, eager / graph */
            static const int split[3] = {0, 256, 64};
            kiln_check_batch s = {.batch = 5,
                                  .kv_lens = kv,
                                  .num_qo_heads = v.group == 1 ? 8 : 4 * v.group,
                                  .page_size = 16,
                                  .window_left = -1,
                                  .fixed_split = split[mode % 3],
                                  .graph = mode / 3,
                                  .seed = 81u + (uint64_t)(i * 6 + mode)};
            const kiln_check_pair p = twin_check(c1, k0, k1, &s, specs[i], mode, "fused");
            /* the same split both ways, and one with tasks: the fused merge ran */
            KT_CHECK(p.same_split && p.b.merge_tasks > 0);
            /* 64 keys a split (rounded up to the kernel's granule: 128 on CUDA cores): the
             * 4097-key request's task has more than KILN_MERGE_BATCH slots (k0's merge: wide) */
            if (split[mode % 3] == 64)
                KT_CHECK(p.b.kv_chunk > 0 &&
                         (kv[3] + p.b.kv_chunk - 1) / p.b.kv_chunk > KILN_MERGE_BATCH);
        }
    }
    kiln_ctx_destroy(c1);
    kiln_ctx_destroy(c0);
}

/* The tensor-core decode on its persistent grid (KILN_TUNE persist=1: each CTA runs several
 * work items, the next item's Q and first K/V tiles loaded under this item's last ones) writes
 * the bits the CTA-per-item kernel writes (persist=0, the default), and matches the float64
 * reference: G 4 paged with LSE, f16 d64 ragged soft-cap, G 8 ALiBi with a window, G 16; a
 * batch of 300 requests of odd lengths (1 to 1500 keys, every seventh empty), so that every CTA
 * runs several items, some with no tile; split by the planner and by fixed_split, run eagerly
 * and from a CUDA graph. */
KT_GPU_TEST(gpu_batch_decode_persist)
{
    kiln_ctx *c0 = KT_CTX(kt_cache_dir(), 1), *c1 = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(c0 && c1);
    static const char *const specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
        "op=decode dtype=f16 head_dim=64 group=4 kv=ragged logits=softcap",
        "op=decode dtype=f16 head_dim=128 group=8 kv=paged logits=alibi window=1 lse=1",
        "op=decode dtype=bf16 head_dim=128 group=16 kv=paged",
    };
    enum { B = 300 };
    static int kv[B];
    for (int b = 0; b < B; b++) kv[b] = b % 7 == 3 ? 0 : 1 + (b * 7919) % 1500;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kiln_variant v;
        if (!parsed(specs[i], &v)) continue;
        /* KILN_TUNE is read when a kernel is built; each context memoises its own */
        kiln_kernel *k0 = get(c0, &v);
        setenv("KILN_TUNE", "persist=1", 1);
        kiln_kernel *k1 = get(c1, &v);
        unsetenv("KILN_TUNE");
        if (!k0 || !k1) continue;
        KT_CHECK(k0->cfg.persist == 0 && k1->cfg.persist == 1 && k1->cfg.pack);
        for (int mode = 0; mode < 4; mode++) { /* planner / fixed split, eager / graph */
            kiln_check_batch s = {.batch = B,
                                  .kv_lens = kv,
                                  .num_qo_heads = 4 * v.group, /* 4 KV heads: 132 CTAs along x
                                                                  on an H100 / H200 */
                                  .page_size = 16,
                                  .window_left = -1,
                                  .fixed_split = mode & 1 ? 256 : 0,
                                  .graph = mode >> 1,
                                  .seed = 171u + (uint64_t)(i * 4 + mode)};
            const kiln_check_pair p = twin_check(c1, k0, k1, &s, specs[i], mode, "persist=1");
            KT_CHECK(p.same_split);
        }
    }
    kiln_ctx_destroy(c1);
    kiln_ctx_destroy(c0);
}

/* A spec, the KILN_TUNE it is built under, and the page size of its paged pool (0: 16). */
typedef struct {
    const char *spec, *tune;
    int page_size;
} tune_case;

/* Each case's kernel, built under its KILN_TUNE, against the float64 reference: 300 requests of
 * 0 to 1500 keys (empties among them) and 3 long ones, split by the planner and by fixed_split,
 * eagerly and from a CUDA graph. check(k, tune) says whether the tune reached the config. */
static void decode_tune_cases(const tune_case *cases, size_t n, unsigned seed,
                              int (*check)(const kiln_kernel *, const char *))
{
    enum { B = 300 };
    static int kv[B];
    for (int b = 0; b < B; b++) kv[b] = b % 7 == 3 ? 0 : 1 + (b * 7919) % 1500;
    static const int kv_long[3] = {8191, 1, 4097};
    for (size_t i = 0; i < n; i++) {
        kiln_variant v;
        if (!parsed(cases[i].spec, &v)) continue;
        /* KILN_TUNE is read when a kernel is built, and the context memoises it: a context of
         * its own for each case */
        kiln_ctx *c1 = KT_CTX(kt_cache_dir(), 1);
        KT_REQUIRE(c1);
        setenv("KILN_TUNE", cases[i].tune, 1);
        kiln_kernel *k = get(c1, &v);
        unsetenv("KILN_TUNE");
        if (!k) {
            kiln_ctx_destroy(c1);
            continue;
        }
        if (!check(k, cases[i].tune))
            kt_fail(__FILE__, __LINE__, "%s: KILN_TUNE %s is not in the config", cases[i].spec,
                    cases[i].tune);
        for (int mode = 0; mode < 8; mode++) { /* batch / long, planner / fixed, eager / graph */
            const int lng = mode & 1;
            kiln_check_batch s = {.batch = lng ? 3 : B,
                                  .kv_lens = lng ? kv_long : kv,
                                  .num_qo_heads = 4 * v.group,
                                  .page_size = cases[i].page_size ? cases[i].page_size : 16,
                                  .window_left = v.window ? 700 : -1,
                                  .fixed_split = mode & 2 ? 256 : 0,
                                  .graph = mode >> 2,
                                  .seed = seed + (uint64_t)(i * 8 + mode)};
            kiln_check_batch_result r;
            char msg[1024];
            if (kiln_check_batch_run(c1, k, &s, 0, &r, msg, sizeof msg) != KILN_STATUS_OK)
                kt_fail(__FILE__, __LINE__, "%s %s page %d mode %d: %s (request %d)", cases[i].spec,
                        cases[i].tune, s.page_size, mode, msg, r.bad_request);
        }
        kiln_ctx_destroy(c1);
    }
}

static int tune_int(const char *tune, const char *field)
{
    const char *at = strstr(tune, field);
    return at ? atoi(at + strlen(field)) : 0;
}

static int has_ksplit(const kiln_kernel *k, const char *tune)
{
    return k->cfg.ksplit == tune_int(tune, "ksplit=") && k->cfg.pack;
}

/* The tensor-core decode's key split (KILN_TUNE ksplit=2 / 4: 2 or 4 one-warp pipelines a CTA
 * over every other / fourth key tile, merged in shared memory) against the float64 reference
 * (decode_tune_cases): bf16 and f16, d64 / d128 / d256, groups 4 / 8 / 16, soft-cap, ALiBi
 * with a window, fp8 e4m3 KV. The bits are not the one-warp kernel's (the keys are summed in
 * another order), so each is checked against the reference only. */
KT_GPU_TEST(gpu_batch_decode_ksplit)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    const int sm = ctx->arch_sm;
    kiln_ctx_destroy(ctx);
    if (sm < 90) { /* four d128 pipelines take 210 KiB of shared memory */
        kt_skip("the key split's cases need sm_90's shared memory (this GPU: sm_%d)", sm);
        return;
    }
    static const tune_case cases[] = {
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "ksplit=4", 0},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "ksplit=2", 0},
        {"op=decode dtype=f16 head_dim=64 group=4 kv=ragged logits=softcap", "ksplit=4", 0},
        {"op=decode dtype=f16 head_dim=128 group=8 kv=paged logits=alibi window=1 lse=1",
         "ksplit=4", 0},
        {"op=decode dtype=bf16 head_dim=128 group=16 kv=paged", "ksplit=2", 0},
        {"op=decode dtype=bf16 head_dim=256 group=4 kv=paged lse=1", "ksplit=2", 0},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
         "ksplit=4", 0},
    };
    decode_tune_cases(cases, sizeof cases / sizeof cases[0], 313u, has_ksplit);
}

static int has_pack(const kiln_kernel *k, const char *tune)
{
    return k->cfg.pack == 1 && k->cfg.fused_merge == tune_int(tune, "merge=");
}

/* KILN_TUNE pack=1: the tensor-core decode at groups that do not divide the MMA's 16 rows
 * (1 .. 15), and above 16 on a warp of 16 rows per 16 heads (20, 24, 32, 64: 2 to 4 warps),
 * against the float64 reference (decode_tune_cases): bf16 / f16 / fp8 e4m3 and e5m2 KV, d64 /
 * d128 / d256, soft-cap, ALiBi with a window, ragged and paged, and the fused merge at groups
 * 3 and 20. */
KT_GPU_TEST(gpu_batch_decode_pack_groups)
{
    static const tune_case cases[] = {
        {"op=decode dtype=bf16 head_dim=128 group=1 kv=paged lse=1", "pack=1", 0},
        {"op=decode dtype=bf16 head_dim=128 group=2 kv=paged lse=1", "pack=1", 0},
        {"op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1", "pack=1", 0},
        {"op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1", "pack=1,merge=1", 0},
        {"op=decode dtype=f16 head_dim=64 group=5 kv=ragged logits=softcap", "pack=1", 0},
        {"op=decode dtype=bf16 head_dim=256 group=6 kv=paged logits=alibi window=1 lse=1", "pack=1",
         0},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=7 kv=paged lse=1",
         "pack=1", 0},
        {"op=decode dtype=bf16 head_dim=128 group=9 kv=paged lse=1", "pack=1", 0},
        {"op=decode dtype=f16 head_dim=128 group=11 kv=ragged lse=1", "pack=1", 0},
        {"op=decode q_dtype=bf16 kv_dtype=e5m2 out_dtype=bf16 head_dim=128 group=13 kv=paged",
         "pack=1", 0},
        {"op=decode dtype=bf16 head_dim=64 group=15 kv=paged logits=softcap lse=1", "pack=1", 0},
        {"op=decode dtype=bf16 head_dim=128 group=20 kv=paged lse=1", "pack=1", 0},
        {"op=decode dtype=bf16 head_dim=128 group=20 kv=paged lse=1", "pack=1,merge=1", 0},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=24 kv=paged",
         "pack=1", 0},
        {"op=decode dtype=f16 head_dim=64 group=32 kv=ragged lse=1", "pack=1", 0},
        {"op=decode dtype=bf16 head_dim=256 group=17 kv=paged logits=alibi window=1", "pack=1", 0},
        {"op=decode dtype=f16 head_dim=64 group=64 kv=ragged logits=softcap window=1", "pack=1", 0},
    };
    decode_tune_cases(cases, sizeof cases / sizeof cases[0], 911u, has_pack);
}

static int has_no_pack(const kiln_kernel *k, const char *tune)
{
    (void)tune;
    return k->cfg.pack == 0 && !k->cfg.wgmma;
}

/* KILN_TUNE pack=0: the CUDA-core batch decode, which the default keeps only for fp8 KV with
 * RoPE, at the 16-bit variants every batch decode now runs on tensor cores by default, against
 * the float64 reference (decode_tune_cases): group 1 paged NHD and HND, group 4 d64 soft-cap
 * on ragged KV, group 8 ALiBi with a window, group 2 d256, and the fused merge. */
KT_GPU_TEST(gpu_batch_decode_simt)
{
    static const tune_case cases[] = {
        {"op=decode dtype=bf16 head_dim=128 group=1 kv=paged lse=1", "pack=0", 0},
        {"op=decode dtype=f16 head_dim=128 group=1 kv=paged layout=hnd", "pack=0", 0},
        {"op=decode dtype=f16 head_dim=64 group=4 kv=ragged logits=softcap", "pack=0", 0},
        {"op=decode dtype=bf16 head_dim=128 group=8 kv=paged logits=alibi window=1 lse=1", "pack=0",
         0},
        {"op=decode dtype=bf16 head_dim=256 group=2 kv=paged lse=1", "pack=0", 0},
        {"op=decode dtype=bf16 head_dim=128 group=1 kv=paged lse=1", "pack=0,merge=1", 0},
    };
    decode_tune_cases(cases, sizeof cases / sizeof cases[0], 2113u, has_no_pack);
}

static int has_hx(const kiln_kernel *k, const char *tune)
{
    return k->cfg.hx == 1 && k->cfg.pack && k->cfg.ksplit == tune_int(tune, "ksplit=");
}

/* KILN_TUNE hx=1: the packed batch kernels with an item's KV heads on adjacent CTAs (the same
 * work per CTA, another order of dispatch) against the float64 reference (decode_tune_cases):
 * the referee's decode, d64 soft-cap, fp8 e4m3 KV, group 3 and the key split. */
KT_GPU_TEST(gpu_batch_decode_hx)
{
    static const tune_case cases[] = {
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "hx=1", 0},
        {"op=decode dtype=f16 head_dim=64 group=8 kv=ragged logits=softcap", "hx=1", 0},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
         "hx=1", 0},
        {"op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1", "pack=1,hx=1", 0},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "hx=1,ksplit=2", 0},
    };
    decode_tune_cases(cases, sizeof cases / sizeof cases[0], 1709u, has_hx);
}

static int has_bulk(const kiln_kernel *k, const char *tune)
{
    return k->cfg.bulk == tune_int(tune, "bulk=") && k->cfg.pack &&
           k->cfg.ksplit == tune_int(tune, "ksplit=") &&
           k->cfg.fused_merge == tune_int(tune, "merge=");
}

/* KILN_TUNE bulk=1: the tensor-core decode's K/V rows by cp.async.bulk into padded rows, a
 * stage's mbarrier waited on instead of cp.async's groups, against the float64 reference
 * (decode_tune_cases; the empty requests and the tails past each request's last key are the
 * zero-filled rows): the referee's decode, f16 d64 soft-cap on ragged KV, d256 ALiBi with a
 * window, group 3, the key split with the item-major order, the fused merge. bulk=2 (whole
 * tiles as TMA boxes, partial ones by rows into the same layout) the same, and over the page
 * sizes that take its boxes differently: 8 (four boxes a tile), 16 (two), 64 (a box a tile at
 * a row inside the page), 1 and 48 (no boxes: every tile by rows), a dense pool's 3-D maps and
 * the HND pool's 4-D ones. sm_90 and newer. */
KT_GPU_TEST(gpu_batch_decode_bulk)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    const int sm = ctx->arch_sm;
    kiln_ctx_destroy(ctx);
    if (sm < 90) {
        kt_skip("bulk copies need sm_90 (this GPU: sm_%d)", sm);
        return;
    }
    static const tune_case cases[] = {
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "bulk=1", 0},
        {"op=decode dtype=f16 head_dim=64 group=8 kv=ragged logits=softcap", "bulk=1", 0},
        {"op=decode dtype=bf16 head_dim=256 group=4 kv=paged logits=alibi window=1 lse=1", "bulk=1",
         0},
        {"op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1", "pack=1,bulk=1", 0},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "bulk=1,ksplit=2,hx=1", 0},
        {"op=decode dtype=bf16 head_dim=128 group=8 kv=paged lse=1", "bulk=1,merge=1", 0},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "bulk=2", 0},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged layout=hnd lse=1", "bulk=2", 0},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "bulk=2", 8},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged layout=hnd lse=1", "bulk=2", 64},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "bulk=2", 1},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "bulk=2", 48},
        {"op=decode dtype=f16 head_dim=64 group=8 kv=ragged logits=softcap", "bulk=2", 0},
        {"op=decode dtype=bf16 head_dim=256 group=4 kv=paged logits=alibi window=1 lse=1", "bulk=2",
         0},
        {"op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1", "pack=1,bulk=2", 0},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "bulk=2,ksplit=2,hx=1", 0},
        {"op=decode dtype=bf16 head_dim=128 group=8 kv=paged lse=1", "bulk=2,merge=1", 0},
    };
    decode_tune_cases(cases, sizeof cases / sizeof cases[0], 2203u, has_bulk);
}

/* The merge kernel as a programmatic dependent launch (pdl=1, the default on sm_90 and newer:
 * scheduled while the main kernel's last CTAs run, waiting in the kernel) writes the bits the
 * ordinary launch writes (KILN_TUNE pdl=0): the batch decode on both families (tensor cores
 * G 4, CUDA cores G 1) and a batch prefill, split by the planner and by fixed_split, run
 * eagerly and from a CUDA graph (the capture holds a programmatic edge; each graph launched
 * twice, a second schedule replayed the same way); the pdl=1 kernels against the float64
 * reference too. Skipped below sm_90, where there is no pdl=1. */
KT_GPU_TEST(gpu_batch_pdl)
{
    kiln_ctx *c0 = KT_CTX(kt_cache_dir(), 1), *c1 = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(c0 && c1);
    if (c1->arch_sm < 90) {
        kt_skip("programmatic dependent launch needs sm_90 or newer (this GPU: sm_%d)",
                c1->arch_sm);
        kiln_ctx_destroy(c1);
        kiln_ctx_destroy(c0);
        return;
    }
    static const char *const specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
        "op=decode dtype=bf16 head_dim=128 group=1 kv=paged lse=1",
        "op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged lse=1",
    };
    static const int kv[5] = {1, 17, 1000, 4097, 0}, pkv[5] = {4097, 8192, 1000, 17, 0},
                     pqo[5] = {3, 17, 64, 1, 0};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kiln_variant v;
        if (!parsed(specs[i], &v)) continue;
        const int decode = v.op == KILN_OP_DECODE;
        /* KILN_TUNE is read when a kernel is built; each context memoises its own */
        setenv("KILN_TUNE", "pdl=0", 1);
        kiln_kernel *k0 = get(c0, &v);
        setenv("KILN_TUNE", "pdl=1", 1); /* the default, named */
        kiln_kernel *k1 = get(c1, &v);
        unsetenv("KILN_TUNE");
        if (!k0 || !k1) continue;
        KT_CHECK(k0->cfg.pdl == 0 && k1->cfg.pdl == 1);
        for (int mode = 0; mode < 4; mode++) { /* planner / fixed split, eager / graph */
            kiln_check_batch s = {.batch = 5,
                                  .qo_lens = decode ? NULL : pqo,
                                  .kv_lens = decode ? kv : pkv,
                                  .num_qo_heads = v.group == 1 ? 8 : 4 * v.group,
                                  .page_size = 16,
                                  .window_left = -1,
                                  .fixed_split = decode && (mode & 1) ? 256 : 0,
                                  .graph = mode >> 1,
                                  .seed = 91u + (uint64_t)(i * 4 + mode)};
            const kiln_check_pair p = twin_check(c1, k0, k1, &s, specs[i], mode, "pdl=1");
            KT_CHECK(p.same_split);
            if (decode) KT_CHECK(p.b.merge_tasks > 0); /* the merge kernel ran */
        }
    }
    kiln_ctx_destroy(c1);
    kiln_ctx_destroy(c0);
}

/* Twin wgmma kernels of each case's spec, built under KILN_TUNE tune0 and tune1, write the same
 * bits (twin_check: batch prefill over requests of one row to several tiles, an empty one, run
 * eagerly and from a CUDA graph; the tune1 kernels against the float64 reference too); differs
 * says the two configs are the ones asked for. Skipped below sm_90 (no wgmma family). */
typedef struct {
    const char *spec, *tune0, *tune1;
} wgmma_twin;
static void wgmma_twins(const wgmma_twin *cases, size_t n, const char *what,
                        int (*differs)(const kiln__config *, const kiln__config *))
{
    kiln_ctx *c0 = KT_CTX(kt_cache_dir(), 1), *c1 = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(c0 && c1);
    if (c1->arch_sm < 90) {
        kt_skip("the wgmma family needs sm_90 (this GPU: sm_%d)", c1->arch_sm);
        kiln_ctx_destroy(c1);
        kiln_ctx_destroy(c0);
        return;
    }
    static const int pqo[6] = {3, 200, 700, 1, 0, 130}, pkv[6] = {4097, 900, 700, 17, 33, 130};
    for (size_t i = 0; i < n; i++) {
        kiln_variant v;
        if (!parsed(cases[i].spec, &v)) continue;
        /* KILN_TUNE is read when a kernel is built; each context memoises its own */
        setenv("KILN_TUNE", cases[i].tune0, 1);
        kiln_kernel *k0 = get(c0, &v);
        setenv("KILN_TUNE", cases[i].tune1, 1);
        kiln_kernel *k1 = get(c1, &v);
        unsetenv("KILN_TUNE");
        if (!k0 || !k1) continue;
        KT_CHECK(k0->cfg.wgmma && k1->cfg.wgmma && differs(&k0->cfg, &k1->cfg));
        for (int mode = 0; mode < 2; mode++) { /* eager / graph */
            kiln_check_batch s = {.batch = 6,
                                  .qo_lens = pqo,
                                  .kv_lens = pkv,
                                  .num_qo_heads = 4 * v.group,
                                  .page_size = 16,
                                  .window_left = v.window ? 301 : -1,
                                  .graph = mode,
                                  .seed = 131u + (uint64_t)(i * 2 + mode)};
            const kiln_check_pair p = twin_check(c1, k0, k1, &s, cases[i].spec, mode, what);
            KT_CHECK(p.same_split);
        }
    }
    kiln_ctx_destroy(c1);
    kiln_ctx_destroy(c0);
}

/* xjob=1 against xjob=0: the same persistent grid, only the job's last P V moved */
static int xjob_twins(const kiln__config *a, const kiln__config *b)
{
    return a->persist && b->persist == a->persist && a->xjob == 0 && b->xjob == 1;
}

/* The wgmma persistent grid with a job's last P V issued in one turn with the next job's first
 * S (KILN_TUNE xjob=1, opt-in) writes the bits the plain persistent grid writes (xjob=0): batch
 * prefill over causal and plain masks, ragged and paged KV, head dims 64, 128 and 256 (d256 on
 * the persistent grid it takes with persist=2), a logits transform with a window. */
KT_GPU_TEST(gpu_wgmma_xjob)
{
    static const wgmma_twin cases[] = {
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal lse=1", "xjob=0",
         "xjob=1"},
        {"op=prefill dtype=bf16 head_dim=128 group=1 kv=paged lse=1", "xjob=0", "xjob=1"},
        {"op=prefill dtype=bf16 head_dim=64 group=4 kv=ragged mask=causal lse=1", "xjob=0",
         "xjob=1"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask=causal logits=softcap "
         "window=1 lse=1",
         "xjob=0", "xjob=1"},
        {"op=prefill dtype=bf16 head_dim=256 group=4 kv=ragged mask=causal lse=1",
         "persist=2,xjob=0", "persist=2,xjob=1"},
    };
    wgmma_twins(cases, sizeof cases / sizeof cases[0], "xjob=1", xjob_twins);
}

/* kvsplit=1 against kvsplit=0: the same kernel, only the stages' barriers split */
static int kvsplit_twins(const kiln__config *a, const kiln__config *b)
{
    return a->persist == b->persist && a->xjob == b->xjob && a->kvsplit == 0 && b->kvsplit == 1;
}

/* A stage's K and V on barriers of their own (KILN_TUNE kvsplit=1, the default at d256 and for
 * the producer's fp8 and RoPE transforms) writes the bits one pair for both writes (kvsplit=0):
 * a CTA per job and both persistent grids (O staged in the held K tile), xjob=1, head dims 64,
 * 128 and 256, ragged and paged KV (TMA boxes per page, rows per warp), fp8 e4m3 and e5m2 KV,
 * RoPE (without LSE: bf16's rounding of the rotated q and k puts the LSE of a few rows with one
 * or two keys 1-3e-3 off the float64 reference, over the checker's 1e-3), a logits transform
 * with a window. */
KT_GPU_TEST(gpu_wgmma_kvsplit)
{
    static const wgmma_twin cases[] = {
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal lse=1", "kvsplit=0",
         "kvsplit=1"},
        {"op=prefill dtype=bf16 head_dim=128 group=1 kv=paged lse=1", "kvsplit=0", "kvsplit=1"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask=causal lse=1",
         "load=1,kvsplit=0", "load=1,kvsplit=1"},
        {"op=prefill dtype=f16 head_dim=64 group=4 kv=ragged mask=causal lse=1",
         "persist=1,xjob=1,kvsplit=0", "persist=1,xjob=1,kvsplit=1"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask=causal logits=softcap "
         "window=1 lse=1",
         "kvsplit=0", "kvsplit=1"},
        {"op=prefill dtype=bf16 head_dim=256 group=4 kv=ragged mask=causal lse=1", "kvsplit=0",
         "kvsplit=1"},
        {"op=prefill dtype=bf16 head_dim=256 group=2 kv=paged lse=1", "persist=2,kvsplit=0",
         "persist=2,kvsplit=1"},
        {"op=prefill q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged "
         "mask=causal lse=1",
         "kvsplit=0", "kvsplit=1"},
        {"op=prefill q_dtype=f16 kv_dtype=e5m2 out_dtype=f16 head_dim=64 group=4 kv=ragged lse=1",
         "kvsplit=0", "kvsplit=1"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal rope=1", "kvsplit=0",
         "kvsplit=1"},
    };
    wgmma_twins(cases, sizeof cases / sizeof cases[0], "kvsplit=1", kvsplit_twins);
}

/* qregs=1 against qregs=0: the same kernel, only where S takes Q from */
static int qregs_twins(const kiln__config *a, const kiln__config *b)
{
    return a->persist == b->persist && a->kvsplit == b->kvsplit && a->q_in_regs == 0 &&
           b->q_in_regs == 1;
}

/* S = Q K^T with Q's fragments in registers (KILN_TUNE qregs=1) writes the bits S from Q in
 * shared memory writes (qregs=0): a CTA per job and both persistent grids, head dims 64 and
 * 128, f16 and bf16, ragged and paged KV (by boxes and by rows), fp8 KV (Q widened beside it),
 * RoPE (Q rotated in place by the producer; without LSE, as in gpu_wgmma_kvsplit), a logits
 * transform with a window, K and V on split barriers. */
KT_GPU_TEST(gpu_wgmma_qregs)
{
    static const wgmma_twin cases[] = {
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal lse=1", "qregs=0",
         "qregs=1"},
        {"op=prefill dtype=bf16 head_dim=128 group=1 kv=paged lse=1", "persist=0,qregs=0",
         "persist=0,qregs=1"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask=causal lse=1", "load=1,qregs=0",
         "load=1,qregs=1"},
        {"op=prefill dtype=f16 head_dim=64 group=4 kv=ragged mask=causal lse=1",
         "persist=1,qregs=0", "persist=1,qregs=1"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask=causal logits=softcap "
         "window=1 lse=1",
         "kvsplit=1,qregs=0", "kvsplit=1,qregs=1"},
        {"op=prefill q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged "
         "mask=causal lse=1",
         "qregs=0", "qregs=1"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal rope=1", "qregs=0",
         "qregs=1"},
    };
    wgmma_twins(cases, sizeof cases / sizeof cases[0], "qregs=1", qregs_twins);
}

/* Unused pool slots and padding full of NaN must not leak into any output. */
KT_GPU_TEST(gpu_batch_nan_pool)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    static const int kv[5] = {3, 0, 17, 130, 1}, qo[5] = {2, 4, 17, 33, 1};
    for (int t = 0; t < 2; t++) {
        kiln_variant v;
        base_variant(&v, t ? KILN_OP_PREFILL : KILN_OP_DECODE, KILN_KV_PAGED);
        kiln_kernel *k = get(ctx, &v);
        if (!k) continue;
        kiln_check_batch s = {.batch = 5,
                              .qo_lens = qo,
                              .kv_lens = kv,
                              .num_qo_heads = 8,
                              .page_size = 16,
                              .window_left = -1,
                              .strided = 1,
                              .nan_pool = 1,
                              .seed = 41};
        kiln_check_batch_result r;
        char msg[1024];
        if (kiln_check_batch_run(ctx, k, &s, 0, &r, msg, sizeof msg))
            kt_fail(__FILE__, __LINE__, "case %d: %s", t, msg);
    }
    kiln_ctx_destroy(ctx);
}

KT_GPU_TEST(gpu_batch_merge)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    for (int t = 0; t < 4; t++) {
        kiln_variant v;
        kiln_variant_default(&v);
        v.op = KILN_OP_MERGE;
        v.q_dtype = v.kv_dtype = v.out_dtype = t % 2 ? KILN_DTYPE_BF16 : KILN_DTYPE_F16;
        v.head_dim = t < 2 ? 128 : t == 2 ? 64 : 256;
        kiln_kernel *k = get(ctx, &v);
        if (!k) continue;
        for (int op = 0; op < 3; op++) {
            kiln_check_merge_shape ms = {.rows = 1 + 37 * t,
                                         .num_heads = 8,
                                         .num_states = 2 + t,
                                         .strided = t % 2,
                                         .seed = 51u + (uint64_t)t};
            kiln_check_result r;
            char msg[1024];
            if (kiln_check_merge(ctx, k, (kiln_check_merge_op)op, &ms, &r, msg, sizeof msg))
                kt_fail(__FILE__, __LINE__, "dim %d op %d: %s", v.head_dim, op, msg);
        }
        kiln_check_merge_shape none = {.rows = 0, .num_heads = 8, .seed = 1};
        kiln_check_result r;
        char msg[1024];
        if (kiln_check_merge(ctx, k, KILN_CHECK_MERGE_STATE, &none, &r, msg, sizeof msg))
            kt_fail(__FILE__, __LINE__, "zero rows: %s", msg);
    }
    kiln_ctx_destroy(ctx);
}

/* Cascade: shared prefix once (prefill over the grouped queries) + private decode, merged,
 * equals the plain decode over prefix + private keys. */
KT_GPU_TEST(gpu_batch_cascade)
{
    kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
    KT_REQUIRE(ctx);
    int priv[17];
    kiln_check_lens_uniform(priv, 17, 1, 700, 61);
    priv[3] = 0; /* a request with no private keys: its decode state is empty */
    for (int t = 0; t < 2; t++) {
        kiln_variant vp, vd, vm;
        base_variant(&vp, KILN_OP_PREFILL, t ? KILN_KV_PAGED : KILN_KV_RAGGED);
        base_variant(&vd, KILN_OP_DECODE, KILN_KV_PAGED);
        vp.logits = vd.logits = t ? KILN_LOGITS_SOFTCAP : KILN_LOGITS_NONE;
        kiln_variant_default(&vm);
        vm.op = KILN_OP_MERGE;
        vm.q_dtype = vm.kv_dtype = vm.out_dtype = vd.out_dtype;
        vm.head_dim = vd.head_dim;
        kiln_kernel *kp = get(ctx, &vp), *kd = get(ctx, &vd), *km = get(ctx, &vm);
        if (!kp || !kd || !km) continue;
        kiln_check_batch s = {.batch = 17,
                              .kv_lens = priv,
                              .num_qo_heads = 8,
                              .page_size = 16,
                              .seed = 71u + (uint64_t)t};
        kiln_check_result r;
        char msg[1024];
        if (kiln_check_cascade(ctx, kp, kd, km, &s, 1000 + 537 * t, &r, msg, sizeof msg))
            kt_fail(__FILE__, __LINE__, "case %d: %s", t, msg);
    }
    kiln_ctx_destroy(ctx);
}

/* The persistent wgmma grid's jobs in sections of heads (kiln_launch_params.job_heads,
 * wgmma_attention.cuh wg_persist_job) against the float64 reference: KILN_JOB_HEADS 1, 3 and 5
 * (sections that cut a KV head's group, and a last section shorter than the others) on ragged
 * and paged causal batches and a non-causal ragged one, H 24 / H_KV 6, eager and from a CUDA
 * graph; every kernel on the persistent grid. */
KT_GPU_TEST(gpu_wgmma_job_sections)
{
    static const char *const specs[] = {
        "op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal lse=1",
        "op=prefill dtype=f16 head_dim=64 group=4 kv=paged mask=causal",
        "op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged",
    };
    static const char *const heads[] = {"1", "3", "5"};
    static const int kv[4] = {1000, 1, 2049, 333};
    for (size_t e = 0; e < sizeof heads / sizeof heads[0]; e++) {
        setenv("KILN_JOB_HEADS", heads[e], 1); /* read when the context is made */
        kiln_ctx *ctx = KT_CTX(kt_cache_dir(), 1);
        unsetenv("KILN_JOB_HEADS");
        KT_REQUIRE(ctx);
        for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
            kiln_variant v;
            if (!parsed(specs[i], &v)) continue;
            kiln_kernel *k = get(ctx, &v);
            if (!k) continue;
            if (!k->cfg.wgmma || !k->cfg.persist) {
                kt_fail(__FILE__, __LINE__, "%s: not on the persistent wgmma grid", specs[i]);
                continue;
            }
            for (int graph = 0; graph < 2; graph++) {
                kiln_check_batch s = {.batch = 4,
                                      .qo_lens = kv,
                                      .kv_lens = kv,
                                      .num_qo_heads = 24,
                                      .page_size = 16,
                                      .window_left = -1,
                                      .graph = graph,
                                      .seed = 5900u + (uint64_t)(e * 8 + i * 2 + (size_t)graph)};
                kiln_check_batch_result r;
                char msg[1024];
                if (kiln_check_batch_run(ctx, k, &s, 0, &r, msg, sizeof msg) != KILN_STATUS_OK)
                    kt_fail(__FILE__, __LINE__, "%s KILN_JOB_HEADS=%s graph=%d: %s (request %d)",
                            specs[i], heads[e], graph, msg, r.bad_request);
            }
        }
        kiln_ctx_destroy(ctx);
    }
}
