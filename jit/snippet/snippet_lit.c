/*
 * snippet_lit.c — the spelling of a snippet's number literals (part of gate 3 of the validator,
 * snippet.c). clang and NVRTC's front end disagree about literals at the edges: clang takes
 * 1uz, 1z and 0x1p128f (with at most a warning) where NVRTC fails, NVRTC takes 1.0q and 1.0w
 * where clang fails. Rather than chase the two lexers, a literal must match one whitelisted
 * spelling, which both compile the same way:
 *
 *   integer := (decimal | octal | hex) [int-suffix]
 *              decimal [1-9][0-9]* or 0, octal 0[0-7]+, hex 0[xX][0-9a-fA-F]+
 *   int-suffix := u or U, l or L, ll or LL, and u/U together with l/L/ll/LL in either order
 *   float   := decimal-float [f | F] | hex-float [f | F]
 *              decimal-float: digits '.' [digits] [exp] | '.' digits [exp] | digits exp,
 *              exp [eE][+-]?[0-9]+; hex-float: 0[xX] hex digits [. [hex digits]] [pP][+-]?[0-9]+
 *
 * and its value must be representable: an integer fits unsigned long long (a decimal one
 * without u also long long, so that it never turns unsigned silently); a float literal rounds
 * (to nearest, as both compilers do) to a finite value of its type, and to a non-zero one unless
 * all its digits are zero. NVRTC refuses exactly those that overflow to infinity or underflow
 * to zero ("floating constant is out of range"). Digit separators (1'000), binary literals,
 * long double (1.0L), and every other suffix (i, if, df, dd, f16, bf16, q, w, z, uz, wb, user
 * literals _x) are refused, named, with the literal's column.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "snippet_int.h"

#define REFUSE(w, off, ...) kiln__snippet_refuse((w), (off), __VA_ARGS__)

/* Longest literal checked (a snippet is shorter than KILN_MAX_SNIPPET anyway). */
#define LIT_MAX KILN_MAX_SNIPPET

static int is_hex(char c) { return isxdigit((unsigned char)c) != 0; }
static int is_dec(char c) { return c >= '0' && c <= '9'; }

/* Length of the run of digits at s (hex digits when hex). */
static size_t digits(const char *s, int hex)
{
    size_t n = 0;
    while (hex ? is_hex(s[n]) : is_dec(s[n])) n++;
    return n;
}

/* 1 when s is an integer suffix of the whitelist (possibly empty); *unsigned_ gets the u. */
static int int_suffix(const char *s, int *unsigned_)
{
    static const char *const ok[] = {"",    "u",   "U",   "l",   "L",   "ll",  "LL", "ul",
                                     "uL",  "Ul",  "UL",  "lu",  "lU",  "Lu",  "LU", "ull",
                                     "uLL", "Ull", "ULL", "llu", "llU", "LLu", "LLU"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(s, ok[i])) {
            *unsigned_ = strchr(s, 'u') || strchr(s, 'U');
            return 1;
        }
    return 0;
}

/* Why the suffix `s` (of a literal of the given class) is refused. */
static const char *suffix_hint(const char *s, int is_float)
{
    if (is_float && (!strcmp(s, "l") || !strcmp(s, "L")))
        return "long double literals are not allowed (the GPU has no long double); use f or none";
    if (s[0] == '_') return "user-defined literals are not allowed";
    if ((strchr(s, 'i') || strchr(s, 'j')) && strspn(s, "iIjJfFlLuU") == strlen(s))
        return "an imaginary literal is not allowed (no complex numbers)";
    return is_float ? "a floating literal takes only f or F (or no suffix)"
                    : "an integer literal takes only u, l, ll and their combinations (or no "
                      "suffix)";
}

static kiln_status check_integer(const kiln__snippet_run *w, const kiln__snippet_tok *t,
                                 size_t body, int base)
{
    const char *s = t->s;
    int uns = 0;
    if (!int_suffix(s + body, &uns))
        return REFUSE(w, t->off, "literal '%s': suffix '%s' is not allowed: %s", s, s + body,
                      suffix_hint(s + body, 0));
    char num[LIT_MAX];
    memcpy(num, s, body);
    num[body] = 0;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(num, &end, base);
    if (errno == ERANGE || !end || *end)
        return REFUSE(w, t->off, "literal '%s' does not fit in unsigned long long", s);
    if (base == 10 && !uns && v > (unsigned long long)LLONG_MAX)
        return REFUSE(w, t->off,
                      "literal '%s' does not fit in long long: write it with a u "
                      "suffix if it is meant to be unsigned",
                      s);
    return KILN_STATUS_OK;
}

