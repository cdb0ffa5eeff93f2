/*
 * cli_common.c — the helpers every `kiln` command shares (declared in cli.h): error lines, the
 * option parser and the global options, whole numbers, specs from words, arch lists, opening a
 * context or the cache directly, a variant's key, and clock and time stamps. kiln.c is the
 * dispatch and the usage texts; the commands live in the other cli_*.c files.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "jit.h"

int cli_fail(const char *cmd, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

/* The option of opts named by word ("--arch" or "--arch=..."); *inline_val gets the text after
 * '=' if any. */
static const cli_opt *match_opt(const cli_opt *opts, const char *word, const char **inline_val)
{
    *inline_val = NULL;
    const char *eq = strchr(word, '=');
    size_t n = eq ? (size_t)(eq - word) : strlen(word);
    for (const cli_opt *o = opts; o->name; o++) {
        if (strlen(o->name) == n && !strncmp(o->name, word, n)) {
            if (eq) *inline_val = eq + 1;
            return o;
        }
    }
    return NULL;
}

int cli_global_set(cli_global *g, const char *name, const char *val)
{
    if (!strcmp(name, "--cache")) {
        g->cache_dir = val;
    } else if (!strcmp(name, "--base-cache")) {
        g->base_dir = val;
    } else if (!strcmp(name, "--max-size")) {
        kiln__err e = {{0}};
        if (kiln__cache_parse_size(val, &g->max_size, &e)) {
            fprintf(stderr, "kiln: --max-size: %s\n", e.msg);
            return CLI_USAGE;
        }
        g->max_size_set = 1;
    } else {
        fprintf(stderr, "kiln: unknown option '%s' (see kiln --help)\n", name);
        return CLI_USAGE;
    }
    return 0;
}

int cli_parse(cli_global *g, const cli_cmd *cmd, int argc, char **argv, const cli_opt *opts,
              int *npos)
{
    static const cli_opt global_opts[] = {{"--cache", NULL, NULL},
                                          {"--base-cache", NULL, NULL},
                                          {"--max-size", NULL, NULL},
                                          {NULL, NULL, NULL}};
    int n = 0, only_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *w = argv[i];
        if (only_pos || w[0] != '-' || !strcmp(w, "-")) {
            argv[n++] = argv[i];
            continue;
        }
        if (!strcmp(w, "--")) {
            only_pos = 1;
            continue;
        }
        if (!strcmp(w, "-h") || !strcmp(w, "--help")) {
            fputs(cmd->usage, stdout);
            return -1;
        }
        const char *val = NULL;
        const cli_opt *o = match_opt(opts, w, &val);
        const cli_opt *go = o ? NULL : match_opt(global_opts, w, &val);
        if (!o && !go)
            return cli_fail(cmd->name, CLI_USAGE, "unknown option '%s' (see kiln %s --help)", w,
                            cmd->name);
        int takes_arg = go || o->value;
        if (!takes_arg && val)
            return cli_fail(cmd->name, CLI_USAGE, "option %s takes no value", o->name);
        if (takes_arg && !val) {
            if (i + 1 >= argc)
                return cli_fail(cmd->name, CLI_USAGE, "option %s needs a value",
                                go ? go->name : o->name);
            val = argv[++i];
        }
        if (go) {
            int rc = cli_global_set(g, go->name, val);
            if (rc) return rc;
        } else if (o->value) *o->value = val;
        else *o->flag = 1;
    }
    *npos = n;
    return 0;
}

int cli_parse_opts(cli_global *g, const cli_cmd *cmd, int argc, char **argv, const cli_opt *opts,
                   int *status)
{
    int npos = 0, rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) *status = rc < 0 ? CLI_OK : rc;
    else if (npos) *status = cli_fail(cmd->name, CLI_USAGE, "unexpected argument '%s'", argv[0]);
    return rc || npos;
}

int cli_parse_words(cli_global *g, const cli_cmd *cmd, int argc, char **argv, const cli_opt *opts,
                    const char *missing, int *npos, int *status)
{
    int rc = cli_parse(g, cmd, argc, argv, opts, npos);
    if (rc) *status = rc < 0 ? CLI_OK : rc;
    else if (*npos == 0) *status = cli_fail(cmd->name, CLI_USAGE, "%s", missing);
    return rc || *npos == 0;
}

