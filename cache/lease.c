/*
 * lease.c — compile leases: single flight across processes. Before compiling a key that is
 * not in the cache, a process takes the key's lease: a row of the `leases` table naming the
 * holder (host, pid, a per-handle nonce) and when it expires. Others see the live lease and
 * wait for the kernel row instead of compiling it too. A lease stops blocking when it expires
 * or when its holder is a dead process of this host, so a builder killed with SIGKILL never
 * wedges the others. Within one process the open handles are known, so a lease left behind
 * by a handle of this process (a release that failed on a full disk) blocks nobody here either.
 * A handle refreshes the leases it holds from a keeper thread, so a long compile keeps its
 * lease. The waiting loop itself belongs to the caller (runtime/kernel.c).
 */
#include "store.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Shortest lease lifetime $KILN_LEASE_SECONDS may set (the keeper wakes every quarter). */
#define LEASE_MIN_SECONDS 4
/* A failed release is tried again this many times, this far apart. */
#define RELEASE_TRIES    3
#define RELEASE_RETRY_MS 50

/* The open handles of this process, to tell a live lease of ours from one left behind. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static kiln__cache *registry;

/* ---- holder identity ------------------------------------------------------------------------ */

void kiln__lease_init(kiln__cache *c)
{
    if (gethostname(c->host, sizeof c->host) != 0 || !c->host[0])
        snprintf(c->host, sizeof c->host, "localhost");
    c->host[sizeof c->host - 1] = 0;
    /* The nonce tells two handles of one process apart (and a recycled pid from its
     * predecessor): the monotonic clock and the handle's address. */
    uint64_t nonce = kiln__now_ns() ^ ((uint64_t)(uintptr_t)c << 16);
    snprintf(c->holder, sizeof c->holder, "%s/%ld/%016llx", c->host, (long)getpid(),
             (unsigned long long)nonce);
    c->lease_ttl = KILN__LEASE_SECONDS;
    const char *env = getenv("KILN_LEASE_SECONDS");
    if (env && *env) {
        long v = strtol(env, NULL, 10);
        if (v >= LEASE_MIN_SECONDS && v <= 86400) c->lease_ttl = (int)v;
    }
    pthread_mutex_init(&c->keeper.lock, NULL);
    pthread_cond_init(&c->keeper.wake, NULL);
    pthread_mutex_lock(&registry_lock);
    c->next_open = registry;
    registry = c;
    pthread_mutex_unlock(&registry_lock);
}

/* 1 when an open handle of this process named holder holds key's lease. */
static int held_here(const char *holder, const char *key)
{
    int held = 0;
    pthread_mutex_lock(&registry_lock);
    for (kiln__cache *h = registry; h && !held; h = h->next_open) {
        if (strcmp(h->holder, holder) != 0) continue;
        pthread_mutex_lock(&h->keeper.lock);
        for (int i = 0; i < h->keeper.n && !held; i++) held = !strcmp(h->keeper.keys[i], key);
        pthread_mutex_unlock(&h->keeper.lock);
    }
    pthread_mutex_unlock(&registry_lock);
    return held;
}

/* 1 when process pid of this host may still run (kill(pid, 0) does not say ESRCH). */
static int pid_alive(int64_t pid)
{
    if (pid <= 0 || pid > INT32_MAX) return 0;
    return kill((pid_t)pid, 0) == 0 || errno != ESRCH;
}

/* 1 when the lease l on key still blocks others at time now (see the file comment). */
static int lease_live(const kiln__cache *c, const char *key, const kiln__lease *l, int64_t now)
{
    if (!strcmp(l->holder, c->holder)) return 0; /* our own: take it again */
    if (l->expires <= now) return 0;
    if (strcmp(l->host, c->host) != 0) return 1;
    if (l->pid == (int64_t)getpid()) return held_here(l->holder, key);
    return pid_alive(l->pid);
}

/* ---- the keeper thread ---------------------------------------------------------------------- */

