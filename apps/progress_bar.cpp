#include "progress_bar.h"

#include <unistd.h>

#include <cstdio>

namespace origami::cli {

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), is_tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

void ProgressBar::update(size_t done, size_t total, size_t generated_tokens) {
  const auto now = std::chrono::steady_clock::now();
  const double since_draw = std::chrono::duration<double>(now - last_draw_).count();
  if (drawn_ && done < total && since_draw < (is_tty_ ? 0.1 : 5.0)) return;
  last_draw_ = now;
  drawn_ = true;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int width = 30;
  const int filled = total ? static_cast<int>(width * done / total) : width;
  std::string bar(filled, '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "%s%s [%s] %zu/%zu  %.1fs  %.1f tok/s%s", is_tty_ ? "\r" : "", label_.c_str(), bar.c_str(),
               done, total, elapsed, elapsed > 0 ? generated_tokens / elapsed : 0.0, is_tty_ ? "" : "\n");
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (drawn_ && is_tty_) std::fprintf(stderr, "\n");
}

}  // namespace origami::cli
