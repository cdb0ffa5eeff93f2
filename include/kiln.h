/*
 * kiln.h — the whole public API of kiln, a runtime JIT generator of GPU attention kernels.
 *
 * An attention variant is a plain struct (kiln_variant). kiln turns it into one CUDA source,
 * compiles it with NVRTC for the detected GPU (or any named arch, with no GPU present), stores
 * the cubin in a SQLite cache keyed by an XXH3-128 of everything that shapes the binary, and
 * loads and launches it through the CUDA Driver API on the caller's stream.
 *
 * Shape letters (used in every comment below and in the templates):
 *   H    query heads            H_KV  key/value heads      G  group = H / H_KV
 *   L_Q  query length           L_KV  key/value length     D  head dim
 *
 * Conventions:
 *   - Every function that can fail returns a kiln_status; outputs come last and are NULL/zero
 *     on failure.
 *   - After a failure, kiln_ctx_errmsg(ctx) (or kiln_errmsg() for calls with no context) says
 *     what failed, on what, and why.
 *   - Every _create has a _destroy; _destroy(NULL) is a no-op.
 *   - Returned strings are borrowed; each declaration says how long they live.
 *   - Device pointers are kiln_devptr (a CUdeviceptr value); a stream is a CUstream passed as
 *     void * (NULL is the legacy default stream). This header includes no CUDA header.
 *   - The public structs are ABI: a field never moves, and new fields are appended at the end,
 *     so programs built against an older kiln.h keep working and python/kiln/_lib.py's ctypes
 *     mirror (which lists every field in this order) stays right. That is why some fields sit
 *     after their natural neighbours (kiln_variant's kv and rope, kiln_params' fp8 scales and
 *     RoPE values, kiln_plan_opts' max_total_kv and bsr_r / bsr_c); each struct says so.
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

/* KILN_API marks the public API: the only symbols libkiln.so exports (the library is built
 * with -fvisibility=hidden; everything internal is kiln__ and stays inside it). */
#if defined(__GNUC__) || defined(__clang__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

/* KILN_DEPRECATED marks a name kept for one release after its rename (see "Deprecated names" at
 * the end). Silent by default; define KILN_WARN_DEPRECATED before including kiln.h to have the
 * compiler warn at each use. */
#if defined(KILN_WARN_DEPRECATED) && (defined(__GNUC__) || defined(__clang__))
#define KILN_DEPRECATED(use) __attribute__((deprecated("use " use)))
#else
#define KILN_DEPRECATED(use)
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION_MAJOR  0
#define KILN_VERSION_MINOR  1
#define KILN_VERSION_PATCH  0
#define KILN_VERSION_STRING "0.1.0"

/* ---------------------------------------------------------------------------------------------
 * Status
 * ------------------------------------------------------------------------------------------- */

/* X-macro table: name, short description. */
#define KILN_STATUS_MAP(X)                                                                         \
    X(OK, "ok")                                                                                    \
    X(INVALID_ARGUMENT, "invalid argument")                                                        \
    X(PARSE, "spec does not parse")                                                                \
    X(UNSUPPORTED, "unsupported variant, shape or arch")                                           \
    X(NO_DEVICE, "no usable GPU or CUDA driver")                                                   \
    X(CUDA, "CUDA driver call failed")                                                             \
    X(NVRTC, "NVRTC compile failed")                                                               \
    X(CACHE, "kernel cache failed")                                                                \
    X(CACHE_MISS, "kernel not in cache (strict mode)")                                             \
    X(NOT_FOUND, "not found")                                                                      \
    X(NO_MEMORY, "out of host memory")                                                             \
    X(WORKSPACE, "workspace missing or too small")                                                 \
    X(IO, "file I/O failed")                                                                       \
    X(MISMATCH, "result does not match the reference")

typedef enum kiln_status {
#define KILN__STATUS_ENUM(name, str) KILN_STATUS_##name,
    KILN_STATUS_MAP(KILN__STATUS_ENUM)
#undef KILN__STATUS_ENUM
        KILN_STATUS_COUNT_
} kiln_status;

/* A static string naming the status ("ok", "NVRTC compile failed", ...). Never NULL. */
KILN_API const char *kiln_status_str(kiln_status s);

/* The calling thread's last error message from a call that had no context (spec parsing,
 * kiln_ctx_create). Valid until the next kiln call on this thread. Never NULL ("" if none). */
KILN_API const char *kiln_errmsg(void);

/* ---------------------------------------------------------------------------------------------
 * Variants: what changes the generated code (run-time values live in kiln_params)
 * ------------------------------------------------------------------------------------------- */

typedef enum kiln_op {
    KILN_OP_DECODE = 0,  /* one query token per request: q [H, D] (batch: [B, H, D]) */
    KILN_OP_PREFILL = 1, /* L_Q query tokens: q [L_Q, H, D], tensor cores (mma.sync); with
                            paged KV and a causal mask this is also "append" */
    KILN_OP_MERGE = 2,   /* softmax-state merges (kiln_merge_state*): only dtype and head_dim
                            mean anything; every other field must keep its default */
} kiln_op;

