/*
 * spec.c — the canonical text form of a kiln_variant: parse a spec line, check a variant, format
 * it back.
 *
 * A spec is `key=value` tokens separated by spaces or tabs, in any order; omitted keys take the
 * defaults of kiln_variant_default. The canonical form names every key once, in one fixed order,
 * separated by single spaces:
 *   op=prefill dtype=bf16 head_dim=128 group=4 layout=nhd mask=causal window=0 logits=softcap lse=0
 * with `q_dtype= kv_dtype= out_dtype=` in place of `dtype=` when the three differ, followed,
 * only when present, by
 *   kv=paged rope=1 q_tokens=4 mask_data=bitmask params=scale:f32,slopes:f32[] logits_expr="..." mask_expr="..."
 * Snippet values are quoted, with \" and \\ as the only escapes, and may hold blanks; the
 * parser canonicalises them (jit/snippet/: libclang), so a parsed spec carries canonical
 * snippet text. Since format(parse(s)) == s for every canonical s and parse(format(v)) == v for
 * every valid v whose snippets are canonical, the canonical spec stands for the variant in keys,
 * cache rows and messages.
 *
 * Every key and its legal values live in one table (`keys` below); the parser, the checker, the
 * formatter and the enum names all read it.
 */
#include "jit.h"

#include <stdio.h>
#include <string.h>

#include "snippet.h"

/* Longest spec the parser reads, in bytes without the NUL. */
#define SPEC_INPUT_MAX KILN__SPEC_INPUT_MAX
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

static const choice op_choices[] = {{"decode", KILN_OP_DECODE},
                                    {"prefill", KILN_OP_PREFILL},
                                    {"merge", KILN_OP_MERGE}};
static const choice dtype_choices[] = {{"f16", KILN_DTYPE_F16}, {"bf16", KILN_DTYPE_BF16}};
static const choice kv_dtype_choices[] = {{"f16", KILN_DTYPE_F16},
                                          {"bf16", KILN_DTYPE_BF16},
                                          {"e4m3", KILN_DTYPE_E4M3},
                                          {"e5m2", KILN_DTYPE_E5M2}};
static const choice kv_choices[] = {{"contiguous", KILN_KV_CONTIGUOUS},
                                    {"ragged", KILN_KV_RAGGED},
                                    {"paged", KILN_KV_PAGED}};
static const choice head_dim_choices[] = {{"64", 64}, {"128", 128}, {"256", 256}};
static const choice layout_choices[] = {{"nhd", KILN_LAYOUT_NHD}, {"hnd", KILN_LAYOUT_HND}};
static const choice mask_choices[] = {{"none", KILN_MASK_NONE}, {"causal", KILN_MASK_CAUSAL}};
static const choice flag_choices[] = {{"0", 0}, {"1", 1}};
static const choice q_tokens_choices[] = {{"0", 0}, {"1", 1}, {"2", 2},
                                          {"4", 4}, {"8", 8}, {"16", 16}};
static const choice logits_choices[] = {{"none", KILN_LOGITS_NONE},
                                        {"softcap", KILN_LOGITS_SOFTCAP},
                                        {"alibi", KILN_LOGITS_ALIBI},
                                        {"softcap_alibi", KILN_LOGITS_SOFTCAP_ALIBI}};
static const choice mask_data_choices[] = {{"none", KILN_MASK_DATA_NONE},
                                           {"bitmask", KILN_MASK_DATA_BITMASK},
                                           {"bsr", KILN_MASK_DATA_BSR}};

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
    KEY_KV,
    KEY_ROPE,
    KEY_Q_TOKENS,
    KEY_MASK_DATA,
    KEY_PARAMS,
    KEY_LOGITS_EXPR,
    KEY_MASK_EXPR,
    KEY_COUNT_
} key_id;

/* How a key's value is written. */
typedef enum key_text {
    TEXT_WORD = 0,    /* one of the choices (or, with no choices, group's integer) */
    TEXT_PARAMS = 1,  /* NAME:TYPE,NAME:TYPE */
    TEXT_SNIPPET = 2, /* "quoted C expression" */
} key_text;

