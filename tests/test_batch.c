/*
 * test_batch.c — the batch kernels (kv=ragged|paged, kiln_batch_plan / kiln_batch_run), the
 * state merges and cascades against the float64 references of tools/check_batch.c, plus CPU
 * tests of the checker's own pieces (fp8 codecs, RoPE, index arrays, the reference on tiny
 * batches).
 *
 * GPU grids follow FlashInfer's test grids — batch {1,12,17,128} × kv_len {1,54,97,512,2048,
 * 16384} × qo_len {1,17,37,127,577} × page size {1,5,8,16} × head dim {64,128,256} × group
 * {1,4,8} × layout {nhd,hnd} × mask {none,causal} × window × logits {none,softcap,alibi} ×
 * kv dtype {f16,bf16,e4m3,e5m2} × rope × lse × strides × mask data {none, bitmask, bsr} — as a
 * covering walk rather than the
 * product: case i takes value (i + i / n_f) mod n_f of each factor f (n_f its size, the
 * factors' sizes mostly co-prime), so every value of every factor appears and pairs rotate.
 * Per-request lengths scatter around the case's kv_len and qo_len, with an empty request
 * (L_KV = 0), a request with no rows (prefill), odd last pages and shuffled pages in a pool
 * bigger than needed. KILN_TEST_QUICK=1 runs 24 cases per op; otherwise 160.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_batch.h"
#include "jit.h"
#include "kt.h"

/* ---- CPU: the checker's pieces -------------------------------------------------------------- */

KT_TEST(batch_fp8_codec)
{
    /* e4m3: bias 7, 3 mantissa bits, max 448, no inf */
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E4M3, 1.0), 0x38);
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E4M3, -2.0), 0xc0);
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E4M3, 448.0), 0x7e);
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E4M3, 1e6), 0x7e); /* saturates */
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E4M3, -1e6), 0xfe);
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E4M3, ldexp(1, -9)), 0x01);  /* smallest subnormal */
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E4M3, ldexp(1, -11)), 0x00); /* ties to even: 0 */
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E4M3, 1.0625), 0x38);        /* tie: to even (1.0) */
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E4M3, 1.1875), 0x3a); /* tie: to even (1.25) */
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E4M3, 1.07), 0x39);   /* nearest: 1.125 */
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E4M3, 0.0), 0x00);
    KT_CHECK(kiln_check_fp8_decode(KILN_DTYPE_E4M3, 0x7e) == 448.0);
    KT_CHECK(kiln_check_fp8_decode(KILN_DTYPE_E4M3, 0x01) == ldexp(1, -9));
    KT_CHECK(kiln_check_fp8_decode(KILN_DTYPE_E4M3, 0x08) == ldexp(1, -6)); /* smallest normal */
    KT_CHECK(isnan(kiln_check_fp8_decode(KILN_DTYPE_E4M3, 0x7f)));
    KT_CHECK(isnan(kiln_check_fp8_decode(KILN_DTYPE_E4M3, 0xff)));
    /* e5m2: bias 15, 2 mantissa bits, max 57344, inf */
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E5M2, 1.0), 0x3c);
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E5M2, 57344.0), 0x7b);
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E5M2, 1e9), 0x7b);
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E5M2, ldexp(1, -16)), 0x01);
    KT_EQ_INT(kiln_check_fp8_encode(KILN_DTYPE_E5M2, -1.5), 0xbe);
    KT_CHECK(isinf(kiln_check_fp8_decode(KILN_DTYPE_E5M2, 0x7c)));
    KT_CHECK(isnan(kiln_check_fp8_decode(KILN_DTYPE_E5M2, 0x7d)));
    /* every finite byte round-trips */
    for (int t = 0; t < 2; t++) {
        const kiln_dtype dt = t ? KILN_DTYPE_E5M2 : KILN_DTYPE_E4M3;
        for (int b = 0; b < 256; b++) {
            const double x = kiln_check_fp8_decode(dt, (uint8_t)b);
            if (!isfinite(x)) continue;
            if (kiln_check_fp8_encode(dt, x) != b)
                kt_fail(__FILE__, __LINE__, "%s byte 0x%02x = %g encodes to 0x%02x",
                        t ? "e5m2" : "e4m3", b, x, kiln_check_fp8_encode(dt, x));
        }
    }
    /* stored codes decode by dtype */
    KT_CHECK(kiln_check_decode(KILN_DTYPE_E4M3, 0x38) == 1.0);
    KT_CHECK(kiln_check_decode(KILN_DTYPE_F16, 0x3c00) == 1.0);
    KT_CHECK(kiln_check_decode(KILN_DTYPE_BF16, 0x3f80) == 1.0);
}

KT_TEST(batch_rope_reference)
{
    /* D = 4: pairs (0, 2) at angle pos and (1, 3) at angle pos * 1e4^(-1/2) */
    double x[4] = {1, 2, 3, 4};
    kiln_check_rope(x, 4, 1.0, 0, 0);
    const double want[4] = {-1.9841106485555497, 1.959900667496664, 2.462377902412316,
                            4.019799668334995};
    for (int d = 0; d < 4; d++)
        if (fabs(x[d] - want[d]) > 1e-12)
            kt_fail(__FILE__, __LINE__, "x[%d] = %.17g, want %.17g", d, x[d], want[d]);
    /* position 0 is the identity; scale divides the position; theta sets the base */
    double y[4] = {1, 2, 3, 4}, z[4] = {1, 2, 3, 4}, w[4] = {1, 2, 3, 4};
    kiln_check_rope(y, 4, 0.0, 0, 0);
    KT_CHECK(y[0] == 1 && y[1] == 2 && y[2] == 3 && y[3] == 4);
    kiln_check_rope(z, 4, 2.0, 2.0, 1e4);
    for (int d = 0; d < 4; d++) KT_CHECK(fabs(z[d] - want[d]) < 1e-12);
    kiln_check_rope(w, 4, 1.0, 1.0, 100.0); /* pair (1, 3) at angle 0.1 */
    KT_CHECK(fabs(w[1] - (2 * cos(0.1) - 4 * sin(0.1))) < 1e-12);
    KT_CHECK(fabs(w[3] - (4 * cos(0.1) + 2 * sin(0.1))) < 1e-12);
}

