/*
 * cli_fleet.c — the `kiln` commands that move and check whole caches: verify (every row:
 * checksum, key from key material, key format, cubin container; --fix deletes bad rows), gc
 * (LRU eviction to a bound, dead leases, WAL checkpoint, optional VACUUM), merge (the union of
 * shards, every row verified, newer formats refused) and export (the rows of some archs, or of
 * a manifest, into a new file). Inputs are opened read-only and never modified.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "jit.h"

/* Bad rows or missing pairs listed one by one before "... and N more". */
#define LIST_MAX 20

/* The checks every command applies to a row. */
static const kiln__row_rules rules = {kiln__key_hash, KILN__FORMAT_VERSION};

/* Open `where` (a cache directory, or else a database file) with flags. 0 or CLI_FAIL. */
static int open_target(const char *cmd, const char *where, int flags, kiln__cache **out)
{
    struct stat sb;
    kiln__err e = {{0}};
    if (stat(where, &sb) != 0 || !S_ISDIR(sb.st_mode)) flags |= KILN__CACHE_FILE;
    if (kiln__cache_open_ex(where, flags, out, &e)) return cli_fail(cmd, CLI_FAIL, "%s", e.msg);
    return 0;
}

/* 1 when two open caches are the same file. */
static int same_file(const kiln__cache *a, const kiln__cache *b)
{
    struct stat x, y;
    return stat(kiln__cache_path(a), &x) == 0 && stat(kiln__cache_path(b), &y) == 0 &&
           x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* ---- verify ---------------------------------------------------------------------------------- */

typedef struct verify_state {
    kiln__str *json; /* --json: the bad rows' objects go here instead of stdout */
    int rows, bad;
    char (*keys)[33]; /* the bad rows' keys, for --fix */
    int cap;
    int oom;
} verify_state;

static int verify_row(const kiln__entry *en, void *user)
{
    verify_state *s = user;
    char why[512];
    s->rows++;
    if (!kiln__cache_row_check(en, &rules, why, sizeof why)) return 0;
    if (s->json) {
        kiln__str_puts(s->json, s->bad ? ", {\"key\": " : "{\"key\": ");
        cli_json_str(s->json, en->key);
        kiln__str_puts(s->json, ", \"arch\": ");
        cli_json_str(s->json, en->arch);
        kiln__str_puts(s->json, ", \"spec\": ");
        cli_json_str(s->json, en->spec);
        kiln__str_puts(s->json, ", \"reason\": ");
        cli_json_str(s->json, why);
        kiln__str_puts(s->json, "}");
    } else {
        char b[4][KILN__SPEC_MAX];
        printf("bad %s %s %s: %s\n", cli_safe(en->key, b[0], sizeof b[0]),
               cli_safe(en->arch, b[1], sizeof b[1]), cli_safe(en->spec, b[2], sizeof b[2]),
               cli_safe(why, b[3], sizeof b[3]));
    }
    if (s->bad == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        char(*k)[33] = realloc(s->keys, (size_t)cap * sizeof *k);
        if (!k) {
            s->oom = 1;
            return 1;
        }
        s->keys = k;
        s->cap = cap;
    }
    memcpy(s->keys[s->bad++], en->key, 33);
    return 0;
}

/* Verify one cache; returns the exit status. With json (the array's object count in *nobj),
 * one JSON object for the cache instead of the lines. */
static int verify_one(const char *cmd, kiln__cache *c, int fix, int json, int *nobj)
{
    verify_state s = {0};
    kiln__str rows = {0};
    kiln__err e = {{0}};
    int rc = CLI_OK;
    char integrity[1024] = "";
    if (json) s.json = &rows;
    if (kiln__cache_integrity(c, &e)) {
        if (!json) printf("bad file %s: %s\n", kiln__cache_path(c), e.msg);
        snprintf(integrity, sizeof integrity, "%s", e.msg);
        rc = CLI_FAIL;
    }
    if (kiln__cache_scan(c, verify_row, &s, &e)) {
        free(s.keys);
        kiln__str_free(&rows);
        return cli_fail(cmd, CLI_FAIL, "%s", e.msg);
    }
    if (s.oom || rows.oom) {
        free(s.keys);
        kiln__str_free(&rows);
        return cli_fail(cmd, CLI_FAIL, "out of memory");
    }
    int removed = 0;
    for (int i = 0; fix && i < s.bad; i++) {
        int n = 0;
        if (kiln__cache_remove(c, s.keys[i], &n, &e)) {
            cli_fail(cmd, CLI_FAIL, "%s", e.msg);
            break;
        }
        removed += n;
    }
    free(s.keys);
    if (json) {
        kiln__str o = {0};
        kiln__str_puts(&o, (*nobj)++ ? ",\n  {\"path\": " : "\n  {\"path\": ");
        cli_json_str(&o, kiln__cache_path(c));
        kiln__str_puts(&o, ", \"integrity\": ");
        if (integrity[0]) cli_json_str(&o, integrity);
        else kiln__str_puts(&o, "\"ok\"");
        kiln__str_printf(&o, ", \"rows\": %d, \"bad\": %d, \"removed\": %d, \"bad_rows\": [%s]}",
                         s.rows, s.bad, removed, rows.p ? rows.p : "");
        kiln__str_free(&rows);
        if (cli_json_print(cmd, &o)) return CLI_FAIL;
    } else {
        printf("verified %d rows in %s: %d bad", s.rows, kiln__cache_path(c), s.bad);
        if (fix) printf(", %d removed", removed);
        printf("\n");
    }
    if (s.bad > removed) rc = CLI_FAIL;
    return rc;
}

int cli_cmd_verify(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    int fix = 0, json = 0, npos = 0, nobj = 0;
    const cli_opt opts[] = {{"--fix", NULL, &fix}, {"--json", NULL, &json}, {NULL, NULL, NULL}};
    int rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    kiln__cache *c = NULL;
    if (json) printf("[");
    if (npos == 0) {
        if (!(rc = cli_cache_open(g, cmd->name, &c)))
            rc = verify_one(cmd->name, c, fix, json, &nobj);
        kiln__cache_close(c);
    }
    for (int i = 0; i < npos; i++) {
        int r = open_target(cmd->name, argv[i],
                            KILN__CACHE_EXISTING | (fix ? 0 : KILN__CACHE_RDONLY), &c);
        if (!r) r = verify_one(cmd->name, c, fix, json, &nobj);
        kiln__cache_close(c);
        c = NULL;
        if (r > rc) rc = r;
    }
    if (json) printf("%s]\n", nobj ? "\n" : "");
    return rc;
}

/* ---- gc -------------------------------------------------------------------------------------- */

int cli_cmd_gc(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    int vacuum = 0;
    const cli_opt opts[] = {{"--vacuum", NULL, &vacuum}, {NULL, NULL, NULL}};
    int rc = 0;
    if (cli_parse_opts(g, cmd, argc, argv, opts, &rc)) return rc;
    int64_t bound = -1;
    kiln__err e = {{0}};
    const char *env = getenv("KILN_CACHE_MAX_BYTES");
    if (g->max_size_set) bound = g->max_size;
    else if (env && *env && kiln__cache_parse_size(env, &bound, &e))
        return cli_fail(cmd->name, CLI_USAGE, "KILN_CACHE_MAX_BYTES: %s", e.msg);
    kiln__cache *c = NULL;
    if ((rc = cli_cache_open(g, cmd->name, &c))) return rc;
    int removed = 0, dead = 0, live = 0;
    int64_t freed = 0;
    kiln__cache_stats st;
    if ((bound >= 0 && kiln__cache_evict(c, bound, NULL, &removed, &freed, &e)) ||
        kiln__cache_lease_sweep(c, &dead, &live, &e) || kiln__cache_compact(c, vacuum, &e) ||
        kiln__cache_stats_get(c, &st, &e)) {
        rc = cli_fail(cmd->name, CLI_FAIL, "%s", e.msg);
    } else {
        if (bound >= 0)
            printf("evicted %d rows (%lld bytes) to stay under %lld bytes\n", removed,
                   (long long)freed, (long long)bound);
        else printf("no size bound (--max-size or KILN_CACHE_MAX_BYTES): nothing evicted\n");
        printf("removed %d dead leases (%d held)\n", dead, live);
        printf("cache %s: %lld rows, %lld bytes of cubins, file %lld bytes\n", kiln__cache_path(c),
               (long long)st.entries, (long long)st.bytes, (long long)st.file_bytes);
    }
    kiln__cache_close(c);
    return rc;
}

/* ---- merge and export: copying verified rows ------------------------------------------------- */

/* A sorted list of keys (export --spec-file). */
typedef struct keyset {
    char (*k)[33];
    int n;
} keyset;

static int key_cmp(const void *a, const void *b) { return strcmp(a, b); }

static int keyset_has(const keyset *s, const char *key)
{
    return s->n && bsearch(key, s->k, (size_t)s->n, sizeof s->k[0], key_cmp) != NULL;
}

/* What a copy does with each row, and what came of it. */
typedef struct copy_state {
    const char *cmd;
    kiln__cache *out;
    const cli_archs *archs; /* export: keep rows of these archs (NULL: all) */
    const keyset *keys;     /* export --spec-file: keep these keys only (NULL: all) */
    int rows, added, present, differ, refused, skipped;
    int64_t bytes;
    int failed; /* a write to out failed: stop */
} copy_state;

static int arch_wanted(const cli_archs *a, const char *arch)
{
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->a[i], arch)) return 1;
    return 0;
}

