/*
 * batch.c — plan / run for batch kernels (kv=ragged, kv=paged), and the softmax-state merges.
 *
 * kiln_batch_plan turns CPU copies of the index arrays into a schedule of work items (request,
 * query tile, key chunk): it picks the key chunk that minimises an estimate of the makespan
 * over the device's CTA slots, cuts each request's keys into such chunks, gives every item of
 * a split query tile a partial-state slot and the tile a merge task, orders items from the
 * heaviest down (the hardware dispatches CTAs in blockIdx order, so this is a list schedule),
 * and copies the schedule into the caller's workspace with one cuMemcpyHtoDAsync from a
 * pinned buffer. kiln_batch_run fills the parameter block and launches the main kernel and,
 * when anything may be split, the merge kernel: pure host arithmetic and two launches.
 *
 * Workspace (offsets fixed by the plan's bounds, so a graph-mode run keeps them): an int
 * region (kiln_work_header, kiln_work_item[], kiln_work_req[], kiln_merge_task[]: the contract
 * in templates/common/params.h), then the partial states: float lse [slots][H][rows], float o
 * [slots][H][rows][D].
 */
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
    /* pinned schedule buffers used in turn: a plan waits only when the copy out of the buffer
     * it reuses (HOST_RING plans ago) has not run yet */
    HOST_RING = 4,
};