KT_TEST(batch_index_arrays)
{
    const int kv[4] = {0, 5, 16, 17}, qo[4] = {3, 0, 2, 7};
    kiln_check_index x;
    char msg[256] = "";
    KT_OK(kiln_check_index_build(4, qo, kv, 8, 1, 3, 42, &x), "build");
    KT_EQ_INT(x.total_qo, 12);
    KT_EQ_INT(x.total_kv, 38);
    KT_EQ_INT(x.pages_used, 6);
    KT_EQ_INT(x.pool_pages, 9);
    const int page_indptr[5] = {0, 0, 1, 3, 6}, last[4] = {0, 5, 8, 1},
              qo_indptr[5] = {0, 3, 3, 5, 12};
    for (int b = 0; b < 5; b++) {
        KT_EQ_INT(x.page_indptr[b], page_indptr[b]);
        KT_EQ_INT(x.qo_indptr[b], qo_indptr[b]);
    }
    for (int b = 0; b < 4; b++) KT_EQ_INT(x.last_page_len[b], last[b]);
    KT_EQ_INT(kiln_check_index_verify(&x, msg, sizeof msg), 0);
    x.page_ids[2] = x.page_ids[1]; /* a repeated page is caught */
    KT_EQ_INT(kiln_check_index_verify(&x, msg, sizeof msg), -1);
    KT_CONTAINS(msg, "repeated");
    kiln_check_index_free(&x);
    /* decode (no qo_lens), ragged only, and a negative length */
    KT_OK(kiln_check_index_build(4, NULL, kv, 0, 0, 0, 1, &x), "build");
    KT_EQ_INT(x.total_qo, 4);
    KT_EQ_INT(x.pages_used, 0);
    KT_EQ_INT(kiln_check_index_verify(&x, msg, sizeof msg), 0);
    kiln_check_index_free(&x);
    const int bad[2] = {3, -1};
    KT_STATUS(kiln_check_index_build(2, NULL, bad, 4, 0, 0, 1, &x), KILN_STATUS_INVALID_ARGUMENT,
              "negative");
    KT_STATUS(kiln_check_index_build(0, NULL, bad, 4, 1, 0, 1, &x), KILN_STATUS_OK, "empty batch");
    KT_EQ_INT(x.pool_pages, 1);
    kiln_check_index_free(&x);
    /* random shapes: always consistent; shuffled pages cover the pool order */
    uint64_t seed = 7;
    for (int t = 0; t < 200; t++) {
        int lens[40], rows[40];
        const int B = (int)(kiln_check_rng(&seed) % 40), P = 1 + (int)(kiln_check_rng(&seed) % 17);
        kiln_check_lens_uniform(lens, B, 0, 300, kiln_check_rng(&seed));
        kiln_check_lens_uniform(rows, B, 0, 20, kiln_check_rng(&seed));
        KT_OK(kiln_check_index_build(B, rows, lens, P, t % 2, t % 5, (uint64_t)t, &x), "build");
        if (kiln_check_index_verify(&x, msg, sizeof msg))
            kt_fail(__FILE__, __LINE__, "B=%d P=%d: %s", B, P, msg);
        kiln_check_index_free(&x);
    }
    int a[64], b[64];
    kiln_check_lens_uniform(a, 64, 5, 9, 3);
    kiln_check_lens_uniform(b, 64, 5, 9, 3);
    KT_CHECK(memcmp(a, b, sizeof a) == 0);
    for (int i = 0; i < 64; i++) KT_CHECK(a[i] >= 5 && a[i] <= 9);
}

/* The reference on tiny batches whose answer is known: one key gives o = v (scaled for fp8)
 * and lse = the logit; no key gives o = 0 and lse = -inf (also causal rows before the first
 * key); storing the batch paged places every key where the indices say. */
KT_TEST(batch_reference_tiny)
{
    kiln_variant v;
    kiln_variant_default(&v);
    v.op = KILN_OP_DECODE;
    v.kv = KILN_KV_PAGED;
    v.head_dim = 64;
    v.q_dtype = v.out_dtype = KILN_DTYPE_BF16;
    v.kv_dtype = KILN_DTYPE_E4M3;
    v.lse = 1;
    const int kv[3] = {0, 1, 3};
    kiln_check_batch s = {0};
    s.batch = 3;
    s.kv_lens = kv;
    s.num_qo_heads = 2;
    s.page_size = 2;
    s.window_left = -1;
    cb_logical L;
    KT_OK(kiln__cb_make(&v, &s, 99, &L), "make");
    KT_EQ_INT(L.ix.total_kv, 4);
    KT_CHECK(L.k_scale == 0.75f && L.v_scale == 1.25f);
    double *o = NULL, *lse = NULL;
    KT_OK(kiln__cb_reference(&L, &o, &lse), "reference");
    KT_REQUIRE(o && lse);
    for (int h = 0; h < 2; h++) {
        KT_CHECK(isinf(lse[0 * 2 + h]) && lse[h] < 0);
        for (int d = 0; d < 64; d++) {
            KT_CHECK(o[(0 * 2 + h) * 64 + d] == 0);
            const double want =
                1.25 *
                kiln_check_fp8_decode(KILN_DTYPE_E4M3, (uint8_t)L.vv[(size_t)(h / L.G) * 64 + d]);
            if (fabs(o[(1 * 2 + h) * 64 + d] - want) > 1e-12)
                kt_fail(__FILE__, __LINE__, "h=%d d=%d: %g vs %g", h, d, o[(1 * 2 + h) * 64 + d],
                        want);
        }
        KT_CHECK(isfinite(lse[1 * 2 + h]));
    }
    cb_store S;
    KT_OK(kiln__cb_store(&L, 1, 0, 0, &S), "store");
    KT_EQ_INT(S.esize, 1);
    KT_CHECK(S.pass_strides);
    /* request 2, key 2 sits on its second page, slot 0 */
    const int page = L.ix.page_ids[L.ix.page_indptr[2] + 1];
    const uint8_t *k = (const uint8_t *)S.k + page * S.ks_page;
    for (int d = 0; d < 64; d++) KT_EQ_INT(k[d], L.k[(size_t)3 * L.H_KV * 64 + d]);
    kiln__cb_store_free(&S);
    free(o);
    free(lse);
    kiln__cb_free(&L);

    /* causal prefill with more rows than keys: the first rows see nothing */
    v.op = KILN_OP_PREFILL;
    v.kv = KILN_KV_RAGGED;
    v.kv_dtype = KILN_DTYPE_BF16;
    v.mask = KILN_MASK_CAUSAL;
    const int qo2[2] = {4, 2}, kv2[2] = {2, 0};
    s.batch = 2;
    s.qo_lens = qo2;
    s.kv_lens = kv2;
    KT_OK(kiln__cb_make(&v, &s, 5, &L), "make");
    KT_OK(kiln__cb_reference(&L, &o, &lse), "reference");
    KT_CHECK(isinf(lse[0]) && isinf(lse[2]) && isfinite(lse[4]) &&
             isfinite(lse[6]));                /* rows 0,1 empty; 2,3 not */
    KT_CHECK(isinf(lse[8]) && isinf(lse[10])); /* request 1: no keys */
    free(o);
    free(lse);
    kiln__cb_free(&L);
}

