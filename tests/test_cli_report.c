/*
 * test_cli_report.c — the reporting side of the `kiln` binary (tools/cli_report.c and the
 * --json flags): --version / -V, stats (counters from real lookups, per arch, --zero), the
 * counter-only close that leaves its WAL, ls filters and '-' for unreported registers, ls and
 * stats on a fresh HOME, clear's refusal and removal, --json of info / stats / ls / verify /
 * warm parsed by python3 (with hostile strings in the rows), and the completion scripts
 * (bash -n, a completion run; zsh -n where zsh exists).
 *
 * Rows are written with kiln__cache_put where the content does not matter (no NVRTC); the
 * compiles are merge kernels for sm_80 (~0.2 s each).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache.h"
#include "kt.h"

#define MERGE_SPEC "op=merge dtype=f16 head_dim=128"

/* Run the shell command line cmd (printf-formatted) with stdout and stderr captured into
 * *out (malloc'd; may be NULL to discard). Returns the exit status, -1 when it did not exit. */
static int sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh(char **out, const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    size_t n = 0, cap = 4096;
    char *buf = malloc(cap);
    if (!p || !buf) {
        if (p) pclose(p);
        free(buf);
        if (out) *out = NULL;
        return -1;
    }
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 2) {
            char *b = realloc(buf, cap * 2);
            if (!b) break;
            buf = b;
            cap *= 2;
        }
    }
    buf[n] = 0;
    int st = pclose(p);
    if (out) *out = buf;
    else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The scratch cache directory of this test, and the command prefix that points kiln at it. */
static const char *cache_dir(void)
{
    static char d[600];
    snprintf(d, sizeof d, "%s/cache", kt_tmpdir());
    return d;
}

#define KILN_AT "KILN_CACHE_DIR='%s' '%s'"
#define AT      cache_dir(), kt_kiln_bin()

static int have_python(void)
{
    if (system("command -v python3 >/dev/null 2>&1") == 0) return 1;
    kt_skip("python3 not found: the JSON output was not parsed");
    return 0;
}

/* Store a row with the given labels (its cubin is 64 junk bytes; nothing loads it). */
static void put_row(const char *key, const char *arch, const char *spec, int regs)
{
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    KT_OK(kiln__cache_open(cache_dir(), &c, &e), e.msg);
    if (!c) return;
    static char blob[64] = "not a cubin";
    kiln__entry en;
    memset(&en, 0, sizeof en);
    snprintf(en.key, sizeof en.key, "%s", key);
    en.spec = (char *)spec;
    en.arch = (char *)arch;
    en.nvrtc = (char *)"13.0";
    en.key_material = (char *)"kiln-key-format: 1\n";
    en.source = (char *)"";
    en.log = (char *)"";
    en.cubin = blob;
    en.cubin_size = sizeof blob;
    en.registers = regs;
    KT_OK(kiln__cache_put(c, &en, &e), e.msg);
    kiln__cache_close(c);
}

/* How many lines s has. */
static int lines(const char *s)
{
    int n = 0;
    for (; s && *s; s++) n += *s == '\n';
    return n;
}

/* A python3 one-liner over stdin's JSON that prints the value of expr (d is the document). */
#define PY_GET(expr) "python3 -c 'import json,sys; d=json.load(sys.stdin); print(" expr ")'"

KT_TEST(report_version)
{
    char *v = NULL, *V = NULL, *info = NULL;
    KT_EQ_INT(sh(&v, "'%s' --version", kt_kiln_bin()), 0);
    KT_EQ_INT(sh(&V, "'%s' -V", kt_kiln_bin()), 0);
    put_row("d0000000000000000000000000000001", "sm_80", "op=decode dtype=f16 head_dim=64", 40);
    KT_EQ_INT(sh(&info, KILN_AT " info 2>&1", AT), 0);
    KT_REQUIRE(v && V && info);
    KT_EQ_STR(v, V);
    const char *eol = strchr(info, '\n');
    KT_REQUIRE(eol);
    KT_CHECK(!strncmp(v, info, (size_t)(eol - info) + 1)); /* the same first line */
    KT_CONTAINS(v, "\nnvrtc ");
    KT_CONTAINS(v, "key format 1, cache schema ");
    int vs = -1, is = -2; /* the schema -V names is the one info reports for a new cache */
    const char *a = strstr(v, "cache schema "), *b = strstr(info, "(schema ");
    KT_CHECK(a && sscanf(a, "cache schema %d", &vs) == 1 && b && sscanf(b, "(schema %d", &is) == 1);
    KT_EQ_INT(vs, is);
    free(v);
    free(V);
    free(info);
}

