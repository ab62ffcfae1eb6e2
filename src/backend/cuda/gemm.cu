#include "backend/cuda/gemm.h"

#include "backend/cuda/cuda_check.h"

namespace origami::cuda {

Gemm::Gemm() {
  ORIGAMI_CUBLAS_CHECK(cublasCreate(&handle_));
  // A workspace set once keeps cuBLAS from allocating inside graph capture.
  workspace_bytes_ = 32u << 20;
  ORIGAMI_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  ORIGAMI_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, workspace_bytes_));
  ORIGAMI_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
}

Gemm::~Gemm() {
  if (handle_ != nullptr) cublasDestroy(handle_);
  if (workspace_ != nullptr) cudaFree(workspace_);
}

void Gemm::set_stream(cudaStream_t stream) {
  ORIGAMI_CUBLAS_CHECK(cublasSetStream(handle_, stream));
  ORIGAMI_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, workspace_bytes_));
}

void Gemm::linear(const __nv_bfloat16* x, int m, int k, const __nv_bfloat16* w, int n, void* y, bool y_is_f32) {
  if (m == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: y^T [n, m] = w [k, n]^T * x^T [k, m].
  ORIGAMI_CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k, x,
                                    CUDA_R_16BF, k, &beta, y, y_is_f32 ? CUDA_R_32F : CUDA_R_16BF, n,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace origami::cuda
