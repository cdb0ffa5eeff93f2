/*
 * fuzz_manifest.c — libFuzzer target: a fleet manifest of any bytes (`kiln warm FILE`'s and
 * `kiln export --manifest`'s reader, cli_manifest_read: comments, {a,b} alternatives, arch=
 * lists, long lines, NUL bytes). It returns 0 or a usage status naming file:line and never
 * crashes; what it accepts holds only canonical specs that parse, each pair's arch named.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static char path[600];
static cli_archs deflt;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *tmp = getenv("KILN_FUZZ_TMP"); /* fuzz.sh's build directory, the tests' own */
    snprintf(path, sizeof path, "%s/kiln-fuzz-manifest-%d", tmp ? tmp : "/tmp", (int)getpid());
    if (cli_archs_parse("warm", "sm_80,sm_90a", &deflt)) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    cli_manifest m;
    if (cli_manifest_read("warm", path, &deflt, &m) == 0) {
        for (int i = 0; i < m.nspecs; i++) {
            kiln_variant v;
            char again[KILN__SPEC_MAX + 1];
            if (kiln_variant_parse(m.specs[i].spec, &v) != KILN_STATUS_OK ||
                kiln_variant_format(&v, again, sizeof again) == 0 ||
                strcmp(again, m.specs[i].spec)) {
                fprintf(stderr, "fuzz_manifest: spec %d is not canonical: %s\n", i,
                        m.specs[i].spec);
                abort();
            }
        }
        for (int i = 0; i < m.npairs; i++)
            if (m.pairs[i].spec < 0 || m.pairs[i].spec >= m.nspecs || m.pairs[i].arch < 0 ||
                m.pairs[i].arch >= m.archs.n)
                abort();
    }
    cli_manifest_free(&m);
    return 0;
}
