/*
 * test_batch_check.c — the checkers' own pieces (tools/check), on the CPU: the fp8 codecs, the
 * RoPE reference, the index arrays, the float64 batch reference on tiny batches and against a
 * naive loop, and the single-request reference against a naive loop, so that the GPU tests
 * compare with the truth.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_batch.h"
#include "check_internal.h"
#include "jit.h"
#include "kt.h"
#include "params.h"

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

/* ---- the single-request reference ----------------------------------------------------------- */

/* A custom variant's meaning, for the callbacks: a stripe mask (every third key of odd heads
 * hidden) and a logit bent by the query's position. */
static int stripe_mask(const void *u, int i, int j, int h, int hk, int L_Q, int L_KV)
{
    (void)u, (void)i, (void)hk, (void)L_Q, (void)L_KV;
    return !(h % 2 && j % 3 == 1);
}

static double bent_logit(const void *u, double x, int i, int j, int h, int hk, int L_Q, int L_KV)
{
    (void)u, (void)j, (void)hk, (void)L_Q, (void)L_KV;
    return x * (1.0 + 0.01 * i) - 0.125 * h;
}

typedef struct single_case {
    const char *spec;
    int H, L_Q, L_KV, strided, custom;
    size_t differ, rows_hidden;
} single_case;

/* The definition one (row, head) at a time, each key decoded where it is used; compared bit
 * for bit with what kiln__check_reference_cpu computed (blocks of rows, K / V decoded once a
 * head, threads). */
static void single_naive(const kiln__check_ref_io *io, void *user)
{
    single_case *c = user;
    kiln_variant v;
    kiln_variant_parse(c->spec, &v);
    const int D = io->D, off = io->L_KV - io->L_Q, G = io->H / io->H_KV;
    double qd[256], acc[256], *x = malloc(sizeof(double) * ((size_t)io->L_KV + 1));
    for (int i = 0; i < io->L_Q; i++)
        for (int h = 0; h < io->H; h++) {
            const int hk = h / G;
            for (int d = 0; d < D; d++)
                qd[d] = kiln_check_from_bits(v.q_dtype, io->q[i * io->qs_n + h * io->qs_h + d]);
            double m = -INFINITY;
            for (int j = 0; j < io->L_KV; j++) {
                x[j] = -INFINITY;
                if (v.mask == KILN_MASK_CAUSAL && j > i + off) continue;
                if (v.window && j < i + off - io->window_left) continue;
                if (c->custom && !stripe_mask(NULL, i, j, h, hk, io->L_Q, io->L_KV)) continue;
                double dot = 0;
                for (int d = 0; d < D; d++)
                    dot += qd[d] * kiln_check_from_bits(v.kv_dtype,
                                                        io->k[j * io->ks_n + hk * io->ks_h + d]);
                double sc = dot * io->sm_scale;
                const double bias = (double)io->slopes[h] * (double)(j - (i + off));
                if (v.logits == KILN_LOGITS_SOFTCAP) sc = io->softcap * tanh(sc / io->softcap);
                if (v.logits == KILN_LOGITS_ALIBI) sc += bias;
                if (v.logits == KILN_LOGITS_SOFTCAP_ALIBI)
                    sc = io->softcap * tanh(sc / io->softcap + bias);
                if (c->custom) sc = bent_logit(NULL, sc, i, j, h, hk, io->L_Q, io->L_KV);
                x[j] = sc;
                if (sc > m) m = sc;
            }
            double l = 0;
            for (int d = 0; d < D; d++) acc[d] = 0;
            for (int j = 0; m > -INFINITY && j < io->L_KV; j++) {
                if (x[j] == -INFINITY) continue;
                const double w = exp(x[j] - m);
                l += w;
                for (int d = 0; d < D; d++)
                    acc[d] += w * kiln_check_from_bits(v.kv_dtype,
                                                       io->v[j * io->ks_n + hk * io->ks_h + d]);
            }
            const double *o = io->o + ((size_t)i * io->H + h) * D;
            for (int d = 0; d < D; d++) c->differ += !(o[d] == (l > 0 ? acc[d] / l : 0));
            const double lse = l > 0 ? m + log(l) : -INFINITY;
            c->differ += !(io->lse[(size_t)i * io->H + h] == lse);
            c->rows_hidden += l == 0;
        }
    free(x);
}

/* The single-request reference (check.c: rows in blocks against each key, a head's keys and
 * values decoded once) equals the definition computed one row at a time, bit for bit: masks,
 * windows, every builtin logits transform, the custom callbacks, groups 1 to 8, head dims 64 to
 * 256, both layouts, strided buffers, decode, more rows than keys, a single key, and sizes whose
 * blocks and four-key passes end part way. */
