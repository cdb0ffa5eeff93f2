/*
 * batch.c — plan / run for batch kernels (kv=ragged, kv=paged).
 *
 * kiln_plan_schedule turns CPU copies of the index arrays into a schedule of work items (request,
 * query tile, key chunk): it picks the key chunk that minimises an estimate of the makespan
 * over the device's CTA slots, cuts each request's keys into such chunks, gives every item of
 * a split query tile a partial-state slot and the tile a merge task, orders items from the
 * heaviest down (the hardware dispatches CTAs in blockIdx order, so this is a list schedule),
 * and copies the schedule into the caller's workspace with one cuMemcpyHtoDAsync from a
 * pinned buffer. kiln_plan_run fills the parameter block and launches the main kernel and,
 * when anything may be split and the kernel does not merge its own splits, the merge kernel:
 * pure host arithmetic and one or two launches.
 *
 * With KILN_TUNE merge=1 the batch decode kernels merge their own splits (kiln__config.
 * fused_merge; not the default: slower on the H200 where tasks have many slots): the last CTA
 * of each merge task to finish merges the task's slots (templates/merge.cuh,
 * merge_task_if_last), counting arrivals on one int per (task, head scope) after the tasks.
 * Those counters are 0 in every upload (the schedule's tasks' counters are written with it) and
 * the last CTA of each task puts its counter back to 0, so a captured run replays from 0.
 *
 * Workspace (offsets fixed by the plan's bounds, so a graph-mode run keeps them): an int
 * region (kiln_work_header, kiln_work_item[], kiln_work_req[], kiln_merge_task[], and with a
 * fused merge the arrival counters int [task bound][head scopes]: the contract in
 * templates/common/params.h), then the partial states: float lse [slots][H][rows], float o
 * [slots][H][rows][D]. kiln_plan_schedule_scratch puts the partial states in a scratch buffer
 * of their own instead: they live only while a run executes, so plans whose runs are ordered
 * on one stream may share it (FlashInfer's wrappers share a float workspace), while each keeps
 * its int region, which its later runs and graph replays read, in a workspace of its own.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "params.h"
#include "runtime.h"

/* the schedule's records (templates/common/params.h), in ints */
enum {
    ITEM_INTS = sizeof(kiln_work_item) / sizeof(int),
    REQ_INTS = sizeof(kiln_work_req) / sizeof(int),
    TASK_INTS = sizeof(kiln_merge_task) / sizeof(int),
    HEADER_INTS = sizeof(kiln_work_header) / sizeof(int),
    /* per-CTA fixed cost in keys: pipeline fill, q load, the final combine */
    CTA_OVERHEAD_KEYS = 256,
    /* extra cost of a split query tile: its partial write and the merge */
    SPLIT_OVERHEAD_KEYS = 64,
    /* the merge of a split tile, per piece. Measured when the merge read the pieces' partial
     * states one after another (H200, B1 x 4096 bf16 G4 decode: 64 pieces a row merged in
     * 11.5 us against the main kernel's 6.2 us, about 9 keys' time a piece). The merge now
     * loads them 32 at a time (templates/merge.cuh); with this term unchanged the planner's
     * B1 x 4096 (10.1-10.7 us) beats every fixed split (8 pages 11.3, 16 pages 14.1), so it
     * was not re-tuned */
    MERGE_KEYS_PER_PIECE = 9,
    /* the CTAs of an SM the split estimate credits with a share of the memory bandwidth each:
     * past four one-warp decode CTAs an SM more resident CTAs share the read, they do not add
     * to it. H200, fp8 e4m3 packed decode (11 CTAs an SM), graph replay: B64 x 512 split by
     * the slot count alone 31.8 us, unsplit 22.6; B64 x 4096 139.1 split, 135.4 unsplit;
     * B16 x 512 (256-key chunks of the slot count: 16.4) best at 128 (13.8), which the capped
     * estimate picks. The 16-bit packed decode (4 CTAs an SM) does not reach the cap */
    BW_CTAS_PER_SM = 4,
    /* pinned schedule buffers used in turn: a plan waits only when the copy out of the buffer
     * it reuses (HOST_RING plans ago) has not run yet */
    HOST_RING = 4,
};

/* The workspace of one schedule: the bounds it was sized for (items, tasks, partial slots), the
 * int region (header, items, requests, tasks, the fused merge's counters: `counters` ints, 0
 * without it; offsets in ints, int_bytes rounded up to 256) and the partial states (byte
 * offsets from their own base, part_bytes in all). In one workspace the partial states follow
 * the int region (bytes = int_bytes + part_bytes); with a scratch buffer they are in it. */
typedef struct layout {
    int64_t items, tasks, slots, counters;
    int items_off, reqs_off, tasks_off, counters_off;
    size_t int_bytes, plse_off, po_off, part_bytes, bytes;
} layout;

/* Where a schedule goes: the workspace, and the scratch buffer of the partial states when the
 * plan was given one (kiln_plan_schedule_scratch; has_scratch 0: they are in the workspace). */
typedef struct buffers {
    kiln_devptr ws, scratch;
    size_t ws_bytes, scratch_bytes;
    int has_scratch;
} buffers;

struct kiln_plan {
    kiln_kernel *k;
    kiln_plan_opts o;
    int decode, H, hpi, rows, D, gran, slots;
    int bw_slots; /* CTAs the split estimate lets read at once (BW_CTAS_PER_SM an SM) */
    /* the last plan */
    kiln_plan_info info;
    int grid, tasks_grid;
    int wide_merge; /* the merge kernel is kiln_merge_wide (kiln__launch_merge) */
    int job_heads;  /* kiln_launch_params.job_heads of the last schedule (kiln__job_heads) */
    layout lay;
    size_t uploaded;   /* bytes of the int region the last upload copied */
    kiln_devptr ws;    /* the workspace of the last schedule: its int region at offset 0 */
    kiln_devptr parts; /* the base of its partial states (in ws, or the scratch buffer) */
    size_t ws_need;    /* bytes of ws a run needs: the layout's, or its int region's */
    int scheduled;     /* 1 once a schedule was written: run and describe need one */
    int host_only; /* tests: schedule into plain host memory, no device (kiln__plan_create_host) */
    /* host staging */
    int *host; /* pinned: HOST_RING buffers of host_ints each */
    size_t host_ints;
    CUevent copied[HOST_RING]; /* recorded after the copy out of each buffer */
    int copy_pending[HOST_RING];
    int ring; /* the buffer the last plan used */
    /* scratch (plain heap) */
    int *tile_keys, *order;
    size_t scratch_cap;
};

static kiln_status plan_fail(kiln_plan *pl, kiln_status st, kiln__err *e)
{
    return kiln__ctx_error(pl && pl->k ? pl->k->ctx : NULL, st, e);
}

