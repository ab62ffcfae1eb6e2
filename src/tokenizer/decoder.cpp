#include "tokenizer/decoder.h"

#include <functional>

#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/unicode.h"

namespace origami {
namespace {

std::string replace_all(std::string s, const std::string& pattern, const std::string& content) {
  if (pattern.empty() || s.find(pattern) == std::string::npos) return s;
  std::string out;
  size_t from = 0;
  for (size_t at; (at = s.find(pattern, from)) != std::string::npos; from = at + pattern.size()) {
    out.append(s, from, at - from);
    out += content;
  }
  out.append(s, from);
  return out;
}

int parse_fallback(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

Expected<TokenDecoder> TokenDecoder::from_json(const nlohmann::json& json, const std::string& where) {
  TokenDecoder d;
  if (json.is_null()) {
    d.join_with_space_ = true;
    return d;
  }
  std::vector<const nlohmann::json*> steps;
  if (!json.is_object() || !json.contains("type") || !json["type"].is_string()) {
    return invalid_file(where + ": the decoder must be an object with a string 'type'");
  }
  if (json["type"] == "Sequence") {
    if (!json.contains("decoders") || !json["decoders"].is_array()) {
      return invalid_file(where + ": Sequence decoder without a 'decoders' array");
    }
    for (const auto& s : json["decoders"]) steps.push_back(&s);
  } else {
    steps.push_back(&json);
  }
  bool fused = false;
  for (const nlohmann::json* s : steps) {
    if (!s->is_object() || !s->contains("type") || !(*s)["type"].is_string()) {
      return invalid_file(where + ": each decoder must be an object with a string 'type'");
    }
    const std::string type = (*s)["type"];
    if (type == "ByteLevel") {
      d.byte_level_ = true;
      fused = true;  // it joins all tokens into one string
    } else if (type == "Replace") {
      const auto& pattern = s->value("pattern", nlohmann::json());
      if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
          !s->contains("content") || !(*s)["content"].is_string()) {
        return invalid_file(where + ": Replace decoder: only literal {\"String\": ...} patterns are supported");
      }
      d.replaces_.push_back({pattern["String"].get<std::string>(), (*s)["content"].get<std::string>()});
    } else if (type == "ByteFallback") {
      d.byte_fallback_ = true;
    } else if (type == "Fuse") {
      fused = true;
    } else if (type == "Strip") {
      const std::string field = where + ": decoder";
      ORIGAMI_ASSIGN_OR_RETURN(const std::string content, optional_string(*s, "content", " ", field));
      size_t p = 0;
      d.strip_content_ = content.empty() ? U' ' : unicode::next_code_point(content, p);
      ORIGAMI_ASSIGN_OR_RETURN(d.strip_start_, optional_int(*s, "start", 0, 0, 1 << 20, field));
      ORIGAMI_ASSIGN_OR_RETURN(d.strip_stop_, optional_int(*s, "stop", 0, 0, 1 << 20, field));
      d.strip_per_token_ = !fused;
    } else if (type == "Metaspace") {
      const std::string field = where + ": decoder";
      ORIGAMI_ASSIGN_OR_RETURN(d.metaspace_, optional_string(*s, "replacement", "\xE2\x96\x81", field));
      ORIGAMI_ASSIGN_OR_RETURN(const bool add_prefix_space, optional_bool(*s, "add_prefix_space", true, field));
      ORIGAMI_ASSIGN_OR_RETURN(const std::string scheme,
                               optional_string(*s, "prepend_scheme", add_prefix_space ? "always" : "never", field));
      d.metaspace_strip_first_ = scheme != "never";
    } else {
      return invalid_file(where + ": unsupported decoder type '" + type + "'");
    }
  }
  return d;
}

Status TokenDecoder::build(const std::vector<std::string>& tokens) {
  piece_offsets_.assign(1, 0);
  piece_offsets_.reserve(tokens.size() + 1);
  piece_bytes_.clear();
  fallback_.assign(byte_fallback_ ? tokens.size() : 0, -1);
  for (size_t id = 0; id < tokens.size(); ++id) {
    std::string t = tokens[id];
    if (byte_fallback_) fallback_[id] = static_cast<int16_t>(parse_fallback(t));
    for (const Replace& r : replaces_) t = replace_all(std::move(t), r.pattern, r.content);
    if (!metaspace_.empty()) t = replace_all(std::move(t), metaspace_, " ");
    if (byte_level_) {
      // Strings outside the byte alphabet (some added tokens) pass through as they are.
      if (auto bytes = byte_level::decode(t)) t = std::move(*bytes);
    }
    if (strip_per_token_ && strip_content_ != 0) {
      std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
      for (size_t p = 0; p < t.size();) {
        const size_t at = p;
        chars.push_back({at, unicode::next_code_point(t, p)});
      }
      size_t begin = 0, end = chars.size();
      while (begin < end && static_cast<int>(begin) < strip_start_ && chars[begin].second == strip_content_) ++begin;
      while (end > begin && static_cast<int>(chars.size() - end) < strip_stop_ &&
             chars[end - 1].second == strip_content_) {
        --end;
      }
      const size_t b = begin < chars.size() ? chars[begin].first : t.size();
      const size_t e = end < chars.size() ? chars[end].first : t.size();
      t = t.substr(b, e - b);
    }
    if (piece_bytes_.size() + t.size() > kPieceOffsetMask)
      return invalid_file("tokenizer: the decoded token strings exceed 2 GiB in all");
    if (unicode::is_valid_utf8(t)) piece_offsets_.back() |= kPieceValidBit;  // id's start: its flag
    piece_bytes_ += t;
    piece_offsets_.push_back(static_cast<uint32_t>(piece_bytes_.size()));
  }
  piece_bytes_.shrink_to_fit();
  return Status::ok();
}

std::string_view TokenDecoder::piece(int32_t id) const { return piece_and_validity(id).first; }

std::pair<std::string_view, bool> TokenDecoder::piece_and_validity(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) + 1 >= piece_offsets_.size()) return {{}, true};
  const uint32_t begin = piece_offsets_[id] & kPieceOffsetMask;
  const uint32_t end = piece_offsets_[id + 1] & kPieceOffsetMask;
  return {std::string_view(piece_bytes_).substr(begin, end - begin), (piece_offsets_[id] & kPieceValidBit) != 0};
}

