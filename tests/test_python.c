/*
 * test_python.c — runs the Python package's tests (python/tests, unittest) against the
 * libkiln.so of this build: this is how CI runs them.
 *
 * The runner passes two things through the environment:
 *   KILN_LIB  the absolute path of <build>/lib/libkiln.so (the one next to the kiln binary
 *             under test), so Python loads exactly this build;
 *   KILN_ABI  the C sizes and a few offsets of every public struct, as
 *             "kiln_variant=1360,kiln_variant.params=48,...", which test_basic.py compares
 *             with its ctypes mirrors (a drift between kiln.h and python/kiln/_lib.py fails).
 * It echoes Python's output and fails when unittest exits non-zero, or when a module that must
 * run (test_basic, test_batch, test_hostile, test_install) has no test in the output. Without
 * python3 it skips.
 * Under AddressSanitizer the library needs the ASan runtime loaded first: the runner preloads
 * the libasan it was itself linked with and turns leak detection off (Python's own
 * allocations are not ours to judge).
 */
#include <libgen.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kt.h"

#if defined(__SANITIZE_ADDRESS__)
#define KT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KT_ASAN 1
#endif
#endif

/* Room for the KILN_ABI text. */
#define ABI_MAX 4096

/* Append "name=value," to the ABI text. */
static void abi_put(char *buf, size_t cap, const char *name, size_t value)
{
    size_t n = strlen(buf);
    if (n < cap) snprintf(buf + n, cap - n, "%s%s=%zu", n ? "," : "", name, value);
}

#define ABI_SIZE(buf, type)       abi_put(buf, sizeof buf, #type, sizeof(type))
#define ABI_OFF(buf, type, field) abi_put(buf, sizeof buf, #type "." #field, offsetof(type, field))

static void abi_text(char *buf, size_t cap)
{
    char b[ABI_MAX] = "";
    ABI_SIZE(b, kiln_variant);
    ABI_OFF(b, kiln_variant, mask_data);
    ABI_OFF(b, kiln_variant, num_params);
    ABI_OFF(b, kiln_variant, params);
    ABI_OFF(b, kiln_variant, logits_expr);
    ABI_OFF(b, kiln_variant, mask_expr);
    ABI_SIZE(b, kiln_param_decl);
    ABI_SIZE(b, kiln_param_value);
    ABI_SIZE(b, kiln_params);
    ABI_OFF(b, kiln_params, window_left);
    ABI_OFF(b, kiln_params, alibi_slopes);
    ABI_OFF(b, kiln_params, user);
    ABI_SIZE(b, kiln_attn_args);
    ABI_OFF(b, kiln_attn_args, num_qo_heads);
    ABI_OFF(b, kiln_attn_args, q_stride_n);
    ABI_OFF(b, kiln_attn_args, v_stride_h);
    ABI_OFF(b, kiln_attn_args, bsr_r);
    ABI_OFF(b, kiln_attn_args, tile_map_bytes);
    ABI_OFF(b, kiln_attn_args, workspace);
    ABI_OFF(b, kiln_attn_args, workspace_bytes);
    ABI_OFF(b, kiln_attn_args, params);
    ABI_SIZE(b, kiln_ctx_opts);
    ABI_OFF(b, kiln_ctx_opts, arch);
    ABI_OFF(b, kiln_ctx_opts, mode);
    ABI_OFF(b, kiln_ctx_opts, max_cache_bytes);
    ABI_SIZE(b, kiln_device_info);
    ABI_OFF(b, kiln_device_info, sm);
    ABI_OFF(b, kiln_device_info, arch);
    ABI_SIZE(b, kiln_kernel_info);
    ABI_OFF(b, kiln_kernel_info, from_cache);
    ABI_OFF(b, kiln_kernel_info, compile_ms);
    ABI_OFF(b, kiln_kernel_info, cubin_bytes);
    ABI_OFF(b, kiln_kernel_info, threads);
    ABI_OFF(b, kiln_variant, kv);
    ABI_OFF(b, kiln_variant, rope);
    ABI_OFF(b, kiln_variant, q_tokens);
    ABI_OFF(b, kiln_params, k_scale);
    ABI_OFF(b, kiln_params, rope_theta);
    ABI_SIZE(b, kiln_plan_opts);
    ABI_OFF(b, kiln_plan_opts, fixed_split);
    ABI_OFF(b, kiln_plan_opts, no_split);
    ABI_OFF(b, kiln_plan_opts, max_total_kv);
    ABI_OFF(b, kiln_plan_opts, bsr_r);
    ABI_OFF(b, kiln_plan_opts, bsr_c);
    ABI_SIZE(b, kiln_batch_shape);
    ABI_OFF(b, kiln_batch_shape, qo_indptr);
    ABI_OFF(b, kiln_batch_shape, kv_last_page_len);
    ABI_SIZE(b, kiln_plan_info);
    ABI_OFF(b, kiln_plan_info, merge_tasks);
    ABI_OFF(b, kiln_plan_info, max_item_keys);
    ABI_OFF(b, kiln_plan_info, total_keys);
    ABI_SIZE(b, kiln_batch_args);
    ABI_OFF(b, kiln_batch_args, kv_indices);
    ABI_OFF(b, kiln_batch_args, rope_offsets);
    ABI_OFF(b, kiln_batch_args, q_stride_n);
    ABI_OFF(b, kiln_batch_args, k_stride_page);
    ABI_OFF(b, kiln_batch_args, v_stride_h);
    ABI_OFF(b, kiln_batch_args, workspace);
    ABI_OFF(b, kiln_batch_args, workspace_bytes);
    ABI_OFF(b, kiln_batch_args, params);
    ABI_OFF(b, kiln_batch_args, mask_bits);
    ABI_OFF(b, kiln_batch_args, bsr_indices);
    ABI_SIZE(b, kiln_merge_args);
    ABI_OFF(b, kiln_merge_args, mask);
    ABI_OFF(b, kiln_merge_args, num_states);
    ABI_OFF(b, kiln_merge_args, num_heads);
    ABI_OFF(b, kiln_merge_args, v_stride_n);
    ABI_OFF(b, kiln_merge_args, v_stride_h);
    snprintf(buf, cap, "%s", b);
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* dirname of path, `levels` times, into out. */
static void up(const char *path, int levels, char *out, size_t cap)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (int i = 0; i < levels; i++) {
        char *d = dirname(tmp);
        memmove(tmp, d, strlen(d) + 1);
    }
    snprintf(out, cap, "%s", tmp);
}

