/*
 * snippet.c — validation and canonicalisation of user snippets (logits_expr, mask_expr) and of
 * the user parameters they read. The grammar enforced here is the "Custom snippets" section of
 * docs/variants.md; keep the two in step.
 *
 * A snippet passes five gates in order, and the first refusal wins, with a column and a caret:
 *   1. bytes (before libclang is touched): printable ASCII on one line, shorter than
 *      KILN_MAX_SNIPPET, not empty, none of ; { } # \ anywhere, no digraphs or trigraphs, and
 *      ( ) [ ] balanced outside comments, so that nothing can close the wrapper around it;
 *   2. libclang parses a wrapper: an in-memory C++17 file that declares the allowed functions
 *      and one function whose parameters are exactly the known names, returning the snippet;
 *   3. the snippet's tokens (clang_tokenize): allowed keywords and punctuation only, no string or
 *      character literals, every identifier known and used the right way (functions called,
 *      array parameters indexed, scalars not), brackets balanced, and every number literal one
 *      of the whitelisted spellings with a representable value (jit/snippet_lit.c);
 *   4. clang's first error, if any (type errors, ambiguous calls, malformed expressions), with
 *      clang's warnings about undefined operations on constants (division by zero, shift
 *      counts, signed overflow) turned into errors, so that NVRTC never meets them;
 *   5. a walk of the AST under the return statement (jit/snippet_ast.c) that accepts only the
 *      allow-list: literals, known names, + - ! ~, arithmetic / comparison / logical / bitwise
 *      operators, ?:, parens, arithmetic casts, calls to allowed functions, NAME[integer] on
 *      array parameters, and the implicit conversions clang inserts (except float → integer,
 *      which needs a cast); and no operation on constants whose result is undefined.
 * Parameter names are checked apart (kiln__params_check): identifiers that are not keywords,
 * reserved, builtin names or macros NVRTC defines (nvrtc_macros, nvrtc_prefixes).
 * The canonical text is the snippet's non-comment tokens joined by single spaces.
 *
 * libclang is loaded on first use (jit/libclang.c). One index serves the process; parses are
 * serialised by a mutex (CXIndex is not meant for concurrent parses, and a parse takes ~1 ms).
 */
#include "snippet.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "snippet_int.h"

/* Bytes of the snippet shown around the caret in a message; longer snippets show a window. */
#define SHOW_MAX 100
/* The in-memory file's name (it never touches the disk). */
#define WRAPPER_NAME "/kiln/snippet.cpp"

typedef kiln__snippet_run chk;
typedef kiln__snippet_tok tok;

/* ---- the names a snippet may use ----------------------------------------------------------- */

typedef struct name_def {
    const char *name, *type;
} name_def;

/* Built-in names in wrapper order; builtins[0] (logits) exists only in the logits snippet. */
static const name_def builtins[] = {{"logits", "float"}, {"batch", "int"},   {"qo_idx", "int"},
                                    {"kv_idx", "int"},   {"qo_head", "int"}, {"kv_head", "int"},
                                    {"qo_len", "int"},   {"kv_len", "int"}};

typedef struct fn_def {
    const char *name, *decls; /* the prototypes the wrapper declares */
} fn_def;

static const fn_def functions[] = {
    {"expf", "float expf(float);"},
    {"exp2f", "float exp2f(float);"},
    {"expm1f", "float expm1f(float);"},
    {"logf", "float logf(float);"},
    {"log2f", "float log2f(float);"},
    {"log1pf", "float log1pf(float);"},
    {"powf", "float powf(float, float);"},
    {"sqrtf", "float sqrtf(float);"},
    {"rsqrtf", "float rsqrtf(float);"},
    {"tanhf", "float tanhf(float);"},
    {"sinf", "float sinf(float);"},
    {"cosf", "float cosf(float);"},
    {"fabsf", "float fabsf(float);"},
    {"fminf", "float fminf(float, float);"},
    {"fmaxf", "float fmaxf(float, float);"},
    {"floorf", "float floorf(float);"},
    {"ceilf", "float ceilf(float);"},
    {"truncf", "float truncf(float);"},
    {"roundf", "float roundf(float);"},
    {"min", "int min(int, int); float min(float, float);"},
    {"max", "int max(int, int); float max(float, float);"},
    {"abs", "int abs(int);"},
};

/* Keywords a snippet may contain (literals, arithmetic type names for casts, static_cast). */
static const char *const allowed_keywords[] = {"true",     "false",  "bool",       "int",
                                               "unsigned", "signed", "short",      "long",
                                               "float",    "double", "static_cast"};

