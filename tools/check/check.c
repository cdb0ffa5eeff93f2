/*
 * check.c — runs a kernel on fresh random inputs and compares it with a float64 CPU
 * reference that evaluates the attention definition directly (no online softmax): for each
 * query row and head, the visible keys under the mask, the logits transform, a softmax in
 * double and the weighted sum of V. Rows go in blocks against each key (check_internal.h), each
 * sum in the definition's order, so the blocks change no bit of the result. Inputs are drawn in float, rounded to the
 * kernel's dtype, and the reference reads the rounded values. Outputs are poisoned (NaN)
 * before the launch, so an element the kernel never wrote fails the comparison.
 *
 * Also times launches with CUDA events (rotating input copies so L2 does not flatter) and
 * measures a device-to-device copy for the bandwidth ceiling.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_internal.h"

#define ROTATE_BYTES (256u << 20) /* keep at least this many input bytes in rotation when timing */
#define MAX_ROTATE   8

/* ---- the problem: host tensors with strides --------------------------------------------- */

typedef struct problem {
    kiln_variant v;
    int H, H_KV, G, D, L_Q, L_KV, window_left;
    float sm_scale, softcap;
    int64_t qs_n, qs_h, os_n, os_h, ks_n, ks_h; /* element strides (k and v share) */
    size_t q_elems, kv_elems, o_elems;          /* buffer sizes in elements */
    uint16_t *q, *k, *vv;                       /* host inputs (vv: values) */
    float *slopes;                              /* [H] */
    const kiln_check_shape *shape;              /* reference callbacks (custom variants) */
    double *ref_o, *ref_lse;                    /* [L_Q][H][D], [L_Q][H] */
    uint16_t *o_got;                            /* the kernel's o, copied back (o strides) */
    float *lse_got;                             /* [L_Q][H] */
} problem;

static int visible(const problem *p, int i, int j, int h)
{
    const int off = p->L_KV - p->L_Q;
    if (p->v.mask == KILN_MASK_CAUSAL && j > i + off) return 0;
    if (p->v.window && j < i + off - p->window_left) return 0;
    const kiln_check_shape *s = p->shape;
    if (s && s->ref_mask && !s->ref_mask(s->ref_user, i, j, h, h / p->G, p->L_Q, p->L_KV)) return 0;
    return 1;
}

/* The reference of KV heads [hk0, hk0 + heads): row t of a head (query i = t / G, head
 * hk G + t % G), blocks of `rows` rows, task = head * blocks + block; kd, vd hold the heads' keys
 * and values in float64, [head - hk0][L_KV][D]. */
typedef struct ref_job {
    problem *p;
    int hk0, heads, rows;
    long blocks;
    double *kd, *vd;
} ref_job;

