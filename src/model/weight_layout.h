#pragma once
// The tensors a config implies: HuggingFace names, shapes, and where each lands in ModelWeights.
// The loader and the dummy-weight generator both walk this list, so they cannot disagree.
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace origami {

enum class WeightKind { kMatrix, kNorm, kBias };

struct WeightSlot {
  std::string name;            // e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // as the config implies
  WeightKind kind = WeightKind::kMatrix;
  TensorView* view = nullptr;  // the field of the ModelWeights passed in
};

// Lists every tensor of the config: embeddings, per-layer tensors (biases for Qwen2, q/k norms for
// Qwen3), final norm, and lm_head unless tied. Resizes weights->layers to config.num_layers when
// it differs; views already filled are kept, so this also walks a loaded model's tensors.
std::vector<WeightSlot> weight_slots(const ModelConfig& config, ModelWeights* weights);

std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace origami
