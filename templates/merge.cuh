/*
 * merge.cuh — the merge kernels, all over state_merge (common/state_merge.cuh): the split-KV
 * merge of a single decode, the split merge of a batch plan (a kernel of its own, or fused into
 * the batch decode kernels' epilogue), and the public merge_state / merge_state_in_place /
 * merge_states kernels (op=merge variants).
 *
 * Split partials (written by decode / prefill CTAs and items with a slot) are float, in log2
 * units: a single decode's partial_o [splits][H][D], partial_lse [splits][H]; a batch's
 * partial_o [slot][H][slot_rows][D], partial_lse [slot][H][slot_rows]. Public states are in
 * the variant's dtype with natural-log lse: v [rows, H, D] (strides at run time), lse [rows, H].
 *
 * A batch plan's splits are merged one of two ways, each element's sums in the same order
 * (merge_partials' M, then the states s = 0, 1, ...), so both write the same bits:
 *   - batch_merge_kernel, the second launch of kiln_plan_run: grid (tasks, H), any thread count,
 *     element by element (merge_split_element);
 *   - with kiln_cfg::FUSED_MERGE (the batch decode kernels), merge_task_if_last at the end of
 *     the main kernel: the last CTA of a merge task to finish its partial merges the task's
 *     slots for the heads it covers (fused_merge_rows: a lane's columns of several heads at
 *     once), and kiln_plan_run launches nothing more. It counts the CTAs on the schedule's
 *     arrival counters (common/params.h).
 *
 * With kiln_cfg::PDL (sm_90+) the merge kernel is a programmatic dependent launch of the main
 * kernel (let_merge_launch, wait_main_grid below).
 */
#ifndef KILN_MERGE_CUH
#define KILN_MERGE_CUH

#include "common/device.cuh"
#include "common/params.h"
#include "common/schedule.cuh"
#include "common/state_merge.cuh"

