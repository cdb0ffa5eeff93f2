/*
 * test_fleet.c — the cache as a fleet relies on it: strict and record modes, compile leases
 * across processes (8 builders on one empty cache compile each key once), layered caches (a
 * read-only base under the local cache), LRU eviction under a size bound, files that are not
 * caches left untouched, shard + merge equal to one unsharded warm, export, verify and gc.
 * Corruption, killed builders and injected faults are test_fleet_faults.c.
 *
 * Every compile is one of kt.h's four cheap decode variants (KT_SPEC_0..3). The tests run the
 * kiln binary (kt_kiln_bin) with fork + exec where several processes are the point, and the
 * library directly otherwise. Needs no GPU.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "jit.h"
#include "kt.h"

/* The four cheap variants as a manifest. */
static const char manifest4[] = KT_SPEC_0 "\n" KT_SPEC_1 "\n" KT_SPEC_2 "\n" KT_SPEC_3 "\n";

/* The sum of the "N compiled" counts of warm summary lines in text. */
static int compiled_in(const char *text)
{
    int total = 0;
    for (const char *p = strstr(text, " kernels: "); p; p = strstr(p + 1, " kernels: "))
        total += atoi(p + strlen(" kernels: "));
    return total;
}

/* ---- strict and record ------------------------------------------------------------------------ */

KT_TEST(fleet_strict_refuses_miss)
{
    const char *dir = kt_path("c"), *db = kt_path("c/kernels.db");
    char key[33];
    kt_key_of(KT_SPEC_0, "sm_90a", key);
    kiln_ctx *ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_STRICT, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    kiln_variant v;
    KT_OK(kiln_variant_parse(KT_SPEC_0, &v), kiln_errmsg());
    kiln_kernel *k = (kiln_kernel *)&k;
    KT_STATUS(kiln_kernel_compile(ctx, &v, "sm_90a", &k), KILN_STATUS_CACHE_MISS,
              kiln_ctx_errmsg(ctx));
    KT_CHECK(k == NULL);
    const char *msg = kiln_ctx_errmsg(ctx);
    KT_CONTAINS(msg, "strict mode: kernel ");
    KT_CONTAINS(msg, key);
    KT_CONTAINS(msg, "op=decode dtype=bf16 head_dim=64 group=1");
    KT_CONTAINS(msg, "sm_90a");
    KT_CONTAINS(msg, db);
    KT_CONTAINS(msg, "nothing compiled");
    kiln_ctx_destroy(ctx);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM kernels"), 0);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM leases"), 0);

    /* compiled by a normal context, a strict one finds it */
    ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_0, "sm_90a"), 0);
    kiln_ctx_destroy(ctx);
    ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_STRICT, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_0, "sm_90a"), 1);
    kiln_ctx_destroy(ctx);

    /* KILN_STRICT decides in the default mode only */
    setenv("KILN_STRICT", "1", 1);
    ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_DEFAULT, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_1, "sm_90a"), -1);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "strict mode");
    kiln_ctx_destroy(ctx);
    setenv("KILN_STRICT", "0", 1);
    ctx = KT_CTX_POLICY(NULL, KILN_CACHE_MODE_DEFAULT, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_STATUS(kiln_kernel_compile(ctx, &v, "sm_80", &k), KILN_STATUS_OK, kiln_ctx_errmsg(ctx));
    kiln_ctx_destroy(ctx);
    unsetenv("KILN_STRICT");
    /* strict with no cache at all: every request is a miss */
    ctx = KT_CTX_POLICY(NULL, KILN_CACHE_MODE_STRICT, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_STATUS(kiln_kernel_compile(ctx, &v, "sm_80", &k), KILN_STATUS_CACHE_MISS,
              kiln_ctx_errmsg(ctx));
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "the context has none");
    kiln_ctx_destroy(ctx);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM kernels"), 1);

    /* the CLI honours KILN_STRICT: exit 1, the message, nothing compiled */
    kt_out r;
    const char *env[] = {"KILN_STRICT=1", NULL};
    KT_EQ_INT(KT_KILN_ENV(&r, env, "--cache", dir, "compile", "--arch", "sm_90a", KT_SPEC_2), 1);
    KT_CONTAINS(r.err, "strict mode: kernel ");
    KT_CONTAINS(r.err, "nothing compiled");
    kt_out_free(&r);
    KT_EQ_INT(KT_KILN_ENV(&r, env, "--cache", dir, "compile", "--arch", "sm_90a", KT_SPEC_0), 0);
    KT_CONTAINS(r.out, " cached ");
    kt_out_free(&r);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM kernels"), 1);
}

