/*
 * spec.c — the canonical text form of a kiln_variant: parse a spec line, check a variant, format
 * it back.
 *
 * A spec is `key=value` tokens separated by spaces or tabs, in any order; omitted keys take the
 * defaults of kiln_variant_default. The canonical form names every key once, in one fixed order,
 * separated by single spaces:
 *   op=prefill dtype=bf16 head_dim=128 group=4 layout=nhd mask=causal window=0 logits=softcap lse=0
 * with `q_dtype= kv_dtype= out_dtype=` in place of `dtype=` when the three differ. Since
 * format(parse(s)) == s for every canonical s and parse(format(v)) == v for every valid v, the
 * canonical spec stands for the variant in keys, cache rows and messages.
 *
 * Every key and its legal values live in one table (`keys` below); the parser, the checker, the
 * formatter and the enum names all read it.
 */
#include "jit.h"

#include <stdio.h>
#include <string.h>

/* Longest spec the parser reads, in bytes without the NUL. */
#define SPEC_INPUT_MAX 1024
/* Longest part of a token quoted in a message; longer tokens are cut and end in "...". */
#define SHOW_MAX 64
/* Legal range of group (G, query heads per KV head). */
#define GROUP_MIN 1
#define GROUP_MAX 64

/* ---- the key table ------------------------------------------------------------------------- */

/* One spelling of a value and the number stored in the variant. */
typedef struct choice {
    const char *word;
    int value;
} choice;

static const choice op_choices[] = {{"decode", KILN_OP_DECODE}, {"prefill", KILN_OP_PREFILL}};
static const choice dtype_choices[] = {{"f16", KILN_DTYPE_F16}, {"bf16", KILN_DTYPE_BF16}};
static const choice head_dim_choices[] = {{"64", 64}, {"128", 128}, {"256", 256}};
static const choice layout_choices[] = {{"nhd", KILN_LAYOUT_NHD}, {"hnd", KILN_LAYOUT_HND}};
static const choice mask_choices[] = {{"none", KILN_MASK_NONE}, {"causal", KILN_MASK_CAUSAL}};
static const choice flag_choices[] = {{"0", 0}, {"1", 1}};
static const choice logits_choices[] = {
    {"none", KILN_LOGITS_NONE}, {"softcap", KILN_LOGITS_SOFTCAP}, {"alibi", KILN_LOGITS_ALIBI}};

typedef enum key_id {
    KEY_OP,
    KEY_DTYPE,
    KEY_Q_DTYPE,
    KEY_KV_DTYPE,
    KEY_OUT_DTYPE,
    KEY_HEAD_DIM,
    KEY_GROUP,
    KEY_LAYOUT,
    KEY_MASK,
    KEY_WINDOW,
    KEY_LOGITS,
    KEY_LSE,
    KEY_COUNT_
} key_id;

/* A spec key: its name and legal values. */
typedef struct key_def {
    const char *name;
    const choice *choices; /* NULL: a decimal integer in GROUP_MIN..GROUP_MAX (group) */
    int nchoices;
    int numeric; /* 1: each word is the decimal spelling of its value ("64", "0") */
} key_def;

#define CHOICES(a) a, (int)(sizeof a / sizeof a[0])

static const key_def keys[KEY_COUNT_] = {
    [KEY_OP] = {"op", CHOICES(op_choices), 0},
    [KEY_DTYPE] = {"dtype", CHOICES(dtype_choices), 0},
    [KEY_Q_DTYPE] = {"q_dtype", CHOICES(dtype_choices), 0},
    [KEY_KV_DTYPE] = {"kv_dtype", CHOICES(dtype_choices), 0},
    [KEY_OUT_DTYPE] = {"out_dtype", CHOICES(dtype_choices), 0},
    [KEY_HEAD_DIM] = {"head_dim", CHOICES(head_dim_choices), 1},
    [KEY_GROUP] = {"group", NULL, 0, 1},
    [KEY_LAYOUT] = {"layout", CHOICES(layout_choices), 0},
    [KEY_MASK] = {"mask", CHOICES(mask_choices), 0},
    [KEY_WINDOW] = {"window", CHOICES(flag_choices), 1},
    [KEY_LOGITS] = {"logits", CHOICES(logits_choices), 0},
    [KEY_LSE] = {"lse", CHOICES(flag_choices), 1},
};

/* ---- helpers ------------------------------------------------------------------------------- */

/* A piece of the spec: n bytes at p, not NUL-terminated. */
typedef struct span {
    const char *p;
    size_t n;
} span;

static int is_blank(char c) { return c == ' ' || c == '\t'; }

static int span_is(span s, const char *word)
{
    return strlen(word) == s.n && memcmp(s.p, word, s.n) == 0;
}

