/*
 * config.c — the tile configuration of each kernel family, derived from the variant and the
 * target arch only, so that the runtime can recompute the launch geometry of a cached kernel.
 *
 * The choices are one table (tile_rows): a row per kernel family x head dim x shared-memory
 * class, with a one-line reason; the measurements behind the rows are in docs/perf/notes.md
 * ("Tile configuration: the measurements behind jit/config.c"). KILN_TUNE overrides fields after
 * the table, then every field is validated.
 *
 * The shared-memory formulas are the contract's (templates/common/params.h), which the
 * templates' layouts use too.
 */
#include <stdarg.h>
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
                   SAME_ID(KILN_LOGITS_ALIBI, KILN_ID_LOGITS_ALIBI) &&
                   SAME_ID(KILN_LOGITS_SOFTCAP_ALIBI, KILN_ID_LOGITS_SOFTCAP_ALIBI),
               "logits ids");
_Static_assert(SAME_ID(KILN_MASK_DATA_NONE, KILN_ID_MASK_DATA_NONE) &&
                   SAME_ID(KILN_MASK_DATA_BITMASK, KILN_ID_MASK_DATA_BITMASK) &&
                   SAME_ID(KILN_MASK_DATA_BSR, KILN_ID_MASK_DATA_BSR),
               "mask data ids");
#undef SAME_ID

/* ---- shared-memory formulas (the contract's, templates/common/params.h) ------------------ */

static int decode_smem(const kiln_variant *v, int gb, int warps, int stages)
{
    return kiln_decode_smem_bytes(v->head_dim, kiln__kv_fp8(v) ? 1 : 2, gb, warps, stages,
                                  v->kv == KILN_KV_PAGED, v->rope);
}

static int wgmma_smem(const kiln_variant *v, int bn, int stages)
{
    return kiln_wgmma_smem_bytes(v->head_dim, KILN_WGMMA_BM, bn, stages, kiln__kv_fp8(v) ? 1 : 2,
                                 v->rope);
}

static int prefill_smem(const kiln_variant *v, int warps, int mt, int bn, int stages, int pack,
                        int bulk)
{
    return kiln_prefill_smem_bytes(v->head_dim, kiln__kv_fp8(v) ? 1 : 2, warps * mt * 16, bn,
                                   stages, v->kv == KILN_KV_PAGED, v->rope, pack, bulk);
}

/* ---- limits --------------------------------------------------------------------------------- */

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

/* ---- the table ------------------------------------------------------------------------------ */

/* The kernel families that take tiles from the table (op=merge has no tiles: see
 * kiln__config_pick). */
typedef enum family {
    FAM_PREFILL,       /* prefill.cuh: prefill, batch prefill and append */
    FAM_PACKED_DECODE, /* prefill.cuh with pack=1: batch decode on tensor cores */
    FAM_SIMT_DECODE,   /* decode.cuh: decode on CUDA cores */
    FAM_WGMMA,         /* wgmma_attention.cuh: prefill, batch prefill and append on sm_90a */
} family;

/* Which variants of a family and head dim a row serves. */
typedef enum when {
    ANY,           /* all of them */
    PLAIN,         /* plain attention (prefill_plain), not packed by KILN_TUNE pack=1 */
    SINGLE_OR_FP8, /* a single request (contiguous KV) or fp8 KV: not a batch of 16-bit KV */
    ELEMENT_MASK,  /* a mask snippet or mask data (evaluated per element in mixed tiles) */
    NO_ALIBI,      /* no ALiBi bias (its slopes and positions add live registers) */
    FP8_KV,        /* fp8 KV (e4m3, e5m2) */
    XFORM,         /* fp8 KV or RoPE: the wgmma producer's transforms (raw stages) */
} when;

/* The shared-memory class a row needs. */
typedef enum smem_class {
    ALWAYS, /* the family's last resort: taken whatever it needs (validated afterwards) */
    FITS,   /* taken only where its shared memory fits the arch's limit, else the next row */
} smem_class;

typedef struct tile_row {
    family fam;
    int head_dim; /* 0: every head dim */
    when when;
    smem_class smem;
    int warps, mt, bn, stages, q_in_regs;
    const char *why;
} tile_row;

/* Rows in order of preference: the first row of the variant's family and head dim that serves
 * it and fits is taken. The shared-memory limits are 99 KiB (sm_86, sm_89, sm_120), 163 KiB
 * (sm_80, sm_87) and 227 KiB (sm_90, sm_100, sm_103). */
