/*
 * key.c — the content-addressed key: XXH3-128 over a printable text (the key material) that
 * names everything that shapes the binary: the key format version, the canonical spec, the
 * tile configuration, the digest of every embedded template byte, the NVRTC version, the exact
 * target arch and the full NVRTC option list (kiln__nvrtc_options, jit/nvrtc.c: the list a
 * compile passes, word for word).
 */
#include <stdio.h>
#include <string.h>

#include "jit.h"

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
    kiln__nvrtc_opts opts;
    kiln__nvrtc_options(arch, &opts);
    kiln__str_puts(&s, "options:");
    for (int i = 0; i < opts.n; i++) kiln__str_printf(&s, " %s", opts.v[i]);
    kiln__str_puts(&s, "\n");
    *material = kiln__str_take(&s);
    if (!*material) return kiln__fail(e, KILN_STATUS_NO_MEMORY, "key: out of memory");
    return KILN_STATUS_OK;
}

void kiln__key_hash(const char *material, char key[33])
{
    kiln__hash128(material, strlen(material), key);
}