/* The reference written out the plain way, one (row, head) at a time, each key dequantised and
 * rotated where it is used: what kiln__cb_reference computes with its per-task K / V decode. */
static void naive_reference(const cb_logical *L, double *o, double *lse)
{
    const int D = L->D, H = L->H;
    const double ks = L->k_scale > 0 ? L->k_scale : 1, vs = L->v_scale > 0 ? L->v_scale : 1;
    double qd[256], kd[256], acc[256];
    for (int b = 0; b < L->ix.batch; b++) {
        const int L_Q = L->ix.qo_indptr[b + 1] - L->ix.qo_indptr[b],
                  L_KV = L->ix.kv_indptr[b + 1] - L->ix.kv_indptr[b];
        double *x = malloc(sizeof(double) * ((size_t)L_KV + 1));
        for (int i = 0; i < L_Q; i++)
            for (int h = 0; h < H; h++) {
                const int r = L->ix.qo_indptr[b] + i, hk = h / L->G, diag = i + L_KV - L_Q;
                for (int d = 0; d < D; d++)
                    qd[d] = kiln_check_from_bits(L->v.q_dtype, L->q[((size_t)r * H + h) * D + d]);
                if (L->v.rope)
                    kiln_check_rope(qd, D, diag + L->rope_off[b], L->rope_scale, L->rope_theta);
                double m = -INFINITY;
                for (int j = 0; j < L_KV; j++) {
                    int vis = !(L->v.mask == KILN_MASK_CAUSAL && j > diag) &&
                              !(L->v.window && j < diag - L->window_left);
                    if (L->v.mask_data == KILN_MASK_DATA_BITMASK) {
                        const int64_t bit = L->bit0[b] + (int64_t)i * L_KV + j;
                        vis = vis && ((L->mask_bits[bit >> 3] >> (bit & 7)) & 1);
                    } else if (L->v.mask_data == KILN_MASK_DATA_BSR) {
                        const int br = L->row0[b] + i / L->bsr_r;
                        int found = 0;
                        for (int at = L->bsr_indptr[br]; at < L->bsr_indptr[br + 1]; at++)
                            found |= L->bsr_indices[at] == j / L->bsr_c;
                        vis = vis && found;
                    }
                    x[j] = -INFINITY;
                    if (!vis) continue;
                    const uint16_t *kr =
                        L->k + ((size_t)(L->ix.kv_indptr[b] + j) * L->H_KV + hk) * D;
                    for (int d = 0; d < D; d++)
                        kd[d] = ks * kiln_check_decode(L->v.kv_dtype, kr[d]);
                    if (L->v.rope)
                        kiln_check_rope(kd, D, j + L->rope_off[b], L->rope_scale, L->rope_theta);
                    double dot = 0;
                    for (int d = 0; d < D; d++) dot += qd[d] * kd[d];
                    double sc = dot * L->sm_scale;
                    if (L->v.logits == KILN_LOGITS_SOFTCAP) sc = L->softcap * tanh(sc / L->softcap);
                    if (L->v.logits == KILN_LOGITS_ALIBI)
                        sc += (double)L->slopes[h] * (double)(j - diag);
                    x[j] = sc;
                    if (sc > m) m = sc;
                }
                double l = 0;
                for (int d = 0; d < D; d++) acc[d] = 0;
                for (int j = 0; m > -INFINITY && j < L_KV; j++) {
                    if (x[j] == -INFINITY) continue;
                    const double w = exp(x[j] - m);
                    const uint16_t *vr =
                        L->vv + ((size_t)(L->ix.kv_indptr[b] + j) * L->H_KV + hk) * D;
                    l += w;
                    for (int d = 0; d < D; d++)
                        acc[d] += w * (vs * kiln_check_decode(L->v.kv_dtype, vr[d]));
                }
                for (int d = 0; d < D; d++) o[((size_t)r * H + h) * D + d] = l > 0 ? acc[d] / l : 0;
                lse[(size_t)r * H + h] = l > 0 ? m + log(l) : -INFINITY;
            }
        free(x);
    }
}

/* kiln__cb_reference (tasks of 16 rows x one KV head, keys decoded once per task, threads)
 * equals the plain per-row reference bit for bit, over every feature the GPU grids use. */
