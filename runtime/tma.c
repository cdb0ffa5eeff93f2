/*
 * tma.c — the tensor maps of a wgmma kernel that loads by TMA (kiln__config.load ==
 * KILN_WGMMA_LOAD_TMA, templates/wgmma_attention.cuh): one per tensor (Q, K, V, O), encoded on the
 * host for each launch with the driver's cuTensorMapEncodeTiled and passed by value as the
 * kernel's second argument (kiln_tma_maps, params.h). A paged cache's K and V maps are 4-D
 * (one box per page, kiln_wgmma_tma_page_rows). Pure host work: no device call, so a
 * launch stays capturable in a CUDA graph (the maps are copied into the graph's node with the
 * other arguments).
 */
#include <string.h>

#include "runtime.h"

/* One map: 16-bit [rows, heads, D] at base with the given element strides, boxes of 64
 * columns x 1 head x box_rows rows, swizzled 128 bytes (the layout the kernel's wgmma reads).
 * stride_page > 0: a paged pool, [pages, rows = page_size, heads, D], one page a box. */
static kiln_status encode(const kiln_kernel *k, const char *what, const char *name,
                          unsigned long long base, long long stride_page, long long stride_n,
                          long long stride_h, int64_t rows, int heads, int box_rows,
                          kiln_tma_map *out, kiln__err *e)
{
    const int D = k->v.head_dim, paged = stride_page > 0;
    if (stride_page < 0 || stride_n <= 0 || stride_h < 0 || rows < 1)
        return kiln__fail(e, KILN_STATUS_INVALID_ARGUMENT,
                          "%s %s: %s's strides (page %lld, n %lld, h %lld elements) must be "
                          "positive for the wgmma family's TMA loads (KILN_TUNE load=1 copies "
                          "without them)",
                          what, k->spec, name, stride_page, stride_n, stride_h);
    CUtensorMap map;
    const cuuint64_t dim[4] = {(cuuint64_t)D, (cuuint64_t)heads, (cuuint64_t)rows,
                               (cuuint64_t)INT32_MAX};
    /* a head stride of 0 (one head) still has to be a valid stride: any multiple of 16 */
    const cuuint64_t stride[3] = {(cuuint64_t)(stride_h ? stride_h : D) * 2,
                                  (cuuint64_t)stride_n * 2, (cuuint64_t)stride_page * 2};
    const cuuint32_t box[4] = {64, 1, (cuuint32_t)box_rows, 1}, unit[4] = {1, 1, 1, 1};
    CUresult r = k->ctx->cu->cuTensorMapEncodeTiled(
        &map, CU_TENSOR_MAP_DATA_TYPE_UINT16, paged ? 4 : 3, (void *)(uintptr_t)base, dim, stride,
        box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return kiln__cu_fail(e, r,
                             "%s %s: the TMA map of %s (base 0x%llx, %lld rows of stride %lld%s, "
                             "%d heads of stride %lld, pages of stride %lld elements)",
                             what, k->spec, name, base, (long long)rows, stride_n,
                             paged ? " a page" : "", heads, stride_h, stride_page);
    _Static_assert(sizeof map == sizeof *out, "a CUtensorMap is a kiln_tma_map");
    memcpy(out, &map, sizeof map);
    return KILN_STATUS_OK;
}

/* O's map, for the kernel's TMA stores of whole 64-row blocks, where O's pointer and strides
 * suit TMA (16-byte multiples, under its stride limit): p->o_by_tma says which. Where they do
 * not, the kernel stores O from registers as it does every partial block: the same bytes land
 * either way, so this is no error. */
static void encode_o(const kiln_kernel *k, kiln_launch_params *p, int64_t rows, kiln_tma_map *out)
{
    const long long sn = p->o_stride_n, sh = p->o_stride_h;
    p->o_by_tma = !(p->o % 16 || sn % 8 || sh % 8 || sn >= (1LL << 38) || sh >= (1LL << 38)) &&
                  encode(k, "run", "o", p->o, 0, sn, sh, rows, p->num_qo_heads, KILN_WGMMA_BM / 2,
                         out, NULL) == KILN_STATUS_OK; /* no message: not an error */
    if (!p->o_by_tma) memset(out, 0, sizeof *out);
}

kiln_status kiln__tma_maps(const kiln_kernel *k, kiln_launch_params *p, const char *what,
                           int64_t q_rows, int64_t kv_rows, kiln_tma_maps *m, kiln__err *e)
{
    encode_o(k, p, q_rows, &m->o);
    const int paged = k->v.kv == KILN_KV_PAGED;
    /* paged: one box per page; pages the kernel cannot copy by boxes go by rows, and their
     * maps are never read */
    const int rows =
        paged ? kiln_wgmma_tma_page_rows(p->page_size, k->cfg.block_n) : k->cfg.block_n;
    kiln_status st = encode(k, what, "q", p->q, 0, p->q_stride_n, p->q_stride_h, q_rows,
                            p->num_qo_heads, KILN_WGMMA_BM, &m->q, e);
    if (st || !rows) {
        memset(&m->k, 0, sizeof m->k);
        memset(&m->v, 0, sizeof m->v);
        return st;
    }
    if (paged) kv_rows = p->page_size;
    st = encode(k, what, "k", p->k, paged ? p->k_stride_page : 0, p->k_stride_n, p->k_stride_h,
                kv_rows, p->num_kv_heads, rows, &m->k, e);
    if (!st)
        st = encode(k, what, "v", p->v, paged ? p->v_stride_page : 0, p->v_stride_n, p->v_stride_h,
                    kv_rows, p->num_kv_heads, rows, &m->v, e);
    return st;
}