/* Punctuation a snippet may contain; the AST walk then decides unary against binary uses. */
static const char *const allowed_punct[] = {"(", ")", "[",  "]",  "+",  "-",  "*",  "/",  "%",
                                            "<", ">", "<=", ">=", "==", "!=", "&&", "||", "!",
                                            "~", "&", "|",  "^",  "<<", ">>", "?",  ":",  ","};

/* Identifiers a parameter may not take besides builtins and functions: C++17 keywords and
 * alternative tokens, C keywords, CUDA's built-in variables, the generated hook's own names. Names starting with "kiln" (any
 * case) and reserved identifiers (__x, _X) are refused by rule. */
static const char *const reserved_names[] = {
    "alignas",
    "alignof",
    "and",
    "and_eq",
    "asm",
    "auto",
    "bitand",
    "bitor",
    "bool",
    "break",
    "case",
    "catch",
    "char",
    "char8_t",
    "char16_t",
    "char32_t",
    "class",
    "compl",
    "concept",
    "const",
    "consteval",
    "constexpr",
    "constinit",
    "const_cast",
    "continue",
    "co_await",
    "co_return",
    "co_yield",
    "decltype",
    "default",
    "delete",
    "do",
    "double",
    "dynamic_cast",
    "else",
    "enum",
    "explicit",
    "export",
    "extern",
    "false",
    "float",
    "for",
    "friend",
    "goto",
    "if",
    "inline",
    "int",
    "long",
    "mutable",
    "namespace",
    "new",
    "noexcept",
    "not",
    "not_eq",
    "nullptr",
    "operator",
    "or",
    "or_eq",
    "private",
    "protected",
    "public",
    "register",
    "reinterpret_cast",
    "requires",
    "restrict",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "static_assert",
    "static_cast",
    "struct",
    "switch",
    "template",
    "this",
    "thread_local",
    "throw",
    "true",
    "try",
    "typedef",
    "typeid",
    "typename",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "wchar_t",
    "while",
    "xor",
    "xor_eq",
    "threadIdx",
    "blockIdx",
    "blockDim",
    "gridDim",
    "warpSize",
    "p" /* the generated hook's launch-parameter block (jit/expand.c) */};

/* Names NVRTC defines as macros, which a parameter would collide with in the generated source
 * (`const float NULL = ...` does not compile): every identifier that CUDA 13's NVRTC built-in
 * headers #define (libnvrtc-builtins), whether or not -minimal leaves them in, that is not a
 * reserved identifier (those are refused by rule) and not in CUDA's own name spaces below. */
static const char *const nvrtc_macros[] = {"NULL",   "NOMINMAX", "STD",    "THROWBADALLOC",
                                           "alloca", "assert",   "va_arg", "va_copy",
                                           "va_end", "va_start"};

/* CUDA's name spaces (any case): the CUDA runtime (cuda*, CUDART_*), the driver (CU_*) and
 * NVIDIA's target macros (NV_IF_TARGET, NV_TARGET_MINIMUM_SM_INTEGER, ...). New macros of a
 * later toolkit land here. */
static const char *const nvrtc_prefixes[] = {"cuda", "cu_", "nv_"};

static const char *const param_type_names[] = {"f32", "i32", "f32[]", "i32[]"};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int in_list(const char *const *list, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(list[i], s)) return 1;
    return 0;
}

static int find_function(const char *s)
{
    for (int i = 0; i < COUNT(functions); i++)
        if (!strcmp(functions[i].name, s)) return i;
    return -1;
}

int kiln__snippet_is_function(const char *s) { return find_function(s) >= 0; }

static const char *kind_name(kiln__snippet_kind k)
{
    return k == KILN__SNIPPET_MASK ? "mask" : "logits";
}

/* ---- messages ------------------------------------------------------------------------------ */

/* Write "snippet 'KIND' 1:COL: MSG", the snippet (or a window of it) and a caret under byte
 * `off` into e; return KILN_STATUS_PARSE. Non-printable bytes show as '?'. */
static kiln_status refuse_at(kiln__err *e, kiln__snippet_kind kind, const char *text, size_t len,
                             size_t off, const char *fmt, ...) KILN__PRINTF(6, 7);
