#include "backend/cuda/programmatic_launch.h"

#include <atomic>
#include <cstdlib>

namespace origami::cuda {
namespace {

std::atomic<bool>& enabled() {
  static std::atomic<bool> on = [] {
    const char* v = std::getenv("ORIGAMI_PDL");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

}  // namespace

bool programmatic_launch_enabled() { return enabled().load(std::memory_order_relaxed); }
void set_programmatic_launch(bool on) { enabled().store(on, std::memory_order_relaxed); }

}  // namespace origami::cuda
