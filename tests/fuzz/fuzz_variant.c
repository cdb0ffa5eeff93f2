/*
 * fuzz_variant.c — libFuzzer target: a kiln_variant struct of any bytes, as a C caller might
 * pass one (fields out of range, enums outside their values, snippet and parameter names with
 * no NUL). kiln_variant_format and kiln_variant_check return a status or 0 with a message and
 * never crash or read past the struct; a variant check accepts formats to a spec that parses
 * back to the same text (without snippets: their grammar is parse's and the build's to check).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* on the heap, exactly its size: ASan sees a read past its end */
    kiln_variant *v = malloc(sizeof *v);
    if (!v) return 0;
    kiln_variant_default(v);
    /* the first bytes choose fields to overwrite, so that most inputs stay near valid ones */
    if (size > 0 && data[0] & 1) {
        memcpy(v, data + 1, size - 1 < sizeof *v ? size - 1 : sizeof *v);
    } else if (size > 2) {
        const size_t at = ((size_t)data[1] << 8 | data[2]) % sizeof *v;
        const size_t n = size - 3 < sizeof *v - at ? size - 3 : sizeof *v - at;
        memcpy((char *)v + at, data + 3, n);
    }
    /* format must answer any struct; what check accepts formats, and without snippets the text
     * parses back to the same text (check leaves a snippet's grammar to parse and to the
     * kernel's build, which validate it with libclang: here parse only has to answer) */
    char buf[8192];
    const size_t n = kiln_variant_format(v, buf, sizeof buf);
    const int snippets = memchr(v->logits_expr, 0, KILN_MAX_SNIPPET) &&
                         memchr(v->mask_expr, 0, KILN_MAX_SNIPPET) &&
                         (v->logits_expr[0] || v->mask_expr[0]);
    if (kiln_variant_check(v) == KILN_STATUS_OK && snippets) {
        kiln_variant w;
        if (n == 0 || n >= sizeof buf) abort();
        (void)kiln_variant_parse(buf, &w);
    } else if (kiln_variant_check(v) == KILN_STATUS_OK) {
        kiln_variant w;
        char again[8192];
        if (n == 0 || n >= sizeof buf) {
            fprintf(stderr, "fuzz_variant: a checked variant does not format: %s\n", kiln_errmsg());
            abort();
        }
        if (kiln_variant_parse(buf, &w) != KILN_STATUS_OK) {
            fprintf(stderr, "fuzz_variant: formatted spec does not parse: %s\n  %s\n", buf,
                    kiln_errmsg());
            abort();
        }
        if (kiln_variant_format(&w, again, sizeof again) != n || strcmp(buf, again)) {
            fprintf(stderr, "fuzz_variant: format(parse(format(v))) moved\n  %s\n  %s\n", buf,
                    again);
            abort();
        }
    }
    free(v);
    return 0;
}
