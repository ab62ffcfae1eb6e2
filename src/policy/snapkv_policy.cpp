// `snapkv` (SnapKV): once the prompt is prefilled, score its entries by the attention of the
// last `window` prompt queries, pooled along the sequence, and keep `budget` of them (window
// included). Decoding then grows the cache uncompressed, so memory is bounded only for the prompt.
// Defaults follow SnapKV's LongBench setting (window 32, max pooling with kernel 7), which is
// also how the TANGRAM paper runs it.
#include "core/check.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"
#include "policy/snapkv_recipe.h"

namespace origami {

std::vector<PolicyOptionSpec> snapkv_option_specs(bool chunk_default, const std::string& slack_default,
                                                  const std::string& chunk_score_default) {
  return {
      prefill_chunk_option(chunk_default),
      float_option(kChunkSlackOption, slack_default, 0.0, 8.0,
                   "prefill_chunk_compression: each chunk keeps budget x (1 + chunk_slack) entries and the prompt's "
                   "end keeps the budget, scored by the prompt's last window (its question); peak KV: budget x "
                   "(1 + chunk_slack) + one chunk"),
      enum_option(kChunkScoreOption, chunk_score_default, {"window", "keydiff", "knorm"},
                  "prefill_chunk_compression: the score of a chunk's compression before the prompt's end, which "
                  "must keep what a question not yet read may ask for: `window` (the chunk's last window of "
                  "queries, as at the prompt's end), `keydiff` (keys least like the mean key) or `knorm` (small "
                  "key norms), pooled as the window's score is; the prompt's end re-scores what the chunks kept "
                  "with its own last window (its question)"),
      int_option("window", 32, 1, 1024, "observation window: the last prompt tokens whose queries score the rest (always kept)"),
      int_option("kernel", 7, 1, 63, "pooling kernel along the sequence (odd; 1 = no pooling)"),
      enum_option("pool_type", "max", {"max", "avg"}, "pooling: max or average"),
      int_option("sinks", 0, 0, 1 << 20, "first entries always kept"),
  };
}

Expected<ScoreRecipe> snapkv_recipe(const std::string& policy, const PolicyOptions& options) {
  ORIGAMI_RETURN_IF_ERROR(check_pool_kernel(policy, options.get_int("kernel")));
  ScoreRecipe recipe;
  recipe.scorer = Scorer::kAttention;
  recipe.window = options.get_int("window");
  recipe.pool_kernel = options.get_int("kernel");
  recipe.pool_type = options.get("pool_type") == "avg" ? PoolType::kAvg : PoolType::kMax;
  // Pooling is part of SnapKV's score (it keeps the neighbours of what the window attends to: the
  // other tokens of a number or a name), so it applies at every compression: a prompt compressed
  // chunk by chunk (prefill_chunk_compression, TANGRAM) must pool at its last compression too,
  // the one that sees the question.
  recipe.pool_first_only = false;
  recipe.num_sinks = options.get_int("sinks");
  return recipe;
}

ScoreRecipe snapkv_chunk_recipe(const ScoreRecipe& recipe, const PolicyOptions& options) {
  const std::string score = options.get(kChunkScoreOption);
  if (score == "window") return recipe;
  // The same protection (window, sinks) and pooling around a base score that reads no queries: a
  // chunk's window has not seen the question, so what it attends to says little about what the
  // question will need, while a distinctive key (KeyDiff) is what a question about a detail asks for.
  ScoreRecipe chunk = recipe;
  chunk.scorer = score == "keydiff" ? Scorer::kKeyDiff : Scorer::kKeyNorm;
  return chunk;
}

void register_snapkv_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "snapkv";
  info.summary = "SnapKV: compress the prompt once at the end of prefill (window attention + pooling)";
  info.options = snapkv_option_specs(/*chunk_default=*/false, /*slack_default=*/"0", /*chunk_score_default=*/"window");
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ORIGAMI_ASSIGN_OR_RETURN(ScoreRecipe recipe, snapkv_recipe(name, options));
    return std::unique_ptr<KVPolicy>(new RecipePolicy(name, options, CompressionTrigger::kPrefillEnd, recipe,
                                                      snapkv_chunk_recipe(recipe, options), BudgetSplit::kUniform));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
