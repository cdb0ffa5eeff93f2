/*
 * util.c — error buffers, growable strings, clocks, hex, file reading, hashing and the fault
 * injection switch used by the tests. See util.h.
 */
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

kiln_status kiln__fail(kiln__err *e, kiln_status st, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

void kiln__err_prefix(kiln__err *e, const char *fmt, ...)
{
    if (!e) return;
    char head[512], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    size_t n = strlen(head);
    if (n > sizeof e->msg - 3) n = sizeof e->msg - 3;
    memcpy(e->msg, head, n);
    memcpy(e->msg + n, ": ", 2);
    size_t rest = sizeof e->msg - n - 3;
    size_t m = strnlen(old, rest);
    memcpy(e->msg + n + 2, old, m);
    e->msg[n + 2 + m] = 0;
}

static _Thread_local kiln__err tls_err;

kiln__err *kiln__tls_err(void) { return &tls_err; }

const char *kiln_errmsg(void) { return tls_err.msg; }

const char *kiln_status_str(kiln_status s)
{
    static const char *const names[] = {
#define KILN__STATUS_STR(name, str) str,
        KILN_STATUS_MAP(KILN__STATUS_STR)
#undef KILN__STATUS_STR
    };
    if ((unsigned)s >= (unsigned)KILN_STATUS_COUNT_) return "unknown status";
    return names[s];
}

void kiln__str_add(kiln__str *s, const char *t, size_t n)
{
    if (s->oom) return;
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + n + 1) cap *= 2;
        char *p = kiln__fault("malloc") ? NULL : realloc(s->p, cap);
        if (!p) {
            free(s->p);
            *s = (kiln__str){0};
            s->oom = 1;
            return;
        }
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->len, t, n);
    s->len += n;
    s->p[s->len] = 0;
}

void kiln__str_puts(kiln__str *s, const char *t) { kiln__str_add(s, t, strlen(t)); }

void kiln__str_printf(kiln__str *s, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        kiln__str_add(s, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        kiln__str_free(s);
        s->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    kiln__str_add(s, big, (size_t)n);
    free(big);
}

char *kiln__str_take(kiln__str *s)
{
    if (s->oom) return NULL;
    if (!s->p) kiln__str_add(s, "", 0);
    char *p = s->p;
    *s = (kiln__str){0};
    return p;
}

void kiln__str_free(kiln__str *s)
{
    free(s->p);
    *s = (kiln__str){0};
}

char *kiln__strdup(const char *s)
{
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = kiln__fault("malloc") ? NULL : malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

uint64_t kiln__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void kiln__hex(const void *bytes, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *b = bytes;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = 0;
}

void kiln__hash128(const void *data, size_t n, char out[33])
{
    XXH128_hash_t h = XXH3_128bits(data, n);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    kiln__hex(c.digest, sizeof c.digest, out);
}

uint64_t kiln__hash64(const void *data, size_t n) { return XXH3_64bits(data, n); }

kiln_status kiln__read_file(const char *path, char **data, size_t *size, kiln__err *e)
{
    *data = NULL;
    *size = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return kiln__fail(e, KILN_STATUS_IO, "read %s: %s", path, strerror(errno));
    kiln__str s = {0};
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) kiln__str_add(&s, buf, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        kiln__str_free(&s);
        return kiln__fail(e, KILN_STATUS_IO, "read %s: I/O error", path);
    }
    size_t len = s.len;
    char *p = kiln__str_take(&s);
    if (!p) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "read %s: out of memory", path);
    *data = p;
    *size = len;
    return KILN_STATUS_OK;
}

/* ---- fault injection ----------------------------------------------------------------------- */

typedef struct fault_site {
    const char *name;
    int countdown; /* 0: disarmed */
} fault_site;

static _Thread_local fault_site faults[] = {{"malloc", 0}, {"sqlite", 0}, {"nvrtc", 0},
                                            {"cuda", 0},   {"nfs", 0},    {"libclang", 0}};

int kiln__fault(const char *site)
{
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        if (faults[i].countdown && !strcmp(faults[i].name, site)) {
            if (--faults[i].countdown == 0) return 1;
            return 0;
        }
    }
    return 0;
}

void kiln__fault_arm(const char *site, int n)
{
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
        if (!strcmp(faults[i].name, site)) faults[i].countdown = n > 0 ? n : 0;
}