struct kiln_plan {
    kiln_kernel *k;
    kiln_plan_opts o;
    int decode, H, hpi, rows, D, gran, slots;
    /* the last plan */
    kiln_plan_info info;
    int grid, tasks_grid;
    int items_off, reqs_off, tasks_off; /* int offsets */
    size_t int_bytes, plse_off, po_off, need_bytes;
    kiln_devptr ws;
    size_t ws_bytes;
    int planned;
    int host_only; /* tests: schedule into plain host memory, no device (kiln__plan_host) */
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

/* The bound on split items (partial slots) of a plan with `batch` requests. */
static int64_t split_bound(const kiln_plan *pl, int batch)
{
    if (pl->o.no_split || (pl->o.fixed_split > 0 && !pl->decode)) return 0;
    if (pl->o.fixed_split > 0 && pl->o.max_total_kv > 0)
        return pl->o.max_total_kv / pl->o.fixed_split + (int64_t)batch + 1;
    const int64_t waves = pl->decode ? 8 : 2;
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

typedef struct layout {
    int64_t items, tasks, slots;
    int items_off, reqs_off, tasks_off;
    size_t int_bytes, plse_off, po_off, bytes;
} layout;

static int round4(int64_t x) { return (int)((x + 3) / 4 * 4); }

static int layout_for(const kiln_plan *pl, int batch, int64_t total_qo, layout *L)
{
    const int64_t slots = split_bound(pl, batch);
    L->slots = slots;
    L->items = tile_bound(pl, batch, total_qo) + slots;
    L->tasks = slots;
    const int64_t ints = HEADER_INTS + L->items * ITEM_INTS + round4((int64_t)batch * REQ_INTS) +
                         L->tasks * TASK_INTS;
    if (ints > (int64_t)1 << 30) return -1;
    L->items_off = HEADER_INTS;
    L->reqs_off = (int)(L->items_off + L->items * ITEM_INTS);
    L->tasks_off = L->reqs_off + round4((int64_t)batch * REQ_INTS);
    L->int_bytes = (size_t)ints * sizeof(int);
    L->int_bytes = (L->int_bytes + 255) / 256 * 256;
    const size_t per_slot_lse = (size_t)pl->H * pl->rows * sizeof(float);
    L->plse_off = L->int_bytes;
    L->po_off = L->plse_off + ((size_t)slots * per_slot_lse + 255) / 256 * 256;
    L->bytes = L->po_off + (size_t)slots * per_slot_lse * pl->D;
    return 0;
}

/* A plan object with the kernel's geometry: CTAs per work item, rows per query tile, the key
 * granule of a split, and `slots` CTAs resident on the device at once. */
static kiln_plan *plan_new(kiln_kernel *k, const kiln_plan_opts *opts, int slots)
{
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
    if (pl->o.fixed_split > 0) /* chunks stay aligned to the kernel's key tiles */
        pl->o.fixed_split = (pl->o.fixed_split + pl->gran - 1) / pl->gran * pl->gran;
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
    kiln_plan *pl = plan_new(k, opts, sms * (k->ctas_per_sm > 0 ? k->ctas_per_sm : 1));
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

kiln_status kiln__plan_host(kiln_kernel *k, const kiln_plan_opts *opts, int sms, int ctas_per_sm,
                            kiln_plan **out)
{
    *out = NULL;
    kiln_status st = opts_check(k, opts, kiln__tls_err());
    if (st) return st;
    *out = plan_new(k, opts, sms * ctas_per_sm);
    if (!*out) return KILN_STATUS_NO_MEMORY;
    (*out)->host_only = 1;
    return KILN_STATUS_OK;
}

const int *kiln__plan_schedule(const kiln_plan *pl, int *items_off, int *reqs_off, int *tasks_off)
{
    *items_off = pl->items_off;
    *reqs_off = pl->reqs_off;
    *tasks_off = pl->tasks_off;
    return pl->host;
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

kiln_status kiln_plan_workspace_size(const kiln_plan *pl, int batch, int total_qo, size_t *bytes)
{
    if (!bytes || !pl)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT,
                          "workspace size: NULL argument");
    *bytes = 0;
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
    layout L;
    if (layout_for(pl, batch, pl->decode ? batch : total_qo, &L)) {
        kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                   "workspace size %s: batch=%d total_qo=%d is too large", pl->k->spec, batch,
                   total_qo);
        return kiln__ctx_error(pl->k->ctx, KILN_STATUS_INVALID_ARGUMENT, &e);
    }
    *bytes = L.bytes;
    return KILN_STATUS_OK;
}

kiln_status kiln_plan_describe(const kiln_plan *pl, kiln_plan_info *out)
{
    if (!pl || !out)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT,
                          "plan describe: NULL argument");
    if (!pl->planned)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT,
                          "plan describe: nothing planned yet");
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
 * the longer of the longest item and the work per slot rounded to whole waves, plus a fixed
 * cost per CTA wave and per split tile. Sets *splits to the split items it needs. */
static double estimate(const kiln_plan *pl, int ntiles, int64_t c, int64_t *items_out,
                       int64_t *splits)
{
    int64_t items = 0, split = 0, total = 0, longest = 0;
    for (int t = 0; t < ntiles; t++) {
        const int64_t keys = pl->tile_keys[t];
        const int64_t n = c > 0 && keys > c ? ceil_div(keys, c) : 1;
        items += n;
        if (n > 1) split += n;
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
    if (est < (double)longest) est = (double)longest;
    return est + waves * CTA_OVERHEAD_KEYS;
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

kiln_status kiln_batch_plan(kiln_plan *pl, const kiln_batch_shape *s, kiln_devptr workspace,
                            size_t workspace_bytes, void *stream)
{
    kiln__err e = {{0}};
    if (!pl) return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT, "plan: NULL plan");
    kiln_status st = check_shape(pl, s, &e);
    if (st) return plan_fail(pl, st, &e);
    const int B = s->batch;
    const int64_t total_qo = pl->decode ? B : (B ? s->qo_indptr[B] : 0);
    int lb = B;
    int64_t lq = total_qo;
    if (pl->o.max_batch > 0) {
        lb = pl->o.max_batch;
        if (!pl->decode) lq = pl->o.max_qo_tokens;
    }
    layout L;
    if (layout_for(pl, lb, pl->decode ? lb : lq, &L))
        return plan_fail(pl,
                         kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT, "plan %s: batch too large",
                                    pl->k->spec),
                         &e);
    if (!pl->host_only && (!workspace || workspace_bytes < L.bytes || workspace % 256))
        return plan_fail(
            pl,
            kiln__fail(&e, KILN_STATUS_WORKSPACE,
                       "plan %s: the workspace holds %zu bytes at 0x%llx; this batch needs %zu, "
                       "256-byte aligned (kiln_plan_workspace_size)",
                       pl->k->spec, workspace ? workspace_bytes : 0, (unsigned long long)workspace,
                       L.bytes),
            &e);

    /* query tiles and the keys each sees */
    const int64_t ntiles64 = tile_bound(pl, B, total_qo);
    if ((size_t)ntiles64 > pl->scratch_cap) {
        size_t cap = (size_t)ntiles64 + 64;
        int *a = realloc(pl->tile_keys, cap * sizeof *a),
            *o = a ? realloc(pl->order, cap * 4 * sizeof *o) : NULL;
        if (a) pl->tile_keys = a;
        if (o) pl->order = o;
        if (!a || !o)
            return plan_fail(pl, kiln__fail(&e, KILN_STATUS_NO_MEMORY, "plan: out of memory"), &e);
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
            pl->tile_keys[ntiles++] = keys;
            if (keys > max_keys) max_keys = keys;
        }
    }