static kiln_status check_float(const kiln__snippet_run *w, const kiln__snippet_tok *t, size_t body)
{
    const char *s = t->s;
    const char *suf = s + body;
    if (*suf && strcmp(suf, "f") && strcmp(suf, "F"))
        return REFUSE(w, t->off, "literal '%s': suffix '%s' is not allowed: %s", s, suf,
                      suffix_hint(suf, 1));
    char num[LIT_MAX];
    memcpy(num, s, body);
    num[body] = 0;
    const int is_f = *suf != 0;
    /* a literal whose digits are all zero is zero; any other must not round to zero */
    int nonzero = 0;
    const int hex = num[0] == '0' && (num[1] == 'x' || num[1] == 'X');
    for (const char *p = num + (hex ? 2 : 0);
         *p && !(hex ? (*p == 'p' || *p == 'P') : (*p == 'e' || *p == 'E')); p++)
        nonzero |= *p != '0' && *p != '.';
    char *end = NULL;
    double d = 0;
    float f = 0;
    if (is_f) f = strtof(num, &end);
    else d = strtod(num, &end);
    if (!end || *end) return REFUSE(w, t->off, "literal '%s' is not a number", s);
    const double got = is_f ? (double)f : d;
    if (isinf(got))
        return REFUSE(w, t->off,
                      "literal '%s' is out of range for %s (it rounds to infinity; "
                      "the largest is %s)",
                      s, is_f ? "float" : "double",
                      is_f ? "3.40282347e38f" : "1.7976931348623157e308");
    if (nonzero && got == 0)
        return REFUSE(w, t->off,
                      "literal '%s' is out of range for %s (it rounds to zero; the "
                      "smallest is %s)",
                      s, is_f ? "float" : "double",
                      is_f ? "1.40129846e-45f" : "4.9406564584124654e-324");
    return KILN_STATUS_OK;
}

kiln_status kiln__snippet_check_literal(const kiln__snippet_run *w, const kiln__snippet_tok *t)
{
    const char *s = t->s;
    const size_t n = strlen(s);
    if (n >= LIT_MAX) return REFUSE(w, t->off, "literal too long");
    if (strchr(s, '\''))
        return REFUSE(w, t->off, "literal '%s': digit separators (') are not allowed", s);
    if (s[0] == '0' && (s[1] == 'b' || s[1] == 'B'))
        return REFUSE(w, t->off, "literal '%s': binary literals are not allowed; write it in hex",
                      s);
    const int hex = s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    size_t i = hex ? 2 : 0;
    const size_t lead = digits(s + i, hex);
    i += lead;
    int is_float = 0;
    if (s[i] == '.') {
        is_float = 1;
        i++;
        size_t frac = digits(s + i, hex);
        if (!lead && !frac) return REFUSE(w, t->off, "literal '%s' has no digits", s);
        i += frac;
    } else if (!lead) {
        return REFUSE(w, t->off, "literal '%s' has no digits", s);
    }
    const char e = hex ? 'p' : 'e', E = hex ? 'P' : 'E';
    if (s[i] == e || s[i] == E) {
        is_float = 1;
        size_t j = i + 1;
        if (s[j] == '+' || s[j] == '-') j++;
        size_t ed = digits(s + j, 0);
        if (!ed) return REFUSE(w, t->off, "literal '%s': the exponent has no digits", s);
        i = j + ed;
    } else if (hex && is_float) {
        return REFUSE(w, t->off, "literal '%s': a hex float needs a p exponent (0x1.8p1)", s);
    }
    if (is_float) return check_float(w, t, i);
    if (hex) return check_integer(w, t, i, 16);
    if (s[0] == '0' && i > 1) {
        for (size_t k = 1; k < i; k++)
            if (s[k] > '7')
                return REFUSE(w, t->off, "literal '%s': '%c' is not an octal digit", s, s[k]);
        return check_integer(w, t, i, 8);
    }
    return check_integer(w, t, i, 10);
}
