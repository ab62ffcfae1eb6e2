#pragma once
// A model's tensors, checked by name, dtype and shape at load time. Tensors are views into
// memory-mapped safetensors files (or owned buffers for --dummy-weights); backends convert them
// to their own storage (fp32 on the CPU, bf16 on the GPU).
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"

namespace origami {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major, HF layout ([out_features, in_features] for Linear)
  const void* data = nullptr;

  bool empty() const { return data == nullptr; }
  int64_t numel() const;
  // Converts the whole tensor to fp32.
  std::vector<float> to_f32() const;
};

// The scales beside an FP8 Linear weight (dtype kF8E4M3) in a quantized checkpoint; empty
// views for unquantized weights.
struct Fp8Scales {
  TensorView weight_scale;  // [out] or [out, 1] per output channel, [] or [1] per tensor
  TensorView input_scale;   // [] or [1]: static activation scale; empty: dynamic per token
};

struct LayerWeights {
  TensorView input_norm;       // [hidden]
  TensorView q_proj;           // [num_heads * head_dim, hidden]
  TensorView k_proj;           // [num_kv_heads * head_dim, hidden]
  TensorView v_proj;           // [num_kv_heads * head_dim, hidden]
  TensorView q_bias, k_bias, v_bias;  // Qwen2 only: [out]
  TensorView q_norm, k_norm;   // Qwen3 only: [head_dim]
  TensorView o_proj;           // [hidden, num_heads * head_dim]
  TensorView post_attn_norm;   // [hidden]
  TensorView gate_proj;        // [intermediate, hidden]
  TensorView up_proj;          // [intermediate, hidden]
  TensorView down_proj;        // [hidden, intermediate]
  // FP8 checkpoints: each projection's scales (same order as linears()).
  Fp8Scales q_scales, k_scales, v_scales, o_scales, gate_scales, up_scales, down_scales;

  // The seven projections with their scales: q, k, v, o, gate, up, down.
  struct Linear {
    const char* name;  // "q_proj", ...
    TensorView* weight;
    Fp8Scales* scales;
  };
  std::array<Linear, 7> linears();
  std::array<const Linear, 7> linears() const;
};

// Owns whatever backs the views (mmaps or buffers); movable, not copyable.
class WeightStorage {
 public:
  virtual ~WeightStorage() = default;
};

struct ModelWeights {
  TensorView embed_tokens;  // [vocab, hidden]
  TensorView final_norm;    // [hidden]
  TensorView lm_head;       // [vocab, hidden]; same data as embed_tokens when tied
  std::vector<LayerWeights> layers;
  std::vector<std::shared_ptr<WeightStorage>> storage;
};

// Loads model.safetensors or the shards named by model.safetensors.index.json, memory-mapped.
// Every expected tensor must be present with the config's shape and a supported dtype; errors
// name the file and the tensor. FP8 checkpoints (config.quantization): projections may be
// F8_E4M3, each with its `*.weight_scale` (and `*.input_scale` when the config has static
// activation scales); embeddings, norms and the LM head must not be.
Expected<ModelWeights> load_model_weights(const std::filesystem::path& model_dir, const ModelConfig& config);

// Random weights for any config (normal(0, 0.02)-like, norms = 1), for benchmarks of shapes whose
// weights are not available. Deterministic in `seed`.
ModelWeights make_dummy_weights(const ModelConfig& config, DType dtype, uint64_t seed);

}  // namespace origami
