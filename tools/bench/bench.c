/*
 * bench.c — kiln's benchmark driver (build/bin/kiln-bench): measures the copy-bandwidth
 * ceiling, then times single decode and single prefill over the sweep the docs report, with
 * CUDA events, warm-up, medians and rotating inputs (tools/check/check.c). Correctness is the tests'
 * job; each point here is first checked against the CPU reference when that is cheap.
 *
 * Usage: kiln-bench [--quick] [--only NAME] [--csv FILE]   (NAME: a point name, exactly)
 *        kiln-bench --batch [--quick] [--only NAME] [--csv FILE] [--max-gib N]
 *                                the batch suites (batch.c): paged decode sweep, batch prefill,
 *                                cascade, host overhead of plan/run
 *        kiln-bench --list [--batch]   the point names --only accepts
 *        kiln-bench --ceilings   only the ceilings, as one line "ceilings copy_GBps=N read_GBps=N
 *                                gpu=... arch=... sms=N paged_nhd_read_GBps=N paged_hnd_read_GBps=N"
 *                                (tools/bench/referee.py reads it): the copy, the streaming read and
 *                                the paged decode's read pattern without its arithmetic (devk.c)
 *        kiln-bench --jit        JIT figures, no GPU needed: cold compile, in-process memo hit,
 *                                new-process cache hit (`kiln compile` of a cached spec)
 * Prints markdown tables on stdout. CSV files start with one metadata line
 * "# kiln-bench gpu=... arch=... sms=... driver=... nvrtc=... kiln=... date=... copy_GBps=...
 * read_GBps=..." (its ceilings; tools/bench/referee.py takes them from --ceilings), then a header line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "check.h"
#include "kiln.h"

typedef struct point {
    const char *name;
    const char *spec;
    int H, L_Q, L_KV, window_left;
    float softcap;
    int bsr_pct;  /* > 0: mask_data=bsr, 64x64 blocks, this % present (random) */
    int tile_map; /* 1: plan the tile map first (skips hidden tiles) */
    int user;     /* snippet parameter 0: user[0].f32 = softcap; 1: user[0].i32 = window_left */
} point;

#define SNIP_SOFTCAP "params=cap:f32 logits_expr=\"cap * tanhf(logits / cap)\""
#define SNIP_WINDOW  "params=w:i32 mask_expr=\"kv_idx >= qo_idx + kv_len - qo_len - w\""

static const point points[] = {
    {"decode", "op=decode dtype=bf16 head_dim=128 group=4", 32, 1, 512, 0, 0, 0, 0, 0},
    {"decode", "op=decode dtype=bf16 head_dim=128 group=4", 32, 1, 4096, 0, 0, 0, 0, 0},
    {"decode", "op=decode dtype=bf16 head_dim=128 group=4", 32, 1, 32768, 0, 0, 0, 0, 0},
    {"decode", "op=decode dtype=bf16 head_dim=128 group=4", 32, 1, 131072, 0, 0, 0, 0, 0},
    {"decode d64", "op=decode dtype=bf16 head_dim=64 group=4", 32, 1, 32768, 0, 0, 0, 0, 0},
    {"decode d256", "op=decode dtype=bf16 head_dim=256 group=4", 32, 1, 32768, 0, 0, 0, 0, 0},
    {"prefill causal", "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal", 32, 1024, 1024, 0,
     0, 0, 0, 0},
    {"prefill causal", "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal", 32, 4096, 4096, 0,
     0, 0, 0, 0},
    {"prefill causal", "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal", 32, 16384, 16384,
     0, 0, 0, 0, 0},
    {"prefill", "op=prefill dtype=bf16 head_dim=128 group=4", 32, 4096, 4096, 0, 0, 0, 0, 0},
    {"prefill causal d64", "op=prefill dtype=bf16 head_dim=64 group=4 mask=causal", 32, 4096, 4096,
     0, 0, 0, 0, 0},
    {"prefill causal d256", "op=prefill dtype=bf16 head_dim=256 group=4 mask=causal", 32, 4096,
     4096, 0, 0, 0, 0, 0},
    {"prefill causal softcap",
     "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal logits=softcap", 32, 4096, 4096, 0, 30,
     0, 0, 0},
    {"prefill causal alibi", "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal logits=alibi",
     32, 4096, 4096, 0, 0, 0, 0, 0},
    {"prefill causal window1024", "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal window=1",
     32, 4096, 4096, 1024, 0, 0, 0, 0},
    {"prefill causal bsr25", "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal", 32, 4096,
     4096, 0, 0, 25, 0, 0},
    {"prefill causal bsr25 +map", "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal", 32,
     4096, 4096, 0, 0, 25, 1, 0},
    {"prefill causal softcap snippet",
     "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal " SNIP_SOFTCAP, 32, 4096, 4096, 0, 30,
     0, 0, 0},
    {"prefill causal window1024 expr",
     "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal " SNIP_WINDOW, 32, 4096, 4096, 1024, 0,
     0, 0, 1},
    {"prefill causal window1024 expr +map",
     "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal " SNIP_WINDOW, 32, 4096, 4096, 1024, 0,
     0, 1, 1},
};

