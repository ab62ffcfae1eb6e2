#pragma once
// A one-line progress bar on stderr, redrawn in place (only when stderr is a terminal, else
// printed at most every few seconds so logs stay readable).
#include <chrono>
#include <cstddef>
#include <string>

namespace origami::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  void update(size_t done, size_t total, size_t generated_tokens);
  void finish();

 private:
  std::string label_;
  bool is_tty_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

}  // namespace origami::cli
