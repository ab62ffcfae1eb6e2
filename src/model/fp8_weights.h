#pragma once
// FP8 Linear weights as the backends take them, whatever the checkpoint held: E4M3 codes in HF
// layout [out_features, in_features] with one fp32 scale per output channel (row). A bf16 / f16 /
// f32 weight is quantized here per channel (scale = amax(row) / 448, --quantization fp8); an FP8
// checkpoint's codes are taken as they are, a per-tensor scale repeated for every row. The CPU
// backend dequantizes the result and the CUDA backend uploads it, so both compute with the same
// weights bit for bit.
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/weights.h"

namespace origami {

struct Fp8Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;  // [rows, cols]
  std::vector<float> scales;   // [rows]
  float input_scale = 0.0f;    // static per-tensor activation scale; 0: dynamic per token

  // decode(codes[r, c]) * scales[r], [rows, cols].
  std::vector<float> dequantize() const;
};

// `weight` is 2-D; `scales` are the checkpoint's when `weight` is F8_E4M3 (ignored otherwise).
Expected<Fp8Matrix> fp8_matrix(const TensorView& weight, const Fp8Scales& scales);

// Stacks projections that share an input into one matrix (q|k|v, gate|up) row-wise; they must
// have the same column count. The stack's static input scale is the largest of its parts', as the
// GEMM reads one activation tensor (0 when any part is dynamic).
Fp8Matrix stack_fp8_rows(const std::vector<const Fp8Matrix*>& parts);

// Tensor-parallel shards: rows [begin, begin + count) with their scales (column-parallel q/k/v,
// gate/up), or columns [begin, begin + count) with every row's scale unchanged (row-parallel o,
// down: a per-channel scale belongs to the output row, which each rank keeps whole).
Fp8Matrix fp8_rows(const Fp8Matrix& m, int64_t begin, int64_t count);
Fp8Matrix fp8_cols(const Fp8Matrix& m, int64_t begin, int64_t count);

}  // namespace origami
