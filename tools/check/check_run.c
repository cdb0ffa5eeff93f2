/*
 * check_run.c — the device half of the batch checker: uploads stored batches, plans and runs
 * them (directly, or captured once in a CUDA graph and replayed twice after each re-plan, so
 * that whatever a run leaves in the workspace for the next, such as the fused merge's
 * counters, is checked too), times runs with CUDA events, and kiln_check_batch_run on it (the
 * pair checks are in check_pair.c). See check.h.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_batch.h"

#define CU_RET(call, what) KILN__CHECK_CU_RET("check batch", call, what)
#define KILN_RET(call)     KILN__CHECK_CALL_RET(call)

/* The CUDA graph entry points, resolved here from the libcuda the runtime loaded (by the exact
 * versioned symbols cuda.h names, as runtime/cu.c does) so the library's driver table stays as it
 * is. */
#define GRAPH_FUNCS(X)                                                                             \
    X(cuStreamBeginCapture)                                                                        \
    X(cuStreamEndCapture)                                                                          \
    X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphDestroy) X(cuGraphExecDestroy)

typedef struct graph_api {
#define GRAPH_MEMBER(name) __typeof__(&name) name;
    GRAPH_FUNCS(GRAPH_MEMBER)
#undef GRAPH_MEMBER
} graph_api;

#define GRAPH_STR2(x) #x
#define GRAPH_STR(x)  GRAPH_STR2(x)

/* Fill g; KILN_STATUS_NO_DEVICE when libcuda (already loaded by the context) lacks an entry. */
static kiln_status graph_api_get(graph_api *g, kiln__err *e)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        return kiln__fail(e, KILN_STATUS_NO_DEVICE, "check batch: libcuda.so.1 is not loaded");
#define GRAPH_RESOLVE(name)                                                                        \
    {                                                                                              \
        void *fn = dlsym(lib, GRAPH_STR(name));                                                    \
        if (!fn) {                                                                                 \
            dlclose(lib);                                                                          \
            return kiln__fail(e, KILN_STATUS_NO_DEVICE, "check batch: CUDA driver lacks %s",       \
                              GRAPH_STR(name));                                                    \
        }                                                                                          \
        memcpy(&g->name, &fn, sizeof fn);                                                          \
    }
    GRAPH_FUNCS(GRAPH_RESOLVE)
#undef GRAPH_RESOLVE
    dlclose(lib); /* drops only the reference NOLOAD took; the runtime's handle keeps it loaded */
    return KILN_STATUS_OK;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

uint64_t kiln__cb_seed(uint64_t s)
{
    if (s) return s;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^ 0x6b696c6eull;
}

void kiln__cb_out_free(cb_out *o)
{
    free(o->o);
    free(o->lse);
    memset(o, 0, sizeof *o);
}

/* Device buffers of a run, sized for the largest batch. */
typedef struct dev {
    CUdeviceptr q, k, v, o, lse, indices, rope, slopes, ws;
    kiln__check_guard bits, bsr_ip, bsr_ix; /* guarded (check_guard.c): no read past them */
    size_t ws_bytes;
    /* scratch mode: the shared partial states, and the second plan's workspace and outputs */
    CUdeviceptr scratch, ws2, o2, lse2;
    size_t scratch_bytes, ws2_bytes;
} dev;

/* The largest of each size over the batches of one run. */
typedef struct run_max {
    int B, Q, KV, pool, pages, bsr_rows, bsr_nnz;
    size_t bits;
} run_max;

/* One kiln__cb_run: its batches stored, the buffers, the plan, the graph and the timing. */
typedef struct run_state {
    kiln_ctx *ctx;
    const kiln__cu *cu;
    kiln_kernel *k;
    const cb_run_opts *ro;
    const cb_logical *const *Ls;
    int n, H, D;
    run_max mx;
    cb_store S[2];
    size_t q_elems, kv_elems, lse_bytes, esize;
    dev d;
    kiln_plan *plan;
    kiln_plan *plan2; /* scratch mode: the plan that shares the scratch buffer */
    CUstream stream;
    CUgraph graph;
    CUgraphExec exec;
    CUevent ev[2];
    uint16_t *o_host; /* one stored o, copied back */
    double *ms;       /* [time_reps] */
    graph_api ga;
} run_state;

