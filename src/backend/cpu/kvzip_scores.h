#pragma once
// KVzip's score update for one layer of a reconstruction pass (Kim et al. 2025; eval/kvzip_scorer.h
// and the `kvzip` policy's compression on the CPU backend): the reconstruction's queries attend
// to the context's keys and to their own (causal), and every context key keeps the largest
// attention it receives.
#include <functional>

#include "backend/cpu/cpu_thread_pool.h"

namespace origami::cpu {

struct ReconstructionLayer {
  // The reconstruction tokens' q|k|v rows (after q/k norm and RoPE), as the forward pass has them.
  const float* qkv = nullptr;
  int qkv_width = 0;
  int num_tokens = 0;
  int num_heads = 0;     // query heads
  int num_kv_heads = 0;
  int head_dim = 0;
  // The context keys the softmax includes before the reconstruction's own: key i of KV head h.
  std::function<const float*(int head, int i)> context_key;
  int num_context = 0;
  // Context keys i >= first_scored are scored (i < first_scored only share the softmax: sinks).
  int first_scored = 0;
};

// For every KV head h, query head j of its GQA group and reconstruction token t: p = softmax over
// the num_context context keys, then the reconstruction's keys 0..t, of q.k / sqrt(head_dim)
// (max-subtracted; logits fp32, sums in double); best[h][i - first_scored] = max(itself, p_i) for
// the scored context keys. KV heads run in parallel on `pool` (null: serially).
void accumulate_reconstruction_scores(const ReconstructionLayer& layer, float* const* best, ThreadPool* pool);

}  // namespace origami::cpu
