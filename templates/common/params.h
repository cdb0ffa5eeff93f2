/*
 * params.h — the host <-> device contract: everything the C host writes and a kernel reads,
 * declared once. Included by the host (runtime/, jit/config.c, as C11) and by every template
 * (the generated source, as CUDA C++ under NVRTC):
 *   - kiln_launch_params, the argument block of every attention kernel (passed by value);
 *   - kiln_merge_params, the argument block of the op=merge kernels;
 *   - the batch schedule in the workspace: header, work items, requests, merge tasks;
 *   - the values of the variant fields the templates switch on (kiln_cfg's KV, KV_DT, DT,
 *     LOGITS, MASK_DATA) and of the tile-map classes;
 *   - the tile constants and the shared-memory formulas of both kernel families.
 *
 * Only fixed-size scalar types, ordered widest first, so both compilers lay the structs out
 * the same way; the static assertions at the end check sizes and offsets on each side.
 * Strides are in elements.
 */
#ifndef KILN_PARAMS_H
#define KILN_PARAMS_H

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
/* device side: usable in constant expressions (the templates' layout constants) */
#define KILN_CONTRACT_FN static constexpr __host__ __device__ __forceinline__
#define KILN_CONTRACT_ASSERT(c, msg) static_assert(c, msg)
#else
#define KILN_CONTRACT_FN static inline
#define KILN_CONTRACT_ASSERT(c, msg) _Static_assert(c, msg)
#endif

/* ---- the variant fields the templates switch on ----
 * expand.c writes the public enum values of kiln.h (kiln_kv_storage, kiln_dtype, kiln_logits,
 * kiln_mask_data) into kiln_cfg; jit/config.c asserts they equal these. The templates see the
 * short names inside namespace kiln (KV_PAGED), the host the prefixed ones (KILN_ID_KV_PAGED). */
#ifdef __cplusplus
namespace kiln {
#define KILN_ID(name) name
#else
#define KILN_ID(name) KILN_ID_##name
#endif

/* kiln_cfg::KV: where the keys of a request are */
enum kv_layout_id { KILN_ID(KV_CONTIGUOUS) = 0, KILN_ID(KV_RAGGED) = 1, KILN_ID(KV_PAGED) = 2 };
/* kiln_cfg::DT / OUT_DT (16-bit types), KV_DT (also fp8; every value >= KV_E4M3 is fp8) */
enum dtype_id { KILN_ID(F16) = 0, KILN_ID(BF16) = 1 };
enum kv_dtype_id { KILN_ID(KV_F16) = 0, KILN_ID(KV_BF16) = 1, KILN_ID(KV_E4M3) = 2, KILN_ID(KV_E5M2) = 3 };
/* kiln_cfg::LOGITS: the builtin logits transform */
enum logits_id {
    KILN_ID(LOGITS_NONE) = 0,
    KILN_ID(LOGITS_SOFTCAP) = 1,
    KILN_ID(LOGITS_ALIBI) = 2,
    KILN_ID(LOGITS_SOFTCAP_ALIBI) = 3
};
/* kiln_cfg::MASK_DATA: the run-time mask data */
enum mask_data_id { KILN_ID(MASK_DATA_NONE) = 0, KILN_ID(MASK_DATA_BITMASK) = 1, KILN_ID(MASK_DATA_BSR) = 2 };
/* one byte of a prefill tile map (kiln_prefill_mask_plan) per (query tile, key tile) */
enum tile_class_id {
    KILN_ID(TILE_HIDDEN) = 0, /* no key visible: the tile is skipped */
    KILN_ID(TILE_MIXED) = 1,  /* the element masks are evaluated per element */
    KILN_ID(TILE_FULL) = 2    /* the element masks show every in-range key */
};

#ifdef __cplusplus
} /* namespace kiln */
#endif
#undef KILN_ID

/* ---- tile constants ---- */
enum {
    KILN_DECODE_TILE = 32, /* CUDA-core decode: keys per warp tile, one per lane */
};

/* ---- the argument blocks ---- */

