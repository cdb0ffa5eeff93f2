/*
 * suites.c — kiln-bench --batch's decode and prefill suites: the paged decode sweep (bf16 and fp8
 * KV, B x L_KV, then head dims at one shape) and batch prefill (ragged and paged, causal, at
 * equal total tokens), one point at a time through the machinery of batch.c; then the cascade
 * and host-overhead suites of cascade.c. The point names --only and --list know.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "check.h"

/* ---- one decode or prefill point ------------------------------------------------------------ */

typedef struct bpoint {
    const char *name, *spec;
    int B, L_Q, L_KV; /* decode: L_Q = 0 (one row per request) */
} bpoint;

/* Bytes one copy of a point's inputs takes (q, k, v) plus the outputs. */
static double point_bytes(const bshape *s, int D, int elt, int64_t pool_units, int paged)
{
    const double kv = (double)pool_units * (paged ? PAGE : 1) * HKV * D * elt;
    return (double)s->total_qo * HQ * D * 2 * 2 + 2 * kv;
}

static int copies_for(double bytes)
{
    if (bytes >= (double)ROTATE_BYTES) return 1;
    int c = (int)ceil((double)ROTATE_BYTES / bytes);
    return c > MAX_COPIES ? MAX_COPIES : c;
}

/* The kernel of a point, or NULL after printing why (counted as failed). */
static kiln_kernel *point_kernel(bench_env *env, const bpoint *pt, kiln_variant *v)
{
    kiln_kernel *k = NULL;
    if (kiln_variant_parse(pt->spec, v)) {
        printf("| %s | %d | %d | bad spec: %s |\n", pt->name, pt->B, pt->L_KV, kiln_errmsg());
        env->failed++;
        return NULL;
    }
    if (kiln_kernel_get(env->ctx, v, &k)) {
        printf("| %s | %d | %d | compile failed: %s |\n", pt->name, pt->B, pt->L_KV,
               kiln_ctx_errmsg(env->ctx));
        env->failed++;
        return NULL;
    }
    return k;
}

/* One checked run on poisoned outputs (0xff.. is NaN in bf16 and f32) against the sampled
 * reference. A mismatch is reported in a comment and counted; *check says which. */
static kiln_status point_check(bench_env *env, const bpoint *pt, const kiln_variant *v,
                               const brun *rc, const char **check, char *msg, size_t cap)
{
    kiln_status st = KILN_STATUS_OK;
    if (env->cu->cuMemsetD8(rc->b->o, 0xff, rc->b->q_bytes) ||
        env->cu->cuMemsetD8(rc->b->lse, 0xff, 16)) {
        snprintf(msg, cap, "poison o failed");
        return KILN_STATUS_CUDA;
    }
    if ((st = brun_step((void *)rc, 0))) {
        snprintf(msg, cap, "run: %s", kiln_ctx_errmsg(env->ctx));
        return st;
    }
    if (env->cu->cuCtxSynchronize()) {
        snprintf(msg, cap, "run failed on the device");
        return KILN_STATUS_CUDA;
    }
    st = bcheck_rows(env, v, rc->b, rc->s, v->mask == KILN_MASK_CAUSAL, msg, cap);
    if (st != KILN_STATUS_MISMATCH) return st;
    *check = "MISMATCH";
    printf("<!-- %s B%d L%d: %s -->\n", pt->name, pt->B, pt->L_KV, msg);
    env->failed++;
    return KILN_STATUS_OK;
}

