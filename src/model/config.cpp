#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "core/json_excerpt.h"
#include "core/json_parse.h"

namespace origami {
namespace {

using json = nlohmann::json;

// Error prefix shared by every message: "<file>: field '<name>' ..." so the user knows where to look.
std::string field_error(const std::string& source, const std::string& field, const std::string& what) {
  return source + ": field '" + field + "' " + what;
}

bool is_null_or_absent(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null();
}

// Reads an integer field; absent/null yields `fallback` (nullopt = required).
Expected<int> read_int(const json& j, const char* key, const std::string& source, std::optional<int> fallback,
                       const std::string& prefix = "") {
  const std::string field = prefix + key;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return invalid_file(field_error(source, field, "is missing"));
  }
  if (!it->is_number_integer()) {
    // Some writers emit 4096.0; accept integral floats, reject anything else.
    if (it->is_number_float()) {
      const double v = it->get<double>();
      if (std::floor(v) == v && std::abs(v) <= std::numeric_limits<int>::max()) return static_cast<int>(v);
    }
    return invalid_file(field_error(source, field, "must be an integer, got " + it->dump()));
  }
  const int64_t v = it->get<int64_t>();
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    return invalid_file(field_error(source, field, "is out of range: " + it->dump()));
  }
  return static_cast<int>(v);
}

Expected<float> read_float(const json& j, const char* key, const std::string& source, float fallback,
                           const std::string& prefix = "") {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) {
    return invalid_file(field_error(source, prefix + key, "must be a number, got " + it->dump()));
  }
  return it->get<float>();
}

Expected<bool> read_bool(const json& j, const char* key, const std::string& source, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return invalid_file(field_error(source, key, "must be true or false, got " + it->dump()));
  return it->get<bool>();
}

// eos_token_id may be an int, a list of ints, or null.
Status read_token_ids(const json& j, const char* key, const std::string& source, std::vector<int>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  auto push = [&](const json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int>::max()) {
      return invalid_file(field_error(source, key, "must hold non-negative token ids, got " + json_excerpt(v)));
    }
    const int id = static_cast<int>(v.get<int64_t>());
    if (std::find(out->begin(), out->end(), id) == out->end()) out->push_back(id);
    return Status::ok();
  };
  if (it->is_array()) {
    for (const json& v : *it) ORIGAMI_RETURN_IF_ERROR(push(v));
    return Status::ok();
  }
  return push(*it);
}

Expected<Architecture> read_architecture(const json& j, const std::string& source, std::string* model_type) {
  auto mt = j.find("model_type");
  if (mt != j.end() && !mt->is_null()) {
    if (!mt->is_string()) return invalid_file(field_error(source, "model_type", "must be a string"));
    *model_type = mt->get<std::string>();
  }
  auto arch = j.find("architectures");
  if (arch != j.end() && !arch->is_null()) {
    if (!arch->is_array() || arch->empty() || !(*arch)[0].is_string()) {
      return invalid_file(field_error(source, "architectures", "must be a non-empty list of strings"));
    }
    const std::string name = (*arch)[0].get<std::string>();
    if (name == "LlamaForCausalLM") return Architecture::kLlama;
    if (name == "Qwen2ForCausalLM") return Architecture::kQwen2;
    if (name == "Qwen3ForCausalLM") return Architecture::kQwen3;
    return invalid_file(source + ": unsupported architecture '" + name +
                        "' (field 'architectures'); supported: LlamaForCausalLM, Qwen2ForCausalLM, "
                        "Qwen3ForCausalLM");
  }
  if (model_type->empty()) {
    return invalid_file(source + ": neither 'architectures' nor 'model_type' says which architecture this is");
  }
  if (*model_type == "llama") return Architecture::kLlama;
  if (*model_type == "qwen2") return Architecture::kQwen2;
  if (*model_type == "qwen3") return Architecture::kQwen3;
  return invalid_file(source + ": unsupported architecture '" + *model_type +
                      "' (field 'model_type'); supported: llama, qwen2, qwen3");
}

