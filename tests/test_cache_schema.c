/*
 * test_cache_schema.c — opening a cache (cache/schema.c): creation and permissions, the
 * default directory, refusing foreign / future / garbage files without touching them, bad
 * directories, injected SQLite failures while creating, the migration from schema version 1,
 * the open flags (read-only, a file path) and the NFS refusal. Needs no GPU. Each test works
 * in its own kt_tmpdir().
 */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache.h"
#include "kt.h"

#define STR_(x)    #x
#define STR(x)     STR_(x)
#define SCHEMA_STR STR(KILN__CACHE_SCHEMA_VERSION)

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
    const char *dir = kt_path("cache");
    mode_t old = umask(0); /* modes must not depend on the umask */
    kiln__cache *c = KT_CACHE_OPEN(dir);
    umask(old);
    KT_REQUIRE(c);
    const char *db = kt_join(dir, "kernels.db");
    KT_EQ_STR(kiln__cache_path(c), db);
    KT_EQ_INT(kt_file_mode(dir), 0700);
    KT_EQ_INT(kt_file_mode(db), 0600);
    kiln__entry en;
    kt_entry(&en, 1, 100);
    kiln__err e = {{0}};
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__entry_free(&en);
    int wal_mode = kt_file_mode(kt_join(dir, "kernels.db-wal"));
    KT_CHECK(wal_mode == 0600 || wal_mode == -1); /* SQLite gives -wal the file's mode */
    char *jm = kt_sql_text(db, "PRAGMA journal_mode");
    KT_EQ_STR(jm, "wal");
    free(jm);
    char *v = kt_sql_text(db, "SELECT v FROM meta WHERE k = 'schema_version'");
    KT_EQ_STR(v, SCHEMA_STR);
    free(v);
    v = kt_sql_text(db, "SELECT v FROM meta WHERE k = 'created_by'");
    KT_EQ_STR(v, "kiln " KILN_VERSION_STRING);
    free(v);
    v = kt_sql_text(
        db, "SELECT group_concat(k || '=' || v, ',') FROM (SELECT k, v FROM stats ORDER BY k)");
    KT_EQ_STR(v, "hits=0,misses=0");
    free(v);
    kiln__cache_close(c);
    kiln__cache_close(NULL);
    /* a trailing slash names the same file */
    c = KT_CACHE_OPEN(kt_path("cache/"));
    if (c) KT_EQ_STR(kiln__cache_path(c), db);
    kiln__cache_close(c);
    KT_INTEGRITY(db);
}

KT_TEST(cache_open_empty_file)
{
    const char *dir = kt_path("c");
    KT_REQUIRE(mkdir(dir, 0700) == 0);
    kt_write(kt_join(dir, "kernels.db"), "", 0); /* a 0-byte file is ours to initialise */
    kiln__cache *c = KT_CACHE_OPEN(dir);
    KT_REQUIRE(c);
    KT_EQ_INT(kt_cache_rows(c), 0);
    kiln__cache_close(c);
}

KT_TEST(cache_refuse_garbage)
{
    const char *dir = kt_path("c");
    const char *db = kt_join(dir, "kernels.db");
    KT_REQUIRE(mkdir(dir, 0700) == 0);
    static const size_t sizes[] = {5, 100, 8192};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char *junk = malloc(sizes[i]);
        for (size_t b = 0; b < sizes[i]; b++) junk[b] = (char)('a' + (b * 7 + i) % 26);
        kt_write(db, junk, sizes[i]);
        open_fails(dir, KILN_STATUS_CACHE, "not a kiln cache (file is not a database)", db);
        size_t n = 0;
        char *after = kt_slurp(db, &n);
        KT_EQ_INT(n, sizes[i]);
        KT_CHECK(after && memcmp(after, junk, sizes[i]) == 0);
        free(after);
        free(junk);
    }
}

KT_TEST(cache_refuse_future)
{
    const char *dir = kt_path("c");
    const char *db = kt_join(dir, "kernels.db");
    kiln__cache *c = KT_CACHE_OPEN(dir);
    KT_REQUIRE(c);
    kiln__cache_close(c);
    KT_REQUIRE(kt_sql_exec(db, "UPDATE meta SET v = '7' WHERE k = 'schema_version'"));
    size_t n0 = 0, n1 = 0;
    char *before = kt_slurp(db, &n0);
    open_fails(dir, KILN_STATUS_CACHE, "written by schema version 7",
               "this kiln reads up to " SCHEMA_STR);
    char *after = kt_slurp(db, &n1);
    KT_CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    free(before);
    free(after);
    char *v = kt_sql_text(db, "SELECT v FROM meta WHERE k = 'schema_version'");
    KT_EQ_STR(v, "7");
    free(v);
}