namespace kiln {

/* ---- the merge kernel's programmatic dependent launch (kiln_cfg::PDL, sm_90+) ----
 *
 * The host launches the merge kernel with programmatic stream serialization (runtime/launch.c,
 * kiln__launch_merge), so it may be scheduled before the main kernel ends:
 *   - let_merge_launch, in every CTA of the main kernel (griddepcontrol.launch_dependents): the
 *     merge grid may be scheduled once every CTA of the main grid has called it or exited. It
 *     is only a scheduling hint: it orders no memory, and the merge kernel's wait still waits
 *     for the whole main grid, so where it sits does not change a result. The main kernels
 *     call it first thing in each CTA: the merge grid is then scheduled as soon as the main
 *     grid's last CTA has started (not before: its CTAs never take a slot a main CTA still
 *     waits for), and its CTAs wait on the slots the main grid leaves (a merge CTA holds
 *     registers and warps, no shared memory) instead of being launched after its end.
 *   - wait_main_grid, in every thread of the merge kernel (griddepcontrol.wait): blocks until
 *     the main grid has completed and its stores are visible. Nothing the main kernel writes
 *     (the partial states; the persistent grid's job counter) is read before it; the schedule
 *     records the host uploaded before the main kernel may be.
 * The instructions are kiln_cfg's members, written by jit/expand.c into a PDL config's source
 * only; without PDL both functions are empty, and the launch an ordinary one. */
template <class Cfg> __device__ __forceinline__ void let_merge_launch()
{
    if constexpr (Cfg::PDL) Cfg::griddep_launch_dependents();
}
template <class Cfg> __device__ __forceinline__ void wait_main_grid()
{
    if constexpr (Cfg::PDL) Cfg::griddep_wait();
}

/* The loads of a split merge in flight at once: a merge is latency bound, so it loads the
 * partial states N at a time before it uses any (one L2 round trip per batch, not per state).
 * The merge kernels take batches of up to MERGE_BATCH (32 states in one round trip; 8 when
 * there are no more), the batch decode's wide merge kernel MERGE_BATCH_WIDE (64: the B1
 * decode's 64 splits in one round trip instead of four, with twice the registers, so it is
 * launched only where a task has more than MERGE_BATCH slots). The bits do not depend on N
 * (merge_partials). The fused merge batches its loads its own way (fused_merge_rows). */
constexpr int MERGE_BATCH = KILN_MERGE_BATCH, MERGE_BATCH_WIDE = KILN_MERGE_BATCH_WIDE;

/* N partial states s0 .. s0 + N - 1 of one element, loaded before any is used: those from ns
 * on are read again at state ns - 1 (in bounds, no branch: a load behind a branch is issued
 * just before its use), count in no max and are added as nothing. A running address steps
 * every load and each load takes it or the last state's, whichever is lower: stepping it only
 * while in bounds made NVVM far slower on every kernel with a merge, and one address computed
 * per load measured slower on the GPU (docs/perf/notes.md, session 38). */
template <int N> struct partial_batch {
    float ls[N], os[N];
    static __device__ __forceinline__ void load_field(float (&x)[N], int s0, int ns, const float *at, i64 step)
    {
        const float *q = at + s0 * step, *const last = at + (ns - 1) * step;
#pragma unroll
        for (int j = 0; j < N; j++, q += step) x[j] = *(q < last ? q : last);
    }
    __device__ __forceinline__ void load_lse(int s0, int ns, const float *lse, i64 lse_step)
    {
        load_field(ls, s0, ns, lse, lse_step);
    }
    __device__ __forceinline__ void load(int s0, int ns, const float *lse, i64 lse_step, const float *o, i64 o_step)
    {
        load_field(ls, s0, ns, lse, lse_step);
        load_field(os, s0, ns, o, o_step);
    }
    /* M and the batch's lse (copies of state ns - 1's past ns: no change to a max that has it) */
    __device__ __forceinline__ float max_lse(float M) const
    {
#pragma unroll
        for (int j = 0; j < N; j++) M = max_f(M, ls[j]);
        return M;
    }
    /* the batch's states below ns into acc, in order */
    __device__ __forceinline__ void add_to(state_merge &acc, int s0, int ns) const
    {
#pragma unroll
        for (int j = 0; j < N; j++)
            if (s0 + j < ns) acc.add(acc.weight(ls[j]), os[j]);
    }
};

/* merge_partials of ns <= N states in one batch: one round trip. */
template <int N>
__device__ __forceinline__ state_merge merge_one_batch(int ns, const float *lse, i64 lse_step, const float *o, i64 o_step)
{
    partial_batch<N> b;
    b.load(0, ns, lse, lse_step, o, o_step);
    state_merge acc(b.max_lse(neg_inf()));
    b.add_to(acc, 0, ns);
    return acc;
}

/* merge_partials in batches of N: one round trip when ns <= N; else one a batch for the
 * largest lse and one a batch for the sums. */
template <int N>
__device__ __forceinline__ state_merge merge_batches(int ns, const float *lse, i64 lse_step, const float *o, i64 o_step)
{
    if (ns <= N) return merge_one_batch<N>(ns, lse, lse_step, o, o_step);
    partial_batch<N> b;
    float M = neg_inf();
    for (int s0 = 0; s0 < ns; s0 += N) {
        b.load_lse(s0, ns, lse, lse_step);
        M = b.max_lse(M);
    }
    state_merge acc(M);
    for (int s0 = 0; s0 < ns; s0 += N) {
        b.load(s0, ns, lse, lse_step, o, o_step);
        b.add_to(acc, s0, ns);
    }
    return acc;
}

/* The merge of ns normalised partial states of one element, state s's lse (log2) at
 * lse + s * lse_step and its o at o + s * o_step: the largest lse M first, then the states
 * weighted by it and added in the order s = 0 .. ns - 1. The bits depend on that order only,
 * not on the batch size, the batch around a request, or which kernel merges. N up to
 * MERGE_BATCH: batches of 8 where ns <= 8, else of N. N > MERGE_BATCH (the wide merge):
 * one batch of N where MERGE_BATCH < ns <= N, else batches of MERGE_BATCH (the code of one
 * wide batch only: a two-pass loop of wide batches is slower to compile). */
template <int N>
__device__ __forceinline__ state_merge merge_partials(int ns, const float *lse, i64 lse_step, const float *o, i64 o_step)
{
    if constexpr (N > 8)
        if (ns <= 8) return merge_batches<8>(ns, lse, lse_step, o, o_step);
    if constexpr (N > MERGE_BATCH) { /* the wide batch: one round trip for up to N states */
        if (ns <= MERGE_BATCH || ns > N) return merge_batches<MERGE_BATCH>(ns, lse, lse_step, o, o_step);
        return merge_one_batch<N>(ns, lse, lse_step, o, o_step);
    }
    return merge_batches<N>(ns, lse, lse_step, o, o_step);
}

/* Combine the num_splits partial states of each query head of a single decode: grid H, any
 * thread count. */
template <class Cfg> __device__ void decode_merge_kernel(const kiln_launch_params &p)
{
    constexpr int D = Cfg::D;
    const int h = blockIdx.x, H = p.num_qo_heads, S = p.num_splits;
    const float *plse = reinterpret_cast<const float *>(p.partial_lse);
    const float *po = reinterpret_cast<const float *>(p.partial_o);
    wait_main_grid<Cfg>(); /* the partial states are the main kernel's */
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        const state_merge acc = merge_partials<MERGE_BATCH>(S, plse + h, H, po + (i64)h * D + d, (i64)H * D);
        reinterpret_cast<u16 *>(p.o)[(i64)h * p.o_stride_h + d] = from_float<Cfg::OUT_DT>(acc.out());
        if (Cfg::LSE && d == 0) reinterpret_cast<float *>(p.lse)[h] = acc.lse_of_log2(p.lse_unit);
    }
}

