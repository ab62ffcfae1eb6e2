#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cuda/cuda_backend_factory.h"
#include "backend/cuda/compression_kernels.h"
#include "backend/forward_batch_validation.h"
#include "backend/page_table_inputs.h"
#include "backend/cuda/cuda_check.h"
#include "core/check.h"
#include "core/host_timers.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/fp8_gemv.h"
#include "backend/cuda/fp8_kernels.h"
#include "backend/cuda/fp8_small_gemm.h"
#include "model/fp8_weights.h"
#include "backend/cuda/kv_cache_write.h"
#include "backend/cuda/logprob_kernels.h"
#include "backend/cuda/tensor_parallel_backend.h"
#include "backend/cuda/tensor_parallel_kernels.h"
#include "sampling/sampler.h"

namespace origami::cuda {
namespace {

constexpr int kInitialTokens = 8192;  // activation rows reserved at load (chunked prefill budget)
constexpr int kInitialSeqs = 512;
constexpr size_t kReserveBytes = 512ull << 20;  // kept free for cuBLAS, graphs and the runtime

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

// Converts a host tensor of any supported dtype to bf16.
std::vector<uint16_t> to_bf16(const TensorView& t) {
  std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kBF16) {
    std::memcpy(out.data(), t.data, out.size() * 2);
  } else {
    const std::vector<float> f = t.to_f32();
    for (size_t i = 0; i < f.size(); ++i) out[i] = f32_to_bf16(f[i]);
  }
  return out;
}

// A tensor viewed as [rows, cols] (1-D tensors are one column): rows [begin, begin + count) or
// columns [begin, begin + count) as bf16, zero past its end (a vocabulary shard may overhang).
size_t view_cols(const TensorView& t) { return t.shape.size() >= 2 ? static_cast<size_t>(t.shape.back()) : 1; }

std::vector<uint16_t> rows_bf16(const TensorView& t, size_t begin, size_t count) {
  const std::vector<uint16_t> all = to_bf16(t);
  const size_t cols = view_cols(t), rows = all.size() / cols;
  std::vector<uint16_t> out(count * cols, 0);
  const size_t end = std::min(begin + count, rows);
  if (end > begin) std::memcpy(out.data(), all.data() + begin * cols, (end - begin) * cols * 2);
  return out;
}

std::vector<uint16_t> cols_bf16(const TensorView& t, size_t begin, size_t count) {
  const std::vector<uint16_t> all = to_bf16(t);
  const size_t cols = view_cols(t), rows = all.size() / cols;
  std::vector<uint16_t> out(rows * count);
  for (size_t r = 0; r < rows; ++r) std::memcpy(out.data() + r * count, all.data() + r * cols + begin, count * 2);
  return out;
}

// One rank's share of the model (TensorParallelRank); the vocabulary is split apart.
ModelConfig shard_config(const ModelConfig& c, int size) {
  ModelConfig s = c;
  s.num_heads = c.num_heads / size;
  s.num_kv_heads = c.num_kv_heads / size;
  s.intermediate_size = c.intermediate_size / size;
  return s;
}

}  // namespace

namespace {

// Threads that flatten a step's page tables (PageTableInputs): half the host's, at most 8 (per-head
// pages: 73,728 tables a step at 256 requests, ~1.2 ms on one thread of the H100 host, memory
// traffic that 8 threads overlap; engine_host_bench in docs/benchmarks.md), one on a 2-core host.
int step_input_threads() {
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(hw / 2, 1, 8);
}

}  // namespace

CudaBackend::CudaBackend(const BackendOptions& options, TensorParallelRank tp)
    : options_(options), tp_(tp), page_tables_(step_input_threads()) {
  ORIGAMI_CHECK(tp_.size >= 1 && tp_.rank >= 0 && tp_.rank < tp_.size && (tp_.size == 1 || tp_.comms != nullptr));
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  int device = 0;
  ORIGAMI_CUDA_CHECK(cudaGetDevice(&device));
  ORIGAMI_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device));
  for (LaunchSlot& slot : slots_) {
    ORIGAMI_CUDA_CHECK(cudaEventCreate(&slot.start));
    ORIGAMI_CUDA_CHECK(cudaEventCreate(&slot.end));
  }
  ORIGAMI_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_uploaded_, cudaEventDisableTiming));
  gemm_ = std::make_unique<Gemm>();
  gemm_->set_stream(stream_);
  // Test runs check every kept copy of a request's page tables against the tables each step.
  const char* verify = std::getenv("ORIGAMI_VERIFY_PAGE_TABLE_COPIES");
  page_tables_.set_verify(verify != nullptr && verify[0] == '1');
  // The overlapped upload (StepInputUpload) is on by default; ORIGAMI_OVERLAP_INPUT_UPLOAD=0 puts
  // the step inputs back on the compute stream (to measure what staging gains).
  const char* overlap = std::getenv("ORIGAMI_OVERLAP_INPUT_UPLOAD");
  overlap_input_upload_ = overlap == nullptr || overlap[0] != '0';
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  compressor_.reset();  // waits for its stream before the KV pool goes
  graphs_.clear();
  gemm_.reset();
  fp8_gemm_.reset();
  for (void* p : allocations_) cudaFree(p);
  for (void* p : {static_cast<void*>(residual_), static_cast<void*>(normed_), static_cast<void*>(qkv_),
                  static_cast<void*>(q_), static_cast<void*>(k_), static_cast<void*>(v_),
                  static_cast<void*>(attn_out_), static_cast<void*>(delta_), static_cast<void*>(gate_up_),
                  static_cast<void*>(act_), static_cast<void*>(fp8_x_), static_cast<void*>(fp8_x_scales_),
                  static_cast<void*>(fp8_acc_), static_cast<void*>(logit_hidden_), static_cast<void*>(logits_),
                  static_cast<void*>(logits_shard_), static_cast<void*>(logits_gathered_),
                  static_cast<void*>(shard_best_), static_cast<void*>(shard_best_gathered_),
                  attn_workspace_, static_cast<void*>(split_counters_), static_cast<void*>(dev_inputs_), static_cast<void*>(dev_params_),
                  static_cast<void*>(dev_tokens_), static_cast<void*>(dev_logprobs_), static_cast<void*>(dev_top_), kv_pool_,
                  static_cast<void*>(dev_adjust_), static_cast<void*>(dev_adjust_saved_), static_cast<void*>(dev_pending_)})
    if (p != nullptr) cudaFree(p);
  for (void* p : {static_cast<void*>(host_adjust_), static_cast<void*>(host_inputs_), static_cast<void*>(host_params_),
                  static_cast<void*>(host_pending_)})
    if (p != nullptr) cudaFreeHost(p);
  for (LaunchSlot& slot : slots_) {
    for (void* p : {static_cast<void*>(slot.tokens), static_cast<void*>(slot.logprobs), static_cast<void*>(slot.top)})
      if (p != nullptr) cudaFreeHost(p);
    for (cudaEvent_t e : {slot.start, slot.end})
      if (e != nullptr) cudaEventDestroy(e);
  }
  if (inputs_uploaded_ != nullptr) cudaEventDestroy(inputs_uploaded_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void* CudaBackend::device_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  allocations_.push_back(p);
  return p;
}

LinearWeights CudaBackend::alloc_linear(size_t rows, size_t cols) {
  LinearWeights w;
  if (!fp8_) {
    w.data = device_alloc_bf16(rows * cols);
    return w;
  }
  w.dtype = DType::kF8E4M3;
  w.scales = static_cast<const float*>(device_alloc(rows * sizeof(float)));
  w.data = w.scales != nullptr ? device_alloc(rows * cols) : nullptr;
  return w;
}

void CudaBackend::linear(const bf16* x, int m, int k, const LinearWeights& w, int n, bf16* y, bool x_quantized) {
  if (!w.fp8()) {
    ORIGAMI_CHECK_MSG(!x_quantized, "linear: a bf16 projection's input cannot come quantized");
    gemm_->linear(x, m, k, w.bf16(), n, y, false);
    return;
  }
  if (!x_quantized) launch_quantize_rows_fp8(x, m, k, w.input_scale, fp8_x_, fp8_x_scales_, stream_);
  fp8_gemm_->linear(fp8_x_, fp8_x_scales_, m, k, w.codes(), w.scales, n, y, fp8_acc_, stream_);
}

CudaBackend::bf16* CudaBackend::device_alloc_bf16(size_t count) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(bf16)) != cudaSuccess) return nullptr;
  allocations_.push_back(p);
  return static_cast<bf16*>(p);
}

Status CudaBackend::check_config(const ModelConfig& c) const {
  if (c.hidden_size <= 0 || c.num_layers <= 0 || c.vocab_size <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0)
    return invalid_argument("CUDA backend: config has non-positive sizes");
  if (c.num_heads % c.num_kv_heads != 0)
    return invalid_argument("CUDA backend: num_attention_heads is not a multiple of num_key_value_heads");
  if (!paged_attention_supported(c.head_dim))
    return Status(ErrorCode::kUnimplemented, "CUDA backend: head_dim " + std::to_string(c.head_dim) +
                                                 " is not supported by the paged attention kernels (64 and 128 are)");
  if (c.vocab_size >= (1 << 24)) return invalid_argument("CUDA backend: vocab_size must be below 2^24");
  ORIGAMI_RETURN_IF_ERROR(check_tensor_parallel(c, tp_.size));
  if (uses_fp8(options_, c)) {
    // cuBLASLt's FP8 GEMMs need K and N (per rank) in multiples of 16.
    const ModelConfig s = shard_config(c, tp_.size);
    for (auto [value, name] : {std::pair{c.hidden_size, "hidden_size"}, std::pair{s.q_size(), "q size per GPU"},
                               std::pair{s.kv_size(), "kv size per GPU"},
                               std::pair{s.intermediate_size, "intermediate_size per GPU"}})
      if (value % 16 != 0)
        return Status(ErrorCode::kUnimplemented, std::string("CUDA backend: FP8 projections need the ") + name +
                                                     " to be a multiple of 16, got " + std::to_string(value));
  }
  return Status::ok();
}

Status CudaBackend::check_tensor_parallel(const ModelConfig& c, int size) {
  if (size < 1) return invalid_argument("tensor-parallel-size must be >= 1, got " + std::to_string(size));
  if (size == 1) return Status::ok();
  const std::string tp = "tensor-parallel-size " + std::to_string(size) + ": ";
  if (size > c.num_kv_heads)
    return invalid_argument(tp + "more ranks than the model's " + std::to_string(c.num_kv_heads) +
                            " KV heads (each rank holds whole KV heads)");
  if (c.num_kv_heads % size != 0)
    return invalid_argument(tp + "the model's " + std::to_string(c.num_kv_heads) + " KV heads do not split evenly");
  if (c.num_heads % size != 0)
    return invalid_argument(tp + "the model's " + std::to_string(c.num_heads) + " attention heads do not split evenly");
  if (c.intermediate_size % size != 0)
    return invalid_argument(tp + "the model's intermediate_size " + std::to_string(c.intermediate_size) +
                            " does not split evenly");
  return Status::ok();
}