    /* the chunk: fixed (decode), none, or the best estimate over tile-aligned powers of two;
     * prefill with fixed_split never splits (an unsplit query tile runs its keys in one fixed
     * order whatever the batch, so batch invariance needs no chunks) */
    int64_t chunk = 0;
    if (pl->o.fixed_split > 0 && pl->decode) {
        int64_t items, splits;
        chunk = pl->o.fixed_split;
        estimate(pl, ntiles, chunk, &items, &splits);
        if (splits > L.slots)
            return plan_fail(
                pl,
                kiln__fail(&e, KILN_STATUS_WORKSPACE,
                           "plan %s: fixed_split=%lld cuts this batch into %lld split items, more "
                           "than the %lld the workspace was sized for; set max_total_kv",
                           pl->k->spec, (long long)chunk, (long long)splits, (long long)L.slots),
                &e);
    } else if (pl->o.fixed_split <= 0 && !pl->o.no_split) {
        int64_t it, sp;
        double best = estimate(pl, ntiles, 0, &it, &sp);
        for (int64_t c = pl->gran; c < max_keys; c *= 2) {
            const double est = estimate(pl, ntiles, c, &it, &sp);
            if (sp <= L.slots && est < best * 0.97) {
                best = est;
                chunk = c;
            }
        }
    }