/* Element d of row rr (of the task's query tile) of head h of merge task t of request r: the
 * merge of the partial states of slots slot0 .. slot0 + nslots - 1, in that order, into o and,
 * for d == 0, lse (in p.lse_unit), N states a round trip. The one per-element merge of a batch
 * plan's splits in the merge kernels (fused_merge_rows sums in the same order). */
template <class Cfg, int N>
__device__ __forceinline__ void merge_split_element(const kiln_launch_params &p, const kiln_merge_task &t,
                                                    const work_req &r, int h, int rr, int d)
{
    constexpr int D = Cfg::D;
    const int H = p.num_qo_heads, R = p.slot_rows, ns = t.nslots;
    const float *plse = reinterpret_cast<const float *>(p.partial_lse);
    const float *po = reinterpret_cast<const float *>(p.partial_o);
    const i64 at = ((i64)t.slot0 * H + h) * R + rr, step = (i64)H * R;
    const state_merge acc = merge_partials<N>(ns, plse + at, step, po + at * D + d, step * D);
    const i64 row = (i64)r.q_start + t.m * R + rr;
    reinterpret_cast<u16 *>(p.o)[row * p.o_stride_n + (i64)h * p.o_stride_h + d] = from_float<Cfg::OUT_DT>(acc.out());
    if (Cfg::LSE && d == 0) reinterpret_cast<float *>(p.lse)[row * H + h] = acc.lse_of_log2(p.lse_unit);
}

/* One merge task of a batch plan per CTA x (padded grid: tasks past the count return), one
 * query head per CTA y: the slots of the task's query tile into its rows of o, N states a
 * round trip (kiln_merge: MERGE_BATCH; the batch decode's kiln_merge_wide: MERGE_BATCH_WIDE). */
template <class Cfg, int N = MERGE_BATCH> __device__ void batch_merge_kernel(const kiln_launch_params &p)
{
    constexpr int D = Cfg::D;
    if ((int)blockIdx.x >= num_tasks(p)) {
        /* padding waits too, so that the merge grid never ends before the main grid: what the
         * stream runs next (a schedule's upload, the next step) then starts after both */
        wait_main_grid<Cfg>();
        return;
    }
    /* the schedule's records were uploaded before the main kernel: read while it ends */
    const kiln_merge_task t = load_task(p, blockIdx.x);
    const work_req r = load_req(p, t.b);
    wait_main_grid<Cfg>(); /* the partial states are the main kernel's */
    const int h = blockIdx.y, R = p.slot_rows, nrows = min(R, r.qo_len - t.m * R);
    for (int e = threadIdx.x; e < nrows * D; e += blockDim.x) merge_split_element<Cfg, N>(p, t, r, h, e / D, e % D);
}

/* The fused merge's loads: float4 (CV = 4 columns) at D >= 128, float2 at D = 64. */
template <int CV> struct cols;
template <> struct cols<2> {
    float x[2];
    __device__ __forceinline__ void load(const float *at)
    {
        const float2 v = __ldcg(reinterpret_cast<const float2 *>(at));
        x[0] = v.x, x[1] = v.y;
    }
};
template <> struct cols<4> {
    float x[4];
    __device__ __forceinline__ void load(const float *at)
    {
        const float4 v = __ldcg(reinterpret_cast<const float4 *>(at));
        x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    }
};

