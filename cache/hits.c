/*
 * hits.c — the hit log: how a lookup records itself without writing the database. A hit (or a
 * miss) appends one 64-byte record to <db>-hits beside the file (one open, write and close, no
 * lock, no fsync); the counters in the database (kernels.hits, kernels.last_used, stats) take
 * the records in a fold, one write transaction run by whatever already writes or reads the
 * counters (a store, eviction, compaction, stats, listing, scans) and by a lookup that finds
 * the log past FOLD_BYTES. docs/cache.md ("stats") has the format and what it trades.
 *
 * A fold holds the database's write lock (BEGIN IMMEDIATE) while it takes the log: it renames
 * the log aside, reads it and removes it, then applies the records and commits, so two folds
 * never read the same records and a crash loses counts, never doubles them. Records are
 * best effort like the counters they feed: a lookup whose append fails is not counted, and one
 * appended while a fold takes the file may be lost.
 */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* One record of the log, 64 bytes, the host's byte order (the log never leaves the host). */
typedef struct hit_rec {
    char magic[4];  /* REC_MAGIC */
    uint32_t kind;  /* REC_HIT or REC_MISS */
    int64_t when;   /* unix seconds */
    char key[32];   /* the row's key (a hit), zeros (a miss) */
    uint64_t spare; /* 0 */
    uint64_t sum;   /* kiln__hash64 of the 56 bytes above */
} hit_rec;

_Static_assert(sizeof(hit_rec) == 64, "a hit record is 64 bytes");

#define REC_MAGIC "KHT1"
enum { REC_HIT = 1, REC_MISS = 2 };

/* A lookup that leaves the log at least this long folds it (16384 records). */
#define FOLD_BYTES (1 << 20)
/* A fold reads at most this much of a log; the rest is dropped (a log that long was not
 * written by kiln's lookups between two folds). */
#define FOLD_MAX_BYTES (16 << 20)
/* A stamp more than this far in the future is not believed (a clock set wrong). */
#define FUTURE_SLACK_S (24 * 3600)

/* One key's share of a fold. */
typedef struct key_count {
    char key[33];
    int64_t n, last;
} key_count;

/* ---- helpers ------------------------------------------------------------------------------- */

static void log_path(const kiln__cache *c, char *out, size_t cap, const char *suffix)
{
    snprintf(out, cap, "%s-hits%s", c->path, suffix);
}

static int is_hex_key(const char *k)
{
    for (int i = 0; i < 32; i++)
        if (!((k[i] >= '0' && k[i] <= '9') || (k[i] >= 'a' && k[i] <= 'f'))) return 0;
    return 1;
}

/* 1 when r is a whole, untampered record of a kind this kiln writes. */
static int rec_ok(const hit_rec *r, int64_t now)
{
    if (memcmp(r->magic, REC_MAGIC, 4) != 0) return 0;
    if (r->sum != kiln__hash64(r, offsetof(hit_rec, sum))) return 0;
    if (r->kind != REC_HIT && r->kind != REC_MISS) return 0;
    if (r->when <= 0 || r->when > now + FUTURE_SLACK_S) return 0;
    return r->kind == REC_MISS || is_hex_key(r->key);
}

static int by_key(const void *a, const void *b)
{
    return memcmp(((const hit_rec *)a)->key, ((const hit_rec *)b)->key, 32);
}

/* Rename the log aside, read it (up to FOLD_MAX_BYTES) into *buf and remove it. Runs with the
 * write lock held. Returns 0 and *n = 0 when there is no log; -1 when it cannot be taken. */
