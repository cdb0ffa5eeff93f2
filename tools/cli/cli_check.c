/*
 * cli_check.c — `kiln check`: run a kernel on the GPU against the float64 reference of the check
 * library (tools/check): a single-request variant once per kv length, a batch variant (kv=ragged
 * or kv=paged) as one planned batch, op=merge through the three merge entry points. Parses the
 * shape options, refuses what the reference cannot know (snippets, params), prints one line per
 * shape.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_batch.h"
#include "cli.h"
#include "jit.h"

/* Most kv lengths one `kiln check` runs. */
#define CHECK_KV_MAX 64

/* ---- check ---------------------------------------------------------------------------------- */

typedef struct check_args {
    const char *heads, *qo_len, *kv_len, *window_left, *softcap, *seed, *time;
    int strided;
    /* batches (kv=ragged|paged) and merges (op=merge) */
    const char *batch, *kv_lens, *kv_dist, *qo_lens, *qo_dist, *page_size, *fixed_split;
    int graph;
} check_args;

/* --seed: a whole number into *seed; CLI_USAGE (with the message printed) otherwise. */
static int parse_seed(const char *cmd, const char *text, uint64_t *seed)
{
    char *end = NULL;
    errno = 0;
    const unsigned long long x = strtoull(text, &end, 10);
    if (!*text || *end || errno || text[0] == '-')
        return cli_fail(cmd, CLI_USAGE, "--seed '%s': expected a whole number", text);
    *seed = x;
    return 0;
}

/* --heads (default max(8, 2G), rounded up to a multiple of G) into *out; it must be a multiple
 * of the group g. */
static int parse_heads(const char *cmd, const char *text, long g, int *out)
{
    long heads = 2 * g > 8 ? 2 * g : 8;
    heads = (heads + g - 1) / g * g;
    int rc = text ? cli_long(cmd, "--heads", text, 1, 1 << 16, &heads) : 0;
    if (rc) return rc;
    if (heads % g)
        return cli_fail(cmd, CLI_USAGE, "--heads %ld: not a multiple of group %ld", heads, g);
    *out = (int)heads;
    return 0;
}

/* --softcap, when given, into *out (a number > 0). */
static int parse_softcap(const char *cmd, const char *text, float *out)
{
    if (!text) return 0;
    char *end = NULL;
    const double cap = strtod(text, &end);
    if (!*text || *end || !(cap > 0 && cap < 1e30))
        return cli_fail(cmd, CLI_USAGE, "--softcap '%s': expected a number > 0", text);
    *out = (float)cap;
    return 0;
}

/* An option with a whole-number value in [min, max], when given, into *out. */
static int parse_int(const char *cmd, const char *opt, const char *text, long min, long max,
                     int *out)
{
    long x = 0;
    if (!text) return 0;
    int rc = cli_long(cmd, opt, text, min, max, &x);
    if (!rc) *out = (int)x;
    return rc;
}

/* --kv-len of a single-request check: a comma-separated list into kv[CHECK_KV_MAX], *nkv. */
static int parse_kv_list(const char *cmd, const char *text, long kv[CHECK_KV_MAX], int *nkv)
{
    const char *p = text ? text : "577";
    for (*nkv = 0;;) {
        char word[32];
        size_t n = strcspn(p, ",");
        int rc = 0;
        if (*nkv >= CHECK_KV_MAX)
            return cli_fail(cmd, CLI_USAGE, "more than %d kv lengths", CHECK_KV_MAX);
        snprintf(word, sizeof word, "%.*s", (int)(n < sizeof word ? n : sizeof word - 1), p);
        if (n >= sizeof word || (rc = cli_long(cmd, "--kv-len", word, 1, 1 << 30, &kv[*nkv])))
            return rc ? rc : cli_fail(cmd, CLI_USAGE, "--kv-len '%s': bad list", text);
        ++*nkv;
        if (!p[n]) return 0;
        p += n + 1;
    }
}