typedef enum kiln_dtype {
    KILN_DTYPE_F16 = 0,  /* IEEE half */
    KILN_DTYPE_BF16 = 1, /* bfloat16 */
    KILN_DTYPE_E4M3 = 2, /* fp8 e4m3 (kv_dtype only; scale in kiln_params.k_scale / v_scale) */
    KILN_DTYPE_E5M2 = 3, /* fp8 e5m2 (kv_dtype only) */
} kiln_dtype;

/* Where k and v live. */
typedef enum kiln_kv_storage {
    KILN_KV_CONTIGUOUS =
        0, /* one request (kiln_single_*): k, v [L_KV, H_KV, D] or [H_KV, L_KV, D] */
    KILN_KV_RAGGED =
        1, /* a batch (kiln_plan_schedule / kiln_plan_run): k, v [total_kv, H_KV, D] (or HND
                               via strides); request b owns rows kv_indptr[b] .. kv_indptr[b+1] */
    KILN_KV_PAGED = 2, /* a batch: a pool of pages, nhd [pages, page_size, H_KV, D] or hnd
                               [pages, H_KV, page_size, D]; request b owns pages
                               kv_indices[kv_indptr[b] .. kv_indptr[b+1]), the last holding
                               kv_last_page_len[b] tokens (1..page_size) */
} kiln_kv_storage;

typedef enum kiln_layout {
    KILN_LAYOUT_NHD = 0, /* k, v [L_KV, H_KV, D]: tokens outermost */
    KILN_LAYOUT_HND = 1, /* k, v [H_KV, L_KV, D]: heads outermost */
} kiln_layout;

typedef enum kiln_mask {
    KILN_MASK_NONE = 0,   /* every key visible */
    KILN_MASK_CAUSAL = 1, /* bottom-right aligned: query i sees keys j <= i + L_KV - L_Q */
} kiln_mask;

/* A mask given as data at run time, AND-ed with the builtin mask, window and mask snippet. */
typedef enum kiln_mask_data {
    KILN_MASK_DATA_NONE = 0,
    KILN_MASK_DATA_BITMASK = 1, /* packed bits, one per (query row, key): bit i * L_KV + j of
                                   the byte array, little-endian within each byte (FlashInfer's
                                   packbits(bitorder="little")); 1 = visible */
    KILN_MASK_DATA_BSR = 2,     /* block-sparse rows: R x C blocks; block row r holds column
                                   blocks bsr_indices[bsr_indptr[r] .. bsr_indptr[r + 1]),
                                   sorted ascending; a key is visible iff its block is listed */
} kiln_mask_data;

typedef enum kiln_logits {
    KILN_LOGITS_NONE = 0,    /* s = sm_scale * q.k */
    KILN_LOGITS_SOFTCAP = 1, /* s = cap * tanh(sm_scale * q.k / cap), before masking */
    KILN_LOGITS_ALIBI = 2,   /* s = sm_scale * q.k + slope[h] * (j - (i + L_KV - L_Q)) */
    /* both, in FlashInfer's order: s = cap * tanh(sm_scale * q.k / cap + slope[h] * (j - (i +
     * L_KV - L_Q))) (the ALiBi term inside the tanh, in units of the capped logit) */
    KILN_LOGITS_SOFTCAP_ALIBI = 3,
} kiln_logits;

typedef uint64_t kiln_devptr; /* a CUdeviceptr */

/* ---- custom variants: snippets and user parameters ----
 * A variant may carry two C expressions ("snippets") that kiln validates with libclang against
 * an allow-list before NVRTC sees them, and canonicalises to their token stream (whitespace and
 * comments never change the key). Inside a snippet these names exist:
 *   logits (float, logits_expr only: the logit after sm_scale and the built-in transform),
 *   batch, qo_idx, kv_idx, qo_head, kv_head, qo_len, kv_len (int),
 *   the declared user parameters, and the functions listed in docs/variants.md.
 * logits_expr gives the new logit (natural units); mask_expr is true where the key stays
 * visible and is AND-ed with the built-in mask and window. */
#define KILN_MAX_SNIPPET     512 /* bytes of one snippet, with its NUL */
#define KILN_MAX_USER_PARAMS 8
#define KILN_MAX_PARAM_NAME  32 /* bytes of a parameter name, with its NUL */

typedef enum kiln_param_type {
    KILN_PARAM_F32 = 0,       /* float scalar, passed by value at run time */
    KILN_PARAM_I32 = 1,       /* int scalar */
    KILN_PARAM_F32_ARRAY = 2, /* const float * on the device; the snippet indexes it */
    KILN_PARAM_I32_ARRAY = 3, /* const int * on the device */
} kiln_param_type;

typedef struct kiln_param_decl {
    char name[KILN_MAX_PARAM_NAME]; /* a C identifier that is not a builtin name */
    kiln_param_type type;
} kiln_param_decl;

/* The value of one user parameter at run time, in declaration order. */
typedef union kiln_param_value {
    float f32;       /* KILN_PARAM_F32 */
    int32_t i32;     /* KILN_PARAM_I32 */
    kiln_devptr ptr; /* the array types */
} kiln_param_value;