static kiln_status refuse_at(kiln__err *e, kiln__snippet_kind kind, const char *text, size_t len,
                             size_t off, const char *fmt, ...)
{
    if (!e) return KILN_STATUS_PARSE;
    char msg[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (off > len) off = len;
    size_t from = 0, to = len;
    if (len > SHOW_MAX) {
        from = off > SHOW_MAX / 2 ? off - SHOW_MAX / 2 : 0;
        if (from + SHOW_MAX > len) from = len - SHOW_MAX;
        to = from + SHOW_MAX;
    }
    char line[SHOW_MAX + 16], caret[SHOW_MAX + 16];
    size_t a = 0, b = 0;
    line[a++] = ' ', line[a++] = ' ';
    caret[b++] = ' ', caret[b++] = ' ';
    if (from) {
        memcpy(line + a, "...", 3), a += 3;
        memcpy(caret + b, "   ", 3), b += 3;
    }
    for (size_t i = from; i < to; i++) {
        unsigned char ch = (unsigned char)text[i];
        line[a++] = ch == '\t' || (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
        if (i < off) caret[b++] = ch == '\t' ? '\t' : ' ';
    }
    if (to < len) memcpy(line + a, "...", 3), a += 3;
    line[a] = 0;
    caret[b++] = '^';
    caret[b] = 0;
    char head[64];
    int h = snprintf(head, sizeof head, "snippet '%s' 1:%zu: ", kind_name(kind), off + 1);
    int room = (int)sizeof e->msg - 1 - h - (int)a - (int)b - 2;
    if (room < 0) room = 0;
    snprintf(e->msg, sizeof e->msg, "%s%.*s\n%s\n%s", head, room, msg, line, caret);
    return KILN_STATUS_PARSE;
}

kiln_status kiln__snippet_refuse(const chk *w, size_t off, const char *fmt, ...)
{
    char msg[sizeof w->e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return refuse_at(w->e, w->kind, w->text, w->len, off, "%s", msg);
}

#define REFUSE(w, off, ...) kiln__snippet_refuse((w), (off), __VA_ARGS__)

/* "batch, qo_idx, ..., scale (f32), slopes (f32[])" into out[cap]. */
static void list_names(const chk *w, char *out, size_t cap)
{
    size_t at = 0;
    out[0] = 0;
    for (int i = w->kind == KILN__SNIPPET_MASK ? 1 : 0; i < COUNT(builtins) && at < cap; i++) {
        int n = snprintf(out + at, cap - at, "%s%s", at ? ", " : "", builtins[i].name);
        if (n > 0) at += (size_t)n;
    }
    for (int i = 0; i < w->num_params && at < cap; i++) {
        int n = snprintf(out + at, cap - at, ", %s (%s)", w->params[i].name,
                         param_type_names[w->params[i].type]);
        if (n > 0) at += (size_t)n;
    }
}

void kiln__snippet_list_functions(char *out, size_t cap)
{
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < COUNT(functions) && at < cap; i++) {
        int n = snprintf(out + at, cap - at, "%s%s", i ? ", " : "", functions[i].name);
        if (n > 0) at += (size_t)n;
    }
}

/* ---- gate 1: bytes ------------------------------------------------------------------------- */

static kiln_status check_bytes(chk *w)
{
    const char *t = w->text;
    const size_t n = w->len;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c != '\t' && (c < 0x20 || c > 0x7e))
            return REFUSE(w, i,
                          "byte 0x%02x is not allowed: a snippet is printable ASCII on one line",
                          c);
        switch (c) {
            case ';':
                return REFUSE(w, i,
                              "';' is not allowed: a snippet is one expression, not statements");
            case '{':
            case '}':
                return REFUSE(w, i,
                              "'%c' is not allowed: no blocks, lambdas or braced initializers", c);
            case '#':
                return REFUSE(w, i, "'#' is not allowed: no preprocessor directives");
            case '\\':
                return REFUSE(w, i,
                              "'\\' is not allowed: no escapes, line splices or universal "
                              "character names");
            default:
                break;
        }
    }
    /* comments, digraphs, trigraphs, brackets */
    size_t open[KILN_MAX_SNIPPET];
    int depth = 0, any = 0;
    for (size_t i = 0; i < n; i++) {
        char c = t[i], d = i + 1 < n ? t[i + 1] : 0;
        if (c == '/' && d == '*') {
            size_t j = i + 2;
            while (j + 1 < n && !(t[j] == '*' && t[j + 1] == '/')) j++;
            if (j + 1 >= n) return REFUSE(w, i, "unterminated comment '/*'");
            i = j + 1;
            continue;
        }
        if (c == '/' && d == '/') break; /* a line comment runs to the end of the snippet */
        if (c != ' ' && c != '\t') any = 1;
        static const char *const digraphs[] = {"<%", "%>", "<:", ":>", "%:"};
        for (int k = 0; k < COUNT(digraphs); k++)
            if (c == digraphs[k][0] && d == digraphs[k][1])
                return REFUSE(w, i, "digraph '%s' is not allowed: write the plain token",
                              digraphs[k]);
        if (c == '?' && d == '?')
            return REFUSE(w, i,
                          "'?"
                          "?' is not allowed (a trigraph)");
        if (c == '(' || c == '[') {
            open[depth++] = i;
        } else if (c == ')' || c == ']') {
            char want = c == ')' ? '(' : '[';
            if (!depth)
                return REFUSE(w, i,
                              "'%c' closes nothing: a snippet cannot close the expression "
                              "around it",
                              c);
            if (t[open[depth - 1]] != want)
                return REFUSE(w, i, "'%c' does not match '%c' at 1:%zu", c, t[open[depth - 1]],
                              open[depth - 1] + 1);
            depth--;
        }
    }
    if (depth) return REFUSE(w, open[depth - 1], "'%c' is never closed", t[open[depth - 1]]);
    if (!any) return REFUSE(w, 0, "empty snippet (only blanks and comments)");
    return KILN_STATUS_OK;
}

