#include "gates/gate_weights.h"

#include "core/check.h"

#include <cmath>
#include <random>

#include "model/safetensors.h"
#include "model/safetensors_writer.h"

namespace origami::gates {
namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string tensor_name(int layer, const char* name) { return "layers." + std::to_string(layer) + "." + name; }

}  // namespace

GateShape gate_shape_for(const ModelConfig& config, int rank, int num_sinks) {
  GateShape s;
  s.num_layers = config.num_layers;
  s.num_kv_heads = config.num_kv_heads;
  s.group_size = config.num_kv_heads > 0 ? config.num_heads / config.num_kv_heads : 0;
  s.hidden_size = config.hidden_size;
  s.rank = rank;
  s.num_sinks = num_sinks;
  return s;
}

Status check_gate_shape(const GateWeights& g, const ModelConfig& config) {
  if (g.shape == gate_shape_for(config, g.shape.rank, g.shape.num_sinks) &&
      static_cast<int>(g.layers.size()) == config.num_layers)
    return Status::ok();
  return invalid_argument("the gates' shape (" + std::to_string(g.shape.num_layers) + " layers, " +
                          std::to_string(g.shape.num_kv_heads) + " KV heads, group " +
                          std::to_string(g.shape.group_size) + ", hidden " + std::to_string(g.shape.hidden_size) +
                          ") does not match the model");
}

GateWeights slice_gates(const GateWeights& g, int first, int count) {
  ORIGAMI_CHECK(first >= 0 && count >= 1 && first + count <= g.shape.num_kv_heads);
  GateWeights out;
  out.shape = g.shape;
  out.shape.num_kv_heads = count;
  out.metadata = g.metadata;
  const size_t G = g.shape.group_size, R = g.shape.rank, S = g.shape.num_sinks;
  // Rows [first * per_head, (first + count) * per_head) of a tensor laid out head-major.
  auto rows = [&](const std::vector<float>& v, size_t per_head) {
    return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(first * per_head),
                              v.begin() + static_cast<std::ptrdiff_t>((first + count) * per_head));
  };
  const size_t D = g.shape.hidden_size;
  for (const GateLayer& l : g.layers) {
    GateLayer s;
    s.q_weight = rows(l.q_weight, G * R * D);
    s.q_bias = rows(l.q_bias, G * R);
    s.k_weight = rows(l.k_weight, R * D);
    s.q_norm = l.q_norm;
    s.k_norm = l.k_norm;
    s.sink_keys = rows(l.sink_keys, S * R);
    s.bias = rows(l.bias, G);
    out.layers.push_back(std::move(s));
  }
  return out;
}

// One list for the mutable and the const view, so that the names and order exist once.
template <class Layer, class Vec>
std::vector<std::pair<const char*, Vec*>> layer_tensors(Layer& l) {
  return {{"q_proj.weight", &l.q_weight}, {"q_proj.bias", &l.q_bias}, {"k_proj.weight", &l.k_weight},
          {"q_norm.weight", &l.q_norm},   {"k_norm.weight", &l.k_norm}, {"sink_keys", &l.sink_keys},
          {"bias", &l.bias}};
}

std::vector<std::pair<const char*, std::vector<float>*>> GateLayer::tensors() {
  return layer_tensors<GateLayer, std::vector<float>>(*this);
}

std::vector<std::pair<const char*, const std::vector<float>*>> GateLayer::tensors() const {
  return layer_tensors<const GateLayer, const std::vector<float>>(*this);
}

std::vector<int64_t> gate_tensor_shape(const GateShape& s, const std::string& name) {
  if (name == "q_proj.weight") return {s.q_rows(), s.hidden_size};
  if (name == "q_proj.bias") return {s.q_rows()};
  if (name == "k_proj.weight") return {s.k_rows(), s.hidden_size};
  if (name == "q_norm.weight" || name == "k_norm.weight") return {s.rank};
  if (name == "sink_keys") return {s.num_kv_heads, s.num_sinks, s.rank};
  if (name == "bias") return {s.num_kv_heads, s.group_size};
  return {};
}

GateLayer zero_gate_layer(const GateShape& shape) {
  GateLayer layer;
  for (auto& [name, t] : layer.tensors()) t->assign(static_cast<size_t>(numel(gate_tensor_shape(shape, name))), 0.0f);
  return layer;
}