/* The window expression's meaning, for counting its FLOPs. */
static int window_visible(const void *u, int i, int j, int h, int hk, int lq, int lkv)
{
    (void)h, (void)hk;
    return j >= i + lkv - lq - *(const int *)u;
}

/* A random BSR mask for a bench point (64 x 64 blocks); the reference mask callback reads it. */
typedef struct bsr_mask {
    int *indptr, *indices, nnz, rows;
} bsr_mask;

static int bsr_visible(const void *u, int i, int j, int h, int hk, int lq, int lkv)
{
    (void)h, (void)hk, (void)lq, (void)lkv;
    const bsr_mask *m = u;
    for (int e = m->indptr[i / 64]; e < m->indptr[i / 64 + 1]; e++)
        if (m->indices[e] == j / 64) return 1;
    return 0;
}

static void bsr_make(bsr_mask *m, int L_Q, int L_KV, int pct)
{
    const int cols = (L_KV + 63) / 64;
    m->rows = (L_Q + 63) / 64;
    m->indptr = calloc((size_t)m->rows + 1, sizeof(int));
    m->indices = calloc((size_t)m->rows * cols + 1, sizeof(int));
    unsigned long long x = 12345;
    m->nnz = 0;
    for (int r = 0; r < m->rows; r++) {
        m->indptr[r] = m->nnz;
        for (int c = 0; c < cols; c++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            if ((int)((x >> 33) % 100) < pct || c == r)
                m->indices[m->nnz++] = c; /* keep the diagonal */
        }
    }
    m->indptr[m->rows] = m->nnz;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* JIT latency figures on this machine (no GPU needed). */
static int jit_figures(const char *argv0)
{
    static const char *specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=4",
        "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal",
        "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal logits=softcap",
        "op=decode dtype=f16 head_dim=64 group=1 logits=alibi"};
    char dir[] = "/tmp/kiln-bench-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    kiln_ctx_opts o = {0};
    o.cache_dir = dir;
    o.no_device = 1;
    kiln_ctx *ctx = NULL;
    if (kiln_ctx_create(&o, &ctx)) {
        fprintf(stderr, "kiln-bench: %s\n", kiln_errmsg());
        return 1;
    }
    printf("| spec | cold compile ms (NVRTC, sm_90a) |\n|---|---|\n");
    kiln_kernel *k = NULL;
    kiln_variant v;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kiln_variant_parse(specs[i], &v);
        double t0 = now_ms();
        if (kiln_kernel_compile(ctx, &v, "sm_90a", &k)) {
            fprintf(stderr, "kiln-bench: %s\n", kiln_ctx_errmsg(ctx));
            return 1;
        }
        printf("| %s | %.0f |\n", specs[i], now_ms() - t0);
    }
    /* in-process memo hit */
    kiln_variant_parse(specs[0], &v);
    const int n = 1000000;
    double t0 = now_ms();
    for (int i = 0; i < n; i++) kiln_kernel_compile(ctx, &v, "sm_90a", &k);
    const double memo_ns = (now_ms() - t0) * 1e6 / n;
    kiln_ctx_destroy(ctx);
    /* new-process hit: the CLI next to this binary */
    char kiln[1024];
    snprintf(kiln, sizeof kiln, "%s", argv0);
    char *slash = strrchr(kiln, '/');
    snprintf(slash ? slash + 1 : kiln, sizeof kiln - (size_t)(slash ? slash + 1 - kiln : 0),
             "kiln");
    double ms[21];
    fflush(stdout);
    for (int r = 0; r < 21; r++) {
        double t = now_ms();
        pid_t pid = fork();
        if (pid == 0) {
            if (!freopen("/dev/null", "w", stdout)) _exit(127);
            execl(kiln, kiln, "--cache", dir, "compile", "--arch", "sm_90a", specs[0],
                  (char *)NULL);
            _exit(127);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        ms[r] = now_ms() - t;
        if (!WIFEXITED(st) || WEXITSTATUS(st)) {
            fprintf(stderr, "kiln-bench: %s compile failed\n", kiln);
            return 1;
        }
    }
    qsort(ms, 21, sizeof ms[0], cmp_d);
    printf("\nin-process memo hit: %.0f ns per kiln_kernel_compile (mean of %d calls)\n", memo_ns,
           n);
    printf("new-process cache hit: %.2f ms median, %.2f ms min of 21 whole `kiln compile` runs\n",
           ms[10], ms[0]);
    return 0;
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--batch] [--quick] [--only NAME] [--csv FILE] [--max-gib N]\n"
            "       %s --list [--batch]\n"
            "       %s --ceilings\n"
            "       %s --jit\n",
            argv0, argv0, argv0, argv0);
}

