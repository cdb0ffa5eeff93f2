/*
 * test_plan.c — the batch planner on the host (no GPU): every schedule covers each (request,
 * query tile, key) exactly once, slots and merge tasks agree, no item is far longer than the
 * average work per CTA slot, the workspace size bounds every plan, fixed splits are batch
 * invariant, degenerate batches are handled or refused with a message naming the request, and
 * the fused merge's arrival counters lie in the uploaded int region, zeroed, one per (task,
 * head scope).
 *
 * Plans are made with kiln__plan_create_host (runtime.h) for kernels compiled for sm_90a on a
 * 132-SM device running 1 (decode) or 2 (prefill) CTAs per SM, like an H200.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kt.h"
#include "runtime.h"

/* the schedule's record sizes in ints (templates/common/params.h) */
enum { ITEM_W = sizeof(kiln_work_item) / sizeof(int), REQ_W = sizeof(kiln_work_req) / sizeof(int) };

enum { SMS = 132 };

static kiln_kernel *compile(kiln_ctx *ctx, const char *spec)
{
    kiln_variant v;
    if (kiln_variant_parse(spec, &v) != KILN_STATUS_OK) {
        kt_fail(__FILE__, __LINE__, "%s: %s", spec, kiln_errmsg());
        return NULL;
    }
    kiln_kernel *k = NULL;
    if (kiln_kernel_compile(ctx, &v, "sm_90a", &k) != KILN_STATUS_OK)
        kt_fail(__FILE__, __LINE__, "%s: %s", spec, kiln_ctx_errmsg(ctx));
    return k;
}

