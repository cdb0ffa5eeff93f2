/*
 * cascade.c — kiln-bench --batch's last two suites: a shared prefix decoded as a cascade (one
 * prefill of the prefix over every request's query row, a decode of the private parts, a
 * merge of the two softmax states) against a plain paged decode whose page tables all start
 * with the prefix's pages; and the host overhead of kiln_plan_schedule / kiln_plan_run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch.h"
#include "check.h"

const char *const cascade_name = "cascade", *const host_name = "host overhead";

/* ---- cascade ---------------------------------------------------------------------------------- */

#define CASCADE_PREFIX  32768
#define CASCADE_PRIVATE 512

/* One cascade point: the plain decode and the cascade's two parts share one pool and q (the
 * plain buffers own them; the parts own their o, lse, page table and workspace). */
typedef struct cascade_run {
    bench_env *env;
    int B;
    kiln_kernel *kplain, *kpre, *kdec, *merge;
    bshape splain, spre, sdec;
    bbufs bplain, bpre, bdec;
    brun plain, pre, dec;
    int *idx_plain, *idx_pre, *idx_dec; /* page tables (the parts' move into their bbufs) */
} cascade_run;

static kiln_status step_cascade(void *user, int copy)
{
    cascade_run *c = user;
    kiln_status st = brun_step(&c->pre, copy); /* prefix: B query rows, one request, no mask */
    if (st) return st;
    if ((st = brun_step(&c->dec, copy))) return st; /* private parts: one decode row a request */
    kiln_merge_args m = {0};
    m.v_a = c->bdec.o;
    m.lse_a = c->bdec.lse;
    m.v_b = c->bpre.o;
    m.lse_b = c->bpre.lse;
    m.rows = c->B;
    m.num_heads = HQ;
    return kiln_merge_state_in_place(c->merge, &m, NULL);
}

static const char *const sp_plain = DEC(BF16, 128), *const sp_pre = PRE("paged", " lse=1"),
                         *const sp_dec = DEC(BF16, 128) " lse=1",
                         *const sp_merge = "op=merge dtype=bf16 head_dim=128";

/* The four kernels (plain decode, prefix prefill, private decode, merge). */
static kiln_status cascade_kernels(cascade_run *c, char *msg, size_t cap)
{
    const char *specs[4] = {sp_plain, sp_pre, sp_dec, sp_merge};
    kiln_kernel **ks[4] = {&c->kplain, &c->kpre, &c->kdec, &c->merge};
    kiln_variant v;
    kiln_status st = KILN_STATUS_OK;
    for (int i = 0; i < 4 && !st; i++) {
        st = kiln_variant_parse(specs[i], &v);
        if (!st) st = kiln_kernel_get(c->env->ctx, &v, ks[i]);
        if (st) snprintf(msg, cap, "%s: %s", specs[i], kiln_ctx_errmsg(c->env->ctx));
    }
    return st;
}

/* The page tables: the pool's pages in a shuffled order perm; the prefix takes perm[0 ..
 * pre_pages), request b's private part the next priv_pages; each plain request's table is the
 * prefix's pages, then its private ones. 0, or -1 without host memory. */
