/*
 * test_spec.c — the canonical spec (jit/spec.c): round trips over the whole grid of valid
 * variants and over the serving keys, token order and whitespace, a table of rejected specs
 * with their status and message, hand-made bad structs and formatting into small buffers. The
 * arch names are test_arch.c. CPU only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit.h"
#include "kt.h"

static const char default_spec[] =
    "op=prefill dtype=f16 head_dim=128 group=1 layout=nhd mask=none window=0 logits=none lse=0";

/* Report the first field of a and b that differs, with the spec that produced them. */
static int same_variant(const kiln_variant *a, const kiln_variant *b, const char *spec, int line)
{
#define SAME(f)                                                                                    \
    if ((long long)a->f != (long long)b->f) {                                                      \
        kt_fail(__FILE__, line, "'%s': field " #f " %lld vs %lld", spec, (long long)a->f,          \
                (long long)b->f);                                                                  \
        return 0;                                                                                  \
    }
    SAME(op)
    SAME(q_dtype)
    SAME(kv_dtype)
    SAME(out_dtype)
    SAME(head_dim)
    SAME(group)
    SAME(layout)
    SAME(mask)
    SAME(window)
    SAME(logits)
    SAME(lse)
#undef SAME
    return 1;
}

#define KT_SAME_VARIANT(a, b, spec) same_variant((a), (b), (spec), __LINE__)

/* ---- defaults and small cases -------------------------------------------------------------- */

KT_TEST(spec_defaults)
{
    kiln_variant d, v;
    kiln_variant_default(&d);
    KT_EQ_INT(d.op, KILN_OP_PREFILL);
    KT_EQ_INT(d.q_dtype, KILN_DTYPE_F16);
    KT_EQ_INT(d.kv_dtype, KILN_DTYPE_F16);
    KT_EQ_INT(d.out_dtype, KILN_DTYPE_F16);
    KT_EQ_INT(d.head_dim, 128);
    KT_EQ_INT(d.group, 1);
    KT_EQ_INT(d.layout, KILN_LAYOUT_NHD);
    KT_EQ_INT(d.mask, KILN_MASK_NONE);
    KT_EQ_INT(d.window, 0);
    KT_EQ_INT(d.logits, KILN_LOGITS_NONE);
    KT_EQ_INT(d.lse, 0);
    kiln_variant_default(NULL); /* a no-op */
    KT_OK(kiln_variant_check(&d), kiln_errmsg());

    char buf[KILN__SPEC_MAX];
    KT_EQ_INT(kiln_variant_format(&d, buf, sizeof buf), strlen(default_spec));
    KT_EQ_STR(buf, default_spec);

    static const char *const empties[] = {"", " ", "\t", "  \t \t  "};
    for (int i = 0; i < KT_COUNT(empties); i++) {
        memset(&v, 0x5a, sizeof v);
        KT_OK(kiln_variant_parse(empties[i], &v), kiln_errmsg());
        KT_SAME_VARIANT(&v, &d, empties[i]);
    }
}

KT_TEST(spec_header_example)
{
    const char *s = "op=prefill dtype=bf16 head_dim=128 group=4 layout=nhd mask=causal window=0 "
                    "logits=softcap lse=0";
    kiln_variant v;
    KT_OK(kiln_variant_parse(s, &v), kiln_errmsg());
    KT_EQ_INT(v.op, KILN_OP_PREFILL);
    KT_EQ_INT(v.q_dtype, KILN_DTYPE_BF16);
    KT_EQ_INT(v.kv_dtype, KILN_DTYPE_BF16);
    KT_EQ_INT(v.out_dtype, KILN_DTYPE_BF16);
    KT_EQ_INT(v.group, 4);
    KT_EQ_INT(v.mask, KILN_MASK_CAUSAL);
    KT_EQ_INT(v.logits, KILN_LOGITS_SOFTCAP);
    char buf[KILN__SPEC_MAX];
    KT_EQ_INT(kiln_variant_format(&v, buf, sizeof buf), strlen(s));
    KT_EQ_STR(buf, s);
}