/* An attention variant. Zero-initialised fields are not all valid: start from
 * kiln_variant_default() or kiln_variant_parse(). Its canonical text form (the spec) is
 *   op=prefill dtype=bf16 head_dim=128 group=4 layout=nhd mask=causal window=0 logits=softcap lse=0
 * with q_dtype= / kv_dtype= / out_dtype= in place of dtype= when they differ, and, only when
 * present, kv=ragged|paged rope=1 mask_data=... params=name:f32,name:i32,name:f32[],name:i32[]
 * logits_expr="..." mask_expr="..." (quoted, with \" and \\ escapes; the text is the
 * canonical token stream). kv_dtype may be e4m3 or e5m2 (fp8 KV) with q_dtype f16 or bf16;
 * otherwise q_dtype must equal kv_dtype. fp8 KV and rope=1 need kv=ragged or kv=paged (a
 * single request is a batch of one). */
/* ABI order: kv and rope were appended after the snippets. */
typedef struct kiln_variant {
    kiln_op op;               /* decode, prefill or merge */
    kiln_dtype q_dtype;       /* dtype of q; equals kv_dtype, except f16 or bf16 with fp8 KV */
    kiln_dtype kv_dtype;      /* dtype of k and v */
    kiln_dtype out_dtype;     /* dtype of o (may differ from q_dtype) */
    int head_dim;             /* D: 64, 128 or 256 */
    int group;                /* G: query heads per KV head, 1..64 */
    kiln_layout layout;       /* default strides of k and v when the call passes 0 */
    kiln_mask mask;           /* none or causal */
    int window;               /* 1: sliding window, keys j >= i + L_KV - L_Q - window_left */
    kiln_logits logits;       /* logits transform */
    int lse;                  /* 1: also write the log-sum-exp of each query row (natural log) */
    kiln_mask_data mask_data; /* none, bitmask or bsr (arrays in kiln_attn_args) */
    int num_params;           /* user parameters declared in params[] (0..KILN_MAX_USER_PARAMS) */
    kiln_param_decl params[KILN_MAX_USER_PARAMS];
    char logits_expr[KILN_MAX_SNIPPET]; /* "" or a C expression: the new logit */
    char mask_expr[KILN_MAX_SNIPPET];   /* "" or a C expression: key visible */
    kiln_kv_storage kv;                 /* contiguous (single request), ragged or paged (batch) */
    int rope; /* 1: llama-style RoPE applied to q and k inside the kernel */
    /* prefill batches: 0 (any), or 1, 2, 4, 8 or 16: at most that many query tokens per request
     * (speculative-decoding verify, chunked decode). The kernel then packs the query tokens and
     * the group's heads into tensor-core rows, as decode does, and reads each K/V tile once
     * for all of them: decode's bandwidth for few tokens. A plan refuses a longer request. */
    int q_tokens;
} kiln_variant;

/* Fill *v with the documented defaults: op=prefill dtype=f16 head_dim=128 group=1 layout=nhd
 * mask=none window=0 logits=none lse=0. */
KILN_API void kiln_variant_default(kiln_variant *v);

/* Parse a spec line ("key=value" tokens separated by spaces, any order; omitted keys take the
 * defaults above). Unknown keys, bad values, duplicates and garbage fail with KILN_STATUS_PARSE
 * and a message in kiln_errmsg() naming the token and the allowed values. */
KILN_API kiln_status kiln_variant_parse(const char *spec, kiln_variant *out);

/* Write the canonical spec of *v into buf (always NUL-terminated when cap > 0). Returns the
 * length the full text needs, excluding the NUL (like snprintf); 0 if *v is invalid, with the
 * reason in kiln_errmsg(). Format(parse(s)) == s for every canonical s. */
KILN_API size_t kiln_variant_format(const kiln_variant *v, char *buf, size_t cap);

/* Check that *v names a variant kiln can generate; KILN_STATUS_UNSUPPORTED with a message
 * otherwise. A snippet is checked only for being NUL-terminated printable text here: its
 * grammar (libclang, the allow-list) is checked by kiln_variant_parse and when a kernel of the
 * variant is built, which refuse a bad one with the token and the reason. */
KILN_API kiln_status kiln_variant_check(const kiln_variant *v);

/* ---------------------------------------------------------------------------------------------
 * Run-time values: one kernel serves every model with the same variant
 * ------------------------------------------------------------------------------------------- */

/* ABI order: the fp8 scales and RoPE values were appended after user[]. */
typedef struct kiln_params {
    float sm_scale;           /* scale of q.k; 0 means 1/sqrt(D) */
    float softcap;            /* logits=softcap: the cap (> 0) */
    int window_left;          /* window=1: how many keys left of the diagonal stay visible (>= 0) */
    kiln_devptr alibi_slopes; /* logits=alibi: float [H], one slope per query head */
    kiln_param_value user[KILN_MAX_USER_PARAMS]; /* the variant's user parameters, in order */
    float k_scale;    /* fp8 KV: k = k_scale * stored value (0 means 1) */
    float v_scale;    /* v = v_scale * stored value, any KV dtype (0 means 1): with 16-bit KV, o
                         is multiplied by it (FlashInfer's v_scale); > 0 */
    float rope_scale; /* rope=1: positions are divided by it (0 means 1) */
    float rope_theta; /* rope=1: base of the frequencies (0 means 1e4) */
    int lse_base2;    /* variant.lse: 1 writes the LSE in base 2 (log2 of the sum of 2^(s log2 e),
                         FlashInfer's), 0 in natural log (the default) */
} kiln_params;

