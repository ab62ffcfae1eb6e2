// `h2o` (Heavy-Hitter Oracle; Zhang et al. 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative
// Inference of Large Language Models"): keep the entries with the largest *accumulated* attention
// (the heavy hitters) plus the most recent entries, half of the kept entries each (the paper's
// equal heavy / recent split).
//
// In origami compression runs on the cache-full trigger, every block_size tokens. The recipe scores
// each compression by the attention of the last `window` queries (mean over the window, max over a
// GQA group's query heads) and adds it to the entry's score from earlier compressions (global score
// F <- F_prev + S, moving with its entry on compaction). When the window covers every query since
// the last compression (window = block size: 16 with the default block size), F is H2O's
// accumulated attention from the first compression on, up to the constant factor 1 / window.
// Differences from the paper (docs/policies.md, "h2o"): prompt queries before the first
// compression's window are not accumulated; eviction drops a block of entries at once when the
// cache fills instead of one entry per generated token; scores are per (layer, KV head).
#include "core/check.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"

namespace origami {

void register_h2o_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "h2o";
  info.summary = "H2O: accumulated attention (heavy hitters) + a recent window, half the kept entries each";
  info.options = {
      prefill_chunk_option(false),
      int_option("window", 16, 1, 1024,
                 "queries accumulated per compression (<= block size; = block size accumulates every query)"),
      float_option("recent_ratio", "0.5", 0.0, 0.99, "share of the kept entries that are the most recent ones"),
      int_option("sinks", 0, 0, 1 << 20, "first entries always kept (H2O keeps none)"),
  };
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ScoreRecipe recipe;
    recipe.scorer = Scorer::kAttention;
    recipe.window = options.get_int("window");
    recipe.global_decay = 1.0f;
    recipe.global_mode = GlobalMode::kSum;
    recipe.recent_ratio = options.get_float("recent_ratio");
    recipe.num_sinks = options.get_int("sinks");
    return std::unique_ptr<KVPolicy>(new RecipePolicy(name, options, CompressionTrigger::kCacheFull, recipe));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