KT_TEST(fleet_record_replays)
{
    const char *dir = kt_path("c"), *db = kt_path("c/kernels.db");
    const char *rec = kt_path("record.manifest");
    kiln_ctx *ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_RECORD, rec, NULL, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_0, "sm_90a"), 0);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_1, "sm_80"), 0);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_0, "sm_90a"), 0); /* memo: not recorded twice */
    kiln_ctx_destroy(ctx);
    /* the environment: appended to the same file by a second context */
    setenv("KILN_RECORD", rec, 1);
    ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_DEFAULT, NULL, NULL, 0);
    unsetenv("KILN_RECORD");
    KT_REQUIRE(ctx);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_0, "sm_80"), 0);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_0, "sm_90a"), 1); /* a hit is recorded too */
    kiln_ctx_destroy(ctx);
    char *text = kt_slurp(rec, NULL);
    KT_CONTAINS(text, "# kiln record manifest");
    KT_CONTAINS(text, "op=decode dtype=bf16 head_dim=64 group=1 layout=nhd mask=none window=0 "
                      "logits=none lse=0 arch=sm_90a\n");
    KT_CONTAINS(text, "group=2 layout=nhd mask=none window=0 logits=none lse=0 arch=sm_80\n");
    int lines = 0;
    for (const char *p = text; *p; p++) lines += *p == '\n';
    KT_EQ_INT(lines, 2 + 4);
    free(text);
    char *keys =
        kt_sql_text(db, "SELECT group_concat(key) FROM (SELECT key FROM kernels ORDER BY key)");

    /* replaying the record (no --arch: each line names its own) reaches exactly these keys */
    kt_out r;
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "warm", rec), 0);
    KT_CONTAINS(r.out, "3 kernels: 0 compiled, 3 cached, 0 failed");
    KT_CONTAINS(r.err, "1 repeated (spec, arch) pairs skipped");
    kt_out_free(&r);
    char *after =
        kt_sql_text(db, "SELECT group_concat(key) FROM (SELECT key FROM kernels ORDER BY key)");
    KT_EQ_STR(after, keys);
    free(after);
    free(keys);

    /* record mode without a file */
    kiln_ctx_opts o = {0};
    o.no_device = 1;
    o.no_cache = 1;
    o.mode = KILN_CACHE_MODE_RECORD;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_INVALID_ARGUMENT, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "record_path or KILN_RECORD");
    o.record_path = kt_path("no/such/dir/rec");
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_IO, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "no/such/dir/rec");
}

/* ---- single flight across processes ------------------------------------------------------------ */

KT_TEST(fleet_concurrent_warm)
{
    /* 8 processes warm the same 4-spec manifest into one empty cache at the same moment */
    enum { PROCS = 8 };
    const char *dir = kt_path("c"), *db = kt_path("c/kernels.db"), *m = kt_path("m.txt");
    kt_write_text(m, manifest4);
    pid_t pids[PROCS];
    char tags[PROCS][16];
    for (int i = 0; i < PROCS; i++) {
        snprintf(tags[i], sizeof tags[i], "w%d", i);
        pids[i] = kt_kiln_spawn(tags[i], NULL,
                                (const char *const[]){"--cache", dir, "warm", "--arch", "sm_90a",
                                                      "--jobs", "2", m, NULL});
    }
    int compiled = 0, ok = 0;
    for (int i = 0; i < PROCS; i++) {
        kt_out r;
        if (kt_kiln_reap(pids[i], tags[i], &r) == 0) ok++;
        else printf("    process %d: exit %d: %s\n", i, r.code, r.err);
        KT_CONTAINS(r.out, "4 kernels: ");
        compiled += compiled_in(r.out);
        kt_out_free(&r);
    }
    KT_EQ_INT(ok, PROCS);
    KT_EQ_INT(compiled, 4); /* each key compiled exactly once, by one of the 8 */
    printf("    %d processes, %d keys, %d compiles\n", PROCS, 4, compiled);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM kernels"), 4);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM leases"), 0);
    KT_INTEGRITY(db);
}