/* Tensors of one single-request launch. Strides are in elements; the last (D) dimension is
 * always contiguous. q, k, v must be 16-byte aligned with strides that are multiples of 8
 * elements; o 4-byte aligned with even strides; lse and alibi_slopes 4-byte aligned. A stride
 * of 0 means the dense default. */
typedef struct kiln_attn_args {
    kiln_devptr q;    /* decode [H, D]; prefill [L_Q, H, D] */
    kiln_devptr k;    /* nhd [L_KV, H_KV, D]; hnd [H_KV, L_KV, D] */
    kiln_devptr v;    /* like k */
    kiln_devptr o;    /* like q, in out_dtype */
    kiln_devptr lse;  /* variant.lse: float, decode [H], prefill [L_Q, H]; else ignored */
    int num_qo_heads; /* H; must be a multiple of variant.group */
    int qo_len;       /* L_Q (prefill; decode ignores it: 1) */
    int kv_len;       /* L_KV >= 1 */
    int64_t q_stride_n, q_stride_h; /* defaults H*D and D (decode: q_stride_h only) */
    int64_t o_stride_n, o_stride_h; /* defaults H*D and D */
    int64_t k_stride_n, k_stride_h; /* defaults nhd: H_KV*D, D; hnd: D, L_KV*D */
    int64_t v_stride_n, v_stride_h; /* like k */
    kiln_devptr mask_bits;          /* mask_data=bitmask: uint8 [ceil(L_Q * L_KV / 8)] */
    kiln_devptr bsr_indptr;         /* mask_data=bsr: int32 [ceil(L_Q / bsr_r) + 1] */
    kiln_devptr bsr_indices;        /* mask_data=bsr: int32 column-block indices */
    int bsr_r, bsr_c;               /* mask_data=bsr: block rows and columns (>= 1) */
    kiln_devptr tile_map;           /* prefill with a mask snippet or mask data: uint8 tile classes
                                written by kiln_prefill_tile_map (0: none; every tile then
                                evaluates the mask per element) */
    size_t tile_map_bytes;          /* size of tile_map */
    kiln_devptr workspace;          /* decode split-KV partials, 16-byte aligned; see
                                       kiln_decode_workspace_size */
    size_t workspace_bytes;         /* size of workspace */
    kiln_params params;             /* run-time values */
} kiln_attn_args;

/* ---------------------------------------------------------------------------------------------
 * Context
 * ------------------------------------------------------------------------------------------- */

/* What a cache miss does. */
typedef enum kiln_cache_mode {
    KILN_CACHE_MODE_DEFAULT = 0, /* compile on a miss, unless $KILN_STRICT=1 or $KILN_RECORD */
    KILN_CACHE_MODE_COMPILE = 1, /* compile on a miss and store the result */
    KILN_CACHE_MODE_STRICT = 2,  /* a miss is KILN_STATUS_CACHE_MISS naming key and spec; no
                                    compile ever happens (serving hosts) */
    KILN_CACHE_MODE_RECORD = 3,  /* compile on a miss, and append every requested spec and
                                    arch to record_path (a manifest `kiln warm` replays) */
} kiln_cache_mode;

typedef struct kiln_ctx kiln_ctx;       /* opaque; thread-safe */
typedef struct kiln_kernel kiln_kernel; /* opaque; owned by its context */

typedef struct kiln_ctx_opts {
    const char *cache_dir;      /* NULL: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else
                              ~/.cache/kiln; the file is <dir>/kernels.db */
    int no_cache;               /* 1: keep kernels in memory only, never open a database */
    int device;                 /* CUDA device ordinal (default 0) */
    int no_device;              /* 1: compile-only, never touch the driver */
    const char *arch;           /* NULL: the device's arch (sm_90 devices get sm_90a); else a
                              named target such as "sm_80" or "sm_90a" */
    const char *base_cache_dir; /* NULL: $KILN_BASE_CACHE_DIR if set; a read-only cache
                                   (e.g. shipped in the image) consulted after cache_dir;
                                   never written */
    kiln_cache_mode mode;       /* KILN_CACHE_MODE_DEFAULT: $KILN_STRICT / $KILN_RECORD decide */
    const char *record_path;    /* record mode: manifest file each requested spec is appended
                                to (NULL: $KILN_RECORD) */
    int64_t max_cache_bytes;    /* > 0: evict least recently used rows beyond this many cubin
                                bytes after each insert (0: $KILN_CACHE_MAX_BYTES or none) */
} kiln_ctx_opts;

