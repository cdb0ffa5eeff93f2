/*
 * test_cli.c — the `kiln` binary end to end: help and usage errors, compile then cached, several
 * archs, ls (text and JSON), show (summary, source, key material, cubin), rm, warm on a small
 * manifest (twice, and from stdin), malformed and missing manifests, info, and the GPU-less
 * paths of compile and check. Each test runs the binary (kt_kiln_bin) with fork + exec on a
 * cache in its own temp dir and captures stdout, stderr and the exit status.
 *
 * Compiles are the slow part (~0.5 s each): the whole file does six, all decode head_dim=64.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kt.h"

/* Most arguments one run passes. */
#define RUN_ARGS_MAX 32

/* Run `kiln --cache <tmp>/cache args...` with stdin from `in` (NULL: /dev/null). Returns the
 * exit status (also in r->code). */
static int run_in(kt_out *r, const char *in, const char *const *args)
{
    const char *argv[RUN_ARGS_MAX + 3] = {"--cache", kt_path("cache")};
    int argc = 2;
    for (int i = 0; args[i] && argc < RUN_ARGS_MAX; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    return kt_kiln(r, in, NULL, argv);
}

#define RUN(r, ...)           run_in((r), NULL, (const char *const[]){__VA_ARGS__, NULL})
#define RUN_STDIN(r, in, ...) run_in((r), (in), (const char *const[]){__VA_ARGS__, NULL})

/* Count the lines of s. */
static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* Copy the 32-character key that starts line `line` (0-based) of out into key. */
static void key_of_line(const char *out, int line, char key[33])
{
    key[0] = 0;
    for (; line > 0 && out; line--) {
        out = strchr(out, '\n');
        if (out) out++;
    }
    if (out && strlen(out) >= 32) {
        memcpy(key, out, 32);
        key[32] = 0;
    }
}

/* ---- help and usage ------------------------------------------------------------------------- */

KT_TEST(cli_help)
{
    if (!KT_HAVE_KILN()) return;
    kt_out r;
    KT_EQ_INT(RUN(&r, "--help"), 0);
    KT_CONTAINS(r.out, "usage: kiln");
    KT_CONTAINS(r.out, "warm");
    kt_out_free(&r);
    static const char *const cmds[] = {"info",  "compile", "warm",   "ls", "show",  "rm",
                                       "check", "help",    "verify", "gc", "merge", "export"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "usage: kiln %s", cmds[i]);
        KT_EQ_INT(RUN(&r, cmds[i], "--help"), 0);
        KT_CONTAINS(r.out, want);
        kt_out_free(&r);
        KT_EQ_INT(RUN(&r, cmds[i], "-h"), 0);
        KT_CONTAINS(r.out, want);
        kt_out_free(&r);
    }
    KT_EQ_INT(RUN(&r, "help", "show"), 0);
    KT_CONTAINS(r.out, "--key-material");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "--version"), 0);
    KT_CONTAINS(r.out, kiln_version());
    kt_out_free(&r);
}

KT_TEST(cli_usage_errors)
{
    if (!KT_HAVE_KILN()) return;
    kt_out r;
    KT_EQ_INT(RUN(&r, "frobnicate"), 2);
    KT_CONTAINS(r.err, "unknown command 'frobnicate'");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "compile", "--bogus", KT_SPEC_0), 2);
    KT_CONTAINS(r.err, "kiln compile: unknown option '--bogus'");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "--bogus", "ls"), 2);
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "ls", "extra"), 2);
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "compile", "--arch"), 2);
    KT_CONTAINS(r.err, "needs a value");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "compile", "--arch", "sm_90a"), 2);
    KT_CONTAINS(r.err, "missing SPEC");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "warm", "--jobs", "0", "m.txt"), 2);
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "rm"), 2);
    kt_out_free(&r);
}

KT_TEST(cli_bad_spec_and_arch)
{
    if (!KT_HAVE_KILN()) return;
    kt_out r;
    /* Several words joined into one spec; the bad token is named. */
    KT_EQ_INT(RUN(&r, "compile", "--arch", "sm_90a", "op=decode", "frobnicate=1"), 2);
    KT_CONTAINS(r.err, "kiln compile: ");
    KT_CONTAINS(r.err, "frobnicate");
    KT_EQ_STR(r.out, "");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "compile", "--arch", "sm_90a", "op=decode head_dim=65"), 2);
    KT_CONTAINS(r.err, "head_dim");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "compile", "--arch", "sm_75", KT_SPEC_0), 2);
    KT_CONTAINS(r.err, "sm_75");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "compile", "--arch", "sm_90a,bogus", KT_SPEC_0), 2);
    KT_CONTAINS(r.err, "bogus");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "compile", "--arch", "sm_90a,", KT_SPEC_0), 2);
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", "op=decode", "frobnicate=1"), 2);
    kt_out_free(&r);
}

