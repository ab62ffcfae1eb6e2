#pragma once
// SnapKV's score and options, shared by `snapkv` and `tangram` (TANGRAM runs SnapKV's scorer
// under calibrated per-head budgets: window 32, max pooling with kernel 7).
#include <string>
#include <vector>

#include "kv/compression.h"
#include "policy/policy_options.h"

namespace origami {

// window, kernel, pool_type, sinks, prefill_chunk_compression (default `chunk_default`) and
// chunk_slack (default `slack_default`), chunk_score (default `chunk_score_default`).
std::vector<PolicyOptionSpec> snapkv_option_specs(bool chunk_default, const std::string& slack_default,
                                                  const std::string& chunk_score_default);
// Window attention, pooled along the sequence at the (one) prompt compression. Errors: an even
// pooling kernel, named with `policy`.
Expected<ScoreRecipe> snapkv_recipe(const std::string& policy, const PolicyOptions& options);
// The score of a prompt's intermediate chunks (chunk_score, KVPolicy::chunk_score_recipe): `recipe`
// itself for `window`, else `recipe` with a base scorer that reads no queries.
ScoreRecipe snapkv_chunk_recipe(const ScoreRecipe& recipe, const PolicyOptions& options);

}  // namespace origami
