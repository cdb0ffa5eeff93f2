/*
 * launch.c — the single-request launches and the parameter block every launch shares. Pure
 * host arithmetic (argument checks, the split of a single decode's keys, the parameter block
 * filled phase by phase: kernel, arguments, tensors, values, mask, user parameters) and one or
 * two launches on the caller's stream (the merge kernel's, kiln__launch_merge, a programmatic
 * dependent launch on sm_90+): no allocation, no synchronisation, no cache or compiler work.
 * kiln__batch_prepare gives batch.c the same block for a batch run.
 */
#include <math.h>
#include <string.h>

#include "params.h"
#include "runtime.h"

static kiln_status fail(kiln_kernel *k, kiln_status st, kiln__err *e)
{
    return kiln__ctx_error(k ? k->ctx : NULL, st, e);
}

int kiln__rows_a_token(const kiln_kernel *k) { return k->cfg.pack ? k->v.group : 1; }

/* Half of L2 for the K/V of a section's KV heads: Q, O and the next section's first tiles
 * stream through the other half. Measured on an H100 (docs/perf/notes.md, session 59): with
 * one section of all 8 KV heads, the ragged causal 1 x 16384 read 1.36 GB from DRAM where
 * FlashInfer's kernel read 0.20 (its K/V and Q once). */
int kiln__job_heads(const kiln_kernel *k, int64_t kv_tokens, int num_qo_heads)
{
    if (!k->cfg.wgmma || !k->cfg.persist || !k->ctx) return 0;
    if (k->ctx->job_heads_env >= 0) return k->ctx->job_heads_env;
    const int64_t l2 = k->ctx->l2_bytes;
    if (l2 <= 0 || kv_tokens <= 0 || k->v.group < 1) return 0;
    const int h_kv = num_qo_heads / k->v.group;
    const int64_t kv_head_bytes =
        kv_tokens * k->v.head_dim * 2 * (kiln__kv_fp8(&k->v) ? 1 : 2); /* K and V */
    const int64_t fit = l2 / 2 / kv_head_bytes;
    if (fit >= h_kv) return 0;
    return (fit < 1 ? 1 : (int)fit) * (k->v.group / kiln__rows_a_token(k));
}

/* Query tiles of L_Q tokens (the prefill grid's x). */
static unsigned q_tiles(const kiln_kernel *k, int L_Q)
{
    return (unsigned)(((int64_t)L_Q * kiln__rows_a_token(k) + k->cfg.block_m - 1) / k->cfg.block_m);
}

/* Rows of the tile map of L_Q query tokens (params.h). */
static unsigned map_rows(const kiln_kernel *k, int L_Q)
{
    return (unsigned)kiln_tile_map_rows(L_Q, kiln__rows_a_token(k),
                                        kiln_tile_map_bm(k->cfg.block_m, k->cfg.wgmma));
}

/* Whether a single-request kernel claims its jobs from a counter after its tile map (the wgmma
 * family's dynamic persistent grid, KILN_TUNE persist=2 with element masks). */
static int map_counts_jobs(const kiln_kernel *k)
{
    return k->cfg.wgmma && k->cfg.persist == KILN_WGMMA_PERSIST_DYNAMIC &&
           k->v.kv == KILN_KV_CONTIGUOUS;
}

/* Bytes of a tile map of map rows x kv_tiles: the map, and where the kernel counts its jobs
 * there, the counter after it (kiln_tile_map_counter_at). */
static size_t map_bytes(const kiln_kernel *k, unsigned rows, int kv_tiles)
{
    const long long map = (long long)rows * kv_tiles;
    return (size_t)(map_counts_jobs(k) ? kiln_tile_map_counter_at(map) + KILN_TILE_MAP_TAIL_BYTES
                                       : map);
}

/* The call fits the kernel: the right op, a single-request kernel for a single request, and
 * loaded on the device. */
