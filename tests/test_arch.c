/*
 * test_arch.c — the arch names (jit/arch.c): the normalisation table (accepted spellings and
 * the canonical name each gives), refused names with their message, sm numbers to names, and
 * the list of every arch, also from several threads at once. CPU only.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit.h"
#include "kt.h"

KT_TEST(arch_normalize_accepts)
{
    static const struct {
        const char *in, *out;
        int sm;
    } rows[] = {
        {"sm_80", "sm_80", 80},      {"sm_86", "sm_86", 86},      {"sm_87", "sm_87", 87},
        {"sm_89", "sm_89", 89},      {"sm_90", "sm_90a", 90},     {"sm_90a", "sm_90a", 90},
        {"90", "sm_90a", 90},        {"80", "sm_80", 80},         {"89", "sm_89", 89},
        {"120", "sm_120", 120},      {"sm_100", "sm_100", 100},   {"sm_100a", "sm_100a", 100},
        {"sm_100f", "sm_100f", 100}, {"sm_101", "sm_101", 101},   {"sm_103", "sm_103", 103},
        {"sm_103a", "sm_103a", 103}, {"sm_110", "sm_110", 110},   {"sm_120", "sm_120", 120},
        {"sm_120a", "sm_120a", 120}, {"sm_120f", "sm_120f", 120}, {"sm_121", "sm_121", 121},
        {"sm_121a", "sm_121a", 121}, {"sm_999", "sm_999", 999},
    };
    for (int i = 0; i < KT_COUNT(rows); i++) {
        char out[16] = "garbage";
        kiln__err e = {{0}};
        KT_OK(kiln__arch_normalize(rows[i].in, out, &e), e.msg);
        KT_EQ_STR(out, rows[i].out);
        KT_EQ_INT(kiln__arch_sm(rows[i].in), rows[i].sm);
        KT_EQ_INT(kiln__arch_sm(out), rows[i].sm);
        /* normalising is idempotent */
        char again[16];
        KT_OK(kiln__arch_normalize(out, again, &e), e.msg);
        KT_EQ_STR(again, out);
    }
}

KT_TEST(arch_normalize_refuses)
{
    /* st: the status; 0 where it depends on the toolkit (UNSUPPORTED when NVRTC offers the
     * target, INVALID_ARGUMENT when it does not: CUDA 13 dropped sm_70) */
    enum { U = KILN_STATUS_UNSUPPORTED, I = KILN_STATUS_INVALID_ARGUMENT };
    static const struct {
        const char *in;
        const char *fragment;
        int st;
    } rows[] = {
        {"sm_75", "arch 'sm_75': kiln needs sm_80 or newer (mma.sync bf16)", U},
        {"sm_70", "arch 'sm_70': kiln needs sm_80 or newer", 0},
        {"75", "arch '75': kiln needs sm_80 or newer", U},
        {"sm_75a", "kiln needs sm_80 or newer", I},
        {"sm_10", "arch 'sm_10': kiln needs sm_80", I},
        {"sm_80a", "arch 'sm_80a': there is no arch-specific 'a' target before sm_90", I},
        {"sm_89a", "no arch-specific 'a' target", I},
        {"sm_90f", "arch 'sm_90f': there is no family 'f' target before sm_100", I},
        {"", "arch '': not an arch name; expected sm_<NN>[a|f]", I},
        {NULL, "arch NULL: not an arch name; expected sm_<NN>[a|f]", I},
        {"compute_90", "arch 'compute_90': not an arch name; expected sm_<NN>[a|f] with NN >= 80",
         I},
        {"sm_9x", "arch 'sm_9x': not an arch name", I},
        {"sm_", "arch 'sm_': not an arch name", I},
        {"sm_9", "arch 'sm_9'", I},
        {"sm_090", "arch 'sm_090'", I},
        {"sm_1000", "arch 'sm_1000'", I},
        {"sm_90b", "arch 'sm_90b'", I},
        {"sm_90af", "arch 'sm_90af'", I},
        {"SM_90", "arch 'SM_90'", I},
        {"sm90", "arch 'sm90'", I},
        {"sm-90", "arch 'sm-90'", I},
        {" sm_90", "arch ' sm_90'", I},
        {"sm_90 ", "arch 'sm_90 '", I},
        {"90a", "arch '90a'", I},
        {"9", "arch '9'", I},
        {"sm_90\n", "arch 'sm_90?'", I},
        {"sm_9000000000000000", "arch 'sm_900000000000...': not an arch name", I},
        {"sm_90aaaaaaaaaaaaaaaaa", "arch 'sm_90aaaaaaaaaa...'", I},
    };
    for (int i = 0; i < KT_COUNT(rows); i++) {
        char out[16] = "garbage";
        kiln__err e = {{0}};
        kiln_status st = kiln__arch_normalize(rows[i].in, out, &e);
        if (rows[i].st) KT_STATUS(st, (kiln_status)rows[i].st, e.msg);
        else KT_CHECK(st == KILN_STATUS_UNSUPPORTED || st == KILN_STATUS_INVALID_ARGUMENT);
        KT_CONTAINS(e.msg, rows[i].fragment);
        KT_EQ_STR(out, "");
        KT_EQ_INT(kiln__arch_sm(rows[i].in), 0);
        KT_EQ_INT(kiln__arch_normalize(rows[i].in, out, NULL), st);
    }
    kiln__err e = {{0}};
    KT_STATUS(kiln__arch_normalize("sm_80", NULL, &e), KILN_STATUS_INVALID_ARGUMENT, e.msg);
}

