#pragma once
// Named accumulators of host time, for finding where a step's host time goes on a machine where
// no profiler runs (the GPU machines have no perf): with ORIGAMI_HOST_TIMERS=1 in the environment,
// every ORIGAMI_HOST_TIMER("name") scope adds its wall time to "name", and the process prints one
// line per name (calls, total, per call) to stderr when it exits. Without the variable a scope
// costs one branch on a cached flag. Meant for the engine's own thread: the sums are atomic, but
// scopes that run at once on several threads add up more than the wall time they took.
#include <chrono>
#include <cstdint>

namespace origami {

class HostTimers {
 public:
  static bool enabled() { return enabled_; }
  // The slot of `name` (a string literal: compared by address, then by text), registered once.
  static int slot(const char* name);
  static void add(int slot, int64_t nanoseconds);

 private:
  static const bool enabled_;
};

class ScopedHostTimer {
 public:
  explicit ScopedHostTimer(int slot) : slot_(slot) {
    if (slot_ >= 0) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedHostTimer() { stop(); }
  // Ends the timing before the scope does (a span that stops mid-scope); the destructor then adds
  // nothing more.
  void stop() {
    if (slot_ < 0) return;
    HostTimers::add(slot_, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count());
    slot_ = -1;
  }
  ScopedHostTimer(const ScopedHostTimer&) = delete;
  ScopedHostTimer& operator=(const ScopedHostTimer&) = delete;

 private:
  int slot_;
  std::chrono::steady_clock::time_point start_;
};

#define ORIGAMI_HOST_TIMER_CAT2(a, b) a##b
#define ORIGAMI_HOST_TIMER_CAT(a, b) ORIGAMI_HOST_TIMER_CAT2(a, b)
// A timer `var` over the rest of the enclosing scope under `name` (a string literal), which
// var.stop() may end sooner. The name's slot is looked up once per call site.
#define ORIGAMI_HOST_TIMER_NAMED(var, name)                                                                \
  static const int ORIGAMI_HOST_TIMER_CAT(origami_host_timer_slot_, __LINE__) =                            \
      ::origami::HostTimers::enabled() ? ::origami::HostTimers::slot(name) : -1;                           \
  ::origami::ScopedHostTimer var(ORIGAMI_HOST_TIMER_CAT(origami_host_timer_slot_, __LINE__))
// Times the rest of the enclosing scope under `name`.
#define ORIGAMI_HOST_TIMER(name) ORIGAMI_HOST_TIMER_NAMED(ORIGAMI_HOST_TIMER_CAT(origami_host_timer_, __LINE__), name)

}  // namespace origami
