/*
 * kt.h — kiln's test harness: tests register themselves into one table, the runner (run.c)
 * filters them by name, runs each, and prints "N passed, N failed" last.
 *
 *   KT_TEST(spec_roundtrip) { KT_EQ_INT(1 + 1, 2); }      // a CPU test
 *   KT_GPU_TEST(decode_grid) { ... }                       // skipped without a GPU
 *
 * A failed check prints file:line, the expression and both values, marks the test failed and
 * lets the test continue; KT_REQUIRE returns from the test on failure. The helpers the test
 * files share (paths, files, child processes, the kiln binary, contexts, SQLite, cache rows)
 * are declared here too and live in kt.c.
 */
#ifndef KILN_KT_H
#define KILN_KT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

/* The number of elements of the array a, as an int. */
#define KT_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The uid and gid permission tests drop to when the tests run as root. */
#define KT_NOBODY 65534

typedef void (*kt_fn)(void);

typedef struct kt_case {
    const char *name;
    const char *file;
    kt_fn fn;
    int gpu; /* 1: needs a GPU */
} kt_case;

void kt_register(const char *name, const char *file, kt_fn fn, int gpu);
/* Record a failure (the runner prints it). */
void kt_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Mark the current test skipped, with a reason; the test should return. */
void kt_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Non-zero once the current test has failed. */
int kt_failed(void);
/* A scratch directory for this test (fresh, removed after the run). Valid for the test. */
const char *kt_tmpdir(void);
/* Path of the kiln binary under test (build/bin/kiln). */
const char *kt_kiln_bin(void);
/* 1 when a GPU is usable in this process. */
int kt_have_gpu(void);

/* ---- helpers shared by the test files (kt.c) ------------------------------------------------ */

/* 1 when libclang loads (the snippet validator can run); otherwise the test is marked skipped
 * with the reason, and the caller returns. */
int kt_need_clang(void);

/* Paths. "<a>/<b>" and "<kt_tmpdir()>/<name>" in one of 256 rotating static buffers (a may be
 * an earlier result; copy a path that must outlive 256 more calls). */
const char *kt_join(const char *a, const char *b);
const char *kt_path(const char *name);
/* The cache directory GPU tests share across runs: $KILN_TEST_CACHE when set and not empty,
 * else "<kt_tmpdir()>/cache". Valid for the test. */
const char *kt_cache_dir(void);

/* Files. kt_slurp: the whole file, malloc'd and NUL-terminated (*n its size when n is not
 * NULL); NULL (and *n = 0) when it cannot be read. kt_write / kt_write_text: create or truncate
 * path with n bytes of data / with text; 0 on success, -1 (with the reason printed) otherwise.
 * kt_exists: 1 when path names anything (a dangling link included). kt_file_mode: the
 * permission bits of path, -1 when it cannot be stat'ed. */
char *kt_slurp(const char *path, size_t *n);
int kt_write(const char *path, const void *data, size_t n);
int kt_write_text(const char *path, const char *text);
int kt_exists(const char *path);
int kt_file_mode(const char *path);
/* Set an environment variable, or unset it when value is NULL. */
void kt_setenv(const char *name, const char *value);

/* Child processes. kt_spawn starts argv[0] with argv (NULL-terminated), stdin from the file `in`
 * (NULL: /dev/null), stdout and stderr into the files out_path and err_path, and the "K=V"
 * strings of env (NULL-terminated; NULL: none) added to its environment; returns its pid, -1
 * when fork failed. kt_wait waits for it: its exit status, -1 when it did not exit normally. */
int kt_spawn(const char *in, const char *const *env, const char *const *argv, const char *out_path,
             const char *err_path);
int kt_wait(int pid);
/* Run argv[0] with argv (NULL-terminated) in a child, stdin from the file `in` (NULL:
 * /dev/null). Its stdout and stderr are returned in *out and *err (malloc'd, NUL-terminated,
 * never NULL; the caller frees them). Returns the exit status, -1 if it did not exit. */
int kt_run(const char *in, const char *const *argv, char **out, char **err);

/* What one run of the kiln binary left: exit status (-1 when it did not exit normally or could
 * not start), stdout and stderr (malloc'd, NUL-terminated, never NULL after kt_kiln). */
typedef struct kt_out {
    int code;
    char *out, *err;
} kt_out;
/* Free r's texts and zero it; safe on a zeroed kt_out. */
void kt_out_free(kt_out *r);
/* 1 when the kiln binary (kt_kiln_bin) is an executable; 0 with the test failed at the
 * caller's line otherwise. */
int kt__have_kiln(const char *file, int line);
#define KT_HAVE_KILN() kt__have_kiln(__FILE__, __LINE__)
/* Run the kiln binary (kt_kiln_bin) with args (NULL-terminated, at most 32), stdin from `in`
 * (NULL: /dev/null) and env as for kt_spawn. Returns the exit status (also in r->code). */