/* Omitted keys take the defaults; separate dtypes that agree format as dtype=. */
KT_TEST(spec_omitted_keys)
{
    static const struct {
        const char *in, *canonical;
    } rows[] = {
        {"mask=causal", "op=prefill dtype=f16 head_dim=128 group=1 layout=nhd mask=causal window=0 "
                        "logits=none lse=0"},
        {"op=decode group=8", "op=decode dtype=f16 head_dim=128 group=8 layout=nhd mask=none "
                              "window=0 logits=none lse=0"},
        {"out_dtype=bf16",
         "op=prefill q_dtype=f16 kv_dtype=f16 out_dtype=bf16 head_dim=128 group=1 layout=nhd "
         "mask=none window=0 logits=none lse=0"},
        {"q_dtype=bf16 kv_dtype=bf16",
         "op=prefill q_dtype=bf16 kv_dtype=bf16 out_dtype=f16 head_dim=128 group=1 layout=nhd "
         "mask=none window=0 logits=none lse=0"},
        {"q_dtype=bf16 kv_dtype=bf16 out_dtype=bf16",
         "op=prefill dtype=bf16 head_dim=128 group=1 layout=nhd mask=none window=0 logits=none "
         "lse=0"},
        {"out_dtype=f16 kv_dtype=f16 q_dtype=f16", default_spec},
        {"dtype=f16", default_spec},
        {"lse=1 window=1 logits=alibi head_dim=64 layout=hnd",
         "op=prefill dtype=f16 head_dim=64 group=1 layout=hnd mask=none window=1 logits=alibi "
         "lse=1"},
        {"logits=softcap_alibi", "op=prefill dtype=f16 head_dim=128 group=1 layout=nhd mask=none "
                                 "window=0 logits=softcap_alibi lse=0"},
        {"group=64 head_dim=256", "op=prefill dtype=f16 head_dim=256 group=64 layout=nhd mask=none "
                                  "window=0 logits=none lse=0"},
    };
    for (int i = 0; i < KT_COUNT(rows); i++) {
        kiln_variant v;
        char buf[KILN__SPEC_MAX];
        KT_OK(kiln_variant_parse(rows[i].in, &v), kiln_errmsg());
        KT_EQ_INT(kiln_variant_format(&v, buf, sizeof buf), strlen(rows[i].canonical));
        KT_EQ_STR(buf, rows[i].canonical);
    }
}

KT_TEST(spec_whitespace)
{
    const char *canonical = "op=decode dtype=bf16 head_dim=64 group=2 layout=hnd mask=causal "
                            "window=1 logits=alibi lse=1";
    static const char *const forms[] = {
        "  op=decode dtype=bf16 head_dim=64 group=2 layout=hnd mask=causal window=1 logits=alibi "
        "lse=1",
        "op=decode dtype=bf16 head_dim=64 group=2 layout=hnd mask=causal window=1 logits=alibi "
        "lse=1  ",
        "\top=decode\tdtype=bf16\thead_dim=64\tgroup=2\tlayout=hnd\tmask=causal\twindow=1\tlogits="
        "alibi\tlse=1\t",
        "op=decode    dtype=bf16 \t head_dim=64 group=2 layout=hnd mask=causal window=1 "
        "logits=alibi lse=1",
        " \t op=decode dtype=bf16  head_dim=64  group=2  layout=hnd  mask=causal  window=1  "
        "logits=alibi  lse=1 \t ",
    };
    kiln_variant want;
    KT_OK(kiln_variant_parse(canonical, &want), kiln_errmsg());
    for (int i = 0; i < KT_COUNT(forms); i++) {
        kiln_variant v;
        char buf[KILN__SPEC_MAX];
        KT_OK(kiln_variant_parse(forms[i], &v), kiln_errmsg());
        KT_SAME_VARIANT(&v, &want, forms[i]);
        kiln_variant_format(&v, buf, sizeof buf);
        KT_EQ_STR(buf, canonical);
    }
}

/* ---- the grid ------------------------------------------------------------------------------ */

static const int grid_head_dims[] = {64, 128, 256};
static const int grid_groups[] = {1, 2, 3, 4, 5, 7, 8, 10, 16, 32, 63, 64};

/* Size of the grid: (op × q/kv dtype × out dtype) × head_dim × group × (layout × mask × window)
 * × logits × lse. */
#define GRID_SIZE (8 * KT_COUNT(grid_head_dims) * KT_COUNT(grid_groups) * 8 * 3 * 2)

/* Take the next mixed-radix digit (base `base`) off *rest. */
static int digit(int *rest, int base)
{
    int d = *rest % base;
    *rest /= base;
    return d;
}

/* Call fn on every valid variant of the grid; returns how many it visited. */
static int grid_each(void (*fn)(const kiln_variant *v, void *arg), void *arg)
{
    int n = 0;
    for (int i = 0; i < GRID_SIZE; i++, n++) {
        int rest = i;
        kiln_variant v;
        kiln_variant_default(&v); /* no mask data, parameters or snippets */
        v.op = (kiln_op)digit(&rest, 2);
        v.q_dtype = v.kv_dtype = (kiln_dtype)digit(&rest, 2);
        v.out_dtype = (kiln_dtype)digit(&rest, 2);
        v.head_dim = grid_head_dims[digit(&rest, KT_COUNT(grid_head_dims))];
        v.group = grid_groups[digit(&rest, KT_COUNT(grid_groups))];
        v.layout = (kiln_layout)digit(&rest, 2);
        v.mask = (kiln_mask)digit(&rest, 2);
        v.window = digit(&rest, 2);
        v.logits = (kiln_logits)digit(&rest, 3);
        v.lse = digit(&rest, 2);
        fn(&v, arg);
    }
    return n;
}