/* The bound on split items (partial slots) of a plan with `batch` requests: a decode's split
 * items may take 8 waves of the device's CTA slots in eager mode, where the grid is the
 * schedule's items; in graph mode every replay launches the bound's CTAs, idle ones included,
 * so the planner's own splits of a decode stop at 2 waves there (its estimate never gains from
 * more than one for a request; a second leaves room to even out a mixed batch), as prefill's
 * always do. A fixed split without max_total_kv keeps 8 (its chunks are the caller's). */
static int64_t split_bound(const kiln_plan *pl, int batch)
{
    if (pl->o.no_split || (pl->o.fixed_split > 0 && !pl->decode)) return 0;
    if (pl->o.fixed_split > 0 && pl->o.max_total_kv > 0)
        return pl->o.max_total_kv / pl->o.fixed_split + (int64_t)batch + 1;
    const int64_t waves = pl->decode && (pl->o.max_batch <= 0 || pl->o.fixed_split > 0) ? 8 : 2;
    return waves * pl->slots / pl->hpi + 1;
}

/* Query tiles a batch of `batch` requests with `total_qo` rows can have. */
static int64_t tile_bound(const kiln_plan *pl, int batch, int64_t total_qo)
{
    if (pl->decode) return batch;
    int64_t t = (int64_t)batch + total_qo / pl->rows;
    if (t > total_qo + batch) t = total_qo + batch; /* requests with no rows get no tile */
    return t;
}

static int round4(int64_t x) { return (int)((x + 3) / 4 * 4); }

/* The layout of a batch with at most max_slots partial slots (-1: the split bound's). */
static int layout_for(const kiln_plan *pl, int batch, int64_t total_qo, int64_t max_slots,
                      layout *L)
{
    int64_t slots = split_bound(pl, batch);
    if (max_slots >= 0 && slots > max_slots) slots = max_slots;
    L->slots = slots;
    L->items = tile_bound(pl, batch, total_qo) + slots;
    L->tasks = slots;
    /* the fused merge's arrival counters: one per (task, head scope), a head scope being the
     * query heads of one of an item's hpi CTAs */
    L->counters = pl->k->cfg.fused_merge ? L->tasks * pl->hpi : 0;
    const int64_t ints = HEADER_INTS + L->items * ITEM_INTS + round4((int64_t)batch * REQ_INTS) +
                         L->tasks * TASK_INTS + L->counters;
    if (ints > (int64_t)1 << 30) return -1;
    L->items_off = HEADER_INTS;
    L->reqs_off = (int)(L->items_off + L->items * ITEM_INTS);
    L->tasks_off = L->reqs_off + round4((int64_t)batch * REQ_INTS);
    L->counters_off = (int)(L->tasks_off + L->tasks * TASK_INTS);
    L->int_bytes = (size_t)ints * sizeof(int);
    L->int_bytes = (L->int_bytes + 255) / 256 * 256;
    const size_t per_slot_lse = (size_t)pl->H * pl->rows * sizeof(float);
    L->plse_off = 0;
    L->po_off = ((size_t)slots * per_slot_lse + 255) / 256 * 256;
    L->part_bytes = L->po_off + (size_t)slots * per_slot_lse * pl->D;
    L->bytes = L->int_bytes + L->part_bytes;
    /* the regions follow one another without overlap */
    KILN__ASSERT_LE(L->tasks_off + L->tasks * TASK_INTS, L->counters_off);
    KILN__ASSERT_LE(L->counters_off + L->counters, ints);
    KILN__ASSERT_LE((int64_t)ints * (int64_t)sizeof(int), (int64_t)L->int_bytes);
    KILN__ASSERT_LE(L->plse_off + (size_t)slots * per_slot_lse, L->po_off);
    return 0;
}

/* A plan object with the kernel's geometry: CTAs per work item, rows per query tile, the key
 * granule of a split, and sms x ctas_per_sm CTAs resident on the device at once. */
static kiln_plan *plan_new(kiln_kernel *k, const kiln_plan_opts *opts, int sms, int ctas_per_sm)
{
    const int slots = sms * ctas_per_sm;
    kiln_plan *pl = calloc(1, sizeof *pl);
    if (!pl) return NULL;
    const kiln_variant *v = &k->v;
    pl->k = k;
    pl->o = *opts;
    pl->decode = v->op == KILN_OP_DECODE;
    pl->H = opts->num_qo_heads;
    pl->D = v->head_dim;
    /* CTAs per item: query heads, KV heads (pack) or the CUDA-core decode's head groups;
     * rows: query tokens per tile (a partial slot's rows); gran: keys per kernel tile */
    const int pack = k->cfg.pack, G = v->group;
    pl->hpi = pack ? pl->H / G : pl->decode ? (pl->H / G) * (G / k->cfg.gb) : pl->H;
    pl->rows = pl->decode ? 1 : pack ? k->cfg.block_m / G : k->cfg.block_m;
    pl->gran = pl->decode && !pack ? KILN_DECODE_TILE * k->cfg.warps : k->cfg.block_n;
    pl->slots = slots;
    pl->bw_slots = sms * (ctas_per_sm < BW_CTAS_PER_SM ? ctas_per_sm : BW_CTAS_PER_SM);
    if (pl->o.fixed_split > 0) { /* chunks stay aligned to the kernel's key tiles (in 64 bits: a
                                    caller may pass up to INT_MAX; past it, the largest whole
                                    multiple, which still splits no request) */
        const int64_t up = ((int64_t)pl->o.fixed_split + pl->gran - 1) / pl->gran * pl->gran;
        pl->o.fixed_split = (int)(up <= INT_MAX ? up : INT_MAX / pl->gran * pl->gran);
    }
    return pl;
}

/* The plan options, against the kernel. */
static kiln_status opts_check(const kiln_kernel *k, const kiln_plan_opts *opts, kiln__err *e)
{
    const kiln_variant *v = &k->v;
    const int H = opts->num_qo_heads, G = v->group;
    if (H < 1 || H % G || (v->kv == KILN_KV_PAGED && opts->page_size < 1) || opts->max_batch < 0 ||
        opts->max_qo_tokens < 0 || opts->fixed_split < 0 || opts->max_total_kv < 0) {
        kiln__fail(
            e, KILN_STATUS_INVALID_ARGUMENT,
            "plan %s: num_qo_heads=%d must be a positive multiple of group=%d; page_size=%d must "
            "be >= 1 for kv=paged; max_batch=%d, max_qo_tokens=%d, fixed_split=%d, "
            "max_total_kv=%lld must be >= 0",
            k->spec, H, G, opts->page_size, opts->max_batch, opts->max_qo_tokens, opts->fixed_split,
            (long long)opts->max_total_kv);
        return KILN_STATUS_INVALID_ARGUMENT;
    }
    if (v->mask_data == KILN_MASK_DATA_BSR && (opts->bsr_r < 1 || opts->bsr_c < 1)) {
        kiln__fail(
            e, KILN_STATUS_INVALID_ARGUMENT,
            "plan %s: mask_data=bsr needs the block shape in the options: bsr_r=%d and bsr_c=%d "
            "must be >= 1",
            k->spec, opts->bsr_r, opts->bsr_c);
        return KILN_STATUS_INVALID_ARGUMENT;
    }
    return KILN_STATUS_OK;
}

