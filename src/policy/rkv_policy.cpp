// `rkv` (R-KV; Cai et al. 2025, "R-KV: Redundancy-aware KV Cache Compression for Reasoning
// Models"): importance = attention of the last `window` queries (mean over the window), max-pooled
// along the sequence at every compression; redundancy R = softmax over entries of the mean cosine
// similarity of each key to all others (pairs above `threshold` leave out the newest similar key,
// R-KV's retain_direction "last"); score = lambda * importance - (1 - lambda) * R; the window is
// always kept and counts against the budget.
//
// Defaults are the R-KV reference code's (run_math.py / R1KV): window 8, max pooling with kernel
// 7, lambda (mix_lambda) 0.1, threshold 0.5, all-pairs (flash) similarity, no softmax temperature
// (tau = 1), no sinks. It is the same pipeline as zipage's redundancy stage, which adds Zipage's
// tau, lightning spans, first-compression pooling and the global score. Differences from the paper
// (docs/policies.md, "rkv"): compression every block instead of R-KV's decode buffer, softmax over
// every cached key (causal inside the window) and the GQA max taken over probabilities.
#include "core/check.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"

namespace origami {

void register_rkv_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "rkv";
  info.summary = "R-KV: window attention (pooled) - redundancy of keys (all pairs), lambda 0.1";
  info.options = {
      prefill_chunk_option(false),
      int_option("window", 8, 1, 1024, "observation window: the last entries whose queries score the rest (always kept; <= block size)"),
      int_option("kernel", 7, 1, 63, "max-pooling kernel along the sequence, every compression (odd; 1 = none)"),
      float_option("lambda", "0.1", 0.0, 1.0, "score = lambda * attention - (1 - lambda) * redundancy"),
      float_option("threshold", "0.5", -1.0, 1.0, "cosine similarity above which the newest similar key is not counted"),
      int_option("sinks", 0, 0, 1 << 20, "first entries always kept (R-KV keeps none)"),
  };
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ORIGAMI_RETURN_IF_ERROR(check_pool_kernel(name, options.get_int("kernel")));
    ScoreRecipe recipe;
    recipe.scorer = Scorer::kAttention;
    recipe.window = options.get_int("window");
    recipe.pool_kernel = options.get_int("kernel");
    recipe.pool_type = PoolType::kMax;
    recipe.pool_first_only = false;
    recipe.redundancy = RedundancyMode::kFlash;
    recipe.redundancy_lambda = options.get_float("lambda");
    recipe.redundancy_tau = 1.0f;
    recipe.redundancy_threshold = options.get_float("threshold");
    recipe.num_sinks = options.get_int("sinks");
    return std::unique_ptr<KVPolicy>(new RecipePolicy(name, options, CompressionTrigger::kCacheFull, recipe));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
