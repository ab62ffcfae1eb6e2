#pragma once
// A HuggingFace `tokenizer.json` BPE tokenizer (byte-level and SentencePiece-style), with the
// special-token settings and chat template of an optional `tokenizer_config.json`.
//
// encode: added tokens are cut out of the raw text first; each stretch between them is
// normalized, pre-tokenized into words and BPE-encoded word by word; BOS/EOS are added as the
// post-processor or tokenizer_config.json's add_bos_token / add_eos_token say.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"

namespace origami {

class Tokenizer {
 public:
  // Reads dir/tokenizer.json and, if present, dir/tokenizer_config.json (and
  // dir/chat_template.jinja when the config has no template).
  static Expected<std::shared_ptr<Tokenizer>> load(const std::filesystem::path& dir);
  // Builds a tokenizer from the text of a tokenizer.json and, when `config_json` is given, of a
  // tokenizer_config.json; `source` and `config_source` name them in errors. load() reads the
  // files and calls this.
  static Expected<std::shared_ptr<Tokenizer>> from_json_text(std::string_view tokenizer_json, const std::string& source,
                                                             const std::string* config_json = nullptr,
                                                             const std::string& config_source = "tokenizer_config.json");

  // Invalid UTF-8 in `text` is replaced by U+FFFD first.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Unknown ids are skipped; invalid UTF-8 from byte tokens becomes U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  int vocab_size() const;  // including added tokens
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // "" if unknown

  std::optional<int32_t> bos_token_id() const { return bos_id_; }
  std::optional<int32_t> eos_token_id() const { return eos_id_; }
  std::string bos_token() const { return bos_token_; }
  std::string eos_token() const { return eos_token_; }
  const std::string& chat_template() const { return chat_template_; }  // "" when none
  // tokenizer_config.json's special-token strings by name: bos_token, eos_token, unk_token,
  // pad_token, ... (only those that are set).
  const std::map<std::string, std::string>& special_tokens() const { return special_tokens_; }
  // Added tokens marked special (skipped by decode(ids, true)).
  bool is_special(int32_t id) const;
  // All added tokens, as in tokenizer.json.
  const std::vector<AddedToken>& added_tokens() const { return added_; }

  const TokenDecoder& token_decoder() const { return decoder_; }

 private:
  Tokenizer() = default;
  Status load_config(std::string_view config_json, const std::string& where);
  void encode_plain(std::string_view text, bool at_text_start, std::vector<int32_t>& ids) const;

  std::unique_ptr<BpeModel> model_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  TokenDecoder decoder_;
  std::vector<AddedToken> added_;
  AddedTokenMatcher raw_matcher_;         // added tokens with normalized=false
  AddedTokenMatcher normalized_matcher_;  // added tokens with normalized=true
  StringIdMap added_ids_;
  std::vector<std::string> tokens_;  // id -> token string (model or added)
  std::vector<uint8_t> special_;     // id -> is a special added token
  std::vector<int32_t> prefix_ids_, suffix_ids_;
  std::optional<int32_t> bos_id_, eos_id_;
  std::string bos_token_, eos_token_, chat_template_;
  std::map<std::string, std::string> special_tokens_;
};

}  // namespace origami
