/*
 * store.c — the rows of the cubin cache: put (one transaction, checksum computed here), get
 * (checksum verified on every load, the lookup recorded in the hit log, hits.c), remove and
 * resolve by key prefix, listing, statistics (the hit log folded in first). Opening and the
 * schema are in schema.c; the format is in docs/cache.md.
 *
 * Every public call takes the handle's mutex for its whole duration: a SQLite transaction
 * belongs to the connection, so two threads must not interleave statements on one handle.
 */
#include "store.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* Columns every read returns, in this order (see read_meta). */
#define META_COLS                                                                                  \
    "spec, arch, nvrtc, registers, smem_bytes, spill_bytes, stack_bytes, compile_ms, created, "    \
    "last_used, hits"
#define META_NCOLS 11

/* ---- helpers ------------------------------------------------------------------------------- */

/* 1 when k is exactly 32 lowercase hex digits. */
static int is_key(const char *k)
{
    if (!k) return 0;
    size_t i = 0;
    for (; k[i]; i++)
        if (i >= 32 || !((k[i] >= '0' && k[i] <= '9') || (k[i] >= 'a' && k[i] <= 'f'))) return 0;
    return i == 32;
}

/* Lowercase a key prefix of 1..32 hex digits into out. */
static kiln_status norm_prefix(const char *p, char out[33], kiln__err *e)
{
    size_t n = p ? strlen(p) : 0;
    int ok = n >= 1 && n <= 32;
    for (size_t i = 0; ok && i < n; i++) {
        ok = isxdigit((unsigned char)p[i]) != 0;
        out[i] = (char)tolower((unsigned char)p[i]);
    }
    if (!ok)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache: '%.40s' is not a key prefix (1 to 32 hex digits)", p ? p : "");
    out[n] = 0;
    return KILN_STATUS_OK;
}

static int bind_text(sqlite3_stmt *st, int i, const char *s)
{
    return sqlite3_bind_text(st, i, s ? s : "", -1, SQLITE_STATIC);
}

/* A malloc'd copy of a text column ("" for NULL); NULL when out of memory. */
static char *dup_col(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return kiln__strdup(t ? (const char *)t : "");
}

/* Fill the META_COLS of en from columns 0..META_NCOLS-1. Returns 0 when out of memory. */
static int read_meta(sqlite3_stmt *st, kiln__entry *en)
{
    en->spec = dup_col(st, 0);
    en->arch = dup_col(st, 1);
    en->nvrtc = dup_col(st, 2);
    en->registers = sqlite3_column_int(st, 3);
    en->smem_bytes = sqlite3_column_int(st, 4);
    en->spill_bytes = sqlite3_column_int(st, 5);
    en->stack_bytes = sqlite3_column_int(st, 6);
    en->compile_ms = sqlite3_column_double(st, 7);
    en->created = sqlite3_column_int64(st, 8);
    en->last_used = sqlite3_column_int64(st, 9);
    en->hits = sqlite3_column_int64(st, 10);
    return en->spec && en->arch && en->nvrtc;
}

/* ---- entries --------------------------------------------------------------------------------- */

void kiln__entry_free(kiln__entry *en)
{
    if (!en) return;
    free(en->spec);
    free(en->arch);
    free(en->nvrtc);
    free(en->key_material);
    free(en->source);
    free(en->log);
    free(en->cubin);
    memset(en, 0, sizeof *en);
}

/* ---- put ------------------------------------------------------------------------------------- */