/* The table row and CSV row of a timed point: decode GB/s, prefill TFLOP/s. */
static void point_report(bench_env *env, const bpoint *pt, const kiln_variant *v, const bshape *s,
                         int copies, double ms, const char *check)
{
    const int D = v->head_dim;
    const int elt = v->kv_dtype == KILN_DTYPE_E4M3 || v->kv_dtype == KILN_DTYPE_E5M2 ? 1 : 2;
    if (pt->L_Q == 0) {
        const double bytes =
            (double)s->total_kv * HKV * D * elt * 2 + (double)s->B * HQ * D * 2 * 2;
        const double gbs = bytes / (ms * 1e-3) / 1e9;
        printf("| %s | %d | %d | %.4f | %.0f | %.1f | %.1f | %d | %s |\n", pt->name, pt->B,
               pt->L_KV, ms, gbs, 100 * gbs / env->copy_gbs,
               env->read_gbs > 0 ? 100 * gbs / env->read_gbs : 0.0, copies, check);
        bcsv_row(env, pt->name, pt->spec, pt->B, 1, pt->L_KV, ms, gbs, 0, check);
        return;
    }
    double pairs = 0;
    for (int i = 0; i < pt->L_Q; i++) {
        const int vis = v->mask == KILN_MASK_CAUSAL ? i + pt->L_KV - pt->L_Q + 1 : pt->L_KV;
        pairs += vis < pt->L_KV ? vis : pt->L_KV;
    }
    const double tf = 4.0 * D * pairs * HQ * pt->B / (ms * 1e-3) / 1e12;
    printf("| %s | %d | %d | %.4f | %.1f | %d | %s |\n", pt->name, pt->B, pt->L_KV, ms, tf, copies,
           check);
    bcsv_row(env, pt->name, pt->spec, pt->B, pt->L_Q, pt->L_KV, ms, 0, tf, check);
}

/* Run one point; prints its table row (decode: GB/s columns; prefill: TFLOP/s). */
static void run_point(bench_env *env, const bpoint *pt)
{
    char msg[512] = "";
    kiln_variant v;
    kiln_plan *plan = NULL;
    bshape s = {0};
    bbufs b = {0};
    const char *check = "ok";
    kiln_kernel *k = point_kernel(env, pt, &v);
    if (!k) return;
    const int paged = v.kv == KILN_KV_PAGED;
    const int elt = v.kv_dtype == KILN_DTYPE_E4M3 || v.kv_dtype == KILN_DTYPE_E5M2 ? 1 : 2;
    int *kvl = malloc(sizeof(int) * (size_t)pt->B);
    for (int i = 0; kvl && i < pt->B; i++) kvl[i] = pt->L_KV;
    if (!kvl || bshape_make(&s, pt->B, pt->L_Q, kvl, paged)) {
        free(kvl);
        bshape_free(&s);
        printf("| %s | out of host memory |\n", pt->name);
        env->failed++;
        return;
    }
    free(kvl);
    const int64_t units = paged ? s.n_idx : s.total_kv;
    const double one = point_bytes(&s, v.head_dim, elt, units, paged);
    b.copies = copies_for(one);
    const double gib = one * b.copies / (1024.0 * 1024 * 1024);
    if (gib > env->max_gib) {
        printf("| %s | %d | %d | skipped: %.1f GiB of buffers (over --max-gib %.0f) |\n", pt->name,
               pt->B, pt->L_KV, gib, env->max_gib);
        bshape_free(&s);
        return;
    }
    kiln_status st = bbufs_alloc(env, &b, &s, paged, v.head_dim, elt, units, NULL, msg, sizeof msg);
    if (st == KILN_STATUS_NO_MEMORY) {
        printf("| %s | %d | %d | skipped: %.1f GiB does not fit (%s) |\n", pt->name, pt->B,
               pt->L_KV, gib, msg);
        goto out;
    }
    if (!st) st = bplan_make(env, k, &s, &b, &plan, msg, sizeof msg);
    brun rc = {plan, &b, &s};
    if (!st) st = point_check(env, pt, &v, &rc, &check, msg, sizeof msg);
    double ms = 0;
    if (!st) st = btime_steps(env, brun_step, &rc, b.copies, &ms, msg, sizeof msg);
    if (st) {
        printf("| %s | %d | %d | failed: %s |\n", pt->name, pt->B, pt->L_KV, msg);
        env->failed++;
        goto out;
    }
    point_report(env, pt, &v, &s, b.copies, ms, check);
out:
    kiln_plan_destroy(plan);
    bbufs_free(env, &b);
    bshape_free(&s);
}

/* ---- the suites ------------------------------------------------------------------------------ */

static const struct {
    const char *name, *spec;
} decode_kinds[] = {
    {"batch decode", DEC(BF16, 128)},
    {"batch decode fp8", DEC(FP8, 128)},
};
static const struct {
    const char *name, *spec;
} decode_dims[] = {
    {"batch decode d64", DEC(BF16, 64)},
    {"batch decode d256", DEC(BF16, 256)},
    {"batch decode fp8 d64", DEC(FP8, 64)},
    {"batch decode fp8 d256", DEC(FP8, 256)},
};
static const struct {
    const char *name, *spec;
    int causal_only; /* 0: also at B4 x 4096 only (non-causal reference point) */
} prefill_kinds[] = {
    {"batch prefill ragged causal", PRE("ragged", " mask=causal"), 1},
    {"batch prefill paged causal", PRE("paged", " mask=causal"), 1},
    {"batch prefill ragged", PRE("ragged", ""), 0},
};

