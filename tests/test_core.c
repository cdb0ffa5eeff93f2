/*
 * test_core.c — the JIT pipeline on the CPU: expansion, key material and key sensitivity,
 * NVRTC compiles through the public API for named archs, the cache round trip (compiled →
 * cached in a new context), corrupt rows recompiled, and clear errors for bad directories.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "grid.h"
#include "jit.h"
#include "kt.h"
#include "params.h"

static void parse(const char *spec, kiln_variant *v)
{
    if (kiln_variant_parse(spec, v) != KILN_STATUS_OK)
        kt_fail(__FILE__, __LINE__, "parse %s: %s", spec, kiln_errmsg());
}

KT_TEST(core_expand_self_contained)
{
    kiln_variant v;
    parse("op=prefill dtype=bf16 head_dim=128 group=4 mask=causal logits=softcap", &v);
    kiln__config cfg;
    kiln__err e;
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    char *src = NULL;
    KT_OK(kiln__expand(&v, &cfg, "sm_90a", &src, &e), e.msg);
    KT_REQUIRE(src);
    KT_CONTAINS(src, "generated source, do not edit");
    KT_CONTAINS(src, "spec:      op=prefill dtype=bf16 head_dim=128 group=4");
    KT_CONTAINS(src, "templates/mma_attention.cuh");
    KT_CONTAINS(src, "templates/common/params.h");
    KT_CHECK(strstr(src, "#include") == NULL);
    KT_CONTAINS(src, "extern \"C\" __global__");
    free(src);
}

/* Every field of the variant, the arch and the config change the key; token order does not. */
KT_TEST(core_key_sensitivity)
{
    const char *base =
        "op=decode dtype=f16 head_dim=128 group=4 layout=nhd mask=none window=0 logits=none lse=0";
    const char *variants[] = {
        "op=prefill dtype=f16 head_dim=128 group=4 layout=nhd mask=none window=0 logits=none lse=0",
        "op=decode dtype=bf16 head_dim=128 group=4 layout=nhd mask=none window=0 logits=none lse=0",
        "op=decode q_dtype=f16 kv_dtype=f16 out_dtype=bf16 head_dim=128 group=4",
        "op=decode dtype=f16 head_dim=64 group=4",
        "op=decode dtype=f16 head_dim=128 group=8",
        "op=decode dtype=f16 head_dim=128 group=4 layout=hnd",
        "op=decode dtype=f16 head_dim=128 group=4 mask=causal",
        "op=decode dtype=f16 head_dim=128 group=4 window=1",
        "op=decode dtype=f16 head_dim=128 group=4 logits=softcap",
        "op=decode dtype=f16 head_dim=128 group=4 logits=alibi",
        "op=decode dtype=f16 head_dim=128 group=4 lse=1",
    };
    char keys[16][33];
    kiln_variant v;
    kiln__config cfg;
    kiln__err e;
    char *mat = NULL;
    parse(base, &v);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_OK(kiln__key_material(&v, &cfg, "sm_90a", &mat, &e), e.msg);
    KT_REQUIRE(mat);
    kiln__key_hash(mat, keys[0]);
    KT_CONTAINS(mat, "arch: sm_90a");
    KT_CONTAINS(mat, kiln__templates_digest);
    KT_CONTAINS(mat, kiln_nvrtc_version());
    KT_CONTAINS(mat, "--gpu-architecture=sm_90a");
    KT_CONTAINS(mat, "config: threads=");
    /* NVRTC 12.4 and newer optimise two functions at once: the option is in the key */
    int major = 0, minor = 0;
    if (sscanf(kiln_nvrtc_version(), "%d.%d", &major, &minor) == 2 &&
        (major > 12 || (major == 12 && minor >= 4)))
        KT_CONTAINS(mat, " -split-compile=2\n");
    free(mat);
    KT_EQ_INT(strlen(keys[0]), 32);
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        parse(variants[i], &v);
        KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
        KT_OK(kiln__key_material(&v, &cfg, "sm_90a", &mat, &e), e.msg);
        kiln__key_hash(mat, keys[i + 1]);
        free(mat);
        for (size_t j = 0; j <= i; j++)
            if (!strcmp(keys[i + 1], keys[j]))
                kt_fail(__FILE__, __LINE__, "key collision: %s and #%zu", variants[i], j);
    }
    /* arch changes the key */
    parse(base, &v);
    KT_OK(kiln__config_pick(&v, 80, &cfg, &e), e.msg);
    KT_OK(kiln__key_material(&v, &cfg, "sm_80", &mat, &e), e.msg);
    char k80[33];
    kiln__key_hash(mat, k80);
    free(mat);
    KT_CHECK(strcmp(k80, keys[0]) != 0);
    /* token order does not */
    parse(
        "lse=0 logits=none window=0 mask=none layout=nhd group=4 head_dim=128 dtype=f16 op=decode",
        &v);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_OK(kiln__key_material(&v, &cfg, "sm_90a", &mat, &e), e.msg);
    char again[33];
    kiln__key_hash(mat, again);
    free(mat);
    KT_EQ_STR(again, keys[0]);
    /* a tuning override changes the config and so the key */
    setenv("KILN_TUNE", "warps=2", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    unsetenv("KILN_TUNE");
    KT_OK(kiln__key_material(&v, &cfg, "sm_90a", &mat, &e), e.msg);
    kiln__key_hash(mat, again);
    free(mat);
    KT_CHECK(strcmp(again, keys[0]) != 0);
}

/* Batch decode picks its kernel by group size: tensor cores (the prefill kernel with the
 * group packed into MMA rows; above 16, a warp of 16 rows per 16 heads) for every group from 2
 * to 64 and for group 1, fp8 KV included; CUDA cores for fp8 KV with RoPE and single requests;
 * KILN_TUNE pack= overrides, and a pack the kernel cannot take is refused. */
KT_TEST(core_decode_kernel_choice)
{
    static const struct {
        const char *spec;
        int pack;
    } cases[] = {
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", 1},
        {"op=decode dtype=bf16 head_dim=128 group=8 kv=ragged", 1},
        {"op=decode dtype=f16 head_dim=128 group=16 kv=paged", 1},
        {"op=decode dtype=f16 head_dim=64 group=8 kv=paged", 1},
        {"op=decode dtype=bf16 head_dim=256 group=4 kv=paged", 1},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=8 kv=paged", 1},
        {"op=decode q_dtype=f16 kv_dtype=e5m2 out_dtype=f16 head_dim=64 group=4 kv=ragged", 1},
        /* fp8 with RoPE: rotated fp8 tiles go through shared memory, so CUDA cores */
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=8 kv=paged rope=1",
         0},
        {"op=decode dtype=bf16 head_dim=128 group=1 kv=paged", 1},
        {"op=decode dtype=bf16 head_dim=128 group=2 kv=paged", 1},
        {"op=decode dtype=f16 head_dim=64 group=3 kv=ragged", 1},
        {"op=decode dtype=bf16 head_dim=128 group=5 kv=paged", 1},
        {"op=decode dtype=bf16 head_dim=128 group=6 kv=paged", 1},
        {"op=decode q_dtype=bf16 kv_dtype=e5m2 out_dtype=bf16 head_dim=128 group=13 kv=paged", 1},
        {"op=decode dtype=f16 head_dim=64 group=32 kv=ragged", 1},
        {"op=decode dtype=bf16 head_dim=256 group=64 kv=paged", 1},
        {"op=decode dtype=bf16 head_dim=128 group=8", 0},
        {"op=prefill dtype=bf16 head_dim=128 group=8 kv=paged", 0},
    };
    kiln_variant v;
    kiln__config cfg;
    kiln__err e;
    char *src = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        parse(cases[i].spec, &v);
        KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
        if (cfg.pack != cases[i].pack)
            kt_fail(__FILE__, __LINE__, "%s: pack=%d", cases[i].spec, cfg.pack);
        KT_OK(kiln__expand(&v, &cfg, "sm_90a", &src, &e), e.msg);
        KT_REQUIRE(src);
        /* on sm_90a a prefill is the wgmma family's (core_wgmma_family_choice) */
        const char *entry = v.op == KILN_OP_PREFILL ? "kiln::wgmma_attention_kernel<kiln_cfg>"
                            : cfg.pack              ? "kiln::mma_attention_kernel<kiln_cfg>"
                                                    : "kiln::simt_decode_kernel<kiln_cfg>";
        KT_CHECK(strstr(src, entry) != NULL);
        free(src);
        src = NULL;
    }
    parse("op=decode dtype=bf16 head_dim=128 group=4 kv=paged", &v);
    setenv("KILN_TUNE", "pack=0", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(cfg.pack == 0 && cfg.gb == 4);
    /* the mma.sync family's packed prefill rows (the wgmma family's: core_wgmma_pack) */
    setenv("KILN_TUNE", "pack=1,warps=2,wgmma=0", 1);
    parse("op=prefill dtype=bf16 head_dim=128 group=8 kv=ragged", &v);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(cfg.pack == 1 && cfg.block_m == 32);
    setenv("KILN_TUNE", "pack=1", 1);
    parse("op=decode dtype=bf16 head_dim=128 group=8", &v); /* single request */
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "pack=1 needs a batch");
    /* a decode item is one token: its G rows need only fit the 16 (core_decode_pack_groups) */
    parse("op=decode dtype=bf16 head_dim=128 group=3 kv=paged", &v);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(cfg.pack == 1 && cfg.block_m == 16);
    /* above 16, a warp of 16 rows per 16 heads; fewer warps than the group needs are refused */
    parse("op=decode dtype=bf16 head_dim=128 group=32 kv=paged", &v);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(cfg.pack == 1 && cfg.warps == 2 && cfg.block_m == 32);
    setenv("KILN_TUNE", "pack=1,warps=1", 1);
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "group=32");
    KT_CONTAINS(e.msg, "within the 16 rows");
    setenv("KILN_TUNE", "pack=1,wgmma=0", 1);
    /* prefill tiles hold whole tokens */
    parse("op=prefill dtype=bf16 head_dim=128 group=3 kv=paged", &v);
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "dividing the 64 rows");
    unsetenv("KILN_TUNE");
}

