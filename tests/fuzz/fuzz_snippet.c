/*
 * fuzz_snippet.c — libFuzzer target: the snippet validator (libclang and kiln's allow-list) on
 * any bytes. A snippet is user code that kiln pastes into a CUDA source, so what it accepts
 * must be an expression and nothing else: its canonical text is accepted again unchanged (a
 * fixed point), holds only printable characters, and none of the tokens that could end the
 * expression or reach the preprocessor (`;`, braces, `#`, quotes, backslashes, comments).
 * Refusals come with a message naming the snippet. The first byte picks logits or mask; the
 * user parameters are the cookbook's (slopes: f32[], scale: f32, window, prefix: i32,
 * seg_q, seg_kv: i32[]). Needs libclang (without it every snippet is refused, UNSUPPORTED).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snippet.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const kiln_param_decl params[] = {
    {"slopes", KILN_PARAM_F32_ARRAY}, {"scale", KILN_PARAM_F32},
    {"window", KILN_PARAM_I32},       {"prefix", KILN_PARAM_I32},
    {"seg_q", KILN_PARAM_I32_ARRAY},  {"seg_kv", KILN_PARAM_I32_ARRAY},
};
enum { NP = sizeof params / sizeof params[0] };

static void die(const char *what, const char *text, const char *canon)
{
    fprintf(stderr, "fuzz_snippet: %s\n  text:  %s\n  canon: %s\n", what, text, canon);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0 || size > 2 * KILN_MAX_SNIPPET) return 0;
    const kiln__snippet_kind kind = data[0] & 1 ? KILN__SNIPPET_MASK : KILN__SNIPPET_LOGITS;
    /* the text alone on the heap, exactly its bytes (NULs included) */
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    char canon[KILN_MAX_SNIPPET], again[KILN_MAX_SNIPPET];
    kiln__err e = {{0}};
    const kiln_status st =
        kiln__snippet_check_n(kind, text, size - 1, params, NP, canon, sizeof canon, &e);
    if (st == KILN_STATUS_OK) {
        if (!memchr(canon, 0, sizeof canon)) die("canonical text not terminated", text, "");
        for (const char *p = canon; *p; p++)
            if (*p < 0x20 || *p > 0x7e || strchr(";{}#\"'\\`@$", *p))
                die("a character outside an expression's in the canonical text", text, canon);
        if (strstr(canon, "//") || strstr(canon, "/*") || strstr(canon, "*/") ||
            strstr(canon, "<%") || strstr(canon, "%>") || strstr(canon, "%:") ||
            strstr(canon, "??"))
            die("a comment, digraph or trigraph in the canonical text", text, canon);
        kiln__err e2 = {{0}};
        if (kiln__snippet_check(kind, canon, params, NP, again, sizeof again, &e2) !=
            KILN_STATUS_OK)
            die("the canonical text is refused", text, canon);
        if (strcmp(again, canon)) die("the canonical text is not a fixed point", canon, again);
    } else if (st != KILN_STATUS_PARSE && st != KILN_STATUS_UNSUPPORTED) {
        die("an unexpected status", text, kiln_status_str(st));
    } else if (!memchr(e.msg, 0, sizeof e.msg) ||
               (st == KILN_STATUS_PARSE && strncmp(e.msg, "snippet '", 9))) {
        die("a refusal without a snippet message", text, e.msg);
    }
    free(text);
    return 0;
}