KT_TEST(arch_from_sm)
{
    char out[16];
    kiln__arch_from_sm(90, out);
    KT_EQ_STR(out, "sm_90a");
    kiln__arch_from_sm(80, out);
    KT_EQ_STR(out, "sm_80");
    kiln__arch_from_sm(86, out);
    KT_EQ_STR(out, "sm_86");
    kiln__arch_from_sm(100, out);
    KT_EQ_STR(out, "sm_100");
    kiln__arch_from_sm(120, out);
    KT_EQ_STR(out, "sm_120");
    kiln__arch_from_sm(75, out); /* written, and refused by normalize */
    KT_EQ_STR(out, "sm_75");
    kiln__arch_from_sm(0, out);
    KT_EQ_STR(out, "");
    kiln__arch_from_sm(1000, out);
    KT_EQ_STR(out, "");
    kiln__arch_from_sm(-90, out);
    KT_EQ_STR(out, "");
    kiln__arch_from_sm(90, NULL); /* a no-op */
    /* from_sm gives normalised names for every supported capability */
    for (int sm = 80; sm <= 999; sm++) {
        char norm[16];
        kiln__arch_from_sm(sm, out);
        kiln__err e = {{0}};
        KT_OK(kiln__arch_normalize(out, norm, &e), e.msg);
        KT_EQ_STR(norm, out);
        KT_EQ_INT(kiln__arch_sm(out), sm);
        if (kt_failed()) break;
    }
}

static void *arch_all_thread(void *arg)
{
    (void)arg;
    return (void *)kiln__arch_all(NULL);
}

KT_TEST(arch_all)
{
    /* first calls race from several threads: all see the same list */
    pthread_t th[8];
    void *got[8];
    for (int i = 0; i < 8; i++)
        KT_REQUIRE(pthread_create(&th[i], NULL, arch_all_thread, NULL) == 0);
    for (int i = 0; i < 8; i++) pthread_join(th[i], &got[i]);
    int n = -1;
    const char *const *all = kiln__arch_all(&n);
    KT_REQUIRE(all != NULL);
    for (int i = 0; i < 8; i++) KT_CHECK(got[i] == (const void *)all);
    KT_CHECK(kiln__arch_all(NULL) == all);
    KT_CHECK(n > 0);
    KT_CHECK(all[n] == NULL);
    int has80 = 0, has90a = 0, prev = 0;
    for (int i = 0; i < n; i++) {
        KT_REQUIRE(all[i] != NULL);
        int sm = kiln__arch_sm(all[i]);
        KT_CHECK(sm >= 80);
        KT_CHECK(sm > prev); /* ascending, no repeats */
        prev = sm;
        char norm[16];
        kiln__err e = {{0}};
        KT_OK(kiln__arch_normalize(all[i], norm, &e), e.msg);
        KT_EQ_STR(norm, all[i]);
        has80 |= !strcmp(all[i], "sm_80");
        has90a |= !strcmp(all[i], "sm_90a");
        KT_CHECK(strcmp(all[i], "sm_90") != 0);
    }
    KT_CHECK(has80);
    KT_CHECK(has90a);
}