    /* the schedule, heaviest items first: bucket by the bit length of the item's keys */
    const size_t ints = L.int_bytes / sizeof(int);
    const int slot = (pl->ring + 1) % HOST_RING;
    if (pl->host_only && ints > pl->host_ints) {
        free(pl->host);
        pl->host = calloc(ints, sizeof(int));
        pl->host_ints = pl->host ? ints : 0;
        if (!pl->host)
            return plan_fail(pl, kiln__fail(&e, KILN_STATUS_NO_MEMORY, "plan: out of memory"), &e);
    }
    if (!pl->host_only) {
        if ((st = kiln__ctx_bind(pl->k->ctx, &e))) return plan_fail(pl, st, &e);
        const kiln__cu *cu = pl->k->ctx->cu;
        /* growing: every buffer must be free; otherwise only the one reused now */
        for (int i = 0; i < HOST_RING; i++) {
            if (!pl->copy_pending[i] || (i != slot && ints <= pl->host_ints)) continue;
            const CUresult r = cu->cuEventSynchronize(pl->copied[i]);
            pl->copy_pending[i] = 0;
            if (r != CUDA_SUCCESS)
                return plan_fail(pl, kiln__cu_fail(&e, r, "plan %s: earlier copy", pl->k->spec),
                                 &e);
        }
        if (ints > pl->host_ints) {
            if (pl->host) cu->cuMemFreeHost(pl->host);
            pl->host = NULL;
            pl->host_ints = 0;
            void *h = NULL;
            const CUresult r = cu->cuMemHostAlloc(&h, ints * sizeof(int) * HOST_RING, 0);
            if (r != CUDA_SUCCESS)
                return plan_fail(pl, kiln__cu_fail(&e, r, "plan %s: pinned buffer", pl->k->spec),
                                 &e);
            pl->host = h;
            pl->host_ints = ints;
        }
    }
    int *w = pl->host + (pl->host_only ? 0 : (size_t)slot * pl->host_ints);
    kiln_work_req *req = (kiln_work_req *)(w + L.reqs_off);
    kiln_work_item *item = (kiln_work_item *)(w + L.items_off);
    kiln_merge_task *task = (kiln_merge_task *)(w + L.tasks_off);
    /* requests; mask data of request b starts after the earlier requests' (bits: their
     * L_Q x L_KV matrices; bsr: their block rows) */
    int64_t bit0 = 0, row0 = 0;
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
        row0 += R == 1 ? qo : ceil_div(qo, R); /* no division on the plan's path without bsr */
    }
    if (row0 > INT32_MAX)
        return plan_fail(pl,
                         kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                    "plan %s: %lld bsr block rows exceed 2^31", pl->k->spec,
                                    (long long)row0),
                         &e);
    int nitems = 0, ntasks = 0, nslot = 0;
    int64_t total_keys = 0, longest = 0;
    /* counting sort of the tiles by the bit length of their items' keys, longest first */
    int *tile_bits = pl->order + 2 * pl->scratch_cap, *sorted = pl->order + 3 * pl->scratch_cap;
    int count[34] = {0};
    for (int t = 0; t < ntiles; t++) {
        const int keys = pl->tile_keys[t];
        const int64_t size = chunk > 0 && keys > chunk ? chunk : keys;
        tile_bits[t] = size ? 32 - __builtin_clz((unsigned)size) : 0;
        count[tile_bits[t]]++;
    }
    for (int b = 32, at = 0; b >= 0; b--) {
        const int n = count[b];
        count[b] = at;
        at += n;
    }
    for (int t = 0; t < ntiles; t++) sorted[count[tile_bits[t]]++] = t;
    for (int x = 0; x < ntiles; x++) {
        const int t = sorted[x];
        const int keys = pl->tile_keys[t];
        const int64_t n = chunk > 0 && keys > chunk ? ceil_div(keys, chunk) : 1;
        const int64_t size = n > 1 ? chunk : keys;
        const int slot0 = n > 1 ? nslot : -1;
        for (int64_t c = 0; c < n; c++) {
            kiln_work_item *it = item + nitems;
            it->b = tile_b[t];
            it->m = tile_m[t];
            it->kv_lo = n > 1 ? (int)(c * chunk) : 0;
            it->kv_hi = n > 1 ? (int)((c + 1) * chunk < keys ? (c + 1) * chunk : keys) : keys;
            it->slot = n > 1 ? slot0 + (int)c : -1;
            it->pad[0] = it->pad[1] = it->pad[2] = 0;
            nitems++;
        }
        if (n > 1) {
            task[ntasks].b = tile_b[t];
            task[ntasks].m = tile_m[t];
            task[ntasks].slot0 = slot0;
            task[ntasks].nslots = (int)n;
            ntasks++;
            nslot += (int)n;
        }
        total_keys += keys;
        if (size > longest) longest = size;
    }
    kiln_work_header *hdr = (kiln_work_header *)w;
    hdr->items = nitems;
    hdr->tasks = ntasks;
    hdr->reqs = B;
    hdr->pad = 0;

    /* one copy of the int region actually used (header .. last task) */
    const size_t used = (size_t)(L.tasks_off + ntasks * TASK_INTS) * sizeof(int);
    if (!pl->host_only) {
        const kiln__cu *cu = pl->k->ctx->cu;
        CUresult r = cu->cuMemcpyHtoDAsync(workspace, w, used, (CUstream)stream);
        if (r == CUDA_SUCCESS) r = cu->cuEventRecord(pl->copied[slot], (CUstream)stream);
        if (r != CUDA_SUCCESS)
            return plan_fail(pl, kiln__cu_fail(&e, r, "plan %s: copy the schedule", pl->k->spec),
                             &e);
        pl->copy_pending[slot] = 1;
        pl->ring = slot;
    }

    pl->items_off = L.items_off;
    pl->reqs_off = L.reqs_off;
    pl->tasks_off = L.tasks_off;
    pl->plse_off = L.plse_off;
    pl->po_off = L.po_off;
    pl->need_bytes = L.bytes;
    pl->ws = workspace;
    pl->ws_bytes = workspace_bytes;
    if (pl->o.max_batch > 0) {
        pl->grid = (int)L.items;
        pl->tasks_grid = (int)L.tasks;
    } else {
        pl->grid = nitems;
        pl->tasks_grid = ntasks;
    }
    pl->info = (kiln_plan_info){.batch = B,
                                .items = nitems,
                                .grid = pl->grid,
                                .kv_chunk = (int)chunk * (ntasks > 0),
                                .split_items = nslot,
                                .merge_tasks = ntasks,
                                .max_item_keys = longest,
                                .total_keys = total_keys};
    pl->planned = 1;
    return KILN_STATUS_OK;
}