static void ref_work(void *arg, int first, int step)
{
    const ref_job *jb = arg;
    problem *p = jb->p;
    const int D = p->D, G = p->G, n = p->L_KV, off = p->L_KV - p->L_Q;
    const long total = (long)p->L_Q * G;
    kiln__check_block bk;
    const int ok = kiln__check_block_alloc(&bk, jb->rows, n, D);
    for (long task = first; task < jb->heads * jb->blocks; task += step) {
        const int hk = jb->hk0 + (int)(task / jb->blocks);
        const long t0 = task % jb->blocks * jb->rows;
        const int R = (int)(total - t0 < jb->rows ? total - t0 : jb->rows);
        const double *kd = jb->kd + (size_t)(hk - jb->hk0) * n * D,
                     *vd = jb->vd + (size_t)(hk - jb->hk0) * n * D;
        for (int r = 0; r < R; r++) {
            const int i = (int)((t0 + r) / G), h = hk * G + (int)((t0 + r) % G);
            const long at = (long)i * p->H + h;
            if (!ok) { /* out of memory: NaN rows fail the comparison loudly */
                for (int d = 0; d < D; d++) p->ref_o[(size_t)at * D + d] = NAN;
                p->ref_lse[at] = NAN;
                continue;
            }
            bk.i[r] = i, bk.h[r] = h, bk.at[r] = at;
            for (int d = 0; d < D; d++)
                bk.qT[(size_t)d * R + r] =
                    kiln__check_bits(p->v.q_dtype, p->q[i * p->qs_n + h * p->qs_h + d]);
        }
        if (!ok) continue;
        for (int j = 0; j < n; j++) {
            int any = 0;
            for (int r = 0; r < R; r++) any |= bk.vis[r] = visible(p, bk.i[r], j, bk.h[r]);
            if (any) kiln__check_dots(bk.qT, R, D, kd + (size_t)j * D, bk.s);
            for (int r = 0; r < R; r++) {
                double v = -INFINITY;
                if (bk.vis[r]) {
                    v = kiln__check_logit(p->v.logits, bk.s[r] * p->sm_scale, p->softcap,
                                          p->slopes ? p->slopes[bk.h[r]] : 0.f,
                                          j - (bk.i[r] + off));
                    if (p->shape && p->shape->ref_logits)
                        v = p->shape->ref_logits(p->shape->ref_user, v, bk.i[r], j, bk.h[r], hk,
                                                 p->L_Q, p->L_KV);
                }
                bk.x[(size_t)r * n + j] = v;
            }
        }
        kiln__check_softmax_pv(&bk, R, n, vd, D, p->ref_o, p->ref_lse);
    }
    kiln__check_block_free(&bk);
}

/* Decode task (head, key) of the job's heads into kd and vd. */
static void decode_work(void *arg, int first, int step)
{
    const ref_job *jb = arg;
    const problem *p = jb->p;
    const int D = p->D, n = p->L_KV;
    for (long t = first; t < (long)jb->heads * n; t += step) {
        const int hk = jb->hk0 + (int)(t / n), j = (int)(t % n);
        const uint16_t *kr = p->k + j * p->ks_n + hk * p->ks_h,
                       *vr = p->vv + j * p->ks_n + hk * p->ks_h;
        double *kd = jb->kd + (size_t)t * D, *vd = jb->vd + (size_t)t * D;
        for (int d = 0; d < D; d++) {
            kd[d] = kiln__check_bits(p->v.kv_dtype, kr[d]);
            vd[d] = kiln__check_bits(p->v.kv_dtype, vr[d]);
        }
    }
}

/* The reference, a few KV heads at a time (their keys and values in float64 take at most
 * REF_KV_BYTES, or one head's), each head's rows in blocks over the CPUs: at least a task a CPU
 * where the rows allow, and blocks no larger than kiln__check_ref_rows. */
#define REF_KV_BYTES (256l << 20)
static kiln_status reference(problem *p, kiln__err *e)
{
    const int D = p->D, n = p->L_KV;
    const size_t head_bytes = 2 * sizeof(double) * ((size_t)n * D + 1);
    const long fit = REF_KV_BYTES / (long)head_bytes;
    const int heads = (int)(fit < 1 ? 1 : fit > p->H_KV ? p->H_KV : fit);
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN), total = (long)p->L_Q * p->G;
    long rows = (total * heads + cpus - 1) / (cpus > 0 ? cpus : 1);
    if (rows > kiln__check_ref_rows(n)) rows = kiln__check_ref_rows(n);
    if (rows < 1) rows = 1;
    ref_job job = {p,
                   0,
                   heads,
                   (int)rows,
                   (total + rows - 1) / rows,
                   malloc(head_bytes / 2 * heads),
                   malloc(head_bytes / 2 * heads)};
    if (!job.kd || !job.vd) {
        free(job.kd);
        free(job.vd);
        return kiln__fail(e, KILN_STATUS_NO_MEMORY,
                          "check: out of host memory for the reference's keys and values (%zu MB)",
                          (head_bytes * (size_t)heads) >> 20);
    }
    for (int hk0 = 0; hk0 < p->H_KV; hk0 += heads) {
        job.hk0 = hk0;
        job.heads = p->H_KV - hk0 < heads ? p->H_KV - hk0 : heads;
        kiln_check_parallel(decode_work, &job, (long)job.heads * n);
        kiln_check_parallel(ref_work, &job, job.heads * job.blocks);
    }
    free(job.kd);
    free(job.vd);
    return KILN_STATUS_OK;
}