/* ---- gate 2: the wrapper and the parse ------------------------------------------------------ */

static void put(char *buf, size_t cap, size_t *at, const char *s, size_t n)
{
    if (*at + n < cap) memcpy(buf + *at, s, n);
    *at += n;
}

static void puts_(char *buf, size_t cap, size_t *at, const char *s)
{
    put(buf, cap, at, s, strlen(s));
}

/* Write the wrapper into buf[cap]; return its length (>= cap: did not fit) and set w->base. */
static size_t build_wrapper(chk *w, char *buf, size_t cap)
{
    size_t at = 0;
    for (int i = 0; i < COUNT(functions); i++) {
        puts_(buf, cap, &at, functions[i].decls);
        puts_(buf, cap, &at, "\n");
    }
    /* auto: no conversion at the return, so the walk sees the snippet's own type */
    puts_(buf, cap, &at, "auto " KILN__SNIPPET_FN "(");
    int first = 1;
    for (int i = w->kind == KILN__SNIPPET_MASK ? 1 : 0; i < COUNT(builtins); i++) {
        if (!first) puts_(buf, cap, &at, ", ");
        first = 0;
        puts_(buf, cap, &at, builtins[i].type);
        puts_(buf, cap, &at, " ");
        puts_(buf, cap, &at, builtins[i].name);
    }
    static const char *const decl_types[] = {"float ", "int ", "const float *", "const int *"};
    for (int i = 0; i < w->num_params; i++) {
        puts_(buf, cap, &at, ", ");
        puts_(buf, cap, &at, decl_types[w->params[i].type]);
        puts_(buf, cap, &at, w->params[i].name);
    }
    puts_(buf, cap, &at, ") {\n    return (\n#line 1 \"snippet\"\n");
    w->base = (unsigned)at;
    put(buf, cap, &at, w->text, w->len);
    puts_(buf, cap, &at, "\n    );\n}\n");
    if (at < cap) buf[at] = 0;
    return at;
}

size_t kiln__snippet_offset(const chk *w, CXSourceLocation loc)
{
    unsigned off = 0;
    w->c->clang_getSpellingLocation(loc, NULL, NULL, NULL, &off);
    if (off < w->base) return 0;
    return off - w->base > w->len ? w->len : off - w->base;
}

/* ---- gate 3: tokens ------------------------------------------------------------------------ */

static kiln_status load_tokens(chk *w)
{
    const kiln__clang *c = w->c;
    CXFile f = c->clang_getFile(w->tu, WRAPPER_NAME);
    if (!f) return REFUSE(w, 0, "libclang lost the snippet's file (internal error)");
    CXSourceRange r =
        c->clang_getRange(c->clang_getLocationForOffset(w->tu, f, w->base),
                          c->clang_getLocationForOffset(w->tu, f, w->base + (unsigned)w->len));
    CXToken *ts = NULL;
    unsigned n = 0;
    c->clang_tokenize(w->tu, r, &ts, &n);
    kiln_status st = KILN_STATUS_OK;
    for (unsigned i = 0; i < n && !st; i++) {
        CXTokenKind k = c->clang_getTokenKind(ts[i]);
        if (k == CXToken_Comment) continue;
        size_t off = kiln__snippet_offset(w, c->clang_getTokenLocation(w->tu, ts[i]));
        CXString s = c->clang_getTokenSpelling(w->tu, ts[i]);
        const char *p = c->clang_getCString(s);
        size_t len = p ? strlen(p) : 0;
        if (w->ntok >= COUNT(w->toks) || w->pool_used + len + 1 > sizeof w->pool)
            st = REFUSE(w, off, "too many tokens (internal limit)");
        else if (off + len <= w->len) {
            tok *t = &w->toks[w->ntok++];
            t->off = off, t->len = len, t->kind = k;
            memcpy(w->pool + w->pool_used, p, len);
            w->pool[w->pool_used + len] = 0;
            t->s = w->pool + w->pool_used;
            w->pool_used += len + 1;
        }
        c->clang_disposeString(s);
    }
    if (ts) c->clang_disposeTokens(w->tu, ts, n);
    if (!st && !w->ntok) st = REFUSE(w, 0, "empty snippet (only blanks and comments)");
    return st;
}

