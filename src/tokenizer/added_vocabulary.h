#pragma once
// Added tokens (tokenizer.json `added_tokens`): found in the text before the model sees it,
// leftmost first and longest at a position, honouring lstrip / rstrip / single_word. Tokens with
// normalized=false are matched in the raw text, the others in the normalized text.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace origami {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A stretch of text: an added token (id >= 0) or plain text to tokenize (id < 0).
struct TextSegment {
  std::string_view text;
  int32_t id = -1;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }
  // Appends the segments of `text`, in order; empty plain stretches are omitted.
  void split(std::string_view text, std::vector<TextSegment>& out) const;

 private:
  struct Node {
    int32_t token = -1;              // index into tokens_ if a token ends here
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node, sorted
  };
  int32_t child(int32_t node, uint8_t byte) const;
  // Longest token starting at pos, or -1.
  int32_t longest_at(std::string_view text, size_t pos, size_t& end) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> trie_;
  bool first_byte_[256] = {};
};

}  // namespace origami
