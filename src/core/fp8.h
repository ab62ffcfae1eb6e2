#pragma once
// FP8 E4M3 (the "fn" variant of OCP FP8, CUDA's __nv_fp8_e4m3, torch.float8_e4m3fn): 1 sign, 4
// exponent (bias 7) and 3 mantissa bits, no infinities, 0x7f / 0xff are NaN, largest finite 448.
// The encoder rounds to nearest even and saturates (CUDA's __NV_SATFINITE), so a host copy of a
// quantized weight or activation is bit-identical to what the CUDA kernels write.
//
// Scaled FP8 (what checkpoints and the GEMMs use): a row x of floats is stored as codes
// encode(x[i] / s) and one fp32 scale s = amax(|x|) / 448, and read back as decode(code) * s.
// The same notion (codes + per-row fp32 scale) serves weights (a row = an output channel) and
// activations (a row = a token), and later the KV cache.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/fp8_e4m3.h"

namespace origami {

inline constexpr uint8_t kFp8E4M3MaxCode = 0x7e;
inline constexpr uint8_t kFp8E4M3NaN = 0x7f;

// kFp8E4M3Max, fp8_e4m3_to_f32 and f32_to_fp8_e4m3 (round to nearest even, saturating to +-448,
// NaN kept) come from core/fp8_e4m3.h, host and device alike, shared with the FP8 KV cache.

// The scale of a row whose largest magnitude is `amax`: amax / 448, so that the row's largest
// element maps to the largest finite code; never zero (an all-zero row keeps zero codes).
inline float fp8_row_scale(float amax) {
  const float s = amax / kFp8E4M3Max;
  return s > 1.17549435e-38f ? s : 1.17549435e-38f;  // FLT_MIN; also catches NaN
}

// Quantizes `rows` rows of `cols` floats (row stride `ld`) per row: codes [rows, cols] and
// scales [rows] (dynamic per-token activations, per-channel weights).
void quantize_rows_fp8(const float* x, size_t rows, size_t cols, size_t ld, uint8_t* codes, float* scales);
// Quantizes with a given per-tensor scale (static activation scales): codes = encode(x / scale).
void quantize_with_scale_fp8(const float* x, size_t count, float scale, uint8_t* codes);
// The round trip of quantize_rows_fp8 in place: each row becomes decode(codes) * scale, the
// values an FP8 GEMM multiplies (CPU emulation of the CUDA path). scale > 0: that static scale
// for every row instead of each row's own.
void fake_quantize_rows_fp8(float* x, size_t rows, size_t cols, size_t ld, float scale = 0.0f);

}  // namespace origami
