// The compression side of the `origami` command line: `origami policies`, the common
// --kv-policy/--kv-budget/--kv-policy-opt flags, per-line policies in JSONL batches, and the
// compression metrics `origami bench` reports.
#include <filesystem>

#include "cli_test_util.h"
#include "engine_test_util.h"

namespace origami::testing {
namespace {

namespace fs = std::filesystem;

TEST(CliCompression, PoliciesListsEveryPolicyWithOptions) {
  CommandResult r = run_command("policies --json");
  ASSERT_EQ(r.exit_code, 0);
  const nlohmann::json list = nlohmann::json::parse(r.out);
  std::vector<std::string> names;
  for (const auto& p : list) names.push_back(p["name"]);
  EXPECT_EQ(names, (std::vector<std::string>{"full", "streaming", "snapkv", "zipage", "zipage-attn", "zipage-global",
                                             "zipage-flash", "zipage-lightning", "knorm", "h2o", "tova",
                                             "keydiff", "rkv", "pagedeviction", "kvllm", "fastkvzip", "kvzip",
                                             "tangram", "adakv"}));
  EXPECT_TRUE(list[17]["needs_head_budgets"].get<bool>());
  EXPECT_FALSE(list[3]["needs_head_budgets"].get<bool>());
  // The needs are reported, so that sweeps can leave out what their engine cannot run.
  EXPECT_TRUE(list[15]["needs_gates"].get<bool>());
  EXPECT_FALSE(list[15]["needs_reconstruction"].get<bool>());
  EXPECT_TRUE(list[16]["needs_reconstruction"].get<bool>());
  EXPECT_FALSE(list[3]["needs_gates"].get<bool>());
  EXPECT_TRUE(list[18]["needs_joint_selection"].get<bool>());
  EXPECT_FALSE(list[3]["needs_joint_selection"].get<bool>());
  const auto& zipage = list[3];
  EXPECT_TRUE(zipage["needs_queries"].get<bool>());
  bool has_window = false;
  for (const auto& o : zipage["options"])
    if (o["name"] == "window") has_window = o["default"] == "16";
  EXPECT_TRUE(has_window);
  CommandResult text = run_command("policies");
  ASSERT_EQ(text.exit_code, 0);
  EXPECT_NE(text.out.find("zipage-lightning"), std::string::npos);
  EXPECT_NE(text.out.find("redundancy"), std::string::npos);
}

TEST(CliCompression, BenchReportsCompression) {
  CommandResult r = run_command("bench --model " + tiny_qwen3_dir() +
                                " --num-prompts 4 --input-len 20 --output-len 60 --json --quiet --kv-policy zipage"
                                " --kv-budget 32 --kv-policy-opt redundancy=none --no-async-compression");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["output_tokens"], 240);
  EXPECT_EQ(j["kv_policy"], "zipage");
  EXPECT_EQ(j["kv_policy_options"]["redundancy"], "none");
  EXPECT_EQ(j["async_compression"], false);
  // 20 + 60 tokens, 79 of them computed: each request compresses when its 48th and 64th tokens
  // are in (N_max * b = 48 entries, back to k = 32).
  EXPECT_EQ(j["num_compressions"], 4 * 2);
  EXPECT_GT(j["compression_time_share"].get<double>(), 0.0);
  EXPECT_LT(j["compression_time_share"].get<double>(), 1.0);
  EXPECT_EQ(j["peak_running_requests"], 4);
  EXPECT_GT(j["query_slots"].get<int>(), 0);
}

TEST(CliCompression, BadPolicyFlagsNameTheProblem) {
  CommandResult r = run_command("bench --model " + tiny_qwen3_dir() + " --num-prompts 1 --quiet --kv-policy no-such-policy", true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("'no-such-policy'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("zipage"), std::string::npos) << r.out;
  r = run_command("bench --model " + tiny_qwen3_dir() + " --num-prompts 1 --quiet --kv-policy zipage --kv-policy-opt window", true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("key=value"), std::string::npos) << r.out;
  r = run_command("bench --model " + tiny_qwen3_dir() + " --num-prompts 1 --quiet --kv-policy zipage --kv-budget 8", true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("budget 8"), std::string::npos) << r.out;
  // kvllm keeps a ratio of its window: a budget for it would be silently ignored, so it is an error.
  r = run_command("bench --model " + tiny_qwen3_dir() + " --num-prompts 1 --quiet --kv-policy kvllm --kv-budget 64", true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("takes no budget"), std::string::npos) << r.out;
}

TEST(CliCompression, BenchRunsKvllmWindows) {
  // 4 requests of 20 + 60 tokens, window 48 (buffer 8), every 4 steps: each compresses its
  // trailing window at least once, keeping ceil(0.3 * 40) = 12 of the 40 compressible entries.
  CommandResult r = run_command("bench --model " + tiny_qwen3_dir() +
                                " --num-prompts 4 --input-len 20 --output-len 60 --json --quiet --kv-policy kvllm"
                                " --kv-policy-opt window=48 --kv-policy-opt buffer=8 --kv-policy-opt delta=4");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["output_tokens"], 240);
  EXPECT_GE(j["num_compressions"].get<int>(), 4);
}

TEST(CliCompression, JsonlLinesCarryTheirOwnPolicy) {
  const fs::path dir = fs::temp_directory_path() / "origami_cli_compression_test";
  fs::create_directories(dir);
  {
    std::ofstream in(dir / "in.jsonl");
    in << R"({"id": "full", "prompt": "The history of the city", "max_tokens": 70, "temperature": 0, "ignore_eos": true})" << "\n";
    in << R"({"id": "zip", "prompt": "The history of the city", "max_tokens": 70, "temperature": 0, "ignore_eos": true,)"
       << R"( "kv_policy": "zipage-attn", "kv_budget": 32, "kv_policy_options": {"window": 8}})" << "\n";
    in << R"({"id": "bad", "prompt": "x", "kv_policy": "nope"})" << "\n";
    in << R"({"id": "badopt", "prompt": "x", "kv_policy": "zipage", "kv_policy_options": {"window": [1]}})" << "\n";
  }
  CommandResult r = run_command("generate --model " + tiny_qwen3_dir() + " --input " + (dir / "in.jsonl").string() +
                                " --output " + (dir / "out.jsonl").string());
  ASSERT_EQ(r.exit_code, 1);  // two requests fail (docs/reliability.md); the others complete
  const std::vector<nlohmann::json> lines = parse_json_lines(read_file(dir / "out.jsonl"));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["num_output_tokens"], 70);
  EXPECT_EQ(lines[1]["num_output_tokens"], 70);
  // The same greedy prompt decodes differently once its cache is compressed to 32 entries.
  EXPECT_NE(lines[0]["token_ids"], lines[1]["token_ids"]);
  EXPECT_NE(lines[2]["error"].get<std::string>().find("'nope'"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3]["error"].get<std::string>().find("kv_policy_options.window"), std::string::npos) << lines[3];
  fs::remove_all(dir);
}

}  // namespace
}  // namespace origami::testing
