/*
 * fuzz_plan.c — libFuzzer target: the batch planner (kiln_plan_create, kiln_plan_schedule,
 * kiln_plan_schedule_scratch, kiln_plan_workspace_size(s)) on any arrays and options, as an
 * engine might pass them: indptr arrays that decrease, overflow or hold negative values, last
 * page lengths out of range, batch sizes past the graph-mode bound, workspaces too small.
 *
 * Plans are host plans (kiln__plan_create_host: the schedule lands in host memory, no device)
 * of kernels compiled for sm_90a once at start into a fresh cache (NVRTC, about 10 s). Every
 * call returns a status; a schedule it accepts must respect the planner's invariants (its
 * KILN__ASSERT checks, compiled in) and fit the workspace kiln_plan_workspace_size names.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "runtime.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const char *const SPECS[] = {
    "op=decode dtype=bf16 head_dim=128 group=4 kv=paged",
    "op=decode dtype=f16 head_dim=64 group=1 kv=ragged lse=1",
    "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal kv=paged",
    "op=prefill dtype=f16 head_dim=128 group=1 kv=ragged",
    "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal kv=ragged q_tokens=4",
    "op=prefill dtype=f16 head_dim=64 group=4 mask=causal kv=ragged lse=1 mask_data=bsr",
    "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=8 kv=paged",
};
enum { NK = sizeof SPECS / sizeof SPECS[0], MAXB = 600 };

static kiln_ctx *ctx;
static kiln_kernel *kern[NK];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    /* $KILN_FUZZ_CACHE (the test suite's replay), else a fresh directory in $KILN_FUZZ_TMP
     * (fuzz.sh's build directory) or /tmp */
    char fresh[600];
    const char *tmp = getenv("KILN_FUZZ_TMP");
    snprintf(fresh, sizeof fresh, "%s/kiln-fuzz-plan-XXXXXX", tmp ? tmp : "/tmp");
    const char *dir = getenv("KILN_FUZZ_CACHE");
    if (!dir && !(dir = mkdtemp(fresh))) abort();
    kiln_ctx_opts o = {0};
    o.cache_dir = dir;
    o.no_device = 1;
    if (kiln_ctx_create(&o, &ctx) != KILN_STATUS_OK) {
        fprintf(stderr, "fuzz_plan: context: %s\n", kiln_errmsg());
        abort();
    }
    for (int i = 0; i < NK; i++) {
        kiln_variant v;
        if (kiln_variant_parse(SPECS[i], &v) || kiln_kernel_compile(ctx, &v, "sm_90a", &kern[i])) {
            fprintf(stderr, "fuzz_plan: %s: %s\n", SPECS[i], kiln_ctx_errmsg(ctx));
            abort();
        }
    }
    return 0;
}