KT_TEST(report_stats_counts_lookups)
{
    char *out = NULL;
    KT_EQ_INT(sh(NULL, KILN_AT " compile --arch sm_80 " MERGE_SPEC " >/dev/null 2>&1", AT), 0);
    KT_EQ_INT(sh(NULL, KILN_AT " compile --arch sm_80 " MERGE_SPEC " >/dev/null 2>&1", AT), 0);
    KT_EQ_INT(sh(NULL, KILN_AT " compile --arch sm_80 " MERGE_SPEC " >/dev/null 2>&1", AT), 0);
    KT_EQ_INT(sh(&out, KILN_AT " stats", AT), 0);
    KT_CONTAINS(out, "entries:      1\n");
    KT_CONTAINS(out, "hits:         2\n");
    KT_CONTAINS(out, "misses:       1\n");
    KT_CONTAINS(out, "hit rate:     66.7 %\n");
    KT_CONTAINS(out, "zeroed:       -\n");
    KT_CONTAINS(out, "ARCH      ENTRIES        BYTES     HITS\nsm_80           1 ");
    free(out);
    if (have_python()) {
        KT_EQ_INT(sh(&out,
                     KILN_AT " stats --json | " PY_GET(
                         "d[\"hits\"], d[\"misses\"], "
                         "round(d[\"hit_rate\"], 3), d[\"archs\"][0][\"arch\"], "
                         "d[\"archs\"][0][\"hits\"]"),
                     AT),
                  0);
        KT_EQ_STR(out, "2 1 0.667 sm_80 2\n");
        free(out);
    }
    /* --zero resets the counters and the rows' hits, and stamps the reset */
    KT_EQ_INT(sh(&out, KILN_AT " stats --zero", AT), 0);
    KT_CONTAINS(out, "zeroed the counters of ");
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " stats", AT), 0);
    KT_CONTAINS(out, "hits:         0\n");
    KT_CONTAINS(out, "misses:       0\n");
    KT_CONTAINS(out, "hit rate:     -\n");
    KT_CHECK(!strstr(out, "zeroed:       -\n"));
    KT_CONTAINS(out, "sm_80           1 ");
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls --json", AT), 0);
    KT_CONTAINS(out, "\"hits\": 0");
    free(out);
    KT_EQ_INT(sh(NULL, KILN_AT " compile --arch sm_80 " MERGE_SPEC " >/dev/null 2>&1", AT), 0);
    KT_EQ_INT(sh(&out, KILN_AT " stats", AT), 0);
    KT_CONTAINS(out, "hits:         1\n");
    KT_CONTAINS(out, "hit rate:     100.0 %\n");
    free(out);
}

/* A process that only looked a kernel up writes its hit log, not the database (no WAL, no
 * lock, no fsync); the next process that reads the counters folds the log in and removes it. */
