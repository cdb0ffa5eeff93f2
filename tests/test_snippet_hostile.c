/*
 * test_snippet_hostile.c — snippets and parameter names built to make the validator (libclang)
 * and NVRTC disagree: names NVRTC defines as macros, float literals out of range, literal
 * suffixes one compiler takes and the other does not, and operations on constants whose every
 * evaluation is undefined. The rule the corpus holds the pipeline to: a snippet either passes
 * validation and then compiles with NVRTC (sm_80, through kiln_kernel_compile), or is refused
 * at validation with a message that names the snippet's own line and column (or, for a
 * parameter, the parameter). Rows marked accepted sit right at the edges (the largest float,
 * 1 << 31, names that look like CUDA's) so that an over-eager fix fails too.
 *
 * Compiles are the slow part (decode head_dim=64, about 0.5 s each; one per accepted row).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit.h"
#include "kt.h"
#include "snippet.h"

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

#define L KILN__SNIPPET_LOGITS
#define M KILN__SNIPPET_MASK

/* The column a refusal names is where `at` first occurs in the snippet; ACCEPT: it must pass;
 * PARAM: the extra parameter's declaration is refused (no column: it is not in a snippet). */
#define ACCEPT NULL
#define PARAM  ""

typedef struct hostile {
    const char *class_; /* sub-class, for the counts and the messages */
    kiln__snippet_kind kind;
    const char *param;    /* an extra f32 parameter's name (the snippet reads it), or NULL */
    const char *text;     /* the snippet */
    const char *at;       /* ACCEPT, PARAM, or the text at the refused column */
    const char *fragment; /* part of the refusal's message ("" for accepted rows) */
} hostile;

