// Head budget files (kv/head_budgets.h): a JSON round trip keeps every value, every malformed
// file is an error naming its field, a file for another model is refused naming what differs,
// and the per-head token budgets (ceil(B * N), and scaled to an average) keep their promises.
#include "kv/head_budgets.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>

#include <nlohmann/json.hpp>

namespace origami {
namespace {

HeadBudgets sample_budgets() {
  HeadBudgets b;
  b.model = {"qwen3", 2, 4, 8, 64, 512, 8192};
  b.scorer = "snapkv";
  b.alpha = 2.0;
  b.rho = 0.25;
  b.samples = 3;
  b.sample_tokens = {512, 480, 512};
  b.ratios = {{0.1, 0.25, 0.5, 1.0}, {0.3, 0.123456789012345, 0.7, 0.05}};
  b.mean = {{0.08, 0.2, 0.45, 0.9}, {0.25, 0.1, 0.6, 0.04}};
  b.stddev = {{0.01, 0.025, 0.025, 0.1}, {0.025, 0.0117, 0.05, 0.005}};
  return b;
}

std::string valid_text() { return head_budgets_to_json(sample_budgets()); }

// Parses `text` after `edit` changed its JSON; the error message.
std::string error_after(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(valid_text());
  edit(j);
  Expected<HeadBudgets> b = parse_head_budgets(j.dump(), "budgets.json");
  EXPECT_FALSE(b.has_value()) << j.dump();
  return b ? std::string() : b.status().message();
}

TEST(HeadBudgets, JsonRoundTripKeepsEveryValue) {
  const HeadBudgets b = sample_budgets();
  ASSERT_TRUE(validate_head_budgets(b).is_ok()) << validate_head_budgets(b).message();
  Expected<HeadBudgets> back = parse_head_budgets(head_budgets_to_json(b), "mem");
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(back->version, kHeadBudgetsVersion);
  EXPECT_EQ(back->model.model_type, "qwen3");
  EXPECT_EQ(back->model.num_layers, 2);
  EXPECT_EQ(back->model.num_kv_heads, 4);
  EXPECT_EQ(back->model.num_attention_heads, 8);
  EXPECT_EQ(back->model.head_dim, 64);
  EXPECT_EQ(back->model.hidden_size, 512);
  EXPECT_EQ(back->model.vocab_size, 8192);
  EXPECT_EQ(back->scorer, "snapkv");
  EXPECT_EQ(back->alpha, 2.0);
  EXPECT_EQ(back->rho, 0.25);
  EXPECT_EQ(back->samples, 3);
  EXPECT_EQ(back->sample_tokens, b.sample_tokens);
  // Doubles are written with round-trip precision: bit-exact.
  EXPECT_EQ(back->ratios, b.ratios);
  EXPECT_EQ(back->mean, b.mean);
  EXPECT_EQ(back->stddev, b.stddev);
  EXPECT_EQ(head_budgets_to_json(*back), head_budgets_to_json(b));
}

TEST(HeadBudgets, SaveAndLoadThroughAFileCheckingTheModel) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("origami_budgets_" + std::to_string(getpid()) + ".json")).string();
  const HeadBudgets b = sample_budgets();
  ASSERT_TRUE(save_head_budgets(b, path).is_ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  Expected<HeadBudgets> plain = load_head_budgets(path);
  ASSERT_TRUE(plain.has_value()) << plain.status().message();
  EXPECT_EQ(plain->ratios, b.ratios);
  ModelIdentity same = b.model;
  Expected<HeadBudgets> checked = load_head_budgets(path, &same);
  ASSERT_TRUE(checked.has_value()) << checked.status().message();

  ModelIdentity other = b.model;
  other.num_layers = 36;
  Expected<HeadBudgets> wrong = load_head_budgets(path, &other);
  ASSERT_FALSE(wrong.has_value());
  EXPECT_NE(wrong.status().message().find(path), std::string::npos);
  EXPECT_NE(wrong.status().message().find("model.num_layers is 2 but the model's is 36"), std::string::npos)
      << wrong.status().message();
  std::filesystem::remove(path);

  Expected<HeadBudgets> missing = load_head_budgets(path);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
}

TEST(HeadBudgets, EveryModelFieldIsChecked) {
  const HeadBudgets b = sample_budgets();
  const std::pair<const char*, std::function<void(ModelIdentity&)>> cases[] = {
      {"model.model_type is not the model's 'llama'", [](ModelIdentity& m) { m.model_type = "llama"; }},
      {"model.num_layers", [](ModelIdentity& m) { m.num_layers = 3; }},
      {"model.num_kv_heads is 4 but the model's is 8", [](ModelIdentity& m) { m.num_kv_heads = 8; }},
      {"model.num_attention_heads", [](ModelIdentity& m) { m.num_attention_heads = 16; }},
      {"model.head_dim", [](ModelIdentity& m) { m.head_dim = 128; }},
      {"model.hidden_size", [](ModelIdentity& m) { m.hidden_size = 1024; }},
      {"model.vocab_size", [](ModelIdentity& m) { m.vocab_size = 151936; }},
  };
  EXPECT_TRUE(check_head_budgets_model(b, b.model).is_ok());
  for (const auto& [expected, edit] : cases) {
    ModelIdentity m = b.model;
    edit(m);
    Status st = check_head_budgets_model(b, m);
    ASSERT_FALSE(st.is_ok()) << expected;
    EXPECT_NE(st.message().find(expected), std::string::npos) << st.message();
  }
}

TEST(HeadBudgets, MalformedFilesAreErrorsNamingTheField) {
  struct Case {
    const char* expected;
    std::function<void(nlohmann::json&)> edit;
  };
  const Case cases[] = {
      {"missing field 'format'", [](nlohmann::json& j) { j.erase("format"); }},
      {"field 'format' is not 'origami-head-budgets'", [](nlohmann::json& j) { j["format"] = "other"; }},
      {"missing field 'version'", [](nlohmann::json& j) { j.erase("version"); }},
      {"version 2 is not supported", [](nlohmann::json& j) { j["version"] = 2; }},
      {"field 'version' must be an integer", [](nlohmann::json& j) { j["version"] = "1"; }},
      {"missing field 'model'", [](nlohmann::json& j) { j.erase("model"); }},
      {"field 'model' must be an object", [](nlohmann::json& j) { j["model"] = 3; }},
      {"missing field 'model.num_layers'", [](nlohmann::json& j) { j["model"].erase("num_layers"); }},
      {"missing field 'model.num_kv_heads'", [](nlohmann::json& j) { j["model"].erase("num_kv_heads"); }},
      {"missing field 'model.head_dim'", [](nlohmann::json& j) { j["model"].erase("head_dim"); }},
      {"missing field 'model.model_type'", [](nlohmann::json& j) { j["model"].erase("model_type"); }},
      {"missing field 'model.hidden_size'", [](nlohmann::json& j) { j["model"].erase("hidden_size"); }},
      {"missing field 'model.vocab_size'", [](nlohmann::json& j) { j["model"].erase("vocab_size"); }},
      {"field 'model.num_layers' must be an integer", [](nlohmann::json& j) { j["model"]["num_layers"] = 2.5; }},
      {"model.num_kv_heads = 0 must be >= 1", [](nlohmann::json& j) { j["model"]["num_kv_heads"] = 0; }},
      {"missing field 'calibration'", [](nlohmann::json& j) { j.erase("calibration"); }},
      {"missing field 'calibration.scorer'", [](nlohmann::json& j) { j["calibration"].erase("scorer"); }},
      {"missing field 'calibration.alpha'", [](nlohmann::json& j) { j["calibration"].erase("alpha"); }},
      {"missing field 'calibration.rho'", [](nlohmann::json& j) { j["calibration"].erase("rho"); }},
      {"missing field 'calibration.samples'", [](nlohmann::json& j) { j["calibration"].erase("samples"); }},
      {"missing field 'calibration.sample_tokens'", [](nlohmann::json& j) { j["calibration"].erase("sample_tokens"); }},
      {"calibration.rho = 1.5 is not in (0, 1]", [](nlohmann::json& j) { j["calibration"]["rho"] = 1.5; }},
      {"calibration.rho = 0 is not in (0, 1]", [](nlohmann::json& j) { j["calibration"]["rho"] = 0; }},
      {"calibration.alpha = -1", [](nlohmann::json& j) { j["calibration"]["alpha"] = -1; }},
      {"calibration.samples = 0 must be >= 1", [](nlohmann::json& j) { j["calibration"]["samples"] = 0; }},
      {"calibration.sample_tokens has 2 entries, expected calibration.samples = 3",
       [](nlohmann::json& j) { j["calibration"]["sample_tokens"] = {5, 6}; }},
      {"missing field 'ratios'", [](nlohmann::json& j) { j.erase("ratios"); }},
      {"missing field 'mean'", [](nlohmann::json& j) { j.erase("mean"); }},
      {"missing field 'std'", [](nlohmann::json& j) { j.erase("std"); }},
      {"ratios has 1 layers, expected 2 (model.num_layers)", [](nlohmann::json& j) { j["ratios"].erase(1); }},
      {"ratios has 3 layers, expected 2", [](nlohmann::json& j) { j["ratios"].push_back(j["ratios"][0]); }},
      {"ratios[1] has 3 heads, expected 4 (model.num_kv_heads)", [](nlohmann::json& j) { j["ratios"][1].erase(0); }},
      {"mean[0] has 5 heads, expected 4", [](nlohmann::json& j) { j["mean"][0].push_back(0.1); }},
      {"ratios[1][2] = 1.5 is not in (0, 1]", [](nlohmann::json& j) { j["ratios"][1][2] = 1.5; }},
      {"ratios[0][0] = 0 is not in (0, 1]", [](nlohmann::json& j) { j["ratios"][0][0] = 0.0; }},
      {"ratios[0][3] = -0.2 is not in (0, 1]", [](nlohmann::json& j) { j["ratios"][0][3] = -0.2; }},
      {"ratios[1][1] = nan is not in (0, 1]", [](nlohmann::json& j) { j["ratios"][1][1] = nullptr; }},
      {"field 'ratios[0][1]' must be a number", [](nlohmann::json& j) { j["ratios"][0][1] = "0.5"; }},
      {"field 'ratios[0]' must be a list", [](nlohmann::json& j) { j["ratios"][0] = 0.5; }},
      {"field 'ratios' must be a list", [](nlohmann::json& j) { j["ratios"] = 0.5; }},
      {"std[1][0] = -0.1 is not in [0, inf)", [](nlohmann::json& j) { j["std"][1][0] = -0.1; }},
      {"mean[0][2] = 1.2 is not in [0, 1]", [](nlohmann::json& j) { j["mean"][0][2] = 1.2; }},
  };
  for (const Case& c : cases) {
    const std::string message = error_after(c.edit);
    EXPECT_NE(message.find(c.expected), std::string::npos) << "expected '" << c.expected << "' in: " << message;
    EXPECT_EQ(message.rfind("budgets.json: ", 0), 0u) << message;
  }
}

TEST(HeadBudgets, MalformedJsonAndNonObjects) {
  for (const char* text : {"", "{", "{\"format\": }", "[1, 2]", "42", "{\"format\": \"origami-head-budgets\",}"}) {
    Expected<HeadBudgets> b = parse_head_budgets(text, "f.json");
    ASSERT_FALSE(b.has_value()) << text;
    EXPECT_EQ(b.status().message().rfind("f.json: ", 0), 0u) << b.status().message();
    const std::string& m = b.status().message();
    EXPECT_TRUE(m.find("malformed JSON") != std::string::npos || m.find("expected a JSON object") != std::string::npos)
        << m;
  }
}

// Errors never quote what the file holds (a file that is not a budget file may hold secrets):
// neither a wrong format string, nor a model type, nor the bytes a JSON parse error stopped at.
TEST(HeadBudgets, ErrorsNeverQuoteTheFilesStrings) {
  const std::string secret = "sk-live-0123456789";
  const std::string message = error_after([&](nlohmann::json& j) { j["format"] = secret; });
  EXPECT_EQ(message.find(secret), std::string::npos) << message;
  HeadBudgets other = sample_budgets();
  other.model.model_type = secret;
  const Status st = check_head_budgets_model(other, sample_budgets().model);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.message().find(secret), std::string::npos) << st.message();
  for (const std::string& text : {"{\"format\": " + secret, secret + " = true", "[\"" + secret + "\", }"}) {
    Expected<HeadBudgets> b = parse_head_budgets(text, "f.json");
    ASSERT_FALSE(b.has_value());
    EXPECT_NE(b.status().message().find("malformed JSON: not valid JSON at byte"), std::string::npos) << b.status().message();
    EXPECT_EQ(b.status().message().find("sk-live"), std::string::npos) << b.status().message();
  }
}

