/*
 * test_hostile_cli.c — the kiln commands against inputs they must not trust
 * (issue #14): commands that only read, check or tidy a cache create none (ls,
 * show, rm, info, gc, verify, verify --fix, export's input); files that are not
 * caches are refused untouched; show --cubin never writes over the cache it
 * reads (by inode: the file, a hard link, a symlink, -wal, -shm) nor over any
 * existing file; verify checks every stored field; control characters in a row
 * never reach the terminal raw; warm names the size bound when it evicted what
 * it compiled. Runs the kiln binary; one test compiles two small kernels.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache.h"
#include "jit.h"
#include "kt.h"

static const char *const two_specs[] = {"op=decode dtype=f16 head_dim=64",
                                        "op=decode dtype=bf16 head_dim=64"};

/* Every file name under dir, one per line (for "nothing was created" checks).
 */
static int count_entries(const char *dir)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls -A '%s' 2>/dev/null | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1) n = -1;
        pclose(p);
    }
    return n;
}

KT_TEST(hostile_cli_read_commands_create_nothing)
{
    char missing[512];
    snprintf(missing, sizeof missing, "%s", kt_path("missing"));
    /* each reads, checks or tidies a cache: on a missing one it fails and creates
   * nothing */
    const char *const cmds[][6] = {
        {"ls", NULL},
        {"show", "0123abcd", NULL},
        {"rm", "0123abcd", NULL},
        {"gc", NULL},
        {"gc", "--vacuum", NULL},
        {"verify", NULL},
        {"export", "--arch", "sm_80", "OUT", NULL},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        const char *args[12] = {"--cache", missing};
        int n = 2;
        for (int j = 0; cmds[i][j]; j++)
            args[n++] = strcmp(cmds[i][j], "OUT") ? cmds[i][j] : kt_path("out.db");
        args[n] = NULL;
        kt_out r;
        kt_kiln(&r, NULL, NULL, args);
        if (r.code == 0) printf("    %s: exit 0\n", cmds[i][0]);
        KT_CHECK(r.code != 0);
        KT_CONTAINS(r.err, "no such cache");
        KT_CHECK(!kt_exists(missing));
        KT_CHECK(!kt_exists(kt_path("out.db")));
        kt_out_free(&r);
    }
    /* info says there is none, exits 0, and creates none either */
    kt_out r;
    KT_EQ_INT(KT_KILN(&r, "--cache", missing, "info"), 0);
    KT_CONTAINS(r.out, "cache: none (");
    KT_CHECK(!kt_exists(missing));
    kt_out_free(&r);
    /* verify and verify --fix on named paths (a missing directory, a missing
   * file) */
    KT_REQUIRE(mkdir(kt_path("d"), 0700) == 0);
    const char *paths[] = {missing, kt_path("d/kernels.db"), kt_path("d")};
    for (int i = 0; i < 3; i++) {
        KT_EQ_INT(KT_KILN(&r, "verify", "--fix", paths[i]), 1);
        KT_CONTAINS(r.err, "no such cache");
        kt_out_free(&r);
        KT_EQ_INT(KT_KILN(&r, "verify", paths[i]), 1);
        kt_out_free(&r);
    }
    KT_CHECK(!kt_exists(missing));
    KT_EQ_INT(count_entries(kt_path("d")), 0);
    /* an empty kernels.db is not initialised by them */
    kt_write(kt_path("d/kernels.db"), "", 0);
    KT_EQ_INT(KT_KILN(&r, "--cache", kt_path("d"), "ls"), 1);
    KT_CONTAINS(r.err, "an empty file");
    kt_out_free(&r);
    KT_EQ_INT(KT_KILN(&r, "verify", "--fix", kt_path("d")), 1);
    kt_out_free(&r);
    struct stat sb;
    KT_CHECK(stat(kt_path("d/kernels.db"), &sb) == 0 && sb.st_size == 0);
    KT_EQ_INT(count_entries(kt_path("d")), 1);
}

