// Behaviour on small hand-made tokenizer.json files: merge formats, byte fallback, unk fusing,
// ignore_merges, added-token stripping, BOS/EOS settings, and errors that name the file.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace origami {
namespace {

using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("origami_tok_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path_ / name) << text; }

 private:
  std::filesystem::path path_;
};

// A SentencePiece-style (character-level) tokenizer with byte fallback.
json char_tokenizer(bool pair_merges = false, bool fuse_unk = true, bool ignore_merges = false) {
  json vocab = {{"<unk>", 0}, {"<s>", 1},  {"</s>", 2},    {"a", 3},       {"b", 4},   {"c", 5}, {"ab", 6},
                {"abc", 7},   {"\xE2\x96\x81", 8}, {"\xE2\x96\x81" "a", 9}, {"<0xC3>", 10}, {"<0xA9>", 11},
                {"x", 12},    {"ca", 14}};
  json merges = pair_merges ? json::array({json::array({"a", "b"}), json::array({"ab", "c"}),
                                           json::array({"\xE2\x96\x81", "a"})})
                            : json::array({"a b", "ab c", "\xE2\x96\x81 a"});
  return {
      {"version", "1.0"},
      {"added_tokens",
       json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
                    {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                    {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}},
                    {{"id", 13},
                     {"content", "<m>"},
                     {"special", true},
                     {"normalized", false},
                     {"lstrip", true},
                     {"rstrip", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder", {{"type", "Sequence"},
                   {"decoders", json::array({{{"type", "Replace"},
                                              {"pattern", {{"String", "\xE2\x96\x81"}}},
                                              {"content", " "}},
                                             {{"type", "ByteFallback"}},
                                             {{"type", "Fuse"}},
                                             {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"fuse_unk", fuse_unk},
        {"ignore_merges", ignore_merges},
        {"vocab", vocab},
        {"merges", merges}}},
  };
}

std::shared_ptr<Tokenizer> load(const json& tokenizer, const json& config = nullptr) {
  TempDir dir;
  dir.write("tokenizer.json", tokenizer.dump());
  if (!config.is_null()) dir.write("tokenizer_config.json", config.dump());
  auto t = Tokenizer::load(dir.path());
  EXPECT_TRUE(t.has_value()) << t.status().to_string();
  return t.has_value() ? *t : nullptr;
}

using Ids = std::vector<int32_t>;

TEST(TokenizerBehavior, MergesAsStringsOrPairsAgree) {
  auto a = load(char_tokenizer(false));
  auto b = load(char_tokenizer(true));
  ASSERT_TRUE(a && b);
  for (const char* text : {"abc", "abx", "cab", "ababc", "aabbcc"}) {
    EXPECT_EQ(a->encode(text), b->encode(text)) << text;
  }
  EXPECT_EQ(a->encode("abc"), (Ids{7}));
  EXPECT_EQ(a->encode("abx"), (Ids{6, 12}));
  EXPECT_EQ(a->encode("cabc"), (Ids{5, 7}));
}

TEST(TokenizerBehavior, ByteFallbackAndUnk) {
  auto fused = load(char_tokenizer(false, /*fuse_unk=*/true));
  auto unfused = load(char_tokenizer(false, /*fuse_unk=*/false));
  ASSERT_TRUE(fused && unfused);
  EXPECT_EQ(fused->encode("\xC3\xA9"), (Ids{10, 11}));  // é -> <0xC3><0xA9>
  EXPECT_EQ(fused->encode("zzab"), (Ids{0, 6}));        // unknown chars fuse into one <unk>
  EXPECT_EQ(unfused->encode("zzab"), (Ids{0, 0, 6}));
  EXPECT_EQ(fused->decode({10, 11, 3}), "\xC3\xA9" "a");
  // A run of byte tokens that is not valid UTF-8 becomes one U+FFFD per byte.
  EXPECT_EQ(fused->decode({10, 3}), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(fused->decode({11, 10}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  // Replace + Strip: the first leading space is removed from the whole text only.
  EXPECT_EQ(fused->decode({9, 8, 3}), "a a");
  EXPECT_EQ(fused->decode({8, 8, 3}), " a");
}

TEST(TokenizerBehavior, StreamingMatchesDecodeOnRandomIds) {
  auto tok = load(char_tokenizer());
  ASSERT_TRUE(tok);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    Ids ids(rng() % 12);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % 15);
    for (bool skip : {false, true}) {
      StreamingDecoder stream(tok, skip);
      std::string out;
      for (int32_t id : ids) out += stream.push(id);
      out += stream.flush();
      EXPECT_EQ(out, tok->decode(ids, skip));
    }
  }
}

// The engine keeps each request's text and has the decoder append to it: the same text as the
// deltas push(id) returns, after whatever the caller's string held.
TEST(TokenizerBehavior, StreamingPushAppendsToTheCallersText) {
  auto tok = load(char_tokenizer());
  ASSERT_TRUE(tok);
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    Ids ids(rng() % 12);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % 15);
    StreamingDecoder deltas(tok), appending(tok);
    std::string expected = "kept ", text = "kept ";
    for (int32_t id : ids) {
      expected += deltas.push(id);
      appending.push(id, text);
      EXPECT_EQ(text, expected);
    }
  }
}

// Pieces live in one buffer indexed by id: each id's own bytes (after Replace), nothing for an id
// outside the vocabulary.
TEST(TokenizerBehavior, TokenDecoderPiecesByIdAndOutOfRange) {
  auto tok = load(char_tokenizer());
  ASSERT_TRUE(tok);
  const TokenDecoder& d = tok->token_decoder();
  EXPECT_EQ(d.piece(3), "a");
  EXPECT_EQ(d.piece(7), "abc");
  EXPECT_EQ(d.piece(8), " ");   // U+2581 replaced by a space
  EXPECT_EQ(d.piece(9), " a");
  EXPECT_EQ(d.piece(13), "<m>");  // an added token
  EXPECT_EQ(d.piece(-1), "");
  EXPECT_EQ(d.piece(tok->vocab_size()), "");
  EXPECT_EQ(d.fallback_byte(10), 0xC3);
  EXPECT_EQ(d.fallback_byte(3), -1);
  EXPECT_EQ(d.fallback_byte(tok->vocab_size()), -1);
}

TEST(TokenizerBehavior, IgnoreMerges) {
  auto with = load(char_tokenizer(false, true, /*ignore_merges=*/true));
  auto without = load(char_tokenizer(false, true, /*ignore_merges=*/false));
  ASSERT_TRUE(with && without);
  EXPECT_EQ(with->encode("ca"), (Ids{14}));  // a whole-word vocab hit skips the merges
  EXPECT_EQ(without->encode("ca"), (Ids{5, 3}));
}

TEST(TokenizerBehavior, AddedTokensStripAndMatchLongest) {
  json t = char_tokenizer();
  t["added_tokens"].push_back({{"id", 15}, {"content", "<m>x"}, {"special", false}, {"normalized", false}});
  auto tok = load(t);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->encode("ab <m> c"), (Ids{6, 13, 5}));  // lstrip/rstrip swallow the spaces
  EXPECT_EQ(tok->encode("ab<m>x"), (Ids{6, 15}));       // longest match wins
  EXPECT_EQ(tok->decode({6, 13, 5}, true), "abc");
  EXPECT_TRUE(tok->is_special(13));
  EXPECT_FALSE(tok->is_special(15));
  EXPECT_EQ(tok->vocab_size(), 16);
}

TEST(TokenizerBehavior, BosEosFromConfigAndTemplate) {
  auto plain = load(char_tokenizer());
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->encode("ab"), (Ids{6}));
  EXPECT_FALSE(plain->bos_token_id().has_value());

  auto both = load(char_tokenizer(), {{"bos_token", "<s>"},
                                      {"eos_token", {{"content", "</s>"}}},
                                      {"add_bos_token", true},
                                      {"add_eos_token", true},
                                      {"chat_template", "{{ messages }}"}});
  ASSERT_TRUE(both);
  EXPECT_EQ(both->encode("ab"), (Ids{1, 6, 2}));
  EXPECT_EQ(both->encode("ab", /*add_special_tokens=*/false), (Ids{6}));
  EXPECT_EQ(both->bos_token_id(), 1);
  EXPECT_EQ(both->eos_token(), "</s>");
  EXPECT_EQ(both->chat_template(), "{{ messages }}");

  json t = char_tokenizer();
  t["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  auto templ = load(t);
  ASSERT_TRUE(templ);
  EXPECT_EQ(templ->encode("ab"), (Ids{1, 6}));
}

TEST(TokenizerBehavior, ByteLevelWithSplit) {
  // Byte-level tokenizer over a tiny alphabet: 'h','i','Ġ' and merges making "hi" and "Ġhi".
  json t = {{"added_tokens", json::array()},
            {"normalizer", {{"type", "NFC"}}},
            {"pre_tokenizer",
             {{"type", "Sequence"},
              {"pretokenizers",
               json::array({{{"type", "Split"},
                             {"pattern", {{"Regex", std::string(split_pattern_regex(SplitPattern::kQwen2))}}},
                             {"behavior", "Isolated"},
                             {"invert", false}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model",
             {{"type", "BPE"},
              {"vocab", {{"h", 0}, {"i", 1}, {"\xC4\xA0", 2}, {"hi", 3}, {"\xC4\xA0hi", 4},
                         {"\xC3\x83", 6}, {"\xC2\xA9", 7}, {"\xC3\x83\xC2\xA9", 5}}},
              {"merges", json::array({"h i", "\xC4\xA0 hi", "\xC3\x83 \xC2\xA9"})}}}};
  auto tok = load(t);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->encode("hi hi"), (Ids{3, 4}));
  EXPECT_EQ(tok->decode({3, 4}), "hi hi");
  // 'é' is bytes C3 A9, i.e. alphabet chars U+00C3 U+00A9, merged into one token.
  EXPECT_EQ(tok->encode("h\xC3\xA9"), (Ids{0, 5}));
  EXPECT_EQ(tok->decode({0, 5}), "h\xC3\xA9");
  EXPECT_EQ(tok->decode({0, 6}), "h\xEF\xBF\xBD");  // a lone lead byte decodes to U+FFFD
}

TEST(TokenizerErrors, MissingFileNamesIt) {
  auto t = Tokenizer::load("/nonexistent/origami/dir");
  ASSERT_FALSE(t.has_value());
  EXPECT_EQ(t.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(t.status().message().find("/nonexistent/origami/dir/tokenizer.json"), std::string::npos);
}

TEST(TokenizerErrors, MalformedFilesNameThem) {
  TempDir dir;
  dir.write("tokenizer.json", "{\"model\": [1, 2");
  auto t = Tokenizer::load(dir.path());
  ASSERT_FALSE(t.has_value());
  EXPECT_EQ(t.status().code(), ErrorCode::kInvalidFile);
  EXPECT_NE(t.status().message().find((dir.path() / "tokenizer.json").string()), std::string::npos);

  auto expect_error = [](const json& tok, const json& config, const std::string& file, const std::string& what) {
    TempDir d;
    d.write("tokenizer.json", tok.dump());
    if (!config.is_null()) d.write("tokenizer_config.json", config.dump());
    auto r = Tokenizer::load(d.path());
    ASSERT_FALSE(r.has_value()) << what;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidFile) << what;
    EXPECT_NE(r.status().message().find(file), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  json bad_merge = char_tokenizer();
  bad_merge["model"]["merges"].push_back("a zz");
  expect_error(bad_merge, nullptr, "tokenizer.json", "model.merges[3]");
  json bad_regex = char_tokenizer();
  bad_regex["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}};
  expect_error(bad_regex, nullptr, "tokenizer.json", "regex");
  json no_vocab = char_tokenizer();
  no_vocab["model"].erase("vocab");
  expect_error(no_vocab, nullptr, "tokenizer.json", "model.vocab");
  json wordpiece = char_tokenizer();
  wordpiece["model"]["type"] = "WordPiece";
  expect_error(wordpiece, nullptr, "tokenizer.json", "WordPiece");
  expect_error(char_tokenizer(), {{"bos_token", "<s>"}, {"add_bos_token", "yes"}}, "tokenizer_config.json",
               "add_bos_token");
  expect_error(char_tokenizer(), {{"eos_token", "<nope>"}}, "tokenizer_config.json", "<nope>");
}

}  // namespace
}  // namespace origami
