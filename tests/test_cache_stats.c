/*
 * test_cache_stats.c — cache/stats.c and the counter-only close of cache/schema.c, on the
 * store directly: per-arch totals, zeroing (counters, rows' hits, the stamp), clearing, each
 * of their statements failing in turn by fault injection (rolled back, reported, nothing
 * changed), the hit log (hits.c: what a lookup writes, what a fold takes, what it refuses to
 * read); the byte totals of the stats.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "kt.h"

/* 1 when the cache directory dir has a -wal file beside kernels.db. */
static int wal_exists(const char *dir) { return kt_exists(kt_join(dir, "kernels.db-wal")); }

/* Store key with arch (junk cubin; nothing loads it). */
static void put(kiln__cache *c, const char *key, const char *arch)
{
    static char blob[32] = "cubin";
    kiln__entry en;
    kiln__err e = {{0}};
    memset(&en, 0, sizeof en);
    snprintf(en.key, sizeof en.key, "%s", key);
    en.spec = (char *)"op=decode dtype=f16 head_dim=64 group=1";
    en.arch = (char *)arch;
    en.cubin = blob;
    en.cubin_size = sizeof blob;
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
}

/* A hit on key (the row is read and the counters bumped). */
static void hit(kiln__cache *c, const char *key)
{
    kiln__entry en;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_get(c, key, 0, &en, &e), e.msg);
    kiln__entry_free(&en);
}

#define K1 "11111111111111111111111111111111"
#define K2 "22222222222222222222222222222222"
#define K3 "33333333333333333333333333333333"

KT_TEST(cache_stats_arch_zero_clear)
{
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_open(kt_path("a"), &c, &e), e.msg);
    KT_REQUIRE(c);
    put(c, K1, "sm_80");
    put(c, K2, "sm_90a");
    put(c, K3, "sm_90a");
    hit(c, K2);
    hit(c, K2);
    hit(c, K3);
    kiln__entry miss;
    KT_STATUS(kiln__cache_get(c, "44444444444444444444444444444444", 0, &miss, &e),
              KILN_STATUS_NOT_FOUND, e.msg);
    kiln__arch_stats a[4];
    int n = 0;
    int64_t zeroed = -1;
    KT_OK(kiln__cache_arch_stats(c, a, 4, &n, &zeroed, &e), e.msg);
    KT_EQ_INT(n, 2);
    KT_EQ_STR(a[0].arch, "sm_80");
    KT_EQ_INT(a[0].entries, 1);
    KT_EQ_INT(a[0].hits, 0);
    KT_EQ_STR(a[1].arch, "sm_90a");
    KT_EQ_INT(a[1].entries, 2);
    KT_EQ_INT(a[1].bytes, 64);
    KT_EQ_INT(a[1].hits, 3);
    KT_EQ_INT(zeroed, 0);
    KT_OK(kiln__cache_arch_stats(c, a, 1, &n, &zeroed, &e), e.msg); /* cap 1: the rest dropped */
    KT_EQ_INT(n, 1);
    kiln__cache_stats s;
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 3);
    KT_EQ_INT(s.misses, 1);

    /* every statement of zero and clear fails in turn: reported, rolled back */
    int tested = 0;
    for (int i = 1; i <= 8; i++) {
        kiln__fault_arm("sqlite", i);
        kiln_status st = kiln__cache_stats_zero(c, &e);
        int fired = kiln__fault("sqlite") == 0;
        kiln__fault_arm("sqlite", 0);
        if (!fired) break;
        tested++;
        KT_STATUS(st, KILN_STATUS_CACHE, e.msg);
        KT_CONTAINS(e.msg, "zeroing the counters");
        KT_CONTAINS(e.msg, "injected");
        KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
        KT_EQ_INT(s.hits, 3);
    }
    KT_CHECK(tested >= 3); /* begin, the statements, commit */
    int removed = -1;
    kiln__fault_arm("sqlite", 2);
    KT_STATUS(kiln__cache_clear(c, &removed, &e), KILN_STATUS_CACHE, e.msg);
    kiln__fault_arm("sqlite", 0);
    KT_EQ_INT(removed, 0);
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.entries, 3);

    KT_OK(kiln__cache_stats_zero(c, &e), e.msg);
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 0);
    KT_EQ_INT(s.misses, 0);
    KT_OK(kiln__cache_arch_stats(c, a, 4, &n, &zeroed, &e), e.msg);
    KT_EQ_INT(a[1].hits, 0);
    KT_CHECK(zeroed > 0);
    KT_OK(kiln__cache_clear(c, &removed, &e), e.msg);
    KT_EQ_INT(removed, 3);
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.entries, 0);
    KT_OK(kiln__cache_integrity(c, &e), e.msg);
    kiln__cache_close(c);

    /* read-only: zero and clear are refused */
    KT_OK(kiln__cache_open_ex(kt_path("a"), KILN__CACHE_RDONLY, &c, &e), e.msg);
    KT_STATUS(kiln__cache_stats_zero(c, &e), KILN_STATUS_IO, e.msg);
    KT_CONTAINS(e.msg, "read-only");
    KT_STATUS(kiln__cache_clear(c, &removed, &e), KILN_STATUS_IO, e.msg);
    kiln__cache_close(c);
}

