/*
 * check_merge.c — checks of the softmax-state merges (kiln_merge_state, _in_place, _states)
 * against a float64 merge of random states (empty states and rows with no keys anywhere
 * included), and the cascade check: a shared prefix computed once as a batch prefill over the
 * grouped decode queries, each request's private keys as a batch decode, both merged, against
 * the reference of a plain decode over prefix + private keys. See check.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_batch.h"

#define PAD       16
#define EMPTY_ROW 7 /* rows r with r % EMPTY_ROW == 3 have no keys in any state */

#define CU_TRY(call, what) KILN__CHECK_CU("check merge", call, what)
#define CU_RET(call, what) KILN__CHECK_CU_RET("check merge", call, what)

/* The float64 merge of S states of one row and head: v[s * vstep + d], lse[s * lstep]. */
static void merge_ref(int S, int D, kiln_dtype t, const uint16_t *v, size_t vstep, const float *lse,
                      size_t lstep, double *out, double *out_lse)
{
    double m = -INFINITY, l = 0;
    for (int s = 0; s < S; s++)
        if (lse[s * lstep] > m) m = lse[s * lstep];
    for (int d = 0; d < D; d++) out[d] = 0;
    if (m == -INFINITY) {
        *out_lse = -INFINITY;
        return;
    }
    for (int s = 0; s < S; s++) {
        if (lse[s * lstep] == -INFINITY) continue;
        const double w = exp((double)lse[s * lstep] - m);
        l += w;
        for (int d = 0; d < D; d++) out[d] += w * kiln_check_from_bits(t, v[s * vstep + d]);
    }
    for (int d = 0; d < D; d++) out[d] /= l;
    *out_lse = m + log(l);
}

/* Compare one row/head of a merge result; accumulates into r. */
static void compare_row(kiln_dtype t, int D, const uint16_t *got, const double *ref, float got_lse,
                        double ref_lse, int row, int h, kiln_check_result *r, double sums[2])
{
    for (int d = 0; d < D; d++) {
        const double g = kiln__check_bits(t, got[d]);
        if (kiln__check_o(r, g, ref[d], sums))
            snprintf(r->first_bad, sizeof r->first_bad, "v[row %d,h=%d,d=%d] = %.6g, ref %.6g", row,
                     h, d, g, ref[d]);
    }
    if (kiln__check_lse(r, got_lse, ref_lse))
        snprintf(r->first_bad, sizeof r->first_bad, "lse[row %d,h=%d] = %.6g, ref %.6g", row, h,
                 got_lse, ref_lse);
}

/* One merge check: random states on the host and the device, the results copied back. The
 * pairwise ops hold their S = 2 states as [S][n] tensors with strides (sn, sh); merge_states
 * as [n][S][H] dense. */
typedef struct merge_case {
    kiln_check_merge_op op;
    kiln_dtype t;
    int n, H, D, S;
    int64_t sh, sn;           /* strides of one v tensor (padded when strided) */
    int pad;                  /* 1: pass the strides */
    size_t one, vn, ln, lone; /* elements of one v tensor, of all v, of all lse, of one lse */
    uint16_t *v, *v_got;      /* [vn] */
    float *lse, *lse_got;     /* [ln] */
    unsigned char *mask;      /* [n] in-place mask */
    double *ref;              /* [D] one merged row */
    CUdeviceptr dv, dl, dvo, dlo, dm;
} merge_case;

/* The sizes of c for op on s (kernel dtype t, head dim D) and its host states from the seed:
 * lse in [-8, 8], about one in five -inf, rows r % EMPTY_ROW == 3 -inf in every state. */