static const hostile corpus[] = {
    /* ---- parameter names NVRTC predefines as macros, and reserved identifiers ---- */
    {"name", L, "NULL", "logits * NULL", PARAM, "a macro that NVRTC's built-in headers define"},
    {"name", L, "CUDART_VERSION", "logits + CUDART_VERSION", PARAM, "belong to CUDA"},
    {"name", L, "CUDARTAPI", "logits + CUDARTAPI", PARAM, "belong to CUDA"},
    {"name", L, "NV_TARGET_MINIMUM_SM_INTEGER", "logits + NV_TARGET_MINIMUM_SM_INTEGER", PARAM,
     "belong to CUDA"},
    {"name", L, "NV_IF_TARGET", "logits + NV_IF_TARGET", PARAM, "belong to CUDA"},
    {"name", L, "nv_scale", "logits * nv_scale", PARAM, "belong to CUDA"},
    {"name", L, "cudaStreamPerThread", "logits + cudaStreamPerThread", PARAM, "belong to CUDA"},
    {"name", L, "CU_UUID_HAS_BEEN_DEFINED", "logits + CU_UUID_HAS_BEEN_DEFINED", PARAM,
     "belong to CUDA"},
    {"name", L, "assert", "logits * assert", PARAM, "a macro that NVRTC's built-in headers define"},
    {"name", L, "va_start", "logits * va_start", PARAM, "a macro"},
    {"name", L, "NOMINMAX", "logits * NOMINMAX", PARAM, "a macro"},
    {"name", L, "STD", "logits * STD", PARAM, "a macro"},
    {"name", L, "alloca", "logits * alloca", PARAM, "a macro"},
    {"name", L, "__CUDACC__", "logits * __CUDACC__", PARAM, "a reserved identifier"},
    {"name", L, "__CUDA_ARCH__", "logits * __CUDA_ARCH__", PARAM, "a reserved identifier"},
    {"name", L, "_Scale", "logits * _Scale", PARAM, "a reserved identifier"},
    {"name", L, "my__cap", "logits * my__cap", PARAM, "a reserved identifier"},
    {"name", L, "warpSize", "logits * warpSize", PARAM, "a C++ keyword or a CUDA built-in"},
    /* names next to those, which both compilers take */
    {"name", L, "nvidia", "logits * nvidia", ACCEPT, ""},
    {"name", L, "cu", "logits * cu", ACCEPT, ""},
    {"name", L, "linux", "logits * linux + 0.0f", ACCEPT, ""},
    {"name", L, "unix", "logits * unix", ACCEPT, ""},
    {"name", L, "Null", "logits * Null", ACCEPT, ""},
    {"name", L, "STD_cap", "logits * STD_cap", ACCEPT, ""},
    {"name", L, "typeof", "logits * typeof", ACCEPT, ""},
    {"name", M, "_lo", "(float)kv_idx >= _lo", ACCEPT, ""},
    /* names of the generated source's own types, constants and helpers: the parameter is a
     * local of the hook, and everything the hook itself uses is a keyword or qualified */
    {"name", L, "D", "logits * D", ACCEPT, ""},
    {"name", L, "LOGITS", "logits * LOGITS", ACCEPT, ""},
    {"name", L, "float4", "logits * float4", ACCEPT, ""},
    {"name", L, "dim3", "logits * dim3", ACCEPT, ""},
    {"name", L, "half", "logits * half", ACCEPT, ""},
    {"name", L, "size_t", "logits * size_t", ACCEPT, ""},
    {"name", L, "tanh_fast", "tanhf(logits) * tanh_fast", ACCEPT, ""},
    {"name", L, "LOG2E", "expf(logits) * LOG2E", ACCEPT, ""},
    {"name", L, "user", "logits * user", ACCEPT, ""},

    /* ---- float literals out of range for their type ---- */
    {"range", L, NULL, "logits * 1e39f", "1e39f", "out of range for float (it rounds to infinity"},
    {"range", L, NULL, "logits * 3.4028236e38f", "3.40", "out of range for float"},
    {"range", L, NULL, "logits * 0x1p128f", "0x1p128f", "out of range for float"},
    {"range", L, NULL, "logits * 1e-50f", "1e-50f", "out of range for float (it rounds to zero"},
    {"range", L, NULL, "logits * 0x1p-150f", "0x1p", "rounds to zero"},
    {"range", L, NULL, "(float)(logits * 1e400)", "1e400", "out of range for double"},
    {"range", L, NULL, "(float)(logits * 1e-400)", "1e-400", "out of range for double"},
    {"range", M, NULL, "kv_idx < 1.8e308", "1.8e308", "out of range for double"},
    {"range", L, NULL, "logits + 9223372036854775808", "9223", "does not fit in long long"},
    {"range", L, NULL, "logits + 0x10000000000000000", "0x1", "does not fit in unsigned long long"},
    /* the edges, inside */
    {"range", L, NULL, "logits * 3.40282347e38f", ACCEPT, ""},
    {"range", L, NULL, "logits * 0x1.fffffep127f", ACCEPT, ""},
    {"range", L, NULL, "logits * 7.1e-46f + 1e-45f", ACCEPT, ""},
    {"range", L, NULL, "logits * 0.0e-999f + 0e999f", ACCEPT, ""},
    {"range", L, NULL, "(float)(logits * 4.9e-324)", ACCEPT, ""},
    {"range", L, NULL, "logits + (float)18446744073709551615u", ACCEPT, ""},

    /* ---- literal spellings ---- */
    {"suffix", L, NULL, "logits * 1.0q", "1.0q", "suffix 'q' is not allowed"},
    {"suffix", L, NULL, "logits * 1.0w", "1.0w", "suffix 'w' is not allowed"},
    {"suffix", L, NULL, "logits * 1i", "1i", "an imaginary literal is not allowed"},
    {"suffix", L, NULL, "logits * 1.0if", "1.0if", "imaginary"},
    {"suffix", L, NULL, "logits * 1.0df", "1.0df", "suffix 'df' is not allowed"},
    {"suffix", L, NULL, "logits * 1.0f16", "1.0f16", "suffix 'f16' is not allowed"},
    {"suffix", L, NULL, "logits * 1.0bf16", "1.0bf16", "suffix 'bf16' is not allowed"},
    {"suffix", L, NULL, "logits + 1uz", "1uz", "suffix 'uz' is not allowed"},
    {"suffix", L, NULL, "logits + 1z", "1z", "suffix 'z' is not allowed"},
    {"suffix", L, NULL, "logits + 1wb", "1wb", "suffix 'wb' is not allowed"},
    {"suffix", L, NULL, "logits + 1_km", "1_km", "user-defined literals are not allowed"},
    {"suffix", L, NULL, "logits + 2.5_x", "2.5_x", "user-defined literals"},
    {"suffix", L, NULL, "logits + 1'000", "1'000", "digit separators"},
    {"suffix", L, NULL, "logits + 0b101", "0b101", "binary literals are not allowed"},
    {"suffix", L, NULL, "logits + 1lL", "1lL", "suffix 'lL' is not allowed"},
    {"suffix", L, NULL, "logits * 1.0L", "1.0L", "long double literals are not allowed"},
    {"suffix", L, NULL, "logits * 1.0e3Q", "1.0e3Q", "suffix 'Q' is not allowed"},
    {"suffix", L, NULL, "logits * 0x1.8", "0x1.8", "a hex float needs a p exponent"},
    {"suffix", L, NULL, "logits * 0x1.8p", "0x1.8p", "the exponent has no digits"},
    {"suffix", M, NULL, "kv_idx < 09", "09", "'9' is not an octal digit"},
    {"suffix", L, NULL, "logits * 1i64", "1i64", "suffix 'i64' is not allowed"},
    /* spellings of the whitelist */
    {"suffix", L, NULL, "logits * 0x1p3f + 0X1.8P-2F", ACCEPT, ""},
    {"suffix", L, NULL, "logits * .5f + 1.e3f - 1E+2F", ACCEPT, ""},
    {"suffix", L, NULL, "logits + (float)(1ULL + 1llu + 1LLu + 1uL + 1Lu + 1ul)", ACCEPT, ""},
    {"suffix", M, NULL, "kv_idx < 017 + 0x1F + 0", ACCEPT, ""},

    /* ---- operations on constants whose every evaluation is undefined ---- */
    {"undefined", L, NULL, "logits / 0", "/", "division by zero is undefined"},
    {"undefined", L, NULL, "logits / (0)", "/", "division by zero is undefined"},
    {"undefined", L, NULL, "logits / (1 - 1)", "/", "division by zero is undefined"},
    {"undefined", L, NULL, "logits / 0.0f", "/", "division by zero is undefined"},
    {"undefined", L, NULL, "(float)(n / 0)", "/", "division by zero is undefined"},
    {"undefined", L, NULL, "(float)(n % 0)", "%", "remainder by zero is undefined"},
    {"undefined", M, NULL, "kv_idx % (2 - 2) == 1", "%", "remainder by zero is undefined"},
    {"undefined", L, NULL, "(float)(1 << 40)", "<<", "shift count >= width of type"},
    {"undefined", L, NULL, "(float)(n << -1)", "<<", "shift count is negative"},
    {"undefined", M, NULL, "kv_idx >> 32 == 0", ">>", "shift count >= width of type"},
    {"undefined", L, NULL, "(float)(-1 << 3)", "<<", "shifting a negative signed value"},
    {"undefined", L, NULL, "(float)(2147483647 + 1)", "+", "overflow in expression"},
    {"undefined", L, NULL, "(float)(65536 * 65536)", "*", "overflow in expression"},
    {"undefined", L, NULL, "(float)(-9223372036854775807LL - 2)", "- 2", "overflow"},
    {"undefined", L, NULL, "(float)((-2147483647 - 1) / -1)", "/ -1", "divided by -1 overflows"},
    {"undefined", L, NULL, "logits * (float)1e39", "1e39", "does not fit"},
    {"undefined", L, NULL, "(float)(int)1e20f", "1e20f", "does not fit"},
    {"undefined", L, NULL, "tanhf(1e39) + logits", "1e39", "does not fit"},
    {"undefined", L, NULL, "logits + (float)(1e308 * 10.0)", "*", "overflows"},
    {"undefined", L, NULL, "(float)abs(-2147483647 - 1) + logits", "-2147483647", "abs("},
    /* defined, right next to those */
    {"undefined", L, NULL, "(float)(1 << 31) + logits", ACCEPT, ""},
    {"undefined", L, NULL, "(float)(1LL << 62) + logits", ACCEPT, ""},
    {"undefined", L, NULL, "(float)(4294967295u + 1u) + logits", ACCEPT, ""},
    {"undefined", L, NULL, "logits / 2 + (float)(n / -1) + (float)(n % 7)", ACCEPT, ""},
    {"undefined", M, NULL, "kv_idx >> 31 == 0 && kv_idx / (qo_len + 1) >= 0", ACCEPT, ""},
    {"undefined", L, NULL, "logits * (float)3e38 + (float)(int)2e9f", ACCEPT, ""},
    {"undefined", L, NULL, "logits * 1e38f * 1e38f + (float)abs(-2147483647)", ACCEPT, ""},
};

