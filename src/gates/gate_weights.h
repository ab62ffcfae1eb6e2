#pragma once
// The weights of Fast KVzip's sink-attention gates (Fast KVzip §3.4, SPEC §3): one gate per layer
// mapping the layer's attention input h (the hidden state after the layer's input RMSNorm, the
// row its q/k/v projections read) to a keep score in [0, 1] per KV head. Per layer:
//
//   q_proj.weight [H*G*R, D], q_proj.bias [H*G*R]   low-rank queries, one per GQA query head
//   k_proj.weight [H*R, D]                          low-rank key, one per KV head
//   q_norm.weight [R], k_norm.weight [R]            RMSNorm weights (Qwen3's "weighted normalization")
//   sink_keys [H, S, R]                             the learned sink keys
//   bias [H, G]                                     b >= 0, the denominator's constant
//
// with H KV heads, G query heads per KV head, D the hidden size, R = 16 (D') and S = 16 sinks.
// Stored as F32 safetensors tensors named "layers.<l>.<name>"; the metadata records the shape and
// the model it was trained for, and loading checks every tensor against the model's config.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace origami::gates {

inline constexpr int kDefaultGateRank = 16;   // D'
inline constexpr int kDefaultGateSinks = 16;  // S

struct GateShape {
  int num_layers = 0;
  int num_kv_heads = 0;  // H
  int group_size = 0;    // G: query heads per KV head
  int hidden_size = 0;   // D
  int rank = kDefaultGateRank;
  int num_sinks = kDefaultGateSinks;

  int q_rows() const { return num_kv_heads * group_size * rank; }
  int k_rows() const { return num_kv_heads * rank; }
  // Spelled out: nvcc's front end (this header reaches the CUDA backend) rejects a defaulted ==.
  bool operator==(const GateShape& o) const {
    return num_layers == o.num_layers && num_kv_heads == o.num_kv_heads && group_size == o.group_size &&
           hidden_size == o.hidden_size && rank == o.rank && num_sinks == o.num_sinks;
  }
};

// The gate shape for a model (H, G, D from its config; R and S as given).
GateShape gate_shape_for(const ModelConfig& config, int rank = kDefaultGateRank, int num_sinks = kDefaultGateSinks);

// One layer's parameters, each a flat row-major array of the shape above.
struct GateLayer {
  std::vector<float> q_weight, q_bias, k_weight, q_norm, k_norm, sink_keys, bias;

  // Every parameter array with its tensor name, in file order (the optimizer walks the same list).
  std::vector<std::pair<const char*, std::vector<float>*>> tensors();
  std::vector<std::pair<const char*, const std::vector<float>*>> tensors() const;
};

struct GateWeights {
  GateShape shape;
  std::vector<GateLayer> layers;
  std::map<std::string, std::string> metadata;  // training provenance, written to the file
};

// The shape of each tensor of a layer, by name.
std::vector<int64_t> gate_tensor_shape(const GateShape& shape, const std::string& name);

// Whether `gates` fit `config` (layers, KV heads, group, hidden size; one layer of weights per
// model layer), as every backend's load_gates checks; the error spells out the gates' shape.
Status check_gate_shape(const GateWeights& gates, const ModelConfig& config);

// The gates of KV heads [first_kv_head, first_kv_head + num_kv_heads): every per-head tensor's
// rows of those heads (q_proj / q_bias: their G query gates, k_proj, sink_keys, bias), the shared
// q_norm / k_norm whole. A head's score depends on its own rows only, so a tensor-parallel rank
// holding those KV heads scores them with this slice exactly as the whole gates would.
GateWeights slice_gates(const GateWeights& gates, int first_kv_head, int num_kv_heads);

// A layer of zeros of the right sizes.
GateLayer zero_gate_layer(const GateShape& shape);
// The reference initialization: projections uniform in +-1/sqrt(D) (torch's Linear default),
// norm weights 1, sink keys and biases 0 (every score starts at 1 / (1 + S)). Deterministic in seed.
GateWeights init_gates(const GateShape& shape, uint64_t seed);

Status save_gates(const std::filesystem::path& path, const GateWeights& weights);
// Reads a gate file and checks it against `config`: every tensor present, F32 and of the shape
// the model implies (errors name the file, the tensor and both shapes), no NaN/inf, biases >= 0.
Expected<GateWeights> load_gates(const std::filesystem::path& path, const ModelConfig& config);

}  // namespace origami::gates
