/*
 * wgmma_probe.cu — checks kiln's wgmma vocabulary (templates/common/hopper.cuh, wgmma.cuh) on
 * an sm_90a GPU against a float64 product, before a kernel is written on it: the 128-byte
 * swizzled tiles, the K-major descriptors of S = Q K^T (two 64-column blocks), the N-major
 * descriptors of O += P V with P from registers, for each N the kernels use. Each descriptor
 * form is tried with its leading and stride offsets both ways round, so that the output says
 * which one the hardware takes.
 *
 * Build: make probe (nvcc -gencode arch=compute_90a,code=sm_90a); run: build/bin/wgmma-probe.
 * Exit 0 when every form kiln uses matched, 1 otherwise.
 */
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/hopper.cuh"
#include "common/wgmma.cuh"

using namespace kiln;

static __device__ __forceinline__ u16 bf(float f) { return from_float<BF16>(f); }

template <int N> __device__ void ss_call(float (&d)[N / 8][4], u64 da, u64 db, int acc)
{
    if constexpr (N == 64) wgmma_ss_64<BF16>(d, da, db, acc);
    if constexpr (N == 128) wgmma_ss_128<BF16>(d, da, db, acc);
    if constexpr (N == 256) wgmma_ss_256<BF16>(d, da, db, acc);
}
template <int N> __device__ void rs_call(float (&d)[N / 8][4], const u32 (&a)[4], u64 db, int acc)
{
    if constexpr (N == 64) wgmma_rs_64<BF16>(d, a, db, acc);
    if constexpr (N == 128) wgmma_rs_128<BF16>(d, a, db, acc);
    if constexpr (N == 256) wgmma_rs_256<BF16>(d, a, db, acc);
}

template <int N> __device__ void store_acc(float *c, const float (&d)[N / 8][4])
{
    const int t = threadIdx.x, w = t / 32, l = t % 32;
    for (int nt = 0; nt < N / 8; nt++)
        for (int e = 0; e < 4; e++) {
            const int row = w * 16 + l / 4 + 8 * (e / 2), col = nt * 8 + (l % 4) * 2 + (e % 2);
            c[row * N + col] = d[nt][e];
        }
}

