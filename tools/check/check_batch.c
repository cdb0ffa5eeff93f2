/*
 * check_batch.c — the batch checker: one logical batch of requests drawn from a seed, stored
 * ragged or paged (pool bigger than needed, pages shuffled, odd last pages, optional padded
 * strides), run through kiln_plan_create → kiln_plan_schedule → kiln_plan_run (optionally
 * captured in a CUDA graph and replayed after a re-plan), and compared row by row with a
 * float64 reference of the header's batch semantics. Also the paged ≡ ragged and batch
 * invariance checks. See check.h.
 */
#include "check_batch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PAD             16 /* extra elements per padded stride: keeps 16-byte alignment for fp8 */
#define ROPE_OFFSET_MAX 1000

/* ---- index arrays --------------------------------------------------------------------------- */

void kiln_check_lens_uniform(int *out, int n, int lo, int hi, uint64_t seed)
{
    for (int i = 0; i < n; i++)
        out[i] = hi > lo ? lo + (int)(kiln_check_rng(&seed) % (uint64_t)(hi - lo + 1)) : lo;
}

void kiln_check_index_free(kiln_check_index *x)
{
    if (!x) return;
    free(x->qo_indptr);
    free(x->kv_indptr);
    free(x->page_indptr);
    free(x->page_ids);
    free(x->last_page_len);
    memset(x, 0, sizeof *x);
}