/* Push the expiry of this handle's lease on key to now + ttl (best effort). */
static void refresh(kiln__cache *c, const char *key)
{
    pthread_mutex_lock(&c->lock);
    sqlite3_stmt *st = NULL;
    if (kiln__cache_prepare(c, "UPDATE leases SET expires = ?3 WHERE key = ?1 AND holder = ?2",
                            &st) == SQLITE_OK &&
        sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC) == SQLITE_OK &&
        sqlite3_bind_text(st, 2, c->holder, -1, SQLITE_STATIC) == SQLITE_OK &&
        sqlite3_bind_int64(st, 3, (int64_t)time(NULL) + c->lease_ttl) == SQLITE_OK)
        sqlite3_step(st); /* not kiln__cache_step: fault injection targets the caller's thread */
    sqlite3_finalize(st);
    pthread_mutex_unlock(&c->lock);
}

static void *keeper_main(void *arg)
{
    kiln__cache *c = arg;
    kiln__lease_keeper *k = &c->keeper;
    pthread_mutex_lock(&k->lock);
    while (!k->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += c->lease_ttl / 4;
        while (!k->stop && pthread_cond_timedwait(&k->wake, &k->lock, &until) != ETIMEDOUT) {
        }
        if (k->stop) break;
        /* refresh one key at a time, without the keeper lock across SQLite */
        for (int i = 0; i < k->n && !k->stop; i++) {
            char key[33];
            memcpy(key, k->keys[i], sizeof key);
            pthread_mutex_unlock(&k->lock);
            refresh(c, key);
            pthread_mutex_lock(&k->lock);
        }
    }
    pthread_mutex_unlock(&k->lock);
    return NULL;
}

/* Remember key as held (starting the keeper on first use). 0 when out of memory: the lease
 * then simply is not refreshed. */
static int hold(kiln__cache *c, const char *key)
{
    kiln__lease_keeper *k = &c->keeper;
    pthread_mutex_lock(&k->lock);
    int ok = 1;
    if (k->n == k->cap) {
        int cap = k->cap ? 2 * k->cap : 8;
        char(*keys)[33] = realloc(k->keys, (size_t)cap * sizeof *keys);
        if (keys) {
            k->keys = keys;
            k->cap = cap;
        }
        ok = keys != NULL;
    }
    if (ok) memcpy(k->keys[k->n++], key, 33);
    if (ok && !k->running && pthread_create(&k->thread, NULL, keeper_main, c) == 0) k->running = 1;
    pthread_mutex_unlock(&k->lock);
    return ok;
}

static void unhold(kiln__cache *c, const char *key)
{
    kiln__lease_keeper *k = &c->keeper;
    pthread_mutex_lock(&k->lock);
    for (int i = 0; i < k->n; i++) {
        if (strcmp(k->keys[i], key) != 0) continue;
        memmove(k->keys[i], k->keys[i + 1], (size_t)(k->n - i - 1) * sizeof k->keys[0]);
        k->n--;
        break;
    }
    pthread_mutex_unlock(&k->lock);
}

void kiln__lease_fini(kiln__cache *c)
{
    pthread_mutex_lock(&registry_lock);
    for (kiln__cache **pp = &registry; *pp; pp = &(*pp)->next_open) {
        if (*pp != c) continue;
        *pp = c->next_open;
        break;
    }
    pthread_mutex_unlock(&registry_lock);
    kiln__lease_keeper *k = &c->keeper;
    pthread_mutex_lock(&k->lock);
    int running = k->running;
    k->stop = 1;
    pthread_cond_broadcast(&k->wake);
    pthread_mutex_unlock(&k->lock);
    if (running) pthread_join(k->thread, NULL);
    free(k->keys);
    k->keys = NULL;
    k->n = k->cap = k->running = 0;
    pthread_cond_destroy(&k->wake);
    pthread_mutex_destroy(&k->lock);
}

/* ---- take, release, sweep ------------------------------------------------------------------- */