KT_TEST(batch_reference_matches_naive)
{
    static const char *const specs[] = {
        "op=decode dtype=bf16 head_dim=64 group=4 kv=paged rope=1 lse=1",
        "op=decode q_dtype=f16 kv_dtype=e4m3 out_dtype=f16 head_dim=64 group=1 kv=ragged "
        "logits=softcap window=1",
        "op=prefill dtype=f16 head_dim=64 group=2 layout=hnd kv=paged mask=causal logits=alibi "
        "mask_data=bitmask",
        "op=prefill q_dtype=bf16 kv_dtype=e5m2 out_dtype=bf16 head_dim=128 group=4 layout=hnd "
        "kv=ragged rope=1 window=1 mask_data=bsr",
        "op=prefill dtype=bf16 head_dim=64 group=1 kv=ragged mask=causal",
    };
    const int qo[6] = {37, 0, 17, 1, 40, 5}, kv[6] = {70, 12, 0, 33, 64, 9};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kiln_variant v;
        KT_OK(kiln_variant_parse(specs[i], &v), kiln_errmsg());
        kiln_check_batch s = {0};
        s.batch = 6;
        s.qo_lens = qo;
        s.kv_lens = kv;
        s.num_qo_heads = 2 * v.group;
        s.page_size = 5;
        s.window_left = -1;
        s.rope_offsets = 1;
        s.bsr_r = 3;
        s.bsr_c = 8;
        cb_logical L;
        KT_OK(kiln__cb_make(&v, &s, 1234 + i, &L), "make");
        double *o = NULL, *lse = NULL;
        KT_OK(kiln__cb_reference(&L, &o, &lse), "reference");
        const size_t rows = (size_t)L.ix.total_qo * L.H;
        double *o2 = malloc(sizeof(double) * (rows * L.D + 1)),
               *lse2 = malloc(sizeof(double) * (rows + 1));
        KT_REQUIRE(o && lse && o2 && lse2);
        naive_reference(&L, o2, lse2);
        size_t differ = 0, hidden = 0;
        for (size_t r = 0; r < rows; r++) {
            differ += !(lse[r] == lse2[r]);
            hidden += isinf(lse2[r]) != 0;
            for (int d = 0; d < L.D; d++) differ += !(o[r * L.D + d] == o2[r * L.D + d]);
        }
        if (differ)
            kt_fail(__FILE__, __LINE__, "%s: %zu values differ from the plain reference", specs[i],
                    differ);
        if (v.mask_data)
            KT_CHECK(hidden > 0 && hidden < rows); /* the drawn masks hide some rows, not all */
        /* the stored layout (strided, pages shuffled) holds every key and value where the
         * index arrays say, and garbage elsewhere */
        cb_store S;
        KT_OK(kiln__cb_store(&L, 1, 0, 0, &S), "store");
        size_t misplaced = 0;
        for (int b = 0; b < L.ix.batch; b++)
            for (int j = 0; j < L.ix.kv_indptr[b + 1] - L.ix.kv_indptr[b]; j++)
                for (int hk = 0; hk < L.H_KV; hk++) {
                    size_t at;
                    if (v.kv == KILN_KV_PAGED) {
                        const int P = L.ix.page_size,
                                  page = L.ix.page_ids[L.ix.page_indptr[b] + j / P];
                        at = (size_t)page * S.ks_page + (size_t)(j % P) * S.ks_n +
                             (size_t)hk * S.ks_h;
                    } else {
                        at = (size_t)(L.ix.kv_indptr[b] + j) * S.ks_n + (size_t)hk * S.ks_h;
                    }
                    const size_t from = ((size_t)(L.ix.kv_indptr[b] + j) * L.H_KV + hk) * L.D;
                    for (int d = 0; d < L.D; d++) {
                        const unsigned kk = S.esize == 1 ? ((const uint8_t *)S.k)[at + d]
                                                         : ((const uint16_t *)S.k)[at + d];
                        const unsigned vv = S.esize == 1 ? ((const uint8_t *)S.v)[at + d]
                                                         : ((const uint16_t *)S.v)[at + d];
                        misplaced += kk != (S.esize == 1 ? (L.k[from + d] & 0xff) : L.k[from + d]);
                        misplaced +=
                            vv != (S.esize == 1 ? (L.vv[from + d] & 0xff) : L.vv[from + d]);
                    }
                }
        if (misplaced)
            kt_fail(__FILE__, __LINE__, "%s: %zu stored K/V elements differ", specs[i], misplaced);
        kiln__cb_store_free(&S);
        free(o);
        free(lse);
        free(o2);
        free(lse2);
        kiln__cb_free(&L);
    }
}

/* ---- GPU ------------------------------------------------------------------------------------ */