/* A spec key: its name and legal values. */
typedef struct key_def {
    const char *name;
    const choice *choices; /* NULL: a decimal integer in GROUP_MIN..GROUP_MAX (group) */
    int nchoices;
    int numeric; /* 1: each word is the decimal spelling of its value ("64", "0") */
    key_text text;
} key_def;

#define CHOICES(a) a, (int)(sizeof a / sizeof a[0])

static const key_def keys[KEY_COUNT_] = {
    [KEY_OP] = {"op", CHOICES(op_choices), 0, TEXT_WORD},
    [KEY_DTYPE] = {"dtype", CHOICES(dtype_choices), 0, TEXT_WORD},
    [KEY_Q_DTYPE] = {"q_dtype", CHOICES(dtype_choices), 0, TEXT_WORD},
    [KEY_KV_DTYPE] = {"kv_dtype", CHOICES(kv_dtype_choices), 0, TEXT_WORD},
    [KEY_OUT_DTYPE] = {"out_dtype", CHOICES(dtype_choices), 0, TEXT_WORD},
    [KEY_HEAD_DIM] = {"head_dim", CHOICES(head_dim_choices), 1, TEXT_WORD},
    [KEY_GROUP] = {"group", NULL, 0, 1, TEXT_WORD},
    [KEY_LAYOUT] = {"layout", CHOICES(layout_choices), 0, TEXT_WORD},
    [KEY_MASK] = {"mask", CHOICES(mask_choices), 0, TEXT_WORD},
    [KEY_WINDOW] = {"window", CHOICES(flag_choices), 1, TEXT_WORD},
    [KEY_LOGITS] = {"logits", CHOICES(logits_choices), 0, TEXT_WORD},
    [KEY_LSE] = {"lse", CHOICES(flag_choices), 1, TEXT_WORD},
    [KEY_KV] = {"kv", CHOICES(kv_choices), 0, TEXT_WORD},
    [KEY_ROPE] = {"rope", CHOICES(flag_choices), 1, TEXT_WORD},
    [KEY_Q_TOKENS] = {"q_tokens", CHOICES(q_tokens_choices), 1, TEXT_WORD},
    [KEY_MASK_DATA] = {"mask_data", CHOICES(mask_data_choices), 0, TEXT_WORD},
    [KEY_PARAMS] = {"params", NULL, 0, 0, TEXT_PARAMS},
    [KEY_LOGITS_EXPR] = {"logits_expr", NULL, 0, 0, TEXT_SNIPPET},
    [KEY_MASK_EXPR] = {"mask_expr", NULL, 0, 0, TEXT_SNIPPET},
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

/* Unquote a snippet value ("...", with \" and \\) into out[KILN_MAX_SNIPPET]. */
static kiln_status parse_snippet(const char *show, const key_def *def, span val, char *out,
                                 kiln__err *e)
{
    if (val.n < 2 || val.p[0] != '"')
        return kiln__fail(e, KILN_STATUS_PARSE,
                          "spec: token '%s': %s must be a quoted C expression, e.g. "
                          "%s=\"kv_idx <= qo_idx\"",
                          show, def->name, def->name);
    size_t n = 0;
    for (size_t i = 1; i < val.n; i++) {
        char c = val.p[i];
        if (c == '"') {
            if (i + 1 != val.n)
                return kiln__fail(e, KILN_STATUS_PARSE,
                                  "spec: token '%s': text after the closing quote of %s", show,
                                  def->name);
            out[n] = 0;
            return KILN_STATUS_OK;
        }
        if (c == '\\') {
            c = i + 1 < val.n ? val.p[++i] : 0;
            if (c != '"' && c != '\\')
                return kiln__fail(e, KILN_STATUS_PARSE,
                                  "spec: token '%s': unknown escape in %s (only \\\" and \\\\)",
                                  show, def->name);
        }
        if (n + 1 >= KILN_MAX_SNIPPET)
            return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': %s is longer than %d bytes",
                              show, def->name, KILN_MAX_SNIPPET - 1);
        out[n++] = c;
    }
    return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': unterminated quote in %s", show,
                      def->name);
}

