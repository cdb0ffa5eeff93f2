/*
 * check_codec.c — the element codecs and random numbers of the check library: splitmix64 and
 * uniform floats, float to bf16 / f16 (round to nearest even) and back, fp8 e4m3 / e5m2 encode
 * (saturating) and decode, and the llama RoPE rotation the references apply. See check.h.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check_internal.h"

/* ---- random numbers and 16-bit rounding ------------------------------------------------ */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(uint64_t *s) /* in [-1, 1) */
{
    return (float)((double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
    return (uint16_t)half;
}

static uint16_t to_bits(kiln_dtype t, float f)
{
    return t == KILN_DTYPE_BF16 ? f32_to_bf16(f) : f32_to_f16(f);
}

uint16_t kiln_check_to_bits(kiln_dtype t, float f) { return to_bits(t, f); }
double kiln_check_from_bits(kiln_dtype t, uint16_t h) { return kiln__check_bits(t, h); }
uint64_t kiln_check_rng(uint64_t *s) { return rng_next(s); }
float kiln_check_uniform(uint64_t *s) { return rng_uniform(s); }

/* ---- fp8 ------------------------------------------------------------------------------------ */

typedef struct fp8_fmt {
    int mbits, bias;
    double max; /* largest finite value */
} fp8_fmt;

static fp8_fmt fp8_of(kiln_dtype t)
{
    return t == KILN_DTYPE_E5M2 ? (fp8_fmt){2, 15, 57344.0} : (fp8_fmt){3, 7, 448.0};
}

uint8_t kiln_check_fp8_encode(kiln_dtype t, double x)
{
    const fp8_fmt f = fp8_of(t);
    if (isnan(x)) return 0x7f; /* a NaN in both formats */
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs(x);
    if (a == 0) return sign;
    /* the quantum of a's binade, or of the subnormals below the smallest normal */
    int k;
    frexp(a, &k);
    int e = k - 1;
    if (e < 1 - f.bias) e = 1 - f.bias;
    const double quantum = ldexp(1.0, e - f.mbits);
    double r = nearbyint(a / quantum) * quantum; /* ties to even (default rounding mode) */
    if (r > f.max) r = f.max;
    if (r < ldexp(1.0, 1 - f.bias)) /* subnormal (or zero) */
        return (uint8_t)(sign | (int)(r / ldexp(1.0, 1 - f.bias - f.mbits)));
    frexp(r, &k);
    e = k - 1;
    const int man = (int)((r / ldexp(1.0, e) - 1.0) * (1 << f.mbits));
    return (uint8_t)(sign | ((e + f.bias) << f.mbits) | man);
}

double kiln_check_fp8_decode(kiln_dtype t, uint8_t b)
{
    const fp8_fmt f = fp8_of(t);
    const int ebits = 7 - f.mbits, exp = (b >> f.mbits) & ((1 << ebits) - 1),
              man = b & ((1 << f.mbits) - 1);
    const double sign = b & 0x80 ? -1.0 : 1.0;
    if (t == KILN_DTYPE_E4M3 && exp == 15 && man == 7) return NAN;
    if (t == KILN_DTYPE_E5M2 && exp == 31) return man ? NAN : sign * INFINITY;
    if (exp == 0) return sign * ldexp((double)man, 1 - f.bias - f.mbits);
    return sign * ldexp(1.0 + (double)man / (1 << f.mbits), exp - f.bias);
}

double kiln_check_decode(kiln_dtype t, uint16_t code)
{
    if (t == KILN_DTYPE_E4M3 || t == KILN_DTYPE_E5M2)
        return kiln_check_fp8_decode(t, (uint8_t)code);
    return kiln__check_bits(t, code);
}

void kiln_check_rope(double *x, int D, double pos, double scale, double theta)
{
    const int half = D / 2;
    if (scale == 0) scale = 1;
    if (theta == 0) theta = 1e4;
    for (int d = 0; d < half; d++) {
        const double angle = pos / scale * pow(theta, -2.0 * d / D);
        const double c = cos(angle), s = sin(angle), a = x[d], b = x[d + half];
        x[d] = a * c - b * s;
        x[d + half] = b * c + a * s;
    }
}
