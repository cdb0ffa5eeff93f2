/*
 * schema.c — opening the cubin cache: the directory (0700) and the file (0600), the SQLite
 * connection (WAL, synchronous=NORMAL, a 10 s busy timeout), recognising what the file holds,
 * creating the schema in one transaction, migrating version-1 files, refusing — without
 * writing a byte — files that are not kiln caches or were written by a newer schema, and
 * refusing writable caches on NFS. Also the default cache directory and the statement helpers
 * of store.h. Rows live in store.c; the format is in docs/cache.md.
 */
#include "store.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#define STR_(x) #x
#define STR(x)  STR_(x)

/* The whole schema, created in one transaction on an empty file. Documented column by column
 * in docs/cache.md; any change here bumps KILN__CACHE_SCHEMA_VERSION. */
/* clang-format off */
static const char schema_sql[] =
    "CREATE TABLE meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);"
    "CREATE TABLE kernels("
    " key TEXT PRIMARY KEY,"
    " spec TEXT NOT NULL,"
    " arch TEXT NOT NULL,"
    " nvrtc TEXT NOT NULL,"
    " key_material TEXT NOT NULL,"
    " source TEXT NOT NULL,"
    " log TEXT NOT NULL,"
    " cubin BLOB NOT NULL,"
    " checksum TEXT NOT NULL,"
    " registers INTEGER,"
    " smem_bytes INTEGER,"
    " spill_bytes INTEGER,"
    " stack_bytes INTEGER,"
    " compile_ms REAL,"
    " created INTEGER NOT NULL,"
    " last_used INTEGER NOT NULL,"
    " hits INTEGER NOT NULL DEFAULT 0,"
    " row_sum TEXT NOT NULL DEFAULT '');"
    "CREATE INDEX kernels_last_used ON kernels(last_used);"
    "CREATE TABLE stats(k TEXT PRIMARY KEY, v INTEGER NOT NULL);"
    KILN__LEASES_SQL
    "INSERT INTO meta(k, v) VALUES"
    " ('schema_version', '" STR(KILN__CACHE_SCHEMA_VERSION) "'),"
    " ('created_by', 'kiln " KILN_VERSION_STRING "');"
    "INSERT INTO stats(k, v) VALUES ('hits', 0), ('misses', 0);";

/* Version 1 → 2: the leases table. */
static const char migrate_v1_sql[] = KILN__LEASES_SQL;
/* Version 2 → 3: the row checksum (then kiln__cache_seal_rows fills it). */
static const char migrate_v2_sql[] = "ALTER TABLE kernels ADD COLUMN row_sum TEXT NOT NULL DEFAULT '';";
static const char migrate_done_sql[] =
    "UPDATE meta SET v = '" STR(KILN__CACHE_SCHEMA_VERSION) "' WHERE k = 'schema_version';";
/* clang-format on */

/* How long set_wal waits between attempts when the switch to WAL is busy, in ms. */
#define WAL_RETRY_MS 10

/* The smallest non-empty SQLite database: one page of the smallest page size. */
#define SQLITE_MIN_FILE 512

/* statfs f_type of NFS (linux/magic.h's NFS_SUPER_MAGIC). */
#define NFS_MAGIC 0x6969

/* Opens are serialised in the process: creating the file closes a descriptor on it, and
 * closing any descriptor drops every POSIX lock this process holds on that file. Under this
 * lock no other kiln connection of the process can be taking locks on a file just created. */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;

typedef enum db_kind {
    DB_EMPTY, /* no schema objects at all: ours to initialise */
    DB_KILN,  /* a kiln cache this kiln reads */
} db_kind;

/* ---- statement helpers (store.h) ------------------------------------------------------------ */

int kiln__cache_step(kiln__cache *c, sqlite3_stmt *st)
{
    c->injected = 0;
    if (kiln__fault("sqlite")) {
        c->injected = 1;
        return SQLITE_IOERR;
    }
    return sqlite3_step(st);
}

int kiln__cache_prepare(kiln__cache *c, const char *sql, sqlite3_stmt **st)
{
    c->injected = 0;
    return sqlite3_prepare_v2(c->db, sql, -1, st, NULL);
}