kiln_status kiln_check_index_build(int batch, const int *qo_lens, const int *kv_lens, int page_size,
                                   int shuffle, int extra_pages, uint64_t seed, kiln_check_index *x)
{
    memset(x, 0, sizeof *x);
    if (batch < 0) return KILN_STATUS_INVALID_ARGUMENT;
    const size_t n1 = (size_t)batch + 1;
    x->batch = batch;
    x->page_size = page_size > 0 ? page_size : 0;
    x->qo_indptr = calloc(n1, sizeof(int));
    x->kv_indptr = calloc(n1, sizeof(int));
    x->page_indptr = calloc(n1, sizeof(int));
    x->last_page_len = calloc(n1, sizeof(int));
    if (!x->qo_indptr || !x->kv_indptr || !x->page_indptr || !x->last_page_len) goto oom;
    for (int b = 0; b < batch; b++) {
        const int q = qo_lens ? qo_lens[b] : 1, kv = kv_lens[b];
        if (q < 0 || kv < 0) {
            kiln_check_index_free(x);
            return KILN_STATUS_INVALID_ARGUMENT;
        }
        const int pages = x->page_size ? (kv + x->page_size - 1) / x->page_size : 0;
        x->qo_indptr[b + 1] = x->qo_indptr[b] + q;
        x->kv_indptr[b + 1] = x->kv_indptr[b] + kv;
        x->page_indptr[b + 1] = x->page_indptr[b] + pages;
        x->last_page_len[b] = pages ? kv - (pages - 1) * x->page_size : 0;
    }
    x->total_qo = x->qo_indptr[batch];
    x->total_kv = x->kv_indptr[batch];
    x->pages_used = x->page_indptr[batch];
    if (extra_pages < 0) extra_pages = 0;
    x->pool_pages = x->pages_used + extra_pages;
    if (x->pool_pages == 0) x->pool_pages = 1; /* a pool is never empty */
    int *perm = malloc(sizeof(int) * (size_t)x->pool_pages);
    x->page_ids = malloc(sizeof(int) * ((size_t)x->pages_used + 1));
    if (!perm || !x->page_ids) {
        free(perm);
        goto oom;
    }
    for (int i = 0; i < x->pool_pages; i++) perm[i] = i;
    if (shuffle)
        for (int i = x->pool_pages - 1; i > 0; i--) {
            const int j = (int)(kiln_check_rng(&seed) % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
    memcpy(x->page_ids, perm, sizeof(int) * (size_t)x->pages_used);
    x->page_ids[x->pages_used] = 0;
    free(perm);
    return KILN_STATUS_OK;
oom:
    kiln_check_index_free(x);
    return KILN_STATUS_NO_MEMORY;
}

int kiln_check_index_verify(const kiln_check_index *x, char *msg, size_t cap)
{
    const int B = x->batch;
    if (x->qo_indptr[0] || x->kv_indptr[0] || x->page_indptr[0]) {
        snprintf(msg, cap, "an indptr does not start at 0");
        return -1;
    }
    for (int b = 0; b < B; b++) {
        if (x->qo_indptr[b + 1] < x->qo_indptr[b] || x->kv_indptr[b + 1] < x->kv_indptr[b] ||
            x->page_indptr[b + 1] < x->page_indptr[b]) {
            snprintf(msg, cap, "request %d: an indptr decreases", b);
            return -1;
        }
        if (!x->page_size) continue;
        const int kv = x->kv_indptr[b + 1] - x->kv_indptr[b];
        const int pages = x->page_indptr[b + 1] - x->page_indptr[b];
        const int held = pages ? (pages - 1) * x->page_size + x->last_page_len[b] : 0;
        if (held != kv ||
            (pages && (x->last_page_len[b] < 1 || x->last_page_len[b] > x->page_size))) {
            snprintf(msg, cap, "request %d: %d pages, last %d, hold %d keys, want %d", b, pages,
                     x->last_page_len[b], held, kv);
            return -1;
        }
    }
    if (x->total_qo != x->qo_indptr[B] || x->total_kv != x->kv_indptr[B] ||
        x->pages_used != x->page_indptr[B]) {
        snprintf(msg, cap, "totals disagree with the indptr arrays");
        return -1;
    }
    if (x->pages_used > x->pool_pages) {
        snprintf(msg, cap, "%d pages used of a pool of %d", x->pages_used, x->pool_pages);
        return -1;
    }
    unsigned char *seen = calloc((size_t)x->pool_pages + 1, 1);
    if (!seen) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    for (int i = 0; i < x->pages_used; i++) {
        const int p = x->page_ids[i];
        if (p < 0 || p >= x->pool_pages || seen[p]++) {
            snprintf(msg, cap, "page_ids[%d] = %d: outside the pool or repeated", i, p);
            free(seen);
            return -1;
        }
    }
    free(seen);
    return 0;
}

/* ---- logical batches ------------------------------------------------------------------------ */

void kiln__cb_free(cb_logical *L)
{
    kiln_check_index_free(&L->ix);
    free(L->q);
    free(L->k);
    free(L->vv);
    free(L->rope_off);
    free(L->slopes);
    free(L->mask_bits);
    free(L->bsr_indptr);
    free(L->bsr_indices);
    free(L->bit0);
    free(L->row0);
    memset(L, 0, sizeof *L);
}

/* Random mask data of the variant's kind for every request: per query row (bitmask) or block
 * row (bsr), one in eight hides every key, one in eight shows every key, the others show about
 * two in three at random. */
static kiln_status make_mask(cb_logical *L, const kiln_check_batch *s, uint64_t *seed)
{
    const kiln_check_index *x = &L->ix;
    const int B = x->batch, R = s->bsr_r > 0 ? s->bsr_r : 7, C = s->bsr_c > 0 ? s->bsr_c : 40;
    L->bsr_r = R;
    L->bsr_c = C;
    L->bit0 = calloc((size_t)B + 1, sizeof *L->bit0);
    L->row0 = calloc((size_t)B + 1, sizeof *L->row0);
    if (!L->bit0 || !L->row0) return KILN_STATUS_NO_MEMORY;
    int64_t bits = 0, rows = 0, cells = 0;
    for (int b = 0; b < B; b++) {
        const int qo = x->qo_indptr[b + 1] - x->qo_indptr[b],
                  kv = x->kv_indptr[b + 1] - x->kv_indptr[b];
        L->bit0[b] = bits;
        L->row0[b] = (int)rows;
        bits += (int64_t)qo * kv;
        rows += (qo + R - 1) / R;
        cells += (int64_t)((qo + R - 1) / R) * ((kv + C - 1) / C);
    }
    if (L->v.mask_data == KILN_MASK_DATA_BITMASK) {
        L->mask_bytes = (size_t)(bits + 7) / 8;
        L->mask_bits = calloc(L->mask_bytes ? L->mask_bytes : 1, 1);
        if (!L->mask_bits) return KILN_STATUS_NO_MEMORY;
        for (int b = 0; b < B; b++) {
            const int qo = x->qo_indptr[b + 1] - x->qo_indptr[b],
                      kv = x->kv_indptr[b + 1] - x->kv_indptr[b];
            for (int i = 0; i < qo; i++) {
                const uint64_t kind = kiln_check_rng(seed) % 8;
                for (int j = 0; kind != 0 && j < kv; j++) {
                    if (kind != 1 && kiln_check_rng(seed) % 3 == 0) continue;
                    const int64_t bit = L->bit0[b] + (int64_t)i * kv + j;
                    L->mask_bits[bit >> 3] |= (unsigned char)(1u << (bit & 7));
                }
            }
        }
    } else {
        L->bsr_rows = (int)rows;
        L->bsr_indptr = malloc(sizeof(int) * ((size_t)rows + 1));
        L->bsr_indices = malloc(sizeof(int) * ((size_t)cells + 1));
        if (!L->bsr_indptr || !L->bsr_indices) return KILN_STATUS_NO_MEMORY;
        int nnz = 0;
        for (int b = 0; b < B; b++) {
            const int qo = x->qo_indptr[b + 1] - x->qo_indptr[b],
                      kv = x->kv_indptr[b + 1] - x->kv_indptr[b];
            for (int br = 0; br < (qo + R - 1) / R; br++) {
                L->bsr_indptr[L->row0[b] + br] = nnz;
                const uint64_t kind = kiln_check_rng(seed) % 8;
                for (int cb = 0; kind != 0 && cb < (kv + C - 1) / C; cb++)
                    if (kind == 1 || kiln_check_rng(seed) % 3 != 0) L->bsr_indices[nnz++] = cb;
            }
        }
        L->bsr_indptr[rows] = nnz;
        L->bsr_nnz = nnz;
    }
    return KILN_STATUS_OK;
}

/* Whether the mask data shows key j to query row i of request b (with L_KV keys). */
static int mask_shows(const cb_logical *L, int b, int i, int j, int L_KV)
{
    if (L->v.mask_data == KILN_MASK_DATA_BITMASK) {
        const int64_t bit = L->bit0[b] + (int64_t)i * L_KV + j;
        return (L->mask_bits[bit >> 3] >> (bit & 7)) & 1;
    }
    if (L->v.mask_data == KILN_MASK_DATA_BSR) {
        const int br = L->row0[b] + i / L->bsr_r, cb = j / L->bsr_c;
        for (int at = L->bsr_indptr[br]; at < L->bsr_indptr[br + 1]; at++)
            if (L->bsr_indices[at] == cb) return 1;
        return 0;
    }
    return 1;
}

static int is_fp8(kiln_dtype t) { return t == KILN_DTYPE_E4M3 || t == KILN_DTYPE_E5M2; }

/* A code of dtype t for the value x (scaled down by scale first for fp8). */
static uint16_t encode(kiln_dtype t, float x, float scale)
{
    return is_fp8(t) ? kiln_check_fp8_encode(t, (double)x / scale) : kiln_check_to_bits(t, x);
}

/* A large finite (or NaN) code for memory no valid key should read. */
static uint16_t garbage(kiln_dtype t, int nan, uint64_t *seed)
{
    const float g = (kiln_check_uniform(seed) < 0 ? -1.0f : 1.0f) *
                    (100.0f + 400.0f * fabsf(kiln_check_uniform(seed)));
    if (is_fp8(t)) return nan ? 0x7f : kiln_check_fp8_encode(t, g);
    return nan ? 0xffff : kiln_check_to_bits(t, g);
}

/* Random codes for n elements in parallel: element i of chunk c (FILL_CHUNK elements) draws
 * from a stream seeded by (seed, c), so the values depend on the seed only, not on the threads.
 * q: bits of 2 x uniform in dtype t; k, v: codes of uniform / scale (fp8) or bits. */
enum { FILL_CHUNK = 1 << 18 };
typedef struct fill_job {
    uint16_t *dst;
    size_t n;
    kiln_dtype t;
    int is_q;
    float scale;
    uint64_t seed;
} fill_job;

static void fill_work(void *arg, int first, int step)
{
    const fill_job *f = arg;
    const long chunks = (long)((f->n + FILL_CHUNK - 1) / FILL_CHUNK);
    for (long c = first; c < chunks; c += step) {
        uint64_t s = f->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(c + 1));
        const size_t hi = (size_t)(c + 1) * FILL_CHUNK < f->n ? (size_t)(c + 1) * FILL_CHUNK : f->n;
        for (size_t i = (size_t)c * FILL_CHUNK; i < hi; i++) {
            const float x = kiln_check_uniform(&s);
            f->dst[i] = f->is_q ? kiln_check_to_bits(f->t, 2.0f * x) : encode(f->t, x, f->scale);
        }
    }
}

static void fill_codes(uint16_t *dst, size_t n, kiln_dtype t, int is_q, float scale, uint64_t seed)
{
    fill_job f = {dst, n, t, is_q, scale, seed};
    kiln_check_parallel(fill_work, &f, (long)((n + FILL_CHUNK - 1) / FILL_CHUNK));
}

kiln_status kiln__cb_make(const kiln_variant *v, const kiln_check_batch *s, uint64_t seed,
                          cb_logical *L)
{
    memset(L, 0, sizeof *L);
    L->v = *v;
    L->D = v->head_dim;
    L->G = v->group;
    L->H = s->num_qo_heads;
    if (L->H < L->G || L->H % L->G) return KILN_STATUS_INVALID_ARGUMENT;
    L->H_KV = L->H / L->G;
    L->sm_scale = s->sm_scale > 0 ? s->sm_scale : 1.0f / sqrtf((float)L->D);
    L->softcap = s->softcap > 0 ? s->softcap : 30.0f;
    L->k_scale = is_fp8(v->kv_dtype) ? (s->k_scale > 0 ? s->k_scale : 0.75f) : 0;
    L->v_scale = is_fp8(v->kv_dtype) ? (s->v_scale > 0 ? s->v_scale : 1.25f) : 0;
    L->rope_scale = s->rope_scale;
    L->rope_theta = s->rope_theta;
    const int P = v->kv == KILN_KV_PAGED ? (s->page_size > 0 ? s->page_size : 16) : 0;
    const int B = s->batch;
    long kv_sum = 0, nonzero = 0;
    for (int b = 0; b < B; b++) {
        kv_sum += s->kv_lens[b];
        nonzero += s->kv_lens[b] > 0;
    }
    L->window_left = s->window_left >= 0 ? s->window_left
                     : nonzero           ? (int)(kv_sum / nonzero / 3)
                                         : 0;
    int pages = 0;
    for (int b = 0; P && b < B; b++) pages += (s->kv_lens[b] + P - 1) / P;
    const int extra = s->extra_pages < 0 ? 0 : s->extra_pages > 0 ? s->extra_pages : pages / 3 + 2;
    kiln_status st =
        kiln_check_index_build(B, v->op == KILN_OP_DECODE ? NULL : s->qo_lens, s->kv_lens, P,
                               !s->no_shuffle, extra, seed ^ 0x5eed, &L->ix);
    if (st) return st;
    const size_t qn = (size_t)L->ix.total_qo * L->H * L->D,
                 kn = (size_t)L->ix.total_kv * L->H_KV * L->D;
    L->q = malloc(sizeof(uint16_t) * (qn + 1));
    L->k = malloc(sizeof(uint16_t) * (kn + 1));
    L->vv = malloc(sizeof(uint16_t) * (kn + 1));
    L->rope_off = calloc((size_t)B + 1, sizeof(int));
    L->slopes = malloc(sizeof(float) * (size_t)L->H);
    if (!L->q || !L->k || !L->vv || !L->rope_off || !L->slopes) {
        kiln__cb_free(L);
        return KILN_STATUS_NO_MEMORY;
    }
    /* q is scaled up so the softmax is not flat (as in the single-request check) */
    const float ks = L->k_scale > 0 ? L->k_scale : 1, vs = L->v_scale > 0 ? L->v_scale : 1;
    fill_codes(L->q, qn, v->q_dtype, 1, 1.0f, kiln_check_rng(&seed));
    fill_codes(L->k, kn, v->kv_dtype, 0, ks, kiln_check_rng(&seed));
    fill_codes(L->vv, kn, v->kv_dtype, 0, vs, kiln_check_rng(&seed));
    for (int b = 0; v->rope && s->rope_offsets && b < B; b++)
        L->rope_off[b] = (int)(kiln_check_rng(&seed) % ROPE_OFFSET_MAX);
    for (int h = 0; h < L->H; h++) L->slopes[h] = exp2f(-8.0f * (float)(h + 1) / (float)L->H);
    L->has_rope_off = v->rope && s->rope_offsets;
    if (v->mask_data && (st = make_mask(L, s, &seed))) {
        kiln__cb_free(L);
        return st;
    }
    L->garbage_seed = seed;
    L->nan_pool = s->nan_pool;
    return KILN_STATUS_OK;
}

/* ---- storage: the logical batch laid out as the kernel reads it ------------------------------ */

void kiln__cb_store_free(cb_store *S)
{
    free(S->q);
    free(S->k);
    free(S->v);
    memset(S, 0, sizeof *S);
}

/* Element offset of key j of request b, head hk, in the stored k / v. */
static size_t kv_offset(const cb_logical *L, const cb_store *S, int b, int j, int hk)
{
    if (L->v.kv == KILN_KV_PAGED) {
        const int P = L->ix.page_size;
        const int page = L->ix.page_ids[L->ix.page_indptr[b] + j / P];
        return (size_t)page * S->ks_page + (size_t)(j % P) * S->ks_n + (size_t)hk * S->ks_h;
    }
    return (size_t)(L->ix.kv_indptr[b] + j) * S->ks_n + (size_t)hk * S->ks_h;
}

enum { GARBAGE_CODES = 4093 };

/* n elements of es bytes (1: the low byte of each code) at dst: codes[i % GARBAGE_CODES]. */
static void fill_periodic(void *dst, size_t n, int es, const uint16_t *codes)
{
    const size_t first = n < GARBAGE_CODES ? n : GARBAGE_CODES;
    for (size_t i = 0; i < first; i++) {
        if (es == 1) ((uint8_t *)dst)[i] = (uint8_t)codes[i];
        else ((uint16_t *)dst)[i] = codes[i];
    }
    /* then copy the period forward, doubling what is copied each time */
    for (size_t done = first; done < n;) {
        const size_t len = done < n - done ? done : n - done;
        memcpy((char *)dst + done * (size_t)es, dst, len * (size_t)es);
        done += len;
    }
}

kiln_status kiln__cb_store(const cb_logical *L, int strided, int kv_rows_cap, int pool_cap,
                           cb_store *S)
{
    memset(S, 0, sizeof *S);
    const int D = L->D, pad = strided ? PAD : 0, hnd = L->v.layout == KILN_LAYOUT_HND;
    const int P = L->ix.page_size;
    const int rows = kv_rows_cap > L->ix.total_kv ? kv_rows_cap : L->ix.total_kv;
    const int pool = pool_cap > L->ix.pool_pages ? pool_cap : L->ix.pool_pages;
    S->esize = is_fp8(L->v.kv_dtype) ? 1 : 2;
    S->qs_h = D + pad;
    S->qs_n = (int64_t)L->H * S->qs_h + pad;
    S->os_h = S->qs_h;
    S->os_n = S->qs_n;
    if (L->v.kv == KILN_KV_PAGED) {
        if (hnd) {
            S->ks_n = D + pad;
            S->ks_h = (int64_t)P * S->ks_n + pad;
            S->ks_page = (int64_t)L->H_KV * S->ks_h + pad;
        } else {
            S->ks_h = D + pad;
            S->ks_n = (int64_t)L->H_KV * S->ks_h + pad;
            S->ks_page = (int64_t)P * S->ks_n + pad;
        }
        S->kv_elems = (size_t)pool * S->ks_page;
    } else if (hnd) {
        S->ks_n = D + pad;
        S->ks_h = (int64_t)(rows > 0 ? rows : 1) * S->ks_n + pad;
        S->kv_elems = (size_t)L->H_KV * S->ks_h;
    } else {
        S->ks_h = D + pad;
        S->ks_n = (int64_t)L->H_KV * S->ks_h + pad;
        S->kv_elems = (size_t)(rows > 0 ? rows : 1) * S->ks_n;
    }
    /* dense strides go to the kernel as 0 (its defaults), except ragged hnd, which has none */
    S->pass_strides = strided || (L->v.kv == KILN_KV_RAGGED && hnd);
    const int tq = L->ix.total_qo > 0 ? L->ix.total_qo : 1;
    S->q_elems = (size_t)tq * S->qs_n;
    S->o_elems = S->q_elems;
    S->q = malloc(S->q_elems * 2);
    S->k = malloc(S->kv_elems * S->esize);
    S->v = malloc(S->kv_elems * S->esize);
    if (!S->q || !S->k || !S->v) {
        kiln__cb_store_free(S);
        return KILN_STATUS_NO_MEMORY;
    }
    /* Every slot first gets garbage: codes from a table of GARBAGE_CODES random large values
     * (or NaN) repeated (a prime period, so rows and heads see different values); the valid
     * rows are copied over it below. Drawing each element (an fp8 encode each) took 22 s for
     * the largest grid batches. */
    uint64_t g = L->garbage_seed ^ 0x9a4ba6e;
    uint16_t qg[GARBAGE_CODES], kg[GARBAGE_CODES], vg[GARBAGE_CODES];
    for (int i = 0; i < GARBAGE_CODES; i++) {
        qg[i] = garbage(L->v.q_dtype, 0, &g);
        kg[i] = garbage(L->v.kv_dtype, L->nan_pool, &g);
        vg[i] = garbage(L->v.kv_dtype, L->nan_pool, &g);
    }
    fill_periodic(S->q, S->q_elems, 2, qg);
    fill_periodic(S->k, S->kv_elems, S->esize, kg);
    fill_periodic(S->v, S->kv_elems, S->esize, vg);
    for (int r = 0; r < L->ix.total_qo; r++)
        for (int h = 0; h < L->H; h++)
            memcpy((uint16_t *)S->q + r * S->qs_n + h * S->qs_h, L->q + ((size_t)r * L->H + h) * D,
                   2 * (size_t)D);
    for (int b = 0; b < L->ix.batch; b++)
        for (int j = 0; j < L->ix.kv_indptr[b + 1] - L->ix.kv_indptr[b]; j++)
            for (int hk = 0; hk < L->H_KV; hk++) {
                const size_t at = kv_offset(L, S, b, j, hk);
                const size_t from = ((size_t)(L->ix.kv_indptr[b] + j) * L->H_KV + hk) * D;
                if (S->esize == 2) {
                    memcpy((uint16_t *)S->k + at, L->k + from, 2 * (size_t)D);
                    memcpy((uint16_t *)S->v + at, L->vv + from, 2 * (size_t)D);
                    continue;
                }
                for (int d = 0; d < D; d++) { /* fp8: the code is the low byte */
                    ((uint8_t *)S->k)[at + d] = (uint8_t)L->k[from + d];
                    ((uint8_t *)S->v)[at + d] = (uint8_t)L->vv[from + d];
                }
            }
    return KILN_STATUS_OK;
}

/* ---- the float64 reference ------------------------------------------------------------------ */

/* One task: rows [i0, i1) of request b, for the G query heads of KV head hk. */
typedef struct ref_task {
    int b, hk, i0, i1;
} ref_task;

typedef struct ref_job {
    const cb_logical *L;
    const ref_task *tasks;
    long ntasks;
    double *o, *lse;
} ref_job;

enum { REF_ROWS = 16 }; /* query rows per task: K and V are decoded once per task */

/* The request owning row r (binary search in qo_indptr). */
static int request_of(const kiln_check_index *x, int r)
{
    int lo = 0, hi = x->batch - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (x->qo_indptr[mid] <= r) lo = mid;
        else hi = mid - 1;
    }
    /* skip requests with no rows that share the offset */
    while (lo + 1 < x->batch && x->qo_indptr[lo + 1] <= r) lo++;
    return lo;
}

