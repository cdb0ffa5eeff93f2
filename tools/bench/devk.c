/*
 * devk.c — kiln-bench's helper kernels: random fills on the device (a batch pool of 34 GB
 * cannot be drawn on the host in reasonable time) and the streaming-read ceiling that decode
 * is measured against (MISSION.md: decode reads far more than it writes, so its ceiling is a
 * streaming read, not a copy). One small CUDA source compiled with NVRTC for the context's
 * arch, loaded with the driver table of the context.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static const char devk_source[] =
    "typedef unsigned long long u64;\n"
    "struct alignas(16) u4 { unsigned x, y, z, w; };\n"
    "__device__ __forceinline__ unsigned mix(u64 x) {\n"
    "    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33;\n"
    "    x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33; return (unsigned)x;\n"
    "}\n"
    /* bf16 in [-scale, scale), round to nearest even */
    "extern \"C\" __global__ void devk_fill_bf16(unsigned short *p, u64 n, u64 seed, float scale) "
    "{\n"
    "    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * "
    "blockDim.x) {\n"
    "        unsigned h = mix(seed * 0x9e3779b97f4a7c15ull + i);\n"
    "        float f = ((float)(h >> 8) * (1.0f / 8388608.0f) - 1.0f) * scale;\n"
    "        unsigned b = __float_as_uint(f);\n"
    "        b += 0x7fffu + ((b >> 16) & 1u);\n"
    "        p[i] = (unsigned short)(b >> 16);\n"
    "    }\n"
    "}\n"
    /* e4m3: sign, exponent field 4..7, mantissa 0..7 */
    "extern \"C\" __global__ void devk_fill_e4m3(unsigned char *p, u64 n, u64 seed) {\n"
    "    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * "
    "blockDim.x) {\n"
    "        unsigned h = mix(seed * 0x9e3779b97f4a7c15ull + i);\n"
    "        p[i] = (unsigned char)(((h & 1u) << 7) | ((4u + ((h >> 1) & 3u)) << 3) | ((h >> 3) & "
    "7u));\n"
    "    }\n"
    "}\n"
    /* streaming read: UNROLL independent 16-byte non-caching loads in flight per thread */
    "__device__ __forceinline__ u4 ld_stream(const u4 *p) {\n"
    "    u4 v;\n"
    "    asm volatile(\"ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\"\n"
    "                 : \"=r\"(v.x), \"=r\"(v.y), \"=r\"(v.z), \"=r\"(v.w) : \"l\"(p));\n"
    "    return v;\n"
    "}\n"
    "template <int UNROLL> __device__ void read_all(const u4 *p, u64 n, unsigned *sink) {\n"
    "    const u64 stride = (u64)gridDim.x * blockDim.x;\n"
    "    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;\n"
    "    unsigned acc = 0;\n"
    "    for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {\n"
    "        u4 v[UNROLL];\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < UNROLL; u++) v[u] = ld_stream(p + i + u * stride);\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < UNROLL; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;\n"
    "    }\n"
    "    for (; i < n; i += stride) { u4 v = ld_stream(p + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }\n"
    "    if (acc == 0x9e3779b9u) sink[0] = acc; /* keeps the loads; practically never stores */\n"
    "}\n"
    "extern \"C\" __global__ void devk_read4(const u4 *p, u64 n, unsigned *sink) { read_all<4>(p, "
    "n, sink); }\n"
    "extern \"C\" __global__ void devk_read8(const u4 *p, u64 n, unsigned *sink) { read_all<8>(p, "
    "n, sink); }\n"
    /* the paged decode's reads without its arithmetic: CTA (x, h) of 128 threads reads KV head
     * h's 16 rows of 256 bytes (d128, 16-bit) in pages table[x ppc .. x ppc + ppc - 1] of the K
     * and the V pool, four pages (16 loads a thread) in flight; NHD: a page is [16 tokens][heads]
     * [128] (a head's row every heads x 256 bytes), HND: [heads][16 tokens][128] (a head's 4 KiB
     * contiguous). Every load and fold is volatile asm, so their order stays: the four table
     * entries, the 16 loads, then the folds. */
    "__device__ __forceinline__ int ld_entry(const int *p) {\n"
    "    int v; asm volatile(\"ld.global.nc.s32 %0, [%1];\" : \"=r\"(v) : \"l\"(p)); return v;\n"
    "}\n"
    "__device__ __forceinline__ void fold(unsigned &acc, const u4 &v) {\n"
    "    asm volatile(\"xor.b32 %0, %0, %1; xor.b32 %0, %0, %2; xor.b32 %0, %0, %3; xor.b32 %0, "
    "%0, "
    "%4;\" : \"+r\"(acc) : \"r\"(v.x), \"r\"(v.y), \"r\"(v.z), \"r\"(v.w));\n"
    "}\n"
    "extern \"C\" __global__ void devk_read_pages(const u4 *k, const u4 *v, const int *table, int "
    "ppc, int heads, int hnd, unsigned *sink) {\n"
    "    const u64 h = blockIdx.y;\n"
    "    unsigned acc = 0;\n"
    "    for (int p0 = 0; p0 < ppc; p0 += 4) {\n"
    "        int pg[4];\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < 4; u++) pg[u] = ld_entry(table + (u64)blockIdx.x * ppc + p0 + "
    "u);\n"
    "        u4 a[4][4];\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < 4; u++) {\n"
    "            const u64 page = (u64)pg[u];\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < 2; j++) {\n"
    "                const unsigned e = threadIdx.x + j * 128, row = e >> 4, col = e & 15;\n"
    "                const u64 off = hnd ? (page * heads + h) * 256 + row * 16 + col\n"
    "                                    : (page * 16 + row) * heads * 16 + h * 16 + col;\n"
    "                a[u][j] = ld_stream(k + off);\n"
    "                a[u][2 + j] = ld_stream(v + off);\n"
    "            }\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int u = 0; u < 4; u++)\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < 4; j++) fold(acc, a[u][j]);\n"
    "    }\n"
    "    if (acc == 0x9e3779b9u) sink[0] = acc;\n"
    "}\n";