static long long visible_pairs(const problem *p)
{
    long long n = 0;
    if (p->shape && p->shape->ref_mask) { /* count exactly, head 0 */
        for (int i = 0; i < p->L_Q; i++)
            for (int j = 0; j < p->L_KV; j++) n += visible(p, i, j, 0);
        return n;
    }
    for (int i = 0; i < p->L_Q; i++) {
        const int off = p->L_KV - p->L_Q;
        int lo = 0, hi = p->L_KV; /* [lo, hi) */
        if (p->v.mask == KILN_MASK_CAUSAL && i + off + 1 < hi) hi = i + off + 1;
        if (p->v.window && i + off - p->window_left > lo) lo = i + off - p->window_left;
        if (hi > lo) n += hi - lo;
    }
    return n;
}

/* ---- the problem set up on the host -------------------------------------------------------- */

/* Shape, scales and strides of k on s (its defaults filled in). INVALID_ARGUMENT for heads
 * that are not a multiple of the group. */
static kiln_status problem_init(const kiln_variant *v, const kiln_check_shape *s, problem *p,
                                kiln__err *e)
{
    p->v = *v;
    p->shape = s;
    p->D = v->head_dim;
    p->G = v->group;
    p->H = s->num_qo_heads;
    if (p->H < p->G || p->H % p->G)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "check: heads=%d must be a multiple of group=%d", p->H, p->G);
    p->H_KV = p->H / p->G;
    p->L_Q = v->op == KILN_OP_DECODE ? 1 : s->qo_len;
    p->L_KV = s->kv_len;
    p->sm_scale = s->sm_scale > 0 ? s->sm_scale : 1.0f / sqrtf((float)p->D);
    p->softcap = s->softcap > 0 ? s->softcap : 30.0f;
    p->window_left = s->window_left >= 0 ? s->window_left : p->L_KV / 3;
    const int pad = s->strided ? 8 : 0, D = p->D;
    p->qs_h = D + pad;
    p->qs_n = p->H * p->qs_h + pad;
    p->os_h = D + pad;
    p->os_n = p->H * p->os_h + pad;
    if (v->layout == KILN_LAYOUT_NHD) {
        p->ks_h = D + pad;
        p->ks_n = p->H_KV * p->ks_h + pad;
        p->kv_elems = (size_t)p->L_KV * p->ks_n;
    } else {
        p->ks_n = D + pad;
        p->ks_h = p->L_KV * p->ks_n + pad;
        p->kv_elems = (size_t)p->H_KV * p->ks_h;
    }
    p->q_elems = (size_t)(p->L_Q > 0 ? p->L_Q : 1) * p->qs_n;
    p->o_elems = (size_t)(p->L_Q > 0 ? p->L_Q : 1) * p->os_n;
    return KILN_STATUS_OK;
}

/* The host buffers of p, with q, k, v and the alibi slopes drawn from s's seed (else the
 * clock). */
