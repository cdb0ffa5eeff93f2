/*
 * test_snippet.c — the snippet validator (jit/snippet.c): the cookbook forms accepted with their
 * canonical text, a table of refused forms with the status and message each must give, the
 * message layout, refused bytes, parameter declarations, spec round trips of the canonical
 * specs the fuzzer starts from, concurrency, a deterministic mutation fuzzer and the parse +
 * validate time. The rest of snippets inside specs, and keys, are test_snippet_spec.c. CPU only;
 * the tests that need libclang skip cleanly without it.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jit.h"
#include "kt.h"
#include "libclang.h"
#include "snippet.h"

#define L KILN__SNIPPET_LOGITS
#define M KILN__SNIPPET_MASK

/* The parameters every table row may read. */
static const kiln_param_decl test_params[] = {
    {"slopes", KILN_PARAM_F32_ARRAY}, {"scale", KILN_PARAM_F32},
    {"window", KILN_PARAM_I32},       {"prefix", KILN_PARAM_I32},
    {"seg_q", KILN_PARAM_I32_ARRAY},  {"seg_kv", KILN_PARAM_I32_ARRAY},
};

static kiln_status check(kiln__snippet_kind kind, const char *text, char *canon, kiln__err *e)
{
    return kiln__snippet_check(kind, text, test_params, KT_COUNT(test_params), canon,
                               KILN_MAX_SNIPPET, e);
}

/* ---- accepted forms ------------------------------------------------------------------------ */

static const struct {
    kiln__snippet_kind kind;
    const char *text, *canon;
} accepted[] = {
    /* the cookbook */
    {L, "30.0f * tanhf(logits / 30.0f)", "30.0f * tanhf ( logits / 30.0f )"},
    {L, "scale * tanhf(logits / scale)", "scale * tanhf ( logits / scale )"},
    {L, "logits + slopes[qo_head] * (kv_idx - qo_idx - kv_len + qo_len)",
     "logits + slopes [ qo_head ] * ( kv_idx - qo_idx - kv_len + qo_len )"},
    {M, "kv_idx >= qo_idx + kv_len - qo_len - 1024", "kv_idx >= qo_idx + kv_len - qo_len - 1024"},
    {M, "kv_idx < 4 || kv_idx >= qo_idx + kv_len - qo_len - window",
     "kv_idx < 4 || kv_idx >= qo_idx + kv_len - qo_len - window"},
    {M, "seg_kv[kv_idx] == seg_q[qo_idx]", "seg_kv [ kv_idx ] == seg_q [ qo_idx ]"},
    {M, "kv_idx < prefix || kv_idx <= qo_idx + kv_len - qo_len",
     "kv_idx < prefix || kv_idx <= qo_idx + kv_len - qo_len"},
    {L, "logits - logf(1.0f + expf(logits))", "logits - logf ( 1.0f + expf ( logits ) )"},
    /* ternaries, casts, literals */
    {L, "logits > 0.0f ? logits : 0.5f * logits", "logits > 0.0f ? logits : 0.5f * logits"},
    {L, "kv_idx > qo_idx ? -1e30f : logits", "kv_idx > qo_idx ? - 1e30f : logits"},
    {L, "logits * (float)kv_idx", "logits * ( float ) kv_idx"},
    {L, "int(logits) + (int)logits", "int ( logits ) + ( int ) logits"},
    {L, "static_cast<float>(kv_idx) / float(kv_len)",
     "static_cast < float > ( kv_idx ) / float ( kv_len )"},
    {L, "(unsigned)kv_idx % 2u == 0u ? logits : logits * 0.5",
     "( unsigned ) kv_idx % 2u == 0u ? logits : logits * 0.5"},
    {L, "logits", "logits"},
    {L, "1", "1"},
    {L, "0x1p3f + 1e-3f + .5f + 2.", "0x1p3f + 1e-3f + .5f + 2."},
    {L, "true ? logits : logits", "true ? logits : logits"},
    /* every allowed function */
    {L, "expf(logits) + exp2f(logits) + expm1f(logits) + logf(logits) + log2f(logits)",
     "expf ( logits ) + exp2f ( logits ) + expm1f ( logits ) + logf ( logits ) + log2f ( logits )"},
    {L, "log1pf(logits) + powf(logits, 2.0f) + sqrtf(logits) + rsqrtf(logits) + sinf(logits)",
     "log1pf ( logits ) + powf ( logits , 2.0f ) + sqrtf ( logits ) + rsqrtf ( logits ) + sinf ( "
     "logits )"},
    {L,
     "cosf(logits) + fabsf(logits) + fminf(logits, 1.0f) + fmaxf(logits, -1.0f) + floorf(logits)",
     "cosf ( logits ) + fabsf ( logits ) + fminf ( logits , 1.0f ) + fmaxf ( logits , - 1.0f ) + "
     "floorf ( logits )"},
    {L,
     "ceilf(logits) + truncf(logits) + roundf(logits) + min(logits, 1.0f) + max(kv_idx, 3) + "
     "abs(qo_idx)",
     "ceilf ( logits ) + truncf ( logits ) + roundf ( logits ) + min ( logits , 1.0f ) + max ( "
     "kv_idx , 3 ) + abs ( qo_idx )"},
    /* operators */
    {M, "(kv_idx << 2 >> 1 ^ 3 | 4 & ~5) % 7 != 0 && !(batch == 1)",
     "( kv_idx << 2 >> 1 ^ 3 | 4 & ~ 5 ) % 7 != 0 && ! ( batch == 1 )"},
    {M, "kv_head == qo_head / 4 && +kv_idx >= -qo_idx",
     "kv_head == qo_head / 4 && + kv_idx >= - qo_idx"},
    {M, "slopes[kv_head] > 0.0f", "slopes [ kv_head ] > 0.0f"},
    {M, "kv_idx", "kv_idx"},
    {M, "true", "true"},
    /* whitespace and comments never reach the canonical text */
    {M, "  kv_idx\t<=  qo_idx  ", "kv_idx <= qo_idx"},
    {M, "kv_idx /* ) ( */ <= qo_idx // ) trailing", "kv_idx <= qo_idx"},
    {L, "/* a \"quoted\" word */ logits", "logits"},
};

