/*
 * jit.h — variant → canonical spec → tile config → one CUDA source → key → NVRTC cubin.
 *
 * The jit module knows nothing of the cache's storage format or of the CUDA driver: it turns a
 * kiln_variant and a target arch into a self-contained source, the exact key material and a
 * cubin with its resource report.
 */
#ifndef KILN_JIT_H
#define KILN_JIT_H

#include <stddef.h>

#include "kiln.h"
#include "util.h"

/* Bump when anything in the key material's layout or the cache row meaning changes. */
#define KILN__FORMAT_VERSION 1

/* Longest canonical spec (bytes, with NUL): the fixed keys (under 160 bytes), mask_data=,
 * params= with every parameter at its longest name, and both snippets with every byte escaped
 * (canonical snippets have nothing to escape; hand-made ones may). */
#define KILN__SPEC_MAX                                                                             \
    (192 + 8 + KILN_MAX_USER_PARAMS * (KILN_MAX_PARAM_NAME + 7) + 2 * (16 + 2 * KILN_MAX_SNIPPET))
/* Longest spec line the parser reads (bytes, without the NUL). */
#define KILN__SPEC_INPUT_MAX 4096

/* ---- spec (jit/spec.c) ---------------------------------------------------------------------- */

/* Parse a spec; on failure e says which token and what is allowed. */
kiln_status kiln__spec_parse(const char *spec, kiln_variant *out, kiln__err *e);
/* Validate the values of *v (ranges, combinations kiln can generate). */
kiln_status kiln__variant_check(const kiln_variant *v, kiln__err *e);
/* Canonical text into buf[cap]; returns needed length or 0 (with e) on an invalid variant. */
size_t kiln__spec_format(const kiln_variant *v, char *buf, size_t cap, kiln__err *e);
/* Names of enum values, for messages and the spec ("decode", "bf16", ...). */
const char *kiln__op_name(kiln_op op);
const char *kiln__dtype_name(kiln_dtype t);
const char *kiln__kv_name(kiln_kv_storage k);
const char *kiln__layout_name(kiln_layout l);
const char *kiln__mask_name(kiln_mask m);
const char *kiln__logits_name(kiln_logits l);

/* ---- arch (jit/arch.c) ---------------------------------------------------------------------- */

/* Normalise an arch name: "sm_90" → "sm_90a" (Hopper's arch-specific target), "90" → "sm_90a",
 * "sm_80" stays. A target NVRTC offers below sm_80 (sm_75) → KILN_STATUS_UNSUPPORTED; any other
 * refused name (not of the form, no such target) → KILN_STATUS_INVALID_ARGUMENT, with the archs
 * NVRTC offers in the message. Checks the form only, asking NVRTC (its memo) about a refused
 * name alone; whether NVRTC offers an accepted one is kiln__arch_offered's. out has 16 bytes. */
kiln_status kiln__arch_normalize(const char *in, char out[16], kiln__err *e);
/* Compute capability * 10 of a normalised arch ("sm_90a" → 90). */
int kiln__arch_sm(const char *arch);
/* Arch string for a compute capability (90 → "sm_90a"). */
void kiln__arch_from_sm(int sm, char out[16]);
/* Normalised archs >= sm_80 the installed NVRTC supports, ascending, NULL-terminated, static
 * storage (computed once, thread-safe); *count gets their number when count is non-NULL. */
const char *const *kiln__arch_all(int *count);
/* KILN_STATUS_OK when the installed NVRTC compiles for a normalised arch (or cannot list its
 * archs); KILN_STATUS_INVALID_ARGUMENT naming the archs it offers otherwise (sm_101 and sm_999
 * pass kiln__arch_normalize and fail here). Loads NVRTC: called before a compile, never on a
 * cache hit. */
kiln_status kiln__arch_offered(const char *arch, kiln__err *e);

/* ---- tile configuration (jit/config.c) ------------------------------------------------------ */

