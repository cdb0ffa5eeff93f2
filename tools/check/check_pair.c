/*
 * check_pair.c — the checks that compare two runs of one logical batch: paged ≡ ragged
 * (kiln_check_batch_equiv: bitwise when both plans split alike), two configs of one variant
 * (kiln_check_batch_same: bit for bit, e.g. the split merge fused or not), batch ≡ single
 * (kiln_check_batch_vs_single: every request alone through the single-request kernel) and batch
 * invariance (kiln_check_batch_invariance: a request alone and inside the batch, bit for bit).
 * See check.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_batch.h"

#define CU_RET(call, what) KILN__CHECK_CU_RET("check batch", call, what)
#define KILN_RET(call)     KILN__CHECK_CALL_RET(call)

/* ---- pairs of runs -------------------------------------------------------------------------- */

/* The outcome of a pair check into msg[cap]: e's message on failure, "" on success. */
static void pair_message(kiln_status st, const kiln__err *e, char *msg, size_t cap)
{
    if (st) snprintf(msg, cap, "%s", e->msg);
    else if (cap) msg[0] = 0;
}

/* Compare rows [ra, ra + rows) of out a with rows [rb, rb + rows) of out b: bits, and the
 * tolerance of v (when tol is set) taking b as the reference. Returns the out-of-tolerance
 * count. */
static long long compare_pair(const kiln_variant *v, int H, int D, const cb_out *a, int ra,
                              const cb_out *b, int rb, int rows, int tol, kiln_check_pair *p)
{
    double atol, rtol;
    long long bad = 0;
    kiln_check_tolerance(v, &atol, &rtol);
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < H; h++) {
            for (int d = 0; d < D; d++) {
                const uint16_t x = a->o[((size_t)(ra + r) * H + h) * D + d],
                               y = b->o[((size_t)(rb + r) * H + h) * D + d];
                const double fx = kiln_check_from_bits(v->out_dtype, x),
                             fy = kiln_check_from_bits(v->out_dtype, y);
                const double diff = fabs(fx - fy);
                p->compared++;
                if (!(diff <= p->max_diff)) p->max_diff = isnan(diff) ? INFINITY : diff;
                if (x != y && !p->differ++)
                    snprintf(p->first, sizeof p->first,
                             "o[row %d,h=%d,d=%d]: %.6g (0x%04x) vs %.6g (0x%04x)", r, h, d, fx, x,
                             fy, y);
                if (tol && !(diff <= atol + rtol * fabs(fy))) bad++;
            }
            if (!v->lse) continue;
            const float x = a->lse[(size_t)(ra + r) * H + h], y = b->lse[(size_t)(rb + r) * H + h];
            p->compared++;
            if (memcmp(&x, &y, sizeof x) != 0 && !p->differ++)
                snprintf(p->first, sizeof p->first, "lse[row %d,h=%d]: %.9g vs %.9g", r, h, x, y);
            if (tol && !(x == y || fabs((double)x - y) <= 1e-3 + 1e-3 * fabs((double)y))) bad++;
        }
    p->bitwise = p->differ == 0;
    return bad;
}

