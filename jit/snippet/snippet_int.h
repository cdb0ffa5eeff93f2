/*
 * snippet_int.h — the private layers of the snippet validator in jit/snippet/, lowest first;
 * each file calls only the layers below it:
 *   snippet_names.c  the names a snippet may use, the wrapper that declares them, parameter
 *                    declarations, offsets and the refusal message (calls nothing above);
 *   snippet_lit.c    gate 3's number literals        } each calls snippet_names.c only
 *   snippet_ast.c    gate 5, the AST allow-list      }
 *   snippet.c        the driver: gates 1-4, then 5, the canonical text, the API (snippet.h).
 */
#ifndef KILN_SNIPPET_INT_H
#define KILN_SNIPPET_INT_H

#include <stddef.h>

#include "libclang.h"
#include "snippet.h"

/* The wrapper function's name (reserved: no parameter or snippet can name it). */
#define KILN__SNIPPET_FN "kiln_snippet_fn"

/* A non-comment token of the snippet: offset and spelling. */
typedef struct kiln__snippet_tok {
    size_t off, len;
    CXTokenKind kind;
    const char *s; /* NUL-terminated copy in kiln__snippet_run.pool */
} kiln__snippet_tok;

/* What a name means inside a snippet. */
typedef enum kiln__snippet_name {
    KILN__NAME_UNKNOWN,
    KILN__NAME_SCALAR,   /* a builtin or a scalar parameter */
    KILN__NAME_ARRAY,    /* an array parameter */
    KILN__NAME_FUNCTION, /* an allowed function */
    KILN__NAME_LOGITS_IN_MASK,
} kiln__snippet_name;

/* One check in progress. */
typedef struct kiln__snippet_run {
    const kiln__clang *c;
    kiln__snippet_kind kind;
    const char *text; /* the snippet, len bytes (not necessarily NUL-terminated) */
    size_t len;
    const kiln_param_decl *params;
    int num_params;
    kiln__err *e;
    CXTranslationUnit tu;
    unsigned base; /* offset of the snippet in the wrapper */
    kiln__snippet_tok toks[KILN_MAX_SNIPPET];
    int ntok;
    char pool[2 * KILN_MAX_SNIPPET];
    size_t pool_used;
} kiln__snippet_run;

#define KILN__COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- names, the wrapper, offsets, refusals (snippet_names.c) -------------------------------- */

/* 1 when s is one of the n strings of list. */
int kiln__snippet_in_list(const char *const *list, int n, const char *s);
/* "logits" or "mask", for messages. */
const char *kiln__snippet_kind_name(kiln__snippet_kind k);
/* What `name` means in this check. */
kiln__snippet_name kiln__snippet_classify(const kiln__snippet_run *w, const char *name);
/* 1 when name is an allowed function. */
int kiln__snippet_is_function(const char *name);
/* "expf, exp2f, ..." into out[cap]. */
void kiln__snippet_list_functions(char *out, size_t cap);
/* "batch, qo_idx, ..., scale (f32), slopes (f32[])": the names this check knows, into out[cap]. */
void kiln__snippet_list_names(const kiln__snippet_run *w, char *out, size_t cap);
/* Write the wrapper (the allowed functions' prototypes, then KILN__SNIPPET_FN with the known
 * names as its parameters, returning the snippet) into buf[cap]; returns its length (>= cap:
 * it did not fit) and sets w->base. */
size_t kiln__snippet_wrapper(kiln__snippet_run *w, char *buf, size_t cap);
/* Offset of a location relative to the snippet, clamped to [0, len]. */
size_t kiln__snippet_offset(const kiln__snippet_run *w, CXSourceLocation loc);
/* Write "snippet 'KIND' 1:COL: MSG", the snippet (or a window of it) and a caret under byte off
 * of text[len] into e; returns KILN_STATUS_PARSE. Non-printable bytes show as '?'. */
kiln_status kiln__snippet_refuse_at(kiln__err *e, kiln__snippet_kind kind, const char *text,
                                    size_t len, size_t off, const char *fmt, ...)
    KILN__PRINTF(6, 7);
/* kiln__snippet_refuse_at for the snippet of this check, into w->e. */
kiln_status kiln__snippet_refuse(const kiln__snippet_run *w, size_t off, const char *fmt, ...)
    KILN__PRINTF(3, 4);

/* ---- the gates above the names -------------------------------------------------------------- */

/* Gate 3, a number literal: the whitelisted spellings and a representable value
 * (snippet_lit.c). */
kiln_status kiln__snippet_check_literal(const kiln__snippet_run *w, const kiln__snippet_tok *t);
/* Gate 5: walk the expression of the wrapper's return statement (snippet_ast.c). */
kiln_status kiln__snippet_check_ast(kiln__snippet_run *w);

#endif /* KILN_SNIPPET_INT_H */
