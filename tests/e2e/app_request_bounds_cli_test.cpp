// docs/reliability.md, "JSON depth and number bounds", through the CLI as a user runs it: JSON
// nested 10^6 deep in a JSONL request line and deep --chat-template-kwargs are errors that say so,
// and every numeric flag and JSON field at every integer boundary is a success or an error with a
// message (exit 0, 1 for a failed request, 2 for a bad flag), never a crash.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "cli_test_util.h"
#include "engine_test_util.h"

namespace origami::testing {
namespace {

namespace fs = std::filesystem;

// Every integer boundary, as text (JSON and flags take the same spellings).
const std::vector<std::string> kBoundaries = {"0",          "1",          "-1",         "2147483647",
                                              "2147483648", "4294967296", "9007199254740992",
                                              "9223372036854775807",      "18446744073709551616",
                                              "1e308",      "-0.0",       "1.5"};

class RequestBoundsCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("origami_bounds_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(dir_ / name) << text; }
  // A short context: every accepted request, whatever its max_tokens, is a few tokens long.
  static std::string model() { return "--model " + tiny_qwen3_dir() + " --max-model-len 24 "; }
  fs::path dir_;
};

TEST_F(RequestBoundsCli, DeepJsonlLineIsAnErrorAndTheOthersComplete) {
  const std::string deep = std::string(1000000, '[') + "\"x\"" + std::string(1000000, ']');
  write("in.jsonl", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"stop\": " + deep + "}\n{\"prompt\": \"hi\", \"max_tokens\": 2}\n");
  CommandResult r = run_command("generate " + model() + "--input " + path("in.jsonl") + " --output " + path("out.jsonl"), true);
  EXPECT_EQ(r.exit_code, 1) << r.out.substr(0, 500);
  const std::vector<nlohmann::json> lines = parse_json_lines(read_file(path("out.jsonl")));
  ASSERT_EQ(lines.size(), 2u);
  const std::string error = lines[0]["error"].get<std::string>();
  EXPECT_NE(error.find(":1: JSON nested deeper than 64 levels at byte offset "), std::string::npos) << error;
  EXPECT_EQ(lines[1]["num_output_tokens"], 2) << lines[1];
}

TEST_F(RequestBoundsCli, DeepChatTemplateKwargsIsAUsageError) {
  // 30000 levels: what one command-line argument can hold (128 KiB).
  const std::string deep = "'{\"x\": " + std::string(30000, '[') + std::string(30000, ']') + "}'";
  CommandResult r = run_command("generate " + model() + "--chat --prompt hi --chat-template-kwargs " + deep, true);
  EXPECT_EQ(r.exit_code, 2) << r.out.substr(0, 500);
  EXPECT_NE(r.out.find("--chat-template-kwargs must be a JSON object (JSON nested deeper than 64 levels at byte offset 69)"),
            std::string::npos)
      << r.out.substr(0, 500);
  EXPECT_LT(r.out.size(), 1000u) << "the error quotes the argument";
}

TEST_F(RequestBoundsCli, NumericFlagsAtEveryBoundary) {
  // Flags checked before the model loads: a wrong value is exit 2 naming the flag; the values the
  // engine runs are exit 0.
  struct Flag {
    std::string name;
    std::vector<std::string> runs;
  };
  const std::vector<Flag> flags = {
      {"--max-tokens", {"1", "2147483647"}},
      {"--top-k", {"0", "1", "-1", "2147483647"}},
      {"--seed", {"0", "1", "2147483647", "2147483648", "4294967296", "9007199254740992", "9223372036854775807"}},
      {"--kv-budget", {"0"}},
  };
  for (const Flag& f : flags) {
    for (const std::string& v : kBoundaries) {
      const bool runs = std::find(f.runs.begin(), f.runs.end(), v) != f.runs.end();
      const std::string extra = f.name == "--kv-budget" ? " --kv-policy streaming --max-tokens 2" : f.name == "--max-tokens" ? "" : " --max-tokens 2";
      CommandResult r = run_command("generate " + model() + "--prompt hi " + f.name + "=" + v + extra, true);
      if (runs) {
        EXPECT_EQ(r.exit_code, 0) << f.name << "=" << v << ": " << r.out;
      } else {
        EXPECT_EQ(r.exit_code, 2) << f.name << "=" << v << ": " << r.out;
        // Named as the flag (CLI11's conversion errors) or as its sampling parameter (validate()).
        std::string parameter = f.name.substr(2);
        std::replace(parameter.begin(), parameter.end(), '-', '_');
        EXPECT_TRUE(r.out.find(f.name) != std::string::npos || r.out.find(parameter) != std::string::npos)
            << f.name << "=" << v << ": " << r.out;
      }
    }
  }
  // The budget flag's limit is the JSON field's: 2^30 runs, one above is refused.
  EXPECT_EQ(run_command("generate " + model() + "--prompt hi --max-tokens 2 --kv-policy streaming --kv-budget 1073741824").exit_code, 0);
  EXPECT_EQ(run_command("generate " + model() + "--prompt hi --max-tokens 2 --kv-policy streaming --kv-budget 1073741825").exit_code, 2);
}

TEST_F(RequestBoundsCli, NumericJsonFieldsAtEveryBoundary) {
  // One line per (field, value); every line gets a result or an error naming the line, none crashes.
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"max_tokens", R"({"prompt": "hi", "max_tokens": @})"},
      {"top_k", R"({"prompt": "hi", "max_tokens": 2, "top_k": @})"},
      {"seed", R"({"prompt": "hi", "max_tokens": 2, "seed": @})"},
      {"kv_budget", R"({"prompt": "hi", "max_tokens": 2, "kv_policy": "streaming", "kv_budget": @})"},
      {"kv_budget", R"({"prompt": "hi", "max_tokens": 2, "kv_policy": "pagedeviction", "kv_budget": @})"},
      {"stop_token_ids", R"({"prompt": "hi", "max_tokens": 2, "stop_token_ids": [@]})"},
      {"forced_output_tokens", R"({"prompt": "hi", "max_tokens": 2, "forced_output_tokens": [@]})"},
      {"prompt", R"({"prompt": [@], "max_tokens": 2})"},
  };
  std::string text;
  for (const auto& [field, tmpl] : fields)
    for (const std::string& v : kBoundaries) text += tmpl.substr(0, tmpl.find('@')) + v + tmpl.substr(tmpl.find('@') + 1) + "\n";
  write("in.jsonl", text);
  CommandResult r = run_command("generate " + model() + "--input " + path("in.jsonl") + " --output " + path("out.jsonl"), true);
  EXPECT_EQ(r.exit_code, 1) << r.out.substr(0, 1000);
  const std::vector<nlohmann::json> lines = parse_json_lines(read_file(path("out.jsonl")));
  ASSERT_EQ(lines.size(), fields.size() * kBoundaries.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& field = fields[i / kBoundaries.size()].first;
    const std::string& v = kBoundaries[i % kBoundaries.size()];
    if (lines[i].contains("error")) {
      const std::string e = lines[i]["error"].get<std::string>();
      EXPECT_NE(e.find(":" + std::to_string(i + 1) + ": "), std::string::npos) << field << "=" << v << ": " << e;
    } else {
      EXPECT_GE(lines[i]["num_output_tokens"].get<int>(), 1) << field << "=" << v << ": " << lines[i];
    }
  }
  // Near 2^31 the budget used to overflow the scheduler's N_max * b (an internal check abort).
  for (size_t f = 3; f <= 4; ++f) {
    const nlohmann::json& at_int_max = lines[f * kBoundaries.size() + 3];
    ASSERT_TRUE(at_int_max.contains("error")) << at_int_max;
    EXPECT_NE(at_int_max["error"].get<std::string>().find("kv_budget"), std::string::npos) << at_int_max;
  }
}

}  // namespace
}  // namespace origami::testing
