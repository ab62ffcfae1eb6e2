#pragma once
// The logits of every output position of the tiny Qwen3 model on the CPU backend from one
// teacher-forced prefill (LogitsMode::kAll) of prompt + tokens[:-1]: row i predicts tokens[i]
// from prompt + tokens[:i]. The CPU backend computes them bit-identically to the engine's decode
// steps (backend_cpu_invariance_test), so they are the reference for what a decode should pick
// or report.
#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"
#include "engine_test_util.h"
#include "model/config.h"
#include "model/weights.h"

namespace origami::testing {

inline std::vector<std::vector<float>> teacher_forced_logits(const std::vector<int32_t>& prompt,
                                                             const std::vector<int32_t>& tokens) {
  auto config = load_model_config(tiny_qwen3_dir());
  EXPECT_TRUE(config.has_value());
  auto weights = load_model_weights(tiny_qwen3_dir(), *config);
  EXPECT_TRUE(weights.has_value());
  BackendOptions bo;
  bo.device = "cpu";
  auto backend = create_backend(bo);
  EXPECT_TRUE(backend.has_value());
  EXPECT_TRUE((*backend)->load(*config, *weights).is_ok());
  KVLayout layout = KVLayout::full(config->num_layers, config->num_kv_heads, config->head_dim, 16, 64, DType::kF32);
  EXPECT_TRUE((*backend)->allocate_kv_cache(layout).is_ok());
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), tokens.begin(), tokens.end() - 1);
  std::vector<BlockId> table;
  for (int b = 0; b * 16 < static_cast<int>(seq.size()); ++b) table.push_back(b + 1);
  SamplingParams sp = greedy(1);
  ForwardBatch batch;
  batch.token_ids = seq;
  for (size_t i = 0; i < seq.size(); ++i) batch.positions.push_back(static_cast<int32_t>(i));
  SequenceInput in;
  in.num_query_tokens = static_cast<int>(seq.size());
  in.block_table = &table;
  in.logits_mode = LogitsMode::kAll;
  in.sampling = &sp;
  batch.sequences.push_back(in);
  StepOutput out;
  EXPECT_TRUE((*backend)->execute(batch, &out).is_ok());
  const size_t vocab = static_cast<size_t>(config->vocab_size);
  std::vector<std::vector<float>> rows;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float* row = out.all_logits[0].data() + (prompt.size() - 1 + i) * vocab;
    rows.emplace_back(row, row + vocab);
  }
  return rows;
}

}  // namespace origami::testing
