/*
 * cli_warm.c — `kiln warm`: read a manifest (cli_manifest.c: specs, {a,b} alternatives,
 * per-line arch=) and check every line before compiling anything, keep this host's shard of
 * the (spec, arch) list, then compile it into the cache with N worker threads that share one
 * context (the library compiles different keys in parallel, and leases keep other processes
 * from compiling the same key) and take work items from a shared index under a mutex. N
 * defaults to the number of cores, bounded by the memory an NVRTC compile needs. Progress goes
 * to stderr (a live line on a terminal, a line per 10 % otherwise), failures are listed at the
 * end, and the last line on stdout is the summary.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "jit.h"

/* Most worker threads. */
#define WARM_JOBS_MAX 1024
/* Host memory one NVRTC compile job is assumed to need at its peak (measured: docs/fleet.md). */
#define WARM_JOB_MB 400
/* Lines of a failure's message listed at the end. */
#define WARM_FAIL_LINES 4

typedef enum item_state { ITEM_PENDING, ITEM_COMPILED, ITEM_CACHED, ITEM_FAILED } item_state;

/* One work item: a spec for an arch. */
typedef struct item {
    int spec, arch;     /* indexes into the manifest's specs and archs */
    item_state state;   /* written by the worker that ran it */
    char key[33];       /* "" when unknown */
    size_t cubin_bytes; /* compiled or cached: the cubin's size */
    char *msg;          /* failure: the first lines of the message (malloc'd) */
} item;

/* State shared by the workers; the counters and next are guarded by lock. */
typedef struct warm {
    kiln_ctx *ctx;
    const cli_manifest *m;
    item *items;
    int nitems;
    pthread_mutex_t lock;
    int next, done, compiled, cached, failed;
    double t0_ms;
    int tty;                     /* stderr is a terminal: one live progress line */
    int last_decile;             /* otherwise: the last 10 % step printed */
    int json;                    /* --json: the summary as a JSON object */
    long shard_idx, shard_count; /* --shard I/N (0/1 without it) */
} warm;

/* ---- workers -------------------------------------------------------------------------------- */

/* A malloc'd copy of the first `lines` lines of s. */
static char *first_lines(const char *s, int lines)
{
    size_t n = 0;
    for (int i = 0; i < lines && s[n]; i++) {
        n += strcspn(s + n, "\n");
        if (s[n] == '\n' && i + 1 < lines && s[n + 1]) n++;
    }
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static void run_item(warm *w, item *it)
{
    const cli_mspec *s = &w->m->specs[it->spec];
    const char *arch = w->m->archs.a[it->arch];
    kiln_kernel *k = NULL;
    kiln_kernel_info ki;
    if (kiln_kernel_compile(w->ctx, &s->v, arch, &k) == KILN_STATUS_OK &&
        kiln_kernel_describe(k, &ki) == KILN_STATUS_OK) {
        memcpy(it->key, ki.key, sizeof it->key);
        kiln_kernel_cubin(k, &it->cubin_bytes);
        it->state = ki.from_cache ? ITEM_CACHED : ITEM_COMPILED;
        return;
    }
    /* The thread's own message: the context's may already be another worker's. */
    const char *msg = kiln_errmsg();
    it->msg = first_lines(*msg ? msg : kiln_ctx_errmsg(w->ctx), WARM_FAIL_LINES);
    it->state = ITEM_FAILED;
    cli_key(&s->v, arch, it->key); /* the key it would have had, when it can be made */
}

/* Print progress: done/total, failures, rate and ETA; called with w->lock held. */
static void progress(warm *w, int final)
{
    double secs = (cli_now_ms() - w->t0_ms) / 1e3;
    double rate = secs > 0 ? w->done / secs : 0;
    double eta = rate > 0 ? (w->nitems - w->done) / rate : 0;
    if (w->tty) {
        fprintf(stderr, "\r[%d/%d] %d failed, %.1f/s (%.0f/min), ETA %.0fs   ", w->done, w->nitems,
                w->failed, rate, rate * 60, eta);
        if (final) fputc('\n', stderr);
        fflush(stderr);
        return;
    }
    int decile = w->nitems ? w->done * 10 / w->nitems : 10;
    if (decile <= w->last_decile || final) return;
    w->last_decile = decile;
    fprintf(stderr, "[%d/%d] %d failed, %.1f/s (%.0f/min), ETA %.0fs\n", w->done, w->nitems,
            w->failed, rate, rate * 60, eta);
}

static void *worker(void *arg)
{
    warm *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->lock);
        int i = w->next < w->nitems ? w->next++ : -1;
        pthread_mutex_unlock(&w->lock);
        if (i < 0) return NULL;
        item *it = &w->items[i];
        run_item(w, it);
        pthread_mutex_lock(&w->lock);
        w->done++;
        w->compiled += it->state == ITEM_COMPILED;
        w->cached += it->state == ITEM_CACHED;
        w->failed += it->state == ITEM_FAILED;
        progress(w, 0);
        pthread_mutex_unlock(&w->lock);
    }
}

