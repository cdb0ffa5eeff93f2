/*
 * test_tma.c — the tensor maps of the wgmma family's TMA loads (runtime/tma.c) on the host,
 * through a fake cuTensorMapEncodeTiled: the memo gives back exactly the map an encode of the
 * same arguments gives, encodes again any map whose arguments changed (one tensor's pointer,
 * stride or rows; the head dim; paged or not), and keeps no failure, so a bad map is refused
 * with its message every time; a dense paged pool's K and V maps are 3-D over rows, another
 * pool's 4-D.
 */
#include <string.h>

#include "kt.h"
#include "runtime.h"

static int encodes;                     /* calls of the fake since the last reset */
static unsigned long long refused_base; /* the fake fails for this base address */
static unsigned long long rank_base;    /* the fake records the rank of this base's map */
static cuuint32_t rank_seen, rows_seen; /* ... and the size of its row dimension's box */

/* A map that is a function of every argument: a hash of them, spread over the 128 bytes. */
static CUresult fake_encode(CUtensorMap *map, CUtensorMapDataType dt, cuuint32_t rank, void *base,
                            const cuuint64_t *dim, const cuuint64_t *stride, const cuuint32_t *box,
                            const cuuint32_t *unit, CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                            CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob)
{
    encodes++;
    if ((unsigned long long)(uintptr_t)base == refused_base) return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned long long)(uintptr_t)base == rank_base) rank_seen = rank, rows_seen = box[2];
    uint64_t h = 1469598103934665603ull;
#define MIX(x) (h = (h ^ (uint64_t)(x)) * 1099511628211ull)
    MIX(dt);
    MIX(rank);
    MIX((uintptr_t)base);
    for (cuuint32_t i = 0; i < rank; i++) MIX(dim[i]), MIX(box[i]), MIX(unit[i]);
    for (cuuint32_t i = 0; i + 1 < rank; i++) MIX(stride[i]);
    MIX(il);
    MIX(sw);
    MIX(l2);
    MIX(oob);
#undef MIX
    uint64_t w[16];
    for (int i = 0; i < 16; i++) w[i] = h ^ (uint64_t)i * 0x9e3779b97f4a7c15ull;
    memcpy(map, w, sizeof w);
    return CUDA_SUCCESS;
}

static kiln__cu fake_cu;
static kiln_ctx fake_ctx;
static kiln_kernel fake_k;

/* A wgmma kernel of head dim D on kv (ragged or paged) whose driver is the fake. */
static kiln_kernel *kernel(int D, kiln_kv_storage kv)
{
    memset(&fake_cu, 0, sizeof fake_cu);
    fake_cu.cuTensorMapEncodeTiled = fake_encode;
    memset(&fake_ctx, 0, sizeof fake_ctx);
    fake_ctx.cu = &fake_cu;
    memset(&fake_k, 0, sizeof fake_k);
    fake_k.ctx = &fake_ctx;
    fake_k.v.head_dim = D;
    fake_k.v.kv = kv;
    fake_k.cfg.block_n = 128;
    fake_k.cfg.wgmma = 1;
    fake_k.cfg.load = KILN_WGMMA_LOAD_TMA;
    snprintf(fake_k.spec, sizeof fake_k.spec, "test d%d", D);
    return &fake_k;
}

/* q, k, v, o of a batch: [rows, 32 heads, D] q and o, [rows, 8 heads, D] k and v, aligned. */
static kiln_launch_params params(int D, int paged)
{
    kiln_launch_params p;
    memset(&p, 0, sizeof p);
    p.q = 0x7f1000000000ull;
    p.k = 0x7f2000000000ull;
    p.v = 0x7f3000000000ull;
    p.o = 0x7f4000000000ull;
    p.num_qo_heads = 32;
    p.num_kv_heads = 8;
    p.q_stride_n = p.o_stride_n = 32 * D;
    p.q_stride_h = p.o_stride_h = D;
    p.k_stride_n = p.v_stride_n = 8 * D;
    p.k_stride_h = p.v_stride_h = D;
    if (paged) {
        p.page_size = 16;
        p.k_stride_page = p.v_stride_page = 16 * 8 * D;
    }
    return p;
}

static int maps_of(kiln_kernel *k, kiln_launch_params *p, kiln_tma_maps *m)
{
    kiln__err e = {{0}};
    encodes = 0;
    const kiln_status st = kiln__tma_maps(k, p, "run", INT32_MAX, INT32_MAX, m, &e);
    if (st) kt_fail(__FILE__, __LINE__, "kiln__tma_maps: %s", e.msg);
    return encodes;
}

