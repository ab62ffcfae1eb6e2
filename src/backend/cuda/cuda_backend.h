#pragma once
// The CUDA backend: bf16 weights and paged KV on one GPU, fp32 accumulation, cuBLAS GEMMs, own
// kernels for the rest, CUDA graphs for decode steps. Step inputs travel through pinned host
// buffers in one copy; the only synchronisation of a step is the copy of the sampled tokens back,
// which launch() / finish_launched() split so that the next step is enqueued before it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/forward_batch_validation.h"
#include "backend/page_table_inputs.h"
#include "backend/compression_stepper.h"
#include "backend/layer_trace.h"
#include "backend/cuda/cuda_compression.h"
#include "backend/cuda/cuda_graph_runner.h"
#include "backend/cuda/fp8_fused_kernels.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/linear_weights.h"
#include "backend/cuda/nccl_library.h"
#include "backend/cuda/paged_attention.h"
#include "backend/cuda/peer_all_reduce.h"
#include "backend/cuda/ragged_heads.h"
#include "backend/cuda/sampling_kernels.h"
#include "backend/cuda/sink_gate.h"
#include "backend/cuda/step_input_upload.h"

namespace origami::cuda {

struct ShardArgmax;  // tensor_parallel_kernels.h

// This backend's share of a tensor-parallel group (backend/cuda/tensor_parallel_backend.h). Rank
// `rank` of `size` holds 1/size of the attention heads (whole KV heads, with their query heads and
// their KV cache), of the MLP, and of the vocabulary (embedding and LM head rows), Megatron-style:
// q/k/v and gate/up are split by output rows, o and down by input columns, and the partial sums
// of o, down and the embedding are all-reduced. Size 1 is the whole model on one GPU.
struct TensorParallelRank {
  int rank = 0;
  int size = 1;
  const NcclCommunicators* comms = nullptr;  // every rank's communicator; set when size > 1
  // The ranks' compressors (joint selection over every rank's heads).
  CompressorPeers* compressor_peers = nullptr;
  // The ranks' peer all-reduce buffers (peer_all_reduce.h), null where the GPUs cannot reach each
  // other's memory or BackendOptions::tensor_parallel_reduce is not kPeer.
  PeerReduceGroup* peer_group = nullptr;
};

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options, TensorParallelRank tp = {});
  // Whether `config` splits over `size` ranks: whole KV heads per rank, and heads and the MLP
  // divisible by it. Checked before anything is allocated.
  static Status check_tensor_parallel(const ModelConfig& config, int size);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  Status load(const ModelConfig& config, const ModelWeights& weights) override;
  // Random bf16 weights generated on the device (normal(0, 0.02), norms = 1): benchmarks of 8B and
  // larger shapes without host memory for the weights. Deterministic in `seed`.
  Status load_dummy(const ModelConfig& config, uint64_t seed) override;
  size_t available_kv_bytes(size_t requested_bytes) const override;
  Status allocate_kv_cache(const KVLayout& layout) override;
  Status execute(const ForwardBatch& batch, StepOutput* out) override;
  // Asynchronous scheduling: up to kLaunchSlots steps enqueued on the stream and not yet read
  // back. A batch's pending tokens are gathered on the device from the sampled tokens of the step
  // launched before it.
  bool launches_asynchronously() const override { return true; }
  Status launch(const ForwardBatch& batch, StepOutput* out) override;
  Status finish_launched(StepOutput* out) override;
  void copy_block(int group, BlockId src, BlockId dst) override;

  // KV compression (cuda_compression.h): query capture in the forward pass (also inside graphs:
  // each token's destination row is a step input), jobs on a separate stream.
  Status configure_compression(const CompressionConfig& config) override;
  size_t query_slot_bytes(int max_window) const override;
  KVCompressor* compressor() override { return compressor_.get(); }
  // Fast KVzip (sink_gate.h): from now on every layer's forward also writes each new entry's gate
  // score into F (checked like the CPU backend's; compression with global scores configured first).
  Status load_gates(const gates::GateWeights& gates) override;
  // Runtime allocations (kLayer / kGlobal): the compressor selects a request's heads jointly on
  // the device (joint_selection.h) and reports each group's count with the batch.
  bool selects_jointly() const override { return true; }

  // Device storage, for tests: one layer's K or V [num_blocks, num_kv_heads, block_size, head_dim]
  // (head groups: the pool's K / V of page 0, pages [2, H_p, block_size, head_dim] apart),
  // the query cache [L, M, max_window, h_q, d] and the global scores [L, num_blocks, h_kv, block_size].
  // bf16 cache only (null with --kv-cache-dtype fp8).
  const __nv_bfloat16* k_cache(int layer) const { return k_cache_[layer]; }
  const __nv_bfloat16* v_cache(int layer) const { return v_cache_[layer]; }
  // FP8 cache only: one layer's codes (same element offsets as above) and scales (offset / head_dim).
  const uint8_t* k_codes(int layer) const { return k_codes_[layer]; }
  const uint8_t* v_codes(int layer) const { return v_codes_[layer]; }
  const float* k_scales(int layer) const { return k_scales_[layer]; }
  const float* v_scales(int layer) const { return v_scales_[layer]; }
  const __nv_bfloat16* query_cache() const { return compressor_ ? compressor_->query_cache() : nullptr; }
  const float* global_scores() const { return compressor_ ? compressor_->global_scores() : nullptr; }
  void synchronize() const;  // the backend's stream

  // Steps that replayed a graph, and graphs captured so far (for tests and metrics).
  int64_t num_graph_steps() const { return num_graph_steps_; }
  // Steps whose decode attention ran the balanced FP8 kernel (BackendOptions::balanced_attention).
  int64_t num_balanced_attention_steps() const { return num_balanced_attention_steps_; }
  // Mixed steps whose decode rows ran the decode kernels (BackendOptions::mixed_decode_attention).
  int64_t num_mixed_attention_steps() const { return num_mixed_attention_steps_; }
  // Steps whose inputs went over the copy stream while the step before ran (StepInputUpload).
  int64_t num_staged_uploads() const { return input_upload_.num_staged_uploads(); }
  int num_graphs() const { return graphs_.num_graphs(); }

  // Tensor parallelism with peer all-reduce: this rank's buffers registered in tp.peer_group (on
  // every rank first), then peer access to the other ranks (connect, on every rank). A failure
  // leaves this rank on NCCL; the caller keeps every rank on the same path.
  Status init_peer_reduce();
  Status connect_peer_reduce();
  void drop_peer_reduce() { peer_.reset(); }

  // Records the next eager steps layer by layer into `trace` (null: stop); steps run without CUDA
  // graphs while a trace is attached. The caller owns it.
  void set_layer_trace(LayerTrace* trace) { trace_ = trace; }

 private:
  // How a step runs, decided with its page tables flattened into host_inputs_ by prepare_step,
  // before launch() starts any compression: a batch whose tables are wrong fails with nothing
  // enqueued.
  struct StepShape {
    std::chrono::steady_clock::time_point entered;  // launch()'s start (StepOutput::prepare_seconds)
    bool use_graph = false;
    int run_seqs = 0;    // sequences (rows) the step runs: a graph's bucket, or the batch's
    int run_tokens = 0;  // tokens it runs (a graph: one per row)
    int max_kv_len = 0;  // the longest (group, sequence) row after the step
    int num_pages = 0;   // page_indices written, padding rows included
  };
  // What finish_launched() needs of one sequence of a launched step: its row among the step's
  // sampled rows (-1: LogitsMode::kNone, nothing sampled) and which log-probabilities it asked for.
  struct SampledRow {
    int row = -1;
    bool token_logprob = false;
    int num_top_logprobs = -1;
  };
  // One launched step until finish_launched() reads it. Slots alternate, so the step launched
  // before the newest is always in the other slot; each has its own pinned result buffers and
  // events, since the next step's result copies may be queued before this step's are read.
  struct LaunchSlot {
    bool busy = false;      // launched, not yet finished
    bool has_work = false;  // the step had sequences: its events were recorded, its results copied
    cudaEvent_t start = nullptr, end = nullptr;  // its span on the device (StepOutput::device_seconds)
    int capacity = 0;       // rows of the pinned buffers below
    int32_t* tokens = nullptr;       // [capacity] sampled tokens
    float* logprobs = nullptr;       // [capacity] log p(logprob_token or the sampled token)
    TopLogprob* top = nullptr;       // [capacity, kMaxTopLogprobs] top log-probabilities
    std::vector<SampledRow> rows;    // per sequence of the step's batch; kept after finishing
  };
  static constexpr int kLaunchSlots = 2;
  // launch() into `slot`: validates and prepares the batch, starts its compressions and enqueues
  // its forward pass with the result copies; a failed forward pass reports the compressions that
  // finished meanwhile (no finish_launched() follows it).
  Status enqueue_step(const ForwardBatch& batch, LaunchSlot& slot, StepOutput* out);
  Status prepare_step(const ForwardBatch& batch, const ForwardBatchLimits& limits, StepShape* shape);
  // Checks the batch's pending tokens against the previous launched step and stages their
  // (token index, sample row) pairs in host_pending_ (after the previous upload was read).
  Status stage_pending_tokens(const ForwardBatch& batch);
  // The model step proper over a prepared step, enqueued with its result copies into `slot`
  // (launch() validates and prepares the batch and wraps it with its compressions).
  Status forward(const ForwardBatch& batch, const StepShape& step, LaunchSlot& slot, StepOutput* out);
  // Waits for the step of a launched slot and fills `out` from its pinned results.
  Status read_results(const LaunchSlot& slot, StepOutput* out) const;
  Status ensure_slot_capacity(LaunchSlot& slot, int rows);
  Status ensure_pending_capacity(size_t pairs);
  using bf16 = __nv_bfloat16;
  struct Layer {
    bf16* input_norm = nullptr;      // [hidden]
    bf16* post_attn_norm = nullptr;  // [hidden]
    bf16* q_norm = nullptr;          // [head_dim] (Qwen3) or null
    bf16* k_norm = nullptr;
    LinearWeights qkv;               // [q_size + 2 * kv_size, hidden]
    bf16* qkv_bias = nullptr;        // [q_size + 2 * kv_size] (Qwen2) or null
    LinearWeights o;                 // [hidden, q_size]
    LinearWeights gate_up;           // [2 * intermediate, hidden]
    LinearWeights down;              // [hidden, intermediate]
  };
  // Capacities of the step buffers; growing one drops the captured graphs.
  struct Capacity {
    int tokens = 0;
    int seqs = 0;
    int pages = 0;
  };
  // Offsets (in int32 elements) of the step-input regions in the packed input buffer.
  struct InputLayout {
    size_t tokens, positions, slots, query_rows, q_indptr, page_indptr, kv_len, sample_rows, page_indices, total;
    // A mixed step split in two attention launches (MixedAttentionPlan): the q_indptr of the
    // sequences after the leading decode rows, from their first token.
    size_t rest_q_indptr;
  };

  Status check_config(const ModelConfig& config) const;
  Status allocate_weights(const ModelConfig& config);
  Status ensure_capacity(int tokens, int seqs, int pages);
  Status ensure_attention_workspace(size_t bytes);
  Status ensure_adjustment_capacity(size_t entries);
  InputLayout input_layout(const Capacity& cap) const;
  // Enqueues the forward pass and the sampling of `num_sample_rows` rows.
  // capture_queries: copy each layer's queries into the query cache rows of the step input
  // query_rows (set whenever compression is configured and a graph is captured, since the graph
  // must serve steps that capture).
  // uniform_splits: the uniform plan's split count, which picks the head groups' split map;
  // split_map: that map (true) or plain splits, every head uniform_splits (RaggedHeadTables::use_split_map).
  // shard_greedy (tensor parallelism, every row greedy with no logit adjustments or log-probs):
  // each rank's argmax over its vocabulary shard, merged, instead of all-gathering the logits.
  // attention: its decode_seqs 0 and `rest` the step's plan, or a mixed step's two launches.
  void record_step(int num_tokens, int num_seqs, int num_sample_rows, const MixedAttentionPlan& attention, int uniform_splits,
                   bool split_map, bool capture_queries, bool shard_greedy);
  // Greedy tokens of `rows` rows of logit_hidden_ into dev_tokens_ + r0 (the shard_greedy path).
  void sample_greedy_sharded(int rows, int r0);
  Status compute_all_logits(const ForwardBatch& batch, StepOutput* out);
  // LM head over `rows` hidden states (bf16 [rows, hidden]): fp32 logits of the whole vocabulary
  // in logits_, rows logits_stride() apart (with tensor parallelism: this rank's shard, gathered).
  void lm_head_logits(const bf16* hidden, int rows);
  int logits_stride() const { return tp_.size * vocab_shard_; }
  // In-place sum over the tensor-parallel ranks (no-op on one GPU).
  void all_reduce(void* buffer, size_t count, NcclDataType type);
  // Where the next output projection (o, down) writes: this rank's partial sums.
  bf16* projection_out(int num_tokens) const { return peer_reduces(num_tokens) ? peer_->partial() : delta_; }
  bool peer_reduces(int num_tokens) const { return peer_ != nullptr && peer_->covers(num_tokens); }
  // residual += the ranks' sum of the last projection_out() (none at the first layer: has_delta
  // false); normed_ = rmsnorm(residual) * weight. `traced`: the trace's slot of that delta, or null.
  // `consumer`: the projection that reads normed_ next; where fp8_quantizes_in_producer(*consumer)
  // and the norm runs here (not in the peer all-reduce), its input is quantized into fp8_x_ as
  // well, and normed_ is written only if `keep_normed`. Returns whether it quantized (the
  // consumer's linear() then takes x_quantized).
  bool add_rmsnorm(bool has_delta, const bf16* weight, int num_tokens, LayerTrace::Sublayer* traced,
                   const LinearWeights* consumer = nullptr, bool keep_normed = true);
  // Trace: this rank's partial sum of `w` over x, in fp32 and as the step has it in `partial`.
  void trace_partial(const bf16* x, int k, const LinearWeights& w, int num_tokens, const bf16* partial,
                     LayerTrace::Sublayer* traced);
  std::vector<float> download_f32(const float* device, size_t count) const;  // synchronizes the stream
  bf16* device_alloc_bf16(size_t count);
  void* device_alloc(size_t bytes);
  // A projection's storage: bf16, or (fp8_) E4M3 codes, per-channel scales and a static input
  // scale slot. Null data when out of memory.
  LinearWeights alloc_linear(size_t rows, size_t cols);
  // y [m, n] = x [m, k] . W^T: the bf16 GEMM, or (FP8 weights) x quantized per token (or with
  // the static scale) into fp8_x_ and the FP8 GEMM. x_quantized: x's producer already wrote its
  // codes and scales into fp8_x_ / fp8_x_scales_ (x is then not read).
  void linear(const bf16* x, int m, int k, const LinearWeights& w, int n, bf16* y, bool x_quantized = false);
  // Whether the producer of w's input quantizes it itself this step (BackendOptions::fuse_fp8_quantize):
  // FP8 weights, and no layer trace (traced steps keep every bf16 activation).
  bool fp8_quantizes_in_producer(const LinearWeights& w) const {
    return options_.fuse_fp8_quantize && w.fp8() && trace_ == nullptr;
  }
  // Where a producer that quantizes for w writes: fp8_x_, fp8_x_scales_ and w's static input scale.
  Fp8RowsOut fp8_rows_out(const LinearWeights& w) const { return Fp8RowsOut{fp8_x_, fp8_x_scales_, w.input_scale}; }

  BackendOptions options_;
  TensorParallelRank tp_;
  // This rank's share of the model: heads, KV heads and intermediate size divided by tp_.size;
  // vocab_size stays the whole vocabulary (sampling and validation), vocab_shard_ is this rank's rows.
  ModelConfig config_;
  int vocab_shard_ = 0;
  bool loaded_ = false;
  cudaStream_t stream_ = nullptr;
  int num_sms_ = 0;
  std::unique_ptr<Gemm> gemm_;
  // FP8 projections (uses_fp8): the cuBLASLt GEMM. Its epilogue path (steps of at most
  // Fp8Gemm::kEpilogueMaxRows tokens, and every step where this cuBLASLt lacks outer-vector
  // scaling: fp8_epilogue_) needs the fp32 product in fp8_acc_.
  bool fp8_ = false;
  bool fp8_epilogue_ = false;
  std::unique_ptr<Fp8Gemm> fp8_gemm_;
  std::vector<void*> allocations_;  // weights, freed at destruction

  bf16* embed_ = nullptr;        // [vocab_shard, hidden]
  bf16* lm_head_ = nullptr;      // [vocab_shard, hidden] (== embed_ when tied)
  bf16* final_norm_ = nullptr;   // [hidden]
  std::vector<Layer> layers_;
  float* inv_freq_ = nullptr;    // [head_dim / 2]

  KVLayout kv_layout_;
  void* kv_pool_ = nullptr;
  std::vector<bf16*> k_cache_, v_cache_;  // per layer [num_blocks, num_kv_heads, block_size, head_dim]
  size_t kv_layer_elems_ = 0;             // full layout: one layer's K (or V); head groups: 0
  // FP8 cache (--kv-cache-dtype fp8): the pool holds E4M3 codes at the element offsets a bf16
  // pool would use (1 byte each), then one fp32 scale per head row at element offset / head_dim
  // (kv_cache_write.h); k_cache_ / v_cache_ are then null, as these are with a bf16 cache.
  bool kv_fp8_ = false;
  std::vector<uint8_t*> k_codes_, v_codes_;
  std::vector<float*> k_scales_, v_scales_;
  // Head groups (KVLayout::grouped): every group has its own table and length per request, so the
  // step inputs carry num_groups_ tables per sequence (group-major) and a slot per (group, token);
  // pages [2, H_p, block_size, head_dim] of one shared pool, kv_page_elems_ elements each.
  int num_groups_ = 1;
  long long kv_page_elems_ = 0;
  RaggedHeadTables ragged_;
  PageTableInputs page_tables_;  // the step's tables flattened into host_inputs_ (prepare_step)
  // Launched steps, oldest first from (next_slot_ - num_launched_) mod kLaunchSlots.
  std::array<LaunchSlot, kLaunchSlots> slots_;
  int next_slot_ = 0;
  int num_launched_ = 0;
  // The slot of the step launched last, whose sampled tokens are in dev_tokens_ for the next
  // step's pending tokens; -1 when none (before the first launch, after a failed one, after the
  // KV cache was allocated again).
  int previous_slot_ = -1;
  // Recorded after a step's host-to-device copies: the host staging buffers (host_inputs_,
  // host_params_, host_adjust_, host_pending_) are written again only once it has passed.
  cudaEvent_t inputs_uploaded_ = nullptr;  // the small uploads (sampling parameters, adjustments, pending tokens)
  StepInputUpload input_upload_;            // the step inputs: tokens, slots, page tables, lengths
  bool overlap_input_upload_ = true;  // ORIGAMI_OVERLAP_INPUT_UPLOAD=0 turns it off

  // Activations, [capacity.tokens, ...].
  Capacity cap_;
  float* residual_ = nullptr;  // [tokens, hidden] fp32
  bf16* normed_ = nullptr;     // [tokens, hidden]
  bf16* qkv_ = nullptr;        // [tokens, q_size + 2 * kv_size]
  bf16* q_ = nullptr;          // [tokens, num_heads, head_dim]
  bf16* k_ = nullptr;          // [tokens, num_kv_heads, head_dim]; null where the RoPE kernel
  bf16* v_ = nullptr;          // writes the KV cache itself (qk_norm_rope_writes_kv)
  bf16* attn_out_ = nullptr;   // [tokens, q_size]
  bf16* delta_ = nullptr;      // [tokens, hidden] (tensor parallelism: partial sums reduced by NCCL)
  std::unique_ptr<PeerAllReduce> peer_;  // tensor parallelism's fused reduction, where it runs
  LayerTrace* trace_ = nullptr;
  bf16* gate_up_ = nullptr;    // [tokens, 2 * intermediate]
  bf16* act_ = nullptr;        // [tokens, intermediate]
  uint8_t* fp8_x_ = nullptr;   // FP8: [tokens, widest projection input] E4M3 activations
  float* fp8_x_scales_ = nullptr;  // FP8: [tokens] their per-token scales
  float* fp8_acc_ = nullptr;   // FP8 epilogue path: [rows, widest projection output] fp32
  // Rows of logits computed per lm_head GEMM: each GEMM reads the whole lm_head (1 GB in bf16 at a
  // 128k vocabulary), so at max load fewer, larger chunks are faster (H100, Llama-3.1-8B, FP8: decode
  // step at batch 472 1.007x and at 1024 1.009x with 512 against 256); the fp32 logits then take
  // 263 MB instead of 131 MB.
  static constexpr int kLogitRows = 512;
  bf16* logit_hidden_ = nullptr;  // [kLogitRows, hidden]
  float* logits_ = nullptr;       // [kLogitRows, logits_stride()]
  float* logits_shard_ = nullptr;     // tensor parallel: [kLogitRows, vocab_shard] of this rank
  float* logits_gathered_ = nullptr;  // tensor parallel: [size, kLogitRows, vocab_shard]
  // Tensor parallel, greedy-only steps: this rank's argmax per row and every rank's, gathered.
  ShardArgmax* shard_best_ = nullptr;           // [kLogitRows]
  ShardArgmax* shard_best_gathered_ = nullptr;  // [size, kLogitRows]
  void* attn_workspace_ = nullptr;
  size_t attn_workspace_bytes_ = 0;
  // Decode attention's split arrival counters (AttentionArgs::split_counters), zero between
  // launches: the last CTA of each unit merges its splits, so no merge kernel runs.
  int32_t* split_counters_ = nullptr;

  // Step inputs: pinned host staging and its device twin, one copy per step.
  int32_t* host_inputs_ = nullptr;
  int32_t* dev_inputs_ = nullptr;
  RowSamplingParams* host_params_ = nullptr;  // [seqs]
  RowSamplingParams* dev_params_ = nullptr;
  // The sampled rows' results ([seqs], [seqs], [seqs, kMaxTopLogprobs]), copied into the step's
  // LaunchSlot. dev_tokens_ outlives the step: the next one gathers its pending tokens from it.
  int32_t* dev_tokens_ = nullptr;
  float* dev_logprobs_ = nullptr;
  TopLogprob* dev_top_ = nullptr;
  // Pending tokens (ForwardBatch::pending_tokens) as (token index, sample row of the previous
  // step) pairs, pinned staging and device twin, grown by ensure_pending_capacity().
  int2* host_pending_ = nullptr;
  int2* dev_pending_ = nullptr;
  size_t pending_capacity_ = 0;
  int num_pending_ = 0;  // pairs staged for the step being launched
  // The step's logit adjustments (penalties, logit_bias, min_tokens), every sampled row's slice
  // back to back (RowSamplingParams::adjust_begin), and the device scratch holding the raw
  // logits they replace while the sampling kernel runs. Grown (never shrunk) by
  // ensure_adjustment_capacity(), which drops the captured graphs that point at the old buffers.
  LogitAdjustment* host_adjust_ = nullptr;  // pinned
  LogitAdjustment* dev_adjust_ = nullptr;
  float* dev_adjust_saved_ = nullptr;
  size_t adjust_capacity_ = 0;  // entries

  std::unique_ptr<CudaCompressor> compressor_;  // null until configure_compression()
  DeviceSinkGates gates_;                       // not loaded: no gate scores are written
  CompressionStepper compressions_;

  CudaGraphRunner graphs_;
  int graph_max_kv_len_ = 0;
  int64_t num_graph_steps_ = 0;
  int64_t num_balanced_attention_steps_ = 0;
  int64_t num_mixed_attention_steps_ = 0;
};

}  // namespace origami::cuda