GateWeights init_gates(const GateShape& shape, uint64_t seed) {
  GateWeights w;
  w.shape = shape;
  std::mt19937_64 rng(seed);
  const float bound = 1.0f / std::sqrt(static_cast<float>(shape.hidden_size));
  std::uniform_real_distribution<float> uniform(-bound, bound);
  for (int l = 0; l < shape.num_layers; ++l) {
    GateLayer layer = zero_gate_layer(shape);
    for (float& x : layer.q_weight) x = uniform(rng);
    for (float& x : layer.q_bias) x = uniform(rng);
    for (float& x : layer.k_weight) x = uniform(rng);
    std::fill(layer.q_norm.begin(), layer.q_norm.end(), 1.0f);
    std::fill(layer.k_norm.begin(), layer.k_norm.end(), 1.0f);
    w.layers.push_back(std::move(layer));
  }
  return w;
}

Status save_gates(const std::filesystem::path& path, const GateWeights& weights) {
  std::vector<SafetensorsWriteEntry> entries;
  for (int l = 0; l < static_cast<int>(weights.layers.size()); ++l)
    for (const auto& [name, t] : weights.layers[l].tensors())
      entries.push_back({tensor_name(l, name), "F32", gate_tensor_shape(weights.shape, name), t->data(),
                         t->size() * sizeof(float)});
  std::map<std::string, std::string> metadata = weights.metadata;
  metadata["format"] = "origami-fastkvzip-gates";
  metadata["num_layers"] = std::to_string(weights.shape.num_layers);
  metadata["num_kv_heads"] = std::to_string(weights.shape.num_kv_heads);
  metadata["group_size"] = std::to_string(weights.shape.group_size);
  metadata["hidden_size"] = std::to_string(weights.shape.hidden_size);
  metadata["rank"] = std::to_string(weights.shape.rank);
  metadata["num_sinks"] = std::to_string(weights.shape.num_sinks);
  return write_safetensors(path, entries, metadata);
}

Expected<GateWeights> load_gates(const std::filesystem::path& path, const ModelConfig& config) {
  ORIGAMI_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::open(path));
  const std::string where = path.string();
  GateWeights w;
  w.metadata = file->metadata();
  // R and S are the file's own choice; everything else must match the model.
  const SafetensorsTensorInfo* norm = file->find("layers.0.q_norm.weight");
  const SafetensorsTensorInfo* sinks = file->find("layers.0.sink_keys");
  if (norm == nullptr || sinks == nullptr || norm->shape.size() != 1 || sinks->shape.size() != 3)
    return invalid_file(where + ": not a gate file (layers.0.q_norm.weight [R] and layers.0.sink_keys [H, S, R] "
                                "are required)");
  w.shape = gate_shape_for(config, static_cast<int>(norm->shape[0]), static_cast<int>(sinks->shape[1]));
  if (w.shape.rank < 1 || w.shape.num_sinks < 0)
    return invalid_file(where + ": gate rank " + std::to_string(w.shape.rank) + " and sinks " +
                        std::to_string(w.shape.num_sinks) + " must be positive");
  if (file->find(tensor_name(config.num_layers, "q_norm.weight")) != nullptr)
    return invalid_file(where + ": the gates have more layers than the model's " + std::to_string(config.num_layers));
  for (int l = 0; l < config.num_layers; ++l) {
    GateLayer layer;
    for (auto& [name, t] : layer.tensors()) {
      const std::string full = tensor_name(l, name);
      const SafetensorsTensorInfo* info = file->find(full);
      if (info == nullptr)
        return invalid_file(where + ": tensor '" + full + "' is missing (the model has " +
                            std::to_string(config.num_layers) + " layers)");
      if (info->dtype_name != "F32")
        return invalid_file(where + ": tensor '" + full + "' is " + info->dtype_name + ", expected F32");
      const std::vector<int64_t> expected = gate_tensor_shape(w.shape, name);
      if (info->shape != expected)
        return invalid_file(where + ": tensor '" + full + "' has shape " + shape_text(info->shape) +
                            " but the model (" + std::to_string(config.num_kv_heads) + " KV heads, " +
                            std::to_string(config.num_heads) + " query heads, hidden " +
                            std::to_string(config.hidden_size) + ") needs " + shape_text(expected));
      ORIGAMI_ASSIGN_OR_RETURN(TensorView view, file->view(full));
      *t = view.to_f32();
      for (float x : *t)
        if (!std::isfinite(x)) return invalid_file(where + ": tensor '" + full + "' holds NaN or inf");
    }
    for (float b : layer.bias)
      if (b < 0.0f) return invalid_file(where + ": tensor '" + tensor_name(l, "bias") + "' has a negative value");
    w.layers.push_back(std::move(layer));
  }
  return w;
}

}  // namespace origami::gates
