/*
 * hostile.h — what the hostile-input tests (test_hostile_*.c, issue #14) share:
 * running the kiln binary with captured output, small file helpers, and a cache
 * row that passes every check of `kiln verify` without NVRTC (a header-only
 * CUDA ELF and key material that hashes to its key). Static functions, one copy
 * per test file.
 */
#ifndef KILN_TESTS_HOSTILE_H
#define KILN_TESTS_HOSTILE_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache.h"
#include "jit.h"
#include "kt.h"

/* Most words one run passes. */
#define H_ARGS_MAX 24

/* What one run of the binary left: exit status (-1 when it did not exit),
 * stdout, stderr. */
typedef struct h_run {
    int code;
    char *out, *err;
} h_run;

static inline void h_free(h_run *r)
{
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof *r);
}

/* The whole file at path (malloc'd, NUL-terminated; *n its size when n is
 * non-NULL); "" when unreadable. */
static inline char *h_slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    size_t len = 0, cap = 1;
    char *buf = malloc(cap);
    if (f && buf) {
        int ch;
        while ((ch = getc(f)) != EOF) {
            if (len + 1 >= cap) {
                char *p = realloc(buf, cap * 2);
                if (!p) break;
                buf = p;
                cap *= 2;
            }
            buf[len++] = (char)ch;
        }
    }
    if (f) fclose(f);
    if (buf) buf[len] = 0;
    if (n) *n = len;
    return buf;
}

static inline void h_write(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* "<tmpdir>/<name>" in one of 64 rotating static buffers (copy a path that must
 * outlive 64 more calls). */
static inline const char *h_path(const char *name)
{
    static char bufs[64][512];
    static int next;
    char *p = bufs[next++ % 64];
    snprintf(p, sizeof bufs[0], "%s/%s", kt_tmpdir(), name);
    return p;
}

static inline int h_exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* Run the kiln binary with args (NULL-terminated), stdin from `in` (NULL:
 * /dev/null). */
static inline int h_run_in(h_run *r, const char *in, const char *const *args)
{
    const char *argv[H_ARGS_MAX + 2] = {kt_kiln_bin()};
    int argc = 1;
    for (int i = 0; args[i] && argc < H_ARGS_MAX; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    return r->code = kt_run(in, argv, &r->out, &r->err);
}

#define H_RUN(r, ...)           h_run_in((r), NULL, (const char *const[]){__VA_ARGS__, NULL})
#define H_RUN_STDIN(r, in, ...) h_run_in((r), (in), (const char *const[]){__VA_ARGS__, NULL})

/* The smallest cubin kiln__cubin_check accepts: a 64-byte ELF64 little-endian
 * header for the CUDA machine (190) with no program or section headers; `tag`
 * varies one padding byte so that rows differ. */
static inline void h_cubin(unsigned char out[64], int tag)
{
    memset(out, 0, 64);
    memcpy(out, "\177ELF", 4);
    out[4] = 2;                  /* ELFCLASS64 */
    out[5] = 1;                  /* little-endian */
    out[6] = 1;                  /* version */
    out[9] = (unsigned char)tag; /* EI_PAD */
    out[18] = 190;               /* e_machine: CUDA */
    out[52] = 64;                /* e_ehsize */
}

/* A row that passes kiln__cache_row_check with this kiln's rules: its key is
 * the hash of its material, which names its spec and arch. spec may hold any
 * bytes (control characters included). Free with kiln__entry_free. */
static inline void h_entry(kiln__entry *en, const char *spec, const char *arch, int tag)
{
    static unsigned char cubin[64];
    char material[1024];
    memset(en, 0, sizeof *en);
    snprintf(material, sizeof material, "kiln-key-format: %d\nspec: %s\nconfig: tag=%d\narch: %s\n",
             KILN__FORMAT_VERSION, spec, tag, arch);
    kiln__key_hash(material, en->key);
    en->spec = strdup(spec);
    en->arch = strdup(arch);
    en->nvrtc = strdup("13.0");
    en->key_material = strdup(material);
    en->source = strdup("/* generated - do not edit */\n__global__ void kiln_main(void) {}\n");
    en->log = strdup("ptxas info    : Used 32 registers\n");
    h_cubin(cubin, tag);
    en->cubin = malloc(64);
    if (en->cubin) memcpy(en->cubin, cubin, 64);
    en->cubin_size = 64;
    en->registers = 32;
    en->smem_bytes = 4096;
    en->compile_ms = 12.5;
}

/* Create the cache directory dir with one h_entry row per spec (n of them); the
 * keys go to keys[n][33] when keys is non-NULL. 0 on success. */
static inline int h_cache(const char *dir, const char *const *specs, int n, char (*keys)[33])
{
    kiln__cache *c = NULL;
    kiln__err e = {{0}};
    if (kiln__cache_open(dir, &c, &e)) {
        printf("    h_cache: %s\n", e.msg);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        kiln__entry en;
        h_entry(&en, specs[i], "sm_80", i);
        if (kiln__cache_put(c, &en, &e)) {
            printf("    h_cache: %s\n", e.msg);
            rc = -1;
        }
        if (keys) memcpy(keys[i], en.key, 33);
        kiln__entry_free(&en);
    }
    kiln__cache_close(c);
    return rc;
}

#endif /* KILN_TESTS_HOSTILE_H */