static int single_known(const char *name)
{
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++)
        if (!strcmp(points[i].name, name)) return 1;
    return 0;
}

static void list_points(int batch)
{
    if (batch) {
        batch_list();
        return;
    }
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++)
        if (i == 0 || strcmp(points[i].name, points[i - 1].name)) puts(points[i].name);
}

/* The command line. */
typedef struct bench_args {
    int quick, batch, list, ceilings;
    double max_gib;
    const char *csv_path, *only;
} bench_args;

/* 0, or 2 after printing the usage. */
static int parse_args(int argc, char **argv, bench_args *a)
{
    memset(a, 0, sizeof *a);
    a->max_gib = 120;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) a->quick = 1;
        else if (!strcmp(argv[i], "--batch")) a->batch = 1;
        else if (!strcmp(argv[i], "--list")) a->list = 1;
        else if (!strcmp(argv[i], "--ceilings")) a->ceilings = 1;
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) a->csv_path = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) a->only = argv[++i];
        else if (!strcmp(argv[i], "--max-gib") && i + 1 < argc && atof(argv[i + 1]) > 0)
            a->max_gib = atof(argv[++i]);
        else {
            usage(argv[0]);
            return 2;
        }
    }
    return 0;
}

/* The context, the GPU and its ceilings into env (the helper kernels are needed by the batch
 * suites only; the single suite just loses the streaming-read ceiling without them). 0, or 1
 * after printing why (env->ctx destroyed). */
static int env_open(const bench_args *a, bench_env *env)
{
    kiln_ctx *ctx = NULL;
    if (kiln_ctx_create(NULL, &ctx) != KILN_STATUS_OK) {
        fprintf(stderr, "kiln-bench: %s\n", kiln_errmsg());
        return 1;
    }
    memset(env, 0, sizeof *env);
    env->ctx = ctx;
    env->cu = ctx->cu;
    env->only = a->only;
    env->quick = a->quick;
    env->max_gib = a->max_gib;
    kiln_ctx_device(ctx, &env->di);
    char msg[512];
    if (!env->di.present || !env->cu) {
        fprintf(stderr, "kiln-bench: no GPU: %s\n", kiln_ctx_errmsg(ctx));
    } else if (kiln_check_bandwidth(ctx, (size_t)2 << 30, &env->copy_gbs, msg, sizeof msg)) {
        fprintf(stderr, "kiln-bench: %s\n", msg);
    } else {
        if (!devk_load(env, msg, sizeof msg) &&
            !devk_read_ceiling(env, (size_t)2 << 30, &env->read_gbs, msg, sizeof msg))
            return 0;
        fprintf(stderr, "kiln-bench: helper kernels: %s\n", msg);
        if (!a->batch) return 0;
    }
    kiln_ctx_destroy(ctx);
    env->ctx = NULL;
    return 1;
}

