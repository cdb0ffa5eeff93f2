/*
 * test_fleet.c — the cache as a fleet relies on it: strict and record modes, layered caches
 * (a read-only base under the local cache), compile leases across processes (8 builders on one
 * empty cache compile each key once; builders killed with SIGKILL at random moments leave
 * nothing that blocks or corrupts), corrupt rows detected and repaired, injected faults,
 * LRU eviction, shard + merge equal to one unsharded warm, export, verify and gc.
 *
 * Every compile is a decode head_dim=64 variant (~0.3 s each on a 2-core box). The tests run
 * the kiln binary (kt_kiln_bin) with fork + exec where several processes are the point, and
 * the library directly otherwise. Needs no GPU.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "jit.h"
#include "kt.h"

#define ARGS_MAX 32
#define ENV_MAX  8

/* Four cheap variants, and a manifest of them. */
#define SPEC_0 "op=decode dtype=bf16 head_dim=64 group=1"
#define SPEC_1 "op=decode dtype=f16 head_dim=64 group=2"
#define SPEC_2 "op=decode dtype=bf16 head_dim=64 group=4 lse=1"
#define SPEC_3 "op=decode dtype=f16 head_dim=64 group=8 logits=softcap"
static const char *const specs4[] = {SPEC_0, SPEC_1, SPEC_2, SPEC_3};
static const char manifest4[] = SPEC_0 "\n" SPEC_1 "\n" SPEC_2 "\n" SPEC_3 "\n";

/* ---- helpers ------------------------------------------------------------------------------- */

/* "<tmp>/<name>" in one of 256 static buffers, round robin (a test keeps what it needs within
 * that many calls). */
static const char *tmp_path(const char *name)
{
    static char bufs[256][700];
    static int next;
    char *p = bufs[next++ % 256];
    snprintf(p, sizeof bufs[0], "%s/%s", kt_tmpdir(), name);
    return p;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A whole file, malloc'd and NUL-terminated ("" when unreadable). */
static char *slurp(const char *path, size_t *size)
{
    char *data = NULL;
    size_t n = 0;
    kiln__err e = {{0}};
    if (kiln__read_file(path, &data, &n, &e) != KILN_STATUS_OK) data = calloc(1, 1);
    if (size) *size = n;
    return data;
}

/* The first column of the first row of sql on its own connection, malloc'd ("" for no row,
 * "(error: ...)" on an error). */
static char *db_text(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    char *out = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(db, 10000);
        sqlite3_stmt *st = NULL;
        int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
        if (rc == SQLITE_OK) rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            const unsigned char *t = sqlite3_column_text(st, 0);
            out = strdup(t ? (const char *)t : "");
        } else if (rc == SQLITE_DONE) {
            out = strdup("");
        }
        sqlite3_finalize(st);
    }
    if (!out) {
        char msg[600];
        snprintf(msg, sizeof msg, "(error: %s)", db ? sqlite3_errmsg(db) : "open");
        out = strdup(msg);
    }
    sqlite3_close(db);
    return out;
}

static long db_long(const char *path, const char *sql)
{
    char *t = db_text(path, sql);
    long v = t && t[0] != '(' ? atol(t) : -1;
    free(t);
    return v;
}

static int db_exec(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    int ok = sqlite3_open(path, &db) == SQLITE_OK;
    if (ok) {
        sqlite3_busy_timeout(db, 10000);
        char *err = NULL;
        ok = sqlite3_exec(db, sql, NULL, NULL, &err) == SQLITE_OK;
        if (!ok) printf("    db_exec: %s\n", err ? err : "?");
        sqlite3_free(err);
    }
    sqlite3_close(db);
    return ok;
}

static void check_integrity(const char *db)
{
    char *r = db_text(db, "PRAGMA integrity_check");
    KT_EQ_STR(r, "ok");
    free(r);
}

/* What one run of the binary left behind. */
typedef struct run {
    int code;  /* exit status; -1 when it did not exit normally */
    char *out; /* stdout (malloc'd) */
    char *err; /* stderr */
} run;

static void run_free(run *r)
{
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof *r);
}

/* Start the kiln binary with args (NULL-terminated) and env ("K=V" strings, NULL-terminated,
 * may be NULL) in the background; stdout and stderr go to <tmp>/<tag>.out and .err. */
static pid_t spawn(const char *tag, const char *const *env, const char *const *args)
{
    char out[700], err[700];
    snprintf(out, sizeof out, "%s/%s.out", kt_tmpdir(), tag);
    snprintf(err, sizeof err, "%s/%s.err", kt_tmpdir(), tag);
    const char *argv[ARGS_MAX + 2] = {kt_kiln_bin()};
    int argc = 1;
    for (int i = 0; args[i] && argc < ARGS_MAX; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fi = open("/dev/null", O_RDONLY);
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fi < 0 || fo < 0 || fe < 0) _exit(126);
        dup2(fi, 0);
        dup2(fo, 1);
        dup2(fe, 2);
        for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Wait for a spawned process and collect what it wrote. */
static int reap(pid_t pid, const char *tag, run *r)
{
    char path[700];
    int status = 0;
    memset(r, 0, sizeof *r);
    r->code = -1;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status))
        r->code = WEXITSTATUS(status);
    snprintf(path, sizeof path, "%s/%s.out", kt_tmpdir(), tag);
    r->out = slurp(path, NULL);
    snprintf(path, sizeof path, "%s/%s.err", kt_tmpdir(), tag);
    r->err = slurp(path, NULL);
    return r->code;
}

static int run_env(run *r, const char *const *env, const char *const *args)
{
    return reap(spawn("run", env, args), "run", r);
}

#define RUN(r, ...)          run_env((r), NULL, (const char *const[]){__VA_ARGS__, NULL})
#define RUN_ENV(r, env, ...) run_env((r), (env), (const char *const[]){__VA_ARGS__, NULL})

/* A compile-only context on cache dir (NULL: none) with the given policy. */
static kiln_ctx *ctx_open(const char *dir, kiln_cache_mode mode, const char *record,
                          const char *base, int64_t max_bytes)
{
    kiln_ctx_opts o = {0};
    o.cache_dir = dir;
    o.no_cache = dir == NULL;
    o.no_device = 1;
    o.mode = mode;
    o.record_path = record;
    o.base_cache_dir = base;
    o.max_cache_bytes = max_bytes;
    kiln_ctx *ctx = NULL;
    if (kiln_ctx_create(&o, &ctx) != KILN_STATUS_OK) {
        kt_fail(__FILE__, __LINE__, "kiln_ctx_create(%s): %s", dir ? dir : "(none)", kiln_errmsg());
        return NULL;
    }
    return ctx;
}

