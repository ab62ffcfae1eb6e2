#pragma once
// How the engine splits its KV memory between KV blocks, query slots and global-score pages
// (Zipage eq. 1/2), from the default policy and budget.
#include <memory>

#include "backend/backend.h"
#include "engine/engine_config.h"
#include "kv/kv_layout.h"
#include "policy/kv_policy.h"

namespace origami {

struct KVMemoryPlan {
  int num_blocks = 0;  // pages of group 0, the null block included
  bool compression = false;  // configure the backend for compression
  CompressionConfig compression_config;
  std::shared_ptr<const KVPolicy> default_policy;
  int default_budget = 0;
};

// `layout` gives the page size; the backend is loaded (query_slot_bytes, available_kv_bytes).
//  - Default policy needing queries: M = floor(m_avail / (m_block * N_max + m_q)) with N_max from
//    the default budget, capped by max_num_seqs (or EngineConfig::num_query_slots).
//  - Otherwise min(max_num_seqs, 8) slots, so requests may still choose such a policy.
//  - With --num-kv-blocks the block count is exact and slots/score pages come on top.
Expected<KVMemoryPlan> plan_kv_memory(const EngineConfig& config, const ModelConfig& model, const KVLayout& layout,
                                      const Backend& backend);

}  // namespace origami
