/*
 * check.c — runs a kernel on fresh random inputs and compares it with a float64 CPU
 * reference that evaluates the attention definition directly (no tiling, no online softmax):
 * for each query row and head, the visible keys under the mask, the logits transform, a
 * softmax in double and the weighted sum of V. Inputs are drawn in float, rounded to the
 * kernel's dtype, and the reference reads the rounded values. Outputs are poisoned (NaN)
 * before the launch, so an element the kernel never wrote fails the comparison.
 *
 * Also times launches with CUDA events (rotating input copies so L2 does not flatter) and
 * measures a device-to-device copy for the bandwidth ceiling.
 */
#include "check.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"

#define ROTATE_BYTES (256u << 20) /* keep at least this many input bytes in rotation when timing */
#define MAX_ROTATE   8
#define MAX_THREADS  64

/* ---- random numbers and 16-bit rounding ------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(uint64_t *s) /* in [-1, 1) */
{
    return (float)((double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
    return (uint16_t)half;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (!man) u = sign;
        else {
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_bits(kiln_dtype t, float f)
{
    return t == KILN_DTYPE_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
}
static double from_bits(kiln_dtype t, uint16_t h)
{
    return t == KILN_DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

uint16_t kiln_check_to_bits(kiln_dtype t, float f) { return to_bits(t, f); }
double kiln_check_from_bits(kiln_dtype t, uint16_t h) { return from_bits(t, h); }
uint64_t kiln_check_rng(uint64_t *s) { return rng_next(s); }
float kiln_check_uniform(uint64_t *s) { return rng_uniform(s); }

/* ---- fp8 ------------------------------------------------------------------------------------ */

typedef struct fp8_fmt {
    int mbits, bias;
    double max; /* largest finite value */
} fp8_fmt;

static fp8_fmt fp8_of(kiln_dtype t)
{
    return t == KILN_DTYPE_E5M2 ? (fp8_fmt){2, 15, 57344.0} : (fp8_fmt){3, 7, 448.0};
}

uint8_t kiln_check_fp8_encode(kiln_dtype t, double x)
{
    const fp8_fmt f = fp8_of(t);
    if (isnan(x)) return 0x7f; /* a NaN in both formats */
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs(x);
    if (a == 0) return sign;
    /* the quantum of a's binade, or of the subnormals below the smallest normal */
    int k;
    frexp(a, &k);
    int e = k - 1;
    if (e < 1 - f.bias) e = 1 - f.bias;
    const double quantum = ldexp(1.0, e - f.mbits);
    double r = nearbyint(a / quantum) * quantum; /* ties to even (default rounding mode) */
    if (r > f.max) r = f.max;
    if (r < ldexp(1.0, 1 - f.bias)) /* subnormal (or zero) */
        return (uint8_t)(sign | (int)(r / ldexp(1.0, 1 - f.bias - f.mbits)));
    frexp(r, &k);
    e = k - 1;
    const int man = (int)((r / ldexp(1.0, e) - 1.0) * (1 << f.mbits));
    return (uint8_t)(sign | ((e + f.bias) << f.mbits) | man);
}

double kiln_check_fp8_decode(kiln_dtype t, uint8_t b)
{
    const fp8_fmt f = fp8_of(t);
    const int ebits = 7 - f.mbits, exp = (b >> f.mbits) & ((1 << ebits) - 1),
              man = b & ((1 << f.mbits) - 1);
    const double sign = b & 0x80 ? -1.0 : 1.0;
    if (t == KILN_DTYPE_E4M3 && exp == 15 && man == 7) return NAN;
    if (t == KILN_DTYPE_E5M2 && exp == 31) return man ? NAN : sign * INFINITY;
    if (exp == 0) return sign * ldexp((double)man, 1 - f.bias - f.mbits);
    return sign * ldexp(1.0 + (double)man / (1 << f.mbits), exp - f.bias);
}

double kiln_check_decode(kiln_dtype t, uint16_t code)
{
    if (t == KILN_DTYPE_E4M3 || t == KILN_DTYPE_E5M2)
        return kiln_check_fp8_decode(t, (uint8_t)code);
    return from_bits(t, code);
}

void kiln_check_rope(double *x, int D, double pos, double scale, double theta)
{
    const int half = D / 2;
    if (scale == 0) scale = 1;
    if (theta == 0) theta = 1e4;
    for (int d = 0; d < half; d++) {
        const double angle = pos / scale * pow(theta, -2.0 * d / D);
        const double c = cos(angle), s = sin(angle), a = x[d], b = x[d + half];
        x[d] = a * c - b * s;
        x[d + half] = b * c + a * s;
    }
}

/* ---- the problem: host tensors with strides --------------------------------------------- */

typedef struct problem {
    kiln_variant v;
    int H, H_KV, G, D, L_Q, L_KV, window_left;
    float sm_scale, softcap;
    int64_t qs_n, qs_h, os_n, os_h, ks_n, ks_h; /* element strides (k and v share) */
    size_t q_elems, kv_elems, o_elems;          /* buffer sizes in elements */
    uint16_t *q, *k, *vv;                       /* host inputs (vv: values) */
    float *slopes;                              /* [H] */
    const kiln_check_shape *shape;              /* reference callbacks (custom variants) */
    double *ref_o, *ref_lse;                    /* [L_Q][H][D], [L_Q][H] */
} problem;

void kiln_check_tolerance(const kiln_variant *v, double *atol, double *rtol)
{
    int bf = v->q_dtype == KILN_DTYPE_BF16 || v->out_dtype == KILN_DTYPE_BF16;
    *atol = bf ? 1e-2 : 1e-3;
    *rtol = bf ? 1e-2 : 2e-3;
    if (v->logits != KILN_LOGITS_NONE) {
        *atol = bf ? 1e-2 : 2e-3;
        *rtol = 1e-2;
    }
}

static int visible(const problem *p, int i, int j, int h)
{
    const int off = p->L_KV - p->L_Q;
    if (p->v.mask == KILN_MASK_CAUSAL && j > i + off) return 0;
    if (p->v.window && j < i + off - p->window_left) return 0;
    const kiln_check_shape *s = p->shape;
    if (s && s->ref_mask && !s->ref_mask(s->ref_user, i, j, h, h / p->G, p->L_Q, p->L_KV)) return 0;
    return 1;
}

void kiln_check_message(kiln_status st, const kiln_check_result *r, const char *err, char *msg,
                        size_t cap)
{
    if (st == KILN_STATUS_MISMATCH)
        snprintf(msg, cap, "%lld of %lld elements out of tolerance; first: %s", r->bad, r->checked,
                 r->first_bad);
    else if (st) snprintf(msg, cap, "%s", err);
    else if (cap) msg[0] = 0;
}

/* One thread's share of kiln_check_parallel. */
typedef struct par_job {
    void (*work)(void *arg, int first, int step);
    void *arg;
    int first, step;
} par_job;

static void *par_run(void *job)
{
    par_job *j = job;
    j->work(j->arg, j->first, j->step);
    return NULL;
}

void kiln_check_parallel(void (*work)(void *arg, int first, int step), void *arg, long tasks)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
    if (tasks < nt) nt = tasks > 0 ? (int)tasks : 1;
    pthread_t th[MAX_THREADS];
    par_job jobs[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 0; t < nt; t++) {
        jobs[t] = (par_job){work, arg, t, nt};
        if (t > 0) started[t] = pthread_create(&th[t], NULL, par_run, &jobs[t]) == 0;
    }
    par_run(&jobs[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        else par_run(&jobs[t]); /* failed to start: its share runs here */
    }
}

/* Reference for rows (i, h) with (i * H + h) % step == first. */
static void ref_work(void *arg, int first, int step)
{
    problem *p = arg;
    const int D = p->D, off = p->L_KV - p->L_Q;
    double *qd = malloc(sizeof(double) * (size_t)D);
    double *x = malloc(sizeof(double) * (size_t)p->L_KV);
    double *acc = malloc(sizeof(double) * (size_t)D);
    if (!qd || !x || !acc) goto out;
    for (long r = first; r < (long)p->L_Q * p->H; r += step) {
        const int i = (int)(r / p->H), h = (int)(r % p->H), hk = h / p->G;
        const kiln_dtype qt = p->v.q_dtype, kt = p->v.kv_dtype;
        for (int d = 0; d < D; d++) qd[d] = from_bits(qt, p->q[i * p->qs_n + h * p->qs_h + d]);
        double m = -INFINITY;
        for (int j = 0; j < p->L_KV; j++) {
            if (!visible(p, i, j, h)) {
                x[j] = -INFINITY;
                continue;
            }
            const uint16_t *kr = p->k + j * p->ks_n + hk * p->ks_h;
            double dot = 0;
            for (int d = 0; d < D; d++) dot += qd[d] * from_bits(kt, kr[d]);
            double s = dot * p->sm_scale;
            if (p->v.logits == KILN_LOGITS_SOFTCAP) s = p->softcap * tanh(s / p->softcap);
            if (p->v.logits == KILN_LOGITS_ALIBI)
                s += (double)p->slopes[h] * (double)(j - (i + off));
            if (p->shape && p->shape->ref_logits)
                s = p->shape->ref_logits(p->shape->ref_user, s, i, j, h, hk, p->L_Q, p->L_KV);
            x[j] = s;
            if (s > m) m = s;
        }
        double l = 0;
        for (int d = 0; d < D; d++) acc[d] = 0;
        if (m > -INFINITY) {
            for (int j = 0; j < p->L_KV; j++) {
                if (x[j] == -INFINITY) continue;
                const double w = exp(x[j] - m);
                l += w;
                const uint16_t *vr = p->vv + j * p->ks_n + hk * p->ks_h;
                for (int d = 0; d < D; d++) acc[d] += w * from_bits(kt, vr[d]);
            }
        }
        double *o = p->ref_o + ((size_t)i * p->H + h) * D;
        for (int d = 0; d < D; d++) o[d] = l > 0 ? acc[d] / l : 0;
        p->ref_lse[(size_t)i * p->H + h] = l > 0 ? m + log(l) : -INFINITY;
    }
out:
    free(qd);
    free(x);
    free(acc);
}

static void reference(problem *p) { kiln_check_parallel(ref_work, p, (long)p->L_Q * p->H); }

static long long visible_pairs(const problem *p)
{
    long long n = 0;
    if (p->shape && p->shape->ref_mask) { /* count exactly, head 0 */
        for (int i = 0; i < p->L_Q; i++)
            for (int j = 0; j < p->L_KV; j++) n += visible(p, i, j, 0);
        return n;
    }
    for (int i = 0; i < p->L_Q; i++) {
        const int off = p->L_KV - p->L_Q;
        int lo = 0, hi = p->L_KV; /* [lo, hi) */
        if (p->v.mask == KILN_MASK_CAUSAL && i + off + 1 < hi) hi = i + off + 1;
        if (p->v.window && i + off - p->window_left > lo) lo = i + off - p->window_left;
        if (hi > lo) n += hi - lo;
    }
    return n;
}

/* ---- device side -------------------------------------------------------------------------- */

typedef struct devbufs {
    CUdeviceptr q[MAX_ROTATE], k[MAX_ROTATE], v[MAX_ROTATE];
    CUdeviceptr o, lse, slopes, ws;
    CUdeviceptr user[KILN_MAX_USER_PARAMS];
    CUdeviceptr bits, indptr, indices, tile_map;
    size_t tile_map_bytes;
    int copies;
} devbufs;

static void dev_free(const kiln__cu *cu, devbufs *b)
{
    for (int c = 0; c < MAX_ROTATE; c++) {
        if (b->q[c]) cu->cuMemFree(b->q[c]);
        if (b->k[c]) cu->cuMemFree(b->k[c]);
        if (b->v[c]) cu->cuMemFree(b->v[c]);
    }
    if (b->o) cu->cuMemFree(b->o);
    if (b->lse) cu->cuMemFree(b->lse);
    if (b->slopes) cu->cuMemFree(b->slopes);
    if (b->ws) cu->cuMemFree(b->ws);
    for (int i = 0; i < KILN_MAX_USER_PARAMS; i++)
        if (b->user[i]) cu->cuMemFree(b->user[i]);
    if (b->bits) cu->cuMemFree(b->bits);
    if (b->indptr) cu->cuMemFree(b->indptr);
    if (b->indices) cu->cuMemFree(b->indices);
    if (b->tile_map) cu->cuMemFree(b->tile_map);
    memset(b, 0, sizeof *b);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define CU_TRY(call, what)                                                                         \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            kiln__cu_fail(&e, r_, "check: %s", what);                                              \
            st = KILN_STATUS_CUDA;                                                                 \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

static void fill_args(const problem *p, const devbufs *b, int c, size_t ws_bytes, kiln_attn_args *a)
{
    const kiln_check_shape *s = p->shape;
    memset(a, 0, sizeof *a);
    a->q = b->q[c];
    a->k = b->k[c];
    a->v = b->v[c];
    a->o = b->o;
    a->lse = b->lse;
    a->num_qo_heads = p->H;
    a->qo_len = p->L_Q;
    a->kv_len = p->L_KV;
    a->q_stride_n = p->qs_n;
    a->q_stride_h = p->qs_h;
    a->o_stride_n = p->os_n;
    a->o_stride_h = p->os_h;
    a->k_stride_n = a->v_stride_n = p->ks_n;
    a->k_stride_h = a->v_stride_h = p->ks_h;
    a->workspace = b->ws;
    a->workspace_bytes = ws_bytes;
    a->params.sm_scale = p->sm_scale;
    a->params.softcap = p->softcap;
    a->params.window_left = p->window_left;
    a->params.alibi_slopes = b->slopes;
    for (int i = 0; i < KILN_MAX_USER_PARAMS; i++) {
        a->params.user[i] = s->user[i];
        if (b->user[i]) a->params.user[i].ptr = b->user[i];
    }
    a->mask_bits = b->bits;
    a->bsr_indptr = b->indptr;
    a->bsr_indices = b->indices;
    a->bsr_r = s->bsr_r;
    a->bsr_c = s->bsr_c;
    a->tile_map = b->tile_map;
    a->tile_map_bytes = b->tile_map_bytes;
}

static kiln_status launch(kiln_kernel *k, const problem *p, const kiln_attn_args *a, CUstream s)
{
    (void)p;
    return k->v.op == KILN_OP_DECODE ? kiln_single_decode(k, a, s) : kiln_single_prefill(k, a, s);
}

kiln_status kiln_check_run(kiln_ctx *ctx, kiln_kernel *k, const kiln_check_shape *s, int time_reps,
                           kiln_check_result *r, char *msg, size_t cap)
{
    kiln__err e = {{0}};
    kiln_status st = KILN_STATUS_OK;
    memset(r, 0, sizeof *r);
    problem p = {0};
    devbufs b = {0};
    uint16_t *o_host = NULL;
    float *lse_host = NULL;
    CUevent ev[2] = {0};
    const kiln__cu *cu = ctx ? ctx->cu : NULL;
    if (!cu || !k || !k->loaded) {
        snprintf(msg, cap, "check: no GPU or kernel not loaded (%s)",
                 ctx ? ctx->err.msg : "no context");
        return KILN_STATUS_NO_DEVICE;
    }
    if ((st = kiln__ctx_bind(ctx, &e))) goto done;

    p.v = k->v;
    p.shape = s;
    p.D = k->v.head_dim;
    p.G = k->v.group;
    p.H = s->num_qo_heads;
    if (p.H < p.G || p.H % p.G) {
        st = kiln__fail(&e, KILN_STATUS_INVALID_ARGUMENT,
                        "check: heads=%d must be a multiple of group=%d", p.H, p.G);
        goto done;
    }
    p.H_KV = p.H / p.G;
    p.L_Q = k->v.op == KILN_OP_DECODE ? 1 : s->qo_len;
    p.L_KV = s->kv_len;
    p.sm_scale = s->sm_scale > 0 ? s->sm_scale : 1.0f / sqrtf((float)p.D);
    p.softcap = s->softcap > 0 ? s->softcap : 30.0f;
    p.window_left = s->window_left >= 0 ? s->window_left : p.L_KV / 3;
    const int pad = s->strided ? 8 : 0, D = p.D;
    p.qs_h = D + pad;
    p.qs_n = p.H * p.qs_h + pad;
    p.os_h = D + pad;
    p.os_n = p.H * p.os_h + pad;
    if (k->v.layout == KILN_LAYOUT_NHD) {
        p.ks_h = D + pad;
        p.ks_n = p.H_KV * p.ks_h + pad;
        p.kv_elems = (size_t)p.L_KV * p.ks_n;
    } else {
        p.ks_n = D + pad;
        p.ks_h = p.L_KV * p.ks_n + pad;
        p.kv_elems = (size_t)p.H_KV * p.ks_h;
    }
    p.q_elems = (size_t)(p.L_Q > 0 ? p.L_Q : 1) * p.qs_n;
    p.o_elems = (size_t)(p.L_Q > 0 ? p.L_Q : 1) * p.os_n;

    uint64_t seed =
        s->seed ? s->seed
                : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20) ^ (uint64_t)(uintptr_t)&p;
    p.q = malloc(p.q_elems * 2);
    p.k = malloc(p.kv_elems * 2);
    p.vv = malloc(p.kv_elems * 2);
    p.slopes = malloc(sizeof(float) * (size_t)p.H);
    p.ref_o = malloc(sizeof(double) * (size_t)p.L_Q * p.H * D + 8);
    p.ref_lse = malloc(sizeof(double) * (size_t)p.L_Q * p.H + 8);
    o_host = malloc(p.o_elems * 2);
    lse_host = malloc(sizeof(float) * (size_t)p.L_Q * p.H + 8);
    if (!p.q || !p.k || !p.vv || !p.slopes || !p.ref_o || !p.ref_lse || !o_host || !lse_host) {
        st = kiln__fail(&e, KILN_STATUS_NO_MEMORY, "check: out of host memory");
        goto done;
    }
    /* q is scaled up so the softmax is not flat; padding holds garbage-looking finite values. */
    for (size_t i = 0; i < p.q_elems; i++) p.q[i] = to_bits(p.v.q_dtype, 2.0f * rng_uniform(&seed));
    for (size_t i = 0; i < p.kv_elems; i++) p.k[i] = to_bits(p.v.kv_dtype, rng_uniform(&seed));
    for (size_t i = 0; i < p.kv_elems; i++) p.vv[i] = to_bits(p.v.kv_dtype, rng_uniform(&seed));
    for (int h = 0; h < p.H; h++) p.slopes[h] = exp2f(-8.0f * (float)(h + 1) / (float)p.H);

    /* device buffers; extra copies of the inputs when timing so L2 does not hold them */
    const size_t in_bytes = (p.q_elems + 2 * p.kv_elems) * 2;
    b.copies = 1;
    if (time_reps > 0) {
        size_t c = (ROTATE_BYTES + in_bytes - 1) / in_bytes;
        b.copies = c > MAX_ROTATE ? MAX_ROTATE : (int)c;
    }
    for (int c = 0; c < b.copies; c++) {
        CU_TRY(cu->cuMemAlloc(&b.q[c], p.q_elems * 2), "alloc q");
        CU_TRY(cu->cuMemAlloc(&b.k[c], p.kv_elems * 2), "alloc k");
        CU_TRY(cu->cuMemAlloc(&b.v[c], p.kv_elems * 2), "alloc v");
        CU_TRY(cu->cuMemcpyHtoD(b.q[c], p.q, p.q_elems * 2), "copy q");
        CU_TRY(cu->cuMemcpyHtoD(b.k[c], p.k, p.kv_elems * 2), "copy k");
        CU_TRY(cu->cuMemcpyHtoD(b.v[c], p.vv, p.kv_elems * 2), "copy v");
    }
    CU_TRY(cu->cuMemAlloc(&b.o, p.o_elems * 2), "alloc o");
    CU_TRY(cu->cuMemAlloc(&b.lse, sizeof(float) * (size_t)p.L_Q * p.H + 16), "alloc lse");
    CU_TRY(cu->cuMemAlloc(&b.slopes, sizeof(float) * (size_t)p.H), "alloc slopes");
    CU_TRY(cu->cuMemcpyHtoD(b.slopes, p.slopes, sizeof(float) * (size_t)p.H), "copy slopes");
    if (s->mask_bits_host) {
        const size_t nb = ((size_t)p.L_Q * p.L_KV + 7) / 8 + 1;
        CU_TRY(cu->cuMemAlloc(&b.bits, nb), "alloc mask bits");
        CU_TRY(cu->cuMemcpyHtoD(b.bits, s->mask_bits_host, nb), "copy mask bits");
    }
    if (s->bsr_indptr_host && s->bsr_indices_host) {
        CU_TRY(cu->cuMemAlloc(&b.indptr, sizeof(int) * (size_t)(s->bsr_rows + 1)), "alloc bsr");
        CU_TRY(cu->cuMemcpyHtoD(b.indptr, s->bsr_indptr_host,
                                sizeof(int) * (size_t)(s->bsr_rows + 1)),
               "copy bsr");
        CU_TRY(cu->cuMemAlloc(&b.indices, sizeof(int) * (size_t)(s->bsr_nnz + 1)), "alloc bsr");
        if (s->bsr_nnz)
            CU_TRY(cu->cuMemcpyHtoD(b.indices, s->bsr_indices_host,
                                    sizeof(int) * (size_t)s->bsr_nnz),
                   "copy bsr");
    }
    if (s->use_tile_map && k->v.op == KILN_OP_PREFILL) {
        if ((st = kiln_prefill_mask_plan_size(k, p.L_Q, p.L_KV, &b.tile_map_bytes))) {
            e = ctx->err;
            goto done;
        }
        CU_TRY(cu->cuMemAlloc(&b.tile_map, b.tile_map_bytes + 1), "alloc tile map");
    }
    for (int i = 0; i < KILN_MAX_USER_PARAMS; i++) {
        if (!s->user_host[i] || !s->user_bytes[i]) continue;
        CU_TRY(cu->cuMemAlloc(&b.user[i], s->user_bytes[i]), "alloc user array");
        CU_TRY(cu->cuMemcpyHtoD(b.user[i], s->user_host[i], s->user_bytes[i]), "copy user array");
    }
    size_t ws = 0;
    if (k->v.op == KILN_OP_DECODE) {
        if ((st = kiln_decode_workspace_size(k, p.H, p.L_KV, &ws))) {
            e = ctx->err;
            goto done;
        }
        if (ws) CU_TRY(cu->cuMemAlloc(&b.ws, ws), "alloc workspace");
    }
    /* poison: 0xffff is NaN in f16 and bf16, 0xffffffff is NaN in f32 */
    CU_TRY(cu->cuMemsetD8(b.o, 0xff, p.o_elems * 2), "poison o");
    CU_TRY(cu->cuMemsetD8(b.lse, 0xff, sizeof(float) * (size_t)p.L_Q * p.H + 16), "poison lse");

    kiln_attn_args a;
    fill_args(&p, &b, 0, ws, &a);
    if (b.tile_map && (st = kiln_prefill_mask_plan(k, &a, NULL))) {
        e = ctx->err;
        goto done;
    }
    if ((st = launch(k, &p, &a, NULL))) {
        e = ctx->err;
        goto done;
    }
    CU_TRY(cu->cuCtxSynchronize(), "run kernel");
    CU_TRY(cu->cuMemcpyDtoH(o_host, b.o, p.o_elems * 2), "copy o back");
    CU_TRY(cu->cuMemcpyDtoH(lse_host, b.lse, sizeof(float) * (size_t)p.L_Q * p.H), "copy lse back");

    if (!s->skip_reference) reference(&p);
    kiln_check_tolerance(&p.v, &r->atol, &r->rtol);
    double num = 0, den = 0;
    for (int i = 0; i < (s->skip_reference ? 0 : p.L_Q); i++)
        for (int h = 0; h < p.H; h++) {
            for (int d = 0; d < D; d++) {
                const double ref = p.ref_o[((size_t)i * p.H + h) * D + d];
                const double got = from_bits(p.v.out_dtype, o_host[i * p.os_n + h * p.os_h + d]);
                const double err = fabs(got - ref);
                r->checked++;
                num += (got - ref) * (got - ref);
                den += ref * ref;
                if (fabs(ref) > r->max_ref) r->max_ref = fabs(ref);
                if (!(err <= r->atol + r->rtol * fabs(ref))) {
                    if (!r->bad++)
                        snprintf(r->first_bad, sizeof r->first_bad,
                                 "o[i=%d,h=%d,d=%d] = %.6g, ref %.6g", i, h, d, got, ref);
                }
                if (!(err <= r->max_err))
                    r->max_err = isnan(err) ? INFINITY : err > r->max_err ? err : r->max_err;
            }
            if (p.v.lse) {
                const double ref = p.ref_lse[(size_t)i * p.H + h],
                             got = lse_host[(size_t)i * p.H + h];
                const double err =
                    isinf(ref) && got == ref ? 0.0 : fabs(got - ref); /* empty rows */
                r->checked++;
                if (!(err <= 1e-3 + 1e-3 * fabs(ref))) {
                    if (!r->bad++)
                        snprintf(r->first_bad, sizeof r->first_bad,
                                 "lse[i=%d,h=%d] = %.6g, ref %.6g", i, h, got, ref);
                }
                if (!(err <= r->lse_max_err)) r->lse_max_err = isnan(err) ? INFINITY : err;
            }
        }
    if (s->keep_output) {
        r->o = malloc(sizeof(double) * (size_t)p.L_Q * p.H * D + 8);
        if (r->o)
            for (int i = 0; i < p.L_Q; i++)
                for (int h = 0; h < p.H; h++)
                    for (int d = 0; d < D; d++)
                        r->o[((size_t)i * p.H + h) * D + d] =
                            from_bits(p.v.out_dtype, o_host[i * p.os_n + h * p.os_h + d]);
    }
    r->rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    if (isnan(r->rel_l2)) r->rel_l2 = INFINITY;
    r->flops = 4.0 * D * (double)visible_pairs(&p) * p.H;
    r->bytes = (double)(p.L_Q * (double)p.H * D * 2) * 2 + 2.0 * p.L_KV * p.H_KV * D * 2;

    if (time_reps > 0) {
        double *ms = malloc(sizeof(double) * (size_t)time_reps);
        if (!ms) {
            st = kiln__fail(&e, KILN_STATUS_NO_MEMORY, "check: out of host memory");
            goto done;
        }
        CU_TRY(cu->cuEventCreate(&ev[0], CU_EVENT_DEFAULT), "event");
        CU_TRY(cu->cuEventCreate(&ev[1], CU_EVENT_DEFAULT), "event");
        for (int w = 0; w < 3; w++) {
            fill_args(&p, &b, w % b.copies, ws, &a);
            launch(k, &p, &a, NULL);
        }
        for (int t = 0; t < time_reps; t++) {
            fill_args(&p, &b, t % b.copies, ws, &a);
            cu->cuEventRecord(ev[0], NULL);
            st = launch(k, &p, &a, NULL);
            cu->cuEventRecord(ev[1], NULL);
            if (st) {
                free(ms);
                e = ctx->err;
                goto done;
            }
            cu->cuEventSynchronize(ev[1]);
            float f = 0;
            cu->cuEventElapsedTime(&f, ev[0], ev[1]);
            ms[t] = f;
        }
        qsort(ms, (size_t)time_reps, sizeof *ms, cmp_double);
        r->kernel_ms = ms[time_reps / 2];
        r->min_ms = ms[0];
        free(ms);
    }
    if (r->bad) st = KILN_STATUS_MISMATCH;

done:
    kiln_check_message(st, r, e.msg, msg, cap);
    if (ev[0]) cu->cuEventDestroy(ev[0]);
    if (ev[1]) cu->cuEventDestroy(ev[1]);
    if (cu) dev_free(cu, &b);
    free(p.q);
    free(p.k);
    free(p.vv);
    free(p.slopes);
    free(p.ref_o);
    free(p.ref_lse);
    free(o_host);
    free(lse_host);
    return st;
}

kiln_status kiln_check_bandwidth(kiln_ctx *ctx, size_t bytes, double *copy_gbs, char *msg,
                                 size_t cap)
{
    kiln__err e = {{0}};
    kiln_status st = KILN_STATUS_OK;
    const kiln__cu *cu = ctx ? ctx->cu : NULL;
    CUdeviceptr a = 0, b = 0;
    CUevent ev[2] = {0};
    *copy_gbs = 0;
    if (!cu) {
        snprintf(msg, cap, "bandwidth: no GPU");
        return KILN_STATUS_NO_DEVICE;
    }
    if ((st = kiln__ctx_bind(ctx, &e))) goto done;
    CU_TRY(cu->cuMemAlloc(&a, bytes), "alloc");
    CU_TRY(cu->cuMemAlloc(&b, bytes), "alloc");
    CU_TRY(cu->cuMemsetD8(a, 0x3c, bytes), "fill");
    CU_TRY(cu->cuEventCreate(&ev[0], CU_EVENT_DEFAULT), "event");
    CU_TRY(cu->cuEventCreate(&ev[1], CU_EVENT_DEFAULT), "event");
    double best[31];
    for (int t = 0; t < 33; t++) {
        cu->cuEventRecord(ev[0], NULL);
        CU_TRY(cu->cuMemcpyDtoD(b, a, bytes), "copy");
        cu->cuEventRecord(ev[1], NULL);
        cu->cuEventSynchronize(ev[1]);
        float f = 0;
        cu->cuEventElapsedTime(&f, ev[0], ev[1]);
        if (t >= 2) best[t - 2] = f;
    }
    qsort(best, 31, sizeof best[0], cmp_double);
    *copy_gbs = 2.0 * (double)bytes / (best[15] * 1e-3) / 1e9;
done:
    if (st) snprintf(msg, cap, "%s", e.msg);
    if (ev[0]) cu->cuEventDestroy(ev[0]);
    if (ev[1]) cu->cuEventDestroy(ev[1]);
    if (a) cu->cuMemFree(a);
    if (b) cu->cuMemFree(b);
    return st;
}
