#pragma once
// The `allocation` and `alpha_safe` options of policies whose kept counts may be decided at run
// time (ScoreRecipe::allocation, kv/compression.h): `uniform` (every head keeps the budget),
// `layer` (AdaKV: one top-k per layer over its heads) or `global` (one threshold over every layer
// and head), with AdaKV's safeguard floor(alpha_safe x budget) per head, and `page_aligned` (the
// runtime counts in whole pages of the KV block size).
#include <string>

#include "kv/compression.h"
#include "policy/recipe_policy.h"

namespace origami {

inline PolicyOptionSpec allocation_option(const std::string& default_value) {
  return enum_option("allocation", default_value, {"uniform", "layer", "global"},
                     "who decides each head's kept count: uniform (every head keeps the budget), layer (one top-k "
                     "over each layer's heads, the layer keeping budget x heads), global (one threshold over all "
                     "layers and heads); layer and global: CPU backend only");
}

inline PolicyOptionSpec alpha_safe_option() {
  return float_option("alpha_safe", "0.2", 0.0, 1.0,
                      "layer/global allocation: every head keeps at least floor(alpha_safe x budget) entries (AdaKV's "
                      "safeguard)");
}

inline PolicyOptionSpec page_aligned_option(bool default_value = false) {
  return bool_option("page_aligned", default_value,
                     "layer/global allocation: the scope's total counted in pages of the KV block size, every head "
                     "keeping a whole number of pages (or all its entries): no head's last page left partly empty; "
                     "with it, the engine's default layout is per-head pages (--heads-per-group 1)");
}

// Sets the recipe's safeguard and page alignment from the options above.
inline void apply_runtime_allocation_options(const PolicyOptions& options, ScoreRecipe* recipe) {
  recipe->alpha_safe = options.get_float("alpha_safe");
  recipe->page_aligned = options.get_bool("page_aligned");
}

// Sets the recipe's allocation, safeguard and page alignment from the options above.
inline void apply_allocation_options(const PolicyOptions& options, ScoreRecipe* recipe) {
  const std::string& a = options.get("allocation");
  recipe->allocation = a == "layer" ? KeepAllocation::kLayer : a == "global" ? KeepAllocation::kGlobal : KeepAllocation::kUniform;
  apply_runtime_allocation_options(options, recipe);
}

}  // namespace origami