static kiln_status check_kernel(const kiln_kernel *k, kiln_op op, int batch, const char *what,
                                kiln__err *e)
{
    const kiln_variant *v = &k->v;
    if (v->op != op)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "%s: kernel %s is a %s kernel", what,
                          k->spec, kiln__op_name(v->op));
    if (!batch && v->kv != KILN_KV_CONTIGUOUS)
        return kiln__fail(
            e, KILN_STATUS_INVALID_ARGUMENT,
            "%s: kernel %s is a batch kernel (kv=%s): use kiln_plan_create, kiln_plan_schedule "
            "and kiln_plan_run",
            what, k->spec, kiln__kv_name(v->kv));
    if (!k->loaded)
        return kiln__fail(
            e, KILN_STATUS_INVALID_ARGUMENT,
            "%s: kernel %s (%s) was compiled for inspection, not loaded; use kiln_kernel_get", what,
            k->key, k->arch);
    return KILN_STATUS_OK;
}

/* The shape, the tensors' presence and alignment, and the run-time values the variant reads. */
static kiln_status check_args(const kiln_kernel *k, const kiln_attn_args *a, kiln_op op,
                              const char *what, kiln__err *e)
{
    const kiln_variant *v = &k->v;
    const int H = a->num_qo_heads, G = v->group;
    if (H < 1 || H % G)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "%s %s: num_qo_heads=%d must be a positive multiple of group=%d", what,
                          k->spec, H, G);
    if (a->kv_len < 1)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "%s %s: kv_len=%d must be >= 1", what,
                          k->spec, a->kv_len);
    if (!a->q || !a->k || !a->v || !a->o)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "%s %s: q, k, v and o must be non-zero",
                          what, k->spec);
    if (v->lse && !a->lse)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "%s %s: the variant writes lse but lse is 0", what, k->spec);
    if ((a->q | a->k | a->v) % 16 || a->o % 4 || (v->lse && a->lse % 4) ||
        (kiln__logits_alibi(v) && a->params.alibi_slopes % 4))
        return kiln__fail(
            e, KILN_STATUS_INVALID_ARGUMENT,
            "%s %s: q, k, v must be 16-byte aligned; o, lse, alibi_slopes 4-byte aligned", what,
            k->spec);
    const kiln_params *rp = &a->params;
    if (kiln__logits_softcap(v) && !(rp->softcap > 0.f))
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "%s %s: softcap must be > 0 (got %g)",
                          what, k->spec, (double)rp->softcap);
    if (kiln__logits_alibi(v) && !rp->alibi_slopes)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "%s %s: logits=%s needs alibi_slopes",
                          what, k->spec,
                          v->logits == KILN_LOGITS_ALIBI ? "alibi" : "softcap_alibi");
    if (v->window && rp->window_left < 0)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "%s %s: window_left must be >= 0 (got %d)", what, k->spec,
                          rp->window_left);
    if (!(rp->sm_scale >= 0.f))
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "%s %s: sm_scale must be >= 0", what,
                          k->spec);

    if (op == KILN_OP_PREFILL && a->qo_len < 0)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "%s %s: qo_len=%d < 0", what, k->spec,
                          a->qo_len);
    if (op == KILN_OP_PREFILL && v->mask == KILN_MASK_CAUSAL && a->qo_len > a->kv_len)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "%s %s: causal needs qo_len <= kv_len (got %d > %d)", what, k->spec,
                          a->qo_len, a->kv_len);
    return KILN_STATUS_OK;
}

/* The tensors and their strides (0: the dense default of the layout), checked. Zeroes *p
 * first. */
