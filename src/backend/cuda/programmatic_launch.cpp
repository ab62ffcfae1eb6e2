#include "backend/cuda/programmatic_launch.h"

#include <atomic>
#include <cstdlib>

#include <cuda_runtime.h>

namespace origami::cuda {
namespace {

std::atomic<bool>& enabled() {
  // On by default where the hardware has it (compute capability 9.0 and later: Hopper's
  // griddepcontrol); ORIGAMI_PDL=0 turns it off, e.g. to measure what it gains.
  static std::atomic<bool> on = [] {
    const char* v = std::getenv("ORIGAMI_PDL");
    if (v != nullptr && v[0] == '0') return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();  // no device: nothing will be launched
      return false;
    }
    return major >= 9;
  }();
  return on;
}

}  // namespace

bool programmatic_launch_enabled() { return enabled().load(std::memory_order_relaxed); }
void set_programmatic_launch(bool on) { enabled().store(on, std::memory_order_relaxed); }

}  // namespace origami::cuda
