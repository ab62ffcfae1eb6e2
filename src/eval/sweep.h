#pragma once
// A fidelity sweep: every compression policy at every KV budget, plus the full-KV reference
// that each is compared with. Lists come from the command line as "snapkv,zipage" and
// "256,512,1024".
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace origami::eval {

inline constexpr const char* kFullPolicy = "full";

struct SweepPoint {
  std::string policy;
  int budget = 0;          // KV tokens per request after compression; 0 = the policy's default
  bool reference = false;  // the full-KV run every other point is compared with
};

// Comma-separated policy names ("full,snapkv, zipage"); empty entries and repeats are errors
// that name the entry. Names are checked against the registry by the caller.
Expected<std::vector<std::string>> parse_policy_list(std::string_view text);
// Comma-separated positive token counts ("256,512,1024"); errors name the bad entry.
// Returned in ascending order.
Expected<std::vector<int>> parse_budget_list(std::string_view text);

// The full-KV reference first (run once: full KV has no budget), then every other policy at
// every budget in ascending order; with no budgets, each policy once at its default (0).
std::vector<SweepPoint> make_sweep(const std::vector<std::string>& policies, const std::vector<int>& budgets);

// "full", "zipage@1024", "snapkv@default": for progress bars and tables.
std::string point_label(const SweepPoint& point);

}  // namespace origami::eval