/* ---- layered caches ---------------------------------------------------------------------------- */

/* Size and mtime of path, to show nothing wrote it. */
static void file_id(const char *path, off_t *size, time_t *mtime)
{
    struct stat sb;
    *size = -1;
    *mtime = 0;
    if (stat(path, &sb) == 0) {
        *size = sb.st_size;
        *mtime = sb.st_mtime;
    }
}

/* Build a base cache in dir holding KT_SPEC_0 and KT_SPEC_1 for sm_90a. */
static void make_base(const char *dir)
{
    kiln_ctx *ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    if (!ctx) return;
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_0, "sm_90a"), 0);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_1, "sm_90a"), 0);
    kiln_ctx_destroy(ctx);
}

KT_TEST(fleet_layered_base)
{
    const char *base = kt_path("base"), *base_db = kt_path("base/kernels.db");
    const char *local = kt_path("local"), *local_db = kt_path("local/kernels.db");
    make_base(base);
    KT_REQUIRE(chmod(base_db, 0444) == 0 && chmod(base, 0555) == 0);
    size_t n0 = 0, n1 = 0;
    char *before = kt_slurp(base_db, &n0);
    off_t size0, size1;
    time_t mtime0, mtime1;
    file_id(base_db, &size0, &mtime0);

    kiln_ctx *ctx = KT_CTX_POLICY(local, KILN_CACHE_MODE_COMPILE, NULL, base, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_0, "sm_90a"), 1); /* from the base */
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_2, "sm_90a"), 0); /* compiled, stored locally */
    kiln_ctx_destroy(ctx);
    KT_EQ_INT(kt_sql_long(local_db, "SELECT count(*) FROM kernels"), 1);
    /* the environment names the base too; a hit in either layer */
    setenv("KILN_BASE_CACHE_DIR", base, 1);
    ctx = KT_CTX_POLICY(local, KILN_CACHE_MODE_STRICT, NULL, NULL, 0);
    unsetenv("KILN_BASE_CACHE_DIR");
    KT_REQUIRE(ctx);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_1, "sm_90a"), 1);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_2, "sm_90a"), 1);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_3, "sm_90a"), -1);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), local_db);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), base_db);
    kiln_ctx_destroy(ctx);

    /* the base was never written */
    char *after = kt_slurp(base_db, &n1);
    file_id(base_db, &size1, &mtime1);
    KT_CHECK(before && after && n0 == n1 && !memcmp(before, after, n0));
    KT_EQ_INT(size0, size1);
    KT_EQ_INT(mtime0, mtime1);
    KT_CHECK(access(kt_path("base/kernels.db-wal"), F_OK) != 0);
    KT_CHECK(access(kt_path("base/kernels.db-shm"), F_OK) != 0);
    free(before);
    free(after);
    chmod(base, 0755);

    /* a missing base, and a base that is the cache itself, are refused */
    kiln_ctx_opts o = {0};
    o.no_device = 1;
    o.cache_dir = local;
    o.base_cache_dir = kt_path("nope");
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_IO, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "base cache");
    KT_CONTAINS(kiln_errmsg(), "nope");
    o.base_cache_dir = local;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_INVALID_ARGUMENT, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "is the cache itself");

    /* `kiln info` shows both layers */
    kt_out r;
    KT_EQ_INT(KT_KILN(&r, "--cache", local, "--base-cache", base, "info"), 0);
    KT_CONTAINS(r.out, local_db);
    KT_CONTAINS(r.out, "base cache: ");
    KT_CONTAINS(r.out, base_db);
    KT_CONTAINS(r.out, "base cache entries: 2");
    kt_out_free(&r);
}

/* A base cache on a read-only file system (a tmpfs remounted read-only). Needs the right to
 * mount: skipped without it. */
