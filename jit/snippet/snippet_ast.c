/*
 * snippet_ast.c — gate 5 of the snippet validator (driver snippet.c, layers in snippet_int.h):
 * a walk of the AST under the wrapper's return statement that accepts only the allow-list of
 * docs/variants.md — literals, known names, + - ! ~, arithmetic / comparison / logical / bitwise operators, ?:,
 * parentheses, casts between arithmetic types, calls to the allowed functions, NAME[integer] on
 * array parameters, and the implicit conversions clang inserts (except floating point → integer
 * outside an explicit cast). Every node's type must be arithmetic. Anything else is refused,
 * named, with its column.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "snippet_int.h"

/* Deepest AST nesting the walk follows (clang's own bracket limit is 256). */
#define WALK_DEPTH_MAX 400
/* Most children of one accepted node (?: has three). */
#define KIDS_MAX 4

#define REFUSE(w, off, ...) kiln__snippet_refuse((w), (off), __VA_ARGS__)

typedef kiln__snippet_run chk;
typedef kiln__snippet_tok tok;

#define COUNT(a) KILN__COUNT(a)

typedef struct kids {
    CXCursor c[KIDS_MAX];
    int n;
} kids;

static enum CXChildVisitResult collect(CXCursor cur, CXCursor parent, CXClientData data)
{
    (void)parent;
    kids *k = data;
    if (k->n < KIDS_MAX) k->c[k->n] = cur;
    k->n++;
    return CXChildVisit_Continue;
}

static kids children(const chk *w, CXCursor cur)
{
    kids k = {.n = 0};
    w->c->clang_visitChildren(cur, collect, &k);
    return k;
}

static size_t start_of(const chk *w, CXCursor cur)
{
    return kiln__snippet_offset(w, w->c->clang_getRangeStart(w->c->clang_getCursorExtent(cur)));
}

static size_t end_of(const chk *w, CXCursor cur)
{
    return kiln__snippet_offset(w, w->c->clang_getRangeEnd(w->c->clang_getCursorExtent(cur)));
}

static int is_arith(enum CXTypeKind k)
{
    switch (k) {
        case CXType_Bool:
        case CXType_Char_U:
        case CXType_UChar:
        case CXType_UShort:
        case CXType_UInt:
        case CXType_ULong:
        case CXType_ULongLong:
        case CXType_Char_S:
        case CXType_SChar:
        case CXType_Short:
        case CXType_Int:
        case CXType_Long:
        case CXType_LongLong:
        case CXType_Float:
        case CXType_Double:
            return 1;
        default:
            return 0;
    }
}

static int is_float(enum CXTypeKind k) { return k == CXType_Float || k == CXType_Double; }
static int is_integer(enum CXTypeKind k) { return is_arith(k) && !is_float(k); }

static enum CXTypeKind type_of(const chk *w, CXCursor cur)
{
    return w->c->clang_getCanonicalType(w->c->clang_getCursorType(cur)).kind;
}

static void type_name(const chk *w, CXCursor cur, char *out, size_t cap)
{
    CXString s = w->c->clang_getTypeSpelling(w->c->clang_getCursorType(cur));
    const char *p = w->c->clang_getCString(s);
    snprintf(out, cap, "%s", p ? p : "?");
    w->c->clang_disposeString(s);
}

/* The snippet text of a node, cut to 40 bytes, into out[48]. */
static void node_text(const chk *w, CXCursor cur, char out[48])
{
    size_t a = start_of(w, cur), b = end_of(w, cur);
    size_t n = b > a ? b - a : 0;
    if (n > 40) n = 40;
    memcpy(out, w->text + a, n);
    if (n < b - a && b > a) memcpy(out + n, "...", 3), n += 3;
    out[n] = 0;
}

/* An UnexposedExpr that only wraps one child over the same text: an implicit conversion
 * (ImplicitCastExpr) or another transparent node clang inserts. */
static int is_wrapper(const chk *w, CXCursor cur, kids *k)
{
    if (w->c->clang_getCursorKind(cur) != CXCursor_UnexposedExpr) return 0;
    *k = children(w, cur);
    return k->n == 1 && start_of(w, k->c[0]) == start_of(w, cur) &&
           end_of(w, k->c[0]) == end_of(w, cur);
}

/* Strip implicit wrappers. */
static CXCursor unwrap(const chk *w, CXCursor cur)
{
    kids k;
    while (is_wrapper(w, cur, &k)) cur = k.c[0];
    return cur;
}

