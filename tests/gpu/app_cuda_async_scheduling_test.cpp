// The `origami` command line on the CUDA backend, where asynchronous scheduling is the default:
// a JSONL batch whose prompts join while others decode (max 4 running) gives the same outputs as
// --no-async-scheduling, and `origami bench` reports the steps it pipelined.
#include <filesystem>
#include <fstream>

#include "e2e/cli_test_util.h"
#include "e2e/engine_test_util.h"

namespace origami::testing {
namespace {

namespace fs = std::filesystem;

std::vector<nlohmann::json> generate_batch(const fs::path& dir, const std::string& name, const std::string& flags) {
  const fs::path out = dir / (name + ".jsonl");
  CommandResult r = run_command("generate --model " + tiny_qwen3_dir() + " --device cuda --kv-cache-memory 1GiB --max-num-seqs 4 " +
                                    "--max-num-batched-tokens 64 --input " + (dir / "in.jsonl").string() + " --output " +
                                    out.string() + " " + flags,
                                /*with_stderr=*/true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return parse_json_lines(read_file(out));
}

TEST(AppCudaAsyncScheduling, DefaultOnCudaGivesTheOutputsOfOneStepAtATime) {
  const fs::path dir = fs::temp_directory_path() / "origami_cli_cuda_async_test";
  fs::create_directories(dir);
  const char* prompts[] = {"The history of the city", "Once upon a time", "In the beginning of the nineteenth century",
                           "The capital of France is", "A long time ago, in a small village by the sea,", "Hello",
                           "The quick brown fox", "def fibonacci(n):"};
  {
    std::ofstream in(dir / "in.jsonl");
    int i = 0;
    for (const char* p : prompts) {
      nlohmann::json line{{"id", std::to_string(i)}, {"prompt", p}, {"max_tokens", 12 + 5 * i}, {"temperature", 0}};
      in << line.dump() << "\n";
      ++i;
    }
  }
  const std::vector<nlohmann::json> async = generate_batch(dir, "async", "");
  const std::vector<nlohmann::json> sync = generate_batch(dir, "sync", "--no-async-scheduling");
  ASSERT_EQ(async.size(), std::size(prompts));
  ASSERT_EQ(sync.size(), async.size());
  for (size_t i = 0; i < async.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(async[i]["text"], sync[i]["text"]);
    EXPECT_EQ(async[i]["num_output_tokens"], sync[i]["num_output_tokens"]);
    EXPECT_EQ(async[i]["finish_reason"], sync[i]["finish_reason"]);
  }

  CommandResult bench = run_command("bench --model " + tiny_qwen3_dir() +
                                    " --device cuda --kv-cache-memory 1GiB --num-prompts 8 --input-len 32 --output-len 24 --max-num-seqs 4 "
                                    "--json --quiet");
  ASSERT_EQ(bench.exit_code, 0) << bench.out;
  const nlohmann::json j = nlohmann::json::parse(bench.out);
  EXPECT_EQ(j["async_scheduling"], true);
  EXPECT_GT(j["num_pipelined_steps"].get<int>(), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace origami::testing
