// `origami eval retrieval|ppl` run as a user would run it, on origami-tiny-qwen3 with the CPU
// backend: sweeps print one JSON line per point with the right fields, a budget larger than
// every document equals full KV exactly (an invariant), the SVG plot has one line per policy,
// and bad input is an error that names the problem.
#include <unistd.h>

#include <filesystem>

#include "cli_test_util.h"
#include "engine_test_util.h"

namespace origami::testing {
namespace {

namespace fs = std::filesystem;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + what.size())) ++n;
  return n;
}

const char* kFiller =
    "The river ran past the old mill and the village where the people worked in the fields every day of the "
    "long summer. ";

// Three retrieval documents (~110 tokens each, one fact each) and a short text, in a folder of
// this process's own.
class EvalCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("origami_eval_cli_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    const struct {
      const char* adjective;
      const char* noun;
      const char* digits;
    } facts[] = {{"red", "fox", "1234"}, {"blue", "whale", "5678"}, {"green", "tiger", "9012"}};
    std::ofstream docs(dir_ / "docs.jsonl");
    int id = 0;
    for (const auto& f : facts) {
      const std::string thing = std::string(f.adjective) + " " + f.noun;
      const std::string prompt = std::string(kFiller) + kFiller + " The secret number of the " + thing + " is " +
                                 f.digits + ". " + kFiller + kFiller + "\nQuestion: What is the secret number of the " +
                                 thing + "?\nAnswer: The secret number of the " + thing + " is";
      docs << nlohmann::json{{"id", id++}, {"prompt", prompt}, {"answer", f.digits}}.dump() << "\n";
    }
    std::ofstream text(dir_ / "text.txt");
    for (int i = 0; i < 4; ++i)
      text << "Once upon a time a small rabbit lived near a quiet meadow. Every morning it ran to the river to "
              "drink, and every evening it watched the sun go down behind the ancient tower. ";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string path(const char* name) { return (dir_ / name).string(); }
  static std::string model() { return "--model " + tiny_qwen3_dir() + " "; }

  static fs::path dir_;
};
fs::path EvalCli::dir_;

TEST_F(EvalCli, RetrievalSweepPrintsOnePointPerLineAndPlotsOneLinePerPolicy) {
  const CommandResult r =
      run_command("eval retrieval " + model() + "--data " + path("docs.jsonl") +
                  " --mode stream --kv-policy full,streaming,zipage --kv-budget 512,64 --json --quiet --plot " +
                  path("sweep.svg") + " --details " + path("details.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::vector<nlohmann::json> lines = parse_json_lines(r.out);
  // The full-KV reference once, then every policy at every budget in ascending order.
  ASSERT_EQ(lines.size(), 5u) << r.out;
  const std::vector<std::pair<std::string, int>> expected = {
      {"full", 0}, {"streaming", 64}, {"streaming", 512}, {"zipage", 64}, {"zipage", 512}};
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json& j = lines[i];
    EXPECT_EQ(j["task"], "retrieval");
    EXPECT_EQ(j["policy"], expected[i].first);
    EXPECT_EQ(j["budget"], expected[i].second);
    EXPECT_EQ(j["reference"], i == 0);
    EXPECT_EQ(j["mode"], "stream");
    EXPECT_EQ(j["num_documents"], 3);
    EXPECT_EQ(j["failed"], 0) << j;
    EXPECT_TRUE(j["accuracy"].is_number()) << j;
    EXPECT_EQ(j["accuracy_full"], lines[0]["accuracy"]);
    // The engine flags the run used.
    EXPECT_EQ(j["device"], "cpu");
    EXPECT_EQ(j["block_size"], 16);
    EXPECT_EQ(j["max_answer_tokens"], 6);
    EXPECT_NE(j["model"].get<std::string>().find("origami-tiny-qwen3"), std::string::npos);
    EXPECT_TRUE(j.contains("kv_policy_options"));
  }
  // The facts are easy for the tiny model with its full KV cache.
  EXPECT_GE(lines[0]["correct"].get<int>(), 2) << lines[0];
  // Budget 64 compresses these ~110-token documents; 512 is more than any of them holds, so the
  // policy changes nothing: exactly full KV's accuracy.
  EXPECT_GT(lines[1]["num_compressions"].get<int>(), 0);
  for (size_t i : {2u, 4u}) {
    EXPECT_EQ(lines[i]["num_compressions"], 0) << lines[i];
    EXPECT_EQ(lines[i]["correct"], lines[0]["correct"]) << lines[i];
    EXPECT_EQ(lines[i]["accuracy"], lines[0]["accuracy"]) << lines[i];
  }

  const std::string svg = read_file(dir_ / "sweep.svg");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 2u) << "one line per policy other than full KV";
  EXPECT_NE(svg.find(">streaming</text>"), std::string::npos);
  EXPECT_NE(svg.find(">zipage</text>"), std::string::npos);
  EXPECT_NE(svg.find("full KV"), std::string::npos);

  const std::vector<nlohmann::json> details = parse_json_lines(read_file(dir_ / "details.jsonl"));
  ASSERT_EQ(details.size(), 5u * 3u);
  int correct_full = 0;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(details[i]["policy"], "full");
    EXPECT_EQ(details[i]["mode"], "stream");
    EXPECT_EQ(details[i]["id"], std::to_string(i));
    EXPECT_TRUE(details[i]["output"].is_string());
    correct_full += details[i]["correct"].get<bool>() ? 1 : 0;
  }
  EXPECT_EQ(correct_full, lines[0]["correct"].get<int>());
}

