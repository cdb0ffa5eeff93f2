/*
 * batch.h — the machinery kiln-bench's batch suites share (batch.c: shapes, buffers, plans,
 * timing, the CPU reference, CSV rows) and the suites of cascade.c (cascade, host overhead) that
 * suites.c (decode, prefill) runs after its own. Bench-only.
 */
#ifndef KILN_BENCH_BATCH_H
#define KILN_BENCH_BATCH_H

#include "bench.h"

#define HQ           32             /* H: query heads */
#define HKV          8              /* H_KV: key/value heads (G = 4) */
#define PAGE         16             /* P: tokens per page */
#define ROTATE_BYTES (256ull << 20) /* rotate input copies while one copy is under this */
#define MAX_COPIES   128
#define REPS         30 /* timed runs; the median is reported */
#define WARM         3  /* untimed runs first */

/* Spec pieces: DEC(BF16, 128) is the paged bf16 d128 decode. */
#define DEC(dt, d)    "op=decode " dt " head_dim=" #d " group=4 kv=paged"
#define BF16          "dtype=bf16"
#define FP8           "q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16"
#define PRE(kv, mask) "op=prefill dtype=bf16 head_dim=128 group=4" mask " kv=" kv

/* A batch on the host: per-request lengths and the arrays kiln_plan_schedule reads. */
typedef struct bshape {
    int B, paged;
    int *qo_len, *kv_len;              /* [B] */
    int *qo_indptr;                    /* [B + 1]; NULL for decode (one row per request) */
    int *kv_indptr;                    /* [B + 1]: ragged token offsets, paged page offsets */
    int *last;                         /* [B] paged: tokens in the last page (ragged: unused) */
    int64_t total_qo, total_kv, n_idx; /* rows, tokens, page ids (paged) */
} bshape;

/* Device buffers of one point. */
typedef struct bbufs {
    int copies, paged, D, elt; /* elt: bytes of one K/V element (2 bf16, 1 fp8) */
    int64_t pool_units;        /* per copy: pages (paged) or tokens (ragged) */
    size_t q_bytes, kv_bytes;  /* one copy of q; one copy of k (v alike) */
    CUdeviceptr q, k, v, o, lse, idx, ws;
    size_t ws_bytes;
    int *idx_host; /* paged: copies x n_idx page ids */
} bbufs;

/* One timed step: everything a point launches for copy c. */
typedef kiln_status (*step_fn)(void *user, int copy);

/* One planned batch: the plan, its buffers and its shape (borrowed). */
typedef struct brun {
    kiln_plan *plan;
    const bbufs *b;
    const bshape *s;
} brun;
/* The step of a brun (user): kiln_plan_run of copy `copy` of its buffers. */
kiln_status brun_step(void *user, int copy);

/* B requests; qo_len[b] = qo (0: decode, one row each) and kv_len[b] = kvl[b]. 0 or -1 (no
 * host memory). */
int bshape_make(bshape *s, int B, int qo, const int *kvl, int paged);
void bshape_free(bshape *s);
/* Allocate and fill b (b->copies set by the caller). Paged pools hold copies x pool_units
 * pages; with idx (copy 0's page table, s->n_idx ids; copies 1) the caller places the pages,
 * otherwise every request owns pages at shuffled places. KILN_STATUS_NO_MEMORY when the
 * device is full. */
kiln_status bbufs_alloc(bench_env *env, bbufs *b, const bshape *s, int paged, int D, int elt,
                        int64_t pool_units, const int *idx, char *msg, size_t cap);
void bbufs_free(bench_env *env, bbufs *b);
/* kiln_batch_args of copy `copy` of b. */
void bbufs_args(const bbufs *b, const bshape *s, int copy, kiln_batch_args *a);
/* Create a plan for k, allocate its workspace into b, plan s on the default stream. */
kiln_status bplan_make(bench_env *env, kiln_kernel *k, const bshape *s, bbufs *b, kiln_plan **plan,
                       char *msg, size_t cap);
/* Median ms of REPS steps after WARM, rotating over `copies`. */
kiln_status btime_steps(bench_env *env, step_fn fn, void *user, int copies, double *med, char *msg,
                        size_t cap);
/* o (copy 0) against the float64 reference on requests 0 and B-1 (prefill rows 0, L/2, L-1);
 * KILN_STATUS_MISMATCH with the first bad element in msg. */
kiln_status bcheck_rows(bench_env *env, const kiln_variant *v, const bbufs *b, const bshape *s,
                        int causal, char *msg, size_t cap);
/* One CSV row in kiln-bench --batch's columns. */
void bcsv_row(bench_env *env, const char *name, const char *spec, int B, int L_Q, int L_KV,
              double ms, double gbs, double tf, const char *check);
int bench_on(const bench_env *env, const char *name); /* the --only filter */
uint64_t brng(uint64_t *x);                           /* a small LCG */
int bcmp_d(const void *a, const void *b);             /* qsort of doubles */

/* cascade.c */
extern const char *const cascade_name, *const host_name;
void cascade_suite(bench_env *env);
void host_suite(bench_env *env);

#endif /* KILN_BENCH_BATCH_H */