static int quick(void)
{
    const char *q = getenv("KILN_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static kiln_ctx *gpu_ctx(void)
{
    kiln_ctx_opts o = {0};
    char dir[600];
    snprintf(dir, sizeof dir, "%s/cache", kt_tmpdir());
    const char *shared = getenv("KILN_TEST_CACHE");
    o.cache_dir = shared && *shared ? shared : dir;
    kiln_ctx *ctx = NULL;
    if (kiln_ctx_create(&o, &ctx) != KILN_STATUS_OK) {
        kt_fail(__FILE__, __LINE__, "kiln_ctx_create: %s", kiln_errmsg());
        return NULL;
    }
    return ctx;
}

static kiln_kernel *get(kiln_ctx *ctx, const kiln_variant *v)
{
    kiln_kernel *k = NULL;
    char spec[512];
    kiln_variant_format(v, spec, sizeof spec);
    if (kiln_kernel_get(ctx, v, &k) != KILN_STATUS_OK) {
        kt_fail(__FILE__, __LINE__, "%s: %s", spec, kiln_ctx_errmsg(ctx));
        return NULL;
    }
    return k;
}

static const int g_batch[] = {1, 12, 17, 128}, g_kv[] = {1, 54, 97, 512, 2048, 16384};
static const int g_qo[] = {1, 17, 37, 127, 577}, g_page[] = {1, 5, 8, 16}, g_dim[] = {64, 128, 256};
static const int g_group[] = {1, 4, 8};
static const kiln_dtype g_kvdt[] = {KILN_DTYPE_F16, KILN_DTYPE_BF16, KILN_DTYPE_E4M3,
                                    KILN_DTYPE_E5M2};

#define N_OF(a)    ((int)(sizeof(a) / sizeof((a)[0])))
#define PICK(a, i) ((a)[((i) + (i) / N_OF(a)) % N_OF(a)])

/* CPU reference work budget per case (multiply-adds); shapes above it shrink. */
#define REF_BUDGET_QUICK 4e8
#define REF_BUDGET_FULL  3e9

/* One case of the covering walk: variant and shape. */
typedef struct bcase {
    kiln_variant v;
    kiln_check_batch s;
    int qo[128], kv[128];
} bcase;

static void make_case(kiln_op op, int i, bcase *c)
{
    kiln_variant *v = &c->v;
    kiln_variant_default(v);
    v->op = op;
    v->kv = i % 2 ? KILN_KV_PAGED : KILN_KV_RAGGED;
    v->head_dim = PICK(g_dim, i);
    v->group = PICK(g_group, i / 2);
    v->layout = (i / 3) % 2 ? KILN_LAYOUT_HND : KILN_LAYOUT_NHD;
    v->mask = (op == KILN_OP_PREFILL && (i / 2) % 2) ? KILN_MASK_CAUSAL : KILN_MASK_NONE;
    v->window = i % 7 == 3;
    v->logits = (kiln_logits)((i / 5) % 3);
    v->lse = i % 3 == 1;
    v->rope = i % 5 == 2;
    /* mask data per request: none, none, bitmask, bsr */
    v->mask_data = (i + i / 7) % 4 == 2   ? KILN_MASK_DATA_BITMASK
                   : (i + i / 7) % 4 == 3 ? KILN_MASK_DATA_BSR
                                          : KILN_MASK_DATA_NONE;
    const kiln_dtype kd = PICK(g_kvdt, i / 4);
    v->q_dtype = v->out_dtype = kd == KILN_DTYPE_BF16 || (kd == KILN_DTYPE_E5M2 && i % 2)
                                    ? KILN_DTYPE_BF16
                                    : KILN_DTYPE_F16;
    v->kv_dtype = kd == KILN_DTYPE_F16 || kd == KILN_DTYPE_BF16 ? v->q_dtype : kd;
    kiln_check_batch *s = &c->s;
    memset(s, 0, sizeof *s);
    int B = PICK(g_batch, i / 3), kv = PICK(g_kv, i),
        qo = op == KILN_OP_PREFILL ? PICK(g_qo, i / 6) : 1;
    const int H = 2 * v->group;
    if (v->rope && kv > 2048) kv = 2048; /* fp32 angles of large positions drift */
    const double budget = quick() ? REF_BUDGET_QUICK : REF_BUDGET_FULL;
    while ((double)B * qo * kv * H * v->head_dim * 2 > budget && B > 1)
        B = B > 12 ? 12 : B > 2 ? B / 2 : 1;
    while ((double)B * qo * kv * H * v->head_dim * 2 > budget && kv > 97) kv /= 2;
    uint64_t seed = 0x5eed0000u + (uint64_t)i * 7919u + (uint64_t)op;
    for (int b = 0; b < B; b++) {
        c->kv[b] = kv / 2 + (int)(kiln_check_rng(&seed) % (uint64_t)(kv - kv / 2 + 1));
        c->qo[b] =
            qo > 1 ? qo / 2 + (int)(kiln_check_rng(&seed) % (uint64_t)(qo - qo / 2 + 1)) : qo;
        if (v->mask == KILN_MASK_CAUSAL && c->qo[b] > c->kv[b]) c->qo[b] = c->kv[b];
    }
    if (B > 1) c->kv[B / 2] = 0; /* an empty request: o = 0, lse = -inf */
    if (B > 1 && v->mask == KILN_MASK_CAUSAL && c->qo[B / 2] == 0) c->qo[B / 2] = 3;
    if (B > 2 && op == KILN_OP_PREFILL) c->qo[B - 1] = 0; /* a request with no rows */
    s->batch = B;
    s->qo_lens = c->qo;
    s->kv_lens = c->kv;
    s->num_qo_heads = H;
    s->page_size = PICK(g_page, i / 5);
    s->window_left = -1;
    s->strided = i % 4 == 3;
    s->rope_offsets = v->rope && i % 2;
    s->bsr_r = i % 3 ? 7 : 16;
    s->bsr_c = i % 4 ? 40 : 64;
    s->seed = seed;
}

static void run_grid(kiln_op op)
{
    kiln_ctx *ctx = gpu_ctx();
    if (!ctx) return;
    const int n = quick() ? 24 : 160;
    int bad = 0;
    double worst = 0;
    static bcase c;
    for (int i = 0; i < n; i++) {
        make_case(op, i, &c);
        kiln_kernel *k = get(ctx, &c.v);
        if (!k) {
            bad++;
            continue;
        }
        kiln_check_batch_result r;
        char msg[1024], spec[512];
        kiln_status st = kiln_check_batch_run(ctx, k, &c.s, 0, &r, msg, sizeof msg);
        if (r.r.rel_l2 > worst) worst = r.r.rel_l2;
        if (getenv("KILN_TEST_VERBOSE")) { /* progress of a long grid, one line per case */
            kiln_variant_format(&c.v, spec, sizeof spec);
            printf("    case %d %s B=%d: %s rel_l2 %.3g\n", i, spec, c.s.batch, st ? "BAD" : "ok",
                   r.r.rel_l2);
            fflush(stdout);
        }
        if (st) {
            bad++;
            kiln_variant_format(&c.v, spec, sizeof spec);
            kt_fail(__FILE__, __LINE__, "case %d: %s B=%d P=%d%s: %s (max_err %.3g, request %d)", i,
                    spec, c.s.batch, c.s.page_size, c.s.strided ? " strided" : "", msg, r.r.max_err,
                    r.bad_request);
        }
    }
    printf("    %s batches: %d cases, %d bad, worst rel_l2 %.3g\n",
           op == KILN_OP_DECODE ? "decode" : "prefill", n, bad, worst);
    kiln_ctx_destroy(ctx);
}

/* CPU: every case of both full grids is a valid batch variant whose config picks (the GPU run
 * must not fail on a spec); with KILN_TEST_GRID_SPECS=FILE the specs are appended to FILE, a
 * manifest for `kiln warm` (to compile the grid's kernels ahead, on a machine without a GPU). */
KT_TEST(batch_grid_cases_valid)
{
    const char *path = getenv("KILN_TEST_GRID_SPECS");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    static bcase c;
    int n = 0, packed = 0;
    for (int op = 0; op < 2; op++)
        for (int i = 0; i < 160; i++) {
            make_case(op ? KILN_OP_PREFILL : KILN_OP_DECODE, i, &c);
            char spec[512];
            kiln_variant_format(&c.v, spec, sizeof spec);
            kiln_variant back;
            kiln__config cfg;
            kiln__err e;
            if (kiln_variant_parse(spec, &back) != KILN_STATUS_OK ||
                kiln__config_pick(&back, 90, &cfg, &e)) {
                kt_fail(__FILE__, __LINE__, "case %d: %s: %s", i, spec, kiln_errmsg());
                continue;
            }
            KT_CHECK(c.s.batch >= 1 && c.s.batch <= 128 && c.s.num_qo_heads % c.v.group == 0);
            packed += cfg.pack;
            n++;
            if (f) fprintf(f, "%s\n", spec);
        }
    if (f) fclose(f);
    KT_EQ_INT(n, 320);
    KT_CHECK(packed > 0 && packed < 160); /* both decode kernels appear */
}

KT_GPU_TEST(gpu_batch_decode_grid) { run_grid(KILN_OP_DECODE); }
KT_GPU_TEST(gpu_batch_prefill_grid) { run_grid(KILN_OP_PREFILL); }

/* Mask data per request: bitmask and bsr, decode on CUDA cores (G 1) and tensor cores (G 4)
 * and prefill, ragged and paged, with a causal mask on prefill and a graph replay on one. */
KT_GPU_TEST(gpu_batch_mask_data)
{
    kiln_ctx *ctx = gpu_ctx();
    if (!ctx) return;
    static const char *const specs[] = {
        "op=decode dtype=f16 head_dim=128 group=1 kv=paged mask_data=bitmask lse=1",
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged mask_data=bsr",
        "op=decode dtype=bf16 head_dim=64 group=4 kv=ragged mask_data=bitmask",
        "op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask=causal mask_data=bitmask lse=1",
        "op=prefill dtype=f16 head_dim=64 group=1 kv=ragged mask_data=bsr",
        "op=prefill dtype=bf16 head_dim=128 group=8 kv=ragged mask=causal mask_data=bsr",
    };
    int qo[17], kv[17];
    uint64_t seed = 0x6d61736bu;
    for (int b = 0; b < 17; b++) {
        kv[b] = b == 5 ? 0 : 1 + (int)(kiln_check_rng(&seed) % 700);
        qo[b] = b == 9 ? 0 : 1 + (int)(kiln_check_rng(&seed) % 90);
        if (qo[b] > kv[b]) qo[b] = kv[b];
    }
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kiln_variant v;
        if (kiln_variant_parse(specs[i], &v) != KILN_STATUS_OK) {
            kt_fail(__FILE__, __LINE__, "%s: %s", specs[i], kiln_errmsg());
            continue;
        }
        kiln_kernel *k = get(ctx, &v);
        if (!k) continue;
        kiln_check_batch s;
        memset(&s, 0, sizeof s);
        s.batch = 17;
        s.qo_lens = qo;
        s.kv_lens = kv;
        s.num_qo_heads = 2 * v.group;
        s.page_size = 5;
        s.window_left = -1;
        s.bsr_r = i % 2 ? 3 : 16;
        s.bsr_c = i % 2 ? 24 : 64;
        s.graph = i == 3;
        s.seed = 0x6d61736bu + i;
        kiln_check_batch_result r;
        char msg[1024];
        if (kiln_check_batch_run(ctx, k, &s, 0, &r, msg, sizeof msg) != KILN_STATUS_OK)
            kt_fail(__FILE__, __LINE__, "%s: %s (request %d)", specs[i], msg, r.bad_request);
    }
    kiln_ctx_destroy(ctx);
}

/* A base variant for the focused tests. */
static void base_variant(kiln_variant *v, kiln_op op, kiln_kv_storage kv)
{
    kiln_variant_default(v);
    v->op = op;
    v->kv = kv;
    v->head_dim = 128;
    v->group = 4;
    v->q_dtype = v->kv_dtype = v->out_dtype = KILN_DTYPE_BF16;
    v->lse = 1;
}

/* Paged and ragged storage of one logical batch agree (bitwise under the same split). */
KT_GPU_TEST(gpu_batch_paged_equals_ragged)
{
    kiln_ctx *ctx = gpu_ctx();
    KT_REQUIRE(ctx);
    static const int kv[6] = {1, 54, 0, 513, 2048, 97}, qo[6] = {1, 17, 5, 37, 127, 0};
    for (int t = 0; t < 4; t++) {
        kiln_variant vp, vr;
        base_variant(&vp, t < 2 ? KILN_OP_DECODE : KILN_OP_PREFILL, KILN_KV_PAGED);
        vp.layout = t % 2 ? KILN_LAYOUT_HND : KILN_LAYOUT_NHD;
        vp.mask = t == 3 ? KILN_MASK_CAUSAL : KILN_MASK_NONE;
        vr = vp;
        vr.kv = KILN_KV_RAGGED;
        kiln_kernel *kp = get(ctx, &vp), *kr = get(ctx, &vr);
        if (!kp || !kr) continue;
        for (int fixed = 0; fixed < 2; fixed++) {
            int q6[6];
            memcpy(q6, qo, sizeof q6);
            if (vp.mask == KILN_MASK_CAUSAL)
                for (int b = 0; b < 6; b++) q6[b] = q6[b] > kv[b] ? kv[b] : q6[b];
            kiln_check_batch s = {.batch = 6,
                                  .qo_lens = q6,
                                  .kv_lens = kv,
                                  .num_qo_heads = 8,
                                  .page_size = 5,
                                  .window_left = -1,
                                  .fixed_split = fixed ? 256 : 0,
                                  .seed = 11u + (uint64_t)t};
            kiln_check_pair p;
            char msg[1024];
            kiln_status st = kiln_check_batch_equiv(ctx, kp, kr, &s, &p, msg, sizeof msg);
            if (st) kt_fail(__FILE__, __LINE__, "case %d fixed=%d: %s", t, fixed, msg);
            printf("    case %d fixed_split=%d: %s split, %s (max diff %.3g)\n", t, fixed ? 256 : 0,
                   p.same_split ? "same" : "different",
                   p.bitwise ? "bitwise equal" : "within tolerance", p.max_diff);
        }
    }
    kiln_ctx_destroy(ctx);
}

/* Ragged ≡ contiguous: each request of a ragged batch run alone through the single-request
 * kernel on the same data gives its batch rows (within tolerance: the batch decode of G 4 runs
 * on tensor cores, the single one on CUDA cores). */
KT_GPU_TEST(gpu_batch_equals_single)
{
    kiln_ctx *ctx = gpu_ctx();
    KT_REQUIRE(ctx);
    static const char *const specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=4 lse=1",
        "op=decode dtype=f16 head_dim=64 group=1 logits=softcap window=1",
        "op=prefill dtype=bf16 head_dim=128 group=4 mask=causal lse=1",
        "op=prefill dtype=f16 head_dim=256 group=2 logits=alibi window=1",
    };
    static const int kv[7] = {1, 54, 0, 513, 2048, 97, 700}, qo[7] = {1, 17, 5, 37, 127, 0, 64};
    for (int t = 0; t < 4; t++) {
        kiln_variant vs, vb;
        if (kiln_variant_parse(specs[t], &vs) != KILN_STATUS_OK) {
            kt_fail(__FILE__, __LINE__, "%s: %s", specs[t], kiln_errmsg());
            continue;
        }
        vb = vs;
        vb.kv = KILN_KV_RAGGED;
        kiln_kernel *ks = get(ctx, &vs), *kb = get(ctx, &vb);
        if (!ks || !kb) continue;
        int q7[7];
        memcpy(q7, qo, sizeof q7);
        for (int b = 0; b < 7; b++)
            if (vs.mask == KILN_MASK_CAUSAL && q7[b] > kv[b]) q7[b] = kv[b];
        kiln_check_batch s = {.batch = 7,
                              .qo_lens = q7,
                              .kv_lens = kv,
                              .num_qo_heads = 8,
                              .window_left = -1,
                              .seed = 21u + (uint64_t)t};
        kiln_check_pair p;
        char msg[1024];
        if (kiln_check_batch_vs_single(ctx, kb, ks, &s, &p, msg, sizeof msg) != KILN_STATUS_OK)
            kt_fail(__FILE__, __LINE__, "%s: %s", specs[t], msg);
        else
            printf("    %s: %lld elements, %s (max diff %.3g)\n", specs[t], p.compared,
                   p.bitwise ? "bitwise equal" : "within tolerance", p.max_diff);
    }
    kiln_ctx_destroy(ctx);
}