/* Turn the option texts into a shape template, the kv lengths and the timing reps. */
static int check_shape(const check_args *ca, const kiln_variant *v, kiln_check_shape *s,
                       long kv[CHECK_KV_MAX], int *nkv, long *reps)
{
    const char *cmd = "check";
    int rc = 0, qo_len = 128;
    memset(s, 0, sizeof *s);
    s->window_left = -1;
    *reps = 0;
    if ((rc = parse_heads(cmd, ca->heads, v->group, &s->num_qo_heads)) ||
        (rc = parse_int(cmd, "--qo-len", ca->qo_len, 1, 1 << 24, &qo_len)) ||
        (rc = parse_int(cmd, "--window-left", ca->window_left, 0, 1 << 30, &s->window_left)) ||
        (rc = parse_softcap(cmd, ca->softcap, &s->softcap)))
        return rc;
    s->qo_len = v->op == KILN_OP_DECODE ? 1 : qo_len;
    if (ca->seed && parse_seed(cmd, ca->seed, &s->seed)) return CLI_USAGE;
    s->strided = ca->strided;
    if (ca->time && (rc = cli_long(cmd, "--time", ca->time, 1, 1000000, reps))) return rc;
    return parse_kv_list(cmd, ca->kv_len, kv, nkv);
}

/* Print one result line (and the first mismatch). */
static void check_print(const kiln_variant *v, const kiln_check_shape *s, int mismatch,
                        const kiln_check_result *r)
{
    printf("%s H=%d L_Q=%d L_KV=%d max_err=%.3g (atol %.3g rtol %.3g) rel_l2=%.3g",
           mismatch ? "MISMATCH" : "ok", s->num_qo_heads, s->qo_len, s->kv_len, r->max_err, r->atol,
           r->rtol, r->rel_l2);
    if (v->lse) printf(" lse_err=%.3g", r->lse_max_err);
    if (r->kernel_ms > 0) {
        double sec = r->kernel_ms * 1e-3;
        printf(" time=%.4f ms, %.1f GB/s, %.2f TFLOP/s", r->kernel_ms, r->bytes / sec / 1e9,
               r->flops / sec / 1e12);
    }
    printf("\n");
    if (mismatch)
        printf("  first bad: %s (%lld of %lld elements out of tolerance)\n", r->first_bad, r->bad,
               r->checked);
    fflush(stdout);
}

/* ---- check of batches and merges ------------------------------------------------------------ */

/* Most requests one batch check runs. */
#define CHECK_BATCH_MAX 65536