static int copy_row(const kiln__entry *en, void *user)
{
    copy_state *s = user;
    char why[512], sum[33];
    kiln__err e = {{0}};
    s->rows++;
    if ((s->archs && !arch_wanted(s->archs, en->arch)) ||
        (s->keys && !keyset_has(s->keys, en->key))) {
        s->skipped++;
        return 0;
    }
    if (kiln__cache_row_check(en, &rules, why, sizeof why)) {
        s->refused++;
        char b[4][KILN__SPEC_MAX];
        fprintf(stderr, "kiln %s: refused %s %s %s: %s\n", s->cmd,
                cli_safe(en->key, b[0], sizeof b[0]), cli_safe(en->arch, b[1], sizeof b[1]),
                cli_safe(en->spec, b[2], sizeof b[2]), cli_safe(why, b[3], sizeof b[3]));
        return 0;
    }
    kiln_status st = kiln__cache_checksum(s->out, en->key, sum, &e);
    if (st == KILN_STATUS_OK) {
        /* one key, one content: keep what is there, but say so if the bytes differ */
        s->present++;
        if (strcmp(sum, en->checksum) != 0) {
            s->differ++;
            fprintf(stderr, "kiln %s: %s %s: a different cubin is already in %s; kept that one\n",
                    s->cmd, en->key, en->arch, kiln__cache_path(s->out));
        }
        return 0;
    }
    if (st == KILN_STATUS_NOT_FOUND) st = kiln__cache_put(s->out, en, &e);
    if (st) {
        cli_fail(s->cmd, CLI_FAIL, "%s", e.msg);
        s->failed = 1;
        return 1;
    }
    s->added++;
    s->bytes += (int64_t)en->cubin_size;
    return 0;
}