static unsigned rnd(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* A batch: lengths and the index arrays kiln_plan_schedule reads. */
typedef struct batch {
    int B;
    int qo[300], kv[300];
    int qo_indptr[301], kv_indptr[301], last[300];
} batch;

static void build(batch *b, int paged, int page)
{
    b->qo_indptr[0] = b->kv_indptr[0] = 0;
    for (int i = 0; i < b->B; i++) {
        b->qo_indptr[i + 1] = b->qo_indptr[i] + b->qo[i];
        const int pages = paged ? (b->kv[i] + page - 1) / page : b->kv[i];
        b->kv_indptr[i + 1] = b->kv_indptr[i] + pages;
        b->last[i] = paged && b->kv[i] ? b->kv[i] - (pages - 1) * page : 1;
    }
}

static kiln_batch_shape shape_of(const batch *b, int decode)
{
    kiln_batch_shape s = {b->B, decode ? NULL : b->qo_indptr, b->kv_indptr, b->last};
    return s;
}

/* Check one schedule against the batch: coverage, slots, tasks, item length bound. */
static void check_schedule(kiln_plan *pl, const batch *b, int decode, int rows, int causal,
                           const char *what)
{
    kiln_plan_info info;
    KT_OK(kiln_plan_describe(pl, &info), kiln_errmsg());
    int io, ro, to;
    const int *w = kiln__plan_last_schedule(pl, &io, &ro, &to);
    const int nitems = w[0], ntasks = w[1];
    KT_EQ_INT(nitems, info.items);
    KT_EQ_INT(ntasks, info.merge_tasks);
    /* the header's request count, and the wgmma persistent grid's claim counter at 0 in every
     * schedule (its kernel claims jobs from it and its last claim resets it) */
    KT_EQ_INT(w[2], b->B);
    KT_EQ_INT(w[KILN_WORK_HEADER_NEXT_AT], 0);
    /* requests, with where their mask data starts: bits after the earlier requests' L_Q x L_KV
     * matrices, bsr block rows (of the plan's bsr_r, 1 when unset) after theirs */
    int64_t bit0 = 0, row0 = 0;
    for (int r = 0; r < b->B; r++) {
        const int *q = w + ro + r * REQ_W;
        const int qo = decode ? 1 : b->qo[r];
        const int64_t got_bit0 = (int64_t)(((uint64_t)(uint32_t)q[5] << 32) | (uint32_t)q[4]);
        if (q[1] != qo || q[3] != b->kv[r] || got_bit0 != bit0 || q[6] != row0) {
            kt_fail(__FILE__, __LINE__,
                    "%s: request %d recorded as qo=%d kv=%d bit0=%lld row0=%d, is qo=%d kv=%d "
                    "bit0=%lld row0=%lld",
                    what, r, q[1], q[3], (long long)got_bit0, q[6], qo, b->kv[r], (long long)bit0,
                    (long long)row0);
            return;
        }
        bit0 += (int64_t)qo * b->kv[r];
        row0 += qo;
    }
    /* coverage: per (request, tile) the items' key ranges tile [0, visible keys) in order */
    int64_t total = 0, work = 0, longest = 0;
    int *slot_seen = calloc((size_t)nitems + 1, sizeof(int));
    for (int r = 0; r < b->B; r++) {
        const int qo = decode ? 1 : b->qo[r], kv = b->kv[r];
        const int tiles = decode ? 1 : (qo + rows - 1) / rows;
        for (int m = 0; m < tiles; m++) {
            int64_t vis = kv;
            if (causal && !decode) {
                vis = (int64_t)(m + 1) * rows + kv - qo;
                if (vis > kv) vis = kv;
                if (vis < 0) vis = 0;
            }
            int covered = 0, n = 0, split = 0;
            for (int i = 0; i < nitems; i++) {
                const int *it = w + io + i * ITEM_W;
                if (it[0] != r || it[1] != m) continue;
                n++;
                if (it[4] >= 0) split = 1;
                if (it[2] != covered) {
                    /* items of one tile are emitted in key order */
                    kt_fail(__FILE__, __LINE__,
                            "%s: request %d tile %d: item starts at %d, expected %d", what, r, m,
                            it[2], covered);
                    free(slot_seen);
                    return;
                }
                covered = it[3];
                if (it[3] - it[2] > longest) longest = it[3] - it[2];
                if (it[4] >= 0) {
                    if (it[4] >= nitems || slot_seen[it[4]]++) {
                        kt_fail(__FILE__, __LINE__, "%s: slot %d reused or out of range", what,
                                it[4]);
                        free(slot_seen);
                        return;
                    }
                }
            }
            if (n == 0 || covered != vis || (n > 1) != split) {
                kt_fail(__FILE__, __LINE__,
                        "%s: request %d tile %d: %d items cover %d of %lld keys (split=%d)", what,
                        r, m, n, covered, (long long)vis, split);
                free(slot_seen);
                return;
            }
            total += vis;
            work += vis;
        }
    }
    /* no item belongs to a tile that does not exist */
    for (int i = 0; i < nitems; i++) {
        const int *it = w + io + i * ITEM_W;
        const int tiles = it[0] < b->B ? (decode ? 1 : (b->qo[it[0]] + rows - 1) / rows) : 0;
        if (it[0] >= b->B || it[1] >= tiles) {
            kt_fail(__FILE__, __LINE__, "%s: item %d names request %d tile %d", what, i, it[0],
                    it[1]);
            break;
        }
    }
    /* every split item names the task whose slots hold its slot (that task is its tile's), an
     * unsplit one -1; it carries its request's q_start, kv_start, qo_len, kv_len as that
     * request's record has them; the item's last two words are 0 */
    for (int i = 0; i < nitems; i++) {
        const int *it = w + io + i * ITEM_W;
        const int *tk = it[5] >= 0 && it[5] < ntasks ? w + to + it[5] * 4 : NULL;
        const int ok = it[4] < 0 ? it[5] == -1
                                 : tk && tk[0] == it[0] && tk[1] == it[1] && tk[2] <= it[4] &&
                                       it[4] < tk[2] + tk[3];
        const int *q = w + ro + it[0] * REQ_W;
        if (!ok || it[10] || it[11]) {
            kt_fail(__FILE__, __LINE__,
                    "%s: item %d (request %d tile %d slot %d) names task %d of %d, pad %d %d", what,
                    i, it[0], it[1], it[4], it[5], ntasks, it[10], it[11]);
            break;
        }
        if (it[6] != q[0] || it[7] != q[2] || it[8] != q[1] || it[9] != q[3]) {
            kt_fail(__FILE__, __LINE__,
                    "%s: item %d of request %d carries q_start=%d kv_start=%d qo_len=%d "
                    "kv_len=%d, its request %d %d %d %d",
                    what, i, it[0], it[6], it[7], it[8], it[9], q[0], q[2], q[1], q[3]);
            break;
        }
    }
    /* tasks: each names a split tile, its slots are that tile's items' slots */
    for (int t = 0; t < ntasks; t++) {
        const int *tk = w + to + t * 4;
        int n = 0, lo = 1 << 30;
        for (int i = 0; i < nitems; i++) {
            const int *it = w + io + i * ITEM_W;
            if (it[0] == tk[0] && it[1] == tk[1]) {
                n++;
                if (it[4] < lo) lo = it[4];
            }
        }
        if (n != tk[3] || lo != tk[2] || n < 2) {
            kt_fail(__FILE__, __LINE__,
                    "%s: task %d (request %d tile %d) says slots %d+%d, items say %d+%d", what, t,
                    tk[0], tk[1], tk[2], tk[3], lo, n);
            break;
        }
    }
    KT_EQ_INT((int)info.total_keys, (int)total);
    KT_EQ_INT((int)info.max_item_keys, (int)longest);
    free(slot_seen);
    (void)work;
}

/* The heads one CTA of a work item covers form a head scope; the kernel's CTAs per item. */
static int head_scopes(const kiln_kernel *k, int H)
{
    const int G = k->v.group;
    return k->cfg.pack ? H / G : k->v.op == KILN_OP_DECODE ? (H / G) * (G / k->cfg.gb) : H;
}

/* The fused merge's counters of the last schedule of pl (kernel k, H query heads): none unless
 * the kernel merges its splits; else int [task bound][head scopes] right after the tasks'
 * bound, inside the int region, the schedule's tasks' counters 0 and uploaded with it. */
static void check_counters(const kiln_plan *pl, const kiln_kernel *k, int H, const char *what)
{
    kiln__plan_layout lay;
    kiln__plan_last_layout(pl, &lay);
    int io, ro, to;
    const int *w = kiln__plan_last_schedule(pl, &io, &ro, &to);
    const int ntasks = w[1];
    KT_EQ_INT(lay.tasks_off, to);
    KT_CHECK(ntasks <= lay.task_bound);
    KT_EQ_INT(lay.counters_off, lay.tasks_off + lay.task_bound * 4);
    KT_CHECK(lay.counters_off % 4 == 0);
    if (!k->cfg.fused_merge) {
        KT_EQ_INT(lay.scopes, 0);
        KT_CHECK(lay.uploaded == (size_t)(to + ntasks * 4) * sizeof(int));
        return;
    }
    KT_EQ_INT(lay.scopes, head_scopes(k, H));
    const int64_t end = (int64_t)lay.counters_off + (int64_t)lay.task_bound * lay.scopes;
    if (end * (int64_t)sizeof(int) > (int64_t)lay.int_bytes)
        kt_fail(__FILE__, __LINE__, "%s: counters end at int %lld, past the %zu-byte int region",
                what, (long long)end, lay.int_bytes);
    /* the upload ends after the last task's counters (after the tasks when there are none) */
    const int64_t up = ntasks ? lay.counters_off + (int64_t)ntasks * lay.scopes : to;
    KT_CHECK(lay.uploaded == (size_t)up * sizeof(int) && lay.uploaded <= lay.int_bytes);
    for (int64_t c = 0; c < (int64_t)ntasks * lay.scopes; c++)
        if (w[lay.counters_off + c]) {
            kt_fail(__FILE__, __LINE__, "%s: counter %lld (task %lld, scope %lld) is %d, not 0",
                    what, (long long)c, (long long)(c / lay.scopes), (long long)(c % lay.scopes),
                    w[lay.counters_off + c]);
            break;
        }
}

/* Balance bound: no item is longer than twice the average work per CTA slot, unless it is a
 * single unsplit tile no longer than 4 granules or the split granule itself. */
static void check_balance(kiln_plan *pl, int hpi, int slots, int gran, const char *what)
{
    kiln_plan_info info;
    kiln_plan_describe(pl, &info);
    const double avg = (double)info.total_keys * hpi / slots;
    const double bound = 2 * avg > 4 * gran ? 2 * avg : 4 * gran;
    if ((double)info.max_item_keys > bound && info.max_item_keys > info.kv_chunk)
        kt_fail(__FILE__, __LINE__,
                "%s: longest item %lld keys > bound %.0f (avg per slot %.0f, chunk %d)", what,
                (long long)info.max_item_keys, bound, avg, info.kv_chunk);
}

KT_TEST(plan_schedules_cover_and_balance)
{
    kiln_ctx *ctx = KT_CTX(kt_tmpdir(), 0);
    KT_REQUIRE(ctx);
    static const char *const specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged",
        "op=decode dtype=f16 head_dim=64 group=1 kv=ragged",
        "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal kv=paged",
        "op=prefill dtype=f16 head_dim=128 group=1 kv=ragged",
    };
    unsigned seed = 7;
    int plans = 0;
    for (int si = 0; si < 4; si++) {
        kiln_kernel *k = compile(ctx, specs[si]);
        if (!k) continue;
        const int decode = k->v.op == KILN_OP_DECODE, paged = k->v.kv == KILN_KV_PAGED;
        const int causal = k->v.mask == KILN_MASK_CAUSAL, H = 32;
        for (int trial = 0; trial < 40; trial++) {
            batch *b = calloc(1, sizeof *b);
            const int shapes = trial % 5;
            b->B = shapes == 0 ? 1 : shapes == 1 ? 17 : shapes == 2 ? 64 : shapes == 3 ? 256 : 12;
            for (int r = 0; r < b->B; r++) {
                b->kv[r] = shapes == 0 ? 1 + (int)(rnd(&seed) % 40000) : (int)(rnd(&seed) % 5000);
                if (shapes == 4 && r == 0) b->kv[r] = 30000; /* one huge among tiny */
                if (shapes == 4 && r) b->kv[r] = (int)(rnd(&seed) % 3);
                b->qo[r] = decode ? 1 : (int)(rnd(&seed) % 700);
                if (causal && b->qo[r] > b->kv[r] && rnd(&seed) % 2) b->qo[r] = b->kv[r];
            }
            build(b, paged, 16);
            kiln_plan_opts o = {0};
            o.num_qo_heads = H;
            o.page_size = 16;
            kiln_plan *pl = NULL;
            KT_OK(kiln__plan_create_host(k, &o, SMS, decode ? 1 : 2, &pl), "plan host");
            kiln_batch_shape sh = shape_of(b, decode);
            char what[128];
            snprintf(what, sizeof what, "%s trial %d B=%d", specs[si], trial, b->B);
            if (kiln_plan_schedule(pl, &sh, 0, 0, NULL) != KILN_STATUS_OK) {
                kt_fail(__FILE__, __LINE__, "%s: %s", what, kiln_ctx_errmsg(ctx));
            } else {
                check_schedule(pl, b, decode, decode ? 1 : k->cfg.block_m, causal, what);
                check_counters(pl, k, H, what);
                const int pack = k->cfg.pack;
                check_balance(pl, head_scopes(k, H), SMS * (decode ? 1 : 2),
                              decode && !pack ? 32 * k->cfg.warps : k->cfg.block_n, what);
                /* the workspace size bounds the plan */
                size_t need = 0;
                KT_OK(kiln_plan_workspace_size(pl, b->B, decode ? b->B : b->qo_indptr[b->B], &need),
                      "size");
                kiln__plan_layout lay;
                kiln__plan_last_layout(pl, &lay);
                KT_CHECK(lay.uploaded <= need && lay.int_bytes <= need);
                plans++;
            }
            kiln_plan_destroy(pl);
            free(b);
        }
    }
    KT_CHECK(plans == 160);
    kiln_ctx_destroy(ctx);
}

