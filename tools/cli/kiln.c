/*
 * kiln.c — the `kiln` command-line tool: global options, the command table that drives
 * dispatch and help, the usage texts, and the helpers every command shares (option parser,
 * error lines, specs from words, arch lists, contexts and the cache). The commands themselves
 * are in cli_cmds.c (info, compile, ls, show, rm, check), cli_warm.c and cli_manifest.c
 * (warm and manifests), cli_fleet.c (gc, verify, merge, export) and cli_report.c (stats,
 * clear, completion, --version, the JSON writer).
 *
 *   kiln [--cache DIR] COMMAND [ARGS...]      kiln --help | --version | help COMMAND
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "jit.h"

#define SPEC_HELP                                                                                  \
    "SPEC is key=value words, one quoted argument or several (omitted keys take defaults):\n"      \
    "  op=decode|prefill dtype=f16|bf16 head_dim=64|128|256 group=N layout=nhd|hnd\n"              \
    "  mask=none|causal window=0|1 logits=none|softcap|alibi lse=0|1\n"

#define ARCH_HELP                                                                                  \
    "ARCHS is a comma-separated list of sm_80, sm_86, sm_89, sm_90a, sm_100, sm_120, ...;\n"       \
    "'native' is the GPU's own arch (the default; needs a GPU), 'all' every arch NVRTC offers.\n"

static const char usage_info[] =
    "usage: kiln info [--gpu-count] [--json]\n"
    "\n"
    "Print kiln's and NVRTC's versions, the CUDA driver and each GPU (name, arch), the archs\n"
    "NVRTC can target, and the cache: path, entries, bytes, hits and misses.\n"
    "\n"
    "  --gpu-count   print only the number of usable GPUs (0 without a GPU or driver)\n"
    "  --json        one JSON object instead of the lines\n";

static const char usage_compile[] =
    "usage: kiln compile [--arch ARCHS] SPEC\n"
    "\n"
    "Compile SPEC (or find it in the cache) for each arch and print one line per arch:\n"
    "  <key> <arch> compiled|cached <ms> ms regs=<n> smem=<bytes> spill=<bytes> <spec>\n"
    "\n" SPEC_HELP ARCH_HELP "\n"
    "example: kiln compile --arch sm_80,sm_90a op=decode dtype=bf16 head_dim=128 group=8\n";

static const char usage_warm[] =
    "usage: kiln warm [--arch ARCHS] [--jobs N] [--shard I/N] [--json] MANIFEST\n"
    "\n"
    "Compile every (spec, arch) of MANIFEST into the cache, N at a time. MANIFEST has one spec\n"
    "per line; '#' starts a comment; blank lines are skipped; '-' reads stdin. A value may list\n"
    "alternatives in braces (head_dim={64,128} dtype={f16,bf16}: 4 specs), and arch=LIST pins a\n"
    "line to its own archs (record files written by KILN_RECORD have one per line). A malformed\n"
    "line stops everything before any compile. Several processes may warm one cache at once:\n"
    "each kernel is compiled by one of them (compile leases). Progress (done/total, failures,\n"
    "rate, ETA) goes to stderr, failures are listed at the end, and the last line on stdout is\n"
    "  N kernels: C compiled, H cached, F failed in T s (R kernels/min)\n"
    "\n"
    "  --jobs N      parallel compiles (default: the online CPUs, bounded by MemAvailable at\n"
    "                ~400 MB per NVRTC compile)\n"
    "  --shard I/N   take only the work items i with i % N == I (0 <= I < N), for spreading one\n"
    "                manifest over N build hosts; then kiln merge the shards\n"
    "  --json        the summary (and the failures) as one JSON object on stdout\n"
    "\n" ARCH_HELP "See docs/fleet.md.\n";

static const char usage_verify[] =
    "usage: kiln verify [--fix] [--json] [CACHE...]\n"
    "\n"
    "Check the cache (or each CACHE: a directory or a database file): SQLite's integrity check,\n"
    "then every row: the stored checksum, the key recomputed from the key material, the key\n"
    "format version, the arch and spec against the key material, the cubin (a whole CUDA\n"
    "ELF), and the row checksum over every other stored field. Each bad row is printed as\n"
    "'bad KEY ARCH SPEC: REASON'; the last line is\n"
    "  verified N rows in PATH: B bad\n"
    "Exit 1 while bad rows remain. Creates nothing: a path with no cache is an error.\n"
    "\n"
    "  --fix    delete the bad rows (they are compiled again when next needed)\n"
    "  --json   a JSON array, one object per cache (rows, bad rows with their reasons)\n";

static const char usage_gc[] =
    "usage: kiln gc [--max-size N] [--vacuum]\n"
    "\n"
    "Evict least recently used rows until the cubins total at most N bytes (--max-size, else\n"
    "$KILN_CACHE_MAX_BYTES; without either nothing is evicted), delete compile leases nobody\n"
    "holds any more, and checkpoint the WAL into the file.\n"
    "\n"
    "  --max-size N   the bound: bytes, or with a K, M, G or T suffix (512M)\n"
    "  --vacuum       also rewrite the file without its free pages (before shipping it)\n";

static const char usage_merge[] =
    "usage: kiln merge OUT IN...\n"
    "\n"
    "Add every row of each IN to OUT (each a cache directory or a database file; OUT is created\n"
    "when missing, the INs are only read). Every row is verified first (checksum, key from key\n"
    "material, key format, cubin) and refused with the reason if bad; a file of a newer schema\n"
    "is refused whole. A key already in OUT is kept (one key, one content). Prints one line per\n"
    "IN (rows: added, present, refused) and a total. Exit 1 when anything was refused.\n";

static const char usage_export[] =
    "usage: kiln export [--arch ARCHS] [--spec-file MANIFEST] OUT\n"
    "\n"
    "Copy rows of the cache into OUT (a directory or a database file, created when missing):\n"
    "those of the archs ARCHS (default: every row), or with --spec-file exactly the kernels of\n"
    "MANIFEST (the format of kiln warm; lines without arch= take ARCHS). Rows are verified like\n"
    "kiln merge. Kernels of the manifest that the cache lacks are listed; exit 1 if any.\n";

static const char usage_ls[] =
    "usage: kiln ls [--arch ARCHS] [--op OP] [--spec TEXT] [--limit N] [--json]\n"
    "\n"
    "List the cache, most recently used first: key, arch, registers, shared memory, spill,\n"
    "cubin bytes, compile ms, hits, last use (UTC) and spec ('-' where ptxas reported\n"
    "nothing). The default cache before anything created it lists nothing (exit 0) and is\n"
    "not created; a --cache that names no cache is an error.\n"
    "\n"
    "  --arch ARCHS  only these archs (a comma list; sm_90 means sm_90a; 'all')\n"
    "  --op OP       only this op (decode, prefill, merge)\n"
    "  --spec TEXT   only specs containing TEXT (e.g. 'head_dim=128')\n"
    "  --limit N     at most N rows (after the filters)\n"
    "  --json        a JSON array of objects instead of the table\n";

static const char usage_stats[] =
    "usage: kiln stats [--zero] [--json]\n"
    "\n"
    "Print the cache's counters: entries, cubin and file bytes, lookups that hit and missed,\n"
    "the hit rate, when the counters were last zeroed, and per arch the entries, bytes and\n"
    "hits. Lookups are counted by every process using the cache (kiln and the library).\n"
    "\n"
    "  --zero   reset the hit and miss counters (and each entry's hits) to 0\n"
    "  --json   one JSON object instead of the lines\n";

static const char usage_clear[] =
    "usage: kiln clear --yes\n"
    "\n"
    "Remove every entry of the cache (one transaction; compile leases and counters stay).\n"
    "Without --yes nothing is removed and the exit status is 2. kiln gc --vacuum then gives\n"
    "the space back to the file system.\n"
    "\n"
    "  --yes   really remove them\n";

static const char usage_completion[] =
    "usage: kiln completion bash|zsh\n"
    "\n"
    "Print a shell completion script for kiln's commands and options, generated from the\n"
    "command table:\n"
    "  source <(kiln completion bash)      # in ~/.bashrc\n"
    "  kiln completion zsh > ~/.zfunc/_kiln   # a directory of $fpath\n";

static const char usage_show[] =
    "usage: kiln show KEY-PREFIX|SPEC [--arch ARCH] [--source|--log|--key-material|--sass|--cubin "
    "FILE]\n"
    "\n"
    "Show one kernel: by a key prefix (1 to 32 hex digits) of a cache entry, or by a spec,\n"
    "compiled (or found in the cache) for --arch (default: the GPU's arch).\n"
    "\n"
    "  --source        print exactly the CUDA source that was compiled\n"
    "  --log           print the NVRTC log (with ptxas' resource report)\n"
    "  --key-material  print exactly the text hashed into the key\n"
    "  --sass          disassemble the cubin with cuobjdump (CUDA toolkit; KILN_CUOBJDUMP)\n"
    "  --cubin FILE    write the cubin to FILE, a new file (never over an existing file or\n"
    "                  the cache and its -wal/-shm)\n"
    "\n" SPEC_HELP;

static const char usage_rm[] =
    "usage: kiln rm KEY-PREFIX...\n"
    "\n"
    "Remove every cache entry whose key starts with one of the prefixes and print\n"
    "'removed N'. A prefix that matches nothing is reported (exit 1); the others still go.\n";

static const char usage_check[] =
    "usage: kiln check SPEC [--heads H] [--qo-len N] [--kv-len N[,N...]] [--window-left N]\n"
    "                       [--softcap X] [--seed S] [--strided] [--time REPS]\n"
    "       kiln check BATCH-SPEC [--batch B] [--kv-len N | --kv-lens N,... | --kv-dist "
    "uniform:LO:HI]\n"
    "                       [--qo-len N | --qo-lens N,... | --qo-dist uniform:LO:HI] [--page-size "
    "P]\n"
    "                       [--graph] [--fixed-split N] [--heads H] [--window-left N] [--softcap "
    "X]\n"
    "                       [--seed S] [--strided] [--time REPS]\n"
    "       kiln check op=merge dtype=T head_dim=D [--batch ROWS] [--heads H] [--strided] [--seed "
    "S]\n"
    "\n"
    "Run the kernel of SPEC on the GPU with random inputs and compare it with a float64 CPU\n"
    "reference, once per kv length; print one line per shape (ok or MISMATCH, errors,\n"
    "tolerances, and with --time the median time, GB/s and TFLOP/s). Needs a GPU.\n"
    "A BATCH-SPEC (kv=ragged or kv=paged) runs one batch of B requests through kiln_batch_plan\n"
    "and kiln_batch_run (pages shuffled over a pool bigger than needed) and checks every row of\n"
    "every request; the line also says what the plan decided. A batch spec with mask_data gets\n"
    "random masks per request (some rows hidden, some full; bsr blocks of 7 rows x 40 keys).\n"
    "op=merge checks kiln_merge_state, _in_place and kiln_merge_states on random states.\n"
    "\n"
    "  --heads H        query heads (default max(8, 2*group), a multiple of group)\n"
    "  --qo-len N       query length of a prefill (default 128; decode uses 1)\n"
    "  --kv-len LIST    kv lengths (default 577); in a batch: one length for every request\n"
    "  --window-left N  window=1: keys left of the diagonal (default kv_len / 3)\n"
    "  --softcap X      logits=softcap: the cap (default 30)\n"
    "  --seed S         random inputs and drawn lengths (default: from the clock; printed)\n"
    "  --strided        q, k, v, o inside wider buffers (non-dense strides)\n"
    "  --time REPS      also time REPS launches (batch: runs, or graph replays)\n"
    "  --batch B        requests in the batch (default: the length of a list, else 8)\n"
    "  --kv-lens LIST   keys of each request (0 allowed: an empty request)\n"
    "  --kv-dist uniform:LO:HI   keys of each request drawn uniformly in [LO, HI]\n"
    "  --qo-lens LIST, --qo-dist uniform:LO:HI   prefill rows of each request (default 128)\n"
    "  --page-size P    kv=paged: tokens per page (default 16)\n"
    "  --graph          capture kiln_batch_run in a CUDA graph, replay it, re-plan a second\n"
    "                   batch of other lengths into the same workspace and replay again\n"
    "  --fixed-split N  plan in batch-invariant mode with chunks of N keys\n"
    "\n" SPEC_HELP;

static const char usage_help[] = "usage: kiln help [COMMAND]\n"
                                 "\n"
                                 "Print the list of commands, or one command's help.\n";

static int cmd_help(cli_global *g, const cli_cmd *cmd, int argc, char **argv);

/* The command table: dispatch and help. A new command is one row here plus its handler. */
static const cli_cmd commands[] = {
    {"info", cli_cmd_info, "versions, GPUs, NVRTC archs, cache statistics", usage_info},
    {"compile", cli_cmd_compile, "compile one spec for one or more archs", usage_compile},
    {"warm", cli_cmd_warm, "compile a manifest of specs x archs into the cache, in parallel",
     usage_warm},
    {"ls", cli_cmd_ls, "list the cache entries", usage_ls},
    {"show", cli_cmd_show, "show a kernel: resources, source, log, key material, cubin",
     usage_show},
    {"rm", cli_cmd_rm, "remove cache entries by key prefix", usage_rm},
    {"stats", cli_cmd_stats, "hits, misses, hit rate, bytes, per-arch counts; --zero resets",
     usage_stats},
    {"clear", cli_cmd_clear, "remove every cache entry (needs --yes)", usage_clear},
    {"check", cli_cmd_check, "run a kernel on the GPU against a CPU reference", usage_check},
    {"verify", cli_cmd_verify, "check every row of a cache; --fix deletes bad rows", usage_verify},
    {"gc", cli_cmd_gc, "evict to a size bound, drop dead leases, compact", usage_gc},
    {"merge", cli_cmd_merge, "union caches (shards) into one, verifying every row", usage_merge},
    {"export", cli_cmd_export, "copy the rows of some archs or of a manifest into a new file",
     usage_export},
    /* bench: benchmarks against the bandwidth and FLOP ceilings (tools/, to come) */
    {"completion", cli_cmd_completion, "print a bash or zsh completion script", usage_completion},
    {"help", cmd_help, "print this text, or a command's help", usage_help},
};

