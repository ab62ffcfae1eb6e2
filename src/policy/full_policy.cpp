// `full`: no compression; the cache grows with the sequence (the baseline every policy is
// compared against). Budgets are ignored.
#include "core/check.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"

namespace origami {

void register_full_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "full";
  info.summary = "Full KV cache, never compressed (the baseline)";
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ScoreRecipe recipe;
    recipe.scorer = Scorer::kZero;
    return std::unique_ptr<KVPolicy>(new RecipePolicy(name, options, CompressionTrigger::kNever, recipe));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
