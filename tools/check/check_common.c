/*
 * check_common.c — what every checker of the library shares: the tolerances of a variant, the
 * one-line outcome message, the counters a comparison accumulates (o and lse elements, rel_l2),
 * and the thread fan-out the float64 references run on. See check.h and check_internal.h.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "check_internal.h"

#define MAX_THREADS       64
#define REF_MAX_ROWS      32         /* rows a reference block computes together */
#define REF_SCRATCH_BYTES (4l << 20) /* a block's logits: at most this many bytes a thread */

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

void kiln_check_message(kiln_status st, const kiln_check_result *r, const char *err, char *msg,
                        size_t cap)
{
    if (st == KILN_STATUS_MISMATCH)
        snprintf(msg, cap, "%lld of %lld elements out of tolerance; first: %s", r->bad, r->checked,
                 r->first_bad);
    else if (st) snprintf(msg, cap, "%s", err);
    else if (cap) msg[0] = 0;
}

int kiln__check_o(kiln_check_result *r, double got, double ref, double sums[2])
{
    const double err = fabs(got - ref);
    int first = 0;
    r->checked++;
    sums[0] += (got - ref) * (got - ref);
    sums[1] += ref * ref;
    if (fabs(ref) > r->max_ref) r->max_ref = fabs(ref);
    if (!(err <= r->atol + r->rtol * fabs(ref))) first = !r->bad++;
    if (!(err <= r->max_err)) r->max_err = isnan(err) ? INFINITY : err;
    return first;
}

int kiln__check_lse(kiln_check_result *r, double got, double ref)
{
    const double err = isinf(ref) && got == ref ? 0.0 : fabs(got - ref); /* empty rows */
    int first = 0;
    r->checked++;
    if (!(err <= 1e-3 + 1e-3 * fabs(ref))) first = !r->bad++;
    if (!(err <= r->lse_max_err)) r->lse_max_err = isnan(err) ? INFINITY : err;
    return first;
}

void kiln__check_rel_l2(kiln_check_result *r, const double sums[2])
{
    r->rel_l2 = sums[1] > 0 ? sqrt(sums[0] / sums[1]) : sqrt(sums[0]);
    if (isnan(r->rel_l2)) r->rel_l2 = INFINITY;
}

int kiln__check_ref_rows(int n)
{
    const long fit = (REF_SCRATCH_BYTES / (long)sizeof(double)) / (n > 0 ? n : 1);
    return fit < 1 ? 1 : fit > REF_MAX_ROWS ? REF_MAX_ROWS : (int)fit;
}

int kiln__check_block_alloc(kiln__check_block *b, int rows, int n, int D)
{
    b->qT = malloc(sizeof(double) * (size_t)D * rows);
    b->s = malloc(sizeof(double) * rows);
    b->x = malloc(sizeof(double) * ((size_t)rows * n + 1)); /* + 1: never malloc(0) */
    b->scratch = malloc(sizeof(double) * (size_t)rows * (D + 2));
    b->at = malloc(sizeof(long) * rows);
    b->i = malloc(sizeof(int) * rows);
    b->h = malloc(sizeof(int) * rows);
    b->vis = malloc(sizeof(int) * rows);
    return b->qT && b->s && b->x && b->scratch && b->at && b->i && b->h && b->vis;
}

void kiln__check_block_free(kiln__check_block *b)
{
    free(b->qT);
    free(b->s);
    free(b->x);
    free(b->scratch);
    free(b->at);
    free(b->i);
    free(b->h);
    free(b->vis);
}

void kiln__check_dots(const double *qT, int R, int D, const double *k, double *s)
{
    for (int r = 0; r < R; r++) s[r] = 0;
    int d = 0;
    for (; d + 4 <= D; d += 4) { /* four terms a pass, added in d's order: the same rounding */
        const double k0 = k[d], k1 = k[d + 1], k2 = k[d + 2], k3 = k[d + 3];
        const double *q0 = qT + (size_t)d * R, *q1 = q0 + R, *q2 = q1 + R, *q3 = q2 + R;
        for (int r = 0; r < R; r++)
            s[r] = (((s[r] + q0[r] * k0) + q1[r] * k1) + q2[r] * k2) + q3[r] * k3;
    }
    for (; d < D; d++) {
        const double kd = k[d], *q = qT + (size_t)d * R;
        for (int r = 0; r < R; r++) s[r] += q[r] * kd;
    }
}

void kiln__check_softmax_pv(const kiln__check_block *b, int R, int n, const double *v, int D,
                            double *o, double *lse)
{
    const double *x = b->x;
    const long *at = b->at;
    double *m = b->scratch, *l = b->scratch + R, *acc = b->scratch + 2 * R;
    for (int r = 0; r < R; r++) {
        m[r] = -INFINITY;
        l[r] = 0;
        for (int j = 0; j < n; j++)
            if (x[(size_t)r * n + j] > m[r]) m[r] = x[(size_t)r * n + j];
    }
    for (size_t i = 0; i < (size_t)R * D; i++) acc[i] = 0;
    /* j outermost, four keys a pass: V's rows are read once for the R rows, and each output
     * element adds its four terms in j's order (the same rounding as one at a time) */
    for (int j0 = 0; j0 < n; j0 += 4) {
        const int nj = n - j0 < 4 ? n - j0 : 4;
        for (int r = 0; r < R; r++) {
            double w[4] = {0, 0, 0, 0};
            int live = 0;
            for (int t = 0; t < nj; t++) {
                const double xr = x[(size_t)r * n + j0 + t];
                if (m[r] == -INFINITY || xr == -INFINITY) continue;
                w[t] = exp(xr - m[r]);
                l[r] += w[t];
                live |= 1 << t;
            }
            double *a = acc + (size_t)r * D;
            const double *v0 = v + (size_t)j0 * D;
            if (live == 15) {
                const double *v1 = v0 + D, *v2 = v1 + D, *v3 = v2 + D;
                for (int d = 0; d < D; d++)
                    a[d] = (((a[d] + w[0] * v0[d]) + w[1] * v1[d]) + w[2] * v2[d]) + w[3] * v3[d];
            } else {
                for (int t = 0; t < nj; t++)
                    if (live >> t & 1)
                        for (int d = 0; d < D; d++) a[d] += w[t] * v0[(size_t)t * D + d];
            }
        }
    }
    for (int r = 0; r < R; r++) {
        double *orow = o + (size_t)at[r] * D;
        for (int d = 0; d < D; d++) orow[d] = l[r] > 0 ? acc[(size_t)r * D + d] / l[r] : 0;
        lse[at[r]] = l[r] > 0 ? m[r] + log(l[r]) : -INFINITY;
    }
}

int kiln__check_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
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
