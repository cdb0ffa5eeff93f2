/*
 * run.c — the one test runner. Usage:
 *   build/bin/kiln-tests [--list] [--gpu] [--cpu] [FILTER...]
 * FILTER is a substring of a test name; several filters are OR-ed. --gpu runs only GPU tests
 * and fails if no GPU is usable; --cpu runs only CPU tests. The last line is exactly
 * "N passed, N failed"; skips are counted on the line before. Exit 1 on any failure.
 * The helpers the tests share are kt.c.
 */

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kt.h"

#define MAX_CASES 1024

static kt_case cases[MAX_CASES];
static int ncases;
static int cur_failed, cur_skipped, cur_fail_lines;
static char cur_tmp[512];
static char kiln_bin[512] = "build/bin/kiln";
static int gpu_state = -1;

void kt_register(const char *name, const char *file, kt_fn fn, int gpu)
{
    if (ncases < MAX_CASES) cases[ncases++] = (kt_case){name, file, fn, gpu};
}

void kt_fail(const char *file, int line, const char *fmt, ...)
{
    cur_failed = 1;
    if (++cur_fail_lines > 20) {
        if (cur_fail_lines == 21) printf("    ... more failures not shown\n");
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    printf("    %s:%d: ", file, line);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

void kt_skip(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("    skip: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    cur_skipped = 1;
}

int kt_failed(void) { return cur_failed; }

static void rm_rf(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
            struct stat st;
            if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode)) {
                chmod(sub, 0700);
                rm_rf(sub);
            } else {
                unlink(sub);
            }
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

const char *kt_tmpdir(void)
{
    if (!cur_tmp[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(cur_tmp, sizeof cur_tmp, "%s/kiln-test-XXXXXX", base ? base : "/tmp");
        if (!mkdtemp(cur_tmp)) {
            perror("mkdtemp");
            cur_tmp[0] = 0;
            return "/nonexistent";
        }
    }
    return cur_tmp;
}

const char *kt_kiln_bin(void) { return kiln_bin; }

int kt_have_gpu(void)
{
    if (gpu_state < 0) {
        kiln_ctx_opts o = {0};
        o.no_cache = 1;
        kiln_ctx *ctx = NULL;
        kiln_device_info di = {0};
        gpu_state = kiln_ctx_create(&o, &ctx) == KILN_STATUS_OK &&
                    kiln_ctx_device(ctx, &di) == KILN_STATUS_OK && di.present;
        kiln_ctx_destroy(ctx);
    }
    return gpu_state;
}

static int cmp_case(const void *a, const void *b)
{
    const kt_case *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    return c ? c : strcmp(x->name, y->name);
}

int main(int argc, char **argv)
{
    int list = 0, only_gpu = 0, only_cpu = 0, nfilters = 0;
    const char *filters[64];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--list")) list = 1;
        else if (!strcmp(argv[i], "--gpu")) only_gpu = 1;
        else if (!strcmp(argv[i], "--cpu")) only_cpu = 1;
        else if (!strcmp(argv[i], "--kiln") && i + 1 < argc)
            snprintf(kiln_bin, sizeof kiln_bin, "%s", argv[++i]);
        else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [--list] [--gpu|--cpu] [--kiln PATH] [FILTER...]\n",
                    argv[0]);
            return 2;
        } else if (nfilters < 64) filters[nfilters++] = argv[i];
    }
    qsort(cases, (size_t)ncases, sizeof cases[0], cmp_case);
    setvbuf(stdout, NULL, _IOLBF, 0);
    int passed = 0, failed = 0, skipped = 0;
    if (only_gpu && !kt_have_gpu()) {
        printf("--gpu: no usable GPU in this process (%s)\n", kiln_errmsg());
        printf("0 passed, 1 failed\n");
        return 1;
    }
    for (int i = 0; i < ncases; i++) {
        const kt_case *c = &cases[i];
        if (only_gpu && !c->gpu) continue;
        if (only_cpu && c->gpu) continue;
        if (nfilters) {
            int hit = 0;
            for (int f = 0; f < nfilters; f++) hit |= strstr(c->name, filters[f]) != NULL;
            if (!hit) continue;
        }
        if (list) {
            printf("%s%s\n", c->name, c->gpu ? " (gpu)" : "");
            continue;
        }
        printf("%-40s ", c->name);
        fflush(stdout);
        cur_failed = cur_skipped = cur_fail_lines = 0;
        cur_tmp[0] = 0;
        if (c->gpu && !kt_have_gpu()) {
            printf("SKIP (no GPU)\n");
            skipped++;
            continue;
        }
        printf("\n");
        c->fn();
        if (cur_tmp[0]) rm_rf(cur_tmp);
        if (cur_failed) {
            printf("  FAIL %s\n", c->name);
            failed++;
        } else if (cur_skipped) {
            printf("  skip %s\n", c->name);
            skipped++;
        } else {
            printf("  ok   %s\n", c->name);
            passed++;
        }
    }
    if (list) return 0;
    printf("%d skipped%s\n", skipped,
           skipped && !kt_have_gpu() ? " (no GPU: GPU tests did not run)" : "");
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
