/*
 * tma.c — the tensor maps of a wgmma kernel that loads by TMA (kiln__config.load ==
 * KILN_WGMMA_LOAD_TMA, templates/wgmma_attention.cuh): one per tensor (Q, K, V, O), encoded on the
 * host with the driver's cuTensorMapEncodeTiled and passed by value as the kernel's second
 * argument (kiln_tma_maps, params.h). A paged cache's K and V maps are 4-D (one box per page,
 * kiln_wgmma_tma_page_rows). Pure host work: no device call, so a launch stays capturable in a
 * CUDA graph (the maps are copied into the graph's node with the other arguments).
 *
 * A map is a function of its encode arguments only (address, sizes, strides, box), so each
 * thread keeps the maps it encoded last in a small table (memo below) and copies one out when
 * the same arguments come again: an engine's launches repeat the same cache pools, layer after
 * layer and step after step, and a launch then makes no driver call but the launch itself.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* ---- the memo: a thread's last maps, by a hash of their arguments ---- */

/* Everything cuTensorMapEncodeTiled is given, bar what follows from the element size (16-bit:
 * the 128-byte swizzle, 64-column boxes; fp8: no swizzle, whole rows): equal keys encode equal
 * maps. */
typedef struct map_key {
    unsigned long long base;
    long long stride_page, stride_n, stride_h;
    int64_t rows;
    int heads, box_heads, box_rows, D, es;
} map_key;

/* 64 sets of 4 maps (each set refilled round robin): an engine's Q and O, and the K and V
 * pools of its layers, stay in it across steps. */
enum { MEMO_SETS = 64, MEMO_WAYS = 4 };

typedef struct memo_slot {
    map_key key;
    int used;
    kiln_tma_map map;
} memo_slot;

typedef struct memo_table {
    memo_slot slot[MEMO_SETS][MEMO_WAYS];
    unsigned char next[MEMO_SETS]; /* the way each set refills next */
} memo_table;

/* The calling thread's table (48 KB), allocated on its first map and freed when it exits; NULL
 * where it could not be allocated (every map is then encoded). */
static pthread_key_t memo_key;
static pthread_once_t memo_once = PTHREAD_ONCE_INIT;
static int memo_key_ok;
static _Thread_local memo_table *memo;

static void memo_key_create(void) { memo_key_ok = pthread_key_create(&memo_key, free) == 0; }

static memo_table *memo_get(void)
{
    if (memo) return memo;
    pthread_once(&memo_once, memo_key_create);
    if (!memo_key_ok) return NULL;
    /* aligned as its CUtensorMaps must be (64 bytes; calloc gives 16: UBSan's misaligned access) */
    const size_t align = _Alignof(memo_table),
                 bytes = (sizeof(memo_table) + align - 1) / align * align;
    memo_table *t = aligned_alloc(align, bytes);
    if (t) memset(t, 0, bytes);
    if (t && pthread_setspecific(memo_key, t)) {
        free(t);
        t = NULL;
    }
    return memo = t;
}

static unsigned memo_set(const map_key *key)
{
    uint64_t h = 0x9e3779b97f4a7c15ull;
    const uint64_t w[] = {key->base,
                          (uint64_t)key->stride_page,
                          (uint64_t)key->stride_n,
                          (uint64_t)key->stride_h,
                          (uint64_t)key->rows,
                          (uint64_t)key->heads << 32 | (uint32_t)key->box_rows,
                          (uint64_t)key->box_heads,
                          (uint64_t)key->D << 8 | (uint32_t)key->es};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        h ^= w[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    }
    return (unsigned)(h % MEMO_SETS);
}

/* One map: [rows, heads, D] of es-byte elements at base with the given element strides. es 2:
 * boxes of 64 columns x box_heads heads x box_rows rows, swizzled 128 bytes (the layout the
 * kernel's wgmma reads: with box_heads > 1, the packed rows of kiln__config.pack, row r token
 * r / box_heads); es 1 (fp8 K/V, into the producer's raw stages): boxes of whole D-byte rows,
 * not swizzled. stride_page > 0: a paged pool, [pages, rows = page_size, heads, D], one page a
 * box. */