typedef struct kiln_launch_params {
    unsigned long long q;           /* decode [H, D]; prefill [L_Q, H, D] */
    unsigned long long k;           /* [L_KV, H_KV, D] or [H_KV, L_KV, D] via strides */
    unsigned long long v;           /* like k */
    unsigned long long o;           /* like q */
    unsigned long long lse;         /* float, [H] or [L_Q, H]; 0 if not wanted */
    unsigned long long alibi;       /* float [H] slopes; 0 unless logits=alibi|softcap_alibi */
    unsigned long long partial_o;   /* decode split-KV: float [splits, H, D] */
    unsigned long long partial_lse; /* decode split-KV: float [splits, H] */
    long long q_stride_n, q_stride_h;
    long long o_stride_n, o_stride_h;
    long long k_stride_n, k_stride_h;
    long long v_stride_n, v_stride_h;
    int qo_len;       /* L_Q (decode: 1) */
    int kv_len;       /* L_KV */
    int num_qo_heads; /* H */
    int num_kv_heads; /* H_KV */
    int window_left;  /* keys j >= i + L_KV - L_Q - window_left stay (window variants) */
    int kv_chunk;     /* decode: KV tokens per split (multiple of the tile) */
    int num_splits;   /* decode: splits per KV head; 1 writes o directly */
    int kv_begin;     /* decode: first key any query can see (window) */
    float sm_scale;   /* scale of q.k */
    float softcap;    /* logits=softcap: the cap */
    int kv_map_rows;  /* paged, TMA (runtime/tma.c): 1 where the pool is dense (a page's rows at
                         the row stride, pages page_size rows apart), so that K's and V's maps are
                         3-D over rows page * page_size + r; 0: 4-D (page, row, head, column) */
    int kv_box_rows;  /* paged, TMA (runtime/tma.c): the rows of a TMA box of a whole K/V tile,
                         kiln_wgmma_tma_page_rows(page_size, BN), read once a launch instead of
                         a division a tile; 0: pages go by rows */
    unsigned long long user[8]; /* user parameters: f32/i32 bits in the low word, or pointers */
    unsigned long long mask_bits;   /* bitmask: u8 packed, bit i * L_KV + j, little-endian */
    unsigned long long bsr_indptr;  /* bsr: int [ceil(L_Q / bsr_r) + 1] */
    unsigned long long bsr_indices; /* bsr: int column-block indices, sorted per row */
    unsigned long long tile_map;    /* prefill: u8 [map rows][kv_tiles] tile_class_id (a row per
                                       kiln_tile_map_bm query rows); 0 = none */
    int bsr_r, bsr_c;               /* bsr block shape */
    int kv_tiles;                   /* prefill: key tiles per query tile (row stride of the map) */
    int o_by_tma;                   /* wgmma family with TMA loads: kiln_tma_maps.o is valid, and
                                       whole 64-row blocks of O are stored by TMA (runtime/tma.c) */
    /* batches (kv=ragged / kv=paged): the plan's schedule lives in the workspace */
    unsigned long long kv_indices;  /* paged: int page ids */
    unsigned long long work;        /* the schedule: kiln_work_header, then the arrays below */
    unsigned long long rope_offsets; /* int [B] position offsets, or 0 */
    long long k_stride_page, v_stride_page; /* paged: elements between pages */
    int items_off;   /* int offset in work of the kiln_work_item array */
    int reqs_off;    /* int offset of the kiln_work_req array */
    int tasks_off;   /* int offset of the kiln_merge_task array */
    int page_size;   /* paged: tokens per page */
    int slot_rows;   /* rows of one partial slot per head: decode 1, prefill BM */
    float k_scale;   /* fp8: effective scale of stored k (e4m3 includes 2^8, see device.cuh) */
    float v_scale;   /* effective scale of stored v (fp8: with its unit, see device.cuh); O's factor */
    float rope_rcp_scale; /* rope: 1 / rope_scale */
    float rope_log2_theta; /* rope: log2(rope_theta) */
    int counters_off; /* int offset of the fused merge's arrival counters (kiln_cfg::FUSED_MERGE) */
    float lse_unit;   /* the stored LSE per log2 unit: ln 2 (natural log) or 1 (base 2,
                         kiln_params.lse_base2) */
    int job_heads;    /* the wgmma family's persistent grid: its jobs go through the query heads
                         in sections of this many job heads (whole KV heads), every work tile
                         of a section before the next section's, so that the CTAs running at
                         once read the K/V of few KV heads, which L2 then holds; 0: one section
                         of all heads (runtime/launch.c kiln__job_heads) */
} kiln_launch_params;

#define KILN_LAUNCH_PARAMS_SIZE 376

/* The op=merge kernels' block: kiln_merge_state(_in_place) read v_a/lse_a, v_b/lse_b (and mask
 * in place), kiln_merge_states v_all [rows, S, H, D] / lse_all [rows, S, H]. */
typedef struct kiln_merge_params {
    unsigned long long v_a, lse_a, v_b, lse_b, v_out, lse_out, mask, v_all, lse_all;
    long long v_stride_n, v_stride_h;
    int num_states, rows, num_heads, pad;
} kiln_merge_params;

