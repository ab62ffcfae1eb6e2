// Reproduces the tokenizer goldens (made with HF tokenizers) for all three shared tokenizers:
// ids, decoded text, and streaming decode equal to the full decode.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace origami {
namespace {

const std::filesystem::path kShared = ORIGAMI_SHARED_DIR;

struct Case {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;
};

class TokenizerGoldenTest : public ::testing::Test {
 protected:
  // Loaded on first use and kept for the process: ctest runs each test in its own process, so
  // a test loads only the tokenizers it needs.
  static std::shared_ptr<Tokenizer> tok(const std::string& name) {
    if (auto it = tokenizers_.find(name); it != tokenizers_.end()) return it->second;
    const std::map<std::string, std::filesystem::path> dirs = {
        {"qwen3", kShared / "tokenizers/qwen3"},
        {"origami-tiny-qwen3", kShared / "models/origami-tiny-qwen3"},
        {"stories260k", kShared / "models/stories260k"},
    };
    const auto start = std::chrono::steady_clock::now();
    auto loaded = Tokenizer::load(dirs.at(name));
    EXPECT_TRUE(loaded.has_value()) << loaded.status().to_string();
    if (!loaded.has_value()) return nullptr;
    load_seconds_[name] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return tokenizers_[name] = *loaded;
  }
  static const std::vector<Case>& cases(const std::string& name) {
    if (cases_.empty()) {
      std::ifstream in(kShared / "golden/tokenizer_golden.json");
      EXPECT_TRUE(in) << "missing golden file";
      const auto golden = nlohmann::json::parse(in);
      for (const auto& [key, list] : golden.items()) {
        for (const auto& c : list) {
          cases_[key].push_back({c.at("text"), c.at("ids").get<std::vector<int32_t>>(), c.at("decoded")});
        }
      }
    }
    return cases_[name];
  }

  static void check_encode(const std::string& name) {
    ASSERT_TRUE(tok(name));
    const Tokenizer& t = *tok(name);
    ASSERT_EQ(cases(name).size(), 30u);
    for (const Case& c : cases(name)) {
      // The goldens hold the model's tokens only, without BOS/EOS.
      EXPECT_EQ(t.encode(c.text, /*add_special_tokens=*/false), c.ids) << name << ": " << c.text;
    }
  }
  static void check_decode(const std::string& name) {
    ASSERT_TRUE(tok(name));
    for (const Case& c : cases(name)) EXPECT_EQ(tok(name)->decode(c.ids), c.decoded) << name << ": " << c.text;
  }
  static void check_streaming(const std::string& name) {
    auto t = tok(name);
    ASSERT_TRUE(t);
    for (const Case& c : cases(name)) {
      for (bool skip : {false, true}) {
        StreamingDecoder stream(t, skip);
        std::string text;
        for (int32_t id : c.ids) {
          const std::string delta = stream.push(id);
          EXPECT_TRUE(unicode::is_valid_utf8(delta)) << name << ": a delta cuts a character";
          text += delta;
        }
        text += stream.flush();
        EXPECT_EQ(text, t->decode(c.ids, skip)) << name << ": " << c.text;
      }
    }
  }

