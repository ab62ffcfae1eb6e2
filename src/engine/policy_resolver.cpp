#include "engine/policy_resolver.h"

#include "policy/kv_budget.h"
#include "policy/policy_registry.h"

namespace origami {

Status check_head_budgets(const KVPolicy& policy, const CompressionSupport& support) {
  if (policy.budget_split() != BudgetSplit::kCalibrated || support.calibrated_head_budgets) return Status::ok();
  return invalid_argument("KV policy " + policy.name() +
                          " needs calibrated per-head budgets: start the engine with --kv-head-budgets FILE (written "
                          "by `origami calibrate`), or give the request kv_head_budgets");
}

Status check_joint_selection(const KVPolicy& policy, const CompressionSupport& support) {
  const ScoreRecipe& recipe = policy.score_recipe();
  if (!policy.needs().joint_selection || support.joint_selection) return Status::ok();
  return invalid_argument("KV policy " + policy.name() + " with allocation " + keep_allocation_name(recipe.allocation) +
                          " lets the backend choose each head's kept count (one selection over the request's heads), "
                          "which the " + support.backend + " backend does not run (the CPU and CUDA backends do" +
                          (policy.name() == "adakv" ? std::string("") : std::string("; allocation=uniform runs there")) + ")");
}

Expected<RequestCompression> resolve_request_compression(const EngineConfig& config, const CompressionSupport& support,
                                                         const RequestOptions& options) {
  if (options.kv_budget < 0)
    return invalid_argument("kv_budget must be >= 0 tokens (0 = the default), got " + std::to_string(options.kv_budget));
  const bool own_policy = !options.kv_policy.empty();
  const std::string& name = own_policy ? options.kv_policy : config.kv_policy;
  PolicyOptionMap policy_options = own_policy ? PolicyOptionMap{} : config.kv_policy_options;
  for (const auto& [k, v] : options.kv_policy_options) policy_options[k] = v;
  Expected<std::shared_ptr<const KVPolicy>> policy = PolicyRegistry::builtin().create(name, policy_options);
  if (!policy) return policy.status();

  RequestCompression c;
  c.policy = *policy;
  c.trigger = c.policy->trigger();
  if (!c.policy->compresses()) {
    if (options.kv_budget > 0)  // would be silently ignored
      return invalid_argument("kv_budget " + std::to_string(options.kv_budget) + " is given, but KV policy " + name +
                              " does not compress (it keeps every token); name a compressing kv_policy");
    return c;
  }

  if (!c.policy->takes_budget() && options.kv_budget > 0)  // would be silently ignored
    return invalid_argument("kv_budget " + std::to_string(options.kv_budget) + " is given, but KV policy " + name +
                            " takes no budget (its compressions keep a ratio of a sliding window; see its options)");
  c.budget = resolve_kv_budget(options.kv_budget, config.kv_budget, c.policy->default_budget());
  ORIGAMI_RETURN_IF_ERROR(c.policy->check_budget(c.budget, support.block_size));
  c.group_ratios = support.group_ratios;
  if (c.policy->budget_split() == BudgetSplit::kCalibrated) {
    ORIGAMI_RETURN_IF_ERROR(check_head_budgets(*c.policy, support));
    // Its budget is the average over every (layer, KV head): the group keeping most keeps more.
    const int average = c.budget;
    c.budget = lead_budget_for_average(average, c.group_ratios);
    if (c.budget > kMaxKvBudget)
      return invalid_argument("KV budget " + std::to_string(average) +
                              " on average needs " + std::to_string(c.budget) + " tokens for the head group keeping most, "
                              "above the limit of " + std::to_string(kMaxKvBudget) + "; lower the budget");
  }
  if (!support.available)
    return invalid_argument("KV policy " + name + " compresses the KV cache, which this engine cannot do on the " +
                            support.backend + " backend" +
                            (support.unavailable_reason.empty() ? "" : ": " + support.unavailable_reason));
  const PolicyNeeds needs = c.policy->needs();
  if (needs.window_queries) {
    if (support.num_query_slots < 1)
      return invalid_argument("KV policy " + name + " needs query slots, but the engine has none");
    if (needs.window > support.max_window)
      return invalid_argument("KV policy " + name + ": window " + std::to_string(needs.window) +
                              " exceeds the engine's query window of " + std::to_string(support.max_window) +
                              " (sized at startup from the default policy)");
  }
  if (needs.global_scores && !support.global_scores)
    return invalid_argument("KV policy " + name + " needs global score pages, which the engine did not allocate");
  if (needs.reconstruction && !support.reconstruction)
    return invalid_argument("KV policy " + name + " scores entries by KVzip's reconstruction pass, which this engine "
                            "does not run (" + support.backend + " backend; it needs the CPU backend and one head group)");
  ORIGAMI_RETURN_IF_ERROR(check_joint_selection(*c.policy, support));
  if (needs.gate_scores && !support.gate_scores)
    return invalid_argument("KV policy " + name + " scores entries with Fast KVzip gates, which this engine has not "
                            "loaded: start it with --kv-gates FILE (`origami train-gates`)");
  c.window = needs.window_queries ? needs.window : 0;
  if (c.trigger == CompressionTrigger::kCacheFull) {
    c.max_blocks = max_blocks_for_budget(c.budget, support.block_size);
    c.num_keep = entries_kept_for_budget(c.budget, support.block_size);
  } else {
    c.num_keep = c.budget;
  }
  c.chunk_threshold = c.policy->prefill_chunk_threshold(c.budget, c.max_blocks, support.block_size);
  return c;
}

}  // namespace origami
