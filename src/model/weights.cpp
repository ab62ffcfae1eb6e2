#include "model/weights.h"

#include <algorithm>
#include <cstdio>

#include "core/check.h"
#include "core/host_memory.h"
#include "model/safetensors.h"
#include "model/weight_layout.h"

namespace origami {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> TensorView::to_f32() const {
  const int64_t n = numel();
  std::vector<float> out(static_cast<size_t>(n));
  if (n == 0) return out;
  ORIGAMI_CHECK_MSG(data != nullptr, name.c_str());
  // Embedding and lm_head matrices run to hundreds of MB; convert in parallel chunks.
  constexpr int64_t kChunk = 1 << 20;
  const int64_t num_chunks = (n + kChunk - 1) / kChunk;
  const size_t elem = dtype_size(dtype);
  const uint8_t* src = static_cast<const uint8_t*>(data);
#pragma omp parallel for schedule(static) if (num_chunks > 1)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t begin = c * kChunk;
    const int64_t count = std::min(kChunk, n - begin);
    convert_to_f32(src + begin * elem, dtype, static_cast<size_t>(count), out.data() + begin);
  }
  return out;
}

Expected<ModelWeights> load_model_weights(const std::filesystem::path& model_dir, const ModelConfig& config) {
  ORIGAMI_ASSIGN_OR_RETURN(std::shared_ptr<SafetensorsCheckpoint> ckpt, SafetensorsCheckpoint::open(model_dir));
  // Before anything is sized from the config (a config.json with a billion layers must not end
  // in std::bad_alloc): the files must hold at least 2 bytes (bf16/f16) per parameter it implies.
  double file_bytes = 0;
  for (const auto& file : ckpt->files())
    for (const SafetensorsTensorInfo& t : file->tensors()) file_bytes += static_cast<double>(t.end - t.begin);
  const double params = config.parameter_count();
  if (params * 2 > file_bytes) {
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", params);
    return invalid_file(ckpt->source() + ": config.json describes " + count + " parameters (at least " +
                        format_bytes(params * 2) + " of weights), but the weight files hold only " +
                        format_bytes(file_bytes) +
                        ": check num_hidden_layers, hidden_size, intermediate_size and vocab_size in config.json");
  }
  ModelWeights weights;
  for (WeightSlot& slot : weight_slots(config, &weights)) {
    const SafetensorsFile* file = ckpt->file_of(slot.name);
    if (file == nullptr) {
      std::string msg = ckpt->source() + ": missing tensor '" + slot.name + "' (expected shape " +
                        shape_to_string(slot.shape) + ")";
      if (slot.name == "lm_head.weight") msg += "; config.json has tie_word_embeddings = false";
      return not_found(msg);
    }
    ORIGAMI_ASSIGN_OR_RETURN(TensorView view, file->view(slot.name));
    if (view.shape != slot.shape) {
      return invalid_file(file->path().string() + ": tensor '" + slot.name + "' has shape " +
                          shape_to_string(view.shape) + ", but config.json implies " + shape_to_string(slot.shape));
    }
    *slot.view = std::move(view);
  }
  if (config.tie_word_embeddings) weights.lm_head = weights.embed_tokens;
  weights.storage.push_back(std::move(ckpt));
  return weights;
}

}  // namespace origami
