/*
 * test_readme.c — the README's console examples still tell the truth: runs
 * tests/readme_examples.py, which runs every `$ kiln ...` example of README.md that needs no
 * GPU on a fresh $HOME and compares the shape of its output (headers, field names, line
 * counts; not the numbers) with what the README shows. The script's own comparison is checked
 * first (--self-test: lines that must and must not match). Skipped without python3. Slow-ish:
 * the examples compile ~45 kernels (about a minute on a 2-core box).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kt.h"

#define README_SCRIPT "tests/readme_examples.py"

/* Run cmd, echo its output indented (but lines starting "ok: "), return its exit status. */
static int run_echo(const char *cmd)
{
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[4096];
    while (fgets(line, sizeof line, p))
        if (strncmp(line, "ok: ", 4)) printf("    %s", line);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

KT_TEST(readme_console_examples)
{
    if (system("command -v python3 >/dev/null 2>&1") != 0) {
        kt_skip("python3 not found: the README examples were not run");
        return;
    }
    if (access(README_SCRIPT, R_OK) != 0 || access("README.md", R_OK) != 0) {
        kt_skip("%s or README.md not found (run the tests from the repository root)",
                README_SCRIPT);
        return;
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "python3 %s --self-test 2>&1", README_SCRIPT);
    KT_EQ_INT(run_echo(cmd), 0);
    snprintf(cmd, sizeof cmd, "python3 %s '%s' . '%s' 2>&1", README_SCRIPT, kt_kiln_bin(),
             kt_tmpdir());
    KT_EQ_INT(run_echo(cmd), 0);
}