/* The last CTA's merge of a task (merge_task_if_last): its nrows rows of heads h0 .. h0 + nh - 1,
 * (head, row) units UB at a time a warp (UB: the caller's, about its heads a warp, at most 4).
 * Lane `lane` holds columns (c * WARP + lane) * CV .. + CV - 1 of chunk c < NC of each unit, so
 * a warp reads a slot's row of a unit with one vector load a lane; SB slots of the UB units are
 * in flight at once, FLOATS floats a lane (the caller's: 128 in a one-warp CTA, a round trip
 * for every 8 slots of 4 heads at D 128, where the per-element loop took one per element and
 * slot batch; fewer in a CTA of more warps, whose registers it shares). Each lane loads the
 * lse of slot c0 + lane of every 32, the largest M comes by shuffles, and each weight is
 * computed once, by the lane that loaded its lse, and handed round by a shuffle. The sums are
 * merge_partials's, element by element: M over every slot, then l += w_s, o += w_s o_s for
 * s = 0 .. ns - 1 in order, w_s = state_merge::weight; so the bits are the merge kernel's. */
template <class Cfg, int UB, int FLOATS>
__device__ __forceinline__ void fused_merge_rows(const kiln_launch_params &p, const kiln_merge_task &t, const work_req &r,
                                                 int h0, int nh, int nrows)
{
    constexpr int D = Cfg::D, CV = D >= 128 ? 4 : 2, NC = D / (WARP * CV);
    constexpr int SB = FLOATS / (UB * NC * CV) > 0 ? FLOATS / (UB * NC * CV) : 1;
    static_assert(D % (WARP * CV) == 0, "the fused merge's columns: D a multiple of 64");
    const int H = p.num_qo_heads, R = p.slot_rows, ns = t.nslots, units = nh * nrows;
    const int lane = (int)threadIdx.x % WARP, warp = (int)threadIdx.x / WARP, warps = (int)blockDim.x / WARP;
    const float *plse = reinterpret_cast<const float *>(p.partial_lse);
    const float *po = reinterpret_cast<const float *>(p.partial_o);
    const i64 step = (i64)H * R; /* from one slot to the next, in lse words */
    for (int u0 = warp * UB; u0 < units; u0 += warps * UB) {
        i64 at[UB]; /* unit j's state in slot slot0 (units past the last: the last, not stored) */
#pragma unroll
        for (int j = 0; j < UB; j++) {
            const int u = min(u0 + j, units - 1);
            at[j] = ((i64)t.slot0 * H + h0 + u / nrows) * R + u % nrows;
        }
        /* M: the largest lse of each unit, over every slot */
        float M[UB], ls0[UB];
#pragma unroll
        for (int j = 0; j < UB; j++) M[j] = neg_inf();
        for (int c0 = 0; c0 < ns; c0 += WARP) {
            const int s = min(c0 + lane, ns - 1); /* past ns: slot ns - 1 again, no change to a max */
#pragma unroll
            for (int j = 0; j < UB; j++) {
                const float x = __ldcg(plse + at[j] + s * step);
                if (c0 == 0) ls0[j] = x;
                M[j] = max_f(M[j], x);
            }
        }
#pragma unroll
        for (int j = 0; j < UB; j++)
#pragma unroll
            for (int sh = WARP / 2; sh > 0; sh /= 2) M[j] = max_f(M[j], __shfl_xor_sync(0xffffffffu, M[j], sh));
        float l[UB], o[UB][NC][CV]; /* each element's state_merge l and o; its M is its unit's */
#pragma unroll
        for (int j = 0; j < UB; j++) {
            l[j] = 0.f;
#pragma unroll
            for (int c = 0; c < NC; c++)
#pragma unroll
                for (int e = 0; e < CV; e++) o[j][c][e] = 0.f;
        }
        for (int c0 = 0; c0 < ns; c0 += WARP) {
            const int n = min(WARP, ns - c0), s_own = min(c0 + lane, ns - 1);
            float w_own[UB]; /* the weight of slot c0 + lane */
#pragma unroll
            for (int j = 0; j < UB; j++)
                w_own[j] = state_merge(M[j]).weight(c0 == 0 ? ls0[j] : __ldcg(plse + at[j] + s_own * step));
            for (int s0 = 0; s0 < n; s0 += SB) {
                cols<CV> v[SB][UB][NC]; /* past ns: slot ns - 1 again, not added */
#pragma unroll
                for (int b = 0; b < SB; b++) {
                    const int s = min(c0 + s0 + b, ns - 1);
#pragma unroll
                    for (int j = 0; j < UB; j++)
#pragma unroll
                        for (int c = 0; c < NC; c++) v[b][j][c].load(po + (at[j] + s * step) * D + (c * WARP + lane) * CV);
                }
#pragma unroll
                for (int b = 0; b < SB; b++) {
                    if (s0 + b >= n) break;
#pragma unroll
                    for (int j = 0; j < UB; j++) {
                        const float w = __shfl_sync(0xffffffffu, w_own[j], s0 + b);
                        l[j] += w; /* state_merge::add, once for the unit's elements */
#pragma unroll
                        for (int c = 0; c < NC; c++)
#pragma unroll
                            for (int e = 0; e < CV; e++) o[j][c][e] += w * v[b][j][c].x[e];
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < UB; j++) {
            if (u0 + j >= units) break;
            const int h = h0 + (u0 + j) / nrows, rr = (u0 + j) % nrows;
            const i64 row = (i64)r.q_start + t.m * R + rr;
            u16 *out = reinterpret_cast<u16 *>(p.o) + row * p.o_stride_n + (i64)h * p.o_stride_h;
            state_merge acc(M[j]);
            acc.l = l[j];
#pragma unroll
            for (int c = 0; c < NC; c++)
#pragma unroll
                for (int e = 0; e < CV; e++) {
                    acc.o = o[j][c][e];
                    out[(c * WARP + lane) * CV + e] = from_float<Cfg::OUT_DT>(acc.out());
                }
            if (Cfg::LSE && lane == 0) reinterpret_cast<float *>(p.lse)[row * H + h] = acc.lse_of_log2(p.lse_unit);
        }
    }
}

/* The fused merge (kiln_cfg::FUSED_MERGE): called by every thread of a split CTA of a batch
 * plan (WARPS warps) once its partial state of query heads h0 .. h0 + NH - 1 is written; those
 * heads are its head scope, scope blockIdx.y * gridDim.z + blockIdx.z of the grid's y x z. The CTA counts
 * itself on the (task, scope) counter; the one that draws nslots - 1 (every other CTA of the
 * task has written its partial of these heads) puts the counter back to 0 and merges the
 * task's slots for its heads into o and lse (fused_merge_rows: the merge kernel's bits).
 *
 * Memory order: each thread's partial stores, then its __threadfence (a device-scope fence),
 * then the block barrier, then thread 0's atomicAdd: a CTA's whole partial is visible device
 * wide before its count is. Thread 0 also fences between the barrier and its atomicAdd: a
 * fence is cumulative, so that one orders every store the barrier made visible to thread 0 (the
 * whole CTA's partial) before the count in the memory model's own terms, not only in the
 * hardware's. The last CTA's thread 0 fences again after its atomicAdd (acquire) before
 * __syncthreads_or hands the outcome to every thread (no shared memory), and the merge reads
 * the partials with __ldcg from L2. The counter's reset needs no fence: no CTA adds to it again
 * in this run, and the next run (a graph replay) starts after this kernel ends. */
template <class Cfg, int NH, int WARPS>
__device__ __forceinline__ void merge_task_if_last(const kiln_launch_params &p, int task, int h0)
{
    /* the units a warp takes at once */
    constexpr int UB = (NH + WARPS - 1) / WARPS < 4 ? (NH + WARPS - 1) / WARPS : 4;
    const int scopes = gridDim.y * gridDim.z, scope = blockIdx.y * gridDim.z + blockIdx.z;
    const kiln_merge_task t = load_task(p, (unsigned)task);
    __threadfence();
    __syncthreads();
    int last = 0;
    if (threadIdx.x == 0) {
        int *count = task_counter(p, task, scope, scopes);
        __threadfence();
        last = atomicAdd(count, 1) == t.nslots - 1;
        if (last) {
            *count = 0;
            __threadfence();
        }
    }
    if (!__syncthreads_or(last)) return;
    const work_req r = load_req(p, t.b);
    constexpr int FLOATS = 128 / WARPS < 16 ? 16 : 128 / WARPS;
    fused_merge_rows<Cfg, UB, FLOATS>(p, t, r, h0, NH, min(p.slot_rows, r.qo_len - t.m * p.slot_rows));
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