/* Graph mode: one captured run replayed after re-planning other lengths into the workspace. */
KT_GPU_TEST(gpu_batch_graph_replay)
{
    kiln_ctx *ctx = gpu_ctx();
    KT_REQUIRE(ctx);
    static const int kv[12] = {1, 54, 97, 512, 2048, 0, 5, 16, 17, 300, 1000, 64};
    static const int qo[12] = {1, 17, 37, 127, 64, 3, 5, 16, 0, 9, 40, 1};
    for (int t = 0; t < 4; t++) {
        kiln_variant v;
        base_variant(&v, t % 2 ? KILN_OP_PREFILL : KILN_OP_DECODE,
                     t < 2 ? KILN_KV_PAGED : KILN_KV_RAGGED);
        v.layout = t == 3 ? KILN_LAYOUT_HND : KILN_LAYOUT_NHD;
        kiln_kernel *k = get(ctx, &v);
        if (!k) continue;
        kiln_check_batch s = {.batch = 12,
                              .qo_lens = qo,
                              .kv_lens = kv,
                              .num_qo_heads = 8,
                              .page_size = 16,
                              .window_left = -1,
                              .graph = 1,
                              .max_batch = 16,
                              .seed = 21u + (uint64_t)t};
        kiln_check_batch_result r;
        char msg[1024];
        kiln_status st = kiln_check_batch_run(ctx, k, &s, 0, &r, msg, sizeof msg);
        if (st) kt_fail(__FILE__, __LINE__, "case %d: %s", t, msg);
        KT_EQ_INT(r.batches, 2);
        KT_CHECK(r.plan.grid >= r.plan.items);
    }
    kiln_ctx_destroy(ctx);
}