kiln__snippet_name kiln__snippet_classify(const chk *w, const char *s)
{
    for (int i = 0; i < COUNT(builtins); i++)
        if (!strcmp(builtins[i].name, s))
            return i == 0 && w->kind == KILN__SNIPPET_MASK ? KILN__NAME_LOGITS_IN_MASK
                                                           : KILN__NAME_SCALAR;
    for (int i = 0; i < w->num_params; i++)
        if (!strcmp(w->params[i].name, s))
            return w->params[i].type >= KILN_PARAM_F32_ARRAY ? KILN__NAME_ARRAY : KILN__NAME_SCALAR;
    return find_function(s) >= 0 ? KILN__NAME_FUNCTION : KILN__NAME_UNKNOWN;
}

static const char *keyword_hint(const char *s)
{
    static const struct {
        const char *words, *hint;
    } hints[] = {
        {" for while do if else switch case default goto return break continue try catch ",
         "a snippet is one expression, not statements"},
        {" sizeof alignof decltype typeid noexcept ", "no type queries"},
        {" new delete ", "no allocation"},
        {" throw ", "no exceptions"},
        {" asm __asm __asm__ ", "no inline assembly"},
        {" reinterpret_cast const_cast dynamic_cast ",
         "only arithmetic casts: (T)x, T(x) or static_cast<T>(x)"},
        {" and or not and_eq or_eq xor xor_eq bitand bitor compl not_eq ",
         "write the operator's symbol (&&, ||, !, ...)"},
        {" char wchar_t char8_t char16_t char32_t void auto ",
         "the types are bool, int, unsigned, signed, short, long, float and double"},
    };
    char key[64];
    snprintf(key, sizeof key, " %s ", s);
    for (int i = 0; i < COUNT(hints); i++)
        if (strstr(hints[i].words, key)) return hints[i].hint;
    return "a snippet uses only true, false, arithmetic type names and static_cast";
}

static const char *punct_hint(const char *s)
{
    if (!strcmp(s, "=")) return "assignment is not allowed (compare with ==)";
    if (!strcmp(s, "++")) return "increment is not allowed";
    if (!strcmp(s, "--")) return "decrement is not allowed";
    if (!strcmp(s, ".") || !strcmp(s, "->")) return "member access is not allowed";
    if (!strcmp(s, ".*") || !strcmp(s, "->*")) return "pointer-to-member access is not allowed";
    if (!strcmp(s, "::")) return "the scope operator is not allowed";
    size_t n = strlen(s);
    if (n >= 2 && s[n - 1] == '=' && strcmp(s, "==") && strcmp(s, "!=") && strcmp(s, "<=") &&
        strcmp(s, ">="))
        return "compound assignment is not allowed";
    return "not an operator a snippet may use";
}