/* C [64][N] = A [64][K] B[N][K]^T, K = 128 (two swizzle blocks), both K-major. */
template <int N> __global__ void ss_kernel(const float *a, const float *b, float *c, int lead, int stride)
{
    constexpr int K = 128;
    extern __shared__ __align__(1024) unsigned char sm[];
    unsigned char *as = sm, *bs = sm + 64 * K * 2;
    for (int e = threadIdx.x; e < 64 * K / 8; e += 128) {
        const int r = e / (K / 8), ch = e % (K / 8);
        u16 *dst = reinterpret_cast<u16 *>(as + swz128_at(64, r, ch));
        for (int u = 0; u < 8; u++) dst[u] = bf(a[r * K + ch * 8 + u]);
    }
    for (int e = threadIdx.x; e < N * K / 8; e += 128) {
        const int r = e / (K / 8), ch = e % (K / 8);
        u16 *dst = reinterpret_cast<u16 *>(bs + swz128_at(N, r, ch));
        for (int u = 0; u < 8; u++) dst[u] = bf(b[r * K + ch * 8 + u]);
    }
    fence_proxy_async();
    __syncthreads();
    float d[N / 8][4];
    wgmma_fence();
    for (int kk = 0; kk < K / 16; kk++) {
        const u64 da = smem_desc(smem_addr(as) + (kk / 4) * 64 * 128 + (kk % 4) * 32, lead, stride);
        const u64 db = smem_desc(smem_addr(bs) + (kk / 4) * N * 128 + (kk % 4) * 32, lead, stride);
        ss_call<N>(d, da, db, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(d);
    store_acc<N>(c, d);
}

/* C [64][N] = P [64][K] V [K][N], K = 64 keys: P from registers, V N-major ([keys][N] rows). */
template <int N> __global__ void rs_kernel(const float *p, const float *v, float *c, int lead, int stride)
{
    constexpr int K = 64;
    extern __shared__ __align__(1024) unsigned char sm[];
    for (int e = threadIdx.x; e < K * N / 8; e += 128) {
        const int r = e / (N / 8), ch = e % (N / 8);
        u16 *dst = reinterpret_cast<u16 *>(sm + swz128_at(K, r, ch));
        for (int u = 0; u < 8; u++) dst[u] = bf(v[r * N + ch * 8 + u]);
    }
    fence_proxy_async();
    __syncthreads();
    const int t = threadIdx.x, w = t / 32, l = t % 32;
    const int r0 = w * 16 + l / 4, c0 = (l % 4) * 2;
    float d[N / 8][4];
    u32 af[K / 16][4];
    for (int kk = 0; kk < K / 16; kk++) {
        const float *pr = p + r0 * K + kk * 16 + c0, *pr8 = pr + 8 * K;
        af[kk][0] = pack2<BF16>(pr[0], pr[1]);
        af[kk][1] = pack2<BF16>(pr8[0], pr8[1]);
        af[kk][2] = pack2<BF16>(pr[8], pr[9]);
        af[kk][3] = pack2<BF16>(pr8[8], pr8[9]);
    }
    wgmma_fence();
    for (int kk = 0; kk < K / 16; kk++) {
        const u64 db = smem_desc(smem_addr(sm) + kk * 16 * 128, lead, stride);
        rs_call<N>(d, af[kk], db, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(d);
    store_acc<N>(c, d);
}

static float rnd_bf(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    const float x = ((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
    unsigned u;
    memcpy(&u, &x, 4);
    u &= 0xffff0000u; /* exactly representable in bf16 */
    float y;
    memcpy(&y, &u, 4);
    return y;
}

static int check(const char *what, const std::vector<double> &ref, const float *got, size_t n)
{
    double err = 0, mag = 0;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs(ref[i] - got[i]));
        mag = fmax(mag, fabs(ref[i]));
    }
    const int ok = err <= 1e-3 * (mag + 1);
    printf("%-48s max|err| %.3g (max|ref| %.3g) %s\n", what, err, mag, ok ? "MATCH" : "differs");
    return ok;
}

template <int N> static int run_ss(int lead, int stride)
{
    constexpr int K = 128;
    unsigned s = 7u + N;
    std::vector<float> a(64 * K), b(N * K), c(64 * N);
    for (auto &x : a) x = rnd_bf(&s);
    for (auto &x : b) x = rnd_bf(&s);
    std::vector<double> ref(64 * N);
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)a[i * K + k] * b[j * K + k];
            ref[i * N + j] = acc;
        }
    float *da, *db, *dc;
    cudaMalloc(&da, a.size() * 4);
    cudaMalloc(&db, b.size() * 4);
    cudaMalloc(&dc, c.size() * 4);
    cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice);
    cudaMemset(dc, 0, c.size() * 4);
    const int smem = (64 + N) * K * 2;
    cudaFuncSetAttribute(ss_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    ss_kernel<N><<<1, 128, smem>>>(da, db, dc, lead, stride);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    char what[96];
    snprintf(what, sizeof what, "ss K-major N=%d lead=%d stride=%d%s", N, lead, stride, e ? " (CUDA error)" : "");
    if (e) printf("%s: %s\n", what, cudaGetErrorString(e));
    return !e && check(what, ref, c.data(), c.size());
}

template <int N> static int run_rs(int lead, int stride)
{
    constexpr int K = 64;
    unsigned s = 11u + N;
    std::vector<float> p(64 * K), v(K * N), c(64 * N);
    for (auto &x : p) x = rnd_bf(&s);
    for (auto &x : v) x = rnd_bf(&s);
    std::vector<double> ref(64 * N);
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)p[i * K + k] * v[k * N + j];
            ref[i * N + j] = acc;
        }
    float *dp, *dv, *dc;
    cudaMalloc(&dp, p.size() * 4);
    cudaMalloc(&dv, v.size() * 4);
    cudaMalloc(&dc, c.size() * 4);
    cudaMemcpy(dp, p.data(), p.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
    cudaMemset(dc, 0, c.size() * 4);
    const int smem = K * N * 2;
    cudaFuncSetAttribute(rs_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    rs_kernel<N><<<1, 128, smem>>>(dp, dv, dc, lead, stride);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost);
    cudaFree(dp);
    cudaFree(dv);
    cudaFree(dc);
    char what[96];
    snprintf(what, sizeof what, "rs N-major N=%d lead=%d stride=%d%s", N, lead, stride, e ? " (CUDA error)" : "");
    if (e) printf("%s: %s\n", what, cudaGetErrorString(e));
    return !e && check(what, ref, c.data(), c.size());
}

int main()
{
    int kiln_forms = 1;
    /* K-major: kiln's form (lead unused, stride 1024), then the offsets swapped */
    kiln_forms &= run_ss<64>(16, 1024);
    kiln_forms &= run_ss<128>(16, 1024);
    run_ss<64>(1024, 16);
    /* N-major V [64 keys][N]: kiln's form (lead = one 64-column block = 64 rows * 128 bytes,
     * stride = 8 keys = 1024 bytes), then swapped */
    kiln_forms &= run_rs<64>(64 * 128, 1024);
    kiln_forms &= run_rs<128>(64 * 128, 1024);
    kiln_forms &= run_rs<256>(64 * 128, 1024);
    run_rs<128>(1024, 64 * 128);
    printf("kiln's descriptor forms: %s\n", kiln_forms ? "all match" : "NOT all match");
    return kiln_forms ? 0 : 1;
}
