// `streaming` (StreamingLLM): keep the first `sinks` entries (attention sinks) and the most
// recent ones. Runs on the same cache-full trigger as Zipage, so memory is bounded the same way:
// at N_max full blocks the request keeps its sinks and the k - sinks newest entries.
#include "core/check.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"

namespace origami {

void register_streaming_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "streaming";
  info.summary = "StreamingLLM: attention sinks + the most recent tokens (no scores, no queries)";
  info.options = {prefill_chunk_option(false), int_option("sinks", 4, 0, 1 << 20, "first entries always kept (attention sinks); StreamingLLM uses 4")};
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ScoreRecipe recipe;
    recipe.scorer = Scorer::kRecency;
    recipe.window = 0;
    recipe.num_sinks = options.get_int("sinks");
    return std::unique_ptr<KVPolicy>(new RecipePolicy(name, options, CompressionTrigger::kCacheFull, recipe));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
