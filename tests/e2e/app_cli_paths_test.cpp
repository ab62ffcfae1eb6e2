// The CLI's inputs, outputs and flag checks, run as a user would (docs/reliability.md, "Inputs,
// outputs and flags"): an --output that is the --input is refused before anything is truncated;
// --input reads FIFOs, /dev/stdin, process substitutions and "-"; absurd bench sizes, a negative
// --seed and option values the engine would refuse are usage errors (exit 2) found before the
// model loads (the model given here does not exist, so any later check would exit 1); outputs
// are created, not only permission-checked, before the run.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli_test_util.h"
#include "engine_test_util.h"

namespace origami::testing {
namespace {

namespace fs = std::filesystem;

constexpr const char* kRequest = R"({"prompt": "Hello", "max_tokens": 2})";

class CliPaths : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("origami_cli_paths_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::ofstream(dir_ / "r.jsonl") << kRequest << "\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string model() { return "--model " + tiny_qwen3_dir() + " "; }

  // Runs `script` with bash (process substitution) in the test folder, $ORIGAMI the binary;
  // stdout and stderr together.
  CommandResult bash(const std::string& script) const {
    const std::string cmd = "cd '" + dir_.string() + "' && ORIGAMI='" + std::string(ORIGAMI_BINARY_DIR) +
                            "/origami' bash -c '" + script + "' 2>&1";
    CommandResult r;
    FILE* pipe = popen(cmd.c_str(), "r");
    if (!pipe) return r;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) r.out.append(buf, n);
    const int status = pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  }

  fs::path dir_;
};

TEST_F(CliPaths, OutputThatIsTheInputIsRefusedBeforeTruncating) {
  fs::create_symlink(dir_ / "r.jsonl", dir_ / "link.jsonl");
  for (const std::string& out : std::vector<std::string>{"r.jsonl", "./r.jsonl", "link.jsonl", path("r.jsonl")}) {
    CommandResult r = bash("$ORIGAMI generate " + model() + "--input r.jsonl --output " + out);
    EXPECT_EQ(r.exit_code, 2) << out << ": " << r.out;
    EXPECT_NE(r.out.find("would erase the input"), std::string::npos) << r.out;
    EXPECT_EQ(read_file(dir_ / "r.jsonl"), std::string(kRequest) + "\n") << out;
  }
  // Standard input redirected from the output file is the same file.
  CommandResult r = bash("$ORIGAMI generate " + model() + "--input - --output r.jsonl < r.jsonl");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(read_file(dir_ / "r.jsonl"), std::string(kRequest) + "\n");
  // eval: --details and --plot may not be --data / --text either.
  r = bash("$ORIGAMI eval retrieval --model /nonexistent --data r.jsonl --details ./r.jsonl");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--details './r.jsonl' is the --data file"), std::string::npos) << r.out;
  EXPECT_EQ(read_file(dir_ / "r.jsonl"), std::string(kRequest) + "\n");
  // A different file is fine.
  r = bash("$ORIGAMI generate " + model() + "--input r.jsonl --output out.jsonl");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(parse_json_lines(read_file(dir_ / "out.jsonl")).size(), 1u);
}

TEST_F(CliPaths, InputReadsFifosStdinAndProcessSubstitutions) {
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0600), 0);
  const std::string gen = "$ORIGAMI generate " + model();
  for (const std::string& script : std::vector<std::string>{gen + "--input fifo --output out.jsonl & cat r.jsonl > fifo; wait $!",
                                   gen + "--input /dev/stdin --output out.jsonl < r.jsonl",
                                   gen + "--input - --output out.jsonl < r.jsonl",
                                   "cat r.jsonl | " + gen + "--input - --output out.jsonl",
                                   gen + "--input <(cat r.jsonl) --output out.jsonl"}) {
    fs::remove(dir_ / "out.jsonl");
    CommandResult r = bash(script);
    EXPECT_EQ(r.exit_code, 0) << script << ": " << r.out;
    std::vector<nlohmann::json> results = parse_json_lines(read_file(dir_ / "out.jsonl"));
    ASSERT_EQ(results.size(), 1u) << script;
    EXPECT_TRUE(results[0].contains("text")) << results[0].dump();
  }
  // eval reads "-" too: a text from stdin (a missing model fails after the input was read).
  CommandResult r = bash("echo some text | $ORIGAMI eval ppl --model /nonexistent --text -");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(r.out.find("--text"), std::string::npos) << r.out;
  // Still refused: a missing input, a folder.
  r = bash("$ORIGAMI generate --model /nonexistent --input missing.jsonl");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--input: cannot open 'missing.jsonl'"), std::string::npos) << r.out;
  r = bash("$ORIGAMI bench --model /nonexistent --input .");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("is a folder"), std::string::npos) << r.out;
}