/* The token at offset off (or the first after it); NULL past the end. */
static const tok *token_at(const chk *w, size_t off)
{
    for (int i = 0; i < w->ntok; i++)
        if (w->toks[i].off >= off) return &w->toks[i];
    return NULL;
}

/* The last token that starts before offset off. */
static const tok *token_before(const chk *w, size_t off)
{
    const tok *t = NULL;
    for (int i = 0; i < w->ntok && w->toks[i].off < off; i++) t = &w->toks[i];
    return t;
}

static const char *kind_words(enum CXCursorKind k)
{
    switch (k) {
        case CXCursor_StringLiteral:
            return "a string literal";
        case CXCursor_CharacterLiteral:
            return "a character literal";
        case CXCursor_ImaginaryLiteral:
            return "an imaginary literal";
        case CXCursor_MemberRefExpr:
            return "member access";
        case CXCursor_LambdaExpr:
            return "a lambda";
        case CXCursor_StmtExpr:
            return "a statement expression";
        case CXCursor_CXXNewExpr:
            return "new";
        case CXCursor_CXXDeleteExpr:
            return "delete";
        case CXCursor_CXXThrowExpr:
            return "throw";
        case CXCursor_CXXThisExpr:
            return "this";
        case CXCursor_CXXNullPtrLiteralExpr:
            return "nullptr";
        case CXCursor_UnaryExpr:
            return "sizeof/alignof";
        case CXCursor_CXXTypeidExpr:
            return "typeid";
        case CXCursor_CompoundAssignOperator:
            return "a compound assignment";
        case CXCursor_InitListExpr:
            return "an initializer list";
        case CXCursor_CompoundLiteralExpr:
            return "a compound literal";
        case CXCursor_CXXReinterpretCastExpr:
            return "reinterpret_cast";
        case CXCursor_CXXConstCastExpr:
            return "const_cast";
        case CXCursor_CXXDynamicCastExpr:
            return "dynamic_cast";
        case CXCursor_UnexposedExpr:
            return "an expression form outside the snippet grammar";
        default:
            return NULL;
    }
}

static kiln_status walk(chk *w, CXCursor cur, int depth, int in_cast);

static kiln_status refuse_node(chk *w, CXCursor cur)
{
    char what[48];
    node_text(w, cur, what);
    enum CXCursorKind k = w->c->clang_getCursorKind(cur);
    const char *words = kind_words(k);
    if (words) return REFUSE(w, start_of(w, cur), "'%s' is not allowed: %s", what, words);
    CXString s = w->c->clang_getCursorKindSpelling(k);
    const char *p = w->c->clang_getCString(s);
    char name[64];
    snprintf(name, sizeof name, "%s", p ? p : "?");
    w->c->clang_disposeString(s);
    return REFUSE(w, start_of(w, cur), "'%s' is not allowed: %s", what, name);
}

static kiln_status check_unary_op(chk *w, CXCursor cur, const kids *k)
{
    size_t at = start_of(w, cur);
    if (k->n != 1) return refuse_node(w, cur);
    const tok *op = start_of(w, k->c[0]) == at ? token_before(w, end_of(w, cur)) : token_at(w, at);
    const char *s = op ? op->s : "?";
    if (!strcmp(s, "+") || !strcmp(s, "-") || !strcmp(s, "!") || !strcmp(s, "~"))
        return KILN_STATUS_OK;
    size_t where = op ? op->off : at;
    if (!strcmp(s, "&")) return REFUSE(w, where, "address-of '&' is not allowed");
    if (!strcmp(s, "*")) return REFUSE(w, where, "dereference '*' is not allowed");
    if (!strcmp(s, "++")) return REFUSE(w, where, "increment '++' is not allowed");
    if (!strcmp(s, "--")) return REFUSE(w, where, "decrement '--' is not allowed");
    return REFUSE(w, where, "unary operator '%s' is not allowed", s);
}

/* What clang's constant folder makes of an expression. */
typedef struct folded {
    enum { FOLD_NONE, FOLD_INT, FOLD_FLOAT } kind; /* NONE: not a constant (it reads a name) */
    long long i;                                   /* FOLD_INT (unsigned values wrap) */
    double d;                                      /* FOLD_FLOAT */
} folded;

