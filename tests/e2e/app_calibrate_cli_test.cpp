// `origami calibrate` run as a user would run it, on origami-tiny-qwen3 with a text made here:
// it writes a head budget file that loads back for the model, prints the per-layer summary and
// the clustered-vs-adjacent memory, and bad input is a usage error (exit 2) naming the problem,
// found before the model is loaded and without writing the output.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli_test_util.h"
#include "engine/head_budget_loader.h"
#include "engine_test_util.h"

namespace origami::testing {
namespace {

namespace fs = std::filesystem;

class CalibrateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("origami_calibrate_cli_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    // Three documents separated as in train_corpus.txt, each well over 64 tokens.
    const char* docs[] = {
        "The harbour master counted the boats each morning and wrote their names in a long grey book. ",
        "Seven students walked to the old observatory, where the telescope pointed at the northern sky. ",
        "In the winter market the bakers sold bread shaped like stars, and the children traded buttons. "};
    std::ofstream out(dir_ / "docs.txt", std::ios::binary);
    for (int d = 0; d < 3; ++d) {
      if (d > 0) out << std::string("\n\0\n", 3);
      for (int i = 0; i < 8; ++i) out << docs[d];
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string base() {
    return "calibrate --model " + tiny_qwen3_dir() + " --threads 2 --quiet ";
  }
  static fs::path dir_;
};
fs::path CalibrateCli::dir_;

TEST_F(CalibrateCli, WritesABudgetFileThatLoadsBack) {
  const fs::path out = dir_ / "budgets.json";
  CommandResult r = run_command(base() + "--max-tokens 128 --min-tokens 64 --data " + (dir_ / "docs.txt").string() +
                                " --scorer snapkv --samples 3 --alpha 2 --rho 0.5 --output " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("on 3 samples with snapkv, rho 0.5, alpha 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer  min    mean   max"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("H_p = 2: clustered "), std::string::npos) << r.out;
  Expected<ModelConfig> config = load_model_config(tiny_qwen3_dir());
  ASSERT_TRUE(config.has_value());
  Expected<HeadBudgets> b = load_head_budgets_for_model(out.string(), *config);
  ASSERT_TRUE(b.has_value()) << b.status().message();
  EXPECT_EQ(b->samples, 3);
  EXPECT_EQ(b->scorer, "snapkv");
  EXPECT_EQ(b->rho, 0.5);
  for (int n : b->sample_tokens) {
    EXPECT_GE(n, 64);
    EXPECT_LE(n, 128);
  }
  for (const auto& row : b->ratios)
    for (double r : row) {
      EXPECT_GT(r, 0.0);
      EXPECT_LE(r, 1.0);
    }
}

TEST_F(CalibrateCli, BadInputIsAUsageError) {
  const std::string data = " --data " + (dir_ / "docs.txt").string();
  const std::string out = " --output " + (dir_ / "never.json").string();
  const struct {
    std::string args;
    const char* expected;
  } cases[] = {
      {base() + out, "--data is required"},
      {base() + data, "--output is required"},
      {base() + data + out + " --scorer h2o", "--scorer"},
      {base() + data + out + " --rho 1.5", "--rho"},
      {base() + data + out + " --rho 0", "--rho"},
      {base() + data + out + " --samples 0", "--samples"},
      {base() + data + out + " --alpha -1", "--alpha"},
      {base() + data + out + " --device cuda", "calibration scores the fp32 cache of the CPU backend"},
      {base() + data + out + " --min-tokens 500 --max-tokens 128", "--min-tokens 500 is above --max-tokens 128"},
      {base() + " --data " + (dir_ / "missing.txt").string() + out, "missing.txt"},
      {base() + data + " --output " + (dir_ / "no-such-dir" / "b.json").string(), "--output"},
      {base() + data + out + " --min-tokens 500 --max-tokens 600", "no document of at least 500 tokens"},
  };
  for (const auto& c : cases) {
    CommandResult r = run_command(c.args, /*with_stderr=*/true);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expected), std::string::npos) << c.args << "\n" << r.out;
  }
  EXPECT_FALSE(fs::exists(dir_ / "never.json"));
}

}  // namespace
}  // namespace origami::testing
