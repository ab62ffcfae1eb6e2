#pragma once
// The shape every built-in policy takes: a trigger plus a ScoreRecipe, with its needs read off
// the recipe. A policy file only declares its options and maps them onto a recipe.
#include <optional>

#include "policy/kv_policy.h"

namespace origami {

class RecipePolicy : public KVPolicy {
 public:
  RecipePolicy(std::string name, PolicyOptions options, CompressionTrigger trigger, ScoreRecipe recipe,
               BudgetSplit split = BudgetSplit::kUniform)
      : KVPolicy(std::move(name), std::move(options)), trigger_(trigger), recipe_(recipe), split_(split) {}
  // A prefill-end policy whose intermediate prefill chunks are scored by `chunk_recipe`
  // (KVPolicy::chunk_score_recipe; it must need nothing `recipe` does not).
  RecipePolicy(std::string name, PolicyOptions options, CompressionTrigger trigger, ScoreRecipe recipe,
               ScoreRecipe chunk_recipe, BudgetSplit split)
      : KVPolicy(std::move(name), std::move(options)), trigger_(trigger), recipe_(recipe), chunk_recipe_(chunk_recipe),
        split_(split) {}

  CompressionTrigger trigger() const override { return trigger_; }
  BudgetSplit budget_split() const override { return split_; }
  PolicyNeeds needs() const override {
    PolicyNeeds n;
    if (trigger_ == CompressionTrigger::kNever) return n;
    n.window_queries = recipe_.needs_queries();
    n.window = n.window_queries ? recipe_.window : 0;
    n.global_scores = recipe_.global_decay > 0.0f;
    n.gate_scores = recipe_.gate_scores;
    n.reconstruction = recipe_.reconstruction_scores;
    n.joint_selection = runtime_allocation(recipe_);
    return n;
  }
  const ScoreRecipe& score_recipe() const override { return recipe_; }
  const ScoreRecipe& chunk_score_recipe() const override { return chunk_recipe_ ? *chunk_recipe_ : recipe_; }

 private:
  CompressionTrigger trigger_;
  ScoreRecipe recipe_;
  std::optional<ScoreRecipe> chunk_recipe_;  // none: recipe_ scores every compression
  BudgetSplit split_;
};

// The recipe of policies whose scores the backend provides per entry (Fast KVzip's gate scores
// written with every entry, KVzip's reconstruction scores computed at compression time): base
// scorer zero and the global score's max with decay 1, so that S = max(F, 0) = F with every entry
// scored; `window` newest and `sinks` first entries protected. The caller sets which provider.
inline ScoreRecipe provided_score_recipe(int window, int sinks) {
  ScoreRecipe recipe;
  recipe.scorer = Scorer::kZero;
  recipe.global_decay = 1.0f;
  recipe.global_mode = GlobalMode::kMax;
  recipe.window = window;
  recipe.num_sinks = sinks;
  return recipe;
}

// Option specs shared by several policies.
inline PolicyOptionSpec int_option(std::string name, int default_value, int min, int max, std::string help) {
  PolicyOptionSpec s;
  s.name = std::move(name);
  s.kind = OptionKind::kInt;
  s.default_value = std::to_string(default_value);
  s.min = min;
  s.max = max;
  s.help = std::move(help);
  return s;
}
inline PolicyOptionSpec float_option(std::string name, std::string default_value, double min, double max, std::string help) {
  PolicyOptionSpec s;
  s.name = std::move(name);
  s.kind = OptionKind::kFloat;
  s.default_value = std::move(default_value);
  s.min = min;
  s.max = max;
  s.help = std::move(help);
  return s;
}
inline PolicyOptionSpec bool_option(std::string name, bool default_value, std::string help) {
  PolicyOptionSpec s;
  s.name = std::move(name);
  s.kind = OptionKind::kBool;
  s.default_value = default_value ? "1" : "0";
  s.help = std::move(help);
  return s;
}
inline PolicyOptionSpec enum_option(std::string name, std::string default_value, std::vector<std::string> choices,
                                    std::string help) {
  PolicyOptionSpec s;
  s.name = std::move(name);
  s.kind = OptionKind::kEnum;
  s.default_value = std::move(default_value);
  s.choices = std::move(choices);
  s.help = std::move(help);
  return s;
}

// `prefill_chunk_compression`: compress after every prefill chunk once the request holds more
// entries than its budget (KVPolicy::prefill_chunk_threshold), so that a long prompt never holds
// more than its budget plus one chunk; on by default where the policy's paper evicts while the
// prompt is processed (docs/policies.md).
inline PolicyOptionSpec prefill_chunk_option(bool default_on) {
  return bool_option(std::string(kPrefillChunkCompressionOption), default_on,
                     "compress after every prefill chunk once the cache exceeds the budget (peak KV: budget + one "
                     "chunk), instead of once the whole prompt is prefilled");
}

// A pooling kernel must be odd (centred on its entry) or <= 1 (off).
inline Status check_pool_kernel(const std::string& policy, int kernel) {
  if (kernel > 1 && kernel % 2 == 0)
    return invalid_argument("policy " + policy + ": option kernel=" + std::to_string(kernel) +
                            " must be odd (a window centred on each entry) or 1 (no pooling)");
  return Status::ok();
}

}  // namespace origami