static void fill_args(const cb_logical *L, const cb_store *S, const dev *d, int graph_sized,
                      kiln_batch_args *a)
{
    memset(a, 0, sizeof *a);
    a->q = d->q;
    a->k = d->k;
    a->v = d->v;
    a->o = d->o;
    a->lse = L->v.lse ? d->lse : 0;
    /* no pages at all: none passed, as a caller of an all-empty batch would (eager mode) */
    a->kv_indices =
        L->v.kv == KILN_KV_PAGED && (L->ix.pages_used > 0 || graph_sized) ? d->indices : 0;
    a->rope_offsets = L->has_rope_off ? d->rope : 0;
    if (S->pass_strides) {
        a->q_stride_n = S->qs_n;
        a->q_stride_h = S->qs_h;
        a->o_stride_n = S->os_n;
        a->o_stride_h = S->os_h;
        a->k_stride_page = a->v_stride_page = L->v.kv == KILN_KV_PAGED ? S->ks_page : 0;
        a->k_stride_n = a->v_stride_n = S->ks_n;
        a->k_stride_h = a->v_stride_h = S->ks_h;
    }
    a->workspace = d->ws;
    a->workspace_bytes = d->ws_bytes;
    a->mask_bits = d->bits.ptr;
    a->bsr_indptr = d->bsr_ip.ptr;
    a->bsr_indices = d->bsr_ix.ptr;
    kiln__check_params(&a->params, L->sm_scale, L->softcap, L->window_left, d->slopes);
    a->params.k_scale = L->k_scale;
    a->params.v_scale = L->v_scale;
    a->params.rope_scale = L->rope_scale;
    a->params.rope_theta = L->rope_theta;
}

static void max_int(int *m, int x)
{
    if (x > *m) *m = x;
}

/* The batches stored with one set of strides (for the largest), the host outputs allocated. */
static kiln_status run_store(run_state *rs, cb_out *outs, kiln__err *e)
{
    run_max *m = &rs->mx;
    for (int i = 0; i < rs->n; i++) {
        const cb_logical *L = rs->Ls[i];
        const kiln_check_index *x = &L->ix;
        if (L->mask_bytes > m->bits) m->bits = L->mask_bytes;
        max_int(&m->bsr_rows, L->bsr_rows);
        max_int(&m->bsr_nnz, L->bsr_nnz);
        max_int(&m->B, x->batch);
        max_int(&m->Q, x->total_qo);
        max_int(&m->KV, x->total_kv);
        max_int(&m->pool, x->pool_pages);
        max_int(&m->pages, x->pages_used);
    }
    for (int i = 0; i < rs->n; i++) {
        kiln_status st = kiln__cb_store(rs->Ls[i], rs->ro->strided, m->KV, m->pool, &rs->S[i]);
        if (st) return kiln__fail(e, st, "check batch: out of host memory for the stored batch");
        if (rs->S[i].q_elems > rs->q_elems) rs->q_elems = rs->S[i].q_elems;
        if (rs->S[i].kv_elems > rs->kv_elems) rs->kv_elems = rs->S[i].kv_elems;
    }
    rs->lse_bytes = sizeof(float) * ((size_t)(m->Q > 0 ? m->Q : 1) * rs->H + 4);
    rs->esize = (size_t)rs->S[0].esize;
    rs->o_host = malloc(rs->q_elems * 2);
    for (int i = 0; i < rs->n; i++) {
        const size_t rows = (size_t)rs->Ls[i]->ix.total_qo * rs->H;
        outs[i].o = malloc(sizeof(uint16_t) * (rows * rs->D + 1));
        outs[i].lse = malloc(sizeof(float) * (rows + 1));
        if (!outs[i].o || !outs[i].lse) rs->o_host = (free(rs->o_host), NULL);
    }
    if (!rs->o_host) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "check batch: out of host memory");
    return KILN_STATUS_OK;
}

