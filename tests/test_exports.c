/*
 * test_exports.c — libkiln.so exports the public API and nothing else: every dynamic symbol it
 * defines is a kiln_ name declared in kiln.h (KILN_API), never an internal kiln__ one, and
 * every KILN_API function is there. Reads the library's symbols with `nm -D`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kt.h"

/* The public functions kiln.h declares, which the shared library must export. */
static const char *const public_api[] = {
    "kiln_status_str",
    "kiln_errmsg",
    "kiln_variant_default",
    "kiln_variant_parse",
    "kiln_variant_format",
    "kiln_variant_check",
    "kiln_ctx_create",
    "kiln_ctx_destroy",
    "kiln_ctx_errmsg",
    "kiln_ctx_device",
    "kiln_ctx_cache_path",
    "kiln_kernel_get",
    "kiln_kernel_get_spec",
    "kiln_kernel_compile",
    "kiln_kernel_describe",
    "kiln_kernel_source",
    "kiln_kernel_spec",
    "kiln_kernel_log",
    "kiln_kernel_family",
    "kiln_kernel_key_material",
    "kiln_kernel_cubin",
    "kiln_decode_workspace_size",
    "kiln_single_decode",
    "kiln_single_prefill",
    "kiln_prefill_tile_map_size",
    "kiln_prefill_tile_map",
    "kiln_plan_create",
    "kiln_plan_destroy",
    "kiln_plan_workspace_size",
    "kiln_plan_workspace_sizes",
    "kiln_plan_schedule",
    "kiln_plan_schedule_scratch",
    "kiln_plan_describe",
    "kiln_plan_run",
    "kiln_merge_state",
    "kiln_merge_state_in_place",
    "kiln_merge_states",
    "kiln_version",
    "kiln_nvrtc_version",
    /* deprecated aliases, exported for one release (kiln.h "Deprecated names") */
    "kiln_batch_plan",
    "kiln_batch_run",
    "kiln_prefill_mask_plan_size",
    "kiln_prefill_mask_plan",
};

KT_TEST(exports_only_public_api)
{
    /* build/bin/kiln -> build/lib/libkiln.so */
    char so[1024];
    snprintf(so, sizeof so, "%s", kt_kiln_bin());
    char *slash = strrchr(so, '/');
    if (!slash) snprintf(so, sizeof so, "build/lib/libkiln.so");
    else snprintf(slash, sizeof so - (size_t)(slash - so), "/../lib/libkiln.so");
    if (access(so, R_OK) != 0) {
        kt_skip("no %s to read", so);
        return;
    }
    if (system("command -v nm > /dev/null 2>&1") != 0) {
        kt_skip("no nm (binutils) to list the library's symbols");
        return;
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "nm -D --defined-only '%s'", so);
    FILE *p = popen(cmd, "r");
    KT_REQUIRE(p);
    char line[512];
    int found[sizeof public_api / sizeof public_api[0]] = {0}, total = 0, bad = 0;
    while (fgets(line, sizeof line, p)) {
        char addr[64], type[8], name[256];
        if (sscanf(line, "%63s %7s %255s", addr, type, name) != 3) continue;
        total++;
        int known = 0;
        for (size_t i = 0; i < sizeof public_api / sizeof public_api[0]; i++)
            if (!strcmp(name, public_api[i])) found[i] = known = 1;
        if (!known && bad++ < 10)
            kt_fail(__FILE__, __LINE__, "libkiln.so exports %s (%s)", name, type);
    }
    KT_EQ_INT(pclose(p), 0);
    KT_CHECK(total > 0);
    for (size_t i = 0; i < sizeof public_api / sizeof public_api[0]; i++)
        if (!found[i]) kt_fail(__FILE__, __LINE__, "libkiln.so does not export %s", public_api[i]);
}

/* Every KILN_API declaration of kiln.h is in the table above (a new public function must
 * join it, so the export check covers it). */
KT_TEST(exports_table_matches_header)
{
    FILE *f = fopen("include/kiln.h", "r");
    if (!f) {
        kt_skip("include/kiln.h not found from the working directory");
        return;
    }
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "KILN_API ", 9)) continue;
        char *paren = strchr(line, '('), *name = paren;
        if (!paren) continue;
        *paren = 0; /* the identifier just before the parenthesis */
        while (name > line && (name[-1] == '_' || (name[-1] >= 'a' && name[-1] <= 'z'))) name--;
        n++;
        int known = 0;
        for (size_t i = 0; i < sizeof public_api / sizeof public_api[0]; i++)
            known |= !strcmp(name, public_api[i]);
        if (!known)
            kt_fail(__FILE__, __LINE__, "kiln.h declares %s, the export table lacks it", name);
    }
    fclose(f);
    KT_EQ_INT(n, (int)(sizeof public_api / sizeof public_api[0]));
}
