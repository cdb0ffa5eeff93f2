/*
 * kiln.c — the `kiln` command-line tool: the usage texts, the command table that drives
 * dispatch and help, and main (the global options before the command). The helpers every
 * command shares are in cli_common.c; the commands in cli_info.c (info), cli_kernel.c (compile,
 * show), cli_ls.c (ls, rm), cli_check.c (check), cli_warm.c and cli_manifest.c (warm and
 * manifests), cli_fleet.c (gc, verify, merge, export) and cli_report.c (stats, clear,
 * completion, --version, the JSON writer).
 *
 *   kiln [--cache DIR] COMMAND [ARGS...]      kiln --help | --version | help COMMAND
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define SPEC_HELP                                                                                  \
    "SPEC is key=value words, one quoted argument or several (omitted keys take defaults):\n"      \
    "  op=decode|prefill dtype=f16|bf16 head_dim=64|128|256 group=N layout=nhd|hnd\n"              \
    "  mask=none|causal window=0|1 logits=none|softcap|alibi|softcap_alibi lse=0|1\n"

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
    "  <key> <arch> compiled|cached <ms> ms regs=<n> smem=<bytes> spill=<bytes> family=<f> <spec>\n"
    "where <f> is the kernel family: wgmma (warp-specialized, sm_90a prefill), mma.sync,\n"
    "simt (decode on CUDA cores) or merge; `kiln show` says why a prefill is not on wgmma\n"
    "and why a decode is not on tensor cores.\n"
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
    "                  the cache and its -wal/-shm/-hits)\n"
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
    "A BATCH-SPEC (kv=ragged or kv=paged) runs one batch of B requests through kiln_plan_schedule\n"
    "and kiln_plan_run (pages shuffled over a pool bigger than needed) and checks every row of\n"
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
    "  --graph          capture kiln_plan_run in a CUDA graph, replay it, re-plan a second\n"
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

/* ---- main ----------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    cli_global g = {.commands = commands, .ncommands = NCOMMANDS};
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
