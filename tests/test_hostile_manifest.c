/*
 * test_hostile_manifest.c — manifests that are not what they claim (issue #14,
 * class 2): NUL bytes and other binary input, endless and over-long lines, too
 * many brace groups, a total expansion past the bound, and the progress lines
 * of a large manifest. Each is refused with exit status 2 and the file:line,
 * quickly, before any cache is created or anything compiled. Runs the kiln
 * binary; compiles nothing.
 */
#include <time.h>

#include "cache.h"
#include "jit.h"
#include "kt.h"

/* A valid line that expands to 4^6 = 4096 specs (the per-line limit), all
 * distinct. */
#define LINE_4096                                                                                  \
    "op=decode head_dim={64,128,256,64} dtype={f16,bf16,f16,bf16} "                                \
    "group={1,2,4,8} "                                                                             \
    "lse={0,1,0,1} layout={nhd,hnd,nhd,hnd} mask={none,causal,none,causal}\n"

/* Run `kiln --cache <tmp>/c warm --arch sm_90a MANIFEST` and expect exit 2 with
 * every needle on stderr and no cache created. */
static void refused(const char *manifest, const char *in, const char *n1, const char *n2)
{
    kt_out r;
    kt_kiln(&r, in, NULL,
            (const char *const[]){"--cache", kt_path("c"), "warm", "--arch", "sm_90a", manifest,
                                  NULL});
    KT_EQ_INT(r.code, 2);
    KT_CONTAINS(r.err, n1);
    if (n2) KT_CONTAINS(r.err, n2);
    KT_EQ_STR(r.out, "");
    KT_CHECK(!kt_exists(kt_path("c")));
    kt_out_free(&r);
}

KT_TEST(hostile_manifest_binary)
{
    /* /dev/zero: endless NULs, refused at the first byte (not read until memory
   * runs out) */
    refused("/dev/zero", NULL, "/dev/zero:1: byte 0x00 at column 1", "a manifest is text");
    /* the same on stdin */
    refused("-", "/dev/zero", "<stdin>:1: byte 0x00", NULL);
    /* a file of NULs is not an empty manifest */
    static char zeros[4096];
    kt_write(kt_path("zeros"), zeros, sizeof zeros);
    refused(kt_path("zeros"), NULL, "zeros:1: byte 0x00", NULL);
    /* a NUL inside line 2 does not silently end it (the text after it is not
   * ignored) */
    static const char nul2[] = "op=decode head_dim=64\nop=decode head_dim=128\0 group=4\n";
    kt_write(kt_path("nul2"), nul2, sizeof nul2 - 1);
    refused(kt_path("nul2"), NULL, "nul2:2: byte 0x00 at column 23", NULL);
    /* an escape sequence (a terminal would act on it) and a DEL */
    kt_write(kt_path("esc"), "# fine\n\033[2Jop=decode\n", strlen("# fine\n\033[2Jop=decode\n"));
    refused(kt_path("esc"), NULL, "esc:2: byte 0x1b at column 1", NULL);
    kt_write(kt_path("del"), "op=decode\x7f\n", 11);
    refused(kt_path("del"), NULL, "del:1: byte 0x7f at column 10", NULL);
}

KT_TEST(hostile_manifest_long_lines)
{
    enum { LIMIT = 16384 };
    char *buf = malloc(4 * LIMIT);
    KT_REQUIRE(buf);
    /* an endless line without a newline: reading stops at the limit */
    memset(buf, 'a', 4 * LIMIT);
    kt_write(kt_path("long"), buf, 4 * LIMIT);
    refused(kt_path("long"), NULL, "long:1: line longer than 16384 bytes", "stopped reading");
    /* exactly at the limit (a comment line) is fine: an empty manifest, exit 0 */
    buf[0] = '#';
    buf[LIMIT] = '\n';
    kt_write(kt_path("edge"), buf, LIMIT + 1);
    kt_out r;
    KT_KILN(&r, "--cache", kt_path("c-edge"), "warm", "--arch", "sm_90a", kt_path("edge"));
    KT_EQ_INT(r.code, 0);
    KT_CONTAINS(r.out, "0 kernels");
    kt_out_free(&r);
    /* one byte more, on line 3 */
    memcpy(buf, "#a\n#b\n#", 7);
    memset(buf + 7, 'x', LIMIT);
    buf[LIMIT + 7] = '\n';
    kt_write(kt_path("over"), buf, LIMIT + 8);
    refused(kt_path("over"), NULL, "over:3: line longer than 16384", NULL);
    free(buf);
    /* 33 brace groups of one alternative each */
    char line[512] = "op=decode head_dim=64";
    for (int i = 0; i < 33; i++) strcat(line, " x{a}");
    strcat(line, "\n");
    kt_write(kt_path("braces"), line, strlen(line));
    refused(kt_path("braces"), NULL, "braces:1: 33 brace groups on one line; at most 32", NULL);
}

KT_TEST(hostile_manifest_expansion)
{
    /* 17 lines of 4096 specs: past the 65536 bound on line 17, with progress on
   * the way */
    FILE *f = fopen(kt_path("big"), "w");
    KT_REQUIRE(f);
    for (int i = 0; i < 17; i++) fputs(LINE_4096, f);
    fclose(f);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    refused(kt_path("big"), NULL, "big:17: the manifest expands to more than 65536 specs",
            "(65536 before this line, 4096 on it)");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    KT_CHECK(t1.tv_sec - t0.tv_sec < 10); /* refused in well under a second on the 2-core box */
    /* a large manifest within the bound says where it is while it reads: export
   * reads it before it opens the (missing) cache */
    f = fopen(kt_path("mid"), "w");
    KT_REQUIRE(f);
    for (int i = 0; i < 3; i++) fputs(LINE_4096, f);
    fclose(f);
    kt_out r;
    KT_KILN(&r, "--cache", kt_path("c"), "export", "--arch", "sm_90a", "--spec-file",
            kt_path("mid"), kt_path("out.db"));
    KT_EQ_INT(r.code, 1); /* the cache does not exist: nothing to export from */
    KT_CONTAINS(r.err, "reading ");
    KT_CONTAINS(r.err, "mid: line 2, 8192 specs so far");
    KT_CONTAINS(r.err, "mid: 3 lines, 12288 specs (");
    KT_CONTAINS(r.err, "no such cache");
    KT_CHECK(!kt_exists(kt_path("c")) && !kt_exists(kt_path("out.db")));
    kt_out_free(&r);
}
