/*
 * cli_kernel.c — the `kiln` commands that work on one kernel: compile (one line per arch) and
 * show (resources, source, log, key material, SASS through cuobjdump, the cubin into a new file),
 * by a key prefix of a cache row or by a spec. show-by-key opens the cache directly and never
 * touches the driver; compile and show-by-spec go through a context, compile-only when every
 * arch is named.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#include "cli.h"
#include "jit.h"

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
    char why[128];
    const char *fam = cli_family(kiln_kernel_source(k), ki.spec, ki.arch, why, sizeof why);
    printf("%s %s %s %.1f ms regs=%s smem=%d spill=%d family=%s %s\n", ki.key, ki.arch,
           ki.from_cache ? "cached" : "compiled", ms, regs, ki.smem_bytes, ki.spill_bytes, fam,
           ki.spec);
    fflush(stdout);
    return CLI_OK;
}

int cli_cmd_compile(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    const char *arch = NULL;
    int npos = 0;
    const cli_opt opts[] = {{"--arch", &arch, NULL}, {NULL, NULL, NULL}};
    int rc = 0;
    if (cli_parse_words(g, cmd, argc, argv, opts, "missing SPEC (see kiln compile --help)", &npos,
                        &rc))
        return rc;
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
    char b[4][KILN__SPEC_MAX]; /* labels from a row: escaped (cli_safe.c) */
    printf("key:         %s\n", cli_safe(w->key, b[0], sizeof b[0]));
    printf("arch:        %s\n", cli_safe(w->arch, b[1], sizeof b[1]));
    printf("spec:        %s\n", cli_safe(w->spec, b[2], sizeof b[2]));
    printf("nvrtc:       %s\n", cli_safe(w->nvrtc, b[3], sizeof b[3]));
    char why[160];
    const char *fam = cli_family(w->source, w->spec, w->arch, why, sizeof why);
    if (why[0]) printf("family:      %s (%s)\n", fam, why);
    else printf("family:      %s\n", fam);
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
    kiln__cache_fold_hits(c); /* the row's counters, with the hit log's records */
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
    int rc = 0;
    if (cli_parse_words(g, cmd, argc, argv, opts, "missing KEY-PREFIX or SPEC", &npos, &rc))
        return rc;
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
