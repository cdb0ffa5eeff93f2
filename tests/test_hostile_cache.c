/*
 * test_hostile_cache.c — the cache library against files and rows it did not
 * write (issue #14): short files and table-less SQLite databases in place of
 * kernels.db (refused, not a byte changed), opening an existing cache only
 * (KILN__CACHE_EXISTING creates and initialises nothing), rows whose texts,
 * numbers or key were edited behind kiln's back (the row checksum), migration
 * of a schema-2 file, corrupt pages reported as corruption rather than a full
 * disk, and the no-GPU message of a context. Needs no GPU and no NVRTC.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cache.h"
#include "jit.h"
#include "kt.h"

/* Open where with flags, expect status want and needle in the message; no
 * handle is left. */
static void open_refused(const char *where, int flags, kiln_status want, const char *needle)
{
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    KT_STATUS(kiln__cache_open_ex(where, flags, &c, &e), want, e.msg);
    KT_CHECK(c == NULL);
    kiln__cache_close(c);
    KT_CONTAINS(e.msg, needle);
}

/* ---- files that are not ours
 * ----------------------------------------------------------------- */

KT_TEST(hostile_cache_short_files)
{
    /* 1 byte used to be initialised as a new cache; 2..511 bytes can be no SQLite
   * database */
    static const size_t sizes[] = {1, 2, 99, 100, 511};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char name[32], junk[512];
        snprintf(name, sizeof name, "s%zu", i);
        const char *dir = kt_path(name);
        KT_REQUIRE(mkdir(dir, 0700) == 0);
        char db[600];
        snprintf(db, sizeof db, "%s/kernels.db", dir);
        for (size_t b = 0; b < sizes[i]; b++) junk[b] = (char)('A' + (b * 5 + i) % 26);
        kt_write(db, junk, sizes[i]);
        open_refused(dir, 0, KILN_STATUS_CACHE, "not a kiln cache");
        open_refused(db, KILN__CACHE_FILE | KILN__CACHE_RDONLY, KILN_STATUS_CACHE,
                     "left untouched");
        size_t n = 0;
        char *after = kt_slurp(db, &n);
        KT_EQ_INT(n, sizes[i]);
        KT_CHECK(after && memcmp(after, junk, sizes[i]) == 0);
        free(after);
        KT_CHECK(!kt_exists(kt_path("s0/kernels.db-wal")));
    }
}

KT_TEST(hostile_cache_tableless_db)
{
    /* someone's SQLite database with no tables: a header, a user_version, nothing
   * else */
    const char *dir = kt_path("c");
    KT_REQUIRE(mkdir(dir, 0700) == 0);
    const char *db = kt_path("c/kernels.db");
    KT_REQUIRE(kt_sql_exec(db, "PRAGMA user_version = 42; CREATE TABLE t(x); DROP TABLE t;"));
    size_t n0 = 0, n1 = 0;
    char *before = kt_slurp(db, &n0);
    KT_CHECK(n0 >= 512);
    open_refused(dir, 0, KILN_STATUS_CACHE, "a SQLite database of ");
    open_refused(dir, 0, KILN_STATUS_CACHE, "with no tables, not made by kiln");
    char *after = kt_slurp(db, &n1);
    KT_CHECK(n0 == n1 && memcmp(before, after, n0) == 0);
    free(before);
    free(after);
}

