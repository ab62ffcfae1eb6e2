// docs/reliability.md, run as a user would: a signal keeps every finished result (in the file,
// valid JSONL, sorted by index) and exits 130 / 143; a failed write is exit 1; output paths are
// checked before the model loads; absurd sizes are errors, not aborts; every input line gets a
// result; silently ignored input is an error or a warning; and the exit status follows one rule.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "cli_test_util.h"
#include "engine_test_util.h"

namespace origami::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class ReliabilityCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("origami_reliability_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(dir_ / name) << text; }
  static std::string model() { return "--model " + tiny_qwen3_dir() + " "; }

  // Starts `origami <args>` with stdout and stderr to files; returns its pid.
  pid_t spawn(const std::string& args) const {
    const std::string cmd = "exec " + std::string(ORIGAMI_BINARY_DIR) + "/origami " + args + " >" + path("stdout") +
                            " 2>" + path("stderr");
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  }
  // Waits until `file` holds at least `lines` complete lines (or 120 s pass).
  bool wait_for_lines(const std::string& file, size_t lines) const {
    return wait_for(file, [&](const std::string& text) {
      return static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) >= lines;
    });
  }
  bool wait_for_text(const std::string& file, const std::string& part) const {
    return wait_for(file, [&](const std::string& text) { return text.find(part) != std::string::npos; });
  }
  template <typename Pred>
  bool wait_for(const std::string& file, Pred done) const {
    for (auto start = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - start < 120s;
         std::this_thread::sleep_for(20ms))
      if (done(read_file(file))) return true;
    return false;
  }
  static int wait_exit(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // 200 requests long enough that a signal lands mid-run on any machine.
  void write_many_requests(const std::string& name, int n = 200) const {
    std::ofstream out(dir_ / name);
    for (int i = 0; i < n; ++i)
      out << nlohmann::json{{"id", i}, {"prompt", "The history of the city " + std::to_string(i)},
                            {"max_tokens", 48 + (i % 5) * 16}, {"ignore_eos", true}}
                 .dump()
          << "\n";
  }
  // Every line is a JSON result with a strictly increasing index and, here, a completion.
  static std::vector<nlohmann::json> finished_results(const std::string& text) {
    std::vector<nlohmann::json> lines;
    EXPECT_TRUE(text.empty() || text.back() == '\n') << "the file ends in a partial line";
    EXPECT_NO_THROW(lines = parse_json_lines(text)) << text;
    for (size_t i = 0; i < lines.size(); ++i) {
      EXPECT_TRUE(lines[i].contains("text")) << lines[i];
      EXPECT_EQ(lines[i]["id"], lines[i]["index"]) << lines[i];
      EXPECT_EQ(lines[i]["num_output_tokens"], 48 + (lines[i]["index"].get<int>() % 5) * 16) << lines[i];
      if (i > 0) {
        EXPECT_GT(lines[i]["index"].get<int>(), lines[i - 1]["index"].get<int>());
      }
    }
    return lines;
  }

  fs::path dir_;
};

TEST_F(ReliabilityCli, SigintMidRunKeepsEveryFinishedResultAndExits130) {
  write_many_requests("in.jsonl");
  const pid_t pid = spawn("generate " + model() + "--max-num-seqs 8 --input " + path("in.jsonl") + " --output " +
                          path("out.jsonl"));
  ASSERT_TRUE(wait_for_lines(path("out.jsonl"), 3)) << read_file(path("stderr"));
  const size_t seen = parse_json_lines(read_file(path("out.jsonl"))).size();
  kill(pid, SIGINT);
  EXPECT_EQ(wait_exit(pid), 130) << read_file(path("stderr"));
  const std::vector<nlohmann::json> lines = finished_results(read_file(path("out.jsonl")));
  EXPECT_GE(lines.size(), seen);
  EXPECT_LT(lines.size(), 200u) << "the run should have been cut short";
  const std::string err = read_file(path("stderr"));
  EXPECT_NE(err.find("interrupted (SIGINT): " + std::to_string(lines.size()) + " of 200 results written"), std::string::npos)
      << err;
}