#define KILN_MERGE_PARAMS_SIZE 104

/* ---- the batch schedule (int words at kiln_launch_params.work) ----
 * header | items [items_off ..] | requests [reqs_off ..] | merge tasks [tasks_off ..] |
 * arrival counters [counters_off ..]; every array starts at a multiple of 4 ints, so the
 * kernels read the first four words of a record with one 16-byte load.
 *
 * The arrival counters are there only for a kernel that merges its own splits
 * (kiln_cfg::FUSED_MERGE): one int per (merge task, head scope), task-major, int
 * [task bound][scopes], where a head scope is the query heads one CTA of an item covers (the
 * main grid's y x z CTAs of an item: the CUDA-core decode's (H_KV, G / GB), the tensor-core
 * decode's H_KV) and the task bound is the layout's. Each split CTA adds 1 to its (task,
 * scope) counter once its partial state is written; the one that draws nslots - 1 merges the
 * task's slots for its heads and puts the counter back to 0. The host writes the counters of
 * the schedule's tasks as 0 in the same upload as the records, so a schedule starts from 0 and
 * so does every replay of a captured run. */
typedef struct kiln_work_header {
    int items; /* work items (the main grid may be padded past it) */
    int tasks; /* merge tasks (likewise for the merge grid) */
    int reqs;  /* requests B */
    int next_job; /* the wgmma family's dynamic persistent grid (KILN_WGMMA_PERSIST_DYNAMIC):
                     jobs claimed past the first wave; 0 at plan, and reset to 0 by the run's
                     last claim, so that every replay of a captured run starts from 0 */
} kiln_work_header;

/* int indices of the fields the kernels read as words (the host checks them below) */
#define KILN_WORK_HEADER_ITEMS_AT 0
#define KILN_WORK_HEADER_TASKS_AT 1
#define KILN_WORK_HEADER_NEXT_AT 3

/* One work item, one CTA of the main kernel: request b, query tile m, keys [kv_lo, kv_hi),
 * the partial-state slot it writes (-1: it owns its rows and writes o directly) and, for a
 * split item, the merge task whose slots hold its slot (-1 when unsplit); then request b's
 * q_start, kv_start, qo_len and kv_len, copies of its kiln_work_req's, so that everything a
 * CTA needs before its first K/V load is three 16-byte loads of one record in one round trip
 * (the request record is read only for mask data, and by the merge). */
typedef struct kiln_work_item {
    int b, m, kv_lo, kv_hi;
    int slot, task, q_start, kv_start; /* at int KILN_WORK_ITEM_SLOT_AT */
    int qo_len, kv_len;                /* at int KILN_WORK_ITEM_LEN_AT */
    int pad[2];
} kiln_work_item;

#define KILN_WORK_ITEM_SLOT_AT 4
#define KILN_WORK_ITEM_LEN_AT 8

/* One request: its query rows start at q_start in q/o, its keys at kv_start (ragged: token
 * row; paged: offset into kv_indices); its mask data at bit mask_bit0 (two 32-bit halves)
 * and bsr block row bsr_row0. */
typedef struct kiln_work_req {
    int q_start, qo_len, kv_start, kv_len;
    int mask_bit0_lo, mask_bit0_hi, bsr_row0; /* at int KILN_WORK_REQ_MASK_AT: one 16-byte load */
    int pad;
} kiln_work_req;

#define KILN_WORK_REQ_MASK_AT 4

/* One merge task, one CTA x of the merge kernel: request b, query tile m, partial slots
 * slot0 .. slot0 + nslots. */
typedef struct kiln_merge_task {
    int b, m, slot0, nslots;
} kiln_merge_task;

/* The partial states a batch merge kernel loads in one round trip (merge.cuh, merge_partials):
 * kiln_merge up to KILN_MERGE_BATCH, and the batch decode's kiln_merge_wide up to
 * KILN_MERGE_BATCH_WIDE (about 1.5x the registers: fewer CTAs an SM), launched instead where a
 * task of the schedule has more slots than KILN_MERGE_BATCH (runtime/batch.c). Both write the
 * same bits. */
#define KILN_MERGE_BATCH 32
#define KILN_MERGE_BATCH_WIDE 64

/* ---- shared memory of the CUDA-core decode (templates/simt_decode.cuh) ----
 * es: bytes per stored K/V element (2, fp8 1); gb query heads per CTA. Layout:
 * q float [gb][d] | p float [warps][gb][TILE] | paged row offsets | RoPE freq | a region that
 * holds the K/V stages [warps][stages] and, once they are done, the warps' combine. */
