/*
 * policy.c — what a context does around its cache, from kiln_ctx_opts and the environment:
 * strict mode (a miss is an error, nothing compiles), record mode (every kernel requested is
 * appended to a manifest `kiln warm` replays), the read-only base cache under the local one,
 * and the LRU size bound. Resolved once in kiln_ctx_create; docs/fleet.md describes them.
 *
 *   KILN_STRICT=1             strict (any value but "" and "0")
 *   KILN_RECORD=<file>        record into <file>
 *   KILN_BASE_CACHE_DIR=<dir> base cache <dir>/kernels.db
 *   KILN_CACHE_MAX_BYTES=<n>  size bound (512M, 2G, ...)
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime.h"

/* A record line: "<spec> arch=<arch>\n". */
#define RECORD_LINE_MAX (KILN__SPEC_MAX + 32)

/* The header written once at the top of a new record manifest. */
static const char record_header[] =
    "# kiln record manifest: one line per kernel requested (spec and arch).\n"
    "# Replay with: kiln warm RECORD_FILE   (docs/fleet.md)\n";

/* The value of environment variable name, or NULL when unset or empty. */
static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Open path for appending (creating it 0644 with the header when new). */
static kiln_status record_open(kiln_ctx *ctx, const char *path, kiln__err *e)
{
    int n = snprintf(ctx->record_path, sizeof ctx->record_path, "%s", path);
    if (n < 0 || (size_t)n >= sizeof ctx->record_path)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "record mode: path %.200s... is too long", path);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
        ssize_t w = write(fd, record_header, sizeof record_header - 1);
        (void)w; /* the header is a courtesy; the lines are what counts */
    } else if (errno == EEXIST) {
        fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    }
    if (fd < 0)
        return kiln__fail(e, KILN_STATUS_IO, "record mode: cannot open %s for appending: %s", path,
                          strerror(errno));
    ctx->record_fd = fd;
    return KILN_STATUS_OK;
}

kiln_status kiln__ctx_record(kiln_ctx *ctx, const char *spec, const char *arch, kiln__err *e)
{
    char line[RECORD_LINE_MAX];
    int n = snprintf(line, sizeof line, "%s arch=%s\n", spec, arch);
    if (n < 0 || (size_t)n >= sizeof line)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "record mode: spec too long: %.100s",
                          spec);
    /* One write of a short line with O_APPEND: lines of several processes never interleave. */
    ssize_t w = write(ctx->record_fd, line, (size_t)n);
    if (w != n)
        return kiln__fail(e, KILN_STATUS_IO, "record mode: appending %s (%s) to %s failed: %s",
                          spec, arch, ctx->record_path, w < 0 ? strerror(errno) : "short write");
    return KILN_STATUS_OK;
}

/* Decide strict and record from the mode and the environment. */
static kiln_status resolve_mode(kiln_ctx *ctx, const kiln_ctx_opts *o, kiln__err *e)
{
    const char *strict_env = env("KILN_STRICT"), *record = NULL;
    switch (o->mode) {
        case KILN_CACHE_MODE_DEFAULT:
            ctx->strict = strict_env && strcmp(strict_env, "0") != 0;
            if (env("KILN_RECORD")) record = o->record_path ? o->record_path : env("KILN_RECORD");
            break;
        case KILN_CACHE_MODE_COMPILE:
            break;
        case KILN_CACHE_MODE_STRICT:
            ctx->strict = 1;
            break;
        case KILN_CACHE_MODE_RECORD:
            record = o->record_path ? o->record_path : env("KILN_RECORD");
            if (!record)
                return kiln__fail(
                    e, KILN_STATUS_INVALID_ARGUMENT,
                    "record mode needs a manifest path: set record_path or KILN_RECORD");
            break;
        default:
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "mode %d is not a kiln_cache_mode",
                              (int)o->mode);
    }
    return record ? record_open(ctx, record, e) : KILN_STATUS_OK;
}

/* The size bound: the option, else $KILN_CACHE_MAX_BYTES, else none. */
static kiln_status resolve_bound(kiln_ctx *ctx, const kiln_ctx_opts *o, kiln__err *e)
{
    if (o->max_cache_bytes < 0)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "max_cache_bytes %lld: expected > 0, or 0 for $KILN_CACHE_MAX_BYTES",
                          (long long)o->max_cache_bytes);
    ctx->max_bytes = o->max_cache_bytes;
    const char *v = env("KILN_CACHE_MAX_BYTES");
    if (!ctx->max_bytes && v) {
        kiln_status st = kiln__cache_parse_size(v, &ctx->max_bytes, e);
        if (st) {
            kiln__err_prefix(e, "KILN_CACHE_MAX_BYTES");
            return st;
        }
    }
    return KILN_STATUS_OK;
}

kiln_status kiln__ctx_policy(kiln_ctx *ctx, const kiln_ctx_opts *o, kiln__err *e)
{
    kiln_status st = resolve_mode(ctx, o, e);
    if (!st) st = resolve_bound(ctx, o, e);
    if (st) return st;
    const char *base = o->base_cache_dir ? o->base_cache_dir : env("KILN_BASE_CACHE_DIR");
    if (base && !o->no_cache) {
        if ((st = kiln__cache_open_ex(base, KILN__CACHE_RDONLY, &ctx->base, e))) {
            kiln__err_prefix(e, "base cache");
            return st;
        }
        snprintf(ctx->base_path, sizeof ctx->base_path, "%s", kiln__cache_path(ctx->base));
    }
    return KILN_STATUS_OK;
}

void kiln__ctx_policy_free(kiln_ctx *ctx)
{
    if (ctx->record_fd >= 0) close(ctx->record_fd);
    ctx->record_fd = -1;
    kiln__cache_close(ctx->base);
    ctx->base = NULL;
}
