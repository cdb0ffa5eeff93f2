/*
 * expand.c — writes the one self-contained CUDA source of a variant: a header comment that
 * lists the variant ("generated — do not edit"), the embedded templates it includes (each
 * inlined once, in include order), the tile configuration as a constexpr struct, and the
 * extern "C" entry points. This text is exactly what NVRTC compiles and what
 * `kiln show --source` prints.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit.h"
#include "params.h"

static const kiln__template *find_template(const char *name, size_t len)
{
    for (int i = 0; i < kiln__templates_count; i++)
        if (strlen(kiln__templates[i].name) == len && !memcmp(kiln__templates[i].name, name, len))
            return &kiln__templates[i];
    return NULL;
}

/* Append template `t`, replacing each `#include "x"` line by the inlined template x (once). */
static kiln_status inline_template(kiln__str *out, const kiln__template *t, unsigned char *seen,
                                   int depth, kiln__err *e)
{
    int idx = (int)(t - kiln__templates);
    if (seen[idx]) return KILN_STATUS_OK;
    seen[idx] = 1;
    if (depth > 16)
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "expand: include depth over 16 at %s",
                          t->name);
    kiln__str_printf(out, "/* ---- templates/%s ---- */\n", t->name);
    const char *p = t->text;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t n = eol ? (size_t)(eol - p + 1) : strlen(p);
        const char *q = p;
        while (q < p + n && (*q == ' ' || *q == '\t')) q++;
        if (!strncmp(q, "#include \"", 10)) {
            const char *name = q + 10, *end = memchr(name, '"', n - (size_t)(name - p));
            const kiln__template *inc = end ? find_template(name, (size_t)(end - name)) : NULL;
            if (!inc)
                return kiln__fail(
                    e, KILN_STATUS_UNSUPPORTED,
                    "expand: %s includes a file that is not an embedded template: %.*s", t->name,
                    (int)n - 1, p);
            kiln_status st = inline_template(out, inc, seen, depth + 1, e);
            if (st) return st;
        } else {
            kiln__str_add(out, p, n);
        }
        p += n;
    }
    if (out->len && out->p[out->len - 1] != '\n') kiln__str_puts(out, "\n");
    return KILN_STATUS_OK;
}

/* The user parameters as local constants of a hook, read from the launch block. */
static void emit_params(kiln__str *s, const kiln_variant *v)
{
    for (int i = 0; i < v->num_params; i++) {
        const kiln_param_decl *d = &v->params[i];
        switch (d->type) {
            case KILN_PARAM_F32:
                kiln__str_printf(
                    s, "        const float %s = __int_as_float((int)(unsigned)p.user[%d]);\n",
                    d->name, i);
                break;
            case KILN_PARAM_I32:
                kiln__str_printf(s, "        const int %s = (int)(unsigned)p.user[%d];\n", d->name,
                                 i);
                break;
            case KILN_PARAM_F32_ARRAY:
                kiln__str_printf(
                    s, "        const float *%s = reinterpret_cast<const float *>(p.user[%d]);\n",
                    d->name, i);
                break;
            case KILN_PARAM_I32_ARRAY:
                kiln__str_printf(
                    s, "        const int *%s = reinterpret_cast<const int *>(p.user[%d]);\n",
                    d->name, i);
                break;
        }
        kiln__str_printf(s, "        (void)%s;\n", d->name);
    }
    kiln__str_puts(
        s, "        (void)batch; (void)qo_idx; (void)kv_idx; (void)qo_head; (void)kv_head;\n"
           "        (void)qo_len; (void)kv_len;\n");
}

/* 1 when `word` appears in text as a whole identifier. */
static int has_word(const char *text, const char *word)
{
    const size_t n = strlen(word);
    for (const char *p = strstr(text, word); p; p = strstr(p + 1, word)) {
        const int before = p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_');
        const int after = isalnum((unsigned char)p[n]) || p[n] == '_';
        if (!before && !after) return 1;
    }
    return 0;
}

/* The snippet's canonical tokens (single spaces between them) into t (at most max, pointing into
 * buf): their count, or -1 when there are more. */
static int snippet_tokens(const char *expr, char *buf, size_t cap, const char **t, int max)
{
    snprintf(buf, cap, "%s", expr);
    int n = 0;
    char *save = NULL;
    for (char *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
        if (n == max) return -1;
        t[n++] = w;
    }
    return n;
}