static folded fold(const chk *w, CXCursor cur)
{
    const kiln__clang *c = w->c;
    folded f = {.kind = FOLD_NONE};
    CXEvalResult r = c->clang_Cursor_Evaluate(cur);
    if (!r) return f;
    switch (c->clang_EvalResult_getKind(r)) {
        case CXEval_Int:
            f.kind = FOLD_INT;
            f.i = c->clang_EvalResult_getAsLongLong(r);
            break;
        case CXEval_Float:
            f.kind = FOLD_FLOAT;
            f.d = c->clang_EvalResult_getAsDouble(r);
            break;
        default:
            break;
    }
    c->clang_EvalResult_dispose(r);
    return f;
}

static int is_zero(folded f)
{
    return (f.kind == FOLD_INT && f.i == 0) || (f.kind == FOLD_FLOAT && f.d == 0);
}

/* Operations on constants whose result is undefined, which clang's warnings (turned into
 * errors by the parse, snippet.c) do not all catch: a division or remainder by a constant
 * zero of any type (logits / 0, x / (1 - 1): undefined in C++, and NVRTC only warns), the
 * smallest signed value divided by -1, an operation on finite floating constants whose result
 * is not finite (1e308 * 10.0), and an operation whose operands are constants and whose result
 * clang cannot fold. A snippet is refused for them even where a ?: or && would skip
 * them: no snippet needs one. */
static kiln_status check_constant_op(chk *w, CXCursor cur, const kids *k, const char *op,
                                     size_t where)
{
    static const char *const arith[] = {"+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^"};
    const int div = !strcmp(op, "/") || !strcmp(op, "%");
    const folded rhs = fold(w, k->c[1]);
    if (div && is_zero(rhs))
        return REFUSE(w, where,
                      "%s by zero is undefined (the right operand of '%s' is a "
                      "constant zero)",
                      op[0] == '/' ? "division" : "remainder", op);
    if (rhs.kind == FOLD_NONE || !kiln__snippet_in_list(arith, COUNT(arith), op))
        return KILN_STATUS_OK;
    const folded lhs = fold(w, k->c[0]);
    if (lhs.kind == FOLD_NONE) return KILN_STATUS_OK;
    char what[48];
    node_text(w, cur, what);
    const enum CXTypeKind t = type_of(w, cur);
    const long long smallest = t == CXType_Int                            ? INT_MIN
                               : t == CXType_Long || t == CXType_LongLong ? LLONG_MIN
                                                                          : 0;
    if (div && rhs.kind == FOLD_INT && rhs.i == -1 && smallest && lhs.kind == FOLD_INT &&
        lhs.i == smallest)
        return REFUSE(w, where,
                      "'%s' is undefined: the smallest value of its type divided by -1 "
                      "overflows",
                      what);
    const folded res = fold(w, cur);
    const int finite_in =
        (lhs.kind != FOLD_FLOAT || isfinite(lhs.d)) && (rhs.kind != FOLD_FLOAT || isfinite(rhs.d));
    if (res.kind == FOLD_NONE || (res.kind == FOLD_FLOAT && finite_in && !isfinite(res.d)))
        return REFUSE(w, where,
                      "'%s' is undefined: an operation on constants that overflows or "
                      "is out of range",
                      what);
    return KILN_STATUS_OK;
}

/* The integer types a floating constant may convert to, with the range [lo, hi) that must hold
 * its value truncated toward zero. */
static const struct int_range {
    enum CXTypeKind type;
    double lo, hi;
} int_ranges[] = {
    {CXType_Char_S, -0x1p7, 0x1p7},  {CXType_SChar, -0x1p7, 0x1p7},
    {CXType_Char_U, 0, 0x1p8},       {CXType_UChar, 0, 0x1p8},
    {CXType_Short, -0x1p15, 0x1p15}, {CXType_UShort, 0, 0x1p16},
    {CXType_Int, -0x1p31, 0x1p31},   {CXType_UInt, 0, 0x1p32},
    {CXType_Long, -0x1p63, 0x1p63},  {CXType_LongLong, -0x1p63, 0x1p63},
    {CXType_ULong, 0, 0x1p64},       {CXType_ULongLong, 0, 0x1p64},
};

/* 1 when the finite value v converts to type `to` with a defined result. */
static int converts(double v, enum CXTypeKind to)
{
    if (to == CXType_Float) return !isinf((float)v);
    for (int i = 0; i < COUNT(int_ranges); i++)
        if (int_ranges[i].type == to)
            return trunc(v) >= int_ranges[i].lo && trunc(v) < int_ranges[i].hi;
    return 1; /* double */
}

