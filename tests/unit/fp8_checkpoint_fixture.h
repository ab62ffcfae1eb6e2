#pragma once
// FP8 checkpoints written at test time from a bf16 model folder (no committed binaries), in the
// layouts users have them: compressed-tensors as llm-compressor writes it (per-channel weight
// scales [n, 1], dynamic per-token activations; or per-tensor weights with static input scales)
// and NVIDIA ModelOpt (per-tensor weight_scale and input_scale; quantization_config in
// config.json or hf_quant_config.json beside it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/fp8.h"
#include "model/config.h"
#include "model/fp8_weights.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "model/weights.h"

namespace origami::testing {

enum class Fp8Format {
  kCompressedTensorsChannel,  // weights per channel, activations dynamic per token
  kCompressedTensorsStatic,   // weights per tensor, static per-tensor input scales
  kModelOptConfig,            // quantization_config {quant_method: modelopt, quant_algo: FP8}
  kModelOptFile,              // hf_quant_config.json
};

inline bool is_projection(const std::string& name) {
  for (const char* p : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                        "up_proj.weight", "down_proj.weight"})
    if (name.size() > std::strlen(p) && name.compare(name.size() - std::strlen(p), std::strlen(p), p) == 0) return true;
  return false;
}

inline nlohmann::json compressed_tensors_config(bool per_channel, bool static_inputs) {
  nlohmann::json weights = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"dynamic", false},
                            {"strategy", per_channel ? "channel" : "tensor"}, {"group_size", nullptr},
                            {"block_structure", nullptr}, {"observer", "minmax"}};
  nlohmann::json inputs = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true},
                           {"dynamic", !static_inputs}, {"strategy", static_inputs ? "tensor" : "token"},
                           {"observer", static_inputs ? nlohmann::json("minmax") : nlohmann::json(nullptr)}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"quantization_status", "compressed"},
          {"ignore", {"lm_head"}},
          {"kv_cache_scheme", nullptr},
          {"config_groups",
           {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", inputs},
                         {"output_activations", nullptr}}}}}};
}

// Writes the FP8 version of the model in `src` into `dst` (config, tokenizer, model.safetensors).
// Projections are quantized per channel (amax / 448 per row, core/fp8.h) or per tensor; every
// other tensor is copied as it is. `input_scale`: the static activation scale written for every
// projection (static formats only).
inline void write_fp8_checkpoint(const std::filesystem::path& src, const std::filesystem::path& dst, Fp8Format format,
                                 float input_scale = 0.05f) {
  std::filesystem::create_directories(dst);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    if (std::filesystem::exists(src / f))
      std::filesystem::copy_file(src / f, dst / f, std::filesystem::copy_options::overwrite_existing);
  std::ifstream in(src / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  const bool per_channel = format == Fp8Format::kCompressedTensorsChannel;
  const bool static_inputs = !per_channel;
  if (format == Fp8Format::kCompressedTensorsChannel || format == Fp8Format::kCompressedTensorsStatic)
    config["quantization_config"] = compressed_tensors_config(per_channel, static_inputs);
  if (format == Fp8Format::kModelOptConfig)
    config["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "FP8"},
                                     {"kv_cache_quant_algo", nullptr}, {"exclude_modules", {"lm_head"}}};
  if (format == Fp8Format::kModelOptFile) {
    std::ofstream q(dst / "hf_quant_config.json");
    q << nlohmann::json{{"producer", {{"name", "modelopt"}, {"version", "0.29.0"}}},
                        {"quantization", {{"quant_algo", "FP8"}, {"kv_cache_quant_algo", nullptr},
                                          {"exclude_modules", {"lm_head"}}}}}
             .dump(2);
  }
  std::ofstream(dst / "config.json") << config.dump(2);

  auto ckpt = SafetensorsCheckpoint::open(src);
  ASSERT_TRUE(ckpt.has_value()) << ckpt.status().message();
  std::vector<SafetensorsWriteEntry> entries;
  std::vector<std::vector<uint8_t>> codes;  // owned buffers (moving a vector keeps its data)
  std::vector<std::vector<float>> scales;
  codes.reserve(1024);
  scales.reserve(2048);
  for (const std::string& name : (*ckpt)->tensor_names()) {
    auto view = (*ckpt)->tensor(name);
    ASSERT_TRUE(view.has_value()) << view.status().message();
    const TensorView& v = *view;
    if (!is_projection(name)) {
      entries.push_back({name, dtype_name(v.dtype), v.shape, v.data, static_cast<size_t>(v.numel()) * dtype_size(v.dtype)});
      continue;
    }
    const std::string prefix = name.substr(0, name.size() - std::string("weight").size());
    const int64_t rows = v.shape[0], cols = v.shape[1];
    std::vector<float> w = v.to_f32();
    codes.emplace_back(w.size());
    if (per_channel) {
      scales.emplace_back(static_cast<size_t>(rows));
      quantize_rows_fp8(w.data(), rows, cols, cols, codes.back().data(), scales.back().data());
      entries.push_back({prefix + "weight_scale", "F32", {rows, 1}, scales.back().data(), scales.back().size() * 4});
    } else {
      float amax = 0.0f;
      for (float x : w) amax = std::max(amax, std::fabs(x));
      scales.push_back({fp8_row_scale(amax)});
      quantize_with_scale_fp8(w.data(), w.size(), scales.back()[0], codes.back().data());
      entries.push_back({prefix + "weight_scale", "F32", {}, scales.back().data(), 4});
    }
    entries.push_back({name, "F8_E4M3", v.shape, codes.back().data(), codes.back().size()});
    if (static_inputs) {
      scales.push_back({input_scale});
      entries.push_back({prefix + "input_scale", "F32", {}, scales.back().data(), 4});
    }
  }
  const Status st = write_safetensors(dst / "model.safetensors", entries);
  ASSERT_TRUE(st.is_ok()) << st.message();
}

}  // namespace origami::testing