KT_TEST(cache_hit_log)
{
    const char *d = kt_path("w");
    char log[1100];
    snprintf(log, sizeof log, "%s", kt_join(d, "kernels.db-hits"));
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    kiln__cache_stats s;
    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    KT_REQUIRE(c);
    put(c, K1, "sm_80");
    kiln__cache_close(c);
    KT_CHECK(!wal_exists(d)); /* a store: checkpointed, WAL removed */

    /* a hit writes the log, not the database: no WAL, one 64-byte record */
    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    hit(c, K1);
    kiln__cache_close(c);
    KT_CHECK(!wal_exists(d));
    size_t n = 0;
    free(kt_slurp(log, &n));
    KT_EQ_INT(n, 64);
    KT_EQ_INT(kt_file_mode(log), 0600);

    /* the next handle's stats fold it in and remove the log */
    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 1);
    KT_CHECK(!kt_exists(log));
    kiln__cache_close(c);

    /* a miss is a record too; garbage before, between and after records is skipped, a torn
     * record among them too, and the records around them still count */
    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    kiln__entry en;
    KT_STATUS(kiln__cache_get(c, K3, 0, &en, &e), KILN_STATUS_NOT_FOUND, e.msg);
    hit(c, K1);
    char *good = kt_slurp(log, &n);
    KT_REQUIRE(good && n == 128);
    unsigned char mixed[7 + 128 + 64 + 40 + 5];
    memset(mixed, 0x5a, sizeof mixed);
    memcpy(mixed + 7, good, 64);            /* the miss, after 7 bytes of junk */
    memcpy(mixed + 7 + 64, good + 64, 40);  /* the hit, torn */
    memcpy(mixed + 7 + 104, good + 64, 64); /* the hit, whole */
    memcpy(mixed + 7 + 168, good + 64, 64); /* the hit once more, one byte changed: */
    mixed[7 + 168 + 20] ^= 1;               /* its checksum fails */
    free(good);
    KT_CHECK(kt_write(log, mixed, sizeof mixed) == 0);
    KT_EQ_INT(kiln__cache_fold_hits(c), 2);
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 2);
    KT_EQ_INT(s.misses, 1);
    char *h = kt_sql_text(kiln__cache_path(c), "SELECT hits FROM kernels WHERE key = '" K1 "'");
    KT_EQ_STR(h, "2");
    free(h);

    /* a record stamped far in the future, or of a key with capitals, is not believed even
     * with a checksum that matches (the layout: docs/cache.md, "stats") */
    hit(c, K1);
    good = kt_slurp(log, &n);
    KT_REQUIRE(good && n == 64);
    unsigned char forged[3 * 64];
    for (int i = 0; i < 3; i++) memcpy(forged + 64 * i, good, 64);
    int64_t later = (int64_t)time(NULL) + 3 * 24 * 3600;
    memcpy(forged + 8, &later, 8);
    memcpy(forged + 64 + 16, "ABCDEF", 6);
    for (int i = 0; i < 2; i++) {
        uint64_t sum = kiln__hash64(forged + 64 * i, 56);
        memcpy(forged + 64 * i + 56, &sum, 8);
    }
    KT_CHECK(kt_write(log, forged, sizeof forged) == 0);
    KT_EQ_INT(kiln__cache_fold_hits(c), 1);
    h = kt_sql_text(kiln__cache_path(c), "SELECT hits FROM kernels WHERE key = '" K1 "'");
    KT_EQ_STR(h, "3");
    free(h);
    kiln__cache_close(c);

    /* a log that is a link, a FIFO or a directory is never followed, read or blocked on */
    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    KT_CHECK(symlink("/dev/null", log) == 0);
    hit(c, K1);
    KT_EQ_INT(kiln__cache_fold_hits(c), -1);
    unlink(log);
    KT_CHECK(mkfifo(log, 0600) == 0);
    hit(c, K1);
    unlink(log);
    KT_CHECK(mkdir(log, 0700) == 0);
    hit(c, K1);
    KT_EQ_INT(kiln__cache_fold_hits(c), -1);
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg); /* stats say why nothing is counted */
    KT_CONTAINS(s.hit_log, "kernels.db-hits is a directory, not a regular file");
    rmdir(log);
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_STR(s.hit_log, "");
    KT_EQ_INT(s.hits, 3);
    KT_OK(kiln__cache_integrity(c, &e), e.msg);

    /* zeroing drops the records not yet folded */
    hit(c, K1);
    KT_OK(kiln__cache_stats_zero(c, &e), e.msg);
    KT_CHECK(!kt_exists(log));
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 0);
    kiln__cache_close(c);
    free(good);

    /* a read-only handle counts nothing and leaves no log */
    KT_OK(kiln__cache_open_ex(d, KILN__CACHE_RDONLY, &c, &e), e.msg);
    hit(c, K1);
    KT_CHECK(!kt_exists(log));
    kiln__cache_close(c);
}

