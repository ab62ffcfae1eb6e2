// `kvzip` (KVzip; Kim et al. 2025, "KVzip: query-agnostic KV cache compression with context
// reconstruction"): once the prompt is prefilled, the model reads a prompt asking to repeat it and
// then the prompt itself again (the reconstruction), each prompt entry is scored by the largest
// attention it receives from those queries (over the GQA group's heads), and the entries with
// the highest scores are kept. Exact and expensive (a second pass over the whole prompt at every
// compression): the reference Fast KVzip's gates are trained to imitate (docs/gates.md), for
// prefill / context use.
//
// The backend runs the reconstruction on a private copy of the request's cache at compression
// time (CPU: cpu_reconstruction.cpp) and the recipe selects by its scores (scorer zero, global max
// with decay 1, ScoreRecipe::reconstruction_scores). Trigger: end of prefill, once (SnapKV's):
// KVzip compresses a context, and decoding then grows the cache uncompressed.
// Defaults: sinks = 4 (KVzip scores the first 4 tokens 1); no recent window (KVzip has none).
// One reconstruction pass after the whole prompt by default; option `chunk` reconstructs it in
// equal chunks of at most `chunk` tokens, each over the sinks and itself with its reconstruction
// placed right after it, so that attention stays inside the model's trained context
// (backend/cpu/cpu_reconstruction.cpp; measured in docs/policies.md: not better on the tiny model).
// Differences from the reference: the reference reconstructs contexts of more than 2048 tokens in
// chunks placed after the whole context (`chunk` places them after themselves and gives every
// chunk the same prompt); uniform per-head budgets (top-k per (layer, KV head)) instead of one
// global threshold.
#include "core/check.h"
#include "policy/kvzip_prompt.h"
#include "policy/keep_allocation_option.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"

namespace origami {

void register_kvzip_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "kvzip";
  info.summary = "KVzip: keep what the model attends to while repeating the prompt (a second pass; CPU)";
  info.options = {
      int_option("window", 0, 0, 1 << 20, "the most recent entries always kept (KVzip: none)"),
      int_option("sinks", kKVzipSinks, 0, 1 << 20, "first entries always kept (score 1)"),
      int_option("chunk", 0, 0, 1 << 20,
                 "prompt tokens per reconstruction pass, each placed right after its chunk (0: one pass after the "
                 "whole prompt)"),
      allocation_option("uniform"),
      alpha_safe_option(),
      page_aligned_option(),
  };
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ScoreRecipe recipe = provided_score_recipe(options.get_int("window"), options.get_int("sinks"));
    recipe.reconstruction_scores = true;
    recipe.reconstruction_chunk = options.get_int("chunk");
    apply_allocation_options(options, &recipe);
    recipe.reconstruction_sinks = kKVzipSinks;
    return std::unique_ptr<KVPolicy>(new RecipePolicy(name, options, CompressionTrigger::kPrefillEnd, recipe));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