static kiln_status merge_case_make(kiln_check_merge_op op, const kiln_check_merge_shape *s,
                                   kiln_dtype t, int D, merge_case *c, kiln__err *e)
{
    c->op = op;
    c->t = t;
    c->n = s->rows;
    c->H = s->num_heads;
    c->D = D;
    c->S = op == KILN_CHECK_MERGE_STATES ? (s->num_states > 0 ? s->num_states : 3) : 2;
    c->pad = op != KILN_CHECK_MERGE_STATES && s->strided ? PAD : 0;
    c->sh = D + c->pad;
    c->sn = (int64_t)c->H * c->sh + c->pad;
    const size_t n1 = (size_t)(c->n > 0 ? c->n : 1);
    c->one = n1 * (size_t)c->sn;
    c->vn = c->one * c->S;
    c->ln = n1 * c->H * c->S;
    c->lone = n1 * c->H;
    uint64_t seed = kiln__cb_seed(s->seed);
    c->v = malloc(c->vn * 2);
    c->v_got = malloc(c->vn * 2);
    c->lse = malloc(c->ln * sizeof(float));
    c->lse_got = malloc(c->ln * sizeof(float));
    c->mask = malloc((size_t)c->n + 1);
    c->ref = malloc(sizeof(double) * ((size_t)D + 1));
    if (!c->v || !c->v_got || !c->lse || !c->lse_got || !c->mask || !c->ref)
        return kiln__fail(e, KILN_STATUS_NO_MEMORY, "check merge: out of host memory");
    for (size_t i = 0; i < c->vn; i++) c->v[i] = kiln_check_to_bits(t, kiln_check_uniform(&seed));
    for (size_t i = 0; i < c->ln; i++) {
        const int row = op == KILN_CHECK_MERGE_STATES ? (int)(i / ((size_t)c->S * c->H))
                                                      : (int)(i % (n1 * c->H) / c->H);
        const int empty = row % EMPTY_ROW == 3 || kiln_check_rng(&seed) % 5 == 0;
        c->lse[i] = empty ? -INFINITY : 8.0f * kiln_check_uniform(&seed);
    }
    for (int i = 0; i < c->n; i++) c->mask[i] = kiln_check_rng(&seed) % 3 != 0;
    return KILN_STATUS_OK;
}

