#pragma once
// The model's shape and hyper-parameters, read from a HuggingFace config.json.
// Accepts both the transformers-4 spellings (rope_theta, rope_scaling, torch_dtype) and the
// transformers-5 ones (rope_parameters, dtype).
#include <filesystem>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/quantization_config.h"

namespace origami {

enum class Architecture { kLlama, kQwen2, kQwen3 };
const char* architecture_name(Architecture arch);

struct RopeConfig {
  float theta = 10000.0f;
  // "default" or "llama3" (Llama 3.1 frequency smoothing).
  std::string type = "default";
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string model_type;  // as written in config.json ("llama", "qwen2", "qwen3")
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: q/k/v projections carry a bias
  bool qk_norm = false;   // Qwen3: per-head RMSNorm on q and k before RoPE
  DType dtype = DType::kBF16;  // the checkpoint's dtype
  QuantizationConfig quantization;  // how its Linear weights are stored (FP8 or not)
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  int q_size() const { return num_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
  // Parameter count (for benchmarks' bytes-moved figures).
  size_t num_parameters() const;
  // The same in double precision: exact up to 2^53 and free of overflow for absurd configs, so
  // that loaders can check a config against the weight files and memory before allocating.
  double parameter_count() const;
};

// Parses config.json text; `source` names the file in error messages.
Expected<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source);
// Reads <dir>/config.json, and merges eos ids from <dir>/generation_config.json when present and
// ModelOpt's <dir>/hf_quant_config.json when config.json has no quantization_config.
Expected<ModelConfig> load_model_config(const std::filesystem::path& model_dir);

}  // namespace origami