/* The device buffers, sized for the largest batch; the slopes uploaded. */
static kiln_status run_alloc(run_state *rs, kiln__err *e)
{
    const kiln__cu *cu = rs->cu;
    const cb_logical *L0 = rs->Ls[0];
    const run_max *m = &rs->mx;
    dev *d = &rs->d;
    const size_t H = (size_t)rs->H;
    CU_RET(cu->cuMemAlloc(&d->q, rs->q_elems * 2), "alloc q");
    CU_RET(cu->cuMemAlloc(&d->o, rs->q_elems * 2), "alloc o");
    CU_RET(cu->cuMemAlloc(&d->k, rs->kv_elems * rs->esize), "alloc k");
    CU_RET(cu->cuMemAlloc(&d->v, rs->kv_elems * rs->esize), "alloc v");
    CU_RET(cu->cuMemAlloc(&d->lse, rs->lse_bytes), "alloc lse");
    CU_RET(cu->cuMemAlloc(&d->indices, sizeof(int) * ((size_t)m->pages + 1)), "alloc kv_indices");
    CU_RET(cu->cuMemAlloc(&d->rope, sizeof(int) * ((size_t)m->B + 1)), "alloc rope offsets");
    CU_RET(cu->cuMemAlloc(&d->slopes, sizeof(float) * H), "alloc slopes");
    CU_RET(cu->cuMemcpyHtoD(d->slopes, L0->slopes, sizeof(float) * H), "copy slopes");
    /* the mask data of the largest batch, exactly */
    kiln_status st = KILN_STATUS_OK;
    if (L0->v.mask_data == KILN_MASK_DATA_BITMASK)
        st = kiln__check_guard_alloc(cu, rs->ctx->dev, m->bits, 1, &d->bits, e);
    if (L0->v.mask_data == KILN_MASK_DATA_BSR &&
        !(st = kiln__check_guard_alloc(cu, rs->ctx->dev, sizeof(int) * ((size_t)m->bsr_rows + 1), 4,
                                       &d->bsr_ip, e)))
        st = kiln__check_guard_alloc(cu, rs->ctx->dev, sizeof(int) * (size_t)m->bsr_nnz, 4,
                                     &d->bsr_ix, e);
    return st;
}

/* One plan for every batch (graph mode: bounds for the largest), its workspace, the stream. */
static kiln_status run_plan(run_state *rs, kiln__err *e)
{
    kiln_ctx *ctx = rs->ctx;
    const cb_logical *L0 = rs->Ls[0];
    const run_max *m = &rs->mx;
    kiln_plan_opts po = rs->ro->po;
    po.num_qo_heads = rs->H;
    for (int i = 0; po.fixed_split > 0 && i < rs->n; i++) /* sizes the workspace for the splits */
        if (rs->Ls[i]->ix.total_kv > po.max_total_kv) po.max_total_kv = rs->Ls[i]->ix.total_kv;
    po.page_size = L0->ix.page_size;
    po.bsr_r = L0->bsr_r;
    po.bsr_c = L0->bsr_c;
    if (rs->ro->graph && po.max_batch < m->B) po.max_batch = m->B;
    if (rs->ro->graph && L0->v.op == KILN_OP_PREFILL && po.max_qo_tokens < m->Q)
        po.max_qo_tokens = m->Q;
    KILN_RET(kiln_plan_create(rs->k, &po, &rs->plan));
    const int wsB = po.max_batch > m->B ? po.max_batch : m->B;
    const int wsQ = L0->v.op == KILN_OP_DECODE ? wsB
                    : po.max_qo_tokens > m->Q  ? po.max_qo_tokens
                                               : m->Q;
    dev *d = &rs->d;
    if (rs->ro->scratch) {
        /* the second plan: eager, the first half of each batch's requests */
        kiln_plan_opts po2 = po;
        po2.max_batch = po2.max_qo_tokens = 0;
        KILN_RET(kiln_plan_create(rs->k, &po2, &rs->plan2));
        KILN_RET(kiln_plan_workspace_sizes(rs->plan, wsB, wsQ, &d->ws_bytes, &d->scratch_bytes));
        size_t sched2 = 0, scratch2 = 0;
        KILN_RET(kiln_plan_workspace_sizes(rs->plan2, m->B, m->Q, &sched2, &scratch2));
        if (scratch2 > d->scratch_bytes) d->scratch_bytes = scratch2;
        d->ws2_bytes = sched2;
        CU_RET(rs->cu->cuMemAlloc(&d->scratch, d->scratch_bytes + 16), "alloc scratch");
        CU_RET(rs->cu->cuMemAlloc(&d->ws2, d->ws2_bytes + 16), "alloc second workspace");
        CU_RET(rs->cu->cuMemAlloc(&d->o2, rs->q_elems * 2), "alloc second o");
        CU_RET(rs->cu->cuMemAlloc(&d->lse2, rs->lse_bytes), "alloc second lse");
    } else {
        KILN_RET(kiln_plan_workspace_size(rs->plan, wsB, wsQ, &d->ws_bytes));
    }
    CU_RET(rs->cu->cuMemAlloc(&d->ws, d->ws_bytes ? d->ws_bytes : 16), "alloc workspace");
    if (rs->ro->graph)
        CU_RET(rs->cu->cuStreamCreate(&rs->stream, CU_STREAM_NON_BLOCKING), "create stream");
    return KILN_STATUS_OK;
}

