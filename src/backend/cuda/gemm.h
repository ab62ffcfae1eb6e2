#pragma once
// Linear layers through cuBLAS: y[m, n] = x[m, k] @ w[n, k]^T, bf16 operands, fp32 accumulation,
// output bf16 or fp32. The handle owns a fixed workspace so that calls can be graph-captured.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace origami::cuda {

class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Binds the handle to `stream` (all later calls run there).
  void set_stream(cudaStream_t stream);
  // x [m, k] bf16, w [n, k] bf16 (HF Linear layout), y [m, n] bf16 or fp32 (y_is_f32).
  void linear(const __nv_bfloat16* x, int m, int k, const __nv_bfloat16* w, int n, void* y, bool y_is_f32);

 private:
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace origami::cuda
