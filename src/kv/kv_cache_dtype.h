#pragma once
// The element type of the paged KV cache (--kv-cache-dtype) and the FP8 quantization of one KV
// entry, shared by the CPU backend's emulation and the CUDA kernels (header-only, host+device).
//
// FP8 entries are E4M3 codes with a dynamic scale per (token, KV head): each head vector of K
// (and of V) is scaled by its own amax, scale = amax / 448, code_i = e4m3(x_i / scale), and reads
// dequantize e4m3_to_f32(code_i) * scale in fp32. The scale is stored beside the codes (4 bytes
// per head vector), so compaction moves it with its entry and no calibration is needed
// (docs/kernels.md "FP8 KV cache" says why this granularity).
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/fp8_e4m3.h"

namespace origami {

enum class KVCacheDType {
  kAuto,  // the model's dtype: bf16 on CUDA, fp32 on the CPU
  kBF16,  // bf16 (the CPU rounds its fp32 entries through bf16)
  kFP8,   // E4M3 codes + a per-(token, KV head) fp32 scale (the CPU emulates the rounding)
};

inline const char* kv_cache_dtype_name(KVCacheDType t) {
  switch (t) {
    case KVCacheDType::kAuto: return "auto";
    case KVCacheDType::kBF16: return "bf16";
    case KVCacheDType::kFP8: return "fp8";
  }
  return "?";
}

// Accepts auto, bf16, fp8 (and the aliases bfloat16, fp8_e4m3).
inline bool parse_kv_cache_dtype(std::string_view name, KVCacheDType* out) {
  if (name == "auto") *out = KVCacheDType::kAuto;
  else if (name == "bf16" || name == "bfloat16") *out = KVCacheDType::kBF16;
  else if (name == "fp8" || name == "fp8_e4m3") *out = KVCacheDType::kFP8;
  else return false;
  return true;
}

// Bytes of the scale stored with each FP8 head vector (K and V each have one).
inline constexpr size_t kKVFp8ScaleBytes = sizeof(float);

// The scale of a head vector whose largest magnitude is `amax`: amax maps onto E4M3's largest
// finite value. An all-zero vector gets scale 1 (its codes are all zero either way). IEEE
// division on both sides (nvcc's default -prec-div=true) keeps CPU and CUDA scales identical.
ORIGAMI_HD inline float kv_fp8_scale(float amax) { return amax > 0.0f ? amax / kFp8E4M3Max : 1.0f; }
ORIGAMI_HD inline uint8_t kv_fp8_quantize(float x, float scale) { return f32_to_fp8_e4m3(x / scale); }
ORIGAMI_HD inline float kv_fp8_dequantize(uint8_t code, float scale) { return fp8_e4m3_to_f32(code) * scale; }

// The scale an FP8 cache stores with one head vector (its amax / 448).
inline float head_vector_fp8_scale(const float* v, int head_dim) {
  float amax = 0.0f;
  for (int i = 0; i < head_dim; ++i) amax = std::fmax(amax, std::fabs(v[i]));
  return kv_fp8_scale(amax);
}

// One head vector as an FP8 cache stores it: its codes into `codes`, its scale returned (what
// the CUDA write kernel stores; host references use it).
inline float quantize_head_vector_fp8(const float* v, int head_dim, uint8_t* codes) {
  const float scale = head_vector_fp8_scale(v, head_dim);
  for (int i = 0; i < head_dim; ++i) codes[i] = kv_fp8_quantize(v[i], scale);
  return scale;
}

// The CPU backend's emulation: replaces one head vector by what an FP8 cache would read back
// (quantize with its own scale, dequantize), bit for bit what the CUDA kernels compute.
inline void round_head_vector_fp8(float* v, int head_dim) {
  const float scale = head_vector_fp8_scale(v, head_dim);
  for (int i = 0; i < head_dim; ++i) v[i] = kv_fp8_dequantize(kv_fp8_quantize(v[i], scale), scale);
}

}  // namespace origami