/* o and lse poisoned (0xffff is NaN in f16 and bf16, 0xffffffff in f32), after whatever ran
 * before on any stream and before whatever runs next. */
static kiln_status run_poison(run_state *rs, kiln__err *e)
{
    const kiln__cu *cu = rs->cu;
    CU_RET(cu->cuCtxSynchronize(), "run before the poison");
    CU_RET(cu->cuMemsetD8(rs->d.o, 0xff, rs->q_elems * 2), "poison o");
    CU_RET(cu->cuMemsetD8(rs->d.lse, 0xff, rs->lse_bytes), "poison lse");
    CU_RET(cu->cuCtxSynchronize(), "poison");
    return KILN_STATUS_OK;
}

/* Batch i's stored inputs, page table, offsets and mask data uploaded; o and lse poisoned. */
static kiln_status run_upload(run_state *rs, int i, kiln__err *e)
{
    const kiln__cu *cu = rs->cu;
    const cb_logical *L = rs->Ls[i];
    const kiln_check_index *x = &L->ix;
    const cb_store *S = &rs->S[i];
    const dev *d = &rs->d;
    CU_RET(cu->cuMemcpyHtoD(d->q, S->q, S->q_elems * 2), "copy q");
    CU_RET(cu->cuMemcpyHtoD(d->k, S->k, S->kv_elems * rs->esize), "copy k");
    CU_RET(cu->cuMemcpyHtoD(d->v, S->v, S->kv_elems * rs->esize), "copy v");
    if (x->pages_used)
        CU_RET(cu->cuMemcpyHtoD(d->indices, x->page_ids, sizeof(int) * (size_t)x->pages_used),
               "copy kv_indices");
    if (x->batch)
        CU_RET(cu->cuMemcpyHtoD(d->rope, L->rope_off, sizeof(int) * (size_t)x->batch),
               "copy rope offsets");
    if (L->mask_bytes)
        CU_RET(cu->cuMemcpyHtoD(d->bits.ptr, L->mask_bits, L->mask_bytes), "copy mask bits");
    if (L->bsr_indptr) {
        CU_RET(cu->cuMemcpyHtoD(d->bsr_ip.ptr, L->bsr_indptr,
                                sizeof(int) * ((size_t)L->bsr_rows + 1)),
               "copy bsr_indptr");
        if (L->bsr_nnz)
            CU_RET(cu->cuMemcpyHtoD(d->bsr_ix.ptr, L->bsr_indices,
                                    sizeof(int) * (size_t)L->bsr_nnz),
                   "copy bsr_indices");
    }
    return run_poison(rs, e);
}

/* kiln_plan_schedule of batch i into the shared plan (host time and what it decided into out). */
static kiln_status run_replan(run_state *rs, int i, cb_out *out, kiln__err *e)
{
    kiln_ctx *ctx = rs->ctx;
    const cb_logical *L = rs->Ls[i];
    const kiln_check_index *x = &L->ix;
    kiln_batch_shape shape = {0};
    shape.batch = x->batch;
    shape.qo_indptr = L->v.op == KILN_OP_PREFILL ? x->qo_indptr : NULL;
    shape.kv_indptr = L->v.kv == KILN_KV_PAGED ? x->page_indptr : x->kv_indptr;
    shape.kv_last_page_len = L->v.kv == KILN_KV_PAGED ? x->last_page_len : NULL;
    const dev *d = &rs->d;
    double t0 = now_ms();
    if (rs->ro->scratch)
        KILN_RET(kiln_plan_schedule_scratch(rs->plan, &shape, d->ws, d->ws_bytes, d->scratch,
                                            d->scratch_bytes, rs->stream));
    else KILN_RET(kiln_plan_schedule(rs->plan, &shape, d->ws, d->ws_bytes, rs->stream));
    out->plan_ms = now_ms() - t0;
    KILN_RET(kiln_plan_describe(rs->plan, &out->info));
    return KILN_STATUS_OK;
}