TEST_F(EvalCli, RetrievalRunsBothModesWithAReferenceEach) {
  const CommandResult r = run_command("eval retrieval " + model() + "--data " + path("docs.jsonl") +
                                      " --mode prefill,stream --kv-policy full,streaming --kv-budget 512 --limit 2 "
                                      "--max-answer-tokens 5 --json --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::vector<nlohmann::json> lines = parse_json_lines(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;
  const char* modes[] = {"prefill", "prefill", "stream", "stream"};
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["mode"], modes[i]);
    EXPECT_EQ(lines[i]["num_documents"], 2);
    EXPECT_EQ(lines[i]["max_answer_tokens"], 5);
    EXPECT_EQ(lines[i]["reference"], i % 2 == 0);
  }
  EXPECT_EQ(lines[1]["accuracy"], lines[0]["accuracy"]);
  EXPECT_EQ(lines[3]["accuracy"], lines[2]["accuracy"]);
}

// Fast KVzip's global threshold runs on per-head pages when served (`--kv-policy fastkvzip`), and
// so in a sweep of its own: on one group every head would hold the request's largest count and
// keep far more than the budget (one group evicts a small fraction of what per-head pages evict at
// the same budget). A sweep that mixes it with a policy of one group stays on one group and says
// that its fastkvzip points exceed their budget.
TEST_F(EvalCli, FastKvzipRunsOnPerHeadPagesAsServedAndAMixedSweepSaysItExceedsItsBudget) {
  const std::string base = "eval retrieval " + model() + "--data " + path("docs.jsonl") +
                           " --mode prefill --kv-gates " + tiny_qwen3_gates() +
                           " --kv-budget 32 --kv-policy-opt window=8 --limit 3 --json --quiet ";
  const CommandResult own = run_command(base + "--kv-policy fastkvzip");
  const CommandResult one_group = run_command(base + "--kv-policy fastkvzip --heads-per-group 4");
  ASSERT_EQ(own.exit_code, 0) << own.out;
  ASSERT_EQ(one_group.exit_code, 0) << one_group.out;
  const std::vector<nlohmann::json> a = parse_json_lines(own.out), b = parse_json_lines(one_group.out);
  ASSERT_EQ(a.size(), 2u) << own.out;
  ASSERT_EQ(b.size(), 2u) << one_group.out;
  EXPECT_EQ(a[1]["policy"], "fastkvzip");
  EXPECT_EQ(a[0]["heads_per_group"], 1);
  EXPECT_EQ(a[1]["heads_per_group"], 1);
  EXPECT_EQ(b[1]["heads_per_group"], 4);
  EXPECT_GT(a[1]["evicted_tokens"].get<int64_t>(), 4 * b[1]["evicted_tokens"].get<int64_t>()) << own.out << one_group.out;

  const CommandResult mixed = run_command(base + "--kv-policy fastkvzip,keydiff", /*with_stderr=*/true);
  ASSERT_EQ(mixed.exit_code, 0) << mixed.out;
  EXPECT_NE(mixed.out.find("its KV exceeds its budget"), std::string::npos) << mixed.out;
  EXPECT_NE(mixed.out.find("\"heads_per_group\":0"), std::string::npos) << mixed.out;
}

