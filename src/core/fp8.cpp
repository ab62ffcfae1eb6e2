#include "core/fp8.h"

#include <algorithm>

namespace origami {

void quantize_rows_fp8(const float* x, size_t rows, size_t cols, size_t ld, uint8_t* codes, float* scales) {
  for (size_t r = 0; r < rows; ++r) {
    const float* row = x + r * ld;
    float amax = 0.0f;
    for (size_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(row[c]));
    const float s = fp8_row_scale(amax);
    scales[r] = s;
    // Division (not a reciprocal multiply), as the CUDA kernels do, so both give the same codes.
    for (size_t c = 0; c < cols; ++c) codes[r * cols + c] = f32_to_fp8_e4m3(row[c] / s);
  }
}

void quantize_with_scale_fp8(const float* x, size_t count, float scale, uint8_t* codes) {
  for (size_t i = 0; i < count; ++i) codes[i] = f32_to_fp8_e4m3(x[i] / scale);
}

void fake_quantize_rows_fp8(float* x, size_t rows, size_t cols, size_t ld, float scale) {
  for (size_t r = 0; r < rows; ++r) {
    float* row = x + r * ld;
    float s = scale;
    if (!(s > 0.0f)) {
      float amax = 0.0f;
      for (size_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(row[c]));
      s = fp8_row_scale(amax);
    }
    for (size_t c = 0; c < cols; ++c) row[c] = fp8_e4m3_to_f32(f32_to_fp8_e4m3(row[c] / s)) * s;
  }
}

}  // namespace origami
