#pragma once
// The reference backend: the whole forward pass in fp32 on the CPU over the paged KV cache.
// It is the oracle the CUDA backend is tested against, so every step is written to be exact and
// batch-invariant: a sequence's logits are bit-identical whatever else is in the batch, however
// its prompt is chunked and whatever the page size.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/layer_trace.h"
#include "backend/compression_stepper.h"
#include "backend/cpu/cpu_compression.h"
#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_kv_cache.h"
#include "backend/cpu/cpu_thread_pool.h"

namespace origami {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options);

  std::string name() const override { return "cpu"; }
  Status load(const ModelConfig& config, const ModelWeights& weights) override;
  size_t available_kv_bytes(size_t requested_bytes) const override;
  // fp32 entries whatever the KV dtype (narrower ones are emulated: cpu/cpu_kv_cache.h).
  size_t kv_page_bytes(const KVLayout& layout) const override;
  Status allocate_kv_cache(const KVLayout& layout) override;
  Status execute(const ForwardBatch& batch, StepOutput* out) override;
  void copy_block(int group, BlockId src, BlockId dst) override;

  // Compression (cpu_compression.h): synchronous, spread over the pool by (layer, KV head).
  Status configure_compression(const CompressionConfig& config) override;
  size_t query_slot_bytes(int max_window) const override;
  KVCompressor* compressor() override { return compressor_.get(); }
  // Fast KVzip: every KV entry written from now on gets its gate score in F (gates/).
  Status load_gates(const gates::GateWeights& gates) override;
  // KVzip compressions (cpu_reconstruction.cpp): each job's reconstruction runs on a private copy
  // of its entries before the compressor selects by the scores.
  bool runs_reconstruction() const override { return true; }
  // Runtime allocations (AdaKV per layer, one global threshold): run_compression's joint selection.
  bool selects_jointly() const override { return true; }

  int num_threads() const { return pool_->num_threads(); }
  const ModelConfig& config() const { return config_; }
  // The paged storage, for tests and for CPU twins of cache-editing kernels.
  cpu::CpuKVCache& kv_cache() { return kv_; }
  // Records the residual stream after every layer of the next steps into `trace` (null: stop),
  // the fp32 reference of layer_trace.h. The caller owns it.
  void set_layer_trace(LayerTrace* trace) { trace_ = trace; }

  // One layer's attention inputs as the forward pass computes them, rows in the batch's token
  // order: the normed hidden state the q/k/v projections read (Fast KVzip's gate input) and the
  // q|k|v rows after q/k norm and RoPE (the queries and keys attention uses).
  struct LayerActivations {
    int layer = 0;
    int num_tokens = 0;
    const float* normed_input = nullptr;  // [num_tokens, hidden]
    const float* qkv = nullptr;           // [num_tokens, q_size + 2 * kv_size]
    int qkv_width = 0;
  };
  // Called for every layer of every step, before the layer's new keys and values are written to
  // the cache (offline scoring: KVzip targets, gate training); empty = none.
  void set_layer_observer(std::function<void(const LayerActivations&)> observer) {
    layer_observer_ = std::move(observer);
  }

  // KVzip's reconstruction of a sequence's first num_entries cached entries (block_table in this
  // backend's cache), whose tokens are context_tokens: one pass after them (chunk_size 0, or at
  // least num_entries), or ceil(num_entries / chunk_size) chunks of equal length, each in a
  // private cache holding the first num_sinks entries (re-rotated to the positions just before
  // the chunk) and the chunk, the model reading `prompt` then the chunk's tokens at the positions
  // right after the chunk, so that every query-key distance stays within sinks + 2 chunk +
  // prompt however long the context (cpu_reconstruction.cpp).
  struct KVzipReconstruction {
    const std::vector<BlockId>* block_table = nullptr;
    int num_entries = 0;
    const int32_t* context_tokens = nullptr;  // num_entries tokens
    std::vector<int32_t> prompt;              // the repeat prompt and its suffix
    int chunk_size = 0;
    int num_sinks = 4;
  };
  // scores: [layer][KV head][entry] flattened, num_entries per head, zeroed by the caller; each
  // chunk entry gets the largest attention probability any reconstruction query (any query head
  // of its GQA group) gives it over sinks + chunk + reconstruction. The source pages are only read.
  Status kvzip_reconstruction(const KVzipReconstruction& reconstruction, float* scores);

 private:
  // A Linear layer in HF layout; several projections that read the same input are stacked
  // row-wise into one weight (q|k|v, gate|up) so they take one GEMM.
  struct Linear {
    std::vector<float> weight;  // [out_features, in_features]
    std::vector<float> bias;    // [out_features] or empty
    int out_features = 0;
    int in_features = 0;
    // FP8 (--quantization fp8): `weight` holds the dequantized E4M3 weight, and the input rows are
    // rounded to E4M3 first, per token (input_scale 0) or with this static scale, so that the fp32
    // GEMM multiplies exactly the operands of the CUDA backend's FP8 GEMM.
    bool fp8 = false;
    float input_scale = 0.0f;
  };
  struct Layer {
    std::vector<float> input_norm;      // [hidden]
    std::vector<float> post_attn_norm;  // [hidden]
    std::vector<float> q_norm, k_norm;  // [head_dim] (Qwen3) or empty
    Linear qkv;      // [q_size + 2 * kv_size, hidden]
    Linear o;        // [hidden, q_size]
    Linear gate_up;  // [2 * intermediate, hidden]
    Linear down;     // [hidden, intermediate]
  };
  // Per-step activations, kept between steps so that decoding does not reallocate.
  struct Workspace {
    std::vector<float> x;         // [num_tokens, hidden] residual stream
    std::vector<float> h;         // [num_tokens, hidden] normed input / projection output
    std::vector<float> qkv;       // [num_tokens, q_size + 2 * kv_size]
    std::vector<float> attn;      // [num_tokens, q_size]
    std::vector<float> gate_up;   // [num_tokens, 2 * intermediate]
    std::vector<float> act;       // [num_tokens, intermediate]
    std::vector<float> rope_cos;  // [num_tokens, head_dim / 2]
    std::vector<float> rope_sin;  // [num_tokens, head_dim / 2]
    mutable std::vector<float> fp8_input;  // [num_tokens, widest input]: FP8-rounded GEMM input
  };

  Status validate(const ForwardBatch& batch) const;
  // The page table and cached length of head group `group` in a sequence (group 0: block_table).
  static cpu::HeadTable group_table(const SequenceInput& seq, int group);
  // The model step proper (execute() wraps it with the step's compressions).
  Status forward(const ForwardBatch& batch, StepOutput* out);
  void linear(const Linear& layer, int num_rows, const float* in, float* out) const;
  void run_layer(int layer_idx, const ForwardBatch& batch, int num_tokens);
  // Writes the layer's post-RoPE queries of capturing sequences into their query slots.
  void capture_queries(int layer_idx, const ForwardBatch& batch);
  // Writes the gate score of every new entry of the layer into F, at the entry's slot of its
  // head's table (gates loaded and global-score pages allocated).
  void write_gate_scores(int layer_idx, const ForwardBatch& batch, int num_tokens,
                         const std::vector<std::vector<cpu::HeadTable>>& tables);
  // KVzip's scores of a job's entries, [layer][KV head][entry] flattened: kvzip_reconstruction()
  // of its entries, in chunks of recipe->reconstruction_chunk (cpu_reconstruction.cpp).
  Status reconstruction_scores(const CompressionJob& job, std::vector<float>* scores);
  // Runs fn(t) for every token row; on the pool only for long prefills (row work is cheap).
  void for_rows(int num_tokens, const std::function<void(int)>& fn);

  // FP8 layers (uses_fp8): the projections from the checkpoint (bf16: quantized per channel).
  Status load_fp8_linears(const LayerWeights& lw, Layer* layer) const;

  std::unique_ptr<cpu::ThreadPool> pool_;
  BackendOptions options_;
  bool loaded_ = false;
  ModelConfig config_;
  std::vector<float> embed_;    // [vocab, hidden]
  std::vector<float> lm_head_;  // [vocab, hidden]; empty when tied to embed_
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  cpu::CpuKVCache kv_;
  Workspace ws_;
  std::unique_ptr<cpu::CpuCompressor> compressor_;  // null until configure_compression()
  CompressionStepper compressions_;
  std::function<void(const LayerActivations&)> layer_observer_;
  std::unique_ptr<gates::GateWeights> gates_;  // null: no gate scores are written
  std::vector<float> gate_rows_;               // [num_tokens, num_kv_heads] of the current layer
  cpu::CpuKVCache scratch_;                    // KVzip reconstructions (swapped in for kv_)
  LayerTrace* trace_ = nullptr;
};

}  // namespace origami