// An inline object (a request's "kv_head_budgets": {...}) is checked exactly as a file is.
TEST(HeadBudgets, InlineObjectsAreParsedAsFiles) {
  const HeadBudgets b = sample_budgets();
  const nlohmann::json j = nlohmann::json::parse(head_budgets_to_json(b));
  Expected<HeadBudgets> parsed = parse_head_budgets_json(j, "kv_head_budgets");
  ASSERT_TRUE(parsed.has_value()) << parsed.status().message();
  EXPECT_EQ(parsed->ratios, b.ratios);
  nlohmann::json bad = j;
  bad["ratios"][0][0] = 2.0;
  Expected<HeadBudgets> refused = parse_head_budgets_json(bad, "kv_head_budgets");
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.status().message().find("kv_head_budgets: ratios[0][0] = 2 is not in (0, 1]"), std::string::npos)
      << refused.status().message();
}

// Loading never blocks on or streams from something that is not a regular file.
TEST(HeadBudgets, LoadRefusesFifosDevicesAndLargeFiles) {
  const std::string fifo = ::testing::TempDir() + "head_budgets_fifo_" + std::to_string(::getpid());
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Expected<HeadBudgets> from_fifo = load_head_budgets(fifo);  // would block forever if opened blocking
  ASSERT_FALSE(from_fifo.has_value());
  EXPECT_NE(from_fifo.status().message().find("is not a regular file"), std::string::npos) << from_fifo.status().message();
  std::filesystem::remove(fifo);
  Expected<HeadBudgets> from_zero = load_head_budgets("/dev/zero");
  ASSERT_FALSE(from_zero.has_value());
  EXPECT_NE(from_zero.status().message().find("is not a regular file"), std::string::npos) << from_zero.status().message();
  const std::string big = ::testing::TempDir() + "head_budgets_big_" + std::to_string(::getpid()) + ".json";
  { std::ofstream(big) << std::string(kMaxHeadBudgetsFileBytes + 1, ' '); }
  Expected<HeadBudgets> from_big = load_head_budgets(big);
  ASSERT_FALSE(from_big.has_value());
  EXPECT_NE(from_big.status().message().find("more than the limit"), std::string::npos) << from_big.status().message();
  std::filesystem::remove(big);
}