/* The batch decode kernels can merge their own splits (the last CTA of each merge task,
 * fused_merge) with KILN_TUNE merge=1, on both decode families; by default they keep the merge
 * kernel (measured faster). Prefill, single decode and op=merge cannot: merge=1 there is
 * refused with the reason, and merge=2 is no value. Every config is a key of its own. */
KT_TEST(core_fused_merge_choice)
{
    static const struct {
        const char *spec;
        int sm, can;
        const char *family; /* the main entry the source calls */
    } cases[] = {
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", 90, 1, "mma_attention"},
        {"op=decode dtype=f16 head_dim=64 group=8 kv=ragged", 80, 1, "mma_attention"},
        {"op=decode dtype=bf16 head_dim=128 group=1 kv=paged lse=1", 90, 1, "mma_attention"},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=256 group=4 kv=ragged", 90,
         1, "mma_attention"},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=256 group=4 kv=ragged "
         "rope=1",
         90, 1, "simt_decode"},
        {"op=decode dtype=bf16 head_dim=128 group=4", 90, 0, "simt_decode"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=paged", 90, 0, "wgmma_attention"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged", 80, 0, "mma_attention"},
        {"op=merge dtype=bf16 head_dim=128", 90, 0, "merge_state"},
    };
    kiln_variant v;
    kiln__config cfg;
    kiln__err e;
    char conf[256], plain[256], *src = NULL;
    for (int tuned = 0; tuned < 2; tuned++) {
        if (tuned) setenv("KILN_TUNE", "merge=1", 1);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            if (tuned && !cases[i].can) continue; /* refused: below */
            const int fused = tuned;
            parse(cases[i].spec, &v);
            KT_OK(kiln__config_pick(&v, cases[i].sm, &cfg, &e), e.msg);
            if (cfg.fused_merge != fused)
                kt_fail(__FILE__, __LINE__, "%s sm_%d merge=%d: fused_merge=%d", cases[i].spec,
                        cases[i].sm, tuned, cfg.fused_merge);
            kiln__config_format(&cfg, conf, sizeof conf);
            KT_CHECK(!strstr(conf, " fused_merge=1") == !fused);
            KT_OK(kiln__expand(&v, &cfg, cases[i].sm == 90 ? "sm_90a" : "sm_80", &src, &e), e.msg);
            KT_REQUIRE(src);
            char entry[64];
            snprintf(entry, sizeof entry, "kiln::%s_kernel<kiln_cfg>", cases[i].family);
            KT_CONTAINS(src, entry);
            /* kiln_cfg says it to the families that can merge (not wgmma, not op=merge), and
             * the merge kernel stays in every batch module (merge=0 launches it) */
            const int has = v.op != KILN_OP_MERGE && !cfg.wgmma;
            KT_CHECK(!strstr(src, "static constexpr int FUSED_MERGE = 1,") == !fused);
            KT_CHECK(!strstr(src, "static constexpr int FUSED_MERGE") == !has);
            if (v.kv != KILN_KV_CONTIGUOUS && v.op != KILN_OP_MERGE)
                KT_CONTAINS(src, "kiln::batch_merge_kernel<kiln_cfg>(p);");
            free(src);
            src = NULL;
        }
    }
    unsetenv("KILN_TUNE");
    /* merge=0 is the default's config and key; merge=1 one of its own */
    parse("op=decode dtype=bf16 head_dim=128 group=4 kv=paged", &v);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    kiln__config_format(&cfg, plain, sizeof plain);
    KT_CHECK(!strstr(plain, "fused_merge"));
    setenv("KILN_TUNE", "merge=0", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_EQ_INT(cfg.fused_merge, 0);
    KT_EQ_INT(cfg.pack, 1);
    kiln__config_format(&cfg, conf, sizeof conf);
    KT_EQ_STR(conf, plain);
    char *m0 = NULL, *m1 = NULL;
    KT_OK(kiln__key_material(&v, &cfg, "sm_90a", &m0, &e), e.msg);
    setenv("KILN_TUNE", "merge=1", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    kiln__config_format(&cfg, conf, sizeof conf);
    KT_CHECK(strcmp(conf, plain) != 0 && strstr(conf, " fused_merge=1"));
    KT_OK(kiln__key_material(&v, &cfg, "sm_90a", &m1, &e), e.msg);
    KT_REQUIRE(m0 && m1);
    char k0[33], k1[33];
    kiln__key_hash(m0, k0);
    kiln__key_hash(m1, k1);
    KT_CHECK(strcmp(k0, k1) != 0);
    free(m0);
    free(m1);
    /* with the other decode family too (pack=0: CUDA cores), and the options combine */
    setenv("KILN_TUNE", "pack=0,merge=1", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(cfg.pack == 0 && cfg.gb == 4 && cfg.fused_merge == 1);
    setenv("KILN_TUNE", "pack=0", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(cfg.pack == 0 && cfg.fused_merge == 0);
    /* refusals say why */
    setenv("KILN_TUNE", "merge=1", 1);
    parse("op=prefill dtype=bf16 head_dim=128 group=4 kv=paged", &v);
    KT_STATUS(kiln__config_pick(&v, 90, &cfg, &e), KILN_STATUS_UNSUPPORTED, "prefill merge=1");
    KT_CONTAINS(e.msg, "merge=1 (KILN_TUNE): only the batch decode kernels merge their own "
                       "splits; prefill keeps the merge kernel");
    setenv("KILN_TUNE", "merge=1,wgmma=0", 1);
    KT_STATUS(kiln__config_pick(&v, 90, &cfg, &e), KILN_STATUS_UNSUPPORTED, "mma prefill merge=1");
    KT_CONTAINS(e.msg, "prefill keeps the merge kernel");
    setenv("KILN_TUNE", "merge=1", 1);
    parse("op=decode dtype=bf16 head_dim=128 group=4", &v);
    KT_STATUS(kiln__config_pick(&v, 90, &cfg, &e), KILN_STATUS_UNSUPPORTED, "single merge=1");
    KT_CONTAINS(e.msg, "a single decode (kv=contiguous) keeps the merge kernel");
    parse("op=merge dtype=bf16 head_dim=128", &v);
    KT_STATUS(kiln__config_pick(&v, 90, &cfg, &e), KILN_STATUS_UNSUPPORTED, "op=merge merge=1");
    KT_CONTAINS(e.msg, "no splits to merge");
    setenv("KILN_TUNE", "merge=2", 1);
    parse("op=decode dtype=bf16 head_dim=128 group=4 kv=paged", &v);
    KT_STATUS(kiln__config_pick(&v, 90, &cfg, &e), KILN_STATUS_UNSUPPORTED, "merge=2");
    KT_CONTAINS(e.msg, "merge is 0 (the merge kernel) or 1");
    /* merge=0 is accepted wherever: it is what the other kernels do anyway */
    setenv("KILN_TUNE", "merge=0", 1);
    parse("op=prefill dtype=bf16 head_dim=128 group=4 kv=paged", &v);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_EQ_INT(cfg.fused_merge, 0);
    unsetenv("KILN_TUNE");
}

/* The PTX of the programmatic dependent launch as the generated source spells it (jit/expand.c,
 * kiln_cfg's members): present only in a pdl=1 source. */
#define PDL_WAIT_ASM   "asm volatile(\"griddepcontrol.wait;"
#define PDL_LAUNCH_ASM "asm volatile(\"griddepcontrol.launch_dependents;"

/* The sm_90a source of spec under the config kiln__config_pick gives it (into *cfg), or NULL
 * (a test failure said why). */
static char *sm90a_source(const char *spec, kiln__config *cfg)
{
    kiln_variant v;
    kiln__err e;
    char *src = NULL;
    parse(spec, &v);
    if (kiln__config_pick(&v, 90, cfg, &e) != KILN_STATUS_OK ||
        kiln__expand(&v, cfg, "sm_90a", &src, &e) != KILN_STATUS_OK)
        kt_fail(__FILE__, __LINE__, "%s: %s", spec, e.msg);
    return src;
}

/* 1 when, in src, the definition that starts with `fn` has `first` and then `then`. */
static int in_order(const char *src, const char *fn, const char *first, const char *then)
{
    const char *f = strstr(src, fn), *a = f ? strstr(f, first) : NULL;
    const char *b = f ? strstr(f, then) : NULL;
    return a && b && a < b;
}

/* The merge kernel is a programmatic dependent launch (kiln__config.pdl, KILN_TUNE pdl=) by
 * default on sm_90 and newer wherever a merge kernel follows the main kernel: decode (single
 * and batch, both families) and batch prefill (both families). pdl=0 is accepted everywhere and
 * is the pre-PDL config and source; pdl=1 is refused, saying why and on which arch, below
 * sm_90, for a single-request prefill and op=merge (no merge kernel), and with merge=1. */
KT_TEST(core_pdl_choice)
{
    static const struct {
        const char *spec;
        int sm, pdl;     /* the default */
        const char *why; /* part of pdl=1's refusal where pdl is 0 */
    } cases[] = {
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", 90, 1, NULL},
        {"op=decode dtype=bf16 head_dim=128 group=1 kv=ragged lse=1", 90, 1, NULL},
        {"op=decode dtype=f16 head_dim=64 group=2", 90, 1, NULL},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=paged", 90, 1, NULL},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal", 100, 1, NULL},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", 80, 0,
         "pdl=1 (KILN_TUNE) on sm_80: programmatic dependent launch (griddepcontrol) needs sm_90 "
         "or newer"},
        {"op=decode dtype=f16 head_dim=64 group=2", 89, 0, "on sm_89: "},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=paged", 86, 0, "on sm_86: "},
        {"op=prefill dtype=bf16 head_dim=128 group=4", 90, 0,
         "a single-request prefill has no merge kernel"},
        {"op=merge dtype=bf16 head_dim=128", 90, 0, "op=merge kernels are launched alone"},
    };
    kiln_variant v;
    kiln__config cfg;
    kiln__err e;
    char conf[256], conf0[256], arch[16], *src = NULL, *m = NULL, *m0 = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int on = cases[i].pdl, sm = cases[i].sm;
        parse(cases[i].spec, &v);
        kiln__arch_from_sm(sm, arch);
        unsetenv("KILN_TUNE");
        KT_OK(kiln__config_pick(&v, sm, &cfg, &e), e.msg);
        if (cfg.pdl != on)
            kt_fail(__FILE__, __LINE__, "%s sm_%d: pdl=%d (want %d)", cases[i].spec, sm, cfg.pdl,
                    on);
        kiln__config_format(&cfg, conf, sizeof conf);
        KT_CHECK(!strstr(conf, " pdl=1") == !on);
        KT_OK(kiln__expand(&v, &cfg, arch, &src, &e), e.msg);
        KT_REQUIRE(src);
        KT_CHECK(!strstr(src, PDL_WAIT_ASM) == !on);
        KT_CHECK(!strstr(src, PDL_LAUNCH_ASM) == !on);
        if (v.op != KILN_OP_MERGE)
            KT_CONTAINS(src,
                        on ? "static constexpr int PDL = 1;" : "static constexpr int PDL = 0;");
        free(src);
        src = NULL;
        KT_OK(kiln__key_material(&v, &cfg, arch, &m, &e), e.msg);
        /* pdl=0: the config without " pdl=1", a source without griddepcontrol, a key of its own
         * where the default is 1 */
        setenv("KILN_TUNE", "pdl=0", 1);
        KT_OK(kiln__config_pick(&v, sm, &cfg, &e), e.msg);
        KT_EQ_INT(cfg.pdl, 0);
        kiln__config_format(&cfg, conf0, sizeof conf0);
        if (on) strcat(conf0, " pdl=1");
        KT_EQ_STR(conf0, conf);
        KT_OK(kiln__expand(&v, &cfg, arch, &src, &e), e.msg);
        KT_REQUIRE(src);
        KT_CHECK(!strstr(src, PDL_WAIT_ASM) && !strstr(src, PDL_LAUNCH_ASM));
        free(src);
        src = NULL;
        KT_OK(kiln__key_material(&v, &cfg, arch, &m0, &e), e.msg);
        KT_REQUIRE(m && m0);
        KT_CHECK(!strcmp(m, m0) == !on);
        free(m);
        free(m0);
        m = m0 = NULL;
        /* pdl=1: the default where it can be; refused with the reason where it cannot */
        setenv("KILN_TUNE", "pdl=1", 1);
        if (on) {
            KT_OK(kiln__config_pick(&v, sm, &cfg, &e), e.msg);
            kiln__config_format(&cfg, conf0, sizeof conf0);
            KT_EQ_STR(conf0, conf);
        } else {
            KT_STATUS(kiln__config_pick(&v, sm, &cfg, &e), KILN_STATUS_UNSUPPORTED, cases[i].spec);
            KT_CONTAINS(e.msg, "config: pdl=1 (KILN_TUNE) on sm_");
            KT_CONTAINS(e.msg, cases[i].why);
        }
    }
    /* no value but 0 and 1; with merge=1 no merge kernel runs: pdl 0, and pdl=1 refused */
    parse("op=decode dtype=bf16 head_dim=128 group=4 kv=paged", &v);
    setenv("KILN_TUNE", "pdl=2", 1);
    KT_STATUS(kiln__config_pick(&v, 90, &cfg, &e), KILN_STATUS_UNSUPPORTED, "pdl=2");
    KT_CONTAINS(e.msg, "pdl is 0 (the merge kernel an ordinary launch) or 1");
    setenv("KILN_TUNE", "merge=1", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(cfg.fused_merge == 1 && cfg.pdl == 0);
    setenv("KILN_TUNE", "merge=1,pdl=1", 1);
    KT_STATUS(kiln__config_pick(&v, 90, &cfg, &e), KILN_STATUS_UNSUPPORTED, "merge=1 pdl=1");
    KT_CONTAINS(e.msg, "with merge=1 the split CTAs merge their own tasks");
    unsetenv("KILN_TUNE"); /* the default: the placement of pdl=1 sources */
    /* where the instructions sit: the main kernels let the merge kernel launch before their
     * first read of the schedule; the merge kernels wait before their first partial state and
     * a padding CTA before it returns */
    src =
        sm90a_source("op=decode dtype=bf16 head_dim=128 group=8 kv=paged", &cfg); /* tensor cores */
    KT_REQUIRE(src);
    KT_CHECK(in_order(src, "void mma_attention_kernel(", "let_merge_launch<Cfg>();",
                      "mma_load_work<Cfg>(p, cx"));
    free(src);
    src = sm90a_source("op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged", &cfg); /* wgmma */
    KT_REQUIRE(src);
    KT_CHECK(cfg.wgmma && cfg.pdl);
    KT_CHECK(in_order(src, "void wgmma_attention_kernel(", "let_merge_launch<Cfg>();",
                      "num_items(p)) return;"));
    free(src);
    src = sm90a_source("op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 "
                       "kv=paged rope=1",
                       &cfg); /* CUDA cores */
    KT_REQUIRE(src);
    KT_CHECK(in_order(src, "void simt_decode_kernel(", "let_merge_launch<Cfg>();",
                      "decode_load_work<Cfg>(p);"));
    KT_CHECK(in_order(src, "void batch_merge_kernel(", "wait_main_grid<Cfg>();\n        return;",
                      "wait_main_grid<Cfg>(); /* the partial states"));
    KT_CHECK(in_order(src, "void batch_merge_kernel(",
                      "wait_main_grid<Cfg>(); /* the partial states",
                      "merge_split_element<Cfg, N>("));
    KT_CHECK(in_order(src, "void decode_merge_kernel(", "wait_main_grid<Cfg>();",
                      "merge_partials<MERGE_BATCH>("));
    KT_CONTAINS(src, "kiln::batch_merge_kernel<kiln_cfg>(p);");
    KT_CONTAINS(src, "kiln::batch_merge_kernel<kiln_cfg, kiln::MERGE_BATCH_WIDE>(p);");
    free(src);
    unsetenv("KILN_TUNE");
}

/* A spec under a KILN_TUNE setting that kiln__config_pick must refuse on sm_90
 * (KILN_STATUS_UNSUPPORTED), its message containing why. */
typedef struct {
    const char *spec, *tune, *why;
} tune_refusal;

static void check_refused(const tune_refusal *refused, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kiln_variant v;
        kiln__config c;
        kiln__err e;
        parse(refused[i].spec, &v);
        setenv("KILN_TUNE", refused[i].tune, 1);
        const kiln_status st = kiln__config_pick(&v, 90, &c, &e);
        unsetenv("KILN_TUNE");
        if (st != KILN_STATUS_UNSUPPORTED)
            kt_fail(__FILE__, __LINE__, "%s %s: status %d, not refused", refused[i].spec,
                    refused[i].tune, (int)st);
        else KT_CONTAINS(e.msg, refused[i].why);
    }
}

