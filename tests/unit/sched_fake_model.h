#pragma once
// The fake model the scheduler tests drive steps with: what it "samples" for a request, and the
// value it "writes" into a KV slot. The value identifies a token's whole prefix, so a test can
// check that the KV a request reads (its own, or served by the prefix cache) is its own prefix.
#include <cstdint>

#include "sched/request.h"

namespace origami::testing {

inline int32_t fake_sampled_token(const Request& r) {
  return static_cast<int32_t>(5000 + (r.id * 31 + r.output_token_ids.size() * 7) % 97);
}

// Identifies tokens [0, pos] of the request: equal values mean equal prefixes.
inline uint64_t fake_prefix_value(const Request& r, int pos) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i <= pos; ++i) h = (h ^ static_cast<uint32_t>(r.token_at(i))) * 1099511628211ull;
  return h | 1;  // never 0, the value of an unwritten slot
}

}  // namespace origami::testing
