/*
 * store.h — what cache/schema.c (opening, the schema) and cache/store.c (rows) share: the
 * handle, and the few helpers that run a SQLite statement with fault injection and turn a
 * failure into a message "cache <path>: <what> failed: <why>". Private to cache/.
 */
#ifndef KILN_CACHE_STORE_H
#define KILN_CACHE_STORE_H

#include <pthread.h>
#include <sqlite3.h>

#include "cache.h"

/* How long a statement waits for another connection's lock before failing, in ms. */
#define KILN__CACHE_BUSY_MS 10000
/* How long a lookup that folds the hit log waits for the write lock (counters are best
 * effort), in ms. */
#define KILN__CACHE_BUMP_BUSY_MS 100
/* Longest <dir>/kernels.db, with its NUL. */
#define KILN__CACHE_PATH_MAX 4096

/* Leases held by one handle, refreshed by its keeper thread (lease.c). */
typedef struct kiln__lease_keeper {
    pthread_mutex_t lock; /* guards everything below */
    pthread_cond_t wake;  /* signalled to stop the keeper */
    pthread_t thread;
    int running, stop;
    char (*keys)[33]; /* keys whose lease this handle holds */
    int n, cap;
} kiln__lease_keeper;

struct kiln__cache {
    sqlite3 *db;                     /* one connection, opened SQLITE_OPEN_FULLMUTEX */
    pthread_mutex_t lock;            /* held across each operation (transactions are per
                                        connection, so two threads must not interleave) */
    int readonly;                    /* 1: opened read-only; puts and removes are refused */
    int immutable;                   /* 1: opened with SQLite's immutable=1 (no locks) */
    int schema;                      /* schema version of the file (after any migration) */
    int sealed;                      /* 1: kernels has the row_sum column (schema >= 3) */
    int injected;                    /* 1: the last step failed by fault injection */
    unsigned file_mode;              /* the database file's permission bits, which the hit
                                        log takes too (as SQLite gives them to -wal, -shm) */
    char ro_why[256];                /* why the cache is read-only ("" when it is not) */
    char fold_why[200];              /* why the last fold of the hit log failed ("" if not) */
    char path[KILN__CACHE_PATH_MAX]; /* <dir>/kernels.db */
    /* leases (lease.c) */
    char host[64];    /* this host's name */
    char holder[128]; /* "<host>/<pid>/<nonce>": the name this handle's leases carry */
    int lease_ttl;    /* seconds */
    kiln__lease_keeper keeper;
    struct kiln__cache *next_open; /* the process's open handles (lease.c's registry) */
};

/* Fill the lease fields of a new handle (host, holder name, lifetime). lease.c. */
void kiln__lease_init(kiln__cache *c);
/* Stop the keeper thread and forget held leases (before the connection closes). lease.c. */
void kiln__lease_fini(kiln__cache *c);

/* The CREATE TABLE of the leases table (schema.c uses it when creating or migrating). */
#define KILN__LEASES_SQL                                                                           \
    "CREATE TABLE leases(key TEXT PRIMARY KEY, holder TEXT NOT NULL, pid INTEGER NOT NULL,"        \
    " host TEXT NOT NULL, expires INTEGER NOT NULL);"

/* Record a lookup in the hit log (hits.c): a hit on key, a miss when key is NULL. Best effort:
 * returns 1 when the record was appended, 0 when not (a read-only cache, an I/O error). A log
 * past its fold size is folded here. Called with c->lock held. */
int kiln__hits_append(kiln__cache *c, const char *key, int64_t now);

/* What a fold does with the records it takes. */
enum { KILN__HITS_APPLY = 1, KILN__HITS_DISCARD = 2 };

/* Take the hit log into the counters (KILN__HITS_APPLY) or drop it (KILN__HITS_DISCARD) in one
 * write transaction of its own, waiting busy_ms for the write lock (-1: the handle's usual
 * wait). Returns the records taken, 0 when there was no log, -1 when the fold failed (the log
 * is left, or lost if the failure came after it was taken). Called with c->lock held and no
 * transaction open. hits.c. */
int kiln__hits_fold_locked(kiln__cache *c, int mode, int busy_ms);

/* What is wrong with the hit log into out[cap] ("" when nothing): a log that is not a regular
 * file, or c->fold_why. hits.c. */
void kiln__hits_problem(kiln__cache *c, char *out, size_t cap);

/* Give every row of a file being migrated to schema 3 its row checksum, inside the caller's
 * transaction; a row whose cubin fails its checksum keeps "" (kiln verify reports it).
 * Returns a SQLite result code. verify.c. */
int kiln__cache_seal_rows(kiln__cache *c);

/* sqlite3_step(st), unless the "sqlite" fault site fires: then SQLITE_IOERR without running
 * it, and c->injected is set so that kiln__cache_why says so. */
int kiln__cache_step(kiln__cache *c, sqlite3_stmt *st);

/* Prepare one statement (clears c->injected). Returns a SQLite result code. */
int kiln__cache_prepare(kiln__cache *c, const char *sql, sqlite3_stmt **st);

/* Run every statement of sql, discarding rows. Returns SQLITE_OK or the failing code. */
int kiln__cache_exec(kiln__cache *c, const char *sql);

/* Why the last call on c's connection failed: SQLite's message, or the injected fault.
 * Borrowed; valid until the next call on the connection. */
const char *kiln__cache_why(kiln__cache *c);

/* Roll back the open transaction, if any. Never injected; overwrites SQLite's message, so
 * format the error first (kiln__cache_fail does). */
void kiln__cache_rollback(kiln__cache *c);

/* Write "cache <path>: <fmt...> failed: <why>" into e, roll back any open transaction and
 * return KILN_STATUS_CACHE. */
kiln_status kiln__cache_fail(kiln__cache *c, kiln__err *e, const char *fmt, ...) KILN__PRINTF(3, 4);

#endif /* KILN_CACHE_STORE_H */
