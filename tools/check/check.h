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
    int num_qo_heads;   /* H (multiple of the variant's group) */
    int qo_len;         /* L_Q (prefill; decode uses 1) */
    int kv_len;         /* L_KV */
    float sm_scale;     /* 0: 1/sqrt(D) */
    float softcap;      /* used by logits=softcap (0: 30) */
    int window_left;    /* used by window=1 (-1: kv_len / 3) */
    int strided;        /* 1: q, k, v, o live inside wider buffers (non-dense strides) */
    uint64_t seed;      /* random inputs; 0 picks one from the clock */
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
    int keep_output; /* 1: return the kernel's o in kiln_check_result.o (caller frees) */
    /* mask data (host copies, uploaded): bitmask bytes, or BSR arrays with block shape */
    const unsigned char *mask_bits_host;
    const int *bsr_indptr_host, *bsr_indices_host;
    int bsr_rows, bsr_nnz, bsr_r, bsr_c;
    int use_tile_map; /* prefill with element masks: run kiln_prefill_tile_map first */
} kiln_check_shape;

typedef struct kiln_check_result {
    double max_err;     /* max |out - ref| over o */
    double max_ref;     /* max |ref| */
    double rel_l2;      /* ||out - ref|| / ||ref|| */
    double lse_max_err; /* max |lse - ref| (variants with lse) */
    long long checked;  /* elements compared */
    long long bad;      /* elements outside atol + rtol*|ref| (NaN counts as bad) */
    double atol, rtol;
    char first_bad[256]; /* first mismatch, "o[i,h,d]=x ref=y" */
    double kernel_ms;    /* median of the timed launches (0 unless timed) */
    double min_ms;       /* fastest timed launch */
    double bytes;        /* minimum HBM traffic of one launch */
    double flops;        /* useful FLOPs of one launch (4*D per visible (i,j) pair per head) */
    double *o;           /* keep_output: o as doubles [L_Q][H][D], malloc'd; else NULL */
} kiln_check_result;

/* Tolerances for a variant: atol and rtol by dtype and logits. */
void kiln_check_tolerance(const kiln_variant *v, double *atol, double *rtol);

/* Run k (a loaded kernel of ctx) on shape s with fresh random inputs, poisoned outputs, compare
 * with the float64 reference. time_reps > 0 also times that many launches (after warm-up) with
 * CUDA events, rotating up to 8 input copies so at least 256 MiB (4x the H200's L2) cycle. Returns
 * KILN_STATUS_MISMATCH when any element is out of tolerance (result filled either way); other
 * statuses for failures, with the message in msg[cap]. */
kiln_status kiln_check_run(kiln_ctx *ctx, kiln_kernel *k, const kiln_check_shape *s, int time_reps,
                           kiln_check_result *r, char *msg, size_t cap);

/* Time a device-to-device copy of `bytes` (read + write counted) and a streaming read; GB/s.
 * For the ceilings in benchmarks. */
kiln_status kiln_check_bandwidth(kiln_ctx *ctx, size_t bytes, double *copy_gbs, char *msg,
                                 size_t cap);

/* ---- element codecs and random numbers (shared by the batch checker and the tests) ---- */

/* Round f to the 16-bit dtype t (f16 or bf16; round to nearest even) and back. */
uint16_t kiln_check_to_bits(kiln_dtype t, float f);
double kiln_check_from_bits(kiln_dtype t, uint16_t h);
/* fp8 (t = KILN_DTYPE_E4M3: 1 sign, 4 exponent bits, bias 7, 3 mantissa bits, no inf, max 448;
 * KILN_DTYPE_E5M2: 1, 5, bias 15, 2, max 57344): x rounded to nearest even, saturated to the
 * largest finite value (NaN stays NaN), and the value of a byte (subnormals included). */