static kiln_status fill_tensors(const kiln_kernel *k, const kiln_attn_args *a,
                                kiln_launch_params *p, const char *what, kiln__err *e)
{
    const kiln_variant *v = &k->v;
    const int D = v->head_dim, H = a->num_qo_heads, L_KV = a->kv_len, H_KV = H / v->group;
    const int nhd = v->layout == KILN_LAYOUT_NHD;
    memset(p, 0, sizeof *p);
    p->q = a->q;
    p->k = a->k;
    p->v = a->v;
    p->o = a->o;
    p->lse = v->lse ? a->lse : 0;
    p->alibi = kiln__logits_alibi(v) ? a->params.alibi_slopes : 0;
    p->q_stride_h = a->q_stride_h ? a->q_stride_h : D;
    p->q_stride_n = a->q_stride_n ? a->q_stride_n : (int64_t)H * D;
    p->o_stride_h = a->o_stride_h ? a->o_stride_h : D;
    p->o_stride_n = a->o_stride_n ? a->o_stride_n : (int64_t)H * D;
    p->k_stride_n = a->k_stride_n ? a->k_stride_n : nhd ? (int64_t)H_KV * D : D;
    p->k_stride_h = a->k_stride_h ? a->k_stride_h : nhd ? D : (int64_t)L_KV * D;
    p->v_stride_n = a->v_stride_n ? a->v_stride_n : nhd ? (int64_t)H_KV * D : D;
    p->v_stride_h = a->v_stride_h ? a->v_stride_h : nhd ? D : (int64_t)L_KV * D;
    const int fp8 = kiln__kv_fp8(v);
    if ((p->q_stride_h | p->q_stride_n) % 8 ||
        (p->k_stride_n | p->k_stride_h | p->v_stride_n | p->v_stride_h) % (fp8 ? 16 : 8) ||
        (p->o_stride_h | p->o_stride_n) % 2)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "%s %s: q strides must be multiples of 8 elements, k/v strides of 16 "
                          "bytes, o strides even",
                          what, k->spec);
    return KILN_STATUS_OK;
}

/* The run-time scalars: K/V scales, RoPE, lengths and heads, window, sm_scale, softcap, the
 * LSE's base. */
static kiln_status fill_values(const kiln_kernel *k, const kiln_attn_args *a, kiln_op op,
                               kiln_launch_params *p, const char *what, kiln__err *e)
{
    const kiln_variant *v = &k->v;
    const kiln_params *rp = &a->params;
    const int fp8 = kiln__kv_fp8(v);
    /* fp8: e4m3 is decoded through f16 bits at 2^-8 of its value (device.cuh) */
    const float k_scale = rp->k_scale != 0.f ? rp->k_scale : 1.f,
                v_scale = rp->v_scale != 0.f ? rp->v_scale : 1.f;
    if ((fp8 && !(k_scale > 0.f && k_scale < INFINITY)) || !(v_scale > 0.f && v_scale < INFINITY))
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "%s %s: k_scale (fp8 KV) and v_scale must be finite and > 0 (got %g, %g)",
                          what, k->spec, (double)rp->k_scale, (double)rp->v_scale);
    if (rp->lse_base2 != 0 && rp->lse_base2 != 1)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "%s %s: lse_base2 is 0 (natural log) or 1 (base 2), got %d", what,
                          k->spec, rp->lse_base2);
    const float fp8_unit = v->kv_dtype == KILN_DTYPE_E4M3 ? 256.f : 1.f;
    p->k_scale = fp8 ? k_scale * fp8_unit : 1.f;
    p->v_scale = fp8 ? v_scale * fp8_unit : v_scale;   /* 16-bit: o's factor */
    p->lse_unit = rp->lse_base2 ? 1.0f : (float)M_LN2; /* device.cuh's LN2 */
    if (v->rope) {
        const float rs = rp->rope_scale != 0.f ? rp->rope_scale : 1.f,
                    th = rp->rope_theta != 0.f ? rp->rope_theta : 1e4f;
        if (!(rs > 0.f) || !(th > 0.f))
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "%s %s: rope_scale and rope_theta must be > 0", what, k->spec);
        p->rope_rcp_scale = 1.f / rs;
        p->rope_log2_theta = log2f(th);
    }
    p->qo_len = op == KILN_OP_DECODE ? 1 : a->qo_len;
    p->kv_len = a->kv_len;
    p->num_qo_heads = a->num_qo_heads;
    p->num_kv_heads = a->num_qo_heads / v->group;
    p->window_left = v->window ? rp->window_left : 0;
    p->sm_scale = rp->sm_scale > 0.f ? rp->sm_scale : 1.0f / __builtin_sqrtf((float)v->head_dim);
    p->softcap = kiln__logits_softcap(v) ? rp->softcap : 1.0f;
    return KILN_STATUS_OK;
}

