// `adakv` (AdaKV: Feng et al. 2024, "Ada-KV: optimizing KV cache eviction by adaptive budget
// allocation"): SnapKV's score (window 32, max pooling with kernel 7; snapkv_recipe.h) with the
// budget allocated at run time per layer: one top-k over all the layer's heads' scores, the layer
// keeping budget x its KV heads, every head keeping at least floor(alpha_safe x budget) (AdaKV's
// safeguard, default 0.2). The runtime non-uniform baseline beside the calibrated `tangram`.
//
// On pages a head group holds its heads' largest count (the others keep their next-best entries
// up to it), so memory is freed only when heads have pages of their own (--heads-per-group 1, or
// small groups); in the one-group layout the cache holds the layer's largest head count for every
// head (docs/policies.md, `adakv`). Trigger: end of prefill, once (SnapKV's); CPU and CUDA (tensor parallelism: over every rank's heads).
#include "core/check.h"
#include "policy/keep_allocation_option.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"
#include "policy/snapkv_recipe.h"

namespace origami {

void register_adakv_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "adakv";
  info.summary =
      "AdaKV: SnapKV's score, the budget allocated per layer at run time (one top-k over the layer's heads, "
      "alpha_safe floor per head)";
  info.options = snapkv_option_specs(/*chunk_default=*/false, /*slack_default=*/"0", /*chunk_score_default=*/"window");
  info.options.push_back(alpha_safe_option());
  info.options.push_back(page_aligned_option());
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ORIGAMI_ASSIGN_OR_RETURN(ScoreRecipe recipe, snapkv_recipe(name, options));
    recipe.allocation = KeepAllocation::kLayer;
    apply_runtime_allocation_options(options, &recipe);
    return std::unique_ptr<KVPolicy>(new RecipePolicy(name, options, CompressionTrigger::kPrefillEnd, recipe,
                                                      snapkv_chunk_recipe(recipe, options), BudgetSplit::kUniform));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
