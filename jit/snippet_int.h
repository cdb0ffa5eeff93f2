/*
 * snippet_int.h — what the two halves of the snippet validator share, private to them:
 * jit/snippet.c (bytes, parse, tokens, clang's errors, canonical text, the API) and
 * jit/snippet_ast.c (the walk of the AST against the allow-list).
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

/* Write the refusal (with column, snippet and caret) into w->e; returns KILN_STATUS_PARSE. */
kiln_status kiln__snippet_refuse(const kiln__snippet_run *w, size_t off, const char *fmt, ...)
    KILN__PRINTF(3, 4);
/* What `name` means in this check. */
kiln__snippet_name kiln__snippet_classify(const kiln__snippet_run *w, const char *name);
/* 1 when name is an allowed function. */
int kiln__snippet_is_function(const char *name);
/* "expf, exp2f, ..." into out[cap]. */
void kiln__snippet_list_functions(char *out, size_t cap);
/* Offset of a location relative to the snippet, clamped to [0, len]. */
size_t kiln__snippet_offset(const kiln__snippet_run *w, CXSourceLocation loc);
/* Gate 3, a number literal: the whitelisted spellings and a representable value
 * (jit/snippet_lit.c). */
kiln_status kiln__snippet_check_literal(const kiln__snippet_run *w, const kiln__snippet_tok *t);
/* Gate 5: walk the expression of the wrapper's return statement (jit/snippet_ast.c). */
kiln_status kiln__snippet_check_ast(kiln__snippet_run *w);

#endif /* KILN_SNIPPET_INT_H */