kiln_status kiln_batch_run(kiln_plan *pl, const kiln_batch_args *a, void *stream)
{
    kiln__err e = {{0}};
    if (!pl || !a)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT, "run: NULL plan or args");
    kiln_kernel *k = pl->k;
    if (!pl->planned)
        return plan_fail(pl,
                         kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                    "run %s: no kiln_batch_plan yet", k->spec),
                         &e);
    if (a->workspace != pl->ws || a->workspace_bytes < pl->need_bytes)
        return plan_fail(
            pl,
            kiln__fail(&e, KILN_STATUS_WORKSPACE,
                       "run %s: the workspace (0x%llx, %zu bytes) is not the one planned into "
                       "(0x%llx, %zu bytes needed)",
                       k->spec, (unsigned long long)a->workspace, a->workspace_bytes,
                       (unsigned long long)pl->ws, pl->need_bytes),
            &e);
    kiln_launch_params p;
    kiln_status st = kiln__batch_prepare(k, a, pl->H, pl->o.bsr_r, pl->o.bsr_c, &p, &e);
    if (st) return plan_fail(pl, st, &e);
    p.num_qo_heads = pl->H;
    p.num_kv_heads = pl->H / k->v.group;
    p.page_size = pl->o.page_size;
    p.work = pl->ws;
    p.items_off = pl->items_off;
    p.reqs_off = pl->reqs_off;
    p.tasks_off = pl->tasks_off;
    p.slot_rows = pl->rows;
    p.partial_lse = pl->ws + pl->plse_off;
    p.partial_o = pl->ws + pl->po_off;
    if (k->v.kv == KILN_KV_PAGED) {
        const int nhd = k->v.layout == KILN_LAYOUT_NHD, ps = pl->o.page_size, D = pl->D,
                  HK = pl->H / k->v.group;
        p.k_stride_n = a->k_stride_n ? a->k_stride_n : nhd ? (int64_t)HK * D : D;
        p.k_stride_h = a->k_stride_h ? a->k_stride_h : nhd ? D : (int64_t)ps * D;
        p.k_stride_page = a->k_stride_page ? a->k_stride_page : (int64_t)ps * HK * D;
        p.v_stride_n = a->v_stride_n ? a->v_stride_n : nhd ? (int64_t)HK * D : D;
        p.v_stride_h = a->v_stride_h ? a->v_stride_h : nhd ? D : (int64_t)ps * D;
        p.v_stride_page = a->v_stride_page ? a->v_stride_page : (int64_t)ps * HK * D;
        if (!a->kv_indices || a->kv_indices % 4)
            return plan_fail(pl,
                             kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                        "run %s: kv=paged needs kv_indices (int32, 4-byte aligned)",
                                        k->spec),
                             &e);
        p.kv_indices = a->kv_indices;
    } else {
        const int D = pl->D, HK = pl->H / k->v.group;
        p.k_stride_n = a->k_stride_n ? a->k_stride_n : (int64_t)HK * D;
        p.k_stride_h = a->k_stride_h ? a->k_stride_h : D;
        p.v_stride_n = a->v_stride_n ? a->v_stride_n : (int64_t)HK * D;
        p.v_stride_h = a->v_stride_h ? a->v_stride_h : D;
    }
    const int es = k->v.kv_dtype == KILN_DTYPE_E4M3 || k->v.kv_dtype == KILN_DTYPE_E5M2 ? 1 : 2;
    const int64_t align = 16 / es;
    if ((p.k_stride_n | p.k_stride_h | p.k_stride_page | p.v_stride_n | p.v_stride_h |
         p.v_stride_page) %
        align)
        return plan_fail(
            pl,
            kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                       "run %s: k/v strides must be multiples of %lld elements (16 bytes)", k->spec,
                       (long long)align),
            &e);
    if (k->v.rope && a->rope_offsets % 4)
        return plan_fail(pl,
                         kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                    "run %s: rope_offsets must be 4-byte aligned", k->spec),
                         &e);
    p.rope_offsets = k->v.rope ? a->rope_offsets : 0;
    if (pl->grid == 0) return KILN_STATUS_OK; /* an empty batch (eager mode) */

    const kiln__cu *cu = k->ctx->cu;
    void *args[] = {&p};
    CUresult r;
    if (pl->decode && !k->cfg.pack) {
        const unsigned hk = (unsigned)(pl->H / k->v.group), gz = (unsigned)(k->v.group / k->cfg.gb);
        r = cu->cuLaunchKernel(k->fn_main, (unsigned)pl->grid, hk, gz, (unsigned)k->cfg.threads, 1,
                               1, (unsigned)k->cfg.smem_bytes, (CUstream)stream, args, NULL);
    } else {
        r = cu->cuLaunchKernel(k->fn_main, (unsigned)pl->grid, (unsigned)pl->hpi, 1,
                               (unsigned)k->cfg.threads, 1, 1, (unsigned)k->cfg.smem_bytes,
                               (CUstream)stream, args, NULL);
    }
    if (r == CUDA_SUCCESS && pl->tasks_grid > 0)
        r = cu->cuLaunchKernel(k->fn_merge, (unsigned)pl->tasks_grid, (unsigned)pl->H, 1,
                               (unsigned)k->cfg.merge_threads, 1, 1, 0, (CUstream)stream, args,
                               NULL);
    if (r != CUDA_SUCCESS)
        return plan_fail(pl, kiln__cu_fail(&e, r, "run %s: launch", k->spec), &e);
    return KILN_STATUS_OK;
}