// RoPE: transformers 4 writes rope_theta at the top level and scaling in rope_scaling (with
// "rope_type", or the older "type"); transformers 5 puts all of it in rope_parameters.
Status read_rope(const json& j, const std::string& source, RopeConfig* rope) {
  const json* params = nullptr;
  std::string prefix;
  if (!is_null_or_absent(j, "rope_parameters")) {
    params = &j.at("rope_parameters");
    prefix = "rope_parameters.";
  } else if (!is_null_or_absent(j, "rope_scaling")) {
    params = &j.at("rope_scaling");
    prefix = "rope_scaling.";
  }
  if (params != nullptr && !params->is_object()) {
    return invalid_file(field_error(source, prefix.substr(0, prefix.size() - 1), "must be an object"));
  }

  ORIGAMI_ASSIGN_OR_RETURN(rope->theta, read_float(j, "rope_theta", source, rope->theta));
  if (params != nullptr && params->contains("rope_theta")) {
    ORIGAMI_ASSIGN_OR_RETURN(rope->theta, read_float(*params, "rope_theta", source, rope->theta, prefix));
  }
  if (!(rope->theta > 0.0f) || !std::isfinite(rope->theta)) {
    return invalid_file(field_error(source, "rope_theta", "must be positive, got " + std::to_string(rope->theta)));
  }
  if (params == nullptr) return Status::ok();

  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    auto it = params->find(key);
    if (it == params->end() || it->is_null()) continue;
    if (!it->is_string()) return invalid_file(field_error(source, prefix + key, "must be a string"));
    type = it->get<std::string>();
    break;
  }
  if (type == "default") {
    rope->type = "default";
    return Status::ok();
  }
  if (type != "llama3") {
    return invalid_file(field_error(source, prefix + "rope_type",
                                    "'" + type + "' is not supported (supported: default, llama3)"));
  }
  rope->type = "llama3";
  if (!params->contains("factor")) return invalid_file(field_error(source, prefix + "factor", "is missing"));
  ORIGAMI_ASSIGN_OR_RETURN(rope->factor, read_float(*params, "factor", source, rope->factor, prefix));
  ORIGAMI_ASSIGN_OR_RETURN(rope->low_freq_factor,
                           read_float(*params, "low_freq_factor", source, rope->low_freq_factor, prefix));
  ORIGAMI_ASSIGN_OR_RETURN(rope->high_freq_factor,
                           read_float(*params, "high_freq_factor", source, rope->high_freq_factor, prefix));
  ORIGAMI_ASSIGN_OR_RETURN(rope->original_max_position_embeddings,
                           read_int(*params, "original_max_position_embeddings", source,
                                    rope->original_max_position_embeddings, prefix));
  if (!(rope->factor > 0.0f)) return invalid_file(field_error(source, prefix + "factor", "must be positive"));
  if (!(rope->low_freq_factor > 0.0f)) {
    return invalid_file(field_error(source, prefix + "low_freq_factor", "must be positive"));
  }
  // The llama3 smoothing divides by (high - low); equal factors would divide by zero.
  if (!(rope->high_freq_factor > rope->low_freq_factor)) {
    return invalid_file(field_error(source, prefix + "high_freq_factor", "must be greater than low_freq_factor"));
  }
  if (rope->original_max_position_embeddings <= 0) {
    return invalid_file(field_error(source, prefix + "original_max_position_embeddings", "must be positive"));
  }
  return Status::ok();
}

// Features the architectures here may declare but that the weight layout does not carry.
Status reject_unsupported_features(const json& j, const ModelConfig& c, const std::string& source) {
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "silu") {
      return invalid_file(field_error(source, "hidden_act", "must be \"silu\", got " + it->dump()));
    }
  }
  ORIGAMI_ASSIGN_OR_RETURN(bool mlp_bias, read_bool(j, "mlp_bias", source, false));
  if (mlp_bias) return invalid_file(field_error(source, "mlp_bias", "true is not supported"));
  // Qwen2 always has q/k/v biases (and no o_proj bias) whatever attention_bias says; for Llama
  // and Qwen3, attention_bias also adds an o_proj bias, which these models do not load.
  if (c.arch != Architecture::kQwen2) {
    ORIGAMI_ASSIGN_OR_RETURN(bool attention_bias, read_bool(j, "attention_bias", source, false));
    if (attention_bias) {
      return invalid_file(field_error(source, "attention_bias",
                                      std::string("true is not supported for ") + architecture_name(c.arch)));
    }
  }
  ORIGAMI_ASSIGN_OR_RETURN(bool sliding, read_bool(j, "use_sliding_window", source, false));
  if (sliding) return invalid_file(field_error(source, "use_sliding_window", "true is not supported"));
  return Status::ok();
}

