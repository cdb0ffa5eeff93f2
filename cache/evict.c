/*
 * evict.c — the cache's size bound: least-recently-used eviction by the last_used stamp that
 * every hit and store writes, and the parser of sizes ("512M") shared by the context options,
 * $KILN_CACHE_MAX_BYTES and the CLI's --max-size. The bound counts cubin bytes; sources and
 * logs ride along with their row.
 */
#include "store.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* One row that may go: its key and cubin size. */
typedef struct victim {
    char key[33];
    int64_t bytes;
} victim;

/* Read the total, then the rows oldest first until enough are listed to get under max_bytes.
 * *v is malloc'd. Returns a SQLite code. */
static int pick(kiln__cache *c, int64_t max_bytes, const char *keep, victim **v, int *n,
                int64_t *total)
{
    sqlite3_stmt *st = NULL;
    int rc = kiln__cache_prepare(c, "SELECT coalesce(sum(length(cubin)), 0) FROM kernels", &st);
    if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
    if (rc == SQLITE_ROW) *total = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW) return rc;
    if (*total <= max_bytes) return SQLITE_OK;
    rc = kiln__cache_prepare(c,
                             "SELECT key, length(cubin) FROM kernels"
                             " ORDER BY last_used, created, key",
                             &st);
    int64_t left = *total;
    int cap = 0;
    while (rc == SQLITE_OK && left > max_bytes && (rc = kiln__cache_step(c, st)) == SQLITE_ROW) {
        rc = SQLITE_OK;
        const unsigned char *k = sqlite3_column_text(st, 0);
        if (!k || (keep && !strcmp((const char *)k, keep))) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 32;
            victim *nv = kiln__fault("malloc") ? NULL : realloc(*v, (size_t)cap * sizeof *nv);
            if (!nv) {
                rc = SQLITE_NOMEM;
                break;
            }
            *v = nv;
        }
        victim *x = &(*v)[(*n)++];
        snprintf(x->key, sizeof x->key, "%s", (const char *)k);
        x->bytes = sqlite3_column_int64(st, 1);
        left -= x->bytes;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static kiln_status evict_locked(kiln__cache *c, int64_t max_bytes, const char *keep, int *removed,
                                int64_t *freed, kiln__err *e)
{
    victim *v = NULL;
    int n = 0;
    int64_t total = 0;
    if (kiln__cache_exec(c, "BEGIN IMMEDIATE") != SQLITE_OK)
        return kiln__cache_fail(c, e, "evicting to %lld bytes: begin", (long long)max_bytes);
    int rc = pick(c, max_bytes, keep, &v, &n, &total);
    for (int i = 0; rc == SQLITE_OK && i < n; i++) {
        sqlite3_stmt *st = NULL;
        rc = kiln__cache_prepare(c, "DELETE FROM kernels WHERE key = ?1", &st);
        if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, 1, v[i].key, -1, SQLITE_STATIC);
        if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
        sqlite3_finalize(st);
        if (rc == SQLITE_OK) {
            ++*removed;
            *freed += v[i].bytes;
        }
    }
    free(v);
    if (rc != SQLITE_OK) {
        *removed = 0;
        *freed = 0;
        return kiln__cache_fail(c, e, "evicting to %lld bytes", (long long)max_bytes);
    }
    if (kiln__cache_exec(c, "COMMIT") != SQLITE_OK) {
        *removed = 0;
        *freed = 0;
        return kiln__cache_fail(c, e, "evicting to %lld bytes: commit", (long long)max_bytes);
    }
    return KILN_STATUS_OK;
}

kiln_status kiln__cache_evict(kiln__cache *c, int64_t max_bytes, const char *keep, int *removed,
                              int64_t *freed, kiln__err *e)
{
    int r = 0;
    int64_t f = 0;
    if (removed) *removed = 0;
    if (freed) *freed = 0;
    if (!c || max_bytes < 0)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache: evict needs a cache and a bound >= 0");
    if (c->readonly)
        return kiln__fail(e, KILN_STATUS_IO, "cache %s: cannot evict: the cache is read-only (%s)",
                          c->path, c->ro_why);
    pthread_mutex_lock(&c->lock);
    kiln__hits_fold_locked(c, KILN__HITS_APPLY, -1); /* the latest last_used stamps */
    kiln_status s = evict_locked(c, max_bytes, keep, &r, &f, e);
    pthread_mutex_unlock(&c->lock);
    if (removed) *removed = r;
    if (freed) *freed = f;
    return s;
}

kiln_status kiln__cache_compact(kiln__cache *c, int vacuum, kiln__err *e)
{
    if (!c) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache: compact needs a cache");
    if (c->readonly)
        return kiln__fail(e, KILN_STATUS_IO,
                          "cache %s: cannot compact: the cache is read-only (%s)", c->path,
                          c->ro_why);
    kiln_status s = KILN_STATUS_OK;
    pthread_mutex_lock(&c->lock);
    kiln__hits_fold_locked(c, KILN__HITS_APPLY, -1);
    if (vacuum && kiln__cache_exec(c, "VACUUM") != SQLITE_OK) s = kiln__cache_fail(c, e, "vacuum");
    if (!s && kiln__cache_exec(c, "PRAGMA wal_checkpoint(TRUNCATE)") != SQLITE_OK)
        s = kiln__cache_fail(c, e, "checkpointing the WAL");
    pthread_mutex_unlock(&c->lock);
    return s;
}

kiln_status kiln__cache_parse_size(const char *s, int64_t *out, kiln__err *e)
{
    if (out) *out = 0;
    const char *p = s;
    if (!s || !out || !isdigit((unsigned char)*p))
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "size '%.40s': expected digits with an optional K, M, G or T suffix "
                          "(e.g. 512M)",
                          s ? s : "");
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(p, &end, 10);
    int shift = 0;
    switch (toupper((unsigned char)*end)) {
        case 'K':
            shift = 10;
            break;
        case 'M':
            shift = 20;
            break;
        case 'G':
            shift = 30;
            break;
        case 'T':
            shift = 40;
            break;
        default:
            break;
    }
    if (shift) end++;
    if (!strcasecmp(end, "ib") && shift) end += 2;
    else if (!strcasecmp(end, "b")) end++;
    if (errno || *end || v > ((unsigned long long)INT64_MAX >> shift))
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "size '%.40s': expected digits with an optional K, M, G or T suffix "
                          "(e.g. 512M), at most 2^63-1 bytes",
                          s);
    *out = (int64_t)(v << shift);
    return KILN_STATUS_OK;
}