int kiln__cache_exec(kiln__cache *c, const char *sql)
{
    while (*sql) {
        sqlite3_stmt *st = NULL;
        const char *tail = NULL;
        c->injected = 0;
        int rc = sqlite3_prepare_v2(c->db, sql, -1, &st, &tail);
        if (rc != SQLITE_OK) return rc;
        if (!st) break; /* only white space left */
        while ((rc = kiln__cache_step(c, st)) == SQLITE_ROW) {
        }
        sqlite3_finalize(st); /* keeps the step's message in the connection */
        if (rc != SQLITE_DONE) return rc;
        sql = tail;
    }
    return SQLITE_OK;
}

const char *kiln__cache_why(kiln__cache *c)
{
    return c->injected ? "disk I/O error (injected fault)" : sqlite3_errmsg(c->db);
}

void kiln__cache_rollback(kiln__cache *c)
{
    if (c->db && !sqlite3_get_autocommit(c->db)) sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
}

/* PRAGMA quick_check's first complaint into out[cap]; 0 when the file checks out (or the
 * check cannot run), 1 when it is damaged. */
static int quick_check(kiln__cache *c, char *out, size_t cap)
{
    sqlite3_stmt *st = NULL;
    int bad = 0;
    if (sqlite3_prepare_v2(c->db, "PRAGMA quick_check(1)", -1, &st, NULL) == SQLITE_OK) {
        int rc = sqlite3_step(st);
        const unsigned char *t = rc == SQLITE_ROW ? sqlite3_column_text(st, 0) : NULL;
        if (rc == SQLITE_ROW && t && strcmp((const char *)t, "ok") != 0) {
            snprintf(out, cap, "%s", (const char *)t);
            bad = 1;
        } else if (rc != SQLITE_ROW &&
                   ((rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB)) {
            snprintf(out, cap, "%s", sqlite3_errmsg(c->db));
            bad = 1;
        }
    }
    sqlite3_finalize(st);
    return bad;
}

/* Free bytes of the file system that holds the cache file; -1 when unknown. */
static long long free_bytes(const kiln__cache *c)
{
    char dir[KILN__CACHE_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", c->path);
    char *slash = strrchr(dir, '/');
    if (slash) *(slash == dir ? slash + 1 : slash) = 0;
    else snprintf(dir, sizeof dir, ".");
    struct statvfs vs;
    if (statvfs(dir, &vs) != 0) return -1;
    return (long long)vs.f_bavail * (long long)vs.f_frsize;
}

kiln_status kiln__cache_fail(kiln__cache *c, kiln__err *e, const char *fmt, ...)
{
    char what[600], why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    /* SQLite's own word, honestly mapped: a corrupt file says so with its path, and "database
     * or disk is full" (which SQLite also says when a damaged page makes a record look huge)
     * is checked against the file and the disk before it is believed */
    int code = c->injected ? SQLITE_IOERR : (sqlite3_errcode(c->db) & 0xff);
    snprintf(why, sizeof why, "%s", kiln__cache_why(c));
    kiln__cache_rollback(c);
    char damage[300];
    if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB ||
        (code == SQLITE_FULL && quick_check(c, damage, sizeof damage))) {
        if (code != SQLITE_FULL) snprintf(damage, sizeof damage, "%s", why);
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: %s failed: the cache file is corrupt (%s%s%s); `kiln verify "
                          "%s` shows the damage; removing the file loses only compiled kernels",
                          c->path, what, damage, code == SQLITE_FULL ? "; SQLite reported: " : "",
                          code == SQLITE_FULL ? why : "", c->path);
    }
    if (code == SQLITE_FULL) {
        long long avail = free_bytes(c);
        if (avail >= 0)
            return kiln__fail(e, KILN_STATUS_CACHE,
                              "cache %s: %s failed: %s (%lld bytes free on the cache's file "
                              "system; SQLite's temporary files go to $TMPDIR, else /var/tmp or "
                              "/tmp)",
                              c->path, what, why, avail);
    }
    return kiln__fail(e, KILN_STATUS_CACHE, "cache %s: %s failed: %s", c->path, what, why);
}

