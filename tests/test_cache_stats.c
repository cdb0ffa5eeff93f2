/*
 * test_cache_stats.c — cache/stats.c and the counter-only close of cache/schema.c, on the
 * store directly: per-arch totals, zeroing (counters, rows' hits, the stamp), clearing, each
 * of their statements failing in turn by fault injection (rolled back, reported, nothing
 * changed), and which handles leave their WAL on close (only those that wrote nothing but
 * counters); the byte totals of the stats.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
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

KT_TEST(cache_counter_only_close_keeps_wal)
{
    const char *d = kt_path("w");
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    KT_REQUIRE(c);
    put(c, K1, "sm_80");
    kiln__cache_close(c);
    KT_CHECK(!wal_exists(d)); /* a store: checkpointed, WAL removed */

    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    hit(c, K1);
    kiln__cache_close(c);
    KT_CHECK(wal_exists(d)); /* only counters: the WAL stays */

    KT_OK(kiln__cache_open(d, &c, &e), e.msg); /* the next handle sees the hit */
    kiln__cache_stats s;
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 1);
    kiln__cache_close(c);
    KT_CHECK(!wal_exists(d)); /* a reader: checkpoints as the last one open */

    KT_OK(kiln__cache_open(d, &c, &e), e.msg); /* hits, then a store: checkpoints */
    hit(c, K1);
    put(c, K2, "sm_80");
    kiln__cache_close(c);
    KT_CHECK(!wal_exists(d));

    KT_OK(kiln__cache_open(d, &c, &e), e.msg); /* a miss alone is a counter too */
    kiln__entry en;
    KT_STATUS(kiln__cache_get(c, K3, 0, &en, &e), KILN_STATUS_NOT_FOUND, e.msg);
    kiln__cache_close(c);
    KT_CHECK(wal_exists(d));
    KT_OK(kiln__cache_open(d, &c, &e), e.msg);
    KT_OK(kiln__cache_integrity(c, &e), e.msg);
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 2);
    KT_EQ_INT(s.misses, 1);
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
