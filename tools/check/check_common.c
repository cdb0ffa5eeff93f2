/*
 * check_common.c — what every checker of the library shares: the tolerances of a variant, the
 * one-line outcome message, the counters a comparison accumulates (o and lse elements, rel_l2),
 * and the thread fan-out the float64 references run on. See check.h and check_internal.h.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "check_internal.h"

#define MAX_THREADS 64

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