/* ---- recognising the file ------------------------------------------------------------------ */

/* A read failure while recognising the file: "not a database" is a refusal, anything else
 * is reported as it is. */
static kiln_status inspect_fail(kiln__cache *c, int rc, kiln__err *e)
{
    if (rc == SQLITE_NOTADB)
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: not a kiln cache (file is not a database); left untouched",
                          c->path);
    return kiln__cache_fail(c, e, "reading the schema");
}

/* Read schema_version from a 'meta' table into *version. A missing table shape or value is a
 * refusal. */
static kiln_status read_version(kiln__cache *c, long *version, kiln__err *e)
{
    sqlite3_stmt *st = NULL;
    int rc = kiln__cache_prepare(c, "SELECT v FROM meta WHERE k = 'schema_version'", &st);
    if (rc == SQLITE_ERROR) /* a 'meta' table without k and v columns */
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: not a kiln cache (its table 'meta' is not kiln's: %s); left "
                          "untouched",
                          c->path, sqlite3_errmsg(c->db));
    if (rc != SQLITE_OK) return inspect_fail(c, rc, e);
    rc = kiln__cache_step(c, st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        kiln_status s = inspect_fail(c, rc, e);
        sqlite3_finalize(st);
        return s;
    }
    char text[64] = "";
    if (rc == SQLITE_ROW) {
        const unsigned char *v = sqlite3_column_text(st, 0);
        snprintf(text, sizeof text, "%s", v ? (const char *)v : "");
    }
    sqlite3_finalize(st);
    if (rc == SQLITE_DONE)
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: not a kiln cache (table 'meta' has no schema_version); left "
                          "untouched",
                          c->path);
    char *end = NULL;
    errno = 0;
    *version = strtol(text, &end, 10);
    if (errno || end == text || *end || *version < 1)
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: not a kiln cache (schema_version '%s' is not a version); "
                          "left untouched",
                          c->path, text);
    return KILN_STATUS_OK;
}

/* Decide what the file holds, reading only. A foreign, future or damaged file is refused with
 * KILN_STATUS_CACHE and a message saying what was found. */
static kiln_status inspect(kiln__cache *c, db_kind *kind, kiln__err *e)
{
    sqlite3_stmt *st = NULL;
    int rc = kiln__cache_prepare(c,
                                 "SELECT count(*),"
                                 " coalesce(sum(type = 'table'), 0),"
                                 " coalesce(sum(type = 'table' AND name = 'meta'), 0),"
                                 " coalesce(sum(type = 'table' AND name = 'kernels'), 0),"
                                 " coalesce(sum(type = 'table' AND name = 'stats'), 0),"
                                 " coalesce(sum(type = 'table' AND name = 'leases'), 0)"
                                 " FROM sqlite_master",
                                 &st);
    if (rc != SQLITE_OK) return inspect_fail(c, rc, e);
    rc = kiln__cache_step(c, st);
    if (rc != SQLITE_ROW) {
        kiln_status s = inspect_fail(c, rc, e);
        sqlite3_finalize(st);
        return s;
    }
    int objects = sqlite3_column_int(st, 0), tables = sqlite3_column_int(st, 1);
    int meta = sqlite3_column_int(st, 2), kernels = sqlite3_column_int(st, 3);
    int stats = sqlite3_column_int(st, 4), leases = sqlite3_column_int(st, 5);
    sqlite3_finalize(st);
    if (objects == 0) {
        *kind = DB_EMPTY;
        return KILN_STATUS_OK;
    }
    if (!meta)
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: not a kiln cache (a SQLite database with %d tables and no "
                          "table 'meta'); left untouched",
                          c->path, tables);
    long version = 0;
    kiln_status s = read_version(c, &version, e);
    if (s) return s;
    if (version > KILN__CACHE_SCHEMA_VERSION)
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: written by schema version %ld, this kiln reads up to %d; "
                          "left untouched (use a newer kiln or another cache directory)",
                          c->path, version, KILN__CACHE_SCHEMA_VERSION);
    /* Version 1 lacks only the leases table: open_locked migrates it (or reads it as it is). */
    const char *missing = !kernels                  ? "kernels"
                          : !stats                  ? "stats"
                          : !leases && version >= 2 ? "leases"
                                                    : NULL;
    if (missing)
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: damaged kiln cache (schema version %ld but no table '%s'); "
                          "left untouched",
                          c->path, version, missing);
    c->schema = (int)version;
    *kind = DB_KILN;
    return KILN_STATUS_OK;
}