static kiln_status problem_fill(problem *p, kiln__err *e)
{
    const kiln_check_shape *s = p->shape;
    uint64_t seed = s->seed
                        ? s->seed
                        : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20) ^ (uint64_t)(uintptr_t)p;
    p->q = malloc(p->q_elems * 2);
    p->k = malloc(p->kv_elems * 2);
    p->vv = malloc(p->kv_elems * 2);
    p->slopes = malloc(sizeof(float) * (size_t)p->H);
    p->ref_o = malloc(sizeof(double) * (size_t)p->L_Q * p->H * p->D + 8);
    p->ref_lse = malloc(sizeof(double) * (size_t)p->L_Q * p->H + 8);
    p->o_got = malloc(p->o_elems * 2);
    p->lse_got = malloc(sizeof(float) * (size_t)p->L_Q * p->H + 8);
    if (!p->q || !p->k || !p->vv || !p->slopes || !p->ref_o || !p->ref_lse || !p->o_got ||
        !p->lse_got)
        return kiln__fail(e, KILN_STATUS_NO_MEMORY, "check: out of host memory");
    /* q is scaled up so the softmax is not flat; padding holds garbage-looking finite values. */
    for (size_t i = 0; i < p->q_elems; i++)
        p->q[i] = kiln_check_to_bits(p->v.q_dtype, 2.0f * kiln_check_uniform(&seed));
    for (size_t i = 0; i < p->kv_elems; i++)
        p->k[i] = kiln_check_to_bits(p->v.kv_dtype, kiln_check_uniform(&seed));
    for (size_t i = 0; i < p->kv_elems; i++)
        p->vv[i] = kiln_check_to_bits(p->v.kv_dtype, kiln_check_uniform(&seed));
    for (int h = 0; h < p->H; h++) p->slopes[h] = exp2f(-8.0f * (float)(h + 1) / (float)p->H);
    return KILN_STATUS_OK;
}

static void problem_free(problem *p)
{
    free(p->q);
    free(p->k);
    free(p->vv);
    free(p->slopes);
    free(p->ref_o);
    free(p->ref_lse);
    free(p->o_got);
    free(p->lse_got);
}

/* ---- device side -------------------------------------------------------------------------- */

typedef struct devbufs {
    CUdeviceptr q[MAX_ROTATE], k[MAX_ROTATE], v[MAX_ROTATE];
    CUdeviceptr o, lse, slopes, ws;
    kiln__check_guard user[KILN_MAX_USER_PARAMS]; /* guarded: the kernel reads no element past */
    kiln__check_guard bits, indptr, indices;      /* these (check_guard.c) */
    CUdeviceptr tile_map;
    size_t tile_map_bytes, ws_bytes;
    int copies;
} devbufs;

static void dev_free(const kiln__cu *cu, devbufs *b)
{
    for (int c = 0; c < MAX_ROTATE; c++) {
        if (b->q[c]) cu->cuMemFree(b->q[c]);
        if (b->k[c]) cu->cuMemFree(b->k[c]);
        if (b->v[c]) cu->cuMemFree(b->v[c]);
    }
    if (b->o) cu->cuMemFree(b->o);
    if (b->lse) cu->cuMemFree(b->lse);
    if (b->slopes) cu->cuMemFree(b->slopes);
    if (b->ws) cu->cuMemFree(b->ws);
    for (int i = 0; i < KILN_MAX_USER_PARAMS; i++) kiln__check_guard_free(cu, &b->user[i]);
    kiln__check_guard_free(cu, &b->bits);
    kiln__check_guard_free(cu, &b->indptr);
    kiln__check_guard_free(cu, &b->indices);
    if (b->tile_map) cu->cuMemFree(b->tile_map);
    memset(b, 0, sizeof *b);
}

#define CU_RET(call, what) KILN__CHECK_CU_RET("check", call, what)

/* The inputs: copies of q, k, v (enough to rotate ROTATE_BYTES through when timing), o and lse,
 * the slopes. */