/* Scratch mode: the second plan scheduled and run on the shared scratch buffer, over the first
 * half of batch i's requests (every index array's prefix), into outputs of its own; it
 * overwrites whatever partial states the checked plan left there. a: the checked batch's
 * arguments. */
static kiln_status run_second(run_state *rs, int i, const kiln_batch_args *a, kiln__err *e)
{
    if (!rs->ro->scratch) return KILN_STATUS_OK;
    kiln_ctx *ctx = rs->ctx;
    const cb_logical *L = rs->Ls[i];
    const kiln_check_index *x = &L->ix;
    const dev *d = &rs->d;
    kiln_batch_shape shape = {0};
    shape.batch = (x->batch + 1) / 2;
    shape.qo_indptr = L->v.op == KILN_OP_PREFILL ? x->qo_indptr : NULL;
    shape.kv_indptr = L->v.kv == KILN_KV_PAGED ? x->page_indptr : x->kv_indptr;
    shape.kv_last_page_len = L->v.kv == KILN_KV_PAGED ? x->last_page_len : NULL;
    KILN_RET(kiln_plan_schedule_scratch(rs->plan2, &shape, d->ws2, d->ws2_bytes, d->scratch,
                                        d->scratch_bytes, rs->stream));
    kiln_batch_args a2 = *a;
    a2.o = d->o2;
    a2.lse = a->lse ? d->lse2 : 0;
    a2.workspace = d->ws2;
    a2.workspace_bytes = d->ws2_bytes;
    KILN_RET(kiln_plan_run(rs->plan2, &a2, rs->stream));
    return KILN_STATUS_OK;
}

/* Run batch i: kiln_plan_run, or in graph mode the graph (captured from the first batch's run,
 * then replayed for every batch) twice, into poisoned outputs the second time: the second
 * launch runs on what the first left in the workspace, with no schedule between (the fused
 * merge must have put its counters back to 0), and its outputs are the ones checked. */
static kiln_status run_launch(run_state *rs, int i, const kiln_batch_args *a, kiln__err *e)
{
    kiln_ctx *ctx = rs->ctx;
    kiln_status st = run_second(rs, i, a, e);
    if (st) return st;
    if (!rs->ro->graph) {
        KILN_RET(kiln_plan_run(rs->plan, a, rs->stream));
        return KILN_STATUS_OK;
    }
    if (i == 0) {
        CU_RET(rs->ga.cuStreamBeginCapture(rs->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
               "begin capture");
        kiln_status run = kiln_plan_run(rs->plan, a, rs->stream);
        CUresult cr = rs->ga.cuStreamEndCapture(rs->stream, &rs->graph);
        if (run)
            return kiln__fail(e, run, "check batch: run under capture: %s", kiln_ctx_errmsg(ctx));
        CU_RET(cr, "end capture (did the run do something a graph cannot hold?)");
        CU_RET(rs->ga.cuGraphInstantiateWithFlags(&rs->exec, rs->graph, 0), "instantiate graph");
    }
    CU_RET(rs->ga.cuGraphLaunch(rs->exec, rs->stream), "launch graph");
    if ((st = run_poison(rs, e)) || (st = run_second(rs, i, a, e))) return st;
    CU_RET(rs->ga.cuGraphLaunch(rs->exec, rs->stream), "launch graph again");
    return KILN_STATUS_OK;
}

/* Batch i's o and lse back in logical order into out. */
static kiln_status run_download(run_state *rs, int i, cb_out *out, kiln__err *e)
{
    const kiln__cu *cu = rs->cu;
    const kiln_check_index *x = &rs->Ls[i]->ix;
    const cb_store *S = &rs->S[i];
    const int H = rs->H, D = rs->D;
    CU_RET(cu->cuCtxSynchronize(), "run batch");
    CU_RET(cu->cuMemcpyDtoH(rs->o_host, rs->d.o, S->o_elems * 2), "copy o back");
    if (x->total_qo)
        CU_RET(cu->cuMemcpyDtoH(out->lse, rs->d.lse, sizeof(float) * (size_t)x->total_qo * H),
               "copy lse back");
    for (int r = 0; r < x->total_qo; r++)
        for (int h = 0; h < H; h++)
            memcpy(out->o + ((size_t)r * H + h) * D, rs->o_host + r * S->os_n + h * S->os_h,
                   2 * (size_t)D);
    return KILN_STATUS_OK;
}

/* Time ro->time_reps runs (three warm-ups first) with CUDA events: median and fastest. */
static kiln_status run_time(run_state *rs, const kiln_batch_args *a, cb_out *out, kiln__err *e)
{
    kiln_ctx *ctx = rs->ctx;
    const kiln__cu *cu = rs->cu;
    const int reps = rs->ro->time_reps;
    rs->ms = malloc(sizeof(double) * (size_t)reps);
    if (!rs->ms) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "check batch: out of host memory");
    CU_RET(cu->cuEventCreate(&rs->ev[0], CU_EVENT_DEFAULT), "event");
    CU_RET(cu->cuEventCreate(&rs->ev[1], CU_EVENT_DEFAULT), "event");
    for (int t = -3; t < reps; t++) { /* three warm-up runs */
        CU_RET(cu->cuEventRecord(rs->ev[0], rs->stream), "event record");
        if (rs->exec) CU_RET(rs->ga.cuGraphLaunch(rs->exec, rs->stream), "launch graph");
        else KILN_RET(kiln_plan_run(rs->plan, a, rs->stream));
        CU_RET(cu->cuEventRecord(rs->ev[1], rs->stream), "event record");
        CU_RET(cu->cuEventSynchronize(rs->ev[1]), "timed run");
        float f = 0;
        cu->cuEventElapsedTime(&f, rs->ev[0], rs->ev[1]);
        if (t >= 0) rs->ms[t] = f;
    }
    qsort(rs->ms, (size_t)reps, sizeof *rs->ms, kiln__check_cmp_double);
    out->kernel_ms = rs->ms[reps / 2];
    out->min_ms = rs->ms[0];
    return KILN_STATUS_OK;
}

