/*
 * test_maskdata.c — masks given as data: a packed bitmask (FlashInfer's little-endian bit
 * order) and a block-sparse (BSR) mask, in decode and prefill, against the dense float64
 * reference; with and without the tile map, which must not change the result.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kt.h"

typedef struct dense {
    int L_Q, L_KV;
    const unsigned char *bits; /* bitmask */
    const int *indptr, *indices;
    int r, c;
} dense;

static int ref_bits(const void *u, int i, int j, int h, int hk, int lq, int lkv)
{
    (void)h, (void)hk, (void)lq;
    const dense *d = u;
    const long long bit = (long long)i * lkv + j;
    return (d->bits[bit >> 3] >> (bit & 7)) & 1;
}

static int ref_bsr(const void *u, int i, int j, int h, int hk, int lq, int lkv)
{
    (void)h, (void)hk, (void)lq, (void)lkv;
    const dense *d = u;
    const int rb = i / d->r, cb = j / d->c;
    for (int e = d->indptr[rb]; e < d->indptr[rb + 1]; e++)
        if (d->indices[e] == cb) return 1;
    return 0;
}

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

/* Random bits with some structure: whole empty and whole full rows and runs. */
static unsigned char *make_bits(int L_Q, int L_KV, uint64_t seed)
{
    const size_t nb = ((size_t)L_Q * L_KV + 7) / 8 + 1;
    unsigned char *b = calloc(nb, 1);
    if (!b) return NULL;
    for (int i = 0; i < L_Q; i++) {
        const int kind = (int)(lcg(&seed) % 5); /* 0 empty row, 1 full row, else random runs */
        for (int j = 0; j < L_KV; j++) {
            int on = kind == 1 || (kind > 1 && ((lcg(&seed) % 4) != 0));
            const long long bit = (long long)i * L_KV + j;
            if (on) b[bit >> 3] |= (unsigned char)(1u << (bit & 7));
        }
    }
    return b;
}

/* Random BSR with about `pct` % of blocks present, sorted per row. */
static void make_bsr(int rows, int cols, int pct, uint64_t seed, int **indptr, int **indices,
                     int *nnz)
{
    *indptr = calloc((size_t)rows + 1, sizeof(int));
    *indices = calloc((size_t)rows * cols + 1, sizeof(int));
    int n = 0;
    for (int r = 0; r < rows; r++) {
        (*indptr)[r] = n;
        for (int c = 0; c < cols; c++)
            if ((int)(lcg(&seed) % 100) < pct) (*indices)[n++] = c;
    }
    (*indptr)[rows] = n;
    *nnz = n;
}

static void run_one(kiln_ctx *ctx, const char *spec, kiln_mask_data md, int L_Q, int L_KV,
                    int use_map, int r, int c, uint64_t seed, int *cases, int *bad)
{
    kiln_variant v;
    if (kiln_variant_parse(spec, &v) != KILN_STATUS_OK) {
        kt_fail(__FILE__, __LINE__, "%s: %s", spec, kiln_errmsg());
        return;
    }
    v.mask_data = md;
    kiln_kernel *k = NULL;
    if (kiln_kernel_get(ctx, &v, &k) != KILN_STATUS_OK) {
        kt_fail(__FILE__, __LINE__, "%s: %s", spec, kiln_ctx_errmsg(ctx));
        return;
    }
    const int lq = v.op == KILN_OP_DECODE ? 1 : L_Q;
    dense d = {lq, L_KV, NULL, NULL, NULL, r, c};
    kiln_check_shape s = {
        .num_qo_heads = 8, .qo_len = lq, .kv_len = L_KV, .window_left = -1, .seed = seed};
    unsigned char *bits = NULL;
    int *indptr = NULL, *indices = NULL, nnz = 0;
    if (md == KILN_MASK_DATA_BITMASK) {
        bits = make_bits(lq, L_KV, seed);
        d.bits = bits;
        s.mask_bits_host = bits;
        s.ref_mask = ref_bits;
    } else {
        const int rows = (lq + r - 1) / r, cols = (L_KV + c - 1) / c;
        make_bsr(rows, cols, 45, seed, &indptr, &indices, &nnz);
        d.indptr = indptr;
        d.indices = indices;
        s.bsr_indptr_host = indptr;
        s.bsr_indices_host = indices;
        s.bsr_rows = rows;
        s.bsr_nnz = nnz;
        s.bsr_r = r;
        s.bsr_c = c;
        s.ref_mask = ref_bsr;
    }
    s.ref_user = &d;
    s.use_tile_map = use_map;
    kiln_check_result res;
    char msg[512];
    (*cases)++;
    if (kiln_check_run(ctx, k, &s, 0, &res, msg, sizeof msg) != KILN_STATUS_OK) {
        (*bad)++;
        kt_fail(__FILE__, __LINE__, "%s %s L_Q=%d L_KV=%d map=%d r=%d c=%d: %s", spec,
                md == KILN_MASK_DATA_BITMASK ? "bitmask" : "bsr", lq, L_KV, use_map, r, c, msg);
    }
    free(bits);
    free(indptr);
    free(indices);
}

