/*
 * key.c — the content-addressed key: XXH3-128 over a printable text (the key material) that
 * names everything that shapes the binary: the key format version, the canonical spec, the
 * tile configuration, the digest of every embedded template byte, the NVRTC version, the exact
 * target arch and the full NVRTC option list.
 */
#include <stdio.h>
#include <string.h>

#include "jit.h"

/* Options passed to NVRTC; the arch option is built per call. --prec-div=false: a float
 * division (a snippet's `logits / cap`) compiles to a reciprocal and a multiply, not the IEEE
 * sequence; attention's own divisions (1 / l) need no more. */
static const char *const base_options[] = {"-std=c++17",  "-minimal",         "--ptxas-options=-v",
                                           "--fmad=true", "--prec-div=false", NULL};

const char *const *kiln__nvrtc_options(const char *arch, int *count)
{
    (void)arch;
    int n = 0;
    while (base_options[n]) n++;
    if (count) *count = n;
    return base_options;
}

kiln_status kiln__key_material(const kiln_variant *v, const kiln__config *cfg, const char *arch,
                               char **material, kiln__err *e)
{
    *material = NULL;
    char spec[KILN__SPEC_MAX], conf[256];
    if (!kiln__spec_format(v, spec, sizeof spec, e)) return KILN_STATUS_UNSUPPORTED;
    kiln__config_format(cfg, conf, sizeof conf);
    kiln__str s = {0};
    kiln__str_printf(
        &s, "kiln-key-format: %d\nspec: %s\nconfig: %s\ntemplates: %s\nnvrtc: %s\narch: %s\n",
        KILN__FORMAT_VERSION, spec, conf, kiln__templates_digest, kiln_nvrtc_version(), arch);
    kiln__str_printf(&s, "options: --gpu-architecture=%s", arch);
    int n = 0;
    const char *const *opts = kiln__nvrtc_options(arch, &n);
    for (int i = 0; i < n; i++) kiln__str_printf(&s, " %s", opts[i]);
    kiln__str_puts(&s, "\n");
    *material = kiln__str_take(&s);
    if (!*material) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "key: out of memory");
    return KILN_STATUS_OK;
}

void kiln__key_hash(const char *material, char key[33])
{
    kiln__hash128(material, strlen(material), key);
}