int TokenDecoder::fallback_byte(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= fallback_.size()) return -1;
  return fallback_[id];
}

void DecodeState::flush_fallback_group() {
  if (group_.empty()) return;
  // A run of byte tokens is kept only if the whole run is valid UTF-8; otherwise each byte
  // becomes U+FFFD.
  if (unicode::is_valid_utf8(group_)) {
    pending_ += group_;
  } else {
    for (size_t i = 0; i < group_.size(); ++i) unicode::append_utf8(pending_, unicode::kReplacementChar);
  }
  group_.clear();
}

void DecodeState::push(int32_t id, std::string& out) {
  if (d_->fallback_byte(id) >= 0) {
    group_.push_back(static_cast<char>(d_->fallback_byte(id)));
    first_token_ = false;
    return;
  }
  flush_fallback_group();
  auto [piece, valid] = d_->piece_and_validity(id);
  if (d_->join_with_space_ && !first_token_) pending_.push_back(' ');
  // Dropping a leading space (one byte) keeps a valid piece valid.
  if (first_token_ && d_->metaspace_strip_first_ && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
  first_token_ = false;
  // Nothing held back and a piece of whole, valid characters: emit() would pass it through as it
  // is, so append it without the copies through pending_ (the usual case, once per generated token;
  // the validity was found when the table was built, not per token).
  if (pending_.empty() && !d_->strips_whole_text() && valid) {
    out.append(piece);
    return;
  }
  pending_.append(piece);
  emit(out, /*final=*/false);
}

void DecodeState::finish(std::string& out) {
  flush_fallback_group();
  emit(out, /*final=*/true);
  // Trailing strip characters held back are dropped: they end the text.
  held_right_.clear();
}

void DecodeState::emit(std::string& out, bool final) {
  const size_t ready = final ? pending_.size() : unicode::complete_utf8_prefix(pending_);
  if (ready == 0) return;
  std::string text = unicode::to_valid_utf8(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  if (!d_->strips_whole_text()) {
    out += text;
    return;
  }
  // Whole-text Strip: drop up to strip_start_ leading characters, hold back up to strip_stop_
  // trailing ones until something else follows them.
  size_t pos = 0;
  while (!left_done_ && pos < text.size()) {
    size_t p = pos;
    const char32_t c = unicode::next_code_point(text, p);
    if (stripped_left_ < d_->strip_start_ && c == d_->strip_content_) {
      ++stripped_left_;
      pos = p;
    } else {
      left_done_ = true;
    }
  }
  if (pos >= text.size()) return;
  if (d_->strip_stop_ == 0) {
    out.append(text, pos);
    return;
  }
  held_right_.append(text, pos);
  // Everything before the last run of up to strip_stop_ content characters can go out.
  std::vector<size_t> starts;
  for (size_t p = 0; p < held_right_.size();) {
    starts.push_back(p);
    unicode::next_code_point(held_right_, p);
  }
  size_t keep_from = held_right_.size();
  int run = 0;
  for (size_t i = starts.size(); i-- > 0 && run < d_->strip_stop_;) {
    size_t p = starts[i];
    if (unicode::next_code_point(held_right_, p) != d_->strip_content_) break;
    keep_from = starts[i];
    ++run;
  }
  out.append(held_right_, 0, keep_from);
  held_right_.erase(0, keep_from);
}

}  // namespace origami