static struct {
    CUmodule mod;
    CUfunction fill_bf16, fill_e4m3, read4, read8, read_pages;
} dk;

kiln_status bench_cu_fail(const bench_env *env, CUresult r, const char *prefix, const char *what,
                          char *msg, size_t cap)
{
    const char *name = NULL;
    env->cu->cuGetErrorName(r, &name);
    snprintf(msg, cap, "%s%s: %s", prefix, what, name ? name : "?");
    return r == CUDA_ERROR_OUT_OF_MEMORY ? KILN_STATUS_NO_MEMORY : KILN_STATUS_CUDA;
}

#define DK_TRY(call, what)                                                                         \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            bench_cu_fail(env, r_, "devk: ", what, msg, cap);                                      \
            return KILN_STATUS_CUDA;                                                               \
        }                                                                                          \
    } while (0)

kiln_status devk_load(bench_env *env, char *msg, size_t cap)
{
    if (dk.mod) return KILN_STATUS_OK;
    kiln__err e = {{0}};
    kiln__compiled c;
    kiln_status st = kiln__nvrtc_compile(devk_source, env->di.arch, "kiln_bench_devk.cu", &c, &e);
    if (st) {
        snprintf(msg, cap, "%s", e.msg);
        return st;
    }
    if ((st = kiln__ctx_bind(env->ctx, &e))) {
        kiln__compiled_free(&c);
        snprintf(msg, cap, "%s", e.msg);
        return st;
    }
    CUresult r = env->cu->cuModuleLoadData(&dk.mod, c.cubin);
    kiln__compiled_free(&c);
    DK_TRY(r, "load helper module");
    DK_TRY(env->cu->cuModuleGetFunction(&dk.fill_bf16, dk.mod, "devk_fill_bf16"), "devk_fill_bf16");
    DK_TRY(env->cu->cuModuleGetFunction(&dk.fill_e4m3, dk.mod, "devk_fill_e4m3"), "devk_fill_e4m3");
    DK_TRY(env->cu->cuModuleGetFunction(&dk.read4, dk.mod, "devk_read4"), "devk_read4");
    DK_TRY(env->cu->cuModuleGetFunction(&dk.read8, dk.mod, "devk_read8"), "devk_read8");
    DK_TRY(env->cu->cuModuleGetFunction(&dk.read_pages, dk.mod, "devk_read_pages"),
           "devk_read_pages");
    return KILN_STATUS_OK;
}

