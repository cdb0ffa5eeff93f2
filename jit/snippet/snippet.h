/*
 * snippet.h — validation and canonicalisation of user snippets (logits_expr, mask_expr) with
 * libclang's C API, loaded with dlopen on first use (libclang-14.so.1) so that processes that
 * never see a snippet never load it.
 *
 * A snippet is parsed as C++ inside a wrapper function that declares exactly the builtin names
 * (logits for the logits snippet; batch, qo_idx, kv_idx, qo_head, kv_head, qo_len, kv_len),
 * the allowed math functions and the variant's user parameters; an AST walk accepts only the
 * allow-list (docs/variants.md). The canonical form is the snippet's token stream joined by
 * single spaces: whitespace and comments never change it.
 */
#ifndef KILN_SNIPPET_H
#define KILN_SNIPPET_H

#include <stddef.h>

#include "kiln.h"
#include "util.h"

typedef enum kiln__snippet_kind {
    KILN__SNIPPET_LOGITS = 0, /* float expression: the new logit; may read `logits` */
    KILN__SNIPPET_MASK = 1,   /* boolean (or arithmetic, != 0) expression: key visible */
} kiln__snippet_kind;

/* Validate `text` as a snippet of `kind` given the user parameters. On success write the
 * canonical token text into canon[cap] (NUL-terminated) and return KILN_STATUS_OK. On refusal
 * return KILN_STATUS_PARSE with e->msg like
 *   snippet 'mask' 1:17: unknown name 'kv_pos'; known: batch, qo_idx, ...
 *     kv_idx <= kv_pos
 *               ^
 * KILN_STATUS_UNSUPPORTED when libclang cannot be loaded (message says so). Thread-safe. */
kiln_status kiln__snippet_check(kiln__snippet_kind kind, const char *text,
                                const kiln_param_decl *params, int num_params, char *canon,
                                size_t cap, kiln__err *e);

/* kiln__snippet_check for text of exactly len bytes (which may hold a NUL: refused). */
kiln_status kiln__snippet_check_n(kiln__snippet_kind kind, const char *text, size_t len,
                                  const kiln_param_decl *params, int num_params, char *canon,
                                  size_t cap, kiln__err *e);

/* Check a variant's parameter declarations (names are identifiers, unique, not builtin names
 * or allowed function names; types in range). */
kiln_status kiln__params_check(const kiln_param_decl *params, int num_params, kiln__err *e);

/* "f32", "i32", "f32[]", "i32[]" (the spec's spelling of a parameter type); "?" otherwise. */
const char *kiln__param_type_name(kiln_param_type t);

/* Canonicalise both snippets of *v in place (no-op for empty ones). */
kiln_status kiln__variant_canonicalize(kiln_variant *v, kiln__err *e);

#endif /* KILN_SNIPPET_H */