#define NCOMMANDS ((int)(sizeof commands / sizeof commands[0]))

const cli_cmd *cli_commands(int *n)
{
    *n = NCOMMANDS;
    return commands;
}

static void print_main_usage(FILE *f)
{
    fprintf(f,
            "usage: kiln [--cache DIR] COMMAND [ARGS...]\n"
            "       kiln --help | --version | help COMMAND | completion bash|zsh\n"
            "\n"
            "kiln %s: JIT-compiled GPU attention kernels and their cache.\n"
            "\n"
            "commands:\n",
            kiln_version());
    for (int i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n"
               "global options (also accepted after the command):\n"
               "  --cache DIR   cache directory (default: $KILN_CACHE_DIR, else\n"
               "                $XDG_CACHE_HOME/kiln, else ~/.cache/kiln); the file is\n"
               "                DIR/kernels.db\n"
               "  --base-cache DIR  a read-only cache consulted after --cache and never\n"
               "                written (default: $KILN_BASE_CACHE_DIR)\n"
               "  --max-size N  keep the cache's cubins under N bytes (512M, 2G; default:\n"
               "                $KILN_CACHE_MAX_BYTES), evicting the least recently used\n"

               "  -h, --help    this text; after a command, that command's help\n"
               "  -V, --version kiln's version (and NVRTC's, the key format's, the schema's)\n"
               "\n"
               "environment: KILN_STRICT=1 (a miss is an error; nothing is compiled),\n"
               "  KILN_RECORD=FILE (append every kernel requested to FILE; kiln warm FILE\n"
               "  replays it), KILN_BASE_CACHE_DIR, KILN_CACHE_MAX_BYTES; see docs/fleet.md\n"
               "\n"
               "exit status: 0 success, 1 run-time failure, 2 bad usage or input\n");
}