uint8_t kiln_check_fp8_encode(kiln_dtype t, double x);
double kiln_check_fp8_decode(kiln_dtype t, uint8_t b);
/* The value of a stored element code of any dtype (16-bit bits, or an fp8 byte). */
double kiln_check_decode(kiln_dtype t, uint16_t code);
/* splitmix64: the next 64 random bits of *s, and a float in [-1, 1). */
/* The one-line outcome of a check into msg[cap]: "N of M elements out of tolerance; first: ..."
 * for a mismatch, err for another failure, "" for success. */
void kiln_check_message(kiln_status st, const kiln_check_result *r, const char *err, char *msg,
                        size_t cap);

/* Run work(arg, first, step) for first = 0 .. nt-1 with step = nt on up to one thread per
 * CPU (at most `tasks` threads; the caller's thread takes first = 0). */
void kiln_check_parallel(void (*work)(void *arg, int first, int step), void *arg, long tasks);

uint64_t kiln_check_rng(uint64_t *s);
float kiln_check_uniform(uint64_t *s);
/* llama RoPE of one head vector x[D] at position pos, in place (pairs d, d + D/2; angle
 * pos / scale * theta^(-2d/D); scale 0 means 1, theta 0 means 1e4). */
void kiln_check_rope(double *x, int D, double pos, double scale, double theta);

/* ---- batches (check_batch.c, check_run.c) ------------------------------------------------------ *
 * A batch check builds one logical batch of B requests from a seed (q rows, keys and values
 * per request), stores it the way the variant says (kv=ragged: [total_kv, H_KV, D] or HND via
 * strides; kv=paged: a pool of pages bigger than needed, pages in random order, odd last
 * pages), runs kiln_plan_create → kiln_plan_schedule → kiln_plan_run, and compares every row
 * of every request with a float64 reference of the header's batch semantics (bottom-right
 * aligned positions per request, causal, window, softcap, alibi, RoPE, fp8 scales, -inf lse
 * and zero o for rows that see no key). */

/* Index arrays of a batch, as kiln_plan_schedule reads them (all malloc'd; free with
 * kiln_check_index_free). */
typedef struct kiln_check_index {
    int batch;          /* B */
    int total_qo;       /* rows over all requests */
    int total_kv;       /* keys over all requests */
    int page_size;      /* P (paged; 0 when built for ragged only) */
    int pages_used;     /* pages over all requests */
    int pool_pages;     /* pages in the pool (>= pages_used) */
    int *qo_indptr;     /* [B + 1] row offsets */
    int *kv_indptr;     /* [B + 1] token offsets (ragged kv_indptr) */
    int *page_indptr;   /* [B + 1] offsets into page_ids (paged kv_indptr) */
    int *page_ids;      /* [pages_used + 1] pool pages of each request, in order */
    int *last_page_len; /* [B] tokens in each request's last page (1..P; 0 with no pages) */
} kiln_check_index;

/* Build the index arrays of B requests with qo_lens[b] rows (NULL: one row each, decode) and
 * kv_lens[b] keys, pages of page_size tokens (<= 0: ragged only) drawn from a pool of
 * pages_used + extra_pages pages, in random pool order when shuffle is set (seeded). Returns
 * KILN_STATUS_INVALID_ARGUMENT for a negative length, KILN_STATUS_NO_MEMORY. */
kiln_status kiln_check_index_build(int batch, const int *qo_lens, const int *kv_lens, int page_size,
                                   int shuffle, int extra_pages, uint64_t seed,
                                   kiln_check_index *out);
void kiln_check_index_free(kiln_check_index *x);
/* 0 when x is consistent (offsets start at 0 and never decrease, pages distinct and inside the
 * pool, each request's pages hold exactly its keys); else -1 with the first problem in msg. */
int kiln_check_index_verify(const kiln_check_index *x, char *msg, size_t cap);

/* Per-request lengths drawn uniformly from [lo, hi] (seeded). */
void kiln_check_lens_uniform(int *out, int n, int lo, int hi, uint64_t seed);