static kiln_status check_tokens(chk *w)
{
    int parens = 0, brackets = 0;
    kiln_status st;
    for (int i = 0; i < w->ntok; i++) {
        const tok *t = &w->toks[i];
        const char *next = i + 1 < w->ntok ? w->toks[i + 1].s : "";
        char known[640];
        switch (t->kind) {
            case CXToken_Keyword:
                if (!in_list(allowed_keywords, COUNT(allowed_keywords), t->s))
                    return REFUSE(w, t->off, "keyword '%s' is not allowed: %s", t->s,
                                  keyword_hint(t->s));
                break;
            case CXToken_Identifier:
                switch (kiln__snippet_classify(w, t->s)) {
                    case KILN__NAME_UNKNOWN:
                        if (!strcmp(next, "(")) {
                            kiln__snippet_list_functions(known, sizeof known);
                            return REFUSE(w, t->off, "unknown function '%s'; allowed: %s", t->s,
                                          known);
                        }
                        list_names(w, known, sizeof known);
                        return REFUSE(w, t->off, "unknown name '%s'; known: %s", t->s, known);
                    case KILN__NAME_LOGITS_IN_MASK:
                        list_names(w, known, sizeof known);
                        return REFUSE(
                            w, t->off,
                            "unknown name 'logits' (it exists only in the logits snippet); "
                            "known: %s",
                            known);
                    case KILN__NAME_FUNCTION:
                        if (strcmp(next, "("))
                            return REFUSE(w, t->off, "function '%s' must be called: %s(...)", t->s,
                                          t->s);
                        break;
                    case KILN__NAME_ARRAY:
                        if (strcmp(next, "["))
                            return REFUSE(w, t->off, "array parameter '%s' must be indexed: %s[i]",
                                          t->s, t->s);
                        break;
                    case KILN__NAME_SCALAR:
                        if (!strcmp(next, "["))
                            return REFUSE(w, t->off,
                                          "'%s' is a scalar, not an array: it cannot be indexed",
                                          t->s);
                        if (!strcmp(next, "("))
                            return REFUSE(w, t->off, "'%s' is not a function", t->s);
                        break;
                }
                break;
            case CXToken_Literal:
                if (strchr(t->s, '"')) return REFUSE(w, t->off, "string literals are not allowed");
                if (!(t->s[0] >= '0' && t->s[0] <= '9') && t->s[0] != '.')
                    return REFUSE(w, t->off, "character literals are not allowed");
                if ((st = kiln__snippet_check_literal(w, t))) return st;
                break;
            case CXToken_Punctuation:
                if (!in_list(allowed_punct, COUNT(allowed_punct), t->s))
                    return REFUSE(w, t->off, "'%s': %s", t->s, punct_hint(t->s));
                if (!strcmp(t->s, "(")) parens++;
                if (!strcmp(t->s, "[")) brackets++;
                if ((!strcmp(t->s, ")") && --parens < 0) || (!strcmp(t->s, "]") && --brackets < 0))
                    return REFUSE(w, t->off,
                                  "'%s' closes nothing: a snippet cannot close the "
                                  "expression around it",
                                  t->s);
                break;
            default:
                return REFUSE(w, t->off, "'%s' is not allowed", t->s);
        }
    }
    if (parens || brackets) return REFUSE(w, w->len, "unbalanced brackets");
    return KILN_STATUS_OK;
}

/* ---- gate 4: clang's diagnostics ----------------------------------------------------------- */

static kiln_status check_diagnostics(chk *w)
{
    const kiln__clang *c = w->c;
    unsigned n = c->clang_getNumDiagnostics(w->tu);
    for (unsigned i = 0; i < n; i++) {
        CXDiagnostic d = c->clang_getDiagnostic(w->tu, i);
        if (!d) continue;
        kiln_status st = KILN_STATUS_OK;
        if (c->clang_getDiagnosticSeverity(d) >= CXDiagnostic_Error) {
            size_t off = kiln__snippet_offset(w, c->clang_getDiagnosticLocation(d));
            CXString s = c->clang_getDiagnosticSpelling(d);
            const char *p = c->clang_getCString(s);
            st = REFUSE(w, off, "%s", p && *p ? p : "error");
            c->clang_disposeString(s);
        }
        c->clang_disposeDiagnostic(d);
        if (st) return st;
    }
    return KILN_STATUS_OK;
}

/* ---- canonical text ------------------------------------------------------------------------ */

static kiln_status write_canon(chk *w, char *canon, size_t cap)
{
    size_t need = 0;
    for (int i = 0; i < w->ntok; i++) need += w->toks[i].len + (i ? 1 : 0);
    if (need >= KILN_MAX_SNIPPET)
        return REFUSE(w, 0,
                      "the canonical form (tokens joined by single spaces) is %zu bytes, "
                      "over the %d-byte limit",
                      need, KILN_MAX_SNIPPET - 1);
    if (!canon || !cap) return KILN_STATUS_OK;
    if (need >= cap)
        return kiln__fail(w->e, KILN_STATUS_INVALID_ARGUMENT,
                          "snippet '%s': the canonical form needs %zu bytes, the buffer has %zu",
                          kind_name(w->kind), need + 1, cap);
    size_t at = 0;
    for (int i = 0; i < w->ntok; i++) {
        if (i) canon[at++] = ' ';
        memcpy(canon + at, w->toks[i].s, w->toks[i].len);
        at += w->toks[i].len;
    }
    canon[at] = 0;
    return KILN_STATUS_OK;
}