TEST_F(ReliabilityCli, SigtermExits143AndASecondSignalExitsAtOnce) {
  write_many_requests("in.jsonl");
  pid_t pid = spawn("generate " + model() + "--max-num-seqs 8 --input " + path("in.jsonl") + " --output " + path("out.jsonl"));
  ASSERT_TRUE(wait_for_lines(path("out.jsonl"), 2)) << read_file(path("stderr"));
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit(pid), 143) << read_file(path("stderr"));
  EXPECT_GE(finished_results(read_file(path("out.jsonl"))).size(), 2u);

  pid = spawn("generate " + model() + "--max-num-seqs 8 --input " + path("in.jsonl") + " --output " + path("out.jsonl"));
  ASSERT_TRUE(wait_for_lines(path("out.jsonl"), 2)) << read_file(path("stderr"));
  kill(pid, SIGINT);
  kill(pid, SIGINT);
  EXPECT_EQ(wait_exit(pid), 130) << read_file(path("stderr"));
  EXPECT_GE(finished_results(read_file(path("out.jsonl"))).size(), 2u);  // flushed as written
}

TEST_F(ReliabilityCli, InterruptedBenchReportsTheFinishedRequests) {
  const pid_t pid = spawn("bench " + model() + "--num-prompts 64 --input-len 16 --output-len 400 --max-num-seqs 4 --json");
  ASSERT_TRUE(wait_for_text(path("stderr"), "bench [")) << read_file(path("stderr"));  // the run has started
  std::this_thread::sleep_for(300ms);
  kill(pid, SIGINT);
  EXPECT_EQ(wait_exit(pid), 130) << read_file(path("stderr"));
  const nlohmann::json j = nlohmann::json::parse(read_file(path("stdout")));
  EXPECT_GT(j["interrupted"].get<int>(), 0);
  EXPECT_EQ(j["completed"].get<int>() + j["failed"].get<int>() + j["interrupted"].get<int>(), 64);
  EXPECT_EQ(j["output_tokens"].get<int>(), 400 * j["completed"].get<int>());
}

// A second signal does not wait for the step in progress (here a prefill of seconds), yet still
// prints a complete report of the run so far: the one rendered ahead for it.
TEST_F(ReliabilityCli, BenchPrintsItsReportOnASecondSignal) {
  const pid_t pid = spawn("bench " + model() +
                          "--num-prompts 6 --input-len 1000 --output-len 4 --max-num-seqs 6 --max-num-batched-tokens 8192 --json");
  ASSERT_TRUE(wait_for_text(path("stderr"), "bench [")) << read_file(path("stderr"));
  std::this_thread::sleep_for(300ms);  // inside the first step
  kill(pid, SIGINT);
  // Signals of one kind do not queue: the second is sent once the first has been handled.
  ASSERT_TRUE(wait_for_text(path("stderr"), "origami: stopping")) << read_file(path("stderr"));
  kill(pid, SIGINT);
  EXPECT_EQ(wait_exit(pid), 130) << read_file(path("stderr"));
  const std::string out = read_file(path("stdout"));
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(out)) << out;
  EXPECT_EQ(j["interrupted_by"], "second signal") << "the final report, not the one rendered ahead: the step ended too soon";
  EXPECT_EQ(j["interrupted"].get<int>(), 6);
  EXPECT_EQ(j["completed"].get<int>(), 0);
  EXPECT_NE(read_file(path("stderr")).find("second signal, exiting now"), std::string::npos);
}