static unsigned grid_for(const bench_env *env, uint64_t n, unsigned threads)
{
    uint64_t g = (n + threads - 1) / threads;
    const uint64_t cap = (uint64_t)env->di.sm_count * 16;
    return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

kiln_status devk_fill_bf16(bench_env *env, CUdeviceptr p, uint64_t n, uint64_t seed, float scale)
{
    char msg[128];
    const size_t cap = sizeof msg;
    void *args[] = {&p, &n, &seed, &scale};
    DK_TRY(env->cu->cuLaunchKernel(dk.fill_bf16, grid_for(env, n, 256), 1, 1, 256, 1, 1, 0, NULL,
                                   args, NULL),
           "fill bf16");
    return KILN_STATUS_OK;
}

kiln_status devk_fill_e4m3(bench_env *env, CUdeviceptr p, uint64_t n, uint64_t seed)
{
    char msg[128];
    const size_t cap = sizeof msg;
    void *args[] = {&p, &n, &seed};
    DK_TRY(env->cu->cuLaunchKernel(dk.fill_e4m3, grid_for(env, n, 256), 1, 1, 256, 1, 1, 0, NULL,
                                   args, NULL),
           "fill e4m3");
    return KILN_STATUS_OK;
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* The median of 30 launches (after 3 untimed) of f over grid (gx, gy) x threads, in ms, by
 * events; < 0 after writing why (naming `what`) to msg. */
static double time_launches(bench_env *env, CUfunction f, unsigned gx, unsigned gy,
                            unsigned threads, void **args, const char *what, char *msg, size_t cap)
{
    const kiln__cu *cu = env->cu;
    CUevent ev[2] = {0};
    double out = -1;
    float ms[33];
    if (cu->cuEventCreate(&ev[0], CU_EVENT_DEFAULT) ||
        cu->cuEventCreate(&ev[1], CU_EVENT_DEFAULT)) {
        snprintf(msg, cap, "devk: event create failed");
        goto done;
    }
    for (int t = 0; t < 33; t++) {
        cu->cuEventRecord(ev[0], NULL);
        CUresult r = cu->cuLaunchKernel(f, gx, gy, 1, threads, 1, 1, 0, NULL, args, NULL);
        cu->cuEventRecord(ev[1], NULL);
        if (r == CUDA_SUCCESS) r = cu->cuEventSynchronize(ev[1]);
        if (r != CUDA_SUCCESS) {
            bench_cu_fail(env, r, "devk: ", what, msg, cap);
            goto done;
        }
        cu->cuEventElapsedTime(&ms[t], ev[0], ev[1]);
    }
    qsort(ms + 3, 30, sizeof ms[0], cmp_f);
    out = ms[3 + 15];
done:
    if (ev[0]) cu->cuEventDestroy(ev[0]);
    if (ev[1]) cu->cuEventDestroy(ev[1]);
    return out;
}

kiln_status devk_read_ceiling(bench_env *env, size_t bytes, double *gbs, char *msg, size_t cap)
{
    static const struct {
        int unroll, threads, ctas_per_sm;
    } cfgs[] = {{4, 256, 8},  {8, 256, 8},  {4, 512, 4}, {8, 512, 4},
                {8, 1024, 2}, {4, 256, 16}, {8, 128, 16}};
    *gbs = 0;
    CUdeviceptr buf = 0, sink = 0;
    kiln_status st = KILN_STATUS_OK;
    const kiln__cu *cu = env->cu;
    uint64_t n16 = bytes / 16;
    if (cu->cuMemAlloc(&buf, bytes) || cu->cuMemAlloc(&sink, 16)) {
        snprintf(msg, cap, "devk: alloc %zu bytes for the read ceiling failed", bytes);
        st = KILN_STATUS_CUDA;
        goto done;
    }
    /* random contents: a read of zeros could be cheaper than real data */
    if ((st = devk_fill_bf16(env, buf, bytes / 2, 77, 1.0f))) {
        snprintf(msg, cap, "devk: fill for the read ceiling failed");
        goto done;
    }
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        CUfunction f = cfgs[c].unroll == 8 ? dk.read8 : dk.read4;
        const unsigned grid = (unsigned)(env->di.sm_count * cfgs[c].ctas_per_sm);
        void *args[] = {&buf, &n16, &sink};
        const double ms = time_launches(env, f, grid, 1, (unsigned)cfgs[c].threads, args,
                                        "read kernel", msg, cap);
        if (ms < 0) {
            st = KILN_STATUS_CUDA;
            goto done;
        }
        const double g = (double)n16 * 16 / (ms * 1e-3) / 1e9;
        if (g > *gbs) *gbs = g;
    }
done:
    if (buf) cu->cuMemFree(buf);
    if (sink) cu->cuMemFree(sink);
    return st;
}

kiln_status devk_read_pages_ceiling(bench_env *env, size_t bytes, int hnd, double *gbs, char *msg,
                                    size_t cap)
{
    enum { HEADS = 8, PAGE_BYTES = 16 * HEADS * 256 };
    static const int ppcs[] = {16, 64};
    *gbs = 0;
    const kiln__cu *cu = env->cu;
    const int pages = (int)(bytes / 2 / PAGE_BYTES / 64 * 64); /* a multiple of every ppc */
    CUdeviceptr k = 0, v = 0, table = 0, sink = 0;
    kiln_status st = KILN_STATUS_OK;
    int *h = malloc((size_t)pages * sizeof *h);
    if (!h || pages < 64) {
        snprintf(msg, cap, "devk: paged read ceiling: %zu bytes hold %d pages", bytes, pages);
        st = KILN_STATUS_NO_MEMORY;
        goto done;
    }
    /* every page once, in a fixed random order (a pool after many requests came and went) */
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < pages; i++) h[i] = i;
    for (int i = pages - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const int j = (int)(x % (uint64_t)(i + 1)), t = h[i];
        h[i] = h[j], h[j] = t;
    }
    const size_t pool = (size_t)pages * PAGE_BYTES;
    if (cu->cuMemAlloc(&k, pool) || cu->cuMemAlloc(&v, pool) ||
        cu->cuMemAlloc(&table, (size_t)pages * sizeof *h) || cu->cuMemAlloc(&sink, 16) ||
        cu->cuMemcpyHtoD(table, h, (size_t)pages * sizeof *h)) {
        snprintf(msg, cap, "devk: alloc or upload of two %zu-byte pools failed", pool);
        st = KILN_STATUS_CUDA;
        goto done;
    }
    if ((st = devk_fill_bf16(env, k, pool / 2, 78, 1.0f)) ||
        (st = devk_fill_bf16(env, v, pool / 2, 79, 1.0f))) {
        snprintf(msg, cap, "devk: fill for the paged read ceiling failed");
        goto done;
    }
    for (size_t c = 0; c < sizeof ppcs / sizeof ppcs[0]; c++) {
        int ppc = ppcs[c], heads = HEADS;
        void *args[] = {&k, &v, &table, &ppc, &heads, &hnd, &sink};
        const double ms = time_launches(env, dk.read_pages, (unsigned)(pages / ppc), HEADS, 128,
                                        args, "paged read kernel", msg, cap);
        if (ms < 0) {
            st = KILN_STATUS_CUDA;
            goto done;
        }
        const double g = 2.0 * (double)pool / (ms * 1e-3) / 1e9;
        if (g > *gbs) *gbs = g;
    }
done:
    free(h);
    if (k) cu->cuMemFree(k);
    if (v) cu->cuMemFree(v);
    if (table) cu->cuMemFree(table);
    if (sink) cu->cuMemFree(sink);
    return st;
}

float devk_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float devk_e4m3_to_f32(uint8_t b)
{
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m / 8.0f, -6);
    return s ? -v : v;
}