KILN_CONTRACT_FN int kiln_decode_krow(int d, int es) { return d * es + 16; } /* padded K row */
KILN_CONTRACT_FN int kiln_decode_vrow(int d, int es) { return d * es; }
KILN_CONTRACT_FN int kiln_decode_stage_bytes(int d, int es) /* one K + one V tile */
{
    return KILN_DECODE_TILE * kiln_decode_krow(d, es) + KILN_DECODE_TILE * kiln_decode_vrow(d, es);
}
KILN_CONTRACT_FN int kiln_decode_q_bytes(int d, int gb) { return gb * d * 4; }
KILN_CONTRACT_FN int kiln_decode_p_bytes(int gb, int warps) { return warps * gb * KILN_DECODE_TILE * 4; }
KILN_CONTRACT_FN int kiln_decode_off_bytes(int warps, int paged) { return paged ? warps * KILN_DECODE_TILE * 16 : 0; }
KILN_CONTRACT_FN int kiln_rope_freq_bytes(int d, int rope) { return rope ? d / 2 * 4 : 0; }
KILN_CONTRACT_FN int kiln_decode_head_bytes(int d, int gb, int warps, int paged, int rope)
{
    return kiln_decode_q_bytes(d, gb) + kiln_decode_p_bytes(gb, warps) + kiln_decode_off_bytes(warps, paged) +
           kiln_rope_freq_bytes(d, rope);
}
KILN_CONTRACT_FN int kiln_decode_region_bytes(int d, int es, int gb, int warps, int stages)
{
    const int kv = warps * stages * kiln_decode_stage_bytes(d, es);
    const int combine = warps * gb * (d + 2) * 4;
    return kv > combine ? kv : combine;
}
KILN_CONTRACT_FN int kiln_decode_smem_bytes(int d, int es, int gb, int warps, int stages, int paged, int rope)
{
    return kiln_decode_head_bytes(d, gb, warps, paged, rope) + kiln_decode_region_bytes(d, es, gb, warps, stages);
}

/* ---- shared memory of the tensor-core kernels (templates/mma_attention.cuh) ----
 * bm query rows, bn keys per tile. Layout: Q [bm][d] 16-bit | K stages | V stages (as loaded,
 * es bytes an element) | fp8: one converted 16-bit K and V tile | RoPE freq | paged: the byte
 * offsets of the next tile's K and V rows | bulk: the stages' mbarriers. */
KILN_CONTRACT_FN int kiln_prefill_q_bytes(int d, int bm) { return bm * d * 2; }
/* a K/V row as a stage holds it: d * es bytes, or with bulk=1 (KILN_TUNE: the tensor-core
 * decode's rows copied by cp.async.bulk, mma_tiles.cuh load_kv_rows_bulk) 16 more, a pad that
 * puts ldmatrix's eight rows on eight bank groups where the other loads XOR-swizzle. bulk=2
 * (the same decode's pages copied as TMA boxes, kv_pipeline::issue) keeps d * es bytes a row,
 * laid out as d / 64 blocks of [bn][64] elements in the 128-byte swizzle (kiln_kv_box_at). */
KILN_CONTRACT_FN int kiln_prefill_kv_row_bytes(int d, int es, int bulk) { return d * es + (bulk == 1 ? 16 : 0); }
/* The 128-byte swizzled tile (hopper.cuh), as bulk=2's stages hold it: the byte offset of
 * 16-byte chunk c of row r in a tile of bn rows: the chunk's 64-column block, then the row's 128
 * bytes, the chunk XOR-swizzled by (r & 7), as a TMA box of the 128-byte swizzle lands it (boxes
 * of 8, 16 or 32 rows at 1024-byte boundaries) */
KILN_CONTRACT_FN int kiln_kv_box_at(int bn, int r, int c) { return (c / 8) * bn * 128 + r * 128 + (((c % 8) ^ (r & 7)) << 4); }
KILN_CONTRACT_FN int kiln_prefill_stage_tile(int d, int es, int bn, int bulk)
{
    return bn * kiln_prefill_kv_row_bytes(d, es, bulk);
}
/* bulk: an mbarrier a stage, which the stage's copies complete */
KILN_CONTRACT_FN int kiln_prefill_bar_bytes(int stages, int bulk) { return bulk ? 8 * stages : 0; }
/* fp8 K/V in the packed rows without RoPE go from the loaded tiles into the MMAs' registers;
 * elsewhere they are converted into one 16-bit K and V tile per step */