Status CudaBackend::allocate_weights(const ModelConfig& full) {
  const ModelConfig c = shard_config(full, tp_.size);
  vocab_shard_ = (full.vocab_size + tp_.size - 1) / tp_.size;
  fp8_ = uses_fp8(options_, full);
  if (fp8_) {
    fp8_gemm_ = std::make_unique<Fp8Gemm>();
    fp8_gemm_->set_fast_accumulation(options_.fp8_fast_accumulation);
    fp8_gemm_->set_gemv_rows(std::min(options_.fp8_gemv_rows, kFp8GemvMaxRows));
    fp8_gemm_->set_small_gemm_rows(std::min(options_.fp8_small_gemm_rows, kFp8SmallGemmMaxRows));
    fp8_gemm_->set_split_k(options_.fp8_split_k);
    // Without outer-vector scaling in this cuBLASLt, every step takes the epilogue path.
    fp8_epilogue_ = !fp8_gemm_->outer_vector_supported(Fp8Gemm::kEpilogueMaxRows + 1, c.q_size() + 2 * c.kv_size(),
                                                       c.hidden_size);
    if (fp8_epilogue_) fp8_gemm_->force_scaling(Fp8Gemm::Scaling::kEpilogue);
    // cuBLASLt's FP8 GEMMs are not monotone in the rows: a layer's four projections take 15-27%
    // longer at 448 rows than at 512 on the H100, and with the default (promoted) accumulation
    // 160-224 rows take longer than 256 and 320 longer than 384 (every Llama-3.1-8B and Qwen3-8B
    // shape at TP = 1 and 2: Fp8GemmBench.LayerAtGraphBuckets and SplitKAtDecodeRows,
    // docs/kernels.md). Decode batches of those bucket sizes run padded up to the next bucket, on
    // the parts measured.
    if (options_.fp8_skip_slow_graph_buckets && num_sms_ == 132) {
      const std::vector<int> slower =
          options_.fp8_fast_accumulation ? std::vector<int>{448} : std::vector<int>{160, 192, 224, 320, 448};
      for (int bucket : slower) graphs_.remove_bucket(bucket);
    }
  }
  const size_t h = c.hidden_size, qkv_rows = c.q_size() + 2 * c.kv_size(), inter = c.intermediate_size;
  embed_ = device_alloc_bf16(static_cast<size_t>(vocab_shard_) * h);
  lm_head_ = c.tie_word_embeddings ? embed_ : device_alloc_bf16(static_cast<size_t>(vocab_shard_) * h);
  final_norm_ = device_alloc_bf16(h);
  layers_.assign(c.num_layers, Layer{});
  for (Layer& l : layers_) {
    l.input_norm = device_alloc_bf16(h);
    l.post_attn_norm = device_alloc_bf16(h);
    if (c.qk_norm) {
      l.q_norm = device_alloc_bf16(c.head_dim);
      l.k_norm = device_alloc_bf16(c.head_dim);
    }
    l.qkv = alloc_linear(qkv_rows, h);
    if (c.qkv_bias) l.qkv_bias = device_alloc_bf16(qkv_rows);
    l.o = alloc_linear(h, c.q_size());
    l.gate_up = alloc_linear(2 * inter, h);
    l.down = alloc_linear(h, inter);
    if (l.input_norm == nullptr || l.post_attn_norm == nullptr || l.qkv.data == nullptr || l.o.data == nullptr ||
        l.gate_up.data == nullptr || l.down.data == nullptr || (c.qk_norm && l.k_norm == nullptr) ||
        (c.qkv_bias && l.qkv_bias == nullptr))
      return Status(ErrorCode::kResourceExhausted, "CUDA backend: out of device memory for the weights");
  }
  if (embed_ == nullptr || lm_head_ == nullptr || final_norm_ == nullptr)
    return Status(ErrorCode::kResourceExhausted, "CUDA backend: out of device memory for the weights");
  // RoPE frequencies are computed on the host exactly as the CPU backend (and HF) compute them.
  const std::vector<float> inv_freq = cpu::rope_inv_freq(c.rope, c.head_dim);
  void* p = nullptr;
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, inv_freq.size() * sizeof(float)));
  allocations_.push_back(p);
  inv_freq_ = static_cast<float*>(p);
  ORIGAMI_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(inv_freq_, inv_freq.data(), inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice));
  config_ = c;
  return ensure_capacity(kInitialTokens, kInitialSeqs, 4 * kInitialSeqs);
}

Status CudaBackend::load(const ModelConfig& config, const ModelWeights& w) {
  if (loaded_) return invalid_argument("CUDA backend: weights are already loaded");
  ORIGAMI_RETURN_IF_ERROR(check_config(config));
  if (static_cast<int>(w.layers.size()) != config.num_layers)
    return invalid_argument("CUDA backend: weights have " + std::to_string(w.layers.size()) + " layers, config " +
                            std::to_string(config.num_layers));
  ORIGAMI_RETURN_IF_ERROR(allocate_weights(config));
  // This rank's part of each tensor (all of it on one GPU): `shard` rows or columns starting at
  // rank * shard.
  enum class Split { kNone, kRows, kCols };
  auto upload = [&](bf16* dst, const TensorView& t, Split split = Split::kNone, size_t shard = 0) -> Status {
    if (t.empty()) return invalid_argument("CUDA backend: missing tensor " + t.name);
    // On one GPU every shard is the whole tensor: convert it once, with no second copy.
    if (tp_.size == 1) split = Split::kNone;
    const size_t begin = static_cast<size_t>(tp_.rank) * shard;
    const std::vector<uint16_t> host = split == Split::kRows   ? rows_bf16(t, begin, shard)
                                       : split == Split::kCols ? cols_bf16(t, begin, shard)
                                                               : to_bf16(t);
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    return Status::ok();
  };
  // Shard sizes (config_ is this rank's share once allocate_weights() ran).
  const size_t h = config_.hidden_size, q = config_.q_size(), kv = config_.kv_size(), inter = config_.intermediate_size;
  const size_t vocab = static_cast<size_t>(vocab_shard_);
  ORIGAMI_RETURN_IF_ERROR(upload(embed_, w.embed_tokens, Split::kRows, vocab));
  if (!config.tie_word_embeddings) ORIGAMI_RETURN_IF_ERROR(upload(lm_head_, w.lm_head, Split::kRows, vocab));
  ORIGAMI_RETURN_IF_ERROR(upload(final_norm_, w.final_norm));
  // FP8: each projection quantized (or taken from the checkpoint) on the host, exactly as the CPU
  // backend does, then this rank's shard: rows and their scales (column-parallel) or columns with
  // every scale (row-parallel).
  auto upload_fp8 = [&](const LinearWeights& dst, const Fp8Matrix& m) -> Status {
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpy(const_cast<void*>(dst.data), m.codes.data(), m.codes.size(),
                                            cudaMemcpyHostToDevice));
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpy(const_cast<float*>(dst.scales), m.scales.data(),
                                            m.scales.size() * sizeof(float), cudaMemcpyHostToDevice));
    return Status::ok();
  };
  auto static_scale = [&](LinearWeights* dst, float scale) -> Status {
    if (!(scale > 0.0f)) return Status::ok();  // dynamic per token
    float* p = static_cast<float*>(device_alloc(sizeof(float)));
    if (p == nullptr) return Status(ErrorCode::kResourceExhausted, "CUDA backend: out of device memory for the weights");
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpy(p, &scale, sizeof(float), cudaMemcpyHostToDevice));
    dst->input_scale = p;
    return Status::ok();
  };
  auto upload_fp8_layer = [&](const LayerWeights& lw, Layer& l) -> Status {
    std::array<Fp8Matrix, 7> m;
    const auto linears = lw.linears();
    for (size_t i = 0; i < linears.size(); ++i) {
      if (linears[i].weight->empty()) return invalid_argument("CUDA backend: missing tensor " + linears[i].weight->name);
      auto r = fp8_matrix(*linears[i].weight, *linears[i].scales);
      if (!r.has_value()) return Status(r.status().code(), "CUDA backend: " + r.status().message());
      m[i] = std::move(r).value();
    }
    const int64_t rank = tp_.rank;
    const bool split = tp_.size > 1;
    auto rows = [&](const Fp8Matrix& x, int64_t shard) { return split ? fp8_rows(x, rank * shard, shard) : x; };
    auto cols = [&](const Fp8Matrix& x, int64_t shard) { return split ? fp8_cols(x, rank * shard, shard) : x; };
    const Fp8Matrix qs = rows(m[0], q), ks = rows(m[1], kv), vs = rows(m[2], kv);
    const Fp8Matrix qkv = stack_fp8_rows({&qs, &ks, &vs});
    const Fp8Matrix gs = rows(m[4], inter), us = rows(m[5], inter);
    const Fp8Matrix gate_up = stack_fp8_rows({&gs, &us});
    const Fp8Matrix o = cols(m[3], q), down = cols(m[6], inter);
    ORIGAMI_RETURN_IF_ERROR(upload_fp8(l.qkv, qkv));
    ORIGAMI_RETURN_IF_ERROR(static_scale(&l.qkv, qkv.input_scale));
    ORIGAMI_RETURN_IF_ERROR(upload_fp8(l.o, o));
    ORIGAMI_RETURN_IF_ERROR(static_scale(&l.o, o.input_scale));
    ORIGAMI_RETURN_IF_ERROR(upload_fp8(l.gate_up, gate_up));
    ORIGAMI_RETURN_IF_ERROR(static_scale(&l.gate_up, gate_up.input_scale));
    ORIGAMI_RETURN_IF_ERROR(upload_fp8(l.down, down));
    return static_scale(&l.down, down.input_scale);
  };
  for (int i = 0; i < config.num_layers; ++i) {
    const LayerWeights& lw = w.layers[i];
    Layer& l = layers_[i];
    ORIGAMI_RETURN_IF_ERROR(upload(l.input_norm, lw.input_norm));
    ORIGAMI_RETURN_IF_ERROR(upload(l.post_attn_norm, lw.post_attn_norm));
    if (config.qk_norm) {
      ORIGAMI_RETURN_IF_ERROR(upload(l.q_norm, lw.q_norm));
      ORIGAMI_RETURN_IF_ERROR(upload(l.k_norm, lw.k_norm));
    }
    // q|k|v and gate|up are stacked row-wise so each takes one GEMM; with tensor parallelism
    // each is this rank's rows (column-parallel) and o/down its columns (row-parallel).
    if (fp8_) {
      ORIGAMI_RETURN_IF_ERROR(upload_fp8_layer(lw, l));
    } else {
      bf16* qkv = const_cast<bf16*>(l.qkv.bf16());
      ORIGAMI_RETURN_IF_ERROR(upload(qkv, lw.q_proj, Split::kRows, q));
      ORIGAMI_RETURN_IF_ERROR(upload(qkv + q * h, lw.k_proj, Split::kRows, kv));
      ORIGAMI_RETURN_IF_ERROR(upload(qkv + (q + kv) * h, lw.v_proj, Split::kRows, kv));
      ORIGAMI_RETURN_IF_ERROR(upload(const_cast<bf16*>(l.o.bf16()), lw.o_proj, Split::kCols, q));
      bf16* gate_up = const_cast<bf16*>(l.gate_up.bf16());
      ORIGAMI_RETURN_IF_ERROR(upload(gate_up, lw.gate_proj, Split::kRows, inter));
      ORIGAMI_RETURN_IF_ERROR(upload(gate_up + inter * h, lw.up_proj, Split::kRows, inter));
      ORIGAMI_RETURN_IF_ERROR(upload(const_cast<bf16*>(l.down.bf16()), lw.down_proj, Split::kCols, inter));
    }
    if (config.qkv_bias) {
      ORIGAMI_RETURN_IF_ERROR(upload(l.qkv_bias, lw.q_bias, Split::kRows, q));
      ORIGAMI_RETURN_IF_ERROR(upload(l.qkv_bias + q, lw.k_bias, Split::kRows, kv));
      ORIGAMI_RETURN_IF_ERROR(upload(l.qkv_bias + q + kv, lw.v_bias, Split::kRows, kv));
    }
  }
  loaded_ = true;
  return Status::ok();
}