/* A host plan of the paged bf16 d128 group-4 decode (32 query heads, pages of 16) and a batch of
 * one request of 32768 keys, which the planner splits over the device. */
static kiln_plan *long_decode(kiln_ctx *ctx, batch **b_out, kiln_batch_shape *sh)
{
    kiln_kernel *k = compile(ctx, "op=decode dtype=bf16 head_dim=128 group=4 kv=paged");
    KT_CHECK(k);
    kiln_plan_opts o = {0};
    o.num_qo_heads = 32;
    o.page_size = 16;
    kiln_plan *pl = NULL;
    if (!k || kiln__plan_create_host(k, &o, SMS, 1, &pl) != KILN_STATUS_OK) return NULL;
    batch *b = calloc(1, sizeof *b);
    b->B = 1;
    b->kv[0] = 32768;
    build(b, 1, 16);
    *sh = shape_of(b, 1);
    *b_out = b;
    return pl;
}

/* A long single decode is split over the device; a batch that fills the device is not. */
KT_TEST(plan_split_decisions)
{
    kiln_ctx *ctx = KT_CTX(kt_tmpdir(), 0);
    KT_REQUIRE(ctx);
    batch *b = NULL;
    kiln_batch_shape sh;
    kiln_plan *pl = long_decode(ctx, &b, &sh);
    KT_REQUIRE(pl);
    KT_OK(kiln_plan_schedule(pl, &sh, 0, 0, NULL), kiln_ctx_errmsg(ctx));
    kiln_plan_info info;
    kiln_plan_describe(pl, &info);
    KT_CHECK(info.items >= 8 && info.items * 8 <= 2 * SMS); /* split, about one wave */
    KT_CHECK(info.merge_tasks == 1);
    b->B = 64;
    for (int r = 0; r < 64; r++) b->kv[r] = 4096;
    build(b, 1, 16);
    sh = shape_of(b, 1);
    KT_OK(kiln_plan_schedule(pl, &sh, 0, 0, NULL), kiln_ctx_errmsg(ctx));
    kiln_plan_describe(pl, &info);
    KT_EQ_INT(info.merge_tasks, 0); /* 512 CTAs already fill 132 slots */
    KT_EQ_INT(info.items, 64);
    kiln_plan_destroy(pl);
    free(b);
    kiln_ctx_destroy(ctx);
}

/* Graph mode launches the bound's CTAs on every replay: a decode's split bound there is two
 * waves of the device's slots (eager: eight), and the planner picks the same split in both
 * modes for one long request and for a full batch. */
KT_TEST(plan_graph_split_bound)
{
    kiln_ctx *ctx = KT_CTX(kt_tmpdir(), 0);
    KT_REQUIRE(ctx);
    kiln_kernel *k = compile(ctx, "op=decode dtype=bf16 head_dim=128 group=4 kv=paged");
    KT_REQUIRE(k);
    enum { CTAS = 4, H = 32 };
    const int hpi = H / 4, wave = SMS * CTAS / hpi;
    batch *b = calloc(1, sizeof *b);
    KT_REQUIRE(b);
    int chunk[2][2] = {{0}}, items[2][2] = {{0}};
    for (int graph = 0; graph < 2; graph++) {
        kiln_plan_opts o = {0};
        o.num_qo_heads = H;
        o.page_size = 16;
        o.max_batch = graph ? 256 : 0;
        kiln_plan *pl = NULL;
        KT_OK(kiln__plan_create_host(k, &o, SMS, CTAS, &pl), "plan host");
        for (int full = 0; full < 2; full++) {
            b->B = full ? 256 : 1;
            for (int r = 0; r < b->B; r++) b->kv[r] = full ? 512 + 37 * r : 4096;
            build(b, 1, 16);
            kiln_batch_shape sh = shape_of(b, 1);
            KT_OK(kiln_plan_schedule(pl, &sh, 0, 0, NULL), kiln_ctx_errmsg(ctx));
            kiln_plan_info info;
            kiln_plan_describe(pl, &info);
            chunk[graph][full] = info.kv_chunk;
            items[graph][full] = info.items;
            if (graph) KT_EQ_INT(info.grid, 256 + 2 * wave + 1); /* max_batch + 2 waves + 1 */
            else KT_EQ_INT(info.grid, info.items);
            KT_CHECK(info.items <= info.grid);
            check_schedule(pl, b, 1, 1, 0, graph ? "graph" : "eager");
        }
        size_t bytes = 0;
        KT_OK(kiln_plan_workspace_size(pl, 1, 1, &bytes), "size");
        kiln_plan_destroy(pl);
    }
    KT_EQ_INT(chunk[0][0], chunk[1][0]); /* B1 x 4096: the same split */
    KT_EQ_INT(items[0][0], items[1][0]);
    KT_CHECK(items[0][0] > 1 && items[0][0] <= wave);
    KT_EQ_INT(chunk[0][1], chunk[1][1]); /* B256: the same (no split) */
    KT_EQ_INT(items[0][1], items[1][1]);
    free(b);
    kiln_ctx_destroy(ctx);
}

/* A workspace smaller than kiln_plan_workspace_size holds fewer partial slots: the schedule
 * splits into no more chunks than fit, down to none (a host-only plan lays out for the size
 * given and refuses nothing; a device plan refuses a workspace below the layout with none). */
