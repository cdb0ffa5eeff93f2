/*
 * device.cuh — the small vocabulary every kiln kernel is written in: 16-bit element types and
 * their conversions, fast exp2 / log2 / tanh, 16-byte async copies (cp.async), ldmatrix, the
 * m16n8k16 tensor-core MMA, fp8 widening and the RoPE rotation. The type ids (F16, BF16,
 * KV_E4M3, ...) come from the contract header, common/params.h.
 *
 * No CUDA header is included: the generated source is self-contained and compiles with
 * NVRTC -minimal. 16-bit values are carried as raw bits (unsigned short / packed unsigned int).
 * Requires sm_80 or newer.
 */
#ifndef KILN_DEVICE_CUH
#define KILN_DEVICE_CUH

#include "common/params.h"

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

/* One FMNMX (a > b ? a : b took a compare and a select). A NaN operand is dropped from the max,
 * but a NaN score still reaches the output through its exp2 term, so a NaN row stays NaN. */
__device__ __forceinline__ float max_f(float a, float b) { return fmaxf(a, b); }

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
/* The same copy of a full 16 bytes: no source-size operand, so no zero-fill form. */
__device__ __forceinline__ void cp_async16_full(u32 dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
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

/* ---- fp8 KV ----
 * Four fp8 values (one 32-bit word, byte 0 first) to floats through f16 bits: e5m2 is the top
 * byte of an f16; e4m3's exponent and mantissa shifted into an f16 give the value times 2^-8
 * (normal and subnormal alike), a factor the host folds into k_scale / v_scale. */

__device__ __forceinline__ void half2_to_f(u32 w, float &lo, float &hi)
{
    unpack2<F16>(w, lo, hi);
}

template <int KVT> __device__ __forceinline__ void fp8x4_halves(u32 w, u32 &h01, u32 &h23)
{
    if (KVT == KV_E5M2) {
        h01 = __byte_perm(w, 0, 0x1404);
        h23 = __byte_perm(w, 0, 0x3424);
    } else {
        const u32 a = __byte_perm(w, 0, 0x4140), c = __byte_perm(w, 0, 0x4342);
        h01 = ((a & 0x007f007fu) << 7) | ((a & 0x00800080u) << 8);
        h23 = ((c & 0x007f007fu) << 7) | ((c & 0x00800080u) << 8);
    }
}

template <int KVT> __device__ __forceinline__ void fp8x4_to_f(u32 w, float *f)
{
    u32 a, c;
    fp8x4_halves<KVT>(w, a, c);
    half2_to_f(a, f[0], f[1]);
    half2_to_f(c, f[2], f[3]);
}

/* Four fp8 values (bytes x0 .. x3 of w) as two f16 pairs for the tensor cores, lo = (x0, x1)
 * and hi = (x2, x3), with no float round trip. sm_89 and newer convert in hardware (one cvt a
 * pair) and give the values exactly; older parts take fp8x4_halves' bits (e4m3 times 2^-8).
 * F8_PAIR_UNIT is the factor the pairs carry relative to fp8x4_to_f's floats. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define KILN_F8_CVT 1
#else
#define KILN_F8_CVT 0
#endif
template <int KVT> __device__ __forceinline__ void fp8x4_f16(u32 w, u32 &lo, u32 &hi)
{
#if KILN_F8_CVT
    if constexpr (KVT == KV_E4M3)
        asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
            "cvt.rn.f16x2.e4m3x2 %1, h;\n}"
            : "=r"(lo), "=r"(hi)
            : "r"(w));
    else
        asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e5m2x2 %0, l;\n"
            "cvt.rn.f16x2.e5m2x2 %1, h;\n}"
            : "=r"(lo), "=r"(hi)
            : "r"(w));
#else
    fp8x4_halves<KVT>(w, lo, hi);
#endif
}
/* what fp8x4_f16's values are times fp8x4_to_f's (whose e4m3 carries 2^-8, folded on the host) */
template <int KVT> __device__ __forceinline__ constexpr float f8_pair_unit()
{
    return KILN_F8_CVT && KVT == KV_E4M3 ? 256.0f : 1.0f;
}

/* 16 bytes of shared memory at a shared-window address. */
__device__ __forceinline__ uint4 lds128(u32 addr)
{
    uint4 r;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "r"(addr));
    return r;
}
__device__ __forceinline__ void sts128(u32 addr, uint4 v)
{
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
__device__ __forceinline__ void sts64(u32 addr, uint2 v)
{
    asm volatile("st.shared.v2.u32 [%0], {%1,%2};\n" ::"r"(addr), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ uint2 lds64(u32 addr)
{
    uint2 r;
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "r"(addr));
    return r;
}

/* ---- RoPE (llama, non-interleaved: pairs d, d + D/2) ----
 * Rotate (x0, x1) = (x[d], x[d + D/2]) by the angle pos * theta^(-2d/D) / rope_scale. */
__device__ __forceinline__ float rope_freq(int d, int D, float rcp_scale, float log2_theta)
{
    return exp2_fast(-(float)(2 * d) / (float)D * log2_theta) * rcp_scale;
}
/* sin and cos of any float angle: reduced to [-pi, pi] in two steps of 2 pi (hi + lo parts),
 * then the hardware approximations (absolute error about 2^-21 there). */
__device__ __forceinline__ void sincos_reduced(float angle, float &s, float &c)
{
    float k;
    asm("cvt.rni.f32.f32 %0, %1;" : "=f"(k) : "f"(angle * 0.15915494309189535f));
    float r = fmaf(-k, 6.28318548202514648f, angle);
    r = fmaf(-k, -1.7484556e-07f, r);
    asm("sin.approx.f32 %0, %1;" : "=f"(s) : "f"(r));
    asm("cos.approx.f32 %0, %1;" : "=f"(c) : "f"(r));
}
__device__ __forceinline__ void rope_rotate(float &x0, float &x1, float angle)
{
    float s, c;
    sincos_reduced(angle, s, c);
    const float a = x0 * c - x1 * s, b = x1 * c + x0 * s;
    x0 = a;
    x1 = b;
}

} /* namespace kiln */

#endif /* KILN_DEVICE_CUH */
