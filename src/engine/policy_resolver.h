#pragma once
// Turns a request's policy name, options and budget (or the engine's defaults) into the
// compression state the scheduler runs, checking them against what the backend allocated.
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine_config.h"
#include "engine/request_options.h"
#include "sched/request.h"

namespace origami {

// What the engine set up for compression at creation.
struct CompressionSupport {
  bool available = false;   // the backend accepted configure_compression()
  std::string unavailable_reason;
  std::string backend;      // for messages
  int num_query_slots = 0;  // M
  int max_window = 0;       // rows per query slot
  bool global_scores = false;
  bool gate_scores = false;  // the backend writes Fast KVzip gate scores (--kv-gates)
  bool reconstruction = false;  // the backend runs KVzip's reconstruction pass
  bool joint_selection = false;  // the backend runs runtime allocations (Backend::selects_jointly)
  int block_size = 16;
  // Head groups: each group's budget ratio (empty: uniform), from --group-budget-ratios or
  // calibrated head budgets (--kv-head-budgets, or a request's kv_head_budgets).
  std::vector<float> group_ratios;
  bool calibrated_head_budgets = false;  // the ratios come from a calibrated budget file
};

// A policy that splits its budget by calibrated head budgets (BudgetSplit::kCalibrated) needs a
// budget file (the engine's or the request's); the error says where to give one.
Status check_head_budgets(const KVPolicy& policy, const CompressionSupport& support);

// A policy whose recipe lets the backend decide the kept counts (ScoreRecipe::allocation layer /
// global: `adakv`, `fastkvzip` / `kvzip` with allocation=...) needs a backend that selects a
// request's heads jointly (CPU); the error names the policy, the allocation and the backend.
Status check_joint_selection(const KVPolicy& policy, const CompressionSupport& support);

// Policy: the request's, else the engine's default. Options: with a request policy, the
// request's; else the engine's overridden key by key by the request's. Budget: the request's,
// else the engine's, else the policy's default. Errors name the policy, option or budget.
Expected<RequestCompression> resolve_request_compression(const EngineConfig& config, const CompressionSupport& support,
                                                         const RequestOptions& options);

}  // namespace origami