TEST_F(CliPaths, BenchSizesAreBoundedUpFront) {
  struct Case {
    std::string flags, expect;
  };
  for (const Case& c : {Case{"--num-prompts 2147483647", "--num-prompts"}, Case{"--num-prompts 1000001", "--num-prompts"},
                        Case{"--input-len 2147483647", "--input-len 2147483647 is longer than the model's context (4096"},
                        Case{"--output-len 2147483647", "--output-len 2147483647 is longer than the model's context (4096"},
                        Case{"--input-len 4000 --max-model-len 1000", "context (1000 tokens"},
                        Case{"--num-prompts 1000000 --input-len 4096", "prompt tokens; at most 268435456"},
                        Case{"--num-prompts 0", "--num-prompts"}}) {
    CommandResult r = bash("$ORIGAMI bench " + model() + "--dummy-weights " + c.flags);
    EXPECT_EQ(r.exit_code, 2) << c.flags << ": " << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.flags << ": " << r.out;
    EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << r.out;
  }
}

TEST_F(CliPaths, FlagErrorsAreFoundBeforeTheModelLoads) {
  struct Case {
    std::string flags, expect;
  };
  for (const Case& c : {Case{"--seed -1", "--seed: '-1' is not a non-negative integer"},
                        Case{"--seed +5", "--seed"},
                        Case{"--kv-policy h2o --kv-policy-opt window=1e3", "window"},
                        Case{"--kv-policy-opt window=16", "window"},  // the default policy, full, has none
                        Case{"--kv-policy nosuchpolicy", "unknown KV policy 'nosuchpolicy'"},
                        Case{"--threads -3", "--threads"},
                        Case{"--group-budget-ratios 0", "--group-budget-ratios: 0"},
                        Case{"--group-budget-ratios 0.5,1.5", "--group-budget-ratios: 1.5"}}) {
    CommandResult r = bash("$ORIGAMI generate --model /nonexistent --prompt hi " + c.flags);
    EXPECT_EQ(r.exit_code, 2) << c.flags << ": " << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.flags << ": " << r.out;
  }
  // The same values that are valid get past the flag checks to the (missing) model: exit 1.
  CommandResult r = bash("$ORIGAMI generate --model /nonexistent --prompt hi --seed 7 --threads 0 --kv-policy h2o "
                         "--kv-policy-opt window=16 --group-budget-ratios 0.5,1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
}

TEST_F(CliPaths, OutputsAreCreatedNotOnlyPermissionCheckedBeforeTheRun) {
  std::ofstream(dir_ / "t.txt") << "some text to score\n";
  for (const std::string& flag : std::vector<std::string>{"--plot /proc/x.svg", "--details /proc/x.jsonl", "--plot /sys/x.svg"}) {
    CommandResult r = bash("$ORIGAMI eval ppl --model /nonexistent --text t.txt " + flag);
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.out;
    EXPECT_NE(r.out.find("cannot write"), std::string::npos) << flag << ": " << r.out;
  }
  CommandResult r = bash("$ORIGAMI generate --model /nonexistent --input r.jsonl --output /proc/out.jsonl");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  // The probe leaves nothing behind: a plot is written only at the end of a run.
  r = bash("$ORIGAMI eval ppl --model /nonexistent --text t.txt --plot p.svg");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "p.svg"));
}

}  // namespace
}  // namespace origami::testing