/* one row a line, in columns */
/* clang-format off */
static const tile_row tile_rows[] = {
    /* family           d    serves         smem    warps mt bn           stages qregs */
    {FAM_PREFILL,       64,  PLAIN,         ALWAYS, 4,    2, 64,          2,     1,
     "128-row CTAs halve the K/V fragment loads per MMA; Q stays in registers"},
    {FAM_PREFILL,       64,  ANY,           ALWAYS, 4,    1, 64,          2,     1,
     "variants add live registers and would spill at 128 rows: 64 rows"},
    {FAM_PREFILL,       128, PLAIN,         ALWAYS, 4,    2, 64,          2,     0,
     "128-row CTAs halve the K/V fragment loads per MMA; Q reloads from shared memory"},
    {FAM_PREFILL,       128, ANY,           ALWAYS, 4,    1, 64,          2,     1,
     "variants add live registers and would spill at 128 rows: 64 rows, Q in registers"},
    {FAM_PREFILL,       256, ANY,           FITS,   8,    1, 64,          2,     0,
     "each Q fragment reload serves 8 MMAs instead of 4; 192 KiB: 227 KiB parts only"},
    {FAM_PREFILL,       256, ANY,           ALWAYS, 4,    1, 32,          2,     0,
     "where 8 warps do not fit: 4 warps, 32-key tiles"},
    {FAM_PACKED_DECODE, 64,  ANY,           ALWAYS, 1,    1, 32,          3,     1,
     "one warp of 16 packed rows, small tiles: 4-5 CTAs per SM hide each other's loads"},
    {FAM_PACKED_DECODE, 128, FP8_KV,        ALWAYS, 1,    1, 32,          2,     1,
     "fp8 widened in registers: 2 stages, 11 CTAs an SM; B64 x 4096 e4m3 144 us, 165 with 3 "
     "stages, 145 with 16-key tiles (3 or 4 stages)"},
    {FAM_PACKED_DECODE, 128, ANY,           ALWAYS, 1,    1, 32,          3,     1,
     "as d64: measured best at both; 2 warps or 64-key tiles lose CTAs per SM"},
    {FAM_PACKED_DECODE, 256, ANY,           ALWAYS, 1,    1, 16,          2,     0,
     "as d128 with 16-key tiles, 2 stages: more keys or stages cost CTAs per SM"},
    {FAM_SIMT_DECODE,   0,   SINGLE_OR_FP8, FITS,   4,    0, KILN_DECODE_TILE, 2,     0,
     "four warps, double-buffered"},
    {FAM_SIMT_DECODE,   0,   ANY,           FITS,   4,    0, KILN_DECODE_TILE, 1,     0,
     "batches of 16-bit KV: 3 CTAs share an SM; else 4 warps x 1 stage beat 2 warps x 2"},
    {FAM_SIMT_DECODE,   0,   ANY,           FITS,   2,    0, KILN_DECODE_TILE, 1,     0,
     "where four warps do not fit: two"},
    {FAM_SIMT_DECODE,   0,   ANY,           ALWAYS, 1,    0, KILN_DECODE_TILE, 1,     0,
     "then one"},
    {FAM_WGMMA,         0,   ELEMENT_MASK,  FITS,   8,    1, 64,          4,     0,
     "64-key tiles: a 64-column mask block keeps whole tiles hidden or full in the tile map"},
    {FAM_WGMMA,         64,  ANY,           ALWAYS, 8,    1, 128,         3,     0,
     "two 64-row consumer warpgroups, 128-key tiles, three stages: 113 KiB"},
    {FAM_WGMMA,         128, XFORM,         ALWAYS, 8,    1, 128,         2,     0,
     "fp8 KV or RoPE: two 128-key stages beside the producer's two raw stages: 225 KiB"},
    {FAM_WGMMA,         128, ANY,           ALWAYS, 8,    1, 128,         3,     0,
     "three 128-key stages keep the producer a tile ahead: 225 KiB of the 227"},
    {FAM_WGMMA,         256, ELEMENT_MASK,  FITS,   8,    1, 64,          2,     0,
     "as above where four stages do not fit: two"},
    {FAM_WGMMA,         256, XFORM,         ALWAYS, 8,    1, 64,          2,     0,
     "fp8 KV or RoPE: 64-key tiles, two stages and one raw stage: 225 KiB"},
    {FAM_WGMMA,         256, NO_ALIBI,      ALWAYS, 8,    1, 80,          2,     0,
     "80-key tiles, two stages: 225 KiB; S = Q K^T on m64n80 reads less shared memory a FLOP "
     "than m64n64 (4 x 4096 causal 451 -> 475 TFLOP/s, non-causal 466 -> 495)"},
    {FAM_WGMMA,         256, ANY,           ALWAYS, 8,    1, 64,          2,     0,
     "ALiBi: 64-key tiles, two stages (193 KiB); at 80 keys its consumers spill 150-200 bytes"},
};
/* clang-format on */

/* Tensor-core decode by default: a batch decode of every group from 1 to 64 (groups above 16
 * on a warp of 16 MMA rows per 16 heads, pick_mma). The decode is bandwidth-bound, so the MMA
 * rows past G cost little, and one CTA reads each K/V tile once for all G heads where the
 * CUDA-core kernel reads it once per gb (at most 8) heads. H100, ab.py (the referee's graph
 * timing), bf16 d128 page 16, CUDA cores -> tensor cores: G 2 / 3 B1 x 4096 13.1 / 14.4 ->
 * 11.5 / 12.1 us, B64 x 4096 381 / 392 -> 358 / 360 (session 52); G 5 / 6 / 7 B1 x 4096
 * 15.9 / 16.7 / 17.8 -> 12.1, B64 x 4096 395 / 408 / 427 -> 348; G 12 21.0 -> 12.5 and 772 ->
 * 351; G 20 / 32 / 64 B1 x 4096 30.4 / 37.6 / 62.5 -> 12.9 / 14.7 / 22.2, B64 x 4096
 * 1440 / 1684 / 3336 -> 397 / 417 / 360 (session 53). fp8 KV too, widened in the MMAs' registers
 * (kiln_prefill_fp8_in_regs), but not with RoPE: rotated fp8 tiles go through shared memory
 * behind a block barrier, which a one-warp CTA pays in full. Group 1 (one query head a KV
 * head) leaves 15 of the 16 rows empty and still reads faster on tensor cores (session 53:
 * B1 x 4096 11.8 -> 11.2 us, B64 x 4096 376 -> 348, B256 x 512 183.4 -> 181.8). The CUDA-core
 * batch decode stays for fp8 KV with RoPE and KILN_TUNE pack=0. */
const char *kiln__decode_pack_refusal(const kiln_variant *v)
{
    if (v->op != KILN_OP_DECODE) return "not a decode";
    if (v->kv == KILN_KV_CONTIGUOUS)
        return "a single request (kv=contiguous) decodes on CUDA cores";
    if (kiln__kv_fp8(v) && v->rope)
        return "fp8 KV with RoPE: rotated fp8 tiles go through shared memory behind a barrier";
    return NULL;
}

