#pragma once
// One Linear layer's weight on the device, whatever its storage: the CUDA backend's projections
// dispatch on it (bf16 cuBLAS GEMM or FP8 cuBLASLt GEMM), and tensor parallelism shards it the
// same way in either dtype (column-parallel: rows of W and of its per-channel scales; row-parallel:
// columns of W, scales unchanged). The FP8 KV cache will reuse the codes + fp32 scale notion.
#include <cuda_bf16.h>

#include <cstdint>

#include "core/dtype.h"

namespace origami::cuda {

struct LinearWeights {
  const void* data = nullptr;           // [n, k] HF layout (K-major): bf16 or E4M3 codes
  DType dtype = DType::kBF16;           // kBF16 or kF8E4M3
  const float* scales = nullptr;        // FP8: [n], one per output channel
  const float* input_scale = nullptr;   // FP8: a device scalar (static activation scale), or null: per token

  bool fp8() const { return dtype == DType::kF8E4M3; }
  const __nv_bfloat16* bf16() const { return static_cast<const __nv_bfloat16*>(data); }
  const uint8_t* codes() const { return static_cast<const uint8_t*>(data); }
};

}  // namespace origami::cuda
