// `tova` (Token Omission Via Attention; Oren et al. 2024, "Transformers are Multi-State RNNs"):
// score every entry by the attention of the newest query alone and evict the lowest. Here that is
// the window-attention scorer with a window of one query (max over a GQA group's query heads),
// per (layer, KV head), on the cache-full trigger: when a request fills N_max blocks, the block's
// worth of lowest-scored entries is evicted at once, all by the same (newest) query, where TOVA
// evicts one entry per generated token, each by that token's query, holding the cache at exactly
// the budget (docs/policies.md, "tova").
#include "core/check.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"

namespace origami {

void register_tova_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "tova";
  info.summary = "TOVA: keep the entries the newest query attends to most";
  info.options = {
      prefill_chunk_option(false),
      int_option("sinks", 0, 0, 1 << 20, "first entries always kept (TOVA keeps none)"),
  };
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ScoreRecipe recipe;
    recipe.scorer = Scorer::kAttention;
    recipe.window = 1;  // the newest query only; its own entry is kept
    recipe.num_sinks = options.get_int("sinks");
    return std::unique_ptr<KVPolicy>(new RecipePolicy(name, options, CompressionTrigger::kCacheFull, recipe));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