static kiln_status put_locked(kiln__cache *c, const kiln__entry *en, const char *sum, int64_t now,
                              kiln__err *e)
{
    if (kiln__cache_exec(c, "BEGIN IMMEDIATE") != SQLITE_OK)
        return kiln__cache_fail(c, e, "put %s (%s, %s): begin", en->key, en->spec, en->arch);
    sqlite3_stmt *st = NULL;
    int rc = kiln__cache_prepare(
        c,
        "INSERT OR REPLACE INTO kernels(key, spec, arch, nvrtc, key_material, source, log, "
        "cubin, checksum, registers, smem_bytes, spill_bytes, stack_bytes, compile_ms, created, "
        "last_used, hits, row_sum) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
        "?13, ?14, ?15, ?16, ?17, ?18)",
        &st);
    char seal[33];
    if (rc == SQLITE_OK && !kiln__entry_seal(en, sum, seal)) rc = SQLITE_NOMEM;
    if (rc == SQLITE_OK) rc = bind_text(st, 18, seal);
    if (rc == SQLITE_OK) rc = bind_text(st, 1, en->key);
    if (rc == SQLITE_OK) rc = bind_text(st, 2, en->spec);
    if (rc == SQLITE_OK) rc = bind_text(st, 3, en->arch);
    if (rc == SQLITE_OK) rc = bind_text(st, 4, en->nvrtc);
    if (rc == SQLITE_OK) rc = bind_text(st, 5, en->key_material);
    if (rc == SQLITE_OK) rc = bind_text(st, 6, en->source);
    if (rc == SQLITE_OK) rc = bind_text(st, 7, en->log);
    if (rc == SQLITE_OK) rc = sqlite3_bind_blob64(st, 8, en->cubin, en->cubin_size, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = bind_text(st, 9, sum);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, 10, en->registers);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, 11, en->smem_bytes);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, 12, en->spill_bytes);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, 13, en->stack_bytes);
    if (rc == SQLITE_OK) rc = sqlite3_bind_double(st, 14, en->compile_ms);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 15, en->created ? en->created : now);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 16, en->last_used ? en->last_used : now);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 17, en->hits > 0 ? en->hits : 0);
    if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
    if (rc != SQLITE_DONE) {
        kiln_status s = kiln__cache_fail(c, e, "put %s (%s, %s)", en->key, en->spec, en->arch);
        sqlite3_finalize(st);
        return s;
    }
    sqlite3_finalize(st);
    if (kiln__cache_exec(c, "COMMIT") != SQLITE_OK)
        return kiln__cache_fail(c, e, "put %s (%s, %s): commit", en->key, en->spec, en->arch);
    return KILN_STATUS_OK;
}

kiln_status kiln__cache_put(kiln__cache *c, const kiln__entry *en, kiln__err *e)
{
    if (!c || !en)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache: put needs a cache and an entry");
    if (!is_key(en->key))
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache %s: put refused: key '%.40s' is not 32 lowercase hex digits",
                          c->path, en->key);
    if (!en->cubin || !en->cubin_size)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache %s: put %s refused: the cubin is empty", c->path, en->key);
    if (!en->spec || !*en->spec || !en->arch || !*en->arch)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache %s: put %s refused: spec and arch must be non-empty", c->path,
                          en->key);
    if (c->readonly)
        return kiln__fail(e, KILN_STATUS_IO,
                          "cache %s: put %s refused: the cache is read-only (%s)", c->path, en->key,
                          c->ro_why);
    char sum[33];
    kiln__hash128(en->cubin, en->cubin_size, sum);
    pthread_mutex_lock(&c->lock);
    kiln__hits_fold_locked(c, KILN__HITS_APPLY, -1);
    kiln_status s = put_locked(c, en, sum, (int64_t)time(NULL), e);
    pthread_mutex_unlock(&c->lock);
    return s;
}

/* ---- get ------------------------------------------------------------------------------------- */