TEST(HeadBudgets, ValidateRejectsNaNInMemory) {
  HeadBudgets b = sample_budgets();
  b.ratios[1][3] = std::numeric_limits<double>::quiet_NaN();
  Status st = validate_head_budgets(b);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("ratios[1][3] = nan"), std::string::npos) << st.message();
  EXPECT_FALSE(save_head_budgets(b, "/nonexistent-dir/x.json").is_ok());
}

TEST(HeadBudgets, TokenBudgetIsCeilOfRatioTimesLength) {
  HeadBudgets b = sample_budgets();
  // 0.1 * 10 = 1.0000000000000002 in doubles: still 1 token, not 2.
  EXPECT_EQ(b.head_token_budget(0, 0, 10), 1);
  EXPECT_EQ(b.head_token_budget(0, 0, 11), 2);   // ceil(1.1)
  EXPECT_EQ(b.head_token_budget(0, 1, 100), 25);
  EXPECT_EQ(b.head_token_budget(0, 1, 101), 26);  // ceil(25.25)
  EXPECT_EQ(b.head_token_budget(0, 3, 77), 77);   // ratio 1
  EXPECT_EQ(b.head_token_budget(1, 3, 5), 1);     // ceil(0.25) = 1, never 0
  EXPECT_EQ(b.head_token_budget(1, 3, 0), 0);
  b.ratios[1][0] = 0.3;
  EXPECT_EQ(b.head_token_budget(1, 0, 10), 3);  // 0.3 * 10 = 3.0000000000000004
  const auto all = b.token_budgets(200);
  ASSERT_EQ(all.size(), 2u);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h) {
      EXPECT_EQ(all[l][h], b.head_token_budget(l, h, 200));
      EXPECT_GE(all[l][h], b.ratios[l][h] * 200 - 1e-9);
      EXPECT_LT(all[l][h], b.ratios[l][h] * 200 + 1);
    }
  EXPECT_NEAR(b.mean_ratio(), (0.1 + 0.25 + 0.5 + 1.0 + 0.3 + 0.123456789012345 + 0.7 + 0.05) / 8, 1e-12);
}