static int decode_packs(const kiln_variant *v) { return !kiln__decode_pack_refusal(v); }

/* A prefill batch of few query tokens per request (kiln_variant.q_tokens): the tokens and the
 * group's heads packed into rows as decode packs its heads, every K/V tile read once for all
 * of them (the spec admits only groups dividing 64, so whole tokens fill a tile). H200, B64 x
 * 4096 paged, 4 tokens a request, G 4: 253 us against 1192 on the wgmma prefill family and 249
 * for one token by decode (docs/perf.md). */
static int prefill_packs(const kiln_variant *v)
{
    return v->op == KILN_OP_PREFILL && v->q_tokens > 0 && v->kv != KILN_KV_CONTIGUOUS;
}

/* A prefill with mask data on the wgmma family packs its rows by default (pack=1: a job's 128
 * rows are the G query heads of a KV head for 128 / G tokens), where G divides a warpgroup's 64
 * rows. Unpacked, a job's two consumer warpgroups hold 64 tokens each, which a 64-row mask block
 * shows different key tiles: the producer loads the union and each warpgroup computes alone on
 * the tiles only it sees (no partner's softmax under its MMAs). Packed, both hold the same
 * 128 / G tokens. H100, ab.py (the referee's graph timing), 1 x 4096, 64 x 64 blocks, G 4:
 * 26 % of the blocks 251 -> 212 us, causal 186 -> 142, 1 x 16384 at 10 % 1963 -> 1685
 * (docs/perf/notes.md, session 54). Not for dense masks: 16 x 1024 causal 302 -> 340 us. */
static int wgmma_pack_fits(const kiln_variant *v) { return (KILN_WGMMA_BM / 2) % v->group == 0; }

static int wgmma_packs(const kiln_variant *v)
{
    return v->op == KILN_OP_PREFILL && v->mask_data != KILN_MASK_DATA_NONE && v->group >= 2 &&
           wgmma_pack_fits(v);
}

/* Plain attention: no logits transform, window, element mask, RoPE or fp8 conversion, so the
 * softmax adds no live registers to the MMA loop. */
static int prefill_plain(const kiln_variant *v)
{
    return v->logits == KILN_LOGITS_NONE && !v->window && v->mask_data == KILN_MASK_DATA_NONE &&
           !v->logits_expr[0] && !v->mask_expr[0] && !v->rope && !kiln__kv_fp8(v);
}

static int row_serves(const tile_row *r, const kiln_variant *v, int pack)
{
    switch (r->when) {
        case PLAIN:
            return prefill_plain(v) && !pack;
        case SINGLE_OR_FP8:
            return v->kv == KILN_KV_CONTIGUOUS || kiln__kv_fp8(v);
        case ELEMENT_MASK:
            return kiln__variant_has_element_mask(v);
        case NO_ALIBI:
            return !kiln__logits_alibi(v);
        case FP8_KV:
            return kiln__kv_fp8(v);
        case XFORM:
            return kiln__kv_fp8(v) || v->rope;
        default:
            return 1;
    }
}

/* Shared memory of a row's tiles for v (gb: decode's query heads per CTA). */
static int row_smem(const tile_row *r, const kiln_variant *v, int gb, int pack)
{
    switch (r->fam) {
        case FAM_SIMT_DECODE:
            return decode_smem(v, gb, r->warps, r->stages);
        case FAM_WGMMA:
            return wgmma_smem(v, r->bn, r->stages);
        default:
            /* without bulk=1's pads, which pick_mma adds (the limit is checked again) */
            return prefill_smem(v, r->warps, r->mt, r->bn, r->stages, pack, 0);
    }
}

/* Copy the table's choice for (fam, v) into c (c->pack and, for decode, c->gb are set). */
static kiln_status pick_row(family fam, const kiln_variant *v, int smem_limit, kiln__config *c,
                            kiln__err *e)
{
    for (size_t i = 0; i < sizeof tile_rows / sizeof tile_rows[0]; i++) {
        const tile_row *r = &tile_rows[i];
        if (r->fam != fam || (r->head_dim && r->head_dim != v->head_dim) ||
            !row_serves(r, v, c->pack))
            continue;
        if (r->smem == FITS && row_smem(r, v, c->gb, c->pack) > smem_limit) continue;
        c->warps = r->warps;
        c->mt = r->mt;
        c->block_n = r->bn;
        c->stages = r->stages;
        c->q_in_regs = r->q_in_regs;
        return KILN_STATUS_OK;
    }
    return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                      "config: no tile configuration for %s head_dim=%d", kiln__op_name(v->op),
                      v->head_dim);
}

/* ---- overrides and validation --------------------------------------------------------------- */

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
        else if (!strcmp(tok, "wgmma")) c->wgmma = val;
        else if (!strcmp(tok, "load")) c->load = val;
        else if (!strcmp(tok, "persist")) c->persist = val;
        else if (!strcmp(tok, "merge")) c->fused_merge = val;
        else if (!strcmp(tok, "xjob")) c->xjob = val;
        else if (!strcmp(tok, "kvsplit")) c->kvsplit = val;
        else if (!strcmp(tok, "pdl")) c->pdl = val;
        else if (!strcmp(tok, "ksplit")) c->ksplit = val;
        else if (!strcmp(tok, "hx")) c->hx = val;
        else if (!strcmp(tok, "bulk")) c->bulk = val;
        else
            return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                              "KILN_TUNE: unknown field '%s' (warps, mt, bn, stages, qregs, gb, "
                              "minb, pack, wgmma, load, persist, xjob, kvsplit, merge, pdl, "
                              "ksplit, hx, bulk)",
                              tok);
    }
    return KILN_STATUS_OK;
}

