/*
 * test_fleet_faults.c — the cache under damage, as a fleet meets it: corrupt rows detected
 * (checksum, ELF check) and repaired by recompiling, warms killed with SIGKILL at random
 * moments (no row lost, no lease that blocks a rerun), injected SQLite faults and a read-only
 * cache (as an unprivileged user), and a full disk. Every compile is one of kt.h's cheap
 * decode variants. Needs no GPU.
 */
#include <errno.h>
#include <signal.h>
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

/* ---- corruption ---------------------------------------------------------------------------------- */

KT_TEST(fleet_corrupt_rows)
{
    const char *dir = kt_path("c"), *db = kt_path("c/kernels.db");
    char k[4][33];
    for (int i = 0; i < 4; i++) kt_key_of(kt_specs4[i], "sm_80", k[i]);
    kiln_ctx *ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    for (int i = 0; i < 3; i++) KT_EQ_INT(kt_compile(ctx, kt_specs4[i], "sm_80"), 0);
    kiln_ctx_destroy(ctx);
    char *good = kt_sql_text(db, "SELECT group_concat(key || checksum) FROM "
                                 "(SELECT key, checksum FROM kernels ORDER BY key)");
    char sql[1024];
    /* four kinds of damage: row 0 flipped, row 1 truncated with a matching checksum, row 2's
     * key material edited, and row 2 copied under the key of spec 3 */
    KT_CHECK(kt_damage_cubin(db, k[0], KT_FLIP));
    KT_CHECK(kt_damage_cubin(db, k[1], KT_TRUNCATE_RESUMMED));
    snprintf(sql, sizeof sql,
             "INSERT INTO kernels SELECT '%s', spec, arch, nvrtc, key_material, source, log, cubin,"
             " checksum, registers, smem_bytes, spill_bytes, stack_bytes, compile_ms, created,"
             " last_used, hits, row_sum FROM kernels WHERE key = '%s'",
             k[3], k[2]);
    KT_CHECK(kt_sql_exec(db, sql));
    snprintf(sql, sizeof sql,
             "UPDATE kernels SET key_material = replace(key_material, 'group=4', 'group=5') "
             "WHERE key = '%s'",
             k[2]);
    KT_CHECK(kt_sql_exec(db, sql));

    /* verify reports each with its reason, and exits 1 */
    kt_out r;
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "verify"), 1);
    KT_CONTAINS(r.out, "verified 4 rows");
    KT_CONTAINS(r.out, ": 4 bad");
    char want[128];
    snprintf(want, sizeof want, "bad %s sm_80 ", k[0]);
    KT_CONTAINS(r.out, want);
    KT_CONTAINS(r.out, "checksum mismatch: stored ");
    KT_CONTAINS(r.out, "the cubin is truncated");
    KT_CONTAINS(r.out, "the key does not match its key material");
    kt_out_free(&r);

    /* strict mode refuses them (never loaded) and says why */
    ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_STRICT, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_0, "sm_80"), -1);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "failed its checksum");
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_3, "sm_80"), -1);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "failed its row checksum"); /* the seal covers the key */
    kiln_ctx_destroy(ctx);

    /* a compiling context reports each on stderr, never loads it, and recompiles */
    ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    static const char *const reasons[4] = {"failed its checksum", "failed its row checksum",
                                           "failed its row checksum", "failed its row checksum"};
    for (int i = 0; i < 4; i++) {
        int from_cache = -2;
        char *err = kt_capture_stderr(kt_compile, ctx, kt_specs4[i], "sm_80", &from_cache);
        KT_EQ_INT(from_cache, 0);
        KT_CONTAINS(err, k[i]);
        KT_CONTAINS(err, reasons[i]);
        KT_CONTAINS(err, "not loaded");
        KT_CONTAINS(err, "recompiling");
        free(err);
    }
    kiln_ctx_destroy(ctx);
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "verify"), 0);
    KT_CONTAINS(r.out, "verified 4 rows");
    KT_CONTAINS(r.out, ": 0 bad");
    kt_out_free(&r);
    /* recompiled: byte-equal to the first compile (NVRTC is deterministic) */
    snprintf(sql, sizeof sql,
             "SELECT group_concat(key || checksum) FROM (SELECT key, checksum FROM kernels "
             "WHERE key != '%s' ORDER BY key)",
             k[3]);
    char *repaired = kt_sql_text(db, sql);
    KT_EQ_STR(repaired, good);
    free(repaired);
    free(good);

    /* verify --fix deletes bad rows instead */
    KT_CHECK(kt_damage_cubin(db, k[0], KT_TRUNCATE_STALE));
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "verify", "--fix"), 0);
    KT_CONTAINS(r.out, "1 bad, 1 removed");
    kt_out_free(&r);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM kernels"), 3);
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "verify"), 0);
    kt_out_free(&r);
    KT_INTEGRITY(db);
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
    const char *dir = kt_path("c"), *db = kt_path("c/kernels.db"), *m = kt_path("m.txt");
    kt_write_text(m, "op=decode head_dim=64 dtype={f16,bf16} group={1,2,4,8}\n");
    const char *const args[] = {"--cache", dir, "warm", "--arch", "sm_90a", "--jobs", "2", m, NULL};
    unsigned seed = (unsigned)time(NULL);
    printf("    seed %u\n", seed);
    srand(seed);
    int kills = 0, lost = 0, mid_compile = 0;
    for (int i = 0; i < ATTEMPTS && kills < KILLS; i++) {
        if (access(db, F_OK) == 0) {
            KT_CHECK(kt_sql_exec(db, "DELETE FROM kernels WHERE abs(random()) % 2 = 0"));
        }
        char *before = access(db, F_OK) == 0
                           ? kt_sql_text(db, "SELECT group_concat(key) FROM kernels")
                           : strdup("");
        pid_t pid = kt_kiln_spawn("k", NULL, args);
        int delay_ms = rand() % 1501;
        int code = 0;
        if (wait_for(pid, delay_ms, &code)) {
            KT_EQ_INT(code, 0); /* finished before the kill */
        } else {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            kills++;
        }
        long leases = kt_sql_long(db, "SELECT count(*) FROM leases");
        mid_compile += leases > 0;
        /* every row present before the run is still there */
        for (char *p = before; p && *p;) {
            char key[33];
            snprintf(key, sizeof key, "%.32s", p);
            char sql[128];
            snprintf(sql, sizeof sql, "SELECT count(*) FROM kernels WHERE key = '%s'", key);
            if (kt_sql_long(db, sql) != 1) lost++;
            p += strlen(key);
            if (*p == ',') p++;
        }
        free(before);
    }
    KT_CHECK(kills >= 20);
    KT_EQ_INT(lost, 0);
    KT_INTEGRITY(db);
    kt_out r;
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "verify"), 0);
    KT_CONTAINS(r.out, ": 0 bad");
    kt_out_free(&r);
    /* the leases of killed builders block nobody: a rerun completes promptly */
    long t0 = (long)time(NULL);
    pid_t pid = kt_kiln_spawn("rerun", NULL, args);
    int code = -1;
    int done = wait_for(pid, 60000, &code);
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    KT_CHECK(done);
    KT_EQ_INT(code, 0);
    kt_kiln_reap(-1, "rerun", &r);
    KT_CONTAINS(r.out, "8 kernels: ");
    KT_CONTAINS(r.out, " 0 failed");
    kt_out_free(&r);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM kernels"), 8);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM leases"), 0);
    printf("    %d kills (%d left a lease behind), rows lost %d, rerun %ld s\n", kills, mid_compile,
           lost, (long)time(NULL) - t0);
    KT_INTEGRITY(db);
}

