#pragma once
// Element types of weights and caches, and bit-exact conversions between them.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace origami {

// kF8E4M3: FP8 codes (core/fp8.h); their values need the scales stored beside them.
enum class DType { kF32, kBF16, kF16, kF8E4M3 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// Parses safetensors ("F32", "BF16", "F16", "F8_E4M3") and HF config ("float32", "bfloat16", "float16",
// "float8_e4m3fn") names.
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float f);

// Converts `count` elements of `dtype` at `src` to fp32 (FP8: the codes' values, unscaled).
void convert_to_f32(const void* src, DType dtype, size_t count, float* dst);

}  // namespace origami
