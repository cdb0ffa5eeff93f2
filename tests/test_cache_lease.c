/*
 * test_cache_lease.c — single-flight compile leases (cache/lease.c): taken, held by another
 * handle, present once the row is stored, taken again to replace a corrupt row; leases of dead
 * processes, expired ones, orphans of this process and other hosts'; the sweep; an injected
 * failure while taking. Needs no GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "kt.h"

/* Insert a lease row for key directly. */
static void put_lease(const char *db, const char *key, const char *host, long pid, int64_t expires)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT OR REPLACE INTO leases(key, holder, pid, host, expires) VALUES "
             "('%s', '%s/%ld/test', %ld, '%s', %lld)",
             key, host, pid, pid, host, (long long)expires);
    KT_CHECK(kt_sql_exec(db, sql));
}

KT_TEST(cache_lease_states)
{
    const char *dir = kt_path("c");
    const char *db = kt_join(dir, "kernels.db");
    kiln__cache *a = KT_CACHE_OPEN(dir), *b = KT_CACHE_OPEN(dir);
    KT_REQUIRE(a && b);
    kiln__entry en;
    kt_entry(&en, 9, 100);
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
    char *v = kt_sql_text(db, "SELECT count(*) FROM leases");
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
    v = kt_sql_text(db, "SELECT group_concat(key) FROM leases");
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
        v = kt_sql_text(
            db, "SELECT count(*) FROM leases WHERE key = '00000000000000000000000000000005'");
        KT_EQ_STR(v, "0");
        free(v);
    }
    kiln__cache_lease_release(a, k5);
    kiln__entry_free(&en);
    kiln__cache_close(a);
    kiln__cache_close(b);
    KT_INTEGRITY(db);
}