/* Everything about a kernel's launch geometry that the source bakes in; derived only from the
 * variant and the arch, so the runtime can recompute it for a cached kernel. */
typedef struct kiln__config {
    int threads;       /* threads per block of the main kernel (op=merge: of its three kernels) */
    int smem_bytes;    /* dynamic shared memory of the main kernel (op=merge: 0) */
    int block_m;       /* the tensor-core kernel (prefill.cuh): rows per CTA, warps * mt * 16;
                          CUDA-core decode: query heads per CTA (= gb); op=merge: 1 */
    int block_n;       /* KV tokens per tile (CUDA-core decode: 32, one per lane) */
    int warps;         /* warps per CTA */
    int stages;        /* KV tile pipeline depth */
    int mt;            /* tensor-core kernel: m16 tiles per warp (else 0) */
    int q_in_regs;     /* tensor-core kernel: keep Q fragments in registers */
    int gb;            /* CUDA-core decode: query heads per CTA, dividing G (else 0) */
    int min_blocks;    /* CTAs per SM the register budget targets (__launch_bounds__) */
    int merge_threads; /* threads of the split-merge kernel: decode and batches (0 for a
                          single-request prefill); op=merge: D */
    int pack;          /* the G query heads of a token are G rows of one CTA tile: for decode
                          this is the tensor-core kernel (prefill.cuh), else CUDA cores */
    int wgmma;         /* the warp-specialized Hopper family (wgmma_attention.cuh, sm_90a):
                          warps counts the consumer warps, threads adds the producer's 128 */
    int load;          /* wgmma family: how the producer copies rows (KILN_WGMMA_LOAD_*,
                          params.h: 0 a row per thread, 1 whole rows per warp, 2 TMA) */
    int persist;       /* wgmma family (KILN_WGMMA_PERSIST_*): 0 a CTA per tile; 1 a
                          persistent grid (one CTA per SM's worth, each looping over work
                          tiles, heaviest first, round robin); 2 the same, later jobs claimed
                          from a counter in the batch's schedule. The tensor-core decode
                          (pack, KILN_TUNE only): 1 CTA (x, hk) runs items x, x + grid, ...
                          with its K/V ring running on across them (mma_decode_persist.cuh) */
    int xjob;          /* wgmma family, persistent grid: a job's last P V is issued with the
                          next job's first S (wgmma_attention.cuh, wg_consume), its O stored
                          under that S's softmax; 0: the last P V is a turn of its own */
    int kvsplit;       /* wgmma family: a stage's K and V tiles have full and empty barriers of
                          their own, K let go after S, V after P V (wgmma_attention.cuh
                          wg_smem); 0: one pair for both, let go after P V */
    int ksplit;        /* the tensor-core decode's key split (mma_attention.cuh KSPLIT): the CTA
                          holds ksplit one-warp pipelines, each on every ksplit-th key tile of
                          the work item, merged in shared memory at the end; threads and
                          shared memory ksplit times the one warp's. 0 (the default): none.
                          KILN_TUNE ksplit=2|4|8, opt-in (checked on an H100, session 47) */
    int hx;            /* the packed mma.sync batch kernels (the tensor-core decode): an item's
                          KV heads take adjacent CTAs in dispatch order (mma_attention.cuh HX),
                          so the CTAs that read one page's rows run together; 0 (the default):
                          blockIdx.x is the item, .y the KV head. KILN_TUNE hx=1, opt-in (not
                          yet run on a GPU, session 50) */
    int bulk;          /* the tensor-core decode (pack, 16-bit K/V, sm_90+): each K/V row of a
                          tile is one cp.async.bulk from its lane into rows padded by 16 bytes,
                          completing the stage's mbarrier (mma_attention.cuh BULK); 2: a
                          whole tile's pages as TMA boxes issued by one lane (the kernel takes
                          the tensor maps, runtime/tma.c) into 64-column blocks in the 128-byte
                          swizzle; 0 (the default): 16-byte cp.async copies into XOR-swizzled
                          rows. KILN_TUNE bulk=1 / bulk=2, opt-in (sessions 51, 52) */
    int fused_merge;   /* batch decode: the split CTAs merge their task's partial states (the
                          last of each task to finish, merge.cuh merge_task_if_last) and
                          kiln_plan_run launches no merge kernel; 0: the merge kernel does */
    int pdl;           /* sm_90+, a kernel with a merge kernel: programmatic dependent launch.
                          The merge kernel is launched with cuLaunchKernelEx and programmatic
                          stream serialization, so it is scheduled while the main kernel's last
                          CTAs run; the main kernel lets it (griddepcontrol.launch_dependents)
                          and the merge kernel waits (griddepcontrol.wait) for the main grid's
                          end before it reads a partial state; 0: two ordinary launches */
} kiln__config;

