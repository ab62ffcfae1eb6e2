#include "backend/cuda/cluster_rows.h"

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"

namespace origami::cuda {

int cluster_ctas_per_row(int num_rows, int num_sms) {
  int ctas = 1;
  while (ctas < 8 && static_cast<long long>(num_rows) * ctas * 2 <= num_sms) ctas *= 2;
  return ctas;
}

int current_device_sm_count() {
  constexpr int kMaxDevices = 64;
  static int counts[kMaxDevices] = {};
  int device = 0;
  ORIGAMI_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) {
    int n = 0;
    ORIGAMI_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n;
  }
  if (counts[device] == 0)
    ORIGAMI_CUDA_CHECK(cudaDeviceGetAttribute(&counts[device], cudaDevAttrMultiProcessorCount, device));
  return counts[device];
}

}  // namespace origami::cuda
