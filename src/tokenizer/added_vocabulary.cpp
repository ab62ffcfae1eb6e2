#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace origami {
namespace {

// The code point that ends text[0, pos).
char32_t char_before(std::string_view text, size_t pos) {
  size_t start = pos;
  while (start > 0 && (static_cast<unsigned char>(text[start - 1]) & 0xC0) == 0x80) --start;
  if (start > 0) --start;
  size_t p = start;
  return unicode::next_code_point(text, p);
}

bool is_word_char(char32_t c) { return c == '_' || unicode::is_letter(c) || unicode::is_number(c); }

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  trie_.emplace_back();
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;
    first_byte_[static_cast<uint8_t>(content[0])] = true;
    int32_t node = 0;
    for (char c : content) {
      const auto b = static_cast<uint8_t>(c);
      int32_t next = child(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(trie_.size());
        trie_.emplace_back();
        auto& ch = trie_[node].children;
        ch.insert(std::lower_bound(ch.begin(), ch.end(), std::pair<uint8_t, int32_t>{b, -1}), {b, next});
      }
      node = next;
    }
    if (trie_[node].token < 0) trie_[node].token = static_cast<int32_t>(t);
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  const auto& ch = trie_[node].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), std::pair<uint8_t, int32_t>{byte, -1});
  return it != ch.end() && it->first == byte ? it->second : -1;
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t& end) const {
  int32_t node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    node = child(node, static_cast<uint8_t>(text[i]));
    if (node < 0) break;
    if (trie_[node].token >= 0) best = trie_[node].token, end = i + 1;
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>& out) const {
  size_t emitted = 0;  // end of the last segment pushed
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t end = 0;
    const int32_t t = longest_at(text, pos, end);
    if (t < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[t];
    if (tok.single_word) {
      const bool word_before = pos > 0 && is_word_char(char_before(text, pos));
      size_t p = end;
      const bool word_after = end < text.size() && is_word_char(unicode::next_code_point(text, p));
      if (word_before || word_after) {
        pos = end;  // the matcher moves past a discarded match
        continue;
      }
    }
    size_t start = pos;
    if (tok.lstrip) {
      while (start > emitted) {
        const size_t before = start;
        size_t s = start;
        while (s > 0 && (static_cast<unsigned char>(text[s - 1]) & 0xC0) == 0x80) --s;
        if (s > 0) --s;
        if (!unicode::is_whitespace(char_before(text, before))) break;
        start = s;
      }
    }
    if (tok.rstrip) {
      while (end < text.size()) {
        size_t p = end;
        if (!unicode::is_whitespace(unicode::next_code_point(text, p))) break;
        end = p;
      }
    }
    if (start > emitted) out.push_back({text.substr(emitted, start - emitted), -1});
    out.push_back({text.substr(start, end - start), tok.id});
    emitted = pos = end;
  }
  if (emitted < text.size()) out.push_back({text.substr(emitted), -1});
}

}  // namespace origami