/* A reader of the input: bytes as small numbers, zero once it runs out. */
typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;
static unsigned u8(rd *r)
{
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}
static int i32(rd *r)
{
    unsigned x = 0;
    for (int i = 0; i < 4; i++) x = x << 8 | u8(r);
    return (int)x;
}
/* 0..max */
static int small(rd *r, int max) { return (int)((u8(r) | u8(r) << 8) % (unsigned)(max + 1)); }
/* mostly small, sometimes anything */
static int num(rd *r, int small)
{
    const unsigned sel = u8(r);
    if (sel < 200) return (int)(u8(r) | u8(r) << 8) % (small + 1);
    if (sel < 220) return -(int)(u8(r) % 3);
    return i32(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rd r = {data, size};
    kiln_kernel *k = kern[u8(&r) % NK];
    kiln_plan_opts o = {0};
    o.num_qo_heads = u8(&r) < 240 ? 32 : num(&r, 80);
    o.page_size = u8(&r) < 200 ? 16 : num(&r, 70);
    const unsigned mode = u8(&r);
    if (mode & 1) o.max_batch = num(&r, 300), o.max_qo_tokens = num(&r, 20000);
    if (mode & 2) o.fixed_split = num(&r, 5000);
    if (mode & 4) o.no_split = 1;
    if (mode & 8) o.max_total_kv = num(&r, 100000);
    o.bsr_r = (mode & 16) ? num(&r, 200) : 64;
    o.bsr_c = (mode & 32) ? num(&r, 200) : 64;

    kiln_plan *pl = NULL;
    if (kiln__plan_create_host(k, &o, 132, 1 + (mode >> 7), &pl) != KILN_STATUS_OK) return 0;

    /* the batch: mostly well formed (running sums of small lengths), some raw values */
    int B = u8(&r) < 240 ? (int)(u8(&r) | u8(&r) << 8) % MAXB : num(&r, MAXB);
    const int raw = u8(&r) < 30;
    if (B > MAXB) B = MAXB; /* a negative batch is passed as is */
    const int n = B > 0 ? B : 0;
    int *qo = calloc((size_t)n + 1, sizeof *qo), *kv = calloc((size_t)n + 1, sizeof *kv),
        *last = calloc((size_t)n + 1, sizeof *last);
    if (!qo || !kv || !last) goto out;
    for (int i = 0; i < n; i++) {
        if (raw) {
            /* query rows within what a q tensor can hold (a host plan skips the workspace test
             * that refuses a batch of billions of rows on a device), keys anything */
            qo[i + 1] = num(&r, 40000) % (1 << 22);
            kv[i + 1] = num(&r, 40000);
            last[i] = num(&r, 80);
        } else {
            qo[i + 1] = qo[i] + small(&r, 600);
            kv[i + 1] = kv[i] + small(&r, 9000);
            last[i] = 1 + small(&r, 15);
        }
    }
    const kiln_variant *v = &k->v;
    kiln_batch_shape sh = {B, v->op == KILN_OP_DECODE ? NULL : qo, kv, last};
    if (u8(&r) == 255) sh.kv_indptr = NULL;
    if (u8(&r) == 255) sh.kv_last_page_len = NULL;
    if (v->op != KILN_OP_DECODE && u8(&r) == 255) sh.qo_indptr = NULL;

    const unsigned how = u8(&r);
    if (getenv("FUZZ_PLAN_SHOW")) { /* to read a crash: the case in words */
        fprintf(stderr,
                "%s H=%d page=%d max_batch=%d max_qo=%d fixed=%d no_split=%d max_kv=%lld bsr=%dx%d "
                "B=%d raw=%d how=%u\n",
                k->spec, o.num_qo_heads, o.page_size, o.max_batch, o.max_qo_tokens, o.fixed_split,
                o.no_split, (long long)o.max_total_kv, o.bsr_r, o.bsr_c, B, raw, how);
        for (int i = 0; i < n && i < 8; i++)
            fprintf(stderr, "  %d: qo %d kv %d last %d\n", i, qo[i + 1], kv[i + 1], last[i]);
    }
    kiln_status st;
    if (how < 128) {
        st = kiln_plan_schedule(pl, &sh, 0, 0, NULL);
    } else if (how < 192) {
        size_t ws = 0;
        if (kiln_plan_workspace_size(pl, n, v->op == KILN_OP_DECODE ? n : qo[n], &ws) !=
            KILN_STATUS_OK)
            ws = 0;
        ws = ws * (u8(&r) % 5) / 4 + (size_t)u8(&r); /* 0 to 1x of it, a few bytes off */
        st = kiln_plan_schedule(pl, &sh, ws ? 256 : 0, ws, NULL);
    } else {
        size_t sb = 0, pb = 0;
        if (kiln_plan_workspace_sizes(pl, n, v->op == KILN_OP_DECODE ? n : qo[n], &sb, &pb) !=
            KILN_STATUS_OK)
            sb = pb = 0;
        const size_t scratch = pb * (u8(&r) % 3) / 2;
        st = kiln_plan_schedule_scratch(pl, &sh, 256, sb, scratch ? 512 : 0, scratch, NULL);
    }
    if (st == KILN_STATUS_OK) {
        kiln_plan_info info;
        if (kiln_plan_describe(pl, &info) != KILN_STATUS_OK) abort();
        /* the workspace bound holds for every schedule taken */
        size_t need = 0;
        if (B >= 0 && o.max_batch == 0 &&
            kiln_plan_workspace_size(pl, B, v->op == KILN_OP_DECODE ? B : qo[n], &need) ==
                KILN_STATUS_OK) {
            kiln__plan_layout lay;
            kiln__plan_last_layout(pl, &lay);
            if (lay.uploaded > need || lay.int_bytes > need) {
                fprintf(stderr,
                        "fuzz_plan: %s B=%d: the schedule (%zu / %zu bytes) exceeds the "
                        "workspace size (%zu)\n",
                        k->spec, B, lay.uploaded, lay.int_bytes, need);
                abort();
            }
        }
    } else if (!kiln_ctx_errmsg(ctx) || !*kiln_ctx_errmsg(ctx)) {
        fprintf(stderr, "fuzz_plan: status %d with no message\n", (int)st);
        abort();
    }
out:
    free(qo), free(kv), free(last);
    kiln_plan_destroy(pl);
    return 0;
}
