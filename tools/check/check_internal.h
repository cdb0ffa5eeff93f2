/*
 * check_internal.h — what the files of the check library share and its users (the CLI, the
 * tests, the bench) do not: the CUDA error macros, the counters every comparison accumulates
 * into a kiln_check_result, the 16-bit decoders the references inline, and a qsort comparator.
 * Internal to tools/check.
 */
#ifndef KILN_CHECK_INTERNAL_H
#define KILN_CHECK_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "runtime.h"

/* Run a driver call; on failure write "<prefix>: <what>: <CUDA error>" into *e, set st and go
 * to done. Needs kiln__err *e, kiln_status st and a done label in scope. */
#define KILN__CHECK_CU(prefix, call, what)                                                         \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            st = kiln__cu_fail(e, r_, prefix ": %s", what);                                        \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* The same, returning the status instead (for phases whose buffers the caller owns). */
#define KILN__CHECK_CU_RET(prefix, call, what)                                                     \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) return kiln__cu_fail(e, r_, prefix ": %s", what);                  \
    } while (0)

/* A kiln call failed: return its status with the context's message. Needs kiln_ctx *ctx and
 * kiln__err *e in scope. */
#define KILN__CHECK_CALL_RET(call)                                                                 \
    do {                                                                                           \
        kiln_status s_ = (call);                                                                   \
        if (s_) return kiln__fail(e, s_, "%s", kiln_ctx_errmsg(ctx));                              \
    } while (0)

/* A device buffer that ends where mapped memory ends (check_guard.c): ptr is the data (bytes
 * rounded up to align, ending at the guard), base / reserved / mapped / handle the mapping;
 * base is 0 where the driver lacks the virtual memory entries (ptr: a plain cuMemAlloc). */
typedef struct kiln__check_guard {
    CUdeviceptr ptr, base;
    size_t reserved, mapped;
    CUmemGenericAllocationHandle handle;
} kiln__check_guard;

/* Allocate g for bytes (at least 1) on dev; *e says what failed. */
kiln_status kiln__check_guard_alloc(const kiln__cu *cu, CUdevice dev, size_t bytes, size_t align,
                                    kiln__check_guard *g, kiln__err *e);
/* kiln__check_guard_alloc, then bytes of host copied to g->ptr (none when bytes is 0). */
kiln_status kiln__check_guard_upload(const kiln__cu *cu, CUdevice dev, const void *host,
                                     size_t bytes, size_t align, kiln__check_guard *g,
                                     kiln__err *e);
/* Release g (a zeroed g is a no-op) and zero it. */
void kiln__check_guard_free(const kiln__cu *cu, kiln__check_guard *g);

/* Count one output element got against its reference ref into r (checked, max_ref, max_err)
 * and sums (squared error, squared reference: for rel_l2), with r's atol + rtol*|ref|. Returns
 * 1 when it is the first element out of tolerance (r->bad was 0): the caller writes
 * r->first_bad. */
int kiln__check_o(kiln_check_result *r, double got, double ref, double sums[2]);
/* The same for one lse value (tolerance 1e-3 + 1e-3*|ref|; -inf equal to -inf is exact). */
int kiln__check_lse(kiln_check_result *r, double got, double ref);
/* r->rel_l2 from the sums of kiln__check_o (infinity when NaN). */
void kiln__check_rel_l2(kiln_check_result *r, const double sums[2]);

/* The builtin run-time values every check passes: scale, softcap, window, alibi slopes. */
static inline void kiln__check_params(kiln_params *pr, float sm_scale, float softcap,
                                      int window_left, CUdeviceptr alibi_slopes)
{
    pr->sm_scale = sm_scale;
    pr->softcap = softcap;
    pr->window_left = window_left;
    pr->alibi_slopes = alibi_slopes;
}

/* The builtin logits transform of the references, in float64: s = sm_scale * q.k and rel =
 * j - (i + L_KV - L_Q) in, the logit out (kiln.h, kiln_logits). */
