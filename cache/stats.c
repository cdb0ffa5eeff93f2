/*
 * stats.c — what `kiln stats` and `kiln clear` need from the store beyond rows: the counters'
 * reset (`--zero`), the time of the last reset, per-arch totals, and removing every row. The
 * counters themselves come from the hit log (hits.c), folded in before they are read or reset
 * (docs/cache.md, "stats"); nothing here is on the lookup path.
 */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Run sql (no rows expected) inside BEGIN IMMEDIATE ... COMMIT, after the hit log is folded
 * in with fold (KILN__HITS_APPLY or KILN__HITS_DISCARD); what names the step in the message.
 * *changes (may be NULL) gets the rows the statements changed. */
static kiln_status write_txn(kiln__cache *c, const char *what, const char *sql, int fold,
                             int *changes, kiln__err *e)
{
    if (changes) *changes = 0;
    if (c->readonly)
        return kiln__fail(e, KILN_STATUS_IO, "cache %s: %s refused: the cache is read-only (%s)",
                          c->path, what, c->ro_why);
    pthread_mutex_lock(&c->lock);
    kiln__hits_fold_locked(c, fold, -1);
    kiln_status s = KILN_STATUS_OK;
    int64_t before = sqlite3_total_changes64(c->db);
    if (kiln__cache_exec(c, "BEGIN IMMEDIATE") != SQLITE_OK)
        s = kiln__cache_fail(c, e, "%s: begin", what);
    else if (kiln__cache_exec(c, sql) != SQLITE_OK) s = kiln__cache_fail(c, e, "%s", what);
    else if (changes && (*changes = (int)(sqlite3_total_changes64(c->db) - before)) < 0)
        *changes = 0;
    if (!s && kiln__cache_exec(c, "COMMIT") != SQLITE_OK)
        s = kiln__cache_fail(c, e, "%s: commit", what);
    if (s && changes) *changes = 0;
    pthread_mutex_unlock(&c->lock);
    return s;
}

kiln_status kiln__cache_stats_zero(kiln__cache *c, kiln__err *e)
{
    if (!c) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache: zero needs a cache");
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT OR REPLACE INTO stats(k, v) VALUES ('hits', 0), ('misses', 0), "
             "('zeroed', %lld); UPDATE kernels SET hits = 0 WHERE hits != 0;",
             (long long)time(NULL));
    return write_txn(c, "zeroing the counters", sql, KILN__HITS_DISCARD, NULL, e);
}

kiln_status kiln__cache_clear(kiln__cache *c, int *removed, kiln__err *e)
{
    if (removed) *removed = 0;
    if (!c) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache: clear needs a cache");
    return write_txn(c, "removing every entry", "DELETE FROM kernels;", KILN__HITS_APPLY, removed,
                     e);
}

kiln_status kiln__cache_arch_stats(kiln__cache *c, kiln__arch_stats *out, int cap, int *n,
                                   int64_t *zeroed, kiln__err *e)
{
    *n = 0;
    *zeroed = 0;
    if (!c || (!out && cap))
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache: arch stats needs a cache");
    pthread_mutex_lock(&c->lock);
    kiln__hits_fold_locked(c, KILN__HITS_APPLY, -1);
    sqlite3_stmt *st = NULL;
    int rc = kiln__cache_prepare(c,
                                 "SELECT arch, count(*), coalesce(sum(length(cubin)), 0),"
                                 " coalesce(sum(hits), 0) FROM kernels GROUP BY arch ORDER BY arch",
                                 &st);
    while (rc == SQLITE_OK && (rc = kiln__cache_step(c, st)) == SQLITE_ROW) {
        rc = SQLITE_OK;
        if (*n >= cap) continue; /* counted by the caller's cap; the rest are dropped */
        kiln__arch_stats *a = &out[(*n)++];
        const unsigned char *t = sqlite3_column_text(st, 0);
        snprintf(a->arch, sizeof a->arch, "%s", t ? (const char *)t : "");
        a->entries = sqlite3_column_int64(st, 1);
        a->bytes = sqlite3_column_int64(st, 2);
        a->hits = sqlite3_column_int64(st, 3);
    }
    sqlite3_finalize(st);
    if (rc == SQLITE_DONE) {
        rc =
            kiln__cache_prepare(c, "SELECT coalesce(max(v), 0) FROM stats WHERE k = 'zeroed'", &st);
        if (rc == SQLITE_OK && (rc = kiln__cache_step(c, st)) == SQLITE_ROW) {
            *zeroed = sqlite3_column_int64(st, 0);
            rc = SQLITE_DONE;
        }
        sqlite3_finalize(st);
    }
    kiln_status s = rc == SQLITE_DONE ? KILN_STATUS_OK : kiln__cache_fail(c, e, "per-arch stats");
    pthread_mutex_unlock(&c->lock);
    return s;
}