static const char *kind_name(kiln__snippet_kind k) { return k == M ? "mask" : "logits"; }

/* The variant of a row: decode head_dim=64 with params cap:f32, n:i32, slopes:f32[] and the
 * row's own parameter last. */
static void row_variant(const hostile *h, kiln_variant *v)
{
    kiln_variant_default(v);
    v->op = KILN_OP_DECODE;
    v->head_dim = 64;
    static const struct {
        const char *name;
        kiln_param_type type;
    } fixed[] = {{"cap", KILN_PARAM_F32}, {"n", KILN_PARAM_I32}, {"slopes", KILN_PARAM_F32_ARRAY}};
    for (int i = 0; i < COUNT(fixed); i++) {
        snprintf(v->params[i].name, sizeof v->params[i].name, "%s", fixed[i].name);
        v->params[i].type = fixed[i].type;
    }
    v->num_params = COUNT(fixed);
    if (h->param) {
        snprintf(v->params[v->num_params].name, sizeof v->params[0].name, "%s", h->param);
        v->params[v->num_params++].type = KILN_PARAM_F32;
    }
    snprintf(h->kind == M ? v->mask_expr : v->logits_expr, KILN_MAX_SNIPPET, "%s", h->text);
}

/* Can libclang be loaded? (Skips the test when it cannot.) */
static int have_clang(void)
{
    kiln__err e = {{0}};
    char canon[KILN_MAX_SNIPPET];
    if (kiln__snippet_check(L, "logits", NULL, 0, canon, sizeof canon, &e) == KILN_STATUS_OK)
        return 1;
    kt_skip("libclang: %s", e.msg);
    return 0;
}