kiln_status kiln_plan_create(kiln_kernel *k, const kiln_plan_opts *opts, kiln_plan **out)
{
    kiln__err e = {{0}};
    if (!out) return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT, "plan: out is NULL");
    *out = NULL;
    if (!k || !opts)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT,
                          "plan: NULL kernel or options");
    const kiln_variant *v = &k->v;
    if (v->kv == KILN_KV_CONTIGUOUS || v->op == KILN_OP_MERGE) {
        kiln__fail(
            &e, KILN_STATUS_INVALID_ARGUMENT,
            "plan: kernel %s is not a batch kernel (plans need kv=ragged or kv=paged; single "
            "requests use kiln_single_decode / kiln_single_prefill)",
            k->spec);
        return kiln__ctx_error(k->ctx, KILN_STATUS_INVALID_ARGUMENT, &e);
    }
    if (!k->loaded) {
        kiln__fail(
            &e, KILN_STATUS_INVALID_ARGUMENT,
            "plan: kernel %s (%s) was compiled for inspection, not loaded; use kiln_kernel_get",
            k->key, k->arch);
        return kiln__ctx_error(k->ctx, KILN_STATUS_INVALID_ARGUMENT, &e);
    }
    kiln_status st = opts_check(k, opts, &e);
    if (st) return kiln__ctx_error(k->ctx, st, &e);
    const int sms = k->ctx->info.sm_count > 0 ? k->ctx->info.sm_count : 1;
    kiln_plan *pl = plan_new(k, opts, sms, k->ctas_per_sm > 0 ? k->ctas_per_sm : 1);
    if (!pl) return kiln__fail(kiln__tls_err(), KILN_STATUS_NO_MEMORY, "plan: out of memory");
    st = kiln__ctx_bind(k->ctx, &e);
    CUresult r = CUDA_SUCCESS;
    int made = 0;
    for (; !st && r == CUDA_SUCCESS && made < HOST_RING; made++)
        r = k->ctx->cu->cuEventCreate(&pl->copied[made], CU_EVENT_DISABLE_TIMING);
    if (st || r != CUDA_SUCCESS) {
        if (!st) st = kiln__cu_fail(&e, r, "plan %s: event", k->spec);
        for (int i = 0; i < made - 1; i++) k->ctx->cu->cuEventDestroy(pl->copied[i]);
        free(pl);
        return kiln__ctx_error(k->ctx, st, &e);
    }
    *out = pl;
    return KILN_STATUS_OK;
}

kiln_status kiln__plan_create_host(kiln_kernel *k, const kiln_plan_opts *opts, int sms,
                                   int ctas_per_sm, kiln_plan **out)
{
    *out = NULL;
    kiln_status st = opts_check(k, opts, kiln__tls_err());
    if (st) return st;
    *out = plan_new(k, opts, sms, ctas_per_sm);
    if (!*out) return KILN_STATUS_NO_MEMORY;
    (*out)->host_only = 1;
    return KILN_STATUS_OK;
}

const int *kiln__plan_last_schedule(const kiln_plan *pl, int *items_off, int *reqs_off,
                                    int *tasks_off)
{
    *items_off = pl->lay.items_off;
    *reqs_off = pl->lay.reqs_off;
    *tasks_off = pl->lay.tasks_off;
    return pl->host;
}

void kiln__plan_last_layout(const kiln_plan *pl, kiln__plan_layout *out)
{
    const layout *L = &pl->lay;
    *out = (kiln__plan_layout){.items_off = L->items_off,
                               .reqs_off = L->reqs_off,
                               .tasks_off = L->tasks_off,
                               .counters_off = L->counters_off,
                               .task_bound = (int)L->tasks,
                               .scopes = pl->k->cfg.fused_merge ? pl->hpi : 0,
                               .int_bytes = L->int_bytes,
                               .uploaded = pl->uploaded};
}

void kiln_plan_destroy(kiln_plan *pl)
{
    if (!pl) return;
    const kiln__cu *cu = pl->k->ctx->cu;
    if (pl->host_only) {
        free(pl->host);
    } else if (cu) {
        kiln__err e;
        if (!kiln__ctx_bind(pl->k->ctx, &e)) {
            for (int i = 0; i < HOST_RING; i++) {
                if (pl->copy_pending[i]) cu->cuEventSynchronize(pl->copied[i]);
                cu->cuEventDestroy(pl->copied[i]);
            }
            if (pl->host) cu->cuMemFreeHost(pl->host);
        }
    }
    free(pl->tile_keys);
    free(pl->order);
    free(pl);
}

/* The layout with every split of a plan of `batch` requests and `total_qo` rows (graph mode:
 * of the plan's bounds, if larger), for the workspace size queries. */
static kiln_status full_layout(const kiln_plan *pl, int batch, int total_qo, layout *L)
{
    kiln__err e = {{0}};
    if (batch < 0 || total_qo < 0) {
        kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                   "workspace size %s: batch=%d and total_qo=%d must be >= 0", pl->k->spec, batch,
                   total_qo);
        return kiln__ctx_error(pl->k->ctx, KILN_STATUS_INVALID_ARGUMENT, &e);
    }
    if (pl->o.max_batch > 0) { /* graph mode: the layout of the bounds */
        if (batch < pl->o.max_batch) batch = pl->o.max_batch;
        if (!pl->decode && total_qo < pl->o.max_qo_tokens) total_qo = pl->o.max_qo_tokens;
    }
    if (layout_for(pl, batch, pl->decode ? batch : total_qo, -1, L)) {
        kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                   "workspace size %s: batch=%d total_qo=%d is too large", pl->k->spec, batch,
                   total_qo);
        return kiln__ctx_error(pl->k->ctx, KILN_STATUS_INVALID_ARGUMENT, &e);
    }
    return KILN_STATUS_OK;
}

kiln_status kiln_plan_workspace_size(const kiln_plan *pl, int batch, int total_qo, size_t *bytes)
{
    if (!bytes || !pl)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT,
                          "workspace size: NULL argument");
    *bytes = 0;
    layout L;
    kiln_status st = full_layout(pl, batch, total_qo, &L);
    if (!st) *bytes = L.bytes;
    return st;
}

kiln_status kiln_plan_workspace_sizes(const kiln_plan *pl, int batch, int total_qo,
                                      size_t *schedule_bytes, size_t *scratch_bytes)
{
    if (!schedule_bytes || !scratch_bytes || !pl)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT,
                          "workspace sizes: NULL argument");
    *schedule_bytes = *scratch_bytes = 0;
    layout L;
    kiln_status st = full_layout(pl, batch, total_qo, &L);
    if (!st) {
        *schedule_bytes = L.int_bytes;
        *scratch_bytes = L.part_bytes;
    }
    return st;
}

kiln_status kiln_plan_describe(const kiln_plan *pl, kiln_plan_info *out)
{
    if (!pl || !out)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT,
                          "plan describe: NULL argument");
    if (!pl->scheduled)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT,
                          "plan describe: nothing scheduled yet (kiln_plan_schedule)");
    *out = pl->info;
    return KILN_STATUS_OK;
}