/* A loop-invariant scalar factor of the snippet, as C: an f32 parameter (read from the launch
 * block) or a finite float literal (nonzero where asked). 1 with out written; 0 otherwise. */
static int invariant_factor(const kiln_variant *v, const char *tok, int nonzero, char *out,
                            size_t cap)
{
    for (int i = 0; i < v->num_params; i++)
        if (v->params[i].type == KILN_PARAM_F32 && !strcmp(v->params[i].name, tok)) {
            snprintf(out, cap, "__int_as_float((int)(unsigned)p.user[%d])", i);
            return 1;
        }
    char *end = NULL;
    const float f = strtof(tok, &end);
    if (end == tok || (*end && strcmp(end, "f") && strcmp(end, "F")) || !(f == f) || f > 3.4e38f ||
        f < -3.4e38f || (nonzero && f == 0.0f))
        return 0;
    snprintf(out, cap, "%s", tok); /* the literal as written (libclang parsed it) */
    return 1;
}

/* The bounded form of a logits snippet's canonical tokens t[0..n): `B * tanhf ( ... )` or
 * `tanhf ( ... ) * B`, the call's parentheses spanning the rest. The index of B, or -1. */
static int bounded_form(const char *const *t, int n)
{
    int b, call;
    if (n >= 6 && !strcmp(t[1], "*") && !strcmp(t[2], "tanhf")) b = 0, call = 2;
    else if (n >= 6 && !strcmp(t[0], "tanhf") && !strcmp(t[n - 2], "*")) b = n - 1, call = 0;
    else return -1;
    if (strcmp(t[call + 1], "(")) return -1;
    int depth = 0, close = -1;
    for (int i = call + 1; i < n && close < 0; i++) {
        depth += !strcmp(t[i], "(") - !strcmp(t[i], ")");
        if (!depth) close = i;
    }
    return close == (call ? n - 1 : n - 3) ? b : -1;
}

/* A bound on every value of a logits snippet, read from its canonical tokens (single spaces
 * between them, as kiln__variant_canonicalize writes them): the bounded form with B a float
 * literal or an f32 scalar parameter gives |B| (the snippet's tanhf is tanh.approx, within
 * [-1, 1]). The wgmma softmax then takes the fixed reference m = 0 where |B| log2(e) allows
 * (wg_cap_ref), as the builtin soft-cap does. Writes the bound's C expression into out (the
 * parameter read from the launch block) and returns 1; 0 for any other snippet. */
static int logits_bound(const kiln_variant *v, char *out, size_t cap)
{
    char buf[sizeof v->logits_expr], f[96];
    const char *t[64];
    const int n = snippet_tokens(v->logits_expr, buf, sizeof buf, t, 64);
    const int b = bounded_form(t, n);
    if (b < 0 || !invariant_factor(v, t[b], 0, f, sizeof f)) return 0;
    snprintf(out, cap, "fabsf(%s)", f);
    return 1;
}

/* The folds of a snippet's scalar factors into multiplies the tile loop takes anyway, each once
 * a tile instead of once an element (logits_tile; the element paths keep the snippet as
 * written). Only without a builtin transform. Each changes the value by the rounding of a
 * product (an ulp or two), as fast math may.
 * - The input factor: a snippet that reads `logits` once, as `logits / X`, `logits * X` or
 *   `X * logits` with X an f32 parameter or a nonzero float literal, and whose neighbours bind
 *   no tighter than that product (the token before is none of `/ % ) ] ! ~` nor a name, the
 *   token after no postfix), reads the product as `logits`: the tile loop's q.k multiply
 *   (a = ksc sm_scale) takes the factor (1 / X or X) into a.
 * - The output factor: a snippet of the bounded form `B * tanhf ( ... )` (logits_bound), B a
 *   parameter or a nonzero literal, leaves S = tanhf(...) and the softmax's exp2 factor c2
 *   takes |B| (logits_c2); where B < 0 the tile loop negates S (a branch a tile).
 * A snippet soft-cap `cap * tanhf(logits / cap)` then takes the builtin soft-cap's
 * instructions. Writes the folded snippet into expr and the factors' C into pre and outer ("" for
 * none) and returns 1; 0 when neither applies. */
