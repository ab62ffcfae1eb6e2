#include "core/host_timers.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace origami {
namespace {

constexpr int kMaxSlots = 128;

struct Slot {
  const char* name = nullptr;
  std::atomic<int64_t> nanoseconds{0};
  std::atomic<int64_t> calls{0};
};

struct Registry {
  std::mutex mutex;
  Slot slots[kMaxSlots];
  int size = 0;
  ~Registry() {
    if (size == 0) return;
    std::fprintf(stderr, "host timers (ORIGAMI_HOST_TIMERS): name, calls, total ms, us per call\n");
    for (int i = 0; i < size; ++i) {
      const int64_t calls = slots[i].calls.load(), ns = slots[i].nanoseconds.load();
      std::fprintf(stderr, "  %-40s %10lld %12.1f %10.2f\n", slots[i].name, static_cast<long long>(calls), ns * 1e-6,
                   calls > 0 ? ns * 1e-3 / static_cast<double>(calls) : 0.0);
    }
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

bool read_enabled() {
  const char* v = std::getenv("ORIGAMI_HOST_TIMERS");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

const bool HostTimers::enabled_ = read_enabled();

int HostTimers::slot(const char* name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (int i = 0; i < r.size; ++i)
    if (r.slots[i].name == name || std::strcmp(r.slots[i].name, name) == 0) return i;
  if (r.size == kMaxSlots) return -1;  // full: the scope is not timed
  r.slots[r.size].name = name;
  return r.size++;
}

void HostTimers::add(int slot, int64_t nanoseconds) {
  Slot& s = registry().slots[slot];
  s.nanoseconds.fetch_add(nanoseconds, std::memory_order_relaxed);
  s.calls.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace origami
