#pragma once
// Helpers shared by the model module's tests: temp folders and small model folders written at
// runtime (no committed binaries).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "model/config.h"
#include "model/safetensors_writer.h"
#include "model/weight_layout.h"
#include "model/weights.h"

namespace origami::testing {

inline std::filesystem::path shared_dir() { return ORIGAMI_SHARED_DIR; }
inline std::filesystem::path stories_dir() { return shared_dir() / "models" / "stories260k"; }
inline std::filesystem::path tiny_qwen3_dir() { return shared_dir() / "models" / "origami-tiny-qwen3"; }

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("origami_model_test_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A raw safetensors file from header text and a data section, for malformed-file cases.
inline void write_raw_safetensors(const std::filesystem::path& path, uint64_t header_len, const std::string& header,
                                  const std::string& data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(header_len >> (8 * i));
  write_text(path, bytes + header + data);
}

inline void write_raw_safetensors(const std::filesystem::path& path, const std::string& header,
                                  const std::string& data) {
  write_raw_safetensors(path, header.size(), header, data);
}

// A small Llama config in transformers-5 spelling (hidden 32, 4 q heads / 2 kv heads).
inline std::string small_llama_config_json(const std::string& arch = "LlamaForCausalLM", bool tie = false) {
  return std::string(R"({"architectures": [")") + arch + R"("], "vocab_size": 40, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 10000.0,
    "rope_type": "default"}, "tie_word_embeddings": )" +
         (tie ? "true" : "false") + R"(, "dtype": "float32", "bos_token_id": 1, "eos_token_id": 2})";
}

struct TensorEdit {
  std::string name;            // tensor to change
  bool drop = false;           // leave it out of the file
  std::vector<int64_t> shape = {};  // if non-empty: write with this shape (zero bytes)
  std::string dtype = {};           // if non-empty: write with this 4-byte dtype (zero bytes)
};

// Writes config.json and model.safetensors (dummy f32 weights for the config, plus the given
// edits and extra tensors) into `dir`. Returns the parsed config.
inline ModelConfig write_model_folder(const std::filesystem::path& dir, const std::string& config_json,
                                      const std::vector<TensorEdit>& edits = {},
                                      const std::vector<SafetensorsWriteEntry>& extra = {}) {
  write_text(dir / "config.json", config_json);
  auto config = parse_model_config(config_json, "config.json");
  EXPECT_TRUE(config.has_value()) << config.status().message();
  ModelWeights w = make_dummy_weights(*config, DType::kF32, 7);
  std::vector<SafetensorsWriteEntry> entries;
  std::vector<std::vector<uint8_t>> owned;  // moving a vector keeps its buffer, so e.data stays valid
  for (const WeightSlot& slot : weight_slots(*config, &w)) {
    const TensorView& v = *slot.view;
    SafetensorsWriteEntry e{v.name, "F32", v.shape, v.data, static_cast<size_t>(v.numel()) * 4};
    bool drop = false;
    for (const auto& ed : edits) {
      if (ed.name != v.name) continue;
      drop = ed.drop;
      if (!ed.shape.empty() || !ed.dtype.empty()) {
        if (!ed.shape.empty()) e.shape = ed.shape;
        if (!ed.dtype.empty()) e.dtype = ed.dtype;
        int64_t n = 1;
        for (int64_t d : e.shape) n *= d;
        owned.emplace_back(static_cast<size_t>(n) * 4, 0);  // 4 bytes per element: F32 / I32
        e.data = owned.back().data();
        e.num_bytes = owned.back().size();
      }
    }
    if (!drop) entries.push_back(e);
  }
  for (const auto& e : extra) entries.push_back(e);
  Status st = write_safetensors(dir / "model.safetensors", entries);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return *config;
}

inline ::testing::AssertionResult message_has(const Status& st, const std::vector<std::string>& parts) {
  if (st.is_ok()) return ::testing::AssertionFailure() << "expected an error, got OK";
  for (const auto& p : parts) {
    if (st.message().find(p) == std::string::npos) {
      return ::testing::AssertionFailure() << "message \"" << st.message() << "\" does not mention \"" << p << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace origami::testing