Status CudaBackend::load_dummy(const ModelConfig& config, uint64_t seed) {
  if (loaded_) return invalid_argument("CUDA backend: weights are already loaded");
  ORIGAMI_RETURN_IF_ERROR(check_config(config));
  ORIGAMI_RETURN_IF_ERROR(allocate_weights(config));
  const ModelConfig& c = config_;  // this rank's share
  const size_t h = c.hidden_size, qkv_rows = c.q_size() + 2 * c.kv_size(), inter = c.intermediate_size;
  uint64_t tensor_seed = seed * 1000003ull + static_cast<uint64_t>(tp_.rank) * 7919ull;
  auto normal = [&](bf16* p, size_t n) { launch_fill_random_bf16(p, n, 0.02f, 0.0f, ++tensor_seed, stream_); };
  auto ones = [&](bf16* p, size_t n) { launch_fill_random_bf16(p, n, 0.0f, 1.0f, 0, stream_); };
  // FP8: random bf16 rows in a staging buffer, quantized per channel by the activation kernel.
  bf16* staging = nullptr;
  if (fp8_) {
    const size_t largest = std::max({qkv_rows * h, h * static_cast<size_t>(c.q_size()), 2 * inter * h, h * inter});
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMalloc(&staging, largest * sizeof(bf16)));
  }
  auto matrix = [&](const LinearWeights& w, size_t rows, size_t cols) {
    if (!w.fp8()) return normal(const_cast<bf16*>(w.bf16()), rows * cols);
    normal(staging, rows * cols);
    launch_quantize_rows_fp8(staging, static_cast<int>(rows), static_cast<int>(cols), nullptr,
                             const_cast<uint8_t*>(w.codes()), const_cast<float*>(w.scales), stream_);
  };
  normal(embed_, static_cast<size_t>(vocab_shard_) * h);
  if (!config.tie_word_embeddings) normal(lm_head_, static_cast<size_t>(vocab_shard_) * h);
  ones(final_norm_, h);
  for (Layer& l : layers_) {
    ones(l.input_norm, h);
    ones(l.post_attn_norm, h);
    if (c.qk_norm) {
      ones(l.q_norm, c.head_dim);
      ones(l.k_norm, c.head_dim);
    }
    matrix(l.qkv, qkv_rows, h);
    if (c.qkv_bias) normal(l.qkv_bias, qkv_rows);
    matrix(l.o, h, c.q_size());
    matrix(l.gate_up, 2 * inter, h);
    matrix(l.down, h, inter);
  }
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (staging != nullptr) cudaFree(staging);
  loaded_ = true;
  return Status::ok();
}

CudaBackend::InputLayout CudaBackend::input_layout(const Capacity& cap) const {
  InputLayout l{};
  size_t off = 0;
  auto take = [&](size_t n) {
    const size_t at = off;
    off += round_up(n, 32);  // 128-byte aligned regions
    return at;
  };
  l.tokens = take(cap.tokens);
  l.positions = take(cap.tokens);
  l.slots = take(static_cast<size_t>(cap.tokens) * num_groups_);  // [group][token]
  l.query_rows = take(cap.tokens);
  l.q_indptr = take(cap.seqs + 1);
  l.page_indptr = take(static_cast<size_t>(cap.seqs) * num_groups_ + 1);  // [group][seq]
  l.kv_len = take(static_cast<size_t>(cap.seqs) * num_groups_);
  l.sample_rows = take(cap.seqs);
  l.rest_q_indptr = take(cap.seqs + 1);
  l.page_indices = take(cap.pages);  // last, so a step copies only the pages it uses
  l.total = off;
  return l;
}

Status CudaBackend::ensure_capacity(int tokens, int seqs, int pages) {
  if (tokens <= cap_.tokens && seqs <= cap_.seqs && pages <= cap_.pages) return Status::ok();
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  graphs_.clear();  // captured graphs point at the old buffers
  const ModelConfig& c = config_;
  Capacity next{std::max(tokens, cap_.tokens), std::max(seqs, cap_.seqs), std::max(pages, cap_.pages)};
  if (next.pages > cap_.pages) next.pages = std::max(next.pages, 2 * cap_.pages);
  auto realloc_dev = [](auto** ptr, size_t bytes) -> Status {
    if (*ptr != nullptr) cudaFree(*ptr);
    *ptr = nullptr;
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) {
      cudaGetLastError();
      return Status(ErrorCode::kResourceExhausted, "CUDA backend: out of device memory for step buffers");
    }
    *ptr = static_cast<std::remove_pointer_t<std::remove_reference_t<decltype(ptr)>>>(p);
    return Status::ok();
  };
  auto realloc_host = [](auto** ptr, size_t bytes) -> Status {
    if (*ptr != nullptr) cudaFreeHost(*ptr);
    *ptr = nullptr;
    void* p = nullptr;
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, std::max<size_t>(bytes, 16)));
    *ptr = static_cast<std::remove_pointer_t<std::remove_reference_t<decltype(ptr)>>>(p);
    return Status::ok();
  };
  // realloc_dev keeping the buffer's first `keep_bytes` (the stream is idle, so they are final).
  auto grow_dev_keeping = [&](int32_t** ptr, size_t bytes, size_t keep_bytes) -> Status {
    int32_t* old = *ptr;
    *ptr = nullptr;
    const Status grown = realloc_dev(ptr, bytes);
    cudaError_t copied = cudaSuccess;
    if (grown.is_ok() && old != nullptr && keep_bytes > 0) {
      copied = cudaMemcpyAsync(*ptr, old, keep_bytes, cudaMemcpyDeviceToDevice, stream_);
      if (copied == cudaSuccess) copied = cudaStreamSynchronize(stream_);  // before the old buffer goes
    }
    if (old != nullptr) cudaFree(old);
    ORIGAMI_RETURN_IF_ERROR(grown);
    return cuda_status(copied, "copying the sampled tokens into the grown buffer");
  };
  if (next.tokens > cap_.tokens) {
    const size_t t = next.tokens, h = c.hidden_size;
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&residual_, t * h * sizeof(float)));
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&normed_, t * h * 2));
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&qkv_, t * (c.q_size() + 2 * c.kv_size()) * 2));
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&q_, t * c.q_size() * 2));
    if (!qk_norm_rope_writes_kv(c.head_dim)) {  // else the RoPE kernel writes K and V to the cache itself
      ORIGAMI_RETURN_IF_ERROR(realloc_dev(&k_, t * c.kv_size() * 2));
      ORIGAMI_RETURN_IF_ERROR(realloc_dev(&v_, t * c.kv_size() * 2));
    }
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&attn_out_, t * c.q_size() * 2));
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&delta_, t * h * 2));
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&gate_up_, t * 2 * c.intermediate_size * 2));
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&act_, t * c.intermediate_size * 2));
    if (fp8_) {
      const size_t widest_in = std::max<size_t>({h, static_cast<size_t>(c.q_size()), static_cast<size_t>(c.intermediate_size)});
      ORIGAMI_RETURN_IF_ERROR(realloc_dev(&fp8_x_, t * widest_in));
      ORIGAMI_RETURN_IF_ERROR(realloc_dev(&fp8_x_scales_, t * sizeof(float)));
      // The fp32 scratch of the epilogue path and of split-K partials, for the widest need of the
      // layer's four projections (n, k) at up to t rows.
      const int qkv_out = c.q_size() + 2 * c.kv_size();
      const std::pair<int, int> projections[] = {{qkv_out, c.hidden_size}, {c.hidden_size, c.q_size()},
                                                 {2 * c.intermediate_size, c.hidden_size},
                                                 {c.hidden_size, c.intermediate_size}};
      size_t acc_floats = 0;
      for (const auto& [n, k] : projections)
        acc_floats = std::max(acc_floats, Fp8Gemm::max_scratch_floats(static_cast<int>(t), n, k,
                                                                       options_.fp8_split_k ? num_sms_ : 0, fp8_epilogue_));
      ORIGAMI_RETURN_IF_ERROR(realloc_dev(&fp8_acc_, acc_floats * sizeof(float)));
    }
    if (gates_.loaded()) ORIGAMI_RETURN_IF_ERROR(gates_.reserve(next.tokens));
  }
  if (next.tokens > cap_.tokens || next.seqs > cap_.seqs) {
    // As many counters as the largest decode step these buffers allow (the count grows with
    // tokens and sequences), zeroed once: launches leave them zero.
    const long long counters = split_counter_count(
        AttentionShape{next.seqs, std::max(next.tokens, next.seqs), c.num_heads, c.num_kv_heads, c.head_dim, 1});
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&split_counters_, static_cast<size_t>(counters) * sizeof(int32_t)));
    ORIGAMI_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(split_counters_, 0, static_cast<size_t>(counters) * sizeof(int32_t), stream_));
  }
  if (logits_ == nullptr) {
    const size_t shard = static_cast<size_t>(kLogitRows) * vocab_shard_ * sizeof(float);
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&logit_hidden_, static_cast<size_t>(kLogitRows) * c.hidden_size * 2));
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&logits_, shard * tp_.size));
    if (tp_.size > 1) {
      ORIGAMI_RETURN_IF_ERROR(realloc_dev(&logits_shard_, shard));
      ORIGAMI_RETURN_IF_ERROR(realloc_dev(&logits_gathered_, shard * tp_.size));
      ORIGAMI_RETURN_IF_ERROR(realloc_dev(&shard_best_, kLogitRows * sizeof(ShardArgmax)));
      ORIGAMI_RETURN_IF_ERROR(realloc_dev(&shard_best_gathered_, kLogitRows * sizeof(ShardArgmax) * tp_.size));
    }
  }
  if (next.seqs > cap_.seqs) {
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&dev_params_, next.seqs * sizeof(RowSamplingParams)));
    ORIGAMI_RETURN_IF_ERROR(realloc_host(&host_params_, next.seqs * sizeof(RowSamplingParams)));
    // The previous step's sampled tokens move over: the step being launched gathers its pending
    // tokens from them.
    ORIGAMI_RETURN_IF_ERROR(grow_dev_keeping(&dev_tokens_, next.seqs * sizeof(int32_t), cap_.seqs * sizeof(int32_t)));
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&dev_logprobs_, next.seqs * sizeof(float)));
    ORIGAMI_RETURN_IF_ERROR(realloc_dev(&dev_top_, next.seqs * kMaxTopLogprobs * sizeof(TopLogprob)));
  }
  const size_t total = input_layout(next).total;
  ORIGAMI_RETURN_IF_ERROR(input_upload_.wait_idle());  // no copy still reads the buffers about to go
  ORIGAMI_RETURN_IF_ERROR(realloc_dev(&dev_inputs_, total * sizeof(int32_t)));
  ORIGAMI_RETURN_IF_ERROR(realloc_host(&host_inputs_, total * sizeof(int32_t)));
  cap_ = next;
  return Status::ok();
}