KT_TEST(tma_memo_same_maps)
{
    kiln__tma_memo_clear();
    refused_base = 0;
    for (int paged = 0; paged < 2; paged++) {
        kiln__tma_memo_clear();
        kiln_kernel *k = kernel(128, paged ? KILN_KV_PAGED : KILN_KV_RAGGED);
        kiln_launch_params p = params(128, paged);
        kiln_tma_maps first, again, fresh;
        KT_EQ_INT(maps_of(k, &p, &first), 4); /* q, k, v and o */
        KT_EQ_INT(p.o_by_tma, 1);
        KT_EQ_INT(maps_of(k, &p, &again), 0);
        KT_EQ_INT(p.o_by_tma, 1);
        KT_EQ_INT(memcmp(&first, &again, sizeof first), 0);
        /* what the memo gives is what an encode gives */
        kiln__tma_memo_clear();
        KT_EQ_INT(maps_of(k, &p, &fresh), 4);
        KT_EQ_INT(memcmp(&first, &fresh, sizeof first), 0);
    }
    kiln__tma_memo_clear();
}

KT_TEST(tma_memo_changed_arguments)
{
    kiln__tma_memo_clear();
    refused_base = 0;
    kiln_kernel *k = kernel(128, KILN_KV_RAGGED);
    kiln_launch_params p = params(128, 0);
    kiln_tma_maps m, m2;
    KT_EQ_INT(maps_of(k, &p, &m), 4);
    /* a new q and o (the next layer's activations): those two only */
    p.q += 1 << 20;
    p.o += 1 << 20;
    KT_EQ_INT(maps_of(k, &p, &m2), 2);
    KT_EQ_INT(memcmp(&m.k, &m2.k, sizeof m.k), 0);
    KT_EQ_INT(memcmp(&m.v, &m2.v, sizeof m.v), 0);
    KT_REQUIRE(memcmp(&m.q, &m2.q, sizeof m.q) != 0);
    KT_REQUIRE(memcmp(&m.o, &m2.o, sizeof m.o) != 0);
    /* back to the first q and o: still in the memo */
    p.q -= 1 << 20;
    p.o -= 1 << 20;
    KT_EQ_INT(maps_of(k, &p, &m2), 0);
    KT_EQ_INT(memcmp(&m, &m2, sizeof m), 0);
    /* a stride of K: K's map only */
    p.k_stride_n *= 2;
    KT_EQ_INT(maps_of(k, &p, &m2), 1);
    KT_REQUIRE(memcmp(&m.k, &m2.k, sizeof m.k) != 0);
    p.k_stride_n /= 2;
    /* other row bounds (a single request's lengths): Q, K, V and O again */
    kiln__err e = {{0}};
    encodes = 0;
    KT_EQ_INT(kiln__tma_maps(k, &p, "single prefill", 1000, 2000, &m2, &e), KILN_STATUS_OK);
    KT_EQ_INT(encodes, 4);
    /* another head dim: every map */
    k = kernel(64, KILN_KV_RAGGED);
    p = params(128, 0); /* the same pointers and strides, read as D 64 */
    KT_EQ_INT(maps_of(k, &p, &m2), 4);
    KT_REQUIRE(memcmp(&m.q, &m2.q, sizeof m.q) != 0);
    /* forty layers' K / V pools, twice: the second pass encodes nothing */
    k = kernel(128, KILN_KV_PAGED);
    kiln__tma_memo_clear();
    int first = 0, second = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int layer = 0; layer < 40; layer++) {
            p = params(128, 1);
            p.k += (unsigned long long)layer << 30;
            p.v += (unsigned long long)layer << 30;
            const int n = maps_of(k, &p, &m2);
            if (pass) second += n;
            else first += n;
        }
    KT_EQ_INT(first, 2 + 80); /* q and o once, then each layer's k and v */
    KT_EQ_INT(second, 0);     /* 82 maps in 64 sets of 4 */
    kiln__tma_memo_clear();
}

KT_TEST(tma_memo_keeps_no_failure)
{
    kiln__tma_memo_clear();
    kiln_kernel *k = kernel(128, KILN_KV_RAGGED);
    kiln_launch_params p = params(128, 0);
    refused_base = p.k;
    for (int i = 0; i < 2; i++) {
        kiln__err e = {{0}};
        kiln_tma_maps m;
        encodes = 0;
        KT_EQ_INT(kiln__tma_maps(k, &p, "run", INT32_MAX, INT32_MAX, &m, &e), KILN_STATUS_CUDA);
        KT_EQ_INT(encodes, i ? 1 : 3); /* o, q, then k refused (v not tried); then k alone */
        KT_CONTAINS(e.msg, "the TMA map of k");
        KT_CONTAINS(e.msg, "test d128");
    }
    /* a new O refused: no error, O stored from registers (o_by_tma 0), tried again next time */
    p.o += 1 << 20;
    refused_base = p.o;
    for (int i = 0; i < 2; i++) {
        kiln_tma_maps m;
        KT_EQ_INT(maps_of(k, &p, &m), i ? 1 : 3); /* o, k and v (q is kept); then o alone */
        KT_EQ_INT(p.o_by_tma, 0);
    }
    /* a bad stride is refused before the memo is looked at */
    refused_base = 0;
    p.q_stride_n = 0;
    kiln__err e = {{0}};
    kiln_tma_maps m;
    KT_EQ_INT(kiln__tma_maps(k, &p, "run", INT32_MAX, INT32_MAX, &m, &e),
              KILN_STATUS_INVALID_ARGUMENT);
    KT_CONTAINS(e.msg, "q's strides");
    kiln__tma_memo_clear();
}

