// The KV memory an engine on the CUDA backend takes: an explicit --kv-cache-memory is honoured
// exactly (the block count follows from it) or refused with an error naming the flag, never
// silently shrunk to what the GPU has free.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "engine/engine.h"
#include "model/config.h"

namespace origami {
namespace {

EngineConfig tiny_cuda_config() {
  EngineConfig c;
  c.model_dir = cuda::testing::shared_dir() + "/models/origami-tiny-qwen3";
  c.device = "cuda";
  c.block_size = 16;
  c.max_num_seqs = 4;
  return c;
}

TEST(EngineCudaKvMemory, ExplicitSizeIsHonoured) {
  EngineConfig c = tiny_cuda_config();
  c.kv_cache_bytes = int64_t{64} << 20;
  auto engine = Engine::create(c);
  ASSERT_TRUE(engine.has_value()) << engine.status().to_string();
  const int blocks = (*engine)->metrics().num_kv_blocks_total;
  EXPECT_GT(blocks, 0);
  // Every block fits in the requested bytes (query slots and score pages come out of them too).
  auto config = load_model_config(c.model_dir);
  ASSERT_TRUE(config.has_value());
  const int64_t block_bytes = int64_t{2} * config->num_layers * config->num_kv_heads * c.block_size *
                              config->head_dim * 2;  // K and V, bf16
  EXPECT_LE(int64_t{blocks} * block_bytes, c.kv_cache_bytes);
  EXPECT_GT(int64_t{blocks + 1} * block_bytes * 2, c.kv_cache_bytes) << "far fewer blocks than the bytes allow";
}

TEST(EngineCudaKvMemory, SizeBeyondTheGpuIsAnError) {
  EngineConfig c = tiny_cuda_config();
  c.kv_cache_bytes = int64_t{1} << 40;  // 1 TiB
  auto engine = Engine::create(c);
  ASSERT_FALSE(engine.has_value()) << "a KV cache larger than the GPU was accepted";
  EXPECT_NE(engine.status().to_string().find("--kv-cache-memory"), std::string::npos) << engine.status().to_string();
}

}  // namespace
}  // namespace origami