TEST(HeadBudgets, ScaledBudgetsHitTheAverageExactly) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.001, 1.0);
  for (int trial = 0; trial < 300; ++trial) {
    HeadBudgets b = sample_budgets();
    const int heads = 1 + static_cast<int>(rng() % 8);
    b.model.num_kv_heads = heads;
    for (auto* m : {&b.ratios, &b.mean, &b.stddev})
      for (auto& row : *m) row.assign(heads, 0.01);
    for (auto& row : b.ratios)
      for (double& r : row) r = (rng() % 5 == 0) ? 1.0 : u(rng);
    const int n = 1 + static_cast<int>(rng() % 3000);
    const int avg = 1 + static_cast<int>(rng() % (n + 50));
    const auto out = b.scaled_token_budgets(avg, n);
    ASSERT_EQ(out.size(), 2u);
    for (int l = 0; l < 2; ++l) {
      int64_t sum = 0;
      for (int h = 0; h < heads; ++h) {
        ASSERT_GE(out[l][h], 1);
        ASSERT_LE(out[l][h], n);
        sum += out[l][h];
      }
      ASSERT_EQ(sum, static_cast<int64_t>(std::min(avg, n)) * heads) << "trial " << trial << " layer " << l;
      // Proportional to B apart from the [1, N] bounds and rounding: a larger ratio never gets
      // fewer tokens, except for one token of rounding between near-equal shares.
      for (int a = 0; a < heads; ++a)
        for (int c = 0; c < heads; ++c)
          if (b.ratios[l][a] > b.ratios[l][c]) {
            ASSERT_GE(out[l][a] + 1, out[l][c]);
          }
    }
  }
  // A worked case: ratios 0.1, 0.2, 0.3, 1.0 at N = 1000, average 250 per head (1000 in all):
  // scale s with min(1000, s * B * 1000) summing to 1000: s = 1000 / 1600 -> 62.5, 125, 187.5,
  // 625 -> 63, 125, 187, 625 (largest remainder: 62.5 and 187.5 tie, the lower index wins).
  HeadBudgets w = sample_budgets();
  w.ratios[0] = {0.1, 0.2, 0.3, 1.0};
  const auto worked = w.scaled_token_budgets(250, 1000);
  EXPECT_EQ(worked[0], (std::vector<int>{63, 125, 187, 625}));
  // A large average caps heads at N and gives the rest to the others.
  const auto capped = w.scaled_token_budgets(700, 1000);
  EXPECT_EQ(capped[0][3], 1000);
  EXPECT_EQ(capped[0][0] + capped[0][1] + capped[0][2] + capped[0][3], 2800);
  // An average of at least N keeps everything.
  const auto everything = w.scaled_token_budgets(5000, 1000);
  for (int t : everything[0]) EXPECT_EQ(t, 1000);
}

}  // namespace
}  // namespace origami
