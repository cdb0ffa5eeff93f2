/*
 * device.cuh — the small vocabulary every kiln kernel is written in: 16-bit element types and
 * their conversions, 16-byte async copies (cp.async), ldmatrix, the m16n8k16 tensor-core MMA,
 * fast exp2 / tanh, and the logits transform and mask hooks shared by decode and prefill.
 *
 * No CUDA header is included: the generated source is self-contained and compiles with
 * NVRTC -minimal. 16-bit values are carried as raw bits (unsigned short / packed unsigned int).
 * Requires sm_80 or newer.
 */
#ifndef KILN_DEVICE_CUH
#define KILN_DEVICE_CUH

namespace kiln {

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

constexpr float LOG2E = 1.4426950408889634f;  /* log2(e): exp(x) = exp2(x * LOG2E) */
constexpr float LN2 = 0.6931471805599453f;    /* ln(2): ln(x) = log2(x) * LN2 */
/* -infinity (no constexpr form without headers). */
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
constexpr int WARP = 32;

enum dtype_id { F16 = 0, BF16 = 1 };

/* ---- 16-bit conversions ---- */

template <int DT> __device__ __forceinline__ float to_float(u16 x);
template <> __device__ __forceinline__ float to_float<BF16>(u16 x)
{
    return __uint_as_float(((u32)x) << 16);
}
template <> __device__ __forceinline__ float to_float<F16>(u16 x)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}

template <int DT> __device__ __forceinline__ u16 from_float(float f);
template <> __device__ __forceinline__ u16 from_float<BF16>(float f)
{
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
template <> __device__ __forceinline__ u16 from_float<F16>(float f)
{
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

/* Pack two floats into one 32-bit register of two 16-bit values, lo in the low half. */
template <int DT> __device__ __forceinline__ u32 pack2(float lo, float hi);
template <> __device__ __forceinline__ u32 pack2<BF16>(float lo, float hi)
{
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <> __device__ __forceinline__ u32 pack2<F16>(float lo, float hi)
{
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* Unpack the two 16-bit halves of a 32-bit word. */
template <int DT> __device__ __forceinline__ void unpack2(u32 w, float &lo, float &hi)
{
    lo = to_float<DT>((u16)(w & 0xffffu));
    hi = to_float<DT>((u16)(w >> 16));
}

/* ---- fast math ---- */

__device__ __forceinline__ float exp2_fast(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float log2_fast(float x)
{
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float tanh_fast(float x)
{
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float max_f(float a, float b) { return a > b ? a : b; }

/* ---- memory ---- */

__device__ __forceinline__ u32 smem_addr(const void *p)
{
    return (u32)__cvta_generic_to_shared(p);
}

/* 16-byte global → shared copy, bypassing L1; src_bytes 0 fills the 16 bytes with zeros. */
__device__ __forceinline__ void cp_async16(u32 dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Four 8x8 16-bit matrices from shared memory; lane l gives the row address of matrix l/8. */
__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32 &r0, u32 &r1, u32 &r2, u32 &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 addr, u32 &r0, u32 &r1, u32 &r2, u32 &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* d += a(16x16, row) * b(16x8, col), f32 accumulate. */
template <int DT>
__device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1);
template <>
__device__ __forceinline__ void mma16816<BF16>(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<F16>(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ---- the logits transform ----
 * x = sm_scale * q.k, then the variant's builtin transform, in natural units. LOGITS: 0 none,
 * 1 soft-cap, 2 ALiBi. rel = j - (i + L_KV - L_Q) is the key's distance from the query's
 * diagonal (<= 0 for visible causal keys). */
template <int LOGITS>
__device__ __forceinline__ float logit_nat(float qk, float sm_scale, float cap, float slope, int rel)
{
    float x = qk * sm_scale;
    if (LOGITS == 1) x = cap * tanh_fast(x * (1.0f / cap));
    if (LOGITS == 2) x += slope * (float)rel;
    return x;
}

/* The full logit in log2 units (times LOG2E, for exp2): the builtin transform, then the
 * variant's logits snippet when it has one (Cfg::logits_expr, generated from the user's
 * validated expression). i, j: query row and key index; h, hk: query and KV head. */
template <class Cfg, class P>
__device__ __forceinline__ float logit_full(float qk, const P &p, float slope, int i, int j, int h,
                                            int hk)
{
    float x = logit_nat<Cfg::LOGITS>(qk, p.sm_scale, p.softcap, slope, j - (i + p.kv_len - p.qo_len));
    if constexpr (Cfg::HAS_LOGITS_EXPR) x = Cfg::logits_expr(x, 0, i, j, h, hk, p.qo_len, p.kv_len, p);
    return x * LOG2E;
}

/* The run-time mask data (Cfg::MASK_DATA 1 bitmask, 2 bsr) at query row i, key j. */
template <class Cfg, class P> __device__ __forceinline__ bool mask_data(const P &p, int i, int j)
{
    if constexpr (Cfg::MASK_DATA == 1) {
        const i64 bit = (i64)i * p.kv_len + j;
        return (reinterpret_cast<const unsigned char *>(p.mask_bits)[bit >> 3] >> (bit & 7)) & 1;
    } else if constexpr (Cfg::MASK_DATA == 2) {
        const int *indptr = reinterpret_cast<const int *>(p.bsr_indptr);
        const int *cols = reinterpret_cast<const int *>(p.bsr_indices);
        const int rb = i / p.bsr_r, cb = j / p.bsr_c;
        int lo = indptr[rb], hi = indptr[rb + 1]; /* binary search in a sorted row */
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            const int c = cols[mid];
            if (c == cb) return true;
            if (c < cb) lo = mid + 1;
            else hi = mid;
        }
        return false;
    }
    return true;
}

/* The variant's mask snippet (true: visible); always true without one. */
template <class Cfg, class P>
__device__ __forceinline__ bool mask_user(const P &p, int i, int j, int h, int hk)
{
    if constexpr (Cfg::HAS_MASK_EXPR) return Cfg::mask_expr(0, i, j, h, hk, p.qo_len, p.kv_len, p);
    return true;
}

} /* namespace kiln */

#endif /* KILN_DEVICE_CUH */