/* Read whether key has a row (*present) and its lease (*l; holder "" when none). */
static int read_state(kiln__cache *c, const char *key, int *present, kiln__lease *l)
{
    sqlite3_stmt *st = NULL;
    int rc = kiln__cache_prepare(c,
                                 "SELECT (SELECT count(*) FROM kernels WHERE key = ?1),"
                                 " l.holder, l.pid, l.host, l.expires"
                                 " FROM (SELECT 1) LEFT JOIN leases AS l ON l.key = ?1",
                                 &st);
    if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
    if (rc == SQLITE_ROW) {
        const unsigned char *h = sqlite3_column_text(st, 1), *host = sqlite3_column_text(st, 3);
        *present = sqlite3_column_int(st, 0) > 0;
        snprintf(l->holder, sizeof l->holder, "%s", h ? (const char *)h : "");
        snprintf(l->host, sizeof l->host, "%s", host ? (const char *)host : "");
        l->pid = sqlite3_column_int64(st, 2);
        l->expires = sqlite3_column_int64(st, 4);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc;
}

/* Decide from what read_state found; 1 when the lease may be taken. */
static int decide(kiln__cache *c, const char *key, int present, int replace, kiln__lease *l,
                  int64_t now)
{
    if (present && !replace) {
        l->state = KILN__LEASE_PRESENT;
        return 0;
    }
    if (l->holder[0] && lease_live(c, key, l, now)) {
        l->state = KILN__LEASE_HELD;
        return 0;
    }
    return 1;
}

static kiln_status take_locked(kiln__cache *c, const char *key, int replace, kiln__lease *out,
                               kiln__err *e)
{
    int present = 0;
    int64_t now = (int64_t)time(NULL);
    /* A read first: waiters poll without taking the write lock. */
    if (read_state(c, key, &present, out) != SQLITE_OK)
        return kiln__cache_fail(c, e, "reading the compile lease of %s", key);
    if (!decide(c, key, present, replace, out, now)) return KILN_STATUS_OK;
    if (kiln__cache_exec(c, "BEGIN IMMEDIATE") != SQLITE_OK)
        return kiln__cache_fail(c, e, "taking the compile lease of %s: begin", key);
    if (read_state(c, key, &present, out) != SQLITE_OK)
        return kiln__cache_fail(c, e, "taking the compile lease of %s", key);
    now = (int64_t)time(NULL);
    if (!decide(c, key, present, replace, out, now)) {
        kiln__cache_rollback(c);
        return KILN_STATUS_OK;
    }
    sqlite3_stmt *st = NULL;
    int rc = kiln__cache_prepare(c,
                                 "INSERT OR REPLACE INTO leases(key, holder, pid, host, expires)"
                                 " VALUES (?1, ?2, ?3, ?4, ?5)",
                                 &st);
    if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, 2, c->holder, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 3, (int64_t)getpid());
    if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, 4, c->host, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(st, 5, now + c->lease_ttl);
    if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
    if (rc != SQLITE_DONE) {
        kiln_status s = kiln__cache_fail(c, e, "taking the compile lease of %s", key);
        sqlite3_finalize(st);
        return s;
    }
    sqlite3_finalize(st);
    if (kiln__cache_exec(c, "COMMIT") != SQLITE_OK)
        return kiln__cache_fail(c, e, "taking the compile lease of %s: commit", key);
    out->state = KILN__LEASE_TAKEN;
    snprintf(out->holder, sizeof out->holder, "%s", c->holder);
    snprintf(out->host, sizeof out->host, "%s", c->host);
    out->pid = (int64_t)getpid();
    out->expires = now + c->lease_ttl;
    return KILN_STATUS_OK;
}

kiln_status kiln__cache_lease_take(kiln__cache *c, const char *key, int replace, kiln__lease *out,
                                   kiln__err *e)
{
    if (!c || !key || !out)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache: lease needs a cache and a key");
    memset(out, 0, sizeof *out);
    if (c->readonly)
        return kiln__fail(e, KILN_STATUS_IO,
                          "cache %s: cannot take the compile lease of %s: the cache is read-only "
                          "(%s)",
                          c->path, key, c->ro_why);
    pthread_mutex_lock(&c->lock);
    kiln_status s = take_locked(c, key, replace, out, e);
    pthread_mutex_unlock(&c->lock);
    if (!s && out->state == KILN__LEASE_TAKEN) hold(c, key);
    return s;
}

/* Delete this handle's lease row on key; 1 when done. */
static int release_once(kiln__cache *c, const char *key)
{
    pthread_mutex_lock(&c->lock);
    sqlite3_stmt *st = NULL;
    int rc = kiln__cache_prepare(c, "DELETE FROM leases WHERE key = ?1 AND holder = ?2", &st);
    if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, 2, c->holder, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
    sqlite3_finalize(st);
    pthread_mutex_unlock(&c->lock);
    return rc == SQLITE_DONE;
}

