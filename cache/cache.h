/*
 * cache.h — the SQLite cubin store: one file, WAL mode, a row per key.
 *
 * The cache stores opaque rows; it never looks inside a cubin and knows no CUDA type. Every
 * write is one transaction; every read verifies the cubin's XXH3 checksum and reports a
 * mismatch instead of returning the blob.
 */
#ifndef KILN_CACHE_H
#define KILN_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kiln.h"
#include "util.h"

#define KILN__CACHE_SCHEMA_VERSION 1

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
} kiln__entry;

void kiln__entry_free(kiln__entry *en);

/* Open (creating if needed, owner-only permissions) <dir>/kernels.db. The directory is created
 * (mode 0700) when missing. A file that is not a kiln cache, or a cache from a newer schema,
 * is refused and left untouched. */
kiln_status kiln__cache_open(const char *dir, kiln__cache **out, kiln__err *e);
void kiln__cache_close(kiln__cache *c);
const char *kiln__cache_path(const kiln__cache *c);

/* The default cache directory: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else
 * $HOME/.cache/kiln. Writes into out[cap]. */
kiln_status kiln__cache_default_dir(char *out, size_t cap, kiln__err *e);

/* Look a key up. KILN_STATUS_NOT_FOUND when absent. A row whose cubin fails its checksum is
 * reported as KILN_STATUS_CACHE with a message naming the key, and *out is left empty.
 * On a hit, hits and last_used are bumped (best effort) and the global hit counter too;
 * on a miss the miss counter. with_text=0 skips source/log/key_material. */
kiln_status kiln__cache_get(kiln__cache *c, const char *key, int with_text, kiln__entry *out,
                            kiln__err *e);

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
} kiln__cache_stats;

kiln_status kiln__cache_stats_get(kiln__cache *c, kiln__cache_stats *out, kiln__err *e);

#endif /* KILN_CACHE_H */