kiln_status kiln_check_batch_equiv(kiln_ctx *ctx, kiln_kernel *k_paged, kiln_kernel *k_ragged,
                                   const kiln_check_batch *s, kiln_check_pair *p, char *msg,
                                   size_t cap)
{
    kiln__err err = {{0}}, *e = &err;
    kiln_status st = KILN_STATUS_OK;
    cb_logical Lp = {0}, Lr = {0};
    cb_out op = {0}, orr = {0};
    memset(p, 0, sizeof *p);
    if ((st = kiln__cb_batch_kernel(k_paged, e)) || (st = kiln__cb_batch_kernel(k_ragged, e)))
        goto done;
    kiln_variant a = k_paged->v, b = k_ragged->v;
    a.kv = b.kv = KILN_KV_CONTIGUOUS;
    if (k_paged->v.kv != KILN_KV_PAGED || k_ragged->v.kv != KILN_KV_RAGGED ||
        memcmp(&a, &b, sizeof a) != 0) {
        st = kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                        "check equiv: need a kv=paged and a kv=ragged kernel of one variant");
        goto done;
    }
    const uint64_t seed = kiln__cb_seed(s->seed);
    /* the same seed draws the same q, k, v whatever the storage */
    if ((st = kiln__cb_make(&k_paged->v, s, seed, &Lp)) ||
        (st = kiln__cb_make(&k_ragged->v, s, seed, &Lr))) {
        kiln__fail(e, st, "check equiv: bad shape or out of memory");
        goto done;
    }
    cb_run_opts ro = kiln__cb_run_opts(s, 0);
    const cb_logical *l1[1] = {&Lp}, *l2[1] = {&Lr};
    if ((st = kiln__cb_run(ctx, k_paged, l1, 1, &ro, &op, e)) ||
        (st = kiln__cb_run(ctx, k_ragged, l2, 1, &ro, &orr, e)))
        goto done;
    p->a = op.info;
    p->b = orr.info;
    p->same_split = op.info.items == orr.info.items && op.info.kv_chunk == orr.info.kv_chunk &&
                    op.info.split_items == orr.info.split_items;
    const long long bad =
        compare_pair(&k_paged->v, Lp.H, Lp.D, &op, 0, &orr, 0, Lp.ix.total_qo, 1, p);
    if ((p->same_split && !p->bitwise) || bad) {
        st = KILN_STATUS_MISMATCH;
        kiln__fail(e, st,
                   "paged vs ragged (%s split): %lld elements differ in bits, %lld out of "
                   "tolerance; first: %s",
                   p->same_split ? "same" : "different", p->differ, bad, p->first);
    }
done:
    pair_message(st, e, msg, cap);
    kiln__cb_out_free(&op);
    kiln__cb_out_free(&orr);
    kiln__cb_free(&Lp);
    kiln__cb_free(&Lr);
    return st;
}

kiln_status kiln_check_batch_same(kiln_kernel *k_a, kiln_kernel *k_b, const kiln_check_batch *s,
                                  kiln_check_pair *p, char *msg, size_t cap)
{
    kiln__err err = {{0}}, *e = &err;
    kiln_status st = KILN_STATUS_OK;
    cb_logical L[2];
    memset(L, 0, sizeof L);
    cb_out oa[2] = {{0}}, ob[2] = {{0}};
    int *lens2 = NULL, n = 0;
    memset(p, 0, sizeof *p);
    if ((st = kiln__cb_batch_kernel(k_a, e)) || (st = kiln__cb_batch_kernel(k_b, e))) goto done;
    if (memcmp(&k_a->v, &k_b->v, sizeof k_a->v) != 0) {
        st = kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                        "check same: need two kernels of one variant (%s, %s)", k_a->spec,
                        k_b->spec);
        goto done;
    }
    if ((st = kiln__cb_make_checked(&k_a->v, s, kiln__cb_seed(s->seed), L, &lens2, &n, e)))
        goto done;
    const cb_logical *Ls[2] = {&L[0], &L[1]};
    cb_run_opts ro = kiln__cb_run_opts(s, 0);
    if ((st = kiln__cb_run(k_a->ctx, k_a, Ls, n, &ro, oa, e)) ||
        (st = kiln__cb_run(k_b->ctx, k_b, Ls, n, &ro, ob, e)))
        goto done;
    p->a = oa[0].info;
    p->b = ob[0].info;
    p->same_split = oa[0].info.items == ob[0].info.items &&
                    oa[0].info.kv_chunk == ob[0].info.kv_chunk &&
                    oa[0].info.split_items == ob[0].info.split_items;
    for (int i = 0; i < n; i++)
        compare_pair(&k_a->v, L[i].H, L[i].D, &oa[i], 0, &ob[i], 0, L[i].ix.total_qo, 0, p);
    if (!p->same_split) { /* the planner reads CTAs per SM: a config that changes them splits
                             otherwise, and other splits round otherwise */
        st = KILN_STATUS_MISMATCH;
        kiln__fail(e, st,
                   "%s vs %s: the plans differ (items %d vs %d, chunk %d vs %d; CTAs per SM %d "
                   "vs %d), so the bits may too: %lld of %lld elements differ",
                   k_a->key, k_b->key, p->a.items, p->b.items, p->a.kv_chunk, p->b.kv_chunk,
                   k_a->ctas_per_sm, k_b->ctas_per_sm, p->differ, p->compared);
    } else if (!p->bitwise) {
        st = KILN_STATUS_MISMATCH;
        kiln__fail(e, st, "%s vs %s (%d batch%s): %lld of %lld elements differ; first: %s",
                   k_a->key, k_b->key, n, n > 1 ? "es" : "", p->differ, p->compared, p->first);
    }