/* Create a context. With no GPU or driver the context is compile-only (kiln_ctx_device
 * reports it) and kiln_kernel_get fails with KILN_STATUS_NO_DEVICE; compile, cache and inspect
 * still work. opts may be NULL for all defaults. */
KILN_API kiln_status kiln_ctx_create(const kiln_ctx_opts *opts, kiln_ctx **out);
KILN_API void kiln_ctx_destroy(kiln_ctx *ctx);

/* Last error message of a call on ctx. Valid until the next failing call on ctx. Never NULL. */
KILN_API const char *kiln_ctx_errmsg(const kiln_ctx *ctx);

typedef struct kiln_device_info {
    int present;        /* 0: compile-only context */
    int ordinal;        /* CUDA ordinal */
    char name[96];      /* e.g. "NVIDIA H200" */
    int sm;             /* compute capability * 10, e.g. 90 */
    int sm_count;       /* multiprocessors */
    int driver_version; /* e.g. 13000 */
    char arch[16];      /* the context's target arch, e.g. "sm_90a" */
} kiln_device_info;

/* Describe the context's device and target arch. */
KILN_API kiln_status kiln_ctx_device(const kiln_ctx *ctx, kiln_device_info *out);

/* Path of the cache database, or "" with no_cache. Lives as long as ctx. */
KILN_API const char *kiln_ctx_cache_path(const kiln_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * Kernels
 * ------------------------------------------------------------------------------------------- */

/* Get the kernel for *v on the context's device, loaded and ready to launch: in-process memo,
 * then the cache, then an NVRTC compile (stored in the cache). The kernel lives as long as ctx.
 * Thread-safe; a memo hit takes no lock held across I/O. */
KILN_API kiln_status kiln_kernel_get(kiln_ctx *ctx, const kiln_variant *v, kiln_kernel **out);

/* Same, from a spec line. */
KILN_API kiln_status kiln_kernel_get_spec(kiln_ctx *ctx, const char *spec, kiln_kernel **out);

/* Compile (or find in the cache) *v for a named arch ("sm_80", "sm_90a", ...; NULL: the
 * context's arch) without loading it; needs no GPU. The kernel lives as long as ctx and can be
 * inspected but not launched unless arch is the context's own. */
KILN_API kiln_status kiln_kernel_compile(kiln_ctx *ctx, const kiln_variant *v, const char *arch,
                                         kiln_kernel **out);

typedef struct kiln_kernel_info {
    char key[33];       /* 32 hex characters of XXH3-128 */
    char arch[16];      /* e.g. "sm_90a" */
    char spec[256];     /* canonical spec, cut to 255 bytes (snippet specs run longer: use
                            kiln_kernel_spec for the whole text) */
    int from_cache;     /* 1: found in the cache; 0: compiled by this process */
    double compile_ms;  /* NVRTC wall time when it was compiled (whoever compiled it) */
    int registers;      /* per thread, from ptxas */
    int smem_bytes;     /* static + dynamic shared memory per block */
    int spill_bytes;    /* spill stores + loads reported by ptxas */
    int stack_bytes;    /* stack frame */
    size_t cubin_bytes; /* size of the cubin */
    int threads;        /* threads per block of the main kernel */
} kiln_kernel_info;

KILN_API kiln_status kiln_kernel_describe(const kiln_kernel *k, kiln_kernel_info *out);

/* Borrowed texts, alive as long as the kernel's context: the exact source compiled, the whole
 * canonical spec, the NVRTC log (with ptxas' resource report), the exact text hashed into the
 * key. */
KILN_API const char *kiln_kernel_source(const kiln_kernel *k);
KILN_API const char *kiln_kernel_spec(const kiln_kernel *k);
KILN_API const char *kiln_kernel_log(const kiln_kernel *k);
/* The kernel family, a static string: "wgmma" (the warp-specialized Hopper prefill, sm_90a),
 * "mma.sync", "simt" (decode on CUDA cores) or "merge" — what `kiln compile` prints. */
KILN_API const char *kiln_kernel_family(const kiln_kernel *k);
KILN_API const char *kiln_kernel_key_material(const kiln_kernel *k);
/* The cubin, alive as long as the context. */
KILN_API const void *kiln_kernel_cubin(const kiln_kernel *k, size_t *size);

/* ---------------------------------------------------------------------------------------------
 * Launches: on the caller's stream, never synchronize, never allocate
 * ------------------------------------------------------------------------------------------- */

/* Bytes of workspace a single decode of this shape needs (0 when one CTA per head group
 * suffices). Never decreases as kv_len grows, so sizing for the longest request covers every
 * shorter one. Pure host arithmetic. */
KILN_API kiln_status kiln_decode_workspace_size(const kiln_kernel *k, int num_qo_heads, int kv_len,
                                                size_t *bytes);

/* Single-request decode: o[h] = softmax(s(q[h], k)) v for each query head h. The kernel must
 * be a decode variant; long L_KV is split across CTAs and merged (needs the workspace). */
KILN_API kiln_status kiln_single_decode(kiln_kernel *k, const kiln_attn_args *a, void *stream);

/* Single-request prefill: every query row i in [0, L_Q) attends to k, v under the variant's
 * mask; causal needs L_Q <= L_KV. */
KILN_API kiln_status kiln_single_prefill(kiln_kernel *k, const kiln_attn_args *a, void *stream);

/* Prefill variants with a mask snippet or mask data: bytes of the tile map for this shape
 * (one byte per query tile x key tile; the wgmma family's query tiles are its warpgroups' 64
 * rows). */
KILN_API kiln_status kiln_prefill_tile_map_size(const kiln_kernel *k, int qo_len, int kv_len,
                                                size_t *bytes);

/* Evaluate the mask once per tile on the GPU (a kernel generated with the variant) and write
 * a->tile_map: 0 = every key of the tile hidden (the tile is skipped), 2 = every key visible
 * under the snippet and mask data (no per-element work for them), 1 = mixed. Re-run it when
 * anything the mask reads changes: user parameters, bits, blocks, qo_len, kv_len,
 * window_left (hidden tiles are skipped, so a stale map can hide visible keys) and, for a
 * snippet that reads a head index, num_qo_heads. Asynchronous on stream;
 * allocates nothing. */
KILN_API kiln_status kiln_prefill_tile_map(kiln_kernel *k, const kiln_attn_args *a, void *stream);

/* ---------------------------------------------------------------------------------------------
 * Batches: schedule on the host, run on the stream (kv=ragged or kv=paged variants)
 *
 * Three steps, FlashInfer's plan / run: a plan object (kiln_plan_create) is made once per
 * kernel and workspace; kiln_plan_schedule, once per batch, reads CPU copies of the index
 * arrays, splits each request's keys over CTAs so that every SM gets about the same work,
 * writes the schedule into the caller's device workspace with one asynchronous copy on the
 * stream, and keeps what run needs; kiln_plan_run then launches a fixed grid and merges the
 * split results: it allocates nothing, never synchronizes and reads the schedule from the
 * workspace, so a run captured in a CUDA graph can be replayed after a new kiln_plan_schedule
 * (same plan object, same workspace, batch within the plan's bounds) with other lengths and
 * contents.
 *
 * Rows: decode has one query row per request (q [B, H, D]); prefill rows of request b are
 * qo_indptr[b] .. qo_indptr[b + 1] of q [total_qo, H, D]. Positions are bottom-right aligned
 * per request: row i of a request with L_Q rows and L_KV keys sits at key position
 * i + L_KV - L_Q (causal keeps j <= that; the window keeps j >= that - window_left). Prefill
 * of a paged cache whose last L_Q keys are the new tokens is "append".
 * RoPE (rope=1): row i is rotated at position i + L_KV - L_Q + offset[b] and key j at
 * j + offset[b] (offset = rope_offsets, or 0), llama style (pairs d, d + D/2, angle
 * pos / rope_scale * rope_theta^(-2d/D)).
 * LSE: natural log of the sum of exp(logit), float [total_qo, H]; -inf for a row that sees
 * no key (its o row is 0).
 * ------------------------------------------------------------------------------------------- */

typedef struct kiln_plan kiln_plan; /* opaque; one per (kernel, workspace); not thread-safe */

/* ABI order: max_total_kv, bsr_r and bsr_c were appended. */
typedef struct kiln_plan_opts {
    int num_qo_heads;     /* H: a multiple of the variant's group */
    int page_size;        /* kv=paged: tokens per page (>= 1) */
    int max_batch;        /* > 0: CUDA-graph mode: the grid is sized for any batch of at most
                          max_batch requests (and max_qo_tokens rows), so one captured run
                          serves every later schedule; 0: the grid fits each schedule exactly */
    int max_qo_tokens;    /* prefill in graph mode: bound on total query rows */
    int fixed_split;      /* > 0: batch-invariant mode: every request's keys are cut into chunks of
                          this many tokens (rounded up to the kernel's key tile) whatever else is
                          in the batch, so its output is bitwise the same in any batch; prefill
                          then never splits (an unsplit query tile is already invariant);
                          0: the planner balances the batch */
    int no_split;         /* 1: never split a request's keys (one CTA per request and head group) */
    int64_t max_total_kv; /* with fixed_split: bound on the sum of the requests' keys, which
                             sizes the workspace for the splits (0: the planner's own bound on
                             split items applies, and a schedule past it fails) */
    int bsr_r, bsr_c;     /* mask_data=bsr: block rows and columns (>= 1); see kiln_batch_args */
} kiln_plan_opts;

/* Create a plan object for a loaded batch kernel (kv=ragged or kv=paged). Creates the CUDA
 * events of its schedule staging ring; the pinned host buffers are allocated (and grown) by
 * kiln_plan_schedule; nothing on the device. */
KILN_API kiln_status kiln_plan_create(kiln_kernel *k, const kiln_plan_opts *opts, kiln_plan **out);
KILN_API void kiln_plan_destroy(kiln_plan *plan);

/* Bytes of device workspace a plan of `batch` requests and `total_qo` query rows uses at most
 * (decode: total_qo = batch): room for every split the planner may choose. A smaller workspace
 * works too: kiln_plan_schedule then splits into no more partial states than fit (down to none,
 * with the same results), and refuses only one too small for the schedule itself (its message
 * names that size). Never decreases with either argument. Pure host arithmetic. */
KILN_API kiln_status kiln_plan_workspace_size(const kiln_plan *plan, int batch, int total_qo,
                                              size_t *bytes);

/* The two parts of that workspace: the schedule (the int region, `schedule_bytes`) and the
 * partial states of the splits (`scratch_bytes`; their sum is kiln_plan_workspace_size's), for
 * kiln_plan_schedule_scratch, which takes them as two buffers. Pure host arithmetic. */
KILN_API kiln_status kiln_plan_workspace_sizes(const kiln_plan *plan, int batch, int total_qo,
                                               size_t *schedule_bytes, size_t *scratch_bytes);

/* The batch as CPU arrays (host memory; only read during the call). */
typedef struct kiln_batch_shape {
    int batch;                   /* B >= 0 requests */
    const int *qo_indptr;        /* prefill: [B + 1], qo_indptr[0] = 0, non-decreasing
                                     (decode: NULL, one row per request) */
    const int *kv_indptr;        /* ragged: [B + 1] token offsets; paged: [B + 1] offsets into
                                     kv_indices; both start at 0 and never decrease */
    const int *kv_last_page_len; /* paged: [B], 1..page_size for a request with pages (ignored
                                     for a request with none) */
} kiln_batch_shape;

/* Schedule a batch: validates the arrays (every problem names the request and the value), picks
 * the split (within what the workspace holds: see kiln_plan_workspace_size), writes the schedule
 * to the workspace (256-byte aligned) with one async copy on stream, and returns. The schedule is
 * staged in one of four pinned host buffers used in turn: a call waits only for the copy out
 * of the buffer it reuses (queued four calls ago), and a batch larger than any before grows
 * them (after waiting for every pending copy). A request with no keys gets o = 0 and
 * lse = -inf; with no rows, nothing. */
KILN_API kiln_status kiln_plan_schedule(kiln_plan *plan, const kiln_batch_shape *shape,
                                        kiln_devptr workspace, size_t workspace_bytes,
                                        void *stream);

/* kiln_plan_schedule with the partial states of the splits in `scratch` rather than in the
 * workspace, which then holds only the schedule (kiln_plan_workspace_sizes: schedule_bytes).
 * The workspace belongs to this plan: its runs and graph replays read it. The scratch is only
 * written and read while a run executes, so plans whose runs are ordered (one stream) may share
 * one scratch buffer, as FlashInfer's wrappers share a float workspace; plans whose runs may
 * overlap may not. A scratch smaller than scratch_bytes holds fewer partial states (the
 * schedule splits less, with the same results); scratch = 0 with scratch_bytes = 0 means no
 * split. Both buffers 256-byte aligned; kiln_batch_args.workspace is then this workspace. */
KILN_API kiln_status kiln_plan_schedule_scratch(kiln_plan *plan, const kiln_batch_shape *shape,
                                                kiln_devptr workspace, size_t workspace_bytes,
                                                kiln_devptr scratch, size_t scratch_bytes,
                                                void *stream);

/* What the last kiln_plan_schedule decided (for tests, benchmarks and `kiln check`). */
typedef struct kiln_plan_info {
    int batch;             /* requests */
    int items;             /* work items (request x query tile x key chunk) */
    int grid;              /* CTAs along x of the main launch (>= items in graph mode) */
    int kv_chunk;          /* keys per split (0: no request was split) */
    int split_items;       /* items that write partial states merged afterwards */
    int merge_tasks;       /* (request, query tile) groups of split items merged: by the merge
                              kernel, or in the batch decode kernels by each group's last CTA */
    int64_t max_item_keys; /* keys of the longest item */
    int64_t total_keys;    /* keys over all query tiles, for one head (each item runs once per
                              head or head group) */
} kiln_plan_info;

KILN_API kiln_status kiln_plan_describe(const kiln_plan *plan, kiln_plan_info *out);

/* Tensors of a batch run. Strides are in elements; 0 means the dense default of the layout.
 * Alignment as in kiln_attn_args, with k/v strides multiples of 16 bytes; kv_indices and
 * rope_offsets 4-byte aligned. */
typedef struct kiln_batch_args {
    kiln_devptr q;   /* [total_qo, H, D] */
    kiln_devptr k;   /* ragged [total_kv, H_KV, D]; paged: the page pool (see kiln_kv_storage) */
    kiln_devptr v;   /* like k */
    kiln_devptr o;   /* like q, in out_dtype */
    kiln_devptr lse; /* variant.lse: float [total_qo, H] */
    kiln_devptr kv_indices;   /* paged: int32 page ids, the array kv_indptr indexes */
    kiln_devptr rope_offsets; /* rope: int32 [B] position offsets, or 0 */
    int64_t q_stride_n, q_stride_h;
    int64_t o_stride_n, o_stride_h;
    int64_t k_stride_page, k_stride_n, k_stride_h; /* paged nhd defaults: page_size*H_KV*D,
                                                      H_KV*D, D; hnd: H_KV*page_size*D, D,
                                                      page_size*D; ragged: -, H_KV*D, D */
    int64_t v_stride_page, v_stride_n, v_stride_h;
    kiln_devptr workspace; /* the one given to kiln_plan_schedule (or _scratch) */
    size_t workspace_bytes;
    kiln_params params;
    /* Mask data, per request, in request order (decode: L_Q = 1 per request):
     * mask_data=bitmask: uint8 packed bits; request b's L_Q x L_KV bits (bit i * L_KV + j of it,
     *   little-endian within a byte) start at bit sum over b' < b of L_Q(b') * L_KV(b'), i.e. the
     *   requests' bit matrices concatenated with no padding;
     * mask_data=bsr: block rows of R = kiln_plan_opts.bsr_r query rows and C = bsr_c keys; request b has
     *   ceil(L_Q / R) block rows, numbered in bsr_indptr from the sum of the earlier requests'
     *   (bsr_indptr: int32 [total block rows + 1]); bsr_indices: int32 column blocks (j / C)
     *   of the request, sorted within each block row. */
    kiln_devptr mask_bits;
    kiln_devptr bsr_indptr, bsr_indices;
} kiln_batch_args;

/* Run the last scheduled batch on stream: no allocation, no synchronisation, no host reads of device
 * memory. Safe to capture in a CUDA graph. Two launches when the schedule may split (the main
 * kernel, then the merge kernel), one otherwise; with KILN_TUNE merge=1 a batch decode's split
 * CTAs merge their own results, in one launch. */
KILN_API kiln_status kiln_plan_run(kiln_plan *plan, const kiln_batch_args *a, void *stream);

/* ---- softmax states ----
 * A state is (v [n, H, D] in the kernel's dtype, lse [n, H] float, natural log) from any
 * kernel with lse=1. Merging two states of the same rows gives the state of the union of
 * their keys; a state with lse = -inf (no keys) contributes nothing (NaN-safe). The kernel is
 * an op=merge variant of the states' dtype and head_dim. */
typedef struct kiln_merge_args {
    kiln_devptr v_a, lse_a;         /* first state (in place: also the output) */
    kiln_devptr v_b, lse_b;         /* second state */
    kiln_devptr v_out, lse_out;     /* merge_state, merge_states: output (lse_out may be 0) */
    kiln_devptr mask;               /* merge_state_in_place: uint8 [n], row merged only where != 0
                                 (0: every row) */
    kiln_devptr v_all, lse_all;     /* merge_states: [n, S, H, D] and [n, S, H] */
    int num_states;                 /* merge_states: S >= 1 */
    int rows;                       /* n >= 0 */
    int num_heads;                  /* H >= 1 */
    int64_t v_stride_n, v_stride_h; /* strides of v_a, v_b and v_out (0: dense [n, H, D]); v_all
                                       and every lse are always dense */
} kiln_merge_args;

KILN_API kiln_status kiln_merge_state(kiln_kernel *k, const kiln_merge_args *a, void *stream);
KILN_API kiln_status kiln_merge_state_in_place(kiln_kernel *k, const kiln_merge_args *a,
                                               void *stream);
KILN_API kiln_status kiln_merge_states(kiln_kernel *k, const kiln_merge_args *a, void *stream);

/* ---------------------------------------------------------------------------------------------
 * Deprecated names (kiln 0.1; removed in 0.2)
 *
 * A plan's verbs were split between kiln_plan_* and kiln_batch_*, and the tile map was called
 * the "mask plan" although it is no kiln_plan. The old names still link (libkiln.so exports
 * them) and do exactly what the new ones do; new code uses the new names.
 * ------------------------------------------------------------------------------------------- */

/* = kiln_plan_schedule */
KILN_API kiln_status kiln_batch_plan(kiln_plan *plan, const kiln_batch_shape *shape,
                                     kiln_devptr workspace, size_t workspace_bytes, void *stream)
    KILN_DEPRECATED("kiln_plan_schedule");
/* = kiln_plan_run */
KILN_API kiln_status kiln_batch_run(kiln_plan *plan, const kiln_batch_args *a, void *stream)
    KILN_DEPRECATED("kiln_plan_run");
/* = kiln_prefill_tile_map_size */
KILN_API kiln_status kiln_prefill_mask_plan_size(const kiln_kernel *k, int qo_len, int kv_len,
                                                 size_t *bytes)
    KILN_DEPRECATED("kiln_prefill_tile_map_size");
/* = kiln_prefill_tile_map */
KILN_API kiln_status kiln_prefill_mask_plan(kiln_kernel *k, const kiln_attn_args *a, void *stream)
    KILN_DEPRECATED("kiln_prefill_tile_map");

/* ---------------------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------------------- */

/* kiln's version string ("0.1.0"). */
KILN_API const char *kiln_version(void);
/* NVRTC's version as "major.minor", e.g. "13.0". Static storage. */
KILN_API const char *kiln_nvrtc_version(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_H */
