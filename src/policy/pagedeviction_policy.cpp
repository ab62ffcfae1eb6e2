// `pagedeviction` (PagedEviction, Chitty-Venkata et al. 2025, "Structured Block-wise KV Cache
// Pruning"): scores every entry by ||v||_2 / ||k||_2 per (layer, KV head) (the `vknorm` base
// scorer; no attention weights, no queries) and evicts in two ways:
//  - Prefill: when the prompt is prefilled (with chunked prefill: after its last chunk), a cache
//    holding more than k = (N_max - 1) * b entries is compacted token-wise to k per (layer, KV
//    head), as every policy compacts. The paper evicts before the prompt is paged; origami pages
//    the chunks as they are computed (so that they attend to one another and can be prefix-cached)
//    and evicts right after the last one, which keeps the same tokens.
//  - Decode: when the request holds N_max full blocks (its budget plus the block just filled), the
//    block with the lowest mean score over its entries, layers and KV heads (never the first,
//    never the last) leaves the page table whole: no entry moves (CompressionKind::kEvictBlock).
//    The block freed becomes the request's block for its next tokens, so it never allocates again.
// Both share the cache-full bound: a request holds at most N_max = floor(budget / b) + 1 blocks
// while decoding, so the scheduler's budget reservation applies unchanged.
//
// Defaults: the paper's score with no sinks (decode already never evicts the first block) and
// `window` = 16 protected newest prompt entries at the prefill eviction, the token-wise twin of
// "never the last block": the newest tokens have not been attended by any later query yet.
#include "core/check.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"

namespace origami {
namespace {

class PagedEvictionPolicy : public RecipePolicy {
 public:
  using RecipePolicy::RecipePolicy;
  TriggerDecision compression_due(const TriggerState& state) const override { return paged_eviction_due(state); }

  Status check_budget(int budget, int block_size) const override {
    // Decode evicts a block that is neither the first nor the last of N_max >= 3.
    if (budget < 2 * block_size)
      return invalid_argument("policy " + name() + " with KV budget " + std::to_string(budget) +
                              ": block eviction needs a budget of at least 2 blocks (" +
                              std::to_string(2 * block_size) + " tokens at block size " + std::to_string(block_size) +
                              "): it never evicts the first or the last block");
    return RecipePolicy::check_budget(budget, block_size);
  }
};

}  // namespace

void register_pagedeviction_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "pagedeviction";
  info.summary =
      "PagedEviction: score ||v|| / ||k||; prefill evicts tokens down to the budget, decode frees the lowest-scoring "
      "whole block (no compaction)";
  info.options = {
      prefill_chunk_option(false),
      int_option("window", 16, 0, 1 << 20, "newest prompt entries always kept by the prefill eviction"),
      int_option("sinks", 0, 0, 1 << 20, "first prompt entries always kept by the prefill eviction"),
  };
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ScoreRecipe recipe;
    recipe.scorer = Scorer::kValueKeyNorm;
    recipe.window = options.get_int("window");
    recipe.num_sinks = options.get_int("sinks");
    return std::unique_ptr<KVPolicy>(new PagedEvictionPolicy(name, options, CompressionTrigger::kCacheFull, recipe));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