/* ---- compile -------------------------------------------------------------------------------- */

/* compile and show name the kernel family; show says why a prefill is not on wgmma and why a
 * decode is not on tensor cores. */
KT_TEST(cli_compile_names_family)
{
    if (!KT_HAVE_KILN()) return;
    kt_out r;
    const char *pre = "op=prefill dtype=bf16 head_dim=128 group=1";
    KT_EQ_INT(RUN(&r, "compile", "--arch", "sm_90a,sm_80", pre), 0);
    KT_EQ_INT(count_lines(r.out), 2);
    KT_CONTAINS(r.out, " sm_90a compiled ");
    KT_CONTAINS(r.out, " family=wgmma op=prefill");
    KT_CONTAINS(r.out, " family=mma.sync op=prefill");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "compile", "--arch", "sm_90a", KT_SPEC_0), 0);
    KT_CONTAINS(r.out, " family=simt op=decode");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "show", "--arch", "sm_80", pre), 0);
    KT_CONTAINS(r.out, "family:      mma.sync (not wgmma: wgmma needs sm_90a)");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "show", "--arch", "sm_90a", pre), 0);
    KT_CONTAINS(r.out, "family:      wgmma\n");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "show", "--arch", "sm_80",
                  "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=64 group=4 "
                  "kv=paged rope=1"),
              0);
    KT_CONTAINS(r.out, "family:      simt (not tensor cores: fp8 KV with RoPE: rotated fp8 tiles");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "show", "--arch", "sm_80",
                  "op=decode dtype=f16 head_dim=64 group=1 kv=paged"),
              0);
    KT_CONTAINS(r.out, "family:      mma.sync\n");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "show", "--arch", "sm_80",
                  "op=decode dtype=f16 head_dim=64 group=6 kv=paged"),
              0);
    KT_CONTAINS(r.out, "family:      mma.sync\n");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "show", "--arch", "sm_80",
                  "op=decode q_dtype=f16 kv_dtype=e5m2 out_dtype=f16 head_dim=64 group=4 kv=paged"),
              0);
    KT_CONTAINS(r.out, "family:      mma.sync\n");
    kt_out_free(&r);
}

KT_TEST(cli_compile_cached)
{
    if (!KT_HAVE_KILN()) return;
    kt_out r;
    char key[33], key80[33], key90[33];
    KT_EQ_INT(RUN(&r, "compile", "--arch", "sm_90a", KT_SPEC_0), 0);
    KT_CONTAINS(r.out, " sm_90a compiled ");
    KT_CONTAINS(r.out, " regs=");
    KT_CONTAINS(r.out, "op=decode dtype=bf16 head_dim=64 group=1 layout=nhd");
    KT_EQ_INT(count_lines(r.out), 1);
    key_of_line(r.out, 0, key);
    kt_out_free(&r);
    /* The same spec in another spelling and order, split over words: a cache hit. */
    KT_EQ_INT(RUN(&r, "compile", "group=1", "head_dim=64", "--arch", "sm_90", "op=decode",
                  "dtype=bf16"),
              0);
    KT_CONTAINS(r.out, " sm_90a cached ");
    KT_CONTAINS(r.out, key);
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "compile", "--arch", "sm_80,sm_90a", KT_SPEC_0), 0);
    KT_EQ_INT(count_lines(r.out), 2);
    KT_CONTAINS(r.out, " sm_80 compiled ");
    KT_CONTAINS(r.out, " sm_90a cached ");
    key_of_line(r.out, 0, key80);
    key_of_line(r.out, 1, key90);
    KT_EQ_STR(key90, key);
    KT_CHECK(strlen(key80) == 32 && strcmp(key80, key90) != 0);
    kt_out_free(&r);
}

KT_TEST(cli_compile_needs_arch)
{
    if (!KT_HAVE_KILN()) return;
    if (kt_have_gpu()) {
        kt_skip("a GPU is present: compile picks its arch");
        return;
    }
    kt_out r;
    KT_EQ_INT(RUN(&r, "compile", KT_SPEC_0), 2);
    KT_CONTAINS(r.err, "kiln compile: no GPU here: name an arch with --arch");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "show", KT_SPEC_0), 2);
    KT_CONTAINS(r.err, "no GPU here");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "warm", "-"), 2);
    kt_out_free(&r);
}

