#pragma once
// Producers of the FP8 projections' inputs with the per-token activation quantization fused in:
// the residual add + RMSNorm before q|k|v and gate|up, and the SiLU-and-multiply before down,
// write E4M3 codes and one fp32 scale per row themselves, instead of a bf16 row that
// launch_quantize_rows_fp8 then reads twice (a launch and a full read per projection saved, and
// for the norm the bf16 write). Bit for bit what the unfused pair writes: launch_add_rmsnorm /
// launch_silu_and_mul, then launch_quantize_rows_fp8 over their bf16 output (residual, codes and
// scales alike): the bf16 row is computed with the same arithmetic (elementwise_math.cuh), then
// quantized with the same (fp8_quantize.cuh). Plain launches on `stream` (graph-capturable).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace origami::cuda {

// Where a fused producer puts its quantized rows.
struct Fp8RowsOut {
  uint8_t* codes = nullptr;  // [n, cols] E4M3 (8-byte aligned)
  float* scales = nullptr;   // [n] each row's scale
  // Device scalar: every row's scale (a checkpoint's static input scale, LinearWeights::input_scale);
  // null: each row's own, from its largest |value| (fp8_row_scale).
  const float* static_scale = nullptr;
};

// launch_add_rmsnorm (residual += delta, then rmsnorm(residual) * weight rounded to bf16), the
// normed rows quantized into q. `out` (bf16 [n, hidden]) also gets the normed rows when not null
// (a caller that reads them besides the FP8 GEMM); null skips that write. Takes the kernel
// launch_add_rmsnorm takes for 16-byte aligned buffers (their sums of squares differ in order).
void launch_add_rmsnorm_quantize_fp8(float* residual, const __nv_bfloat16* delta, const __nv_bfloat16* weight,
                                     float eps, int n, int hidden, const Fp8RowsOut& q, __nv_bfloat16* out,
                                     cudaStream_t stream);

// launch_silu_and_mul (gate_up [n, 2 * inter] -> silu(gate) * up rounded to bf16), quantized into
// q ([n, inter]) with no bf16 row written. One block per row holds the row in registers between
// its amax and its codes (inter % 8 == 0, aligned, up to 32768); any other size takes a kernel
// that computes each value twice instead.
void launch_silu_and_mul_quantize_fp8(const __nv_bfloat16* gate_up, int n, int inter, const Fp8RowsOut& q,
                                      cudaStream_t stream);

}  // namespace origami::cuda