/* Open the CSV file (NULL path: none) and write its metadata line. 0, or 1 after printing why. */
static int csv_open(const char *path, const bench_env *env, FILE **out)
{
    *out = NULL;
    if (!path) return 0;
    FILE *csv = fopen(path, "w");
    if (!csv) {
        fprintf(stderr, "kiln-bench: cannot write %s\n", path);
        return 1;
    }
    const kiln_device_info *di = &env->di;
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
    fprintf(csv,
            "# kiln-bench gpu=%s arch=%s sms=%d driver=%d nvrtc=%s kiln=%s date=%s copy_GBps=%.0f "
            "read_GBps=%.0f\n",
            di->name, di->arch, di->sm_count, di->driver_version, kiln_nvrtc_version(),
            kiln_version(), date, env->copy_gbs, env->read_gbs);
    *out = csv;
    return 0;
}

/* The shape of a single point: heads, lengths, snippet parameters, the BSR mask (bm, freed by
 * the caller) and whether the CPU reference is cheap enough. */
static void single_shape(const point *pt, kiln_check_shape *s, bsr_mask *bm)
{
    memset(s, 0, sizeof *s);
    s->num_qo_heads = pt->H;
    s->qo_len = pt->L_Q;
    s->kv_len = pt->L_KV;
    s->window_left = pt->window_left;
    s->softcap = pt->softcap;
    const double ref_cost = (double)pt->L_Q * pt->L_KV * pt->H;
    s->skip_reference = ref_cost > 4e8;
    if (strstr(pt->spec, "params=")) {
        if (pt->user == 0) s->user[0].f32 = pt->softcap;
        else {
            s->user[0].i32 = pt->window_left;
            s->ref_mask = window_visible;
            s->ref_user = &pt->window_left;
            s->use_tile_map = pt->tile_map;
        }
    }
    if (pt->bsr_pct) {
        bsr_make(bm, pt->L_Q, pt->L_KV, pt->bsr_pct);
        s->bsr_indptr_host = bm->indptr;
        s->bsr_indices_host = bm->indices;
        s->bsr_rows = bm->rows;
        s->bsr_nnz = bm->nnz;
        s->bsr_r = s->bsr_c = 64;
        s->ref_mask = bsr_visible; /* FLOPs count only visible pairs */
        s->ref_user = bm;
        s->use_tile_map = pt->tile_map;
    }
}

/* Check and time one single point; its table row and CSV row. 1 when it failed. */
static int single_point(bench_env *env, const point *pt, FILE *csv)
{
    kiln_kernel *k = NULL;
    kiln_variant v;
    char msg[512];
    if (kiln_variant_parse(pt->spec, &v) != KILN_STATUS_OK) {
        printf("| %s | | | | bad spec: %s |\n", pt->name, kiln_errmsg());
        return 1;
    }
    if (pt->bsr_pct) v.mask_data = KILN_MASK_DATA_BSR;
    if (kiln_kernel_get(env->ctx, &v, &k) != KILN_STATUS_OK) {
        printf("| %s | | | | compile failed: %s |\n", pt->name, kiln_ctx_errmsg(env->ctx));
        return 1;
    }
    kiln_check_shape s;
    bsr_mask bm = {0};
    single_shape(pt, &s, &bm);
    kiln_check_result r;
    kiln_status st = kiln_check_run(env->ctx, k, &s, 30, &r, msg, sizeof msg);
    free(bm.indptr);
    free(bm.indices);
    if (st && st != KILN_STATUS_MISMATCH) {
        printf("| %s | %d | %d | %d | failed: %s |\n", pt->name, pt->H, pt->L_Q, pt->L_KV, msg);
        return 1;
    }
    const double gbs = r.bytes / (r.kernel_ms * 1e-3) / 1e9;
    const double tf = r.flops / (r.kernel_ms * 1e-3) / 1e12;
    printf("| %s | %d | %d | %d | %.4f | %.0f | %.1f | %.1f | %s |\n", pt->name, pt->H, pt->L_Q,
           pt->L_KV, r.kernel_ms, gbs, 100.0 * gbs / env->copy_gbs, tf,
           s.skip_reference ? "timed only"
           : st             ? "MISMATCH"
                            : "ok");
    if (csv)
        fprintf(csv, "%s,%s,%d,%d,%d,%.5f,%.1f,%.2f,%.0f\n", pt->name, pt->spec, pt->H, pt->L_Q,
                pt->L_KV, r.kernel_ms, gbs, tf, env->copy_gbs);
    return st != KILN_STATUS_OK;
}