KT_TEST(hostile_cache_existing_only)
{
    /* a missing directory: not created */
    open_refused(kt_path("none"), KILN__CACHE_EXISTING, KILN_STATUS_NOT_FOUND, "no such cache");
    KT_CHECK(!kt_exists(kt_path("none")));
    /* a missing file in an existing directory: not created */
    KT_REQUIRE(mkdir(kt_path("d"), 0700) == 0);
    open_refused(kt_path("d"), KILN__CACHE_EXISTING, KILN_STATUS_NOT_FOUND, "creates none");
    KT_CHECK(!kt_exists(kt_path("d/kernels.db")));
    open_refused(kt_path("d/x.db"), KILN__CACHE_EXISTING | KILN__CACHE_FILE, KILN_STATUS_NOT_FOUND,
                 "no such cache");
    KT_CHECK(!kt_exists(kt_path("d/x.db")));
    /* a 0-byte file: not initialised (stays 0 bytes), though a plain open would
   */
    kt_write(kt_path("d/kernels.db"), "", 0);
    open_refused(kt_path("d"), KILN__CACHE_EXISTING, KILN_STATUS_NOT_FOUND, "an empty file");
    struct stat sb;
    KT_CHECK(stat(kt_path("d/kernels.db"), &sb) == 0 && sb.st_size == 0);
    /* an existing cache opens, writable */
    static const char *const specs[] = {"op=decode head_dim=64"};
    KT_REQUIRE(kt_cache_fill(kt_path("ok"), specs, 1, NULL) == 0);
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_open_ex(kt_path("ok"), KILN__CACHE_EXISTING, &c, &e), e.msg);
    KT_EQ_INT(kiln__cache_readonly(c, NULL), 0);
    kiln__cache_close(c);
}

/* ---- the row checksum
 * ------------------------------------------------------------------------ */

/* get's status for key, with the message in msg[cap]. */
static kiln_status get_status(const char *dir, const char *key, char *msg, size_t cap)
{
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    kiln_status s = kiln__cache_open(dir, &c, &e);
    kiln__entry en;
    memset(&en, 0, sizeof en);
    if (!s) s = kiln__cache_get(c, key, 0, &en, &e);
    snprintf(msg, cap, "%s", e.msg);
    kiln__entry_free(&en);
    kiln__cache_close(c);
    return s;
}

typedef struct first_bad {
    char why[512];
    int rows, bad;
} first_bad;

static int check_rows(const kiln__entry *en, void *user)
{
    static const kiln__row_rules rules = {kiln__key_hash, KILN__FORMAT_VERSION};
    first_bad *b = user;
    char why[512];
    b->rows++;
    if (kiln__cache_row_check(en, &rules, why, sizeof why)) {
        if (!b->bad++) snprintf(b->why, sizeof b->why, "%s", why);
    }
    return 0;
}

/* Scan dir with the full row check (read-only). */
static first_bad scan(const char *dir)
{
    first_bad b = {{0}, 0, 0};
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    if (kiln__cache_open_ex(dir, KILN__CACHE_RDONLY, &c, &e) ||
        kiln__cache_scan(c, check_rows, &b, &e))
        snprintf(b.why, sizeof b.why, "open/scan: %s", e.msg);
    kiln__cache_close(c);
    return b;
}

KT_TEST(hostile_cache_tampered_fields)
{
    /* each edit leaves the cubin and its checksum alone: only the row checksum
   * sees it */
    static const char *const edits[] = {
        "UPDATE kernels SET source = source || '// edited'",
        "UPDATE kernels SET log = 'ptxas info    : Used 8 registers'",
        "UPDATE kernels SET nvrtc = '12.9'",
        "UPDATE kernels SET registers = 255",
        "UPDATE kernels SET smem_bytes = 0",
        "UPDATE kernels SET compile_ms = 0.5",
    };
    static const char *const specs[] = {"op=decode head_dim=64"};
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        char name[16], key[1][33], msg[1024];
        snprintf(name, sizeof name, "t%zu", i);
        const char *dir = kt_path(name);
        KT_REQUIRE(kt_cache_fill(dir, specs, 1, key) == 0);
        KT_EQ_INT(scan(dir).bad, 0);
        KT_OK(get_status(dir, key[0], msg, sizeof msg), msg);
        char db[600];
        snprintf(db, sizeof db, "%s/kernels.db", dir);
        KT_REQUIRE(kt_sql_exec(db, edits[i]));
        first_bad b = scan(dir);
        KT_EQ_INT(b.bad, 1);
        KT_CONTAINS(b.why, "row checksum mismatch");
        KT_STATUS(get_status(dir, key[0], msg, sizeof msg), KILN_STATUS_CACHE, msg);
        KT_CONTAINS(msg, "failed its row checksum");
        KT_CONTAINS(msg, "not loaded");
    }
}