static int logits_fold(const kiln_variant *v, char *expr, size_t expr_cap, char *pre,
                       size_t pre_cap, char *outer, size_t outer_cap)
{
    pre[0] = outer[0] = 0;
    if (v->logits != KILN_LOGITS_NONE || !v->logits_expr[0]) return 0;
    char buf[sizeof v->logits_expr];
    const char *t[256];
    const int n = snippet_tokens(v->logits_expr, buf, sizeof buf, t, 256);
    if (n <= 0) return 0;
    unsigned char drop[256] = {0};
    /* the output factor */
    const int b = n <= 64 ? bounded_form(t, n) : -1;
    if (b >= 0 && invariant_factor(v, t[b], 1, outer, outer_cap)) {
        drop[b] = 1;
        drop[b ? n - 2 : 1] = 1; /* its `*` */
    } else {
        outer[0] = 0;
    }
    /* the input factor */
    int at = -1, lo = -1, hi = -1, x = -1, div = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i], "logits")) at = at < 0 ? i : -2;
    if (at >= 0) {
        if (at + 2 < n && (!strcmp(t[at + 1], "/") || !strcmp(t[at + 1], "*")))
            lo = at, hi = at + 2, x = at + 2, div = t[at + 1][0] == '/';
        else if (at >= 2 && !strcmp(t[at - 1], "*")) lo = at - 2, hi = at, x = at - 2;
    }
    char f[96];
    int ok = x >= 0 && !drop[lo] && invariant_factor(v, t[x], 1, f, sizeof f);
    if (ok && lo > 0 && !drop[lo - 1]) {
        const char *w = t[lo - 1];
        const int name = isalnum((unsigned char)w[0]) || w[0] == '_' || w[0] == '.';
        ok = !name && strcmp(w, "/") && strcmp(w, "%") && strcmp(w, ")") && strcmp(w, "]") &&
             strcmp(w, "!") && strcmp(w, "~");
    }
    if (ok && hi + 1 < n && !drop[hi + 1]) {
        const char *w = t[hi + 1];
        ok = strcmp(w, "(") && strcmp(w, "[") && strcmp(w, ".") && strcmp(w, "->") &&
             strcmp(w, "++") && strcmp(w, "--");
    }
    if (ok) {
        snprintf(pre, pre_cap, div ? "(1.0f / %s)" : "(%s)", f);
        for (int i = lo; i <= hi; i++) drop[i] = i != at;
    }
    if (!pre[0] && !outer[0]) return 0;
    size_t len = 0;
    expr[0] = 0;
    for (int i = 0; i < n; i++) {
        if (drop[i]) continue;
        const int k = snprintf(expr + len, expr_cap - len, "%s%s", len ? " " : "", t[i]);
        if (k < 0 || (size_t)k >= expr_cap - len) return 0;
        len += (size_t)k;
    }
    return 1;
}

/* The user snippets (validated and canonicalised before expansion) as static members of the
 * config struct; the templates call them only when HAS_*_EXPR is true. */