done:
    pair_message(st, e, msg, cap);
    for (int i = 0; i < 2; i++) {
        kiln__cb_out_free(&oa[i]);
        kiln__cb_out_free(&ob[i]);
        kiln__cb_free(&L[i]);
    }
    free(lens2);
    return st;
}

/* Request b of a logical batch as dense NHD rows: q [nq][H][D], k and v [nk][H_KV][D]. */
static void request_rows(const cb_logical *L, int b, const uint16_t **q, const uint16_t **k,
                         const uint16_t **v, int *nq, int *nk)
{
    const int q0 = L->ix.qo_indptr[b], k0 = L->ix.kv_indptr[b];
    *nq = L->ix.qo_indptr[b + 1] - q0;
    *nk = L->ix.kv_indptr[b + 1] - k0;
    *q = L->q + (size_t)q0 * L->H * L->D;
    *k = L->k + (size_t)k0 * L->H_KV * L->D;
    *v = L->vv + (size_t)k0 * L->H_KV * L->D;
}

kiln_status kiln_check_batch_invariance(kiln_ctx *ctx, kiln_kernel *k, const kiln_check_batch *s,
                                        int req, kiln_check_pair *p, char *msg, size_t cap)
{
    kiln__err err = {{0}}, *e = &err;
    kiln_status st = KILN_STATUS_OK;
    cb_logical L = {0}, L1 = {0};
    cb_out ob = {0}, o1 = {0};
    memset(p, 0, sizeof *p);
    if ((st = kiln__cb_batch_kernel(k, e))) goto done;
    if (req < 0 || req >= s->batch || s->fixed_split <= 0) {
        st = kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                        "check invariance: request %d of %d, fixed_split %d (> 0 needed)", req,
                        s->batch, s->fixed_split);
        goto done;
    }
    const uint64_t seed = kiln__cb_seed(s->seed);
    kiln_check_batch s1 = *s;
    s1.batch = 1;
    s1.qo_lens = s->qo_lens ? s->qo_lens + req : NULL;
    s1.kv_lens = s->kv_lens + req;
    s1.window_left = s->window_left; /* the same window whatever the batch */
    if ((st = kiln__cb_make(&k->v, s, seed, &L)) ||
        (st = kiln__cb_make(&k->v, &s1, seed + 7, &L1))) {
        kiln__fail(e, st, "check invariance: bad shape or out of memory");
        goto done;
    }
    /* request req's data, copied into the batch of one */
    const uint16_t *rq, *rk, *rv;
    int nq, nk;
    request_rows(&L, req, &rq, &rk, &rv, &nq, &nk);
    memcpy(L1.q, rq, sizeof(uint16_t) * (size_t)nq * L.H * L.D);
    memcpy(L1.k, rk, sizeof(uint16_t) * (size_t)nk * L.H_KV * L.D);
    memcpy(L1.vv, rv, sizeof(uint16_t) * (size_t)nk * L.H_KV * L.D);
    L1.rope_off[0] = L.rope_off[req];
    L1.window_left = L.window_left;
    cb_run_opts ro = kiln__cb_run_opts(s, 0);
    ro.graph = 0;
    const cb_logical *lb[1] = {&L}, *l1[1] = {&L1};
    if ((st = kiln__cb_run(ctx, k, lb, 1, &ro, &ob, e)) ||
        (st = kiln__cb_run(ctx, k, l1, 1, &ro, &o1, e)))
        goto done;
    p->a = ob.info;
    p->b = o1.info;
    compare_pair(&k->v, L.H, L.D, &ob, L.ix.qo_indptr[req], &o1, 0, nq, 0, p);
    if (!p->bitwise) {
        st = KILN_STATUS_MISMATCH;
        kiln__fail(e, st,
                   "request %d alone vs in a batch of %d (fixed_split %d): %lld of %lld elements "
                   "differ; first: %s",
                   req, s->batch, s->fixed_split, p->differ, p->compared, p->first);
    }