/* A conversion of a floating constant that is undefined (C++ [conv.fpint], [conv.double]): to
 * an integer type that cannot hold its truncated value ((int)1e20f, (unsigned)-1.0f), or to
 * float when it is finite and beyond float's range ((float)1e39, tanhf(1e39)). */
static kiln_status check_conversion(chk *w, CXCursor cur, CXCursor operand)
{
    const enum CXTypeKind to = type_of(w, cur);
    if (!is_float(type_of(w, operand)) || to == CXType_Bool || !is_arith(to)) return KILN_STATUS_OK;
    const folded f = fold(w, operand);
    if (f.kind != FOLD_FLOAT || isnan(f.d) || isinf(f.d) || converts(f.d, to))
        return KILN_STATUS_OK;
    char what[48], tn[64];
    node_text(w, cur, what);
    type_name(w, cur, tn, sizeof tn);
    return REFUSE(w, start_of(w, cur),
                  "converting '%s' to '%s' is undefined: the constant %g "
                  "does not fit",
                  what, tn, f.d);
}

static kiln_status walk_binary(chk *w, CXCursor cur, const kids *k, int depth)
{
    static const char *const ok[] = {"+",  "-",  "*",  "/",  "%", "<", ">", "<=", ">=",
                                     "==", "!=", "&&", "||", "&", "|", "^", "<<", ">>"};
    if (k->n != 2) return refuse_node(w, cur);
    const tok *op = token_at(w, end_of(w, k->c[0]));
    const char *s = op ? op->s : "?";
    size_t where = op ? op->off : start_of(w, cur);
    if (!strcmp(s, "=")) return REFUSE(w, where, "assignment '=' is not allowed (compare with ==)");
    if (!strcmp(s, ","))
        return REFUSE(w, where,
                      "the comma operator is not allowed (',' only separates a call's "
                      "arguments)");
    if (!kiln__snippet_in_list(ok, COUNT(ok), s))
        return REFUSE(w, where, "binary operator '%s' is not allowed", s);
    kiln_status st = walk(w, k->c[0], depth + 1, 0);
    if (!st) st = walk(w, k->c[1], depth + 1, 0);
    return st ? st : check_constant_op(w, cur, k, s, where);
}

static kiln_status walk_call(chk *w, CXCursor cur, const kids *k, int depth)
{
    const kiln__clang *c = w->c;
    if (k->n < 1 || k->n > KIDS_MAX) return refuse_node(w, cur);
    CXCursor callee = unwrap(w, k->c[0]);
    CXCursor fn = c->clang_getCursorReferenced(callee);
    char name[64] = "?";
    if (!c->clang_Cursor_isNull(fn)) {
        CXString s = c->clang_getCursorSpelling(fn);
        const char *p = c->clang_getCString(s);
        snprintf(name, sizeof name, "%s", p ? p : "?");
        c->clang_disposeString(s);
    }
    unsigned decl_off = 0;
    if (!c->clang_Cursor_isNull(fn))
        c->clang_getSpellingLocation(c->clang_getCursorLocation(fn), NULL, NULL, NULL, &decl_off);
    if (c->clang_getCursorKind(callee) != CXCursor_DeclRefExpr ||
        c->clang_getCursorKind(fn) != CXCursor_FunctionDecl || !kiln__snippet_is_function(name) ||
        decl_off >= w->base) {
        char known[400];
        kiln__snippet_list_functions(known, sizeof known);
        return REFUSE(w, start_of(w, cur), "call to '%s' is not allowed; allowed: %s", name, known);
    }
    for (int i = 1; i < k->n; i++) {
        kiln_status st = walk(w, k->c[i], depth + 1, 0);
        if (st) return st;
    }
    /* abs of the smallest int has no value */
    if (!strcmp(name, "abs") && k->n == 2) {
        const folded a = fold(w, k->c[1]);
        if (a.kind == FOLD_INT && a.i == INT_MIN)
            return REFUSE(w, start_of(w, k->c[1]),
                          "abs(%d) is undefined: its value does not fit "
                          "in int",
                          INT_MIN);
    }
    return KILN_STATUS_OK;
}