KT_TEST(hostile_cache_tampered_key)
{
    /* the key and its material changed together (the material still hashes to the
   * key, and names the same spec and arch): the old checks pass it, the row
   * checksum does not */
    static const char *const specs[] = {"op=decode head_dim=64"};
    char key[1][33], msg[1024], sql[1024], newkey[33];
    const char *dir = kt_path("k");
    KT_REQUIRE(kt_cache_fill(dir, specs, 1, key) == 0);
    char material[512];
    snprintf(material, sizeof material,
             "kiln-key-format: %d\nspec: op=decode head_dim=64\nconfig: "
             "tag=99\narch: sm_80\n",
             KILN__FORMAT_VERSION);
    kiln__key_hash(material, newkey);
    snprintf(sql, sizeof sql, "UPDATE kernels SET key = '%s', key_material = '%s'", newkey,
             material);
    KT_REQUIRE(kt_sql_exec(kt_path("k/kernels.db"), sql));
    first_bad b = scan(dir);
    KT_EQ_INT(b.rows, 1);
    KT_EQ_INT(b.bad, 1);
    KT_CONTAINS(b.why, "row checksum mismatch");
    KT_STATUS(get_status(dir, newkey, msg, sizeof msg), KILN_STATUS_CACHE, msg);
    KT_CONTAINS(msg, "failed its row checksum");
    /* a cleared row checksum is no free pass either */
    KT_REQUIRE(kt_sql_exec(kt_path("k/kernels.db"), "UPDATE kernels SET row_sum = ''"));
    b = scan(dir);
    KT_EQ_INT(b.bad, 1);
    KT_CONTAINS(b.why, "no row checksum");
}

KT_TEST(hostile_cache_migrate_v2)
{
    /* a schema-2 file (no row_sum column): a good row and one whose cubin was
   * flipped */
    static const char *const specs[] = {"op=decode head_dim=64", "op=decode head_dim=128"};
    char keys[2][33], msg[1024], sql[512];
    const char *dir = kt_path("m"), *db = kt_path("m/kernels.db");
    KT_REQUIRE(kt_cache_fill(dir, specs, 2, keys) == 0);
    snprintf(sql, sizeof sql,
             "ALTER TABLE kernels DROP COLUMN row_sum;"
             "UPDATE meta SET v = '2' WHERE k = 'schema_version';"
             "UPDATE kernels SET cubin = zeroblob(64) WHERE key = '%s';",
             keys[1]);
    KT_REQUIRE(kt_sql_exec(db, sql));
    /* read-only (a shipped base): read as it is; its rows carry no row checksum
   */
    first_bad b = scan(dir);
    KT_EQ_INT(b.rows, 2);
    KT_EQ_INT(b.bad, 1);
    KT_CONTAINS(b.why, "checksum mismatch");
    /* writable: migrated to 3; the good row is sealed, the bad one is not vouched
   * for */
    KT_OK(get_status(dir, keys[0], msg, sizeof msg), msg);
    b = scan(dir);
    KT_EQ_INT(b.bad, 1);
    KT_CONTAINS(b.why, "checksum mismatch");
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_open(dir, &c, &e), e.msg);
    KT_EQ_INT(kiln__cache_schema(c), 3);
    kiln__cache_close(c);
    /* after the migration the seal protects the good row */
    KT_REQUIRE(kt_sql_exec(db, "UPDATE kernels SET source = 'x'"));
    KT_STATUS(get_status(dir, keys[0], msg, sizeof msg), KILN_STATUS_CACHE, msg);
    KT_CONTAINS(msg, "row checksum");
}

/* ---- corrupt pages
 * ---------------------------------------------------------------------------
 */