static kiln_status encode(const kiln_kernel *k, const char *what, const char *name, int es,
                          unsigned long long base, long long stride_page, long long stride_n,
                          long long stride_h, int64_t rows, int heads, int box_heads, int box_rows,
                          kiln_tma_map *out, kiln__err *e)
{
    const int D = k->v.head_dim, paged = stride_page > 0;
    if (stride_page < 0 || stride_n <= 0 || stride_h < 0 || rows < 1)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "%s %s: %s's strides (page %lld, n %lld, h %lld elements) must be "
                          "positive for %s",
                          what, k->spec, name, stride_page, stride_n, stride_h,
                          k->cfg.wgmma ? "the wgmma family's TMA loads (KILN_TUNE load=1 copies "
                                         "without them)"
                                       : "bulk=2's TMA loads (KILN_TUNE bulk=0 copies without "
                                         "them)");
    map_key key;
    memset(&key, 0, sizeof key); /* the padding too: keys are compared with memcmp */
    key.base = base;
    key.stride_page = stride_page;
    key.stride_n = stride_n;
    key.stride_h = stride_h;
    key.rows = rows;
    key.heads = heads;
    key.box_heads = box_heads;
    key.box_rows = box_rows;
    key.D = D;
    key.es = es;
    memo_table *t = memo_get();
    const unsigned set = memo_set(&key);
    if (t)
        for (int w = 0; w < MEMO_WAYS; w++) {
            const memo_slot *m = &t->slot[set][w];
            if (m->used && !memcmp(&m->key, &key, sizeof key)) {
                *out = m->map;
                return KILN_STATUS_OK;
            }
        }
    CUtensorMap map;
    const cuuint64_t dim[4] = {(cuuint64_t)D, (cuuint64_t)heads, (cuuint64_t)rows,
                               (cuuint64_t)INT32_MAX};
    /* a head stride of 0 (one head) still has to be a valid stride: any multiple of 16 */
    const cuuint64_t stride[3] = {(cuuint64_t)(stride_h ? stride_h : D) * es,
                                  (cuuint64_t)stride_n * es, (cuuint64_t)stride_page * es};
    const cuuint32_t box[4] = {es == 2 ? 64 : (cuuint32_t)D, (cuuint32_t)box_heads,
                               (cuuint32_t)box_rows, 1},
                     unit[4] = {1, 1, 1, 1};
    CUresult r = k->ctx->cu->cuTensorMapEncodeTiled(
        &map, es == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8,
        paged ? 4 : 3, (void *)(uintptr_t)base, dim, stride, box, unit,
        CU_TENSOR_MAP_INTERLEAVE_NONE,
        es == 2 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return kiln__cu_fail(e, r,
                             "%s %s: the TMA map of %s (base 0x%llx, %lld rows of stride %lld%s, "
                             "%d heads of stride %lld, pages of stride %lld elements)",
                             what, k->spec, name, base, (long long)rows, stride_n,
                             paged ? " a page" : "", heads, stride_h, stride_page);
    _Static_assert(sizeof map == sizeof *out, "a CUtensorMap is a kiln_tma_map");
    memcpy(out, &map, sizeof map);
    if (t) { /* failures are not kept: each one is tried, and reported, again */
        memo_slot *m = &t->slot[set][t->next[set]];
        t->next[set] = (unsigned char)((t->next[set] + 1) % MEMO_WAYS);
        m->key = key;
        m->map = *out;
        m->used = 1;
    }
    return KILN_STATUS_OK;
}

/* O's map, for the kernel's TMA stores of whole 64-row blocks, where O's pointer and strides
 * suit TMA (16-byte multiples, under its stride limit): p->o_by_tma says which. Where they do
 * not, the kernel stores O from registers as it does every partial block: the same bytes land
 * either way, so this is no error. */
static void encode_o(const kiln_kernel *k, kiln_launch_params *p, int64_t rows, kiln_tma_map *out)
{
    const long long sn = p->o_stride_n, sh = p->o_stride_h;
    p->o_by_tma =
        !(p->o % 16 || sn % 8 || sh % 8 || sn >= (1LL << 38) || sh >= (1LL << 38)) &&
        encode(k, "run", "o", 2, p->o, 0, sn, sh, rows, p->num_qo_heads, kiln__rows_a_token(k),
               KILN_WGMMA_BM / 2 / kiln__rows_a_token(k), out, NULL) == KILN_STATUS_OK;
    /* a map that did not encode is no error: O goes from registers */
    if (!p->o_by_tma) memset(out, 0, sizeof *out);
}

kiln_status kiln__tma_maps(const kiln_kernel *k, kiln_launch_params *p, const char *what,
                           int64_t q_rows, int64_t kv_rows, kiln_tma_maps *m, kiln__err *e)
{
    /* the wgmma family's Q and O maps; the tensor-core decode (bulk=2) takes K's and V's only */
    const int wg = k->cfg.wgmma;
    if (wg) {
        encode_o(k, p, q_rows, &m->o);
    } else {
        p->o_by_tma = 0;
        memset(&m->o, 0, sizeof m->o);
    }
    const int paged = k->v.kv == KILN_KV_PAGED;
    p->kv_map_rows = 0;
    /* paged: one box per page; pages the kernel cannot copy by boxes go by rows, and their
     * maps are never read */
    const int rows =
        paged ? kiln_wgmma_tma_page_rows(p->page_size, k->cfg.block_n) : k->cfg.block_n;
    p->kv_box_rows = paged ? rows : 0;
    kiln_status st = KILN_STATUS_OK;
    if (wg)
        st = encode(k, what, "q", 2, p->q, 0, p->q_stride_n, p->q_stride_h, q_rows, p->num_qo_heads,
                    kiln__rows_a_token(k), KILN_WGMMA_BM / kiln__rows_a_token(k), &m->q, e);
    else memset(&m->q, 0, sizeof m->q);
    /* fp8 K/V: byte maps, for the copies into the producer's raw stages */
    const int es = kiln__kv_fp8(&k->v) ? 1 : 2;
    if (st || !rows) {
        memset(&m->k, 0, sizeof m->k);
        memset(&m->v, 0, sizeof m->v);
        return st;
    }
    /* a dense pool (pages page_size rows apart at the row stride: NHD as FlashInfer allocates
     * it) takes 3-D maps over rows page * page_size + r, as ragged K/V do; other pools 4-D */
    p->kv_map_rows = paged && p->k_stride_page == (long long)p->page_size * p->k_stride_n &&
                     p->v_stride_page == (long long)p->page_size * p->v_stride_n;
    const int four_d = paged && !p->kv_map_rows;
    if (four_d) kv_rows = p->page_size;
    st = encode(k, what, "k", es, p->k, four_d ? p->k_stride_page : 0, p->k_stride_n, p->k_stride_h,
                kv_rows, p->num_kv_heads, 1, rows, &m->k, e);
    if (!st)
        st = encode(k, what, "v", es, p->v, four_d ? p->v_stride_page : 0, p->v_stride_n,
                    p->v_stride_h, kv_rows, p->num_kv_heads, 1, rows, &m->v, e);
    return st;
}

void kiln__tma_memo_clear(void)
{
    if (memo) memset(memo, 0, sizeof *memo);
}