/* v compiled for arch in a fresh cache at dir (under the KILN_TUNE set now): no spill, and its
 * source holds in_source where that is not NULL. */
static void compiles_without_spills(const kiln_variant *v, const char *dir, const char *arch,
                                    const char *in_source)
{
    kiln_ctx *ctx = KT_CTX(dir, 0);
    KT_REQUIRE(ctx);
    kiln_kernel *k = NULL;
    KT_OK(kiln_kernel_compile(ctx, v, arch, &k), kiln_ctx_errmsg(ctx));
    if (k) {
        kiln_kernel_info info;
        KT_OK(kiln_kernel_describe(k, &info), kiln_errmsg());
        KT_EQ_INT(info.spill_bytes, 0);
        if (in_source) KT_CONTAINS(kiln_kernel_source(k), in_source);
    }
    kiln_ctx_destroy(ctx);
}

/* v compiled for sm_90a in ctx under KILN_TUNE tune (a context a setting: a context keeps the
 * kernels it made by variant), its config in *cfg and its spill bytes in *spill: the kernel, or
 * NULL (the failure reported). ptxas serializing wgmma instructions (kt_wgmma_serialized, its
 * C75xx advisories) fails the test. */
static kiln_kernel *wgmma_tuned(kiln_ctx *ctx, const kiln_variant *v, const char *tune,
                                kiln__config *cfg, int *spill)
{
    kiln__err e;
    kiln_kernel *k = NULL;
    setenv("KILN_TUNE", tune, 1);
    KT_OK(kiln__config_pick(v, 90, cfg, &e), e.msg);
    KT_OK(kiln_kernel_compile(ctx, v, "sm_90a", &k), kiln_ctx_errmsg(ctx));
    unsetenv("KILN_TUNE");
    *spill = 0;
    if (!k) return NULL;
    kiln_kernel_info info;
    KT_OK(kiln_kernel_describe(k, &info), kiln_errmsg());
    *spill = info.spill_bytes;
    if (kt_wgmma_serialized(k) != 0)
        kt_fail(__FILE__, __LINE__, "KILN_TUNE %s: ptxas serialized the wgmma instructions", tune);
    return k;
}

/* KILN_TUNE pack=1 on a prefill keeps the wgmma family and packs its rows: a job's 128 rows are
 * the G query heads of a KV head for 128 / G tokens (a single request too), so both consumer
 * warpgroups read the same tokens' key tiles. Mask data packs by default where G (2 or more)
 * divides 64, nothing else does; the config says pack= (key material), a group that does not
 * divide a warpgroup's 64 rows is refused, and each packed kernel compiles for sm_90a with no
 * more spill than its unpacked kernel (pack=0) and no wgmma serialized by ptxas (C75xx). */