static int take(kiln__cache *c, unsigned char **buf, size_t *n)
{
    char live[KILN__CACHE_PATH_MAX + 16], aside[KILN__CACHE_PATH_MAX + 24];
    log_path(c, live, sizeof live, "");
    log_path(c, aside, sizeof aside, "-fold");
    *buf = NULL;
    *n = 0;
    struct stat ls;
    if (lstat(live, &ls) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISREG(ls.st_mode)) { /* a link, FIFO or directory is left as it is */
        errno = EINVAL;
        return -1;
    }
    if (lstat(aside, &ls) == 0 && (S_ISDIR(ls.st_mode) ? rmdir(aside) : unlink(aside)) != 0)
        return -1; /* a fold that died between the rename and the unlink left it */
    if (rename(live, aside) != 0) return errno == ENOENT ? 0 : -1;
    int fd = open(aside, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    unlink(aside);
    if (fd < 0) return -1;
    struct stat sb;
    int ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
    size_t size = ok ? (size_t)(sb.st_size < FOLD_MAX_BYTES ? sb.st_size : FOLD_MAX_BYTES) : 0;
    unsigned char *b = ok && size ? malloc(size) : NULL;
    size_t got = 0;
    while (b && got < size) {
        ssize_t r = read(fd, b + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (!ok || (size && !b)) {
        free(b);
        return -1;
    }
    *buf = b;
    *n = got;
    return 0;
}

/* The valid hit records of buf[n] into recs (sorted by key), counted into *nrec, and the
 * valid misses counted into *misses. A record that fails its checks is skipped by a byte at a
 * time until the next one that passes (a torn append shifts the rest). */
static void parse(const unsigned char *buf, size_t n, int64_t now, hit_rec *recs, size_t *nrec,
                  int64_t *misses)
{
    *nrec = 0;
    *misses = 0;
    for (size_t at = 0; at + sizeof(hit_rec) <= n;) {
        hit_rec r;
        memcpy(&r, buf + at, sizeof r);
        if (!rec_ok(&r, now)) {
            at++;
            continue;
        }
        at += sizeof r;
        if (r.kind == REC_MISS) ++*misses;
        else recs[(*nrec)++] = r;
    }
    qsort(recs, *nrec, sizeof *recs, by_key);
}

/* Apply the sorted hit records recs[n] and misses to the counters, inside the caller's
 * transaction. Returns a SQLite result code. */
static int apply(kiln__cache *c, const hit_rec *recs, size_t n, int64_t misses)
{
    sqlite3_stmt *st = NULL;
    int rc = n ? kiln__cache_prepare(c,
                                     "UPDATE kernels SET hits = hits + ?2, "
                                     "last_used = max(last_used, ?3) WHERE key = ?1",
                                     &st)
               : SQLITE_OK;
    for (size_t i = 0; rc == SQLITE_OK && i < n;) {
        key_count k = {{0}, 0, 0};
        memcpy(k.key, recs[i].key, 32);
        for (; i < n && memcmp(recs[i].key, k.key, 32) == 0; i++) {
            k.n++;
            if (recs[i].when > k.last) k.last = recs[i].when;
        }
        sqlite3_reset(st);
        rc = sqlite3_bind_text(st, 1, k.key, 32, SQLITE_TRANSIENT);
        if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 2, k.n);
        if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 3, k.last);
        if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    const char *bump = "INSERT INTO stats(k, v) VALUES (?1, ?2) "
                       "ON CONFLICT(k) DO UPDATE SET v = v + excluded.v";
    for (int which = 0; rc == SQLITE_OK && which < 2; which++) {
        int64_t add = which ? misses : (int64_t)n;
        if (!add) continue;
        rc = kiln__cache_prepare(c, bump, &st);
        if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, 1, which ? "misses" : "hits", -1, NULL);
        if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 2, add);
        if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
        sqlite3_finalize(st);
    }
    return rc;
}

/* ---- internal API ---------------------------------------------------------------------------- */

