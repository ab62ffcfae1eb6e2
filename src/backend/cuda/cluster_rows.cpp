#include "backend/cuda/cluster_rows.h"

#include <cuda_runtime.h>

#include <atomic>

#include "backend/cuda/cuda_check.h"

namespace origami::cuda {

int cluster_ctas_per_row(int num_rows, int num_sms) {
  int ctas = 1;
  while (ctas < 8 && static_cast<long long>(num_rows) * ctas * 2 <= num_sms) ctas *= 2;
  return ctas;
}

int current_device_sm_count() {
  // Atomics: tensor parallelism's rank threads ask at once (each for its own device).
  constexpr int kMaxDevices = 64;
  static std::atomic<int> counts[kMaxDevices] = {};
  int device = 0;
  ORIGAMI_CUDA_CHECK(cudaGetDevice(&device));
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    const int known = counts[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int n = 0;
  ORIGAMI_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  if (cached) counts[device].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace origami::cuda