Status CudaBackend::ensure_attention_workspace(size_t bytes) {
  if (bytes <= attn_workspace_bytes_) return Status::ok();
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  graphs_.clear();
  if (attn_workspace_ != nullptr) cudaFree(attn_workspace_);
  attn_workspace_ = nullptr;
  attn_workspace_bytes_ = 0;
  const size_t grown = std::max(bytes, round_up(bytes + bytes / 2, 1 << 20));
  if (cudaMalloc(&attn_workspace_, grown) != cudaSuccess) {
    cudaGetLastError();
    return Status(ErrorCode::kResourceExhausted, "CUDA backend: out of device memory for the attention workspace");
  }
  attn_workspace_bytes_ = grown;
  return Status::ok();
}

Status CudaBackend::ensure_adjustment_capacity(size_t entries) {
  if (entries <= adjust_capacity_) return Status::ok();
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  graphs_.clear();  // captured graphs point at the old buffers
  // Room for a few long penalized prompts from the first step on, so graphs are rarely recaptured.
  constexpr size_t kMinEntries = 4096;
  const size_t grown = std::max({entries, 2 * adjust_capacity_, kMinEntries});
  for (void* p : {static_cast<void*>(dev_adjust_), static_cast<void*>(dev_adjust_saved_)})
    if (p != nullptr) cudaFree(p);
  if (host_adjust_ != nullptr) cudaFreeHost(host_adjust_);
  dev_adjust_ = nullptr;
  dev_adjust_saved_ = nullptr;
  host_adjust_ = nullptr;
  adjust_capacity_ = 0;
  if (cudaMalloc(&dev_adjust_, grown * sizeof(LogitAdjustment)) != cudaSuccess ||
      cudaMalloc(&dev_adjust_saved_, grown * sizeof(float)) != cudaSuccess ||
      cudaMallocHost(&host_adjust_, grown * sizeof(LogitAdjustment)) != cudaSuccess) {
    cudaGetLastError();
    return Status(ErrorCode::kResourceExhausted, "CUDA backend: out of memory for the step's logit adjustments");
  }
  adjust_capacity_ = grown;
  return Status::ok();
}

Status CudaBackend::ensure_pending_capacity(size_t pairs) {
  if (pairs <= pending_capacity_) return Status::ok();
  // The previous step's gather may still be queued behind the step before it, reading dev_pending_.
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  constexpr size_t kMinPairs = 256;
  const size_t grown = std::max({pairs, 2 * pending_capacity_, kMinPairs});
  if (dev_pending_ != nullptr) cudaFree(dev_pending_);
  if (host_pending_ != nullptr) cudaFreeHost(host_pending_);
  dev_pending_ = nullptr;
  host_pending_ = nullptr;
  pending_capacity_ = 0;
  if (cudaMalloc(&dev_pending_, grown * sizeof(int2)) != cudaSuccess ||
      cudaMallocHost(&host_pending_, grown * sizeof(int2)) != cudaSuccess) {
    cudaGetLastError();
    return Status(ErrorCode::kResourceExhausted, "CUDA backend: out of memory for the step's pending tokens");
  }
  pending_capacity_ = grown;
  return Status::ok();
}

Status CudaBackend::ensure_slot_capacity(LaunchSlot& slot, int rows) {
  if (rows <= slot.capacity) return Status::ok();
  // The slot is free (its step was read back), so its buffers can go; sized for the step buffers'
  // rows so that they rarely grow again.
  const size_t grown = static_cast<size_t>(std::max(rows, cap_.seqs));
  for (void* p : {static_cast<void*>(slot.tokens), static_cast<void*>(slot.logprobs), static_cast<void*>(slot.top)})
    if (p != nullptr) cudaFreeHost(p);
  slot.tokens = nullptr;
  slot.logprobs = nullptr;
  slot.top = nullptr;
  slot.capacity = 0;
  if (cudaMallocHost(&slot.tokens, grown * sizeof(int32_t)) != cudaSuccess ||
      cudaMallocHost(&slot.logprobs, grown * sizeof(float)) != cudaSuccess ||
      cudaMallocHost(&slot.top, grown * kMaxTopLogprobs * sizeof(TopLogprob)) != cudaSuccess) {
    cudaGetLastError();
    return Status(ErrorCode::kResourceExhausted, "CUDA backend: out of pinned memory for a step's results");
  }
  slot.capacity = static_cast<int>(grown);
  return Status::ok();
}

size_t CudaBackend::available_kv_bytes(size_t requested_bytes) const {
  size_t free_bytes = 0, total_bytes = 0;
  ORIGAMI_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  // The engine may take `gpu_memory_utilization` of the device; what is in use already (weights,
  // step buffers, other processes) counts against it, and a reserve stays for the runtime.
  const double allowed = options_.gpu_memory_utilization * static_cast<double>(total_bytes);
  const double used = static_cast<double>(total_bytes - free_bytes);
  double avail = allowed - used - static_cast<double>(kReserveBytes);
  avail = std::min(avail, static_cast<double>(free_bytes) - static_cast<double>(kReserveBytes));
  if (avail < 0) avail = 0;
  size_t bytes = static_cast<size_t>(avail);
  if (requested_bytes > 0) bytes = std::min(bytes, requested_bytes);
  return bytes;
}

Status CudaBackend::allocate_kv_cache(const KVLayout& layout) {
  if (!loaded_) return invalid_argument("CUDA backend: allocate_kv_cache before load");
  if (layout.groups.empty()) return invalid_argument("CUDA backend: KV layout has no head group");
  if (layout.dtype != DType::kBF16)
    return invalid_argument(std::string("CUDA backend: KV dtype must be bf16, layout has ") + dtype_name(layout.dtype));
  if (layout.fp8 && layout.head_dim % 32 != 0)
    return Status(ErrorCode::kUnimplemented, "CUDA backend: --kv-cache-dtype fp8 needs head_dim a multiple of 32, the model has " +
                                                 std::to_string(layout.head_dim));
  if (layout.num_layers != config_.num_layers || layout.num_kv_heads != config_.num_kv_heads ||
      layout.head_dim != config_.head_dim)
    return invalid_argument("CUDA backend: KV layout does not match the model (layers/kv heads/head_dim)");
  const HeadGroup& g = layout.groups[0];
  const bool grouped = layout.groups.size() > 1 || layout.shared_pool;
  if (!grouped && (static_cast<int>(g.layers.size()) != layout.num_layers ||
                   static_cast<int>(g.kv_heads.size()) != layout.num_kv_heads))
    return Status(ErrorCode::kUnimplemented, "CUDA backend: the head group must cover every layer and KV head");
  if (g.num_blocks < 2 || layout.block_size < 1) return invalid_argument("CUDA backend: KV pool needs >= 2 blocks");
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  graphs_.clear();
  compressor_.reset();  // sized for the old pool; configure_compression() again
  ragged_.clear();
  if (grouped) {
    // The most splits the planner can choose: the grid of one sequence's heads filled 4x per SM.
    const int max_s = std::max(1, (4 * std::max(num_sms_, 1) + layout.num_kv_heads - 1) / layout.num_kv_heads);
    ORIGAMI_RETURN_IF_ERROR(ragged_.build(layout, max_s));
  }
  if (kv_pool_ != nullptr) cudaFree(kv_pool_);
  kv_pool_ = nullptr;
  const size_t head_page = static_cast<size_t>(layout.block_size) * layout.head_dim;  // one head's page, elements
  const int hp = grouped ? layout.heads_per_group() : layout.num_kv_heads;
  kv_page_elems_ = static_cast<long long>(2 * hp * head_page);
  kv_layer_elems_ = grouped ? 0 : static_cast<size_t>(g.num_blocks) * layout.num_kv_heads * head_page;
  const size_t total_elems = grouped ? static_cast<size_t>(g.num_blocks) * kv_page_elems_
                                     : 2 * kv_layer_elems_ * layout.num_layers;
  kv_fp8_ = layout.fp8;
  // FP8: codes (1 byte per element), then the scales, 256-byte aligned.
  const size_t codes_bytes = kv_fp8_ ? (total_elems + 255) / 256 * 256 : total_elems * sizeof(bf16);
  const size_t total = codes_bytes + (kv_fp8_ ? total_elems / layout.head_dim * sizeof(float) : 0);
  if (cudaMalloc(&kv_pool_, total) != cudaSuccess) {
    cudaGetLastError();
    return Status(ErrorCode::kResourceExhausted,
                  "CUDA backend: cannot allocate " + std::to_string(total >> 20) + " MiB of KV cache");
  }
  // Zeroed so that reads of the null block (padding rows) see finite values.
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(kv_pool_, 0, total, stream_));
  for (auto* v : {&k_cache_, &v_cache_}) v->assign(layout.num_layers, nullptr);
  for (auto* v : {&k_codes_, &v_codes_}) v->assign(layout.num_layers, nullptr);
  for (auto* v : {&k_scales_, &v_scales_}) v->assign(layout.num_layers, nullptr);
  uint8_t* codes = static_cast<uint8_t*>(kv_pool_);
  float* scales = reinterpret_cast<float*>(codes + codes_bytes);
  for (int l = 0; l < layout.num_layers; ++l) {
    // Element offsets of the layer's K and V: head groups share the pool, V after K in each page.
    const size_t k_off = grouped ? 0 : 2 * l * kv_layer_elems_;
    const size_t v_off = grouped ? static_cast<size_t>(hp) * head_page : (2 * l + 1) * kv_layer_elems_;
    if (kv_fp8_) {
      k_codes_[l] = codes + k_off;
      v_codes_[l] = codes + v_off;
      k_scales_[l] = scales + k_off / layout.head_dim;
      v_scales_[l] = scales + v_off / layout.head_dim;
    } else {
      k_cache_[l] = static_cast<bf16*>(kv_pool_) + k_off;
      v_cache_[l] = static_cast<bf16*>(kv_pool_) + v_off;
    }
  }
  kv_layout_ = layout;
  num_groups_ = layout.num_groups();
  cap_ = Capacity{};  // the step inputs' layout depends on the number of groups
  previous_slot_ = -1;  // dev_tokens_ is reallocated without its sampled tokens
  // Graphs are captured with an attention plan for the longest possible sequence.
  graph_max_kv_len_ = std::max(1, std::min(config_.max_position_embeddings > 0 ? config_.max_position_embeddings : 1 << 20,
                                           g.num_blocks * layout.block_size));
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return Status::ok();
}