static inline double kiln__check_logit(kiln_logits logits, double s, double cap, double slope,
                                       int rel)
{
    switch (logits) {
        case KILN_LOGITS_SOFTCAP:
            return cap * tanh(s / cap);
        case KILN_LOGITS_ALIBI:
            return s + slope * (double)rel;
        case KILN_LOGITS_SOFTCAP_ALIBI:
            return cap * tanh(s / cap + slope * (double)rel);
        default:
            return s;
    }
}

/* The float64 references compute a block of query rows against each key together, so that a
 * key's row is read once for the block and the block's dot products are independent sums (the
 * sum of one dot is still taken d = 0 .. D-1, and the softmax's sums j = 0 .. n-1, as the
 * definition's loops do: the block changes no bit of the result).
 *   kiln__check_ref_rows    the rows of a block over n keys (its logits fit a thread's share)
 *   kiln__check_dots        s[r] = q_r . k for R rows, q in columns: qT [D][R]
 *   kiln__check_softmax_pv  rows r < R of a block's logits x [R][n] (-inf: hidden) -> their
 *                           softmax's weighted sum of v [n][D] into o + at[r] * D, and
 *                           lse[at[r]] (natural log; -inf and o = 0 for a row with no visible
 *                           key), in the block's scratch */
int kiln__check_ref_rows(int n);
/* A reference thread's buffers for blocks of up to `rows` rows over n keys at head dim D: q in
 * columns (qT [D][rows]), the dots s, the logits x [rows][n], kiln__check_softmax_pv's scratch,
 * and per row its place in o / lse (at), query position (i), head (h) and visibility (vis).
 * kiln__check_block_alloc returns 0 when out of memory; free either way. */
typedef struct kiln__check_block {
    double *qT, *s, *x, *scratch;
    long *at;
    int *i, *h, *vis;
} kiln__check_block;
int kiln__check_block_alloc(kiln__check_block *b, int rows, int n, int D);
void kiln__check_block_free(kiln__check_block *b);
void kiln__check_dots(const double *qT, int R, int D, const double *k, double *s);
void kiln__check_softmax_pv(const kiln__check_block *b, int R, int n, const double *v, int D,
                            double *o, double *lse);

/* The single-request check's inputs and float64 reference (check.c) as the reference saw them:
 * q at q[i qs_n + h qs_h + d], k and v at [j ks_n + hk ks_h + d], o [L_Q][H][D], lse [L_Q][H]
 * (natural log), the builtin parameters with their defaults filled in. */
typedef struct kiln__check_ref_io {
    int H, H_KV, L_Q, L_KV, D, window_left;
    float sm_scale, softcap;
    const uint16_t *q, *k, *v;
    int64_t qs_n, qs_h, ks_n, ks_h;
    const float *slopes;
    const double *o, *lse;
} kiln__check_ref_io;

/* Draw v's inputs for shape s (its seed) and compute the single-request reference on the CPU,
 * no GPU involved; use sees them before they are freed. For the tests of the reference. */
kiln_status kiln__check_reference_cpu(const kiln_variant *v, const kiln_check_shape *s,
                                      void (*use)(const kiln__check_ref_io *io, void *user),
                                      void *user);

/* qsort comparator of doubles, ascending. */
int kiln__check_cmp_double(const void *a, const void *b);

/* A bf16 or f16 element's value (inline: the references decode every element they read). */
static inline double kiln__check_bits(kiln_dtype t, uint16_t h)
{
    uint32_t u;
    if (t == KILN_DTYPE_BF16) {
        u = (uint32_t)h << 16;
    } else {
        const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f;
        uint32_t man = h & 0x3ffu;
        if (exp == 0) {
            if (!man) u = sign;
            else { /* subnormal: normalise */ int e = -1;
                do {
                    man <<= 1;
                    e++;
                } while (!(man & 0x400u));
                u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
            }
        } else if (exp == 31) {
            u = sign | 0x7f800000u | (man << 13);
        } else {
            u = sign | ((exp + 127 - 15) << 23) | (man << 13);
        }
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif /* KILN_CHECK_INTERNAL_H */
