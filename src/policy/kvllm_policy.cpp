// `kvllm` (Kara / KvLLM, Shen et al. 2026): sliding-window compression of the recent tokens only,
// on a periodic trigger.
//  - Every `delta` steps (the scheduler's step counter), up to `n` requests whose trailing
//    `window` (W) entries are uncompressed are compressed; more than n: the earliest admitted.
//  - Only the window moves: its last `buffer` (U) entries are protected, and of its first W - U
//    (the compressible region) ceil(ratio * (W - U)) are kept: ceil(ratio * (W - U)) - alpha by
//    the column sums of the window queries' *bidirectional* attention over the region's keys,
//    then Token2Chunk adds the interiors of the best short gaps (shorter than gamma) between
//    kept entries, up to alpha entries, and fills what it leaves with the next-best entries
//    (scorer `kara`, backend/cpu/scorers/kara_scorer.cpp). Entries before the window never move.
//  - The next window starts at the buffer (the window moves by W - U, the paper's App. C.2).
// Defaults: the paper's KvLLM serving setting (App. B.1: W = 3 blocks of 256 = 768 tokens,
// U = 32, delta = 128, n = 30), gamma = 8 (App. B.3), alpha = 32 (App. B.3's larger budget, for
// a window larger than the 256-512 it sweeps), ratio 0.3: ceil(0.3 * 736) + 32 = 253 entries
// per window, the paper's 257 of 768 (B.1) without the extra entry it keeps for block
// alignment. W and U are tokens, so they hold at any block size.
// Queries: captured into the request's query slot as the forward pass computes them (W rows per
// slot), not recomputed by a second forward pass over the window (docs/policies.md says why).
// Memory is not bounded by a budget (the paper: "do not precisely control the memory
// footprint"): a request keeps about `ratio` of what it generates plus an uncompressed tail of
// at most W + delta entries, so the policy takes no kv_budget and the scheduler treats its
// requests like full-KV ones (admitted as in vLLM, preempted by recompute).
#include <cmath>

#include "core/check.h"
#include "policy/policy_registry.h"
#include "policy/recipe_policy.h"

namespace origami {
namespace {

class KvllmPolicy : public RecipePolicy {
 public:
  KvllmPolicy(std::string name, PolicyOptions options, ScoreRecipe recipe, int period, int max_per_step)
      : RecipePolicy(std::move(name), std::move(options), CompressionTrigger::kPeriodic, recipe),
        period_(period),
        max_per_step_(max_per_step) {}

  TriggerDecision compression_due(const TriggerState& state) const override {
    TriggerDecision d = periodic_due(state, period_, max_per_step_);
    const ScoreRecipe& r = score_recipe();
    if (d.compress) d.num_keep = state.entries - (r.window - r.recent) + r.window_keep;
    return d;
  }
  int capture_from(const TriggerState& state) const override { return periodic_capture_from(state); }
  bool takes_budget() const override { return false; }
  Status check_budget(int, int) const override { return Status::ok(); }

 private:
  int period_;
  int max_per_step_;
};

}  // namespace

void register_kvllm_policy(PolicyRegistry* registry) {
  PolicyInfo info;
  info.name = "kvllm";
  info.summary = "KvLLM / Kara: every delta steps, compress the trailing window (bidirectional attention + Token2Chunk)";
  info.options = {
      int_option("window", 768, 2, 1 << 16, "W: tokens of the sliding window compressed at once (the paper: 3 blocks of 256)"),
      int_option("buffer", 32, 1, 1 << 16, "U: the window's last tokens, protected (they start the next window)"),
      float_option("ratio", "0.3", 1e-6, 1.0, "r: share of the window's compressible W - U tokens kept"),
      int_option("chunk_budget", 32, 0, 1 << 16, "alpha: entries Token2Chunk may add inside gaps (the paper: 16 or 32)"),
      int_option("chunk_len", 8, 3, 1 << 16, "gamma: a gap is a chunk candidate if its endpoints are fewer than gamma apart"),
      int_option("delta", 128, 1, 1 << 20, "compress every delta steps"),
      int_option("n", 30, 1, 1 << 20, "at most n requests compressed per period"),
  };
  info.build = [](const std::string& name, const PolicyOptions& options) -> Expected<std::unique_ptr<KVPolicy>> {
    const int window = options.get_int("window"), buffer = options.get_int("buffer");
    if (buffer >= window)
      return invalid_argument("policy " + name + ": buffer=" + std::to_string(buffer) + " must be below window=" +
                              std::to_string(window) + " (the window's compressible region is window - buffer)");
    ScoreRecipe recipe;
    recipe.scorer = Scorer::kKara;
    recipe.window = window;
    recipe.recent = buffer;
    recipe.protect_window = false;
    const int region = window - buffer;
    recipe.window_keep = std::min(region, static_cast<int>(std::ceil(options.get_float("ratio") * region - 1e-6)));
    recipe.chunk_budget = options.get_int("chunk_budget");
    recipe.chunk_max_len = options.get_int("chunk_len");
    return std::unique_ptr<KVPolicy>(
        new KvllmPolicy(name, options, recipe, options.get_int("delta"), options.get_int("n")));
  };
  ORIGAMI_CHECK(registry->add(std::move(info)).is_ok());
}

}  // namespace origami