/* The key spec would have for arch (computed, nothing compiled). */
static void key_of(const char *spec, const char *arch, char key[33])
{
    kiln_variant v;
    kiln__config cfg;
    kiln__err e = {{0}};
    char *mat = NULL;
    key[0] = 0;
    if (kiln__spec_parse(spec, &v, &e) || kiln__config_pick(&v, kiln__arch_sm(arch), &cfg, &e) ||
        kiln__key_material(&v, &cfg, arch, &mat, &e)) {
        kt_fail(__FILE__, __LINE__, "key of %s: %s", spec, e.msg);
        return;
    }
    kiln__key_hash(mat, key);
    free(mat);
}

/* Compile spec for arch in ctx; returns from_cache (or -1 on failure, with the message). */
static int compile(kiln_ctx *ctx, const char *spec, const char *arch)
{
    kiln_variant v;
    if (kiln_variant_parse(spec, &v) != KILN_STATUS_OK) return -1;
    kiln_kernel *k = NULL;
    kiln_kernel_info ki;
    if (kiln_kernel_compile(ctx, &v, arch, &k) != KILN_STATUS_OK) return -1;
    kiln_kernel_describe(k, &ki);
    return ki.from_cache;
}

/* The sum of the "N compiled" counts of warm summary lines in text. */
static int compiled_in(const char *text)
{
    int total = 0;
    for (const char *p = strstr(text, " kernels: "); p; p = strstr(p + 1, " kernels: "))
        total += atoi(p + strlen(" kernels: "));
    return total;
}

static char *capture_stderr(int (*fn)(kiln_ctx *, const char *, const char *), kiln_ctx *ctx,
                            const char *spec, const char *arch, int *result);

/* ---- strict and record ------------------------------------------------------------------------ */