int kiln__hits_append(kiln__cache *c, const char *key, int64_t now)
{
    if (c->readonly) return 0;
    hit_rec r;
    memset(&r, 0, sizeof r);
    memcpy(r.magic, REC_MAGIC, 4);
    r.kind = key ? REC_HIT : REC_MISS;
    r.when = now;
    if (key) memcpy(r.key, key, 32);
    r.sum = kiln__hash64(&r, offsetof(hit_rec, sum));
    char live[KILN__CACHE_PATH_MAX + 16];
    log_path(c, live, sizeof live, "");
    int fd = open(live, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0) return 0;
    struct stat sb;
    int ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
    if (ok && sb.st_size == 0 && (sb.st_mode & 0777) != c->file_mode)
        (void)fchmod(fd, c->file_mode); /* a new log: the file's mode, whatever the umask */
    ok = ok && write(fd, &r, sizeof r) == sizeof r;
    int full = ok && fstat(fd, &sb) == 0 && sb.st_size >= FOLD_BYTES;
    close(fd);
    if (full) kiln__hits_fold_locked(c, KILN__HITS_APPLY, KILN__CACHE_BUMP_BUSY_MS);
    return ok;
}

int kiln__hits_fold_locked(kiln__cache *c, int mode, int busy_ms)
{
    if (c->readonly) return 0;
    char live[KILN__CACHE_PATH_MAX + 16];
    log_path(c, live, sizeof live, "");
    struct stat sb;
    if (lstat(live, &sb) != 0) { /* nothing logged: no transaction */
        c->fold_why[0] = 0;
        return 0;
    }
    if (busy_ms >= 0) sqlite3_busy_timeout(c->db, busy_ms);
    int folded = -1;
    if (kiln__cache_exec(c, "BEGIN IMMEDIATE") != SQLITE_OK) {
        snprintf(c->fold_why, sizeof c->fold_why, "taking the write lock: %s", kiln__cache_why(c));
    } else {
        unsigned char *buf = NULL;
        size_t n = 0;
        int taken = take(c, &buf, &n);
        int rc = taken == 0 ? SQLITE_OK : SQLITE_IOERR;
        if (taken) snprintf(c->fold_why, sizeof c->fold_why, "reading it: %s", strerror(errno));
        hit_rec *recs = n ? malloc(n / sizeof(hit_rec) * sizeof(hit_rec) + sizeof(hit_rec)) : NULL;
        if (rc == SQLITE_OK && n && !recs) rc = SQLITE_NOMEM;
        size_t nrec = 0;
        int64_t misses = 0;
        if (rc == SQLITE_OK && n) parse(buf, n, (int64_t)time(NULL), recs, &nrec, &misses);
        if (rc == SQLITE_OK && mode == KILN__HITS_APPLY) rc = apply(c, recs, nrec, misses);
        free(recs);
        free(buf);
        if (rc == SQLITE_OK) rc = kiln__cache_exec(c, "COMMIT");
        if (rc == SQLITE_OK) {
            folded = (int)(nrec + (size_t)misses);
            c->fold_why[0] = 0;
        } else {
            if (!taken)
                snprintf(c->fold_why, sizeof c->fold_why, "applying it: %s", kiln__cache_why(c));
            kiln__cache_rollback(c);
        }
    }
    if (busy_ms >= 0) sqlite3_busy_timeout(c->db, KILN__CACHE_BUSY_MS);
    return folded;
}

void kiln__hits_problem(kiln__cache *c, char *out, size_t cap)
{
    char live[KILN__CACHE_PATH_MAX + 16];
    log_path(c, live, sizeof live, "");
    struct stat sb;
    out[0] = 0;
    if (lstat(live, &sb) == 0 && !S_ISREG(sb.st_mode))
        snprintf(out, cap, "%s is %s, not a regular file: lookups are not counted (remove it)",
                 live,
                 S_ISLNK(sb.st_mode)    ? "a symbolic link"
                 : S_ISDIR(sb.st_mode)  ? "a directory"
                 : S_ISFIFO(sb.st_mode) ? "a FIFO"
                                        : "a special file");
    else if (c->fold_why[0])
        snprintf(out, cap, "folding %s failed (%s); its records wait for the next fold", live,
                 c->fold_why);
}

int kiln__cache_fold_hits(kiln__cache *c)
{
    if (!c) return -1;
    pthread_mutex_lock(&c->lock);
    int n = kiln__hits_fold_locked(c, KILN__HITS_APPLY, -1);
    pthread_mutex_unlock(&c->lock);
    return n;
}
