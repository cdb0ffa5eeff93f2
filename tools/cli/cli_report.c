/*
 * cli_report.c — the `kiln` commands and pieces that report on a cache the way ccache and
 * sccache users expect: `--version`, `stats` (counters, hit rate, per-arch totals; `--zero`),
 * `clear`, `completion bash|zsh` (generated from the command table), the JSON writer every
 * `--json` shares, `info --json`, and the filters of `ls` (--arch, --op, --spec, --limit).
 * Nothing here compiles; the cache is opened directly and, when it has no file yet, not created.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "jit.h"

/* Most archs `kiln stats` lists. */
#define STATS_ARCH_MAX 64

/* ---- JSON ------------------------------------------------------------------------------------ */

/* Length of the well-formed UTF-8 sequence at p (1..4), or 0 when p does not start one. */
static int utf8_len(const unsigned char *p)
{
    int n = p[0] < 0x80             ? 1
            : (p[0] & 0xe0) == 0xc0 ? 2
            : (p[0] & 0xf0) == 0xe0 ? 3
            : (p[0] & 0xf8) == 0xf0 ? 4
                                    : 0;
    if (n == 0 || (n == 2 && p[0] < 0xc2) || (n == 4 && p[0] > 0xf4)) return 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    if (n == 3 && ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0))) return 0;
    if (n == 4 && ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90))) return 0;
    return n;
}

void cli_json_str(kiln__str *s, const char *t)
{
    kiln__str_puts(s, "\"");
    for (const unsigned char *p = (const unsigned char *)(t ? t : ""); *p;) {
        int n = utf8_len(p);
        if (*p == '"' || *p == '\\') kiln__str_printf(s, "\\%c", *p);
        else if (*p == '\n') kiln__str_puts(s, "\\n");
        else if (*p == '\t') kiln__str_puts(s, "\\t");
        else if (*p == '\r') kiln__str_puts(s, "\\r");
        else if (*p < 0x20 || *p == 0x7f) kiln__str_printf(s, "\\u%04x", *p);
        else if (n == 0) kiln__str_puts(s, "\\ufffd"); /* a byte that is not UTF-8 */
        else kiln__str_add(s, (const char *)p, (size_t)n);
        p += n ? n : 1;
    }
    kiln__str_puts(s, "\"");
}

int cli_json_print(const char *cmd, kiln__str *s)
{
    int oom = s->oom;
    if (!oom) fputs(s->p ? s->p : "", stdout);
    kiln__str_free(s);
    return oom ? cli_fail(cmd, CLI_FAIL, "out of memory") : CLI_OK;
}

/* ---- --version ------------------------------------------------------------------------------- */

void cli_print_version(void)
{
    printf("kiln %s\n", kiln_version());
    printf("nvrtc %s\n", kiln_nvrtc_version());
    printf("key format %d, cache schema %d\n", KILN__FORMAT_VERSION, KILN__CACHE_SCHEMA_VERSION);
}

/* ---- opening without creating ---------------------------------------------------------------- */

int cli_default_cache_absent(const cli_global *g, char *path, size_t cap)
{
    return !g->cache_dir && cli_cache_absent(g, path, cap);
}

int cli_cache_absent(const cli_global *g, char *path, size_t cap)
{
    char dir[1024];
    kiln__err e = {{0}};
    struct stat sb;
    if (g->cache_dir) snprintf(dir, sizeof dir, "%s", g->cache_dir);
    else if (kiln__cache_default_dir(dir, sizeof dir, &e)) return 0; /* open says why */
    if (stat(dir, &sb) == 0 && S_ISREG(sb.st_mode)) {
        snprintf(path, cap, "%s", dir);
        return 0;
    }
    snprintf(path, cap, "%s/kernels.db", dir);
    return stat(path, &sb) != 0;
}

/* ---- stats ----------------------------------------------------------------------------------- */

typedef struct stats_view {
    char path[1100];
    int exists;
    kiln__cache_stats s;
    kiln__arch_stats arch[STATS_ARCH_MAX];
    int narch;
    int64_t zeroed;
} stats_view;

static double hit_rate(const kiln__cache_stats *s)
{
    int64_t n = s->hits + s->misses;
    return n ? 100.0 * (double)s->hits / (double)n : 0.0;
}