Status validate(const ModelConfig& c, const std::string& source) {
  auto positive = [&](int v, const char* field) -> Status {
    if (v <= 0) return invalid_file(field_error(source, field, "must be positive, got " + std::to_string(v)));
    return Status::ok();
  };
  ORIGAMI_RETURN_IF_ERROR(positive(c.vocab_size, "vocab_size"));
  ORIGAMI_RETURN_IF_ERROR(positive(c.hidden_size, "hidden_size"));
  ORIGAMI_RETURN_IF_ERROR(positive(c.intermediate_size, "intermediate_size"));
  ORIGAMI_RETURN_IF_ERROR(positive(c.num_layers, "num_hidden_layers"));
  ORIGAMI_RETURN_IF_ERROR(positive(c.num_heads, "num_attention_heads"));
  ORIGAMI_RETURN_IF_ERROR(positive(c.num_kv_heads, "num_key_value_heads"));
  ORIGAMI_RETURN_IF_ERROR(positive(c.head_dim, "head_dim"));
  ORIGAMI_RETURN_IF_ERROR(positive(c.max_position_embeddings, "max_position_embeddings"));
  if (c.num_heads % c.num_kv_heads != 0) {
    return invalid_file(field_error(source, "num_attention_heads",
                                    "(" + std::to_string(c.num_heads) +
                                        ") must be divisible by num_key_value_heads (" +
                                        std::to_string(c.num_kv_heads) + ")"));
  }
  // RoPE rotates pairs of dimensions.
  if (c.head_dim % 2 != 0) {
    return invalid_file(field_error(source, "head_dim", "must be even, got " + std::to_string(c.head_dim)));
  }
  if (!(c.rms_norm_eps > 0.0f) || !std::isfinite(c.rms_norm_eps)) {
    return invalid_file(field_error(source, "rms_norm_eps", "must be positive"));
  }
  // Guard the products the loaders compute in int64 from overflowing int (q_size etc. are int).
  const int64_t q = static_cast<int64_t>(c.num_heads) * c.head_dim;
  if (q > std::numeric_limits<int>::max()) {
    return invalid_file(field_error(source, "num_attention_heads", "* head_dim is too large"));
  }
  if (c.bos_token_id >= c.vocab_size) {
    return invalid_file(field_error(source, "bos_token_id", "is not below vocab_size"));
  }
  for (int id : c.eos_token_ids) {
    if (id >= c.vocab_size) {
      return invalid_file(field_error(source, "eos_token_id", std::to_string(id) + " is not below vocab_size"));
    }
  }
  return Status::ok();
}

}  // namespace

const char* architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama: return "llama";
    case Architecture::kQwen2: return "qwen2";
    case Architecture::kQwen3: return "qwen3";
  }
  return "?";
}

size_t ModelConfig::num_parameters() const {
  const size_t h = hidden_size, q = q_size(), kv = kv_size(), inter = intermediate_size;
  size_t per_layer = 2 * h;                // input and post-attention norms
  per_layer += q * h + 2 * kv * h + h * q;  // q, k, v, o projections
  per_layer += 3 * inter * h;              // gate, up, down
  if (qkv_bias) per_layer += q + 2 * kv;
  if (qk_norm) per_layer += 2 * static_cast<size_t>(head_dim);
  size_t total = static_cast<size_t>(num_layers) * per_layer;
  total += static_cast<size_t>(vocab_size) * h;                           // embed_tokens
  if (!tie_word_embeddings) total += static_cast<size_t>(vocab_size) * h;  // lm_head
  total += h;                                                             // final norm
  return total;
}

double ModelConfig::parameter_count() const {
  const double h = hidden_size, q = static_cast<double>(num_heads) * head_dim,
               kv = static_cast<double>(num_kv_heads) * head_dim, inter = intermediate_size;
  double per_layer = 2 * h + q * h + 2 * kv * h + h * q + 3 * inter * h;
  if (qkv_bias) per_layer += q + 2 * kv;
  if (qk_norm) per_layer += 2.0 * head_dim;
  return num_layers * per_layer + static_cast<double>(vocab_size) * h * (tie_word_embeddings ? 1 : 2) + h;
}

