#pragma once
// How a checkpoint stores its Linear weights, from config.json's `quantization_config` (as
// llm-compressor's compressed-tensors and NVIDIA ModelOpt write it) or ModelOpt's
// hf_quant_config.json. Only FP8 E4M3 with per-channel or per-tensor weight scales is read;
// every other scheme (int4, AWQ, GPTQ, block-wise or per-group FP8, NVFP4, ...) is an error that
// names it, so that a checkpoint is never silently read as something it is not.
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace origami {

enum class WeightQuantization { kNone, kFp8 };

struct QuantizationConfig {
  WeightQuantization weights = WeightQuantization::kNone;
  std::string method;  // "compressed-tensors" or "modelopt"; empty when unquantized
  // The checkpoint carries per-tensor `*.input_scale` tensors (static activation scales); else
  // activations are quantized per token at run time.
  bool static_input_scales = false;

  bool fp8() const { return weights == WeightQuantization::kFp8; }
};

// Reads config.json's `quantization_config` (absent or null: unquantized). `source` names the file.
Status parse_quantization_config(const nlohmann::json& config_json, const std::string& source, QuantizationConfig* out);
// Reads ModelOpt's hf_quant_config.json text ({"quantization": {"quant_algo": "FP8", ...}}).
Status parse_modelopt_quant_file(const std::string& text, const std::string& source, QuantizationConfig* out);

}  // namespace origami