static void stats_text(const stats_view *v)
{
    char since[32] = "-";
    if (v->zeroed) cli_iso_time(v->zeroed, since);
    printf("cache:        %s%s\n", v->path, v->exists ? "" : " (no file yet)");
    printf("entries:      %lld\n", (long long)v->s.entries);
    printf("cubin bytes:  %lld\n", (long long)v->s.bytes);
    printf("file bytes:   %lld\n", (long long)v->s.file_bytes);
    printf("hits:         %lld\n", (long long)v->s.hits);
    printf("misses:       %lld\n", (long long)v->s.misses);
    if (v->s.hits + v->s.misses) printf("hit rate:     %.1f %%\n", hit_rate(&v->s));
    else printf("hit rate:     -\n");
    printf("zeroed:       %s\n", since);
    char safe[1400];
    if (v->s.hit_log[0]) printf("hit log:      %s\n", cli_safe(v->s.hit_log, safe, sizeof safe));
    printf("%-8s %8s %12s %8s\n", "ARCH", "ENTRIES", "BYTES", "HITS");
    for (int i = 0; i < v->narch; i++)
        printf("%-8s %8lld %12lld %8lld\n", v->arch[i].arch, (long long)v->arch[i].entries,
               (long long)v->arch[i].bytes, (long long)v->arch[i].hits);
}

static int stats_json(const stats_view *v)
{
    kiln__str s = {0};
    char since[32] = "";
    kiln__str_puts(&s, "{\"path\": ");
    cli_json_str(&s, v->path);
    kiln__str_printf(&s,
                     ", \"exists\": %s, \"entries\": %lld, \"cubin_bytes\": %lld, "
                     "\"file_bytes\": %lld, \"hits\": %lld, \"misses\": %lld, ",
                     v->exists ? "true" : "false", (long long)v->s.entries, (long long)v->s.bytes,
                     (long long)v->s.file_bytes, (long long)v->s.hits, (long long)v->s.misses);
    if (v->s.hits + v->s.misses)
        kiln__str_printf(&s, "\"hit_rate\": %.4f, ", hit_rate(&v->s) / 100);
    else kiln__str_puts(&s, "\"hit_rate\": null, ");
    kiln__str_puts(&s, "\"hit_log\": ");
    if (v->s.hit_log[0]) cli_json_str(&s, v->s.hit_log);
    else kiln__str_puts(&s, "null");
    kiln__str_puts(&s, ", ");
    if (v->zeroed) {
        cli_iso_time(v->zeroed, since);
        kiln__str_printf(&s, "\"zeroed\": \"%s\", \"archs\": [", since);
    } else {
        kiln__str_puts(&s, "\"zeroed\": null, \"archs\": [");
    }
    for (int i = 0; i < v->narch; i++) {
        kiln__str_puts(&s, i ? ", {\"arch\": " : "{\"arch\": ");
        cli_json_str(&s, v->arch[i].arch);
        kiln__str_printf(&s, ", \"entries\": %lld, \"cubin_bytes\": %lld, \"hits\": %lld}",
                         (long long)v->arch[i].entries, (long long)v->arch[i].bytes,
                         (long long)v->arch[i].hits);
    }
    kiln__str_puts(&s, "]}\n");
    return cli_json_print("stats", &s);
}

int cli_cmd_stats(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    int zero = 0, json = 0;
    const cli_opt opts[] = {{"--zero", NULL, &zero}, {"--json", NULL, &json}, {NULL, NULL, NULL}};
    int rc = 0;
    if (cli_parse_opts(g, cmd, argc, argv, opts, &rc)) return rc;
    stats_view *v = calloc(1, sizeof *v);
    if (!v) return cli_fail(cmd->name, CLI_FAIL, "out of memory");
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    v->exists = !cli_default_cache_absent(g, v->path, sizeof v->path);
    if (v->exists) rc = cli_cache_open(g, cmd->name, &c);
    if (c) {
        snprintf(v->path, sizeof v->path, "%s", kiln__cache_path(c));
        if (zero && kiln__cache_stats_zero(c, &e)) rc = cli_fail(cmd->name, CLI_FAIL, "%s", e.msg);
        else if (kiln__cache_stats_get(c, &v->s, &e) ||
                 kiln__cache_arch_stats(c, v->arch, STATS_ARCH_MAX, &v->narch, &v->zeroed, &e))
            rc = cli_fail(cmd->name, CLI_FAIL, "%s", e.msg);
    }
    kiln__cache_close(c);
    if (!rc && zero && !json && !c && !v->exists)
        printf("nothing to zero: %s has no file yet\n", v->path);
    else if (!rc && zero && !json)
        printf("zeroed the counters of %s (hits, misses, each entry's hits)\n", v->path);
    else if (!rc && json) rc = stats_json(v);
    else if (!rc) stats_text(v);
    free(v);
    return rc;
}