KT_TEST(report_hit_writes_log)
{
    char wal[700], log[700], *out = NULL;
    struct stat sb;
    snprintf(wal, sizeof wal, "%s/kernels.db-wal", cache_dir());
    snprintf(log, sizeof log, "%s/kernels.db-hits", cache_dir());
    KT_EQ_INT(sh(NULL, KILN_AT " compile --arch sm_80 " MERGE_SPEC " >/dev/null 2>&1", AT), 0);
    KT_CHECK(stat(wal, &sb) != 0); /* the compiling process checkpointed and removed it */
    KT_EQ_INT(sh(NULL, KILN_AT " compile --arch sm_80 " MERGE_SPEC " >/dev/null 2>&1", AT), 0);
    KT_CHECK(stat(wal, &sb) != 0);                     /* the hit wrote no database page */
    KT_CHECK(stat(log, &sb) == 0 && sb.st_size == 64); /* but one record */
    KT_EQ_INT(sh(NULL, KILN_AT " compile --arch sm_80 " MERGE_SPEC " >/dev/null 2>&1", AT), 0);
    KT_EQ_INT(sh(&out, KILN_AT " ls", AT), 0); /* a reader of the counters: folds */
    KT_CONTAINS(out, "      2  ");             /* HITS column */
    free(out);
    KT_CHECK(stat(log, &sb) != 0);
    KT_CHECK(stat(wal, &sb) != 0); /* and checkpoints as the last one open */
    KT_EQ_INT(sh(&out, KILN_AT " verify", AT), 0);
    KT_CONTAINS(out, ": 0 bad");
    free(out);
    KT_EQ_INT(sh(NULL, KILN_AT " compile --arch sm_80 " MERGE_SPEC " >/dev/null 2>&1", AT), 0);
    KT_EQ_INT(sh(&out, KILN_AT " stats", AT), 0);
    KT_CONTAINS(out, "hits:         3\n");
    KT_CHECK(!strstr(out, "hit log:"));
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " stats --json", AT), 0);
    KT_CONTAINS(out, "\"hit_log\": null");
    free(out);
    KT_CHECK(mkfifo(log, 0600) == 0); /* planted: lookups go uncounted, and stats say so */
    KT_EQ_INT(sh(NULL, KILN_AT " compile --arch sm_80 " MERGE_SPEC " >/dev/null 2>&1", AT), 0);
    KT_EQ_INT(sh(&out, KILN_AT " stats", AT), 0);
    KT_CONTAINS(out, "hits:         3\n");
    KT_CONTAINS(out, "kernels.db-hits is a FIFO, not a regular file: lookups are not counted");
    free(out);
    unlink(log);
    KT_EQ_INT(sh(NULL, KILN_AT " compile --arch sm_80 " MERGE_SPEC " >/dev/null 2>&1", AT), 0);
    char key[33] = "";
    KT_EQ_INT(sh(&out, KILN_AT " ls --json", AT), 0);
    const char *k = out ? strstr(out, "\"key\": \"") : NULL;
    if (k) snprintf(key, sizeof key, "%.32s", k + 8);
    free(out);
    KT_EQ_INT(sh(NULL, KILN_AT " compile --arch sm_80 " MERGE_SPEC " >/dev/null 2>&1", AT), 0);
    KT_EQ_INT(sh(&out, KILN_AT " show %s 2>&1", AT, key), 0);
    KT_CONTAINS(out, "hits:        6\n"); /* show folds the 5 compiles in, and counts itself */
    free(out);
}

KT_TEST(report_merge_registers)
{
    char *out = NULL;
    KT_EQ_INT(sh(&out, KILN_AT " compile --arch sm_80 " MERGE_SPEC " 2>&1", AT), 0);
    KT_CONTAINS(out, " compiled ");
    KT_CHECK(!strstr(out, "regs=-1"));
    int regs = -1;
    const char *r = out ? strstr(out, "regs=") : NULL;
    KT_CHECK(r && sscanf(r, "regs=%d", &regs) == 1 && regs > 0 && regs <= 255);
    free(out);
    /* a row whose report had no registers (stored by an older kiln) shows '-', JSON null */
    put_row("00000000000000000000000000000001", "sm_80", "op=merge dtype=f16 head_dim=64", -1);
    KT_EQ_INT(sh(&out, KILN_AT " ls --spec head_dim=64", AT), 0);
    KT_CONTAINS(out, "00000000000000000000000000000001 sm_80       -       0");
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls --json --spec head_dim=64", AT), 0);
    KT_CONTAINS(out, "\"regs\": null");
    free(out);
}

KT_TEST(report_ls_filters)
{
    put_row("a0000000000000000000000000000001", "sm_80", "op=decode dtype=f16 head_dim=64 group=1",
            40);
    put_row("a0000000000000000000000000000002", "sm_90a",
            "op=decode dtype=f16 head_dim=128 group=1", 40);
    put_row("a0000000000000000000000000000003", "sm_90a",
            "op=prefill dtype=bf16 head_dim=128 group=4", 40);
    put_row("a0000000000000000000000000000004", "sm_80", "op=merge dtype=f16 head_dim=128 group=1",
            40);
    char *out = NULL;
    KT_EQ_INT(sh(&out, KILN_AT " ls", AT), 0);
    KT_EQ_INT(lines(out), 5);
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls --arch sm_90", AT), 0); /* sm_90 means sm_90a */
    KT_EQ_INT(lines(out), 3);
    KT_CHECK(!strstr(out, " sm_80 "));
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls --arch sm_80,sm_90a --op decode", AT), 0);
    KT_EQ_INT(lines(out), 3);
    KT_CHECK(!strstr(out, "op=prefill") && !strstr(out, "op=merge"));
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls --op merge", AT), 0);
    KT_EQ_INT(lines(out), 2);
    KT_CONTAINS(out, "a0000000000000000000000000000004");
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls --spec head_dim=128", AT), 0);
    KT_EQ_INT(lines(out), 4);
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls --spec head_dim=128 --limit 2", AT), 0);
    KT_EQ_INT(lines(out), 3);
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls --limit 0 --json", AT), 0);
    KT_EQ_STR(out, "[]\n");
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls --op merge --arch sm_90a", AT), 0);
    KT_EQ_INT(lines(out), 1); /* the header only */
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls --limit -1 2>&1", AT), 2);
    KT_CONTAINS(out, "--limit");
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls --arch sm_12 2>&1", AT), 2);
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls --op 'a b' 2>&1", AT), 2);
    free(out);
}