  static inline std::map<std::string, std::shared_ptr<Tokenizer>> tokenizers_;
  static inline std::map<std::string, std::vector<Case>> cases_;
  static inline std::map<std::string, double> load_seconds_;
};

TEST_F(TokenizerGoldenTest, Qwen3Encode) { check_encode("qwen3"); }
TEST_F(TokenizerGoldenTest, TinyQwen3Encode) { check_encode("origami-tiny-qwen3"); }
TEST_F(TokenizerGoldenTest, Stories260kEncode) { check_encode("stories260k"); }
TEST_F(TokenizerGoldenTest, Qwen3Decode) { check_decode("qwen3"); }
TEST_F(TokenizerGoldenTest, TinyQwen3Decode) { check_decode("origami-tiny-qwen3"); }
TEST_F(TokenizerGoldenTest, Stories260kDecode) { check_decode("stories260k"); }
TEST_F(TokenizerGoldenTest, Qwen3Streaming) { check_streaming("qwen3"); }
TEST_F(TokenizerGoldenTest, TinyQwen3Streaming) { check_streaming("origami-tiny-qwen3"); }
TEST_F(TokenizerGoldenTest, Stories260kStreaming) { check_streaming("stories260k"); }

// Load time is measured by bench/tokenizer_bench.cpp (docs/benchmarks.md), not asserted here:
// a wall-clock bound fails on a loaded or sanitized build without anything being wrong.
TEST_F(TokenizerGoldenTest, Qwen3LoadsTheWholeVocabulary) {
  ASSERT_TRUE(tok("qwen3"));
  EXPECT_EQ(tok("qwen3")->vocab_size(), 151643 + 26);  // BPE vocabulary + added tokens
  std::printf("qwen3 tokenizer load: %.3f s\n", load_seconds_.at("qwen3"));
}

// The model goldens' prompts were encoded with special tokens: BOS for stories260k
// (tokenizer_config add_bos_token), nothing for the Qwen-style tokenizer.
TEST_F(TokenizerGoldenTest, ModelGoldenPromptsMatch) {
  for (const auto& [name, file] : std::map<std::string, std::string>{
           {"stories260k", "golden/stories260k_golden.json"},
           {"origami-tiny-qwen3", "golden/origami-tiny-qwen3_golden.json"}}) {
    std::ifstream in(kShared / file);
    const auto golden = nlohmann::json::parse(in);
    ASSERT_FALSE(golden.at("greedy").empty());
    for (const auto& g : golden.at("greedy")) {
      EXPECT_EQ(tok(name)->encode(g.at("prompt").get<std::string>()),
                g.at("prompt_ids").get<std::vector<int32_t>>())
          << name << ": " << g.at("prompt");
    }
  }
  std::ifstream in(kShared / "golden/stories260k_conversion_check.json");
  const auto check = nlohmann::json::parse(in);
  for (const auto& c : check.at("tokenizer")) {
    EXPECT_EQ(tok("stories260k")->encode(c.at("text").get<std::string>(), false),
              c.at("ids").get<std::vector<int32_t>>());
  }
}

TEST_F(TokenizerGoldenTest, SpecialTokensAndConfig) {
  const Tokenizer& qwen = *tok("qwen3");
  EXPECT_EQ(qwen.vocab_size(), 151669);
  EXPECT_FALSE(qwen.bos_token_id().has_value());
  EXPECT_EQ(qwen.eos_token_id(), 151645);
  EXPECT_EQ(qwen.eos_token(), "<|im_end|>");
  EXPECT_EQ(qwen.special_tokens().at("pad_token"), "<|endoftext|>");
  EXPECT_NE(qwen.chat_template().find("<|im_start|>"), std::string::npos);
  EXPECT_TRUE(qwen.is_special(151644));
  EXPECT_FALSE(qwen.is_special(151667));  // <think> is added but not special
  EXPECT_FALSE(qwen.is_special(9707));
  EXPECT_EQ(qwen.token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(qwen.token_to_id("\xC4\xA0world"), 1879);  // "Ġworld"
  EXPECT_EQ(qwen.id_to_token(1879), "\xC4\xA0world");
  EXPECT_EQ(qwen.id_to_token(-1), "");
  EXPECT_FALSE(qwen.token_to_id("no such token").has_value());
  const std::vector<int32_t> ids = qwen.encode("<|im_start|>user\nhi<|im_end|>\n<think>");
  EXPECT_EQ(qwen.decode(ids, /*skip_special_tokens=*/true), "user\nhi\n<think>");

  const Tokenizer& stories = *tok("stories260k");
  EXPECT_EQ(stories.vocab_size(), 512);
  EXPECT_EQ(stories.bos_token_id(), 1);
  EXPECT_EQ(stories.eos_token_id(), 2);
  EXPECT_EQ(stories.bos_token(), "<s>");
  EXPECT_EQ(stories.chat_template(), "");
  EXPECT_EQ(stories.decode({1, 403, 407, 261, 378, 2}, true), "Once upon a time");
  EXPECT_EQ(stories.decode({1, 403, 407, 261, 378, 2}, false), "<s> Once upon a time</s>");

  const Tokenizer& tiny = *tok("origami-tiny-qwen3");
  EXPECT_EQ(tiny.eos_token_id(), 0);
  EXPECT_FALSE(tiny.chat_template().empty());
}

// Streaming holds back an unfinished character and emits it whole.
TEST_F(TokenizerGoldenTest, StreamingNeverSplitsCharacters) {
  for (const auto& [name, text] : std::map<std::string, std::string>{
           {"origami-tiny-qwen3", "\xF0\x9F\x99\x82 \xE6\x97\xA5\xE6\x9C\xAC"},
           {"stories260k", "\xF0\x9F\x99\x82 \xE6\x97\xA5\xE6\x9C\xAC"},
           {"qwen3", "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 ok"}}) {
    auto t = tok(name);
    ASSERT_TRUE(t);
    const std::vector<int32_t> ids = t->encode(text, false);
    ASSERT_GT(ids.size(), 3u) << name;
    StreamingDecoder stream(t);
    std::string out;
    int empty_deltas = 0;
    for (int32_t id : ids) {
      const std::string delta = stream.push(id);
      EXPECT_TRUE(unicode::is_valid_utf8(delta)) << name;
      empty_deltas += delta.empty();
      out += delta;
    }
    out += stream.flush();
    EXPECT_GT(empty_deltas, 0) << name << ": expected a multi-token character";
    EXPECT_EQ(out, t->decode(ids, true)) << name;
  }
  // A truncated character at the end comes out as U+FFFD on flush, as in decode().
  auto tiny = tok("origami-tiny-qwen3");
  std::vector<int32_t> ids = tiny->encode("\xF0\x9F\x99\x82", false);
  ids.pop_back();
  StreamingDecoder stream(tiny);
  std::string out;
  for (int32_t id : ids) out += stream.push(id);
  EXPECT_EQ(out, "");
  out += stream.flush();
  EXPECT_EQ(out, "\xEF\xBF\xBD");
  EXPECT_EQ(tiny->decode(ids), out);
}

}  // namespace
}  // namespace origami
