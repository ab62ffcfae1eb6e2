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

std::array<LayerWeights::Linear, 7> LayerWeights::linears() {
  return {{{"q_proj", &q_proj, &q_scales},
           {"k_proj", &k_proj, &k_scales},
           {"v_proj", &v_proj, &v_scales},
           {"o_proj", &o_proj, &o_scales},
           {"gate_proj", &gate_proj, &gate_scales},
           {"up_proj", &up_proj, &up_scales},
           {"down_proj", &down_proj, &down_scales}}};
}

std::array<const LayerWeights::Linear, 7> LayerWeights::linears() const {
  auto* self = const_cast<LayerWeights*>(this);  // the views are only read through the result
  const auto l = self->linears();
  return {{l[0], l[1], l[2], l[3], l[4], l[5], l[6]}};
}

namespace {

bool is_scalar_shape(const std::vector<int64_t>& s) { return s.empty() || (s.size() == 1 && s[0] == 1); }

// Reads `<weight prefix>.weight_scale` (and `.input_scale`) for an F8_E4M3 projection.
Status load_fp8_scales(const SafetensorsCheckpoint& ckpt, const ModelConfig& config, const TensorView& weight,
                       Fp8Scales* scales) {
  const std::string prefix = weight.name.substr(0, weight.name.size() - std::string("weight").size());
  const int64_t rows = weight.shape[0];
  auto read = [&](const std::string& name, TensorView* out) -> Status {
    const SafetensorsFile* file = ckpt.file_of(name);
    if (file == nullptr) return not_found(ckpt.source() + ": missing tensor '" + name + "' beside the F8_E4M3 '" +
                                          weight.name + "'");
    ORIGAMI_ASSIGN_OR_RETURN(*out, file->view(name));
    if (out->dtype == DType::kF8E4M3)
      return invalid_file(file->path().string() + ": tensor '" + name + "' must be F32, BF16 or F16, not F8_E4M3");
    return Status::ok();
  };
  ORIGAMI_RETURN_IF_ERROR(read(prefix + "weight_scale", &scales->weight_scale));
  const std::vector<int64_t>& ws = scales->weight_scale.shape;
  const bool per_channel = (ws.size() == 1 && ws[0] == rows) || (ws.size() == 2 && ws[0] == rows && ws[1] == 1);
  if (!per_channel && !is_scalar_shape(ws)) {
    return invalid_file(ckpt.source() + ": tensor '" + scales->weight_scale.name + "' has shape " +
                        shape_to_string(ws) + "; FP8 weight scales must be per channel ([" + std::to_string(rows) +
                        ", 1]) or per tensor ([]) (block-wise and per-group scales are not supported)");
  }
  if (config.quantization.static_input_scales) {
    ORIGAMI_RETURN_IF_ERROR(read(prefix + "input_scale", &scales->input_scale));
    if (!is_scalar_shape(scales->input_scale.shape))
      return invalid_file(ckpt.source() + ": tensor '" + scales->input_scale.name + "' has shape " +
                          shape_to_string(scales->input_scale.shape) + "; static input scales must be per tensor ([])");
  }
  return Status::ok();
}

}  // namespace

Expected<ModelWeights> load_model_weights(const std::filesystem::path& model_dir, const ModelConfig& config) {
  ORIGAMI_ASSIGN_OR_RETURN(std::shared_ptr<SafetensorsCheckpoint> ckpt, SafetensorsCheckpoint::open(model_dir));
  // Before anything is sized from the config (a config.json with a billion layers must not end
  // in std::bad_alloc): the files must hold at least 2 bytes (bf16/f16) per parameter it implies,
  // 1 byte for FP8 checkpoints.
  double file_bytes = 0;
  for (const auto& file : ckpt->files()) {
    for (const SafetensorsTensorInfo& t : file->tensors()) {
      file_bytes += static_cast<double>(t.end - t.begin);
      if (t.supported && t.dtype == DType::kF8E4M3 && !config.quantization.fp8()) {
        return invalid_file(file->path().string() + ": tensor '" + t.name +
                            "' is F8_E4M3, but config.json has no FP8 quantization_config (nor hf_quant_config.json)");
      }
    }
  }
  const double params = config.parameter_count();
  const double min_bytes_per_param = config.quantization.fp8() ? 1.0 : 2.0;
  if (params * min_bytes_per_param > file_bytes) {
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", params);
    return invalid_file(ckpt->source() + ": config.json describes " + count + " parameters (at least " +
                        format_bytes(params * min_bytes_per_param) + " of weights), but the weight files hold only " +
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
  if (config.quantization.fp8()) {
    // Only the projections are quantized; embeddings, norms and the LM head stay high precision.
    for (const WeightSlot& slot : weight_slots(config, &weights)) {
      if (slot.view->dtype == DType::kF8E4M3 && slot.kind != WeightKind::kMatrix)
        return invalid_file(ckpt->source() + ": tensor '" + slot.name + "' is F8_E4M3; only projections may be");
    }
    if (weights.embed_tokens.dtype == DType::kF8E4M3 || weights.lm_head.dtype == DType::kF8E4M3)
      return invalid_file(ckpt->source() + ": FP8 embeddings or LM head are not supported (they stay BF16)");
    for (LayerWeights& layer : weights.layers) {
      for (const LayerWeights::Linear& l : layer.linears()) {
        if (l.weight->dtype == DType::kF8E4M3)
          ORIGAMI_RETURN_IF_ERROR(load_fp8_scales(*ckpt, config, *l.weight, l.scales));
      }
    }
  }
  if (config.tie_word_embeddings) weights.lm_head = weights.embed_tokens;
  weights.storage.push_back(std::move(ckpt));
  return weights;
}

}  // namespace origami