/* fixed_split: a request's bits do not depend on the rest of the batch. */
KT_GPU_TEST(gpu_batch_invariance)
{
    kiln_ctx *ctx = gpu_ctx();
    KT_REQUIRE(ctx);
    int kv[17], qo[17];
    kiln_check_lens_uniform(kv, 17, 0, 3000, 5);
    kiln_check_lens_uniform(qo, 17, 1, 64, 6);
    kv[4] = 4097;
    for (int t = 0; t < 4; t++) {
        kiln_variant v;
        base_variant(&v, t % 2 ? KILN_OP_PREFILL : KILN_OP_DECODE,
                     t < 2 ? KILN_KV_PAGED : KILN_KV_RAGGED);
        v.logits = t == 2 ? KILN_LOGITS_SOFTCAP : KILN_LOGITS_NONE;
        kiln_kernel *k = get(ctx, &v);
        if (!k) continue;
        kiln_check_batch s = {.batch = 17,
                              .qo_lens = qo,
                              .kv_lens = kv,
                              .num_qo_heads = 8,
                              .page_size = 8,
                              .window_left = -1,
                              .fixed_split = 512,
                              .seed = 31u + (uint64_t)t};
        const int reqs[3] = {0, 4, 16};
        for (int j = 0; j < 3; j++) {
            kiln_check_pair p;
            char msg[1024];
            if (kiln_check_batch_invariance(ctx, k, &s, reqs[j], &p, msg, sizeof msg))
                kt_fail(__FILE__, __LINE__, "case %d: %s", t, msg);
        }
    }
    kiln_ctx_destroy(ctx);
}

