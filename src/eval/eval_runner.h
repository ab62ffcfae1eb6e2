#pragma once
// Runs a list of evaluation requests through one engine as one batch (continuous batching:
// all are queued at once and the scheduler admits as many as fit), under one compression
// policy and budget.
#include <map>
#include <string>
#include <vector>

#include "engine/batch_runner.h"
#include "engine/engine.h"
#include "eval/eval_item.h"

namespace origami::eval {

struct PolicyChoice {
  std::string policy;  // a registered policy name; "" = the engine's default
  int budget = 0;      // 0 = the policy's default
  std::map<std::string, std::string> options;
};

// Called after every engine step with (finished items, all items).
using EvalProgress = ProgressCallback;

// Every item is decoded greedily. An item the engine rejects or fails ends with ok = false and
// the engine's message; the others still run. Results are checked against what was asked: the
// forced tokens must come back as the first outputs, with one log-probability each when asked.
// A document whose prompt and forced tokens do not fit max_model_len fails at once (it is never
// queued). With hooks.should_stop, the run stops early: unfinished items end with ok = false.
std::vector<EvalItemResult> run_eval_batch(Engine& engine, const std::vector<EvalItem>& items,
                                           const PolicyChoice& choice, const EvalProgress& progress = nullptr);
std::vector<EvalItemResult> run_eval_batch(Engine& engine, const std::vector<EvalItem>& items,
                                           const PolicyChoice& choice, const BatchHooks& hooks);

}  // namespace origami::eval
