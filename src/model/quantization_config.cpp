#include "model/quantization_config.h"

#include <nlohmann/json.hpp>

#include "core/json_excerpt.h"
#include "core/json_parse.h"

namespace origami {
namespace {

using json = nlohmann::json;

// A JSON value for an error message, cut to about 100 bytes (values come from the file).
std::string quoted(const json& v) { return json_excerpt(v); }

Status error(const std::string& source, const std::string& field, const std::string& what) {
  return invalid_file(source + ": " + field + " " + what);
}

std::string string_field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool is_null_or_absent(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null();
}

// One compressed-tensors quantization args object ("weights" or "input_activations") must be
// 8-bit float; returns its strategy.
Expected<std::string> float8_args(const json& args, const std::string& source, const std::string& field) {
  if (!args.is_object()) return error(source, field, "must be an object, got " + quoted(args));
  auto bits = args.find("num_bits");
  const std::string type = string_field(args, "type");
  if (bits == args.end() || !bits->is_number_integer() || bits->get<int>() != 8 || type != "float") {
    return Status(ErrorCode::kUnimplemented,
                  source + ": " + field + " is " + (bits != args.end() ? quoted(*bits) : std::string("?")) + "-bit " +
                      (type.empty() ? "int" : type) +
                      ": only 8-bit float (FP8 E4M3) is supported among compressed-tensors schemes");
  }
  const std::string strategy = string_field(args, "strategy");
  if (!is_null_or_absent(args, "block_structure") || strategy == "block") {
    return Status(ErrorCode::kUnimplemented,
                  source + ": " + field + " uses block-wise FP8 scales (strategy \"block\"): not supported; "
                  "per-channel and per-tensor FP8 are");
  }
  if (strategy == "group" || !is_null_or_absent(args, "group_size")) {
    return Status(ErrorCode::kUnimplemented, source + ": " + field +
                                                 " uses per-group FP8 scales: not supported; per-channel and "
                                                 "per-tensor FP8 are");
  }
  return strategy;
}

Status parse_compressed_tensors(const json& q, const std::string& source, QuantizationConfig* out) {
  const std::string format = string_field(q, "format");
  if (format != "float-quantized") {
    return Status(ErrorCode::kUnimplemented,
                  source + ": quantization_config.format " + quoted(q.value("format", json())) +
                      " (compressed-tensors) is not supported; FP8 checkpoints have \"float-quantized\"");
  }
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty())
    return error(source, "quantization_config.config_groups", "must be a non-empty object");
  bool any_static = false, any_dynamic = false;
  for (auto g = groups->begin(); g != groups->end(); ++g) {
    const std::string where = "quantization_config.config_groups." + g.key().substr(0, 64);
    if (!g->is_object()) return error(source, where, "must be an object");
    auto w = g->find("weights");
    if (w == g->end() || w->is_null()) return error(source, where + ".weights", "is missing");
    ORIGAMI_ASSIGN_OR_RETURN(std::string strategy, float8_args(*w, source, where + ".weights"));
    if (strategy != "channel" && strategy != "tensor")
      return error(source, where + ".weights.strategy",
                   "must be \"channel\" or \"tensor\" for FP8 weights, got " + quoted(w->value("strategy", json())));
    auto a = g->find("input_activations");
    if (a == g->end() || a->is_null()) continue;  // weight-only: activations are quantized per token
    ORIGAMI_ASSIGN_OR_RETURN(std::string a_strategy, float8_args(*a, source, where + ".input_activations"));
    const bool dynamic = a->value("dynamic", false) == true;
    if (dynamic) {
      any_dynamic = true;
    } else if (a_strategy == "tensor") {
      any_static = true;
    } else {
      return error(source, where + ".input_activations",
                   "static scales must be per tensor (strategy \"tensor\"), got " +
                       quoted(a->value("strategy", json())));
    }
  }
  if (any_static && any_dynamic)
    return Status(ErrorCode::kUnimplemented,
                  source + ": quantization_config mixes static and dynamic activation scales across groups");
  out->weights = WeightQuantization::kFp8;
  out->method = "compressed-tensors";
  out->static_input_scales = any_static;
  return Status::ok();
}

Status parse_modelopt_algo(const json& algo, const std::string& source, const std::string& field,
                           QuantizationConfig* out) {
  if (!algo.is_string() || algo.get<std::string>() != "FP8") {
    return Status(ErrorCode::kUnimplemented, source + ": " + field + " " + quoted(algo) +
                                                 " (ModelOpt) is not supported; per-tensor \"FP8\" is");
  }
  out->weights = WeightQuantization::kFp8;
  out->method = "modelopt";
  out->static_input_scales = true;  // ModelOpt FP8 stores a per-tensor input_scale per Linear
  return Status::ok();
}

}  // namespace

Status parse_quantization_config(const json& j, const std::string& source, QuantizationConfig* out) {
  *out = QuantizationConfig{};
  auto it = j.find("quantization_config");
  if (it == j.end() || it->is_null()) return Status::ok();
  const json& q = *it;
  if (!q.is_object()) return error(source, "quantization_config", "must be an object");
  const std::string method = string_field(q, "quant_method");
  if (method == "compressed-tensors") return parse_compressed_tensors(q, source, out);
  if (method == "modelopt") {
    auto algo = q.find("quant_algo");
    if (algo == q.end()) return error(source, "quantization_config.quant_algo", "is missing");
    return parse_modelopt_algo(*algo, source, "quantization_config.quant_algo", out);
  }
  if (method == "fp8" && q.contains("weight_block_size")) {
    return Status(ErrorCode::kUnimplemented,
                  source + ": quantization_config: block-wise FP8 (quant_method \"fp8\", weight_block_size " +
                      quoted(q["weight_block_size"]) +
                      ") is not supported; per-channel or per-tensor FP8 (compressed-tensors, ModelOpt) is");
  }
  return Status(ErrorCode::kUnimplemented,
                source + ": quantization_config.quant_method " + quoted(q.value("quant_method", json())) +
                    " is not supported; FP8 checkpoints in compressed-tensors (\"float-quantized\") or ModelOpt "
                    "(\"FP8\") formats are");
}

Status parse_modelopt_quant_file(const std::string& text, const std::string& source, QuantizationConfig* out) {
  Expected<json> parsed = parse_json(text, kFileJsonMaxDepth);
  if (!parsed) return invalid_file(source + ": " + parsed.status().message());
  const json j = std::move(*parsed);
  if (!j.is_object()) return invalid_file(source + ": not a JSON object");
  auto q = j.find("quantization");
  if (q == j.end() || !q->is_object()) return error(source, "quantization", "is missing or not an object");
  auto algo = q->find("quant_algo");
  if (algo == q->end()) return error(source, "quantization.quant_algo", "is missing");
  if (algo->is_null()) return Status::ok();  // a ModelOpt export without weight quantization
  return parse_modelopt_algo(*algo, source, "quantization.quant_algo", out);
}

}  // namespace origami
