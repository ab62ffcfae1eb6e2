// `knorm` (K-norm; Devoto et al. 2024, "A Simple and Effective L2 Norm-Based Strategy for KV
// Cache Compression"; kvpress's KnormPress): score every entry by -||k||_2 per (layer, KV head)
// and keep the highest, i.e. the keys with the smallest L2 norm, which the paper finds draw the
// most attention. Query-agnostic: no query slot, no window queries, nothing but the keys.
//
// Runs on the same cache-full trigger as zipage and streaming, so decode memory stays bounded:
// at N_max full blocks a request keeps k = (N_max - 1) * b entries per (layer, KV head).
// Defaults:
//  - sinks = 0: the paper observes that the first tokens (the attention sinks) have the smallest
//    key norms, so the score itself keeps them; kvpress adds no sinks either.
//  - window = 16 (zipage's w): the newest entries are always kept. A key written a step ago has
//    not been "seen" by any query yet, and evicting the latest tokens by their norm alone breaks
//    local coherence while decoding; kvpress compresses only the prompt, where this question does
//    not arise. window = 0 gives the pure K-norm ranking.
#include "core/check.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"

namespace origami {

void register_knorm_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "knorm";
  info.summary = "K-norm: keep the keys with the smallest L2 norm (no scores from queries, no query slots)";
  info.options = {
      prefill_chunk_option(false),
      int_option("window", 16, 0, 1 << 20, "the most recent entries always kept"),
      int_option("sinks", 0, 0, 1 << 20, "first entries always kept (the score keeps sinks by itself)"),
  };
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ScoreRecipe recipe;
    recipe.scorer = Scorer::kKeyNorm;
    recipe.window = options.get_int("window");
    recipe.num_sinks = options.get_int("sinks");
    return std::unique_ptr<KVPolicy>(new RecipePolicy(name, options, CompressionTrigger::kCacheFull, recipe));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
