#include "policy/kv_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "policy/kv_budget.h"

namespace origami {

const char* trigger_name(CompressionTrigger trigger) {
  switch (trigger) {
    case CompressionTrigger::kNever: return "never";
    case CompressionTrigger::kCacheFull: return "cache full (N_max blocks)";
    case CompressionTrigger::kPrefillEnd: return "end of prefill, once";
    case CompressionTrigger::kPeriodic: return "every delta steps, up to n requests (sliding window)";
  }
  return "unknown";
}

const char* budget_split_name(BudgetSplit split) {
  switch (split) {
    case BudgetSplit::kUniform: return "uniform";
    case BudgetSplit::kCalibrated: return "calibrated per-head budgets (average = the budget)";
  }
  return "unknown";
}

TriggerDecision KVPolicy::compression_due(const TriggerState& state) const {
  switch (trigger()) {
    case CompressionTrigger::kNever: return {};
    case CompressionTrigger::kCacheFull: return cache_full_due(state);
    case CompressionTrigger::kPrefillEnd: return prefill_end_due(state);
    case CompressionTrigger::kPeriodic: return {};  // the policy's own parameters: it overrides
  }
  return {};
}

int KVPolicy::capture_from(const TriggerState& state) const {
  switch (trigger()) {
    case CompressionTrigger::kNever: return -1;
    case CompressionTrigger::kCacheFull: return cache_full_capture_from(state);
    case CompressionTrigger::kPrefillEnd: return prefill_end_capture_from(state);
    case CompressionTrigger::kPeriodic: return periodic_capture_from(state);
  }
  return -1;
}

bool KVPolicy::prefers_per_head_pages() const {
  if (!compresses()) return false;
  const ScoreRecipe& recipe = score_recipe();
  return runtime_allocation(recipe) && recipe.page_aligned;
}

bool KVPolicy::supports_prefill_chunk_compression() const {
  return options_.values().count(kPrefillChunkCompressionOption) != 0;
}

int KVPolicy::prefill_chunk_threshold(int budget, int max_blocks, int block_size) const {
  if (!supports_prefill_chunk_compression() || !options_.get_bool(kPrefillChunkCompressionOption)) return -1;
  switch (trigger()) {
    case CompressionTrigger::kCacheFull: return static_cast<int>(int64_t{max_blocks} * block_size - 1);
    case CompressionTrigger::kPrefillEnd: {
      // chunk_slack: a chunk keeps budget x (1 + slack) (the prompt's end then keeps the budget).
      const double slack = options_.values().count(kChunkSlackOption) != 0 ? options_.get_float(kChunkSlackOption) : 0.0;
      const double keep = std::ceil(static_cast<double>(budget) * (1.0 + slack) - 1e-9);
      return static_cast<int>(std::min<double>(keep, std::numeric_limits<int>::max() / 4));
    }
    default: return -1;
  }
}

Status KVPolicy::check_budget(int budget, int block_size) const {
  if (!compresses()) return Status::ok();
  const ScoreRecipe& recipe = score_recipe();
  // What a compression keeping `keep` entries always keeps (StreamingLLM's window is its score).
  auto protected_entries_at = [&](int keep) {
    return (recipe.scorer == Scorer::kRecency ? 0 : recipe.protected_tail(keep)) + recipe.num_sinks;
  };
  const std::string where = "policy " + name_ + " with KV budget " + std::to_string(budget);
  if (budget < 1) return invalid_argument(where + ": the budget must be >= 1 token");
  if (budget > kMaxKvBudget)
    return invalid_argument(where + ": the budget must be at most " + std::to_string(kMaxKvBudget) + " tokens");
  if (trigger() == CompressionTrigger::kCacheFull) {
    if (budget < block_size)
      return invalid_argument(where + ": the budget must hold at least one block of " + std::to_string(block_size) +
                              " tokens (N_max = floor(budget / block_size) + 1 >= 2)");
    const int keep = entries_kept_for_budget(budget, block_size);
    const int protected_entries = protected_entries_at(keep);
    if (keep <= protected_entries)
      return invalid_argument(where + ": keeps " + std::to_string(keep) + " entries, not more than the " +
                              std::to_string(protected_entries) + " it always protects (window or recent, + sinks)");
    // The window of the next compression must lie in the block a compression leaves empty, so
    // that its queries are all computed after the previous compression.
    if (needs().window_queries && needs().window > block_size)
      return invalid_argument("policy " + name_ + ": window " + std::to_string(needs().window) +
                              " is larger than the block size " + std::to_string(block_size));
    return Status::ok();
  }
  const int protected_entries = protected_entries_at(budget);
  if (budget <= protected_entries)
    return invalid_argument(where + ": keeps no more than the " + std::to_string(protected_entries) +
                            " entries it always protects (window or recent, + sinks)");
  return Status::ok();
}

std::string KVPolicy::describe() const {
  std::string s = name_;
  if (options_.values().empty()) return s;
  s += "(";
  bool first = true;
  for (const auto& [k, v] : options_.values()) {
    s += (first ? "" : ", ") + k + "=" + v;
    first = false;
  }
  return s + ")";
}

}  // namespace origami