static void emit_hooks(kiln__str *s, const kiln_variant *v)
{
    const int has_logits = v->logits_expr[0] != 0, has_mask = v->mask_expr[0] != 0;
    if (has_logits || has_mask)
        /* Unqualified calls in the hooks find these class members first: the transcendental
         * functions a snippet may call run on the same fast approximations the builtin
         * transforms use (ex2/lg2/tanh.approx), so a snippet soft-cap costs what the builtin
         * one does. */
        kiln__str_puts(s, "    static __device__ __forceinline__ float tanhf(float x) { return "
                          "kiln::tanh_fast(x); }\n"
                          "    static __device__ __forceinline__ float exp2f(float x) { return "
                          "kiln::exp2_fast(x); }\n"
                          "    static __device__ __forceinline__ float expf(float x) { return "
                          "kiln::exp2_fast(x * kiln::LOG2E); }\n"
                          "    static __device__ __forceinline__ float log2f(float x) { return "
                          "kiln::log2_fast(x); }\n"
                          "    static __device__ __forceinline__ float logf(float x) { return "
                          "kiln::log2_fast(x) * kiln::LN2; }\n");
    const int uses_head =
        has_mask && (has_word(v->mask_expr, "qo_head") || has_word(v->mask_expr, "kv_head"));
    kiln__str_printf(s, "    static constexpr bool HAS_LOGITS_EXPR = %s, HAS_MASK_EXPR = %s;\n",
                     has_logits ? "true" : "false", has_mask ? "true" : "false");
    kiln__str_printf(s,
                     "    static constexpr int MASK_DATA = %d;\n    static constexpr bool "
                     "MASK_USES_HEAD = %s;\n",
                     (int)v->mask_data, uses_head ? "true" : "false");
    char bound[96];
    const int bounded = has_logits && logits_bound(v, bound, sizeof bound);
    kiln__str_printf(s, "    static constexpr bool LOGITS_BOUNDED = %s;\n",
                     bounded ? "true" : "false");
    if (bounded)
        kiln__str_printf(s,
                         "    static __device__ __forceinline__ float logits_bound(const "
                         "kiln_launch_params &p) { return %s; }\n",
                         bound);
    if (has_logits) {
        kiln__str_puts(
            s, "    static __device__ __forceinline__ float logits_expr(float logits, int batch,\n"
               "        int qo_idx, int kv_idx, int qo_head, int kv_head, int qo_len, int kv_len,\n"
               "        const kiln_launch_params &p)\n    {\n");
        emit_params(s, v);
        kiln__str_printf(
            s, "        return (float)(\n/* user snippet: logits_expr */ %s\n        );\n    }\n",
            v->logits_expr);
    }
    char folded[sizeof v->logits_expr], pre[128], outer[128];
    const int fold = logits_fold(v, folded, sizeof folded, pre, sizeof pre, outer, sizeof outer);
    kiln__str_printf(s,
                     "    static constexpr bool LOGITS_FOLDED = %s, LOGITS_PRE = %s, "
                     "LOGITS_OUTER = %s;\n",
                     fold ? "true" : "false", pre[0] ? "true" : "false",
                     outer[0] ? "true" : "false");
    if (pre[0])
        kiln__str_printf(s,
                         "    static __device__ __forceinline__ float logits_pre(const "
                         "kiln_launch_params &p) { return %s; }\n",
                         pre);
    if (outer[0])
        kiln__str_printf(s,
                         "    static __device__ __forceinline__ float logits_outer(const "
                         "kiln_launch_params &p) { return %s; }\n",
                         outer);
    if (fold) {
        kiln__str_puts(
            s, "    static __device__ __forceinline__ float logits_expr_folded(float logits,\n"
               "        int batch, int qo_idx, int kv_idx, int qo_head, int kv_head, int qo_len,\n"
               "        int kv_len, const kiln_launch_params &p)\n    {\n");
        emit_params(s, v);
        kiln__str_printf(s,
                         "        return (float)(\n/* user snippet: logits_expr, its scalar "
                         "factors folded */ %s\n        );\n    }\n",
                         folded);
    }
    if (has_mask) {
        kiln__str_puts(
            s, "    static __device__ __forceinline__ bool mask_expr(int batch, int qo_idx,\n"
               "        int kv_idx, int qo_head, int kv_head, int qo_len, int kv_len,\n"
               "        const kiln_launch_params &p)\n    {\n");
        emit_params(s, v);
        kiln__str_printf(
            s, "        return (bool)(\n/* user snippet: mask_expr */ %s\n        );\n    }\n",
            v->mask_expr);
    }
}

/* The programmatic dependent launch (kiln__config.pdl): PDL, and for a PDL config its two
 * instructions as members of the config struct, which the templates call only behind Cfg::PDL
 * (common/device.cuh: let_merge_launch, wait_main_grid), so that a source without PDL holds no
 * griddepcontrol at all. The config refuses pdl=1 below sm_90; the arch guard is the PTX's own
 * condition. */
static void emit_pdl(kiln__str *s, const kiln__config *cfg)
{
    kiln__str_printf(s, "    static constexpr int PDL = %d;\n", cfg->pdl);
    if (!cfg->pdl) return;
    kiln__str_puts(s, "    static __device__ __forceinline__ void griddep_launch_dependents()\n"
                      "    {\n"
                      "#if __CUDA_ARCH__ >= 900\n"
                      "        asm volatile(\"griddepcontrol.launch_dependents;\\n\" ::);\n"
                      "#endif\n"
                      "    }\n"
                      "    static __device__ __forceinline__ void griddep_wait()\n"
                      "    {\n"
                      "#if __CUDA_ARCH__ >= 900\n"
                      "        asm volatile(\"griddepcontrol.wait;\\n\" ::: \"memory\");\n"
                      "#endif\n"
                      "    }\n");
}

static const char *dt_const(kiln_dtype t)
{
    return t == KILN_DTYPE_BF16 ? "kiln::BF16" : "kiln::F16";
}