KT_TEST(report_fresh_home)
{
    char home[700], *out = NULL;
    snprintf(home, sizeof home, "%s/home", kt_tmpdir());
    KT_REQUIRE(mkdir(home, 0700) == 0);
#define FRESH "env -u KILN_CACHE_DIR -u XDG_CACHE_HOME HOME='%s' '%s'"
    KT_EQ_INT(sh(&out, FRESH " ls 2>&1", home, kt_kiln_bin()), 0);
    KT_CHECK(out && !strncmp(out, "KEY ", 4));
    KT_EQ_INT(lines(out), 1);
    free(out);
    KT_EQ_INT(sh(&out, FRESH " ls --json 2>&1", home, kt_kiln_bin()), 0);
    KT_EQ_STR(out, "[]\n");
    free(out);
    KT_EQ_INT(sh(&out, FRESH " stats 2>&1", home, kt_kiln_bin()), 0);
    KT_CONTAINS(out, "(no file yet)");
    KT_CONTAINS(out, "entries:      0\n");
    free(out);
    KT_EQ_INT(sh(&out, FRESH " clear 2>&1", home, kt_kiln_bin()), 2);
    free(out);
    char dotcache[800];
    snprintf(dotcache, sizeof dotcache, "%s/.cache", home);
    KT_CHECK(access(dotcache, F_OK) != 0); /* nothing was created */
#undef FRESH
}

KT_TEST(report_clear)
{
    put_row("b0000000000000000000000000000001", "sm_80", "op=decode dtype=f16 head_dim=64 group=1",
            40);
    put_row("b0000000000000000000000000000002", "sm_90a", "op=decode dtype=f16 head_dim=64 group=1",
            40);
    char *out = NULL;
    KT_EQ_INT(sh(&out, KILN_AT " clear 2>&1", AT), 2);
    KT_CONTAINS(out, "kiln clear: this removes all 2 entries of ");
    KT_CONTAINS(out, "--yes");
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls", AT), 0);
    KT_EQ_INT(lines(out), 3); /* nothing went */
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " clear --yes", AT), 0);
    KT_CONTAINS(out, "removed 2 entries from ");
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " ls", AT), 0);
    KT_EQ_INT(lines(out), 1);
    free(out);
    KT_EQ_INT(sh(&out, KILN_AT " clear --yes", AT), 0);
    KT_CONTAINS(out, "removed 0 entries");
    free(out);
}

/* Every reporting command's --json is valid JSON, also with quotes, backslashes, control
 * characters and bytes that are not UTF-8 in the stored strings. */
KT_TEST(report_json_parses)
{
    if (!have_python()) return;
    put_row("c0000000000000000000000000000001", "sm_80",
            "op=decode \"quoted\" back\\slash tab\there\x01\x1f bad\xff\xc3( ok\xc3\xa9", 40);
    put_row("c0000000000000000000000000000002", "sm_\"9\\0a\n", "op=merge\r\nx", -1);
    char *out = NULL;
    const char *cmds[] = {"info --json", "stats --json", "ls --json", "verify --json",
                          "ls --json --op merge"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        int rc = sh(&out, KILN_AT " %s 2>/dev/null | " PY_GET("type(d).__name__"), AT, cmds[i]);
        if (rc != 0 || !out || (strcmp(out, "dict\n") && strcmp(out, "list\n")))
            kt_fail(__FILE__, __LINE__, "kiln %s: not JSON (rc %d): %s", cmds[i], rc,
                    out ? out : "");
        free(out);
    }
    KT_EQ_INT(sh(&out, KILN_AT " ls --json | " PY_GET("sorted(r[\"spec\"] for r in d)[0]"), AT), 0);
    KT_CONTAINS(out, "\"quoted\" back\\slash");
    free(out);
    /* verify finds both rows bad (their keys are not their material's hash) and says why */
    KT_EQ_INT(sh(&out,
                 KILN_AT " verify --json | " PY_GET("d[0][\"rows\"], d[0][\"bad\"], "
                                                    "d[0][\"bad_rows\"][0][\"reason\"][:8]"),
                 AT),
              0);
    KT_CONTAINS(out, "2 2 ");
    free(out);
    /* warm: a one-line manifest, its summary as JSON */
    char manifest[700];
    snprintf(manifest, sizeof manifest, "%s/m.manifest", kt_tmpdir());
    FILE *f = fopen(manifest, "w");
    KT_REQUIRE(f);
    fputs(MERGE_SPEC "\n", f);
    fclose(f);
    KT_EQ_INT(
        sh(&out,
           KILN_AT " warm --arch sm_80 --jobs 1 --json '%s' 2>/dev/null | " PY_GET(
               "d[\"kernels\"], d[\"compiled\"] + d[\"cached\"], d[\"failed\"], d[\"shard\"]"),
           AT, manifest),
        0);
    KT_EQ_STR(out, "1 1 0 [0, 1]\n");
    free(out);
    KT_EQ_INT(sh(&out,
                 KILN_AT " warm --arch sm_80 --shard 1/2 --json '%s' 2>/dev/null | " PY_GET(
                     "d[\"kernels\"], d[\"shard\"]"),
                 AT, manifest),
              0);
    KT_EQ_STR(out, "0 [1, 2]\n");
    free(out);
}

