// The `origami` command line, run as a user would run it.
#include <filesystem>

#include "cli_test_util.h"
#include "engine_test_util.h"

namespace origami::testing {
namespace {

namespace fs = std::filesystem;

TEST(Cli, GenerateMatchesTheGoldenContinuation) {
  const nlohmann::json golden = read_json(shared_dir() + "/golden/origami-tiny-qwen3_golden.json");
  const auto& g = golden["greedy"][0];
  CommandResult r = run_command("generate --model " + tiny_qwen3_dir() + " --prompt '" + g["prompt"].get<std::string>() +
                                "' --max-tokens 48 --temperature 0 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, g["text"].get<std::string>() + "\n");
}

TEST(Cli, JsonlBatchCompletesAroundInvalidLines) {
  const fs::path dir = fs::temp_directory_path() / "origami_cli_test";
  fs::create_directories(dir);
  {
    std::ofstream in(dir / "in.jsonl");
    in << R"({"id": "a", "prompt": "The history of the city", "max_tokens": 5, "temperature": 0})" << "\n";
    in << "this is not json\n";
    in << R"({"id": "c", "prompt": "Once upon a time", "temperature": -3})" << "\n";
    in << R"({"id": "d", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "seed": 7})" << "\n";
    in << R"({"id": "e"})" << "\n";
  }
  CommandResult r = run_command("generate --model " + tiny_qwen3_dir() + " --input " + (dir / "in.jsonl").string() +
                                " --output " + (dir / "out.jsonl").string());
  ASSERT_EQ(r.exit_code, 1);  // some requests failed (docs/reliability.md); the others complete
  const std::vector<nlohmann::json> lines = parse_json_lines(read_file(dir / "out.jsonl"));
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0]["id"], "a");
  EXPECT_EQ(lines[0]["num_output_tokens"], 5);
  EXPECT_NE(lines[1]["error"].get<std::string>().find(":2: not valid JSON"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2]["error"].get<std::string>().find("temperature"), std::string::npos) << lines[2];
  EXPECT_EQ(lines[3]["num_output_tokens"], 4);
  EXPECT_NE(lines[4]["error"].get<std::string>().find("prompt"), std::string::npos) << lines[4];
  fs::remove_all(dir);
}

// `origami bench FLAGS --json --quiet` on the tiny model; its report (a test failure if it failed).
nlohmann::json bench_report(const std::string& flags) {
  CommandResult r = run_command("bench --model " + tiny_qwen3_dir() + " " + flags + " --json --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

TEST(Cli, BenchPrintsJsonMetrics) {
  nlohmann::json j = bench_report("--num-prompts 4 --input-len 16 --output-len 8");
  ASSERT_FALSE(j.empty());
  EXPECT_EQ(j["output_tokens"], 32);
  EXPECT_EQ(j["input_tokens"], 64);
  EXPECT_GT(j["output_tokens_per_second"].get<double>(), 0.0);
  EXPECT_EQ(j["peak_running_requests"], 4);
  EXPECT_GE(j["peak_kv_blocks"].get<int>(), 4);
}

// Asynchronous scheduling is on by default only where steps launch asynchronously (--device
// cuda): on the CPU backend it is off unless asked for, and then the same tokens are pipelined
// (with a warning that it overlaps nothing there); --no-async-scheduling turns it off.
TEST(Cli, AsyncSchedulingDefaultsOffOnTheCpuAndFollowsItsFlags) {
  const std::string flags = "--num-prompts 4 --input-len 16 --output-len 8";
  nlohmann::json by_default = bench_report(flags);
  nlohmann::json on = bench_report(flags + " --async-scheduling");
  nlohmann::json off = bench_report(flags + " --async-scheduling --no-async-scheduling");
  ASSERT_FALSE(by_default.empty() || on.empty() || off.empty());
  EXPECT_EQ(by_default["async_scheduling"], false);
  EXPECT_EQ(by_default["num_pipelined_steps"], 0);
  EXPECT_EQ(on["async_scheduling"], true);
  EXPECT_GT(on["num_pipelined_steps"].get<int>(), 0);
  EXPECT_EQ(on["output_tokens"], by_default["output_tokens"]);
  EXPECT_EQ(off["async_scheduling"], false);
  EXPECT_EQ(off["num_pipelined_steps"], 0);
  CommandResult warned = run_command("bench --model " + tiny_qwen3_dir() + " " + flags + " --async-scheduling --quiet",
                                         /*with_stderr=*/true);
  EXPECT_NE(warned.out.find("--async-scheduling overlaps nothing on the cpu backend"), std::string::npos) << warned.out;
}

// The CPU backend's KV pages hold 16 tokens unless --block-size says otherwise (the CUDA default of
// 32 for full KV is tests/gpu/app_cuda_block_size_test.cpp's).
TEST(Cli, BlockSizeDefaultsTo16OnTheCpuAndFollowsItsFlag) {
  const std::string flags = "--num-prompts 2 --input-len 16 --output-len 4";
  nlohmann::json by_default = bench_report(flags);
  nlohmann::json given = bench_report(flags + " --block-size 32");
  ASSERT_FALSE(by_default.empty() || given.empty());
  EXPECT_EQ(by_default["block_size"], 16);
  EXPECT_EQ(given["block_size"], 32);
}

// Two waves (6 prompts, 4 at a time, 32 tokens each): the rate while full covers the first wave's
// steps after which all 4 still run (the prefill step and 30 decode steps; the 32nd token's step
// finishes them), not the second wave of 2.
TEST(Cli, BenchReportsTheRateWhileTheBatchIsFull) {
  nlohmann::json j = bench_report("--num-prompts 6 --input-len 16 --output-len 32 --max-num-seqs 4");
  ASSERT_FALSE(j.empty());
  EXPECT_EQ(j["num_steps"], 64);
  EXPECT_EQ(j["full_batch_min_running"], 4);
  EXPECT_EQ(j["full_batch_steps"], 31);
  EXPECT_GT(j["full_batch_tokens_per_second"].get<double>(), 0.0);
  EXPECT_GT(j["full_batch_time_share"].get<double>(), 0.0);
  EXPECT_LT(j["full_batch_time_share"].get<double>(), 1.0);
  // One token each: every request finishes in the step that admits it; no batch was ever full.
  nlohmann::json one = bench_report("--num-prompts 4 --input-len 8 --output-len 1");
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(one["full_batch_steps"], 0);
  EXPECT_EQ(one["full_batch_tokens_per_second"].get<double>(), 0.0);
}

// --temperature / --top-p / --top-k set how every request samples (greedy by default, as before),
// appear in the report, and bad values are refused before the model loads, naming the field.
TEST(Cli, BenchSamplesAsItsFlagsSay) {
  const std::string flags = "--num-prompts 4 --input-len 16 --output-len 8";
  nlohmann::json greedy = bench_report(flags);
  nlohmann::json sampled = bench_report(flags + " --temperature 1 --top-p 0.9 --top-k 40");
  ASSERT_FALSE(greedy.empty() || sampled.empty());
  EXPECT_EQ(greedy["temperature"], 0.0);
  EXPECT_EQ(sampled["temperature"], 1.0);
  EXPECT_NEAR(sampled["top_p"].get<double>(), 0.9, 1e-6);
  EXPECT_EQ(sampled["top_k"], 40);
  EXPECT_EQ(sampled["output_tokens"], 32);
  EXPECT_EQ(sampled["failed"], 0);
  for (const char* bad : {"--temperature -1", "--top-p 0", "--top-p 1.5", "--top-k -2", "--temperature nan"}) {
    const CommandResult r = run_command("bench --model " + tiny_qwen3_dir() + " " + flags + " " + bad + " --quiet", true);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.out.find("is invalid"), std::string::npos) << bad << ": " << r.out;
  }
}

TEST(Cli, BadFlagsGiveAnErrorAndNonZeroExit) {
  EXPECT_NE(run_command("generate --model " + tiny_qwen3_dir() + " --prompt hi --temperature -1").exit_code, 0);
  EXPECT_NE(run_command("generate --model /nonexistent --prompt hi").exit_code, 0);
  EXPECT_NE(run_command("generate --model " + tiny_qwen3_dir() + " --prompt hi --kv-cache-memory lots").exit_code, 0);
  // --fp8-gemv-rows: the GEMV serves 0-4 rows; more is named as the error.
  const CommandResult gemv = run_command("generate --model " + tiny_qwen3_dir() + " --prompt hi --fp8-gemv-rows 5", true);
  EXPECT_NE(gemv.exit_code, 0);
  EXPECT_NE(gemv.out.find("--fp8-gemv-rows"), std::string::npos) << gemv.out;
  // Within the range it is accepted (and changes nothing on the CPU backend).
  EXPECT_EQ(run_command("generate --model " + tiny_qwen3_dir() + " --prompt hi --max-tokens 2 --fp8-gemv-rows 0").exit_code, 0);
}

}  // namespace
}  // namespace origami::testing
