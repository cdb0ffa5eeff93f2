/*
 * test_cache.c — the SQLite cubin store (cache/): creation and permissions, round trips,
 * counters, persistence, checksums, refusing foreign / future / garbage files without
 * touching them, bad directories, prefixes, listing, statistics, the default directory,
 * injected SQLite failures, and concurrent use from threads, handles and processes.
 * Needs no GPU. Each test works in its own kt_tmpdir().
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "kt.h"

#define NOBODY 65534 /* uid and gid used to test permissions when the tests run as root */

#define STR_(x)    #x
#define STR(x)     STR_(x)
#define SCHEMA_STR STR(KILN__CACHE_SCHEMA_VERSION)

/* ---- helpers ------------------------------------------------------------------------------- */

/* Entry number i, every field set, with a cubin of size pseudo-random bytes (zeros included).
 * Free with kiln__entry_free. */
static void make_entry(kiln__entry *en, int i, size_t size)
{
    char buf[128];
    memset(en, 0, sizeof *en);
    snprintf(buf, sizeof buf, "key-%d", i);
    kiln__hash128(buf, strlen(buf), en->key);
    snprintf(buf, sizeof buf, "op=prefill dtype=bf16 head_dim=%d group=%d", 64 + i, 1 + i % 8);
    en->spec = strdup(buf);
    en->arch = strdup(i % 2 ? "sm_80" : "sm_90a");
    en->nvrtc = strdup("13.0");
    snprintf(buf, sizeof buf, "format 1\nspec %d\nnvrtc 13.0\n", i);
    en->key_material = strdup(buf);
    en->source = strdup("/* generated — do not edit */\n__global__ void k(void) {}\n");
    en->log = strdup("ptxas info    : Used 40 registers, 1024 bytes smem");
    en->cubin = malloc(size);
    uint32_t x = 2463534242u + (uint32_t)i;
    for (size_t b = 0; b < size; b++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        ((unsigned char *)en->cubin)[b] = b % 7 == 0 ? 0 : (unsigned char)x;
    }
    en->cubin_size = size;
    en->registers = 40 + i;
    en->smem_bytes = 1024 * (i + 1);
    en->spill_bytes = i;
    en->stack_bytes = 8;
    en->compile_ms = 123.25 + i;
}

/* Open dir as a cache or fail the test (returns NULL). */
static kiln__cache *open_ok(const char *dir)
{
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_open(dir, &c, &e), e.msg);
    return c;
}

/* "<a>/<b>" in a static buffer (one of 4, round robin; a may be an earlier result). */
static const char *join(const char *a, const char *b)
{
    static char bufs[4][1024];
    static int next;
    char tmp[sizeof bufs[0]];
    size_t na = strlen(a), nb = strlen(b);
    if (na + nb + 2 > sizeof tmp) return "/nonexistent/path-too-long";
    memcpy(tmp, a, na);
    tmp[na] = '/';
    memcpy(tmp + na + 1, b, nb + 1);
    char *p = bufs[next++ % 4];
    memcpy(p, tmp, na + nb + 2);
    return p;
}

/* The first column of the first row of sql on a connection of our own, malloc'd ("" for no
 * row, NULL on error). */
static char *raw_text(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    char *out = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(db, 10000);
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK) {
            int rc = sqlite3_step(st);
            if (rc == SQLITE_ROW) {
                const unsigned char *t = sqlite3_column_text(st, 0);
                out = strdup(t ? (const char *)t : "(null)");
            } else if (rc == SQLITE_DONE) {
                out = strdup("");
            }
        }
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return out;
}

/* Run sql (several statements allowed) on a connection of our own; 1 on success. */
static int raw_exec(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    int ok = sqlite3_open(path, &db) == SQLITE_OK;
    if (ok) {
        sqlite3_busy_timeout(db, 10000);
        char *err = NULL;
        ok = sqlite3_exec(db, sql, NULL, NULL, &err) == SQLITE_OK;
        if (!ok) printf("    raw_exec: %s\n", err ? err : "?");
        sqlite3_free(err);
    }
    sqlite3_close(db);
    return ok;
}

static int file_mode(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (int)(sb.st_mode & 07777) : -1;
}

/* Whole contents of path (malloc'd; *n its size); NULL when unreadable. */
static char *slurp(const char *path, size_t *n)
{
    char *data = NULL;
    kiln__err e = {{0}};
    if (kiln__read_file(path, &data, n, &e) != KILN_STATUS_OK) return NULL;
    return data;
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* The integrity of the database at path, as PRAGMA integrity_check says it ("ok"). */
static void check_integrity(const char *path)
{
    char *r = raw_text(path, "PRAGMA integrity_check");
    KT_EQ_STR(r, "ok");
    free(r);
}

static int64_t count_rows(kiln__cache *c)
{
    kiln__cache_stats s;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    return s.entries;
}

/* Try to open dir, expect status `want` and a message containing each of needles (NULL-ended
 * list of up to 3). Never leaves a handle open. */
static void open_fails(const char *dir, kiln_status want, const char *n1, const char *n2)
{
    kiln__cache *c = (kiln__cache *)&c; /* poison: must come back NULL */
    kiln__err e = {{0}};
    KT_STATUS(kiln__cache_open(dir, &c, &e), want, e.msg);
    KT_CHECK(c == NULL);
    if (c && c != (kiln__cache *)&c) kiln__cache_close(c);
    if (n1) KT_CONTAINS(e.msg, n1);
    if (n2) KT_CONTAINS(e.msg, n2);
}

/* ---- opening --------------------------------------------------------------------------------- */

KT_TEST(cache_open_creates)
{
    const char *dir = join(kt_tmpdir(), "cache");
    mode_t old = umask(0); /* modes must not depend on the umask */
    kiln__cache *c = open_ok(dir);
    umask(old);
    KT_REQUIRE(c);
    const char *db = join(dir, "kernels.db");
    KT_EQ_STR(kiln__cache_path(c), db);
    KT_EQ_INT(file_mode(dir), 0700);
    KT_EQ_INT(file_mode(db), 0600);
    kiln__entry en;
    make_entry(&en, 1, 100);
    kiln__err e = {{0}};
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__entry_free(&en);
    int wal_mode = file_mode(join(dir, "kernels.db-wal"));
    KT_CHECK(wal_mode == 0600 || wal_mode == -1); /* SQLite gives -wal the file's mode */
    char *jm = raw_text(db, "PRAGMA journal_mode");
    KT_EQ_STR(jm, "wal");
    free(jm);
    char *v = raw_text(db, "SELECT v FROM meta WHERE k = 'schema_version'");
    KT_EQ_STR(v, SCHEMA_STR);
    free(v);
    v = raw_text(db, "SELECT v FROM meta WHERE k = 'created_by'");
    KT_EQ_STR(v, "kiln " KILN_VERSION_STRING);
    free(v);
    v = raw_text(
        db, "SELECT group_concat(k || '=' || v, ',') FROM (SELECT k, v FROM stats ORDER BY k)");
    KT_EQ_STR(v, "hits=0,misses=0");
    free(v);
    kiln__cache_close(c);
    kiln__cache_close(NULL);
    /* a trailing slash names the same file */
    c = open_ok(join(kt_tmpdir(), "cache/"));
    if (c) KT_EQ_STR(kiln__cache_path(c), db);
    kiln__cache_close(c);
    check_integrity(db);
}

KT_TEST(cache_open_empty_file)
{
    const char *dir = join(kt_tmpdir(), "c");
    KT_REQUIRE(mkdir(dir, 0700) == 0);
    write_bytes(join(dir, "kernels.db"), "", 0); /* a 0-byte file is ours to initialise */
    kiln__cache *c = open_ok(dir);
    KT_REQUIRE(c);
    KT_EQ_INT(count_rows(c), 0);
    kiln__cache_close(c);
}

KT_TEST(cache_refuse_garbage)
{
    const char *dir = join(kt_tmpdir(), "c");
    const char *db = join(dir, "kernels.db");
    KT_REQUIRE(mkdir(dir, 0700) == 0);
    static const size_t sizes[] = {5, 100, 8192};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char *junk = malloc(sizes[i]);
        for (size_t b = 0; b < sizes[i]; b++) junk[b] = (char)('a' + (b * 7 + i) % 26);
        write_bytes(db, junk, sizes[i]);
        open_fails(dir, KILN_STATUS_CACHE, "not a kiln cache (file is not a database)", db);
        size_t n = 0;
        char *after = slurp(db, &n);
        KT_EQ_INT(n, sizes[i]);
        KT_CHECK(after && memcmp(after, junk, sizes[i]) == 0);
        free(after);
        free(junk);
    }
}