/* Why the prefill-shaped kernel c of v cannot run on the tensor-core decode's persistent grid
 * (KILN_TUNE persist=1, templates/mma_decode_persist.cuh), or NULL when it can. Opt-in: bitwise
 * equal to a CTA per item on an H100 and no faster there (B256 x 512 189.2-189.9 against
 * 187.6 us; docs/perf/notes.md, session 38). */
static const char *decode_persist_refusal(const kiln_variant *v, const kiln__config *c)
{
    if (v->op != KILN_OP_DECODE || !c->pack)
        return "the persistent grid of the mma.sync family is the tensor-core decode's (a batch "
               "decode, group 4, 8 or 16; the wgmma family has its own)";
    if (!c->q_in_regs) return "the persistent decode keeps Q in registers (qregs=1)";
    if (kiln__kv_fp8(v)) return "fp8 KV is not on the persistent decode";
    if (v->rope) return "RoPE is not on the persistent decode";
    if (kiln__variant_has_element_mask(v))
        return "element masks (a mask snippet, mask data) are not on the persistent decode";
    if (c->fused_merge > 0) /* KILN_TUNE's merge=, read by the family's apply_tune */
        return "merge=1 too: the persistent decode's splits are merged by the merge kernel";
    return NULL;
}

/* The prefill-shaped kernel: prefill, and decode on tensor cores (pack). */
static kiln_status pick_mma(const kiln_variant *v, int smem_limit, kiln__config *c, kiln__err *e)
{
    const int d = v->head_dim, decode = v->op == KILN_OP_DECODE;
    /* few query tokens (q_tokens x G rows): up to 16 rows, decode's one-warp packed CTA; more,
     * the prefill rows (64 or 128 rows, 64-key tiles: 64 % G == 0, so whole tokens fill them).
     * H200, B64 x 4096 paged, 8 tokens x G 4: 372 us with one warp, 335 with two, 271 with the
     * prefill rows; 4 tokens x G 4: 253 us with one warp */
    const int few = prefill_packs(v), few_rows = few ? v->q_tokens * v->group : 0;
    kiln_status st = pick_row(decode || (few && few_rows <= 16) ? FAM_PACKED_DECODE : FAM_PREFILL,
                              v, smem_limit, c, e);
    if (st) return st;
    /* a decode's G rows: a warp of 16 MMA rows per 16 heads (groups above 16: 2-4 warps reading
     * each K/V tile once for all of them) */
    if (decode && (v->group + 15) / 16 > c->warps) c->warps = (v->group + 15) / 16;
    if (decode) c->hx = -1; /* unless KILN_TUNE names it: hx_rows_short, once merge= is known */
    if ((st = apply_tune(c, e))) return st;
    if (c->gb)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "config: %s takes no gb (KILN_TUNE)",
                          decode ? "tensor-core decode" : "prefill");
    c->block_m = c->warps * c->mt * 16;
    c->merge_threads = v->kv != KILN_KV_CONTIGUOUS ? (decode ? d : 128) : 0;
    c->smem_bytes = prefill_smem(v, c->warps, c->mt, c->block_n, c->stages, c->pack, c->bulk);
    if (c->warps < 1 || c->warps > MAX_WARPS || c->mt < 1 || c->mt > 4 || c->block_n < 16 ||
        c->block_n % 16 || c->stages < 1 || c->stages > 4)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: %s warps=%d mt=%d bn=%d stages=%d is not valid",
                          decode ? "tensor-core decode" : "prefill", c->warps, c->mt, c->block_n,
                          c->stages);
    /* a decode item is one token, whose G rows need only fit the tile; prefill tiles hold
     * whole tokens (the plan's rows a tile are block_m / G) */
    if (c->pack && (v->kv == KILN_KV_CONTIGUOUS ||
                    (decode ? v->group > c->block_m : c->block_m % v->group != 0)))
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: pack=1 needs a batch (kv=ragged|paged) and a group %s the %d "
                          "rows of a CTA tile (group=%d)",
                          decode ? "within" : "dividing", c->block_m, v->group);
    const char *no_persist = decode_persist_refusal(v, c);
    if (c->persist > 1 || (c->persist && no_persist))
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "config: persist=%d (KILN_TUNE): %s",
                          c->persist,
                          c->persist > 1 ? "the tensor-core decode's persist is 0 (a CTA per "
                                           "work item) or 1 (a persistent grid)"
                                         : no_persist);
    return KILN_STATUS_OK;
}

const char *kiln__wgmma_refusal(const kiln_variant *v, int sm, int *can)
{
    *can = 0;
    if (sm != 90) return "wgmma needs sm_90a";
    if (v->op != KILN_OP_PREFILL) return "decode keeps its own kernels";
    if (v->q_tokens)
        return "q_tokens: few query tokens a request take the packed rows of the mma.sync family "
               "(each K/V tile read once for all of them)";
    if (v->head_dim != 64 && v->head_dim != 128 && v->head_dim != 256)
        return "the wgmma family has head dims 64, 128 and 256";
    /* Head dims 64 and 256 measured slower with the first producer and faster with TMA ("The
     * producer's copies were the limit": 4 x 4096 causal 371 and 451 TFLOP/s, mma.sync 282 and
     * 294), so they are on it. Mask data too since session 42 (a tile map row per consumer
     * warpgroup, each warpgroup's skipped tiles a branch of their own): BSR 26 % 254 us against
     * 273 on mma.sync (docs/perf/notes.md, "Session 42"); KILN_TUNE wgmma=0 keeps mma.sync. */
    *can = 1;
    return NULL;
}