KT_TEST(hostile_cache_corrupt_pages)
{
    /* rows with overflow pages, then 4 KiB of damage at several places: whatever
   * fails says the file is corrupt, names it, and never blames a full disk
   * alone */
    static const long offsets[] = {20000, 50000, 100000, 140000};
    static const int patterns = 2;
    int failures = 0;
    for (size_t i = 0; i < sizeof offsets / sizeof offsets[0]; i++) {
        for (int p = 0; p < patterns; p++) {
            char name[16];
            snprintf(name, sizeof name, "x%zu_%d", i, p);
            const char *dir = kt_path(name);
            kiln__cache *c = NULL;
            kiln__err e = {{0}};
            KT_OK(kiln__cache_open(dir, &c, &e), e.msg);
            for (int r = 0; c && r < 4; r++) {
                kiln__entry en;
                kt_entry_valid(&en, "op=decode head_dim=64", "sm_80", r);
                free(en.source);
                en.source = malloc(40000);
                for (int b = 0; en.source && b < 39999; b++)
                    en.source[b] = (char)('a' + (b * 7 + r) % 26);
                if (en.source) en.source[39999] = 0;
                KT_OK(kiln__cache_put(c, &en, &e), e.msg);
                kiln__entry_free(&en);
            }
            KT_OK(kiln__cache_compact(c, 0, &e), e.msg);
            kiln__cache_close(c);
            char db[600];
            snprintf(db, sizeof db, "%s/kernels.db", dir);
            unsigned char junk[4096];
            uint32_t x = 88172645u + (uint32_t)(i * 7 + (size_t)p);
            for (size_t b = 0; b < sizeof junk; b++) {
                x ^= x << 13, x ^= x >> 17, x ^= x << 5;
                junk[b] = p ? (unsigned char)x : 0;
            }
            FILE *f = fopen(db, "r+b");
            KT_REQUIRE(f);
            fseek(f, offsets[i], SEEK_SET);
            fwrite(junk, 1, sizeof junk, f);
            fclose(f);
            c = NULL;
            kiln_status s = kiln__cache_open(dir, &c, &e);
            if (!s) s = kiln__cache_compact(c, 1, &e);
            kiln__cache_close(c);
            if (s == KILN_STATUS_OK) continue;
            failures++;
            KT_CONTAINS(e.msg, db);
            KT_CONTAINS(e.msg, "corrupt");
            if (strstr(e.msg, "disk is full"))
                KT_CONTAINS(e.msg, "SQLite reported: database or disk is full");
        }
    }
    KT_CHECK(failures >= 4);
}

/* ---- the no-GPU message
 * ---------------------------------------------------------------------- */

KT_TEST(hostile_msg_no_gpu)
{
    kiln_ctx *ctx = KT_CTX(NULL, 0);
    KT_REQUIRE(ctx);
    kiln_variant v;
    KT_OK(kiln_variant_parse("op=decode head_dim=64", &v), kiln_errmsg());
    kiln_kernel *k = NULL;
    KT_STATUS(kiln_kernel_get(ctx, &v, &k), KILN_STATUS_NO_DEVICE, kiln_ctx_errmsg(ctx));
    char first[1024];
    snprintf(first, sizeof first, "%s", kiln_ctx_errmsg(ctx));
    KT_CONTAINS(first, "no GPU (context created with no_device)");
    /* the same call again: the same message, not one nested in the last */
    KT_STATUS(kiln_kernel_get(ctx, &v, &k), KILN_STATUS_NO_DEVICE, kiln_ctx_errmsg(ctx));
    KT_EQ_STR(kiln_ctx_errmsg(ctx), first);
    /* an unrelated failure in between is not blamed */
    KT_STATUS(kiln_kernel_get(ctx, NULL, &k), KILN_STATUS_INVALID_ARGUMENT, kiln_ctx_errmsg(ctx));
    KT_STATUS(kiln_kernel_get(ctx, &v, &k), KILN_STATUS_NO_DEVICE, kiln_ctx_errmsg(ctx));
    KT_EQ_STR(kiln_ctx_errmsg(ctx), first);
    KT_CHECK(!strstr(kiln_ctx_errmsg(ctx), "NULL"));
    kiln_ctx_destroy(ctx);
}