static void roundtrip_one(const kiln_variant *v, void *arg)
{
    int *bad = arg;
    char buf[KILN__SPEC_MAX], again[KILN__SPEC_MAX];
    kiln_variant p;
    if (kiln_variant_check(v) != KILN_STATUS_OK) {
        if ((*bad)++ < 5) kt_fail(__FILE__, __LINE__, "valid variant refused: %s", kiln_errmsg());
        return;
    }
    size_t n = kiln_variant_format(v, buf, sizeof buf);
    if (n == 0 || n != strlen(buf) || n >= KILN__SPEC_MAX) {
        if ((*bad)++ < 5) kt_fail(__FILE__, __LINE__, "format returned %zu for '%s'", n, buf);
        return;
    }
    /* canonical: single spaces, no leading or trailing blank */
    if (buf[0] == ' ' || buf[n - 1] == ' ' || strstr(buf, "  ") || strchr(buf, '\t')) {
        if ((*bad)++ < 5) kt_fail(__FILE__, __LINE__, "not canonical: '%s'", buf);
        return;
    }
    if (kiln_variant_parse(buf, &p) != KILN_STATUS_OK) {
        if ((*bad)++ < 5)
            kt_fail(__FILE__, __LINE__, "'%s' does not parse: %s", buf, kiln_errmsg());
        return;
    }
    if (!KT_SAME_VARIANT(&p, v, buf)) {
        (*bad)++;
        return;
    }
    kiln_variant_format(&p, again, sizeof again);
    if (strcmp(again, buf) != 0 && (*bad)++ < 5)
        kt_fail(__FILE__, __LINE__, "format(parse(s)) != s: '%s' vs '%s'", again, buf);
}

KT_TEST(spec_roundtrip_grid)
{
    int bad = 0;
    int n = grid_each(roundtrip_one, &bad);
    KT_EQ_INT(n, GRID_SIZE);
    KT_EQ_INT(GRID_SIZE, 13824); /* the whole grid, not a sample */
    KT_EQ_INT(bad, 0);
}

/* Every group 1..64 round-trips (the grid samples a few). */
KT_TEST(spec_roundtrip_groups)
{
    for (int g = 1; g <= 64; g++) {
        char spec[64], want[KILN__SPEC_MAX], buf[KILN__SPEC_MAX];
        snprintf(spec, sizeof spec, "group=%d", g);
        snprintf(want, sizeof want,
                 "op=prefill dtype=f16 head_dim=128 group=%d layout=nhd mask=none window=0 "
                 "logits=none lse=0",
                 g);
        kiln_variant v;
        KT_OK(kiln_variant_parse(spec, &v), kiln_errmsg());
        KT_EQ_INT(v.group, g);
        kiln_variant_format(&v, buf, sizeof buf);
        KT_EQ_STR(buf, want);
    }
}