/* Keys query tile m of a request can see (causal: up to its last row's diagonal). */
static int tile_keys(const kiln_plan *pl, int qo, int kv, int m)
{
    if (pl->decode || pl->k->v.mask != KILN_MASK_CAUSAL) return kv;
    int64_t hi = (int64_t)(m + 1) * pl->rows + (kv - qo);
    if (hi > kv) hi = kv;
    return hi < 0 ? 0 : (int)hi;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Estimated makespan (in keys) of cutting every tile into chunks of c keys (c = 0: no cut):
 * the longest of the longest item, the work per slot rounded to whole waves and the work per
 * bandwidth share (bw_slots), plus a fixed cost per CTA wave and per split tile, plus the merge
 * of the most-cut tile. Sets *splits to the split items it needs. With units (each tile's keys
 * in key tiles, ceil(keys / gran)) c must be gran << shift, and a tile's chunk count comes by a
 * shift: ceil(keys / c) = ceil(ceil(keys / gran) / 2^shift), the same count without a divide
 * (the planner tries every such c for every tile). */
static double estimate(const kiln_plan *pl, int ntiles, int64_t c, const int *units, int shift,
                       int64_t *items_out, int64_t *splits)
{
    int64_t items = 0, split = 0, total = 0, longest = 0, pieces = 1;
    const int64_t round = ((int64_t)1 << shift) - 1;
    for (int t = 0; t < ntiles; t++) {
        const int64_t keys = pl->tile_keys[t];
        const int64_t n = c <= 0 || keys <= c ? 1
                          : units             ? ((int64_t)units[t] + round) >> shift
                                              : ceil_div(keys, c);
        items += n;
        if (n > 1) split += n;
        if (n > pieces) pieces = n;
        total += keys + (n > 1 ? SPLIT_OVERHEAD_KEYS : 0);
        const int64_t longest_here = n > 1 ? c : keys;
        if (longest_here > longest) longest = longest_here;
    }
    *items_out = items;
    *splits = split;
    const double ctas = (double)items * pl->hpi;
    const double waves = ceil(ctas / pl->slots);
    const double per_cta = ctas > 0 ? (double)total * pl->hpi / ctas : 0;
    double est = waves * per_cta;
    const double shared = (double)total * pl->hpi / pl->bw_slots;
    if (est < shared) est = shared;
    if (est < (double)longest) est = (double)longest;
    /* the merge runs after the main kernel: its longest task, by its pieces */
    return est + waves * CTA_OVERHEAD_KEYS +
           (pieces > 1 ? (double)pieces * MERGE_KEYS_PER_PIECE : 0);
}

static kiln_status check_shape(const kiln_plan *pl, const kiln_batch_shape *s, kiln__err *e)
{
    const char *spec = pl->k->spec;
    if (!s) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "plan %s: NULL shape", spec);
    const int B = s->batch, paged = pl->k->v.kv == KILN_KV_PAGED;
    if (B < 0) return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "plan %s: batch=%d < 0", spec, B);
    if (pl->o.max_batch > 0 && B > pl->o.max_batch)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "plan %s: batch=%d exceeds the plan's max_batch=%d (graph mode)", spec, B,
                          pl->o.max_batch);
    if (B == 0) return KILN_STATUS_OK;
    if (!s->kv_indptr || (!pl->decode && !s->qo_indptr) || (paged && !s->kv_last_page_len))
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "plan %s: kv_indptr%s%s must be given",
                          spec, pl->decode ? "" : ", qo_indptr", paged ? ", kv_last_page_len" : "");
    if (s->kv_indptr[0] != 0 || (!pl->decode && s->qo_indptr[0] != 0))
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "plan %s: kv_indptr[0]=%d%s must be 0",
                          spec, s->kv_indptr[0], pl->decode ? "" : " and qo_indptr[0]");
    for (int b = 0; b < B; b++) {
        if (s->kv_indptr[b + 1] < s->kv_indptr[b])
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "plan %s: request %d: kv_indptr decreases (%d then %d)", spec, b,
                              s->kv_indptr[b], s->kv_indptr[b + 1]);
        if (!pl->decode && s->qo_indptr[b + 1] < s->qo_indptr[b])
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "plan %s: request %d: qo_indptr decreases (%d then %d)", spec, b,
                              s->qo_indptr[b], s->qo_indptr[b + 1]);
        if (pl->k->v.q_tokens && s->qo_indptr[b + 1] - s->qo_indptr[b] > pl->k->v.q_tokens)
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "plan %s: request %d has %d query tokens, more than the kernel's "
                              "q_tokens=%d (a kernel with a larger q_tokens, or 0, takes it)",
                              spec, b, s->qo_indptr[b + 1] - s->qo_indptr[b], pl->k->v.q_tokens);
        if (paged && s->kv_indptr[b + 1] > s->kv_indptr[b] &&
            (s->kv_last_page_len[b] < 1 || s->kv_last_page_len[b] > pl->o.page_size))
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "plan %s: request %d: kv_last_page_len=%d must be in 1..page_size=%d",
                              spec, b, s->kv_last_page_len[b], pl->o.page_size);
        if (paged && (int64_t)(s->kv_indptr[b + 1] - s->kv_indptr[b]) * pl->o.page_size > INT32_MAX)
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "plan %s: request %d: more than 2^31 keys", spec, b);
    }
    if (!pl->decode && pl->o.max_batch > 0 && s->qo_indptr[B] > pl->o.max_qo_tokens)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "plan %s: %d query rows exceed the plan's max_qo_tokens=%d (graph mode)",
                          spec, s->qo_indptr[B], pl->o.max_qo_tokens);
    return KILN_STATUS_OK;
}

static int req_kv_len(const kiln_plan *pl, const kiln_batch_shape *s, int b)
{
    const int n = s->kv_indptr[b + 1] - s->kv_indptr[b];
    if (pl->k->v.kv != KILN_KV_PAGED) return n;
    return n ? (n - 1) * pl->o.page_size + s->kv_last_page_len[b] : 0;
}

/* Whether layout t fits the buffers. */
static int fits(const layout *t, const buffers *b)
{
    if (b->has_scratch) return t->int_bytes <= b->ws_bytes && t->part_bytes <= b->scratch_bytes;
    return t->bytes <= b->ws_bytes;
}

/* Phase 2, the workspace: its layout for this batch (graph mode: for the plan's bounds, so the
 * offsets a captured run reads never move), and the caller's buffers checked against it. */