static void merge_case_free(const kiln__cu *cu, merge_case *c)
{
    CUdeviceptr bufs[] = {c->dv, c->dl, c->dvo, c->dlo, c->dm};
    for (size_t i = 0; cu && i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cu->cuMemFree(bufs[i]);
    free(c->v);
    free(c->v_got);
    free(c->lse);
    free(c->lse_got);
    free(c->mask);
    free(c->ref);
}

/* Upload c's states, poison the outputs, merge with k, copy the result back into v_got and
 * lse_got (the in-place merge's result is its first state). */
static kiln_status merge_case_run(kiln_ctx *ctx, kiln_kernel *k, merge_case *c, kiln__err *e)
{
    const kiln__cu *cu = ctx->cu;
    const size_t lse_out = c->lone * sizeof(float);
    CU_RET(cu->cuMemAlloc(&c->dv, c->vn * 2), "alloc v");
    CU_RET(cu->cuMemAlloc(&c->dl, c->ln * sizeof(float)), "alloc lse");
    CU_RET(cu->cuMemAlloc(&c->dvo, c->one * 2), "alloc v_out");
    CU_RET(cu->cuMemAlloc(&c->dlo, lse_out), "alloc lse_out");
    CU_RET(cu->cuMemAlloc(&c->dm, (size_t)c->n + 1), "alloc mask");
    CU_RET(cu->cuMemcpyHtoD(c->dv, c->v, c->vn * 2), "copy v");
    CU_RET(cu->cuMemcpyHtoD(c->dl, c->lse, c->ln * sizeof(float)), "copy lse");
    CU_RET(cu->cuMemcpyHtoD(c->dm, c->mask, (size_t)c->n + 1), "copy mask");
    CU_RET(cu->cuMemsetD8(c->dvo, 0xff, c->one * 2), "poison v_out");
    CU_RET(cu->cuMemsetD8(c->dlo, 0xff, lse_out), "poison lse_out");
    kiln_merge_args a = {0};
    a.rows = c->n;
    a.num_heads = c->H;
    if (c->pad) {
        a.v_stride_n = c->sn;
        a.v_stride_h = c->sh;
    }
    a.v_a = c->dv;
    a.lse_a = c->dl;
    a.v_b = c->dv + c->one * 2;
    a.lse_b = c->dl + lse_out;
    a.v_out = c->dvo;
    a.lse_out = c->dlo;
    a.v_all = c->dv;
    a.lse_all = c->dl;
    a.num_states = c->S;
    if (c->op == KILN_CHECK_MERGE_IN_PLACE) a.mask = c->dm;
    kiln_status st = c->op == KILN_CHECK_MERGE_STATE      ? kiln_merge_state(k, &a, NULL)
                     : c->op == KILN_CHECK_MERGE_IN_PLACE ? kiln_merge_state_in_place(k, &a, NULL)
                                                          : kiln_merge_states(k, &a, NULL);
    if (st) return kiln__fail(e, st, "%s", kiln_ctx_errmsg(ctx));
    CU_RET(cu->cuCtxSynchronize(), "merge");
    const int in_place = c->op == KILN_CHECK_MERGE_IN_PLACE;
    CU_RET(cu->cuMemcpyDtoH(c->v_got, in_place ? c->dv : c->dvo, c->one * 2), "copy v back");
    CU_RET(cu->cuMemcpyDtoH(c->lse_got, in_place ? c->dl : c->dlo, lse_out), "copy lse back");
    return KILN_STATUS_OK;
}

/* Every row and head of c's result against the float64 merge; masked-off rows of the in-place
 * merge must keep their bits. */
static void merge_case_compare(const merge_case *c, kiln_check_result *r)
{
    const int D = c->D, H = c->H, S = c->S;
    kiln_variant tv;
    kiln_variant_default(&tv);
    tv.q_dtype = tv.kv_dtype = tv.out_dtype = c->t;
    kiln_check_tolerance(&tv, &r->atol, &r->rtol);
    double sums[2] = {0, 0}, ref_lse = 0;
    for (int row = 0; row < c->n; row++)
        for (int h = 0; h < H; h++) {
            const uint16_t *got = c->v_got + row * c->sn + h * c->sh;
            const float gl = c->lse_got[(size_t)row * H + h];
            if (c->op == KILN_CHECK_MERGE_STATES) {
                merge_ref(S, D, c->t, c->v + ((size_t)row * S * H + h) * D, (size_t)H * D,
                          c->lse + (size_t)row * S * H + h, (size_t)H, c->ref, &ref_lse);
                compare_row(c->t, D, c->v_got + ((size_t)row * H + h) * D, c->ref, gl, ref_lse, row,
                            h, r, sums);
                continue;
            }
            const uint16_t *va = c->v + row * c->sn + h * c->sh;
            const float la = c->lse[(size_t)row * H + h];
            if (c->op == KILN_CHECK_MERGE_IN_PLACE && !c->mask[row]) { /* untouched, bit for bit */
                r->checked += D + 1;
                if ((memcmp(got, va, 2 * (size_t)D) || memcmp(&gl, &la, sizeof la)) && !r->bad++)
                    snprintf(r->first_bad, sizeof r->first_bad,
                             "row %d (mask 0), head %d was modified", row, h);
                continue;
            }
            merge_ref(2, D, c->t, va, c->one, c->lse + (size_t)row * H + h, c->lone, c->ref,
                      &ref_lse);
            compare_row(c->t, D, got, c->ref, gl, ref_lse, row, h, r, sums);
        }
    kiln__check_rel_l2(r, sums);
}

kiln_status kiln_check_merge(kiln_ctx *ctx, kiln_kernel *k, kiln_check_merge_op op,
                             const kiln_check_merge_shape *s, kiln_check_result *r, char *msg,
                             size_t cap)
{
    kiln__err err = {{0}}, *e = &err;
    kiln_status st = KILN_STATUS_OK;
    const kiln__cu *cu = ctx ? ctx->cu : NULL;
    merge_case c = {0};
    memset(r, 0, sizeof *r);
    if (!cu || !k || !k->loaded)
        st = kiln__fail(e, KILN_STATUS_NO_DEVICE, "check merge: no GPU or kernel not loaded");
    else if (k->v.op != KILN_OP_MERGE)
        st = kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "check merge: not an op=merge kernel");
    else if (!(st = kiln__ctx_bind(ctx, e)) &&
             !(st = merge_case_make(op, s, k->v.q_dtype, k->v.head_dim, &c, e)) &&
             !(st = merge_case_run(ctx, k, &c, e))) {
        merge_case_compare(&c, r);
        if (r->bad) st = KILN_STATUS_MISMATCH;
    }
    kiln_check_message(st, r, e->msg, msg, cap);
    merge_case_free(cu, &c);
    return st;
}

/* ---- cascade -------------------------------------------------------------------------------- */

/* Copy tokens [from, from + n) of request b of src into request c of dst at token `at`. */
static void copy_tokens(const cb_logical *src, int b, int from, cb_logical *dst, int c, int at,
                        int n)
{
    const size_t row = (size_t)src->H_KV * src->D;
    const size_t s0 = ((size_t)src->ix.kv_indptr[b] + from) * row,
                 d0 = ((size_t)dst->ix.kv_indptr[c] + at) * row;
    memcpy(dst->k + d0, src->k + s0, sizeof(uint16_t) * row * (size_t)n);
    memcpy(dst->vv + d0, src->vv + s0, sizeof(uint16_t) * row * (size_t)n);
}