/* Run every item on `jobs` threads (this one included). */
static void run_all(warm *w, int jobs)
{
    pthread_t tid[WARM_JOBS_MAX];
    int started = 0;
    for (int j = 1; j < jobs; j++, started++)
        if (pthread_create(&tid[started], NULL, worker, w) != 0) break;
    worker(w);
    for (int j = 0; j < started; j++) pthread_join(tid[j], NULL);
    pthread_mutex_lock(&w->lock);
    progress(w, 1);
    pthread_mutex_unlock(&w->lock);
}

/* ---- command -------------------------------------------------------------------------------- */

/* Parse --shard "I/N" (0 <= I < N). */
static int parse_shard(const char *s, long *idx, long *count)
{
    char *end = NULL;
    *idx = 0;
    *count = 1;
    if (!s) return 0;
    long i = strtol(s, &end, 10), n = 0;
    if (end != s && *end == '/') {
        const char *q = end + 1;
        n = strtol(q, &end, 10);
        if (end == q) n = 0;
    }
    if (end == s || *end || n < 1 || i < 0 || i >= n || s[0] == '-')
        return cli_fail("warm", CLI_USAGE, "--shard '%s': expected I/N with 0 <= I < N", s);
    *idx = i;
    *count = n;
    return 0;
}

/* Build the work list: the manifest's pairs, keeping shard idx of count. */
static int make_items(warm *w, long idx, long count)
{
    long total = w->m->npairs;
    w->items = calloc(total ? (size_t)total : 1, sizeof *w->items);
    if (!w->items) return cli_fail("warm", CLI_FAIL, "out of memory for %ld work items", total);
    for (long i = 0; i < total; i++) {
        if (i % count != idx) continue;
        item *it = &w->items[w->nitems++];
        it->spec = w->m->pairs[i].spec;
        it->arch = w->m->pairs[i].arch;
    }
    return 0;
}

/* List the failures on stderr: key, arch, spec, then the first lines of the message. */
static void report_failures(const warm *w)
{
    for (int i = 0; i < w->nitems; i++) {
        const item *it = &w->items[i];
        if (it->state != ITEM_FAILED) continue;
        fprintf(stderr, "kiln warm: failed %s %s %s:\n", it->key[0] ? it->key : "-",
                w->m->archs.a[it->arch], w->m->specs[it->spec].spec);
        const char *p = it->msg ? it->msg : "(no message)";
        while (*p) {
            size_t n = strcspn(p, "\n");
            fprintf(stderr, "    %.*s\n", (int)n, p);
            p += n + (p[n] == '\n');
        }
    }
}

/* MemAvailable from /proc/meminfo in MB; -1 when unknown. */
static long mem_available_mb(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb / 1024;
}

/* The number of jobs: --jobs when given (a note when memory looks short), else the cores,
 * bounded by MemAvailable / WARM_JOB_MB (said on stderr when it bounds). */