KT_TEST(snippet_accepts)
{
    if (!kt_need_clang()) return;
    for (int i = 0; i < KT_COUNT(accepted); i++) {
        char canon[KILN_MAX_SNIPPET], again[KILN_MAX_SNIPPET];
        kiln__err e = {{0}};
        kiln_status st = check(accepted[i].kind, accepted[i].text, canon, &e);
        if (st) {
            kt_fail(__FILE__, __LINE__, "row %d '%s' refused: %s", i, accepted[i].text, e.msg);
            continue;
        }
        KT_EQ_STR(canon, accepted[i].canon);
        /* the canonical text is a fixed point */
        KT_OK(check(accepted[i].kind, canon, again, &e), e.msg);
        KT_EQ_STR(again, canon);
    }
}

/* ---- refused forms ------------------------------------------------------------------------- */

typedef struct refused_row {
    kiln__snippet_kind kind;
    const char *text;
    kiln_status want;
    const char *fragment;
} refused_row;

#define P KILN_STATUS_PARSE
static const refused_row refused[] = {
    /* assignments, increments */
    {L, "logits = 1", P, "1:8: '=': assignment is not allowed"},
    {L, "kv_idx += 1", P, "'+=': compound assignment is not allowed"},
    {L, "kv_idx <<= 1", P, "'<<=': compound assignment"},
    {L, "x += 1", P, "unknown name 'x'"},
    {L, "++kv_idx", P, "'++': increment is not allowed"},
    {L, "kv_idx--", P, "1:7: '--': decrement is not allowed"},
    {M, "seg_q[kv_idx] = 1", P, "assignment is not allowed"},
    /* pointers and members */
    {L, "&kv_idx", P, "address-of '&' is not allowed"},
    {L, "*&kv_idx", P, "dereference '*' is not allowed"},
    {L, "logits > 0 ? &kv_idx : 0", P, "address-of '&'"},
    {L, "*p", P, "unknown name 'p'"},
    {L, "p->a", P, "unknown name 'p'"},
    {L, "logits->a", P, "'->': member access is not allowed"},
    {L, "a.b", P, "unknown name 'a'"},
    {L, "logits.x", P, "'.': member access is not allowed"},
    {L, "logits::x", P, "'::': the scope operator is not allowed"},
    {L, "::expf(1.0f)", P, "the scope operator"},
    /* blocks, lambdas, statements */
    {L, "({1;})", P, "'{' is not allowed"},
    {L, "[](){return 1;}()", P, "'{' is not allowed"},
    {L, "[]", P, "expected body of lambda expression"},
    {L, "1; }", P, "1:2: ';' is not allowed"},
    {L, ") ; {", P, "';' is not allowed"},
    {L, "for (kv_idx : slopes) 1", P, "keyword 'for' is not allowed"},
    {L, "while (1) 1", P, "keyword 'while'"},
    {L, "if (1) 1", P, "keyword 'if'"},
    {L, "goto x", P, "keyword 'goto'"},
    {L, "return 1", P, "keyword 'return'"},
    {L, "switch (1) 1", P, "keyword 'switch'"},
    /* type queries, allocation, exceptions, asm */
    {L, "sizeof(int)", P, "keyword 'sizeof' is not allowed"},
    {L, "sizeof logits", P, "keyword 'sizeof'"},
    {L, "alignof(float)", P, "keyword 'alignof'"},
    {L, "decltype(logits)(1)", P, "keyword 'decltype'"},
    {L, "typeid(logits)", P, "keyword 'typeid'"},
    {L, "new int", P, "keyword 'new'"},
    {L, "delete slopes", P, "keyword 'delete'"},
    {L, "throw 1", P, "keyword 'throw'"},
    {L, "asm(\"\")", P, "keyword 'asm'"},
    {L, "this", P, "keyword 'this'"},
    {L, "nullptr", P, "keyword 'nullptr'"},
    {L, "template", P, "keyword 'template'"},
    {L, "auto", P, "keyword 'auto'"},
    {L, "operator+(1, 2)", P, "keyword 'operator'"},
    {L, "not kv_idx", P, "keyword 'not'"},
    {L, "kv_idx and 1", P, "keyword 'and'"},
    /* literals */
    {L, "\"str\"", P, "string literals are not allowed"},
    {L, "u8\"s\"", P, "string literals"},
    {L, "'c'", P, "character literals are not allowed"},
    {L, "L'c'", P, "character literals"},
    {L, "1.0L", P, "long double literals are not allowed"},
    {L, "1i", P, "an imaginary literal"},
    {L, "1_km", P, "user-defined literals are not allowed"},
    {L, "1e", P, "exponent has no digits"},
    /* calls */
    {L, "printf(1)", P, "unknown function 'printf'; allowed: expf, exp2f"},
    {L, "exit(0)", P, "unknown function 'exit'"},
    {L, "__builtin_trap()", P, "unknown function '__builtin_trap'"},
    {L, "__builtin_expf(logits)", P, "unknown function '__builtin_expf'"},
    {L, "unknown_fn(1)", P, "unknown function 'unknown_fn'"},
    {L, "kiln_snippet_fn(1)", P, "unknown function 'kiln_snippet_fn'"},
    {L, "_Pragma(\"x\")", P, "unknown function '_Pragma'"},
    {L, "batch(1)", P, "'batch' is not a function"},
    {L, "expf", P, "function 'expf' must be called"},
    {L, "expf + 1", P, "function 'expf' must be called"},
    {L, "expf(1, 2)", P, "no matching function for call to 'expf'"},
    {L, "min(kv_idx, logits)", P, "call to 'min' is ambiguous"},
    {L, "abs(logits)", P, "converted implicitly from floating point to an integer"},
    /* names */
    {M, "kv_pos", P, "1:1: unknown name 'kv_pos'; known: batch, qo_idx, kv_idx"},
    {M, "kv_idx <= kv_pos", P, "1:11: unknown name 'kv_pos'"},
    {M, "logits > 0", P, "unknown name 'logits' (it exists only in the logits snippet)"},
    {L, "__LINE__", P, "unknown name '__LINE__'"},
    {L, "__FILE__", P, "unknown name '__FILE__'"},
    {L, "$x", P, "unknown name '$x'"},
    {L, "threadIdx", P, "unknown name 'threadIdx'"},
    /* closing the wrapper, brackets */
    {L, ")", P, "1:1: ')' closes nothing"},
    {L, "1) + (2", P, "1:2: ')' closes nothing"},
    {L, "((1)", P, "1:1: '(' is never closed"},
    {L, "slopes[0", P, "'[' is never closed"},
    {L, "(]", P, "']' does not match '(' at 1:1"},
    {L, "1 /* ) */ )", P, "1:11: ')' closes nothing"},
    {L, "1 /* ; { */", P, "';' is not allowed"},
    {L, "1 // ) ; {", P, "';' is not allowed"},
    {L, "1 /* unterminated", P, "unterminated comment"},
    {L, "1 +", P, "expected expression"},
    {L, "kv_idx<=>1", P, "expected expression"},
    /* preprocessor, digraphs, trigraphs, escapes */
    {L, "#define X", P, "'#' is not allowed"},
    {L, "#include <x>", P, "'#' is not allowed"},
    {L, "%:define X 1", P, "digraph '%:'"},
    {L, "<%%>", P, "digraph '<%'"},
    {L, "slopes<:0:>", P, "digraph '<:'"},
    {L, "kv_idx ?\?= 1", P, "(a trigraph)"},
    {L, "\\u006Bv_idx", P, "'\\' is not allowed"},
    /* casts */
    {L, "static_cast<int*>(0)", P, "cast to 'int *' is not allowed"},
    {L, "(int*)0", P, "cast to 'int *'"},
    {L, "(bool*)0", P, "cast to 'bool *'"},
    {L, "(float*)slopes", P, "array parameter 'slopes' must be indexed"},
    {L, "reinterpret_cast<int>(logits)", P, "keyword 'reinterpret_cast'"},
    {L, "const_cast<float&>(logits)", P, "keyword 'const_cast'"},
    {L, "dynamic_cast<int>(1)", P, "keyword 'dynamic_cast'"},
    {L, "(char)1", P, "keyword 'char'"},
    {L, "(void)0", P, "keyword 'void'"},
    {L, "int()", P, "outside the snippet grammar"},
    /* parameters used the wrong way */
    {L, "scale[0]", P, "'scale' is a scalar, not an array"},
    {L, "kv_idx[0]", P, "'kv_idx' is a scalar"},
    {L, "slopes + 1", P, "array parameter 'slopes' must be indexed: slopes[i]"},
    {L, "slopes", P, "array parameter 'slopes' must be indexed"},
    {L, "1[slopes]", P, "array parameter 'slopes' must be indexed"},
    {L, "true ? slopes : slopes", P, "array parameter 'slopes'"},
    {L, "slopes[1.5f]", P, "array subscript is not an integer"},
    {L, "slopes[logits]", P, "array subscript is not an integer"},
    /* operators */
    {L, "(kv_idx, 1)", P, "the comma operator is not allowed"},
    {L, "kv_idx ?: 1", P, "outside the snippet grammar"},
    {L, "1 ... 2", P, "'...'"},
    {L, "@", P, "'@'"},
    {L, "kv_idx % logits", P, "invalid operands to binary expression"},
    {L, "logits & 1", P, "invalid operands"},
    /* empty */
    {L, "", P, "empty snippet"},
    {L, "   \t ", P, "empty snippet"},
    {M, "/* only a comment */", P, "empty snippet"},
    {M, "// only a comment", P, "empty snippet"},
    /* bytes */
    {L, "logits * 2\xc3\xa9", P, "1:11: byte 0xc3 is not allowed"},
    {L, "logits\n", P, "byte 0x0a"},
    {L, "logits\r", P, "byte 0x0d"},
    {L, "logits\x7f", P, "byte 0x7f"},
    {L, "\x01", P, "byte 0x01"},
};
#undef P