KT_TEST(hostile_cli_foreign_files)
{
    /* a user's files named as the cache (directory or file): refused, left as
   * they were */
    static const char *const texts[] = {"x", "notes\n", "SQLite format 2\n"};
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "f%d", i);
        const char *f = kt_path(name);
        kt_write(f, texts[i], strlen(texts[i]));
        const char *cmds[] = {"ls", "gc", "info", "verify"};
        for (int j = 0; j < 4; j++) {
            kt_out r;
            KT_EQ_INT(KT_KILN(&r, "--cache", f, cmds[j]), 1);
            KT_CONTAINS(r.err, "not a kiln cache");
            kt_out_free(&r);
        }
        kt_out r;
        KT_EQ_INT(KT_KILN(&r, "merge", f, kt_path("nothing")), 1);
        kt_out_free(&r);
        char *after = kt_slurp(f, NULL);
        KT_EQ_STR(after, texts[i]);
        free(after);
        char side[600];
        snprintf(side, sizeof side, "%s-wal", f);
        KT_CHECK(!kt_exists(side));
    }
}

/* The number of rows of the cache dir, as `kiln ls --json` counts them (-1 on
 * failure). */
static int rows_of(const char *dir)
{
    kt_out r;
    int n = -1;
    if (KT_KILN(&r, "--cache", dir, "ls") == 0) {
        n = -1; /* the header line */
        for (const char *p = r.out; *p; p++) n += *p == '\n';
    }
    kt_out_free(&r);
    return n;
}

KT_TEST(hostile_cli_show_cubin_targets)
{
    char dir[512], keys[2][33];
    snprintf(dir, sizeof dir, "%s", kt_path("c"));
    KT_REQUIRE(kt_cache_fill(dir, two_specs, 2, keys) == 0);
    KT_EQ_INT(rows_of(dir), 2);
    KT_REQUIRE(link(kt_path("c/kernels.db"), kt_path("hard.db")) == 0);
    KT_REQUIRE(symlink(kt_path("c/kernels.db"), kt_path("soft.db")) == 0);
    KT_REQUIRE(symlink(kt_path("nowhere"), kt_path("dangling")) == 0);
    kt_write(kt_path("mine.txt"), "my notes\n", 9);
    char dotted[600];
    snprintf(dotted, sizeof dotted, "%s/c/../c/kernels.db", kt_tmpdir());
    const char *targets[] = {kt_path("c/kernels.db"),
                             dotted,
                             kt_path("hard.db"),
                             kt_path("soft.db"),
                             kt_path("c/kernels.db-wal"),
                             kt_path("c/kernels.db-shm"),
                             kt_path("c/kernels.db-journal"),
                             kt_path("dangling"),
                             kt_path("mine.txt")};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        kt_out r;
        int code = KT_KILN(&r, "--cache", dir, "show", keys[0], "--cubin", targets[i]);
        if (code != 2) printf("    target %s: exit %d: %s\n", targets[i], code, r.err);
        KT_EQ_INT(code, 2);
        KT_CONTAINS(r.err, i < 7 ? "is the cache being read" : "already exists");
        kt_out_free(&r);
    }
    /* export's OUT is held to the same rule (a directory names its kernels.db) */
    const char *outs[] = {dir, kt_path("c/kernels.db-wal"), kt_path("hard.db")};
    for (int i = 0; i < 3; i++) {
        kt_out r;
        KT_EQ_INT(KT_KILN(&r, "--cache", dir, "export", outs[i]), 2);
        KT_CONTAINS(r.err, "is the cache being exported");
        kt_out_free(&r);
    }
    KT_EQ_INT(rows_of(dir), 2);
    char *mine = kt_slurp(kt_path("mine.txt"), NULL);
    KT_EQ_STR(mine, "my notes\n");
    free(mine);
    KT_CHECK(!kt_exists(kt_path("c/kernels.db-journal")));
    /* a new file is written, byte for byte the cubin, and then not overwritten */
    kt_out r;
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "show", keys[1], "--cubin", kt_path("k.cubin")), 0);
    if (r.code) printf("    %s", r.err);
    kt_out_free(&r);
    size_t n = 0;
    char *got = kt_slurp(kt_path("k.cubin"), &n);
    unsigned char want[64];
    kt_cubin(want, 1);
    KT_CHECK(n == 64 && got && memcmp(got, want, 64) == 0);
    free(got);
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "show", keys[0], "--cubin", kt_path("k.cubin")), 2);
    kt_out_free(&r);
    got = kt_slurp(kt_path("k.cubin"), &n);
    KT_CHECK(n == 64 && got && memcmp(got, want, 64) == 0);
    free(got);
}