KT_TEST(cache_refuse_foreign)
{
    const char *dir = kt_path("c");
    const char *db = kt_join(dir, "kernels.db");
    KT_REQUIRE(mkdir(dir, 0700) == 0);
    /* someone else's database in rollback mode */
    KT_REQUIRE(kt_sql_exec(db, "CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT);"
                               "INSERT INTO notes(body) VALUES ('mine'), ('also mine');"));
    size_t n0 = 0, n1 = 0;
    char *before = kt_slurp(db, &n0);
    open_fails(dir, KILN_STATUS_CACHE, "not a kiln cache", "no table 'meta'");
    char *after = kt_slurp(db, &n1);
    KT_CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    free(before);
    free(after);

    /* a 'meta' table that is not kiln's */
    KT_REQUIRE(kt_sql_exec(db, "CREATE TABLE meta(name TEXT, value TEXT);"));
    before = kt_slurp(db, &n0);
    open_fails(dir, KILN_STATUS_CACHE, "not a kiln cache", "'meta'");
    after = kt_slurp(db, &n1);
    KT_CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    free(before);
    free(after);

    /* a foreign WAL database whose last commits still sit in the -wal file: refusing it must
     * not checkpoint them into the main file */
    const char *db2dir = kt_path("w");
    KT_REQUIRE(mkdir(db2dir, 0700) == 0);
    const char *db2 = kt_join(db2dir, "kernels.db");
    sqlite3 *own = NULL;
    KT_REQUIRE(sqlite3_open(db2, &own) == SQLITE_OK);
    KT_REQUIRE(sqlite3_exec(own,
                            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;"
                            "CREATE TABLE t(x); INSERT INTO t VALUES (1), (2);",
                            NULL, NULL, NULL) == SQLITE_OK);
    before = kt_slurp(db2, &n0);
    open_fails(db2dir, KILN_STATUS_CACHE, "not a kiln cache", NULL);
    after = kt_slurp(db2, &n1);
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
    kiln_status s = kiln__cache_open(kt_join(base, "ro_empty"), &c, &e);
    if (s != KILN_STATUS_IO || !strstr(e.msg, "ro_empty/kernels.db") ||
        !strstr(e.msg, "Permission denied")) {
        printf("    read-only empty dir: %s: %s\n", kiln_status_str(s), e.msg);
        bad++;
    }
    kiln__cache_close(c);
    c = NULL;
    /* an unreadable file */
    s = kiln__cache_open(kt_join(base, "unreadable"), &c, &e);
    if (s != KILN_STATUS_IO || !strstr(e.msg, "cannot read") ||
        !strstr(e.msg, "Permission denied")) {
        printf("    unreadable file: %s: %s\n", kiln_status_str(s), e.msg);
        bad++;
    }
    kiln__cache_close(c);
    c = NULL;
    /* a read-only directory holding a cache: reads work, writes are refused with the reason */
    s = kiln__cache_open(kt_join(base, "ro_full"), &c, &e);
    if (s != KILN_STATUS_OK) {
        printf("    read-only dir with a cache: %s: %s\n", kiln_status_str(s), e.msg);
        return bad + 1;
    }
    kiln__entry en, got;
    kt_entry(&en, 3, 64);
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
    kt_write(kt_join(tmp, "file"), "x", 1);
    open_fails(kt_join(tmp, "file/sub"), KILN_STATUS_IO, "file/sub", "Not a directory");
    /* a missing parent: only the last component is created */
    open_fails(kt_join(tmp, "no/such"), KILN_STATUS_IO, "no/such", "parent is missing");
    /* the cache directory is a file */
    open_fails(kt_join(tmp, "file"), KILN_STATUS_IO, "not a directory", NULL);
    /* kernels.db is a directory */
    KT_REQUIRE(mkdir(kt_join(tmp, "d"), 0700) == 0 &&
               mkdir(kt_join(tmp, "d/kernels.db"), 0700) == 0);
    open_fails(kt_join(tmp, "d"), KILN_STATUS_IO, "not a regular file", NULL);

    /* permissions, as an unprivileged user */
    char base[1024];
    snprintf(base, sizeof base, "%s/perm", tmp);
    KT_REQUIRE(mkdir(base, 0755) == 0);
    KT_REQUIRE(mkdir(kt_join(base, "ro_empty"), 0755) == 0);
    kiln__cache *c = KT_CACHE_OPEN(kt_join(base, "unreadable"));
    kiln__cache_close(c);
    c = KT_CACHE_OPEN(kt_join(base, "ro_full"));
    KT_REQUIRE(c);
    kiln__entry en;
    kt_entry(&en, 3, 64);
    kiln__err e = {{0}};
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__entry_free(&en);
    kiln__cache_close(c);
    if (geteuid() != 0) {
        KT_REQUIRE(chmod(kt_join(base, "ro_empty"), 0555) == 0 &&
                   chmod(kt_join(base, "unreadable/kernels.db"), 0200) == 0 &&
                   chmod(kt_join(base, "ro_full"), 0555) == 0);
        KT_EQ_INT(unprivileged_checks(base), 0);
        chmod(kt_join(base, "ro_full"), 0755);
        return;
    }
    /* root: run the checks in a child that drops to nobody; root stays owner of the dirs */
    KT_REQUIRE(chmod(tmp, 0755) == 0 && chmod(base, 0755) == 0 &&
               chmod(kt_join(base, "unreadable"), 0755) == 0);
    KT_REQUIRE(chown(kt_join(base, "ro_full/kernels.db"), KT_NOBODY, KT_NOBODY) == 0);
    KT_REQUIRE(chmod(kt_join(base, "ro_full"), 0755) == 0);
    fflush(stdout);
    pid_t pid = fork();
    KT_REQUIRE(pid >= 0);
    if (pid == 0) {
        if (setgid(KT_NOBODY) != 0 || setuid(KT_NOBODY) != 0) _exit(99);
        int bad = unprivileged_checks(base);
        fflush(stdout);
        _exit(bad ? 1 : 0);
    }
    int status = 0;
    KT_REQUIRE(waitpid(pid, &status, 0) == pid);
    KT_CHECK(WIFEXITED(status));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 99)
        kt_skip("running as root and cannot drop to uid %d: permission checks not run", KT_NOBODY);
    else KT_EQ_INT(WEXITSTATUS(status), 0);
}

