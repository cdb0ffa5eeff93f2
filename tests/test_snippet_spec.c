/*
 * test_snippet_spec.c — snippets and parameters as parts of a spec (jit/spec.c with
 * jit/snippet.c): canonicalisation and the key (spellings that mean the same give one key,
 * others differ), the canonical forms of specs with snippets, refused specs, escapes, a cheap
 * kiln_variant_check that never loads libclang, and the validator without libclang. CPU only; the tests that need libclang skip cleanly without it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit.h"
#include "kt.h"
#include "libclang.h"
#include "snippet.h"

#define M KILN__SNIPPET_MASK

/* The sm_90a key of spec into key; 0 (the test failed) when there is none. */
static int key90(const char *spec, char key[33])
{
    kt_key_of(spec, "sm_90a", key);
    return key[0] != 0;
}

/* ---- canonicalisation and the key ---------------------------------------------------------- */

KT_TEST(snippet_canonical_key)
{
    if (!kt_need_clang()) return;
    static const char *const same[][2] = {
        {"logits_expr=\"logits+1.0f\"", "logits_expr=\"logits  +  1.0f /* c */\""},
        {"mask_expr=\"kv_idx<=qo_idx\"", "mask_expr=\"\tkv_idx <=qo_idx // note\""},
        {"params=w:i32 mask_expr=\"kv_idx>=qo_idx-w\"",
         "mask_expr=\"kv_idx >= qo_idx - w\" params=w:i32"},
        {"logits_expr=\"30.0f*tanhf(logits/30.0f)\"",
         "logits_expr=\"30.0f * tanhf ( logits / 30.0f )\""},
    };
    static const char *const differ[][2] = {
        {"logits_expr=\"logits+1.0f\"", "logits_expr=\"logits+1.f\""},  /* any token */
        {"logits_expr=\"logits+1.0f\"", "logits_expr=\"1.0f+logits\""}, /* order */
        {"logits_expr=\"logits+a\" params=a:f32,b:f32",
         "logits_expr=\"logits+b\" params=a:f32,b:f32"},
        {"params=a:f32 logits_expr=\"logits*a\"",
         "params=a:i32 logits_expr=\"logits*a\""}, /* type */
        {"params=a:f32,b:f32 logits_expr=\"logits*a\"",
         "params=b:f32,a:f32 logits_expr=\"logits*a\""},
        {"mask_expr=\"kv_idx<=qo_idx\"", "mask_expr=\"kv_idx<=qo_idx\" mask_data=bitmask"},
        {"mask_expr=\"kv_idx<=qo_idx\"", "mask_expr=\"kv_idx<qo_idx\""},
        {"logits_expr=\"kv_idx\"", "mask_expr=\"kv_idx\""}, /* which hook */
        {"", "logits_expr=\"logits\""},
    };
    char a[33], b[33];
    for (int i = 0; i < KT_COUNT(same); i++) {
        if (!key90(same[i][0], a) || !key90(same[i][1], b)) continue;
        if (strcmp(a, b))
            kt_fail(__FILE__, __LINE__, "'%s' and '%s' have different keys", same[i][0],
                    same[i][1]);
    }
    for (int i = 0; i < KT_COUNT(differ); i++) {
        if (!key90(differ[i][0], a) || !key90(differ[i][1], b)) continue;
        if (!strcmp(a, b))
            kt_fail(__FILE__, __LINE__, "'%s' and '%s' share a key", differ[i][0], differ[i][1]);
    }
}

/* kiln__variant_canonicalize in place; it leaves the tail of each field zeroed. */
KT_TEST(snippet_variant_canonicalize)
{
    if (!kt_need_clang()) return;
    kiln_variant v;
    kiln_variant_default(&v);
    memset(v.logits_expr, 'q', sizeof v.logits_expr);
    strcpy(v.logits_expr, "logits*scale /* x */");
    strcpy(v.mask_expr, "kv_idx<=qo_idx");
    v.num_params = 1;
    snprintf(v.params[0].name, sizeof v.params[0].name, "scale");
    v.params[0].type = KILN_PARAM_F32;
    kiln__err e;
    KT_OK(kiln__variant_canonicalize(&v, &e), e.msg);
    KT_EQ_STR(v.logits_expr, "logits * scale");
    KT_EQ_STR(v.mask_expr, "kv_idx <= qo_idx");
    for (size_t i = strlen(v.logits_expr); i < sizeof v.logits_expr; i++)
        if (v.logits_expr[i]) {
            kt_fail(__FILE__, __LINE__, "byte %zu of logits_expr not zeroed", i);
            break;
        }
    strcpy(v.mask_expr, "logits > 0");
    KT_EQ_INT(kiln__variant_canonicalize(&v, &e), KILN_STATUS_PARSE);
    KT_CONTAINS(e.msg, "snippet 'mask' 1:1: unknown name 'logits'");
    KT_EQ_INT(kiln__variant_canonicalize(NULL, &e), KILN_STATUS_INVALID_ARGUMENT);
    v.mask_expr[0] = 0;
    v.num_params = 9;
    KT_EQ_INT(kiln__variant_canonicalize(&v, &e), KILN_STATUS_UNSUPPORTED);
    /* no snippets: nothing to do, even without libclang */
    kiln_variant_default(&v);
    kiln__fault_arm("libclang", 1);
    KT_OK(kiln__variant_canonicalize(&v, &e), e.msg);
    kiln__fault_arm("libclang", 0);
}