/* Why the warp-specialized Hopper family (wgmma_attention.cuh) is not v's family on sm_<sm>,
 * or NULL when it is (then kiln__config_pick takes it unless KILN_TUNE says wgmma=0). *can is
 * 1 where the family could run v all the same (it measured slower there: KILN_TUNE wgmma=1
 * takes it), 0 where it cannot. */
const char *kiln__wgmma_refusal(const kiln_variant *v, int sm, int *can);

/* Why a decode of v is not on the tensor cores (the packed rows of mma_attention.cuh), or NULL
 * when it is (then kiln__config_pick takes them unless KILN_TUNE says pack=0). */
const char *kiln__decode_pack_refusal(const kiln_variant *v);

/* Largest dynamic shared memory per block on an arch (bytes). */
int kiln__smem_limit(int sm);

/* Pick the tile configuration for a checked variant: the table in jit/config.c, then the
 * environment variable KILN_TUNE ("warps=8 mt=2 bn=64 stages=3 qregs=0 minb=2", also gb=,
 * pack=, merge= and pdl=), which overrides fields for tuning (op=merge takes none but pack); the
 * config is part of the key material, so an override never aliases a cached kernel. Fails when
 * an override is malformed or does not fit. */
kiln_status kiln__config_pick(const kiln_variant *v, int sm, kiln__config *cfg, kiln__err *e);
/* One-line text of a config (part of the key material). */
void kiln__config_format(const kiln__config *cfg, char *buf, size_t cap);
/* Whether cfg's main kernel takes the tensor maps (kiln_tma_maps, runtime/tma.c) as its second
 * argument: the wgmma family loading by TMA, the tensor-core decode with bulk=2. */
int kiln__config_tma_maps(const kiln__config *cfg);

/* ---- expansion (jit/expand.c) --------------------------------------------------------------- */

/* The embedded templates (generated at build time by tools/embed). */
typedef struct kiln__template {
    const char *name; /* path under templates/, e.g. "common/mma.cuh" */
    const char *text;
} kiln__template;
extern const kiln__template kiln__templates[];
extern const int kiln__templates_count;
extern const char kiln__templates_digest[]; /* 32 hex chars of XXH3-128 over names+texts */

/* Write the self-contained CUDA source for (v, cfg, arch). Returns malloc'd text. */
/* The kernel family of a source kiln__expand wrote, by the entry point it calls: "wgmma",
 * "mma.sync", "simt" (the CUDA-core decode), "merge", or "-" (NULL or not such a source). */
const char *kiln__source_family(const char *source);

kiln_status kiln__expand(const kiln_variant *v, const kiln__config *cfg, const char *arch,
                         char **source, kiln__err *e);

/* Entry point names in the generated modules: main (every op but merge), merge (decode and
 * batches, kv=ragged|paged), tile map (prefill with a mask snippet or mask data); op=merge has
 * the three merge-state kernels instead of main. */
