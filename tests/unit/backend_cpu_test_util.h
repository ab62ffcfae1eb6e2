#pragma once
// Drives the CPU backend directly, without scheduler or KV manager: each sequence gets pages
// handed out in order from a counter, and steps are built by hand.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "kv/kv_cache_dtype.h"
#include "model/config.h"
#include "model/weights.h"

namespace origami::test {

inline std::filesystem::path shared_dir() { return ORIGAMI_SHARED_DIR; }
inline std::filesystem::path model_dir(const std::string& name) { return shared_dir() / "models" / name; }

inline nlohmann::json load_golden(const std::string& model) {
  std::ifstream in(shared_dir() / "golden" / (model + "_golden.json"));
  return nlohmann::json::parse(in);
}

// A loaded model on a CPU backend with a KV pool of `num_blocks` pages of `block_size`.
// The full layout of a CPU test cache of the given KV dtype (bf16 and fp8 are emulated in fp32).
inline KVLayout cpu_test_layout(const ModelConfig& config, int block_size, int num_blocks,
                                KVCacheDType kv_dtype = KVCacheDType::kAuto) {
  KVLayout layout = KVLayout::full(config.num_layers, config.num_kv_heads, config.head_dim, block_size, num_blocks,
                                   kv_dtype == KVCacheDType::kBF16 ? DType::kBF16 : DType::kF32);
  layout.fp8 = kv_dtype == KVCacheDType::kFP8;
  return layout;
}

inline std::unique_ptr<CpuBackend> make_cpu_backend(const std::string& model, int block_size, int num_blocks,
                                                    int num_threads = 0,
                                                    KVCacheDType kv_dtype = KVCacheDType::kAuto) {
  auto config = load_model_config(model_dir(model));
  EXPECT_TRUE(config.has_value()) << config.status().to_string();
  if (!config) return nullptr;
  auto weights = load_model_weights(model_dir(model), *config);
  EXPECT_TRUE(weights.has_value()) << weights.status().to_string();
  if (!weights) return nullptr;
  BackendOptions options;
  options.num_threads = num_threads;
  auto backend = std::make_unique<CpuBackend>(options);
  Status st = backend->load(*config, *weights);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  st = backend->allocate_kv_cache(cpu_test_layout(*config, block_size, num_blocks, kv_dtype));
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return st.is_ok() ? std::move(backend) : nullptr;
}

// Hands out pages 1, 2, 3, ... (block 0 is the null block).
struct PageCounter {
  int next = 1;
};

// One sequence's state: its page table and how many tokens it holds (entries == positions here).
struct TestSequence {
  uint64_t id = 0;
  std::vector<BlockId> table;
  int num_entries = 0;
  SamplingParams sampling;

  explicit TestSequence(uint64_t id_) : id(id_) { sampling.temperature = 0.0f; }
  void reserve(int entries, int block_size, PageCounter* pages) {
    while (static_cast<int>(table.size()) * block_size < entries) table.push_back(pages->next++);
  }
};

struct StepPart {
  TestSequence* seq = nullptr;
  std::vector<int32_t> tokens;
  LogitsMode mode = LogitsMode::kLast;
};

// Runs one step of several sequences' token chunks; advances each sequence's length.
inline StepOutput run_step(Backend& backend, const std::vector<StepPart>& parts, int block_size, PageCounter* pages) {
  ForwardBatch batch;
  for (const StepPart& part : parts) {
    TestSequence& s = *part.seq;
    s.reserve(s.num_entries + static_cast<int>(part.tokens.size()), block_size, pages);
    SequenceInput in;
    in.request_id = s.id;
    in.query_start = static_cast<int>(batch.token_ids.size());
    in.num_query_tokens = static_cast<int>(part.tokens.size());
    in.start_position = s.num_entries;
    in.num_cached_entries = s.num_entries;
    in.block_table = &s.table;
    in.logits_mode = part.mode;
    in.sampling = &s.sampling;
    in.sample_index = 0;
    for (size_t i = 0; i < part.tokens.size(); ++i) {
      batch.token_ids.push_back(part.tokens[i]);
      batch.positions.push_back(s.num_entries + static_cast<int>(i));
    }
    batch.sequences.push_back(in);
  }
  StepOutput out;
  Status st = backend.execute(batch, &out);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  for (const StepPart& part : parts) part.seq->num_entries += static_cast<int>(part.tokens.size());
  return out;
}

// The last row of a kAll output.
inline std::vector<float> last_row(const std::vector<float>& all_logits, int vocab) {
  return std::vector<float>(all_logits.end() - vocab, all_logits.end());
}

}  // namespace origami::test
