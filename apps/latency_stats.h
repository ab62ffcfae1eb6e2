#pragma once
// Mean and nearest-rank percentiles of latency samples, for the benchmark reports.
#include <algorithm>
#include <vector>

namespace origami::cli {

inline double mean_of(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double s = 0;
  for (double x : v) s += x;
  return s / v.size();
}

// p in [0, 100]; 50 is the median.
inline double percentile_of(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace origami::cli