/* Copy the rows of `in` into s->out. Returns 0 or CLI_FAIL. */
static int copy_from(copy_state *s, kiln__cache *in)
{
    kiln__err e = {{0}};
    if (same_file(in, s->out))
        return cli_fail(s->cmd, CLI_USAGE, "%s is the output itself", kiln__cache_path(in));
    if (kiln__cache_scan(in, copy_row, s, &e)) return cli_fail(s->cmd, CLI_FAIL, "%s", e.msg);
    return s->failed ? CLI_FAIL : 0;
}

int cli_cmd_merge(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    static const cli_opt opts[] = {{NULL, NULL, NULL}};
    int npos = 0, rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    if (npos < 2) return cli_fail(cmd->name, CLI_USAGE, "usage: kiln merge OUT IN... (see --help)");
    kiln__cache *out = NULL;
    if ((rc = open_target(cmd->name, argv[0], 0, &out))) return rc;
    copy_state total = {0};
    for (int i = 1; i < npos; i++) {
        kiln__cache *in = NULL;
        copy_state s = {cmd->name, out, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0};
        int r = open_target(cmd->name, argv[i], KILN__CACHE_RDONLY, &in);
        if (!r) r = copy_from(&s, in);
        kiln__cache_close(in);
        if (r) {
            rc = CLI_FAIL;
            if (s.failed) break;
            continue;
        }
        printf("%s: %d rows: %d added, %d present, %d refused\n", argv[i], s.rows, s.added,
               s.present, s.refused);
        total.added += s.added;
        total.present += s.present;
        total.refused += s.refused;
        total.differ += s.differ;
        if (s.refused) rc = CLI_FAIL;
    }
    kiln__cache_stats st;
    kiln__err e = {{0}};
    if (kiln__cache_stats_get(out, &st, &e)) rc = cli_fail(cmd->name, CLI_FAIL, "%s", e.msg);
    else
        printf(
            "merged into %s: %d added, %d present (%d with other bytes), %d refused; %lld rows\n",
            kiln__cache_path(out), total.added, total.present, total.differ, total.refused,
            (long long)st.entries);
    kiln__cache_close(out);
    return rc;
}