/* ---- clear ----------------------------------------------------------------------------------- */

int cli_cmd_clear(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    int yes = 0;
    const cli_opt opts[] = {{"--yes", NULL, &yes}, {NULL, NULL, NULL}};
    int rc = 0;
    if (cli_parse_opts(g, cmd, argc, argv, opts, &rc)) return rc;
    char path[1100];
    if (cli_default_cache_absent(g, path, sizeof path)) {
        if (!yes)
            return cli_fail(cmd->name, CLI_USAGE,
                            "this removes every entry of %s; run it again with --yes", path);
        printf("removed 0 entries (%s has no file yet)\n", path);
        return CLI_OK;
    }
    kiln__cache *c = NULL;
    if ((rc = cli_cache_open(g, cmd->name, &c))) return rc;
    kiln__cache_stats s;
    kiln__err e = {{0}};
    int removed = 0;
    if (!yes) {
        rc = kiln__cache_stats_get(c, &s, &e) ? cli_fail(cmd->name, CLI_FAIL, "%s", e.msg)
                                              : cli_fail(cmd->name, CLI_USAGE,
                                                         "this removes all %lld entries of %s; "
                                                         "run it again with --yes",
                                                         (long long)s.entries, kiln__cache_path(c));
    } else if (kiln__cache_clear(c, &removed, &e)) {
        rc = cli_fail(cmd->name, CLI_FAIL, "%s", e.msg);
    } else {
        printf("removed %d entries from %s (kiln gc --vacuum gives the space back)\n", removed,
               kiln__cache_path(c));
    }
    kiln__cache_close(c);
    return rc;
}

/* ---- info --json ----------------------------------------------------------------------------- */

/* One cache's object ("path", "schema", "read_only", counts) into s. */
static void cache_json(kiln__str *s, kiln__cache *c, const kiln__cache_stats *st)
{
    const char *why = NULL;
    int ro = kiln__cache_readonly(c, &why);
    kiln__str_puts(s, "{\"path\": ");
    cli_json_str(s, kiln__cache_path(c));
    kiln__str_printf(s, ", \"schema\": %d, \"read_only\": %s", kiln__cache_schema(c),
                     ro ? "true" : "false");
    if (ro) {
        kiln__str_puts(s, ", \"read_only_why\": ");
        cli_json_str(s, why);
    }
    kiln__str_printf(s,
                     ", \"entries\": %lld, \"cubin_bytes\": %lld, \"file_bytes\": %lld, "
                     "\"hits\": %lld, \"misses\": %lld}",
                     (long long)st->entries, (long long)st->bytes, (long long)st->file_bytes,
                     (long long)st->hits, (long long)st->misses);
}

/* The GPUs as a JSON array (and the driver) into s. */
static void devices_json(kiln__str *s)
{
    int driver = 0;
    kiln__str_puts(s, "\"gpus\": [");
    for (int ord = 0, n = 0; ord < CLI_ARCH_MAX; ord++) {
        kiln_ctx_opts o = {0};
        o.no_cache = 1;
        o.device = ord;
        kiln_ctx *ctx = NULL;
        kiln_device_info di;
        memset(&di, 0, sizeof di);
        if (kiln_ctx_create(&o, &ctx)) break;
        kiln_ctx_device(ctx, &di);
        kiln_ctx_destroy(ctx);
        if (!di.present) break;
        driver = di.driver_version;
        kiln__str_printf(s, "%s{\"ordinal\": %d, \"name\": ", n++ ? ", " : "", di.ordinal);
        cli_json_str(s, di.name);
        kiln__str_printf(s, ", \"sm\": %d, \"sm_count\": %d, \"arch\": ", di.sm, di.sm_count);
        cli_json_str(s, di.arch);
        kiln__str_puts(s, "}");
    }
    kiln__str_puts(s, "], \"driver\": ");
    if (driver) kiln__str_printf(s, "\"%d.%d\"", driver / 1000, driver % 1000 / 10);
    else kiln__str_puts(s, "null");
}