static void run_state_free(run_state *rs)
{
    const kiln__cu *cu = rs->cu;
    if (rs->ev[0]) cu->cuEventDestroy(rs->ev[0]);
    if (rs->ev[1]) cu->cuEventDestroy(rs->ev[1]);
    if (rs->exec) rs->ga.cuGraphExecDestroy(rs->exec);
    if (rs->graph) rs->ga.cuGraphDestroy(rs->graph);
    if (rs->stream) cu->cuStreamDestroy(rs->stream);
    kiln_plan_destroy(rs->plan);
    kiln_plan_destroy(rs->plan2);
    dev *d = &rs->d;
    CUdeviceptr *bufs[] = {&d->q,      &d->k,  &d->v,       &d->o,   &d->lse, &d->indices, &d->rope,
                           &d->slopes, &d->ws, &d->scratch, &d->ws2, &d->o2,  &d->lse2};
    for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++)
        if (*bufs[b]) cu->cuMemFree(*bufs[b]);
    kiln__check_guard_free(cu, &d->bits);
    kiln__check_guard_free(cu, &d->bsr_ip);
    kiln__check_guard_free(cu, &d->bsr_ix);
    for (int i = 0; i < 2; i++) kiln__cb_store_free(&rs->S[i]);
    free(rs->o_host);
    free(rs->ms);
}

kiln_status kiln__cb_run(kiln_ctx *ctx, kiln_kernel *k, const cb_logical *const *Ls, int n,
                         const cb_run_opts *ro, cb_out *outs, kiln__err *e)
{
    kiln_status st = KILN_STATUS_OK;
    run_state rs = {0};
    rs.ctx = ctx;
    rs.cu = ctx ? ctx->cu : NULL;
    rs.k = k;
    rs.ro = ro;
    rs.Ls = Ls;
    rs.n = n;
    for (int i = 0; i < n; i++) memset(&outs[i], 0, sizeof outs[i]);
    if (!rs.cu || !k || !k->loaded)
        return kiln__fail(e, KILN_STATUS_NO_DEVICE, "check batch: no GPU or kernel not loaded");
    if (n < 1 || n > 2)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "check batch: 1 or 2 batches per run");
    if ((st = kiln__ctx_bind(ctx, e))) return st;
    if (ro->graph && (st = graph_api_get(&rs.ga, e))) return st;
    rs.H = Ls[0]->H;
    rs.D = Ls[0]->D;
    if ((st = run_store(&rs, outs, e)) || (st = run_alloc(&rs, e)) || (st = run_plan(&rs, e)))
        goto done;
    for (int i = 0; i < n; i++) {
        kiln_batch_args a;
        fill_args(Ls[i], &rs.S[i], &rs.d, ro->graph || ro->po.max_batch > 0, &a);
        if ((st = run_upload(&rs, i, e)) || (st = run_replan(&rs, i, &outs[i], e)) ||
            (st = run_launch(&rs, i, &a, e)) || (st = run_download(&rs, i, &outs[i], e)) ||
            (ro->time_reps > 0 && i == n - 1 && (st = run_time(&rs, &a, &outs[i], e))))
            goto done;
    }
