/*
 * params.h — the one argument block every kiln kernel receives, by value.
 *
 * Shared verbatim by the host (runtime/, as C) and the device (the generated source, as CUDA
 * C++): only fixed-size scalar types, ordered widest first, so both compilers lay it out the
 * same way (a static assertion on each side checks the size). Strides are in elements.
 */
#ifndef KILN_PARAMS_H
#define KILN_PARAMS_H

typedef struct kiln_launch_params {
    unsigned long long q;           /* decode [H, D]; prefill [L_Q, H, D] */
    unsigned long long k;           /* [L_KV, H_KV, D] or [H_KV, L_KV, D] via strides */
    unsigned long long v;           /* like k */
    unsigned long long o;           /* like q */
    unsigned long long lse;         /* float, [H] or [L_Q, H]; 0 if not wanted */
    unsigned long long alibi;       /* float [H] slopes; 0 unless logits=alibi */
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
    float pad0, pad1; /* keep the size a multiple of 8 */
    unsigned long long user[8]; /* user parameters: f32/i32 bits in the low word, or pointers */
    unsigned long long mask_bits;   /* bitmask: u8 packed, bit i * L_KV + j, little-endian */
    unsigned long long bsr_indptr;  /* bsr: int [ceil(L_Q / bsr_r) + 1] */
    unsigned long long bsr_indices; /* bsr: int column-block indices, sorted per row */
    unsigned long long tile_map;    /* prefill: u8 [q tiles][kv_tiles]; 0 = none */
    int bsr_r, bsr_c;               /* bsr block shape */
    int kv_tiles;                   /* prefill: key tiles per query tile (row stride of the map) */
    int pad2;
    /* batches (kv=ragged / kv=paged): the plan's schedule lives in the workspace */
    unsigned long long kv_indices;  /* paged: int page ids */
    unsigned long long work;        /* int: [0] items, [1] merge tasks, then the arrays below */
    unsigned long long rope_offsets; /* int [B] position offsets, or 0 */
    long long k_stride_page, v_stride_page; /* paged: elements between pages */
    int items_off;   /* int offset in work of the items: 8 ints each (b, m, kv_lo, kv_hi, slot) */
    int reqs_off;    /* int offset of the requests: 8 ints each (q_start, qo_len, kv_start, kv_len, mask bit0 lo/hi, bsr row0, 0) */
    int tasks_off;   /* int offset of the merge tasks: 4 ints each (b, m, slot0, nslots) */
    int page_size;   /* paged: tokens per page */
    int slot_rows;   /* rows of one partial slot per head: decode 1, prefill BM */
    float k_scale;   /* fp8: effective scale of stored k (e4m3 includes 2^8, see device.cuh) */
    float v_scale;   /* fp8: effective scale of stored v */
    float rope_rcp_scale; /* rope: 1 / rope_scale */
    float rope_log2_theta; /* rope: log2(rope_theta) */
    int pad3;
} kiln_launch_params;

#define KILN_LAUNCH_PARAMS_SIZE 368

#endif /* KILN_PARAMS_H */
