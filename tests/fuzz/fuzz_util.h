#pragma once
// Helpers shared by the libFuzzer harnesses: the input as text, splitting it into parts, and a
// check that aborts (so libFuzzer keeps the input) when a parser breaks one of its promises.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

namespace origami::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// Splits at the first `sep`: (before, after); `after` is empty and `found` false without one.
inline std::pair<std::string_view, std::string_view> split_once(std::string_view text, std::string_view sep,
                                                                bool* found = nullptr) {
  const size_t at = text.find(sep);
  if (found != nullptr) *found = at != std::string_view::npos;
  if (at == std::string_view::npos) return {text, {}};
  return {text.substr(0, at), text.substr(at + sep.size())};
}

// Where the shared fixtures are (tokenizers loaded once at start-up).
inline std::string shared_dir() {
  const char* env = std::getenv("ORIGAMI_SHARED_DIR");
  return env != nullptr && *env != '\0' ? env : ORIGAMI_SHARED_DIR;
}

}  // namespace origami::fuzz

// A broken promise of the code under test (not a rejected input): abort with the reason.
#define FUZZ_CHECK(cond, msg)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s: %s\n", __FILE__, __LINE__, #cond, \
                   std::string(msg).c_str());                                              \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)