KT_TEST(fleet_strict_refuses_miss)
{
    const char *dir = tmp_path("c"), *db = tmp_path("c/kernels.db");
    char key[33];
    key_of(SPEC_0, "sm_90a", key);
    kiln_ctx *ctx = ctx_open(dir, KILN_CACHE_MODE_STRICT, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    kiln_variant v;
    KT_OK(kiln_variant_parse(SPEC_0, &v), kiln_errmsg());
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
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM kernels"), 0);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM leases"), 0);

    /* compiled by a normal context, a strict one finds it */
    ctx = ctx_open(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(compile(ctx, SPEC_0, "sm_90a"), 0);
    kiln_ctx_destroy(ctx);
    ctx = ctx_open(dir, KILN_CACHE_MODE_STRICT, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(compile(ctx, SPEC_0, "sm_90a"), 1);
    kiln_ctx_destroy(ctx);

    /* KILN_STRICT decides in the default mode only */
    setenv("KILN_STRICT", "1", 1);
    ctx = ctx_open(dir, KILN_CACHE_MODE_DEFAULT, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(compile(ctx, SPEC_1, "sm_90a"), -1);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "strict mode");
    kiln_ctx_destroy(ctx);
    setenv("KILN_STRICT", "0", 1);
    ctx = ctx_open(NULL, KILN_CACHE_MODE_DEFAULT, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_STATUS(kiln_kernel_compile(ctx, &v, "sm_80", &k), KILN_STATUS_OK, kiln_ctx_errmsg(ctx));
    kiln_ctx_destroy(ctx);
    unsetenv("KILN_STRICT");
    /* strict with no cache at all: every request is a miss */
    ctx = ctx_open(NULL, KILN_CACHE_MODE_STRICT, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_STATUS(kiln_kernel_compile(ctx, &v, "sm_80", &k), KILN_STATUS_CACHE_MISS,
              kiln_ctx_errmsg(ctx));
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "the context has none");
    kiln_ctx_destroy(ctx);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM kernels"), 1);

    /* the CLI honours KILN_STRICT: exit 1, the message, nothing compiled */
    run r;
    const char *env[] = {"KILN_STRICT=1", NULL};
    KT_EQ_INT(RUN_ENV(&r, env, "--cache", dir, "compile", "--arch", "sm_90a", SPEC_2), 1);
    KT_CONTAINS(r.err, "strict mode: kernel ");
    KT_CONTAINS(r.err, "nothing compiled");
    run_free(&r);
    KT_EQ_INT(RUN_ENV(&r, env, "--cache", dir, "compile", "--arch", "sm_90a", SPEC_0), 0);
    KT_CONTAINS(r.out, " cached ");
    run_free(&r);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM kernels"), 1);
}

KT_TEST(fleet_record_replays)
{
    const char *dir = tmp_path("c"), *db = tmp_path("c/kernels.db");
    const char *rec = tmp_path("record.manifest");
    kiln_ctx *ctx = ctx_open(dir, KILN_CACHE_MODE_RECORD, rec, NULL, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(compile(ctx, SPEC_0, "sm_90a"), 0);
    KT_EQ_INT(compile(ctx, SPEC_1, "sm_80"), 0);
    KT_EQ_INT(compile(ctx, SPEC_0, "sm_90a"), 0); /* memo: not recorded twice */
    kiln_ctx_destroy(ctx);
    /* the environment: appended to the same file by a second context */
    setenv("KILN_RECORD", rec, 1);
    ctx = ctx_open(dir, KILN_CACHE_MODE_DEFAULT, NULL, NULL, 0);
    unsetenv("KILN_RECORD");
    KT_REQUIRE(ctx);
    KT_EQ_INT(compile(ctx, SPEC_0, "sm_80"), 0);
    KT_EQ_INT(compile(ctx, SPEC_0, "sm_90a"), 1); /* a hit is recorded too */
    kiln_ctx_destroy(ctx);
    char *text = slurp(rec, NULL);
    KT_CONTAINS(text, "# kiln record manifest");
    KT_CONTAINS(text, "op=decode dtype=bf16 head_dim=64 group=1 layout=nhd mask=none window=0 "
                      "logits=none lse=0 arch=sm_90a\n");
    KT_CONTAINS(text, "group=2 layout=nhd mask=none window=0 logits=none lse=0 arch=sm_80\n");
    int lines = 0;
    for (const char *p = text; *p; p++) lines += *p == '\n';
    KT_EQ_INT(lines, 2 + 4);
    free(text);
    char *keys =
        db_text(db, "SELECT group_concat(key) FROM (SELECT key FROM kernels ORDER BY key)");

    /* replaying the record (no --arch: each line names its own) reaches exactly these keys */
    run r;
    KT_EQ_INT(RUN(&r, "--cache", dir, "warm", rec), 0);
    KT_CONTAINS(r.out, "3 kernels: 0 compiled, 3 cached, 0 failed");
    KT_CONTAINS(r.err, "1 repeated (spec, arch) pairs skipped");
    run_free(&r);
    char *after =
        db_text(db, "SELECT group_concat(key) FROM (SELECT key FROM kernels ORDER BY key)");
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
    o.record_path = tmp_path("no/such/dir/rec");
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_IO, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "no/such/dir/rec");
}

/* ---- single flight across processes ------------------------------------------------------------ */

KT_TEST(fleet_concurrent_warm)
{
    /* 8 processes warm the same 4-spec manifest into one empty cache at the same moment */
    enum { PROCS = 8 };
    const char *dir = tmp_path("c"), *db = tmp_path("c/kernels.db"), *m = tmp_path("m.txt");
    write_text(m, manifest4);
    pid_t pids[PROCS];
    char tags[PROCS][16];
    for (int i = 0; i < PROCS; i++) {
        snprintf(tags[i], sizeof tags[i], "w%d", i);
        pids[i] = spawn(tags[i], NULL,
                        (const char *const[]){"--cache", dir, "warm", "--arch", "sm_90a", "--jobs",
                                              "2", m, NULL});
    }
    int compiled = 0, ok = 0;
    for (int i = 0; i < PROCS; i++) {
        run r;
        if (reap(pids[i], tags[i], &r) == 0) ok++;
        else printf("    process %d: exit %d: %s\n", i, r.code, r.err);
        KT_CONTAINS(r.out, "4 kernels: ");
        compiled += compiled_in(r.out);
        run_free(&r);
    }
    KT_EQ_INT(ok, PROCS);
    KT_EQ_INT(compiled, 4); /* each key compiled exactly once, by one of the 8 */
    printf("    %d processes, %d keys, %d compiles\n", PROCS, 4, compiled);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM kernels"), 4);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM leases"), 0);
    check_integrity(db);
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

/* Build a base cache in dir holding SPEC_0 and SPEC_1 for sm_90a. */
static void make_base(const char *dir)
{
    kiln_ctx *ctx = ctx_open(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    if (!ctx) return;
    KT_EQ_INT(compile(ctx, SPEC_0, "sm_90a"), 0);
    KT_EQ_INT(compile(ctx, SPEC_1, "sm_90a"), 0);
    kiln_ctx_destroy(ctx);
}

KT_TEST(fleet_layered_base)
{
    const char *base = tmp_path("base"), *base_db = tmp_path("base/kernels.db");
    const char *local = tmp_path("local"), *local_db = tmp_path("local/kernels.db");
    make_base(base);
    KT_REQUIRE(chmod(base_db, 0444) == 0 && chmod(base, 0555) == 0);
    size_t n0 = 0, n1 = 0;
    char *before = slurp(base_db, &n0);
    off_t size0, size1;
    time_t mtime0, mtime1;
    file_id(base_db, &size0, &mtime0);

    kiln_ctx *ctx = ctx_open(local, KILN_CACHE_MODE_COMPILE, NULL, base, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(compile(ctx, SPEC_0, "sm_90a"), 1); /* from the base */
    KT_EQ_INT(compile(ctx, SPEC_2, "sm_90a"), 0); /* compiled, stored locally */
    kiln_ctx_destroy(ctx);
    KT_EQ_INT(db_long(local_db, "SELECT count(*) FROM kernels"), 1);
    /* the environment names the base too; a hit in either layer */
    setenv("KILN_BASE_CACHE_DIR", base, 1);
    ctx = ctx_open(local, KILN_CACHE_MODE_STRICT, NULL, NULL, 0);
    unsetenv("KILN_BASE_CACHE_DIR");
    KT_REQUIRE(ctx);
    KT_EQ_INT(compile(ctx, SPEC_1, "sm_90a"), 1);
    KT_EQ_INT(compile(ctx, SPEC_2, "sm_90a"), 1);
    KT_EQ_INT(compile(ctx, SPEC_3, "sm_90a"), -1);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), local_db);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), base_db);
    kiln_ctx_destroy(ctx);

    /* the base was never written */
    char *after = slurp(base_db, &n1);
    file_id(base_db, &size1, &mtime1);
    KT_CHECK(n0 == n1 && !memcmp(before, after, n0));
    KT_EQ_INT(size0, size1);
    KT_EQ_INT(mtime0, mtime1);
    KT_CHECK(access(tmp_path("base/kernels.db-wal"), F_OK) != 0);
    KT_CHECK(access(tmp_path("base/kernels.db-shm"), F_OK) != 0);
    free(before);
    free(after);
    chmod(base, 0755);

    /* a missing base, and a base that is the cache itself, are refused */
    kiln_ctx_opts o = {0};
    o.no_device = 1;
    o.cache_dir = local;
    o.base_cache_dir = tmp_path("nope");
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_IO, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "base cache");
    KT_CONTAINS(kiln_errmsg(), "nope");
    o.base_cache_dir = local;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_INVALID_ARGUMENT, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "is the cache itself");

    /* `kiln info` shows both layers */
    run r;
    KT_EQ_INT(RUN(&r, "--cache", local, "--base-cache", base, "info"), 0);
    KT_CONTAINS(r.out, local_db);
    KT_CONTAINS(r.out, "base cache: ");
    KT_CONTAINS(r.out, base_db);
    KT_CONTAINS(r.out, "base cache entries: 2");
    run_free(&r);
}

/* A base cache on a read-only file system (a tmpfs remounted read-only). Needs the right to
 * mount: skipped without it. */