/* Copy s into out[SHOW_MAX + 4] for a message, cut to SHOW_MAX bytes with "..." after. The
 * parser has already refused non-printable bytes, so the copy is printable. */
static void show_span(span s, char *out)
{
    size_t n = s.n > SHOW_MAX ? SHOW_MAX : s.n;
    memcpy(out, s.p, n);
    if (n < s.n) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = 0;
}

/* The word of `value` in a choice list, or "?" when the value has none. Never NULL. */
static const char *word_of(const choice *c, int n, int value)
{
    for (int i = 0; i < n; i++)
        if (c[i].value == value) return c[i].word;
    return "?";
}

static int has_value(const choice *c, int n, int value)
{
    for (int i = 0; i < n; i++)
        if (c[i].value == value) return 1;
    return 0;
}

/* "one of decode, prefill" for a key, into out[cap]. With `numbers`, non-numeric words carry
 * their stored value ("0 (decode), 1 (prefill)") for messages about a hand-made struct. */
static void list_choices(const key_def *k, int numbers, char *out, size_t cap)
{
    size_t at = 0;
    out[0] = 0;
    if (!k->choices) {
        snprintf(out, cap, "an integer in %d..%d", GROUP_MIN, GROUP_MAX);
        return;
    }
    for (int i = 0; i < k->nchoices && at < cap; i++) {
        const char *sep = i ? ", " : "one of ";
        int w = numbers && !k->numeric
                    ? snprintf(out + at, cap - at, "%s%d (%s)", sep, k->choices[i].value,
                               k->choices[i].word)
                    : snprintf(out + at, cap - at, "%s%s", sep, k->choices[i].word);
        if (w < 0) return;
        at += (size_t)w;
    }
}

/* "op, dtype, q_dtype, ..." into out[cap]. */
static void list_keys(char *out, size_t cap)
{
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < KEY_COUNT_ && at < cap; i++) {
        int w = snprintf(out + at, cap - at, "%s%s", i ? ", " : "", keys[i].name);
        if (w < 0) return;
        at += (size_t)w;
    }
}

static int find_key(span name)
{
    for (int i = 0; i < KEY_COUNT_; i++)
        if (span_is(name, keys[i].name)) return i;
    return -1;
}

/* Read a group value: decimal digits, no sign, no leading zero (except "0"). Returns 0 and the
 * number, 1 when the text is not such a number, 2 when it is out of GROUP_MIN..GROUP_MAX. */
static int read_group(span v, int *out)
{
    if (v.n == 0 || (v.n > 1 && v.p[0] == '0')) return 1;
    long x = 0;
    for (size_t i = 0; i < v.n; i++) {
        if (v.p[i] < '0' || v.p[i] > '9') return 1;
        if (x <= GROUP_MAX) x = x * 10 + (v.p[i] - '0');
    }
    if (x < GROUP_MIN || x > GROUP_MAX) return 2;
    *out = (int)x;
    return 0;
}

/* Parse one token into value[k] and remember it in given[k] (for duplicates and conflicts). */
static kiln_status parse_token(span tok, span given[KEY_COUNT_], int value[KEY_COUNT_],
                               kiln__err *e)
{
    char show[SHOW_MAX + 4], other[SHOW_MAX + 4], known[256];
    show_span(tok, show);
    const char *eq = memchr(tok.p, '=', tok.n);
    if (!eq) return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': expected key=value", show);
    span name = {tok.p, (size_t)(eq - tok.p)};
    span val = {eq + 1, tok.n - name.n - 1};
    if (memchr(val.p, '=', val.n))
        return kiln__fail(e, KILN_STATUS_PARSE,
                          "spec: token '%s': more than one '=' (expected key=value)", show);
    if (name.n == 0)
        return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': empty key before '='", show);
    int k = find_key(name);
    if (k < 0) {
        show_span(name, other);
        list_keys(known, sizeof known);
        return kiln__fail(e, KILN_STATUS_PARSE,
                          "spec: token '%s': unknown key '%s' (known keys: %s)", show, other,
                          known);
    }
    const key_def *def = &keys[k];
    if (given[k].p) {
        show_span(given[k], other);
        return kiln__fail(e, KILN_STATUS_PARSE,
                          "spec: token '%s': duplicate key '%s' (already given as '%s')", show,
                          def->name, other);
    }
    /* dtype sets the three dtypes at once: it may not meet any of them. */
    for (int j = KEY_DTYPE; j <= KEY_OUT_DTYPE && k >= KEY_DTYPE && k <= KEY_OUT_DTYPE; j++) {
        int clash = j != k && given[j].p && (k == KEY_DTYPE || j == KEY_DTYPE);
        if (!clash) continue;
        show_span(given[j], other);
        return kiln__fail(
            e, KILN_STATUS_PARSE,
            "spec: token '%s' conflicts with token '%s': dtype sets q_dtype, kv_dtype "
            "and out_dtype at once; give either dtype or the separate keys",
            show, other);
    }
    list_choices(def, 0, known, sizeof known);
    const char *empty = val.n ? "" : "empty value; ";
    if (!def->choices) {
        int r = read_group(val, &value[k]);
        if (r == 1)
            return kiln__fail(
                e, KILN_STATUS_PARSE,
                "spec: token '%s': %s%s must be a decimal integer in %d..%d (no sign, "
                "no leading zeros)",
                show, empty, def->name, GROUP_MIN, GROUP_MAX);
        if (r == 2)
            return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': %s must be in %d..%d", show,
                              def->name, GROUP_MIN, GROUP_MAX);
    } else {
        int i = 0;
        while (i < def->nchoices && !span_is(val, def->choices[i].word)) i++;
        if (i == def->nchoices)
            return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': %s%s must be %s", show,
                              empty, def->name, known);
        value[k] = def->choices[i].value;
    }
    given[k] = tok;
    return KILN_STATUS_OK;
}

