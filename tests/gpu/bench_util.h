#pragma once
// Helpers of the GPU benchmarks (tests that run only with ORIGAMI_CUDA_BENCH=1): their switch,
// the model shape they run, and decode steps of one token per sequence over given page tables.
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/forward_batch.h"

namespace origami::cuda::testing {

inline bool bench_enabled() {
  const char* on = std::getenv("ORIGAMI_CUDA_BENCH");
  return on != nullptr && std::string(on) == "1";
}

// ORIGAMI_BENCH_CONFIG: a configs/ folder name of the shared dir (default qwen3-8b).
inline std::string bench_config_name() {
  const char* v = std::getenv("ORIGAMI_BENCH_CONFIG");
  return v != nullptr && v[0] != '\0' ? v : "qwen3-8b";
}

// One decode step of tables.size() sequences at position `pos` (`pos` entries cached, one new
// token each, token ids derived from the sequence and the position). The tables and `sampling`
// must outlive the batch.
inline ForwardBatch decode_step_batch(const std::vector<std::vector<BlockId>>& tables, int pos, int vocab_size,
                                      const SamplingParams* sampling) {
  ForwardBatch fb;
  for (size_t s = 0; s < tables.size(); ++s) {
    SequenceInput in;
    in.query_start = static_cast<int>(s);
    in.num_query_tokens = 1;
    in.start_position = pos;
    in.num_cached_entries = pos;
    in.block_table = &tables[s];
    in.sampling = sampling;
    fb.token_ids.push_back((static_cast<int>(s) * 31 + pos) % vocab_size);
    fb.positions.push_back(pos);
    fb.sequences.push_back(in);
  }
  return fb;
}

}  // namespace origami::cuda::testing