done:
    if (st) rs.cu->cuCtxSynchronize();
    run_state_free(&rs);
    if (st)
        for (int i = 0; i < n; i++) kiln__cb_out_free(&outs[i]);
    return st;
}

/* ---- kiln_check_batch_run ------------------------------------------------------------------- */

/* The graph check's second batch: fewer requests (same bound), other lengths, one empty, no
 * more rows than the first. */
static void second_lens(const kiln_variant *v, const kiln_check_batch *s, uint64_t seed, int *qo,
                        int *kv, int *B2)
{
    const int B = s->batch;
    int max_kv = 0, max_qo = 1;
    long total = 0;
    for (int b = 0; b < B; b++) {
        if (s->kv_lens[b] > max_kv) max_kv = s->kv_lens[b];
        const int q = v->op == KILN_OP_PREFILL ? s->qo_lens[b] : 1;
        if (q > max_qo) max_qo = q;
        total += q;
    }
    *B2 = B > 1 ? B - B / 3 : B;
    long total2 = 0;
    for (int b = 0; b < *B2; b++) {
        kv[b] = (int)(kiln_check_rng(&seed) % (uint64_t)(max_kv + max_kv / 2 + 2));
        qo[b] =
            v->op == KILN_OP_PREFILL ? (int)(kiln_check_rng(&seed) % (uint64_t)(max_qo + 1)) : 1;
        if (*B2 > 1 && b == *B2 / 2) kv[b] = 0;
        if (v->mask == KILN_MASK_CAUSAL && qo[b] > kv[b] && v->op == KILN_OP_PREFILL) qo[b] = kv[b];
        total2 += qo[b];
    }
    for (int b = 0; total2 > total && b < *B2; b++) { /* stay within the first batch's rows */
        total2 -= qo[b];
        qo[b] = 0;
    }
}

/* Visible (row, key) pairs of L, for FLOPs. */
static double visible_pairs(const cb_logical *L)
{
    double n = 0;
    for (int b = 0; b < L->ix.batch; b++) {
        const int L_Q = L->ix.qo_indptr[b + 1] - L->ix.qo_indptr[b],
                  L_KV = L->ix.kv_indptr[b + 1] - L->ix.kv_indptr[b];
        for (int i = 0; i < L_Q; i++) {
            const int diag = i + L_KV - L_Q;
            int lo = 0, hi = L_KV;
            if (L->v.mask == KILN_MASK_CAUSAL && diag + 1 < hi) hi = diag + 1;
            if (L->v.window && diag - L->window_left > lo) lo = diag - L->window_left;
            if (hi > lo) n += hi - lo;
        }
    }
    return n;
}

kiln_status kiln__cb_batch_kernel(const kiln_kernel *k, kiln__err *e)
{
    if (!k || (k->v.kv != KILN_KV_RAGGED && k->v.kv != KILN_KV_PAGED) || k->v.op == KILN_OP_MERGE)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "check batch: not a batch variant (needs op=decode or prefill with "
                          "kv=ragged or kv=paged)");
    return KILN_STATUS_OK;
}

cb_run_opts kiln__cb_run_opts(const kiln_check_batch *s, int time_reps)
{
    cb_run_opts ro = {0};
    ro.strided = s->strided;
    ro.graph = s->graph;
    ro.po.max_batch = s->max_batch;
    ro.po.max_qo_tokens = s->max_qo_tokens;
    ro.po.fixed_split = s->fixed_split;
    ro.po.no_split = s->no_split;
    ro.time_reps = time_reps;
    ro.scratch = s->scratch;
    return ro;
}