/* Check one field of a variant against its key's legal values. */
static kiln_status check_field(const char *field, int v, key_id k, kiln__err *e)
{
    const key_def *def = &keys[k];
    if (def->choices ? has_value(def->choices, def->nchoices, v) : v >= GROUP_MIN && v <= GROUP_MAX)
        return KILN_STATUS_OK;
    char allowed[256];
    list_choices(def, 1, allowed, sizeof allowed);
    return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "variant: %s=%d: %s must be %s", field, v, field,
                      allowed);
}

/* ---- internal API -------------------------------------------------------------------------- */

const char *kiln__op_name(kiln_op op) { return word_of(CHOICES(op_choices), (int)op); }
const char *kiln__dtype_name(kiln_dtype t) { return word_of(CHOICES(dtype_choices), (int)t); }
const char *kiln__layout_name(kiln_layout l) { return word_of(CHOICES(layout_choices), (int)l); }
const char *kiln__mask_name(kiln_mask m) { return word_of(CHOICES(mask_choices), (int)m); }
const char *kiln__logits_name(kiln_logits l) { return word_of(CHOICES(logits_choices), (int)l); }

kiln_status kiln__variant_check(const kiln_variant *v, kiln__err *e)
{
    if (!v) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "variant: NULL pointer");
    kiln_status st;
    if ((st = check_field("op", (int)v->op, KEY_OP, e)) ||
        (st = check_field("q_dtype", (int)v->q_dtype, KEY_Q_DTYPE, e)) ||
        (st = check_field("kv_dtype", (int)v->kv_dtype, KEY_KV_DTYPE, e)) ||
        (st = check_field("out_dtype", (int)v->out_dtype, KEY_OUT_DTYPE, e)) ||
        (st = check_field("head_dim", v->head_dim, KEY_HEAD_DIM, e)) ||
        (st = check_field("group", v->group, KEY_GROUP, e)) ||
        (st = check_field("layout", (int)v->layout, KEY_LAYOUT, e)) ||
        (st = check_field("mask", (int)v->mask, KEY_MASK, e)) ||
        (st = check_field("window", v->window, KEY_WINDOW, e)) ||
        (st = check_field("logits", (int)v->logits, KEY_LOGITS, e)) ||
        (st = check_field("lse", v->lse, KEY_LSE, e)))
        return st;
    if (v->q_dtype != v->kv_dtype)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "variant: q_dtype=%s kv_dtype=%s: q_dtype must equal kv_dtype (q and k "
                          "feed the same mma.sync instruction; only out_dtype may differ)",
                          kiln__dtype_name(v->q_dtype), kiln__dtype_name(v->kv_dtype));
    return KILN_STATUS_OK;
}

/* Parse `spec` (NUL-terminated, at most SPEC_INPUT_MAX bytes) into *out, then check it. On
 * failure *out is zeroed and e names the token and what is allowed. */