void CudaBackend::copy_block(int group, BlockId src, BlockId dst) {
  ORIGAMI_CHECK(group >= 0 && group < num_groups_ && kv_pool_ != nullptr);
  const size_t elem_bytes = kv_fp8_ ? 1 : sizeof(bf16);
  const size_t head_dim = static_cast<size_t>(kv_layout_.head_dim);
  auto copy_page = [&](void* base, size_t page_bytes) {
    char* b = static_cast<char*>(base);
    ORIGAMI_CUDA_CHECK(
        cudaMemcpyAsync(b + dst * page_bytes, b + src * page_bytes, page_bytes, cudaMemcpyDeviceToDevice, stream_));
  };
  if (kv_layout_.shared_pool) {  // a group page is one contiguous [2, H_p, block_size, head_dim]
    copy_page(kv_pool_, static_cast<size_t>(kv_page_elems_) * elem_bytes);
    if (kv_fp8_) copy_page(k_scales_[0], static_cast<size_t>(kv_page_elems_) / head_dim * sizeof(float));
    if (compressor_ != nullptr) compressor_->copy_scores(src, dst, stream_);
    return;
  }
  const size_t page_elems = kv_layer_elems_ / kv_layout_.groups[0].num_blocks;
  for (int l = 0; l < kv_layout_.num_layers; ++l) {
    if (kv_fp8_) {
      for (void* base : {static_cast<void*>(k_codes_[l]), static_cast<void*>(v_codes_[l])}) copy_page(base, page_elems);
      for (void* base : {static_cast<void*>(k_scales_[l]), static_cast<void*>(v_scales_[l])})
        copy_page(base, page_elems / head_dim * sizeof(float));
    } else {
      for (void* base : {static_cast<void*>(k_cache_[l]), static_cast<void*>(v_cache_[l])})
        copy_page(base, page_elems * elem_bytes);
    }
  }
  if (compressor_ != nullptr) compressor_->copy_scores(src, dst, stream_);  // F moves with its page
}

void CudaBackend::record_step(int num_tokens, int num_seqs, int num_sample_rows, const MixedAttentionPlan& attention,
                              int uniform_splits, bool split_map, bool capture_queries, bool shard_greedy) {
  const ModelConfig& c = config_;
  const InputLayout in = input_layout(cap_);
  const int32_t* d_tokens = dev_inputs_ + in.tokens;
  const int32_t* d_positions = dev_inputs_ + in.positions;
  const int h = c.hidden_size, qkv_cols = c.q_size() + 2 * c.kv_size();
  // Tensor parallelism: each rank gathers the rows of its vocabulary shard (zeros for the others'
  // tokens). Where the peer all-reduce runs, the first layer's reduction sums them into the zeroed
  // residual (no NCCL launch in the step: its latency is most of an all-reduce this size); else
  // NCCL sums them here. Either way each row is exact (one rank's bf16 value plus zeros). A traced
  // step (layer traces record the embedded rows) sums them here.
  const bool embed_in_first_reduction = tp_.size > 1 && peer_reduces(num_tokens) && trace_ == nullptr;
  if (tp_.size > 1) {
    launch_embedding_gather_shard(embed_, d_tokens, num_tokens, h, tp_.rank * vocab_shard_, vocab_shard_, residual_,
                                  stream_, embed_in_first_reduction ? projection_out(num_tokens) : nullptr);
    if (!embed_in_first_reduction) all_reduce(residual_, static_cast<size_t>(num_tokens) * h, NcclDataType::kFloat32);
  } else {
    launch_embedding_gather(embed_, d_tokens, num_tokens, h, residual_, stream_);
  }
  const bool gate_scores = gates_.loaded() && compressor_ != nullptr && compressor_->global_scores() != nullptr;
  if (trace_ != nullptr) {
    trace_->embedded = download_f32(residual_, static_cast<size_t>(num_tokens) * h);
    trace_->residual.assign(c.num_layers, {});
    trace_->sublayers.assign(c.num_layers, {});
  }
  auto traced = [&](int layer, int sublayer) { return trace_ != nullptr ? &trace_->sublayers[layer][sublayer] : nullptr; };
  for (int li = 0; li < c.num_layers; ++li) {
    const Layer& l = layers_[li];
    // The previous layer's MLP output joins the residual stream here (reduced over the ranks).
    // FP8 with fuse_fp8_quantize: the norm also quantizes q|k|v's input (normed_ still written
    // for the gates, which read it).
    const bool qkv_in_fp8 = add_rmsnorm(li > 0 || embed_in_first_reduction, l.input_norm, num_tokens,
                                        li > 0 ? traced(li - 1, 1) : nullptr, &l.qkv, gate_scores);
    if (trace_ != nullptr && li > 0) trace_->residual[li - 1] = download_f32(residual_, static_cast<size_t>(num_tokens) * h);
    // Head groups: this layer's groups are tables li * T .. li * T + T - 1 of the step inputs.
    const size_t first_table = ragged_.empty() ? 0 : static_cast<size_t>(li) * ragged_.groups_per_layer();
    if (gate_scores) {
      // Each new entry's gate score, from the attention input, into F beside its K and V (the
      // KV write's slot tables; head groups: one F page per group page), on the gates' side
      // stream beside the layer's attention; joined before the post-attention norm rewrites normed_.
      GateScoreDestination gd;
      gd.f = compressor_->global_scores() + (ragged_.empty() ? li * compressor_->score_layer_pitch() : 0);
      gd.slot_mapping = dev_inputs_ + in.slots + first_table * num_tokens;
      gd.head_table = ragged_.empty() ? nullptr : ragged_.head_table(li);
      gd.head_slot = ragged_.empty() ? nullptr : ragged_.head_slot(li);
      gd.page_heads = ragged_.empty() ? c.num_kv_heads : kv_layout_.heads_per_group();
      gd.block_size = kv_layout_.block_size;
      gates_.fork(li, normed_, num_tokens, gd, stream_);
    }
    linear(normed_, num_tokens, h, l.qkv, qkv_cols, qkv_, qkv_in_fp8);
    if (l.qkv_bias != nullptr) launch_bias_add(qkv_, l.qkv_bias, num_tokens, qkv_cols, stream_);
    // The layer's new K and V rows go into the paged cache through the step's slot tables.
    KVWriteArgs wa;
    wa.slot_mapping = dev_inputs_ + in.slots;
    wa.k_cache = k_cache_[li];
    wa.v_cache = v_cache_[li];
    wa.num_tokens = num_tokens;
    wa.num_kv_heads = c.num_kv_heads;
    wa.head_dim = c.head_dim;
    wa.block_size = kv_layout_.block_size;
    if (!ragged_.empty()) {
      wa.slot_mapping += first_table * num_tokens;
      wa.head_table = ragged_.head_table(li);
      wa.head_slot = ragged_.head_slot(li);
      wa.page_stride = kv_page_elems_;
    }
    const KVWriteFp8Out fp8_out = kv_fp8_ ? KVWriteFp8Out{k_codes_[li], v_codes_[li], k_scales_[li], v_scales_[li]}
                                          : KVWriteFp8Out{};
    RopeArgs ra;
    ra.qkv = qkv_;
    ra.qkv_stride = qkv_cols;
    ra.positions = d_positions;
    ra.inv_freq = inv_freq_;
    ra.q_norm = l.q_norm;
    ra.k_norm = l.k_norm;
    ra.eps = c.rms_norm_eps;
    ra.num_tokens = num_tokens;
    ra.num_heads = c.num_heads;
    ra.num_kv_heads = c.num_kv_heads;
    ra.head_dim = c.head_dim;
    ra.q_out = q_;
    // Head dims 64 and 128: the RoPE kernel writes the cache itself (nothing else reads k_ / v_);
    // other head dims: roped K and V through k_ / v_, then the separate scatter.
    const bool fused_kv_write = qk_norm_rope_writes_kv(c.head_dim);
    if (fused_kv_write) {
      ra.kv = wa;
      ra.kv_fp8 = fp8_out;
    } else {
      ra.k_out = k_;
      ra.v_out = v_;
    }
    launch_qk_norm_rope(ra, stream_);
    if (capture_queries)
      launch_capture_queries(q_, dev_inputs_ + in.query_rows, num_tokens, c.q_size(),
                             compressor_->query_cache() + li * compressor_->query_layer_pitch(), stream_);
    if (!fused_kv_write) {
      wa.k = k_;
      wa.v = v_;
      ORIGAMI_CUDA_CHECK(kv_fp8_ ? write_kv_cache_fp8(wa, fp8_out, stream_) : write_kv_cache(wa, stream_));
    }
    AttentionArgs aa;
    aa.shape = AttentionShape{num_seqs, num_tokens, c.num_heads, c.num_kv_heads, c.head_dim, kv_layout_.block_size};
    aa.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    aa.q = q_;
    aa.out = attn_out_;
    aa.k_cache = k_cache_[li];
    aa.v_cache = v_cache_[li];
    if (kv_fp8_) {
      aa.k_codes = k_codes_[li];
      aa.v_codes = v_codes_[li];
      aa.k_scales = k_scales_[li];
      aa.v_scales = v_scales_[li];
    }
    aa.q_indptr = dev_inputs_ + in.q_indptr;
    aa.page_indptr = dev_inputs_ + in.page_indptr;
    aa.page_indices = dev_inputs_ + in.page_indices;
    aa.kv_len = dev_inputs_ + in.kv_len;
    if (!ragged_.empty()) {
      aa.page_indptr += first_table * num_seqs;
      aa.kv_len += first_table * num_seqs;
      aa.ragged = ragged_.layer(li, uniform_splits, kv_page_elems_, split_map);
    }
    if (options_.fused_attention_merge) aa.split_counters = split_counters_;  // used from kFusedMergeMinSplits
    ORIGAMI_CUDA_CHECK(paged_attention_mixed(aa, attention, dev_inputs_ + in.rest_q_indptr, attn_workspace_,
                                             attn_workspace_bytes_, stream_));
    bf16* attn_partial = projection_out(num_tokens);
    linear(attn_out_, num_tokens, c.q_size(), l.o, h, attn_partial);
    if (trace_ != nullptr) trace_partial(attn_out_, c.q_size(), l.o, num_tokens, attn_partial, traced(li, 0));
    if (gate_scores) gates_.join(stream_);
    const bool gate_up_in_fp8 = add_rmsnorm(true, l.post_attn_norm, num_tokens, traced(li, 0), &l.gate_up, false);
    linear(normed_, num_tokens, h, l.gate_up, 2 * c.intermediate_size, gate_up_, gate_up_in_fp8);
    const bool down_in_fp8 = fp8_quantizes_in_producer(l.down);
    if (down_in_fp8)  // act_ is not written
      launch_silu_and_mul_quantize_fp8(gate_up_, num_tokens, c.intermediate_size, fp8_rows_out(l.down), stream_);
    else
      launch_silu_and_mul(gate_up_, num_tokens, c.intermediate_size, act_, stream_);
    bf16* mlp_partial = projection_out(num_tokens);
    linear(act_, num_tokens, c.intermediate_size, l.down, h, mlp_partial, down_in_fp8);
    if (trace_ != nullptr) trace_partial(act_, c.intermediate_size, l.down, num_tokens, mlp_partial, traced(li, 1));
  }
  add_rmsnorm(true, final_norm_, num_tokens, traced(c.num_layers - 1, 1));
  if (trace_ != nullptr)
    trace_->residual[c.num_layers - 1] = download_f32(residual_, static_cast<size_t>(num_tokens) * h);
  for (int r0 = 0; r0 < num_sample_rows; r0 += kLogitRows) {
    const int rows = std::min(kLogitRows, num_sample_rows - r0);
    launch_gather_rows(normed_, dev_inputs_ + in.sample_rows + r0, rows, h, logit_hidden_, stream_);
    if (shard_greedy) {
      sample_greedy_sharded(rows, r0);
      continue;
    }
    lm_head_logits(logit_hidden_, rows);
    launch_sample_rows(logits_, rows, c.vocab_size, logits_stride(), dev_params_ + r0, dev_tokens_ + r0, stream_,
                       dev_adjust_, dev_adjust_saved_);
    launch_row_logprobs(logits_, rows, c.vocab_size, logits_stride(), dev_params_ + r0, dev_tokens_ + r0,
                        dev_logprobs_ + r0, dev_top_ + static_cast<size_t>(r0) * kMaxTopLogprobs, stream_);
  }
}

