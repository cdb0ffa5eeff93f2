/*
 * test_cache_store.c — rows in the cache (cache/store.c, with verify.c's checksums): round
 * trips, refused arguments, hit and miss counters, persistence across handles, a cubin changed
 * behind the cache's back, key prefixes, listing order, injected SQLite failures in put and
 * get, and concurrent use from threads, handles and processes. Needs no GPU. Each test works
 * in its own kt_tmpdir().
 */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "kt.h"

/* ---- rows ------------------------------------------------------------------------------------ */

KT_TEST(cache_roundtrip)
{
    kiln__cache *c = KT_CACHE_OPEN(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__entry en, got;
    kiln__err e = {{0}};
    kt_entry(&en, 5, 70001);
    en.created = 1700000000;
    en.last_used = 1700000500;
    en.hits = 3;
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    KT_OK(kiln__cache_get(c, en.key, 1, &got, &e), e.msg);
    KT_EQ_STR(got.key, en.key);
    KT_EQ_STR(got.spec, en.spec);
    KT_EQ_STR(got.arch, en.arch);
    KT_EQ_STR(got.nvrtc, en.nvrtc);
    KT_EQ_STR(got.key_material, en.key_material);
    KT_EQ_STR(got.source, en.source);
    KT_EQ_STR(got.log, en.log);
    KT_EQ_INT(got.cubin_size, en.cubin_size);
    KT_CHECK(got.cubin && memcmp(got.cubin, en.cubin, en.cubin_size) == 0);
    KT_EQ_INT(got.registers, en.registers);
    KT_EQ_INT(got.smem_bytes, en.smem_bytes);
    KT_EQ_INT(got.spill_bytes, en.spill_bytes);
    KT_EQ_INT(got.stack_bytes, en.stack_bytes);
    KT_CHECK(got.compile_ms == en.compile_ms);
    KT_EQ_INT(got.created, 1700000000);
    KT_CHECK(got.last_used >= (int64_t)time(NULL) - 5); /* this hit bumped it */
    KT_EQ_INT(got.hits, 4);
    kiln__entry_free(&got);
    KT_EQ_INT(kiln__cache_fold_hits(c), 1); /* the hit, from the log into the row */
    /* without texts */
    KT_OK(kiln__cache_get(c, en.key, 0, &got, &e), e.msg);
    KT_CHECK(got.source == NULL && got.log == NULL && got.key_material == NULL);
    KT_EQ_STR(got.spec, en.spec);
    KT_CHECK(got.cubin && got.cubin_size == en.cubin_size &&
             memcmp(got.cubin, en.cubin, en.cubin_size) == 0);
    KT_EQ_INT(got.hits, 5);
    kiln__entry_free(&got);
    kiln__entry_free(&got); /* safe twice: the struct is zeroed */
    KT_CHECK(got.spec == NULL && got.cubin == NULL && got.cubin_size == 0);
    kiln__entry_free(NULL);

    /* NULL texts are stored as ""; zero stamps become now; replace keeps one row */
    kiln__entry bare = {0};
    memcpy(bare.key, en.key, 33);
    bare.spec = en.spec;
    bare.arch = en.arch;
    bare.cubin = en.cubin;
    bare.cubin_size = 10;
    int64_t t0 = (int64_t)time(NULL);
    KT_OK(kiln__cache_put(c, &bare, &e), e.msg);
    KT_EQ_INT(kt_cache_rows(c), 1);
    KT_OK(kiln__cache_get(c, en.key, 1, &got, &e), e.msg);
    KT_EQ_STR(got.nvrtc, "");
    KT_EQ_STR(got.source, "");
    KT_EQ_STR(got.log, "");
    KT_EQ_STR(got.key_material, "");
    KT_EQ_INT(got.cubin_size, 10);
    KT_CHECK(got.created >= t0 && got.created <= t0 + 5);
    KT_EQ_INT(got.hits, 1);
    kiln__entry_free(&got);
    kiln__entry_free(&en);
    kiln__cache_close(c);
}

KT_TEST(cache_put_invalid)
{
    kiln__cache *c = KT_CACHE_OPEN(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__entry en, got;
    kiln__err e = {{0}};
    kt_entry(&en, 1, 16);
    char good[33];
    memcpy(good, en.key, 33);
    static const char *bad_keys[] = {"", "abc", "0123456789abcdef0123456789abcdeF",
                                     "0123456789abcdef0123456789abcdeg",
                                     "0123456789abcdef0123456789abcdef0"};
    for (size_t i = 0; i < sizeof bad_keys / sizeof bad_keys[0]; i++) {
        snprintf(en.key, sizeof en.key, "%s", bad_keys[i]);
        if (strlen(bad_keys[i]) <= 32) /* a longer one does not fit into en.key */
            KT_STATUS(kiln__cache_put(c, &en, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
        KT_STATUS(kiln__cache_get(c, bad_keys[i], 1, &got, &e), KILN_STATUS_INVALID_ARGUMENT,
                  e.msg);
    }
    KT_STATUS(kiln__cache_get(c, NULL, 1, &got, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    memcpy(en.key, good, 33);
    void *cubin = en.cubin;
    en.cubin = NULL;
    KT_STATUS(kiln__cache_put(c, &en, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_CONTAINS(e.msg, "cubin");
    en.cubin = cubin;
    en.cubin_size = 0;
    KT_STATUS(kiln__cache_put(c, &en, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    en.cubin_size = 16;
    char *spec = en.spec;
    en.spec = (char *)"";
    KT_STATUS(kiln__cache_put(c, &en, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_CONTAINS(e.msg, "spec");
    en.spec = spec;
    char *arch = en.arch;
    en.arch = NULL;
    KT_STATUS(kiln__cache_put(c, &en, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    en.arch = arch;
    KT_STATUS(kiln__cache_put(c, NULL, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_STATUS(kiln__cache_put(NULL, &en, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_EQ_INT(kt_cache_rows(c), 0);
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    KT_EQ_INT(kt_cache_rows(c), 1);
    kiln__entry_free(&en);
    kiln__cache_close(c);
}

KT_TEST(cache_counters)
{
    kiln__cache *c = KT_CACHE_OPEN(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__entry en, got;
    kiln__err e = {{0}};
    kiln__cache_stats s;
    kt_entry(&en, 2, 300);
    KT_STATUS(kiln__cache_get(c, en.key, 1, &got, &e), KILN_STATUS_NOT_FOUND, e.msg);
    KT_CONTAINS(e.msg, en.key);
    KT_CHECK(got.spec == NULL && got.cubin == NULL);
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    for (int i = 0; i < 3; i++) {
        KT_OK(kiln__cache_get(c, en.key, 0, &got, &e), e.msg);
        KT_EQ_INT(got.hits, i + 1); /* the folded hits and this one */
        kiln__entry_free(&got);
        KT_EQ_INT(kiln__cache_fold_hits(c), 1); /* the miss went in with the put */
    }
    KT_EQ_INT(kiln__cache_fold_hits(c), 0);                /* nothing left */
    KT_OK(kiln__cache_get(c, en.key, 0, &got, &e), e.msg); /* a fourth, left in the log */
    kiln__entry_free(&got);
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 4); /* stats folds first */
    KT_EQ_INT(s.misses, 1);
    KT_EQ_INT(s.entries, 1);
    char *h = kt_sql_text(kiln__cache_path(c), "SELECT hits FROM kernels");
    KT_EQ_STR(h, "4");
    free(h);
    kiln__entry_free(&en);
    kiln__cache_close(c);
}

KT_TEST(cache_reopen)
{
    const char *dir = kt_path("c");
    kiln__cache *c = KT_CACHE_OPEN(dir);
    KT_REQUIRE(c);
    kiln__entry en[3], got;
    kiln__err e = {{0}};
    for (int i = 0; i < 3; i++) {
        kt_entry(&en[i], 10 + i, 1000 + (size_t)i);
        KT_OK(kiln__cache_put(c, &en[i], &e), e.msg);
    }
    KT_OK(kiln__cache_get(c, en[0].key, 0, &got, &e), e.msg);
    kiln__entry_free(&got);
    kiln__cache_close(c);
    c = KT_CACHE_OPEN(dir);
    KT_REQUIRE(c);
    KT_EQ_INT(kiln__cache_fold_hits(c), 1); /* the last handle's hit, from its log */
    for (int i = 0; i < 3; i++) {
        KT_OK(kiln__cache_get(c, en[i].key, 1, &got, &e), e.msg);
        KT_CHECK(got.cubin_size == en[i].cubin_size &&
                 memcmp(got.cubin, en[i].cubin, got.cubin_size) == 0);
        KT_EQ_STR(got.source, en[i].source);
        KT_EQ_INT(got.hits, i == 0 ? 2 : 1);
        kiln__entry_free(&got);
        kiln__entry_free(&en[i]);
    }
    kiln__cache_stats s;
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 4);
    KT_EQ_INT(s.entries, 3);
    kiln__cache_close(c);
}

KT_TEST(cache_checksum_mismatch)
{
    kiln__cache *c = KT_CACHE_OPEN(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__entry en, got;
    kiln__err e = {{0}};
    kt_entry(&en, 7, 512);
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    char sql[256];
    /* flip one byte of the stored cubin behind the cache's back */
    snprintf(sql, sizeof sql,
             "UPDATE kernels SET cubin = substr(cubin, 1, 99) || x'5a' || substr(cubin, 101) "
             "WHERE key = '%s'",
             en.key);
    KT_REQUIRE(kt_sql_exec(kiln__cache_path(c), sql));
    memset(&got, 0x5a, sizeof got);
    KT_STATUS(kiln__cache_get(c, en.key, 1, &got, &e), KILN_STATUS_CACHE, e.msg);
    KT_CONTAINS(e.msg, "checksum");
    KT_CONTAINS(e.msg, en.key);
    KT_CONTAINS(e.msg, en.spec);
    KT_CONTAINS(e.msg, "not loaded");
    KT_CHECK(got.cubin == NULL && got.cubin_size == 0 && got.spec == NULL && got.key[0] == 0);
    kiln__cache_stats s;
    KT_OK(kiln__cache_stats_get(c, &s, &e), e.msg);
    KT_EQ_INT(s.hits, 0);
    KT_EQ_INT(s.misses, 1);
    /* a corrupt row is never loaded; putting it again (the caller recompiled) repairs it */
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    KT_OK(kiln__cache_get(c, en.key, 0, &got, &e), e.msg);
    KT_CHECK(got.cubin && memcmp(got.cubin, en.cubin, en.cubin_size) == 0);
    kiln__entry_free(&got);
    /* an emptied blob is corrupt too */
    snprintf(sql, sizeof sql, "UPDATE kernels SET cubin = x'' WHERE key = '%s'", en.key);
    KT_REQUIRE(kt_sql_exec(kiln__cache_path(c), sql));
    KT_STATUS(kiln__cache_get(c, en.key, 0, &got, &e), KILN_STATUS_CACHE, e.msg);
    KT_CONTAINS(e.msg, "checksum");
    kiln__entry_free(&en);
    kiln__cache_close(c);
}

/* ---- prefixes and listing ---------------------------------------------------------------- */

/* Put an entry with an explicit key and last_used. */
static void put_key(kiln__cache *c, const char *key, int64_t last_used)
{
    kiln__entry en;
    kiln__err e = {{0}};
    kt_entry(&en, (int)last_used, 32);
    snprintf(en.key, sizeof en.key, "%s", key);
    en.last_used = last_used;
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__entry_free(&en);
}

#define K_AB1 "ab000000000000000000000000000001"
#define K_AB2 "ab000000000000000000000000000002"
#define K_CD1 "cd000000000000000000000000000001"
#define K_EF1 "ef000000000000000000000000000001"

KT_TEST(cache_resolve)
{
    kiln__cache *c = KT_CACHE_OPEN(kt_tmpdir());
    KT_REQUIRE(c);
    put_key(c, K_AB1, 10);
    put_key(c, K_AB2, 20);
    put_key(c, K_CD1, 30);
    char key[33];
    kiln__err e = {{0}};
    KT_OK(kiln__cache_resolve(c, "c", key, &e), e.msg);
    KT_EQ_STR(key, K_CD1);
    char upper[33];
    for (int i = 0; i < 33; i++) upper[i] = (char)toupper((unsigned char)K_AB2[i]);
    KT_OK(kiln__cache_resolve(c, upper, key, &e), e.msg);
    KT_EQ_STR(key, K_AB2);
    KT_OK(kiln__cache_resolve(c, K_AB1, key, &e), e.msg);
    KT_EQ_STR(key, K_AB1);
    KT_STATUS(kiln__cache_resolve(c, "ab", key, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_CONTAINS(e.msg, "prefix 'ab' is ambiguous: 2 entries match");
    KT_EQ_STR(key, "");
    KT_STATUS(kiln__cache_resolve(c, "ff", key, &e), KILN_STATUS_NOT_FOUND, e.msg);
    KT_CONTAINS(e.msg, "no cache entry matches 'ff'");
    static const char *bad[] = {"", "xyz", "ab%", "ab_", "0123456789abcdef0123456789abcdef0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        KT_STATUS(kiln__cache_resolve(c, bad[i], key, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
        KT_CONTAINS(e.msg, "not a key prefix");
    }
    KT_STATUS(kiln__cache_resolve(c, NULL, key, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    kiln__cache_close(c);
}

KT_TEST(cache_remove_prefix)
{
    kiln__cache *c = KT_CACHE_OPEN(kt_tmpdir());
    KT_REQUIRE(c);
    put_key(c, K_AB1, 10);
    put_key(c, K_AB2, 20);
    put_key(c, K_CD1, 30);
    int n = -1;
    kiln__err e = {{0}};
    KT_STATUS(kiln__cache_remove(c, "a_", &n, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_STATUS(kiln__cache_remove(c, "", &n, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    KT_EQ_INT(n, 0);
    KT_OK(kiln__cache_remove(c, "ff", &n, &e), e.msg);
    KT_EQ_INT(n, 0);
    KT_OK(kiln__cache_remove(c, "AB", &n, &e), e.msg);
    KT_EQ_INT(n, 2);
    KT_EQ_INT(kt_cache_rows(c), 1);
    kiln__entry got;
    KT_STATUS(kiln__cache_get(c, K_AB1, 0, &got, &e), KILN_STATUS_NOT_FOUND, e.msg);
    KT_OK(kiln__cache_get(c, K_CD1, 0, &got, &e), e.msg);
    kiln__entry_free(&got);
    KT_OK(kiln__cache_remove(c, K_CD1, &n, &e), e.msg);
    KT_EQ_INT(n, 1);
    KT_EQ_INT(kt_cache_rows(c), 0);
    kiln__cache_close(c);
}

typedef struct visit_log {
    char keys[8][33];
    size_t sizes[8];
    int n, stop_after;
    kiln__cache *c; /* when set, each visit calls back into the cache */
    int reentrant_ok;
} visit_log;

static int visit(const kiln__entry *en, void *user)
{
    visit_log *v = user;
    if (v->n < 8) {
        memcpy(v->keys[v->n], en->key, 33);
        v->sizes[v->n] = en->cubin_size;
    }
    KT_CHECK(en->cubin == NULL && en->source == NULL && en->log == NULL);
    KT_CHECK(en->spec && en->spec[0] && en->arch && en->arch[0]);
    if (v->c) {
        kiln__entry got;
        kiln__err e = {{0}};
        v->reentrant_ok += kiln__cache_get(v->c, en->key, 0, &got, &e) == KILN_STATUS_OK;
        kiln__entry_free(&got);
    }
    v->n++;
    return v->stop_after && v->n >= v->stop_after;
}

KT_TEST(cache_each_order)
{
    kiln__cache *c = KT_CACHE_OPEN(kt_tmpdir());
    KT_REQUIRE(c);
    put_key(c, K_CD1, 100);
    put_key(c, K_AB2, 300);
    put_key(c, K_EF1, 200);
    put_key(c, K_AB1, 300); /* ties broken by key */
    visit_log v = {0};
    kiln__err e = {{0}};
    KT_OK(kiln__cache_each(c, visit, &v, &e), e.msg);
    KT_EQ_INT(v.n, 4);
    KT_EQ_STR(v.keys[0], K_AB1);
    KT_EQ_STR(v.keys[1], K_AB2);
    KT_EQ_STR(v.keys[2], K_EF1);
    KT_EQ_STR(v.keys[3], K_CD1);
    KT_EQ_INT(v.sizes[0], 32);
    visit_log stop = {0};
    stop.stop_after = 2;
    KT_OK(kiln__cache_each(c, visit, &stop, &e), e.msg);
    KT_EQ_INT(stop.n, 2);
    /* the visitor may use the cache (no lock is held while it runs) */
    visit_log re = {0};
    re.c = c;
    KT_OK(kiln__cache_each(c, visit, &re, &e), e.msg);
    KT_EQ_INT(re.reentrant_ok, 4);
    KT_STATUS(kiln__cache_each(c, NULL, NULL, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
    kiln__cache_close(c);
}

/* ---- injected SQLite failures ---------------------------------------------------------------- */

KT_TEST(cache_fault_put)
{
    kiln__cache *c = KT_CACHE_OPEN(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__entry old, fresh, got;
    kiln__err e = {{0}};
    kt_entry(&old, 1, 4000);
    kt_entry(&fresh, 2, 5000);
    KT_OK(kiln__cache_put(c, &old, &e), e.msg);
    int failures = 0;
    for (int n = 1; n < 50; n++) {
        /* replace the old row with new content, failing the n-th statement */
        kiln__entry changed = fresh;
        memcpy(changed.key, old.key, 33);
        kiln__fault_arm("sqlite", n);
        kiln_status s = kiln__cache_put(c, &changed, &e);
        kiln__fault_arm("sqlite", 0);
        if (s == KILN_STATUS_OK) break;
        failures++;
        KT_EQ_INT(s, KILN_STATUS_CACHE);
        KT_CONTAINS(e.msg, "injected");
        KT_CONTAINS(e.msg, old.key);
        /* the prior row is intact and the handle still works */
        KT_OK(kiln__cache_get(c, old.key, 1, &got, &e), e.msg);
        KT_CHECK(got.cubin_size == old.cubin_size &&
                 memcmp(got.cubin, old.cubin, old.cubin_size) == 0);
        kiln__entry_free(&got);
        KT_EQ_INT(kt_cache_rows(c), 1);
        KT_INTEGRITY(kiln__cache_path(c));
    }
    KT_CHECK(failures >= 3); /* begin, insert, commit */
    KT_OK(kiln__cache_get(c, old.key, 0, &got, &e), e.msg);
    KT_CHECK(got.cubin_size == fresh.cubin_size &&
             memcmp(got.cubin, fresh.cubin, fresh.cubin_size) == 0);
    kiln__entry_free(&got);
    KT_OK(kiln__cache_put(c, &fresh, &e), e.msg);
    KT_EQ_INT(kt_cache_rows(c), 2);
    KT_INTEGRITY(kiln__cache_path(c));
    kiln__entry_free(&old);
    kiln__entry_free(&fresh);
    kiln__cache_close(c);
}

KT_TEST(cache_fault_get)
{
    kiln__cache *c = KT_CACHE_OPEN(kt_tmpdir());
    KT_REQUIRE(c);
    kiln__entry en, got;
    kiln__err e = {{0}};
    kt_entry(&en, 4, 100);
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    int failed = 0, ok = 0;
    for (int n = 1; n <= 10; n++) { /* select, then begin / update / stats / commit of the hit */
        kiln__fault_arm("sqlite", n);
        kiln_status s = kiln__cache_get(c, en.key, 1, &got, &e);
        kiln__fault_arm("sqlite", 0);
        if (s == KILN_STATUS_OK) {
            ok++;
            KT_CHECK(got.cubin_size == en.cubin_size &&
                     memcmp(got.cubin, en.cubin, en.cubin_size) == 0);
        } else {
            failed++;
            KT_EQ_INT(s, KILN_STATUS_CACHE);
            KT_CONTAINS(e.msg, "injected");
            KT_CHECK(got.cubin == NULL);
        }
        kiln__entry_free(&got);
    }
    KT_EQ_INT(failed, 1); /* only the SELECT fails the read; the hit counter is best effort */
    KT_CHECK(ok >= 4);
    KT_INTEGRITY(kiln__cache_path(c));
    kiln__entry_free(&en);
    kiln__cache_close(c);
}

/* ---- concurrency ----------------------------------------------------------------------------- */

#define THREADS    4
#define PER_THREAD 60

typedef struct worker {
    kiln__cache *c;
    int id;
    int errors;
    char msg[1024];
} worker;

/* Put PER_THREAD entries of its own, reading each back, and read the other workers' too. */
static void *work(void *arg)
{
    worker *w = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        kiln__entry en, got;
        kiln__err e = {{0}};
        kt_entry(&en, w->id * 1000 + i, 200 + (size_t)i);
        kiln_status s = kiln__cache_put(w->c, &en, &e);
        if (!s) s = kiln__cache_get(w->c, en.key, 1, &got, &e);
        if (!s && (got.cubin_size != en.cubin_size || memcmp(got.cubin, en.cubin, en.cubin_size)))
            s = KILN_STATUS_MISMATCH;
        kiln__entry_free(&got);
        kiln__entry_free(&en);
        /* another worker's entry: present or not yet, never an error */
        kt_entry(&en, ((w->id + 1) % THREADS) * 1000 + i, 1);
        kiln_status s2 = kiln__cache_get(w->c, en.key, 0, &got, &e);
        if (!s && s2 != KILN_STATUS_OK && s2 != KILN_STATUS_NOT_FOUND) s = s2;
        kiln__entry_free(&got);
        kiln__entry_free(&en);
        if (s) {
            if (!w->errors++)
                snprintf(w->msg, sizeof w->msg, "%s: %.900s", kiln_status_str(s), e.msg);
        }
    }
    return NULL;
}

static void run_workers(kiln__cache **handles, int nhandles)
{
    pthread_t t[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){.c = handles[i % nhandles], .id = i};
        KT_REQUIRE(pthread_create(&t[i], NULL, work, &w[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        KT_EQ_INT(w[i].errors, 0);
        if (w[i].errors) printf("    worker %d: %s\n", i, w[i].msg);
    }
}

KT_TEST(cache_threads_one_handle)
{
    kiln__cache *c = KT_CACHE_OPEN(kt_tmpdir());
    KT_REQUIRE(c);
    run_workers(&c, 1);
    KT_EQ_INT(kt_cache_rows(c), THREADS * PER_THREAD);
    kiln__cache_close(c);
    KT_INTEGRITY(kt_path("kernels.db"));
}

KT_TEST(cache_threads_two_handles)
{
    kiln__cache *h[2] = {KT_CACHE_OPEN(kt_tmpdir()), KT_CACHE_OPEN(kt_tmpdir())};
    KT_REQUIRE(h[0] && h[1]);
    run_workers(h, 2);
    KT_EQ_INT(kt_cache_rows(h[0]), THREADS * PER_THREAD);
    KT_EQ_INT(kt_cache_rows(h[1]), THREADS * PER_THREAD);
    kiln__cache_close(h[0]);
    kiln__cache_close(h[1]);
    KT_INTEGRITY(kt_path("kernels.db"));
}

KT_TEST(cache_processes_fresh_file)
{
    /* several processes open the same fresh cache at the same moment; all must succeed */
    enum { PROCS = 6 };
    const char *dir = kt_path("c");
    int gate[2];
    KT_REQUIRE(pipe(gate) == 0);
    fflush(stdout);
    pid_t pids[PROCS];
    for (int i = 0; i < PROCS; i++) {
        pids[i] = fork();
        KT_REQUIRE(pids[i] >= 0);
        if (pids[i] == 0) {
            close(gate[1]);
            char b;
            while (read(gate[0], &b, 1) > 0) {
            }
            kiln__cache *c = NULL;
            kiln__err e = {{0}};
            kiln__entry en;
            kt_entry(&en, 500 + i, 100);
            kiln_status s = kiln__cache_open(dir, &c, &e);
            if (!s) s = kiln__cache_put(c, &en, &e);
            if (s) printf("    process %d: %s: %s\n", i, kiln_status_str(s), e.msg);
            kiln__entry_free(&en);
            kiln__cache_close(c);
            fflush(stdout);
            _exit(s ? 1 : 0);
        }
    }
    close(gate[0]);
    close(gate[1]); /* opens the gate for every child at once */
    for (int i = 0; i < PROCS; i++) {
        int status = 0;
        KT_CHECK(waitpid(pids[i], &status, 0) == pids[i]);
        KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    kiln__cache *c = KT_CACHE_OPEN(dir);
    KT_REQUIRE(c);
    KT_EQ_INT(kt_cache_rows(c), PROCS);
    kiln__cache_close(c);
    KT_INTEGRITY(kt_join(dir, "kernels.db"));
}