/* ---- default directory ----------------------------------------------------------------------- */

KT_TEST(cache_default_dir)
{
    static const char *names[] = {"KILN_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
    char *saved[3];
    for (int i = 0; i < 3; i++) saved[i] = getenv(names[i]) ? strdup(getenv(names[i])) : NULL;
    char out[256];
    kiln__err e = {{0}};
    kt_setenv("KILN_CACHE_DIR", "/k/dir");
    kt_setenv("XDG_CACHE_HOME", "/xdg");
    kt_setenv("HOME", "/home/u");
    KT_OK(kiln__cache_default_dir(out, sizeof out, &e), e.msg);
    KT_EQ_STR(out, "/k/dir");
    kt_setenv("KILN_CACHE_DIR", ""); /* empty means unset */
    KT_OK(kiln__cache_default_dir(out, sizeof out, &e), e.msg);
    KT_EQ_STR(out, "/xdg/kiln");
    kt_setenv("XDG_CACHE_HOME", "relative/path"); /* the XDG spec says ignore relative values */
    KT_OK(kiln__cache_default_dir(out, sizeof out, &e), e.msg);
    KT_EQ_STR(out, "/home/u/.cache/kiln");
    kt_setenv("XDG_CACHE_HOME", NULL);
    KT_OK(kiln__cache_default_dir(out, sizeof out, &e), e.msg);
    KT_EQ_STR(out, "/home/u/.cache/kiln");
    KT_STATUS(kiln__cache_default_dir(out, 8, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_CONTAINS(e.msg, "too long");
    KT_EQ_STR(out, "");
    kt_setenv("HOME", NULL);
    KT_STATUS(kiln__cache_default_dir(out, sizeof out, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_CONTAINS(e.msg, "KILN_CACHE_DIR");
    struct stat sb;
    KT_CHECK(stat("/k/dir", &sb) != 0); /* nothing was created */
    for (int i = 0; i < 3; i++) {
        kt_setenv(names[i], saved[i]);
        free(saved[i]);
    }
}

KT_TEST(cache_fault_open)
{
    const char *dir = kt_path("c");
    const char *db = kt_join(dir, "kernels.db");
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
        c = KT_CACHE_OPEN(dir);
        KT_REQUIRE(c);
        KT_EQ_INT(kt_cache_rows(c), 0);
        kiln__cache_close(c);
        KT_INTEGRITY(db);
        char *jm = kt_sql_text(db, "PRAGMA journal_mode");
        KT_EQ_STR(jm, "wal");
        free(jm);
    }
    KT_CHECK(failures >= 10); /* inspect, begin, schema statements, commit, pragmas */
    KT_INTEGRITY(db);
}

/* ---- schema version 2: migration, open flags, NFS -------------------------------------------- */

KT_TEST(cache_migrate_v1)
{
    const char *dir = kt_path("c");
    const char *db = kt_join(dir, "kernels.db");
    kiln__cache *c = KT_CACHE_OPEN(dir);
    KT_REQUIRE(c);
    kiln__entry en;
    kt_entry(&en, 7, 300);
    kiln__err e = {{0}};
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__cache_close(c);
    /* turn it into what kiln 0.1 wrote: version 1, no leases table */
    KT_REQUIRE(
        kt_sql_exec(db, "DROP TABLE leases; UPDATE meta SET v = '1' WHERE k = 'schema_version'"));
    size_t n0 = 0, n1 = 0;
    char *before = kt_slurp(db, &n0);
    /* read-only (a base cache): read as it is, not a byte written */
    c = NULL;
    KT_OK(kiln__cache_open_ex(dir, KILN__CACHE_RDONLY, &c, &e), e.msg);
    KT_REQUIRE(c);
    KT_EQ_INT(kiln__cache_schema(c), 1);
    kiln__entry got;
    KT_OK(kiln__cache_get(c, en.key, 0, &got, &e), e.msg);
    kiln__entry_free(&got);
    kiln__cache_close(c);
    char *after = kt_slurp(db, &n1);
    KT_CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    free(before);
    free(after);
    /* writable: migrated in place, rows kept */
    c = KT_CACHE_OPEN(dir);
    KT_REQUIRE(c);
    KT_EQ_INT(kiln__cache_schema(c), KILN__CACHE_SCHEMA_VERSION);
    KT_OK(kiln__cache_get(c, en.key, 1, &got, &e), e.msg);
    KT_CHECK(got.cubin_size == en.cubin_size && !memcmp(got.cubin, en.cubin, en.cubin_size));
    kiln__entry_free(&got);
    kiln__cache_close(c);
    char *v = kt_sql_text(db, "SELECT v FROM meta WHERE k = 'schema_version'");
    KT_EQ_STR(v, SCHEMA_STR);
    free(v);
    v = kt_sql_text(db, "SELECT count(*) FROM leases");
    KT_EQ_STR(v, "0");
    free(v);
    /* a failed migration (injected) leaves a version-1 cache that the next open migrates */
    KT_REQUIRE(
        kt_sql_exec(db, "DROP TABLE leases; UPDATE meta SET v = '1' WHERE k = 'schema_version'"));
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
        v = kt_sql_text(db, "SELECT v FROM meta WHERE k = 'schema_version'");
        KT_CHECK(v && (!strcmp(v, "1") || !strcmp(v, SCHEMA_STR)));
        free(v);
        KT_INTEGRITY(db);
    }
    KT_CHECK(failures >= 3);
    v = kt_sql_text(db, "SELECT v FROM meta WHERE k = 'schema_version'");
    KT_EQ_STR(v, SCHEMA_STR);
    free(v);
    kiln__entry_free(&en);
    KT_INTEGRITY(db);
}

KT_TEST(cache_open_flags)
{
    const char *dir = kt_path("c");
    const char *db = kt_join(dir, "kernels.db");
    kiln__err e = {{0}};
    kiln__cache *c = NULL;
    /* a read-only open creates nothing */
    KT_STATUS(kiln__cache_open_ex(dir, KILN__CACHE_RDONLY, &c, &e), KILN_STATUS_IO, e.msg);
    KT_CONTAINS(e.msg, "directory");
    KT_CHECK(access(dir, F_OK) != 0);
    c = KT_CACHE_OPEN(dir);
    KT_REQUIRE(c);
    kiln__entry en, got;
    kt_entry(&en, 2, 500);
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__cache_close(c);
    size_t n0 = 0, n1 = 0;
    char *before = kt_slurp(db, &n0);
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
    char *after = kt_slurp(db, &n1);
    KT_REQUIRE(stat(db, &s1) == 0);
    KT_CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0);
    KT_EQ_INT(s0.st_mtime, s1.st_mtime);
    KT_CHECK(access(kt_join(dir, "kernels.db-wal"), F_OK) != 0);
    KT_CHECK(access(kt_join(dir, "kernels.db-shm"), F_OK) != 0);
    free(before);
    free(after);
    /* a file path instead of a directory */
    KT_OK(kiln__cache_open_ex(kt_path("out.db"), KILN__CACHE_FILE, &c, &e), e.msg);
    KT_REQUIRE(c);
    KT_EQ_STR(kiln__cache_path(c), kt_path("out.db"));
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__cache_close(c);
    KT_STATUS(kiln__cache_open_ex(kt_path("nodir/out.db"), KILN__CACHE_FILE, &c, &e),
              KILN_STATUS_IO, e.msg);
    KT_CONTAINS(e.msg, "missing");
    kiln__entry_free(&en);
}

KT_TEST(cache_nfs_refused)
{
    const char *dir = kt_path("c");
    kiln__cache *c = KT_CACHE_OPEN(dir);
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