KT_TEST(cli_check_needs_gpu)
{
    if (!KT_HAVE_KILN()) return;
    if (kt_have_gpu()) {
        kt_skip("a GPU is present");
        return;
    }
    kt_out r;
    KT_EQ_INT(RUN(&r, "check", KT_SPEC_0, "--kv-len", "100,577"), 1);
    KT_CONTAINS(r.err, "kiln check: no GPU: ");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", KT_SPEC_0, "--heads", "3", "--kv-len", "0"), 2);
    kt_out_free(&r);
}

/* Batch options of `kiln check`: every usage error is exit 2 with a message naming the option,
 * found before any GPU is needed; a valid batch command without a GPU is exit 1. */
KT_TEST(cli_check_batch_options)
{
    if (!KT_HAVE_KILN()) return;
    kt_out r;
    const char *paged = "op=prefill kv=paged dtype=bf16 head_dim=64 group=1";
    const char *ragged = "op=decode kv=ragged dtype=f16 head_dim=64 group=1";
    KT_EQ_INT(RUN(&r, "check", paged, "--batch", "3", "--kv-lens", "1,2"), 2);
    KT_CONTAINS(r.err, "kiln check: --kv-lens has 2 lengths for a batch of 3");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", paged, "--kv-lens", "5,0,7", "--qo-lens", "1,2"), 2);
    KT_CONTAINS(r.err, "--qo-lens has 2 lengths for a batch of 3");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", paged, "--kv-dist", "uniform:5"), 2);
    KT_CONTAINS(r.err, "--kv-dist 'uniform:5': expected uniform:LO:HI");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", paged, "--kv-dist", "normal:1:5"), 2);
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", paged, "--qo-dist", "uniform:9:3"), 2);
    KT_CONTAINS(r.err, "--qo-dist");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", paged, "--kv-len", "3", "--kv-dist", "uniform:1:2"), 2);
    KT_CONTAINS(r.err, "give at most one of --kv-len, --kv-lens and --kv-dist");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", paged, "--page-size", "0"), 2);
    KT_CONTAINS(r.err, "--page-size");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", paged, "--kv-len", "1,2"), 2);
    KT_CONTAINS(r.err, "--kv-lens gives a list");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", paged, "--kv-lens", "4,-1"), 2);
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", paged, "--kv-lens", "4,,5"), 2);
    KT_CONTAINS(r.err, "bad list");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", paged, "--batch", "-2"), 2);
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", paged, "--fixed-split", "0"), 2);
    KT_CONTAINS(r.err, "--fixed-split");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", ragged, "--page-size", "4"), 2);
    KT_CONTAINS(r.err, "--page-size needs kv=paged");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", ragged, "--qo-lens", "1,2"), 2);
    KT_CONTAINS(r.err, "a decode batch has one query row per request");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", "op=decode kv=ragged head_dim=64 group=4", "--heads", "6", "--batch",
                  "2"),
              2);
    KT_CONTAINS(r.err, "not a multiple of group 4");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", KT_SPEC_0, "--graph"), 2);
    KT_CONTAINS(r.err, "--graph needs a batch variant");
    kt_out_free(&r);
    /* mask data: checked in batches (random per-request masks), refused for single requests */
    KT_EQ_INT(RUN(&r, "check", "op=prefill dtype=f16 head_dim=64 group=1 mask_data=bsr"), 2);
    KT_CONTAINS(r.err, "mask_data outside a batch");
    kt_out_free(&r);
    if (!kt_have_gpu()) {
        KT_EQ_INT(RUN(&r, "check",
                      "op=prefill kv=ragged dtype=f16 head_dim=64 group=1 mask_data=bitmask",
                      "--batch", "3"),
                  1);
        KT_CONTAINS(r.err, "no GPU");
        kt_out_free(&r);
    }
    KT_EQ_INT(RUN(&r, "check", KT_SPEC_0, "--batch", "4"), 2);
    KT_CONTAINS(r.err, "--batch needs a batch variant");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", "op=merge dtype=f16 head_dim=64", "--kv-len", "4"), 2);
    KT_CONTAINS(r.err, "op=merge takes");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", "--help"), 0);
    KT_CONTAINS(r.out, "--kv-dist uniform:LO:HI");
    KT_CONTAINS(r.out, "--fixed-split N");
    kt_out_free(&r);
    if (kt_have_gpu()) return;
    KT_EQ_INT(RUN(&r, "check", paged, "--kv-lens", "0,17,5", "--qo-dist", "uniform:0:9",
                  "--page-size", "5", "--graph", "--fixed-split", "64", "--seed", "7"),
              1);
    KT_CONTAINS(r.err, "kiln check: no GPU: ");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "check", "op=merge dtype=bf16 head_dim=128", "--batch", "33"), 1);
    KT_CONTAINS(r.err, "kiln check: no GPU: ");
    kt_out_free(&r);
}