/* The kernels a cascade check needs, alike where they must be; INVALID_ARGUMENT otherwise. */
static kiln_status cascade_kernels_ok(const kiln_kernel *k_prefix, const kiln_kernel *k_decode,
                                      const kiln_kernel *k_merge, int B, int prefix_len,
                                      kiln__err *e)
{
    const kiln_variant *vp = &k_prefix->v, *vd = &k_decode->v;
    const int prefix_ok = vp->op == KILN_OP_PREFILL && vp->kv != KILN_KV_CONTIGUOUS && vp->lse &&
                          !vp->mask && !vp->window && !vp->rope;
    const int decode_ok = vd->op == KILN_OP_DECODE && vd->kv == KILN_KV_PAGED && vd->lse &&
                          !vd->mask && !vd->window && !vd->rope;
    const int alike = vp->logits == vd->logits && !kiln__logits_alibi(vd) &&
                      vp->head_dim == vd->head_dim && vp->group == vd->group &&
                      vp->out_dtype == vd->out_dtype;
    const int merge_ok = k_merge->v.op == KILN_OP_MERGE && k_merge->v.q_dtype == vd->out_dtype &&
                         k_merge->v.head_dim == vd->head_dim;
    if (prefix_ok && decode_ok && alike && merge_ok && B >= 1 && prefix_len >= 1)
        return KILN_STATUS_OK;
    return kiln__fail(
        e, KILN_STATUS_INVALID_ARGUMENT,
        "check cascade: needs prefill (kv=ragged|paged, lse=1) and decode (kv=paged, lse=1) "
        "kernels without masks, window, rope or alibi, alike in head_dim, group and out dtype, "
        "a merge kernel of that dtype, B >= 1 and a prefix");
}

/* The three logical batches of a cascade: Lf, the plain decode over prefix + private keys (the
 * reference); Lp, the prefix as one prefill request whose B rows are the queries; Ld, the
 * private keys as a decode batch. One prefix (request 0's) is shared by every request. full
 * [2B + 2] holds the lengths Lf and Lp were drawn with. */
static kiln_status cascade_batches(const kiln_variant *vp, const kiln_variant *vd,
                                   const kiln_check_batch *s, int prefix_len, uint64_t seed,
                                   int *full, cb_logical *Lf, cb_logical *Lp, cb_logical *Ld,
                                   kiln__err *e)
{
    const int B = s->batch;
    kiln_status st;
    for (int b = 0; b < B; b++) full[b] = prefix_len + s->kv_lens[b];
    kiln_check_batch sf = *s, sp = *s;
    sf.kv_lens = full;
    sf.window_left = 0;
    int *qo1 = full + B, *kv1 = full + B + 1;
    *qo1 = B;
    *kv1 = prefix_len;
    sp.batch = 1;
    sp.qo_lens = qo1;
    sp.kv_lens = kv1;
    if ((st = kiln__cb_make(vd, &sf, seed, Lf)) || (st = kiln__cb_make(vd, s, seed + 1, Ld)) ||
        (st = kiln__cb_make(vp, &sp, seed + 2, Lp)))
        return kiln__fail(e, st, "check cascade: bad shape or out of memory");
    for (int b = 1; b < B; b++) copy_tokens(Lf, 0, 0, Lf, b, 0, prefix_len);
    copy_tokens(Lf, 0, 0, Lp, 0, 0, prefix_len);
    for (int b = 0; b < B; b++) copy_tokens(Lf, b, prefix_len, Ld, b, 0, s->kv_lens[b]);
    const size_t qn = (size_t)B * Lf->H * Lf->D;
    memcpy(Ld->q, Lf->q, sizeof(uint16_t) * qn);
    memcpy(Lp->q, Lf->q, sizeof(uint16_t) * qn);
    return KILN_STATUS_OK;
}

/* The prefix state a and the private state b (B rows of H heads) merged on the device with
 * kiln_merge_state (k_merge) into om (malloc'd; free with kiln__cb_out_free). */
