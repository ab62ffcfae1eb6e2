#pragma once
// The outcome of one sweep point (one policy at one budget over all documents).
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "eval/perplexity_task.h"
#include "eval/sweep.h"

namespace origami::eval {

enum class EvalTask { kRetrieval, kPerplexity };

struct PointResult {
  SweepPoint point;
  EvalTask task = EvalTask::kRetrieval;
  std::string mode;           // retrieval: prefill | stream | context; perplexity: stream
  int num_documents = 0;      // documents (retrieval) or windows (perplexity)
  int num_failed = 0;         // requests the engine rejected or failed
  std::string first_error;
  int num_correct = 0;        // retrieval
  NllTotal nll;               // perplexity, over the windows that completed
  double wall_seconds = 0.0;
  int64_t num_steps = 0;
  int64_t num_output_tokens = 0;  // forced + generated tokens, all documents
  // Engine counters over the point, and the longest document's KV before the answer (prompt +
  // forced tokens): what decide_applicability() (eval/point_applicability.h) reads.
  int64_t num_compressions = 0;
  int64_t evicted_tokens = 0;
  int64_t num_preemptions = 0;
  int max_document_tokens = 0;
  // false: the policy never acted on documents that exceed its budget (e.g. a prefill-end policy
  // in stream mode), so the metric would be full KV's by construction: shown as n/a, not scored.
  bool applies = true;
  std::string not_applied_reason;

  // Failed documents count as wrong: a policy cannot score by failing.
  double accuracy() const {
    return num_documents ? static_cast<double>(num_correct) / num_documents : std::numeric_limits<double>::quiet_NaN();
  }
  double perplexity() const { return nll.perplexity(); }
  // The number a sweep compares: accuracy or perplexity.
  double metric() const { return task == EvalTask::kRetrieval ? accuracy() : perplexity(); }
};

}  // namespace origami::eval