static kiln_status walk_subscript(chk *w, CXCursor cur, const kids *k, int depth)
{
    const kiln__clang *c = w->c;
    if (k->n != 2) return refuse_node(w, cur);
    CXCursor base = unwrap(w, k->c[0]);
    CXCursor ref = c->clang_getCursorReferenced(base);
    kiln__snippet_name nc = KILN__NAME_UNKNOWN;
    if (c->clang_getCursorKind(base) == CXCursor_DeclRefExpr &&
        c->clang_getCursorKind(ref) == CXCursor_ParmDecl) {
        CXString s = c->clang_getCursorSpelling(ref);
        const char *p = c->clang_getCString(s);
        nc = kiln__snippet_classify(w, p ? p : "");
        c->clang_disposeString(s);
    }
    if (nc != KILN__NAME_ARRAY || start_of(w, k->c[0]) != start_of(w, cur))
        return REFUSE(w, start_of(w, cur), "only an array parameter can be indexed, as NAME[i]");
    kiln_status st = walk(w, k->c[1], depth + 1, 0);
    if (st) return st;
    if (!is_integer(type_of(w, k->c[1]))) {
        char tn[64];
        type_name(w, k->c[1], tn, sizeof tn);
        return REFUSE(w, start_of(w, k->c[1]), "an index must be an integer, not '%s'", tn);
    }
    return KILN_STATUS_OK;
}

static kiln_status walk_declref(chk *w, CXCursor cur)
{
    const kiln__clang *c = w->c;
    CXCursor ref = c->clang_getCursorReferenced(cur);
    CXString s = c->clang_getCursorSpelling(cur);
    const char *p = c->clang_getCString(s);
    char name[64];
    snprintf(name, sizeof name, "%s", p ? p : "?");
    c->clang_disposeString(s);
    kiln__snippet_name nc = kiln__snippet_classify(w, name);
    enum CXCursorKind rk = c->clang_getCursorKind(ref);
    size_t at = start_of(w, cur);
    if (nc == KILN__NAME_SCALAR && rk == CXCursor_ParmDecl) return KILN_STATUS_OK;
    if (nc == KILN__NAME_ARRAY)
        return REFUSE(w, at, "array parameter '%s' must be indexed: %s[i]", name, name);
    if (nc == KILN__NAME_FUNCTION) return REFUSE(w, at, "function '%s' must be called", name);
    return REFUSE(w, at, "name '%s' is not allowed", name);
}

/* The operands of cur, by kind; the caller checks cur's own type afterwards, so that the
 * innermost offending part is the one named. */
static kiln_status walk_kids(chk *w, CXCursor cur, enum CXCursorKind kind, kids *k, int depth,
                             int in_cast)
{
    switch (kind) {
        case CXCursor_IntegerLiteral:
        case CXCursor_FloatingLiteral:
        case CXCursor_CXXBoolLiteralExpr:
            return k->n ? refuse_node(w, cur) : KILN_STATUS_OK;
        case CXCursor_DeclRefExpr:
            return walk_declref(w, cur);
        case CXCursor_ParenExpr:
            return k->n == 1 ? walk(w, k->c[0], depth + 1, 0) : refuse_node(w, cur);
        case CXCursor_UnexposedExpr: {
            if (!is_wrapper(w, cur, k)) return refuse_node(w, cur);
            enum CXTypeKind from = type_of(w, k->c[0]), to = type_of(w, cur);
            if (!in_cast && is_float(from) && is_integer(to) && to != CXType_Bool) {
                char what[48];
                node_text(w, cur, what);
                return REFUSE(
                    w, start_of(w, cur),
                    "'%s' would be converted implicitly from floating point to an integer: "
                    "write the cast, e.g. (int)(...)",
                    what);
            }
            kiln_status st = walk(w, k->c[0], depth + 1, in_cast);
            return st ? st : check_conversion(w, cur, k->c[0]);
        }
        case CXCursor_UnaryOperator: {
            kiln_status st = check_unary_op(w, cur, k);
            return st ? st : walk(w, k->c[0], depth + 1, 0);
        }
        case CXCursor_BinaryOperator:
            return walk_binary(w, cur, k, depth);
        case CXCursor_ConditionalOperator:
            if (k->n != 3) return refuse_node(w, cur);
            for (int i = 0; i < 3; i++) {
                kiln_status st = walk(w, k->c[i], depth + 1, 0);
                if (st) return st;
            }
            return KILN_STATUS_OK;
        case CXCursor_CallExpr:
            return walk_call(w, cur, k, depth);
        case CXCursor_ArraySubscriptExpr:
            return walk_subscript(w, cur, k, depth);
        case CXCursor_CStyleCastExpr:
        case CXCursor_CXXFunctionalCastExpr:
        case CXCursor_CXXStaticCastExpr: { /* one operand, besides type references */
            int n = 0;
            CXCursor operand = cur;
            for (int i = 0; i < k->n; i++) {
                if (w->c->clang_getCursorKind(k->c[i]) == CXCursor_TypeRef) continue;
                operand = k->c[i];
                n++;
            }
            if (n != 1) return refuse_node(w, cur);
            kiln_status st = walk(w, operand, depth + 1, 1);
            return st ? st : check_conversion(w, cur, operand);
        }
        default:
            return refuse_node(w, cur);
    }
}