KT_TEST(snippet_hostile_corpus)
{
    if (!have_clang()) return;
    kiln_ctx *ctx = KT_CTX(NULL, 0);
    KT_REQUIRE(ctx != NULL);
    static const char *const classes[] = {"name", "range", "suffix", "undefined"};
    int refused[COUNT(classes)] = {0}, accepted[COUNT(classes)] = {0};
    for (int i = 0; i < COUNT(corpus); i++) {
        const hostile *h = &corpus[i];
        kiln_variant v;
        row_variant(h, &v);
        kiln_variant checked = v;
        kiln__err e = {{0}};
        kiln_status st = kiln__variant_canonicalize(&checked, &e);
        int c = 0;
        while (c < COUNT(classes) - 1 && strcmp(classes[c], h->class_)) c++;
        if (st == KILN_STATUS_OK) {
            accepted[c]++;
            /* validation took it: NVRTC must compile it, for an arch with no GPU needed */
            kiln_kernel *k = NULL;
            kiln_status cs = kiln_kernel_compile(ctx, &v, "sm_80", &k);
            if (cs != KILN_STATUS_OK)
                kt_fail(__FILE__, __LINE__,
                        "row %d (%s) '%s': validation accepts it, NVRTC "
                        "refuses it: %s: %s",
                        i, h->class_, h->text, kiln_status_str(cs), kiln_ctx_errmsg(ctx));
            if (h->at != ACCEPT)
                kt_fail(__FILE__, __LINE__, "row %d (%s) '%s': accepted, want refused (%s)", i,
                        h->class_, h->text, h->fragment);
            continue;
        }
        refused[c]++;
        if (h->at == ACCEPT) {
            kt_fail(__FILE__, __LINE__, "row %d (%s) '%s': refused, want accepted: %s", i,
                    h->class_, h->text, e.msg);
            continue;
        }
        KT_CONTAINS(e.msg, h->fragment);
        if (!h->at[0]) {
            /* a parameter: refused by the declaration check, naming it */
            char want[96];
            snprintf(want, sizeof want, "params[3] '%s': ", h->param);
            KT_STATUS(st, KILN_STATUS_UNSUPPORTED, e.msg);
            KT_CONTAINS(e.msg, want);
            continue;
        }
        /* a snippet: refused as a parse error at its own line and column */
        KT_STATUS(st, KILN_STATUS_PARSE, e.msg);
        const char *at = strstr(h->text, h->at);
        KT_REQUIRE(at != NULL);
        char want[64];
        snprintf(want, sizeof want, "snippet '%s' 1:%d: ", kind_name(h->kind),
                 (int)(at - h->text) + 1);
        KT_CONTAINS(e.msg, want);
        /* the message never points into the generated source */
        KT_CHECK(strstr(e.msg, "kiln_") == NULL && strstr(e.msg, ".cu") == NULL);
        /* and the whole pipeline refuses it the same way, before NVRTC */
        kiln_kernel *k = NULL;
        KT_STATUS(kiln_kernel_compile(ctx, &v, "sm_80", &k), KILN_STATUS_PARSE,
                  kiln_ctx_errmsg(ctx));
        KT_CONTAINS(kiln_ctx_errmsg(ctx), want);
    }
    for (int c = 0; c < COUNT(classes); c++) {
        printf("    %-9s %2d refused, %2d accepted and compiled\n", classes[c], refused[c],
               accepted[c]);
        KT_CHECK(refused[c] >= 8);
        KT_CHECK(accepted[c] >= 4);
    }
    kiln_ctx_destroy(ctx);
}

