#include "tokenizer/streaming_decoder.h"

namespace origami {

StreamingDecoder::StreamingDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)),
      skip_special_tokens_(skip_special_tokens),
      state_(tokenizer_->token_decoder()) {}

std::string StreamingDecoder::push(int32_t id) {
  std::string out;
  push(id, out);
  return out;
}

void StreamingDecoder::push(int32_t id, std::string& text) {
  if (id < 0 || id >= tokenizer_->vocab_size()) return;
  if (skip_special_tokens_ && tokenizer_->is_special(id)) return;
  state_.push(id, text);
}

std::string StreamingDecoder::flush() {
  std::string out;
  state_.finish(out);
  state_ = DecodeState(tokenizer_->token_decoder());
  return out;
}

}  // namespace origami