/* The size of path in bytes; 0 when it does not exist. */
static long long file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long long)sb.st_size : 0;
}

/* A file with no schema objects is initialised only when it holds nothing: 0 bytes, and no
 * WAL content beside it. That is the state kiln's own create leaves until the schema
 * transaction commits (and what a rolled-back first transaction returns to), so concurrent
 * openers of a fresh file still all succeed; a non-empty SQLite database with no tables is
 * someone's file. Checked under the write lock, after SQLite has read the file (and replayed
 * any hot journal), so that no other opener can be writing it. */
static kiln_status refuse_nonempty(kiln__cache *c, kiln__err *e)
{
    char wal[KILN__CACHE_PATH_MAX + 8];
    snprintf(wal, sizeof wal, "%s-wal", c->path);
    long long size = file_size(c->path), wal_size = file_size(wal);
    if (size > 0 || wal_size > 0)
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: not a kiln cache (a SQLite database of %lld bytes%s with no "
                          "tables, not made by kiln); left untouched",
                          c->path, size, wal_size > 0 ? " and a WAL" : "");
    return KILN_STATUS_OK;
}

/* Create the schema in one BEGIN IMMEDIATE transaction, unless another process did it while
 * we waited for the write lock: then check what it wrote. */
static kiln_status create_schema(kiln__cache *c, kiln__err *e)
{
    if (kiln__cache_exec(c, "BEGIN IMMEDIATE") != SQLITE_OK)
        return kiln__cache_fail(c, e, "creating the schema: begin");
    db_kind kind = DB_EMPTY;
    kiln_status s = inspect(c, &kind, e);
    if (s) {
        kiln__cache_rollback(c);
        return s;
    }
    if (kind == DB_EMPTY && (s = refuse_nonempty(c, e))) {
        kiln__cache_rollback(c);
        return s;
    }
    if (kind == DB_EMPTY && kiln__cache_exec(c, schema_sql) != SQLITE_OK)
        return kiln__cache_fail(c, e, "creating the schema");
    if (kiln__cache_exec(c, "COMMIT") != SQLITE_OK)
        return kiln__cache_fail(c, e, "creating the schema: commit");
    c->schema = KILN__CACHE_SCHEMA_VERSION;
    return KILN_STATUS_OK;
}

/* 1 when the kernels table has the row_sum column. */
static int has_row_sum(kiln__cache *c)
{
    sqlite3_stmt *st = NULL;
    int ok = sqlite3_prepare_v2(c->db, "SELECT row_sum FROM kernels LIMIT 0", -1, &st, NULL) ==
             SQLITE_OK;
    sqlite3_finalize(st);
    return ok;
}

/* Migrate a version-1 or -2 file to version 3 (1 → 2 adds the leases table, 2 → 3 the row
 * checksum column, filled for every row whose cubin passes its checksum) in one BEGIN
 * IMMEDIATE transaction, unless another process did it while we waited for the write lock. A
 * failure rolls back and leaves the file as it was. */
