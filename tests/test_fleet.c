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
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "jit.h"
#include "kt.h"

#define ARGS_MAX 32
#define ENV_MAX 8

/* Four cheap variants, and a manifest of them. */
#define SPEC_0 "op=decode dtype=bf16 head_dim=64 group=1"
#define SPEC_1 "op=decode dtype=f16 head_dim=64 group=2"
#define SPEC_2 "op=decode dtype=bf16 head_dim=64 group=4 lse=1"
#define SPEC_3 "op=decode dtype=f16 head_dim=64 group=8 logits=softcap"
static const char *const specs4[] = {SPEC_0, SPEC_1, SPEC_2, SPEC_3};
static const char manifest4[] = SPEC_0 "\n" SPEC_1 "\n" SPEC_2 "\n" SPEC_3 "\n";

/* ---- helpers ------------------------------------------------------------------------------- */

/* "<tmp>/<name>" in one of 8 static buffers, round robin. */
static const char *tmp_path(const char *name)
{
    static char bufs[8][700];
    static int next;
    char *p = bufs[next++ % 8];
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

#define RUN(r, ...) run_env((r), NULL, (const char *const[]){__VA_ARGS__, NULL})
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
    char *keys = db_text(db, "SELECT group_concat(key) FROM (SELECT key FROM kernels ORDER BY key)");

    /* replaying the record (no --arch: each line names its own) reaches exactly these keys */
    run r;
    KT_EQ_INT(RUN(&r, "--cache", dir, "warm", rec), 0);
    KT_CONTAINS(r.out, "3 kernels: 0 compiled, 3 cached, 0 failed");
    KT_CONTAINS(r.err, "1 repeated (spec, arch) pairs skipped");
    run_free(&r);
    char *after = db_text(db, "SELECT group_concat(key) FROM (SELECT key FROM kernels ORDER BY key)");
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
        kt_skip("cannot mount a tmpfs here (%s): read-only file system not tested", strerror(errno));
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
        /* the same file as the only, local, cache: opened read-only, and says why it cannot
         * store anything */
        ctx = ctx_open(base, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
        if (ctx) {
            KT_EQ_INT(compile(ctx, SPEC_1, "sm_90a"), 1);
            KT_EQ_INT(compile(ctx, SPEC_2, "sm_90a"), -1);
            KT_CONTAINS(kiln_ctx_errmsg(ctx), "read-only");
            KT_CONTAINS(kiln_ctx_errmsg(ctx), "nothing compiled");
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
        snprintf(sql, sizeof sql, "UPDATE kernels SET last_used = %d WHERE key = '%s'", stamp[i], k[i]);
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
    snprintf(sql, sizeof sql, "SELECT group_concat(key) FROM (SELECT key FROM kernels ORDER BY key)");
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
