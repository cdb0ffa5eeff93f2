/*
 * batch.c — the machinery of kiln-bench's batch suites (kiln-bench --batch; the suites are in
 * suites.c and cascade.c): batch shapes, device buffers with random inputs, plans, timed steps,
 * the sampled float64 reference and the CSV rows. bf16, H = 32, H_KV = 8 (G = 4), D = 128, page
 * 16 unless a point says otherwise.
 *
 * How each number is made:
 *   - inputs are random on the device (devk.c); pages of each request sit at shuffled places of
 *     a pool; q, k, v are rotated through copies only where one copy's working set is under
 *     256 MiB (the L2 is 50 MiB), by switching the page table (paged) or the base (ragged);
 *   - each point first runs once on poisoned outputs and is checked against a float64 CPU
 *     reference on sampled requests and rows (the first and the last request; prefill rows
 *     0, L/2, L-1), then times 30 runs after 3 warm-ups with CUDA events; the median is shown;
 *   - decode GB/s counts the bytes a decode must move: K and V of every token and KV head, q
 *     read, o written (page indices not counted); % of the copy and of the streaming-read
 *     ceilings measured in the same run;
 *   - prefill TFLOP/s counts 4·D per visible (query, key) pair per query head: causal counts
 *     only the pairs the mask keeps (S(S+1)/2 per request and head, about half of the square);
 *   - the plan is made once per point, outside the timing (run is what a step costs).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch.h"
#include "check.h"

/* ---- shapes and buffers -------------------------------------------------------------------- */

void bshape_free(bshape *s)
{
    free(s->qo_len);
    free(s->kv_len);
    free(s->qo_indptr);
    free(s->kv_indptr);
    free(s->last);
    memset(s, 0, sizeof *s);
}

/* B requests; qo_len[b] = qo (0: decode) and kv_len[b] = kvl[b]. */
int bshape_make(bshape *s, int B, int qo, const int *kvl, int paged)
{
    memset(s, 0, sizeof *s);
    s->B = B;
    s->paged = paged;
    s->qo_len = calloc((size_t)B + 1, sizeof(int));
    s->kv_len = calloc((size_t)B + 1, sizeof(int));
    s->kv_indptr = calloc((size_t)B + 1, sizeof(int));
    s->last = calloc((size_t)B + 1, sizeof(int));
    if (qo) s->qo_indptr = calloc((size_t)B + 1, sizeof(int));
    if (!s->qo_len || !s->kv_len || !s->kv_indptr || !s->last || (qo && !s->qo_indptr)) return -1;
    for (int b = 0; b < B; b++) {
        s->qo_len[b] = qo ? qo : 1;
        s->kv_len[b] = kvl[b];
        const int units = paged ? (kvl[b] + PAGE - 1) / PAGE : kvl[b];
        s->kv_indptr[b + 1] = s->kv_indptr[b] + units;
        s->last[b] = paged ? kvl[b] - (units - 1) * PAGE : 0;
        if (qo) s->qo_indptr[b + 1] = s->qo_indptr[b] + qo;
        s->total_qo += s->qo_len[b];
        s->total_kv += kvl[b];
    }
    s->n_idx = paged ? s->kv_indptr[B] : 0;
    return 0;
}

