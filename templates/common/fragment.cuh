/*
 * fragment.cuh — the register vocabulary of the kernels: warp and quad shuffle reductions,
 * and row operations over the m16n8k16 accumulator (mma.sync, f32 C/D) of one m16 row block.
 *
 * Accumulator layout: a 16 x (8 NT) tile is float[NT][4] per lane; element [nt][r * 2 + c]
 * is row acc_row(lane, r) = lane / 4 + 8 r, column acc_col(lane, nt, c) = nt * 8 + (lane % 4)
 * * 2 + c. A row's values are spread over the four lanes of a quad (lanes 4q .. 4q + 3), so a
 * row reduction is a per-lane pass and two quad shuffles. The same layout, packed two values
 * a register, is the A fragment of the next MMA (acc_to_a: S becomes P of P V).
 */
#ifndef KILN_FRAGMENT_CUH
#define KILN_FRAGMENT_CUH

#include "common/device.cuh"

namespace kiln {

/* ---- shuffle reductions ---- */

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = max_f(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* Over the four lanes of a quad (one accumulator row). */
__device__ __forceinline__ float quad_max(float x)
{
    x = max_f(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = max_f(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return x;
}

__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}

/* ---- accumulator tiles ---- */

__device__ __forceinline__ int acc_row(int lane, int r) { return lane / 4 + r * 8; }
__device__ __forceinline__ int acc_col(int lane, int nt, int c) { return nt * 8 + (lane % 4) * 2 + c; }

template <int NT> __device__ __forceinline__ void fill(float (&a)[NT][4], float v)
{
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) a[nt][e] = v;
}

/* The max of row r (0: lane / 4, 1: lane / 4 + 8), reduced over its quad. */
template <int NT> __device__ __forceinline__ float row_max(const float (&a)[NT][4], int r)
{
    float x = neg_inf();
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) x = max_f(x, a[nt][r * 2 + c]);
    return quad_max(x);
}

/* a = exp2(a * c2 - m_scaled) over row r, in place; returns this lane's part of the row sum
 * (quad_sum completes it). */
template <int NT> __device__ __forceinline__ float exp2_row(float (&a)[NT][4], int r, float c2, float m_scaled)
{
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const float x = exp2_fast(fmaf(a[nt][r * 2 + c], c2, -m_scaled));
            a[nt][r * 2 + c] = x;
            sum += x;
        }
    return sum;
}

/* a *= s over row r. */
template <int NT> __device__ __forceinline__ void scale_row(float (&a)[NT][4], int r, float s)
{
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        a[nt][r * 2] *= s;
        a[nt][r * 2 + 1] *= s;
    }
}

/* Columns 16 kk .. 16 kk + 15 of an accumulator as the A fragment (16 x 16, row) of an MMA. */
template <int DT, int NT> __device__ __forceinline__ void acc_to_a(const float (&a)[NT][4], int kk, u32 (&f)[4])
{
    f[0] = pack2<DT>(a[2 * kk][0], a[2 * kk][1]);
    f[1] = pack2<DT>(a[2 * kk][2], a[2 * kk][3]);
    f[2] = pack2<DT>(a[2 * kk + 1][0], a[2 * kk + 1][1]);
    f[3] = pack2<DT>(a[2 * kk + 1][2], a[2 * kk + 1][3]);
}

} /* namespace kiln */

#endif /* KILN_FRAGMENT_CUH */
