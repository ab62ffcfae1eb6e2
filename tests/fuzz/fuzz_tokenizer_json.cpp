// Fuzzes the tokenizer.json (and tokenizer_config.json) loader, then uses what it accepted.
// Input: tokenizer.json text, optionally followed by "\0" and a tokenizer_config.json text, and
// by a second "\0" and a text to encode (else a few fixed texts are encoded). Seeds are the real
// (or cut-down) tokenizers; inputs are capped in size by scripts/fuzz.sh (-max_len).
#include "tokenizer_checks.h"

using namespace origami;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bool has_config = false, has_text = false;
  auto [tokenizer_json, rest] = fuzz::split_once(fuzz::as_text(data, size), std::string_view("\0", 1), &has_config);
  auto [config_json, text] = fuzz::split_once(rest, std::string_view("\0", 1), &has_text);
  const std::string config(config_json);
  Expected<std::shared_ptr<Tokenizer>> loaded =
      Tokenizer::from_json_text(tokenizer_json, "tokenizer.json", has_config ? &config : nullptr);
  if (!loaded) {
    const std::string& m = loaded.status().message();
    FUZZ_CHECK(m.rfind("tokenizer.json", 0) == 0 || m.rfind("tokenizer_config.json", 0) == 0,
               "error does not name the file: " + m);
    return 0;
  }
  std::shared_ptr<const Tokenizer> tok = *loaded;
  FUZZ_CHECK(tok->vocab_size() > 0, "empty vocabulary accepted");
  if (auto bos = tok->bos_token_id()) FUZZ_CHECK(*bos >= 0 && *bos < tok->vocab_size(), "bos id outside the vocabulary");
  if (auto eos = tok->eos_token_id()) FUZZ_CHECK(*eos >= 0 && *eos < tok->vocab_size(), "eos id outside the vocabulary");
  if (has_text) {
    fuzz::check_encode_decode(tok, text);
  } else {
    for (std::string_view sample : {"Hello world! It's 2024.", "  naïve café\n\tÜber 日本語 😀", "<s>a</s><|im_end|>x"}) {
      fuzz::check_encode_decode(tok, sample);
    }
  }
  std::vector<int32_t> all;
  for (int32_t id = 0; id < std::min(tok->vocab_size(), 64); ++id) all.push_back(id);
  all.push_back(tok->vocab_size() - 1);
  fuzz::check_decode(tok, all, false);
  return 0;
}