void bbufs_free(bench_env *env, bbufs *b)
{
    CUdeviceptr *all[] = {&b->q, &b->k, &b->v, &b->o, &b->lse, &b->idx, &b->ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (*all[i]) env->cu->cuMemFree(*all[i]);
    free(b->idx_host);
    memset(b, 0, sizeof *b);
}

uint64_t brng(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

#define B_TRY(call, what)                                                                          \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) return bench_cu_fail(env, r_, "", what, msg, cap);                 \
    } while (0)

/* Allocate and fill the buffers. Paged pools hold copies x pool_units pages; with idx (the
 * page table of copy 0, s->n_idx ids, copies must be 1) the caller places pages itself,
 * otherwise every request owns pool pages at shuffled places. */
kiln_status bbufs_alloc(bench_env *env, bbufs *b, const bshape *s, int paged, int D, int elt,
                        int64_t pool_units, const int *idx, char *msg, size_t cap)
{
    b->paged = paged;
    b->D = D;
    b->elt = elt;
    b->pool_units = pool_units;
    b->q_bytes = (size_t)s->total_qo * HQ * D * 2;
    b->kv_bytes = (size_t)pool_units * (paged ? PAGE : 1) * HKV * D * elt;
    const size_t c = (size_t)b->copies;
    B_TRY(env->cu->cuMemAlloc(&b->q, c * b->q_bytes), "alloc q");
    B_TRY(env->cu->cuMemAlloc(&b->k, c * b->kv_bytes), "alloc k");
    B_TRY(env->cu->cuMemAlloc(&b->v, c * b->kv_bytes), "alloc v");
    B_TRY(env->cu->cuMemAlloc(&b->o, b->q_bytes), "alloc o");
    B_TRY(env->cu->cuMemAlloc(&b->lse, (size_t)s->total_qo * HQ * sizeof(float) + 16), "alloc lse");
    kiln_status st;
    if ((st = devk_fill_bf16(env, b->q, c * b->q_bytes / 2, 1, 2.0f))) goto fill_failed;
    if (elt == 2) {
        if ((st = devk_fill_bf16(env, b->k, c * b->kv_bytes / 2, 2, 1.0f))) goto fill_failed;
        if ((st = devk_fill_bf16(env, b->v, c * b->kv_bytes / 2, 3, 1.0f))) goto fill_failed;
    } else {
        if ((st = devk_fill_e4m3(env, b->k, c * b->kv_bytes, 2))) goto fill_failed;
        if ((st = devk_fill_e4m3(env, b->v, c * b->kv_bytes, 3))) goto fill_failed;
    }
    if (paged) {
        const int64_t n = (int64_t)c * s->n_idx;
        b->idx_host = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
        if (!b->idx_host) {
            snprintf(msg, cap, "out of host memory");
            return KILN_STATUS_NO_MEMORY;
        }
        if (idx) {
            memcpy(b->idx_host, idx, sizeof(int) * (size_t)s->n_idx);
        } else {
            /* a shuffled permutation of every page of every copy; copy i takes slice i */
            const int64_t all = (int64_t)c * pool_units;
            uint64_t x = 99;
            for (int64_t i = 0; i < all; i++) b->idx_host[i] = (int)i;
            for (int64_t i = all - 1; i > 0; i--) {
                const int64_t j = (int64_t)(brng(&x) % (uint64_t)(i + 1));
                const int t = b->idx_host[i];
                b->idx_host[i] = b->idx_host[j];
                b->idx_host[j] = t;
            }
        }
        B_TRY(env->cu->cuMemAlloc(&b->idx, sizeof(int) * (size_t)(n > 0 ? n : 1)),
              "alloc page table");
        if (n)
            B_TRY(env->cu->cuMemcpyHtoD(b->idx, b->idx_host, sizeof(int) * (size_t)n),
                  "copy page table");
    }
    return KILN_STATUS_OK;
fill_failed:
    snprintf(msg, cap, "random fill failed");
    return st;
}

void bbufs_args(const bbufs *b, const bshape *s, int copy, kiln_batch_args *a)
{
    memset(a, 0, sizeof *a);
    a->q = b->q + (CUdeviceptr)copy * b->q_bytes;
    if (b->paged) {
        a->k = b->k;
        a->v = b->v;
        a->kv_indices = b->idx + (CUdeviceptr)copy * (CUdeviceptr)s->n_idx * sizeof(int);
    } else {
        a->k = b->k + (CUdeviceptr)copy * b->kv_bytes;
        a->v = b->v + (CUdeviceptr)copy * b->kv_bytes;
    }
    a->o = b->o;
    a->lse = b->lse;
    a->workspace = b->ws;
    a->workspace_bytes = b->ws_bytes;
}

/* Create a plan for k, size and allocate its workspace into b, plan s on the default stream. */
kiln_status bplan_make(bench_env *env, kiln_kernel *k, const bshape *s, bbufs *b, kiln_plan **plan,
                       char *msg, size_t cap)
{
    kiln_plan_opts po = {0};
    po.num_qo_heads = HQ;
    po.page_size = s->paged ? PAGE : 0; /* ragged: 0, as python/kiln does */
    kiln_status st = kiln_plan_create(k, &po, plan);
    if (!st) st = kiln_plan_workspace_size(*plan, s->B, (int)s->total_qo, &b->ws_bytes);
    if (st) {
        snprintf(msg, cap, "plan: %s", kiln_ctx_errmsg(env->ctx));
        return st;
    }
    B_TRY(env->cu->cuMemAlloc(&b->ws, b->ws_bytes ? b->ws_bytes : 16), "alloc workspace");
    kiln_batch_shape bs = {s->B, s->qo_indptr, s->kv_indptr, s->paged ? s->last : NULL};
    if ((st = kiln_plan_schedule(*plan, &bs, b->ws, b->ws_bytes, NULL))) {
        snprintf(msg, cap, "kiln_plan_schedule: %s", kiln_ctx_errmsg(env->ctx));
        return st;
    }
    return KILN_STATUS_OK;
}

/* ---- timing --------------------------------------------------------------------------------- */

int bcmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median ms of REPS steps after WARM, rotating copies. */
kiln_status btime_steps(bench_env *env, step_fn fn, void *user, int copies, double *med, char *msg,
                        size_t cap)
{
    CUevent ev[2] = {0};
    double ms[REPS];
    kiln_status st = KILN_STATUS_OK;
    B_TRY(env->cu->cuEventCreate(&ev[0], CU_EVENT_DEFAULT), "event");
    B_TRY(env->cu->cuEventCreate(&ev[1], CU_EVENT_DEFAULT), "event");
    for (int t = 0; t < WARM + REPS && !st; t++) {
        env->cu->cuEventRecord(ev[0], NULL);
        st = fn(user, t % copies);
        env->cu->cuEventRecord(ev[1], NULL);
        CUresult r = env->cu->cuEventSynchronize(ev[1]);
        if (st) snprintf(msg, cap, "run: %s", kiln_ctx_errmsg(env->ctx));
        else if (r != CUDA_SUCCESS) {
            const char *n = NULL;
            env->cu->cuGetErrorName(r, &n);
            snprintf(msg, cap, "run: %s", n ? n : "?");
            st = KILN_STATUS_CUDA;
        }
        float f = 0;
        env->cu->cuEventElapsedTime(&f, ev[0], ev[1]);
        if (t >= WARM) ms[t - WARM] = f;
    }
    env->cu->cuEventDestroy(ev[0]);
    env->cu->cuEventDestroy(ev[1]);
    if (st) return st;
    qsort(ms, REPS, sizeof ms[0], bcmp_d);
    *med = ms[REPS / 2];
    return KILN_STATUS_OK;
}

/* ---- reference ------------------------------------------------------------------------------ */

static float kv_value(const bbufs *b, const unsigned char *p, size_t i)
{
    if (b->elt == 1) return devk_e4m3_to_f32(p[i]);
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return devk_bf16_to_f32(h);
}

/* K and V of request r (copy 0) as floats [kv_len][HKV][D]. */
static kiln_status gather_kv(bench_env *env, const bbufs *b, const bshape *s, int r, float *k,
                             float *v, char *msg, size_t cap)
{
    const size_t tok = (size_t)HKV * b->D * b->elt; /* bytes of one token's K */
    const int n = s->kv_len[r];
    unsigned char *hk = malloc(tok * (size_t)n + 1), *hv = malloc(tok * (size_t)n + 1);
    kiln_status st = KILN_STATUS_OK;
    if (!hk || !hv) {
        free(hk);
        free(hv);
        snprintf(msg, cap, "out of host memory");
        return KILN_STATUS_NO_MEMORY;
    }
    CUresult e = CUDA_SUCCESS;
    if (b->paged) {
        for (int p = 0; p * PAGE < n && e == CUDA_SUCCESS; p++) {
            const int page = b->idx_host[s->kv_indptr[r] + p];
            const int t = n - p * PAGE < PAGE ? n - p * PAGE : PAGE;
            const CUdeviceptr off = (CUdeviceptr)page * PAGE * tok;
            e = env->cu->cuMemcpyDtoH(hk + (size_t)p * PAGE * tok, b->k + off, (size_t)t * tok);
            if (e == CUDA_SUCCESS)
                e = env->cu->cuMemcpyDtoH(hv + (size_t)p * PAGE * tok, b->v + off, (size_t)t * tok);
        }
    } else if (n) {
        const CUdeviceptr off = (CUdeviceptr)s->kv_indptr[r] * tok;
        e = env->cu->cuMemcpyDtoH(hk, b->k + off, (size_t)n * tok);
        if (e == CUDA_SUCCESS) e = env->cu->cuMemcpyDtoH(hv, b->v + off, (size_t)n * tok);
    }
    if (e != CUDA_SUCCESS) {
        snprintf(msg, cap, "copy K/V back failed (%d)", (int)e);
        st = KILN_STATUS_CUDA;
    } else {
        const size_t m = (size_t)n * HKV * b->D;
        for (size_t i = 0; i < m; i++) {
            k[i] = kv_value(b, hk, i);
            v[i] = kv_value(b, hv, i);
        }
    }
    free(hk);
    free(hv);
    return st;
}

/* o of one query row (all heads) in float64: keys 0 .. n_vis-1 of k, v [.][HKV][D]. */
static void ref_row(const float *q, const float *k, const float *v, int n_vis, int D, double *out)
{
    const double scale = 1.0 / sqrt((double)D);
    double *p = malloc(sizeof(double) * (size_t)(n_vis > 0 ? n_vis : 1));
    for (int h = 0; h < HQ; h++) {
        const int hk = h / (HQ / HKV);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < n_vis; j++) {
            const float *kj = k + ((size_t)j * HKV + hk) * D;
            double dot = 0;
            for (int d = 0; d < D; d++) dot += (double)q[h * D + d] * kj[d];
            p[j] = dot * scale;
            if (p[j] > mx) mx = p[j];
        }
        for (int j = 0; j < n_vis; j++) sum += (p[j] = exp(p[j] - mx));
        for (int d = 0; d < D; d++) {
            double acc = 0;
            for (int j = 0; j < n_vis; j++) acc += p[j] * v[((size_t)j * HKV + hk) * D + d];
            out[h * D + d] = n_vis ? acc / sum : 0.0;
        }
    }
    free(p);
}