/* ---- the spec ------------------------------------------------------------------------------ */

#define BASE                                                                                       \
    "op=prefill dtype=bf16 head_dim=128 group=4 layout=nhd mask=causal window=0 logits=none"

KT_TEST(snippet_spec_canonical_forms)
{
    if (!kt_need_clang()) return;
    static const struct {
        const char *in, *out;
    } rows[] = {
        {"logits_expr=\"30.0f*tanhf(logits/30.0f) /* cap */\" mask=causal dtype=bf16 group=4",
         BASE " lse=0 logits_expr=\"30.0f * tanhf ( logits / 30.0f )\""},
        {"mask_expr=\"kv_idx<=qo_idx\"  \t mask=causal group=4 dtype=bf16",
         BASE " lse=0 mask_expr=\"kv_idx <= qo_idx\""},
        {"logits_expr=\"logits\t*\t2\" dtype=bf16 mask=causal group=4",
         BASE " lse=0 logits_expr=\"logits * 2\""},
        /* \" inside the quotes: a quote inside a comment, dropped with it */
        {"logits_expr=\"logits /* a \\\"quoted\\\" word */ * 2\" dtype=bf16 mask=causal group=4",
         BASE " lse=0 logits_expr=\"logits * 2\""},
        /* empty snippets, mask_data=none and params order */
        {"logits_expr=\"\" mask_expr=\"\" mask_data=none dtype=bf16 mask=causal group=4",
         BASE " lse=0"},
        {"params=b:i32,a:f32 dtype=bf16 mask=causal group=4", BASE " lse=0 params=b:i32,a:f32"},
        /* '=' and blanks inside quotes belong to the value */
        {"mask_expr=\"kv_idx == qo_idx\" dtype=bf16 mask=causal group=4",
         BASE " lse=0 mask_expr=\"kv_idx == qo_idx\""},
    };
    for (int i = 0; i < KT_COUNT(rows); i++) {
        kiln_variant v;
        char buf[KILN__SPEC_MAX];
        if (kiln_variant_parse(rows[i].in, &v)) {
            kt_fail(__FILE__, __LINE__, "parse '%s': %s", rows[i].in, kiln_errmsg());
            continue;
        }
        kiln_variant_format(&v, buf, sizeof buf);
        KT_EQ_STR(buf, rows[i].out);
    }
}