static kiln_status upload_inputs(const kiln__cu *cu, const problem *p, int time_reps, devbufs *b,
                                 kiln__err *e)
{
    const size_t in_bytes = (p->q_elems + 2 * p->kv_elems) * 2;
    b->copies = 1;
    if (time_reps > 0) {
        size_t c = (ROTATE_BYTES + in_bytes - 1) / in_bytes;
        b->copies = c > MAX_ROTATE ? MAX_ROTATE : (int)c;
    }
    for (int c = 0; c < b->copies; c++) {
        CU_RET(cu->cuMemAlloc(&b->q[c], p->q_elems * 2), "alloc q");
        CU_RET(cu->cuMemAlloc(&b->k[c], p->kv_elems * 2), "alloc k");
        CU_RET(cu->cuMemAlloc(&b->v[c], p->kv_elems * 2), "alloc v");
        CU_RET(cu->cuMemcpyHtoD(b->q[c], p->q, p->q_elems * 2), "copy q");
        CU_RET(cu->cuMemcpyHtoD(b->k[c], p->k, p->kv_elems * 2), "copy k");
        CU_RET(cu->cuMemcpyHtoD(b->v[c], p->vv, p->kv_elems * 2), "copy v");
    }
    CU_RET(cu->cuMemAlloc(&b->o, p->o_elems * 2), "alloc o");
    CU_RET(cu->cuMemAlloc(&b->lse, sizeof(float) * (size_t)p->L_Q * p->H + 16), "alloc lse");
    CU_RET(cu->cuMemAlloc(&b->slopes, sizeof(float) * (size_t)p->H), "alloc slopes");
    CU_RET(cu->cuMemcpyHtoD(b->slopes, p->slopes, sizeof(float) * (size_t)p->H), "copy slopes");
    return KILN_STATUS_OK;
}

/* What the shape hands the kernel besides the tensors: mask bits, BSR arrays, user arrays,
 * each exactly its size and guarded (check_guard.c): a read past one faults. */
static kiln_status upload_extras(const kiln__cu *cu, CUdevice dev, const problem *p, devbufs *b,
                                 kiln__err *e)
{
    const kiln_check_shape *s = p->shape;
    kiln_status st = KILN_STATUS_OK;
    if (s->mask_bits_host)
        st = kiln__check_guard_upload(cu, dev, s->mask_bits_host,
                                      ((size_t)p->L_Q * p->L_KV + 7) / 8, 1, &b->bits, e);
    if (!st && s->bsr_indptr_host && s->bsr_indices_host &&
        !(st = kiln__check_guard_upload(cu, dev, s->bsr_indptr_host,
                                        sizeof(int) * (size_t)(s->bsr_rows + 1), 4, &b->indptr, e)))
        st = kiln__check_guard_upload(cu, dev, s->bsr_indices_host,
                                      sizeof(int) * (size_t)s->bsr_nnz, 4, &b->indices, e);
    for (int i = 0; !st && i < KILN_MAX_USER_PARAMS; i++)
        if (s->user_host[i] && s->user_bytes[i])
            st = kiln__check_guard_upload(cu, dev, s->user_host[i], s->user_bytes[i], 4,
                                          &b->user[i], e);
    return st;
}

/* The tile map (prefill with use_tile_map) and the decode workspace, sized by the library. */
static kiln_status alloc_scratch(kiln_ctx *ctx, kiln_kernel *k, const problem *p, devbufs *b,
                                 kiln__err *e)
{
    const kiln__cu *cu = ctx->cu;
    kiln_status st;
    if (p->shape->use_tile_map && k->v.op == KILN_OP_PREFILL) {
        if ((st = kiln_prefill_tile_map_size(k, p->L_Q, p->L_KV, &b->tile_map_bytes))) {
            *e = ctx->err;
            return st;
        }
        CU_RET(cu->cuMemAlloc(&b->tile_map, b->tile_map_bytes + 1), "alloc tile map");
    }
    if (k->v.op == KILN_OP_DECODE) {
        if ((st = kiln_decode_workspace_size(k, p->H, p->L_KV, &b->ws_bytes))) {
            *e = ctx->err;
            return st;
        }
        if (b->ws_bytes) CU_RET(cu->cuMemAlloc(&b->ws, b->ws_bytes), "alloc workspace");
    }
    return KILN_STATUS_OK;
}

