/*
 * test_custom.c — the variant cookbook (docs/variants.md): custom variants written as snippets,
 * compiled for sm_90a on the CPU, and on a GPU run against the float64 reference whose
 * semantics are written here independently in C (never by compiling the snippet). Also: the
 * builtin soft-cap and the snippet soft-cap give the same output on the same inputs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "jit.h"
#include "kt.h"

#define SEG_MAX 8192

typedef struct cook {
    const char *name;
    const char *spec; /* without op= and dtype: those are prepended */
    double (*ref_logits)(const void *, double, int, int, int, int, int, int);
    int (*ref_mask)(const void *, int, int, int, int, int, int);
    int builtin_causal; /* spec has mask=causal */
} cook;

/* The run-time values every cookbook entry may use (set per case). */
typedef struct values {
    float cap;
    int window, sink, prefix;
    float slopes[64];
    int seg_q[SEG_MAX], seg_kv[SEG_MAX];
} values;

static double r_softcap(const void *u, double x, int i, int j, int h, int hk, int lq, int lkv)
{
    (void)i, (void)j, (void)h, (void)hk, (void)lq, (void)lkv;
    const values *v = u;
    return v->cap * tanh(x / v->cap);
}
static double r_alibi(const void *u, double x, int i, int j, int h, int hk, int lq, int lkv)
{
    (void)hk;
    const values *v = u;
    return x + v->slopes[h] * (double)(j - i - lkv + lq);
}
static double r_logsigmoid(const void *u, double x, int i, int j, int h, int hk, int lq, int lkv)
{
    (void)u, (void)i, (void)j, (void)h, (void)hk, (void)lq, (void)lkv;
    return x - log(1.0 + exp(x));
}
static int r_window(const void *u, int i, int j, int h, int hk, int lq, int lkv)
{
    (void)h, (void)hk;
    const values *v = u;
    return j >= i + lkv - lq - v->window;
}
static int r_sink(const void *u, int i, int j, int h, int hk, int lq, int lkv)
{
    (void)h, (void)hk;
    const values *v = u;
    return j < v->sink || j >= i + lkv - lq - v->window;
}
static int r_document(const void *u, int i, int j, int h, int hk, int lq, int lkv)
{
    (void)h, (void)hk, (void)lq, (void)lkv;
    const values *v = u;
    return v->seg_q[i] == v->seg_kv[j];
}
static int r_prefix_lm(const void *u, int i, int j, int h, int hk, int lq, int lkv)
{
    (void)h, (void)hk;
    const values *v = u;
    return j < v->prefix || j <= i + lkv - lq;
}

static const cook cookbook[] = {
    {"softcap", "params=cap:f32 logits_expr=\"cap * tanhf(logits / cap)\" mask=causal", r_softcap,
     NULL, 1},
    {"alibi",
     "params=slopes:f32[] logits_expr=\"logits + slopes[qo_head] * (float)(kv_idx - qo_idx - "
     "kv_len + qo_len)\" mask=causal",
     r_alibi, NULL, 1},
    {"window",
     "params=window:i32 mask_expr=\"kv_idx >= qo_idx + kv_len - qo_len - window\" mask=causal",
     NULL, r_window, 1},
    {"sink",
     "params=sink:i32,window:i32 mask_expr=\"kv_idx < sink || kv_idx >= qo_idx + kv_len - qo_len - "
     "window\" mask=causal",
     NULL, r_sink, 1},
    {"document",
     "params=seg_q:i32[],seg_kv:i32[] mask_expr=\"seg_q[qo_idx] == seg_kv[kv_idx]\" mask=causal",
     NULL, r_document, 1},
    {"prefix_lm",
     "params=prefix:i32 mask_expr=\"kv_idx < prefix || kv_idx <= qo_idx + kv_len - qo_len\"", NULL,
     r_prefix_lm, 0},
    {"logsigmoid", "logits_expr=\"logits - logf(1.0f + expf(logits))\" mask=causal", r_logsigmoid,
     NULL, 1},
};
#define NCOOK ((int)(sizeof cookbook / sizeof cookbook[0]))