KT_TEST(single_reference_matches_naive)
{
    single_case cases[] = {
        {"op=prefill dtype=bf16 head_dim=128 group=4 mask=causal", 8, 77, 301, 0, 0, 0, 0},
        {"op=prefill dtype=f16 head_dim=64 group=1 layout=hnd logits=softcap", 3, 45, 17, 1, 0, 0,
         0},
        {"op=prefill dtype=bf16 head_dim=256 group=2 window=1 logits=alibi", 4, 33, 130, 0, 0, 0,
         0},
        {"op=prefill q_dtype=f16 kv_dtype=f16 out_dtype=bf16 head_dim=64 group=8 mask=causal "
         "window=1 logits=softcap_alibi",
         16, 9, 9, 1, 0, 0, 0},
        {"op=prefill dtype=f16 head_dim=128 group=3 mask=causal", 6, 5, 1, 0, 0, 0, 0},
        {"op=decode dtype=bf16 head_dim=128 group=4", 8, 1, 1031, 1, 0, 0, 0},
        {"op=prefill dtype=bf16 head_dim=64 group=2", 4, 50, 63, 0, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        single_case *c = &cases[i];
        kiln_variant v;
        KT_OK(kiln_variant_parse(c->spec, &v), kiln_errmsg());
        kiln_check_shape s = {0};
        s.num_qo_heads = c->H;
        s.qo_len = c->L_Q;
        s.kv_len = c->L_KV;
        s.window_left = -1;
        s.strided = c->strided;
        s.seed = 77 + i;
        if (c->custom) {
            s.ref_mask = stripe_mask;
            s.ref_logits = bent_logit;
        }
        KT_OK(kiln__check_reference_cpu(&v, &s, single_naive, c), "reference");
        if (c->differ)
            kt_fail(__FILE__, __LINE__, "%s: %zu values differ from the plain reference", c->spec,
                    c->differ);
        /* the causal 5 x 1 case leaves rows with no key: -inf and zeros, compared above */
        if (v.mask == KILN_MASK_CAUSAL && c->L_Q > c->L_KV) KT_CHECK(c->rows_hidden > 0);
    }
}

/* ---- fp8 in registers: the fragment layout (templates/common/params.h) ----------------------- */

/* Byte offset of logical byte b of row r in an f8_swz-swizzled [rows][d] fp8 tile. */
static int f8_phys(int d, int r, int b)
{
    return r * d + (((b / 16) ^ kiln_f8_swz(d, r)) << 4) + b % 16;
}

/* The most 128-byte lines one bank serves in one phase of `lanes` accesses of `bytes` each. */
static int bank_ways(const int *addr, int lanes, int bytes)
{
    int worst = 1;
    for (int p0 = 0; p0 < 32; p0 += 128 / bytes) {
        int line[32][32], nl[32] = {0};
        for (int l = p0; l < p0 + 128 / bytes && l < lanes; l++)
            for (int w = 0; w < bytes / 4; w++) {
                const int word = addr[l] / 4 + w, bank = word % 32, ln = word / 32;
                int seen = 0;
                for (int i = 0; i < nl[bank]; i++) seen |= line[bank][i] == ln;
                if (!seen) line[bank][nl[bank]++] = ln;
                if (nl[bank] > worst) worst = nl[bank];
            }
    }
    return worst;
}

/* The fp8 fragments of the packed tensor-core rows read what they claim: each lane's K bytes
 * are the d its Q registers hold (every (key, d) of an n8 block once), its V runs are the d
 * its O columns name (kiln_f8_d, a bijection whose pairs are adjacent), the swizzle permutes a
 * row's chunks, and the loads are free of bank conflicts (D 64's V reads: at most 2-way). */
KT_TEST(f8_fragment_layout)
{
    static const int dims[3] = {64, 128, 256};
    for (int di = 0; di < 3; di++) {
        const int D = dims[di], chunks = D / 16;
        for (int r = 0; r < 64; r++) { /* the swizzle permutes each row's chunks */
            int hit[16] = {0};
            for (int c = 0; c < chunks; c++) {
                const int x = c ^ kiln_f8_swz(D, r);
                KT_CHECK(x >= 0 && x < chunks);
                if (x >= 0 && x < chunks) hit[x]++;
            }
            for (int c = 0; c < chunks; c++) KT_EQ_INT(hit[c], 1);
        }
        /* Q K^T: lane (g, c), steps 4 G .. 4 G + 3 read the 16 bytes at kiln_f8_k_off */
        static int seen[8][256];
        memset(seen, 0, sizeof seen);
        for (int g4 = 0; g4 < D / 64; g4++) {
            int addr[32];
            for (int lane = 0; lane < 32; lane++) {
                addr[lane] = kiln_f8_k_off(D, lane, g4);
                for (int kq = 0; kq < 4; kq++) {
                    const int d0 = kiln_f8_qk_d(lane, 4 * g4 + kq);
                    for (int u = 0; u < 4; u++) {
                        KT_EQ_INT(addr[lane] + 4 * kq + u, f8_phys(D, lane / 4, d0 + u));
                        if (d0 + u < D) seen[lane / 4][d0 + u]++;
                    }
                }
            }
            KT_EQ_INT(bank_ways(addr, 32, 16), 1);
        }
        for (int g = 0; g < 8; g++)
            for (int d = 0; d < D; d++) KT_EQ_INT(seen[g][d], 1);
        /* P V: lane (g, c) reads, from key rows 2c + e (and + 8), the d of its O columns */
        const int run = D == 64 ? 8 : 16;
        for (int e = 0; e < 2; e++) {
            for (int r0 = 0; r0 < D / 128 + (D == 64); r0++) {
                int addr[32];
                for (int lane = 0; lane < 32; lane++) {
                    addr[lane] = kiln_f8_v_off(D, lane, e) + r0 * 128;
                    for (int j = 0; j < run; j++)
                        KT_EQ_INT(addr[lane] + j, f8_phys(D, 2 * (lane % 4) + e,
                                                          kiln_f8_d(D, r0 * 16 + j, lane / 4)));
                }
                KT_CHECK(bank_ways(addr, 32, run) <= (D == 64 ? 2 : 1));
            }
        }
        /* O's columns: every d once, pairs (dn, dn + 1) adjacent */
        int hit[256] = {0};
        for (int dn = 0; dn < D / 8; dn++)
            for (int n = 0; n < 8; n++) {
                const int d = kiln_f8_d(D, dn, n);
                KT_CHECK(d >= 0 && d < D);
                if (d >= 0 && d < D) hit[d]++;
                if (dn % 2 == 0) KT_EQ_INT(kiln_f8_d(D, dn + 1, n), d + 1);
            }
        for (int d = 0; d < D; d++) KT_EQ_INT(hit[d], 1);
    }
}
