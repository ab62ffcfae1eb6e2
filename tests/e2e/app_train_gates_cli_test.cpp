// `origami train-gates` run as a user would run it, on stories260k (the smallest model) with a
// text made here: it writes gates that load back for the model and fail to load for another, it
// reports its training and held-out numbers, and bad input is a usage error (exit 2) naming the
// problem, without writing the output.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli_test_util.h"
#include "engine_test_util.h"
#include "gates/gate_weights.h"

namespace origami::testing {
namespace {

namespace fs = std::filesystem;

class TrainGatesCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("origami_train_gates_cli_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    // Four documents separated as in train_corpus.txt: 0 and 2 train, 1 and 3 are held out.
    const char* docs[] = {"Once upon a time a little fox lived by the river and counted the fish. ",
                          "A small bird sang in the tall tree every morning before the sun came up. ",
                          "The children ran to the park to play with a red ball and a big dog. ",
                          "Tim and his mom baked a cake, and they shared it with all their friends. "};
    std::ofstream out(dir_ / "docs.txt", std::ios::binary);
    for (int d = 0; d < 4; ++d) {
      if (d > 0) out << std::string("\n\0\n", 3);
      for (int i = 0; i < 6; ++i) out << docs[d];
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string base() {
    return "train-gates --model " + stories_dir() + " --threads 2 --quiet --data " + (dir_ / "docs.txt").string() +
           " --max-tokens 64 --min-tokens 32 --document-stride 2 ";
  }
  static fs::path dir_;
};
fs::path TrainGatesCli::dir_;

TEST_F(TrainGatesCli, WritesGatesThatLoadBackForTheModelOnly) {
  const fs::path out = dir_ / "gates.safetensors";
  CommandResult r = run_command(base() + "--samples 2 --heldout-samples 2 --epochs 2 --batch 32 --output " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("trained gates for llama (5 layers x 4 KV heads, G 2, D' 16, 16 sinks) on 128 tokens from 2 "
                       "samples"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("held-out: 2 samples, 128 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("trained      spearman"), std::string::npos) << r.out;
  Expected<ModelConfig> config = load_model_config(stories_dir());
  ASSERT_TRUE(config.has_value());
  Expected<gates::GateWeights> g = gates::load_gates(out, *config);
  ASSERT_TRUE(g.has_value()) << g.status().message();
  EXPECT_EQ(g->metadata.at("training_tokens"), "128");
  EXPECT_EQ(g->metadata.at("epochs"), "2");
  EXPECT_TRUE(g->metadata.count("heldout_spearman"));
  Expected<ModelConfig> other = load_model_config(tiny_qwen3_dir());
  ASSERT_TRUE(other.has_value());
  EXPECT_FALSE(gates::load_gates(out, *other).has_value());
}

TEST_F(TrainGatesCli, BadInputIsAUsageError) {
  const fs::path out = dir_ / "bad.safetensors";
  CommandResult r = run_command("train-gates --model " + stories_dir() + " --data " + (dir_ / "docs.txt").string() +
                                    " --document-stride 1 --heldout-samples 1 --output " + out.string(),
                                true);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--document-stride >= 2"), std::string::npos) << r.out;
  r = run_command("train-gates --model " + stories_dir() + " --data " + (dir_ / "missing.txt").string() +
                  " --output " + out.string(), true);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("missing.txt"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace origami::testing