KILN_CONTRACT_FN int kiln_prefill_fp8_in_regs(int es, int pack, int rope) { return es == 1 && pack && !rope; }
KILN_CONTRACT_FN int kiln_prefill_conv_bytes(int d, int es, int bn, int pack, int rope)
{
    return es == 1 && !kiln_prefill_fp8_in_regs(es, pack, rope) ? 2 * bn * d * 2 : 0;
}
/* paged: the byte offsets of the next tile's K and V rows (8 bytes each); bulk=2 also keeps each
 * row's page and row in the page (two ints), whose box starts the TMA copies read */
KILN_CONTRACT_FN int kiln_prefill_tab_bytes(int bn, int paged, int bulk)
{
    return paged ? 2 * bn * 8 + (bulk == 2 ? bn * 8 : 0) : 0;
}
/* ---- fp8 in registers: where a lane's fragments sit in the fp8 tiles (mma_attention.cuh,
 * "fp8 in registers"; checked on the CPU by test_batch_check.c's f8_fragment_layout) ----
 * The 16-byte chunk swizzle of an fp8 [rows][d] tile: chunk c of row r is stored at chunk
 * c ^ kiln_f8_swz(d, r), so that the fragment loads hit distinct banks: a K load's 8-lane phase
 * reads 4 chunks of rows 2q and 2q + 1 (the swizzles differ in bit 2), a V load's reads chunks
 * 2q', 2q' + 1 of 4 rows 2 apart (swizzles distinct in bits 1-2). d 64 (4 chunks, two rows a
 * bank line): K's phases are conflict-free as laid out and V's 8-byte reads keep a 2-way
 * conflict (every even row lies in the same half of the banks). */
KILN_CONTRACT_FN int kiln_f8_swz(int d, int row) { return d == 64 ? (row & 2) : ((row & 6) ^ ((row & 1) << 2)); }
/* Q K^T: the first of the four d (bytes of K row lane / 4) lane holds in k16 step kk */
KILN_CONTRACT_FN int kiln_f8_qk_d(int lane, int kk) { return 16 * (lane % 4 + 4 * (kk / 4)) + 4 * (kk % 4); }
/* ... and the byte offset, in an n8 block's rows, of the 16 bytes lane loads for steps 4 G .. 4 G + 3 */
KILN_CONTRACT_FN int kiln_f8_k_off(int d, int lane, int g4)
{
    return (lane / 4) * d + (((4 * g4 + lane % 4) ^ kiln_f8_swz(d, lane / 4)) << 4);
}
/* P V: the byte offset of lane's run of d in key row 2 (lane % 4) + e of a k16 step (16 bytes;
 * 8 at d 64), and the d of O column n (0 .. 7) of n8 block dn (0 .. d / 8 - 1) */
KILN_CONTRACT_FN int kiln_f8_v_off(int d, int lane, int e)
{
    return d == 64 ? (2 * (lane % 4) + e) * d + ((((lane / 4) >> 1) ^ kiln_f8_swz(d, 2 * (lane % 4) + e)) << 4) +
                         ((lane / 4) & 1) * 8
                   : (2 * (lane % 4) + e) * d + (((lane / 4) ^ kiln_f8_swz(d, 2 * (lane % 4) + e)) << 4);
}
KILN_CONTRACT_FN int kiln_f8_d(int d, int dn, int n)
{
    return d == 64 ? n * 8 + dn : (dn / 16) * 128 + n * 16 + dn % 16;
}
KILN_CONTRACT_FN int kiln_prefill_smem_bytes(int d, int es, int bm, int bn, int stages, int paged, int rope,
                                             int pack, int bulk)
{
    return kiln_prefill_q_bytes(d, bm) + 2 * stages * kiln_prefill_stage_tile(d, es, bn, bulk) +
           kiln_prefill_conv_bytes(d, es, bn, pack, rope) + kiln_rope_freq_bytes(d, rope) +
           kiln_prefill_tab_bytes(bn, paged, bulk) + kiln_prefill_bar_bytes(stages, bulk);
}

/* bulk=2's K/V stages take TMA boxes in the 128-byte swizzle, whose pattern follows address bits
 * 7-9: the layout starts at the first 1024-byte boundary of the dynamic window, this many bytes
 * reserved for the shift */
KILN_CONTRACT_FN int kiln_prefill_align_bytes(int bulk) { return bulk == 2 ? 1024 : 0; }