/* Compiles for sm_90a (CPU). */
KT_TEST(maskdata_compiles)
{
    kiln_ctx *ctx = KT_CTX(NULL, 0);
    KT_REQUIRE(ctx);
    const char *specs[] = {"op=decode dtype=f16 head_dim=64 group=4",
                           "op=prefill dtype=bf16 head_dim=64 group=4 mask=causal"};
    for (int i = 0; i < 2; i++)
        for (int md = 1; md <= 2; md++) {
            kiln_variant v;
            KT_OK(kiln_variant_parse(specs[i], &v), kiln_errmsg());
            v.mask_data = (kiln_mask_data)md;
            kiln_kernel *k = NULL;
            KT_OK(kiln_kernel_compile(ctx, &v, "sm_90a", &k), kiln_ctx_errmsg(ctx));
            if (k && i == 1) KT_CONTAINS(kiln_kernel_source(k), "kiln_tile_map(");
        }
    kiln_ctx_destroy(ctx);
}

/* Every mask-data case against the float64 reference; tune, where not NULL, is KILN_TUNE for
 * the prefills (wgmma=0: the mma.sync family, which sm_80-89 run and sm_90 takes on request;
 * pack=1: the wgmma family's packed rows, prefills only; persist=2: a single request's dynamic
 * persistent grid, which counts its jobs in the tile map: prefills with a map only). */
enum { MD_PREFILLS = 1, MD_MAPS = 2 };
static void maskdata_all(const char *tune, int only)
{
    if (tune) setenv("KILN_TUNE", tune, 1);
    kiln_ctx *ctx = KT_CTX(NULL, 1);
    if (!ctx) unsetenv("KILN_TUNE");
    KT_REQUIRE(ctx);
    int cases = 0, bad = 0;
    const char *specs[] = {"op=decode dtype=f16 head_dim=128 group=4",
                           "op=decode dtype=bf16 head_dim=64 group=8 layout=hnd",
                           "op=prefill dtype=bf16 head_dim=128 group=4",
                           "op=prefill dtype=f16 head_dim=64 group=1 mask=causal",
                           "op=prefill dtype=bf16 head_dim=256 group=4 mask=causal lse=1"};
    static const int shapes[][2] = {{1, 1}, {37, 577}, {200, 1000}, {577, 4093}};
    for (int si = 0; si < 5; si++)
        for (int md = 1; md <= 2; md++)
            for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
                for (int map = 0; map <= 1; map++) {
                    if (strstr(specs[si], "decode") && (map || (only & MD_PREFILLS))) continue;
                    if (!map && (only & MD_MAPS)) continue;
                    const int r = md == 2 ? (sh % 2 ? 64 : 16) : 0,
                              c = md == 2 ? (sh % 2 ? 64 : 48) : 0;
                    run_one(ctx, specs[si], (kiln_mask_data)md, shapes[sh][0], shapes[sh][1], map,
                            r, c, 7000 + sh * 13 + si, &cases, &bad);
                }
    printf("    mask data%s%s: %d cases, %d bad\n", tune ? ", KILN_TUNE " : "", tune ? tune : "",
           cases, bad);
    kiln_ctx_destroy(ctx);
    if (tune) unsetenv("KILN_TUNE");
}

KT_GPU_TEST(gpu_maskdata) { maskdata_all(NULL, 0); }
KT_GPU_TEST(gpu_mma_sync_maskdata) { maskdata_all("wgmma=0", 0); }
KT_GPU_TEST(gpu_wgmma_pack_maskdata) { maskdata_all("pack=1", MD_PREFILLS); }
/* opt-in, not yet run on a GPU when written (session 54) */
KT_GPU_TEST(gpu_wgmma_persist_maskdata) { maskdata_all("persist=2", MD_PREFILLS | MD_MAPS); }

/* Mask data is part of the key: a plain, a bitmask and a BSR variant never share a cache row. */
KT_TEST(maskdata_key_distinct)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/c", kt_tmpdir());
    kiln_ctx *ctx = KT_CTX(dir, 0);
    KT_REQUIRE(ctx);
    char keys[3][33];
    for (int md = 0; md < 3; md++) {
        kiln_variant v;
        KT_OK(kiln_variant_parse("op=decode dtype=f16 head_dim=64", &v), kiln_errmsg());
        v.mask_data = (kiln_mask_data)md;
        kiln_kernel *k = NULL;
        KT_OK(kiln_kernel_compile(ctx, &v, "sm_90a", &k), kiln_ctx_errmsg(ctx));
        kiln_kernel_info info;
        if (!k || kiln_kernel_describe(k, &info)) return;
        memcpy(keys[md], info.key, 33);
        KT_EQ_INT(info.from_cache, 0);
    }
    KT_CHECK(strcmp(keys[0], keys[1]) && strcmp(keys[0], keys[2]) && strcmp(keys[1], keys[2]));
    kiln_ctx_destroy(ctx);
}
