/*
 * runtime.h — the context and kernel objects behind the opaque public handles, shared by
 * ctx.c (devices, errors), policy.c (cache modes), kernel.c (memo → cache → compile → load),
 * launch.c (single launches, the parameter block), batch.c (the plan object: schedule, run) and
 * merge.c (state merges); the invariant-check macros (KILN__ASSERT).
 */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include <pthread.h>

#include "cache.h"
#include "cu.h"
#include "jit.h"
#include "kiln.h"
#include "params.h"

#define KILN__MEMO_BUCKETS 1024

/* Invariant checks: a condition the code itself guarantees (a schedule record inside its
 * request, a workspace offset inside the size asked for), never a check of the caller's input,
 * which returns a status with a message. Compiled in by default (the build the tests use); a
 * release build (`make RELEASE=1`, -DNDEBUG) compiles them out. A failed check is a bug in
 * kiln: it prints file:line and the condition (KILN__ASSERT_LE: and both values) on stderr
 * and aborts, the one place the library may end the process. The condition is not evaluated
 * in a release build, so it must have no side effect. */
#ifdef NDEBUG
#define KILN__ASSERT(cond)    ((void)sizeof(!(cond)))
#define KILN__ASSERT_LE(a, b) ((void)sizeof((a) <= (b)))
#else
#define KILN__ASSERT(cond) ((cond) ? (void)0 : kiln__assert_fail(__FILE__, __LINE__, #cond, NULL))
#define KILN__ASSERT_LE(a, b)                                                                      \
    ((int64_t)(a) <= (int64_t)(b)                                                                  \
         ? (void)0                                                                                 \
         : kiln__assert_fail_le(__FILE__, __LINE__, #a " <= " #b, (int64_t)(a), (int64_t)(b)))
#endif
/* Print "kiln: file:line: invariant failed: cond" and abort (ctx.c). */
_Noreturn void kiln__assert_fail(const char *file, int line, const char *cond, const char *more);
/* The same with both sides of a <= b: "(lhs vs rhs)". */
_Noreturn void kiln__assert_fail_le(const char *file, int line, const char *cond, int64_t a,
                                    int64_t b);

struct kiln_kernel {
    kiln_ctx *ctx;
    kiln_variant v;     /* the variant built (snippets canonical) */
    kiln_variant key_v; /* the memo key's variant (as requested, normalised bytes) */
    char arch[16];
    kiln__config cfg;
    char key[33];
    char spec[KILN__SPEC_MAX];
    char *source, *log, *key_material;
    void *cubin;
    size_t cubin_size;
    int from_cache;
    double compile_ms;
    int registers, smem_total, spill_bytes, stack_bytes; /* smem: static + dynamic per block */
    /* loaded state (only for the context's own arch, with a device) */
    int loaded;
    int building; /* 1 while one thread builds or loads it; others wait on memo_cond */
    CUmodule module;
    CUfunction fn_main, fn_merge, fn_aux; /* merge ops: state, in place, states */
    CUfunction fn_merge_wide; /* batch decode: the merge of tasks of many slots (merge.cuh) */
    int ctas_per_sm;          /* occupancy of fn_main */
    uint64_t memo_hash;
    struct kiln_kernel *next; /* memo chain */
};

struct kiln_ctx {
    pthread_mutex_t memo_lock; /* guards the memo table and each kernel's building flag */
    pthread_cond_t memo_cond;  /* signalled when a kernel stops building */
    pthread_mutex_t err_lock;
    kiln__err err;
    char nodev_why[512]; /* why the context has no device ("" with one): written once by
                            kiln_ctx_create, then only read, so messages about the missing GPU
                            never read err (which other threads write) */
    kiln__cache *cache;  /* NULL with no_cache: the local, writable cache */
    char cache_path[1024];
    kiln__cache *base; /* NULL, or the read-only base cache consulted after cache */
    char base_path[1024];
    int strict;    /* 1: a miss is KILN_STATUS_CACHE_MISS; nothing is compiled */
    int record_fd; /* >= 0: the record manifest, opened O_APPEND (-1: not recording) */
    char record_path[1024];
    int64_t max_bytes;  /* > 0: LRU bound on the local cache's cubin bytes */
    const kiln__cu *cu; /* NULL: compile-only */
    CUdevice dev;
    CUcontext cuctx; /* the device's primary context */
    int set_current; /* 1: create made cuctx current (destroy undoes it) */
    kiln_device_info info;
    int64_t l2_bytes;  /* the device's L2 (0 unknown or compile-only): kiln__job_heads */
    int job_heads_env; /* $KILN_JOB_HEADS at creation (-1 unset): kiln__job_heads' answer */
    int arch_sm;
    kiln_kernel *memo[KILN__MEMO_BUCKETS];
};

/* Record e as the context's last error (and the thread's) and return st. */
kiln_status kiln__ctx_error(kiln_ctx *ctx, kiln_status st, const kiln__err *e);

/* Make the context's CUDA context current on this thread (no-op if already). */
kiln_status kiln__ctx_bind(kiln_ctx *ctx, kiln__err *e);

/* Resolve the cache policy of opts (mode, record file, base cache, size bound) into ctx;
 * ctx->cache is open already (or NULL). policy.c. */
kiln_status kiln__ctx_policy(kiln_ctx *ctx, const kiln_ctx_opts *o, kiln__err *e);
/* Release what kiln__ctx_policy acquired. */
void kiln__ctx_policy_free(kiln_ctx *ctx);
/* Append "<spec> arch=<arch>" to the record manifest (one write, O_APPEND). */
kiln_status kiln__ctx_record(kiln_ctx *ctx, const char *spec, const char *arch, kiln__err *e);

/* The parameter block of a batch run of H query heads (launch.c): the argument checks and
 * run-time values of a single request, the KV strides of the storage, the page table and the
 * RoPE offsets; batch.c adds the schedule. The error is left in e, not recorded. */
kiln_status kiln__batch_prepare(kiln_kernel *k, const kiln_batch_args *a, int H, int page_size,
                                int bsr_r, int bsr_c, kiln_launch_params *p, kiln__err *e);

/* Tests: a plan object that schedules into host memory only, for a kernel that need not be
 * loaded, on a device of `sms` SMs running `ctas_per_sm` CTAs each (batch.c). */
kiln_status kiln__plan_create_host(kiln_kernel *k, const kiln_plan_opts *opts, int sms,
                                   int ctas_per_sm, kiln_plan **out);
/* Tests: the last schedule of such a plan, in ints: header [items, tasks, batch, 0], items of
 * 12 ints at items_off, requests of 8 at reqs_off, tasks of 4 at tasks_off. Lives until the
 * next kiln_plan_schedule or kiln_plan_destroy. */
const int *kiln__plan_last_schedule(const kiln_plan *pl, int *items_off, int *reqs_off,
                                    int *tasks_off);
/* Tests: where the last schedule's records and the fused merge's counters lie, in ints from the
 * start of the int region: counters int [task_bound][scopes] at counters_off (scopes 0: the
 * kernel does not merge its splits, no counters); the region's bytes, and the bytes the last
 * upload copied from its start. */
typedef struct kiln__plan_layout {
    int items_off, reqs_off, tasks_off, counters_off;
    int task_bound, scopes;
    size_t int_bytes, uploaded;
} kiln__plan_layout;
void kiln__plan_last_layout(const kiln_plan *pl, kiln__plan_layout *out);

/* launch.c: the merge kernel of k (grid gx x gy, cfg.merge_threads threads, args: the main
 * kernel's; the wgmma family's second argument, the tensor maps, goes unread) on stream, after
 * its main kernel; wide: the batch decode's kiln_merge_wide (fn_merge_wide) instead. With cfg.pdl a programmatic dependent launch (cuLaunchKernelEx,
 * CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION): scheduled while the main kernel's
 * last CTAs run, its threads wait in the kernel (templates/merge.cuh wait_main_grid); an
 * ordinary cuLaunchKernel without pdl, or on a driver that lacks cuLaunchKernelEx (the wait is
 * then a no-op: the stream has ordered the kernels already). Allocates nothing, never
 * synchronises: a stream capture records it as a kernel node on a programmatic edge. */
CUresult kiln__launch_merge(const kiln_kernel *k, unsigned gx, unsigned gy, int wide,
                            CUstream stream, void **args);

/* launch.c: CTAs along x of a persistent wgmma kernel (cfg.persist) with `jobs` work tiles:
 * as many as fit on the GPU at once, at most one per job (and at least 1). */
unsigned kiln__persistent_grid(const kiln_kernel *k, int64_t jobs);
/* A query token's rows in k's tiles: the group where k packs a KV head's query heads into its
 * rows (pack=1), else 1 (the wgmma family's Q / O boxes and grid, the tile map's rows). */
int kiln__rows_a_token(const kiln_kernel *k);

/* kiln_launch_params.job_heads for k's persistent wgmma grid over num_qo_heads heads whose
 * jobs read kv_tokens keys of each KV head (a batch: all its requests' keys): whole KV heads,
 * as many as keep their K/V within half of L2; 0 (one section of every head) where all fit,
 * the device's L2 is unknown or k has no persistent grid; $KILN_JOB_HEADS where it was set
 * when the context was made (any count is correct: sections order the jobs only). */
int kiln__job_heads(const kiln_kernel *k, int64_t kv_tokens, int num_qo_heads);

/* launch.c: *gx, the CTAs along x (the only grid dimension) of a wgmma kernel with `jobs`
 * (work, head) jobs: the persistent grid's (cfg.persist), else one a job (wgmma_attention.cuh,
 * wg_flat_job). KILN_STATUS_INVALID_ARGUMENT (e says so, for `what`) past what a grid holds. */
kiln_status kiln__wgmma_grid(const kiln_kernel *k, int64_t jobs, const char *what, unsigned *gx,
                             kiln__err *e);

/* tma.c: the Q, K, V and O tensor maps of a wgmma kernel that loads by TMA (cfg.load ==
 * KILN_WGMMA_LOAD_TMA) for the tensors of p; q_rows and kv_rows bound the rows each map covers
 * (the kernel copies only whole tiles by TMA, inside a request). Sets p->o_by_tma: whether O's
 * map is there (O's pointer and strides suit TMA). `what` names the call in messages. A map
 * whose arguments the calling thread encoded lately is copied from its memo, no driver call. */
kiln_status kiln__tma_maps(const kiln_kernel *k, kiln_launch_params *p, const char *what,
                           int64_t q_rows, int64_t kv_rows, kiln_tma_maps *m, kiln__err *e);

/* tma.c: forget the calling thread's memo of encoded maps (tests, before and after a fake
 * driver encodes into it). */
void kiln__tma_memo_clear(void);

#endif /* KILN_RUNTIME_H */