/* The single decode / prefill sweep; the number of failed points. */
static int single_suite(bench_env *env, FILE *csv)
{
    if (csv) fprintf(csv, "name,spec,H,L_Q,L_KV,ms,GBps,TFLOPs,copy_GBps\n");
    printf("| point | H | L_Q | L_KV | ms | GB/s | %% copy | TFLOP/s | check "
           "|\n|---|---|---|---|---|---|---|---|---|\n");
    int failed = 0;
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
        const point *pt = &points[i];
        if (env->quick && (pt->L_KV > 32768 || pt->L_Q > 4096)) continue;
        if (env->only && strcmp(pt->name, env->only) != 0) continue;
        failed += single_point(env, pt, csv);
    }
    return failed;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--jit")) return jit_figures(argv[0]);
    bench_args a;
    if (parse_args(argc, argv, &a)) return 2;
    if (a.list) {
        list_points(a.batch);
        return 0;
    }
    if (a.only && !(a.batch ? batch_known(a.only) : single_known(a.only))) {
        fprintf(stderr, "kiln-bench: no %s point named '%s' (--list%s names them)\n",
                a.batch ? "batch" : "single", a.only, a.batch ? " --batch" : "");
        return 2;
    }
    bench_env env;
    if (env_open(&a, &env)) return 1;
    const kiln_device_info di = env.di;
    if (a.ceilings) {
        /* the paged decode's pattern beside the streaming read: what its layout costs */
        double nhd = 0, hnd = 0;
        char msg[512];
        if (devk_read_pages_ceiling(&env, (size_t)2 << 30, 0, &nhd, msg, sizeof msg) ||
            devk_read_pages_ceiling(&env, (size_t)2 << 30, 1, &hnd, msg, sizeof msg))
            fprintf(stderr, "kiln-bench: paged read ceiling: %s\n", msg);
        printf("ceilings copy_GBps=%.0f read_GBps=%.0f gpu=\"%s\" arch=%s sms=%d "
               "paged_nhd_read_GBps=%.0f paged_hnd_read_GBps=%.0f\n",
               env.copy_gbs, env.read_gbs, di.name, di.arch, di.sm_count, nhd, hnd);
        kiln_ctx_destroy(env.ctx);
        return env.read_gbs > 0 ? 0 : 1;
    }
    FILE *csv = NULL;
    if (csv_open(a.csv_path, &env, &csv)) {
        kiln_ctx_destroy(env.ctx);
        return 1;
    }
    printf("GPU %s (%s, %d SMs), driver %d, NVRTC %s; device-to-device copy %.0f GB/s, streaming "
           "read %.0f GB/s\n\n",
           di.name, di.arch, di.sm_count, di.driver_version, kiln_nvrtc_version(), env.copy_gbs,
           env.read_gbs);
    int failed = 0;
    if (a.batch) {
        if (csv) fprintf(csv, "name,spec,B,H,L_Q,L_KV,ms,GBps,TFLOPs,copy_GBps,read_GBps,check\n");
        env.csv = csv;
        failed = batch_run_all(&env);
    } else {
        failed = single_suite(&env, csv);
    }
    if (csv) fclose(csv);
    kiln_ctx_destroy(env.ctx);
    return failed ? 1 : 0;
}
