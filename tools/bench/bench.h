/*
 * bench.h — what kiln-bench's files share: the driver table and ceilings of one run, the small
 * device helpers of devk.c (random fills, the streaming-read ceiling) and the batch suites of
 * batch.c. Bench-only; never linked into the library.
 */
#ifndef KILN_BENCH_H
#define KILN_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "kiln.h"
#include "runtime.h"

/* One bench run: the context, its driver table, the measured ceilings, the filters. */
typedef struct bench_env {
    kiln_ctx *ctx;
    const kiln__cu *cu;
    kiln_device_info di;
    double copy_gbs;  /* device-to-device copy, read + write counted */
    double read_gbs;  /* streaming read (best of a few configurations of devk's read kernel) */
    FILE *csv;        /* NULL: no CSV */
    const char *only; /* NULL or a point name: run only points of that name */
    int quick;        /* 1: the short sweep */
    double max_gib;   /* skip points whose buffers exceed this many GiB */
    int failed;       /* points that failed or mismatched */
} bench_env;

/* ---- devk.c: helper kernels, compiled with NVRTC for the context's arch ---- */

/* Compile and load the helper module (once per process). */
kiln_status devk_load(bench_env *env, char *msg, size_t cap);
/* Fill n bf16 values uniform in [-scale, scale) from seed (deterministic per (seed, index)). */
kiln_status devk_fill_bf16(bench_env *env, CUdeviceptr p, uint64_t n, uint64_t seed, float scale);
/* Fill n fp8 e4m3 bytes: random sign, exponent field 4..7, mantissa 0..7 (|x| in [1/8, 1.875],
 * never NaN). */
kiln_status devk_fill_e4m3(bench_env *env, CUdeviceptr p, uint64_t n, uint64_t seed);
/* Streaming-read ceiling over `bytes` (16-byte non-caching loads, several configurations, the
 * best median of 30): GB/s of bytes read. */
kiln_status devk_read_ceiling(bench_env *env, size_t bytes, double *gbs, char *msg, size_t cap);
/* The paged decode's read pattern without its arithmetic, over K and V pools of `bytes` in all:
 * pages of 16 tokens x 8 KV heads x d128 16-bit values, every page once in a fixed random order,
 * a CTA of 128 threads per (16 or 64 pages, KV head), NHD (hnd 0: a head's row every 2 KiB) or
 * HND (1: a head's 16 rows contiguous); the best median of 30 launches by events, GB/s read. */
kiln_status devk_read_pages_ceiling(bench_env *env, size_t bytes, int hnd, double *gbs, char *msg,
                                    size_t cap);

/* A failed driver call r: "<prefix><what>: <CUDA error name>" into msg[cap]; returns
 * KILN_STATUS_NO_MEMORY when the device is out of memory, else KILN_STATUS_CUDA. */
kiln_status bench_cu_fail(const bench_env *env, CUresult r, const char *prefix, const char *what,
                          char *msg, size_t cap);

/* Host decodings of what the fills wrote. */
float devk_bf16_to_f32(uint16_t h);
float devk_e4m3_to_f32(uint8_t b);

/* ---- batch.c ---- */

/* Print the batch point names, one a line; 1 if name is one of them. */
void batch_list(void);
int batch_known(const char *name);
/* Run the batch suites (decode sweep, prefill, cascade, host overhead) under env's filters;
 * prints one markdown table per suite, writes CSV rows. Returns the number of failed points. */
int batch_run_all(bench_env *env);

#endif /* KILN_BENCH_H */
