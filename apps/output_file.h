#pragma once
// Where a command writes its results: a file or stdout, every write checked and flushed, so that
// a full disk is an error (exit 1) and an interrupted run keeps what it wrote.
#include <cstdio>
#include <string>

#include "core/status.h"

namespace origami::cli {

// Before any work starts: `path` must be writable (an existing file that may be written, or a
// new name in an existing writable folder; not a folder). `flag` names the option in the error.
Status check_output_path(const std::string& flag, const std::string& path);

class OutputFile {
 public:
  OutputFile() = default;
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Opens (truncates) `path`; empty = stdout. `flag` names the option in errors.
  Status open(const std::string& flag, const std::string& path);
  bool is_open() const { return file_ != nullptr; }
  // Writes `text` and flushes it to the OS; the first failure is kept and later writes are no-ops.
  Status write(const std::string& text);
  // Flushes and closes (a file; stdout is only flushed). Reports any write error not yet seen.
  Status close();

 private:
  Status fail(const char* what);

  std::FILE* file_ = nullptr;
  bool owned_ = false;
  std::string flag_, path_;
  Status error_;
};

// Flushes stdout; false (after printing the error) when something written to it was lost.
bool flush_stdout();

}  // namespace origami::cli