KT_TEST(fleet_base_on_readonly_fs)
{
    const char *mnt = kt_path("ro");
    KT_REQUIRE(mkdir(mnt, 0755) == 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=16m") != 0) {
        kt_skip("cannot mount a tmpfs here (%s): read-only file system not tested",
                strerror(errno));
        return;
    }
    const char *base = kt_path("ro/base");
    make_base(base);
    int ro = mount(NULL, mnt, NULL, MS_REMOUNT | MS_RDONLY, NULL) == 0;
    KT_CHECK(ro);
    if (ro) {
        KT_CHECK(access(kt_path("ro/base/kernels.db"), W_OK) != 0 && errno == EROFS);
        kiln_ctx *ctx = KT_CTX_POLICY(kt_path("local"), KILN_CACHE_MODE_STRICT, NULL, base, 0);
        if (ctx) {
            KT_EQ_INT(kt_compile(ctx, KT_SPEC_0, "sm_90a"), 1);
            KT_EQ_INT(kt_compile(ctx, KT_SPEC_1, "sm_90a"), 1);
            kiln_ctx_destroy(ctx);
        }
        /* the same file as the only, local, cache: opened read-only; a miss is compiled,
         * and not stored, with the reason on stderr */
        ctx = KT_CTX_POLICY(base, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
        if (ctx) {
            KT_EQ_INT(kt_compile(ctx, KT_SPEC_1, "sm_90a"), 1);
            int from_cache = -2;
            char *err = kt_capture_stderr(kt_compile, ctx, KT_SPEC_2, "sm_90a", &from_cache);
            KT_EQ_INT(from_cache, 0);
            KT_CONTAINS(err, "read-only");
            KT_CONTAINS(err, "not stored");
            free(err);
            kiln_ctx_destroy(ctx);
        }
    }
    KT_CHECK(umount2(mnt, MNT_DETACH) == 0);
}

/* ---- size bound --------------------------------------------------------------------------------- */

KT_TEST(fleet_bound_evicts_lru)
{
    const char *dir = kt_path("c"), *db = kt_path("c/kernels.db");
    kiln_ctx *ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    for (int i = 0; i < 3; i++) KT_EQ_INT(kt_compile(ctx, kt_specs4[i], "sm_80"), 0);
    kiln_ctx_destroy(ctx);
    char k[4][33], sql[256];
    for (int i = 0; i < 4; i++) kt_key_of(kt_specs4[i], "sm_80", k[i]);
    /* used long ago, in the order 0, 2, 1 */
    static const int stamp[3] = {100, 300, 200};
    for (int i = 0; i < 3; i++) {
        snprintf(sql, sizeof sql, "UPDATE kernels SET last_used = %d WHERE key = '%s'", stamp[i],
                 k[i]);
        KT_CHECK(kt_sql_exec(db, sql));
    }
    long sizes[4];
    for (int i = 0; i < 3; i++) {
        snprintf(sql, sizeof sql, "SELECT length(cubin) FROM kernels WHERE key = '%s'", k[i]);
        sizes[i] = kt_sql_long(db, sql);
    }
    ctx = KT_CTX_POLICY(NULL, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0); /* the size of the fourth */
    KT_REQUIRE(ctx);
    kiln_variant v;
    kiln_kernel *kk = NULL;
    kiln_variant_parse(KT_SPEC_3, &v);
    KT_OK(kiln_kernel_compile(ctx, &v, "sm_80", &kk), kiln_ctx_errmsg(ctx));
    size_t sz = 0;
    kiln_kernel_cubin(kk, &sz);
    sizes[3] = (long)sz;
    kiln_ctx_destroy(ctx);

    /* a hit on 0 makes it the most recent; storing 3 under a bound that fits three rows must
     * evict 2 (the least recently used), not 0 */
    int64_t bound = sizes[0] + sizes[1] + sizes[3];
    ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, bound);
    KT_REQUIRE(ctx);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_0, "sm_80"), 1);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_3, "sm_80"), 0);
    kiln_ctx_destroy(ctx);
    KT_CHECK(kt_sql_long(db, "SELECT sum(length(cubin)) FROM kernels") <= bound);
    snprintf(sql, sizeof sql,
             "SELECT group_concat(key) FROM (SELECT key FROM kernels ORDER BY key)");
    char *keys = kt_sql_text(db, sql);
    KT_CHECK(strstr(keys, k[0]) && strstr(keys, k[1]) && strstr(keys, k[3]));
    KT_CHECK(!strstr(keys, k[2]));
    free(keys);

    /* the environment sets the bound; a bad value is refused */
    setenv("KILN_CACHE_MAX_BYTES", "12Q", 1);
    kiln_ctx_opts o = {0};
    o.no_device = 1;
    o.cache_dir = dir;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_INVALID_ARGUMENT, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "KILN_CACHE_MAX_BYTES");
    KT_CONTAINS(kiln_errmsg(), "12Q");
    setenv("KILN_CACHE_MAX_BYTES", "1K", 1);
    ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    unsetenv("KILN_CACHE_MAX_BYTES");
    KT_REQUIRE(ctx);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_2, "sm_80"), 0); /* stored; everything else is evicted */
    kiln_ctx_destroy(ctx);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM kernels"), 1);
    o.max_cache_bytes = -5;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_INVALID_ARGUMENT, kiln_errmsg());
}