Expected<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  Expected<json> parsed = parse_json(json_text, kFileJsonMaxDepth);
  if (!parsed) return invalid_file(source + ": " + parsed.status().message());
  const json j = std::move(*parsed);
  if (!j.is_object()) return invalid_file(source + ": expected a JSON object at the top level");

  ModelConfig c;
  ORIGAMI_ASSIGN_OR_RETURN(c.arch, read_architecture(j, source, &c.model_type));
  if (c.model_type.empty()) c.model_type = architecture_name(c.arch);
  c.qkv_bias = c.arch == Architecture::kQwen2;
  c.qk_norm = c.arch == Architecture::kQwen3;

  ORIGAMI_ASSIGN_OR_RETURN(c.vocab_size, read_int(j, "vocab_size", source, std::nullopt));
  ORIGAMI_ASSIGN_OR_RETURN(c.hidden_size, read_int(j, "hidden_size", source, std::nullopt));
  ORIGAMI_ASSIGN_OR_RETURN(c.intermediate_size, read_int(j, "intermediate_size", source, std::nullopt));
  ORIGAMI_ASSIGN_OR_RETURN(c.num_layers, read_int(j, "num_hidden_layers", source, std::nullopt));
  ORIGAMI_ASSIGN_OR_RETURN(c.num_heads, read_int(j, "num_attention_heads", source, std::nullopt));
  ORIGAMI_ASSIGN_OR_RETURN(c.num_kv_heads, read_int(j, "num_key_value_heads", source, c.num_heads));
  if (is_null_or_absent(j, "head_dim")) {
    if (c.num_heads > 0 && c.hidden_size % c.num_heads != 0) {
      return invalid_file(field_error(source, "hidden_size",
                                      "(" + std::to_string(c.hidden_size) +
                                          ") is not divisible by num_attention_heads (" +
                                          std::to_string(c.num_heads) + ") and head_dim is not given"));
    }
    c.head_dim = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  } else {
    ORIGAMI_ASSIGN_OR_RETURN(c.head_dim, read_int(j, "head_dim", source, std::nullopt));
  }
  // transformers' per-architecture defaults when the field is absent.
  const int default_max_pos = c.arch == Architecture::kLlama ? 2048 : 32768;
  ORIGAMI_ASSIGN_OR_RETURN(c.max_position_embeddings,
                           read_int(j, "max_position_embeddings", source, default_max_pos));
  ORIGAMI_ASSIGN_OR_RETURN(c.rms_norm_eps, read_float(j, "rms_norm_eps", source, c.rms_norm_eps));
  ORIGAMI_ASSIGN_OR_RETURN(c.tie_word_embeddings, read_bool(j, "tie_word_embeddings", source, false));
  ORIGAMI_RETURN_IF_ERROR(read_rope(j, source, &c.rope));

  // transformers 5 writes "dtype", 4 "torch_dtype"; absent keeps the default (bf16).
  for (const char* key : {"dtype", "torch_dtype"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_string() || !parse_dtype(it->get<std::string>(), &c.dtype)) {
      return invalid_file(field_error(source, key, "is not a supported dtype (float32, bfloat16, float16): " +
                                                       it->dump()));
    }
    break;
  }

  ORIGAMI_ASSIGN_OR_RETURN(c.bos_token_id, read_int(j, "bos_token_id", source, -1));
  if (c.bos_token_id < -1) return invalid_file(field_error(source, "bos_token_id", "must be non-negative"));
  ORIGAMI_RETURN_IF_ERROR(read_token_ids(j, "eos_token_id", source, &c.eos_token_ids));

  ORIGAMI_RETURN_IF_ERROR(parse_quantization_config(j, source, &c.quantization));
  ORIGAMI_RETURN_IF_ERROR(reject_unsupported_features(j, c, source));
  ORIGAMI_RETURN_IF_ERROR(validate(c, source));
  return c;
}

Expected<ModelConfig> load_model_config(const std::filesystem::path& model_dir) {
  const std::filesystem::path config_path = model_dir / "config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config_path, ec)) {
    return not_found(config_path.string() + ": model config not found");
  }
  ORIGAMI_ASSIGN_OR_RETURN(std::string text, read_file(config_path));
  ORIGAMI_ASSIGN_OR_RETURN(ModelConfig config, parse_model_config(text, config_path.string()));

  const std::filesystem::path modelopt_path = model_dir / "hf_quant_config.json";
  if (config.quantization.weights == WeightQuantization::kNone && std::filesystem::is_regular_file(modelopt_path, ec)) {
    ORIGAMI_ASSIGN_OR_RETURN(std::string quant_text, read_file(modelopt_path));
    ORIGAMI_RETURN_IF_ERROR(parse_modelopt_quant_file(quant_text, modelopt_path.string(), &config.quantization));
  }

  // generation_config.json often lists more stop ids than config.json (e.g. chat end tokens).
  const std::filesystem::path gen_path = model_dir / "generation_config.json";
  if (std::filesystem::is_regular_file(gen_path, ec)) {
    ORIGAMI_ASSIGN_OR_RETURN(std::string gen_text, read_file(gen_path));
    const std::string gen_source = gen_path.string();
    Expected<json> parsed = parse_json(gen_text, kFileJsonMaxDepth);
    if (!parsed) return invalid_file(gen_source + ": " + parsed.status().message());
    const json g = std::move(*parsed);
    if (!g.is_object()) return invalid_file(gen_source + ": expected a JSON object at the top level");
    ORIGAMI_RETURN_IF_ERROR(read_token_ids(g, "eos_token_id", gen_source, &config.eos_token_ids));
    for (int id : config.eos_token_ids) {
      if (id >= config.vocab_size) {
        return invalid_file(field_error(gen_source, "eos_token_id", std::to_string(id) + " is not below vocab_size"));
      }
    }
    if (config.bos_token_id < 0) {
      ORIGAMI_ASSIGN_OR_RETURN(config.bos_token_id, read_int(g, "bos_token_id", gen_source, -1));
      if (config.bos_token_id >= config.vocab_size || config.bos_token_id < -1) {
        return invalid_file(field_error(gen_source, "bos_token_id", "is not a valid token id"));
      }
    }
  }
  return config;
}

}  // namespace origami