void CudaBackend::lm_head_logits(const bf16* hidden, int rows) {
  if (tp_.size == 1) {
    gemm_->linear(hidden, rows, config_.hidden_size, lm_head_, vocab_shard_, logits_, true);
    return;
  }
  gemm_->linear(hidden, rows, config_.hidden_size, lm_head_, vocab_shard_, logits_shard_, true);
  const Status st = tp_.comms->all_gather(tp_.rank, logits_shard_, logits_gathered_,
                                          static_cast<size_t>(rows) * vocab_shard_, NcclDataType::kFloat32, stream_);
  ORIGAMI_CHECK_MSG(st.is_ok(), st.to_string().c_str());
  launch_unshard_logits(logits_gathered_, tp_.size, rows, vocab_shard_, logits_, stream_);
}

void CudaBackend::sample_greedy_sharded(int rows, int r0) {
  gemm_->linear(logit_hidden_, rows, config_.hidden_size, lm_head_, vocab_shard_, logits_shard_, true);
  const int begin = tp_.rank * vocab_shard_;
  const int valid = std::max(0, std::min(vocab_shard_, config_.vocab_size - begin));
  launch_shard_argmax(logits_shard_, rows, vocab_shard_, valid, begin, shard_best_, stream_);
  static_assert(sizeof(ShardArgmax) == 2 * sizeof(float), "gathered as pairs of 32-bit words");
  const Status st = tp_.comms->all_gather(tp_.rank, shard_best_, shard_best_gathered_, static_cast<size_t>(rows) * 2,
                                          NcclDataType::kFloat32, stream_);
  ORIGAMI_CHECK_MSG(st.is_ok(), st.to_string().c_str());
  launch_merge_shard_argmax(shard_best_gathered_, tp_.size, rows, dev_tokens_ + r0, stream_);
}

bool CudaBackend::add_rmsnorm(bool has_delta, const bf16* weight, int num_tokens, LayerTrace::Sublayer* traced,
                              const LinearWeights* consumer, bool keep_normed) {
  const int h = config_.hidden_size;
  const size_t n = static_cast<size_t>(num_tokens) * h;
  std::vector<float> before;
  if (traced != nullptr && has_delta) before = download_f32(residual_, n);
  bool quantized = false;
  if (has_delta && peer_reduces(num_tokens)) {
    // The peer all-reduce normalizes as it sums: its input is quantized by the consumer's linear().
    peer_->reduce_add_rmsnorm(residual_, weight, config_.rms_norm_eps, num_tokens, normed_, stream_);
  } else {
    if (has_delta && options_.tensor_parallel_reduce != BackendOptions::TensorParallelReduce::kSkipForTiming)
      all_reduce(delta_, n, NcclDataType::kBFloat16);
    quantized = consumer != nullptr && fp8_quantizes_in_producer(*consumer);
    if (quantized) {
      launch_add_rmsnorm_quantize_fp8(residual_, has_delta ? delta_ : nullptr, weight, config_.rms_norm_eps, num_tokens,
                                      h, fp8_rows_out(*consumer), keep_normed ? normed_ : nullptr, stream_);
    } else {
      launch_add_rmsnorm(residual_, has_delta ? delta_ : nullptr, weight, config_.rms_norm_eps, num_tokens, h,
                         normed_, stream_);
    }
  }
  if (traced != nullptr && has_delta) {
    traced->applied = download_f32(residual_, n);
    for (size_t i = 0; i < n; ++i) traced->applied[i] -= before[i];
  }
  return quantized;
}

void CudaBackend::trace_partial(const bf16* x, int k, const LinearWeights& w, int num_tokens, const bf16* partial,
                                LayerTrace::Sublayer* traced) {
  ORIGAMI_CHECK_MSG(!fp8_, "layer traces need bf16 weights");
  const size_t n = static_cast<size_t>(num_tokens) * config_.hidden_size;
  float* exact = nullptr;
  ORIGAMI_CUDA_CHECK(cudaMalloc(&exact, n * sizeof(float)));
  gemm_->linear(x, num_tokens, k, w.bf16(), config_.hidden_size, exact, true);
  traced->partial_exact = download_f32(exact, n);
  ORIGAMI_CUDA_CHECK(cudaFree(exact));
  std::vector<bf16> p(n);
  ORIGAMI_CUDA_CHECK(cudaMemcpyAsync(p.data(), partial, n * sizeof(bf16), cudaMemcpyDeviceToHost, stream_));
  ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(stream_));
  traced->partial.resize(n);
  for (size_t i = 0; i < n; ++i) traced->partial[i] = __bfloat162float(p[i]);
}

std::vector<float> CudaBackend::download_f32(const float* device, size_t count) const {
  std::vector<float> out(count);
  ORIGAMI_CUDA_CHECK(cudaMemcpyAsync(out.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return out;
}

Status CudaBackend::init_peer_reduce() {
  if (tp_.size == 1 || tp_.peer_group == nullptr) return Status::ok();
  if (!loaded_) return invalid_argument("CUDA backend: peer all-reduce before load");
  auto peer = std::make_unique<PeerAllReduce>();
  const bool push = options_.tensor_parallel_reduce == BackendOptions::TensorParallelReduce::kPeer;
  ORIGAMI_RETURN_IF_ERROR(peer->init(tp_.peer_group, tp_.rank, config_.hidden_size, push));
  peer_ = std::move(peer);
  return Status::ok();
}

Status CudaBackend::connect_peer_reduce() { return peer_ != nullptr ? peer_->connect() : Status::ok(); }

void CudaBackend::all_reduce(void* buffer, size_t count, NcclDataType type) {
  if (tp_.size == 1) return;
  // A failing collective means a broken device or link, like a failing kernel launch: abort.
  const Status st = tp_.comms->all_reduce_sum(tp_.rank, buffer, count, type, stream_);
  ORIGAMI_CHECK_MSG(st.is_ok(), st.to_string().c_str());
}

Status CudaBackend::compute_all_logits(const ForwardBatch& batch, StepOutput* out) {
  const ModelConfig& c = config_;
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceInput& s = batch.sequences[i];
    if (s.logits_mode != LogitsMode::kAll) continue;
    std::vector<float>& dst = out->all_logits[i];
    dst.resize(static_cast<size_t>(s.num_query_tokens) * c.vocab_size);
    for (int r0 = 0; r0 < s.num_query_tokens; r0 += kLogitRows) {
      const int rows = std::min(kLogitRows, s.num_query_tokens - r0);
      // A sequence's rows are contiguous in the normed hidden states: no gather needed.
      lm_head_logits(normed_ + static_cast<size_t>(s.query_start + r0) * c.hidden_size, rows);
      ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst.data() + static_cast<size_t>(r0) * c.vocab_size,
                                                     c.vocab_size * sizeof(float), logits_,
                                                     static_cast<size_t>(logits_stride()) * sizeof(float),
                                                     c.vocab_size * sizeof(float), rows, cudaMemcpyDeviceToHost,
                                                     stream_));
      ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    }
  }
  return Status::ok();
}

Status CudaBackend::execute(const ForwardBatch& batch, StepOutput* out) {
  // finish_launched() reads the oldest launched step: none may be ahead of this one.
  if (num_launched_ > 0) return invalid_argument("CUDA backend: execute() while a launched step is unfinished");
  ORIGAMI_RETURN_IF_ERROR(launch(batch, out));
  return finish_launched(out);
}

Status CudaBackend::launch(const ForwardBatch& batch, StepOutput* out) {
  if (!loaded_ || kv_pool_ == nullptr) return invalid_argument("CUDA backend: execute before load/allocate_kv_cache");
  if (num_launched_ == kLaunchSlots)
    return invalid_argument("CUDA backend: a step launched while " + std::to_string(kLaunchSlots) +
                            " launched steps are unfinished");
  LaunchSlot& slot = slots_[next_slot_];
  ORIGAMI_CHECK_MSG(!slot.busy, "launch slots are finished in launch order");
  slot.has_work = false;
  slot.rows.clear();
  const Status st = enqueue_step(batch, slot, out);
  if (!st.is_ok()) {
    // A step that failed to launch leaves no tokens for the next one to take (its sampling may
    // have overwritten dev_tokens_ all the same).
    previous_slot_ = -1;
    return st;
  }
  slot.busy = true;
  previous_slot_ = next_slot_;
  next_slot_ = (next_slot_ + 1) % kLaunchSlots;
  ++num_launched_;
  return Status::ok();
}

Status CudaBackend::enqueue_step(const ForwardBatch& batch, LaunchSlot& slot, StepOutput* out) {
  ForwardBatchLimits limits;
  limits.vocab_size = config_.vocab_size;
  limits.block_size = kv_layout_.block_size;
  limits.num_blocks = kv_layout_.groups[0].num_blocks;
  limits.num_query_slots = compressor_ != nullptr ? compressor_->config().num_query_slots : -1;
  limits.num_groups = num_groups_;
  limits.check_page_tables = false;  // prepare_step checks them as it flattens them
  StepShape shape;
  shape.entered = std::chrono::steady_clock::now();
  {
    ORIGAMI_HOST_TIMER("cuda.validate_forward_batch");
    ORIGAMI_RETURN_IF_ERROR(validate_forward_batch(batch, limits));
  }
  {
    // The staging buffers are rewritten from here on (prepare_step, forward), and the previous
    // step's uploads from them may still be queued behind the step before it (which the engine
    // has finished by now, so this rarely waits).
    ORIGAMI_HOST_TIMER("cuda.launch.wait_uploads");
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(inputs_uploaded_));
    ORIGAMI_RETURN_IF_ERROR(input_upload_.wait_host_staging_read());
  }
  ORIGAMI_RETURN_IF_ERROR(stage_pending_tokens(batch));
  ORIGAMI_RETURN_IF_ERROR(prepare_step(batch, limits, &shape));
  {
    ORIGAMI_HOST_TIMER("cuda.compressions.start");
    compressions_.start(compressor_.get(), batch, out);
  }
  const Status st = [&] {
    ORIGAMI_HOST_TIMER("cuda.forward");
    return forward(batch, shape, slot, out);
  }();
  if (!st.is_ok()) {
    // Nothing to finish: the compressions that finished meanwhile are reported now, as a failed
    // execute() did.
    ORIGAMI_HOST_TIMER("cuda.compressions.collect");
    compressions_.collect(compressor_.get(), out);
  }
  return st;
}

Status CudaBackend::finish_launched(StepOutput* out) {
  if (num_launched_ == 0) return invalid_argument("CUDA backend: finish_launched() with no launched step");
  LaunchSlot& slot = slots_[(next_slot_ + kLaunchSlots - num_launched_) % kLaunchSlots];
  // A step without sequences enqueued nothing: only its compressions are left to collect.
  const Status st = slot.has_work ? read_results(slot, out) : Status::ok();
  slot.busy = false;
  --num_launched_;
  ORIGAMI_HOST_TIMER("cuda.compressions.collect");
  compressions_.collect(compressor_.get(), out);
  return st;
}

