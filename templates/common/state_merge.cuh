/*
 * state_merge.cuh — the one merge of softmax states, used by every kernel that combines
 * partial results: the warps of a CUDA-core decode CTA, the split-KV merges of a single decode
 * and of a batch plan, and the public op=merge kernels.
 *
 * A state of one query row and head covers a set of keys: its log-sum-exp lse and either o
 * normalised over those keys (l = 1) or o and l = sum exp unnormalised, with lse the running
 * max. States of disjoint key sets merge into
 *     lse = log(sum_s l_s e^lse_s),  o = sum_s e^lse_s o_s / sum_s l_s e^lse_s
 * with the largest lse M factored out; a state with lse = -inf (no keys) weighs 0, and a row
 * whose states are all empty gets o = 0, lse = -inf. Use: M = the max over the states' lse,
 * then state_merge acc(M), acc.add(acc.weight(lse_s), ...) per state, then out() / lse_*().
 * The loops over the states stay in each kernel, where their loads are addressed.
 */
#ifndef KILN_STATE_MERGE_CUH
#define KILN_STATE_MERGE_CUH

#include "common/device.cuh"

namespace kiln {

struct state_merge {
    float M; /* the largest lse of the states */
    float l; /* sum of l_s * weight */
    float o; /* sum of o_s * weight */

    __device__ __forceinline__ explicit state_merge(float m) : M(m), l(0.f), o(0.f) {}

    /* e^(lse - M) of a state, 0 for an empty one; NAT: lse in natural log, else log2. */
    template <bool NAT = false> __device__ __forceinline__ float weight(float lse) const
    {
        return lse == neg_inf() ? 0.f : exp2_fast(NAT ? (lse - M) * LOG2E : lse - M);
    }
    /* a normalised state (l_s = 1) */
    __device__ __forceinline__ void add(float w, float o_s)
    {
        l += w;
        o += w * o_s;
    }
    /* an unnormalised state */
    __device__ __forceinline__ void add(float w, float l_s, float o_s)
    {
        l += l_s * w;
        o += o_s * w;
    }
    /* the merged o, and times a scale (fp8 V: its scale) */
    __device__ __forceinline__ float out() const { return l > 0.f ? o / l : 0.f; }
    __device__ __forceinline__ float out(float scale) const { return l > 0.f ? o / l * scale : 0.f; }
    /* the merged lse: in log2 units from log2 states, natural from log2, natural from natural */
    __device__ __forceinline__ float lse2() const { return l > 0.f ? M + log2_fast(l) : neg_inf(); }
    /* from log2 states, in the caller's unit per log2 unit (kiln_launch_params::lse_unit: LN2
     * natural, 1 base 2) */
    __device__ __forceinline__ float lse_of_log2(float unit) const { return l > 0.f ? (M + log2_fast(l)) * unit : neg_inf(); }
    __device__ __forceinline__ float lse_nat() const { return l > 0.f ? M + log2_fast(l) * LN2 : neg_inf(); }
};

} /* namespace kiln */

#endif /* KILN_STATE_MERGE_CUH */