/* ---- the macro names, from NVRTC itself ------------------------------------------------------ */

/* Every identifier `#define`d in NVRTC's built-in headers (the text of libnvrtc-builtins next
 * to the NVRTC kiln loads) that is not reserved must be refused as a parameter name: a later
 * toolkit that adds one fails this test instead of a user's compile. */
KT_TEST(snippet_hostile_nvrtc_macro_names)
{
    char path[1024];
    const char *lib = getenv("KILN_NVRTC");
    snprintf(path, sizeof path, "%s", lib && *lib ? lib : KILN_NVRTC_DEFAULT);
    char *slash = strrchr(path, '/');
    if (!slash) {
        kt_skip("NVRTC path %s has no directory", path);
        return;
    }
    snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "libnvrtc-builtins.so");
    FILE *f = fopen(path, "rb");
    if (!f) {
        kt_skip("cannot open %s", path);
        return;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = size > 0 ? malloc((size_t)size + 1) : NULL;
    size_t got = text ? fread(text, 1, (size_t)size, f) : 0;
    fclose(f);
    KT_REQUIRE(text != NULL && got == (size_t)size);
    text[got] = 0;
    int names = 0, checked = 0;
    for (size_t i = 0; i + 8 < got; i++) {
        const char before = i ? text[i - 1] : '\n';
        if (text[i] != '#' || (before != '\n' && before != ' ' && before != '\t')) continue;
        size_t j = i + 1;
        while (text[j] == ' ' || text[j] == '\t') j++;
        if (strncmp(text + j, "define", 6) || (text[j + 6] != ' ' && text[j + 6] != '\t')) continue;
        j += 6;
        while (text[j] == ' ' || text[j] == '\t') j++;
        kiln_param_decl d = {{0}, KILN_PARAM_F32};
        size_t n = 0;
        for (char c = text[j]; n < sizeof d.name - 1; c = text[j + ++n])
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                  (n && c >= '0' && c <= '9')))
                break;
        if (!n || n == sizeof d.name - 1) continue; /* over 31 bytes: refused as too long */
        memcpy(d.name, text + j, n);
        names++;
        kiln__err e = {{0}};
        if (kiln__params_check(&d, 1, &e) == KILN_STATUS_OK)
            kt_fail(__FILE__, __LINE__,
                    "'%s' is a macro of %s, and kiln takes it as a parameter "
                    "name",
                    d.name, path);
        checked++;
    }
    free(text);
    printf("    %d #define names in %s, all refused\n", checked, path);
    KT_CHECK(names > 100); /* the file is text we can read */
}
