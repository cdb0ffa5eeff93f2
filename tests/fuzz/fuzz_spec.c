/*
 * fuzz_spec.c — libFuzzer target: kiln_variant_parse on any text.
 *
 * Whatever the bytes, parse returns a status (never crashes, never reads past the text); a spec
 * it accepts formats to a canonical text that parses again to the same canonical text
 * (format(parse(format(parse(s)))) == format(parse(s))), and kiln_variant_check answers it.
 * `make fuzz` builds and runs it (tools/scripts/fuzz.sh); the corpus seeds are in corpus/spec/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what, const char *a, const char *b)
{
    fprintf(stderr, "fuzz_spec: %s\n  first:  %s\n  second: %s\n", what, a, b ? b : "");
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0;
    kiln_variant v;
    if (kiln_variant_parse(s, &v) == KILN_STATUS_OK) {
        char a[8192], b[8192];
        const size_t n = kiln_variant_format(&v, a, sizeof a);
        if (n == 0 || n >= sizeof a) die("an accepted spec does not format", s, kiln_errmsg());
        kiln_variant w;
        if (kiln_variant_parse(a, &w) != KILN_STATUS_OK)
            die("a canonical spec does not parse", a, kiln_errmsg());
        if (kiln_variant_format(&w, b, sizeof b) != n || strcmp(a, b))
            die("format(parse(x)) moved", a, b);
        /* a short buffer: truncated, NUL-terminated, the same length returned */
        char c[16];
        if (kiln_variant_format(&v, c, sizeof c) != n || strlen(c) != sizeof c - 1 ||
            strncmp(c, a, sizeof c - 1))
            die("format into a short buffer", a, c);
        (void)kiln_variant_check(&v);
    }
    free(s);
    return 0;
}