/* ---- files that are not caches ------------------------------------------------------------ */

KT_TEST(fleet_foreign_files_untouched)
{
    /* a garbage file and a future-schema cache: refused by contexts, warm, verify and merge,
     * and never written */
    const char *g = kt_path("g"), *g_db = kt_path("g/kernels.db");
    KT_REQUIRE(mkdir(g, 0700) == 0);
    kt_write_text(g_db, "these are not the kernels you are looking for\n");
    const char *f = kt_path("f"), *f_db = kt_path("f/kernels.db");
    make_base(f);
    KT_CHECK(kt_sql_exec(f_db, "UPDATE meta SET v = '99' WHERE k = 'schema_version'"));
    size_t ng = 0, nf = 0, n;
    char *g0 = kt_slurp(g_db, &ng), *f0 = kt_slurp(f_db, &nf);
    kiln_ctx_opts o = {0};
    kiln_ctx *ctx = NULL;
    o.no_device = 1;
    o.cache_dir = g;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_CACHE, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "not a kiln cache");
    o.cache_dir = f;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_CACHE, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "schema version 99");
    o.cache_dir = kt_path("ok");
    o.base_cache_dir = f;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_CACHE, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "base cache");
    kt_out r;
    const char *m = kt_path("m.txt");
    kt_write_text(m, KT_SPEC_0 "\n");
    KT_EQ_INT(KT_KILN(&r, "--cache", g, "warm", "--arch", "sm_80", m), 1);
    KT_CONTAINS(r.err, "not a kiln cache");
    kt_out_free(&r);
    KT_EQ_INT(KT_KILN(&r, "--cache", f, "verify"), 1);
    KT_CONTAINS(r.err, "left untouched");
    kt_out_free(&r);
    KT_EQ_INT(KT_KILN(&r, "merge", kt_path("out.db"), f, g), 1);
    KT_CONTAINS(r.err, "written by schema version 99");
    KT_CONTAINS(r.err, "not a kiln cache");
    kt_out_free(&r);
    KT_EQ_INT(KT_KILN(&r, "merge", g_db, kt_path("ok")), 1); /* nor as the output */
    kt_out_free(&r);
    char *g1 = kt_slurp(g_db, &n);
    KT_CHECK(g0 && g1 && n == ng && !memcmp(g0, g1, n));
    free(g1);
    char *f1 = kt_slurp(f_db, &n);
    KT_CHECK(f0 && f1 && n == nf && !memcmp(f0, f1, n));
    free(f1);
    free(g0);
    free(f0);
}

/* ---- shard, merge, export, gc -------------------------------------------------------------------- */

/* Every row of a cache as "key:checksum:hex(cubin)" in key order (malloc'd). */
static char *rows_of(const char *db)
{
    return kt_sql_text(db,
                       "SELECT group_concat(key || ':' || checksum || ':' || hex(cubin), ',') FROM "
                       "(SELECT key, checksum, cubin FROM kernels ORDER BY key)");
}

