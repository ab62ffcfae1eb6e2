#pragma once
// Incremental detokenization for generation: push ids one by one and get the text they add.
// Never emits part of a UTF-8 character; the concatenation of all push() results and flush()
// equals Tokenizer::decode(ids, skip_special_tokens).
#include <cstdint>
#include <memory>
#include <string>

#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer.h"

namespace origami {

class StreamingDecoder {
 public:
  explicit StreamingDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens = true);

  std::string push(int32_t id);
  // The same text appended to `text`: no string per token for a caller that keeps the whole text.
  void push(int32_t id, std::string& text);
  // Ends the stream: whatever was held back (e.g. an unfinished character, as U+FFFD).
  std::string flush();

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  bool skip_special_tokens_;
  DecodeState state_;
};

}  // namespace origami
