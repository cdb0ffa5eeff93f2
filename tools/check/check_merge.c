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

#define CU_TRY(call, what)                                                                         \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            st = kiln__cu_fail(e, r_, "check merge: %s", what);                                    \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

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
        const double g = kiln_check_from_bits(t, got[d]), err = fabs(g - ref[d]);
        r->checked++;
        sums[0] += (g - ref[d]) * (g - ref[d]);
        sums[1] += ref[d] * ref[d];
        if (fabs(ref[d]) > r->max_ref) r->max_ref = fabs(ref[d]);
        if (!(err <= r->atol + r->rtol * fabs(ref[d])) && !r->bad++)
            snprintf(r->first_bad, sizeof r->first_bad, "v[row %d,h=%d,d=%d] = %.6g, ref %.6g", row,
                     h, d, g, ref[d]);
        if (!(err <= r->max_err)) r->max_err = isnan(err) ? INFINITY : err;
    }
    const double err = isinf(ref_lse) && got_lse == ref_lse ? 0 : fabs((double)got_lse - ref_lse);
    r->checked++;
    if (!(err <= 1e-3 + 1e-3 * fabs(ref_lse)) && !r->bad++)
        snprintf(r->first_bad, sizeof r->first_bad, "lse[row %d,h=%d] = %.6g, ref %.6g", row, h,
                 got_lse, ref_lse);
    if (!(err <= r->lse_max_err)) r->lse_max_err = isnan(err) ? INFINITY : err;
}

