/*
 * test_fuzz.c — the fuzz targets' inputs kept in the tree (tests/fuzz/corpus/NAME/: the seeds,
 * and every input a fuzz run found a bug with, once fixed) replayed through the same entry
 * points `make fuzz` builds with libFuzzer (tests/fuzz/fuzz_NAME.c, compiled here with the
 * entry points renamed kiln_fuzz_NAME_one / _init). A target aborts on a broken invariant, so
 * each runs in a child process; the test fails on a child that does not exit 0 or read no file.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kt.h"

int kiln_fuzz_spec_one(const uint8_t *data, size_t size);
int kiln_fuzz_variant_one(const uint8_t *data, size_t size);
int kiln_fuzz_plan_one(const uint8_t *data, size_t size);
int kiln_fuzz_plan_init(int *argc, char ***argv);
int kiln_fuzz_manifest_one(const uint8_t *data, size_t size);
int kiln_fuzz_manifest_init(int *argc, char ***argv);
int kiln_fuzz_cubin_one(const uint8_t *data, size_t size);
int kiln_fuzz_snippet_one(const uint8_t *data, size_t size);
int kiln_fuzz_cacherow_one(const uint8_t *data, size_t size);
int kiln_fuzz_cacherow_init(int *argc, char ***argv);

typedef struct target {
    const char *name;
    int (*init)(int *, char ***);
    int (*one)(const uint8_t *, size_t);
} target;

/* In the child: every file of the target's corpus through its entry point; exit 0 when at
 * least one was read, 3 when none. */
static void replay(const target *t)
{
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fuzz/corpus/%s", t->name);
    DIR *d = opendir(dir);
    if (!d) _exit(4);
    if (t->init) t->init(NULL, NULL);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t n = 0;
        char *data = kt_slurp(path, &n);
        if (!data) _exit(5);
        t->one((const uint8_t *)data, n);
        free(data);
        files++;
    }
    closedir(d);
    fflush(NULL);
    _exit(files > 0 ? 0 : 3);
}

KT_TEST(fuzz_corpus_replay)
{
    if (access("tests/fuzz/corpus", R_OK) != 0) {
        kt_skip("tests/fuzz/corpus not found (run the tests from the repository root)");
        return;
    }
    /* the planner target's kernels compile into the suite's cache, not a directory of their own */
    kt_setenv("KILN_FUZZ_CACHE", kt_cache_dir());
    kt_setenv("KILN_FUZZ_TMP", kt_tmpdir()); /* the targets' scratch files */
    const target targets[] = {
        {"spec", NULL, kiln_fuzz_spec_one},
        {"variant", NULL, kiln_fuzz_variant_one},
        {"plan", kiln_fuzz_plan_init, kiln_fuzz_plan_one},
        {"manifest", kiln_fuzz_manifest_init, kiln_fuzz_manifest_one},
        {"cubin", NULL, kiln_fuzz_cubin_one},
        {"snippet", NULL, kiln_fuzz_snippet_one},
        {"cacherow", kiln_fuzz_cacherow_init, kiln_fuzz_cacherow_one},
    };
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        fflush(NULL);
        const pid_t pid = fork();
        if (pid == 0) {
            /* the readers' messages about bad input are expected: out of the suite's log */
            if (!freopen("/dev/null", "w", stderr)) _exit(6);
            replay(&targets[i]);
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid) {
            kt_fail(__FILE__, __LINE__, "fuzz target %s: could not run a child", targets[i].name);
            continue;
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            kt_fail(__FILE__, __LINE__,
                    "fuzz target %s: %s %d replaying tests/fuzz/corpus/%s (run "
                    "build-fuzz/bin/fuzz-%s on its files after `make fuzz` to see which)",
                    targets[i].name, WIFEXITED(status) ? "exit" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), targets[i].name,
                    targets[i].name);
    }
    kt_setenv("KILN_FUZZ_CACHE", NULL);
    kt_setenv("KILN_FUZZ_TMP", NULL);
}