/* ---- internal API -------------------------------------------------------------------------- */

static pthread_mutex_t parse_lock = PTHREAD_MUTEX_INITIALIZER;

const char *kiln__param_type_name(kiln_param_type t)
{
    return (int)t >= 0 && (int)t < COUNT(param_type_names) ? param_type_names[t] : "?";
}

kiln_status kiln__snippet_check_n(kiln__snippet_kind kind, const char *text, size_t len,
                                  const kiln_param_decl *params, int num_params, char *canon,
                                  size_t cap, kiln__err *e)
{
    if (canon && cap) canon[0] = 0;
    if (kind != KILN__SNIPPET_LOGITS && kind != KILN__SNIPPET_MASK)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "snippet: unknown kind %d", (int)kind);
    if (!text) return kiln__fail(e, KILN_STATUS_PARSE, "snippet '%s': NULL text", kind_name(kind));
    if (len >= KILN_MAX_SNIPPET)
        return refuse_at(e, kind, text, len, KILN_MAX_SNIPPET - 1,
                         "%s%zu bytes, over the %d-byte limit",
                         len == KILN_MAX_SNIPPET ? "at least " : "", len, KILN_MAX_SNIPPET - 1);
    kiln_status st = kiln__params_check(params, num_params, e);
    if (st) return st;

    chk *w = calloc(1, sizeof *w);
    if (!w) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "snippet: out of memory");
    *w = (chk){
        .kind = kind, .text = text, .len = len, .params = params, .num_params = num_params, .e = e};
    char wrapper[4096];
    if ((st = check_bytes(w))) goto out;
    if (!(w->c = kiln__clang_get(e))) {
        st = KILN_STATUS_UNSUPPORTED;
        goto out;
    }
    size_t n = build_wrapper(w, wrapper, sizeof wrapper);
    if (n >= sizeof wrapper) {
        st = kiln__fail(e, KILN_STATUS_PARSE, "snippet '%s': wrapper too long (internal limit)",
                        kind_name(kind));
        goto out;
    }
    static const char *const args[] = {"-x",
                                       "c++",
                                       "-std=c++17",
                                       "-fsyntax-only",
                                       "-nostdinc",
                                       "-nostdinc++",
                                       "-nobuiltininc",
                                       "-fno-spell-checking",
                                       "-ferror-limit=4",
                                       "-Wno-everything",
                                       "-Werror=division-by-zero",
                                       "-Werror=shift-count-overflow",
                                       "-Werror=shift-count-negative",
                                       "-Werror=shift-negative-value",
                                       "-Werror=shift-overflow",
                                       "-Werror=integer-overflow",
                                       "-Werror=literal-range"};
    struct CXUnsavedFile file = {WRAPPER_NAME, wrapper, (unsigned long)n};
    const kiln__clang *c = w->c;
    pthread_mutex_lock(&parse_lock);
    enum CXErrorCode rc = c->clang_parseTranslationUnit2(c->index, WRAPPER_NAME, args, COUNT(args),
                                                         &file, 1, CXTranslationUnit_None, &w->tu);
    if (rc != CXError_Success || !w->tu)
        st =
            kiln__fail(e, KILN_STATUS_PARSE, "snippet '%s': libclang could not parse it (error %d)",
                       kind_name(kind), (int)rc);
    else if (!(st = load_tokens(w)) && !(st = check_tokens(w)) && !(st = check_diagnostics(w)) &&
             !(st = kiln__snippet_check_ast(w)))
        st = write_canon(w, canon, cap);
    if (w->tu) c->clang_disposeTranslationUnit(w->tu);
    pthread_mutex_unlock(&parse_lock);
out:
    free(w);
    if (st && canon && cap) canon[0] = 0;
    return st;
}

kiln_status kiln__snippet_check(kiln__snippet_kind kind, const char *text,
                                const kiln_param_decl *params, int num_params, char *canon,
                                size_t cap, kiln__err *e)
{
    size_t len = 0;
    if (text)
        while (len < KILN_MAX_SNIPPET && text[len]) len++;
    return kiln__snippet_check_n(kind, text, len, params, num_params, canon, cap, e);
}

/* Copy name (at most KILN_MAX_PARAM_NAME bytes, maybe unterminated) for a message, '?' for
 * bytes that are not printable. */