KT_TEST(plan_fits_smaller_workspace)
{
    kiln_ctx *ctx = KT_CTX(kt_tmpdir(), 0);
    KT_REQUIRE(ctx);
    batch *b = NULL;
    kiln_batch_shape sh;
    kiln_plan *pl = long_decode(ctx, &b, &sh);
    KT_REQUIRE(pl);
    size_t full = 0;
    KT_OK(kiln_plan_workspace_size(pl, 1, 1, &full), "size");
    kiln_plan_info info;
    KT_OK(kiln_plan_schedule(pl, &sh, 0, full, NULL), kiln_ctx_errmsg(ctx));
    kiln_plan_describe(pl, &info);
    const int all = info.split_items;
    KT_CHECK(all >= 8);
    /* halving the workspace never adds splits, some size splits less, and 1 KiB (the schedule
     * of one request and no partial slot) splits none */
    int last = all, middle = 0;
    for (size_t ws = full / 2; ws >= 1024; ws /= 2) {
        KT_OK(kiln_plan_schedule(pl, &sh, 0, ws, NULL), kiln_ctx_errmsg(ctx));
        kiln_plan_describe(pl, &info);
        KT_CHECK(info.split_items <= last);
        KT_CHECK(info.split_items == 0 ? info.merge_tasks == 0 : info.merge_tasks == 1);
        middle |= info.split_items > 1 && info.split_items < all;
        last = info.split_items;
    }
    KT_CHECK(middle);
    KT_OK(kiln_plan_schedule(pl, &sh, 0, 1024, NULL), kiln_ctx_errmsg(ctx));
    kiln_plan_describe(pl, &info);
    KT_EQ_INT(info.split_items, 0);
    KT_EQ_INT(info.items, 1);
    kiln_plan_destroy(pl);
    free(b);
    kiln_ctx_destroy(ctx);
}

/* The schedule and the partial states in two buffers (kiln_plan_schedule_scratch): the two
 * sizes add up to the one-buffer size; with the full scratch the schedule is the one-buffer
 * schedule, int for int; a smaller scratch splits less, and none splits not at all, whatever
 * the schedule workspace holds. */
KT_TEST(plan_scratch_buffer)
{
    kiln_ctx *ctx = KT_CTX(kt_tmpdir(), 0);
    KT_REQUIRE(ctx);
    batch *b = NULL;
    kiln_batch_shape sh;
    kiln_plan *pl = long_decode(ctx, &b, &sh);
    KT_REQUIRE(pl);
    size_t full = 0, sched = 0, scratch = 0;
    KT_OK(kiln_plan_workspace_size(pl, 1, 1, &full), "size");
    KT_OK(kiln_plan_workspace_sizes(pl, 1, 1, &sched, &scratch), "sizes");
    KT_CHECK(sched > 0 && scratch > 0 && sched % 256 == 0);
    KT_CHECK(sched + scratch == full);
    size_t x = 1, y = 1;
    KT_STATUS(kiln_plan_workspace_sizes(pl, 1, 1, NULL, &y), KILN_STATUS_INVALID_ARGUMENT,
              "NULL size");
    KT_STATUS(kiln_plan_workspace_sizes(pl, -1, 1, &x, &y), KILN_STATUS_INVALID_ARGUMENT,
              "negative batch");
    KT_CHECK(x == 0 && y == 0);
    KT_CHECK(strstr(kiln_ctx_errmsg(ctx), "batch=-1") != NULL);

    kiln_plan_info one, two;
    KT_OK(kiln_plan_schedule(pl, &sh, 0, full, NULL), kiln_ctx_errmsg(ctx));
    kiln_plan_describe(pl, &one);
    kiln__plan_layout lay1, lay2;
    kiln__plan_last_layout(pl, &lay1);
    int io, ro, to;
    const size_t n = lay1.uploaded / sizeof(int);
    int *first = malloc(lay1.uploaded);
    KT_REQUIRE(first);
    memcpy(first, kiln__plan_last_schedule(pl, &io, &ro, &to), lay1.uploaded);
    KT_OK(kiln_plan_schedule_scratch(pl, &sh, 0, sched, 0, scratch, NULL), kiln_ctx_errmsg(ctx));
    kiln_plan_describe(pl, &two);
    kiln__plan_last_layout(pl, &lay2);
    KT_EQ_INT(two.items, one.items);
    KT_EQ_INT(two.split_items, one.split_items);
    KT_EQ_INT(two.merge_tasks, one.merge_tasks);
    KT_CHECK(lay2.uploaded == lay1.uploaded && lay2.int_bytes == sched);
    KT_CHECK(memcmp(first, kiln__plan_last_schedule(pl, &io, &ro, &to), n * sizeof(int)) == 0);
    free(first);

    /* less scratch: never more splits, and some size fewer; no scratch: none, with a schedule
     * workspace of any size */
    int last = one.split_items, middle = 0;
    for (size_t sc = scratch / 2; sc >= 4096; sc /= 2) {
        KT_OK(kiln_plan_schedule_scratch(pl, &sh, 0, sched, 0, sc, NULL), kiln_ctx_errmsg(ctx));
        kiln_plan_describe(pl, &two);
        KT_CHECK(two.split_items <= last);
        middle |= two.split_items > 1 && two.split_items < one.split_items;
        last = two.split_items;
    }
    KT_CHECK(middle);
    KT_OK(kiln_plan_schedule_scratch(pl, &sh, 0, 1u << 30, 0, 0, NULL), kiln_ctx_errmsg(ctx));
    kiln_plan_describe(pl, &two);
    KT_EQ_INT(two.split_items, 0);
    KT_EQ_INT(two.items, 1);
    kiln_plan_destroy(pl);
    free(b);
    kiln_ctx_destroy(ctx);
}

/* fixed_split: a request's items do not depend on the rest of the batch. */
KT_TEST(plan_fixed_split_invariant)
{
    kiln_ctx *ctx = KT_CTX(kt_tmpdir(), 0);
    KT_REQUIRE(ctx);
    kiln_kernel *k = compile(ctx, "op=decode dtype=bf16 head_dim=128 group=4 kv=paged");
    KT_REQUIRE(k);
    kiln_plan_opts o = {0};
    o.num_qo_heads = 32;
    o.page_size = 16;
    o.fixed_split = 1000; /* rounded up to the 128-key granule: 1024 */
    o.max_total_kv = 1 << 22;
    kiln_plan *pl = NULL;
    KT_OK(kiln__plan_create_host(k, &o, SMS, 1, &pl), "plan host");
    batch *b = calloc(1, sizeof *b);
    unsigned seed = 3;
    int ranges_alone[64][2], n_alone = 0;
    for (int trial = 0; trial < 3; trial++) {
        b->B = trial == 0 ? 1 : 50 + trial * 30;
        for (int r = 0; r < b->B; r++) b->kv[r] = (int)(rnd(&seed) % 9000);
        b->kv[trial == 0 ? 0 : 7] = 5000; /* the request we follow */
        build(b, 1, 16);
        kiln_batch_shape sh = shape_of(b, 1);
        KT_OK(kiln_plan_schedule(pl, &sh, 0, 0, NULL), kiln_ctx_errmsg(ctx));
        int io, ro, to, n = 0, ranges[64][2] = {{0}};
        const int *w = kiln__plan_last_schedule(pl, &io, &ro, &to);
        for (int i = 0; i < w[0]; i++) {
            const int *it = w + io + i * ITEM_W;
            if (it[0] != (trial == 0 ? 0 : 7) || n == 64) continue;
            ranges[n][0] = it[2];
            ranges[n][1] = it[3];
            n++;
        }
        if (trial == 0) {
            memcpy(ranges_alone, ranges, sizeof ranges);
            n_alone = n;
            KT_EQ_INT(n, 5); /* 5000 keys in chunks of 1024 */
        } else {
            KT_EQ_INT(n, n_alone);
            KT_CHECK(!memcmp(ranges, ranges_alone, sizeof(int) * 2 * (size_t)n));
        }
    }
    kiln_plan_destroy(pl);
    free(b);
    kiln_ctx_destroy(ctx);
}

