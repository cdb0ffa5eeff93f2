/*
 * check_batch.h — internals of the batch checker shared by check_batch.c (logical
 * batches, storage, reference, runs), check_run.c (device runs) and check_merge.c (merges, cascades). Not part of
 * the checker's interface (check.h).
 */
#ifndef KILN_CHECK_BATCH_H
#define KILN_CHECK_BATCH_H

#include "check_internal.h"

/* One logical batch: what the reference reads, independent of storage. */
typedef struct cb_logical {
    kiln_variant v;
    int H, H_KV, G, D;
    kiln_check_index ix; /* rows, tokens and (paged) pages of each request */
    uint16_t *q;         /* [total_qo][H][D] q_dtype bits */
    uint16_t *k, *vv;    /* [total_kv][H_KV][D] kv_dtype codes of keys and values (fp8: the byte) */
    int *rope_off;       /* [B] position offsets (0 without rope offsets) */
    int has_rope_off;    /* 1: pass rope_off to the kernel */
    float *slopes;       /* [H] alibi slopes */
    float sm_scale, softcap, k_scale, v_scale, rope_scale, rope_theta;
    int window_left;
    int nan_pool; /* storage: unused slots hold NaN */
    uint64_t garbage_seed;
    /* mask data (variant mask_data), per request in request order as the kernel reads it:
     * request b's bits from bit0[b], its bsr block rows from row0[b] */
    unsigned char *mask_bits;
    size_t mask_bytes;
    int *bsr_indptr, *bsr_indices; /* [bsr_rows + 1], [bsr_nnz] */
    int bsr_rows, bsr_nnz, bsr_r, bsr_c;
    int64_t *bit0;
    int *row0;
} cb_logical;

/* A logical batch laid out for the kernel (host copies, with padding and unused pages). */
typedef struct cb_store {
    void *q, *k, *v; /* q: 16-bit; k, v: esize bytes per element */
    int esize;       /* bytes of a k / v element */
    size_t q_elems, o_elems, kv_elems;
    int64_t qs_n, qs_h, os_n, os_h, ks_page, ks_n, ks_h; /* v shares k's strides */
    int pass_strides; /* 0: hand the kernel 0 (its dense defaults) */
} cb_store;

/* What one run of one batch gave back, in logical order. */
typedef struct cb_out {
    uint16_t *o;              /* [total_qo][H][D] out_dtype bits */
    float *lse;               /* [total_qo][H] */
    kiln_plan_info info;      /* kiln_plan_describe after its kiln_plan_schedule */
    double plan_ms;           /* host time of kiln_plan_schedule */
    double kernel_ms, min_ms; /* timed runs (median, fastest) */
} cb_out;

typedef struct cb_run_opts {
    int strided;       /* padded strides */
    int graph;         /* capture the first run in a CUDA graph; replay it twice for every
                          batch, into poisoned outputs the second time (its outputs are kept) */
    kiln_plan_opts po; /* max_batch, max_qo_tokens, fixed_split, no_split (heads and page size
                          are filled in) */
    int time_reps;     /* > 0: time the last batch's run this many times */
    int scratch;       /* kiln_check_batch.scratch */
} cb_run_opts;

/* Draw a logical batch of variant v with s's lengths and values from seed. */
kiln_status kiln__cb_make(const kiln_variant *v, const kiln_check_batch *s, uint64_t seed,
                          cb_logical *L);
void kiln__cb_free(cb_logical *L);
/* Lay L out; ragged rows and pool pages are sized for at least kv_rows_cap / pool_cap (so that
 * several batches share one set of strides). */
kiln_status kiln__cb_store(const cb_logical *L, int strided, int kv_rows_cap, int pool_cap,
                           cb_store *S);
void kiln__cb_store_free(cb_store *S);
/* Float64 reference: o [total_qo][H][D], lse [total_qo][H] (malloc'd). */
kiln_status kiln__cb_reference(const cb_logical *L, double **o, double **lse);
/* Compare out with the reference, accumulating into r (sums[2]: squared error and squared
 * reference, for rel_l2); *bad_req gets the first bad request when still -1. */
void kiln__cb_compare(const cb_logical *L, const cb_out *out, const double *ref_o,
                      const double *ref_lse, kiln_check_result *r, double sums[2], int *bad_req);
/* Run the n batches Ls with kernel k through one plan and one set of device buffers (sized for
 * the largest), outs[i] for Ls[i]; free each with kiln__cb_out_free. */
kiln_status kiln__cb_run(kiln_ctx *ctx, kiln_kernel *k, const cb_logical *const *Ls, int n,
                         const cb_run_opts *ro, cb_out *outs, kiln__err *e);
void kiln__cb_out_free(cb_out *o);
/* The logical batches a check of s runs from seed: L[0], and in graph mode (s->graph) a second
 * batch L[1] of other lengths within the first's bounds and its window, *n of them. *lens holds
 * the second batch's lengths (malloc'd, or NULL): free it after L. */
kiln_status kiln__cb_make_checked(const kiln_variant *v, const kiln_check_batch *s, uint64_t seed,
                                  cb_logical L[2], int **lens, int *n, kiln__err *e);
/* INVALID_ARGUMENT unless k is a batch kernel (op=decode or prefill, kv=ragged or paged). */
kiln_status kiln__cb_batch_kernel(const kiln_kernel *k, kiln__err *e);
/* The run options of s (strides, graph, plan options) with time_reps timed runs. */
cb_run_opts kiln__cb_run_opts(const kiln_check_batch *s, int time_reps);
/* A seed from the clock when s is 0. */
uint64_t kiln__cb_seed(uint64_t s);

#endif /* KILN_CHECK_BATCH_H */
