/*
 * cli_ls.c — the `kiln` commands that list and remove cache rows: ls (table or JSON, through the
 * filters of cli_report.c) and rm (by key prefix). Both open the cache directly and never touch
 * the driver; ls on the default cache before anything created it lists nothing.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "jit.h"

/* ---- ls ------------------------------------------------------------------------------------- */

/* Write s as a JSON string literal (cli_json_str: also bytes that are not UTF-8). */
static void json_str(FILE *f, const char *s)
{
    kiln__str t = {0};
    cli_json_str(&t, s);
    fputs(t.p && !t.oom ? t.p : "\"\"", f);
    kiln__str_free(&t);
}

typedef struct ls_state {
    int json;
    int rows;
    cli_ls_filter filter; /* --arch, --op, --spec, --limit (cli_report.c) */
} ls_state;

static int ls_row(const kiln__entry *en, void *user)
{
    ls_state *s = user;
    if (!cli_ls_filter_keep(&s->filter, en)) return 0;
    char last[32], created[32], regs[16] = "-";
    if (en->registers >= 0) snprintf(regs, sizeof regs, "%d", en->registers); /* ptxas said */
    cli_iso_time(en->last_used, last);
    cli_iso_time(en->created, created);
    int smem = en->smem_bytes;
    if (!s->json) {
        char b[3][KILN__SPEC_MAX]; /* texts from the row, escaped (cli_safe.c) */
        printf("%-32s %-8s %4s %7d %5d %8zu %10.1f %6lld  %-20s  %s\n",
               cli_safe(en->key, b[0], sizeof b[0]), cli_safe(en->arch, b[1], sizeof b[1]), regs,
               smem, en->spill_bytes, en->cubin_size, en->compile_ms, (long long)en->hits, last,
               cli_safe(en->spec, b[2], sizeof b[2]));
    } else {
        printf("%s\n  {\"key\": ", s->rows ? "," : "");
        json_str(stdout, en->key);
        printf(", \"arch\": ");
        json_str(stdout, en->arch);
        printf(", \"regs\": %s, \"smem\": %d, \"spill\": %d, \"stack\": %d, \"cubin_bytes\": %zu, "
               "\"compile_ms\": %.3f, \"hits\": %lld, \"created\": \"%s\", \"last_used\": \"%s\", "
               "\"nvrtc\": ",
               en->registers >= 0 ? regs : "null", smem, en->spill_bytes, en->stack_bytes,
               en->cubin_size, en->compile_ms, (long long)en->hits, created, last);
        json_str(stdout, en->nvrtc);
        printf(", \"spec\": ");
        json_str(stdout, en->spec);
        printf("}");
    }
    s->rows++;
    return 0;
}

int cli_cmd_ls(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    ls_state s = {0};
    const char *arch = NULL, *op = NULL, *spec = NULL, *limit = NULL;
    const cli_opt opts[] = {{"--json", NULL, &s.json}, {"--arch", &arch, NULL},
                            {"--op", &op, NULL},       {"--spec", &spec, NULL},
                            {"--limit", &limit, NULL}, {NULL, NULL, NULL}};
    int rc = 0;
    if (cli_parse_opts(g, cmd, argc, argv, opts, &rc)) return rc;
    if ((rc = cli_ls_filter_init(&s.filter, arch, op, spec, limit))) return rc;
    kiln__cache *c = NULL;
    char path[1100]; /* the default cache not made yet (a fresh HOME): an empty listing */
    if (!cli_default_cache_absent(g, path, sizeof path) && (rc = cli_cache_open(g, cmd->name, &c)))
        return rc;
    if (s.json) printf("[");
    else
        printf("%-32s %-8s %4s %7s %5s %8s %10s %6s  %-20s  %s\n", "KEY", "ARCH", "REGS", "SMEM",
               "SPILL", "CUBIN", "COMPILE_MS", "HITS", "LAST_USED", "SPEC");
    kiln__err e = {{0}};
    if (c && kiln__cache_each(c, ls_row, &s, &e)) rc = cli_fail(cmd->name, CLI_FAIL, "%s", e.msg);
    if (s.json) printf("%s]\n", s.rows ? "\n" : "");
    kiln__cache_close(c);
    return rc;
}

/* ---- rm ------------------------------------------------------------------------------------- */

int cli_cmd_rm(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    static const cli_opt opts[] = {{NULL, NULL, NULL}};
    int npos = 0;
    int rc = 0;
    if (cli_parse_words(g, cmd, argc, argv, opts, "missing KEY-PREFIX", &npos, &rc)) return rc;
    kiln__cache *c = NULL;
    if ((rc = cli_cache_open(g, cmd->name, &c))) return rc;
    int total = 0;
    for (int i = 0; i < npos; i++) {
        int n = 0;
        kiln__err e = {{0}};
        kiln_status st = kiln__cache_remove(c, argv[i], &n, &e);
        int r = CLI_OK;
        if (st)
            r = cli_fail(cmd->name, st == KILN_STATUS_INVALID_ARGUMENT ? CLI_USAGE : CLI_FAIL, "%s",
                         e.msg);
        else if (n == 0)
            r = cli_fail(cmd->name, CLI_FAIL, "no cache entry matches '%s' (in %s)", argv[i],
                         kiln__cache_path(c));
        if (r > rc) rc = r;
        total += n;
    }
    printf("removed %d\n", total);
    kiln__cache_close(c);
    return rc;
}