kiln_status kiln_check_merge(kiln_ctx *ctx, kiln_kernel *k, kiln_check_merge_op op,
                             const kiln_check_merge_shape *s, kiln_check_result *r, char *msg,
                             size_t cap)
{
    kiln__err err = {{0}}, *e = &err;
    kiln_status st = KILN_STATUS_OK;
    const kiln__cu *cu = ctx ? ctx->cu : NULL;
    memset(r, 0, sizeof *r);
    uint16_t *v = NULL, *v_got = NULL;
    float *lse = NULL, *lse_got = NULL;
    unsigned char *mask = NULL;
    double *ref = NULL;
    CUdeviceptr dv = 0, dl = 0, dvo = 0, dlo = 0, dm = 0;
    if (!cu || !k || !k->loaded) {
        st = kiln__fail(e, KILN_STATUS_NO_DEVICE, "check merge: no GPU or kernel not loaded");
        goto done;
    }
    if (k->v.op != KILN_OP_MERGE) {
        st = kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "check merge: not an op=merge kernel");
        goto done;
    }
    if ((st = kiln__ctx_bind(ctx, e))) goto done;
    const kiln_dtype t = k->v.q_dtype;
    const int n = s->rows, H = s->num_heads, D = k->v.head_dim;
    const int S = op == KILN_CHECK_MERGE_STATES ? (s->num_states > 0 ? s->num_states : 3) : 2;
    const int pad = op != KILN_CHECK_MERGE_STATES && s->strided ? PAD : 0;
    const int64_t sh = D + pad, sn = (int64_t)H * sh + pad; /* strides of one v tensor */
    /* host states: merge_states [n][S][H] dense; the pairwise ops [S][n] tensors with strides */
    const size_t one = (size_t)(n > 0 ? n : 1) * (size_t)sn, vn = one * S,
                 ln = (size_t)(n > 0 ? n : 1) * H * S;
    uint64_t seed = kiln__cb_seed(s->seed);
    v = malloc(vn * 2);
    v_got = malloc(vn * 2);
    lse = malloc(ln * sizeof(float));
    lse_got = malloc(ln * sizeof(float));
    mask = malloc((size_t)n + 1);
    ref = malloc(sizeof(double) * ((size_t)D + 1));
    if (!v || !v_got || !lse || !lse_got || !mask || !ref) {
        st = kiln__fail(e, KILN_STATUS_NO_MEMORY, "check merge: out of host memory");
        goto done;
    }
    for (size_t i = 0; i < vn; i++) v[i] = kiln_check_to_bits(t, kiln_check_uniform(&seed));
    for (size_t i = 0; i < ln; i++) {
        const int row = op == KILN_CHECK_MERGE_STATES
                            ? (int)(i / ((size_t)S * H))
                            : (int)(i % ((size_t)(n > 0 ? n : 1) * H) / H);
        const int empty = row % EMPTY_ROW == 3 || kiln_check_rng(&seed) % 5 == 0;
        lse[i] = empty ? -INFINITY : 8.0f * kiln_check_uniform(&seed);
    }
    for (int i = 0; i < n; i++) mask[i] = kiln_check_rng(&seed) % 3 != 0;
    CU_TRY(cu->cuMemAlloc(&dv, vn * 2), "alloc v");
    CU_TRY(cu->cuMemAlloc(&dl, ln * sizeof(float)), "alloc lse");
    CU_TRY(cu->cuMemAlloc(&dvo, one * 2), "alloc v_out");
    CU_TRY(cu->cuMemAlloc(&dlo, (size_t)(n > 0 ? n : 1) * H * sizeof(float)), "alloc lse_out");
    CU_TRY(cu->cuMemAlloc(&dm, (size_t)n + 1), "alloc mask");
    CU_TRY(cu->cuMemcpyHtoD(dv, v, vn * 2), "copy v");
    CU_TRY(cu->cuMemcpyHtoD(dl, lse, ln * sizeof(float)), "copy lse");
    CU_TRY(cu->cuMemcpyHtoD(dm, mask, (size_t)n + 1), "copy mask");
    CU_TRY(cu->cuMemsetD8(dvo, 0xff, one * 2), "poison v_out");
    CU_TRY(cu->cuMemsetD8(dlo, 0xff, (size_t)(n > 0 ? n : 1) * H * sizeof(float)),
           "poison lse_out");
    kiln_merge_args a = {0};
    a.rows = n;
    a.num_heads = H;
    if (pad) {
        a.v_stride_n = sn;
        a.v_stride_h = sh;
    }
    const size_t lone = (size_t)(n > 0 ? n : 1) * H;
    a.v_a = dv;
    a.lse_a = dl;
    a.v_b = dv + one * 2;
    a.lse_b = dl + lone * sizeof(float);
    a.v_out = dvo;
    a.lse_out = dlo;
    a.v_all = dv;
    a.lse_all = dl;
    a.num_states = S;
    if (op == KILN_CHECK_MERGE_IN_PLACE) a.mask = dm;
    if (op == KILN_CHECK_MERGE_STATE) st = kiln_merge_state(k, &a, NULL);
    else if (op == KILN_CHECK_MERGE_IN_PLACE) st = kiln_merge_state_in_place(k, &a, NULL);
    else st = kiln_merge_states(k, &a, NULL);
    if (st) {
        kiln__fail(e, st, "%s", kiln_ctx_errmsg(ctx));
        goto done;
    }
    CU_TRY(cu->cuCtxSynchronize(), "merge");
    if (op == KILN_CHECK_MERGE_IN_PLACE) {
        CU_TRY(cu->cuMemcpyDtoH(v_got, dv, one * 2), "copy v back");
        CU_TRY(cu->cuMemcpyDtoH(lse_got, dl, lone * sizeof(float)), "copy lse back");
    } else {
        CU_TRY(cu->cuMemcpyDtoH(v_got, dvo, one * 2), "copy v back");
        CU_TRY(cu->cuMemcpyDtoH(lse_got, dlo, lone * sizeof(float)), "copy lse back");
    }
    kiln_variant tv;
    kiln_variant_default(&tv);
    tv.q_dtype = tv.kv_dtype = tv.out_dtype = t;
    kiln_check_tolerance(&tv, &r->atol, &r->rtol);
    double sums[2] = {0, 0}, ref_lse = 0;
    for (int row = 0; row < n; row++)
        for (int h = 0; h < H; h++) {
            const uint16_t *got = v_got + row * sn + h * sh;
            const float gl = lse_got[(size_t)row * H + h];
            if (op == KILN_CHECK_MERGE_STATES) {
                merge_ref(S, D, t, v + ((size_t)row * S * H + h) * D, (size_t)H * D,
                          lse + (size_t)row * S * H + h, (size_t)H, ref, &ref_lse);
                compare_row(t, D, v_got + ((size_t)row * H + h) * D, ref, gl, ref_lse, row, h, r,
                            sums);
                continue;
            }
            const uint16_t *va = v + row * sn + h * sh;
            const float la = lse[(size_t)row * H + h];
            if (op == KILN_CHECK_MERGE_IN_PLACE && !mask[row]) { /* untouched, bit for bit */
                r->checked += D + 1;
                if ((memcmp(got, va, 2 * (size_t)D) || memcmp(&gl, &la, sizeof la)) && !r->bad++)
                    snprintf(r->first_bad, sizeof r->first_bad,
                             "row %d (mask 0), head %d was modified", row, h);
                continue;
            }
            merge_ref(2, D, t, va, one, lse + (size_t)row * H + h, lone, ref, &ref_lse);
            compare_row(t, D, got, ref, gl, ref_lse, row, h, r, sums);
        }
    r->rel_l2 = sums[1] > 0 ? sqrt(sums[0] / sums[1]) : sqrt(sums[0]);
    if (isnan(r->rel_l2)) r->rel_l2 = INFINITY;
    if (r->bad) st = KILN_STATUS_MISMATCH;