#define KILN__ENTRY_MAIN           "kiln_main"
#define KILN__ENTRY_MERGE          "kiln_merge"
#define KILN__ENTRY_MERGE_WIDE     "kiln_merge_wide"
#define KILN__ENTRY_TILE_MAP       "kiln_tile_map"
#define KILN__ENTRY_MERGE_STATE    "kiln_merge_state"
#define KILN__ENTRY_MERGE_IN_PLACE "kiln_merge_state_in_place"
#define KILN__ENTRY_MERGE_STATES   "kiln_merge_states"
#define KILN__TILE_MAP_THREADS     256

/* 1 when the variant's builtin logits transform has ALiBi slopes / a soft-cap. */
static inline int kiln__logits_alibi(const kiln_variant *v)
{
    return v->logits == KILN_LOGITS_ALIBI || v->logits == KILN_LOGITS_SOFTCAP_ALIBI;
}
static inline int kiln__logits_softcap(const kiln_variant *v)
{
    return v->logits == KILN_LOGITS_SOFTCAP || v->logits == KILN_LOGITS_SOFTCAP_ALIBI;
}

/* 1 when the variant's K/V are stored as fp8 (e4m3, e5m2): one byte an element, not two. */
static inline int kiln__kv_fp8(const kiln_variant *v)
{
    return v->kv_dtype == KILN_DTYPE_E4M3 || v->kv_dtype == KILN_DTYPE_E5M2;
}

/* 1 when the variant masks per element beyond the builtin masks (snippet or mask data). */
static inline int kiln__variant_has_element_mask(const kiln_variant *v)
{
    return v->mask_expr[0] != 0 || v->mask_data != KILN_MASK_DATA_NONE;
}

/* ---- key (jit/key.c) ------------------------------------------------------------------------ */

/* Key material: the exact text that is hashed. malloc'd. */
kiln_status kiln__key_material(const kiln_variant *v, const kiln__config *cfg, const char *arch,
                               char **material, kiln__err *e);
/* XXH3-128 of the material as 32 lowercase hex chars + NUL. */
void kiln__key_hash(const char *material, char key[33]);

/* ---- NVRTC (jit/nvrtc.c) -------------------------------------------------------------------- */

typedef struct kiln__compiled {
    void *cubin;
    size_t cubin_size;
    char *log; /* NVRTC + ptxas log (may be "") */
    double compile_ms;
    int registers; /* parsed from ptxas -v for the main entry (else the most of any entry); -1 if absent */
    int smem_static;
    int spill_bytes;
    int stack_bytes;
} kiln__compiled;

/* The options of a compile for an arch, in order: "--gpu-architecture=ARCH", then the fixed
 * ones. The key material lists exactly these (jit/key.c). v[0] points into arch: use the
 * struct where it was filled, never a copy. */
#define KILN__NVRTC_OPTS_MAX 8
typedef struct kiln__nvrtc_opts {
    char arch[48];
    const char *v[KILN__NVRTC_OPTS_MAX];
    int n;
} kiln__nvrtc_opts;
void kiln__nvrtc_options(const char *arch, kiln__nvrtc_opts *out);

/* Compile source (name: the program's name in NVRTC's messages) for a normalised arch with
 * kiln__nvrtc_options; out gets the cubin, the log and the main entry's resources. Release out
 * with kiln__compiled_free, after a failure too: a failed compile leaves its log there. */
kiln_status kiln__nvrtc_compile(const char *source, const char *arch, const char *name,
                                kiln__compiled *out, kiln__err *e);
void kiln__compiled_free(kiln__compiled *c);
/* The compute capabilities (e.g. 90) NVRTC can target, into sms[cap]: from the version memo
 * when it has the list, else from NVRTC (which is then loaded). */
kiln_status kiln__nvrtc_archs(int *sms, int cap, int *count, kiln__err *e);
/* Parse ptxas' "-v" report for the entry `func` out of log; without that entry, the largest
 * figures of any entry (registers -1 when the log has no report at all). */
void kiln__ptxas_parse(const char *log, const char *func, int *registers, int *smem,
                       int *spill_bytes, int *stack_bytes);

#endif /* KILN_JIT_H */