static void show_name(const char *name, char out[KILN_MAX_PARAM_NAME + 4])
{
    size_t i = 0;
    for (; i < KILN_MAX_PARAM_NAME && name[i]; i++)
        out[i] = name[i] >= 0x20 && name[i] < 0x7f ? name[i] : '?';
    if (i == KILN_MAX_PARAM_NAME) memcpy(out + i, "...", 3), i += 3;
    out[i] = 0;
}

kiln_status kiln__params_check(const kiln_param_decl *params, int num_params, kiln__err *e)
{
    if (num_params < 0 || num_params > KILN_MAX_USER_PARAMS)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "variant: num_params=%d: must be in 0..%d",
                          num_params, KILN_MAX_USER_PARAMS);
    if (num_params && !params)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "variant: NULL params with num_params=%d", num_params);
    for (int i = 0; i < num_params; i++) {
        const char *name = params[i].name;
        char show[KILN_MAX_PARAM_NAME + 4];
        show_name(name, show);
        const char *why = NULL;
        if (!memchr(name, 0, KILN_MAX_PARAM_NAME))
            why = "the name is longer than 31 bytes (or not NUL-terminated)";
        else if (!name[0]) why = "empty name";
        else if (!((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= 'A' && name[0] <= 'Z') ||
                   name[0] == '_'))
            why = "not an identifier ([A-Za-z_][A-Za-z0-9_]*)";
        for (size_t j = 1; !why && name[j]; j++)
            if (!((name[j] >= 'a' && name[j] <= 'z') || (name[j] >= 'A' && name[j] <= 'Z') ||
                  (name[j] >= '0' && name[j] <= '9') || name[j] == '_'))
                why = "not an identifier ([A-Za-z_][A-Za-z0-9_]*)";
        if (!why && ((name[0] == '_' && name[1] >= 'A' && name[1] <= 'Z') || strstr(name, "__")))
            why = "a reserved identifier (names with '__' anywhere and _X belong to the "
                  "implementation)";
        if (!why && in_list(nvrtc_macros, COUNT(nvrtc_macros), name))
            why = "a macro that NVRTC's built-in headers define";
        for (int j = 0; !why && j < COUNT(nvrtc_prefixes); j++)
            if (!strncasecmp(name, nvrtc_prefixes[j], strlen(nvrtc_prefixes[j])))
                why = "names starting with cuda, cu_ or nv_ (any case) belong to CUDA, whose "
                      "headers define macros there (CUDART_VERSION, NV_IF_TARGET, ...)";
        if (!why && !strncasecmp(name, "kiln", 4)) why = "names starting with 'kiln' are reserved";
        for (int j = 0; !why && j < COUNT(builtins); j++)
            if (!strcmp(name, builtins[j].name)) why = "a built-in name";
        if (!why && find_function(name) >= 0) why = "an allowed function's name";
        if (!why && in_list(reserved_names, COUNT(reserved_names), name))
            why = "a C++ keyword or a CUDA built-in";
        for (int j = 0; !why && j < i; j++)
            if (!strncmp(name, params[j].name, KILN_MAX_PARAM_NAME)) why = "a duplicate name";
        if (why)
            return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "variant: params[%d] '%s': %s", i, show,
                              why);
        if ((int)params[i].type < 0 || (int)params[i].type >= COUNT(param_type_names))
            return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                              "variant: params[%d] '%s': type=%d must be one of 0 (f32), 1 (i32), "
                              "2 (f32[]), 3 (i32[])",
                              i, show, (int)params[i].type);
    }
    return KILN_STATUS_OK;
}

kiln_status kiln__variant_canonicalize(kiln_variant *v, kiln__err *e)
{
    if (!v) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "variant: NULL pointer");
    kiln_status st = kiln__params_check(v->params, v->num_params, e);
    if (st) return st;
    char *fields[2] = {v->logits_expr, v->mask_expr};
    for (int i = 0; i < 2; i++) {
        if (!memchr(fields[i], 0, KILN_MAX_SNIPPET))
            return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                              "variant: %s is not NUL-terminated within %d bytes",
                              i ? "mask_expr" : "logits_expr", KILN_MAX_SNIPPET);
        if (!fields[i][0]) continue;
        char canon[KILN_MAX_SNIPPET];
        st = kiln__snippet_check(i ? KILN__SNIPPET_MASK : KILN__SNIPPET_LOGITS, fields[i],
                                 v->params, v->num_params, canon, sizeof canon, e);
        if (st) return st;
        memset(fields[i], 0, KILN_MAX_SNIPPET);
        memcpy(fields[i], canon, strlen(canon));
    }
    return KILN_STATUS_OK;
}