KT_TEST(cache_refuse_future)
{
    const char *dir = join(kt_tmpdir(), "c");
    const char *db = join(dir, "kernels.db");
    kiln__cache *c = open_ok(dir);
    KT_REQUIRE(c);
    kiln__cache_close(c);
    KT_REQUIRE(raw_exec(db, "UPDATE meta SET v = '7' WHERE k = 'schema_version'"));
    size_t n0 = 0, n1 = 0;
    char *before = slurp(db, &n0);
    open_fails(dir, KILN_STATUS_CACHE, "written by schema version 7",
               "this kiln reads up to " SCHEMA_STR);
    char *after = slurp(db, &n1);
    KT_CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    free(before);
    free(after);
    char *v = raw_text(db, "SELECT v FROM meta WHERE k = 'schema_version'");
    KT_EQ_STR(v, "7");
    free(v);
}

KT_TEST(cache_refuse_foreign)
{
    const char *dir = join(kt_tmpdir(), "c");
    const char *db = join(dir, "kernels.db");
    KT_REQUIRE(mkdir(dir, 0700) == 0);
    /* someone else's database in rollback mode */
    KT_REQUIRE(raw_exec(db, "CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT);"
                            "INSERT INTO notes(body) VALUES ('mine'), ('also mine');"));
    size_t n0 = 0, n1 = 0;
    char *before = slurp(db, &n0);
    open_fails(dir, KILN_STATUS_CACHE, "not a kiln cache", "no table 'meta'");
    char *after = slurp(db, &n1);
    KT_CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    free(before);
    free(after);

    /* a 'meta' table that is not kiln's */
    KT_REQUIRE(raw_exec(db, "CREATE TABLE meta(name TEXT, value TEXT);"));
    before = slurp(db, &n0);
    open_fails(dir, KILN_STATUS_CACHE, "not a kiln cache", "'meta'");
    after = slurp(db, &n1);
    KT_CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    free(before);
    free(after);

    /* a foreign WAL database whose last commits still sit in the -wal file: refusing it must
     * not checkpoint them into the main file */
    const char *db2dir = join(kt_tmpdir(), "w");
    KT_REQUIRE(mkdir(db2dir, 0700) == 0);
    const char *db2 = join(db2dir, "kernels.db");
    sqlite3 *own = NULL;
    KT_REQUIRE(sqlite3_open(db2, &own) == SQLITE_OK);
    KT_REQUIRE(sqlite3_exec(own,
                            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;"
                            "CREATE TABLE t(x); INSERT INTO t VALUES (1), (2);",
                            NULL, NULL, NULL) == SQLITE_OK);
    before = slurp(db2, &n0);
    open_fails(db2dir, KILN_STATUS_CACHE, "not a kiln cache", NULL);
    after = slurp(db2, &n1);
    KT_CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    free(before);
    free(after);
    sqlite3_close(own);
}

/* Checks run as an unprivileged user (root ignores permission bits). Returns the number of
 * failed checks. Runs in a forked child when the tests run as root. */
static int unprivileged_checks(const char *base)
{
    int bad = 0;
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    /* a read-only directory without a cache: nothing can be created */
    kiln_status s = kiln__cache_open(join(base, "ro_empty"), &c, &e);
    if (s != KILN_STATUS_IO || !strstr(e.msg, "ro_empty/kernels.db") ||
        !strstr(e.msg, "Permission denied")) {
        printf("    read-only empty dir: %s: %s\n", kiln_status_str(s), e.msg);
        bad++;
    }
    kiln__cache_close(c);
    c = NULL;
    /* an unreadable file */
    s = kiln__cache_open(join(base, "unreadable"), &c, &e);
    if (s != KILN_STATUS_IO || !strstr(e.msg, "cannot read") ||
        !strstr(e.msg, "Permission denied")) {
        printf("    unreadable file: %s: %s\n", kiln_status_str(s), e.msg);
        bad++;
    }
    kiln__cache_close(c);
    c = NULL;
    /* a read-only directory holding a cache: reads work, writes are refused with the reason */
    s = kiln__cache_open(join(base, "ro_full"), &c, &e);
    if (s != KILN_STATUS_OK) {
        printf("    read-only dir with a cache: %s: %s\n", kiln_status_str(s), e.msg);
        return bad + 1;
    }
    kiln__entry en, got;
    make_entry(&en, 3, 64);
    s = kiln__cache_get(c, en.key, 1, &got, &e);
    if (s != KILN_STATUS_OK || got.cubin_size != 64 || memcmp(got.cubin, en.cubin, 64) != 0) {
        printf("    get from a read-only cache: %s: %s\n", kiln_status_str(s), e.msg);
        bad++;
    }
    kiln__entry_free(&got);
    s = kiln__cache_put(c, &en, &e);
    if (s != KILN_STATUS_IO || !strstr(e.msg, "read-only") || !strstr(e.msg, "not writable")) {
        printf("    put into a read-only cache: %s: %s\n", kiln_status_str(s), e.msg);
        bad++;
    }
    kiln__entry_free(&en);
    kiln__cache_close(c);
    return bad;
}