/* A task's keys and values in float64, dequantised (times the fp8 scales) and, with RoPE,
 * the keys rotated at their positions: kd, vd [L_KV][D]. fp8 codes through a table of the
 * 256 values (kiln_check_decode's, made once a call), 16-bit ones inline. */
static void ref_decode_kv(const cb_logical *L, int b, int hk, double *kd, double *vd)
{
    const int D = L->D, L_KV = L->ix.kv_indptr[b + 1] - L->ix.kv_indptr[b];
    const kiln_dtype kt = L->v.kv_dtype;
    const double ks = L->k_scale > 0 ? L->k_scale : 1, vs = L->v_scale > 0 ? L->v_scale : 1;
    double fp8[256];
    if (is_fp8(kt))
        for (int c = 0; c < 256; c++) fp8[c] = kiln_check_decode(kt, (uint16_t)c);
    for (int j = 0; j < L_KV; j++) {
        const size_t at = ((size_t)(L->ix.kv_indptr[b] + j) * L->H_KV + hk) * D;
        double *kr = kd + (size_t)j * D, *vr = vd + (size_t)j * D;
        if (is_fp8(kt))
            for (int d = 0; d < D; d++) {
                kr[d] = ks * fp8[L->k[at + d] & 0xff];
                vr[d] = vs * fp8[L->vv[at + d] & 0xff];
            }
        else
            for (int d = 0; d < D; d++) {
                kr[d] = ks * kiln__check_bits(kt, L->k[at + d]);
                vr[d] = vs * kiln__check_bits(kt, L->vv[at + d]);
            }
        if (L->v.rope) kiln_check_rope(kr, D, j + L->rope_off[b], L->rope_scale, L->rope_theta);
    }
}