static kiln_status get_locked(kiln__cache *c, const char *key, int with_text, kiln__entry *out,
                              kiln__err *e)
{
    sqlite3_stmt *st = NULL;
    /* the texts are read even without with_text: the row checksum covers them */
    const char *sql = c->sealed ? "SELECT " META_COLS ", cubin, checksum, key_material, source, "
                                  "log, row_sum FROM kernels WHERE key = ?1"
                                : "SELECT " META_COLS ", cubin, checksum, key_material, source, "
                                  "log, '' FROM kernels WHERE key = ?1";
    int rc = kiln__cache_prepare(c, sql, &st);
    if (rc == SQLITE_OK) rc = bind_text(st, 1, key);
    if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
    if (rc == SQLITE_DONE) {
        sqlite3_finalize(st);
        kiln__hits_append(c, NULL, (int64_t)time(NULL));
        return kiln__fail(e, KILN_STATUS_NOT_FOUND, "cache %s: no entry %s", c->path, key);
    }
    if (rc != SQLITE_ROW) {
        kiln_status s = kiln__cache_fail(c, e, "get %s", key);
        sqlite3_finalize(st);
        return s;
    }
    memcpy(out->key, key, 33);
    int ok = read_meta(st, out);
    const void *blob = sqlite3_column_blob(st, META_NCOLS);
    size_t size = (size_t)sqlite3_column_bytes(st, META_NCOLS);
    if (ok && size) {
        out->cubin = kiln__fault("malloc") ? NULL : malloc(size);
        ok = out->cubin != NULL;
        if (ok) {
            memcpy(out->cubin, blob, size);
            out->cubin_size = size;
        }
    }
    char stored[33], computed[33] = "(empty cubin)";
    const unsigned char *sum = sqlite3_column_text(st, META_NCOLS + 1);
    snprintf(stored, sizeof stored, "%s", sum ? (const char *)sum : "");
    char row_sum[33];
    const unsigned char *rs = sqlite3_column_text(st, META_NCOLS + 5);
    snprintf(row_sum, sizeof row_sum, "%s", rs ? (const char *)rs : "");
    if (ok) {
        out->key_material = dup_col(st, META_NCOLS + 2);
        out->source = dup_col(st, META_NCOLS + 3);
        out->log = dup_col(st, META_NCOLS + 4);
        ok = out->key_material && out->source && out->log;
    }
    sqlite3_finalize(st);
    if (!ok) {
        kiln__entry_free(out);
        return kiln__fail(e, KILN_STATUS_NO_MEMORY, "cache %s: get %s: out of memory", c->path,
                          key);
    }
    if (out->cubin_size) kiln__hash128(out->cubin, out->cubin_size, computed);
    if (!out->cubin_size || strcmp(stored, computed) != 0) {
        kiln_status s = kiln__fail(e, KILN_STATUS_CACHE,
                                   "cache %s: entry %s (%s, %s) failed its checksum: stored %s, "
                                   "computed %s; not loaded",
                                   c->path, key, out->spec, out->arch, stored, computed);
        kiln__entry_free(out);
        kiln__hits_append(c, NULL, (int64_t)time(NULL)); /* the caller recompiles: a miss */
        return s;
    }
    /* the row checksum: every field the cubin's checksum does not cover (a file that predates
     * it, read as it is, has none) */
    char seal[33] = "";
    if (c->sealed && (!kiln__entry_seal(out, computed, seal) || strcmp(seal, row_sum) != 0)) {
        kiln_status s = kiln__fail(e, KILN_STATUS_CACHE,
                                   "cache %s: entry %s (%s, %s) failed its row checksum: stored "
                                   "'%s', computed %s (the row was changed after it was "
                                   "stored); not loaded",
                                   c->path, key, out->spec, out->arch, row_sum,
                                   seal[0] ? seal : "(out of memory)");
        kiln__entry_free(out);
        kiln__hits_append(c, NULL, (int64_t)time(NULL));
        return s;
    }
    if (!with_text) {
        free(out->key_material);
        free(out->source);
        free(out->log);
        out->key_material = out->source = out->log = NULL;
    }
    int64_t now = (int64_t)time(NULL);
    if (kiln__hits_append(c, key, now)) {
        if (out->hits < INT64_MAX) out->hits++; /* a stored count may be anything */
        out->last_used = now;
    }
    return KILN_STATUS_OK;
}