/* ---- faults ------------------------------------------------------------------------------------- */

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
    if (kt_compile(ctx, KT_SPEC_0, "sm_80") != 1) {
        printf("    read-only cache: the stored kernel: %s\n", kiln_ctx_errmsg(ctx));
        bad++;
    }
    int from_cache = -2;
    char *err = kt_capture_stderr(kt_compile, ctx, KT_SPEC_1, "sm_80", &from_cache);
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
    const char *dir = kt_path("c"), *db = kt_path("c/kernels.db");
    kiln_ctx *ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_0, "sm_80"), 0);
    kiln_ctx_destroy(ctx);
    char *sum0 = kt_sql_text(db, "SELECT checksum FROM kernels");

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
            if (setgid(KT_NOBODY) != 0 || setuid(KT_NOBODY) != 0) _exit(99);
            int bad = readonly_checks(dir);
            fflush(stdout);
            _exit(bad ? 1 : 0);
        }
        int status = 0;
        KT_REQUIRE(waitpid(pid, &status, 0) == pid);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 99)
            kt_skip("cannot drop to uid %d: read-only directory not tested", KT_NOBODY);
        else KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }

    /* 2. every SQLite statement of a miss (lookups, lease, store, release) fails in turn: a
     * failed read is reported and recompiled, a lease that cannot be taken is reported and the
     * kernel compiled without it, a store that fails is reported and the kernel still returned;
     * what was stored before stays, no lease is left behind, the file stays sound */
    char key1[33], sql[256];
    kt_key_of(KT_SPEC_1, "sm_80", key1);
    snprintf(sql, sizeof sql, "DELETE FROM kernels WHERE key = '%s'", key1);
    int failed_calls = 0, reported = 0, n = 1;
    for (; n < 60; n++) {
        KT_CHECK(kt_sql_exec(db, sql));
        ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
        if (!ctx) break;
        kiln__fault_arm("sqlite", n);
        int from_cache = -2;
        char *err = kt_capture_stderr(kt_compile, ctx, KT_SPEC_1, "sm_80", &from_cache);
        int fired = kiln__fault("sqlite") == 0; /* the countdown was used up: it fired */
        kiln__fault_arm("sqlite", 0);
        if (from_cache < 0) {
            failed_calls++;
            KT_CONTAINS(kiln_ctx_errmsg(ctx), "injected");
        }
        reported += from_cache < 0 || strstr(err, "injected") != NULL;
        free(err);
        kiln_ctx_destroy(ctx);
        char *sum = kt_sql_text(
            db, "SELECT checksum FROM kernels WHERE rowid = (SELECT min(rowid) FROM kernels)");
        KT_EQ_STR(sum, sum0); /* what was there before is intact */
        free(sum);
        KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM leases"), 0);
        KT_INTEGRITY(db);
        if (!fired) break; /* past the last statement */
    }
    printf("    %d statements failed in turn: %d reported, %d failed the call\n", n - 1, reported,
           failed_calls);
    KT_CHECK(reported >= 6); /* lookup, lease read / begin / insert / commit, store ... */
    KT_CHECK(n > 8);

    /* 3. NVRTC missing: a clear error, nothing stored, no lease left */
    ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    KT_REQUIRE(ctx);
    kiln__fault_arm("nvrtc", 1);
    KT_EQ_INT(kt_compile(ctx, KT_SPEC_2, "sm_80"), -1);
    kiln__fault_arm("nvrtc", 0);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "op=decode dtype=bf16 head_dim=64 group=4");
    kiln_ctx_destroy(ctx);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM leases"), 0);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM kernels"), 2);
    free(sum0);
}

