/*
 * test_slurm.c — fleet sharding under a real batch system: runs tests/slurm_shard.sh, which
 * starts a one-node Slurm cluster (slurm-wlm + munge) in a scratch directory, warms a
 * 6-kernel manifest as a 3-task array job (`kiln warm --shard $SLURM_ARRAY_TASK_ID/3`), merges
 * the shards and compares them byte for byte with an unsharded warm. Skipped, saying why, where
 * Slurm or munge is not installed or the runner is not root (the script exits 77), or when
 * KILN_TEST_SLURM=0. The script's figures (time per shard, total) are echoed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kt.h"

/* The script, relative to the repository root (where the runner is started). */
#define SLURM_SCRIPT "tests/slurm_shard.sh"

KT_TEST(slurm_array_shards_merge_byte_identical)
{
    const char *off = getenv("KILN_TEST_SLURM");
    if (off && !strcmp(off, "0")) {
        kt_skip("KILN_TEST_SLURM=0");
        return;
    }
    if (access(SLURM_SCRIPT, R_OK) != 0) {
        kt_skip("%s not found (run the tests from the repository root)", SLURM_SCRIPT);
        return;
    }
    char cmd[2048], scratch[700];
    snprintf(scratch, sizeof scratch, "%s/slurm", kt_tmpdir());
    snprintf(cmd, sizeof cmd, "timeout 300 bash %s '%s' '%s' 2>&1", SLURM_SCRIPT, kt_kiln_bin(),
             scratch);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    KT_REQUIRE(p);
    char out[16384];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (rc == 77) {
        char *nl = strchr(out, '\n');
        if (nl) *nl = 0;
        kt_skip("Slurm test not run: %s", out);
        return;
    }
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) printf("    %s\n", line);
    KT_EQ_INT(rc, 0);
}