#ifdef KT_ASAN
/* Path of the libasan this process runs with, from /proc/self/maps ("" if none). */
static void asan_runtime(char *out, size_t cap)
{
    out[0] = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *p = strchr(line, '/');
        if (p && strstr(p, "libasan.so")) {
            p[strcspn(p, "\n")] = 0;
            snprintf(out, cap, "%s", p);
            break;
        }
    }
    fclose(f);
}
#endif

KT_TEST(python_unittest)
{
    if (system("command -v python3 >/dev/null 2>&1") != 0) {
        kt_skip("python3 not found: the Python package's tests did not run");
        return;
    }
    /* <root>/<build>/bin/kiln: the library is <root>/<build>/lib/libkiln.so. */
    char bin[PATH_MAX], build[PATH_MAX], root[PATH_MAX], lib[PATH_MAX + 32], tests[PATH_MAX + 32];
    if (!realpath(kt_kiln_bin(), bin)) {
        kt_fail(__FILE__, __LINE__, "cannot resolve the kiln binary %s", kt_kiln_bin());
        return;
    }
    up(bin, 2, build, sizeof build);
    up(bin, 3, root, sizeof root);
    snprintf(lib, sizeof lib, "%s/lib/libkiln.so", build);
    snprintf(tests, sizeof tests, "%s/python/tests", root);
    if (!is_dir(tests)) {
        /* A build directory outside the tree: fall back to the working directory. */
        if (!getcwd(root, sizeof root) ||
            (snprintf(tests, sizeof tests, "%s/python/tests", root), !is_dir(tests))) {
            kt_skip("no python/tests next to %s or in the working directory", bin);
            return;
        }
    }
    KT_REQUIRE(is_file(lib));
    /* The C Runner (python/kiln/hot.c), where make built it beside the library: required then
     * (KILN_HOT=1), so that a Runner that fails to load fails the tests instead of leaving
     * every run() to the ctypes path unnoticed. */
    char hot[PATH_MAX + 32];
    snprintf(hot, sizeof hot, "%s/lib/_kiln_hot.abi3.so", build);
    const int has_hot = is_file(hot);
    if (has_hot) setenv("KILN_HOT", "1", 1);

    char abi[ABI_MAX];
    abi_text(abi, sizeof abi);
    setenv("KILN_LIB", lib, 1);
    setenv("KILN_ABI", abi, 1);
    setenv("PYTHONDONTWRITEBYTECODE", "1", 1);
#ifdef KT_ASAN
    char asan[PATH_MAX];
    asan_runtime(asan, sizeof asan);
    if (!asan[0]) {
        kt_skip("AddressSanitizer build without a shared libasan to preload into python3");
        return;
    }
    setenv("LD_PRELOAD", asan, 1);
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
#endif
    printf("    KILN_LIB=%s\n    KILN_ABI=%s\n    KILN_HOT=%s\n", lib, abi,
           has_hot ? "1 (the C Runner is built)" : "unset (no C Runner: no Python headers)");

    /* The path travels in the environment, so no quoting can break the command. */
    setenv("KILN_PY_TESTS", tests, 1);
    FILE *p = popen("python3 -m unittest discover -s \"$KILN_PY_TESTS\" -v 2>&1", "r");
    KT_REQUIRE(p != NULL);
    /* Modules that must have run: a rename or a discovery change must not drop them quietly. */
    static const char *const required[] = {"test_basic.", "test_batch.", "test_hostile.",
                                           "test_install.", "test_hot."};
    enum { N_REQUIRED = sizeof required / sizeof required[0] };
    int seen[N_REQUIRED] = {0};
    char line[4096];
    while (fgets(line, sizeof line, p)) {
        printf("    | %s", line);
        for (int i = 0; i < N_REQUIRED; i++) {
            char tag[64];
            snprintf(tag, sizeof tag, "(%s",
                     required[i]); /* unittest -v: "name (module.Class..." */
            if (strstr(line, tag)) seen[i] = 1;
        }
    }
    int status = pclose(p);
#ifdef KT_ASAN
    unsetenv("LD_PRELOAD");
    unsetenv("ASAN_OPTIONS");
#endif
    unsetenv("KILN_PY_TESTS");
    unsetenv("KILN_ABI");
    unsetenv("KILN_LIB");
    unsetenv("KILN_HOT");
    unsetenv("PYTHONDONTWRITEBYTECODE");
    int code = status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0)
        kt_fail(__FILE__, __LINE__, "python3 -m unittest exited with %d (output above)", code);
    for (int i = 0; i < N_REQUIRED; i++)
        if (!seen[i])
            kt_fail(__FILE__, __LINE__,
                    "python/tests/%spy did not run (no test of it in the output)", required[i]);
}
