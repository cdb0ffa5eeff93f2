/*
 * cli.h — what the files of the `kiln` command-line tool share: the global options, the command
 * table entry, the option parser, and small helpers (error lines, a spec from words, arch
 * lists, opening a context or the cache). Internal to tools/cli; never linked into the library.
 *
 * Exit status of every command: CLI_OK (0) on success, CLI_FAIL (1) on a run-time failure,
 * CLI_USAGE (2) on bad usage or input. Every error goes to stderr as "kiln <cmd>: <message>".
 */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cache.h"
#include "jit.h"
#include "kiln.h"
#include "util.h"

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* Most archs one command handles (kiln__arch_all lists fewer). */
#define CLI_ARCH_MAX 64

/* The message an arch-less command gets on a machine with no GPU. */
#define CLI_NO_GPU_MSG "no GPU here: name an arch with --arch (e.g. sm_90a)"

/* Options that apply to every command. */
typedef struct cli_global {
    const char *cache_dir; /* --cache DIR; NULL: $KILN_CACHE_DIR, else the library's default */
    const char *base_dir;  /* --base-cache DIR; NULL: $KILN_BASE_CACHE_DIR */
    int64_t max_size;      /* --max-size N (bytes) when max_size_set */
    int max_size_set;
    const struct cli_cmd *commands; /* the command table (set by main), for `completion` */
    int ncommands;
} cli_global;

/* Set the global option name ("--cache", "--base-cache", "--max-size") to val. 0, or
 * CLI_USAGE after printing why. */
int cli_global_set(cli_global *g, const char *name, const char *val);

typedef struct cli_cmd cli_cmd;

/* A command's handler. argv[0..argc) are the words after the command name. Returns the exit
 * status. */
typedef int (*cli_handler)(cli_global *g, const cli_cmd *cmd, int argc, char **argv);

/* One row of the command table: drives dispatch and help. */
struct cli_cmd {
    const char *name;    /* "compile" */
    cli_handler run;     /* the handler */
    const char *summary; /* one line for `kiln --help` */
    const char *usage;   /* full help text for `kiln CMD --help` */
};

/* One option of a command for cli_parse. A table ends with a row whose name is NULL. */
typedef struct cli_opt {
    const char *name;   /* "--arch" */
    const char **value; /* non-NULL: the option takes an argument, stored here */
    int *flag;          /* non-NULL: a switch, set to 1 when present */
} cli_opt;

/* Parse a command's words. Options may come anywhere, as "--name VALUE" or "--name=VALUE";
 * "--" ends them; "-" alone is a positional; --cache DIR is accepted by every command. The
 * positionals are moved, in order, to the front of argv and counted in *npos.
 * Returns 0 to go on, -1 after printing the command's help (exit 0), or CLI_USAGE after
 * printing why. */
int cli_parse(cli_global *g, const cli_cmd *cmd, int argc, char **argv, const cli_opt *opts,
              int *npos);

/* cli_parse for a command that takes no positional words: 1 when the command is done, with its
 * exit status in *status (CLI_OK after printing its help, CLI_USAGE after printing why: a bad
 * option or an unexpected word); 0 to go on. */
int cli_parse_opts(cli_global *g, const cli_cmd *cmd, int argc, char **argv, const cli_opt *opts,
                   int *status);

/* cli_parse for a command that needs at least one positional word: 1 when the command is done,
 * with its exit status in *status (CLI_OK after printing its help; CLI_USAGE after printing
 * why, "missing" when there is no word); 0 to go on with *npos words. */
int cli_parse_words(cli_global *g, const cli_cmd *cmd, int argc, char **argv, const cli_opt *opts,
                    const char *missing, int *npos, int *status);

/* Print "kiln <cmd>: <message>\n" to stderr and return code. */
int cli_fail(const char *cmd, int code, const char *fmt, ...) KILN__PRINTF(3, 4);

/* Parse a whole decimal number in [min, max] given to option opt; CLI_USAGE with a message
 * otherwise. */
int cli_long(const char *cmd, const char *opt, const char *s, long min, long max, long *out);

/* Join words[0..n) with single spaces into a spec, parse and validate it: *v gets the
 * variant and canon[cap] its canonical text. Returns 0, or CLI_USAGE after printing the
 * parser's message (which names the token). */
int cli_spec(const char *cmd, int n, char **words, kiln_variant *v, char *canon, size_t cap);

/* A list of target archs. "native" entries are kept as "" until cli_archs_resolve. */
typedef struct cli_archs {
    int n;
    int native; /* 1: some entry is the context's arch ("native", or no --arch given) */
    char a[CLI_ARCH_MAX][16];
} cli_archs;