static long pick_jobs(const char *jobs_s, long *jobs)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN), mem = mem_available_mb();
    long by_mem = mem < 0 ? WARM_JOBS_MAX : mem / WARM_JOB_MB;
    if (by_mem < 1) by_mem = 1;
    if (cores < 1) cores = 1;
    if (jobs_s) {
        int rc = cli_long("warm", "--jobs", jobs_s, 1, WARM_JOBS_MAX, jobs);
        if (!rc && *jobs > by_mem)
            fprintf(stderr,
                    "kiln warm: note: %ld jobs may need ~%ld MB; %ld MB is available "
                    "(~%d MB per compile)\n",
                    *jobs, *jobs * WARM_JOB_MB, mem, WARM_JOB_MB);
        return rc;
    }
    *jobs = cores < WARM_JOBS_MAX ? cores : WARM_JOBS_MAX;
    if (*jobs > by_mem) {
        fprintf(stderr,
                "kiln warm: %ld jobs, not %ld: memory bounds them (%ld MB available, ~%d MB per "
                "compile)\n",
                by_mem, *jobs, mem, WARM_JOB_MB);
        *jobs = by_mem;
    }
    return 0;
}

/* The size bound the context enforced (--max-size, else $KILN_CACHE_MAX_BYTES), in bytes; 0
 * when there is none. */
static int64_t size_bound(const cli_global *g)
{
    if (g->max_size_set) return g->max_size > 0 ? g->max_size : 1; /* as cli_ctx_open */
    const char *env = getenv("KILN_CACHE_MAX_BYTES");
    int64_t v = 0;
    kiln__err e = {{0}};
    if (env && *env && kiln__cache_parse_size(env, &v, &e) == KILN_STATUS_OK && v > 0) return v;
    return 0;
}

/* A compile whose store failed (a full or read-only cache) still returns its kernel; for warm
 * it is a failure: the point is the cache. Mark compiled items missing from the cache, saying
 * why: a store failure was reported on stderr by the library, while a row evicted by the size
 * bound (the context evicts after each store) leaves no message, so it is named here. */
static void check_stored(const cli_global *g, warm *w)
{
    kiln__cache *c = NULL;
    if (!w->compiled || cli_cache_open(g, "warm", &c)) return;
    int64_t bound = size_bound(g);
    kiln__cache_stats st = {0};
    kiln__err se = {{0}};
    if (bound) kiln__cache_stats_get(c, &st, &se);
    for (int i = 0; i < w->nitems; i++) {
        item *it = &w->items[i];
        char sum[33];
        kiln__err e = {{0}};
        if (it->state != ITEM_COMPILED ||
            kiln__cache_checksum(c, it->key, sum, &e) == KILN_STATUS_OK)
            continue;
        it->state = ITEM_FAILED;
        char why[512];
        if (bound && st.bytes + (int64_t)it->cubin_bytes > bound)
            snprintf(why, sizeof why,
                     "compiled and stored, then evicted by the size bound: the cache keeps at "
                     "most %lld bytes of cubins (%s) and holds %lld; this entry is %zu bytes "
                     "(raise the bound, or warm fewer kernels into this cache)",
                     (long long)bound, g->max_size_set ? "--max-size" : "KILN_CACHE_MAX_BYTES",
                     (long long)st.bytes, it->cubin_bytes);
        else snprintf(why, sizeof why, "compiled but not stored (see the message above)");
        it->msg = first_lines(why, 1);
        w->compiled--;
        w->failed++;
    }
    kiln__cache_close(c);
}

