/*
 * merge.cuh — the merge kernels, all over state_merge (common/state_merge.cuh): the split-KV
 * merge of a single decode, the split merge of a batch plan, and the public merge_state /
 * merge_state_in_place / merge_states kernels (op=merge variants).
 *
 * Split partials (written by decode / prefill CTAs and items with a slot) are float, in log2
 * units: a single decode's partial_o [splits][H][D], partial_lse [splits][H]; a batch's
 * partial_o [slot][H][slot_rows][D], partial_lse [slot][H][slot_rows]. Public states are in
 * the variant's dtype with natural-log lse: v [rows, H, D] (strides at run time), lse [rows, H].
 */
#ifndef KILN_MERGE_CUH
#define KILN_MERGE_CUH

#include "common/device.cuh"
#include "common/params.h"
#include "common/schedule.cuh"
#include "common/state_merge.cuh"

namespace kiln {

/* Combine the num_splits partial states of each query head of a single decode: grid H, any
 * thread count. */
template <class Cfg> __device__ void decode_merge_kernel(const kiln_launch_params &p)
{
    constexpr int D = Cfg::D;
    const int h = blockIdx.x, H = p.num_qo_heads, S = p.num_splits;
    const float *plse = reinterpret_cast<const float *>(p.partial_lse);
    const float *po = reinterpret_cast<const float *>(p.partial_o);
    float M = neg_inf();
    for (int s = 0; s < S; s++) M = max_f(M, plse[s * H + h]);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        state_merge acc(M);
        for (int s = 0; s < S; s++) {
            const float ls = plse[s * H + h];
            const float wgt = acc.weight(ls);
            acc.add(wgt, po[((i64)s * H + h) * D + d]);
        }
        reinterpret_cast<u16 *>(p.o)[(i64)h * p.o_stride_h + d] = from_float<Cfg::OUT_DT>(acc.out());
        if (Cfg::LSE && d == 0) reinterpret_cast<float *>(p.lse)[h] = acc.lse_nat_of_log2();
    }
}

/* One merge task of a batch plan per CTA x (padded grid: tasks past the count return), one
 * query head per CTA y: the slots of the task's query tile into its rows of o. */
template <class Cfg> __device__ void batch_merge_kernel(const kiln_launch_params &p)
{
    constexpr int D = Cfg::D;
    if ((int)blockIdx.x >= num_tasks(p)) return;
    const kiln_merge_task t = load_task(p, blockIdx.x);
    const work_req r = load_req(p, t.b);
    const int h = blockIdx.y, H = p.num_qo_heads, R = p.slot_rows;
    const int row0 = t.m * R, nrows = min(R, r.qo_len - row0), slot0 = t.slot0, ns = t.nslots;
    const float *plse = reinterpret_cast<const float *>(p.partial_lse);
    const float *po = reinterpret_cast<const float *>(p.partial_o);
    for (int e = threadIdx.x; e < nrows * D; e += blockDim.x) {
        const int rr = e / D, d = e % D;
        float M = neg_inf();
        for (int s = 0; s < ns; s++) M = max_f(M, plse[((i64)(slot0 + s) * H + h) * R + rr]);
        state_merge acc(M);
        for (int s = 0; s < ns; s++) {
            const i64 at = ((i64)(slot0 + s) * H + h) * R + rr;
            const float ls = plse[at];
            const float wgt = acc.weight(ls);
            acc.add(wgt, po[at * D + d]);
        }
        const i64 row = (i64)r.q_start + row0 + rr;
        reinterpret_cast<u16 *>(p.o)[row * p.o_stride_n + (i64)h * p.o_stride_h + d] = from_float<Cfg::OUT_DT>(acc.out());
        if (Cfg::LSE && d == 0) reinterpret_cast<float *>(p.lse)[row * H + h] = acc.lse_nat_of_log2();
    }
}

/* ---- public state merges (op=merge): grid (rows, H), D threads ---- */

/* merge_state (out of place) and merge_state_in_place (into v_a / lse_a, rows whose mask byte
 * is 0 left alone). */
template <class Cfg> __device__ void merge_state_kernel(const kiln_merge_params &p, bool in_place)
{
    constexpr int DT = Cfg::DT;
    const int i = blockIdx.x, h = blockIdx.y, d = threadIdx.x, H = p.num_heads;
    if (in_place && p.mask && !reinterpret_cast<const unsigned char *>(p.mask)[i]) return;
    const i64 at = (i64)i * p.v_stride_n + (i64)h * p.v_stride_h + d;
    const float lse[2] = {reinterpret_cast<const float *>(p.lse_a)[(i64)i * H + h],
                          reinterpret_cast<const float *>(p.lse_b)[(i64)i * H + h]};
    const float val[2] = {to_float<DT>(reinterpret_cast<const u16 *>(p.v_a)[at]),
                          to_float<DT>(reinterpret_cast<const u16 *>(p.v_b)[at])};
    float M = neg_inf();
    for (int s = 0; s < 2; s++) M = max_f(M, lse[s]);
    state_merge acc(M);
    for (int s = 0; s < 2; s++) {
        const float wgt = acc.weight<true>(lse[s]);
        acc.add(wgt, val[s]);
    }
    __syncthreads(); /* in place: every thread has read lse_a before thread 0 rewrites it */
    u16 *vo = reinterpret_cast<u16 *>(in_place ? p.v_a : p.v_out);
    float *lso = reinterpret_cast<float *>(in_place ? p.lse_a : p.lse_out);
    vo[at] = from_float<DT>(acc.out());
    if (d == 0 && lso) lso[(i64)i * H + h] = acc.lse_nat();
}

/* merge_states: v_all [rows, S, H, D] (strides: row S*H*D, state H*D), lse_all [rows, S, H]. */
template <class Cfg> __device__ void merge_states_kernel(const kiln_merge_params &p)
{
    constexpr int DT = Cfg::DT, D = Cfg::D;
    const int i = blockIdx.x, h = blockIdx.y, d = threadIdx.x, H = p.num_heads, S = p.num_states;
    const float *ls = reinterpret_cast<const float *>(p.lse_all) + (i64)i * S * H + h;
    const u16 *va = reinterpret_cast<const u16 *>(p.v_all) + (i64)i * S * H * D + (i64)h * D + d;
    float M = neg_inf();
    for (int s = 0; s < S; s++) M = max_f(M, ls[(i64)s * H]);
    state_merge acc(M);
    for (int s = 0; s < S; s++) {
        const float l = ls[(i64)s * H];
        const float wgt = acc.weight<true>(l);
        acc.add(wgt, to_float<DT>(va[(i64)s * H * D]));
    }
    const i64 at = (i64)i * p.v_stride_n + (i64)h * p.v_stride_h + d;
    reinterpret_cast<u16 *>(p.v_out)[at] = from_float<DT>(acc.out());
    if (d == 0 && p.lse_out) reinterpret_cast<float *>(p.lse_out)[(i64)i * H + h] = acc.lse_nat();
}

} /* namespace kiln */

#endif /* KILN_MERGE_CUH */
