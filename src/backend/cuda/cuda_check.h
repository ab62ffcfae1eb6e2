#pragma once
// Error checks for CUDA runtime and cuBLAS calls. A failing call inside the backend is either a
// programming error or a broken device; both abort with the call, file and line (ORIGAMI_CUDA_CHECK)
// or become a Status where the caller can report it (ORIGAMI_CUDA_RETURN_IF_ERROR).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/status.h"

namespace origami::cuda {

[[noreturn]] inline void cuda_fail(const char* what, const char* call, const char* file, int line) {
  std::fprintf(stderr, "origami: CUDA failure %s in %s at %s:%d\n", what, call, file, line);
  std::abort();
}

inline Status cuda_status(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return Status::ok();
  return internal_error(std::string("CUDA error ") + cudaGetErrorString(err) + " in " + call);
}

}  // namespace origami::cuda

#define ORIGAMI_CUDA_CHECK(call)                                                       \
  do {                                                                                 \
    cudaError_t origami_err_ = (call);                                                 \
    if (origami_err_ != cudaSuccess)                                                   \
      ::origami::cuda::cuda_fail(cudaGetErrorString(origami_err_), #call, __FILE__, __LINE__); \
  } while (0)

#define ORIGAMI_CUBLAS_CHECK(call)                                                     \
  do {                                                                                 \
    cublasStatus_t origami_st_ = (call);                                               \
    if (origami_st_ != CUBLAS_STATUS_SUCCESS)                                          \
      ::origami::cuda::cuda_fail(cublasGetStatusString(origami_st_), #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: catches bad launch configurations right where they happen.
#define ORIGAMI_CUDA_CHECK_LAUNCH() ORIGAMI_CUDA_CHECK(cudaGetLastError())

#define ORIGAMI_CUDA_RETURN_IF_ERROR(call)                                             \
  do {                                                                                 \
    cudaError_t origami_err_ = (call);                                                 \
    if (origami_err_ != cudaSuccess) return ::origami::cuda::cuda_status(origami_err_, #call); \
  } while (0)
