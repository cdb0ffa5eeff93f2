/*
 * config.c — the tile configuration of each kernel family, derived from the variant and the
 * target arch only, so that the runtime can recompute the launch geometry of a cached kernel.
 * The shared-memory formulas are the contract's (templates/common/params.h), which the
 * templates' layouts use too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit.h"
#include "params.h"

/* expand.c writes the public enum values into kiln_cfg; the templates switch on the contract's */
#define SAME_ID(pub, id) ((int)(pub) == (int)(id))
_Static_assert(SAME_ID(KILN_KV_CONTIGUOUS, KILN_ID_KV_CONTIGUOUS) &&
                   SAME_ID(KILN_KV_RAGGED, KILN_ID_KV_RAGGED) &&
                   SAME_ID(KILN_KV_PAGED, KILN_ID_KV_PAGED),
               "kv storage ids");
_Static_assert(SAME_ID(KILN_DTYPE_F16, KILN_ID_F16) && SAME_ID(KILN_DTYPE_BF16, KILN_ID_BF16) &&
                   SAME_ID(KILN_DTYPE_F16, KILN_ID_KV_F16) &&
                   SAME_ID(KILN_DTYPE_BF16, KILN_ID_KV_BF16) &&
                   SAME_ID(KILN_DTYPE_E4M3, KILN_ID_KV_E4M3) &&
                   SAME_ID(KILN_DTYPE_E5M2, KILN_ID_KV_E5M2),
               "dtype ids");
_Static_assert(SAME_ID(KILN_LOGITS_NONE, KILN_ID_LOGITS_NONE) &&
                   SAME_ID(KILN_LOGITS_SOFTCAP, KILN_ID_LOGITS_SOFTCAP) &&
                   SAME_ID(KILN_LOGITS_ALIBI, KILN_ID_LOGITS_ALIBI),
               "logits ids");
_Static_assert(SAME_ID(KILN_MASK_DATA_NONE, KILN_ID_MASK_DATA_NONE) &&
                   SAME_ID(KILN_MASK_DATA_BITMASK, KILN_ID_MASK_DATA_BITMASK) &&
                   SAME_ID(KILN_MASK_DATA_BSR, KILN_ID_MASK_DATA_BSR),
               "mask data ids");
#undef SAME_ID

enum {
    DECODE_MAX_GB = 8, /* query heads per decode CTA (register bound) */
    MAX_WARPS = 16,
};

int kiln__smem_limit(int sm)
{
    switch (sm) {
        case 80:
        case 87:
            return 166912; /* 163 KiB */
        case 90:
        case 100:
        case 103:
            return 232448; /* 227 KiB */
        default:
            return 101376; /* 99 KiB: sm_86, sm_89, sm_120, ... */
    }
}

static int is_fp8(kiln_dtype t) { return t == KILN_DTYPE_E4M3 || t == KILN_DTYPE_E5M2; }

static int decode_smem(const kiln_variant *v, int gb, int warps, int stages)
{
    return kiln_decode_smem_bytes(v->head_dim, is_fp8(v->kv_dtype) ? 1 : 2, gb, warps, stages,
                                  v->kv == KILN_KV_PAGED, v->rope);
}

static int prefill_smem(const kiln_variant *v, int warps, int mt, int bn, int stages)
{
    return kiln_prefill_smem_bytes(v->head_dim, is_fp8(v->kv_dtype) ? 1 : 2, warps * mt * 16, bn,
                                   stages, v->kv == KILN_KV_PAGED, v->rope);
}

/* Apply "key=value" overrides from KILN_TUNE. */
static kiln_status apply_tune(kiln__config *c, kiln__err *e)
{
    const char *t = getenv("KILN_TUNE");
    if (!t || !*t) return KILN_STATUS_OK;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", t);
    char *save = NULL;
    for (char *tok = strtok_r(buf, " ,", &save); tok; tok = strtok_r(NULL, " ,", &save)) {
        char *eq = strchr(tok, '=');
        int val = eq ? atoi(eq + 1) : -1;
        if (!eq || val < 0)
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT, "KILN_TUNE: bad token '%s'", tok);
        *eq = 0;
        if (!strcmp(tok, "warps")) c->warps = val;
        else if (!strcmp(tok, "mt")) c->mt = val;
        else if (!strcmp(tok, "bn")) c->block_n = val;
        else if (!strcmp(tok, "stages")) c->stages = val;
        else if (!strcmp(tok, "qregs")) c->q_in_regs = val;
        else if (!strcmp(tok, "gb")) c->gb = val;
        else if (!strcmp(tok, "minb")) c->min_blocks = val;
        else if (!strcmp(tok, "pack")) c->pack = val;
        else
            return kiln__fail(
                e, KILN_STATUS_INVALID_ARGUMENT,
                "KILN_TUNE: unknown field '%s' (warps, mt, bn, stages, qregs, gb, minb, pack)",
                tok);
    }
    return KILN_STATUS_OK;
}