/* Query row t of task tk (row i0 + t / G of its request, head hk G + t % G) as row r of a
 * block of R: its position, head and place in o / lse, and q in column r of bk->qT (rotated at
 * its position with RoPE; q is scratch of D). */
static void ref_row(const cb_logical *L, const ref_task *tk, int t, int r, int R, double *q,
                    kiln__check_block *bk)
{
    const int D = L->D, b = tk->b;
    const int L_Q = L->ix.qo_indptr[b + 1] - L->ix.qo_indptr[b];
    const int L_KV = L->ix.kv_indptr[b + 1] - L->ix.kv_indptr[b];
    const int i = tk->i0 + t / L->G, h = tk->hk * L->G + t % L->G;
    const long at = (long)(L->ix.qo_indptr[b] + i) * L->H + h;
    bk->i[r] = i, bk->h[r] = h, bk->at[r] = at;
    for (int d = 0; d < D; d++) q[d] = kiln_check_from_bits(L->v.q_dtype, L->q[at * D + d]);
    if (L->v.rope)
        kiln_check_rope(q, D, i + L_KV - L_Q + L->rope_off[b], L->rope_scale, L->rope_theta);
    for (int d = 0; d < D; d++) bk->qT[(size_t)d * R + r] = q[d];
}

static void ref_work(void *arg, int first, int step)
{
    const ref_job *jb = arg;
    const cb_logical *L = jb->L;
    const int D = L->D;
    int max_kv = 1;
    for (int b = 0; b < L->ix.batch; b++) {
        const int n = L->ix.kv_indptr[b + 1] - L->ix.kv_indptr[b];
        if (n > max_kv) max_kv = n;
    }
    const int RB = kiln__check_ref_rows(max_kv);
    kiln__check_block bk;
    double *q = malloc(sizeof(double) * (size_t)D),
           *kd = malloc(sizeof(double) * (size_t)max_kv * D),
           *vd = malloc(sizeof(double) * (size_t)max_kv * D);
    const int ok = kiln__check_block_alloc(&bk, RB, max_kv, D) && q && kd && vd;
    for (long t = first; t < jb->ntasks; t += step) {
        const ref_task *tk = &jb->tasks[t];
        const int b = tk->b, rows = (tk->i1 - tk->i0) * L->G;
        const int L_Q = L->ix.qo_indptr[b + 1] - L->ix.qo_indptr[b];
        const int L_KV = L->ix.kv_indptr[b + 1] - L->ix.kv_indptr[b];
        if (!ok) { /* out of memory: NaN rows fail the comparison loudly */
            for (int r = 0; r < rows; r++) {
                const long row = (long)(L->ix.qo_indptr[b] + tk->i0 + r / L->G) * L->H +
                                 tk->hk * L->G + r % L->G;
                for (int d = 0; d < D; d++) jb->o[(size_t)row * D + d] = NAN;
                jb->lse[row] = NAN;
            }
            continue;
        }
        ref_decode_kv(L, b, tk->hk, kd, vd);
        for (int t0 = 0; t0 < rows; t0 += RB) {
            const int R = rows - t0 < RB ? rows - t0 : RB;
            for (int r = 0; r < R; r++) ref_row(L, tk, t0 + r, r, R, q, &bk);
            for (int j = 0; j < L_KV; j++) {
                int any = 0;
                for (int r = 0; r < R; r++) {
                    const int diag = bk.i[r] + L_KV - L_Q;
                    bk.vis[r] = !(L->v.mask == KILN_MASK_CAUSAL && j > diag) &&
                                !(L->v.window && j < diag - L->window_left) &&
                                !(L->v.mask_data && !mask_shows(L, b, bk.i[r], j, L_KV));
                    any |= bk.vis[r];
                }
                if (any) kiln__check_dots(bk.qT, R, D, kd + (size_t)j * D, bk.s);
                for (int r = 0; r < R; r++)
                    bk.x[(size_t)r * L_KV + j] =
                        bk.vis[r]
                            ? kiln__check_logit(L->v.logits, bk.s[r] * L->sm_scale, L->softcap,
                                                L->slopes ? L->slopes[bk.h[r]] : 0.f,
                                                j - (bk.i[r] + L_KV - L_Q))
                            : -INFINITY;
            }
            kiln__check_softmax_pv(&bk, R, L_KV, vd, D, jb->o, jb->lse);
        }
    }
    kiln__check_block_free(&bk);
    free(q);
    free(kd);
    free(vd);
}