TEST_F(EvalCli, ContextModeMatchesPrefillWithFullKvAndPolicyThatNeverActsIsNotApplicable) {
  const CommandResult r = run_command("eval retrieval " + model() + "--data " + path("docs.jsonl") +
                                      " --mode prefill,context,stream --kv-policy full,snapkv --kv-budget 64 --json "
                                      "--quiet --details " + path("ctx_details.jsonl") + " --plot " + path("ctx.svg"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::vector<nlohmann::json> lines = parse_json_lines(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;
  const char* modes[] = {"prefill", "prefill", "context", "context", "stream", "stream"};
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["mode"], modes[i]) << lines[i];
    EXPECT_EQ(lines[i]["failed"], 0) << lines[i];
  }
  // The question path is right: with full KV, context mode feeds the same tokens as prefill mode
  // and answers every document the same way.
  EXPECT_EQ(lines[2]["accuracy"], lines[0]["accuracy"]);
  EXPECT_EQ(lines[2]["correct"], lines[0]["correct"]);
  EXPECT_GE(lines[2]["correct"].get<int>(), 2) << lines[2];
  const std::vector<nlohmann::json> details = parse_json_lines(read_file(dir_ / "ctx_details.jsonl"));
  ASSERT_EQ(details.size(), 6u * 3u);
  for (size_t d = 0; d < 3; ++d) {
    ASSERT_EQ(details[d]["mode"], "prefill");
    ASSERT_EQ(details[6 + d]["mode"], "context");
    EXPECT_EQ(details[6 + d]["output"], details[d]["output"]) << d;
  }
  // SnapKV compresses the document in prefill and context mode (the documents exceed 64
  // tokens), never in stream mode: n/a there, not full KV's score.
  for (size_t i : {1u, 3u}) {
    EXPECT_EQ(lines[i]["applies"], true) << lines[i];
    EXPECT_GT(lines[i]["num_compressions"].get<int>(), 0) << lines[i];
    EXPECT_TRUE(lines[i]["accuracy"].is_number()) << lines[i];
  }
  EXPECT_EQ(lines[5]["applies"], false) << lines[5];
  EXPECT_EQ(lines[5]["num_compressions"], 0);
  EXPECT_GT(lines[5]["max_document_tokens"].get<int>(), 64);
  EXPECT_TRUE(lines[5]["accuracy"].is_null()) << lines[5];
  EXPECT_TRUE(lines[5]["accuracy_ratio"].is_null()) << lines[5];
  EXPECT_TRUE(lines[5]["not_applied"].is_string());
  const std::string svg = read_file(dir_ / "ctx.svg");
  EXPECT_NE(svg.find(">snapkv (context)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">snapkv (stream) (n/a)</text>"), std::string::npos);
  EXPECT_NE(svg.find("full KV, context"), std::string::npos);
}

TEST_F(EvalCli, PerplexityUnderABudgetLargerThanEveryWindowEqualsFullKv) {
  const CommandResult r = run_command("eval ppl " + model() + "--text " + path("text.txt") +
                                      " --context 64 --limit 2 --kv-policy full,streaming --kv-budget 32,512 --json --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::vector<nlohmann::json> lines = parse_json_lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  for (const nlohmann::json& j : lines) {
    EXPECT_EQ(j["task"], "ppl");
    EXPECT_EQ(j["mode"], "stream");
    EXPECT_EQ(j["context"], 64);
    EXPECT_EQ(j["num_documents"], 2);  // windows
    EXPECT_EQ(j["num_tokens"], 2 * 63);
    EXPECT_EQ(j["failed"], 0) << j;
    ASSERT_TRUE(j["ppl"].is_number()) << j;
    EXPECT_GT(j["ppl"].get<double>(), 1.0);
    EXPECT_EQ(j["ppl_full"], lines[0]["ppl"]);
  }
  EXPECT_EQ(lines[1]["budget"], 32);
  EXPECT_GT(lines[1]["num_compressions"].get<int>(), 0);
  EXPECT_EQ(lines[2]["budget"], 512);
  EXPECT_EQ(lines[2]["num_compressions"], 0);
  // Bit-identical computation: the same log-probabilities, so the very same double.
  EXPECT_EQ(lines[2]["ppl"].get<double>(), lines[0]["ppl"].get<double>());
  EXPECT_EQ(lines[2]["ppl_ratio"].get<double>(), 1.0);
}

TEST_F(EvalCli, PrintsATableByDefault) {
  const CommandResult r = run_command("eval ppl " + model() + "--text " + path("text.txt") + " --context 32 --limit 1 --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("policy"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ppl"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nfull "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('{'), std::string::npos) << r.out;
}

TEST_F(EvalCli, ASweepSkipsThePointsAPolicyRefusesAndRunsTheRest) {
  // pagedeviction needs 2 blocks (32 tokens at block 16): its point at 16 is skipped, not fatal.
  const CommandResult r = run_command("eval retrieval " + model() + "--data " + path("docs.jsonl") +
                                          " --kv-policy pagedeviction,streaming --kv-budget 16,64",
                                      /*with_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("skipped pagedeviction@16"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("skipped streaming"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pagedeviction"), std::string::npos) << r.out;
}

TEST_F(EvalCli, BadInputIsAnErrorThatNamesTheProblem) {
  {
    std::ofstream bad(dir_ / "bad.jsonl");
    bad << R"({"id": 1, "prompt": "The secret number of the red fox is", "answer": "1234"})" << "\n";
    bad << "this is not json\n";
  }
  {
    std::ofstream no_question(dir_ / "no_question.jsonl");
    no_question << R"({"id": "q1", "prompt": "The secret number of the red fox is", "answer": "1234"})" << "\n";
  }
  const std::string retrieval = "eval retrieval " + model() + "--quiet ";
  const std::string docs = "--data " + path("docs.jsonl") + " ";
  const struct {
    std::string args;
    std::string message;
  } cases[] = {
      {retrieval + "--data " + path("missing.jsonl"), "missing.jsonl"},
      {retrieval + "--data " + path("bad.jsonl"), "bad.jsonl:2: not valid JSON at byte"},
      {retrieval + docs + "--kv-policy full,no-such-policy", "unknown policy 'no-such-policy'"},
      {retrieval + docs + "--kv-policy streaming --kv-budget 64,abc", "'abc'"},
      {retrieval + docs + "--kv-policy streaming --kv-budget 64,,128", "--kv-budget"},
      {retrieval + docs + "--mode sideways", "'sideways'"},
      {retrieval + "--data " + path("no_question.jsonl") + " --mode prefill,context", "document q1"},
      {retrieval + docs + "--kv-policy streaming --kv-policy-opt window=4", "'window'"},
      // The only point's budget is refused by its policy at this block size.
      {retrieval + docs + "--kv-policy pagedeviction --kv-budget 16", "at least 2 blocks"},
      {retrieval + docs + "--plot " + path("plot.png"), "SVG"},
      {retrieval, "--data"},
      {"eval ppl " + model() + "--quiet --text " + path("missing.txt"), "missing.txt"},
      {"eval ppl " + model() + "--quiet --text " + path("text.txt") + " --context 100000", "--context"},
  };
  for (const auto& c : cases) {
    const CommandResult r = run_command(c.args, /*with_stderr=*/true);
    EXPECT_NE(r.exit_code, 0) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find("origami: error:"), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
  }
  // An unknown policy's error lists the known ones.
  const CommandResult r = run_command(retrieval + docs + "--kv-policy no-such-policy", true);
  EXPECT_NE(r.out.find("zipage"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("streaming"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace origami::testing