/* A comma-separated list of lengths in [0, 1 << 24] into out[cap]; *n gets the count. */
static int parse_lens(const char *opt, const char *text, int *out, int cap, int *n)
{
    const char *p = text;
    for (*n = 0;;) {
        char word[32];
        long x = 0;
        size_t len = strcspn(p, ",");
        if (*n >= cap) return cli_fail("check", CLI_USAGE, "%s: more than %d lengths", opt, cap);
        if (len == 0 || len >= sizeof word)
            return cli_fail("check", CLI_USAGE, "%s '%s': bad list", opt, text);
        snprintf(word, sizeof word, "%.*s", (int)len, p);
        int rc = cli_long("check", opt, word, 0, 1 << 24, &x);
        if (rc) return rc;
        out[(*n)++] = (int)x;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

/* "uniform:LO:HI" into lo, hi. */
static int parse_dist(const char *opt, const char *text, int *lo, int *hi)
{
    char extra;
    if (sscanf(text, "uniform:%d:%d%c", lo, hi, &extra) != 2 || *lo < 0 || *hi < *lo ||
        *hi > (1 << 24))
        return cli_fail("check", CLI_USAGE,
                        "%s '%s': expected uniform:LO:HI with 0 <= LO <= HI <= %d", opt, text,
                        1 << 24);
    return 0;
}

/* Per-request lengths from --X-len N, --X-lens LIST or --X-dist uniform:LO:HI (at most one)
 * into out[B]; *batch is set from a list when still 0. */
static int batch_lens(const char *what, const char *one, const char *list, const char *dist,
                      int deflt, int *batch, uint64_t seed, int *out)
{
    char o1[32], o2[32], o3[32];
    snprintf(o1, sizeof o1, "--%s-len", what);
    snprintf(o2, sizeof o2, "--%s-lens", what);
    snprintf(o3, sizeof o3, "--%s-dist", what);
    if (!!one + !!list + !!dist > 1)
        return cli_fail("check", CLI_USAGE, "give at most one of %s, %s and %s", o1, o2, o3);
    int rc = 0, n = 0, lo = deflt, hi = deflt;
    if (list) {
        if ((rc = parse_lens(o2, list, out, CHECK_BATCH_MAX, &n))) return rc;
        if (*batch && n != *batch)
            return cli_fail("check", CLI_USAGE, "%s has %d lengths for a batch of %d", o2, n,
                            *batch);
        *batch = n;
        return 0;
    }
    if (one) {
        long x = 0;
        if ((rc = cli_long("check", o1, one, 0, 1 << 24, &x))) return rc;
        lo = hi = (int)x;
    }
    if (dist && (rc = parse_dist(o3, dist, &lo, &hi))) return rc;
    if (!*batch) *batch = 1;
    kiln_check_lens_uniform(out, *batch, lo, hi, seed);
    return 0;
}

/* The option of the batch-only per-request options that a decode batch cannot take (it has one
 * query row per request); NULL when none is given. */
static const char *decode_qo_option(const check_args *ca)
{
    return ca->qo_len ? "--qo-len" : ca->qo_lens ? "--qo-lens" : ca->qo_dist ? "--qo-dist" : NULL;
}

/* The per-request lengths of a batch check: B (from --batch, else the first list, else 8), then
 * kv[] and (prefill) qo[] from their options. */
static int batch_lengths(const check_args *ca, const kiln_variant *v, kiln_check_batch *s,
                         int batch, int *qo, int *kv)
{
    const char *cmd = "check";
    int rc = 0;
    if (ca->kv_len && strchr(ca->kv_len, ','))
        return cli_fail(cmd, CLI_USAGE,
                        "--kv-len '%s': one length for every request (--kv-lens gives a list)",
                        ca->kv_len);
    if (ca->qo_len && strchr(ca->qo_len, ','))
        return cli_fail(cmd, CLI_USAGE,
                        "--qo-len '%s': one length for every request (--qo-lens gives a list)",
                        ca->qo_len);
    if (v->op == KILN_OP_DECODE && decode_qo_option(ca))
        return cli_fail(cmd, CLI_USAGE, "%s: a decode batch has one query row per request",
                        decode_qo_option(ca));
    if ((ca->kv_lens && !ca->batch) || (ca->qo_lens && !ca->batch)) { /* B from the first list */
        int n = 0;
        if ((rc = parse_lens(ca->kv_lens ? "--kv-lens" : "--qo-lens",
                             ca->kv_lens ? ca->kv_lens : ca->qo_lens, kv, CHECK_BATCH_MAX, &n)))
            return rc;
        batch = n;
    }
    if (!ca->batch && !ca->kv_lens && !ca->qo_lens) batch = 8;
    if ((rc = batch_lens("kv", ca->kv_len, ca->kv_lens, ca->kv_dist, 577, &batch, s->seed ^ 0x6b76,
                         kv)))
        return rc;
    if (v->op == KILN_OP_PREFILL && (rc = batch_lens("qo", ca->qo_len, ca->qo_lens, ca->qo_dist,
                                                     128, &batch, s->seed ^ 0x716f, qo)))
        return rc;
    if (v->op == KILN_OP_DECODE)
        for (int b = 0; b < batch; b++) qo[b] = 1;
    s->batch = batch;
    s->qo_lens = qo;
    s->kv_lens = kv;
    return 0;
}

/* Parse the batch options of `kiln check` into s (lengths in qo[], kv[] of CHECK_BATCH_MAX). */
static int batch_shape(const check_args *ca, const kiln_variant *v, kiln_check_batch *s, int *qo,
                       int *kv, long *reps)
{
    const char *cmd = "check";
    int rc = 0, batch = 0;
    memset(s, 0, sizeof *s);
    s->window_left = -1;
    *reps = 0;
    if (ca->seed && parse_seed(cmd, ca->seed, &s->seed)) return CLI_USAGE;
    s->seed = kiln__cb_seed(s->seed);
    if ((rc = parse_int(cmd, "--batch", ca->batch, 0, CHECK_BATCH_MAX, &batch)) ||
        (rc = parse_heads(cmd, ca->heads, v->group, &s->num_qo_heads)))
        return rc;
    if (v->op == KILN_OP_MERGE) {
        s->batch = ca->batch ? batch : 100;
        return 0;
    }
    if ((rc = batch_lengths(ca, v, s, batch, qo, kv))) return rc;
    if (ca->page_size && v->kv != KILN_KV_PAGED)
        return cli_fail(cmd, CLI_USAGE, "--page-size needs kv=paged");
    if ((rc = parse_int(cmd, "--page-size", ca->page_size, 1, 1 << 16, &s->page_size)) ||
        (rc = parse_int(cmd, "--fixed-split", ca->fixed_split, 1, 1 << 30, &s->fixed_split)) ||
        (rc = parse_int(cmd, "--window-left", ca->window_left, 0, 1 << 30, &s->window_left)) ||
        (rc = parse_softcap(cmd, ca->softcap, &s->softcap)))
        return rc;
    s->graph = ca->graph;
    s->strided = ca->strided;
    s->rope_offsets = v->rope;
    if (ca->time && (rc = cli_long(cmd, "--time", ca->time, 1, 1000000, reps))) return rc;
    return 0;
}

static void batch_print(const kiln_variant *v, const kiln_check_batch *s, int mismatch,
                        const kiln_check_batch_result *br)
{
    const kiln_check_result *r = &br->r;
    long long tq = 0, tk = 0;
    for (int b = 0; b < s->batch; b++) {
        tq += v->op == KILN_OP_PREFILL ? s->qo_lens[b] : 1;
        tk += s->kv_lens[b];
    }
    printf("%s B=%d H=%d rows=%lld keys=%lld", mismatch ? "MISMATCH" : "ok", s->batch,
           s->num_qo_heads, tq, tk);
    if (v->kv == KILN_KV_PAGED) printf(" P=%d", s->page_size ? s->page_size : 16);
    printf(" max_err=%.3g (atol %.3g rtol %.3g) rel_l2=%.3g", r->max_err, r->atol, r->rtol,
           r->rel_l2);
    if (v->lse) printf(" lse_err=%.3g", r->lse_max_err);
    printf(" plan: items=%d grid=%d kv_chunk=%d split=%d merges=%d %.3f ms", br->plan.items,
           br->plan.grid, br->plan.kv_chunk, br->plan.split_items, br->plan.merge_tasks,
           br->plan_ms);
    if (s->graph) printf(" graph: %d batches replayed", br->batches);
    if (r->kernel_ms > 0) {
        double sec = r->kernel_ms * 1e-3;
        printf(" time=%.4f ms, %.1f GB/s, %.2f TFLOP/s", r->kernel_ms, r->bytes / sec / 1e9,
               r->flops / sec / 1e12);
    }
    printf(" seed=%llu\n", (unsigned long long)br->seed);
    if (mismatch)
        printf("  first bad: %s (%lld of %lld elements out of tolerance; first bad request %d)\n",
               r->first_bad, r->bad, r->checked, br->bad_request);
    fflush(stdout);
}

/* A context on the GPU and v's kernel: 0, or CLI_FAIL after printing why (*ctx may be set
 * either way; the caller destroys it). */
static int check_kernel(cli_global *g, const kiln_variant *v, kiln_ctx **ctx, kiln_kernel **k)
{
    kiln_device_info di;
    int rc = cli_ctx_open(g, "check", 0, ctx);
    if (rc) return rc;
    if (kiln_ctx_device(*ctx, &di) || !di.present)
        return cli_fail("check", CLI_FAIL, "no GPU: %s", kiln_ctx_errmsg(*ctx));
    if (kiln_kernel_get(*ctx, v, k))
        return cli_fail("check", CLI_FAIL, "%s", kiln_ctx_errmsg(*ctx));
    return 0;
}

/* 1 when a check failed to run (the caller prints why); 0 when it ran, *rc becoming CLI_FAIL
 * on a mismatch. */
static int check_failed(kiln_status st, int *rc)
{
    if (st == KILN_STATUS_MISMATCH) *rc = CLI_FAIL;
    return st != KILN_STATUS_OK && st != KILN_STATUS_MISMATCH;
}

/* op=merge: kiln_merge_state, _in_place and kiln_merge_states on random states, a line each. */
static int check_merges(kiln_ctx *ctx, kiln_kernel *k, const kiln_check_batch *s, int strided,
                        const char *canon)
{
    static const char *const names[] = {"merge_state", "merge_state_in_place", "merge_states"};
    int rc = CLI_OK;
    for (int op = 0; op < 3; op++) {
        kiln_check_merge_shape ms = {s->batch, s->num_qo_heads, 3, strided, s->seed};
        kiln_check_result r;
        char msg[1024] = "";
        kiln_status st =
            kiln_check_merge(ctx, k, (kiln_check_merge_op)op, &ms, &r, msg, sizeof msg);
        if (check_failed(st, &rc)) {
            rc = cli_fail("check", CLI_FAIL, "%s %s: %s", canon, names[op], msg);
            continue;
        }
        printf("%s %s rows=%d H=%d max_err=%.3g (atol %.3g rtol %.3g) lse_err=%.3g\n",
               st ? "MISMATCH" : "ok", names[op], ms.rows, ms.num_heads, r.max_err, r.atol, r.rtol,
               r.lse_max_err);
        if (st) printf("  first bad: %s\n", r.first_bad);
    }
    return rc;
}

/* kiln check of a batch variant (kv=ragged|paged) or of the merges (op=merge). */
static int check_batch_cmd(cli_global *g, const check_args *ca, const kiln_variant *v,
                           const char *canon)
{
    const char *cmd = "check";
    int *qo = malloc(sizeof(int) * CHECK_BATCH_MAX), *kv = malloc(sizeof(int) * CHECK_BATCH_MAX);
    kiln_check_batch s;
    long reps = 0;
    int rc = !qo || !kv ? cli_fail(cmd, CLI_FAIL, "out of memory") : 0;
    if (!rc && v->op == KILN_OP_MERGE &&
        (ca->kv_len || ca->kv_lens || ca->kv_dist || ca->qo_len || ca->qo_lens || ca->qo_dist ||
         ca->page_size || ca->fixed_split || ca->graph || ca->time))
        rc = cli_fail(cmd, CLI_USAGE,
                      "op=merge takes --batch (rows), --heads, --strided and --seed only");
    if (!rc) rc = batch_shape(ca, v, &s, qo, kv, &reps);
    kiln_ctx *ctx = NULL;
    kiln_kernel *k = NULL;
    if (!rc) rc = check_kernel(g, v, &ctx, &k);
    if (!rc && v->op == KILN_OP_MERGE) {
        rc = check_merges(ctx, k, &s, ca->strided, canon);
    } else if (!rc) {
        kiln_check_batch_result br;
        char msg[1024] = "";
        kiln_status st = kiln_check_batch_run(ctx, k, &s, (int)reps, &br, msg, sizeof msg);
        if (check_failed(st, &rc)) rc = cli_fail(cmd, CLI_FAIL, "%s B=%d: %s", canon, s.batch, msg);
        else batch_print(v, &s, st == KILN_STATUS_MISMATCH, &br);
    }
    kiln_ctx_destroy(ctx);
    free(qo);
    free(kv);
    return rc;
}

/* The first batch-only option given to a single-request check; NULL when none. */
static const char *batch_only_option(const check_args *ca)
{
    return ca->batch         ? "--batch"
           : ca->kv_lens     ? "--kv-lens"
           : ca->kv_dist     ? "--kv-dist"
           : ca->qo_lens     ? "--qo-lens"
           : ca->qo_dist     ? "--qo-dist"
           : ca->page_size   ? "--page-size"
           : ca->fixed_split ? "--fixed-split"
           : ca->graph       ? "--graph"
                             : NULL;
}

/* kiln check of a single-request variant (kv=contiguous): one run per kv length. */
static int check_single_cmd(cli_global *g, const check_args *ca, const kiln_variant *v,
                            const char *canon)
{
    const char *cmd = "check", *batch_only = batch_only_option(ca);
    kiln_check_shape s;
    long kv[CHECK_KV_MAX], reps = 0;
    int nkv = 0, rc = 0;
    if (batch_only)
        return cli_fail(cmd, CLI_USAGE,
                        "%s needs a batch variant (kv=ragged or kv=paged in the spec)", batch_only);
    if ((rc = check_shape(ca, v, &s, kv, &nkv, &reps))) return rc;
    kiln_ctx *ctx = NULL;
    kiln_kernel *k = NULL;
    rc = check_kernel(g, v, &ctx, &k);
    for (int i = 0; k && i < nkv; i++) {
        kiln_check_result r;
        char msg[1024] = "";
        memset(&r, 0, sizeof r);
        s.kv_len = (int)kv[i];
        kiln_status st = kiln_check_run(ctx, k, &s, (int)reps, &r, msg, sizeof msg);
        if (check_failed(st, &rc))
            rc = cli_fail(cmd, CLI_FAIL, "%s L_KV=%d: %s", canon, s.kv_len, msg);
        else check_print(v, &s, st == KILN_STATUS_MISMATCH, &r);
    }
    kiln_ctx_destroy(ctx);
    return rc;
}

int cli_cmd_check(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    check_args ca = {0};
    int npos = 0;
    const cli_opt opts[] = {{"--heads", &ca.heads, NULL},
                            {"--qo-len", &ca.qo_len, NULL},
                            {"--kv-len", &ca.kv_len, NULL},
                            {"--window-left", &ca.window_left, NULL},
                            {"--softcap", &ca.softcap, NULL},
                            {"--seed", &ca.seed, NULL},
                            {"--strided", NULL, &ca.strided},
                            {"--time", &ca.time, NULL},
                            {"--batch", &ca.batch, NULL},
                            {"--kv-lens", &ca.kv_lens, NULL},
                            {"--kv-dist", &ca.kv_dist, NULL},
                            {"--qo-lens", &ca.qo_lens, NULL},
                            {"--qo-dist", &ca.qo_dist, NULL},
                            {"--page-size", &ca.page_size, NULL},
                            {"--fixed-split", &ca.fixed_split, NULL},
                            {"--graph", NULL, &ca.graph},
                            {NULL, NULL, NULL}};
    int rc = 0;
    if (cli_parse_words(g, cmd, argc, argv, opts, "missing SPEC", &npos, &rc)) return rc;
    kiln_variant v;
    char canon[KILN__SPEC_MAX];
    if ((rc = cli_spec(cmd->name, npos, argv, &v, canon, sizeof canon))) return rc;
    /* The CPU reference knows the builtin masks and transforms only: a snippet's meaning (and
     * its run-time values) has to come from the caller, as the tests do (tests/test_custom.c).
     * Mask data: the batch checker draws random per-request masks its reference reads; the
     * single-request path does not (tests/test_maskdata.c). Refuse rather than check something
     * else. */
    const int batch = v.kv != KILN_KV_CONTIGUOUS || v.op == KILN_OP_MERGE;
    if (v.logits_expr[0] || v.mask_expr[0] || v.num_params ||
        (v.mask_data != KILN_MASK_DATA_NONE && !batch))
        return cli_fail(
            cmd->name, CLI_USAGE,
            "custom variants (snippets, params; mask_data outside a batch) cannot be checked from "
            "the CLI: the reference needs their meaning and values; see tests/test_custom.c");
    return batch ? check_batch_cmd(g, &ca, &v, canon) : check_single_cmd(g, &ca, &v, canon);
}