/* The message layout: "snippet 'KIND' 1:COL: ..." then the snippet and a caret under COL. */
static void check_layout(const refused_row *r, const char *msg, int line)
{
    char head[32];
    snprintf(head, sizeof head, "snippet '%s' 1:", r->kind == M ? "mask" : "logits");
    if (strncmp(msg, head, strlen(head))) {
        kt_fail(__FILE__, line, "'%s': message does not start with \"%s\": %s", r->text, head, msg);
        return;
    }
    int col = atoi(msg + strlen(head));
    const char *l2 = strchr(msg, '\n');
    const char *l3 = l2 ? strchr(l2 + 1, '\n') : NULL;
    if (!l3 || strchr(l3 + 1, '\n') || strncmp(l2 + 1, "  ", 2) || strncmp(l3 + 1, "  ", 2)) {
        kt_fail(__FILE__, line, "'%s': expected three lines: %s", r->text, msg);
        return;
    }
    size_t n = strlen(r->text);
    if (n <= 100) { /* short snippets are shown whole, caret under the column */
        if ((size_t)(l3 - l2 - 3) != n)
            kt_fail(__FILE__, line, "'%s': second line is not the snippet: %s", r->text, msg);
        const char *caret = l3 + 3;
        if ((int)strlen(caret) != col || caret[col - 1] != '^')
            kt_fail(__FILE__, line, "'%s': caret not under column %d: %s", r->text, col, msg);
    }
}