static void fill_args(const problem *p, const devbufs *b, int c, kiln_attn_args *a)
{
    const kiln_check_shape *s = p->shape;
    memset(a, 0, sizeof *a);
    a->q = b->q[c];
    a->k = b->k[c];
    a->v = b->v[c];
    a->o = b->o;
    a->lse = b->lse;
    a->num_qo_heads = p->H;
    a->qo_len = p->L_Q;
    a->kv_len = p->L_KV;
    a->q_stride_n = p->qs_n;
    a->q_stride_h = p->qs_h;
    a->o_stride_n = p->os_n;
    a->o_stride_h = p->os_h;
    a->k_stride_n = a->v_stride_n = p->ks_n;
    a->k_stride_h = a->v_stride_h = p->ks_h;
    a->workspace = b->ws;
    a->workspace_bytes = b->ws_bytes;
    kiln__check_params(&a->params, p->sm_scale, p->softcap, p->window_left, b->slopes);
    for (int i = 0; i < KILN_MAX_USER_PARAMS; i++) {
        a->params.user[i] = s->user[i];
        if (b->user[i].ptr) a->params.user[i].ptr = b->user[i].ptr;
    }
    a->mask_bits = b->bits.ptr;
    a->bsr_indptr = b->indptr.ptr;
    a->bsr_indices = b->indices.ptr;
    a->bsr_r = s->bsr_r;
    a->bsr_c = s->bsr_c;
    a->tile_map = b->tile_map;
    a->tile_map_bytes = b->tile_map_bytes;
}

static kiln_status launch(kiln_kernel *k, const kiln_attn_args *a)
{
    return k->v.op == KILN_OP_DECODE ? kiln_single_decode(k, a, NULL)
                                     : kiln_single_prefill(k, a, NULL);
}

/* One run on poisoned outputs (0xffff is NaN in f16 and bf16, 0xffffffff in f32), after the
 * tile map when there is one; o and lse copied back into p. */
static kiln_status run_once(kiln_ctx *ctx, kiln_kernel *k, problem *p, const devbufs *b,
                            kiln__err *e)
{
    const kiln__cu *cu = ctx->cu;
    const size_t lse_bytes = sizeof(float) * (size_t)p->L_Q * p->H;
    kiln_status st;
    CU_RET(cu->cuMemsetD8(b->o, 0xff, p->o_elems * 2), "poison o");
    CU_RET(cu->cuMemsetD8(b->lse, 0xff, lse_bytes + 16), "poison lse");
    kiln_attn_args a;
    fill_args(p, b, 0, &a);
    if ((b->tile_map && (st = kiln_prefill_tile_map(k, &a, NULL))) || (st = launch(k, &a))) {
        *e = ctx->err;
        return st;
    }
    CU_RET(cu->cuCtxSynchronize(), "run kernel");
    CU_RET(cu->cuMemcpyDtoH(p->o_got, b->o, p->o_elems * 2), "copy o back");
    CU_RET(cu->cuMemcpyDtoH(p->lse_got, b->lse, lse_bytes), "copy lse back");
    return KILN_STATUS_OK;
}

/* ---- comparison and timing ------------------------------------------------------------------ */

/* The reference against the kernel's o and lse into r; keep_output copies o out as doubles.
 * NO_MEMORY (with the size) where the reference's keys and values do not fit in host memory. */
