/*
 * variant.cuh — what a variant changes in the math of every kernel family: the logits
 * transform (builtin soft-cap / ALiBi, then the user's logits snippet) and the element masks
 * (run-time mask data, then the user's mask snippet). The snippets are members of the
 * generated config struct (Cfg::logits_expr, Cfg::mask_expr), called only when
 * Cfg::HAS_LOGITS_EXPR / HAS_MASK_EXPR say they exist.
 *
 * Index letters: i query row, j key, h / hk query and KV head, b request; L_Q, L_KV the
 * request's lengths (a single request: b = 0 and the launch's lengths).
 */
#ifndef KILN_VARIANT_CUH
#define KILN_VARIANT_CUH

#include "common/device.cuh"
#include "common/params.h"

namespace kiln {

/* ---- the logits transform ----
 * The variant's builtin transform of x = sm_scale * q.k, in natural units. rel = j - (i +
 * L_KV - L_Q) is the key's distance from the query's diagonal (<= 0 for visible causal keys).
 * Soft-cap with ALiBi adds the ALiBi term inside the tanh, as FlashInfer does. */
template <int LOGITS>
__device__ __forceinline__ float logit_nat(float x, float cap, float slope, int rel)
{
    if (LOGITS == LOGITS_SOFTCAP) x = cap * tanh_fast(x * (1.0f / cap));
    if (LOGITS == LOGITS_ALIBI) x += slope * (float)rel;
    if (LOGITS == LOGITS_SOFTCAP_ALIBI) x = cap * tanh_fast(x * (1.0f / cap) + slope * (float)rel);
    return x;
}

/* The logit in natural units from x = sm_scale * q.k: the builtin transform, then the variant's
 * logits snippet when it has one. */
template <class Cfg, class P>
__device__ __forceinline__ float logit_scaled(float x, const P &p, float slope, int i, int j, int h, int hk, int b,
                                              int L_Q, int L_KV)
{
    x = logit_nat<Cfg::LOGITS>(x, p.softcap, slope, j - (i + L_KV - L_Q));
    /* A partial tile also computes rows and keys past the request (never stored): the snippet
     * sees them as the last row and key, so that its array reads (seg[qo_idx], bias[kv_idx])
     * stay inside arrays of L_Q and L_KV entries. Valid (i, j) are passed unchanged. */
    if constexpr (Cfg::HAS_LOGITS_EXPR)
        x = Cfg::logits_expr(x, b, i < L_Q ? i : L_Q - 1, j < L_KV ? j : L_KV - 1, h, hk, L_Q, L_KV, p);
    return x;
}

/* The logit of the tile loops (logits_tile): logit_scaled of x = sm_scale q.k, or, where kiln
 * folded the snippet's scalar factors (Cfg::LOGITS_FOLDED: jit/expand.c, logits_fold), the
 * folded snippet of x = sm_scale q.k times Cfg::logits_pre(p) (where LOGITS_PRE), whose value
 * times Cfg::logits_outer(p) (where LOGITS_OUTER) is the snippet's. */
template <class Cfg, class P>
__device__ __forceinline__ float logit_tiled(float x, const P &p, float slope, int i, int j, int h, int hk, int b,
                                             int L_Q, int L_KV)
{
    if constexpr (Cfg::LOGITS_FOLDED)
        return Cfg::logits_expr_folded(x, b, i < L_Q ? i : L_Q - 1, j < L_KV ? j : L_KV - 1, h, hk, L_Q, L_KV, p);
    else return logit_scaled<Cfg>(x, p, slope, i, j, h, hk, b, L_Q, L_KV);
}

/* The full logit in log2 units (times LOG2E, for exp2) from the raw q.k. */
template <class Cfg, class P>
__device__ __forceinline__ float logit_full(float qk, const P &p, float slope, int i, int j, int h,
                                            int hk, int b, int L_Q, int L_KV)
{
    return logit_scaled<Cfg>(qk * p.sm_scale, p, slope, i, j, h, hk, b, L_Q, L_KV) * LOG2E;
}

/* The ALiBi slope of query head h (0 without ALiBi). */
template <class Cfg> __device__ __forceinline__ float alibi_slope(const kiln_launch_params &p, int h)
{
    return Cfg::LOGITS == LOGITS_ALIBI || Cfg::LOGITS == LOGITS_SOFTCAP_ALIBI
               ? reinterpret_cast<const float *>(p.alibi)[h]
               : 0.f;
}

/* ---- element masks ---- */

/* Where one request's mask data starts: its first bit (bitmask) and first block row (bsr).
 * Zero for a single request; a batch's plan stores them per request (load_req_mask). */
struct mask_base {
    i64 bit0;
    int row0;
};

/* The run-time mask data at query row i, key j of a request with L_KV keys whose data starts
 * at mb. */
template <class Cfg, class P>
__device__ __forceinline__ bool mask_data(const P &p, const mask_base &mb, int L_KV, int i, int j)
{
    if constexpr (Cfg::MASK_DATA == MASK_DATA_BITMASK) {
        const i64 bit = mb.bit0 + (i64)i * L_KV + j;
        return (reinterpret_cast<const unsigned char *>(p.mask_bits)[bit >> 3] >> (bit & 7)) & 1;
    } else if constexpr (Cfg::MASK_DATA == MASK_DATA_BSR) {
        const int *indptr = reinterpret_cast<const int *>(p.bsr_indptr);
        const int *cols = reinterpret_cast<const int *>(p.bsr_indices);
        const int rb = mb.row0 + i / p.bsr_r, cb = j / p.bsr_c;
        int lo = indptr[rb], hi = indptr[rb + 1]; /* binary search in a sorted row */
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            const int c = cols[mid];
            if (c == cb) return true;
            if (c < cb) lo = mid + 1;
            else hi = mid;
        }
        return false;
    }
    return true;
}

/* BSR: which of the column blocks cb0 .. cb0 + 63 the block row of query row i holds (the
 * request's data from mb), as bits 1 << (cb - cb0): one binary search for the first at or past
 * cb0, then a walk to the first past cb0 + 63. A tile's element test is then a shift of these
 * bits (mask_tile), not a search per element. */
template <class P>
__device__ __forceinline__ unsigned long long bsr_row_bits(const P &p, const mask_base &mb, int i, int cb0)
{
    const int *indptr = reinterpret_cast<const int *>(p.bsr_indptr);
    const int *cols = reinterpret_cast<const int *>(p.bsr_indices);
    const int rb = mb.row0 + i / p.bsr_r, end = indptr[rb + 1];
    int lo = indptr[rb], hi = end;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (cols[mid] < cb0) lo = mid + 1;
        else hi = mid;
    }
    unsigned long long bits = 0;
    for (; lo < end; lo++) {
        const int d = cols[lo] - cb0;
        if (d >= 64) break;
        bits |= 1ull << d;
    }
    return bits;
}

/* The variant's mask snippet (true: visible); always true without one. */
template <class Cfg, class P>
__device__ __forceinline__ bool mask_user(const P &p, int i, int j, int h, int hk, int b, int L_Q,
                                          int L_KV)
{
    if constexpr (Cfg::HAS_MASK_EXPR) return Cfg::mask_expr(b, i, j, h, hk, L_Q, L_KV, p);
    return true;
}

/* Whether the variant has an element mask at all (a snippet or mask data). */
template <class Cfg> __host__ __device__ constexpr bool has_element_mask()
{
    return Cfg::HAS_MASK_EXPR || Cfg::MASK_DATA != MASK_DATA_NONE;
}

} /* namespace kiln */

#endif /* KILN_VARIANT_CUH */