KT_TEST(snippet_refuses)
{
    if (!kt_need_clang()) return;
    KT_CHECK(KT_COUNT(refused) >= 60);
    for (int i = 0; i < KT_COUNT(refused); i++) {
        const refused_row *r = &refused[i];
        char canon[KILN_MAX_SNIPPET];
        memset(canon, 'x', sizeof canon);
        kiln__err e = {{0}};
        kiln_status st = check(r->kind, r->text, canon, &e);
        if (st != r->want)
            kt_fail(__FILE__, __LINE__, "row %d '%s' -> %s, want %s: %s", i, r->text,
                    kiln_status_str(st), kiln_status_str(r->want), e.msg);
        KT_CONTAINS(e.msg, r->fragment);
        KT_EQ_STR(canon, ""); /* no output on refusal */
        check_layout(r, e.msg, __LINE__);
        /* and nowhere to write is fine */
        KT_EQ_INT(check(r->kind, r->text, NULL, NULL), r->want);
    }
}

/* The example of snippet.h, byte for byte. */
KT_TEST(snippet_message_exact)
{
    if (!kt_need_clang()) return;
    kiln__err e;
    KT_EQ_INT(kiln__snippet_check(M, "kv_idx <= kv_pos", NULL, 0, NULL, 0, &e), KILN_STATUS_PARSE);
    KT_EQ_STR(e.msg, "snippet 'mask' 1:11: unknown name 'kv_pos'; known: batch, qo_idx, kv_idx, "
                     "qo_head, kv_head, qo_len, kv_len\n"
                     "  kv_idx <= kv_pos\n"
                     "            ^");
    /* tabs stay tabs in the caret line, so the caret lines up */
    KT_EQ_INT(kiln__snippet_check(M, "\tkv_idx\t<= kv_pos", NULL, 0, NULL, 0, &e),
              KILN_STATUS_PARSE);
    KT_CONTAINS(e.msg, "\n  \tkv_idx\t<= kv_pos\n  \t      \t   ^");
    /* a long snippet shows a window around the column */
    char text[KILN_MAX_SNIPPET];
    size_t n = 0;
    while (n + 9 < 400) memcpy(text + n, "kv_idx + ", 9), n += 9;
    memcpy(text + n, "kv_pos", 7);
    KT_EQ_INT(kiln__snippet_check(M, text, NULL, 0, NULL, 0, &e), KILN_STATUS_PARSE);
    KT_CONTAINS(e.msg, "unknown name 'kv_pos'");
    KT_CONTAINS(e.msg, "\n  ...");
    const char *caret = strrchr(e.msg, '\n') + 1;
    KT_EQ_INT(caret[strlen(caret) - 1], '^');
    KT_CHECK(strlen(e.msg) < sizeof e.msg - 1);
}