static kiln_status compare(problem *p, kiln_check_result *r, kiln__err *e)
{
    const int D = p->D, rows = p->shape->skip_reference ? 0 : p->L_Q;
    const kiln_dtype ot = p->v.out_dtype;
    double sums[2] = {0, 0};
    kiln_status st;
    if (!p->shape->skip_reference && (st = reference(p, e))) return st;
    kiln_check_tolerance(&p->v, &r->atol, &r->rtol);
    for (int i = 0; i < rows; i++)
        for (int h = 0; h < p->H; h++) {
            for (int d = 0; d < D; d++) {
                const double ref = p->ref_o[((size_t)i * p->H + h) * D + d];
                const double got = kiln__check_bits(ot, p->o_got[i * p->os_n + h * p->os_h + d]);
                if (kiln__check_o(r, got, ref, sums))
                    snprintf(r->first_bad, sizeof r->first_bad,
                             "o[i=%d,h=%d,d=%d] = %.6g, ref %.6g", i, h, d, got, ref);
            }
            if (!p->v.lse) continue;
            const double ref = p->ref_lse[(size_t)i * p->H + h],
                         got = p->lse_got[(size_t)i * p->H + h];
            if (kiln__check_lse(r, got, ref))
                snprintf(r->first_bad, sizeof r->first_bad, "lse[i=%d,h=%d] = %.6g, ref %.6g", i, h,
                         got, ref);
        }
    if (p->shape->keep_output) {
        r->o = malloc(sizeof(double) * (size_t)p->L_Q * p->H * D + 8);
        for (int i = 0; r->o && i < p->L_Q; i++)
            for (int h = 0; h < p->H; h++)
                for (int d = 0; d < D; d++)
                    r->o[((size_t)i * p->H + h) * D + d] =
                        kiln__check_bits(ot, p->o_got[i * p->os_n + h * p->os_h + d]);
    }
    kiln__check_rel_l2(r, sums);
    r->flops = 4.0 * D * (double)visible_pairs(p) * p->H;
    r->bytes = (double)(p->L_Q * (double)p->H * D * 2) * 2 + 2.0 * p->L_KV * p->H_KV * D * 2;
    return KILN_STATUS_OK;
}

/* Median and fastest of reps launches with CUDA events (three warm-ups first), rotating the
 * input copies. */
static kiln_status time_launches(kiln_ctx *ctx, kiln_kernel *k, const problem *p, const devbufs *b,
                                 int reps, kiln_check_result *r, kiln__err *e)
{
    const kiln__cu *cu = ctx->cu;
    kiln_status st = KILN_STATUS_OK;
    CUevent ev[2] = {0};
    kiln_attn_args a;
    double *ms = malloc(sizeof(double) * (size_t)reps);
    if (!ms) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "check: out of host memory");
    KILN__CHECK_CU("check", cu->cuEventCreate(&ev[0], CU_EVENT_DEFAULT), "event");
    KILN__CHECK_CU("check", cu->cuEventCreate(&ev[1], CU_EVENT_DEFAULT), "event");
    for (int w = 0; w < 3; w++) {
        fill_args(p, b, w % b->copies, &a);
        launch(k, &a);
    }
    for (int t = 0; t < reps; t++) {
        fill_args(p, b, t % b->copies, &a);
        cu->cuEventRecord(ev[0], NULL);
        st = launch(k, &a);
        cu->cuEventRecord(ev[1], NULL);
        if (st) {
            *e = ctx->err;
            goto done;
        }
        cu->cuEventSynchronize(ev[1]);
        float f = 0;
        cu->cuEventElapsedTime(&f, ev[0], ev[1]);
        ms[t] = f;
    }
    qsort(ms, (size_t)reps, sizeof *ms, kiln__check_cmp_double);
    r->kernel_ms = ms[reps / 2];
    r->min_ms = ms[0];
done:
    if (ev[0]) cu->cuEventDestroy(ev[0]);
    if (ev[1]) cu->cuEventDestroy(ev[1]);
    free(ms);
    return st;
}