/* The keys of a manifest's pairs, sorted; CLI status. */
static int manifest_keys(const char *cmd, const cli_manifest *m, keyset *ks)
{
    ks->k = calloc(m->npairs ? (size_t)m->npairs : 1, sizeof ks->k[0]);
    if (!ks->k) return cli_fail(cmd, CLI_FAIL, "out of memory");
    for (int i = 0; i < m->npairs; i++) {
        const cli_mspec *sp = &m->specs[m->pairs[i].spec];
        const char *arch = m->archs.a[m->pairs[i].arch];
        if (cli_key(&sp->v, arch, ks->k[ks->n]))
            return cli_fail(cmd, CLI_USAGE, "%s (%s): no key: %s", sp->spec, arch, kiln_errmsg());
        ks->n++;
    }
    qsort(ks->k, (size_t)ks->n, sizeof ks->k[0], key_cmp);
    return 0;
}

/* Print the manifest pairs whose key is not in c; returns their number. */
static int report_missing(const char *cmd, kiln__cache *c, const cli_manifest *m)
{
    int missing = 0;
    for (int i = 0; i < m->npairs; i++) {
        const cli_mspec *sp = &m->specs[m->pairs[i].spec];
        const char *arch = m->archs.a[m->pairs[i].arch];
        char key[33], sum[33];
        kiln__err e = {{0}};
        if (cli_key(&sp->v, arch, key) || kiln__cache_checksum(c, key, sum, &e) == KILN_STATUS_OK)
            continue;
        if (missing++ < LIST_MAX)
            fprintf(stderr, "kiln %s: not in the cache: %s %s %s\n", cmd, key, arch, sp->spec);
    }
    if (missing > LIST_MAX)
        fprintf(stderr, "kiln %s: ... and %d more not in the cache\n", cmd, missing - LIST_MAX);
    return missing;
}

int cli_cmd_export(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    const char *arch = NULL, *spec_file = NULL;
    int npos = 0;
    const cli_opt opts[] = {{"--arch", &arch, NULL},
                            {"--spec-file", &spec_file, NULL},
                            {NULL, NULL, NULL}};
    int rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    if (npos != 1) return cli_fail(cmd->name, CLI_USAGE, "give exactly one OUT (see --help)");
    cli_archs a = {0};
    char msg[1024];
    if (arch && (rc = cli_archs_add(arch, &a, NULL, NULL, msg, sizeof msg)))
        return cli_fail(cmd->name, rc, "--arch: %s", msg);
    if (a.native)
        return cli_fail(cmd->name, CLI_USAGE, "--arch: name the archs (native needs no export)");
    cli_manifest m = {0};
    keyset ks = {0};
    kiln__cache *in = NULL, *out = NULL;
    if (spec_file && ((rc = cli_manifest_read(cmd->name, spec_file, &a, &m)) ||
                      (rc = manifest_keys(cmd->name, &m, &ks))))
        goto done;
    if ((rc = cli_cache_open(g, cmd->name, &in))) goto done;
    /* OUT is never the input itself, nor its -wal, -shm or -journal (by inode) */
    char out_db[4200], what[4200];
    struct stat osb;
    snprintf(out_db, sizeof out_db, "%s%s", argv[0],
             stat(argv[0], &osb) == 0 && S_ISDIR(osb.st_mode) ? "/kernels.db" : "");
    if (cli_path_is_cache(out_db, in, what, sizeof what)) {
        rc = cli_fail(cmd->name, CLI_USAGE, "%s is the cache being exported (%s)", argv[0], what);
        goto done;
    }
    if ((rc = open_target(cmd->name, argv[0], 0, &out))) goto done;
    copy_state s = {
        cmd->name, out, spec_file || !arch ? NULL : &a, spec_file ? &ks : NULL, 0, 0, 0, 0, 0, 0,
        0,         0};
    if ((rc = copy_from(&s, in))) goto done;
    int missing = spec_file ? report_missing(cmd->name, in, &m) : 0;
    printf("exported %d rows (%lld bytes of cubins) to %s; %d already there, %d refused", s.added,
           (long long)s.bytes, kiln__cache_path(out), s.present, s.refused);
    if (spec_file) printf("; %d of %d manifest kernels not in the cache", missing, m.npairs);
    printf("\n");
    if (s.refused || missing) rc = CLI_FAIL;
done:
    kiln__cache_close(in);
    kiln__cache_close(out);
    cli_manifest_free(&m);
    free(ks.k);
    return rc;
}
