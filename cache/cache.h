/*
 * cache.h — the SQLite cubin store: one file, WAL mode, a row per key; compile leases that
 * give single flight across processes; LRU eviction; whole-file verification and scans for
 * merge and export.
 *
 * The cache stores opaque rows and knows no CUDA type; it looks inside a cubin only to check
 * that it is a whole ELF file (kiln__cubin_check). Every write is one transaction; every read
 * verifies the cubin's XXH3 checksum and reports a mismatch instead of returning the blob.
 */
#ifndef KILN_CACHE_H
#define KILN_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kiln.h"
#include "util.h"

/* 2 added the leases table, 3 the row checksum (kernels.row_sum); older files are migrated in
 * place when opened writable. */
#define KILN__CACHE_SCHEMA_VERSION 3

typedef struct kiln__cache kiln__cache;

/* One row. Strings are NUL-terminated and owned by the entry (kiln__entry_free). */
typedef struct kiln__entry {
    char key[33];
    char *spec;         /* canonical spec */
    char *arch;         /* "sm_90a" */
    char *nvrtc;        /* "13.0" */
    char *key_material; /* exact hashed text */
    char *source;       /* generated CUDA source */
    char *log;          /* NVRTC log */
    void *cubin;
    size_t cubin_size;
    int registers, smem_bytes, spill_bytes, stack_bytes;
    double compile_ms;
    int64_t created, last_used; /* unix seconds */
    int64_t hits;
    char checksum[33]; /* filled by kiln__cache_scan: the stored checksum ("" elsewhere) */
    char row_sum[33];  /* filled by kiln__cache_scan: the stored row checksum ("" elsewhere) */
    int unsealed;      /* filled by kiln__cache_scan: 1 when the file predates row checksums
                          (schema < 3, read as it is): row_sum is "" and nothing to check */
} kiln__entry;

/* The row checksum of en: XXH3-128 (32 lowercase hex digits into out[33]) over every stored
 * field but the stamps (created, last_used, hits): key, spec, arch, nvrtc, key material,
 * source, log, the cubin's digest cubin_sum, registers, shared memory, spill, stack and
 * compile time, each length-prefixed. 0 when out of memory (out is then ""). */
int kiln__entry_seal(const kiln__entry *en, const char cubin_sum[33], char out[33]);

void kiln__entry_free(kiln__entry *en);

/* Open (creating if needed, owner-only permissions) <dir>/kernels.db. The directory is created
 * (mode 0700) when missing. A file that is not a kiln cache, or a cache from a newer schema,
 * is refused and left untouched. */
kiln_status kiln__cache_open(const char *dir, kiln__cache **out, kiln__err *e);

/* Flags of kiln__cache_open_ex. */
enum {
    KILN__CACHE_RDONLY = 1,   /* never write a byte, never create anything (a base cache): the
                               file must exist; a version-1 file is read as it is */
    KILN__CACHE_FILE = 2,     /* `where` names the database file itself, not its directory; the
                               directory must exist (it is not created) */
    KILN__CACHE_EXISTING = 4, /* the cache must exist: neither the directory nor the file is
                                 created and an empty file is not initialised (commands that
                                 only read, check or tidy a cache); a missing one is
                                 KILN_STATUS_NOT_FOUND */
};

/* Open a cache: kiln__cache_open's rules, changed by flags. A cache on NFS is refused unless
 * it is opened KILN__CACHE_RDONLY (then it is read as immutable, without locks). */
kiln_status kiln__cache_open_ex(const char *where, int flags, kiln__cache **out, kiln__err *e);
void kiln__cache_close(kiln__cache *c);
const char *kiln__cache_path(const kiln__cache *c);
/* 1 when the handle cannot write; *why (if why is non-NULL) gets the reason, borrowed. */
int kiln__cache_readonly(const kiln__cache *c, const char **why);
/* The file's schema version as read when it was opened (1 for an unmigrated read-only file). */
int kiln__cache_schema(const kiln__cache *c);

/* The default cache directory: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else
 * $HOME/.cache/kiln. Writes into out[cap]. */
kiln_status kiln__cache_default_dir(char *out, size_t cap, kiln__err *e);