int cli_info_json(const cli_global *g)
{
    kiln__str s = {0};
    kiln__err e = {{0}};
    int rc = CLI_OK, count = 0;
    kiln__str_puts(&s, "{\"version\": ");
    cli_json_str(&s, kiln_version());
    kiln__str_puts(&s, ", \"nvrtc\": ");
    cli_json_str(&s, kiln_nvrtc_version());
    kiln__str_printf(&s, ", \"key_format\": %d, \"cache_schema\": %d, ", KILN__FORMAT_VERSION,
                     KILN__CACHE_SCHEMA_VERSION);
    devices_json(&s);
    const char *const *archs = kiln__arch_all(&count);
    kiln__str_puts(&s, ", \"archs\": [");
    for (int i = 0; i < count; i++) {
        if (i) kiln__str_puts(&s, ", ");
        cli_json_str(&s, archs[i]);
    }
    kiln__str_puts(&s, "], \"cache\": ");
    kiln__cache *c = NULL;
    kiln__cache_stats st;
    char path[1100];
    char missing[1100];
    cli_cache_absent(g, path, sizeof path);
    if (cli_cache_open_opt(g, "info", missing, sizeof missing, &c)) {
        rc = CLI_FAIL;
    } else if (!c) {
        kiln__str_puts(&s, "{\"path\": ");
        cli_json_str(&s, path);
        kiln__str_puts(&s, ", \"exists\": false, \"missing\": ");
        cli_json_str(&s, missing);
        kiln__str_puts(&s, ", \"entries\": 0, \"cubin_bytes\": 0, \"file_bytes\": 0, "
                           "\"hits\": 0, \"misses\": 0}");
    } else if (kiln__cache_stats_get(c, &st, &e)) {
        rc = cli_fail("info", CLI_FAIL, "%s", e.msg);
    } else {
        cache_json(&s, c, &st);
    }
    kiln__cache_close(c);
    c = NULL;
    const char *bound = getenv("KILN_CACHE_MAX_BYTES");
    kiln__str_puts(&s, ", \"bound\": ");
    if (g->max_size_set) kiln__str_printf(&s, "%lld", (long long)g->max_size);
    else if (bound && *bound) cli_json_str(&s, bound);
    else kiln__str_puts(&s, "null");
    const char *strict = getenv("KILN_STRICT"), *record = getenv("KILN_RECORD");
    kiln__str_printf(&s, ", \"strict\": %s, \"record\": ",
                     strict && *strict && strcmp(strict, "0") ? "true" : "false");
    if (record && *record) cli_json_str(&s, record);
    else kiln__str_puts(&s, "null");
    const char *base = g->base_dir ? g->base_dir : getenv("KILN_BASE_CACHE_DIR");
    kiln__str_puts(&s, ", \"base_cache\": ");
    if (!base || !*base) {
        kiln__str_puts(&s, "null");
    } else if (kiln__cache_open_ex(base, KILN__CACHE_RDONLY, &c, &e)) {
        rc = cli_fail("info", CLI_FAIL, "base cache: %s", e.msg);
    } else if (kiln__cache_stats_get(c, &st, &e)) {
        rc = cli_fail("info", CLI_FAIL, "base cache: %s", e.msg);
    } else {
        cache_json(&s, c, &st);
    }
    kiln__cache_close(c);
    kiln__str_puts(&s, "}\n");
    if (rc) {
        kiln__str_free(&s);
        return rc;
    }
    return cli_json_print("info", &s);
}

/* ---- ls filters ------------------------------------------------------------------------------ */

int cli_ls_filter_init(cli_ls_filter *f, const char *arch, const char *op, const char *spec,
                       const char *limit)
{
    memset(f, 0, sizeof *f);
    f->limit = -1;
    if (arch) {
        int rc = cli_archs_parse("ls", arch, &f->archs);
        if (rc) return rc;
        if (f->archs.native)
            return cli_fail("ls", CLI_USAGE,
                            "--arch native: name the archs (ls never asks the GPU)");
        f->by_arch = 1;
    }
    if (op) {
        if (!*op || strpbrk(op, " ="))
            return cli_fail("ls", CLI_USAGE,
                            "--op '%s': expected an op name (decode, prefill, merge)", op);
        snprintf(f->op, sizeof f->op, "op=%s ", op);
    }
    f->spec = spec;
    if (limit && cli_long("ls", "--limit", limit, 0, 1L << 30, &f->limit)) return CLI_USAGE;
    return 0;
}