/* A tiny deterministic generator for shuffles. */
static unsigned lcg(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

typedef struct order_arg {
    unsigned seed;
    int visited, bad;
} order_arg;

/* Shuffle the canonical tokens of v a few ways; each order must parse to v. */
static void order_one(const kiln_variant *v, void *arg)
{
    order_arg *a = arg;
    if (a->visited++ % 37) return; /* a sample of the grid: every token set, many orders */
    char buf[KILN__SPEC_MAX], shuffled[KILN__SPEC_MAX];
    kiln_variant_format(v, buf, sizeof buf);
    char *tok[16];
    int n = 0;
    for (char *t = strtok(buf, " "); t && n < 16; t = strtok(NULL, " ")) tok[n++] = t;
    for (int round = 0; round < 8; round++) {
        if (round == 1) { /* reversed */
            for (int i = 0; i < n / 2; i++) {
                char *x = tok[i];
                tok[i] = tok[n - 1 - i];
                tok[n - 1 - i] = x;
            }
        } else if (round > 1) { /* Fisher–Yates */
            for (int i = n - 1; i > 0; i--) {
                int j = (int)(lcg(&a->seed) % (unsigned)(i + 1));
                char *x = tok[i];
                tok[i] = tok[j];
                tok[j] = x;
            }
        }
        shuffled[0] = 0;
        for (int i = 0; i < n; i++) {
            strcat(shuffled, i ? " " : "");
            strcat(shuffled, tok[i]);
        }
        kiln_variant p;
        if (kiln_variant_parse(shuffled, &p) != KILN_STATUS_OK) {
            if (a->bad++ < 5) kt_fail(__FILE__, __LINE__, "'%s': %s", shuffled, kiln_errmsg());
            continue;
        }
        if (!KT_SAME_VARIANT(&p, v, shuffled)) a->bad++;
    }
}

KT_TEST(spec_token_order)
{
    order_arg a = {12345u, 0, 0};
    grid_each(order_one, &a);
    KT_EQ_INT(a.bad, 0);
    KT_CHECK(a.visited > 1000);
}

/* ---- rejected specs ------------------------------------------------------------------------ */

typedef struct bad_spec {
    const char *spec;
    kiln_status want;
    const char *fragment; /* must appear in the message */
} bad_spec;

static const bad_spec bad_specs[] = {
    /* unknown keys */
    {"opx=decode", KILN_STATUS_PARSE, "spec: token 'opx=decode': unknown key 'opx'"},
    {"foo=1", KILN_STATUS_PARSE,
     "(known keys: op, dtype, q_dtype, kv_dtype, out_dtype, head_dim, group, layout, mask, "
     "window, logits, lse, kv, rope, q_tokens, mask_data, params, logits_expr, mask_expr)"},
    {"OP=decode", KILN_STATUS_PARSE, "unknown key 'OP'"},
    {"op=decode headdim=64", KILN_STATUS_PARSE, "token 'headdim=64': unknown key 'headdim'"},
    {"\"op=decode\"", KILN_STATUS_PARSE, "unknown key '\"op'"},
    {"x=", KILN_STATUS_PARSE, "unknown key 'x'"},
    /* bad values */
    {"op=fast", KILN_STATUS_PARSE, "spec: token 'op=fast': op must be one of decode, prefill"},
    {"op=Decode", KILN_STATUS_PARSE, "token 'op=Decode': op must be one of decode, prefill"},
    {"op=decode;", KILN_STATUS_PARSE, "op must be one of decode, prefill"},
    {"dtype=f32", KILN_STATUS_PARSE, "token 'dtype=f32': dtype must be one of f16, bf16"},
    {"dtype=fp16", KILN_STATUS_PARSE, "dtype must be one of f16, bf16"},
    {"q_dtype=f8", KILN_STATUS_PARSE, "token 'q_dtype=f8': q_dtype must be one of f16, bf16"},
    {"kv_dtype=fp8", KILN_STATUS_PARSE, "kv_dtype must be one of f16, bf16"},
    {"out_dtype=f32", KILN_STATUS_PARSE, "out_dtype must be one of f16, bf16"},
    {"head_dim=96", KILN_STATUS_PARSE,
     "spec: token 'head_dim=96': head_dim must be one of 64, 128, 256"},
    {"head_dim=0", KILN_STATUS_PARSE, "head_dim must be one of 64, 128, 256"},
    {"head_dim=0128", KILN_STATUS_PARSE, "token 'head_dim=0128'"},
    {"head_dim=512", KILN_STATUS_PARSE, "head_dim must be one of 64, 128, 256"},
    {"group=0", KILN_STATUS_PARSE, "token 'group=0': group must be in 1..64"},
    {"group=65", KILN_STATUS_PARSE, "token 'group=65': group must be in 1..64"},
    {"group=04", KILN_STATUS_PARSE, "token 'group=04': group must be a decimal integer in 1..64"},
    {"group=00", KILN_STATUS_PARSE, "no leading zeros"},
    {"group=-1", KILN_STATUS_PARSE,
     "token 'group=-1': group must be a decimal integer in 1..64 (no sign"},
    {"group=+1", KILN_STATUS_PARSE, "no sign"},
    {"group=1x", KILN_STATUS_PARSE, "token 'group=1x'"},
    {"group=4.0", KILN_STATUS_PARSE, "decimal integer"},
    {"group=99999999999999999999999", KILN_STATUS_PARSE, "group must be in 1..64"},
    {"layout=nhd2", KILN_STATUS_PARSE, "layout must be one of nhd, hnd"},
    {"layout=NHD", KILN_STATUS_PARSE, "token 'layout=NHD'"},
    {"mask=sliding", KILN_STATUS_PARSE, "mask must be one of none, causal"},
    {"window=2", KILN_STATUS_PARSE, "token 'window=2': window must be one of 0, 1"},
    {"window=yes", KILN_STATUS_PARSE, "window must be one of 0, 1"},
    {"logits=tanh", KILN_STATUS_PARSE, "logits must be one of none, softcap, alibi, softcap_alibi"},
    {"lse=true", KILN_STATUS_PARSE, "lse must be one of 0, 1"},
    /* duplicates */
    {"op=decode op=prefill", KILN_STATUS_PARSE,
     "token 'op=prefill': duplicate key 'op' (already given as 'op=decode')"},
    {"op=decode op=decode", KILN_STATUS_PARSE, "duplicate key 'op'"},
    {"mask=causal group=2 mask=causal", KILN_STATUS_PARSE, "already given as 'mask=causal'"},
    {"q_dtype=f16 kv_dtype=f16 q_dtype=f16", KILN_STATUS_PARSE, "duplicate key 'q_dtype'"},
    /* malformed tokens */
    {"op=", KILN_STATUS_PARSE, "token 'op=': empty value; op must be one of decode, prefill"},
    {"group=", KILN_STATUS_PARSE, "token 'group=': empty value; group must be"},
    {"=x", KILN_STATUS_PARSE, "token '=x': empty key"},
    {"=", KILN_STATUS_PARSE, "token '=': empty key"},
    {"op", KILN_STATUS_PARSE, "token 'op': expected key=value"},
    {"op=decode head_dim", KILN_STATUS_PARSE, "token 'head_dim': expected key=value"},
    {"op:decode", KILN_STATUS_PARSE, "expected key=value"},
    {"op = decode", KILN_STATUS_PARSE, "token 'op': expected key=value"},
    {"op=decode=1", KILN_STATUS_PARSE, "token 'op=decode=1': more than one '='"},
    {"a=b=c", KILN_STATUS_PARSE, "token 'a=b=c': more than one '='"},
    {"op==decode", KILN_STATUS_PARSE, "more than one '='"},
    {"op=decode,mask=causal", KILN_STATUS_PARSE, "more than one '='"},
    /* bytes */
    {"op=d\xc3\xa9"
     "code",
     KILN_STATUS_PARSE, "byte 0xc3 at offset 4 is not printable ASCII"},
    {"op=decode\n", KILN_STATUS_PARSE, "byte 0x0a at offset 9"},
    {"op=decode\r\n", KILN_STATUS_PARSE, "byte 0x0d"},
    {"op=decode\vmask=none", KILN_STATUS_PARSE, "byte 0x0b"},
    {"op=decode\x01", KILN_STATUS_PARSE, "byte 0x01"},
    {"op=decode\x7f", KILN_STATUS_PARSE, "byte 0x7f"},
    {"op=decode\tgarbage", KILN_STATUS_PARSE, "token 'garbage': expected key=value"},
    /* dtype against the separate dtypes */
    {"dtype=bf16 q_dtype=bf16", KILN_STATUS_PARSE,
     "token 'q_dtype=bf16' conflicts with token 'dtype=bf16'"},
    {"out_dtype=f16 dtype=f16", KILN_STATUS_PARSE,
     "token 'dtype=f16' conflicts with token 'out_dtype=f16'"},
    {"kv_dtype=bf16 op=decode dtype=bf16", KILN_STATUS_PARSE,
     "give either dtype or the separate keys"},
    /* valid syntax, unsupported variant */
    {"q_dtype=f16 kv_dtype=bf16", KILN_STATUS_UNSUPPORTED,
     "variant: q_dtype=f16 kv_dtype=bf16: q_dtype must equal kv_dtype"},
    {"q_dtype=bf16", KILN_STATUS_UNSUPPORTED, "q_dtype=bf16 kv_dtype=f16"},
    {"kv_dtype=bf16 out_dtype=bf16", KILN_STATUS_UNSUPPORTED, "only out_dtype may differ"},
    /* NULL */
    {NULL, KILN_STATUS_PARSE, "spec: NULL spec"},
};

KT_TEST(spec_reject_table)
{
    KT_CHECK(KT_COUNT(bad_specs) >= 40);
    for (int i = 0; i < KT_COUNT(bad_specs); i++) {
        const bad_spec *b = &bad_specs[i];
        kiln_variant v;
        memset(&v, 0x5a, sizeof v);
        kiln__tls_err()->msg[0] = 0;
        kiln_status st = kiln_variant_parse(b->spec, &v);
        if (st != b->want)
            kt_fail(__FILE__, __LINE__, "row %d '%s' -> %s, want %s: %s", i,
                    b->spec ? b->spec : "(NULL)", kiln_status_str(st), kiln_status_str(b->want),
                    kiln_errmsg());
        KT_CONTAINS(kiln_errmsg(), b->fragment);
        /* outputs are zero on failure */
        kiln_variant zero;
        memset(&zero, 0, sizeof zero);
        KT_CHECK(memcmp(&v, &zero, sizeof v) == 0);
        /* the internal call writes the same message into its own buffer */
        kiln__err e = {{0}};
        KT_EQ_INT(kiln__spec_parse(b->spec, &v, &e), b->want);
        KT_EQ_STR(e.msg, kiln_errmsg());
        /* and survives having nowhere to write */
        KT_EQ_INT(kiln__spec_parse(b->spec, &v, NULL), b->want);
    }
}

KT_TEST(spec_reject_long)
{
    enum { MAX = KILN__SPEC_INPUT_MAX };
    char spec[MAX + 64], want[64];
    /* exactly MAX bytes: blanks around one token are fine */
    memset(spec, ' ', MAX);
    memcpy(spec + 500, "op=decode", 9);
    spec[MAX] = 0;
    kiln_variant v;
    KT_OK(kiln_variant_parse(spec, &v), kiln_errmsg());
    KT_EQ_INT(v.op, KILN_OP_DECODE);
    /* MAX + 1 bytes: refused before anything else is read */
    memset(spec, ' ', MAX + 1);
    memcpy(spec + 500, "op=decode", 9);
    spec[MAX + 1] = 0;
    KT_STATUS(kiln_variant_parse(spec, &v), KILN_STATUS_PARSE, kiln_errmsg());
    snprintf(want, sizeof want, "spec: longer than the %d-byte limit", MAX);
    KT_CONTAINS(kiln_errmsg(), want);
    /* a long token is cut in the message */
    memset(spec, 'k', 1000);
    memcpy(spec + 1000, "=1", 3);
    KT_STATUS(kiln_variant_parse(spec, &v), KILN_STATUS_PARSE, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "...': unknown key 'kkkk");
    KT_CHECK(strlen(kiln_errmsg()) < 400);
}

KT_TEST(spec_null_arguments)
{
    kiln_variant v;
    KT_STATUS(kiln_variant_parse("op=decode", NULL), KILN_STATUS_INVALID_ARGUMENT, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "NULL output");
    KT_STATUS(kiln_variant_parse(NULL, &v), KILN_STATUS_PARSE, kiln_errmsg());
    KT_STATUS(kiln_variant_check(NULL), KILN_STATUS_INVALID_ARGUMENT, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "variant: NULL");
    char buf[8] = "xxxxxxx";
    KT_EQ_INT(kiln_variant_format(NULL, buf, sizeof buf), 0);
    KT_EQ_STR(buf, "");
    kiln_variant_default(&v);
    KT_EQ_INT(kiln_variant_format(&v, NULL, 8), 0);
    KT_CONTAINS(kiln_errmsg(), "NULL buffer");
}

/* ---- hand-made structs --------------------------------------------------------------------- */

KT_TEST(spec_check_bad_structs)
{
    static const struct {
        int field; /* which field to spoil */
        int value;
        const char *fragment;
    } rows[] = {
        {0, 3, "variant: op=3: op must be one of 0 (decode), 1 (prefill), 2 (merge)"},
        {0, -1, "variant: op=-1"},
        {1, 2, "variant: q_dtype=2: q_dtype must be one of 0 (f16), 1 (bf16)"},
        {2, 7, "variant: kv_dtype=7"},
        {3, 5, "variant: out_dtype=5: out_dtype must be one of 0 (f16), 1 (bf16)"},
        {4, 0, "variant: head_dim=0: head_dim must be one of 64, 128, 256"},
        {4, 96, "variant: head_dim=96"},
        {4, -128, "head_dim=-128"},
        {5, 0, "variant: group=0: group must be an integer in 1..64"},
        {5, 65, "variant: group=65"},
        {5, -3, "variant: group=-3"},
        {6, 2, "variant: layout=2: layout must be one of 0 (nhd), 1 (hnd)"},
        {7, 2, "variant: mask=2: mask must be one of 0 (none), 1 (causal)"},
        {8, 2, "variant: window=2: window must be one of 0, 1"},
        {8, -1, "variant: window=-1"},
        {9, 4,
         "variant: logits=4: logits must be one of 0 (none), 1 (softcap), 2 (alibi), 3 "
         "(softcap_alibi)"},
        {10, 2, "variant: lse=2: lse must be one of 0, 1"},
    };
    for (int i = 0; i < KT_COUNT(rows); i++) {
        kiln_variant v;
        kiln_variant_default(&v);
        switch (rows[i].field) {
            case 0:
                v.op = (kiln_op)rows[i].value;
                break;
            case 1:
                v.q_dtype = v.kv_dtype = (kiln_dtype)rows[i].value;
                break;
            case 2:
                v.kv_dtype = (kiln_dtype)rows[i].value;
                break;
            case 3:
                v.out_dtype = (kiln_dtype)rows[i].value;
                break;
            case 4:
                v.head_dim = rows[i].value;
                break;
            case 5:
                v.group = rows[i].value;
                break;
            case 6:
                v.layout = (kiln_layout)rows[i].value;
                break;
            case 7:
                v.mask = (kiln_mask)rows[i].value;
                break;
            case 8:
                v.window = rows[i].value;
                break;
            case 9:
                v.logits = (kiln_logits)rows[i].value;
                break;
            default:
                v.lse = rows[i].value;
                break;
        }
        KT_STATUS(kiln_variant_check(&v), KILN_STATUS_UNSUPPORTED, kiln_errmsg());
        KT_CONTAINS(kiln_errmsg(), rows[i].fragment);
        /* format refuses it with the same message and leaves "" */
        char want[1024], buf[KILN__SPEC_MAX];
        snprintf(want, sizeof want, "%s", kiln_errmsg());
        memset(buf, 'x', sizeof buf);
        KT_EQ_INT(kiln_variant_format(&v, buf, sizeof buf), 0);
        KT_EQ_STR(buf, "");
        KT_EQ_STR(kiln_errmsg(), want);
    }

    kiln_variant v;
    kiln_variant_default(&v);
    v.q_dtype = KILN_DTYPE_BF16;
    KT_STATUS(kiln_variant_check(&v), KILN_STATUS_UNSUPPORTED, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "variant: q_dtype=bf16 kv_dtype=f16: q_dtype must equal kv_dtype");
    v.kv_dtype = KILN_DTYPE_BF16; /* out_dtype f16 may differ */
    KT_OK(kiln_variant_check(&v), kiln_errmsg());

    memset(&v, 0, sizeof v); /* a zeroed struct is not a valid variant */
    KT_STATUS(kiln_variant_check(&v), KILN_STATUS_UNSUPPORTED, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "head_dim=0");

    kiln__err e = {{0}};
    KT_EQ_INT(kiln__variant_check(&v, &e), KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "head_dim=0");
    KT_EQ_INT(kiln__variant_check(&v, NULL), KILN_STATUS_UNSUPPORTED);
}

/* ---- formatting into small buffers --------------------------------------------------------- */

KT_TEST(spec_format_small_buffers)
{
    kiln_variant v;
    KT_OK(kiln_variant_parse("op=decode q_dtype=bf16 kv_dtype=bf16 out_dtype=f16 group=16", &v),
          kiln_errmsg());
    char full[KILN__SPEC_MAX];
    size_t need = kiln_variant_format(&v, full, sizeof full);
    KT_REQUIRE(need > 0 && need == strlen(full));
    KT_EQ_INT(kiln_variant_format(&v, NULL, 0), need);
    char buf[KILN__SPEC_MAX + 8];
    for (size_t cap = 0; cap <= need + 4; cap++) {
        memset(buf, '#', sizeof buf);
        size_t got = kiln_variant_format(&v, buf, cap);
        KT_EQ_INT(got, need);
        if (cap == 0) {
            KT_EQ_INT(buf[0], '#'); /* nothing written */
            continue;
        }
        size_t kept = cap - 1 < need ? cap - 1 : need;
        KT_EQ_INT(strlen(buf), kept);
        KT_CHECK(memcmp(buf, full, kept) == 0);
        KT_EQ_INT(buf[cap], '#'); /* nothing past cap */
    }
    /* the longest canonical spec fits KILN__SPEC_MAX with room to spare */
    KT_OK(kiln_variant_parse("op=prefill q_dtype=bf16 kv_dtype=bf16 out_dtype=f16 group=64 "
                             "mask=causal logits=softcap",
                             &v),
          kiln_errmsg());
    KT_CHECK(kiln_variant_format(&v, NULL, 0) < KILN__SPEC_MAX / 2);
}

KT_TEST(spec_names)
{
    KT_EQ_STR(kiln__op_name(KILN_OP_DECODE), "decode");
    KT_EQ_STR(kiln__op_name(KILN_OP_PREFILL), "prefill");
    KT_EQ_STR(kiln__op_name((kiln_op)9), "?");
    KT_EQ_STR(kiln__dtype_name(KILN_DTYPE_F16), "f16");
    KT_EQ_STR(kiln__dtype_name(KILN_DTYPE_BF16), "bf16");
    KT_EQ_STR(kiln__dtype_name((kiln_dtype)-1), "?");
    KT_EQ_STR(kiln__layout_name(KILN_LAYOUT_NHD), "nhd");
    KT_EQ_STR(kiln__layout_name(KILN_LAYOUT_HND), "hnd");
    KT_EQ_STR(kiln__layout_name((kiln_layout)2), "?");
    KT_EQ_STR(kiln__mask_name(KILN_MASK_NONE), "none");
    KT_EQ_STR(kiln__mask_name(KILN_MASK_CAUSAL), "causal");
    KT_EQ_STR(kiln__mask_name((kiln_mask)2), "?");
    KT_EQ_STR(kiln__logits_name(KILN_LOGITS_NONE), "none");
    KT_EQ_STR(kiln__logits_name(KILN_LOGITS_SOFTCAP), "softcap");
    KT_EQ_STR(kiln__logits_name(KILN_LOGITS_ALIBI), "alibi");
    KT_EQ_STR(kiln__logits_name(KILN_LOGITS_SOFTCAP_ALIBI), "softcap_alibi");
    KT_EQ_STR(kiln__logits_name((kiln_logits)4), "?");
}

/* The serving keys: every op × kv storage × kv dtype × rope × q dtype × out dtype round-trips
 * (format(parse(s)) == s and parse(format(v)) == v); fp8 needs a 16-bit q; mask data and
 * op=merge with batch keys are refused with the reason. */
KT_TEST(spec_roundtrip_serving_keys)
{
    static const char *const ops[] = {"decode", "prefill"};
    static const char *const kvs[] = {"contiguous", "ragged", "paged"};
    static const char *const kvts[] = {"f16", "bf16", "e4m3", "e5m2"};
    static const char *const dts[] = {"f16", "bf16"};
    kiln_variant v0;
    int n = 0;
    for (int o = 0; o < 2; o++)
        for (int s = 0; s < 3; s++)
            for (int t = 0; t < 4; t++)
                for (int r = 0; r < 2; r++)
                    for (int q = 0; q < 2; q++)
                        for (int u = 0; u < 2; u++) {
                            char spec[256], buf[KILN__SPEC_MAX];
                            snprintf(spec, sizeof spec,
                                     "op=%s q_dtype=%s kv_dtype=%s out_dtype=%s kv=%s rope=%d",
                                     ops[o], dts[q], kvts[t], dts[u], kvs[s], r);
                            kiln_variant v;
                            const int fp8 = t >= 2,
                                      ok = (fp8 || t == q) && (s != 0 || (!fp8 && !r));
                            if (!ok) {
                                KT_STATUS(kiln_variant_parse(spec, &v), KILN_STATUS_UNSUPPORTED,
                                          spec);
                                continue;
                            }
                            KT_OK(kiln_variant_parse(spec, &v), kiln_errmsg());
                            KT_EQ_INT((int)v.kv, s);
                            KT_EQ_INT(v.rope, r);
                            KT_EQ_INT((int)v.kv_dtype, t);
                            kiln_variant_format(&v, buf, sizeof buf);
                            kiln_variant w;
                            KT_OK(kiln_variant_parse(buf, &w), buf);
                            KT_CHECK(!memcmp(&v, &w, sizeof v));
                            char again[KILN__SPEC_MAX];
                            kiln_variant_format(&w, again, sizeof again);
                            KT_EQ_STR(again, buf);
                            /* optional keys appear only when set */
                            KT_CHECK((strstr(buf, " kv=") != NULL) == (s != 0));
                            KT_CHECK((strstr(buf, " rope=1") != NULL) == (r != 0));
                            n++;
                        }
    /* batches: ops, 2 kv, rope, q, out, per q its own kv dtype and both fp8; single requests
     * (kv=contiguous): no fp8, no rope */
    KT_EQ_INT(n, 2 * 2 * 2 * 2 * 2 * 3 + 2 * 2 * 2);
    KT_STATUS(kiln_variant_parse("op=decode kv_dtype=e4m3", &v0), KILN_STATUS_UNSUPPORTED,
              "single fp8");
    KT_CONTAINS(kiln_errmsg(), "a single request is a batch of one");
    kiln_variant v;
    /* mask data works per request in batches */
    static const char *const masked[] = {
        "op=decode dtype=f16 head_dim=128 group=1 kv=paged mask_data=bitmask",
        "op=prefill dtype=bf16 head_dim=64 group=4 kv=ragged mask_data=bsr"};
    for (int i = 0; i < 2; i++) {
        char canon[512], again[512];
        KT_OK(kiln_variant_parse(masked[i], &v), kiln_errmsg());
        kiln_variant_format(&v, canon, sizeof canon);
        KT_CHECK(strstr(canon, i ? " mask_data=bsr" : " mask_data=bitmask") != NULL);
        kiln_variant w;
        KT_OK(kiln_variant_parse(canon, &w), kiln_errmsg());
        kiln_variant_format(&w, again, sizeof again);
        KT_EQ_STR(again, canon);
    }
    KT_STATUS(kiln_variant_parse("op=merge kv=paged", &v), KILN_STATUS_UNSUPPORTED, "merge kv");
    KT_CONTAINS(kiln_errmsg(), "op=merge takes only dtype and head_dim");
    KT_STATUS(kiln_variant_parse("op=decode kv=blocks", &v), KILN_STATUS_PARSE, "kv value");
    KT_CONTAINS(kiln_errmsg(), "kv must be one of contiguous, ragged, paged");
    KT_STATUS(kiln_variant_parse("dtype=e4m3", &v), KILN_STATUS_PARSE, "fp8 q");
    KT_OK(kiln_variant_parse("op=merge dtype=bf16 head_dim=64", &v), kiln_errmsg());
    char buf[KILN__SPEC_MAX];
    kiln_variant_format(&v, buf, sizeof buf);
    KT_EQ_STR(
        buf,
        "op=merge dtype=bf16 head_dim=64 group=1 layout=nhd mask=none window=0 logits=none lse=0");
}
