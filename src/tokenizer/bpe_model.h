#pragma once
// The BPE `model` section of tokenizer.json: vocab, ranked merges, unk / byte fallback.
// Works either on bytes (byte-level tokenizers: initial symbols are single bytes, vocab strings
// are mapped from the byte alphabet back to raw bytes at load) or on UTF-8 characters
// (SentencePiece-style tokenizers, with optional <0xXX> byte fallback).
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace origami {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  static Expected<std::unique_ptr<BpeModel>> from_json(const nlohmann::json& model, bool byte_level,
                                                       const std::string& where);
  ~BpeModel();

  // Appends the ids of one pre-tokenized word (raw bytes for byte-level models).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  int32_t num_ids() const { return static_cast<int32_t>(tokens_.size()); }  // max id + 1
  // The vocab string of an id ("" for a hole in the id range).
  const std::string& token(int32_t id) const { return tokens_[id]; }
  std::optional<int32_t> find(std::string_view token) const;
  bool byte_level() const { return byte_level_; }
  // The byte an id stands for if it is a <0xXX> byte-fallback token (and byte_fallback is on).
  std::optional<uint8_t> fallback_byte(int32_t id) const;

 private:
  BpeModel() = default;
  struct MergeTable;
  struct Cache;

  void merge_symbols(std::vector<int32_t>& symbols) const;
  void initial_symbols_chars(std::string_view word, std::vector<int32_t>& symbols) const;

  bool byte_level_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::optional<int32_t> unk_id_;
  std::vector<std::string> tokens_;          // id -> vocab string
  StringIdMap vocab_;                        // vocab string -> id
  StringIdMap byte_vocab_;                   // byte-level: raw bytes -> id
  std::array<int32_t, 256> byte_ids_{};      // byte-level: byte -> id; else <0xXX> -> id; -1 if none
  std::vector<int16_t> fallback_byte_;       // id -> byte for <0xXX> tokens, -1 otherwise
  std::unique_ptr<MergeTable> merges_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace origami
