// Teacher-forced logits of the CUDA backend for a model written by HF transformers, for
// scripts/hf_compare.py. Runs only when ORIGAMI_HF_DUMP_DIR names a folder holding the model and
// ids.json ({"ids": [[...], ...]}); writes origami_logits_<i>.bin (fp32, [len, vocab]) there.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_backend_factory.h"
#include "cuda_test_util.h"
#include "model/config.h"
#include "model/weights.h"

namespace origami {
namespace {

TEST(CudaHfDump, WritesTeacherForcedLogits) {
  const char* dir_env = std::getenv("ORIGAMI_HF_DUMP_DIR");
  if (dir_env == nullptr || dir_env[0] == '\0') GTEST_SKIP() << "ORIGAMI_HF_DUMP_DIR is not set";
  const std::string dir = dir_env;
  auto config = load_model_config(dir);
  ASSERT_TRUE(config.has_value()) << config.status().to_string();
  auto weights = load_model_weights(dir, *config);
  ASSERT_TRUE(weights.has_value()) << weights.status().to_string();
  BackendOptions opt;
  opt.device = "cuda";
  auto backend = create_cuda_backend(opt);
  ASSERT_TRUE(backend.has_value()) << backend.status().to_string();
  Backend& b = **backend;
  ASSERT_TRUE(b.load(*config, *weights).is_ok());
  const int block_size = 16, num_blocks = 128;
  ASSERT_TRUE(b.allocate_kv_cache(KVLayout::full(config->num_layers, config->num_kv_heads, config->head_dim, block_size,
                                                 num_blocks, DType::kBF16))
                  .is_ok());
  nlohmann::json ids_json;
  std::ifstream(dir + "/ids.json") >> ids_json;
  int index = 0;
  for (const auto& row : ids_json["ids"]) {
    const std::vector<int32_t> ids = row.get<std::vector<int32_t>>();
    ASSERT_LT((static_cast<int>(ids.size()) + block_size - 1) / block_size, num_blocks);
    const std::vector<float> logits = cuda::testing::teacher_forced_logits(b, ids, block_size);
    ASSERT_FALSE(logits.empty());
    std::ofstream f(dir + "/origami_logits_" + std::to_string(index++) + ".bin", std::ios::binary);
    f.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  }
}

}  // namespace
}  // namespace origami