kiln_status kiln__cb_reference(const cb_logical *L, double **o, double **lse)
{
    const size_t rows = (size_t)L->ix.total_qo * L->H;
    const kiln_check_index *x = &L->ix;
    long ntasks = 0;
    for (int b = 0; b < x->batch; b++)
        ntasks += (long)(x->qo_indptr[b + 1] - x->qo_indptr[b] + REF_ROWS - 1) / REF_ROWS * L->H_KV;
    ref_task *tasks = malloc(sizeof *tasks * (size_t)(ntasks + 1)); /* + 1: never malloc(0) */
    *o = malloc(sizeof(double) * (rows * L->D + 1));
    *lse = malloc(sizeof(double) * (rows + 1));
    if (!*o || !*lse || !tasks) {
        free(*o);
        free(*lse);
        free(tasks);
        *o = *lse = NULL;
        return KILN_STATUS_NO_MEMORY;
    }
    /* tasks in request order */
    long n = 0;
    for (int b = 0; b < x->batch; b++) {
        const int L_Q = x->qo_indptr[b + 1] - x->qo_indptr[b];
        for (int i0 = 0; i0 < L_Q; i0 += REF_ROWS)
            for (int hk = 0; hk < L->H_KV; hk++)
                tasks[n++] = (ref_task){b, hk, i0, i0 + REF_ROWS < L_Q ? i0 + REF_ROWS : L_Q};
    }
    ref_job job = {L, tasks, n, *o, *lse};
    kiln_check_parallel(ref_work, &job, n);
    free(tasks);
    return KILN_STATUS_OK;
}

