/*
 * test_arch_nvrtc.c — archs that kiln's name check takes but the installed NVRTC does not
 * offer (sm_999, sm_101 on CUDA 13, any number nvrtcGetSupportedArchs leaves out) and names that
 * are no target at all (sm_11, sm_87x): refused as invalid arguments, with the list `kiln info`
 * prints, through the library (kiln_kernel_compile, a context's own arch) and through the CLI
 * (exit 2, nothing compiled). Every arch NVRTC does list stays accepted.
 *
 * No compile runs here: each refusal happens before NVRTC is asked to compile.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jit.h"
#include "kt.h"

#define SPEC "op=decode head_dim=64"

/* The archs NVRTC lists at sm_80 or newer, as `kiln info` prints them ("sm_80 sm_86 ..."). */
static void info_list(char *out, size_t cap)
{
    int n = 0;
    const char *const *all = kiln__arch_all(&n);
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(out + at, cap - at, "%s%s", i ? " " : "", all[i]);
}

/* 1 when the installed NVRTC lists compute capability sm (at sm_80 or newer). */
static int listed(int sm)
{
    int n = 0;
    const char *const *all = kiln__arch_all(&n);
    for (int i = 0; i < n; i++)
        if (kiln__arch_sm(all[i]) == sm) return 1;
    return 0;
}

/* Names kiln must refuse as invalid arguments here, into names[cap]; returns their count. One of
 * them is a number kiln's name check accepts and NVRTC does not list (sm_101 where CUDA 13
 * dropped it, else the first such number from sm_80 up). */
static int bad_archs(char names[][16], int cap)
{
    static const char *const fixed[] = {"sm_11", "sm_999", "sm_87x", "sm_80a", "sm_1000"};
    int n = 0;
    for (int i = 0; i < (int)(sizeof fixed / sizeof fixed[0]) && n < cap; i++)
        snprintf(names[n++], 16, "%s", fixed[i]);
    if (!listed(101) && n < cap) snprintf(names[n++], 16, "sm_101");
    for (int sm = 80; sm < 999 && n < cap; sm++)
        if (!listed(sm)) {
            snprintf(names[n++], 16, "sm_%d", sm);
            break;
        }
    return n;
}

static int have_nvrtc(void)
{
    int n = 0;
    kiln__arch_all(&n);
    if (n) return 1;
    kt_skip("NVRTC lists no arch (not installed?)");
    return 0;
}

KT_TEST(arch_nvrtc_offered)
{
    if (!have_nvrtc()) return;
    int n = 0;
    const char *const *all = kiln__arch_all(&n);
    /* every listed arch and its a / f forms are offered */
    for (int i = 0; i < n; i++) {
        kiln__err e = {{0}};
        KT_OK(kiln__arch_offered(all[i], &e), e.msg);
        const int sm = kiln__arch_sm(all[i]);
        char form[16];
        if (sm >= 90) {
            snprintf(form, sizeof form, "sm_%da", sm);
            KT_OK(kiln__arch_offered(form, &e), e.msg);
        }
        if (sm >= 100) {
            snprintf(form, sizeof form, "sm_%df", sm);
            KT_OK(kiln__arch_offered(form, &e), e.msg);
        }
    }
    /* kiln's parser against nvrtcGetSupportedArchs: every number the parser takes and NVRTC
     * does not list is refused, naming the list */
    char list[640];
    info_list(list, sizeof list);
    int refused = 0;
    for (int sm = 80; sm <= 999; sm++) {
        char arch[16], norm[16];
        kiln__arch_from_sm(sm, arch);
        kiln__err e = {{0}};
        KT_OK(kiln__arch_normalize(arch, norm, &e), e.msg);
        kiln_status st = kiln__arch_offered(norm, &e);
        if (listed(sm)) {
            KT_OK(st, e.msg);
            continue;
        }
        refused++;
        KT_STATUS(st, KILN_STATUS_INVALID_ARGUMENT, e.msg);
        KT_CONTAINS(e.msg, "not an arch the installed NVRTC compiles for");
        KT_CONTAINS(e.msg, list);
        if (kt_failed()) break;
    }
    KT_CHECK(refused > 0);
    KT_CHECK(!listed(999));
}