/* ---- ls, show, rm --------------------------------------------------------------------------- */

KT_TEST(cli_ls_show_rm)
{
    if (!KT_HAVE_KILN()) return;
    kt_out r;
    char key[33], prefix[9], cubin[600], want[64];
    KT_EQ_INT(RUN(&r, "compile", "--arch", "sm_90a", KT_SPEC_0), 0);
    key_of_line(r.out, 0, key);
    kt_out_free(&r);
    KT_REQUIRE(strlen(key) == 32);
    snprintf(prefix, sizeof prefix, "%.8s", key);

    KT_EQ_INT(RUN(&r, "ls"), 0);
    KT_CONTAINS(r.out, "KEY");
    KT_CONTAINS(r.out, key);
    KT_CONTAINS(r.out, "sm_90a");
    KT_EQ_INT(count_lines(r.out), 2);
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "ls", "--json"), 0);
    KT_CHECK(r.out[0] == '[');
    KT_CHECK(strlen(r.out) >= 2 && !strcmp(r.out + strlen(r.out) - 2, "]\n"));
    snprintf(want, sizeof want, "\"key\": \"%s\"", key);
    KT_CONTAINS(r.out, want);
    KT_CONTAINS(r.out, "\"spec\": \"op=decode");
    kt_out_free(&r);

    KT_EQ_INT(RUN(&r, "show", prefix), 0);
    KT_CONTAINS(r.out, key);
    KT_CONTAINS(r.out, "registers:");
    KT_CONTAINS(r.out, "hits:");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "show", prefix, "--source"), 0);
    KT_CONTAINS(r.out, "generated");
    KT_CONTAINS(r.out, "op=decode dtype=bf16 head_dim=64 group=1");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "show", prefix, "--key-material"), 0);
    KT_CONTAINS(r.out, "sm_90a");
    KT_CONTAINS(r.out, kiln_nvrtc_version());
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "show", prefix, "--log"), 0);
    kt_out_free(&r);
    snprintf(cubin, sizeof cubin, "%s/k.cubin", kt_tmpdir());
    KT_EQ_INT(RUN(&r, "show", prefix, "--cubin", cubin), 0);
    kt_out_free(&r);
    size_t size = 0;
    char *bytes = kt_slurp(cubin, &size);
    KT_CHECK(size > 4 && !memcmp(bytes, "\177ELF", 4));
    free(bytes);
    /* By spec: found in the cache, the same key. */
    KT_EQ_INT(RUN(&r, "show", "--arch", "sm_90a", KT_SPEC_0), 0);
    KT_CONTAINS(r.out, key);
    kt_out_free(&r);

    KT_EQ_INT(RUN(&r, "rm", prefix), 0);
    KT_CONTAINS(r.out, "removed 1");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "show", prefix), 2);
    KT_CONTAINS(r.err, "kiln show: ");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "rm", prefix), 1);
    KT_CONTAINS(r.out, "removed 0");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "ls", "--json"), 0);
    KT_EQ_STR(r.out, "[]\n");
    kt_out_free(&r);
}

/* ---- warm ----------------------------------------------------------------------------------- */

static const char manifest3[] = "# three decode variants\n"
                                "op=decode dtype=bf16 head_dim=64 group=2\n"
                                "\n"
                                "op=decode dtype=f16 head_dim=64 group=1   # trailing comment\n"
                                "   op=decode dtype=bf16 head_dim=64 group=4 lse=1\n";