int kt_kiln(kt_out *r, const char *in, const char *const *env, const char *const *args);
#define KT_KILN(r, ...)           kt_kiln((r), NULL, NULL, (const char *const[]){__VA_ARGS__, NULL})
#define KT_KILN_STDIN(r, in, ...) kt_kiln((r), (in), NULL, (const char *const[]){__VA_ARGS__, NULL})

/* Start the kiln binary with args (NULL-terminated, at most 32) and env as for kt_spawn in the
 * background; stdout and stderr go to <tmp>/<tag>.out and .err. Returns its pid (-1: fork
 * failed). kt_kiln_reap waits for pid (none when pid is -1) and reads those two files into r;
 * returns the exit status (also in r->code). */
int kt_kiln_spawn(const char *tag, const char *const *env, const char *const *args);
int kt_kiln_reap(int pid, const char *tag, kt_out *r);
#define KT_KILN_ENV(r, env, ...) kt_kiln((r), NULL, (env), (const char *const[]){__VA_ARGS__, NULL})

/* Contexts, or NULL with the test failed at the caller's line when one cannot be created.
 * KT_CTX: on the cache directory dir (NULL: no cache), with the device when device is 1 and
 * compile-only (no_device) when 0. KT_CTX_POLICY: compile-only on dir (NULL: no cache) with a
 * cache mode, a record file (or NULL), a read-only base cache (or NULL) and a size bound (0:
 * none). */
kiln_ctx *kt__ctx(const char *file, int line, const char *dir, int device);
kiln_ctx *kt__ctx_policy(const char *file, int line, const char *dir, kiln_cache_mode mode,
                         const char *record, const char *base, int64_t max_bytes);
#define KT_CTX(dir, device) kt__ctx(__FILE__, __LINE__, (dir), (device))
#define KT_CTX_POLICY(dir, mode, record, base, max_bytes)                                          \
    kt__ctx_policy(__FILE__, __LINE__, (dir), (mode), (record), (base), (max_bytes))

/* Four cheap variants (decode head_dim=64, ~0.3 s each to compile on a 2-core box). */
#define KT_SPEC_0 "op=decode dtype=bf16 head_dim=64 group=1"
#define KT_SPEC_1 "op=decode dtype=f16 head_dim=64 group=2"
#define KT_SPEC_2 "op=decode dtype=bf16 head_dim=64 group=4 lse=1"
#define KT_SPEC_3 "op=decode dtype=f16 head_dim=64 group=8 logits=softcap"
extern const char *const kt_specs4[4]; /* KT_SPEC_0 .. KT_SPEC_3 */
/* Compile spec for arch in ctx: 1 when it came from the cache, 0 when compiled, -1 on a failure
 * (the message is kiln_ctx_errmsg(ctx)). */
int kt_compile(kiln_ctx *ctx, const char *spec, const char *arch);
/* The key spec has for arch, computed (nothing compiled) into key; "" with the test failed
 * when spec does not parse or pick a config. */
void kt_key_of(const char *spec, const char *arch, char key[33]);
/* Run *result = fn(ctx, spec, arch) with stderr sent to an anonymous file (usable by any user,
 * root or nobody); returns what it wrote (malloc'd, never NULL). */
char *kt_capture_stderr(int (*fn)(kiln_ctx *, const char *, const char *), kiln_ctx *ctx,
                        const char *spec, const char *arch, int *result);

/* SQLite, on a connection of the test's own (10 s busy timeout), to inspect or edit a cache
 * behind its back. kt_sql_text: the first column of the first row of sql, malloc'd; "" for no
 * row or a NULL value, "(error: ...)" on an error. kt_sql_long: the same as a number, -1 on an
 * error. kt_sql_exec: run sql (several statements allowed); 1 on success, 0 (with the reason
 * printed) otherwise. */
char *kt_sql_text(const char *db, const char *sql);
long kt_sql_long(const char *db, const char *sql);
int kt_sql_exec(const char *db, const char *sql);
/* Damage the cubin of key's row in the cache file db: flip 4 bytes in the middle (checksum
 * left stale), cut it in half (checksum stale), or cut it in half and store a matching checksum
 * (only the ELF check can tell). 1 on success, 0 (the reason printed) otherwise. */
typedef enum kt_damage { KT_FLIP, KT_TRUNCATE_STALE, KT_TRUNCATE_RESUMMED } kt_damage;
int kt_damage_cubin(const char *db, const char *key, kt_damage how);
/* Check PRAGMA integrity_check of the database at path says "ok". */
#define KT_INTEGRITY(path)                                                                         \
    do {                                                                                           \
        char *kt_r_ = kt_sql_text((path), "PRAGMA integrity_check");                               \
        KT_EQ_STR(kt_r_, "ok");                                                                    \
        free(kt_r_);                                                                               \
    } while (0)