/* The wgmma family's grid unless KILN_TUNE says persist=: at head dim 64 or 128 a batch
 * (kv=ragged / kv=paged) takes the persistent grid with claimed jobs; a single request and d256
 * a CTA per tile. A single request on the persistent grid in snake order (persist=1; it has no
 * schedule to hold a claim counter) measured faster at 1 x 4096 (below), but its prefill grid
 * has not yet run to the end on a GPU (session 36 ran out of device time): it stays opt-in until
 * it does. Measured in one H200 lease (kiln check --time, H 32 / H_KV 8, docs/perf/notes.md "The
 * persistent grid's job slot"): causal d128 16 x 1024 368 -> 421 TFLOP/s, 4 x 4096 589 -> 598,
 * 64 x 128 75 -> 104, paged 16 x 1024 289 -> 319, soft-cap 4 x 4096 439 -> 475, d64 389 -> 396;
 * slower at d256 (463 -> 441; with O stored by TMA, session 36 on an H100: 460 against 522).
 * A single request, session 36 on an H100 (the referee's timing, O stored by TMA, snake order):
 * causal 1 x 4096 447-468 -> 522-532, 1 x 16384 616 -> 610-613, non-causal 1 x 16384 612-620
 * -> 584-605 (the round robin before the snake order: 1 x 16384 H 8 665 -> 600). */
static int wgmma_persist_default(const kiln_variant *v)
{
    return v->kv != KILN_KV_CONTIGUOUS && v->head_dim <= 128 ? KILN_WGMMA_PERSIST_DYNAMIC
                                                             : KILN_WGMMA_PERSIST_NONE;
}

/* K and V of a stage on barriers of their own (kvsplit=1) where that measured faster, one
 * pair for both elsewhere (H100, kiln check 4 x 2048 H 8 causal, one build, docs/perf/notes.md
 * "Session 44"): d256, whose two stages left every tile waiting for a load, 433 -> 557
 * TFLOP/s; the transforming producer's fp8 e4m3 KV 330 -> 411 (RoPE 195 -> 205 against the
 * build before); d128 480 either way, d64 303 -> 296 */
static int wgmma_kvsplit_default(const kiln_variant *v)
{
    return v->head_dim >= 256 || kiln__kv_fp8(v) || v->rope;
}

/* S = Q K^T with Q's fragments in registers (qregs=1): each S instruction then reads K alone
 * from shared memory (m64n128k16 from two shared operands reads 6 KB in its 64 tensor cycles,
 * near the SM's 128 bytes a cycle with the producer's writes). At D <= 128 (32 registers a
 * thread at D 128; d256's O leaves no room) and without xjob (the next job's Q would be needed
 * under this job's last P V). H100, the referee's timing, two rounds (docs/perf/notes.md,
 * "Session 45"): D 128 non-causal 4 x 4096 1900 / 1927 -> 1843 / 1872 us, causal 1 x 16384
 * 3712 / 3723 -> 3664 / 3621, D 64 693 / 689 -> 663 / 672, the other points within noise.
 * Not where the consumers are short of registers already: the producer's transforms (fp8 KV,
 * RoPE: 20-150 more bytes of spills at d128 with soft-cap or ALiBi) and snippets (the cookbook's
 * softplus logits spilled 24 bytes, none with qregs=0). */
static int wgmma_qregs_default(const kiln_variant *v, const kiln__config *c)
{
    return v->head_dim <= 128 && !c->xjob && !kiln__kv_fp8(v) && !v->rope && !v->logits_expr[0] &&
           !v->mask_expr[0];
}

/* The key tiles the wgmma family has an S = Q K^T instruction for (m64nBNk16: the shapes
 * tools/build/gen_wgmma.py writes into templates/common/wgmma.cuh). Copying rows a thread
 * each (load=0) takes 64 or 128. */
static int wgmma_bn_ok(int bn, int load)
{
    static const int shapes[] = {64, 80, 128, 176, 192, 256};
    if (load == KILN_WGMMA_LOAD_ROWS && bn != 64 && bn != 128) return 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (shapes[i] == bn) return 1;
    return 0;
}