void kiln__cache_lease_release(kiln__cache *c, const char *key)
{
    if (!c || !key || c->readonly) return;
    /* Forgotten first: from now on this process treats the row as left behind. A row that
     * cannot be deleted (a full disk) blocks other processes until it expires. */
    unhold(c, key);
    for (int i = 0; i < RELEASE_TRIES && !release_once(c, key); i++) {
        struct timespec ts = {0, RELEASE_RETRY_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Collect the keys of leases that no longer block into *dead (malloc'd) and count the live. */
static int collect_dead(kiln__cache *c, char (**dead)[33], int *ndead, int *live)
{
    sqlite3_stmt *st = NULL;
    int64_t now = (int64_t)time(NULL);
    int cap = 0,
        rc = kiln__cache_prepare(c, "SELECT key, holder, pid, host, expires FROM leases", &st);
    while (rc == SQLITE_OK && (rc = kiln__cache_step(c, st)) == SQLITE_ROW) {
        rc = SQLITE_OK;
        kiln__lease l = {0};
        const unsigned char *k = sqlite3_column_text(st, 0), *h = sqlite3_column_text(st, 1);
        const unsigned char *host = sqlite3_column_text(st, 3);
        snprintf(l.holder, sizeof l.holder, "%s", h ? (const char *)h : "");
        snprintf(l.host, sizeof l.host, "%s", host ? (const char *)host : "");
        l.pid = sqlite3_column_int64(st, 2);
        l.expires = sqlite3_column_int64(st, 4);
        /* our own leases are live while we hold them */
        if (!strcmp(l.holder, c->holder) || lease_live(c, (const char *)k, &l, now)) {
            ++*live;
            continue;
        }
        if (*ndead == cap) {
            cap = cap ? 2 * cap : 16;
            char(*v)[33] = realloc(*dead, (size_t)cap * sizeof *v);
            if (!v) {
                rc = SQLITE_NOMEM;
                break;
            }
            *dead = v;
        }
        snprintf((*dead)[(*ndead)++], 33, "%s", k ? (const char *)k : "");
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static kiln_status sweep_locked(kiln__cache *c, int *removed, int *live, kiln__err *e)
{
    char(*dead)[33] = NULL;
    int ndead = 0;
    if (kiln__cache_exec(c, "BEGIN IMMEDIATE") != SQLITE_OK)
        return kiln__cache_fail(c, e, "sweeping leases: begin");
    int rc = collect_dead(c, &dead, &ndead, live);
    for (int i = 0; rc == SQLITE_OK && i < ndead; i++) {
        sqlite3_stmt *st = NULL;
        rc = kiln__cache_prepare(c, "DELETE FROM leases WHERE key = ?1", &st);
        if (rc == SQLITE_OK) rc = sqlite3_bind_text(st, 1, dead[i], -1, SQLITE_STATIC);
        if (rc == SQLITE_OK) rc = kiln__cache_step(c, st);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
        sqlite3_finalize(st);
    }
    free(dead);
    if (rc != SQLITE_OK) return kiln__cache_fail(c, e, "sweeping leases");
    if (kiln__cache_exec(c, "COMMIT") != SQLITE_OK)
        return kiln__cache_fail(c, e, "sweeping leases: commit");
    *removed = ndead;
    return KILN_STATUS_OK;
}

kiln_status kiln__cache_lease_sweep(kiln__cache *c, int *removed, int *live, kiln__err *e)
{
    int r = 0, l = 0;
    if (removed) *removed = 0;
    if (live) *live = 0;
    if (!c) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "cache: sweep needs a cache");
    if (c->readonly)
        return kiln__fail(e, KILN_STATUS_IO, "cache %s: cannot sweep leases: read-only (%s)",
                          c->path, c->ro_why);
    pthread_mutex_lock(&c->lock);
    kiln_status s = sweep_locked(c, &r, &l, e);
    pthread_mutex_unlock(&c->lock);
    if (removed) *removed = r;
    if (live) *live = l;
    return s;
}