/* A full disk: a cache on a 1 MiB tmpfs fills up. Needs the right to mount. */
KT_TEST(fleet_full_disk)
{
    const char *mnt = kt_path("small");
    KT_REQUIRE(mkdir(mnt, 0755) == 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=1m") != 0) {
        kt_skip("cannot mount a tmpfs here (%s): full disk not tested", strerror(errno));
        return;
    }
    const char *dir = kt_path("small/c"), *db = kt_path("small/c/kernels.db");
    static const char *const dtypes[] = {"f16", "bf16"};
    int stored = 0, full = 0;
    char spec[128], key[33], sql[128];
    kiln_ctx *ctx = KT_CTX_POLICY(dir, KILN_CACHE_MODE_COMPILE, NULL, NULL, 0);
    for (int i = 0; ctx && i < 16 && !full; i++) {
        const char *arch = i < 8 ? "sm_80" : "sm_90a";
        snprintf(spec, sizeof spec, "op=decode head_dim=64 dtype=%s group=%d", dtypes[i % 2],
                 1 << (i / 2 % 4));
        int from_cache = -2;
        char *err = kt_capture_stderr(kt_compile, ctx, spec, arch, &from_cache);
        KT_EQ_INT(from_cache, 0); /* the kernel is compiled whatever the disk says */
        kt_key_of(spec, arch, key);
        snprintf(sql, sizeof sql, "SELECT count(*) FROM kernels WHERE key = '%s'", key);
        if (kt_sql_long(db, sql) == 1) {
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
    kt_out r;
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "verify"), 0);
    KT_CONTAINS(r.out, ": 0 bad");
    kt_out_free(&r);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM kernels"), stored);
    printf("    %d kernels stored before the disk was full\n", stored);
    /* a warm into the full cache says which kernels it could not store, and fails */
    const char *m = kt_path("m.txt");
    kt_write_text(m, "op=decode head_dim=64 dtype=f16 group={1,2,4,8} arch=sm_89\n");
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "warm", m), 1);
    KT_CONTAINS(r.err, "compiled but not stored");
    kt_out_free(&r);
    KT_EQ_INT(kt_sql_long(db, "SELECT count(*) FROM kernels"), stored);
    KT_CHECK(umount2(mnt, MNT_DETACH) == 0);
}