int cli_ls_filter_keep(cli_ls_filter *f, const kiln__entry *en)
{
    int keep = !f->by_arch;
    for (int i = 0; !keep && i < f->archs.n; i++) keep = !strcmp(f->archs.a[i], en->arch);
    if (keep && f->op[0]) keep = !strncmp(en->spec, f->op, strlen(f->op));
    if (keep && f->spec) keep = strstr(en->spec, f->spec) != NULL;
    if (keep && f->limit >= 0) keep = f->shown < f->limit;
    if (keep) f->shown++;
    return keep;
}

/* ---- completion ------------------------------------------------------------------------------ */

/* The options a command's usage text names, each once, space-separated, into s: those of its
 * synopsis (the lines before the first blank one) and those that begin an indented line of
 * the option list ("  --json   ..."); options merely mentioned in the prose are not its own. */
static void usage_options(kiln__str *s, const char *usage)
{
    char words[64][32];
    int n = 0, synopsis = 1;
    for (const char *line = usage; *line && n < 64;) {
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        if (len == 0) synopsis = 0;
        const char *lead = line + strspn(line, " ");
        for (const char *p = line; p < line + len && n < 64; p++) {
            if (p[0] != '-' || p[1] != '-' || (p > line && strchr(" [|(", p[-1]) == NULL)) continue;
            if (!synopsis && p != lead) continue;
            size_t w = 2;
            while ((p[w] >= 'a' && p[w] <= 'z') || (p[w] >= '0' && p[w] <= '9') || p[w] == '-') w++;
            if (w < 3 || w >= sizeof words[0]) continue;
            snprintf(words[n], sizeof words[0], "%.*s", (int)w, p);
            int dup = 0;
            for (int i = 0; i < n && !dup; i++) dup = !strcmp(words[i], words[n]);
            if (dup) continue;
            kiln__str_printf(s, "%s%s", n ? " " : "", words[n]);
            n++;
        }
        line += len + (eol != NULL);
    }
}

/* Text for a single-quoted shell word: ' becomes '\''. */
static void sh_quoted(kiln__str *s, const char *t)
{
    for (; *t; t++) {
        if (*t == '\'') kiln__str_puts(s, "'\\''");
        else kiln__str_add(s, t, 1);
    }
}

/* "sm_80 sm_86 ... all native" into s (NVRTC's list when it loads, else just the keywords). */
static void arch_words(kiln__str *s)
{
    int count = 0;
    const char *const *all = kiln__arch_all(&count);
    for (int i = 0; i < count; i++) kiln__str_printf(s, "%s ", all[i]);
    kiln__str_puts(s, "all native");
}

#define GLOBAL_OPTS "--cache --base-cache --max-size --help --version"

/* One shell case per command of the table: "    NAME) opts=" open, its options, close. */
static void command_cases(kiln__str *s, const cli_cmd *cmds, int n, const char *open,
                          const char *close)
{
    for (int i = 0; i < n; i++) {
        kiln__str_printf(s, "    %s) opts=%s", cmds[i].name, open);
        usage_options(s, cmds[i].usage);
        kiln__str_puts(s, close);
    }
}

/* Options whose value is a path, and those whose value is an arch list. */
#define FILE_OPTS "--cache|--base-cache|--cubin|--spec-file"
#define ARCH_OPTS "--arch"