/* Mask data (bits or blocks) and, for prefill, the key tiles and the tile map. */
static kiln_status fill_mask(const kiln_kernel *k, const kiln_attn_args *a, kiln_op op,
                             kiln_launch_params *p, const char *what, kiln__err *e)
{
    const kiln_variant *v = &k->v;
    if (v->mask_data == KILN_MASK_DATA_BITMASK) {
        if (!a->mask_bits)
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "%s %s: mask_data=bitmask needs mask_bits", what, k->spec);
        p->mask_bits = a->mask_bits;
    } else if (v->mask_data == KILN_MASK_DATA_BSR) {
        if (!a->bsr_indptr || !a->bsr_indices || a->bsr_r < 1 || a->bsr_c < 1 ||
            (a->bsr_indptr | a->bsr_indices) % 4)
            return kiln__fail(
                e, KILN_STATUS_INVALID_ARGUMENT,
                "%s %s: mask_data=bsr needs 4-byte aligned bsr_indptr and bsr_indices and "
                "bsr_r, bsr_c >= 1 (got r=%d c=%d)",
                what, k->spec, a->bsr_r, a->bsr_c);
        p->bsr_indptr = a->bsr_indptr;
        p->bsr_indices = a->bsr_indices;
        p->bsr_r = a->bsr_r;
        p->bsr_c = a->bsr_c;
    }
    if (op == KILN_OP_PREFILL) {
        p->kv_tiles = (a->kv_len + k->cfg.block_n - 1) / k->cfg.block_n;
        if (kiln__variant_has_element_mask(v) && a->tile_map) {
            const size_t need = map_bytes(k, map_rows(k, p->qo_len), p->kv_tiles);
            if (map_counts_jobs(k) && a->tile_map % 4)
                return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                                  "%s %s: tile_map must be 4-byte aligned (persist=2 counts its "
                                  "jobs in an int after the map)",
                                  what, k->spec);
            if (a->tile_map_bytes < need)
                return kiln__fail(e, KILN_STATUS_WORKSPACE,
                                  "%s %s: tile_map holds %zu bytes, the shape needs %zu "
                                  "(kiln_prefill_tile_map_size)",
                                  what, k->spec, a->tile_map_bytes, need);
            p->tile_map = a->tile_map;
        }
    }
    return KILN_STATUS_OK;
}

/* The variant's user parameters, as the 64-bit slots of the parameter block. */
static kiln_status fill_user(const kiln_kernel *k, const kiln_attn_args *a, kiln_launch_params *p,
                             const char *what, kiln__err *e)
{
    const kiln_variant *v = &k->v;
    for (int i = 0; i < v->num_params && i < KILN_MAX_USER_PARAMS; i++) {
        const kiln_param_decl *d = &v->params[i];
        const kiln_param_value *u = &a->params.user[i];
        if (d->type == KILN_PARAM_F32) {
            uint32_t bits;
            memcpy(&bits, &u->f32, sizeof bits);
            p->user[i] = bits;
        } else if (d->type == KILN_PARAM_I32) {
            p->user[i] = (uint32_t)u->i32;
        } else {
            if (!u->ptr || u->ptr % 4)
                return kiln__fail(
                    e, KILN_STATUS_INVALID_ARGUMENT,
                    "%s %s: user parameter '%s' is an array and needs a 4-byte aligned "
                    "device pointer (got 0x%llx)",
                    what, k->spec, d->name, (unsigned long long)u->ptr);
            p->user[i] = u->ptr;
        }
    }
    return KILN_STATUS_OK;
}

/* Checks shared by decode and prefill, single and batch; fills the common part of the
 * parameter block: the kernel → the arguments → tensors → values → mask → user parameters. */
static kiln_status prepare_as(kiln_kernel *k, const kiln_attn_args *a, kiln_op op, int batch,
                              kiln_launch_params *p, kiln__err *e)
{
    const char *what = batch ? (op == KILN_OP_DECODE ? "batch decode" : "batch prefill")
                       : op == KILN_OP_DECODE ? "single decode"
                                              : "single prefill";
    if (!k || !a)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "%s: NULL kernel or args", what);
    kiln_status st = check_kernel(k, op, batch, what, e);
    if (!st) st = check_args(k, a, op, what, e);
    if (!st) st = fill_tensors(k, a, p, what, e);
    if (!st) st = fill_values(k, a, op, p, what, e);
    if (!st) st = fill_mask(k, a, op, p, what, e);
    if (!st) st = fill_user(k, a, p, what, e);
    return st;
}