KT_TEST(fleet_shard_merge)
{
    /* 3 specs (from braces) x 2 archs; shards i/n for n = 1..4, merged per n, equal one
     * unsharded warm (n = 1) row for row and byte for byte */
    const char *m = kt_path("m.txt");
    kt_write_text(m, "# braces: three specs\nop=decode dtype=bf16 head_dim=64 group={1,2,4}\n");
    char whole_db[700] = "";
    kt_out r;
    for (int n = 1; n <= 4; n++) {
        char out[700], cmdline[64];
        snprintf(out, sizeof out, "%s/merged%d.db", kt_tmpdir(), n);
        int items = 0;
        const char *margs[8] = {"merge", out};
        int nm = 2;
        static char dirs[4][700];
        for (int i = 0; i < n; i++) {
            snprintf(dirs[i], sizeof dirs[i], "%s/shard%d_%d", kt_tmpdir(), n, i);
            snprintf(cmdline, sizeof cmdline, "%d/%d", i, n);
            KT_EQ_INT(KT_KILN(&r, "--cache", dirs[i], "warm", "--arch", "sm_80,sm_90a", "--shard",
                              cmdline, m),
                      0);
            items += atoi(r.out);
            KT_CONTAINS(r.out, " 0 cached, 0 failed");
            kt_out_free(&r);
            margs[nm++] = dirs[i];
        }
        KT_EQ_INT(items, 6); /* the shards cut the list without overlap or gap */
        margs[nm] = NULL;
        KT_EQ_INT(kt_kiln(&r, NULL, NULL, margs), 0);
        KT_CONTAINS(r.out, "merged into ");
        KT_CONTAINS(r.out, "6 added, 0 present (0 with other bytes), 0 refused; 6 rows");
        kt_out_free(&r);
        if (n == 1) {
            snprintf(whole_db, sizeof whole_db, "%s/kernels.db", dirs[0]);
            continue;
        }
        char *a = rows_of(whole_db), *b = rows_of(out);
        KT_CHECK(strlen(a) > 6 * 1000);
        KT_CHECK(!strcmp(a, b)); /* same keys, same checksums, byte-equal cubins */
        free(a);
        free(b);
    }
    /* merging again adds nothing; a corrupt row in an input is refused, the rest merged */
    char out2[700], bad_dir[700], bad_db[760];
    snprintf(out2, sizeof out2, "%s/merged2.db", kt_tmpdir());
    KT_EQ_INT(KT_KILN(&r, "merge", out2, kt_path("shard2_0"), kt_path("shard2_1")), 0);
    KT_CONTAINS(r.out, "0 added, 6 present");
    kt_out_free(&r);
    snprintf(bad_dir, sizeof bad_dir, "%s/shard3_1", kt_tmpdir());
    snprintf(bad_db, sizeof bad_db, "%s/kernels.db", bad_dir);
    char *key = kt_sql_text(bad_db, "SELECT min(key) FROM kernels");
    KT_CHECK(kt_damage_cubin(bad_db, key, KT_FLIP));
    KT_EQ_INT(KT_KILN(&r, "merge", kt_path("fresh.db"), kt_path("shard3_0"), bad_dir,
                      kt_path("shard3_2")),
              1);
    KT_CONTAINS(r.err, "refused ");
    KT_CONTAINS(r.err, key);
    KT_CONTAINS(r.err, "checksum mismatch");
    KT_CONTAINS(r.out, "1 refused; 5 rows");
    kt_out_free(&r);
    free(key);
    KT_INTEGRITY(kt_path("fresh.db"));
}