/* Degenerate batches: empty, zero-length requests, rows without keys; bad arrays refused with
 * the request named. */
KT_TEST(plan_degenerate_and_refused)
{
    kiln_ctx *ctx = KT_CTX(kt_tmpdir(), 0);
    KT_REQUIRE(ctx);
    kiln_kernel *kd = compile(ctx, "op=decode dtype=bf16 head_dim=128 group=4 kv=paged");
    kiln_kernel *kp =
        compile(ctx, "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal kv=paged");
    KT_REQUIRE(kd && kp);
    kiln_plan_opts o = {0};
    o.num_qo_heads = 32;
    o.page_size = 16;
    kiln_plan *pd = NULL, *pp = NULL;
    KT_OK(kiln__plan_create_host(kd, &o, SMS, 1, &pd), "plan host");
    KT_OK(kiln__plan_create_host(kp, &o, SMS, 2, &pp), "plan host");
    batch *b = calloc(1, sizeof *b);
    kiln_batch_shape sh = {0};
    KT_OK(kiln_plan_schedule(pd, &sh, 0, 0, NULL), "empty batch");
    kiln_plan_info info;
    kiln_plan_describe(pd, &info);
    KT_EQ_INT(info.items, 0);

    /* zero-length requests: decode gets one empty item each (it writes o = 0, lse = -inf) */
    b->B = 3;
    b->kv[0] = 0;
    b->kv[1] = 37;
    b->kv[2] = 0;
    b->qo[0] = 5;
    b->qo[1] = 0;
    b->qo[2] = 0;
    build(b, 1, 16);
    sh = shape_of(b, 1);
    KT_OK(kiln_plan_schedule(pd, &sh, 0, 0, NULL), kiln_ctx_errmsg(ctx));
    check_schedule(pd, b, 1, 1, 0, "decode with empty requests");
    kiln_plan_describe(pd, &info);
    KT_EQ_INT(info.items, 3);
    sh = shape_of(b, 0);
    KT_OK(kiln_plan_schedule(pp, &sh, 0, 0, NULL), kiln_ctx_errmsg(ctx));
    check_schedule(pp, b, 0, kp->cfg.block_m, 1, "prefill with rows but no keys");
    kiln_plan_describe(pp, &info);
    KT_EQ_INT(info.items, 1); /* request 0's tile; requests 1 and 2 have no rows */

    /* refusals name the request and the value */
    b->last[1] = 17;
    sh = shape_of(b, 1);
    KT_STATUS(kiln_plan_schedule(pd, &sh, 0, 0, NULL), KILN_STATUS_INVALID_ARGUMENT, "last page");
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "request 1: kv_last_page_len=17 must be in 1..page_size=16");
    build(b, 1, 16);
    b->kv_indptr[3] = 1; /* 0, 0, 3, 1 */
    KT_STATUS(kiln_plan_schedule(pd, &sh, 0, 0, NULL), KILN_STATUS_INVALID_ARGUMENT, "indptr");
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "request 2: kv_indptr decreases (3 then 1)");
    build(b, 1, 16);
    b->qo_indptr[0] = 2;
    sh = shape_of(b, 0);
    KT_STATUS(kiln_plan_schedule(pp, &sh, 0, 0, NULL), KILN_STATUS_INVALID_ARGUMENT, "qo indptr");
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "must be 0");
    sh.batch = -1;
    KT_STATUS(kiln_plan_schedule(pp, &sh, 0, 0, NULL), KILN_STATUS_INVALID_ARGUMENT,
              "negative batch");
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "batch=-1 < 0");
    KT_STATUS(kiln_plan_schedule(pp, NULL, 0, 0, NULL), KILN_STATUS_INVALID_ARGUMENT, "NULL shape");

    /* graph mode bounds */
    kiln_plan *pg = NULL;
    o.max_batch = 2;
    KT_OK(kiln__plan_create_host(kd, &o, SMS, 1, &pg), "plan host");
    build(b, 1, 16);
    sh = shape_of(b, 1);
    KT_STATUS(kiln_plan_schedule(pg, &sh, 0, 0, NULL), KILN_STATUS_INVALID_ARGUMENT,
              "over max_batch");
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "batch=3 exceeds the plan's max_batch=2");
    sh.batch = 2;
    KT_OK(kiln_plan_schedule(pg, &sh, 0, 0, NULL), kiln_ctx_errmsg(ctx));
    kiln_plan_describe(pg, &info);
    KT_CHECK(info.grid >= info.items && info.grid > 2); /* padded for any batch up to 2 */
    size_t s1 = 0, s2 = 0;
    KT_OK(kiln_plan_workspace_size(pg, 1, 1, &s1), "size");
    KT_OK(kiln_plan_workspace_size(pg, 2, 2, &s2), "size");
    KT_CHECK(s1 == s2 && s1 > 0); /* graph mode: the bound's layout */

    /* a non-batch kernel is refused */
    kiln_kernel *ks = compile(ctx, "op=decode dtype=bf16 head_dim=128 group=4");
    kiln_plan *bad = NULL;
    KT_STATUS(kiln_plan_create(ks, &o, &bad), KILN_STATUS_INVALID_ARGUMENT, "single kernel");
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "is not a batch kernel");
    kiln_plan_destroy(pg);
    kiln_plan_destroy(pd);
    kiln_plan_destroy(pp);
    free(b);
    kiln_ctx_destroy(ctx);
}

/* The fused merge's counters, on both decode families (G 4 on tensor cores, G 1 and fp8 G 4 on
 * CUDA cores) and a prefill (none): a batch of odd lengths cut by fixed_split and by the
 * planner, in eager and graph mode. Between schedules the staging buffer's counter words are
 * overwritten with garbage (what an older schedule or a pinned buffer may hold): every
 * schedule still uploads its tasks' counters as 0. The default (the merge kernel) and the
 * prefill lay out none. */