// --time-limit stops the run on its own: the finished requests' metrics, the unfinished ones
// counted, a line saying so, and exit 0 (the run did what it was asked).
TEST_F(ReliabilityCli, BenchTimeLimitReportsWhatFinished) {
  const std::string args = "bench " + model() + "--num-prompts 24 --input-len 16 --output-len 300 --max-num-seqs 4 --quiet --time-limit 1.5";
  CommandResult r = run_command(args + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["interrupted_by"], "time limit");
  EXPECT_GT(j["interrupted"].get<int>(), 0);
  EXPECT_EQ(j["completed"].get<int>() + j["failed"].get<int>() + j["interrupted"].get<int>(), 24);
  EXPECT_EQ(j["output_tokens"].get<int>(), 300 * j["completed"].get<int>());
  EXPECT_GT(j["unfinished_output_tokens"].get<int>(), 0);
  EXPECT_LT(j["wall_seconds"].get<double>(), 10.0);
  r = run_command(args, true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("interrupted         by time limit: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("requests did not finish"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("origami: stopped at --time-limit 1.5 s"), std::string::npos) << r.out;
}

TEST_F(ReliabilityCli, InterruptedEvalKeepsTheFinishedPoints) {
  {
    std::ofstream docs(dir_ / "docs.jsonl");
    std::string filler;
    for (int i = 0; i < 5; ++i) filler += "The river ran past the old mill and the village in the long summer. ";
    for (int i = 0; i < 6; ++i)
      docs << nlohmann::json{{"id", i}, {"prompt", filler + "The secret number is 12" + std::to_string(10 + i) + ". " + filler +
                                                       "\nThe secret number is"},
                             {"answer", "12" + std::to_string(10 + i)}}
                  .dump()
           << "\n";
  }
  const pid_t pid = spawn("eval retrieval " + model() + "--data " + path("docs.jsonl") +
                          " --kv-policy streaming --kv-budget 64,96,128,160,192,224,256,288 --json --quiet --details " +
                          path("details.jsonl"));
  ASSERT_TRUE(wait_for_lines(path("stdout"), 1)) << read_file(path("stderr"));
  kill(pid, SIGINT);
  EXPECT_EQ(wait_exit(pid), 130) << read_file(path("stderr"));
  const std::vector<nlohmann::json> points = parse_json_lines(read_file(path("stdout")));
  ASSERT_GE(points.size(), 1u);
  EXPECT_LT(points.size(), 9u);
  EXPECT_EQ(parse_json_lines(read_file(path("details.jsonl"))).size(), 6 * points.size());
  EXPECT_NE(read_file(path("stderr")).find("interrupted (SIGINT)"), std::string::npos);
}

TEST_F(ReliabilityCli, FailedWritesAreExit1) {
  write("in.jsonl", R"({"prompt": "Hello", "max_tokens": 2})" "\n");
  CommandResult r = run_command("generate " + model() + "--input " + path("in.jsonl") + " --output /dev/full", true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--output: writing '/dev/full' failed"), std::string::npos) << r.out;
  // stdout on a full disk: stderr still says why.
  for (const std::string& args : {"bench " + model() + "--num-prompts 2 --input-len 4 --output-len 2 --json --quiet",
                                  "generate " + model() + "--prompt Hello --max-tokens 2"}) {
    const std::string cmd =
        std::string(ORIGAMI_BINARY_DIR) + "/origami " + args + " >/dev/full 2>" + path("stderr");
    const int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << args;
    EXPECT_NE(read_file(path("stderr")).find("writing to stdout failed"), std::string::npos) << read_file(path("stderr"));
  }
}

TEST_F(ReliabilityCli, OutputPathsAreCheckedBeforeTheModelLoads) {
  write("in.jsonl", R"({"prompt": "Hello"})" "\n");
  // The model does not exist either: the output path must be the error, found first.
  CommandResult r = run_command("generate --model /nonexistent --input " + path("in.jsonl") + " --output " +
                                    path("no/such/folder/out.jsonl"),
                                true);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--output: cannot write"), std::string::npos) << r.out;
  r = run_command("generate --model /nonexistent --input " + path("in.jsonl") + " --output " + dir_.string(), true);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("is a folder"), std::string::npos) << r.out;
  r = run_command("eval ppl --model /nonexistent --text " + path("in.jsonl") + " --plot " + path("no/plot.svg"), true);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--plot: cannot write"), std::string::npos) << r.out;
  r = run_command("eval ppl --model /nonexistent --text " + path("in.jsonl") + " --details " + path("no/d.jsonl"), true);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--details: cannot write"), std::string::npos) << r.out;
}

TEST_F(ReliabilityCli, AbsurdSizesAreClearErrorsNotAborts) {
  fs::create_directories(dir_ / "big");
  for (const auto& entry : fs::directory_iterator(tiny_qwen3_dir())) fs::copy(entry.path(), dir_ / "big" / entry.path().filename());
  nlohmann::json config = read_json(tiny_qwen3_dir() + "/config.json");
  config["num_hidden_layers"] = 1000000000;
  std::ofstream(dir_ / "big" / "config.json") << config.dump();
  for (const char* extra : {"", "--dummy-weights "}) {
    CommandResult r = run_command("generate --model " + path("big") + " " + extra + "--prompt hi", true);
    EXPECT_EQ(r.exit_code, 1) << extra << r.out;
    EXPECT_NE(r.out.find("origami: error:"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << r.out;
  }
  CommandResult r = run_command("generate " + model() + "--prompt hi --kv-cache-memory 1e16", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("needs about 8.9 PiB"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("no usable block"), std::string::npos) << r.out;
}

TEST_F(ReliabilityCli, MaxModelLenIsPositiveAndAtMostTheContext) {
  for (const char* bad : {"0", "-5"}) {
    CommandResult r = run_command("generate " + model() + "--prompt hi --max-model-len=" + bad, true);
    EXPECT_EQ(r.exit_code, 2) << bad << r.out;
    EXPECT_NE(r.out.find("--max-model-len"), std::string::npos) << r.out;
  }
  CommandResult r = run_command("generate " + model() + "--prompt hi --max-model-len 5000", true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("exceeds the model's context of 4096 tokens"), std::string::npos) << r.out;
}

TEST_F(ReliabilityCli, EveryLineGetsAResultAndBadValuesNameTheLine) {
  write("in.jsonl", std::string(R"({"id": "a", "prompt": "Hello", "max_tokens": 2})") + "\n\n" +
                        R"({"prompt": [1, 4294967301]})" "\n" R"({"prompt": "x", "max_tokns": 3})" "\n" +
                        R"({"prompt": "x", "seed": -1})" "\n" R"({"prompt": "x", "kv_budget": 64})" "\n");
  CommandResult r = run_command("generate " + model() + "--input " + path("in.jsonl") + " --output " + path("out.jsonl"), true);
  EXPECT_EQ(r.exit_code, 1) << "a failed request makes the run exit 1";
  EXPECT_NE(r.out.find("5 of 6 requests failed"), std::string::npos) << r.out;
  const std::vector<nlohmann::json> lines = parse_json_lines(read_file(path("out.jsonl")));
  ASSERT_EQ(lines.size(), 6u);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i]["index"], i);
  EXPECT_EQ(lines[0]["num_output_tokens"], 2);
  const std::string in = path("in.jsonl");
  EXPECT_NE(lines[1]["error"].get<std::string>().find(in + ":2: blank line"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2]["error"].get<std::string>().find(in + ":3: field 'prompt'[1] = 4294967301"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3]["error"].get<std::string>().find(in + ":4: unknown field 'max_tokns'"), std::string::npos) << lines[3];
  EXPECT_NE(lines[4]["error"].get<std::string>().find(in + ":5: field 'seed'"), std::string::npos) << lines[4];
  EXPECT_NE(lines[5]["error"].get<std::string>().find(in + ":6: "), std::string::npos) << lines[5];
  EXPECT_NE(lines[5]["error"].get<std::string>().find("does not compress"), std::string::npos) << lines[5];
}

TEST_F(ReliabilityCli, IgnoredFlagsAreErrorsOrWarnings) {
  CommandResult r = run_command("generate " + model() + "--prompt hi --kv-policy snapkv --kv-policy-opt window=8 "
                                "--kv-policy-opt window=16",
                                true);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("'window' is given twice"), std::string::npos) << r.out;
  r = run_command("generate " + model() + "--prompt hi --kv-budget 512", true);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("KV policy 'full' does not compress"), std::string::npos) << r.out;
  // A tokenizer smaller than the embedding runs, with a warning; a larger one cannot.
  r = run_command("generate " + model() + "--prompt hi --max-tokens 2 --tokenizer " + stories_dir(), true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("origami: warning: the tokenizer in " + stories_dir() + " has 512 tokens"), std::string::npos) << r.out;
  r = run_command("generate --model " + stories_dir() + " --prompt hi --tokenizer " + tiny_qwen3_dir(), true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("has 8192 tokens, but the model's embedding has only 512 rows"), std::string::npos) << r.out;
}

TEST_F(ReliabilityCli, BenchSaysWhyRequestsFailedAndCountsTheContextCap) {
  write("in.jsonl", std::string(R"({"prompt": "Hello", "max_tokens": 2})") + "\n" + R"({"prompt": "x", "temperature": -1})" +
                        "\n" + R"({"prompt": [1, 99999]})" "\n");
  CommandResult r = run_command("bench " + model() + "--input " + path("in.jsonl") + " --json --quiet", true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("2 of 3 requests failed; the first 2 errors:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("request 1: " + path("in.jsonl") + ":2: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("request 2: " + path("in.jsonl") + ":3: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("outside the vocabulary"), std::string::npos) << r.out;
  // 40-token prompts, 50 tokens asked, a 64-token context: 24 each, reported as capped.
  r = run_command("bench " + model() + "--num-prompts 3 --input-len 40 --output-len 50 --max-model-len 64 --json --quiet");
  EXPECT_EQ(r.exit_code, 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["output_tokens"], 3 * 24);
  EXPECT_EQ(j["capped_by_context"], 3);
  EXPECT_EQ(j["failed"], 0);
}

TEST_F(ReliabilityCli, StreamEvalOfADocumentLongerThanTheContextFailsUpFront) {
  std::string prompt;
  for (int i = 0; i < 20; ++i) prompt += "The river ran past the old mill and the village. ";
  write("docs.jsonl", nlohmann::json{{"id", 0}, {"prompt", prompt + "The secret number is"}, {"answer", "1234"}}.dump() + "\n");
  const auto start = std::chrono::steady_clock::now();
  CommandResult r = run_command("eval retrieval " + model() + "--data " + path("docs.jsonl") +
                                    " --mode stream --max-model-len 64 --json --quiet",
                                true);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("but the model's context (max_model_len) is 64 tokens"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("do not start with the"), std::string::npos) << r.out;
}

TEST_F(ReliabilityCli, NonFiniteLogitsFailTheRequest) {
  fs::create_directories(dir_ / "nan");
  for (const auto& entry : fs::directory_iterator(stories_dir())) fs::copy(entry.path(), dir_ / "nan" / entry.path().filename());
  // Overwrite every f32 weight value with NaN, keeping the safetensors header.
  std::string bytes = read_file(dir_ / "nan" / "model.safetensors");
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<unsigned char>(bytes[i]);
  const uint32_t nan_bits = 0x7fc00000u;
  for (size_t off = 8 + header; off + 4 <= bytes.size(); off += 4) std::memcpy(&bytes[off], &nan_bits, 4);
  std::ofstream(dir_ / "nan" / "model.safetensors", std::ios::binary) << bytes;
  CommandResult r = run_command("generate --model " + path("nan") + " --prompt 'Once upon a time' --max-tokens 8", true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("the model's logits are not finite"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace origami::testing
