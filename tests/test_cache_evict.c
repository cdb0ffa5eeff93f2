/*
 * test_cache_evict.c — the size bound (cache/evict.c): least recently used rows go first and
 * the row in use stays; sizes with unit suffixes parsed and bad ones refused. Needs no GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "kt.h"

KT_TEST(cache_evict_lru)
{
    kiln__cache *c = KT_CACHE_OPEN(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__err e = {{0}};
    enum { N = 10, SIZE = 1000 };
    char keys[N][33];
    for (int i = 0; i < N; i++) {
        kiln__entry en;
        kt_entry(&en, 100 + i, SIZE);
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
    KT_EQ_INT(kt_cache_rows(c), 0);
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
