/*
 * cli_cmds.c — the `kiln` commands that work on one kernel or on the cache: info, compile,
 * ls, show, rm and check. (warm is in cli_warm.c; stats, clear, completion, the JSON writer and
 * the ls filters in cli_report.c; dispatch, usage and shared helpers in
 * kiln.c.) ls, show-by-key and rm open the cache directly and never touch the driver; compile
 * and show-by-spec go through a context, compile-only when every arch is named.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#include "check.h"
#include "check_batch.h"
#include "cli.h"
#include "jit.h"

/* Most kv lengths one `kiln check` runs. */
#define CHECK_KV_MAX 64

/* ---- info ----------------------------------------------------------------------------------- */

/* Open a cache-less context on device `ordinal`. Returns 1 with *di filled when it has a GPU,
 * 0 for a compile-only context, -1 when the device is unusable, -2 when it does not exist;
 * why[cap] gets the reason for anything but 1. */
static int probe_device(int ordinal, kiln_device_info *di, char *why, size_t cap)
{
    kiln_ctx_opts o = {0};
    o.no_cache = 1;
    o.device = ordinal;
    kiln_ctx *ctx = NULL;
    memset(di, 0, sizeof *di);
    kiln_status st = kiln_ctx_create(&o, &ctx);
    if (st) {
        snprintf(why, cap, "%s", kiln_errmsg());
        return st == KILN_STATUS_INVALID_ARGUMENT ? -2 : -1;
    }
    kiln_ctx_device(ctx, di);
    if (!di->present) snprintf(why, cap, "%s", kiln_ctx_errmsg(ctx));
    kiln_ctx_destroy(ctx);
    return di->present;
}

/* Print the driver and one line per GPU (when out is non-NULL); return the usable GPUs. */
static int list_devices(FILE *out)
{
    int usable = 0;
    for (int ord = 0; ord < CLI_ARCH_MAX; ord++) {
        kiln_device_info di;
        char why[1024] = "";
        int r = probe_device(ord, &di, why, sizeof why);
        if (r == 0 || r == -2) {
            if (out && ord == 0) {
                fprintf(out, "driver: none\n");
                fprintf(out, "gpu: none (compile-only: %s)\n", why);
            }
            break;
        }
        if (r < 0) {
            if (out) fprintf(out, "gpu %d: unusable: %s\n", ord, why);
            continue;
        }
        if (out && usable == 0)
            fprintf(out, "driver: CUDA %d.%d\n", di.driver_version / 1000,
                    di.driver_version % 1000 / 10);
        if (out)
            fprintf(out, "gpu %d: %s, sm_%d, %d SMs, arch %s\n", di.ordinal, di.name, di.sm,
                    di.sm_count, di.arch);
        usable++;
    }
    return usable;
}

/* Print one cache's lines ("cache" or "base cache"). */
static int print_one_cache(kiln__cache *c, const char *label)
{
    kiln__cache_stats s;
    kiln__err e = {{0}};
    const char *why = NULL;
    int ro = kiln__cache_readonly(c, &why);
    printf("%s: %s (schema %d%s%s)\n", label, kiln__cache_path(c), kiln__cache_schema(c),
           ro ? ", read-only: " : "", ro ? why : "");
    if (kiln__cache_stats_get(c, &s, &e)) return cli_fail("info", CLI_FAIL, "%s", e.msg);
    printf("%s entries: %lld (%lld bytes of cubins; file %lld bytes)\n", label,
           (long long)s.entries, (long long)s.bytes, (long long)s.file_bytes);
    printf("%s hits: %lld, misses: %lld\n", label, (long long)s.hits, (long long)s.misses);
    return CLI_OK;
}

/* The local cache, its policy (bound, strict, record) and the base cache. */
static int print_cache_stats(const cli_global *g)
{
    kiln__cache *c = NULL;
    char missing[1100];
    if (cli_cache_open_opt(g, "info", missing, sizeof missing, &c)) return CLI_FAIL;
    int rc = CLI_OK;
    if (c) rc = print_one_cache(c, "cache");
    else printf("cache: none (%s)\n", missing); /* info creates nothing */
    kiln__cache_close(c);
    const char *bound = getenv("KILN_CACHE_MAX_BYTES");
    if (g->max_size_set) printf("cache bound: %lld bytes (--max-size)\n", (long long)g->max_size);
    else if (bound && *bound) printf("cache bound: %s (KILN_CACHE_MAX_BYTES)\n", bound);
    else printf("cache bound: none\n");
    const char *strict = getenv("KILN_STRICT"), *record = getenv("KILN_RECORD");
    printf("mode: %s%s%s\n",
           strict && *strict && strcmp(strict, "0") ? "strict (KILN_STRICT)" : "compile on a miss",
           record && *record ? ", recording to " : "", record && *record ? record : "");
    const char *base = g->base_dir ? g->base_dir : getenv("KILN_BASE_CACHE_DIR");
    if (!base || !*base) {
        printf("base cache: none\n");
        return rc;
    }
    kiln__err e = {{0}};
    if (kiln__cache_open_ex(base, KILN__CACHE_RDONLY, &c, &e))
        return cli_fail("info", CLI_FAIL, "base cache: %s", e.msg);
    if (print_one_cache(c, "base cache")) rc = CLI_FAIL;
    kiln__cache_close(c);
    return rc;
}