int cli_long(const char *cmd, const char *opt, const char *s, long min, long max, long *out)
{
    char *end = NULL;
    long x = s && *s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || x < min || x > max)
        return cli_fail(cmd, CLI_USAGE, "%s '%s': expected a whole number in [%ld, %ld]", opt,
                        s ? s : "", min, max);
    *out = x;
    return 0;
}

int cli_spec(const char *cmd, int n, char **words, kiln_variant *v, char *canon, size_t cap)
{
    kiln__str s = {0};
    for (int i = 0; i < n; i++) {
        if (i) kiln__str_puts(&s, " ");
        kiln__str_puts(&s, words[i]);
    }
    kiln__str_puts(&s, "");
    if (s.oom) return cli_fail(cmd, CLI_FAIL, "out of memory");
    kiln__err e = {{0}};
    kiln_status st = kiln__spec_parse(s.p, v, &e);
    if (!st) st = kiln__variant_check(v, &e);
    kiln__str_free(&s);
    if (st) return cli_fail(cmd, CLI_USAGE, "%s", e.msg);
    if (!kiln__spec_format(v, canon, cap, &e)) return cli_fail(cmd, CLI_USAGE, "%s", e.msg);
    return 0;
}

/* Append arch to a unless already there; its index into *idx (may be NULL). */
static int arch_add(cli_archs *a, const char *arch, int *idx, char *msg, size_t cap)
{
    for (int i = 0; i < a->n; i++) {
        if (strcmp(a->a[i], arch) != 0) continue;
        if (idx) *idx = i;
        return 0;
    }
    if (a->n >= CLI_ARCH_MAX) {
        snprintf(msg, cap, "more than %d archs", CLI_ARCH_MAX);
        return CLI_USAGE;
    }
    if (idx) *idx = a->n;
    snprintf(a->a[a->n++], sizeof a->a[0], "%s", arch);
    return 0;
}

int cli_archs_add(const char *list, cli_archs *out, int *idx, int *nidx, char *msg, size_t cap)
{
    const char *p = list;
    if (nidx) *nidx = 0;
    for (;;) {
        size_t n = strcspn(p, ",");
        char word[64];
        if (n == 0 || n >= sizeof word) {
            snprintf(msg, cap, "arch list '%s': expected names separated by commas", list);
            return CLI_USAGE;
        }
        memcpy(word, p, n);
        word[n] = 0;
        const char *names[CLI_ARCH_MAX];
        int count = 1;
        char norm[16];
        if (!strcmp(word, "native")) {
            out->native = 1;
            names[0] = "";
        } else if (!strcmp(word, "all")) {
            const char *const *all = kiln__arch_all(&count);
            if (count == 0) {
                snprintf(msg, cap, "arch all: NVRTC reports no arch kiln supports");
                return CLI_FAIL;
            }
            for (int i = 0; i < count && i < CLI_ARCH_MAX; i++) names[i] = all[i];
            if (count > CLI_ARCH_MAX) count = CLI_ARCH_MAX;
        } else {
            kiln__err e = {{0}};
            /* a name NVRTC cannot compile for is bad input too, found before any work */
            if (kiln__arch_normalize(word, norm, &e) || kiln__arch_offered(norm, &e)) {
                snprintf(msg, cap, "%s", e.msg);
                return CLI_USAGE;
            }
            names[0] = norm;
        }
        for (int i = 0; i < count; i++) {
            int at = 0, rc = arch_add(out, names[i], &at, msg, cap);
            if (rc) return rc;
            if (!idx || !nidx) continue;
            int seen = 0;
            for (int j = 0; j < *nidx; j++) seen |= idx[j] == at;
            if (!seen && *nidx < CLI_ARCH_MAX) idx[(*nidx)++] = at;
        }
        if (!p[n]) break;
        p += n + 1;
    }
    return 0;
}

int cli_archs_parse(const char *cmd, const char *list, cli_archs *out)
{
    memset(out, 0, sizeof *out);
    char msg[1024];
    int rc = cli_archs_add(list ? list : "native", out, NULL, NULL, msg, sizeof msg);
    if (rc) {
        if (!strncmp(msg, "arch list", 9)) return cli_fail(cmd, rc, "--%s", msg);
        return cli_fail(cmd, rc, "%s", msg);
    }
    return 0;
}