void kiln__cb_compare(const cb_logical *L, const cb_out *out, const double *ref_o,
                      const double *ref_lse, kiln_check_result *r, double sums[2], int *bad_req)
{
    const int D = L->D, H = L->H;
    for (int row = 0; row < L->ix.total_qo; row++) {
        const int b = request_of(&L->ix, row), i = row - L->ix.qo_indptr[b];
        for (int h = 0; h < H; h++) {
            int first = 0;
            for (int d = 0; d < D; d++) {
                const size_t at = ((size_t)row * H + h) * D + d;
                const double ref = ref_o[at], got = kiln__check_bits(L->v.out_dtype, out->o[at]);
                if (!kiln__check_o(r, got, ref, sums)) continue;
                first = 1;
                snprintf(r->first_bad, sizeof r->first_bad,
                         "o[b=%d,i=%d,h=%d,d=%d] = %.6g, ref %.6g", b, i, h, d, got, ref);
            }
            if (L->v.lse) {
                const double ref = ref_lse[(size_t)row * H + h],
                             got = out->lse[(size_t)row * H + h];
                if (kiln__check_lse(r, got, ref)) {
                    first = 1;
                    snprintf(r->first_bad, sizeof r->first_bad,
                             "lse[b=%d,i=%d,h=%d] = %.6g, ref %.6g", b, i, h, got, ref);
                }
            }
            if (first && bad_req && *bad_req < 0) *bad_req = b;
        }
    }
    kiln__check_rel_l2(r, sums);
}