done:
    pair_message(st, e, msg, cap);
    kiln__cb_out_free(&ob);
    kiln__cb_out_free(&o1);
    kiln__cb_free(&L);
    kiln__cb_free(&L1);
    return st;
}

/* Device buffers of the single-request runs, sized for the largest request of L. */
typedef struct single_bufs {
    CUdeviceptr q, k, v, o, lse, slopes, ws;
    size_t ws_bytes;
} single_bufs;

static kiln_status single_alloc(kiln_ctx *ctx, kiln_kernel *k, const cb_logical *L, single_bufs *sb,
                                cb_out *os, kiln__err *e)
{
    const kiln__cu *cu = ctx->cu;
    const int H = L->H, HK = L->H_KV, D = L->D;
    int max_q = 1, max_k = 1;
    sb->ws_bytes = 16;
    for (int r = 0; r < L->ix.batch; r++) {
        const uint16_t *q, *kk, *v;
        int nq, nk;
        size_t ws = 0;
        request_rows(L, r, &q, &kk, &v, &nq, &nk);
        if (nq > max_q) max_q = nq;
        if (nk > max_k) max_k = nk;
        if (k->v.op == KILN_OP_DECODE && nk > 0) {
            KILN_RET(kiln_decode_workspace_size(k, H, nk, &ws));
            if (ws > sb->ws_bytes) sb->ws_bytes = ws;
        }
    }
    CU_RET(cu->cuMemAlloc(&sb->q, (size_t)max_q * H * D * 2), "alloc q");
    CU_RET(cu->cuMemAlloc(&sb->o, (size_t)max_q * H * D * 2), "alloc o");
    CU_RET(cu->cuMemAlloc(&sb->k, (size_t)max_k * HK * D * 2), "alloc k");
    CU_RET(cu->cuMemAlloc(&sb->v, (size_t)max_k * HK * D * 2), "alloc v");
    CU_RET(cu->cuMemAlloc(&sb->lse, sizeof(float) * (size_t)max_q * H), "alloc lse");
    CU_RET(cu->cuMemAlloc(&sb->slopes, sizeof(float) * (size_t)H), "alloc slopes");
    CU_RET(cu->cuMemAlloc(&sb->ws, sb->ws_bytes), "alloc workspace");
    CU_RET(cu->cuMemcpyHtoD(sb->slopes, L->slopes, sizeof(float) * (size_t)H), "copy slopes");
    os->o = malloc(sizeof(uint16_t) * ((size_t)max_q * H * D + 1));
    os->lse = malloc(sizeof(float) * ((size_t)max_q * H + 1));
    if (!os->o || !os->lse)
        return kiln__fail(e, KILN_STATUS_NO_MEMORY, "check vs single: out of host memory");
    return KILN_STATUS_OK;
}