static kiln_status cascade_merge(kiln_ctx *ctx, kiln_kernel *k_merge, const cb_out *a,
                                 const cb_out *b, int B, int H, int D, cb_out *om, kiln__err *e)
{
    const kiln__cu *cu = ctx->cu;
    const size_t vb = (size_t)B * H * D * 2, lb = (size_t)B * H * sizeof(float);
    kiln_status st = KILN_STATUS_OK;
    CUdeviceptr buf[6] = {0};
    for (int i = 0; i < 6; i++) CU_TRY(cu->cuMemAlloc(&buf[i], i % 2 ? lb : vb), "alloc states");
    CU_TRY(cu->cuMemcpyHtoD(buf[0], a->o, vb), "copy state");
    CU_TRY(cu->cuMemcpyHtoD(buf[1], a->lse, lb), "copy state");
    CU_TRY(cu->cuMemcpyHtoD(buf[2], b->o, vb), "copy state");
    CU_TRY(cu->cuMemcpyHtoD(buf[3], b->lse, lb), "copy state");
    CU_TRY(cu->cuMemsetD8(buf[4], 0xff, vb), "poison");
    CU_TRY(cu->cuMemsetD8(buf[5], 0xff, lb), "poison");
    kiln_merge_args m = {0};
    m.v_a = buf[0];
    m.lse_a = buf[1];
    m.v_b = buf[2];
    m.lse_b = buf[3];
    m.v_out = buf[4];
    m.lse_out = buf[5];
    m.rows = B;
    m.num_heads = H;
    if ((st = kiln_merge_state(k_merge, &m, NULL))) {
        kiln__fail(e, st, "%s", kiln_ctx_errmsg(ctx));
        goto done;
    }
    CU_TRY(cu->cuCtxSynchronize(), "merge");
    om->o = malloc(vb);
    om->lse = malloc(lb);
    if (!om->o || !om->lse) {
        st = kiln__fail(e, KILN_STATUS_NO_MEMORY, "check cascade: out of host memory");
        goto done;
    }
    CU_TRY(cu->cuMemcpyDtoH(om->o, buf[4], vb), "copy merged v");
    CU_TRY(cu->cuMemcpyDtoH(om->lse, buf[5], lb), "copy merged lse");
done:
    for (int i = 0; i < 6; i++)
        if (buf[i]) cu->cuMemFree(buf[i]);
    return st;
}

kiln_status kiln_check_cascade(kiln_ctx *ctx, kiln_kernel *k_prefix, kiln_kernel *k_decode,
                               kiln_kernel *k_merge, const kiln_check_batch *s, int prefix_len,
                               kiln_check_result *r, char *msg, size_t cap)
{
    kiln__err err = {{0}}, *e = &err;
    kiln_status st = KILN_STATUS_OK;
    const kiln__cu *cu = ctx ? ctx->cu : NULL;
    cb_logical Lf = {0}, Lp = {0}, Ld = {0};
    cb_out op = {0}, od = {0}, om = {0};
    double *ref_o = NULL, *ref_lse = NULL;
    int *full = NULL;
    memset(r, 0, sizeof *r);
    const int B = s->batch;
    if (!cu || !k_prefix || !k_decode || !k_merge) {
        st = kiln__fail(e, KILN_STATUS_NO_DEVICE, "check cascade: no GPU or no kernel");
        goto done;
    }
    if ((st = cascade_kernels_ok(k_prefix, k_decode, k_merge, B, prefix_len, e)) ||
        (st = kiln__ctx_bind(ctx, e)))
        goto done;
    full = malloc(sizeof(int) * (2 * (size_t)B + 2));
    if (!full) {
        st = kiln__fail(e, KILN_STATUS_NO_MEMORY, "check cascade: out of host memory");
        goto done;
    }
    if ((st = cascade_batches(&k_prefix->v, &k_decode->v, s, prefix_len, kiln__cb_seed(s->seed),
                              full, &Lf, &Lp, &Ld, e)))
        goto done;
    cb_run_opts ro = {0};
    ro.strided = s->strided;
    ro.po.fixed_split = s->fixed_split;
    const cb_logical *lp[1] = {&Lp}, *ld[1] = {&Ld};
    if ((st = kiln__cb_run(ctx, k_prefix, lp, 1, &ro, &op, e)) ||
        (st = kiln__cb_run(ctx, k_decode, ld, 1, &ro, &od, e)) ||
        (st = cascade_merge(ctx, k_merge, &op, &od, B, Lf.H, Lf.D, &om, e)))
        goto done;
    if (kiln__cb_reference(&Lf, &ref_o, &ref_lse)) {
        st = kiln__fail(e, KILN_STATUS_NO_MEMORY, "check cascade: out of host memory");
        goto done;
    }
    /* three roundings (two states, the merge) instead of one: twice the tolerance */
    kiln_check_tolerance(&k_decode->v, &r->atol, &r->rtol);
    r->atol *= 2;
    r->rtol *= 2;
    double sums[2] = {0, 0};
    kiln__cb_compare(&Lf, &om, ref_o, ref_lse, r, sums, NULL);
    if (r->bad) st = KILN_STATUS_MISMATCH;
done:
    kiln_check_message(st, r, e->msg, msg, cap);
    kiln__cb_out_free(&op);
    kiln__cb_out_free(&od);
    kiln__cb_out_free(&om);
    kiln__cb_free(&Lf);
    kiln__cb_free(&Lp);
    kiln__cb_free(&Ld);
    free(ref_o);
    free(ref_lse);
    free(full);
    return st;
}
