/*
 * fuzz_cubin.c — libFuzzer target: the cache's checks of bytes it did not write itself. Every
 * cubin read back from a cache file, merged from a shard or exported, passes kiln__cubin_check
 * (a whole 64-bit little-endian CUDA ELF, headers and sections inside the blob, nothing
 * trailing) before the driver sees it; `--max-size` and $KILN_CACHE_MAX_BYTES go through
 * kiln__cache_parse_size. Both answer any bytes with a verdict and a reason, never a crash or
 * a read outside the input. The first byte picks the check.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    if (data[0] == 's') { /* a size text */
        char *s = malloc(size);
        if (!s) return 0;
        memcpy(s, data + 1, size - 1);
        s[size - 1] = 0;
        int64_t v = -1;
        kiln__err e = {{0}};
        if (kiln__cache_parse_size(s, &v, &e) == KILN_STATUS_OK && v < 0) {
            fprintf(stderr, "fuzz_cubin: size '%s' parsed to %lld\n", s, (long long)v);
            abort();
        }
        free(s);
        return 0;
    }
    /* the blob alone on the heap, so that a read past its end is caught */
    unsigned char *b = malloc(size - 1 ? size - 1 : 1);
    if (!b) return 0;
    memcpy(b, data + 1, size - 1);
    char why[256];
    why[0] = 0;
    if (kiln__cubin_check(b, size - 1, why, sizeof why) != 0 && !why[0]) {
        fprintf(stderr, "fuzz_cubin: a refused cubin with no reason\n");
        abort();
    }
    free(b);
    return 0;
}