/* The tensor-core decode's key split (kiln__config.ksplit, KSPLIT in the templates): the CTA's
 * ksplit warps each run the one-warp layout above on their own region, 128-byte aligned
 * (bulk=2: 1024-byte, for its boxes). */
KILN_CONTRACT_FN int kiln_ksplit_region(int bytes, int bulk)
{
    const int a = bulk == 2 ? 1024 : 128;
    return (bytes + a - 1) / a * a;
}
/* A CTA's dynamic shared memory: its layouts (one, or ksplit regions) and bulk=2's reserve. */
KILN_CONTRACT_FN int kiln_prefill_cta_bytes(int layout_bytes, int ksplit, int bulk)
{
    return (ksplit > 1 ? ksplit * kiln_ksplit_region(layout_bytes, bulk) : layout_bytes) +
           kiln_prefill_align_bytes(bulk);
}

/* ---- shared memory of the warp-specialized Hopper kernel (templates/wgmma_attention.cuh) ----
 * Layout, from the first 1024-byte boundary of the dynamic window (the 128-byte swizzle needs
 * it; KILN_WGMMA_ALIGN bytes are reserved for the shift): Q [bm][d] | K stages | V stages (each
 * [bn][d], 16-bit, as D / 64 swizzled 64-column blocks) | the producer's raw stages and RoPE
 * frequencies (kiln_wgmma_raw_bytes: fp8 KV or RoPE) | the mbarriers (kiln_wgmma_bar_bytes) |
 * the persistent grid's job slot (KILN_WGMMA_JOB_BYTES). */
enum {
    KILN_WGMMA_ALIGN = 1024,
    KILN_WGMMA_BM = 128,               /* query rows per CTA: two consumer warpgroups of 64 */
    KILN_WGMMA_PRODUCER_THREADS = 128, /* one producer warpgroup */
    /* setmaxnreg moves registers between the warpgroups of a CTA, within what the launch gave
     * it: 384 threads x the kernel's count, at most 65536 / 384 rounded down to 8 = 168
     * (KILN_WGMMA_LAUNCH_REGS). A split over that blocks the consumers' setmaxnreg.inc for
     * ever (seen on the H200: 240 / 32 hung). Both grids split 40 / 232: the persistent
     * grid's consumers keep a job loop live and spill at 224, and d256's 80-key tiles spill
     * at 224 in a CTA per job; the producer spills nothing at 40 once it reads each job's
     * work after its first tile is under way (336 bytes at 24). */
    KILN_WGMMA_LAUNCH_REGS = 168,
    KILN_WGMMA_PRODUCER_REGS = 40,
    KILN_WGMMA_CONSUMER_REGS = 232,
};
/* The wgmma family's second kernel argument when it loads by TMA (KILN_WGMMA_LOAD_TMA): the
 * tensor maps of Q, K, V and O (CUtensorMap, opaque, 64-byte aligned), encoded by the host for
 * each launch (runtime/tma.c) with cuTensorMapEncodeTiled: 16-bit elements over [rows, heads, D]
 * (D innermost, then the head stride, then the row stride), boxes of 64 columns x 1 head x
 * the tile's rows (O: a consumer warpgroup's 64), the 128-byte swizzle. O's map is zeros, and
 * kiln_launch_params.o_by_tma 0, where O's pointer or strides do not suit TMA. */
#ifdef __cplusplus
#define KILN_ALIGN64 alignas(64)
#else
#define KILN_ALIGN64 _Alignas(64)
#endif
typedef struct kiln_tma_map {
    KILN_ALIGN64 unsigned long long opaque[16];
} kiln_tma_map;
typedef struct kiln_tma_maps {
    kiln_tma_map q, k, v, o;
} kiln_tma_maps;
/* kiln_cfg::LOAD of the wgmma family: how the producer fills Q and the K/V stages */
enum {
    KILN_WGMMA_LOAD_ROWS = 0, /* cp.async, a row per producer thread */
    KILN_WGMMA_LOAD_WARP = 1, /* cp.async, whole rows per warp instruction */
    KILN_WGMMA_LOAD_TMA = 2,  /* TMA for whole tiles, LOAD_WARP for the partial last ones (and
                                 kv=paged pages that are not a multiple of 8 rows) */
};
/* kiln_cfg::PERSIST of the wgmma family: the grid */
enum {
    KILN_WGMMA_PERSIST_NONE = 0,    /* a CTA per (tile, head) job */
    KILN_WGMMA_PERSIST_STATIC = 1,  /* a CTA per SM, jobs in rounds of gridDim.x, snake order */
    KILN_WGMMA_PERSIST_DYNAMIC = 2, /* a CTA per SM, the first wave as STATIC, each later job
                                       claimed from a counter: the schedule's next_job (batches),
                                       or for a single request with element masks the int after
                                       its tile map (kiln_tile_map_counter_at); jit/config.c
                                       says which variants take which */
    /* the persistent grid's job slot after the barriers (wgmma_attention.cuh, wg_job_put) */
    KILN_WGMMA_JOB_BYTES = 96,
};
/* The query rows of one row of a prefill's tile map (kiln_prefill_tile_map): the kernel's
 * block_m, or with the wgmma family a consumer warpgroup's 64, so that each warpgroup skips the
 * key tiles hidden for its own rows (wgmma_attention.cuh, wg_tiles). */