static kiln_status migrate(kiln__cache *c, kiln__err *e)
{
    int from = c->schema;
    if (kiln__cache_exec(c, "BEGIN IMMEDIATE") != SQLITE_OK)
        return kiln__cache_fail(c, e, "migrating schema version %d to %d: begin", from,
                                KILN__CACHE_SCHEMA_VERSION);
    db_kind kind = DB_EMPTY;
    kiln_status s = inspect(c, &kind, e);
    if (s || kind != DB_KILN) {
        kiln__cache_rollback(c);
        return s ? s
                 : kiln__fail(e, KILN_STATUS_CACHE, "cache %s: emptied while migrating", c->path);
    }
    int rc = SQLITE_OK;
    if (c->schema < KILN__CACHE_SCHEMA_VERSION) {
        if (c->schema == 1) rc = kiln__cache_exec(c, migrate_v1_sql);
        if (rc == SQLITE_OK && !has_row_sum(c)) rc = kiln__cache_exec(c, migrate_v2_sql);
        if (rc == SQLITE_OK) rc = kiln__cache_seal_rows(c);
        if (rc == SQLITE_OK) rc = kiln__cache_exec(c, migrate_done_sql);
    }
    if (rc != SQLITE_OK)
        return kiln__cache_fail(c, e, "migrating schema version %d to %d", from,
                                KILN__CACHE_SCHEMA_VERSION);
    if (kiln__cache_exec(c, "COMMIT") != SQLITE_OK)
        return kiln__cache_fail(c, e, "migrating schema version %d to %d: commit", from,
                                KILN__CACHE_SCHEMA_VERSION);
    c->schema = KILN__CACHE_SCHEMA_VERSION;
    return KILN_STATUS_OK;
}

/* Switch a kiln cache to WAL (a no-op once it is) and set synchronous=NORMAL. */
static kiln_status set_wal(kiln__cache *c, kiln__err *e)
{
    sqlite3_stmt *st = NULL;
    if (kiln__cache_prepare(c, "PRAGMA journal_mode=WAL", &st) != SQLITE_OK)
        return kiln__cache_fail(c, e, "switching to WAL");
    int rc = kiln__cache_step(c, st);
    /* The switch needs the exclusive lock. When another opener holds a lock this connection
     * would deadlock against (it is storing its first row, or switching too), SQLite answers
     * SQLITE_BUSY at once instead of calling the busy handler: reset (dropping our read lock)
     * and try again, within the busy timeout. */
    for (int waited = 0; rc == SQLITE_BUSY && !c->injected && waited < KILN__CACHE_BUSY_MS;
         waited += WAL_RETRY_MS) {
        sqlite3_reset(st);
        usleep(WAL_RETRY_MS * 1000);
        rc = kiln__cache_step(c, st);
    }
    if (rc != SQLITE_ROW) {
        kiln_status s = kiln__cache_fail(c, e, "switching to WAL");
        sqlite3_finalize(st);
        return s;
    }
    char mode[32];
    const unsigned char *m = sqlite3_column_text(st, 0);
    snprintf(mode, sizeof mode, "%s", m ? (const char *)m : "?");
    sqlite3_finalize(st);
    if (strcmp(mode, "wal") != 0)
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: switching to WAL failed: journal_mode stays '%s' (kiln "
                          "needs WAL for safe use by several processes)",
                          c->path, mode);
    if (kiln__cache_exec(c, "PRAGMA synchronous=NORMAL") != SQLITE_OK)
        return kiln__cache_fail(c, e, "setting synchronous=NORMAL");
    return KILN_STATUS_OK;
}

/* ---- the directory and the file ------------------------------------------------------------ */

/* Create dir (only its last component) with mode 0700 when missing. */
static kiln_status make_dir(const char *dir, kiln__err *e)
{
    if (mkdir(dir, 0700) == 0) {
        if (chmod(dir, 0700) != 0) /* mkdir's mode is filtered by the umask */
            return kiln__fail(e, KILN_STATUS_IO, "cache %s: chmod 0700 failed: %s", dir,
                              strerror(errno));
        return KILN_STATUS_OK;
    }
    int err = errno;
    struct stat sb;
    if (err == EEXIST && stat(dir, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) return KILN_STATUS_OK;
        return kiln__fail(e, KILN_STATUS_IO, "cache %s: exists and is not a directory", dir);
    }
    return kiln__fail(e, KILN_STATUS_IO, "cache %s: creating the directory failed: %s%s", dir,
                      strerror(err),
                      err == ENOENT ? " (its parent is missing; kiln creates only the last "
                                      "component)"
                                    : "");
}

