#pragma once
// A kernel's dynamic shared-memory limit raised above the 48 KiB default, once per device.
// cudaFuncSetAttribute applies to the calling thread's current device only, and tensor
// parallelism launches the same kernels on several GPUs from one process (a once-per-process flag
// left every GPU but the first at the default, and the launch failed there with "invalid
// argument"). One object per kernel instantiation, a function-local static beside its launcher:
//   static DynamicSmemLimit limit;
//   if (cudaError_t err = limit.ensure(my_kernel<D>, kBytes); err != cudaSuccess) return err;
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstddef>

namespace origami::cuda {

class DynamicSmemLimit {
 public:
  static constexpr int kMaxDevices = 64;

  template <typename Kernel>
  cudaError_t ensure(Kernel* kernel, size_t bytes) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
    if (raised_[device].load(std::memory_order_acquire)) return cudaSuccess;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (err == cudaSuccess) raised_[device].store(true, std::memory_order_release);
    return err;
  }

 private:
  std::array<std::atomic<bool>, kMaxDevices> raised_{};
};

}  // namespace origami::cuda
