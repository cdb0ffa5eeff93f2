/*
 * cli_warm.c — `kiln warm`: read a manifest of specs and check every line before compiling
 * anything, then compile specs × archs into the cache with N worker threads that share one
 * context (the library compiles different keys in parallel) and take work items from a shared
 * index under a mutex. Progress goes to stderr (a live line on a terminal, a line per 10 %
 * otherwise), failures are listed at the end, and the last line on stdout is the summary.
 */
#include <ctype.h>
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

/* One accepted manifest line. */
typedef struct spec_line {
    kiln_variant v;
    char spec[KILN__SPEC_MAX]; /* canonical */
    int line;                  /* 1-based line number in the manifest */
} spec_line;

typedef struct manifest {
    spec_line *s;
    int n, cap;
} manifest;

typedef enum item_state { ITEM_PENDING, ITEM_COMPILED, ITEM_CACHED, ITEM_FAILED } item_state;

/* One work item: a spec for an arch. */
typedef struct item {
    int spec, arch;   /* indexes into the manifest and the arch list */
    item_state state; /* written by the worker that ran it */
    char key[33];     /* "" when unknown */
    char *msg;        /* failure: first line of the message (malloc'd) */
} item;

/* State shared by the workers; the counters and next are guarded by lock. */
typedef struct warm {
    kiln_ctx *ctx;
    const manifest *m;
    const cli_archs *a;
    item *items;
    int nitems;
    pthread_mutex_t lock;
    int next, done, compiled, cached, failed;
    double t0_ms;
    int tty;         /* stderr is a terminal: one live progress line */
    int last_decile; /* otherwise: the last 10 % step printed */
} warm;

/* ---- manifest ------------------------------------------------------------------------------- */

/* Accept one line of the manifest: strip the comment and blanks, parse and validate the spec,
 * skip duplicates. CLI_USAGE naming file:line on a malformed line. */
static int manifest_line(const char *name, int ln, char *text, manifest *m)
{
    char *hash = strchr(text, '#');
    if (hash) *hash = 0;
    while (isspace((unsigned char)*text)) text++;
    size_t n = strlen(text);
    while (n && isspace((unsigned char)text[n - 1])) text[--n] = 0;
    if (!n) return 0;
    kiln_variant v;
    char spec[KILN__SPEC_MAX];
    kiln__err e = {{0}};
    if (kiln__spec_parse(text, &v, &e) || kiln__variant_check(&v, &e) ||
        !kiln__spec_format(&v, spec, sizeof spec, &e))
        return cli_fail("warm", CLI_USAGE, "%s:%d: %s", name, ln, e.msg);
    for (int i = 0; i < m->n; i++) {
        if (!strcmp(m->s[i].spec, spec)) {
            fprintf(stderr, "kiln warm: %s:%d: same variant as line %d, skipped\n", name, ln,
                    m->s[i].line);
            return 0;
        }
    }
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 64;
        spec_line *s = realloc(m->s, (size_t)cap * sizeof *s);
        if (!s) return cli_fail("warm", CLI_FAIL, "out of memory reading %s", name);
        m->s = s;
        m->cap = cap;
    }
    spec_line *sl = &m->s[m->n++];
    sl->v = v;
    memcpy(sl->spec, spec, sizeof spec);
    sl->line = ln;
    return 0;
}

/* Read a whole manifest ("-": stdin) into m. CLI_USAGE when it cannot be opened or a line is
 * malformed. */
