#pragma once
// FP8 E4M3 ("e4m3fn", as in OCP FP8 and torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7) and
// 3 mantissa bits; no infinities, 0x7f / 0xff are NaN, the largest finite value is 448 and the
// smallest subnormal 2^-9. Header-only and usable on the host and in CUDA device code, so the CPU
// backend's emulation and the CUDA kernels round through the same bits.
//
// Encoding rounds to nearest, ties to even, and saturates: every finite value beyond ±448 and
// ±infinity become ±448 (what vLLM's and torch's saturating casts do; an FP8 KV cache must never
// turn an outlier into NaN).
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ORIGAMI_HD __host__ __device__
#else
#define ORIGAMI_HD
#endif

namespace origami {

inline constexpr float kFp8E4M3Max = 448.0f;

ORIGAMI_HD inline uint32_t fp8_float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

ORIGAMI_HD inline float fp8_bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

ORIGAMI_HD inline float fp8_e4m3_to_f32(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exp = (code >> 3) & 0xfu, mant = code & 0x7u;
  if (exp == 0xfu && mant == 0x7u) return fp8_bits_float(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {
    // Subnormal (or zero): mant * 2^-9, exact in fp32.
    const float v = static_cast<float>(mant) * (1.0f / 512.0f);
    return fp8_bits_float(fp8_float_bits(v) | sign);
  }
  return fp8_bits_float(sign | ((exp - 7u + 127u) << 23) | (mant << 20));
}

ORIGAMI_HD inline uint8_t f32_to_fp8_e4m3(float f) {
  const uint32_t u = fp8_float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN stays NaN
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (and inf): saturate
  if (a < 0x3c800000u) {
    // Below the smallest normal (2^-6): a multiple of 2^-9. a * 512 is exact (a power of two),
    // and rounding the 23-bit mantissa of that product to an integer by hand keeps ties to even
    // without depending on the FPU's rounding mode. A result of 8 is the smallest normal, whose
    // code is 0x08 as well.
    const float scaled = fp8_bits_float(a) * 512.0f;  // in [0, 8)
    const uint32_t s = fp8_float_bits(scaled);
    const int e = static_cast<int>(s >> 23) - 127;  // < 3
    if (e < -1) return sign;                        // < 0.5 rounds to 0
    const uint32_t m = (s & 0x7fffffu) | 0x800000u; // value = m * 2^(e - 23)
    const int shift = 23 - e;                       // 21..24
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint8_t>(sign | r);
  }
  // Normal: round the mantissa to 3 bits, ties to even (a carry bumps the exponent, which stays
  // below 448's since a < 448).
  const uint32_t rounded = (a + 0x7ffffu + ((a >> 20) & 1u)) & ~0xfffffu;
  const uint32_t exp = (rounded >> 23) - 127u + 7u, mant = (rounded >> 20) & 0x7u;
  return static_cast<uint8_t>(sign | (exp << 3) | mant);
}

}  // namespace origami
