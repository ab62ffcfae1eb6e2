// `tangram` (TANGRAM, "non-uniform KV serving"): SnapKV's score under offline-calibrated per-head
// budgets (`origami calibrate`, --kv-head-budgets or a request's kv_head_budgets). Each head
// group keeps in proportion to its calibrated ratio, the budget being the average over every
// (layer, KV head) (the paper's target global retention in tokens); the prompt is compressed
// chunk by chunk as it is prefilled (paper Fig. 6a), so its peak KV is its budget plus one chunk,
// and the scheduler reserves every group's own post-compression pages at admission (§4.1).
#include "core/check.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"
#include "policy/snapkv_recipe.h"

namespace origami {

void register_tangram_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "tangram";
  info.summary =
      "TANGRAM: SnapKV's score under calibrated per-head budgets (--kv-head-budgets), each prefill chunk "
      "compressed as produced, every head group's pages reserved at admission";
  info.options = snapkv_option_specs(/*chunk_default=*/true, /*slack_default=*/"0", /*chunk_score_default=*/"keydiff");
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ORIGAMI_ASSIGN_OR_RETURN(ScoreRecipe recipe, snapkv_recipe(name, options));
    return std::unique_ptr<KVPolicy>(
        new RecipePolicy(name, options, CompressionTrigger::kPrefillEnd, recipe,
                                                      snapkv_chunk_recipe(recipe, options), BudgetSplit::kCalibrated));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