static kiln_status lay_out(const kiln_plan *pl, int B, int64_t total_qo, const buffers *b,
                           layout *L, kiln__err *e)
{
    int lb = B;
    int64_t lq = total_qo;
    if (pl->o.max_batch > 0) {
        lb = pl->o.max_batch;
        if (!pl->decode) lq = pl->o.max_qo_tokens;
    }
    if (pl->decode) lq = lb;
    if (layout_for(pl, lb, lq, -1, L))
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "plan %s: batch too large", pl->k->spec);
    /* Buffers smaller than kiln_plan_workspace_size(s) hold fewer partial slots: the most that
     * fit (the split then cuts fewer chunks; the results are the same). Below the layout with
     * none, the schedule itself does not fit. A host-only plan (tests) lays out for the sizes
     * when they are given (with no scratch buffer: when workspace_bytes is not 0). */
    const layout full = *L;
    layout none;
    layout_for(pl, lb, lq, 0, &none);
    const int sized = b->has_scratch || b->ws_bytes > 0;
    if (sized && !fits(&full, b) && fits(&none, b)) {
        int64_t lo = 0, hi = full.slots;
        layout t;
        while (lo < hi) { /* the largest slot count whose layout fits */
            const int64_t mid = lo + (hi - lo + 1) / 2;
            if (!layout_for(pl, lb, lq, mid, &t) && fits(&t, b)) lo = mid;
            else hi = mid - 1;
        }
        layout_for(pl, lb, lq, lo, L);
        KILN__ASSERT(fits(L, b));
    }
    if (pl->host_only) return KILN_STATUS_OK;
    if (!b->has_scratch && (!b->ws || b->ws_bytes < L->bytes || b->ws % 256))
        return kiln__fail(e, KILN_STATUS_WORKSPACE,
                          "plan %s: the workspace holds %zu bytes at 0x%llx; this batch needs at "
                          "least %zu (no split; %zu for every split kiln_plan_workspace_size "
                          "allows), 256-byte aligned",
                          pl->k->spec, b->ws ? b->ws_bytes : 0, (unsigned long long)b->ws,
                          none.bytes, full.bytes);
    if (b->has_scratch && (!b->ws || b->ws_bytes < L->int_bytes || b->ws % 256 ||
                           (L->part_bytes > 0 && (!b->scratch || b->scratch % 256))))
        return kiln__fail(e, KILN_STATUS_WORKSPACE,
                          "plan %s: the schedule workspace holds %zu bytes at 0x%llx and the "
                          "scratch %zu at 0x%llx; this batch needs a workspace of at least %zu "
                          "(%zu with every split) and scratch of up to %zu for its splits (none "
                          "without), each 256-byte aligned",
                          pl->k->spec, b->ws ? b->ws_bytes : 0, (unsigned long long)b->ws,
                          b->scratch ? b->scratch_bytes : 0, (unsigned long long)b->scratch,
                          none.int_bytes, full.int_bytes, full.part_bytes);
    return KILN_STATUS_OK;
}

/* Phase 3a, the query tiles: (request, tile) of each into the scratch arrays tile_b, tile_m
 * and the keys it sees into tile_keys; *max_keys the most any tile sees. */
static kiln_status list_tiles(kiln_plan *pl, const kiln_batch_shape *s, int64_t total_qo,
                              int *ntiles_out, int *max_keys_out, kiln__err *e)
{
    const int B = s->batch;
    /* query tiles and the keys each sees */
    const int64_t ntiles64 = tile_bound(pl, B, total_qo);
    /* allocated by the first batch, even one with no tile: later phases index the arrays */
    if ((size_t)ntiles64 > pl->scratch_cap || !pl->order) {
        size_t cap = (size_t)ntiles64 + 64;
        int *a = realloc(pl->tile_keys, cap * sizeof *a),
            *o = a ? realloc(pl->order, cap * 4 * sizeof *o) : NULL;
        if (a) pl->tile_keys = a;
        if (o) pl->order = o;
        if (!a || !o) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "plan: out of memory");
        pl->scratch_cap = cap;
    }
    int ntiles = 0;
    int *tile_b = pl->order, *tile_m = pl->order + pl->scratch_cap;
    int max_keys = 0;
    for (int b = 0; b < B; b++) {
        const int qo = pl->decode ? 1 : s->qo_indptr[b + 1] - s->qo_indptr[b],
                  kv = req_kv_len(pl, s, b);
        const int nt = pl->decode ? 1 : (int)ceil_div(qo, pl->rows);
        for (int m = 0; m < nt; m++) {
            tile_b[ntiles] = b;
            tile_m[ntiles] = m;
            const int keys = tile_keys(pl, qo, kv, m);
            KILN__ASSERT(0 <= keys && keys <= kv); /* so every item's keys lie in its request */
            pl->tile_keys[ntiles++] = keys;
            if (keys > max_keys) max_keys = keys;
        }
    }
    /* the bound that sized the scratch arrays and the workspace's items */
    KILN__ASSERT_LE(ntiles, ntiles64);
    *ntiles_out = ntiles;
    *max_keys_out = max_keys;
    return KILN_STATUS_OK;
}

/* Phase 3b, the split: the chunk of keys every tile longer than it is cut into. */
static kiln_status choose_chunk(const kiln_plan *pl, int ntiles, int max_keys, const layout *L,
                                int64_t *chunk_out, kiln__err *e)
{
    /* the chunk: fixed (decode), none, or the best estimate over tile-aligned powers of two;
     * prefill with fixed_split never splits (an unsplit query tile runs its keys in one fixed
     * order whatever the batch, so batch invariance needs no chunks) */
    int64_t chunk = 0;
    if (pl->o.fixed_split > 0 && pl->decode) {
        int64_t items, splits;
        chunk = pl->o.fixed_split;
        estimate(pl, ntiles, chunk, NULL, 0, &items, &splits);
        if (splits > L->slots)
            return kiln__fail(
                e, KILN_STATUS_WORKSPACE,
                "plan %s: fixed_split=%lld cuts this batch into %lld split items, more than the "
                "%lld the workspace was sized for; set max_total_kv",
                pl->k->spec, (long long)chunk, (long long)splits, (long long)L->slots);
    } else if (pl->o.fixed_split <= 0 && !pl->o.no_split) {
        int64_t it, sp;
        double best = estimate(pl, ntiles, 0, NULL, 0, &it, &sp);
        /* each tile's keys in key tiles, once, into write_items' scratch (not yet in use) */
        int *units = pl->order + 2 * pl->scratch_cap;
        const unsigned g = (unsigned)pl->gran;
        if ((g & (g - 1)) == 0) { /* a power of two (all but the 80-, 176- and 192-key tiles) */
            const int lg = __builtin_ctz(g);
            for (int t = 0; t < ntiles; t++)
                units[t] = (int)(((unsigned)pl->tile_keys[t] + g - 1) >> lg);
        } else {
            for (int t = 0; t < ntiles; t++)
                units[t] = (int)(((unsigned)pl->tile_keys[t] + g - 1) / g);
        }
        int shift = 0;
        for (int64_t c = pl->gran; c < max_keys; c *= 2, shift++) {
            const double est = estimate(pl, ntiles, c, units, shift, &it, &sp);
            if (sp <= L->slots && est < best * 0.97) {
                best = est;
                chunk = c;
            }
        }
    }
    *chunk_out = chunk;
    return KILN_STATUS_OK;
}