/* A single request's parameter block; a failure is recorded as the context's error. */
static kiln_status prepare(kiln_kernel *k, const kiln_attn_args *a, kiln_op op,
                           kiln_launch_params *p, kiln__err *e)
{
    return fail(k, prepare_as(k, a, op, 0, p, e), e);
}

/* The status of a launch: a driver failure recorded as "<what> <spec>: launch: ...". */
static kiln_status launched(kiln_kernel *k, CUresult r, const char *what, kiln__err *e)
{
    if (r == CUDA_SUCCESS) return KILN_STATUS_OK;
    return fail(k, kiln__cu_fail(e, r, "%s %s: launch", what, k->spec), e);
}

/* The parameter block of a batch run: the checks and run-time values shared with single
 * requests, then the KV strides of the storage (paged: per page too), the page table and the
 * RoPE offsets; batch.c fills in the schedule. Failures are not recorded (the caller does). */
kiln_status kiln__batch_prepare(kiln_kernel *k, const kiln_batch_args *b, int H, int page_size,
                                int bsr_r, int bsr_c, kiln_launch_params *p, kiln__err *e)
{
    const kiln_attn_args a = {.q = b->q,
                              .k = b->k,
                              .v = b->v,
                              .o = b->o,
                              .lse = b->lse,
                              .num_qo_heads = H,
                              .kv_len = 1,
                              .q_stride_n = b->q_stride_n,
                              .q_stride_h = b->q_stride_h,
                              .o_stride_n = b->o_stride_n,
                              .o_stride_h = b->o_stride_h,
                              .params = b->params,
                              .mask_bits = b->mask_bits,
                              .bsr_indptr = b->bsr_indptr,
                              .bsr_indices = b->bsr_indices,
                              .bsr_r = bsr_r,
                              .bsr_c = bsr_c};
    kiln_status st = prepare_as(k, &a, k ? k->v.op : KILN_OP_DECODE, 1, p, e);
    if (st) return st;
    p->page_size = page_size;
    const int D = k->v.head_dim, HK = H / k->v.group;
    if (k->v.kv == KILN_KV_PAGED) {
        const int nhd = k->v.layout == KILN_LAYOUT_NHD, ps = page_size;
        p->k_stride_n = b->k_stride_n ? b->k_stride_n : nhd ? (int64_t)HK * D : D;
        p->k_stride_h = b->k_stride_h ? b->k_stride_h : nhd ? D : (int64_t)ps * D;
        p->k_stride_page = b->k_stride_page ? b->k_stride_page : (int64_t)ps * HK * D;
        p->v_stride_n = b->v_stride_n ? b->v_stride_n : nhd ? (int64_t)HK * D : D;
        p->v_stride_h = b->v_stride_h ? b->v_stride_h : nhd ? D : (int64_t)ps * D;
        p->v_stride_page = b->v_stride_page ? b->v_stride_page : (int64_t)ps * HK * D;
        if (!b->kv_indices || b->kv_indices % 4)
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "run %s: kv=paged needs kv_indices (int32, 4-byte aligned)", k->spec);
        p->kv_indices = b->kv_indices;
    } else {
        p->k_stride_n = b->k_stride_n ? b->k_stride_n : (int64_t)HK * D;
        p->k_stride_h = b->k_stride_h ? b->k_stride_h : D;
        p->v_stride_n = b->v_stride_n ? b->v_stride_n : (int64_t)HK * D;
        p->v_stride_h = b->v_stride_h ? b->v_stride_h : D;
    }
    const int es = kiln__kv_fp8(&k->v) ? 1 : 2;
    const int64_t align = 16 / es;
    if ((p->k_stride_n | p->k_stride_h | p->k_stride_page | p->v_stride_n | p->v_stride_h |
         p->v_stride_page) %
        align)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "run %s: k/v strides must be multiples of %lld elements (16 bytes)",
                          k->spec, (long long)align);
    if (k->v.rope && b->rope_offsets % 4)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "run %s: rope_offsets must be 4-byte aligned", k->spec);
    p->rope_offsets = k->v.rope ? b->rope_offsets : 0;
    return KILN_STATUS_OK;
}