KT_TEST(core_wgmma_pack)
{
    static const char *specs[] = {
        "op=prefill dtype=bf16 head_dim=128 group=4 mask_data=bsr",
        "op=prefill dtype=f16 head_dim=64 group=8 kv=ragged mask=causal lse=1",
        "op=prefill dtype=bf16 head_dim=128 group=2 kv=paged logits=softcap window=1 lse=1",
        "op=prefill q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged",
        "op=prefill dtype=bf16 head_dim=128 group=4 rope=1 mask=causal kv=ragged",
        "op=prefill dtype=bf16 head_dim=256 group=16 kv=ragged logits=alibi mask=causal",
        "op=prefill dtype=bf16 head_dim=64 group=4 mask=causal mask_data=bitmask kv=paged",
    };
    /* a context a setting: a context keeps the kernels it made by variant */
    kiln_ctx *ctxs[2] = {KT_CTX(kt_path("wgpack0"), 0), KT_CTX(kt_path("wgpack1"), 0)};
    KT_REQUIRE(ctxs[0] && ctxs[1]);
    kiln_variant v;
    kiln__config cfg;
    kiln__err e;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        parse(specs[i], &v);
        KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
        KT_EQ_INT(cfg.pack, v.mask_data != KILN_MASK_DATA_NONE);
        int spill[2] = {0, 0};
        for (int pack = 0; pack <= 1; pack++) {
            kiln_kernel *k =
                wgmma_tuned(ctxs[pack], &v, pack ? "pack=1" : "pack=0", &cfg, &spill[pack]);
            KT_CHECK(cfg.wgmma == 1 && cfg.pack == pack);
            char conf[256];
            kiln__config_format(&cfg, conf, sizeof conf);
            KT_CONTAINS(conf, pack ? "pack=1" : "pack=0");
            if (k) KT_CONTAINS(kiln_kernel_source(k), pack ? "PACK = 1," : "PACK = 0,");
        }
        if (spill[1] > spill[0])
            kt_fail(__FILE__, __LINE__, "%s: packed spills %d bytes, unpacked %d", specs[i],
                    spill[1], spill[0]);
    }
    kiln_ctx_destroy(ctxs[0]);
    kiln_ctx_destroy(ctxs[1]);
    /* groups that leave a warpgroup's 64 rows with part of a token: refused, and mask data
     * stays unpacked there; group 1 has nothing to pack; wgmma=0 keeps mma.sync's rows */
    parse("op=prefill dtype=bf16 head_dim=128 group=3 kv=ragged mask_data=bsr", &v);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(cfg.wgmma && !cfg.pack);
    parse("op=prefill dtype=bf16 head_dim=128 group=1 mask_data=bitmask", &v);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(cfg.wgmma && !cfg.pack);
    parse("op=prefill dtype=bf16 head_dim=128 group=4 kv=paged mask_data=bsr", &v);
    setenv("KILN_TUNE", "wgmma=0", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(!cfg.wgmma && !cfg.pack);
    unsetenv("KILN_TUNE");
    static const tune_refusal refused[] = {
        {"op=prefill dtype=bf16 head_dim=128 group=3 kv=ragged", "pack=1",
         "pack=1 on the wgmma family needs a group dividing 64"},
    };
    check_refused(refused, sizeof refused / sizeof refused[0]);
}

/* KILN_TUNE persist=2 on a single request with element masks: the dynamic persistent grid
 * claims its jobs from an int after the tile map (kiln_tile_map_counter_at), so the map's size
 * grows by KILN_TILE_MAP_TAIL_BYTES there and nowhere else; the kernel compiles for sm_90a within
 * the persistent grids' spill allowance and with no wgmma serialized. Opt-in:
 * not yet run on a GPU (gpu_wgmma_persist_maskdata is its test). */
KT_TEST(core_wgmma_single_dynamic)
{
    static const char *specs[] = {
        "op=prefill dtype=bf16 head_dim=128 group=4 mask_data=bsr",
        "op=prefill dtype=f16 head_dim=64 group=1 mask=causal mask_data=bitmask lse=1",
    };
    kiln_ctx *ctxs[2] = {KT_CTX(kt_path("wgdyn1"), 0), KT_CTX(kt_path("wgdyn2"), 0)};
    KT_REQUIRE(ctxs[0] && ctxs[1]);
    kiln_variant v;
    kiln__config cfg;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        parse(specs[i], &v);
        int spill[2] = {0, 0};
        for (int dyn = 0; dyn <= 1; dyn++) {
            kiln_kernel *k =
                wgmma_tuned(ctxs[dyn], &v, dyn ? "persist=2" : "persist=1", &cfg, &spill[dyn]);
            KT_EQ_INT(cfg.persist, dyn ? KILN_WGMMA_PERSIST_DYNAMIC : KILN_WGMMA_PERSIST_STATIC);
            if (!k) continue;
            /* 1000 query tokens over 3000 keys: map rows of 64 packed rows, 64-key tiles */
            const long long rows = (1000LL * (cfg.pack ? v.group : 1) + 63) / 64, tiles = 47;
            size_t bytes = 0;
            KT_OK(kiln_prefill_tile_map_size(k, 1000, 3000, &bytes), kiln_errmsg());
            KT_EQ_INT((long long)bytes,
                      dyn ? kiln_tile_map_counter_at(rows * tiles) + KILN_TILE_MAP_TAIL_BYTES
                          : rows * tiles);
        }
        /* the persistent grids' producer runs at 40 registers: plan_batch_kernels_compile
         * allows their kernels 160 bytes (the batch kernels' persist=2 included) */
        if (spill[1] > 160 || spill[0] > 160)
            kt_fail(__FILE__, __LINE__, "%s: persist=2 spills %d bytes, persist=1 %d", specs[i],
                    spill[1], spill[0]);
    }
    kiln_ctx_destroy(ctxs[0]);
    kiln_ctx_destroy(ctxs[1]);
    /* without an element mask a single request has no map to count in */
    static const tune_refusal refused[] = {
        {"op=prefill dtype=bf16 head_dim=128 group=4 mask=causal", "persist=2", "kv=contiguous"},
    };
    check_refused(refused, sizeof refused / sizeof refused[0]);
}

/* KILN_TUNE pack=1 puts a batch decode of any group on tensor cores, the groups that do not
 * divide the MMA's 16 rows included (a decode item is one token; rows G .. 15 are padding),
 * and groups above 16 on a warp of 16 rows per 16 heads (2 to 4 warps sharing each K/V tile):
 * the kernels compile with NVRTC for sm_90a and sm_80 without spills. Every group from 2 packs
 * by default (core_decode_kernel_choice), with the config, so the key, of the tune. */
KT_TEST(core_decode_pack_groups)
{
    static const char *const specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1",
        "op=decode dtype=f16 head_dim=64 group=5 kv=ragged logits=softcap",
        "op=decode dtype=bf16 head_dim=256 group=6 kv=paged logits=alibi window=1 lse=1",
        "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=7 kv=paged lse=1",
        "op=decode q_dtype=bf16 kv_dtype=e5m2 out_dtype=bf16 head_dim=128 group=13 kv=paged",
        "op=decode dtype=bf16 head_dim=128 group=20 kv=paged lse=1",
        "op=decode dtype=f16 head_dim=64 group=64 kv=ragged logits=softcap window=1",
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kiln_variant v;
        kiln__config c;
        kiln__err e;
        parse(specs[i], &v);
        unsetenv("KILN_TUNE");
        KT_OK(kiln__config_pick(&v, 90, &c, &e), e.msg);
        char byd[256], bytune[256];
        kiln__config_format(&c, byd, sizeof byd);
        KT_CHECK(c.pack == 1);
        setenv("KILN_TUNE", "pack=1", 1);
        KT_OK(kiln__config_pick(&v, 90, &c, &e), e.msg);
        kiln__config_format(&c, bytune, sizeof bytune);
        KT_EQ_STR(byd, bytune);
        const int warps = (v.group + 15) / 16;
        KT_CHECK(c.pack == 1 && c.block_m == 16 * warps && c.warps == warps);
        for (int a = 0; a < 2; a++) {
            char dir[600];
            snprintf(dir, sizeof dir, "%s/packg%zu%d", kt_tmpdir(), i, a);
            compiles_without_spills(&v, dir, a ? "sm_80" : "sm_90a", NULL);
        }
        unsetenv("KILN_TUNE");
    }
}

/* KILN_TUNE persist=1 puts the tensor-core batch decode on its persistent grid
 * (mma_decode_persist.cuh): its config line and key say so, its source calls that kernel and
 * compiles for sm_90a and sm_80 without spills; the decode kernels it cannot serve are refused
 * with the reason (CUDA cores, d256's Q from shared memory, fp8 KV, RoPE, a mask snippet,
 * merge=1), and persist=0 leaves the config line as it was. */
KT_TEST(core_decode_persist)
{
    static const char *const ok[] = {
        "op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1",
        "op=decode dtype=f16 head_dim=64 group=8 kv=ragged logits=softcap"};
    for (int i = 0; i < 2; i++) {
        kiln_variant v;
        kiln__config c0, c1;
        kiln__err e;
        char f0[256], f1[256];
        parse(ok[i], &v);
        KT_OK(kiln__config_pick(&v, 90, &c0, &e), e.msg);
        setenv("KILN_TUNE", "persist=1", 1);
        KT_OK(kiln__config_pick(&v, 90, &c1, &e), e.msg);
        kiln__config_format(&c0, f0, sizeof f0);
        kiln__config_format(&c1, f1, sizeof f1);
        KT_CHECK(c0.persist == 0 && c1.persist == 1 && c1.pack && !c1.wgmma);
        KT_CHECK(!strstr(f0, "persist"));
        KT_CONTAINS(f1, " persist=1");
        char *src = sm90a_source(ok[i], &c1);
        if (src) {
            KT_CONTAINS(src, "kiln::mma_decode_persist_kernel<kiln_cfg>(p);");
            KT_EQ_STR(kiln__source_family(src), "mma.sync");
            free(src);
        }
        for (int a = 0; a < 2; a++) {
            char dir[600];
            snprintf(dir, sizeof dir, "%s/persist%d", kt_tmpdir(), i);
            compiles_without_spills(&v, dir, a ? "sm_80" : "sm_90a", "mma_decode_persist_kernel");
        }
        unsetenv("KILN_TUNE");
    }
    static const tune_refusal refused[] = {
        {"op=decode dtype=bf16 head_dim=128 group=1 kv=paged", "pack=0,persist=1",
         "wgmma family's"},
        {"op=decode dtype=bf16 head_dim=256 group=4 kv=paged", "persist=1", "Q in registers"},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged",
         "persist=1", "fp8"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged rope=1", "persist=1", "RoPE"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", "persist=1,merge=1", "merge kernel"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", "persist=2", "0 (a CTA per"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=paged", "persist=1,wgmma=0",
         "tensor-core decode"},
    };
    check_refused(refused, sizeof refused / sizeof refused[0]);
}

/* A spec's sm_90 configs without and with a KILN_TUNE option, and their config lines. */
typedef struct {
    kiln_variant v;
    kiln__config c0, c1; /* under KILN_TUNE base (unset where NULL), then under base's tune */
    char f0[256], f1[256];
} tune_pair;

/* Fill t for spec; KILN_TUNE is left set to tune (the caller compiles under it, then unsets
 * it). 0 where a pick failed (a test failure says why). */