/* ---- softmax-state merges ------------------------------------------------------------------ */

static kiln_status merge_launch(kiln_kernel *k, const kiln_merge_args *a, int which, void *stream)
{
    static const char *const names[3] = {"merge_state", "merge_state_in_place", "merge_states"};
    const char *what = names[which];
    kiln__err e = {{0}};
    if (!k || !a)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT, "%s: NULL kernel or args",
                          what);
    if (k->v.op != KILN_OP_MERGE || !k->loaded)
        return kiln__ctx_error(k->ctx,
                               kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                          "%s: kernel %s must be a loaded op=merge kernel", what,
                                          k->spec),
                               &e);
    const int D = k->v.head_dim;
    if (a->rows < 0 || a->num_heads < 1 || (which == 2 && a->num_states < 1))
        return kiln__ctx_error(k->ctx,
                               kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                          "%s %s: rows=%d must be >= 0, num_heads=%d >= 1%s", what,
                                          k->spec, a->rows, a->num_heads,
                                          which == 2 ? ", num_states >= 1" : ""),
                               &e);
    int missing;
    if (which == 0) missing = !a->v_a || !a->lse_a || !a->v_b || !a->lse_b || !a->v_out;
    else if (which == 1) missing = !a->v_a || !a->lse_a || !a->v_b || !a->lse_b;
    else missing = !a->v_all || !a->lse_all || !a->v_out;
    if (missing)
        return kiln__ctx_error(k->ctx,
                               kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                          "%s %s: %s must be non-zero", what, k->spec,
                                          which == 0   ? "v_a, lse_a, v_b, lse_b, v_out"
                                          : which == 1 ? "v_a, lse_a, v_b, lse_b"
                                                       : "v_all, lse_all, v_out"),
                               &e);
    if ((a->v_a | a->v_b | a->v_out | a->v_all) % 2 ||
        (a->lse_a | a->lse_b | a->lse_out | a->lse_all) % 4)
        return kiln__ctx_error(k->ctx,
                               kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                          "%s %s: v tensors must be 2-byte and lse 4-byte aligned",
                                          what, k->spec),
                               &e);
    if (a->rows == 0) return KILN_STATUS_OK;
    kiln_merge_params p;
    memset(&p, 0, sizeof p);
    p.v_a = a->v_a;
    p.lse_a = a->lse_a;
    p.v_b = a->v_b;
    p.lse_b = a->lse_b;
    p.v_out = a->v_out;
    p.lse_out = a->lse_out;
    p.mask = which == 1 ? a->mask : 0;
    p.v_all = a->v_all;
    p.lse_all = a->lse_all;
    p.v_stride_h = a->v_stride_h ? a->v_stride_h : D;
    p.v_stride_n = a->v_stride_n ? a->v_stride_n : (int64_t)a->num_heads * D;
    p.num_states = a->num_states;
    p.rows = a->rows;
    p.num_heads = a->num_heads;
    CUfunction fn = which == 0 ? k->fn_main : which == 1 ? k->fn_merge : k->fn_aux;
    void *args[] = {&p};
    kiln_status st = kiln__ctx_bind(k->ctx, &e);
    if (st) return kiln__ctx_error(k->ctx, st, &e);
    CUresult r = k->ctx->cu->cuLaunchKernel(fn, (unsigned)a->rows, (unsigned)a->num_heads, 1,
                                            (unsigned)D, 1, 1, 0, (CUstream)stream, args, NULL);
    if (r != CUDA_SUCCESS)
        return kiln__ctx_error(k->ctx, kiln__cu_fail(&e, r, "%s %s: launch", what, k->spec), &e);
    return KILN_STATUS_OK;
}

kiln_status kiln_merge_state(kiln_kernel *k, const kiln_merge_args *a, void *stream)
{
    return merge_launch(k, a, 0, stream);
}

kiln_status kiln_merge_state_in_place(kiln_kernel *k, const kiln_merge_args *a, void *stream)
{
    return merge_launch(k, a, 1, stream);
}

kiln_status kiln_merge_states(kiln_kernel *k, const kiln_merge_args *a, void *stream)
{
    return merge_launch(k, a, 2, stream);
}