/* The warp-specialized Hopper kernel: two consumer warpgroups of 64 rows and a producer. */
static kiln_status pick_wgmma(const kiln_variant *v, int smem_limit, kiln__config *c, kiln__err *e)
{
    kiln_status st = pick_row(FAM_WGMMA, v, smem_limit, c, e);
    if (st) return st;
    /* the producer's copies: TMA (4 x 4096 ragged on the H200, docs/perf/notes.md "The
     * producer's copies were the limit": causal 321 -> 489 TFLOP/s a row per thread -> rows
     * per warp, 562 by TMA), with kv=paged one box per page where pages are a multiple of 8
     * rows, rows per warp otherwise (page 16: 380 -> 403 TFLOP/s over rows per warp) */
    c->load = c->persist = c->xjob = c->kvsplit = c->q_in_regs = -1;
    if ((st = apply_tune(c, e))) return st;
    if (c->load < 0) c->load = KILN_WGMMA_LOAD_TMA;
    if (c->persist < 0) c->persist = wgmma_persist_default(v);
    if (c->xjob < 0) c->xjob = 0; /* 1 passes its GPU tests but measured no faster (docs/perf.md) */
    if (c->kvsplit < 0) c->kvsplit = wgmma_kvsplit_default(v);
    if (c->q_in_regs < 0) c->q_in_regs = wgmma_qregs_default(v, c);
    if (c->pack && !wgmma_pack_fits(v))
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: pack=1 on the wgmma family needs a group dividing %d (a "
                          "consumer warpgroup's rows hold whole query tokens; group=%d)",
                          KILN_WGMMA_BM / 2, v->group);
    if (c->warps != 8 || c->mt != 1 || c->gb || c->min_blocks != 1 ||
        !wgmma_bn_ok(c->block_n, c->load) || c->stages < 2 || c->stages > 4 ||
        c->load > KILN_WGMMA_LOAD_TMA || c->persist > KILN_WGMMA_PERSIST_DYNAMIC)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: the wgmma family takes warps=8 mt=1 minb=1, bn 64, 80, "
                          "128, 176, 192 or 256 (64 or 128 with load=0), 2-4 stages (a consumer "
                          "frees a stage only once the next tile has landed), load 0, 1 or 2 and "
                          "persist 0, 1 or 2 (got warps=%d mt=%d "
                          "minb=%d bn=%d stages=%d load=%d persist=%d)",
                          c->warps, c->mt, c->min_blocks, c->block_n, c->stages, c->load,
                          c->persist);
    /* a single request's claims count in its tile map's buffer (kiln_tile_map_counter_at):
     * opt-in, not yet timed on a GPU */
    if (c->persist == KILN_WGMMA_PERSIST_DYNAMIC && v->kv == KILN_KV_CONTIGUOUS &&
        !kiln__variant_has_element_mask(v))
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: persist=2 claims jobs from a counter: a batch schedule's, or "
                          "a single request's tile map (element masks only); a single-request "
                          "prefill (kv=contiguous) without a mask snippet or mask data has none: "
                          "persist=1 there");
    if (c->xjob > 1 || (c->xjob && c->persist == KILN_WGMMA_PERSIST_NONE))
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: xjob=%d (KILN_TUNE): xjob is 0 or 1, and 1 (a job's last P V "
                          "with the next job's first S) needs a persistent grid (persist=1 or 2)",
                          c->xjob);
    if (c->q_in_regs > 1 || (c->q_in_regs && (v->head_dim > 128 || c->xjob)))
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: qregs=%d (KILN_TUNE): the wgmma family's qregs is 0 (S reads Q "
                          "from shared memory) or 1 (from registers: head dims 64 and 128, "
                          "without xjob)",
                          c->q_in_regs);
    if (c->kvsplit > 1)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: kvsplit=%d (KILN_TUNE): kvsplit is 0 (one barrier pair for a "
                          "stage's K and V) or 1 (a pair each)",
                          c->kvsplit);
    c->block_m = KILN_WGMMA_BM;
    c->merge_threads = v->kv != KILN_KV_CONTIGUOUS ? 128 : 0;
    c->smem_bytes = wgmma_smem(v, c->block_n, c->stages);
    return KILN_STATUS_OK;
}

/* The CUDA-core decode kernel. */
static kiln_status pick_simt_decode(const kiln_variant *v, int smem_limit, kiln__config *c,
                                    kiln__err *e)
{
    c->gb = 1; /* the most query heads per CTA that divide the group */
    for (int g = 1; g <= DECODE_MAX_GB && g <= v->group; g++)
        if (v->group % g == 0) c->gb = g;
    kiln_status st = pick_row(FAM_SIMT_DECODE, v, smem_limit, c, e);
    if (st || (st = apply_tune(c, e))) return st;
    if (c->block_n != KILN_DECODE_TILE || c->mt || c->q_in_regs)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: decode takes bn=%d only and no mt/qregs (KILN_TUNE)",
                          KILN_DECODE_TILE);
    c->block_m = c->gb;
    c->smem_bytes = decode_smem(v, c->gb, c->warps, c->stages);
    c->merge_threads = v->head_dim;
    if (c->gb < 1 || v->group % c->gb || c->stages < 1 || c->warps < 1 || c->warps > MAX_WARPS)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: decode gb=%d stages=%d warps=%d is not valid for group %d",
                          c->gb, c->stages, c->warps, v->group);
    return KILN_STATUS_OK;
}

/* Why the main kernel of v cannot merge its own splits (kiln__config.fused_merge), or NULL when
 * it can: the batch decode kernels (CUDA-core and tensor-core) can, with KILN_TUNE merge=1.
 * Not by default: on the H200 the fused merge measured far slower wherever a task has many
 * slots (the last CTA of a task, one warp on tensor cores, merges them alone: B1 x 4096 paged
 * decode 110 us against 17-19 with the merge kernel, B1 x 32768 139 against 47-49, B16 x 4096
 * 81 against 71; even at B64; docs/perf/notes.md, session 27). */
static const char *fused_merge_refusal(const kiln_variant *v)
{
    if (v->op == KILN_OP_MERGE) return "op=merge kernels have no splits to merge";
    if (v->op != KILN_OP_DECODE)
        return "only the batch decode kernels merge their own splits; prefill keeps the merge "
               "kernel";
    if (v->kv == KILN_KV_CONTIGUOUS)
        return "a single decode (kv=contiguous) keeps the merge kernel: its partial states are "
               "in the caller's workspace, which holds no counters the library zeroes";
    return NULL;
}

/* Why v's merge kernel cannot be a programmatic dependent launch on sm_<sm> (kiln__config.pdl),
 * or NULL when it can: the merge kernel of any kernel that has one (decode, single or batch, and
 * batch prefill; not a batch decode that merges its own splits, fused) on sm_90 or newer, where
 * griddepcontrol and the launch attribute exist; there it is by default. */
static const char *pdl_refusal(const kiln_variant *v, int sm, int fused)
{
    if (sm < 90) return "programmatic dependent launch (griddepcontrol) needs sm_90 or newer";
    if (v->op == KILN_OP_MERGE) return "op=merge kernels are launched alone, after no main kernel";
    if (v->op == KILN_OP_PREFILL && v->kv == KILN_KV_CONTIGUOUS)
        return "a single-request prefill has no merge kernel";
    if (fused) return "with merge=1 the split CTAs merge their own tasks: no merge kernel runs";
    return NULL;
}

