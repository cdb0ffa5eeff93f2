/*
 * schedule.cuh — the device side of a batch plan's schedule (kv=ragged / kv=paged): the
 * readers of the records runtime/batch.c writes into the workspace, laid out by the contract
 * header (common/params.h: kiln_work_header, kiln_work_item, kiln_work_req, kiln_merge_task),
 * and the address of the fused merge's arrival counters. Every record array starts at a
 * multiple of 4 ints, so each reader takes the first four words of a record with one 16-byte
 * load.
 */
#ifndef KILN_SCHEDULE_CUH
#define KILN_SCHEDULE_CUH

#include "common/device.cuh"
#include "common/params.h"
#include "common/variant.cuh"

namespace kiln {

/* The fields of kiln_work_item a kernel reads (with its request's starts and lengths). */
struct work_item {
    int b, m, kv_lo, kv_hi, slot, task, q_start, kv_start, qo_len, kv_len;
};
/* The fields of kiln_work_req a kernel reads (its mask data through load_req_mask). */
struct work_req {
    int q_start, qo_len, kv_start, kv_len;
};

/* Record sizes and field offsets in ints (the schedule is addressed as int words). */
constexpr int ITEM_INTS = sizeof(kiln_work_item) / sizeof(int);
constexpr int REQ_INTS = sizeof(kiln_work_req) / sizeof(int);
constexpr int TASK_INTS = sizeof(kiln_merge_task) / sizeof(int);

template <class P> __device__ __forceinline__ const int *work_ints(const P &p)
{
    return reinterpret_cast<const int *>(p.work);
}
template <class P> __device__ __forceinline__ int num_items(const P &p)
{
    return work_ints(p)[KILN_WORK_HEADER_ITEMS_AT];
}
template <class P> __device__ __forceinline__ int num_tasks(const P &p)
{
    return work_ints(p)[KILN_WORK_HEADER_TASKS_AT];
}

template <class P> __device__ __forceinline__ work_item load_item(const P &p, int i)
{
    /* three 16-byte loads at once (kiln_work_item); the compiler drops those of fields unread */
    const int4 *w = reinterpret_cast<const int4 *>(work_ints(p) + p.items_off + i * ITEM_INTS);
    const int4 a = w[0], c = w[KILN_WORK_ITEM_SLOT_AT / 4], l = w[KILN_WORK_ITEM_LEN_AT / 4];
    return work_item{a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w, l.x, l.y};
}
template <class P> __device__ __forceinline__ work_req load_req(const P &p, int b)
{
    /* q_start, qo_len, kv_start, kv_len */
    const int4 a = *reinterpret_cast<const int4 *>(work_ints(p) + p.reqs_off + b * REQ_INTS);
    return work_req{a.x, a.y, a.z, a.w};
}
template <class P> __device__ __forceinline__ mask_base load_req_mask(const P &p, int b)
{
    /* mask_bit0_lo, mask_bit0_hi, bsr_row0 */
    const int4 a = *reinterpret_cast<const int4 *>(work_ints(p) + p.reqs_off + b * REQ_INTS + KILN_WORK_REQ_MASK_AT);
    return mask_base{(i64)(((unsigned long long)(unsigned)a.y << 32) | (unsigned)a.x), a.z};
}
/* Merge task i (i: the CTA's blockIdx.x, unsigned as it comes). */
template <class P> __device__ __forceinline__ kiln_merge_task load_task(const P &p, unsigned i)
{
    const int4 t = *reinterpret_cast<const int4 *>(work_ints(p) + p.tasks_off + i * TASK_INTS);
    return kiln_merge_task{t.x, t.y, t.z, t.w};
}

/* The arrival counter of merge task `task` and head scope `scope` of `scopes` (params.h: int
 * [task bound][scopes] at counters_off); written with atomics, so not const. */
template <class P> __device__ __forceinline__ int *task_counter(const P &p, int task, int scope, int scopes)
{
    return reinterpret_cast<int *>(p.work) + p.counters_off + (i64)task * scopes + scope;
}

} /* namespace kiln */

#endif /* KILN_SCHEDULE_CUH */