/* Make sure c->path exists (created 0600 whatever the umask) and decide whether it can be
 * written; sets c->readonly and c->ro_why. KILN__CACHE_RDONLY creates nothing and is
 * read-only whatever the permissions say. Runs under open_lock. */
static kiln_status prepare_file(kiln__cache *c, const char *dir, int flags, kiln__err *e)
{
    struct stat sb;
    if (stat(c->path, &sb) != 0) {
        if (errno == ENOENT && (flags & KILN__CACHE_EXISTING) && !(flags & KILN__CACHE_RDONLY))
            return kiln__fail(e, KILN_STATUS_NOT_FOUND,
                              "cache %s: no such cache (this command reads an existing cache and "
                              "creates none)",
                              c->path);
        if (errno != ENOENT || (flags & KILN__CACHE_RDONLY))
            return kiln__fail(e, KILN_STATUS_IO, "cache %s: %s: %s", c->path,
                              errno == ENOENT ? "no such cache (a read-only cache must exist)"
                                              : "stat failed",
                              strerror(errno));
        int fd = open(c->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) /* EEXIST: another process created it just now */
            return kiln__fail(e, KILN_STATUS_IO, "cache %s: creating the file failed: %s", c->path,
                              strerror(errno));
        if (fd >= 0) {
            int bad = fchmod(fd, 0600) != 0 ? errno : 0;
            close(fd);
            if (bad)
                return kiln__fail(e, KILN_STATUS_IO, "cache %s: chmod 0600 failed: %s", c->path,
                                  strerror(bad));
        }
    } else if (!S_ISREG(sb.st_mode)) {
        return kiln__fail(e, KILN_STATUS_IO, "cache %s: not a regular file", c->path);
    } else if (sb.st_size > 0 && sb.st_size < SQLITE_MIN_FILE) {
        /* SQLite writes whole pages: a short file is nobody's database, and SQLite would take
         * one of a single byte for an empty database and let it be initialised */
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: not a kiln cache (file is not a database); left untouched "
                          "(%lld bytes, shorter than any SQLite database)",
                          c->path, (long long)sb.st_size);
    }
    if (faccessat(AT_FDCWD, c->path, R_OK, AT_EACCESS) != 0)
        return kiln__fail(e, KILN_STATUS_IO, "cache %s: cannot read the file: %s", c->path,
                          strerror(errno));
    c->file_mode = stat(c->path, &sb) == 0 ? (unsigned)(sb.st_mode & 0666) : 0600;
    if (flags & KILN__CACHE_RDONLY) {
        c->readonly = 1;
        snprintf(c->ro_why, sizeof c->ro_why, "opened read-only (a base cache)");
    } else if (faccessat(AT_FDCWD, c->path, W_OK, AT_EACCESS) != 0) {
        c->readonly = 1;
        snprintf(c->ro_why, sizeof c->ro_why, "the file is not writable: %s", strerror(errno));
    } else if (faccessat(AT_FDCWD, dir, W_OK, AT_EACCESS) != 0) {
        c->readonly = 1; /* WAL needs kernels.db-wal and kernels.db-shm beside the file */
        snprintf(c->ro_why, sizeof c->ro_why, "its directory is not writable: %s", strerror(errno));
    }
    return KILN_STATUS_OK;
}

/* 1 when dir is on NFS (statfs f_type), or the "nfs" fault fires; 0 otherwise, or when the
 * file system cannot be asked. */
static int on_nfs(const char *dir)
{
    if (kiln__fault("nfs")) return 1;
    struct statfs fs;
    return statfs(dir, &fs) == 0 && (unsigned long)fs.f_type == NFS_MAGIC;
}

/* A "file:" URI of c->path with SQLite's immutable=1 into *uri. */
static void immutable_uri(const kiln__cache *c, kiln__str *uri)
{
    kiln__str_puts(uri, "file:");
    for (const char *p = c->path; *p; p++) {
        if (isalnum((unsigned char)*p) || strchr("/-_.~", *p)) kiln__str_add(uri, p, 1);
        else kiln__str_printf(uri, "%%%02X", (unsigned char)*p);
    }
    kiln__str_puts(uri, "?immutable=1");
}

