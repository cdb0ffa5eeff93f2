/*
 * libclang.h — the part of libclang's C API that the snippet validator (jit/snippet/) uses,
 * loaded with dlopen on first use (libclang.c), so that nothing links against libclang and
 * processes that never see a snippet never load it.
 *
 * The library: $KILN_LIBCLANG when set, else libclang-14.so.1, else libclang.so.1 (the loader's
 * search path), else /usr/lib/llvm-14/lib/libclang-14.so.1.
 */
#ifndef KILN_LIBCLANG_H
#define KILN_LIBCLANG_H

#include <clang-c/Index.h>

#include "util.h"

/* Every function kiln calls, resolved by name. */
#define KILN__CLANG_FUNCS(X)                                                                       \
    X(clang_createIndex)                                                                           \
    X(clang_parseTranslationUnit2)                                                                 \
    X(clang_disposeTranslationUnit)                                                                \
    X(clang_getNumDiagnostics)                                                                     \
    X(clang_getDiagnostic)                                                                         \
    X(clang_disposeDiagnostic)                                                                     \
    X(clang_getDiagnosticSeverity)                                                                 \
    X(clang_getDiagnosticLocation)                                                                 \
    X(clang_getDiagnosticSpelling)                                                                 \
    X(clang_getCString)                                                                            \
    X(clang_disposeString)                                                                         \
    X(clang_getSpellingLocation)                                                                   \
    X(clang_getFile)                                                                               \
    X(clang_getLocationForOffset)                                                                  \
    X(clang_getRange)                                                                              \
    X(clang_getRangeStart)                                                                         \
    X(clang_getRangeEnd)                                                                           \
    X(clang_tokenize)                                                                              \
    X(clang_disposeTokens)                                                                         \
    X(clang_getTokenKind)                                                                          \
    X(clang_getTokenSpelling)                                                                      \
    X(clang_getTokenLocation)                                                                      \
    X(clang_getTranslationUnitCursor)                                                              \
    X(clang_visitChildren)                                                                         \
    X(clang_getCursorKind)                                                                         \
    X(clang_getCursorKindSpelling)                                                                 \
    X(clang_getCursorExtent)                                                                       \
    X(clang_getCursorSpelling)                                                                     \
    X(clang_getCursorReferenced)                                                                   \
    X(clang_getCursorLocation)                                                                     \
    X(clang_getCursorType)                                                                         \
    X(clang_getCanonicalType)                                                                      \
    X(clang_getTypeSpelling)                                                                       \
    X(clang_Cursor_isNull)                                                                         \
    X(clang_Cursor_Evaluate)                                                                       \
    X(clang_EvalResult_getKind)                                                                    \
    X(clang_EvalResult_getAsDouble)                                                                \
    X(clang_EvalResult_getAsLongLong)                                                              \
    X(clang_EvalResult_dispose)                                                                    \
    X(clang_getClangVersion)

/* The resolved functions and the process's one index (created once; never disposed). */
typedef struct kiln__clang {
#define KILN__CLANG_MEMBER(name) __typeof__(&name) name;
    KILN__CLANG_FUNCS(KILN__CLANG_MEMBER)
#undef KILN__CLANG_MEMBER
    CXIndex index;
    char version[96]; /* clang_getClangVersion(), e.g. "Debian clang version 14.0.6" */
    char path[256];   /* the file it was loaded from */
} kiln__clang;

/* The loaded API (static storage, valid for the life of the process), or NULL with e set
 * (KILN_STATUS_UNSUPPORTED: the library cannot be loaded or lacks a function). Loads on the
 * first call (thread-safe); later calls are a load of one pointer. The fault site "libclang"
 * makes one call fail as if the library were missing. */
const kiln__clang *kiln__clang_get(kiln__err *e);

#endif /* KILN_LIBCLANG_H */
