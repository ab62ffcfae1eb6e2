#pragma once
// What the KV cache manager knows of a request: its tokens (prefix-cache hashes are computed
// from them), its pages, and how many of its tokens the prefix cache served. The scheduler's
// Request (sched/request.h) is a KVSequence; kv/ needs nothing from the layers above it.
#include <cstdint>
#include <vector>

#include "kv/block_table.h"

namespace origami {

struct KVSequence {
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> output_token_ids;
  // KV memory held: one block table per head group (one group for full KV).
  RequestKV kv;
  int num_cached_prefix_tokens = 0;  // tokens served by the prefix cache at the last admission
  // Tokens served by a retained context at the last admission (also in num_cached_prefix_tokens).
  int num_retained_tokens = 0;

  // Tokens a launched step samples that the host has not seen yet (asynchronous scheduling: 0 or
  // 1). They count among the sequence's tokens, so that its next step is planned before they are
  // known; token_at() reads only the known ones (num_known_tokens()), which is all that prefix
  // hashes, retained contexts and prompts ever need (each reads below the last token).
  int num_pending_tokens = 0;

  int num_prompt_tokens() const { return static_cast<int>(prompt_token_ids.size()); }
  int num_known_tokens() const { return num_prompt_tokens() + static_cast<int>(output_token_ids.size()); }
  int num_tokens() const { return num_known_tokens() + num_pending_tokens; }
  int32_t token_at(int i) const {
    return i < num_prompt_tokens() ? prompt_token_ids[i] : output_token_ids[i - num_prompt_tokens()];
  }
};

}  // namespace origami
