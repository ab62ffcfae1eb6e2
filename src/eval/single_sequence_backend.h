#pragma once
// A CPU backend holding a model and one full-KV page table: how the offline scorers (TANGRAM's
// calibration, KVzip's reconstruction scores for gate training) run the model on a document,
// one sequence at a time, without an engine.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/status.h"
#include "model/config.h"

namespace origami::eval {

class SingleSequenceBackend {
 public:
  // Loads the weights of `model_dir` (whose config is `config`) on a CPU backend with
  // `num_threads` threads (0 = all cores) and a cache of pages 1 .. ceil(max_tokens / block_size)
  // (block 0 is the null block). max_tokens may exceed the model's context (KVzip's reconstruction
  // runs past it); callers that must not say so themselves.
  static Expected<std::unique_ptr<SingleSequenceBackend>> create(const std::string& model_dir,
                                                                 const ModelConfig& config, int max_tokens,
                                                                 int num_threads);

  // One step computing `tokens` at positions start .. start + size - 1 over the sequence's first
  // `start` cached entries (entries from `start` on are overwritten). With query_slot >= 0 the
  // queries of entries >= capture_from are captured into that slot (configure_compression first).
  // first_position >= 0 places the tokens at positions first_position.. instead (RoPE only: they
  // still go to slots start.. and attend to the first `start` entries).
  Status run(const std::vector<int32_t>& tokens, int start, int query_slot = -1, int capture_from = 0,
             int first_position = -1);

  CpuBackend& backend() { return *backend_; }
  const std::vector<BlockId>& block_table() const { return table_; }
  int block_size() const { return block_size_; }
  int max_tokens() const { return max_tokens_; }

 private:
  SingleSequenceBackend() = default;

  int block_size_ = 16;
  int max_tokens_ = 0;
  std::unique_ptr<CpuBackend> backend_;
  std::vector<BlockId> table_;
};

}  // namespace origami::eval
