#pragma once
// Reading whole files (config.json, tokenizer.json, safetensors headers' companions), with errors
// that name the path, so that every loader reports a missing or unreadable file the same way.
#include <cstddef>
#include <filesystem>
#include <string>

#include "core/status.h"

namespace origami {

// The file's bytes. Errors: not_found "<path>: cannot open file (<reason>)", invalid_file
// "<path>: read error" when reading fails part way, invalid_file "<path>: is a directory".
Expected<std::string> read_file(const std::filesystem::path& path);

// A small file named by someone who should not be able to stall or exhaust the process (a JSONL
// request's kv_head_budgets): opened without blocking (a FIFO would wait for a writer forever),
// then refused unless it is a regular file (FIFOs, devices such as /dev/zero, sockets, folders)
// of at most `max_bytes`. Errors name the path and what is wrong, never the contents.
Expected<std::string> read_small_regular_file(const std::filesystem::path& path, size_t max_bytes);

}  // namespace origami
