/*
 * check.h — run a kernel on fresh random data and compare it with a float64 CPU reference;
 * optionally time it. Shared by `kiln check`, build/bin/kiln-bench and the GPU tests. Linked
 * into the CLI, the bench and the test runner, never into the library.
 */
#ifndef KILN_CHECK_H
#define KILN_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "kiln.h"

typedef struct kiln_check_shape {
    int num_qo_heads; /* H (multiple of the variant's group) */
    int qo_len;       /* L_Q (prefill; decode uses 1) */
    int kv_len;       /* L_KV */
    float sm_scale;   /* 0: 1/sqrt(D) */
    float softcap;    /* used by logits=softcap (0: 30) */
    int window_left;  /* used by window=1 (-1: kv_len / 3) */
    int strided;      /* 1: q, k, v, o live inside wider buffers (non-dense strides) */
    uint64_t seed;    /* random inputs; 0 picks one from the clock */
    int skip_reference; /* 1: time only, no CPU reference (sizes the CPU cannot check) */
    /* Custom variants. The reference evaluates the snippets' meaning through these callbacks,
     * written independently in C (never by compiling the snippet): ref_logits maps the logit
     * after the builtin transform to the new one; ref_mask returns 1 where the key stays
     * visible. ref_user is passed to both. */
    double (*ref_logits)(const void *ref_user, double logits, int qo_idx, int kv_idx, int qo_head,
                         int kv_head, int qo_len, int kv_len);
    int (*ref_mask)(const void *ref_user, int qo_idx, int kv_idx, int qo_head, int kv_head,
                    int qo_len, int kv_len);
    const void *ref_user;
    /* Run-time values of the variant's user parameters; for array parameters user_host[i]
     * (user_bytes[i] bytes) is uploaded and its device address passed instead. */
    kiln_param_value user[KILN_MAX_USER_PARAMS];
    const void *user_host[KILN_MAX_USER_PARAMS];
    size_t user_bytes[KILN_MAX_USER_PARAMS];
    int keep_output;  /* 1: return the kernel's o in kiln_check_result.o (caller frees) */
    /* mask data (host copies, uploaded): bitmask bytes, or BSR arrays with block shape */
    const unsigned char *mask_bits_host;
    const int *bsr_indptr_host, *bsr_indices_host;
    int bsr_rows, bsr_nnz, bsr_r, bsr_c;
    int use_tile_map; /* prefill with element masks: run kiln_prefill_mask_plan first */
} kiln_check_shape;

typedef struct kiln_check_result {
    double max_err;       /* max |out - ref| over o */
    double max_ref;       /* max |ref| */
    double rel_l2;        /* ||out - ref|| / ||ref|| */
    double lse_max_err;   /* max |lse - ref| (variants with lse) */
    long long checked;    /* elements compared */
    long long bad;        /* elements outside atol + rtol*|ref| (NaN counts as bad) */
    double atol, rtol;
    char first_bad[256];  /* first mismatch, "o[i,h,d]=x ref=y" */
    double kernel_ms;     /* median of the timed launches (0 unless timed) */
    double min_ms;        /* fastest timed launch */
    double bytes;         /* minimum HBM traffic of one launch */
    double flops;         /* useful FLOPs of one launch (4*D per visible (i,j) pair per head) */
    double *o;            /* keep_output: o as doubles [L_Q][H][D], malloc'd; else NULL */
} kiln_check_result;

/* Tolerances for a variant: atol and rtol by dtype and logits. */
void kiln_check_tolerance(const kiln_variant *v, double *atol, double *rtol);

/* Run k (a loaded kernel of ctx) on shape s with fresh random inputs, poisoned outputs, compare
 * with the float64 reference. time_reps > 0 also times that many launches (after warm-up) with
 * CUDA events, rotating up to 8 input copies so at least 256 MiB (4x the H200's L2) cycle. Returns
 * KILN_STATUS_MISMATCH when any element is out of tolerance (result filled either way); other
 * statuses for failures, with the message in msg[cap]. */
kiln_status kiln_check_run(kiln_ctx *ctx, kiln_kernel *k, const kiln_check_shape *s,
                           int time_reps, kiln_check_result *r, char *msg, size_t cap);

/* Time a device-to-device copy of `bytes` (read + write counted) and a streaming read; GB/s.
 * For the ceilings in benchmarks. */
kiln_status kiln_check_bandwidth(kiln_ctx *ctx, size_t bytes, double *copy_gbs, char *msg,
                                 size_t cap);

#endif /* KILN_CHECK_H */