/* The hit log takes the database file's mode, whatever the umask (a cache shared by a group). */
KT_TEST(cache_hit_log_mode)
{
    const char *d = kt_path("mode");
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    KT_REQUIRE(c);
    put(c, K1, "sm_80");
    KT_CHECK(chmod(kiln__cache_path(c), 0660) == 0);
    kiln__cache_close(c);
    mode_t old = umask(077);
    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    hit(c, K1);
    umask(old);
    KT_EQ_INT(kt_file_mode(kt_join(d, "kernels.db-hits")), 0660);
    kiln__cache_close(c);
}

/* A log past its fold size is folded by the lookup that finds it so: 16384 records. */
KT_TEST(cache_hit_log_folds_when_long)
{
    const char *d = kt_path("long");
    char log[1100];
    snprintf(log, sizeof log, "%s", kt_join(d, "kernels.db-hits"));
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    KT_REQUIRE(c);
    put(c, K1, "sm_80");
    hit(c, K1);
    size_t n = 0;
    char *one = kt_slurp(log, &n);
    KT_REQUIRE(one && n == 64);
    size_t many = 16383;
    char *buf = malloc(many * 64);
    KT_REQUIRE(buf);
    for (size_t i = 0; i < many; i++) memcpy(buf + 64 * i, one, 64);
    KT_CHECK(kt_write(log, buf, many * 64) == 0);
    free(buf);
    free(one);
    hit(c, K1); /* the 16384th record: folded here */
    KT_CHECK(!kt_exists(log));
    char *h = kt_sql_text(kiln__cache_path(c), "SELECT hits FROM kernels");
    KT_EQ_STR(h, "16384");
    free(h);
    kiln__cache_close(c);
}

KT_TEST(cache_stats_bytes)
{
    kiln__cache *c = KT_CACHE_OPEN(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__cache_stats s;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.entries, 0);
    KT_EQ_INT(s.bytes, 0);
    size_t total = 0;
    for (int i = 0; i < 5; i++) {
        kiln__entry en;
        kt_entry(&en, i, 1000 * (size_t)(i + 1) + 3);
        total += en.cubin_size;
        KT_OK(kiln__cache_put(c, &en, &e), e.msg);
        kiln__entry_free(&en);
    }
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.entries, 5);
    KT_EQ_INT(s.bytes, total);
    struct stat db, wal;
    int64_t want = stat(kiln__cache_path(c), &db) == 0 ? db.st_size : 0;
    if (stat(kt_path("kernels.db-wal"), &wal) == 0) want += wal.st_size;
    KT_EQ_INT(s.file_bytes, want);
    KT_CHECK(s.file_bytes >= (int64_t)total);
    kiln__cache_close(c);
}

/* Processes looking up and folding at once: every lookup succeeds, no count is doubled, and
 * the lookups made while no fold runs are all counted. */