KILN_CONTRACT_FN int kiln_tile_map_bm(int block_m, int wgmma) { return wgmma ? block_m / 2 : block_m; }
/* Rows of the tile map of qo_len query tokens of pg rows each (the group where the kernel packs
 * a KV head's query heads into its rows, else 1): one per bm (kiln_tile_map_bm) rows. */
KILN_CONTRACT_FN long long kiln_tile_map_rows(long long qo_len, int pg, int bm) { return (qo_len * pg + bm - 1) / bm; }
/* A single request's dynamic persistent grid (KILN_WGMMA_PERSIST_DYNAMIC, kv=contiguous) claims
 * its jobs from an int counter in the tile map's buffer: at this byte offset after the map's
 * map_bytes (the next multiple of 16), KILN_TILE_MAP_TAIL_BYTES more in the buffer. The tile map
 * kernel writes it 0, and a run's last claim puts it back to 0. */
KILN_CONTRACT_FN long long kiln_tile_map_counter_at(long long map_bytes) { return (map_bytes + 15) / 16 * 16; }
#define KILN_TILE_MAP_TAIL_BYTES 16
/* kv=paged with LOAD_TMA: the rows of one TMA box of a K/V tile of bn keys from pages of
 * page_size rows (a page, or a tile-sized part of a larger one), or 0 where pages cannot be
 * copied by boxes (a box must start on a 1024-byte swizzle boundary: 8 rows; pages and tiles
 * must nest): those tiles are copied by rows. The host encodes the maps with it. */
KILN_CONTRACT_FN int kiln_wgmma_tma_page_rows(int page_size, int bn)
{
    return page_size <= 0 || page_size % 8 ? 0 : bn % page_size == 0 ? page_size : page_size % bn == 0 ? bn : 0;
}
/* The producer's transforms (wgmma_attention.cuh, "The producer's transforms"): with fp8 KV
 * or RoPE the producer copies K (fp8: and V) as stored, es bytes an element, into raw stages
 * of their own, and widens (and rotates) them into the 16-bit stages the consumers read. Two
 * raw stages keep the next tile's copies in flight while the producer converts this one; one
 * at d 256, where two do not fit beside 64-key stages. RoPE's d / 2 frequencies follow them. */
KILN_CONTRACT_FN int kiln_wgmma_raw_stages(int d, int es, int rope)
{
    return es == 1 || rope ? (d >= 256 ? 1 : 2) : 0;
}
KILN_CONTRACT_FN int kiln_wgmma_raw_tiles(int es, int rope) { return (es == 1 || rope) + (es == 1); } /* K, V */
KILN_CONTRACT_FN int kiln_wgmma_raw_bytes(int d, int bn, int es, int rope)
{
    return kiln_wgmma_raw_stages(d, es, rope) * kiln_wgmma_raw_tiles(es, rope) * bn * d * es +
           kiln_rope_freq_bytes(d, rope);
}
/* the stages' K full[stages], V full[stages], K empty[stages], V empty[stages], Q's full and
 * empty, the job slot's full, one spare, then the raw stages' full[raw] and as many spares: a
 * multiple of 16 bytes, so that the job slot after them is 16-byte aligned */
KILN_CONTRACT_FN int kiln_wgmma_bar_bytes(int stages, int raw) { return (4 * stages + 4 + 2 * raw) * 8; }
KILN_CONTRACT_FN int kiln_wgmma_smem_bytes(int d, int bm, int bn, int stages, int es, int rope)
{
    return KILN_WGMMA_ALIGN + bm * d * 2 + 2 * stages * bn * d * 2 + kiln_wgmma_raw_bytes(d, bn, es, rope) +
           kiln_wgmma_bar_bytes(stages, kiln_wgmma_raw_stages(d, es, rope)) + KILN_WGMMA_JOB_BYTES;
}