KT_TEST(fleet_base_on_readonly_fs)
{
    const char *mnt = tmp_path("ro");
    KT_REQUIRE(mkdir(mnt, 0755) == 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=16m") != 0) {
        kt_skip("cannot mount a tmpfs here (%s): read-only file system not tested",
                strerror(errno));
        return;
    }
    const char *base = tmp_path("ro/base");
    make_base(base);
    int ro = mount(NULL, mnt, NULL, MS_REMOUNT | MS_RDONLY, NULL) == 0;
    KT_CHECK(ro);
    if (ro) {
        KT_CHECK(access(tmp_path("ro/base/kernels.db"), W_OK) != 0 && errno == EROFS);
        kiln_ctx *ctx = ctx_open(tmp_path("local"), KILN_CACHE_MODE_STRICT, NULL, base, 0);
        if (ctx) {
            KT_EQ_INT(compile(ctx, SPEC_0, "sm_90a"), 1);
            KT_EQ_INT(compile(ctx, SPEC_1, "sm_90a"), 1);
            kiln_ctx_destroy(ctx);
        }
        /* the same file as the only, local, cache: opened read-only; a miss is compiled,
         * and not stored, with the reason on stderr */
        ctx = ctx_open(base, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
        if (ctx) {
            KT_EQ_INT(compile(ctx, SPEC_1, "sm_90a"), 1);
            int from_cache = -2;
            char *err = capture_stderr(compile, ctx, SPEC_2, "sm_90a", &from_cache);
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
    const char *dir = tmp_path("c"), *db = tmp_path("c/kernels.db");
    kiln_ctx *ctx = ctx_open(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    for (int i = 0; i < 3; i++) KT_EQ_INT(compile(ctx, specs4[i], "sm_80"), 0);
    kiln_ctx_destroy(ctx);
    char k[4][33], sql[256];
    for (int i = 0; i < 4; i++) key_of(specs4[i], "sm_80", k[i]);
    /* used long ago, in the order 0, 2, 1 */
    static const int stamp[3] = {100, 300, 200};
    for (int i = 0; i < 3; i++) {
        snprintf(sql, sizeof sql, "UPDATE kernels SET last_used = %d WHERE key = '%s'", stamp[i],
                 k[i]);
        KT_CHECK(db_exec(db, sql));
    }
    long sizes[4];
    for (int i = 0; i < 3; i++) {
        snprintf(sql, sizeof sql, "SELECT length(cubin) FROM kernels WHERE key = '%s'", k[i]);
        sizes[i] = db_long(db, sql);
    }
    ctx = ctx_open(NULL, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0); /* the size of the fourth */
    KT_REQUIRE(ctx);
    kiln_variant v;
    kiln_kernel *kk = NULL;
    kiln_variant_parse(SPEC_3, &v);
    KT_OK(kiln_kernel_compile(ctx, &v, "sm_80", &kk), kiln_ctx_errmsg(ctx));
    size_t sz = 0;
    kiln_kernel_cubin(kk, &sz);
    sizes[3] = (long)sz;
    kiln_ctx_destroy(ctx);

    /* a hit on 0 makes it the most recent; storing 3 under a bound that fits three rows must
     * evict 2 (the least recently used), not 0 */
    int64_t bound = sizes[0] + sizes[1] + sizes[3];
    ctx = ctx_open(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, bound);
    KT_REQUIRE(ctx);
    KT_EQ_INT(compile(ctx, SPEC_0, "sm_80"), 1);
    KT_EQ_INT(compile(ctx, SPEC_3, "sm_80"), 0);
    kiln_ctx_destroy(ctx);
    KT_CHECK(db_long(db, "SELECT sum(length(cubin)) FROM kernels") <= bound);
    snprintf(sql, sizeof sql,
             "SELECT group_concat(key) FROM (SELECT key FROM kernels ORDER BY key)");
    char *keys = db_text(db, sql);
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
    ctx = ctx_open(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    unsetenv("KILN_CACHE_MAX_BYTES");
    KT_REQUIRE(ctx);
    KT_EQ_INT(compile(ctx, SPEC_2, "sm_80"), 0); /* stored; everything else is evicted */
    kiln_ctx_destroy(ctx);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM kernels"), 1);
    o.max_cache_bytes = -5;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_INVALID_ARGUMENT, kiln_errmsg());
}

/* ---- corruption ---------------------------------------------------------------------------------- */

typedef enum damage { FLIP, TRUNCATE_STALE, TRUNCATE_RESUMMED } damage;

/* Damage the cubin of key's row: flip bytes in the middle (checksum left stale), cut it in half
 * (checksum stale), or cut it in half and store a matching checksum (only the ELF check can
 * tell). */
static void damage_row(const char *db, const char *key, damage how)
{
    sqlite3 *h = NULL;
    KT_REQUIRE(sqlite3_open(db, &h) == SQLITE_OK);
    sqlite3_busy_timeout(h, 10000);
    sqlite3_stmt *st = NULL;
    unsigned char *blob = NULL;
    int n = 0;
    if (sqlite3_prepare_v2(h, "SELECT cubin FROM kernels WHERE key = ?1", -1, &st, NULL) ==
            SQLITE_OK &&
        sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
        n = sqlite3_column_bytes(st, 0);
        blob = malloc((size_t)n);
        memcpy(blob, sqlite3_column_blob(st, 0), (size_t)n);
    }
    sqlite3_finalize(st);
    KT_CHECK(blob && n > 100);
    if (blob) {
        if (how == FLIP)
            for (int i = n / 2; i < n / 2 + 4; i++) blob[i] ^= 0x5a;
        else n /= 2;
        char sum[33];
        kiln__hash128(blob, (size_t)n, sum);
        const char *sql = how == TRUNCATE_RESUMMED
                              ? "UPDATE kernels SET cubin = ?2, checksum = ?3 WHERE key = ?1"
                              : "UPDATE kernels SET cubin = ?2 WHERE key = ?1 AND ?3 IS NOT NULL";
        KT_CHECK(sqlite3_prepare_v2(h, sql, -1, &st, NULL) == SQLITE_OK);
        sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
        sqlite3_bind_blob(st, 2, blob, n, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, sum, -1, SQLITE_STATIC);
        KT_CHECK(sqlite3_step(st) == SQLITE_DONE);
        sqlite3_finalize(st);
    }
    free(blob);
    sqlite3_close(h);
}

/* Run fn with stderr sent to a file of its own (writable by whoever runs it, root or not);
 * returns what it wrote (malloc'd). */
static char *capture_stderr(int (*fn)(kiln_ctx *, const char *, const char *), kiln_ctx *ctx,
                            const char *spec, const char *arch, int *result)
{
    /* an anonymous file: the read-only checks run as nobody, who may have no writable
     * directory at all (a /tmp of mode 0755 is enough for that) */
    fflush(stderr);
    int saved = dup(2), fd = memfd_create("kiln-stderr", 0);
    if (fd >= 0) dup2(fd, 2);
    *result = fn(ctx, spec, arch);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char *text = NULL;
    off_t n = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
    if (n >= 0 && (text = malloc((size_t)n + 1))) {
        ssize_t got = pread(fd, text, (size_t)n, 0);
        text[got > 0 ? got : 0] = '\0';
    }
    if (fd >= 0) close(fd);
    return text ? text : strdup("");
}

KT_TEST(fleet_corrupt_rows)
{
    const char *dir = tmp_path("c"), *db = tmp_path("c/kernels.db");
    char k[4][33];
    for (int i = 0; i < 4; i++) key_of(specs4[i], "sm_80", k[i]);
    kiln_ctx *ctx = ctx_open(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    for (int i = 0; i < 3; i++) KT_EQ_INT(compile(ctx, specs4[i], "sm_80"), 0);
    kiln_ctx_destroy(ctx);
    char *good = db_text(db, "SELECT group_concat(key || checksum) FROM "
                             "(SELECT key, checksum FROM kernels ORDER BY key)");
    char sql[1024];
    /* four kinds of damage: row 0 flipped, row 1 truncated with a matching checksum, row 2's
     * key material edited, and row 2 copied under the key of spec 3 */
    damage_row(db, k[0], FLIP);
    damage_row(db, k[1], TRUNCATE_RESUMMED);
    snprintf(sql, sizeof sql,
             "INSERT INTO kernels SELECT '%s', spec, arch, nvrtc, key_material, source, log, cubin,"
             " checksum, registers, smem_bytes, spill_bytes, stack_bytes, compile_ms, created,"
             " last_used, hits, row_sum FROM kernels WHERE key = '%s'",
             k[3], k[2]);
    KT_CHECK(db_exec(db, sql));
    snprintf(sql, sizeof sql,
             "UPDATE kernels SET key_material = replace(key_material, 'group=4', 'group=5') "
             "WHERE key = '%s'",
             k[2]);
    KT_CHECK(db_exec(db, sql));

    /* verify reports each with its reason, and exits 1 */
    run r;
    KT_EQ_INT(RUN(&r, "--cache", dir, "verify"), 1);
    KT_CONTAINS(r.out, "verified 4 rows");
    KT_CONTAINS(r.out, ": 4 bad");
    char want[128];
    snprintf(want, sizeof want, "bad %s sm_80 ", k[0]);
    KT_CONTAINS(r.out, want);
    KT_CONTAINS(r.out, "checksum mismatch: stored ");
    KT_CONTAINS(r.out, "the cubin is truncated");
    KT_CONTAINS(r.out, "the key does not match its key material");
    run_free(&r);

    /* strict mode refuses them (never loaded) and says why */
    ctx = ctx_open(dir, KILN_CACHE_MODE_STRICT, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(compile(ctx, SPEC_0, "sm_80"), -1);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "failed its checksum");
    KT_EQ_INT(compile(ctx, SPEC_3, "sm_80"), -1);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "failed its row checksum"); /* the seal covers the key */
    kiln_ctx_destroy(ctx);

    /* a compiling context reports each on stderr, never loads it, and recompiles */
    ctx = ctx_open(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    static const char *const reasons[4] = {"failed its checksum", "failed its row checksum",
                                           "failed its row checksum", "failed its row checksum"};
    for (int i = 0; i < 4; i++) {
        int from_cache = -2;
        char *err = capture_stderr(compile, ctx, specs4[i], "sm_80", &from_cache);
        KT_EQ_INT(from_cache, 0);
        KT_CONTAINS(err, k[i]);
        KT_CONTAINS(err, reasons[i]);
        KT_CONTAINS(err, "not loaded");
        KT_CONTAINS(err, "recompiling");
        free(err);
    }
    kiln_ctx_destroy(ctx);
    KT_EQ_INT(RUN(&r, "--cache", dir, "verify"), 0);
    KT_CONTAINS(r.out, "verified 4 rows");
    KT_CONTAINS(r.out, ": 0 bad");
    run_free(&r);
    /* recompiled: byte-equal to the first compile (NVRTC is deterministic) */
    snprintf(sql, sizeof sql,
             "SELECT group_concat(key || checksum) FROM (SELECT key, checksum FROM kernels "
             "WHERE key != '%s' ORDER BY key)",
             k[3]);
    char *repaired = db_text(db, sql);
    KT_EQ_STR(repaired, good);
    free(repaired);
    free(good);

    /* verify --fix deletes bad rows instead */
    damage_row(db, k[0], TRUNCATE_STALE);
    KT_EQ_INT(RUN(&r, "--cache", dir, "verify", "--fix"), 0);
    KT_CONTAINS(r.out, "1 bad, 1 removed");
    run_free(&r);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM kernels"), 3);
    KT_EQ_INT(RUN(&r, "--cache", dir, "verify"), 0);
    run_free(&r);
    check_integrity(db);
}

KT_TEST(fleet_foreign_files_untouched)
{
    /* a garbage file and a future-schema cache: refused by contexts, warm, verify and merge,
     * and never written */
    const char *g = tmp_path("g"), *g_db = tmp_path("g/kernels.db");
    KT_REQUIRE(mkdir(g, 0700) == 0);
    write_text(g_db, "these are not the kernels you are looking for\n");
    const char *f = tmp_path("f"), *f_db = tmp_path("f/kernels.db");
    make_base(f);
    KT_CHECK(db_exec(f_db, "UPDATE meta SET v = '99' WHERE k = 'schema_version'"));
    size_t ng = 0, nf = 0, n;
    char *g0 = slurp(g_db, &ng), *f0 = slurp(f_db, &nf);
    kiln_ctx_opts o = {0};
    kiln_ctx *ctx = NULL;
    o.no_device = 1;
    o.cache_dir = g;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_CACHE, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "not a kiln cache");
    o.cache_dir = f;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_CACHE, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "schema version 99");
    o.cache_dir = tmp_path("ok");
    o.base_cache_dir = f;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_CACHE, kiln_errmsg());
    KT_CONTAINS(kiln_errmsg(), "base cache");
    run r;
    const char *m = tmp_path("m.txt");
    write_text(m, SPEC_0 "\n");
    KT_EQ_INT(RUN(&r, "--cache", g, "warm", "--arch", "sm_80", m), 1);
    KT_CONTAINS(r.err, "not a kiln cache");
    run_free(&r);
    KT_EQ_INT(RUN(&r, "--cache", f, "verify"), 1);
    KT_CONTAINS(r.err, "left untouched");
    run_free(&r);
    KT_EQ_INT(RUN(&r, "merge", tmp_path("out.db"), f, g), 1);
    KT_CONTAINS(r.err, "written by schema version 99");
    KT_CONTAINS(r.err, "not a kiln cache");
    run_free(&r);
    KT_EQ_INT(RUN(&r, "merge", g_db, tmp_path("ok")), 1); /* nor as the output */
    run_free(&r);
    char *g1 = slurp(g_db, &n);
    KT_CHECK(n == ng && !memcmp(g0, g1, n));
    free(g1);
    char *f1 = slurp(f_db, &n);
    KT_CHECK(n == nf && !memcmp(f0, f1, n));
    free(f1);
    free(g0);
    free(f0);
}

/* ---- killed builders ------------------------------------------------------------------------------- */

/* Wait up to ms for pid; 1 when it exited (status in *code), 0 on timeout. */
static int wait_for(pid_t pid, int ms, int *code)
{
    for (int t = 0; t <= ms; t += 10) {
        int status = 0;
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) {
            *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            return 1;
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}

KT_TEST(fleet_kill_builders)
{
    /* warms of 8 specs (--jobs 2) killed with SIGKILL at random moments; between runs a random
     * half of the rows is deleted so that every run has compiles to be killed in */
    enum { KILLS = 22, ATTEMPTS = 60 };
    const char *dir = tmp_path("c"), *db = tmp_path("c/kernels.db"), *m = tmp_path("m.txt");
    write_text(m, "op=decode head_dim=64 dtype={f16,bf16} group={1,2,4,8}\n");
    const char *const args[] = {"--cache", dir, "warm", "--arch", "sm_90a", "--jobs", "2", m, NULL};
    unsigned seed = (unsigned)time(NULL);
    printf("    seed %u\n", seed);
    srand(seed);
    int kills = 0, lost = 0, mid_compile = 0;
    for (int i = 0; i < ATTEMPTS && kills < KILLS; i++) {
        if (access(db, F_OK) == 0) {
            KT_CHECK(db_exec(db, "DELETE FROM kernels WHERE abs(random()) % 2 = 0"));
        }
        char *before = access(db, F_OK) == 0 ? db_text(db, "SELECT group_concat(key) FROM kernels")
                                             : strdup("");
        pid_t pid = spawn("k", NULL, args);
        int delay_ms = rand() % 1501;
        int code = 0;
        if (wait_for(pid, delay_ms, &code)) {
            KT_EQ_INT(code, 0); /* finished before the kill */
        } else {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            kills++;
        }
        long leases = db_long(db, "SELECT count(*) FROM leases");
        mid_compile += leases > 0;
        /* every row present before the run is still there */
        for (char *p = before; p && *p;) {
            char key[33];
            snprintf(key, sizeof key, "%.32s", p);
            char sql[128];
            snprintf(sql, sizeof sql, "SELECT count(*) FROM kernels WHERE key = '%s'", key);
            if (db_long(db, sql) != 1) lost++;
            p += strlen(key);
            if (*p == ',') p++;
        }
        free(before);
    }
    KT_CHECK(kills >= 20);
    KT_EQ_INT(lost, 0);
    check_integrity(db);
    run r;
    KT_EQ_INT(RUN(&r, "--cache", dir, "verify"), 0);
    KT_CONTAINS(r.out, ": 0 bad");
    run_free(&r);
    /* the leases of killed builders block nobody: a rerun completes promptly */
    long t0 = (long)time(NULL);
    pid_t pid = spawn("rerun", NULL, args);
    int code = -1;
    int done = wait_for(pid, 60000, &code);
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    KT_CHECK(done);
    KT_EQ_INT(code, 0);
    reap(-1, "rerun", &r);
    KT_CONTAINS(r.out, "8 kernels: ");
    KT_CONTAINS(r.out, " 0 failed");
    run_free(&r);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM kernels"), 8);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM leases"), 0);
    printf("    %d kills (%d left a lease behind), rows lost %d, rerun %ld s\n", kills, mid_compile,
           lost, (long)time(NULL) - t0);
    check_integrity(db);
}

/* ---- faults ------------------------------------------------------------------------------------- */

#define NOBODY 65534

/* The checks of a read-only local cache, as a user who cannot write it: the cached kernel
 * loads, a missing one is compiled but not stored. Returns the number of failures. */
static int readonly_checks(const char *dir)
{
    int bad = 0;
    kiln_ctx_opts o = {0};
    o.no_device = 1;
    o.cache_dir = dir;
    o.mode = KILN_CACHE_MODE_COMPILE;
    kiln_ctx *ctx = NULL;
    if (kiln_ctx_create(&o, &ctx) != KILN_STATUS_OK) {
        printf("    read-only cache: create: %s\n", kiln_errmsg());
        return 1;
    }
    if (compile(ctx, SPEC_0, "sm_80") != 1) {
        printf("    read-only cache: the stored kernel: %s\n", kiln_ctx_errmsg(ctx));
        bad++;
    }
    int from_cache = -2;
    char *err = capture_stderr(compile, ctx, SPEC_1, "sm_80", &from_cache);
    if (from_cache != 0 || !strstr(err, "read-only") || !strstr(err, "not writable") ||
        !strstr(err, "not stored")) {
        printf("    read-only cache: a missing kernel: %d: %s\n", from_cache, err);
        bad++;
    }
    free(err);
    kiln_ctx_destroy(ctx);
    return bad;
}

KT_TEST(fleet_faults)
{
    const char *dir = tmp_path("c"), *db = tmp_path("c/kernels.db");
    kiln_ctx *ctx = ctx_open(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(compile(ctx, SPEC_0, "sm_80"), 0);
    kiln_ctx_destroy(ctx);
    char *sum0 = db_text(db, "SELECT checksum FROM kernels");

    /* 1. a read-only cache directory (as nobody when root, whom permissions do not stop) */
    KT_REQUIRE(chmod(kt_tmpdir(), 0755) == 0 && chmod(db, 0644) == 0);
    if (geteuid() != 0) {
        KT_REQUIRE(chmod(dir, 0555) == 0);
        KT_EQ_INT(readonly_checks(dir), 0);
        chmod(dir, 0700);
    } else {
        KT_REQUIRE(chmod(dir, 0755) == 0);
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            if (setgid(NOBODY) != 0 || setuid(NOBODY) != 0) _exit(99);
            int bad = readonly_checks(dir);
            fflush(stdout);
            _exit(bad ? 1 : 0);
        }
        int status = 0;
        KT_REQUIRE(waitpid(pid, &status, 0) == pid);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 99)
            kt_skip("cannot drop to uid %d: read-only directory not tested", NOBODY);
        else KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }

    /* 2. every SQLite statement of a miss (lookups, lease, store, release) fails in turn: a
     * failed read is reported and recompiled, a lease that cannot be taken is reported and the
     * kernel compiled without it, a store that fails is reported and the kernel still returned;
     * what was stored before stays, no lease is left behind, the file stays sound */
    char key1[33], sql[256];
    key_of(SPEC_1, "sm_80", key1);
    snprintf(sql, sizeof sql, "DELETE FROM kernels WHERE key = '%s'", key1);
    int failed_calls = 0, reported = 0, n = 1;
    for (; n < 60; n++) {
        KT_CHECK(db_exec(db, sql));
        ctx = ctx_open(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
        if (!ctx) break;
        kiln__fault_arm("sqlite", n);
        int from_cache = -2;
        char *err = capture_stderr(compile, ctx, SPEC_1, "sm_80", &from_cache);
        int fired = kiln__fault("sqlite") == 0; /* the countdown was used up: it fired */
        kiln__fault_arm("sqlite", 0);
        if (from_cache < 0) {
            failed_calls++;
            KT_CONTAINS(kiln_ctx_errmsg(ctx), "injected");
        }
        reported += from_cache < 0 || strstr(err, "injected") != NULL;
        free(err);
        kiln_ctx_destroy(ctx);
        char *sum =
            db_text(db,
                    "SELECT checksum FROM kernels WHERE rowid = (SELECT min(rowid) FROM kernels)");
        KT_EQ_STR(sum, sum0); /* what was there before is intact */
        free(sum);
        KT_EQ_INT(db_long(db, "SELECT count(*) FROM leases"), 0);
        check_integrity(db);
        if (!fired) break; /* past the last statement */
    }
    printf("    %d statements failed in turn: %d reported, %d failed the call\n", n - 1, reported,
           failed_calls);
    KT_CHECK(reported >= 6); /* lookup, lease read / begin / insert / commit, store ... */
    KT_CHECK(n > 8);

    /* 3. NVRTC missing: a clear error, nothing stored, no lease left */
    ctx = ctx_open(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    kiln__fault_arm("nvrtc", 1);
    KT_EQ_INT(compile(ctx, SPEC_2, "sm_80"), -1);
    kiln__fault_arm("nvrtc", 0);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "op=decode dtype=bf16 head_dim=64 group=4");
    kiln_ctx_destroy(ctx);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM leases"), 0);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM kernels"), 2);
    free(sum0);
}

