#pragma once
// A request's life: WAITING -> RUNNING -> FINISHED, with RUNNING -> WAITING on preemption
// (its KV is dropped and recomputed later). Positions are logical: `num_computed_tokens` counts
// tokens whose KV has been produced, whatever the cache keeps of them.
#include <cstdint>
#include <string>
#include <vector>

#include "kv/block_table.h"
#include "sampling/sampling_params.h"

namespace origami {

using RequestId = uint64_t;

enum class RequestStatus { kWaiting, kRunning, kPreempted, kFinished };
enum class FinishReason { kNone, kLength, kStop, kEos, kAborted, kError };
const char* finish_reason_name(FinishReason reason);

struct Request {
  RequestId id = 0;
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> output_token_ids;
  SamplingParams sampling;
  uint64_t seed = 0;  // resolved seed (sampling.seed or drawn by the engine)

  RequestStatus status = RequestStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;  // set with kError

  int num_computed_tokens = 0;  // tokens whose KV is in the cache (logical count)
  int num_cached_prefix_tokens = 0;  // tokens served by the prefix cache at the last admission
  int num_preemptions = 0;
  double arrival_time = 0.0;      // seconds, engine clock
  double first_token_time = -1.0;
  double finish_time = -1.0;

  // KV memory held: one block table per head group (one group for full KV).
  RequestKV kv;

  int num_prompt_tokens() const { return static_cast<int>(prompt_token_ids.size()); }
  int num_tokens() const { return num_prompt_tokens() + static_cast<int>(output_token_ids.size()); }
  int32_t token_at(int i) const {
    return i < num_prompt_tokens() ? prompt_token_ids[i] : output_token_ids[i - num_prompt_tokens()];
  }
  bool is_finished() const { return status == RequestStatus::kFinished; }
  bool is_prefilling() const { return num_computed_tokens < num_tokens() - 1; }
};

}  // namespace origami