static int tune_pair_pick(tune_pair *t, const char *spec, const char *base, const char *tune)
{
    kiln__err e;
    parse(spec, &t->v);
    if (base) setenv("KILN_TUNE", base, 1);
    else unsetenv("KILN_TUNE");
    if (kiln__config_pick(&t->v, 90, &t->c0, &e) != KILN_STATUS_OK) {
        kt_fail(__FILE__, __LINE__, "%s under '%s': %s", spec, base ? base : "", e.msg);
        return 0;
    }
    setenv("KILN_TUNE", tune, 1);
    if (kiln__config_pick(&t->v, 90, &t->c1, &e) != KILN_STATUS_OK) {
        kt_fail(__FILE__, __LINE__, "%s under '%s': %s", spec, tune, e.msg);
        return 0;
    }
    kiln__config_format(&t->c0, t->f0, sizeof t->f0);
    kiln__config_format(&t->c1, t->f1, sizeof t->f1);
    return 1;
}

/* KILN_TUNE ksplit= splits the keys of the one-warp tensor-core decode over 2, 4 or 8 warps of
 * one CTA (mma_attention.cuh KSPLIT): the config line and key say so, the threads and shared
 * memory are ksplit times the one warp's (its layout 128-byte aligned), the source names
 * KSPLIT, and the kernel compiles for sm_90a without spills (sm_80 at ksplit=2: four d128
 * pipelines pass its shared memory); the kernels it cannot serve are refused with the reason,
 * and ksplit=1 is the kernel without it. */
KT_TEST(core_decode_ksplit)
{
    static const struct {
        const char *spec, *tune;
    } ok[] = {
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "ksplit=4"},
        {"op=decode dtype=f16 head_dim=64 group=8 kv=ragged logits=softcap", "ksplit=2"},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged",
         "ksplit=4"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        tune_pair t;
        char want[32];
        if (!tune_pair_pick(&t, ok[i].spec, NULL, ok[i].tune)) continue;
        const kiln__config c0 = t.c0, c1 = t.c1;
        const int n = atoi(strchr(ok[i].tune, '=') + 1);
        KT_CHECK(c0.ksplit == 0 && c1.ksplit == n && c1.pack && c1.warps == 1);
        KT_CHECK(!strstr(t.f0, "ksplit"));
        snprintf(want, sizeof want, " ksplit=%d", n);
        KT_CONTAINS(t.f1, want);
        KT_EQ_INT(c1.threads, 32 * n);
        KT_EQ_INT(c1.smem_bytes, n * ((c0.smem_bytes + 127) / 128 * 128));
        char *src = sm90a_source(ok[i].spec, &t.c1);
        if (src) {
            snprintf(want, sizeof want, "KSPLIT = %d,", n);
            KT_CONTAINS(src, want);
            free(src);
        }
        for (int a = 0; a < 2; a++) {
            if (a && n > 2) continue; /* sm_80's 163 KiB hold two d128 pipelines, not four */
            char dir[600];
            snprintf(dir, sizeof dir, "%s/ksplit%zu", kt_tmpdir(), i);
            compiles_without_spills(&t.v, dir, a ? "sm_80" : "sm_90a", NULL);
        }
        tune_pair one; /* ksplit=1, one pipeline: the default kernel */
        if (tune_pair_pick(&one, ok[i].spec, NULL, "ksplit=1")) KT_EQ_STR(one.f1, t.f0);
        unsetenv("KILN_TUNE");
    }
    static const tune_refusal refused[] = {
        {"op=decode dtype=bf16 head_dim=128 group=1 kv=paged", "pack=0,ksplit=4",
         "tensor-core batch decode"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=paged", "ksplit=2",
         "tensor-core batch decode"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged rope=1", "ksplit=2", "RoPE"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", "ksplit=2,merge=1", "merge kernel"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", "ksplit=2,persist=1", "persistent"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", "ksplit=3", "1, 2, 4 or 8"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", "ksplit=8", "shared memory"},
    };
    check_refused(refused, sizeof refused / sizeof refused[0]);
}

/* KILN_TUNE hx=1 gives an item's KV heads adjacent CTAs in the packed mma.sync batch kernels
 * (mma_attention.cuh HX): the config line and the source say so (the default's say hx=0 nowhere
 * but the source's HX = 0), the kernel compiles for sm_90a and sm_80 without spills, with the
 * key split too; the kernels it cannot serve are refused with the reason. The tensor-core decode
 * takes it by default where a KV head's row is at most 128 bytes (d64 16-bit, fp8 up to d128),
 * unless KILN_TUNE says hx=0, merge=1 or persist=1. */
KT_TEST(core_decode_hx)
{
    static const struct {
        const char *spec, *tune;
    } ok[] = {
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "hx=1"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "hx=1,ksplit=2"},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=256 group=8 kv=ragged",
         "hx=1"},
    };
    static const struct {
        const char *spec, *tune;
        int hx;
    } by_default[] = {
        {"op=decode dtype=bf16 head_dim=64 group=4 kv=paged lse=1", "", 1},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=8 kv=ragged", "",
         1},
        {"op=decode q_dtype=f16 kv_dtype=e5m2 out_dtype=f16 head_dim=64 group=1 kv=paged", "", 1},
        {"op=decode dtype=f16 head_dim=64 group=8 kv=ragged", "ksplit=2", 1},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", "", 0},
        {"op=decode dtype=bf16 head_dim=256 group=4 kv=paged", "", 0},
        {"op=decode dtype=bf16 head_dim=64 group=4 kv=paged lse=1", "hx=0", 0},
        {"op=decode dtype=bf16 head_dim=64 group=4 kv=paged lse=1", "merge=1", 0},
        {"op=decode dtype=bf16 head_dim=64 group=4 kv=paged lse=1", "persist=1", 0},
        {"op=decode dtype=bf16 head_dim=64 group=4", "", 0},                      /* single */
        {"op=prefill dtype=bf16 head_dim=64 group=4 kv=paged q_tokens=4", "", 0}, /* prefill */
    };
    for (size_t i = 0; i < sizeof by_default / sizeof by_default[0]; i++) {
        kiln_variant v;
        kiln__config c;
        kiln__err e;
        parse(by_default[i].spec, &v);
        setenv("KILN_TUNE", by_default[i].tune, 1);
        KT_OK(kiln__config_pick(&v, 90, &c, &e), e.msg);
        unsetenv("KILN_TUNE");
        if (c.hx != by_default[i].hx)
            kt_fail(__FILE__, __LINE__, "%s [%s]: hx=%d", by_default[i].spec, by_default[i].tune,
                    c.hx);
    }
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        tune_pair t;
        if (!tune_pair_pick(&t, ok[i].spec, NULL, ok[i].tune)) continue;
        KT_CHECK(t.c0.hx == 0 && t.c1.hx == 1 && t.c1.pack);
        KT_CHECK(!strstr(t.f0, "hx="));
        KT_CONTAINS(t.f1, " hx=1");
        char *src = sm90a_source(ok[i].spec, &t.c1);
        if (src) {
            KT_CONTAINS(src, "HX = 1;");
            free(src);
        }
        for (int a = 0; a < 2; a++) {
            char dir[600];
            snprintf(dir, sizeof dir, "%s/hx%zu%d", kt_tmpdir(), i, a);
            compiles_without_spills(&t.v, dir, a ? "sm_80" : "sm_90a", NULL);
        }
        unsetenv("KILN_TUNE");
    }
    static const tune_refusal refused[] = {
        {"op=decode dtype=bf16 head_dim=128 group=1 kv=paged", "pack=0,hx=1", "packed mma.sync"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=paged", "hx=1", "packed mma.sync"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", "hx=1,merge=1", "fused merge"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", "hx=1,persist=1", "persistent"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", "hx=2", "0 or 1"},
    };
    check_refused(refused, sizeof refused / sizeof refused[0]);
}

/* KILN_TUNE bulk=1 copies the tensor-core decode's K/V rows by cp.async.bulk into padded rows,
 * bulk=2 its whole tiles' pages as TMA boxes (mma_attention.cuh BULK): the config line, the
 * source and the shared memory say so (an mbarrier a stage; bulk=1 16 bytes more a row, bulk=2
 * the boxes' page table and its alignment), the kernels compile for sm_90a without spills (with
 * the key split and at group 3 too), bulk=2's layout is the TMA swizzle's; sm_80 and the kernels
 * it cannot serve are refused with the reason. */
