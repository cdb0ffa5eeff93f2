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
#include <sqlite3.h>

#include "hostile.h"

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
    snprintf(missing, sizeof missing, "%s", h_path("missing"));
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
            args[n++] = strcmp(cmds[i][j], "OUT") ? cmds[i][j] : h_path("out.db");
        args[n] = NULL;
        h_run r;
        h_run_in(&r, NULL, args);
        if (r.code == 0) printf("    %s: exit 0\n", cmds[i][0]);
        KT_CHECK(r.code != 0);
        KT_CONTAINS(r.err, "no such cache");
        KT_CHECK(!h_exists(missing));
        KT_CHECK(!h_exists(h_path("out.db")));
        h_free(&r);
    }
    /* info says there is none, exits 0, and creates none either */
    h_run r;
    KT_EQ_INT(H_RUN(&r, "--cache", missing, "info"), 0);
    KT_CONTAINS(r.out, "cache: none (");
    KT_CHECK(!h_exists(missing));
    h_free(&r);
    /* verify and verify --fix on named paths (a missing directory, a missing
   * file) */
    KT_REQUIRE(mkdir(h_path("d"), 0700) == 0);
    const char *paths[] = {missing, h_path("d/kernels.db"), h_path("d")};
    for (int i = 0; i < 3; i++) {
        KT_EQ_INT(H_RUN(&r, "verify", "--fix", paths[i]), 1);
        KT_CONTAINS(r.err, "no such cache");
        h_free(&r);
        KT_EQ_INT(H_RUN(&r, "verify", paths[i]), 1);
        h_free(&r);
    }
    KT_CHECK(!h_exists(missing));
    KT_EQ_INT(count_entries(h_path("d")), 0);
    /* an empty kernels.db is not initialised by them */
    h_write(h_path("d/kernels.db"), "", 0);
    KT_EQ_INT(H_RUN(&r, "--cache", h_path("d"), "ls"), 1);
    KT_CONTAINS(r.err, "an empty file");
    h_free(&r);
    KT_EQ_INT(H_RUN(&r, "verify", "--fix", h_path("d")), 1);
    h_free(&r);
    struct stat sb;
    KT_CHECK(stat(h_path("d/kernels.db"), &sb) == 0 && sb.st_size == 0);
    KT_EQ_INT(count_entries(h_path("d")), 1);
}

KT_TEST(hostile_cli_foreign_files)
{
    /* a user's files named as the cache (directory or file): refused, left as
   * they were */
    static const char *const texts[] = {"x", "notes\n", "SQLite format 2\n"};
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "f%d", i);
        const char *f = h_path(name);
        h_write(f, texts[i], strlen(texts[i]));
        const char *cmds[] = {"ls", "gc", "info", "verify"};
        for (int j = 0; j < 4; j++) {
            h_run r;
            KT_EQ_INT(H_RUN(&r, "--cache", f, cmds[j]), 1);
            KT_CONTAINS(r.err, "not a kiln cache");
            h_free(&r);
        }
        h_run r;
        KT_EQ_INT(H_RUN(&r, "merge", f, h_path("nothing")), 1);
        h_free(&r);
        char *after = h_slurp(f, NULL);
        KT_EQ_STR(after, texts[i]);
        free(after);
        char side[600];
        snprintf(side, sizeof side, "%s-wal", f);
        KT_CHECK(!h_exists(side));
    }
}

/* The number of rows of the cache dir, as `kiln ls --json` counts them (-1 on
 * failure). */
static int rows_of(const char *dir)
{
    h_run r;
    int n = -1;
    if (H_RUN(&r, "--cache", dir, "ls") == 0) {
        n = -1; /* the header line */
        for (const char *p = r.out; *p; p++) n += *p == '\n';
    }
    h_free(&r);
    return n;
}

KT_TEST(hostile_cli_show_cubin_targets)
{
    char dir[512], keys[2][33];
    snprintf(dir, sizeof dir, "%s", h_path("c"));
    KT_REQUIRE(h_cache(dir, two_specs, 2, keys) == 0);
    KT_EQ_INT(rows_of(dir), 2);
    KT_REQUIRE(link(h_path("c/kernels.db"), h_path("hard.db")) == 0);
    KT_REQUIRE(symlink(h_path("c/kernels.db"), h_path("soft.db")) == 0);
    KT_REQUIRE(symlink(h_path("nowhere"), h_path("dangling")) == 0);
    h_write(h_path("mine.txt"), "my notes\n", 9);
    char dotted[600];
    snprintf(dotted, sizeof dotted, "%s/c/../c/kernels.db", kt_tmpdir());
    const char *targets[] = {h_path("c/kernels.db"),
                             dotted,
                             h_path("hard.db"),
                             h_path("soft.db"),
                             h_path("c/kernels.db-wal"),
                             h_path("c/kernels.db-shm"),
                             h_path("c/kernels.db-journal"),
                             h_path("dangling"),
                             h_path("mine.txt")};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        h_run r;
        int code = H_RUN(&r, "--cache", dir, "show", keys[0], "--cubin", targets[i]);
        if (code != 2) printf("    target %s: exit %d: %s\n", targets[i], code, r.err);
        KT_EQ_INT(code, 2);
        KT_CONTAINS(r.err, i < 7 ? "is the cache being read" : "already exists");
        h_free(&r);
    }
    /* export's OUT is held to the same rule (a directory names its kernels.db) */
    const char *outs[] = {dir, h_path("c/kernels.db-wal"), h_path("hard.db")};
    for (int i = 0; i < 3; i++) {
        h_run r;
        KT_EQ_INT(H_RUN(&r, "--cache", dir, "export", outs[i]), 2);
        KT_CONTAINS(r.err, "is the cache being exported");
        h_free(&r);
    }
    KT_EQ_INT(rows_of(dir), 2);
    char *mine = h_slurp(h_path("mine.txt"), NULL);
    KT_EQ_STR(mine, "my notes\n");
    free(mine);
    KT_CHECK(!h_exists(h_path("c/kernels.db-journal")));
    /* a new file is written, byte for byte the cubin, and then not overwritten */
    h_run r;
    KT_EQ_INT(H_RUN(&r, "--cache", dir, "show", keys[1], "--cubin", h_path("k.cubin")), 0);
    if (r.code) printf("    %s", r.err);
    h_free(&r);
    size_t n = 0;
    char *got = h_slurp(h_path("k.cubin"), &n);
    unsigned char want[64];
    h_cubin(want, 1);
    KT_CHECK(n == 64 && got && memcmp(got, want, 64) == 0);
    free(got);
    KT_EQ_INT(H_RUN(&r, "--cache", dir, "show", keys[0], "--cubin", h_path("k.cubin")), 2);
    h_free(&r);
    got = h_slurp(h_path("k.cubin"), &n);
    KT_CHECK(n == 64 && got && memcmp(got, want, 64) == 0);
    free(got);
}