Status CudaBackend::stage_pending_tokens(const ForwardBatch& batch) {
  num_pending_ = 0;
  if (batch.pending_tokens.empty()) return Status::ok();
  ORIGAMI_RETURN_IF_ERROR(ensure_pending_capacity(batch.pending_tokens.size()));
  const std::vector<SampledRow>* previous = previous_slot_ >= 0 ? &slots_[previous_slot_].rows : nullptr;
  for (size_t i = 0; i < batch.pending_tokens.size(); ++i) {
    const PendingToken& p = batch.pending_tokens[i];
    const bool named = previous != nullptr && p.previous_sequence >= 0 &&
                       p.previous_sequence < static_cast<int>(previous->size());
    const int row = named ? (*previous)[p.previous_sequence].row : -1;
    if (row < 0)
      return invalid_argument("batch: pending token at index " + std::to_string(p.token_index) + " takes the token of " +
                              "sequence " + std::to_string(p.previous_sequence) + " of the previous launched step, " +
                              (previous == nullptr ? std::string("and there is none")
                               : named             ? std::string("which sampled none")
                                                   : "which has " + std::to_string(previous->size()) + " sequences"));
    host_pending_[i] = make_int2(p.token_index, row);
  }
  num_pending_ = static_cast<int>(batch.pending_tokens.size());
  return Status::ok();
}

Status CudaBackend::prepare_step(const ForwardBatch& batch, const ForwardBatchLimits& limits, StepShape* shape) {
  const int num_seqs = static_cast<int>(batch.sequences.size());
  if (num_seqs == 0) return Status::ok();
  const int G = num_groups_;
  // The folded checks found a table wrong: the validator's own page-table check names it.
  auto table_error = [&](const char* what) {
    ForwardBatchLimits full = limits;
    full.check_page_tables = true;
    const Status named = validate_forward_batch(batch, full);
    return named.is_ok() ? Status(ErrorCode::kInternal, std::string("CUDA backend: ") + what) : named;
  };
  const PageTableInputsSize size = [&] {
    ORIGAMI_HOST_TIMER("cuda.page_tables.size");
    return page_tables_.size(batch, G, kv_layout_.block_size);
  }();
  if (!size.tables_cover) return table_error("a page table does not cover its entries");
  // Decode steps replay a graph of their bucket; padding rows are inert.
  bool use_graph = options_.enable_cuda_graphs && batch.is_decode_only() && graphs_.bucket_for(num_seqs) > 0 &&
                   trace_ == nullptr && size.max_kv_len <= graph_max_kv_len_;
  for (const SequenceInput& s : batch.sequences) use_graph = use_graph && s.logits_mode != LogitsMode::kAll;
  const int run_seqs = use_graph ? graphs_.bucket_for(num_seqs) : num_seqs;
  const int run_tokens = use_graph ? run_seqs : static_cast<int>(batch.token_ids.size());
  if (size.num_pages + static_cast<int64_t>(G) * run_seqs > std::numeric_limits<int>::max())
    return invalid_argument("batch: " + std::to_string(size.num_pages) + " pages in one step, more than the step inputs hold");
  ORIGAMI_RETURN_IF_ERROR(ensure_capacity(run_tokens, run_seqs, static_cast<int>(size.num_pages) + G * run_seqs));
  // Page tables, lengths and slots per (group, sequence), group-major; a graph's padding rows read
  // one entry of the null block and write nothing.
  const InputLayout in = input_layout(cap_);
  PageTableInputsOut dst;
  dst.slots = host_inputs_ + in.slots;
  dst.page_indptr = host_inputs_ + in.page_indptr;
  dst.kv_len = host_inputs_ + in.kv_len;
  dst.page_indices = host_inputs_ + in.page_indices;
  const PageTableInputsFill fill = [&] {
    ORIGAMI_HOST_TIMER("cuda.page_tables.fill");
    return page_tables_.fill(batch, limits.num_blocks, run_seqs, run_tokens, dst);
  }();
  if (!fill.pages_inside) return table_error("a page table holds a block outside the pool");
  shape->use_graph = use_graph;
  shape->run_seqs = run_seqs;
  shape->run_tokens = run_tokens;
  shape->max_kv_len = size.max_kv_len;
  shape->num_pages = fill.num_pages;
  return Status::ok();
}

Status CudaBackend::forward(const ForwardBatch& batch, const StepShape& step, LaunchSlot& slot, StepOutput* out) {
  const ModelConfig& c = config_;
  const int num_seqs = static_cast<int>(batch.sequences.size());
  const int num_tokens = static_cast<int>(batch.token_ids.size());
  const int bs = kv_layout_.block_size;
  out->sampled_tokens.assign(num_seqs, -1);
  out->all_logits.resize(num_seqs);
  for (auto& v : out->all_logits) v.clear();
  out->token_logprobs.assign(num_seqs, std::numeric_limits<float>::quiet_NaN());
  out->logprobs.assign(num_seqs, TokenLogprobs{std::numeric_limits<float>::quiet_NaN(), {}});
  if (num_seqs == 0) return Status::ok();

  const bool use_graph = step.use_graph;
  const int G = num_groups_;
  const int max_kv_len = step.max_kv_len;
  bool any_logprobs = false, any_top = false;
  for (const SequenceInput& s : batch.sequences) {
    const bool samples = s.logits_mode != LogitsMode::kNone;
    any_top = any_top || (s.num_top_logprobs >= 0 && samples);
    any_logprobs = any_logprobs || (s.logprob_token >= 0 && samples) || (s.num_top_logprobs >= 0 && samples);
  }
  // Query capture (compression); validate_forward_batch checked the slots.
  const int num_slots = compressor_ != nullptr ? compressor_->config().num_query_slots : 0;
  bool any_capture = false;
  for (const SequenceInput& s : batch.sequences) any_capture = any_capture || s.query_slot >= 0;
  // A captured graph serves steps that capture and steps that do not, so it always copies.
  const bool capture_queries = num_slots > 0 && (use_graph || any_capture);
  const int run_seqs = step.run_seqs;
  const int run_tokens = step.run_tokens;
  // Logit adjustments of the sampled rows (penalties, logit_bias, min_tokens).
  size_t num_adjust = 0;
  for (const SequenceInput& s : batch.sequences)
    if (s.logits_mode != LogitsMode::kNone && s.logit_adjustments != nullptr)
      num_adjust += s.logit_adjustments->entries().size();
  ORIGAMI_RETURN_IF_ERROR(ensure_adjustment_capacity(num_adjust));
  num_adjust = 0;

  // Fill the pinned staging buffer.
  const InputLayout in = input_layout(cap_);
  int32_t* hi = host_inputs_;
  const int max_window = compressor_ != nullptr ? compressor_->config().max_window : 1;
  const int page_count = step.num_pages;
  int num_sample_rows = 0;
  bool all_greedy = true;
  hi[in.q_indptr] = 0;
  slot.rows.assign(num_seqs, SampledRow{});
  for (int i = 0; i < num_seqs; ++i) {
    const SequenceInput& s = batch.sequences[i];
    for (int j = 0; j < s.num_query_tokens; ++j) {
      const int t = s.query_start + j;
      const int e = s.num_cached_entries + j;
      hi[in.tokens + t] = batch.token_ids[t];
      hi[in.positions + t] = batch.positions[t];
      hi[in.query_rows + t] = s.query_slot >= 0 && e >= s.query_capture_from
                                  ? s.query_slot * max_window + batch.positions[t] % max_window
                                  : -1;
    }
    hi[in.q_indptr + i + 1] = s.query_start + s.num_query_tokens;
    if (use_graph || s.logits_mode != LogitsMode::kNone) {
      RowSamplingParams& rp = host_params_[num_sample_rows];
      rp = row_sampling_params(s.sampling, sampling_uniform(s.seed, static_cast<uint64_t>(s.sample_index)));
      if (s.logits_mode == LogitsMode::kNone) rp.greedy = 1;
      rp.logprob_token = s.logits_mode == LogitsMode::kNone ? -1 : s.logprob_token;
      rp.num_top_logprobs = s.logits_mode == LogitsMode::kNone ? -1 : s.num_top_logprobs;
      rp.adjust_begin = static_cast<int>(num_adjust);
      rp.adjust_count = 0;
      if (s.logits_mode != LogitsMode::kNone && s.logit_adjustments != nullptr) {
        const std::vector<LogitAdjustment>& entries = s.logit_adjustments->entries();
        std::copy(entries.begin(), entries.end(), host_adjust_ + num_adjust);
        num_adjust += entries.size();
        rp.adjust_count = static_cast<int>(entries.size());
        rp.repetition_penalty = s.logit_adjustments->repetition_penalty();
        rp.presence_penalty = s.logit_adjustments->presence_penalty();
      }
      all_greedy = all_greedy && rp.greedy != 0;
      hi[in.sample_rows + num_sample_rows] = s.query_start + s.num_query_tokens - 1;
      if (s.logits_mode != LogitsMode::kNone)  // a graph's row of a kNone sequence yields nothing
        slot.rows[i] = SampledRow{num_sample_rows, s.logprob_token >= 0, s.num_top_logprobs};
      ++num_sample_rows;
    }
  }
  if (use_graph) {
    // Padding rows: token 0 at position 0, no KV write, one entry read from the null block.
    for (int i = num_seqs; i < run_seqs; ++i) {
      hi[in.tokens + i] = 0;
      hi[in.positions + i] = 0;
      hi[in.query_rows + i] = -1;
      hi[in.q_indptr + i + 1] = i + 1;
      host_params_[num_sample_rows] = RowSamplingParams{};
      hi[in.sample_rows + num_sample_rows] = i;
      ++num_sample_rows;
    }
  }
  // A mixed step (eager, one page table) whose first sequences decode: the attention runs them as
  // a decode batch and the sequences after them in a second launch (MixedAttentionPlan), whose
  // q_indptr counts from its own first token.
  const AttentionShape shape{run_seqs, run_tokens, c.num_heads, c.num_kv_heads, c.head_dim, bs};
  MixedAttentionPlan mixed;
  if (!use_graph && kv_fp8_ && options_.mixed_decode_attention && ragged_.empty() && num_tokens > num_seqs) {
    int decode_seqs = 0;
    while (decode_seqs < num_seqs && batch.sequences[decode_seqs].num_query_tokens == 1) ++decode_seqs;
    int decode_len = 1, rest_len = 1;  // the longest of each part (the page tables' fill wrote them)
    for (int i = 0; i < num_seqs; ++i) {
      int& longest = i < decode_seqs ? decode_len : rest_len;
      longest = std::max(longest, static_cast<int>(hi[in.kv_len + i]));
    }
    mixed = plan_mixed_attention(shape, decode_seqs, decode_len, rest_len, true, num_sms_);
    // The balanced decode kernel as for decode steps: with both options (it merges with the counters).
    if (!options_.balanced_attention || !options_.fused_attention_merge) mixed.decode.stream_ctas = 0;
    for (int i = 0; mixed.decode_seqs > 0 && i <= num_seqs - mixed.decode_seqs; ++i)
      hi[in.rest_q_indptr + i] = hi[in.q_indptr + mixed.decode_seqs + i] - mixed.decode_seqs;
  }
  const int rest_q_values = mixed.decode_seqs > 0 ? num_seqs - mixed.decode_seqs + 1 : 0;
  // Exactly what the loops above wrote (and the kernels read): every region in layout order.
  const size_t group_tokens = static_cast<size_t>(G) * run_tokens, group_seqs = static_cast<size_t>(G) * run_seqs;
  const InputRange used[] = {
      {in.tokens, in.tokens + run_tokens},
      {in.positions, in.positions + run_tokens},
      {in.slots, in.slots + group_tokens},
      {in.query_rows, in.query_rows + run_tokens},
      {in.q_indptr, in.q_indptr + run_seqs + 1},
      {in.page_indptr, in.page_indptr + group_seqs + 1},
      {in.kv_len, in.kv_len + group_seqs},
      {in.sample_rows, in.sample_rows + num_sample_rows},
      {in.rest_q_indptr, in.rest_q_indptr + rest_q_values},
      {in.page_indices, in.page_indices + page_count},
  };
  ORIGAMI_RETURN_IF_ERROR(ensure_slot_capacity(slot, num_sample_rows));
  out->prepare_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - step.entered).count();
  ORIGAMI_HOST_TIMER("cuda.forward.upload_plan_launch");
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.start, stream_));
  // Behind a launched step that still runs, the inputs cross PCIe on the copy stream meanwhile.
  ORIGAMI_RETURN_IF_ERROR(input_upload_.upload(dev_inputs_, host_inputs_, used, sizeof(used) / sizeof(used[0]),
                                               overlap_input_upload_ && num_launched_ > 0, stream_));
  if (num_sample_rows > 0)
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_params_, host_params_,
                                                 num_sample_rows * sizeof(RowSamplingParams), cudaMemcpyHostToDevice,
                                                 stream_));
  if (num_adjust > 0)
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_adjust_, host_adjust_, num_adjust * sizeof(LogitAdjustment),
                                                 cudaMemcpyHostToDevice, stream_));
  if (num_pending_ > 0)
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_pending_, host_pending_, num_pending_ * sizeof(int2),
                                                 cudaMemcpyHostToDevice, stream_));
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventRecord(inputs_uploaded_, stream_));
  // The tokens the previous step sampled, over the uploaded placeholders, before the embedding
  // reads them (outside the graph: which tokens are pending changes every step).
  launch_gather_pending_tokens(dev_pending_, num_pending_, dev_tokens_, dev_inputs_ + in.tokens, stream_);

  // Head groups with non-uniform budgets: splits sized by the mean group length
  // (RaggedHeadTables::planning_length) within one resident wave, shared out by the split map.
  const int plan_len = use_graph ? graph_max_kv_len_ : max_kv_len;
  const bool budgets = !ragged_.empty() && !ragged_.uniform_budgets();
  const int ragged_len = budgets ? ragged_.planning_length(plan_len) : plan_len;
  const AttentionPlan uniform = budgets ? plan_ragged_attention(shape, ragged_len, num_sms_)
                                        : plan_paged_attention(shape, plan_len, num_sms_);
  // Head groups: the same CTAs per query tile, shared among the groups by the split map where it
  // wins (decided per split count when the budgets loaded: RaggedHeadTables::use_split_map), else
  // plain splits. A graph bucket plans with graph_max_kv_len_, so its choice is fixed at capture.
  const bool split_map = budgets && ragged_.use_split_map(uniform.num_splits, ragged_len);
  AttentionPlan plan =
      ragged_.empty() ? uniform
                      : ragged_plan(uniform, ragged_.layer(0, uniform.num_splits, kv_page_elems_, split_map));
  // The balanced FP8 decode kernel where it beats the splits at this step's own lengths (a graph's
  // plan is made for its capture length; the choice is recorded as a graph variant). It merges
  // through the split counters: it needs both options.
  plan.stream_ctas = kv_fp8_ && options_.balanced_attention && options_.fused_attention_merge
                         ? balanced_step_ctas(shape, max_kv_len, num_sms_, !ragged_.empty())
                         : 0;
  const bool balanced = plan.stream_ctas > 0;
  if (balanced) ++num_balanced_attention_steps_;
  if (mixed.decode_seqs > 0) {
    ++num_mixed_attention_steps_;
  } else {
    mixed.rest = plan;
  }
  ORIGAMI_RETURN_IF_ERROR(ensure_attention_workspace(mixed_attention_workspace_bytes(mixed, shape)));
  const int uniform_splits = uniform.num_splits;
  // Tensor parallelism: a step whose rows all decode greedily, with no logit adjustments or
  // log-probabilities, needs only each rank's best token, not the logits of every rank (at 256
  // rows of a 152k vocabulary the logits all-gather moves 78 MB a rank: 4-5% of the step).
  const bool shard_greedy = tp_.size > 1 && all_greedy && num_adjust == 0 && !any_logprobs;
  if (use_graph) {
    // A graph per (bucket, variant): greedy-only sampling across ranks, the balanced attention.
    const int variant = (shard_greedy ? 1 : 0) | (balanced ? 2 : 0);
    graphs_.run(run_seqs, variant, stream_, [&] {
      record_step(run_tokens, run_seqs, num_sample_rows, mixed, uniform_splits, split_map, capture_queries,
                  shard_greedy);
    });
    ++num_graph_steps_;
  } else {
    record_step(run_tokens, run_seqs, num_sample_rows, mixed, uniform_splits, split_map, capture_queries,
                shard_greedy);
  }
  if (num_sample_rows > 0)
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot.tokens, dev_tokens_, num_sample_rows * sizeof(int32_t),
                                                 cudaMemcpyDeviceToHost, stream_));
  if (num_sample_rows > 0 && any_logprobs)
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot.logprobs, dev_logprobs_, num_sample_rows * sizeof(float),
                                                 cudaMemcpyDeviceToHost, stream_));
  if (num_sample_rows > 0 && any_top)
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot.top, dev_top_,
                                                 static_cast<size_t>(num_sample_rows) * kMaxTopLogprobs * sizeof(TopLogprob),
                                                 cudaMemcpyDeviceToHost, stream_));
  ORIGAMI_RETURN_IF_ERROR(compute_all_logits(batch, out));
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.end, stream_));
  slot.has_work = true;
  return Status::ok();
}