static int cook_spec(const cook *c, const char *op_dtype, kiln_variant *v)
{
    char spec[1024];
    snprintf(spec, sizeof spec, "%s head_dim=128 group=4 %s", op_dtype, c->spec);
    if (kiln_variant_parse(spec, v) != KILN_STATUS_OK) {
        kt_fail(__FILE__, __LINE__, "%s: %s", spec, kiln_errmsg());
        return 0;
    }
    return 1;
}

/* Every cookbook variant compiles for sm_90a (decode and prefill). */
KT_TEST(custom_cookbook_compiles)
{
    kiln_ctx *ctx = KT_CTX(NULL, 0);
    KT_REQUIRE(ctx);
    for (int c = 0; c < NCOOK; c++)
        for (int op = 0; op < 2; op++) {
            kiln_variant v;
            if (!cook_spec(&cookbook[c], op ? "op=prefill dtype=bf16" : "op=decode dtype=f16", &v))
                continue;
            kiln_kernel *k = NULL;
            if (kiln_kernel_compile(ctx, &v, "sm_90a", &k) != KILN_STATUS_OK) {
                kt_fail(__FILE__, __LINE__, "%s: %s", cookbook[c].name, kiln_ctx_errmsg(ctx));
                continue;
            }
            KT_CONTAINS(kiln_kernel_source(k), "user snippet");
            kiln_kernel_info info;
            kiln_kernel_describe(k, &info);
            if (info.spill_bytes)
                kt_fail(__FILE__, __LINE__, "%s: %d bytes spilled", kiln_kernel_spec(k),
                        info.spill_bytes);
        }
    kiln_ctx_destroy(ctx);
}

/* Fill run-time values and the check shape for cookbook entry c. */
static void setup(const cook *c, values *val, kiln_check_shape *s, int L_Q, int L_KV, int H,
                  uint64_t seed)
{
    memset(s, 0, sizeof *s);
    s->num_qo_heads = H;
    s->qo_len = L_Q;
    s->kv_len = L_KV;
    s->window_left = -1;
    s->seed = seed;
    s->ref_logits = c->ref_logits;
    s->ref_mask = c->ref_mask;
    s->ref_user = val;
    val->cap = 20.0f;
    val->window = L_KV / 4 + 3;
    val->sink = 4;
    val->prefix = L_KV / 3;
    for (int h = 0; h < 64; h++) val->slopes[h] = exp2f(-8.0f * (float)(h + 1) / (float)H);
    /* segments: random lengths 1..300, the query rows are the last L_Q keys */
    uint64_t x = seed | 1;
    int seg = 0, left = 0;
    for (int j = 0; j < L_KV && j < SEG_MAX; j++) {
        if (left == 0) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            left = 1 + (int)((x >> 33) % 300);
            seg++;
        }
        val->seg_kv[j] = seg;
        left--;
    }
    for (int i = 0; i < L_Q; i++) val->seg_q[i] = val->seg_kv[L_KV - L_Q + i];
    const char *n = c->name;
    if (!strcmp(n, "softcap")) s->user[0].f32 = val->cap;
    if (!strcmp(n, "alibi")) {
        s->user_host[0] = val->slopes;
        s->user_bytes[0] = sizeof(float) * (size_t)H;
    }
    if (!strcmp(n, "window")) s->user[0].i32 = val->window;
    if (!strcmp(n, "sink")) {
        s->user[0].i32 = val->sink;
        s->user[1].i32 = val->window;
    }
    if (!strcmp(n, "document")) {
        s->user_host[0] = val->seg_q;
        s->user_bytes[0] = sizeof(int) * (size_t)L_Q;
        s->user_host[1] = val->seg_kv;
        s->user_bytes[1] = sizeof(int) * (size_t)L_KV;
    }
    if (!strcmp(n, "prefix_lm")) s->user[0].i32 = val->prefix;
}

