/*
 * merge.cuh — merging softmax states: the split-KV merge of a batch plan, and the public
 * merge_state / merge_state_in_place / merge_states kernels (op=merge variants).
 *
 * A state of one query row and head is (o, lse): o normalised over its keys, lse the log of
 * the sum of exp(logit) over them. Two states of disjoint key sets merge into
 *     lse = log(e^lse_a + e^lse_b),  o = (e^lse_a o_a + e^lse_b o_b) / e^lse
 * computed with the larger lse factored out; a state with lse = -inf (no keys) gets weight 0,
 * and a row whose states are all empty gets o = 0, lse = -inf.
 *
 * Batch partials (written by decode/prefill items with slot >= 0) are float, in log2 units:
 *   partial_o [slot][H][slot_rows][D], partial_lse [slot][H][slot_rows].
 * Public states are in the variant's dtype with natural-log lse.
 */
#ifndef KILN_MERGE_CUH
#define KILN_MERGE_CUH

#include "common/device.cuh"
#include "common/params.h"

namespace kiln {

/* One merge task of a batch plan per CTA x (padded grid: tasks past the count return), one
 * query head per CTA y. Task: request b, query tile m, slots slot0 .. slot0 + nslots. */
template <class Cfg> __device__ void batch_merge_kernel(const kiln_launch_params &p)
{
    constexpr int D = Cfg::D;
    const int *w = reinterpret_cast<const int *>(p.work);
    if ((int)blockIdx.x >= w[1]) return;
    const int4 t = *reinterpret_cast<const int4 *>(w + p.tasks_off + blockIdx.x * 4);
    const work_req r = load_req(p, t.x);
    const int h = blockIdx.y, H = p.num_qo_heads, R = p.slot_rows;
    const int row0 = t.y * R, nrows = min(R, r.qo_len - row0), slot0 = t.z, ns = t.w;
    const float *plse = reinterpret_cast<const float *>(p.partial_lse);
    const float *po = reinterpret_cast<const float *>(p.partial_o);
    for (int e = threadIdx.x; e < nrows * D; e += blockDim.x) {
        const int rr = e / D, d = e % D;
        float M = neg_inf();
        for (int s = 0; s < ns; s++) M = max_f(M, plse[((i64)(slot0 + s) * H + h) * R + rr]);
        float lsum = 0.f, osum = 0.f;
        for (int s = 0; s < ns; s++) {
            const i64 at = ((i64)(slot0 + s) * H + h) * R + rr;
            const float ls = plse[at];
            const float wgt = ls == neg_inf() ? 0.f : exp2_fast(ls - M);
            lsum += wgt;
            osum += wgt * po[at * D + d];
        }
        const float out = lsum > 0.f ? osum / lsum : 0.f;
        const i64 row = (i64)r.q_start + row0 + rr;
        reinterpret_cast<u16 *>(p.o)[row * p.o_stride_n + (i64)h * p.o_stride_h + d] = from_float<Cfg::OUT_DT>(out);
        if (Cfg::LSE && d == 0)
            reinterpret_cast<float *>(p.lse)[row * H + h] = lsum > 0.f ? (M + log2_fast(lsum)) * LN2 : neg_inf();
    }
}

/* ---- public state merges (op=merge): grid (rows, H), D threads ---- */

/* The argument block of the op=merge kernels (passed by value like kiln_launch_params). */
struct merge_params {
    unsigned long long v_a, lse_a, v_b, lse_b, v_out, lse_out, mask, v_all, lse_all;
    long long v_stride_n, v_stride_h;
    int num_states, rows, num_heads, pad;
};

/* Merge n states of one row and head: weights from natural-log lse values. */
template <int DT, int N>
__device__ __forceinline__ void merge_n(const float (&lse)[N], const float (&val)[N], int n, float &out,
                                        float &lse_out)
{
    float M = neg_inf();
    for (int s = 0; s < n; s++) M = max_f(M, lse[s]);
    float lsum = 0.f, osum = 0.f;
    for (int s = 0; s < n; s++) {
        const float wgt = lse[s] == neg_inf() ? 0.f : exp2_fast((lse[s] - M) * LOG2E);
        lsum += wgt;
        osum += wgt * val[s];
    }
    out = lsum > 0.f ? osum / lsum : 0.f;
    lse_out = lsum > 0.f ? M + log2_fast(lsum) * LN2 : neg_inf();
}

template <class Cfg> __device__ void merge_state_kernel(const merge_params &p, bool in_place)
{
    constexpr int DT = Cfg::DT;
    const int i = blockIdx.x, h = blockIdx.y, d = threadIdx.x, H = p.num_heads;
    if (in_place && p.mask && !reinterpret_cast<const unsigned char *>(p.mask)[i]) return;
    const i64 at = (i64)i * p.v_stride_n + (i64)h * p.v_stride_h + d;
    const float lse[2] = {reinterpret_cast<const float *>(p.lse_a)[(i64)i * H + h],
                          reinterpret_cast<const float *>(p.lse_b)[(i64)i * H + h]};
    const float val[2] = {to_float<DT>(reinterpret_cast<const u16 *>(p.v_a)[at]),
                          to_float<DT>(reinterpret_cast<const u16 *>(p.v_b)[at])};
    float out, lo;
    merge_n<DT, 2>(lse, val, 2, out, lo);
    __syncthreads(); /* in place: every thread has read lse_a before thread 0 rewrites it */
    u16 *vo = reinterpret_cast<u16 *>(in_place ? p.v_a : p.v_out);
    float *lso = reinterpret_cast<float *>(in_place ? p.lse_a : p.lse_out);
    vo[at] = from_float<DT>(out);
    if (d == 0 && lso) lso[(i64)i * H + h] = lo;
}

/* merge_states: v_all [n, S, H, D] (strides: row S*H*D, state H*D), lse_all [n, S, H]. */
template <class Cfg> __device__ void merge_states_kernel(const merge_params &p)
{
    constexpr int DT = Cfg::DT, D = Cfg::D;
    const int i = blockIdx.x, h = blockIdx.y, d = threadIdx.x, H = p.num_heads, S = p.num_states;
    const float *ls = reinterpret_cast<const float *>(p.lse_all) + (i64)i * S * H + h;
    const u16 *va = reinterpret_cast<const u16 *>(p.v_all) + (i64)i * S * H * D + (i64)h * D + d;
    float M = neg_inf();
    for (int s = 0; s < S; s++) M = max_f(M, ls[(i64)s * H]);
    float lsum = 0.f, osum = 0.f;
    for (int s = 0; s < S; s++) {
        const float l = ls[(i64)s * H];
        const float wgt = l == neg_inf() ? 0.f : exp2_fast((l - M) * LOG2E);
        lsum += wgt;
        osum += wgt * to_float<DT>(va[(i64)s * H * D]);
    }
    const i64 at = (i64)i * p.v_stride_n + (i64)h * p.v_stride_h + d;
    reinterpret_cast<u16 *>(p.v_out)[at] = from_float<DT>(lsum > 0.f ? osum / lsum : 0.f);
    if (d == 0 && p.lse_out)
        reinterpret_cast<float *>(p.lse_out)[(i64)i * H + h] = lsum > 0.f ? M + log2_fast(lsum) * LN2 : neg_inf();
}

} /* namespace kiln */

#endif /* KILN_MERGE_CUH */