int cli_cmd_info(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    int gpu_count = 0, json = 0, npos = 0;
    const cli_opt opts[] = {{"--gpu-count", NULL, &gpu_count},
                            {"--json", NULL, &json},
                            {NULL, NULL, NULL}};
    int rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    if (npos) return cli_fail(cmd->name, CLI_USAGE, "unexpected argument '%s'", argv[0]);
    if (gpu_count) {
        printf("%d\n", list_devices(NULL));
        return CLI_OK;
    }
    if (json) return cli_info_json(g);
    printf("kiln %s\n", kiln_version());
    printf("nvrtc %s\n", kiln_nvrtc_version());
    list_devices(stdout);
    int count = 0;
    const char *const *archs = kiln__arch_all(&count);
    printf("archs:");
    for (int i = 0; i < count; i++) printf(" %s", archs[i]);
    printf("%s\n", count ? "" : " none (NVRTC lists no arch >= sm_80)");
    return print_cache_stats(g);
}

/* ---- compile -------------------------------------------------------------------------------- */

/* Compile v for arch and print its line; CLI_FAIL after printing the reason. */
static int compile_one(kiln_ctx *ctx, const kiln_variant *v, const char *arch)
{
    kiln_kernel *k = NULL;
    kiln_kernel_info ki;
    double t0 = cli_now_ms();
    kiln_status st = kiln_kernel_compile(ctx, v, arch, &k);
    double ms = cli_now_ms() - t0;
    if (st) return cli_fail("compile", CLI_FAIL, "%s", kiln_ctx_errmsg(ctx));
    if (kiln_kernel_describe(k, &ki)) return cli_fail("compile", CLI_FAIL, "%s", kiln_errmsg());
    char regs[16] = "-";
    if (ki.registers >= 0) snprintf(regs, sizeof regs, "%d", ki.registers);
    printf("%s %s %s %.1f ms regs=%s smem=%d spill=%d %s\n", ki.key, ki.arch,
           ki.from_cache ? "cached" : "compiled", ms, regs, ki.smem_bytes, ki.spill_bytes, ki.spec);
    fflush(stdout);
    return CLI_OK;
}

int cli_cmd_compile(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    const char *arch = NULL;
    int npos = 0;
    const cli_opt opts[] = {{"--arch", &arch, NULL}, {NULL, NULL, NULL}};
    int rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    if (npos == 0) return cli_fail(cmd->name, CLI_USAGE, "missing SPEC (see kiln compile --help)");
    kiln_variant v;
    char canon[KILN__SPEC_MAX];
    cli_archs a;
    if ((rc = cli_spec(cmd->name, npos, argv, &v, canon, sizeof canon))) return rc;
    if ((rc = cli_archs_parse(cmd->name, arch, &a))) return rc;
    kiln_ctx *ctx = NULL;
    if ((rc = cli_ctx_open(g, cmd->name, !a.native, &ctx))) return rc;
    if (!(rc = cli_archs_resolve(cmd->name, ctx, &a)))
        for (int i = 0; i < a.n; i++)
            if (compile_one(ctx, &v, a.a[i])) rc = CLI_FAIL;
    kiln_ctx_destroy(ctx);
    return rc;
}

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
        char b[3][KILN__SPEC_MAX]; /* texts from the row, escaped (tools/cli_safe.c) */
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
    int npos = 0;
    const char *arch = NULL, *op = NULL, *spec = NULL, *limit = NULL;
    const cli_opt opts[] = {{"--json", NULL, &s.json}, {"--arch", &arch, NULL},
                            {"--op", &op, NULL},       {"--spec", &spec, NULL},
                            {"--limit", &limit, NULL}, {NULL, NULL, NULL}};
    int rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    if (npos) return cli_fail(cmd->name, CLI_USAGE, "unexpected argument '%s'", argv[0]);
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

/* ---- show ----------------------------------------------------------------------------------- */

/* What show prints, from a cache row or from a kernel. Strings are borrowed. */
typedef struct view {
    const char *key, *arch, *spec, *nvrtc, *source, *log, *material;
    const void *cubin;
    size_t cubin_size;
    int regs, smem, spill, stack;
    double compile_ms;
    int have_row; /* created, last_used, hits are known */
    int64_t created, last_used, hits;
} view;

typedef struct show_opts {
    const char *arch, *cubin_file;
    int source, log, material, sass;
} show_opts;

/* The disassembler: $KILN_CUOBJDUMP, else cuobjdump on PATH or in $CUDA_HOME/bin or
 * /usr/local/cuda/bin. Writes the command into out; 0 when none is found. */
static int find_cuobjdump(char *out, size_t cap)
{
    const char *env = getenv("KILN_CUOBJDUMP");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return access(env, X_OK) == 0;
    }
    const char *home = getenv("CUDA_HOME");
    char cand[3][1024];
    int n = 0;
    if (home && *home) snprintf(cand[n++], sizeof cand[0], "%s/bin/cuobjdump", home);
    snprintf(cand[n++], sizeof cand[0], "/usr/local/cuda/bin/cuobjdump");
    for (int i = 0; i < n; i++)
        if (access(cand[i], X_OK) == 0) {
            snprintf(out, cap, "%s", cand[i]);
            return 1;
        }
    const char *path = getenv("PATH");
    while (path && *path) {
        const char *colon = strchr(path, ':');
        size_t len = colon ? (size_t)(colon - path) : strlen(path);
        snprintf(out, cap, "%.*s/cuobjdump", (int)len, path);
        if (len && access(out, X_OK) == 0) return 1;
        path = colon ? colon + 1 : NULL;
    }
    return 0;
}

