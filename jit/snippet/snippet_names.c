/*
 * snippet_names.c — the lowest layer of the snippet validator (jit/snippet/, see snippet_int.h):
 * the names a snippet may use (the builtins, the allowed functions, the variant's parameters),
 * the wrapper function that declares exactly those names, the parameter names a variant may
 * declare (kiln__params_check), offsets into the snippet, and the refusal message with its
 * caret. It calls nothing else of the validator; the gates above it (snippet_lit.c,
 * snippet_ast.c, snippet.c) call it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "snippet_int.h"

/* Bytes of the snippet shown around the caret in a message; longer snippets show a window. */
#define SHOW_MAX 100

typedef kiln__snippet_run chk;

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

/* Identifiers a parameter may not take besides builtins and functions: C++17 keywords and
 * alternative tokens, C keywords, CUDA's built-in variables, the generated hook's own names.
 * Names starting with "kiln" (any case) and reserved identifiers (__x, _X) are refused by
 * rule. */
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

#define COUNT(a) KILN__COUNT(a)

int kiln__snippet_in_list(const char *const *list, int n, const char *s)
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

const char *kiln__snippet_kind_name(kiln__snippet_kind k)
{
    return k == KILN__SNIPPET_MASK ? "mask" : "logits";
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

/* ---- messages ------------------------------------------------------------------------------ */

kiln_status kiln__snippet_refuse_at(kiln__err *e, kiln__snippet_kind kind, const char *text,
                                    size_t len, size_t off, const char *fmt, ...)
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
    int h =
        snprintf(head, sizeof head, "snippet '%s' 1:%zu: ", kiln__snippet_kind_name(kind), off + 1);
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
    return kiln__snippet_refuse_at(w->e, w->kind, w->text, w->len, off, "%s", msg);
}

/* "batch, qo_idx, ..., scale (f32), slopes (f32[])" into out[cap]. */
void kiln__snippet_list_names(const chk *w, char *out, size_t cap)
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

/* ---- the wrapper and offsets in it -------------------------------------------------------- */

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
size_t kiln__snippet_wrapper(chk *w, char *buf, size_t cap)
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

/* ---- parameter declarations -------------------------------------------------------------- */

const char *kiln__param_type_name(kiln_param_type t)
{
    return (int)t >= 0 && (int)t < COUNT(param_type_names) ? param_type_names[t] : "?";
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
        if (!why && kiln__snippet_in_list(nvrtc_macros, COUNT(nvrtc_macros), name))
            why = "a macro that NVRTC's built-in headers define";
        for (int j = 0; !why && j < COUNT(nvrtc_prefixes); j++)
            if (!strncasecmp(name, nvrtc_prefixes[j], strlen(nvrtc_prefixes[j])))
                why = "names starting with cuda, cu_ or nv_ (any case) belong to CUDA, whose "
                      "headers define macros there (CUDART_VERSION, NV_IF_TARGET, ...)";
        if (!why && !strncasecmp(name, "kiln", 4)) why = "names starting with 'kiln' are reserved";
        for (int j = 0; !why && j < COUNT(builtins); j++)
            if (!strcmp(name, builtins[j].name)) why = "a built-in name";
        if (!why && find_function(name) >= 0) why = "an allowed function's name";
        if (!why && kiln__snippet_in_list(reserved_names, COUNT(reserved_names), name))
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