KT_TEST(core_decode_bulk)
{
    static const struct {
        const char *spec, *tune;
    } ok[] = {
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "bulk=1"},
        {"op=decode dtype=f16 head_dim=64 group=8 kv=ragged logits=softcap", "bulk=1"},
        {"op=decode dtype=bf16 head_dim=256 group=4 kv=paged logits=alibi window=1", "bulk=1"},
        {"op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1", "pack=1,bulk=1"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "bulk=1,ksplit=2,hx=1"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "bulk=2"},
        {"op=decode dtype=f16 head_dim=64 group=8 kv=ragged logits=softcap", "bulk=2"},
        {"op=decode dtype=bf16 head_dim=256 group=4 kv=paged logits=alibi window=1", "bulk=2"},
        {"op=decode dtype=bf16 head_dim=128 group=3 kv=paged lse=1", "pack=1,bulk=2"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged lse=1", "bulk=2,ksplit=2,hx=1"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        tune_pair t;
        if (!tune_pair_pick(&t, ok[i].spec, strstr(ok[i].tune, "pack=1") ? "pack=1" : NULL,
                            ok[i].tune))
            continue;
        const kiln__config c0 = t.c0, c1 = t.c1;
        const int bulk = strstr(ok[i].tune, "bulk=2") ? 2 : 1;
        KT_CHECK(c0.bulk == 0 && c1.bulk == bulk && c1.pack);
        KT_CHECK(!strstr(t.f0, "bulk="));
        KT_CONTAINS(t.f1, bulk == 2 ? " bulk=2" : " bulk=1");
        /* an mbarrier a stage in each pipeline (c0 has one), and bulk=1: a pad of 16 bytes a K
         * and V row; bulk=2: a page and row a key of the paged table, regions 1024-byte
         * aligned and 1024 bytes for the first one's shift */
        const int paged = strstr(ok[i].spec, "kv=paged") != NULL;
        const int one = c0.smem_bytes + 8 * c1.stages +
                        (bulk == 1 ? 2 * c1.stages * c1.block_n * 16 : paged * c1.block_n * 8);
        KT_EQ_INT(c1.smem_bytes, (c1.ksplit ? c1.ksplit * kiln_ksplit_region(one, bulk) : one) +
                                     (bulk == 2 ? 1024 : 0));
        KT_EQ_INT(kiln_prefill_cta_bytes(one, c1.ksplit, bulk), c1.smem_bytes);
        KT_EQ_INT(kiln__config_tma_maps(&c1), bulk == 2);
        char *src = sm90a_source(ok[i].spec, &t.c1);
        if (src) {
            KT_CONTAINS(src, bulk == 2 ? "BULK = 2;" : "BULK = 1;");
            if (bulk == 2) { /* the maps are the kernel's second argument */
                KT_CONTAINS(src, "const __grid_constant__ kiln_tma_maps m)");
                KT_CONTAINS(src, "mma_attention_kernel<kiln_cfg>(p, &m)");
            }
            KT_CONTAINS(src, bulk == 2 ? "cp.async.bulk.tensor.3d.shared::cluster.global.tile"
                                       : "cp.async.bulk.shared::cluster.global.mbarrier::"
                                         "complete_tx::bytes");
            free(src);
        }
        char dir[600];
        snprintf(dir, sizeof dir, "%s/bulk%zu", kt_tmpdir(), i);
        compiles_without_spills(&t.v, dir, "sm_90a", NULL);
        unsetenv("KILN_TUNE");
    }
    /* bulk=2's stage layout: every chunk of a [bn][d] tile at its own 16 bytes, inside the
     * tile, a row's chunks on distinct banks within each 64-column block, and a box of 8 rows
     * at a 1024-byte boundary is the 128-byte swizzle's pattern (chunk ^ row & 7) */
    for (int d = 64; d <= 256; d *= 2)
        for (int bn = 16; bn <= 64; bn *= 2) {
            static unsigned char seen[64 * 512];
            memset(seen, 0, sizeof seen);
            int bad = 0;
            for (int r = 0; r < bn; r++)
                for (int c = 0; c < d / 8; c++) {
                    const int at = kiln_kv_box_at(bn, r, c);
                    if (at % 16 || at < 0 || at >= bn * d * 2 || seen[at / 16]++) bad++;
                    if ((at / 1024) * 1024 != (c / 8) * bn * 128 + (r / 8) * 1024) bad++;
                    if ((at % 1024) / 128 != r % 8 || (at % 128) / 16 != ((c % 8) ^ (r % 8))) bad++;
                }
            KT_EQ_INT(bad, 0);
        }
    /* sm_80 has no bulk copies */
    {
        kiln_variant v;
        kiln__config c;
        kiln__err e;
        parse("op=decode dtype=bf16 head_dim=128 group=4 kv=paged", &v);
        setenv("KILN_TUNE", "bulk=1", 1);
        KT_CHECK(kiln__config_pick(&v, 80, &c, &e) == KILN_STATUS_UNSUPPORTED);
        KT_CONTAINS(e.msg, "sm_90 or newer");
        unsetenv("KILN_TUNE");
    }
    static const tune_refusal refused[] = {
        {"op=decode dtype=bf16 head_dim=128 group=1 kv=paged", "pack=0,bulk=1",
         "tensor-core batch decode"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 kv=paged", "bulk=1",
         "tensor-core batch decode"},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged",
         "bulk=1", "fp8 KV"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged rope=1", "bulk=1", "RoPE"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", "bulk=1,persist=1", "persistent"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", "bulk=3", "bulk is 0, 1"},
        {"op=decode dtype=bf16 head_dim=128 group=1 kv=paged", "pack=0,bulk=2",
         "tensor-core batch decode"},
        {"op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged",
         "bulk=2", "fp8 KV"},
    };
    check_refused(refused, sizeof refused / sizeof refused[0]);
}

/* A pdl=1 kernel compiles with NVRTC (griddepcontrol in both entries, sm_90a), as its pdl=0
 * twin does, under keys of their own and without spills: the CUDA-core batch decode and the
 * tensor-core one. */
KT_TEST(core_pdl_compile)
{
    const char *specs[] = {"op=decode dtype=bf16 head_dim=128 group=1 kv=paged",
                           "op=decode dtype=bf16 head_dim=128 group=8 kv=paged"};
    for (int s = 0; s < 2; s++) {
        char key[2][33];
        for (int pdl = 0; pdl < 2; pdl++) {
            char dir[600];
            snprintf(dir, sizeof dir, "%s/pdl%d", kt_tmpdir(), pdl);
            setenv("KILN_TUNE", pdl ? "pdl=1" : "pdl=0", 1);
            kiln_ctx *ctx = KT_CTX(dir, 0); /* a memo of its own: it is keyed without KILN_TUNE */
            KT_REQUIRE(ctx);
            kiln_variant v;
            parse(specs[s], &v);
            kiln_kernel *k = NULL;
            KT_OK(kiln_kernel_compile(ctx, &v, "sm_90a", &k), kiln_ctx_errmsg(ctx));
            if (k) {
                kiln_kernel_info info;
                KT_OK(kiln_kernel_describe(k, &info), kiln_errmsg());
                memcpy(key[pdl], info.key, 33);
                KT_EQ_INT(info.spill_bytes, 0);
                KT_CHECK(!strstr(kiln_kernel_source(k), PDL_WAIT_ASM) == !pdl);
                KT_CONTAINS(kiln_kernel_log(k), "Compiling entry function 'kiln_merge'");
                /* the wide merge (64 states a round trip) fits its registers */
                KT_CONTAINS(kiln_kernel_log(k), "Compiling entry function 'kiln_merge_wide'");
                int regs = 0, smem = 0, spill = -1, stack = -1;
                kiln__ptxas_parse(kiln_kernel_log(k), "kiln_merge_wide", &regs, &smem, &spill,
                                  &stack);
                KT_EQ_INT(spill, 0);
                KT_CHECK(regs > 0 && regs <= 255);
            }
            kiln_ctx_destroy(ctx);
        }
        KT_CHECK(strcmp(key[0], key[1]) != 0);
    }
    unsetenv("KILN_TUNE");
}

/* Prefill on sm_90 takes the warp-specialized wgmma family at head dims 64, 128 and 256, mask
 * data included; where it cannot (q_tokens, decode, other archs) the other families stay;
 * kiln__wgmma_refusal says why.
 * KILN_TUNE wgmma=0 forces the mma.sync family; wgmma=1 takes wgmma where it can run, and is
 * refused where it cannot. */