static const int dec_B[] = {1, 16, 64, 256}, dec_L[] = {512, 4096, 32768};
/* (B, S): the single/batch sweep of equal total tokens (16384) plus single requests */
static const int pre_BS[][2] = {{1, 1024}, {16, 1024}, {1, 4096}, {4, 4096}, {1, 16384}};

/* Every batch point name, in suite order; NULL-terminated. */
static const char *const *names(void)
{
    static const char *all[32];
    if (!all[0]) {
        size_t n = 0;
        for (size_t i = 0; i < sizeof decode_kinds / sizeof decode_kinds[0]; i++)
            all[n++] = decode_kinds[i].name;
        for (size_t i = 0; i < sizeof decode_dims / sizeof decode_dims[0]; i++)
            all[n++] = decode_dims[i].name;
        for (size_t i = 0; i < sizeof prefill_kinds / sizeof prefill_kinds[0]; i++)
            all[n++] = prefill_kinds[i].name;
        all[n++] = cascade_name;
        all[n++] = host_name;
    }
    return all;
}

void batch_list(void)
{
    for (const char *const *n = names(); *n; n++) puts(*n);
}

int batch_known(const char *name)
{
    for (const char *const *n = names(); *n; n++)
        if (!strcmp(*n, name)) return 1;
    return 0;
}

static void decode_suite(bench_env *env)
{
    printf("\n### Batch decode (paged, page %d, H %d, H_KV %d; GB/s of K+V+q+o; %% of copy / read "
           "ceilings)\n\n",
           PAGE, HQ, HKV);
    printf("| point | B | L_KV | ms | GB/s | %% copy | %% read | copies | check |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof decode_kinds / sizeof decode_kinds[0]; i++) {
        if (!bench_on(env, decode_kinds[i].name)) continue;
        for (size_t bi = 0; bi < sizeof dec_B / sizeof dec_B[0]; bi++)
            for (size_t li = 0; li < sizeof dec_L / sizeof dec_L[0]; li++) {
                if (env->quick && (dec_B[bi] == 16 || dec_B[bi] == 256 || dec_L[li] == 512))
                    continue;
                bpoint p = {decode_kinds[i].name, decode_kinds[i].spec, dec_B[bi], 0, dec_L[li]};
                run_point(env, &p);
            }
    }
    for (size_t i = 0; i < sizeof decode_dims / sizeof decode_dims[0]; i++) {
        if (!bench_on(env, decode_dims[i].name) ||
            (env->quick && strstr(decode_dims[i].name, "fp8")))
            continue;
        bpoint p = {decode_dims[i].name, decode_dims[i].spec, 64, 0, 4096};
        run_point(env, &p);
    }
}

static void prefill_suite(bench_env *env)
{
    printf("\n### Batch prefill (bf16 d%d, H %d, H_KV %d; TFLOP/s = 4·D·visible pairs·H, causal "
           "counts "
           "S(S+1)/2 pairs per request)\n\n",
           128, HQ, HKV);
    printf("| point | B | S | ms | TFLOP/s | copies | check |\n|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof prefill_kinds / sizeof prefill_kinds[0]; i++) {
        if (!bench_on(env, prefill_kinds[i].name)) continue;
        for (size_t j = 0; j < sizeof pre_BS / sizeof pre_BS[0]; j++) {
            const int B = pre_BS[j][0], S = pre_BS[j][1];
            if (!prefill_kinds[i].causal_only && !(B == 4 && S == 4096)) continue;
            if (env->quick && !(B == 4 && S == 4096) && !(B == 16 && S == 1024)) continue;
            bpoint p = {prefill_kinds[i].name, prefill_kinds[i].spec, B, S, S};
            run_point(env, &p);
        }
    }
}

int batch_run_all(bench_env *env)
{
    decode_suite(env);
    prefill_suite(env);
    cascade_suite(env);
    host_suite(env);
    return env->failed;
}