const char *kiln__source_family(const char *source)
{
    static const struct {
        const char *family, *entry; /* the kernel template each family's main entry calls */
    } families[] = {{"wgmma", "kiln::wgmma_attention_kernel<"},
                    {"simt", "kiln::simt_decode_kernel<"},
                    {"merge", "kiln::merge_state_kernel<"},
                    {"mma.sync", "kiln::mma_attention_kernel<"},
                    {"mma.sync", "kiln::mma_decode_persist_kernel<"}};
    for (size_t i = 0; source && i < sizeof families / sizeof families[0]; i++)
        if (strstr(source, families[i].entry)) return families[i].family;
    return "-";
}

kiln_status kiln__expand(const kiln_variant *v, const kiln__config *cfg, const char *arch,
                         char **source, kiln__err *e)
{
    *source = NULL;
    char spec[KILN__SPEC_MAX], conf[256];
    if (!kiln__spec_format(v, spec, sizeof spec, e)) return KILN_STATUS_UNSUPPORTED;
    kiln__config_format(cfg, conf, sizeof conf);

    const int decode = v->op == KILN_OP_DECODE, merge = v->op == KILN_OP_MERGE;
    const int batch = v->kv != KILN_KV_CONTIGUOUS;
    /* decode on tensor cores (cfg->pack) is the prefill kernel with the group packed into rows */
    const int cuda_core_decode = decode && !cfg->pack;
    /* the tensor-core decode on its persistent grid (KILN_TUNE persist=1) */
    const int decode_persist = decode && cfg->pack && !cfg->wgmma && cfg->persist;
    const char *family = merge              ? "merge.cuh"
                         : cuda_core_decode ? "simt_decode.cuh"
                         : cfg->wgmma       ? "wgmma_attention.cuh"
                         : decode_persist   ? "mma_decode_persist.cuh"
                                            : "mma_attention.cuh";
    /* the tile map kernel of a prefill's element masks comes with its own template */
    const int tile_map = !decode && !merge && kiln__variant_has_element_mask(v);
    const char *roots[2] = {family, tile_map ? "tile_map.cuh" : NULL};
    const kiln__template *t[2] = {NULL, NULL};
    for (int i = 0; i < 2 && roots[i]; i++)
        if (!(t[i] = find_template(roots[i], strlen(roots[i]))))
            return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "expand: template %s is not embedded",
                              roots[i]);

    kiln__str s = {0};
    kiln__str_printf(&s,
                     "/*\n * kiln — generated source, do not edit.\n"
                     " * spec:      %s\n * arch:      %s\n * config:    %s\n"
                     " * templates: %s\n */\n",
                     spec, arch, conf, kiln__templates_digest);
    unsigned char seen[256] = {0};
    if (kiln__templates_count > 256) {
        kiln__str_free(&s);
        return kiln__fail(e, KILN_STATUS_UNSUPPORTED, "expand: too many templates");
    }
    for (int i = 0; i < 2 && t[i]; i++) {
        kiln_status st = inline_template(&s, t[i], seen, 0, e);
        if (st) {
            kiln__str_free(&s);
            return st;
        }
    }
    kiln__str_printf(&s,
                     "\n/* ---- instantiation ---- */\n"
                     "struct kiln_cfg {\n"
                     "    static constexpr int D = %d, G = %d, DT = %s, OUT_DT = %s;\n"
                     "    static constexpr int LOGITS = %d, CAUSAL = %d, WINDOW = %d, LSE = %d;\n"
                     "    static constexpr int WARPS = %d, STAGES = %d;\n"
                     "    static constexpr int KV = %d, KV_DT = %d, ROPE = %d;\n",
                     v->head_dim, v->group, dt_const(v->q_dtype), dt_const(v->out_dtype),
                     (int)v->logits, v->mask == KILN_MASK_CAUSAL, v->window, v->lse, cfg->warps,
                     cfg->stages, (int)v->kv, (int)v->kv_dtype, v->rope);
    emit_hooks(&s, v);
    if (merge) {
        kiln__str_puts(&s, "};\n");
        for (int i = 0; i < 3; i++) {
            static const char *const entry[3] = {KILN__ENTRY_MERGE_STATE,
                                                 KILN__ENTRY_MERGE_IN_PLACE,
                                                 KILN__ENTRY_MERGE_STATES};
            static const char *const body[3] = {"kiln::merge_state_kernel<kiln_cfg>(p, false)",
                                                "kiln::merge_state_kernel<kiln_cfg>(p, true)",
                                                "kiln::merge_states_kernel<kiln_cfg>(p)"};
            kiln__str_printf(&s,
                             "\nextern \"C\" __global__ void __launch_bounds__(%d)\n"
                             "%s(const __grid_constant__ kiln_merge_params p)\n{\n    %s;\n}\n",
                             cfg->threads, entry[i], body[i]);
        }
        *source = kiln__str_take(&s);
        if (!*source) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "expand: out of memory");
        return KILN_STATUS_OK;
    }
    if (cuda_core_decode)
        kiln__str_printf(&s, "    static constexpr int GB = %d, TILE = %d;\n", cfg->gb,
                         cfg->block_n);
    else
        kiln__str_printf(&s,
                         "    static constexpr int MT = %d, BN = %d, Q_IN_REGS = %d, PACK = %d, "
                         "WGMMA = %d, KSPLIT = %d, BULK = %d;\n",
                         cfg->mt, cfg->block_n, cfg->q_in_regs, cfg->pack, cfg->wgmma,
                         cfg->ksplit ? cfg->ksplit : 1, cfg->bulk);
    if (cfg->wgmma)
        kiln__str_printf(&s,
                         "    static constexpr int LOAD = %d, PERSIST = %d, XJOB = %d, KVSPLIT = "
                         "%d;\n",
                         cfg->load, cfg->persist, cfg->xjob, cfg->kvsplit);
    else /* the families that can merge their own splits (jit/config.c: batch decode) */
        kiln__str_printf(&s, "    static constexpr int FUSED_MERGE = %d, HX = %d;\n",
                         cfg->fused_merge, cfg->hx);
    emit_pdl(&s, cfg);
    /* the kernel's arguments and, loading by TMA (the wgmma family's load, the tensor-core
     * decode's bulk=2), the tensor maps */
    const int tma = kiln__config_tma_maps(cfg);
    kiln__str_printf(&s,
                     "};\n\n"
                     "extern \"C\" __global__ void __launch_bounds__(%d, %d)\n"
                     "%s(const __grid_constant__ kiln_launch_params p%s)\n{\n"
                     "    kiln::%s_kernel<kiln_cfg>(p%s);\n}\n",
                     cfg->threads, cfg->min_blocks, KILN__ENTRY_MAIN,
                     tma ? ", const __grid_constant__ kiln_tma_maps m" : "",
                     cuda_core_decode ? "simt_decode"
                     : cfg->wgmma     ? "wgmma_attention"
                     : decode_persist ? "mma_decode_persist"
                                      : "mma_attention",
                     tma          ? ", &m"
                     : cfg->wgmma ? ", nullptr"
                                  : "");
    if (batch)
        kiln__str_printf(&s,
                         "\nextern \"C\" __global__ void __launch_bounds__(%d)\n"
                         "%s(const __grid_constant__ kiln_launch_params p)\n{\n"
                         "    kiln::batch_merge_kernel<kiln_cfg>(p);\n}\n",
                         cfg->merge_threads, KILN__ENTRY_MERGE);
    else if (decode)
        kiln__str_printf(&s,
                         "\nextern \"C\" __global__ void __launch_bounds__(%d)\n"
                         "%s(const __grid_constant__ kiln_launch_params p)\n{\n"
                         "    kiln::decode_merge_kernel<kiln_cfg>(p);\n}\n",
                         cfg->merge_threads, KILN__ENTRY_MERGE);
    if (batch && decode) /* for tasks of many slots (a B1 decode's): one round trip */
        kiln__str_printf(&s,
                         "\nextern \"C\" __global__ void __launch_bounds__(%d)\n"
                         "%s(const __grid_constant__ kiln_launch_params p)\n{\n"
                         "    kiln::batch_merge_kernel<kiln_cfg, kiln::MERGE_BATCH_WIDE>(p);\n}\n",
                         cfg->merge_threads, KILN__ENTRY_MERGE_WIDE);
    if (tile_map)
        kiln__str_printf(&s,
                         "\nextern \"C\" __global__ void __launch_bounds__(%d)\n"
                         "%s(const __grid_constant__ kiln_launch_params p)\n{\n"
                         "    kiln::tile_map_kernel<kiln_cfg>(p);\n}\n",
                         KILN__TILE_MAP_THREADS, KILN__ENTRY_TILE_MAP);
    *source = kiln__str_take(&s);
    if (!*source) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "expand: out of memory");
    return KILN_STATUS_OK;
}
