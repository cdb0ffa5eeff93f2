/*
 * snippet.c — the driver of the snippet validator (jit/snippet/; its layers in snippet_int.h):
 * validation and canonicalisation of user snippets (logits_expr, mask_expr). The grammar
 * enforced is the "Custom snippets" section of docs/variants.md; keep the two in step.
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
 *      of the whitelisted spellings with a representable value (snippet_lit.c);
 *   4. clang's first error, if any (type errors, ambiguous calls, malformed expressions), with
 *      clang's warnings about undefined operations on constants (division by zero, shift
 *      counts, signed overflow) turned into errors, so that NVRTC never meets them;
 *   5. a walk of the AST under the return statement (snippet_ast.c) that accepts only the
 *      allow-list: literals, known names, + - ! ~, arithmetic / comparison / logical / bitwise
 *      operators, ?:, parens, arithmetic casts, calls to allowed functions, NAME[integer] on
 *      array parameters, and the implicit conversions clang inserts (except float → integer,
 *      which needs a cast); and no operation on constants whose result is undefined.
 * Parameter names are checked apart (kiln__params_check, snippet_names.c): identifiers that are
 * not keywords, reserved, builtin names or macros NVRTC defines.
 * The canonical text is the snippet's non-comment tokens joined by single spaces.
 *
 * libclang is loaded on first use (libclang.c). One index serves the process; parses are
 * serialised by a mutex (CXIndex is not meant for concurrent parses, and a parse takes ~1 ms).
 */
#include "snippet.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snippet_int.h"

/* The in-memory file's name (it never touches the disk). */
#define WRAPPER_NAME "/kiln/snippet.cpp"

typedef kiln__snippet_run chk;
typedef kiln__snippet_tok tok;

/* ---- what a snippet's tokens may be ------------------------------------------------------- */

/* Keywords a snippet may contain (literals, arithmetic type names for casts, static_cast). */
static const char *const allowed_keywords[] = {"true",     "false",  "bool",       "int",
                                               "unsigned", "signed", "short",      "long",
                                               "float",    "double", "static_cast"};

/* Punctuation a snippet may contain; the AST walk then decides unary against binary uses. */
static const char *const allowed_punct[] = {"(", ")", "[",  "]",  "+",  "-",  "*",  "/",  "%",
                                            "<", ">", "<=", ">=", "==", "!=", "&&", "||", "!",
                                            "~", "&", "|",  "^",  "<<", ">>", "?",  ":",  ","};

#define COUNT(a)            KILN__COUNT(a)
#define REFUSE(w, off, ...) kiln__snippet_refuse((w), (off), __VA_ARGS__)

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
                if (!kiln__snippet_in_list(allowed_keywords, COUNT(allowed_keywords), t->s))
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
                        kiln__snippet_list_names(w, known, sizeof known);
                        return REFUSE(w, t->off, "unknown name '%s'; known: %s", t->s, known);
                    case KILN__NAME_LOGITS_IN_MASK:
                        kiln__snippet_list_names(w, known, sizeof known);
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
                if (!kiln__snippet_in_list(allowed_punct, COUNT(allowed_punct), t->s))
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
                          kiln__snippet_kind_name(w->kind), need + 1, cap);
    size_t at = 0;
    for (int i = 0; i < w->ntok; i++) {
        if (i) canon[at++] = ' ';
        memcpy(canon + at, w->toks[i].s, w->toks[i].len);
        at += w->toks[i].len;
    }
    canon[at] = 0;
    return KILN_STATUS_OK;
}

/* ---- gates 2 to 5 over one parse ---------------------------------------------------------- */

/* libclang's arguments: C++17 with no headers, and the warnings about undefined operations on
 * constants as errors (gate 4). */
static const char *const parse_args[] = {"-x",
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

static pthread_mutex_t parse_lock = PTHREAD_MUTEX_INITIALIZER;

/* Gate 2 (libclang parses the wrapper), then gates 3, 4 and 5 on that parse, then the canonical
 * text into canon[cap]. */
static kiln_status parse_and_check(chk *w, char *canon, size_t cap)
{
    const char *kind = kiln__snippet_kind_name(w->kind);
    if (!(w->c = kiln__clang_get(w->e))) return KILN_STATUS_UNSUPPORTED;
    char wrapper[4096];
    size_t n = kiln__snippet_wrapper(w, wrapper, sizeof wrapper);
    if (n >= sizeof wrapper)
        return kiln__fail(w->e, KILN_STATUS_PARSE,
                          "snippet '%s': wrapper too long (internal limit)", kind);
    struct CXUnsavedFile file = {WRAPPER_NAME, wrapper, (unsigned long)n};
    const kiln__clang *c = w->c;
    kiln_status st;
    pthread_mutex_lock(&parse_lock);
    enum CXErrorCode rc =
        c->clang_parseTranslationUnit2(c->index, WRAPPER_NAME, parse_args, COUNT(parse_args), &file,
                                       1, CXTranslationUnit_None, &w->tu);
    if (rc != CXError_Success || !w->tu)
        st = kiln__fail(w->e, KILN_STATUS_PARSE,
                        "snippet '%s': libclang could not parse it (error %d)", kind, (int)rc);
    else if (!(st = load_tokens(w)) && !(st = check_tokens(w)) && !(st = check_diagnostics(w)) &&
             !(st = kiln__snippet_check_ast(w)))
        st = write_canon(w, canon, cap);
    if (w->tu) c->clang_disposeTranslationUnit(w->tu);
    pthread_mutex_unlock(&parse_lock);
    return st;
}

/* ---- internal API -------------------------------------------------------------------------- */

kiln_status kiln__snippet_check_n(kiln__snippet_kind kind, const char *text, size_t len,
                                  const kiln_param_decl *params, int num_params, char *canon,
                                  size_t cap, kiln__err *e)
{
    if (canon && cap) canon[0] = 0;
    if (kind != KILN__SNIPPET_LOGITS && kind != KILN__SNIPPET_MASK)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "snippet: unknown kind %d", (int)kind);
    if (!text)
        return kiln__fail(e, KILN_STATUS_PARSE, "snippet '%s': NULL text",
                          kiln__snippet_kind_name(kind));
    if (len >= KILN_MAX_SNIPPET)
        return kiln__snippet_refuse_at(e, kind, text, len, KILN_MAX_SNIPPET - 1,
                                       "%s%zu bytes, over the %d-byte limit",
                                       len == KILN_MAX_SNIPPET ? "at least " : "", len,
                                       KILN_MAX_SNIPPET - 1);
    kiln_status st = kiln__params_check(params, num_params, e);
    if (st) return st;

    chk *w = calloc(1, sizeof *w);
    if (!w) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "snippet: out of memory");
    *w = (chk){
        .kind = kind, .text = text, .len = len, .params = params, .num_params = num_params, .e = e};
    if (!(st = check_bytes(w))) st = parse_and_check(w, canon, cap);
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