/* kv=paged: a dense pool (pages page_size rows apart at the row stride) takes 3-D maps over
 * rows page * page_size + r, boxes of a page's rows; a pool whose pages are apart otherwise (HND:
 * a head's rows of a page together) 4-D maps; the kernel reads which from kv_map_rows. */
KT_TEST(tma_paged_dense_pool_3d)
{
    refused_base = 0;
    kiln_kernel *k = kernel(128, KILN_KV_PAGED);
    kiln_launch_params p = params(128, 1);
    kiln_tma_maps m;
    rank_base = p.k;
    kiln__tma_memo_clear();
    p.kv_map_rows = 7; /* whatever the caller left there */
    p.kv_box_rows = 7;
    maps_of(k, &p, &m);
    KT_EQ_INT(p.kv_map_rows, 1);
    KT_EQ_INT((int)rank_seen, 3);
    KT_EQ_INT((int)rows_seen, 16);
    KT_EQ_INT(p.kv_box_rows, 16); /* a page a box: 16 rows of the 128-key tile */
    /* HND: [pages][8 heads][16 rows][D] */
    p.k_stride_n = p.v_stride_n = 128;
    p.k_stride_h = p.v_stride_h = 16 * 128;
    kiln__tma_memo_clear();
    maps_of(k, &p, &m);
    KT_EQ_INT(p.kv_map_rows, 0);
    KT_EQ_INT((int)rank_seen, 4);
    KT_EQ_INT((int)rows_seen, 16);
    /* pages that do not nest with the tile go by rows: no box (the kernel reads 0) */
    p = params(128, 1);
    p.page_size = 24;
    p.kv_box_rows = 7;
    kiln__tma_memo_clear();
    maps_of(k, &p, &m);
    KT_EQ_INT(p.kv_box_rows, 0);
    /* V alone apart: both stay 4-D (the kernel has one flag for both) */
    p = params(128, 1);
    p.v_stride_page *= 2;
    kiln__tma_memo_clear();
    maps_of(k, &p, &m);
    KT_EQ_INT(p.kv_map_rows, 0);
    KT_EQ_INT((int)rank_seen, 4);
    rank_base = 0;
    kiln__tma_memo_clear();
}

/* The tensor-core decode's bulk=2 (a one-warp mma.sync kernel, 32-key tiles) takes K's and V's
 * maps only: no Q map, no O map (o_by_tma 0); its pages of 16 rows are two boxes a tile, a page of
 * 64 a box of the tile's 32 rows; kv=ragged a box a tile. */
KT_TEST(tma_decode_kv_maps_only)
{
    refused_base = 0;
    for (int paged = 0; paged < 2; paged++) {
        kiln_kernel *k = kernel(128, paged ? KILN_KV_PAGED : KILN_KV_RAGGED);
        k->cfg.wgmma = 0;
        k->cfg.load = 0;
        k->cfg.bulk = 2;
        k->cfg.block_n = 32;
        KT_EQ_INT(kiln__config_tma_maps(&k->cfg), 1);
        kiln_launch_params p = params(128, paged);
        p.o_by_tma = 1; /* whatever the caller left there */
        kiln_tma_maps m;
        memset(&m, 0xab, sizeof m);
        rank_base = p.k;
        kiln__tma_memo_clear();
        KT_EQ_INT(maps_of(k, &p, &m), 2);
        KT_EQ_INT(p.o_by_tma, 0);
        static const kiln_tma_map zero;
        KT_EQ_INT(memcmp(&m.q, &zero, sizeof zero), 0);
        KT_EQ_INT(memcmp(&m.o, &zero, sizeof zero), 0);
        KT_EQ_INT((int)rows_seen, paged ? 16 : 32);
        KT_EQ_INT(p.kv_box_rows, paged ? 16 : 0);
        if (paged) {
            p.page_size = 64;
            p.k_stride_page = p.v_stride_page = 64 * 8 * 128;
            kiln__tma_memo_clear();
            KT_EQ_INT(maps_of(k, &p, &m), 2);
            KT_EQ_INT(p.kv_box_rows, 32);
            KT_EQ_INT((int)rows_seen, 32);
        }
    }
    rank_base = 0;
    kiln__tma_memo_clear();
}