typedef struct kiln_check_batch {
    int batch;                    /* B */
    const int *qo_lens;           /* [B] prefill rows per request (decode: ignored, one each) */
    const int *kv_lens;           /* [B] keys per request (0 allowed: o = 0, lse = -inf) */
    int num_qo_heads;             /* H (multiple of the variant's group) */
    int page_size;                /* kv=paged: P (0: 16) */
    float sm_scale;               /* 0: 1/sqrt(D) */
    float softcap;                /* logits=softcap (0: 30) */
    int window_left;              /* window=1 (-1: a third of the mean non-zero kv length) */
    float k_scale, v_scale;       /* fp8 KV (0: 0.75 and 1.25, so the scales matter) */
    float rope_scale, rope_theta; /* rope=1 (0: the header's defaults) */
    int rope_offsets;   /* rope=1: 1 passes random per-request position offsets (< 1000) */
    int strided;        /* 1: padded token, head and page strides for q, k, v and o */
    int no_shuffle;     /* 1: pages in pool order (default: random order) */
    int extra_pages;    /* unused pages in the pool (-1: none; 0: about a third more) */
    int nan_pool;       /* 1: unused pool slots and padding hold NaN (else large finite values) */
    int max_batch;      /* plan option (graph mode; 0: off unless graph) */
    int max_qo_tokens;  /* plan option (graph prefill) */
    int fixed_split;    /* plan option: batch-invariant chunks */
    int no_split;       /* plan option */
    int graph;          /* 1: capture kiln_plan_run in a CUDA graph on a stream, replay it, then
                            plan a second batch of other lengths (same bounds) into the same
                            workspace, replay again and check both; each batch's graph is
                            launched twice, o and lse poisoned before the second launch, whose
                            outputs are the ones checked (it runs on what the first left in
                            the workspace, with no schedule between) */
    uint64_t seed;      /* 0 picks one from the clock */
    int skip_reference; /* 1: time only */
    int bsr_r, bsr_c;   /* mask_data=bsr: block shape (0: 7 rows by 40 keys); mask data is
                            drawn at random per request (some rows empty, some full) */
    int scratch;        /* 1: the partial states in a scratch buffer of their own
                            (kiln_plan_schedule_scratch), shared with a second plan of the same
                            kernel that is scheduled and run on it (the batch's first half of
                            the requests, its outputs elsewhere) after every schedule and before
                            every run or replay of the checked batch */
} kiln_check_batch;

typedef struct kiln_check_batch_result {
    kiln_check_result r; /* over every row of every request (and the graph's second batch) */
    kiln_plan_info plan; /* what the (first) kiln_plan_schedule decided */
    int bad_request;     /* first request with a mismatch (-1: none) */
    int batches;         /* batches checked (2 in graph mode) */
    double plan_ms;      /* host time of the first kiln_plan_schedule call */
    uint64_t seed;       /* the seed used */
} kiln_check_batch_result;

/* Check a batch kernel k (kv=ragged or kv=paged) on s. time_reps > 0 also times that many
 * runs (graph launches in graph mode) with CUDA events: median in r->r.kernel_ms. Returns
 * KILN_STATUS_MISMATCH when an element is out of tolerance, other statuses for failures (the
 * message in msg[cap]). */
kiln_status kiln_check_batch_run(kiln_ctx *ctx, kiln_kernel *k, const kiln_check_batch *s,
                                 int time_reps, kiln_check_batch_result *r, char *msg, size_t cap);

/* Outcome of a comparison of two runs of the same logical batch. */
typedef struct kiln_check_pair {
    kiln_plan_info a, b; /* the two plans */
    int same_split;      /* the plans cut the keys alike (items and kv_chunk equal) */
    long long compared;  /* o and lse elements compared */
    long long differ;    /* elements whose bits differ */
    double max_diff;     /* max |a - b| over o */
    int bitwise;         /* every bit equal */
    char first[256];     /* first difference */
} kiln_check_pair;

/* The same logical batch stored paged (k_paged, kv=paged) and ragged (k_ragged, kv=ragged;
 * the variants equal otherwise) must agree: bitwise when both plans split alike, else within
 * the variant's tolerance (p->bitwise and p->same_split say which held). MISMATCH otherwise. */