kiln_status kiln__cache_get(kiln__cache *c, const char *key, int with_text, kiln__entry *out,
                            kiln__err *e)
{
    if (out) memset(out, 0, sizeof *out);
    if (!c || !out)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache: get needs a cache and an entry");
    if (!is_key(key))
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache %s: get: key '%.40s' is not 32 lowercase hex digits", c->path,
                          key ? key : "");
    pthread_mutex_lock(&c->lock);
    kiln_status s = get_locked(c, key, with_text, out, e);
    pthread_mutex_unlock(&c->lock);
    return s;
}

/* ---- remove, resolve ------------------------------------------------------------------------- */

kiln_status kiln__cache_remove(kiln__cache *c, const char *prefix, int *removed, kiln__err *e)
{
    if (removed) *removed = 0;
    if (!c) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache: remove needs a cache");
    char p[33];
    kiln_status s = norm_prefix(prefix, p, e);
    if (s) return s;
    if (c->readonly)
        return kiln__fail(e, KILN_STATUS_IO,
                          "cache %s: remove %s refused: the cache is read-only (%s)", c->path, p,
                          c->ro_why);
    pthread_mutex_lock(&c->lock);
    sqlite3_stmt *st = NULL;
    int rc = kiln__cache_prepare(c, "DELETE FROM kernels WHERE substr(key, 1, ?2) = ?1", &st);
    if (rc == SQLITE_OK) rc = bind_text(st, 1, p);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, 2, (int)strlen(p));
    if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
    if (rc == SQLITE_DONE) {
        if (removed) *removed = sqlite3_changes(c->db);
    } else {
        s = kiln__cache_fail(c, e, "remove %s", p);
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&c->lock);
    return s;
}

kiln_status kiln__cache_resolve(kiln__cache *c, const char *prefix, char key[33], kiln__err *e)
{
    if (key) key[0] = 0;
    if (!c || !key)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache: resolve needs a cache and a buffer");
    char p[33];
    kiln_status s = norm_prefix(prefix, p, e);
    if (s) return s;
    pthread_mutex_lock(&c->lock);
    sqlite3_stmt *st = NULL;
    int rc =
        kiln__cache_prepare(c,
                            "SELECT count(*), min(key) FROM kernels WHERE substr(key, 1, ?2) = ?1",
                            &st);
    if (rc == SQLITE_OK) rc = bind_text(st, 1, p);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(st, 2, (int)strlen(p));
    if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
    if (rc != SQLITE_ROW) {
        s = kiln__cache_fail(c, e, "resolve %s", p);
    } else {
        int64_t n = sqlite3_column_int64(st, 0);
        const unsigned char *k = sqlite3_column_text(st, 1);
        if (n == 0)
            s = kiln__fail(e, KILN_STATUS_NOT_FOUND, "cache %s: no cache entry matches '%s'",
                           c->path, p);
        else if (n > 1)
            s = kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                           "cache %s: prefix '%s' is ambiguous: %lld entries match", c->path, p,
                           (long long)n);
        else snprintf(key, 33, "%s", k ? (const char *)k : "");
    }
    sqlite3_finalize(st);
    pthread_mutex_unlock(&c->lock);
    return s;
}

/* ---- each, stats ----------------------------------------------------------------------------- */

typedef struct entry_list {
    kiln__entry *v;
    size_t n, cap;
} entry_list;

static void list_free(entry_list *l)
{
    for (size_t i = 0; i < l->n; i++) kiln__entry_free(&l->v[i]);
    free(l->v);
    *l = (entry_list){0};
}