KT_TEST(cli_warm)
{
    if (!KT_HAVE_KILN()) return;
    kt_out r;
    char m[600];
    snprintf(m, sizeof m, "%s/m.txt", kt_tmpdir());
    kt_write_text(m, manifest3);
    KT_EQ_INT(RUN(&r, "warm", "--arch", "sm_90a", "--jobs", "2", m), 0);
    KT_CONTAINS(r.out, "3 kernels: 3 compiled, 0 cached, 0 failed");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "warm", "--arch", "sm_90a", m), 0);
    KT_CONTAINS(r.out, "3 kernels: 0 compiled, 3 cached, 0 failed");
    kt_out_free(&r);
    KT_EQ_INT(RUN_STDIN(&r, m, "warm", "--arch", "sm_90a", "--jobs", "3", "-"), 0);
    KT_CONTAINS(r.out, "3 kernels: 0 compiled, 3 cached, 0 failed");
    kt_out_free(&r);
    /* Shards 0/2 and 1/2 split the three items. */
    KT_EQ_INT(RUN(&r, "warm", "--arch", "sm_90a", "--shard", "1/2", m), 0);
    KT_CONTAINS(r.out, "1 kernels: 0 compiled, 1 cached, 0 failed");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "ls"), 0);
    KT_EQ_INT(count_lines(r.out), 4);
    kt_out_free(&r);
}

KT_TEST(cli_warm_bad_manifest)
{
    if (!KT_HAVE_KILN()) return;
    kt_out r;
    char m[600], missing[600];
    snprintf(m, sizeof m, "%s/bad.txt", kt_tmpdir());
    snprintf(missing, sizeof missing, "%s/nope.txt", kt_tmpdir());
    kt_write_text(m, KT_SPEC_0 "\n# fine so far\nop=decode head_dim=100\n");
    KT_EQ_INT(RUN(&r, "warm", "--arch", "sm_90a", m), 2);
    KT_CONTAINS(r.err, "bad.txt:3: ");
    KT_CONTAINS(r.err, "head_dim");
    KT_EQ_STR(r.out, "");
    kt_out_free(&r);
    /* Nothing was compiled: not even the cache was created (and ls creates none). */
    KT_EQ_INT(RUN(&r, "ls", "--json"), 1);
    KT_CONTAINS(r.err, "no such cache");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "warm", "--arch", "sm_90a", missing), 2);
    KT_CONTAINS(r.err, "nope.txt");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "warm", "--arch", "sm_90a", "--shard", "2/2", m), 2);
    kt_out_free(&r);
}

/* ---- info ----------------------------------------------------------------------------------- */

KT_TEST(cli_info)
{
    if (!KT_HAVE_KILN()) return;
    kt_out r;
    char cache[600];
    snprintf(cache, sizeof cache, "%s/cache/kernels.db", kt_tmpdir());
    KT_EQ_INT(RUN(&r, "info"), 0);
    KT_CONTAINS(r.out, kiln_version());
    KT_CONTAINS(r.out, kiln_nvrtc_version());
    KT_CONTAINS(r.out, cache);
    KT_CONTAINS(r.out, "cache: none ("); /* info creates no cache */
    KT_CHECK(access(cache, F_OK) != 0);
    KT_CONTAINS(r.out, "sm_90a");
    KT_CONTAINS(r.out, kt_have_gpu() ? "gpu 0: " : "gpu: none (compile-only: ");
    kt_out_free(&r);
    KT_EQ_INT(RUN(&r, "info", "--gpu-count"), 0);
    KT_EQ_INT(atoi(r.out), kt_have_gpu() ? atoi(r.out) : 0);
    KT_CHECK(!kt_have_gpu() || atoi(r.out) >= 1);
    kt_out_free(&r);
}

/* show --sass: disassembles with cuobjdump when one is found; otherwise says what it needs and
 * exits 1. KILN_CUOBJDUMP pointing at a missing file forces the second path. */
KT_TEST(cli_show_sass)
{
    if (!KT_HAVE_KILN()) return;
    kt_out r;
    char key[33];
    KT_EQ_INT(RUN(&r, "compile", "--arch", "sm_90a", KT_SPEC_0), 0);
    key_of_line(r.out, 0, key);
    kt_out_free(&r);
    const char *old = getenv("KILN_CUOBJDUMP");
    char saved[1024] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("KILN_CUOBJDUMP", "/nonexistent/cuobjdump", 1);
    KT_EQ_INT(RUN(&r, "show", key, "--sass"), 1);
    KT_CONTAINS(r.err, "needs cuobjdump");
    kt_out_free(&r);
    if (saved[0]) setenv("KILN_CUOBJDUMP", saved, 1);
    else unsetenv("KILN_CUOBJDUMP");
    int rc = RUN(&r, "show", key, "--sass");
    if (rc == 0) KT_CONTAINS(r.out, "Function : kiln_main");
    else KT_CONTAINS(r.err, "needs cuobjdump");
    kt_out_free(&r);
}