/* Run sql on the cache file on a connection of our own; 1 on success. */
static int tamper(const char *db, const char *sql)
{
    sqlite3 *h = NULL;
    int ok =
        sqlite3_open(db, &h) == SQLITE_OK && sqlite3_exec(h, sql, NULL, NULL, NULL) == SQLITE_OK;
    sqlite3_close(h);
    return ok;
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
        const char *dir = h_path(name);
        char keys[2][33], db[600];
        KT_REQUIRE(h_cache(dir, two_specs, 2, keys) == 0);
        snprintf(db, sizeof db, "%s/kernels.db", dir);
        h_run r;
        KT_EQ_INT(H_RUN(&r, "verify", dir), 0);
        KT_CONTAINS(r.out, ": 0 bad");
        h_free(&r);
        KT_REQUIRE(tamper(db, edits[i]));
        KT_EQ_INT(H_RUN(&r, "verify", dir), 1);
        KT_CONTAINS(r.out, ": 1 bad");
        KT_CONTAINS(r.out, "row checksum mismatch");
        h_free(&r);
        /* show refuses to print the edited row as truth */
        KT_EQ_INT(H_RUN(&r, "--cache", dir, "show", keys[0]), 1); /* rowid 1 */
        KT_CONTAINS(r.err, "failed its row checksum");
        h_free(&r);
        KT_EQ_INT(H_RUN(&r, "verify", "--fix", dir), 0);
        KT_CONTAINS(r.out, "1 bad, 1 removed");
        h_free(&r);
    }
}

KT_TEST(hostile_cli_control_chars)
{
    /* a row whose spec (in its key material too, so that it is otherwise sound)
   * holds an escape sequence, a bell, a carriage return and a C1 CSI */
    static const char *const specs[] = {"op=decode \033]0;pwned\007 head_dim=64\r\302\233"};
    char keys[1][33];
    const char *dir = h_path("e");
    KT_REQUIRE(h_cache(dir, specs, 1, keys) == 0);
    const char *const views[][4] = {{"ls", NULL}, {"show", keys[0], NULL}, {"verify", NULL}};
    for (int i = 0; i < 3; i++) {
        const char *args[8] = {"--cache", dir};
        int n = 2;
        for (int j = 0; views[i][j]; j++) args[n++] = views[i][j];
        args[n] = NULL;
        h_run r;
        h_run_in(&r, NULL, args);
        KT_EQ_INT(r.code, 0);
        KT_CHECK(!strchr(r.out, '\033') && !strchr(r.out, '\007') && !strchr(r.out, '\r'));
        KT_CHECK(!strstr(r.out, "\302\233"));
        if (i < 2) {
            KT_CONTAINS(r.out, "\\x1b]0;pwned\\x07 head_dim=64\\x0d\\u009b");
        }
        h_free(&r);
    }
    /* --key-material to a pipe is the exact text (documented: escaped only on a
   * terminal) */
    h_run r;
    KT_EQ_INT(H_RUN(&r, "--cache", dir, "show", keys[0], "--key-material"), 0);
    KT_CONTAINS(r.out, specs[0]);
    h_free(&r);
}

KT_TEST(hostile_cli_warm_evicted)
{
    /* two kernels into a cache bounded to 1 byte: the first is evicted by the
   * second's store, and warm says so (not "see the message above" with no
   * message above) */
    const char *m = h_path("m.txt");
    static const char text[] = "op=decode dtype={f16,bf16} head_dim=64\n";
    h_write(m, text, strlen(text));
    h_run r;
    KT_EQ_INT(H_RUN(&r, "--cache", h_path("c"), "--max-size", "1", "warm", "--arch", "sm_80",
                    "--jobs", "1", m),
              1);
    KT_CONTAINS(r.out, "2 kernels: 1 compiled, 0 cached, 1 failed");
    KT_CONTAINS(r.err, "evicted by the size bound");
    KT_CONTAINS(r.err, "at most 1 bytes of cubins (--max-size)");
    KT_CONTAINS(r.err, "this entry is ");
    KT_CHECK(!strstr(r.err, "see the message above"));
    h_free(&r);
}