KT_TEST(report_completion)
{
    char *out = NULL, *help = NULL;
    KT_EQ_INT(sh(&out, "'%s' completion bash", kt_kiln_bin()), 0);
    KT_EQ_INT(sh(&help, "'%s' help", kt_kiln_bin()), 0);
    KT_REQUIRE(out && help);
    /* every command of the table is in the script */
    int ncmds = 0;
    const char *p = strstr(help, "commands:\n");
    for (p = p ? p + 10 : NULL; p && p[0] == ' ' && p[1] == ' '; p = strchr(p, '\n') + 1) {
        char name[32], needle[40];
        if (sscanf(p, "%31s", name) != 1 || !strchr(p, '\n')) break;
        snprintf(needle, sizeof needle, "    %s) opts=", name);
        if (!strstr(out, needle))
            kt_fail(__FILE__, __LINE__, "bash completion lacks command %s", name);
        ncmds++;
    }
    KT_CHECK(ncmds >= 15);
    KT_CONTAINS(out, "ls) opts='--arch --op --spec --limit --json'");
    KT_CONTAINS(out, "stats) opts='--zero --json'");
    KT_CONTAINS(out, "clear) opts='--yes' ;;"); /* not the --vacuum its prose mentions */
    KT_CONTAINS(out, "gc) opts='--max-size --vacuum' ;;");
    free(out);
    free(help);
    if (system("command -v bash >/dev/null 2>&1") != 0) {
        kt_skip("bash not found: the completion script was not checked");
        return;
    }
    KT_EQ_INT(sh(&out, "'%s' completion bash | bash -n 2>&1", kt_kiln_bin()), 0);
    free(out);
    /* run it: complete "kiln st" and "kiln ls --l" */
    KT_EQ_INT(
        sh(&out,
           "bash -c 'source <(\"$0\" completion bash); COMP_WORDS=(kiln st); COMP_CWORD=1; "
           "_kiln; echo \"${COMPREPLY[*]}\"; COMP_WORDS=(kiln --cache d ls --l); COMP_CWORD=4; "
           "_kiln; echo \"${COMPREPLY[*]}\"; COMP_WORDS=(kiln warm --arch sm_9); COMP_CWORD=3; "
           "_kiln; echo \"${COMPREPLY[*]}\"' '%s' 2>&1",
           kt_kiln_bin()),
        0);
    KT_CONTAINS(out, "stats\n--limit\n");
    KT_CONTAINS(out, "sm_90a");
    free(out);
    KT_EQ_INT(sh(&out, "'%s' completion fish 2>&1", kt_kiln_bin()), 2);
    free(out);
    KT_EQ_INT(sh(&out, "'%s' completion zsh", kt_kiln_bin()), 0);
    KT_CONTAINS(out, "#compdef kiln\n");
    KT_CONTAINS(out, "'clear:remove every cache entry (needs --yes)'");
    free(out);
    if (system("command -v zsh >/dev/null 2>&1") != 0) {
        kt_skip("zsh not found: the zsh script was generated but not parsed (bash was)");
        return;
    }
    KT_EQ_INT(sh(&out, "'%s' completion zsh | zsh -n 2>&1", kt_kiln_bin()), 0);
    free(out);
}