KT_TEST(core_wgmma_family_choice)
{
    static const struct {
        const char *spec;
        int sm, wgmma, can;
        const char *why; /* part of the reason, or NULL */
    } cases[] = {
        {"op=prefill dtype=bf16 head_dim=128 group=4 mask=causal", 90, 1, 1, NULL},
        {"op=prefill dtype=f16 head_dim=128 group=1 kv=paged lse=1", 90, 1, 1, NULL},
        {"op=prefill dtype=bf16 head_dim=128 group=8 kv=ragged logits=softcap window=1", 90, 1, 1,
         NULL},
        {"op=prefill dtype=f16 head_dim=64 group=1 kv=paged lse=1", 90, 1, 1, NULL},
        {"op=prefill dtype=bf16 head_dim=256 group=8 kv=ragged", 90, 1, 1, NULL},
        {"op=prefill dtype=bf16 head_dim=128 group=4 mask_data=bsr", 90, 1, 1, NULL},
        {"op=prefill dtype=f16 head_dim=64 group=1 mask=causal mask_data=bitmask kv=paged", 90, 1,
         1, NULL},
        {"op=prefill dtype=bf16 head_dim=128 group=4 mask=causal", 80, 0, 0, "sm_90a"},
        {"op=prefill dtype=bf16 head_dim=128 group=4 mask=causal", 100, 0, 0, "sm_90a"},
        /* fp8 KV and RoPE: the producer's transforms (raw stages beside the 16-bit ones) */
        {"op=prefill dtype=bf16 head_dim=128 group=4 rope=1 kv=ragged", 90, 1, 1, NULL},
        {"op=prefill q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged", 90,
         1, 1, NULL},
        {"op=prefill q_dtype=f16 kv_dtype=e5m2 out_dtype=f16 head_dim=64 group=1 rope=1 kv=ragged",
         90, 1, 1, NULL},
        {"op=prefill q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=256 group=8 kv=ragged "
         "rope=1 logits=alibi",
         90, 1, 1, NULL},
        {"op=prefill q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged "
         "q_tokens=4",
         90, 0, 0, "q_tokens"},
        {"op=decode dtype=bf16 head_dim=128 group=4 kv=paged", 90, 0, 0, "decode"},
    };
    kiln_variant v;
    kiln__config cfg;
    kiln__err e;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        parse(cases[i].spec, &v);
        KT_OK(kiln__config_pick(&v, cases[i].sm, &cfg, &e), e.msg);
        if (cfg.wgmma != cases[i].wgmma)
            kt_fail(__FILE__, __LINE__, "%s sm_%d: wgmma=%d", cases[i].spec, cases[i].sm,
                    cfg.wgmma);
        int can = -1;
        const char *why = kiln__wgmma_refusal(&v, cases[i].sm, &can);
        KT_CHECK(!why == !cases[i].why);
        KT_EQ_INT(can, cases[i].can);
        if (why && cases[i].why) KT_CONTAINS(why, cases[i].why);
        char conf[256];
        kiln__config_format(&cfg, conf, sizeof conf);
        KT_CHECK(!strstr(conf, "wgmma=1") == !cfg.wgmma);
        /* where it could run, KILN_TUNE wgmma=1 takes it */
        if (can && !cfg.wgmma) {
            setenv("KILN_TUNE", "wgmma=1", 1);
            KT_OK(kiln__config_pick(&v, cases[i].sm, &cfg, &e), e.msg);
            unsetenv("KILN_TUNE");
            KT_CHECK(cfg.wgmma == 1);
        }
        if (cfg.wgmma) {
            KT_CHECK(cfg.threads == 384 && cfg.block_m == 128 && cfg.warps == 8 && cfg.mt == 1);
            KT_CHECK(cfg.smem_bytes <= kiln__smem_limit(90));
            /* the transforms' raw stages: two beside two 16-bit stages at d128, one at d256 */
            const int es = v.kv_dtype == KILN_DTYPE_E4M3 || v.kv_dtype == KILN_DTYPE_E5M2 ? 1 : 2;
            const int raw = kiln_wgmma_raw_stages(v.head_dim, es, v.rope);
            KT_EQ_INT(raw, es == 1 || v.rope ? (v.head_dim == 256 ? 1 : 2) : 0);
            if (raw && v.head_dim >= 128) KT_EQ_INT(cfg.stages, 2);
            KT_EQ_INT(cfg.smem_bytes,
                      kiln_wgmma_smem_bytes(v.head_dim, 128, cfg.block_n, cfg.stages, es, v.rope));
            char *src = NULL;
            KT_OK(kiln__expand(&v, &cfg, "sm_90a", &src, &e), e.msg);
            KT_REQUIRE(src);
            KT_CHECK(strstr(src, "kiln::wgmma_attention_kernel<kiln_cfg>") != NULL);
            KT_CHECK(strstr(src, "__launch_bounds__(384, 1)") != NULL);
            /* TMA (through a page table: a box per page), the maps the second argument */
            KT_EQ_INT(cfg.load, KILN_WGMMA_LOAD_TMA);
            KT_CHECK(strstr(src, "const __grid_constant__ kiln_tma_maps m") != NULL);
            /* the grid: claimed jobs for a batch at d64 / d128, a CTA per tile otherwise */
            KT_EQ_INT(cfg.persist, v.kv != KILN_KV_CONTIGUOUS && v.head_dim <= 128
                                       ? KILN_WGMMA_PERSIST_DYNAMIC
                                       : KILN_WGMMA_PERSIST_NONE);
            kiln__config_format(&cfg, conf, sizeof conf);
            KT_CONTAINS(conf, " wgmma=1 load=2 persist=");
            free(src);
        }
    }
    parse("op=prefill dtype=bf16 head_dim=128 group=4 mask=causal", &v);
    setenv("KILN_TUNE", "wgmma=0", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(cfg.wgmma == 0 && cfg.threads == cfg.warps * 32);
    setenv("KILN_TUNE", "wgmma=1", 1);
    KT_CHECK(kiln__config_pick(&v, 80, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "wgmma needs sm_90a");
    setenv("KILN_TUNE", "wgmma=1,bn=96", 1);
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "bn 64, 80, 128, 176, 192 or 256");
    setenv("KILN_TUNE", "wgmma=1,bn=176,load=0", 1); /* a row a thread: 64 or 128 keys */
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "64 or 128 with load=0");
    setenv("KILN_TUNE", "wgmma=1,bn=176,stages=2", 1); /* an m64n176 S: 209 KiB */
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(cfg.wgmma && cfg.block_n == 176 && cfg.stages == 2);
    setenv("KILN_TUNE", "wgmma=1,bn=176,stages=3", 1); /* 297 KiB: over sm_90's 227 */
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "shared memory");
    setenv("KILN_TUNE", "stages=1",
           1); /* would deadlock: stage n - 1 is freed after tile n lands */
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "2-4 stages");
    setenv("KILN_TUNE", "bn=64,stages=4", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_CHECK(cfg.wgmma && cfg.block_n == 64 && cfg.stages == 4);
    /* the producer's other row copy: its own key, and only on the wgmma family */
    char conf[256];
    setenv("KILN_TUNE", "load=1", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    kiln__config_format(&cfg, conf, sizeof conf);
    KT_CONTAINS(conf, " wgmma=1 load=1");
    KT_CHECK(kiln__config_pick(&v, 80, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "load=");
    /* a persistent grid: its own key; the wgmma family's only */
    char plain[256];
    char *src0 = NULL;
    unsetenv("KILN_TUNE");
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    kiln__config_format(&cfg, plain, sizeof plain);
    KT_CHECK(cfg.persist == KILN_WGMMA_PERSIST_NONE);
    setenv("KILN_TUNE", "persist=1", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    kiln__config_format(&cfg, conf, sizeof conf);
    KT_CHECK(cfg.persist == 1 && strcmp(conf, plain) != 0);
    KT_CONTAINS(conf, " persist=1");
    KT_CHECK(kiln__config_pick(&v, 80, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "persist=");
    /* the dynamic grid claims jobs from a batch schedule's counter: refused for a single
     * request without element masks (with them, its tile map holds the counter:
     * core_wgmma_single_dynamic), its own key for a batch; persist=3 is no grid */
    setenv("KILN_TUNE", "persist=2", 1);
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "kv=contiguous");
    setenv("KILN_TUNE", "persist=3", 1);
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "persist 0, 1 or 2");
    parse("op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged", &v);
    setenv("KILN_TUNE", "persist=2", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    kiln__config_format(&cfg, conf, sizeof conf);
    KT_CHECK(cfg.persist == KILN_WGMMA_PERSIST_DYNAMIC);
    KT_CONTAINS(conf, " persist=2");
    /* a persistent grid can issue a job's last P V with the next job's first S (xjob=1, opt-in
     * until it has run on a GPU); its own key; a CTA per tile has no next job: refused there */
    KT_EQ_INT(cfg.xjob, 0);
    KT_CONTAINS(conf, " xjob=0");
    setenv("KILN_TUNE", "persist=2 xjob=1", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    kiln__config_format(&cfg, conf, sizeof conf);
    KT_CONTAINS(conf, " xjob=1");
    setenv("KILN_TUNE", "persist=2 xjob=0", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    kiln__config_format(&cfg, plain, sizeof plain);
    KT_CHECK(cfg.xjob == 0 && strcmp(conf, plain) != 0);
    KT_OK(kiln__expand(&v, &cfg, "sm_90a", &src0, &e), e.msg);
    KT_REQUIRE(src0);
    KT_CONTAINS(src0, "PERSIST = 2, XJOB = 0, KVSPLIT = 0;");
    free(src0);
    setenv("KILN_TUNE", "persist=0 xjob=1", 1);
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "needs a persistent grid");
    setenv("KILN_TUNE", "xjob=2", 1);
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "xjob is 0 or 1");
    setenv("KILN_TUNE", "persist=0", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_EQ_INT(cfg.xjob, 0);
    /* K and V on barriers of their own (kvsplit): by default at d256 and where the producer
     * transforms K (fp8 KV, RoPE), not at d128 bf16; KILN_TUNE sets it either way, its own
     * key; 2 is refused, and so is the field on the mma.sync family */
    unsetenv("KILN_TUNE");
    static const struct {
        const char *spec;
        int split;
    } splits[] = {{"op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged", 0},
                  {"op=prefill dtype=bf16 head_dim=64 group=4 kv=ragged mask=causal", 0},
                  {"op=prefill dtype=bf16 head_dim=256 group=4 kv=ragged", 1},
                  {"op=prefill q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 "
                   "kv=paged",
                   1},
                  {"op=prefill dtype=f16 head_dim=128 group=4 kv=ragged rope=1", 1}};
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
        parse(splits[i].spec, &v);
        KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
        KT_CHECK(cfg.wgmma);
        KT_EQ_INT(cfg.kvsplit, splits[i].split);
    }
    parse("op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged", &v);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    kiln__config_format(&cfg, plain, sizeof plain);
    KT_CONTAINS(plain, " kvsplit=0");
    setenv("KILN_TUNE", "kvsplit=1", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    kiln__config_format(&cfg, conf, sizeof conf);
    KT_CHECK(cfg.kvsplit == 1 && strcmp(conf, plain) != 0);
    KT_OK(kiln__expand(&v, &cfg, "sm_90a", &src0, &e), e.msg);
    KT_REQUIRE(src0);
    KT_CONTAINS(src0, "KVSPLIT = 1;");
    free(src0);
    setenv("KILN_TUNE", "kvsplit=2", 1);
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "kvsplit is 0 (one barrier pair");
    setenv("KILN_TUNE", "kvsplit=1", 1);
    KT_CHECK(kiln__config_pick(&v, 80, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "kvsplit=");
    /* rows per warp through a page table (KILN_TUNE load=1): no maps argument */
    parse("op=prefill dtype=bf16 head_dim=128 group=4 kv=paged", &v);
    setenv("KILN_TUNE", "load=1", 1);
    KT_OK(kiln__config_pick(&v, 90, &cfg, &e), e.msg);
    KT_EQ_INT(cfg.load, KILN_WGMMA_LOAD_WARP);
    char *src = NULL;
    KT_OK(kiln__expand(&v, &cfg, "sm_90a", &src, &e), e.msg);
    KT_REQUIRE(src);
    KT_CHECK(strstr(src, "const __grid_constant__ kiln_tma_maps m") == NULL);
    free(src);
    setenv("KILN_TUNE", "load=3", 1);
    KT_CHECK(kiln__config_pick(&v, 90, &cfg, &e) == KILN_STATUS_UNSUPPORTED);
    KT_CONTAINS(e.msg, "load 0, 1 or 2");
    unsetenv("KILN_TUNE");
    /* the box rows of a page: whole pages of 8k rows nesting with the tile, else 0 (by rows) */
    KT_EQ_INT(kiln_wgmma_tma_page_rows(16, 128), 16);
    KT_EQ_INT(kiln_wgmma_tma_page_rows(128, 128), 128);
    KT_EQ_INT(kiln_wgmma_tma_page_rows(256, 128), 128);
    KT_EQ_INT(kiln_wgmma_tma_page_rows(8, 64), 8);
    KT_EQ_INT(kiln_wgmma_tma_page_rows(1, 128), 0);
    KT_EQ_INT(kiln_wgmma_tma_page_rows(4, 128), 0);
    KT_EQ_INT(kiln_wgmma_tma_page_rows(24, 128), 0);
    KT_EQ_INT(kiln_wgmma_tma_page_rows(0, 128), 0);
}

/* Compile one kernel of each family for sm_90a and sm_80 through the public API; a second
 * context on the same cache finds them; every introspection field is filled. */
KT_TEST(core_compile_and_cache)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/c", kt_tmpdir());
    const char *specs[] = {"op=decode dtype=bf16 head_dim=64 group=4 logits=softcap lse=1",
                           "op=prefill dtype=f16 head_dim=64 group=1 mask=causal window=1"};
    const char *archs[] = {"sm_90a", "sm_80"};
    char keys[4][33];
    kiln_ctx *ctx = KT_CTX(dir, 0);
    KT_REQUIRE(ctx);
    int n = 0;
    for (int s = 0; s < 2; s++)
        for (int a = 0; a < 2; a++) {
            kiln_variant v;
            parse(specs[s], &v);
            kiln_kernel *k = NULL;
            KT_OK(kiln_kernel_compile(ctx, &v, archs[a], &k), kiln_ctx_errmsg(ctx));
            if (!k) continue;
            kiln_kernel_info info;
            KT_OK(kiln_kernel_describe(k, &info), kiln_errmsg());
            KT_EQ_INT(info.from_cache, 0);
            KT_EQ_STR(info.arch, archs[a]);
            KT_CHECK(info.registers > 0);
            KT_CHECK(info.cubin_bytes > 1000);
            KT_EQ_INT(info.spill_bytes, 0);
            KT_CHECK(info.compile_ms > 0);
            size_t sz = 0;
            const unsigned char *cubin = kiln_kernel_cubin(k, &sz);
            KT_CHECK(cubin && sz > 4 && !memcmp(cubin, "\177ELF", 4));
            KT_CONTAINS(kiln_kernel_log(k), "registers");
            KT_CONTAINS(kiln_kernel_source(k), info.spec);
            memcpy(keys[n++], info.key, 33);
            /* memo: the same call returns the same object */
            kiln_kernel *k2 = NULL;
            KT_OK(kiln_kernel_compile(ctx, &v, archs[a], &k2), kiln_ctx_errmsg(ctx));
            KT_CHECK(k2 == k);
        }
    KT_CHECK(strcmp(keys[0], keys[1]) != 0);
    kiln_ctx_destroy(ctx);

    ctx = KT_CTX(dir, 0);
    KT_REQUIRE(ctx);
    n = 0;
    for (int s = 0; s < 2; s++)
        for (int a = 0; a < 2; a++) {
            kiln_variant v;
            parse(specs[s], &v);
            kiln_kernel *k = NULL;
            KT_OK(kiln_kernel_compile(ctx, &v, archs[a], &k), kiln_ctx_errmsg(ctx));
            if (!k) continue;
            kiln_kernel_info info;
            kiln_kernel_describe(k, &info);
            KT_EQ_INT(info.from_cache, 1);
            KT_EQ_STR(info.key, keys[n]);
            n++;
            KT_CONTAINS(kiln_kernel_key_material(k), "spec: ");
        }
    kiln_ctx_destroy(ctx);
}

KT_TEST(core_no_device_errors)
{
    kiln_ctx *ctx = KT_CTX(NULL, 0);
    KT_REQUIRE(ctx);
    kiln_device_info di;
    KT_OK(kiln_ctx_device(ctx, &di), kiln_errmsg());
    KT_EQ_INT(di.present, 0);
    kiln_variant v;
    kiln_variant_default(&v);
    kiln_kernel *k = (kiln_kernel *)1;
    KT_STATUS(kiln_kernel_get(ctx, &v, &k), KILN_STATUS_NO_DEVICE, kiln_ctx_errmsg(ctx));
    KT_CHECK(k == NULL);
    KT_STATUS(kiln_kernel_compile(ctx, &v, NULL, &k), KILN_STATUS_NO_DEVICE, kiln_ctx_errmsg(ctx));
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "name an arch");
    KT_STATUS(kiln_kernel_compile(ctx, &v, "sm_75", &k), KILN_STATUS_UNSUPPORTED,
              kiln_ctx_errmsg(ctx));
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "sm_75");
    v.head_dim = 96;
    KT_STATUS(kiln_kernel_compile(ctx, &v, "sm_90a", &k), KILN_STATUS_UNSUPPORTED,
              kiln_ctx_errmsg(ctx));
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "head_dim");
    kiln_ctx_destroy(ctx);
    kiln_ctx_destroy(NULL);
}