KT_TEST(cache_bad_dirs)
{
    const char *tmp = kt_tmpdir();
    /* a path under a regular file */
    write_bytes(join(tmp, "file"), "x", 1);
    open_fails(join(tmp, "file/sub"), KILN_STATUS_IO, "file/sub", "Not a directory");
    /* a missing parent: only the last component is created */
    open_fails(join(tmp, "no/such"), KILN_STATUS_IO, "no/such", "parent is missing");
    /* the cache directory is a file */
    open_fails(join(tmp, "file"), KILN_STATUS_IO, "not a directory", NULL);
    /* kernels.db is a directory */
    KT_REQUIRE(mkdir(join(tmp, "d"), 0700) == 0 && mkdir(join(tmp, "d/kernels.db"), 0700) == 0);
    open_fails(join(tmp, "d"), KILN_STATUS_IO, "not a regular file", NULL);

    /* permissions, as an unprivileged user */
    char base[1024];
    snprintf(base, sizeof base, "%s/perm", tmp);
    KT_REQUIRE(mkdir(base, 0755) == 0);
    KT_REQUIRE(mkdir(join(base, "ro_empty"), 0755) == 0);
    kiln__cache *c = open_ok(join(base, "unreadable"));
    kiln__cache_close(c);
    c = open_ok(join(base, "ro_full"));
    KT_REQUIRE(c);
    kiln__entry en;
    make_entry(&en, 3, 64);
    kiln__err e = {{0}};
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__entry_free(&en);
    kiln__cache_close(c);
    if (geteuid() != 0) {
        KT_REQUIRE(chmod(join(base, "ro_empty"), 0555) == 0 &&
                   chmod(join(base, "unreadable/kernels.db"), 0200) == 0 &&
                   chmod(join(base, "ro_full"), 0555) == 0);
        KT_EQ_INT(unprivileged_checks(base), 0);
        chmod(join(base, "ro_full"), 0755);
        return;
    }
    /* root: run the checks in a child that drops to nobody; root stays owner of the dirs */
    KT_REQUIRE(chmod(tmp, 0755) == 0 && chmod(base, 0755) == 0 &&
               chmod(join(base, "unreadable"), 0755) == 0);
    KT_REQUIRE(chown(join(base, "ro_full/kernels.db"), NOBODY, NOBODY) == 0);
    KT_REQUIRE(chmod(join(base, "ro_full"), 0755) == 0);
    fflush(stdout);
    pid_t pid = fork();
    KT_REQUIRE(pid >= 0);
    if (pid == 0) {
        if (setgid(NOBODY) != 0 || setuid(NOBODY) != 0) _exit(99);
        int bad = unprivileged_checks(base);
        fflush(stdout);
        _exit(bad ? 1 : 0);
    }
    int status = 0;
    KT_REQUIRE(waitpid(pid, &status, 0) == pid);
    KT_CHECK(WIFEXITED(status));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 99)
        kt_skip("running as root and cannot drop to uid %d: permission checks not run", NOBODY);
    else KT_EQ_INT(WEXITSTATUS(status), 0);
}

/* ---- rows ------------------------------------------------------------------------------------ */