KT_TEST(fleet_export_gc)
{
    const char *dir = kt_path("c"), *db = kt_path("c/kernels.db"), *m = kt_path("m.txt");
    kt_write_text(m, KT_SPEC_0 "\n" KT_SPEC_1 " arch=sm_90a\n");
    kt_out r;
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "warm", "--arch", "sm_80,sm_90a", m), 0);
    KT_CONTAINS(r.out, "3 kernels: 3 compiled");
    KT_CONTAINS(r.out, "kernels/min)");
    kt_out_free(&r);
    /* by arch */
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "export", "--arch", "sm_90a", kt_path("e90.db")), 0);
    KT_CONTAINS(r.out, "exported 2 rows");
    kt_out_free(&r);
    KT_EQ_INT(kt_sql_long(kt_path("e90.db"), "SELECT count(*) FROM kernels WHERE arch = 'sm_90a'"),
              2);
    KT_EQ_INT(kt_sql_long(kt_path("e90.db"), "SELECT count(*) FROM kernels"), 2);
    /* by manifest: exactly its kernels; one it names is not in the cache */
    kt_write_text(kt_path("want.txt"), KT_SPEC_0 " arch=sm_80\n" KT_SPEC_3 " arch=sm_80\n");
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "export", "--spec-file", kt_path("want.txt"),
                      kt_path("e.db")),
              1);
    KT_CONTAINS(r.out, "exported 1 rows");
    KT_CONTAINS(r.out, "1 of 2 manifest kernels not in the cache");
    KT_CONTAINS(r.err, "not in the cache: ");
    KT_CONTAINS(r.err, "group=8");
    kt_out_free(&r);
    KT_EQ_INT(KT_KILN(&r, "--cache", kt_path("e.db"), "verify", kt_path("e.db")), 0);
    KT_CONTAINS(r.out, "verified 1 rows");
    kt_out_free(&r);
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "export", "--arch", "native", kt_path("x.db")), 2);
    kt_out_free(&r);

    /* gc: a bound evicts the least recently used, dead leases go */
    char host[64] = "", sql[400];
    gethostname(host, sizeof host);
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    snprintf(sql, sizeof sql,
             "INSERT INTO leases VALUES ('%032d', '%s/%d/x', %d, '%s', %lld);"
             "UPDATE kernels SET last_used = 100 WHERE spec LIKE '%%group=2%%'",
             0, host, (int)dead, (int)dead, host, (long long)time(NULL) + 500);
    KT_CHECK(kt_sql_exec(db, sql));
    long total = kt_sql_long(db, "SELECT sum(length(cubin)) FROM kernels");
    long g2 = kt_sql_long(db, "SELECT sum(length(cubin)) FROM kernels WHERE spec LIKE '%group=2%'");
    char bound[32];
    snprintf(bound, sizeof bound, "%ld", total - g2);
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "gc", "--max-size", bound), 0);
    KT_CONTAINS(r.out, "evicted 1 rows");
    KT_CONTAINS(r.out, "removed 1 dead leases (0 held)");
    kt_out_free(&r);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM kernels WHERE spec LIKE '%group=2%'"), 0);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM kernels"), 2);
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "gc", "--max-size", "0", "--vacuum"), 0);
    KT_CONTAINS(r.out, "evicted 2 rows");
    kt_out_free(&r);
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "gc", "--max-size", "12Q"), 2);
    KT_CONTAINS(r.err, "12Q");
    kt_out_free(&r);
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "gc"), 0);
    KT_CONTAINS(r.out, "no size bound");
    kt_out_free(&r);
}

KT_TEST(fleet_manifest_errors)
{
    /* every malformed line is named before anything compiles */
    static const struct {
        const char *text, *want;
    } bad[] = {
        {KT_SPEC_0 "\nop=decode head_dim={64,100}\n", "m.txt:2: "},
        {"op=decode head_dim={64,128\n", "unbalanced braces"},
        {"op=decode head_dim={64,{128}}\n", "nested braces"},
        {"op=decode head_dim={64,}\n", "empty alternative"},
        {"op=decode arch=sm_80 arch=sm_90a\n", "arch= given twice"},
        {"op=decode arch=sm_75\n", "sm_75"},
        {"op=decode arch=\n", "arch= needs a value"},
    };
    const char *dir = kt_path("c"), *m = kt_path("m.txt");
    kt_out r;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kt_write_text(m, bad[i].text);
        KT_EQ_INT(KT_KILN(&r, "--cache", dir, "warm", "--arch", "sm_90a", m), 2);
        KT_CONTAINS(r.err, bad[i].want);
        KT_EQ_STR(r.out, "");
        kt_out_free(&r);
    }
    /* '#' and braces inside quotes belong to the value, not to the manifest */
    kt_write_text(m, "op=decode head_dim=64 logits_expr=\"{#}\" # a comment\n");
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "warm", "--arch", "sm_90a", m), 2);
    KT_CHECK(strstr(r.err, "braces") == NULL);
    kt_out_free(&r);
    KT_CHECK(access(kt_path("c/kernels.db"), F_OK) != 0); /* not even opened */
}