static int manifest_read(const char *path, manifest *m)
{
    int use_stdin = !strcmp(path, "-");
    const char *name = use_stdin ? "<stdin>" : path;
    FILE *f = use_stdin ? stdin : fopen(path, "r");
    if (!f) return cli_fail("warm", CLI_USAGE, "cannot open manifest %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int ln = 0, rc = 0;
    while (!rc && getline(&line, &cap, f) >= 0) rc = manifest_line(name, ++ln, line, m);
    if (!rc && ferror(f)) rc = cli_fail("warm", CLI_FAIL, "cannot read %s: %s", name, strerror(errno));
    free(line);
    if (!use_stdin) fclose(f);
    return rc;
}

/* ---- workers -------------------------------------------------------------------------------- */

/* A malloc'd copy of the first line of s. */
static char *first_line(const char *s)
{
    size_t n = strcspn(s, "\n");
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* The key a failed item would have had, when its configuration and key material can be made;
 * "" otherwise. */
static void guess_key(const kiln_variant *v, const char *arch, char key[33])
{
    kiln__config cfg;
    kiln__err e = {{0}};
    char *material = NULL;
    key[0] = 0;
    if (kiln__config_pick(v, kiln__arch_sm(arch), &cfg, &e) ||
        kiln__key_material(v, &cfg, arch, &material, &e))
        return;
    kiln__key_hash(material, key);
    free(material);
}

static void run_item(warm *w, item *it)
{
    const spec_line *s = &w->m->s[it->spec];
    const char *arch = w->a->a[it->arch];
    kiln_kernel *k = NULL;
    kiln_kernel_info ki;
    if (kiln_kernel_compile(w->ctx, &s->v, arch, &k) == KILN_STATUS_OK &&
        kiln_kernel_describe(k, &ki) == KILN_STATUS_OK) {
        memcpy(it->key, ki.key, sizeof it->key);
        it->state = ki.from_cache ? ITEM_CACHED : ITEM_COMPILED;
        return;
    }
    /* The thread's own message: the context's may already be another worker's. */
    const char *msg = kiln_errmsg();
    it->msg = first_line(*msg ? msg : kiln_ctx_errmsg(w->ctx));
    it->state = ITEM_FAILED;
    guess_key(&s->v, arch, it->key);
}

/* Print progress; called with w->lock held. */
static void progress(warm *w, int final)
{
    double secs = (cli_now_ms() - w->t0_ms) / 1e3;
    double rate = secs > 0 ? w->done / secs : 0;
    double eta = rate > 0 ? (w->nitems - w->done) / rate : 0;
    if (w->tty) {
        fprintf(stderr, "\r[%d/%d] %d failed, %.1f/s, ETA %.0fs   ", w->done, w->nitems, w->failed,
                rate, eta);
        if (final) fputc('\n', stderr);
        fflush(stderr);
        return;
    }
    int decile = w->nitems ? w->done * 10 / w->nitems : 10;
    if (decile <= w->last_decile || final) return;
    w->last_decile = decile;
    fprintf(stderr, "[%d/%d] %d failed, %.1f/s, ETA %.0fs\n", w->done, w->nitems, w->failed, rate,
            eta);
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

/* Build the work list: specs × archs, keeping shard idx of count. */
static int make_items(warm *w, long idx, long count)
{
    long total = (long)w->m->n * w->a->n;
    w->items = calloc(total ? (size_t)total : 1, sizeof *w->items);
    if (!w->items) return cli_fail("warm", CLI_FAIL, "out of memory for %ld work items", total);
    for (long i = 0; i < total; i++) {
        if (i % count != idx) continue;
        item *it = &w->items[w->nitems++];
        it->spec = (int)(i / w->a->n);
        it->arch = (int)(i % w->a->n);
    }
    return 0;
}

/* List the failures on stderr. */
static void report_failures(const warm *w)
{
    for (int i = 0; i < w->nitems; i++) {
        const item *it = &w->items[i];
        if (it->state != ITEM_FAILED) continue;
        fprintf(stderr, "kiln warm: failed %s %s %s: %s\n", it->key[0] ? it->key : "-",
                w->a->a[it->arch], w->m->s[it->spec].spec, it->msg ? it->msg : "(no message)");
    }
}

static int default_jobs(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > WARM_JOBS_MAX ? WARM_JOBS_MAX : (int)n;
}

/* Compile everything and print the summary; returns the exit status. */
static int warm_run(warm *w, long jobs)
{
    if (jobs > w->nitems) jobs = w->nitems > 0 ? w->nitems : 1;
    fprintf(stderr, "kiln warm: %d specs x %d archs: %d kernels, %ld jobs, cache %s\n", w->m->n,
            w->a->n, w->nitems, jobs, kiln_ctx_cache_path(w->ctx));
    w->tty = isatty(STDERR_FILENO);
    w->t0_ms = cli_now_ms();
    pthread_mutex_init(&w->lock, NULL);
    if (w->nitems) run_all(w, (int)jobs);
    pthread_mutex_destroy(&w->lock);
    report_failures(w);
    printf("%d kernels: %d compiled, %d cached, %d failed in %.1f s\n", w->nitems, w->compiled,
           w->cached, w->failed, (cli_now_ms() - w->t0_ms) / 1e3);
    return w->failed ? CLI_FAIL : CLI_OK;
}

int cli_cmd_warm(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    const char *arch = NULL, *jobs_s = NULL, *shard = NULL;
    int npos = 0;
    const cli_opt opts[] = {{"--arch", &arch, NULL},
                            {"--jobs", &jobs_s, NULL},
                            {"--shard", &shard, NULL},
                            {NULL, NULL, NULL}};
    int rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    if (npos != 1)
        return cli_fail(cmd->name, CLI_USAGE, "%s", npos ? "give exactly one MANIFEST" : "missing MANIFEST");
    long jobs = default_jobs(), idx = 0, count = 1;
    if (jobs_s && (rc = cli_long(cmd->name, "--jobs", jobs_s, 1, WARM_JOBS_MAX, &jobs))) return rc;
    if ((rc = parse_shard(shard, &idx, &count))) return rc;
    cli_archs a;
    if ((rc = cli_archs_parse(cmd->name, arch, &a))) return rc;
    manifest m = {0};
    warm w = {0};
    w.m = &m;
    w.a = &a;
    if ((rc = manifest_read(argv[0], &m))) goto out;
    if ((rc = cli_ctx_open(g, cmd->name, !a.native, &w.ctx))) goto out;
    if ((rc = cli_archs_resolve(cmd->name, w.ctx, &a))) goto out;
    if ((rc = make_items(&w, idx, count))) goto out;
    rc = warm_run(&w, jobs);
out:
    for (int i = 0; i < w.nitems; i++) free(w.items[i].msg);
    free(w.items);
    free(m.s);
    kiln_ctx_destroy(w.ctx);
    return rc;
}
