#pragma once
// What a compute backend does: hold the weights and the paged KV storage, and run one step.
// The CPU backend (fp32, the test oracle) and the CUDA backend implement the same interface and
// are driven by the same scheduler, KV manager and sampler semantics.
#include <memory>
#include <string>

#include "backend/forward_batch.h"
#include "backend/kv_compressor.h"
#include "core/status.h"
#include "gates/gate_weights.h"
#include "kv/compression.h"
#include "kv/kv_layout.h"
#include "model/config.h"
#include "model/weights.h"

namespace origami {

struct BackendOptions {
  std::string device = "cpu";  // "cpu" or "cuda"
  int num_threads = 0;         // CPU: 0 = all cores
  float gpu_memory_utilization = 0.9f;  // CUDA: share of device memory the engine may take
  bool enable_cuda_graphs = true;
  // CUDA: GPUs the model is split over (Megatron-style tensor parallelism over NCCL).
  int tensor_parallel_size = 1;
  // How the ranks sum each layer's partial outputs: kPeer, a one-shot all-reduce over peer memory
  // fused with the residual add and norm (peer_all_reduce.h), where the GPUs reach each other's
  // memory and the step has at most PeerAllReduce::kMaxTokens rows, else NCCL: each rank pushes its
  // partials into the others' memory at decode's row counts and pulls them above; kPeerPull the
  // same, always pulling (the benchmarks' comparison); kNccl always NCCL
  // (--disable-custom-all-reduce); kSkipForTiming none at all, for benchmarks that time the rest of
  // the step (its outputs are wrong).
  enum class TensorParallelReduce { kPeer, kPeerPull, kNccl, kSkipForTiming };
  TensorParallelReduce tensor_parallel_reduce = TensorParallelReduce::kPeer;
  // kFp8 (--quantization fp8): the q/k/v/o/gate/up/down projections run in FP8 E4M3 with per-channel
  // weight scales and per-token (or the checkpoint's static) activation scales; a bf16 checkpoint
  // is quantized as it loads. An FP8 checkpoint (ModelConfig::quantization) runs in FP8 whatever
  // this says. The CPU backend emulates it exactly (fp32 GEMMs over the dequantized operands).
  WeightQuantization quantization = WeightQuantization::kNone;
  // FP8 GEMMs with fast accumulation (--fp8-fast-accumulation; cuda/fp8_gemm.h): the whole K sum
  // in the tensor cores' accumulator instead of promoted to fp32 every few instructions. Off: on
  // the H100 it makes the layer's GEMMs 1.11-1.14x faster at m >= 512 but moves tiny-qwen3's
  // perplexity by +1.0% against the promoted sums (docs/kernels.md, docs/fidelity.md).
  bool fp8_fast_accumulation = false;
  // CUDA, FP8 projections (--fp8-fused-quantize): the RMSNorm before q|k|v and gate|up and the
  // SiLU-and-multiply before down write the E4M3 codes and per-token scales of their output
  // themselves (backend/cuda/fp8_fused_kernels.h), saving the separate quantize launch and its two
  // reads of the bf16 row per projection. The outputs are bit for bit the same; on by default since
  // the H100 measured it faster (decode step 1-3% at batch 64-256, docs/kernels.md).
  bool fuse_fp8_quantize = true;
  // CUDA, FP8 projections (--fp8-gemv-rows): products of 1 to this many rows (decode at batch 1-2;
  // at most 4, 0 = never) by a GEMV that streams the weights (cuda/fp8_gemv.h) instead of
  // cuBLASLt's tensor-core tiles, which reach 56-65% of the copy bandwidth there. fp32 sums of exact
  // products, closer to the CPU's emulation than cuBLASLt. 2 by default: the H100 measured it
  // faster at 1 and 2 rows only (kFp8GemvFasterRows, docs/kernels.md).
  int fp8_gemv_rows = 2;
  // CUDA: decode attention with many KV splits (kFusedMergeMinSplits: batch 1-4 at long contexts
  // and under the graph plan) merges them in the last CTA of each (sequence, KV head)
  // (AttentionArgs::split_counters) instead of a second kernel a layer; the outputs are bit for
  // bit the same. Off only to measure what it gains.
  bool fused_attention_merge = true;
  // CUDA, FP8 KV cache: decode attention runs one resident wave of CTAs that share the batch's KV
  // tiles out evenly, each unit (sequence, KV head) cut where a CTA's share ends and merged by its
  // last CTA (AttentionPlan::stream_ctas), instead of fixed splits per unit in several waves. Needs
  // fused_attention_merge (its merge is the fused one). Off only to measure what it gains.
  bool balanced_attention = true;
  // CUDA, FP8 KV cache: a mixed step (prompt tokens beside decode rows) whose first sequences
  // decode runs their attention in the decode kernels and the rest in the 64-row kernel, two
  // launches a layer (cuda/paged_attention.h, MixedAttentionPlan), instead of one 64-row launch in
  // which each decode row fills 4 of 64 tile rows and every FP8 tile is converted to f16 first.
  bool mixed_decode_attention = true;
  // CUDA, FP8 projections: products of up to this many rows (at most 16; 0 = never) that the GEMV
  // does not take run on a tensor-core GEMM for few rows (cuda/fp8_small_gemm.h: CTAs of 16 output
  // channels with K split over their warps) instead of cuBLASLt, whose 128-wide tiles leave most
  // SMs idle on the narrow projections there. Off: on the H100 it measured 0.81-0.83x of cuBLASLt's
  // layer time at 1-16 rows (docs/kernels.md), so it stays a starting point, not a default.
  int fp8_small_gemm_rows = 0;
  // CUDA, FP8 projections (--no-fp8-split-k turns it off): products of decode's row counts whose
  // cuBLASLt tiles leave SMs idle (narrow outputs, long K) split K in two, one batched cuBLASLt call
  // of fp32 partials and a kernel that adds them and scales (cuda/fp8_gemm.h,
  // Fp8Gemm::split_k_rule: where the H100 measured it faster).
  bool fp8_split_k = true;
  // CUDA, FP8 projections: decode batches of the graph bucket sizes whose FP8 GEMMs measured slower
  // than the next larger bucket's run padded up to it (cuda_backend.cu; benchmarks turn it off to
  // compare).
  bool fp8_skip_slow_graph_buckets = true;
};

// Whether a backend with `options` computes the projections of `config` in FP8.
inline bool uses_fp8(const BackendOptions& options, const ModelConfig& config) {
  return options.quantization == WeightQuantization::kFp8 || config.quantization.fp8();
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Takes the weights (converting them to the backend's storage).
  virtual Status load(const ModelConfig& config, const ModelWeights& weights) = 0;
  // Random weights for `config` (benchmarks of shapes whose weights are not available). The
  // default builds them on the host with make_dummy_weights; the CUDA backend overrides it to
  // generate them on the device, so 8B/32B shapes need no host memory.
  virtual Status load_dummy(const ModelConfig& config, uint64_t seed) {
    return load(config, make_dummy_weights(config, DType::kBF16, seed));
  }
  // Bytes available for the KV cache after the weights and activations, given a requested cap
  // (0 = as much as the backend allows).
  virtual size_t available_kv_bytes(size_t requested_bytes) const = 0;
  // Bytes one page of group 0 of `layout` takes in this backend's memory (what the KV memory
  // plan divides by): the layout's own size (KVLayout::page_bytes) unless the backend stores
  // entries differently (the CPU emulates bf16 and fp8 in fp32).
  virtual size_t kv_page_bytes(const KVLayout& layout) const { return layout.page_bytes(0); }
  // Allocates the paged KV storage.
  virtual Status allocate_kv_cache(const KVLayout& layout) = 0;
  // One step: starts the batch's compressions, runs the model on its sequences and samples (see
  // LogitsMode), and reports the compressions that finished (backend/compression_stepper.h).
  // The batch's page tables must cover every entry it reads and writes. A batch may hold
  // compressions only, or nothing but a wait for those in flight.
  virtual Status execute(const ForwardBatch& batch, StepOutput* out) = 0;
  // Copies one page's KV (all layers) into another (copy-on-write of a partly shared page).
  virtual void copy_block(int group, BlockId src, BlockId dst) = 0;

  // --- Asynchronous scheduling (EngineConfig::async_scheduling) ---
  // A backend that launches asynchronously splits execute() in two: launch() enqueues the step
  // (starting its compressions and reporting those already finished in `out`, as execute() does)
  // and returns before its tokens are sampled; finish_launched() waits for the oldest launched
  // step and fills the rest of its StepOutput (the StepOutput launch() was given: the caller keeps
  // it alive in between), including compressions that finished meanwhile. At most two steps are
  // launched and not finished: the engine launches step N+1, then finishes step N. A batch's
  // pending_tokens are taken from the tokens the step launched before it samples.
  // execute() is launch() then finish_launched(). Backends that do not launch asynchronously are
  // driven through execute() (engine/step_pipeline.h resolves pending tokens for them).
  virtual bool launches_asynchronously() const { return false; }
  virtual Status launch(const ForwardBatch& batch, StepOutput* out) {
    return invalid_argument(name() + " backend: asynchronous launches are not supported");
  }
  virtual Status finish_launched(StepOutput* out) {
    return invalid_argument(name() + " backend: asynchronous launches are not supported");
  }

  // --- In-place KV compression (see kv/compression.h) ---
  // Allocates the query cache and, if asked, the global-score pages. Call after allocate_kv_cache().
  virtual Status configure_compression(const CompressionConfig& config) {
    return invalid_argument(name() + " backend: KV compression is not supported");
  }
  // Bytes of one query slot (Q[L, max_window, h_q, d] in the backend's dtype), for sizing M.
  virtual size_t query_slot_bytes(int max_window) const { return 0; }
  // The compressor that runs the jobs of ForwardBatch::compressions (null until
  // configure_compression()). The engine never calls it during a step; tests and tools may.
  virtual KVCompressor* compressor() { return nullptr; }
  // Fast KVzip gates (checked against the model): from now on every KV entry the backend writes
  // also gets its gate score in the global-score pages F (configure_compression with
  // global_scores first), which policies whose recipe has gate_scores select by.
  virtual Status load_gates(const gates::GateWeights& gates) {
    return invalid_argument(name() + " backend: Fast KVzip gates are not supported by this backend");
  }
  // Whether compression jobs whose recipe has reconstruction_scores (KVzip) are run: the backend
  // runs the model on the job's reconstruction tokens after its entries and selects by the result.
  virtual bool runs_reconstruction() const { return false; }
  // Whether compression jobs under a runtime allocation (ScoreRecipe::allocation kLayer / kGlobal)
  // are run: a request's jobs selected jointly, each result reporting its group's kept count.
  virtual bool selects_jointly() const { return false; }
};

// Creates the backend named in options.device ("cpu", or "cuda" when built with ORIGAMI_CUDA).
Expected<std::unique_ptr<Backend>> create_backend(const BackendOptions& options);

}  // namespace origami
