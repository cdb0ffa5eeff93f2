/*
 * arch.c — names of the GPU targets kiln compiles for.
 *
 * An arch is written sm_<NN>[a|f]: NN the compute capability times ten (two or three digits, no
 * leading zero), an optional `a` (arch-specific target, sm_90 on) or `f` (family target, sm_100
 * on). Bare digits ("90") mean sm_<NN>. kiln needs sm_80 or newer (bf16 mma.sync), and always
 * compiles Hopper for its arch-specific target: "sm_90" and "90" normalise to "sm_90a"; every
 * other arch keeps its spelling. kiln__arch_all lists the targets the installed NVRTC offers.
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
    switch (classify(in, &sm, &suffix)) {
    case ARCH_GARBAGE:
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "arch %s: not an arch name; " ARCH_FORM,
                          show);
    case ARCH_TOO_OLD:
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "arch %s: kiln needs sm_%d or newer (mma.sync bf16)", show, ARCH_MIN_SM);
    case ARCH_NO_A:
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "arch %s: there is no arch-specific 'a' target before sm_%d", show,
                          ARCH_A_MIN_SM);
    case ARCH_NO_F:
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "arch %s: there is no family 'f' target before sm_%d", show,
                          ARCH_F_MIN_SM);
    case ARCH_OK: break;
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
    if (sm < 10 || sm > 999)
        out[0] = 0;
    else
        snprintf(out, ARCH_BUF, "sm_%d%s", sm, sm == ARCH_HOPPER_SM ? "a" : "");
}

/* ---- the archs of the installed NVRTC ------------------------------------------------------- */

static pthread_once_t all_once = PTHREAD_ONCE_INIT;
static char all_names[ARCH_LIST_MAX][ARCH_BUF];
static const char *all_list[ARCH_LIST_MAX + 1]; /* NULL-terminated */
static int all_count;

static void all_init(void)
{
    int sms[128], n = 0;
    if (kiln__nvrtc_archs(sms, 128, &n, NULL) == KILN_STATUS_OK) {
        for (int i = 0; i < n && all_count < ARCH_LIST_MAX; i++) {
            if (sms[i] < ARCH_MIN_SM || sms[i] > 999) continue;
            kiln__arch_from_sm(sms[i], all_names[all_count]);
            all_list[all_count] = all_names[all_count];
            all_count++;
        }
    }
    all_list[all_count] = NULL;
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