/* A full disk: a cache on a 1 MiB tmpfs fills up. Needs the right to mount. */
KT_TEST(fleet_full_disk)
{
    const char *mnt = tmp_path("small");
    KT_REQUIRE(mkdir(mnt, 0755) == 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=1m") != 0) {
        kt_skip("cannot mount a tmpfs here (%s): full disk not tested", strerror(errno));
        return;
    }
    const char *dir = tmp_path("small/c"), *db = tmp_path("small/c/kernels.db");
    static const char *const dtypes[] = {"f16", "bf16"};
    int stored = 0, full = 0;
    char spec[128], key[33], sql[128];
    kiln_ctx *ctx = ctx_open(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    for (int i = 0; ctx && i < 16 && !full; i++) {
        const char *arch = i < 8 ? "sm_80" : "sm_90a";
        snprintf(spec, sizeof spec, "op=decode head_dim=64 dtype=%s group=%d", dtypes[i % 2],
                 1 << (i / 2 % 4));
        int from_cache = -2;
        char *err = capture_stderr(compile, ctx, spec, arch, &from_cache);
        KT_EQ_INT(from_cache, 0); /* the kernel is compiled whatever the disk says */
        key_of(spec, arch, key);
        snprintf(sql, sizeof sql, "SELECT count(*) FROM kernels WHERE key = '%s'", key);
        if (db_long(db, sql) == 1) {
            stored++;
        } else {
            full = 1;
            KT_CONTAINS(err, "full");
            KT_CONTAINS(err, "not stored");
        }
        free(err);
    }
    kiln_ctx_destroy(ctx);
    KT_CHECK(full);
    /* everything stored before is still there and sound */
    run r;
    KT_EQ_INT(RUN(&r, "--cache", dir, "verify"), 0);
    KT_CONTAINS(r.out, ": 0 bad");
    run_free(&r);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM kernels"), stored);
    printf("    %d kernels stored before the disk was full\n", stored);
    /* a warm into the full cache says which kernels it could not store, and fails */
    const char *m = tmp_path("m.txt");
    write_text(m, "op=decode head_dim=64 dtype=f16 group={1,2,4,8} arch=sm_89\n");
    KT_EQ_INT(RUN(&r, "--cache", dir, "warm", m), 1);
    KT_CONTAINS(r.err, "compiled but not stored");
    run_free(&r);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM kernels"), stored);
    KT_CHECK(umount2(mnt, MNT_DETACH) == 0);
}

/* ---- shard, merge, export, gc -------------------------------------------------------------------- */

/* Every row of a cache as "key:checksum:hex(cubin)" in key order (malloc'd). */
static char *rows_of(const char *db)
{
    return db_text(db, "SELECT group_concat(key || ':' || checksum || ':' || hex(cubin), ',') FROM "
                       "(SELECT key, checksum, cubin FROM kernels ORDER BY key)");
}

KT_TEST(fleet_shard_merge)
{
    /* 3 specs (from braces) x 2 archs; shards i/n for n = 1..4, merged per n, equal one
     * unsharded warm (n = 1) row for row and byte for byte */
    const char *m = tmp_path("m.txt");
    write_text(m, "# braces: three specs\nop=decode dtype=bf16 head_dim=64 group={1,2,4}\n");
    char whole_db[700] = "";
    run r;
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
            KT_EQ_INT(RUN(&r, "--cache", dirs[i], "warm", "--arch", "sm_80,sm_90a", "--shard",
                          cmdline, m),
                      0);
            items += atoi(r.out);
            KT_CONTAINS(r.out, " 0 cached, 0 failed");
            run_free(&r);
            margs[nm++] = dirs[i];
        }
        KT_EQ_INT(items, 6); /* the shards cut the list without overlap or gap */
        margs[nm] = NULL;
        KT_EQ_INT(run_env(&r, NULL, margs), 0);
        KT_CONTAINS(r.out, "merged into ");
        KT_CONTAINS(r.out, "6 added, 0 present (0 with other bytes), 0 refused; 6 rows");
        run_free(&r);
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
    KT_EQ_INT(RUN(&r, "merge", out2, tmp_path("shard2_0"), tmp_path("shard2_1")), 0);
    KT_CONTAINS(r.out, "0 added, 6 present");
    run_free(&r);
    snprintf(bad_dir, sizeof bad_dir, "%s/shard3_1", kt_tmpdir());
    snprintf(bad_db, sizeof bad_db, "%s/kernels.db", bad_dir);
    char *key = db_text(bad_db, "SELECT min(key) FROM kernels");
    damage_row(bad_db, key, FLIP);
    KT_EQ_INT(RUN(&r, "merge", tmp_path("fresh.db"), tmp_path("shard3_0"), bad_dir,
                  tmp_path("shard3_2")),
              1);
    KT_CONTAINS(r.err, "refused ");
    KT_CONTAINS(r.err, key);
    KT_CONTAINS(r.err, "checksum mismatch");
    KT_CONTAINS(r.out, "1 refused; 5 rows");
    run_free(&r);
    free(key);
    check_integrity(tmp_path("fresh.db"));
}

