#pragma once
// Helpers shared by the end-to-end engine tests.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/batch_runner.h"
#include "engine/engine.h"

namespace origami::testing {

inline std::string shared_dir() {
  if (const char* env = std::getenv("ORIGAMI_SHARED_DIR")) return env;
  return ORIGAMI_SHARED_DIR;
}
inline std::string tiny_qwen3_dir() { return shared_dir() + "/models/origami-tiny-qwen3"; }
inline std::string stories_dir() { return shared_dir() + "/models/stories260k"; }
// The Fast KVzip gates shipped for origami-tiny-qwen3 (docs/gates.md).
inline std::string tiny_qwen3_gates() { return std::string(ORIGAMI_SOURCE_DIR) + "/assets/gates/origami-tiny-qwen3.safetensors"; }

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

inline EngineConfig cpu_config(const std::string& model_dir) {
  EngineConfig c;
  c.model_dir = model_dir;
  c.device = "cpu";
  c.block_size = 16;
  c.num_kv_blocks = 512;
  c.max_num_batched_tokens = 2048;
  return c;
}

inline std::unique_ptr<Engine> make_engine(const EngineConfig& config) {
  auto engine = Engine::create(config);
  EXPECT_TRUE(engine.has_value()) << engine.status().to_string();
  return engine ? std::move(engine).value() : nullptr;
}

inline SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

}  // namespace origami::testing