KT_GPU_TEST(gpu_custom_cookbook)
{
    kiln_ctx *ctx = KT_CTX(NULL, 1);
    KT_REQUIRE(ctx);
    static values val;
    static const int shapes[][2] = {{1, 1},    {1, 577},   {1, 4093},
                                    {37, 127}, {577, 577}, {200, 4093}};
    int cases = 0, bad = 0;
    for (int c = 0; c < NCOOK; c++)
        for (int op = 0; op < 2; op++)
            for (int dt = 0; dt < 2; dt++) {
                char od[64];
                snprintf(od, sizeof od, "op=%s dtype=%s", op ? "prefill" : "decode",
                         dt ? "bf16" : "f16");
                kiln_variant v;
                if (!cook_spec(&cookbook[c], od, &v)) continue;
                kiln_kernel *k = NULL;
                if (kiln_kernel_get(ctx, &v, &k) != KILN_STATUS_OK) {
                    kt_fail(__FILE__, __LINE__, "%s %s: %s", cookbook[c].name, od,
                            kiln_ctx_errmsg(ctx));
                    continue;
                }
                for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                    const int L_Q = op ? shapes[si][0] : 1, L_KV = shapes[si][1];
                    if (!op && si >= 3) break;
                    kiln_check_shape s;
                    setup(&cookbook[c], &val, &s, L_Q, L_KV, 8, 1000 + si);
                    kiln_check_result r;
                    char msg[512];
                    cases++;
                    if (kiln_check_run(ctx, k, &s, 0, &r, msg, sizeof msg) != KILN_STATUS_OK) {
                        bad++;
                        kt_fail(__FILE__, __LINE__, "%s %s L_Q=%d L_KV=%d: %s", cookbook[c].name,
                                od, L_Q, L_KV, msg);
                    }
                }
            }
    printf("    cookbook: %d variants x dtypes x ops, %d cases, %d bad\n", NCOOK, cases, bad);
    kiln_ctx_destroy(ctx);
}

/* A logits snippet of the form `B * tanhf(...)` (or `tanhf(...) * B`), B a float literal or an
 * f32 parameter, is bounded by |B|: the source says LOGITS_BOUNDED and reads the bound, so that
 * the wgmma softmax can take the builtin soft-cap's fixed reference (wg_cap_ref). Any other form,
 * an integer or array parameter, a sum after the call or a second factor is not. */