kiln_status kiln_check_batch_equiv(kiln_ctx *ctx, kiln_kernel *k_paged, kiln_kernel *k_ragged,
                                   const kiln_check_batch *s, kiln_check_pair *p, char *msg,
                                   size_t cap);

/* The batch kernel k_batch (kv=ragged) and the single-request kernel k_single (kv=contiguous,
 * the variants equal otherwise, no mask data) on the same data: every request with rows and
 * keys run alone through kiln_single_decode / kiln_single_prefill must agree with its rows of
 * the batch run within the variant's tolerance (p->bitwise says whether every bit matched;
 * p->a is the batch plan). MISMATCH otherwise. */
kiln_status kiln_check_batch_vs_single(kiln_ctx *ctx, kiln_kernel *k_batch, kiln_kernel *k_single,
                                       const kiln_check_batch *s, kiln_check_pair *p, char *msg,
                                       size_t cap);

/* Two kernels of one variant whose configs differ (built under different KILN_TUNE, so from
 * two contexts on one device: the memo is keyed by the variant), each run in its own context
 * on the same batches of s (in graph mode both of kiln_check_batch_run's, replayed as there):
 * their plans must split alike (the planner reads the kernel's CTAs per SM) and o and lse
 * must be bitwise equal. p->a and p->b are k_a's and k_b's plans of the first batch. MISMATCH
 * otherwise. */
kiln_status kiln_check_batch_same(kiln_kernel *k_a, kiln_kernel *k_b, const kiln_check_batch *s,
                                  kiln_check_pair *p, char *msg, size_t cap);

/* Batch invariance (s->fixed_split > 0): request `req` of batch s, run alone and inside s,
 * gives bitwise identical o (and lse). MISMATCH otherwise. */
kiln_status kiln_check_batch_invariance(kiln_ctx *ctx, kiln_kernel *k, const kiln_check_batch *s,
                                        int req, kiln_check_pair *p, char *msg, size_t cap);

/* ---- softmax-state merges and cascades (check_merge.c) ----------------------------- */

typedef enum kiln_check_merge_op {
    KILN_CHECK_MERGE_STATE = 0,    /* kiln_merge_state */
    KILN_CHECK_MERGE_IN_PLACE = 1, /* kiln_merge_state_in_place, with a random row mask */
    KILN_CHECK_MERGE_STATES = 2,   /* kiln_merge_states over num_states states */
} kiln_check_merge_op;

typedef struct kiln_check_merge_shape {
    int rows, num_heads; /* n, H */
    int num_states;      /* merge_states: S (0: 3) */
    int strided;         /* merge_state / in place: padded v strides */
    uint64_t seed;
} kiln_check_merge_shape;

/* Random states (lse in [-8, 8], about one in five -inf, some rows -inf in every state) merged
 * by k (an op=merge kernel) against a float64 merge: rows with no keys anywhere must give
 * v = 0 and lse = -inf; masked-off rows of the in-place merge must keep their bits. */
kiln_status kiln_check_merge(kiln_ctx *ctx, kiln_kernel *k, kiln_check_merge_op op,
                             const kiln_check_merge_shape *s, kiln_check_result *r, char *msg,
                             size_t cap);

/* Cascade: B decode queries share a prefix of prefix_len keys. The prefix is computed once as a
 * one-request non-causal batch prefill (k_prefix: op=prefill, kv=ragged or paged, lse=1) whose
 * B rows are the queries; each request's private keys (s->kv_lens) as a batch decode
 * (k_decode: op=decode, kv=paged, lse=1); the two states merged with kiln_merge_state (k_merge)
 * must match the float64 reference of a plain decode over prefix + private keys. */
kiln_status kiln_check_cascade(kiln_ctx *ctx, kiln_kernel *k_prefix, kiln_kernel *k_decode,
                               kiln_kernel *k_merge, const kiln_check_batch *s, int prefix_len,
                               kiln_check_result *r, char *msg, size_t cap);

#endif /* KILN_CHECK_H */