/* Parse params=NAME:TYPE,NAME:TYPE into x->params / x->num_params. */
static kiln_status parse_params(const char *show, span val, kiln_variant *x, kiln__err *e)
{
    static const char form[] = "params must be NAME:TYPE[,NAME:TYPE...] with TYPE one of f32, "
                               "i32, f32[], i32[]";
    if (!val.n)
        return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': empty value; %s", show, form);
    size_t at = 0;
    int n = 0;
    for (;;) {
        span item = {val.p + at, 0};
        while (at + item.n < val.n && val.p[at + item.n] != ',') item.n++;
        const char *colon = memchr(item.p, ':', item.n);
        if (!item.n || !colon)
            return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': %s entry %d: %s", show,
                              item.n ? "no ':' in" : "empty", n + 1, form);
        if (n == KILN_MAX_USER_PARAMS)
            return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': more than %d parameters",
                              show, KILN_MAX_USER_PARAMS);
        span name = {item.p, (size_t)(colon - item.p)}, type = {colon + 1, item.n - name.n - 1};
        if (name.n >= KILN_MAX_PARAM_NAME)
            return kiln__fail(e, KILN_STATUS_PARSE,
                              "spec: token '%s': parameter %d: name longer than %d bytes", show,
                              n + 1, KILN_MAX_PARAM_NAME - 1);
        int t = 0;
        while (t < 4 && !span_is(type, kiln__param_type_name((kiln_param_type)t))) t++;
        if (t == 4)
            return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': parameter %d: %s", show,
                              n + 1, form);
        memcpy(x->params[n].name, name.p, name.n);
        x->params[n].type = (kiln_param_type)t;
        n++;
        at += item.n;
        if (at == val.n) break;
        at++; /* the comma */
        if (at == val.n)
            return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': empty entry %d: %s", show,
                              n + 1, form);
    }
    x->num_params = n;
    kiln__err sub;
    if (kiln__params_check(x->params, n, &sub)) {
        const char *m = sub.msg;
        if (!strncmp(m, "variant: ", 9)) m += 9;
        return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': %s", show, m);
    }
    return KILN_STATUS_OK;
}

/* Parse one token into value[k] (or, for params and snippets, into *x) and remember it in
 * given[k] (for duplicates and conflicts). */
static kiln_status parse_token(span tok, span given[KEY_COUNT_], int value[KEY_COUNT_],
                               kiln_variant *x, kiln__err *e)
{
    char show[SHOW_MAX + 4], other[SHOW_MAX + 4], known[320];
    show_span(tok, show);
    const char *eq = memchr(tok.p, '=', tok.n);
    if (!eq) return kiln__fail(e, KILN_STATUS_PARSE, "spec: token '%s': expected key=value", show);
    span name = {tok.p, (size_t)(eq - tok.p)};
    span val = {eq + 1, tok.n - name.n - 1};
    const int quoted = val.n && val.p[0] == '"';
    if (!quoted && memchr(val.p, '=', val.n))
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
    kiln_status st = KILN_STATUS_OK;
    if (def->text == TEXT_PARAMS) st = parse_params(show, val, x, e);
    if (def->text == TEXT_SNIPPET)
        st = parse_snippet(show, def, val, k == KEY_LOGITS_EXPR ? x->logits_expr : x->mask_expr, e);
    if (def->text != TEXT_WORD) {
        if (!st) given[k] = tok;
        return st;
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

/* A snippet field must be NUL-terminated and printable (it is written into the spec). The
 * grammar is checked by kiln__variant_canonicalize (libclang), not here: this stays cheap. */
static kiln_status check_snippet_text(const char *field, const char *text, kiln__err *e)
{
    const char *end = memchr(text, 0, KILN_MAX_SNIPPET);
    if (!end)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "variant: %s is not NUL-terminated within %d bytes", field,
                          KILN_MAX_SNIPPET);
    for (const char *p = text; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (c != '\t' && (c < 0x20 || c > 0x7e))
            return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                              "variant: %s: byte 0x%02x at offset %zu is not printable ASCII",
                              field, c, (size_t)(p - text));
    }
    return KILN_STATUS_OK;
}