/* Lengths, NUL inside, NULL and bad arguments. */
KT_TEST(snippet_refuses_bytes)
{
    if (!kt_need_clang()) return;
    kiln__err e;
    char text[KILN_MAX_SNIPPET + 128], canon[KILN_MAX_SNIPPET];
    /* 511 bytes pass (blanks around a name), 512 do not */
    memset(text, ' ', KILN_MAX_SNIPPET - 1);
    memcpy(text + 200, "kv_idx", 6);
    text[KILN_MAX_SNIPPET - 1] = 0;
    KT_OK(kiln__snippet_check(M, text, NULL, 0, canon, sizeof canon, &e), e.msg);
    KT_EQ_STR(canon, "kv_idx");
    memset(text, ' ', KILN_MAX_SNIPPET);
    memcpy(text + 200, "kv_idx", 6);
    text[KILN_MAX_SNIPPET] = 0;
    KT_EQ_INT(kiln__snippet_check(M, text, NULL, 0, canon, sizeof canon, &e), KILN_STATUS_PARSE);
    KT_CONTAINS(e.msg, "1:512: at least 512 bytes, over the 511-byte limit");
    memset(text, ' ', 600);
    KT_EQ_INT(kiln__snippet_check_n(M, text, 600, NULL, 0, canon, sizeof canon, &e),
              KILN_STATUS_PARSE);
    KT_CONTAINS(e.msg, "600 bytes, over the 511-byte limit");
    /* a NUL inside, through the explicit length */
    KT_EQ_INT(kiln__snippet_check_n(M, "kv_idx\0 + 1", 11, NULL, 0, canon, sizeof canon, &e),
              KILN_STATUS_PARSE);
    KT_CONTAINS(e.msg, "snippet 'mask' 1:7: byte 0x00 is not allowed");
    KT_CONTAINS(e.msg, "\n  kv_idx? + 1\n");
    KT_OK(kiln__snippet_check_n(M, "kv_idx\0 + 1", 6, NULL, 0, canon, sizeof canon, &e), e.msg);
    KT_EQ_STR(canon, "kv_idx");
    /* the canonical form may outgrow the source: 255 '!' and a '1' become 511 bytes; one more
     * '!' does not fit */
    memset(text, '!', 256);
    strcpy(text + 256, "1");
    KT_EQ_INT(kiln__snippet_check(L, text, NULL, 0, canon, sizeof canon, &e), KILN_STATUS_PARSE);
    KT_CONTAINS(e.msg, "canonical form (tokens joined by single spaces) is 513 bytes");
    memset(text, '!', 255);
    strcpy(text + 255, "1");
    KT_OK(kiln__snippet_check(L, text, NULL, 0, canon, sizeof canon, &e), e.msg);
    KT_EQ_INT(strlen(canon), 511);
    /* a small output buffer */
    KT_EQ_INT(kiln__snippet_check(L, "logits+1", NULL, 0, canon, 8, &e),
              KILN_STATUS_INVALID_ARGUMENT);
    KT_CONTAINS(e.msg, "needs 11 bytes");
    KT_OK(kiln__snippet_check(L, "logits+1", NULL, 0, canon, 11, &e), e.msg);
    KT_EQ_STR(canon, "logits + 1");
    /* NULL text, bad kind, bad params */
    KT_EQ_INT(kiln__snippet_check(L, NULL, NULL, 0, canon, sizeof canon, &e), KILN_STATUS_PARSE);
    KT_CONTAINS(e.msg, "snippet 'logits': NULL text");
    KT_EQ_INT(kiln__snippet_check((kiln__snippet_kind)7, "1", NULL, 0, NULL, 0, &e),
              KILN_STATUS_INVALID_ARGUMENT);
    kiln_param_decl bad = {"1x", KILN_PARAM_F32};
    KT_EQ_INT(kiln__snippet_check(L, "1", &bad, 1, NULL, 0, &e), KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "params[0] '1x': not an identifier");
}

/* ---- parameters ---------------------------------------------------------------------------- */

