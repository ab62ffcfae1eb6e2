#pragma once
// The `decoder` section of tokenizer.json, as a per-token table plus a small stream state, so
// that full decoding and streaming decoding are the same code (their outputs then agree).
// Supported: ByteLevel, Replace (literal), ByteFallback, Fuse, Strip, Metaspace, Sequence; a null
// decoder joins tokens with spaces.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace origami {

class TokenDecoder {
 public:
  static Expected<TokenDecoder> from_json(const nlohmann::json& json, const std::string& where);

  // Precomputes each id's output bytes from its token string (index = id). Fails only when the
  // pieces together exceed what the table's 31-bit offsets address (2 GiB; the top bit is the
  // piece's validity).
  Status build(const std::vector<std::string>& tokens);

  // One id's bytes after the per-token steps; empty for unknown ids.
  std::string_view piece(int32_t id) const;
  // The same and whether those bytes are whole, valid UTF-8 (true for unknown ids: empty).
  std::pair<std::string_view, bool> piece_and_validity(int32_t id) const;
  // The byte of a <0xXX> token when ByteFallback is on, else -1.
  int fallback_byte(int32_t id) const;

 private:
  friend class DecodeState;
  // A Strip that acts on the whole text (after Fuse) holds characters back across tokens.
  bool strips_whole_text() const { return strip_content_ != 0 && !strip_per_token_; }
  struct Replace {
    std::string pattern, content;
  };
  bool byte_level_ = false;
  bool byte_fallback_ = false;
  bool join_with_space_ = false;  // no decoder at all
  std::vector<Replace> replaces_;
  // Metaspace: replacement -> ' ', and the first token loses a leading replacement.
  std::string metaspace_;
  bool metaspace_strip_first_ = false;
  // Strip after Fuse acts on the whole text; before it, on each token.
  char32_t strip_content_ = 0;
  int strip_start_ = 0, strip_stop_ = 0;
  bool strip_per_token_ = false;

  // Every id's piece, back to back in one buffer: id's bytes are [piece_offsets_[id],
  // piece_offsets_[id + 1]). Streaming decode reads one piece per generated token at ids spread
  // over the whole vocabulary; a std::string per id (32 bytes, its bytes elsewhere once past 15)
  // made that a cache miss or two per token over a 4.8 MB table at Qwen3's 151k ids, the largest
  // cost of a step's output handling at a batch of 1024. Here the offsets are 0.6 MB, the bytes 1 MB.
  // An offset's top bit says whether the piece starting there (id's, at piece_offsets_[id]) is
  // whole, valid UTF-8: checking each piece once here, not once per generated token, took 11% of
  // the host's time at max load (engine_host_bench 1024 x 4096, docs/benchmarks.md).
  static constexpr uint32_t kPieceValidBit = 0x80000000u;
  static constexpr uint32_t kPieceOffsetMask = 0x7fffffffu;
  std::string piece_bytes_;
  std::vector<uint32_t> piece_offsets_;
  std::vector<int16_t> fallback_;  // empty unless byte_fallback_
};

// Turns ids into text incrementally. Text is only ever emitted in whole UTF-8 characters; what
// is held back (an unfinished byte sequence, a run of byte-fallback tokens, trailing strip
// characters) comes out with later ids or at finish().
class DecodeState {
 public:
  explicit DecodeState(const TokenDecoder& decoder) : d_(&decoder) {}
  void push(int32_t id, std::string& out);
  void finish(std::string& out);

 private:
  void flush_fallback_group();
  void emit(std::string& out, bool final);

  const TokenDecoder* d_;
  bool first_token_ = true;
  std::string group_;    // pending byte-fallback bytes
  std::string pending_;  // bytes not yet emitted (may end in an unfinished character)
  int stripped_left_ = 0;
  bool left_done_ = false;
  std::string held_right_;  // trailing strip characters held back
};

}  // namespace origami