/* Phase 4a, the staging buffer: the host buffer the schedule is written into (host-only
 * plans: plain heap; else the next pinned buffer of the ring, once the copy out of it has
 * run), as *w, and the ring slot it is. */
static kiln_status stage(kiln_plan *pl, const layout *L, int **w_out, int *slot_out, kiln__err *e)
{
    kiln_status st;
    const size_t ints = L->int_bytes / sizeof(int);
    const int slot = (pl->ring + 1) % HOST_RING;
    if (pl->host_only && ints > pl->host_ints) {
        free(pl->host);
        pl->host = calloc(ints, sizeof(int));
        pl->host_ints = pl->host ? ints : 0;
        if (!pl->host) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "plan: out of memory");
    }
    if (!pl->host_only) {
        if ((st = kiln__ctx_bind(pl->k->ctx, e))) return st;
        const kiln__cu *cu = pl->k->ctx->cu;
        /* growing: every buffer must be free; otherwise only the one reused now */
        for (int i = 0; i < HOST_RING; i++) {
            if (!pl->copy_pending[i] || (i != slot && ints <= pl->host_ints)) continue;
            const CUresult r = cu->cuEventSynchronize(pl->copied[i]);
            pl->copy_pending[i] = 0;
            if (r != CUDA_SUCCESS) return kiln__cu_fail(e, r, "plan %s: earlier copy", pl->k->spec);
        }
        if (ints > pl->host_ints) {
            if (pl->host) cu->cuMemFreeHost(pl->host);
            pl->host = NULL;
            pl->host_ints = 0;
            void *h = NULL;
            const CUresult r = cu->cuMemHostAlloc(&h, ints * sizeof(int) * HOST_RING, 0);
            if (r != CUDA_SUCCESS)
                return kiln__cu_fail(e, r, "plan %s: pinned buffer", pl->k->spec);
            pl->host = h;
            pl->host_ints = ints;
        }
    }
    KILN__ASSERT_LE(ints, pl->host_ints); /* the int region fits the staging buffer */
    *w_out = pl->host + (pl->host_only ? 0 : (size_t)slot * pl->host_ints);
    *slot_out = slot;
    return KILN_STATUS_OK;
}

/* Phase 4b, the request records (REQ_INTS each, at reqs_off); *kv_tokens: their keys in all. */
static kiln_status write_requests(const kiln_plan *pl, const kiln_batch_shape *s, const layout *L,
                                  int *w, int64_t *kv_tokens, kiln__err *e)
{
    const int B = s->batch;
    /* the records end before the tasks: B is within the bound the layout was made for */
    KILN__ASSERT_LE(L->reqs_off + (int64_t)B * REQ_INTS, L->tasks_off);
    kiln_work_req *req = (kiln_work_req *)(w + L->reqs_off);
    /* requests; mask data of request b starts after the earlier requests' (bits: their
     * L_Q x L_KV matrices; bsr: their block rows) */
    int64_t bit0 = 0, row0 = 0, keys = 0;
    const int R = pl->o.bsr_r > 0 ? pl->o.bsr_r : 1;
    for (int b = 0; b < B; b++) {
        kiln_work_req *q = req + b;
        const int qo = pl->decode ? 1 : s->qo_indptr[b + 1] - s->qo_indptr[b],
                  kv = req_kv_len(pl, s, b);
        q->q_start = pl->decode ? b : s->qo_indptr[b];
        q->qo_len = qo;
        q->kv_start = s->kv_indptr[b];
        q->kv_len = kv;
        q->mask_bit0_lo = (int)(uint32_t)(uint64_t)bit0;
        q->mask_bit0_hi = (int)(uint32_t)((uint64_t)bit0 >> 32);
        q->bsr_row0 = (int)row0;
        q->pad = 0;
        bit0 += (int64_t)qo * kv;
        keys += kv;
        row0 += R == 1 ? qo : ceil_div(qo, R); /* no division on the plan's path without bsr */
    }
    if (row0 > INT32_MAX)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "plan %s: %lld bsr block rows exceed 2^31", pl->k->spec, (long long)row0);
    *kv_tokens = keys;
    return KILN_STATUS_OK;
}

/* The order of the work items: sizes by eighths of an octave (sizes under 16 exactly), so that
 * the items of a causal prefill, (m + 1) tiles for query tile m, go out nearly longest first
 * (a list schedule, and the persistent grid's static round robin, stay balanced); bit lengths
 * alone put tiles 16 .. 31 of a 4096-row request in one bucket in their own order. Monotone:
 * a larger size never has a smaller bucket. */
enum { SIZE_BUCKETS = 16 + 28 * 8 };
static int size_bucket(unsigned size)
{
    if (size < 16) return (int)size;
    const int bits = 32 - __builtin_clz(size); /* 5 .. 32 */
    return 16 + (bits - 5) * 8 + (int)((size >> (bits - 4)) & 7);
}

/* What the items and tasks written add up to. */
typedef struct sched_counts {
    int items, tasks, slots;
    int task_slots; /* the most slots of one task */
    int64_t total_keys, longest;
} sched_counts;

/* Phase 4c, the work items (ITEM_INTS each, at items_off) heaviest first, the merge tasks
 * (TASK_INTS each, at tasks_off) of the split tiles, each split item naming its task, the
 * fused merge's counters of those tasks at 0, and the header. */
