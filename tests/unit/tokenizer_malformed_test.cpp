// Malformed tokenizer.json / tokenizer_config.json fields found by fuzzing (tests/fuzz): each
// is rejected with an error naming the file and the field, never an exception or a crash, and
// what is accepted only ever encodes to ids inside the vocabulary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace origami {
namespace {

using nlohmann::json;

json tiny_tokenizer() {
  return {
      {"added_tokens", json::array({{{"id", 3}, {"content", "<s>"}, {"special", true}, {"normalized", false}}})},
      {"decoder", {{"type", "Sequence"}, {"decoders", json::array({{{"type", "Fuse"}}})}}},
      {"model",
       {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", json::array({"a b"})}}},
  };
}

Expected<std::shared_ptr<Tokenizer>> load(const json& tokenizer, const json& config = nullptr) {
  const std::string config_text = config.dump();
  return Tokenizer::from_json_text(tokenizer.dump(), "dir/tokenizer.json", config.is_null() ? nullptr : &config_text,
                                   "dir/tokenizer_config.json");
}

void expect_error(const json& tokenizer, const std::string& what, const json& config = nullptr,
                  const std::string& file = "dir/tokenizer.json") {
  Expected<std::shared_ptr<Tokenizer>> t = load(tokenizer, config);
  ASSERT_FALSE(t.has_value()) << what;
  EXPECT_EQ(t.status().code(), ErrorCode::kInvalidFile);
  EXPECT_EQ(t.status().message().rfind(file, 0), 0u) << t.status().message();
  EXPECT_NE(t.status().message().find(what), std::string::npos) << t.status().message();
}

TEST(TokenizerMalformed, TheTinyTokenizerLoads) {
  auto t = load(tiny_tokenizer());
  ASSERT_TRUE(t.has_value()) << t.status().to_string();
  EXPECT_EQ((*t)->encode("ab<s>"), (std::vector<int32_t>{2, 3}));
}

TEST(TokenizerMalformed, MistypedOptionalFieldsAreErrors) {
  json t = tiny_tokenizer();
  t["model"]["byte_fallback"] = "yes";
  expect_error(t, "model.byte_fallback must be true or false");
  t = tiny_tokenizer();
  t["model"]["type"] = 7;
  expect_error(t, "model.type must be a string");
  t = tiny_tokenizer();
  t["added_tokens"][0]["special"] = 1;
  expect_error(t, "added_tokens[0].special must be true or false");
  t = tiny_tokenizer();
  t["pre_tokenizer"] = {{"type", "Metaspace"}, {"prepend_scheme", 5}};
  expect_error(t, "pre_tokenizer.prepend_scheme must be a string");
  t = tiny_tokenizer();
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"use_regex", "no"}};
  expect_error(t, "pre_tokenizer.use_regex must be true or false");
  t = tiny_tokenizer();
  // A huge float here was an undefined float-to-int conversion.
  t["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 1e300}};
  expect_error(t, "decoder.start must be an integer");
  t = tiny_tokenizer();
  t["decoder"] = {{"type", "Metaspace"}, {"replacement", json::array()}};
  expect_error(t, "decoder.replacement must be a string");
}

TEST(TokenizerMalformed, IdsFarBeyondTheVocabularyAreErrors) {
  // Each would have sized the id tables at 2^29 entries (tens of GB).
  json t = tiny_tokenizer();
  t["added_tokens"][0]["id"] = 1 << 29;
  expect_error(t, "added_tokens[0] id 536870912 is far beyond the vocabulary");
  t = tiny_tokenizer();
  t["model"]["vocab"]["b"] = 1 << 29;
  expect_error(t, "model.vocab id 536870912 leaves most ids unused");
}

TEST(TokenizerMalformed, PostProcessorIdsMustBeTokens) {
  json t = tiny_tokenizer();
  t["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}})},
                         {"special_tokens", {{"<s>", {{"ids", json::array({-1})}}}}}};
  expect_error(t, "special token '<s>' has id -1, not in the vocabulary");
  t["post_processor"]["special_tokens"]["<s>"]["ids"] = json::array({"x"});
  expect_error(t, "special token '<s>' has id \"x\"");
  t["post_processor"]["special_tokens"]["<s>"]["ids"] = 3;
  expect_error(t, "ids must be a list");
  t["post_processor"]["special_tokens"]["<s>"]["ids"] = json::array({3});
  auto ok = load(t);
  ASSERT_TRUE(ok.has_value()) << ok.status().to_string();
  EXPECT_EQ((*ok)->encode("ab"), (std::vector<int32_t>{3, 2}));
  t["post_processor"]["single"][0]["SpecialToken"]["id"] = 4;
  expect_error(t, "SpecialToken with a string 'id'");
  t["post_processor"] = {{"type", "Sequence"}, {"processors", "x"}};
  expect_error(t, "post_processor.processors must be an array");
}

TEST(TokenizerMalformed, NamedChatTemplatesWithOddNames) {
  json config = {{"chat_template", json::array({{{"name", 3}, {"template", "first"}},
                                                {{"name", "default"}, {"template", "chosen"}}})}};
  auto t = load(tiny_tokenizer(), config);
  ASSERT_TRUE(t.has_value()) << t.status().to_string();
  EXPECT_EQ((*t)->chat_template(), "chosen");
}

}  // namespace
}  // namespace origami
