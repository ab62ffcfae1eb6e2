// The `origami` command line's KV page size on the CUDA backend (engine_config.h,
// default_block_size): 32 where the policy keeps every token on one page table per layer, 16 under
// a compressing policy and with head groups, and --block-size as given wherever it is given.
// Each command takes 1 GiB of KV, not 90% of the GPU, so that GPU tests can run side by side.
#include "e2e/cli_test_util.h"
#include "e2e/engine_test_util.h"

namespace origami::testing {
namespace {

nlohmann::json cuda_bench_report(const std::string& flags) {
  const std::string command = "bench --model " + tiny_qwen3_dir() +
                              " --device cuda --kv-cache-memory 1GiB --num-prompts 4 --input-len 40 --output-len 8 --json --quiet " + flags;
  CommandResult r = run_command(command);
  if (r.exit_code == 0) return nlohmann::json::parse(r.out);
  ADD_FAILURE() << flags << ": exit " << r.exit_code << "\n" << run_command(command, /*with_stderr=*/true).out;
  return nlohmann::json::object();
}

TEST(AppCudaBlockSize, FullKvDefaultsTo32AndCompressionOrHeadGroupsTo16) {
  const nlohmann::json full = cuda_bench_report("");
  const nlohmann::json given = cuda_bench_report("--block-size 16");
  const nlohmann::json compressed = cuda_bench_report("--kv-policy snapkv --kv-budget 64");
  const nlohmann::json grouped = cuda_bench_report("--heads-per-group 1");
  const nlohmann::json given_compressed = cuda_bench_report("--kv-policy snapkv --kv-budget 64 --block-size 64");
  ASSERT_FALSE(full.empty() || given.empty() || compressed.empty() || grouped.empty() || given_compressed.empty());
  EXPECT_EQ(full["block_size"], 32);
  EXPECT_EQ(given["block_size"], 16);
  EXPECT_EQ(compressed["block_size"], 16);
  EXPECT_EQ(grouped["block_size"], 16);
  EXPECT_EQ(given_compressed["block_size"], 64);
  for (const nlohmann::json* j : {&full, &given, &compressed, &grouped, &given_compressed})
    EXPECT_EQ((*j)["output_tokens"], 32);
}

}  // namespace
}  // namespace origami::testing