/* Look a key up. KILN_STATUS_NOT_FOUND when absent. A row whose cubin fails its checksum is
 * reported as KILN_STATUS_CACHE with a message naming the key, and *out is left empty.
 * A hit or a miss is appended to the hit log (best effort; no database write, so a lookup
 * takes no lock); the counters (hits, last_used, the global hits and misses) take it when the
 * log is next folded (kiln__cache_fold_hits; docs/cache.md, "stats"). The entry returned
 * counts this hit. with_text=0 skips source/log/key_material. */
kiln_status kiln__cache_get(kiln__cache *c, const char *key, int with_text, kiln__entry *out,
                            kiln__err *e);

/* Fold the hit log into the counters now (one write transaction; nothing when there is no
 * log). Every call that reads or writes the counters (put, each, stats, arch stats, evict,
 * compact, scan) folds first; this is for a caller that reads a row's counters by get.
 * Returns the records folded, 0 for none, -1 when the fold failed (best effort, like the
 * counters). */
int kiln__cache_fold_hits(kiln__cache *c);

/* Insert or replace a row (one transaction). The checksum is computed here. */
kiln_status kiln__cache_put(kiln__cache *c, const kiln__entry *en, kiln__err *e);

/* Delete rows whose key starts with prefix (>= 1 char). *removed counts them. */
kiln_status kiln__cache_remove(kiln__cache *c, const char *prefix, int *removed, kiln__err *e);

/* Resolve a key prefix to the full key: NOT_FOUND if none, INVALID_ARGUMENT if ambiguous. */
kiln_status kiln__cache_resolve(kiln__cache *c, const char *prefix, char key[33], kiln__err *e);

/* Call fn for each row (without cubin and texts: spec, arch, sizes, stamps), ordered by
 * last_used descending. fn returns non-zero to stop. */
typedef int (*kiln__cache_visit)(const kiln__entry *en, void *user);
kiln_status kiln__cache_each(kiln__cache *c, kiln__cache_visit fn, void *user, kiln__err *e);

typedef struct kiln__cache_stats {
    int64_t entries;
    int64_t bytes; /* sum of cubin sizes */
    int64_t hits, misses;
    int64_t file_bytes; /* database file size */
    char hit_log[320];  /* "" when the hit log is fine; else what stops lookups being counted
                           (a log that is not a regular file) or the last fold's failure */
} kiln__cache_stats;

kiln_status kiln__cache_stats_get(kiln__cache *c, kiln__cache_stats *out, kiln__err *e);

/* ---- counters and whole-cache operations (stats.c) ----------------------------------------- */

/* Totals of one arch's rows. */
typedef struct kiln__arch_stats {
    char arch[16];
    int64_t entries;
    int64_t bytes; /* sum of cubin sizes */
    int64_t hits;  /* sum of the rows' hit counters */
} kiln__arch_stats;

/* Per-arch totals, by arch name, into out[0..cap) (*n of them; archs past cap are dropped), and
 * *zeroed: when the counters were last reset (Unix seconds; 0: never). Reads only. */
kiln_status kiln__cache_arch_stats(kiln__cache *c, kiln__arch_stats *out, int cap, int *n,
                                   int64_t *zeroed, kiln__err *e);

/* Reset the hit and miss counters and every row's hits to 0, and stamp the reset (one
 * transaction). KILN_STATUS_IO on a read-only cache. */
kiln_status kiln__cache_stats_zero(kiln__cache *c, kiln__err *e);

/* Delete every row (one transaction; leases and counters stay). *removed counts them. */
kiln_status kiln__cache_clear(kiln__cache *c, int *removed, kiln__err *e);

/* ---- compile leases (lease.c): single flight across processes ------------------------------ */

/* Seconds a lease lives unless its holder refreshes it ($KILN_LEASE_SECONDS overrides). A
 * handle holding leases refreshes them from a keeper thread every quarter of this. */
#define KILN__LEASE_SECONDS 120

typedef enum kiln__lease_state {
    KILN__LEASE_TAKEN,   /* this handle now holds the lease: compile, put, release */
    KILN__LEASE_PRESENT, /* the row exists (someone stored it): read it */
    KILN__LEASE_HELD,    /* another live holder compiles it: wait and ask again */
} kiln__lease_state;

