/*
 * arch.c — names of the GPU targets kiln compiles for.
 *
 * An arch is written sm_<NN>[a|f]: NN the compute capability times ten (two or three digits, no
 * leading zero), an optional `a` (arch-specific target, sm_90 on) or `f` (family target, sm_100
 * on). Bare digits ("90") mean sm_<NN>. kiln needs sm_80 or newer (bf16 mma.sync), and always
 * compiles Hopper for its arch-specific target: "sm_90" and "90" normalise to "sm_90a"; every
 * other arch keeps its spelling. kiln__arch_all lists the targets the installed NVRTC offers.
 *
 * Two statuses for a refused name. A name that is no target of the installed NVRTC — not of
 * the form above (sm_87x), a suffix no arch of that number has (sm_80a), a number NVRTC does not
 * list (sm_11, sm_101 since CUDA 13, sm_999) — is bad input: KILN_STATUS_INVALID_ARGUMENT, with
 * the list of kiln__arch_all (what `kiln info` prints). A target that NVRTC offers and kiln
 * cannot generate for (sm_75: no bf16 mma.sync) is KILN_STATUS_UNSUPPORTED. kiln__arch_normalize
 * checks the form without loading NVRTC (it asks NVRTC only to word a refusal);
 * kiln__arch_offered checks the number against NVRTC's list, before anything is compiled.
 */
#include "jit.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Size of an arch name buffer (jit.h's char out[16]); longer input is refused. */
#define ARCH_BUF 16
/* Oldest compute capability kiln generates for (bf16 mma.sync). */
#define ARCH_MIN_SM 80
/* Hopper: compiled for its arch-specific target sm_90a. */
#define ARCH_HOPPER_SM 90
/* First compute capabilities that have an `a` and an `f` target. */
#define ARCH_A_MIN_SM 90
#define ARCH_F_MIN_SM 100
/* Most archs kiln__arch_all keeps. */
#define ARCH_LIST_MAX 64

#define ARCH_FORM                                                                                  \
    "expected sm_<NN>[a|f] with NN >= 80 (sm_80, sm_86, sm_90a, sm_100f, sm_120) or bare digits "  \
    "(90)"

/* Room for list_archs' text in a message. */
#define ARCH_LIST_MSG 640

static int nvrtc_lists(int sm);
static void list_archs(char *out, size_t cap);

/* What classify found in a name. */
typedef enum arch_kind {
    ARCH_OK,
    ARCH_GARBAGE, /* not of the form above */
    ARCH_TOO_OLD, /* below ARCH_MIN_SM */
    ARCH_NO_A,    /* `a` below ARCH_A_MIN_SM */
    ARCH_NO_F,    /* `f` below ARCH_F_MIN_SM */
} arch_kind;

/* Split `in` into its compute capability and suffix (0, 'a' or 'f'). */
static arch_kind classify(const char *in, int *sm, char *suffix)
{
    *sm = 0;
    *suffix = 0;
    if (!in || strnlen(in, ARCH_BUF) >= ARCH_BUF) return ARCH_GARBAGE;
    int prefixed = strncmp(in, "sm_", 3) == 0;
    const char *p = prefixed ? in + 3 : in;
    int digits = 0, x = 0;
    while (p[digits] >= '0' && p[digits] <= '9' && digits < 4) x = x * 10 + (p[digits++] - '0');
    if (digits < 2 || digits > 3 || p[0] == '0') return ARCH_GARBAGE;
    p += digits;
    if (prefixed && (*p == 'a' || *p == 'f')) *suffix = *p++;
    if (*p) return ARCH_GARBAGE;
    *sm = x;
    if (x < ARCH_MIN_SM) return ARCH_TOO_OLD;
    if (*suffix == 'a' && x < ARCH_A_MIN_SM) return ARCH_NO_A;
    if (*suffix == 'f' && x < ARCH_F_MIN_SM) return ARCH_NO_F;
    return ARCH_OK;
}

/* Quote `in` for a message into out[ARCH_BUF + 8]: 'sm_75', cut after 15 bytes with "...",
 * non-printable bytes as '?'; NULL as NULL. */
static void show_arch(const char *in, char *out)
{
    if (!in) {
        strcpy(out, "NULL");
        return;
    }
    size_t n = 0;
    out[n++] = '\'';
    size_t i = 0;
    for (; in[i] && i < ARCH_BUF - 1; i++) out[n++] = in[i] >= 0x20 && in[i] < 0x7f ? in[i] : '?';
    if (in[i]) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n++] = '\'';
    out[n] = 0;
}

/* Normalise `in` into out[16] ("sm_90" → "sm_90a"); out is "" on failure, with e saying why. */
kiln_status kiln__arch_normalize(const char *in, char out[16], kiln__err *e)
{
    if (!out) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "arch: NULL output buffer");
    out[0] = 0;
    char show[ARCH_BUF + 8];
    show_arch(in, show);
    int sm;
    char suffix;
    char list[ARCH_LIST_MSG];
    const arch_kind kind = classify(in, &sm, &suffix);
    if (kind != ARCH_OK) list_archs(list, sizeof list);
    switch (kind) {
        case ARCH_GARBAGE:
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "arch %s: not an arch name; " ARCH_FORM "; %s", show, list);
        case ARCH_TOO_OLD:
            /* a target NVRTC offers is one kiln does not support; any other is no target at all */
            if (!suffix && nvrtc_lists(sm) != 0)
                return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                                  "arch %s: kiln needs sm_%d or newer (mma.sync bf16); %s", show,
                                  ARCH_MIN_SM, list);
            return kiln__fail(
                e, KILN_STATUS_INVALID_ARGUMENT,
                "arch %s: kiln needs sm_%d or newer (mma.sync bf16), and it is not an "
                "arch the installed NVRTC offers; %s",
                show, ARCH_MIN_SM, list);
        case ARCH_NO_A:
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "arch %s: there is no arch-specific 'a' target before sm_%d; %s",
                              show, ARCH_A_MIN_SM, list);
        case ARCH_NO_F:
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "arch %s: there is no family 'f' target before sm_%d; %s", show,
                              ARCH_F_MIN_SM, list);
        case ARCH_OK:
            break;
    }
    if (sm == ARCH_HOPPER_SM && !suffix) suffix = 'a';
    snprintf(out, ARCH_BUF, "sm_%d%s", sm, suffix == 'a' ? "a" : suffix == 'f' ? "f" : "");
    return KILN_STATUS_OK;
}