/* Unused pool slots and padding full of NaN must not leak into any output. */
KT_GPU_TEST(gpu_batch_nan_pool)
{
    kiln_ctx *ctx = gpu_ctx();
    KT_REQUIRE(ctx);
    static const int kv[5] = {3, 0, 17, 130, 1}, qo[5] = {2, 4, 17, 33, 1};
    for (int t = 0; t < 2; t++) {
        kiln_variant v;
        base_variant(&v, t ? KILN_OP_PREFILL : KILN_OP_DECODE, KILN_KV_PAGED);
        kiln_kernel *k = get(ctx, &v);
        if (!k) continue;
        kiln_check_batch s = {.batch = 5,
                              .qo_lens = qo,
                              .kv_lens = kv,
                              .num_qo_heads = 8,
                              .page_size = 16,
                              .window_left = -1,
                              .strided = 1,
                              .nan_pool = 1,
                              .seed = 41};
        kiln_check_batch_result r;
        char msg[1024];
        if (kiln_check_batch_run(ctx, k, &s, 0, &r, msg, sizeof msg))
            kt_fail(__FILE__, __LINE__, "case %d: %s", t, msg);
    }
    kiln_ctx_destroy(ctx);
}

KT_GPU_TEST(gpu_batch_merge)
{
    kiln_ctx *ctx = gpu_ctx();
    KT_REQUIRE(ctx);
    for (int t = 0; t < 4; t++) {
        kiln_variant v;
        kiln_variant_default(&v);
        v.op = KILN_OP_MERGE;
        v.q_dtype = v.kv_dtype = v.out_dtype = t % 2 ? KILN_DTYPE_BF16 : KILN_DTYPE_F16;
        v.head_dim = t < 2 ? 128 : t == 2 ? 64 : 256;
        kiln_kernel *k = get(ctx, &v);
        if (!k) continue;
        for (int op = 0; op < 3; op++) {
            kiln_check_merge_shape ms = {.rows = 1 + 37 * t,
                                         .num_heads = 8,
                                         .num_states = 2 + t,
                                         .strided = t % 2,
                                         .seed = 51u + (uint64_t)t};
            kiln_check_result r;
            char msg[1024];
            if (kiln_check_merge(ctx, k, (kiln_check_merge_op)op, &ms, &r, msg, sizeof msg))
                kt_fail(__FILE__, __LINE__, "dim %d op %d: %s", v.head_dim, op, msg);
        }
        kiln_check_merge_shape none = {.rows = 0, .num_heads = 8, .seed = 1};
        kiln_check_result r;
        char msg[1024];
        if (kiln_check_merge(ctx, k, KILN_CHECK_MERGE_STATE, &none, &r, msg, sizeof msg))
            kt_fail(__FILE__, __LINE__, "zero rows: %s", msg);
    }
    kiln_ctx_destroy(ctx);
}

/* Cascade: shared prefix once (prefill over the grouped queries) + private decode, merged,
 * equals the plain decode over prefix + private keys. */
KT_GPU_TEST(gpu_batch_cascade)
{
    kiln_ctx *ctx = gpu_ctx();
    KT_REQUIRE(ctx);
    int priv[17];
    kiln_check_lens_uniform(priv, 17, 1, 700, 61);
    priv[3] = 0; /* a request with no private keys: its decode state is empty */
    for (int t = 0; t < 2; t++) {
        kiln_variant vp, vd, vm;
        base_variant(&vp, KILN_OP_PREFILL, t ? KILN_KV_PAGED : KILN_KV_RAGGED);
        base_variant(&vd, KILN_OP_DECODE, KILN_KV_PAGED);
        vp.logits = vd.logits = t ? KILN_LOGITS_SOFTCAP : KILN_LOGITS_NONE;
        kiln_variant_default(&vm);
        vm.op = KILN_OP_MERGE;
        vm.q_dtype = vm.kv_dtype = vm.out_dtype = vd.out_dtype;
        vm.head_dim = vd.head_dim;
        kiln_kernel *kp = get(ctx, &vp), *kd = get(ctx, &vd), *km = get(ctx, &vm);
        if (!kp || !kd || !km) continue;
        kiln_check_batch s = {.batch = 17,
                              .kv_lens = priv,
                              .num_qo_heads = 8,
                              .page_size = 16,
                              .seed = 71u + (uint64_t)t};
        kiln_check_result r;
        char msg[1024];
        if (kiln_check_cascade(ctx, kp, kd, km, &s, 1000 + 537 * t, &r, msg, sizeof msg))
            kt_fail(__FILE__, __LINE__, "case %d: %s", t, msg);
    }
    kiln_ctx_destroy(ctx);
}