/* Splits a decode of n keys may use: at most one wave of CTAs (a partial second wave would
 * double the time of the whole launch) and no more splits than warp tiles of keys. Never
 * decreases as n grows. */
static int decode_split_bound(const kiln_kernel *k, int H, int n)
{
    const kiln__config *c = &k->cfg;
    const int per_split_min = KILN_DECODE_TILE * c->warps; /* every warp gets a tile */
    const int base = (H / k->v.group) * (k->v.group / c->gb);
    const int sms = k->ctx->info.sm_count > 0 ? k->ctx->info.sm_count : 1;
    const int slots = sms * (k->ctas_per_sm > 0 ? k->ctas_per_sm : 1);
    int bound = slots / base;
    const int by_len = (n + per_split_min - 1) / per_split_min;
    if (bound > by_len) bound = by_len;
    return bound < 1 ? 1 : bound;
}

/* The split of a single decode's keys: the first key it sees, keys per split (whole warp
 * tiles) and splits per KV head, never more than kiln_decode_workspace_size sized for. */
static void decode_split(const kiln_kernel *k, int H, int L_KV, int window, int window_left,
                         int *kv_begin, int *chunk, int *splits)
{
    const int per_split_min = KILN_DECODE_TILE * k->cfg.warps;
    const int begin = window ? (L_KV - 1 - window_left > 0 ? L_KV - 1 - window_left : 0) : 0;
    const int n = L_KV - begin;
    const int want = decode_split_bound(k, H, n);
    int ch = (n + want - 1) / want;
    ch = (ch + per_split_min - 1) / per_split_min * per_split_min;
    *kv_begin = begin;
    *chunk = ch;
    *splits = (n + ch - 1) / ch;
    /* every key in a split, and no more splits than the workspace bound of the whole length */
    KILN__ASSERT(*splits >= 1 && (int64_t)*splits * ch >= n);
    KILN__ASSERT_LE(*splits, decode_split_bound(k, H, L_KV));
}

static size_t decode_ws(int splits, int H, int D)
{
    return splits > 1 ? (size_t)splits * H * (D + 1) * sizeof(float) : 0;
}

kiln_status kiln_decode_workspace_size(const kiln_kernel *k, int num_qo_heads, int kv_len,
                                       size_t *bytes)
{
    kiln__err e = {{0}};
    if (!bytes || !k)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT,
                          "workspace size: NULL argument");
    *bytes = 0;
    if (k->v.op != KILN_OP_DECODE || num_qo_heads < 1 || num_qo_heads % k->v.group || kv_len < 1) {
        kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                   "workspace size: %s with num_qo_heads=%d kv_len=%d is not a valid decode shape",
                   k->spec, num_qo_heads, kv_len);
        return kiln__ctx_error(k->ctx, KILN_STATUS_INVALID_ARGUMENT, &e);
    }
    /* The split's bound for the whole length (a window only shrinks the split): it never
     * decreases with kv_len, so one buffer sized for the longest request serves all. */
    const int bound = decode_split_bound(k, num_qo_heads, kv_len);
    *bytes = decode_ws(bound, num_qo_heads, k->v.head_dim);
    return KILN_STATUS_OK;
}

CUresult kiln__launch_merge(const kiln_kernel *k, unsigned gx, unsigned gy, int wide,
                            CUstream stream, void **args)
{
    const kiln__cu *cu = k->ctx->cu;
    const unsigned threads = (unsigned)k->cfg.merge_threads;
    KILN__ASSERT(!wide || k->fn_merge_wide); /* only batch decode plans ask for it */
    CUfunction fn = wide ? k->fn_merge_wide : k->fn_merge;
    if (!k->cfg.pdl || !cu->cuLaunchKernelEx) /* no PDL, or a driver without the launch */
        return cu->cuLaunchKernel(fn, gx, gy, 1, threads, 1, 1, 0, stream, args, NULL);
    KILN__ASSERT(k->ctx->arch_sm >= 90); /* the config refuses pdl=1 below sm_90 */
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    const CUlaunchConfig c = {.gridDimX = gx,
                              .gridDimY = gy,
                              .gridDimZ = 1,
                              .blockDimX = threads,
                              .blockDimY = 1,
                              .blockDimZ = 1,
                              .sharedMemBytes = 0,
                              .hStream = stream,
                              .attrs = &attr,
                              .numAttrs = 1};
    return cu->cuLaunchKernelEx(&c, fn, args, NULL);
}