static void write_items(kiln_plan *pl, int ntiles, int64_t chunk, const layout *L, int B, int *w,
                        sched_counts *out)
{
    /* the schedule, heaviest items first */
    kiln_work_item *item = (kiln_work_item *)(w + L->items_off);
    const kiln_work_req *req = (const kiln_work_req *)(w + L->reqs_off); /* written before */
    kiln_merge_task *task = (kiln_merge_task *)(w + L->tasks_off);
    const int *tile_b = pl->order, *tile_m = pl->order + pl->scratch_cap;
    int nitems = 0, ntasks = 0, nslot = 0, task_slots = 0;
    int64_t total_keys = 0, longest = 0;
    /* counting sort of the tiles by their items' keys, longest first */
    int *tile_bucket = pl->order + 2 * pl->scratch_cap, *sorted = pl->order + 3 * pl->scratch_cap;
    int count[SIZE_BUCKETS] = {0};
    for (int t = 0; t < ntiles; t++) {
        const int keys = pl->tile_keys[t];
        const int64_t size = chunk > 0 && keys > chunk ? chunk : keys;
        tile_bucket[t] = size_bucket((unsigned)size);
        count[tile_bucket[t]]++;
    }
    for (int b = SIZE_BUCKETS - 1, at = 0; b >= 0; b--) {
        const int n = count[b];
        count[b] = at;
        at += n;
    }
    for (int t = 0; t < ntiles; t++) sorted[count[tile_bucket[t]]++] = t;
    for (int x = 0; x < ntiles; x++) {
        const int t = sorted[x];
        const int keys = pl->tile_keys[t];
        const int64_t n = chunk > 0 && keys > chunk ? ceil_div(keys, chunk) : 1;
        const int64_t size = n > 1 ? chunk : keys;
        const int slot0 = n > 1 ? nslot : -1;
        /* the tile's records stay in bounds: n items, and when split, chunks
         * [c * chunk, min((c + 1) * chunk, keys)) that are none of them empty (so
         * 0 <= kv_lo < kv_hi <= keys <= its request's kv_len), slots slot0 .. slot0 + n - 1 of
         * the workspace's, and one merge task */
        KILN__ASSERT_LE(nitems + n, L->items);
        KILN__ASSERT(n == 1 || ((n - 1) * chunk < keys && keys <= n * chunk));
        KILN__ASSERT(n == 1 || (slot0 >= 0 && slot0 + n <= L->slots && ntasks < L->tasks));
        for (int64_t c = 0; c < n; c++) {
            kiln_work_item *it = item + nitems;
            it->b = tile_b[t];
            it->m = tile_m[t];
            it->kv_lo = n > 1 ? (int)(c * chunk) : 0;
            it->kv_hi = n > 1 ? (int)((c + 1) * chunk < keys ? (c + 1) * chunk : keys) : keys;
            it->slot = n > 1 ? slot0 + (int)c : -1;
            it->task = n > 1 ? ntasks : -1;
            const kiln_work_req *q = req + it->b;
            it->q_start = q->q_start;
            it->kv_start = q->kv_start;
            it->qo_len = q->qo_len;
            it->kv_len = q->kv_len;
            it->pad[0] = it->pad[1] = 0;
            nitems++;
        }
        if (n > 1) {
            task[ntasks].b = tile_b[t];
            task[ntasks].m = tile_m[t];
            task[ntasks].slot0 = slot0;
            task[ntasks].nslots = (int)n;
            ntasks++;
            nslot += (int)n;
            if (n > task_slots) task_slots = (int)n;
        }
        total_keys += keys;
        if (size > longest) longest = size;
    }
    /* the counters the run's tasks use start from 0 (the staging buffer holds an older
     * schedule's words); the kernel puts each back to 0 after its task's merge */
    if (pl->k->cfg.fused_merge) {
        KILN__ASSERT_LE((int64_t)ntasks * pl->hpi, L->counters);
        memset(w + L->counters_off, 0, (size_t)ntasks * (size_t)pl->hpi * sizeof(int));
    }
    kiln_work_header *hdr = (kiln_work_header *)w;
    hdr->items = nitems;
    hdr->tasks = ntasks;
    hdr->reqs = B;
    hdr->next_job = 0;
    *out = (sched_counts){nitems, ntasks, nslot, task_slots, total_keys, longest};
}

/* Phase 5, the upload: one copy of the int region actually used (header .. last task, or with
 * a fused merge and tasks, .. the last task's counters: the unused task records between go
 * too) into the workspace, and the event the ring waits on before it reuses the buffer. */
static kiln_status upload(kiln_plan *pl, const layout *L, const int *w, int ntasks, int slot,
                          kiln_devptr workspace, void *stream, kiln__err *e)
{
    const int64_t end = pl->k->cfg.fused_merge && ntasks > 0
                            ? L->counters_off + (int64_t)ntasks * pl->hpi
                            : L->tasks_off + (int64_t)ntasks * TASK_INTS;
    const size_t used = (size_t)end * sizeof(int);
    KILN__ASSERT_LE(used, L->int_bytes); /* inside the int region the workspace was sized for */
    pl->uploaded = used;
    if (!pl->host_only) {
        const kiln__cu *cu = pl->k->ctx->cu;
        CUresult r = cu->cuMemcpyHtoDAsync(workspace, w, used, (CUstream)stream);
        if (r == CUDA_SUCCESS) r = cu->cuEventRecord(pl->copied[slot], (CUstream)stream);
        if (r != CUDA_SUCCESS)
            return kiln__cu_fail(e, r, "plan %s: copy the schedule", pl->k->spec);
        pl->copy_pending[slot] = 1;
        pl->ring = slot;
    }
    return KILN_STATUS_OK;
}

/* What kiln_plan_run needs of this schedule, and what kiln_plan_describe reports. */
static void keep(kiln_plan *pl, const layout *L, int B, const sched_counts *n, int64_t chunk,
                 const buffers *b)
{
    pl->lay = *L;
    pl->ws = b->ws;
    pl->parts = b->has_scratch ? b->scratch : b->ws + L->int_bytes;
    pl->ws_need = b->has_scratch ? L->int_bytes : L->bytes;
    if (pl->o.max_batch > 0) {
        pl->grid = (int)L->items;
        pl->tasks_grid = (int)L->tasks;
    } else {
        pl->grid = n->items;
        pl->tasks_grid = n->tasks;
    }
    /* a decode task of more slots than kiln_merge loads in one round trip: kiln_merge_wide */
    pl->wide_merge = pl->decode && n->task_slots > KILN_MERGE_BATCH;
    pl->info = (kiln_plan_info){.batch = B,
                                .items = n->items,
                                .grid = pl->grid,
                                .kv_chunk = (int)chunk * (n->tasks > 0),
                                .split_items = n->slots,
                                .merge_tasks = n->tasks,
                                .max_item_keys = n->longest,
                                .total_keys = n->total_keys};
    pl->scheduled = 1;
}

/* check the shape → lay out the workspace → list the query tiles → choose the split → stage →
 * write requests, items and tasks → upload → keep. */
static kiln_status schedule(kiln_plan *pl, const kiln_batch_shape *s, const buffers *b,
                            void *stream)
{
    kiln__err e = {{0}};
    if (!pl) return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT, "plan: NULL plan");
    kiln_status st = check_shape(pl, s, &e);
    if (st) return plan_fail(pl, st, &e);
    const int B = s->batch;
    const int64_t total_qo = pl->decode ? B : (B ? s->qo_indptr[B] : 0);
    layout L;
    int ntiles = 0, max_keys = 0, slot = 0, *w = NULL;
    int64_t chunk = 0;
    st = lay_out(pl, B, total_qo, b, &L, &e);
    if (!st) st = list_tiles(pl, s, total_qo, &ntiles, &max_keys, &e);
    if (!st) st = choose_chunk(pl, ntiles, max_keys, &L, &chunk, &e);
    if (!st) st = stage(pl, &L, &w, &slot, &e);
    int64_t kv_tokens = 0;
    if (!st) st = write_requests(pl, s, &L, w, &kv_tokens, &e);
    if (st) return plan_fail(pl, st, &e);
    sched_counts n;
    write_items(pl, ntiles, chunk, &L, B, w, &n);
    /* counts against the bounds that sized the workspace and the grid */
    KILN__ASSERT_LE(n.slots, L.slots);
    KILN__ASSERT_LE(n.tasks, L.tasks);
    KILN__ASSERT_LE(n.items, L.items);
    if ((st = upload(pl, &L, w, n.tasks, slot, b->ws, stream, &e))) return plan_fail(pl, st, &e);
    keep(pl, &L, B, &n, chunk, b);
    /* the persistent wgmma grid's sections of heads, from every request's keys */
    pl->job_heads = kiln__job_heads(pl->k, kv_tokens, pl->H);
    return KILN_STATUS_OK;
}