/* Compute capability * 10 of any name kiln__arch_normalize accepts ("sm_90a" → 90); 0 for
 * anything it refuses. */
int kiln__arch_sm(const char *arch)
{
    int sm;
    char suffix;
    return classify(arch, &sm, &suffix) == ARCH_OK ? sm : 0;
}

/* The arch name of a compute capability into out[16]: 90 → "sm_90a", 80 → "sm_80". Values
 * outside 10..999 give "". Names below sm_80 are written but refused by kiln__arch_normalize. */
void kiln__arch_from_sm(int sm, char out[16])
{
    if (!out) return;
    if (sm < 10 || sm > 999) out[0] = 0;
    else snprintf(out, ARCH_BUF, "sm_%d%s", sm, sm == ARCH_HOPPER_SM ? "a" : "");
}

/* ---- the archs of the installed NVRTC ------------------------------------------------------- */

static pthread_once_t all_once = PTHREAD_ONCE_INIT;
static char all_names[ARCH_LIST_MAX][ARCH_BUF];
static const char *all_list[ARCH_LIST_MAX + 1]; /* NULL-terminated */
static int all_count;
static int nvrtc_sms[ARCH_LIST_MAX]; /* every compute capability NVRTC lists, sm_80 or not */
static int nvrtc_count = -1;         /* -1: NVRTC could not list them */

static void all_init(void)
{
    int sms[128], n = 0;
    if (kiln__nvrtc_archs(sms, 128, &n, NULL) == KILN_STATUS_OK) {
        nvrtc_count = 0;
        for (int i = 0; i < n; i++) {
            if (nvrtc_count < ARCH_LIST_MAX) nvrtc_sms[nvrtc_count++] = sms[i];
            if (sms[i] < ARCH_MIN_SM || sms[i] > 999 || all_count >= ARCH_LIST_MAX) continue;
            kiln__arch_from_sm(sms[i], all_names[all_count]);
            all_list[all_count] = all_names[all_count];
            all_count++;
        }
    }
    all_list[all_count] = NULL;
}

/* 1: NVRTC lists compute capability sm; 0: it lists others only; -1: it cannot list them. */
static int nvrtc_lists(int sm)
{
    pthread_once(&all_once, all_init);
    if (nvrtc_count < 0) return -1;
    for (int i = 0; i < nvrtc_count; i++)
        if (nvrtc_sms[i] == sm) return 1;
    return 0;
}

/* "the archs here are sm_80 sm_86 ... (NVRTC 13.0, ...)" (kiln__arch_all, as `kiln info` prints
 * it) into out. */
static void list_archs(char *out, size_t cap)
{
    int n = 0;
    const char *const *all = kiln__arch_all(&n);
    if (!n) {
        snprintf(out, cap, "NVRTC lists no arch kiln supports (%s)",
                 nvrtc_count < 0 ? "it cannot be loaded" : "none at sm_80 or newer");
        return;
    }
    size_t at = (size_t)snprintf(out, cap, "the archs here are");
    for (int i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(out + at, cap - at, " %s", all[i]);
    if (at < cap)
        snprintf(out + at, cap - at,
                 " (NVRTC %s, as kiln info lists them; 'a' targets from sm_%d, "
                 "'f' from sm_%d)",
                 kiln_nvrtc_version(), ARCH_A_MIN_SM, ARCH_F_MIN_SM);
}

/* The normalised archs at or above sm_80 that the installed NVRTC compiles for, ascending,
 * NULL-terminated; *count (if count is non-NULL) gets their number. Computed once per process;
 * static storage. Empty when NVRTC cannot list them. */
const char *const *kiln__arch_all(int *count)
{
    pthread_once(&all_once, all_init);
    if (count) *count = all_count;
    return all_list;
}

/* KILN_STATUS_OK when the installed NVRTC compiles for `arch` (a name kiln__arch_normalize
 * accepted), or when NVRTC cannot list its archs (the compile then says why it cannot run);
 * KILN_STATUS_INVALID_ARGUMENT with the list of kiln__arch_all otherwise. Loads NVRTC. */
kiln_status kiln__arch_offered(const char *arch, kiln__err *e)
{
    char show[ARCH_BUF + 8];
    show_arch(arch, show);
    const int sm = kiln__arch_sm(arch);
    if (!sm) {
        char norm[ARCH_BUF];
        return kiln__arch_normalize(arch, norm, e);
    }
    if (nvrtc_lists(sm) != 0) return KILN_STATUS_OK;
    char list[ARCH_LIST_MSG];
    list_archs(list, sizeof list);
    return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                      "arch %s: not an arch the installed NVRTC compiles for; %s", show, list);
}