kiln_status kiln__cb_make_checked(const kiln_variant *v, const kiln_check_batch *s, uint64_t seed,
                                  cb_logical L[2], int **lens, int *n, kiln__err *e)
{
    kiln_status st;
    *n = 1;
    *lens = NULL;
    if ((st = kiln__cb_make(v, s, seed, &L[0])))
        return kiln__fail(e, st, "check batch: bad shape (heads %d, group %d) or out of memory",
                          s->num_qo_heads, v->group);
    if (!s->graph) return KILN_STATUS_OK;
    int *lens2 = malloc(sizeof(int) * (2 * (size_t)s->batch + 2));
    if (!lens2) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "check batch: out of host memory");
    *lens = lens2;
    kiln_check_batch s2 = *s;
    second_lens(v, s, seed ^ 0x2ba7c4, lens2, lens2 + s->batch + 1, &s2.batch);
    s2.qo_lens = lens2;
    s2.kv_lens = lens2 + s->batch + 1;
    /* the graph holds the first batch's parameters: its window, not a default drawn from the
     * second batch's lengths */
    s2.window_left = L[0].window_left;
    if ((st = kiln__cb_make(v, &s2, seed + 1, &L[1])))
        return kiln__fail(e, st, "check batch: out of host memory");
    *n = 2;
    return KILN_STATUS_OK;
}

kiln_status kiln_check_batch_run(kiln_ctx *ctx, kiln_kernel *k, const kiln_check_batch *s,
                                 int time_reps, kiln_check_batch_result *res, char *msg, size_t cap)
{
    kiln__err err = {{0}}, *e = &err;
    kiln_status st = KILN_STATUS_OK;
    cb_logical L[2];
    memset(L, 0, sizeof L);
    cb_out out[2] = {{0}};
    double *ref_o = NULL, *ref_lse = NULL;
    int *lens2 = NULL;
    memset(res, 0, sizeof *res);
    res->bad_request = -1;
    if ((st = kiln__cb_batch_kernel(k, e))) goto done;
    const uint64_t seed = kiln__cb_seed(s->seed);
    res->seed = seed;
    int n = 1;
    if ((st = kiln__cb_make_checked(&k->v, s, seed, L, &lens2, &n, e))) goto done;
    const cb_logical *Ls[2] = {&L[0], &L[1]};
    cb_run_opts ro = kiln__cb_run_opts(s, time_reps);
    if ((st = kiln__cb_run(ctx, k, Ls, n, &ro, out, e))) goto done;
    res->plan = out[0].info;
    res->plan_ms = out[0].plan_ms;
    res->batches = n;
    res->r.kernel_ms = out[n - 1].kernel_ms;
    res->r.min_ms = out[n - 1].min_ms;
    kiln_check_tolerance(&k->v, &res->r.atol, &res->r.rtol);
    double sums[2] = {0, 0};
    for (int i = 0; i < n && !s->skip_reference; i++) {
        if ((st = kiln__cb_reference(&L[i], &ref_o, &ref_lse))) {
            kiln__fail(e, st, "check batch: out of host memory for the reference");
            goto done;
        }
        kiln__cb_compare(&L[i], &out[i], ref_o, ref_lse, &res->r, sums,
                         i == 0 ? &res->bad_request : NULL);
        free(ref_o);
        free(ref_lse);
        ref_o = ref_lse = NULL;
    }
    const cb_logical *Lt = &L[n - 1];
    const double esz =
        (k->v.kv_dtype == KILN_DTYPE_E4M3 || k->v.kv_dtype == KILN_DTYPE_E5M2) ? 1 : 2;
    res->r.flops = 4.0 * Lt->D * visible_pairs(Lt) * Lt->H;
    res->r.bytes =
        2.0 * 2 * Lt->ix.total_qo * Lt->H * Lt->D + 2.0 * esz * Lt->ix.total_kv * Lt->H_KV * Lt->D;
    if (res->r.bad) st = KILN_STATUS_MISMATCH;
done:
    kiln_check_message(st, &res->r, e->msg, msg, cap);
    for (int i = 0; i < 2; i++) {
        kiln__cb_out_free(&out[i]);
        kiln__cb_free(&L[i]);
    }
    free(ref_o);
    free(ref_lse);
    free(lens2);
    return st;
}