static int cascade_pages(cascade_run *c, int pre_pages, int priv_pages)
{
    const int B = c->B, pool_pages = pre_pages + B * priv_pages;
    int *perm = malloc(sizeof(int) * (size_t)pool_pages);
    c->idx_plain = malloc(sizeof(int) * (size_t)B * (pre_pages + priv_pages));
    c->idx_pre = malloc(sizeof(int) * (size_t)pre_pages);
    c->idx_dec = malloc(sizeof(int) * (size_t)B * priv_pages);
    if (!perm || !c->idx_plain || !c->idx_pre || !c->idx_dec) {
        free(perm);
        return -1;
    }
    uint64_t x = 7;
    for (int i = 0; i < pool_pages; i++) perm[i] = i;
    for (int i = pool_pages - 1; i > 0; i--) {
        const int j = (int)(brng(&x) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int i = 0; i < pre_pages; i++) c->idx_pre[i] = perm[i];
    for (int b = 0; b < B; b++)
        for (int p = 0; p < priv_pages; p++)
            c->idx_dec[b * priv_pages + p] = perm[pre_pages + b * priv_pages + p];
    for (int b = 0; b < B; b++) {
        int *row = c->idx_plain + (size_t)b * (pre_pages + priv_pages);
        memcpy(row, c->idx_pre, sizeof(int) * (size_t)pre_pages);
        memcpy(row + pre_pages, c->idx_dec + (size_t)b * priv_pages,
               sizeof(int) * (size_t)priv_pages);
    }
    free(perm);
    return 0;
}

/* Shapes, buffers (the parts borrowing the plain pool and q) and the three plans. */
static kiln_status cascade_setup(cascade_run *c, int pre_pages, int priv_pages, char *msg,
                                 size_t cap)
{
    bench_env *env = c->env;
    const int B = c->B, pool_pages = pre_pages + B * priv_pages;
    int one_prefix = CASCADE_PREFIX;
    int *lens = malloc(sizeof(int) * (size_t)B);
    int bad = !lens;
    for (int b = 0; !bad && b < B; b++) lens[b] = CASCADE_PREFIX + CASCADE_PRIVATE;
    bad = bad || bshape_make(&c->splain, B, 0, lens, 1) ||
          bshape_make(&c->spre, 1, B, &one_prefix, 1);
    for (int b = 0; !bad && b < B; b++) lens[b] = CASCADE_PRIVATE;
    bad = bad || bshape_make(&c->sdec, B, 0, lens, 1);
    free(lens);
    if (bad) {
        snprintf(msg, cap, "out of host memory");
        return KILN_STATUS_NO_MEMORY;
    }
    c->bplain.copies = 1;
    kiln_status st =
        bbufs_alloc(env, &c->bplain, &c->splain, 1, 128, 2, pool_pages, c->idx_plain, msg, cap);
    if (st) return st;
    c->bpre = c->bplain;
    c->bdec = c->bplain;
    c->bpre.o = c->bpre.lse = c->bpre.ws = c->bpre.idx = 0;
    c->bdec.o = c->bdec.lse = c->bdec.ws = c->bdec.idx = 0;
    c->bpre.idx_host = c->idx_pre;
    c->bdec.idx_host = c->idx_dec;
    c->idx_pre = c->idx_dec = NULL;
    const size_t ob = (size_t)B * HQ * 128 * 2, lb = (size_t)B * HQ * sizeof(float);
    const kiln__cu *cu = env->cu;
    if (cu->cuMemAlloc(&c->bpre.o, ob) || cu->cuMemAlloc(&c->bdec.o, ob) ||
        cu->cuMemAlloc(&c->bpre.lse, lb) || cu->cuMemAlloc(&c->bdec.lse, lb) ||
        cu->cuMemAlloc(&c->bpre.idx, sizeof(int) * (size_t)pre_pages) ||
        cu->cuMemAlloc(&c->bdec.idx, sizeof(int) * (size_t)B * priv_pages) ||
        cu->cuMemcpyHtoD(c->bpre.idx, c->bpre.idx_host, sizeof(int) * (size_t)pre_pages) ||
        cu->cuMemcpyHtoD(c->bdec.idx, c->bdec.idx_host, sizeof(int) * (size_t)B * priv_pages)) {
        snprintf(msg, cap, "alloc cascade buffers failed");
        return KILN_STATUS_CUDA;
    }
    c->plain = (brun){NULL, &c->bplain, &c->splain};
    c->pre = (brun){NULL, &c->bpre, &c->spre};
    c->dec = (brun){NULL, &c->bdec, &c->sdec};
    if ((st = bplan_make(env, c->kplain, &c->splain, &c->bplain, &c->plain.plan, msg, cap)) ||
        (st = bplan_make(env, c->kpre, &c->spre, &c->bpre, &c->pre.plan, msg, cap)) ||
        (st = bplan_make(env, c->kdec, &c->sdec, &c->bdec, &c->dec.plan, msg, cap)))
        return st;
    return KILN_STATUS_OK;
}

/* Correctness on poisoned outputs: plain o against the CPU reference (first and last request),
 * cascade o against plain o (every row, twice the tolerance). A mismatch is reported in a
 * comment and counted; *check says which. */
static kiln_status cascade_check(cascade_run *c, const char **check, char *msg, size_t cap)
{
    bench_env *env = c->env;
    env->cu->cuMemsetD8(c->bplain.o, 0xff, c->bplain.q_bytes);
    env->cu->cuMemsetD8(c->bdec.o, 0xff, c->bplain.q_bytes);
    kiln_status st = brun_step(&c->plain, 0);
    if (st || (st = step_cascade(c, 0))) {
        snprintf(msg, cap, "run: %s", kiln_ctx_errmsg(env->ctx));
        return st;
    }
    if (env->cu->cuCtxSynchronize()) {
        snprintf(msg, cap, "run failed on the device");
        return KILN_STATUS_CUDA;
    }
    kiln_variant v;
    kiln_variant_parse(sp_plain, &v);
    st = bcheck_rows(env, &v, &c->bplain, &c->splain, 0, msg, cap);
    if (!st) {
        const size_t n = (size_t)c->B * HQ * 128;
        uint16_t *a = malloc(n * 2), *o = malloc(n * 2);
        double atol, rtol;
        kiln_check_tolerance(&v, &atol, &rtol);
        if (!a || !o || env->cu->cuMemcpyDtoH(a, c->bplain.o, n * 2) ||
            env->cu->cuMemcpyDtoH(o, c->bdec.o, n * 2)) {
            snprintf(msg, cap, "copy outputs back failed");
            st = KILN_STATUS_CUDA;
        }
        for (size_t i = 0; i < n && !st; i++) {
            const double pa = devk_bf16_to_f32(a[i]), pc = devk_bf16_to_f32(o[i]);
            if (!(fabs(pa - pc) <= 2 * (atol + rtol * fabs(pa)))) {
                snprintf(msg, cap, "cascade o[%zu] = %.6g, plain %.6g", i, pc, pa);
                st = KILN_STATUS_MISMATCH;
            }
        }
        free(a);
        free(o);
    }
    if (st != KILN_STATUS_MISMATCH) return st;
    printf("<!-- cascade B%d: %s -->\n", c->B, msg);
    *check = "MISMATCH";
    env->failed++;
    return KILN_STATUS_OK;
}

/* Time plain and cascade; their table row and CSV rows. */
static kiln_status cascade_time(cascade_run *c, const char *check, char *msg, size_t cap)
{
    bench_env *env = c->env;
    double ms_plain = 0, ms_casc = 0;
    kiln_status st;
    if ((st = btime_steps(env, brun_step, &c->plain, 1, &ms_plain, msg, cap)) ||
        (st = btime_steps(env, step_cascade, c, 1, &ms_casc, msg, cap)))
        return st;
    /* bytes a cascade must move: the prefix once, every private part, q, o */
    const int B = c->B;
    const double bytes = 2.0 * (CASCADE_PREFIX + (double)B * CASCADE_PRIVATE) * HKV * 128 * 2 +
                         (double)B * HQ * 128 * 2 * 2;
    printf("| %d | %d | %d | %.4f | %.4f | %.2f | %.0f | %.0f | %s |\n", B, CASCADE_PREFIX,
           CASCADE_PRIVATE, ms_plain, ms_casc, ms_plain / ms_casc, bytes / (ms_plain * 1e-3) / 1e9,
           bytes / (ms_casc * 1e-3) / 1e9, check);
    bcsv_row(env, "cascade plain", sp_plain, B, 1, CASCADE_PREFIX + CASCADE_PRIVATE, ms_plain,
             bytes / (ms_plain * 1e-3) / 1e9, 0, check);
    bcsv_row(env, "cascade", "prefill(lse=1) + decode(lse=1) + merge_state_in_place", B, 1,
             CASCADE_PREFIX + CASCADE_PRIVATE, ms_casc, bytes / (ms_casc * 1e-3) / 1e9, 0, check);
    return KILN_STATUS_OK;
}

static void cascade_free(cascade_run *c)
{
    kiln_plan_destroy(c->plain.plan);
    kiln_plan_destroy(c->pre.plan);
    kiln_plan_destroy(c->dec.plan);
    /* bpre / bdec borrow q, k, v from bplain */
    c->bpre.q = c->bpre.k = c->bpre.v = 0;
    c->bdec.q = c->bdec.k = c->bdec.v = 0;
    bbufs_free(c->env, &c->bpre);
    bbufs_free(c->env, &c->bdec);
    bbufs_free(c->env, &c->bplain);
    bshape_free(&c->splain);
    bshape_free(&c->spre);
    bshape_free(&c->sdec);
    free(c->idx_plain);
    free(c->idx_pre);
    free(c->idx_dec);
}

/* Shared prefix of CASCADE_PREFIX tokens + CASCADE_PRIVATE private tokens per request, decode.
 * Plain: one paged decode whose page tables all start with the prefix's pages. Cascade: the
 * prefix as one non-causal prefill of the B query rows (lse=1), the private parts as a batch
 * decode (lse=1), then kiln_merge_state_in_place. Checked: cascade o against plain o (every row),
 * plain o against the CPU reference (first and last request). */
static void cascade_point(bench_env *env, int B)
{
    char msg[512] = "";
    const char *check = "ok";
    cascade_run c = {0};
    c.env = env;
    c.B = B;
    if (cascade_kernels(&c, msg, sizeof msg)) {
        printf("| %d | failed: %s |\n", B, msg);
        env->failed++;
        return;
    }
    const int pre_pages = CASCADE_PREFIX / PAGE, priv_pages = CASCADE_PRIVATE / PAGE;
    if (cascade_pages(&c, pre_pages, priv_pages)) {
        printf("| %d | out of host memory |\n", B);
    } else if (cascade_setup(&c, pre_pages, priv_pages, msg, sizeof msg) ||
               cascade_check(&c, &check, msg, sizeof msg) ||
               cascade_time(&c, check, msg, sizeof msg)) {
        printf("| %d | failed: %s |\n", B, msg);
        env->failed++;
    }
    cascade_free(&c);
}

void cascade_suite(bench_env *env)
{
    if (!bench_on(env, cascade_name)) return;
    printf("\n### Cascade: shared prefix vs plain paged decode (bf16 d128; GB/s of the bytes a "
           "cascade must "
           "move: prefix once + private parts + q + o)\n\n");
    printf("| B | prefix | private | plain ms | cascade ms | speedup | plain GB/s | cascade GB/s | "
           "check |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    cascade_point(env, 64);
    if (!env->quick) cascade_point(env, 256);
}

/* ---- host overhead ---------------------------------------------------------------------------- */

#define HOST_B     256
#define HOST_CALLS 1000
/* The stream is drained after every plan + run, untimed: a plan reuses its pinned schedule
 * buffers in a ring of four and waits when the copy out of the one it reuses has not run, so
 * back-to-back calls with ~1 ms of GPU work each measured the GPU, not the host (H200:
 * 1.1 ms median, 17 us minimum, with a drain every 16 calls). */
#define HOST_SYNC_EVERY 1

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* The lengths of the host-overhead batch (referee.py's host suite uses the same formula): 512 .. 8192. */
static int host_len(int b) { return 512 + (b * 7919) % 7681; }

/* Wall clock of kiln_plan_schedule and kiln_plan_run around each call, no sync inside the timed
 * region (the stream is drained every HOST_SYNC_EVERY calls, untimed, so a call never waits
 * for earlier GPU work); median and p90 of HOST_CALLS calls. */
static void host_point(bench_env *env, const char *what, const char *spec, int qo)
{
    char msg[512] = "";
    kiln_variant v;
    kiln_kernel *k = NULL;
    kiln_plan *plan = NULL;
    bshape s = {0};
    bbufs b = {0};
    int lens[HOST_B];
    double *t_plan = malloc(sizeof(double) * HOST_CALLS),
           *t_run = malloc(sizeof(double) * HOST_CALLS);
    kiln_status st = kiln_variant_parse(spec, &v);
    if (!st) st = kiln_kernel_get(env->ctx, &v, &k);
    if (st || !t_plan || !t_run) {
        printf("| %s | failed: %s |\n", what, kiln_ctx_errmsg(env->ctx));
        env->failed++;
        goto out;
    }
    for (int i = 0; i < HOST_B; i++) lens[i] = host_len(i);
    const int paged = v.kv == KILN_KV_PAGED;
    if (bshape_make(&s, HOST_B, qo, lens, paged)) goto out;
    b.copies = 1;
    if ((st = bbufs_alloc(env, &b, &s, paged, v.head_dim, 2, paged ? s.n_idx : s.total_kv, NULL,
                          msg, sizeof msg)) ||
        (st = bplan_make(env, k, &s, &b, &plan, msg, sizeof msg))) {
        printf("| %s | failed: %s |\n", what, msg);
        env->failed++;
        goto out;
    }
    kiln_batch_shape bs = {s.B, s.qo_indptr, s.kv_indptr, s.paged ? s.last : NULL};
    kiln_batch_args a;
    bbufs_args(&b, &s, 0, &a);
    for (int i = 0; i < HOST_CALLS + 10 && !st; i++) {
        double t0 = now_us();
        st = kiln_plan_schedule(plan, &bs, b.ws, b.ws_bytes, NULL);
        double t1 = now_us();
        if (!st) st = kiln_plan_run(plan, &a, NULL);
        double t2 = now_us();
        if (i >= 10) {
            t_plan[i - 10] = t1 - t0;
            t_run[i - 10] = t2 - t1;
        }
        if (i % HOST_SYNC_EVERY == HOST_SYNC_EVERY - 1) env->cu->cuCtxSynchronize();
    }
    env->cu->cuCtxSynchronize();
    if (st) {
        printf("| %s | failed: %s |\n", what, kiln_ctx_errmsg(env->ctx));
        env->failed++;
        goto out;
    }
    qsort(t_plan, HOST_CALLS, sizeof(double), bcmp_d);
    qsort(t_run, HOST_CALLS, sizeof(double), bcmp_d);
    kiln_plan_info pi = {0};
    kiln_plan_describe(plan, &pi);
    const double p50 = t_plan[HOST_CALLS / 2], r50 = t_run[HOST_CALLS / 2];
    printf("| %s | kiln_plan_schedule | %d | %.1f | %.1f | %.1f | %d items, grid %d, chunk %d |\n",
           what, HOST_B, p50, t_plan[0], t_plan[HOST_CALLS * 9 / 10], pi.items, pi.grid,
           pi.kv_chunk);
    printf("| %s | kiln_plan_run | %d | %.1f | %.1f | %.1f | |\n", what, HOST_B, r50, t_run[0],
           t_run[HOST_CALLS * 9 / 10]);
    char name[96];
    snprintf(name, sizeof name, "host plan %s", what);
    bcsv_row(env, name, spec, HOST_B, qo ? qo : 1, 0, p50 / 1e3, 0, 0, "us");
    snprintf(name, sizeof name, "host run %s", what);
    bcsv_row(env, name, spec, HOST_B, qo ? qo : 1, 0, r50 / 1e3, 0, 0, "us");
out:
    kiln_plan_destroy(plan);
    bbufs_free(env, &b);
    bshape_free(&s);
    free(t_plan);
    free(t_run);
}

void host_suite(bench_env *env)
{
    if (!bench_on(env, host_name)) return;
    printf("\n### Host overhead, batch %d, lengths 512..8192 (wall clock per call, µs; no sync "
           "inside the "
           "timed region; %d calls)\n\n",
           HOST_B, HOST_CALLS);
    printf("| batch | call | B | median µs | min µs | p90 µs | plan "
           "|\n|---|---|---|---|---|---|---|\n");
    host_point(env, "decode paged", DEC(BF16, 128), 0);
    host_point(env, "prefill paged causal", PRE("paged", " mask=causal"), 16);
}