KT_TEST(fleet_export_gc)
{
    const char *dir = tmp_path("c"), *db = tmp_path("c/kernels.db"), *m = tmp_path("m.txt");
    write_text(m, SPEC_0 "\n" SPEC_1 " arch=sm_90a\n");
    run r;
    KT_EQ_INT(RUN(&r, "--cache", dir, "warm", "--arch", "sm_80,sm_90a", m), 0);
    KT_CONTAINS(r.out, "3 kernels: 3 compiled");
    KT_CONTAINS(r.out, "kernels/min)");
    run_free(&r);
    /* by arch */
    KT_EQ_INT(RUN(&r, "--cache", dir, "export", "--arch", "sm_90a", tmp_path("e90.db")), 0);
    KT_CONTAINS(r.out, "exported 2 rows");
    run_free(&r);
    KT_EQ_INT(db_long(tmp_path("e90.db"), "SELECT count(*) FROM kernels WHERE arch = 'sm_90a'"), 2);
    KT_EQ_INT(db_long(tmp_path("e90.db"), "SELECT count(*) FROM kernels"), 2);
    /* by manifest: exactly its kernels; one it names is not in the cache */
    write_text(tmp_path("want.txt"), SPEC_0 " arch=sm_80\n" SPEC_3 " arch=sm_80\n");
    KT_EQ_INT(RUN(&r, "--cache", dir, "export", "--spec-file", tmp_path("want.txt"),
                  tmp_path("e.db")),
              1);
    KT_CONTAINS(r.out, "exported 1 rows");
    KT_CONTAINS(r.out, "1 of 2 manifest kernels not in the cache");
    KT_CONTAINS(r.err, "not in the cache: ");
    KT_CONTAINS(r.err, "group=8");
    run_free(&r);
    KT_EQ_INT(RUN(&r, "--cache", tmp_path("e.db"), "verify", tmp_path("e.db")), 0);
    KT_CONTAINS(r.out, "verified 1 rows");
    run_free(&r);
    KT_EQ_INT(RUN(&r, "--cache", dir, "export", "--arch", "native", tmp_path("x.db")), 2);
    run_free(&r);

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
    KT_CHECK(db_exec(db, sql));
    long total = db_long(db, "SELECT sum(length(cubin)) FROM kernels");
    long g2 = db_long(db, "SELECT sum(length(cubin)) FROM kernels WHERE spec LIKE '%group=2%'");
    char bound[32];
    snprintf(bound, sizeof bound, "%ld", total - g2);
    KT_EQ_INT(RUN(&r, "--cache", dir, "gc", "--max-size", bound), 0);
    KT_CONTAINS(r.out, "evicted 1 rows");
    KT_CONTAINS(r.out, "removed 1 dead leases (0 held)");
    run_free(&r);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM kernels WHERE spec LIKE '%group=2%'"), 0);
    KT_EQ_INT(db_long(db, "SELECT count(*) FROM kernels"), 2);
    KT_EQ_INT(RUN(&r, "--cache", dir, "gc", "--max-size", "0", "--vacuum"), 0);
    KT_CONTAINS(r.out, "evicted 2 rows");
    run_free(&r);
    KT_EQ_INT(RUN(&r, "--cache", dir, "gc", "--max-size", "12Q"), 2);
    KT_CONTAINS(r.err, "12Q");
    run_free(&r);
    KT_EQ_INT(RUN(&r, "--cache", dir, "gc"), 0);
    KT_CONTAINS(r.out, "no size bound");
    run_free(&r);
}