/* Disassemble the cubin with cuobjdump -sass (a temporary file; nothing else is run). */
static int print_sass(const view *w)
{
    char tool[1024];
    if (!find_cuobjdump(tool, sizeof tool))
        return cli_fail(
            "show", CLI_FAIL,
            "--sass needs cuobjdump (the CUDA toolkit's; not found on PATH, in $CUDA_HOME/bin "
            "or /usr/local/cuda/bin); set KILN_CUOBJDUMP, or write the cubin with --cubin");
    char tmp[] = "/tmp/kiln-sass-XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0)
        return cli_fail("show", CLI_FAIL, "cannot create a temporary file: %s", strerror(errno));
    ssize_t wr = write(fd, w->cubin, w->cubin_size);
    close(fd);
    if (wr != (ssize_t)w->cubin_size) {
        unlink(tmp);
        return cli_fail("show", CLI_FAIL, "cannot write %s: %s", tmp, strerror(errno));
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(tool, tool, "-sass", tmp, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    unlink(tmp);
    if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return cli_fail("show", CLI_FAIL, "%s -sass failed on the cubin of %s (%s)", tool, w->key,
                        w->arch);
    return CLI_OK;
}

/* Write the cubin to the new file `file`: never the cache c itself, never over a file. */
static int write_cubin(const char *file, const view *w, int quiet, const kiln__cache *c)
{
    int fd = -1, rc = cli_output_open("show", file, c, &fd);
    if (rc) return rc;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        return cli_fail("show", CLI_FAIL, "cannot open %s: %s", file, strerror(errno));
    }
    size_t n = fwrite(w->cubin, 1, w->cubin_size, f);
    int bad = n != w->cubin_size;
    if (fclose(f) != 0) bad = 1;
    if (bad) return cli_fail("show", CLI_FAIL, "cannot write %s: %s", file, strerror(errno));
    if (!quiet) printf("wrote %zu bytes of cubin (%s, %s) to %s\n", n, w->key, w->arch, file);
    return CLI_OK;
}

static int view_print(const view *w, const show_opts *o, const kiln__cache *c)
{
    if (o->source) cli_put_text(stdout, w->source);
    if (o->log) cli_put_text(stdout, w->log);
    if (o->material) cli_put_text(stdout, w->material);
    if (o->sass) {
        int rc = print_sass(w);
        if (rc) return rc;
    }
    int texts = o->source || o->log || o->material || o->sass;
    if (o->cubin_file) return write_cubin(o->cubin_file, w, texts, c);
    if (texts) return CLI_OK;
    char created[32] = "-", last[32] = "-";
    if (w->have_row) {
        cli_iso_time(w->created, created);
        cli_iso_time(w->last_used, last);
    }
    char b[4][KILN__SPEC_MAX]; /* labels from a row: escaped (tools/cli_safe.c) */
    printf("key:         %s\n", cli_safe(w->key, b[0], sizeof b[0]));
    printf("arch:        %s\n", cli_safe(w->arch, b[1], sizeof b[1]));
    printf("spec:        %s\n", cli_safe(w->spec, b[2], sizeof b[2]));
    printf("nvrtc:       %s\n", cli_safe(w->nvrtc, b[3], sizeof b[3]));
    if (w->regs >= 0) printf("registers:   %d\n", w->regs);
    else
        printf(
            "registers:   -\n"); /* ptxas reported none (rows from before merge kernels' were read) */
    printf("smem:        %d bytes\n", w->smem);
    printf("spill:       %d bytes\n", w->spill);
    printf("stack:       %d bytes\n", w->stack);
    printf("cubin:       %zu bytes\n", w->cubin_size);
    printf("compile:     %.1f ms\n", w->compile_ms);
    printf("created:     %s\n", created);
    printf("last used:   %s\n", last);
    if (w->have_row) printf("hits:        %lld\n", (long long)w->hits);
    else printf("hits:        -\n");
    return CLI_OK;
}

static int show_row(kiln__cache *c, const char *key, const show_opts *o)
{
    kiln__entry en = {0};
    kiln__err e = {{0}};
    if (kiln__cache_get(c, key, 1, &en, &e)) return cli_fail("show", CLI_FAIL, "%s", e.msg);
    view w = {0};
    w.key = en.key;
    w.arch = en.arch;
    w.spec = en.spec;
    w.nvrtc = en.nvrtc;
    w.source = en.source ? en.source : "";
    w.log = en.log ? en.log : "";
    w.material = en.key_material ? en.key_material : "";
    w.cubin = en.cubin;
    w.cubin_size = en.cubin_size;
    w.regs = en.registers;
    w.smem = en.smem_bytes;
    w.spill = en.spill_bytes;
    w.stack = en.stack_bytes;
    w.compile_ms = en.compile_ms;
    w.have_row = 1;
    w.created = en.created;
    w.last_used = en.last_used;
    w.hits = en.hits;
    int rc = view_print(&w, o, c);
    kiln__entry_free(&en);
    return rc;
}

/* Fill the row stamps of a view from the cache, without counting a hit. */
static int find_stamps(const kiln__entry *en, void *user)
{
    view *w = user;
    if (strcmp(en->key, w->key) != 0) return 0;
    w->have_row = 1;
    w->created = en->created;
    w->last_used = en->last_used;
    w->hits = en->hits;
    return 1;
}

static int show_spec(cli_global *g, int n, char **words, const show_opts *o)
{
    kiln_variant v;
    char canon[KILN__SPEC_MAX];
    cli_archs a;
    int rc = cli_spec("show", n, words, &v, canon, sizeof canon);
    if (!rc) rc = cli_archs_parse("show", o->arch, &a);
    if (!rc && a.n != 1) rc = cli_fail("show", CLI_USAGE, "--arch: name exactly one arch");
    if (rc) return rc;
    kiln_ctx *ctx = NULL;
    if ((rc = cli_ctx_open(g, "show", !a.native, &ctx))) return rc;
    kiln_kernel *k = NULL;
    kiln_kernel_info ki;
    if ((rc = cli_archs_resolve("show", ctx, &a))) goto out;
    if (kiln_kernel_compile(ctx, &v, a.a[0], &k) || kiln_kernel_describe(k, &ki)) {
        rc = cli_fail("show", CLI_FAIL, "%s", kiln_ctx_errmsg(ctx));
        goto out;
    }
    view w = {0};
    w.key = ki.key;
    w.arch = ki.arch;
    w.spec = ki.spec;
    w.nvrtc = kiln_nvrtc_version();
    w.source = kiln_kernel_source(k);
    w.log = kiln_kernel_log(k);
    w.material = kiln_kernel_key_material(k);
    w.cubin = kiln_kernel_cubin(k, &w.cubin_size);
    w.regs = ki.registers;
    w.smem = ki.smem_bytes;
    w.spill = ki.spill_bytes;
    w.stack = ki.stack_bytes;
    w.compile_ms = ki.compile_ms;
    kiln__err e = {{0}};
    kiln__cache *c = NULL; /* opened after the context, which creates it */
    if ((rc = cli_cache_open(g, "show", &c))) goto out;
    kiln__cache_each(c, find_stamps, &w, &e);
    rc = view_print(&w, o, c);
    kiln__cache_close(c);
out:
    kiln_ctx_destroy(ctx);
    return rc;
}

/* 1 when s is 1..32 hex digits: a key prefix rather than a spec. */
static int is_key_prefix(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!isxdigit((unsigned char)s[n])) return 0;
    return n >= 1 && n <= 32;
}