KT_TEST(snippet_params_check)
{
    static const struct {
        const char *name;
        int type;
        const char *fragment; /* NULL: accepted */
    } rows[] = {
        {"scale", KILN_PARAM_F32, NULL},
        {"_x", KILN_PARAM_I32, NULL},
        {"x1", KILN_PARAM_F32_ARRAY, NULL},
        {"Slopes_2", KILN_PARAM_I32_ARRAY, NULL},
        {"abcdefghijklmnopqrstuvwxyz01234", KILN_PARAM_F32, NULL}, /* 31 bytes */
        {"", KILN_PARAM_F32, "params[0] '': empty name"},
        {"1x", KILN_PARAM_F32, "'1x': not an identifier"},
        {"a-b", KILN_PARAM_F32, "not an identifier"},
        {"a b", KILN_PARAM_F32, "not an identifier"},
        {"a\xc3\xa9", KILN_PARAM_F32, "'a?\?': not an identifier"},
        {"__x", KILN_PARAM_F32, "a reserved identifier"},
        {"_X", KILN_PARAM_F32, "a reserved identifier"},
        {"logits", KILN_PARAM_F32, "'logits': a built-in name"},
        {"kv_idx", KILN_PARAM_I32, "a built-in name"},
        {"batch", KILN_PARAM_I32, "a built-in name"},
        {"expf", KILN_PARAM_F32, "an allowed function's name"},
        {"min", KILN_PARAM_F32, "an allowed function's name"},
        {"int", KILN_PARAM_F32, "a C++ keyword or a CUDA built-in"},
        {"and", KILN_PARAM_F32, "a C++ keyword"},
        {"nullptr", KILN_PARAM_F32, "a C++ keyword"},
        {"threadIdx", KILN_PARAM_F32, "a CUDA built-in"},
        {"p", KILN_PARAM_F32, "a C++ keyword or a CUDA built-in"},
        {"kiln_x", KILN_PARAM_F32, "names starting with 'kiln' are reserved"},
        {"KILNx", KILN_PARAM_F32, "names starting with 'kiln' are reserved"},
        {"scale", 4, "'scale': type=4 must be one of 0 (f32), 1 (i32), 2 (f32[]), 3 (i32[])"},
        {"scale", -1, "type=-1"},
    };
    for (int i = 0; i < KT_COUNT(rows); i++) {
        kiln_param_decl d;
        memset(&d, 0, sizeof d);
        snprintf(d.name, sizeof d.name, "%s", rows[i].name);
        d.type = (kiln_param_type)rows[i].type;
        kiln__err e = {{0}};
        kiln_status st = kiln__params_check(&d, 1, &e);
        if (!rows[i].fragment) {
            KT_OK(st, e.msg);
        } else {
            KT_EQ_INT(st, KILN_STATUS_UNSUPPORTED);
            KT_CONTAINS(e.msg, rows[i].fragment);
        }
    }
    kiln_param_decl d[KILN_MAX_USER_PARAMS + 1];
    memset(d, 0, sizeof d);
    for (int i = 0; i <= KILN_MAX_USER_PARAMS; i++) snprintf(d[i].name, sizeof d[i].name, "p%d", i);
    kiln__err e;
    KT_OK(kiln__params_check(d, KILN_MAX_USER_PARAMS, &e), e.msg);
    KT_OK(kiln__params_check(NULL, 0, &e), e.msg);
    KT_EQ_INT(kiln__params_check(d, KILN_MAX_USER_PARAMS + 1, &e), KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "num_params=9: must be in 0..8");
    KT_EQ_INT(kiln__params_check(d, -1, &e), KILN_STATUS_UNSUPPORTED);
    KT_EQ_INT(kiln__params_check(NULL, 1, &e), KILN_STATUS_INVALID_ARGUMENT);
    snprintf(d[3].name, sizeof d[3].name, "p1");
    KT_EQ_INT(kiln__params_check(d, 4, &e), KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "params[3] 'p1': a duplicate name");
    memset(d[0].name, 'a', sizeof d[0].name); /* no NUL */
    KT_EQ_INT(kiln__params_check(d, 1, &e), KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "longer than 31 bytes (or not NUL-terminated)");
    KT_CHECK(memchr(e.msg, 0, sizeof e.msg) != NULL);
}

/* ---- specs with snippets: the seeds of the spec fuzzer ------------------------------------ */

#define BASE                                                                                       \
    "op=prefill dtype=bf16 head_dim=128 group=4 layout=nhd mask=causal window=0 logits=none"

static const char *const canonical_specs[] = {
    BASE " lse=0 logits_expr=\"30.0f * tanhf ( logits / 30.0f )\"",
    BASE " lse=0 params=slopes:f32[] logits_expr=\"logits + slopes [ qo_head ] * ( kv_idx - qo_idx "
         "- kv_len + qo_len )\"",
    BASE
    " lse=0 params=seg_q:i32[],seg_kv:i32[] mask_expr=\"seg_kv [ kv_idx ] == seg_q [ qo_idx ]\"",
    BASE " lse=1 mask_data=bsr params=a:f32,b:i32,c:f32[],d:i32[] logits_expr=\"logits * a + c [ "
         "qo_head ]\" mask_expr=\"kv_idx < b || d [ batch ] > 0\"",
    BASE " lse=0 mask_data=bitmask",
    BASE " lse=0 params=unused:f32",
    "op=decode dtype=f16 head_dim=64 group=8 layout=hnd mask=none window=1 logits=softcap lse=0 "
    "params=w:i32 mask_expr=\"kv_idx < 4 || kv_idx >= qo_idx + kv_len - qo_len - w\"",
    "op=decode q_dtype=bf16 kv_dtype=bf16 out_dtype=f16 head_dim=256 group=1 layout=nhd mask=none "
    "window=0 logits=alibi lse=1 logits_expr=\"logits - logf ( 1.0f + expf ( logits ) )\"",
};

KT_TEST(snippet_spec_roundtrip)
{
    if (!kt_need_clang()) return;
    for (int i = 0; i < KT_COUNT(canonical_specs); i++) {
        const char *s = canonical_specs[i];
        kiln_variant v, w;
        char buf[KILN__SPEC_MAX], again[KILN__SPEC_MAX];
        if (kiln_variant_parse(s, &v)) {
            kt_fail(__FILE__, __LINE__, "parse '%s': %s", s, kiln_errmsg());
            continue;
        }
        KT_EQ_INT(kiln_variant_format(&v, buf, sizeof buf), strlen(s));
        KT_EQ_STR(buf, s);
        KT_OK(kiln_variant_parse(buf, &w), kiln_errmsg());
        KT_CHECK(memcmp(&v, &w, sizeof v) == 0); /* parse(format(v)) == v, byte for byte */
        KT_EQ_INT(kiln_variant_format(&w, again, sizeof again), strlen(s));
        KT_EQ_STR(again, s);
    }
}

/* Non-canonical spellings parse to the canonical spec. */
/* ---- threads ------------------------------------------------------------------------------- */

typedef struct thread_arg {
    int index, bad;
} thread_arg;