kiln_status kiln__spec_parse(const char *spec, kiln_variant *out, kiln__err *e)
{
    if (!out) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "spec: NULL output variant");
    memset(out, 0, sizeof *out);
    if (!spec) return kiln__fail(e, KILN_STATUS_PARSE, "spec: NULL spec (\"\" means all defaults)");
    size_t len = 0;
    while (len <= SPEC_INPUT_MAX && spec[len]) len++;
    if (len > SPEC_INPUT_MAX)
        return kiln__fail(e, KILN_STATUS_PARSE, "spec: longer than the %d-byte limit",
                          SPEC_INPUT_MAX);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)spec[i];
        if (!is_blank((char)c) && (c < 0x21 || c > 0x7e))
            return kiln__fail(e, KILN_STATUS_PARSE,
                              "spec: byte 0x%02x at offset %zu is not printable ASCII (a spec is "
                              "key=value tokens separated by spaces or tabs)",
                              c, i);
    }

    span given[KEY_COUNT_] = {{0}};
    int value[KEY_COUNT_] = {0};
    const char *p = spec;
    for (;;) {
        while (is_blank(*p)) p++;
        if (!*p) break;
        span tok = {p, 0};
        while (p[tok.n] && !is_blank(p[tok.n])) tok.n++;
        p += tok.n;
        kiln_status st = parse_token(tok, given, value, e);
        if (st) return st;
    }

    kiln_variant v;
    kiln_variant_default(&v);
    if (given[KEY_OP].p) v.op = (kiln_op)value[KEY_OP];
    if (given[KEY_DTYPE].p) v.q_dtype = v.kv_dtype = v.out_dtype = (kiln_dtype)value[KEY_DTYPE];
    if (given[KEY_Q_DTYPE].p) v.q_dtype = (kiln_dtype)value[KEY_Q_DTYPE];
    if (given[KEY_KV_DTYPE].p) v.kv_dtype = (kiln_dtype)value[KEY_KV_DTYPE];
    if (given[KEY_OUT_DTYPE].p) v.out_dtype = (kiln_dtype)value[KEY_OUT_DTYPE];
    if (given[KEY_HEAD_DIM].p) v.head_dim = value[KEY_HEAD_DIM];
    if (given[KEY_GROUP].p) v.group = value[KEY_GROUP];
    if (given[KEY_LAYOUT].p) v.layout = (kiln_layout)value[KEY_LAYOUT];
    if (given[KEY_MASK].p) v.mask = (kiln_mask)value[KEY_MASK];
    if (given[KEY_WINDOW].p) v.window = value[KEY_WINDOW];
    if (given[KEY_LOGITS].p) v.logits = (kiln_logits)value[KEY_LOGITS];
    if (given[KEY_LSE].p) v.lse = value[KEY_LSE];

    kiln_status st = kiln__variant_check(&v, e);
    if (st) return st;
    *out = v;
    return KILN_STATUS_OK;
}

/* Write the canonical spec of *v into buf[cap] (NUL-terminated when cap > 0; buf may be NULL
 * when cap is 0). Returns the length the whole text needs without the NUL, or 0 with e when *v
 * is invalid (buf then holds ""). */
size_t kiln__spec_format(const kiln_variant *v, char *buf, size_t cap, kiln__err *e)
{
    if (cap && !buf) {
        kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "spec: NULL buffer with capacity %zu", cap);
        return 0;
    }
    if (cap) buf[0] = 0;
    if (kiln__variant_check(v, e)) return 0;
    char dtypes[64];
    if (v->q_dtype == v->kv_dtype && v->kv_dtype == v->out_dtype)
        snprintf(dtypes, sizeof dtypes, "dtype=%s", kiln__dtype_name(v->q_dtype));
    else
        snprintf(dtypes, sizeof dtypes, "q_dtype=%s kv_dtype=%s out_dtype=%s",
                 kiln__dtype_name(v->q_dtype), kiln__dtype_name(v->kv_dtype),
                 kiln__dtype_name(v->out_dtype));
    int n = snprintf(
        buf, cap, "op=%s %s head_dim=%d group=%d layout=%s mask=%s window=%d logits=%s lse=%d",
        kiln__op_name(v->op), dtypes, v->head_dim, v->group, kiln__layout_name(v->layout),
        kiln__mask_name(v->mask), v->window, kiln__logits_name(v->logits), v->lse);
    if (n < 0) {
        if (cap) buf[0] = 0;
        kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "spec: formatting failed");
        return 0;
    }
    return (size_t)n;
}

/* ---- public API ---------------------------------------------------------------------------- */

void kiln_variant_default(kiln_variant *v)
{
    if (!v) return;
    *v = (kiln_variant){
        .op = KILN_OP_PREFILL,
        .q_dtype = KILN_DTYPE_F16,
        .kv_dtype = KILN_DTYPE_F16,
        .out_dtype = KILN_DTYPE_F16,
        .head_dim = 128,
        .group = 1,
        .layout = KILN_LAYOUT_NHD,
        .mask = KILN_MASK_NONE,
        .window = 0,
        .logits = KILN_LOGITS_NONE,
        .lse = 0,
    };
}

kiln_status kiln_variant_parse(const char *spec, kiln_variant *out)
{
    return kiln__spec_parse(spec, out, kiln__tls_err());
}

size_t kiln_variant_format(const kiln_variant *v, char *buf, size_t cap)
{
    return kiln__spec_format(v, buf, cap, kiln__tls_err());
}

kiln_status kiln_variant_check(const kiln_variant *v)
{
    return kiln__variant_check(v, kiln__tls_err());
}