KT_TEST(core_bad_cache_dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/file", kt_tmpdir());
    FILE *f = fopen(path, "w");
    KT_REQUIRE(f);
    fputs("x", f);
    fclose(f);
    char dir[700];
    snprintf(dir, sizeof dir, "%s/sub", path);
    kiln_ctx_opts o = {0};
    o.cache_dir = dir;
    o.no_device = 1;
    kiln_ctx *ctx = NULL;
    kiln_status st = kiln_ctx_create(&o, &ctx);
    KT_CHECK(st != KILN_STATUS_OK);
    KT_CHECK(ctx == NULL);
    KT_CONTAINS(kiln_errmsg(), dir);
}

/* An NVRTC failure (injected) is reported with the spec and arch and caches nothing. */
KT_TEST(core_nvrtc_fault)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/c", kt_tmpdir());
    kiln_ctx *ctx = KT_CTX(dir, 0);
    KT_REQUIRE(ctx);
    kiln_variant v;
    parse("op=decode head_dim=64", &v);
    kiln_kernel *k = NULL;
    kiln__fault_arm("nvrtc", 1);
    KT_STATUS(kiln_kernel_compile(ctx, &v, "sm_90a", &k), KILN_STATUS_NVRTC, kiln_ctx_errmsg(ctx));
    kiln__fault_arm("nvrtc", 0);
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "op=decode");
    KT_CONTAINS(kiln_ctx_errmsg(ctx), "sm_90a");
    /* the next attempt compiles for real */
    KT_OK(kiln_kernel_compile(ctx, &v, "sm_90a", &k), kiln_ctx_errmsg(ctx));
    kiln_kernel_info info;
    kiln_kernel_describe(k, &info);
    KT_EQ_INT(info.from_cache, 0);
    kiln_ctx_destroy(ctx);
}

/* NVRTC compile of the builtin grid (decode and prefill × head dim × group × dtype × mask ×
 * window × logits, layout/lse/out dtype alternating) for sm_80 and sm_90a. make test compiles
 * every 16th variant; KILN_TEST_FULL=1 (make test-full) compiles all of them. Prints the
 * median and max cold compile time. */
static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

KT_TEST(core_compile_grid)
{
    const char *full_env = getenv("KILN_TEST_FULL");
    const int full = full_env && *full_env && strcmp(full_env, "0") != 0;
    static const char *archs[] = {"sm_80", "sm_90a"};
    kiln_ctx *ctx = KT_CTX(NULL, 0);
    KT_REQUIRE(ctx);
    static double ms[2 * 432 * 2];
    int n = 0, idx = 0, spills = 0;
    static kiln_variant grid[KT_GRID_MAX];
    for (int op = 0; op < 2; op++) {
        const int count = kt_builtin_grid((kiln_op)op, grid);
        for (int gi = 0; gi < count; gi++, idx++) {
            if (!full && idx % 16) continue;
            const kiln_variant v = grid[gi];
            for (int a = 0; a < 2; a++) {
                kiln_kernel *k = NULL;
                if (kiln_kernel_compile(ctx, &v, archs[a], &k) != KILN_STATUS_OK) {
                    kt_fail(__FILE__, __LINE__, "%s", kiln_ctx_errmsg(ctx));
                    continue;
                }
                kiln_kernel_info info;
                kiln_kernel_describe(k, &info);
                ms[n++] = info.compile_ms;
                spills += info.spill_bytes > 0;
            }
        }
    }
    kiln_ctx_destroy(ctx);
    KT_REQUIRE(n > 0);
    qsort(ms, (size_t)n, sizeof ms[0], cmp_dbl);
    printf(
        "    %d kernels (%s grid) for sm_80 and sm_90a: cold compile median %.0f ms, max %.0f ms; "
        "%d with spills\n",
        n, full ? "full" : "1/16 of the", ms[n / 2], ms[n - 1], spills);
}

/* logits=softcap_alibi compiles for sm_80 and sm_90a on every kernel family it takes (CUDA-core
 * decode, packed tensor-core decode with fp8 KV, the wgmma and mma.sync prefill), and its key
 * differs from soft-cap's and ALiBi's. */
KT_TEST(core_softcap_alibi_compiles)
{
    static const char *archs[] = {"sm_80", "sm_90a"};
    static const char *specs[] = {
        "op=decode dtype=bf16 head_dim=128 group=1 logits=softcap_alibi lse=1",
        "op=decode q_dtype=bf16 kv_dtype=e4m3 out_dtype=bf16 head_dim=128 group=4 kv=paged "
        "logits=softcap_alibi lse=1",
        "op=prefill dtype=bf16 head_dim=128 group=4 kv=ragged mask=causal logits=softcap_alibi "
        "lse=1",
        "op=prefill dtype=f16 head_dim=64 group=2 window=1 logits=softcap_alibi",
    };
    kiln_ctx *ctx = KT_CTX(NULL, 0);
    KT_REQUIRE(ctx);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        kiln_variant v;
        KT_OK(kiln_variant_parse(specs[s], &v), kiln_errmsg());
        KT_EQ_INT(v.logits, KILN_LOGITS_SOFTCAP_ALIBI);
        for (int a = 0; a < 2; a++) {
            kiln_kernel *k = NULL, *k_cap = NULL, *k_alibi = NULL;
            KT_OK(kiln_kernel_compile(ctx, &v, archs[a], &k), kiln_ctx_errmsg(ctx));
            kiln_variant vc = v, va = v;
            vc.logits = KILN_LOGITS_SOFTCAP;
            va.logits = KILN_LOGITS_ALIBI;
            KT_OK(kiln_kernel_compile(ctx, &vc, archs[a], &k_cap), kiln_ctx_errmsg(ctx));
            KT_OK(kiln_kernel_compile(ctx, &va, archs[a], &k_alibi), kiln_ctx_errmsg(ctx));
            if (!k || !k_cap || !k_alibi) continue;
            kiln_kernel_info i, ic, ia;
            kiln_kernel_describe(k, &i);
            kiln_kernel_describe(k_cap, &ic);
            kiln_kernel_describe(k_alibi, &ia);
            KT_CHECK(strcmp(i.key, ic.key) != 0 && strcmp(i.key, ia.key) != 0);
            KT_EQ_STR(kiln_kernel_family(k), kiln_kernel_family(k_alibi));
        }
    }
    kiln_ctx_destroy(ctx);
}