kiln_status kiln_single_decode(kiln_kernel *k, const kiln_attn_args *a, void *stream)
{
    kiln__err e;
    kiln_launch_params p;
    kiln_status st = prepare(k, a, KILN_OP_DECODE, &p, &e);
    if (st) return st;
    const int H = a->num_qo_heads, D = k->v.head_dim;
    decode_split(k, H, a->kv_len, k->v.window, p.window_left, &p.kv_begin, &p.kv_chunk,
                 &p.num_splits);
    if (p.num_splits > 1) {
        const size_t need = decode_ws(p.num_splits, H, D);
        if (!a->workspace || a->workspace_bytes < need) {
            kiln__fail(
                &e, KILN_STATUS_WORKSPACE,
                "single decode %s: kv_len=%d is split %d ways and needs %zu bytes of workspace "
                "(given %zu); see kiln_decode_workspace_size",
                k->spec, a->kv_len, p.num_splits, need, a->workspace ? a->workspace_bytes : 0);
            return fail(k, KILN_STATUS_WORKSPACE, &e);
        }
        if (a->workspace % 16)
            return fail(k,
                        kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                                   "single decode %s: workspace must be 16-byte aligned", k->spec),
                        &e);
        p.partial_o = a->workspace;
        p.partial_lse = a->workspace + (size_t)p.num_splits * H * D * sizeof(float);
    }
    const kiln__cu *cu = k->ctx->cu;
    void *args[] = {&p};
    const unsigned hk = (unsigned)(H / k->v.group), gz = (unsigned)(k->v.group / k->cfg.gb);
    CUresult r =
        cu->cuLaunchKernel(k->fn_main, (unsigned)p.num_splits, hk, gz, (unsigned)k->cfg.threads, 1,
                           1, (unsigned)k->cfg.smem_bytes, (CUstream)stream, args, NULL);
    if (r == CUDA_SUCCESS && p.num_splits > 1)
        r = kiln__launch_merge(k, (unsigned)H, 1, 0, (CUstream)stream, args);
    return launched(k, r, "single decode", &e);
}

unsigned kiln__persistent_grid(const kiln_kernel *k, int64_t jobs)
{
    const int64_t slots = (int64_t)(k->ctx->info.sm_count > 0 ? k->ctx->info.sm_count : 1) *
                          (k->ctas_per_sm > 0 ? k->ctas_per_sm : 1);
    return (unsigned)(jobs < 1 ? 1 : jobs < slots ? jobs : slots);
}

kiln_status kiln__wgmma_grid(const kiln_kernel *k, int64_t jobs, const char *what, unsigned *gx,
                             kiln__err *e)
{
    if (k->cfg.persist) {
        *gx = kiln__persistent_grid(k, jobs);
        return KILN_STATUS_OK;
    }
    if (jobs > INT32_MAX)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "%s: %lld (work, head) jobs, a CTA each: more than a grid holds "
                          "(2^31 - 1)",
                          what, (long long)jobs);
    *gx = (unsigned)jobs;
    return KILN_STATUS_OK;
}