KT_TEST(custom_logits_bound)
{
    static const struct {
        const char *spec, *bound; /* bound: the C expression, or NULL (not bounded) */
    } cases[] = {
        {"params=cap:f32 logits_expr=\"cap * tanhf(logits / cap)\"",
         "fabsf(__int_as_float((int)(unsigned)p.user[0]))"},
        {"params=w:i32,cap:f32 logits_expr=\"tanhf((logits + (float)w) / cap) * cap\"",
         "fabsf(__int_as_float((int)(unsigned)p.user[1]))"},
        {"logits_expr=\"30.0f * tanhf(logits / 30.0f)\"", "fabsf(30.0f)"},
        {"logits_expr=\"30.0f * tanhf(logits) + 1.0f\"", NULL},
        {"logits_expr=\"30.0f * tanhf(logits) * 2.0f\"", NULL},
        {"logits_expr=\"tanhf(logits) * tanhf(logits)\"", NULL},
        {"params=n:i32 logits_expr=\"(float)n * tanhf(logits)\"", NULL},
        {"params=caps:f32[] logits_expr=\"caps[qo_head] * tanhf(logits)\"", NULL},
        {"logits_expr=\"logits - logf(1.0f + expf(logits))\"", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char spec[512];
        snprintf(spec, sizeof spec, "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal %s",
                 cases[i].spec);
        kiln_variant v;
        kiln__config cfg;
        kiln__err e;
        char *src = NULL;
        if (kiln_variant_parse(spec, &v) != KILN_STATUS_OK) {
            kt_fail(__FILE__, __LINE__, "%s: %s", spec, kiln_errmsg());
            continue;
        }
        KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
        KT_OK(kiln__expand(&v, &cfg, "sm_90a", &src, &e), e.msg);
        if (!src) continue;
        KT_CONTAINS(src, cases[i].bound ? "LOGITS_BOUNDED = true;" : "LOGITS_BOUNDED = false;");
        if (cases[i].bound) KT_CONTAINS(src, cases[i].bound);
        free(src);
    }
}

/* kiln folds a snippet's scalar factors into the tile loop's multiplies (jit/expand.c,
 * logits_fold): the input factor of `logits / X`, `logits * X` or `X * logits` into the q.k
 * scale, the output factor B of `B * tanhf(...)` into the softmax's exp2 factor. The source says
 * which, and holds the folded snippet; forms whose neighbours bind tighter, two reads of logits,
 * integer or array factors, a zero literal or a builtin transform are not folded. */
KT_TEST(custom_logits_fold)
{
    static const struct {
        const char *spec, *flags, *folded; /* folded: NULL where nothing is */
    } cases[] = {
        {"params=cap:f32 logits_expr=\"cap * tanhf(logits / cap)\"",
         "true, LOGITS_PRE = true, "
         "LOGITS_OUTER = true",
         "tanhf ( logits )"},
        {"logits_expr=\"30.0f * tanhf(logits / 30.0f)\"",
         "true, LOGITS_PRE = true, LOGITS_OUTER "
         "= true",
         "tanhf ( logits )"},
        {"params=w:i32,cap:f32 logits_expr=\"tanhf((logits + (float)w) / cap) * cap\"",
         "true, LOGITS_PRE = false, LOGITS_OUTER = true",
         "tanhf ( ( logits + ( float ) w ) / cap )"},
        {"params=a:f32,c:f32[] logits_expr=\"logits * a + c[kv_idx]\"",
         "true, LOGITS_PRE = true, LOGITS_OUTER = false", "logits + c [ kv_idx ]"},
        {"logits_expr=\"2.0f * logits\"", "true, LOGITS_PRE = true, LOGITS_OUTER = false",
         "logits"},
        {"params=t:f32 logits_expr=\"-logits / t - 0.25f * t\"",
         "true, LOGITS_PRE = true, LOGITS_OUTER = false", "- logits - 0.25f * t"},
        {"params=x:f32,y:f32 logits_expr=\"y / logits / x\"",
         "false, LOGITS_PRE = false, LOGITS_OUTER = false", NULL},
        {"params=x:f32,y:f32 logits_expr=\"y / x * logits\"",
         "false, LOGITS_PRE = false, LOGITS_OUTER = false", NULL},
        {"params=n:i32 logits_expr=\"logits / (float)n\"",
         "false, LOGITS_PRE = false, LOGITS_OUTER = false", NULL},
        {"params=a:f32 logits_expr=\"logits * logits / a\"",
         "false, LOGITS_PRE = false, LOGITS_OUTER = false", NULL},
        {"logits_expr=\"0.0f * tanhf(logits)\"", "false, LOGITS_PRE = false, LOGITS_OUTER = false",
         NULL},
        {"params=c:f32[] logits_expr=\"logits * c[qo_head]\"",
         "false, LOGITS_PRE = false, LOGITS_OUTER = false", NULL},
        {"logits=softcap params=a:f32 logits_expr=\"logits * a\"",
         "false, LOGITS_PRE = false, LOGITS_OUTER = false", NULL},
        {"params=n:i32 logits_expr=\"(float)n * tanhf(logits)\"",
         "false, LOGITS_PRE = false, LOGITS_OUTER = false", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char spec[512], flags[128];
        snprintf(spec, sizeof spec, "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal %s",
                 cases[i].spec);
        snprintf(flags, sizeof flags, "LOGITS_FOLDED = %s;", cases[i].flags);
        kiln_variant v;
        kiln__config cfg;
        kiln__err e;
        char *src = NULL;
        if (kiln_variant_parse(spec, &v) != KILN_STATUS_OK) {
            kt_fail(__FILE__, __LINE__, "%s: %s", spec, kiln_errmsg());
            continue;
        }
        KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
        KT_OK(kiln__expand(&v, &cfg, "sm_90a", &src, &e), e.msg);
        if (!src) continue;
        KT_CONTAINS(src, flags);
        if (cases[i].folded) {
            char want[256];
            snprintf(want, sizeof want, "factors folded */ %s\n", cases[i].folded);
            KT_CONTAINS(src, want);
        } else {
            KT_CHECK(!strstr(src, "factors folded */"));
        }
        free(src);
    }
}

/* The folded factors on the GPU, against the float64 reference of the snippet as written: a
 * negative output factor (the tile loop's sign branch), one past the fixed reference's range
 * (|B| log2(e) > 80: the running max on the folded S), negative and fractional input factors;
 * decode (tensor cores, running max) and prefill, f16 and bf16, odd shapes. */
typedef struct fold_case {
    const char *spec;
    float a;
    int kind; /* 0: a tanh(x / a), 1: x a, 2: -x / a - 0.25 a */
} fold_case;
static double r_fold(const void *u, double x, int i, int j, int h, int hk, int lq, int lkv)
{
    (void)i, (void)j, (void)h, (void)hk, (void)lq, (void)lkv;
    const fold_case *c = u;
    const double a = c->a;
    return c->kind == 0 ? a * tanh(x / a) : c->kind == 1 ? x * a : -x / a - 0.25 * a;
}
KT_GPU_TEST(gpu_custom_folded_factors)
{
    kiln_ctx *ctx = KT_CTX(NULL, 1);
    KT_REQUIRE(ctx);
    static const fold_case folds[] = {
        {"params=cap:f32 logits_expr=\"cap * tanhf(logits / cap)\"", -20.0f, 0},
        {"params=cap:f32 logits_expr=\"cap * tanhf(logits / cap)\"", 70.0f, 0},
        {"params=cap:f32 logits_expr=\"cap * tanhf(logits / cap)\"", -70.0f, 0},
        {"params=a:f32 logits_expr=\"logits * a\"", -1.5f, 1},
        {"params=a:f32 logits_expr=\"logits * a\"", 0.37f, 1},
        {"params=t:f32 logits_expr=\"-logits / t - 0.25f * t\"", 0.7f, 2},
    };
    static const int shapes[][2] = {{1, 1}, {1, 577}, {37, 127}, {577, 577}, {200, 4093}};
    int cases = 0, bad = 0;
    for (size_t f = 0; f < sizeof folds / sizeof folds[0]; f++)
        for (int op = 0; op < 2; op++)
            for (int dt = 0; dt < 2; dt++) {
                char spec[512];
                snprintf(spec, sizeof spec, "op=%s dtype=%s head_dim=128 group=4 mask=causal %s",
                         op ? "prefill" : "decode", dt ? "bf16" : "f16", folds[f].spec);
                kiln_kernel *k = NULL;
                if (kiln_kernel_get_spec(ctx, spec, &k) != KILN_STATUS_OK) {
                    kt_fail(__FILE__, __LINE__, "%s: %s", spec, kiln_ctx_errmsg(ctx));
                    continue;
                }
                for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                    const int L_Q = op ? shapes[si][0] : 1, L_KV = shapes[si][1];
                    if (!op && si >= 3) break;
                    kiln_check_shape s;
                    memset(&s, 0, sizeof s);
                    s.num_qo_heads = 8;
                    s.qo_len = L_Q;
                    s.kv_len = L_KV;
                    s.window_left = -1;
                    s.seed = 500 + si;
                    s.ref_logits = r_fold;
                    s.ref_user = &folds[f];
                    s.user[0].f32 = folds[f].a;
                    kiln_check_result r;
                    char msg[512];
                    cases++;
                    if (kiln_check_run(ctx, k, &s, 0, &r, msg, sizeof msg) != KILN_STATUS_OK) {
                        bad++;
                        kt_fail(__FILE__, __LINE__, "%s (a %g) L_Q=%d L_KV=%d: %s", spec,
                                (double)folds[f].a, L_Q, L_KV, msg);
                    }
                }
            }
    printf("    folded factors: %d cases, %d bad\n", cases, bad);
    kiln_ctx_destroy(ctx);
}

/* Builtin soft-cap and the snippet soft-cap on identical inputs give the same output. */
KT_GPU_TEST(gpu_custom_softcap_equals_builtin)
{
    kiln_ctx *ctx = KT_CTX(NULL, 1);
    KT_REQUIRE(ctx);
    static values val;
    for (int op = 0; op < 2; op++) {
        char spec[256];
        snprintf(spec, sizeof spec,
                 "op=%s dtype=bf16 head_dim=128 group=4 mask=causal logits=softcap",
                 op ? "prefill" : "decode");
        kiln_kernel *kb = NULL, *ks = NULL;
        KT_OK(kiln_kernel_get_spec(ctx, spec, &kb), kiln_ctx_errmsg(ctx));
        kiln_variant v;
        if (!cook_spec(&cookbook[0], op ? "op=prefill dtype=bf16" : "op=decode dtype=bf16", &v))
            continue;
        KT_OK(kiln_kernel_get(ctx, &v, &ks), kiln_ctx_errmsg(ctx));
        if (!kb || !ks) continue;
        const int L_Q = op ? 300 : 1, L_KV = 2049;
        kiln_check_shape s;
        setup(&cookbook[0], &val, &s, L_Q, L_KV, 8, 77);
        s.keep_output = 1;
        kiln_check_result rs, rb;
        char msg[512];
        KT_OK(kiln_check_run(ctx, ks, &s, 0, &rs, msg, sizeof msg), msg);
        s.ref_logits = NULL; /* the builtin applies the cap itself */
        s.softcap = val.cap;
        KT_OK(kiln_check_run(ctx, kb, &s, 0, &rb, msg, sizeof msg), msg);
        if (rs.o && rb.o) {
            double worst = 0;
            for (size_t i = 0; i < (size_t)L_Q * 8 * 128; i++) {
                double d = fabs(rs.o[i] - rb.o[i]);
                if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
            }
            printf("    %s: builtin vs snippet soft-cap max |diff| %.3g\n",
                   op ? "prefill" : "decode", worst);
            KT_CHECK(worst <= 1e-2);
        }
        free(rs.o);
        free(rb.o);
    }
    kiln_ctx_destroy(ctx);
}

/* A refused snippet never reaches NVRTC or the cache; a snippet calling every allowed function
 * compiles (NVRTC has each overload the validator admits). */
KT_TEST(custom_refused_not_cached)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/c", kt_tmpdir());
    kiln_ctx *ctx = KT_CTX(dir, 0);
    KT_REQUIRE(ctx);
    kiln_variant v;
    KT_OK(kiln_variant_parse("op=decode head_dim=64", &v), kiln_errmsg());
    snprintf(v.mask_expr, sizeof v.mask_expr, "%s", "kv_idx = 3");
    kiln_kernel *k = NULL;
    KT_STATUS(kiln_kernel_compile(ctx, &v, "sm_90a", &k), KILN_STATUS_PARSE, kiln_ctx_errmsg(ctx));
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "snippet 'mask'");
    kiln_ctx_destroy(ctx);
    /* nothing was stored */
    char db[700];
    snprintf(db, sizeof db, "%s/kernels.db", dir);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "%s --cache %s ls 2>&1 | grep -c 'op=' ", kt_kiln_bin(), dir);
    FILE *f = popen(cmd, "r");
    int rows = -1;
    if (f) {
        if (fscanf(f, "%d", &rows) != 1) rows = -1;
        pclose(f);
    }
    KT_EQ_INT(rows, 0);

    ctx = KT_CTX(dir, 0);
    KT_REQUIRE(ctx);
    KT_OK(kiln_variant_parse("op=prefill head_dim=64 params=x:f32,n:i32 logits_expr=\"expf(logits) "
                             "* 0.0f + exp2f(x) * 0.0f + "
                             "expm1f(x) * 0.0f + logf(2.0f) + log2f(2.0f) + log1pf(x) + powf(x, "
                             "2.0f) + sqrtf(4.0f) + "
                             "rsqrtf(4.0f) + tanhf(logits) + sinf(x) + cosf(x) + fabsf(x) + "
                             "fminf(x, 1.0f) + fmaxf(x, 1.0f) + "
                             "floorf(x) + ceilf(x) + truncf(x) + roundf(x) + min(x, 1.0f) + max(x, "
                             "1.0f) + (float)min(n, 1) + "
                             "(float)max(n, 1) + (float)abs(n) + logits\"",
                             &v),
          kiln_errmsg());
    KT_OK(kiln_kernel_compile(ctx, &v, "sm_90a", &k), kiln_ctx_errmsg(ctx));
    if (k) KT_CONTAINS(kiln_kernel_spec(k), "rsqrtf");
    kiln_ctx_destroy(ctx);
}