KT_TEST(hostile_cli_verify_every_field)
{
    static const char *const edits[] = {
        "UPDATE kernels SET source = 'int evil;' WHERE rowid = 1",
        "UPDATE kernels SET log = '' WHERE rowid = 1",
        "UPDATE kernels SET registers = registers + 1 WHERE rowid = 1",
        "UPDATE kernels SET nvrtc = '99.0' WHERE rowid = 1",
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        char name[16];
        snprintf(name, sizeof name, "v%zu", i);
        const char *dir = kt_path(name);
        char keys[2][33], db[600];
        KT_REQUIRE(kt_cache_fill(dir, two_specs, 2, keys) == 0);
        snprintf(db, sizeof db, "%s/kernels.db", dir);
        kt_out r;
        KT_EQ_INT(KT_KILN(&r, "verify", dir), 0);
        KT_CONTAINS(r.out, ": 0 bad");
        kt_out_free(&r);
        KT_REQUIRE(kt_sql_exec(db, edits[i]));
        KT_EQ_INT(KT_KILN(&r, "verify", dir), 1);
        KT_CONTAINS(r.out, ": 1 bad");
        KT_CONTAINS(r.out, "row checksum mismatch");
        kt_out_free(&r);
        /* show refuses to print the edited row as truth */
        KT_EQ_INT(KT_KILN(&r, "--cache", dir, "show", keys[0]), 1); /* rowid 1 */
        KT_CONTAINS(r.err, "failed its row checksum");
        kt_out_free(&r);
        KT_EQ_INT(KT_KILN(&r, "verify", "--fix", dir), 0);
        KT_CONTAINS(r.out, "1 bad, 1 removed");
        kt_out_free(&r);
    }
}

KT_TEST(hostile_cli_control_chars)
{
    /* a row whose spec (in its key material too, so that it is otherwise sound)
   * holds an escape sequence, a bell, a carriage return and a C1 CSI */
    static const char *const specs[] = {"op=decode \033]0;pwned\007 head_dim=64\r\302\233"};
    char keys[1][33];
    const char *dir = kt_path("e");
    KT_REQUIRE(kt_cache_fill(dir, specs, 1, keys) == 0);
    const char *const views[][4] = {{"ls", NULL}, {"show", keys[0], NULL}, {"verify", NULL}};
    for (int i = 0; i < 3; i++) {
        const char *args[8] = {"--cache", dir};
        int n = 2;
        for (int j = 0; views[i][j]; j++) args[n++] = views[i][j];
        args[n] = NULL;
        kt_out r;
        kt_kiln(&r, NULL, NULL, args);
        KT_EQ_INT(r.code, 0);
        KT_CHECK(!strchr(r.out, '\033') && !strchr(r.out, '\007') && !strchr(r.out, '\r'));
        KT_CHECK(!strstr(r.out, "\302\233"));
        if (i < 2) {
            KT_CONTAINS(r.out, "\\x1b]0;pwned\\x07 head_dim=64\\x0d\\u009b");
        }
        kt_out_free(&r);
    }
    /* --key-material to a pipe is the exact text (documented: escaped only on a
   * terminal) */
    kt_out r;
    KT_EQ_INT(KT_KILN(&r, "--cache", dir, "show", keys[0], "--key-material"), 0);
    KT_CONTAINS(r.out, specs[0]);
    kt_out_free(&r);
}

KT_TEST(hostile_cli_warm_evicted)
{
    /* two kernels into a cache bounded to 1 byte: the first is evicted by the
   * second's store, and warm says so (not "see the message above" with no
   * message above) */
    const char *m = kt_path("m.txt");
    static const char text[] = "op=decode dtype={f16,bf16} head_dim=64\n";
    kt_write(m, text, strlen(text));
    kt_out r;
    KT_EQ_INT(KT_KILN(&r, "--cache", kt_path("c"), "--max-size", "1", "warm", "--arch", "sm_80",
                      "--jobs", "1", m),
              1);
    KT_CONTAINS(r.out, "2 kernels: 1 compiled, 0 cached, 1 failed");
    KT_CONTAINS(r.err, "evicted by the size bound");
    KT_CONTAINS(r.err, "at most 1 bytes of cubins (--max-size)");
    KT_CONTAINS(r.err, "this entry is ");
    KT_CHECK(!strstr(r.err, "see the message above"));
    kt_out_free(&r);
}
