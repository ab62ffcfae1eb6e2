// Fuzzes encode/decode with the real tokenizers (loaded once): origami-tiny-qwen3's byte-level
// BPE with NFC and added tokens, and stories260k's SentencePiece-style BPE with byte fallback.
// The first input byte picks the tokenizer; the rest is encoded as text and, read as token ids,
// decoded (unknown ids included).
#include <cstdio>

#include "tokenizer_checks.h"

using namespace origami;

namespace {

std::vector<std::shared_ptr<const Tokenizer>> load_tokenizers() {
  std::vector<std::shared_ptr<const Tokenizer>> out;
  for (const char* name : {"models/origami-tiny-qwen3", "models/stories260k"}) {
    const std::string dir = fuzz::shared_dir() + "/" + name;
    Expected<std::shared_ptr<Tokenizer>> t = Tokenizer::load(dir);
    if (!t) {
      std::fprintf(stderr, "cannot load %s: %s (set ORIGAMI_SHARED_DIR)\n", dir.c_str(), t.status().message().c_str());
      std::abort();
    }
    out.push_back(*t);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::shared_ptr<const Tokenizer>> tokenizers = load_tokenizers();
  if (size == 0) return 0;
  const auto& tok = tokenizers[data[0] % tokenizers.size()];
  const std::string_view text = fuzz::as_text(data + 1, size - 1);
  fuzz::check_encode_decode(tok, text);
  fuzz::check_decode(tok, fuzz::bytes_as_ids(text), data[0] & 0x80);
  return 0;
}
