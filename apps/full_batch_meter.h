#pragma once
// A bench run's rate while it is full: output tokens per second over the steps that ran at least
// 95% of the most requests any step ran. With equal lengths a max-load run is a series of waves,
// and its last wave can decode alone at a fraction of the batch for a whole output length: the
// overall rate mixes the two, and a projection to other request counts needs the full batch's
// rate (docs/benchmarks.md: one such projection, made from an average step, was wrong).
#include <cmath>
#include <cstdint>
#include <map>

namespace origami {

class FullBatchMeter {
 public:
  // Between steps: the time, the output tokens generated so far, and the requests running now
  // (after the step just made: the interval since the last sample is that step's).
  void sample(double now, int64_t generated, int running) {
    if (has_last_) {
      Interval& b = by_running_[running];
      b.seconds += now - last_time_;
      b.tokens += generated - last_generated_;
      ++b.steps;
    }
    has_last_ = true;
    last_time_ = now;
    last_generated_ = generated;
  }

  struct Summary {
    int peak = 0;         // the most requests running after any step
    int min_running = 0;  // the steps counted ran at least this many
    int64_t steps = 0;
    double seconds = 0.0;
    int64_t tokens = 0;
    double tokens_per_second() const { return seconds > 0.0 ? static_cast<double>(tokens) / seconds : 0.0; }
  };
  // Empty (no steps) when no step left a request running (every request finished in the step
  // that admitted it, e.g. one output token each): there was no batch to be full.
  Summary summary(double fraction = 0.95) const {
    Summary s;
    if (by_running_.empty() || by_running_.rbegin()->first == 0) return s;
    s.peak = by_running_.rbegin()->first;
    s.min_running = static_cast<int>(std::ceil(fraction * s.peak));
    for (auto it = by_running_.lower_bound(s.min_running); it != by_running_.end(); ++it) {
      s.steps += it->second.steps;
      s.seconds += it->second.seconds;
      s.tokens += it->second.tokens;
    }
    return s;
  }

 private:
  struct Interval {
    double seconds = 0.0;
    int64_t tokens = 0;
    int64_t steps = 0;
  };
  std::map<int, Interval> by_running_;  // by the requests running after the step
  bool has_last_ = false;
  double last_time_ = 0.0;
  int64_t last_generated_ = 0;
};

}  // namespace origami