/* Whether a setmaxnreg split (the producer's 128 threads at prod registers, the consumers' 256
 * at cons) fits what the launch gives the CTA, in setmaxnreg's steps of 8 (a macro: C's
 * _Static_assert takes no function call). */
#define KILN_WGMMA_LAUNCH_TOTAL (KILN_WGMMA_LAUNCH_REGS * (KILN_WGMMA_PRODUCER_THREADS + 256))
#define KILN_WGMMA_SPLIT_FITS(prod, cons)                                                               \
    (KILN_WGMMA_LAUNCH_TOTAL <= 65536 && KILN_WGMMA_PRODUCER_THREADS * (prod) + 256 * (cons) <= KILN_WGMMA_LAUNCH_TOTAL && \
     (prod) % 8 == 0 && (cons) % 8 == 0)

/* ---- layout checks ----
 * Sizes on both sides; field offsets on the host only (NVRTC has no offsetof): with fixed-size
 * fields ordered widest first, equal sizes leave no room for a different layout. */
KILN_CONTRACT_ASSERT(sizeof(kiln_launch_params) == KILN_LAUNCH_PARAMS_SIZE, "kiln_launch_params size");
KILN_CONTRACT_ASSERT(KILN_WGMMA_SPLIT_FITS(KILN_WGMMA_PRODUCER_REGS, KILN_WGMMA_CONSUMER_REGS),
                     "setmaxnreg: the warpgroups' registers fit the launch's 384 x 168, in steps of 8");
KILN_CONTRACT_ASSERT(sizeof(kiln_tma_maps) == 4 * 128, "kiln_tma_maps: four CUtensorMaps");
KILN_CONTRACT_ASSERT(sizeof(kiln_merge_params) == KILN_MERGE_PARAMS_SIZE, "kiln_merge_params size");
KILN_CONTRACT_ASSERT(sizeof(kiln_work_header) == 4 * sizeof(int), "kiln_work_header: 4 ints");
KILN_CONTRACT_ASSERT(sizeof(kiln_work_item) == 12 * sizeof(int), "kiln_work_item: 12 ints");
KILN_CONTRACT_ASSERT(sizeof(kiln_work_req) == 8 * sizeof(int), "kiln_work_req: 8 ints");
KILN_CONTRACT_ASSERT(sizeof(kiln_merge_task) == 4 * sizeof(int), "kiln_merge_task: 4 ints");
#if !defined(__CUDACC_RTC__) && !defined(__CUDACC__)
#define KILN_CONTRACT_AT(t, f, at) _Static_assert(__builtin_offsetof(t, f) == (at), #t "." #f " at " #at)
KILN_CONTRACT_AT(kiln_launch_params, qo_len, 128);
KILN_CONTRACT_AT(kiln_launch_params, user, 176);
KILN_CONTRACT_AT(kiln_launch_params, kv_indices, 288);
KILN_CONTRACT_AT(kiln_launch_params, items_off, 328);
KILN_CONTRACT_AT(kiln_launch_params, counters_off, 364);
KILN_CONTRACT_AT(kiln_launch_params, lse_unit, 368);
KILN_CONTRACT_AT(kiln_merge_params, v_stride_n, 72);
KILN_CONTRACT_AT(kiln_merge_params, num_states, 88);
KILN_CONTRACT_AT(kiln_work_header, items, KILN_WORK_HEADER_ITEMS_AT * 4);
KILN_CONTRACT_AT(kiln_work_header, tasks, KILN_WORK_HEADER_TASKS_AT * 4);
KILN_CONTRACT_AT(kiln_work_header, next_job, KILN_WORK_HEADER_NEXT_AT * 4);
KILN_CONTRACT_AT(kiln_work_item, slot, KILN_WORK_ITEM_SLOT_AT * 4);
KILN_CONTRACT_AT(kiln_work_item, kv_start, KILN_WORK_ITEM_SLOT_AT * 4 + 12);
KILN_CONTRACT_AT(kiln_work_item, qo_len, KILN_WORK_ITEM_LEN_AT * 4);
KILN_CONTRACT_AT(kiln_work_item, kv_len, KILN_WORK_ITEM_LEN_AT * 4 + 4);
KILN_CONTRACT_AT(kiln_work_req, mask_bit0_lo, KILN_WORK_REQ_MASK_AT * 4);
KILN_CONTRACT_AT(kiln_work_req, bsr_row0, 24);
KILN_CONTRACT_AT(kiln_merge_task, nslots, 12);
#undef KILN_CONTRACT_AT
#endif

#endif /* KILN_PARAMS_H */
