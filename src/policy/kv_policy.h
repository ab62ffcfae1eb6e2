#pragma once
// A KV compression policy: what it needs, when it triggers, how its budget is split, and its
// score. Like kvpress's presses, a policy is small: it only *declares* these and builds a
// ScoreRecipe (its score); selecting the top entries and compacting them in place is shared by
// every policy and runs in the backend's kernels. The scheduler reads the trigger and needs to
// plan query capture and compression; the engine hands the recipe to the backend.
#include <memory>
#include <string>

#include "core/status.h"
#include "kv/compression.h"
#include "policy/policy_options.h"
#include "policy/triggers.h"

namespace origami {

// When a request's cache is compressed.
enum class CompressionTrigger {
  kNever,      // full KV: the cache grows with the sequence
  // Zipage: a request that is not prefilling and holds N_max full blocks (N_max * b entries) is
  // compressed to k = (N_max - 1) * b entries per (layer, KV head). Memory stays bounded for the
  // whole decode; a prompt may exceed N_max blocks until its prefill completes.
  kCacheFull,
  // SnapKV: once, when the prompt (the prefill) completes, if it holds more entries than the
  // budget, keep `budget` of them; decoding then grows the cache uncompressed.
  kPrefillEnd,
  // KvLLM: every `delta` steps, up to `n` requests whose trailing window of W entries is
  // uncompressed have that window compressed (Kara); entries before it never move. Memory grows
  // by about the kept ratio of the tokens generated; it is not bounded by a budget.
  kPeriodic,
};
const char* trigger_name(CompressionTrigger trigger);

// How the per-request budget is split over (layer, KV head).
enum class BudgetSplit {
  // Every head keeps as many entries (with head groups: each group its --group-budget-ratios or
  // --kv-head-budgets share, the largest group keeping the budget).
  kUniform,
  // TANGRAM: calibrated per-head budgets are required (the engine's --kv-head-budgets, or the
  // request's kv_head_budgets); the budget is the *average* entries kept per (layer, KV head), each
  // head group keeping in proportion to its calibrated ratio (docs/policies.md, `tangram`).
  kCalibrated,
};
const char* budget_split_name(BudgetSplit split);

// What a policy's score needs from the engine and backend.
struct PolicyNeeds {
  // Queries of the last `window` entries before a compression, captured into a query slot.
  bool window_queries = false;
  int window = 0;
  // G-KV global score pages F (allocated by the backend when the engine enables them).
  bool global_scores = false;
  // Fast KVzip gate scores written into F with every entry (a backend with gates loaded).
  bool gate_scores = false;
  // KVzip's reconstruction pass run by the backend at compression time, on the request's tokens.
  bool reconstruction = false;
  // A runtime allocation (ScoreRecipe::allocation layer / global): the backend selects the request's
  // heads jointly and reports each head group's count (Backend::selects_jointly: CPU and CUDA).
  bool joint_selection = false;
};

// The option that turns prefill chunk compression on (policy/triggers.h, prefill_chunk_due).
inline constexpr const char* kPrefillChunkCompressionOption = "prefill_chunk_compression";
// Prefill-end policies compressed chunk by chunk: each chunk keeps budget x (1 + chunk_slack)
// entries, and the prompt's end (whose window holds the question) keeps the budget.
inline constexpr const char* kChunkSlackOption = "chunk_slack";
// Prefill-end policies compressed chunk by chunk: the score of a chunk's compression (the prompt's
// end is always scored by the policy's own recipe, whose window holds the question).
inline constexpr const char* kChunkScoreOption = "chunk_score";

class KVPolicy {
 public:
  KVPolicy(std::string name, PolicyOptions options) : name_(std::move(name)), options_(std::move(options)) {}
  virtual ~KVPolicy() = default;

  // The registered name it was created under (an alias keeps its own name).
  const std::string& name() const { return name_; }
  // Every option with its resolved value ("window" -> "16", ...).
  const PolicyOptions& options() const { return options_; }

  virtual CompressionTrigger trigger() const = 0;
  // The trigger itself (policy/triggers.h), asked by the scheduler after every step of a request
  // that is not being compressed: whether to compress it now. The default runs trigger()'s
  // built-in rule (cache_full_due, prefill_end_due; never for kNever).
  virtual TriggerDecision compression_due(const TriggerState& state) const;
  // The entry index from which computed tokens capture their queries into the request's query
  // slot (the observation window of its next compression); -1 when no compression that needs
  // queries is coming. The default runs trigger()'s built-in rule.
  virtual int capture_from(const TriggerState& state) const;
  virtual BudgetSplit budget_split() const { return BudgetSplit::kUniform; }
  virtual PolicyNeeds needs() const = 0;
  // Its score. Entries the recipe protects (window, sinks) are always kept.
  virtual const ScoreRecipe& score_recipe() const = 0;
  // The score of a compression at the end of a prefill chunk that is not the prompt's last
  // (prefill_chunk_compression under a prefill-end trigger): what must survive until a question
  // that has not arrived yet; by default score_recipe(). It reads nothing score_recipe() does not
  // provide for (needs() describes score_recipe()).
  virtual const ScoreRecipe& chunk_score_recipe() const { return score_recipe(); }
  // Budget (tokens of KV per request) when neither the request nor the engine sets one.
  virtual int default_budget() const { return 2048; }
  // Whether a budget means anything to it. A compressing policy whose compressions keep a count
  // of their own (a sliding window's ratio) takes none: a kv_budget given for it is an error
  // rather than silently ignored.
  virtual bool takes_budget() const { return compresses(); }
  // Whether `budget` tokens work with this policy at this block size (the error names both).
  virtual Status check_budget(int budget, int block_size) const;

  bool compresses() const { return trigger() != CompressionTrigger::kNever; }
  // Whether its method needs per-head pages to hold what it keeps: a runtime allocation counted in
  // whole pages (Fast KVzip's global threshold, page_aligned). An engine whose default policy it is
  // and whose --heads-per-group is not given lays its KV out one head per page table.
  bool prefers_per_head_pages() const;
  // Whether the policy declares the prefill_chunk_compression option (budgeted policies whose
  // compressions keep the budget: cache-full and prefill-end triggers).
  bool supports_prefill_chunk_compression() const;
  // Prefill chunk compression: the entry count above which the end of a prefill chunk (not the
  // prompt's last) compresses the request, the count its own trigger compresses at (cache-full:
  // N_max * b - 1; prefill-end: the budget, times 1 + chunk_slack where the policy declares that
  // option: the count each chunk keeps); -1 when the option is off or not supported.
  int prefill_chunk_threshold(int budget, int max_blocks, int block_size) const;
  // "zipage(global=1, redundancy=lightning, ...)", for logs and `origami policies`.
  std::string describe() const;

 private:
  std::string name_;
  PolicyOptions options_;
};

}  // namespace origami