/* Compare rows of o (copy 0's inputs) with the reference: requests 0 and B-1; decode their one
 * row, prefill rows 0, L/2, L-1. causal: bottom-right aligned. Returns MISMATCH with msg set. */
kiln_status bcheck_rows(bench_env *env, const kiln_variant *v, const bbufs *b, const bshape *s,
                        int causal, char *msg, size_t cap)
{
    const int D = b->D;
    double atol, rtol;
    kiln_check_tolerance(v, &atol, &rtol);
    kiln_status st = KILN_STATUS_OK;
    const int reqs[2] = {0, s->B - 1};
    for (int ri = 0; ri < (s->B > 1 ? 2 : 1) && !st; ri++) {
        const int r = reqs[ri];
        const int n = s->kv_len[r], lq = s->qo_len[r];
        float *k = malloc(sizeof(float) * ((size_t)n * HKV * D + 1));
        float *vv = malloc(sizeof(float) * ((size_t)n * HKV * D + 1));
        double *ref = malloc(sizeof(double) * HQ * D);
        if (!k || !vv || !ref) {
            snprintf(msg, cap, "out of host memory");
            st = KILN_STATUS_NO_MEMORY;
        }
        if (!st) st = gather_kv(env, b, s, r, k, vv, msg, cap);
        const int rows[3] = {0, lq / 2, lq - 1};
        for (int ii = 0; ii < (lq > 1 ? 3 : 1) && !st; ii++) {
            const int i = rows[ii];
            const int64_t row = (s->qo_indptr ? s->qo_indptr[r] : r) + i;
            uint16_t qh[HQ * 256], oh[HQ * 256];
            float q[HQ * 256];
            if (env->cu->cuMemcpyDtoH(qh, b->q + (CUdeviceptr)row * HQ * D * 2,
                                      (size_t)HQ * D * 2) ||
                env->cu->cuMemcpyDtoH(oh, b->o + (CUdeviceptr)row * HQ * D * 2,
                                      (size_t)HQ * D * 2)) {
                snprintf(msg, cap, "copy q/o back failed");
                st = KILN_STATUS_CUDA;
                break;
            }
            for (int e = 0; e < HQ * D; e++) q[e] = devk_bf16_to_f32(qh[e]);
            const int pos = i + n - lq; /* bottom-right aligned position of the row */
            const int vis = causal ? (pos + 1 < n ? pos + 1 : n) : n;
            ref_row(q, k, vv, vis < 0 ? 0 : vis, D, ref);
            for (int e = 0; e < HQ * D && !st; e++) {
                const double got = devk_bf16_to_f32(oh[e]);
                if (!(fabs(got - ref[e]) <= atol + rtol * fabs(ref[e]))) {
                    snprintf(msg, cap, "request %d row %d head %d d %d: o = %.6g, ref %.6g", r, i,
                             e / D, e % D, got, ref[e]);
                    st = KILN_STATUS_MISMATCH;
                }
            }
        }
        free(k);
        free(vv);
        free(ref);
    }
    return st;
}

/* ---- steps, filters and CSV rows ---------------------------------------------------------- */

kiln_status brun_step(void *user, int copy)
{
    const brun *rc = user;
    kiln_batch_args a;
    bbufs_args(rc->b, rc->s, copy, &a);
    return kiln_plan_run(rc->plan, &a, NULL);
}

int bench_on(const bench_env *env, const char *name)
{
    return !env->only || !strcmp(env->only, name);
}

void bcsv_row(bench_env *env, const char *name, const char *spec, int B, int L_Q, int L_KV,
              double ms, double gbs, double tf, const char *check)
{
    if (env->csv)
        fprintf(env->csv, "%s,\"%s\",%d,%d,%d,%d,%.5f,%.1f,%.2f,%.0f,%.0f,%s\n", name, spec, B, HQ,
                L_Q, L_KV, ms, gbs, tf, env->copy_gbs, env->read_gbs, check);
}