kiln_status kiln_plan_schedule(kiln_plan *pl, const kiln_batch_shape *s, kiln_devptr workspace,
                               size_t workspace_bytes, void *stream)
{
    const buffers b = {.ws = workspace, .ws_bytes = workspace_bytes};
    return schedule(pl, s, &b, stream);
}

kiln_status kiln_plan_schedule_scratch(kiln_plan *pl, const kiln_batch_shape *s,
                                       kiln_devptr workspace, size_t workspace_bytes,
                                       kiln_devptr scratch, size_t scratch_bytes, void *stream)
{
    const buffers b = {.ws = workspace,
                       .ws_bytes = workspace_bytes,
                       .scratch = scratch,
                       .scratch_bytes = scratch_bytes,
                       .has_scratch = 1};
    return schedule(pl, s, &b, stream);
}

kiln_status kiln_plan_run(kiln_plan *pl, const kiln_batch_args *a, void *stream)
{
    kiln__err e = {{0}};
    if (!pl || !a)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT, "run: NULL plan or args");
    kiln_kernel *k = pl->k;
    if (!pl->scheduled)
        return plan_fail(pl,
                         kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                    "run %s: nothing scheduled yet (kiln_plan_schedule)", k->spec),
                         &e);
    if (a->workspace != pl->ws || a->workspace_bytes < pl->ws_need)
        return plan_fail(
            pl,
            kiln__fail(&e, KILN_STATUS_WORKSPACE,
                       "run %s: the workspace (0x%llx, %zu bytes) is not the one planned into "
                       "(0x%llx, %zu bytes needed)",
                       k->spec, (unsigned long long)a->workspace, a->workspace_bytes,
                       (unsigned long long)pl->ws, pl->ws_need),
            &e);
    /* A schedule of no keys at all (every request empty) reads no page id, so a caller with no
     * pages may pass none; the kernel still runs, writing o = 0 and lse = -inf. Not in graph
     * mode, where a replay serves later schedules that have keys. */
    kiln_batch_args no_pages;
    if (k->v.kv == KILN_KV_PAGED && !a->kv_indices && pl->o.max_batch == 0 &&
        pl->info.total_keys == 0) {
        no_pages = *a;
        no_pages.kv_indices = pl->ws;
        a = &no_pages;
    }
    kiln_launch_params p;
    kiln_status st =
        kiln__batch_prepare(k, a, pl->H, pl->o.page_size, pl->o.bsr_r, pl->o.bsr_c, &p, &e);
    if (st) return plan_fail(pl, st, &e);
    p.work = pl->ws;
    p.items_off = pl->lay.items_off;
    p.reqs_off = pl->lay.reqs_off;
    p.tasks_off = pl->lay.tasks_off;
    p.counters_off = pl->lay.counters_off;
    p.slot_rows = pl->rows;
    /* from this schedule's keys; a captured run keeps it for later schedules (any value is
     * correct: it orders the jobs only) */
    p.job_heads = pl->job_heads;
    p.partial_lse = pl->parts + pl->lay.plse_off;
    p.partial_o = pl->parts + pl->lay.po_off;
    if (pl->grid == 0) return KILN_STATUS_OK; /* an empty batch (eager mode) */

    const kiln__cu *cu = k->ctx->cu;
    kiln_tma_maps maps;
    void *args[] = {&p, &maps};
    /* the maps' rows: any bound past the batch's (whole tiles inside a request are all the
     * kernel copies by TMA), so that one captured run serves every later schedule */
    if (kiln__config_tma_maps(&k->cfg) &&
        (st = kiln__tma_maps(k, &p, "run", INT32_MAX, INT32_MAX, &maps, &e)))
        return plan_fail(pl, st, &e);
    CUresult r;
    if (pl->decode && !k->cfg.pack) {
        const unsigned hk = (unsigned)(pl->H / k->v.group), gz = (unsigned)(k->v.group / k->cfg.gb);
        r = cu->cuLaunchKernel(k->fn_main, (unsigned)pl->grid, hk, gz, (unsigned)k->cfg.threads, 1,
                               1, (unsigned)k->cfg.smem_bytes, (CUstream)stream, args, NULL);
    } else if (pl->decode && k->cfg.persist) {
        /* the tensor-core decode's persistent grid (mma_decode_persist.cuh): CTA (x, hk) loops
         * over items x, x + gx, ... of whatever schedule the workspace holds */
        const unsigned hk = (unsigned)pl->hpi,
                       all = kiln__persistent_grid(k, (int64_t)pl->grid * pl->hpi);
        r = cu->cuLaunchKernel(k->fn_main, (all + hk - 1) / hk, hk, 1, (unsigned)k->cfg.threads, 1,
                               1, (unsigned)k->cfg.smem_bytes, (CUstream)stream, args, NULL);
    } else if (k->cfg.wgmma) {
        /* the items x H jobs of whatever schedule the workspace holds (graph mode: pl->grid
         * bounds the items of any later one; a CTA-per-job grid's padding returns at once) */
        unsigned gx;
        if ((st = kiln__wgmma_grid(k, (int64_t)pl->grid * pl->hpi, "run", &gx, &e)))
            return plan_fail(pl, st, &e);
        r = cu->cuLaunchKernel(k->fn_main, gx, 1, 1, (unsigned)k->cfg.threads, 1, 1,
                               (unsigned)k->cfg.smem_bytes, (CUstream)stream, args, NULL);
    } else {
        r = cu->cuLaunchKernel(k->fn_main, (unsigned)pl->grid, (unsigned)pl->hpi, 1,
                               (unsigned)k->cfg.threads, 1, 1, (unsigned)k->cfg.smem_bytes,
                               (CUstream)stream, args, NULL);
    }
    /* the merge kernel, unless the main kernel's split CTAs merged their tasks already */
    if (r == CUDA_SUCCESS && pl->tasks_grid > 0 && !pl->k->cfg.fused_merge)
        r = kiln__launch_merge(k, (unsigned)pl->tasks_grid, (unsigned)pl->H, pl->wide_merge,
                               (CUstream)stream, args);
    if (r != CUDA_SUCCESS)
        return plan_fail(pl, kiln__cu_fail(&e, r, "run %s: launch", k->spec), &e);
    return KILN_STATUS_OK;
}

/* ---- deprecated names (kiln.h): the same functions under their 0.1 names ------------------ */

kiln_status kiln_batch_plan(kiln_plan *pl, const kiln_batch_shape *s, kiln_devptr workspace,
                            size_t workspace_bytes, void *stream)
{
    return kiln_plan_schedule(pl, s, workspace, workspace_bytes, stream);
}

kiln_status kiln_batch_run(kiln_plan *pl, const kiln_batch_args *a, void *stream)
{
    return kiln_plan_run(pl, a, stream);
}