KT_TEST(snippet_spec_refuses)
{
    if (!kt_need_clang()) return;
    static const struct {
        const char *spec;
        kiln_status want;
        const char *fragment;
    } rows[] = {
        {"logits_expr=logits", KILN_STATUS_PARSE,
         "token 'logits_expr=logits': logits_expr must be a quoted C expression"},
        {"logits_expr=\"logits", KILN_STATUS_PARSE, "unterminated quote"},
        {"logits_expr=\"logits\\\"", KILN_STATUS_PARSE, "unterminated quote"},
        {"logits_expr=\"a\"b", KILN_STATUS_PARSE, "text after the closing quote of logits_expr"},
        {"logits_expr=\"a\"\"b\"", KILN_STATUS_PARSE, "text after the closing quote"},
        {"logits_expr=\"\\q\"", KILN_STATUS_PARSE, "unknown escape in logits_expr"},
        {"logits_expr=\"logits \\\\ 2\"", KILN_STATUS_PARSE, "'\\' is not allowed"},
        {"logits_expr=\"logits = 1\"", KILN_STATUS_PARSE,
         "spec: snippet 'logits' 1:8: '=': assignment is not allowed"},
        {"mask_expr=\"logits > 0\"", KILN_STATUS_PARSE,
         "snippet 'mask' 1:1: unknown name 'logits'"},
        {"logits_expr=\"slopes[0]\"", KILN_STATUS_PARSE, "unknown name 'slopes'"},
        {"logits_expr=\"1\" logits_expr=\"2\"", KILN_STATUS_PARSE, "duplicate key 'logits_expr'"},
        {"mask_expr=\"1\" mask_expr=\"1\"", KILN_STATUS_PARSE, "duplicate key 'mask_expr'"},
        {"logits_expr=\" \"", KILN_STATUS_PARSE, "empty snippet"},
        {"params=", KILN_STATUS_PARSE, "token 'params=': empty value; params must be NAME:TYPE"},
        {"params=a", KILN_STATUS_PARSE, "no ':' in entry 1"},
        {"params=a:f64", KILN_STATUS_PARSE, "parameter 1: params must be NAME:TYPE"},
        {"params=a:f32,", KILN_STATUS_PARSE, "empty entry 2"},
        {"params=,a:f32", KILN_STATUS_PARSE, "empty entry 1"},
        {"params=a:f32,,b:f32", KILN_STATUS_PARSE, "empty entry 2"},
        {"params=a:f32,a:i32", KILN_STATUS_PARSE, "params[1] 'a': a duplicate name"},
        {"params=1a:f32", KILN_STATUS_PARSE,
         "token 'params=1a:f32': params[0] '1a': not an identifier"},
        {"params=logits:f32", KILN_STATUS_PARSE, "a built-in name"},
        {"params=:f32", KILN_STATUS_PARSE, "empty name"},
        {"params=a:f32 params=b:f32", KILN_STATUS_PARSE, "duplicate key 'params'"},
        {"params=a:f32,b:f32,c:f32,d:f32,e:f32,f:f32,g:f32,h:f32,i:f32", KILN_STATUS_PARSE,
         "more than 8 parameters"},
        {"params=abcdefghijklmnopqrstuvwxyz0123456:f32", KILN_STATUS_PARSE,
         "name longer than 31 bytes"},
        {"params=\"a:f32\"", KILN_STATUS_PARSE, "parameter 1: params must be NAME:TYPE"},
        {"mask_data=dense", KILN_STATUS_PARSE, "mask_data must be one of none, bitmask, bsr"},
        {"mask=\"causal\"", KILN_STATUS_PARSE, "mask must be one of none, causal"},
        {"op=\"a b\"", KILN_STATUS_PARSE, "token 'op=\"a b\"': op must be one of"},
    };
    for (int i = 0; i < KT_COUNT(rows); i++) {
        kiln_variant v;
        memset(&v, 0x5a, sizeof v);
        kiln_status st = kiln_variant_parse(rows[i].spec, &v);
        if (st != rows[i].want)
            kt_fail(__FILE__, __LINE__, "row %d '%s' -> %s, want %s: %s", i, rows[i].spec,
                    kiln_status_str(st), kiln_status_str(rows[i].want), kiln_errmsg());
        KT_CONTAINS(kiln_errmsg(), rows[i].fragment);
        kiln_variant zero;
        memset(&zero, 0, sizeof zero);
        KT_CHECK(memcmp(&v, &zero, sizeof v) == 0);
    }
    /* a snippet of 511 bytes fits the spec, 512 do not */
    char spec[KILN__SPEC_INPUT_MAX];
    int n = snprintf(spec, sizeof spec, "mask_expr=\"");
    memset(spec + n, ' ', 511);
    spec[n] = 'k', spec[n + 1] = 'v', spec[n + 2] = '_', spec[n + 3] = 'i', spec[n + 4] = 'd',
    spec[n + 5] = 'x';
    strcpy(spec + n + 511, "\"");
    kiln_variant v;
    KT_OK(kiln_variant_parse(spec, &v), kiln_errmsg());
    KT_EQ_STR(v.mask_expr, "kv_idx");
    memset(spec + n + 6, ' ', 506);
    strcpy(spec + n + 512, "\"");
    KT_STATUS(kiln_variant_parse(spec, &v), KILN_STATUS_PARSE, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "mask_expr is longer than 511 bytes");
}

