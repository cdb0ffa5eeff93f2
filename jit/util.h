/*
 * util.h — small host helpers shared by jit/, cache/, runtime/ and tools/: the error buffer
 * every internal call fills, a growable string, monotonic time and hex formatting.
 *
 * Internal (kiln__ prefix); not installed.
 */
#ifndef KILN_UTIL_H
#define KILN_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

#if defined(__GNUC__)
#define KILN__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KILN__PRINTF(f, a)
#endif

/* One error message: what failed — on what — why. Internal calls write it on failure. */
typedef struct kiln__err {
    char msg[1024];
} kiln__err;

/* Write a message into e (if e is non-NULL) and return st, so that callers can
 * `return kiln__fail(e, KILN_STATUS_X, "...", ...)`. */
kiln_status kiln__fail(kiln__err *e, kiln_status st, const char *fmt, ...) KILN__PRINTF(3, 4);

/* Prefix e->msg with "<fmt>: " keeping the old text after it. */
void kiln__err_prefix(kiln__err *e, const char *fmt, ...) KILN__PRINTF(2, 3);

/* The calling thread's no-context error buffer (what kiln_errmsg returns). */
kiln__err *kiln__tls_err(void);

/* A growable NUL-terminated string. Zero-initialise; kiln__str_free releases it. On allocation
 * failure the string latches oom=1 and further appends are ignored. */
typedef struct kiln__str {
    char *p;
    size_t len, cap;
    int oom;
} kiln__str;

void kiln__str_add(kiln__str *s, const char *t, size_t n);
void kiln__str_puts(kiln__str *s, const char *t);
void kiln__str_printf(kiln__str *s, const char *fmt, ...) KILN__PRINTF(2, 3);
/* Hand the buffer to the caller (never NULL unless oom: then NULL and freed). */
char *kiln__str_take(kiln__str *s);
void kiln__str_free(kiln__str *s);

/* strdup that returns NULL on NULL input. */
char *kiln__strdup(const char *s);

/* Monotonic clock in nanoseconds. */
uint64_t kiln__now_ns(void);

/* Write 2*n lowercase hex characters of bytes and a NUL into out (2*n+1 bytes). */
void kiln__hex(const void *bytes, size_t n, char *out);

/* XXH3-128 of data as 32 lowercase hex chars + NUL (canonical big-endian digest). */
void kiln__hash128(const void *data, size_t n, char out[33]);

/* XXH3-64 of data. */
uint64_t kiln__hash64(const void *data, size_t n);

/* Read a whole file into a malloc'd buffer (NUL-terminated); *size excludes the NUL. */
kiln_status kiln__read_file(const char *path, char **data, size_t *size, kiln__err *e);

/* Fault injection for tests: when the counter named by `site` reaches zero the call fails.
 * Sites: "malloc", "sqlite", "nvrtc", "cuda", "nfs" (the cache's file system check reports
 * NFS), "libclang" (loading libclang fails as if it were missing). Per thread. kiln__fault(site) returns 1 when the call must fail.
 * Set with kiln__fault_arm(site, n): fail the n-th call from now (n >= 1); 0 disarms. */
int kiln__fault(const char *site);
void kiln__fault_arm(const char *site, int n);

#endif /* KILN_UTIL_H */