/* The summary and the failures as one JSON object (--json); returns the exit status. */
static int warm_json(const warm *w, double secs)
{
    kiln__str s = {0};
    kiln__str_printf(&s,
                     "{\"kernels\": %d, \"compiled\": %d, \"cached\": %d, \"failed\": %d, "
                     "\"seconds\": %.3f, \"kernels_per_min\": %.1f, \"shard\": [%ld, %ld], "
                     "\"cache\": ",
                     w->nitems, w->compiled, w->cached, w->failed, secs,
                     secs > 0 ? w->nitems * 60 / secs : 0, w->shard_idx, w->shard_count);
    cli_json_str(&s, kiln_ctx_cache_path(w->ctx));
    kiln__str_puts(&s, ", \"failures\": [");
    for (int i = 0, n = 0; i < w->nitems; i++) {
        const item *it = &w->items[i];
        if (it->state != ITEM_FAILED) continue;
        kiln__str_puts(&s, n++ ? ", {\"key\": " : "{\"key\": ");
        if (it->key[0]) cli_json_str(&s, it->key);
        else kiln__str_puts(&s, "null");
        kiln__str_puts(&s, ", \"arch\": ");
        cli_json_str(&s, w->m->archs.a[it->arch]);
        kiln__str_puts(&s, ", \"spec\": ");
        cli_json_str(&s, w->m->specs[it->spec].spec);
        kiln__str_puts(&s, ", \"message\": ");
        cli_json_str(&s, it->msg ? it->msg : "");
        kiln__str_puts(&s, "}");
    }
    kiln__str_puts(&s, "]}\n");
    int rc = cli_json_print("warm", &s);
    return rc ? rc : w->failed ? CLI_FAIL : CLI_OK;
}

/* Compile everything and print the summary; returns the exit status. */
static int warm_run(const cli_global *g, warm *w, long jobs)
{
    if (jobs > w->nitems) jobs = w->nitems > 0 ? w->nitems : 1;
    fprintf(stderr, "kiln warm: %d specs, %d kernels, %ld jobs, cache %s\n", w->m->nspecs,
            w->nitems, jobs, kiln_ctx_cache_path(w->ctx));
    w->tty = isatty(STDERR_FILENO);
    w->t0_ms = cli_now_ms();
    pthread_mutex_init(&w->lock, NULL);
    if (w->nitems) run_all(w, (int)jobs);
    pthread_mutex_destroy(&w->lock);
    check_stored(g, w);
    report_failures(w);
    double secs = (cli_now_ms() - w->t0_ms) / 1e3;
    if (w->json) return warm_json(w, secs);
    printf("%d kernels: %d compiled, %d cached, %d failed in %.1f s (%.1f kernels/min)\n",
           w->nitems, w->compiled, w->cached, w->failed, secs,
           secs > 0 ? w->nitems * 60 / secs : 0);
    return w->failed ? CLI_FAIL : CLI_OK;
}

int cli_cmd_warm(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    const char *arch = NULL, *jobs_s = NULL, *shard = NULL;
    int npos = 0, json = 0;
    const cli_opt opts[] = {{"--arch", &arch, NULL},
                            {"--jobs", &jobs_s, NULL},
                            {"--shard", &shard, NULL},
                            {"--json", NULL, &json},
                            {NULL, NULL, NULL}};
    int rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    if (npos != 1)
        return cli_fail(cmd->name, CLI_USAGE, "%s",
                        npos ? "give exactly one MANIFEST" : "missing MANIFEST");
    long jobs = 1, idx = 0, count = 1;
    if ((rc = pick_jobs(jobs_s, &jobs))) return rc;
    if ((rc = parse_shard(shard, &idx, &count))) return rc;
    cli_archs a;
    if ((rc = cli_archs_parse(cmd->name, arch, &a))) return rc;
    cli_manifest m;
    warm w = {0};
    w.m = &m;
    w.json = json;
    w.shard_idx = idx;
    w.shard_count = count;
    if ((rc = cli_manifest_read(cmd->name, argv[0], &a, &m))) goto out;
    if (m.duplicates)
        fprintf(stderr, "kiln warm: %d repeated (spec, arch) pairs skipped\n", m.duplicates);
    if ((rc = cli_ctx_open(g, cmd->name, !cli_manifest_needs_native(&m), &w.ctx))) goto out;
    if ((rc = cli_manifest_resolve(cmd->name, w.ctx, &m))) goto out;
    if ((rc = make_items(&w, idx, count))) goto out;
    rc = warm_run(g, &w, jobs);
out:
    for (int i = 0; i < w.nitems; i++) free(w.items[i].msg);
    free(w.items);
    cli_manifest_free(&m);
    kiln_ctx_destroy(w.ctx);
    return rc;
}
