// The KV memory plan with an FP8 cache (--kv-cache-dtype fp8).
#include <gtest/gtest.h>

#include "backend_cpu_test_util.h"
#include "engine/kv_memory_plan.h"

namespace origami::test {
namespace {

// The memory plan divides by the backend's bytes per block: a backend storing the layout as it
// is (CUDA) fits 2 x 64 / (64 + 4) = 1.88x the blocks of bf16 with FP8 at head_dim 64; the CPU
// backend, storing fp32 whatever it emulates, fits the same number for every KV dtype.
class LayoutBytesBackend : public CpuBackend {
 public:
  LayoutBytesBackend() : CpuBackend(BackendOptions{}) {}
  size_t kv_page_bytes(const KVLayout& layout) const override { return layout.page_bytes(0); }
};

TEST(KVMemoryPlan, Fp8FitsAboutTwiceTheBlocksOfBf16) {
  auto model = load_model_config(model_dir("origami-tiny-qwen3"));
  ASSERT_TRUE(model.has_value());
  ASSERT_EQ(model->head_dim, 64);
  EngineConfig config;
  config.kv_cache_bytes = int64_t{64} << 20;
  config.num_query_slots = -1;  // no compression: the blocks take all the bytes
  KVLayout bf16 = KVLayout::full(model->num_layers, model->num_kv_heads, model->head_dim, config.block_size, 0,
                                 DType::kBF16);
  KVLayout fp8 = bf16;
  fp8.fp8 = true;
  LayoutBytesBackend native;
  auto plan_bf16 = plan_kv_memory(config, *model, bf16, native);
  auto plan_fp8 = plan_kv_memory(config, *model, fp8, native);
  ASSERT_TRUE(plan_bf16.has_value() && plan_fp8.has_value());
  const int64_t block_bf16 = 2LL * model->num_layers * model->num_kv_heads * config.block_size * 64 * 2;
  const int64_t block_fp8 = 2LL * model->num_layers * model->num_kv_heads * config.block_size * (64 + 4);
  EXPECT_EQ(plan_bf16->num_blocks, config.kv_cache_bytes / block_bf16);
  EXPECT_EQ(plan_fp8->num_blocks, config.kv_cache_bytes / block_fp8);
  EXPECT_GT(static_cast<double>(plan_fp8->num_blocks) / plan_bf16->num_blocks, 1.85);
  CpuBackend cpu{BackendOptions{}};
  auto cpu_bf16 = plan_kv_memory(config, *model, bf16, cpu);
  auto cpu_fp8 = plan_kv_memory(config, *model, fp8, cpu);
  ASSERT_TRUE(cpu_bf16.has_value() && cpu_fp8.has_value());
  EXPECT_EQ(cpu_fp8->num_blocks, cpu_bf16->num_blocks);
  EXPECT_EQ(cpu_fp8->num_blocks, config.kv_cache_bytes / (block_bf16 * 2));
}

}  // namespace
}  // namespace origami::test