/* Add the archs of a comma-separated list (names, "native" kept as "", "all") to out, skipping
 * those already there; idx[0..*nidx) gets the index of each named arch in out (idx and nidx
 * may be NULL). Returns 0, or CLI_USAGE / CLI_FAIL with the reason in msg[cap]. */
int cli_archs_add(const char *list, cli_archs *out, int *idx, int *nidx, char *msg, size_t cap);

/* Parse an --arch value: comma-separated names, "native", "all" (every arch NVRTC offers).
 * NULL means native. Names are normalised (sm_90 → sm_90a) and duplicates dropped. Returns 0
 * or CLI_USAGE with the arch module's message. */
int cli_archs_parse(const char *cmd, const char *list, cli_archs *out);

/* Replace native entries by the context's arch. CLI_USAGE with CLI_NO_GPU_MSG when the
 * context has none (no GPU). */
int cli_archs_resolve(const char *cmd, kiln_ctx *ctx, cli_archs *a);

/* One spec of a manifest. */
typedef struct cli_mspec {
    kiln_variant v;
    char spec[KILN__SPEC_MAX]; /* canonical */
    int line;                  /* first line (1-based) that named it */
} cli_mspec;

/* One work item of a manifest: indexes into specs and archs. */
typedef struct cli_pair {
    int spec, arch;
} cli_pair;

/* A manifest read by cli_manifest_read (cli_manifest.c; format in docs/fleet.md). */
typedef struct cli_manifest {
    cli_mspec *specs; /* distinct specs, in order of first appearance */
    int nspecs, specs_cap;
    cli_pair *pairs; /* distinct (spec, arch) pairs, in manifest order */
    int npairs, pairs_cap;
    cli_archs archs; /* every arch named: the default list (--arch) first */
    int ndefault;    /* archs.a[0..ndefault) is the default list */
    int duplicates;  /* repeated pairs that were dropped */
    int expanded;    /* specs the lines expanded to so far, repeats included */
    int *spec_slots, spec_cap_slots, *pair_slots, pair_cap_slots; /* hash sets */
} cli_manifest;

/* Read MANIFEST (path, or "-" for stdin): '#' comments, {a,b} alternatives, an optional
 * arch=LIST per line (else the archs of deflt). Every line is checked; CLI_USAGE naming
 * file:line on the first bad one. Free with cli_manifest_free even on failure. */
int cli_manifest_read(const char *cmd, const char *path, const cli_archs *deflt, cli_manifest *m);
/* 1 when some pair's arch is "native" (needs a GPU to resolve). */
int cli_manifest_needs_native(const cli_manifest *m);
/* Replace native archs by the context's (CLI_USAGE without a GPU) and drop repeats. */
int cli_manifest_resolve(const char *cmd, kiln_ctx *ctx, cli_manifest *m);
void cli_manifest_free(cli_manifest *m);

/* Create a context on the cache of g (no_device: compile-only, never touch the driver).
 * Returns 0, or CLI_FAIL after printing the reason. */
int cli_ctx_open(const cli_global *g, const char *cmd, int no_device, kiln_ctx **out);

/* Open the cache of g directly (for ls, show, rm, info, gc, verify, export): --cache may also
 * name a database file. The cache must exist: nothing is created or initialised
 * (KILN__CACHE_EXISTING). Returns 0 or CLI_FAIL. */
int cli_cache_open(const cli_global *g, const char *cmd, kiln__cache **out);
/* cli_cache_open, except that with missing non-NULL a cache that does not exist is no error:
 * 0 with *out NULL and the reason in missing[cap]. */
int cli_cache_open_opt(const cli_global *g, const char *cmd, char *missing, size_t cap,
                       kiln__cache **out);

/* ---- output safety (cli_safe.c) ------------------------------------------------------------ */

/* 1 when path is, or would become, the database of c or one of its -wal, -shm, -journal files
 * (existing files compared by device and inode, missing ones by directory inode and name);
 * what[cap] gets the cache file it is. */
int cli_path_is_cache(const char *path, const kiln__cache *c, char *what, size_t cap);
/* Create the new file path for writing into *fd: CLI_USAGE when it is the cache c (may be
 * NULL) or already exists (nothing is overwritten; there is no --force), CLI_FAIL when it
 * cannot be created; the reason is printed. */
int cli_output_open(const char *cmd, const char *path, const kiln__cache *c, int *fd);
/* Write s to f with what a terminal would act on escaped: C0 controls and DEL as \xNN (but
 * \n and \t when keep_lines), UTF-8 C1 controls as \u00NN. */