static const cli_cmd *find_command(const char *name)
{
    for (int i = 0; i < NCOMMANDS; i++)
        if (!strcmp(commands[i].name, name)) return &commands[i];
    return NULL;
}

static int cmd_help(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    static const cli_opt opts[] = {{NULL, NULL, NULL}};
    int npos = 0, rc = cli_parse(g, cmd, argc, argv, opts, &npos);
    if (rc) return rc < 0 ? CLI_OK : rc;
    if (npos == 0) {
        print_main_usage(stdout);
        return CLI_OK;
    }
    const cli_cmd *c = find_command(argv[0]);
    if (!c) return cli_fail("help", CLI_USAGE, "unknown command '%s' (see kiln --help)", argv[0]);
    fputs(c->usage, stdout);
    return CLI_OK;
}

/* ---- helpers shared by the commands (declared in cli.h) ------------------------------------ */

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

/* ---- main ----------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    cli_global g = {0};
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *w = argv[i];
        if (!strcmp(w, "-h") || !strcmp(w, "--help")) {
            print_main_usage(stdout);
            return CLI_OK;
        } else if (!strcmp(w, "--version") || !strcmp(w, "-V")) {
            cli_print_version();
            return CLI_OK;
        } else {
            static const char *const globals[] = {"--cache", "--base-cache", "--max-size"};
            const char *eq = strchr(w, '='), *val = eq ? eq + 1 : NULL;
            size_t n = eq ? (size_t)(eq - w) : strlen(w);
            const char *name = NULL;
            for (size_t j = 0; j < sizeof globals / sizeof globals[0]; j++)
                if (strlen(globals[j]) == n && !strncmp(globals[j], w, n)) name = globals[j];
            if (name && !val && i + 1 < argc) val = argv[++i];
            if (!name || !val) {
                fprintf(stderr, "kiln: %s '%s' (see kiln --help)\n",
                        name ? "missing value after" : "unknown option", w);
                return CLI_USAGE;
            }
            if (cli_global_set(&g, name, val)) return CLI_USAGE;
        }
    }
    if (i >= argc) {
        print_main_usage(stderr);
        return CLI_USAGE;
    }
    const cli_cmd *cmd = find_command(argv[i]);
    if (!cmd) {
        fprintf(stderr, "kiln: unknown command '%s' (see kiln --help)\n", argv[i]);
        return CLI_USAGE;
    }
    return cmd->run(&g, cmd, argc - i - 1, argv + i + 1);
}