int cli_cmd_show(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    show_opts o = {0};
    int npos = 0;
    const cli_opt opts[] = {{"--arch", &o.arch, NULL},
                            {"--source", NULL, &o.source},
                            {"--log", NULL, &o.log},
                            {"--key-material", NULL, &o.material},
                            {"--cubin", &o.cubin_file, NULL},
                            {"--sass", NULL, &o.sass},
                            {NULL, NULL, NULL}};
    int rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    if (npos == 0) return cli_fail(cmd->name, CLI_USAGE, "missing KEY-PREFIX or SPEC");
    kiln__cache *c = NULL;
    if (npos == 1 && is_key_prefix(argv[0])) {
        if ((rc = cli_cache_open(g, cmd->name, &c))) return rc;
        char key[33];
        kiln__err e = {{0}};
        kiln_status st = kiln__cache_resolve(c, argv[0], key, &e);
        if (st == KILN_STATUS_OK) rc = show_row(c, key, &o);
        else if (st == KILN_STATUS_NOT_FOUND || st == KILN_STATUS_INVALID_ARGUMENT)
            rc = cli_fail(cmd->name, CLI_USAGE, "%s", e.msg);
        else rc = cli_fail(cmd->name, CLI_FAIL, "%s", e.msg);
    } else {
        rc = show_spec(g, npos, argv, &o);
    }
    kiln__cache_close(c);
    return rc;
}

/* ---- rm ------------------------------------------------------------------------------------- */

