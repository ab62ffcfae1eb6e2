// `keydiff` (KeyDiff; Park et al. 2025, "KeyDiff: Key Similarity-Based KV Cache Eviction for
// Long-Context LLM Inference in Resource-Constrained Environments"; kvpress's KeyDiffPress): score
// every entry by -cos(k, a) per (layer, KV head), a being the mean of the head's unit keys, and
// keep the highest: keys least like the average key. Query-agnostic: no query slot, nothing but
// the keys.
//
// Cache-full trigger like knorm, so decode memory is bounded. Defaults as knorm's, for the same
// reasons: window = 16 (the newest entries, not yet attended by any query, are kept; kvpress
// compresses only the prompt), sinks = 0 (KeyDiffPress adds none). prefill_chunk_compression = 1:
// the paper processes a long prompt block by block and evicts after each block, so that
// "arbitrarily long prompts" run within a fixed cache; here each prefill chunk is a block.
#include "core/check.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"

namespace origami {

void register_keydiff_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "keydiff";
  info.summary = "KeyDiff: keep the keys least similar to the mean key (no scores from queries, no query slots)";
  info.options = {
      prefill_chunk_option(true),
      int_option("window", 16, 0, 1 << 20, "the most recent entries always kept"),
      int_option("sinks", 0, 0, 1 << 20, "first entries always kept"),
  };
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ScoreRecipe recipe;
    recipe.scorer = Scorer::kKeyDiff;
    recipe.window = options.get_int("window");
    recipe.num_sinks = options.get_int("sinks");
    return std::unique_ptr<KVPolicy>(new RecipePolicy(name, options, CompressionTrigger::kCacheFull, recipe));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