/* Why config c of v cannot take KILN_TUNE ksplit= (the tensor-core decode's key split,
 * mma_attention.cuh KSPLIT), or NULL when it can: the one-warp packed decode with 16-bit or
 * in-register fp8 K/V, and none of what needs the block (RoPE, element masks, the fused merge,
 * the persistent grid); 2, 4 or 8 pipelines. */
static const char *ksplit_refusal(const kiln_variant *v, const kiln__config *c)
{
    if (c->ksplit != 2 && c->ksplit != 4 && c->ksplit != 8) return "ksplit is 1, 2, 4 or 8";
    if (v->op != KILN_OP_DECODE || !c->pack || c->wgmma || c->warps != 1)
        return "the key split is the one-warp tensor-core batch decode's (group 4, 8 or 16)";
    if (v->rope) return "RoPE is not on the key split";
    if (kiln__variant_has_element_mask(v))
        return "element masks (a mask snippet, mask data) are not on the key split";
    if (c->fused_merge) return "merge=1: the key split's work items are merged by the merge kernel";
    if (c->persist) return "persist=1: the persistent decode has one pipeline a CTA";
    return NULL;
}

/* The tensor-core decode's CTA order by default: an item's KV heads on adjacent CTAs (hx=1)
 * where a KV head's row is at most 128 bytes (d64 16-bit K/V, fp8 K/V up to d128). An NHD
 * page interleaves the KV heads' rows a token at a time, so the item's CTAs that run together
 * read whole DRAM bursts together. H100, session 53 (ab.py, the referee's graph timing): d64
 * B64 x 4096 193.2 -> 182.2 us, B256 x 512 101.0 -> 97.9, B256 x 4096 756.6 -> 739.1, B1 x 4096
 * 9.2 -> 9.3, B16 x 512 10.85 -> 10.95; fp8 e4m3 d128 B256 x 512 103.2 -> 100.5, B64 x 4096
 * 186.1 -> 185.3, B1 x 4096 equal; 16-bit d128 equal (256-byte rows), so not there. Not with
 * the fused merge or the persistent grid (hx_refusal). */
static int hx_rows_short(const kiln_variant *v)
{
    return v->head_dim * (kiln__kv_fp8(v) ? 1 : 2) <= 128;
}

/* Why config c cannot take KILN_TUNE hx=1 (an item's KV heads on adjacent CTAs,
 * mma_attention.cuh HX), or NULL when it can. */
static const char *hx_refusal(const kiln__config *c)
{
    if (!c->pack || c->wgmma) /* pick_mma packs batches only */
        return "the item-major CTA order is the packed mma.sync batch kernels' (the tensor-core "
               "decode)";
    if (c->persist) return "persist=1: the persistent decode's CTAs loop over items of their own";
    if (c->fused_merge) return "merge=1: the fused merge counts a task's CTAs by their blockIdx.y";
    return NULL;
}

/* Why config c of v on sm_<sm> cannot take KILN_TUNE bulk=1 (K/V rows by cp.async.bulk,
 * mma_attention.cuh BULK), or NULL when it can: the one-warp tensor-core batch decode of 16-bit
 * K/V without RoPE, on its CTA-per-item grid. */
static const char *bulk_refusal(const kiln_variant *v, const kiln__config *c, int sm)
{
    if (sm < 90) return "bulk copies (cp.async.bulk) need sm_90 or newer";
    if (v->op != KILN_OP_DECODE || !c->pack || c->wgmma || c->warps != 1)
        return "the bulk loads are the one-warp tensor-core batch decode's";
    if (kiln__kv_fp8(v))
        return "fp8 KV: the bulk loads copy 16-bit rows (fp8 is read in registers from swizzled "
               "rows)";
    if (v->rope) return "RoPE is not on the bulk loads (its keys are rotated in the swizzled tile)";
    if (c->persist) return "persist=1: the persistent decode keeps its cp.async loads";
    return NULL;
}

/* ---- internal API --------------------------------------------------------------------------- */