KT_TEST(fleet_manifest_errors)
{
    /* every malformed line is named before anything compiles */
    static const struct {
        const char *text, *want;
    } bad[] = {
        {SPEC_0 "\nop=decode head_dim={64,100}\n", "m.txt:2: "},
        {"op=decode head_dim={64,128\n", "unbalanced braces"},
        {"op=decode head_dim={64,{128}}\n", "nested braces"},
        {"op=decode head_dim={64,}\n", "empty alternative"},
        {"op=decode arch=sm_80 arch=sm_90a\n", "arch= given twice"},
        {"op=decode arch=sm_75\n", "sm_75"},
        {"op=decode arch=\n", "arch= needs a value"},
    };
    const char *dir = tmp_path("c"), *m = tmp_path("m.txt");
    run r;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(m, bad[i].text);
        KT_EQ_INT(RUN(&r, "--cache", dir, "warm", "--arch", "sm_90a", m), 2);
        KT_CONTAINS(r.err, bad[i].want);
        KT_EQ_STR(r.out, "");
        run_free(&r);
    }
    /* '#' and braces inside quotes belong to the value, not to the manifest */
    write_text(m, "op=decode head_dim=64 logits_expr=\"{#}\" # a comment\n");
    KT_EQ_INT(RUN(&r, "--cache", dir, "warm", "--arch", "sm_90a", m), 2);
    KT_CHECK(strstr(r.err, "braces") == NULL);
    run_free(&r);
    KT_CHECK(access(tmp_path("c/kernels.db"), F_OK) != 0); /* not even opened */
}