KT_TEST(cache_roundtrip)
{
    kiln__cache *c = open_ok(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__entry en, got;
    kiln__err e = {{0}};
    make_entry(&en, 5, 70001);
    en.created = 1700000000;
    en.last_used = 1700000500;
    en.hits = 3;
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    KT_OK(kiln__cache_get(c, en.key, 1, &got, &e), e.msg);
    KT_EQ_STR(got.key, en.key);
    KT_EQ_STR(got.spec, en.spec);
    KT_EQ_STR(got.arch, en.arch);
    KT_EQ_STR(got.nvrtc, en.nvrtc);
    KT_EQ_STR(got.key_material, en.key_material);
    KT_EQ_STR(got.source, en.source);
    KT_EQ_STR(got.log, en.log);
    KT_EQ_INT(got.cubin_size, en.cubin_size);
    KT_CHECK(got.cubin && memcmp(got.cubin, en.cubin, en.cubin_size) == 0);
    KT_EQ_INT(got.registers, en.registers);
    KT_EQ_INT(got.smem_bytes, en.smem_bytes);
    KT_EQ_INT(got.spill_bytes, en.spill_bytes);
    KT_EQ_INT(got.stack_bytes, en.stack_bytes);
    KT_CHECK(got.compile_ms == en.compile_ms);
    KT_EQ_INT(got.created, 1700000000);
    KT_CHECK(got.last_used >= (int64_t)time(NULL) - 5); /* this hit bumped it */
    KT_EQ_INT(got.hits, 4);
    kiln__entry_free(&got);
    /* without texts */
    KT_OK(kiln__cache_get(c, en.key, 0, &got, &e), e.msg);
    KT_CHECK(got.source == NULL && got.log == NULL && got.key_material == NULL);
    KT_EQ_STR(got.spec, en.spec);
    KT_CHECK(got.cubin && got.cubin_size == en.cubin_size &&
             memcmp(got.cubin, en.cubin, en.cubin_size) == 0);
    KT_EQ_INT(got.hits, 5);
    kiln__entry_free(&got);
    kiln__entry_free(&got); /* safe twice: the struct is zeroed */
    KT_CHECK(got.spec == NULL && got.cubin == NULL && got.cubin_size == 0);
    kiln__entry_free(NULL);

    /* NULL texts are stored as ""; zero stamps become now; replace keeps one row */
    kiln__entry bare = {0};
    memcpy(bare.key, en.key, 33);
    bare.spec = en.spec;
    bare.arch = en.arch;
    bare.cubin = en.cubin;
    bare.cubin_size = 10;
    int64_t t0 = (int64_t)time(NULL);
    KT_OK(kiln__cache_put(c, &bare, &e), e.msg);
    KT_EQ_INT(count_rows(c), 1);
    KT_OK(kiln__cache_get(c, en.key, 1, &got, &e), e.msg);
    KT_EQ_STR(got.nvrtc, "");
    KT_EQ_STR(got.source, "");
    KT_EQ_STR(got.log, "");
    KT_EQ_STR(got.key_material, "");
    KT_EQ_INT(got.cubin_size, 10);
    KT_CHECK(got.created >= t0 && got.created <= t0 + 5);
    KT_EQ_INT(got.hits, 1);
    kiln__entry_free(&got);
    kiln__entry_free(&en);
    kiln__cache_close(c);
}

KT_TEST(cache_put_invalid)
{
    kiln__cache *c = open_ok(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__entry en, got;
    kiln__err e = {{0}};
    make_entry(&en, 1, 16);
    char good[33];
    memcpy(good, en.key, 33);
    static const char *bad_keys[] = {"", "abc", "0123456789abcdef0123456789abcdeF",
                                     "0123456789abcdef0123456789abcdeg",
                                     "0123456789abcdef0123456789abcdef0"};
    for (size_t i = 0; i < sizeof bad_keys / sizeof bad_keys[0]; i++) {
        snprintf(en.key, sizeof en.key, "%s", bad_keys[i]);
        if (strlen(bad_keys[i]) <= 32) /* a longer one does not fit into en.key */
            KT_STATUS(kiln__cache_put(c, &en, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
        KT_STATUS(kiln__cache_get(c, bad_keys[i], 1, &got, &e), KILN_STATUS_INVALID_ARGUMENT,
                  e.msg);
    }
    KT_STATUS(kiln__cache_get(c, NULL, 1, &got, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    memcpy(en.key, good, 33);
    void *cubin = en.cubin;
    en.cubin = NULL;
    KT_STATUS(kiln__cache_put(c, &en, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_CONTAINS(e.msg, "cubin");
    en.cubin = cubin;
    en.cubin_size = 0;
    KT_STATUS(kiln__cache_put(c, &en, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    en.cubin_size = 16;
    char *spec = en.spec;
    en.spec = (char *)"";
    KT_STATUS(kiln__cache_put(c, &en, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_CONTAINS(e.msg, "spec");
    en.spec = spec;
    char *arch = en.arch;
    en.arch = NULL;
    KT_STATUS(kiln__cache_put(c, &en, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    en.arch = arch;
    KT_STATUS(kiln__cache_put(c, NULL, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_STATUS(kiln__cache_put(NULL, &en, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_EQ_INT(count_rows(c), 0);
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    KT_EQ_INT(count_rows(c), 1);
    kiln__entry_free(&en);
    kiln__cache_close(c);
}

KT_TEST(cache_counters)
{
    kiln__cache *c = open_ok(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__entry en, got;
    kiln__err e = {{0}};
    kiln__cache_stats s;
    make_entry(&en, 2, 300);
    KT_STATUS(kiln__cache_get(c, en.key, 1, &got, &e), KILN_STATUS_NOT_FOUND, e.msg);
    KT_CONTAINS(e.msg, en.key);
    KT_CHECK(got.spec == NULL && got.cubin == NULL);
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    for (int i = 0; i < 3; i++) {
        KT_OK(kiln__cache_get(c, en.key, 0, &got, &e), e.msg);
        KT_EQ_INT(got.hits, i + 1);
        kiln__entry_free(&got);
    }
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 3);
    KT_EQ_INT(s.misses, 1);
    KT_EQ_INT(s.entries, 1);
    char *h = raw_text(kiln__cache_path(c), "SELECT hits FROM kernels");
    KT_EQ_STR(h, "3");
    free(h);
    kiln__entry_free(&en);
    kiln__cache_close(c);
}

KT_TEST(cache_reopen)
{
    const char *dir = join(kt_tmpdir(), "c");
    kiln__cache *c = open_ok(dir);
    KT_REQUIRE(c);
    kiln__entry en[3], got;
    kiln__err e = {{0}};
    for (int i = 0; i < 3; i++) {
        make_entry(&en[i], 10 + i, 1000 + (size_t)i);
        KT_OK(kiln__cache_put(c, &en[i], &e), e.msg);
    }
    KT_OK(kiln__cache_get(c, en[0].key, 0, &got, &e), e.msg);
    kiln__entry_free(&got);
    kiln__cache_close(c);
    c = open_ok(dir);
    KT_REQUIRE(c);
    for (int i = 0; i < 3; i++) {
        KT_OK(kiln__cache_get(c, en[i].key, 1, &got, &e), e.msg);
        KT_CHECK(got.cubin_size == en[i].cubin_size &&
                 memcmp(got.cubin, en[i].cubin, got.cubin_size) == 0);
        KT_EQ_STR(got.source, en[i].source);
        KT_EQ_INT(got.hits, i == 0 ? 2 : 1);
        kiln__entry_free(&got);
        kiln__entry_free(&en[i]);
    }
    kiln__cache_stats s;
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 4);
    KT_EQ_INT(s.entries, 3);
    kiln__cache_close(c);
}

KT_TEST(cache_checksum_mismatch)
{
    kiln__cache *c = open_ok(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__entry en, got;
    kiln__err e = {{0}};
    make_entry(&en, 7, 512);
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    char sql[256];
    /* flip one byte of the stored cubin behind the cache's back */
    snprintf(sql, sizeof sql,
             "UPDATE kernels SET cubin = substr(cubin, 1, 99) || x'5a' || substr(cubin, 101) "
             "WHERE key = '%s'",
             en.key);
    KT_REQUIRE(raw_exec(kiln__cache_path(c), sql));
    memset(&got, 0x5a, sizeof got);
    KT_STATUS(kiln__cache_get(c, en.key, 1, &got, &e), KILN_STATUS_CACHE, e.msg);
    KT_CONTAINS(e.msg, "checksum");
    KT_CONTAINS(e.msg, en.key);
    KT_CONTAINS(e.msg, en.spec);
    KT_CONTAINS(e.msg, "not loaded");
    KT_CHECK(got.cubin == NULL && got.cubin_size == 0 && got.spec == NULL && got.key[0] == 0);
    kiln__cache_stats s;
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 0);
    KT_EQ_INT(s.misses, 1);
    /* a corrupt row is never loaded; putting it again (the caller recompiled) repairs it */
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    KT_OK(kiln__cache_get(c, en.key, 0, &got, &e), e.msg);
    KT_CHECK(got.cubin && memcmp(got.cubin, en.cubin, en.cubin_size) == 0);
    kiln__entry_free(&got);
    /* an emptied blob is corrupt too */
    snprintf(sql, sizeof sql, "UPDATE kernels SET cubin = x'' WHERE key = '%s'", en.key);
    KT_REQUIRE(raw_exec(kiln__cache_path(c), sql));
    KT_STATUS(kiln__cache_get(c, en.key, 0, &got, &e), KILN_STATUS_CACHE, e.msg);
    KT_CONTAINS(e.msg, "checksum");
    kiln__entry_free(&en);
    kiln__cache_close(c);
}

/* ---- prefixes, listing, stats ---------------------------------------------------------------- */

/* Put an entry with an explicit key and last_used. */
static void put_key(kiln__cache *c, const char *key, int64_t last_used)
{
    kiln__entry en;
    kiln__err e = {{0}};
    make_entry(&en, (int)last_used, 32);
    snprintf(en.key, sizeof en.key, "%s", key);
    en.last_used = last_used;
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__entry_free(&en);
}

#define K_AB1 "ab000000000000000000000000000001"
#define K_AB2 "ab000000000000000000000000000002"
#define K_CD1 "cd000000000000000000000000000001"
#define K_EF1 "ef000000000000000000000000000001"

KT_TEST(cache_resolve)
{
    kiln__cache *c = open_ok(kt_tmpdir());
    KT_REQUIRE(c);
    put_key(c, K_AB1, 10);
    put_key(c, K_AB2, 20);
    put_key(c, K_CD1, 30);
    char key[33];
    kiln__err e = {{0}};
    KT_OK(kiln__cache_resolve(c, "c", key, &e), e.msg);
    KT_EQ_STR(key, K_CD1);
    char upper[33];
    for (int i = 0; i < 33; i++) upper[i] = (char)toupper((unsigned char)K_AB2[i]);
    KT_OK(kiln__cache_resolve(c, upper, key, &e), e.msg);
    KT_EQ_STR(key, K_AB2);
    KT_OK(kiln__cache_resolve(c, K_AB1, key, &e), e.msg);
    KT_EQ_STR(key, K_AB1);
    KT_STATUS(kiln__cache_resolve(c, "ab", key, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_CONTAINS(e.msg, "prefix 'ab' is ambiguous: 2 entries match");
    KT_EQ_STR(key, "");
    KT_STATUS(kiln__cache_resolve(c, "ff", key, &e), KILN_STATUS_NOT_FOUND, e.msg);
    KT_CONTAINS(e.msg, "no cache entry matches 'ff'");
    static const char *bad[] = {"", "xyz", "ab%", "ab_", "0123456789abcdef0123456789abcdef0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        KT_STATUS(kiln__cache_resolve(c, bad[i], key, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
        KT_CONTAINS(e.msg, "not a key prefix");
    }
    KT_STATUS(kiln__cache_resolve(c, NULL, key, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    kiln__cache_close(c);
}

KT_TEST(cache_remove_prefix)
{
    kiln__cache *c = open_ok(kt_tmpdir());
    KT_REQUIRE(c);
    put_key(c, K_AB1, 10);
    put_key(c, K_AB2, 20);
    put_key(c, K_CD1, 30);
    int n = -1;
    kiln__err e = {{0}};
    KT_STATUS(kiln__cache_remove(c, "a_", &n, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_STATUS(kiln__cache_remove(c, "", &n, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_EQ_INT(n, 0);
    KT_OK(kiln__cache_remove(c, "ff", &n, &e), e.msg);
    KT_EQ_INT(n, 0);
    KT_OK(kiln__cache_remove(c, "AB", &n, &e), e.msg);
    KT_EQ_INT(n, 2);
    KT_EQ_INT(count_rows(c), 1);
    kiln__entry got;
    KT_STATUS(kiln__cache_get(c, K_AB1, 0, &got, &e), KILN_STATUS_NOT_FOUND, e.msg);
    KT_OK(kiln__cache_get(c, K_CD1, 0, &got, &e), e.msg);
    kiln__entry_free(&got);
    KT_OK(kiln__cache_remove(c, K_CD1, &n, &e), e.msg);
    KT_EQ_INT(n, 1);
    KT_EQ_INT(count_rows(c), 0);
    kiln__cache_close(c);
}

typedef struct visit_log {
    char keys[8][33];
    size_t sizes[8];
    int n, stop_after;
    kiln__cache *c; /* when set, each visit calls back into the cache */
    int reentrant_ok;
} visit_log;

static int visit(const kiln__entry *en, void *user)
{
    visit_log *v = user;
    if (v->n < 8) {
        memcpy(v->keys[v->n], en->key, 33);
        v->sizes[v->n] = en->cubin_size;
    }
    KT_CHECK(en->cubin == NULL && en->source == NULL && en->log == NULL);
    KT_CHECK(en->spec && en->spec[0] && en->arch && en->arch[0]);
    if (v->c) {
        kiln__entry got;
        kiln__err e = {{0}};
        v->reentrant_ok += kiln__cache_get(v->c, en->key, 0, &got, &e) == KILN_STATUS_OK;
        kiln__entry_free(&got);
    }
    v->n++;
    return v->stop_after && v->n >= v->stop_after;
}

KT_TEST(cache_each_order)
{
    kiln__cache *c = open_ok(kt_tmpdir());
    KT_REQUIRE(c);
    put_key(c, K_CD1, 100);
    put_key(c, K_AB2, 300);
    put_key(c, K_EF1, 200);
    put_key(c, K_AB1, 300); /* ties broken by key */
    visit_log v = {0};
    kiln__err e = {{0}};
    KT_OK(kiln__cache_each(c, visit, &v, &e), e.msg);
    KT_EQ_INT(v.n, 4);
    KT_EQ_STR(v.keys[0], K_AB1);
    KT_EQ_STR(v.keys[1], K_AB2);
    KT_EQ_STR(v.keys[2], K_EF1);
    KT_EQ_STR(v.keys[3], K_CD1);
    KT_EQ_INT(v.sizes[0], 32);
    visit_log stop = {0};
    stop.stop_after = 2;
    KT_OK(kiln__cache_each(c, visit, &stop, &e), e.msg);
    KT_EQ_INT(stop.n, 2);
    /* the visitor may use the cache (no lock is held while it runs) */
    visit_log re = {0};
    re.c = c;
    KT_OK(kiln__cache_each(c, visit, &re, &e), e.msg);
    KT_EQ_INT(re.reentrant_ok, 4);
    KT_STATUS(kiln__cache_each(c, NULL, NULL, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    kiln__cache_close(c);
}

KT_TEST(cache_stats_bytes)
{
    kiln__cache *c = open_ok(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__cache_stats s;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.entries, 0);
    KT_EQ_INT(s.bytes, 0);
    size_t total = 0;
    for (int i = 0; i < 5; i++) {
        kiln__entry en;
        make_entry(&en, i, 1000 * (size_t)(i + 1) + 3);
        total += en.cubin_size;
        KT_OK(kiln__cache_put(c, &en, &e), e.msg);
        kiln__entry_free(&en);
    }
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.entries, 5);
    KT_EQ_INT(s.bytes, total);
    struct stat db, wal;
    int64_t want = stat(kiln__cache_path(c), &db) == 0 ? db.st_size : 0;
    if (stat(join(kt_tmpdir(), "kernels.db-wal"), &wal) == 0) want += wal.st_size;
    KT_EQ_INT(s.file_bytes, want);
    KT_CHECK(s.file_bytes >= (int64_t)total);
    kiln__cache_close(c);
}

/* ---- default directory ----------------------------------------------------------------------- */

/* Set or unset (v == NULL) an environment variable. */
static void env_set(const char *k, const char *v)
{
    if (v) setenv(k, v, 1);
    else unsetenv(k);
}

KT_TEST(cache_default_dir)
{
    static const char *names[] = {"KILN_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
    char *saved[3];
    for (int i = 0; i < 3; i++) saved[i] = getenv(names[i]) ? strdup(getenv(names[i])) : NULL;
    char out[256];
    kiln__err e = {{0}};
    env_set("KILN_CACHE_DIR", "/k/dir");
    env_set("XDG_CACHE_HOME", "/xdg");
    env_set("HOME", "/home/u");
    KT_OK(kiln__cache_default_dir(out, sizeof out, &e), e.msg);
    KT_EQ_STR(out, "/k/dir");
    env_set("KILN_CACHE_DIR", ""); /* empty means unset */
    KT_OK(kiln__cache_default_dir(out, sizeof out, &e), e.msg);
    KT_EQ_STR(out, "/xdg/kiln");
    env_set("XDG_CACHE_HOME", "relative/path"); /* the XDG spec says ignore relative values */
    KT_OK(kiln__cache_default_dir(out, sizeof out, &e), e.msg);
    KT_EQ_STR(out, "/home/u/.cache/kiln");
    env_set("XDG_CACHE_HOME", NULL);
    KT_OK(kiln__cache_default_dir(out, sizeof out, &e), e.msg);
    KT_EQ_STR(out, "/home/u/.cache/kiln");
    KT_STATUS(kiln__cache_default_dir(out, 8, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_CONTAINS(e.msg, "too long");
    KT_EQ_STR(out, "");
    env_set("HOME", NULL);
    KT_STATUS(kiln__cache_default_dir(out, sizeof out, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_CONTAINS(e.msg, "KILN_CACHE_DIR");
    struct stat sb;
    KT_CHECK(stat("/k/dir", &sb) != 0); /* nothing was created */
    for (int i = 0; i < 3; i++) {
        env_set(names[i], saved[i]);
        free(saved[i]);
    }
}

/* ---- injected SQLite failures ---------------------------------------------------------------- */

KT_TEST(cache_fault_put)
{
    kiln__cache *c = open_ok(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__entry old, fresh, got;
    kiln__err e = {{0}};
    make_entry(&old, 1, 4000);
    make_entry(&fresh, 2, 5000);
    KT_OK(kiln__cache_put(c, &old, &e), e.msg);
    int failures = 0;
    for (int n = 1; n < 50; n++) {
        /* replace the old row with new content, failing the n-th statement */
        kiln__entry changed = fresh;
        memcpy(changed.key, old.key, 33);
        kiln__fault_arm("sqlite", n);
        kiln_status s = kiln__cache_put(c, &changed, &e);
        kiln__fault_arm("sqlite", 0);
        if (s == KILN_STATUS_OK) break;
        failures++;
        KT_EQ_INT(s, KILN_STATUS_CACHE);
        KT_CONTAINS(e.msg, "injected");
        KT_CONTAINS(e.msg, old.key);
        /* the prior row is intact and the handle still works */
        KT_OK(kiln__cache_get(c, old.key, 1, &got, &e), e.msg);
        KT_CHECK(got.cubin_size == old.cubin_size &&
                 memcmp(got.cubin, old.cubin, old.cubin_size) == 0);
        kiln__entry_free(&got);
        KT_EQ_INT(count_rows(c), 1);
        check_integrity(kiln__cache_path(c));
    }
    KT_CHECK(failures >= 3); /* begin, insert, commit */
    KT_OK(kiln__cache_get(c, old.key, 0, &got, &e), e.msg);
    KT_CHECK(got.cubin_size == fresh.cubin_size &&
             memcmp(got.cubin, fresh.cubin, fresh.cubin_size) == 0);
    kiln__entry_free(&got);
    KT_OK(kiln__cache_put(c, &fresh, &e), e.msg);
    KT_EQ_INT(count_rows(c), 2);
    check_integrity(kiln__cache_path(c));
    kiln__entry_free(&old);
    kiln__entry_free(&fresh);
    kiln__cache_close(c);
}

KT_TEST(cache_fault_get)
{
    kiln__cache *c = open_ok(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__entry en, got;
    kiln__err e = {{0}};
    make_entry(&en, 4, 100);
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    int failed = 0, ok = 0;
    for (int n = 1; n <= 10; n++) { /* select, then begin / update / stats / commit of the hit */
        kiln__fault_arm("sqlite", n);
        kiln_status s = kiln__cache_get(c, en.key, 1, &got, &e);
        kiln__fault_arm("sqlite", 0);
        if (s == KILN_STATUS_OK) {
            ok++;
            KT_CHECK(got.cubin_size == en.cubin_size &&
                     memcmp(got.cubin, en.cubin, en.cubin_size) == 0);
        } else {
            failed++;
            KT_EQ_INT(s, KILN_STATUS_CACHE);
            KT_CONTAINS(e.msg, "injected");
            KT_CHECK(got.cubin == NULL);
        }
        kiln__entry_free(&got);
    }
    KT_EQ_INT(failed, 1); /* only the SELECT fails the read; the hit counter is best effort */
    KT_CHECK(ok >= 4);
    check_integrity(kiln__cache_path(c));
    kiln__entry_free(&en);
    kiln__cache_close(c);
}

KT_TEST(cache_fault_open)
{
    const char *dir = join(kt_tmpdir(), "c");
    const char *db = join(dir, "kernels.db");
    char wal[1100], shm[1100];
    snprintf(wal, sizeof wal, "%s-wal", db);
    snprintf(shm, sizeof shm, "%s-shm", db);
    int failures = 0;
    for (int n = 1; n < 100; n++) {
        /* from nothing, fail the n-th statement of creating the cache */
        unlink(db);
        unlink(wal);
        unlink(shm);
        kiln__cache *c = NULL;
        kiln__err e = {{0}};
        kiln__fault_arm("sqlite", n);
        kiln_status s = kiln__cache_open(dir, &c, &e);
        kiln__fault_arm("sqlite", 0);
        if (s == KILN_STATUS_OK) {
            kiln__cache_close(c);
            break;
        }
        failures++;
        KT_EQ_INT(s, KILN_STATUS_CACHE);
        KT_CONTAINS(e.msg, "injected");
        KT_CHECK(c == NULL);
        /* whatever was left behind, a clean open completes it */
        c = open_ok(dir);
        KT_REQUIRE(c);
        KT_EQ_INT(count_rows(c), 0);
        kiln__cache_close(c);
        check_integrity(db);
        char *jm = raw_text(db, "PRAGMA journal_mode");
        KT_EQ_STR(jm, "wal");
        free(jm);
    }
    KT_CHECK(failures >= 10); /* inspect, begin, schema statements, commit, pragmas */
    check_integrity(db);
}

/* ---- concurrency ----------------------------------------------------------------------------- */

#define THREADS    4
#define PER_THREAD 60

typedef struct worker {
    kiln__cache *c;
    int id;
    int errors;
    char msg[1024];
} worker;

/* Put PER_THREAD entries of its own, reading each back, and read the other workers' too. */
static void *work(void *arg)
{
    worker *w = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        kiln__entry en, got;
        kiln__err e = {{0}};
        make_entry(&en, w->id * 1000 + i, 200 + (size_t)i);
        kiln_status s = kiln__cache_put(w->c, &en, &e);
        if (!s) s = kiln__cache_get(w->c, en.key, 1, &got, &e);
        if (!s && (got.cubin_size != en.cubin_size || memcmp(got.cubin, en.cubin, en.cubin_size)))
            s = KILN_STATUS_MISMATCH;
        kiln__entry_free(&got);
        kiln__entry_free(&en);
        /* another worker's entry: present or not yet, never an error */
        make_entry(&en, ((w->id + 1) % THREADS) * 1000 + i, 1);
        kiln_status s2 = kiln__cache_get(w->c, en.key, 0, &got, &e);
        if (!s && s2 != KILN_STATUS_OK && s2 != KILN_STATUS_NOT_FOUND) s = s2;
        kiln__entry_free(&got);
        kiln__entry_free(&en);
        if (s) {
            if (!w->errors++)
                snprintf(w->msg, sizeof w->msg, "%s: %.900s", kiln_status_str(s), e.msg);
        }
    }
    return NULL;
}

static void run_workers(kiln__cache **handles, int nhandles)
{
    pthread_t t[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){.c = handles[i % nhandles], .id = i};
        KT_REQUIRE(pthread_create(&t[i], NULL, work, &w[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        KT_EQ_INT(w[i].errors, 0);
        if (w[i].errors) printf("    worker %d: %s\n", i, w[i].msg);
    }
}

KT_TEST(cache_threads_one_handle)
{
    kiln__cache *c = open_ok(kt_tmpdir());
    KT_REQUIRE(c);
    run_workers(&c, 1);
    KT_EQ_INT(count_rows(c), THREADS * PER_THREAD);
    kiln__cache_close(c);
    check_integrity(join(kt_tmpdir(), "kernels.db"));
}

KT_TEST(cache_threads_two_handles)
{
    kiln__cache *h[2] = {open_ok(kt_tmpdir()), open_ok(kt_tmpdir())};
    KT_REQUIRE(h[0] && h[1]);
    run_workers(h, 2);
    KT_EQ_INT(count_rows(h[0]), THREADS * PER_THREAD);
    KT_EQ_INT(count_rows(h[1]), THREADS * PER_THREAD);
    kiln__cache_close(h[0]);
    kiln__cache_close(h[1]);
    check_integrity(join(kt_tmpdir(), "kernels.db"));
}

KT_TEST(cache_processes_fresh_file)
{
    /* several processes open the same fresh cache at the same moment; all must succeed */
    enum { PROCS = 6 };
    const char *dir = join(kt_tmpdir(), "c");
    int gate[2];
    KT_REQUIRE(pipe(gate) == 0);
    fflush(stdout);
    pid_t pids[PROCS];
    for (int i = 0; i < PROCS; i++) {
        pids[i] = fork();
        KT_REQUIRE(pids[i] >= 0);
        if (pids[i] == 0) {
            close(gate[1]);
            char b;
            while (read(gate[0], &b, 1) > 0) {
            }
            kiln__cache *c = NULL;
            kiln__err e = {{0}};
            kiln__entry en;
            make_entry(&en, 500 + i, 100);
            kiln_status s = kiln__cache_open(dir, &c, &e);
            if (!s) s = kiln__cache_put(c, &en, &e);
            if (s) printf("    process %d: %s: %s\n", i, kiln_status_str(s), e.msg);
            kiln__entry_free(&en);
            kiln__cache_close(c);
            fflush(stdout);
            _exit(s ? 1 : 0);
        }
    }
    close(gate[0]);
    close(gate[1]); /* opens the gate for every child at once */
    for (int i = 0; i < PROCS; i++) {
        int status = 0;
        KT_CHECK(waitpid(pids[i], &status, 0) == pids[i]);
        KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    kiln__cache *c = open_ok(dir);
    KT_REQUIRE(c);
    KT_EQ_INT(count_rows(c), PROCS);
    kiln__cache_close(c);
    check_integrity(join(dir, "kernels.db"));
}

/* ---- schema version 2: migration, open flags, NFS -------------------------------------------- */

KT_TEST(cache_migrate_v1)
{
    const char *dir = join(kt_tmpdir(), "c");
    const char *db = join(dir, "kernels.db");
    kiln__cache *c = open_ok(dir);
    KT_REQUIRE(c);
    kiln__entry en;
    make_entry(&en, 7, 300);
    kiln__err e = {{0}};
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__cache_close(c);
    /* turn it into what kiln 0.1 wrote: version 1, no leases table */
    KT_REQUIRE(
        raw_exec(db, "DROP TABLE leases; UPDATE meta SET v = '1' WHERE k = 'schema_version'"));
    size_t n0 = 0, n1 = 0;
    char *before = slurp(db, &n0);
    /* read-only (a base cache): read as it is, not a byte written */
    c = NULL;
    KT_OK(kiln__cache_open_ex(dir, KILN__CACHE_RDONLY, &c, &e), e.msg);
    KT_REQUIRE(c);
    KT_EQ_INT(kiln__cache_schema(c), 1);
    kiln__entry got;
    KT_OK(kiln__cache_get(c, en.key, 0, &got, &e), e.msg);
    kiln__entry_free(&got);
    kiln__cache_close(c);
    char *after = slurp(db, &n1);
    KT_CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    free(before);
    free(after);
    /* writable: migrated in place, rows kept */
    c = open_ok(dir);
    KT_REQUIRE(c);
    KT_EQ_INT(kiln__cache_schema(c), KILN__CACHE_SCHEMA_VERSION);
    KT_OK(kiln__cache_get(c, en.key, 1, &got, &e), e.msg);
    KT_CHECK(got.cubin_size == en.cubin_size && !memcmp(got.cubin, en.cubin, en.cubin_size));
    kiln__entry_free(&got);
    kiln__cache_close(c);
    char *v = raw_text(db, "SELECT v FROM meta WHERE k = 'schema_version'");
    KT_EQ_STR(v, SCHEMA_STR);
    free(v);
    v = raw_text(db, "SELECT count(*) FROM leases");
    KT_EQ_STR(v, "0");
    free(v);
    /* a failed migration (injected) leaves a version-1 cache that the next open migrates */
    KT_REQUIRE(
        raw_exec(db, "DROP TABLE leases; UPDATE meta SET v = '1' WHERE k = 'schema_version'"));
    int failures = 0;
    for (int n = 1; n < 40; n++) {
        c = NULL;
        kiln__fault_arm("sqlite", n);
        kiln_status s = kiln__cache_open(dir, &c, &e);
        kiln__fault_arm("sqlite", 0);
        kiln__cache_close(c);
        if (s == KILN_STATUS_OK) break;
        failures++;
        KT_CONTAINS(e.msg, "injected");
        v = raw_text(db, "SELECT v FROM meta WHERE k = 'schema_version'");
        KT_CHECK(v && (!strcmp(v, "1") || !strcmp(v, SCHEMA_STR)));
        free(v);
        check_integrity(db);
    }
    KT_CHECK(failures >= 3);
    v = raw_text(db, "SELECT v FROM meta WHERE k = 'schema_version'");
    KT_EQ_STR(v, SCHEMA_STR);
    free(v);
    kiln__entry_free(&en);
    check_integrity(db);
}

KT_TEST(cache_open_flags)
{
    const char *dir = join(kt_tmpdir(), "c");
    const char *db = join(dir, "kernels.db");
    kiln__err e = {{0}};
    kiln__cache *c = NULL;
    /* a read-only open creates nothing */
    KT_STATUS(kiln__cache_open_ex(dir, KILN__CACHE_RDONLY, &c, &e), KILN_STATUS_IO, e.msg);
    KT_CONTAINS(e.msg, "directory");
    KT_CHECK(access(dir, F_OK) != 0);
    c = open_ok(dir);
    KT_REQUIRE(c);
    kiln__entry en, got;
    make_entry(&en, 2, 500);
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__cache_close(c);
    size_t n0 = 0, n1 = 0;
    char *before = slurp(db, &n0);
    struct stat s0, s1;
    KT_REQUIRE(stat(db, &s0) == 0);
    KT_OK(kiln__cache_open_ex(dir, KILN__CACHE_RDONLY, &c, &e), e.msg);
    KT_REQUIRE(c);
    const char *why = NULL;
    KT_EQ_INT(kiln__cache_readonly(c, &why), 1);
    KT_CONTAINS(why, "read-only");
    KT_OK(kiln__cache_get(c, en.key, 1, &got, &e), e.msg);
    KT_EQ_INT(got.hits, 0); /* no counter is bumped */
    kiln__entry_free(&got);
    KT_STATUS(kiln__cache_put(c, &en, &e), KILN_STATUS_IO, e.msg);
    KT_CONTAINS(e.msg, "read-only");
    kiln__lease l;
    KT_STATUS(kiln__cache_lease_take(c, en.key, 0, &l, &e), KILN_STATUS_IO, e.msg);
    KT_STATUS(kiln__cache_evict(c, 0, NULL, NULL, NULL, &e), KILN_STATUS_IO, e.msg);
    kiln__cache_close(c);
    char *after = slurp(db, &n1);
    KT_REQUIRE(stat(db, &s1) == 0);
    KT_CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    KT_EQ_INT(s0.st_mtime, s1.st_mtime);
    KT_CHECK(access(join(dir, "kernels.db-wal"), F_OK) != 0);
    KT_CHECK(access(join(dir, "kernels.db-shm"), F_OK) != 0);
    free(before);
    free(after);
    /* a file path instead of a directory */
    KT_OK(kiln__cache_open_ex(join(kt_tmpdir(), "out.db"), KILN__CACHE_FILE, &c, &e), e.msg);
    KT_REQUIRE(c);
    KT_EQ_STR(kiln__cache_path(c), join(kt_tmpdir(), "out.db"));
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__cache_close(c);
    KT_STATUS(kiln__cache_open_ex(join(kt_tmpdir(), "nodir/out.db"), KILN__CACHE_FILE, &c, &e),
              KILN_STATUS_IO, e.msg);
    KT_CONTAINS(e.msg, "missing");
    kiln__entry_free(&en);
}

KT_TEST(cache_nfs_refused)
{
    const char *dir = join(kt_tmpdir(), "c");
    kiln__cache *c = open_ok(dir);
    kiln__cache_close(c);
    kiln__err e = {{0}};
    kiln__fault_arm("nfs", 1); /* the file system check reports NFS */
    KT_STATUS(kiln__cache_open(dir, &c, &e), KILN_STATUS_UNSUPPORTED, e.msg);
    kiln__fault_arm("nfs", 0);
    KT_CONTAINS(e.msg, "NFS");
    KT_CONTAINS(e.msg, "local disk");
    KT_CHECK(c == NULL);
    /* read-only (a shipped base cache on NFS) is read without locks */
    kiln__fault_arm("nfs", 1);
    KT_OK(kiln__cache_open_ex(dir, KILN__CACHE_RDONLY, &c, &e), e.msg);
    kiln__fault_arm("nfs", 0);
    KT_CHECK(c != NULL);
    kiln__cache_close(c);
}

/* ---- leases ------------------------------------------------------------------------------------ */

/* Insert a lease row for key directly. */
static void put_lease(const char *db, const char *key, const char *host, long pid, int64_t expires)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT OR REPLACE INTO leases(key, holder, pid, host, expires) VALUES "
             "('%s', '%s/%ld/test', %ld, '%s', %lld)",
             key, host, pid, pid, host, (long long)expires);
    KT_CHECK(raw_exec(db, sql));
}

KT_TEST(cache_lease_states)
{
    const char *dir = join(kt_tmpdir(), "c");
    const char *db = join(dir, "kernels.db");
    kiln__cache *a = open_ok(dir), *b = open_ok(dir);
    KT_REQUIRE(a && b);
    kiln__entry en;
    make_entry(&en, 9, 100);
    kiln__err e = {{0}};
    kiln__lease l;
    KT_OK(kiln__cache_lease_take(a, en.key, 0, &l, &e), e.msg);
    KT_EQ_INT(l.state, KILN__LEASE_TAKEN);
    KT_EQ_INT(l.pid, getpid());
    /* another handle (same live process) waits */
    KT_OK(kiln__cache_lease_take(b, en.key, 0, &l, &e), e.msg);
    KT_EQ_INT(l.state, KILN__LEASE_HELD);
    KT_EQ_INT(l.pid, getpid());
    KT_CHECK(l.expires > (int64_t)time(NULL));
    /* the holder stores the row and lets go: the other reads it */
    KT_OK(kiln__cache_put(a, &en, &e), e.msg);
    kiln__cache_lease_release(a, en.key);
    KT_OK(kiln__cache_lease_take(b, en.key, 0, &l, &e), e.msg);
    KT_EQ_INT(l.state, KILN__LEASE_PRESENT);
    /* replacing a corrupt row takes the lease even though the row exists */
    KT_OK(kiln__cache_lease_take(b, en.key, 1, &l, &e), e.msg);
    KT_EQ_INT(l.state, KILN__LEASE_TAKEN);
    kiln__cache_lease_release(b, en.key);
    char *v = raw_text(db, "SELECT count(*) FROM leases");
    KT_EQ_STR(v, "0");
    free(v);

    char host[64] = "";
    gethostname(host, sizeof host);
    const char *k2 = "00000000000000000000000000000002";
    /* a dead process of this host: its lease blocks nobody */
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    put_lease(db, k2, host, (long)dead, (int64_t)time(NULL) + 1000);
    KT_OK(kiln__cache_lease_take(a, k2, 0, &l, &e), e.msg);
    KT_EQ_INT(l.state, KILN__LEASE_TAKEN);
    kiln__cache_lease_release(a, k2);
    /* a live process, but expired */
    put_lease(db, k2, host, 1, (int64_t)time(NULL) - 1);
    KT_OK(kiln__cache_lease_take(a, k2, 0, &l, &e), e.msg);
    KT_EQ_INT(l.state, KILN__LEASE_TAKEN);
    kiln__cache_lease_release(a, k2);
    /* this process, but no open handle holds it (a release that failed): blocks nobody here */
    put_lease(db, k2, host, (long)getpid(), (int64_t)time(NULL) + 1000);
    KT_OK(kiln__cache_lease_take(a, k2, 0, &l, &e), e.msg);
    KT_EQ_INT(l.state, KILN__LEASE_TAKEN);
    kiln__cache_lease_release(a, k2);
    /* another host: trusted until it expires */
    put_lease(db, k2, "elsewhere.example", (long)dead, (int64_t)time(NULL) + 1000);
    KT_OK(kiln__cache_lease_take(a, k2, 0, &l, &e), e.msg);
    KT_EQ_INT(l.state, KILN__LEASE_HELD);
    KT_EQ_STR(l.host, "elsewhere.example");
    /* sweep: drops dead and expired leases, keeps live ones */
    put_lease(db, "00000000000000000000000000000003", host, (long)dead, (int64_t)time(NULL) + 1000);
    put_lease(db, "00000000000000000000000000000004", host, 1, (int64_t)time(NULL) - 5);
    int removed = -1, live = -1;
    KT_OK(kiln__cache_lease_sweep(a, &removed, &live, &e), e.msg);
    KT_EQ_INT(removed, 2);
    KT_EQ_INT(live, 1);
    v = raw_text(db, "SELECT group_concat(key) FROM leases");
    KT_EQ_STR(v, k2);
    free(v);
    /* an injected failure while taking: a clear error, no lease left */
    const char *k5 = "00000000000000000000000000000005";
    for (int n = 1; n < 10; n++) {
        kiln__fault_arm("sqlite", n);
        kiln_status s = kiln__cache_lease_take(a, k5, 0, &l, &e);
        kiln__fault_arm("sqlite", 0);
        if (s == KILN_STATUS_OK) break;
        KT_EQ_INT(s, KILN_STATUS_CACHE);
        KT_CONTAINS(e.msg, "compile lease of ");
        KT_CONTAINS(e.msg, "injected");
        v = raw_text(db,
                     "SELECT count(*) FROM leases WHERE key = '00000000000000000000000000000005'");
        KT_EQ_STR(v, "0");
        free(v);
    }
    kiln__cache_lease_release(a, k5);
    kiln__entry_free(&en);
    kiln__cache_close(a);
    kiln__cache_close(b);
    check_integrity(db);
}

/* ---- eviction ---------------------------------------------------------------------------------- */

KT_TEST(cache_evict_lru)
{
    kiln__cache *c = open_ok(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__err e = {{0}};
    enum { N = 10, SIZE = 1000 };
    char keys[N][33];
    for (int i = 0; i < N; i++) {
        kiln__entry en;
        make_entry(&en, 100 + i, SIZE);
        en.created = 1700000000;
        en.last_used = 1700000000 + (i * 7) % N; /* a shuffled order of use */
        memcpy(keys[i], en.key, 33);
        KT_OK(kiln__cache_put(c, &en, &e), e.msg);
        kiln__entry_free(&en);
    }
    int removed = 0;
    int64_t freed = 0;
    KT_OK(kiln__cache_evict(c, N * SIZE, NULL, &removed, &freed, &e), e.msg);
    KT_EQ_INT(removed, 0);
    /* keep 5500 bytes: the 5 least recently used go, and the one we keep stays */
    const char *keep = keys[0]; /* last_used is the oldest */
    KT_OK(kiln__cache_evict(c, 5500, keep, &removed, &freed, &e), e.msg);
    KT_EQ_INT(removed, 5);
    KT_EQ_INT(freed, 5 * SIZE);
    kiln__cache_stats st;
    KT_OK(kiln__cache_stats_get(c, &st, &e), e.msg);
    KT_CHECK(st.bytes <= 5500);
    for (int i = 0; i < N; i++) {
        kiln__entry got;
        int age = (i * 7) % N;         /* 0 oldest */
        int want = i == 0 || age >= 6; /* kept: `keep`, and the 4 most recent of the others */
        kiln_status s = kiln__cache_get(c, keys[i], 0, &got, &e);
        kiln__entry_free(&got);
        if (want) KT_EQ_INT(s, KILN_STATUS_OK);
        else KT_EQ_INT(s, KILN_STATUS_NOT_FOUND);
    }
    KT_OK(kiln__cache_evict(c, 0, NULL, &removed, &freed, &e), e.msg);
    KT_EQ_INT(count_rows(c), 0);
    KT_STATUS(kiln__cache_evict(c, -1, NULL, &removed, &freed, &e), KILN_STATUS_INVALID_ARGUMENT,
              e.msg);
    kiln__cache_close(c);
}

KT_TEST(cache_parse_size)
{
    static const struct {
        const char *s;
        int64_t v;
    } good[] = {{"0", 0},        {"1048576", 1048576}, {"512K", 512 << 10}, {"512k", 512 << 10},
                {"3M", 3 << 20}, {"2G", 2LL << 30},    {"2GiB", 2LL << 30}, {"1T", 1LL << 40},
                {"100B", 100},   {"7MB", 7 << 20}};
    static const char *const bad[] = {
        "", "M", "-1", "1.5G", "12X", "1 G", "99999999999999999999", "9000000000T", "GiB", "1iB"};
    kiln__err e = {{0}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t v = -1;
        KT_OK(kiln__cache_parse_size(good[i].s, &v, &e), e.msg);
        KT_EQ_INT(v, good[i].v);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v = -1;
        KT_STATUS(kiln__cache_parse_size(bad[i], &v, &e), KILN_STATUS_INVALID_ARGUMENT, bad[i]);
        KT_CONTAINS(e.msg, "size '");
    }
}