void cli_put_safe(FILE *f, const char *s, int keep_lines);
/* s escaped as by cli_put_safe (keep_lines 0) into buf[cap] (cap >= 4; cut with "..."). */
const char *cli_safe(const char *s, char *buf, size_t cap);
/* A stored text (source, log, key material) as it is when f is not a terminal; escaped as by
 * cli_put_safe (lines kept) when it is. */
void cli_put_text(FILE *f, const char *s);

/* The key v has for arch (computed; nothing compiled) into key[33]: 0, or -1 ("" in key) when
 * its configuration or key material cannot be made. */
int cli_key(const kiln_variant *v, const char *arch, char key[33]);

/* The kernel family of a generated source (kiln__source_family): "wgmma" (the warp-specialized
 * Hopper family), "mma.sync", "simt" (the CUDA-core decode), "merge", or "-". why gets, for a
 * prefill not on the wgmma family, the reason (from the spec and arch), else "". */
const char *cli_family(const char *source, const char *spec, const char *arch, char *why,
                       size_t cap);

/* Milliseconds on the monotonic clock. */
double cli_now_ms(void);

/* Unix seconds as "2026-11-29T16:20:05Z" into out[32]; "-" for 0. */
void cli_iso_time(int64_t t, char out[32]);

/* The commands (cli_info.c, cli_kernel.c, cli_ls.c, cli_check.c, cli_warm.c, cli_fleet.c). */
int cli_cmd_info(cli_global *g, const cli_cmd *cmd, int argc, char **argv);
int cli_cmd_compile(cli_global *g, const cli_cmd *cmd, int argc, char **argv);
int cli_cmd_warm(cli_global *g, const cli_cmd *cmd, int argc, char **argv);
int cli_cmd_ls(cli_global *g, const cli_cmd *cmd, int argc, char **argv);
int cli_cmd_show(cli_global *g, const cli_cmd *cmd, int argc, char **argv);
int cli_cmd_rm(cli_global *g, const cli_cmd *cmd, int argc, char **argv);
int cli_cmd_check(cli_global *g, const cli_cmd *cmd, int argc, char **argv);
int cli_cmd_gc(cli_global *g, const cli_cmd *cmd, int argc, char **argv);
int cli_cmd_verify(cli_global *g, const cli_cmd *cmd, int argc, char **argv);
int cli_cmd_merge(cli_global *g, const cli_cmd *cmd, int argc, char **argv);
int cli_cmd_export(cli_global *g, const cli_cmd *cmd, int argc, char **argv);

/* ---- reporting (cli_report.c) --------------------------------------------------------------- */

int cli_cmd_stats(cli_global *g, const cli_cmd *cmd, int argc, char **argv);
int cli_cmd_clear(cli_global *g, const cli_cmd *cmd, int argc, char **argv);
int cli_cmd_completion(cli_global *g, const cli_cmd *cmd, int argc, char **argv);

/* Append t as a JSON string literal to s: quotes, backslashes and control characters escaped,
 * a byte that is not part of well-formed UTF-8 written as U+FFFD. */
void cli_json_str(kiln__str *s, const char *t);
/* Write s to stdout and free it; CLI_FAIL naming cmd when s ran out of memory. */
int cli_json_print(const char *cmd, kiln__str *s);

/* `kiln --version`: kiln's version line (the first line of `kiln info`), NVRTC's, and the key
 * format and cache schema versions. */
void cli_print_version(void);

/* `kiln info --json` (the fields of `kiln info`, one object). */
int cli_info_json(const cli_global *g);

/* 1 when the cache of g has no database file yet (nothing is created); path[cap] gets the file
 * it would be. 0 when it exists, or when the location is unknown (opening then says why). */
int cli_cache_absent(const cli_global *g, char *path, size_t cap);
/* cli_cache_absent for the default cache only (no --cache given): a fresh $HOME, where ls and
 * stats report an empty cache (exit 0); a --cache that names nothing stays an error. */
int cli_default_cache_absent(const cli_global *g, char *path, size_t cap);

/* The filters of `kiln ls`. */
typedef struct cli_ls_filter {
    int by_arch;
    cli_archs archs;  /* --arch: keep these archs */
    char op[32];      /* --op: "op=<name> ", the spec's first word */
    const char *spec; /* --spec: a substring of the spec */
    long limit;       /* --limit: most rows shown; -1 for all */
    long shown;
} cli_ls_filter;

/* Fill f from the option values (each may be NULL). 0, or CLI_USAGE after printing why. */
int cli_ls_filter_init(cli_ls_filter *f, const char *arch, const char *op, const char *spec,
                       const char *limit);
/* 1 when en passes f (and counts it against --limit). */
int cli_ls_filter_keep(cli_ls_filter *f, const kiln__entry *en);

#endif /* KILN_CLI_H */
