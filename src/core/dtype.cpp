#include "core/dtype.h"

#include <cmath>

#include "core/fp8.h"

namespace origami {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kF8E4M3: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF8E4M3: return "F8_E4M3";
  }
  return "?";
}

bool parse_dtype(std::string_view name, DType* out) {
  if (name == "F32" || name == "float32" || name == "float") { *out = DType::kF32; return true; }
  if (name == "BF16" || name == "bfloat16") { *out = DType::kBF16; return true; }
  if (name == "F16" || name == "float16" || name == "half") { *out = DType::kF16; return true; }
  if (name == "F8_E4M3" || name == "float8_e4m3fn") { *out = DType::kF8E4M3; return true; }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) { mant <<= 1; --exp; }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00;              // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00;             // overflow -> inf
  if (abs < 0x38800000u) {                                  // subnormal or zero
    if (abs < 0x33000000u) return sign;
    const uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // in [14, 24]: the mantissa bits that fall off
    uint32_t result;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    result = m >> shift;
    if (rem > mid || (rem == mid && (result & 1))) ++result;
    return sign | static_cast<uint16_t>(result);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}

void convert_to_f32(const void* src, DType dtype, size_t count, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, count * 4);
      return;
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = f16_to_f32(p[i]);
      return;
    }
    case DType::kF8E4M3: {
      const uint8_t* p = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = fp8_e4m3_to_f32(p[i]);
      return;
    }
  }
}

}  // namespace origami