KT_TEST(plan_fused_merge_counters)
{
    static const char *const specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
        "op=decode dtype=bf16 head_dim=128 group=1 kv=paged lse=1",
        "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=64 group=4 kv=ragged",
        "op=prefill dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
    };
    static const int lens[5] = {1, 17, 1000, 4097, 0};
    for (int fused = 0; fused < 2; fused++) {
        /* a context of its own per KILN_TUNE: the memo is keyed by the variant alone */
        kiln_ctx *ctx = KT_CTX(kt_tmpdir(), 0);
        KT_REQUIRE(ctx);
        for (int si = 0; si < 4; si++) {
            /* KILN_TUNE merge=1 for the decode kernels (a prefill refuses it) */
            if (fused && !strncmp(specs[si], "op=decode", 9)) setenv("KILN_TUNE", "merge=1", 1);
            kiln_kernel *k = compile(ctx, specs[si]);
            unsetenv("KILN_TUNE");
            if (!k) continue;
            const int decode = k->v.op == KILN_OP_DECODE, H = 8;
            KT_EQ_INT(k->cfg.fused_merge, decode && fused);
            for (int mode = 0; mode < 4; mode++) { /* planner / fixed split, eager / graph */
                batch *b = calloc(1, sizeof *b);
                KT_REQUIRE(b);
                b->B = 5;
                for (int r = 0; r < 5; r++) {
                    b->kv[r] = lens[r];
                    b->qo[r] = decode ? 1 : 1 + lens[r] % 37;
                }
                build(b, k->v.kv == KILN_KV_PAGED, 16);
                kiln_plan_opts o = {0};
                o.num_qo_heads = H;
                o.page_size = 16;
                o.fixed_split = mode & 1 ? 256 : 0;
                o.max_total_kv = mode & 1 ? 1 << 16 : 0;
                o.max_batch = mode & 2 ? 8 : 0;
                o.max_qo_tokens = mode & 2 ? 512 : 0;
                kiln_plan *pl = NULL;
                KT_OK(kiln__plan_create_host(k, &o, SMS, decode ? 1 : 2, &pl), "plan host");
                kiln_batch_shape sh = shape_of(b, decode);
                char what[160];
                for (int again = 0; again < 2; again++) {
                    snprintf(what, sizeof what, "%s merge=%d mode %d schedule %d", specs[si], fused,
                             mode, again);
                    if (kiln_plan_schedule(pl, &sh, 0, 0, NULL) != KILN_STATUS_OK) {
                        kt_fail(__FILE__, __LINE__, "%s: %s", what, kiln_ctx_errmsg(ctx));
                        break;
                    }
                    check_schedule(pl, b, decode, decode ? 1 : k->cfg.block_m, 0, what);
                    check_counters(pl, k, H, what);
                    kiln_plan_info info;
                    kiln_plan_describe(pl, &info);
                    if (decode) KT_CHECK(info.merge_tasks >= 1); /* 4097 keys are split */
                    /* garbage where the counters lie, for the next schedule to overwrite */
                    kiln__plan_layout lay;
                    kiln__plan_last_layout(pl, &lay);
                    int io, ro, to;
                    int *w = (int *)kiln__plan_last_schedule(pl, &io, &ro, &to);
                    for (int64_t c = 0; c < (int64_t)lay.task_bound * lay.scopes; c++)
                        w[lay.counters_off + c] = 0x5a5a5a5a;
                }
                kiln_plan_destroy(pl);
                free(b);
            }
        }
        kiln_ctx_destroy(ctx);
    }
}

/* NVRTC compiles the batch kernels for sm_80 and sm_90a without spills, except the 128-row
 * plain prefill kernels (jit/config.c: faster than the 64-row ones with up to ~170 B of spills
 * at 255 registers), held to 256 B, and the wgmma family's persistent grid, whose producer
 * spills 128-136 B at its 40 registers (its consumers none: params.h), held to 160 B. The batch
 * decode kernels compile both ways, with the merge kernel (the default) and merging their own
 * splits (KILN_TUNE merge=1, fused_merge) on both decode families: CUDA cores for fp8 KV with
 * RoPE, tensor cores for the rest (G 1, 4, 8, 16; 16-bit and fp8 KV). */
KT_TEST(plan_batch_kernels_compile)
{
    kiln_ctx *ctx = KT_CTX(kt_tmpdir(), 0), *ctx1 = KT_CTX(kt_tmpdir(), 0);
    KT_REQUIRE(ctx && ctx1);
    static const char *const specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged",
        "op=decode dtype=f16 head_dim=64 group=8 kv=ragged lse=1 logits=softcap window=1",
        "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=256 group=1 kv=paged",
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged rope=1",
        /* fp8 KV on the packed tensor-core decode, widened in registers */
        "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
        "op=decode q_dtype=f16 kv_dtype=e5m2 out_dtype=f16 head_dim=64 group=8 kv=ragged",
        "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=256 group=16 kv=paged "
        "logits=softcap",
        "op=decode dtype=bf16 head_dim=128 group=1 kv=ragged lse=1",
        "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=1 kv=paged rope=1",
        "op=decode dtype=bf16 head_dim=256 group=4 kv=paged lse=1",
        "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal kv=paged lse=1",
        "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal kv=ragged logits=softcap window=1",
        "op=prefill dtype=f16 head_dim=64 group=4 mask=causal kv=ragged lse=1 mask_data=bsr",
        "op=prefill q_dtype=f16 kv_dtype=e5m2 out_dtype=f16 head_dim=64 group=1 kv=ragged "
        "logits=alibi",
        "op=prefill dtype=bf16 head_dim=256 group=8 mask=causal kv=paged rope=1 window=1",
        /* few query tokens a request: decode's packed CTA, and the prefill rows past 16 rows */
        "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal kv=paged q_tokens=4",
        "op=prefill dtype=f16 head_dim=64 group=8 mask=causal kv=ragged logits=softcap window=1 "
        "lse=1 q_tokens=8",
        "op=prefill dtype=bf16 head_dim=256 group=4 mask=causal kv=paged rope=1 q_tokens=2",
        "op=prefill q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=16 kv=paged "
        "q_tokens=16",
        "op=merge dtype=bf16 head_dim=128",
    };
    const int n = (int)(sizeof specs / sizeof specs[0]);
    for (int i = 0; i < n; i++)
        for (int a = 0; a < 4; a++) { /* sm_90a, sm_80; decode: then both with merge=1 */
            kiln_variant v;
            KT_OK(kiln_variant_parse(specs[i], &v), kiln_errmsg());
            const int fused = a >= 2;
            if (fused && v.op != KILN_OP_DECODE) continue;
            if (fused) setenv("KILN_TUNE", "merge=1", 1);
            kiln_kernel *k = NULL; /* merge=1 in a context of its own: the memo is by variant */
            const kiln_status cst =
                kiln_kernel_compile(fused ? ctx1 : ctx, &v, a % 2 ? "sm_80" : "sm_90a", &k);
            kiln__config cfg;
            kiln__err e = {0};
            const kiln_status pst = kiln__config_pick(&v, a % 2 ? 80 : 90, &cfg, &e);
            unsetenv("KILN_TUNE");
            if (cst != KILN_STATUS_OK) {
                kt_fail(__FILE__, __LINE__, "%s: %s", specs[i],
                        kiln_ctx_errmsg(fused ? ctx1 : ctx));
                continue;
            }
            KT_OK(pst, e.msg);
            kiln_kernel_info info;
            kiln_kernel_describe(k, &info);
            KT_EQ_INT(cfg.fused_merge, fused);
            KT_EQ_INT(k->cfg.fused_merge, cfg.fused_merge); /* the kernel compiled is that one */
            /* fp8 KV decodes on tensor cores where its group packs (RoPE aside) */
            if (v.op == KILN_OP_DECODE &&
                (v.kv_dtype == KILN_DTYPE_E4M3 || v.kv_dtype == KILN_DTYPE_E5M2))
                KT_EQ_INT(cfg.pack, !v.rope);
            /* the wgmma producer's transforms (fp8 KV, RoPE) spill some of its state at 40
             * registers: loop-invariant words it reloads once a tile, outside the consumers */
            const int xform = cfg.wgmma && (v.rope || v.kv_dtype == KILN_DTYPE_E4M3 ||
                                            v.kv_dtype == KILN_DTYPE_E5M2);
            const int allowed = cfg.mt == 2 && v.op == KILN_OP_PREFILL ? 256
                                : xform                                ? 256
                                : cfg.wgmma && cfg.persist             ? 160
                                                                       : 0;
            if (info.spill_bytes > allowed)
                kt_fail(__FILE__, __LINE__, "%s (%s, mt=%d): %d bytes spilled (at most %d)",
                        specs[i], info.arch, cfg.mt, info.spill_bytes, allowed);
            /* ptxas' C7511 / C7515: it waited out every wgmma (no overlap) */
            if (cfg.wgmma && kt_wgmma_serialized(k) != 0)
                kt_fail(__FILE__, __LINE__, "%s (%s): ptxas serialized the wgmma instructions",
                        specs[i], info.arch);
        }
    kiln_ctx_destroy(ctx);
    kiln_ctx_destroy(ctx1);
}