/* Append text to out[cap] at *at, escaping '"' and '\\' when `escape`; *at counts every byte
 * even past cap. */
static void append(char *out, size_t cap, size_t *at, const char *text, int escape)
{
    for (const char *p = text; *p; p++) {
        if (escape && (*p == '"' || *p == '\\')) {
            if (*at + 1 < cap) out[*at] = '\\';
            ++*at;
        }
        if (*at + 1 < cap) out[*at] = *p;
        ++*at;
    }
    if (cap) out[*at < cap ? *at : cap - 1] = 0;
}

/* ---- internal API -------------------------------------------------------------------------- */

const char *kiln__op_name(kiln_op op) { return word_of(CHOICES(op_choices), (int)op); }
const char *kiln__dtype_name(kiln_dtype t) { return word_of(CHOICES(kv_dtype_choices), (int)t); }
const char *kiln__kv_name(kiln_kv_storage k) { return word_of(CHOICES(kv_choices), (int)k); }
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
        (st = check_field("lse", v->lse, KEY_LSE, e)) ||
        (st = check_field("mask_data", (int)v->mask_data, KEY_MASK_DATA, e)) ||
        (st = check_field("kv", (int)v->kv, KEY_KV, e)) ||
        (st = check_field("rope", v->rope, KEY_ROPE, e)) ||
        (st = check_field("q_tokens", v->q_tokens, KEY_Q_TOKENS, e)) ||
        (st = kiln__params_check(v->params, v->num_params, e)) ||
        (st = check_snippet_text("logits_expr", v->logits_expr, e)) ||
        (st = check_snippet_text("mask_expr", v->mask_expr, e)))
        return st;
    const int fp8 = v->kv_dtype == KILN_DTYPE_E4M3 || v->kv_dtype == KILN_DTYPE_E5M2;
    if (v->q_dtype != v->kv_dtype && !fp8)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "variant: q_dtype=%s kv_dtype=%s: q_dtype must equal kv_dtype (q and k "
                          "feed the same mma.sync instruction; only out_dtype may differ, and "
                          "kv_dtype may be e4m3 or e5m2)",
                          kiln__dtype_name(v->q_dtype), kiln__dtype_name(v->kv_dtype));
    if (v->op == KILN_OP_MERGE) {
        if ((v->kv_dtype != v->q_dtype || v->out_dtype != v->q_dtype || v->group != 1 ||
             v->layout || v->mask || v->window || v->logits || v->lse || v->mask_data ||
             v->num_params || v->logits_expr[0] || v->mask_expr[0] || v->kv || v->rope ||
             v->q_tokens))
            return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                              "variant: op=merge takes only dtype and head_dim; every other key "
                              "must keep its default (group=1 layout=nhd mask=none window=0 "
                              "logits=none lse=0, no kv, rope, q_tokens, mask data or snippets)");
        return KILN_STATUS_OK;
    }
    if (v->kv == KILN_KV_CONTIGUOUS && (fp8 || v->rope))
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "variant: %s with kv=contiguous: fp8 KV and rope are built for batches "
                          "(kv=ragged or kv=paged; a single request is a batch of one)",
                          fp8 ? "an fp8 kv_dtype" : "rope=1");
    if (v->q_tokens && (v->op != KILN_OP_PREFILL || v->kv == KILN_KV_CONTIGUOUS))
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "variant: q_tokens=%d: only prefill batches (op=prefill with kv=ragged "
                          "or kv=paged) bound their query tokens per request; a decode has one",
                          v->q_tokens);
    if (v->q_tokens && 64 % v->group)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "variant: q_tokens=%d with group=%d: the packed rows need a group that "
                          "divides 64 (1, 2, 4, 8, 16, 32 or 64), so that whole query tokens "
                          "fill a tile",
                          v->q_tokens, v->group);
    if (v->q_tokens && v->mask_data)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "variant: q_tokens=%d with mask_data: the packed rows do not read mask "
                          "data yet (leave q_tokens at 0)",
                          v->q_tokens);
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
    kiln_variant x; /* params and snippets as parsed */
    memset(&x, 0, sizeof x);
    const char *p = spec;
    for (;;) {
        while (is_blank(*p)) p++;
        if (!*p) break;
        /* a token ends at a blank, except inside a value that starts with '"' (which ends at
         * the next '"' not escaped by '\\') */
        span tok = {p, 0};
        int quoted = 0, seen_eq = 0;
        while (p[tok.n] && (quoted || !is_blank(p[tok.n]))) {
            char c = p[tok.n];
            if (quoted && c == '\\' && p[tok.n + 1]) {
                tok.n += 2;
                continue;
            }
            if (quoted && c == '"') quoted = 0;
            else if (!seen_eq && c == '=') {
                seen_eq = 1;
                if (p[tok.n + 1] == '"') {
                    quoted = 1;
                    tok.n++;
                }
            }
            tok.n++;
        }
        p += tok.n;
        if (quoted) {
            char show[SHOW_MAX + 4];
            show_span(tok, show);
            return kiln__fail(e, KILN_STATUS_PARSE,
                              "spec: token '%s': unterminated quote (a quoted value ends at the "
                              "next '\"' not escaped by '\\')",
                              show);
        }
        kiln_status st = parse_token(tok, given, value, &x, e);
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
    if (given[KEY_MASK_DATA].p) v.mask_data = (kiln_mask_data)value[KEY_MASK_DATA];
    if (given[KEY_KV].p) v.kv = (kiln_kv_storage)value[KEY_KV];
    if (given[KEY_ROPE].p) v.rope = value[KEY_ROPE];
    if (given[KEY_Q_TOKENS].p) v.q_tokens = value[KEY_Q_TOKENS];
    v.num_params = x.num_params;
    memcpy(v.params, x.params, sizeof v.params);
    memcpy(v.logits_expr, x.logits_expr, sizeof v.logits_expr);
    memcpy(v.mask_expr, x.mask_expr, sizeof v.mask_expr);

    kiln_status st = kiln__variant_check(&v, e);
    if (st) return st;
    if ((v.logits_expr[0] || v.mask_expr[0]) && (st = kiln__variant_canonicalize(&v, e))) {
        kiln__err_prefix(e, "spec");
        return st;
    }
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
    int n =
        snprintf(buf, cap,
                 "op=%s %s head_dim=%d group=%d layout=%s mask=%s window=%d logits=%s lse=%d",
                 kiln__op_name(v->op), dtypes, v->head_dim, v->group, kiln__layout_name(v->layout),
                 kiln__mask_name(v->mask), v->window, kiln__logits_name(v->logits), v->lse);
    if (n < 0) {
        if (cap) buf[0] = 0;
        kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "spec: formatting failed");
        return 0;
    }
    /* the optional keys, each only when present */
    size_t at = (size_t)n;
    if (v->kv) {
        append(buf, cap, &at, " kv=", 0);
        append(buf, cap, &at, kiln__kv_name(v->kv), 0);
    }
    if (v->rope) append(buf, cap, &at, " rope=1", 0);
    if (v->q_tokens) {
        char qt[24];
        snprintf(qt, sizeof qt, " q_tokens=%d", v->q_tokens);
        append(buf, cap, &at, qt, 0);
    }
    if (v->mask_data) {
        append(buf, cap, &at, " mask_data=", 0);
        append(buf, cap, &at, word_of(CHOICES(mask_data_choices), (int)v->mask_data), 0);
    }
    for (int i = 0; i < v->num_params; i++) {
        append(buf, cap, &at, i ? "," : " params=", 0);
        append(buf, cap, &at, v->params[i].name, 0);
        append(buf, cap, &at, ":", 0);
        append(buf, cap, &at, kiln__param_type_name(v->params[i].type), 0);
    }
    if (v->logits_expr[0]) {
        append(buf, cap, &at, " logits_expr=\"", 0);
        append(buf, cap, &at, v->logits_expr, 1);
        append(buf, cap, &at, "\"", 0);
    }
    if (v->mask_expr[0]) {
        append(buf, cap, &at, " mask_expr=\"", 0);
        append(buf, cap, &at, v->mask_expr, 1);
        append(buf, cap, &at, "\"", 0);
    }
    return at;
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