int cli_cmd_rm(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    static const cli_opt opts[] = {{NULL, NULL, NULL}};
    int npos = 0;
    int rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    if (npos == 0) return cli_fail(cmd->name, CLI_USAGE, "missing KEY-PREFIX");
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

/* ---- check ---------------------------------------------------------------------------------- */

typedef struct check_args {
    const char *heads, *qo_len, *kv_len, *window_left, *softcap, *seed, *time;
    int strided;
    /* batches (kv=ragged|paged) and merges (op=merge) */
    const char *batch, *kv_lens, *kv_dist, *qo_lens, *qo_dist, *page_size, *fixed_split;
    int graph;
} check_args;

/* Turn the option texts into a shape template, the kv lengths and the timing reps. */
/* --seed: a whole number into *seed; CLI_USAGE (with the message printed) otherwise. */
static int parse_seed(const char *cmd, const char *text, uint64_t *seed)
{
    char *end = NULL;
    errno = 0;
    const unsigned long long x = strtoull(text, &end, 10);
    if (!*text || *end || errno || text[0] == '-')
        return cli_fail(cmd, CLI_USAGE, "--seed '%s': expected a whole number", text);
    *seed = x;
    return 0;
}

static int check_shape(const check_args *ca, const kiln_variant *v, kiln_check_shape *s,
                       long kv[CHECK_KV_MAX], int *nkv, long *reps)
{
    const char *cmd = "check";
    long g = v->group, x = 0;
    long heads = 2 * g > 8 ? 2 * g : 8; /* max(8, 2G), rounded up to a multiple of G */
    heads = (heads + g - 1) / g * g;
    int rc = 0;
    memset(s, 0, sizeof *s);
    if (ca->heads && (rc = cli_long(cmd, "--heads", ca->heads, 1, 1 << 16, &heads))) return rc;
    if (heads % g)
        return cli_fail(cmd, CLI_USAGE, "--heads %ld: not a multiple of group %ld", heads, g);
    s->num_qo_heads = (int)heads;
    s->qo_len = v->op == KILN_OP_DECODE ? 1 : 128;
    if (ca->qo_len && (rc = cli_long(cmd, "--qo-len", ca->qo_len, 1, 1 << 24, &x))) return rc;
    if (ca->qo_len && v->op != KILN_OP_DECODE) s->qo_len = (int)x;
    s->window_left = -1;
    if (ca->window_left && (rc = cli_long(cmd, "--window-left", ca->window_left, 0, 1 << 30, &x)))
        return rc;
    if (ca->window_left) s->window_left = (int)x;
    if (ca->softcap) {
        char *end = NULL;
        double cap = strtod(ca->softcap, &end);
        if (!*ca->softcap || *end || !(cap > 0 && cap < 1e30))
            return cli_fail(cmd, CLI_USAGE, "--softcap '%s': expected a number > 0", ca->softcap);
        s->softcap = (float)cap;
    }
    if (ca->seed && parse_seed(cmd, ca->seed, &s->seed)) return CLI_USAGE;
    s->strided = ca->strided;
    *reps = 0;
    if (ca->time && (rc = cli_long(cmd, "--time", ca->time, 1, 1000000, reps))) return rc;
    const char *p = ca->kv_len ? ca->kv_len : "577";
    for (*nkv = 0;;) {
        char word[32];
        size_t n = strcspn(p, ",");
        if (*nkv >= CHECK_KV_MAX)
            return cli_fail(cmd, CLI_USAGE, "more than %d kv lengths", CHECK_KV_MAX);
        snprintf(word, sizeof word, "%.*s", (int)(n < sizeof word ? n : sizeof word - 1), p);
        if (n >= sizeof word || (rc = cli_long(cmd, "--kv-len", word, 1, 1 << 30, &kv[*nkv])))
            return rc ? rc : cli_fail(cmd, CLI_USAGE, "--kv-len '%s': bad list", ca->kv_len);
        ++*nkv;
        if (!p[n]) break;
        p += n + 1;
    }
    return 0;
}

/* Print one result line (and the first mismatch). */
static void check_print(const kiln_variant *v, const kiln_check_shape *s, int mismatch,
                        const kiln_check_result *r)
{
    printf("%s H=%d L_Q=%d L_KV=%d max_err=%.3g (atol %.3g rtol %.3g) rel_l2=%.3g",
           mismatch ? "MISMATCH" : "ok", s->num_qo_heads, s->qo_len, s->kv_len, r->max_err, r->atol,
           r->rtol, r->rel_l2);
    if (v->lse) printf(" lse_err=%.3g", r->lse_max_err);
    if (r->kernel_ms > 0) {
        double sec = r->kernel_ms * 1e-3;
        printf(" time=%.4f ms, %.1f GB/s, %.2f TFLOP/s", r->kernel_ms, r->bytes / sec / 1e9,
               r->flops / sec / 1e12);
    }
    printf("\n");
    if (mismatch)
        printf("  first bad: %s (%lld of %lld elements out of tolerance)\n", r->first_bad, r->bad,
               r->checked);
    fflush(stdout);
}

/* ---- check of batches and merges ------------------------------------------------------------ */

/* Most requests one batch check runs. */
#define CHECK_BATCH_MAX 65536

/* A comma-separated list of lengths in [0, 1 << 24] into out[cap]; *n gets the count. */
static int parse_lens(const char *opt, const char *text, int *out, int cap, int *n)
{
    const char *p = text;
    for (*n = 0;;) {
        char word[32];
        long x = 0;
        size_t len = strcspn(p, ",");
        if (*n >= cap) return cli_fail("check", CLI_USAGE, "%s: more than %d lengths", opt, cap);
        if (len == 0 || len >= sizeof word)
            return cli_fail("check", CLI_USAGE, "%s '%s': bad list", opt, text);
        snprintf(word, sizeof word, "%.*s", (int)len, p);
        int rc = cli_long("check", opt, word, 0, 1 << 24, &x);
        if (rc) return rc;
        out[(*n)++] = (int)x;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

/* "uniform:LO:HI" into lo, hi. */
static int parse_dist(const char *opt, const char *text, int *lo, int *hi)
{
    char extra;
    if (sscanf(text, "uniform:%d:%d%c", lo, hi, &extra) != 2 || *lo < 0 || *hi < *lo ||
        *hi > (1 << 24))
        return cli_fail("check", CLI_USAGE,
                        "%s '%s': expected uniform:LO:HI with 0 <= LO <= HI <= %d", opt, text,
                        1 << 24);
    return 0;
}

/* Per-request lengths from --X-len N, --X-lens LIST or --X-dist uniform:LO:HI (at most one)
 * into out[B]; *batch is set from a list when still 0. */
static int batch_lens(const char *what, const char *one, const char *list, const char *dist,
                      int deflt, int *batch, uint64_t seed, int *out)
{
    char o1[32], o2[32], o3[32];
    snprintf(o1, sizeof o1, "--%s-len", what);
    snprintf(o2, sizeof o2, "--%s-lens", what);
    snprintf(o3, sizeof o3, "--%s-dist", what);
    if (!!one + !!list + !!dist > 1)
        return cli_fail("check", CLI_USAGE, "give at most one of %s, %s and %s", o1, o2, o3);
    int rc = 0, n = 0, lo = deflt, hi = deflt;
    if (list) {
        if ((rc = parse_lens(o2, list, out, CHECK_BATCH_MAX, &n))) return rc;
        if (*batch && n != *batch)
            return cli_fail("check", CLI_USAGE, "%s has %d lengths for a batch of %d", o2, n,
                            *batch);
        *batch = n;
        return 0;
    }
    if (one) {
        long x = 0;
        if ((rc = cli_long("check", o1, one, 0, 1 << 24, &x))) return rc;
        lo = hi = (int)x;
    }
    if (dist && (rc = parse_dist(o3, dist, &lo, &hi))) return rc;
    if (!*batch) *batch = 1;
    kiln_check_lens_uniform(out, *batch, lo, hi, seed);
    return 0;
}

/* Parse the batch options of `kiln check` into s (lengths in qo[], kv[] of CHECK_BATCH_MAX). */
static int batch_shape(const check_args *ca, const kiln_variant *v, kiln_check_batch *s, int *qo,
                       int *kv, long *reps)
{
    const char *cmd = "check";
    long x = 0, g = v->group;
    int rc = 0, batch = 0;
    memset(s, 0, sizeof *s);
    s->window_left = -1;
    if (ca->seed && parse_seed(cmd, ca->seed, &s->seed)) return CLI_USAGE;
    s->seed = kiln__cb_seed(s->seed);
    if (ca->batch) {
        if ((rc = cli_long(cmd, "--batch", ca->batch, 0, CHECK_BATCH_MAX, &x))) return rc;
        batch = (int)x;
    }
    long heads = 2 * g > 8 ? 2 * g : 8;
    heads = (heads + g - 1) / g * g;
    if (ca->heads && (rc = cli_long(cmd, "--heads", ca->heads, 1, 1 << 16, &heads))) return rc;
    if (heads % g)
        return cli_fail(cmd, CLI_USAGE, "--heads %ld: not a multiple of group %ld", heads, g);
    s->num_qo_heads = (int)heads;
    if (v->op == KILN_OP_MERGE) {
        s->batch = ca->batch ? batch : 100;
        return 0;
    }
    if (ca->kv_len && strchr(ca->kv_len, ','))
        return cli_fail(cmd, CLI_USAGE,
                        "--kv-len '%s': one length for every request (--kv-lens gives a list)",
                        ca->kv_len);
    if (ca->qo_len && strchr(ca->qo_len, ','))
        return cli_fail(cmd, CLI_USAGE,
                        "--qo-len '%s': one length for every request (--qo-lens gives a list)",
                        ca->qo_len);
    if (v->op == KILN_OP_DECODE && (ca->qo_len || ca->qo_lens || ca->qo_dist))
        return cli_fail(cmd, CLI_USAGE, "%s: a decode batch has one query row per request",
                        ca->qo_len    ? "--qo-len"
                        : ca->qo_lens ? "--qo-lens"
                                      : "--qo-dist");
    if ((ca->kv_lens && !ca->batch) || (ca->qo_lens && !ca->batch)) { /* B from the first list */
        int n = 0;
        if ((rc = parse_lens(ca->kv_lens ? "--kv-lens" : "--qo-lens",
                             ca->kv_lens ? ca->kv_lens : ca->qo_lens, kv, CHECK_BATCH_MAX, &n)))
            return rc;
        batch = n;
    }
    if (!ca->batch && !ca->kv_lens && !ca->qo_lens) batch = 8;
    if ((rc = batch_lens("kv", ca->kv_len, ca->kv_lens, ca->kv_dist, 577, &batch, s->seed ^ 0x6b76,
                         kv)))
        return rc;
    if (v->op == KILN_OP_PREFILL && (rc = batch_lens("qo", ca->qo_len, ca->qo_lens, ca->qo_dist,
                                                     128, &batch, s->seed ^ 0x716f, qo)))
        return rc;
    if (v->op == KILN_OP_DECODE)
        for (int b = 0; b < batch; b++) qo[b] = 1;
    s->batch = batch;
    s->qo_lens = qo;
    s->kv_lens = kv;
    if (ca->page_size) {
        if (v->kv != KILN_KV_PAGED) return cli_fail(cmd, CLI_USAGE, "--page-size needs kv=paged");
        if ((rc = cli_long(cmd, "--page-size", ca->page_size, 1, 1 << 16, &x))) return rc;
        s->page_size = (int)x;
    }
    if (ca->fixed_split) {
        if ((rc = cli_long(cmd, "--fixed-split", ca->fixed_split, 1, 1 << 30, &x))) return rc;
        s->fixed_split = (int)x;
    }
    if (ca->window_left) {
        if ((rc = cli_long(cmd, "--window-left", ca->window_left, 0, 1 << 30, &x))) return rc;
        s->window_left = (int)x;
    }
    if (ca->softcap) {
        char *end = NULL;
        double cap = strtod(ca->softcap, &end);
        if (!*ca->softcap || *end || !(cap > 0 && cap < 1e30))
            return cli_fail(cmd, CLI_USAGE, "--softcap '%s': expected a number > 0", ca->softcap);
        s->softcap = (float)cap;
    }
    s->graph = ca->graph;
    s->strided = ca->strided;
    s->rope_offsets = v->rope;
    *reps = 0;
    if (ca->time && (rc = cli_long(cmd, "--time", ca->time, 1, 1000000, reps))) return rc;
    return 0;
}

static void batch_print(const kiln_variant *v, const kiln_check_batch *s, int mismatch,
                        const kiln_check_batch_result *br)
{
    const kiln_check_result *r = &br->r;
    long long tq = 0, tk = 0;
    for (int b = 0; b < s->batch; b++) {
        tq += v->op == KILN_OP_PREFILL ? s->qo_lens[b] : 1;
        tk += s->kv_lens[b];
    }
    printf("%s B=%d H=%d rows=%lld keys=%lld", mismatch ? "MISMATCH" : "ok", s->batch,
           s->num_qo_heads, tq, tk);
    if (v->kv == KILN_KV_PAGED) printf(" P=%d", s->page_size ? s->page_size : 16);
    printf(" max_err=%.3g (atol %.3g rtol %.3g) rel_l2=%.3g", r->max_err, r->atol, r->rtol,
           r->rel_l2);
    if (v->lse) printf(" lse_err=%.3g", r->lse_max_err);
    printf(" plan: items=%d grid=%d kv_chunk=%d split=%d merges=%d %.3f ms", br->plan.items,
           br->plan.grid, br->plan.kv_chunk, br->plan.split_items, br->plan.merge_tasks,
           br->plan_ms);
    if (s->graph) printf(" graph: %d batches replayed", br->batches);
    if (r->kernel_ms > 0) {
        double sec = r->kernel_ms * 1e-3;
        printf(" time=%.4f ms, %.1f GB/s, %.2f TFLOP/s", r->kernel_ms, r->bytes / sec / 1e9,
               r->flops / sec / 1e12);
    }
    printf(" seed=%llu\n", (unsigned long long)br->seed);
    if (mismatch)
        printf("  first bad: %s (%lld of %lld elements out of tolerance; first bad request %d)\n",
               r->first_bad, r->bad, r->checked, br->bad_request);
    fflush(stdout);
}

/* kiln check of a batch variant (kv=ragged|paged) or of the merges (op=merge). */
static int check_batch_cmd(cli_global *g, const check_args *ca, const kiln_variant *v,
                           const char *canon)
{
    const char *cmd = "check";
    int *qo = malloc(sizeof(int) * CHECK_BATCH_MAX), *kv = malloc(sizeof(int) * CHECK_BATCH_MAX);
    kiln_check_batch s;
    long reps = 0;
    int rc = !qo || !kv ? cli_fail(cmd, CLI_FAIL, "out of memory") : 0;
    if (!rc && v->op == KILN_OP_MERGE &&
        (ca->kv_len || ca->kv_lens || ca->kv_dist || ca->qo_len || ca->qo_lens || ca->qo_dist ||
         ca->page_size || ca->fixed_split || ca->graph || ca->time))
        rc = cli_fail(cmd, CLI_USAGE,
                      "op=merge takes --batch (rows), --heads, --strided and --seed only");
    if (!rc) rc = batch_shape(ca, v, &s, qo, kv, &reps);
    kiln_ctx *ctx = NULL;
    if (!rc) rc = cli_ctx_open(g, cmd, 0, &ctx);
    kiln_device_info di;
    kiln_kernel *k = NULL;
    if (!rc && (kiln_ctx_device(ctx, &di) || !di.present))
        rc = cli_fail(cmd, CLI_FAIL, "no GPU: %s", kiln_ctx_errmsg(ctx));
    else if (!rc && kiln_kernel_get(ctx, v, &k))
        rc = cli_fail(cmd, CLI_FAIL, "%s", kiln_ctx_errmsg(ctx));
    char msg[1024] = "";
    if (k && v->op == KILN_OP_MERGE) {
        static const char *const names[] = {"merge_state", "merge_state_in_place", "merge_states"};
        for (int op = 0; op < 3; op++) {
            kiln_check_merge_shape ms = {s.batch, s.num_qo_heads, 3, ca->strided, s.seed};
            kiln_check_result r;
            kiln_status st =
                kiln_check_merge(ctx, k, (kiln_check_merge_op)op, &ms, &r, msg, sizeof msg);
            if (st && st != KILN_STATUS_MISMATCH) {
                rc = cli_fail(cmd, CLI_FAIL, "%s %s: %s", canon, names[op], msg);
                continue;
            }
            printf("%s %s rows=%d H=%d max_err=%.3g (atol %.3g rtol %.3g) lse_err=%.3g\n",
                   st ? "MISMATCH" : "ok", names[op], ms.rows, ms.num_heads, r.max_err, r.atol,
                   r.rtol, r.lse_max_err);
            if (st) {
                printf("  first bad: %s\n", r.first_bad);
                rc = CLI_FAIL;
            }
        }
    } else if (k) {
        kiln_check_batch_result br;
        kiln_status st = kiln_check_batch_run(ctx, k, &s, (int)reps, &br, msg, sizeof msg);
        if (st == KILN_STATUS_OK || st == KILN_STATUS_MISMATCH) {
            batch_print(v, &s, st == KILN_STATUS_MISMATCH, &br);
            if (st) rc = CLI_FAIL;
        } else {
            rc = cli_fail(cmd, CLI_FAIL, "%s B=%d: %s", canon, s.batch, msg);
        }
    }
    kiln_ctx_destroy(ctx);
    free(qo);
    free(kv);
    return rc;
}

int cli_cmd_check(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    check_args ca = {0};
    int npos = 0;
    const cli_opt opts[] = {{"--heads", &ca.heads, NULL},
                            {"--qo-len", &ca.qo_len, NULL},
                            {"--kv-len", &ca.kv_len, NULL},
                            {"--window-left", &ca.window_left, NULL},
                            {"--softcap", &ca.softcap, NULL},
                            {"--seed", &ca.seed, NULL},
                            {"--strided", NULL, &ca.strided},
                            {"--time", &ca.time, NULL},
                            {"--batch", &ca.batch, NULL},
                            {"--kv-lens", &ca.kv_lens, NULL},
                            {"--kv-dist", &ca.kv_dist, NULL},
                            {"--qo-lens", &ca.qo_lens, NULL},
                            {"--qo-dist", &ca.qo_dist, NULL},
                            {"--page-size", &ca.page_size, NULL},
                            {"--fixed-split", &ca.fixed_split, NULL},
                            {"--graph", NULL, &ca.graph},
                            {NULL, NULL, NULL}};
    int rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    if (npos == 0) return cli_fail(cmd->name, CLI_USAGE, "missing SPEC");
    kiln_variant v;
    char canon[KILN__SPEC_MAX];
    kiln_check_shape s;
    long kv[CHECK_KV_MAX], reps = 0;
    int nkv = 0;
    if ((rc = cli_spec(cmd->name, npos, argv, &v, canon, sizeof canon))) return rc;
    /* The CPU reference knows the builtin masks and transforms only: a snippet's meaning (and
     * its run-time values) has to come from the caller, as the tests do (tests/test_custom.c).
     * Mask data: the batch checker draws random per-request masks its reference reads; the
     * single-request path does not (tests/test_maskdata.c). Refuse rather than check something
     * else. */
    const int batch = v.kv != KILN_KV_CONTIGUOUS || v.op == KILN_OP_MERGE;
    if (v.logits_expr[0] || v.mask_expr[0] || v.num_params ||
        (v.mask_data != KILN_MASK_DATA_NONE && !batch))
        return cli_fail(
            cmd->name, CLI_USAGE,
            "custom variants (snippets, params; mask_data outside a batch) cannot be checked from "
            "the CLI: the reference needs their meaning and values; see tests/test_custom.c");
    if (batch) return check_batch_cmd(g, &ca, &v, canon);
    const char *batch_only = ca.batch         ? "--batch"
                             : ca.kv_lens     ? "--kv-lens"
                             : ca.kv_dist     ? "--kv-dist"
                             : ca.qo_lens     ? "--qo-lens"
                             : ca.qo_dist     ? "--qo-dist"
                             : ca.page_size   ? "--page-size"
                             : ca.fixed_split ? "--fixed-split"
                             : ca.graph       ? "--graph"
                                              : NULL;
    if (batch_only)
        return cli_fail(cmd->name, CLI_USAGE,
                        "%s needs a batch variant (kv=ragged or kv=paged in the spec)", batch_only);
    if ((rc = check_shape(&ca, &v, &s, kv, &nkv, &reps))) return rc;
    kiln_ctx *ctx = NULL;
    if ((rc = cli_ctx_open(g, cmd->name, 0, &ctx))) return rc;
    kiln_device_info di;
    kiln_kernel *k = NULL;
    if (kiln_ctx_device(ctx, &di) || !di.present)
        rc = cli_fail(cmd->name, CLI_FAIL, "no GPU: %s", kiln_ctx_errmsg(ctx));
    else if (kiln_kernel_get(ctx, &v, &k))
        rc = cli_fail(cmd->name, CLI_FAIL, "%s", kiln_ctx_errmsg(ctx));
    for (int i = 0; k && i < nkv; i++) {
        kiln_check_result r;
        char msg[1024] = "";
        memset(&r, 0, sizeof r);
        s.kv_len = (int)kv[i];
        kiln_status st = kiln_check_run(ctx, k, &s, (int)reps, &r, msg, sizeof msg);
        if (st == KILN_STATUS_OK || st == KILN_STATUS_MISMATCH) {
            check_print(&v, &s, st == KILN_STATUS_MISMATCH, &r);
            if (st) rc = CLI_FAIL;
        } else {
            rc = cli_fail(cmd->name, CLI_FAIL, "%s L_KV=%d: %s", canon, s.kv_len, msg);
        }
    }
    kiln_ctx_destroy(ctx);
    return rc;
}