/* Cache rows (cache/cache.h's kiln__entry; free each with kiln__entry_free).
 * kt_entry: entry number i, every field set, a cubin of size pseudo-random bytes (zeros
 * included); its key is the hash of "key-<i>", not of its material.
 * kt_entry_valid: a row that passes kiln__cache_row_check with this kiln's rules: its key is the
 * hash of its material, which names spec and arch, and its cubin the smallest one
 * kiln__cubin_check accepts (kt_cubin); spec may hold any bytes; tag varies the row.
 * kt_cubin: a 64-byte ELF64 little-endian header for the CUDA machine, no program or section
 * headers; tag sets one padding byte. */
typedef struct kiln__entry kiln__entry;
typedef struct kiln__cache kiln__cache;
void kt_entry(kiln__entry *en, int i, size_t size);
void kt_entry_valid(kiln__entry *en, const char *spec, const char *arch, int tag);
void kt_cubin(unsigned char out[64], int tag);
/* Whether ptxas serialized the wgmma instructions of kernel k (an sm_90a cubin): it then
 * brackets every HGMMA with a warpgroup arrive and a wait (WARPGROUP.ARRIVE / .DEPBAR, SASS
 * opcode 0x9c5 in an instruction's low 12 bits; HGMMA 0xdf0 from registers, 0x9f0 from shared
 * memory), so such syncs are at least as many as the HGMMAs; a pipelined kernel has a few. Its
 * advisories (C7511, C7515) go to the process's stderr, not to the NVRTC log. 1 serialized, 0
 * not, -1 (the reason printed) when the cubin cannot be read as ELF64. */
int kt_wgmma_serialized(const kiln_kernel *k);
/* Create the cache directory dir with one kt_entry_valid row per spec (n of them, arch sm_80,
 * tag i); their keys go to keys[n][33] when keys is not NULL. 0 on success. */
int kt_cache_fill(const char *dir, const char *const *specs, int n, char (*keys)[33]);
/* The number of rows of the open cache c, -1 (the reason printed) when it cannot be counted. */
int64_t kt_cache_rows(kiln__cache *c);
/* Open dir as a cache, or fail the test at the caller's line and return NULL. */
kiln__cache *kt__cache_open(const char *file, int line, const char *dir);
#define KT_CACHE_OPEN(dir) kt__cache_open(__FILE__, __LINE__, (dir))

#define KT__REG(name, gpu)                                                                         \
    static void kt_##name(void);                                                                   \
    __attribute__((constructor)) static void kt_reg_##name(void)                                   \
    {                                                                                              \
        kt_register(#name, __FILE__, kt_##name, gpu);                                              \
    }                                                                                              \
    static void kt_##name(void)

#define KT_TEST(name)     KT__REG(name, 0)
#define KT_GPU_TEST(name) KT__REG(name, 1)

#define KT_CHECK(expr)                                                                             \
    do {                                                                                           \
        if (!(expr)) kt_fail(__FILE__, __LINE__, "%s", #expr);                                     \
    } while (0)

#define KT_REQUIRE(expr)                                                                           \
    do {                                                                                           \
        if (!(expr)) {                                                                             \
            kt_fail(__FILE__, __LINE__, "required: %s", #expr);                                    \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define KT_EQ_INT(a, b)                                                                            \
    do {                                                                                           \
        long long kt_a_ = (long long)(a), kt_b_ = (long long)(b);                                  \
        if (kt_a_ != kt_b_)                                                                        \
            kt_fail(__FILE__, __LINE__, "%s == %s (%lld vs %lld)", #a, #b, kt_a_, kt_b_);          \
    } while (0)

#define KT_EQ_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *kt_a_ = (a), *kt_b_ = (b);                                                     \
        if (!kt_a_ || !kt_b_ || strcmp(kt_a_, kt_b_) != 0)                                         \
            kt_fail(__FILE__, __LINE__, "%s == %s (\"%s\" vs \"%s\")", #a, #b,                     \
                    kt_a_ ? kt_a_ : "(null)", kt_b_ ? kt_b_ : "(null)");                           \
    } while (0)

#define KT_CONTAINS(hay, needle)                                                                   \
    do {                                                                                           \
        const char *kt_h_ = (hay), *kt_n_ = (needle);                                              \
        if (!kt_h_ || !strstr(kt_h_, kt_n_))                                                       \
            kt_fail(__FILE__, __LINE__, "%s contains \"%s\" (got \"%s\")", #hay, kt_n_,            \
                    kt_h_ ? kt_h_ : "(null)");                                                     \
    } while (0)

/* Check a kiln call returned `want`; print the status and the message otherwise. `msg` is an
 * expression giving the last error text (kiln_errmsg() or kiln_ctx_errmsg(ctx)). */
#define KT_STATUS(call, want, msg)                                                                 \
    do {                                                                                           \
        kiln_status kt_s_ = (call);                                                                \
        if (kt_s_ != (want))                                                                       \
            kt_fail(__FILE__, __LINE__, "%s -> %s, want %s: %s", #call, kiln_status_str(kt_s_),    \
                    kiln_status_str(want), (msg));                                                 \
    } while (0)

#define KT_OK(call, msg) KT_STATUS(call, KILN_STATUS_OK, msg)

#endif /* KILN_KT_H */