static void single_free(const kiln__cu *cu, single_bufs *sb)
{
    CUdeviceptr bufs[] = {sb->q, sb->k, sb->v, sb->o, sb->lse, sb->slopes, sb->ws};
    for (size_t i = 0; cu && i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cu->cuMemFree(bufs[i]);
}

/* Request r of L (nq rows, nk keys: both > 0) run alone through k (kv=contiguous, dense NHD
 * rows as the batch holds them); its o and lse into os. */
static kiln_status single_run(kiln_ctx *ctx, kiln_kernel *k, const cb_logical *L, int r,
                              const single_bufs *sb, cb_out *os, kiln__err *e)
{
    const kiln__cu *cu = ctx->cu;
    const int H = L->H, HK = L->H_KV, D = L->D;
    const uint16_t *q, *kk, *v;
    int nq, nk;
    request_rows(L, r, &q, &kk, &v, &nq, &nk);
    CU_RET(cu->cuMemcpyHtoD(sb->q, q, (size_t)nq * H * D * 2), "copy q");
    CU_RET(cu->cuMemcpyHtoD(sb->k, kk, (size_t)nk * HK * D * 2), "copy k");
    CU_RET(cu->cuMemcpyHtoD(sb->v, v, (size_t)nk * HK * D * 2), "copy v");
    kiln_attn_args sa;
    memset(&sa, 0, sizeof sa);
    sa.q = sb->q;
    sa.k = sb->k;
    sa.v = sb->v;
    sa.o = sb->o;
    sa.lse = k->v.lse ? sb->lse : 0;
    sa.num_qo_heads = H;
    sa.qo_len = nq;
    sa.kv_len = nk;
    sa.q_stride_n = sa.o_stride_n = (int64_t)H * D;
    sa.q_stride_h = sa.o_stride_h = D;
    sa.k_stride_n = sa.v_stride_n = (int64_t)HK * D; /* rows as the batch holds them: NHD */
    sa.k_stride_h = sa.v_stride_h = D;
    sa.workspace = sb->ws;
    sa.workspace_bytes = sb->ws_bytes;
    kiln__check_params(&sa.params, L->sm_scale, L->softcap, L->window_left, sb->slopes);
    KILN_RET(k->v.op == KILN_OP_DECODE ? kiln_single_decode(k, &sa, NULL)
                                       : kiln_single_prefill(k, &sa, NULL));
    CU_RET(cu->cuCtxSynchronize(), "single run");
    CU_RET(cu->cuMemcpyDtoH(os->o, sb->o, (size_t)nq * H * D * 2), "copy o back");
    if (k->v.lse)
        CU_RET(cu->cuMemcpyDtoH(os->lse, sb->lse, sizeof(float) * (size_t)nq * H), "copy lse back");
    return KILN_STATUS_OK;
}

kiln_status kiln_check_batch_vs_single(kiln_ctx *ctx, kiln_kernel *k_batch, kiln_kernel *k_single,
                                       const kiln_check_batch *s, kiln_check_pair *p, char *msg,
                                       size_t cap)
{
    kiln__err err = {{0}}, *e = &err;
    kiln_status st = KILN_STATUS_OK;
    cb_logical L = {0};
    cb_out ob = {0}, os = {0};
    single_bufs sb = {0};
    memset(p, 0, sizeof *p);
    const kiln__cu *cu = ctx ? ctx->cu : NULL;
    if ((st = kiln__cb_batch_kernel(k_batch, e))) goto done;
    kiln_variant a = k_batch->v, b = k_single ? k_single->v : a;
    a.kv = KILN_KV_CONTIGUOUS;
    if (!k_single || k_batch->v.kv != KILN_KV_RAGGED || memcmp(&a, &b, sizeof a) != 0 ||
        a.mask_data) {
        st = kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                        "check vs single: need a kv=ragged and a kv=contiguous kernel of one "
                        "variant (no mask data)");
        goto done;
    }
    if (!cu || !k_single->loaded) {
        st = kiln__fail(e, KILN_STATUS_NO_DEVICE, "check vs single: no GPU or kernel not loaded");
        goto done;
    }
    if ((st = kiln__cb_make(&k_batch->v, s, kiln__cb_seed(s->seed), &L))) {
        kiln__fail(e, st, "check vs single: bad shape or out of memory");
        goto done;
    }
    cb_run_opts ro = kiln__cb_run_opts(s, 0);
    const cb_logical *l1[1] = {&L};
    if ((st = kiln__cb_run(ctx, k_batch, l1, 1, &ro, &ob, e))) goto done;
    p->a = ob.info;
    if ((st = kiln__ctx_bind(ctx, e)) || (st = single_alloc(ctx, k_single, &L, &sb, &os, e)))
        goto done;
    long long bad = 0;
    for (int r = 0; r < L.ix.batch; r++) {
        const int nq = L.ix.qo_indptr[r + 1] - L.ix.qo_indptr[r],
                  nk = L.ix.kv_indptr[r + 1] - L.ix.kv_indptr[r];
        if (nq == 0 || nk == 0) continue; /* a single launch needs keys and rows */
        if ((st = single_run(ctx, k_single, &L, r, &sb, &os, e))) goto done;
        bad += compare_pair(&a, L.H, L.D, &os, 0, &ob, L.ix.qo_indptr[r], nq, 1, p);
    }
    if (bad) {
        st = KILN_STATUS_MISMATCH;
        kiln__fail(e, st,
                   "batch (kv=ragged) vs single (kv=contiguous): %lld elements out of tolerance, "
                   "%lld differ in "
                   "bits; first: %s",
                   bad, p->differ, p->first);
    }
done:
    pair_message(st, e, msg, cap);
    single_free(cu, &sb);
    kiln__cb_out_free(&ob);
    kiln__cb_out_free(&os);
    kiln__cb_free(&L);
    return st;
}