/* Tensor-core decode: a batch whose group fills a useful part of the m16 MMA rows and divides
 * them (G in {4, 8, 16}); smaller groups would waste 15/16 or 7/8 of every MMA, and their CUDA-core
 * kernel reads each K/V row once anyway. 16-bit KV only (H200, B64 x 4096 paged, G 4, GB/s
 * tensor / CUDA cores): bf16 d64 3785 / 3553, d128 3990 / 3492, d256 4173 / 3065, but fp8 KV
 * 1199 / 2100 (its tiles are widened through shared memory behind a block barrier, which a
 * one-warp CTA pays in full). */
static int decode_packs(const kiln_variant *v)
{
    return v->kv != KILN_KV_CONTIGUOUS && v->group >= 4 && 16 % v->group == 0 &&
           !is_fp8(v->kv_dtype);
}

/* Plain attention: no logits transform, window, element mask, RoPE or fp8 conversion, so the
 * softmax adds no live registers to the MMA loop. */
static int prefill_plain(const kiln_variant *v)
{
    return v->logits == KILN_LOGITS_NONE && !v->window && v->mask_data == KILN_MASK_DATA_NONE &&
           !v->logits_expr[0] && !v->mask_expr[0] && !v->rope && !is_fp8(v->kv_dtype);
}

/* The prefill-shaped kernel: prefill, and decode on tensor cores (pack). */
static kiln_status pick_mma(const kiln_variant *v, int smem_limit, kiln__config *c, kiln__err *e)
{
    const int d = v->head_dim, decode = v->op == KILN_OP_DECODE;
    if (decode) {
        /* One warp of 16 packed rows (G heads of one token) per CTA and small K/V tiles, so
         * that four or five CTAs per SM hide each other's loads. H200, B64 x 4096 paged bf16
         * (TB/s): d128 bn 32 / 3 stages 3.98, 2 stages 3.87, 4 stages 2.72 (3 CTAs per SM),
         * bn 64 / 2 stages 2.75, 2 warps 3.57, 4 warps 3.14 (the extra warps run on empty
         * rows), CUDA-core decode 3.49; d64 bn 32 / 3 stages 3.79, bn 64 3.21, CUDA cores 3.55;
         * d256 bn 16 / 2 stages 4.17, bn 16 / 3 stages 2.81, bn 32 / 2 stages 3.34, CUDA cores
         * 3.07. */
        c->warps = 1;
        c->block_n = d > 128 ? 16 : 32;
        c->stages = d > 128 ? 2 : 3;
    } else {
        c->warps = 4;
        c->block_n = d > 128 ? 32 : 64;
        c->stages = 2;
    }
    c->mt = 1;
    c->q_in_regs = d <= 128;
    if (!decode && d > 128 && prefill_smem(v, 8, 1, 64, 2) <= smem_limit) {
        /* d256 where 8 warps with 64-key tiles fit (sm_90: 192 KiB, one CTA per SM): each Q
         * fragment reload from shared memory then serves 8 MMAs instead of 4. H200, causal 4096:
         * 245.4 -> 275.1 TFLOP/s (8 warps, 64 keys, single-buffered: 255.7); no spills in the
         * variants (soft-cap, ALiBi + window, RoPE, mask data: 247-255 registers). */
        c->warps = 8;
        c->block_n = 64;
    }
    if (!decode && !c->pack && prefill_plain(v) && d <= 128) {
        /* Two m16 tiles per warp (128-row CTAs) halve the K/V fragment loads per MMA, which
         * bound the 64-row kernel on shared-memory bandwidth; Q then leaves the registers at
         * d128 (ptxas: 255 registers, 24 B spilled). H200, TFLOP/s, same lease, 64-row /
         * 128-row: d128 causal single request H32, L 1024 158.0 / 141.6, 4096 285.1 / 277.5,
         * 16384 321.6 / 348.3; ragged batches 16x1024 259.8 / 264.9, 4x4096 312.3 / 330.6,
         * 1x16384 313.6 / 346.1; paged 16x1024 231.0 / 242.7, 4x4096 279.4 / 304.7, 1x16384
         * 293.5 / 325.8 (1x1024: 139.6 / 126.9); d64 causal 4096 241.8 / 256.2 (Q stays in
         * registers, no spill). Packed prefill (KILN_TUNE pack=1) keeps 64 rows. The variants lose with it (logit transforms, masks and windows add live
         * registers: 80-460 B of spills; soft-cap 250.6 / 227.1) and keep 64 rows. */
        c->mt = 2;
        c->q_in_regs = d < 128;
    }
    kiln_status st = apply_tune(c, e);
    if (st) return st;
    if (c->gb)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "config: %s takes no gb (KILN_TUNE)",
                          decode ? "tensor-core decode" : "prefill");
    c->block_m = c->warps * c->mt * 16;
    c->merge_threads = v->kv != KILN_KV_CONTIGUOUS ? (decode ? d : 128) : 0;
    c->smem_bytes = prefill_smem(v, c->warps, c->mt, c->block_n, c->stages);
    if (c->warps < 1 || c->warps > MAX_WARPS || c->mt < 1 || c->mt > 4 || c->block_n < 16 ||
        c->block_n % 16 || c->stages < 1 || c->stages > 4)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: %s warps=%d mt=%d bn=%d stages=%d is not valid",
                          decode ? "tensor-core decode" : "prefill", c->warps, c->mt, c->block_n,
                          c->stages);
    if (c->pack && (v->kv == KILN_KV_CONTIGUOUS || c->block_m % v->group))
        return kiln__fail(
            e, KILN_STATUS_UNSUPPORTED,
            "config: pack=1 needs a batch (kv=ragged|paged) and a group dividing the %d rows "
            "of a CTA tile (group=%d)",
            c->block_m, v->group);
    return KILN_STATUS_OK;
}

