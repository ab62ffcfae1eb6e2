#pragma once
// What every loaded tokenizer promises, checked by both tokenizer harnesses: encode yields ids
// inside the vocabulary, decode yields valid UTF-8, and streaming decode (id by id) yields the
// same text as decoding all ids at once.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace origami::fuzz {

inline void check_decode(const std::shared_ptr<const Tokenizer>& tok, const std::vector<int32_t>& ids, bool skip) {
  const std::string text = tok->decode(ids, skip);
  FUZZ_CHECK(unicode::is_valid_utf8(text), "decode produced invalid UTF-8");
  StreamingDecoder stream(tok, skip);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  streamed += stream.flush();
  FUZZ_CHECK(streamed == text, "streaming decode differs from decode");
}

inline void check_encode_decode(const std::shared_ptr<const Tokenizer>& tok, std::string_view text) {
  for (bool add_special : {true, false}) {
    const std::vector<int32_t> ids = tok->encode(text, add_special);
    for (int32_t id : ids) {
      FUZZ_CHECK(id >= 0 && id < tok->vocab_size(), "encode produced id " + std::to_string(id) + " outside the vocabulary");
    }
    check_decode(tok, ids, /*skip=*/!add_special);
  }
}

// The input's bytes read as token ids (little-endian int16 pairs, so ids stay near the
// vocabulary and some fall outside it).
inline std::vector<int32_t> bytes_as_ids(std::string_view bytes) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
    ids.push_back(static_cast<int16_t>(static_cast<uint8_t>(bytes[i]) | (static_cast<uint8_t>(bytes[i + 1]) << 8)));
  }
  return ids;
}

}  // namespace origami::fuzz