Status CudaBackend::read_results(const LaunchSlot& slot, StepOutput* out) const {
  {
    // The step's own end, not the stream's: the next step may be queued behind it already.
    ORIGAMI_HOST_TIMER("cuda.forward.wait");
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.end));
  }
  float device_ms = 0.0f;
  if (cudaEventElapsedTime(&device_ms, slot.start, slot.end) == cudaSuccess) out->device_seconds = 1e-3 * device_ms;
  else cudaGetLastError();  // timing is best effort: no stale error for a later launch check
  const size_t num_seqs = slot.rows.size();
  if (out->sampled_tokens.size() != num_seqs || out->token_logprobs.size() != num_seqs || out->logprobs.size() != num_seqs)
    return invalid_argument("CUDA backend: finish_launched() was not given the StepOutput its launch() filled");
  for (size_t i = 0; i < num_seqs; ++i) {
    const SampledRow& r = slot.rows[i];
    if (r.row < 0) continue;
    out->sampled_tokens[i] = slot.tokens[r.row];
    if (r.token_logprob) out->token_logprobs[i] = slot.logprobs[r.row];
    if (r.num_top_logprobs >= 0) {
      TokenLogprobs& lp = out->logprobs[i];
      lp.logprob = slot.logprobs[r.row];
      const TopLogprob* top = slot.top + static_cast<size_t>(r.row) * kMaxTopLogprobs;
      lp.top.assign(top, top + std::min(r.num_top_logprobs, config_.vocab_size));
    }
  }
  return Status::ok();
}

Status CudaBackend::configure_compression(const CompressionConfig& config) {
  if (!loaded_ || kv_pool_ == nullptr)
    return invalid_argument("CUDA backend: configure_compression() before load() and allocate_kv_cache()");
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  graphs_.clear();  // captured graphs point at the old query cache (or capture nothing)
  if (compressor_ == nullptr) compressor_ = std::make_unique<CudaCompressor>(stream_);
  if (tp_.size > 1) ORIGAMI_RETURN_IF_ERROR(compressor_->set_tensor_parallel(tp_.compressor_peers, tp_.rank));
  CudaCompressor::Geometry g;
  g.num_layers = config_.num_layers;
  g.num_kv_heads = config_.num_kv_heads;
  g.num_q_heads = config_.num_heads;
  g.head_dim = config_.head_dim;
  g.block_size = kv_layout_.block_size;
  g.num_blocks = kv_layout_.groups[0].num_blocks;
  g.k = k_cache_[0];
  g.v = v_cache_[0];
  if (kv_fp8_) {
    g.k8 = k_codes_[0];
    g.v8 = v_codes_[0];
    g.k_scales = k_scales_[0];
    g.v_scales = v_scales_[0];
  }
  g.kv_layer_pitch = 2 * kv_layer_elems_;
  if (!ragged_.empty()) {  // head groups: the pool's pages, each group's layer and heads
    g.heads_per_group = kv_layout_.heads_per_group();
    for (const HeadGroup& hg : kv_layout_.groups) {
      g.group_layer.push_back(hg.layers[0]);
      g.group_heads.insert(g.group_heads.end(), hg.kv_heads.begin(), hg.kv_heads.end());
    }
  }
  const Status st = compressor_->configure(config, g);
  if (!st.is_ok()) compressor_.reset();
  return st;
}

Status CudaBackend::load_gates(const gates::GateWeights& g) {
  if (!loaded_ || kv_pool_ == nullptr) return invalid_argument("cuda backend: load_gates() before load()");
  // With tensor parallelism `g` is this rank's slice (TensorParallelBackend::load_gates), checked
  // against this rank's share of the heads.
  if (Status st = gates::check_gate_shape(g, config_); !st.is_ok())
    return invalid_argument("cuda backend: " + st.message());
  if (compressor_ == nullptr || compressor_->global_scores() == nullptr)
    return invalid_argument("cuda backend: gate scores are written to the global-score pages; configure compression "
                            "with global scores before load_gates()");
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  graphs_.clear();  // captured graphs have no gate launches
  ORIGAMI_RETURN_IF_ERROR(gates_.load(g));
  return gates_.reserve(cap_.tokens);
}

size_t CudaBackend::query_slot_bytes(int max_window) const {
  if (!loaded_) return 0;
  CudaCompressor::Geometry g;
  g.num_layers = config_.num_layers;
  g.num_q_heads = config_.num_heads;
  g.head_dim = config_.head_dim;
  return CudaCompressor::query_slot_bytes(g, max_window);
}

void CudaBackend::synchronize() const { ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

}  // namespace origami::cuda

namespace origami {

Expected<std::unique_ptr<Backend>> create_cuda_backend(const BackendOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return invalid_argument("device 'cuda': no CUDA device is available");
  }
  if (options.gpu_memory_utilization <= 0.0f || options.gpu_memory_utilization > 1.0f)
    return invalid_argument("gpu_memory_utilization must be in (0, 1]");
  if (options.tensor_parallel_size > 1) return cuda::TensorParallelBackend::create(options);
  return std::unique_ptr<Backend>(std::make_unique<cuda::CudaBackend>(options));
}

}  // namespace origami