/* Mask data in a batch: each request's bits start after the earlier requests' L_Q x L_KV
 * matrices and its bsr block rows after theirs (ceil(L_Q / bsr_r) each); a bsr plan without a
 * block shape is refused. */
KT_TEST(plan_mask_data_offsets)
{
    kiln_ctx *ctx = KT_CTX(kt_tmpdir(), 0);
    KT_REQUIRE(ctx);
    kiln_kernel *k =
        compile(ctx, "op=prefill dtype=bf16 head_dim=64 group=4 kv=ragged mask_data=bsr");
    KT_REQUIRE(k);
    kiln_plan_opts o = {0};
    o.num_qo_heads = 8;
    kiln_plan *pl = NULL;
    KT_STATUS(kiln__plan_create_host(k, &o, SMS, 2, &pl), KILN_STATUS_INVALID_ARGUMENT,
              "bsr without a block shape");
    KT_CONTAINS(kiln_errmsg(), "mask_data=bsr needs the block shape");
    KT_CHECK(pl == NULL);
    o.bsr_r = 3;
    o.bsr_c = 16;
    KT_OK(kiln__plan_create_host(k, &o, SMS, 2, &pl), kiln_errmsg());
    batch *b = calloc(1, sizeof *b);
    KT_REQUIRE(b);
    static const int qo[5] = {7, 0, 3, 1, 10}, kv[5] = {9, 4, 0, 130, 10};
    b->B = 5;
    for (int r = 0; r < 5; r++) {
        b->qo[r] = qo[r];
        b->kv[r] = kv[r];
    }
    build(b, 0, 16);
    kiln_batch_shape sh = shape_of(b, 0);
    KT_OK(kiln_plan_schedule(pl, &sh, 0, 0, NULL), kiln_ctx_errmsg(ctx));
    int io, ro, to;
    const int *w = kiln__plan_last_schedule(pl, &io, &ro, &to);
    static const long long bit0[5] = {0, 63, 63, 63, 193};
    static const int row0[5] = {0, 3, 3, 4, 5};
    for (int r = 0; r < 5; r++) {
        const int *q = w + ro + r * REQ_W;
        const long long got = (long long)(((uint64_t)(uint32_t)q[5] << 32) | (uint32_t)q[4]);
        if (got != bit0[r] || q[6] != row0[r])
            kt_fail(__FILE__, __LINE__, "request %d: bit0=%lld row0=%d, expected %lld and %d", r,
                    got, q[6], bit0[r], row0[r]);
    }
    kiln_plan_destroy(pl);
    free(b);
    kiln_ctx_destroy(ctx);
}

/* q_tokens (few query tokens a request): the spec, the packed mma.sync config (up to 16 rows
 * decode's one warp, more the 4-warp prefill rows; the group dividing them; never wgmma), the
 * refusals, and a plan that schedules up to q_tokens tokens a request and refuses one more. */