/* KILN__CACHE_EXISTING initialises nothing: an empty file is not a cache yet. */
static kiln_status may_initialise(kiln__cache *c, int oflags, kiln__err *e)
{
    if (oflags & KILN__CACHE_EXISTING)
        return kiln__fail(e, KILN_STATUS_NOT_FOUND,
                          "cache %s: an empty file, not a cache yet (this command reads an "
                          "existing cache and initialises none)",
                          c->path);
    return KILN_STATUS_OK;
}

/* Everything of kiln__cache_open_ex that runs under open_lock. */
static kiln_status open_locked(kiln__cache *c, const char *dir, int oflags, kiln__err *e)
{
    kiln_status s = KILN_STATUS_OK;
    struct stat sb;
    if (!(oflags & (KILN__CACHE_RDONLY | KILN__CACHE_FILE | KILN__CACHE_EXISTING)))
        s = make_dir(dir, e);
    else if ((oflags & KILN__CACHE_EXISTING) && !(oflags & KILN__CACHE_RDONLY) &&
             stat(dir, &sb) != 0 && errno == ENOENT)
        s = kiln__fail(e, KILN_STATUS_NOT_FOUND,
                       "cache %s: no such cache: its directory %s does not exist (this command "
                       "reads an existing cache and creates none)",
                       c->path, dir);
    else if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        s = kiln__fail(e, KILN_STATUS_IO, "cache %s: its directory %s is missing", c->path, dir);
    if (!s) s = prepare_file(c, dir, oflags, e);
    if (s) return s;
    int nfs = on_nfs(dir);
    if (nfs && !c->readonly)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "cache %s: the directory is on NFS; SQLite's locks and WAL index do "
                          "not work there, so a writable cache on NFS is refused (put it on a "
                          "local disk; docs/cache.md)",
                          c->path);
    int flags =
        (c->readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE) | SQLITE_OPEN_FULLMUTEX;
    char wal[KILN__CACHE_PATH_MAX + 8];
    snprintf(wal, sizeof wal, "%s-wal", c->path);
    kiln__str uri = {0};
    if (c->readonly && (nfs || access(wal, F_OK) != 0)) {
        /* SQLite cannot read a WAL database it may not create -wal/-shm for, unless told
         * that nothing writes it: a shipped, read-only cache (docs/cache.md). On NFS the
         * same mode takes no lock and maps no shared memory. */
        immutable_uri(c, &uri);
        if (uri.oom)
            return kiln__fail(e, KILN_STATUS_NO_MEMORY, "cache %s: out of memory", c->path);
        flags |= SQLITE_OPEN_URI;
        c->immutable = 1;
    }
    int rc = sqlite3_open_v2(uri.p ? uri.p : c->path, &c->db, flags, NULL);
    kiln__str_free(&uri);
    if (rc != SQLITE_OK)
        return kiln__fail(e, KILN_STATUS_CACHE, "cache %s: opening failed: %s", c->path,
                          c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
    sqlite3_busy_timeout(c->db, KILN__CACHE_BUSY_MS);
    /* Until the file is known to be ours, closing must not checkpoint a WAL into it. */
    sqlite3_db_config(c->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, (int *)NULL);
    db_kind kind = DB_EMPTY;
    s = inspect(c, &kind, e);
    if (s) return s;
    if (kind == DB_EMPTY) {
        s = may_initialise(c, oflags, e);
        if (s) return s;
        if (c->readonly)
            return kiln__fail(e, KILN_STATUS_IO, "cache %s: cannot initialise an empty cache: %s",
                              c->path, c->ro_why);
        s = create_schema(c, e);
        if (s) return s;
    }
    if (!c->readonly) {
        s = set_wal(c, e);
        if (!s && c->schema < KILN__CACHE_SCHEMA_VERSION) s = migrate(c, e);
        if (s) return s;
    }
    c->sealed = has_row_sum(c);
    if (!c->sealed && c->schema >= 3)
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: damaged kiln cache (schema version %d but no column "
                          "kernels.row_sum); left untouched",
                          c->path, c->schema);
    sqlite3_db_config(c->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 0, (int *)NULL);
    return KILN_STATUS_OK;
}