/* Formatting escapes '"' and '\' in a hand-made (non-canonical) snippet. */
KT_TEST(snippet_spec_escapes)
{
    kiln_variant v;
    kiln_variant_default(&v);
    strcpy(v.logits_expr, "logits /* \"q\" \\ */");
    char buf[KILN__SPEC_MAX];
    KT_CHECK(kiln_variant_format(&v, buf, sizeof buf) > 0);
    KT_CONTAINS(buf, " lse=0 logits_expr=\"logits /* \\\"q\\\" \\\\ */\"");
    /* read back, the text is the same one (and then refused for its backslash) */
    kiln__err e;
    kiln_variant w;
    KT_EQ_INT(kiln__spec_parse(buf, &w, &e), KILN_STATUS_PARSE); /* before libclang */
    KT_CONTAINS(e.msg, "spec: snippet 'logits' 1:15: '\\' is not allowed");
    /* lengths: the worst case (every byte escaped, every parameter at its longest) fits */
    kiln_variant_default(&v);
    v.q_dtype = v.kv_dtype = KILN_DTYPE_BF16;
    v.mask_data = KILN_MASK_DATA_BITMASK;
    v.num_params = KILN_MAX_USER_PARAMS;
    for (int i = 0; i < KILN_MAX_USER_PARAMS; i++) {
        memset(v.params[i].name, 'a', KILN_MAX_PARAM_NAME - 1);
        v.params[i].name[0] = (char)('a' + i);
        v.params[i].name[KILN_MAX_PARAM_NAME - 1] = 0;
        v.params[i].type = KILN_PARAM_F32_ARRAY;
    }
    memset(v.logits_expr, '\\', KILN_MAX_SNIPPET - 1);
    memset(v.mask_expr, '"', KILN_MAX_SNIPPET - 1);
    size_t need = kiln_variant_format(&v, NULL, 0);
    KT_CHECK(need > 2 * 2 * (KILN_MAX_SNIPPET - 1));
    KT_CHECK(need < KILN__SPEC_MAX);
    char big[KILN__SPEC_MAX];
    KT_EQ_INT(kiln_variant_format(&v, big, sizeof big), need);
    KT_EQ_INT(strlen(big), need);
    /* cut short: always NUL-terminated, nothing past cap */
    memset(buf, '#', 64);
    KT_EQ_INT(kiln_variant_format(&v, buf, 40), need);
    KT_EQ_INT(strlen(buf), 39);
    KT_EQ_INT(buf[40], '#');
}

/* kiln__variant_check is cheap: it checks params and snippet bytes but never loads libclang. */
KT_TEST(snippet_variant_check_cheap)
{
    kiln_variant v;
    kiln_variant_default(&v);
    strcpy(v.logits_expr, "this is not checked here");
    strcpy(v.mask_expr, "nor this");
    kiln__fault_arm("libclang", 1);
    KT_OK(kiln_variant_check(&v), kiln_errmsg());
    v.op = KILN_OP_DECODE; /* decode variants may carry snippets too */
    KT_OK(kiln_variant_check(&v), kiln_errmsg());
    /* the armed fault is still there: libclang was never asked for */
    KT_CHECK(kiln__clang_get(NULL) == NULL);
    kiln__fault_arm("libclang", 0);

    static const struct {
        int field;
        const char *fragment;
    } rows[] = {
        {0, "variant: num_params=9: must be in 0..8"},
        {1, "variant: params[0] '1x': not an identifier"},
        {2, "variant: logits_expr is not NUL-terminated within 512 bytes"},
        {3, "variant: mask_expr: byte 0x0a at offset 6 is not printable ASCII"},
        {4, "variant: mask_data=3: mask_data must be one of 0 (none), 1 (bitmask), 2 (bsr)"},
        {5, "variant: params[0] 'x': type=9"},
    };
    for (int i = 0; i < KT_COUNT(rows); i++) {
        kiln_variant_default(&v);
        switch (rows[i].field) {
            case 0:
                v.num_params = 9;
                break;
            case 1:
                v.num_params = 1, strcpy(v.params[0].name, "1x");
                break;
            case 2:
                memset(v.logits_expr, 'a', sizeof v.logits_expr);
                break;
            case 3:
                strcpy(v.mask_expr, "kv_idx\n");
                break;
            case 4:
                v.mask_data = (kiln_mask_data)3;
                break;
            default:
                v.num_params = 1, strcpy(v.params[0].name, "x"),
                v.params[0].type = (kiln_param_type)9;
                break;
        }
        KT_STATUS(kiln_variant_check(&v), KILN_STATUS_UNSUPPORTED, kiln_errmsg());
        KT_CONTAINS(kiln_errmsg(), rows[i].fragment);
        char buf[64] = "x";
        KT_EQ_INT(kiln_variant_format(&v, buf, sizeof buf), 0);
        KT_EQ_STR(buf, "");
    }
}

/* Without libclang a spec with a snippet is UNSUPPORTED and says why; specs without snippets
 * never need it. Runs whether or not libclang is installed. */
KT_TEST(snippet_without_libclang)
{
    kiln_variant v;
    kiln__fault_arm("libclang", 1);
    KT_STATUS(kiln_variant_parse("mask_expr=\"kv_idx <= qo_idx\"", &v), KILN_STATUS_UNSUPPORTED,
              kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "spec: snippet: cannot load libclang");
    kiln__fault_arm("libclang", 1);
    KT_OK(kiln_variant_parse("op=decode params=a:f32 mask_data=bsr", &v), kiln_errmsg());
    kiln__err e;
    KT_EQ_INT(kiln__snippet_check(M, "kv_idx", NULL, 0, NULL, 0, &e), KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "cannot load libclang");
    /* refusals before libclang do not need it */
    kiln__fault_arm("libclang", 1);
    KT_EQ_INT(kiln__snippet_check(M, "1; 2", NULL, 0, NULL, 0, &e), KILN_STATUS_PARSE);
    kiln__fault_arm("libclang", 0);
}
