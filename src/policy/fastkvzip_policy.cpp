// `fastkvzip` (Fast KVzip; Kim, Han, Yun 2026, "Fast KVzip: gated KV eviction"): every KV entry is
// scored by a small per-layer gate from the hidden state that produced it, as it is written
// (a sink-attention over low-rank projections, trained offline on KVzip's reconstruction scores:
// `origami train-gates`, docs/gates.md), and the lowest-scoring entries are evicted. No queries,
// no query slots, no scoring pass at compression time: the scores are already in the cache.
//
// The backend (with --kv-gates) writes each entry's gate score into the global-score page F as it
// writes the entry's K and V; the recipe selects by F (scorer zero, global max with decay 1, every
// entry scored: ScoreRecipe::gate_scores), and F moves with its entry on compaction.
// Defaults, from the paper's inference setting (App. A.4):
//  - sinks = 4: the first 4 tokens score 1 (always kept);
//  - window = 128: the most recent entries are always kept (the paper keeps the last 128 tokens at
//    every decode eviction, and the last 2% of a short prompt / 4K of a long one after each
//    prefill chunk; one window serves both here);
//  - cache-full trigger: at N_max full blocks the cache is evicted back to (N_max - 1) blocks, so
//    decoding evicts every block of new tokens (the paper: every 128 tokens, its gate batch);
//  - prefill_chunk_compression on: the paper evicts after every prefill chunk.
//  - allocation = global, page_aligned = 1: the paper's single threshold over all layers and heads
//    (non-uniform budgets), counted in whole pages; an engine started with this policy and no
//    --heads-per-group gets per-head pages (KVPolicy::prefers_per_head_pages), so that the memory
//    follows each head's count. On the tiny model at 25% of a document in context mode it keeps
//    0.85 of the facts where uniform budgets keep 0.04 (docs/fidelity.md). allocation=uniform,
//    page_aligned=0 is the one-table layout's uniform budget (every head keeps the same count).
#include "core/check.h"
#include "policy/keep_allocation_option.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"

namespace origami {

void register_fastkvzip_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "fastkvzip";
  info.summary = "Fast KVzip: evict by learned gate scores written with every entry (needs --kv-gates)";
  info.options = {
      prefill_chunk_option(true),
      int_option("window", 128, 0, 1 << 20, "the most recent entries always kept"),
      int_option("sinks", 4, 0, 1 << 20, "first entries always kept (score 1)"),
      allocation_option("global"),
      alpha_safe_option(),
      page_aligned_option(/*default_value=*/true),
  };
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    ScoreRecipe recipe = provided_score_recipe(options.get_int("window"), options.get_int("sinks"));
    recipe.gate_scores = true;
    apply_allocation_options(options, &recipe);
    return std::unique_ptr<KVPolicy>(new RecipePolicy(name, options, CompressionTrigger::kCacheFull, recipe));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