kiln_status kiln__config_pick(const kiln_variant *v, int sm, kiln__config *c, kiln__err *e)
{
    memset(c, 0, sizeof *c);
    c->min_blocks = 1;
    const int d = v->head_dim, limit = kiln__smem_limit(sm);
    /* pack first: it decides which kernel family the other fields describe */
    c->pack = v->op == KILN_OP_DECODE && decode_packs(v);
    kiln_status st = apply_tune(c, e);
    if (st) return st;
    const int pack = c->pack;
    memset(c, 0, sizeof *c);
    c->min_blocks = 1;
    c->pack = pack;
    if (v->op == KILN_OP_MERGE) {
        c->warps = d / 32;
        c->threads = d;
        c->block_m = 1;
        c->merge_threads = d;
        return KILN_STATUS_OK;
    }
    if (v->op == KILN_OP_DECODE && c->pack) {
        if ((st = pick_mma(v, limit, c, e))) return st;
    } else if (v->op == KILN_OP_DECODE) {
        c->gb = 1;
        for (int g = 1; g <= DECODE_MAX_GB && g <= v->group; g++)
            if (v->group % g == 0) c->gb = g;
        c->block_n = KILN_DECODE_TILE;
        /* Four warps, double-buffered; where that does not fit (d256 on sm_90, d128 on 99 KiB
         * parts) four single-buffered warps beat two double-buffered ones (measured on H200:
         * d256 2.7 vs 1.6 TB/s at L_KV 32768), then fewer warps. */
        c->stages = 2;
        c->warps = 4;
        /* Batches of 16-bit KV: single-buffered warps, so that three CTAs (12 warps) share an
         * SM and hide each other's loads (H200, B64 x 4096 paged: 3.50 vs 3.08 TB/s; a lone
         * long request loses 9 %, 2.15 vs 2.35). */
        if (v->kv != KILN_KV_CONTIGUOUS && !is_fp8(v->kv_dtype)) c->stages = 1;
        if (decode_smem(v, c->gb, c->warps, c->stages) > limit) c->stages = 1;
        while (c->warps > 1 && decode_smem(v, c->gb, c->warps, c->stages) > limit) c->warps /= 2;
        if ((st = apply_tune(c, e))) return st;
        if (c->block_n != KILN_DECODE_TILE || c->mt || c->q_in_regs)
            return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                              "config: decode takes bn=%d only and no mt/qregs (KILN_TUNE)",
                              KILN_DECODE_TILE);
        c->block_m = c->gb;
        c->smem_bytes = decode_smem(v, c->gb, c->warps, c->stages);
        c->merge_threads = d;
        if (c->gb < 1 || v->group % c->gb || c->stages < 1 || c->warps < 1 || c->warps > MAX_WARPS)
            return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                              "config: decode gb=%d stages=%d warps=%d is not valid for group %d",
                              c->gb, c->stages, c->warps, v->group);
    } else if ((st = pick_mma(v, limit, c, e))) {
        return st;
    }
    c->threads = c->warps * 32;
    if (c->min_blocks < 1 || c->min_blocks * c->threads > 2048)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "config: minb=%d is not valid for %d threads",
                          c->min_blocks, c->threads);
    if (c->smem_bytes > limit)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: %d bytes of shared memory exceed the %d of sm_%d", c->smem_bytes,
                          limit, sm);
    return KILN_STATUS_OK;
}

void kiln__config_format(const kiln__config *c, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "threads=%d smem=%d block_m=%d block_n=%d warps=%d stages=%d mt=%d qregs=%d gb=%d "
             "minb=%d merge=%d pack=%d",
             c->threads, c->smem_bytes, c->block_m, c->block_n, c->warps, c->stages, c->mt,
             c->q_in_regs, c->gb, c->min_blocks, c->merge_threads, c->pack);
}