static void completion_bash(kiln__str *s, const cli_cmd *cmds, int n)
{
    kiln__str_puts(
        s, "# bash completion for kiln — generated by `kiln completion bash`; do not edit.\n"
           "# Load it with: source <(kiln completion bash)\n"
           "_kiln() {\n"
           "    local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
           "    local cmd=\"\" i\n"
           "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
           "        case \"${COMP_WORDS[i]}\" in\n"
           "        --cache|--base-cache|--max-size) ((i++)) ;;\n"
           "        -*) ;;\n"
           "        *) cmd=\"${COMP_WORDS[i]}\"; break ;;\n"
           "        esac\n"
           "    done\n"
           "    case \"$prev\" in\n"
           "    " FILE_OPTS ") COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
           "    " ARCH_OPTS ") COMPREPLY=($(compgen -W '");
    arch_words(s);
    kiln__str_puts(s, "' -- \"$cur\")); return ;;\n"
                      "    esac\n"
                      "    local cmds='");
    for (int i = 0; i < n; i++) kiln__str_printf(s, "%s%s", i ? " " : "", cmds[i].name);
    kiln__str_puts(s, "'\n"
                      "    if [[ -z $cmd ]]; then\n"
                      "        if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W '" GLOBAL_OPTS
                      "' -- \"$cur\"))\n"
                      "        else COMPREPLY=($(compgen -W \"$cmds\" -- \"$cur\")); fi\n"
                      "        return\n"
                      "    fi\n"
                      "    local opts=''\n"
                      "    case \"$cmd\" in\n");
    command_cases(s, cmds, n, "'", "' ;;\n");
    kiln__str_puts(s, "    esac\n"
                      "    if [[ $cur == -* ]]; then\n"
                      "        COMPREPLY=($(compgen -W \"$opts " GLOBAL_OPTS "\" -- \"$cur\"))\n"
                      "    elif [[ $cmd == help ]]; then\n"
                      "        COMPREPLY=($(compgen -W \"$cmds\" -- \"$cur\"))\n"
                      "    elif [[ $cmd == completion ]]; then\n"
                      "        COMPREPLY=($(compgen -W 'bash zsh' -- \"$cur\"))\n"
                      "    else\n"
                      "        COMPREPLY=($(compgen -f -- \"$cur\"))\n"
                      "    fi\n"
                      "}\n"
                      "complete -F _kiln kiln\n");
}

static void completion_zsh(kiln__str *s, const cli_cmd *cmds, int n)
{
    kiln__str_puts(s,
                   "#compdef kiln\n"
                   "# zsh completion for kiln — generated by `kiln completion zsh`; do not edit.\n"
                   "# Put it in a directory of $fpath as _kiln, or: source <(kiln completion zsh)\n"
                   "_kiln() {\n"
                   "    local -a cmds opts\n"
                   "    cmds=(\n");
    for (int i = 0; i < n; i++) {
        kiln__str_printf(s, "        '%s:", cmds[i].name);
        kiln__str str = {0};
        for (const char *p = cmds[i].summary; *p; p++) /* ':' separates name and text */
            kiln__str_puts(&str, *p == ':' ? "\\:" : (char[2]){*p, 0});
        sh_quoted(s, str.p ? str.p : "");
        kiln__str_free(&str);
        kiln__str_puts(s, "'\n");
    }
    kiln__str_puts(s, "    )\n"
                      "    local cmd='' i\n"
                      "    for ((i = 2; i < CURRENT; i++)); do\n"
                      "        case ${words[i]} in\n"
                      "        --cache|--base-cache|--max-size) ((i++)) ;;\n"
                      "        -*) ;;\n"
                      "        *) cmd=${words[i]}; break ;;\n"
                      "        esac\n"
                      "    done\n"
                      "    case ${words[CURRENT-1]} in\n"
                      "    " FILE_OPTS ") _files; return ;;\n"
                      "    " ARCH_OPTS ") compadd -- ");
    arch_words(s);
    kiln__str_puts(s, "; return ;;\n"
                      "    esac\n"
                      "    if [[ -z $cmd ]]; then\n"
                      "        if [[ ${words[CURRENT]} == -* ]]; then compadd -- " GLOBAL_OPTS "\n"
                      "        else _describe 'kiln command' cmds; fi\n"
                      "        return\n"
                      "    fi\n"
                      "    case $cmd in\n");
    command_cases(s, cmds, n, "(", ") ;;\n");
    kiln__str_puts(s,
                   "    esac\n"
                   "    if [[ ${words[CURRENT]} == -* ]]; then compadd -- $opts " GLOBAL_OPTS "\n"
                   "    elif [[ $cmd == help ]]; then _describe 'kiln command' cmds\n"
                   "    elif [[ $cmd == completion ]]; then compadd -- bash zsh\n"
                   "    else _files; fi\n"
                   "}\n"
                   "if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then _kiln \"$@\"; "
                   "else compdef _kiln kiln; fi\n");
}

int cli_cmd_completion(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    int npos = 0;
    const cli_opt opts[] = {{NULL, NULL, NULL}};
    int rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    if (npos != 1 || (strcmp(argv[0], "bash") && strcmp(argv[0], "zsh")))
        return cli_fail(cmd->name, CLI_USAGE, "expected 'bash' or 'zsh'");
    kiln__str s = {0};
    if (!strcmp(argv[0], "bash")) completion_bash(&s, g->commands, g->ncommands);
    else completion_zsh(&s, g->commands, g->ncommands);
    return cli_json_print(cmd->name, &s);
}
