/*
 * cli_info.c — `kiln info`: kiln's and NVRTC's versions, the driver and each GPU (probed through
 * cache-less contexts, one per device ordinal), the archs NVRTC offers, and the local and base
 * caches with their policy (bound, strict, record). Creates nothing. `info --json` is in
 * cli_report.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jit.h"

/* Open a cache-less context on device `ordinal`. Returns 1 with *di filled when it has a GPU,
 * 0 for a compile-only context, -1 when the device is unusable, -2 when it does not exist;
 * why[cap] gets the reason for anything but 1. */
static int probe_device(int ordinal, kiln_device_info *di, char *why, size_t cap)
{
    kiln_ctx_opts o = {0};
    o.no_cache = 1;
    o.device = ordinal;
    kiln_ctx *ctx = NULL;
    memset(di, 0, sizeof *di);
    kiln_status st = kiln_ctx_create(&o, &ctx);
    if (st) {
        snprintf(why, cap, "%s", kiln_errmsg());
        return st == KILN_STATUS_INVALID_ARGUMENT ? -2 : -1;
    }
    kiln_ctx_device(ctx, di);
    if (!di->present) snprintf(why, cap, "%s", kiln_ctx_errmsg(ctx));
    kiln_ctx_destroy(ctx);
    return di->present;
}

/* Print the driver and one line per GPU (when out is non-NULL); return the usable GPUs. */
static int list_devices(FILE *out)
{
    int usable = 0;
    for (int ord = 0; ord < CLI_ARCH_MAX; ord++) {
        kiln_device_info di;
        char why[1024] = "";
        int r = probe_device(ord, &di, why, sizeof why);
        if (r == 0 || r == -2) {
            if (out && ord == 0) {
                fprintf(out, "driver: none\n");
                fprintf(out, "gpu: none (compile-only: %s)\n", why);
            }
            break;
        }
        if (r < 0) {
            if (out) fprintf(out, "gpu %d: unusable: %s\n", ord, why);
            continue;
        }
        if (out && usable == 0)
            fprintf(out, "driver: CUDA %d.%d\n", di.driver_version / 1000,
                    di.driver_version % 1000 / 10);
        if (out)
            fprintf(out, "gpu %d: %s, sm_%d, %d SMs, arch %s\n", di.ordinal, di.name, di.sm,
                    di.sm_count, di.arch);
        usable++;
    }
    return usable;
}

/* Print one cache's lines ("cache" or "base cache"). */
static int print_one_cache(kiln__cache *c, const char *label)
{
    kiln__cache_stats s;
    kiln__err e = {{0}};
    const char *why = NULL;
    int ro = kiln__cache_readonly(c, &why);
    printf("%s: %s (schema %d%s%s)\n", label, kiln__cache_path(c), kiln__cache_schema(c),
           ro ? ", read-only: " : "", ro ? why : "");
    if (kiln__cache_stats_get(c, &s, &e)) return cli_fail("info", CLI_FAIL, "%s", e.msg);
    printf("%s entries: %lld (%lld bytes of cubins; file %lld bytes)\n", label,
           (long long)s.entries, (long long)s.bytes, (long long)s.file_bytes);
    printf("%s hits: %lld, misses: %lld\n", label, (long long)s.hits, (long long)s.misses);
    return CLI_OK;
}

/* The local cache, its policy (bound, strict, record) and the base cache. */
static int print_cache_stats(const cli_global *g)
{
    kiln__cache *c = NULL;
    char missing[1100];
    if (cli_cache_open_opt(g, "info", missing, sizeof missing, &c)) return CLI_FAIL;
    int rc = CLI_OK;
    if (c) rc = print_one_cache(c, "cache");
    else printf("cache: none (%s)\n", missing); /* info creates nothing */
    kiln__cache_close(c);
    const char *bound = getenv("KILN_CACHE_MAX_BYTES");
    if (g->max_size_set) printf("cache bound: %lld bytes (--max-size)\n", (long long)g->max_size);
    else if (bound && *bound) printf("cache bound: %s (KILN_CACHE_MAX_BYTES)\n", bound);
    else printf("cache bound: none\n");
    const char *strict = getenv("KILN_STRICT"), *record = getenv("KILN_RECORD");
    printf("mode: %s%s%s\n",
           strict && *strict && strcmp(strict, "0") ? "strict (KILN_STRICT)" : "compile on a miss",
           record && *record ? ", recording to " : "", record && *record ? record : "");
    const char *base = g->base_dir ? g->base_dir : getenv("KILN_BASE_CACHE_DIR");
    if (!base || !*base) {
        printf("base cache: none\n");
        return rc;
    }
    kiln__err e = {{0}};
    if (kiln__cache_open_ex(base, KILN__CACHE_RDONLY, &c, &e))
        return cli_fail("info", CLI_FAIL, "base cache: %s", e.msg);
    if (print_one_cache(c, "base cache")) rc = CLI_FAIL;
    kiln__cache_close(c);
    return rc;
}

int cli_cmd_info(cli_global *g, const cli_cmd *cmd, int argc, char **argv)
{
    int gpu_count = 0, json = 0;
    const cli_opt opts[] = {{"--gpu-count", NULL, &gpu_count},
                            {"--json", NULL, &json},
                            {NULL, NULL, NULL}};
    int rc = 0;
    if (cli_parse_opts(g, cmd, argc, argv, opts, &rc)) return rc;
    if (gpu_count) {
        printf("%d\n", list_devices(NULL));
        return CLI_OK;
    }
    if (json) return cli_info_json(g);
    printf("kiln %s\n", kiln_version());
    printf("nvrtc %s\n", kiln_nvrtc_version());
    list_devices(stdout);
    int count = 0;
    const char *const *archs = kiln__arch_all(&count);
    printf("archs:");
    for (int i = 0; i < count; i++) printf(" %s", archs[i]);
    printf("%s\n", count ? "" : " none (NVRTC lists no arch >= sm_80)");
    return print_cache_stats(g);
}