typedef struct kiln__lease {
    kiln__lease_state state;
    char holder[128]; /* HELD: "<host>/<pid>/<nonce>" of the holder */
    char host[64];
    int64_t pid;
    int64_t expires; /* unix seconds */
} kiln__lease;

/* Ask for the compile lease of key. A lease blocks others while it is live: not expired, and
 * not held by a dead process of this host. replace=1 ignores an existing row (it was found
 * corrupt and is to be replaced). Errors (a read-only cache, SQLite failures) are
 * KILN_STATUS_IO / KILN_STATUS_CACHE naming the key. */
kiln_status kiln__cache_lease_take(kiln__cache *c, const char *key, int replace, kiln__lease *out,
                                   kiln__err *e);
/* Drop this handle's lease on key (best effort; a lease left behind expires). */
void kiln__cache_lease_release(kiln__cache *c, const char *key);
/* Delete every lease that no longer blocks anyone (expired, or its holder on this host is
 * dead); *removed counts them and *live the leases left. */
kiln_status kiln__cache_lease_sweep(kiln__cache *c, int *removed, int *live, kiln__err *e);

/* ---- eviction (evict.c) --------------------------------------------------------------------- */

/* Delete least recently used rows (by last_used, then created, then key) until the cubins
 * total at most max_bytes; the row `keep` (may be NULL) is never deleted. *removed and *freed
 * (each may be NULL) count what went. One transaction. */
kiln_status kiln__cache_evict(kiln__cache *c, int64_t max_bytes, const char *keep, int *removed,
                              int64_t *freed, kiln__err *e);

/* Give space back: checkpoint the WAL into the file and truncate it, and with vacuum=1
 * rewrite the file without its free pages (VACUUM; holds the write lock throughout). */
kiln_status kiln__cache_compact(kiln__cache *c, int vacuum, kiln__err *e);

/* Parse a size: digits with an optional K, M, G or T suffix (powers of 1024; a trailing B or
 * iB is allowed: 512M, 2GiB, 1048576). KILN_STATUS_INVALID_ARGUMENT naming the text. */
kiln_status kiln__cache_parse_size(const char *s, int64_t *out, kiln__err *e);

/* ---- integrity (verify.c) ------------------------------------------------------------------- */

/* 0 when cubin[0..size) is a whole 64-bit little-endian ELF file for the CUDA machine whose
 * headers and sections end exactly at size; else non-zero with the reason in why[cap]. */
int kiln__cubin_check(const void *cubin, size_t size, char *why, size_t cap);

/* What a full row check compares against. */
typedef struct kiln__row_rules {
    void (*key_fn)(const char *material, char key[33]); /* key from key material (required) */
    int format_version; /* > 0: the material must begin "kiln-key-format: <this>" */
} kiln__row_rules;

/* Check a row read by kiln__cache_scan: stored checksum, row checksum (unless en->unsealed),
 * key recomputed from the material, key format version, and kiln__cubin_check. 0 when sound; else non-zero with the reason in
 * why[cap] ("checksum mismatch: stored x, computed y"). */
int kiln__cache_row_check(const kiln__entry *en, const kiln__row_rules *r, char *why, size_t cap);

/* The stored checksum of key's row into sum[33] (the blob is not read and no counter moves):
 * KILN_STATUS_NOT_FOUND when there is no such row. */
kiln_status kiln__cache_checksum(kiln__cache *c, const char *key, char sum[33], kiln__err *e);

/* SQLite's PRAGMA integrity_check of the whole file: OK, or KILN_STATUS_CACHE with its first
 * complaint. */
kiln_status kiln__cache_integrity(kiln__cache *c, kiln__err *e);

/* Call fn for every row, in key order, with every column (cubin, texts, stored checksum in
 * en->checksum); the entry is freed after fn returns. The handle is locked throughout: fn must
 * not use c (other handles are fine). fn returns non-zero to stop. */
kiln_status kiln__cache_scan(kiln__cache *c, kiln__cache_visit fn, void *user, kiln__err *e);

#endif /* KILN_CACHE_H */