kiln_status kiln__config_pick(const kiln_variant *v, int sm, kiln__config *c, kiln__err *e)
{
    memset(c, 0, sizeof *c);
    c->min_blocks = 1;
    const int d = v->head_dim, limit = kiln__smem_limit(sm);
    /* pack and wgmma first: they decide which kernel family the other fields describe */
    c->pack = -1; /* unless KILN_TUNE names it: below, once the family is known */
    int wgmma_can;
    const char *no_wgmma = kiln__wgmma_refusal(v, sm, &wgmma_can);
    c->wgmma = -1;       /* unless KILN_TUNE names it: the Hopper family where it serves */
    c->fused_merge = -1; /* likewise merge=: the merge kernel unless KILN_TUNE says merge=1 */
    c->pdl = -1;         /* and pdl=: where the arch and the kernel allow it (pdl_refusal) */
    kiln_status st = apply_tune(c, e);
    if (st) return st;
    /* the packed decode and few-token rows are the mma.sync family's (kiln__wgmma_refusal); a
     * prefill with pack=1 (KILN_TUNE) stays on the wgmma family where it serves, packed there */
    const int wgmma = c->wgmma < 0 ? !no_wgmma : c->wgmma;
    const int pack =
        c->pack >= 0 ? c->pack : decode_packs(v) || prefill_packs(v) || (wgmma && wgmma_packs(v));
    if (wgmma && !wgmma_can)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "config: wgmma=1 (KILN_TUNE): %s", no_wgmma);
    const char *no_fuse = fused_merge_refusal(v);
    if (c->fused_merge > 1 || (c->fused_merge == 1 && no_fuse))
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "config: merge=%d (KILN_TUNE): %s",
                          c->fused_merge,
                          c->fused_merge > 1 ? "merge is 0 (the merge kernel) or 1 (the split "
                                               "CTAs merge)"
                                             : no_fuse);
    const int fused_merge = c->fused_merge < 0 ? 0 : c->fused_merge;
    const char *no_pdl = pdl_refusal(v, sm, fused_merge);
    if (c->pdl > 1 || (c->pdl == 1 && no_pdl))
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "config: pdl=%d (KILN_TUNE) on sm_%d: %s",
                          c->pdl, sm,
                          c->pdl > 1 ? "pdl is 0 (the merge kernel an ordinary launch) or 1 (a "
                                       "programmatic dependent launch, sm_90 or newer)"
                                     : no_pdl);
    const int pdl = c->pdl < 0 ? !no_pdl : c->pdl; /* H200: 0.3-1.5 us off every decode point */
    memset(c, 0, sizeof *c);
    c->min_blocks = 1;
    c->pack = pack;
    c->wgmma = wgmma;
    if (v->op == KILN_OP_MERGE) { /* one thread per element of a row, no tiles, no KILN_TUNE */
        c->warps = d / 32;
        c->threads = d;
        c->block_m = 1;
        c->merge_threads = d;
        return KILN_STATUS_OK;
    }
    if (v->op == KILN_OP_DECODE && !c->pack) st = pick_simt_decode(v, limit, c, e);
    else if (c->wgmma) st = pick_wgmma(v, limit, c, e);
    else st = pick_mma(v, limit, c, e);
    if (st) return st;
    c->fused_merge = fused_merge; /* the family's apply_tune wrote KILN_TUNE's value again */
    c->pdl = pdl;
    const char *no_ksplit = ksplit_refusal(v, c);
    if (c->ksplit > 1 && no_ksplit)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "config: ksplit=%d (KILN_TUNE): %s",
                          c->ksplit, no_ksplit);
    if (c->ksplit == 1) c->ksplit = 0; /* one pipeline: the kernel without the split */
    const char *no_hx = hx_refusal(c);
    if (c->hx < 0) c->hx = !no_hx && hx_rows_short(v); /* unset: only pick_mma's decode */
    if (c->hx > 1 || (c->hx && no_hx))
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "config: hx=%d (KILN_TUNE): %s", c->hx,
                          c->hx > 1 ? "hx is 0 or 1" : no_hx);
    const char *no_bulk = bulk_refusal(v, c, sm);
    if (c->bulk < 0 || c->bulk > 2 || (c->bulk && no_bulk))
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "config: bulk=%d (KILN_TUNE) on sm_%d: %s",
                          c->bulk, sm,
                          c->bulk < 0 || c->bulk > 2 ? "bulk is 0, 1 (rows by bulk copies) or 2 "
                                                       "(pages by TMA boxes)"
                                                     : no_bulk);
    c->smem_bytes = kiln_prefill_cta_bytes(c->smem_bytes, c->ksplit, c->bulk);
    /* persist on the mma.sync family: pick_mma said whether the tensor-core decode takes it */
    if ((c->load || c->xjob || c->kvsplit || (c->persist && !pack)) && !c->wgmma)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: load=, persist=, xjob= and kvsplit= (KILN_TUNE) are the wgmma "
                          "family's (and persist=1 the tensor-core decode's)");
    c->threads =
        c->warps * 32 * (c->ksplit ? c->ksplit : 1) + (c->wgmma ? KILN_WGMMA_PRODUCER_THREADS : 0);
    if (c->min_blocks < 1 || c->min_blocks * c->threads > 2048)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "config: minb=%d is not valid for %d threads",
                          c->min_blocks, c->threads);
    if (c->smem_bytes > limit)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED,
                          "config: %d bytes of shared memory exceed the %d of sm_%d", c->smem_bytes,
                          limit, sm);
    return KILN_STATUS_OK;
}

/* Append fmt's text to the config line in buf (cap bytes), truncated as snprintf truncates. */
static void line_append(char *buf, size_t cap, const char *fmt, ...) KILN__PRINTF(3, 4);
static void line_append(char *buf, size_t cap, const char *fmt, ...)
{
    const size_t n = strlen(buf);
    if (n >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

int kiln__config_tma_maps(const kiln__config *c)
{
    return (c->wgmma && c->load == KILN_WGMMA_LOAD_TMA) || c->bulk == 2;
}

void kiln__config_format(const kiln__config *c, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "threads=%d smem=%d block_m=%d block_n=%d warps=%d stages=%d mt=%d qregs=%d gb=%d "
             "minb=%d merge=%d pack=%d",
             c->threads, c->smem_bytes, c->block_m, c->block_n, c->warps, c->stages, c->mt,
             c->q_in_regs, c->gb, c->min_blocks, c->merge_threads, c->pack);
    /* the Hopper family only, so that the other families' configs (key material) stay as
     * they were */
    if (c->wgmma)
        line_append(buf, cap, " wgmma=1 load=%d persist=%d xjob=%d kvsplit=%d", c->load, c->persist,
                    c->xjob, c->kvsplit);
    /* the tensor-core decode on its persistent grid (persist=1), likewise */
    if (!c->wgmma && c->persist) line_append(buf, cap, " persist=1");
    /* likewise the fused merge: only the kernels that merge their own splits say so */
    if (c->fused_merge) line_append(buf, cap, " fused_merge=1");
    /* the tensor-core decode's key split, likewise */
    if (c->ksplit) line_append(buf, cap, " ksplit=%d", c->ksplit);
    /* the item-major CTA order, likewise */
    if (c->hx) line_append(buf, cap, " hx=1");
    /* the bulk loads, likewise */
    if (c->bulk) line_append(buf, cap, " bulk=%d", c->bulk);
    /* and the programmatic dependent launch: only the kernels whose source has it */
    if (c->pdl) line_append(buf, cap, " pdl=1");
}