/* Check the expression at cur. in_cast: cur is the operand of an explicit cast (so an implicit
 * float → integer conversion here is the cast's own). */
static kiln_status walk(chk *w, CXCursor cur, int depth, int in_cast)
{
    size_t at = start_of(w, cur);
    if (depth > WALK_DEPTH_MAX) return REFUSE(w, at, "expression nested too deeply");
    enum CXCursorKind kind = w->c->clang_getCursorKind(cur);
    enum CXTypeKind tk = type_of(w, cur);
    char tn[64], what[48];
    const int cast = kind == CXCursor_CStyleCastExpr || kind == CXCursor_CXXFunctionalCastExpr ||
                     kind == CXCursor_CXXStaticCastExpr;
    if (cast && !is_arith(tk)) { /* the target type first: the operand may be fine */
        type_name(w, cur, tn, sizeof tn);
        return REFUSE(w, at, "cast to '%s' is not allowed: casts are between arithmetic types", tn);
    }
    kids k = children(w, cur);
    if (k.n > KIDS_MAX) return refuse_node(w, cur);
    kiln_status st = walk_kids(w, cur, kind, &k, depth, in_cast);
    if (st) return st;
    if (!is_arith(tk)) {
        node_text(w, cur, what);
        type_name(w, cur, tn, sizeof tn);
        return REFUSE(w, at,
                      "'%s' has type '%s': only arithmetic values (bool, integers, float, "
                      "double) are allowed",
                      what, tn);
    }
    return KILN_STATUS_OK;
}

/* The last child of cur with the given kind (and, for declarations, spelling). */
typedef struct find {
    const kiln__clang *c;
    enum CXCursorKind kind;
    const char *name; /* NULL: any */
    CXCursor hit;
    int found;
} find;

static enum CXChildVisitResult find_visit(CXCursor cur, CXCursor parent, CXClientData data)
{
    (void)parent;
    find *f = data;
    if (f->c->clang_getCursorKind(cur) != f->kind) return CXChildVisit_Continue;
    if (f->name) {
        CXString s = f->c->clang_getCursorSpelling(cur);
        const char *p = f->c->clang_getCString(s);
        int same = p && !strcmp(p, f->name);
        f->c->clang_disposeString(s);
        if (!same) return CXChildVisit_Continue;
    }
    f->hit = cur;
    f->found = 1;
    return CXChildVisit_Continue;
}

static int find_child(const chk *w, CXCursor cur, enum CXCursorKind kind, const char *name,
                      CXCursor *out)
{
    find f = {.c = w->c, .kind = kind, .name = name, .found = 0};
    w->c->clang_visitChildren(cur, find_visit, &f);
    if (f.found) *out = f.hit;
    return f.found;
}

/* Find `return (...)` in the wrapper function and walk its expression. */
kiln_status kiln__snippet_check_ast(chk *w)
{
    CXCursor fn, body, ret;
    if (!find_child(w, w->c->clang_getTranslationUnitCursor(w->tu), CXCursor_FunctionDecl,
                    KILN__SNIPPET_FN, &fn) ||
        !find_child(w, fn, CXCursor_CompoundStmt, NULL, &body) ||
        !find_child(w, body, CXCursor_ReturnStmt, NULL, &ret))
        return REFUSE(w, 0, "libclang found no expression (internal error)");
    /* ReturnStmt → (an lvalue-to-rvalue conversion) → the wrapper's ParenExpr → the snippet */
    kids k = children(w, ret);
    CXCursor paren = k.n == 1 ? unwrap(w, k.c[0]) : ret;
    if (k.n != 1 || w->c->clang_getCursorKind(paren) != CXCursor_ParenExpr)
        return REFUSE(w, 0, "libclang found no single expression (internal error)");
    kids in = children(w, paren);
    if (in.n != 1) return REFUSE(w, 0, "libclang found no single expression (internal error)");
    return walk(w, in.c[0], 0, 0);
}