done:
    kiln_check_message(st, r, e->msg, msg, cap);
    CUdeviceptr bufs[] = {dv, dl, dvo, dlo, dm};
    for (size_t i = 0; cu && i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cu->cuMemFree(bufs[i]);
    free(v);
    free(v_got);
    free(lse);
    free(lse_got);
    free(mask);
    free(ref);
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
    CUdeviceptr buf[6] = {0};
    memset(r, 0, sizeof *r);
    const int B = s->batch;
    if (!cu || !k_prefix || !k_decode || !k_merge) {
        st = kiln__fail(e, KILN_STATUS_NO_DEVICE, "check cascade: no GPU or no kernel");
        goto done;
    }
    const kiln_variant *vp = &k_prefix->v, *vd = &k_decode->v;
    if (vp->op != KILN_OP_PREFILL || vp->kv == KILN_KV_CONTIGUOUS || !vp->lse || vp->mask ||
        vp->window || vp->rope || vd->op != KILN_OP_DECODE || vd->kv != KILN_KV_PAGED || !vd->lse ||
        vd->mask || vd->window || vd->rope || vp->logits != vd->logits ||
        vd->logits == KILN_LOGITS_ALIBI || vp->head_dim != vd->head_dim || vp->group != vd->group ||
        vp->out_dtype != vd->out_dtype || k_merge->v.op != KILN_OP_MERGE ||
        k_merge->v.q_dtype != vd->out_dtype || k_merge->v.head_dim != vd->head_dim || B < 1 ||
        prefix_len < 1) {
        st = kiln__fail(
            e, KILN_STATUS_INVALID_ARGUMENT,
            "check cascade: needs prefill (kv=ragged|paged, lse=1) and decode (kv=paged, lse=1) "
            "kernels without masks, window, rope or alibi, alike in head_dim, group and out dtype, "
            "a merge kernel of that dtype, B >= 1 and a prefix");
        goto done;
    }
    if ((st = kiln__ctx_bind(ctx, e))) goto done;
    const uint64_t seed = kiln__cb_seed(s->seed);
    full = malloc(sizeof(int) * (2 * (size_t)B + 2));
    if (!full) {
        st = kiln__fail(e, KILN_STATUS_NO_MEMORY, "check cascade: out of host memory");
        goto done;
    }
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
    if ((st = kiln__cb_make(vd, &sf, seed, &Lf)) || (st = kiln__cb_make(vd, s, seed + 1, &Ld)) ||
        (st = kiln__cb_make(vp, &sp, seed + 2, &Lp))) {
        kiln__fail(e, st, "check cascade: bad shape or out of memory");
        goto done;
    }
    /* one shared prefix (request 0's) in every request of the full batch; the parts */
    for (int b = 1; b < B; b++) copy_tokens(&Lf, 0, 0, &Lf, b, 0, prefix_len);
    copy_tokens(&Lf, 0, 0, &Lp, 0, 0, prefix_len);
    for (int b = 0; b < B; b++) copy_tokens(&Lf, b, prefix_len, &Ld, b, 0, s->kv_lens[b]);
    const size_t qn = (size_t)B * Lf.H * Lf.D;
    memcpy(Ld.q, Lf.q, sizeof(uint16_t) * qn);
    memcpy(Lp.q, Lf.q, sizeof(uint16_t) * qn);
    cb_run_opts ro = {0};
    ro.strided = s->strided;
    ro.po.fixed_split = s->fixed_split;
    const cb_logical *lp[1] = {&Lp}, *ld[1] = {&Ld};
    if ((st = kiln__cb_run(ctx, k_prefix, lp, 1, &ro, &op, e)) ||
        (st = kiln__cb_run(ctx, k_decode, ld, 1, &ro, &od, e)))
        goto done;
    /* merge the two states on the device */
    const size_t vb = qn * 2, lb = (size_t)B * Lf.H * sizeof(float);
    for (int i = 0; i < 6; i++) CU_TRY(cu->cuMemAlloc(&buf[i], i % 2 ? lb : vb), "alloc states");
    CU_TRY(cu->cuMemcpyHtoD(buf[0], op.o, vb), "copy state");
    CU_TRY(cu->cuMemcpyHtoD(buf[1], op.lse, lb), "copy state");
    CU_TRY(cu->cuMemcpyHtoD(buf[2], od.o, vb), "copy state");
    CU_TRY(cu->cuMemcpyHtoD(buf[3], od.lse, lb), "copy state");
    CU_TRY(cu->cuMemsetD8(buf[4], 0xff, vb), "poison");
    CU_TRY(cu->cuMemsetD8(buf[5], 0xff, lb), "poison");
    kiln_merge_args a = {0};
    a.v_a = buf[0];
    a.lse_a = buf[1];
    a.v_b = buf[2];
    a.lse_b = buf[3];
    a.v_out = buf[4];
    a.lse_out = buf[5];
    a.rows = B;
    a.num_heads = Lf.H;
    if ((st = kiln_merge_state(k_merge, &a, NULL))) {
        kiln__fail(e, st, "%s", kiln_ctx_errmsg(ctx));
        goto done;
    }
    CU_TRY(cu->cuCtxSynchronize(), "merge");
    om.o = malloc(vb);
    om.lse = malloc(lb);
    if (!om.o || !om.lse || (st = kiln__cb_reference(&Lf, &ref_o, &ref_lse))) {
        st = kiln__fail(e, KILN_STATUS_NO_MEMORY, "check cascade: out of host memory");
        goto done;
    }
    CU_TRY(cu->cuMemcpyDtoH(om.o, buf[4], vb), "copy merged v");
    CU_TRY(cu->cuMemcpyDtoH(om.lse, buf[5], lb), "copy merged lse");
    /* three roundings (two states, the merge) instead of one: twice the tolerance */
    kiln_check_tolerance(vd, &r->atol, &r->rtol);
    r->atol *= 2;
    r->rtol *= 2;
    double sums[2] = {0, 0};
    kiln__cb_compare(&Lf, &om, ref_o, ref_lse, r, sums, NULL);
    if (r->bad) st = KILN_STATUS_MISMATCH;
done:
    kiln_check_message(st, r, e->msg, msg, cap);
    for (int i = 0; cu && i < 6; i++)
        if (buf[i]) cu->cuMemFree(buf[i]);
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
