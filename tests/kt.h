/*
 * kt.h — kiln's test harness: tests register themselves into one table, the runner (run.c)
 * filters them by name, runs each, and prints "N passed, N failed" last.
 *
 *   KT_TEST(spec_roundtrip) { KT_EQ_INT(1 + 1, 2); }      // a CPU test
 *   KT_GPU_TEST(decode_grid) { ... }                       // skipped without a GPU
 *
 * A failed check prints file:line, the expression and both values, marks the test failed and
 * lets the test continue; KT_REQUIRE returns from the test on failure.
 */
#ifndef KILN_KT_H
#define KILN_KT_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kiln.h"

typedef void (*kt_fn)(void);

typedef struct kt_case {
    const char *name;
    const char *file;
    kt_fn fn;
    int gpu; /* 1: needs a GPU */
} kt_case;

void kt_register(const char *name, const char *file, kt_fn fn, int gpu);
/* Record a failure (the runner prints it). */
void kt_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Mark the current test skipped, with a reason; the test should return. */
void kt_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Non-zero once the current test has failed. */
int kt_failed(void);
/* A scratch directory for this test (fresh, removed after the run). Valid for the test. */
const char *kt_tmpdir(void);
/* Path of the kiln binary under test (build/bin/kiln). */
const char *kt_kiln_bin(void);
/* 1 when a GPU is usable in this process. */
int kt_have_gpu(void);
/* Run argv[0] with argv (NULL-terminated) in a child, stdin from the file `in` (NULL:
 * /dev/null). Its stdout and stderr are returned in *out and *err (malloc'd, NUL-terminated,
 * never NULL; the caller frees them). Returns the exit status, -1 if it did not exit. */
int kt_run(const char *in, const char *const *argv, char **out, char **err);

#define KT__REG(name, gpu)                                                                         \
    static void kt_##name(void);                                                                   \
    __attribute__((constructor)) static void kt_reg_##name(void)                                   \
    {                                                                                              \
        kt_register(#name, __FILE__, kt_##name, gpu);                                              \
    }                                                                                              \
    static void kt_##name(void)

#define KT_TEST(name)     KT__REG(name, 0)
#define KT_GPU_TEST(name) KT__REG(name, 1)

#define KT_CHECK(expr)                                                                             \
    do {                                                                                           \
        if (!(expr)) kt_fail(__FILE__, __LINE__, "%s", #expr);                                     \
    } while (0)

#define KT_REQUIRE(expr)                                                                           \
    do {                                                                                           \
        if (!(expr)) {                                                                             \
            kt_fail(__FILE__, __LINE__, "required: %s", #expr);                                    \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define KT_EQ_INT(a, b)                                                                            \
    do {                                                                                           \
        long long kt_a_ = (long long)(a), kt_b_ = (long long)(b);                                  \
        if (kt_a_ != kt_b_)                                                                        \
            kt_fail(__FILE__, __LINE__, "%s == %s (%lld vs %lld)", #a, #b, kt_a_, kt_b_);          \
    } while (0)

#define KT_EQ_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *kt_a_ = (a), *kt_b_ = (b);                                                     \
        if (!kt_a_ || !kt_b_ || strcmp(kt_a_, kt_b_) != 0)                                         \
            kt_fail(__FILE__, __LINE__, "%s == %s (\"%s\" vs \"%s\")", #a, #b,                     \
                    kt_a_ ? kt_a_ : "(null)", kt_b_ ? kt_b_ : "(null)");                           \
    } while (0)

#define KT_CONTAINS(hay, needle)                                                                   \
    do {                                                                                           \
        const char *kt_h_ = (hay), *kt_n_ = (needle);                                              \
        if (!kt_h_ || !strstr(kt_h_, kt_n_))                                                       \
            kt_fail(__FILE__, __LINE__, "%s contains \"%s\" (got \"%s\")", #hay, kt_n_,            \
                    kt_h_ ? kt_h_ : "(null)");                                                     \
    } while (0)

/* Check a kiln call returned `want`; print the status and the message otherwise. `msg` is an
 * expression giving the last error text (kiln_errmsg() or kiln_ctx_errmsg(ctx)). */
#define KT_STATUS(call, want, msg)                                                                 \
    do {                                                                                           \
        kiln_status kt_s_ = (call);                                                                \
        if (kt_s_ != (want))                                                                       \
            kt_fail(__FILE__, __LINE__, "%s -> %s, want %s: %s", #call, kiln_status_str(kt_s_),    \
                    kiln_status_str(want), (msg));                                                 \
    } while (0)

#define KT_OK(call, msg) KT_STATUS(call, KILN_STATUS_OK, msg)

#endif /* KILN_KT_H */