kiln_status kiln_check_run(kiln_ctx *ctx, kiln_kernel *k, const kiln_check_shape *s, int time_reps,
                           kiln_check_result *r, char *msg, size_t cap)
{
    kiln__err err = {{0}}, *e = &err;
    kiln_status st = KILN_STATUS_OK;
    memset(r, 0, sizeof *r);
    problem p = {0};
    devbufs b = {0};
    const kiln__cu *cu = ctx ? ctx->cu : NULL;
    if (!cu || !k || !k->loaded) {
        snprintf(msg, cap, "check: no GPU or kernel not loaded (%s)",
                 ctx ? ctx->err.msg : "no context");
        return KILN_STATUS_NO_DEVICE;
    }
    if ((st = kiln__ctx_bind(ctx, e)) || (st = problem_init(&k->v, s, &p, e)) ||
        (st = problem_fill(&p, e)) || (st = upload_inputs(cu, &p, time_reps, &b, e)) ||
        (st = upload_extras(cu, ctx->dev, &p, &b, e)) || (st = alloc_scratch(ctx, k, &p, &b, e)) ||
        (st = run_once(ctx, k, &p, &b, e)))
        goto done;
    if ((st = compare(&p, r, e))) goto done;
    if (time_reps > 0 && (st = time_launches(ctx, k, &p, &b, time_reps, r, e))) goto done;
    if (r->bad) st = KILN_STATUS_MISMATCH;
done:
    kiln_check_message(st, r, e->msg, msg, cap);
    if (cu) dev_free(cu, &b);
    problem_free(&p);
    return st;
}

kiln_status kiln__check_reference_cpu(const kiln_variant *v, const kiln_check_shape *s,
                                      void (*use)(const kiln__check_ref_io *io, void *user),
                                      void *user)
{
    kiln__err err = {{0}}, *e = &err;
    problem p = {0};
    kiln_status st;
    if (!(st = problem_init(v, s, &p, e)) && !(st = problem_fill(&p, e))) {
        if ((st = reference(&p, e))) goto done;
        const kiln__check_ref_io io = {p.H,           p.H_KV,     p.L_Q,     p.L_KV, p.D,
                                       p.window_left, p.sm_scale, p.softcap, p.q,    p.k,
                                       p.vv,          p.qs_n,     p.qs_h,    p.ks_n, p.ks_h,
                                       p.slopes,      p.ref_o,    p.ref_lse};
        use(&io, user);
    }
done:
    problem_free(&p);
    return st;
}

kiln_status kiln_check_bandwidth(kiln_ctx *ctx, size_t bytes, double *copy_gbs, char *msg,
                                 size_t cap)
{
    kiln__err err = {{0}}, *e = &err;
    kiln_status st = KILN_STATUS_OK;
    const kiln__cu *cu = ctx ? ctx->cu : NULL;
    CUdeviceptr a = 0, b = 0;
    CUevent ev[2] = {0};
    *copy_gbs = 0;
    if (!cu) {
        snprintf(msg, cap, "bandwidth: no GPU");
        return KILN_STATUS_NO_DEVICE;
    }
    if ((st = kiln__ctx_bind(ctx, e))) goto done;
    KILN__CHECK_CU("check", cu->cuMemAlloc(&a, bytes), "alloc");
    KILN__CHECK_CU("check", cu->cuMemAlloc(&b, bytes), "alloc");
    KILN__CHECK_CU("check", cu->cuMemsetD8(a, 0x3c, bytes), "fill");
    KILN__CHECK_CU("check", cu->cuEventCreate(&ev[0], CU_EVENT_DEFAULT), "event");
    KILN__CHECK_CU("check", cu->cuEventCreate(&ev[1], CU_EVENT_DEFAULT), "event");
    double best[31];
    for (int t = 0; t < 33; t++) {
        cu->cuEventRecord(ev[0], NULL);
        KILN__CHECK_CU("check", cu->cuMemcpyDtoD(b, a, bytes), "copy");
        cu->cuEventRecord(ev[1], NULL);
        cu->cuEventSynchronize(ev[1]);
        float f = 0;
        cu->cuEventElapsedTime(&f, ev[0], ev[1]);
        if (t >= 2) best[t - 2] = f;
    }
    qsort(best, 31, sizeof best[0], kiln__check_cmp_double);
    *copy_gbs = 2.0 * (double)bytes / (best[15] * 1e-3) / 1e9;
done:
    if (st) snprintf(msg, cap, "%s", e->msg);
    if (ev[0]) cu->cuEventDestroy(ev[0]);
    if (ev[1]) cu->cuEventDestroy(ev[1]);
    if (a) cu->cuMemFree(a);
    if (b) cu->cuMemFree(b);
    return st;
}
