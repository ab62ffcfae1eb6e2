#pragma once
// Where a command reads its input (generate/bench --input, eval --data/--text): a file, a FIFO,
// /dev/stdin, a process substitution (<(...), /dev/fd/N), or "-" for standard input. Such
// inputs can be read once only, so they are checked without being opened and read where the
// command reads them; only a folder, a missing path or an unreadable one is refused up front.
#include <string>

#include "core/status.h"

namespace origami::cli {

// The path to open for `path`: "-" is standard input.
std::string input_source(const std::string& path);

// Before any work starts: `path` exists, is not a folder and may be read. `flag` names the
// option in the error.
Status check_input_path(const std::string& flag, const std::string& path);

// Before an output is opened (and truncated): refuses an output that is the input itself (the
// same file, also through a symlink, a ./ prefix or /dev/stdin redirected from it). An output
// that does not exist yet cannot be the input.
Status check_not_input(const std::string& input_flag, const std::string& input_path, const std::string& output_flag,
                       const std::string& output_path);

}  // namespace origami::cli