/* ---- public ---------------------------------------------------------------------------------- */

kiln_status kiln__cache_open(const char *dir, kiln__cache **out, kiln__err *e)
{
    return kiln__cache_open_ex(dir, 0, out, e);
}

/* Split `where` into the directory d[cap] and c->path. */
static kiln_status make_paths(kiln__cache *c, const char *where, int flags, char *d, size_t cap,
                              kiln__err *e)
{
    size_t n = strlen(where);
    while (n > 1 && where[n - 1] == '/') n--; /* "a/b/" → "a/b", "/" stays */
    int len, plen;
    if (flags & KILN__CACHE_FILE) {
        plen = snprintf(c->path, sizeof c->path, "%.*s", (int)n, where);
        const char *slash = memrchr(where, '/', n);
        if (!slash) len = snprintf(d, cap, ".");
        else len = snprintf(d, cap, "%.*s", slash == where ? 1 : (int)(slash - where), where);
    } else {
        len = snprintf(d, cap, "%.*s", (int)n, where);
        plen = snprintf(c->path, sizeof c->path, "%s%skernels.db", d,
                        n == 1 && d[0] == '/' ? "" : "/");
    }
    if (len < 0 || plen < 0 || (size_t)plen >= sizeof c->path || (size_t)len >= cap)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache %.200s...: path is too long",
                          where);
    return KILN_STATUS_OK;
}

kiln_status kiln__cache_open_ex(const char *where, int flags, kiln__cache **out, kiln__err *e)
{
    if (out) *out = NULL;
    if (!where || !*where || !out)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache: open needs a directory");
    if (!sqlite3_threadsafe())
        return kiln__fail(e, KILN_STATUS_CACHE,
                          "cache %s: this SQLite library was built without thread support", where);
    kiln__cache *c = kiln__fault("malloc") ? NULL : calloc(1, sizeof *c);
    if (!c) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "cache %s: out of memory", where);
    pthread_mutex_init(&c->lock, NULL);
    kiln__lease_init(c);
    char d[KILN__CACHE_PATH_MAX];
    kiln_status s = make_paths(c, where, flags, d, sizeof d, e);
    if (!s) {
        pthread_mutex_lock(&open_lock);
        s = open_locked(c, d, flags, e);
        pthread_mutex_unlock(&open_lock);
    }
    if (s) {
        kiln__cache_close(c);
        return s;
    }
    *out = c;
    return KILN_STATUS_OK;
}

void kiln__cache_close(kiln__cache *c)
{
    if (!c) return;
    kiln__lease_fini(c);
    if (c->db) sqlite3_close(c->db); /* every statement is finalised by the call that made it */
    pthread_mutex_destroy(&c->lock);
    free(c);
}

int kiln__cache_readonly(const kiln__cache *c, const char **why)
{
    if (why) *why = c ? c->ro_why : "";
    return c ? c->readonly : 1;
}

int kiln__cache_schema(const kiln__cache *c) { return c ? c->schema : 0; }

const char *kiln__cache_path(const kiln__cache *c) { return c ? c->path : ""; }

kiln_status kiln__cache_default_dir(char *out, size_t cap, kiln__err *e)
{
    if (!out || !cap)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache: default_dir needs a buffer");
    out[0] = 0;
    const char *v = getenv("KILN_CACHE_DIR");
    int n;
    if (v && *v) n = snprintf(out, cap, "%s", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && v[0] == '/') /* relative values are ignored */
        n = snprintf(out, cap, "%s/kiln", v);
    else if ((v = getenv("HOME")) && *v) n = snprintf(out, cap, "%s/.cache/kiln", v);
    else
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache: no cache directory: KILN_CACHE_DIR, XDG_CACHE_HOME and HOME "
                          "are all unset or empty (set KILN_CACHE_DIR)");
    if (n < 0 || (size_t)n >= cap) {
        out[0] = 0;
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "cache: the cache directory path is too long (%d bytes, room for %zu)", n,
                          cap - 1);
    }
    return KILN_STATUS_OK;
}