KT_TEST(cache_hit_log_processes)
{
    enum { PROCS = 4, HITS = 300 };
    const char *d = kt_path("p");
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    KT_REQUIRE(c);
    put(c, K1, "sm_80");
    put(c, K2, "sm_80");
    kiln__cache_close(c);
    for (int round = 0; round < 2; round++) { /* 0: lookups alone; 1: with folds among them */
        fflush(stdout);
        pid_t pids[PROCS + 1];
        for (int i = 0; i < PROCS + round; i++) {
            pids[i] = fork();
            KT_REQUIRE(pids[i] >= 0);
            if (pids[i] == 0) {
                kiln__cache *cc = NULL;
                kiln__err ce = {{0}};
                int bad = kiln__cache_open(d, &cc, &ce) != KILN_STATUS_OK;
                for (int j = 0; !bad && j < HITS; j++) {
                    if (i == PROCS) { /* the folder */
                        bad = kiln__cache_fold_hits(cc) < 0;
                        continue;
                    }
                    kiln__entry en;
                    bad = kiln__cache_get(cc, (i + j) % 2 ? K1 : K2, 0, &en, &ce) != 0;
                    kiln__entry_free(&en);
                }
                if (bad) printf("    process %d: %s\n", i, ce.msg);
                kiln__cache_close(cc);
                fflush(stdout);
                _exit(bad);
            }
        }
        for (int i = 0; i < PROCS + round; i++) {
            int status = 0;
            KT_CHECK(waitpid(pids[i], &status, 0) == pids[i]);
            KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        KT_OK(kiln__cache_open(d, &c, &e), e.msg);
        kiln__cache_stats s;
        KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
        long rows = kt_sql_long(kiln__cache_path(c), "SELECT sum(hits) FROM kernels");
        int64_t made = (int64_t)(round + 1) * PROCS * HITS;
        KT_EQ_INT(s.hits, rows);
        if (round == 0) KT_EQ_INT(s.hits, made);
        else KT_CHECK(s.hits <= made && s.hits > made - PROCS * HITS);
        printf("    round %d: %lld of %lld lookups counted\n", round, (long long)s.hits,
               (long long)made);
        KT_OK(kiln__cache_integrity(c, &e), e.msg);
        kiln__cache_close(c);
    }
}

/* Logs of whole records with random junk between them (random lengths, random bytes, cut
 * records): a fold counts exactly the whole records, whatever surrounds them. */
KT_TEST(cache_hit_log_junk)
{
    const char *d = kt_path("junk");
    char log[1100];
    snprintf(log, sizeof log, "%s", kt_join(d, "kernels.db-hits"));
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    KT_REQUIRE(c);
    put(c, K1, "sm_80");
    hit(c, K1);
    size_t n = 0;
    unsigned char *rec = (unsigned char *)kt_slurp(log, &n);
    KT_REQUIRE(rec && n == 64);
    KT_EQ_INT(kiln__cache_fold_hits(c), 1);
    unsigned seed = 12345;
    enum { CAP = 1 << 16 };
    unsigned char *buf = malloc(CAP);
    KT_REQUIRE(buf);
    long want_total = 1;
    for (int round = 0; round < 40; round++) {
        size_t len = 0;
        int want = 0;
        while (len + 64 + 200 < CAP && (seed = seed * 1103515245u + 12345u) % 97 != 0) {
            unsigned r = (seed >> 8) % 4;
            if (r == 0) { /* a whole record */
                memcpy(buf + len, rec, 64);
                len += 64;
                want++;
            } else if (r == 1) { /* a record cut short */
                size_t cut = 1 + (seed >> 12) % 63;
                memcpy(buf + len, rec, cut);
                len += cut;
                /* ... and a byte that cannot continue it. Without it a cut of 63 followed by a
                 * byte equal to the record's last (1 in 256 by the clock, which the record's
                 * stamp and sum follow) is a whole record to any reader, and is counted. */
                buf[len++] = (unsigned char)(rec[cut] ^ 0x5a);
            } else { /* random bytes */
                size_t junk = 1 + (seed >> 12) % 150;
                for (size_t i = 0; i < junk; i++) {
                    seed = seed * 1103515245u + 12345u;
                    buf[len++] = (unsigned char)(seed >> 16);
                }
            }
        }
        KT_CHECK(kt_write(log, buf, len) == 0);
        KT_EQ_INT(kiln__cache_fold_hits(c), want);
        want_total += want;
    }
    char *h = kt_sql_text(kiln__cache_path(c), "SELECT hits FROM kernels");
    char expect[32];
    snprintf(expect, sizeof expect, "%ld", want_total);
    KT_EQ_STR(h, expect);
    free(h);
    free(buf);
    free(rec);
    KT_OK(kiln__cache_integrity(c, &e), e.msg);
    kiln__cache_close(c);
}