KT_TEST(plan_few_tokens)
{
    static const struct {
        int q_tokens, group, warps;
    } cases[] = {{1, 4, 1},  {4, 4, 1},  {8, 4, 4},  {16, 4, 4}, {2, 1, 1},
                 {16, 8, 4}, {1, 32, 4}, {2, 64, 4}, {4, 2, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char spec[256], back[512];
        snprintf(spec, sizeof spec,
                 "op=prefill dtype=bf16 head_dim=128 group=%d layout=nhd mask=causal window=0 "
                 "logits=none lse=1 kv=paged q_tokens=%d",
                 cases[i].group, cases[i].q_tokens);
        kiln_variant v;
        KT_OK(kiln_variant_parse(spec, &v), kiln_errmsg());
        KT_EQ_INT(v.q_tokens, cases[i].q_tokens);
        kiln_variant_format(&v, back, sizeof back);
        KT_EQ_STR(back, spec); /* canonical: q_tokens after kv (and rope) */
        kiln__config cfg;
        kiln__err e = {0};
        KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
        KT_EQ_INT(cfg.pack, 1);
        KT_EQ_INT(cfg.wgmma, 0);
        KT_EQ_INT(cfg.warps, cases[i].warps);
        KT_EQ_INT(cfg.block_m % v.group, 0);
        KT_OK(kiln__config_pick(&v, 80, &cfg, &e), e.msg);
        KT_EQ_INT(cfg.pack, 1);
    }
    kiln_variant v;
    KT_STATUS(kiln_variant_parse("op=decode kv=paged q_tokens=4", &v), KILN_STATUS_UNSUPPORTED,
              "q_tokens");
    KT_CONTAINS(kiln_errmsg(), "only prefill batches");
    KT_STATUS(kiln_variant_parse("op=prefill q_tokens=4", &v), KILN_STATUS_UNSUPPORTED, "q_tokens");
    KT_STATUS(kiln_variant_parse("op=prefill kv=ragged group=3 q_tokens=4", &v),
              KILN_STATUS_UNSUPPORTED, "group=3");
    KT_CONTAINS(kiln_errmsg(), "divides 64");
    KT_STATUS(kiln_variant_parse("op=prefill kv=ragged mask_data=bitmask q_tokens=2", &v),
              KILN_STATUS_UNSUPPORTED, "mask data");
    KT_STATUS(kiln_variant_parse("op=prefill kv=ragged q_tokens=3", &v), KILN_STATUS_PARSE,
              "q_tokens");
    KT_STATUS(kiln_variant_parse("op=merge q_tokens=1", &v), KILN_STATUS_UNSUPPORTED, "q_tokens");

    kiln_ctx *ctx = KT_CTX(kt_tmpdir(), 0);
    KT_REQUIRE(ctx);
    kiln_kernel *k =
        compile(ctx, "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal kv=paged q_tokens=4");
    KT_REQUIRE(k);
    KT_EQ_INT(k->v.q_tokens, 4); /* the kernel compiled is that variant's */
    KT_EQ_INT(k->cfg.pack, 1);
    kiln_plan_opts o = {0};
    o.num_qo_heads = 32;
    o.page_size = 16;
    o.max_total_kv = 1 << 22;
    kiln_plan *pl = NULL;
    KT_OK(kiln__plan_create_host(k, &o, SMS, 4, &pl), "plan host");
    batch *b = calloc(1, sizeof *b);
    b->B = 64;
    for (int r = 0; r < b->B; r++) {
        b->qo[r] = r % 5; /* 0 .. 4 tokens */
        b->kv[r] = 4096 + r;
    }
    build(b, 1, 16);
    kiln_batch_shape sh = shape_of(b, 0);
    KT_OK(kiln_plan_schedule(pl, &sh, 0, 0, NULL), kiln_ctx_errmsg(ctx));
    kiln_plan_info info;
    KT_OK(kiln_plan_describe(pl, &info), kiln_ctx_errmsg(ctx));
    /* one query tile a request with tokens (4 tokens x 4 heads = 16 rows: 51 of the 64), each
     * into one item or more; the schedule covers them (check_schedule) */
    KT_CHECK(info.items >= 51);
    check_schedule(pl, b, 0, k->cfg.block_m / 4, 1, "q_tokens=4"); /* tokens a tile */
    b->qo[17] = 5;
    build(b, 1, 16);
    sh = shape_of(b, 0);
    KT_STATUS(kiln_plan_schedule(pl, &sh, 0, 0, NULL), KILN_STATUS_INVALID_ARGUMENT,
              "a 5-token request");
    KT_CONTAINS(kiln_ctx_errmsg(ctx),
                "request 17 has 5 query tokens, more than the kernel's q_tokens=4");
    free(b);
    kiln_plan_destroy(pl);
    kiln_ctx_destroy(ctx);
}

/* The run-time values of a batch run's parameter block (kiln__batch_prepare, which
 * kiln_plan_run fills it with): the LSE's unit from kiln_params.lse_base2 (ln 2 by default, 1
 * for base 2; anything else refused with the value), and V's scale, O's factor, for 16-bit
 * K/V too (FlashInfer's v_scale multiplies o; 0 means 1), with fp8 e4m3's unit where the K/V
 * are fp8; a v_scale that is not finite and > 0 is refused, naming it. */
KT_TEST(plan_run_values)
{
    kiln_ctx *ctx = KT_CTX(kt_tmpdir(), 0);
    KT_REQUIRE(ctx);
    kiln_kernel *k16 = compile(ctx, "op=decode dtype=bf16 head_dim=128 group=4 kv=ragged lse=1");
    kiln_kernel *k8 = compile(ctx, "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 "
                                   "head_dim=128 group=4 kv=ragged lse=1");
    KT_REQUIRE(k16 && k8);
    /* the block is filled on the host: the kernels pass for loaded while it is (no device call
     * follows; they go back to inspection-only before the context frees them) */
    k16->loaded = k8->loaded = 1;
    kiln_batch_args a = {0};
    a.q = a.k = a.v = a.o = a.lse = 0x10000;
    kiln_launch_params p;
    kiln__err e;
    KT_OK(kiln__batch_prepare(k16, &a, 32, 0, 0, 0, &p, &e), e.msg);
    KT_CHECK(p.lse_unit == 0.6931471805599453f && p.v_scale == 1.0f);
    a.params.lse_base2 = 1;
    a.params.v_scale = 0.5f;
    KT_OK(kiln__batch_prepare(k16, &a, 32, 0, 0, 0, &p, &e), e.msg);
    KT_CHECK(p.lse_unit == 1.0f && p.v_scale == 0.5f);
    KT_OK(kiln__batch_prepare(k8, &a, 32, 0, 0, 0, &p, &e), e.msg);
    KT_CHECK(p.lse_unit == 1.0f && p.v_scale == 0.5f * 256.f); /* e4m3's unit, device.cuh */
    a.params.lse_base2 = 2;
    KT_STATUS(kiln__batch_prepare(k16, &a, 32, 0, 0, 0, &p, &e), KILN_STATUS_INVALID_ARGUMENT,
              "lse_base2=2");
    KT_CONTAINS(e.msg, "lse_base2 is 0 (natural log) or 1 (base 2), got 2");
    a.params.lse_base2 = 0;
    const float bad[] = {-1.0f, INFINITY, NAN};
    for (int i = 0; i < 3; i++) {
        a.params.v_scale = bad[i];
        KT_STATUS(kiln__batch_prepare(k16, &a, 32, 0, 0, 0, &p, &e), KILN_STATUS_INVALID_ARGUMENT,
                  "a bad v_scale");
        KT_CONTAINS(e.msg, "v_scale must be finite and > 0");
    }
    k16->loaded = k8->loaded = 0;
    kiln_ctx_destroy(ctx);
}

/* kiln__job_heads, the persistent wgmma grid's sections of heads: whole KV heads whose K and V
 * (every request's keys) fit half of L2, 0 where all heads fit or off the persistent grid;
 * counted in job heads (a packed job takes a KV head's G heads); $KILN_JOB_HEADS wins. */
KT_TEST(plan_job_heads)
{
    kiln_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.l2_bytes = 50 << 20; /* an H100's */
    ctx.job_heads_env = -1;
    static kiln_kernel k; /* large: not on the stack */
    memset(&k, 0, sizeof k);
    k.ctx = &ctx;
    KT_REQUIRE(
        kiln_variant_parse("op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal",
                           &k.v) == KILN_STATUS_OK);
    k.cfg.wgmma = 1;
    k.cfg.persist = 2;
    /* 16384 keys x 128 x 2 (K, V) x 2 bytes = 8 MiB a KV head: 3 of 25 MiB, so 12 query heads */
    KT_EQ_INT(kiln__job_heads(&k, 16384, 32), 12);
    KT_EQ_INT(kiln__job_heads(&k, 4096, 32), 0);   /* 2 MiB each: all 8 fit */
    KT_EQ_INT(kiln__job_heads(&k, 100000, 32), 4); /* 49 MiB each: one KV head a section */
    KT_EQ_INT(kiln__job_heads(&k, 0, 32), 0);
    k.cfg.pack = 1; /* a job takes a KV head's 4 heads */
    KT_EQ_INT(kiln__job_heads(&k, 16384, 32), 3);
    k.cfg.pack = 0;
    KT_REQUIRE(kiln_variant_parse("op=prefill q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 "
                                  "head_dim=128 group=4 kv=paged mask=causal",
                                  &k.v) == KILN_STATUS_OK);
    KT_EQ_INT(kiln__job_heads(&k, 16384, 32), 24); /* 4 MiB each: 6 of 8 fit */
    KT_EQ_INT(kiln__job_heads(&k, 32768, 32), 12);
    k.cfg.persist = 0; /* a CTA a job: KV-head-major already (wg_flat_job) */
    KT_EQ_INT(kiln__job_heads(&k, 32768, 32), 0);
    k.cfg.persist = 2;
    ctx.l2_bytes = 0; /* unknown */
    KT_EQ_INT(kiln__job_heads(&k, 32768, 32), 0);
    ctx.job_heads_env = 5;
    KT_EQ_INT(kiln__job_heads(&k, 32768, 32), 5);
}