int cli_archs_resolve(const char *cmd, kiln_ctx *ctx, cli_archs *a)
{
    if (!a->native) return 0;
    kiln_device_info di;
    if (kiln_ctx_device(ctx, &di) || !di.present || !di.arch[0])
        return cli_fail(cmd, CLI_USAGE, "%s", CLI_NO_GPU_MSG);
    cli_archs old = *a;
    a->n = 0;
    a->native = 0;
    char msg[256];
    for (int i = 0; i < old.n; i++)
        arch_add(a, old.a[i][0] ? old.a[i] : di.arch, NULL, msg, sizeof msg);
    return 0;
}

int cli_ctx_open(const cli_global *g, const char *cmd, int no_device, kiln_ctx **out)
{
    kiln_ctx_opts o = {0};
    o.cache_dir = g->cache_dir;
    o.base_cache_dir = g->base_dir;
    o.max_cache_bytes = g->max_size_set && g->max_size == 0 ? 1 : g->max_size;
    o.no_device = no_device;
    kiln_status st = kiln_ctx_create(&o, out);
    if (st) return cli_fail(cmd, CLI_FAIL, "%s", kiln_errmsg());
    return 0;
}

int cli_cache_open_opt(const cli_global *g, const char *cmd, char *missing, size_t cap,
                       kiln__cache **out)
{
    char dir[1024];
    kiln__err e = {{0}};
    *out = NULL;
    if (g->cache_dir) snprintf(dir, sizeof dir, "%s", g->cache_dir);
    else if (kiln__cache_default_dir(dir, sizeof dir, &e))
        return cli_fail(cmd, CLI_FAIL, "%s", e.msg);
    /* a database file names itself (merge and export outputs, shipped files) */
    struct stat sb;
    int flags = stat(dir, &sb) == 0 && S_ISREG(sb.st_mode) ? KILN__CACHE_FILE : 0;
    kiln_status st = kiln__cache_open_ex(dir, flags | KILN__CACHE_EXISTING, out, &e);
    if (st == KILN_STATUS_NOT_FOUND && missing) {
        snprintf(missing, cap, "%s", e.msg);
        return 0;
    }
    if (st) return cli_fail(cmd, CLI_FAIL, "%s", e.msg);
    return 0;
}

int cli_cache_open(const cli_global *g, const char *cmd, kiln__cache **out)
{
    return cli_cache_open_opt(g, cmd, NULL, 0, out);
}

const char *cli_family(const char *source, const char *spec, const char *arch, char *why,
                       size_t cap)
{
    why[0] = 0;
    const char *family = kiln__source_family(source);
    kiln_variant v;
    if (!strcmp(family, "simt")) { /* a decode on CUDA cores: why not on tensor cores */
        if (spec && kiln_variant_parse(spec, &v) == KILN_STATUS_OK) {
            const char *r = kiln__decode_pack_refusal(&v);
            snprintf(why, cap, "not tensor cores: %s", r ? r : "KILN_TUNE pack=0");
        }
        return family;
    }
    if (strcmp(family, "mma.sync")) return family;
    if (spec && arch && kiln_variant_parse(spec, &v) == KILN_STATUS_OK && v.op == KILN_OP_PREFILL) {
        int can;
        const char *r = kiln__wgmma_refusal(&v, kiln__arch_sm(arch), &can);
        snprintf(why, cap, "not wgmma: %s", r ? r : "KILN_TUNE wgmma=0");
    }
    return "mma.sync";
}

int cli_key(const kiln_variant *v, const char *arch, char key[33])
{
    kiln__config cfg;
    kiln__err e = {{0}};
    char *material = NULL;
    key[0] = 0;
    if (kiln__config_pick(v, kiln__arch_sm(arch), &cfg, &e) ||
        kiln__key_material(v, &cfg, arch, &material, &e))
        return -1;
    kiln__key_hash(material, key);
    free(material);
    return 0;
}

double cli_now_ms(void) { return (double)kiln__now_ns() / 1e6; }

void cli_iso_time(int64_t t, char out[32])
{
    struct tm tm;
    time_t tt = (time_t)t;
    if (t <= 0 || !gmtime_r(&tt, &tm) || !strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(out, 32, "-");
}