KT_TEST(arch_nvrtc_library_refuses)
{
    if (!have_nvrtc()) return;
    kiln_ctx_opts o = {0};
    o.no_cache = 1;
    o.no_device = 1;
    kiln_ctx *ctx = NULL;
    KT_REQUIRE(kiln_ctx_create(&o, &ctx) == KILN_STATUS_OK);
    kiln_variant v;
    KT_REQUIRE(kiln_variant_parse(SPEC, &v) == KILN_STATUS_OK);
    char list[640], names[8][16];
    info_list(list, sizeof list);
    const int n = bad_archs(names, 8);
    KT_CHECK(n >= 6);
    for (int i = 0; i < n; i++) {
        kiln_kernel *k = (kiln_kernel *)&v; /* poisoned: must come back NULL */
        KT_STATUS(kiln_kernel_compile(ctx, &v, names[i], &k), KILN_STATUS_INVALID_ARGUMENT,
                  kiln_ctx_errmsg(ctx));
        KT_CHECK(k == NULL);
        KT_CONTAINS(kiln_ctx_errmsg(ctx), names[i]);
        KT_CONTAINS(kiln_ctx_errmsg(ctx), list);
        KT_CHECK(strstr(kiln_ctx_errmsg(ctx), "nvrtc:") == NULL); /* NVRTC never ran */
    }
    /* sm_75: "unsupported" while NVRTC offers it (CUDA 13 does), bad input once it does not */
    {
        kiln_kernel *k = NULL;
        kiln_status st = kiln_kernel_compile(ctx, &v, "sm_75", &k);
        KT_CHECK(st == KILN_STATUS_UNSUPPORTED || st == KILN_STATUS_INVALID_ARGUMENT);
        KT_CONTAINS(kiln_ctx_errmsg(ctx), "kiln needs sm_80 or newer");
        KT_CONTAINS(kiln_ctx_errmsg(ctx), list);
    }
    kiln_ctx_destroy(ctx);

    /* a compile-only context for an arch NVRTC does not offer: its kernels are refused */
    o.arch = "sm_999";
    KT_REQUIRE(kiln_ctx_create(&o, &ctx) == KILN_STATUS_OK);
    kiln_kernel *k = NULL;
    KT_STATUS(kiln_kernel_compile(ctx, &v, NULL, &k), KILN_STATUS_INVALID_ARGUMENT,
              kiln_ctx_errmsg(ctx));
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "arch 'sm_999'");
    KT_CONTAINS(kiln_ctx_errmsg(ctx), list);
    kiln_ctx_destroy(ctx);
    /* and one for a name that is no arch is refused at creation */
    o.arch = "sm_87x";
    ctx = NULL;
    KT_STATUS(kiln_ctx_create(&o, &ctx), KILN_STATUS_INVALID_ARGUMENT, kiln_errmsg());
    KT_CHECK(ctx == NULL);
    KT_CONTAINS(kiln_errmsg(), list);
}

/* Run `kiln --cache <tmp>/cache compile --arch ARCH SPEC`; stderr into err[cap], stdout's size
 * into *out_bytes. Returns the exit status, -1 if it did not exit. */
static int run_compile(const char *arch, char *err, size_t cap, long *out_bytes)
{
    kt_out r;
    int code = KT_KILN(&r, "--cache", kt_path("cache"), "compile", "--arch", arch, SPEC);
    snprintf(err, cap, "%s", r.err);
    *out_bytes = (long)strlen(r.out);
    kt_out_free(&r);
    return code;
}

KT_TEST(arch_nvrtc_cli_refuses)
{
    if (!have_nvrtc()) return;
    if (!KT_HAVE_KILN()) return;
    char list[640], names[8][16], err[4096];
    info_list(list, sizeof list);
    const int n = bad_archs(names, 8);
    for (int i = 0; i < n; i++) {
        long out = 0;
        KT_EQ_INT(run_compile(names[i], err, sizeof err, &out), 2);
        KT_CONTAINS(err, "kiln compile: arch '");
        KT_CONTAINS(err, names[i]);
        KT_CONTAINS(err, list);
        KT_EQ_INT(out, 0);
    }
    /* one bad arch in a list fails the command before anything compiles */
    long out = 0;
    KT_EQ_INT(run_compile("sm_80,sm_999", err, sizeof err, &out), 2);
    KT_CONTAINS(err, "sm_999");
    KT_EQ_INT(out, 0);
}