static void *thread_main(void *p)
{
    thread_arg *a = p;
    for (int i = 0; i < 40; i++) {
        int row = (a->index * 7 + i) % KT_COUNT(accepted);
        char canon[KILN_MAX_SNIPPET];
        kiln__err e;
        if (check(accepted[row].kind, accepted[row].text, canon, &e) ||
            strcmp(canon, accepted[row].canon))
            a->bad++;
        const refused_row *r = &refused[(a->index * 5 + i) % KT_COUNT(refused)];
        if (check(r->kind, r->text, canon, &e) != r->want || !strstr(e.msg, r->fragment)) {
            a->bad++;
            fprintf(stderr, "thread: '%s': %s\n", r->text, e.msg);
        }
    }
    return NULL;
}

KT_TEST(snippet_threads)
{
    if (!kt_need_clang()) return;
    enum { N = 4 };
    pthread_t t[N];
    thread_arg args[N];
    for (int i = 0; i < N; i++) {
        args[i] = (thread_arg){i, 0};
        KT_REQUIRE(pthread_create(&t[i], NULL, thread_main, &args[i]) == 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        KT_EQ_INT(args[i].bad, 0);
    }
}

/* ---- fuzzing ------------------------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return n ? (uint32_t)(rng % n) : 0;
}

/* Apply 1..3 random edits to seed (n bytes) into out[cap]; return the new length. */
static size_t mutate(const char *seed, size_t n, char *out, size_t cap)
{
    static const char *const pieces[] = {
        "(", ")", "[", "]", "{", "}", ";", "#", "\\", "\"", "'", "/*", "*/", "//", "<%",
        "%:", "?\?", ",", ".", "->", "::", "=", "+=", "++", "&", "*", "?", ":", "~", "!", " ", "\t",
        "logits", "kv_idx", "slopes", "scale", "expf(", "min(", "sizeof", "1.5f", "0x", "1e",
        "static_cast<", ">", "(int*)", "__LINE__", "\\\"", "\"\"", "=\"", "params=", "a:f32",
        "logits_expr=\"", "mask_expr=\"", "\x80", "\xff", "\n",
        /* pieces that keep a snippet valid more often */
        " + 1", " * 2.0f", " - kv_idx", "(logits)", "0.5f * ", "expf(logits) + ", "(float)",
        "kv_idx < qo_idx && ", "slopes[qo_head] + ", "-", "!", " ? 1 : 0"};
    if (n > cap - 1) n = cap - 1;
    memcpy(out, seed, n);
    int edits = rnd(4) ? 1 : 2 + (int)rnd(2);
    for (int k = 0; k < edits; k++) {
        switch (rnd(6)) {
            case 0: /* flip a byte */
                if (n) out[rnd((uint32_t)n)] = (char)rnd(256);
                break;
            case 1: { /* insert a piece */
                const char *p = pieces[rnd(KT_COUNT(pieces))];
                size_t m = strlen(p), at = rnd((uint32_t)n + 1);
                if (n + m < cap) {
                    memmove(out + at + m, out + at, n - at);
                    memcpy(out + at, p, m);
                    n += m;
                }
                break;
            }
            case 2: { /* delete a range */
                if (!n) break;
                size_t at = rnd((uint32_t)n), m = 1 + rnd(8);
                if (at + m > n) m = n - at;
                memmove(out + at, out + at + m, n - at - m);
                n -= m;
                break;
            }
            case 3: /* truncate */
                n = rnd((uint32_t)n + 1);
                break;
            case 4: { /* duplicate a range */
                if (!n) break;
                size_t at = rnd((uint32_t)n), m = 1 + rnd(12);
                if (at + m > n) m = n - at;
                if (n + m < cap) {
                    memmove(out + at + m, out + at, n - at);
                    n += m;
                }
                break;
            }
            default: /* swap two bytes */
                if (n > 1) {
                    size_t a = rnd((uint32_t)n), b = rnd((uint32_t)n);
                    char t = out[a];
                    out[a] = out[b], out[b] = t;
                }
                break;
        }
    }
    out[n] = 0;
    return n;
}

static int fuzz_status_ok(kiln_status st)
{
    return st == KILN_STATUS_OK || st == KILN_STATUS_PARSE || st == KILN_STATUS_UNSUPPORTED;
}

KT_TEST(snippet_fuzz)
{
    if (!kt_need_clang()) return;
    const int scale = getenv("KILN_TEST_FULL") ? 5 : 1;
    const int n_snippet = 12000 * scale, n_spec = 8000 * scale;
    rng = 0x9e3779b97f4a7c15ull;
    int counts[2][3] = {{0}};
    char buf[KILN_MAX_SNIPPET + 64], canon[KILN_MAX_SNIPPET], again[KILN_MAX_SNIPPET];
    for (int i = 0; i < n_snippet && !kt_failed(); i++) {
        int from_refused = rnd(3) == 0;
        const char *seed = from_refused ? refused[rnd(KT_COUNT(refused))].text
                                        : accepted[rnd(KT_COUNT(accepted))].text;
        kiln__snippet_kind kind = rnd(2) ? L : M;
        size_t n = mutate(seed, strlen(seed), buf, sizeof buf);
        kiln__err e;
        memset(e.msg, 'z', sizeof e.msg);
        memset(canon, 'z', sizeof canon);
        /* explicit lengths keep NUL bytes the mutation wrote */
        kiln_status st = kiln__snippet_check_n(kind, buf, n, test_params, KT_COUNT(test_params),
                                               canon, sizeof canon, &e);
        if (!fuzz_status_ok(st))
            kt_fail(__FILE__, __LINE__, "'%s' -> %s", buf, kiln_status_str(st));
        if (!memchr(canon, 0, sizeof canon))
            kt_fail(__FILE__, __LINE__, "'%s': canon unterminated", buf);
        if (st == KILN_STATUS_OK) {
            counts[0][0]++;
            KT_CHECK(strlen(canon) < KILN_MAX_SNIPPET);
            /* the canonical text is accepted again, unchanged */
            if (check(kind, canon, again, &e) || strcmp(again, canon))
                kt_fail(__FILE__, __LINE__, "'%s' -> '%s' is not a fixed point: %s", buf, canon,
                        e.msg);
        } else {
            counts[0][st == KILN_STATUS_PARSE ? 1 : 2]++;
            if (!memchr(e.msg, 0, sizeof e.msg) || strncmp(e.msg, "snippet '", 9))
                kt_fail(__FILE__, __LINE__, "'%s': bad message %.60s", buf, e.msg);
        }
    }
    for (int i = 0; i < n_spec && !kt_failed(); i++) {
        const char *seed = canonical_specs[rnd(KT_COUNT(canonical_specs))];
        mutate(seed, strlen(seed), buf, sizeof buf);
        kiln_variant v;
        kiln_status st = kiln_variant_parse(buf, &v);
        if (!fuzz_status_ok(st))
            kt_fail(__FILE__, __LINE__, "'%s' -> %s", buf, kiln_status_str(st));
        if (!memchr(kiln_errmsg(), 0, 1024)) kt_fail(__FILE__, __LINE__, "message unterminated");
        counts[1][st == KILN_STATUS_OK ? 0 : st == KILN_STATUS_PARSE ? 1 : 2]++;
        if (st) continue;
        /* accepted: format and parse again agree */
        char f1[KILN__SPEC_MAX], f2[KILN__SPEC_MAX];
        kiln_variant w;
        size_t n1 = kiln_variant_format(&v, f1, sizeof f1);
        if (!n1 || n1 >= sizeof f1 || kiln_variant_parse(f1, &w) ||
            kiln_variant_format(&w, f2, sizeof f2) != n1 || strcmp(f1, f2) ||
            memcmp(&v, &w, sizeof v))
            kt_fail(__FILE__, __LINE__, "'%s': round trip broke: '%s' (%s)", buf, f1,
                    kiln_errmsg());
    }
    printf("    fuzz: %d snippet mutations (ok %d, parse %d, unsupported %d), %d spec mutations "
           "(ok %d, parse %d, unsupported %d)\n",
           n_snippet, counts[0][0], counts[0][1], counts[0][2], n_spec, counts[1][0], counts[1][1],
           counts[1][2]);
}

/* ---- timing -------------------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Run as a child of snippet_timing (KILN_SNIPPET_PROBE=1): the first check in a fresh process,
 * dlopen included. Otherwise a plain check. */
KT_TEST(snippet_probe_first_call)
{
    uint64_t t0 = kiln__now_ns();
    kiln__err e;
    const kiln__clang *c = kiln__clang_get(&e);
    uint64_t t1 = kiln__now_ns();
    if (!c) {
        kt_skip("%s", e.msg);
        return;
    }
    char canon[KILN_MAX_SNIPPET];
    KT_OK(check(L, accepted[0].text, canon, &e), e.msg);
    uint64_t t2 = kiln__now_ns();
    if (getenv("KILN_SNIPPET_PROBE"))
        printf("probe: %.2f %.2f\n", (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6);
}

KT_TEST(snippet_timing)
{
    if (!kt_need_clang()) return;
    enum { N = 300 };
    uint64_t ns[N];
    char canon[KILN_MAX_SNIPPET];
    kiln__err e;
    for (int i = 0; i < N; i++) {
        int row = i % 8; /* the cookbook rows */
        uint64_t t0 = kiln__now_ns();
        kiln_status st = check(accepted[row].kind, accepted[row].text, canon, &e);
        ns[i] = kiln__now_ns() - t0;
        KT_OK(st, e.msg);
    }
    qsort(ns, N, sizeof ns[0], cmp_u64);
    printf("    parse + validate per snippet (cookbook, %d runs): median %.0f us, p10 %.0f us, "
           "p90 %.0f us\n",
           N, (double)ns[N / 2] / 1e3, (double)ns[N / 10] / 1e3, (double)ns[9 * N / 10] / 1e3);
    /* the first call in a fresh process */
    char self[512], cmd[700], line[256];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return;
    self[n] = 0;
    snprintf(cmd, sizeof cmd, "KILN_SNIPPET_PROBE=1 '%s' --cpu snippet_probe_first_call 2>&1",
             self);
    FILE *f = popen(cmd, "r");
    if (!f) return;
    double load = -1, first = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "probe: ", 7)) sscanf(line + 7, "%lf %lf", &load, &first);
    pclose(f);
    if (load >= 0)
        printf("    first call in a fresh process: %.1f ms (dlopen + index %.1f ms, first parse + "
               "validate %.1f ms)\n",
               load + first, load, first);
}