/* Read every row (no cubin, no texts) into *l, most recently used first. */
static kiln_status collect(kiln__cache *c, entry_list *l, kiln__err *e)
{
    sqlite3_stmt *st = NULL;
    int rc = kiln__cache_prepare(c,
                                 "SELECT " META_COLS ", length(cubin), key FROM kernels "
                                 "ORDER BY last_used DESC, key",
                                 &st);
    while (rc == SQLITE_OK && (rc = kiln__cache_step(c, st)) == SQLITE_ROW) {
        rc = SQLITE_OK; /* a break below leaves SQLITE_ROW: out of memory */
        if (l->n == l->cap) {
            size_t cap = l->cap ? 2 * l->cap : 64;
            kiln__entry *v = kiln__fault("malloc") ? NULL : realloc(l->v, cap * sizeof *v);
            if (!v) {
                rc = SQLITE_ROW;
                break;
            }
            l->v = v;
            l->cap = cap;
        }
        kiln__entry *en = &l->v[l->n++];
        memset(en, 0, sizeof *en);
        int ok = read_meta(st, en);
        en->cubin_size = (size_t)sqlite3_column_int64(st, META_NCOLS);
        const unsigned char *k = sqlite3_column_text(st, META_NCOLS + 1);
        snprintf(en->key, sizeof en->key, "%s", k ? (const char *)k : "");
        if (!ok) {
            rc = SQLITE_ROW;
            break;
        }
    }
    kiln_status s = KILN_STATUS_OK;
    if (rc == SQLITE_ROW)
        s = kiln__fail(e, KILN_STATUS_NO_MEMORY, "cache %s: listing: out of memory", c->path);
    else if (rc != SQLITE_DONE) s = kiln__cache_fail(c, e, "listing");
    sqlite3_finalize(st);
    return s;
}

kiln_status kiln__cache_each(kiln__cache *c, kiln__cache_visit fn, void *user, kiln__err *e)
{
    if (!c || !fn)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache: each needs a cache and a function");
    entry_list l = {0};
    pthread_mutex_lock(&c->lock);
    kiln__hits_fold_locked(c, KILN__HITS_APPLY, -1);
    kiln_status s = collect(c, &l, e);
    pthread_mutex_unlock(&c->lock);
    /* fn runs without the lock held, so it may call back into the cache. */
    for (size_t i = 0; !s && i < l.n; i++)
        if (fn(&l.v[i], user)) break;
    list_free(&l);
    return s;
}

/* Size of path in bytes, 0 when it does not exist. */
static int64_t file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (int64_t)sb.st_size : 0;
}

static kiln_status stats_locked(kiln__cache *c, kiln__cache_stats *out, kiln__err *e)
{
    sqlite3_stmt *st = NULL; /* one statement: one consistent snapshot */
    int rc = kiln__cache_prepare(c,
                                 "SELECT (SELECT count(*) FROM kernels),"
                                 " (SELECT coalesce(sum(length(cubin)), 0) FROM kernels),"
                                 " (SELECT coalesce(max(v), 0) FROM stats WHERE k = 'hits'),"
                                 " (SELECT coalesce(max(v), 0) FROM stats WHERE k = 'misses')",
                                 &st);
    if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
    if (rc != SQLITE_ROW) {
        kiln_status s = kiln__cache_fail(c, e, "stats");
        sqlite3_finalize(st);
        return s;
    }
    out->entries = sqlite3_column_int64(st, 0);
    out->bytes = sqlite3_column_int64(st, 1);
    out->hits = sqlite3_column_int64(st, 2);
    out->misses = sqlite3_column_int64(st, 3);
    sqlite3_finalize(st);
    return KILN_STATUS_OK;
}

kiln_status kiln__cache_stats_get(kiln__cache *c, kiln__cache_stats *out, kiln__err *e)
{
    if (out) memset(out, 0, sizeof *out);
    if (!c || !out)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache: stats needs a cache and an output");
    pthread_mutex_lock(&c->lock);
    kiln__hits_fold_locked(c, KILN__HITS_APPLY, -1);
    kiln_status s = stats_locked(c, out, e);
    pthread_mutex_unlock(&c->lock);
    if (s) {
        memset(out, 0, sizeof *out);
        return s;
    }
    char wal[KILN__CACHE_PATH_MAX + 8];
    snprintf(wal, sizeof wal, "%s-wal", c->path);
    out->file_bytes = file_size(c->path) + file_size(wal);
    if (!c->readonly) kiln__hits_problem(c, out->hit_log, sizeof out->hit_log);
    return KILN_STATUS_OK;
}