kiln_status kiln_single_prefill(kiln_kernel *k, const kiln_attn_args *a, void *stream)
{
    kiln__err e;
    kiln_launch_params p;
    kiln_status st = prepare(k, a, KILN_OP_PREFILL, &p, &e);
    if (st) return st;
    if (a->qo_len == 0) return KILN_STATUS_OK; /* an empty request: nothing to write */
    if (map_counts_jobs(k) && !p.tile_map)
        return fail(k,
                    kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                               "single prefill %s: persist=2 (KILN_TUNE) claims its jobs from a "
                               "counter after the tile map: plan one (kiln_prefill_tile_map) and "
                               "pass it",
                               k->spec),
                    &e);
    const unsigned mblocks = q_tiles(k, a->qo_len);
    kiln_tma_maps maps;
    void *args[] = {&p, &maps};
    if (kiln__config_tma_maps(&k->cfg) &&
        (st = kiln__tma_maps(k, &p, "single prefill", a->qo_len, a->kv_len, &maps, &e)))
        return fail(k, st, &e);
    /* the wgmma family: its mblocks x H jobs along x (with pack=1 mblocks x H_KV: a job takes
     * the G heads of a KV head); the mma.sync family: (tiles, heads) */
    unsigned gx = mblocks, gy = (unsigned)a->num_qo_heads;
    p.job_heads = kiln__job_heads(k, a->kv_len, a->num_qo_heads);
    if (k->cfg.wgmma) {
        gy = 1;
        if ((st = kiln__wgmma_grid(k, (int64_t)mblocks * (a->num_qo_heads / kiln__rows_a_token(k)),
                                   "single prefill", &gx, &e)))
            return fail(k, st, &e);
    }
    CUresult r =
        k->ctx->cu->cuLaunchKernel(k->fn_main, gx, gy, 1, (unsigned)k->cfg.threads, 1, 1,
                                   (unsigned)k->cfg.smem_bytes, (CUstream)stream, args, NULL);
    return launched(k, r, "single prefill", &e);
}

kiln_status kiln_prefill_tile_map_size(const kiln_kernel *k, int qo_len, int kv_len, size_t *bytes)
{
    kiln__err e;
    if (!k || !bytes)
        return kiln__fail(kiln__tls_err(), KILN_STATUS_INVALID_ARGUMENT,
                          "tile map size: NULL argument");
    *bytes = 0;
    if (k->v.op != KILN_OP_PREFILL || !kiln__variant_has_element_mask(&k->v) || qo_len < 0 ||
        kv_len < 1) {
        kiln__fail(
            &e, KILN_STATUS_INVALID_ARGUMENT,
            "tile map size: %s with qo_len=%d kv_len=%d: needs a prefill variant with a mask "
            "snippet or mask data, qo_len >= 0, kv_len >= 1",
            k->spec, qo_len, kv_len);
        return kiln__ctx_error(k->ctx, KILN_STATUS_INVALID_ARGUMENT, &e);
    }
    *bytes = map_bytes(k, map_rows(k, qo_len), (kv_len + k->cfg.block_n - 1) / k->cfg.block_n);
    return KILN_STATUS_OK;
}

kiln_status kiln_prefill_tile_map(kiln_kernel *k, const kiln_attn_args *a, void *stream)
{
    kiln__err e;
    kiln_launch_params p;
    kiln_status st = prepare(k, a, KILN_OP_PREFILL, &p, &e);
    if (st) return st;
    if (!kiln__variant_has_element_mask(&k->v) || !p.tile_map)
        return fail(k,
                    kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                               "tile map %s: needs a mask snippet or mask data and a tile_map",
                               k->spec),
                    &e);
    if (a->qo_len == 0) return KILN_STATUS_OK;
    /* Resolved here rather than at load: the tile map is not on the per-step path. */
    CUfunction fn = NULL;
    CUresult r = k->ctx->cu->cuModuleGetFunction(&fn, k->module, KILN__ENTRY_TILE_MAP);
    if (r == CUDA_SUCCESS) {
        void *args[] = {&p};
        const unsigned mblocks = map_rows(k, a->qo_len);
        r = k->ctx->cu->cuLaunchKernel(fn, mblocks, (unsigned)p.kv_tiles, 1, KILN__TILE_MAP_THREADS,
                                       1, 1, 0, (CUstream)stream, args, NULL);
    }
    return launched(k, r, "tile map", &e);
}

/* ---- deprecated names (kiln.h): the same functions under their 0.1 names ------------------ */

kiln_status kiln_prefill_mask_plan_size(const kiln_kernel *k, int qo_len, int kv_len, size_t *bytes)
{
    return kiln_prefill_tile_map_size(k, qo_len, kv_len, bytes);
}

kiln_status kiln_prefill_mask_plan(kiln_kernel *k, const kiln_attn_args *a, void *stream)
{
    return kiln_prefill_tile_map(k, a, stream);
}
